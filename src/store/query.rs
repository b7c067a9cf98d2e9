//! The typed read queries a store answers (histograms, top lists, averages,
//! reports) and their results. They are resolved at the edge (windows in
//! whole UTC days, cut-offs in milliseconds) so that each store only maps
//! them to its own query language: SQL here, aggregations on Elasticsearch.

use crate::domain::rank::Rank;
use crate::domain::{CounterKey, Window};

/// Largest `size` of a top list: what a store answers in one page.
pub const MAX_TOP_SIZE: usize = 1000;

/// The counters with the highest value (all time) or the highest sum of
/// their day buckets inside `window`.
///
/// Order: value descending, then uuid ascending (bytewise), so ties come out
/// the same on every store and every call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopQuery {
    pub entity: String,
    pub action: String,
    /// `None`: all time, from the counters themselves.
    pub window: Option<Window>,
    /// Only counters carrying this category.
    pub category: Option<String>,
    /// 1..=1000, checked at the edge.
    pub size: usize,
}

/// One row of a top list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopEntry {
    pub uuid: String,
    /// The counter's value, or its sum inside the window: `i128` because
    /// the sum of several days' buckets, each within `i64`, may leave it.
    pub value: i128,
    pub category: Option<String>,
}

/// A top list and whether it is exact (not an approximation from sampled or
/// per-shard partial aggregations).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopList {
    pub entries: Vec<TopEntry>,
    pub exact: bool,
}

/// Counters untouched since `before_ms`, oldest first.
///
/// Order: `recorded_ms` ascending, then entity, action, uuid ascending
/// (bytewise); `after` is the last row of the previous page, exclusive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StaleQuery {
    pub entity: Option<String>,
    pub action: Option<String>,
    /// Counters whose `recorded_ms` is strictly below this are stale.
    pub before_ms: i64,
    pub after: Option<(i64, CounterKey)>,
    pub limit: usize,
}

/// An entity/action pair and its latest touch over all its counters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnusedPair {
    pub entity: String,
    pub action: String,
    pub last_ms: i64,
    /// Sum of the values of its counters; `i128` because it may leave `i64`.
    pub total: i128,
    pub counters: u64,
}

/// An average counter: a sum of samples and how many there are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Average {
    pub key: CounterKey,
    /// All time (within `i64`, as writes keep it), or inside the window
    /// asked for, where the sum of several days may leave `i64`.
    pub sum: i128,
    pub quantity: i128,
    pub category: Option<String>,
    pub first_ms: i64,
    pub recorded_ms: i64,
}

/// The average counters with the highest average (or the highest score of
/// a confidence-adjusted `rank`), over all time or inside a window, among
/// those with at least `min_quantity` samples there.
///
/// Order, by average ([`Rank::Average`]): average descending, then quantity
/// descending, then uuid ascending. By another rank: its score descending,
/// then quantity descending, then uuid ascending (bytewise). The scores of
/// [`Rank::Bayesian`] need `C`, the mean of the averages of every target the
/// list considers (the pair, the window, the category, `min_quantity`), so
/// a store reads them all, in uuid order (see
/// [`crate::domain::rank::MeanOfAverages`]), and keeps the best `size`.
#[derive(Clone, Debug, PartialEq)]
pub struct TopAveragesQuery {
    pub entity: String,
    pub action: String,
    pub window: Option<Window>,
    pub category: Option<String>,
    /// At least 1, so an average is always defined.
    pub min_quantity: i64,
    pub size: usize,
    pub rank: Rank,
}

#[derive(Clone, Debug, PartialEq)]
pub struct AverageEntry {
    pub uuid: String,
    /// `i128` as in [`Average`].
    pub sum: i128,
    pub quantity: i128,
    pub category: Option<String>,
    /// The score of the query's rank; `None` when ranked by average.
    pub score: Option<f64>,
}

/// A target whose average lies outside the `scale` of a Wilson rank: the
/// first in uuid order, so both stores name the same one.
#[derive(Clone, Debug, PartialEq)]
pub struct OutOfScaleAt {
    pub uuid: String,
    pub average: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct TopAverages {
    pub entries: Vec<AverageEntry>,
    pub exact: bool,
    /// `C` of a Bayesian rank; `None` otherwise, or without any average.
    pub prior_mean: Option<f64>,
    /// A Wilson rank met an average outside its scale: no list, the
    /// request is refused naming this target.
    pub out_of_scale: Option<OutOfScaleAt>,
}

impl TopAverages {
    /// A list ranked by average (no prior, nothing out of scale).
    pub fn by_average(entries: Vec<AverageEntry>, exact: bool) -> Self {
        TopAverages {
            entries,
            exact,
            prior_mean: None,
            out_of_scale: None,
        }
    }
}
