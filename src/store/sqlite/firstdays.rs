//! Kept totals over the first N days from publication, for the N the store
//! is told to keep (`--milestone-days`, [`DEFAULT_KEPT`] until told), so a
//! `first_<N>_days` list of those N is a walk of `size` rows of an index
//! instead of a pass over every counter of the pair (`publication::top`,
//! which other N still use).
//!
//! Why this shape:
//! - One row per counter and kept N that has a bucket inside the counter's
//!   own window `[P, P + N - 1]` (P its publication day, `pday`): the total
//!   in two integers (`hi · 2^62 + lo`, as the named windows keep theirs,
//!   exact past i64). A row exists exactly when the summed statement would
//!   list the counter (a bucket there, whatever it sums to).
//! - Kept by this module's Rust, called by each statement's owner, not by
//!   SQLite triggers: triggers are schema, parsed into every connection of
//!   every open store, and cost a thousand open tenants 90 MiB (the first
//!   attempt, taken back). The schema is one table and two indexes.
//! - The hot path, the fold of the change log (`fold`), adds each counter's
//!   deltas of a pass whose day is inside a window to that window's row:
//!   one upsert per row and chunk, not per bucket. Everything else
//!   ([`recompute`]) sums the counter's rows again from its buckets in the
//!   writer's transaction: new counters of a flush and direct writes (a
//!   handful of buckets each), publications set, moved or cleared, a first
//!   touch moved to an earlier day, backfills and `set_days`, imports,
//!   deletes and the retention's deletes.
//! - Days that leave the retention: a list reads no bucket before the
//!   oldest day kept (`FirstDaysQuery::oldest_day`), as the statement and
//!   Elasticsearch do. Rows whose window lies wholly after it are read as
//!   kept; the few counters whose window straddles it (published in the
//!   N - 1 days before it) are summed from their buckets over the kept
//!   part (an index on `pday` finds them); rows whose window ended before
//!   it are skipped.
//! - The kept N are rows of counter 0 (no counter has that id): a set that
//!   differs at start-up rebuilds every row from the buckets, once.
//! - Created only when needed: by the first `first_<N>_days` list of an N
//!   the store is to keep in a store of at most [`LAZY_BUILD_MAX_COUNTERS`]
//!   counters, or at start-up when `--milestone-days` is given.
//!   A store that never lists them pays nothing, neither on its writes nor
//!   in the memory every connection holds for the schema (2.1 KiB each,
//!   and the cached statements of the write paths below), which the bound
//!   of 1,000 open tenants (`tests/tenant_bounds.rs`) has no room for.

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use super::sql;
use super::windows::{join, split_sum};
use crate::store::{FirstDaysEntry, FirstDaysQuery, StoreError};

/// The most counters a store may have for its first `first_<N>_days` list
/// to build the kept totals: the build holds the writer in one transaction
/// (about 25 s a million counters measured, so a pause of a few tenths of a
/// second here), which a read must not impose on a large store's writes.
/// A larger store lists by summing until it is opened with
/// `--milestone-days`, which builds them at open.
pub(super) const LAZY_BUILD_MAX_COUNTERS: i64 = 20_000;

/// The N kept until `--milestone-days` says otherwise.
pub(super) const DEFAULT_KEPT: [u32; 3] = crate::domain::milestone::DEFAULT_KEPT_DAYS;

const DAY_MS: i64 = 86_400_000;

/// 2^62 - 1: the mask of a total's `lo`.
const M: i128 = (1 << 62) - 1;

pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS first_days (
    cid    INTEGER NOT NULL,
    n      INTEGER NOT NULL,
    entity TEXT    NOT NULL,
    action TEXT    NOT NULL,
    uuid   TEXT    NOT NULL,
    pday   INTEGER NOT NULL,
    hi     INTEGER NOT NULL,
    lo     INTEGER NOT NULL,
    PRIMARY KEY (cid, n)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS first_days_top
    ON first_days (entity, action, n, hi DESC, lo DESC, uuid);
CREATE INDEX IF NOT EXISTS first_days_by_day
    ON first_days (entity, action, n, pday);
";

/// A total as `(hi, lo)`: `hi · 2^62 + lo`, `0 <= lo < 2^62`.
fn split(v: i128) -> (i64, i64) {
    ((v >> 62) as i64, (v & M) as i64)
}

/// The publication day of a counter: the target's time when set, else the
/// counter's first touch. Both are after 1970, so `/` floors.
fn day_of(published: Option<i64>, first_ts: i64) -> i64 {
    published.unwrap_or(first_ts) / DAY_MS
}

/// What a counter's rows are keyed and placed by.
pub(super) struct Target {
    pub entity: String,
    pub action: String,
    pub uuid: String,
    pub first_ts: i64,
    pub published: Option<i64>,
}

impl Target {
    pub fn pday(&self) -> i64 {
        day_of(self.published, self.first_ts)
    }
}

/// The counter `cid` as its rows need it; `None` when it is gone.
pub(super) fn target(conn: &Connection, cid: i64) -> Result<Option<Target>, StoreError> {
    conn.prepare_cached(
        "SELECT c.entity, c.action, c.uuid, c.first_ts, t.published_ms
         FROM counters c LEFT JOIN targets t ON t.entity = c.entity AND t.uuid = c.uuid
         WHERE c.cid = ?1",
    )
    .and_then(|mut s| {
        s.query_row([cid], |r| {
            Ok(Target {
                entity: r.get(0)?,
                action: r.get(1)?,
                uuid: r.get(2)?,
                first_ts: r.get(3)?,
                published: r.get(4)?,
            })
        })
        .optional()
    })
    .map_err(sql("firstdays::target"))
}

/// Drops what schema 9 (the kept totals of triggers, taken back) left:
/// its triggers, its table of kept N and its totals, which this build
/// builds again when it needs them.
pub(super) fn drop_triggered(conn: &Connection) -> Result<(), StoreError> {
    let triggers: Vec<String> = conn
        .prepare(
            "SELECT name FROM sqlite_master WHERE type = 'trigger' AND name LIKE 'first_days%'",
        )
        .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
        .map_err(sql("firstdays::drop_triggered"))?;
    for t in triggers {
        conn.execute_batch(&format!("DROP TRIGGER \"{t}\""))
            .map_err(sql("firstdays::drop_triggered"))?;
    }
    conn.execute_batch("DROP TABLE IF EXISTS first_days_n; DROP TABLE IF EXISTS first_days;")
        .map_err(sql("firstdays::drop_triggered"))
}

/// Whether the store keeps totals at all (the table exists).
pub(super) fn exists(conn: &Connection) -> Result<bool, StoreError> {
    conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'first_days')",
        [],
        |r| r.get(0),
    )
    .map_err(sql("firstdays::exists"))
}

/// The kept N, ascending (none when the table is new or absent).
pub(super) fn kept(conn: &Connection) -> Result<Vec<u32>, StoreError> {
    if !exists(conn)? {
        return Ok(Vec::new());
    }
    // Not cached: read at open and when the set changes, and a cached
    // statement is memory every open store keeps.
    conn.prepare("SELECT n FROM first_days WHERE cid = 0 ORDER BY n")
        .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
        .map_err(sql("firstdays::kept"))
}

/// Makes `days` the kept N (sorted, distinct), creating the table when
/// missing: when they differ from those kept, every row is summed again
/// from the buckets, in `conn`'s transaction (the caller's). Returns
/// whether it rebuilt.
pub(super) fn keep(conn: &Connection, days: &[u32]) -> Result<bool, StoreError> {
    conn.execute_batch(SCHEMA).map_err(sql("firstdays::keep"))?;
    let mut want: Vec<u32> = days.to_vec();
    want.sort_unstable();
    want.dedup();
    if kept(conn)? == want {
        return Ok(false);
    }
    conn.execute("DELETE FROM first_days", [])
        .map_err(sql("firstdays::keep"))?;
    let sums = split_sum("sum(b.value >> 32)", "sum(b.value & 4294967295)", "");
    let mut build = conn
        .prepare(&format!(
            "INSERT INTO first_days (cid, n, entity, action, uuid, pday, hi, lo)
             SELECT x.cid, ?1, x.entity, x.action, x.uuid, x.pday, {sums}
             FROM (SELECT c.cid, c.entity, c.action, c.uuid,
                          coalesce(t.published_ms, c.first_ts) / 86400000 AS pday
                   FROM counters c
                   LEFT JOIN targets t ON t.entity = c.entity AND t.uuid = c.uuid) x
             JOIN buckets b INDEXED BY buckets_by_counter
               ON b.cid = x.cid AND b.day >= x.pday AND b.day < x.pday + ?1
             GROUP BY x.cid"
        ))
        .map_err(sql("firstdays::keep"))?;
    let mut mark = conn
        .prepare(
            "INSERT INTO first_days (cid, n, entity, action, uuid, pday, hi, lo)
             VALUES (0, ?1, '', '', '', 0, 0, 0)",
        )
        .map_err(sql("firstdays::keep"))?;
    for n in &want {
        build.execute([n]).map_err(sql("firstdays::keep"))?;
        mark.execute([n]).map_err(sql("firstdays::keep"))?;
    }
    Ok(true)
}

/// [`keep`] in a transaction of its own on the writer's connection.
pub(super) fn keep_now(conn: &mut Connection, days: &[u32]) -> Result<bool, StoreError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(sql("firstdays::keep_now"))?;
    let rebuilt = keep(&tx, days)?;
    tx.commit().map_err(sql("firstdays::keep_now"))?;
    Ok(rebuilt)
}

/// Sums the rows of counter `cid` again from its buckets (deleting those
/// left without a bucket in their window): after anything but the fold
/// changed its buckets, its first touch or its target's publication.
pub(super) fn recompute(conn: &Connection, kept: &[u32], cid: i64) -> Result<(), StoreError> {
    if kept.is_empty() {
        return Ok(());
    }
    conn.prepare_cached("DELETE FROM first_days WHERE cid = ?1")
        .and_then(|mut s| s.execute([cid]))
        .map_err(sql("firstdays::recompute"))?;
    let Some(t) = target(conn, cid)? else {
        return Ok(());
    };
    let pday = t.pday();
    let longest = i64::from(kept.iter().copied().max().unwrap_or(0));
    let days: Vec<(i64, i64)> = conn
        .prepare_cached(
            "SELECT day, value FROM buckets INDEXED BY buckets_by_counter
             WHERE cid = ?1 AND day >= ?2 AND day < ?3",
        )
        .and_then(|mut s| {
            s.query_map(params![cid, pday, pday + longest], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })?
            .collect()
        })
        .map_err(sql("firstdays::recompute"))?;
    put_rows(conn, kept, cid, &t, &days)
}

/// The sum of the `days` (day, value) inside the window `[pday, pday + n - 1]`;
/// `None` when none is (the counter has no row for that N), even if they
/// would sum to 0.
fn window_sum<V: Copy + Into<i128>>(days: &[(i64, V)], pday: i64, n: u32) -> Option<i128> {
    let end = pday + i64::from(n);
    let mut inside = days
        .iter()
        .filter(|(d, _)| *d >= pday && *d < end)
        .peekable();
    inside.peek()?;
    Some(inside.map(|(_, v)| (*v).into()).sum())
}

/// Writes counter `cid`'s row for each kept N whose window `[P, P + N - 1]`
/// holds a day of `days` (day, value), with the sum of those days.
fn put_rows(
    conn: &Connection,
    kept: &[u32],
    cid: i64,
    t: &Target,
    days: &[(i64, i64)],
) -> Result<(), StoreError> {
    let pday = t.pday();
    let mut put = Upsert::prepare(conn)?;
    for &n in kept {
        if let Some(total) = window_sum(days, pday, n) {
            put.add(cid, n, t, pday, total)?;
        }
    }
    Ok(())
}

/// The rows of a counter a flush creates with its buckets `days` (day,
/// value): no row of it exists, its first touch is `first_ms`.
pub(super) fn new_counter(
    conn: &Connection,
    kept: &[u32],
    cid: i64,
    key: &crate::domain::CounterKey,
    first_ms: i64,
    days: &[(i64, i64)],
) -> Result<(), StoreError> {
    if kept.is_empty() {
        return Ok(());
    }
    let published: Option<i64> = conn
        .prepare_cached("SELECT published_ms FROM targets WHERE entity = ?1 AND uuid = ?2")
        .and_then(|mut s| {
            s.query_row(params![&*key.entity, &*key.uuid], |r| r.get(0))
                .optional()
        })
        .map_err(sql("firstdays::new_counter"))?;
    let t = Target {
        entity: key.entity.to_string(),
        action: key.action.to_string(),
        uuid: key.uuid.to_string(),
        first_ts: first_ms,
        published,
    };
    put_rows(conn, kept, cid, &t, days)
}

/// [`recompute`] for every counter of the target (entity, uuid): its
/// publication was set, moved or cleared.
pub(super) fn recompute_target(
    conn: &Connection,
    kept: &[u32],
    entity: &str,
    uuid: &str,
) -> Result<(), StoreError> {
    if kept.is_empty() {
        return Ok(());
    }
    let cids: Vec<i64> = conn
        .prepare_cached("SELECT cid FROM counters WHERE entity = ?1 AND uuid = ?2")
        .and_then(|mut s| s.query_map(params![entity, uuid], |r| r.get(0))?.collect())
        .map_err(sql("firstdays::recompute_target"))?;
    for cid in cids {
        recompute(conn, kept, cid)?;
    }
    Ok(())
}

/// Whether a bucket of `day` lies inside a window of one of the rows of
/// `cid`: what a deleted bucket must have for the rows to change.
pub(super) fn in_a_window(conn: &Connection, cid: i64, day: i64) -> Result<bool, StoreError> {
    conn.prepare_cached(
        "SELECT EXISTS (SELECT 1 FROM first_days
                        WHERE cid = ?1 AND pday <= ?2 AND ?2 < pday + n)",
    )
    .and_then(|mut s| s.query_row(params![cid, day], |r| r.get(0)))
    .map_err(sql("firstdays::in_a_window"))
}

/// The statement that adds to a row, creating it at its first bucket.
pub(super) struct Upsert<'c>(rusqlite::CachedStatement<'c>);

impl<'c> Upsert<'c> {
    pub fn prepare(conn: &'c Connection) -> Result<Upsert<'c>, StoreError> {
        conn.prepare_cached(
            "INSERT INTO first_days (cid, n, entity, action, uuid, pday, hi, lo)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
             ON CONFLICT (cid, n) DO UPDATE SET
                 hi = hi + excluded.hi + ((lo + excluded.lo) >> 62),
                 lo = (lo + excluded.lo) & 4611686018427387903",
        )
        .map(Upsert)
        .map_err(sql("firstdays::upsert"))
    }

    /// Adds `delta` to the row (cid, n) of window day `pday`.
    pub fn add(
        &mut self,
        cid: i64,
        n: u32,
        t: &Target,
        pday: i64,
        delta: i128,
    ) -> Result<(), StoreError> {
        let (hi, lo) = split(delta);
        self.0
            .execute(params![cid, n, t.entity, t.action, t.uuid, pday, hi, lo])
            .map_err(sql("firstdays::upsert"))?;
        Ok(())
    }
}

/// The fold's part for one counter, after its buckets were brought up to
/// date: `before` is the counter as it was before the pass's chunk,
/// `first_ms` the pass's first touch, `days` its deltas per day.
pub(super) fn fold(
    conn: &Connection,
    put: &mut Upsert<'_>,
    kept: &[u32],
    cid: i64,
    before: &Target,
    first_ms: i64,
    days: &[(i64, i128)],
) -> Result<(), StoreError> {
    let pday = before.pday();
    if day_of(before.published, before.first_ts.min(first_ms)) != pday {
        // A backdated event moved the first touch, and with it every window.
        return recompute(conn, kept, cid);
    }
    for &n in kept {
        if let Some(delta) = window_sum(days, pday, n) {
            put.add(cid, n, before, pday, delta)?;
        }
    }
    Ok(())
}

/// The list from the kept rows, for a `q.days` the store keeps. Rows must
/// be current: the caller folds the change log first.
pub(super) fn top(
    conn: &Connection,
    q: &FirstDaysQuery,
) -> Result<Vec<FirstDaysEntry>, StoreError> {
    let n = i64::from(q.days);
    let size = i64::try_from(q.size).unwrap_or(i64::MAX);
    let read = |r: &rusqlite::Row<'_>| -> rusqlite::Result<FirstDaysEntry> {
        let published: Option<i64> = r.get(3)?;
        Ok(FirstDaysEntry {
            uuid: r.get(0)?,
            category: r.get(1)?,
            published_ms: published.map_or_else(|| r.get(2), Ok)?,
            published_set: published.is_some(),
            value: join(r.get(4)?, r.get(5)?),
        })
    };
    // The rows whose window the retention has not reached: an index walk
    // of at most `size` rows past those of older publications.
    let mut out: Vec<FirstDaysEntry> = conn
        .prepare_cached(
            "SELECT f.uuid, c.category, c.first_ts, t.published_ms, f.hi, f.lo
             FROM first_days f INDEXED BY first_days_top
             JOIN counters c ON c.cid = f.cid
             LEFT JOIN targets t ON t.entity = f.entity AND t.uuid = f.uuid
             WHERE f.entity = ?1 AND f.action = ?2 AND f.n = ?3
               AND f.pday >= ?4 AND (?5 IS NULL OR c.category = ?5)
             ORDER BY f.hi DESC, f.lo DESC, f.uuid LIMIT ?6",
        )
        .and_then(|mut s| {
            s.query_map(
                params![q.entity, q.action, n, q.oldest_day, q.category, size],
                read,
            )?
            .collect()
        })
        .map_err(sql("firstdays::top"))?;
    // The counters whose window straddles the oldest day kept: summed from
    // their buckets over the days still kept.
    let sums = split_sum("sum(b.value >> 32)", "sum(b.value & 4294967295)", "");
    let straddling: Vec<FirstDaysEntry> = conn
        .prepare_cached(&format!(
            "SELECT f.uuid, c.category, c.first_ts, t.published_ms, {sums}
             FROM first_days f INDEXED BY first_days_by_day
             JOIN counters c ON c.cid = f.cid
             LEFT JOIN targets t ON t.entity = f.entity AND t.uuid = f.uuid
             JOIN buckets b INDEXED BY buckets_by_counter
               ON b.cid = f.cid AND b.day >= ?4 AND b.day < f.pday + ?3
             WHERE f.entity = ?1 AND f.action = ?2 AND f.n = ?3
               AND f.pday > ?4 - ?3 AND f.pday < ?4 AND (?5 IS NULL OR c.category = ?5)
             GROUP BY f.cid ORDER BY hi DESC, lo DESC, f.uuid LIMIT ?6"
        ))
        .and_then(|mut s| {
            s.query_map(
                params![q.entity, q.action, n, q.oldest_day, q.category, size],
                read,
            )?
            .collect()
        })
        .map_err(sql("firstdays::top"))?;
    if !straddling.is_empty() {
        out.extend(straddling);
        out.sort_by(|a, b| b.value.cmp(&a.value).then_with(|| a.uuid.cmp(&b.uuid)));
        out.truncate(q.size);
    }
    Ok(out)
}

/// Asserts every row equals its counter's buckets summed again (values
/// within i64): the unit tests' check of the write paths.
#[cfg(test)]
pub(super) fn assert_exact(conn: &Connection) {
    let want = "SELECT c.cid, k.n, x.pday, sum(b.value)
        FROM counters c
        JOIN (SELECT c2.cid, coalesce(t.published_ms, c2.first_ts) / 86400000 AS pday
              FROM counters c2
              LEFT JOIN targets t ON t.entity = c2.entity AND t.uuid = c2.uuid) x
          ON x.cid = c.cid
        JOIN (SELECT n FROM first_days WHERE cid = 0) k
        JOIN buckets b ON b.cid = c.cid AND b.day >= x.pday AND b.day < x.pday + k.n
        GROUP BY c.cid, k.n";
    let got = "SELECT cid, n, pday, (hi << 62) + lo FROM first_days WHERE cid <> 0";
    for (a, b) in [(want, got), (got, want)] {
        let n: i64 = conn
            .query_row(&format!("SELECT count(*) FROM ({a} EXCEPT {b})"), [], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(n, 0, "rows of `{a}` missing from `{b}`");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SQLite's memory for the parsed schema of a connection (what every
    /// connection of every open store holds).
    fn schema_bytes(conn: &Connection) -> i64 {
        conn.query_row("SELECT count(*) FROM sqlite_master", [], |r| {
            r.get::<_, i64>(0)
        })
        .unwrap();
        let (mut cur, mut high) = (0, 0);
        // SAFETY: a valid open handle and two out-pointers.
        let rc = unsafe {
            rusqlite::ffi::sqlite3_db_status(
                conn.handle(),
                rusqlite::ffi::SQLITE_DBSTATUS_SCHEMA_USED,
                &mut cur,
                &mut high,
                0,
            )
        };
        assert_eq!(rc, 0);
        i64::from(cur)
    }

    /// The kept totals' schema (one table, two indexes) is a few KiB of
    /// each connection's parsed schema, not the 90 KiB the triggers of the
    /// first attempt cost; printed for `src/store/README.md`.
    #[test]
    fn the_kept_totals_cost_each_connection_a_few_kib_of_schema() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.sqlite3");
        let mut w = super::super::connections::open_writer(&path).unwrap();
        super::super::schema::migrate(&mut w, &path, 20_000).unwrap();
        keep(&w, &DEFAULT_KEPT).unwrap();
        drop(w);
        let with = schema_bytes(&Connection::open(&path).unwrap());
        Connection::open(&path)
            .unwrap()
            .execute_batch("DROP TABLE first_days")
            .unwrap();
        let without = schema_bytes(&Connection::open(&path).unwrap());
        println!("schema per connection: {without} bytes without the kept totals, {with} with");
        assert!(with > without, "{with} {without}");
        assert!(with - without < 8 * 1024, "{with} {without}");
    }

    #[test]
    fn split_and_join_agree_past_i64() {
        for v in [
            0i128,
            1,
            -1,
            i128::from(i64::MAX) * 3,
            i128::from(i64::MIN) * 5 + 7,
        ] {
            let (hi, lo) = split(v);
            assert!((0..1 << 62).contains(&lo));
            assert_eq!(join(hi, lo), v);
        }
    }
}
