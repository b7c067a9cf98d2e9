//! The read path: realtime gets by id, and searches and aggregations (which
//! see writes after the refresh interval). Query bodies and answer parsers
//! are pure functions in [`super::query`], which also says what is exact.

use std::time::Duration;

use elasticsearch::http::headers::HeaderMap;
use elasticsearch::http::Method;
use serde_json::Value;

use super::client::{search_routing, status_error};
use super::query::{self, CategoryFilter};
use super::{request, response, ElasticsearchStore};
use crate::domain::rank::{MeanOfAverages, Rank};
use crate::domain::{Counter, CounterKey, HourRange, Window};
use crate::store::ranked::RankedTop;
use crate::store::{
    Average, AverageEntry, Bucket, HourHistogram, StaleQuery, StoreError, TopAverages,
    TopAveragesQuery, TopEntry, TopHoursQuery, TopList, TopQuery, UnusedPair,
};

impl ElasticsearchStore {
    pub(super) async fn get_counter(
        &self,
        key: &CounterKey,
    ) -> Result<Option<Counter>, StoreError> {
        let path = format!(
            "/{}/_doc/{}",
            self.config.names.counters(),
            request::encode_path_segment(&key.doc_id())
        );
        let fields = request::COUNTER_FIELDS[..7].join(",");
        // A read changes nothing, so a 429 or 503 (a shard still
        // recovering: a fresh index, a replica being promoted) is asked
        // again within the backoff budget, as bulk items are.
        let (mut attempt, mut waited) = (0, Duration::ZERO);
        loop {
            let (status, body) = self
                .call(Method::Get, &path, &[("_source_includes", &fields)], None)
                .await?;
            let delay = self.config.backoff.delay(attempt, &self.jitter);
            if (status == 429 || status == 503) && waited + delay <= self.config.backoff.budget {
                tracing::debug!(status, ?delay, "reading a counter again");
                tokio::time::sleep(delay).await;
                waited += delay;
                attempt += 1;
                continue;
            }
            return response::counter_from_get(status, &body).map_err(|e| status_error(status, e));
        }
    }

    pub(super) async fn target_counters(
        &self,
        entity: &str,
        uuid: &str,
    ) -> Result<Vec<Counter>, StoreError> {
        let path = format!("/{}/_search", self.config.names.counters());
        let body = serde_json::to_vec(&request::target_query(entity, uuid))
            .map_err(|e| StoreError::Internal(e.to_string()))?;
        let answer = self
            .call_ok(
                Method::Post,
                &path,
                &[("ignore_unavailable", "true")],
                Some(body),
                "search",
            )
            .await?;
        response::counters_from_search(&answer).map_err(StoreError::Internal)
    }

    pub(super) async fn check_ready(&self) -> Result<(), StoreError> {
        let res = self
            .pool
            .send(
                Method::Get,
                "/",
                HeaderMap::new(),
                None,
                None,
                Some(Duration::from_secs(2)),
            )
            .await
            .map_err(|e| {
                StoreError::Unavailable(format!("elasticsearch unreachable: {}", e.message))
            })?;
        let status = res.status_code().as_u16();
        if (200..300).contains(&status) {
            Ok(())
        } else {
            Err(StoreError::Unavailable(format!(
                "elasticsearch answered {status}"
            )))
        }
    }

    pub(super) async fn read_histogram(
        &self,
        key: &CounterKey,
        window: Window,
    ) -> Result<Option<Vec<Bucket>>, StoreError> {
        if self.get_counter(key).await?.is_none() {
            return Ok(None);
        }
        let answer = self.window_buckets(key, window, false).await?;
        query::buckets_from_search(&answer)
            .map(Some)
            .map_err(StoreError::Internal)
    }

    pub(super) async fn read_top(&self, q: &TopQuery) -> Result<TopList, StoreError> {
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
        let top = self
            .window_counts(&indices.path, indices.months == 1, q.size, |terms, only| {
                query::top_window_terms(q, window, &cat, terms, only)
            })
            .await?;
        let exact = top.exact(&cat);
        let picked: Vec<&(String, i128)> = top.entries.iter().take(q.size).collect();
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

    /// One counter's hour documents in `range` (a routed search of the
    /// range's monthly hour indices). Not exact when a backfill set a day
    /// of the range (the counter's `set_days`): that day moved without an
    /// hour. Searches see the indices as of their last refresh (1 s), as
    /// windowed lists do.
    pub(super) async fn read_hour_histogram(
        &self,
        key: &CounterKey,
        range: HourRange,
    ) -> Result<Option<HourHistogram>, StoreError> {
        let id = key.doc_id();
        let path = format!(
            "/{}/_doc/{}",
            self.config.names.counters(),
            request::encode_path_segment(&id)
        );
        let (status, body) = self
            .call(
                Method::Get,
                &path,
                &[("_source_includes", "uuid,set_days")],
                None,
            )
            .await?;
        let source = match status {
            200 if body.get("found") == Some(&Value::Bool(true)) => {
                body.get("_source").cloned().unwrap_or(Value::Null)
            }
            200 | 404 => return Ok(None),
            _ => {
                return Err(status_error(
                    status,
                    format!(
                        "reading counter {key} answered {status} {}",
                        response::describe_error(body.get("error"))
                    ),
                ))
            }
        };
        let indices = self.config.names.hour_window(range);
        let answer = self
            .search(
                &format!("/{}/_search", indices.path),
                &search_routing(&id),
                &query::hour_buckets_query(&id, range),
            )
            .await?;
        let buckets = query::hour_buckets_from_search(&answer).map_err(StoreError::Internal)?;
        Ok(Some(HourHistogram {
            buckets,
            exact: !query::set_in(&source, range.days()),
        }))
    }

    /// A top list of hour sums: as a windowed list, over the hour indices;
    /// not exact when a listed counter had a day of the range set by a
    /// backfill (its `set_days`). Unlike the embedded store, which looks at
    /// every counter of the range, only the listed ones are looked at.
    pub(super) async fn read_top_hours(&self, q: &TopHoursQuery) -> Result<TopList, StoreError> {
        let counters = self.config.names.counters();
        let cat = self
            .category_filter(&counters, &q.entity, &q.action, q.category.as_deref())
            .await?;
        if cat == CategoryFilter::Uuids(Vec::new()) {
            return Ok(TopList {
                entries: Vec::new(),
                exact: true,
            });
        }
        let indices = self.config.names.hour_window(q.hours);
        let top = self
            .window_counts(&indices.path, indices.months == 1, q.size, |terms, only| {
                query::top_hours_terms(q, &cat, terms, only)
            })
            .await?;
        let mut exact = top.exact(&cat);
        let picked: Vec<&(String, i128)> = top.entries.iter().take(q.size).collect();
        let ids: Vec<String> = picked
            .iter()
            .filter_map(|(u, _)| CounterKey::new(&q.entity, &q.action, u).ok())
            .map(|k| k.doc_id())
            .collect();
        let found = if ids.is_empty() {
            Vec::new()
        } else {
            let answer = self
                .post_json(
                    &format!("/{counters}/_mget"),
                    &[("_source_includes", "uuid,category,set_days")],
                    &query::mget_body(&ids),
                )
                .await?;
            query::found_from_mget(&answer).map_err(StoreError::Internal)?
        };
        exact &= !found.iter().any(|(_, s)| query::set_in(s, q.hours.days()));
        let categories = query::categories_by_uuid(&found);
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

    pub(super) async fn read_stale(&self, q: &StaleQuery) -> Result<Vec<Counter>, StoreError> {
        let answer = self
            .search(
                &format!("/{}/_search", self.config.names.counters()),
                &[],
                &query::stale_query(q),
            )
            .await?;
        query::stale_from_search(&answer).map_err(StoreError::Internal)
    }

    pub(super) async fn read_unused(&self, before_ms: i64) -> Result<Vec<UnusedPair>, StoreError> {
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

    pub(super) async fn read_average(
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

    pub(super) async fn read_top_averages(
        &self,
        q: &TopAveragesQuery,
    ) -> Result<TopAverages, StoreError> {
        if q.rank != Rank::Average {
            return self.read_ranked_averages(q).await;
        }
        let averages = self.config.names.averages();
        if q.window.is_none() {
            let answer = self
                .search(
                    &format!("/{averages}/_search"),
                    &[],
                    &query::top_averages_all_time_query(q),
                )
                .await?;
            let entries = query::top_averages_from_search(&answer).map_err(StoreError::Internal)?;
            return Ok(TopAverages::by_average(entries, true));
        }
        let cat = self
            .category_filter(&averages, &q.entity, &q.action, q.category.as_deref())
            .await?;
        let mut exact = !matches!(cat, CategoryFilter::BucketCategory(_));
        if cat == CategoryFilter::Uuids(Vec::new()) {
            return Ok(TopAverages::by_average(Vec::new(), exact));
        }
        // Every average of the window, kept to the best `size` as pages come
        // in, so memory stays bounded by the page and the list.
        let mut best: Vec<AverageEntry> = Vec::new();
        exact &= self
            .walk_averages(q, &cat, |e| {
                best.push(e);
                if best.len() > 2 * q.size {
                    query::rank_averages(&mut best, q.size);
                }
                true
            })
            .await?;
        query::rank_averages(&mut best, q.size);
        let entries = self.with_categories(q, best).await?;
        Ok(TopAverages::by_average(entries, exact))
    }

    /// Windowed entries with the category of their average document; an
    /// entry whose document is gone is left out, as the embedded store's
    /// join does.
    async fn with_categories(
        &self,
        q: &TopAveragesQuery,
        entries: Vec<AverageEntry>,
    ) -> Result<Vec<AverageEntry>, StoreError> {
        let uuids: Vec<&str> = entries.iter().map(|e| e.uuid.as_str()).collect();
        let categories = self
            .categories(&self.config.names.averages(), &q.entity, &q.action, &uuids)
            .await?;
        Ok(entries
            .into_iter()
            .filter_map(|mut e| {
                e.category = categories.get(&e.uuid)?.as_str().map(str::to_string);
                Some(e)
            })
            .collect())
    }

    /// Top averages by a confidence-adjusted rank: every average the list
    /// considers, walked in uuid order and scored here (see "What is exact"
    /// in [`query`]).
    async fn read_ranked_averages(&self, q: &TopAveragesQuery) -> Result<TopAverages, StoreError> {
        let cat = match q.window {
            None => CategoryFilter::None,
            Some(_) => {
                let averages = self.config.names.averages();
                self.category_filter(&averages, &q.entity, &q.action, q.category.as_deref())
                    .await?
            }
        };
        let cat_exact = !matches!(cat, CategoryFilter::BucketCategory(_));
        let nothing = || RankedTop::new(q.rank, None, q.size).finish(cat_exact);
        if cat == CategoryFilter::Uuids(Vec::new()) {
            return Ok(nothing());
        }
        let bayesian = matches!(q.rank, Rank::Bayesian { .. });
        let (mut prior_mean, mut walks) = (None, 0);
        if bayesian {
            let mut mean = MeanOfAverages::default();
            self.walk_averages(q, &cat, |e| {
                mean.push(e.sum, e.quantity);
                true
            })
            .await?;
            walks += 1;
            prior_mean = mean.mean();
            if prior_mean.is_none() {
                return Ok(nothing());
            }
        }
        loop {
            let mut top = RankedTop::new(q.rank, prior_mean, q.size);
            let sums_exact = self.walk_averages(q, &cat, |e| top.push(e)).await?;
            walks += 1;
            let seen = top.mean_seen();
            if bayesian && seen != prior_mean && walks < query::RANK_WALKS {
                // Writes between the walks moved C: score again with it.
                tracing::debug!(walks, "the mean of the averages moved; ranking again");
                if seen.is_none() {
                    return Ok(nothing());
                }
                prior_mean = seen;
                continue;
            }
            let mut list = top.finish(cat_exact && sums_exact);
            if q.window.is_some() && list.out_of_scale.is_none() {
                list.entries = self.with_categories(q, list.entries).await?;
            }
            return Ok(list);
        }
    }

    /// Every average of the list's pair (category, window) with at least
    /// `min_quantity` samples, in uuid order, to `row` until it answers
    /// `false`. All time: a `search_after` walk of the average documents;
    /// a window: the `composite` pages of their buckets. Answers whether
    /// every sum fitted a double exactly (always, all time).
    async fn walk_averages(
        &self,
        q: &TopAveragesQuery,
        cat: &CategoryFilter,
        mut row: impl FnMut(AverageEntry) -> bool + Send,
    ) -> Result<bool, StoreError> {
        let Some(window) = q.window else {
            let path = format!("/{}/_search", self.config.names.averages());
            let mut after: Option<String> = None;
            loop {
                let body = query::ranked_averages_all_time_query(q, after.as_deref());
                let answer = self.search(&path, &[], &body).await?;
                let page =
                    query::top_averages_from_search(&answer).map_err(StoreError::Internal)?;
                let full = page.len() >= query::RANK_PAGE;
                let last = page.last().map(|e| e.uuid.clone());
                for e in page {
                    if !row(e) {
                        return Ok(true);
                    }
                }
                match last {
                    Some(l) if full && after.as_ref() != Some(&l) => after = Some(l),
                    _ => return Ok(true),
                }
            }
        };
        let path = format!(
            "/{}/_search",
            self.config.names.window_buckets(window, true).path
        );
        let mut exact = true;
        let mut after: Option<Value> = None;
        loop {
            let answer = self
                .search(
                    &path,
                    &[],
                    &query::top_averages_window_query(q, window, cat, after.as_ref()),
                )
                .await?;
            let (buckets, next) =
                query::composite_page(&answer, "averages").map_err(StoreError::Internal)?;
            let (rows, rows_exact) = query::averages_page(buckets).map_err(StoreError::Internal)?;
            exact &= rows_exact;
            for (uuid, sum, quantity) in rows {
                if quantity < i128::from(q.min_quantity) {
                    continue;
                }
                let e = AverageEntry {
                    uuid,
                    sum,
                    quantity,
                    category: None,
                    score: None,
                };
                if !row(e) {
                    return Ok(exact);
                }
            }
            match next {
                Some(n) if after.as_ref() != Some(n) => after = Some(n.clone()),
                _ => return Ok(exact),
            }
        }
    }

    /// The uuids of one category of a pair, read from `index` (counters or
    /// averages), or the bucket-category fallback past [`query::MAX_HITS`].
    pub(super) async fn category_filter(
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

    /// Many counters by realtime `_mget` (the multi-read): one request for
    /// all of them, answered in the order asked. `_mget` refuses an empty
    /// list (400 "no documents to get"), so none is sent for one.
    pub(super) async fn get_counters(
        &self,
        keys: &[CounterKey],
    ) -> Result<Vec<Option<Counter>>, StoreError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<String> = keys.iter().map(CounterKey::doc_id).collect();
        let fields = request::COUNTER_FIELDS[..7].join(",");
        let answer = self
            .post_json(
                &format!("/{}/_mget", self.config.names.counters()),
                // Realtime is the default; said here because the answer
                // must see every acknowledged write, as a single get does.
                &[("realtime", "true"), ("_source_includes", &fields)],
                &query::mget_body(&ids),
            )
            .await?;
        response::counters_from_mget(&answer, &ids).map_err(|e| match e {
            response::MgetError::Doc(m) => StoreError::Unavailable(m),
            response::MgetError::Shape(m) => StoreError::Internal(m),
        })
    }
}
