//! Kept totals over the first N days from publication, for the N the store
//! is told to keep (`--milestone-days`, [`DEFAULT_KEPT`] until told), so a
//! `first_<N>_days` list of those N is a walk of `size` rows of an index
//! instead of a pass over every counter of the pair (`publication::top`,
//! which other N still use).
//!
//! Why this shape:
//! - One row per counter and kept N with a bucket inside the counter's own
//!   window `[P, P + N - 1]` (P its publication day, `pday`): the total in
//!   two integers (`hi · 2^62 + lo`, as the named windows keep theirs,
//!   exact past i64), and `nb`, how many buckets are inside, so a counter
//!   whose buckets there sum to 0 is still listed, as the statement lists it,
//!   and one whose last bucket there went is not.
//! - Kept by triggers on `buckets`, `counters` and `targets`, in the
//!   statement that changes what a total reads: every path that writes
//!   buckets (a flush's new and direct counters, the fold of the change
//!   log, backfills and `set_days`, imports, retention, deletes) keeps the
//!   totals exact without knowing of them. A bucket adds or takes its value
//!   from the rows whose window holds its day; a publication that moves to
//!   another day (a `targets` row set, moved or cleared; a first touch
//!   moved earlier by a backdated event, for a target without one) has the
//!   target's rows summed again from its buckets. Measured cost on the
//!   write path: `scripts/bench/README.md` ("Milestones").
//! - Days that leave the retention: a list reads no bucket before the
//!   oldest day kept (`FirstDaysQuery::oldest_day`), as the statement and
//!   Elasticsearch do. Rows whose window lies wholly after it are read as
//!   kept; the few counters whose window straddles it (published in the
//!   N - 1 days before it) are summed from their buckets over the kept
//!   part (an index on `pday` finds them); rows whose window ended before
//!   it are skipped. The background's deletion of old buckets then only
//!   brings the rows to what the lists already answer.
//! - The kept N are rows of `first_days_n`; a different set at start-up
//!   rebuilds every row from the buckets, once (as does the upgrade to
//!   schema 9).

use rusqlite::{params, Connection, TransactionBehavior};

use super::sql;
use super::windows::{join, split_sum};
use crate::store::{FirstDaysEntry, FirstDaysQuery, StoreError};

/// The N kept until `--milestone-days` says otherwise.
pub(super) const DEFAULT_KEPT: [u32; 3] = crate::domain::milestone::DEFAULT_KEPT_DAYS;

/// 2^62 - 1: the mask of a total's `lo`.
const M: &str = "4611686018427387903";

/// The publication day of counter `c` (a `counters` row): the set time, else
/// its first touch. Both are after 1970, so `/` floors.
fn pub_day(c: &str) -> String {
    format!(
        "coalesce((SELECT t.published_ms FROM targets t
                   WHERE t.entity = {c}.entity AND t.uuid = {c}.uuid), {c}.first_ts) / 86400000"
    )
}

/// Rows summed again from `buckets` for the counters `counters` selects
/// (a condition on `c`, a `counters` row): after deleting theirs.
fn recompute(cond: &str) -> String {
    let pday = pub_day("c");
    let sums = split_sum("sum(b.value >> 32)", "sum(b.value & 4294967295)", "");
    format!(
        "DELETE FROM first_days WHERE cid IN (SELECT c.cid FROM counters c WHERE {cond});
         INSERT INTO first_days (cid, n, entity, action, uuid, category, pday, hi, lo, nb)
         SELECT x.cid, m.n, x.entity, x.action, x.uuid, x.category, x.pday, {sums}, count(*)
         FROM (SELECT c.cid, c.entity, c.action, c.uuid, c.category, {pday} AS pday
               FROM counters c WHERE {cond}) x
         JOIN first_days_n m
         JOIN buckets b INDEXED BY buckets_by_counter
           ON b.cid = x.cid AND b.day >= x.pday AND b.day < x.pday + m.n
         GROUP BY x.cid, m.n;"
    )
}

/// Schema 9: the kept N, the totals, their indexes and the triggers that
/// keep them.
pub(super) fn schema() -> String {
    let pday = pub_day("c");
    let on_target = recompute("c.entity = new.entity AND c.uuid = new.uuid");
    let on_cleared = recompute("c.entity = old.entity AND c.uuid = old.uuid");
    let on_counter = recompute("c.cid = new.cid");
    format!(
        "CREATE TABLE IF NOT EXISTS first_days_n (n INTEGER PRIMARY KEY);
         CREATE TABLE IF NOT EXISTS first_days (
             cid      INTEGER NOT NULL,
             n        INTEGER NOT NULL,
             entity   TEXT    NOT NULL,
             action   TEXT    NOT NULL,
             uuid     TEXT    NOT NULL,
             category TEXT,
             pday     INTEGER NOT NULL,
             hi       INTEGER NOT NULL,
             lo       INTEGER NOT NULL,
             nb       INTEGER NOT NULL,
             PRIMARY KEY (cid, n)
         ) WITHOUT ROWID;
         CREATE INDEX IF NOT EXISTS first_days_top
             ON first_days (entity, action, n, hi DESC, lo DESC, uuid) WHERE nb > 0;
         CREATE INDEX IF NOT EXISTS first_days_by_day
             ON first_days (entity, action, n, pday) WHERE nb > 0;

         CREATE TRIGGER IF NOT EXISTS first_days_bucket_in AFTER INSERT ON buckets BEGIN
             INSERT INTO first_days (cid, n, entity, action, uuid, category, pday, hi, lo, nb)
             SELECT x.cid, m.n, x.entity, x.action, x.uuid, x.category, x.pday,
                    new.value >> 62, new.value & {M}, 1
             FROM (SELECT c.cid, c.entity, c.action, c.uuid, c.category, {pday} AS pday
                   FROM counters c WHERE c.cid = new.cid) x
             JOIN first_days_n m ON new.day >= x.pday AND new.day < x.pday + m.n
             WHERE true
             ON CONFLICT (cid, n) DO UPDATE SET
                 hi = hi + excluded.hi + ((lo + excluded.lo) >> 62),
                 lo = (lo + excluded.lo) & {M},
                 nb = nb + 1;
         END;
         CREATE TRIGGER IF NOT EXISTS first_days_bucket_up AFTER UPDATE OF value ON buckets
         WHEN new.value IS NOT old.value BEGIN
             UPDATE first_days SET
                 hi = hi - (old.value >> 62) + (new.value >> 62)
                      + ((lo - (old.value & {M}) + (new.value & {M})) >> 62),
                 lo = (lo - (old.value & {M}) + (new.value & {M})) & {M}
             WHERE cid = new.cid AND new.day >= pday AND new.day < pday + n;
         END;
         CREATE TRIGGER IF NOT EXISTS first_days_bucket_out AFTER DELETE ON buckets BEGIN
             UPDATE first_days SET
                 hi = hi - (old.value >> 62) + ((lo - (old.value & {M})) >> 62),
                 lo = (lo - (old.value & {M})) & {M},
                 nb = nb - 1
             WHERE cid = old.cid AND old.day >= pday AND old.day < pday + n;
         END;
         CREATE TRIGGER IF NOT EXISTS first_days_counter_out AFTER DELETE ON counters BEGIN
             DELETE FROM first_days WHERE cid = old.cid;
         END;
         CREATE TRIGGER IF NOT EXISTS first_days_category AFTER UPDATE OF category ON counters
         WHEN new.category IS NOT old.category BEGIN
             UPDATE first_days SET category = new.category WHERE cid = new.cid;
         END;
         CREATE TRIGGER IF NOT EXISTS first_days_first_touch AFTER UPDATE OF first_ts ON counters
         WHEN new.first_ts / 86400000 <> old.first_ts / 86400000
          AND NOT EXISTS (SELECT 1 FROM targets WHERE entity = new.entity AND uuid = new.uuid)
         BEGIN {on_counter} END;
         CREATE TRIGGER IF NOT EXISTS first_days_target_in AFTER INSERT ON targets BEGIN
             {on_target}
         END;
         CREATE TRIGGER IF NOT EXISTS first_days_target_up AFTER UPDATE OF published_ms ON targets
         WHEN new.published_ms / 86400000 <> old.published_ms / 86400000 BEGIN
             {on_target}
         END;
         CREATE TRIGGER IF NOT EXISTS first_days_target_out AFTER DELETE ON targets BEGIN
             {on_cleared}
         END;"
    )
}

/// The kept N, ascending.
pub(super) fn kept(conn: &Connection) -> Result<Vec<u32>, StoreError> {
    conn.prepare_cached("SELECT n FROM first_days_n ORDER BY n")
        .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
        .map_err(sql("firstdays::kept"))
}

/// Makes `days` the kept N (sorted, distinct): when they differ from those
/// kept, every row is summed again from the buckets, in one transaction of
/// `conn`'s (the caller's). Returns whether it rebuilt.
pub(super) fn keep(conn: &Connection, days: &[u32]) -> Result<bool, StoreError> {
    let mut want: Vec<u32> = days.to_vec();
    want.sort_unstable();
    want.dedup();
    if kept(conn)? == want {
        return Ok(false);
    }
    conn.execute("DELETE FROM first_days_n", [])
        .map_err(sql("firstdays::keep"))?;
    {
        let mut put = conn
            .prepare_cached("INSERT INTO first_days_n (n) VALUES (?1)")
            .map_err(sql("firstdays::keep"))?;
        for n in &want {
            put.execute([n]).map_err(sql("firstdays::keep"))?;
        }
    }
    rebuild(conn)?;
    Ok(true)
}

/// Every row summed again from the buckets.
pub(super) fn rebuild(conn: &Connection) -> Result<(), StoreError> {
    conn.execute("DELETE FROM first_days", [])
        .map_err(sql("firstdays::rebuild"))?;
    let pday = pub_day("c");
    let sums = split_sum("sum(b.value >> 32)", "sum(b.value & 4294967295)", "");
    conn.execute(
        &format!(
            "INSERT INTO first_days (cid, n, entity, action, uuid, category, pday, hi, lo, nb)
             SELECT x.cid, m.n, x.entity, x.action, x.uuid, x.category, x.pday, {sums}, count(*)
             FROM (SELECT c.cid, c.entity, c.action, c.uuid, c.category, {pday} AS pday
                   FROM counters c) x
             JOIN first_days_n m
             JOIN buckets b INDEXED BY buckets_by_counter
               ON b.cid = x.cid AND b.day >= x.pday AND b.day < x.pday + m.n
             GROUP BY x.cid, m.n"
        ),
        [],
    )
    .map_err(sql("firstdays::rebuild"))?;
    Ok(())
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

/// The list from the kept rows, or `None` when `q.days` is not kept. Rows
/// must be current: the caller folds the change log first.
pub(super) fn top(
    conn: &Connection,
    q: &FirstDaysQuery,
) -> Result<Option<Vec<FirstDaysEntry>>, StoreError> {
    let n = i64::from(q.days);
    let is_kept: bool = conn
        .prepare_cached("SELECT EXISTS (SELECT 1 FROM first_days_n WHERE n = ?1)")
        .and_then(|mut s| s.query_row([n], |r| r.get(0)))
        .map_err(sql("firstdays::top"))?;
    if !is_kept {
        return Ok(None);
    }
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
            "SELECT f.uuid, f.category, c.first_ts, t.published_ms, f.hi, f.lo
             FROM first_days f INDEXED BY first_days_top
             JOIN counters c ON c.cid = f.cid
             LEFT JOIN targets t ON t.entity = f.entity AND t.uuid = f.uuid
             WHERE f.entity = ?1 AND f.action = ?2 AND f.n = ?3 AND f.nb > 0
               AND f.pday >= ?4 AND (?5 IS NULL OR f.category = ?5)
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
            "SELECT f.uuid, f.category, c.first_ts, t.published_ms, {sums}
             FROM first_days f INDEXED BY first_days_by_day
             JOIN counters c ON c.cid = f.cid
             LEFT JOIN targets t ON t.entity = f.entity AND t.uuid = f.uuid
             JOIN buckets b INDEXED BY buckets_by_counter
               ON b.cid = f.cid AND b.day >= ?4 AND b.day < f.pday + ?3
             WHERE f.entity = ?1 AND f.action = ?2 AND f.n = ?3 AND f.nb > 0
               AND f.pday > ?4 - ?3 AND f.pday < ?4 AND (?5 IS NULL OR f.category = ?5)
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
    Ok(Some(out))
}
