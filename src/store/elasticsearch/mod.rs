//! The Elasticsearch store: each flush is one `_bulk` of scripted upserts
//! (one per counter document, one per day bucket document), every item's
//! result classified, only failed retryable items resent.
//!
//! Files by role, as in vector's Elasticsearch sink: [`config`] (flags and
//! validated settings), [`client`] (one HTTP call, errors split by whether
//! the request can have reached the cluster) over [`pool`] (the nodes:
//! round-robin, dead ones set aside, sniffing), [`setup`] and [`templates`]
//! (what is installed), [`indices`] (monthly bucket indices created ahead,
//! expired ones deleted where there is no ILM), [`writes`] (a flush as `_bulk`, retries, overflow,
//! deletes) with [`request`] (write bodies, pure) and [`response`]
//! (classifying answers, pure), [`reads`] with [`query`] (read queries and
//! their answers, pure; says what is exact), [`retry`] (back-off as a value),
//! [`backfill`] (days set to a value: bucket first, then the counter, each
//! set completed by the next one should a crash cut it short), [`transfer`]
//! (export pages and import batches of whole documents), [`marks`]
//! (counting once per actor: a mark document per actor and counter, never
//! counted twice).
//!
//! # Hour buckets
//!
//! Each counter increment of a day inside the hourly retention
//! (`--hourly-retention-days`) also goes to an hour document in
//! `<prefix>_<tenant>_hour_counters-YYYY.MM` (id `<counter id>@YYYY-MM-DDTHH`,
//! routed by counter id, the bucket mapping with `day` holding the hour's
//! start), written in the same `_bulk` by the day buckets' script, event
//! ids and bulk names included: a retried id or a replayed bulk is counted
//! once in the hour as in the day, so the hours of a day sum to it. Monthly
//! indices (see `IndexNames::hours` for why), created ahead like the day
//! buckets', deleted by the gateway once their last day is past the hourly
//! retention, on every engine (no ILM policy: `templates::NO_LIFECYCLE`
//! says why); an increment of an older day writes no hour, so it never
//! makes an index again. Reads are a routed search (a histogram) and a
//! `terms` aggregation (a list) over the range's hour indices, exact as the
//! windowed lists are (see `query`). A backfilled day has no hour: answers
//! over it say `exact: false` (the counter's `set_days`; a list checks its
//! listed counters only), and so does a day an import set without its
//! hours (a file of format 4 or older; marked there too). A day imported
//! with its hours (format 5) has its hour documents set whole (`index`,
//! keeping the event ids they remember; those the file does not list
//! deleted) and is marked only when its hours do not sum to it
//! (`transfer.rs`).
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
//!   was sent, a whole `_bulk` answered 502/504 or a non-engine 5xx by a
//!   proxy) leaves the outcome unknown: those items are never resent
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
//! - Delete removes the buckets and the actor marks first (delete-by-query,
//!   routed by counter id, after a refresh so that recent ones are
//!   visible), then the counter, so a failed delete can be repeated. Increments that race with a
//!   delete may recreate the counter, as with the embedded store.

mod backfill;
mod client;
pub mod config;
mod countapi;
pub mod indices;
mod local_first_days;
mod mark_keying;
mod mark_transfer;
mod marks;
pub mod pool;
mod publication;
pub mod query;
mod reads;
pub mod request;
pub mod response;
pub mod retry;
mod set_value;
mod setup;
pub mod templates;
mod transfer;
mod trending;
mod walk;
mod writes;

use std::sync::Arc;

use async_trait::async_trait;

use self::config::EsConfig;
use self::pool::NodePool;
use self::retry::Jitter;
use super::{
    ActorMark, Average, AverageHistory, BatchOutcome, Bucket, CounterHistory, DaysOutcome,
    ImportBatch, ImportOutcome, StaleQuery, Store, StoreError, TopAverages, TopAveragesQuery,
    TopList, TopQuery, UnusedPair, WriteBatch,
};
use crate::domain::{Clock, Counter, CounterKey, CounterSet, DaySet, Window};

pub use self::config::{ElasticsearchArgs, SetupArgs};
pub use self::mark_transfer::FINGERPRINT_META;
pub use self::setup::SetupReport;
pub use self::writes::MAX_BULK_ITEMS;

/// The Elasticsearch implementation of [`Store`].
pub struct ElasticsearchStore {
    /// The cluster's nodes, shared by every tenant's store.
    pool: Arc<NodePool>,
    config: EsConfig,
    clock: Clock,
    jitter: Jitter,
    /// Read from `GET /` once ([`ElasticsearchStore::engine`]).
    engine: std::sync::OnceLock<templates::Engine>,
    /// Months whose bucket indices this tenant's store created or found
    /// ([`indices`]), at most [`indices::MAX_ENSURED_MONTHS`].
    ensured_months: std::sync::Mutex<std::collections::BTreeSet<indices::Month>>,
    /// Indices given the backfill fields' mapping by this store (`backfill`).
    mapped_for_sets: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Months whose day-mark indices this store created or found (`marks`).
    mark_months: std::sync::Mutex<std::collections::BTreeSet<indices::Month>>,
    /// This tenant's `actor_marks` index made sure of (`mark_transfer`).
    marks_index_ready: std::sync::atomic::AtomicBool,
    /// This tenant's marks are recorded as keyed for it (`mark_keying`):
    /// checked before its first flush with marks.
    marks_keyed: std::sync::atomic::AtomicBool,
    /// Names of this store's writes, remembered by the documents they
    /// change (`request::OpIds`).
    ops: request::OpIds,
}

impl ElasticsearchStore {
    /// Builds the client; no I/O. `clock` gives the time idempotency ids are
    /// remembered from.
    pub fn new(config: EsConfig, clock: Clock) -> Result<Self, StoreError> {
        let pool =
            NodePool::new(&config, std::time::Instant::now()).map_err(StoreError::Internal)?;
        Ok(ElasticsearchStore {
            pool: Arc::new(pool),
            config,
            clock,
            jitter: Jitter::from_clock(),
            engine: std::sync::OnceLock::new(),
            ensured_months: Default::default(),
            mapped_for_sets: Default::default(),
            mark_months: Default::default(),
            marks_index_ready: Default::default(),
            marks_keyed: Default::default(),
            ops: request::OpIds::new(),
        })
    }

    /// Builds the client and, when asked, installs templates and scripts.
    pub async fn open(config: EsConfig, clock: Clock, run_setup: bool) -> Result<Self, StoreError> {
        let store = ElasticsearchStore::new(config, clock)?;
        // Sniffed first, so that setup already spreads over the nodes; a
        // failed sniff leaves the URLs given, which may be all there is.
        if store.pool.take_sniff_due(std::time::Instant::now()) {
            match store.pool.sniff().await {
                Ok(n) => {
                    tracing::info!(nodes = n, urls = ?store.pool.urls(), "elasticsearch nodes sniffed")
                }
                Err(e) => tracing::warn!("{e}; using the URLs given"),
            }
        }
        if run_setup {
            let report = store.setup().await?;
            tracing::info!(
                engine = %report.engine,
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

    /// The nodes requests go to (the URLs given, and those sniffed).
    pub fn node_urls(&self) -> Vec<String> {
        self.pool.urls()
    }

    /// The same cluster, client (and its connections) and settings, over
    /// `tenant`'s indices; no I/O. Templates and scripts are per prefix, so
    /// one setup serves every tenant.
    pub fn for_tenant(&self, tenant: &str) -> Result<Self, StoreError> {
        let mut config = self.config.clone();
        config.names = request::IndexNames::new(config.names.prefix(), tenant)
            .map_err(StoreError::Internal)?;
        Ok(ElasticsearchStore {
            pool: self.pool.clone(),
            config,
            clock: self.clock.clone(),
            jitter: Jitter::from_clock(),
            engine: self.engine.clone(),
            ensured_months: Default::default(),
            mapped_for_sets: Default::default(),
            mark_months: Default::default(),
            marks_index_ready: Default::default(),
            marks_keyed: Default::default(),
            ops: request::OpIds::new(),
        })
    }
}

/// Each method is implemented in the file of its role: [`writes`] or [`reads`].
#[async_trait]
impl Store for ElasticsearchStore {
    async fn apply(&self, batch: WriteBatch) -> Result<BatchOutcome, StoreError> {
        self.apply_batch(batch).await
    }

    /// A no-op on purpose: an `apply` returns only once `_bulk` answered for
    /// every item, and a successful item is already durable on the cluster
    /// (its translog is fsync'd before Elasticsearch answers).
    async fn sync(&self) -> Result<(), StoreError> {
        Ok(())
    }

    fn bulks_in_flight(&self) -> usize {
        self.config.bulks_in_flight
    }

    async fn get(&self, key: &CounterKey) -> Result<Option<Counter>, StoreError> {
        self.get_counter(key).await
    }

    async fn target_counters(&self, entity: &str, uuid: &str) -> Result<Vec<Counter>, StoreError> {
        self.target_counters(entity, uuid).await
    }

    async fn delete(&self, key: &CounterKey) -> Result<bool, StoreError> {
        self.delete_counter(key).await
    }

    async fn ready(&self) -> Result<(), StoreError> {
        self.check_ready().await
    }

    async fn hour_histogram(
        &self,
        key: &CounterKey,
        range: crate::domain::HourRange,
    ) -> Result<Option<crate::store::HourHistogram>, StoreError> {
        self.read_hour_histogram(key, range).await
    }

    async fn top_hours(&self, q: &crate::store::TopHoursQuery) -> Result<TopList, StoreError> {
        self.read_top_hours(q).await
    }

    async fn trending(
        &self,
        q: &crate::store::TrendingQuery,
    ) -> Result<crate::store::TrendingList, StoreError> {
        self.read_trending(q).await
    }

    async fn histogram(
        &self,
        key: &CounterKey,
        window: Window,
    ) -> Result<Option<Vec<Bucket>>, StoreError> {
        self.read_histogram(key, window).await
    }

    async fn top(&self, q: &TopQuery) -> Result<TopList, StoreError> {
        self.read_top(q).await
    }

    async fn stale(&self, q: &StaleQuery) -> Result<Vec<Counter>, StoreError> {
        self.read_stale(q).await
    }

    async fn unused(&self, before_ms: i64) -> Result<Vec<UnusedPair>, StoreError> {
        self.read_unused(before_ms).await
    }

    async fn average(
        &self,
        key: &CounterKey,
        window: Option<Window>,
    ) -> Result<Option<Average>, StoreError> {
        self.read_average(key, window).await
    }

    async fn top_averages(&self, q: &TopAveragesQuery) -> Result<TopAverages, StoreError> {
        self.read_top_averages(q).await
    }

    async fn get_many(&self, keys: &[CounterKey]) -> Result<Vec<Option<Counter>>, StoreError> {
        self.get_counters(keys).await
    }

    async fn set_days(
        &self,
        sets: Vec<DaySet>,
        oldest_day: i64,
    ) -> Result<DaysOutcome, StoreError> {
        self.set_days_es(sets, oldest_day).await
    }

    async fn set_value(&self, set: CounterSet) -> Result<Counter, StoreError> {
        self.set_value_es(set).await
    }

    async fn counter_page(
        &self,
        after: Option<CounterKey>,
        limit: usize,
        from_day: i64,
        hours_from_day: i64,
    ) -> Result<Vec<CounterHistory>, StoreError> {
        self.counter_page_es(after, limit, from_day, hours_from_day)
            .await
    }

    async fn average_page(
        &self,
        after: Option<CounterKey>,
        limit: usize,
        from_day: i64,
    ) -> Result<Vec<AverageHistory>, StoreError> {
        self.average_page_es(after, limit, from_day).await
    }

    async fn mark_page(
        &self,
        after: Option<ActorMark>,
        limit: usize,
        from_day: i64,
    ) -> Result<Vec<ActorMark>, StoreError> {
        self.mark_page_es(after, limit, from_day).await
    }

    async fn import(&self, batch: ImportBatch) -> Result<ImportOutcome, StoreError> {
        self.import_es(batch).await
    }

    async fn key_marks(&self, key: &crate::domain::ActorKey) -> Result<u64, StoreError> {
        if key.tenant() != self.config.names.tenant() {
            return Err(StoreError::Internal(format!(
                "marks of tenant {:?} keyed for tenant {:?}",
                self.config.names.tenant(),
                key.tenant()
            )));
        }
        // Checked only: the record is written with the tenant's first mark
        // (a tenant that never counts an actor gets no mark index).
        self.check_marks_keyed().await?;
        Ok(0)
    }

    async fn mark_keying(&self) -> Result<super::MarkKeying, StoreError> {
        self.mark_keying_es().await
    }

    async fn set_published(&self, sets: Vec<crate::store::PublishedSet>) -> Result<(), StoreError> {
        self.set_published_es(sets).await
    }

    async fn published(&self, entity: &str, uuid: &str) -> Result<Option<i64>, StoreError> {
        self.published_es(entity, uuid).await
    }

    async fn top_first_days(
        &self,
        q: &crate::store::FirstDaysQuery,
    ) -> Result<crate::store::FirstDaysList, StoreError> {
        self.top_first_days_es(q).await
    }

    async fn top_first_days_local(
        &self,
        q: &crate::store::LocalFirstDaysQuery,
    ) -> Result<crate::store::FirstDaysList, StoreError> {
        self.top_first_days_local_es(q).await
    }

    async fn countapi_records(
        &self,
        namespace: &str,
        key: &str,
    ) -> Result<crate::domain::countapi::Records, StoreError> {
        self.countapi_records_es(namespace, key).await
    }

    async fn countapi_create(
        &self,
        creation: crate::domain::countapi::Creation,
    ) -> Result<crate::domain::countapi::Created, StoreError> {
        self.countapi_create_es(creation).await
    }

    async fn countapi_page(
        &self,
        after: Option<(String, String)>,
        limit: usize,
    ) -> Result<Vec<crate::domain::countapi::KeyRecord>, StoreError> {
        self.countapi_page_es(after, limit).await
    }

    async fn countapi_restore(
        &self,
        records: Vec<crate::domain::countapi::KeyRecord>,
    ) -> Result<crate::domain::countapi::Restored, StoreError> {
        self.countapi_restore_es(records).await
    }

    async fn published_page(
        &self,
        after: Option<(String, String)>,
        limit: usize,
    ) -> Result<Vec<crate::store::TargetPublished>, StoreError> {
        self.published_page_es(after, limit).await
    }
}
