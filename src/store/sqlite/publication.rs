//! Targets' publication times (`targets`) and the top lists of totals over
//! the first N days from publication.
//!
//! Why this shape: a publication time belongs to a target (entity + uuid),
//! not to one of its counters, so it has a table of its own, keyed like
//! `counters_by_target`; a target without a row falls back to each
//! counter's `first_ts`. The table is created if missing and read by no
//! older build, so it needs no schema version of its own.
//!
//! A first-days list sums, per counter of the pair, its buckets from its
//! publication day on: one walk of the pair's counters (`counters_top`
//! starts with entity, action) and one range seek into `buckets_by_counter`
//! per counter. Its cost grows with the pair's counters (see
//! `scripts/bench/README.md` for the figure): unlike the named windows, the
//! windows differ per counter, so no kept total serves every N.

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use super::windows::{join, split_sum};
use super::{sql, Writer};
use crate::store::{FirstDaysEntry, FirstDaysQuery, PublishedSet, StoreError};

pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS targets (
    entity       TEXT    NOT NULL,
    uuid         TEXT    NOT NULL,
    published_ms INTEGER NOT NULL,
    PRIMARY KEY (entity, uuid)
) WITHOUT ROWID;
";

/// Sets or clears each target's publication time, in one transaction.
pub(super) fn set(w: &mut Writer, sets: &[PublishedSet]) -> Result<(), StoreError> {
    let tx = w
        .conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(sql("publication::set"))?;
    {
        let mut put = tx
            .prepare_cached(
                "INSERT INTO targets (entity, uuid, published_ms) VALUES (?1, ?2, ?3)
                 ON CONFLICT (entity, uuid) DO UPDATE SET published_ms = excluded.published_ms",
            )
            .map_err(sql("publication::set"))?;
        let mut add = tx
            .prepare_cached(
                "INSERT INTO targets (entity, uuid, published_ms) VALUES (?1, ?2, ?3)
                 ON CONFLICT (entity, uuid) DO NOTHING",
            )
            .map_err(sql("publication::set"))?;
        let mut clear = tx
            .prepare_cached("DELETE FROM targets WHERE entity = ?1 AND uuid = ?2")
            .map_err(sql("publication::set"))?;
        for s in sets {
            match (s.at_ms, s.replace) {
                (Some(ms), true) => put.execute(params![s.entity, s.uuid, ms]),
                (Some(ms), false) => add.execute(params![s.entity, s.uuid, ms]),
                (None, true) => clear.execute(params![s.entity, s.uuid]),
                (None, false) => Ok(0),
            }
            .map_err(sql("publication::set"))?;
        }
    }
    tx.commit().map_err(sql("publication::set"))
}

pub(super) fn get(conn: &Connection, entity: &str, uuid: &str) -> Result<Option<i64>, StoreError> {
    conn.prepare_cached("SELECT published_ms FROM targets WHERE entity = ?1 AND uuid = ?2")
        .and_then(|mut s| s.query_row(params![entity, uuid], |r| r.get(0)).optional())
        .map_err(sql("publication::get"))
}

/// The list, from rows that hold every acknowledged increment (the caller
/// folds first). Summed in 32-bit halves when a plain `sum()` leaves i64,
/// as windowed lists are.
pub(super) fn top(
    conn: &Connection,
    q: &FirstDaysQuery,
) -> Result<Vec<FirstDaysEntry>, StoreError> {
    match top_summed(conn, q, false) {
        Err(e) if overflowed(&e) => top_summed(conn, q, true),
        r => r,
    }
    .map_err(sql("publication::top"))
}

fn overflowed(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(_, Some(m)) if m == "integer overflow")
}

fn top_summed(
    conn: &Connection,
    q: &FirstDaysQuery,
    exact: bool,
) -> rusqlite::Result<Vec<FirstDaysEntry>> {
    // Publication day: floored division of a time after 2008 (set) or of a
    // first touch inside the retention; both positive, so `/` floors.
    let sums = if exact {
        format!(
            "SELECT cid, {} FROM (
                 SELECT p.cid, sum(b.value >> 32) AS h, sum(b.value & 4294967295) AS l
                 FROM pubs p JOIN buckets b INDEXED BY buckets_by_counter
                   ON b.cid = p.cid AND b.day BETWEEN max(p.day, ?5) AND p.day + ?4 - 1
                 GROUP BY p.cid)",
            split_sum("h", "l", "")
        )
    } else {
        "SELECT p.cid, sum(b.value) AS total
         FROM pubs p JOIN buckets b INDEXED BY buckets_by_counter
           ON b.cid = p.cid AND b.day BETWEEN max(p.day, ?5) AND p.day + ?4 - 1
         GROUP BY p.cid"
            .to_string()
    };
    let order = if exact {
        "s.hi DESC, s.lo DESC"
    } else {
        "s.total DESC"
    };
    let sql = format!(
        "WITH pubs AS (
             SELECT c.cid, c.uuid, c.category, t.published_ms AS set_ms,
                    coalesce(t.published_ms, c.first_ts) AS pub,
                    coalesce(t.published_ms, c.first_ts) / 86400000 AS day
             FROM counters c LEFT JOIN targets t ON t.entity = c.entity AND t.uuid = c.uuid
             WHERE c.entity = ?1 AND c.action = ?2 AND (?3 IS NULL OR c.category = ?3)),
         sums AS ({sums})
         SELECT p.uuid, p.category, p.pub, p.set_ms IS NOT NULL, {cols}
         FROM sums s JOIN pubs p ON p.cid = s.cid
         ORDER BY {order}, p.uuid LIMIT ?6",
        cols = if exact { "s.hi, s.lo" } else { "s.total" },
    );
    let mut s = conn.prepare_cached(&sql)?;
    let rows = s.query_map(
        params![
            q.entity,
            q.action,
            q.category,
            i64::from(q.days),
            q.oldest_day,
            i64::try_from(q.size).unwrap_or(i64::MAX)
        ],
        |r| {
            let value = if exact {
                join(r.get(4)?, r.get(5)?)
            } else {
                r.get::<_, i64>(4)?.into()
            };
            Ok(FirstDaysEntry {
                uuid: r.get(0)?,
                category: r.get(1)?,
                published_ms: r.get(2)?,
                published_set: r.get(3)?,
                value,
            })
        },
    )?;
    rows.collect()
}
