//! The HTTP layer: routes, extractors and thin handlers. A handler parses the
//! request into domain values, calls the pipeline or the store, and maps the
//! answer; it holds no storage logic.

mod averages;
mod counters;
mod events;
mod extract;
mod model;
mod ops;
mod queries;
mod reports;

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;

use crate::domain::TimePolicy;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::pipeline::Pipeline;
use crate::store::Store;

/// Request limits enforced at the edge.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_body_bytes: usize,
    pub max_events_per_request: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 4 * 1024 * 1024,
            max_events_per_request: 10_000,
        }
    }
}

/// Everything a handler may need, cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub store: Arc<dyn Store>,
    pub pipeline: Pipeline,
    pub time_policy: TimePolicy,
    pub limits: Limits,
    pub metrics: Arc<Metrics>,
}

/// The whole HTTP API over `state`; tests drive exactly this router.
pub fn router(state: AppState) -> Router {
    let limits = state.limits;
    Router::new()
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
        .fallback(|| async { ApiError::NotFound("no such endpoint".into()) })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(DefaultBodyLimit::max(limits.max_body_bytes))
        .with_state(state)
}
