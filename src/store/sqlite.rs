//! The embedded store: SQLite in WAL mode, in a data directory.
//!
//! One writer connection applies whole flushes, one transaction and one fsync
//! each (group commit); readers use their own connections, which WAL lets run
//! beside the writer. Histogram buckets live in a table clustered by
//! `(day, counter)`, so a time-window query reads only the days of its window.
//!
//! A flush appends the deltas of counters that exist to a change log (one
//! blob, `log`) instead of updating their rows, indexes and buckets; the
//! fold (`fold`) brings those up to date later, off the acknowledgement
//! path. Until then the store's memory (`hot`) holds the exact state of
//! every counter with deltas not folded yet: a single counter is read from
//! there, an all-time list or a report folds first. The totals of the named
//! windows are kept exact at every moment by memory too (`windows`): a
//! windowed list never waits for folding.
//!
//! Every store of the process (one per tenant) shares one memory budget
//! ([`set_memory_budget`]: SQLite's soft heap limit over one page cache for
//! all connections), one bound on idle readers, and one background worker
//! (`background`), so that 1,000 tenants cost neither 1,000 threads nor
//! 1,000 private caches.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use super::{
    ActorMark, Average, AverageHistory, BatchOutcome, BlockingWrites, Bucket, CounterHistory,
    DaysOutcome, ImportBatch, ImportOutcome, RequestOutcome, StaleQuery, Store, StoreError,
    TopAverages, TopAveragesQuery, TopList, TopQuery, UnusedPair, WriteBatch,
};
use crate::domain::Coalesced;
use crate::domain::{Clock, Counter, CounterKey, DaySet, Increment, Window};

/// How hard a commit insists on reaching the disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Durability {
    /// fsync on every commit: an acknowledged increment survives power loss.
    Full,
    /// No fsync per commit: survives a process crash, may lose the last
    /// commits on power loss. Only ever an explicit choice.
    Relaxed,
}

mod backfill;
mod background;
mod fold;
mod hot;
mod log;
mod marks;
mod multiget;
mod queries;
mod transfer;
mod windows;
mod write;

/// 2: indexes for top lists and reports, average counters (`queries::SCHEMA_V2`).
/// 3: totals of the named rolling windows and their change log,
/// back-filled from `buckets` at open.
/// 4: those totals exact past i64 (`window_sums`); version 3's are rebuilt.
/// 5: the change log of flushes (`counter_log`, `fold_state`): an older
/// build would not see the deltas it holds, so it refuses the database.
/// 6: the window totals as two tables, the windows ending today and those
/// ending tomorrow, and what memory holds of them (`windows`), rebuilt
/// from `buckets` at open; version 5's `window_sums` and `bucket_log` go.
const SCHEMA_VERSION: i64 = 6;

const SCHEMA: &str = "
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

/// The database file in a store's data directory.
pub const DB_FILE: &str = "counters.sqlite3";

pub struct SqliteStore {
    path: PathBuf,
    /// The flush and fsync, shared with the pipeline's threads.
    writes: Arc<Writes>,
    writer: Arc<Mutex<Writer>>,
    /// The exact state of the counters flushes touched lately, every one
    /// with deltas not folded yet among them: shared with readers.
    hot: hot::Shared,
    readers: Arc<Readers>,
    /// The write-ahead log, fsync'd by [`Store::sync`]; `None` when relaxed.
    wal: Option<Arc<std::fs::File>>,
    /// Gives the UTC day the named windows end on and the time idempotency
    /// ids are claimed at.
    clock: Clock,
    /// When the last flush committed: the background's folding yields to a
    /// busy write path.
    last_write: Arc<Idle>,
    /// The kept idempotency ids as last counted by the background; held
    /// here (the worker holds it weakly) so that it counts in
    /// [`idempotency_ids`] while the store is open.
    _ids: Arc<AtomicI64>,
    /// Set for good when an fsync of the WAL fails: every later apply, sync
    /// and readiness check then fails, until restart.
    halted: Arc<std::sync::atomic::AtomicBool>,
    /// While armed, the WAL fsync fails as a full or failing disk would.
    fsync_fault: FsyncFault,
    /// While held, the change log is folded only where a read needs it.
    fold_hold: FoldHold,
}

/// Closing folds what is left in the change log, so the database file
/// reads whole without this build (the `sqlite3` shell, an export); a crash
/// leaves it to the next open, which folds it before anything reads.
impl Drop for SqliteStore {
    fn drop(&mut self) {
        if self.fold_hold.held() {
            return;
        }
        if let Ok(mut w) = self.writer.lock() {
            let closed = w
                .fold_all()
                .and_then(|()| w.write_back_bulk())
                .and_then(|_| w.write_back_all());
            if let Err(e) = closed {
                tracing::warn!(error = %e, "folding the change log at close failed (done at the next open)");
            }
        }
    }
}

/// The writer connection and what only code holding it may change.
struct Writer {
    conn: Connection,
    /// The store's memory of its counters (also the store's `hot`).
    hot: hot::Shared,
    /// A fold pass under way.
    pass: Option<fold::Pass>,
    /// Log entries appended since the last fold pass began.
    logged: usize,
    /// While held, nothing folds on its own (after flushes, in the
    /// background, at close); lists and reports still fold what they need.
    hold: FoldHold,
}

/// Pending counters (with deltas not folded) past which a flush is
/// followed by a chunk of folding. Past the same mark a flush writes the
/// counters with nothing pending directly (`write::DIRECT_PENDING`), so the
/// pending counters, all in memory, stay about this many.
const FOLD_PENDING: usize = write::DIRECT_PENDING;
/// Log entries (about 20 bytes each) past which a flush is followed by a
/// chunk of folding, so the log stays a few megabytes however few the keys.
const FOLD_LOGGED: usize = 200_000;

/// Counters whose window totals memory holds (about 200 bytes each) past
/// which each flush writes back [`WINDOWS_WRITE_BACK`] of them, so that
/// steady traffic over many counters keeps memory bounded...
const WINDOWS_HELD: usize = 262_144;
const WINDOWS_WRITE_BACK: usize = 500;
/// ...and past which the totals stop being kept until a rebuild from the
/// buckets once flushes pause (lists sum buckets meanwhile, exact): a load
/// of this many distinct counters between two pauses would otherwise run
/// at the pace of writing rows, some 50 µs per counter, where a rebuild
/// after it costs a few µs per bucket.
const WINDOWS_HELD_MAX: usize = 393_216;
/// Counters held past which writing them back in bulk may pay
/// (`Writer::write_back_bulk`).
const WINDOWS_BULK: usize = 65_536;
/// Counters whose window rows are written per transaction, and taken by
/// the copy of the day after per transaction: a few tens of milliseconds
/// of the writer, so a flush waits that long at most.
const WINDOWS_CHUNK: usize = 2_000;

impl Writer {
    /// One bounded step of folding: a chunk of the pass under way, or of
    /// a new pass over the whole log. `false` when there is nothing to fold.
    fn fold_step(&mut self) -> Result<bool, StoreError> {
        if self.pass.is_none() {
            self.pass = fold::begin(&self.conn)?;
            self.logged = 0;
        }
        let Some(pass) = &mut self.pass else {
            return Ok(false);
        };
        fold::chunk(&mut self.conn, pass, &self.hot)?;
        if pass.done() {
            self.pass = None;
        }
        Ok(true)
    }

    /// Folds every log row there is now (in chunks: a crash in between
    /// loses nothing).
    fn fold_all(&mut self) -> Result<(), StoreError> {
        // A pass under way, then one over whatever it did not cover.
        let newest: Option<i64> = self
            .conn
            .query_row("SELECT max(seq) FROM counter_log", [], |r| r.get(0))
            .map_err(internal)?;
        let Some(newest) = newest else { return Ok(()) };
        loop {
            let oldest: Option<i64> = self
                .conn
                .query_row("SELECT min(seq) FROM counter_log", [], |r| r.get(0))
                .map_err(internal)?;
            if oldest.map_or(true, |o| o > newest) {
                return Ok(());
            }
            self.fold_step()?;
        }
    }

    /// Writes the window rows of up to `n` counters memory holds (those
    /// with nothing pending: their buckets are exact, as the copy of the day
    /// after needs them), in chunks; returns how many.
    fn write_back(&mut self, n: usize) -> Result<usize, StoreError> {
        let mut done = 0;
        while done < n {
            let k = self.write_back_chunk((n - done).min(WINDOWS_CHUNK))?;
            if k == 0 {
                break;
            }
            done += k;
        }
        Ok(done)
    }

    fn write_back_chunk(&mut self, n: usize) -> Result<usize, StoreError> {
        let (state, mut held) = {
            let hot = self.hot.lock();
            let Some(state) = hot.windows.state else {
                return Ok(0);
            };
            let held: Vec<windows::memory::Held> = hot
                .windows
                .cids()
                .iter()
                .filter(|&&cid| !hot.is_pending(cid))
                .take(n)
                .filter_map(|&cid| hot.windows.held(cid))
                .collect();
            (state, held)
        };
        if held.is_empty() {
            return Ok(0);
        }
        held.sort_unstable_by_key(|h| h.cid);
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(internal)?;
        for h in &held {
            windows::write_rows(&tx, &state, h)?;
        }
        let mut hot = self.hot.lock();
        tx.commit().map_err(internal)?;
        for h in &held {
            hot.windows.remove(h.cid);
        }
        Ok(held.len())
    }

    /// Writes the window rows of every counter memory holds with nothing
    /// pending (all of them once the log is folded).
    fn write_back_all(&mut self) -> Result<(), StoreError> {
        while self.write_back_chunk(WINDOWS_CHUNK)? > 0 {}
        Ok(())
    }

    /// Writes back, in one transaction, every counter memory holds with
    /// nothing pending, when they are at least [`WINDOWS_BULK`] and as many
    /// as the rows of the current table (after a bulk load): with the top
    /// indexes dropped and built again after, one sort each instead of a
    /// random insert per row (measured at 300,000 counters: about 50 µs
    /// per counter row by row). `false` when it does not pay.
    fn write_back_bulk(&mut self) -> Result<bool, StoreError> {
        self.write_back_bulk_past(WINDOWS_BULK)
    }

    fn write_back_bulk_past(&mut self, bulk: usize) -> Result<bool, StoreError> {
        let (state, cids) = {
            let hot = self.hot.lock();
            let Some(state) = hot.windows.state else {
                return Ok(false);
            };
            if hot.windows.len() < bulk {
                return Ok(false);
            }
            let cids: Vec<i64> = hot
                .windows
                .cids()
                .iter()
                .copied()
                .filter(|&cid| !hot.is_pending(cid))
                .collect();
            (state, cids)
        };
        if cids.len() < bulk || (cids.len() as i64) < windows::rows(&self.conn, &state)? {
            return Ok(false);
        }
        let started = std::time::Instant::now();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(internal)?;
        windows::drop_indexes(&tx)?;
        let mut sorted = cids;
        sorted.sort_unstable();
        for chunk in sorted.chunks(WINDOWS_CHUNK) {
            let held: Vec<windows::memory::Held> = {
                let hot = self.hot.lock();
                chunk
                    .iter()
                    .filter_map(|&cid| hot.windows.held(cid))
                    .collect()
            };
            for h in &held {
                windows::write_rows(&tx, &state, h)?;
            }
        }
        windows::create_indexes(&tx)?;
        let mut hot = self.hot.lock();
        tx.commit().map_err(internal)?;
        for &cid in &sorted {
            hot.windows.remove(cid);
        }
        drop(hot);
        tracing::info!(
            counters = sorted.len(),
            ms = started.elapsed().as_millis() as u64,
            "window totals written back in bulk"
        );
        Ok(true)
    }

    /// Moves the kept window totals to `today` when the day changed: one
    /// flip once the table of the day after is complete (until then lists
    /// sum buckets); two days or more, and they are not kept until rebuilt.
    /// Cheap when nothing is due: every flush asks.
    fn windows_day(&mut self, today: i64) -> Result<(), StoreError> {
        let Some(state) = self.hot.lock().windows.state else {
            return Ok(());
        };
        if today <= state.anchor || (today == state.anchor + 1 && state.copied != windows::COMPLETE)
        {
            return Ok(());
        }
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(internal)?;
        if today != state.anchor + 1 {
            drop(tx);
            return self.drop_windows();
        }
        let next = windows::flip(&tx, &state)?;
        let mut hot = self.hot.lock();
        tx.commit().map_err(internal)?;
        hot.windows.flip(next);
        Ok(())
    }

    /// Stops keeping the window totals until a rebuild from the buckets
    /// (`windows_step`, once flushes pause): what memory held is dropped
    /// (it is in the buckets), and lists sum buckets meanwhile.
    fn drop_windows(&mut self) -> Result<(), StoreError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(internal)?;
        windows::drop_state(&tx)?;
        let mut hot = self.hot.lock();
        tx.commit().map_err(internal)?;
        hot.windows.state = None;
        hot.windows.clear();
        drop(hot);
        tracing::info!(
            "window totals no longer kept until rebuilt (a bulk load, or the clock days ahead)"
        );
        Ok(())
    }

    /// One bounded step of the window totals' own work: the day's flip,
    /// emptying then filling the table of the day after a chunk at a time,
    /// or (if `may_rebuild`) a rebuild from the buckets when they are not
    /// kept. `false` when there is nothing to do.
    fn windows_step(&mut self, today: i64, may_rebuild: bool) -> Result<bool, StoreError> {
        self.windows_day(today)?;
        let state = self.hot.lock().windows.state;
        let Some(state) = state else {
            if !may_rebuild {
                return Ok(false);
            }
            // Buckets are exact once the log is folded; what memory held
            // is in them.
            self.fold_all()?;
            let started = std::time::Instant::now();
            let tx = self
                .conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(internal)?;
            let state = windows::rebuild(&tx, today)?;
            let mut hot = self.hot.lock();
            tx.commit().map_err(internal)?;
            hot.windows.clear();
            hot.windows.state = Some(state);
            drop(hot);
            tracing::info!(
                ms = started.elapsed().as_millis() as u64,
                "window totals rebuilt from the buckets"
            );
            return Ok(true);
        };
        if state.copied == windows::COMPLETE {
            return Ok(false);
        }
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(internal)?;
        if state.copied < 0 {
            let next = windows::clear_next(&tx, &state)?;
            let mut hot = self.hot.lock();
            tx.commit().map_err(internal)?;
            hot.windows.state = Some(next);
            return Ok(true);
        }
        let copied = windows::copy_chunk(&tx, &state, &self.hot, WINDOWS_CHUNK)?;
        let mut hot = self.hot.lock();
        tx.commit().map_err(internal)?;
        for (cid, next) in &copied.next {
            hot.windows.set_next(*cid, next);
        }
        hot.windows.state = Some(copied.state);
        Ok(true)
    }

    /// After a flush: folds a chunk when the log or the pending counters
    /// have grown past their marks, and writes back window rows past
    /// [`WINDOWS_HELD`]. A failure is logged, not returned: the flush it
    /// follows committed.
    fn fold_after_flush(&mut self) {
        if self.hold.held() {
            return;
        }
        let held = self.hot.lock().windows.len();
        let kept = if held > WINDOWS_HELD_MAX {
            self.drop_windows()
        } else if held > WINDOWS_HELD {
            self.write_back(WINDOWS_WRITE_BACK).map(|_| ())
        } else {
            Ok(())
        };
        if let Err(e) = kept {
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
    }
}

/// What a flush and its fsync need of the store, apart from it so that the
/// pipeline can call them from threads of its own.
struct Writes {
    writer: Arc<Mutex<Writer>>,
    id_window_ms: i64,
    clock: Clock,
    last_write: Arc<Idle>,
    wal: Option<Arc<std::fs::File>>,
    halted: Arc<std::sync::atomic::AtomicBool>,
    fsync_fault: FsyncFault,
}

impl BlockingWrites for Writes {
    fn apply(&self, batch: WriteBatch) -> Result<BatchOutcome, StoreError> {
        if self.halted.load(Ordering::SeqCst) {
            return Err(StoreError::Halted(super::HALTED_AFTER_FSYNC.into()));
        }
        let now_ms = self.clock.now_ms();
        let mut w = self
            .writer
            .lock()
            .map_err(|_| StoreError::Internal("writer lock poisoned".into()))?;
        // Past midnight the flush adds to the windows of the new day.
        if let Err(e) = w.windows_day(self.clock.today()) {
            tracing::warn!(error = %e, "moving the window totals to the new day failed (retried)");
        }
        let out = match apply_coalesced(&mut w, &batch, now_ms, self.id_window_ms)? {
            Some(out) => out,
            None => apply_one_by_one(&mut w, &batch, now_ms, self.id_window_ms)?,
        };
        self.last_write.wrote();
        // Nothing may follow the commit here that could fail: an error
        // would tell every request of the flush that nothing was applied.
        // Old idempotency ids are forgotten in the background; folding
        // follows in `after_apply`, while the flush's fsync runs.
        Ok(out)
    }

    fn after_apply(&self) {
        if self.halted.load(Ordering::SeqCst) {
            return;
        }
        match self.writer.lock() {
            Ok(mut w) => w.fold_after_flush(),
            Err(_) => tracing::error!("writer lock poisoned: nothing folded after a flush"),
        }
    }

    fn sync(&self) -> Result<(), StoreError> {
        if self.halted.load(Ordering::SeqCst) {
            return Err(StoreError::Halted(super::HALTED_AFTER_FSYNC.into()));
        }
        let Some(wal) = &self.wal else {
            return Ok(());
        };
        let synced = if self.fsync_fault.armed() {
            Err(std::io::Error::from_raw_os_error(5)) // EIO
        } else {
            wal.sync_data()
        };
        if let Err(e) = synced {
            // PostgreSQL's lesson: after a failed fsync the kernel may have
            // dropped the dirty pages and report the next fsync as fine, so
            // no later fsync can vouch for what this one did not.
            self.halted.store(true, Ordering::SeqCst);
            tracing::error!(error = %e, "fsync of the write-ahead log failed; the store acknowledges no more writes until restart");
            return Err(StoreError::Internal(format!(
                "fsync of the write-ahead log failed: {e}"
            )));
        }
        Ok(())
    }
}

/// A hook for tests: while held, the change log is folded only where a
/// read needs it (lists, reports, deletes, backfills), window totals stay
/// in memory, and the table of the day after is not filled (but by
/// [`SqliteStore::catch_up`]), so a test can read counters whose deltas are
/// logged and not folded or whose totals only memory holds, cross midnight
/// before the copy is done, or leave all that to a crash.
#[derive(Clone, Debug, Default)]
pub struct FoldHold(Arc<std::sync::atomic::AtomicBool>);

impl FoldHold {
    pub fn hold(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    pub fn release(&self) {
        self.0.store(false, Ordering::SeqCst);
    }

    fn held(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// A fault hook for tests: while armed, [`Store::sync`] fails as if the
/// kernel had reported an fsync error (`EIO`), without touching the disk.
#[derive(Clone, Debug, Default)]
pub struct FsyncFault(Arc<std::sync::atomic::AtomicBool>);

impl FsyncFault {
    pub fn arm(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    pub fn disarm(&self) {
        self.0.store(false, Ordering::SeqCst);
    }

    fn armed(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// Milliseconds since the store opened at which the last flush committed.
/// Monotonic on purpose: it schedules work and is not a calendar time, so a
/// wall clock stepping back must not make the store look busy for hours.
struct Idle {
    opened: std::time::Instant,
    last_write_ms: AtomicI64,
}

impl Idle {
    fn new() -> Idle {
        Idle {
            opened: std::time::Instant::now(),
            last_write_ms: AtomicI64::new(i64::MIN / 2),
        }
    }

    fn now_ms(&self) -> i64 {
        i64::try_from(self.opened.elapsed().as_millis()).unwrap_or(i64::MAX)
    }

    fn wrote(&self) {
        self.last_write_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    fn quiet_for_ms(&self) -> i64 {
        self.now_ms() - self.last_write_ms()
    }

    fn last_write_ms(&self) -> i64 {
        self.last_write_ms.load(Ordering::Relaxed)
    }
}

/// Idempotency ids deleted per statement of the background expiry, each
/// its own transaction: bounded work, never part of a flush's result (how
/// long a turn may keep deleting is `background`'s budget).
const EXPIRE_BATCH: i64 = 5_000;

/// Day buckets (of counters and of averages) deleted per statement of the
/// background retention, each its own transaction, as for ids.
const RETAIN_BATCH: i64 = 5_000;

/// Deletes idempotency ids seen before `expired_before`, oldest first, in
/// batches of [`EXPIRE_BATCH`] (each its own transaction, through the
/// `event_ids_by_age` index), until none is left or `budget` is spent.
/// Returns how many were deleted. Claims already treat an id older than the
/// window as new, so how late this runs never changes an answer.
fn expire_ids(
    conn: &Connection,
    expired_before: i64,
    budget: std::time::Duration,
) -> Result<u64, StoreError> {
    let started = std::time::Instant::now();
    let mut deleted = 0u64;
    let mut s = conn
        .prepare_cached(
            "DELETE FROM event_ids WHERE id IN (
                 SELECT id FROM event_ids INDEXED BY event_ids_by_age
                 WHERE seen_ms < ?1 ORDER BY seen_ms LIMIT ?2)",
        )
        .map_err(internal)?;
    loop {
        let n = s
            .execute(params![expired_before, EXPIRE_BATCH])
            .map_err(internal)?;
        deleted += n as u64;
        if (n as i64) < EXPIRE_BATCH || started.elapsed() >= budget {
            return Ok(deleted);
        }
    }
}

/// The first day whose buckets are kept on `today`: the oldest day the
/// retention still accepts (`TimePolicy::oldest_accepted`), or the first day
/// of the year the kept window totals read, if that is older.
///
/// The named windows span at most 365 days, fewer than the retention (400
/// by default), so when the totals end on `today` no day older than the
/// retention is in any of them and deleting its buckets changes no kept
/// total. Totals still anchored on an earlier day (the copy of the day
/// after is not done) read the day that leaves from `buckets` when they
/// move on, and a rebuild reads the year before today: neither may find it
/// gone. The same floor keeps a year of buckets under a `--retention-days`
/// below 365.
fn first_kept_day(conn: &Connection, today: i64, retention_days: u32) -> Result<i64, StoreError> {
    let retained = (today - i64::from(retention_days)).min(today - 364);
    Ok(windows::load_state(conn)?.map_or(retained, |s| s.first_day().min(retained)))
}

/// Deletes the day buckets of counters and of averages older than the first
/// kept day (see [`first_kept_day`]), oldest days first, in batches of
/// [`RETAIN_BATCH`] by primary key `(day, id)` (each its own transaction),
/// until none is left or `budget` is spent. Returns how many were deleted.
/// A counter's value and timestamps stay: only its old days go.
fn expire_buckets(
    conn: &Connection,
    today: i64,
    retention_days: u32,
    budget: std::time::Duration,
) -> Result<u64, StoreError> {
    let started = std::time::Instant::now();
    let before = first_kept_day(conn, today, retention_days)?;
    let mut deleted = 0u64;
    for sql in [
        "DELETE FROM buckets WHERE (day, cid) IN (
             SELECT day, cid FROM buckets WHERE day < ?1 ORDER BY day, cid LIMIT ?2)",
        "DELETE FROM average_buckets WHERE (day, aid) IN (
             SELECT day, aid FROM average_buckets WHERE day < ?1 ORDER BY day, aid LIMIT ?2)",
    ] {
        let mut s = conn.prepare_cached(sql).map_err(internal)?;
        loop {
            if started.elapsed() >= budget {
                return Ok(deleted);
            }
            let n = s.execute(params![before, RETAIN_BATCH]).map_err(internal)?;
            deleted += n as u64;
            if (n as i64) < RETAIN_BATCH {
                break;
            }
        }
    }
    Ok(deleted)
}

fn count_ids(conn: &Connection) -> Result<i64, StoreError> {
    conn.query_row("SELECT count(*) FROM event_ids", [], |r| r.get(0))
        .map_err(internal)
}

/// The idempotency ids kept by every embedded store open in this process
/// (one per tenant), as last counted: `counter_gateway_idempotency_ids`.
pub fn idempotency_ids() -> i64 {
    let Ok(mut gauges) = ID_GAUGES.lock() else {
        return 0;
    };
    gauges.retain(|g| g.strong_count() > 0);
    gauges
        .iter()
        .filter_map(std::sync::Weak::upgrade)
        .map(|g| g.load(Ordering::Relaxed))
        .sum()
}

/// Each open store's count of kept ids; a closed store's entry dies with it.
static ID_GAUGES: Mutex<Vec<std::sync::Weak<AtomicI64>>> = Mutex::new(Vec::new());

/// Readers kept open between requests by one store, and by all stores of
/// the process together; more may be opened under load and are closed after
/// their request. 1,000 tenants thus keep at most 1,000 writers and 256 idle
/// readers open (about 3 file descriptors each), not 9,000 connections; a
/// store's idle readers are closed after a minute without reads
/// (`background`), so quiet tenants leave the shared bound to busy ones.
const MAX_IDLE_READERS: usize = 4;
const MAX_IDLE_READERS_TOTAL: usize = 256;

/// Idle readers of every store of the process.
static IDLE_READERS: AtomicUsize = AtomicUsize::new(0);

/// The reader connections a store keeps between requests.
struct Readers {
    idle: Mutex<Vec<Connection>>,
    opened: std::time::Instant,
    /// Milliseconds after `opened` of the last read.
    last_used_ms: AtomicI64,
}

impl Readers {
    fn new() -> Readers {
        Readers {
            idle: Mutex::new(Vec::new()),
            opened: std::time::Instant::now(),
            last_used_ms: AtomicI64::new(0),
        }
    }

    fn now_ms(&self) -> i64 {
        i64::try_from(self.opened.elapsed().as_millis()).unwrap_or(i64::MAX)
    }

    /// Runs `f` on an idle reader of the database at `path`, or on a new one.
    fn with<T>(
        &self,
        path: &Path,
        f: impl FnOnce(&Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.last_used_ms.store(self.now_ms(), Ordering::Relaxed);
        let idle = self.idle.lock().ok().and_then(|mut r| r.pop());
        let conn = match idle {
            Some(c) => {
                IDLE_READERS.fetch_sub(1, Ordering::SeqCst);
                c
            }
            None => {
                let c = Connection::open(path).map_err(internal)?;
                configure(&c, reader_cache_kib())?;
                c
            }
        };
        let result = f(&conn);
        self.give_back(conn);
        result
    }

    /// Keeps `conn` for the next read if both bounds allow; closes it otherwise.
    fn give_back(&self, conn: Connection) {
        let Ok(mut idle) = self.idle.lock() else {
            return;
        };
        let room = idle.len() < MAX_IDLE_READERS
            && IDLE_READERS
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                    (n < MAX_IDLE_READERS_TOTAL).then_some(n + 1)
                })
                .is_ok();
        if room {
            idle.push(conn);
        }
    }

    /// Closes every idle reader when none was used for `unused`.
    fn close_unused_for(&self, unused: std::time::Duration) {
        let unused_ms = i64::try_from(unused.as_millis()).unwrap_or(i64::MAX);
        if self.now_ms() - self.last_used_ms.load(Ordering::Relaxed) < unused_ms {
            return;
        }
        let closing = match self.idle.lock() {
            Ok(mut idle) => std::mem::take(&mut *idle),
            Err(_) => return,
        };
        IDLE_READERS.fetch_sub(closing.len(), Ordering::SeqCst);
        drop(closing);
    }
}

impl Drop for Readers {
    fn drop(&mut self) {
        let n = match self.idle.get_mut() {
            Ok(idle) => idle.len(),
            Err(poisoned) => poisoned.into_inner().len(),
        };
        IDLE_READERS.fetch_sub(n, Ordering::SeqCst);
    }
}

/// The memory budget of SQLite in this process, in bytes (0: none set).
static MEMORY_BUDGET: AtomicU64 = AtomicU64::new(0);

/// Gives every embedded store of the process one memory budget: SQLite's
/// soft heap limit, `bytes`. Called once at start-up, before stores open.
///
/// The bundled SQLite is built with `SQLITE_ENABLE_MEMORY_MANAGEMENT`, so
/// all connections share one page cache with one LRU list, and the limit is
/// checked on every allocation: past it, SQLite recycles the least recently
/// used unpinned pages of any connection (sqlite.org/c3ref/hard_heap_limit64).
/// It is soft: memory that cannot be released (pages pinned by a running
/// statement, each connection's lookaside, schema and prepared statements,
/// about 100 KiB per store measured) may take SQLite past it, never an error.
/// Cache sizes follow it too: a writer may cache a quarter of the budget (at
/// most 64 MiB, its size before the budget), a reader 1/64 (at most SQLite's
/// default 2,000 KiB), so one busy tenant cannot evict all the others.
pub fn set_memory_budget(bytes: u64) {
    MEMORY_BUDGET.store(bytes, Ordering::SeqCst);
    let limit = i64::try_from(bytes).unwrap_or(i64::MAX);
    // SAFETY: a plain call with an integer; SQLite serialises it itself.
    unsafe {
        rusqlite::ffi::sqlite3_soft_heap_limit64(limit);
    }
}

/// The heap SQLite holds now, in bytes, for every connection of the process.
pub fn memory_used() -> i64 {
    // SAFETY: a plain call without arguments; SQLite serialises it itself.
    unsafe { rusqlite::ffi::sqlite3_memory_used() }
}

/// Page cache of a writer, in KiB: a quarter of the budget, at most 64 MiB.
fn writer_cache_kib() -> u64 {
    cache_kib(4, 65_536)
}

/// Page cache of a reader, in KiB: 1/64 of the budget, at most SQLite's default.
fn reader_cache_kib() -> u64 {
    cache_kib(64, 2_000)
}

fn cache_kib(share: u64, max_kib: u64) -> u64 {
    match MEMORY_BUDGET.load(Ordering::SeqCst) {
        0 => max_kib,
        budget => (budget / share / 1024).clamp(64, max_kib),
    }
}

/// Lookaside (SQLite's per-connection pool for small allocations) of each
/// connection: 32 slots of 1,200 bytes, 38 KB, instead of the 120 KB of the
/// default, which 1,000 tenants would pay twice over before caching a page.
const LOOKASIDE_SLOT: i32 = 1_200;
const LOOKASIDE_SLOTS: i32 = 32;

/// What every connection of a store is set up with, right after it opens
/// (the lookaside can be changed only before the connection used it).
fn configure(conn: &Connection, cache_kib: u64) -> Result<(), StoreError> {
    // SAFETY: `handle` is the open connection `conn` owns, used on this
    // thread only; SQLITE_DBCONFIG_LOOKASIDE takes exactly a buffer pointer
    // (null: SQLite allocates it) and two ints. When it cannot apply (the
    // lookaside is in use) it returns SQLITE_BUSY and leaves the default.
    unsafe {
        rusqlite::ffi::sqlite3_db_config(
            conn.handle(),
            rusqlite::ffi::SQLITE_DBCONFIG_LOOKASIDE,
            std::ptr::null_mut::<std::ffi::c_void>(),
            LOOKASIDE_SLOT,
            LOOKASIDE_SLOTS,
        );
    }
    conn.busy_timeout(std::time::Duration::from_secs(5))
        .map_err(internal)?;
    // Each window of each of the two tables has a statement of its own.
    conn.set_prepared_statement_cache_capacity(64);
    conn.execute_batch(&format!("PRAGMA cache_size = -{cache_kib}"))
        .map_err(internal)
}

impl SqliteStore {
    /// The UTC day the named windows (`last_day` ... `last_year`) end on:
    /// the clock's. When the clock moves to another day, the kept totals
    /// roll to it (forwards in steps; backwards not at all: windowed lists
    /// ending on a day before the totals' anchor are summed from buckets).
    pub fn today(&self) -> i64 {
        self.clock.today()
    }

    /// Folds the whole change log, writes every window total memory holds
    /// back to the kept tables, and brings those to today (the day's flip,
    /// the table of the day after complete, or a rebuild), however long
    /// that takes, in one hold of the writer. Lists never need it (they are
    /// exact at every moment); a test that reads the tables, or that wants
    /// them complete before crossing midnight, calls it.
    pub async fn catch_up(&self) -> Result<(), StoreError> {
        let today = self.today();
        self.with_writer(move |w| {
            w.fold_all()?;
            w.write_back_bulk()?;
            w.write_back_all()?;
            while w.windows_step(today, true)? {}
            Ok(())
        })
        .await
    }

    /// Folds every delta committed so far into the rows (a chunk per hold
    /// of the writer, so flushes go on in between): what a read of a list
    /// or a report needs first to be exact. Nothing to do when no counter
    /// has pending deltas.
    async fn fold_now(&self) -> Result<(), StoreError> {
        if self.hot.pending() == 0 {
            return Ok(());
        }
        let newest: Option<i64> = self
            .with_writer(|w| {
                w.conn
                    .query_row("SELECT max(seq) FROM counter_log", [], |r| r.get(0))
                    .map_err(internal)
            })
            .await?;
        let Some(newest) = newest else { return Ok(()) };
        loop {
            let done = self
                .with_writer(move |w| {
                    let oldest: Option<i64> = w
                        .conn
                        .query_row("SELECT min(seq) FROM counter_log", [], |r| r.get(0))
                        .map_err(internal)?;
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

    /// Opens (creating if needed) the database in `data_dir`; `clock` is the
    /// store's only source of the date and time. Day buckets older than
    /// `retention_days` before the clock's day are deleted in the background.
    pub fn open(
        data_dir: &Path,
        durability: Durability,
        id_window: std::time::Duration,
        retention_days: u32,
        clock: Clock,
    ) -> Result<Self, StoreError> {
        std::fs::create_dir_all(data_dir).map_err(|e| {
            StoreError::Internal(format!(
                "cannot create data directory {}: {e}",
                data_dir.display()
            ))
        })?;
        let path = data_dir.join(DB_FILE);
        let mut conn = Connection::open(&path).map_err(internal)?;
        configure(&conn, writer_cache_kib())?;
        let mode: String = conn
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .map_err(internal)?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::Internal(format!(
                "SQLite refused WAL mode (got {mode})"
            )));
        }
        // Commits never fsync inside SQLite (NORMAL still syncs around
        // checkpoints). With full durability the pipeline fsyncs the WAL itself
        // through `sync`, after the commit and outside the writer lock, so the
        // next flush is written while this one reaches the disk: a commit is
        // acknowledged only after an fsync that began after it.
        conn.execute_batch("PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = OFF;")
            .map_err(internal)?;
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(internal)?;
        if version > SCHEMA_VERSION {
            return Err(StoreError::Internal(format!(
                "database schema version {version} is newer than this build understands ({SCHEMA_VERSION})"
            )));
        }
        // One transaction, not one commit per table and index: the part of
        // opening a new tenant that took longest.
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(internal)?;
        tx.execute_batch(SCHEMA).map_err(internal)?;
        tx.execute_batch(queries::SCHEMA_V2).map_err(internal)?;
        if version < 6 {
            tx.execute_batch(windows::OLD_TABLES).map_err(internal)?;
        }
        tx.execute_batch(&windows::schema()).map_err(internal)?;
        tx.execute_batch(marks::SCHEMA).map_err(internal)?;
        let named = marks::backfill_keys(&tx)?;
        if named > 0 {
            tracing::info!(counters = named, path = %path.display(), "named the counters of actor marks made by an earlier version");
        }
        tx.commit().map_err(internal)?;
        let hot = hot::Shared::default();
        let mut writer = Writer {
            conn,
            hot: hot.clone(),
            pass: None,
            logged: 0,
            hold: FoldHold::default(),
        };
        // What a crash left in the change log is folded before anything
        // reads: the rows are then exact, and nothing is pending.
        writer.fold_all()?;
        let mut conn = writer.conn;
        let window_state = open_windows(&mut conn, clock.today())?;
        hot.lock().windows.state = Some(window_state);
        conn.execute_batch(&format!("PRAGMA user_version = {SCHEMA_VERSION}"))
            .map_err(internal)?;
        let wal = match durability {
            Durability::Full => Some(Arc::new(open_wal(data_dir, &path)?)),
            Durability::Relaxed => None,
        };
        let id_window_ms = i64::try_from(id_window.as_millis()).unwrap_or(i64::MAX);
        let ids = Arc::new(AtomicI64::new(count_ids(&conn)?));
        if let Ok(mut gauges) = ID_GAUGES.lock() {
            gauges.push(Arc::downgrade(&ids));
        }
        let fold_hold = FoldHold::default();
        let writer = Arc::new(Mutex::new(Writer {
            conn,
            hot: hot.clone(),
            pass: None,
            logged: 0,
            hold: fold_hold.clone(),
        }));
        let readers = Arc::new(Readers::new());
        let last_write = Arc::new(Idle::new());
        background::register(background::Job {
            writer: Arc::downgrade(&writer),
            hot: hot.clone(),
            readers: Arc::downgrade(&readers),
            path: path.clone(),
            clock: clock.clone(),
            idle: last_write.clone(),
            id_window_ms,
            ids: Arc::downgrade(&ids),
            retention_days,
        });
        let halted = Arc::<std::sync::atomic::AtomicBool>::default();
        let fsync_fault = FsyncFault::default();
        let writes = Arc::new(Writes {
            writer: writer.clone(),
            id_window_ms,
            clock: clock.clone(),
            last_write: last_write.clone(),
            wal: wal.clone(),
            halted: halted.clone(),
            fsync_fault: fsync_fault.clone(),
        });
        Ok(SqliteStore {
            writes,
            _ids: ids,
            clock,
            last_write,
            path,
            writer,
            hot,
            readers,
            wal,
            fsync_fault,
            fold_hold,
            halted,
        })
    }

    /// `Err(Halted)` once an fsync has failed.
    fn check_halted(&self) -> Result<(), StoreError> {
        if self.halted.load(Ordering::SeqCst) {
            return Err(StoreError::Halted(super::HALTED_AFTER_FSYNC.into()));
        }
        Ok(())
    }

    /// The hook that makes this store's fsyncs fail while armed (tests).
    pub fn fsync_fault(&self) -> FsyncFault {
        self.fsync_fault.clone()
    }

    /// The hook that keeps this store from folding on its own (tests).
    pub fn fold_hold(&self) -> FoldHold {
        self.fold_hold.clone()
    }

    async fn with_writer<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Writer) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let writer = self.writer.clone();
        tokio::task::spawn_blocking(move || {
            let mut w = writer
                .lock()
                .map_err(|_| StoreError::Internal("writer lock poisoned".into()))?;
            f(&mut w)
        })
        .await
        .map_err(|e| StoreError::Internal(format!("store task failed: {e}")))?
    }

    async fn with_reader<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let readers = self.readers.clone();
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || readers.with(&path, f))
            .await
            .map_err(|e| StoreError::Internal(format!("store task failed: {e}")))?
    }
}

/// Brings the kept window totals to `today` at open (the change log is
/// folded: buckets are exact): a flip if the day after is complete, a
/// rebuild from the buckets if they are missing (a new database, or one of
/// schema 5 or before) or two days or more behind; the counters memory
/// held at a crash (`windows_dirty`) are recomputed from their buckets.
fn open_windows(conn: &mut Connection, today: i64) -> Result<windows::State, StoreError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(internal)?;
    let state = match windows::load_state(&tx)? {
        // Current, the day before, or the clock behind the anchor.
        Some(s) if today <= s.anchor + 1 => s,
        _ => windows::rebuild(&tx, today)?,
    };
    let held: Vec<i64> = tx
        .prepare("SELECT cid FROM windows_dirty")
        .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
        .map_err(internal)?;
    for cid in held {
        windows::recompute(&tx, &state, cid)?;
    }
    let state = if today == state.anchor + 1 && state.copied == windows::COMPLETE {
        windows::flip(&tx, &state)?
    } else {
        state
    };
    tx.commit().map_err(internal)?;
    Ok(state)
}

/// Opens the WAL file that the writer connection keeps for its lifetime
/// (SQLite removes it only when the last connection closes), and makes its
/// directory entry and the schema written so far durable.
fn open_wal(data_dir: &Path, db: &Path) -> Result<std::fs::File, StoreError> {
    let io = |what: &str, e: std::io::Error| StoreError::Internal(format!("{what}: {e}"));
    let mut name = db.as_os_str().to_owned();
    name.push("-wal");
    let wal = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&name)
        .map_err(|e| io("cannot open the write-ahead log", e))?;
    wal.sync_data()
        .map_err(|e| io("fsync of the write-ahead log", e))?;
    std::fs::File::open(data_dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io("fsync of the data directory", e))?;
    Ok(wal)
}

fn internal(e: rusqlite::Error) -> StoreError {
    StoreError::Internal(format!("sqlite: {e}"))
}

fn internal_msg(m: &str) -> StoreError {
    StoreError::Internal(format!("sqlite: {m}"))
}

/// Why a coalesced write could not be applied as a whole.
struct Overflowed(CounterKey);

/// Claims the idempotency ids of `events`; returns which events were already
/// counted (by this batch or an earlier one) inside the id window. An id
/// seen before the window is claimed afresh whether or not its row has been
/// deleted yet, so the window is exact however late the clean-up runs.
fn claim_ids(
    tx: &Connection,
    events: &[Increment],
    now_ms: i64,
    id_window_ms: i64,
) -> Result<Vec<bool>, StoreError> {
    let mut dup = vec![false; events.len()];
    if events.iter().all(|e| e.id.is_none()) {
        return Ok(dup);
    }
    let mut claim = tx
        .prepare_cached(
            "INSERT INTO event_ids (id, seen_ms) VALUES (?1, ?2)
             ON CONFLICT (id) DO UPDATE SET seen_ms = excluded.seen_ms WHERE seen_ms < ?3",
        )
        .map_err(internal)?;
    let expired_before = now_ms.saturating_sub(id_window_ms);
    for (i, e) in events.iter().enumerate() {
        if let Some(id) = &e.id {
            let claimed = claim
                .execute(params![&**id, now_ms, expired_before])
                .map_err(internal)?;
            dup[i] = claimed == 0;
        }
    }
    Ok(dup)
}

fn coalesce_fresh(events: &[Increment], dup: &[bool], into: &mut Coalesced) -> u32 {
    let mut duplicates = 0;
    for (e, &d) in events.iter().zip(dup) {
        if d {
            duplicates += 1;
        } else {
            into.add(e);
        }
    }
    duplicates
}

/// The common case: the whole batch coalesced and written at once. `None`
/// when some key would overflow: the transaction is then dropped (rolled back).
fn apply_coalesced(
    w: &mut Writer,
    batch: &WriteBatch,
    now_ms: i64,
    id_window_ms: i64,
) -> Result<Option<BatchOutcome>, StoreError> {
    let tx = Flushing::begin(&w.conn)?;
    let mut out = BatchOutcome::default();
    let mut all = Coalesced::default();
    for events in &batch.requests {
        let mut dup = claim_ids(&tx, events, now_ms, id_window_ms)?;
        let repeats = marks::claim(&tx, events, &mut dup)?;
        let duplicates = coalesce_fresh(events, &dup, &mut all) - repeats;
        out.requests.push(RequestOutcome::Applied { duplicates });
        out.repeats.push(repeats);
    }
    let hot = w.hot.clone();
    let mut flush = write::Flush::coalesced(&hot, all.keys.len());
    if flush.add(&tx, &all)?.is_err() {
        return Ok(None);
    }
    if write::averages(&tx, &all, &mut out.store_writes)?.is_err() {
        return Ok(None);
    }
    flush.write(&tx)?;
    out.store_writes += flush.writes;
    let done = flush.finish();
    out.counters = done.counters(&batch.wanted);
    multiget::unwritten_wanted(&tx, &batch.wanted, &mut out.counters, &hot.lock())?;
    w.logged += done.logged();
    write::commit_and_publish(|| tx.commit(), done, &hot)?;
    Ok(Some(out))
}

/// The transaction of a flush's common case, begun and committed by
/// statements prepared once per connection (rusqlite's `Transaction`
/// parses `BEGIN` and `COMMIT` again each time, a few µs per flush);
/// rolled back when dropped uncommitted.
struct Flushing<'c> {
    conn: &'c Connection,
}

impl<'c> Flushing<'c> {
    fn begin(conn: &'c Connection) -> Result<Flushing<'c>, StoreError> {
        conn.prepare_cached("BEGIN IMMEDIATE")
            .and_then(|mut s| s.execute([]))
            .map_err(internal)?;
        Ok(Flushing { conn })
    }

    fn commit(self) -> Result<(), StoreError> {
        self.conn
            .prepare_cached("COMMIT")
            .and_then(|mut s| s.execute([]))
            .map_err(internal)?;
        Ok(())
    }
}

impl std::ops::Deref for Flushing<'_> {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        self.conn
    }
}

impl Drop for Flushing<'_> {
    fn drop(&mut self) {
        // Uncommitted (an error, an overflow), or a COMMIT that failed and
        // left the transaction open: nothing of it stays.
        if !self.conn.is_autocommit() {
            let _ = self.conn.execute_batch("ROLLBACK");
        }
    }
}

/// The rare case: some key overflowed. Each request is checked on its own,
/// in arrival order, against the state the requests before it leave (its
/// claims and averages inside a savepoint), so exactly the requests that
/// would overflow are refused and the others still land, in one commit.
fn apply_one_by_one(
    w: &mut Writer,
    batch: &WriteBatch,
    now_ms: i64,
    id_window_ms: i64,
) -> Result<BatchOutcome, StoreError> {
    let mut tx = w
        .conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(internal)?;
    let mut out = BatchOutcome::default();
    let hot = w.hot.clone();
    let mut flush = write::Flush::by_request(&hot);
    for events in &batch.requests {
        let sp = tx.savepoint().map_err(internal)?;
        let mut dup = claim_ids(&sp, events, now_ms, id_window_ms)?;
        let repeats = marks::claim(&sp, events, &mut dup)?;
        let mut mine = Coalesced::default();
        let duplicates = coalesce_fresh(events, &dup, &mut mine) - repeats;
        let checked = match flush.check(&sp, &mine)? {
            Ok(at) => write::averages(&sp, &mine, &mut out.store_writes)?.map(|()| at),
            Err(o) => Err(o),
        };
        match checked {
            Ok(at) => {
                sp.commit().map_err(internal)?;
                flush.apply(&mine, at);
                out.requests.push(RequestOutcome::Applied { duplicates });
                out.repeats.push(repeats);
            }
            Err(Overflowed(key)) => {
                drop(sp); // rolls back to the savepoint
                out.requests.push(RequestOutcome::Overflow { key });
                out.repeats.push(0);
            }
        }
    }
    flush.write(&tx)?;
    out.store_writes += flush.writes;
    let done = flush.finish();
    out.counters = done.counters(&batch.wanted);
    multiget::unwritten_wanted(&tx, &batch.wanted, &mut out.counters, &hot.lock())?;
    w.logged += done.logged();
    write::commit_and_publish(|| tx.commit().map_err(internal), done, &hot)?;
    Ok(out)
}

/// Commits `tx`, in which a backfill or an import set the rows and buckets
/// of the counters `cids` (named `keys`) directly: their window totals are
/// recomputed from their buckets first, and memory forgets them with the
/// commit, under its lock (their rows, buckets and window rows are exact).
fn commit_set_directly<'k>(
    tx: rusqlite::Transaction<'_>,
    hot: &hot::Shared,
    cids: &[i64],
    keys: impl Iterator<Item = &'k CounterKey>,
) -> Result<(), StoreError> {
    let state = hot.lock().windows.state;
    let mut cids = cids.to_vec();
    cids.sort_unstable();
    cids.dedup();
    if let Some(state) = state {
        for &cid in &cids {
            windows::recompute(&tx, &state, cid)?;
        }
    }
    let mut held = hot.lock();
    tx.commit().map_err(internal)?;
    for k in keys {
        held.remove(k);
    }
    for &cid in &cids {
        held.windows.remove(cid);
    }
    Ok(())
}

fn read_counter(row: &rusqlite::Row<'_>, key: CounterKey) -> rusqlite::Result<Counter> {
    Ok(Counter {
        key,
        value: row.get("value")?,
        category: row.get("category")?,
        first_ms: row.get("first_ts")?,
        recorded_ms: row.get("recorded_ts")?,
    })
}

#[async_trait]
impl Store for SqliteStore {
    async fn apply(&self, batch: WriteBatch) -> Result<BatchOutcome, StoreError> {
        self.check_halted()?;
        let writes = self.writes.clone();
        tokio::task::spawn_blocking(move || {
            let out = writes.apply(batch);
            writes.after_apply();
            out
        })
        .await
        .map_err(|e| StoreError::Internal(format!("store task failed: {e}")))?
    }

    /// The pipeline calls these on threads of its own: no task per flush.
    fn blocking_writes(&self) -> Option<Arc<dyn BlockingWrites>> {
        Some(self.writes.clone())
    }

    /// A counter in memory is answered from there (every one with deltas
    /// not folded yet is), any other from its row (which is then exact).
    async fn get(&self, key: &CounterKey) -> Result<Option<Counter>, StoreError> {
        if let Some(e) = self.hot.lock().get(key) {
            return Ok(Some(e.counter(key)));
        }
        let key = key.clone();
        self.with_reader(move |conn| {
            conn.prepare_cached(multiget::BY_KEY)
                .and_then(|mut s| {
                    s.query_row(params![&*key.entity, &*key.action, &*key.uuid], |r| {
                        read_counter(r, key.clone())
                    })
                    .optional()
                })
                .map_err(internal)
        })
        .await
    }

    /// Read under the lock of memory, so no flush commits in between: each
    /// row is exact unless memory holds its counter.
    async fn target_counters(&self, entity: &str, uuid: &str) -> Result<Vec<Counter>, StoreError> {
        let (entity, uuid): (Arc<str>, Arc<str>) = (entity.into(), uuid.into());
        let hot = self.hot.clone();
        self.with_reader(move |conn| {
            let shown = hot.lock();
            let mut s = conn
                .prepare_cached(
                    "SELECT action, value, category, first_ts, recorded_ts FROM counters
                     WHERE entity = ?1 AND uuid = ?2 ORDER BY action",
                )
                .map_err(internal)?;
            let rows = s
                .query_map(params![&*entity, &*uuid], |r| {
                    let action: String = r.get("action")?;
                    let key = CounterKey {
                        entity: entity.clone(),
                        action: action.into(),
                        uuid: uuid.clone(),
                    };
                    match shown.get(&key) {
                        Some(e) => Ok(e.counter(&key)),
                        None => read_counter(r, key),
                    }
                })
                .map_err(internal)?;
            rows.collect::<Result<Vec<_>, _>>().map_err(internal)
        })
        .await
    }

    async fn delete(&self, key: &CounterKey) -> Result<bool, StoreError> {
        self.check_halted()?;
        let key = key.clone();
        let deleted = self.with_writer(move |w| {
            // Folded first: the log then holds nothing of this counter.
            w.fold_all()?;
            w.hot.lock().remove(&key);
            let tx = w.conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(internal)?;
            let cid: Option<i64> = tx
                .query_row(
                    "DELETE FROM counters WHERE entity = ?1 AND action = ?2 AND uuid = ?3 RETURNING cid",
                    params![&*key.entity, &*key.action, &*key.uuid],
                    |r| r.get(0),
                )
                .optional()
                .map_err(internal)?;
            if let Some(cid) = cid {
                tx.execute("DELETE FROM buckets WHERE cid = ?1", [cid]).map_err(internal)?;
                windows::forget(&tx, cid)?;
            }
            marks::forget(&tx, &key)?;
            // Its window totals leave memory with the commit: a later
            // counter given the same cid inherits nothing.
            let mut hot = w.hot.lock();
            tx.commit().map_err(internal)?;
            if let Some(cid) = cid {
                hot.windows.remove(cid);
            }
            Ok(cid.is_some())
        })
        .await?;
        self.sync().await?;
        Ok(deleted)
    }

    async fn sync(&self) -> Result<(), StoreError> {
        self.check_halted()?;
        if self.wal.is_none() {
            return Ok(());
        }
        let writes = self.writes.clone();
        tokio::task::spawn_blocking(move || writes.sync())
            .await
            .map_err(|e| StoreError::Internal(format!("fsync task failed: {e}")))?
    }

    async fn ready(&self) -> Result<(), StoreError> {
        self.check_halted()?;
        self.with_reader(|conn| {
            conn.query_row("SELECT count(*) FROM sqlite_master", [], |r| {
                r.get::<_, i64>(0)
            })
            .map(|_| ())
            .map_err(|e| StoreError::Unavailable(format!("sqlite: {e}")))
        })
        .await
    }

    async fn histogram(
        &self,
        key: &CounterKey,
        window: Window,
    ) -> Result<Option<Vec<Bucket>>, StoreError> {
        let key = key.clone();
        let hot = self.hot.clone();
        self.with_reader(move |c| {
            // Under the lock, as `target_counters`: the pending days of the
            // counter replace the rows of those days.
            let shown = hot.lock();
            let Some(mut buckets) = queries::histogram(c, &key, window)? else {
                return Ok(None);
            };
            if let Some(e) = shown.get(&key) {
                for &hot::Day {
                    day,
                    value,
                    pending,
                } in &e.days
                {
                    if !pending || day < window.from_day || day > window.to_day {
                        continue;
                    }
                    match buckets.binary_search_by_key(&day, |b| b.day) {
                        Ok(i) => buckets[i].value = value,
                        Err(i) => buckets.insert(i, Bucket { day, value }),
                    }
                }
            }
            Ok(Some(buckets))
        })
        .await
    }

    /// All time: the rows merged with the values memory holds of the
    /// counters whose rows miss deltas. A named window ending today: the
    /// kept totals merged with memory. Both exact as of now whatever is
    /// folded or written back (see `windows`). Otherwise (a `from`/`to`
    /// range, the kept totals not ending today or not kept), the change log
    /// is folded and the rows read.
    async fn top(&self, query: &TopQuery) -> Result<TopList, StoreError> {
        let today = self.today();
        if query.window.is_none() {
            let q = query.clone();
            let hot = self.hot.clone();
            let merged = self
                .with_reader(move |c| queries::top_all_time(c, &hot.lock(), &q))
                .await?;
            if let Some(entries) = merged {
                return Ok(TopList {
                    entries,
                    exact: true,
                });
            }
        }
        if let Some(w) = query.window.and_then(|w| windows::named(w, today)) {
            let q = query.clone();
            let hot = self.hot.clone();
            let kept = self
                .with_reader(move |c| {
                    // Under memory's lock: no flush, fold or write-back
                    // commits while the table is read.
                    let held = hot.lock();
                    windows::top(c, &held.windows, &q, w, today)
                })
                .await?;
            if let Some(entries) = kept {
                return Ok(TopList {
                    entries,
                    exact: true,
                });
            }
        }
        self.fold_now().await?;
        let query = query.clone();
        self.with_reader(move |c| queries::top(c, &query)).await
    }

    async fn stale(&self, query: &StaleQuery) -> Result<Vec<Counter>, StoreError> {
        self.fold_now().await?;
        let query = query.clone();
        self.with_reader(move |c| queries::stale(c, &query)).await
    }

    async fn unused(&self, before_ms: i64) -> Result<Vec<UnusedPair>, StoreError> {
        self.fold_now().await?;
        self.with_reader(move |c| queries::unused(c, before_ms))
            .await
    }

    async fn average(
        &self,
        key: &CounterKey,
        window: Option<Window>,
    ) -> Result<Option<Average>, StoreError> {
        let key = key.clone();
        self.with_reader(move |c| queries::average(c, &key, window))
            .await
    }

    async fn top_averages(&self, query: &TopAveragesQuery) -> Result<TopAverages, StoreError> {
        let query = query.clone();
        self.with_reader(move |c| queries::top_averages(c, &query))
            .await
    }

    async fn get_many(&self, keys: &[CounterKey]) -> Result<Vec<Option<Counter>>, StoreError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let keys = keys.to_vec();
        let hot = self.hot.clone();
        self.with_reader(move |c| {
            // One snapshot with memory as it stands: a flush commits and
            // publishes under this lock, so it is seen whole or not.
            let shown = hot.lock();
            multiget::counters(c, &keys, &shown)
        })
        .await
    }

    /// One transaction on the writer, then an fsync of its own (as a delete
    /// does): answered only once durable.
    async fn set_days(
        &self,
        sets: Vec<DaySet>,
        _oldest_day: i64,
    ) -> Result<DaysOutcome, StoreError> {
        self.check_halted()?;
        let last_write = self.last_write.clone();
        let out = self
            .with_writer(move |w| {
                // Folded first: the rows it reads and sets are then exact.
                w.fold_all()?;
                let tx = w
                    .conn
                    .transaction_with_behavior(TransactionBehavior::Immediate)
                    .map_err(internal)?;
                let mut cids = Vec::new();
                let out = backfill::set_days_in(&tx, &sets, &mut cids)?;
                if matches!(out, DaysOutcome::Applied { .. }) {
                    commit_set_directly(tx, &w.hot, &cids, sets.iter().map(|s| &s.key))?;
                }
                last_write.wrote();
                Ok(out)
            })
            .await?;
        if matches!(out, DaysOutcome::Applied { .. }) {
            if let Err(e) = self.sync().await {
                tracing::error!(error = %e, "sync after setting days failed");
                return Err(StoreError::Halted(format!(
                    "{}; the days reached the store but may or may not survive a crash (setting them again is safe)",
                    super::HALTED_AFTER_FSYNC
                )));
            }
        }
        Ok(out)
    }

    async fn counter_page(
        &self,
        after: Option<CounterKey>,
        limit: usize,
        from_day: i64,
    ) -> Result<Vec<CounterHistory>, StoreError> {
        // Rows and buckets hold every acknowledged increment once folded.
        self.fold_now().await?;
        self.with_reader(move |c| transfer::counter_page(c, after.as_ref(), limit, from_day))
            .await
    }

    async fn average_page(
        &self,
        after: Option<CounterKey>,
        limit: usize,
        from_day: i64,
    ) -> Result<Vec<AverageHistory>, StoreError> {
        self.with_reader(move |c| transfer::average_page(c, after.as_ref(), limit, from_day))
            .await
    }

    async fn mark_page(
        &self,
        after: Option<ActorMark>,
        limit: usize,
        from_day: i64,
    ) -> Result<Vec<ActorMark>, StoreError> {
        // Marks are written in the flush's own transaction, never logged:
        // nothing to fold first.
        self.with_reader(move |c| marks::page(c, after.as_ref(), limit, from_day))
            .await
    }

    /// One transaction on the writer (between two flushes, as a backfill),
    /// then an fsync of its own: answered only once durable.
    async fn import(&self, batch: ImportBatch) -> Result<ImportOutcome, StoreError> {
        self.check_halted()?;
        let last_write = self.last_write.clone();
        let out = self
            .with_writer(move |w| {
                // Folded first, as for a backfill: the rows an import reads
                // and sets are then exact.
                w.fold_all()?;
                let tx = w
                    .conn
                    .transaction_with_behavior(TransactionBehavior::Immediate)
                    .map_err(internal)?;
                let mut cids = Vec::new();
                let out = transfer::import_in(&tx, &batch, &mut cids)?;
                if out == ImportOutcome::Applied {
                    let keys = batch.counters.iter().map(|c| &c.key);
                    commit_set_directly(
                        tx,
                        &w.hot,
                        &cids,
                        keys.chain(batch.days.iter().map(|d| &d.key)),
                    )?;
                }
                last_write.wrote();
                Ok(out)
            })
            .await?;
        if out == ImportOutcome::Applied {
            if let Err(e) = self.sync().await {
                tracing::error!(error = %e, "sync after an import batch failed");
                return Err(StoreError::Halted(format!(
                    "{}; the batch reached the store but may or may not survive a crash (importing it again is safe)",
                    super::HALTED_AFTER_FSYNC
                )));
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: i64 = 21_974; // 2030-03-01

    /// A store with relaxed durability in a new directory, its clock at
    /// 01:00 on `DAY`.
    fn relaxed_store_at_day() -> (tempfile::TempDir, crate::domain::ManualClock, SqliteStore) {
        let dir = tempfile::tempdir().unwrap();
        let clock = crate::domain::ManualClock::new(
            chrono::DateTime::from_timestamp(DAY * 86_400 + 3600, 0).unwrap(),
        );
        let store = SqliteStore::open(
            dir.path(),
            Durability::Relaxed,
            std::time::Duration::from_secs(60),
            400,
            clock.clock(),
        )
        .unwrap();
        (dir, clock, store)
    }

    fn memory_db() -> Writer {
        let mut c = Connection::open_in_memory().unwrap();
        c.execute_batch(SCHEMA).unwrap();
        c.execute_batch(queries::SCHEMA_V2).unwrap();
        c.execute_batch(&windows::schema()).unwrap();
        let hot = hot::Shared::default();
        hot.lock().windows.state = Some(open_windows(&mut c, DAY).unwrap());
        Writer {
            conn: c,
            hot,
            pass: None,
            logged: 0,
            hold: FoldHold::default(),
        }
    }

    fn inc(uuid: &str, delta: i64) -> Increment {
        Increment {
            key: CounterKey::new("VIDEO", "VIEW", uuid).unwrap(),
            delta,
            category: Some("news".into()),
            ts_ms: DAY * 86_400_000,
            day: DAY,
            id: None,
            kind: crate::domain::Kind::Counter,
            unique: None,
        }
    }

    /// Batches ask for no counter: a flush builds the state after it only
    /// for the keys a request wanted, on both of its paths.
    #[test]
    fn a_flush_reads_back_only_the_wanted_counters() {
        let mut c = memory_db();
        let key = |u: &str| CounterKey::new("VIDEO", "VIEW", u).unwrap();
        let batch = WriteBatch {
            requests: vec![vec![inc("a", 1), inc("b", 2)], vec![inc("a", 3)]],
            wanted: [key("a")].into(),
        };
        let out = apply_coalesced(&mut c, &batch, DAY * 86_400_000, 1000)
            .unwrap()
            .unwrap();
        assert_eq!(out.counters.len(), 1, "{:?}", out.counters);
        assert_eq!(out.counters[&key("a")].value, 4);
        assert_eq!(out.counters[&key("a")].category.as_deref(), Some("news"));
        let none = WriteBatch {
            wanted: Default::default(),
            ..batch
        };
        let out = apply_coalesced(&mut c, &none, DAY * 86_400_000, 1000)
            .unwrap()
            .unwrap();
        assert!(out.counters.is_empty(), "{:?}", out.counters);
        // The overflow path, request by request, keeps to the wanted keys too.
        let batch = WriteBatch {
            requests: vec![vec![inc("b", i64::MAX)], vec![inc("a", 1), inc("b", 1)]],
            wanted: [key("a")].into(),
        };
        let out = apply_one_by_one(&mut c, &batch, DAY * 86_400_000, 1000).unwrap();
        assert_eq!(out.requests[0], RequestOutcome::Overflow { key: key("b") });
        assert_eq!(out.counters.len(), 1, "{:?}", out.counters);
        assert_eq!(out.counters[&key("a")].value, 9);
    }

    /// A fold pass of more counters than a chunk, interrupted: between
    /// its chunks, reads are exact and flushes go on (their deltas wait for
    /// the next pass); a crash in the middle resumes at the next counter,
    /// so every delta is applied once.
    #[tokio::test]
    async fn a_fold_pass_resumes_where_a_crash_stopped_it() {
        let dir = tempfile::tempdir().unwrap();
        let copy = tempfile::tempdir().unwrap();
        let clock = crate::domain::ManualClock::new(
            chrono::DateTime::from_timestamp(DAY * 86_400 + 3600, 0).unwrap(),
        );
        let open = |d: &Path| {
            SqliteStore::open(
                d,
                Durability::Relaxed,
                std::time::Duration::from_secs(60),
                400,
                clock.clock(),
            )
            .unwrap()
        };
        let store = open(dir.path());
        store.fold_hold().hold();
        let n = 2 * fold::CHUNK + 10;
        let uuid = |i: usize| format!("u{i:05}");
        let all = |delta| vec![(0..n).map(|i| inc(&uuid(i), delta)).collect::<Vec<_>>()];
        let batch = |requests| WriteBatch {
            requests,
            wanted: Default::default(),
        };
        store.apply(batch(all(1))).await.unwrap();
        store.apply(batch(all(2))).await.unwrap();
        assert_eq!(store.hot.pending(), n);
        // One chunk: the first CHUNK counters are folded.
        assert!(store.writer.lock().unwrap().fold_step().unwrap());
        assert_eq!(store.hot.pending(), n - fold::CHUNK);
        let raw = |d: &Path, u: &str| -> i64 {
            Connection::open(d.join(DB_FILE))
                .unwrap()
                .query_row("SELECT value FROM counters WHERE uuid = ?1", [u], |r| {
                    r.get(0)
                })
                .unwrap()
        };
        assert_eq!(raw(dir.path(), &uuid(0)), 3);
        assert_eq!(raw(dir.path(), &uuid(n - 1)), 1);
        crash_copy(dir.path(), copy.path());
        // A flush between chunks, on a folded and an unfolded counter.
        store
            .apply(batch(vec![vec![inc(&uuid(0), 10), inc(&uuid(n - 1), 10)]]))
            .await
            .unwrap();
        for u in [uuid(0), uuid(n - 1), uuid(n / 2)] {
            let c = store
                .get(&CounterKey::new("VIDEO", "VIEW", &u).unwrap())
                .await
                .unwrap();
            let want = if u == uuid(n / 2) { 3 } else { 13 };
            assert_eq!(c.unwrap().value, want, "{u}");
        }
        store.catch_up().await.unwrap();
        assert_eq!(store.hot.pending(), 0);
        assert_eq!(raw(dir.path(), &uuid(0)), 13);
        assert_eq!(raw(dir.path(), &uuid(n - 1)), 13);
        assert_eq!(raw(dir.path(), &uuid(n / 2)), 3);
        drop(store);

        // The copy crashed after the first chunk: the open resumes the pass.
        let state: (i64, i64) = Connection::open(copy.path().join(DB_FILE))
            .unwrap()
            .query_row("SELECT upto, done_cid FROM fold_state", [], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .unwrap();
        assert!(state.1 > 0, "{state:?}");
        let store = open(copy.path());
        for i in [0, fold::CHUNK - 1, fold::CHUNK, n - 1] {
            assert_eq!(raw(copy.path(), &uuid(i)), 3, "{}", uuid(i));
        }
        let left: i64 = Connection::open(copy.path().join(DB_FILE))
            .unwrap()
            .query_row(
                "SELECT (SELECT count(*) FROM counter_log) + (SELECT count(*) FROM fold_state)",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(left, 0);
        let buckets: i64 = Connection::open(copy.path().join(DB_FILE))
            .unwrap()
            .query_row("SELECT sum(value) FROM buckets", [], |r| r.get(0))
            .unwrap();
        assert_eq!(buckets, 3 * n as i64);
        drop(store);
    }

    /// A bulk load of distinct counters: once `DIRECT_PENDING` counters
    /// have deltas in the log, the others (nothing pending) are written
    /// directly, so the pending counters stop growing; every value, bucket
    /// and read stays exact, and a counter already pending stays logged.
    #[tokio::test]
    async fn past_the_pending_mark_counters_are_written_directly() {
        let (dir, _clock, store) = relaxed_store_at_day();
        store.fold_hold().hold();
        let n = write::DIRECT_PENDING + 500;
        let uuid = |i: usize| format!("u{i:06}");
        let batch = |events: Vec<Increment>| WriteBatch {
            requests: vec![events],
            wanted: Default::default(),
        };
        // Inserted whole (new), then touched twice more while they exist.
        store
            .apply(batch((0..n).map(|i| inc(&uuid(i), 1)).collect()))
            .await
            .unwrap();
        assert_eq!(store.hot.pending(), 0);
        store
            .apply(batch((0..n).map(|i| inc(&uuid(i), 2)).collect()))
            .await
            .unwrap();
        assert_eq!(store.hot.pending(), write::DIRECT_PENDING);
        let logged: i64 = Connection::open(dir.path().join(DB_FILE))
            .unwrap()
            .query_row("SELECT count(*) FROM counter_log", [], |r| r.get(0))
            .unwrap();
        assert_eq!(logged, 1);
        store
            .apply(batch((0..n).map(|i| inc(&uuid(i), 4)).collect()))
            .await
            .unwrap();
        assert_eq!(store.hot.pending(), write::DIRECT_PENDING);
        let raw = |u: &str| -> (i64, i64) {
            Connection::open(dir.path().join(DB_FILE))
                .unwrap()
                .query_row(
                    "SELECT c.value, b.value FROM counters c JOIN buckets b ON b.cid = c.cid
                     WHERE c.uuid = ?1 AND b.day = ?2",
                    params![u, DAY],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .unwrap()
        };
        // Logged ones: the row still holds the insert; direct ones: all.
        assert_eq!(raw(&uuid(0)), (1, 1));
        assert_eq!(raw(&uuid(n - 1)), (7, 7));
        for i in [0, write::DIRECT_PENDING - 1, write::DIRECT_PENDING, n - 1] {
            let key = CounterKey::new("VIDEO", "VIEW", &uuid(i)).unwrap();
            assert_eq!(store.get(&key).await.unwrap().unwrap().value, 7, "{i}");
            let days = store
                .histogram(
                    &key,
                    Window {
                        from_day: DAY,
                        to_day: DAY,
                    },
                )
                .await
                .unwrap()
                .unwrap();
            assert_eq!(days, [Bucket { day: DAY, value: 7 }], "{i}");
        }
        store.catch_up().await.unwrap();
        assert_eq!(store.hot.pending(), 0);
        assert_eq!(raw(&uuid(0)), (7, 7));
        let total: i64 = Connection::open(dir.path().join(DB_FILE))
            .unwrap()
            .query_row("SELECT sum(value) FROM buckets", [], |r| r.get(0))
            .unwrap();
        assert_eq!(total, 7 * n as i64);
    }

    /// Window totals memory holds written back in bulk (the indexes
    /// dropped and built again), and the totals dropped and rebuilt from
    /// the buckets (past the most memory may hold): lists stay exact through
    /// both, and the tables and indexes are whole after.
    #[tokio::test]
    async fn window_totals_written_back_in_bulk_or_dropped_and_rebuilt_stay_exact() {
        let (dir, _clock, store) = relaxed_store_at_day();
        store.fold_hold().hold();
        let batch = |requests| WriteBatch {
            requests,
            wanted: Default::default(),
        };
        let week = TopQuery {
            entity: "VIDEO".into(),
            action: "VIEW".into(),
            window: Some(Window {
                from_day: DAY - 6,
                to_day: DAY,
            }),
            category: None,
            size: 5,
        };
        let top = |list: TopList| -> Vec<(String, i128)> {
            list.entries
                .into_iter()
                .map(|e| (e.uuid, e.value))
                .collect()
        };
        let want: Vec<(String, i128)> = (195..200)
            .rev()
            .map(|i| (format!("u{i:03}"), 3 * i as i128))
            .collect();
        store
            .apply(batch(vec![(0..200)
                .map(|i| inc(&format!("u{i:03}"), i))
                .collect()]))
            .await
            .unwrap();
        store
            .apply(batch(vec![(0..200)
                .map(|i| inc(&format!("u{i:03}"), 2 * i))
                .collect()]))
            .await
            .unwrap();
        let indexes = |d: &Path| -> i64 {
            Connection::open(d.join(DB_FILE))
                .unwrap()
                .query_row(
                    "SELECT count(*) FROM sqlite_schema WHERE type = 'index' AND name LIKE 'windows_%'",
                    [],
                    |r| r.get(0),
                )
                .unwrap()
        };
        {
            let mut w = store.writer.lock().unwrap();
            w.fold_all().unwrap();
            assert_eq!(w.hot.lock().windows.len(), 200);
            assert!(w.write_back_bulk_past(1).unwrap());
            assert_eq!(w.hot.lock().windows.len(), 0);
        }
        assert_eq!(indexes(dir.path()), 8);
        assert_eq!(top(store.top(&week).await.unwrap()), want);
        // More than memory may hold: the totals are dropped, lists sum
        // buckets, and a rebuild brings the tables back.
        store
            .apply(batch(vec![(0..200)
                .map(|i| inc(&format!("u{i:03}"), 0))
                .collect()]))
            .await
            .unwrap();
        store.writer.lock().unwrap().drop_windows().unwrap();
        assert!(store.hot.lock().windows.state.is_none());
        store
            .apply(batch(vec![vec![inc("u007", 1_000)]]))
            .await
            .unwrap();
        let mut want_after = want.clone();
        want_after.insert(0, ("u007".to_string(), 1_021));
        want_after.truncate(5);
        assert_eq!(top(store.top(&week).await.unwrap()), want_after);
        store.catch_up().await.unwrap();
        assert!(store.hot.lock().windows.state.is_some());
        assert_eq!(indexes(dir.path()), 8);
        assert_eq!(top(store.top(&week).await.unwrap()), want_after);
    }

    fn crash_copy(from: &Path, to: &Path) {
        for name in [DB_FILE.to_string(), format!("{DB_FILE}-wal")] {
            if from.join(&name).exists() {
                std::fs::copy(from.join(&name), to.join(&name)).unwrap();
            }
        }
    }

    /// Totals still anchored 100 days back read the days of their year
    /// from `buckets` when they move on: the retention leaves those days
    /// until the totals are past them.
    #[test]
    fn retention_keeps_the_days_a_lagging_window_still_reads() {
        let c = Connection::open_in_memory().unwrap();
        c.execute_batch(SCHEMA).unwrap();
        c.execute_batch(queries::SCHEMA_V2).unwrap();
        c.execute_batch(&windows::schema()).unwrap();
        let anchor = DAY - 100;
        windows::rebuild(&c, anchor).unwrap();
        for day in [DAY - 465, DAY - 464, DAY - 401, DAY - 400] {
            c.execute(
                "INSERT INTO buckets (day, cid, value) VALUES (?1, 1, 1)",
                [day],
            )
            .unwrap();
        }
        assert_eq!(first_kept_day(&c, DAY, 400).unwrap(), anchor - 364);
        let budget = std::time::Duration::from_secs(5);
        assert_eq!(expire_buckets(&c, DAY, 400, budget).unwrap(), 1);
        windows::rebuild(&c, DAY).unwrap();
        assert_eq!(first_kept_day(&c, DAY, 400).unwrap(), DAY - 400);
        assert_eq!(expire_buckets(&c, DAY, 400, budget).unwrap(), 2);
        let left: Vec<i64> = c
            .prepare("SELECT day FROM buckets ORDER BY day")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(left, vec![DAY - 400]);
    }
}
