//! What wraps every request before a handler sees it: CORS for browser
//! pages on the allowed origins, the `Host` check of a keyless gateway, the
//! request timeout, and the request metrics (by matched route, never the raw
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

/// Without API keys, loopback is a keyless gateway's only protection, and a
/// page that rebinds its own name to 127.0.0.1 (DNS rebinding) gets past it:
/// the browser sends that page's name as `Host`. So a keyless gateway
/// answers only loopback names and addresses and `--allowed-hosts`; with
/// keys the key is the protection and any `Host` is answered. A request
/// without any `Host` (no browser sends one) passes.
pub async fn check_host(State(gw): State<Arc<Gateway>>, req: Request, next: Next) -> Response {
    // Probes address pods by IP, not by name, and these answers reveal
    // nothing a rebinding page could use: they stay open to any Host.
    let path = req.uri().path();
    if !gw.keys.is_empty() || path == "/healthz" || path == "/readyz" {
        return next.run(req).await;
    }
    let host = match req.headers().get(header::HOST) {
        Some(value) => match value.to_str() {
            Ok(host) => host.to_owned(),
            Err(_) => {
                return ApiError::HostNotAllowed(String::from_utf8_lossy(value.as_bytes()).into())
                    .into_response()
            }
        },
        // HTTP/2 carries the host in the URI's authority instead.
        None => match req.uri().authority() {
            Some(authority) => authority.as_str().to_owned(),
            None => return next.run(req).await,
        },
    };
    if host_allowed(&host, &gw.allowed_hosts) {
        next.run(req).await
    } else {
        ApiError::HostNotAllowed(host).into_response()
    }
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
    use super::host_allowed;

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
