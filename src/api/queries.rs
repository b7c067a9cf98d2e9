//! Read handlers over time: one counter's histogram and the top lists of
//! counters and averages. Query parameters are parsed here into the store's
//! typed queries; each bad one is a 400 that names it.

use super::access::Reader;
use axum::Json;
use serde::{Deserialize, Serialize};

use super::extract::{PathParams, QueryParams};
use super::model::KeyPath;
use super::AppState;
use crate::domain::{format_day, resolve_window, validate_name, CounterKey, Resolved, Window};
use crate::error::ApiError;
use crate::store::{TopAveragesQuery, TopQuery, MAX_TOP_SIZE};

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
    /// The first day, absent for all time.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = crate::api::openapi::day)]
    from: Option<String>,
    /// The last day, absent for all time.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = crate::api::openapi::day)]
    to: Option<String>,
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
    #[param(inline, value_type = Option<crate::api::openapi::Interval>)]
    interval: Option<String>,
    #[param(inline, value_type = Option<crate::api::openapi::Day>)]
    from: Option<String>,
    #[param(inline, value_type = Option<crate::api::openapi::Day>)]
    to: Option<String>,
}

#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = Bucket)]
pub struct BucketJson {
    #[schema(schema_with = crate::api::openapi::day)]
    day: String,
    value: i64,
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
    buckets: Vec<BucketJson>,
}

/// `GET /v1/counters/{entity}/{action}/{uuid}/histogram`: the counter's day
/// buckets inside a window (default `last_month`; `all` is the retention).
#[utoipa::path(get, path = "/v1/counters/{entity}/{action}/{uuid}/histogram",
    summary = "Day buckets of a counter and their total inside a window",
    params(KeyPath, HistogramParams), security(("bearer" = ["read"]), ("key" = ["read"])),
    responses((status = 200, description = "Success", body = HistogramJson), NotFound))]
pub async fn histogram(
    Reader(app): Reader,
    PathParams(path): PathParams<KeyPath>,
    QueryParams(p): QueryParams<HistogramParams>,
) -> Result<Json<HistogramJson>, ApiError> {
    let key = path.key()?;
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
    Ok(Json(HistogramJson {
        id: key.doc_id(),
        entity: path.entity,
        action: path.action,
        uuid: path.uuid,
        window: resolved.into(),
        total: buckets.iter().map(|b| i128::from(b.value)).sum(),
        buckets: buckets
            .into_iter()
            .map(|b| BucketJson {
                day: format_day(b.day),
                value: b.value,
            })
            .collect(),
    }))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct TopParams {
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
    size: usize,
    /// Whether the list is exact rather than approximated from partial sums.
    exact: bool,
    counters: Vec<TopEntryJson>,
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
) -> Result<Json<TopJson>, ApiError> {
    let (entity, action) = path.validated()?;
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
        counters: list
            .entries
            .into_iter()
            .map(|e| TopEntryJson {
                id: doc_id(&query.entity, &query.action, &e.uuid),
                uuid: e.uuid,
                value: e.value,
                category: e.category,
            })
            .collect(),
        entity: query.entity,
        action: query.action,
        window: resolved.into(),
        category: query.category,
        size: query.size,
        exact: list.exact,
    }))
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
    exact: bool,
    averages: Vec<AverageEntryJson>,
}

/// `sum / quantity`, undefined without samples.
pub fn mean(sum: i128, quantity: i128) -> Option<f64> {
    (quantity != 0).then(|| sum as f64 / quantity as f64)
}

/// `GET /v1/top-averages/{entity}/{action}`: the highest averages among those
/// with at least `min_quantity` samples (default 1); ties by quantity
/// descending, then uuid ascending.
#[utoipa::path(get, path = "/v1/top-averages/{entity}/{action}",
    summary = "The highest averages",
    params(PairPath, TopAveragesParams), security(("bearer" = ["read"]), ("key" = ["read"])),
    responses((status = 200, description = "Success", body = TopAveragesJson)))]
pub async fn top_averages(
    Reader(app): Reader,
    PathParams(path): PathParams<PairPath>,
    QueryParams(p): QueryParams<TopAveragesParams>,
) -> Result<Json<TopAveragesJson>, ApiError> {
    let (entity, action) = path.validated()?;
    let resolved = window(
        &app,
        p.interval.as_deref(),
        p.from.as_deref(),
        p.to.as_deref(),
    )?;
    let query = TopAveragesQuery {
        entity,
        action,
        window: resolved.window,
        category: category(p.category)?,
        min_quantity: positive("min_quantity", p.min_quantity.as_deref(), 1, i64::MAX)?,
        size: size(p.size.as_deref())?,
    };
    let list = app.store.top_averages(&query).await?;
    Ok(Json(TopAveragesJson {
        averages: list
            .entries
            .into_iter()
            .map(|e| AverageEntryJson {
                id: doc_id(&query.entity, &query.action, &e.uuid),
                uuid: e.uuid,
                sum: e.sum,
                quantity: e.quantity,
                average: mean(e.sum, e.quantity),
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
