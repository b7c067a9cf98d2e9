//! `GET /v1/trending/{entity}/{action}`: the counters of a pair by a
//! time-decayed score. The rules (the score, which buckets, the half-life's
//! bounds) are `domain::trending`'s; each store sums with them
//! (`Store::trending`). Like the other top lists: a `read` key, no
//! `Cache-Control` of its own (a list moves with every count).

use axum::Json;
use serde::{Deserialize, Serialize};

use super::access::Reader;
use super::extract::{PathParams, QueryParams};
use crate::domain::trending::{self, DEFAULT_HALF_LIFE_MS};
use crate::domain::{format_ms, validate_name, CounterKey};
use crate::error::ApiError;
use crate::store::{TrendingQuery, MAX_TOP_SIZE};

/// Significant digits a score is written with: enough for any order a
/// reader can tell apart, few enough that the two stores (which sum the
/// same doubles in another order) write the same digits.
pub const SCORE_DIGITS: usize = 9;

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub struct TrendingPath {
    #[param(inline, value_type = crate::api::openapi::Name)]
    entity: String,
    #[param(inline, value_type = crate::api::openapi::Name)]
    action: String,
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct TrendingParams {
    /// How long a count takes to weigh half: a duration from `1h` to
    /// `365d` (`90m`, `36h`, `7d`); default `24h`.
    #[param(value_type = Option<String>, example = "24h")]
    half_life: Option<String>,
    #[param(inline, value_type = Option<crate::api::openapi::Name>)]
    category: Option<String>,
    #[param(inline, value_type = Option<crate::api::openapi::Size>)]
    size: Option<String>,
}

#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = TrendingEntry)]
pub struct TrendingEntryJson {
    id: String,
    uuid: String,
    /// Σ count · 2^(-age / half_life) over the counter's buckets, `age`
    /// from each bucket's end to `now` (0 for a bucket not yet ended);
    /// rounded to 9 significant digits. The list is ordered by the score
    /// before rounding.
    score: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    category: Option<String>,
}

#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = Trending)]
pub struct TrendingJson {
    entity: String,
    action: String,
    /// The half-life as asked (`24h` by default).
    half_life: String,
    /// The same in seconds.
    half_life_seconds: i64,
    /// The instant the scores are computed for: the gateway's clock when
    /// the request came.
    #[schema(schema_with = crate::api::openapi::timestamp)]
    now: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    category: Option<String>,
    size: usize,
    /// Whether every score holds every count of its buckets: `false` when
    /// a day read from hour buckets moved without an hour to put it in (a
    /// backfilled day), or when the engine's aggregation may have missed
    /// a candidate (see the stores' README).
    exact: bool,
    counters: Vec<TrendingEntryJson>,
}

/// `x` to [`SCORE_DIGITS`] significant digits.
pub fn round_score(x: f64) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    format!("{:.*e}", SCORE_DIGITS - 1, x).parse().unwrap_or(x)
}

/// `GET /v1/trending/{entity}/{action}`: the counters whose counts are the
/// most recent and many, each count weighing half per half-life of age.
#[utoipa::path(get, path = "/v1/trending/{entity}/{action}",
    summary = "The counters of a pair by a time-decayed score: each count weighs 2^(-age/half_life)",
    params(TrendingPath, TrendingParams), security(("bearer" = ["read"]), ("key" = ["read"])),
    responses((status = 200, description = "Success", body = TrendingJson)))]
pub async fn get(
    Reader(app): Reader,
    PathParams(path): PathParams<TrendingPath>,
    QueryParams(p): QueryParams<TrendingParams>,
) -> Result<Json<TrendingJson>, ApiError> {
    validate_name("entity", &path.entity).map_err(ApiError::BadRequest)?;
    validate_name("action", &path.action).map_err(ApiError::BadRequest)?;
    let (half_life, half_life_ms) = match p.half_life {
        Some(raw) => {
            let ms = trending::parse_half_life(&raw).map_err(ApiError::BadRequest)?;
            (raw.trim().to_string(), ms)
        }
        None => ("24h".to_string(), DEFAULT_HALF_LIFE_MS),
    };
    if let Some(c) = &p.category {
        validate_name("category", c).map_err(ApiError::BadRequest)?;
    }
    let size = super::queries::positive("size", p.size.as_deref(), 10, MAX_TOP_SIZE as i64)?;
    let now_ms = app.clock.now_ms();
    let policy = &app.time_policy;
    // Both retentions keep `today - N` through today: N + 1 days.
    let plan = trending::plan(
        now_ms,
        half_life_ms,
        policy.hourly_retention_days.saturating_add(1),
        policy.retention_days.saturating_add(1),
    );
    let query = TrendingQuery {
        entity: path.entity,
        action: path.action,
        category: p.category,
        size: size as usize,
        now_ms,
        half_life_ms,
        plan,
    };
    let list = app.store.trending(&query).await?;
    let counters = list
        .entries
        .into_iter()
        .map(|e| TrendingEntryJson {
            id: CounterKey {
                entity: query.entity.as_str().into(),
                action: query.action.as_str().into(),
                uuid: e.uuid.as_str().into(),
            }
            .doc_id(),
            uuid: e.uuid,
            score: round_score(e.score),
            category: e.category,
        })
        .collect();
    Ok(Json(TrendingJson {
        entity: query.entity,
        action: query.action,
        half_life,
        half_life_seconds: half_life_ms / 1000,
        now: format_ms(now_ms),
        category: query.category,
        size: query.size,
        exact: list.exact,
        counters,
    }))
}

#[cfg(test)]
mod tests {
    use super::round_score;

    #[test]
    fn scores_are_written_to_nine_significant_digits() {
        assert_eq!(round_score(9.0), 9.0);
        assert_eq!(round_score(0.1 + 0.2), 0.3);
        assert_eq!(round_score(1234.567891234), 1234.56789);
        assert_eq!(round_score(4.3158372877e-5), 4.31583729e-5);
        assert_eq!(round_score(0.0), 0.0);
        assert_eq!(round_score(-2.5), -2.5);
    }
}
