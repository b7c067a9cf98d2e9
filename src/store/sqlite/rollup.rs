//! Totals of the named rolling windows (`last_day`, `last_week`,
//! `last_month`, `last_year`), kept ahead of time so that their top lists are
//! an ordered index walk instead of a sum over every bucket of the window
//! (7M rows for a week of a million counters).
//!
//! Why this shape:
//! - The flush only appends one row per coalesced (counter, day) delta to
//!   `bucket_log`, at the right edge of a rowid table: a few pages per flush,
//!   so the increment path stays as cheap as before.
//! - The roll-up, run in the writer connection (so serialised with flushes),
//!   folds the log into `window_sums` in bounded steps, set-based: one
//!   statement per window sums a step's log rows per counter and upserts
//!   the sums in counter order, so a hot counter costs one index update per
//!   step, not one per flush, and no row crosses into Rust.
//! - A backlog of a bulk load is not folded: past [`REBUILD_BACKLOG`] rows
//!   (and a quarter of the year's buckets) every window is rebuilt from the
//!   buckets, the top index dropped and built again by one sort; summing a
//!   bucket costs a fraction of folding a log row into every window.
//! - When the UTC day changes each window moves by one day at a time, in
//!   chunks of counters (`window_state.cursor`): counters up to the cursor
//!   already sit at `anchor + 1`, the others at `anchor`. The day that leaves
//!   is read from `buckets` by day (a range of its primary key), a chunk at
//!   a time in three statements. A window whose every day changes
//!   (`last_day` at each midnight) is summed again instead.
//! - A counter is in a window's totals exactly when it has a bucket inside
//!   the window (today's rule of windowed lists), even when the sum is 0.
//! - A total is kept in two integers, `hi · 2^62 + lo` with `0 <= lo < 2^62`:
//!   each bucket fits i64 but a window's sum of several days need not, and
//!   an overflowing `total + x` would turn into a REAL. The pair is unique
//!   for a value, so `(hi DESC, lo DESC)` is the order of the exact sums and
//!   the top index still holds it; `lo + lo'` stays below 2^63, so the carry
//!   is computed in SQL without reading the row first.
//!
//! Every step is one transaction that leaves the tables consistent: the log
//! rows it folds are deleted in it, and a day is rolled only once the log is
//! empty, so the buckets it reads match the totals exactly.
//!
//! The retention (`first_kept_day` in `sqlite.rs`) deletes buckets older
//! than `--retention-days` (400 by default). The windows span at most 365
//! days, so that never touches a current total; it also keeps every day at
//! or after a window's start as `window_state` has it, since a roll that
//! lags behind the clock still reads the day that leaves from `buckets`.

use std::time::{Duration, Instant};

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use super::internal;
use crate::domain::{Window, NAMED_INTERVALS};
use crate::store::{StoreError, TopEntry, TopQuery};

/// Schema added in version 3, its totals split in two integers as
/// `window_sums` in version 4 (see the module documentation); [`backfill`]
/// drops version 3's `window_totals` and rebuilds.
pub(super) const SCHEMA_V3: &str = "
-- One row per coalesced (counter, day) delta of a flush, until rolled up.
CREATE TABLE IF NOT EXISTS bucket_log (
    seq   INTEGER PRIMARY KEY,
    cid   INTEGER NOT NULL,
    day   INTEGER NOT NULL,
    delta INTEGER NOT NULL
);
-- win: the window's length in days. entity/action/uuid copy the counter's
-- (immutable) key so the top index is ordered inside one pair.
-- The total is hi * 2^62 + lo, 0 <= lo < 2^62.
CREATE TABLE IF NOT EXISTS window_sums (
    win    INTEGER NOT NULL,
    cid    INTEGER NOT NULL,
    entity TEXT    NOT NULL,
    action TEXT    NOT NULL,
    uuid   TEXT    NOT NULL,
    hi     INTEGER NOT NULL,
    lo     INTEGER NOT NULL,
    PRIMARY KEY (win, cid)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS window_sums_top
    ON window_sums (win, entity, action, hi DESC, lo DESC, uuid);
-- anchor: the UTC day the window ends at; cursor > 0: a roll to anchor + 1
-- is under way and counters with cid <= cursor have moved already.
CREATE TABLE IF NOT EXISTS window_state (
    win    INTEGER PRIMARY KEY,
    anchor INTEGER NOT NULL,
    cursor INTEGER NOT NULL
);
";

/// The top index of `window_sums` (as in [`SCHEMA_V3`]), built again after
/// [`rebuild_all`].
const TOP_INDEX: &str = "CREATE INDEX IF NOT EXISTS window_sums_top
    ON window_sums (win, entity, action, hi DESC, lo DESC, uuid)";

/// Log rows or bucket rows handled by one step of a query's catch-up: about
/// a hundred milliseconds of the writer, short enough for flushes to
/// interleave, long enough to amortise a step's fixed costs.
pub(super) const QUERY_STEP_ROWS: usize = 20_000;

/// The background's steps are ten times smaller, so its time budget bounds
/// how long it holds the writer (a step is not interrupted), and with it how
/// much it takes from the flushes.
pub(super) const BACKGROUND_STEP_ROWS: usize = 2_000;

/// The low part of a kept total: `LO_BITS` bits, so two of them add
/// without leaving i64.
const LO_BITS: u32 = 62;

/// The value of a kept pair, or of the columns of [`split_sum`].
pub(super) fn join(hi: i64, lo: i64) -> i128 {
    (i128::from(hi) << LO_BITS) + i128::from(lo)
}

/// SQL for the columns `{name}hi, {name}lo` (`hi · 2^62 + lo`, [`join`]) of a sum of
/// buckets, exact past i64 where `sum()` fails: `h` and `l` name the sums
/// of the values' high and low 32-bit halves (`sum(value >> 32)`,
/// `sum(value & 4294967295)`), carried here into the pair; exact for a
/// group of fewer than 2^30 rows (one counter's days, or its log rows in one
/// step: at most a few thousand).
pub(super) fn split_sum(h: &str, l: &str, name: &str) -> String {
    format!(
        "({h} >> 30) + (((({h} & 1073741823) << 32) + {l}) >> 62) AS {name}hi,
         ((({h} & 1073741823) << 32) + {l}) & 4611686018427387903 AS {name}lo"
    )
}

/// The named windows' lengths in days.
pub(super) fn lengths() -> impl Iterator<Item = i64> {
    NAMED_INTERVALS.iter().filter_map(|(_, d)| *d)
}

/// The length of the named window `w` is, when it ends on `today`.
pub(super) fn named(w: Window, today: i64) -> Option<i64> {
    (w.to_day == today)
        .then(|| w.days())
        .filter(|d| lengths().any(|l| l == *d))
}

#[derive(Clone, Copy, Debug)]
struct State {
    len: i64,
    anchor: i64,
    cursor: i64,
}

fn load_states(conn: &Connection) -> Result<Vec<State>, StoreError> {
    let mut s = conn
        .prepare_cached("SELECT win, anchor, cursor FROM window_state ORDER BY win")
        .map_err(internal)?;
    let rows = s
        .query_map([], |r| {
            Ok(State {
                len: r.get(0)?,
                anchor: r.get(1)?,
                cursor: r.get(2)?,
            })
        })
        .map_err(internal)?;
    rows.collect::<Result<Vec<_>, _>>().map_err(internal)
}

/// Creates the totals of every named window from `buckets` when any is
/// missing (a database of schema 2, or a new one) or they are schema 3's
/// `window_totals` (one INTEGER that a sum past i64 turned into a REAL),
/// which is dropped: converting would need the buckets anyway. The log is
/// cleared: the buckets already hold every delta it could carry. One
/// transaction, so a crash leaves the old state to be converted again.
pub(super) fn backfill(conn: &mut Connection, today: i64) -> Result<(), StoreError> {
    let legacy: bool = conn
        .query_row(
            "SELECT count(*) > 0 FROM sqlite_schema WHERE type = 'table' AND name = 'window_totals'",
            [],
            |r| r.get(0),
        )
        .map_err(internal)?;
    if !legacy && load_states(conn)?.len() == lengths().count() {
        return Ok(());
    }
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(internal)?;
    tx.execute_batch(
        "DROP TABLE IF EXISTS window_totals;
         DELETE FROM bucket_log; DELETE FROM window_sums; DELETE FROM window_state;",
    )
    .map_err(internal)?;
    for len in lengths() {
        rebuild(&tx, len, today)?;
    }
    tx.commit().map_err(internal)
}

/// Recomputes one window's totals from its buckets, ending on `today`.
fn rebuild(tx: &Connection, len: i64, today: i64) -> Result<(), StoreError> {
    tx.execute("DELETE FROM window_sums WHERE win = ?1", [len])
        .map_err(internal)?;
    tx.prepare_cached(&format!(
        "INSERT INTO window_sums (win, cid, entity, action, uuid, hi, lo)
         SELECT ?1, c.cid, c.entity, c.action, c.uuid, s.hi, s.lo
         FROM (SELECT cid, {} FROM (
                   SELECT cid, sum(value >> 32) AS h, sum(value & 4294967295) AS l
                   FROM buckets WHERE day BETWEEN ?2 AND ?3 GROUP BY cid)) s
         JOIN counters c ON c.cid = s.cid",
        split_sum("h", "l", "")
    ))
    .and_then(|mut s| s.execute(params![len, today - len + 1, today]))
    .map_err(internal)?;
    tx.execute(
        "INSERT OR REPLACE INTO window_state (win, anchor, cursor) VALUES (?1, ?2, 0)",
        params![len, today],
    )
    .map_err(internal)?;
    Ok(())
}

/// Where the roll-up stands after a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Progress {
    /// The oldest log row still to fold, if any.
    pub pending_from: Option<i64>,
    /// Every window ends on `today`, no roll under way.
    pub rolled: bool,
}

impl Progress {
    /// Nothing older than `until` is left to fold and every window is rolled.
    pub fn reached(&self, until: i64) -> bool {
        self.rolled && self.pending_from.map_or(true, |s| s > until)
    }
}

/// How many log rows wait to be folded (at most; a delete leaves gaps).
pub(super) fn backlog(conn: &Connection) -> Result<i64, StoreError> {
    conn.query_row(
        "SELECT coalesce(max(seq) - min(seq) + 1, 0) FROM bucket_log",
        [],
        |r| r.get(0),
    )
    .map_err(internal)
}

/// The newest log row: what a query must see folded to be exact as of now.
pub(super) fn last_seq(conn: &Connection) -> Result<i64, StoreError> {
    conn.query_row("SELECT coalesce(max(seq), 0) FROM bucket_log", [], |r| {
        r.get(0)
    })
    .map_err(internal)
}

/// Past this many log rows, and once they are at least a quarter of the
/// year's buckets, a step rebuilds every window from the buckets instead of
/// folding: summing a bucket costs a fraction of the index update that
/// folding a log row into each window it falls in costs (measured in the
/// README), so after a bulk load the rebuild wins.
pub(super) const REBUILD_BACKLOG: i64 = 200_000;

/// Whether `day` lies in a window for counter `cid` (columns), the window's
/// state as the parameters `?2` (len), `?3` (anchor), `?4` (cursor):
/// counters up to the cursor of a roll under way end at `anchor + 1`.
const IN_WINDOW: &str = "day <= (CASE WHEN ?4 > 0 AND cid <= ?4 THEN ?3 + 1 ELSE ?3 END)
     AND day > (CASE WHEN ?4 > 0 AND cid <= ?4 THEN ?3 + 1 ELSE ?3 END) - ?2";

/// Folds the log rows up to `last` into window `s`, set-based: one
/// statement sums them per counter (in 32-bit halves, exact past i64) and
/// upserts the sums in counter order, so neighbouring updates share pages
/// and a hot counter costs one update per step, not one per flush.
fn fold(tx: &Connection, s: State, last: i64) -> Result<(), StoreError> {
    tx.prepare_cached(&format!(
        "INSERT INTO window_sums (win, cid, entity, action, uuid, hi, lo)
         SELECT ?2, c.cid, c.entity, c.action, c.uuid, s.hi, s.lo
         FROM (SELECT cid, {} FROM (
                   SELECT cid, sum(delta >> 32) AS h, sum(delta & 4294967295) AS l
                   FROM bucket_log WHERE seq <= ?1 AND {IN_WINDOW} GROUP BY cid)) s
         JOIN counters c ON c.cid = s.cid WHERE true
         ON CONFLICT (win, cid) DO UPDATE SET
             hi = hi + excluded.hi + ((lo + excluded.lo) >> 62),
             lo = (lo + excluded.lo) & 4611686018427387903",
        split_sum("h", "l", "")
    ))
    .and_then(|mut st| st.execute(params![last, s.len, s.anchor, s.cursor]))
    .map_err(internal)?;
    Ok(())
}

/// Whether the log is large enough, against the buckets a rebuild reads
/// (about the year's), that rebuilding every window is cheaper than
/// folding. The year's buckets are bounded from above without reading them:
/// the highest counter id times the days of the year that have buckets
/// (one index seek per such day), so the check costs at most 365 seeks.
fn rebuild_pays(tx: &Connection, backlog: i64, today: i64) -> Result<bool, StoreError> {
    if backlog < REBUILD_BACKLOG {
        return Ok(false);
    }
    let counters: i64 = tx
        .query_row("SELECT coalesce(max(cid), 0) FROM counters", [], |r| {
            r.get(0)
        })
        .map_err(internal)?;
    let mut next = tx
        .prepare_cached("SELECT min(day) FROM buckets WHERE day > ?1 AND day <= ?2")
        .map_err(internal)?;
    let (mut day, mut days) = (today - 365, 0i64);
    while let Some(d) = next
        .query_row(params![day, today], |r| r.get::<_, Option<i64>>(0))
        .map_err(internal)?
    {
        (day, days) = (d, days + 1);
    }
    Ok(backlog.saturating_mul(4) >= counters.saturating_mul(days))
}

/// Rebuilds every window from the buckets, ending on `today`, and empties
/// the log (the buckets hold each delta it carries). The top index is
/// dropped first and built again after: one sort instead of an insert at a
/// random place per row.
fn rebuild_all(tx: &Connection, today: i64) -> Result<(), StoreError> {
    tx.execute_batch("DELETE FROM window_sums; DROP INDEX IF EXISTS window_sums_top;")
        .map_err(internal)?;
    for len in lengths() {
        rebuild(tx, len, today)?;
    }
    tx.execute_batch(&format!("{TOP_INDEX}; DELETE FROM bucket_log;"))
        .map_err(internal)?;
    Ok(())
}

/// At most this many log rows, plus buckets of the days a roll reads, are
/// brought up to date by a query itself before it walks the totals; past
/// that it sums the window's buckets, which is exact too and costs about
/// as much as folding this many rows (measured in the README).
pub(super) const QUERY_CATCH_UP_ROWS: i64 = 3 * QUERY_STEP_ROWS as i64;

/// Whether the totals are at most [`QUERY_CATCH_UP_ROWS`] of work away
/// from today: the log rows waiting, and the buckets that rolling each
/// window to `today` reads (counted up to the bound, so this stays cheap).
pub(super) fn quick(conn: &Connection, today: i64) -> Result<bool, StoreError> {
    let tx = conn.unchecked_transaction().map_err(internal)?;
    let mut work = backlog(&tx)?;
    let mut count = tx
        .prepare_cached(
            "SELECT count(*) FROM (SELECT 1 FROM buckets
             WHERE day BETWEEN ?1 AND ?2 AND cid > ?3 LIMIT ?4)",
        )
        .map_err(internal)?;
    let mut counted = |from: i64, to: i64, after: i64, work: i64| -> Result<i64, StoreError> {
        count
            .query_row(
                params![from, to, after, QUERY_CATCH_UP_ROWS - work + 1],
                |r| r.get(0),
            )
            .map_err(internal)
    };
    for s in load_states(&tx)? {
        if work > QUERY_CATCH_UP_ROWS {
            break;
        }
        if s.anchor > today || (s.anchor == today && s.cursor == 0) {
            continue;
        }
        if s.cursor == 0 && today - s.anchor >= s.len {
            work += counted(today - s.len + 1, today, 0, work)?;
            continue;
        }
        // One roll per day moved: the day that leaves and the day that enters.
        for d in s.anchor + 1..=today {
            let after = if d == s.anchor + 1 { s.cursor } else { 0 };
            for day in [d - s.len, d] {
                if work <= QUERY_CATCH_UP_ROWS {
                    work += counted(day, day, after, work)?;
                }
            }
        }
    }
    Ok(work <= QUERY_CATCH_UP_ROWS)
}

/// One bounded step, in one transaction: folds up to `rows` log rows (or,
/// past [`REBUILD_BACKLOG`] when that is cheaper, rebuilds every window
/// from the buckets); if that empties the log, moves each window not yet
/// ending on `today` by one chunk. A clock that went back (`today`
/// before an anchor) moves nothing: queries then fall back to summing buckets.
pub(super) fn step(conn: &mut Connection, today: i64, rows: usize) -> Result<Progress, StoreError> {
    step_with(conn, today, rows, true)
}

/// [`step`], rebuilding only if `may_rebuild`: a rebuild holds the writer
/// for seconds at hundreds of thousands of counters, which flushes under
/// way must not wait for.
fn step_with(
    conn: &mut Connection,
    today: i64,
    rows: usize,
    may_rebuild: bool,
) -> Result<Progress, StoreError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(internal)?;
    let states = load_states(&tx)?;
    let (first, max): (Option<i64>, Option<i64>) = tx
        .prepare_cached("SELECT min(seq), max(seq) FROM bucket_log")
        .and_then(|mut st| st.query_row([], |r| Ok((r.get(0)?, r.get(1)?))))
        .map_err(internal)?;
    if let (Some(first), Some(max)) = (first, max) {
        let forward = states.iter().all(|s| s.anchor <= today);
        if may_rebuild && forward && rebuild_pays(&tx, max - first + 1, today)? {
            let started = Instant::now();
            rebuild_all(&tx, today)?;
            tracing::info!(
                log_rows = max - first + 1,
                ms = started.elapsed().as_millis() as u64,
                "window totals rebuilt from the buckets instead of folding a bulk backlog"
            );
            tx.commit().map_err(internal)?;
            return Ok(Progress {
                pending_from: None,
                rolled: true,
            });
        }
        // The `rows`-th row from the oldest, or the newest when fewer.
        let nth: Option<i64> = tx
            .prepare_cached("SELECT seq FROM bucket_log ORDER BY seq LIMIT 1 OFFSET ?1")
            .and_then(|mut st| st.query_row([rows as i64 - 1], |r| r.get(0)).optional())
            .map_err(internal)?;
        let last = nth.unwrap_or(max);
        for s in &states {
            fold(&tx, *s, last)?;
        }
        tx.execute("DELETE FROM bucket_log WHERE seq <= ?1", [last])
            .map_err(internal)?;
        if last < max {
            tx.commit().map_err(internal)?;
            return Ok(Progress {
                pending_from: Some(last + 1),
                rolled: states.iter().all(|s| s.anchor >= today && s.cursor == 0),
            });
        }
    }
    // The log is empty: buckets and totals agree, a day may move.
    // Each window moves by one chunk, so that a day change over few
    // counters is one step for a query, not one per window.
    for &s in states.iter().filter(|s| s.cursor > 0 || s.anchor < today) {
        if s.cursor == 0 && today - s.anchor >= s.len {
            // Every day of the window changes: summing it is cheaper than
            // rolling (for `last_day`, at every day change).
            rebuild(&tx, s.len, today)?;
        } else {
            roll_chunk(&tx, s, rows)?;
        }
    }
    let rolled = load_states(&tx)?
        .iter()
        .all(|s| s.cursor == 0 && s.anchor >= today);
    tx.commit().map_err(internal)?;
    Ok(Progress {
        pending_from: None,
        rolled,
    })
}

/// The cid of the `rows`-th bucket of `day` after counter `after`, if the
/// day has that many: where a chunk of a roll ends.
fn chunk_end(
    tx: &Connection,
    day: i64,
    after: i64,
    rows: usize,
) -> Result<Option<i64>, StoreError> {
    tx.prepare_cached(
        "SELECT cid FROM buckets WHERE day = ?1 AND cid > ?2 ORDER BY cid LIMIT 1 OFFSET ?3",
    )
    .and_then(|mut st| {
        st.query_row(params![day, after, rows as i64 - 1], |r| r.get(0))
            .optional()
    })
    .map_err(internal)
}

/// Moves window `s` from `anchor` to `anchor + 1` for the next chunk of
/// counters (by cid), set-based: subtracts the day that leaves, adds the
/// day that enters (buckets dated ahead of the anchor, within the clock
/// skew, or days missed while the server was down), and drops the counters
/// left with no bucket in the window. A chunk ends where either day has
/// `rows` buckets after the cursor.
fn roll_chunk(tx: &Connection, s: State, rows: usize) -> Result<(), StoreError> {
    let leaving = s.anchor - s.len + 1;
    let entering = s.anchor + 1;
    let hi = [leaving, entering]
        .into_iter()
        .map(|day| chunk_end(tx, day, s.cursor, rows))
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(i64::MAX);
    // (hi, lo) - split(value), the borrow taken from `hi` by the
    // arithmetic shift of a negative `lo`.
    tx.prepare_cached(
        "UPDATE window_sums SET
             hi = hi - (b.value >> 62) + ((lo - (b.value & 4611686018427387903)) >> 62),
             lo = (lo - (b.value & 4611686018427387903)) & 4611686018427387903
         FROM (SELECT cid, value FROM buckets WHERE day = ?2 AND cid > ?3 AND cid <= ?4) b
         WHERE window_sums.win = ?1 AND window_sums.cid = b.cid",
    )
    .and_then(|mut st| st.execute(params![s.len, leaving, s.cursor, hi]))
    .map_err(internal)?;
    tx.prepare_cached(
        "INSERT INTO window_sums (win, cid, entity, action, uuid, hi, lo)
         SELECT ?1, c.cid, c.entity, c.action, c.uuid, b.value >> 62, b.value & 4611686018427387903
         FROM buckets b JOIN counters c ON c.cid = b.cid
         WHERE b.day = ?2 AND b.cid > ?3 AND b.cid <= ?4
         ON CONFLICT (win, cid) DO UPDATE SET
             hi = hi + excluded.hi + ((lo + excluded.lo) >> 62),
             lo = (lo + excluded.lo) & 4611686018427387903",
    )
    .and_then(|mut st| st.execute(params![s.len, entering, s.cursor, hi]))
    .map_err(internal)?;
    tx.prepare_cached(
        "DELETE FROM window_sums WHERE win = ?1 AND cid IN (
             SELECT cid FROM buckets WHERE day = ?2 AND cid > ?3 AND cid <= ?4)
           AND NOT EXISTS (
             SELECT 1 FROM buckets b INDEXED BY buckets_by_counter
             WHERE b.cid = window_sums.cid AND b.day BETWEEN ?5 AND ?6)",
    )
    .and_then(|mut st| {
        st.execute(params![
            s.len,
            leaving,
            s.cursor,
            hi,
            entering - s.len + 1,
            entering
        ])
    })
    .map_err(internal)?;
    let (anchor, cursor) = if hi == i64::MAX {
        (entering, 0)
    } else {
        (s.anchor, hi)
    };
    tx.execute(
        "UPDATE window_state SET anchor = ?2, cursor = ?3 WHERE win = ?1",
        params![s.len, anchor, cursor],
    )
    .map_err(internal)?;
    Ok(())
}

/// Runs steps until the roll-up is current or `budget` is spent; for the
/// background timer, so it never holds the writer long (but for a rebuild,
/// which the background asks for only once flushes have stopped).
pub(super) fn run_for(
    conn: &mut Connection,
    today: i64,
    budget: Duration,
) -> Result<Progress, StoreError> {
    run_for_with(conn, today, budget, true)
}

/// [`run_for`] without rebuilding, for the background while flushes come.
pub(super) fn run_for_folding(
    conn: &mut Connection,
    today: i64,
    budget: Duration,
) -> Result<Progress, StoreError> {
    run_for_with(conn, today, budget, false)
}

fn run_for_with(
    conn: &mut Connection,
    today: i64,
    budget: Duration,
    may_rebuild: bool,
) -> Result<Progress, StoreError> {
    let started = Instant::now();
    loop {
        let p = step_with(conn, today, BACKGROUND_STEP_ROWS, may_rebuild)?;
        if (p.pending_from.is_none() && p.rolled) || started.elapsed() >= budget {
            return Ok(p);
        }
    }
}

/// The top list of the named window `len` from its totals, if they end on
/// `to_day` with no roll under way; `None` otherwise (the caller sums
/// buckets instead). Runs in one read transaction, so the state checked is
/// the state read.
pub(super) fn top(
    conn: &Connection,
    q: &TopQuery,
    len: i64,
    to_day: i64,
) -> Result<Option<Vec<TopEntry>>, StoreError> {
    let tx = conn.unchecked_transaction().map_err(internal)?;
    let current = tx
        .prepare_cached("SELECT 1 FROM window_state WHERE win = ?1 AND anchor = ?2 AND cursor = 0")
        .and_then(|mut s| {
            s.query_row(params![len, to_day], |r| r.get::<_, i64>(0))
                .optional()
        })
        .map_err(internal)?;
    if current.is_none() {
        return Ok(None);
    }
    // The index walk stops after `size` rows; a category filter skips the
    // rows of other categories on the way, like the all-time list.
    let mut s = tx
        .prepare_cached(
            "SELECT w.uuid, w.hi, w.lo, c.category
             FROM window_sums w INDEXED BY window_sums_top
             JOIN counters c ON c.cid = w.cid
             WHERE w.win = ?1 AND w.entity = ?2 AND w.action = ?3
               AND (?4 IS NULL OR c.category = ?4)
             ORDER BY w.hi DESC, w.lo DESC, w.uuid LIMIT ?5",
        )
        .map_err(internal)?;
    let rows = s
        .query_map(
            params![
                len,
                q.entity,
                q.action,
                q.category,
                i64::try_from(q.size).unwrap_or(i64::MAX)
            ],
            |r| {
                Ok(TopEntry {
                    uuid: r.get(0)?,
                    value: join(r.get(1)?, r.get(2)?),
                    category: r.get(3)?,
                })
            },
        )
        .map_err(internal)?;
    let entries = rows.collect::<Result<Vec<_>, _>>().map_err(internal)?;
    Ok(Some(entries))
}

/// Removes a deleted counter from every window and drops its pending log
/// rows, so a later counter given the same cid inherits nothing. The log
/// scan is over the rows not yet rolled up (usually a second's worth).
pub(super) fn forget(tx: &Connection, cid: i64) -> Result<(), StoreError> {
    for len in lengths() {
        tx.execute(
            "DELETE FROM window_sums WHERE win = ?1 AND cid = ?2",
            params![len, cid],
        )
        .map_err(internal)?;
    }
    tx.execute("DELETE FROM bucket_log WHERE cid = ?1", [cid])
        .map_err(internal)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The day the test starts on: any day will do, the store is told it.
    const DAY: i64 = 21_974; // 2030-03-01

    fn db() -> Connection {
        let c = Connection::open_in_memory().unwrap();
        c.execute_batch(super::super::SCHEMA).unwrap();
        c.execute_batch(super::super::queries::SCHEMA_V2).unwrap();
        c.execute_batch(SCHEMA_V3).unwrap();
        c
    }

    fn counter(c: &Connection, cid: i64) {
        c.execute(
            "INSERT INTO counters (cid, entity, action, uuid, value, first_ts, recorded_ts)
             VALUES (?1, 'E', 'A', 'u' || ?1, 0, 0, 0)",
            [cid],
        )
        .unwrap();
    }

    /// What a flush does for one bucket delta: upsert and log.
    fn bump(c: &Connection, cid: i64, day: i64, delta: i64) {
        c.execute(
            "INSERT INTO buckets (day, cid, value) VALUES (?1, ?2, ?3)
             ON CONFLICT (day, cid) DO UPDATE SET value = value + excluded.value",
            params![day, cid, delta],
        )
        .unwrap();
        c.execute(
            "INSERT INTO bucket_log (cid, day, delta) VALUES (?1, ?2, ?3)",
            params![cid, day, delta],
        )
        .unwrap();
    }

    fn totals(c: &Connection, len: i64) -> Vec<(i64, i128)> {
        let mut s = c
            .prepare("SELECT cid, hi, lo FROM window_sums WHERE win = ?1 ORDER BY cid")
            .unwrap();
        let rows = s
            .query_map([len], |r| Ok((r.get(0)?, join(r.get(1)?, r.get(2)?))))
            .unwrap();
        rows.collect::<Result<_, _>>().unwrap()
    }

    fn week_cursor(c: &Connection) -> i64 {
        c.query_row("SELECT cursor FROM window_state WHERE win = 7", [], |r| {
            r.get(0)
        })
        .unwrap()
    }

    /// The carries of the set-based fold (adding log deltas) and of the
    /// roll (subtracting the day that leaves) agree with i128 arithmetic
    /// around every edge of the pair: `lo` near 0 and 2^62, `hi` changing
    /// sign, sums far past i64 both ways; and so do the halves `rebuild`
    /// sums.
    #[test]
    fn kept_pairs_add_and_subtract_exactly_around_their_edges() {
        let mut c = db();
        counter(&c, 1);
        backfill(&mut c, DAY).unwrap();
        let (max, min, edge) = (i64::MAX, i64::MIN, 1i64 << 62);
        let deltas = [
            max,
            max,
            1,
            min,
            min,
            -1,
            min,
            edge,
            -edge,
            edge - 1,
            1,
            max,
            max,
            max,
            5,
            min,
            -7,
        ];
        // Delta i on day DAY - i, folded from the log one at a time.
        let mut want = 0i128;
        for (i, &d) in deltas.iter().enumerate() {
            bump(&c, 1, DAY - i as i64, d);
            step(&mut c, DAY, QUERY_STEP_ROWS).unwrap();
            want += i128::from(d);
            assert_eq!(totals(&c, 30), [(1, want)], "after {i} deltas");
            let lo: i64 = c
                .query_row("SELECT lo FROM window_sums WHERE win = 30", [], |r| {
                    r.get(0)
                })
                .unwrap();
            assert!((0..edge).contains(&lo), "{lo}");
            let tx = c.transaction().unwrap();
            rebuild(&tx, 30, DAY).unwrap();
            assert_eq!(totals(&tx, 30), [(1, want)], "rebuilt after {i}");
        }
        // Day after day the month loses its oldest day, one delta each.
        for k in 1..=30 {
            let today = DAY + k;
            while !step(&mut c, today, QUERY_STEP_ROWS).unwrap().reached(0) {}
            let kept: i128 = deltas
                .iter()
                .enumerate()
                .filter(|(i, _)| DAY - (*i as i64) > today - 30)
                .map(|(_, &d)| i128::from(d))
                .sum();
            let got = totals(&c, 30);
            if kept == 0 && k == 30 {
                assert!(got.is_empty(), "no bucket left in the month: {got:?}");
            } else {
                assert_eq!(got, [(1, kept)], "rolled {k} days");
            }
        }
    }

    /// A bulk load's backlog (past `REBUILD_BACKLOG`, most of the buckets)
    /// is rebuilt from the buckets in one step, a roll under way included:
    /// the log is emptied, every window ends on today, the totals are the
    /// summed buckets and the top index is back.
    #[test]
    fn a_bulk_backlog_is_rebuilt_in_one_step() {
        let mut c = db();
        let n = REBUILD_BACKLOG / 4 + 10;
        for cid in 1..=n {
            counter(&c, cid);
        }
        bump(&c, 1, DAY - 20, 5);
        backfill(&mut c, DAY - 1).unwrap();
        // Half a day's roll done, then the load: four days of every counter.
        c.execute("UPDATE window_state SET cursor = ?1 WHERE win = 7", [n / 2])
            .unwrap();
        let tx = c.transaction().unwrap();
        for day in DAY - 3..=DAY {
            for cid in 1..=n {
                bump(&tx, cid, day, cid % 97 - 40);
            }
        }
        tx.commit().unwrap();
        let p = step(&mut c, DAY, BACKGROUND_STEP_ROWS).unwrap();
        assert_eq!(
            p,
            Progress {
                pending_from: None,
                rolled: true
            }
        );
        assert_eq!(backlog(&c).unwrap(), 0);
        let states: Vec<(i64, i64)> = load_states(&c)
            .unwrap()
            .iter()
            .map(|s| (s.anchor, s.cursor))
            .collect();
        assert_eq!(states, vec![(DAY, 0); 4]);
        let index: i64 = c
            .query_row(
                "SELECT count(*) FROM sqlite_schema WHERE name = 'window_sums_top'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(index, 1);
        for len in lengths() {
            let got = totals(&c, len);
            let tx = c.transaction().unwrap();
            rebuild(&tx, len, DAY).unwrap();
            assert!(got == totals(&tx, len), "window {len}");
        }
        assert_eq!(totals(&c, 30)[0], (1, 5 + 4 * (1 - 40)));
    }

    /// Writes that arrive between two chunks of a roll count in the window
    /// as each counter sees it: a counter already moved to tomorrow no
    /// longer has the day that left, one not yet moved still has it.
    #[test]
    fn writes_during_a_roll_land_on_each_counters_side_of_it() {
        let mut c = db();
        let n = 2 * QUERY_STEP_ROWS as i64 + 500;
        for cid in 1..=n {
            counter(&c, cid);
            bump(&c, cid, DAY - 6, 1);
            if cid % 3 == 0 {
                bump(&c, cid, DAY - 2, 10);
            }
        }
        backfill(&mut c, DAY).unwrap();
        assert_eq!(totals(&c, 7).len() as i64, n);
        while week_cursor(&c) == 0 {
            step(&mut c, DAY + 1, QUERY_STEP_ROWS).unwrap();
        }
        let cursor = week_cursor(&c);
        assert!(cursor > 1 && cursor < n, "{cursor}");
        counter(&c, n + 1);
        for cid in [cursor - 1, cursor, cursor + 1, n + 1] {
            bump(&c, cid, DAY - 6, 100);
            bump(&c, cid, DAY + 1, 1000);
            bump(&c, cid, DAY - 3, 7);
        }
        loop {
            let p = step(&mut c, DAY + 1, QUERY_STEP_ROWS).unwrap();
            if p.pending_from.is_none() && p.rolled {
                break;
            }
        }
        for len in lengths() {
            let got = totals(&c, len);
            let tx = c.transaction().unwrap();
            rebuild(&tx, len, DAY + 1).unwrap();
            let want = totals(&tx, len);
            drop(tx);
            assert_eq!(got.len(), want.len(), "window {len}");
            assert!(
                got == want,
                "window {len}: kept totals differ from summed buckets"
            );
        }
        // Sanity of the comparison itself: the week lost the day that left.
        let bumped = [cursor - 1, cursor, cursor + 1, n + 1];
        let members = (1..=n + 1)
            .filter(|cid| cid % 3 == 0 || bumped.contains(cid))
            .count();
        assert_eq!(totals(&c, 7).len(), members);
    }
}
