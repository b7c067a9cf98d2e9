//! The embedded store's schema and its migrations: the tables of
//! `counters`, `buckets`, idempotency ids and the change log, with those of
//! the other modules (`queries`, `windows`, `marks`), created or brought up
//! to date in one transaction when a store opens.

use std::path::Path;

use rusqlite::{Connection, TransactionBehavior};

use super::{countapi, firstdays, hours, marks, publication, queries, sql, windows};
use crate::store::StoreError;

/// 2: indexes for top lists and reports, average counters (`queries::SCHEMA_V2`).
/// 3: totals of the named rolling windows and their change log,
/// back-filled from `buckets` at open.
/// 4: those totals exact past i64 (`window_sums`); version 3's are rebuilt.
/// 5: the change log of flushes (`counter_log`, `fold_state`): an older
/// build would not see the deltas it holds, so it refuses the database.
/// 6: the window totals as two tables, the windows ending today and those
/// ending tomorrow, and what memory holds of them (`windows`), rebuilt
/// from `buckets` at open; version 5's `window_sums` and `bucket_log` go.
/// 7: actor marks keyed for their tenant (`marks::note_keying`): an older
/// build would key its marks without the tenant, never matching these.
/// 8: hour buckets (`hours`), written by flushes and the fold: an older
/// build would leave them out and the hours of its days would no longer
/// sum to the days, so it refuses the database. The days before the
/// upgrade are marked as without complete hours (`hours_state`).
/// 9: the first attempt at kept first-N-days totals, kept by triggers
/// (taken back: their schema cost 1,000 open tenants 90 MiB); version 10
/// drops its triggers and tables.
/// 10: kept totals over the first N days from publication (`firstdays`),
/// kept by this build's writes once a store has them (created by the first
/// list that needs them, or at start-up with `--milestone-days`): an older
/// build would leave them behind, so it refuses the database.
/// 11: kept trending bounds (`trendkeys`), kept by this build's writes
/// once a store has them (built at start-up with `--trending-half-lives`):
/// an older build would leave them behind, so it refuses the database.
/// Nothing to migrate: a store of version 10 has none.
const SCHEMA_VERSION: i64 = 11;

pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS counters (
    cid         INTEGER PRIMARY KEY,
    entity      TEXT    NOT NULL,
    action      TEXT    NOT NULL,
    uuid        TEXT    NOT NULL,
    value       INTEGER NOT NULL,
    category    TEXT,
    first_ts    INTEGER NOT NULL,
    recorded_ts INTEGER NOT NULL,
    UNIQUE (entity, action, uuid)
);
CREATE INDEX IF NOT EXISTS counters_by_target ON counters (entity, uuid);
-- Clustered by day: a window reads only its days. The (cid, day) index serves
-- one counter's histogram and deletes; it changes only when a bucket is new.
CREATE TABLE IF NOT EXISTS buckets (
    day   INTEGER NOT NULL,
    cid   INTEGER NOT NULL,
    value INTEGER NOT NULL,
    PRIMARY KEY (day, cid)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS buckets_by_counter ON buckets (cid, day);
CREATE TABLE IF NOT EXISTS event_ids (
    id      TEXT    PRIMARY KEY,
    seen_ms INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS event_ids_by_age ON event_ids (seen_ms);
-- The deltas of each flush to counters that exist, one blob per flush
-- (`log`), until folded into `counters` and `buckets` (`fold`).
CREATE TABLE IF NOT EXISTS counter_log (
    seq     INTEGER PRIMARY KEY,
    entries BLOB    NOT NULL
);
-- A fold pass under way: its last log row and the last counter applied.
CREATE TABLE IF NOT EXISTS fold_state (
    id       INTEGER PRIMARY KEY CHECK (id = 1),
    upto     INTEGER NOT NULL,
    done_cid INTEGER NOT NULL
);
";

/// Creates what is missing of the schema on the writer connection `conn`
/// of the database at `path`, and migrates what an earlier version left
/// (`user_version` below [`SCHEMA_VERSION`]); refuses a database of a later
/// version. The version is written by [`mark_current`], once what the open
/// brings up to date (the change log folded, the window totals) is done.
pub(super) fn migrate(conn: &mut Connection, path: &Path, today: i64) -> Result<(), StoreError> {
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(sql("schema::migrate"))?;
    if version > SCHEMA_VERSION {
        return Err(StoreError::Internal(format!(
            "database schema version {version} is newer than this build understands ({SCHEMA_VERSION})"
        )));
    }
    // One transaction, not one commit per table and index: the part of
    // opening a new tenant that took longest.
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(sql("schema::migrate"))?;
    tx.execute_batch(SCHEMA).map_err(sql("schema::migrate"))?;
    tx.execute_batch(queries::SCHEMA_V2)
        .map_err(sql("schema::migrate"))?;
    if version < 6 {
        tx.execute_batch(windows::OLD_TABLES)
            .map_err(sql("schema::migrate"))?;
    }
    tx.execute_batch(&windows::schema())
        .map_err(sql("schema::migrate"))?;
    tx.execute_batch(marks::SCHEMA)
        .map_err(sql("schema::migrate"))?;
    tx.execute_batch(publication::SCHEMA)
        .map_err(sql("schema::migrate"))?;
    tx.execute_batch(countapi::SCHEMA)
        .map_err(sql("schema::migrate"))?;
    tx.execute_batch(hours::SCHEMA)
        .map_err(sql("schema::migrate"))?;
    hours::note_start(&tx, version, today)?;
    if version == 9 {
        firstdays::drop_triggered(&tx)?;
    }
    let named = marks::backfill_keys(&tx)?;
    marks::note_keying(&tx)?;
    if named > 0 {
        tracing::info!(counters = named, path = %path.display(), "named the counters of actor marks made by an earlier version");
    }
    tx.commit().map_err(sql("schema::migrate"))?;
    Ok(())
}

/// Records that the database is of this build's schema.
pub(super) fn mark_current(conn: &Connection) -> Result<(), StoreError> {
    conn.execute_batch(&format!("PRAGMA user_version = {SCHEMA_VERSION}"))
        .map_err(sql("schema::mark_current"))
}
