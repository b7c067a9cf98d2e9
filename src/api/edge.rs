//! What wraps every request before a handler sees it: CORS for browser
//! pages on the allowed origins, the request timeout, and the request
//! metrics (by matched route, never the raw path, so cardinality is bounded).

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderName, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tower_http::cors::{AllowOrigin, CorsLayer};

use super::Gateway;
use crate::error::ApiError;

/// CORS for `origins` (exact origins such as `https://shop.example`, or `*`
/// for any); `None` when the list is empty: browsers then refuse cross-origin
/// reads (a `sendBeacon` of `text/plain` still arrives, it needs no CORS).
pub fn cors(origins: &[String]) -> Result<Option<CorsLayer>, String> {
    if origins.is_empty() {
        return Ok(None);
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        let list = origins
            .iter()
            .map(|o| {
                let o = o.trim_end_matches('/');
                if !(o.starts_with("http://") || o.starts_with("https://")) {
                    return Err(format!(
                        "--cors-origins: {o:?} is not an origin like https://shop.example"
                    ));
                }
                HeaderValue::from_str(o).map_err(|_| format!("--cors-origins: {o:?} is not valid"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        AllowOrigin::list(list)
    };
    Ok(Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST, Method::DELETE])
            .allow_headers([
                header::AUTHORIZATION,
                header::CONTENT_TYPE,
                HeaderName::from_static("x-tenant"),
            ])
            .expose_headers([
                header::RETRY_AFTER,
                header::ETAG,
                HeaderName::from_static(super::crawlers::IGNORED_HEADER),
            ])
            .max_age(Duration::from_secs(3600)),
    ))
}

/// Times every request against `--request-timeout` and records it by matched
/// route, method and status.
pub async fn observe(State(gw): State<Arc<Gateway>>, req: Request, next: Next) -> Response {
    let start = Instant::now();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| crate::metrics::route_index(m.as_str()))
        .unwrap_or(crate::metrics::UNMATCHED);
    let method = req.method().clone();
    let res = match gw.request_timeout {
        Some(limit) => match tokio::time::timeout(limit, next.run(req)).await {
            Ok(res) => res,
            Err(_) => ApiError::Timeout(limit).into_response(),
        },
        None => next.run(req).await,
    };
    gw.metrics
        .record_request(route, &method, res.status().as_u16(), start.elapsed());
    res
}
