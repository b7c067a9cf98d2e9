//! Backfill: `PUT /v1/counters/{entity}/{action}/{uuid}/days/{day}` sets one
//! day's bucket, `PUT /v1/days` many, each validated whole before anything
//! is applied. Admin keys only: a set can lower a counter and rewrite its
//! history, which the public write keys (which can only add) must not.

use std::collections::HashMap;

use axum::Json;
use serde::{Deserialize, Serialize};

use super::access::AdminWriter;
use super::extract::{parse_json, JsonBytes, PathParams};
use super::AppState;
use crate::domain::{day_of, format_day, Counter, CounterKey, DaySet, DaySetSpec, Interner};
use crate::error::{ApiError, EventError};
use crate::store::DaysOutcome;

use super::openapi::Overflow;

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub struct DayPath {
    #[param(inline, value_type = crate::api::openapi::Name)]
    entity: String,
    #[param(inline, value_type = crate::api::openapi::Name)]
    action: String,
    #[param(inline, value_type = crate::api::openapi::Name)]
    uuid: String,
    #[param(inline, value_type = crate::api::openapi::Day)]
    day: String,
}

/// Body of the one-day form.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct DayBody {
    value: i64,
    #[serde(default)]
    #[schema(schema_with = crate::api::openapi::optional_name)]
    category: Option<String>,
}

/// One element of `PUT /v1/days`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct DayItem {
    #[schema(schema_with = crate::api::openapi::name)]
    entity: String,
    #[schema(schema_with = crate::api::openapi::name)]
    action: String,
    #[schema(schema_with = crate::api::openapi::name)]
    uuid: String,
    #[schema(schema_with = crate::api::openapi::day)]
    day: String,
    value: i64,
    #[serde(default)]
    #[schema(schema_with = crate::api::openapi::optional_name)]
    category: Option<String>,
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct DaysBody {
    // utoipa reads a type named `Object` as a free-form object: name T.
    #[schema(min_items = 1, value_type = Vec<DayItem>)]
    days: Vec<super::model::Object<DayItem>>,
}

#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = DaySet)]
pub struct DaySetAnswer {
    #[schema(schema_with = crate::api::openapi::day)]
    day: String,
    value: i64,
    /// The bucket's value before (0 when the day had none).
    previous: i64,
    /// The counter after the set.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    counter: Option<Counter>,
}

#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = DaysSet)]
pub struct DaysAnswer {
    /// Days set by the request.
    set: usize,
    /// Of those, the days whose value changed (the others held it already).
    changed: usize,
}

#[utoipa::path(put, path = "/v1/counters/{entity}/{action}/{uuid}/days/{day}",
    summary = "Backfill: set one UTC day's bucket to `value`, moving the counter by the difference (created if absent); setting it twice is the same as once",
    params(DayPath), security(("bearer" = ["admin"]), ("key" = ["admin"])),
    request_body(content((DayBody = "application/json"), (String = "text/plain"))),
    responses((status = 200, description = "Success", body = DaySetAnswer), Overflow))]
pub async fn put_one(
    AdminWriter(app): AdminWriter,
    PathParams(path): PathParams<DayPath>,
    JsonBytes(body): JsonBytes,
) -> Result<Json<DaySetAnswer>, ApiError> {
    app.pipeline.admit()?;
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::BadRequest(
            "the body is empty; send {\"value\": n}".into(),
        ));
    }
    let parsed: DayBody = parse_json(&body)?;
    let spec = DaySetSpec {
        entity: &path.entity,
        action: &path.action,
        uuid: &path.uuid,
        day: &path.day,
        value: parsed.value,
        category: parsed.category.as_deref(),
    };
    let set = DaySet::from_spec_in(
        &spec,
        &app.time_policy,
        app.clock.now(),
        &mut Interner::default(),
    )
    .map_err(ApiError::BadRequest)?;
    let (key, day, value) = (set.key.clone(), set.day, set.value);
    let app = app.opened().await?;
    let (previous, mut counters) = apply(&app, vec![set]).await?;
    Ok(Json(DaySetAnswer {
        day: format_day(day),
        value,
        previous: previous[0],
        counter: counters.remove(&key),
    }))
}

#[utoipa::path(put, path = "/v1/days",
    summary = "Backfill many days of many counters, all validated before any is set, all or nothing",
    security(("bearer" = ["admin"]), ("key" = ["admin"])),
    request_body(content((DaysBody = "application/json"), (String = "text/plain"))),
    responses((status = 200, description = "Success", body = DaysAnswer), Overflow))]
pub async fn put_many(
    AdminWriter(app): AdminWriter,
    JsonBytes(body): JsonBytes,
) -> Result<Json<DaysAnswer>, ApiError> {
    app.pipeline.admit()?;
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::BadRequest(
            "the body is empty; send {\"days\": [...]}".into(),
        ));
    }
    let parsed: DaysBody = parse_json(&body)?;
    let items = &parsed.days;
    let max = app.limits.max_events_per_request;
    if items.is_empty() {
        return Err(ApiError::BadRequest(
            "days must hold at least one day".into(),
        ));
    }
    if items.len() > max {
        return Err(ApiError::BadRequest(format!(
            "days holds {} days, over the limit of {max} per request (--max-events-per-request)",
            items.len()
        )));
    }
    let now = app.clock.now();
    let mut names = Interner::for_batch(items.len());
    let mut sets = Vec::with_capacity(items.len());
    let mut errors = Vec::new();
    let mut seen: HashMap<(CounterKey, i64), usize> = HashMap::with_capacity(items.len());
    for (index, super::model::Object(item)) in items.iter().enumerate() {
        let spec = DaySetSpec {
            entity: &item.entity,
            action: &item.action,
            uuid: &item.uuid,
            day: &item.day,
            value: item.value,
            category: item.category.as_deref(),
        };
        match DaySet::from_spec_in(&spec, &app.time_policy, now, &mut names) {
            Ok(set) => match seen.insert((set.key.clone(), set.day), index) {
                // Two values for one day: which one was meant is not ours to guess.
                Some(first) => errors.push(EventError {
                    index,
                    reason: format!(
                        "day {} of counter {} is already set by days[{first}]",
                        item.day, set.key
                    ),
                }),
                None => sets.push(set),
            },
            Err(reason) => errors.push(EventError { index, reason }),
        }
    }
    if !errors.is_empty() {
        return Err(ApiError::InvalidDays(errors));
    }
    let values: Vec<i64> = sets.iter().map(|s| s.value).collect();
    let app = app.opened().await?;
    let (previous, _) = apply(&app, sets).await?;
    let changed = values.iter().zip(&previous).filter(|(v, p)| v != p).count();
    Ok(Json(DaysAnswer {
        set: values.len(),
        changed,
    }))
}

/// Hands validated sets to the store and maps what became of them.
async fn apply(
    app: &AppState,
    sets: Vec<DaySet>,
) -> Result<(Vec<i64>, HashMap<CounterKey, Counter>), ApiError> {
    let oldest = day_of(app.time_policy.oldest_accepted(app.clock.now()));
    let described: Vec<(CounterKey, i64)> = sets.iter().map(|s| (s.key.clone(), s.day)).collect();
    let one = sets.len() == 1;
    let outcome = app.store.set_days(sets, oldest).await;
    app.pipeline.note_change();
    match outcome? {
        DaysOutcome::Applied { previous, counters } => Ok((previous, counters)),
        DaysOutcome::Overflow { index } => {
            let (key, day) = &described[index];
            let at = if one {
                String::new()
            } else {
                format!(" (days[{index}])")
            };
            Err(ApiError::Overflow(format!(
                "setting day {} of counter {key}{at} would take the counter outside the signed 64-bit range; nothing of the request was applied",
                format_day(*day)
            )))
        }
        DaysOutcome::Incomplete {
            done,
            half_set,
            reason,
        } => {
            let (key, day) = &described[done.min(described.len() - 1)];
            let state = if half_set {
                "may be half set (its bucket, not yet its counter)"
            } else {
                "was not set"
            };
            Err(ApiError::store(
                &format!(
                    "{done} of {} days were set; day {} of counter {key} {state} and the days after it were not set; sending the same days again completes them exactly",
                    described.len(),
                    format_day(*day)
                ),
                reason,
            ))
        }
    }
}
