//! Totals of the named rolling windows (`last_day`, `last_week`,
//! `last_month`, `last_year`), kept so that their top lists are an ordered
//! index walk of `size` rows at every moment: right after a bulk load, right
//! after midnight, while the background is busy.
//!
//! Why this shape:
//! - Two tables of totals, one row per counter with a bucket in any of the
//!   four windows, each window's total in two columns with a partial index
//!   ordered by it: `cur`, the windows ending on the anchor day, and `next`,
//!   those ending on the day after. At midnight the tables swap roles
//!   (`flip`: one row of `windows_state`), so the first list after midnight
//!   reads totals computed before it. `next` is filled after each flip by
//!   [`copy_chunk`] (from `cur` and the day that leaves and the one that
//!   enters), a chunk of counters at a time, in the background; a flush
//!   writes into it only counters the copy has passed (`copied`).
//! - What flushes change goes to memory (`memory`), not to the tables: a
//!   counter a flush touches has its rows deleted and its exact totals kept
//!   in memory, added to by every flush after, until the store writes its
//!   rows again ([`write_rows`]) off the acknowledgement path. A top list
//!   merges the tables' index walk with a scan of that memory. Updating the
//!   rows in a flush cost about 15 µs per counter and window table (two
//!   b-trees per window); adding in memory, nanoseconds.
//! - Memory holds as many counters as the memory budget allows
//!   (`upkeep::held_max`: a million counters' bulk load stays there, and
//!   is written back in one sorted pass once flushes pause), and a list
//!   reads only the few blocks of it that can enter (`memory`).
//! - `windows_dirty` lists the counters held in memory (their rows are
//!   missing): after a crash, the next open recomputes exactly those from
//!   their buckets, or rebuilds the tables when they are many.
//! - A counter is in a window exactly when it has a bucket inside it, even
//!   when the sum is 0. A total is kept in two integers, `hi · 2^62 + lo`
//!   with `0 <= lo < 2^62` ([`join`]): each bucket fits i64 but a window's
//!   sum of several days need not, and the pair orders as the exact sum.
//! - When the tables cannot be moved by one flip (the store was closed over
//!   two midnights, a clock jumped ahead), they are rebuilt from the buckets
//!   ([`rebuild`]); until then, and while the clock is behind the anchor,
//!   lists are summed from the buckets (exact, slower).

pub(super) mod memory;
pub(super) mod upkeep;

use rusqlite::{params, Connection, OptionalExtension};

use super::hot;
use super::{internal_msg, sql};
use crate::domain::{Window, NAMED_INTERVALS};
use crate::store::{StoreError, TopEntry, TopQuery};
use memory::{Memory, Sums};

/// The named windows' lengths in days, in the order of their columns.
pub(super) const LENGTHS: [i64; 4] = [1, 7, 30, 365];

/// Each window's columns, in the order of [`LENGTHS`].
const COLS: [(&str, &str); 4] = [
    ("d_hi", "d_lo"),
    ("w_hi", "w_lo"),
    ("m_hi", "m_lo"),
    ("y_hi", "y_lo"),
];

const TABLES: [&str; 2] = ["windows_a", "windows_b"];

/// `copied` once the table of the day after is complete.
pub(super) const COMPLETE: i64 = i64::MAX;
/// `copied` right after a flip: the table of the day after still holds
/// the totals of the day before and is emptied first.
const CLEARING: i64 = -1;

/// One counter's total per window, in the order of [`LENGTHS`]; `None`
/// when it has no bucket in the window.
pub(super) type Totals = [Option<i128>; 4];

/// Schema added in version 6: the two tables of totals, where they stand,
/// and the counters whose totals are in memory.
pub(super) fn schema() -> String {
    let mut sql = String::new();
    for t in TABLES {
        sql.push_str(&format!(
            "CREATE TABLE IF NOT EXISTS {t} (
                 cid      INTEGER PRIMARY KEY,
                 entity   TEXT NOT NULL,
                 action   TEXT NOT NULL,
                 uuid     TEXT NOT NULL,
                 category TEXT,
                 d_hi INTEGER, d_lo INTEGER,
                 w_hi INTEGER, w_lo INTEGER,
                 m_hi INTEGER, m_lo INTEGER,
                 y_hi INTEGER, y_lo INTEGER
             );"
        ));
        sql.push_str(&indexes(t));
    }
    sql.push_str(
        "-- anchor: the day `cur` ends on; parity: which table is `cur`;
         -- copied: counters up to it are in `next` (see the module doc).
         CREATE TABLE IF NOT EXISTS windows_state (
             id     INTEGER PRIMARY KEY CHECK (id = 1),
             anchor INTEGER NOT NULL,
             parity INTEGER NOT NULL,
             copied INTEGER NOT NULL
         );
         -- Counters whose totals are in memory, not in the tables.
         CREATE TABLE IF NOT EXISTS windows_dirty (cid INTEGER PRIMARY KEY);",
    );
    sql
}

/// The top index of each window of table `t`: only its members.
fn indexes(t: &str) -> String {
    LENGTHS
        .iter()
        .zip(COLS)
        .map(|(len, (hi, lo))| {
            format!(
                "CREATE INDEX IF NOT EXISTS {t}_{len} ON {t} (entity, action, {hi} DESC, {lo} DESC, uuid)
                 WHERE {hi} IS NOT NULL;"
            )
        })
        .collect()
}

/// The tables of schemas 3 to 5 (totals of one table folded from a log).
pub(super) const OLD_TABLES: &str = "DROP TABLE IF EXISTS window_totals;
     DROP TABLE IF EXISTS window_sums; DROP TABLE IF EXISTS window_state;
     DROP TABLE IF EXISTS bucket_log;";

/// Which of the two tables (and of memory's totals) a list reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Side {
    /// The windows ending on the anchor day.
    Cur,
    /// The windows ending on the day after.
    Next,
}

/// Where the kept totals stand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct State {
    pub anchor: i64,
    /// The table of `cur`: `TABLES[parity]`.
    pub parity: u8,
    /// Counters with a cid up to this are in the table of the day after.
    pub copied: i64,
}

impl State {
    pub fn table(&self, side: Side) -> &'static str {
        let p = usize::from(self.parity & 1);
        match side {
            Side::Cur => TABLES[p],
            Side::Next => TABLES[1 - p],
        }
    }

    /// The day the windows of `side` end on.
    fn end(&self, side: Side) -> i64 {
        match side {
            Side::Cur => self.anchor,
            Side::Next => self.anchor + 1,
        }
    }

    /// Whether window `w` of `side` covers `day`.
    pub fn covers(&self, side: Side, w: usize, day: i64) -> bool {
        let end = self.end(side);
        day <= end && day > end - LENGTHS[w]
    }

    /// The table of the day after holds counter `cid`.
    pub fn copied(&self, cid: i64) -> bool {
        cid <= self.copied
    }

    /// Which totals answer the windows ending on `today`, if any.
    pub fn side_for(&self, today: i64) -> Option<Side> {
        if today == self.anchor {
            Some(Side::Cur)
        } else if today == self.anchor + 1 && self.copied == COMPLETE {
            Some(Side::Next)
        } else {
            None
        }
    }

    /// The first day a total reads a bucket of (`cur`'s year).
    pub fn first_day(&self) -> i64 {
        self.anchor - LENGTHS[3] + 1
    }
}

/// The value of a kept pair.
pub(super) fn join(hi: i64, lo: i64) -> i128 {
    (i128::from(hi) << 62) + i128::from(lo)
}

/// The pair of a value ([`join`]'s inverse; `hi` fits i64 for any sum of
/// fewer than 2^64 buckets).
fn split(v: i128) -> (i64, i64) {
    ((v >> 62) as i64, (v & ((1 << 62) - 1)) as i64)
}

/// SQL for the columns `{name}hi, {name}lo` (`hi · 2^62 + lo`, [`join`]) of a sum of
/// buckets, exact past i64 where `sum()` fails: `h` and `l` name the sums
/// of the values' high and low 32-bit halves (`sum(value >> 32)`,
/// `sum(value & 4294967295)`), carried here into the pair; exact for a
/// group of fewer than 2^30 rows.
pub(super) fn split_sum(h: &str, l: &str, name: &str) -> String {
    format!(
        "({h} >> 30) + (((({h} & 1073741823) << 32) + {l}) >> 62) AS {name}hi,
         ((({h} & 1073741823) << 32) + {l}) & 4611686018427387903 AS {name}lo"
    )
}

/// The index in [`LENGTHS`] of the named window `w` is, when it ends on `today`.
pub(super) fn named(w: Window, today: i64) -> Option<usize> {
    if w.to_day != today {
        return None;
    }
    let days = w.days();
    NAMED_INTERVALS
        .iter()
        .any(|(_, d)| *d == Some(days))
        .then(|| LENGTHS.iter().position(|l| *l == days))
        .flatten()
}

pub(super) fn load_state(conn: &Connection) -> Result<Option<State>, StoreError> {
    conn.prepare_cached("SELECT anchor, parity, copied FROM windows_state")
        .and_then(|mut s| {
            s.query_row([], |r| {
                Ok(State {
                    anchor: r.get(0)?,
                    parity: r.get(1)?,
                    copied: r.get(2)?,
                })
            })
            .optional()
        })
        .map_err(sql("windows::load_state"))
}

fn save_state(tx: &Connection, s: &State) -> Result<(), StoreError> {
    tx.prepare_cached(
        "INSERT OR REPLACE INTO windows_state (id, anchor, parity, copied) VALUES (1, ?1, ?2, ?3)",
    )
    .and_then(|mut st| st.execute(params![s.anchor, s.parity, s.copied]))
    .map_err(sql("windows::save_state"))?;
    Ok(())
}

/// The tables are not kept any more (a rebuild is due).
pub(super) fn drop_state(tx: &Connection) -> Result<(), StoreError> {
    tx.execute("DELETE FROM windows_state", [])
        .map_err(sql("windows::drop_state"))?;
    Ok(())
}

/// The columns of a row, from the fifth on.
fn read_totals(r: &rusqlite::Row<'_>, from: usize) -> rusqlite::Result<Totals> {
    let mut t = [None; 4];
    for (w, slot) in t.iter_mut().enumerate() {
        let hi: Option<i64> = r.get(from + 2 * w)?;
        let lo: Option<i64> = r.get(from + 2 * w + 1)?;
        *slot = hi.zip(lo).map(|(h, l)| join(h, l));
    }
    Ok(t)
}

/// Deletes the row of `cid` in table `t`, returning its totals.
fn take(tx: &Connection, t: &str, cid: i64) -> Result<Totals, StoreError> {
    tx.prepare_cached(&format!(
        "DELETE FROM {t} WHERE cid = ?1
         RETURNING d_hi, d_lo, w_hi, w_lo, m_hi, m_lo, y_hi, y_lo"
    ))
    .and_then(|mut s| s.query_row([cid], |r| read_totals(r, 0)).optional())
    .map(|t| t.unwrap_or([None; 4]))
    .map_err(sql("windows::take"))
}

/// A counter a flush touches comes to memory: its rows are deleted (their
/// totals returned, exact: a counter not in memory has its rows current)
/// and it is listed in `windows_dirty`.
pub(super) fn take_rows(tx: &Connection, state: &State, cid: i64) -> Result<Sums, StoreError> {
    let cur = take(tx, state.table(Side::Cur), cid)?;
    let next = if state.copied(cid) {
        Some(take(tx, state.table(Side::Next), cid)?)
    } else {
        None
    };
    mark_dirty(tx, cid)?;
    Ok(Sums { cur, next })
}

/// Lists `cid` as held in memory (a new counter, or one whose rows were taken).
pub(super) fn mark_dirty(tx: &Connection, cid: i64) -> Result<(), StoreError> {
    tx.prepare_cached("INSERT OR IGNORE INTO windows_dirty (cid) VALUES (?1)")
        .and_then(|mut s| s.execute([cid]))
        .map_err(sql("windows::mark_dirty"))?;
    Ok(())
}

/// Writes the row of a counter into table `t`, if it is in any window.
fn put(tx: &Connection, t: &str, h: &memory::Held, totals: &Totals) -> Result<(), StoreError> {
    if totals.iter().all(Option::is_none) {
        return Ok(());
    }
    let pair = |w: usize| totals[w].map(split).unzip();
    let [(dh, dl), (wh, wl), (mh, ml), (yh, yl)] = [pair(0), pair(1), pair(2), pair(3)];
    tx.prepare_cached(&format!(
        "INSERT OR REPLACE INTO {t} (cid, entity, action, uuid, category,
             d_hi, d_lo, w_hi, w_lo, m_hi, m_lo, y_hi, y_lo)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)"
    ))
    .and_then(|mut s| {
        s.execute(params![
            h.cid,
            &*h.entity,
            &*h.action,
            &*h.uuid,
            h.category.as_deref(),
            dh,
            dl,
            wh,
            wl,
            mh,
            ml,
            yh,
            yl
        ])
    })
    .map_err(sql("windows::put"))?;
    Ok(())
}

/// Writes the rows of a counter held in memory (its totals exact as of
/// now), which can then leave memory.
pub(super) fn write_rows(
    tx: &Connection,
    state: &State,
    h: &memory::Held,
) -> Result<(), StoreError> {
    put(tx, state.table(Side::Cur), h, &h.sums.cur)?;
    if state.copied(h.cid) {
        let next = h.sums.next.as_ref().ok_or_else(|| {
            internal_msg("a counter the copy has passed lacks its totals of the day after")
        })?;
        put(tx, state.table(Side::Next), h, next)?;
    }
    tx.prepare_cached("DELETE FROM windows_dirty WHERE cid = ?1")
        .and_then(|mut s| s.execute([h.cid]))
        .map_err(sql("windows::write_rows"))?;
    Ok(())
}

/// Removes a counter from both tables (it is deleted, or about to be
/// recomputed).
pub(super) fn forget(tx: &Connection, cid: i64) -> Result<(), StoreError> {
    for t in TABLES {
        tx.prepare_cached(&format!("DELETE FROM {t} WHERE cid = ?1"))
            .and_then(|mut s| s.execute([cid]))
            .map_err(sql("windows::forget"))?;
    }
    tx.prepare_cached("DELETE FROM windows_dirty WHERE cid = ?1")
        .and_then(|mut s| s.execute([cid]))
        .map_err(sql("windows::forget"))?;
    Ok(())
}

/// The key and category of counter `cid`, with no totals yet; `None` when
/// it is gone.
fn held_key(tx: &Connection, cid: i64) -> Result<Option<memory::Held>, StoreError> {
    tx.prepare_cached("SELECT entity, action, uuid, category FROM counters WHERE cid = ?1")
        .and_then(|mut s| {
            s.query_row([cid], |r| {
                Ok(memory::Held {
                    cid,
                    entity: r.get::<_, String>(0)?.into(),
                    action: r.get::<_, String>(1)?.into(),
                    uuid: r.get::<_, String>(2)?.into(),
                    category: r.get::<_, Option<String>>(3)?.map(Into::into),
                    sums: Sums::none(),
                })
            })
            .optional()
        })
        .map_err(sql("windows::held_key"))
}

/// Recomputes the rows of `cid` from its buckets (exact there: the caller
/// folded the change log), e.g. after a backfill set its days, or at open
/// for a counter memory held at a crash. A counter that is gone loses them.
pub(super) fn recompute(tx: &Connection, state: &State, cid: i64) -> Result<(), StoreError> {
    forget(tx, cid)?;
    let Some(mut h) = held_key(tx, cid)? else {
        return Ok(());
    };
    let mut s = tx
        .prepare_cached(
            "SELECT day, value FROM buckets INDEXED BY buckets_by_counter
             WHERE cid = ?1 AND day BETWEEN ?2 AND ?3",
        )
        .map_err(sql("windows::recompute"))?;
    let mut rows = s
        .query(params![cid, state.first_day(), state.anchor + 1])
        .map_err(sql("windows::recompute"))?;
    while let Some(r) = rows.next().map_err(sql("windows::recompute"))? {
        let (day, value): (i64, i64) = (
            r.get(0).map_err(sql("windows::recompute"))?,
            r.get(1).map_err(sql("windows::recompute"))?,
        );
        h.sums.add(state, day, i128::from(value));
    }
    write_rows(tx, state, &h)
}

/// Midnight: the table of the day after becomes the current one. Only
/// once the copy is complete; the other table is emptied next.
pub(super) fn flip(tx: &Connection, state: &State) -> Result<State, StoreError> {
    debug_assert_eq!(state.copied, COMPLETE);
    let next = State {
        anchor: state.anchor + 1,
        parity: 1 - (state.parity & 1),
        copied: CLEARING,
    };
    save_state(tx, &next)?;
    Ok(next)
}

/// Empties the table of the day after of what it held as the current one
/// (one statement: SQLite frees its pages without reading every row).
pub(super) fn clear_next(tx: &Connection, state: &State) -> Result<State, StoreError> {
    tx.execute(&format!("DELETE FROM {}", state.table(Side::Next)), [])
        .map_err(sql("windows::clear_next"))?;
    let next = State {
        copied: 0,
        ..*state
    };
    save_state(tx, &next)?;
    Ok(next)
}

/// The pending days of a counter (`day`, `value`): their deltas are in the
/// change log, not in `buckets`.
type Pending = Vec<(i64, i64)>;

/// The exact value of bucket `day` of counter `cid` and whether it exists:
/// a pending day (its delta is in the change log), else the row.
fn bucket(
    tx: &Connection,
    pending: &Pending,
    cid: i64,
    day: i64,
) -> Result<Option<i64>, StoreError> {
    if let Some(&(_, v)) = pending.iter().find(|(d, _)| *d == day) {
        return Ok(Some(v));
    }
    tx.prepare_cached("SELECT value FROM buckets WHERE day = ?1 AND cid = ?2")
        .and_then(|mut s| s.query_row(params![day, cid], |r| r.get(0)).optional())
        .map_err(sql("windows::bucket"))
}

/// Whether counter `cid` has a bucket in `from..=to` (pending ones included).
fn any_bucket(
    tx: &Connection,
    pending: &Pending,
    cid: i64,
    from: i64,
    to: i64,
) -> Result<bool, StoreError> {
    if pending.iter().any(|(d, _)| (from..=to).contains(d)) {
        return Ok(true);
    }
    tx.prepare_cached(
        "SELECT 1 FROM buckets INDEXED BY buckets_by_counter
         WHERE cid = ?1 AND day BETWEEN ?2 AND ?3 LIMIT 1",
    )
    .and_then(|mut s| s.query_row(params![cid, from, to], |_| Ok(())).optional())
    .map(|o| o.is_some())
    .map_err(sql("windows::any_bucket"))
}

/// The totals ending on the day after, from those ending on the anchor:
/// each window loses the day that leaves it and gains the day that enters
/// (`leave[w]`, `enter`), and stays a member if the counter has another
/// bucket in it (`others(w)`, asked only when the day that leaves had one).
fn roll(
    cur: &Totals,
    leave: &[Option<i64>; 4],
    enter: Option<i64>,
    mut others: impl FnMut(usize) -> Result<bool, StoreError>,
) -> Result<Totals, StoreError> {
    let mut next = [None; 4];
    for w in 0..4 {
        let gained = enter.map(i128::from);
        next[w] = match (cur[w], leave[w]) {
            (None, _) => gained,
            (Some(v), None) => Some(v + gained.unwrap_or(0)),
            (Some(v), Some(l)) => {
                let v = v - i128::from(l) + gained.unwrap_or(0);
                (gained.is_some() || (LENGTHS[w] > 1 && others(w)?)).then_some(v)
            }
        };
    }
    Ok(next)
}

/// What a step of the copy leaves for memory: the totals of the day after
/// of counters held there.
pub(super) struct Copied {
    pub state: State,
    pub next: Vec<(i64, Totals)>,
}

/// Fills the table of the day after for the next `rows` counters after
/// `copied` (those with rows in `cur`, and those whose first bucket is on
/// the day after), and computes the totals of the day after of the
/// counters memory holds in that range. Counters not in memory have
/// nothing pending (memory holds every one that has), so their rows and
/// buckets are exact; those in memory read their pending days from `hot`.
pub(super) fn copy_chunk(
    tx: &Connection,
    state: &State,
    hot: &hot::Shared,
    rows: usize,
) -> Result<Copied, StoreError> {
    debug_assert!(state.copied >= 0 && state.copied != COMPLETE);
    let (a, after) = (state.anchor, state.copied);
    let mut s = tx
        .prepare_cached(&format!(
            "SELECT cid, entity, action, uuid, category, d_hi, d_lo, w_hi, w_lo, m_hi, m_lo, y_hi, y_lo
             FROM {} WHERE cid > ?1 ORDER BY cid LIMIT ?2",
            state.table(Side::Cur)
        ))
        .map_err(sql("windows::copy_chunk"))?;
    let cur: Vec<memory::Held> = s
        .query_map(params![after, rows as i64], |r| {
            Ok(memory::Held {
                cid: r.get(0)?,
                entity: r.get::<_, String>(1)?.into(),
                action: r.get::<_, String>(2)?.into(),
                uuid: r.get::<_, String>(3)?.into(),
                category: r.get::<_, Option<String>>(4)?.map(Into::into),
                sums: Sums {
                    cur: read_totals(r, 5)?,
                    next: None,
                },
            })
        })
        .and_then(|rows| rows.collect())
        .map_err(sql("windows::copy_chunk"))?;
    // The chunk ends at its last row; the last chunk takes everything left.
    let upto = if cur.len() == rows {
        cur.last().map_or(COMPLETE, |h| h.cid)
    } else {
        COMPLETE
    };
    // The buckets of the days that leave (one per window) and of the day
    // that enters, for the chunk's counters.
    let day_of = |day: i64| -> Result<std::collections::HashMap<i64, i64>, StoreError> {
        tx.prepare_cached(
            "SELECT cid, value FROM buckets WHERE day = ?1 AND cid > ?2 AND cid <= ?3",
        )
        .and_then(|mut s| {
            s.query_map(params![day, after, upto], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect()
        })
        .map_err(sql("windows::copy_chunk"))
    };
    let leaving: Vec<_> = LENGTHS
        .iter()
        .map(|len| day_of(a - len + 1))
        .collect::<Result<_, _>>()?;
    let entering = day_of(a + 1)?;
    // Memory's counters in the chunk, with their pending days, copied out
    // under its lock (only the writer, which runs this, changes memory).
    let (in_memory, unknown): (std::collections::HashSet<i64>, Vec<(i64, Totals, Pending)>) = {
        let held = hot.lock();
        let in_range: Vec<i64> = held
            .windows
            .cids()
            .iter()
            .copied()
            .filter(|&cid| cid > after && cid <= upto)
            .collect();
        let unknown = in_range
            .iter()
            .filter_map(|&cid| {
                let sums = held.windows.get(cid)?;
                if sums.next.is_some() {
                    return None;
                }
                let pending = held.get_by_cid(cid).map_or_else(Vec::new, |e| {
                    e.days
                        .iter()
                        .filter(|d| d.pending)
                        .map(|d| (d.day, d.value))
                        .collect()
                });
                Some((cid, sums.cur, pending))
            })
            .collect();
        (in_range.into_iter().collect(), unknown)
    };
    let others = |pending: &Pending, cid: i64, w: usize| -> Result<bool, StoreError> {
        any_bucket(tx, pending, cid, a - LENGTHS[w] + 2, a)
    };
    let next_table = state.table(Side::Next);
    let mut copied_cids = std::collections::HashSet::with_capacity(cur.len());
    // Counters not in memory have nothing pending: their rows and buckets
    // are exact.
    let none = Pending::new();
    for mut h in cur {
        let leave = std::array::from_fn(|w| leaving[w].get(&h.cid).copied());
        let next = roll(&h.sums.cur, &leave, entering.get(&h.cid).copied(), |w| {
            others(&none, h.cid, w)
        })?;
        copied_cids.insert(h.cid);
        h.sums.next = Some(next);
        put(tx, next_table, &h, &next)?;
    }
    // A counter whose only bucket in reach is the day after has no row in
    // `cur`; one held in memory is done below.
    for (&cid, &value) in &entering {
        if copied_cids.contains(&cid) || in_memory.contains(&cid) {
            continue;
        }
        if let Some(h) = held_key(tx, cid)? {
            put(tx, next_table, &h, &[Some(i128::from(value)); 4])?;
        }
    }
    // Counters in memory: their totals of the day after from their exact
    // current ones.
    let mut next = Vec::with_capacity(unknown.len());
    for (cid, cur, pending) in unknown {
        let mut leave = [None; 4];
        for (w, len) in LENGTHS.iter().enumerate() {
            if cur[w].is_some() {
                leave[w] = bucket(tx, &pending, cid, a - len + 1)?;
            }
        }
        let enter = bucket(tx, &pending, cid, a + 1)?;
        next.push((
            cid,
            roll(&cur, &leave, enter, |w| others(&pending, cid, w))?,
        ));
    }
    let state = State {
        copied: upto,
        ..*state
    };
    save_state(tx, &state)?;
    Ok(Copied { state, next })
}

/// Rebuilds both tables from the buckets (exact there: the caller folded the
/// change log and drops what memory held), the current one ending on
/// `today`: one pass over the buckets of the year in counter order, the
/// rows written with the indexes dropped and built again after (one sort
/// each instead of a random insert per row).
pub(super) fn rebuild(tx: &Connection, today: i64) -> Result<State, StoreError> {
    let state = State {
        anchor: today,
        parity: 0,
        copied: COMPLETE,
    };
    tx.execute_batch("DELETE FROM windows_dirty; DELETE FROM windows_a; DELETE FROM windows_b;")
        .map_err(sql("windows::rebuild"))?;
    drop_indexes(tx)?;
    {
        let mut buckets = tx
            .prepare(
                "SELECT b.cid, b.day, b.value, c.entity, c.action, c.uuid, c.category
                 FROM buckets b INDEXED BY buckets_by_counter JOIN counters c ON c.cid = b.cid
                 WHERE b.day BETWEEN ?1 AND ?2 ORDER BY b.cid",
            )
            .map_err(sql("windows::rebuild"))?;
        let mut rows = buckets
            .query(params![state.first_day(), today + 1])
            .map_err(sql("windows::rebuild"))?;
        let mut held: Option<memory::Held> = None;
        let flush = |h: &memory::Held| -> Result<(), StoreError> {
            put(tx, state.table(Side::Cur), h, &h.sums.cur)?;
            put(
                tx,
                state.table(Side::Next),
                h,
                h.sums.next.as_ref().unwrap_or(&[None; 4]),
            )
        };
        while let Some(r) = rows.next().map_err(sql("windows::rebuild"))? {
            let cid: i64 = r.get(0).map_err(sql("windows::rebuild"))?;
            if held.as_ref().is_some_and(|h| h.cid != cid) {
                if let Some(h) = held.take() {
                    flush(&h)?;
                }
            }
            let h = match &mut held {
                Some(h) => h,
                None => held.insert(memory::Held {
                    cid,
                    entity: r
                        .get::<_, String>(3)
                        .map_err(sql("windows::rebuild"))?
                        .into(),
                    action: r
                        .get::<_, String>(4)
                        .map_err(sql("windows::rebuild"))?
                        .into(),
                    uuid: r
                        .get::<_, String>(5)
                        .map_err(sql("windows::rebuild"))?
                        .into(),
                    category: r
                        .get::<_, Option<String>>(6)
                        .map_err(sql("windows::rebuild"))?
                        .map(Into::into),
                    sums: Sums::none(),
                }),
            };
            let (day, value): (i64, i64) = (
                r.get(1).map_err(sql("windows::rebuild"))?,
                r.get(2).map_err(sql("windows::rebuild"))?,
            );
            h.sums.add(&state, day, i128::from(value));
        }
        if let Some(h) = held {
            flush(&h)?;
        }
    }
    create_indexes(tx)?;
    save_state(tx, &state)?;
    Ok(state)
}

/// Drops the top indexes of both tables, before writing rows in bulk.
pub(super) fn drop_indexes(tx: &Connection) -> Result<(), StoreError> {
    let mut drops = String::new();
    for t in TABLES {
        for len in LENGTHS {
            drops.push_str(&format!("DROP INDEX IF EXISTS {t}_{len};"));
        }
    }
    tx.execute_batch(&drops)
        .map_err(sql("windows::drop_indexes"))
}

/// Builds the top indexes of both tables again (one sort each).
pub(super) fn create_indexes(tx: &Connection) -> Result<(), StoreError> {
    let creates: String = TABLES.iter().map(|t| indexes(t)).collect();
    tx.execute_batch(&creates)
        .map_err(sql("windows::create_indexes"))
}

/// Rows in the current table (a scan of its smallest index).
pub(super) fn rows(conn: &Connection, state: &State) -> Result<i64, StoreError> {
    conn.query_row(
        &format!("SELECT count(*) FROM {}", state.table(Side::Cur)),
        [],
        |r| r.get(0),
    )
    .map_err(sql("windows::rows"))
}

/// The top list of the named window `w` (index in [`LENGTHS`]) ending on
/// `today`: the kept table's index walk merged with memory, exact. `None`
/// when the kept totals do not end on `today` (the caller sums buckets).
/// The caller holds memory's lock: no flush commits while the table is read.
pub(super) fn top(
    conn: &Connection,
    mem: &Memory,
    q: &TopQuery,
    w: usize,
    today: i64,
) -> Result<Option<Vec<TopEntry>>, StoreError> {
    let Some(state) = mem.state else {
        return Ok(None);
    };
    let Some(side) = state.side_for(today) else {
        return Ok(None);
    };
    let Some(held) = mem.top(&q.entity, &q.action, q.category.as_deref(), w, side, q.size) else {
        return Ok(None);
    };
    let t = state.table(side);
    let (hi, lo) = COLS[w];
    // The index walk stops after `size` rows; a category filter skips the
    // rows of other categories on the way.
    let mut s = conn
        .prepare_cached(&format!(
            "SELECT uuid, {hi}, {lo}, category FROM {t} INDEXED BY {t}_{len}
             WHERE entity = ?1 AND action = ?2 AND {hi} IS NOT NULL
               AND (?3 IS NULL OR category = ?3)
             ORDER BY {hi} DESC, {lo} DESC, uuid LIMIT ?4",
            len = LENGTHS[w]
        ))
        .map_err(sql("windows::top"))?;
    let mut entries = s
        .query_map(
            params![
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
        .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
        .map_err(sql("windows::top"))?;
    if !held.is_empty() {
        entries.extend(held);
        entries.sort_by(|a, b| b.value.cmp(&a.value).then_with(|| a.uuid.cmp(&b.uuid)));
        // A counter in both (a bulk write-back committed, memory not yet
        // emptied: `upkeep::write_back_bulk_past`) has the same total in
        // both, so its two entries are next to each other.
        entries.dedup_by(|a, b| a.uuid == b.uuid);
        entries.truncate(q.size);
    }
    Ok(Some(entries))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_hold_sums_far_past_i64_exactly() {
        let big = i128::from(i64::MAX);
        for v in [
            0,
            1,
            -1,
            big,
            -big - 1,
            365 * big,
            -365 * big,
            (1 << 62) - 1,
            1 << 62,
        ] {
            let (hi, lo) = split(v);
            assert!((0..1 << 62).contains(&lo), "{v}");
            assert_eq!(join(hi, lo), v);
        }
        // Ordered as the values: (hi, lo) descending.
        let mut vs = [5i128, -(1 << 70), 1 << 62, (1 << 62) - 1, -1, 0, 3 * big];
        let mut pairs: Vec<(i64, i64)> = vs.iter().map(|v| split(*v)).collect();
        vs.sort();
        pairs.sort();
        assert_eq!(
            pairs.iter().map(|(h, l)| join(*h, *l)).collect::<Vec<_>>(),
            vs
        );
    }

    #[test]
    fn a_roll_drops_the_day_that_leaves_and_keeps_members_with_other_days() {
        let cur = [Some(5), Some(12), Some(12), Some(-3)];
        // Day that leaves: the last day's 5, the week's 4 (nothing else
        // that week), nothing in the month and year; 2 enters.
        let next = roll(&cur, &[Some(5), Some(4), None, None], Some(2), |_| {
            Ok(false)
        })
        .unwrap();
        assert_eq!(next, [Some(2), Some(10), Some(14), Some(-1)]);
        // Nothing enters: the week's only bucket left, the month keeps its others.
        let next = roll(&cur, &[Some(5), Some(12), Some(1), None], None, |w| {
            Ok(w == 2)
        })
        .unwrap();
        assert_eq!(next, [None, None, Some(11), Some(-3)]);
        // A counter whose first bucket is the day after.
        let next = roll(&[None; 4], &[None; 4], Some(0), |_| unreachable!()).unwrap();
        assert_eq!(next, [Some(0); 4]);
    }
}
