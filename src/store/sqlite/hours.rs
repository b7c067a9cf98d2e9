//! Hour buckets on the embedded store (`crate::domain::hours`): their
//! tables, their writes (by a flush for new counters and direct writes, by
//! the fold for logged deltas), their retention and their reads.
//!
//! The rule they keep: for every day from `hours_state.from_day` on, a
//! counter's day bucket equals the sum of its hour buckets of that day plus
//! its `hour_rest` of that day. The rest is what moved the day without an
//! hour to put it in: a backfill (`PUT .../days/{day}` sets a day, not an
//! hour), or an hour that would have left i64 (then the rest is NULL:
//! unknown). Hour answers over a day whose rest is not 0 say
//! `exact: false`; so do answers reaching before `from_day` (hours of a
//! database made by an earlier version, which kept none).
//!
//! Why rows per (hour, counter), like `buckets`: a top list of the last
//! hour or 24 hours reads only those hours' rows (clustered by hour), one
//! counter's histogram a range of the `(cid, hour)` index, and the
//! retention deletes the oldest rows in primary-key order. The cost is
//! measured in `scripts/bench/README.md` ("Hour buckets").

use rusqlite::{params, Connection, OptionalExtension};

use super::sql;
use crate::domain::{CounterKey, HourRange};
use crate::store::{HourBucket, HourHistogram, StoreError, TopHoursQuery, TopList};

/// Created by schema 8.
pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS hours (
    hour  INTEGER NOT NULL,
    cid   INTEGER NOT NULL,
    value INTEGER NOT NULL,
    PRIMARY KEY (hour, cid)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS hours_by_counter ON hours (cid, hour);
-- What moved a day bucket without an hour to land in (a backfill); NULL
-- when unknown (an hour bucket that would have left i64).
CREATE TABLE IF NOT EXISTS hour_rest (
    day   INTEGER NOT NULL,
    cid   INTEGER NOT NULL,
    value INTEGER,
    PRIMARY KEY (day, cid)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS hour_rest_by_counter ON hour_rest (cid, day);
-- The first day whose hours are complete: moved on by the retention, and
-- set to the day after the upgrade in a database of an earlier version.
CREATE TABLE IF NOT EXISTS hours_state (
    id       INTEGER PRIMARY KEY CHECK (id = 1),
    from_day INTEGER NOT NULL
);
";

/// Records where complete hours start in a database that had none: a new
/// one (schema version 0) has them from the beginning, one of an earlier
/// version from the day after `today` (the days before hold increments no
/// hour recorded). Nothing when the state is there already.
pub(super) fn note_start(
    conn: &Connection,
    old_version: i64,
    today: i64,
) -> Result<(), StoreError> {
    let from_day = if old_version == 0 {
        i64::MIN / 48
    } else {
        today + 1
    };
    conn.execute(
        "INSERT OR IGNORE INTO hours_state (id, from_day) VALUES (1, ?1)",
        [from_day],
    )
    .map_err(sql("hours::note_start"))?;
    Ok(())
}

/// The first day whose hours are complete (see the module documentation).
pub(super) fn from_day(conn: &Connection) -> Result<i64, StoreError> {
    conn.query_row("SELECT from_day FROM hours_state", [], |r| r.get(0))
        .optional()
        .map(|d| d.unwrap_or(i64::MIN / 48))
        .map_err(sql("hours::from_day"))
}

/// Guards `value + excluded.value` against leaving i64, so the guard
/// itself cannot overflow (NULL, an unknown rest, fails it).
const FITS: &str = "((excluded.value >= 0 AND value <= 9223372036854775807 - excluded.value)
     OR (excluded.value < 0 AND value >= (-9223372036854775807 - 1) - excluded.value))";

/// The statements that add to hour buckets, prepared once per use.
pub(super) struct HourRows<'c> {
    hour: rusqlite::CachedStatement<'c>,
    rest: rusqlite::CachedStatement<'c>,
}

impl<'c> HourRows<'c> {
    pub fn prepare(tx: &'c Connection) -> Result<HourRows<'c>, StoreError> {
        Ok(HourRows {
            hour: tx
                .prepare_cached(&format!(
                    "INSERT INTO hours (hour, cid, value) VALUES (?1, ?2, ?3)
                     ON CONFLICT (hour, cid) DO UPDATE SET value = value + excluded.value
                     WHERE {FITS}"
                ))
                .map_err(sql("hours::prepare"))?,
            rest: tx
                .prepare_cached(&format!(
                    "INSERT INTO hour_rest (day, cid, value) VALUES (?1, ?2, ?3)
                     ON CONFLICT (day, cid) DO UPDATE SET
                         value = CASE WHEN excluded.value IS NOT NULL AND {FITS}
                                      THEN value + excluded.value END"
                ))
                .map_err(sql("hours::prepare"))?,
        })
    }

    /// Adds `delta` to the hour bucket of `cid`; a bucket that would leave
    /// i64 is left as it is and its day's rest becomes unknown.
    pub fn add(&mut self, cid: i64, hour: i64, delta: i128) -> Result<(), StoreError> {
        for part in super::log::split(delta) {
            let added = self
                .hour
                .execute(params![hour, cid, part])
                .map_err(sql("hours::add"))?;
            if added == 0 {
                self.lost(cid, hour.div_euclid(24))?;
            }
        }
        Ok(())
    }

    /// Adds `delta` to the rest of a day (what moved it without an hour).
    pub fn rest(&mut self, cid: i64, day: i64, delta: i128) -> Result<(), StoreError> {
        for part in super::log::split(delta) {
            self.rest
                .execute(params![day, cid, part])
                .map_err(sql("hours::rest"))?;
        }
        Ok(())
    }

    /// The hours of a day no longer sum to it, by an unknown amount.
    fn lost(&mut self, cid: i64, day: i64) -> Result<(), StoreError> {
        self.rest
            .execute(params![day, cid, Option::<i64>::None])
            .map_err(sql("hours::lost"))?;
        Ok(())
    }
}

/// Sets the hours of one day of a counter whole (an import that carries
/// them): the day's other hours go, and its rest becomes what `day_value`
/// holds beyond them (NULL, unknown, past i64), so the day stays its hours
/// plus its rest.
pub(super) fn set_day(
    tx: &Connection,
    cid: i64,
    day: i64,
    day_value: i64,
    hours: &[HourBucket],
) -> Result<(), StoreError> {
    tx.prepare_cached("DELETE FROM hours WHERE cid = ?1 AND hour BETWEEN ?2 AND ?3")
        .and_then(|mut s| s.execute(params![cid, day * 24, day * 24 + 23]))
        .map_err(sql("hours::set_day"))?;
    let mut put = tx
        .prepare_cached("INSERT INTO hours (hour, cid, value) VALUES (?1, ?2, ?3)")
        .map_err(sql("hours::set_day"))?;
    let mut sum = 0i128;
    for h in hours {
        put.execute(params![h.hour, cid, h.value])
            .map_err(sql("hours::set_day"))?;
        sum += i128::from(h.value);
    }
    let rest = i64::try_from(i128::from(day_value) - sum).ok();
    tx.prepare_cached(
        "INSERT INTO hour_rest (day, cid, value) VALUES (?1, ?2, ?3)
         ON CONFLICT (day, cid) DO UPDATE SET value = excluded.value",
    )
    .and_then(|mut s| s.execute(params![day, cid, rest]))
    .map_err(sql("hours::set_day"))?;
    Ok(())
}

/// A deleted counter's hours and rests.
pub(super) fn forget(tx: &Connection, cid: i64) -> Result<(), StoreError> {
    tx.execute("DELETE FROM hours WHERE cid = ?1", [cid])
        .map_err(sql("hours::forget"))?;
    tx.execute("DELETE FROM hour_rest WHERE cid = ?1", [cid])
        .map_err(sql("hours::forget"))?;
    Ok(())
}

/// Rows deleted per statement of the retention.
const RETAIN_BATCH: i64 = 10_000;

/// Moves the first complete day to `first_day` (never back) and deletes
/// hours and rests of the days before it, oldest first, in batches, until
/// none is left or `budget` is spent. Returns how many rows went.
/// The first day is written before any row goes: a flush skips the hours
/// of days before the day it read ([`from_day`] through the store's
/// memory), so every day from the recorded one on is complete.
pub(super) fn expire(
    conn: &Connection,
    first_day: i64,
    budget: std::time::Duration,
) -> Result<u64, StoreError> {
    let started = std::time::Instant::now();
    conn.execute(
        "INSERT INTO hours_state (id, from_day) VALUES (1, ?1)
         ON CONFLICT (id) DO UPDATE SET from_day = max(from_day, excluded.from_day)",
        [first_day],
    )
    .map_err(sql("hours::expire"))?;
    let mut deleted = 0u64;
    for (stmt, before) in [
        (
            "DELETE FROM hours WHERE (hour, cid) IN (
                 SELECT hour, cid FROM hours WHERE hour < ?1 ORDER BY hour, cid LIMIT ?2)",
            first_day.saturating_mul(24),
        ),
        (
            "DELETE FROM hour_rest WHERE (day, cid) IN (
                 SELECT day, cid FROM hour_rest WHERE day < ?1 ORDER BY day, cid LIMIT ?2)",
            first_day,
        ),
    ] {
        let mut s = conn.prepare_cached(stmt).map_err(sql("hours::expire"))?;
        loop {
            if started.elapsed() >= budget {
                return Ok(deleted);
            }
            let n = s
                .execute(params![before, RETAIN_BATCH])
                .map_err(sql("hours::expire"))?;
            deleted += n as u64;
            if (n as i64) < RETAIN_BATCH {
                break;
            }
        }
    }
    Ok(deleted)
}

/// Which counters an exactness check looks at.
pub(super) enum Of<'q> {
    Counter(i64),
    /// Every counter of an entity/action pair.
    Pair(&'q str, &'q str),
}

/// Whether the hours of `range` are exact for the counters of `of`: no day
/// of it before the first complete day, and no rest.
pub(super) fn exact(conn: &Connection, range: HourRange, of: Of<'_>) -> Result<bool, StoreError> {
    let days = range.days();
    if days.from_day < from_day(conn)? {
        return Ok(false);
    }
    const MOVED: &str = "r.day BETWEEN ?1 AND ?2 AND (r.value IS NULL OR r.value != 0)";
    let rest: Option<i64> = match of {
        Of::Counter(cid) => conn
            .prepare_cached(&format!(
                "SELECT 1 FROM hour_rest r INDEXED BY hour_rest_by_counter
                 WHERE r.cid = ?3 AND {MOVED} LIMIT 1"
            ))
            .and_then(|mut s| {
                s.query_row(params![days.from_day, days.to_day, cid], |r| r.get(0))
                    .optional()
            }),
        Of::Pair(entity, action) => conn
            .prepare_cached(&format!(
                // From the rests (rare: backfilled days), not from the
                // pair's counters, which SQLite would otherwise walk whole
                // (a third of a second at a million counters).
                "SELECT 1 FROM hour_rest r CROSS JOIN counters c ON c.cid = r.cid
                 WHERE {MOVED} AND c.entity = ?3 AND c.action = ?4 LIMIT 1"
            ))
            .and_then(|mut s| {
                s.query_row(params![days.from_day, days.to_day, entity, action], |r| {
                    r.get(0)
                })
                .optional()
            }),
    }
    .map_err(sql("hours::exact"))?;
    Ok(rest.is_none())
}

/// One counter's hour buckets inside `range` (the change log folded
/// first); `None` if the counter does not exist.
pub(super) fn histogram(
    conn: &Connection,
    key: &CounterKey,
    range: HourRange,
) -> Result<Option<HourHistogram>, StoreError> {
    let cid: Option<i64> = conn
        .prepare_cached("SELECT cid FROM counters WHERE entity = ?1 AND action = ?2 AND uuid = ?3")
        .and_then(|mut s| {
            s.query_row(params![&*key.entity, &*key.action, &*key.uuid], |r| {
                r.get(0)
            })
            .optional()
        })
        .map_err(sql("hours::histogram"))?;
    let Some(cid) = cid else { return Ok(None) };
    let mut s = conn
        .prepare_cached(
            "SELECT hour, value FROM hours INDEXED BY hours_by_counter
             WHERE cid = ?1 AND hour BETWEEN ?2 AND ?3 ORDER BY hour",
        )
        .map_err(sql("hours::histogram"))?;
    let buckets = s
        .query_map(params![cid, range.from_hour, range.to_hour], |r| {
            Ok(HourBucket {
                hour: r.get(0)?,
                value: r.get(1)?,
            })
        })
        .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
        .map_err(sql("hours::histogram"))?;
    Ok(Some(HourHistogram {
        buckets,
        exact: exact(conn, range, Of::Counter(cid))?,
    }))
}

/// The counters of a pair with the highest sums of their hour buckets in
/// the query's hours (the change log folded first), summed as a windowed
/// list sums its day buckets (`queries::top_of_sums`).
pub(super) fn top(conn: &Connection, q: &TopHoursQuery) -> Result<TopList, StoreError> {
    let entries = super::queries::top_of_sums(
        conn,
        &super::queries::SumOver {
            table: "hours",
            column: "hour",
            from: q.hours.from_hour,
            to: q.hours.to_hour,
            entity: &q.entity,
            action: &q.action,
            category: q.category.as_deref(),
            size: q.size,
        },
    )
    .map_err(sql("hours::top"))?;
    Ok(TopList {
        entries,
        exact: exact(conn, q.hours, Of::Pair(&q.entity, &q.action))?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db(old_version: i64, today: i64) -> Connection {
        let c = Connection::open_in_memory().unwrap();
        c.execute_batch(SCHEMA).unwrap();
        note_start(&c, old_version, today).unwrap();
        c
    }

    fn range(from_day: i64, to_day: i64) -> HourRange {
        HourRange {
            from_hour: from_day * 24,
            to_hour: to_day * 24 + 23,
        }
    }

    #[test]
    fn an_upgraded_database_has_complete_hours_from_the_next_day_only() {
        let today = 20_787;
        let fresh = db(0, today);
        assert!(exact(&fresh, range(today - 14, today), Of::Counter(1)).unwrap());
        let upgraded = db(7, today);
        assert_eq!(from_day(&upgraded).unwrap(), today + 1);
        assert!(!exact(&upgraded, range(today, today), Of::Counter(1)).unwrap());
        assert!(exact(&upgraded, range(today + 1, today + 1), Of::Counter(1)).unwrap());
        // Noted once: a later open keeps it.
        note_start(&upgraded, 8, today + 5).unwrap();
        assert_eq!(from_day(&upgraded).unwrap(), today + 1);
    }

    #[test]
    fn retention_records_the_first_complete_day_then_deletes_older_rows() {
        let today = 20_787;
        let c = db(0, today);
        let mut rows = HourRows::prepare(&c).unwrap();
        for day in [today - 20, today - 15, today - 14, today] {
            rows.add(1, day * 24 + 5, 3).unwrap();
            rows.rest(1, day, 2).unwrap();
        }
        drop(rows);
        let deleted = expire(&c, today - 14, std::time::Duration::from_secs(5)).unwrap();
        assert_eq!(deleted, 4);
        assert_eq!(from_day(&c).unwrap(), today - 14);
        let left: i64 = c
            .query_row(
                "SELECT count(*) FROM hours WHERE hour < ?1",
                [(today - 14) * 24],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(left, 0);
        let kept: i64 = c
            .query_row("SELECT count(*) FROM hours", [], |r| r.get(0))
            .unwrap();
        assert_eq!(kept, 2);
        // Never moved back by a shorter cut-off (a clock stepping back).
        expire(&c, today - 20, std::time::Duration::from_secs(5)).unwrap();
        assert_eq!(from_day(&c).unwrap(), today - 14);
    }

    #[test]
    fn an_hour_that_would_leave_i64_is_kept_and_its_day_marked_unknown() {
        let today = 20_787;
        let c = db(0, today);
        let mut rows = HourRows::prepare(&c).unwrap();
        rows.add(1, today * 24, i128::from(i64::MAX)).unwrap();
        rows.add(1, today * 24, 1).unwrap();
        drop(rows);
        let v: i64 = c
            .query_row("SELECT value FROM hours", [], |r| r.get(0))
            .unwrap();
        assert_eq!(v, i64::MAX);
        let rest: Option<i64> = c
            .query_row("SELECT value FROM hour_rest", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rest, None);
        assert!(!exact(&c, range(today, today), Of::Counter(1)).unwrap());
    }
}
