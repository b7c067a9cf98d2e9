//! Handlers for one counter and for the counters of one target.

use super::access::{Admin, Reader, Writer};
use super::crawlers::{self, Crawler, Ignored};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};

use super::extract::{parse_json, JsonBytes, PathParams};
use super::model::{IncrementBody, KeyPath};
use super::openapi::{NotFound, Overflow};
use super::AppState;
use crate::domain::{Counter, Increment};
use crate::error::ApiError;

#[utoipa::path(post, path = "/v1/counters/{entity}/{action}/{uuid}/increment",
    summary = "Add `count` (default 1) to a counter; answers it after the write is durable",
    params(KeyPath), security(("bearer" = ["write"]), ("key" = ["write"])),
    request_body(content(
        (Option<IncrementBody> = "application/json"), (String = "text/plain"))),
    responses((status = 200, description = "Success", body = Counter), Ignored, NotFound, Overflow))]
pub async fn increment(
    Writer(app): Writer,
    Crawler(crawler): Crawler,
    PathParams(path): PathParams<KeyPath>,
    JsonBytes(body): JsonBytes,
) -> Result<Response, ApiError> {
    add(app, path, body, false, crawler).await
}

#[utoipa::path(post, path = "/v1/counters/{entity}/{action}/{uuid}/decrement",
    summary = "Subtract `count` (default 1) from a counter",
    params(KeyPath), security(("bearer" = ["write"]), ("key" = ["write"])),
    request_body(content(
        (Option<IncrementBody> = "application/json"), (String = "text/plain"))),
    responses((status = 200, description = "Success", body = Counter), Ignored, NotFound, Overflow))]
pub async fn decrement(
    Writer(app): Writer,
    Crawler(crawler): Crawler,
    PathParams(path): PathParams<KeyPath>,
    JsonBytes(body): JsonBytes,
) -> Result<Response, ApiError> {
    add(app, path, body, true, crawler).await
}

async fn add(
    app: AppState,
    path: KeyPath,
    body: axum::body::Bytes,
    negate: bool,
    crawler: bool,
) -> Result<Response, ApiError> {
    app.pipeline.admit()?;
    let parsed: IncrementBody = if body.iter().all(u8::is_ascii_whitespace) {
        IncrementBody::default()
    } else {
        parse_json(&body)?
    };
    let spec = parsed.spec(&path.entity, &path.action, &path.uuid, negate);
    let inc = Increment::from_spec(&spec, &app.time_policy, app.clock.now())
        .map_err(ApiError::BadRequest)?;
    if crawler {
        return Ok(crawlers::ignored(&app.metrics, 1));
    }
    let key = inc.key.clone();
    // The queue's bound in bytes counts the increment, not the body (up to
    // --max-body-bytes of white space): it is not held while the write waits.
    drop(parsed);
    drop(body);
    let applied = app.pipeline.submit(vec![inc], Some(key.clone())).await?;
    let counter =
        match applied.counter {
            Some(c) => c,
            // A duplicate id changes nothing: answer the counter as it stands.
            None => app.store.get(&key).await?.ok_or_else(|| {
                ApiError::NotFound(format!("counter {key} has never been counted"))
            })?,
        };
    Ok(Json(counter).into_response())
}

#[utoipa::path(get, path = "/v1/counters/{entity}/{action}/{uuid}",
    summary = "One counter",
    params(KeyPath), security(("bearer" = ["read"]), ("key" = ["read"])),
    responses((status = 200, description = "Success", body = Counter), NotFound))]
pub async fn get(
    Reader(app): Reader,
    PathParams(path): PathParams<KeyPath>,
) -> Result<Json<Counter>, ApiError> {
    let key = path.key()?;
    app.store
        .get(&key)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("counter {key} has never been counted")))
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct Deleted {
    deleted: bool,
}

#[utoipa::path(delete, path = "/v1/counters/{entity}/{action}/{uuid}",
    summary = "Remove a counter and its histogram buckets",
    params(KeyPath), security(("bearer" = ["admin"]), ("key" = ["admin"])),
    responses((status = 200, description = "Success", body = Deleted), NotFound))]
pub async fn delete(
    Admin(app): Admin,
    PathParams(path): PathParams<KeyPath>,
) -> Result<Json<Deleted>, ApiError> {
    let key = path.key()?;
    if app.store.delete(&key).await? {
        Ok(Json(Deleted { deleted: true }))
    } else {
        Err(ApiError::NotFound(format!("counter {key} does not exist")))
    }
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub struct TargetPath {
    #[param(inline, value_type = crate::api::openapi::Name)]
    entity: String,
    #[param(inline, value_type = crate::api::openapi::Name)]
    uuid: String,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct TargetCounters {
    entity: String,
    uuid: String,
    counters: Vec<Counter>,
}

#[utoipa::path(get, path = "/v1/targets/{entity}/{uuid}/counters",
    summary = "Every counter of one target",
    params(TargetPath), security(("bearer" = ["read"]), ("key" = ["read"])),
    responses((status = 200, description = "Success", body = TargetCounters)))]
pub async fn target(
    Reader(app): Reader,
    PathParams(path): PathParams<TargetPath>,
) -> Result<Json<TargetCounters>, ApiError> {
    crate::domain::validate_name("entity", &path.entity).map_err(ApiError::BadRequest)?;
    crate::domain::validate_name("uuid", &path.uuid).map_err(ApiError::BadRequest)?;
    let counters = app.store.target_counters(&path.entity, &path.uuid).await?;
    Ok(Json(TargetCounters {
        entity: path.entity,
        uuid: path.uuid,
        counters,
    }))
}
