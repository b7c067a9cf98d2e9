//! A counter's value set as a whole on Elasticsearch: one `_update` of the
//! counter document, a partial `doc` with an `upsert` for a counter that
//! does not exist yet, no script and no bucket.
//!
//! The shard applies an update atomically on its document (get, merge,
//! reindex, under the document's lock; a concurrent increment makes one of
//! them conflict and rerun, `retry_on_conflict`), so a set lands between
//! two increments of the counter, never inside one: every increment
//! applied before it is replaced, every increment applied after it adds
//! to the value. A flush's increments are scripted updates of the same
//! document, so an increment acknowledged after the set's 200 adds to it,
//! and one acknowledged before it is in what it replaced.
//!
//! A set writes the same document whenever it is repeated, so it is
//! resent freely: on 429, 5xx, a conflict that outlived
//! `retry_on_conflict`, and an answer lost in transit (where an increment
//! is never resent). The engine's own replay of the update on a new
//! primary is as harmless. It neither reads nor writes `applied_ops` nor
//! `event_ids`: the update scripts' names and ids stay what they were, so
//! their replays are still skipped. A repeat with the same value and
//! category is answered `noop` by the engine (`detect_noop`), and changes
//! nothing.
//!
//! The buckets are not touched: histograms and windowed lists are sums of
//! buckets and stay what the increments made them. Timestamps: a counter
//! created by the set is touched at the set's time (both timestamps); one
//! that exists keeps its own (the partial document names neither).

use elasticsearch::http::Method;
use serde_json::{json, Value};

use super::request::encode_path_segment;
use super::response::{self, ItemClass};
use super::ElasticsearchStore;
use crate::domain::{Counter, CounterSet};
use crate::store::StoreError;

impl ElasticsearchStore {
    pub(super) async fn set_value_es(&self, set: CounterSet) -> Result<Counter, StoreError> {
        let key = &set.key;
        let counter_id = key.doc_id();
        let body = serde_json::to_vec(&set_body(&set))
            .map_err(|e| StoreError::Internal(format!("encoding the set: {e}")))?;
        let path = format!(
            "/{}/_update/{}",
            self.config.names.counters(),
            encode_path_segment(&counter_id)
        );
        let retries = self.config.retry_on_conflict.to_string();
        let mut waited = std::time::Duration::ZERO;
        let mut attempt = 0;
        loop {
            let why = match self
                .call(
                    Method::Post,
                    &path,
                    &[("retry_on_conflict", &retries)],
                    Some(body.clone()),
                )
                .await
            {
                Ok((status, answer)) => {
                    match response::classify_item(status, answer.get("error")) {
                        ItemClass::Done => break,
                        ItemClass::Retry(r) | ItemClass::Unknown(r) => r,
                        ItemClass::Overflow(r) | ItemClass::Rejected(r) => {
                            return Err(StoreError::Internal(format!(
                                "the cluster refused to set counter {key}: {r}"
                            )))
                        }
                    }
                }
                Err(e) => e.to_string(),
            };
            let delay = self.config.backoff.delay(attempt, &self.jitter);
            if waited + delay > self.config.backoff.budget {
                return Err(StoreError::Unavailable(format!(
                    "counter {key} did not take the set ({why}); it may or may not be set, and setting the same value again is safe"
                )));
            }
            tokio::time::sleep(delay).await;
            waited += delay;
            attempt += 1;
        }
        // The realtime GET sees the write; an increment that landed right
        // after the set is in the answer too, as in a GET.
        self.get_counter(key).await?.ok_or_else(|| {
            StoreError::Unavailable(format!(
                "counter {key} was set, then deleted before it could be read back"
            ))
        })
    }
}

/// The `_update` body of a set: the value (and the category when given)
/// merged into the document, or the whole document when there is none.
fn set_body(set: &CounterSet) -> Value {
    let key = &set.key;
    let mut doc = json!({"value": set.value});
    let mut upsert = json!({
        "counter_id": key.doc_id(),
        "entity": &*key.entity,
        "action": &*key.action,
        "uuid": &*key.uuid,
        "value": set.value,
        "first_timestamp": set.now_ms,
        "recorded_timestamp": set.now_ms,
    });
    if let Some(c) = &set.category {
        doc["category"] = json!(&**c);
        upsert["category"] = json!(&**c);
    }
    json!({"doc": doc, "upsert": upsert})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::CounterKey;

    fn set(category: Option<&str>) -> CounterSet {
        CounterSet {
            key: CounterKey::new("VIDEO", "VIEW", "a_b").unwrap(),
            value: -7,
            category: category.map(Into::into),
            now_ms: 1_700_000_000_000,
        }
    }

    #[test]
    fn a_set_merges_the_value_and_creates_a_whole_document() {
        let body = set_body(&set(Some("news")));
        assert_eq!(body["doc"], json!({"value": -7, "category": "news"}));
        let up = &body["upsert"];
        assert_eq!(up["counter_id"], json!("VIDEO_VIEW_a%5Fb"));
        assert_eq!(up["uuid"], json!("a_b"));
        assert_eq!(up["value"], json!(-7));
        assert_eq!(up["first_timestamp"], json!(1_700_000_000_000i64));
        assert_eq!(up["recorded_timestamp"], json!(1_700_000_000_000i64));
        // No script: nothing of the update scripts' bookkeeping is touched.
        assert!(body.get("script").is_none());
        assert!(body["doc"].get("applied_ops").is_none());
    }

    #[test]
    fn without_a_category_the_stored_one_stays() {
        let body = set_body(&set(None));
        assert_eq!(body["doc"], json!({"value": -7}));
        assert!(body["upsert"].get("category").is_none());
    }
}
