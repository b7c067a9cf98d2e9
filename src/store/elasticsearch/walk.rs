//! Exact top lists over several monthly indices: a threshold walk.
//!
//! A windowed list (or a trending list) sums each counter's bucket
//! documents. Buckets are routed by counter id, so inside one monthly index
//! every counter's documents lie on one shard, each shard's sums are
//! complete, and a `terms` aggregation of `size` terms gives that index's
//! exact top `size`. Across indices a counter's sum is split, and one
//! `terms` aggregation over all of them is exact only when nothing was left
//! out (`sum_other_doc_count` 0), which at a million counters it never is.
//!
//! So the walk (Fagin's threshold algorithm, with sorted access per index):
//! 1. read the top `k` of each index alone (exact, as above);
//! 2. sum every counter seen in any of them over all the indices with one
//!    `terms` aggregation restricted to their uuids (exact: it returns every
//!    term it matched);
//! 3. a counter seen nowhere has, in each index whose list was cut, at most
//!    that list's last sum (or nothing, 0), and nothing in an index whose
//!    list was whole; so its total is at most `T = Σ max(last_i, 0)` over
//!    the cut lists. When the `size`-th best summed counter is above `T`,
//!    no unseen counter can enter the list, nor tie with its last entry:
//!    the list is exact. Otherwise `k` grows and the walk goes again, up to
//!    [`WINDOW_CANDIDATES`] terms per index (fewer over many months, see
//!    [`MAX_SEEN`]), where it answers its best list and says it is not
//!    exact.
//!
//! The cost: one search per index and one over the candidates per round;
//! on the usual data (a few counters far ahead of a long tail) the first
//! round ends it. The searches are sequential (a window spans two or three
//! monthly indices); each sees the indices as of its refresh, as every
//! windowed list does, so writes during a list may count in one step and
//! not another, as they may across the shards of one search.

use serde_json::Value;

use super::query::{CategoryFilter, WINDOW_CANDIDATES};
use super::ElasticsearchStore;
use crate::store::StoreError;

/// Terms asked of each index in the first round, at least; later rounds ask
/// [`GROWTH`] times more.
const FIRST_ROUND: usize = 64;
const GROWTH: usize = 8;

/// Most counters one round may see over all its indices: the candidates'
/// search filters on their uuids and answers a term each, and the engines
/// refuse a `terms` query of more than 65,536 values
/// (`index.max_terms_count`) and an answer of more than 65,535 buckets
/// (`search.max_buckets`). A window over many months asks fewer terms of
/// each index.
const MAX_SEEN: usize = 40_000;

/// A sum the walk compares: counts (`i128`, exact) or trending scores
/// (`f64`, compared with a margin for the rounding of sums taken in
/// different orders).
pub(super) trait Total: Copy + PartialOrd + Default {
    /// `self + max(x, 0)`.
    fn plus_positive(self, x: Self) -> Self;
    /// Whether a listed total of `self` is surely above any total bounded
    /// by `bound`.
    fn above(self, bound: Self) -> bool;
}

impl Total for i128 {
    fn plus_positive(self, x: i128) -> i128 {
        self + x.max(0)
    }
    fn above(self, bound: i128) -> bool {
        self > bound
    }
}

impl Total for f64 {
    fn plus_positive(self, x: f64) -> f64 {
        self + x.max(0.0)
    }
    fn above(self, bound: f64) -> bool {
        // Sums of the same doubles in another order differ in their last
        // bits; a relative margin of 1e-9 is far above that and far below
        // the 9 significant digits the API writes.
        self > bound + bound.abs() * 1e-9
    }
}

/// One `terms` answer: `(uuid, total)` best first, and the documents of
/// the terms left out.
pub(super) struct Terms<S> {
    pub entries: Vec<(String, S)>,
    pub other: u64,
}

/// What the walk found: the best `(uuid, total)`, best first (up to every
/// candidate; the caller takes its size), and whether it is the exact list.
pub(super) struct Walked<S> {
    pub entries: Vec<(String, S)>,
    pub exact: bool,
}

/// Whether a search path names single indices that a walk can read one by
/// one: more than one, and no pattern.
pub(super) fn walkable(path: &str) -> Option<Vec<&str>> {
    let parts: Vec<&str> = path.split(',').filter(|p| !p.is_empty()).collect();
    (parts.len() > 1 && !parts.iter().any(|p| p.contains('*'))).then_some(parts)
}

/// The best counts of a windowed list, read by [`ElasticsearchStore::window_counts`].
pub(super) struct Counts {
    /// `(uuid, sum)`, best first; at least the list's size when there are
    /// that many.
    pub entries: Vec<(String, i128)>,
    /// No counter outside `entries` belongs in the list (as far as the sums
    /// go: the caller adds what else it knows, such as the category).
    pub complete: bool,
    /// Every sum fitted a double exactly.
    pub sums_exact: bool,
}

impl Counts {
    /// Whether the list is exact: complete, every sum fitted a double, and
    /// the category was the counters' own, not the buckets' fallback.
    pub fn exact(&self, cat: &CategoryFilter) -> bool {
        self.complete && self.sums_exact && !matches!(cat, CategoryFilter::BucketCategory(_))
    }
}

/// Terms a walk for a list of `size` over `indices` indices asks of each
/// index in its first round, and at most.
fn terms_per_index(size: usize, indices: usize) -> (usize, usize) {
    let most = (MAX_SEEN / indices.max(1)).min(WINDOW_CANDIDATES).max(size);
    (size.saturating_mul(4).max(FIRST_ROUND).min(most), most)
}

impl ElasticsearchStore {
    /// The best sums of a windowed list of `size` over the indices `path`:
    /// one search when they are one monthly index or a pattern (exact for
    /// one index; for a pattern, when nothing was left out), else the walk.
    /// `body(terms, only)` as for [`Self::walk_indices`].
    pub(super) async fn window_counts(
        &self,
        path: &str,
        one_month: bool,
        size: usize,
        body: impl Fn(usize, Option<&[String]>) -> Value,
    ) -> Result<Counts, StoreError> {
        let parts = walkable(path).filter(|_| !one_month);
        let Some(parts) = parts else {
            let terms = super::query::one_search_terms(size, one_month);
            let answer = self
                .search(&format!("/{path}/_search"), &[], &body(terms, None))
                .await?;
            let top = super::query::window_top_from_aggs(&answer).map_err(StoreError::Internal)?;
            return Ok(Counts {
                complete: one_month || top.sum_other_doc_count == 0,
                sums_exact: top.sums_exact,
                entries: top.entries,
            });
        };
        let sums_exact = std::sync::atomic::AtomicBool::new(true);
        let walked = self
            .walk_indices(&parts, size, body, |answer| {
                let top = super::query::window_top_from_aggs(answer)?;
                if !top.sums_exact {
                    sums_exact.store(false, std::sync::atomic::Ordering::Relaxed);
                }
                Ok(Terms {
                    entries: top.entries,
                    other: top.sum_other_doc_count,
                })
            })
            .await?;
        Ok(Counts {
            entries: walked.entries,
            complete: walked.exact,
            sums_exact: sums_exact.into_inner(),
        })
    }

    /// The walk over `indices` for a list of `size`. `body(terms, only)` is
    /// the search: a `terms` aggregation on uuid of `terms` terms ordered by
    /// the total descending then the uuid, restricted to the uuids `only`
    /// when given; `parse` reads its answer.
    pub(super) async fn walk_indices<S: Total>(
        &self,
        indices: &[&str],
        size: usize,
        body: impl Fn(usize, Option<&[String]>) -> Value,
        parse: impl Fn(&Value) -> Result<Terms<S>, String>,
    ) -> Result<Walked<S>, StoreError> {
        let all = indices.join(",");
        let (mut k, most) = terms_per_index(size, indices.len());
        loop {
            let mut seen: Vec<String> = Vec::new();
            let mut known = std::collections::HashSet::new();
            let mut bound = S::default();
            let mut whole = true;
            for index in indices {
                let answer = self
                    .search(&format!("/{index}/_search"), &[], &body(k, None))
                    .await?;
                let top = parse(&answer).map_err(StoreError::Internal)?;
                if top.other > 0 {
                    whole = false;
                    if let Some((_, last)) = top.entries.last() {
                        bound = bound.plus_positive(*last);
                    }
                }
                for (uuid, _) in top.entries {
                    if known.insert(uuid.clone()) {
                        seen.push(uuid);
                    }
                }
            }
            if seen.is_empty() {
                return Ok(Walked {
                    entries: Vec::new(),
                    exact: whole,
                });
            }
            let answer = self
                .search(
                    &format!("/{all}/_search"),
                    &[],
                    &body(seen.len(), Some(&seen)),
                )
                .await?;
            let summed = parse(&answer).map_err(StoreError::Internal)?;
            let settled = summed.other == 0
                && (whole
                    || summed
                        .entries
                        .get(size.saturating_sub(1))
                        .is_some_and(|(_, last)| size > 0 && last.above(bound)));
            if settled || k >= most {
                return Ok(Walked {
                    entries: summed.entries,
                    exact: settled,
                });
            }
            k = k.saturating_mul(GROWTH).min(most);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_lists_of_several_named_indices_are_walked() {
        assert_eq!(
            walkable("a-2026-11,a-2026-12"),
            Some(vec!["a-2026-11", "a-2026-12"])
        );
        assert_eq!(walkable("a-2026-12"), None);
        assert_eq!(walkable("a-*"), None);
        assert_eq!(walkable("a-2026-11,h-*"), None);
    }

    #[test]
    fn a_list_is_exact_when_complete_with_exact_sums_and_the_counters_categories() {
        let counts = |complete, sums_exact| Counts {
            entries: Vec::new(),
            complete,
            sums_exact,
        };
        let none = CategoryFilter::None;
        assert!(counts(true, true).exact(&none));
        assert!(!counts(false, true).exact(&none));
        assert!(!counts(true, false).exact(&none));
        let fallback = CategoryFilter::BucketCategory("sports".into());
        assert!(!counts(true, true).exact(&fallback));
        assert!(counts(true, true).exact(&CategoryFilter::Uuids(vec!["a".into()])));
    }

    #[test]
    fn rounds_stay_within_what_the_engines_answer() {
        // Two months: 64 terms first, up to 10,000 each.
        assert_eq!(terms_per_index(10, 2), (64, 10_000));
        assert_eq!(terms_per_index(100, 2), (400, 10_000));
        // Fourteen months (a from/to window over the retention): at most
        // 40,000 counters seen in all, under the engines' 65,536 terms.
        let (first, most) = terms_per_index(1000, 14);
        assert_eq!((first, most), (2_857, 2_857));
        assert!(14 * most <= MAX_SEEN);
        // Never fewer than the list's size.
        assert_eq!(terms_per_index(1000, 100), (1000, 1000));
    }

    #[test]
    fn a_double_is_above_its_bound_only_past_the_rounding_margin() {
        assert!(1.0f64.above(0.5));
        assert!(!1.0f64.above(1.0));
        assert!(!(1.0f64 + 1e-12).above(1.0));
        assert!(1.0f64.above(0.0));
        assert!(!0.0f64.above(0.0));
        assert!(3i128.above(2) && !2i128.above(2));
        assert_eq!(1i128.plus_positive(-5), 1);
        assert_eq!(1.5f64.plus_positive(2.0), 3.5);
    }
}
