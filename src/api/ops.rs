//! Operational endpoints: liveness, readiness, metrics.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use serde_json::json;

use super::AppState;
use crate::error::ApiError;

/// The process is alive and serving HTTP; says nothing of the store.
pub async fn healthz() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/json")],
        "{\"status\":\"ok\"}",
    )
}

/// The store answers: safe to send traffic here.
pub async fn readyz(State(app): State<AppState>) -> Result<impl IntoResponse, ApiError> {
    app.store
        .ready()
        .await
        .map_err(|e| ApiError::Unavailable(format!("not ready: {e}")))?;
    Ok((StatusCode::OK, Json(json!({"status": "ready"}))))
}

pub async fn metrics(State(app): State<AppState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        app.metrics.render(app.pipeline.depth()),
    )
}
