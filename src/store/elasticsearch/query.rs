//! The read queries of the Elasticsearch store (histograms, top lists,
//! reports, averages) as pure functions: one builds each request body, one
//! parses each answer. Contract tests compare the bodies with files under
//! `tests/fixtures/es/queries/` and feed the parsers answers in the shapes the
//! Elasticsearch reference documents (`tests/fixtures/es/responses/`).
//!
//! # What is exact
//!
//! - All-time top lists, top averages, histograms, one average and the stale
//!   report read whole documents (sorted searches, `search_after` paging,
//!   sums taken here in `i128`): exact, as on the embedded store.
//! - A windowed top list is a `terms` aggregation over the bucket documents,
//!   ordered by a `sum` sub-aggregation. Ordering by a sub-aggregation has
//!   no error bound in Elasticsearch (each shard sends only its own top
//!   `shard_size` terms). Buckets are routed by counter id, so inside one
//!   monthly index every counter's buckets lie on one shard and each shard's
//!   sums are complete: a window inside one month is exact. A window across
//!   months splits a counter over several indices; then a threshold walk
//!   (`walk.rs`) reads each monthly index's exact top list and sums the
//!   candidates over all of them, and is exact once no counter outside the
//!   candidates can reach the list; past [`WINDOW_CANDIDATES`] terms per
//!   index it answers its best list as not exact.
//! - Windowed top averages cannot be ordered by Elasticsearch at all (the
//!   order is a quotient, and pipeline aggregations cannot order `terms`), so
//!   every average of the window is read by a paged `composite` aggregation
//!   and ordered here: exact, at a cost linear in the averages in the window.
//! - Top averages by a confidence-adjusted rank (Bayesian, Wilson) read
//!   every average the list considers, all time by a `search_after` walk of
//!   the averages sorted by uuid, in a window by the same `composite` pages
//!   (also in uuid order), and score them here with a heap of `size`
//!   ([`crate::store::ranked`]): exact, memory bounded by a page and the
//!   list. A Bayesian rank walks them twice (first `C`, the mean of their
//!   averages, then the scores); a write seen between the two walks moves
//!   `C`, which the second walk sees, so it walks again with the new `C`
//!   (at most [`RANK_WALKS`] walks in all).
//! - `sum` aggregations answer doubles: a sum is exact while it stays within
//!   ±2^53; past that the parsers say the list is not exact. The unused
//!   report sums the high and low 32 bits of each value separately (runtime
//!   fields), which stays exact up to 2^21 counters per pair.

use serde_json::{json, Map, Value};

use super::response::describe_error;
use crate::domain::{Counter, CounterKey, HourRange, Window};
use crate::store::{
    Average, AverageEntry, Bucket, HourBucket, StaleQuery, TopAveragesQuery, TopEntry,
    TopHoursQuery, TopQuery, UnusedPair,
};

/// Terms asked for when a windowed top list spans several monthly indices:
/// when the window holds at most this many counters, the answer is complete.
pub const WINDOW_CANDIDATES: usize = 10_000;

/// Most hits one search returns (Elasticsearch's default `max_result_window`).
pub const MAX_HITS: usize = 10_000;

/// Buckets per page of a `composite` aggregation.
pub const COMPOSITE_PAGE: usize = 1_000;

/// Averages per page of the all-time walk of a ranked list.
pub const RANK_PAGE: usize = 5_000;

/// Most walks over the averages a Bayesian rank makes: one for `C`, then
/// one to score, again while writes move `C` between two walks.
pub const RANK_WALKS: usize = 4;

const DAY_MS: i64 = 86_400_000;

/// The largest magnitude a double holds with every integer below it exact.
const EXACT_DOUBLE: f64 = 9_007_199_254_740_992.0;

fn term(field: &str, value: &str) -> Value {
    json!({"term": {field: value}})
}

/// `day` between the window's first and last day, both included.
fn day_range(w: Window) -> Value {
    json!({"range": {"day": {
        "gte": w.from_day * DAY_MS,
        "lte": w.to_day * DAY_MS,
        "format": "epoch_millis"
    }}})
}

/// The buckets of one counter (or average) inside a window, by day. Sent
/// with `routing=<counter id>`, so each monthly index searches one shard.
/// `fields`: `["day", "value"]` for counters, `["day", "sum", "quantity"]`
/// for averages.
pub fn buckets_query(counter_id: &str, window: Window, fields: &[&str]) -> Value {
    let days = usize::try_from(window.days()).unwrap_or(MAX_HITS);
    json!({
        "size": days.min(MAX_HITS),
        "track_total_hits": false,
        "query": {"bool": {"filter": [term("counter_id", counter_id), day_range(window)]}},
        "sort": [{"day": "asc"}],
        "_source": {"includes": fields}
    })
}

const HOUR_MS: i64 = 3_600_000;

/// `day` (an hour document's start) between the range's first and last hour.
fn hour_range(r: HourRange) -> Value {
    json!({"range": {"day": {
        "gte": r.from_hour * HOUR_MS,
        "lte": r.to_hour * HOUR_MS,
        "format": "epoch_millis"
    }}})
}

/// The hour documents of one counter inside a range, by hour; routed as
/// [`buckets_query`].
pub fn hour_buckets_query(counter_id: &str, range: HourRange) -> Value {
    let hours = usize::try_from(range.hours()).unwrap_or(MAX_HITS);
    json!({
        "size": hours.min(MAX_HITS),
        "track_total_hits": false,
        "query": {"bool": {"filter": [term("counter_id", counter_id), hour_range(range)]}},
        "sort": [{"day": "asc"}],
        "_source": {"includes": ["day", "value"]}
    })
}

/// The hour buckets of a [`hour_buckets_query`] answer.
pub fn hour_buckets_from_search(body: &Value) -> Result<Vec<HourBucket>, String> {
    hits(body)?
        .iter()
        .map(|h| {
            let s = source(h)?;
            let start = ms(s.get("day")).ok_or("an hour bucket has no day")?;
            let value = int(s.get("value")).ok_or("an hour bucket has no value")?;
            Ok(HourBucket {
                hour: start.div_euclid(HOUR_MS),
                value,
            })
        })
        .collect()
}

/// Whether a counter document's `set_days` (the days a backfill set,
/// `YYYY-MM-DD`, kept for the retention) names a day of `days`: those days
/// moved without an hour, so their hours do not sum to them.
pub fn set_in(source: &Value, days: Window) -> bool {
    let (from, to) = (
        crate::domain::format_day(days.from_day),
        crate::domain::format_day(days.to_day),
    );
    source
        .get("set_days")
        .and_then(Value::as_object)
        .is_some_and(|d| d.keys().any(|k| *k >= from && *k <= to))
}

/// A top list of hour sums: [`top_window_query`] over the hour documents
/// of the range.
pub fn top_hours_query(q: &TopHoursQuery, cat: &CategoryFilter, one_month: bool) -> Value {
    top_hours_terms(q, cat, one_search_terms(q.size, one_month), None)
}

/// [`top_hours_query`] asking `terms` terms, of the uuids `only` when
/// given (a step of a walk, `walk.rs`).
pub fn top_hours_terms(
    q: &TopHoursQuery,
    cat: &CategoryFilter,
    terms: usize,
    only: Option<&[String]>,
) -> Value {
    let mut filters = vec![
        term("entity", &q.entity),
        term("action", &q.action),
        hour_range(q.hours),
    ];
    cat.push(&mut filters);
    sum_terms(filters, terms, only)
}

/// Terms a list read in one search asks for: its size when the documents
/// lie in one monthly index (routing makes per-shard sums complete), else
/// [`WINDOW_CANDIDATES`].
pub fn one_search_terms(size: usize, one_month: bool) -> usize {
    if one_month {
        size
    } else {
        WINDOW_CANDIDATES.max(size)
    }
}

/// The search of a windowed list: the documents `filters` match (of the
/// uuids `only`, when given), a `terms` aggregation of `terms` uuids
/// ordered by the sum of their `value`, ties by uuid.
fn sum_terms(mut filters: Vec<Value>, terms: usize, only: Option<&[String]>) -> Value {
    if let Some(uuids) = only {
        filters.push(json!({"terms": {"uuid": uuids}}));
    }
    json!({
        "size": 0,
        "track_total_hits": false,
        "query": {"bool": {"filter": filters}},
        "aggs": {"top": {
            "terms": {
                "field": "uuid",
                "size": terms,
                "shard_size": terms,
                "order": [{"total": "desc"}, {"_key": "asc"}]
            },
            "aggs": {"total": {"sum": {"field": "value"}}}
        }}
    })
}

/// Entity, action and optional category filters shared by the top lists.
fn pair_filters(entity: &str, action: &str, category: Option<&str>) -> Vec<Value> {
    let mut f = vec![term("entity", entity), term("action", action)];
    if let Some(c) = category {
        f.push(term("category", c));
    }
    f
}

/// All-time top list: a sorted search of the counters, value descending then
/// uuid ascending (keywords sort bytewise, as SQLite's BINARY collation).
pub fn top_all_time_query(q: &TopQuery) -> Value {
    json!({
        "size": q.size,
        "track_total_hits": false,
        "query": {"bool": {"filter": pair_filters(&q.entity, &q.action, q.category.as_deref())}},
        "sort": [{"value": "desc"}, {"uuid": "asc"}],
        "_source": {"includes": ["uuid", "value", "category"]}
    })
}

/// How a windowed list is restricted to one category.
///
/// The embedded store filters on the counter's category, which a bucket does
/// not always carry (an event without a category still lands in a bucket).
/// So the uuids of the category are read from the counters first; only when
/// there are more than [`MAX_HITS`] of them does the filter fall back to the
/// buckets' own `category`, and the list is then reported as not exact.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CategoryFilter {
    None,
    Uuids(Vec<String>),
    BucketCategory(String),
}

impl CategoryFilter {
    fn push(&self, filters: &mut Vec<Value>) {
        match self {
            CategoryFilter::None => {}
            CategoryFilter::Uuids(u) => filters.push(json!({"terms": {"uuid": u}})),
            CategoryFilter::BucketCategory(c) => filters.push(term("category", c)),
        }
    }
}

/// The uuids of one category of an entity/action pair, from the counters
/// (or average counters) index; at most [`MAX_HITS`], with the true total.
pub fn category_uuids_query(entity: &str, action: &str, category: &str) -> Value {
    json!({
        "size": MAX_HITS,
        "track_total_hits": true,
        "query": {"bool": {"filter": pair_filters(entity, action, Some(category))}},
        "sort": [{"uuid": "asc"}],
        "_source": {"includes": ["uuid"]}
    })
}

/// Windowed top list: a `terms` aggregation on uuid (the pair is filtered,
/// so a uuid names one counter) ordered by the sum of its buckets in the
/// window, ties by uuid. `one_month`: the window lies in one monthly index,
/// where routing makes per-shard sums complete, so `shard_size = size`
/// suffices; otherwise [`WINDOW_CANDIDATES`] terms are asked for.
pub fn top_window_query(
    q: &TopQuery,
    window: Window,
    cat: &CategoryFilter,
    one_month: bool,
) -> Value {
    top_window_terms(q, window, cat, one_search_terms(q.size, one_month), None)
}

/// [`top_window_query`] asking `terms` terms, of the uuids `only` when
/// given (a step of a walk, `walk.rs`).
pub fn top_window_terms(
    q: &TopQuery,
    window: Window,
    cat: &CategoryFilter,
    terms: usize,
    only: Option<&[String]>,
) -> Value {
    let mut filters = vec![
        term("entity", &q.entity),
        term("action", &q.action),
        day_range(window),
    ];
    cat.push(&mut filters);
    sum_terms(filters, terms, only)
}

/// The realtime multi-get of some documents of one index, by id.
pub fn mget_body(ids: &[String]) -> Value {
    json!({"ids": ids})
}

/// Stale report page: counters last touched before the cut-off, oldest
/// first, then entity, action, uuid, continuing after the previous page's
/// last row with `search_after` (not `from`, which stops at 10,000).
pub fn stale_query(q: &StaleQuery) -> Value {
    let mut filters = vec![json!({"range": {"recorded_timestamp": {
        "lt": q.before_ms, "format": "epoch_millis"
    }}})];
    if let Some(e) = &q.entity {
        filters.push(term("entity", e));
    }
    if let Some(a) = &q.action {
        filters.push(term("action", a));
    }
    let mut body = json!({
        "size": q.limit.min(MAX_HITS),
        "track_total_hits": false,
        "query": {"bool": {"filter": filters}},
        "sort": [
            {"recorded_timestamp": "asc"},
            {"entity": "asc"},
            {"action": "asc"},
            {"uuid": "asc"}
        ],
        "_source": {"includes": ["entity", "action", "uuid", "value", "category",
            "first_timestamp", "recorded_timestamp"]}
    });
    if let Some((ms, k)) = &q.after {
        body["search_after"] = json!([ms, &*k.entity, &*k.action, &*k.uuid]);
    }
    body
}

/// The source of the runtime fields splitting `value` into its high and low
/// 32 bits. Constant, so Elasticsearch compiles it once; it holds no value.
/// The two 32-bit halves of a counter's value, as inline scripts of `sum`
/// aggregations (not runtime fields, which OpenSearch and Elasticsearch
/// before 7.11 lack): each half sums exactly in a double.
const VALUE_HI: &str = "doc['value'].size() > 0 ? doc['value'].value >> 32 : 0L";
const VALUE_LO: &str = "doc['value'].size() > 0 ? doc['value'].value & 4294967295L : 0L";

/// One page of the unused report: every entity/action pair with its last
/// touch (`max`), its total (two `sum`s of 32-bit halves, each exact in a
/// double) and its number of counters (`doc_count`). A `composite`
/// aggregation pages through every pair; it takes no `bucket_selector`, so
/// pairs touched since the cut-off are dropped by [`unused_page`].
pub fn unused_query(after: Option<&Value>) -> Value {
    let mut composite = json!({
        "size": COMPOSITE_PAGE,
        "sources": [
            {"entity": {"terms": {"field": "entity"}}},
            {"action": {"terms": {"field": "action"}}}
        ]
    });
    if let Some(a) = after {
        composite["after"] = a.clone();
    }
    json!({
        "size": 0,
        "track_total_hits": false,
        "aggs": {"pairs": {
            "composite": composite,
            "aggs": {
                "last": {"max": {"field": "recorded_timestamp"}},
                "hi": {"sum": {"script": {"source": VALUE_HI}}},
                "lo": {"sum": {"script": {"source": VALUE_LO}}}
            }
        }}
    })
}

/// All-time top averages: a sorted search on the stored `average`, then
/// quantity descending, then uuid; averages below `min_quantity` samples
/// are filtered out (the quotient is only stored while quantity is not 0).
pub fn top_averages_all_time_query(q: &TopAveragesQuery) -> Value {
    let mut filters = pair_filters(&q.entity, &q.action, q.category.as_deref());
    filters.push(json!({"range": {"quantity": {"gte": q.min_quantity}}}));
    json!({
        "size": q.size,
        "track_total_hits": false,
        "query": {"bool": {"filter": filters}},
        "sort": [{"average": "desc"}, {"quantity": "desc"}, {"uuid": "asc"}],
        "_source": {"includes": ["uuid", "sum", "quantity", "category"]}
    })
}

/// One page of the all-time walk of a ranked list: the averages of the pair
/// (and category) with at least `min_quantity` samples, by uuid, after the
/// last uuid of the previous page.
pub fn ranked_averages_all_time_query(q: &TopAveragesQuery, after: Option<&str>) -> Value {
    let mut filters = pair_filters(&q.entity, &q.action, q.category.as_deref());
    filters.push(json!({"range": {"quantity": {"gte": q.min_quantity}}}));
    let mut body = json!({
        "size": RANK_PAGE,
        "track_total_hits": false,
        "query": {"bool": {"filter": filters}},
        "sort": [{"uuid": "asc"}],
        "_source": {"includes": ["uuid", "sum", "quantity", "category"]}
    });
    if let Some(a) = after {
        body["search_after"] = json!([a]);
    }
    body
}

/// One page of windowed top averages: per uuid, the sums of `sum` and
/// `quantity` of its buckets in the window; ordered and filtered here.
pub fn top_averages_window_query(
    q: &TopAveragesQuery,
    window: Window,
    cat: &CategoryFilter,
    after: Option<&Value>,
) -> Value {
    let mut filters = vec![
        term("entity", &q.entity),
        term("action", &q.action),
        day_range(window),
    ];
    cat.push(&mut filters);
    let mut composite = json!({
        "size": COMPOSITE_PAGE,
        "sources": [{"uuid": {"terms": {"field": "uuid"}}}]
    });
    if let Some(a) = after {
        composite["after"] = a.clone();
    }
    json!({
        "size": 0,
        "track_total_hits": false,
        "query": {"bool": {"filter": filters}},
        "aggs": {"averages": {
            "composite": composite,
            "aggs": {
                "sum": {"sum": {"field": "sum"}},
                "quantity": {"sum": {"field": "quantity"}}
            }
        }}
    })
}

// ---------------------------------------------------------------------------
// Answers
// ---------------------------------------------------------------------------

/// The error of a search answer that is not a 200.
pub fn search_error(status: u16, body: &Value) -> String {
    format!(
        "search answered {status} {}",
        describe_error(body.get("error"))
    )
}

fn hits(body: &Value) -> Result<&Vec<Value>, String> {
    body.pointer("/hits/hits")
        .and_then(Value::as_array)
        .ok_or_else(|| "the search answer has no hits".to_string())
}

fn source(hit: &Value) -> Result<&Value, String> {
    hit.get("_source")
        .ok_or_else(|| "a hit has no _source".to_string())
}

fn int(v: Option<&Value>) -> Option<i64> {
    let v = v?;
    v.as_i64()
        .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
}

/// Epoch milliseconds (as the scripts store dates) or an RFC 3339 string.
fn ms(v: Option<&Value>) -> Option<i64> {
    int(v).or_else(|| {
        v?.as_str()
            .and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok())
            .map(|t| t.timestamp_millis())
    })
}

fn text(v: Option<&Value>) -> Option<String> {
    v.and_then(Value::as_str).map(str::to_string)
}

/// A double from an aggregation as an integer, and whether it is exact.
/// A `sum` past i64 (a window of several days near the limits, answered
/// as e.g. `1.8446744073709552E19`) is the double's own integer: `i128`
/// holds it (`as` saturates only past ±1.7e38), flagged inexact.
fn whole(v: f64) -> (i128, bool) {
    let exact = v.is_finite() && v.fract() == 0.0 && v.abs() < EXACT_DOUBLE;
    (v as i128, exact)
}

/// The day buckets of a [`buckets_query`] answer (counters).
pub fn buckets_from_search(body: &Value) -> Result<Vec<Bucket>, String> {
    hits(body)?
        .iter()
        .map(|h| {
            let s = source(h)?;
            let day = ms(s.get("day")).ok_or("a bucket has no day")?;
            let value = int(s.get("value")).ok_or("a bucket has no value")?;
            Ok(Bucket {
                day: day.div_euclid(DAY_MS),
                value,
            })
        })
        .collect()
}

/// The sum and quantity of an average's buckets ([`buckets_query`] answer),
/// added here exactly, also past i64.
pub fn average_window_from_search(body: &Value) -> Result<(i128, i128), String> {
    let (mut sum, mut quantity) = (0i128, 0i128);
    for h in hits(body)? {
        let s = source(h)?;
        sum += i128::from(int(s.get("sum")).ok_or("an average bucket has no sum")?);
        quantity += i128::from(int(s.get("quantity")).ok_or("an average bucket has no quantity")?);
    }
    Ok((sum, quantity))
}

/// The entries of a [`top_all_time_query`] answer, in hit order.
pub fn top_from_search(body: &Value) -> Result<Vec<TopEntry>, String> {
    hits(body)?
        .iter()
        .map(|h| {
            let s = source(h)?;
            Ok(TopEntry {
                uuid: text(s.get("uuid")).ok_or("a counter has no uuid")?,
                value: int(s.get("value")).ok_or("a counter has no value")?.into(),
                category: text(s.get("category")),
            })
        })
        .collect()
}

/// The uuids of a [`category_uuids_query`] answer, and whether they are all
/// of them (the total is not above what came back).
pub fn uuids_from_search(body: &Value) -> Result<(Vec<String>, bool), String> {
    let uuids = hits(body)?
        .iter()
        .map(|h| text(source(h)?.get("uuid")).ok_or_else(|| "a hit has no uuid".to_string()))
        .collect::<Result<Vec<_>, _>>()?;
    let total = body
        .pointer("/hits/total/value")
        .and_then(Value::as_u64)
        .ok_or("the search answer has no hits.total")?;
    let complete = total <= uuids.len() as u64;
    Ok((uuids, complete))
}

/// The terms of a [`top_window_query`] answer.
#[derive(Clone, Debug, PartialEq)]
pub struct WindowTop {
    /// `(uuid, sum in the window)`, in the answer's order.
    pub entries: Vec<(String, i128)>,
    /// Every sum fitted a double exactly.
    pub sums_exact: bool,
    /// Documents that fell in no returned term: 0 means every counter of the
    /// window came back with its whole sum.
    pub sum_other_doc_count: u64,
}

/// The aggregation `name` of a search answer; `None` when the search
/// matched no index at all (a new tenant, a window before any data): the
/// engine then answers with zero shards and no `aggregations` key, even with
/// `allow_no_indices` (seen on OpenSearch 2.19 and in Elasticsearch's source).
fn aggregation<'a>(body: &'a Value, name: &str) -> Result<Option<&'a Value>, String> {
    if let Some(agg) = body.get("aggregations").and_then(|a| a.get(name)) {
        return Ok(Some(agg));
    }
    if body.pointer("/_shards/total").and_then(Value::as_u64) == Some(0) {
        return Ok(None);
    }
    Err(format!("the answer has no aggregations.{name}"))
}

static NO_BUCKETS: Vec<Value> = Vec::new();

pub fn window_top_from_aggs(body: &Value) -> Result<WindowTop, String> {
    let Some(agg) = aggregation(body, "top")? else {
        return Ok(WindowTop {
            entries: Vec::new(),
            sums_exact: true,
            sum_other_doc_count: 0,
        });
    };
    let buckets = agg
        .get("buckets")
        .and_then(Value::as_array)
        .ok_or("aggregations.top has no buckets")?;
    let mut sums_exact = true;
    let entries = buckets
        .iter()
        .map(|b| {
            let uuid = text(b.get("key")).ok_or("a term has no key")?;
            let total = b
                .pointer("/total/value")
                .and_then(Value::as_f64)
                .ok_or("a term has no total.value")?;
            let (v, exact) = whole(total);
            sums_exact &= exact;
            Ok((uuid, v))
        })
        .collect::<Result<Vec<_>, String>>()?;
    let sum_other_doc_count = agg
        .get("sum_other_doc_count")
        .and_then(Value::as_u64)
        .ok_or("aggregations.top has no sum_other_doc_count")?;
    Ok(WindowTop {
        entries,
        sums_exact,
        sum_other_doc_count,
    })
}

/// The documents of an `_mget` answer that were found: `(_id, _source)`.
pub fn found_from_mget(body: &Value) -> Result<Vec<(String, Value)>, String> {
    let docs = body
        .get("docs")
        .and_then(Value::as_array)
        .ok_or("the _mget answer has no docs")?;
    Ok(docs
        .iter()
        .filter(|d| d.get("found") == Some(&Value::Bool(true)))
        .filter_map(|d| Some((text(d.get("_id"))?, d.get("_source")?.clone())))
        .collect())
}

/// The buckets and `after_key` of one page of a composite aggregation named
/// `name`; no `after_key` (or no bucket) means the last page.
pub fn composite_page<'a>(
    body: &'a Value,
    name: &str,
) -> Result<(&'a Vec<Value>, Option<&'a Value>), String> {
    let Some(agg) = aggregation(body, name)? else {
        return Ok((&NO_BUCKETS, None));
    };
    let buckets = agg
        .get("buckets")
        .and_then(Value::as_array)
        .ok_or_else(|| format!("aggregations.{name} has no buckets"))?;
    let after = agg.get("after_key").filter(|_| !buckets.is_empty());
    Ok((buckets, after))
}

/// The pairs of one [`unused_query`] page last touched before `before_ms`.
pub fn unused_page(buckets: &[Value], before_ms: i64) -> Result<Vec<UnusedPair>, String> {
    let mut out = Vec::new();
    for b in buckets {
        let entity = text(b.pointer("/key/entity")).ok_or("a pair has no key.entity")?;
        let action = text(b.pointer("/key/action")).ok_or("a pair has no key.action")?;
        let counters = b
            .get("doc_count")
            .and_then(Value::as_u64)
            .ok_or("a pair has no doc_count")?;
        let Some(last) = b.pointer("/last/value").and_then(Value::as_f64) else {
            // `null`: none of its counters has a recorded_timestamp.
            continue;
        };
        let last_ms = last as i64;
        if last_ms >= before_ms {
            continue;
        }
        let half = |name: &str| -> Result<i128, String> {
            let v = b
                .pointer(&format!("/{name}/value"))
                .and_then(Value::as_f64)
                .ok_or_else(|| format!("a pair has no {name}.value"))?;
            Ok(v as i128)
        };
        out.push(UnusedPair {
            entity,
            action,
            last_ms,
            total: (half("hi")? << 32) + half("lo")?,
            counters,
        });
    }
    Ok(out)
}

/// Orders unused pairs as the embedded store: last touch, entity, action.
pub fn sort_unused(pairs: &mut [UnusedPair]) {
    pairs.sort_by(|a, b| (a.last_ms, &a.entity, &a.action).cmp(&(b.last_ms, &b.entity, &b.action)));
}

/// One average of a windowed page: `(uuid, sum, quantity)`.
pub type AverageRow = (String, i128, i128);

/// The averages of one windowed page; `false` in the second place when a
/// sum did not fit a double exactly.
pub fn averages_page(buckets: &[Value]) -> Result<(Vec<AverageRow>, bool), String> {
    let mut exact = true;
    let rows = buckets
        .iter()
        .map(|b| {
            let uuid = text(b.pointer("/key/uuid")).ok_or("an average has no key.uuid")?;
            let mut get = |name: &str| -> Result<i128, String> {
                let v = b
                    .pointer(&format!("/{name}/value"))
                    .and_then(Value::as_f64)
                    .ok_or_else(|| format!("an average has no {name}.value"))?;
                let (n, e) = whole(v);
                exact &= e;
                Ok(n)
            };
            Ok((uuid, get("sum")?, get("quantity")?))
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok((rows, exact))
}

/// The order of top averages, as the embedded store: average descending
/// (the same double quotient), quantity descending, uuid ascending.
pub fn rank_averages(rows: &mut Vec<AverageEntry>, size: usize) {
    let avg = |e: &AverageEntry| e.sum as f64 / e.quantity as f64;
    rows.sort_by(|a, b| {
        avg(b)
            .total_cmp(&avg(a))
            .then(b.quantity.cmp(&a.quantity))
            .then_with(|| a.uuid.as_bytes().cmp(b.uuid.as_bytes()))
    });
    rows.truncate(size);
}

/// The entries of a [`top_averages_all_time_query`] answer.
pub fn top_averages_from_search(body: &Value) -> Result<Vec<AverageEntry>, String> {
    hits(body)?
        .iter()
        .map(|h| {
            let s = source(h)?;
            Ok(AverageEntry {
                uuid: text(s.get("uuid")).ok_or("an average has no uuid")?,
                sum: int(s.get("sum")).ok_or("an average has no sum")?.into(),
                quantity: int(s.get("quantity"))
                    .ok_or("an average has no quantity")?
                    .into(),
                category: text(s.get("category")),
                score: None,
            })
        })
        .collect()
}

/// An average document's `_source`; `None` when it lacks the fields every
/// average document has.
pub fn average_from_source(key: &CounterKey, s: &Value) -> Option<Average> {
    let recorded_ms = ms(s.get("recorded_timestamp"))?;
    Some(Average {
        key: key.clone(),
        sum: int(s.get("sum"))?.into(),
        quantity: int(s.get("quantity"))?.into(),
        category: text(s.get("category")),
        first_ms: ms(s.get("first_timestamp")).unwrap_or(recorded_ms),
        recorded_ms,
    })
}

/// The average of a realtime get answer (200 or 404); `None` when not found.
pub fn average_from_get(
    key: &CounterKey,
    status: u16,
    body: &Value,
) -> Result<Option<Average>, String> {
    match status {
        200 if body.get("found") == Some(&Value::Bool(true)) => body
            .get("_source")
            .and_then(|s| average_from_source(key, s))
            .map(Some)
            .ok_or_else(|| "the average document lacks required fields".into()),
        200 | 404 if body.get("found") == Some(&Value::Bool(false)) => Ok(None),
        404 if super::response::error_type(body) == Some("index_not_found_exception") => Ok(None),
        _ => Err(format!(
            "get answered {status} {}",
            describe_error(body.get("error"))
        )),
    }
}

/// Stale counters: the hits of a [`stale_query`] answer.
pub fn stale_from_search(body: &Value) -> Result<Vec<Counter>, String> {
    super::response::counters_from_search(body)
}

/// Categories by uuid from the found documents of an `_mget`.
pub fn categories_by_uuid(found: &[(String, Value)]) -> Map<String, Value> {
    found
        .iter()
        .filter_map(|(_, s)| {
            let uuid = s.get("uuid")?.as_str()?.to_string();
            Some((uuid, s.get("category").cloned().unwrap_or(Value::Null)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_are_exact_below_two_to_the_53() {
        assert_eq!(whole(6.0), (6, true));
        assert_eq!(whole(-3.0), (-3, true));
        assert!(!whole(9_007_199_254_740_992.0).1);
        assert!(!whole(1.5).1);
    }

    #[test]
    fn averages_rank_like_the_embedded_store() {
        let e = |uuid: &str, sum, quantity| AverageEntry {
            uuid: uuid.into(),
            sum,
            quantity,
            category: None,
            score: None,
        };
        let mut rows = vec![
            e("b", 8, 2),
            e("a", 8, 2),
            e("c", 4, 1),
            e("d", 9, 2),
            e("z", 5, 1),
        ];
        rank_averages(&mut rows, 4);
        let order: Vec<&str> = rows.iter().map(|r| r.uuid.as_str()).collect();
        assert_eq!(order, ["z", "d", "a", "b"]);
    }
}
