//! What a store answers for a trending list (see `crate::domain::trending`
//! for the score and the buckets it reads).

use crate::domain::trending::Plan;

/// The counters of a pair ordered by their time-decayed score: the sum of
/// each read bucket's count times `2^(-age / half_life)`, `age` from the
/// bucket's end to `now_ms` (0 for a bucket not yet ended). The buckets
/// are those of `plan`: day buckets of `plan.days`, hour buckets of
/// `plan.hours`, never both for one day.
///
/// A counter is listed when it has a bucket in the plan, even when its
/// score is 0 (as in a windowed [`super::TopQuery`]). Order: score
/// descending, then uuid ascending (bytewise).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrendingQuery {
    pub entity: String,
    pub action: String,
    pub category: Option<String>,
    /// 1..=1000, checked at the edge.
    pub size: usize,
    /// The instant scored for (the clock's now when the request came).
    pub now_ms: i64,
    pub half_life_ms: i64,
    pub plan: Plan,
}

impl TrendingQuery {
    /// The weight of each day of `plan.days`, oldest first.
    pub fn day_weights(&self) -> Vec<f64> {
        use crate::domain::trending::{day_end, weight};
        self.plan
            .days
            .clone()
            .map(|d| weight(day_end(d), self.now_ms, self.half_life_ms))
            .collect()
    }

    /// The weight of each hour of `plan.hours`, oldest first.
    pub fn hour_weights(&self) -> Vec<f64> {
        use crate::domain::trending::{hour_end, weight};
        self.plan
            .hours
            .clone()
            .map(|h| weight(hour_end(h), self.now_ms, self.half_life_ms))
            .collect()
    }

    /// The hours read as a (non-empty) [`crate::domain::HourRange`], for
    /// the exactness checks hour lists make; `None` when no hour is read.
    pub fn hour_range(&self) -> Option<crate::domain::HourRange> {
        (!self.plan.hours.is_empty()).then(|| crate::domain::HourRange {
            from_hour: self.plan.hours.start,
            to_hour: self.plan.hours.end - 1,
        })
    }
}

/// One row of a trending list.
#[derive(Clone, Debug, PartialEq)]
pub struct TrendingEntry {
    pub uuid: String,
    /// The unrounded score (a double: each bucket's count times its
    /// weight, summed).
    pub score: f64,
    pub category: Option<String>,
}

/// A trending list and whether it is exact: every counter's score reads
/// all its counts of the plan's buckets (`false` when a day inside the
/// hours read moved without an hour to put it in, a backfilled day, or
/// when an engine's aggregation may have missed a candidate).
#[derive(Clone, Debug, PartialEq)]
pub struct TrendingList {
    pub entries: Vec<TrendingEntry>,
    pub exact: bool,
}
