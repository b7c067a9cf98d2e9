//! The best `size` averages of a scan by a confidence-adjusted rank
//! ([`crate::domain::rank`]): every store feeds the targets it reads, in
//! uuid order, to a [`RankedTop`], which scores each, keeps the best in a
//! heap of `size` (memory bounded by the list, not by the targets), and
//! takes the mean of their averages on the way (`C` of a Bayesian rank, so a
//! store can check that the `C` it ranked with is still the one it read).

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::{AverageEntry, OutOfScaleAt, TopAverages};
use crate::domain::rank::{MeanOfAverages, OutOfScale, Rank};

/// An entry with its score, ordered as the list: the better one is `Less`,
/// so the heap's greatest is the worst kept.
struct Ranked {
    score: f64,
    entry: AverageEntry,
}

impl Ranked {
    fn list_order(&self, other: &Self) -> Ordering {
        other
            .score
            .total_cmp(&self.score)
            .then(other.entry.quantity.cmp(&self.entry.quantity))
            .then_with(|| self.entry.uuid.as_bytes().cmp(other.entry.uuid.as_bytes()))
    }
}

impl PartialEq for Ranked {
    fn eq(&self, other: &Self) -> bool {
        self.list_order(other) == Ordering::Equal
    }
}
impl Eq for Ranked {}
impl PartialOrd for Ranked {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Ranked {
    fn cmp(&self, other: &Self) -> Ordering {
        self.list_order(other)
    }
}

/// The top `size` of one pass over the targets.
pub struct RankedTop {
    rank: Rank,
    prior_mean: Option<f64>,
    size: usize,
    heap: BinaryHeap<Ranked>,
    seen: MeanOfAverages,
    out_of_scale: Option<OutOfScaleAt>,
}

impl RankedTop {
    /// `prior_mean`: `C` of a Bayesian rank, read by a pass before this
    /// one (`None` lists nothing by that rank: there was no average).
    pub fn new(rank: Rank, prior_mean: Option<f64>, size: usize) -> Self {
        RankedTop {
            rank,
            prior_mean,
            size,
            heap: BinaryHeap::with_capacity(size.saturating_add(1).min(1 << 16)),
            seen: MeanOfAverages::default(),
            out_of_scale: None,
        }
    }

    /// Adds one target (of at least `min_quantity` samples). `false` once
    /// its average lies outside a Wilson scale: the scan can stop, the
    /// answer is a refusal.
    pub fn push(&mut self, mut entry: AverageEntry) -> bool {
        self.seen.push(entry.sum, entry.quantity);
        let c = self.prior_mean.unwrap_or(f64::NAN);
        match self.rank.score(entry.sum, entry.quantity, c) {
            Err(OutOfScale { average }) => {
                self.out_of_scale = Some(OutOfScaleAt {
                    uuid: entry.uuid,
                    average,
                });
                return false;
            }
            Ok(None) => {}
            Ok(Some(score)) => {
                entry.score = Some(score);
                let ranked = Ranked { score, entry };
                if self.heap.len() < self.size {
                    self.heap.push(ranked);
                } else if self.heap.peek().is_some_and(|worst| ranked < *worst) {
                    self.heap.pop();
                    self.heap.push(ranked);
                }
            }
        }
        true
    }

    /// The mean of the averages pushed so far.
    pub fn mean_seen(&self) -> Option<f64> {
        self.seen.mean()
    }

    /// The list, best first.
    pub fn finish(self, exact: bool) -> TopAverages {
        let prior_mean = match self.rank {
            Rank::Bayesian { .. } => self.prior_mean,
            _ => None,
        };
        TopAverages {
            entries: self
                .heap
                .into_sorted_vec()
                .into_iter()
                .map(|r| r.entry)
                .collect(),
            exact,
            prior_mean,
            out_of_scale: self.out_of_scale,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(uuid: &str, sum: i128, quantity: i128) -> AverageEntry {
        AverageEntry {
            uuid: uuid.into(),
            sum,
            quantity,
            category: None,
            score: None,
        }
    }

    fn order(top: &TopAverages) -> Vec<&str> {
        top.entries.iter().map(|e| e.uuid.as_str()).collect()
    }

    /// The heap keeps the best `size` whatever the order they come in, and
    /// orders ties by quantity, then uuid.
    #[test]
    fn the_heap_keeps_the_best_in_list_order() {
        let rows = [
            entry("a", 5, 1),
            entry("b", 1920, 400),
            entry("c", 8, 2),
            entry("d", 4, 1),
            entry("e", 12, 3),
            entry("f", 1, 1),
        ];
        let rank = Rank::Bayesian { prior_weight: 0.0 };
        let mut want: Option<Vec<String>> = None;
        // Every rotation of the input gives the same list.
        for shift in 0..rows.len() {
            let mut top = RankedTop::new(rank, Some(3.0), 4);
            for i in 0..rows.len() {
                assert!(top.push(rows[(i + shift) % rows.len()].clone()));
            }
            let got = top.finish(true);
            let got: Vec<String> = order(&got).iter().map(|s| s.to_string()).collect();
            match &want {
                None => want = Some(got),
                Some(w) => assert_eq!(&got, w),
            }
        }
        // m = 0: the plain average; e (4, 3 samples) before c (4, 2) before d (4, 1).
        assert_eq!(want.unwrap(), ["a", "b", "e", "c"]);
    }

    #[test]
    fn a_bayesian_pass_sees_the_mean_and_reports_its_prior() {
        let rank = Rank::Bayesian { prior_weight: 10.0 };
        let mut top = RankedTop::new(rank, Some(3.5), 10);
        top.push(entry("one", 5, 1));
        top.push(entry("many", 1920, 400));
        assert_eq!(top.mean_seen(), Some((5.0 + 4.8) / 2.0));
        let list = top.finish(true);
        assert_eq!(order(&list), ["many", "one"]);
        assert_eq!(list.prior_mean, Some(3.5));
        let s = list.entries[1].score.unwrap();
        assert!((s - 40.0 / 11.0).abs() < 1e-12, "{s}");
        // Without a prior mean nothing is listed by that rank.
        let mut none = RankedTop::new(rank, None, 10);
        none.push(entry("one", 5, 1));
        assert!(none.finish(true).entries.is_empty());
    }

    #[test]
    fn a_wilson_pass_stops_at_an_average_outside_the_scale() {
        let rank = Rank::Wilson {
            lo: 1,
            hi: 5,
            z: 1.96,
        };
        let mut top = RankedTop::new(rank, None, 10);
        assert!(top.push(entry("a", 5, 1)));
        assert!(!top.push(entry("b", 7, 1)));
        let list = top.finish(true);
        assert_eq!(
            list.out_of_scale,
            Some(OutOfScaleAt {
                uuid: "b".into(),
                average: 7.0
            })
        );
        assert_eq!(list.prior_mean, None);
    }
}
