//! The single increment's fast path: `POST /v1/counters/{entity}/{action}/{uuid}/increment`
//! answered in front of the router, for the requests whose answer the
//! router would decide by exactly the steps taken here.
//!
//! Profiled under `scripts/bench.sh`'s single increments, the router and
//! its layers cost more of a request than its write (scripts/bench/README.md,
//! "The increment's fast path"): the route's match and its parameters'
//! vector and extension, a boxed future and a cloned service per layer
//! (`observe`, `check_host`, `check_site`) and per route, the connection's
//! address inserted into every request, and futures of several hundred
//! bytes moved at each step. Here the path is split by hand and the
//! request goes straight to the handler's own steps: the same access
//! check ([`CounterWriter::from_parts`]), crawler check
//! ([`crawlers::sender`]) and write ([`counters::add`]), timed and counted
//! under the route's own metrics label as `observe` does.
//!
//! Every request the fast path is not sure of goes to the router, before
//! anything is taken or counted: another method or route, a query string
//! (which may carry `key` or `tenant`), a body, a percent-encoded or empty
//! path segment, CORS configured, and whatever the `Host` or cross-site
//! checks or the body's content type would refuse. So every error the
//! router answers before the handler runs is its own, and the handler's are
//! the same code's; `tests/fast_path.rs` sends a table of good and bad
//! requests to both and compares the answers and the metrics.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::{ConnectInfo, Request};
use axum::http::{request::Parts, Method};
use axum::response::{IntoResponse, Response};
use axum::Router;
use futures_util::future::Either;
use tower::Service;

use super::access::CounterWriter;
use super::model::{Direction, KeyPath};
use super::{counters, crawlers, edge, extract, Gateway};
use crate::error::ApiError;
use crate::metrics::{route_index, UNMATCHED};

/// The route the fast path answers, as `table()` has it (the handler's
/// `#[utoipa::path]`); a unit test checks that it is there.
pub(crate) const INCREMENT_ROUTE: &str = "/v1/counters/{entity}/{action}/{uuid}/increment";

/// The HTTP service `serve` runs: the router, with the single increment's
/// fast path in front of it.
#[derive(Clone)]
pub struct App {
    gw: Arc<Gateway>,
    router: Router,
    /// The increment route's metrics label; [`UNMATCHED`] (no fast path)
    /// if the table has no such route.
    route: usize,
    /// The connection's peer, for the rate limit by address.
    peer: Option<SocketAddr>,
}

impl App {
    pub(super) fn new(gw: Arc<Gateway>, router: Router) -> App {
        App {
            gw,
            router,
            route: route_index(INCREMENT_ROUTE),
            peer: None,
        }
    }

    /// The service to give `axum::serve`: each connection's requests know
    /// their peer, as the router's `into_make_service_with_connect_info`
    /// tells it.
    pub fn into_make_service(self) -> MakeApp {
        MakeApp(self)
    }

    /// The fast path's answer to `req`, which [`App::eligible`] found to be
    /// the increment of `path`.
    fn fast(&self, req: Request, path: KeyPath) -> impl Future<Output = Response> + Send + 'static {
        let (mut parts, _) = req.into_parts();
        if self.gw.rate_limit.is_some() {
            if let Some(peer) = self.peer {
                parts.extensions.insert(ConnectInfo(peer));
            }
        }
        let gw = self.gw.clone();
        let route = self.route;
        async move {
            let start = Instant::now();
            let res = match gw.request_timeout {
                Some(limit) => match tokio::time::timeout(limit, increment(&gw, parts, path)).await
                {
                    Ok(res) => res,
                    Err(_) => ApiError::Timeout(limit).into_response(),
                },
                None => increment(&gw, parts, path).await,
            };
            gw.metrics
                .record_request(route, &Method::POST, res.status().as_u16(), start.elapsed());
            res
        }
    }

    /// The path's parts when the fast path answers `req` as the router
    /// would (see the module's documentation); `None`: the router's.
    fn eligible(&self, req: &Request) -> Option<KeyPath> {
        if self.route == UNMATCHED
            || req.method() != Method::POST
            || !self.gw.cors_origins.is_empty()
            || req.uri().query().is_some()
            || axum::body::HttpBody::size_hint(req.body()).exact() != Some(0)
        {
            return None;
        }
        let (entity, action, uuid) = split_path(req.uri().path())?;
        let headers = req.headers();
        if extract::check_content_type(headers).is_err()
            || edge::host_refusal(&self.gw, req.uri(), headers).is_some()
            || edge::site_refusal(&self.gw, req.method(), req.uri(), headers).is_some()
        {
            return None;
        }
        Some(KeyPath {
            entity: entity.to_owned(),
            action: action.to_owned(),
            uuid: uuid.to_owned(),
        })
    }
}

/// `{entity}`, `{action}` and `{uuid}` of an increment's path, when each
/// is its own text: not empty and without `%` (a percent-encoded one is
/// decoded by the router's path extractor, with its errors).
fn split_path(path: &str) -> Option<(&str, &str, &str)> {
    let rest = path
        .strip_prefix("/v1/counters/")?
        .strip_suffix("/increment")?;
    let mut parts = rest.split('/');
    let (entity, action, uuid) = (parts.next()?, parts.next()?, parts.next()?);
    let plain = |s: &str| !s.is_empty() && !s.contains('%');
    (parts.next().is_none() && plain(entity) && plain(action) && plain(uuid))
        .then_some((entity, action, uuid))
}

/// The handler's steps, in its extractors' order: the access check and
/// the tenant, the crawler check, then the write and its answer.
async fn increment(gw: &Gateway, parts: Parts, path: KeyPath) -> Response {
    let writer = match CounterWriter::from_parts(&parts, gw).await {
        Ok(writer) => writer,
        Err(e) => return e.into_response(),
    };
    let sender = crawlers::sender(&parts, gw);
    drop(parts);
    counters::add(writer, path, Bytes::new(), Direction::Add, sender)
        .await
        .into_response()
}

type Fast = Pin<Box<dyn Future<Output = Response> + Send>>;

impl Service<Request> for App {
    type Response = Response;
    type Error = Infallible;
    type Future = Either<
        futures_util::future::Map<Fast, fn(Response) -> Result<Response, Infallible>>,
        <Router as Service<Request>>::Future,
    >;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request) -> Self::Future {
        use futures_util::FutureExt;
        match self.eligible(&req) {
            Some(path) => {
                let answer: Fast = Box::pin(self.fast(req, path));
                Either::Left(answer.map(Ok as fn(Response) -> Result<Response, Infallible>))
            }
            None => {
                let mut req = req;
                if let Some(peer) = self.peer {
                    req.extensions_mut().insert(ConnectInfo(peer));
                }
                Either::Right(self.router.call(req))
            }
        }
    }
}

/// Makes an [`App`] for each connection, knowing its peer.
#[derive(Clone)]
pub struct MakeApp(App);

impl<L> Service<axum::serve::IncomingStream<'_, L>> for MakeApp
where
    L: axum::serve::Listener<Addr = SocketAddr>,
{
    type Response = App;
    type Error = Infallible;
    type Future = std::future::Ready<Result<App, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, stream: axum::serve::IncomingStream<'_, L>) -> Self::Future {
        let mut app = self.0.clone();
        app.peer = Some(*stream.remote_addr());
        std::future::ready(Ok(app))
    }
}

#[cfg(test)]
mod tests {
    use super::{split_path, INCREMENT_ROUTE};

    #[test]
    fn the_route_is_in_the_table() {
        assert!(super::super::openapi::route_patterns()
            .iter()
            .any(|r| r == INCREMENT_ROUTE));
    }

    #[test]
    fn only_plain_segments_take_the_fast_path() {
        assert_eq!(
            split_path("/v1/counters/VIDEO/VIEW/item-1/increment"),
            Some(("VIDEO", "VIEW", "item-1"))
        );
        for other in [
            "/v1/counters/VIDEO/VIEW/item-1/decrement",
            "/v1/counters/VIDEO/VIEW/increment",
            "/v1/counters/VIDEO/VIEW/a/b/increment",
            "/v1/counters/VIDEO//item-1/increment",
            "/v1/counters/VIDEO/VIEW/item%201/increment",
            "/v1/counters/VIDEO/VIEW/item-1/increment/",
            "/v2/counters/VIDEO/VIEW/item-1/increment",
            "/v1/counters//VIEW/item-1/increment",
        ] {
            assert_eq!(split_path(other), None, "{other}");
        }
    }
}
