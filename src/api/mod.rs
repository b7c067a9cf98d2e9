//! The HTTP layer: routes, extractors and thin handlers. A handler parses the
//! request into domain values, calls the pipeline or the store, and maps the
//! answer; it holds no storage logic.
//!
#![doc = include_str!("README.md")]

pub mod access;
mod averages;
mod badges;
mod countapi;
mod counters;
pub mod crawlers;
pub mod dashboard;
mod days;
pub mod edge;
pub mod events;
mod extract;
pub mod fast;
mod milestones;
mod model;
mod multiread;
pub mod openapi;
mod ops;
mod pixel;
mod queries;
mod reports;
pub mod stream;
mod trending;
mod values;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::Router;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::tenant::Tenants;
pub use crate::tenant::{AppState, Limits};

/// The router's state: every tenant, the keys, and the edge limits.
#[derive(Clone)]
pub struct Gateway {
    pub tenants: Arc<Tenants>,
    /// Empty: no key needed (the gateway then listens on loopback only).
    pub keys: Arc<crate::auth::Keys>,
    pub rate_limit: Option<Arc<crate::ratelimit::RateLimiter>>,
    pub request_timeout: Option<Duration>,
    /// Allowed browser origins (empty: no CORS).
    pub cors_origins: Arc<[String]>,
    /// `--allowed-hosts`: `Host` names a keyless gateway answers besides
    /// loopback ones (`*`: any). Unused when keys are configured.
    pub allowed_hosts: Arc<[String]>,
    pub metrics: Arc<Metrics>,
    /// `max-age` of `GET /v1/counters` answers, `public` for a `public`
    /// key or a keyless gateway, else `private`; `None`:
    /// `no-cache` (caches revalidate every time, by ETag).
    pub counters_max_age: Option<Duration>,
    /// `--count-crawlers`: count browser ingestion from known crawlers too.
    pub count_crawlers: bool,
    /// `--write-keys-read-values`: answers to a `write` key's increments
    /// and decrements carry the counter (see [`access::Disclosure`]).
    pub write_keys_read_values: bool,
    /// The live streams (`GET /v1/stream`): their bound and their end at
    /// shutdown ([`stream::Streams::close`], before the server drains).
    pub streams: Arc<stream::Streams>,
}

impl Gateway {
    /// `tenants` without keys nor edge limits.
    pub fn open(tenants: Tenants) -> Gateway {
        Gateway {
            metrics: tenants.default_tenant().metrics.clone(),
            tenants: Arc::new(tenants),
            keys: Arc::default(),
            rate_limit: None,
            request_timeout: None,
            cors_origins: Arc::new([]),
            allowed_hosts: Arc::new([]),
            counters_max_age: None,
            count_crawlers: false,
            write_keys_read_values: false,
            streams: Arc::default(),
        }
    }
}

/// The whole HTTP API over `state` alone: one tenant, no keys, no edge limits.
pub fn router(state: AppState) -> Router {
    gateway_router(Gateway::open(Tenants::single(state)))
        .expect("a gateway without CORS origins always builds")
}

/// The table of routes: every route of the API, each with its handler. It
/// is the one source of the router ([`gateway_router`]), of `/openapi.json`
/// (each handler's `#[utoipa::path]`, see [`openapi`]) and of the metrics'
/// route labels (`crate::metrics::routes`, registered when a router is built).
///
/// Adding a route is one line here, `.routes(routes!(module::handler))`
/// (handlers of one path share a line), and a `#[utoipa::path(...)]` on the
/// handler. Only `routes!` may add routes: `tests/openapi.rs` refuses any
/// other way of routing here, which would leave the route undocumented and
/// counted as `unmatched`.
pub(crate) fn table() -> OpenApiRouter<Arc<Gateway>> {
    OpenApiRouter::new()
        .routes(routes!(counters::get, counters::delete, values::put))
        .routes(routes!(counters::increment))
        .routes(routes!(counters::decrement))
        .routes(routes!(queries::histogram))
        .routes(routes!(counters::target))
        .routes(routes!(events::post))
        .routes(routes!(queries::top))
        .routes(routes!(milestones::get))
        .routes(routes!(milestones::put_target, milestones::get_target))
        .routes(routes!(trending::get))
        .routes(routes!(queries::top_averages))
        .routes(routes!(averages::get, averages::post))
        .routes(routes!(reports::stale))
        .routes(routes!(reports::unused))
        .routes(routes!(ops::healthz))
        .routes(routes!(ops::readyz))
        .routes(routes!(ops::metrics))
        .routes(routes!(openapi::openapi))
        .routes(routes!(dashboard::page))
        .routes(routes!(dashboard::script))
        .routes(routes!(dashboard::style))
        .routes(routes!(multiread::get))
        .routes(routes!(multiread::post))
        .routes(routes!(stream::get))
        .routes(routes!(days::put_one))
        .routes(routes!(days::put_many))
        .routes(routes!(pixel::get))
        .routes(routes!(badges::svg))
        .routes(routes!(badges::shields))
        .routes(routes!(countapi::hit))
        .routes(routes!(countapi::hit_default))
        .routes(routes!(countapi::get))
        .routes(routes!(countapi::get_default))
        .routes(routes!(countapi::update))
        .routes(routes!(countapi::update_default))
        .routes(routes!(countapi::set))
        .routes(routes!(countapi::set_default))
        .routes(routes!(countapi::info))
        .routes(routes!(countapi::info_default))
        .routes(routes!(countapi::create))
}

/// The whole HTTP API over `gw`; `serve` and the tests drive exactly this
/// router. Fails only on a bad CORS origin.
pub fn gateway_router(gw: Gateway) -> Result<Router, String> {
    build(gw).map(|(router, _)| router)
}

/// What `serve` runs: [`gateway_router`] with the single increment's fast
/// path in front of it ([`fast`]).
pub fn gateway_app(gw: Gateway) -> Result<fast::App, String> {
    build(gw).map(|(router, gw)| fast::App::new(gw, router))
}

fn build(gw: Gateway) -> Result<(Router, Arc<Gateway>), String> {
    let limits = gw.tenants.default_tenant().limits;
    let cors = edge::cors(&gw.cors_origins)?;
    let (router, _) = table().split_for_parts();
    crate::metrics::register_routes(openapi::route_patterns);
    // Shared, not copied: axum clones the state for every request (the
    // middleware's and the handler's), and each of the fields' reference
    // counts was an atomic add and subtract on a line both cores touch.
    let gw = Arc::new(gw);
    let router = router
        .fallback(|| async { ApiError::NotFound("no such endpoint".into()) })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(DefaultBodyLimit::max(limits.max_body_bytes))
        // Inside `observe`, so refusals are counted like any answer; the
        // `Host` first (layers added later run earlier).
        .layer(axum::middleware::from_fn_with_state(
            gw.clone(),
            edge::check_site,
        ))
        .layer(axum::middleware::from_fn_with_state(
            gw.clone(),
            edge::check_host,
        ))
        .layer(axum::middleware::from_fn_with_state(
            gw.clone(),
            edge::observe,
        ))
        .with_state(gw.clone());
    let router = match cors {
        Some(layer) => router.layer(layer),
        None => router,
    };
    Ok((router, gw))
}
