//! Reading Elasticsearch answers: each `_bulk` item classified from its
//! `(status, error)` alone (a pure function, tested with captured shapes),
//! and the documents of get and search answers turned into counters.

use serde_json::Value;

use crate::domain::{Counter, CounterKey};

/// The marker the stored scripts put in front of an overflow message, so an
/// overflow is told apart from every other script failure.
pub const OVERFLOW_MARKER: &str = "counter_overflow:";

/// What to do about one bulk item.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ItemClass {
    /// Applied (`created`, `updated` or `noop`).
    Done,
    /// Not applied, worth resending after a pause: an item's 429
    /// (back-pressure) or 5xx, or a 409 version conflict that outlived
    /// `retry_on_conflict`; a whole bulk refused as [`classify_request`] says.
    Retry(String),
    /// Not applied: the script refused the addition as out of the i64 range.
    Overflow(String),
    /// Not applied and resending would not help (mapping, script, 4xx).
    Rejected(String),
    /// Maybe applied, maybe not (the answer was lost): never resent, since
    /// resending an applied increment would count it twice.
    Unknown(String),
}

/// Classifies one item of a `_bulk` answer.
pub fn classify_item(status: u16, error: Option<&Value>) -> ItemClass {
    let reason = || describe_error(error);
    match status {
        200..=299 => ItemClass::Done,
        429 | 409 | 500..=599 => ItemClass::Retry(format!("{status} {}", reason())),
        _ => {
            if let Some(msg) = error.and_then(find_overflow) {
                ItemClass::Overflow(msg)
            } else {
                ItemClass::Rejected(format!("{status} {}", reason()))
            }
        }
    }
}

/// Classifies a whole `_bulk` answer that is not a 200.
///
/// Only an answer that proves nothing was applied is resent: 429
/// (back-pressure, refused before any item ran) and a 503 whose body is the
/// engine's own error (an `error.type`, e.g. a cluster block). A 502, a 504
/// or any other 5xx, or a 503 with a body the engine did not write, may come
/// from a proxy that gave up after forwarding the bulk, which the cluster may
/// then have applied: [`ItemClass::Unknown`], never resent (an event id
/// makes the client's retry exact). Any other status refused the request.
pub fn classify_request(status: u16, body: &Value) -> ItemClass {
    let error = body.get("error");
    let from_engine = error
        .and_then(|e| e.get("type"))
        .and_then(Value::as_str)
        .is_some();
    match status {
        429 => ItemClass::Retry(format!("{status} {}", describe_error(error))),
        503 if from_engine => ItemClass::Retry(format!("{status} {}", describe_error(error))),
        500..=599 => ItemClass::Unknown(format!(
            "outcome unknown, not resent (an event id makes a retry safe): the bulk answered {status} {}",
            describe_error(error)
        )),
        _ => ItemClass::Rejected(format!("{status} {}", describe_error(error))),
    }
}

/// `type: reason`, followed by the innermost cause, which is where a script
/// failure says what actually went wrong.
pub fn describe_error(error: Option<&Value>) -> String {
    let Some(e) = error else {
        return "(no error detail)".into();
    };
    if let Some(s) = e.as_str() {
        return s.to_string();
    }
    let part = |v: &Value| {
        format!(
            "{}: {}",
            v.get("type").and_then(Value::as_str).unwrap_or("unknown"),
            v.get("reason").and_then(Value::as_str).unwrap_or("")
        )
    };
    let mut out = part(e);
    // The innermost cause that says something (a script's compile error
    // ends in a cause with no reason).
    let mut inner = e;
    while let Some(c) = inner.get("caused_by") {
        if c.get("reason").and_then(Value::as_str).is_none() {
            break;
        }
        inner = c;
    }
    if !std::ptr::eq(inner, e) {
        out.push_str(" (caused by ");
        out.push_str(&part(inner));
        out.push(')');
    }
    out
}

/// The overflow message in an error or any of its causes.
fn find_overflow(error: &Value) -> Option<String> {
    let mut cur = Some(error);
    while let Some(e) = cur {
        if let Some(r) = e.get("reason").and_then(Value::as_str) {
            if let Some(pos) = r.find(OVERFLOW_MARKER) {
                return Some(r[pos + OVERFLOW_MARKER.len()..].trim().to_string());
            }
        }
        cur = e.get("caused_by");
    }
    None
}

/// One item of a parsed `_bulk` answer.
#[derive(Clone, Debug, PartialEq)]
pub struct ItemResult {
    pub class: ItemClass,
    /// The document after the update, when `_source` was asked for.
    pub source: Option<Value>,
    /// The engine answered `result: noop`: the script changed nothing.
    pub noop: bool,
}

/// Parses a 200 `_bulk` answer into one result per item sent, in order.
/// `Err` when the answer does not match what was sent (then nothing can be
/// said of any item, and nothing is acknowledged).
pub fn parse_bulk(body: &Value, sent: usize) -> Result<Vec<ItemResult>, String> {
    let items = body
        .get("items")
        .and_then(Value::as_array)
        .ok_or("the _bulk answer has no items array")?;
    if items.len() != sent {
        return Err(format!(
            "the _bulk answer has {} items for {sent} sent",
            items.len()
        ));
    }
    items
        .iter()
        .map(|item| {
            let (_, inner) = item
                .as_object()
                .and_then(|o| o.iter().next())
                .ok_or("a _bulk item is not an object")?;
            let status = inner
                .get("status")
                .and_then(Value::as_u64)
                .and_then(|s| u16::try_from(s).ok())
                .ok_or("a _bulk item has no status")?;
            Ok(ItemResult {
                class: classify_item(status, inner.get("error")),
                source: inner.pointer("/get/_source").cloned(),
                noop: inner.get("result").and_then(Value::as_str) == Some("noop"),
            })
        })
        .collect()
}

/// Positions (in `params.events`) the script skipped as already counted.
pub fn skipped_events(source: Option<&Value>) -> Vec<usize> {
    source
        .and_then(|s| s.get("skipped_events"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_u64)
                .filter_map(|n| usize::try_from(n).ok())
                .collect()
        })
        .unwrap_or_default()
}

fn as_i64(v: Option<&Value>) -> Option<i64> {
    let v = v?;
    v.as_i64()
        .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
}

/// A timestamp as stored: epoch milliseconds (what the scripts write) or an
/// RFC 3339 string (what a person might index by hand).
fn as_ms(v: Option<&Value>) -> Option<i64> {
    as_i64(v).or_else(|| {
        v?.as_str()
            .and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok())
            .map(|t| t.timestamp_millis())
    })
}

/// A counter document's `_source`, read into a counter. `None` when it lacks
/// the fields every counter document has.
pub fn counter_from_source(source: &Value) -> Option<Counter> {
    let part = |name: &str| source.get(name).and_then(Value::as_str);
    let key = CounterKey {
        entity: part("entity")?.into(),
        action: part("action")?.into(),
        uuid: part("uuid")?.into(),
    };
    let recorded_ms = as_ms(source.get("recorded_timestamp"))?;
    Some(Counter {
        key,
        value: as_i64(source.get("value"))?,
        category: part("category").map(str::to_string),
        first_ms: as_ms(source.get("first_timestamp")).unwrap_or(recorded_ms),
        recorded_ms,
    })
}

/// The counter of a realtime `GET /<index>/_doc/<id>` answer (status 200 or
/// 404); `None` when not found.
pub fn counter_from_get(status: u16, body: &Value) -> Result<Option<Counter>, String> {
    match status {
        200 if body.get("found") == Some(&Value::Bool(true)) => body
            .get("_source")
            .and_then(counter_from_source)
            .map(Some)
            .ok_or_else(|| "the counter document lacks required fields".into()),
        200 | 404 if body.get("found") == Some(&Value::Bool(false)) => Ok(None),
        // The index does not exist yet: nothing was ever counted.
        404 if error_type(body) == Some("index_not_found_exception") => Ok(None),
        _ => Err(format!(
            "get answered {status} {}",
            describe_error(body.get("error"))
        )),
    }
}

/// The counters of a `_search` answer, in hit order.
pub fn counters_from_search(body: &Value) -> Result<Vec<Counter>, String> {
    let hits = body
        .pointer("/hits/hits")
        .and_then(Value::as_array)
        .ok_or("the search answer has no hits")?;
    hits.iter()
        .map(|h| {
            h.get("_source")
                .and_then(counter_from_source)
                .ok_or_else(|| "a counter document lacks required fields".to_string())
        })
        .collect()
}

pub fn error_type(body: &Value) -> Option<&str> {
    body.pointer("/error/type").and_then(Value::as_str)
}

/// Why an `_mget` answer of counters could not be read.
#[derive(Debug, PartialEq, Eq)]
pub enum MgetError {
    /// A document could not be read (a shard failed): worth retrying.
    Doc(String),
    /// The answer is not what `_mget` gives: a bug or a proxy in the way.
    Shape(String),
}

/// The counters of an `_mget` of `ids`, one per id in order (`None`: not
/// found). The engine answers every document in request order, a missing
/// index as a per-document `index_not_found_exception` inside a 200 (as the
/// real node does for a tenant never written to): that reads as not found.
pub fn counters_from_mget(body: &Value, ids: &[String]) -> Result<Vec<Option<Counter>>, MgetError> {
    let docs = body
        .get("docs")
        .and_then(Value::as_array)
        .ok_or_else(|| MgetError::Shape("the _mget answer has no docs".into()))?;
    if docs.len() != ids.len() {
        return Err(MgetError::Shape(format!(
            "the _mget answer has {} docs for {} ids",
            docs.len(),
            ids.len()
        )));
    }
    docs.iter()
        .zip(ids)
        .map(|(doc, id)| {
            if doc.get("_id").and_then(Value::as_str) != Some(id.as_str()) {
                return Err(MgetError::Shape(format!(
                    "the _mget answer is out of order: {} where {id:?} was asked",
                    doc.get("_id").unwrap_or(&Value::Null)
                )));
            }
            if let Some(error) = doc.get("error") {
                return match error.get("type").and_then(Value::as_str) {
                    Some("index_not_found_exception") => Ok(None),
                    _ => Err(MgetError::Doc(format!(
                        "_mget of {id:?} failed: {}",
                        describe_error(Some(error))
                    ))),
                };
            }
            match doc.get("found") {
                Some(Value::Bool(true)) => doc
                    .get("_source")
                    .and_then(counter_from_source)
                    .map(Some)
                    .ok_or_else(|| {
                        MgetError::Shape(format!(
                            "the counter document {id:?} lacks required fields"
                        ))
                    }),
                Some(Value::Bool(false)) => Ok(None),
                _ => Err(MgetError::Shape(format!(
                    "the _mget answer for {id:?} says neither found nor error"
                ))),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn statuses_map_to_classes() {
        assert_eq!(classify_item(200, None), ItemClass::Done);
        assert_eq!(classify_item(201, None), ItemClass::Done);
        let rejected =
            json!({"type": "es_rejected_execution_exception", "reason": "rejected execution"});
        assert!(matches!(
            classify_item(429, Some(&rejected)),
            ItemClass::Retry(_)
        ));
        assert!(matches!(classify_item(503, None), ItemClass::Retry(_)));
        assert!(matches!(classify_item(409, None), ItemClass::Retry(_)));
        let mapper =
            json!({"type": "strict_dynamic_mapping_exception", "reason": "mapping set to strict"});
        assert!(matches!(
            classify_item(400, Some(&mapper)),
            ItemClass::Rejected(_)
        ));
    }

    #[test]
    fn only_a_bulk_proven_unapplied_is_resent() {
        let engine = json!({"error": {"type": "cluster_block_exception", "reason": "blocked"}, "status": 503});
        assert!(matches!(
            classify_request(429, &Value::Null),
            ItemClass::Retry(_)
        ));
        assert!(matches!(
            classify_request(503, &engine),
            ItemClass::Retry(_)
        ));
        // A proxy's answer: the bulk may have been applied behind it.
        for status in [500, 502, 503, 504] {
            for body in [
                Value::Null,
                json!({"message": "upstream timed out"}),
                json!({"error": "Bad Gateway"}),
            ] {
                assert!(
                    matches!(classify_request(status, &body), ItemClass::Unknown(_)),
                    "{status} {body}"
                );
            }
        }
        assert!(matches!(
            classify_request(502, &engine),
            ItemClass::Unknown(_)
        ));
        assert!(matches!(
            classify_request(413, &Value::Null),
            ItemClass::Rejected(_)
        ));
    }

    #[test]
    fn overflow_is_found_in_the_innermost_cause() {
        let e = json!({
            "type": "illegal_argument_exception",
            "reason": "failed to execute script",
            "caused_by": {"type": "script_exception", "reason": "runtime error",
                "caused_by": {"type": "illegal_argument_exception",
                    "reason": "counter_overflow: counter x would leave the signed 64-bit range"}}
        });
        assert_eq!(
            classify_item(400, Some(&e)),
            ItemClass::Overflow("counter x would leave the signed 64-bit range".into())
        );
        // Any other script failure is a rejection, not an overflow.
        let other = json!({"type": "illegal_argument_exception", "reason": "failed to execute script",
            "caused_by": {"type": "script_exception", "reason": "compile error"}});
        assert!(matches!(
            classify_item(400, Some(&other)),
            ItemClass::Rejected(_)
        ));
    }

    /// Answers of the real OpenSearch 2.19 node (`tests/es_real.rs` plays
    /// the same reads), trimmed to the fields the parser reads.
    #[test]
    fn mget_answers_read_in_order_with_missing_indices_as_not_found() {
        let source = json!({"entity": "A", "action": "V", "uuid": "x", "value": 5,
            "first_timestamp": "2026-11-30T10:00:00.000Z", "recorded_timestamp": "2026-11-30T10:00:00.000Z"});
        let ids: Vec<String> = ["A_V_x", "nope", "A_V_x"].map(String::from).to_vec();
        let found = json!({"docs": [
            {"_index": "c", "_id": "A_V_x", "_version": 1, "_seq_no": 0, "_primary_term": 1, "found": true, "_source": source},
            {"_index": "c", "_id": "nope", "found": false},
            {"_index": "c", "_id": "A_V_x", "_version": 1, "_seq_no": 0, "_primary_term": 1, "found": true, "_source": source},
        ]});
        let got = counters_from_mget(&found, &ids).unwrap();
        assert_eq!(
            got.iter()
                .map(|c| c.as_ref().map(|c| c.value))
                .collect::<Vec<_>>(),
            [Some(5), None, Some(5)]
        );

        let missing_index = json!({"type": "index_not_found_exception", "reason": "no such index [c]", "index": "c"});
        let no_index = json!({"docs": [
            {"_index": "c", "_id": "A_V_x", "error": {"root_cause": [missing_index.clone()], "type": "index_not_found_exception", "reason": "no such index [c]"}},
            {"_index": "c", "_id": "nope", "error": missing_index},
            {"_index": "c", "_id": "A_V_x", "error": {"type": "index_not_found_exception", "reason": "no such index [c]"}},
        ]});
        assert_eq!(
            counters_from_mget(&no_index, &ids).unwrap(),
            [None, None, None]
        );
    }

    #[test]
    fn mget_failures_are_told_apart_from_misshapen_answers() {
        let ids = vec!["a".to_string()];
        let shard = json!({"docs": [{"_index": "c", "_id": "a",
            "error": {"type": "no_shard_available_action_exception", "reason": "No shard available"}}]});
        assert!(
            matches!(counters_from_mget(&shard, &ids), Err(MgetError::Doc(m)) if m.contains("No shard available"))
        );
        for bad in [
            json!({}),
            json!({"docs": []}),
            json!({"docs": [{"_id": "b", "found": false}]}),
            json!({"docs": [{"_id": "a"}]}),
            json!({"docs": [{"_id": "a", "found": true, "_source": {"entity": "A"}}]}),
        ] {
            assert!(
                matches!(counters_from_mget(&bad, &ids), Err(MgetError::Shape(_))),
                "{bad}"
            );
        }
    }
}
