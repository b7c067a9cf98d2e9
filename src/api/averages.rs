//! Average counters (ratings): add or retract a sample, read one average.
//! Samples go through the write pipeline like increments, so they are
//! coalesced and durable before the answer.

use std::borrow::Cow;

use super::access::{CounterWriter, Disclosure, Reader};
use axum::Json;
use serde::{Deserialize, Serialize};

use super::extract::{parse_json, JsonBytes, PathParams, QueryParams};
use super::model::KeyPath;
use super::queries::{mean, window, WindowJson};
use crate::domain::{format_ms, Increment, Resolved, SampleSpec};
use crate::error::ApiError;
use crate::store::Average;

use super::openapi::{NotFound, Overflow};

/// Body of `POST /v1/averages/{entity}/{action}/{uuid}`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SampleBody<'a> {
    /// The sample, e.g. a rating of 4.
    pub value: i64,
    /// Takes back one earlier sample of `value` (sum -= value, quantity -= 1),
    /// e.g. when a user withdraws a rating.
    #[serde(default)]
    pub retract: bool,
    #[serde(default, borrow)]
    #[schema(schema_with = crate::api::openapi::optional_name)]
    pub category: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    #[schema(schema_with = crate::api::openapi::optional_timestamp)]
    pub timestamp: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    #[schema(schema_with = crate::api::openapi::optional_event_id)]
    pub id: Option<Cow<'a, str>>,
}

#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = Average)]
pub struct AverageJson {
    id: String,
    entity: String,
    action: String,
    uuid: String,
    #[serde(flatten)]
    window: WindowJson,
    /// Within a window the sum (or quantity) may leave i64.
    #[schema(schema_with = crate::api::openapi::wide_integer)]
    sum: i128,
    #[schema(schema_with = crate::api::openapi::wide_integer)]
    quantity: i128,
    /// `sum / quantity`; `null` without samples.
    #[schema(required = true)]
    average: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    category: Option<String>,
    #[schema(schema_with = crate::api::openapi::timestamp)]
    first_timestamp: String,
    #[schema(schema_with = crate::api::openapi::timestamp)]
    recorded_timestamp: String,
}

impl AverageJson {
    fn new(a: Average, resolved: Resolved) -> Self {
        AverageJson {
            id: a.key.doc_id(),
            entity: a.key.entity.to_string(),
            action: a.key.action.to_string(),
            uuid: a.key.uuid.to_string(),
            window: resolved.into(),
            average: mean(a.sum, a.quantity),
            sum: a.sum,
            quantity: a.quantity,
            category: a.category,
            first_timestamp: format_ms(a.first_ms),
            recorded_timestamp: format_ms(a.recorded_ms),
        }
    }
}

/// The answer to a sample: the all-time average after it, or, to a `write`
/// key (unless `--write-keys-read-values`), only whether it was counted.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum SampleAnswer {
    Average(AverageJson),
    Outcome(SampleOutcome),
}

/// Whether a sample sent with a `write` key was counted: such a key is in
/// public pages and may add samples, not read averages.
#[derive(Serialize, utoipa::ToSchema)]
pub struct SampleOutcome {
    id: String,
    entity: String,
    action: String,
    uuid: String,
    /// `false` when its `id` was counted before: nothing was added.
    counted: bool,
}

/// Adds (or retracts) one sample and answers the all-time average after it.
#[utoipa::path(post, path = "/v1/averages/{entity}/{action}/{uuid}",
    summary = "Add (or retract) one sample of an average counter",
    params(KeyPath), security(("bearer" = ["write"]), ("key" = ["write"])),
    request_body(content((SampleBody = "application/json"), (String = "text/plain"))),
    responses((status = 200, description = "Success", body = SampleAnswer), NotFound, Overflow))]
pub async fn post(
    CounterWriter { app, disclosure }: CounterWriter,
    PathParams(path): PathParams<KeyPath>,
    JsonBytes(body): JsonBytes,
) -> Result<Json<SampleAnswer>, ApiError> {
    app.pipeline.admit()?;
    let key = path.key()?;
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::BadRequest(
            "value is required: send {\"value\": 4}".into(),
        ));
    }
    let b: SampleBody = parse_json(&body)?;
    let spec = SampleSpec {
        entity: &key.entity,
        action: &key.action,
        uuid: &key.uuid,
        value: b.value,
        retract: b.retract,
        category: b.category.as_deref(),
        timestamp: b.timestamp.as_deref(),
        id: b.id.as_deref(),
    };
    let inc = Increment::sample(&spec, &app.time_policy, app.clock.now())
        .map_err(ApiError::BadRequest)?;
    // Not held while the write waits: the queue's bound counts the increment.
    drop(b);
    drop(body);
    let app = app.opened().await?;
    let applied = app.pipeline.submit(vec![inc], None).await?;
    if disclosure == Disclosure::Outcome {
        return Ok(Json(SampleAnswer::Outcome(SampleOutcome {
            id: key.doc_id(),
            entity: key.entity.to_string(),
            action: key.action.to_string(),
            uuid: key.uuid.to_string(),
            counted: applied.duplicates == 0,
        })));
    }
    let all = window(&app, None, None, None)?;
    let avg = app.store.average(&key, None).await?.ok_or_else(|| {
        if applied.duplicates > 0 {
            // The id was counted before, for another key: nothing was added here.
            ApiError::NotFound(format!(
                "average {key} has never had a sample; this sample's id was counted before"
            ))
        } else {
            ApiError::Internal(format!("average {key} missing after its write"))
        }
    })?;
    Ok(Json(SampleAnswer::Average(AverageJson::new(avg, all))))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct AverageParams {
    #[param(inline, value_type = Option<crate::api::openapi::Interval>)]
    interval: Option<String>,
    #[param(inline, value_type = Option<crate::api::openapi::Day>)]
    from: Option<String>,
    #[param(inline, value_type = Option<crate::api::openapi::Day>)]
    to: Option<String>,
    /// Refused (400) unless absent or `UTC`: averages keep no hour
    /// buckets, so their windows are UTC days.
    #[param(inline, value_type = Option<crate::api::openapi::ZoneName>)]
    tz: Option<String>,
}

/// `GET /v1/averages/{entity}/{action}/{uuid}`: sum, quantity and average,
/// all time (default) or inside a window.
#[utoipa::path(get, path = "/v1/averages/{entity}/{action}/{uuid}",
    summary = "Sum, quantity and average, all time or inside a window",
    params(KeyPath, AverageParams), security(("bearer" = ["read"]), ("key" = ["read"])),
    responses((status = 200, description = "Success", body = AverageJson), NotFound))]
pub async fn get(
    Reader(app): Reader,
    PathParams(path): PathParams<KeyPath>,
    QueryParams(p): QueryParams<AverageParams>,
) -> Result<Json<AverageJson>, ApiError> {
    let key = path.key()?;
    super::queries::utc_only(p.tz.as_deref())?;
    let resolved = window(
        &app,
        p.interval.as_deref(),
        p.from.as_deref(),
        p.to.as_deref(),
    )?;
    let avg = app
        .store
        .average(&key, resolved.window)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("average {key} has never had a sample")))?;
    Ok(Json(AverageJson::new(avg, resolved)))
}
