//! `first_<N>_days` lists in a zone's days (`tz=`) on Elasticsearch: each
//! counter's total over the UTC hours of its first N local days, from the
//! hour documents (`crate::store::LocalFirstDaysQuery`).
//!
//! The walk of `publication.rs`'s UTC list, over hours: the pair's counter
//! documents a page at a time in uuid order (a sorted search with
//! `search_after`), per page one `_mget` of their targets' publication
//! times and a sorted search of their hour documents inside the page's
//! hours; each counter's hours are cut by the zone's rules here (a local
//! day's hours depend on the date: 23 or 25 around a DST change), summed,
//! and kept among the best `size`. Three requests per 5,000 counters,
//! bounded in memory; exact but for a listed counter whose day of its
//! hours was set by a backfill (its `set_days`), as hour answers are.

use std::collections::HashMap;

use serde_json::{json, Value};

use super::publication::target_id;
use super::transfer::hits;
use super::{query, response, ElasticsearchStore};
use crate::domain::hours::HOUR_MS;
use crate::domain::HourRange;
use crate::store::{keep_best, FirstDaysEntry, FirstDaysList, LocalFirstDaysQuery, StoreError};

/// Counters per page of the walk (and ids per `_mget` and hour search), as
/// the UTC list's.
const COUNTER_PAGE: usize = 5000;

/// A counter of the walk: its row, its hours, whether a backfill set a
/// day of them.
struct Candidate {
    entry: FirstDaysEntry,
    hours: HourRange,
    set: bool,
}

impl ElasticsearchStore {
    pub(super) async fn top_first_days_local_es(
        &self,
        q: &LocalFirstDaysQuery,
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
        let mut exact = true;
        let mut after: Option<Value> = None;
        loop {
            let mut body = json!({
                "size": COUNTER_PAGE,
                "track_total_hits": false,
                "query": {"bool": {"filter": filter}},
                "sort": [{"uuid": "asc"}],
                "_source": {"includes": ["entity", "action", "uuid", "value", "category",
                    "first_timestamp", "recorded_timestamp", "set_days"]},
            });
            if let Some(a) = after.take() {
                body["search_after"] = a;
            }
            let answer = self
                .search(&format!("/{}/_search", names.counters()), &[], &body)
                .await?;
            let page = hits(&answer)?;
            let mut counters = Vec::with_capacity(page.len());
            for h in page {
                let source = h.get("_source").unwrap_or(&Value::Null);
                let c = response::counter_from_source(source).ok_or_else(|| {
                    StoreError::Internal("a counter document lacks required fields".into())
                })?;
                counters.push((c, source));
            }
            let targets: Vec<String> = counters
                .iter()
                .map(|(c, _)| target_id(&c.key.entity, &c.key.uuid))
                .collect();
            let set = self.published_many(&targets).await?;
            let mut rows: HashMap<String, Candidate> = HashMap::new();
            for ((c, source), t) in counters.into_iter().zip(&targets) {
                let (published_ms, published_set) = match set.get(t) {
                    Some(ms) => (*ms, true),
                    None => (c.first_ms, false),
                };
                let hours = q.zone.first_days_hours(published_ms, q.days);
                // Its first local day began before the retention: part
                // of its hours are gone, it is not listed.
                if hours.from_hour < q.first_hour {
                    continue;
                }
                rows.insert(
                    c.key.doc_id(),
                    Candidate {
                        set: query::set_in(source, hours.days()),
                        entry: FirstDaysEntry {
                            uuid: c.key.uuid.to_string(),
                            value: 0,
                            category: c.category,
                            published_ms,
                            published_set,
                        },
                        hours,
                    },
                );
            }
            let mut seen: HashMap<String, i128> = HashMap::new();
            let pattern = self.config.names.hours_pattern();
            let hours = |c: &Candidate| (c.hours.from_hour, c.hours.to_hour);
            self.sum_in_windows(&pattern, HOUR_MS, &rows, hours, &mut seen)
                .await?;
            for (id, sum) in seen {
                if let Some(mut c) = rows.remove(&id) {
                    c.entry.value = sum;
                    exact &= !c.set;
                    best.push(c.entry);
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
            exact,
        })
    }
}
