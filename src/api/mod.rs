//! The HTTP layer: routes, extractors and thin handlers. A handler parses the
//! request into domain values, calls the pipeline or the store, and maps the
//! answer; it holds no storage logic.

pub mod access;
mod averages;
mod counters;
pub mod dashboard;
mod days;
pub mod edge;
pub mod events;
mod extract;
mod model;
mod multiread;
pub mod openapi;
mod ops;
mod queries;
mod reports;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post, put};
use axum::Router;

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
    pub metrics: Arc<Metrics>,
    /// `max-age` of `GET /v1/counters` answers, sent as `public`; `None`:
    /// `no-cache` (caches revalidate every time, by ETag).
    pub counters_max_age: Option<Duration>,
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
            counters_max_age: None,
        }
    }
}

/// The whole HTTP API over `state` alone: one tenant, no keys, no edge limits.
pub fn router(state: AppState) -> Router {
    gateway_router(Gateway::open(Tenants::single(state)))
        .expect("a gateway without CORS origins always builds")
}

/// The whole HTTP API over `gw`; `serve` and the tests drive exactly this
/// router. Fails only on a bad CORS origin.
pub fn gateway_router(gw: Gateway) -> Result<Router, String> {
    let limits = gw.tenants.default_tenant().limits;
    let cors = edge::cors(&gw.cors_origins)?;
    let router = Router::new()
        .route(
            "/v1/counters/{entity}/{action}/{uuid}",
            get(counters::get).delete(counters::delete),
        )
        .route(
            "/v1/counters/{entity}/{action}/{uuid}/increment",
            post(counters::increment),
        )
        .route(
            "/v1/counters/{entity}/{action}/{uuid}/decrement",
            post(counters::decrement),
        )
        .route(
            "/v1/targets/{entity}/{uuid}/counters",
            get(counters::target),
        )
        .route("/v1/events", post(events::post))
        .route(
            "/v1/counters/{entity}/{action}/{uuid}/histogram",
            get(queries::histogram),
        )
        .route("/v1/top/{entity}/{action}", get(queries::top))
        .route(
            "/v1/top-averages/{entity}/{action}",
            get(queries::top_averages),
        )
        .route(
            "/v1/averages/{entity}/{action}/{uuid}",
            get(averages::get).post(averages::post),
        )
        .route("/v1/reports/stale", get(reports::stale))
        .route("/v1/reports/unused", get(reports::unused))
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz))
        .route("/metrics", get(ops::metrics))
        .route("/openapi.json", get(openapi::openapi))
        .route("/dashboard", get(dashboard::page))
        .route("/dashboard/dashboard.js", get(dashboard::script))
        .route("/dashboard/dashboard.css", get(dashboard::style))
        .route("/v1/counters", get(multiread::get))
        .route("/v1/counters/get", post(multiread::post))
        .route(
            "/v1/counters/{entity}/{action}/{uuid}/days/{day}",
            put(days::put_one),
        )
        .route("/v1/days", put(days::put_many))
        .fallback(|| async { ApiError::NotFound("no such endpoint".into()) })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(DefaultBodyLimit::max(limits.max_body_bytes))
        .layer(axum::middleware::from_fn_with_state(
            gw.clone(),
            edge::observe,
        ))
        .with_state(gw);
    Ok(match cors {
        Some(layer) => router.layer(layer),
        None => router,
    })
}
