//! Request extractors whose every rejection is an [`ApiError`], so malformed
//! input gets the same JSON error shape as everything else.

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::{header, request::Parts};
use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::error::ApiError;

/// Path parameters; a bad one is a 400 in our shape.
pub struct PathParams<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for PathParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|p| PathParams(p.0))
            .map_err(|e: PathRejection| {
                ApiError::BadRequest(format!("bad path: {}", e.body_text()))
            })
    }
}

/// Query-string parameters; an unknown or repeated one is a 400 in our shape
/// naming it. Give `T` `#[serde(deny_unknown_fields)]` and string fields, and
/// parse values in the handler, so each error can name its parameter.
/// `key` and `tenant` belong to the access layer and are left out.
pub struct QueryParams<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for QueryParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        let query = parts.uri.query().unwrap_or_default();
        let own = |pair: &&str| {
            let name = pair.split('=').next().unwrap_or_default();
            !super::access::ACCESS_PARAMS.contains(&name)
        };
        let result = if query.split('&').all(|p| own(&p)) {
            axum::extract::Query::<T>::try_from_uri(&parts.uri)
        } else {
            let kept: Vec<&str> = query.split('&').filter(own).collect();
            let uri: axum::http::Uri = format!("/?{}", kept.join("&"))
                .parse()
                .map_err(|_| ApiError::BadRequest("bad query string".into()))?;
            axum::extract::Query::<T>::try_from_uri(&uri)
        };
        result
            .map(|q| QueryParams(q.0))
            .map_err(|e: QueryRejection| {
                ApiError::BadRequest(format!("bad query string: {}", e.body_text()))
            })
    }
}

/// A request body that is JSON, sent as `application/json`, as `text/plain`
/// (what `navigator.sendBeacon` sends for a string) or without a content type.
/// Empty bodies are allowed; the handler decides whether it needs one.
pub struct JsonBytes(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for JsonBytes {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        check_content_type(req.headers())?;
        // No body (a bare increment): nothing to collect.
        if axum::body::HttpBody::size_hint(req.body()).exact() == Some(0) {
            return Ok(JsonBytes(Bytes::new()));
        }
        let bytes = Bytes::from_request(req, state).await.map_err(|e| match e {
            BytesRejection::FailedToBufferBody(inner)
                if inner.body_text().contains("length limit") =>
            {
                ApiError::PayloadTooLarge(
                    "the request body is larger than the configured limit".into(),
                )
            }
            other => ApiError::BadRequest(format!(
                "cannot read the request body: {}",
                other.body_text()
            )),
        })?;
        Ok(JsonBytes(bytes))
    }
}

/// The content types a JSON body may come as ([`JsonBytes`]); also
/// asked by the increment's fast path (`super::fast`).
pub(super) fn check_content_type(headers: &axum::http::HeaderMap) -> Result<(), ApiError> {
    let Some(ct) = headers.get(header::CONTENT_TYPE) else {
        return Ok(());
    };
    let ct = ct.to_str().unwrap_or_default();
    let mime = ct.split(';').next().unwrap_or_default().trim();
    if mime.eq_ignore_ascii_case("application/json") || mime.eq_ignore_ascii_case("text/plain") {
        return Ok(());
    }
    Err(ApiError::UnsupportedMediaType(format!(
        "content type {ct:?} is not accepted; send application/json (or text/plain from sendBeacon)"
    )))
}

/// Parses JSON into `T`, naming the path of the offending field on failure
/// (`events[3].count: invalid type: floating point ...`).
///
/// The path is tracked only for a body that failed, parsed a second time:
/// the tracker copies every object key it passes into a `String`, three
/// allocations per event of a batch that parses.
pub fn parse_json<'de, T: Deserialize<'de>>(bytes: &'de [u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    if let Ok(super::model::Object(value)) = super::model::Object::<T>::deserialize(&mut de) {
        if de.end().is_ok() {
            return Ok(value);
        }
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let super::model::Object(value) = serde_path_to_error::deserialize(&mut de)
        .map_err(|e| ApiError::BadRequest(describe(&e)))?;
    de.end().map_err(|e| {
        ApiError::BadRequest(format!(
            "malformed JSON: trailing data after the value ({e})"
        ))
    })?;
    Ok(value)
}

pub fn describe(e: &serde_path_to_error::Error<serde_json::Error>) -> String {
    let path = e.path().to_string();
    let inner = e.inner();
    let what = match inner.classify() {
        serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
            "malformed JSON: "
        }
        _ => "",
    };
    if path == "." || path.is_empty() {
        format!("{what}{inner}")
    } else {
        format!("{what}{path}: {inner}")
    }
}
