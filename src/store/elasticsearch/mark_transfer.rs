//! Actor marks in and out of Elasticsearch, and the fingerprint of the
//! secret they are keyed with.
//!
//! Export: the marks that count their actor (`counted`, and likes being
//! taken back, `retracting`), searched in the order both stores share
//! (`ActorMark::order`): `ever` marks sorted by `counter_hash` then `mark`,
//! then `day` marks by `day`, `counter_hash` and `mark`, paged with
//! `search_after`. Both fields are copies of what the `_id` holds, kept
//! with doc values because `_id` cannot be sorted on (Elasticsearch 8
//! refuses it); mark documents an earlier version made without them get
//! them before the first page ([`ElasticsearchStore::fill_mark_fields`]).
//!
//! Import: each mark set with a partial update (`doc_as_upsert`): its
//! state, and for a retraction when it began, set; what the document
//! remembers (event ids) kept; the flush token cleared, so no flush still
//! settling that mark changes what the import set. Setting the same state
//! again is a `noop`.
//!
//! The fingerprint (`ActorKey::fingerprint`) is recorded in the `_meta` of
//! the tenant's `actor_marks` index by `migrate` and `import`; the gateway
//! reads every tenant's at start and refuses a secret of another one. The
//! same `_meta` records which tenant the marks are keyed for
//! (`mark_keying`).

use std::sync::atomic::Ordering;

use elasticsearch::http::Method;
use serde_json::{json, Map, Value};

use super::client::status_error;
use super::request::{mark_doc_id, BulkAction};
use super::response::{self, ItemClass};
use super::transfer::hits;
use super::ElasticsearchStore;
use crate::domain::{decode_doc_id, to_hex, CounterKey, Mark};
use crate::store::{ActorMark, MarkState, StoreError};

/// The key of the fingerprint in the `_meta` of an `actor_marks` index.
pub const FINGERPRINT_META: &str = "actor_secret_fingerprint";

/// Hits per search page (Elasticsearch's default result window).
const SEARCH_PAGE: usize = 10_000;

/// Documents given their sort fields per round of
/// [`ElasticsearchStore::fill_mark_fields`].
const FILL_PAGE: usize = 2_000;

/// Rounds of [`ElasticsearchStore::fill_mark_fields`] before it gives up
/// (documents keep appearing without the fields: a gateway of an earlier
/// version is writing).
const FILL_ROUNDS: usize = 1_000;

/// The mark a document's `_id` ends with: `<counter>@<mark>` for a like,
/// `<counter>@<mark>@YYYY-MM-DD` for a view (`request::mark_doc_id`).
fn mark_of_id(id: &str, day_mark: bool) -> Option<Mark> {
    let rest = if day_mark { id.rsplit_once('@')?.0 } else { id };
    Mark::from_hex(rest.rsplit_once('@')?.1)
}

/// The counter key a mark document's `counter_id` encodes.
fn key_of(counter_id: &str) -> Result<CounterKey, StoreError> {
    let bad = || {
        StoreError::Internal(format!(
            "a mark document names counter {counter_id:?}, which is no counter's id"
        ))
    };
    let (e, a, u) = decode_doc_id(counter_id).ok_or_else(bad)?;
    CounterKey::new(&e, &a, &u).map_err(|_| bad())
}

/// One hit of an export search: its sort values end with the counter hash
/// and the mark; `day` marks start with the day.
fn mark_of_hit(hit: &Value, day_mark: bool) -> Result<ActorMark, StoreError> {
    let sort = hit.get("sort").and_then(Value::as_array);
    let at = |i: usize| sort.and_then(|s| s.get(i));
    let mark_at = if day_mark { 2 } else { 1 };
    let mark = at(mark_at)
        .and_then(Value::as_str)
        .and_then(Mark::from_hex)
        .ok_or_else(|| {
            StoreError::Internal(format!(
                "mark document {} has no `mark` to be listed by (a gateway of an earlier version wrote it during the export): export again",
                hit.get("_id").and_then(Value::as_str).unwrap_or("?")
            ))
        })?;
    let source = hit.get("_source").unwrap_or(&Value::Null);
    let counter_id = source
        .get("counter_id")
        .and_then(Value::as_str)
        .ok_or_else(|| StoreError::Internal("a mark document lacks counter_id".into()))?;
    let day = if day_mark {
        let ms = at(0)
            .and_then(Value::as_i64)
            .ok_or_else(|| StoreError::Internal("a day mark document lacks its day".into()))?;
        Some(ms.div_euclid(86_400_000))
    } else {
        None
    };
    let state = match source.get("state").and_then(Value::as_str) {
        Some("retracting") => MarkState::Retracting {
            since_ms: source.get("since").and_then(Value::as_i64).unwrap_or(0),
        },
        _ => MarkState::Counted,
    };
    Ok(ActorMark {
        key: key_of(counter_id)?,
        mark,
        day,
        state,
    })
}

/// The partial document an import sets a mark to.
fn import_doc(m: &ActorMark, counter_id: &str) -> Value {
    let mut doc = Map::new();
    doc.insert("counter_id".into(), json!(counter_id));
    doc.insert(
        "scope".into(),
        json!(if m.day.is_some() { "day" } else { "ever" }),
    );
    if let Some(day) = m.day {
        doc.insert("day".into(), json!(day * 86_400_000));
    }
    doc.insert(
        "counter_hash".into(),
        json!(to_hex(&ActorMark::counter_hash_of_id(counter_id))),
    );
    doc.insert("mark".into(), json!(m.mark.hex()));
    match m.state {
        MarkState::Counted => {
            doc.insert("state".into(), json!("counted"));
        }
        MarkState::Retracting { since_ms } => {
            doc.insert("state".into(), json!("retracting"));
            doc.insert("since".into(), json!(since_ms));
        }
    }
    doc.insert("token".into(), Value::Null);
    json!({"doc": doc, "doc_as_upsert": true})
}

impl ElasticsearchStore {
    pub(super) async fn mark_page_es(
        &self,
        after: Option<ActorMark>,
        limit: usize,
        from_day: i64,
    ) -> Result<Vec<ActorMark>, StoreError> {
        let names = &self.config.names;
        if after.is_none() {
            self.refresh_tenant(&names.tenant_pattern()).await?;
            self.fill_mark_fields().await?;
        }
        let limit = limit.min(SEARCH_PAGE);
        let mut out = Vec::with_capacity(limit);
        let day_after = match &after {
            Some(a @ ActorMark { day: Some(day), .. }) => Some(json!([
                day * 86_400_000,
                to_hex(&ActorMark::counter_hash(&a.key)),
                a.mark.hex()
            ])),
            _ => {
                let mut body = json!({
                    "size": limit,
                    "track_total_hits": false,
                    "query": {"bool": {"filter": [
                        {"terms": {"state": ["counted", "retracting"]}}
                    ]}},
                    "sort": [{"counter_hash": "asc"}, {"mark": "asc"}],
                    "_source": {"includes": ["counter_id", "state", "since"]},
                });
                if let Some(a) = &after {
                    body["search_after"] =
                        json!([to_hex(&ActorMark::counter_hash(&a.key)), a.mark.hex()]);
                }
                let answer = self
                    .search(&format!("/{}/_search", names.actor_marks()), &[], &body)
                    .await?;
                for h in hits(&answer)? {
                    out.push(mark_of_hit(h, false)?);
                }
                if out.len() >= limit {
                    return Ok(out);
                }
                None
            }
        };
        let mut body = json!({
            "size": limit - out.len(),
            "track_total_hits": false,
            "query": {"bool": {"filter": [
                {"term": {"state": "counted"}},
                {"range": {"day": {"gte": from_day * 86_400_000}}}
            ]}},
            "sort": [{"day": "asc"}, {"counter_hash": "asc"}, {"mark": "asc"}],
            "_source": {"includes": ["counter_id", "state"]},
        });
        if let Some(a) = day_after {
            body["search_after"] = a;
        }
        let answer = self
            .search(
                &format!("/{}/_search", names.actor_day_marks_pattern()),
                &[],
                &body,
            )
            .await?;
        for h in hits(&answer)? {
            out.push(mark_of_hit(h, true)?);
        }
        Ok(out)
    }

    /// Gives this tenant's mark documents that lack `counter_hash` and
    /// `mark` (made by a gateway of an earlier version) both, read from
    /// their `counter_id` and `_id`, so that an export lists every mark.
    /// One search when none lacks them. Returns how many were given.
    async fn fill_mark_fields(&self) -> Result<u64, StoreError> {
        let names = &self.config.names;
        let pattern = format!(
            "{},{}",
            names.actor_marks(),
            names.actor_day_marks_pattern()
        );
        let mut filled = 0;
        for _ in 0..FILL_ROUNDS {
            let body = json!({
                "size": FILL_PAGE,
                "track_total_hits": false,
                "query": {"bool": {"must_not": [{"exists": {"field": "mark"}}]}},
                "_source": {"includes": ["counter_id"]},
            });
            let answer = self
                .search(&format!("/{pattern}/_search"), &[], &body)
                .await?;
            let page = hits(&answer)?;
            if page.is_empty() {
                return Ok(filled);
            }
            if filled == 0 {
                // Indices of an earlier version may lack the two fields.
                self.upgrade_mark_mappings().await?;
            }
            let mut actions = Vec::with_capacity(page.len());
            for h in page {
                let text = |f: &str| h.get(f).and_then(Value::as_str).unwrap_or_default();
                let (index, id) = (text("_index"), text("_id"));
                let counter_id = h
                    .pointer("/_source/counter_id")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let day_mark = index.contains("_actor_day_marks-");
                let Some(mark) = mark_of_id(id, day_mark).filter(|_| !counter_id.is_empty()) else {
                    return Err(StoreError::Internal(format!(
                        "mark document {index}/{id} is not named as a mark is"
                    )));
                };
                actions.push(BulkAction {
                    index: index.to_string(),
                    id: id.to_string(),
                    routing: Some(
                        h.get("_routing")
                            .and_then(Value::as_str)
                            .unwrap_or(counter_id)
                            .to_string(),
                    ),
                    body: json!({"doc": {
                        "counter_hash": to_hex(&ActorMark::counter_hash_of_id(counter_id)),
                        "mark": mark.hex(),
                    }}),
                });
            }
            self.write_all_marks(&actions, "giving mark documents their sort fields")
                .await?;
            filled += actions.len() as u64;
            self.refresh_tenant(&pattern).await?;
        }
        Err(StoreError::Unavailable(
            "mark documents without `mark` keep appearing (a gateway of an earlier version is writing): upgrade every gateway, then export again".into(),
        ))
    }

    /// Sends `actions`; every one must succeed.
    async fn write_all_marks(&self, actions: &[BulkAction], what: &str) -> Result<(), StoreError> {
        let (results, _) = self
            .send_actions(actions, self.config.retry_on_conflict)
            .await;
        for (a, r) in actions.iter().zip(results) {
            match r.class {
                ItemClass::Done => {}
                ItemClass::Retry(why) | ItemClass::Unknown(why) => {
                    return Err(StoreError::Unavailable(format!(
                        "{what}: {}/{}: {why}",
                        a.index, a.id
                    )))
                }
                ItemClass::Rejected(why) | ItemClass::Overflow(why) => {
                    return Err(StoreError::Internal(format!(
                        "{what}: {}/{} refused: {why}",
                        a.index, a.id
                    )))
                }
            }
        }
        Ok(())
    }

    /// Sets each mark of an import (see the module doc). The indices they
    /// go to are made first, as a flush makes them (writes never rely on
    /// automatic index creation).
    pub(super) async fn import_marks(&self, marks: &[ActorMark]) -> Result<(), StoreError> {
        if marks.is_empty() {
            return Ok(());
        }
        // Imported marks are of this tenant's keying (an older file's were
        // brought to it as they were read): never mixed with older ones.
        self.ensure_marks_keyed().await?;
        let names = &self.config.names;
        if marks.iter().any(|m| m.day.is_none()) {
            self.ensure_marks_index().await?;
        }
        let days: Vec<i64> = marks.iter().filter_map(|m| m.day).collect();
        self.ensure_mark_months(&days).await;
        let actions: Vec<BulkAction> = marks
            .iter()
            .map(|m| {
                let counter_id = m.key.doc_id();
                let index = match m.day {
                    None => names.actor_marks(),
                    Some(d) => names.actor_day_marks(d),
                };
                BulkAction {
                    index,
                    id: mark_doc_id(&counter_id, &m.mark.hex(), m.day),
                    body: import_doc(m, &counter_id),
                    routing: Some(counter_id),
                }
            })
            .collect();
        self.write_all_marks(&actions, "importing actor marks")
            .await
    }

    /// Creates this tenant's `actor_marks` index once per store (a flush
    /// of likes has the template create it; an import or a recorded
    /// fingerprint may come first).
    pub(super) async fn ensure_marks_index(&self) -> Result<(), StoreError> {
        if self.marks_index_ready.load(Ordering::Relaxed) {
            return Ok(());
        }
        let index = self.config.names.actor_marks();
        self.create_index(&index)
            .await
            .map_err(|e| StoreError::Unavailable(format!("creating {index}: {e}")))?;
        self.marks_index_ready.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// The fingerprint of the secret this tenant's marks are keyed with,
    /// as `migrate` or `import` recorded it; `None` when none was.
    pub async fn recorded_fingerprint(&self) -> Result<Option<String>, StoreError> {
        let index = self.config.names.actor_marks();
        let (status, answer) = self
            .call(Method::Get, &format!("/{index}/_mapping"), &[], None)
            .await?;
        match status {
            200 => Ok(answer
                .get(&index)
                .and_then(|i| i.pointer(&format!("/mappings/_meta/{FINGERPRINT_META}")))
                .and_then(Value::as_str)
                .map(str::to_string)),
            404 => Ok(None),
            _ => Err(status_error(
                status,
                format!(
                    "reading the mapping of {index} answered {status} {}",
                    response::describe_error(answer.get("error"))
                ),
            )),
        }
    }

    /// Records `fingerprint` as the one this tenant's marks are keyed with
    /// (beside their keying, which the `_meta` keeps).
    pub async fn record_fingerprint(&self, fingerprint: &str) -> Result<(), StoreError> {
        self.set_marks_meta(FINGERPRINT_META, fingerprint).await
    }

    /// Every fingerprint recorded under this prefix, as (index, fingerprint),
    /// by index name: what a gateway checks its secret against at start.
    pub async fn recorded_fingerprints(&self) -> Result<Vec<(String, String)>, StoreError> {
        let (pattern, _) = self.config.names.all_actor_marks();
        let answer = self
            .call_ok(
                Method::Get,
                &format!("/{pattern}/_mapping"),
                &[("ignore_unavailable", "true"), ("allow_no_indices", "true")],
                None,
                &format!("reading the mappings of {pattern}"),
            )
            .await?;
        let mut out: Vec<(String, String)> = answer
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(index, m)| {
                let fp = m
                    .pointer(&format!("/mappings/_meta/{FINGERPRINT_META}"))
                    .and_then(Value::as_str)?;
                Some((index.clone(), fp.to_string()))
            })
            .collect();
        out.sort();
        Ok(out)
    }

    /// Adds `counter_hash` and `mark` to the mapping of mark indices an
    /// earlier version's template made (a write of this version sets them,
    /// and strict mappings would refuse it). Adding a field is allowed on a
    /// live index and idempotent; no index matching is fine.
    pub(super) async fn upgrade_mark_mappings(&self) -> Result<(), StoreError> {
        let (ever, day) = self.config.names.all_actor_marks();
        let body = serde_json::to_vec(&json!({"properties": {
            "counter_hash": {"type": "keyword", "index": false},
            "mark": {"type": "keyword", "index": false},
        }}))
        .map_err(|e| StoreError::Internal(e.to_string()))?;
        let (status, answer) = self
            .call(
                Method::Put,
                &format!("/{ever},{day}/_mapping"),
                &[("ignore_unavailable", "true"), ("allow_no_indices", "true")],
                Some(body),
            )
            .await?;
        match status {
            200 => Ok(()),
            404 if response::error_type(&answer) == Some("index_not_found_exception") => Ok(()),
            _ => Err(status_error(
                status,
                format!(
                    "adding the mark fields to the mapping of {ever},{day} answered {status} {}",
                    response::describe_error(answer.get("error"))
                ),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_is_read_back_from_its_document_id() {
        let mark = "0123456789abcdef0123456789abcdef";
        let m = Mark::from_hex(mark).unwrap();
        assert_eq!(
            mark_of_id(&mark_doc_id("ARTICLE_like_a@1", mark, None), false),
            Some(m)
        );
        assert_eq!(
            mark_of_id(&mark_doc_id("ARTICLE_VIEW_a1", mark, Some(20_787)), true),
            Some(m)
        );
        // Counter ids past 512 bytes are hashed in the `_id`; the mark stays.
        let long = "x".repeat(500);
        assert_eq!(
            mark_of_id(&mark_doc_id(&long, mark, Some(20_787)), true),
            Some(m)
        );
        assert_eq!(mark_of_id("ARTICLE_like_a1", false), None);
    }

    #[test]
    fn an_imported_mark_is_set_whole_and_clears_the_flush_token() {
        let key = CounterKey::new("ARTICLE", "like", "a1").unwrap();
        let m = ActorMark {
            key: key.clone(),
            mark: Mark([7; 16]),
            day: None,
            state: MarkState::Retracting { since_ms: 5 },
        };
        let body = import_doc(&m, &key.doc_id());
        assert_eq!(body["doc_as_upsert"], json!(true));
        assert_eq!(body["doc"]["state"], "retracting");
        assert_eq!(body["doc"]["since"], 5);
        assert_eq!(body["doc"]["token"], Value::Null);
        assert_eq!(body["doc"]["scope"], "ever");
        assert!(body["doc"].get("day").is_none());
        let v = ActorMark {
            day: Some(3),
            state: MarkState::Counted,
            ..m
        };
        let body = import_doc(&v, &key.doc_id());
        assert_eq!(body["doc"]["day"], 3 * 86_400_000);
        assert!(body["doc"].get("since").is_none());
        assert_eq!(
            body["doc"]["counter_hash"],
            json!(to_hex(&ActorMark::counter_hash(&key)))
        );
    }
}
