//! What a store keeps of targets' publication times and the top lists of
//! totals N days after publication (see `crate::domain::milestone`).

/// Sets (or, with `None`, clears) the publication time of one target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublishedSet {
    pub entity: String,
    pub uuid: String,
    /// Milliseconds since the epoch, already judged plausible; `None`: the
    /// target falls back to its first touch.
    pub at_ms: Option<i64>,
    /// `true` (an admin's `PUT`): replaces what is set. `false` (an
    /// event's `published`, which any write key may send): sets only a
    /// target that has none, so a public writer cannot move a publication.
    pub replace: bool,
}

/// A target's publication time as it is set: what `export` writes (a
/// `published` record) and `migrate` compares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetPublished {
    pub entity: String,
    pub uuid: String,
    /// Milliseconds since the epoch.
    pub at_ms: i64,
}

impl TargetPublished {
    /// Where the next page of [`super::Store::published_page`] starts.
    pub fn cursor(&self) -> (String, String) {
        (self.entity.clone(), self.uuid.clone())
    }
}

/// The counters of a pair ordered by their total over the first `days`
/// UTC days from their publication day (the set publication time, else
/// the counter's first touch).
///
/// A counter is listed when it has a bucket inside its own milestone
/// window, even when the sum is 0 (as in a windowed [`super::TopQuery`]).
/// Order: total descending, then uuid ascending (bytewise).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FirstDaysQuery {
    pub entity: String,
    pub action: String,
    /// 1..=retention, checked at the edge.
    pub days: u32,
    pub category: Option<String>,
    /// 1..=1000, checked at the edge.
    pub size: usize,
    /// The oldest day kept (the retention): buckets before it are not read.
    pub oldest_day: i64,
}

/// One row of a first-days list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FirstDaysEntry {
    pub uuid: String,
    /// The sum of the milestone's buckets; `i128` as in [`super::TopEntry`].
    pub value: i128,
    pub category: Option<String>,
    /// The publication time used (set, or the first touch), in ms.
    pub published_ms: i64,
    /// Whether it was set (`false`: the first touch).
    pub published_set: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FirstDaysList {
    pub entries: Vec<FirstDaysEntry>,
    pub exact: bool,
}
