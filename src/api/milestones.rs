//! Totals N days after publication: a target's publication time
//! (`PUT`/`GET /v1/targets/{entity}/{uuid}`), one counter's milestones
//! (`GET /v1/counters/{entity}/{action}/{uuid}/milestones`) and the top
//! lists by them (`GET /v1/top/{entity}/{action}?interval=first_<N>_days`,
//! answered from `queries::top`). The rules are in `domain::milestone`.

use axum::Json;
use serde::{Deserialize, Serialize};

use super::access::{AdminWriter, Reader};
use super::extract::{parse_json, JsonBytes, PathParams, QueryParams};
use super::model::KeyPath;
use super::AppState;
use crate::domain::hours::{hour_of_ms, HOUR_MS};
use crate::domain::milestone::{
    self, parse_days, parse_published, Publication, Published, DEFAULT_MILESTONES,
};
use crate::domain::zone::{self, Zone};
use crate::domain::{day_of, format_day, format_ms, validate_name, CounterKey, HourRange};
use crate::error::ApiError;
use crate::store::{FirstDaysQuery, LocalFirstDaysQuery, PublishedSet};

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub struct TargetPath {
    #[param(inline, value_type = crate::api::openapi::Name)]
    entity: String,
    #[param(inline, value_type = crate::api::openapi::Name)]
    uuid: String,
}

impl TargetPath {
    fn validated(&self) -> Result<(), ApiError> {
        validate_name("entity", &self.entity).map_err(ApiError::BadRequest)?;
        validate_name("uuid", &self.uuid).map_err(ApiError::BadRequest)
    }
}

/// Body of `PUT /v1/targets/{entity}/{uuid}`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct TargetBody {
    /// RFC 3339; `null` clears it (the first touch stands in). Required:
    /// an empty object clears nothing by accident.
    #[serde(default, deserialize_with = "present")]
    #[schema(schema_with = crate::api::openapi::optional_timestamp, required = true)]
    published: Option<Option<String>>,
}

/// A field that is there, `null` or not: `Some`; absent: `None`.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<String>>, D::Error> {
    Option::<String>::deserialize(d).map(Some)
}

#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = TargetPublication)]
pub struct TargetJson {
    entity: String,
    uuid: String,
    /// The publication time kept; `null`: none, each counter's first touch
    /// stands in.
    #[schema(schema_with = crate::api::openapi::optional_timestamp)]
    published: Option<String>,
    /// Set when the value sent was implausible (before 2008-01-01 or in the
    /// future) and so not kept: why.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    implausible: Option<&'static str>,
}

/// `PUT /v1/targets/{entity}/{uuid}`: sets (or clears) a target's
/// publication time. Admin only: it moves every milestone of the target.
#[utoipa::path(put, path = "/v1/targets/{entity}/{uuid}",
    summary = "Set a target's publication time (milestones count from its UTC day); an implausible one (before 2008, in the future) is not kept and the first touch stands in",
    params(TargetPath), security(("bearer" = ["admin"]), ("key" = ["admin"])),
    request_body(content((TargetBody = "application/json"), (String = "text/plain"))),
    responses((status = 200, description = "Success: what is kept, durable", body = TargetJson)))]
pub async fn put_target(
    AdminWriter(app): AdminWriter,
    PathParams(path): PathParams<TargetPath>,
    JsonBytes(body): JsonBytes,
) -> Result<Json<TargetJson>, ApiError> {
    app.pipeline.admit()?;
    path.validated()?;
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::BadRequest(
            "the body is empty; send {\"published\": \"2026-11-30T08:00:00Z\"}".into(),
        ));
    }
    let parsed: TargetBody = parse_json(&body)?;
    let Some(published) = parsed.published else {
        return Err(ApiError::BadRequest(
            "published is required: an RFC 3339 time, or null to clear it".into(),
        ));
    };
    let (at_ms, implausible) = match published.as_deref() {
        None => (None, None),
        Some(raw) => {
            match parse_published("published", raw, app.clock.now(), app.time_policy.max_skew)
                .map_err(ApiError::BadRequest)?
            {
                Published::At(ms) => (Some(ms), None),
                Published::Implausible(why) => (None, Some(why.as_str())),
            }
        }
    };
    let app = app.opened().await?;
    app.store
        .set_published(vec![PublishedSet {
            entity: path.entity.clone(),
            uuid: path.uuid.clone(),
            at_ms,
            replace: true,
        }])
        .await?;
    Ok(Json(TargetJson {
        entity: path.entity,
        uuid: path.uuid,
        published: at_ms.map(format_ms),
        implausible,
    }))
}

/// `GET /v1/targets/{entity}/{uuid}`: the publication time kept, if any.
#[utoipa::path(get, path = "/v1/targets/{entity}/{uuid}",
    summary = "A target's publication time, `null` when none is kept",
    params(TargetPath), security(("bearer" = ["read"]), ("key" = ["read"])),
    responses((status = 200, description = "Success", body = TargetJson)))]
pub async fn get_target(
    Reader(app): Reader,
    PathParams(path): PathParams<TargetPath>,
) -> Result<Json<TargetJson>, ApiError> {
    path.validated()?;
    let at = app.store.published(&path.entity, &path.uuid).await?;
    Ok(Json(TargetJson {
        entity: path.entity,
        uuid: path.uuid,
        published: at.map(format_ms),
        implausible: None,
    }))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct MilestonesParams {
    /// Milestones in days after publication, comma-separated (`3,30`, the
    /// default), each from 1 to the bucket retention, at most 16.
    days: Option<String>,
    /// An IANA zone (`Europe/Berlin`): milestones in that zone's days
    /// (P the local day of the publication, totals summed from hour
    /// buckets over local days, complete at local midnight). Refused (400):
    /// an unknown zone, one whose offset over the days is not whole hours,
    /// a publication day before `--hourly-retention-days`. Absent or
    /// `UTC`: UTC days, from day buckets.
    #[param(inline, value_type = Option<crate::api::openapi::ZoneName>)]
    tz: Option<String>,
}

#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = Milestone)]
pub struct MilestoneJson {
    days: u32,
    /// The first and last UTC day counted (with `tz`, local days).
    #[schema(schema_with = crate::api::openapi::day)]
    from: String,
    #[schema(schema_with = crate::api::openapi::day)]
    to: String,
    /// Sum of the counter's buckets over those days.
    #[schema(schema_with = crate::api::openapi::wide_integer)]
    total: i128,
    /// Whether the last day is over: the total moves no more.
    complete: bool,
    /// When it completes (or completed): 00:00 UTC after its last day
    /// (with `tz`, the zone's midnight, written in UTC).
    #[schema(schema_with = crate::api::openapi::timestamp)]
    completes: String,
}

#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = Milestones)]
pub struct MilestonesJson {
    id: String,
    entity: String,
    action: String,
    uuid: String,
    /// The publication time counted from.
    #[schema(schema_with = crate::api::openapi::timestamp)]
    published: String,
    /// `set` (by an event or a `PUT`) or `first_touch` (none set).
    #[schema(schema_with = crate::api::openapi::published_source)]
    published_source: &'static str,
    /// With `tz`: the zone whose days the milestones count.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    tz: Option<&'static str>,
    /// With `tz`: `false` when a day counted moved without an hour to put
    /// it in (a backfilled day), so its hours do not sum to it.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    exact: Option<bool>,
    milestones: Vec<MilestoneJson>,
}

/// The `days` list against the retention; errors name `days`.
fn days_list(app: &AppState, raw: Option<&str>) -> Result<Vec<u32>, ApiError> {
    let max = app.time_policy.retention_days;
    match raw {
        Some(raw) => parse_days("days", raw, max).map_err(ApiError::BadRequest),
        None => Ok(DEFAULT_MILESTONES
            .iter()
            .copied()
            .filter(|d| *d <= max)
            .collect()),
    }
}

/// `GET /v1/counters/{entity}/{action}/{uuid}/milestones?days=3,30`.
#[utoipa::path(get, path = "/v1/counters/{entity}/{action}/{uuid}/milestones",
    summary = "A counter's totals within N days of its target's publication (or first touch), whether each is complete and when it completes",
    params(KeyPath, MilestonesParams), security(("bearer" = ["read"]), ("key" = ["read"])),
    responses((status = 200, description = "Success", body = MilestonesJson),
        (status = 404, description = "Never counted", body = crate::error::ErrorJson)))]
pub async fn get(
    Reader(app): Reader,
    PathParams(path): PathParams<KeyPath>,
    QueryParams(p): QueryParams<MilestonesParams>,
) -> Result<Json<MilestonesJson>, ApiError> {
    let key = path.key()?;
    let days = days_list(&app, p.days.as_deref())?;
    let tz = zone::parse_zone(p.tz.as_deref()).map_err(ApiError::BadRequest)?;
    let not_found = || ApiError::NotFound(format!("counter {key} has never been counted"));
    let counter = app.store.get(&key).await?.ok_or_else(not_found)?;
    let set = app.store.published(&key.entity, &key.uuid).await?;
    let publication = Publication::resolve(set, counter.first_ms);
    if let Some(z) = tz {
        return local(&app, key, path, &days, publication, z)
            .await
            .map(Json);
    }
    let day = publication.day();
    let longest = days.iter().copied().max().unwrap_or(1);
    let buckets = app
        .store
        .histogram(&key, milestone::milestone_window(day, longest))
        .await?
        .ok_or_else(not_found)?;
    let pairs: Vec<(i64, i64)> = buckets.iter().map(|b| (b.day, b.value)).collect();
    let today = app.clock.today();
    Ok(Json(MilestonesJson {
        id: key.doc_id(),
        entity: path.entity,
        action: path.action,
        uuid: path.uuid,
        published: format_ms(publication.at_ms),
        published_source: publication.source.as_str(),
        tz: None,
        exact: None,
        milestones: milestone::milestones(day, &days, &pairs, today)
            .into_iter()
            .map(|m| MilestoneJson {
                days: m.days,
                from: format_day(m.window.from_day),
                to: format_day(m.window.to_day),
                total: m.total,
                complete: m.complete,
                completes: format_ms(m.completes_ms),
            })
            .collect(),
    }))
}

/// `tz`: the milestones in the zone's days, summed from the counter's hour
/// buckets over the longest one's hours up to the clock's hour.
async fn local(
    app: &AppState,
    key: CounterKey,
    path: KeyPath,
    days: &[u32],
    publication: Publication,
    z: Zone,
) -> Result<MilestonesJson, ApiError> {
    let now_ms = app.clock.now_ms();
    let longest = days.iter().copied().max().unwrap_or(1);
    let full = z.hours_of_days(milestone::milestone_window(
        z.day_of_ms(publication.at_ms),
        longest,
    ));
    zone::check_kept(&z, full, now_ms, app.time_policy.hourly_retention_days)
        .map_err(ApiError::BadRequest)?;
    z.check_whole_hours(full).map_err(ApiError::BadRequest)?;
    let read = HourRange {
        from_hour: full.from_hour,
        to_hour: full.to_hour.min(hour_of_ms(now_ms)),
    };
    let (pairs, exact) = if read.from_hour > read.to_hour {
        // Published later this hour or ahead of the clock (within the
        // allowed skew): nothing counted yet.
        (Vec::new(), true)
    } else {
        let h =
            app.store.hour_histogram(&key, read).await?.ok_or_else(|| {
                ApiError::NotFound(format!("counter {key} has never been counted"))
            })?;
        let pairs: Vec<(i64, i64)> = h.buckets.iter().map(|b| (b.hour, b.value)).collect();
        (pairs, h.exact)
    };
    Ok(MilestonesJson {
        id: key.doc_id(),
        entity: path.entity,
        action: path.action,
        uuid: path.uuid,
        published: format_ms(publication.at_ms),
        published_source: publication.source.as_str(),
        tz: Some(z.name()),
        exact: Some(exact),
        milestones: milestone::local_milestones(&z, publication.at_ms, days, &pairs, now_ms)
            .into_iter()
            .map(|m| MilestoneJson {
                days: m.days,
                from: format_day(m.window.from_day),
                to: format_day(m.window.to_day),
                total: m.total,
                complete: m.complete,
                completes: format_ms(m.completes_ms),
            })
            .collect(),
    })
}

#[derive(Serialize)]
struct FirstDaysEntryJson {
    id: String,
    uuid: String,
    value: i128,
    #[serde(skip_serializing_if = "Option::is_none")]
    category: Option<String>,
    published: String,
    published_source: &'static str,
    complete: bool,
}

#[derive(Serialize)]
pub(super) struct FirstDaysJson {
    entity: String,
    action: String,
    interval: String,
    days: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    category: Option<String>,
    /// With `tz`: the zone whose days are counted.
    #[serde(skip_serializing_if = "Option::is_none")]
    tz: Option<&'static str>,
    /// With `tz`: only targets whose first local day starts at or after
    /// this instant (the hour buckets kept) are listed.
    #[serde(skip_serializing_if = "Option::is_none")]
    published_since: Option<String>,
    size: usize,
    exact: bool,
    counters: Vec<FirstDaysEntryJson>,
}

/// `GET /v1/top/{entity}/{action}?interval=first_<N>_days`, once
/// `queries::top` has read its parameters.
pub(super) async fn top_first_days(
    app: &AppState,
    entity: String,
    action: String,
    days: u32,
    category: Option<String>,
    size: usize,
) -> Result<FirstDaysJson, ApiError> {
    let oldest_day = day_of(app.time_policy.oldest_accepted(app.clock.now()));
    let query = FirstDaysQuery {
        entity,
        action,
        days,
        category,
        size,
        oldest_day,
    };
    let list = app.store.top_first_days(&query).await?;
    let today = app.clock.today();
    Ok(FirstDaysJson {
        counters: list
            .entries
            .into_iter()
            .map(|e| {
                entry_json(&query.entity, &query.action, e, |p| {
                    milestone::complete(p.day(), days, today)
                })
            })
            .collect(),
        interval: format!("first_{days}_days"),
        entity: query.entity,
        action: query.action,
        days,
        category: query.category,
        tz: None,
        published_since: None,
        size: query.size,
        exact: list.exact,
    })
}

/// One entry of a `first_<N>_days` list: its publication as the rules
/// resolve it, and whether its milestone is complete (`complete`, in UTC
/// or in a zone's days).
fn entry_json(
    entity: &str,
    action: &str,
    e: crate::store::FirstDaysEntry,
    complete: impl Fn(&Publication) -> bool,
) -> FirstDaysEntryJson {
    let p = Publication::resolve(e.published_set.then_some(e.published_ms), e.published_ms);
    FirstDaysEntryJson {
        id: CounterKey {
            entity: entity.into(),
            action: action.into(),
            uuid: e.uuid.as_str().into(),
        }
        .doc_id(),
        complete: complete(&p),
        uuid: e.uuid,
        value: e.value,
        category: e.category,
        published: format_ms(p.at_ms),
        published_source: p.source.as_str(),
    }
}

/// `interval=first_<N>_days&tz=`: the list in the zone's days, from hour
/// buckets, of the targets whose first local day the hourly retention
/// keeps whole (see `LocalFirstDaysQuery`).
pub(super) async fn top_first_days_local(
    app: &AppState,
    entity: String,
    action: String,
    days: u32,
    category: Option<String>,
    size: usize,
    z: Zone,
) -> Result<FirstDaysJson, ApiError> {
    let now_ms = app.clock.now_ms();
    let first_hour = zone::first_kept_hour(now_ms, app.time_policy.hourly_retention_days);
    // Every counter listed has its hours between the retention's first
    // hour and its last first day's end, N local days after today at most.
    z.check_whole_hours(HourRange {
        from_hour: first_hour,
        to_hour: hour_of_ms(now_ms) + i64::from(days) * 24 + 48,
    })
    .map_err(ApiError::BadRequest)?;
    let query = LocalFirstDaysQuery {
        entity,
        action,
        days,
        category,
        size,
        zone: z,
        first_hour,
    };
    let list = app.store.top_first_days_local(&query).await?;
    Ok(FirstDaysJson {
        counters: list
            .entries
            .into_iter()
            .map(|e| {
                entry_json(&query.entity, &query.action, e, |p| {
                    let hours = z.first_days_hours(p.at_ms, days);
                    now_ms >= (hours.to_hour + 1).saturating_mul(HOUR_MS)
                })
            })
            .collect(),
        interval: format!("first_{days}_days"),
        entity: query.entity,
        action: query.action,
        days,
        category: query.category,
        tz: Some(z.name()),
        published_since: Some(format_ms(first_hour.saturating_mul(HOUR_MS))),
        size: query.size,
        exact: list.exact,
    })
}
