//! Storage behind one trait, with an embedded (SQLite) and an Elasticsearch
//! implementation. The write pipeline hands a store whole flushes; the HTTP
//! layer reads through it. Both implementations pass the same conformance
//! scenarios (`tests/conformance`).
//!
#![doc = include_str!("README.md")]

pub mod elasticsearch;
pub mod empty;
pub mod history;
pub mod publication;
pub mod query;
pub mod ranked;
pub mod sqlite;
pub mod trending;

use std::collections::{HashMap, HashSet};

use async_trait::async_trait;

use crate::domain::{Counter, CounterKey, CounterSet, DaySet, Increment, Window};
pub use history::{
    ActorMark, AverageBucket, AverageHistory, AverageImport, CounterHistory, CounterImport,
    ImportBatch, ImportEntry, ImportHours, ImportOutcome, MarkState,
};
pub use publication::{
    FirstDaysEntry, FirstDaysList, FirstDaysQuery, PublishedSet, TargetPublished,
};
pub use query::{
    Average, AverageEntry, OutOfScaleAt, StaleQuery, TopAverages, TopAveragesQuery, TopEntry,
    TopList, TopQuery, UnusedPair, MAX_TOP_SIZE,
};
pub use trending::{TrendingEntry, TrendingList, TrendingQuery};

/// The increments of one flush, grouped by the request that sent them.
///
/// Requests stay separate (rather than pre-summed) because a store must drop
/// events whose idempotency id it has seen, and because a request whose
/// addition would overflow is refused on its own, not with its neighbours.
#[derive(Debug, Default)]
pub struct WriteBatch {
    pub requests: Vec<Vec<Increment>>,
    /// The counters whose state after the flush a request asked for (a
    /// single increment answers with its counter; batches ask for none).
    /// Only these are read back into [`BatchOutcome::counters`].
    pub wanted: HashSet<CounterKey>,
}

/// What happened to one request of a batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestOutcome {
    /// Durably applied; `duplicates` events were skipped as already counted.
    Applied { duplicates: u32 },
    /// Refused whole: applying it would take `key` outside the signed 64-bit range.
    Overflow { key: CounterKey },
    /// Not applied in full; the store gave up on it (unreachable, rejected).
    /// A store without multi-document transactions (Elasticsearch) may have
    /// applied part of it; event ids make the client's retry exact.
    Failed { reason: String },
}

/// The result of applying a batch: one outcome per request, in order, and the
/// state after the flush of the counters the batch wanted.
#[derive(Debug, Default)]
pub struct BatchOutcome {
    pub requests: Vec<RequestOutcome>,
    /// Of [`WriteBatch::wanted`], those applied (a store may leave out one
    /// whose state it could not read back; the request still succeeded).
    pub counters: HashMap<CounterKey, Counter>,
    /// Store operations sent (rows upserted, bulk items): for metrics and benchmarks.
    pub store_writes: usize,
    /// Per request, by index, the events of an `Applied` request left out
    /// because `unique` said their actor was counted already (or, for an
    /// unlike, had nothing to take back): counted apart from `duplicates`
    /// (ids seen before). Shorter than `requests` (or empty) where a store
    /// had none to report; a missing entry is 0.
    pub repeats: Vec<u32>,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store cannot be reached or is not answering; worth retrying later.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// Anything else: a bug, a corrupt database, a full disk.
    #[error("store error: {0}")]
    Internal(String),
    /// The store acknowledges nothing more until the gateway restarts (an
    /// fsync failed: the kernel may have dropped the written pages and
    /// report the next fsync as fine). The message is meant for clients.
    #[error("{0}")]
    Halted(String),
    /// SQLite failed in `op` (the embedded store's function that ran the
    /// statement). rusqlite's error is kept whole as the source, and its
    /// result code sorted into `kind`, so that a busy, full, read-only or
    /// corrupt database is told apart in the log, `/metrics` and the
    /// answer's `type`.
    #[error("sqlite failed in {op} ({}): {source}", kind.as_str())]
    Sqlite {
        op: &'static str,
        kind: StoreErrorKind,
        #[source]
        source: rusqlite::Error,
    },
}

impl StoreError {
    /// What kind of failure this is.
    pub fn kind(&self) -> StoreErrorKind {
        match self {
            StoreError::Unavailable(_) => StoreErrorKind::Unavailable,
            StoreError::Internal(_) => StoreErrorKind::Other,
            StoreError::Halted(_) => StoreErrorKind::Halted,
            StoreError::Sqlite { kind, .. } => *kind,
        }
    }
}

/// The kinds of store failure that a client, an operator or an alert
/// handles differently: the answer's `type` and status
/// (`src/api/README.md`, "Limits") and the `kind` label of
/// `counter_gateway_store_errors_total` are made from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreErrorKind {
    /// The database is locked by another connection past the busy timeout:
    /// passes by itself.
    Busy,
    /// The disk (or the database's page limit) is full.
    Full,
    /// The database cannot be written (a read-only file or mount).
    ReadOnly,
    /// The database file is damaged, or is no SQLite database.
    Corrupt,
    /// The store does not answer (a cluster down or unreachable).
    Unavailable,
    /// The store stopped acknowledging writes after a failed fsync.
    Halted,
    /// Anything else: a bug, an I/O error of another kind.
    Other,
}

impl StoreErrorKind {
    pub const ALL: [StoreErrorKind; 7] = [
        StoreErrorKind::Busy,
        StoreErrorKind::Full,
        StoreErrorKind::ReadOnly,
        StoreErrorKind::Corrupt,
        StoreErrorKind::Unavailable,
        StoreErrorKind::Halted,
        StoreErrorKind::Other,
    ];

    /// The label value in `/metrics` and the log.
    pub fn as_str(self) -> &'static str {
        match self {
            StoreErrorKind::Busy => "busy",
            StoreErrorKind::Full => "full",
            StoreErrorKind::ReadOnly => "read_only",
            StoreErrorKind::Corrupt => "corrupt",
            StoreErrorKind::Unavailable => "unavailable",
            StoreErrorKind::Halted => "halted",
            StoreErrorKind::Other => "other",
        }
    }
}

/// Why an embedded store halted, as clients and `/readyz` are told.
pub const HALTED_AFTER_FSYNC: &str = "the store stopped acknowledging writes after an fsync of its write-ahead log failed (the disk may have dropped written data); restart the gateway once the disk is healthy";

/// A store's writes as plain blocking calls, for a store whose writes are
/// local (the embedded store): the pipeline then applies and syncs on
/// blocking threads of its own for as long as it is busy, instead of a
/// task and a thread hand-off per flush and per fsync. Same contract as
/// [`Store::apply`] and [`Store::sync`].
pub trait BlockingWrites: Send + Sync + 'static {
    fn apply(&self, batch: WriteBatch) -> Result<BatchOutcome, StoreError>;
    /// The work a flush leaves that its answer need not wait for (the
    /// embedded store folds a chunk of its change log, writes window totals
    /// back). The pipeline calls it once the flush is handed to the syncer,
    /// so it overlaps the fsync instead of delaying the answer. Infallible:
    /// what fails is logged and retried later. No default: a wrapper that
    /// forgot to forward it would leave that work undone, and the store's
    /// memory unbounded.
    fn after_apply(&self);
    fn sync(&self) -> Result<(), StoreError>;
}

#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Applies a batch. When it returns, every `Applied` request is visible
    /// to reads, and durable once a [`Store::sync`] started after it returns.
    async fn apply(&self, batch: WriteBatch) -> Result<BatchOutcome, StoreError>;
    /// Makes every batch applied so far durable. Split from `apply` so the
    /// pipeline can write the next batch while this one reaches the disk; a
    /// store whose `apply` is already durable (Elasticsearch) says so in a
    /// no-op of its own. No default: a wrapper that forgot to forward it
    /// would silently drop durability.
    async fn sync(&self) -> Result<(), StoreError>;
    /// The same writes as blocking calls, if this store has them. A store
    /// without (Elasticsearch, a wrapper) is written through `apply` and
    /// `sync` above: nothing is skipped, only the threads differ, hence a
    /// default.
    fn blocking_writes(&self) -> Option<std::sync::Arc<dyn BlockingWrites>> {
        None
    }
    /// How many of [`Store::apply`]'s calls the pipeline may run at once,
    /// never with a counter in two of them. One unless the store gains from
    /// more (Elasticsearch: a bulk on the counters' one shard runs on one
    /// write thread, so a second bulk uses the node's other cores, and
    /// overlaps the first's round trip and translog sync). A store with
    /// [`Store::blocking_writes`] is written one flush at a time whatever
    /// this says. A default: one at a time is always correct.
    fn bulks_in_flight(&self) -> usize {
        1
    }
    /// One counter, or `None` if it was never counted (or was deleted).
    async fn get(&self, key: &CounterKey) -> Result<Option<Counter>, StoreError>;
    /// Every counter of one target (entity + uuid), ordered by action.
    async fn target_counters(&self, entity: &str, uuid: &str) -> Result<Vec<Counter>, StoreError>;
    /// Removes a counter and all its histogram buckets; `false` if there was none.
    async fn delete(&self, key: &CounterKey) -> Result<bool, StoreError>;
    /// Whether the store answers right now (`/readyz`).
    async fn ready(&self) -> Result<(), StoreError>;

    /// The day buckets of one counter inside `window`, by day; `None` if the
    /// counter does not exist.
    async fn histogram(
        &self,
        key: &CounterKey,
        window: Window,
    ) -> Result<Option<Vec<Bucket>>, StoreError>;

    /// The highest counters; see [`TopQuery`] for the order.
    async fn top(&self, query: &TopQuery) -> Result<TopList, StoreError>;

    /// The hour buckets of one counter inside `hours`, by hour (see
    /// `crate::domain::hours`); `None` if the counter does not exist. The
    /// caller has kept `hours` inside the hourly retention. A default that
    /// refuses: a store (or a wrapper) without hour buckets says so rather
    /// than answering that there are none.
    async fn hour_histogram(
        &self,
        _key: &CounterKey,
        _hours: crate::domain::HourRange,
    ) -> Result<Option<HourHistogram>, StoreError> {
        Err(StoreError::Internal(NO_HOURS.into()))
    }

    /// The highest sums of hour buckets; see [`TopHoursQuery`]. A default
    /// that refuses, as [`Store::hour_histogram`].
    async fn top_hours(&self, _query: &TopHoursQuery) -> Result<TopList, StoreError> {
        Err(StoreError::Internal(NO_HOURS.into()))
    }

    /// The counters with the highest totals over their first local days
    /// from publication, summed from hour buckets; see
    /// [`LocalFirstDaysQuery`]. A default that refuses, as
    /// [`Store::hour_histogram`].
    async fn top_first_days_local(
        &self,
        _query: &LocalFirstDaysQuery,
    ) -> Result<FirstDaysList, StoreError> {
        Err(StoreError::Internal(NO_HOURS.into()))
    }

    /// The counters of a pair by their time-decayed score; see
    /// [`TrendingQuery`]. A default that refuses, as [`Store::top_hours`].
    async fn trending(&self, _query: &TrendingQuery) -> Result<TrendingList, StoreError> {
        Err(StoreError::Internal(NO_HOURS.into()))
    }

    /// Counters untouched since a cut-off, oldest first, one page.
    async fn stale(&self, query: &StaleQuery) -> Result<Vec<Counter>, StoreError>;

    /// Entity/action pairs none of whose counters was touched since `before_ms`.
    async fn unused(&self, before_ms: i64) -> Result<Vec<UnusedPair>, StoreError>;

    /// One average counter, all time or inside `window`; `None` if it never
    /// had a sample (or was deleted).
    async fn average(
        &self,
        key: &CounterKey,
        window: Option<Window>,
    ) -> Result<Option<Average>, StoreError>;

    /// The highest averages; see [`TopAveragesQuery`] for the order.
    async fn top_averages(&self, query: &TopAveragesQuery) -> Result<TopAverages, StoreError>;

    /// The counters of `keys`, one answer per key in the same order (`None`:
    /// never counted), in one read: one snapshot on the embedded store, one
    /// realtime `_mget` on Elasticsearch (so, like [`Store::get`], it sees
    /// every acknowledged write). A key given twice is answered twice.
    async fn get_many(&self, keys: &[CounterKey]) -> Result<Vec<Option<Counter>>, StoreError>;
    /// Backfill: sets each day bucket of `sets` to its value and moves its
    /// counter by the difference (new - old), creating the counter when it
    /// does not exist; see [`DaysOutcome`] for what is applied when. The
    /// caller has validated the days and left no (counter, day) twice.
    /// Durable when it returns `Applied` (the embedded store syncs itself:
    /// a set does not ride the write pipeline, it takes the writer between
    /// two flushes, so an increment acknowledged before it is in the bucket
    /// it replaces and counted exactly once).
    /// `oldest_day` is the oldest day the caller accepts (the retention):
    /// what a store remembers about older days may go.
    async fn set_days(&self, sets: Vec<DaySet>, oldest_day: i64)
        -> Result<DaysOutcome, StoreError>;
    /// Sets a counter's all-time value (see [`CounterSet`]), creating it
    /// when it does not exist, and answers the counter after the set.
    /// Buckets are left alone, so windowed lists and histograms do not
    /// change; increments applied after it add to the value. Setting the
    /// same value again changes nothing. Durable when it returns (the
    /// embedded store takes the writer between two flushes and syncs, as
    /// [`Store::set_days`] does; Elasticsearch writes the document once,
    /// atomically on its shard).
    async fn set_value(&self, set: CounterSet) -> Result<Counter, StoreError>;

    /// Export: up to `limit` counters after `after` (exclusive) in key order
    /// (entity, action, uuid, each bytewise), each with its day buckets from
    /// `from_day` on and its hour buckets of the days from `hours_from_day`
    /// on. Every store answers the same order, so two stores'
    /// exports of the same data are the same file. Each page is read from
    /// one snapshot where the store has them (embedded); on Elasticsearch
    /// the first page refreshes the tenant's indices, and pages are searches.
    async fn counter_page(
        &self,
        after: Option<CounterKey>,
        limit: usize,
        from_day: i64,
        hours_from_day: i64,
    ) -> Result<Vec<CounterHistory>, StoreError>;
    /// [`Store::counter_page`] for average counters.
    async fn average_page(
        &self,
        after: Option<CounterKey>,
        limit: usize,
        from_day: i64,
    ) -> Result<Vec<AverageHistory>, StoreError>;
    /// Export: up to `limit` marks of actors after `after` (exclusive), in
    /// the order of [`ActorMark::order`] (`ever` marks, then `day` marks
    /// from `from_day` on), whose state counts the actor (see
    /// [`MarkState`]). A page shorter than `limit` is the last. Each page
    /// is read from one snapshot on the embedded store; on Elasticsearch
    /// the first page refreshes the tenant's indices.
    async fn mark_page(
        &self,
        after: Option<ActorMark>,
        limit: usize,
        from_day: i64,
    ) -> Result<Vec<ActorMark>, StoreError>;
    /// Import: sets what the batch names (see [`CounterImport`]), durably
    /// when it returns `Applied`; nothing of it on `Overflow`. Setting the
    /// same batch again leaves the same state, so a batch whose outcome is
    /// unknown (an error) is simply applied again.
    async fn import(&self, batch: ImportBatch) -> Result<ImportOutcome, StoreError>;
    /// Brings the store's actor marks to the keying of `key`'s tenant
    /// (see `crate::domain::actor`), before the gateway writes through it:
    /// once (recorded), all or nothing; returns how many marks it rekeyed.
    /// A store whose marks cannot be (keyed for another tenant; on
    /// Elasticsearch, marks of the first keying) refuses, saying why.
    /// Elasticsearch only checks here: it records the keying with the
    /// tenant's first mark, so that a tenant without any gets no index.
    async fn key_marks(&self, _key: &crate::domain::ActorKey) -> Result<u64, StoreError> {
        Ok(0)
    }
    /// Which keying the store's marks have (`export` writes it).
    async fn mark_keying(&self) -> Result<MarkKeying, StoreError> {
        Ok(MarkKeying::Unbound)
    }

    /// Publication times (see `crate::domain::milestone`): sets or clears
    /// each target's, in order (see [`PublishedSet::replace`]: an event's
    /// set keeps what is there), durably when it returns. Setting the same
    /// again changes nothing.
    async fn set_published(&self, sets: Vec<PublishedSet>) -> Result<(), StoreError>;
    /// The publication time set for a target, in ms; `None` when none is
    /// (the first touch of each of its counters stands in).
    async fn published(&self, entity: &str, uuid: &str) -> Result<Option<i64>, StoreError>;
    /// The counters with the highest totals over their first days from
    /// publication; see [`FirstDaysQuery`].
    async fn top_first_days(&self, query: &FirstDaysQuery) -> Result<FirstDaysList, StoreError>;
    /// CountAPI: what `create` recorded of `namespace` and of its `key`
    /// (`crate::domain::countapi`), read as every acknowledged create left
    /// it. A default that refuses: a store (or a wrapper) that keeps none
    /// says so rather than answering that there are none.
    async fn countapi_records(
        &self,
        _namespace: &str,
        _key: &str,
    ) -> Result<crate::domain::countapi::Records, StoreError> {
        Err(StoreError::Internal(NO_COUNTAPI.into()))
    }
    /// CountAPI: records a key and, when it has none, its namespace, at
    /// once or not at all where the store can (see the implementations),
    /// durably when it answers `Made`.
    async fn countapi_create(
        &self,
        _creation: crate::domain::countapi::Creation,
    ) -> Result<crate::domain::countapi::Created, StoreError> {
        Err(StoreError::Internal(NO_COUNTAPI.into()))
    }
    /// Export: up to `limit` keys made by CountAPI's `create`, after
    /// `after` (namespace, key; exclusive), in that order bytewise, each
    /// with its namespace's record. A default that refuses, as the other
    /// CountAPI calls do: an export through a store that keeps none fails
    /// rather than leaving the records out.
    async fn countapi_page(
        &self,
        _after: Option<(String, String)>,
        _limit: usize,
    ) -> Result<Vec<crate::domain::countapi::KeyRecord>, StoreError> {
        Err(StoreError::Internal(NO_COUNTAPI.into()))
    }
    /// Import: sets `records` (see [`crate::domain::countapi::Restored`]),
    /// durably when it answers `Applied`; past a bound, nothing.
    async fn countapi_restore(
        &self,
        _records: Vec<crate::domain::countapi::KeyRecord>,
    ) -> Result<crate::domain::countapi::Restored, StoreError> {
        Err(StoreError::Internal(NO_COUNTAPI.into()))
    }
    /// Export: up to `limit` publication times set, of the targets after
    /// `after` (entity, uuid; exclusive), in (entity, uuid) order, each
    /// bytewise, as [`Store::counter_page`] orders keys: two stores'
    /// exports of the same data are the same file. A page shorter than
    /// `limit` is the last. On Elasticsearch the first page refreshes the
    /// targets' index. No default: a wrapper that forgot to forward it
    /// would export and migrate no publication time, silently.
    async fn published_page(
        &self,
        after: Option<(String, String)>,
        limit: usize,
    ) -> Result<Vec<TargetPublished>, StoreError>;
}

/// Why a store without hour buckets refuses their calls.
const NO_HOURS: &str = "this store keeps no hour buckets";

/// Why a store without CountAPI records refuses their calls.
const NO_COUNTAPI: &str = "this store keeps no CountAPI records";

/// Which keying a store's actor marks have (see `crate::domain::actor`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MarkKeying {
    /// The first keying, without the tenant (an earlier version's marks):
    /// to be brought to the tenant with `ActorKey::rekey`.
    Untenanted,
    /// No mark predates the tenant's keying: the store's marks are of the
    /// tenant it serves.
    Unbound,
    /// Keyed for this tenant.
    Tenant(String),
}

/// What became of a [`Store::set_days`].
#[derive(Debug, PartialEq, Eq)]
pub enum DaysOutcome {
    /// Every set applied, durably. Per set, the bucket's value before it
    /// (0 when there was none); and the counters after the last set of each.
    Applied {
        previous: Vec<i64>,
        counters: HashMap<CounterKey, Counter>,
    },
    /// Nothing applied: the sets would take the counter of `sets[index]`
    /// outside the signed 64-bit range.
    Overflow { index: usize },
    /// (A store without multi-document transactions.) The sets before
    /// `done` are applied, the ones after it are not; with `half_set`,
    /// `sets[done]` may be half applied (its bucket set, its counter not yet
    /// moved), without, nothing of it is. Setting the same values again
    /// completes them exactly.
    Incomplete {
        done: usize,
        half_set: bool,
        reason: String,
    },
}

/// One hour bucket of a counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HourBucket {
    /// UTC hour, hours since 1970-01-01T00:00Z.
    pub hour: i64,
    pub value: i64,
}

/// A counter's hour buckets in a range, and whether they are its whole
/// history there: `false` when a day of the range was moved without an
/// hour to put it in (a backfilled day, hours the store did not keep yet),
/// so the hours of that day do not sum to its day bucket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HourHistogram {
    pub buckets: Vec<HourBucket>,
    pub exact: bool,
}

/// The counters of a pair with the highest sum of their hour buckets in
/// `hours` (`last_hour`, `last_24_hours`); order and ties as [`TopQuery`].
/// `exact` of the answer is `false` as for [`HourHistogram`], when some
/// day of the range was moved without its hours.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopHoursQuery {
    pub entity: String,
    pub action: String,
    pub hours: crate::domain::HourRange,
    pub category: Option<String>,
    pub size: usize,
}

/// [`FirstDaysQuery`] in a zone's days (`tz=`): each counter's total over
/// the UTC hours of its first `days` local days from the local day of its
/// publication (`Zone::first_days_hours`), from hour buckets. Only
/// counters whose first local day starts at or after `first_hour` (the
/// hourly retention) are listed: the hours of older ones are gone. Listed
/// when it has an hour bucket in its hours, even if they sum to 0; order
/// and ties as [`FirstDaysQuery`]. `exact` as [`HourHistogram`]'s, for the
/// counters looked at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalFirstDaysQuery {
    pub entity: String,
    pub action: String,
    pub days: u32,
    pub category: Option<String>,
    pub size: usize,
    pub zone: crate::domain::zone::Zone,
    pub first_hour: i64,
}

/// Keeps the best `size` entries of a first-days list: value descending,
/// then uuid ascending (bytewise), the lists' order.
pub fn keep_best(entries: &mut Vec<FirstDaysEntry>, size: usize) {
    entries.sort_by(|a, b| {
        b.value
            .cmp(&a.value)
            .then_with(|| a.uuid.as_bytes().cmp(b.uuid.as_bytes()))
    });
    entries.truncate(size);
}

/// One day bucket of a counter's histogram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bucket {
    /// UTC day, days since 1970-01-01.
    pub day: i64,
    pub value: i64,
}
