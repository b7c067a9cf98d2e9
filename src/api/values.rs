//! Setting a counter's value: `PUT /v1/counters/{entity}/{action}/{uuid}`
//! with `{"value": n}` starts a counter at the value it had elsewhere (a
//! hosted hit counter moved here). Admin keys only, like a backfill: a set
//! can lower a counter, which the public write keys must not.

use axum::Json;
use serde::Deserialize;

use super::access::AdminWriter;
use super::extract::{parse_json, JsonBytes, PathParams};
use super::model::KeyPath;
use crate::domain::{Counter, CounterSet};
use crate::error::ApiError;
use crate::store::StoreError;

/// Body of a set.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct ValueBody {
    /// The counter's new all-time value, a signed 64-bit integer.
    value: i64,
    #[serde(default)]
    #[schema(schema_with = crate::api::openapi::optional_name)]
    category: Option<String>,
}

#[utoipa::path(put, path = "/v1/counters/{entity}/{action}/{uuid}",
    summary = "Set a counter's all-time value (created if absent), its day buckets untouched, so windowed lists and histograms stay as counted; setting it twice is the same as once",
    params(KeyPath), security(("bearer" = ["admin"]), ("key" = ["admin"])),
    request_body(content((ValueBody = "application/json"), (String = "text/plain"))),
    responses((status = 200, description = "Success: the counter after the set, durable", body = Counter)))]
pub async fn put(
    AdminWriter(app): AdminWriter,
    PathParams(path): PathParams<KeyPath>,
    JsonBytes(body): JsonBytes,
) -> Result<Json<Counter>, ApiError> {
    app.pipeline.admit()?;
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::BadRequest(
            "the body is empty; send {\"value\": n}".into(),
        ));
    }
    let parsed: ValueBody = parse_json(&body).map_err(|e| match e {
        ApiError::BadRequest(reason) if reason.starts_with("value") => {
            ApiError::BadRequest(format!(
                "{reason} (a counter's value is an integer from {} to {})",
                i64::MIN,
                i64::MAX
            ))
        }
        other => other,
    })?;
    let set = CounterSet::new(
        &path.entity,
        &path.action,
        &path.uuid,
        parsed.value,
        parsed.category.as_deref(),
        app.clock.now(),
    )
    .map_err(ApiError::BadRequest)?;
    let app = app.opened().await?;
    let set = app.store.set_value(set).await;
    app.pipeline.note_change();
    match set {
        Ok(counter) => Ok(Json(counter)),
        // A set is the same whenever it is repeated: tell the client so.
        Err(e @ StoreError::Unavailable(_)) => Err(ApiError::store(
            "the store did not take the set; it may or may not be applied, and sending the same set again is safe",
            e,
        )),
        Err(e) => Err(e.into()),
    }
}
