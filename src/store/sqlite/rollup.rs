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
//!   folds the log into `window_totals` in bounded steps, summing a step's
//!   log rows per (window, counter) in memory first so a hot counter costs
//!   one index update per step, not one per flush.
//! - When the UTC day changes each window moves by one day at a time, in
//!   chunks of counters (`window_state.cursor`): counters up to the cursor
//!   already sit at `anchor + 1`, the others at `anchor`. The day that leaves
//!   is read from `buckets` by day (a range of its primary key).
//! - A counter is in a window's totals exactly when it has a bucket inside
//!   the window (today's rule of windowed lists), even when the sum is 0.
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

/// Schema added in version 3 (see the module documentation).
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
CREATE TABLE IF NOT EXISTS window_totals (
    win    INTEGER NOT NULL,
    cid    INTEGER NOT NULL,
    entity TEXT    NOT NULL,
    action TEXT    NOT NULL,
    uuid   TEXT    NOT NULL,
    total  INTEGER NOT NULL,
    PRIMARY KEY (win, cid)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS window_totals_top
    ON window_totals (win, entity, action, total DESC, uuid);
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
/// missing (a database of schema 2, or a new one). The log is cleared: the
/// buckets already hold every delta it could carry.
pub(super) fn backfill(conn: &mut Connection, today: i64) -> Result<(), StoreError> {
    if load_states(conn)?.len() == lengths().count() {
        return Ok(());
    }
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(internal)?;
    tx.execute_batch(
        "DELETE FROM bucket_log; DELETE FROM window_totals; DELETE FROM window_state;",
    )
    .map_err(internal)?;
    for len in lengths() {
        rebuild(&tx, len, today)?;
    }
    tx.commit().map_err(internal)
}

/// Recomputes one window's totals from its buckets, ending on `today`.
fn rebuild(tx: &Connection, len: i64, today: i64) -> Result<(), StoreError> {
    tx.execute("DELETE FROM window_totals WHERE win = ?1", [len])
        .map_err(internal)?;
    tx.execute(
        "INSERT INTO window_totals (win, cid, entity, action, uuid, total)
         SELECT ?1, c.cid, c.entity, c.action, c.uuid, s.total
         FROM (SELECT cid, sum(value) AS total FROM buckets
               WHERE day BETWEEN ?2 AND ?3 GROUP BY cid) s
         JOIN counters c ON c.cid = s.cid",
        params![len, today - len + 1, today],
    )
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
/// skipped: the `SELECT` finds nothing.
fn add(tx: &Connection, len: i64, cid: i64, delta: i64) -> Result<(), StoreError> {
    tx.prepare_cached(
        "INSERT INTO window_totals (win, cid, entity, action, uuid, total)
         SELECT ?1, cid, entity, action, uuid, ?3 FROM counters WHERE cid = ?2
         ON CONFLICT (win, cid) DO UPDATE SET total = total + excluded.total",
    )
    .and_then(|mut s| s.execute(params![len, cid, delta]))
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
            // A window's sum leaves i64 only if its counter's days do
            // (buckets are each in range); saturate rather than fail the step.
            let sum = i64::try_from(sum).unwrap_or(if sum > 0 { i64::MAX } else { i64::MIN });
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
    let mut sub = tx
        .prepare_cached("UPDATE window_totals SET total = total - ?3 WHERE win = ?1 AND cid = ?2")
        .map_err(internal)?;
    for &(cid, v) in &leave {
        sub.execute(params![s.len, cid, v]).map_err(internal)?;
    }
    for &(cid, v) in &enter {
        add(tx, s.len, cid, v)?;
    }
    let mut drop_empty = tx
        .prepare_cached(
            "DELETE FROM window_totals WHERE win = ?1 AND cid = ?2 AND NOT EXISTS (
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
            "SELECT w.uuid, w.total, c.category
             FROM window_totals w INDEXED BY window_totals_top
             JOIN counters c ON c.cid = w.cid
             WHERE w.win = ?1 AND w.entity = ?2 AND w.action = ?3
               AND (?4 IS NULL OR c.category = ?4)
             ORDER BY w.total DESC, w.uuid LIMIT ?5",
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
                    value: r.get(1)?,
                    category: r.get(2)?,
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
            "DELETE FROM window_totals WHERE win = ?1 AND cid = ?2",
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

    fn totals(c: &Connection, len: i64) -> Vec<(i64, i64)> {
        let mut s = c
            .prepare("SELECT cid, total FROM window_totals WHERE win = ?1 ORDER BY cid")
            .unwrap();
        let rows = s.query_map([len], |r| Ok((r.get(0)?, r.get(1)?))).unwrap();
        rows.collect::<Result<_, _>>().unwrap()
    }

    fn week_cursor(c: &Connection) -> i64 {
        c.query_row("SELECT cursor FROM window_state WHERE win = 7", [], |r| {
            r.get(0)
        })
        .unwrap()
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
