//! `GET /v1/pixel/{entity}/{action}/{uuid}`: a tracking pixel. An image
//! tag (in a page, or in an e-mail, where no script runs) counts one, and
//! gets a 1x1 transparent GIF once the count is durable: the pixel is an
//! increment, through the same spec, validation and pipeline.
//!
//! Its query parameters are an increment's: `category`, `actor` and
//! `unique` (once per actor), and `id`, the
//! idempotency id, which makes every fetch of one URL count once (a mail
//! client that prefetches the images of a message, then the open; a
//! reader who opens it twice). `key` and `tenant` belong to the access
//! layer, as everywhere. A bad parameter is a 4xx in the API's one JSON
//! shape, not a GIF: an image tag shows neither, while whoever opens the
//! URL to see why nothing counts reads the reason.

use std::sync::Arc;

use super::counters::Applying;
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::access::Writer;
use super::crawlers::{self, PixelCrawler, Sender};
use super::extract::{PathParams, QueryParams};
use super::model::KeyPath;
use super::openapi::{Gif, Overflow};
use super::AppState;
use crate::actors::Asks;
use crate::domain::{CounterKey, Increment, IncrementSpec, Interner};
use crate::error::ApiError;
use crate::pipeline::Applied;

/// A 1x1 transparent GIF89a, the smallest image every client shows (43 bytes).
#[rustfmt::skip]
pub const GIF: [u8; 43] = [
    // Header.
    b'G', b'I', b'F', b'8', b'9', b'a',
    // Logical screen: 1 x 1; a global colour table of 2 entries (flags
    // 0x80); background colour 0; no aspect ratio.
    0x01, 0x00, 0x01, 0x00, 0x80, 0x00, 0x00,
    // The global colour table: black, white.
    0x00, 0x00, 0x00, 0xff, 0xff, 0xff,
    // Graphic control extension: colour 0 is transparent.
    0x21, 0xf9, 0x04, 0x01, 0x00, 0x00, 0x00, 0x00,
    // Image descriptor: at 0,0, 1 x 1, no local colour table.
    0x2c, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x01, 0x00, 0x00,
    // Image data: LZW codes of 3 bits (minimum size 2), one sub-block of 2
    // bytes holding clear (4), pixel 0, end (5); then the block terminator.
    0x02, 0x02, 0x44, 0x01, 0x00,
    // Trailer.
    0x3b,
];

/// The query parameters of the pixel, mapped onto the same
/// [`IncrementSpec`] as an increment's body.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct PixelQuery {
    /// Stored on the counter, as an increment's `category`.
    #[param(inline, value_type = Option<crate::api::openapi::Name>)]
    pub(super) category: Option<String>,
    /// Idempotency id: every fetch of a URL with this `id` counts once, for
    /// `--idempotency-window` (a mail client's prefetch, then the open).
    #[param(inline, value_type = Option<crate::api::openapi::EventId>)]
    pub(super) id: Option<String>,
    /// Who opened it (a subscriber id, say), kept only as a keyed hash;
    /// limits per actor count it. With `unique`, counted once per actor.
    #[param(schema_with = crate::api::openapi::optional_actor)]
    pub(super) actor: Option<String>,
    /// `ever` or `day`: count once per `actor` (an open per subscriber, a
    /// view per visitor and day), as an increment's `unique`.
    #[param(schema_with = crate::api::openapi::optional_unique)]
    pub(super) unique: Option<String>,
}

impl PixelQuery {
    /// The increment the pixel stands for: one, now.
    pub fn spec<'a>(&'a self, path: &'a KeyPath) -> IncrementSpec<'a> {
        IncrementSpec {
            entity: &path.entity,
            action: &path.action,
            uuid: &path.uuid,
            count: None,
            negate: false,
            category: self.category.as_deref(),
            timestamp: None,
            id: self.id.as_deref(),
            actor: self.actor.as_deref(),
            unique: self.unique.as_deref(),
        }
    }
}

#[utoipa::path(get, path = "/v1/pixel/{entity}/{action}/{uuid}",
    summary = "A tracking pixel: counts one and answers a 1x1 transparent GIF once the count is durable",
    params(KeyPath, PixelQuery), security(("bearer" = ["write"]), ("key" = ["write"])),
    responses(
        (status = 200, description = "Counted (or its `id` counted before); `HEAD` answers the same and counts nothing",
            content((inline(Gif) = "image/gif")),
            headers(("Cache-Control" = String, description = "`no-store`: every view is fetched"))),
        (status = 202, description = crawlers::IGNORED_DESCRIPTION,
            content((inline(Gif) = "image/gif")),
            headers(("X-Counter-Ignored" = String, description = "`crawler`: why nothing was counted"),
                ("Cache-Control" = String, description = "`no-store`"))),
        Overflow))]
pub async fn get(
    Writer(app): Writer,
    PixelCrawler(sender): PixelCrawler,
    method: Method,
    PathParams(path): PathParams<KeyPath>,
    QueryParams(query): QueryParams<PixelQuery>,
) -> Result<Response, ApiError> {
    let spec = query.spec(&path);
    let inc = view(&app, &spec)?;
    // A HEAD asks what a GET would answer; it fetches no image, so it is
    // no view (link checkers and mail scanners send them).
    if method == Method::HEAD {
        return Ok(gif(StatusCode::OK, None));
    }
    match count_view(app, sender, inc, spec.actor, None).await? {
        Viewed::Crawler => Ok(gif(StatusCode::ACCEPTED, Some(crawlers::CRAWLER))),
        Viewed::Counted { .. } => Ok(gif(StatusCode::OK, None)),
    }
}

/// One view, as an image tag asks for it: the increment of one that `spec`
/// stands for, validated (a 400 naming the parameter, nothing counted).
/// The pixel's and the badge's (`count=true`).
pub(super) fn view(app: &AppState, spec: &IncrementSpec) -> Result<Increment, ApiError> {
    Increment::from_event(
        spec,
        &app.time_policy,
        app.clock.now(),
        &mut Interner::default(),
        &app.actors.key,
    )
    .map_err(ApiError::BadRequest)
}

/// What became of a view [`count_view`] was given.
pub(super) enum Viewed {
    /// Applied (counted, or a repeat of its actor or its `id`), through the
    /// tenant's opened app; `applied.counter` holds the counter after it
    /// when one was asked for.
    Counted {
        app: Arc<AppState>,
        applied: Applied,
    },
    /// A known crawler's: nothing counted (and the ignored view recorded).
    Crawler,
}

/// Counts one view as the pixel counts it: the queue's admission (503
/// when full), known crawlers left out (`sender`), the limits per actor of
/// `actor` (429 `throttled`), then the write, answered once durable; with
/// `want`, the counter after it.
pub(super) async fn count_view(
    app: Arc<AppState>,
    sender: Sender,
    inc: Increment,
    actor: Option<&str>,
    want: Option<CounterKey>,
) -> Result<Viewed, ApiError> {
    app.pipeline.admit()?;
    let mut asks = Asks::default();
    app.actors.ask(&mut asks, 0, &inc.key, actor, inc.delta);
    let app = match super::counters::applying(app, sender, &asks).await? {
        Applying::Crawler(app) => {
            crawlers::record(&app.metrics, 1);
            return Ok(Viewed::Crawler);
        }
        Applying::Write(app) => app,
    };
    let applied = app.pipeline.submit(vec![inc], want).await?;
    app.metrics.record_repeats(applied.repeats);
    Ok(Viewed::Counted { app, applied })
}

/// The image, never kept by a cache (each view must reach the gateway),
/// loadable from any origin (pages that require `Cross-Origin-Resource-Policy`).
fn gif(status: StatusCode, ignored: Option<&'static str>) -> Response {
    let mut res = (
        status,
        [
            (header::CONTENT_TYPE, HeaderValue::from_static("image/gif")),
            // Said here, not left to the server: a HEAD has no body to measure.
            (header::CONTENT_LENGTH, HeaderValue::from(GIF.len())),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
            (
                header::HeaderName::from_static("cross-origin-resource-policy"),
                HeaderValue::from_static("cross-origin"),
            ),
        ],
        &GIF[..],
    )
        .into_response();
    if let Some(why) = ignored {
        res.headers_mut()
            .insert(super::edge::IGNORED_HEADER, HeaderValue::from_static(why));
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The image's structure, read back field by field.
    #[test]
    fn the_gif_is_one_transparent_pixel() {
        assert_eq!(&GIF[..6], b"GIF89a");
        let le = |i: usize| u16::from_le_bytes([GIF[i], GIF[i + 1]]);
        assert_eq!((le(6), le(8)), (1, 1), "logical screen");
        assert_eq!(GIF[10] & 0x80, 0x80, "a global colour table");
        let table = 2usize << (GIF[10] & 0x07);
        let gce = 13 + 3 * table;
        assert_eq!(&GIF[gce..gce + 3], &[0x21, 0xf9, 0x04]);
        assert_eq!(GIF[gce + 3] & 0x01, 1, "transparency on");
        assert_eq!(GIF[gce + 6], 0, "colour 0 is the transparent one");
        let image = gce + 8;
        assert_eq!(GIF[image], 0x2c);
        assert_eq!((le(image + 5), le(image + 7)), (1, 1), "image size");
        assert_eq!(GIF[GIF.len() - 1], 0x3b, "trailer");
    }

    #[test]
    fn the_query_maps_onto_an_increment_of_one() {
        let path = KeyPath {
            entity: "MAIL".into(),
            action: "open".into(),
            uuid: "m1".into(),
        };
        let q = PixelQuery {
            category: Some("newsletter".into()),
            id: Some("m1-r7".into()),
            ..Default::default()
        };
        let now = chrono::Utc::now();
        let inc = Increment::from_spec(&q.spec(&path), &Default::default(), now).unwrap();
        assert_eq!(inc.delta, 1);
        assert_eq!(inc.category.as_deref(), Some("newsletter"));
        assert_eq!(inc.id.as_deref(), Some("m1-r7"));
        assert_eq!(inc.ts_ms, now.timestamp_millis());
    }
}
