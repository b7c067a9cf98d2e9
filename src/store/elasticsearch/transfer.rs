//! Export and import on Elasticsearch.
//!
//! Export: counters (and averages) searched in key order (`entity`,
//! `action`, `uuid` sorted as keywords: bytewise, as SQLite orders them),
//! paged with `search_after` (from + size stops at 10,000); the buckets of
//! a page's counters in one more search (`terms` on `counter_id`, sorted
//! by counter and day, paged the same way). The first page refreshes the
//! tenant's indices, so an export sees every write acknowledged before it.
//!
//! Import: whole documents, written in `_bulk`. A batch is read first (one
//! realtime `_mget` of its counter documents and of the bucket documents it
//! names; for counters that exist, a search of their other buckets after a
//! refresh), every total computed and checked against the i64 range before
//! anything is written, then each counter and its named buckets are written
//! whole, conditionally on the version read (`if_seq_no`, or `create` when
//! there was none). An increment landing between the read and the write
//! makes the write conflict, and that counter is read and written again; so
//! does any item that failed or whose answer was lost: everything here sets,
//! so writing again is exact. What the documents remember is kept: event ids
//! (idempotency), and on a counter the sets of `backfill` it has applied;
//! a bucket that names a set its counter had not applied yet (a backfill
//! cut short) counts as applied, since the total is computed from the buckets.
//!
//! Hours (format 5): the hour documents of a day a record sets with its
//! hours are written whole with `index`, unconditionally (they follow their
//! day, whose write is conditional: a conflict there writes them again),
//! keeping the event ids and bulk names they remember; those of that day
//! the record does not list are deleted. The counter's `set_days` marks
//! the day (hour answers not exact) only when its hours do not sum to it.
//!
//! Left open (two documents, no transaction): an increment whose counter
//! update lands before the import reads the counter and whose bucket update
//! lands after it searched the buckets is in the bucket but not in the total
//! the import writes; likewise one whose day bucket update the import
//! replaced and whose hour update lands after the hour's write is in the
//! hour and not in the day. Import with no gateway writing the counters it
//! names.

use std::collections::HashMap;
use std::time::Duration;

use elasticsearch::http::Method;
use serde_json::{json, Map, Value};

use super::request::{bucket_doc_id, hour_doc_id};
use super::response::{self, ItemClass};
use super::ElasticsearchStore;
use crate::domain::{Counter, CounterKey};
use crate::store::{
    AverageBucket, AverageHistory, AverageImport, Bucket, CounterHistory, CounterImport, DaySet,
    DaysOutcome, HourBucket, ImportBatch, ImportEntry, ImportOutcome, StoreError,
};

/// Hits per search page: Elasticsearch's default result window.
pub(super) const SEARCH_PAGE: usize = 10_000;

/// What `set_days` records for a day an import set: no backfill's set id
/// (those are random), so a later backfill of that day applies as usual.
const IMPORTED: &str = "import";

/// Documents per `_mget`.
const MGET_DOCS: usize = 1_000;

/// Items per `_bulk` of an import.
const BULK_ITEMS: usize = 2_000;

/// A document read with its version; `None` version: not there.
#[derive(Clone, Debug, Default)]
struct Doc {
    source: Map<String, Value>,
    version: Option<(i64, i64)>,
}

/// One write of a `_bulk`: its action line and the document.
struct Item {
    index: String,
    id: String,
    routing: Option<String>,
    version: Option<(i64, i64)>,
    source: Value,
    /// How it is written when not by the version read: an hour document
    /// is set whole or deleted whatever was there (see [`Self::hour_items`]).
    plain: Option<Plain>,
}

/// An hour document already stored: its hour and what it keeps of it
/// (the event ids and bulk names it remembers).
type StoredHour = (i64, Map<String, Value>);

/// A write that is not conditional on a version.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Plain {
    Index,
    Delete,
}

/// What a day is stored as: epoch milliseconds of its start.
fn day_ms(day: i64) -> i64 {
    day * 86_400_000
}

impl ElasticsearchStore {
    /// `POST <tenant's indices>/_refresh`: searches then see every write
    /// acknowledged before it.
    pub(super) async fn refresh_tenant(&self, pattern: &str) -> Result<(), StoreError> {
        let lenient = [("ignore_unavailable", "true"), ("allow_no_indices", "true")];
        self.call_ok(
            Method::Post,
            &format!("/{pattern}/_refresh"),
            &lenient,
            None,
            "refresh",
        )
        .await?;
        Ok(())
    }

    /// Up to `limit` documents of `index` after `after`, in key order.
    async fn key_page(
        &self,
        index: &str,
        after: Option<&CounterKey>,
        limit: usize,
        fields: &[&str],
    ) -> Result<Vec<Value>, StoreError> {
        let mut body = json!({
            "size": limit.min(SEARCH_PAGE),
            "track_total_hits": false,
            "query": {"match_all": {}},
            "sort": [{"entity": "asc"}, {"action": "asc"}, {"uuid": "asc"}],
            "_source": {"includes": fields},
        });
        if let Some(k) = after {
            body["search_after"] = json!([&*k.entity, &*k.action, &*k.uuid]);
        }
        let answer = self
            .search(&format!("/{index}/_search"), &[], &body)
            .await?;
        Ok(hits(&answer)?.to_vec())
    }

    /// Every bucket document of `ids` in `pattern` from `from_day` on, by
    /// counter id then day, each handed to `each` as (counter id, day,
    /// source): only one search page is held at a time.
    async fn buckets_of(
        &self,
        pattern: &str,
        ids: &[String],
        from_day: i64,
        fields: &[&str],
        mut each: impl FnMut(&str, i64, &Value),
    ) -> Result<(), StoreError> {
        self.documents_of(pattern, ids, from_day, fields, |id, ms, source| {
            each(id, ms.div_euclid(86_400_000), source)
        })
        .await
    }

    /// [`Self::buckets_of`] for hour documents: each handed over with its
    /// hour (hours since the epoch).
    async fn hours_of(
        &self,
        ids: &[String],
        from_day: i64,
        mut each: impl FnMut(&str, i64, &Value),
    ) -> Result<(), StoreError> {
        let pattern = self.config.names.hours_pattern();
        self.documents_of(&pattern, ids, from_day, &["value"], |id, ms, source| {
            each(id, ms.div_euclid(crate::domain::hours::HOUR_MS), source)
        })
        .await
    }

    /// Every document of `ids` in `pattern` whose `day` is from `from_day`
    /// on, by counter id then `day`, each handed to `each` as (counter id,
    /// `day` in epoch milliseconds, source).
    async fn documents_of(
        &self,
        pattern: &str,
        ids: &[String],
        from_day: i64,
        fields: &[&str],
        mut each: impl FnMut(&str, i64, &Value),
    ) -> Result<(), StoreError> {
        if ids.is_empty() {
            return Ok(());
        }
        let mut after: Option<Value> = None;
        loop {
            let mut body = json!({
                "size": SEARCH_PAGE,
                "track_total_hits": false,
                "query": {"bool": {"filter": [
                    {"terms": {"counter_id": ids}},
                    {"range": {"day": {"gte": day_ms(from_day)}}}
                ]}},
                "sort": [{"counter_id": "asc"}, {"day": "asc"}],
                "_source": {"includes": fields},
            });
            if let Some(a) = after.take() {
                body["search_after"] = a;
            }
            let answer = self
                .search(&format!("/{pattern}/_search"), &[], &body)
                .await?;
            let page = hits(&answer)?;
            for h in page {
                // The sort values: the keyword, and the date as epoch millis.
                let sort = h.get("sort").and_then(Value::as_array);
                let id = sort.and_then(|s| s.first()).and_then(Value::as_str);
                let ms = sort.and_then(|s| s.get(1)).and_then(Value::as_i64);
                let (Some(id), Some(ms)) = (id, ms) else {
                    return Err(StoreError::Internal(
                        "a bucket hit lacks its sort values".into(),
                    ));
                };
                each(id, ms, h.get("_source").unwrap_or(&Value::Null));
            }
            if page.len() < SEARCH_PAGE {
                return Ok(());
            }
            after = page.last().and_then(|h| h.get("sort")).cloned();
        }
    }

    pub(super) async fn counter_page_es(
        &self,
        after: Option<CounterKey>,
        limit: usize,
        from_day: i64,
        hours_from_day: i64,
    ) -> Result<Vec<CounterHistory>, StoreError> {
        let names = &self.config.names;
        if after.is_none() {
            self.refresh_tenant(&names.tenant_pattern()).await?;
        }
        let fields = [
            "entity",
            "action",
            "uuid",
            "value",
            "category",
            "first_timestamp",
            "recorded_timestamp",
        ];
        let hits = self
            .key_page(&names.counters(), after.as_ref(), limit, &fields)
            .await?;
        let counters: Vec<Counter> = hits
            .iter()
            .map(|h| {
                h.get("_source")
                    .and_then(response::counter_from_source)
                    .ok_or_else(|| {
                        StoreError::Internal("a counter document lacks required fields".into())
                    })
            })
            .collect::<Result<_, _>>()?;
        let ids: Vec<String> = counters.iter().map(|c| c.key.doc_id()).collect();
        let mut days: HashMap<String, Vec<Bucket>> = HashMap::new();
        self.buckets_of(
            &names.buckets_pattern(),
            &ids,
            from_day,
            &["value"],
            |id, day, source| {
                let value = int(source.get("value")).unwrap_or(0);
                days_of(&mut days, id).push(Bucket { day, value });
            },
        )
        .await?;
        let mut hours: HashMap<String, Vec<HourBucket>> = HashMap::new();
        self.hours_of(&ids, hours_from_day.max(from_day), |id, hour, source| {
            let value = int(source.get("value")).unwrap_or(0);
            days_of(&mut hours, id).push(HourBucket { hour, value });
        })
        .await?;
        Ok(counters
            .into_iter()
            .zip(ids)
            .map(|(counter, id)| CounterHistory {
                counter,
                days: days.remove(&id).unwrap_or_default(),
                hours: hours.remove(&id).unwrap_or_default(),
            })
            .collect())
    }

    pub(super) async fn average_page_es(
        &self,
        after: Option<CounterKey>,
        limit: usize,
        from_day: i64,
    ) -> Result<Vec<AverageHistory>, StoreError> {
        let names = &self.config.names;
        if after.is_none() {
            self.refresh_tenant(&names.tenant_pattern()).await?;
        }
        let fields = [
            "entity",
            "action",
            "uuid",
            "sum",
            "quantity",
            "category",
            "first_timestamp",
            "recorded_timestamp",
        ];
        let hits = self
            .key_page(&names.averages(), after.as_ref(), limit, &fields)
            .await?;
        let mut averages: Vec<AverageHistory> = hits
            .iter()
            .map(|h| {
                h.get("_source")
                    .and_then(average_from_source)
                    .ok_or_else(|| {
                        StoreError::Internal("an average document lacks required fields".into())
                    })
            })
            .collect::<Result<_, _>>()?;
        let ids: Vec<String> = averages.iter().map(|a| a.key.doc_id()).collect();
        let mut days: HashMap<String, Vec<AverageBucket>> = HashMap::new();
        self.buckets_of(
            &names.average_buckets_pattern(),
            &ids,
            from_day,
            &["sum", "quantity"],
            |id, day, source| {
                days_of(&mut days, id).push(AverageBucket {
                    day,
                    sum: int(source.get("sum")).unwrap_or(0),
                    quantity: int(source.get("quantity")).unwrap_or(0),
                });
            },
        )
        .await?;
        for (a, id) in averages.iter_mut().zip(&ids) {
            a.days = days.remove(id).unwrap_or_default();
        }
        Ok(averages)
    }

    /// Realtime `_mget` of `(index, id, routing)` documents, whole, with
    /// their versions, in the order asked.
    async fn mget_docs(
        &self,
        docs: &[(String, String, Option<String>)],
    ) -> Result<Vec<Doc>, StoreError> {
        let mut out = Vec::with_capacity(docs.len());
        for chunk in docs.chunks(MGET_DOCS) {
            let body: Vec<Value> = chunk
                .iter()
                .map(|(index, id, routing)| match routing {
                    Some(r) => json!({"_index": index, "_id": id, "routing": r}),
                    None => json!({"_index": index, "_id": id}),
                })
                .collect();
            let answer = self
                .post_json("/_mget", &[("realtime", "true")], &json!({"docs": body}))
                .await?;
            let got = answer
                .get("docs")
                .and_then(Value::as_array)
                .filter(|d| d.len() == chunk.len())
                .ok_or_else(|| {
                    StoreError::Internal("the _mget answer does not match what was asked".into())
                })?;
            for d in got {
                if let Some(e) = d.get("error") {
                    if e.get("type").and_then(Value::as_str) == Some("index_not_found_exception") {
                        out.push(Doc::default());
                        continue;
                    }
                    return Err(StoreError::Unavailable(format!(
                        "_mget failed: {}",
                        response::describe_error(Some(e))
                    )));
                }
                if d.get("found").and_then(Value::as_bool) != Some(true) {
                    out.push(Doc::default());
                    continue;
                }
                let version = match (
                    d.get("_seq_no").and_then(Value::as_i64),
                    d.get("_primary_term").and_then(Value::as_i64),
                ) {
                    (Some(s), Some(t)) => (s, t),
                    _ => {
                        return Err(StoreError::Internal(
                            "the _mget answer has no _seq_no/_primary_term".into(),
                        ))
                    }
                };
                out.push(Doc {
                    source: d
                        .get("_source")
                        .and_then(Value::as_object)
                        .cloned()
                        .unwrap_or_default(),
                    version: Some(version),
                });
            }
        }
        Ok(out)
    }

    /// The documents of `wanted` (an id in `index`, and the bucket index
    /// and day of each named day) with their versions. The named buckets
    /// are read only for documents that exist: a new counter's buckets are
    /// created (one left over from elsewhere makes the create conflict, and
    /// the counter is read again, then existing).
    async fn read_with_days(
        &self,
        index: &str,
        wanted: &[(String, Vec<(String, i64)>)],
    ) -> Result<Vec<(Doc, Vec<Doc>)>, StoreError> {
        let parents: Vec<(String, String, Option<String>)> = wanted
            .iter()
            .map(|(id, _)| (index.to_string(), id.clone(), None))
            .collect();
        let parents = self.mget_docs(&parents).await?;
        let mut asked = Vec::new();
        for ((id, days), parent) in wanted.iter().zip(&parents) {
            if parent.version.is_some() {
                for (bucket_index, day) in days {
                    asked.push((
                        bucket_index.clone(),
                        bucket_doc_id(id, *day),
                        Some(id.clone()),
                    ));
                }
            }
        }
        let mut buckets = self.mget_docs(&asked).await?.into_iter();
        Ok(parents
            .into_iter()
            .zip(wanted)
            .map(|(parent, (_, days))| {
                let named = if parent.version.is_some() {
                    days.iter()
                        .map(|_| buckets.next().unwrap_or_default())
                        .collect()
                } else {
                    vec![Doc::default(); days.len()]
                };
                (parent, named)
            })
            .collect())
    }

    /// The documents that set `counters[i]` for each `i` of `which`, from
    /// the store as read now; `Err(i)` names one whose total would leave i64.
    async fn counter_items(
        &self,
        counters: &[CounterImport],
        which: &[usize],
        oldest_day: i64,
    ) -> Result<Result<Vec<(usize, Vec<Item>)>, usize>, StoreError> {
        let names = &self.config.names;
        let wanted: Vec<(String, Vec<(String, i64)>)> = which
            .iter()
            .map(|&i| {
                let c = &counters[i];
                let cid = c.key.doc_id();
                let days = c
                    .days
                    .iter()
                    .map(|b| (names.buckets(b.day), b.day))
                    .collect();
                (cid, days)
            })
            .collect();
        let read = self.read_with_days(&names.counters(), &wanted).await?;
        // The other buckets of counters that exist: after a refresh, so the
        // search sees every acknowledged write.
        let existing: Vec<String> = which
            .iter()
            .zip(&read)
            .filter(|(_, (c, _))| c.version.is_some())
            .map(|(&i, _)| counters[i].key.doc_id())
            .collect();
        // Per counter: (day, value, the set its bucket names), no more of
        // the document, so a batch of counters with long histories stays small.
        let mut others: HashMap<String, Vec<(i64, i64, Option<String>)>> = HashMap::new();
        if !existing.is_empty() {
            self.refresh_tenant(&names.buckets_pattern()).await?;
            self.buckets_of(
                &names.buckets_pattern(),
                &existing,
                oldest_day,
                &["value", "last_set"],
                |id, day, source| {
                    let value = int(source.get("value")).unwrap_or(0);
                    let set = source.pointer("/last_set/id").and_then(Value::as_str);
                    days_of(&mut others, id).push((day, value, set.map(String::from)));
                },
            )
            .await?;
        }
        let hourly_from = self.clock.today() - i64::from(self.config.hourly_retention_days);
        // The hour documents of counters that exist and whose record gives
        // hours: those of the days it sets are replaced or deleted. Each
        // keeps what it remembers (event ids, bulk names), so a retried
        // event is still counted once in the hour as in the day.
        let with_hours: Vec<String> = which
            .iter()
            .zip(&read)
            .filter(|(&i, (c, _))| c.version.is_some() && counters[i].hours.is_some())
            .map(|(&i, _)| counters[i].key.doc_id())
            .collect();
        let mut old_hours: HashMap<String, Vec<StoredHour>> = HashMap::new();
        if !with_hours.is_empty() {
            // Only those of the days the records set are held (as many as
            // the batch's buckets, at most 24 a day), whatever else is stored.
            let named: std::collections::HashSet<(String, i64)> = which
                .iter()
                .flat_map(|&i| {
                    let c = &counters[i];
                    c.days.iter().map(move |b| (c.key.doc_id(), b.day))
                })
                .collect();
            let pattern = names.hours_pattern();
            self.refresh_tenant(&pattern).await?;
            self.documents_of(
                &pattern,
                &with_hours,
                hourly_from,
                &["event_ids", "applied_ops"],
                |id, ms, source| {
                    let hour = ms.div_euclid(crate::domain::hours::HOUR_MS);
                    if named.contains(&(id.to_string(), hour.div_euclid(24))) {
                        let kept = source.as_object().cloned().unwrap_or_default();
                        days_of(&mut old_hours, id).push((hour, kept));
                    }
                },
            )
            .await?;
        }
        let mut out = Vec::with_capacity(which.len());
        for (&i, (counter, buckets)) in which.iter().zip(read) {
            let c = &counters[i];
            let cid = c.key.doc_id();
            let named: std::collections::HashSet<i64> = c.days.iter().map(|b| b.day).collect();
            let mut total = c.before + c.days.iter().map(|b| i128::from(b.value)).sum::<i128>();
            let mut set_days = counter
                .source
                .get("set_days")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            for (day, value, set) in others.remove(&cid).unwrap_or_default() {
                if named.contains(&day) {
                    continue;
                }
                total += i128::from(value);
                // A set its counter may not have applied: the total above
                // has it (it is in the bucket), so it counts as applied.
                if let Some(id) = set {
                    set_days.insert(crate::domain::format_day(day), json!(id));
                }
            }
            // A day set with its hours (format 5) is exact when they sum to
            // it; one set without them (an older file), or whose hours do not
            // sum to it (a backfilled day where it came from), is marked as a
            // backfilled day is, so hour answers over it say `exact: false`
            // (days before the hourly retention hold no hours to compare).
            let given = |day: i64| c.hours.as_ref().filter(|h| h.covers(day));
            for b in c.days.iter().filter(|b| b.day >= hourly_from) {
                let name = crate::domain::format_day(b.day);
                let whole = given(b.day).is_some_and(|h| {
                    h.of_day(b.day)
                        .iter()
                        .map(|x| i128::from(x.value))
                        .sum::<i128>()
                        == i128::from(b.value)
                });
                if whole {
                    set_days.remove(&name);
                } else {
                    set_days.insert(name, json!(IMPORTED));
                }
            }
            let Ok(total) = i64::try_from(total) else {
                return Ok(Err(i));
            };
            let mut s = counter.source.clone();
            let category = c
                .category
                .clone()
                .or_else(|| s.get("category").and_then(Value::as_str).map(String::from));
            let first = int(s.get("first_timestamp")).map_or(c.first_ms, |f| f.min(c.first_ms));
            let recorded =
                int(s.get("recorded_timestamp")).map_or(c.recorded_ms, |r| r.max(c.recorded_ms));
            put_key(&mut s, &c.key, &cid);
            s.insert("value".into(), json!(total));
            s.insert("first_timestamp".into(), json!(first));
            s.insert("recorded_timestamp".into(), json!(recorded));
            if let Some(cat) = &category {
                s.insert("category".into(), json!(cat));
            }
            s.remove("skipped_events");
            if set_days.is_empty() {
                s.remove("set_days");
            } else {
                s.insert("set_days".into(), Value::Object(set_days));
            }
            let mut items = vec![Item {
                index: names.counters(),
                id: cid.clone(),
                routing: None,
                version: counter.version,
                source: Value::Object(s),
                plain: None,
            }];
            for (b, doc) in c.days.iter().zip(buckets) {
                let mut s = doc.source;
                put_key(&mut s, &c.key, &cid);
                s.insert("day".into(), json!(day_ms(b.day)));
                s.insert("value".into(), json!(b.value));
                if let Some(cat) = &category {
                    s.insert("category".into(), json!(cat));
                }
                s.remove("skipped_events");
                // The bucket is set whole: a set it named is superseded.
                s.remove("last_set");
                items.push(Item {
                    index: names.buckets(b.day),
                    id: bucket_doc_id(&cid, b.day),
                    routing: Some(cid.clone()),
                    version: doc.version,
                    source: Value::Object(s),
                    plain: None,
                });
            }
            let mut old = old_hours.remove(&cid).unwrap_or_default();
            for b in c.days.iter().filter(|b| b.day >= hourly_from) {
                let Some(h) = given(b.day) else { continue };
                let hours = h.of_day(b.day);
                for x in hours {
                    let mut s = old
                        .iter_mut()
                        .find(|(hour, _)| *hour == x.hour)
                        .map(|(_, s)| std::mem::take(s))
                        .unwrap_or_default();
                    put_key(&mut s, &c.key, &cid);
                    s.insert("day".into(), json!(x.hour * crate::domain::hours::HOUR_MS));
                    s.insert("value".into(), json!(x.value));
                    if let Some(cat) = &category {
                        s.insert("category".into(), json!(cat));
                    }
                    items.push(Item {
                        index: names.hours(x.hour),
                        id: hour_doc_id(&cid, x.hour),
                        routing: Some(cid.clone()),
                        version: None,
                        source: Value::Object(s),
                        plain: Some(Plain::Index),
                    });
                }
                // The day's hours the record does not list are none.
                for (hour, _) in old.iter().filter(|(hour, _)| {
                    hour.div_euclid(24) == b.day && !hours.iter().any(|x| x.hour == *hour)
                }) {
                    items.push(Item {
                        index: names.hours(*hour),
                        id: hour_doc_id(&cid, *hour),
                        routing: Some(cid.clone()),
                        version: None,
                        source: Value::Null,
                        plain: Some(Plain::Delete),
                    });
                }
            }
            out.push((i, items));
        }
        Ok(Ok(out))
    }

    /// [`Self::counter_items`] for averages (no sets to carry over).
    async fn average_items(
        &self,
        averages: &[AverageImport],
        which: &[usize],
        oldest_day: i64,
    ) -> Result<Result<Vec<(usize, Vec<Item>)>, usize>, StoreError> {
        let names = &self.config.names;
        let wanted: Vec<(String, Vec<(String, i64)>)> = which
            .iter()
            .map(|&i| {
                let a = &averages[i];
                let days = a
                    .days
                    .iter()
                    .map(|b| (names.average_buckets(b.day), b.day))
                    .collect();
                (a.key.doc_id(), days)
            })
            .collect();
        let read = self.read_with_days(&names.averages(), &wanted).await?;
        let existing: Vec<String> = which
            .iter()
            .zip(&read)
            .filter(|(_, (a, _))| a.version.is_some())
            .map(|(&i, _)| averages[i].key.doc_id())
            .collect();
        let mut others: HashMap<String, Vec<(i64, i64, i64)>> = HashMap::new();
        if !existing.is_empty() {
            let pattern = names.average_buckets_pattern();
            self.refresh_tenant(&pattern).await?;
            self.buckets_of(
                &pattern,
                &existing,
                oldest_day,
                &["sum", "quantity"],
                |id, day, source| {
                    let sum = int(source.get("sum")).unwrap_or(0);
                    let quantity = int(source.get("quantity")).unwrap_or(0);
                    days_of(&mut others, id).push((day, sum, quantity));
                },
            )
            .await?;
        }
        let mut out = Vec::with_capacity(which.len());
        for (&i, (average, buckets)) in which.iter().zip(read) {
            let a = &averages[i];
            let cid = a.key.doc_id();
            let named: std::collections::HashSet<i64> = a.days.iter().map(|b| b.day).collect();
            let mut sum = a.before_sum + a.days.iter().map(|b| i128::from(b.sum)).sum::<i128>();
            let mut quantity =
                a.before_quantity + a.days.iter().map(|b| i128::from(b.quantity)).sum::<i128>();
            for (day, s, q) in others.remove(&cid).unwrap_or_default() {
                if !named.contains(&day) {
                    sum += i128::from(s);
                    quantity += i128::from(q);
                }
            }
            let (Ok(sum), Ok(quantity)) = (i64::try_from(sum), i64::try_from(quantity)) else {
                return Ok(Err(i));
            };
            let mut s = average.source.clone();
            let category = a
                .category
                .clone()
                .or_else(|| s.get("category").and_then(Value::as_str).map(String::from));
            let first = int(s.get("first_timestamp")).map_or(a.first_ms, |f| f.min(a.first_ms));
            let recorded =
                int(s.get("recorded_timestamp")).map_or(a.recorded_ms, |r| r.max(a.recorded_ms));
            put_key(&mut s, &a.key, &cid);
            s.insert("sum".into(), json!(sum));
            s.insert("quantity".into(), json!(quantity));
            // As the script stores it: the quotient, absent while there is no sample.
            if quantity == 0 {
                s.remove("average");
            } else {
                s.insert("average".into(), json!(sum as f64 / quantity as f64));
            }
            s.insert("first_timestamp".into(), json!(first));
            s.insert("recorded_timestamp".into(), json!(recorded));
            if let Some(cat) = &category {
                s.insert("category".into(), json!(cat));
            }
            s.remove("skipped_events");
            let mut items = vec![Item {
                index: names.averages(),
                id: cid.clone(),
                routing: None,
                version: average.version,
                source: Value::Object(s),
                plain: None,
            }];
            for (b, doc) in a.days.iter().zip(buckets) {
                let mut s = doc.source;
                put_key(&mut s, &a.key, &cid);
                s.insert("day".into(), json!(day_ms(b.day)));
                s.insert("sum".into(), json!(b.sum));
                s.insert("quantity".into(), json!(b.quantity));
                if let Some(cat) = &category {
                    s.insert("category".into(), json!(cat));
                }
                s.remove("skipped_events");
                items.push(Item {
                    index: names.average_buckets(b.day),
                    id: bucket_doc_id(&cid, b.day),
                    routing: Some(cid.clone()),
                    version: doc.version,
                    source: Value::Object(s),
                    plain: None,
                });
            }
            out.push((i, items));
        }
        Ok(Ok(out))
    }

    /// Writes the items of each entry; answers the entries not fully
    /// written (a conflict, a retryable failure, a lost answer), to be
    /// read and written again. A refusal that writing again cannot cure
    /// (a mapping error) is an error.
    async fn write_items(
        &self,
        entries: Vec<(usize, Vec<Item>)>,
    ) -> Result<Vec<usize>, StoreError> {
        let mut flat: Vec<(usize, Item)> = Vec::new();
        for (e, items) in entries {
            flat.extend(items.into_iter().map(|it| (e, it)));
        }
        let mut failed: Vec<usize> = Vec::new();
        let timeout = self.config.bulk_timeout_param();
        for chunk in flat.chunks(BULK_ITEMS) {
            let mut body = Vec::with_capacity(chunk.len() * 256);
            for (_, it) in chunk {
                let mut meta = Map::new();
                meta.insert("_index".into(), json!(it.index));
                meta.insert("_id".into(), json!(it.id));
                if let Some(r) = &it.routing {
                    meta.insert("routing".into(), json!(r));
                }
                let op = match (it.plain, it.version) {
                    (Some(Plain::Index), _) => "index",
                    (Some(Plain::Delete), _) => "delete",
                    (None, Some((seq, term))) => {
                        meta.insert("if_seq_no".into(), json!(seq));
                        meta.insert("if_primary_term".into(), json!(term));
                        "index"
                    }
                    (None, None) => "create",
                };
                let mut line = Map::new();
                line.insert(op.into(), Value::Object(meta));
                // Serializing a Value cannot fail.
                let _ = serde_json::to_writer(&mut body, &Value::Object(line));
                body.push(b'\n');
                if it.plain != Some(Plain::Delete) {
                    let _ = serde_json::to_writer(&mut body, &it.source);
                    body.push(b'\n');
                }
            }
            let answer = self
                .raw_call(
                    Method::Post,
                    "/_bulk",
                    &[("timeout", &timeout)],
                    Some(body),
                    Some("application/x-ndjson"),
                )
                .await;
            let classes: Vec<ItemClass> = match answer {
                Ok((200, json)) => match response::parse_bulk(&json, chunk.len()) {
                    Ok(items) => items.into_iter().map(|i| i.class).collect(),
                    Err(e) => vec![ItemClass::Unknown(e); chunk.len()],
                },
                Ok((status, json)) => vec![response::classify_request(status, &json); chunk.len()],
                Err(e) => vec![ItemClass::Unknown(e.message); chunk.len()],
            };
            for ((e, it), class) in chunk.iter().zip(classes) {
                match class {
                    ItemClass::Done => {}
                    // An hour document gone already (another import).
                    ItemClass::Rejected(r)
                        if it.plain == Some(Plain::Delete) && r.starts_with("404") => {}
                    ItemClass::Retry(_) | ItemClass::Unknown(_) => failed.push(*e),
                    ItemClass::Rejected(r) | ItemClass::Overflow(r) => {
                        return Err(StoreError::Internal(format!(
                            "importing: {} refused {}: {r}",
                            it.index, it.id
                        )))
                    }
                }
            }
        }
        failed.sort_unstable();
        failed.dedup();
        Ok(failed)
    }

    pub(super) async fn import_es(&self, batch: ImportBatch) -> Result<ImportOutcome, StoreError> {
        let mut days: Vec<i64> = batch
            .counters
            .iter()
            .flat_map(|c| c.days.iter().map(|b| b.day))
            .collect();
        days.extend(
            batch
                .averages
                .iter()
                .flat_map(|a| a.days.iter().map(|b| b.day)),
        );
        days.extend(batch.days.iter().map(|s| s.day));
        self.ensure_bucket_days(&days).await;
        if !batch.counters.is_empty() || !batch.days.is_empty() {
            self.ensure_set_mappings(&days).await?;
        }
        // Every total is checked before anything is written.
        if let Some(i) = self.would_overflow(&batch.days).await? {
            return Ok(ImportOutcome::Overflow(ImportEntry::Day(i)));
        }
        let mut counters: Vec<usize> = (0..batch.counters.len()).collect();
        let mut averages: Vec<usize> = (0..batch.averages.len()).collect();
        let mut waited = Duration::ZERO;
        let mut attempt = 0;
        while !counters.is_empty() || !averages.is_empty() {
            let c = match self
                .counter_items(&batch.counters, &counters, batch.oldest_day)
                .await?
            {
                Ok(items) => items,
                Err(i) if attempt == 0 => {
                    return Ok(ImportOutcome::Overflow(ImportEntry::Counter(i)))
                }
                Err(i) => return Err(raced(&batch.counters[i].key)),
            };
            let a = match self
                .average_items(&batch.averages, &averages, batch.oldest_day)
                .await?
            {
                Ok(items) => items,
                Err(i) if attempt == 0 => {
                    return Ok(ImportOutcome::Overflow(ImportEntry::Average(i)))
                }
                Err(i) => return Err(raced(&batch.averages[i].key)),
            };
            counters = self.write_items(c).await?;
            averages = self.write_items(a).await?;
            if counters.is_empty() && averages.is_empty() {
                break;
            }
            let delay = self.config.backoff.delay(attempt, &self.jitter);
            if waited + delay > self.config.backoff.budget {
                return Err(StoreError::Unavailable(format!(
                    "{} counters and {} averages of the batch could not be written (conflicts or failures past the back-off budget); importing the batch again completes them",
                    counters.len(),
                    averages.len()
                )));
            }
            tokio::time::sleep(delay).await;
            waited += delay;
            attempt += 1;
        }
        // After every check: marks never overflow, and an `Overflow` sets nothing.
        self.import_marks(&batch.marks).await?;
        if batch.days.is_empty() {
            return Ok(ImportOutcome::Applied);
        }
        let sets: Vec<DaySet> = batch.days;
        match self.set_days_es(sets, batch.oldest_day).await? {
            DaysOutcome::Applied { .. } => Ok(ImportOutcome::Applied),
            DaysOutcome::Overflow { index } => Err(StoreError::Unavailable(format!(
                "an increment that raced the import would make the day set of line entry {index} overflow; the rest of the batch is set"
            ))),
            DaysOutcome::Incomplete { reason, .. } => Err(StoreError::Unavailable(format!(
                "{reason}; importing the batch again completes it"
            ))),
        }
    }
}

/// An overflow found only when a counter was read again: an increment
/// raced the import, and part of the batch is written already.
fn raced(key: &CounterKey) -> StoreError {
    StoreError::Unavailable(format!(
        "an increment that raced the import would make {key} leave the signed 64-bit range; part of the batch is set, importing it again completes the rest"
    ))
}

/// The key fields every document of a counter carries.
fn put_key(s: &mut Map<String, Value>, key: &CounterKey, cid: &str) {
    s.insert("counter_id".into(), json!(cid));
    s.insert("entity".into(), json!(&*key.entity));
    s.insert("action".into(), json!(&*key.action));
    s.insert("uuid".into(), json!(&*key.uuid));
}

pub(super) fn hits(answer: &Value) -> Result<&Vec<Value>, StoreError> {
    static EMPTY: Vec<Value> = Vec::new();
    // A pattern matching no index answers no hits at all.
    if answer.pointer("/_shards/total").and_then(Value::as_u64) == Some(0) {
        return Ok(&EMPTY);
    }
    answer
        .pointer("/hits/hits")
        .and_then(Value::as_array)
        .ok_or_else(|| StoreError::Internal("the search answer has no hits".into()))
}

/// The list of `id` in `map`, made on first use.
fn days_of<'m, T>(map: &'m mut HashMap<String, Vec<T>>, id: &str) -> &'m mut Vec<T> {
    map.entry(id.to_owned()).or_default()
}

/// An integer as stored: a JSON number, or a string of one.
fn int(v: Option<&Value>) -> Option<i64> {
    let v = v?;
    v.as_i64()
        .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
}

fn average_from_source(s: &Value) -> Option<AverageHistory> {
    let part = |name: &str| s.get(name).and_then(Value::as_str);
    let recorded = int(s.get("recorded_timestamp"))?;
    Some(AverageHistory {
        key: CounterKey {
            entity: part("entity")?.into(),
            action: part("action")?.into(),
            uuid: part("uuid")?.into(),
        },
        sum: int(s.get("sum"))?,
        quantity: int(s.get("quantity"))?,
        category: part("category").map(str::to_string),
        first_ms: int(s.get("first_timestamp")).unwrap_or(recorded),
        recorded_ms: recorded,
        days: Vec::new(),
    })
}
