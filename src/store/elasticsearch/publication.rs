//! Targets' publication times (one document per target in
//! `<prefix>_<tenant>_targets`) and the top lists of totals over the first
//! N days from publication.
//!
//! A first-days list is exact, and bounded in memory: the pair's counter
//! documents are walked in uuid order a page at a time (a sorted search
//! with `search_after`); per page, one `_mget` of the pages' targets and a
//! sorted search of their bucket documents inside the page's days; each
//! counter's sum over its own days goes into the best `size` kept so far.
//! No aggregation can do this in one request: each counter has its own
//! window, from a publication day that lives in another document. The cost
//! is three requests per 5,000 counters of the pair.

use std::collections::HashMap;

use elasticsearch::http::Method;
use serde_json::{json, Value};

use super::client::status_error;
use super::transfer::hits;
use super::{request, response, ElasticsearchStore};
use crate::domain::milestone::publication_day;
use crate::domain::CounterKey;
use crate::store::{
    FirstDaysEntry, FirstDaysList, FirstDaysQuery, PublishedSet, StoreError, TargetPublished,
};

/// Counters per page of the walk (and ids per `_mget` and bucket search):
/// well under the 10,000 hits of a search page and the 65,536 terms of a
/// `terms` query.
const COUNTER_PAGE: usize = 5000;
/// Sets per `_bulk` of publication times.
const SET_BULK: usize = 1000;
/// Bucket documents per search page.
const BUCKET_PAGE: usize = 10_000;
/// Hits per page of an export's publication times: a search page.
const PUBLISHED_PAGE: usize = 10_000;

/// The document id of a target: the counter id of an empty action, which
/// no counter has (names are never empty), injective like counter ids.
pub fn target_id(entity: &str, uuid: &str) -> String {
    CounterKey {
        entity: entity.into(),
        action: "".into(),
        uuid: uuid.into(),
    }
    .doc_id()
}

fn int(v: Option<&Value>) -> Option<i64> {
    let v = v?;
    v.as_i64()
        .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
}

impl ElasticsearchStore {
    /// One `_bulk` per 1,000 sets: an index (an admin's replace), a
    /// create (an event's set-if-absent: a 409 means one is kept) or a
    /// delete per target, in order (the items of one target share its
    /// routing, so its shard applies them in order). Every item is durable
    /// when answered (its translog is synced); sending the same again
    /// leaves the same state, so a failed request is simply retried.
    pub(super) async fn set_published_es(&self, sets: Vec<PublishedSet>) -> Result<(), StoreError> {
        let index = self.config.names.targets();
        let timeout = self.config.bulk_timeout_param();
        for chunk in sets.chunks(SET_BULK) {
            let mut body = Vec::with_capacity(chunk.len() * 160);
            for s in chunk {
                let id = target_id(&s.entity, &s.uuid);
                let meta = json!({"_index": index, "_id": id, "routing": id});
                let (op, doc) = match (s.at_ms, s.replace) {
                    (Some(ms), replace) => (
                        if replace { "index" } else { "create" },
                        Some(json!({"entity": s.entity, "uuid": s.uuid, "published": ms})),
                    ),
                    (None, _) => ("delete", None),
                };
                // Serializing a Value cannot fail.
                let _ = serde_json::to_writer(&mut body, &json!({ op: meta }));
                body.push(b'\n');
                if let Some(d) = doc {
                    let _ = serde_json::to_writer(&mut body, &d);
                    body.push(b'\n');
                }
            }
            let mut created = false;
            loop {
                let (status, answer) = self
                    .raw_call(
                        Method::Post,
                        "/_bulk",
                        &[("timeout", &timeout)],
                        Some(body.clone()),
                        Some("application/x-ndjson"),
                    )
                    .await
                    .map_err(|e| {
                        StoreError::Unavailable(format!("elasticsearch: {}", e.message))
                    })?;
                if status != 200 {
                    return Err(status_error(
                        status,
                        format!(
                            "setting publication times answered {status} {}",
                            response::describe_error(answer.get("error"))
                        ),
                    ));
                }
                match bulk_outcome(&answer, chunk) {
                    Ok(()) => break,
                    // Where automatic index creation is off, the index is
                    // created from its template, and the chunk sent again.
                    Err(Failure::NoIndex) if !created => {
                        self.create_index(&index)
                            .await
                            .map_err(StoreError::Unavailable)?;
                        created = true;
                    }
                    Err(Failure::NoIndex) => {
                        return Err(StoreError::Unavailable(format!(
                            "setting publication times: index {index} is missing after its creation"
                        )))
                    }
                    Err(Failure::Item(status, why)) => {
                        return Err(status_error(
                            status,
                            format!("setting publication times: an item answered {status} {why}"),
                        ))
                    }
                }
            }
        }
        Ok(())
    }

    /// A realtime GET: sees every acknowledged set.
    pub(super) async fn published_es(
        &self,
        entity: &str,
        uuid: &str,
    ) -> Result<Option<i64>, StoreError> {
        let id = target_id(entity, uuid);
        let path = format!(
            "/{}/_doc/{}",
            self.config.names.targets(),
            request::encode_path_segment(&id)
        );
        // A read changes nothing, so a 429 or 503 (a shard still
        // recovering) is asked again within the back-off budget, as a
        // counter's read is.
        let (mut attempt, mut waited) = (0, std::time::Duration::ZERO);
        let (status, body) = loop {
            let (status, body) = self
                .call(Method::Get, &path, &[("routing", id.as_str())], None)
                .await?;
            let delay = self.config.backoff.delay(attempt, &self.jitter);
            if (status == 429 || status == 503) && waited + delay <= self.config.backoff.budget {
                tokio::time::sleep(delay).await;
                waited += delay;
                attempt += 1;
                continue;
            }
            break (status, body);
        };
        match status {
            200 if body.get("found") == Some(&Value::Bool(true)) => {
                int(body.pointer("/_source/published"))
                    .map(Some)
                    .ok_or_else(|| {
                        StoreError::Internal("a target document has no published time".into())
                    })
            }
            404 => Ok(None),
            _ => Err(status_error(
                status,
                format!(
                    "reading the publication time of {entity}/{uuid} answered {status} {}",
                    response::describe_error(body.get("error"))
                ),
            )),
        }
    }

    /// Export's page: the targets' documents sorted by `entity` then
    /// `uuid` (keywords sort bytewise, as SQLite's primary key), paged with
    /// `search_after`. The first page refreshes the index, so that an
    /// export sees every set acknowledged before it; a tenant without the
    /// index (no time ever set) answers no hits.
    pub(super) async fn published_page_es(
        &self,
        after: Option<(String, String)>,
        limit: usize,
    ) -> Result<Vec<TargetPublished>, StoreError> {
        let index = self.config.names.targets();
        if after.is_none() {
            self.refresh_tenant(&index).await?;
        }
        let mut body = json!({
            "size": limit.min(PUBLISHED_PAGE),
            "track_total_hits": false,
            "query": {"match_all": {}},
            "sort": [{"entity": "asc"}, {"uuid": "asc"}],
            "_source": {"includes": ["entity", "uuid", "published"]},
        });
        if let Some((entity, uuid)) = &after {
            body["search_after"] = json!([entity, uuid]);
        }
        let answer = self
            .search(&format!("/{index}/_search"), &[], &body)
            .await?;
        hits(&answer)?
            .iter()
            .map(|h| {
                let src = h.get("_source");
                let text = |name: &str| {
                    src.and_then(|s| s.get(name))
                        .and_then(Value::as_str)
                        .map(str::to_string)
                };
                match (
                    text("entity"),
                    text("uuid"),
                    int(src.and_then(|s| s.get("published"))),
                ) {
                    (Some(entity), Some(uuid), Some(at_ms)) => Ok(TargetPublished {
                        entity,
                        uuid,
                        at_ms,
                    }),
                    _ => Err(StoreError::Internal(format!(
                        "a target document lacks entity, uuid or published: {}",
                        h.get("_id").unwrap_or(&Value::Null)
                    ))),
                }
            })
            .collect()
    }

    /// The publication times set among `ids` (target ids), by id.
    pub(super) async fn published_many(
        &self,
        ids: &[String],
    ) -> Result<HashMap<String, i64>, StoreError> {
        let mut out = HashMap::new();
        if ids.is_empty() {
            return Ok(out);
        }
        let path = format!("/{}/_mget", self.config.names.targets());
        let answer = self.post_json(&path, &[], &json!({"ids": ids})).await?;
        for doc in answer
            .get("docs")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if doc.get("found") != Some(&Value::Bool(true)) {
                // Not found, or an error per document: no index yet.
                if let Some(e) = doc.get("error") {
                    if e.get("type").and_then(Value::as_str) != Some("index_not_found_exception") {
                        return Err(StoreError::Internal(format!(
                            "reading publication times: {}",
                            response::describe_error(Some(e))
                        )));
                    }
                }
                continue;
            }
            if let (Some(id), Some(ms)) = (
                doc.get("_id").and_then(Value::as_str),
                int(doc.pointer("/_source/published")),
            ) {
                out.insert(id.to_string(), ms);
            }
        }
        Ok(out)
    }

    pub(super) async fn top_first_days_es(
        &self,
        q: &FirstDaysQuery,
    ) -> Result<FirstDaysList, StoreError> {
        let names = &self.config.names;
        let mut filter = vec![
            json!({"term": {"entity": q.entity}}),
            json!({"term": {"action": q.action}}),
        ];
        if let Some(c) = &q.category {
            filter.push(json!({"term": {"category": c}}));
        }
        let mut best: Vec<FirstDaysEntry> = Vec::new();
        let mut after: Option<Value> = None;
        loop {
            let mut body = json!({
                "size": COUNTER_PAGE,
                "track_total_hits": false,
                "query": {"bool": {"filter": filter}},
                "sort": [{"uuid": "asc"}],
                "_source": {"includes": ["entity", "action", "uuid", "value", "category",
                    "first_timestamp", "recorded_timestamp"]},
            });
            if let Some(a) = after.take() {
                body["search_after"] = a;
            }
            let answer = self
                .search(&format!("/{}/_search", names.counters()), &[], &body)
                .await?;
            let page = hits(&answer)?;
            let counters: Vec<_> = page
                .iter()
                .map(|h| {
                    h.get("_source")
                        .and_then(response::counter_from_source)
                        .ok_or_else(|| {
                            StoreError::Internal("a counter document lacks required fields".into())
                        })
                })
                .collect::<Result<_, _>>()?;
            let targets: Vec<String> = counters
                .iter()
                .map(|c| target_id(&c.key.entity, &c.key.uuid))
                .collect();
            let set = self.published_many(&targets).await?;
            // Per counter id: its row, publication (ms, set?), days.
            let mut rows: HashMap<String, (FirstDaysEntry, i64, i64)> = HashMap::new();
            for (c, t) in counters.into_iter().zip(&targets) {
                let (published_ms, published_set) = match set.get(t) {
                    Some(ms) => (*ms, true),
                    None => (c.first_ms, false),
                };
                let day = publication_day(published_ms);
                let (from, to) = (day.max(q.oldest_day), day + i64::from(q.days) - 1);
                if from > to {
                    continue;
                }
                rows.insert(
                    c.key.doc_id(),
                    (
                        FirstDaysEntry {
                            uuid: c.key.uuid.to_string(),
                            value: 0,
                            category: c.category,
                            published_ms,
                            published_set,
                        },
                        from,
                        to,
                    ),
                );
            }
            let mut seen: HashMap<String, i128> = HashMap::new();
            let pattern = self.config.names.buckets_pattern();
            self.sum_in_windows(&pattern, 86_400_000, &rows, |r| (r.1, r.2), &mut seen)
                .await?;
            for (id, sum) in seen {
                if let Some((mut e, _, _)) = rows.remove(&id) {
                    e.value = sum;
                    best.push(e);
                }
            }
            if best.len() > 2 * q.size {
                keep_best(&mut best, q.size);
            }
            if page.len() < COUNTER_PAGE {
                break;
            }
            after = page.last().and_then(|h| h.get("sort")).cloned();
            if after.is_none() {
                break;
            }
        }
        keep_best(&mut best, q.size);
        Ok(FirstDaysList {
            entries: best,
            exact: true,
        })
    }

    /// Sums the documents of `pattern` (day or hour buckets, `unit_ms`
    /// long) of each counter of `rows` (counter id -> row) that lie inside
    /// that counter's own window (`window` of its row: first and last
    /// bucket, in units) into `sums`; a counter with none there gets no
    /// entry. One search for all of them, paged by `search_after`.
    pub(super) async fn sum_in_windows<T>(
        &self,
        pattern: &str,
        unit_ms: i64,
        rows: &HashMap<String, T>,
        window: impl Fn(&T) -> (i64, i64),
        sums: &mut HashMap<String, i128>,
    ) -> Result<(), StoreError> {
        let (Some(from), Some(to)) = (
            rows.values().map(|r| window(r).0).min(),
            rows.values().map(|r| window(r).1).max(),
        ) else {
            return Ok(());
        };
        let ids: Vec<&String> = rows.keys().collect();
        let path = format!("/{pattern}/_search");
        let mut after: Option<Value> = None;
        loop {
            let mut body = json!({
                "size": BUCKET_PAGE,
                "track_total_hits": false,
                "query": {"bool": {"filter": [
                    {"terms": {"counter_id": ids}},
                    {"range": {"day": {"gte": from * unit_ms, "lte": to * unit_ms}}}
                ]}},
                "sort": [{"counter_id": "asc"}, {"day": "asc"}],
                "_source": {"includes": ["value"]},
            });
            if let Some(a) = after.take() {
                body["search_after"] = a;
            }
            let answer = self.search(&path, &[], &body).await?;
            let page = hits(&answer)?;
            for h in page {
                let sort = h.get("sort").and_then(Value::as_array);
                let id = sort.and_then(|s| s.first()).and_then(Value::as_str);
                let ms = sort.and_then(|s| s.get(1)).and_then(Value::as_i64);
                let (Some(id), Some(ms)) = (id, ms) else {
                    return Err(StoreError::Internal(
                        "a bucket hit lacks its sort values".into(),
                    ));
                };
                let unit = ms.div_euclid(unit_ms);
                if let Some(row) = rows.get(id) {
                    let (first, last) = window(row);
                    if (first..=last).contains(&unit) {
                        let v = int(h.pointer("/_source/value")).unwrap_or(0);
                        *sums.entry(id.to_string()).or_default() += i128::from(v);
                    }
                }
            }
            if page.len() < BUCKET_PAGE {
                return Ok(());
            }
            after = page.last().and_then(|h| h.get("sort")).cloned();
            if after.is_none() {
                return Ok(());
            }
        }
    }
}

/// Why a bulk of publication sets is not done.
enum Failure {
    /// The targets index does not exist (automatic creation is off).
    NoIndex,
    /// An item failed: its status and the engine's reason.
    Item(u16, String),
}

/// Reads a publication bulk's items in request order: 2xx is done, so is a
/// create's 409 (one is kept: an event does not replace it) and a delete's
/// 404 (nothing was set).
fn bulk_outcome(answer: &Value, sets: &[PublishedSet]) -> Result<(), Failure> {
    let items = answer
        .get("items")
        .and_then(Value::as_array)
        .ok_or_else(|| Failure::Item(200, "the bulk answer has no items".into()))?;
    if items.len() != sets.len() {
        return Err(Failure::Item(
            200,
            format!("{} items answered for {} sent", items.len(), sets.len()),
        ));
    }
    for (item, set) in items.iter().zip(sets) {
        let Some((_, result)) = item.as_object().and_then(|o| o.iter().next()) else {
            return Err(Failure::Item(
                200,
                format!("an item without a result: {item}"),
            ));
        };
        let status = result.get("status").and_then(Value::as_u64).unwrap_or(0) as u16;
        let error = result.get("error");
        let kind = error.and_then(|e| e.get("type")).and_then(Value::as_str);
        match status {
            200..=299 => {}
            409 if set.at_ms.is_some() && !set.replace => {}
            404 if kind == Some("index_not_found_exception") => return Err(Failure::NoIndex),
            404 if set.at_ms.is_none() => {}
            _ => return Err(Failure::Item(status, response::describe_error(error))),
        }
    }
    Ok(())
}

/// The best `size` by value descending, then uuid ascending (bytewise).
fn keep_best(entries: &mut Vec<FirstDaysEntry>, size: usize) {
    entries.sort_by(|a, b| {
        b.value
            .cmp(&a.value)
            .then_with(|| a.uuid.as_bytes().cmp(b.uuid.as_bytes()))
    });
    entries.truncate(size);
}
