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
//! one step and a hash update, and only the counters that may be listed
//! are looked up. The weights are the domain's (`weight`), so the scores
//! are those Elasticsearch computes; sums are compensated
//! (Kahan-Babuska-Neumaier), as Elasticsearch's `sum` is.
//!
//! Memory: one entry (cid, score) per counter with a bucket in the plan,
//! transient, for the request's length (about 40 bytes each).

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

/// The list, the change log folded first (the caller's part).
pub(super) fn top(conn: &Connection, q: &TrendingQuery) -> Result<TrendingList, StoreError> {
    let e = sql("trending::top");
    let mut scores: HashMap<i64, Sum> = HashMap::new();
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
                scores.entry(cid).or_default().add(value as f64 * w);
            }
        }
    }
    let mut ranked: Vec<(f64, i64)> = scores.into_iter().map(|(c, s)| (s.value(), c)).collect();
    ranked.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));

    let mut lookup = conn
        .prepare_cached(
            "SELECT uuid, category FROM counters
             WHERE cid = ?1 AND entity = ?2 AND action = ?3 AND (?4 IS NULL OR category = ?4)",
        )
        .map_err(&e)?;
    let mut pair: Option<HashSet<i64>> = None;
    let mut entries: Vec<TrendingEntry> = Vec::new();
    for (i, &(score, cid)) in ranked.iter().enumerate() {
        // Enough, and none left that ties the last kept.
        if entries.len() >= q.size && entries.last().is_some_and(|l| score < l.score) {
            break;
        }
        if pair.is_none() && i == LOOKUPS_BEFORE_SET {
            pair = Some(pair_cids(conn, q)?);
        }
        if pair.as_ref().is_some_and(|p| !p.contains(&cid)) {
            continue;
        }
        let found: Option<(String, Option<String>)> = lookup
            .query_row(params![cid, q.entity, q.action, q.category], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .optional()
            .map_err(&e)?;
        if let Some((uuid, category)) = found {
            entries.push(TrendingEntry {
                uuid,
                score,
                category,
            });
        }
    }
    // Ties of the last score come out by uuid, as on every list.
    entries.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then_with(|| a.uuid.as_bytes().cmp(b.uuid.as_bytes()))
    });
    entries.truncate(q.size);
    let exact = match q.hour_range() {
        Some(range) => hours::exact(conn, range, Of::Pair(&q.entity, &q.action))?,
        None => true,
    };
    Ok(TrendingList { entries, exact })
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
    use super::Sum;

    #[test]
    fn sums_are_compensated() {
        let mut s = Sum::default();
        for x in [1e16, 1.0, -1e16, 1.0] {
            s.add(x);
        }
        assert_eq!(s.value(), 2.0);
    }
}
