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
//!   folds the log into `window_sums` in bounded steps, summing a step's
//!   log rows per (window, counter) in memory first so a hot counter costs
//!   one index update per step, not one per flush.
//! - When the UTC day changes each window moves by one day at a time, in
//!   chunks of counters (`window_state.cursor`): counters up to the cursor
//!   already sit at `anchor + 1`, the others at `anchor`. The day that leaves
//!   is read from `buckets` by day (a range of its primary key).
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

use std::collections::BTreeMap;
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
const LO_MASK: i64 = (1 << LO_BITS) - 1;

/// `v` as the kept pair `(hi, lo)`. `hi` fits i64 for any sum of fewer
/// than 2^61 values of i64 (a step folds at most `QUERY_STEP_ROWS`).
pub(super) fn split(v: i128) -> (i64, i64) {
    let hi = i64::try_from(v >> LO_BITS).unwrap_or(if v < 0 { i64::MIN } else { i64::MAX });
    (hi, (v & i128::from(LO_MASK)) as i64)
}

/// The value of a kept pair, or of the columns of [`split_sum`].
pub(super) fn join(hi: i64, lo: i64) -> i128 {
    (i128::from(hi) << LO_BITS) + i128::from(lo)
}

/// SQL for the columns `{name}hi, {name}lo` ([`split`]) of a sum of
/// buckets, exact past i64 where `sum()` fails: `h` and `l` name the sums
/// of the values' high and low 32-bit halves (`sum(value >> 32)`,
/// `sum(value & 4294967295)`), carried here into the pair; exact for a
/// group of fewer than 2^30 rows (one counter's days: at most a few hundred).
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

impl State {
    /// Whether `day` lies in this window for counter `cid`.
    fn contains(&self, cid: i64, day: i64) -> bool {
        let end = if self.cursor > 0 && cid <= self.cursor {
            self.anchor + 1
        } else {
            self.anchor
        };
        day <= end && day > end - self.len
    }
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

/// Adds `delta` to a counter's total in window `len`, creating the row (the
/// counter now has a bucket in the window). A counter deleted meanwhile is
/// skipped: the `SELECT` finds nothing. The carry out of `lo` goes to `hi`
/// (the `SET` expressions all read the row as it was).
fn add(tx: &Connection, len: i64, cid: i64, delta: i128) -> Result<(), StoreError> {
    let (hi, lo) = split(delta);
    tx.prepare_cached(
        "INSERT INTO window_sums (win, cid, entity, action, uuid, hi, lo)
         SELECT ?1, cid, entity, action, uuid, ?3, ?4 FROM counters WHERE cid = ?2
         ON CONFLICT (win, cid) DO UPDATE SET
             hi = hi + excluded.hi + ((lo + excluded.lo) >> 62),
             lo = (lo + excluded.lo) & 4611686018427387903",
    )
    .and_then(|mut s| s.execute(params![len, cid, hi, lo]))
    .map_err(internal)?;
    Ok(())
}

/// Subtracts `value` from a counter's total in window `len`, if it has one.
fn sub(tx: &Connection, len: i64, cid: i64, value: i64) -> Result<(), StoreError> {
    let (hi, lo) = split(-i128::from(value));
    tx.prepare_cached(
        "UPDATE window_sums SET
             hi = hi + ?3 + ((lo + ?4) >> 62),
             lo = (lo + ?4) & 4611686018427387903
         WHERE win = ?1 AND cid = ?2",
    )
    .and_then(|mut s| s.execute(params![len, cid, hi, lo]))
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

/// One bounded step, in one transaction: folds up to `rows` log rows;
/// if that empties the log, moves the first window not yet ending on `today`
/// by one chunk. A clock that went back (`today` before an anchor) moves
/// nothing: queries then fall back to summing buckets.
pub(super) fn step(conn: &mut Connection, today: i64, rows: usize) -> Result<Progress, StoreError> {
    let step_rows = rows;
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(internal)?;
    let states = load_states(&tx)?;
    let rows: Vec<(i64, i64, i64, i64)> = {
        let mut s = tx
            .prepare_cached("SELECT seq, cid, day, delta FROM bucket_log ORDER BY seq LIMIT ?1")
            .map_err(internal)?;
        let rows = s
            .query_map([step_rows as i64], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
            })
            .map_err(internal)?;
        rows.collect::<Result<_, _>>().map_err(internal)?
    };
    if let Some(&(last, ..)) = rows.last() {
        // Sorted by (window, counter): neighbouring updates share pages.
        let mut sums: BTreeMap<(i64, i64), i128> = BTreeMap::new();
        for &(_, cid, day, delta) in &rows {
            for s in states.iter().filter(|s| s.contains(cid, day)) {
                *sums.entry((s.len, cid)).or_default() += i128::from(delta);
            }
        }
        for ((len, cid), sum) in sums {
            add(&tx, len, cid, sum)?;
        }
        tx.execute("DELETE FROM bucket_log WHERE seq <= ?1", [last])
            .map_err(internal)?;
        if rows.len() == step_rows {
            tx.commit().map_err(internal)?;
            return Ok(Progress {
                pending_from: Some(last + 1),
                rolled: states.iter().all(|s| s.anchor >= today && s.cursor == 0),
            });
        }
    }
    // The log is empty: buckets and totals agree, a day may move.
    let moving = states
        .iter()
        .find(|s| s.cursor > 0 || s.anchor < today)
        .copied();
    if let Some(s) = moving {
        if s.cursor == 0 && today - s.anchor > s.len {
            // Every day of the window changes: summing is cheaper than rolling.
            rebuild(&tx, s.len, today)?;
        } else {
            roll_chunk(&tx, s, step_rows)?;
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

fn day_chunk(
    tx: &Connection,
    day: i64,
    after: i64,
    upto: i64,
    rows: usize,
) -> Result<Vec<(i64, i64)>, StoreError> {
    let mut s = tx
        .prepare_cached(
            "SELECT cid, value FROM buckets WHERE day = ?1 AND cid > ?2 AND cid <= ?3
             ORDER BY cid LIMIT ?4",
        )
        .map_err(internal)?;
    let rows = s
        .query_map(params![day, after, upto, rows as i64], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .map_err(internal)?;
    rows.collect::<Result<_, _>>().map_err(internal)
}

/// Moves window `s` from `anchor` to `anchor + 1` for the next chunk of
/// counters (by cid): subtracts the day that leaves, adds the day that
/// enters (buckets dated ahead of the anchor, within the clock skew, or days
/// missed while the server was down), and drops the counters left with no
/// bucket in the window.
fn roll_chunk(tx: &Connection, s: State, rows: usize) -> Result<(), StoreError> {
    let leaving = s.anchor - s.len + 1;
    let entering = s.anchor + 1;
    let mut leave = day_chunk(tx, leaving, s.cursor, i64::MAX, rows)?;
    let mut hi = if leave.len() == rows {
        leave.last().map_or(i64::MAX, |r| r.0)
    } else {
        i64::MAX
    };
    let enter = day_chunk(tx, entering, s.cursor, hi, rows)?;
    if enter.len() == rows {
        hi = enter.last().map_or(hi, |r| r.0);
        leave.retain(|r| r.0 <= hi);
    }
    for &(cid, v) in &leave {
        sub(tx, s.len, cid, v)?;
    }
    for &(cid, v) in &enter {
        add(tx, s.len, cid, i128::from(v))?;
    }
    let mut drop_empty = tx
        .prepare_cached(
            "DELETE FROM window_sums WHERE win = ?1 AND cid = ?2 AND NOT EXISTS (
                 SELECT 1 FROM buckets INDEXED BY buckets_by_counter
                 WHERE cid = ?2 AND day BETWEEN ?3 AND ?4)",
        )
        .map_err(internal)?;
    for &(cid, _) in &leave {
        drop_empty
            .execute(params![s.len, cid, entering - s.len + 1, entering])
            .map_err(internal)?;
    }
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
/// background timer, so it never holds the writer long.
pub(super) fn run_for(
    conn: &mut Connection,
    today: i64,
    budget: Duration,
) -> Result<Progress, StoreError> {
    let started = Instant::now();
    loop {
        let p = step(conn, today, BACKGROUND_STEP_ROWS)?;
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

    /// The carry of `add` and `sub` in SQL, and the halves `rebuild` sums,
    /// agree with i128 arithmetic around every edge of the pair: `lo` near 0
    /// and 2^62, `hi` changing sign, sums far past i64 both ways.
    #[test]
    fn kept_pairs_add_exactly_around_their_edges() {
        let mut c = db();
        counter(&c, 1);
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
        let mut want = 0i128;
        for (i, &d) in deltas.iter().enumerate() {
            let tx = c.transaction().unwrap();
            match d.checked_neg() {
                Some(minus) if i % 2 == 1 => sub(&tx, 7, 1, minus).unwrap(),
                _ => add(&tx, 7, 1, i128::from(d)).unwrap(),
            }
            tx.commit().unwrap();
            want += i128::from(d);
            assert_eq!(totals(&c, 7), [(1, want)], "after {i} deltas");
            let lo: i64 = c
                .query_row("SELECT lo FROM window_sums", [], |r| r.get(0))
                .unwrap();
            assert!((0..edge).contains(&lo), "{lo}");
            // The same values as one bucket each, summed by `rebuild`.
            c.execute(
                "INSERT INTO buckets (day, cid, value) VALUES (?1, 1, ?2)",
                params![DAY - i as i64, d],
            )
            .unwrap();
            let tx = c.transaction().unwrap();
            rebuild(&tx, 30, DAY).unwrap();
            assert_eq!(totals(&tx, 30), [(1, want)], "rebuilt after {i}");
        }
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
