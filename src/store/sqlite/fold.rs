//! The fold: brings `counters` and `buckets` up to date from the change log
//! of flushes (`counter_log`, see `log`), off the acknowledgement path. (The
//! window totals of the counters it folds are in memory already, exact:
//! `windows`.)
//!
//! Why this shape:
//! - A flush only appends one blob to `counter_log` for the counters that
//!   exist (and inserts the new ones whole), so the acknowledgement waits
//!   for one b-tree append and its fsync, not for the counter row, the two
//!   indexes of top lists and reports, and the day bucket that each
//!   counter costs (measured: 19 µs of CPU per counter before, 0.7 after).
//! - A fold pass takes every log row up to the newest, sums the deltas per
//!   counter in memory (exactly, in i128), and applies them in counter
//!   order, a chunk of [`CHUNK`] counters per transaction, so a flush
//!   waits for at most one chunk. A hot counter costs one row update per
//!   pass, not one per flush.
//! - `fold_state` says how far a pass got (its last log row, the last
//!   counter applied): a crash in the middle resumes at the next counter,
//!   and every delta is applied exactly once. The pass's log rows are
//!   deleted with its last chunk.
//! - The kept first-N-days totals (`firstdays`) of the chunk's counters
//!   move with their buckets in the same transaction: the deltas of the
//!   pass inside a counter's window, one upsert per row; so do the kept
//!   trending bounds (`trendkeys`).
//! - Each chunk's commit and the marking of its counters as current in
//!   memory (`hot`) happen under one hold of its lock.

use std::collections::HashMap;

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use super::{firstdays, hot};
use super::{internal_msg, log, sql};
use crate::store::StoreError;

/// Counters applied per transaction of a pass: a few milliseconds of the
/// writer, so a flush waiting behind a chunk waits that long at most.
pub(super) const CHUNK: usize = 2_000;

/// [`CHUNK`] in a store that keeps first-N-days totals (`firstdays`) or
/// trending bounds (`trendkeys`, a read and a write per counter and kept
/// half-life): each
/// counter then also costs a lookup of its publication and up to one
/// upsert per kept N, and fresh counters (inside their first days) pay all
/// of them, so a chunk of 2,000 held flushes behind it long enough to show
/// in single increments' p99 (scripts/bench/README.md, "Milestones").
pub(super) const CHUNK_KEPT: usize = 500;

/// The deltas of one counter in a pass.
#[derive(Debug, Default)]
struct Sum {
    delta: i128,
    first_ms: i64,
    last_ms: i64,
    /// The last category logged (in log order), if any.
    category: Option<String>,
    /// `(day, delta)` per day, in first-logged order.
    days: Vec<(i64, i128)>,
    /// `(hour, delta)` per hour bucket, in first-logged order (entries of
    /// days outside the hourly retention have none).
    hours: Vec<(i64, i128)>,
}

/// A fold pass under way; see the module documentation.
pub(super) struct Pass {
    /// The newest log row the pass covers.
    upto: i64,
    /// The counters' sums, ordered by cid; those before `next` are applied.
    sums: Vec<(i64, Sum)>,
    next: usize,
}

/// Starts a pass over every log row there is (or resumes the one a crash
/// interrupted); `None` when the log is empty.
pub(super) fn begin(conn: &Connection) -> Result<Option<Pass>, StoreError> {
    let resumed: Option<(i64, i64)> = conn
        .query_row("SELECT upto, done_cid FROM fold_state", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .optional()
        .map_err(sql("fold::begin"))?;
    let (upto, done) = match resumed {
        Some(r) => r,
        None => {
            let newest: Option<i64> = conn
                .query_row("SELECT max(seq) FROM counter_log", [], |r| r.get(0))
                .map_err(sql("fold::begin"))?;
            match newest {
                Some(n) => (n, 0),
                None => return Ok(None),
            }
        }
    };
    let mut sums: HashMap<i64, Sum> = HashMap::new();
    let mut s = conn
        .prepare_cached("SELECT entries FROM counter_log WHERE seq <= ?1 ORDER BY seq")
        .map_err(sql("fold::begin"))?;
    let mut rows = s.query([upto]).map_err(sql("fold::begin"))?;
    while let Some(row) = rows.next().map_err(sql("fold::begin"))? {
        let blob = row
            .get_ref(0)
            .map_err(sql("fold::begin"))?
            .as_blob()
            .map_err(|e| {
                internal_msg(&format!(
                    "the change log holds a row that is not a blob: {e}"
                ))
            })?;
        log::decode(blob, |e| {
            if e.cid <= done {
                return;
            }
            let sum = sums.entry(e.cid).or_insert_with(|| Sum {
                first_ms: e.first_ms,
                last_ms: e.last_ms,
                ..Sum::default()
            });
            sum.delta += i128::from(e.delta);
            sum.first_ms = sum.first_ms.min(e.first_ms);
            sum.last_ms = sum.last_ms.max(e.last_ms);
            if let Some(c) = e.category {
                if sum.category.as_deref() != Some(c) {
                    sum.category = Some(c.to_string());
                }
            }
            match sum.days.iter_mut().find(|(d, _)| *d == e.day) {
                Some((_, d)) => *d += i128::from(e.delta),
                None => sum.days.push((e.day, i128::from(e.delta))),
            }
            if let Some(h) = e.hour {
                let hour = e.day * 24 + i64::from(h);
                match sum.hours.iter_mut().find(|(x, _)| *x == hour) {
                    Some((_, d)) => *d += i128::from(e.delta),
                    None => sum.hours.push((hour, i128::from(e.delta))),
                }
            }
        })?;
    }
    let mut sums: Vec<(i64, Sum)> = sums.into_iter().collect();
    sums.sort_unstable_by_key(|(cid, _)| *cid);
    Ok(Some(Pass {
        upto,
        sums,
        next: 0,
    }))
}

impl Pass {
    pub fn done(&self) -> bool {
        self.next >= self.sums.len()
    }
}

/// Applies the next chunk of `pass` in one transaction (the last chunk
/// also deletes the pass's log rows), and marks the counters it made
/// current in `hot`, under its lock with the commit.
pub(super) fn chunk(
    conn: &mut Connection,
    pass: &mut Pass,
    hot: &hot::Shared,
    first_days: &[u32],
    trend: &[i64],
) -> Result<(), StoreError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(sql("fold::chunk"))?;
    let size = if first_days.is_empty() && trend.is_empty() {
        CHUNK
    } else {
        CHUNK_KEPT
    };
    let end = (pass.next + size).min(pass.sums.len());
    {
        let mut counter = tx
            .prepare_cached(
                "UPDATE counters SET
                     value = value + ?2,
                     category = coalesce(?3, category),
                     first_ts = min(first_ts, ?4),
                     recorded_ts = max(recorded_ts, ?5)
                 WHERE cid = ?1",
            )
            .map_err(sql("fold::chunk"))?;
        let mut bucket = tx
            .prepare_cached(
                "INSERT INTO buckets (day, cid, value) VALUES (?1, ?2, ?3)
                 ON CONFLICT (day, cid) DO UPDATE SET value = value + excluded.value",
            )
            .map_err(sql("fold::chunk"))?;
        let mut hours = super::hours::HourRows::prepare(&tx)?;
        let mut kept = if first_days.is_empty() {
            None
        } else {
            Some(firstdays::Upsert::prepare(&tx)?)
        };
        for (cid, sum) in &pass.sums[pass.next..end] {
            let cid = *cid;
            // The counter as it was: its windows' day, before this pass's
            // first touch may move it.
            let before = match kept {
                Some(_) => firstdays::target(&tx, cid)?,
                None => None,
            };
            let changed = match i64::try_from(sum.delta) {
                // In range: the flushes checked the value after each of
                // them, so `value + delta` is the value now and fits.
                Ok(delta) => counter
                    .execute(params![
                        cid,
                        delta,
                        sum.category.as_deref(),
                        sum.first_ms,
                        sum.last_ms
                    ])
                    .map_err(sql("fold::chunk"))?,
                // The pass spans flushes that went far one way and back.
                Err(_) => set_counter(&tx, cid, sum)?,
            };
            if changed == 0 {
                // Deleted since (a delete folds first, so only after a
                // crash of an older build): nothing to bring up to date.
                continue;
            }
            for &(day, d) in &sum.days {
                match i64::try_from(d) {
                    Ok(d) => {
                        bucket
                            .execute(params![day, cid, d])
                            .map_err(sql("fold::chunk"))?;
                    }
                    Err(_) => set_bucket(&tx, cid, day, d)?,
                }
            }
            for &(hour, d) in &sum.hours {
                hours.add(cid, hour, d)?;
            }
            if !trend.is_empty() {
                super::trendkeys::fold(&tx, trend, cid, &sum.days, &sum.hours)?;
            }
            if let (Some(put), Some(before)) = (&mut kept, &before) {
                firstdays::fold(&tx, put, first_days, cid, before, sum.first_ms, &sum.days)?;
            }
        }
    }
    let last_cid = pass.sums.get(end.wrapping_sub(1)).map_or(0, |(c, _)| *c);
    if end >= pass.sums.len() {
        tx.execute("DELETE FROM counter_log WHERE seq <= ?1", [pass.upto])
            .map_err(sql("fold::chunk"))?;
        tx.execute("DELETE FROM fold_state", [])
            .map_err(sql("fold::chunk"))?;
    } else {
        tx.execute(
            "INSERT OR REPLACE INTO fold_state (id, upto, done_cid) VALUES (1, ?1, ?2)",
            params![pass.upto, last_cid],
        )
        .map_err(sql("fold::chunk"))?;
    }
    let mut hot = hot.lock();
    tx.commit().map_err(sql("fold::chunk"))?;
    hot.folded(pass.sums[pass.next..end].iter().map(|(c, _)| *c), pass.upto);
    drop(hot);
    pass.next = end;
    Ok(())
}

/// `counters.value` moved by a delta past i64 (the value after it fits).
fn set_counter(tx: &Connection, cid: i64, sum: &Sum) -> Result<usize, StoreError> {
    let old: Option<i64> = tx
        .query_row("SELECT value FROM counters WHERE cid = ?1", [cid], |r| {
            r.get(0)
        })
        .optional()
        .map_err(sql("fold::set_counter"))?;
    let Some(old) = old else { return Ok(0) };
    let value = i64::try_from(i128::from(old) + sum.delta)
        .map_err(|_| internal_msg("the change log takes a counter outside i64"))?;
    tx.execute(
        "UPDATE counters SET value = ?2, category = coalesce(?3, category),
             first_ts = min(first_ts, ?4), recorded_ts = max(recorded_ts, ?5)
         WHERE cid = ?1",
        params![
            cid,
            value,
            sum.category.as_deref(),
            sum.first_ms,
            sum.last_ms
        ],
    )
    .map_err(sql("fold::set_counter"))
}

/// A bucket moved by a delta past i64 (the value after it fits).
fn set_bucket(tx: &Connection, cid: i64, day: i64, d: i128) -> Result<(), StoreError> {
    let old: i64 = tx
        .query_row(
            "SELECT value FROM buckets WHERE day = ?1 AND cid = ?2",
            [day, cid],
            |r| r.get(0),
        )
        .optional()
        .map_err(sql("fold::set_bucket"))?
        .unwrap_or(0);
    let value = i64::try_from(i128::from(old) + d)
        .map_err(|_| internal_msg("the change log takes a bucket outside i64"))?;
    tx.execute(
        "INSERT INTO buckets (day, cid, value) VALUES (?1, ?2, ?3)
         ON CONFLICT (day, cid) DO UPDATE SET value = excluded.value",
        params![day, cid, value],
    )
    .map_err(sql("fold::set_bucket"))?;
    Ok(())
}

/// Pending counters (with deltas not folded) past which a flush is
/// followed by a chunk of folding. Past the same mark a flush writes the
/// counters with nothing pending directly (`write::DIRECT_PENDING`), so the
/// pending counters, all in memory, stay about this many.
const FOLD_PENDING: usize = super::write::DIRECT_PENDING;
/// Log entries (about 20 bytes each) past which a flush is followed by a
/// chunk of folding, so the log stays a few megabytes however few the keys.
const FOLD_LOGGED: usize = 200_000;

impl super::Writer {
    /// One bounded step of folding: a chunk of the pass under way, or of
    /// a new pass over the whole log. `false` when there is nothing to fold.
    pub(super) fn fold_step(&mut self) -> Result<bool, StoreError> {
        if self.pass.is_none() {
            self.pass = begin(&self.conn)?;
            self.logged = 0;
        }
        let Some(pass) = &mut self.pass else {
            return Ok(false);
        };
        chunk(
            &mut self.conn,
            pass,
            &self.hot,
            &self.first_days,
            &self.trend,
        )?;
        if pass.done() {
            self.pass = None;
        }
        Ok(true)
    }

    /// Folds every log row there is now (in chunks: a crash in between
    /// loses nothing).
    pub(super) fn fold_all(&mut self) -> Result<(), StoreError> {
        // A pass under way, then one over whatever it did not cover.
        let newest: Option<i64> = self
            .conn
            .query_row("SELECT max(seq) FROM counter_log", [], |r| r.get(0))
            .map_err(sql("fold::fold_all"))?;
        let Some(newest) = newest else { return Ok(()) };
        loop {
            let oldest: Option<i64> = self
                .conn
                .query_row("SELECT min(seq) FROM counter_log", [], |r| r.get(0))
                .map_err(sql("fold::fold_all"))?;
            if oldest.map_or(true, |o| o > newest) {
                return Ok(());
            }
            self.fold_step()?;
        }
    }

    /// After a flush: folds a chunk when the log or the pending counters
    /// have grown past their marks, and bounds the window totals memory
    /// holds (`windows_after_flush`). A failure is logged, not returned: the flush it
    /// follows committed.
    pub(super) fn fold_after_flush(&mut self) {
        if self.hooks.fold_held() {
            super::connections::checkpoint_if_due(&self.conn);
            return;
        }
        if let Err(e) = self.windows_after_flush() {
            tracing::warn!(error = %e, "writing window totals back failed (retried later)");
        }
        let pending = self.hot.pending();
        let result = if self.pass.is_some() || pending >= FOLD_PENDING || self.logged >= FOLD_LOGGED
        {
            self.fold_step().map(|_| ())
        } else {
            Ok(())
        };
        if let Err(e) = result {
            tracing::warn!(error = %e, "folding the change log failed (retried later)");
        }
        super::connections::checkpoint_if_due(&self.conn);
    }
}

impl super::SqliteStore {
    /// Folds every delta committed so far into the rows (a chunk per hold
    /// of the writer, so flushes go on in between): what a read of a list
    /// or a report needs first to be exact. Nothing to do when no counter
    /// has pending deltas.
    pub(super) async fn fold_now(&self) -> Result<(), StoreError> {
        if self.hot.pending() == 0 {
            return Ok(());
        }
        let newest: Option<i64> = self
            .with_writer(|w| {
                w.conn
                    .query_row("SELECT max(seq) FROM counter_log", [], |r| r.get(0))
                    .map_err(sql("fold::fold_now"))
            })
            .await?;
        let Some(newest) = newest else { return Ok(()) };
        loop {
            let done = self
                .with_writer(move |w| {
                    let oldest: Option<i64> = w
                        .conn
                        .query_row("SELECT min(seq) FROM counter_log", [], |r| r.get(0))
                        .map_err(sql("fold::fold_now"))?;
                    if oldest.map_or(true, |o| o > newest) {
                        return Ok(true);
                    }
                    w.fold_step()?;
                    Ok(false)
                })
                .await?;
            if done {
                return Ok(());
            }
        }
    }
}
