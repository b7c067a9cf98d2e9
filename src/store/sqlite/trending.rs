//! Trending lists on the embedded store (see `crate::domain::trending` and
//! [`TrendingQuery`]): the plan's hour rows and day rows read hour by hour
//! (day by day) through the primary key `(hour, cid)` (`(day, cid)`), each
//! count times its bucket's weight summed per counter here, then the best
//! scores looked up among the counters of the pair.
//!
//! Why in Rust rather than one statement: the statement (a `json_each` of
//! the weights joined to the rows, `GROUP BY cid`, the counters joined,
//! SQLite's sorter) took 9-12 s at a million counters
//! (`scripts/bench/README.md`, "Trending"), most of it the sorter of the
//! grouping and a counter lookup per scored counter; here each row costs
//! one step and an addition into an array by counter id ([`Scores`]), the
//! best scores are selected and sorted a block at a time ([`best`]), and
//! only the counters that may be listed are looked up. The weights are the
//! domain's (`weight`), so the scores are those Elasticsearch computes;
//! sums are compensated (Kahan-Babuska-Neumaier), as Elasticsearch's `sum`
//! is. What is left is SQLite's own step per row (three quarters of a
//! list's CPU at a million counters).
//!
//! A half-life the store keeps bounds for (`--trending-half-lives`,
//! `trendkeys`) is not scanned: the pair's counters are walked best
//! bound first through an index ([`walked`]), each scored exactly from
//! its own rows (the `(cid, hour)` and `(cid, day)` indexes) with the same
//! additions in the same order as the scan (so the same doubles, bit for
//! bit, and the same tie-break), until the next bound is below the
//! `size`-th score: about a hundred candidates for a top 100 of a million
//! counters in the bench. The walk gives up to the scan when it passes
//! [`WALK_MAX`] candidates (a bad case costs about a scan more), when the
//! counters with a bound run out before `size` positive scores (the
//! others score 0 at most, and are listed at 0 by the scan), and when the
//! plan reads a day bucket the bounds do not hold yet (after midnight,
//! until the upkeep has run).
//!
//! Memory, for the request's length: 16 bytes and a bit per counter id of
//! the store while ids stay under [`DENSE_MAX_CID`] (64 MiB at most), else
//! a map entry (about 40 bytes) per counter with a bucket in the plan; and
//! 16 bytes per scored counter for the ranking; two lists at once in the
//! process (`SqliteStore::scan`).

use std::collections::{HashMap, HashSet};

use rusqlite::{params, Connection, OptionalExtension};

use super::hours::{self, Of};
use super::sql;
use crate::store::{StoreError, TrendingEntry, TrendingList, TrendingQuery};

/// A compensated sum (Neumaier's variant of Kahan's).
#[derive(Clone, Copy, Default)]
struct Sum {
    sum: f64,
    carry: f64,
}

impl Sum {
    fn add(&mut self, x: f64) {
        let t = self.sum + x;
        if self.sum.abs() >= x.abs() {
            self.carry += (self.sum - t) + x;
        } else {
            self.carry += (x - t) + self.sum;
        }
        self.sum = t;
    }

    fn value(self) -> f64 {
        self.sum + self.carry
    }
}

/// Candidates looked up one by one before the pair's counters are read
/// whole instead (a pair with few of the scored counters).
const LOOKUPS_BEFORE_SET: usize = 20_000;

/// The highest counter id whose scores are kept in a dense array (16 bytes
/// a counter id, so at most 64 MiB for the request); past it, a map.
const DENSE_MAX_CID: i64 = 1 << 22;

/// Each scored counter's sum, by counter id.
///
/// Dense (an array indexed by counter id, and a bit per id for "has a
/// bucket in the plan") while the store's ids are few enough: the rows of
/// one hour (day) come in counter id order, so the array is walked
/// forward, where a hash map's entries are scattered (a cache miss a row
/// at a million counters). Ids are the store's own, assigned in order, so
/// neither form can be steered by a client.
enum Scores {
    Dense { sums: Vec<Sum>, seen: Vec<u64> },
    Sparse(HashMap<i64, Sum>),
}

impl Scores {
    fn new(max_cid: i64) -> Scores {
        match usize::try_from(max_cid) {
            Ok(max) if max_cid <= DENSE_MAX_CID => Scores::Dense {
                sums: vec![Sum::default(); max + 1],
                seen: vec![0; max / 64 + 1],
            },
            _ => Scores::Sparse(HashMap::new()),
        }
    }

    fn add(&mut self, cid: i64, x: f64) {
        match self {
            Scores::Dense { sums, seen } => match usize::try_from(cid) {
                Ok(i) if i < sums.len() => {
                    sums[i].add(x);
                    seen[i / 64] |= 1 << (i % 64);
                }
                // A counter made after `max_cid` was read: not in this
                // reader's snapshot, so never reached; kept safe anyway.
                _ => {}
            },
            Scores::Sparse(map) => map.entry(cid).or_default().add(x),
        }
    }

    /// (score, cid) of every counter with a bucket in the plan.
    fn ranked(self) -> Vec<(f64, i64)> {
        match self {
            Scores::Dense { sums, seen } => sums
                .iter()
                .enumerate()
                .filter(|(i, _)| seen[i / 64] & (1 << (i % 64)) != 0)
                .map(|(i, s)| (s.value(), i as i64))
                .collect(),
            Scores::Sparse(map) => map.into_iter().map(|(c, s)| (s.value(), c)).collect(),
        }
    }
}

/// Best first: score descending, then counter id.
fn best_first(a: &(f64, i64), b: &(f64, i64)) -> std::cmp::Ordering {
    b.0.total_cmp(&a.0).then(a.1.cmp(&b.1))
}

/// The list, the change log folded first (the caller's part).
pub(super) fn top(conn: &Connection, q: &TrendingQuery) -> Result<TrendingList, StoreError> {
    let e = sql("trending::top");
    // One read transaction: the rows summed and the ids bounded by
    // `max_cid` are of one snapshot.
    let tx = conn.unchecked_transaction().map_err(&e)?;
    // Walked when the bounds are kept for the half-life and hold every day
    // bucket the plan reads (see `trendkeys`).
    let bounded = super::trendkeys::kept(&tx)?.contains(&q.half_life_ms)
        && (q.plan.days.is_empty() || q.plan.days.end <= super::trendkeys::rebased(&tx)?);
    let walked = match bounded {
        true => {
            let w = walked(&tx, q)?;
            tracing::debug!(
                candidates = w.candidates,
                decided = w.entries.is_some(),
                "trending walk"
            );
            w.entries
        }
        false => None,
    };
    let entries = match walked {
        Some(entries) => entries,
        None => scored(&tx, q)?,
    };
    drop(tx);
    let exact = match q.hour_range() {
        Some(range) => hours::exact(conn, range, Of::Pair(&q.entity, &q.action))?,
        None => true,
    };
    Ok(TrendingList { entries, exact })
}

/// Candidates scored one by one (three index lookups each) before a walk
/// gives up and the list is summed by the scan: about a third of the
/// scan's time at a million counters, so a list whose bounds are loose
/// (short half-lives, a rare category) costs at most that much more.
pub(super) const WALK_MAX: usize = 10_000;

/// What a walk over the kept bounds found.
pub(super) struct Walked {
    /// The list; `None` when the walk could not decide it (the scan must).
    pub entries: Option<Vec<TrendingEntry>>,
    /// Candidates scored.
    pub candidates: usize,
}

/// The list by a walk over the kept bounds (`trendkeys`), best bound
/// first: each candidate scored exactly, with the scan's additions in the
/// scan's order (so the same f64), until the next bound is below the
/// `size`-th score. Undecided (`None`) when the walk passes [`WALK_MAX`],
/// or when the counters with a bound run out before `size` scores above 0
/// (the others, with no positive count, may be listed at 0 or below).
pub(super) fn walked(conn: &Connection, q: &TrendingQuery) -> Result<Walked, StoreError> {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    let e = sql("trending::walked");
    let (hour_w, day_w) = (q.hour_weights(), q.day_weights());
    let now_exp = q.now_ms as f64 / q.half_life_ms as f64;
    let mut hours = conn
        .prepare_cached(
            "SELECT hour, value FROM hours INDEXED BY hours_by_counter
             WHERE cid = ?1 AND hour >= ?2 AND hour < ?3 ORDER BY hour",
        )
        .map_err(&e)?;
    let mut days = conn
        .prepare_cached(
            "SELECT day, value FROM buckets INDEXED BY buckets_by_counter
             WHERE cid = ?1 AND day >= ?2 AND day < ?3 ORDER BY day",
        )
        .map_err(&e)?;
    let mut lookup = conn
        .prepare_cached(
            "SELECT uuid, category FROM counters WHERE cid = ?1 AND (?2 IS NULL OR category = ?2)",
        )
        .map_err(&e)?;
    let mut entries: Vec<TrendingEntry> = Vec::new();
    // The best `size` positive scores (as bits: ordered as the scores).
    let mut best: BinaryHeap<Reverse<u64>> = BinaryHeap::new();
    let (mut candidates, mut decided, mut gave_up) = (0usize, false, false);
    super::trendkeys::walk(conn, &q.entity, &q.action, q.half_life_ms, |cid, key| {
        let bound = (key - now_exp).exp2() * (1.0 + 1e-9);
        if best.len() >= q.size
            && best
                .peek()
                .is_some_and(|Reverse(k)| bound < f64::from_bits(*k))
        {
            decided = true;
            return Ok(false);
        }
        if candidates >= WALK_MAX {
            gave_up = true;
            return Ok(false);
        }
        candidates += 1;
        let (mut sum, mut seen) = (Sum::default(), false);
        for (s, range, weights) in [
            (&mut hours, &q.plan.hours, &hour_w),
            (&mut days, &q.plan.days, &day_w),
        ] {
            let mut rows = s.query(params![cid, range.start, range.end]).map_err(&e)?;
            while let Some(r) = rows.next().map_err(&e)? {
                let at: i64 = r.get(0).map_err(&e)?;
                let value: i64 = r.get(1).map_err(&e)?;
                seen = true;
                sum.add(value as f64 * weights[(at - range.start) as usize]);
            }
        }
        if !seen {
            return Ok(true);
        }
        let Some((uuid, category)) = lookup
            .query_row(params![cid, q.category], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()
            .map_err(&e)?
        else {
            return Ok(true);
        };
        let score = sum.value();
        entries.push(TrendingEntry {
            uuid,
            score,
            category,
        });
        if score > 0.0 {
            best.push(Reverse(score.to_bits()));
            if best.len() > q.size {
                best.pop();
            }
        }
        Ok(true)
    })?;
    // Out of bounds: decided only when `size` scores above 0 are found (the
    // counters without a bound score 0 at most).
    if !decided && !gave_up && best.len() >= q.size {
        decided = true;
    }
    if !decided {
        return Ok(Walked {
            entries: None,
            candidates,
        });
    }
    entries.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then_with(|| a.uuid.as_bytes().cmp(b.uuid.as_bytes()))
    });
    entries.truncate(q.size);
    Ok(Walked {
        entries: Some(entries),
        candidates,
    })
}

/// The list by the scan alone, whatever bounds are kept.
pub(super) fn top_scanned(
    conn: &Connection,
    q: &TrendingQuery,
) -> Result<TrendingList, StoreError> {
    let e = sql("trending::top");
    let tx = conn.unchecked_transaction().map_err(&e)?;
    let entries = scored(&tx, q)?;
    drop(tx);
    let exact = match q.hour_range() {
        Some(range) => hours::exact(conn, range, Of::Pair(&q.entity, &q.action))?,
        None => true,
    };
    Ok(TrendingList { entries, exact })
}

fn scored(conn: &Connection, q: &TrendingQuery) -> Result<Vec<TrendingEntry>, StoreError> {
    let e = sql("trending::top");
    let max_cid: i64 = conn
        .query_row("SELECT coalesce(max(cid), 0) FROM counters", [], |r| {
            r.get(0)
        })
        .map_err(&e)?;
    let mut scores = Scores::new(max_cid);
    for (table, column, range, weights) in [
        ("hours", "hour", q.plan.hours.clone(), q.hour_weights()),
        ("buckets", "day", q.plan.days.clone(), q.day_weights()),
    ] {
        let mut s = conn
            .prepare_cached(&format!(
                "SELECT cid, value FROM {table} WHERE {column} = ?1"
            ))
            .map_err(&e)?;
        for (at, w) in range.zip(weights) {
            let mut rows = s.query([at]).map_err(&e)?;
            while let Some(r) = rows.next().map_err(&e)? {
                let cid: i64 = r.get(0).map_err(&e)?;
                let value: i64 = r.get(1).map_err(&e)?;
                scores.add(cid, value as f64 * w);
            }
        }
    }
    let ranked = scores.ranked();

    let mut lookup = conn
        .prepare_cached(
            "SELECT uuid, category FROM counters
             WHERE cid = ?1 AND entity = ?2 AND action = ?3 AND (?4 IS NULL OR category = ?4)",
        )
        .map_err(&e)?;
    let mut pair: Option<HashSet<i64>> = None;
    best(ranked, q.size, |i, cid| {
        if pair.is_none() && i == LOOKUPS_BEFORE_SET {
            pair = Some(pair_cids(conn, q)?);
        }
        if pair.as_ref().is_some_and(|p| !p.contains(&cid)) {
            return Ok(None);
        }
        lookup
            .query_row(params![cid, q.entity, q.action, q.category], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .optional()
            .map_err(&e)
    })
}

/// The best `size` of `ranked` (score, cid) that `listed` finds in the
/// pair (its uuid and category; `None`: another pair's, or another
/// category's), given the rank `i` and the cid of each candidate, best
/// first; more when the last one ties, then ordered by score and uuid.
///
/// Sorted a block at a time: a list needs the first few hundred of a
/// million scores in order, not all of them (a selection, then a sort of
/// the block; a block four times the last when the pair's counters are
/// fewer than that among them).
fn best(
    mut ranked: Vec<(f64, i64)>,
    size: usize,
    mut listed: impl FnMut(usize, i64) -> Result<Option<(String, Option<String>)>, StoreError>,
) -> Result<Vec<TrendingEntry>, StoreError> {
    let mut entries: Vec<TrendingEntry> = Vec::new();
    let (mut start, mut block) = (0, (size * 4).max(1024));
    'blocks: while start < ranked.len() {
        let end = (start + block).min(ranked.len());
        if end < ranked.len() {
            ranked[start..].select_nth_unstable_by(end - start - 1, best_first);
        }
        ranked[start..end].sort_unstable_by(best_first);
        for (i, &(score, cid)) in (start..end).zip(&ranked[start..end]) {
            // Enough, and none left that ties the last kept.
            if entries.len() >= size && entries.last().is_some_and(|l| score < l.score) {
                break 'blocks;
            }
            if let Some((uuid, category)) = listed(i, cid)? {
                entries.push(TrendingEntry {
                    uuid,
                    score,
                    category,
                });
            }
        }
        start = end;
        block = block.saturating_mul(4);
    }
    // Ties of the last score come out by uuid, as on every list.
    entries.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then_with(|| a.uuid.as_bytes().cmp(b.uuid.as_bytes()))
    });
    entries.truncate(size);
    Ok(entries)
}

/// The counters of the pair (and category), by cid.
fn pair_cids(conn: &Connection, q: &TrendingQuery) -> Result<HashSet<i64>, StoreError> {
    let mut s = conn
        .prepare_cached(
            "SELECT cid FROM counters
             WHERE entity = ?1 AND action = ?2 AND (?3 IS NULL OR category = ?3)",
        )
        .map_err(sql("trending::pair_cids"))?;
    let cids = s
        .query_map(params![q.entity, q.action, q.category], |r| r.get(0))
        .and_then(|rows| rows.collect::<Result<HashSet<i64>, _>>())
        .map_err(sql("trending::pair_cids"))?;
    Ok(cids)
}

#[cfg(test)]
mod tests {
    use super::{best, Scores, Sum, DENSE_MAX_CID};

    #[test]
    fn sums_are_compensated() {
        let mut s = Sum::default();
        for x in [1e16, 1.0, -1e16, 1.0] {
            s.add(x);
        }
        assert_eq!(s.value(), 2.0);
    }

    /// The dense array and the map give the same sums, a counter whose
    /// counts sum to 0 included (it has buckets in the plan).
    #[test]
    fn dense_and_sparse_scores_agree() {
        let rows = [
            (3, 2.0),
            (1, 0.5),
            (3, -2.0),
            (700, 1.25),
            (64, 4.0),
            (1, 0.25),
        ];
        let mut dense = Scores::new(1000);
        let mut sparse = Scores::new(DENSE_MAX_CID + 1);
        assert!(matches!(dense, Scores::Dense { .. }));
        assert!(matches!(sparse, Scores::Sparse(_)));
        for (cid, x) in rows {
            dense.add(cid, x);
            sparse.add(cid, x);
        }
        let (mut d, mut s) = (dense.ranked(), sparse.ranked());
        d.sort_by_key(|x| x.1);
        s.sort_by_key(|x| x.1);
        assert_eq!(d, vec![(0.75, 1), (0.0, 3), (4.0, 64), (1.25, 700)]);
        assert_eq!(d, s);
    }

    /// Past the first block: the best 1,024 scores are another pair's,
    /// so the list is filled from later blocks, still best first, and a
    /// tie at the last place is broken by uuid.
    #[test]
    fn the_list_is_filled_from_later_blocks_best_first() {
        // 10,000 counters scored cid / 2 (two by two tied); of the pair:
        // those under 5,000 whose cid is 0 or 1 modulo 97.
        let member = |c: i64| c < 5_000 && c % 97 <= 1;
        let ranked: Vec<(f64, i64)> = (0..10_000).map(|c| ((c / 2) as f64, c)).collect();
        let mut asked = Vec::new();
        // Uuids in the reverse order of cids, so the tie is broken by uuid,
        // not by the order the candidates were asked in.
        let entries = best(ranked, 3, |i, cid| {
            asked.push(i);
            Ok(member(cid).then(|| (format!("u{:05}", 99_999 - cid), None)))
        })
        .unwrap();
        let got: Vec<(f64, &str)> = entries.iter().map(|e| (e.score, e.uuid.as_str())).collect();
        // 4948 and 4947 score 2474 and 2473; 4850 and 4851 tie at 2425 for
        // the third place, which the lower uuid (4851's) takes.
        assert_eq!(
            got,
            [(2474.0, "u95051"), (2473.0, "u95052"), (2425.0, "u95148")]
        );
        assert!(asked.len() > 1024, "the first block alone cannot fill it");
        assert!(asked.windows(2).all(|w| w[0] + 1 == w[1]), "ranks in order");
    }
}
