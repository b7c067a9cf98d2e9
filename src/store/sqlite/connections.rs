//! The embedded store's connections: the writer's set-up, the pool of
//! reader connections kept between requests, and the one memory budget
//! every store of the process shares (SQLite's soft heap limit, and the
//! page cache each connection may take of it).

use std::cell::Cell;
use std::ffi::c_int;
use std::path::Path;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use rusqlite::hooks::{CheckpointMode, Wal};
use rusqlite::Connection;

use super::sql;
use crate::store::StoreError;

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
pub(super) struct Readers {
    idle: Mutex<Vec<Connection>>,
    opened: std::time::Instant,
    /// Milliseconds after `opened` of the last read.
    last_used_ms: AtomicI64,
}

impl Readers {
    pub(super) fn new() -> Readers {
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
    pub(super) fn with<T>(
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
                let c = Connection::open(path).map_err(sql("connections::with"))?;
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
    pub(super) fn close_unused_for(&self, unused: std::time::Duration) {
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
/// The window totals the stores hold in memory share it: they may take
/// three quarters of it (`windows::upkeep::held_max`), and the soft heap
/// limit is lowered by what they hold ([`windows_hold`]).
pub fn set_memory_budget(bytes: u64) {
    MEMORY_BUDGET.store(bytes, Ordering::SeqCst);
    let limit = i64::try_from(bytes).unwrap_or(i64::MAX);
    SOFT_LIMIT.store(limit, Ordering::Relaxed);
    // SAFETY: a plain call with an integer; SQLite serialises it itself.
    unsafe {
        rusqlite::ffi::sqlite3_soft_heap_limit64(limit);
    }
}

/// The memory budget of every store of the process, in bytes: the one set,
/// or the command line's default (256 MiB) when none was (tests, tools).
pub(super) fn memory_budget() -> u64 {
    match MEMORY_BUDGET.load(Ordering::SeqCst) {
        0 => DEFAULT_BUDGET,
        b => b,
    }
}

/// `--sqlite-memory-budget`'s default.
const DEFAULT_BUDGET: u64 = 256 << 20;

/// The soft heap limit last given to SQLite by [`windows_hold`].
static SOFT_LIMIT: AtomicI64 = AtomicI64::new(0);

/// The window totals the stores hold in memory (`windows::memory`) take
/// `bytes` of the budget now: SQLite's soft heap limit is the rest, at
/// least a quarter of the budget, so that the two together stay within it.
/// Changed only when it moves by a MiB or more (it is asked after every flush).
pub(super) fn windows_hold(bytes: u64) {
    let budget = MEMORY_BUDGET.load(Ordering::SeqCst);
    if budget == 0 {
        return;
    }
    let limit = i64::try_from(budget.saturating_sub(bytes).max(budget / 4)).unwrap_or(i64::MAX);
    if (limit - SOFT_LIMIT.load(Ordering::Relaxed)).abs() < 1 << 20 {
        return;
    }
    SOFT_LIMIT.store(limit, Ordering::Relaxed);
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
pub(super) fn writer_cache_kib() -> u64 {
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
        .map_err(sql("connections::configure"))?;
    // Each window of each of the two tables has a statement of its own.
    conn.set_prepared_statement_cache_capacity(64);
    conn.execute_batch(&format!("PRAGMA cache_size = -{cache_kib}"))
        .map_err(sql("connections::configure"))
}

/// Opens the writer connection of the database at `path`: set up as every
/// connection is, in WAL mode, and without an fsync inside SQLite per commit.
pub(super) fn open_writer(path: &Path) -> Result<Connection, StoreError> {
    let conn = Connection::open(path).map_err(sql("connections::open_writer"))?;
    configure(&conn, writer_cache_kib())?;
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .map_err(sql("connections::open_writer"))?;
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
        .map_err(sql("connections::open_writer"))?;
    // Replaces SQLite's automatic checkpoint (see `checkpoint_if_due`).
    conn.wal_hook(Some(note_wal_pages));
    Ok(conn)
}

/// Pages in the write-ahead log past which the writer checkpoints: SQLite's
/// own automatic checkpoint's mark.
const CHECKPOINT_PAGES: c_int = 1000;
/// Past this many, a commit checkpoints even under memory's lock: only
/// if a writer's work never reached [`checkpoint_if_due`] nor made a
/// commit without memory's lock, which would otherwise let the log grow
/// for good.
const CHECKPOINT_BACKSTOP_PAGES: c_int = 16 * CHECKPOINT_PAGES;

thread_local! {
    /// The write-ahead log's pages after the last commit made on this
    /// thread, as SQLite's WAL hook reports them.
    static WAL_PAGES: Cell<c_int> = const { Cell::new(0) };
    /// Whether this thread holds a store's memory (`hot::Shared::lock`).
    static MEMORY_HELD: Cell<u32> = const { Cell::new(0) };
}

/// This thread took a store's memory.
pub(super) fn memory_taken() {
    MEMORY_HELD.set(MEMORY_HELD.get() + 1);
}

/// This thread let go of a store's memory.
pub(super) fn memory_released() {
    MEMORY_HELD.set(MEMORY_HELD.get().saturating_sub(1));
}

/// SQLite's WAL hook, called inside each commit of the writer, on the
/// committing thread: checkpoints as SQLite's automatic checkpoint does
/// (at [`CHECKPOINT_PAGES`]), but not inside a commit made under memory's
/// lock.
///
/// Most of the writer's commits (a flush, a fold chunk, a backfill) hold
/// memory's lock across the commit, so memory's state and the rows change
/// together. SQLite's automatic checkpoint ran inside whichever commit
/// reached the mark; under memory's lock, copying the log into the
/// database and its two fsyncs (tens of milliseconds in a bulk load)
/// held every read that answers from memory (a get, a windowed list)
/// waiting. There the hook only notes the log's size, and the writer
/// checkpoints once it let go of memory ([`checkpoint_if_due`]), or the
/// next commit made without memory's lock does.
fn note_wal_pages(wal: &Wal, pages: c_int) -> rusqlite::Result<()> {
    WAL_PAGES.set(pages);
    let due =
        pages >= CHECKPOINT_BACKSTOP_PAGES || (pages >= CHECKPOINT_PAGES && MEMORY_HELD.get() == 0);
    if due {
        // An error returned here would fail a commit that happened: log it.
        if let Err(e) = wal.checkpoint_v2(CheckpointMode::PASSIVE) {
            tracing::warn!(error = %e, "checkpointing the write-ahead log failed (retried)");
        }
        WAL_PAGES.set(0);
    }
    Ok(())
}

/// Checkpoints the write-ahead log (passively: readers go on, it copies
/// what no reader still needs) when the commits made on this thread left
/// it at [`CHECKPOINT_PAGES`] or more. Called by whoever holds the writer,
/// after its commits and outside memory's lock. A failure is logged: the
/// log keeps its pages and the next call tries again.
pub(super) fn checkpoint_if_due(conn: &Connection) {
    if WAL_PAGES.get() < CHECKPOINT_PAGES {
        return;
    }
    WAL_PAGES.set(0);
    let done = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()));
    if let Err(e) = done {
        tracing::warn!(error = %e, "checkpointing the write-ahead log failed (retried)");
    }
}
