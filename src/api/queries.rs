//! Read handlers over time: one counter's histogram and the top lists of
//! counters and averages. Query parameters are parsed here into the store's
//! typed queries; each bad one is a 400 that names it.

use super::access::Reader;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};

use super::extract::{PathParams, QueryParams};
use super::model::KeyPath;
use super::AppState;
use crate::domain::hours::{self, is_hour_interval};
use crate::domain::rank::{self, Rank};
use crate::domain::zone::{self, Zone};
use crate::domain::{
    format_day, format_hour, resolve_window, validate_name, CounterKey, HourRange, Resolved,
    ResolvedHours, Window,
};
use crate::error::ApiError;
use crate::store::{TopAveragesQuery, TopHoursQuery, TopQuery, MAX_TOP_SIZE};

use super::openapi::NotFound;

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub struct PairPath {
    #[param(inline, value_type = crate::api::openapi::Name)]
    entity: String,
    #[param(inline, value_type = crate::api::openapi::Name)]
    action: String,
}

impl PairPath {
    fn validated(self) -> Result<(String, String), ApiError> {
        validate_name("entity", &self.entity).map_err(ApiError::BadRequest)?;
        validate_name("action", &self.action).map_err(ApiError::BadRequest)?;
        Ok((self.entity, self.action))
    }
}

/// Resolves a window against the UTC day of the app's clock.
pub fn window(
    app: &AppState,
    interval: Option<&str>,
    from: Option<&str>,
    to: Option<&str>,
) -> Result<Resolved, ApiError> {
    resolve_window(interval, from, to, app.clock.today()).map_err(ApiError::BadRequest)
}

/// The `tz` parameter: `None` when absent or UTC (answered from day
/// buckets, as without it), else the zone whose days the answer is in.
pub fn zone(raw: Option<&str>) -> Result<Option<Zone>, ApiError> {
    zone::parse_zone(raw).map_err(ApiError::BadRequest)
}

/// The `tz` of an answer kept in day buckets only (averages): UTC or
/// nothing, else a 400 saying why.
pub fn utc_only(raw: Option<&str>) -> Result<(), ApiError> {
    match zone(raw)? {
        None => Ok(()),
        Some(z) => Err(ApiError::BadRequest(format!(
            "tz {}: averages keep no hour buckets, so their windows are UTC days only; drop tz",
            z.name()
        ))),
    }
}

/// The UTC hours of local days `w` (see `domain::zone`), up to the clock's
/// hour; refused when they reach before the hourly retention, when the
/// zone's offset over them is not whole hours, or when none of them has
/// begun (`all` with no local day kept whole: a retention of 0 days in a
/// zone ahead of UTC).
pub fn local_hours(app: &AppState, z: &Zone, w: Window) -> Result<HourRange, ApiError> {
    let now_ms = app.clock.now_ms();
    let kept = app.time_policy.hourly_retention_days;
    let mut r = z.hours_of_days(w);
    zone::check_kept(z, r, now_ms, kept).map_err(ApiError::BadRequest)?;
    z.check_whole_hours(r).map_err(ApiError::BadRequest)?;
    r.to_hour = r.to_hour.min(hours::hour_of_ms(now_ms));
    if r.from_hour > r.to_hour {
        return Err(ApiError::BadRequest(format!(
            "tz: no whole local day of {} is kept as hour buckets yet (--hourly-retention-days is {kept})",
            z.name()
        )));
    }
    Ok(r)
}

/// Local days: `interval`, `from`, `to` in the zone's days; all time
/// (`all`, or nothing given where a window is the default) is the local
/// days the hourly retention keeps whole.
fn local_window(
    app: &AppState,
    z: &Zone,
    interval: Option<&str>,
    from: Option<&str>,
    to: Option<&str>,
) -> Result<Resolved, ApiError> {
    let now_ms = app.clock.now_ms();
    let mut r = z
        .resolve_days(interval, from, to, now_ms)
        .map_err(ApiError::BadRequest)?;
    if r.window.is_none() {
        r.window = Some(z.kept_days(now_ms, app.time_policy.hourly_retention_days));
    }
    Ok(r)
}

/// A positive integer parameter within `1..=max`, or `default` when absent.
pub fn positive(field: &str, raw: Option<&str>, default: i64, max: i64) -> Result<i64, ApiError> {
    let Some(raw) = raw else { return Ok(default) };
    match raw.parse::<i64>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        Ok(n) => Err(ApiError::BadRequest(format!(
            "{field} is {n}; it must be between 1 and {max}"
        ))),
        Err(_) => Err(ApiError::BadRequest(format!(
            "{field} {raw:?} is not an integer"
        ))),
    }
}

fn size(raw: Option<&str>) -> Result<usize, ApiError> {
    positive("size", raw, 10, MAX_TOP_SIZE as i64).map(|n| n as usize)
}

fn category(raw: Option<String>) -> Result<Option<String>, ApiError> {
    if let Some(c) = &raw {
        validate_name("category", c).map_err(ApiError::BadRequest)?;
    }
    Ok(raw)
}

/// The window an answer was computed over, flattened into it.
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = Window)]
pub struct WindowJson {
    #[schema(schema_with = crate::api::openapi::answered_interval)]
    interval: &'static str,
    /// The first day, absent for all time; for hour buckets the first hour.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = crate::api::openapi::day_or_hour)]
    from: Option<String>,
    /// The last day, absent for all time; for hour buckets the last hour.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = crate::api::openapi::day_or_hour)]
    to: Option<String>,
}

impl From<ResolvedHours> for WindowJson {
    fn from(r: ResolvedHours) -> Self {
        WindowJson {
            interval: r.interval,
            from: Some(format_hour(r.hours.from_hour)),
            to: Some(format_hour(r.hours.to_hour)),
        }
    }
}

impl From<Resolved> for WindowJson {
    fn from(r: Resolved) -> Self {
        WindowJson {
            interval: r.interval,
            from: r.window.map(|w| format_day(w.from_day)),
            to: r.window.map(|w| format_day(w.to_day)),
        }
    }
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct HistogramParams {
    #[param(inline, value_type = Option<crate::api::openapi::HistogramInterval>)]
    interval: Option<String>,
    /// `day` (the default): day buckets. `hour`: UTC hour buckets, kept
    /// for `--hourly-retention-days` (14 by default); a range reaching
    /// further back is refused (400), as is one of more than 744 hours.
    /// Without interval or from/to, the last 24 hours.
    #[param(inline, value_type = Option<crate::api::openapi::BucketKind>)]
    bucket: Option<String>,
    #[param(inline, value_type = Option<crate::api::openapi::Day>)]
    from: Option<String>,
    #[param(inline, value_type = Option<crate::api::openapi::Day>)]
    to: Option<String>,
    /// An IANA zone (`Europe/Berlin`): day buckets of that zone's days
    /// (23 or 25 hours on DST changes), each the sum of its hour buckets;
    /// `interval` and `from`/`to` are local days, and without them the
    /// local days the hour buckets keep whole (`all`). Refused (400): an
    /// unknown zone, one whose offset over the range is not whole hours
    /// (Asia/Kolkata), a range reaching before `--hourly-retention-days`,
    /// and `bucket=hour` (hour buckets are UTC hours: give `from`/`to` as
    /// instants with their offset). Absent or `UTC`: UTC days, from day
    /// buckets.
    #[param(inline, value_type = Option<crate::api::openapi::ZoneName>)]
    tz: Option<String>,
}

#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = Bucket)]
pub struct BucketJson {
    /// The UTC day, or with `tz` the local day.
    #[schema(schema_with = crate::api::openapi::day)]
    day: String,
    /// A local day's sum of hours may leave i64, a UTC day's cannot.
    #[schema(schema_with = crate::api::openapi::wide_integer)]
    value: i128,
}

#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = Histogram)]
pub struct HistogramJson {
    id: String,
    entity: String,
    action: String,
    uuid: String,
    #[serde(flatten)]
    window: WindowJson,
    /// Sum of the buckets; `i128` since a sum of `i64` buckets may leave `i64`.
    #[schema(schema_with = crate::api::openapi::wide_integer)]
    total: i128,
    /// With `tz`: the zone whose days the buckets are.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    tz: Option<&'static str>,
    /// With `tz`: `false` when a day of the range moved without an hour to
    /// put it in (see the hour histogram's `exact`).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    exact: Option<bool>,
    buckets: Vec<BucketJson>,
}

#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = HourBucket)]
pub struct HourBucketJson {
    #[schema(schema_with = crate::api::openapi::hour)]
    hour: String,
    value: i64,
}

#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = HourHistogram)]
pub struct HourHistogramJson {
    id: String,
    entity: String,
    action: String,
    uuid: String,
    /// Always `hour`.
    bucket: &'static str,
    #[serde(flatten)]
    window: WindowJson,
    /// Sum of the buckets.
    #[schema(schema_with = crate::api::openapi::wide_integer)]
    total: i128,
    /// `false` when a day of the range moved without an hour to put it in
    /// (a backfilled day, `PUT .../days/{day}`; days before an upgrade to
    /// hour buckets): its hours then do not sum to its day bucket.
    exact: bool,
    buckets: Vec<HourBucketJson>,
}

/// A histogram of day buckets, or of hour buckets with `bucket=hour`.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum HistogramAnswer {
    Day(HistogramJson),
    Hour(HourHistogramJson),
}

/// `GET /v1/counters/{entity}/{action}/{uuid}/histogram`: the counter's day
/// buckets inside a window (default `last_month`; `all` is the retention),
/// or its hour buckets with `bucket=hour`.
#[utoipa::path(get, path = "/v1/counters/{entity}/{action}/{uuid}/histogram",
    summary = "Day (or hour) buckets of a counter and their total inside a window",
    params(KeyPath, HistogramParams), security(("bearer" = ["read"]), ("key" = ["read"])),
    responses((status = 200, description = "Success", body = HistogramAnswer), NotFound))]
pub async fn histogram(
    Reader(app): Reader,
    PathParams(path): PathParams<KeyPath>,
    QueryParams(p): QueryParams<HistogramParams>,
) -> Result<Json<HistogramAnswer>, ApiError> {
    let key = path.key()?;
    let tz = zone(p.tz.as_deref())?;
    match p.bucket.as_deref() {
        None | Some("day") => {}
        Some("hour") if tz.is_some() => {
            return Err(ApiError::BadRequest(
                "tz applies to day buckets; hour buckets are UTC hours, the same instants in every zone: drop tz, or give from/to as instants with their offset (2026-03-29T00:00:00+01:00)".into(),
            ))
        }
        Some("hour") => return hour_histogram(&app, key, path, p).await.map(Json),
        Some(other) => {
            return Err(ApiError::BadRequest(format!(
                "bucket {other:?} is unknown; use day or hour"
            )))
        }
    }
    if is_hour_interval(p.interval.as_deref()) {
        return Err(ApiError::BadRequest(format!(
            "interval {:?} needs hour buckets: add bucket=hour",
            p.interval.as_deref().unwrap_or_default()
        )));
    }
    if let Some(z) = tz {
        return local_histogram(&app, key, path, p, z).await.map(Json);
    }
    let interval = match (&p.interval, &p.from, &p.to) {
        (None, None, None) => Some("last_month"),
        (i, _, _) => i.as_deref(),
    };
    let mut resolved = window(&app, interval, p.from.as_deref(), p.to.as_deref())?;
    let w = *resolved.window.get_or_insert_with(|| {
        let today = app.clock.today();
        Window {
            from_day: today - i64::from(app.time_policy.retention_days),
            to_day: today,
        }
    });
    let buckets = app
        .store
        .histogram(&key, w)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("counter {key} has never been counted")))?;
    Ok(Json(HistogramAnswer::Day(HistogramJson {
        id: key.doc_id(),
        entity: path.entity,
        action: path.action,
        uuid: path.uuid,
        window: resolved.into(),
        total: buckets.iter().map(|b| i128::from(b.value)).sum(),
        tz: None,
        exact: None,
        buckets: buckets
            .into_iter()
            .map(|b| BucketJson {
                day: format_day(b.day),
                value: b.value.into(),
            })
            .collect(),
    })))
}

/// `tz`: the counter's hour buckets over the local days asked, summed per
/// local day (a day without any hour bucket has no bucket, as a UTC day
/// without a day bucket).
async fn local_histogram(
    app: &AppState,
    key: CounterKey,
    path: KeyPath,
    p: HistogramParams,
    z: Zone,
) -> Result<HistogramAnswer, ApiError> {
    let resolved = local_window(
        app,
        &z,
        p.interval.as_deref(),
        p.from.as_deref(),
        p.to.as_deref(),
    )?;
    let w = resolved.window.unwrap_or(Window {
        from_day: 0,
        to_day: -1,
    });
    let range = local_hours(app, &z, w)?;
    let h = app
        .store
        .hour_histogram(&key, range)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("counter {key} has never been counted")))?;
    let mut buckets: Vec<(i64, i128)> = Vec::new();
    for b in h.buckets {
        let day = z.day_of_hour(b.hour);
        match buckets.last_mut() {
            Some((d, v)) if *d == day => *v += i128::from(b.value),
            _ => buckets.push((day, i128::from(b.value))),
        }
    }
    Ok(HistogramAnswer::Day(HistogramJson {
        id: key.doc_id(),
        entity: path.entity,
        action: path.action,
        uuid: path.uuid,
        window: resolved.into(),
        total: buckets.iter().map(|(_, v)| v).sum(),
        tz: Some(z.name()),
        exact: Some(h.exact),
        buckets: buckets
            .into_iter()
            .map(|(day, value)| BucketJson {
                day: format_day(day),
                value,
            })
            .collect(),
    }))
}

/// `bucket=hour`: the range resolved against the clock's hour and kept
/// inside the hourly retention and [`MAX_HOUR_BUCKETS`](crate::domain::hours::MAX_HOUR_BUCKETS).
async fn hour_histogram(
    app: &AppState,
    key: CounterKey,
    path: KeyPath,
    p: HistogramParams,
) -> Result<HistogramAnswer, ApiError> {
    let now_ms = app.clock.now_ms();
    let days = app.time_policy.hourly_retention_days;
    let resolved = hours::resolve_hours(
        p.interval.as_deref(),
        p.from.as_deref(),
        p.to.as_deref(),
        now_ms,
        days,
    )
    .and_then(|r| hours::check_retained(&r, now_ms, days).map(|()| r))
    .map_err(ApiError::BadRequest)?;
    let h = app
        .store
        .hour_histogram(&key, resolved.hours)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("counter {key} has never been counted")))?;
    Ok(HistogramAnswer::Hour(HourHistogramJson {
        id: key.doc_id(),
        entity: path.entity,
        action: path.action,
        uuid: path.uuid,
        bucket: "hour",
        window: resolved.into(),
        total: h.buckets.iter().map(|b| i128::from(b.value)).sum(),
        exact: h.exact,
        buckets: h
            .buckets
            .into_iter()
            .map(|b| HourBucketJson {
                hour: format_hour(b.hour),
                value: b.value,
            })
            .collect(),
    }))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct TopParams {
    #[param(inline, value_type = Option<crate::api::openapi::TopInterval>)]
    interval: Option<String>,
    #[param(inline, value_type = Option<crate::api::openapi::Day>)]
    from: Option<String>,
    #[param(inline, value_type = Option<crate::api::openapi::Day>)]
    to: Option<String>,
    #[param(inline, value_type = Option<crate::api::openapi::Name>)]
    category: Option<String>,
    #[param(inline, value_type = Option<crate::api::openapi::Size>)]
    size: Option<String>,
    /// An IANA zone (`Europe/Berlin`): a window of that zone's days
    /// (`last_week`: the last 7 local days; `from`/`to`: local dates),
    /// summed from hour buckets. All time (`all`, the default) is the same
    /// in every zone, and so are `last_hour` and `last_24_hours` (UTC hour
    /// buckets, whole instants). Refused (400): an unknown zone, one whose
    /// offset over the window is not whole hours, a window reaching before
    /// `--hourly-retention-days`. With `first_<N>_days`: each target's
    /// first N local days from the local day of its publication, listing
    /// only targets whose first local day the hour buckets keep (answered
    /// as `published_since`).
    #[param(inline, value_type = Option<crate::api::openapi::ZoneName>)]
    tz: Option<String>,
}

#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = TopEntry)]
pub struct TopEntryJson {
    id: String,
    uuid: String,
    /// A window's sum may leave i64; serde_json writes every digit.
    #[schema(schema_with = crate::api::openapi::wide_integer)]
    value: i128,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    category: Option<String>,
}

#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = Top)]
pub struct TopJson {
    entity: String,
    action: String,
    #[serde(flatten)]
    window: WindowJson,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    category: Option<String>,
    /// With `tz`: the zone whose days the window is.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    tz: Option<&'static str>,
    size: usize,
    /// Whether the list is exact rather than approximated from partial sums.
    exact: bool,
    counters: Vec<TopEntryJson>,
}

fn entries(entity: &str, action: &str, list: Vec<crate::store::TopEntry>) -> Vec<TopEntryJson> {
    list.into_iter()
        .map(|e| TopEntryJson {
            id: doc_id(entity, action, &e.uuid),
            uuid: e.uuid,
            value: e.value,
            category: e.category,
        })
        .collect()
}

fn doc_id(entity: &str, action: &str, uuid: &str) -> String {
    CounterKey {
        entity: entity.into(),
        action: action.into(),
        uuid: uuid.into(),
    }
    .doc_id()
}

/// `GET /v1/top/{entity}/{action}`: the highest counters, all time or
/// summed over a window; ties by uuid ascending.
#[utoipa::path(get, path = "/v1/top/{entity}/{action}",
    summary = "The highest counters, all time or inside a window",
    params(PairPath, TopParams), security(("bearer" = ["read"]), ("key" = ["read"])),
    responses((status = 200, description = "Success", body = TopJson)))]
pub async fn top(
    Reader(app): Reader,
    PathParams(path): PathParams<PairPath>,
    QueryParams(p): QueryParams<TopParams>,
) -> Result<Response, ApiError> {
    let (entity, action) = path.validated()?;
    let tz = zone(p.tz.as_deref())?;
    let first_days = p.interval.as_deref().and_then(|i| {
        crate::domain::milestone::parse_first_days(i, app.time_policy.retention_days)
    });
    if let Some(days) = first_days {
        let days = days.map_err(ApiError::BadRequest)?;
        if p.from.is_some() || p.to.is_some() {
            return Err(ApiError::BadRequest(format!(
                "interval first_{days}_days cannot be combined with from/to; give one or the other"
            )));
        }
        let (category, size) = (category(p.category)?, size(p.size.as_deref())?);
        if let Some(z) = tz {
            let list = super::milestones::top_first_days_local(
                &app, entity, action, days, category, size, z,
            )
            .await?;
            return Ok(Json(list).into_response());
        }
        let list =
            super::milestones::top_first_days(&app, entity, action, days, category, size).await?;
        return Ok(Json(list).into_response());
    }
    if let Some(resolved) = p
        .interval
        .as_deref()
        .and_then(|i| hours::named_hours(i, app.clock.now_ms()))
    {
        if p.from.is_some() || p.to.is_some() {
            return Err(ApiError::BadRequest(format!(
                "interval {} cannot be combined with from/to; give one or the other",
                resolved.interval
            )));
        }
        let query = TopHoursQuery {
            entity,
            action,
            hours: resolved.hours,
            category: category(p.category)?,
            size: size(p.size.as_deref())?,
        };
        let list = app.store.top_hours(&query).await?;
        return Ok(Json(TopJson {
            counters: entries(&query.entity, &query.action, list.entries),
            entity: query.entity,
            action: query.action,
            window: resolved.into(),
            category: query.category,
            tz: None,
            size: query.size,
            exact: list.exact,
        })
        .into_response());
    }
    if let Some(z) = tz {
        return local_top(&app, entity, action, p, z)
            .await
            .map(|t| Json(t).into_response());
    }
    let resolved = window(
        &app,
        p.interval.as_deref(),
        p.from.as_deref(),
        p.to.as_deref(),
    )?;
    let query = TopQuery {
        entity,
        action,
        window: resolved.window,
        category: category(p.category)?,
        size: size(p.size.as_deref())?,
    };
    let list = app.store.top(&query).await?;
    Ok(Json(TopJson {
        counters: entries(&query.entity, &query.action, list.entries),
        entity: query.entity,
        action: query.action,
        window: resolved.into(),
        category: query.category,
        tz: None,
        size: query.size,
        exact: list.exact,
    })
    .into_response())
}

/// `tz` with a day window: the window's local days as a range of UTC
/// hours, listed as `last_24_hours` is (`Store::top_hours`). All time is
/// the all-time list, whatever the zone.
async fn local_top(
    app: &AppState,
    entity: String,
    action: String,
    p: TopParams,
    z: Zone,
) -> Result<TopJson, ApiError> {
    let resolved = z
        .resolve_days(
            p.interval.as_deref(),
            p.from.as_deref(),
            p.to.as_deref(),
            app.clock.now_ms(),
        )
        .map_err(ApiError::BadRequest)?;
    let (category, size) = (category(p.category)?, size(p.size.as_deref())?);
    let list = match resolved.window {
        None => {
            let query = TopQuery {
                entity: entity.clone(),
                action: action.clone(),
                window: None,
                category: category.clone(),
                size,
            };
            app.store.top(&query).await?
        }
        Some(w) => {
            let query = TopHoursQuery {
                entity: entity.clone(),
                action: action.clone(),
                hours: local_hours(app, &z, w)?,
                category: category.clone(),
                size,
            };
            app.store.top_hours(&query).await?
        }
    };
    Ok(TopJson {
        counters: entries(&entity, &action, list.entries),
        entity,
        action,
        window: resolved.into(),
        category,
        tz: Some(z.name()),
        size,
        exact: list.exact,
    })
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct TopAveragesParams {
    #[param(inline, value_type = Option<crate::api::openapi::Interval>)]
    interval: Option<String>,
    #[param(inline, value_type = Option<crate::api::openapi::Day>)]
    from: Option<String>,
    #[param(inline, value_type = Option<crate::api::openapi::Day>)]
    to: Option<String>,
    #[param(inline, value_type = Option<crate::api::openapi::Name>)]
    category: Option<String>,
    #[param(inline, value_type = Option<crate::api::openapi::Size>)]
    size: Option<String>,
    #[param(inline, value_type = Option<crate::api::openapi::Positive>)]
    min_quantity: Option<String>,
    /// How the list is ordered: `none` (the default) by average; `bayesian`
    /// by the weighted rating `v/(v+m)·R + m/(v+m)·C` (`v` a target's
    /// quantity, `R` its average, `m` the `prior_weight`, `C` the mean of
    /// the averages the list considers, answered as `prior_mean`);
    /// `wilson` by the lower bound of the Wilson interval at `z` for the
    /// average rescaled to 0..1 by `scale`, over `v` samples. Ties of a
    /// score: quantity descending, then uuid.
    #[param(inline, value_type = Option<RankName>)]
    rank: Option<String>,
    /// `rank=bayesian` only: `m`, the weight of the prior mean, as that many
    /// samples of it (`0 <= m <= 1e12`); default `min_quantity`.
    #[param(value_type = Option<f64>, minimum = 0, maximum = 1e12)]
    prior_weight: Option<String>,
    /// `rank=wilson` only, and required there: the rating scale `lo..hi`,
    /// two integers with `lo < hi` (`1..5` for five stars).
    #[param(value_type = Option<String>, pattern = "^-?[0-9]+\\.\\.-?[0-9]+$", example = "1..5")]
    scale: Option<String>,
    /// `rank=wilson` only: the normal quantile of the interval
    /// (`0 < z <= 10`); default 1.96, a 95 % interval.
    #[param(value_type = Option<f64>, exclusive_minimum = 0, maximum = 10)]
    z: Option<String>,
    /// Refused (400) unless absent or `UTC`: averages keep no hour
    /// buckets, so their windows are UTC days.
    #[param(inline, value_type = Option<crate::api::openapi::ZoneName>)]
    tz: Option<String>,
}

/// The values of the `rank` parameter.
#[derive(utoipa::ToSchema)]
#[schema(as = Rank)]
#[allow(dead_code)]
#[schema(rename_all = "lowercase")]
enum RankName {
    None,
    Bayesian,
    Wilson,
}

impl TopAveragesParams {
    /// The rank asked for, its parameters checked; a parameter of another
    /// rank is refused rather than ignored, so a typo surfaces.
    fn rank(&self, min_quantity: i64) -> Result<Rank, ApiError> {
        let bad = |m: String| ApiError::BadRequest(m);
        let only = |field: &str, rank: &str| {
            bad(format!(
                "{field} is a parameter of rank={rank} only; this request ranks by {}",
                self.rank.as_deref().unwrap_or("none")
            ))
        };
        let name = self.rank.as_deref().unwrap_or("none");
        if name != "bayesian" && self.prior_weight.is_some() {
            return Err(only("prior_weight", "bayesian"));
        }
        if name != "wilson" {
            if self.scale.is_some() {
                return Err(only("scale", "wilson"));
            }
            if self.z.is_some() {
                return Err(only("z", "wilson"));
            }
        }
        match name {
            "none" => Ok(Rank::Average),
            "bayesian" => {
                let prior_weight = match self.prior_weight.as_deref() {
                    Some(m) => rank::parse_prior_weight(m).map_err(bad)?,
                    None => min_quantity as f64,
                };
                Ok(Rank::Bayesian { prior_weight })
            }
            "wilson" => {
                let scale = self.scale.as_deref().ok_or_else(|| {
                    bad("scale: rank=wilson needs the rating scale, e.g. scale=1..5".into())
                })?;
                let (lo, hi) = rank::parse_scale(scale).map_err(bad)?;
                let z = match self.z.as_deref() {
                    Some(z) => rank::parse_z(z).map_err(bad)?,
                    None => rank::DEFAULT_Z,
                };
                Ok(Rank::Wilson { lo, hi, z })
            }
            other => Err(bad(format!(
                "rank {other:?} is not one of none, bayesian, wilson"
            ))),
        }
    }
}

#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = AverageEntry)]
pub struct AverageEntryJson {
    id: String,
    uuid: String,
    #[schema(schema_with = crate::api::openapi::wide_integer)]
    sum: i128,
    #[schema(schema_with = crate::api::openapi::wide_integer)]
    quantity: i128,
    /// `sum / quantity`; `null` without samples.
    #[schema(required = true)]
    average: Option<f64>,
    /// The score of `rank` (absent without one): the Bayesian weighted
    /// rating, on the scale of the averages, or the Wilson lower bound, in
    /// `0..1`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    score: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    category: Option<String>,
}

#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = TopAverages)]
pub struct TopAveragesJson {
    entity: String,
    action: String,
    #[serde(flatten)]
    window: WindowJson,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    category: Option<String>,
    min_quantity: i64,
    size: usize,
    /// The rank asked for (`bayesian`, `wilson`); absent by average.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<RankName>, nullable = false)]
    rank: Option<&'static str>,
    /// `rank=bayesian`: `m`, the prior's weight.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    prior_weight: Option<f64>,
    /// `rank=bayesian`: `C`, the mean of the averages the list considers
    /// (every target of the pair, window and category with at least
    /// `min_quantity` samples, not only those listed); `null` when there is
    /// none.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<f64>)]
    prior_mean: Option<Option<f64>>,
    /// `rank=wilson`: the rating scale, `lo..hi`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, example = "1..5")]
    scale: Option<String>,
    /// `rank=wilson`: the normal quantile of the interval.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    z: Option<f64>,
    exact: bool,
    averages: Vec<AverageEntryJson>,
}

/// `sum / quantity`, undefined without samples.
pub fn mean(sum: i128, quantity: i128) -> Option<f64> {
    (quantity != 0).then(|| sum as f64 / quantity as f64)
}

/// `GET /v1/top-averages/{entity}/{action}`: the highest averages among those
/// with at least `min_quantity` samples (default 1); ties by quantity
/// descending, then uuid ascending. With `rank`, the highest scores of a
/// confidence-adjusted rank instead (`bayesian`, `wilson`), so one 5-star
/// rating no longer tops 400 averaging 4.8.
#[utoipa::path(get, path = "/v1/top-averages/{entity}/{action}",
    summary = "The highest averages, or the best by a confidence-adjusted rank",
    params(PairPath, TopAveragesParams), security(("bearer" = ["read"]), ("key" = ["read"])),
    responses((status = 200, description = "Success", body = TopAveragesJson)))]
pub async fn top_averages(
    Reader(app): Reader,
    PathParams(path): PathParams<PairPath>,
    QueryParams(p): QueryParams<TopAveragesParams>,
) -> Result<Json<TopAveragesJson>, ApiError> {
    let (entity, action) = path.validated()?;
    utc_only(p.tz.as_deref())?;
    let resolved = window(
        &app,
        p.interval.as_deref(),
        p.from.as_deref(),
        p.to.as_deref(),
    )?;
    let min_quantity = positive("min_quantity", p.min_quantity.as_deref(), 1, i64::MAX)?;
    let rank = p.rank(min_quantity)?;
    let query = TopAveragesQuery {
        entity,
        action,
        window: resolved.window,
        category: category(p.category)?,
        min_quantity,
        size: size(p.size.as_deref())?,
        rank,
    };
    let list = app.store.top_averages(&query).await?;
    if let (Some(out), Rank::Wilson { lo, hi, .. }) = (&list.out_of_scale, rank) {
        return Err(ApiError::BadRequest(format!(
            "scale: the average {} of {:?} lies outside {lo}..{hi}; give the scale its ratings are on",
            out.average, out.uuid
        )));
    }
    let (prior_weight, prior_mean, scale, z) = match rank {
        Rank::Average => (None, None, None, None),
        Rank::Bayesian { prior_weight } => (Some(prior_weight), Some(list.prior_mean), None, None),
        Rank::Wilson { lo, hi, z } => (None, None, Some(format!("{lo}..{hi}")), Some(z)),
    };
    Ok(Json(TopAveragesJson {
        rank: (rank != Rank::Average).then(|| rank.name()),
        prior_weight,
        prior_mean,
        scale,
        z,
        averages: list
            .entries
            .into_iter()
            .map(|e| AverageEntryJson {
                id: doc_id(&query.entity, &query.action, &e.uuid),
                uuid: e.uuid,
                sum: e.sum,
                quantity: e.quantity,
                average: mean(e.sum, e.quantity),
                score: e.score,
                category: e.category,
            })
            .collect(),
        entity: query.entity,
        action: query.action,
        window: resolved.into(),
        category: query.category,
        min_quantity: query.min_quantity,
        size: query.size,
        exact: list.exact,
    }))
}
