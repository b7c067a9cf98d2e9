//! What wraps every request before a handler sees it: CORS for browser
//! pages on the allowed origins, the `Host` check and the refusal of
//! cross-site writes of a keyless gateway, the request timeout, and the request metrics (by matched route, never the raw
//! path, so cardinality is bounded).

use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderName, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tower_http::cors::{AllowOrigin, CorsLayer};

use super::Gateway;
use crate::error::ApiError;

/// The header of an answer that counted nothing because of who asked
/// (a crawler, a throttled actor): exposed to browsers by the CORS layer.
pub const IGNORED_HEADER: &str = "x-counter-ignored";

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
                HeaderName::from_static(IGNORED_HEADER),
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

/// Without API keys, loopback is a keyless gateway's only protection, and a
/// page that rebinds its own name to 127.0.0.1 (DNS rebinding) gets past it:
/// the browser sends that page's name as `Host`. So a keyless gateway
/// answers only loopback names and addresses and `--allowed-hosts`; with
/// keys the key is the protection and any `Host` is answered. A request
/// without any `Host` (no browser sends one) passes.
pub async fn check_host(State(gw): State<Arc<Gateway>>, req: Request, next: Next) -> Response {
    match host_refusal(&gw, req.uri(), req.headers()) {
        Some(refused) => refused.into_response(),
        None => next.run(req).await,
    }
}

/// What [`check_host`] answers instead of the route, if anything: also
/// asked by the increment's fast path (`super::fast`), which leaves a
/// refused request to the router.
pub(super) fn host_refusal(
    gw: &Gateway,
    uri: &axum::http::Uri,
    headers: &axum::http::HeaderMap,
) -> Option<ApiError> {
    // Probes address pods by IP, not by name, and these answers reveal
    // nothing a rebinding page could use: they stay open to any Host.
    let path = uri.path();
    if !gw.keys.is_empty() || path == "/healthz" || path == "/readyz" {
        return None;
    }
    let host = match headers.get(header::HOST) {
        Some(value) => match value.to_str() {
            Ok(host) => host,
            Err(_) => {
                return Some(ApiError::HostNotAllowed(
                    String::from_utf8_lossy(value.as_bytes()).into(),
                ))
            }
        },
        // HTTP/2 carries the host in the URI's authority instead.
        None => uri.authority()?.as_str(),
    };
    (!host_allowed(host, &gw.allowed_hosts)).then(|| ApiError::HostNotAllowed(host.to_owned()))
}

/// Loopback keeps other machines out, not the pages a developer opens: any
/// site can count on a keyless gateway at `localhost` with a form post, a
/// `text/plain` beacon or an image, all of which a browser sends without
/// CORS. So a keyless gateway refuses a write (see [`writes`]) from a page
/// of another site, as the browser tells it: the `Origin` header (else the
/// `Referer`) names a page that is neither loopback nor allowed (see
/// [`foreign_page`]), or, when the browser sends neither,
/// `Sec-Fetch-Site: cross-site`. A
/// loopback page on another port (localhost:3000 to localhost:8080) and
/// any client that is not a browser (no such headers) still write. With
/// keys the key decides.
pub async fn check_site(State(gw): State<Arc<Gateway>>, req: Request, next: Next) -> Response {
    match site_refusal(&gw, req.method(), req.uri(), req.headers()) {
        Some(refused) => refused.into_response(),
        None => next.run(req).await,
    }
}

/// What [`check_site`] answers instead of the route, if anything (asked
/// by the fast path too, as [`host_refusal`]).
pub(super) fn site_refusal(
    gw: &Gateway,
    method: &Method,
    uri: &axum::http::Uri,
    headers: &axum::http::HeaderMap,
) -> Option<ApiError> {
    if !gw.keys.is_empty() || !request_writes(method, uri) {
        return None;
    }
    foreign_page(headers, &gw.allowed_hosts, &gw.cors_origins).map(ApiError::CrossSite)
}

/// Whether a route may change data: every method but `GET`, `HEAD` and
/// `OPTIONS`, save the multi-read's `POST`; and the `GET` of the pixel and
/// of the badges (with `count=true`). Also what `/openapi.json` of a
/// keyless gateway says may answer 403.
pub(crate) fn writes(method: &Method, path: &str) -> bool {
    match *method {
        Method::GET => path.starts_with("/v1/pixel/") || is_badge(path) || is_countapi_write(path),
        Method::HEAD | Method::OPTIONS => false,
        Method::POST => path != "/v1/counters/get",
        _ => true,
    }
}

/// Whether a `GET` of `path` is one of CountAPI's calls that write:
/// `hit`, `update`, `set` and `create` (`src/api/countapi.rs`).
fn is_countapi_write(path: &str) -> bool {
    ["hit", "update", "set", "create"].iter().any(|verb| {
        path.strip_prefix("/countapi/")
            .and_then(|p| p.strip_prefix(verb))
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    })
}

/// A badge's path: it counts only when asked to (`count=true`).
fn is_badge(path: &str) -> bool {
    path.starts_with("/v1/badge/") || path.starts_with("/v1/shields/")
}

/// Whether this request changes data: [`writes`], and for a badge, only
/// with `count=true` (decoded, as the handler reads it).
fn request_writes(method: &Method, uri: &axum::http::Uri) -> bool {
    if !writes(method, uri.path()) {
        return false;
    }
    if *method != Method::GET || !is_badge(uri.path()) {
        return true;
    }
    let query = uri.query().unwrap_or_default();
    form_urlencoded::parse(query.as_bytes()).any(|(k, v)| k == "count" && v == "true")
}

/// The header, quoted, by which the browser says the request comes from a
/// page of a site that is not allowed; `None` when it says nothing of the
/// kind. A page is allowed when its host is loopback or one of `hosts`
/// (`--allowed-hosts`), or its origin is one of `origins` (`--cors-origins`,
/// whose pages the operator named; its `*` opens reads, not writes).
/// `Origin` is the precise word and is sent with every cross-origin `POST`;
/// `Referer` is what an image sends, unless the page's policy suppresses
/// it, and then `Sec-Fetch-Site` still says "cross-site".
fn foreign_page(
    headers: &axum::http::HeaderMap,
    hosts: &[String],
    origins: &[String],
) -> Option<String> {
    for (name, label) in [(header::ORIGIN, "Origin"), (header::REFERER, "Referer")] {
        if let Some(value) = headers.get(name) {
            let page = value.to_str().ok().and_then(url_origin);
            let allowed = page.is_some_and(|(origin, host)| {
                host_allowed(host, hosts)
                    || origins
                        .iter()
                        .any(|o| o != "*" && o.trim_end_matches('/').eq_ignore_ascii_case(origin))
            });
            // Not allowed: `null` (a sandboxed frame, a file: page), another
            // scheme, or a host of another site.
            return (!allowed)
                .then(|| format!("{label} {:?}", String::from_utf8_lossy(value.as_bytes())));
        }
    }
    let site = headers.get("sec-fetch-site")?;
    site.as_bytes()
        .eq_ignore_ascii_case(b"cross-site")
        .then(|| "Sec-Fetch-Site \"cross-site\"".to_owned())
}

/// The origin (`scheme://host[:port]`) and host of an `http` or `https`
/// URL or origin.
fn url_origin(url: &str) -> Option<(&str, &str)> {
    let (scheme, rest) = url.split_once("://")?;
    if !(scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https")) {
        return None;
    }
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let host = &rest[..end];
    // A browser never sends credentials in these headers; a URL that has
    // some is not one to trust.
    if host.contains('@') {
        return None;
    }
    Some((&url[..scheme.len() + 3 + end], host))
}

/// Whether `host` (a `Host` value: a name or address, maybe with a port)
/// is loopback or one of `allowed` (`*`: any; an entry without a port
/// allows the name with any port, one with a port only that port).
pub fn host_allowed(host: &str, allowed: &[String]) -> bool {
    if allowed.iter().any(|a| a == "*") {
        return true;
    }
    let Some(name) = host_name(host) else {
        return false;
    };
    let name = name.to_ascii_lowercase();
    let name = name.strip_suffix('.').unwrap_or(&name);
    if name == "localhost" || name.ends_with(".localhost") {
        return true;
    }
    if let Ok(ip) = name.parse::<Ipv4Addr>() {
        if ip.is_loopback() {
            return true;
        }
    }
    if let Some(v6) = name.strip_prefix('[').and_then(|n| n.strip_suffix(']')) {
        if v6.parse::<Ipv6Addr>().is_ok_and(|ip| ip.is_loopback()) {
            return true;
        }
    }
    allowed.iter().any(|a| {
        let a = a.to_ascii_lowercase();
        a == name || a.eq_ignore_ascii_case(host)
    })
}

/// The name or address of `host` without its port (IPv6 keeps its
/// brackets); `None` when the port is not a number or the brackets do not close.
fn host_name(host: &str) -> Option<&str> {
    let (name, port) = if host.starts_with('[') {
        let end = host.find(']')?;
        let rest = &host[end + 1..];
        let port = match rest.strip_prefix(':') {
            Some(p) => Some(p),
            None if rest.is_empty() => None,
            None => return None,
        };
        (&host[..=end], port)
    } else {
        match host.split_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (host, None),
        }
    };
    if port.is_some_and(|p| p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit())) {
        return None;
    }
    (!name.is_empty()).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::{foreign_page, host_allowed, request_writes, writes};
    use axum::http::{HeaderMap, HeaderValue, Method};

    #[test]
    fn countapis_writing_verbs_are_writes() {
        for w in [
            "/countapi/hit/a.com/visits",
            "/countapi/hit/visits",
            "/countapi/update/abc",
            "/countapi/set/abc/def",
            "/countapi/create",
        ] {
            assert!(writes(&Method::GET, w), "{w}");
        }
        for r in [
            "/countapi/get/abc",
            "/countapi/info/abc/def",
            "/countapi/hits/abc",
            "/v1/countapi/hit/abc",
        ] {
            assert!(!writes(&Method::GET, r), "{r}");
        }
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            h.insert(*name, HeaderValue::from_static(value));
        }
        h
    }

    #[test]
    fn pages_of_other_sites_are_told_by_origin_referer_or_fetch_site() {
        let allowed = ["counts.example".to_owned()];
        let origins = ["https://shop.example/".to_owned(), "*".to_owned()];
        for ok in [
            &[][..],
            &[("origin", "http://localhost:3000")],
            &[("origin", "http://127.0.0.1:5173")],
            &[("origin", "https://counts.example")],
            &[("origin", "https://SHOP.example")],
            &[("referer", "https://shop.example/cart")],
            &[("referer", "http://[::1]:3000/page?x=1")],
            &[("sec-fetch-site", "same-site")],
            &[("sec-fetch-site", "none")],
            // The origin is loopback: a page on 127.0.0.1 writing to
            // localhost, which the browser calls cross-site.
            &[
                ("origin", "http://127.0.0.1:3000"),
                ("sec-fetch-site", "cross-site"),
            ],
        ] {
            assert_eq!(
                foreign_page(&headers(ok), &allowed, &origins),
                None,
                "{ok:?}"
            );
        }
        for (bad, named) in [
            (&[("origin", "https://evil.example")][..], "Origin"),
            (&[("origin", "null")], "Origin"),
            (&[("origin", "file://")], "Origin"),
            (&[("origin", "http://localhost.evil.example")], "Origin"),
            // Another scheme or port than the CORS origin's.
            (&[("origin", "http://shop.example")], "Origin"),
            (&[("origin", "https://shop.example:8443")], "Origin"),
            // The Origin decides, whatever the Referer says.
            (
                &[
                    ("origin", "https://evil.example"),
                    ("referer", "http://localhost/"),
                ],
                "Origin",
            ),
            (&[("referer", "https://evil.example/post")], "Referer"),
            (&[("referer", "http://localhost@evil.example/")], "Referer"),
            (&[("sec-fetch-site", "cross-site")], "Sec-Fetch-Site"),
            (&[("sec-fetch-site", "Cross-Site")], "Sec-Fetch-Site"),
        ] {
            let said = foreign_page(&headers(bad), &allowed, &origins);
            assert!(
                said.as_deref().is_some_and(|s| s.contains(named)),
                "{bad:?}: {said:?}"
            );
        }
        assert_eq!(
            foreign_page(
                &headers(&[("origin", "https://evil.example")]),
                &["*".to_owned()],
                &[]
            ),
            None
        );
    }

    #[test]
    fn writes_are_the_changing_methods_and_the_pixel() {
        assert!(writes(&Method::POST, "/v1/events"));
        assert!(writes(&Method::PUT, "/v1/days"));
        assert!(writes(&Method::DELETE, "/v1/counters/a/b/c"));
        assert!(writes(&Method::GET, "/v1/pixel/a/b/c"));
        assert!(!writes(&Method::HEAD, "/v1/pixel/a/b/c"));
        assert!(!writes(&Method::GET, "/v1/counters/a/b/c"));
        assert!(!writes(&Method::POST, "/v1/counters/get"));
        assert!(!writes(&Method::OPTIONS, "/v1/events"));
        let req = |q: &str| -> axum::http::Uri { q.parse().unwrap() };
        assert!(request_writes(&Method::GET, &req("/v1/pixel/a/b/c")));
        assert!(request_writes(
            &Method::GET,
            &req("/v1/badge/a/b/c.svg?count=true")
        ));
        assert!(request_writes(
            &Method::GET,
            &req("/v1/shields/a/b/c?label=x&count=%74rue")
        ));
        assert!(!request_writes(&Method::GET, &req("/v1/badge/a/b/c.svg")));
        assert!(!request_writes(
            &Method::GET,
            &req("/v1/badge/a/b/c.svg?count=false")
        ));
        assert!(!request_writes(
            &Method::HEAD,
            &req("/v1/badge/a/b/c.svg?count=true")
        ));
        assert!(request_writes(
            &Method::POST,
            &req("/v1/events?count=false")
        ));
    }

    #[test]
    fn loopback_names_and_addresses_pass_others_do_not() {
        for ok in [
            "localhost",
            "LOCALHOST:8080",
            "localhost.",
            "app.localhost:3000",
            "127.0.0.1",
            "127.1.2.3:9",
            "[::1]",
            "[::1]:9",
        ] {
            assert!(host_allowed(ok, &[]), "{ok}");
        }
        for bad in [
            "evil.example",
            "attacker.com:8080",
            "localhost.evil.example",
            "evillocalhost",
            "128.0.0.1",
            "0.0.0.0",
            "[::2]:9",
            "[::1",
            "localhost:80:80",
            "localhost:x",
            "",
        ] {
            assert!(!host_allowed(bad, &[]), "{bad}");
        }
    }

    #[test]
    fn allowed_hosts_match_by_name_or_exact_port() {
        let allowed = ["counts.example".to_owned(), "Other.example:8443".to_owned()];
        assert!(host_allowed("COUNTS.example:9", &allowed));
        assert!(host_allowed("other.example:8443", &allowed));
        assert!(!host_allowed("other.example:9", &allowed));
        assert!(!host_allowed("evil.example", &allowed));
        assert!(host_allowed("evil.example", &["*".to_owned()]));
    }
}
