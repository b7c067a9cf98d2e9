//! Targets' publication times (`targets`) and the top lists of totals over
//! the first N days from publication.
//!
//! Why this shape: a publication time belongs to a target (entity + uuid),
//! not to one of its counters, so it has a table of its own, keyed like
//! `counters_by_target`; a target without a row falls back to each
//! counter's `first_ts`. The table is created if missing and read by no
//! older build, so it needs no schema version of its own.
//!
//! A first-days list of an N without kept totals (`firstdays` keeps those
//! of `--milestone-days`) sums, per counter of the pair, its buckets from
//! its publication day on: one walk of the pair's counters in uuid order,
//! one key lookup in `targets` and one range seek into
//! `buckets_by_counter` per counter. Exact, bounded in memory (a
//! top-`size` sorter), but its time grows with the pair's counters:
//! seconds at a million (see `scripts/bench/README.md`). It is also the
//! reference the kept totals are tested against (`tests/first_days.rs`).
//! Setting, moving or clearing a publication sums the kept totals of the
//! target's counters again (`firstdays::recompute_target`).

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use super::windows::{join, split_sum};
use super::{sql, Writer};
use crate::store::{FirstDaysEntry, FirstDaysQuery, PublishedSet, StoreError, TargetPublished};

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
            // The target's counters' windows may have moved.
            super::firstdays::recompute_target(&tx, &w.first_days, &s.entity, &s.uuid)?;
        }
    }
    tx.commit().map_err(sql("publication::set"))
}

pub(super) fn get(conn: &Connection, entity: &str, uuid: &str) -> Result<Option<i64>, StoreError> {
    conn.prepare_cached("SELECT published_ms FROM targets WHERE entity = ?1 AND uuid = ?2")
        .and_then(|mut s| s.query_row(params![entity, uuid], |r| r.get(0)).optional())
        .map_err(sql("publication::get"))
}

/// Up to `limit` publication times after the target `after`, by the
/// primary key (entity, uuid; BINARY collation: bytewise, as export wants).
/// One statement: its own snapshot.
pub(super) fn page(
    conn: &Connection,
    after: Option<&(String, String)>,
    limit: usize,
) -> Result<Vec<TargetPublished>, StoreError> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let read = |r: &rusqlite::Row<'_>| -> rusqlite::Result<TargetPublished> {
        Ok(TargetPublished {
            entity: r.get(0)?,
            uuid: r.get(1)?,
            at_ms: r.get(2)?,
        })
    };
    const COLS: &str = "SELECT entity, uuid, published_ms FROM targets";
    match after {
        // A row value walks the primary key from the target on.
        Some((entity, uuid)) => conn
            .prepare_cached(&format!(
                "{COLS} WHERE (entity, uuid) > (?1, ?2) ORDER BY entity, uuid LIMIT ?3"
            ))
            .and_then(|mut s| s.query_map(params![entity, uuid, limit], read)?.collect()),
        None => conn
            .prepare_cached(&format!("{COLS} ORDER BY entity, uuid LIMIT ?1"))
            .and_then(|mut s| s.query_map(params![limit], read)?.collect()),
    }
    .map_err(sql("publication::page"))
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
    // One pass over the pair's counters in uuid order (the unique index
    // starts with entity, action, uuid, so the groups stream without a
    // sort); only the best `size` groups are sorted. The publication day
    // floors a positive time (after 2008 when set, inside the retention
    // for a first touch), so `/` floors.
    const PUB: &str = "coalesce(t.published_ms, c.first_ts)";
    let total = if exact {
        split_sum("sum(b.value >> 32)", "sum(b.value & 4294967295)", "")
    } else {
        "sum(b.value) AS total".to_string()
    };
    let order = if exact {
        "hi DESC, lo DESC"
    } else {
        "total DESC"
    };
    let sql = format!(
        "SELECT c.uuid, c.category, {PUB}, t.published_ms IS NOT NULL, {total}
         FROM counters c LEFT JOIN targets t ON t.entity = c.entity AND t.uuid = c.uuid
         JOIN buckets b INDEXED BY buckets_by_counter ON b.cid = c.cid
           AND b.day BETWEEN max({PUB} / 86400000, ?5) AND {PUB} / 86400000 + ?4 - 1
         WHERE c.entity = ?1 AND c.action = ?2 AND (?3 IS NULL OR c.category = ?3)
         GROUP BY c.uuid ORDER BY {order}, c.uuid LIMIT ?6"
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
