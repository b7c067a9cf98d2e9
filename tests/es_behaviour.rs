//! Behaviour of the Elasticsearch store against a local HTTP server that
//! answers like Elasticsearch (shapes from `tests/fixtures/es/responses/`,
//! which follow the documented ones): success, `errors: true` with mixed
//! items, 429, 503, 409 after retries, the overflow script error, connection
//! refused. Each test checks which items were resent, what was acknowledged
//! and what the client sees. Back-off uses the fast test variant.

#[path = "common/mod.rs"]
mod common;
#[path = "conformance/runner.rs"]
mod runner;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Method, Request, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use chrono::{DateTime, Datelike, Utc};
use counter_gateway::domain::{
    ActorKey, Clock, CounterKey, Increment, IncrementSpec, ManualClock, Scope, TimePolicy, Unique,
};
use counter_gateway::metrics::Metrics;
use counter_gateway::pipeline::{Pipeline, PipelineConfig};
use counter_gateway::store::elasticsearch::config::EsConfig;
use counter_gateway::store::elasticsearch::retry::Backoff;
use counter_gateway::store::elasticsearch::ElasticsearchStore;
use counter_gateway::store::{RequestOutcome, Store, WriteBatch};
use counter_gateway::transfer::export;
use counter_gateway::{router, AppState, Limits};
use http_body_util::BodyExt;
use serde_json::{json, Map, Value};
use tower::ServiceExt;

// ---------------------------------------------------------------------------
// The fake cluster
// ---------------------------------------------------------------------------

/// Decides the fate of one bulk item: `None` applies it, `Some((status,
/// error))` answers that error instead. Arguments: bulk call number (0-based)
/// and the item's `_id`.
type ItemFault = Box<dyn Fn(usize, &str) -> Option<(u16, Value)> + Send>;
/// Answers a whole bulk call with `(status, body)` instead of handling it.
type RequestFault = Box<dyn Fn(usize) -> Option<(u16, Value)> + Send>;

#[derive(Default)]
struct State {
    /// `(index, _id)` -> `_source`.
    docs: HashMap<(String, String), Map<String, Value>>,
    /// The `_meta` of each index's mapping, as a mapping put last set it.
    metas: HashMap<String, Map<String, Value>>,
    /// Every bulk call: the `_id` of each item, in order.
    bulks: Vec<Vec<String>>,
    /// Every bulk call's raw body and content type.
    raw: Vec<(String, Vec<u8>)>,
    /// Every bulk call's query string.
    bulk_queries: Vec<String>,
    /// Every other call: `METHOD path?query`.
    calls: Vec<String>,
    /// Every search: (index path, query string, body).
    searches: Vec<(String, String, Value)>,
    item_fault: Option<ItemFault>,
    request_fault: Option<RequestFault>,
    /// Document GETs still to answer 503, as a shard still recovering does.
    get_faults: usize,
    /// Indices created by `PUT /<index>` or by a write.
    indices: std::collections::HashSet<String>,
    /// `action.auto_create_index: false`: a write to a missing index fails.
    no_auto_create: bool,
    /// `PUT /<index>` is refused (the user lacks `create_index`).
    refuse_create: bool,
    /// Every `_update` (a backfill's counter step) answers 503.
    refuse_updates: bool,
    /// `GET /` answers as OpenSearch 2.19 (no ILM).
    opensearch: bool,
    /// `_seq_no` of each document, bumped by every write to it (one
    /// sequence for the whole fake, which is enough for conditional writes).
    seq: HashMap<(String, String), i64>,
    next_seq: i64,
}

impl State {
    fn bump(&mut self, key: &(String, String)) -> i64 {
        self.next_seq += 1;
        self.seq.insert(key.clone(), self.next_seq);
        self.next_seq
    }
}

#[derive(Clone, Default)]
struct Fake(Arc<Mutex<State>>);

fn fixture(name: &str) -> Value {
    let path = format!(
        "{}/tests/fixtures/es/responses/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// The error objects of the captured mixed answer, by status.
fn item_error(status: u16) -> Value {
    let mixed = fixture("bulk_mixed.json");
    mixed["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| &i["update"])
        .find(|i| i["status"] == json!(status))
        .map(|i| i["error"].clone())
        .unwrap_or_else(|| panic!("no item with status {status} in bulk_mixed.json"))
}

/// The overflow error as the script raises it, for `counter_id`.
fn overflow_error(counter_id: &str) -> Value {
    let mut e = item_error(400);
    assert_eq!(e["type"], "illegal_argument_exception");
    e["caused_by"]["caused_by"]["reason"] = json!(format!(
        "counter_overflow: counter {counter_id} would leave the signed 64-bit range"
    ));
    e
}

fn n(v: &Value) -> i128 {
    i128::from(v.as_i64().unwrap_or(0))
}

/// What the stored scripts do, in Rust: the fake applies params the way the
/// Painless source does (see `index-templates/scripts/`).
fn run_script(src: &mut Map<String, Value>, p: &Value, bucket: bool) -> Result<(), String> {
    if !src.contains_key("counter_id") {
        for f in ["counter_id", "entity", "action", "uuid"] {
            src.insert(f.into(), p[f].clone());
        }
        if bucket {
            src.insert("day".into(), p["day"].clone());
        }
    }
    let mut total = src.get("value").map_or(0, n) + n(&p["delta"]);
    let mut first = p["first_ms"].as_i64();
    let mut last = p["last_ms"].as_i64();
    let mut category = p["category"].as_str().map(str::to_string);
    let mut cat_pos = p["category_pos"].as_i64().unwrap_or(-1);
    let mut seen = src
        .get("event_ids")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    for id in p["forget"].as_array().into_iter().flatten() {
        seen.remove(id.as_str().unwrap());
    }
    let mut skipped = Vec::new();
    for (i, e) in p["events"].as_array().into_iter().flatten().enumerate() {
        let id = e[0].as_str().unwrap();
        if seen.contains_key(id) {
            skipped.push(json!(i));
            continue;
        }
        seen.insert(id.into(), p["now_ms"].clone());
        total += n(&e[1]);
        let ts = e[2].as_i64().unwrap();
        first = Some(first.map_or(ts, |f| f.min(ts)));
        last = Some(last.map_or(ts, |l| l.max(ts)));
        if let Some(c) = e[3].as_str() {
            if e[4].as_i64().unwrap() > cat_pos {
                category = Some(c.into());
                cat_pos = e[4].as_i64().unwrap();
            }
        }
    }
    let value = i64::try_from(total).map_err(|_| "overflow".to_string())?;
    src.insert("value".into(), json!(value));
    if let Some(c) = category {
        src.insert("category".into(), json!(c));
    }
    if !bucket {
        if let Some(f) = first {
            let old = src.get("first_timestamp").and_then(Value::as_i64);
            src.insert("first_timestamp".into(), json!(old.map_or(f, |o| o.min(f))));
        }
        if let Some(l) = last {
            let old = src.get("recorded_timestamp").and_then(Value::as_i64);
            src.insert(
                "recorded_timestamp".into(),
                json!(old.map_or(l, |o| o.max(l))),
            );
        }
    }
    if seen.is_empty() {
        src.remove("event_ids");
    } else {
        src.insert("event_ids".into(), Value::Object(seen));
    }
    if skipped.is_empty() {
        src.remove("skipped_events");
    } else {
        src.insert("skipped_events".into(), Value::Array(skipped));
    }
    Ok(())
}

/// What `actor-mark.painless` does to a mark, in Rust.
enum MarkRun {
    /// `ctx.op = 'none'`.
    Noop,
    /// The document is written as `src` now is.
    Write,
    /// `ctx.op = 'delete'`.
    Delete,
}

/// What `actor-mark.painless` does, in Rust: add, take and set, with the
/// token, the stale retraction and the remembered ids.
fn run_mark_script(src: &mut Map<String, Value>, p: &Value) -> MarkRun {
    let now = p["now_ms"].as_i64().unwrap();
    let mut seen = src
        .get("event_ids")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let token = p["token"].as_str();
    let mine = src.get("token").and_then(Value::as_str).is_some()
        && src.get("token").and_then(Value::as_str) == token;
    let store_ids = |src: &mut Map<String, Value>, seen: Map<String, Value>| {
        if seen.is_empty() {
            src.remove("event_ids");
        } else {
            src.insert("event_ids".into(), Value::Object(seen));
        }
    };
    if p["op"] == "set" {
        let mut changed = false;
        for id in p["forget"].as_array().into_iter().flatten() {
            changed |= seen.remove(id.as_str().unwrap()).is_some();
        }
        if let Some(state) = p["state"].as_str() {
            if mine && src.get("state").and_then(Value::as_str) != Some(state) {
                src.insert("state".into(), json!(state));
                src.insert("since".into(), json!(now));
                changed = true;
            }
        }
        if !changed || !src.contains_key("counter_id") {
            return MarkRun::Noop;
        }
        if src.get("state").and_then(Value::as_str) == Some("off") && seen.is_empty() {
            return MarkRun::Delete;
        }
        store_ids(src, seen);
        return MarkRun::Write;
    }
    let mut state = src
        .get("state")
        .and_then(Value::as_str)
        .unwrap_or("off")
        .to_string();
    let since = src.get("since").and_then(Value::as_i64);
    if state == "retracting"
        && !mine
        && since.is_some_and(|s| now - s > p["stale_ms"].as_i64().unwrap())
    {
        state = "counted".into();
    }
    let id = p["id"].as_str();
    if id.is_some_and(|id| seen.contains_key(id)) {
        return MarkRun::Noop;
    }
    let mut outcome = "repeat";
    if p["op"] == "add" && (state == "off" || (state == "retracting" && mine)) {
        outcome = "counted";
        state = "counted".into();
    } else if p["op"] == "take" && state == "counted" {
        outcome = "counted";
        state = "retracting".into();
    }
    if outcome == "repeat" && id.is_none() {
        return MarkRun::Noop;
    }
    if !src.contains_key("counter_id") {
        src.insert("counter_id".into(), p["counter_id"].clone());
        src.insert("scope".into(), p["scope"].clone());
        if !p["day"].is_null() {
            src.insert("day".into(), p["day"].clone());
        }
    }
    if src.get("mark").map_or(true, Value::is_null) && !p["mark"].is_null() {
        src.insert("counter_hash".into(), p["counter_hash"].clone());
        src.insert("mark".into(), p["mark"].clone());
    }
    if let Some(id) = id {
        seen.insert(id.into(), json!(now));
    }
    if outcome == "counted" {
        src.insert("token".into(), json!(token));
        src.insert("since".into(), json!(now));
    }
    src.insert("state".into(), json!(state));
    src.insert("outcome".into(), json!(outcome));
    store_ids(src, seen);
    MarkRun::Write
}

/// What `counter-set.painless` does, in Rust: a set's difference applied
/// once per set id and day, the touch at the day's start. `Ok(false)`: the
/// set was applied before (a noop).
fn run_set_script(src: &mut Map<String, Value>, p: &Value) -> Result<bool, String> {
    if !src.contains_key("counter_id") {
        for f in ["counter_id", "entity", "action", "uuid"] {
            src.insert(f.into(), p[f].clone());
        }
    }
    let day = p["day"].as_str().unwrap().to_string();
    let mut days = src
        .get("set_days")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let id = p["set_id"].as_str();
    if id.is_some() && days.get(&day).and_then(Value::as_str) == id {
        return Ok(false);
    }
    let delta: i128 = if id.is_some() {
        p["delta"].as_str().unwrap().parse().unwrap()
    } else {
        0
    };
    let value = i64::try_from(src.get("value").map_or(0, n) + delta).map_err(|_| "overflow")?;
    src.insert("value".into(), json!(value));
    if let Some(id) = id {
        days.insert(day, json!(id));
    }
    let oldest = p["oldest_day"].as_str().unwrap();
    days.retain(|d, _| d.as_str() >= oldest);
    if days.is_empty() {
        src.remove("set_days");
    } else {
        src.insert("set_days".into(), Value::Object(days));
    }
    if let Some(c) = p["category"].as_str() {
        src.insert("category".into(), json!(c));
    }
    let touch = p["touch_ms"].as_i64().unwrap();
    let first = src.get("first_timestamp").and_then(Value::as_i64);
    src.insert(
        "first_timestamp".into(),
        json!(first.map_or(touch, |f| f.min(touch))),
    );
    let last = src.get("recorded_timestamp").and_then(Value::as_i64);
    src.insert(
        "recorded_timestamp".into(),
        json!(last.map_or(touch, |l| l.max(touch))),
    );
    Ok(true)
}

/// What `average-update.painless` and `average-bucket-update.painless` do,
/// in Rust: sum and quantity (events carry their quantity as `e[5]`), the
/// stored quotient on the average document, timestamps only there.
fn run_average_script(src: &mut Map<String, Value>, p: &Value, bucket: bool) -> Result<(), String> {
    if !src.contains_key("counter_id") {
        for f in ["counter_id", "entity", "action", "uuid"] {
            src.insert(f.into(), p[f].clone());
        }
        if bucket {
            src.insert("day".into(), p["day"].clone());
        }
    }
    let mut sum = src.get("sum").map_or(0, n) + n(&p["delta"]);
    let mut quantity = src.get("quantity").map_or(0, n) + n(&p["quantity"]);
    let mut first = p["first_ms"].as_i64();
    let mut last = p["last_ms"].as_i64();
    let mut category = p["category"].as_str().map(str::to_string);
    let mut seen = src
        .get("event_ids")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    for id in p["forget"].as_array().into_iter().flatten() {
        seen.remove(id.as_str().unwrap());
    }
    let mut skipped = Vec::new();
    for (i, e) in p["events"].as_array().into_iter().flatten().enumerate() {
        let id = e[0].as_str().unwrap();
        if seen.contains_key(id) {
            skipped.push(json!(i));
            continue;
        }
        seen.insert(id.into(), p["now_ms"].clone());
        sum += n(&e[1]);
        quantity += n(&e[5]);
        let ts = e[2].as_i64().unwrap();
        first = Some(first.map_or(ts, |f| f.min(ts)));
        last = Some(last.map_or(ts, |l| l.max(ts)));
        if let Some(c) = e[3].as_str() {
            category = Some(c.into());
        }
    }
    let sum = i64::try_from(sum).map_err(|_| "overflow".to_string())?;
    let quantity = i64::try_from(quantity).map_err(|_| "overflow".to_string())?;
    src.insert("sum".into(), json!(sum));
    src.insert("quantity".into(), json!(quantity));
    if let Some(c) = category {
        src.insert("category".into(), json!(c));
    }
    if !bucket {
        if quantity == 0 {
            src.remove("average");
        } else {
            src.insert("average".into(), json!(sum as f64 / quantity as f64));
        }
        if let Some(f) = first {
            let old = src.get("first_timestamp").and_then(Value::as_i64);
            src.insert("first_timestamp".into(), json!(old.map_or(f, |o| o.min(f))));
        }
        if let Some(l) = last {
            let old = src.get("recorded_timestamp").and_then(Value::as_i64);
            src.insert(
                "recorded_timestamp".into(),
                json!(old.map_or(l, |o| o.max(l))),
            );
        }
    }
    if seen.is_empty() {
        src.remove("event_ids");
    } else {
        src.insert("event_ids".into(), Value::Object(seen));
    }
    if skipped.is_empty() {
        src.remove("skipped_events");
    } else {
        src.insert("skipped_events".into(), Value::Array(skipped));
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// The fake's search: the subset of the query DSL the store sends (bool
// filters of term, terms and range; sort; search_after; terms and composite
// aggregations with sum and max), evaluated over the stored documents.
// ---------------------------------------------------------------------------

/// A stored document's `_source`.
type Doc = Map<String, Value>;

/// Whether a document of `index` is searched by the path part `target`
/// (a comma-separated list of names, each possibly ending in `*`).
fn index_matches(target: &str, index: &str) -> bool {
    target.split(',').any(|t| match t.strip_suffix('*') {
        Some(prefix) => index.starts_with(prefix),
        None => t == index,
    })
}

/// A field of a document, with the two script values of the unused report.
fn field(src: &Map<String, Value>, name: &str) -> Option<Value> {
    match name {
        "value_hi" => src.get("value")?.as_i64().map(|v| json!(v >> 32)),
        "value_lo" => src.get("value")?.as_i64().map(|v| json!(v & 0xFFFF_FFFF)),
        _ => src.get(name).cloned(),
    }
}

fn cmp_values(a: &Value, b: &Value) -> std::cmp::Ordering {
    match (a, b) {
        (Value::String(x), Value::String(y)) => x.as_bytes().cmp(y.as_bytes()),
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64()) {
            (Some(x), Some(y)) => x.cmp(&y),
            _ => x.as_f64().unwrap().total_cmp(&y.as_f64().unwrap()),
        },
        _ => panic!("cannot compare {a} and {b}"),
    }
}

/// A clause of a `should` (the trending list's): a `bool` of `filter`
/// and `must_not` clauses, a `prefix` on `_index`, or a plain filter.
fn matches_clause(index: &str, src: &Map<String, Value>, c: &Value) -> bool {
    if let Some(b) = c.get("bool") {
        let all = |k: &str| b[k].as_array().cloned().unwrap_or_default();
        return all("filter").iter().all(|f| matches_clause(index, src, f))
            && !all("must_not")
                .iter()
                .any(|f| matches_clause(index, src, f));
    }
    if let Some(p) = c.pointer("/prefix/_index") {
        return index.starts_with(p.as_str().unwrap());
    }
    matches_filter(src, c)
}

fn matches_filter(src: &Map<String, Value>, f: &Value) -> bool {
    if let Some(t) = f.get("term").and_then(Value::as_object) {
        let (k, v) = t.iter().next().unwrap();
        return field(src, k).as_ref() == Some(v);
    }
    if let Some(t) = f.get("terms").and_then(Value::as_object) {
        let (k, v) = t.iter().next().unwrap();
        let got = field(src, k);
        return v
            .as_array()
            .unwrap()
            .iter()
            .any(|x| got.as_ref() == Some(x));
    }
    if let Some(r) = f.get("range").and_then(Value::as_object) {
        let (k, bounds) = r.iter().next().unwrap();
        let Some(got) = field(src, k) else {
            return false;
        };
        use std::cmp::Ordering::*;
        return bounds
            .as_object()
            .unwrap()
            .iter()
            .all(|(op, b)| match op.as_str() {
                "gte" => cmp_values(&got, b) != Less,
                "gt" => cmp_values(&got, b) == Greater,
                "lte" => cmp_values(&got, b) != Greater,
                "lt" => cmp_values(&got, b) == Less,
                "format" => true,
                other => panic!("range op {other}"),
            });
    }
    panic!("the fake does not know the filter {f}")
}

/// `sum`/`max` sub-aggregations of one bucket, as Elasticsearch answers
/// them (doubles; `null` for a max over nothing).
fn metrics(docs: &[&Map<String, Value>], aggs: &Value) -> Map<String, Value> {
    let mut out = Map::new();
    for (name, spec) in aggs.as_object().into_iter().flatten() {
        let (kind, def) = spec.as_object().unwrap().iter().next().unwrap();
        // A field, or one of the unused report's two inline scripts (the
        // 32-bit halves of `value`), which the fake knows by their shape.
        // The trending score's script (`store/elasticsearch/trending.rs`):
        // each bucket's count weighed by its end, as the Painless does.
        if def
            .pointer("/script/source")
            .and_then(Value::as_str)
            .is_some_and(|s| s.contains("params.half_life"))
        {
            assert_eq!(kind, "sum");
            let p = &def["script"]["params"];
            let (now, hl, boundary) = (
                p["now"].as_i64().unwrap(),
                p["half_life"].as_i64().unwrap(),
                p["boundary"].as_i64().unwrap(),
            );
            let total: f64 = docs
                .iter()
                .map(|d| {
                    let start = d["day"].as_i64().unwrap();
                    let end = start
                        + if start < boundary {
                            86_400_000
                        } else {
                            3_600_000
                        };
                    let age = (now - end).max(0) as f64;
                    d["value"].as_f64().unwrap() * 2f64.powf(-age / hl as f64)
                })
                .sum();
            out.insert(name.clone(), json!({"value": total}));
            continue;
        }
        let f = match (def.get("field"), def.pointer("/script/source")) {
            (Some(f), _) => f.as_str().unwrap(),
            (None, Some(s)) if s.as_str().unwrap().contains(">> 32") => "value_hi",
            (None, Some(s)) if s.as_str().unwrap().contains("& 4294967295L") => "value_lo",
            _ => panic!("the fake does not know the metric source {def}"),
        };
        let values: Vec<f64> = docs
            .iter()
            .filter_map(|d| field(d, f))
            .map(|v| v.as_f64().unwrap())
            .collect();
        let v = match kind.as_str() {
            "sum" => json!(values.iter().sum::<f64>()),
            "max" => values
                .iter()
                .copied()
                .reduce(f64::max)
                .map_or(Value::Null, |m| json!(m)),
            other => panic!("the fake does not know the metric {other}"),
        };
        out.insert(name.clone(), json!({"value": v}));
    }
    out
}

fn aggregate(docs: &[&Map<String, Value>], aggs: &Value) -> Value {
    let mut out = Map::new();
    for (name, spec) in aggs.as_object().unwrap() {
        let sub = &spec["aggs"];
        if let Some(t) = spec.get("terms") {
            let f = t["field"].as_str().unwrap();
            let mut groups: Vec<(Value, Vec<&Map<String, Value>>)> = Vec::new();
            for d in docs {
                let Some(k) = field(d, f) else { continue };
                match groups.iter_mut().find(|(g, _)| *g == k) {
                    Some((_, v)) => v.push(d),
                    None => groups.push((k, vec![*d])),
                }
            }
            let mut buckets: Vec<(Value, usize, Map<String, Value>)> = groups
                .into_iter()
                .map(|(k, v)| (k, v.len(), metrics(&v, sub)))
                .collect();
            // The store orders by [{"total": "desc"}, {"_key": "asc"}].
            assert_eq!(t["order"], json!([{"total": "desc"}, {"_key": "asc"}]));
            buckets.sort_by(|a, b| {
                cmp_values(&b.2["total"]["value"], &a.2["total"]["value"])
                    .then(cmp_values(&a.0, &b.0))
            });
            let size = t["size"].as_u64().unwrap() as usize;
            let other: usize = buckets.iter().skip(size).map(|b| b.1).sum();
            buckets.truncate(size);
            out.insert(
                name.clone(),
                json!({
                    "doc_count_error_upper_bound": -1,
                    "sum_other_doc_count": other,
                    "buckets": buckets.into_iter().map(|(k, c, m)| {
                        let mut b = m;
                        b.insert("key".into(), k);
                        b.insert("doc_count".into(), json!(c));
                        Value::Object(b)
                    }).collect::<Vec<_>>()
                }),
            );
        } else if let Some(c) = spec.get("composite") {
            let sources: Vec<(String, String)> = c["sources"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| {
                    let (n, d) = s.as_object().unwrap().iter().next().unwrap();
                    (n.clone(), d["terms"]["field"].as_str().unwrap().to_string())
                })
                .collect();
            let key_of = |d: &Map<String, Value>| -> Option<Vec<Value>> {
                sources.iter().map(|(_, f)| field(d, f)).collect()
            };
            let mut groups: Vec<(Vec<Value>, Vec<&Doc>)> = Vec::new();
            for d in docs {
                let Some(k) = key_of(d) else { continue };
                match groups.iter_mut().find(|(g, _)| *g == k) {
                    Some((_, v)) => v.push(d),
                    None => groups.push((k, vec![*d])),
                }
            }
            let cmp_keys = |a: &[Value], b: &[Value]| {
                a.iter()
                    .zip(b)
                    .map(|(x, y)| cmp_values(x, y))
                    .find(|o| o.is_ne())
                    .unwrap_or(std::cmp::Ordering::Equal)
            };
            groups.sort_by(|a, b| cmp_keys(&a.0, &b.0));
            if let Some(after) = c.get("after") {
                let after: Vec<Value> = sources.iter().map(|(n, _)| after[n].clone()).collect();
                groups.retain(|(k, _)| cmp_keys(k, &after).is_gt());
            }
            groups.truncate(c["size"].as_u64().unwrap() as usize);
            let key_json = |k: &[Value]| -> Value {
                Value::Object(
                    sources
                        .iter()
                        .map(|(n, _)| n.clone())
                        .zip(k.iter().cloned())
                        .collect(),
                )
            };
            let mut agg = Map::new();
            if let Some((k, _)) = groups.last() {
                agg.insert("after_key".into(), key_json(k));
            }
            agg.insert(
                "buckets".into(),
                groups
                    .iter()
                    .map(|(k, v)| {
                        let mut b = metrics(v, sub);
                        b.insert("key".into(), key_json(k));
                        b.insert("doc_count".into(), json!(v.len()));
                        Value::Object(b)
                    })
                    .collect(),
            );
            out.insert(name.clone(), Value::Object(agg));
        } else {
            panic!("the fake does not know the aggregation {spec}");
        }
    }
    Value::Object(out)
}

/// A `_search` of `target` over the stored documents.
fn search(docs: &HashMap<(String, String), Map<String, Value>>, target: &str, q: &Value) -> Value {
    let filters = q["query"]["bool"]["filter"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let should = q["query"]["bool"]["should"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if !should.is_empty() {
        assert_eq!(q["query"]["bool"]["minimum_should_match"], json!(1));
    }
    let mut hits: Vec<(&String, &String, &Map<String, Value>)> = docs
        .iter()
        .filter(|((i, _), s)| {
            index_matches(target, i)
                && filters.iter().all(|f| matches_filter(s, f))
                && (should.is_empty() || should.iter().any(|c| matches_clause(i, s, c)))
        })
        .map(|((i, id), s)| (i, id, s))
        .collect();
    let total = hits.len();
    let sort: Vec<(String, bool)> = q["sort"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            let (f, dir) = s.as_object().unwrap().iter().next().unwrap();
            (f.clone(), dir == "desc")
        })
        .collect();
    let sort_values = |s: &Map<String, Value>| -> Vec<Value> {
        sort.iter()
            .map(|(f, _)| field(s, f).unwrap_or(Value::Null))
            .collect()
    };
    let cmp = |a: &[Value], b: &[Value]| {
        for ((x, y), (_, desc)) in a.iter().zip(b).zip(&sort) {
            let o = match (x, y) {
                // Missing values sort last, both ways.
                (Value::Null, Value::Null) => std::cmp::Ordering::Equal,
                (Value::Null, _) => std::cmp::Ordering::Greater,
                (_, Value::Null) => std::cmp::Ordering::Less,
                _ if *desc => cmp_values(y, x),
                _ => cmp_values(x, y),
            };
            if o.is_ne() {
                return o;
            }
        }
        std::cmp::Ordering::Equal
    };
    hits.sort_by(|a, b| cmp(&sort_values(a.2), &sort_values(b.2)));
    if let Some(after) = q["search_after"].as_array() {
        hits.retain(|h| cmp(&sort_values(h.2), after).is_gt());
    }
    let size = q["size"].as_u64().unwrap_or(10) as usize;
    let all: Vec<&Map<String, Value>> = hits.iter().map(|h| h.2).collect();
    let mut answer = json!({
        "took": 1, "timed_out": false,
        "_shards": {"total": 1, "successful": 1, "skipped": 0, "failed": 0},
        "hits": {"max_score": null, "hits": hits.iter().take(size).map(|(i, id, s)| json!({
            "_index": i, "_id": id, "_score": null,
            "_source": filtered(s, &q["_source"]),
            "sort": sort_values(s)
        })).collect::<Vec<_>>()}
    });
    if q["track_total_hits"] != json!(false) {
        answer["hits"]["total"] = json!({"value": total, "relation": "eq"});
    }
    if let Some(aggs) = q.get("aggs") {
        answer["aggregations"] = aggregate(&all, aggs);
    }
    answer
}

/// `src` as a `_source` parameter asks for it: `true` or absent, whole;
/// `{"includes": [..]}` those fields; `{"excludes": [..]}` all but those.
fn filtered(src: &Map<String, Value>, spec: &Value) -> Value {
    let names = |k: &str| -> Option<Vec<&str>> {
        spec.get(k)
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
    };
    if spec == &Value::Bool(false) {
        return json!({});
    }
    let mut out = src.clone();
    if let Some(inc) = names("includes") {
        out.retain(|k, _| inc.contains(&k.as_str()));
    }
    if let Some(exc) = names("excludes") {
        out.retain(|k, _| !exc.contains(&k.as_str()));
    }
    Value::Object(out)
}

/// The `get` an update's answer carries: only when the update asked for
/// `_source`, as a real node does.
fn update_get(src: &Map<String, Value>, payload: &Value, call: usize, found: bool) -> Value {
    match payload.get("_source") {
        None | Some(Value::Bool(false)) => Value::Null,
        Some(spec) => json!({"_seq_no": call, "_primary_term": 1, "found": found,
                             "_source": filtered(src, spec)}),
    }
}

/// A `_bulk` of whole documents (`index`, `create`, `delete`: what
/// publication times are written with), answered item by item as a real
/// node does: a create of an existing document is a 409, a delete of a
/// missing one a 404 `not_found`, a write to a missing index with automatic
/// creation off a 404 `index_not_found_exception`.
fn doc_bulk(st: &mut State, lines: &[Value]) -> Value {
    let mut items = Vec::new();
    let mut errors = false;
    let mut i = 0;
    while i < lines.len() {
        let (op, meta) = lines[i].as_object().unwrap().iter().next().unwrap();
        let op = op.clone();
        let index = meta["_index"].as_str().unwrap().to_string();
        let id = meta["_id"].as_str().unwrap().to_string();
        let doc = (op != "delete").then(|| lines[i + 1].clone());
        i += if doc.is_some() { 2 } else { 1 };
        let key = (index.clone(), id.clone());
        let head = json!({"_index": index, "_id": id});
        let mut item = head.clone();
        if st.no_auto_create && !st.indices.contains(&index) && op != "delete" {
            errors = true;
            item["status"] = json!(404);
            item["error"] = json!({"type": "index_not_found_exception",
                "reason": format!("no such index [{index}] and [action.auto_create_index] is [false]"),
                "index_uuid": "_na_", "index": index});
        } else if op == "delete" {
            let found = st.docs.remove(&key).is_some();
            item["result"] = json!(if found { "deleted" } else { "not_found" });
            item["status"] = json!(if found { 200 } else { 404 });
            errors |= !found;
        } else if op == "create" && st.docs.contains_key(&key) {
            errors = true;
            item["status"] = json!(409);
            item["error"] = json!({"type": "version_conflict_engine_exception",
                "reason": format!("[{id}]: version conflict, document already exists (current version [1])"),
                "index": index});
        } else {
            assert!(op == "index" || op == "create", "bulk op {op}");
            let existed = st.docs.contains_key(&key);
            st.bump(&key);
            st.docs
                .insert(key, doc.unwrap().as_object().unwrap().clone());
            st.indices.insert(index.clone());
            item["result"] = json!(if existed { "updated" } else { "created" });
            item["status"] = json!(if existed { 200 } else { 201 });
        }
        items.push(json!({ op: item }));
    }
    json!({"took": 1, "errors": errors, "items": items})
}

fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let h = u8::from_str_radix(&s[i + 1..i + 3], 16).unwrap();
            out.push(h);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

fn es(status: u16, body: Value) -> Response {
    (
        StatusCode::from_u16(status).unwrap(),
        [
            ("content-type", "application/json"),
            ("x-elastic-product", "Elasticsearch"),
        ],
        body.to_string(),
    )
        .into_response()
}

impl Fake {
    fn bulk(&self, query: &str, headers: &HeaderMap, body: Bytes) -> Response {
        let mut st = self.0.lock().unwrap();
        let call = st.bulks.len();
        st.bulk_queries.push(query.to_string());
        let ct = headers
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        st.raw.push((ct, body.to_vec()));
        let text = std::str::from_utf8(&body).unwrap();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        if lines.first().is_some_and(|l| l.get("update").is_none()) {
            return es(200, doc_bulk(&mut st, &lines));
        }
        let ids: Vec<String> = lines
            .chunks(2)
            .map(|c| c[0]["update"]["_id"].as_str().unwrap().to_string())
            .collect();
        st.bulks.push(ids);
        if let Some((status, body)) = st.request_fault.as_ref().and_then(|f| f(call)) {
            // A string body is a proxy's page, not the engine's JSON.
            if let Value::String(page) = body {
                return (
                    StatusCode::from_u16(status).unwrap(),
                    [("content-type", "text/html")],
                    page,
                )
                    .into_response();
            }
            return es(status, body);
        }
        let mut items = Vec::new();
        let mut errors = false;
        for pair in lines.chunks(2) {
            let meta = &pair[0]["update"];
            let payload = &pair[1];
            let index = meta["_index"].as_str().unwrap().to_string();
            let id = meta["_id"].as_str().unwrap().to_string();
            // As a node runs a stored script by its id: day and hour
            // buckets (the same script, other indices) alike.
            let bucket = payload["script"]["id"]
                .as_str()
                .is_some_and(|id| id.contains("bucket-update"));
            let average = index.contains("_average_");
            if bucket {
                assert!(meta["routing"].is_string(), "bucket items are routed");
            }
            assert_eq!(meta["retry_on_conflict"], json!(5));
            assert_eq!(payload["scripted_upsert"], json!(true));
            let mut fault = st.item_fault.as_ref().and_then(|f| f(call, &id));
            if fault.is_none() && st.no_auto_create && !st.indices.contains(&index) {
                // As a node with automatic creation off answers.
                fault = Some((
                    404,
                    json!({"type": "index_not_found_exception",
                        "reason": format!("no such index [{index}] and [action.auto_create_index] is [false]"),
                        "index_uuid": "_na_", "index": index}),
                ));
            }
            if let Some((status, error)) = fault {
                errors = true;
                items.push(json!({"update": {"_index": index, "_id": id, "status": status, "error": error}}));
                continue;
            }
            let key = (index.clone(), id.clone());
            let existed = st.docs.contains_key(&key);
            let mut src = st.docs.get(&key).cloned().unwrap_or_default();
            let params = &payload["script"]["params"];
            if index.contains("_actor_") {
                assert!(meta["routing"].is_string(), "mark items are routed");
                let result = match run_mark_script(&mut src, params) {
                    MarkRun::Noop => "noop",
                    // As OpenSearch 2.19 answers an update that deletes its
                    // document while asking for `_source` (tests/es_real.rs).
                    MarkRun::Delete if payload.get("_source").is_some() => {
                        errors = true;
                        items.push(json!({"update": {"_index": index, "_id": id, "status": 500,
                            "error": {"type": "null_pointer_exception",
                                "reason": "Cannot invoke \"org.opensearch.core.common.bytes.BytesReference.length()\" because \"sourceAsBytes\" is null"}}}));
                        continue;
                    }
                    MarkRun::Delete => {
                        st.docs.remove(&key);
                        st.bump(&key);
                        "deleted"
                    }
                    MarkRun::Write => {
                        st.bump(&key);
                        st.docs.insert(key.clone(), src.clone());
                        st.indices.insert(index.clone());
                        if existed {
                            "updated"
                        } else {
                            "created"
                        }
                    }
                };
                let mut item = json!({
                    "_index": index, "_id": id, "_version": 1, "result": result,
                    "_shards": {"total": 2, "successful": 1, "failed": 0},
                    "_seq_no": call, "_primary_term": 1,
                    "status": if result == "created" { 201 } else { 200 },
                });
                let get = update_get(&src, payload, call, existed || result == "created");
                if !get.is_null() {
                    item["get"] = get;
                }
                items.push(json!({ "update": item }));
                continue;
            }
            let ran = if average {
                run_average_script(&mut src, params, bucket)
            } else {
                run_script(&mut src, params, bucket)
            };
            match ran {
                Ok(()) => {
                    let get = update_get(&src, payload, call, true);
                    st.bump(&key);
                    st.docs.insert(key, src);
                    st.indices.insert(index.clone());
                    let mut item = json!({
                        "_index": index, "_id": id, "_version": 1,
                        "result": if existed { "updated" } else { "created" },
                        "_shards": {"total": 2, "successful": 1, "failed": 0},
                        "_seq_no": call, "_primary_term": 1,
                        "status": if existed { 200 } else { 201 },
                    });
                    if !get.is_null() {
                        item["get"] = get;
                    }
                    items.push(json!({ "update": item }));
                }
                Err(_) => {
                    errors = true;
                    let cid = params["counter_id"].as_str().unwrap();
                    items.push(json!({"update": {"_index": index, "_id": id, "status": 400, "error": overflow_error(cid)}}));
                }
            }
        }
        es(200, json!({"took": 3, "errors": errors, "items": items}))
    }

    fn handle(&self, method: Method, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
        let path = uri.path().to_string();
        let query = uri.query().unwrap_or("").to_string();
        if path == "/_bulk" {
            return self.bulk(&query, &headers, body);
        }
        let mut st = self.0.lock().unwrap();
        st.calls.push(format!("{method} {path}?{query}"));
        let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        match (method.as_str(), parts.as_slice()) {
            ("GET", [""]) if st.opensearch => es(200, fixture("root_opensearch.json")),
            ("GET", [""]) => es(200, fixture("root.json")),
            ("GET", ["_cat", "indices", pattern]) => {
                let mut names: Vec<&String> = st
                    .indices
                    .iter()
                    .filter(|i| index_matches(pattern, i))
                    .collect();
                names.sort();
                es(
                    200,
                    json!(names
                        .iter()
                        .map(|i| json!({"index": i}))
                        .collect::<Vec<_>>()),
                )
            }
            ("DELETE", [index]) if !index.contains('*') && !index.starts_with('_') => {
                if st.indices.remove(*index) {
                    st.docs.retain(|(i, _), _| i != index);
                    es(200, json!({"acknowledged": true}))
                } else {
                    es(404, fixture("get_index_missing.json"))
                }
            }
            // As a default-distribution Elasticsearch answers: ILM is there.
            ("GET", ["_ilm", "status"]) => es(200, json!({"operation_mode": "RUNNING"})),
            ("GET", ["_scripts" | "_ilm" | "_component_template" | "_index_template", ..]) => {
                es(404, json!({}))
            }
            ("PUT", ["_scripts" | "_ilm" | "_component_template" | "_index_template", ..]) => {
                es(200, json!({"acknowledged": true}))
            }
            ("PUT", [index]) if !index.starts_with('_') => {
                if st.refuse_create {
                    let error = json!({"type": "security_exception",
                        "reason": format!("action [indices:admin/create] is unauthorized for user [gw] on indices [{index}]")});
                    let mut root = error.clone();
                    root["root_cause"] = json!([error]);
                    return es(403, json!({"error": root, "status": 403}));
                }
                if st.indices.insert(index.to_string()) {
                    es(
                        200,
                        json!({"acknowledged": true, "shards_acknowledged": true, "index": index}),
                    )
                } else {
                    let error = json!({"type": "resource_already_exists_exception",
                        "reason": format!("index [{index}/hd9IfzcJQJSu3nEWZ1lpJg] already exists"),
                        "index_uuid": "hd9IfzcJQJSu3nEWZ1lpJg", "index": index});
                    let mut root = error.clone();
                    root["root_cause"] = json!([error]);
                    es(400, json!({"error": root, "status": 400}))
                }
            }
            ("GET", [index, "_doc", id]) if st.get_faults > 0 => {
                st.get_faults -= 1;
                // As a real OpenSearch 2.19 node answered a GET on an index
                // whose primary was still recovering.
                let reason =
                    format!("No shard available for [get [{index}][{id}]: routing [null]]");
                let error =
                    json!({"type": "no_shard_available_action_exception", "reason": reason});
                let mut root = error.clone();
                root["root_cause"] = json!([error]);
                root["caused_by"] = json!({"type": "illegal_index_shard_state_exception",
                    "reason": "CurrentState[RECOVERING] operations only allowed when shard state is one of [POST_RECOVERY, STARTED]"});
                es(503, json!({"error": root, "status": 503}))
            }
            ("GET", [index, "_doc", id]) => {
                let key = (index.to_string(), decode(id));
                match st.docs.get(&key) {
                    Some(src) => {
                        let mut f = fixture("get_found.json");
                        f["_index"] = json!(index);
                        f["_id"] = json!(decode(id));
                        f["_seq_no"] = json!(st.seq.get(&key).copied().unwrap_or(0));
                        f["_source"] = Value::Object(src.clone());
                        es(200, f)
                    }
                    None => es(404, fixture("get_missing.json")),
                }
            }
            // Backfill: a conditional index, a create, the counter-set
            // script, a mapping put, a multi-index `_mget`, as the Index,
            // Update, Put mapping and Multi get APIs answer them.
            ("PUT", [index, op @ ("_doc" | "_create"), id]) => {
                assert!(
                    query.contains("routing="),
                    "bucket writes are routed: {query}"
                );
                let key = (index.to_string(), decode(id));
                let if_seq = query
                    .split('&')
                    .find_map(|kv| kv.strip_prefix("if_seq_no="))
                    .map(|v| v.parse::<i64>().unwrap());
                let conflict = match (*op, if_seq) {
                    ("_create", _) => st.docs.contains_key(&key),
                    (_, Some(want)) => st.seq.get(&key) != Some(&want),
                    (_, None) => false,
                };
                if conflict {
                    return es(
                        409,
                        json!({"error": {"type": "version_conflict_engine_exception",
                            "reason": format!("[{}]: version conflict", key.1)}, "status": 409}),
                    );
                }
                let src: Value = serde_json::from_slice(&body).unwrap();
                let created = !st.docs.contains_key(&key);
                let seq = st.bump(&key);
                st.docs.insert(key, src.as_object().unwrap().clone());
                st.indices.insert(index.to_string());
                es(
                    if created { 201 } else { 200 },
                    json!({"_index": index, "_id": decode(id), "_seq_no": seq, "_primary_term": 1,
                           "result": if created { "created" } else { "updated" }}),
                )
            }
            ("POST", [index, "_update", id]) => {
                if st.refuse_updates {
                    return es(
                        503,
                        json!({"error": {"type": "unavailable_shards_exception",
                            "reason": format!("[{index}][0] primary shard is not active")}, "status": 503}),
                    );
                }
                let payload: Value = serde_json::from_slice(&body).unwrap();
                let key = (index.to_string(), decode(id));
                if let Some(doc) = payload["doc"].as_object() {
                    // A set of a counter's value: a partial document merged
                    // into the source, or the `upsert` indexed whole when
                    // there is none; unchanged is a `noop` (`detect_noop`,
                    // on by default), as the Update API answers.
                    assert!(
                        payload.get("script").is_none(),
                        "a doc update has no script"
                    );
                    let (src, result, status) = match st.docs.get(&key) {
                        None => (
                            payload["upsert"].as_object().unwrap().clone(),
                            "created",
                            201,
                        ),
                        Some(old) => {
                            let mut merged = old.clone();
                            for (k, v) in doc {
                                merged.insert(k.clone(), v.clone());
                            }
                            let same = &merged == old;
                            (merged, if same { "noop" } else { "updated" }, 200)
                        }
                    };
                    if result != "noop" {
                        st.bump(&key);
                        st.docs.insert(key.clone(), src);
                        st.indices.insert(index.to_string());
                    }
                    return es(
                        status,
                        json!({"_index": index, "_id": key.1, "result": result}),
                    );
                }
                assert_eq!(payload["scripted_upsert"], json!(true));
                let mut src = st.docs.get(&key).cloned().unwrap_or_default();
                let params = &payload["script"]["params"];
                match run_set_script(&mut src, params) {
                    Ok(false) => es(
                        200,
                        json!({"_index": index, "_id": key.1, "result": "noop"}),
                    ),
                    Ok(true) => {
                        st.bump(&key);
                        st.docs.insert(key.clone(), src);
                        st.indices.insert(index.to_string());
                        es(
                            200,
                            json!({"_index": index, "_id": key.1, "result": "updated"}),
                        )
                    }
                    Err(_) => {
                        let cid = params["counter_id"].as_str().unwrap();
                        es(400, json!({"error": overflow_error(cid), "status": 400}))
                    }
                }
            }
            ("GET", [index, "_mapping"]) if !index.contains('*') && !index.contains(',') => {
                if st.indices.contains(*index) {
                    let meta = st.metas.get(*index).cloned().unwrap_or_default();
                    es(200, json!({ *index: {"mappings": {"_meta": meta}} }))
                } else {
                    es(404, fixture("get_index_missing.json"))
                }
            }
            ("PUT", [index, "_mapping"]) => {
                // A pattern matching no index is acknowledged (as OpenSearch
                // 2.19 answers setup's upgrade of the mark indices).
                if st.indices.contains(*index) || index.contains('*') {
                    let put: Value = serde_json::from_slice(&body).unwrap_or_default();
                    if let (Some(meta), false) = (put["_meta"].as_object(), index.contains('*')) {
                        st.metas.insert(index.to_string(), meta.clone());
                    }
                    es(200, json!({"acknowledged": true}))
                } else {
                    es(404, fixture("get_index_missing.json"))
                }
            }
            ("POST", ["_mget"]) => {
                let q: Value = serde_json::from_slice(&body).unwrap();
                let docs: Vec<Value> = q["docs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|d| {
                        let (index, id) =
                            (d["_index"].as_str().unwrap(), d["_id"].as_str().unwrap());
                        match st.docs.get(&(index.to_string(), id.to_string())) {
                            Some(src) => {
                                json!({"_index": index, "_id": id, "found": true, "_source": src})
                            }
                            None => json!({"_index": index, "_id": id, "found": false}),
                        }
                    })
                    .collect();
                es(200, json!({"docs": docs}))
            }
            ("POST", [target, "_search"])
                if serde_json::from_slice::<Value>(&body).unwrap()["aggs"]["indices"]["terms"]
                    ["field"]
                    == "_index" =>
            {
                // Documents per index (how the store tells whether a
                // tenant holds marks), as a terms aggregation on `_index`.
                let mut per: HashMap<&String, u64> = HashMap::new();
                for (i, _) in st.docs.keys() {
                    if index_matches(target, i) {
                        *per.entry(i).or_default() += 1;
                    }
                }
                let buckets: Vec<Value> = per
                    .iter()
                    .map(|(i, n)| json!({"key": i, "doc_count": n}))
                    .collect();
                es(
                    200,
                    json!({"hits": {"hits": []}, "aggregations": {"indices": {"buckets": buckets}}}),
                )
            }
            ("POST", [target, "_search"]) => {
                let q: Value = serde_json::from_slice(&body).unwrap();
                st.searches
                    .push((target.to_string(), query.clone(), q.clone()));
                es(200, search(&st.docs, target, &q))
            }
            ("POST", [index, "_mget"]) => {
                // The Multi get API refuses parameters it does not take.
                for p in ["ignore_unavailable", "allow_no_indices"] {
                    if query.contains(p) {
                        return es(
                            400,
                            json!({"error": {"type": "illegal_argument_exception",
                            "reason": format!("request [/{index}/_mget] contains unrecognized parameter: [{p}]")}, "status": 400}),
                        );
                    }
                }
                let q: Value = serde_json::from_slice(&body).unwrap();
                let ids = q["ids"].as_array().unwrap();
                // As the real node answers (tests/es_real.rs): an empty list
                // is refused, and a missing index is an error per document
                // inside a 200.
                if ids.is_empty() {
                    let error = json!({"type": "action_request_validation_exception",
                        "reason": "Validation Failed: 1: no documents to get;"});
                    return es(
                        400,
                        json!({"error": {"root_cause": [error.clone()], "type": error["type"], "reason": error["reason"]}, "status": 400}),
                    );
                }
                let missing = !st.indices.contains(*index);
                let docs: Vec<Value> = ids
                    .iter()
                    .map(|id| {
                        let id = id.as_str().unwrap();
                        if missing {
                            let error = json!({"type": "index_not_found_exception",
                                "reason": format!("no such index [{index}]"), "index": index,
                                "resource.id": index, "resource.type": "index_expression", "index_uuid": "_na_"});
                            let mut full = error.clone();
                            full["root_cause"] = json!([error]);
                            return json!({"_index": index, "_id": id, "error": full});
                        }
                        match st.docs.get(&(index.to_string(), id.to_string())) {
                            Some(src) => json!({"_index": index, "_id": id, "_version": 1,
                                "_seq_no": 0, "_primary_term": 1, "found": true, "_source": src}),
                            None => json!({"_index": index, "_id": id, "found": false}),
                        }
                    })
                    .collect();
                es(200, json!({"docs": docs}))
            }
            ("POST", [_, "_refresh"]) => es(
                200,
                json!({"_shards": {"total": 1, "successful": 1, "failed": 0}}),
            ),
            ("POST", [pattern, "_delete_by_query"]) => {
                let q: Value = serde_json::from_slice(&body).unwrap();
                let cid = q["query"]["term"]["counter_id"].clone();
                // Routed, unless a comma in the id would split the routing.
                assert_eq!(
                    query.contains("routing="),
                    !cid.as_str().unwrap().contains(','),
                    "bucket deletes are routed by counter id: {query}"
                );
                let before = st.docs.len();
                let target = pattern.to_string();
                st.docs
                    .retain(|(i, _), s| !(index_matches(&target, i) && s["counter_id"] == cid));
                let mut f = fixture("delete_by_query.json");
                let deleted = before - st.docs.len();
                f["deleted"] = json!(deleted);
                f["total"] = json!(deleted);
                es(200, f)
            }
            ("DELETE", [index, "_doc", id]) => {
                if st.docs.remove(&(index.to_string(), decode(id))).is_some() {
                    es(200, fixture("delete_found.json"))
                } else {
                    es(404, fixture("delete_not_found.json"))
                }
            }
            _ => es(
                400,
                json!({"error": {"type": "unexpected", "reason": format!("{method} {path}")}, "status": 400}),
            ),
        }
    }

    async fn start(&self) -> SocketAddr {
        let fake = self.clone();
        let app = Router::new()
            .fallback(
                move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
                    let fake = fake.clone();
                    async move { fake.handle(method, uri, headers, body) }
                },
            )
            // A node takes bodies up to `http.max_content_length`, 100 MB by
            // default, not axum's 2 MB.
            .layer(axum::extract::DefaultBodyLimit::max(100 * 1024 * 1024));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        addr
    }

    fn set_item_fault(&self, f: impl Fn(usize, &str) -> Option<(u16, Value)> + Send + 'static) {
        self.0.lock().unwrap().item_fault = Some(Box::new(f));
    }

    fn set_request_fault(&self, f: impl Fn(usize) -> Option<(u16, Value)> + Send + 'static) {
        self.0.lock().unwrap().request_fault = Some(Box::new(f));
    }

    fn bulks(&self) -> Vec<Vec<String>> {
        self.0.lock().unwrap().bulks.clone()
    }

    fn value(&self, index: &str, id: &str) -> Option<i64> {
        let st = self.0.lock().unwrap();
        st.docs
            .get(&(index.to_string(), id.to_string()))
            .map(|s| s["value"].as_i64().unwrap())
    }

    fn put_value(&self, index: &str, id: &str, value: i64) {
        let mut st = self.0.lock().unwrap();
        let (e, a, u) = counter_gateway::domain::decode_doc_id(id).unwrap();
        let now = now().timestamp_millis();
        let src = json!({"counter_id": id, "entity": e, "action": a, "uuid": u, "value": value,
            "first_timestamp": now, "recorded_timestamp": now});
        st.docs.insert(
            (index.to_string(), id.to_string()),
            src.as_object().unwrap().clone(),
        );
    }
}

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

const COUNTERS: &str = "counter-gateway_default_counters";

fn today_buckets() -> String {
    format!(
        "counter-gateway_default_histogram_counters-{}",
        now().format("%Y.%m")
    )
}

fn bucket_id(counter_id: &str) -> String {
    format!("{counter_id}@{}", now().format("%Y-%m-%d"))
}

/// The id of a counter's hour document of the tests' now.
fn hour_id(counter_id: &str) -> String {
    format!("{counter_id}@{}", now().format("%Y-%m-%dT%H"))
}

/// The tests' now: the clock every store and app here reads stands at it.
fn now() -> DateTime<Utc> {
    common::test_now()
}

fn clock() -> Clock {
    ManualClock::new(now()).clock()
}

fn store_at(url: &str) -> Arc<ElasticsearchStore> {
    store_with_clock(url, clock())
}

fn store_with_clock(url: &str, clock: Clock) -> Arc<ElasticsearchStore> {
    let mut cfg = EsConfig::new(url, "counter-gateway", "default").unwrap();
    cfg.backoff = Backoff::for_test();
    cfg.request_timeout = Duration::from_secs(5);
    Arc::new(ElasticsearchStore::new(cfg, clock).unwrap())
}

fn app(store: Arc<ElasticsearchStore>) -> Router {
    app_with_clock(store, clock())
}

fn app_with_clock(store: Arc<ElasticsearchStore>, clock: Clock) -> Router {
    let metrics = Arc::new(Metrics::default());
    let config = PipelineConfig {
        ack_timeout: Duration::from_secs(5),
        ..PipelineConfig::default()
    };
    let (pipeline, _flusher) = Pipeline::start(store.clone(), config, metrics.clone());
    router(AppState {
        store,
        pipeline,
        time_policy: TimePolicy::default(),
        clock,
        limits: Limits::default(),
        metrics,
        actors: runner::actors(),
        pending: None,
    })
}

async fn call(router: &Router, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let mut req = Request::builder().method(method).uri(path);
    let body = match body {
        Some(b) => {
            req = req.header("content-type", "application/json");
            Body::from(b.to_string())
        }
        None => Body::empty(),
    };
    let res = router
        .clone()
        .oneshot(req.body(body).unwrap())
        .await
        .unwrap();
    let status = res.status().as_u16();
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

fn inc(uuid: &str, count: i64, id: Option<&str>) -> Increment {
    let spec = IncrementSpec {
        entity: "VIDEO",
        action: "VIEW",
        uuid,
        count: Some(count),
        id,
        ..Default::default()
    };
    Increment::from_spec(&spec, &TimePolicy::default(), now()).unwrap()
}

fn cid(uuid: &str) -> String {
    format!("VIDEO_VIEW_{uuid}")
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

#[tokio::test]
async fn increments_read_list_and_delete_through_the_router() {
    let fake = Fake::default();
    let addr = fake.start().await;
    let router = app(store_at(&format!("http://{addr}")));

    let (status, body) = call(
        &router,
        "POST",
        "/v1/counters/VIDEO/VIEW/u1/increment",
        Some(json!({"count": 2, "category": "sports"})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["value"], 2);
    assert_eq!(body["category"], "sports");
    let (status, body) = call(
        &router,
        "POST",
        "/v1/counters/VIDEO/VIEW/u1/decrement",
        None,
    )
    .await;
    assert_eq!((status, &body["value"]), (200, &json!(1)));
    call(
        &router,
        "POST",
        "/v1/counters/VIDEO/like/u1/increment",
        None,
    )
    .await;

    // One bulk per flush, a counter item, a day and an hour bucket item
    // each, as NDJSON.
    let bulks = fake.bulks();
    assert_eq!(bulks.len(), 3);
    assert_eq!(
        bulks[0],
        vec![cid("u1"), bucket_id(&cid("u1")), hour_id(&cid("u1"))]
    );
    {
        let st = fake.0.lock().unwrap();
        for (ct, raw) in &st.raw {
            assert_eq!(ct, "application/x-ndjson");
            assert!(raw.ends_with(b"\n"));
        }
    }
    assert_eq!(
        fake.value(&today_buckets(), &bucket_id(&cid("u1"))),
        Some(1)
    );

    let (status, body) = call(&router, "GET", "/v1/counters/VIDEO/VIEW/u1", None).await;
    assert_eq!((status, &body["value"]), (200, &json!(1)));
    let (status, body) = call(&router, "GET", "/v1/targets/VIDEO/u1/counters", None).await;
    assert_eq!(status, 200);
    let actions: Vec<_> = body["counters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["VIEW", "like"]);

    let (status, _) = call(&router, "DELETE", "/v1/counters/VIDEO/VIEW/u1", None).await;
    assert_eq!(status, 200);
    assert_eq!(fake.value(&today_buckets(), &bucket_id(&cid("u1"))), None);
    let (status, _) = call(&router, "GET", "/v1/counters/VIDEO/VIEW/u1", None).await;
    assert_eq!(status, 404);
    let (status, _) = call(&router, "DELETE", "/v1/counters/VIDEO/VIEW/u1", None).await;
    assert_eq!(status, 404);
    let (status, _) = call(&router, "GET", "/readyz", None).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn mixed_item_errors_resend_only_the_failed_items() {
    let fake = Fake::default();
    let addr = fake.start().await;
    let store = store_at(&format!("http://{addr}"));
    let b_counter = cid("b");
    let c_bucket = bucket_id(&cid("c"));
    let (bc, cb) = (b_counter.clone(), c_bucket.clone());
    fake.set_item_fault(move |call, id| match call {
        0 if id == bc => Some((429, item_error(429))),
        0 if id == cb => Some((503, item_error(503))),
        _ => None,
    });
    let batch = WriteBatch {
        requests: vec![
            vec![inc("a", 1, None)],
            vec![inc("b", 2, None)],
            vec![inc("c", 3, None), inc("a", 4, None)],
        ],
        wanted: [CounterKey::new("VIDEO", "VIEW", "b").unwrap()].into(),
    };
    let out = store.apply(batch).await.unwrap();
    assert_eq!(
        out.requests,
        vec![RequestOutcome::Applied { duplicates: 0 }; 3]
    );
    let bulks = fake.bulks();
    assert_eq!(bulks.len(), 2);
    assert_eq!(
        bulks[0].len(),
        9,
        "a, b, c: counter, day and hour bucket each (a coalesced)"
    );
    assert_eq!(
        bulks[1],
        vec![b_counter.clone(), c_bucket.clone()],
        "only the failed items are resent"
    );
    assert_eq!(out.store_writes, 11);
    // Nothing applied twice.
    assert_eq!(fake.value(COUNTERS, &cid("a")), Some(5));
    assert_eq!(fake.value(COUNTERS, &cid("b")), Some(2));
    assert_eq!(fake.value(&today_buckets(), &c_bucket), Some(3));
    assert_eq!(
        out.counters[&CounterKey::new("VIDEO", "VIEW", "b").unwrap()].value,
        2
    );
    assert_eq!(
        out.counters.len(),
        1,
        "only the wanted counter is read back"
    );
}

#[tokio::test]
async fn a_bulk_refused_with_429_is_resent_whole_once_accepted() {
    let fake = Fake::default();
    let addr = fake.start().await;
    let store = store_at(&format!("http://{addr}"));
    fake.set_request_fault(|call| (call < 2).then(|| (429, fixture("bulk_request_429.json"))));
    let out = store
        .apply(WriteBatch {
            requests: vec![vec![inc("a", 1, None)]],
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        out.requests,
        vec![RequestOutcome::Applied { duplicates: 0 }]
    );
    assert_eq!(fake.bulks().len(), 3);
    assert_eq!(fake.value(COUNTERS, &cid("a")), Some(1));
}

/// A read changes nothing: a GET a recovering shard answered 503 is asked
/// again (a real node answered so right after three gateways created the
/// index), within the backoff budget; past it the read is unavailable.
#[tokio::test]
async fn a_counter_read_a_recovering_shard_refused_is_asked_again() {
    let fake = Fake::default();
    let addr = fake.start().await;
    let store = store_at(&format!("http://{addr}"));
    store
        .apply(WriteBatch {
            requests: vec![vec![inc("a", 1, None)]],
            ..Default::default()
        })
        .await
        .unwrap();
    fake.0.lock().unwrap().get_faults = 2;
    let key = CounterKey::new("VIDEO", "VIEW", "a").unwrap();
    let got = Store::get(&*store, &key).await.unwrap();
    assert_eq!(got.map(|c| c.value), Some(1));
    assert_eq!(fake.0.lock().unwrap().get_faults, 0);
    fake.0.lock().unwrap().get_faults = 10_000;
    let err = Store::get(&*store, &key).await.unwrap_err();
    assert!(
        matches!(err, counter_gateway::store::StoreError::Unavailable(_)),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_bulk_refused_by_the_engine_with_503_is_resent() {
    let fake = Fake::default();
    let addr = fake.start().await;
    let store = store_at(&format!("http://{addr}"));
    fake.set_request_fault(|call| (call < 1).then(|| (503, fixture("bulk_request_503.json"))));
    let out = store
        .apply(WriteBatch {
            requests: vec![vec![inc("a", 1, None)]],
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        out.requests,
        vec![RequestOutcome::Applied { duplicates: 0 }]
    );
    assert_eq!(fake.bulks().len(), 2);
    assert_eq!(fake.value(COUNTERS, &cid("a")), Some(1));
}

#[tokio::test]
async fn a_bulk_a_proxy_answered_502_or_504_is_never_resent() {
    // A proxy's 502/504 may come after the cluster applied the bulk:
    // resending would count every event without an id twice.
    let page = "<html><body><h1>504 Gateway Time-out</h1></body></html>";
    for (status, body) in [
        (502, json!(page)),
        (504, json!(page)),
        (503, json!({"message": "no healthy upstream"})),
    ] {
        let fake = Fake::default();
        let addr = fake.start().await;
        let store = store_at(&format!("http://{addr}"));
        let answer = body.clone();
        fake.set_request_fault(move |_| Some((status, answer.clone())));
        let out = store
            .apply(WriteBatch {
                requests: vec![vec![inc("a", 1, None)]],
                ..Default::default()
            })
            .await
            .unwrap();
        assert!(
            matches!(&out.requests[0], RequestOutcome::Failed { reason } if reason.contains("outcome unknown")),
            "{status}: {:?}",
            out.requests[0]
        );
        assert_eq!(fake.bulks().len(), 1, "{status} {body}: sent once");
    }
}

#[tokio::test]
async fn each_bulk_asks_the_engine_to_give_up_before_the_client_does() {
    let fake = Fake::default();
    let addr = fake.start().await;
    // The tests' client timeout is 5 s: the engine gets 4 s.
    let store = store_at(&format!("http://{addr}"));
    fake.set_request_fault(|call| (call < 1).then(|| (429, fixture("bulk_request_429.json"))));
    store
        .apply(WriteBatch {
            requests: vec![vec![inc("a", 1, None)]],
            ..Default::default()
        })
        .await
        .unwrap();
    let queries = fake.0.lock().unwrap().bulk_queries.clone();
    assert_eq!(queries, vec!["timeout=4000ms", "timeout=4000ms"]);
}

#[tokio::test]
async fn a_flush_with_many_event_ids_is_sent_as_runs_that_bound_script_loops() {
    let fake = Fake::default();
    let addr = fake.start().await;
    let store = store_at(&format!("http://{addr}"));
    let request = |from: usize| -> Vec<Increment> {
        (from..from + 6_000)
            .map(|i| inc("a", 1, Some(&format!("e{i}"))))
            .collect()
    };
    let out = store
        .apply(WriteBatch {
            requests: vec![request(0), request(6_000)],
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        out.requests,
        vec![RequestOutcome::Applied { duplicates: 0 }; 2]
    );
    // 12,000 ids on one document: two bulks of 6,000 each, not one script
    // run over all of them.
    assert_eq!(fake.bulks().len(), 2);
    assert_eq!(fake.value(COUNTERS, &cid("a")), Some(12_000));
}

fn index_puts(fake: &Fake) -> Vec<String> {
    let calls = fake.0.lock().unwrap().calls.clone();
    calls
        .into_iter()
        .filter(|c| c.starts_with("PUT /counter-gateway_"))
        .map(|c| {
            c.trim_start_matches("PUT /")
                .trim_end_matches('?')
                .to_string()
        })
        .collect()
}

#[tokio::test]
async fn bucket_indices_are_created_ahead_without_automatic_creation() {
    let fake = Fake::default();
    fake.0.lock().unwrap().no_auto_create = true;
    // The counters indices exist (setup's operator made them); the monthly
    // bucket indices are the store's to create.
    for index in [COUNTERS, "counter-gateway_default_average_counters"] {
        fake.0.lock().unwrap().indices.insert(index.into());
    }
    let addr = fake.start().await;
    let clock = ManualClock::new(now());
    let store = store_with_clock(&format!("http://{addr}"), clock.clock());
    let month = |t: DateTime<Utc>| t.format("%Y.%m").to_string();
    let next = now()
        .date_naive()
        .with_day(1)
        .unwrap()
        .checked_add_months(chrono::Months::new(1))
        .unwrap()
        .and_hms_opt(12, 0, 0)
        .unwrap()
        .and_utc();
    let one = || WriteBatch {
        requests: vec![vec![inc("a", 1, None)]],
        ..Default::default()
    };
    let out = store.apply(one()).await.unwrap();
    assert_eq!(
        out.requests,
        vec![RequestOutcome::Applied { duplicates: 0 }]
    );
    let this = month(now());
    assert_eq!(
        index_puts(&fake),
        vec![
            format!("counter-gateway_default_histogram_counters-{this}"),
            format!("counter-gateway_default_average_histogram_counters-{this}"),
            format!("counter-gateway_default_hour_counters-{this}"),
            format!("counter-gateway_default_histogram_counters-{}", month(next)),
            format!(
                "counter-gateway_default_average_histogram_counters-{}",
                month(next)
            ),
            format!("counter-gateway_default_hour_counters-{}", month(next)),
        ]
    );
    // The common flush: no round trip before the bulk.
    store.apply(one()).await.unwrap();
    assert_eq!(index_puts(&fake).len(), 6);
    assert_eq!(fake.value(&today_buckets(), &bucket_id(&cid("a"))), Some(2));

    // On the first day of the next month its index is there already; the
    // month after is created, once, and an existing index is fine.
    fake.0.lock().unwrap().indices.insert(format!(
        "counter-gateway_default_histogram_counters-{}",
        month(next + chrono::Months::new(1))
    ));
    clock.set(next);
    let spec = IncrementSpec {
        entity: "VIDEO",
        action: "VIEW",
        uuid: "a",
        count: Some(1),
        ..Default::default()
    };
    let late = Increment::from_spec(&spec, &TimePolicy::default(), next).unwrap();
    let out = store
        .apply(WriteBatch {
            requests: vec![vec![late]],
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        out.requests,
        vec![RequestOutcome::Applied { duplicates: 0 }]
    );
    assert_eq!(index_puts(&fake).len(), 9);
    store.apply(one()).await.unwrap();
    assert_eq!(index_puts(&fake).len(), 9);
}

#[tokio::test]
async fn a_refused_index_creation_does_not_fail_writes_automatic_creation_allows() {
    let fake = Fake::default();
    fake.0.lock().unwrap().refuse_create = true;
    let addr = fake.start().await;
    let store = store_at(&format!("http://{addr}"));
    for flush in 1..=2 {
        let out = store
            .apply(WriteBatch {
                requests: vec![vec![inc("a", 1, None)]],
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(
            out.requests,
            vec![RequestOutcome::Applied { duplicates: 0 }]
        );
        // One attempt per flush (the first failure ends it), tried again
        // at the next flush since nothing was made sure of.
        assert_eq!(index_puts(&fake).len(), flush);
    }
    assert_eq!(fake.value(&today_buckets(), &bucket_id(&cid("a"))), Some(2));
}

#[tokio::test]
async fn without_ilm_the_store_deletes_expired_bucket_months_in_the_background() {
    let month = |months_ago: u32| (now() - chrono::Months::new(months_ago)).format("%Y.%m");
    let expired = format!("counter-gateway_default_histogram_counters-{}", month(15));
    let kept = format!("counter-gateway_default_histogram_counters-{}", month(12));
    // Hours: kept 14 days, so two months back is gone, this month is not.
    let expired_hours = format!("counter-gateway_default_hour_counters-{}", month(2));
    let kept_hours = format!("counter-gateway_default_hour_counters-{}", month(0));
    for opensearch in [false, true] {
        let fake = Fake::default();
        {
            let mut st = fake.0.lock().unwrap();
            st.opensearch = opensearch;
            st.indices.insert(expired.clone());
            st.indices.insert(kept.clone());
            st.indices.insert(COUNTERS.into());
        }
        let addr = fake.start().await;
        let store = store_at(&format!("http://{addr}"));
        {
            let mut st = fake.0.lock().unwrap();
            st.indices.insert(expired_hours.clone());
            st.indices.insert(kept_hours.clone());
        }
        let task = tokio::spawn(store.run_retention(400));
        let deadline = std::time::Instant::now() + Duration::from_secs(3);
        // The first sweep runs at start; the task then sleeps till
        // tomorrow. Hour indices are the gateway's to delete on every
        // engine; day buckets only where there is no ILM policy.
        while fake.0.lock().unwrap().indices.contains(&expired_hours) {
            assert!(std::time::Instant::now() < deadline, "not deleted");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if opensearch {
            while fake.0.lock().unwrap().indices.contains(&expired) {
                assert!(std::time::Instant::now() < deadline, "not deleted");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        } else {
            // Elasticsearch: past the engine's answer, the task only sleeps.
            while !fake
                .0
                .lock()
                .unwrap()
                .calls
                .iter()
                .any(|c| c.starts_with("GET /?"))
            {
                assert!(std::time::Instant::now() < deadline, "engine never asked");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        task.abort();
        let st = fake.0.lock().unwrap();
        assert_eq!(st.indices.contains(&expired), !opensearch);
        assert!(st.indices.contains(&kept) && st.indices.contains(COUNTERS));
        assert!(st.indices.contains(&kept_hours) && !st.indices.contains(&expired_hours));
    }
}

#[tokio::test]
async fn a_conflict_that_outlives_retry_on_conflict_is_retried() {
    let fake = Fake::default();
    let addr = fake.start().await;
    let store = store_at(&format!("http://{addr}"));
    let a = cid("a");
    fake.set_item_fault(move |call, id| (call < 2 && id == a).then(|| (409, item_error(409))));
    let out = store
        .apply(WriteBatch {
            requests: vec![vec![inc("a", 1, None)]],
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        out.requests,
        vec![RequestOutcome::Applied { duplicates: 0 }]
    );
    let bulks = fake.bulks();
    assert_eq!(bulks.len(), 3);
    assert_eq!(bulks[1], vec![cid("a")]);
    assert_eq!(bulks[2], vec![cid("a")]);
    assert_eq!(fake.value(COUNTERS, &cid("a")), Some(1));
    assert_eq!(fake.value(&today_buckets(), &bucket_id(&cid("a"))), Some(1));
}

#[tokio::test]
async fn a_persistent_503_fails_only_its_requests_after_the_budget() {
    let fake = Fake::default();
    let addr = fake.start().await;
    let store = store_at(&format!("http://{addr}"));
    let b = cid("b");
    fake.set_item_fault(move |_, id| (id == b).then(|| (503, item_error(503))));
    let started = std::time::Instant::now();
    let out = store
        .apply(WriteBatch {
            requests: vec![vec![inc("a", 1, None)], vec![inc("b", 1, None)]],
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the budget bounds the wait"
    );
    assert_eq!(out.requests[0], RequestOutcome::Applied { duplicates: 0 });
    assert!(
        matches!(&out.requests[1], RequestOutcome::Failed { reason } if reason.contains("unavailable_shards_exception")),
        "{:?}",
        out.requests[1]
    );
    let bulks = fake.bulks();
    assert!(bulks.len() > 2);
    for resend in &bulks[1..] {
        assert_eq!(resend, &vec![cid("b")], "applied items are never resent");
    }
    // Not atomic across documents: b's bucket landed though b failed.
    assert_eq!(fake.value(&today_buckets(), &bucket_id(&cid("b"))), Some(1));
    assert_eq!(fake.value(COUNTERS, &cid("a")), Some(1));
}

#[tokio::test]
async fn a_coalesced_overflow_refuses_exactly_the_overflowing_requests() {
    let fake = Fake::default();
    let addr = fake.start().await;
    let store = store_at(&format!("http://{addr}"));
    fake.put_value(COUNTERS, &cid("k"), i64::MAX - 1);
    // r0 fits; r1 fits only without r0; r1 also touches j, which must not
    // keep r1's part; r2 on j alone is fine.
    let batch = WriteBatch {
        requests: vec![
            vec![inc("k", 1, None)],
            vec![inc("j", 5, None), inc("k", 1, None)],
            vec![inc("j", 1, None)],
        ],
        wanted: [CounterKey::new("VIDEO", "VIEW", "k").unwrap()].into(),
    };
    let out = store.apply(batch).await.unwrap();
    assert_eq!(out.requests[0], RequestOutcome::Applied { duplicates: 0 });
    assert_eq!(
        out.requests[1],
        RequestOutcome::Overflow {
            key: CounterKey::new("VIDEO", "VIEW", "k").unwrap()
        }
    );
    assert_eq!(out.requests[2], RequestOutcome::Applied { duplicates: 0 });
    assert_eq!(fake.value(COUNTERS, &cid("k")), Some(i64::MAX));
    assert_eq!(fake.value(COUNTERS, &cid("j")), Some(1));
    assert_eq!(fake.value(&today_buckets(), &bucket_id(&cid("j"))), Some(1));
    assert_eq!(fake.value(&today_buckets(), &bucket_id(&cid("k"))), Some(1));
    assert_eq!(
        out.counters[&CounterKey::new("VIDEO", "VIEW", "k").unwrap()].value,
        i64::MAX
    );
}

#[tokio::test]
async fn the_client_sees_409_on_overflow() {
    let fake = Fake::default();
    let addr = fake.start().await;
    let router = app(store_at(&format!("http://{addr}")));
    fake.put_value(COUNTERS, &cid("k"), i64::MAX);
    let (status, body) = call(&router, "POST", "/v1/counters/VIDEO/VIEW/k/increment", None).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["type"], "counter_overflow");
    assert_eq!(fake.value(COUNTERS, &cid("k")), Some(i64::MAX));
    // The bucket that landed in the same bulk was taken back.
    assert_eq!(fake.value(&today_buckets(), &bucket_id(&cid("k"))), Some(0));
}

#[tokio::test]
async fn event_ids_are_counted_once_and_repair_a_partial_failure() {
    let fake = Fake::default();
    let addr = fake.start().await;
    let store = store_at(&format!("http://{addr}"));
    let bucket = bucket_id(&cid("a"));
    let failing = bucket.clone();
    // First flush: the bucket item keeps failing, the counter item lands.
    fake.set_item_fault(move |call, id| {
        (call < 100 && id == failing).then(|| (503, item_error(503)))
    });
    let out = store
        .apply(WriteBatch {
            requests: vec![vec![inc("a", 1, Some("e1"))]],
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(matches!(out.requests[0], RequestOutcome::Failed { .. }));
    assert_eq!(fake.value(COUNTERS, &cid("a")), Some(1));
    assert_eq!(fake.value(&today_buckets(), &bucket), None);
    // The client retries with the same id: the counter skips it, the bucket takes it.
    fake.set_item_fault(|_, _| None);
    let out = store
        .apply(WriteBatch {
            requests: vec![vec![inc("a", 1, Some("e1"))], vec![inc("a", 1, Some("e1"))]],
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(out.requests[0], RequestOutcome::Applied { duplicates: 1 });
    assert_eq!(out.requests[1], RequestOutcome::Applied { duplicates: 1 });
    assert_eq!(fake.value(COUNTERS, &cid("a")), Some(1));
    assert_eq!(fake.value(&today_buckets(), &bucket), Some(1));
}

#[tokio::test]
async fn unreachable_elasticsearch_fails_readiness_and_writes_with_503() {
    // A port nobody listens on: connection refused.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let router = app(store_at(&format!("http://{addr}")));
    let (status, body) = call(&router, "GET", "/readyz", None).await;
    assert_eq!(status, 503, "{body}");
    let started = std::time::Instant::now();
    let (status, body) = call(&router, "POST", "/v1/counters/VIDEO/VIEW/a/increment", None).await;
    assert_eq!(status, 503, "{body}");
    // The cause (connection refused) goes to the log; the client gets the
    // stable type, what may have happened, and the log's request id.
    assert_eq!(body["error"]["type"], "unavailable", "{body}");
    let reason = body["error"]["reason"].as_str().unwrap();
    assert!(reason.contains("logged as req-"), "{body}");
    assert!(!reason.contains("127.0.0.1"), "{body}");
    assert!(started.elapsed() < Duration::from_secs(3));
    let (status, _) = call(&router, "GET", "/v1/counters/VIDEO/VIEW/a", None).await;
    assert_eq!(status, 503);
}

#[tokio::test]
async fn setup_installs_every_object_in_order() {
    let fake = Fake::default();
    let addr = fake.start().await;
    let store = store_at(&format!("http://{addr}"));
    let report = store.setup().await.unwrap();
    // Six stored scripts (counter, bucket, average, average bucket,
    // counter set, actor mark), the ILM policy, eight component and eight
    // index templates (the last three: targets' publication times,
    // CountAPI's records, hour buckets); then the mark fields added to mark
    // indices an earlier version made, and `applied_ops` to counter and
    // bucket indices.
    assert_eq!(report.installed.len(), 24);
    let calls = fake.0.lock().unwrap().calls.clone();
    let puts: Vec<_> = calls.iter().filter(|c| c.starts_with("PUT")).collect();
    assert_eq!(puts.len(), 26);
    assert!(
        puts[25].starts_with(
            "PUT /counter-gateway_*_counters,counter-gateway_*_average_counters,\
             counter-gateway_*_histogram_counters-*,counter-gateway_*_average_histogram_counters-*/_mapping"
        ),
        "{}",
        puts[25]
    );
    assert!(
        puts[24].starts_with(
            "PUT /counter-gateway_*_actor_marks,counter-gateway_*_actor_day_marks-*/_mapping"
        ),
        "{}",
        puts[24]
    );
    assert!(puts[23].starts_with("PUT /_index_template/counter-gateway-hour_counters"));
    assert!(puts[0].starts_with("PUT /_scripts/counter-gateway-counter-update-v2"));
    assert!(puts[2].starts_with("PUT /_scripts/counter-gateway-average-update-v2"));
    assert!(puts[3].starts_with("PUT /_scripts/counter-gateway-average-bucket-update-v2"));
    assert!(puts[4].starts_with("PUT /_scripts/counter-gateway-counter-set-v1"));
    assert!(puts[5].starts_with("PUT /_scripts/counter-gateway-actor-mark-v2"));
    assert!(puts[13].starts_with("PUT /_component_template/counter-gateway-target-mappings"));
    assert!(puts[14].starts_with("PUT /_component_template/counter-gateway-countapi-mappings"));
    assert!(puts[18].starts_with("PUT /_index_template/counter-gateway-average_histogram_counters"));
    assert!(puts[20].starts_with("PUT /_index_template/counter-gateway-actor_day_marks"));
    assert!(puts[21].starts_with("PUT /_index_template/counter-gateway-targets"));
    assert!(puts[22].starts_with("PUT /_index_template/counter-gateway-countapi"));
}

#[tokio::test]
async fn a_lost_answer_is_never_resent() {
    // A server that reads the request and hangs up without answering: the
    // bulk may or may not have been applied, so it must not be sent again.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        loop {
            let (mut sock, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 64 * 1024];
            let _ = tokio::io::AsyncReadExt::read(&mut sock, &mut buf).await;
            // Bulks only: the indices created ahead get no answer either.
            if buf.starts_with(b"POST /_bulk") {
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            drop(sock);
        }
    });
    let store = store_at(&format!("http://{addr}"));
    let out = store
        .apply(WriteBatch {
            requests: vec![vec![inc("a", 1, None)]],
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(
        matches!(&out.requests[0], RequestOutcome::Failed { reason } if reason.contains("outcome unknown")),
        "{:?}",
        out.requests[0]
    );
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_items_are_bounded_by_distinct_keys_not_requests() {
    let fake = Fake::default();
    let addr = fake.start().await;
    let store = store_at(&format!("http://{addr}"));
    let metrics = Arc::new(Metrics::default());
    let config = PipelineConfig {
        flush_interval: Duration::from_millis(5),
        ack_timeout: Duration::from_secs(5),
        ..PipelineConfig::default()
    };
    let (pipeline, _flusher) = Pipeline::start(store.clone(), config, metrics.clone());
    let router = router(AppState {
        store,
        pipeline,
        time_policy: TimePolicy::default(),
        clock: clock(),
        limits: Limits::default(),
        metrics,
        actors: Default::default(),
        pending: None,
    });
    let mut tasks = Vec::new();
    for i in 0..300 {
        let router = router.clone();
        tasks.push(tokio::spawn(async move {
            let path = format!("/v1/counters/VIDEO/VIEW/k{}/increment", i % 3);
            call(&router, "POST", &path, None).await.0
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), 200);
    }
    let bulks = fake.bulks();
    let items: usize = bulks.iter().map(Vec::len).sum();
    // Three keys, one day, one hour: at most nine items per flush (a
    // counter, a day and an hour each), whatever the load.
    assert!(bulks.iter().all(|b| b.len() <= 9), "{bulks:?}");
    assert!(items < 300, "{items} bulk items for 300 increments");
    for k in 0..3 {
        assert_eq!(fake.value(COUNTERS, &cid(&format!("k{k}"))), Some(100));
    }
}

// ---------------------------------------------------------------------------
// Reads: top lists, reports and averages through the router
// ---------------------------------------------------------------------------

fn ago(days: i64) -> String {
    (now() - chrono::Duration::days(days)).to_rfc3339()
}

fn day_ago(days: i64) -> String {
    (now() - chrono::Duration::days(days))
        .format("%Y-%m-%d")
        .to_string()
}

fn uuids(list: &Value, field: &str) -> Vec<(String, i64)> {
    list[field]
        .as_array()
        .unwrap_or_else(|| panic!("no {field} in {list}"))
        .iter()
        .map(|e| {
            let v = e.get("value").or_else(|| e.get("sum")).unwrap();
            (e["uuid"].as_str().unwrap().to_string(), v.as_i64().unwrap())
        })
        .collect()
}

fn pairs(list: &[(&str, i64)]) -> Vec<(String, i64)> {
    list.iter().map(|(u, v)| (u.to_string(), *v)).collect()
}

#[tokio::test]
async fn top_lists_and_histograms_are_answered_from_searches_and_aggregations() {
    let fake = Fake::default();
    let addr = fake.start().await;
    let router = app(store_at(&format!("http://{addr}")));
    let ev = |uuid: &str, count: i64, days: i64, category: Option<&str>| {
        let mut e = json!({"entity": "VIDEO", "action": "VIEW", "uuid": uuid, "count": count, "timestamp": ago(days)});
        if let Some(c) = category {
            e["category"] = json!(c);
        }
        e
    };
    let events = json!({"events": [
        ev("x", 100, 20, Some("sports")), ev("x", 1, 2, None), ev("y", 3, 5, None),
        ev("y", 3, 1, None), ev("z", 4, 0, None), ev("t", 4, 6, None), ev("old", 50, 7, None)
    ]});
    let (status, body) = call(&router, "POST", "/v1/events", Some(events)).await;
    assert_eq!(status, 200, "{body}");

    // All time: a sorted search of the counters, ties by uuid.
    let (status, body) = call(&router, "GET", "/v1/top/VIDEO/VIEW", None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["exact"], true);
    assert_eq!(
        uuids(&body, "counters"),
        pairs(&[("x", 101), ("old", 50), ("y", 6), ("t", 4), ("z", 4)])
    );
    assert_eq!(body["counters"][0]["category"], "sports");

    // Last week: sums of the window's buckets, the category of the counter
    // (x's bucket of -2d carries none, the counter does).
    let (status, body) = call(
        &router,
        "GET",
        "/v1/top/VIDEO/VIEW?interval=last_week",
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        uuids(&body, "counters"),
        pairs(&[("y", 6), ("t", 4), ("z", 4), ("x", 1)])
    );
    assert_eq!(body["counters"][3]["category"], "sports");
    assert_eq!(body["exact"], true, "{body}");
    let (_, body) = call(
        &router,
        "GET",
        "/v1/top/VIDEO/VIEW?interval=last_week&category=sports",
        None,
    )
    .await;
    assert_eq!(uuids(&body, "counters"), pairs(&[("x", 1)]));
    {
        let st = fake.0.lock().unwrap();
        let (target, _, q) = st
            .searches
            .iter()
            .find(|(_, _, q)| q.pointer("/aggs/top").is_some())
            .expect("a terms aggregation was sent");
        // Only the monthly bucket indices of the window are searched.
        assert!(target
            .split(',')
            .all(|i| i.starts_with("counter-gateway_default_histogram_counters-20")));
        assert!(target.split(',').count() <= 2, "{target}");
        assert_eq!(q["aggs"]["top"]["terms"]["field"], "uuid");
    }

    // A histogram is a routed search of the counter's buckets.
    let (status, body) = call(
        &router,
        "GET",
        &format!("/v1/counters/VIDEO/VIEW/x/histogram?from={}", day_ago(3)),
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["total"], 1);
    assert_eq!(body["buckets"], json!([{"day": day_ago(2), "value": 1}]));
    assert!(fake
        .0
        .lock()
        .unwrap()
        .searches
        .iter()
        .any(|(_, query, _)| query.contains("routing=VIDEO_VIEW_x")));
    let (status, _) = call(
        &router,
        "GET",
        "/v1/counters/VIDEO/VIEW/never/histogram",
        None,
    )
    .await;
    assert_eq!(status, 404);

    // Deleting a counter removes it from every list, buckets included.
    let (status, _) = call(&router, "DELETE", "/v1/counters/VIDEO/VIEW/y", None).await;
    assert_eq!(status, 200);
    let (_, body) = call(
        &router,
        "GET",
        "/v1/top/VIDEO/VIEW?interval=last_week&size=2",
        None,
    )
    .await;
    assert_eq!(uuids(&body, "counters"), pairs(&[("t", 4), ("z", 4)]));
}

#[tokio::test]
async fn stale_reports_page_with_search_after_and_unused_pairs_are_exact() {
    let fake = Fake::default();
    let addr = fake.start().await;
    let router = app(store_at(&format!("http://{addr}")));
    let ev = |entity: &str, action: &str, uuid: &str, count: i64, days: i64| json!({"entity": entity, "action": action, "uuid": uuid, "count": count, "timestamp": ago(days)});
    let events = json!({"events": [
        ev("PAGE", "VIEW", "p4", 4, 40), ev("PAGE", "VIEW", "p1", 1, 50),
        ev("PAGE", "VIEW", "p3", 3, 45), ev("PAGE", "VIEW", "p2", 2, 45),
        ev("PAGE", "like", "p5", 5, 35), ev("PAGE", "like", "p6", 6, 2),
        ev("OLD", "VIEW", "o1", 7, 60), ev("OLD", "VIEW", "o2", i64::MAX, 33),
        ev("OLD", "VIEW", "o3", 10, 31), ev("NEW", "VIEW", "n1", 1, 0)
    ]});
    // The batch overflows nothing: each counter is distinct.
    let (status, body) = call(&router, "POST", "/v1/events", Some(events)).await;
    assert_eq!(status, 200, "{body}");

    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    for page in 0.. {
        let path = match &cursor {
            None => "/v1/reports/stale?days=30&entity=PAGE&size=2".to_string(),
            Some(c) => format!("/v1/reports/stale?days=30&entity=PAGE&size=2&cursor={c}"),
        };
        let (status, body) = call(&router, "GET", &path, None).await;
        assert_eq!(status, 200, "{body}");
        for c in body["counters"].as_array().unwrap() {
            seen.push(c["uuid"].as_str().unwrap().to_string());
        }
        match body["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
        assert!(page < 5, "paging does not end");
    }
    // Oldest first; the tie at -45d continues by uuid across the page break.
    assert_eq!(seen, ["p1", "p2", "p3", "p4", "p5"]);
    {
        let st = fake.0.lock().unwrap();
        let stale: Vec<&Value> = st
            .searches
            .iter()
            .filter(|(_, _, q)| q.get("search_after").is_some())
            .map(|(_, _, q)| q)
            .collect();
        assert_eq!(stale.len(), 2, "pages 2 and 3 continue with search_after");
        assert_eq!(
            stale[0]["search_after"].as_array().unwrap()[1..],
            [json!("PAGE"), json!("VIEW"), json!("p2")]
        );
        assert_eq!(
            stale[0]["size"], 3,
            "one more than a page tells if another follows"
        );
    }

    let (status, body) = call(&router, "GET", "/v1/reports/unused?days=30", None).await;
    assert_eq!(status, 200, "{body}");
    let got: Vec<(&str, &str, &Value, &Value)> = body["pairs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["entity"].as_str().unwrap(),
                p["action"].as_str().unwrap(),
                &p["total"],
                &p["counters"],
            )
        })
        .collect();
    // The total past i64 is exact: summed as two 32-bit halves.
    let big: Value = serde_json::from_str("9223372036854775824").unwrap();
    assert_eq!(
        got,
        [
            ("PAGE", "VIEW", &json!(10), &json!(4)),
            ("OLD", "VIEW", &big, &json!(3))
        ]
    );
}

#[tokio::test]
async fn average_samples_are_written_and_ranked() {
    let fake = Fake::default();
    let addr = fake.start().await;
    let router = app(store_at(&format!("http://{addr}")));
    let post = |uuid: &str, body: Value| {
        let router = router.clone();
        let path = format!("/v1/averages/ARTICLE/rating/{uuid}");
        async move { call(&router, "POST", &path, Some(body)).await }
    };
    let (status, body) = post("a1", json!({"value": 4})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (&body["sum"], &body["quantity"], &body["average"]),
        (&json!(4), &json!(1), &json!(4.0))
    );
    let (_, body) = post("a1", json!({"value": 5, "category": "tech"})).await;
    assert_eq!(
        (&body["sum"], &body["quantity"], &body["average"]),
        (&json!(9), &json!(2), &json!(4.5))
    );
    post("a1", json!({"value": 1, "timestamp": ago(3)})).await;
    let (_, body) = post(
        "a1",
        json!({"value": 1, "retract": true, "timestamp": ago(3)}),
    )
    .await;
    assert_eq!((&body["sum"], &body["quantity"]), (&json!(9), &json!(2)));
    post("a2", json!({"value": 5, "timestamp": ago(10)})).await;
    post("a2", json!({"value": 3})).await;
    post("a3", json!({"value": 5})).await;
    post("a4", json!({"value": 4})).await;
    post("a4", json!({"value": 4, "id": "once"})).await;
    let (_, body) = post("a4", json!({"value": 4, "id": "once"})).await;
    assert_eq!(
        (&body["sum"], &body["quantity"]),
        (&json!(8), &json!(2)),
        "a retried id counts once"
    );

    // Samples land in the average documents, not in the counters.
    {
        let st = fake.0.lock().unwrap();
        assert!(st
            .docs
            .keys()
            .all(|(i, _)| i.contains("_average_counters")
                || i.contains("_average_histogram_counters-")));
        let a1 = &st.docs[&(
            "counter-gateway_default_average_counters".to_string(),
            "ARTICLE_rating_a1".to_string(),
        )];
        assert_eq!(a1["average"], json!(4.5));
    }

    let (status, body) = call(
        &router,
        "GET",
        "/v1/averages/ARTICLE/rating/a2?interval=last_week",
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!((&body["sum"], &body["quantity"]), (&json!(3), &json!(1)));
    let (_, body) = call(
        &router,
        "GET",
        &format!(
            "/v1/averages/ARTICLE/rating/a1?from={}&to={}",
            day_ago(3),
            day_ago(3)
        ),
        None,
    )
    .await;
    assert_eq!(
        (&body["sum"], &body["quantity"], &body["average"]),
        (&json!(0), &json!(0), &Value::Null)
    );

    // All time: sorted on the stored quotient; ties by quantity, then uuid.
    let (status, body) = call(&router, "GET", "/v1/top-averages/ARTICLE/rating", None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["exact"], true);
    assert_eq!(
        uuids(&body, "averages"),
        pairs(&[("a3", 5), ("a1", 9), ("a2", 8), ("a4", 8)])
    );
    // A window: every average of the window read by composite pages, ordered here.
    let (_, body) = call(
        &router,
        "GET",
        "/v1/top-averages/ARTICLE/rating?interval=last_week",
        None,
    )
    .await;
    assert_eq!(
        uuids(&body, "averages"),
        pairs(&[("a3", 5), ("a1", 9), ("a4", 8), ("a2", 3)])
    );
    assert_eq!(body["averages"][1]["category"], "tech");
    let (_, body) = call(
        &router,
        "GET",
        &format!(
            "/v1/top-averages/ARTICLE/rating?from={}&to={}",
            day_ago(12),
            day_ago(3)
        ),
        None,
    )
    .await;
    assert_eq!(
        uuids(&body, "averages"),
        pairs(&[("a2", 5)]),
        "quantity 0 is below min_quantity"
    );

    // A sum past i64 is refused by the script and nothing is applied.
    let (status, _) = post("big", json!({"value": i64::MAX})).await;
    assert_eq!(status, 200);
    let (status, body) = post("big", json!({"value": 1})).await;
    assert_eq!(status, 409, "{body}");
    let (_, body) = call(&router, "GET", "/v1/averages/ARTICLE/rating/big", None).await;
    assert_eq!(
        (&body["sum"], &body["quantity"]),
        (&json!(i64::MAX), &json!(1))
    );
}

/// The shared conformance scenarios, played against the Elasticsearch store
/// over the fake cluster. This checks the store's requests and parsing end
/// to end against the embedded store's answers; it does not replace the
/// real-cluster run of `tests/es_real.rs` (the fake evaluates only the query
/// shapes the store sends, the way the reference describes them).
#[tokio::test]
async fn conformance_scenarios_pass_on_the_fake_cluster() {
    runner::run_all(now(), |clock| async move {
        let fake = Fake::default();
        let addr = fake.start().await;
        let store = store_with_clock(&format!("http://{addr}"), clock.clock());
        runner::Target {
            router: app_with_clock(store, clock.clock()),
            clock,
            guard: Box::new(fake),
        }
    })
    .await;
}

/// A read splits `routing` on commas, so the buckets of a counter whose id
/// holds one are read from every shard rather than from the wrong ones.
#[tokio::test]
async fn a_counter_id_with_a_comma_is_read_and_deleted_unrouted() {
    let fake = Fake::default();
    let addr = fake.start().await;
    let router = app(store_at(&format!("http://{addr}")));
    let path = "/v1/counters/VIDEO/VIEW/a,b";
    let (status, body) = call(&router, "POST", &format!("{path}/increment"), None).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = call(&router, "GET", &format!("{path}/histogram"), None).await;
    assert_eq!((status, &body["total"]), (200, &json!(1)), "{body}");
    let (status, _) = call(&router, "DELETE", path, None).await;
    assert_eq!(status, 200);
    let st = fake.0.lock().unwrap();
    let (_, query, _) = st.searches.last().unwrap();
    assert!(!query.contains("routing"), "{query}");
    assert!(st.docs.is_empty(), "the counter and its bucket are gone");
}

/// Three increments near the i64 limits on different days: the counter
/// stays at MAX, the week's buckets sum to 2·MAX, which the `sum`
/// aggregation answers as a double (`1.8446744073709552E19`). The list
/// answers 200 with that double's integer (2^64; it was cut to i64::MAX)
/// and says it is not exact; the windowed average, summed exactly from its
/// bucket documents, answers 2·MAX (it was a 500).
#[tokio::test]
async fn a_window_summing_past_i64_answers_on_the_fake_cluster() {
    let fake = Fake::default();
    let addr = fake.start().await;
    let router = app(store_at(&format!("http://{addr}")));
    let max = i64::MAX;
    for (days, count) in [(10, -max), (1, max), (0, max)] {
        let ev = json!({"events": [{"entity": "VIDEO", "action": "VIEW", "uuid": "a",
                                    "count": count, "timestamp": ago(days)}]});
        let (status, body) = call(&router, "POST", "/v1/events", Some(ev)).await;
        assert_eq!(status, 200, "{body}");
        let sample = json!({"value": count, "timestamp": ago(days)});
        let (status, body) = call(&router, "POST", "/v1/averages/R/STARS/s", Some(sample)).await;
        assert_eq!(status, 200, "{body}");
    }
    let (status, body) = call(
        &router,
        "GET",
        "/v1/top/VIDEO/VIEW?interval=last_week",
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let value = &body["counters"][0]["value"];
    assert_eq!(value.as_i64(), None, "{body}");
    assert_eq!(value.as_f64(), Some(2f64.powi(64)), "{body}");
    assert_eq!(body["exact"], false, "{body}");
    let (status, body) = call(
        &router,
        "GET",
        "/v1/top/VIDEO/VIEW?interval=last_month",
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    // MAX itself is no double: the nearest, 2^63, is answered, inexact.
    assert_eq!(body["counters"][0]["value"], json!(1u64 << 63), "{body}");
    assert_eq!(body["exact"], false, "{body}");
    // Read as text: 2·MAX is past u64, which `Value` would keep as a double.
    let req = Request::builder()
        .uri("/v1/averages/R/STARS/s?interval=last_week")
        .body(Body::empty())
        .unwrap();
    let res = router.clone().oneshot(req).await.unwrap();
    assert_eq!(res.status().as_u16(), 200);
    let text = res.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8_lossy(&text);
    let want = format!("\"sum\":{},\"quantity\":2", 2 * i128::from(max));
    assert!(text.contains(&want), "{text}");
}

/// The multi-read is one realtime `_mget` of the counter documents, however
/// many keys; a tenant never written to (no index) reads as all missing;
/// a refused request sends nothing.
#[tokio::test]
async fn a_multi_read_is_one_realtime_mget() {
    let fake = Fake::default();
    let addr = fake.start().await;
    let router = app(store_at(&format!("http://{addr}")));
    let mgets = |fake: &Fake| -> Vec<String> {
        let st = fake.0.lock().unwrap();
        st.calls
            .iter()
            .filter(|c| c.contains("_mget"))
            .cloned()
            .collect()
    };
    let keys = json!({"keys": [
        {"entity": "VIDEO", "action": "VIEW", "uuid": "u1"},
        {"entity": "VIDEO", "action": "VIEW", "uuid": "u2"}]});
    let (status, body) = call(&router, "POST", "/v1/counters/get", Some(keys.clone())).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["counters"][0]["found"], false);
    assert_eq!(body["counters"][1]["value"], 0);
    let calls = mgets(&fake);
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert!(
        calls[0].starts_with("POST /counter-gateway_default_counters/_mget?"),
        "{calls:?}"
    );
    assert!(calls[0].contains("realtime=true"), "{calls:?}");

    call(
        &router,
        "POST",
        "/v1/counters/VIDEO/VIEW/u2/increment",
        Some(json!({"count": 4})),
    )
    .await;
    let (status, body) = call(&router, "POST", "/v1/counters/get", Some(keys)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["counters"][0]["found"], false);
    assert_eq!(body["counters"][1]["value"], 4);
    assert_eq!(mgets(&fake).len(), 2);

    let (status, _) = call(
        &router,
        "POST",
        "/v1/counters/get",
        Some(json!({"keys": [{"entity": "VIDEO", "action": "VIEW", "uuid": ""}]})),
    )
    .await;
    assert_eq!(status, 400);
    let (status, body) = call(
        &router,
        "POST",
        "/v1/counters/get",
        Some(json!({"keys": []})),
    )
    .await;
    assert_eq!((status, &body), (200, &json!({"counters": []})));
    assert_eq!(
        mgets(&fake).len(),
        2,
        "nothing sent for a refused or an empty request"
    );
}

/// A backfill whose counter update keeps failing after its bucket was set
/// answers 503 saying the day may be half set (the histogram already shows
/// the new value, the counter not), and the day after it was not touched;
/// sending it again once the cluster answers completes both exactly.
#[tokio::test]
async fn a_backfill_cut_short_by_the_cluster_says_so_and_is_completed_by_a_resend() {
    let fake = Fake::default();
    let addr = fake.start().await;
    let router = app(store_at(&format!("http://{addr}")));
    let ev = json!({"events": [{"entity": "VIDEO", "action": "VIEW", "uuid": "a", "count": 5, "timestamp": ago(1)}]});
    assert_eq!(call(&router, "POST", "/v1/events", Some(ev)).await.0, 200);
    let body = json!({"days": [
        {"entity": "VIDEO", "action": "VIEW", "uuid": "a", "day": day_ago(1), "value": 9},
        {"entity": "VIDEO", "action": "VIEW", "uuid": "b", "day": day_ago(2), "value": 3},
    ]});
    fake.0.lock().unwrap().refuse_updates = true;
    let (status, b) = call(&router, "PUT", "/v1/days", Some(body.clone())).await;
    assert_eq!(status, 503, "{b}");
    let reason = b["error"]["reason"].as_str().unwrap();
    assert!(reason.contains("0 of 2 days were set"), "{reason}");
    assert!(
        reason.contains(&day_ago(1)) && reason.contains("may be half set"),
        "{reason}"
    );
    let (_, c) = call(&router, "GET", "/v1/counters/VIDEO/VIEW/a", None).await;
    assert_eq!(c["value"], 5, "the counter is behind: {c}");
    let (_, c) = call(&router, "GET", "/v1/counters/VIDEO/VIEW/b", None).await;
    assert_eq!(c["error"]["type"], "not_found", "{c}");
    fake.0.lock().unwrap().refuse_updates = false;
    for _ in 0..2 {
        let (status, b) = call(&router, "PUT", "/v1/days", Some(body.clone())).await;
        assert_eq!(status, 200, "{b}");
    }
    let (_, c) = call(&router, "GET", "/v1/counters/VIDEO/VIEW/a", None).await;
    assert_eq!(c["value"], 9, "{c}");
    let (_, c) = call(&router, "GET", "/v1/counters/VIDEO/VIEW/b", None).await;
    assert_eq!(c["value"], 3, "{c}");
}

/// A set of a counter's value is one `_update` without a script: resent
/// while the cluster refuses it (it is idempotent), answered 503 past the
/// back-off budget with nothing changed, and applied by the same request
/// once the cluster takes it. It leaves the update scripts' bookkeeping
/// (`applied_ops`, `event_ids`) as it was, so their replays stay skipped,
/// and the next flush's increment adds to the set value.
#[tokio::test]
async fn a_set_is_resent_until_the_cluster_takes_it_and_keeps_the_scripts_bookkeeping() {
    let fake = Fake::default();
    let addr = fake.start().await;
    let router = app(store_at(&format!("http://{addr}")));
    let path = "/v1/counters/VIDEO/VIEW/a";
    let inc = json!({"id": "e-1"});
    let (status, b) = call(
        &router,
        "POST",
        &format!("{path}/increment"),
        Some(inc.clone()),
    )
    .await;
    assert_eq!((status, &b["value"]), (200, &json!(1)), "{b}");
    let before =
        fake.0.lock().unwrap().docs[&(COUNTERS.to_string(), "VIDEO_VIEW_a".to_string())].clone();
    assert!(before.contains_key("event_ids"), "{before:?}");

    fake.0.lock().unwrap().refuse_updates = true;
    let (status, b) = call(&router, "PUT", path, Some(json!({"value": 50}))).await;
    assert_eq!(status, 503, "{b}");
    let reason = b["error"]["reason"].as_str().unwrap();
    assert!(
        reason.contains("sending the same set again is safe"),
        "{reason}"
    );
    let updates = fake
        .0
        .lock()
        .unwrap()
        .calls
        .iter()
        .filter(|c| c.starts_with(&format!("POST /{COUNTERS}/_update/VIDEO_VIEW_a?")))
        .count();
    assert!(updates > 1, "a refused set is resent: {updates} attempt(s)");
    let (_, c) = call(&router, "GET", path, None).await;
    assert_eq!(c["value"], 1, "nothing changed: {c}");

    fake.0.lock().unwrap().refuse_updates = false;
    for _ in 0..2 {
        let (status, b) = call(&router, "PUT", path, Some(json!({"value": 50}))).await;
        assert_eq!((status, &b["value"]), (200, &json!(50)), "{b}");
        assert_eq!(
            b["first_timestamp"],
            before_ts(&before, "first_timestamp"),
            "{b}"
        );
    }
    let after =
        fake.0.lock().unwrap().docs[&(COUNTERS.to_string(), "VIDEO_VIEW_a".to_string())].clone();
    for field in [
        "applied_ops",
        "event_ids",
        "first_timestamp",
        "recorded_timestamp",
    ] {
        assert_eq!(after.get(field), before.get(field), "{field}");
    }
    // A retried event stays a duplicate; a new one adds to the set value.
    let (_, b) = call(&router, "POST", &format!("{path}/increment"), Some(inc)).await;
    assert_eq!(
        (&b["value"], &b["counted"]),
        (&json!(50), &json!(false)),
        "{b}"
    );
    let (_, b) = call(&router, "POST", &format!("{path}/increment"), None).await;
    assert_eq!(b["value"], 51, "{b}");
}

/// A stored timestamp (epoch milliseconds) as the API renders it.
fn before_ts(doc: &Map<String, Value>, field: &str) -> Value {
    json!(counter_gateway::domain::format_ms(
        doc[field].as_i64().unwrap()
    ))
}

// ---------------------------------------------------------------------------
// Once per actor: the marks' failure paths (`src/store/elasticsearch/marks.rs`)
// ---------------------------------------------------------------------------

const LIKES: &str = "/v1/counters/ARTICLE/like/a1";
const MARKS: &str = "counter-gateway_default_actor_marks";

fn likes(body: Value) -> (&'static str, Option<Value>) {
    (LIKES, Some(body))
}

/// The mark documents the fake holds, as `(id, state)`.
fn marks_of(fake: &Fake) -> Vec<(String, String)> {
    let st = fake.0.lock().unwrap();
    let mut out: Vec<(String, String)> = st
        .docs
        .iter()
        .filter(|((i, _), _)| i == MARKS)
        .map(|((_, id), s)| (id.clone(), s["state"].as_str().unwrap_or("").to_string()))
        .collect();
    out.sort();
    out
}

/// A like whose count keeps failing (503 past the back-off budget) answers
/// 503, and its mark is set back: the client's retry is counted, once.
#[tokio::test]
async fn a_like_whose_count_fails_is_unmarked_so_its_retry_counts() {
    let fake = Fake::default();
    let addr = fake.start().await;
    let router = app(store_at(&format!("http://{addr}")));
    let failing = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let f = failing.clone();
    fake.set_item_fault(move |_, id| {
        (f.load(std::sync::atomic::Ordering::SeqCst) && id == "ARTICLE_like_a1")
            .then(|| (503, item_error(503)))
    });
    let (path, body) = likes(json!({"actor": "alice", "unique": "ever"}));
    let (status, b) = call(&router, "POST", &format!("{path}/increment"), body.clone()).await;
    assert_eq!(status, 503, "{b}");
    assert!(marks_of(&fake).is_empty(), "{:?}", marks_of(&fake));
    failing.store(false, std::sync::atomic::Ordering::SeqCst);
    let (status, b) = call(&router, "POST", &format!("{path}/increment"), body.clone()).await;
    assert_eq!(
        (status, &b["value"], &b["counted"]),
        (200, &json!(1), &json!(true)),
        "{b}"
    );
    let (_, b) = call(&router, "POST", &format!("{path}/increment"), body).await;
    assert_eq!(
        (&b["value"], &b["skipped"]),
        (&json!(1), &json!("repeat")),
        "{b}"
    );
    assert_eq!(marks_of(&fake).len(), 1);
    assert_eq!(marks_of(&fake)[0].1, "counted");
}

/// An unlike whose decrement fails is set back to counted: the like stays,
/// and the retried unlike takes it back exactly once.
#[tokio::test]
async fn an_unlike_whose_decrement_fails_keeps_the_like() {
    let fake = Fake::default();
    let addr = fake.start().await;
    let router = app(store_at(&format!("http://{addr}")));
    let body = Some(json!({"actor": "alice", "unique": "ever"}));
    let (s, _) = call(&router, "POST", &format!("{LIKES}/increment"), body.clone()).await;
    assert_eq!(s, 200);
    let failing = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let f = failing.clone();
    fake.set_item_fault(move |_, id| {
        (f.load(std::sync::atomic::Ordering::SeqCst) && id == "ARTICLE_like_a1")
            .then(|| (503, item_error(503)))
    });
    let (status, b) = call(&router, "POST", &format!("{LIKES}/decrement"), body.clone()).await;
    assert_eq!(status, 503, "{b}");
    assert_eq!(marks_of(&fake)[0].1, "counted");
    failing.store(false, std::sync::atomic::Ordering::SeqCst);
    let (_, b) = call(&router, "POST", &format!("{LIKES}/decrement"), body.clone()).await;
    assert_eq!(
        (&b["value"], &b["counted"]),
        (&json!(0), &json!(true)),
        "{b}"
    );
    // Off and remembering no id: the mark is gone.
    assert!(marks_of(&fake).is_empty());
    let (_, b) = call(&router, "POST", &format!("{LIKES}/decrement"), body).await;
    assert_eq!(
        (&b["value"], &b["skipped"]),
        (&json!(0), &json!("repeat")),
        "{b}"
    );
}

/// A count whose answer is lost (a proxy's 502 after the marks were
/// written) may or may not have landed: the mark stays, so the retry is a
/// repeat. Here the count did not land: one like is lost, never counted twice.
#[tokio::test]
async fn a_lost_answer_to_a_count_leaves_the_mark_never_counting_twice() {
    let fake = Fake::default();
    let addr = fake.start().await;
    let router = app(store_at(&format!("http://{addr}")));
    // Bulk 0 writes the mark; bulk 1, the count, is answered by a proxy.
    fake.set_request_fault(|call| {
        (call == 1).then(|| (502, Value::String("<html>502 Bad Gateway</html>".into())))
    });
    let body = Some(json!({"actor": "alice", "unique": "ever"}));
    let (status, b) = call(&router, "POST", &format!("{LIKES}/increment"), body.clone()).await;
    assert_eq!(status, 503, "{b}");
    assert!(
        b["error"]["reason"]
            .as_str()
            .unwrap()
            .contains("part of it may have been applied"),
        "{b}"
    );
    assert_eq!(marks_of(&fake)[0].1, "counted");
    let (status, b) = call(&router, "POST", &format!("{LIKES}/increment"), body).await;
    assert_eq!(status, 200, "{b}");
    assert_eq!(
        (&b["value"], &b["skipped"]),
        (&json!(0), &json!("repeat")),
        "counted twice? {b}"
    );
    assert_eq!(fake.value(COUNTERS, "ARTICLE_like_a1"), None);
}

/// When a mark cannot be written, nothing of its request is applied, its
/// other events included; the other requests of the flush are.
#[tokio::test]
async fn a_request_whose_mark_fails_applies_nothing() {
    let fake = Fake::default();
    let addr = fake.start().await;
    let store = store_at(&format!("http://{addr}"));
    let mut bad = inc("a", 1, None);
    let key = ActorKey::new(b"0123456789abcdef").unwrap();
    bad.unique = Some(Unique {
        scope: Scope::Ever,
        mark: key.mark(&bad.key, "alice").unwrap(),
    });
    let mark_id = format!("{}@{}", bad.key.doc_id(), bad.unique.unwrap().mark.hex());
    let m = mark_id.clone();
    fake.set_item_fault(move |_, id| (id == m).then(|| (400, item_error(400))));
    let out = store
        .apply(WriteBatch {
            requests: vec![vec![inc("b", 5, None), bad], vec![inc("c", 1, None)]],
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(
        matches!(&out.requests[0], RequestOutcome::Failed { reason } if reason.contains("actor marks")),
        "{:?}",
        out.requests
    );
    assert_eq!(out.requests[1], RequestOutcome::Applied { duplicates: 0 });
    assert_eq!(fake.value(COUNTERS, &cid("b")), None);
    assert_eq!(fake.value(COUNTERS, &cid("a")), None);
    assert_eq!(fake.value(COUNTERS, &cid("c")), Some(1));
}

/// Views' marks go to the month of their day, created ahead by the
/// gateway (never left to automatic creation), and only for flushes with
/// views; a counter's delete takes its marks with it.
#[tokio::test]
async fn view_marks_live_in_monthly_indices_created_ahead() {
    let fake = Fake::default();
    fake.0.lock().unwrap().no_auto_create = true;
    fake.0.lock().unwrap().indices.insert(COUNTERS.into());
    let addr = fake.start().await;
    let router = app(store_at(&format!("http://{addr}")));
    let (s, _) = call(
        &router,
        "POST",
        "/v1/counters/ARTICLE/VIEW/a1/increment",
        None,
    )
    .await;
    assert_eq!(s, 200);
    let month = |d: DateTime<Utc>| {
        format!(
            "counter-gateway_default_actor_day_marks-{}",
            d.format("%Y.%m")
        )
    };
    assert!(!index_puts(&fake)
        .iter()
        .any(|i| i.contains("actor_day_marks")));
    let body = Some(json!({"actor": "alice", "unique": "day"}));
    let (s, b) = call(
        &router,
        "POST",
        "/v1/counters/ARTICLE/VIEW/a1/increment",
        body.clone(),
    )
    .await;
    assert_eq!((s, &b["counted"]), (200, &json!(true)), "{b}");
    let next = now().checked_add_months(chrono::Months::new(1)).unwrap();
    let puts = index_puts(&fake);
    assert!(
        puts.contains(&month(now())) && puts.contains(&month(next)),
        "{puts:?}"
    );
    let (_, b) = call(
        &router,
        "POST",
        "/v1/counters/ARTICLE/VIEW/a1/increment",
        body.clone(),
    )
    .await;
    assert_eq!(b["skipped"], "repeat", "{b}");
    let (s, _) = call(&router, "DELETE", "/v1/counters/ARTICLE/VIEW/a1", None).await;
    assert_eq!(s, 200);
    let (_, b) = call(
        &router,
        "POST",
        "/v1/counters/ARTICLE/VIEW/a1/increment",
        body,
    )
    .await;
    assert_eq!(
        (&b["value"], &b["counted"]),
        (&json!(1), &json!(true)),
        "{b}"
    );
}

/// Publication times on a cluster without automatic index creation: the
/// first set creates the targets index (from its template) and is sent
/// again; an event's set keeps what an admin set (a create's 409); a clear
/// of a target without one is done.
#[tokio::test]
async fn publication_times_create_their_index_and_events_keep_what_is_set() {
    let fake = Fake::default();
    fake.0.lock().unwrap().no_auto_create = true;
    fake.0.lock().unwrap().indices.insert(COUNTERS.into());
    let addr = fake.start().await;
    let router = app(store_at(&format!("http://{addr}")));
    let at = |days: i64| {
        (now() - chrono::Duration::days(days)).to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    };
    let (s, body) = call(
        &router,
        "PUT",
        "/v1/targets/ARTICLE/a1",
        Some(json!({"published": at(3)})),
    )
    .await;
    assert_eq!((s, &body["published"]), (200, &json!(at(3))), "{body}");
    assert!(index_puts(&fake).contains(&"counter-gateway_default_targets".to_string()));
    let (s, body) = call(
        &router,
        "POST",
        "/v1/events",
        Some(json!({"events": [{"entity": "ARTICLE", "action": "VIEW", "uuid": "a1", "published": at(1)},
                               {"entity": "ARTICLE", "action": "VIEW", "uuid": "a2", "published": at(2)}]})),
    )
    .await;
    assert_eq!(s, 200, "{body}");
    let (_, body) = call(&router, "GET", "/v1/targets/ARTICLE/a1", None).await;
    assert_eq!(body["published"], json!(at(3)), "{body}");
    let (_, body) = call(&router, "GET", "/v1/targets/ARTICLE/a2", None).await;
    assert_eq!(body["published"], json!(at(2)), "{body}");
    let (s, body) = call(
        &router,
        "PUT",
        "/v1/targets/ARTICLE/none",
        Some(json!({"published": null})),
    )
    .await;
    assert_eq!(s, 200, "{body}");
    // A shard still recovering answers a read 503: asked again.
    fake.0.lock().unwrap().get_faults = 2;
    let (s, body) = call(&router, "GET", "/v1/targets/ARTICLE/a1", None).await;
    assert_eq!((s, &body["published"]), (200, &json!(at(3))), "{body}");
    assert_eq!(fake.0.lock().unwrap().get_faults, 0);
}

/// A first-days list walks the pair's counters a page at a time (5,000)
/// and their buckets a search page at a time (10,000): 5,003 counters of
/// 3 days each cross both, and the list is the one a brute-force sum of
/// each counter's own days gives.
#[tokio::test]
async fn first_days_lists_walk_every_page_of_counters_and_buckets() {
    let fake = Fake::default();
    let addr = fake.start().await;
    let store = store_at(&format!("http://{addr}"));
    let n = 5003usize;
    // Counter i: first touch `start(i)` days ago, then the two days after.
    let start = |i: usize| 2 + (i % 3) as i64;
    let value = |i: usize, k: i64| ((i * 7919 + k as usize * 31) % 1000) as i64 + 1;
    let mut requests = Vec::new();
    for i in 0..n {
        let uuid = format!("u{i:05}");
        let mut events = Vec::new();
        for k in 0..3 {
            let at = now() - chrono::Duration::days(start(i) - k);
            let ts = at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
            let spec = IncrementSpec {
                entity: "VIDEO",
                action: "VIEW",
                uuid: &uuid,
                count: Some(value(i, k)),
                timestamp: Some(&ts),
                ..Default::default()
            };
            events.push(Increment::from_spec(&spec, &TimePolicy::default(), now()).unwrap());
        }
        requests.push(events);
    }
    for chunk in requests.chunks(1000) {
        let out = store
            .apply(WriteBatch {
                requests: chunk.to_vec(),
                ..Default::default()
            })
            .await
            .unwrap();
        assert!(
            out.requests
                .iter()
                .all(|r| matches!(r, RequestOutcome::Applied { .. })),
            "{:?}",
            out.requests
                .iter()
                .find(|r| !matches!(r, RequestOutcome::Applied { .. }))
        );
    }
    for days in [1u32, 2] {
        let mut want: Vec<(i128, String)> = (0..n)
            .map(|i| {
                let sum: i64 = (0..i64::from(days)).map(|k| value(i, k)).sum();
                (i128::from(sum), format!("u{i:05}"))
            })
            .collect();
        want.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        let today = counter_gateway::domain::day_of(now());
        let list = store
            .top_first_days(&counter_gateway::store::FirstDaysQuery {
                entity: "VIDEO".into(),
                action: "VIEW".into(),
                days,
                category: None,
                size: 20,
                oldest_day: today - 400,
            })
            .await
            .unwrap();
        let got: Vec<(i128, String)> = list
            .entries
            .iter()
            .map(|e| (e.value, e.uuid.clone()))
            .collect();
        assert_eq!(got, want[..20].to_vec(), "first {days} days");
        assert!(list.exact);
    }
}

/// CountAPI's records on the fake cluster: a create writes the namespace
/// and the key once each (`_create`, routed by namespace, refreshed before
/// the answer), the namespace holding the admin key's SHA-256 and never the
/// key; the counter is an ordinary counter document; a record read that
/// meets a recovering shard is asked again.
#[tokio::test]
async fn countapi_records_are_created_once_routed_and_hashed() {
    let fake = Fake::default();
    let addr = fake.start().await;
    let router = app(store_at(&format!("http://{addr}")));
    let (status, body) = call(
        &router,
        "GET",
        "/countapi/create?namespace=mysite.com&key=likes&value=5&enable_reset=1",
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let admin = body["admin_key"].as_str().unwrap().to_string();
    let (status, again) = call(
        &router,
        "GET",
        "/countapi/create?namespace=mysite.com&key=likes",
        None,
    )
    .await;
    assert_eq!(status, 409, "{again}");
    {
        let st = fake.0.lock().unwrap();
        let index = "counter-gateway_default_countapi".to_string();
        let ns = &st.docs[&(index.clone(), "ns:mysite.com".to_string())];
        assert_eq!(ns["kind"], "namespace");
        assert_eq!(
            ns["admin_key_sha256"],
            json!(counter_gateway::auth::digest_hex(&admin))
        );
        let key = &st.docs[&(index.clone(), "key:mysite.com/likes".to_string())];
        assert_eq!(
            (
                &key["enable_reset"],
                &key["update_lowerbound"],
                &key["update_upperbound"]
            ),
            (&json!(true), &json!(-1), &json!(1))
        );
        let all = serde_json::to_string(&st.docs.values().collect::<Vec<_>>()).unwrap();
        assert!(!all.contains(&admin), "the admin key is stored in clear");
        let creates: Vec<&String> = st
            .calls
            .iter()
            .filter(|c| c.starts_with("PUT /counter-gateway_default_countapi/_create/"))
            .collect();
        assert_eq!(creates.len(), 2, "{creates:?}");
        for c in creates {
            assert!(
                c.contains("routing=mysite.com") && c.contains("refresh=wait_for"),
                "{c}"
            );
        }
        assert_eq!(
            st.docs[&(
                "counter-gateway_default_counters".to_string(),
                "countapi_mysite.com_likes".to_string()
            )]["value"],
            json!(5)
        );
    }
    // `update` reads the records first: its GET meets the recovering shard.
    fake.0.lock().unwrap().get_faults = 2;
    let (status, body) = call(
        &router,
        "GET",
        "/countapi/update/mysite.com/likes?amount=1",
        None,
    )
    .await;
    assert_eq!((status, body), (200, json!({"value": 6})));
    assert_eq!(fake.0.lock().unwrap().get_faults, 0);
    let (status, body) = call(&router, "GET", "/countapi/info/mysite.com/likes", None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (&body["value"], &body["enable_reset"]),
        (&json!(6), &json!(true))
    );
    let (status, body) = call(
        &router,
        "GET",
        "/countapi/set/mysite.com/likes?value=9",
        None,
    )
    .await;
    assert_eq!((status, body), (200, json!({"old_value": 6, "value": 9})));
}

/// The tenant's bound on CountAPI namespaces, counted by a search of the
/// records: a create of a new namespace past it writes nothing; one of an
/// existing namespace still makes its key.
#[tokio::test]
async fn countapi_namespaces_are_bounded_per_tenant() {
    let fake = Fake::default();
    let addr = fake.start().await;
    let router = app(store_at(&format!("http://{addr}")));
    let (status, body) = call(
        &router,
        "GET",
        "/countapi/create?namespace=ns0&key=first",
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    {
        let mut st = fake.0.lock().unwrap();
        let index = "counter-gateway_default_countapi".to_string();
        for i in 1..counter_gateway::domain::countapi::MAX_NAMESPACES {
            let doc = json!({"kind": "namespace", "namespace": format!("ns{i}"),
                "admin_key_sha256": "00".repeat(32), "created": 0});
            st.docs.insert(
                (index.clone(), format!("ns:ns{i}")),
                doc.as_object().unwrap().clone(),
            );
        }
    }
    let (status, body) = call(
        &router,
        "GET",
        "/countapi/create?namespace=one-more&key=first",
        None,
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["error"]["reason"]
            .as_str()
            .unwrap()
            .contains("namespaces"),
        "{body}"
    );
    let (status, _) = call(&router, "GET", "/countapi/get/one-more/first", None).await;
    assert_eq!(status, 404);
    let (status, body) = call(
        &router,
        "GET",
        "/countapi/create?namespace=ns0&key=second",
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(body.get("admin_key").is_none(), "{body}");
}

/// Publication times go out and come back through the fake cluster as
/// through the embedded store: 5,003 targets (awkward names, so the order
/// is bytewise) cross a page of the export (5,000, `search_after` on
/// `entity` then `uuid`), and the cluster's file is byte for byte the
/// embedded store's. Imported into another cluster that has some times
/// already, the file replaces what it names (as an admin's `PUT`) and
/// keeps what it does not; exported again, it is the same file plus those.
#[tokio::test]
async fn publication_times_export_and_import_as_on_the_embedded_store() {
    use counter_gateway::store::PublishedSet;
    use counter_gateway::transfer::{format, import};
    let fake = Fake::default();
    let addr = fake.start().await;
    let cluster = store_at(&format!("http://{addr}"));
    let dir = tempfile::tempdir().unwrap();
    let embedded = counter_gateway::store::sqlite::SqliteStore::open(
        dir.path(),
        counter_gateway::store::sqlite::Durability::Full,
        Duration::from_secs(86_400),
        TimePolicy::default().retention_days,
        clock(),
    )
    .unwrap();
    let at = |i: usize| now().timestamp_millis() - 1_000 * (i as i64 + 1);
    let set = |entity: &str, uuid: &str, ms: i64| PublishedSet {
        entity: entity.into(),
        uuid: uuid.into(),
        at_ms: Some(ms),
        replace: true,
    };
    let mut sets: Vec<PublishedSet> = (0..5000)
        .map(|i| set("VIDEO", &format!("v{i:04}"), at(i)))
        .collect();
    for (i, uuid) in ["Z", "a%b", "ü-1"].into_iter().enumerate() {
        sets.push(set("ARTICLE", uuid, at(i)));
    }
    cluster.set_published(sets.clone()).await.unwrap();
    embedded.set_published(sets).await.unwrap();
    let hidden = indicatif::ProgressBar::hidden();
    let rules = format::Rules {
        now: now(),
        policy: TimePolicy::default(),
    };
    let file = export_text(&embedded, &rules, &hidden).await;
    assert_eq!(export_text(&*cluster, &rules, &hidden).await, file);
    let lines: Vec<&str> = file.lines().collect();
    assert_eq!(lines.len(), 1 + 5003);
    assert!(lines[1].contains(r#""uuid":"Z""#) && lines[3].contains(r#""uuid":"ü-1""#));
    // The export refreshed the index, then searched it a page at a time.
    let searches: Vec<Value> = fake
        .0
        .lock()
        .unwrap()
        .searches
        .iter()
        .filter(|(i, _, _)| i == "counter-gateway_default_targets")
        .map(|(_, _, q)| q.clone())
        .collect();
    assert_eq!(searches.len(), 2, "{searches:?}");
    assert_eq!(searches[1]["search_after"], json!(["VIDEO", "v4996"]));

    let other = Fake::default();
    let other_addr = other.start().await;
    let into = store_at(&format!("http://{other_addr}"));
    into.set_published(vec![
        set("VIDEO", "v0000", at(9000)),
        set("VIDEO", "zz-kept", at(9001)),
    ])
    .await
    .unwrap();
    let done = import::read_all(
        &*into,
        file.as_bytes(),
        &rules,
        &import::Options::default(),
        &hidden,
    )
    .await
    .unwrap();
    assert_eq!(done.published, 5003);
    assert_eq!(into.published("VIDEO", "v0000").await.unwrap(), Some(at(0)));
    let again = export_text(&*into, &rules, &hidden).await;
    let kept = format::published_line(&counter_gateway::store::TargetPublished {
        entity: "VIDEO".into(),
        uuid: "zz-kept".into(),
        at_ms: at(9001),
    });
    assert_eq!(again, format!("{file}{kept}"));
}

async fn export_text(
    store: &dyn Store,
    rules: &counter_gateway::transfer::format::Rules,
    hidden: &indicatif::ProgressBar,
) -> String {
    let mut out = Vec::new();
    export::write_all(
        store,
        &mut out,
        rules.oldest_day(),
        rules.oldest_hour_day(),
        hidden,
    )
    .await
    .unwrap();
    String::from_utf8(out).unwrap()
}

/// Hours travel to Elasticsearch (format 5) on the fake cluster as on a
/// real node: a file with hours imported into the cluster and into the
/// embedded store exports the same bytes from both, and both answer the
/// same hour histograms, `exact` included (a day whose hours do not sum to
/// it is not exact). Real nodes: `tests/es_transfer.rs`.
#[tokio::test]
async fn hours_import_and_export_as_on_the_embedded_store() {
    use counter_gateway::domain::{format_day, CounterKey, HourRange};
    use counter_gateway::transfer::{format, import};
    let fake = Fake::default();
    let addr = fake.start().await;
    let cluster = store_at(&format!("http://{addr}"));
    let dir = tempfile::tempdir().unwrap();
    let embedded = counter_gateway::store::sqlite::SqliteStore::open(
        dir.path(),
        counter_gateway::store::sqlite::Durability::Full,
        Duration::from_secs(86_400),
        TimePolicy::default().retention_days,
        clock(),
    )
    .unwrap();
    let today = counter_gateway::domain::day_of(now());
    let d = |n: i64| format_day(today - n);
    let h = |n: i64, hh: u32| format!("{}T{hh:02}", d(n));
    let rules = format::Rules {
        now: now(),
        policy: TimePolicy::default(),
    };
    let file = format!(
        "{}{}\n{}\n",
        format::header_line(),
        json!({"kind": "counter", "entity": "ARTICLE", "action": "VIEW", "uuid": "h1", "value": 26,
               "days": {d(20): 5, d(2): 6, d(1): 15}, "hours": {h(2, 0): 1, h(2, 23): 5, h(1, 7): 15}}),
        json!({"kind": "counter", "entity": "ARTICLE", "action": "VIEW", "uuid": "h2", "value": 12,
               "category": "news", "days": {d(1): 12}, "hours": {h(1, 3): 3, h(1, 4): 4}}),
    );
    let hidden = indicatif::ProgressBar::hidden();
    for store in [&embedded as &dyn Store, &*cluster] {
        let done = import::read_all(
            store,
            file.as_bytes(),
            &rules,
            &import::Options::default(),
            &hidden,
        )
        .await
        .unwrap();
        assert_eq!((done.counters, done.hours), (2, 5));
    }
    let exported = export_text(&embedded, &rules, &hidden).await;
    assert!(
        exported.contains(&format!(
            r#""hours":{{"{}":1,"{}":5,"{}":15}}"#,
            h(2, 0),
            h(2, 23),
            h(1, 7)
        )),
        "{exported}"
    );
    assert_eq!(export_text(&*cluster, &rules, &hidden).await, exported);
    let range = HourRange {
        from_hour: (today - 3) * 24,
        to_hour: today * 24 + 23,
    };
    for (uuid, exact) in [("h1", true), ("h2", false)] {
        let key = CounterKey::new("ARTICLE", "VIEW", uuid).unwrap();
        let a = embedded.hour_histogram(&key, range).await.unwrap().unwrap();
        let b = cluster.hour_histogram(&key, range).await.unwrap().unwrap();
        assert_eq!(a, b, "{uuid}");
        assert_eq!(a.exact, exact, "{uuid}: {a:?}");
    }
}
