//! `GET /dashboard`: a page for people, built into the binary. The handler
//! only serves the embedded files (HTML, script, style sheet) with their
//! content type, a validator and a strict Content-Security-Policy; the page
//! itself reads the public `/v1` API with a `read` key, so it needs no
//! privileges of its own and loads nothing from another host.

use std::sync::OnceLock;

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use super::openapi::NotModified;

/// The page may run only its own script and style, talk only to its own
/// origin, and be framed by no one.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; \
form-action 'none'; frame-ancestors 'none'";

/// One embedded file.
pub struct Asset {
    pub path: &'static str,
    pub content_type: &'static str,
    pub body: &'static str,
}

/// Every file of the dashboard, by the path it is served at.
pub const ASSETS: [Asset; 3] = [
    Asset {
        path: "/dashboard",
        content_type: "text/html; charset=utf-8",
        body: include_str!("dashboard/index.html"),
    },
    Asset {
        path: "/dashboard/dashboard.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("dashboard/dashboard.js"),
    },
    Asset {
        path: "/dashboard/dashboard.css",
        content_type: "text/css; charset=utf-8",
        body: include_str!("dashboard/dashboard.css"),
    },
];

/// A strong validator per asset: the first 16 hex digits of its SHA-256,
/// computed once, so a new build's files are fetched again at once.
fn etag(i: usize) -> &'static str {
    static TAGS: OnceLock<Vec<String>> = OnceLock::new();
    &TAGS.get_or_init(|| {
        ASSETS
            .iter()
            .map(|a| {
                let d = ring::digest::digest(&ring::digest::SHA256, a.body.as_bytes());
                let hex: String = d.as_ref()[..8].iter().map(|b| format!("{b:02x}")).collect();
                format!("\"{hex}\"")
            })
            .collect()
    })[i]
}

fn serve(i: usize, headers: &HeaderMap) -> Response {
    let asset = &ASSETS[i];
    let tag = etag(i);
    let fresh = headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim() == tag || t.trim() == "*");
    let common = [
        // Revalidate every time: the files change with the binary, and a
        // 304 costs next to nothing.
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        (header::ETAG, HeaderValue::from_static(tag)),
        (
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CONTENT_SECURITY_POLICY),
        ),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ),
        (
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        ),
    ];
    if fresh {
        return (StatusCode::NOT_MODIFIED, common).into_response();
    }
    (
        common,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static(asset.content_type),
        )],
        asset.body,
    )
        .into_response()
}

#[utoipa::path(get, path = "/dashboard",
    summary = "The built-in dashboard page (it reads /v1 with a read key entered on the page)",
    responses((status = 200, description = "Success", content((String = "text/html"))), NotModified))]
pub async fn page(headers: HeaderMap) -> Response {
    serve(0, &headers)
}

#[utoipa::path(get, path = "/dashboard/dashboard.js", summary = "The dashboard's script",
    responses((status = 200, description = "Success", content((String = "text/javascript"))), NotModified))]
pub async fn script(headers: HeaderMap) -> Response {
    serve(1, &headers)
}

#[utoipa::path(get, path = "/dashboard/dashboard.css", summary = "The dashboard's style sheet",
    responses((status = 200, description = "Success", content((String = "text/css"))), NotModified))]
pub async fn style(headers: HeaderMap) -> Response {
    serve(2, &headers)
}
