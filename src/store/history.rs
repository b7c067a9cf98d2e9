//! What `export` reads out of a store and `import` sets in one: whole
//! counters and averages with their day buckets, and the marks of actors
//! (once per actor). The file format around them is `crate::transfer`'s;
//! here is only what a store must answer and apply (the `Store` methods
//! `counter_page`, `average_page`, `mark_page` and `import`).

use crate::domain::{Counter, CounterKey, DaySet, Mark};

use super::{Bucket, HourBucket};

/// A counter with its day buckets from a given day on, in day order, and
/// its hour buckets from a later day on (the hourly retention's), in hour
/// order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CounterHistory {
    pub counter: Counter,
    pub days: Vec<Bucket>,
    pub hours: Vec<HourBucket>,
}

/// The hours an import sets with a counter's days: for every day of the
/// record from `from_day` on, its hour buckets are exactly these (an hour
/// not listed has none), and what the day holds beyond them is its rest,
/// as a backfilled day's (the exporting store's own rest, or a day whose
/// hours it did not keep). Days before `from_day`, or every day of a record
/// without hours (a file of version 4 or older), are set with their hours
/// unknown: hour answers over them say `exact: false`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImportHours {
    /// The first day whose hours the record gives (the hourly retention's
    /// first day where the import runs).
    pub from_day: i64,
    /// Distinct hours, in hour order, each of a day among the record's
    /// days, none before `from_day`.
    pub buckets: Vec<HourBucket>,
}

impl ImportHours {
    /// The hours of `day` (a contiguous run, the buckets being in order).
    pub fn of_day(&self, day: i64) -> &[HourBucket] {
        let start = self.buckets.partition_point(|h| h.hour < day * 24);
        let end = self.buckets.partition_point(|h| h.hour < (day + 1) * 24);
        &self.buckets[start..end]
    }

    /// Whether the hours of `day` are given (so set, rather than unknown).
    pub fn covers(&self, day: i64) -> bool {
        day >= self.from_day
    }
}

/// One day bucket of an average counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AverageBucket {
    /// UTC day, days since 1970-01-01.
    pub day: i64,
    pub sum: i64,
    pub quantity: i64,
}

/// An average counter (all time) with its day buckets from a given day on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AverageHistory {
    pub key: CounterKey,
    pub sum: i64,
    pub quantity: i64,
    pub category: Option<String>,
    pub first_ms: i64,
    pub recorded_ms: i64,
    pub days: Vec<AverageBucket>,
}

/// A counter as an import sets it.
///
/// The days named are set (replaced); the counter's other days are kept.
/// Its value becomes `before` plus the sum of its day buckets from
/// [`ImportBatch::oldest_day`] on, after the sets: the total follows the
/// buckets, and `before` is what lies before them (days the retention
/// deleted, or a total without history). Older buckets still in the store
/// (the retention has not deleted them yet) count in `before`, not here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CounterImport {
    pub key: CounterKey,
    /// `i128`: the days may sum past i64 in either direction while the
    /// total stays inside it.
    pub before: i128,
    /// Distinct days, none before `oldest_day`.
    pub days: Vec<Bucket>,
    /// Stored when given; absent keeps the counter's own.
    pub category: Option<String>,
    /// The earlier of this and the stored `first_timestamp` is kept.
    pub first_ms: i64,
    /// The later of this and the stored `recorded_timestamp` is kept.
    pub recorded_ms: i64,
    /// The hours of its days, when the record gives them (format 5).
    pub hours: Option<ImportHours>,
}

/// An average as an import sets it: as [`CounterImport`], for the sum and
/// the quantity of samples each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AverageImport {
    pub key: CounterKey,
    pub before_sum: i128,
    pub before_quantity: i128,
    pub days: Vec<AverageBucket>,
    pub category: Option<String>,
    pub first_ms: i64,
    pub recorded_ms: i64,
}

/// What a mark says of its actor, as far as counting goes. A mark that
/// says the actor does not count (on Elasticsearch, a mark document kept
/// `off` only for the event ids it remembers) is not exported: it is what
/// no mark at all means.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MarkState {
    /// The actor is counted: a like that stands, a view of that day.
    Counted,
    /// (Elasticsearch, likes only.) An unlike is being taken back: its
    /// decrement is on its way, or the flush sending it died at `since_ms`.
    /// Read as counted once the stale retraction's 10 minutes have passed
    /// (`elasticsearch/marks.rs`); the embedded store, which has no such
    /// state, keeps it as counted.
    Retracting { since_ms: i64 },
}

/// One actor's mark on one counter: the keyed hash of the actor (never the
/// actor), the counter, and its scope: for good (`day: None`, a like) or
/// for one UTC day (a view).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ActorMark {
    pub key: CounterKey,
    pub mark: Mark,
    /// `None`: an `ever` mark; else the UTC day (days since the epoch) of a
    /// `day` mark.
    pub day: Option<i64>,
    pub state: MarkState,
}

impl ActorMark {
    /// The first 16 bytes of SHA-256 of the counter's document id: the
    /// counter part of where both stores keep and order marks (the embedded
    /// store's `ckey`, Elasticsearch's `counter_hash`).
    pub fn counter_hash(key: &CounterKey) -> [u8; 16] {
        ActorMark::counter_hash_of_id(&key.doc_id())
    }

    /// [`ActorMark::counter_hash`] of a counter's document id.
    pub fn counter_hash_of_id(doc_id: &str) -> [u8; 16] {
        let d = ring::digest::digest(&ring::digest::SHA256, doc_id.as_bytes());
        let mut out = [0u8; 16];
        out.copy_from_slice(&d.as_ref()[..16]);
        out
    }

    /// Where this mark is in the order of `Store::mark_page`: `ever` marks
    /// first, by counter hash then mark; then `day` marks by day, counter
    /// hash and mark. Both stores list marks in this order, so their
    /// exports of the same marks are the same lines.
    pub fn order(&self) -> (Option<i64>, [u8; 16], [u8; 16]) {
        (self.day, ActorMark::counter_hash(&self.key), self.mark.0)
    }
}

/// One batch of an import, applied as a whole where the store can (one
/// transaction on the embedded store). No counter or average appears twice,
/// and no (counter, day) is both in a counter's days and among `days`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImportBatch {
    pub counters: Vec<CounterImport>,
    pub averages: Vec<AverageImport>,
    /// Single days set as a backfill sets them (`Store::set_days`): the
    /// counter moves by the difference.
    pub days: Vec<DaySet>,
    /// Marks set to their state (a mark not named is kept as it is). None
    /// twice; none of a day before `oldest_day`.
    pub marks: Vec<ActorMark>,
    /// The oldest day the retention keeps (days since the epoch).
    pub oldest_day: i64,
}

impl ImportBatch {
    pub fn is_empty(&self) -> bool {
        self.counters.is_empty()
            && self.averages.is_empty()
            && self.days.is_empty()
            && self.marks.is_empty()
    }
}

/// Which entry of an [`ImportBatch`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImportEntry {
    Counter(usize),
    Average(usize),
    Day(usize),
}

/// What became of an [`ImportBatch`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ImportOutcome {
    /// Everything set, durably.
    Applied,
    /// Nothing set: this entry would take its counter (or an average's sum
    /// or quantity) outside the signed 64-bit range.
    Overflow(ImportEntry),
}
