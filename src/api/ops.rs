//! Operational endpoints: liveness, readiness, metrics.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use serde_json::json;
use std::sync::Arc;

use super::access::Operator;
use super::Gateway;
use crate::error::ApiError;
use crate::store::StoreError;

use super::openapi::{MetricsText, OperatorErrors, Status};

/// The process is alive and serving HTTP; says nothing of the store.
#[utoipa::path(get, path = "/healthz", summary = "The process is alive",
    responses((status = 200, description = "Success", body = Status)))]
pub async fn healthz() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/json")],
        "{\"status\":\"ok\"}",
    )
}

/// The store answers: safe to send traffic here. Checks the default
/// tenant's store: every tenant's lives on the same disk or cluster.
#[utoipa::path(get, path = "/readyz", summary = "The store answers",
    responses((status = 200, description = "Success", body = Status)))]
pub async fn readyz(State(gw): State<Arc<Gateway>>) -> Result<impl IntoResponse, ApiError> {
    gw.tenants
        .default_tenant()
        .store
        .ready()
        .await
        .map_err(|e| match e {
            StoreError::Halted(why) => ApiError::Unavailable(format!("not ready: {why}")),
            e => ApiError::store("not ready: the store does not answer", e),
        })?;
    Ok((StatusCode::OK, Json(json!({"status": "ready"}))))
}

/// Prometheus metrics of every tenant together; with keys configured, only
/// for an admin key of every tenant.
#[utoipa::path(get, path = "/metrics",
    summary = "Prometheus metrics of every tenant (admin key of tenant * when keys are configured)",
    responses((status = 200, description = "Success",
        content((inline(MetricsText) = "text/plain"))), OperatorErrors))]
pub async fn metrics(_: Operator, State(gw): State<Arc<Gateway>>) -> impl IntoResponse {
    let mut text = gw.metrics.render(
        gw.tenants.queue_depth(),
        gw.tenants.queue_bytes(),
        gw.tenants.count(),
        crate::store::sqlite::idempotency_ids(),
    );
    text.push_str(&gw.streams.render_metrics());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text)
}
