//! Backfill on Elasticsearch: a day bucket set to a value, its counter moved
//! by the difference, correct under retries, crashes and concurrent
//! increments, without a multi-document transaction.
//!
//! The bucket is the record of truth. A set of day D of counter C to `n`:
//!
//! 1. reads D's bucket with its `_seq_no` and `_primary_term` (realtime GET);
//! 2. if the bucket names an earlier set in `last_set` (id, difference),
//!    applies that set to the counter first (step 4 for it): a no-op when
//!    the counter has it already;
//! 3. writes the bucket conditionally (`if_seq_no`/`if_primary_term`, or
//!    `_create` when it had none): value `n`, and `last_set` naming this
//!    set, a fresh random id, and its difference `n - old`. A conflict (an
//!    increment landed meanwhile) goes back to 1 with the new value;
//! 4. applies the difference to the counter with the stored script
//!    `counter-set`, which remembers per day the id of the last set it
//!    applied (`set_days`, not indexed) and skips a set it has: this is what
//!    makes steps 2 and 4 safe to repeat, on a retry, a lost answer, or
//!    another gateway completing it.
//!
//! A bucket's `last_set` is replaced only by a later set, which completes
//! it first (step 2), so the counter has applied every set but at most the
//! last of each bucket, and that one is applied by whoever sets the bucket
//! next. A crash between 3 and 4 leaves the bucket at `n` and the counter
//! behind by the difference until then; setting the same value again (or
//! any value) completes it exactly, however much later, since `set_days`
//! forgets a day only once it is past the retention (where sets are refused).
//! Increments commute with all of this: they add to the bucket (step 3
//! then conflicts and re-reads) and to the counter (the script adds).
//!
//! Overflow is checked before anything is written, from the counters and
//! buckets as read then; an increment racing in between can still make step
//! 4 overflow, and then the bucket write is taken back (its difference
//! subtracted, conditionally) before the set is refused.

use std::collections::HashMap;

use elasticsearch::http::Method;
use serde_json::{json, Value};

use super::client::status_error;
use super::request::{bucket_doc_id, encode_path_segment};
use super::response::{self, ItemClass};
use super::{templates, ElasticsearchStore};
use crate::domain::{format_day, CounterKey, DaySet};
use crate::store::{DaysOutcome, StoreError};

/// Conditional writes of one bucket before a set gives up: each conflict
/// means an increment landed on the same bucket between the read and the
/// write, so only a bucket taking increments without pause exhausts them.
const MAX_BUCKET_ATTEMPTS: u32 = 20;

/// Documents per `_mget` of the overflow check.
const MGET_DOCS: usize = 1_000;

/// A bucket document as read: its value, the set it names, its version.
struct BucketState {
    /// `None`: no such document.
    version: Option<(i64, i64)>,
    value: i64,
    source: serde_json::Map<String, Value>,
    last_set: Option<LastSet>,
}

/// The set a bucket document names in `last_set`.
#[derive(Clone, Debug, PartialEq)]
struct LastSet {
    id: String,
    /// `n - old`; a decimal string, since it may leave i64.
    delta: String,
    touch_ms: i64,
    category: Option<String>,
}

impl LastSet {
    fn from_value(v: &Value) -> Option<LastSet> {
        Some(LastSet {
            id: v.get("id")?.as_str()?.to_string(),
            delta: v.get("delta")?.as_str()?.to_string(),
            touch_ms: v.get("touch_ms")?.as_i64()?,
            category: v
                .get("category")
                .and_then(Value::as_str)
                .map(str::to_string),
        })
    }

    fn to_value(&self) -> Value {
        json!({"id": self.id, "delta": self.delta, "touch_ms": self.touch_ms, "category": self.category})
    }
}

/// Why one set did not finish.
enum SetError {
    /// Nothing of it is applied: its counter would leave the i64 range.
    Overflow,
    /// Not finished; with `true`, the day may be half set (its bucket
    /// holds a set its counter does not have yet), with `false` nothing of
    /// this set was written.
    Failed(String, bool),
}

impl ElasticsearchStore {
    pub(super) async fn set_days_es(
        &self,
        sets: Vec<DaySet>,
        oldest_day: i64,
    ) -> Result<DaysOutcome, StoreError> {
        let days: Vec<i64> = sets.iter().map(|s| s.day).collect();
        self.ensure_bucket_days(&days).await;
        self.ensure_set_mappings(&days).await?;
        if let Some(index) = self.would_overflow(&sets).await? {
            return Ok(DaysOutcome::Overflow { index });
        }
        let mut previous = Vec::with_capacity(sets.len());
        for (i, s) in sets.iter().enumerate() {
            match self.set_one(s, oldest_day).await {
                Ok(old) => previous.push(old),
                Err(SetError::Overflow) if i == 0 => return Ok(DaysOutcome::Overflow { index: 0 }),
                Err(SetError::Overflow) => {
                    return Ok(DaysOutcome::Incomplete {
                        done: i,
                        // Its bucket was taken back before the refusal.
                        half_set: false,
                        reason: format!(
                            "an increment that raced the backfill would make counter {} leave the signed 64-bit range",
                            s.key
                        ),
                    });
                }
                Err(SetError::Failed(reason, half_set)) => {
                    return Ok(DaysOutcome::Incomplete {
                        done: i,
                        half_set,
                        reason,
                    })
                }
            }
        }
        let mut counters = HashMap::new();
        for s in &sets {
            if counters.contains_key(&s.key) {
                continue;
            }
            if let Some(c) = self.get_counter(&s.key).await? {
                counters.insert(s.key.clone(), c);
            }
        }
        Ok(DaysOutcome::Applied { previous, counters })
    }

    /// The index of the first set whose counter would leave the i64 range,
    /// from the counters and buckets as they are now (two `_mget`s a
    /// thousand documents at a time).
    pub(super) async fn would_overflow(
        &self,
        sets: &[DaySet],
    ) -> Result<Option<usize>, StoreError> {
        let names = &self.config.names;
        let mut counter_ids: Vec<String> = sets.iter().map(|s| s.key.doc_id()).collect();
        counter_ids.sort();
        counter_ids.dedup();
        let mut values: HashMap<String, i64> = HashMap::new();
        for chunk in counter_ids.chunks(MGET_DOCS) {
            let docs: Vec<Value> = chunk
                .iter()
                .map(|id| json!({"_index": names.counters(), "_id": id, "_source": ["value"]}))
                .collect();
            for (id, src) in self.mget(docs).await? {
                values.insert(id, src.get("value").and_then(Value::as_i64).unwrap_or(0));
            }
        }
        let mut buckets: HashMap<String, i64> = HashMap::new();
        for chunk in sets.chunks(MGET_DOCS) {
            let docs: Vec<Value> = chunk
                .iter()
                .map(|s| {
                    let cid = s.key.doc_id();
                    json!({"_index": names.buckets(s.day), "_id": bucket_doc_id(&cid, s.day),
                           "routing": cid, "_source": ["value"]})
                })
                .collect();
            for (id, src) in self.mget(docs).await? {
                buckets.insert(id, src.get("value").and_then(Value::as_i64).unwrap_or(0));
            }
        }
        let mut totals: HashMap<String, (i128, usize)> = HashMap::new();
        for (i, s) in sets.iter().enumerate() {
            let cid = s.key.doc_id();
            let old = buckets
                .get(&bucket_doc_id(&cid, s.day))
                .copied()
                .unwrap_or(0);
            let start = i128::from(values.get(&cid).copied().unwrap_or(0));
            let t = totals.entry(cid).or_insert((start, i));
            t.0 += i128::from(s.value) - i128::from(old);
            t.1 = i;
        }
        Ok(totals
            .values()
            .filter(|(total, _)| i64::try_from(*total).is_err())
            .map(|&(_, last)| last)
            .min())
    }

    /// The found documents of a `_mget`, by id.
    async fn mget(&self, docs: Vec<Value>) -> Result<Vec<(String, Value)>, StoreError> {
        let answer = self
            .post_json("/_mget", &[], &json!({"docs": docs}))
            .await?;
        let mut out = Vec::new();
        for d in answer
            .get("docs")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            // A missing index answers an `error` for its docs: nothing there.
            if d.get("found").and_then(Value::as_bool) == Some(true) {
                if let (Some(id), Some(src)) =
                    (d.get("_id").and_then(Value::as_str), d.get("_source"))
                {
                    out.push((id.to_string(), src.clone()));
                }
            }
        }
        Ok(out)
    }

    /// One set, steps 1 to 4 of the module documentation; answers the
    /// bucket's value before it.
    async fn set_one(&self, s: &DaySet, oldest_day: i64) -> Result<i64, SetError> {
        let counter_id = s.key.doc_id();
        let index = self.config.names.buckets(s.day);
        let doc = encode_path_segment(&bucket_doc_id(&counter_id, s.day));
        let failed = |what: &str, e: String, half: bool| {
            SetError::Failed(
                format!(
                    "setting day {} of counter {}: {what}: {e}",
                    format_day(s.day),
                    s.key
                ),
                half,
            )
        };
        let mine = LastSet {
            id: new_set_id(),
            delta: String::new(),
            touch_ms: s.touch_ms(),
            category: s.category.as_deref().map(str::to_string),
        };
        // The value this set replaced, once its bucket write may have landed.
        let mut replaced: Option<i64> = None;
        // Whether a bucket write of this set may have landed: every answer
        // but a conflict or a refusal leaves it possible.
        let mut maybe_written = false;
        let mut attempt = 0;
        loop {
            let b = self
                .read_bucket(&index, &doc, &counter_id)
                .await
                .map_err(|e| failed("reading the bucket", e, maybe_written))?;
            if let Some(last) = &b.last_set {
                self.apply_to_counter(&s.key, last, true, oldest_day)
                    .await
                    .map_err(|e| match e {
                        // An earlier set that cannot complete: report it, apply nothing more.
                        SetError::Overflow => failed(
                            "completing an earlier set of this day",
                            "it would overflow the counter".into(),
                            true,
                        ),
                        other => other,
                    })?;
                if last.id == mine.id {
                    // Our own write landed (its answer was lost or conflicted).
                    return Ok(replaced.unwrap_or(b.value));
                }
            }
            if b.version.is_some() && b.value == s.value {
                // The bucket holds the value: a repeat. Touch the counter
                // (category, timestamps) as a set does, change nothing else.
                self.apply_to_counter(&s.key, &mine, false, oldest_day)
                    .await
                    .map_err(|e| match e {
                        SetError::Overflow => {
                            failed("touching the counter", "overflow".into(), maybe_written)
                        }
                        other => other,
                    })?;
                return Ok(replaced.unwrap_or(b.value));
            }
            attempt += 1;
            if attempt > MAX_BUCKET_ATTEMPTS {
                return Err(failed(
                    "giving up",
                    format!("the bucket changed under {MAX_BUCKET_ATTEMPTS} attempts in a row"),
                    maybe_written,
                ));
            }
            let this = LastSet {
                delta: (i128::from(s.value) - i128::from(b.value)).to_string(),
                ..mine.clone()
            };
            let mut source = b.source.clone();
            source.insert("counter_id".into(), json!(counter_id));
            source.insert("entity".into(), json!(&*s.key.entity));
            source.insert("action".into(), json!(&*s.key.action));
            source.insert("uuid".into(), json!(&*s.key.uuid));
            source.insert("day".into(), json!(s.touch_ms()));
            source.insert("value".into(), json!(s.value));
            source.remove("skipped_events");
            if let Some(c) = &s.category {
                source.insert("category".into(), json!(&**c));
            }
            source.insert("last_set".into(), this.to_value());
            let body = serde_json::to_vec(&Value::Object(source))
                .map_err(|e| failed("encoding the bucket", e.to_string(), maybe_written))?;
            let (path, seq, term);
            let mut params: Vec<(&str, &str)> = vec![("routing", counter_id.as_str())];
            match b.version {
                Some((s_no, p_term)) => {
                    path = format!("/{index}/_doc/{doc}");
                    (seq, term) = (s_no.to_string(), p_term.to_string());
                    params.push(("if_seq_no", &seq));
                    params.push(("if_primary_term", &term));
                }
                None => path = format!("/{index}/_create/{doc}"),
            }
            replaced = Some(b.value);
            match self.call(Method::Put, &path, &params, Some(body)).await {
                Ok((200 | 201, _)) => {}
                // Another write came first (an increment, another set):
                // read again. So does a lost answer, below: step 2 finds
                // our own write if it landed.
                Ok((409, _)) => continue,
                Ok((status, answer)) if status == 429 || status >= 500 => {
                    // A proxy's 5xx may hide a write that landed.
                    maybe_written = true;
                    tracing::debug!(status, error = %response::describe_error(answer.get("error")), "bucket write refused; retrying");
                    self.pause(attempt).await;
                    continue;
                }
                Ok((status, answer)) => {
                    return Err(failed(
                        "writing the bucket",
                        format!("{status} {}", response::describe_error(answer.get("error"))),
                        maybe_written,
                    ))
                }
                Err(e) => {
                    maybe_written = true;
                    tracing::debug!(error = %e, "bucket write unanswered; reading it again");
                    self.pause(attempt).await;
                    continue;
                }
            }
            match self.apply_to_counter(&s.key, &this, true, oldest_day).await {
                Ok(()) => return Ok(b.value),
                Err(SetError::Overflow) => {
                    self.take_back(&index, &doc, &counter_id, &this)
                        .await
                        .map_err(|e| failed("taking back the bucket after an overflow", e, true))?;
                    return Err(SetError::Overflow);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Step 1: the bucket document with its version; absent reads as 0.
    async fn read_bucket(
        &self,
        index: &str,
        doc: &str,
        counter_id: &str,
    ) -> Result<BucketState, String> {
        // A GET takes its routing as one value, commas included.
        let params = [("routing", counter_id)];
        let (status, body) = self
            .call(Method::Get, &format!("/{index}/_doc/{doc}"), &params, None)
            .await
            .map_err(|e| e.to_string())?;
        let found = body.get("found").and_then(Value::as_bool) == Some(true);
        if status == 404
            && (!found || response::error_type(&body) == Some("index_not_found_exception"))
        {
            return Ok(BucketState {
                version: None,
                value: 0,
                source: Default::default(),
                last_set: None,
            });
        }
        if status != 200 || !found {
            return Err(format!(
                "get answered {status} {}",
                response::describe_error(body.get("error"))
            ));
        }
        let version = match (
            body.get("_seq_no").and_then(Value::as_i64),
            body.get("_primary_term").and_then(Value::as_i64),
        ) {
            (Some(s), Some(t)) => (s, t),
            _ => return Err("the get answered no _seq_no/_primary_term".into()),
        };
        let source = body
            .get("_source")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        Ok(BucketState {
            version: Some(version),
            value: source.get("value").and_then(Value::as_i64).unwrap_or(0),
            last_set: source.get("last_set").and_then(LastSet::from_value),
            source,
        })
    }

    /// Step 4 (and 2): the set's difference applied to the counter by the
    /// stored script, which skips a set it has applied; with `counted`
    /// false, only the touch (category, timestamps) of a set whose bucket
    /// held its value already. Safe to resend whatever became of an
    /// earlier attempt, so every failure but an overflow is retried within
    /// the back-off budget.
    async fn apply_to_counter(
        &self,
        key: &CounterKey,
        set: &LastSet,
        counted: bool,
        oldest_day: i64,
    ) -> Result<(), SetError> {
        let counter_id = key.doc_id();
        let day = set.touch_ms.div_euclid(86_400_000);
        let params = json!({
            "counter_id": counter_id,
            "entity": &*key.entity,
            "action": &*key.action,
            "uuid": &*key.uuid,
            "day": format_day(day),
            "set_id": counted.then_some(set.id.as_str()),
            "delta": if counted { set.delta.as_str() } else { "0" },
            "touch_ms": set.touch_ms,
            "category": set.category.as_deref(),
            // A day of margin: another gateway whose clock is a little
            // behind may still accept (and complete) a set of the oldest day.
            "oldest_day": format_day(oldest_day - 1),
        });
        let body = serde_json::to_vec(&json!({
            "scripted_upsert": true,
            "upsert": {},
            "script": {"id": templates::counter_set_script_id(self.config.names.prefix()), "params": params},
        }))
        .map_err(|e| SetError::Failed(e.to_string(), true))?;
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
                Ok((status, answer)) => match response::classify_item(status, answer.get("error")) {
                    ItemClass::Done => return Ok(()),
                    ItemClass::Overflow(_) => return Err(SetError::Overflow),
                    ItemClass::Retry(r) | ItemClass::Unknown(r) => r,
                    ItemClass::Rejected(r) => {
                        return Err(SetError::Failed(
                            format!(
                                "the counter {key} refused the set of day {}: {r}; its bucket is set, so setting the same value again completes it",
                                format_day(day)
                            ),
                            true,
                        ))
                    }
                },
                Err(e) => e.to_string(),
            };
            let delay = self.config.backoff.delay(attempt, &self.jitter);
            if waited + delay > self.config.backoff.budget {
                return Err(SetError::Failed(
                    format!(
                        "the counter {key} did not take the set of day {} ({why}); its bucket may be set already, and setting the same value again completes it",
                        format_day(day)
                    ),
                    true,
                ));
            }
            tokio::time::sleep(delay).await;
            waited += delay;
            attempt += 1;
        }
    }

    /// After an overflow in step 4: subtracts this set's difference from
    /// the bucket again and clears `last_set`, conditionally, while the
    /// bucket still names this set.
    async fn take_back(
        &self,
        index: &str,
        doc: &str,
        counter_id: &str,
        this: &LastSet,
    ) -> Result<(), String> {
        let delta: i128 = this.delta.parse().map_err(|_| "bad delta".to_string())?;
        for attempt in 0..MAX_BUCKET_ATTEMPTS {
            let b = self.read_bucket(index, doc, counter_id).await?;
            if b.last_set.as_ref().map(|l| &l.id) != Some(&this.id) {
                return Ok(());
            }
            let Ok(value) = i64::try_from(i128::from(b.value) - delta) else {
                return Err("the bucket cannot be taken back within i64".into());
            };
            let mut source = b.source;
            source.insert("value".into(), json!(value));
            source.remove("last_set");
            let Some((seq, term)) = b.version else {
                return Ok(());
            };
            let (seq, term) = (seq.to_string(), term.to_string());
            let body = serde_json::to_vec(&Value::Object(source)).map_err(|e| e.to_string())?;
            match self
                .call(
                    Method::Put,
                    &format!("/{index}/_doc/{doc}"),
                    &[
                        ("routing", counter_id),
                        ("if_seq_no", &seq),
                        ("if_primary_term", &term),
                    ],
                    Some(body),
                )
                .await
            {
                Ok((200 | 201, _)) => return Ok(()),
                Ok((409, _)) => continue,
                Ok((status, answer)) if status == 429 || status >= 500 => {
                    let _ = answer;
                    self.pause(attempt + 1).await;
                }
                Ok((status, answer)) => {
                    return Err(format!(
                        "{status} {}",
                        response::describe_error(answer.get("error"))
                    ))
                }
                Err(_) => self.pause(attempt + 1).await,
            }
        }
        Err("the bucket kept changing".into())
    }

    async fn pause(&self, attempt: u32) {
        tokio::time::sleep(self.config.backoff.delay(attempt, &self.jitter)).await;
    }

    /// The mapping of `set_days` (counters) and `last_set` (buckets), put
    /// on the indices a set writes to: indices created before this version
    /// of the templates lack them, and strict mappings would refuse the
    /// write. Adding a field is allowed on a live index and idempotent;
    /// each index is put once per store.
    pub(super) async fn ensure_set_mappings(&self, days: &[i64]) -> Result<(), StoreError> {
        let names = &self.config.names;
        let mut wanted = vec![(
            names.counters(),
            json!({"properties": {"set_days": {"type": "object", "enabled": false}}}),
        )];
        let mut months: Vec<String> = days.iter().map(|&d| names.buckets(d)).collect();
        months.sort();
        months.dedup();
        for m in months {
            wanted.push((
                m,
                json!({"properties": {"last_set": {"type": "object", "enabled": false}}}),
            ));
        }
        for (index, mapping) in wanted {
            if self
                .mapped_for_sets
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains(&index)
            {
                continue;
            }
            let body =
                serde_json::to_vec(&mapping).map_err(|e| StoreError::Internal(e.to_string()))?;
            let (status, answer) = self
                .call(Method::Put, &format!("/{index}/_mapping"), &[], Some(body))
                .await?;
            match status {
                200 => {}
                // Not there yet: the index template (with both fields)
                // creates it on the first write.
                404 if response::error_type(&answer) == Some("index_not_found_exception") => {
                    continue
                }
                _ => {
                    return Err(status_error(
                        status,
                        format!(
                        "adding the backfill fields to the mapping of {index} answered {status} {}",
                        response::describe_error(answer.get("error"))
                    ),
                    ))
                }
            }
            let mut done = self
                .mapped_for_sets
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if done.len() > 64 {
                done.clear();
            }
            done.insert(index);
        }
        Ok(())
    }
}

/// A fresh id for one set: 128 random bits, so two sets (of any gateway,
/// at any time) never share one.
fn new_set_id() -> String {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 16];
    if ring::rand::SystemRandom::new().fill(&mut bytes).is_err() {
        // No system randomness: the time and a sequence still tell sets apart here.
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        return format!("t{t:x}-{n:x}");
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
