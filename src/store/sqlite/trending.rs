//! Trending lists on the embedded store (see `crate::domain::trending` and
//! [`TrendingQuery`]): one statement over the plan's hour rows and day
//! rows, each count times its bucket's weight, summed per counter.
//!
//! The weights are computed here, by the domain's `weight`, and handed to
//! SQLite as a JSON array (the bundled SQLite has no `pow`): the statement
//! walks that array, one element per hour (or day), and reads each one's
//! rows by the primary key `(hour, cid)` (or `(day, cid)`), so it reads
//! exactly the plan's rows, clustered, as a `last_24_hours` list reads
//! its hours (`queries::top_of_sums`), and joins the counters of the pair
//! once per counter after the sums. SQLite sums doubles with compensated
//! (Kahan-Babuska-Neumaier) summation, as Elasticsearch's `sum` does.

use rusqlite::{params, Connection};

use super::hours::{self, Of};
use super::sql;
use crate::store::{StoreError, TrendingEntry, TrendingList, TrendingQuery};

/// The list, the change log folded first (the caller's part).
pub(super) fn top(conn: &Connection, q: &TrendingQuery) -> Result<TrendingList, StoreError> {
    let json = |w: Vec<f64>| serde_json::to_string(&w).unwrap_or_else(|_| "[]".into());
    let mut s = conn
        .prepare_cached(
            "WITH parts(cid, part) AS (
                 SELECT h.cid, h.value * w.value
                 FROM json_each(?1) w CROSS JOIN hours h ON h.hour = ?2 + w.key
                 UNION ALL
                 SELECT b.cid, b.value * w.value
                 FROM json_each(?3) w CROSS JOIN buckets b ON b.day = ?4 + w.key)
             SELECT c.uuid, s.score, c.category
             FROM (SELECT cid, sum(part) AS score FROM parts GROUP BY cid) s
             JOIN counters c ON c.cid = s.cid
             WHERE c.entity = ?5 AND c.action = ?6 AND (?7 IS NULL OR c.category = ?7)
             ORDER BY s.score DESC, c.uuid LIMIT ?8",
        )
        .map_err(sql("trending::top"))?;
    let rows = s
        .query_map(
            params![
                json(q.hour_weights()),
                q.plan.hours.start,
                json(q.day_weights()),
                q.plan.days.start,
                q.entity,
                q.action,
                q.category,
                i64::try_from(q.size).unwrap_or(i64::MAX),
            ],
            |r| {
                Ok(TrendingEntry {
                    uuid: r.get(0)?,
                    score: r.get(1)?,
                    category: r.get(2)?,
                })
            },
        )
        .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
        .map_err(sql("trending::top"))?;
    let exact = match q.hour_range() {
        Some(range) => hours::exact(conn, range, Of::Pair(&q.entity, &q.action))?,
        None => true,
    };
    Ok(TrendingList {
        entries: rows,
        exact,
    })
}
