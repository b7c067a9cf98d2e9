//! Trending lists on Elasticsearch (see `crate::domain::trending` and
//! [`TrendingQuery`]): one `terms` aggregation on uuid over the plan's day
//! documents and hour documents, ordered by a `sum` whose inline script
//! weighs each document's count by its bucket's end, as a windowed list
//! sums its buckets (`query::top_window_query`), with the same exactness:
//! a list over several monthly indices (the usual case: hours and days)
//! is read by the threshold walk of `walk.rs`.
//!
//! Which documents: an hour document (in a `..._hour_counters-*` index)
//! whose hour lies in `plan.hours`, or a day document (any other index of
//! the path) whose day lies in `plan.days`; the `_index` prefix tells the
//! two apart, since both keep their bucket's start in `day`. The plan puts
//! every hour read at or after `boundary` (the first day read from hours)
//! and every day before it, so the script knows a document's bucket length
//! from its start alone.
//!
//! The script's source never changes (the instant, the half-life and the
//! boundary are `params`), so a node compiles it once and caches it; it
//! uses only what Painless allows on Elasticsearch 7.10 and OpenSearch 2
//! and 3: `toInstant()` on the date (a Joda-compatible date on the older
//! engines, a `ZonedDateTime` on OpenSearch 3), `Math.pow`, widening
//! through `Number`. Weights agree with `domain::trending::weight` to the
//! last bits of a double (`Math.pow` against `exp2`); the API writes 9
//! significant digits.

use serde_json::{json, Value};

use super::query::{self, CategoryFilter};
use super::walk;
use super::ElasticsearchStore;
use crate::domain::{CounterKey, Window};
use crate::store::{StoreError, TrendingEntry, TrendingList, TrendingQuery};

const HOUR_MS: i64 = 3_600_000;
const DAY_MS: i64 = 86_400_000;

/// The weight of one bucket document, as `domain::trending::weight`.
pub const SCORE_SCRIPT: &str = "if (doc['value'].size() == 0 || doc['day'].size() == 0) { return 0.0; } \
long start = doc['day'].value.toInstant().toEpochMilli(); \
long boundary = ((Number) params.boundary).longValue(); \
long end = start + (start < boundary ? 86400000L : 3600000L); \
long age = ((Number) params.now).longValue() - end; \
if (age < 0L) { age = 0L; } \
return doc['value'].value * Math.pow(2.0, -((double) age) / ((Number) params.half_life).doubleValue());";

/// The indices a trending list searches, and whether a counter's
/// documents all lie in one of them (one month of one kind: routing then
/// makes each shard's sums complete, as for a windowed list).
pub fn indices(names: &super::request::IndexNames, q: &TrendingQuery) -> (String, bool) {
    let mut paths = Vec::new();
    let mut months = 0;
    if !q.plan.days.is_empty() {
        let w = names.window_buckets(
            Window {
                from_day: q.plan.days.start,
                to_day: q.plan.days.end - 1,
            },
            false,
        );
        months += w.months;
        paths.push(w.path);
    }
    if let Some(range) = q.hour_range() {
        let w = names.hour_window(range);
        months += w.months;
        paths.push(w.path);
    }
    (paths.join(","), months == 1)
}

/// The search: the pair (and category) filtered, then hour documents of
/// the plan's hours or day documents of its days, scored per uuid.
pub fn trending_query(
    q: &TrendingQuery,
    hour_prefix: &str,
    cat: &CategoryFilter,
    one_index: bool,
) -> Value {
    trending_terms(
        q,
        hour_prefix,
        cat,
        query::one_search_terms(q.size, one_index),
        None,
    )
}

/// [`trending_query`] asking `terms` terms, of the uuids `only` when given
/// (a step of a walk, `walk.rs`).
pub fn trending_terms(
    q: &TrendingQuery,
    hour_prefix: &str,
    cat: &CategoryFilter,
    size: usize,
    only: Option<&[String]>,
) -> Value {
    let mut filters = vec![
        json!({"term": {"entity": q.entity}}),
        json!({"term": {"action": q.action}}),
    ];
    match cat {
        CategoryFilter::None => {}
        CategoryFilter::Uuids(u) => filters.push(json!({"terms": {"uuid": u}})),
        CategoryFilter::BucketCategory(c) => filters.push(json!({"term": {"category": c}})),
    }
    if let Some(uuids) = only {
        filters.push(json!({"terms": {"uuid": uuids}}));
    }
    let in_hours = json!({"prefix": {"_index": hour_prefix}});
    let range = |from: i64, to: i64| json!({"range": {"day": {"gte": from, "lte": to, "format": "epoch_millis"}}});
    let mut should = Vec::new();
    if !q.plan.hours.is_empty() {
        should.push(json!({"bool": {"filter": [
            in_hours.clone(),
            range(q.plan.hours.start * HOUR_MS, (q.plan.hours.end - 1) * HOUR_MS)
        ]}}));
    }
    if !q.plan.days.is_empty() {
        should.push(json!({"bool": {
            "filter": [range(q.plan.days.start * DAY_MS, (q.plan.days.end - 1) * DAY_MS)],
            "must_not": [in_hours]
        }}));
    }
    json!({
        "size": 0,
        "track_total_hits": false,
        "query": {"bool": {"filter": filters, "should": should, "minimum_should_match": 1}},
        "aggs": {"top": {
            "terms": {
                "field": "uuid",
                "size": size,
                "shard_size": size,
                "order": [{"total": "desc"}, {"_key": "asc"}]
            },
            "aggs": {"total": {"sum": {"script": {
                "lang": "painless",
                "source": SCORE_SCRIPT,
                "params": {
                    "now": q.now_ms,
                    "half_life": q.half_life_ms,
                    "boundary": q.plan.days.end * DAY_MS
                }
            }}}}
        }}
    })
}

/// `(uuid, score)` of each term, and `sum_other_doc_count`. A search that
/// matched no index answers no aggregation (see `query`): an empty list.
pub fn scores_from_aggs(body: &Value) -> Result<(Vec<(String, f64)>, u64), String> {
    let Some(agg) = body.pointer("/aggregations/top") else {
        if body.pointer("/_shards/total").and_then(Value::as_u64) == Some(0) {
            return Ok((Vec::new(), 0));
        }
        return Err("the answer has no aggregations.top".into());
    };
    let buckets = agg
        .get("buckets")
        .and_then(Value::as_array)
        .ok_or("aggregations.top has no buckets")?;
    let entries = buckets
        .iter()
        .map(|b| {
            let uuid = b
                .get("key")
                .and_then(Value::as_str)
                .ok_or("a term has no key")?;
            let score = b
                .pointer("/total/value")
                .and_then(Value::as_f64)
                .ok_or("a term has no total.value")?;
            Ok((uuid.to_string(), score))
        })
        .collect::<Result<Vec<_>, String>>()?;
    let other = agg
        .get("sum_other_doc_count")
        .and_then(Value::as_u64)
        .ok_or("aggregations.top has no sum_other_doc_count")?;
    Ok((entries, other))
}

impl ElasticsearchStore {
    /// A trending list; not exact, as a `last_24_hours` list, when a
    /// listed counter had a day of the hours read set by a backfill (its
    /// `set_days`), or when the candidates may be incomplete.
    pub(super) async fn read_trending(
        &self,
        q: &TrendingQuery,
    ) -> Result<TrendingList, StoreError> {
        let counters = self.config.names.counters();
        let cat = self
            .category_filter(&counters, &q.entity, &q.action, q.category.as_deref())
            .await?;
        if cat == CategoryFilter::Uuids(Vec::new())
            || (q.plan.days.is_empty() && q.plan.hours.is_empty())
        {
            return Ok(TrendingList {
                entries: Vec::new(),
                exact: true,
            });
        }
        let (path, one_index) = indices(&self.config.names, q);
        let hours = self.config.names.hours_pattern();
        let hour_prefix = hours.trim_end_matches('*');
        let (scored, complete) = match walk::walkable(&path).filter(|_| !one_index) {
            // Several monthly indices (days' and hours'): the walk.
            Some(parts) => {
                let walked = self
                    .walk_indices(
                        &parts,
                        q.size,
                        |terms, only| trending_terms(q, hour_prefix, &cat, terms, only),
                        |answer| {
                            let (entries, other) = scores_from_aggs(answer)?;
                            Ok(walk::Terms { entries, other })
                        },
                    )
                    .await?;
                (walked.entries, walked.exact)
            }
            None => {
                let answer = self
                    .search(
                        &format!("/{path}/_search"),
                        &[],
                        &trending_query(q, hour_prefix, &cat, one_index),
                    )
                    .await?;
                let (scored, other) = scores_from_aggs(&answer).map_err(StoreError::Internal)?;
                (scored, one_index || other == 0)
            }
        };
        let mut exact = complete && !matches!(cat, CategoryFilter::BucketCategory(_));
        let picked: Vec<&(String, f64)> = scored.iter().take(q.size).collect();
        let ids: Vec<String> = picked
            .iter()
            .filter_map(|(u, _)| CounterKey::new(&q.entity, &q.action, u).ok())
            .map(|k| k.doc_id())
            .collect();
        let found = if ids.is_empty() {
            Vec::new()
        } else {
            let answer = self
                .post_json(
                    &format!("/{counters}/_mget"),
                    &[("_source_includes", "uuid,category,set_days")],
                    &query::mget_body(&ids),
                )
                .await?;
            query::found_from_mget(&answer).map_err(StoreError::Internal)?
        };
        if let Some(range) = q.hour_range() {
            exact &= !found.iter().any(|(_, s)| query::set_in(s, range.days()));
        }
        let categories = query::categories_by_uuid(&found);
        // A counter whose document is gone is left out, as the embedded
        // store's join does.
        let entries = picked
            .into_iter()
            .filter_map(|(uuid, score)| {
                let category = categories.get(uuid)?;
                Some(TrendingEntry {
                    uuid: uuid.clone(),
                    score: *score,
                    category: category.as_str().map(str::to_string),
                })
            })
            .collect();
        Ok(TrendingList { entries, exact })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::trending::plan;

    fn q(half_life_ms: i64) -> TrendingQuery {
        // 2026-03-29 13:20 UTC.
        let now = 20_541 * DAY_MS + 13 * HOUR_MS + 20 * 60_000;
        TrendingQuery {
            entity: "VIDEO".into(),
            action: "VIEW".into(),
            category: None,
            size: 10,
            now_ms: now,
            half_life_ms,
            plan: plan(now, half_life_ms, 15, 401),
        }
    }

    #[test]
    fn the_search_reads_hours_from_hour_indices_and_days_from_the_others() {
        let q = q(24 * HOUR_MS);
        let body = trending_query(&q, "cg_t_hour_counters-", &CategoryFilter::None, false);
        let should = body.pointer("/query/bool/should").unwrap();
        assert_eq!(
            should[0]["bool"]["filter"][0],
            json!({"prefix": {"_index": "cg_t_hour_counters-"}})
        );
        assert_eq!(
            should[0]["bool"]["filter"][1]["range"]["day"]["gte"],
            q.plan.hours.start * HOUR_MS
        );
        assert_eq!(
            should[1]["bool"]["must_not"][0]["prefix"]["_index"],
            "cg_t_hour_counters-"
        );
        assert_eq!(
            should[1]["bool"]["filter"][0]["range"]["day"]["lte"],
            (q.plan.days.end - 1) * DAY_MS
        );
        let params = body
            .pointer("/aggs/top/aggs/total/sum/script/params")
            .unwrap();
        assert_eq!(params["boundary"], q.plan.days.end * DAY_MS);
        assert_eq!(params["boundary"], q.plan.hours.start * HOUR_MS);
        assert_eq!(
            body["aggs"]["top"]["terms"]["size"],
            query::WINDOW_CANDIDATES
        );
    }

    #[test]
    fn a_plan_in_one_month_of_hours_is_one_index() {
        let names = super::super::request::IndexNames::new("cg", "t").unwrap();
        // 1h: 20 hours back from 13:20 on the 29th, all in March's hours.
        let (path, one) = indices(&names, &q(HOUR_MS));
        assert_eq!(path, "cg_t_hour_counters-2026.03");
        assert!(one);
        // 24h: days before the hours, two kinds of index.
        let (path, one) = indices(&names, &q(24 * HOUR_MS));
        assert!(
            path.contains("histogram_counters-2026.03") && path.contains("hour_counters-2026.03"),
            "{path}"
        );
        assert!(!one);
    }
}
