//! The Elasticsearch store: each flush is one `_bulk` of scripted upserts
//! (one per counter document, one per day bucket document), every item's
//! result classified, only failed retryable items resent.
//!
//! Files by role, as in vector's Elasticsearch sink: [`config`] (flags and
//! validated settings), [`templates`] (what `setup` installs), [`request`]
//! (write bodies, as pure functions), [`response`] (classifying answers,
//! pure), [`query`] (read queries and their answers, pure; says what is
//! exact), [`retry`] (back-off as a value).
//!
//! # What is and is not atomic here
//!
//! Elasticsearch has no multi-document transaction. Each document's update
//! is atomic (get, script, reindex on its shard), nothing more. So:
//!
//! - A request is acknowledged only when every document it touches (its
//!   counters and their day buckets) accepted its update. When some item
//!   still fails after the back-off budget, the request is answered as failed
//!   (503) **but the items that did succeed stay applied**: unlike the
//!   embedded store, a failed request may be partly counted. An event `id`
//!   makes the retry exact: every document (counter and bucket) remembers the
//!   ids it counted, in a non-indexed field, in the same atomic update as the
//!   addition, and skips them when they come again. So a retried event lands
//!   exactly once in each document, whichever of them got it the first time,
//!   across gateway instances and restarts, for as long as the id window
//!   (`--idempotency-window`) and the per-document cap (10,000 ids, oldest
//!   forgotten first) remember it.
//! - An answer lost in transit (timeout, reset connection after the request
//!   was sent) leaves the outcome unknown: those items are never resent
//!   (resending an applied increment double-counts); the requests fail, and
//!   only an event id makes their retry safe. Connection refused is known
//!   not to have reached the cluster and is retried within the budget.
//! - Overflow: the sum of a flush may overflow where its requests one by one
//!   would not. When any item reports the scripts' overflow error, every item
//!   of the flush that succeeded is undone (negated delta, its fresh ids
//!   forgotten), then the requests are applied one at a time, each undone
//!   again if it overflows, so exactly the overflowing requests are refused
//!   (409) as with the embedded store. Undoing cannot restore
//!   `first_timestamp`, `recorded_timestamp` or `category` (min, max and
//!   last-wins have no inverse), and a counter first created by a refused
//!   request stays, at value 0. This path is rare (values near 2^63) and
//!   costs a `_bulk` per request.
//! - Reads of one counter use the realtime GET (they see every acknowledged
//!   write); the list of a target's counters is a search, so it sees writes
//!   after the refresh interval (1 s).
//! - Delete removes the buckets first (delete-by-query, routed by counter
//!   id, after a refresh so that recent buckets are visible), then the
//!   counter, so a failed delete can be repeated. Increments that race with a
//!   delete may recreate the counter, as with the embedded store.

pub mod config;
pub mod query;
pub mod request;
pub mod response;
pub mod retry;
pub mod templates;

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use elasticsearch::auth::Credentials;
use elasticsearch::http::headers::{HeaderMap, HeaderValue, CONTENT_TYPE};
use elasticsearch::http::transport::{SingleNodeConnectionPool, TransportBuilder};
use elasticsearch::http::{Method, Url};
use elasticsearch::Elasticsearch;
use serde_json::Value;

use self::config::{Auth, EsConfig};
use self::query::CategoryFilter;
use self::request::{DocWrite, Plan, PlanOverflow, Target, WriteSettings};
use self::response::{ItemClass, ItemResult};
use self::retry::Jitter;
use self::templates::Install;
use super::{
    Average, AverageEntry, BatchOutcome, Bucket, RequestOutcome, StaleQuery, Store, StoreError,
    TopAverages, TopAveragesQuery, TopEntry, TopList, TopQuery, UnusedPair, WriteBatch,
};
use crate::domain::{Clock, Counter, CounterKey, Increment, Window};

pub use self::config::{ElasticsearchArgs, SetupArgs};

/// The Elasticsearch implementation of [`Store`].
pub struct ElasticsearchStore {
    client: Elasticsearch,
    config: EsConfig,
    clock: Clock,
    jitter: Jitter,
}

/// Most items in one `_bulk` request: a few thousand, as Elasticsearch advises;
/// flushes with more distinct documents are sent as several requests.
pub const MAX_BULK_ITEMS: usize = 5_000;

/// A transport failure, split by whether the request may have reached the cluster.
struct TransportError {
    /// Nothing was sent (connection refused, DNS): safe to resend.
    not_sent: bool,
    message: String,
}

/// What `setup` did with each object.
#[derive(Debug, Default)]
pub struct SetupReport {
    pub installed: Vec<String>,
    pub current: Vec<String>,
    pub newer: Vec<String>,
}

impl ElasticsearchStore {
    /// Builds the client; no I/O. `clock` gives the time idempotency ids are
    /// remembered from.
    pub fn new(config: EsConfig, clock: Clock) -> Result<Self, StoreError> {
        let url = Url::parse(&config.url)
            .map_err(|e| StoreError::Internal(format!("bad Elasticsearch URL: {e}")))?;
        let mut builder = TransportBuilder::new(SingleNodeConnectionPool::new(url))
            .timeout(config.request_timeout);
        builder = match &config.auth {
            Some(Auth::Basic { username, password }) => {
                builder.auth(Credentials::Basic(username.clone(), password.clone()))
            }
            Some(Auth::ApiKey(key)) => builder.auth(Credentials::EncodedApiKey(key.clone())),
            None => builder,
        };
        let transport = builder.build().map_err(|e| {
            StoreError::Internal(format!("cannot build the Elasticsearch client: {e}"))
        })?;
        Ok(ElasticsearchStore {
            client: Elasticsearch::new(transport),
            config,
            clock,
            jitter: Jitter::from_clock(),
        })
    }

    /// Builds the client and, when asked, installs templates and scripts.
    pub async fn open(config: EsConfig, clock: Clock, run_setup: bool) -> Result<Self, StoreError> {
        let store = ElasticsearchStore::new(config, clock)?;
        if run_setup {
            let report = store.setup().await?;
            tracing::info!(
                installed = report.installed.len(),
                current = report.current.len(),
                newer = report.newer.len(),
                "elasticsearch templates and scripts checked"
            );
        }
        Ok(store)
    }

    pub fn config(&self) -> &EsConfig {
        &self.config
    }

    /// The same cluster, client (and its connections) and settings, over
    /// `tenant`'s indices; no I/O. Templates and scripts are per prefix, so
    /// one setup serves every tenant.
    pub fn for_tenant(&self, tenant: &str) -> Result<Self, StoreError> {
        let mut config = self.config.clone();
        config.names = request::IndexNames::new(config.names.prefix(), tenant)
            .map_err(StoreError::Internal)?;
        Ok(ElasticsearchStore {
            client: self.client.clone(),
            config,
            clock: self.clock.clone(),
            jitter: Jitter::from_clock(),
        })
    }

    /// Installs what `index-templates/` holds, skipping what is current.
    pub async fn setup(&self) -> Result<SetupReport, StoreError> {
        let mut report = SetupReport::default();
        for step in templates::steps(&self.config.names) {
            let (status, body) = self.call(Method::Get, &step.path, &[], None).await?;
            match step.needs_install(status, &body) {
                Install::Current => report.current.push(step.name),
                Install::Newer => {
                    tracing::warn!(name = %step.name, "left alone: installed by a newer gateway");
                    report.newer.push(step.name);
                }
                Install::Missing | Install::Outdated => {
                    let payload = serde_json::to_vec(&step.body)
                        .map_err(|e| StoreError::Internal(e.to_string()))?;
                    let (status, body) = self
                        .call(Method::Put, &step.path, &[], Some(payload))
                        .await?;
                    if !(200..300).contains(&status) {
                        return Err(StoreError::Internal(format!(
                            "installing {} failed: {status} {}",
                            step.name,
                            response::describe_error(body.get("error"))
                        )));
                    }
                    tracing::info!(name = %step.name, "installed");
                    report.installed.push(step.name);
                }
            }
        }
        Ok(report)
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

    /// One HTTP call; the body parsed as JSON (`Null` when empty or not JSON).
    async fn call(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, &str)],
        body: Option<Vec<u8>>,
    ) -> Result<(u16, Value), StoreError> {
        self.raw_call(method, path, query, body, None)
            .await
            .map_err(|e| StoreError::Unavailable(format!("elasticsearch: {}", e.message)))
    }

    async fn raw_call(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, &str)],
        body: Option<Vec<u8>>,
        content_type: Option<&'static str>,
    ) -> Result<(u16, Value), TransportError> {
        let mut headers = HeaderMap::new();
        if let Some(ct) = content_type {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static(ct));
        }
        let query = if query.is_empty() { None } else { Some(query) };
        let res = self
            .client
            .send(method, path, headers, query, body, None)
            .await
            .map_err(transport_error)?;
        let status = res.status_code().as_u16();
        let bytes = res.bytes().await.map_err(|e| TransportError {
            not_sent: false,
            message: format!("reading the answer failed: {e}"),
        })?;
        Ok((
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        ))
    }

    /// Sends `writes` as one `_bulk`, then resends only the items that failed
    /// retryably, with back-off, until all are settled or the budget is
    /// spent. Returns one result per write, and the number of items sent.
    async fn send_writes(
        &self,
        writes: &[DocWrite],
        settings: &WriteSettings,
    ) -> (Vec<ItemResult>, usize) {
        let actions: Vec<_> = writes
            .iter()
            .map(|w| request::action(w, &self.config.names, settings))
            .collect();
        let mut results: Vec<Option<ItemResult>> = vec![None; writes.len()];
        let mut pending: Vec<usize> = (0..writes.len()).collect();
        let mut reasons: HashMap<usize, String> = HashMap::new();
        let mut sent = 0;
        let mut waited = Duration::ZERO;
        let mut attempt = 0;
        let settle = |results: &mut Vec<Option<ItemResult>>, i: usize, class: ItemClass| {
            results[i] = Some(ItemResult {
                class,
                source: None,
            });
        };
        while !pending.is_empty() {
            let mut retry = Vec::new();
            // One _bulk per flush, split only past MAX_BULK_ITEMS so a huge
            // flush stays well under Elasticsearch's request size limit.
            for chunk in pending.chunks(MAX_BULK_ITEMS) {
                let batch: Vec<_> = chunk.iter().map(|&i| &actions[i]).collect();
                let body = request::bulk_body(&batch, settings.retry_on_conflict);
                sent += chunk.len();
                let answer = self
                    .raw_call(
                        Method::Post,
                        "/_bulk",
                        &[],
                        Some(body),
                        Some("application/x-ndjson"),
                    )
                    .await;
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
            tracing::debug!(items = pending.len(), ?delay, "retrying failed bulk items");
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
                })
            })
            .collect();
        (results, sent)
    }

    /// A `_search` of `path`; missing indices read as empty, so a tenant
    /// that never counted gets empty lists rather than errors.
    async fn search(
        &self,
        path: &str,
        extra: &[(&str, &str)],
        body: &Value,
    ) -> Result<Value, StoreError> {
        let mut params = vec![("ignore_unavailable", "true"), ("allow_no_indices", "true")];
        params.extend_from_slice(extra);
        self.post_json(path, &params, body).await
    }

    /// A POST of a JSON body whose answer must be a 200. Query parameters
    /// are passed as given: Elasticsearch refuses any an API does not know
    /// (`_mget` takes no `ignore_unavailable`).
    async fn post_json(
        &self,
        path: &str,
        params: &[(&str, &str)],
        body: &Value,
    ) -> Result<Value, StoreError> {
        let payload = serde_json::to_vec(body).map_err(|e| StoreError::Internal(e.to_string()))?;
        let (status, answer) = self.call(Method::Post, path, params, Some(payload)).await?;
        if status != 200 {
            return Err(status_error(status, query::search_error(status, &answer)));
        }
        Ok(answer)
    }

    /// The uuids of one category of a pair, read from `index` (counters or
    /// averages), or the bucket-category fallback past [`query::MAX_HITS`].
    async fn category_filter(
        &self,
        index: &str,
        entity: &str,
        action: &str,
        category: Option<&str>,
    ) -> Result<CategoryFilter, StoreError> {
        let Some(category) = category else {
            return Ok(CategoryFilter::None);
        };
        let answer = self
            .search(
                &format!("/{index}/_search"),
                &[],
                &query::category_uuids_query(entity, action, category),
            )
            .await?;
        let (uuids, complete) = query::uuids_from_search(&answer).map_err(StoreError::Internal)?;
        Ok(if complete {
            CategoryFilter::Uuids(uuids)
        } else {
            CategoryFilter::BucketCategory(category.to_string())
        })
    }

    /// The found documents of `index` among the documents of `uuids` of a
    /// pair, by realtime `_mget`: `uuid -> category`.
    async fn categories(
        &self,
        index: &str,
        entity: &str,
        action: &str,
        uuids: &[&str],
    ) -> Result<serde_json::Map<String, Value>, StoreError> {
        if uuids.is_empty() {
            return Ok(serde_json::Map::new());
        }
        let ids: Vec<String> = uuids
            .iter()
            .filter_map(|u| CounterKey::new(entity, action, u).ok())
            .map(|k| k.doc_id())
            .collect();
        let answer = self
            .post_json(
                &format!("/{index}/_mget"),
                &[("_source_includes", "uuid,category")],
                &query::mget_body(&ids),
            )
            .await?;
        let found = query::found_from_mget(&answer).map_err(StoreError::Internal)?;
        Ok(query::categories_by_uuid(&found))
    }

    /// The buckets of one counter or average inside `window` (routed search).
    async fn window_buckets(
        &self,
        key: &CounterKey,
        window: Window,
        averages: bool,
    ) -> Result<Value, StoreError> {
        let id = key.doc_id();
        let indices = self.config.names.window_buckets(window, averages);
        let fields: &[&str] = if averages {
            &["day", "sum", "quantity"]
        } else {
            &["day", "value"]
        };
        self.search(
            &format!("/{}/_search", indices.path),
            &search_routing(&id),
            &query::buckets_query(&id, window, fields),
        )
        .await
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
        let (res, n) = self.send_writes(&undo, settings).await;
        *sent += n;
        let ok = res.iter().all(|r| r.class == ItemClass::Done);
        if !ok {
            tracing::error!("undoing a flush after an overflow failed; some counters may hold part of a refused request");
        }
        ok
    }
}

/// Splits a client error by whether the request can have left this process.
fn transport_error(e: elasticsearch::Error) -> TransportError {
    let mut message = e.to_string();
    let mut not_sent = false;
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(s) = source {
        let text = s.to_string();
        if !message.ends_with(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            if matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::AddrNotAvailable
            ) {
                not_sent = true;
            }
        }
        if text.contains("error trying to connect") || text.contains("Connection refused") {
            not_sent = true;
        }
        source = s.source();
    }
    TransportError { not_sent, message }
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

/// The counters as the cluster answered them after their update.
fn counters_after(plan: &Plan, results: &[ItemResult], into: &mut HashMap<CounterKey, Counter>) {
    for (w, r) in plan.writes.iter().zip(results) {
        if w.target == Target::Counter && r.class == ItemClass::Done {
            if let Some(c) = r.source.as_ref().and_then(response::counter_from_source) {
                into.insert(w.key.clone(), c);
            }
        }
    }
}

#[async_trait]
impl Store for ElasticsearchStore {
    async fn apply(&self, batch: WriteBatch) -> Result<BatchOutcome, StoreError> {
        let settings = self.settings(self.clock.now_ms());
        let requests: Vec<&[Increment]> = batch.requests.iter().map(Vec::as_slice).collect();
        let mut out = BatchOutcome::default();
        if let Ok(plan) = request::plan(&requests) {
            let (results, sent) = self.send_writes(&plan.writes, &settings).await;
            out.store_writes += sent;
            if !results.iter().any(is_overflow) {
                out.requests = outcomes(&plan, &results);
                counters_after(&plan, &results, &mut out.counters);
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
                return Ok(out);
            }
        }
        // One request at a time: exactly the overflowing ones are refused.
        for events in &requests {
            let outcome = match request::plan(std::slice::from_ref(events)) {
                Err(PlanOverflow(key)) => RequestOutcome::Overflow { key },
                Ok(plan) => {
                    let (results, sent) = self.send_writes(&plan.writes, &settings).await;
                    out.store_writes += sent;
                    if let Some(w) = results.iter().position(is_overflow) {
                        if self
                            .undo(&plan.writes, &results, &settings, &mut out.store_writes)
                            .await
                        {
                            RequestOutcome::Overflow {
                                key: plan.writes[w].key.clone(),
                            }
                        } else {
                            RequestOutcome::Failed {
                                reason: "an addition overflowed and undoing the rest of the request failed".into(),
                            }
                        }
                    } else {
                        counters_after(&plan, &results, &mut out.counters);
                        outcomes(&plan, &results).remove(0)
                    }
                }
            };
            out.requests.push(outcome);
        }
        Ok(out)
    }

    async fn get(&self, key: &CounterKey) -> Result<Option<Counter>, StoreError> {
        let path = format!(
            "/{}/_doc/{}",
            self.config.names.counters(),
            request::encode_path_segment(&key.doc_id())
        );
        let fields = request::COUNTER_FIELDS[..7].join(",");
        let (status, body) = self
            .call(Method::Get, &path, &[("_source_includes", &fields)], None)
            .await?;
        response::counter_from_get(status, &body).map_err(|e| status_error(status, e))
    }

    async fn target_counters(&self, entity: &str, uuid: &str) -> Result<Vec<Counter>, StoreError> {
        let path = format!("/{}/_search", self.config.names.counters());
        let body = serde_json::to_vec(&request::target_query(entity, uuid))
            .map_err(|e| StoreError::Internal(e.to_string()))?;
        let (status, answer) = self
            .call(
                Method::Post,
                &path,
                &[("ignore_unavailable", "true")],
                Some(body),
            )
            .await?;
        if status != 200 {
            return Err(status_error(
                status,
                format!(
                    "search answered {status} {}",
                    response::describe_error(answer.get("error"))
                ),
            ));
        }
        response::counters_from_search(&answer).map_err(StoreError::Internal)
    }

    async fn delete(&self, key: &CounterKey) -> Result<bool, StoreError> {
        let id = key.doc_id();
        let pattern = self.config.names.buckets_pattern();
        let lenient = [("ignore_unavailable", "true"), ("allow_no_indices", "true")];
        let (status, answer) = self
            .call(
                Method::Post,
                &format!("/{pattern}/_refresh"),
                &lenient,
                None,
            )
            .await?;
        if status != 200 {
            return Err(status_error(
                status,
                format!(
                    "refresh answered {status} {}",
                    response::describe_error(answer.get("error"))
                ),
            ));
        }
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

    async fn ready(&self) -> Result<(), StoreError> {
        let res = self
            .client
            .send::<(), ()>(
                Method::Get,
                "/",
                HeaderMap::new(),
                None,
                None,
                Some(Duration::from_secs(2)),
            )
            .await
            .map_err(|e| StoreError::Unavailable(format!("elasticsearch unreachable: {e}")))?;
        let status = res.status_code().as_u16();
        if (200..300).contains(&status) {
            Ok(())
        } else {
            Err(StoreError::Unavailable(format!(
                "elasticsearch answered {status}"
            )))
        }
    }

    async fn histogram(
        &self,
        key: &CounterKey,
        window: Window,
    ) -> Result<Option<Vec<Bucket>>, StoreError> {
        if self.get(key).await?.is_none() {
            return Ok(None);
        }
        let answer = self.window_buckets(key, window, false).await?;
        query::buckets_from_search(&answer)
            .map(Some)
            .map_err(StoreError::Internal)
    }

    async fn top(&self, q: &TopQuery) -> Result<TopList, StoreError> {
        let counters = self.config.names.counters();
        let Some(window) = q.window else {
            let answer = self
                .search(
                    &format!("/{counters}/_search"),
                    &[],
                    &query::top_all_time_query(q),
                )
                .await?;
            let entries = query::top_from_search(&answer).map_err(StoreError::Internal)?;
            return Ok(TopList {
                entries,
                exact: true,
            });
        };
        let cat = self
            .category_filter(&counters, &q.entity, &q.action, q.category.as_deref())
            .await?;
        if cat == CategoryFilter::Uuids(Vec::new()) {
            return Ok(TopList {
                entries: Vec::new(),
                exact: true,
            });
        }
        let indices = self.config.names.window_buckets(window, false);
        let one_month = indices.months == 1;
        let answer = self
            .search(
                &format!("/{}/_search", indices.path),
                &[],
                &query::top_window_query(q, window, &cat, one_month),
            )
            .await?;
        let top = query::window_top_from_aggs(&answer).map_err(StoreError::Internal)?;
        let exact = top.exact(one_month, &cat);
        let picked: Vec<&(String, i64)> = top.entries.iter().take(q.size).collect();
        let uuids: Vec<&str> = picked.iter().map(|(u, _)| u.as_str()).collect();
        let categories = self
            .categories(&counters, &q.entity, &q.action, &uuids)
            .await?;
        // A counter whose document is gone (deleted while its buckets were
        // being removed) is left out, as the embedded store's join does.
        let entries = picked
            .into_iter()
            .filter_map(|(uuid, value)| {
                let category = categories.get(uuid)?;
                Some(TopEntry {
                    uuid: uuid.clone(),
                    value: *value,
                    category: category.as_str().map(str::to_string),
                })
            })
            .collect();
        Ok(TopList { entries, exact })
    }

    async fn stale(&self, q: &StaleQuery) -> Result<Vec<Counter>, StoreError> {
        let answer = self
            .search(
                &format!("/{}/_search", self.config.names.counters()),
                &[],
                &query::stale_query(q),
            )
            .await?;
        query::stale_from_search(&answer).map_err(StoreError::Internal)
    }

    async fn unused(&self, before_ms: i64) -> Result<Vec<UnusedPair>, StoreError> {
        let path = format!("/{}/_search", self.config.names.counters());
        let mut pairs = Vec::new();
        let mut after: Option<Value> = None;
        loop {
            let answer = self
                .search(&path, &[], &query::unused_query(after.as_ref()))
                .await?;
            let (buckets, next) =
                query::composite_page(&answer, "pairs").map_err(StoreError::Internal)?;
            pairs.extend(query::unused_page(buckets, before_ms).map_err(StoreError::Internal)?);
            match next {
                Some(n) if after.as_ref() != Some(n) => after = Some(n.clone()),
                _ => break,
            }
        }
        query::sort_unused(&mut pairs);
        Ok(pairs)
    }

    async fn average(
        &self,
        key: &CounterKey,
        window: Option<Window>,
    ) -> Result<Option<Average>, StoreError> {
        let path = format!(
            "/{}/_doc/{}",
            self.config.names.averages(),
            request::encode_path_segment(&key.doc_id())
        );
        let fields = request::AVERAGE_FIELDS[..8].join(",");
        let (status, body) = self
            .call(Method::Get, &path, &[("_source_includes", &fields)], None)
            .await?;
        let avg =
            query::average_from_get(key, status, &body).map_err(|e| status_error(status, e))?;
        let (Some(mut avg), Some(w)) = (avg.clone(), window) else {
            return Ok(avg);
        };
        let answer = self.window_buckets(key, w, true).await?;
        let (sum, quantity) =
            query::average_window_from_search(&answer).map_err(StoreError::Internal)?;
        avg.sum = sum;
        avg.quantity = quantity;
        Ok(Some(avg))
    }

    async fn top_averages(&self, q: &TopAveragesQuery) -> Result<TopAverages, StoreError> {
        let averages = self.config.names.averages();
        let Some(window) = q.window else {
            let answer = self
                .search(
                    &format!("/{averages}/_search"),
                    &[],
                    &query::top_averages_all_time_query(q),
                )
                .await?;
            let entries = query::top_averages_from_search(&answer).map_err(StoreError::Internal)?;
            return Ok(TopAverages {
                entries,
                exact: true,
            });
        };
        let cat = self
            .category_filter(&averages, &q.entity, &q.action, q.category.as_deref())
            .await?;
        let mut exact = !matches!(cat, CategoryFilter::BucketCategory(_));
        if cat == CategoryFilter::Uuids(Vec::new()) {
            return Ok(TopAverages {
                entries: Vec::new(),
                exact,
            });
        }
        let path = format!(
            "/{}/_search",
            self.config.names.window_buckets(window, true).path
        );
        // Every average of the window, kept to the best `size` as pages come
        // in, so memory stays bounded by the page and the list.
        let mut best: Vec<AverageEntry> = Vec::new();
        let mut after: Option<Value> = None;
        loop {
            let answer = self
                .search(
                    &path,
                    &[],
                    &query::top_averages_window_query(q, window, &cat, after.as_ref()),
                )
                .await?;
            let (buckets, next) =
                query::composite_page(&answer, "averages").map_err(StoreError::Internal)?;
            let (rows, rows_exact) = query::averages_page(buckets).map_err(StoreError::Internal)?;
            exact &= rows_exact;
            best.extend(
                rows.into_iter()
                    .filter(|(_, _, n)| *n >= q.min_quantity)
                    .map(|(uuid, sum, quantity)| AverageEntry {
                        uuid,
                        sum,
                        quantity,
                        category: None,
                    }),
            );
            if best.len() > 2 * q.size {
                query::rank_averages(&mut best, q.size);
            }
            match next {
                Some(n) if after.as_ref() != Some(n) => after = Some(n.clone()),
                _ => break,
            }
        }
        query::rank_averages(&mut best, q.size);
        let uuids: Vec<&str> = best.iter().map(|e| e.uuid.as_str()).collect();
        let categories = self
            .categories(&averages, &q.entity, &q.action, &uuids)
            .await?;
        let entries = best
            .into_iter()
            .filter_map(|mut e| {
                e.category = categories.get(&e.uuid)?.as_str().map(str::to_string);
                Some(e)
            })
            .collect();
        Ok(TopAverages { entries, exact })
    }
}

/// The `routing` of a read of one counter's buckets, which were written
/// with `routing=<counter id>`. A read splits its routing on commas (several
/// values), so an id holding a comma would be looked for on the wrong shards:
/// such a read goes to every shard instead (the `counter_id` filter keeps it
/// exact; only slower).
fn search_routing(counter_id: &str) -> Vec<(&'static str, &str)> {
    if counter_id.contains(',') {
        Vec::new()
    } else {
        vec![("routing", counter_id)]
    }
}

/// 429 and 5xx mean "try later" (503 to the client); anything else is ours to fix.
fn status_error(status: u16, message: String) -> StoreError {
    if status == 429 || status >= 500 {
        StoreError::Unavailable(message)
    } else {
        StoreError::Internal(message)
    }
}
