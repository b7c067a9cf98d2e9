//! The write path: a flush planned as scripted upserts (one per counter
//! document, one per day bucket document), sent as `_bulk`, every item's
//! result classified, only failed retryable items resent; overflow undone
//! and replayed request by request; deletes.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use elasticsearch::http::Method;
use serde_json::Value;

use super::client::{search_routing, status_error, TransportError};
use super::request::{self, BulkAction, DocWrite, Plan, PlanOverflow, Target, WriteSettings};
use super::response::{self, ItemClass, ItemResult};
use super::{templates, ElasticsearchStore};
use crate::domain::{Counter, CounterKey, Increment, Kind};
use crate::store::{BatchOutcome, RequestOutcome, StoreError, WriteBatch};

/// What became of one event of a flush on its counter (or average)
/// document: what the marks of `unique` events are settled by (`marks.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Fate {
    /// Its document took the update.
    Counted,
    /// Its document did not take it (or it was undone).
    NotApplied,
    /// Nobody knows (an answer lost, an undo that failed).
    Unknown,
}

/// Per request and event, the fate of each event of `requests`, from the
/// results of `plan`'s writes (an event's fate is its counter's write).
fn fates_of(plan: &Plan, results: &[ItemResult], requests: &[&[Increment]]) -> Vec<Vec<Fate>> {
    let mut main: HashMap<(bool, &CounterKey), usize> = HashMap::new();
    for (i, w) in plan.writes.iter().enumerate() {
        match w.target {
            Target::Counter => main.insert((false, &w.key), i),
            Target::Average => main.insert((true, &w.key), i),
            _ => None,
        };
    }
    requests
        .iter()
        .map(|events| {
            events
                .iter()
                .map(|e| {
                    let average = matches!(e.kind, Kind::Sample { .. });
                    match main.get(&(average, &e.key)).map(|&w| &results[w].class) {
                        Some(ItemClass::Done) => Fate::Counted,
                        Some(ItemClass::Unknown(_)) | None => Fate::Unknown,
                        Some(_) => Fate::NotApplied,
                    }
                })
                .collect()
        })
        .collect()
}

/// Every event of `requests` with one fate.
fn all_fates(requests: &[&[Increment]], fate: Fate) -> Vec<Vec<Fate>> {
    requests.iter().map(|r| vec![fate; r.len()]).collect()
}

/// Most items in one `_bulk` request: a few thousand, as Elasticsearch advises;
/// flushes with more distinct documents are sent as several requests.
pub const MAX_BULK_ITEMS: usize = 5_000;

/// Most events with an id one `_bulk` plan carries (a whole request more
/// only when one request alone has more). It bounds the `events` a script
/// loops over in one document, which with the remembered ids
/// ([`super::config::EsConfig::painless_loop_worst_case`]) must stay well
/// under Painless's limit of 1,000,000 loop iterations per script run.
pub const MAX_ID_EVENTS_PER_PLAN: usize = 10_000;

/// Splits a flush's requests (each given by its number of events with an
/// id) into consecutive runs of at most `max` such events; a request over
/// `max` is a run of its own. Pure, so tested alone.
pub fn runs_by_id_events(id_events: &[usize], max: usize) -> Vec<std::ops::Range<usize>> {
    let mut runs = Vec::new();
    let (mut start, mut total) = (0, 0);
    for (i, &n) in id_events.iter().enumerate() {
        if i > start && total + n > max {
            runs.push(start..i);
            start = i;
            total = 0;
        }
        total += n;
    }
    if start < id_events.len() {
        runs.push(start..id_events.len());
    }
    runs
}

impl ElasticsearchStore {
    /// Applies a flush as runs of requests ([`runs_by_id_events`]), one
    /// plan each, in order; almost every flush is one run.
    pub(super) async fn apply_batch(&self, batch: WriteBatch) -> Result<BatchOutcome, StoreError> {
        if batch.requests.iter().flatten().any(|e| e.unique.is_some()) {
            return self.apply_marked(batch).await;
        }
        self.apply_requests(&batch.requests, &batch.wanted, None)
            .await
    }

    /// Applies `requests` as runs of requests ([`runs_by_id_events`]), one
    /// plan each, in order; almost every flush is one run. With `fates`,
    /// also says what became of each event (for the marks).
    pub(super) async fn apply_requests(
        &self,
        requests: &[Vec<Increment>],
        wanted: &HashSet<CounterKey>,
        mut fates: Option<&mut Vec<Vec<Fate>>>,
    ) -> Result<BatchOutcome, StoreError> {
        let all: Vec<&[Increment]> = requests.iter().map(Vec::as_slice).collect();
        self.ensure_bucket_indices(&all).await;
        let ids: Vec<usize> = requests
            .iter()
            .map(|r| r.iter().filter(|i| i.id.is_some()).count())
            .collect();
        let runs = runs_by_id_events(&ids, MAX_ID_EVENTS_PER_PLAN);
        if runs.len() <= 1 {
            return self.apply_run(requests, wanted, fates).await;
        }
        let mut out = BatchOutcome::default();
        for run in runs {
            let part = self
                .apply_run(&requests[run], wanted, fates.as_deref_mut())
                .await?;
            out.requests.extend(part.requests);
            out.counters.extend(part.counters);
            out.store_writes += part.store_writes;
        }
        Ok(out)
    }

    /// One plan; with `fates`, the fate of each of its events is appended.
    async fn apply_run(
        &self,
        batch: &[Vec<Increment>],
        wanted: &HashSet<CounterKey>,
        mut fates: Option<&mut Vec<Vec<Fate>>>,
    ) -> Result<BatchOutcome, StoreError> {
        let settings = self.settings(self.clock.now_ms());
        let requests: Vec<&[Increment]> = batch.iter().map(Vec::as_slice).collect();
        let mut out = BatchOutcome::default();
        let mut record = |f: Vec<Vec<Fate>>| {
            if let Some(fates) = fates.as_deref_mut() {
                fates.extend(f);
            }
        };
        let hours_from = self.hours_from_day();
        if let Ok(plan) = request::plan(&requests, hours_from) {
            let (results, sent) = self.send_writes(&plan.writes, &settings, wanted).await;
            out.store_writes += sent;
            if !results.iter().any(is_overflow) {
                out.requests = outcomes(&plan, &results);
                counters_after(&plan, &results, wanted, &mut out.counters);
                record(fates_of(&plan, &results, &requests));
                return Ok(out);
            }
            if results
                .iter()
                .any(|r| matches!(r.class, ItemClass::Unknown(_)))
            {
                // Replaying could count the unknown items twice: undo what
                // is known and fail the flush instead.
                self.undo(&plan.writes, &results, &settings, &mut out.store_writes)
                    .await;
                record(all_fates(&requests, Fate::Unknown));
                out.requests = vec![
                    RequestOutcome::Failed {
                        reason: "an addition overflowed and some items of the flush have an unknown outcome".into()
                    };
                    requests.len()
                ];
                return Ok(out);
            }
            tracing::info!("a flush would overflow a counter; applying its requests one by one");
            if !self
                .undo(&plan.writes, &results, &settings, &mut out.store_writes)
                .await
            {
                out.requests = vec![
                    RequestOutcome::Failed {
                        reason: "an addition overflowed and undoing the rest of the flush failed"
                            .into()
                    };
                    requests.len()
                ];
                record(all_fates(&requests, Fate::Unknown));
                return Ok(out);
            }
        }
        // One request at a time: exactly the overflowing ones are refused.
        for events in &requests {
            let one = std::slice::from_ref(events);
            let (outcome, fate) = match request::plan(one, hours_from) {
                Err(PlanOverflow(key)) => (
                    RequestOutcome::Overflow { key },
                    all_fates(one, Fate::NotApplied),
                ),
                Ok(plan) => {
                    let (results, sent) = self.send_writes(&plan.writes, &settings, wanted).await;
                    out.store_writes += sent;
                    if let Some(w) = results.iter().position(is_overflow) {
                        if self
                            .undo(&plan.writes, &results, &settings, &mut out.store_writes)
                            .await
                        {
                            (
                                RequestOutcome::Overflow {
                                    key: plan.writes[w].key.clone(),
                                },
                                all_fates(one, Fate::NotApplied),
                            )
                        } else {
                            (RequestOutcome::Failed {
                                reason: "an addition overflowed and undoing the rest of the request failed".into(),
                            }, all_fates(one, Fate::Unknown))
                        }
                    } else {
                        counters_after(&plan, &results, wanted, &mut out.counters);
                        (
                            outcomes(&plan, &results).remove(0),
                            fates_of(&plan, &results, one),
                        )
                    }
                }
            };
            out.requests.push(outcome);
            record(fate);
        }
        Ok(out)
    }

    pub(super) async fn delete_counter(&self, key: &CounterKey) -> Result<bool, StoreError> {
        let id = key.doc_id();
        // Its buckets and its actor marks (a counter made again starts with
        // no likes and no views).
        let pattern = format!(
            "{},{},{}",
            self.config.names.buckets_pattern(),
            self.config.names.hours_pattern(),
            self.config.names.actor_marks_pattern()
        );
        self.refresh_tenant(&pattern).await?;
        let body = serde_json::to_vec(&request::buckets_of_counter_query(&id))
            .map_err(|e| StoreError::Internal(e.to_string()))?;
        let mut params = search_routing(&id);
        params.extend_from_slice(&[
            ("conflicts", "proceed"),
            ("refresh", "true"),
            ("ignore_unavailable", "true"),
            ("allow_no_indices", "true"),
        ]);
        let (status, answer) = self
            .call(
                Method::Post,
                &format!("/{pattern}/_delete_by_query"),
                &params,
                Some(body),
            )
            .await?;
        let failures = answer
            .get("failures")
            .and_then(Value::as_array)
            .map_or(0, Vec::len);
        if status != 200 || failures > 0 {
            return Err(status_error(
                status,
                format!(
                    "deleting the buckets of {key} answered {status} with {failures} failures {}",
                    response::describe_error(answer.get("error"))
                ),
            ));
        }
        let path = format!(
            "/{}/_doc/{}",
            self.config.names.counters(),
            request::encode_path_segment(&id)
        );
        let (status, answer) = self.call(Method::Delete, &path, &[], None).await?;
        match status {
            200 => Ok(true),
            404 => Ok(false),
            _ => Err(status_error(
                status,
                format!(
                    "delete answered {status} {}",
                    response::describe_error(answer.get("error"))
                ),
            )),
        }
    }

    /// The first day whose increments also land in hour documents: the
    /// hourly retention's, so a late event never makes an hour index the
    /// retention deleted.
    pub(super) fn hours_from_day(&self) -> i64 {
        self.clock.today() - i64::from(self.config.hourly_retention_days)
    }

    fn settings(&self, now_ms: i64) -> WriteSettings {
        let prefix = self.config.names.prefix();
        WriteSettings {
            counter_script: templates::counter_script_id(prefix),
            bucket_script: templates::bucket_script_id(prefix),
            average_script: templates::average_script_id(prefix),
            average_bucket_script: templates::average_bucket_script_id(prefix),
            retry_on_conflict: self.config.retry_on_conflict,
            now_ms,
            id_window_ms: i64::try_from(self.config.id_window.as_millis()).unwrap_or(i64::MAX),
            max_ids: self.config.max_ids_per_doc,
        }
    }

    /// Sends `writes` as one `_bulk`, then resends only the items that failed
    /// retryably, with back-off, until all are settled or the budget is
    /// spent. Returns one result per write, and the number of items sent.
    async fn send_writes(
        &self,
        writes: &[DocWrite],
        settings: &WriteSettings,
        wanted: &HashSet<CounterKey>,
    ) -> (Vec<ItemResult>, usize) {
        // One name for the whole bulk: each document is in it once, and
        // its resends (below) carry the same name, so none is taken twice.
        let op = self.ops.next();
        let actions: Vec<_> = writes
            .iter()
            .map(|w| {
                request::action(
                    w,
                    &self.config.names,
                    settings,
                    &op,
                    wanted.contains(&w.key),
                )
            })
            .collect();
        let (results, sent) = self
            .send_actions(&actions, settings.retry_on_conflict)
            .await;
        let taken = results.iter().filter(|r| r.noop).count();
        if taken > 0 {
            // Only a name the document remembers makes an update script
            // skip: the item was applied before, and counts once.
            request::WRITES_TAKEN_ALREADY
                .fetch_add(taken as u64, std::sync::atomic::Ordering::Relaxed);
            tracing::info!(
                items = taken,
                "bulk items already taken by their documents (a replay on a new primary, \
                 or a resend): skipped"
            );
        }
        (results, sent)
    }

    /// [`Self::send_writes`] for actions already built (the marks').
    pub(super) async fn send_actions(
        &self,
        actions: &[BulkAction],
        retry_on_conflict: u32,
    ) -> (Vec<ItemResult>, usize) {
        let mut results: Vec<Option<ItemResult>> = vec![None; actions.len()];
        let mut pending: Vec<usize> = (0..actions.len()).collect();
        let mut reasons: HashMap<usize, String> = HashMap::new();
        let mut sent = 0;
        let mut waited = Duration::ZERO;
        let mut attempt = 0;
        let timeout = self.config.bulk_timeout_param();
        let settle = |results: &mut Vec<Option<ItemResult>>, i: usize, class: ItemClass| {
            results[i] = Some(ItemResult {
                class,
                source: None,
                noop: false,
            });
        };
        while !pending.is_empty() {
            let mut retry = Vec::new();
            // One _bulk per flush, split only past MAX_BULK_ITEMS so a huge
            // flush stays well under Elasticsearch's request size limit.
            for chunk in pending.chunks(MAX_BULK_ITEMS) {
                let batch: Vec<_> = chunk.iter().map(|&i| &actions[i]).collect();
                let body = request::bulk_body(&batch, retry_on_conflict);
                sent += chunk.len();
                let (bytes, started) = (body.len(), Instant::now());
                let answer = self
                    .raw_call(
                        Method::Post,
                        "/_bulk",
                        &[("timeout", &timeout)],
                        Some(body),
                        Some("application/x-ndjson"),
                    )
                    .await;
                tracing::debug!(
                    items = chunk.len(),
                    bytes,
                    ms = started.elapsed().as_secs_f64() * 1e3,
                    status = answer.as_ref().map(|a| a.0).ok(),
                    "bulk answered"
                );
                match answer {
                    Ok((200, json)) => match response::parse_bulk(&json, chunk.len()) {
                        Ok(items) => {
                            for (&i, item) in chunk.iter().zip(items) {
                                match &item.class {
                                    ItemClass::Retry(r) => {
                                        reasons.insert(i, r.clone());
                                        retry.push(i);
                                    }
                                    _ => results[i] = Some(item),
                                }
                            }
                        }
                        Err(e) => {
                            // Cannot tell which items were applied: resend none.
                            for &i in chunk {
                                settle(
                                    &mut results,
                                    i,
                                    ItemClass::Unknown(format!("outcome unknown: {e}")),
                                );
                            }
                        }
                    },
                    Ok((status, json)) => match response::classify_request(status, &json) {
                        ItemClass::Retry(r) => {
                            for &i in chunk {
                                reasons.insert(i, r.clone());
                            }
                            retry.extend_from_slice(chunk);
                        }
                        other => {
                            for &i in chunk {
                                settle(&mut results, i, other.clone());
                            }
                        }
                    },
                    Err(TransportError {
                        not_sent: true,
                        message,
                    }) => {
                        for &i in chunk {
                            reasons.insert(i, format!("elasticsearch unreachable: {message}"));
                        }
                        retry.extend_from_slice(chunk);
                    }
                    Err(TransportError {
                        not_sent: false,
                        message,
                    }) => {
                        for &i in chunk {
                            settle(
                                &mut results,
                                i,
                                ItemClass::Unknown(format!(
                                    "outcome unknown, not resent (an event id makes a retry safe): {message}"
                                )),
                            );
                        }
                    }
                }
            }
            pending = retry;
            if pending.is_empty() {
                break;
            }
            let delay = self.config.backoff.delay(attempt, &self.jitter);
            if waited + delay > self.config.backoff.budget {
                for &i in &pending {
                    let why = reasons.remove(&i).unwrap_or_default();
                    settle(
                        &mut results,
                        i,
                        ItemClass::Retry(format!("gave up after {} attempts: {why}", attempt + 1)),
                    );
                }
                break;
            }
            tracing::debug!(
                items = pending.len(),
                ?delay,
                first = pending
                    .first()
                    .and_then(|i| reasons.get(i))
                    .map(String::as_str),
                "retrying failed bulk items"
            );
            tokio::time::sleep(delay).await;
            waited += delay;
            attempt += 1;
        }
        let results = results
            .into_iter()
            .map(|r| {
                r.unwrap_or(ItemResult {
                    class: ItemClass::Rejected("no answer".into()),
                    source: None,
                    noop: false,
                })
            })
            .collect();
        (results, sent)
    }

    /// Takes back every write that succeeded. `false` if some undo failed.
    async fn undo(
        &self,
        writes: &[DocWrite],
        results: &[ItemResult],
        settings: &WriteSettings,
        sent: &mut usize,
    ) -> bool {
        let undo: Vec<DocWrite> = writes
            .iter()
            .zip(results)
            .filter(|(_, r)| r.class == ItemClass::Done)
            .map(|(w, r)| w.undo(&response::skipped_events(r.source.as_ref())))
            .collect();
        if undo.is_empty() {
            return true;
        }
        let (res, n) = self.send_writes(&undo, settings, &HashSet::new()).await;
        *sent += n;
        let ok = res.iter().all(|r| r.class == ItemClass::Done);
        if !ok {
            tracing::error!("undoing a flush after an overflow failed; some counters may hold part of a refused request");
        }
        ok
    }
}

fn is_overflow(r: &ItemResult) -> bool {
    matches!(r.class, ItemClass::Overflow(_))
}

/// The outcome of each request of `plan`, given the result of each write.
fn outcomes(plan: &Plan, results: &[ItemResult]) -> Vec<RequestOutcome> {
    plan.touches
        .iter()
        .zip(&plan.id_events)
        .map(|(touches, ids)| {
            let failed = touches.iter().find_map(|&w| match &results[w].class {
                ItemClass::Done => None,
                ItemClass::Retry(r)
                | ItemClass::Rejected(r)
                | ItemClass::Overflow(r)
                | ItemClass::Unknown(r) => Some(r.clone()),
            });
            match failed {
                Some(reason) => RequestOutcome::Failed { reason },
                None => {
                    let duplicates = ids
                        .iter()
                        .filter(|(w, pos)| {
                            response::skipped_events(results[*w].source.as_ref()).contains(pos)
                        })
                        .count();
                    RequestOutcome::Applied {
                        duplicates: u32::try_from(duplicates).unwrap_or(u32::MAX),
                    }
                }
            }
        })
        .collect()
}

/// The wanted counters as the cluster answered them after their update
/// (the bulk's `get` fields, which every item still returns: its skipped
/// events are read from them).
fn counters_after(
    plan: &Plan,
    results: &[ItemResult],
    wanted: &HashSet<CounterKey>,
    into: &mut HashMap<CounterKey, Counter>,
) {
    if wanted.is_empty() {
        return;
    }
    for (w, r) in plan.writes.iter().zip(results) {
        if w.target == Target::Counter && r.class == ItemClass::Done && wanted.contains(&w.key) {
            if let Some(c) = r.source.as_ref().and_then(response::counter_from_source) {
                into.insert(w.key.clone(), c);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_hold_at_most_max_id_events_unless_one_request_has_more() {
        assert_eq!(
            runs_by_id_events(&[], 10),
            Vec::<std::ops::Range<usize>>::new()
        );
        assert_eq!(runs_by_id_events(&[0, 0, 0], 10), vec![0..3]);
        assert_eq!(runs_by_id_events(&[4, 6, 1], 10), vec![0..2, 2..3]);
        assert_eq!(
            runs_by_id_events(&[3, 25, 2, 0], 10),
            vec![0..1, 1..2, 2..4]
        );
        assert_eq!(runs_by_id_events(&[25], 10), vec![0..1]);
    }
}
