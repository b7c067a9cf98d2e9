//! Badges: `GET /v1/badge/{entity}/{action}/{uuid}.svg` draws a counter as
//! an SVG badge (`crate::domain::badge` draws it), and
//! `GET /v1/shields/{entity}/{action}/{uuid}` answers the JSON shields.io's
//! endpoint badge reads (`{"schemaVersion": 1, "label", "message",
//! "color"}`), with the same parameters.
//!
//! A badge reads one counter by its key, as the multi-read does: with a
//! `public` key (it is in pages), a `read` or an `admin` one, or on a
//! keyless gateway; a counter never counted shows 0. With `count=true` it
//! counts one first, exactly as the pixel counts (`pixel::view` and
//! `pixel::count_view`: the same validation, crawlers, once per actor,
//! limits per actor), then shows the count; that needs a key that may both
//! count and read what it shows (see [`BadgeReader`]).
//!
//! Every answer is `Cache-Control: no-cache` with a strong `ETag` of its
//! bytes: an image proxy (GitHub's camo) or a CDN may keep a badge but asks
//! each time, and an unchanged badge costs a 304. A badge made with a
//! `read` or `admin` key is `private` too, so no shared cache keeps it at
//! all; the key in `?key=` is part of the URL a cache keys by, and the
//! header ways of naming a key or a tenant are in `Vary`.

use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use super::access::BadgeReader;
use super::crawlers::{self, PixelCrawler, Sender};
use super::extract::{PathParams, QueryParams};
use super::model::KeyPath;
use super::multiread::{etag, none_match, public_cors};
use super::openapi::{NotFound, NotModified, Overflow};
use super::pixel::{self, PixelQuery, Viewed};
use crate::domain::badge::{self, Badge, Color, Style};
use crate::error::ApiError;

/// The path of an SVG badge: the counter's key, its uuid followed by `.svg`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub struct BadgePath {
    #[param(inline, value_type = crate::api::openapi::Name)]
    entity: String,
    #[param(inline, value_type = crate::api::openapi::Name)]
    action: String,
    /// The counter's uuid followed by `.svg` (percent-encoded as a uuid is).
    #[param(pattern = r"\.svg$")]
    file: String,
}

impl BadgePath {
    /// The counter's key path; 404 when the file is not an `.svg`.
    fn key_path(self) -> Result<KeyPath, ApiError> {
        let uuid = self.file.strip_suffix(".svg").ok_or_else(|| {
            ApiError::NotFound(format!(
                "a badge is /v1/badge/{{entity}}/{{action}}/{{uuid}}.svg; {:?} does not end in .svg",
                self.file
            ))
        })?;
        Ok(KeyPath {
            entity: self.entity,
            action: self.action,
            uuid: uuid.to_string(),
        })
    }
}

/// How the badge looks, whether it counts first, and the view it counts.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct BadgeQuery {
    /// The text on the left, at most 64 characters; empty: the count alone.
    /// Default: the counter's action.
    #[param(max_length = 64)]
    label: Option<String>,
    /// The count's colour: `brightgreen`, `green`, `yellowgreen`, `yellow`,
    /// `orange`, `red`, `blue` (the default), `lightgrey`, `grey` (and
    /// shields.io's other names), or 3 or 6 hex digits, `#` optional
    /// (`%23` in a URL).
    color: Option<String>,
    /// `flat` (the default), `flat-square` or `for-the-badge`.
    #[param(schema_with = style_schema)]
    style: Option<String>,
    /// `false`: every digit (1234567) instead of 1.2M.
    abbreviate: Option<bool>,
    /// `true`: count one first, as the pixel does (needs a key that may
    /// count and read: see the guide), then show the count.
    count: Option<bool>,
    /// With `count=true`: the view's `category`, as the pixel's.
    #[param(inline, value_type = Option<crate::api::openapi::Name>)]
    category: Option<String>,
    /// With `count=true`: the view's idempotency `id`, as the pixel's.
    #[param(inline, value_type = Option<crate::api::openapi::EventId>)]
    id: Option<String>,
    /// With `count=true`: who views, kept only as a keyed hash; limits per
    /// actor count it.
    #[param(schema_with = crate::api::openapi::optional_actor)]
    actor: Option<String>,
    /// With `count=true`: `ever` or `day`, count once per `actor`.
    #[param(schema_with = crate::api::openapi::optional_unique)]
    unique: Option<String>,
}

fn style_schema() -> utoipa::openapi::schema::Object {
    utoipa::openapi::schema::ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::Type::String)
        .enum_values(Some(Style::NAMES))
        .build()
}

/// What a badge shows, its parameters checked.
struct Look {
    /// `None`: the counter's action.
    label: Option<String>,
    color: Color,
    /// As asked; `None` draws `flat` and leaves shields.io's own default.
    style: Option<Style>,
    abbreviate: bool,
}

impl BadgeQuery {
    /// The look asked for, and the view to count (`count=true`), each
    /// parameter checked before anything is read or written.
    fn split(self) -> Result<(Look, Option<PixelQuery>), ApiError> {
        if let Some(label) = &self.label {
            badge::validate_label(label).map_err(ApiError::BadRequest)?;
        }
        let color = match &self.color {
            Some(c) => Color::parse(c).map_err(ApiError::BadRequest)?,
            None => Color::default(),
        };
        let style = self
            .style
            .as_deref()
            .map(Style::parse)
            .transpose()
            .map_err(ApiError::BadRequest)?;
        let look = Look {
            label: self.label,
            color,
            style,
            abbreviate: self.abbreviate.unwrap_or(true),
        };
        let view = PixelQuery {
            category: self.category,
            id: self.id,
            actor: self.actor,
            unique: self.unique,
        };
        if self.count == Some(true) {
            return Ok((look, Some(view)));
        }
        let given = [
            ("category", view.category.is_some()),
            ("id", view.id.is_some()),
            ("actor", view.actor.is_some()),
            ("unique", view.unique.is_some()),
        ];
        if let Some((name, _)) = given.iter().find(|(_, set)| *set) {
            return Err(ApiError::BadRequest(format!(
                "{name} describes the view a badge counts, and this badge counts nothing; add count=true to count one"
            )));
        }
        Ok((look, None))
    }
}

/// What both routes answer before they render it.
struct Shown {
    label: String,
    message: String,
    look: Look,
    /// A known crawler's view was left out (`count=true`).
    ignored: bool,
}

/// Counts (with `count=true`) and reads the counter a badge shows.
async fn show(
    reader: &BadgeReader,
    sender: Sender,
    method: &Method,
    path: KeyPath,
    query: BadgeQuery,
) -> Result<Shown, ApiError> {
    let (look, view) = query.split()?;
    let key = path.key()?;
    let mut ignored = false;
    let mut app = reader.app.clone();
    let mut counter = None;
    let mut read = true;
    match view {
        // A HEAD fetches no image: it is no view, as with the pixel.
        Some(view) if *method != Method::HEAD => {
            let spec = view.spec(&path);
            let inc = pixel::view(&app, &spec)?;
            match pixel::count_view(app.clone(), sender, inc, spec.actor, Some(key.clone())).await?
            {
                Viewed::Crawler => ignored = true,
                Viewed::Counted {
                    app: opened,
                    applied,
                } => {
                    app = opened;
                    // Not read back by the flush (not counted, or a store that
                    // could not): read as it stands.
                    read = applied.counter.is_none();
                    counter = applied.counter;
                }
            }
        }
        Some(view) => {
            pixel::view(&app, &view.spec(&path))?;
        }
        None => {}
    }
    if read {
        counter = app.store.get(&key).await?;
    }
    let value = counter.map_or(0, |c| c.value);
    let label = match &look.label {
        Some(l) => l.clone(),
        None => badge::fit_label(&path.action).into_owned(),
    };
    Ok(Shown {
        label,
        message: badge::message(value, look.abbreviate),
        look,
        ignored,
    })
}

#[utoipa::path(get, path = "/v1/badge/{entity}/{action}/{file}",
    summary = "A counter as an SVG badge (`{file}` is `<uuid>.svg`); with count=true, counts one first as the pixel does",
    params(BadgePath, BadgeQuery), security(("bearer" = ["public"]), ("key" = ["public"])),
    responses(
        (status = 200, description = "The badge; a counter never counted shows 0",
            content((inline(crate::api::openapi::Svg) = "image/svg+xml")),
            headers(("ETag" = String, description = "Strong; from the badge's bytes"),
                ("Cache-Control" = String, description = "`no-cache` (`no-cache, private` for a read or admin key): kept, but asked for each time"))),
        (status = 202, description = crawlers::IGNORED_DESCRIPTION,
            content((inline(crate::api::openapi::Svg) = "image/svg+xml")),
            headers(("X-Counter-Ignored" = String, description = "`crawler`: why nothing was counted"))),
        NotModified, NotFound, Overflow))]
pub async fn svg(
    reader: BadgeReader,
    PixelCrawler(sender): PixelCrawler,
    method: Method,
    headers: HeaderMap,
    PathParams(path): PathParams<BadgePath>,
    QueryParams(query): QueryParams<BadgeQuery>,
) -> Result<Response, ApiError> {
    let path = path.key_path()?;
    let shown = show(&reader, sender, &method, path, query).await?;
    let body = Badge {
        label: &shown.label,
        message: &shown.message,
        color: &shown.look.color,
        style: shown.look.style.unwrap_or_default(),
    }
    .svg();
    Ok(answer(
        &reader,
        &headers,
        &shown,
        "image/svg+xml",
        body.into_bytes(),
    ))
}

/// What shields.io's endpoint badge reads.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Endpoint<'a> {
    /// Always 1.
    #[schema(minimum = 1, maximum = 1)]
    schema_version: u8,
    label: &'a str,
    message: &'a str,
    /// A shields.io colour name, or `#` and hex digits.
    color: &'a str,
    /// Only when `style` was asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, schema_with = style_schema)]
    style: Option<&'a str>,
}

#[utoipa::path(get, path = "/v1/shields/{entity}/{action}/{uuid}",
    summary = "A counter as the JSON of shields.io's endpoint badge; the badge's parameters, count=true included",
    params(KeyPath, BadgeQuery), security(("bearer" = ["public"]), ("key" = ["public"])),
    responses(
        (status = 200, description = "The badge's label, message and colour; a counter never counted shows 0",
            body = Endpoint,
            headers(("ETag" = String, description = "Strong; from the answer's bytes"),
                ("Cache-Control" = String, description = "`no-cache` (`no-cache, private` for a read or admin key)"))),
        (status = 202, description = crawlers::IGNORED_DESCRIPTION, body = Endpoint,
            headers(("X-Counter-Ignored" = String, description = "`crawler`: why nothing was counted"))),
        NotModified, Overflow))]
pub async fn shields(
    reader: BadgeReader,
    PixelCrawler(sender): PixelCrawler,
    method: Method,
    headers: HeaderMap,
    PathParams(path): PathParams<KeyPath>,
    QueryParams(query): QueryParams<BadgeQuery>,
) -> Result<Response, ApiError> {
    let shown = show(&reader, sender, &method, path, query).await?;
    let body = serde_json::to_vec(&Endpoint {
        schema_version: 1,
        label: &shown.label,
        message: &shown.message,
        color: shown.look.color.shields(),
        style: shown.look.style.map(Style::as_str),
    })
    .map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok(answer(&reader, &headers, &shown, "application/json", body))
}

/// The answer with its validators and cache headers, or a 304 when
/// `If-None-Match` names it.
fn answer(
    reader: &BadgeReader,
    headers: &HeaderMap,
    shown: &Shown,
    content_type: &'static str,
    body: Vec<u8>,
) -> Response {
    let tag = etag(&body);
    let status = if shown.ignored {
        StatusCode::ACCEPTED
    } else {
        StatusCode::OK
    };
    let mut res = if none_match(headers, &tag) {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        (
            status,
            [(header::CONTENT_TYPE, HeaderValue::from_static(content_type))],
            body,
        )
            .into_response()
    };
    let h = res.headers_mut();
    h.insert(
        header::ETAG,
        HeaderValue::from_str(&tag).expect("hex digits in quotes"),
    );
    // `no-cache`: any cache may keep it but must ask each time (a 304 by
    // the ETag), so a count shows at once and `count=true` reaches the
    // gateway on every view. A badge read with a private key is for the
    // one who asked: no shared cache may keep it.
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static(if reader.shareable {
            "no-cache"
        } else {
            "no-cache, private"
        }),
    );
    h.insert(
        header::VARY,
        HeaderValue::from_static("authorization, x-tenant"),
    );
    // An image any page may embed; an SVG opened on its own runs nothing.
    h.insert(
        header::HeaderName::from_static("cross-origin-resource-policy"),
        HeaderValue::from_static("cross-origin"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'none'; sandbox"),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    if reader.public {
        public_cors(h);
    }
    if shown.ignored {
        h.insert(
            super::edge::IGNORED_HEADER,
            HeaderValue::from_static(crawlers::CRAWLER),
        );
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The query as the extractor parses it.
    fn query(pairs: &str) -> BadgeQuery {
        let uri: axum::http::Uri = format!("/?{pairs}").parse().unwrap();
        axum::extract::Query::<BadgeQuery>::try_from_uri(&uri)
            .unwrap()
            .0
    }

    #[test]
    fn the_look_is_checked_and_view_parameters_need_count() {
        let (look, view) = query("").split().unwrap();
        assert!(view.is_none() && look.abbreviate && look.style.is_none());
        assert_eq!(look.color, Color::default());
        let (look, view) = query("label=hits&color=%234c1&style=for-the-badge&abbreviate=false")
            .split()
            .unwrap();
        assert_eq!(look.label.as_deref(), Some("hits"));
        assert_eq!(look.color.hex(), "#4c1");
        assert_eq!(look.style, Some(Style::ForTheBadge));
        assert!(!look.abbreviate && view.is_none());
        let (_, view) = query("count=true&actor=a&unique=day").split().unwrap();
        let view = view.unwrap();
        assert_eq!(
            (view.actor.as_deref(), view.unique.as_deref()),
            (Some("a"), Some("day"))
        );
        for (bad, says) in [
            ("color=purple", "color \"purple\""),
            ("style=plastic", "style \"plastic\""),
            ("label=a%0Ab", "U+000A"),
            ("actor=a", "actor describes the view"),
            ("count=false&id=x", "id describes the view"),
        ] {
            let e = query(bad).split().err().unwrap().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn a_badge_path_ends_in_svg() {
        let p = |file: &str| BadgePath {
            entity: "E".into(),
            action: "A".into(),
            file: file.into(),
        };
        assert_eq!(p("u1.svg").key_path().unwrap().uuid, "u1");
        assert_eq!(p("a.svg.svg").key_path().unwrap().uuid, "a.svg");
        assert!(matches!(p("u1").key_path(), Err(ApiError::NotFound(_))));
        assert!(matches!(p("u1.png").key_path(), Err(ApiError::NotFound(_))));
    }
}
