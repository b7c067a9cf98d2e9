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
//!
//! Files by concern: this one holds the store and its [`Store`] impl;
//! [`schema`] (tables and migrations), [`errors`] (SQLite's errors
//! kept whole, by kind), [`connections`] (the writer's
//! set-up, the reader pool, the memory budget), [`flush`] (a flush's
//! transaction and the fsync after it) with [`write`] (what a flush writes),
//! [`log`] (the change log's format), [`hot`] (memory of recent counters),
//! [`fold`] (the change log into the rows), [`windows`] (the kept window
//! totals, `windows/memory` what memory holds of them, `windows/upkeep`
//! the writer's work on them), [`queries`] and [`multiget`] (reads),
//! [`backfill`], [`transfer`] and [`marks`], [`background`] (the one worker:
//! id expiry, retention, folding when idle), and [`hooks`] (test hooks,
//! compiled for the crate's own tests only).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use super::{
    ActorMark, Average, AverageHistory, BatchOutcome, BlockingWrites, Bucket, CounterHistory,
    DaysOutcome, ImportBatch, ImportOutcome, StaleQuery, Store, StoreError, TopAverages,
    TopAveragesQuery, TopList, TopQuery, UnusedPair, WriteBatch,
};
use crate::domain::{Clock, Counter, CounterKey, CounterSet, DaySet, Window};
use background::Idle;
use connections::Readers;
use errors::sql;
use flush::Writes;
use hooks::Hooks;

pub use background::idempotency_ids;
pub use connections::{memory_used, set_memory_budget};
#[cfg(any(test, feature = "test-hooks"))]
pub use hooks::{FoldHold, FsyncFault, WriterSql};

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
mod connections;
mod countapi;
mod errors;
mod firstdays;
mod flush;
mod fold;
mod hooks;
mod hot;
mod hours;
mod local_first_days;
mod log;
mod marks;
mod multiget;
mod publication;
mod queries;
mod schema;
mod transfer;
mod trending;
mod trendkeys;
mod windows;
mod write;

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
    halted: Arc<AtomicBool>,
    /// Test hooks (`hooks`): empty outside the crate's own tests.
    hooks: Hooks,
    /// Dropped after [`Drop::drop`]'s fold: frees the file for the next open.
    _open: OpenFile,
    /// Shared with the background's retention of hour buckets.
    hourly_retention_days: Arc<std::sync::atomic::AtomicU32>,
}

/// One open store per database file in this process. A store's last handle
/// may drop on another thread (the background worker's) after a new store
/// of the same file opened, as a tenant closed when idle and opened again
/// does; its closing fold would then write into the rows deltas the new
/// store had loaded from the change log as pending, and they would count
/// twice (`tests/concurrency.rs`, restart, failed about 1 run in 6). So an
/// open waits until the store before it has closed.
struct OpenFile(PathBuf);

static OPEN_FILES: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());
static CLOSED: std::sync::Condvar = std::sync::Condvar::new();

impl OpenFile {
    fn take(path: &Path) -> Result<OpenFile, StoreError> {
        let open = OPEN_FILES.lock().unwrap_or_else(|e| e.into_inner());
        let (mut open, waited) = CLOSED
            .wait_timeout_while(open, std::time::Duration::from_secs(60), |o| {
                o.iter().any(|p| p == path)
            })
            .unwrap_or_else(|e| e.into_inner());
        if waited.timed_out() {
            return Err(StoreError::Internal(format!(
                "{} is still open in this process after 60 s",
                path.display()
            )));
        }
        open.push(path.to_path_buf());
        Ok(OpenFile(path.to_path_buf()))
    }
}

impl Drop for OpenFile {
    fn drop(&mut self) {
        let mut open = OPEN_FILES.lock().unwrap_or_else(|e| e.into_inner());
        open.retain(|p| *p != self.0);
        CLOSED.notify_all();
    }
}

/// Closing folds what is left in the change log, so the database file
/// reads whole without this build (the `sqlite3` shell, an export); a crash
/// leaves it to the next open, which folds it before anything reads.
impl Drop for SqliteStore {
    fn drop(&mut self) {
        if self.hooks.fold_held() {
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
    /// Test hooks: while the fold is held, nothing folds on its own (after
    /// flushes, in the background, at close); lists and reports still fold
    /// what they need.
    hooks: Hooks,
    /// The first day whose increments land in hour buckets too
    /// (`hours::from_day`, as last recorded): moved on by the background
    /// after it has recorded the day, so no flush skips a day the store
    /// counts as complete.
    hours_from: i64,
    /// The `first_<N>_days` lists whose totals the store keeps
    /// (`firstdays`), ascending: what every write of buckets keeps exact.
    /// None until the table exists.
    first_days: Vec<u32>,
    /// The N the store is to keep (`--milestone-days`), ascending: kept
    /// from the first list of one of them on (or from start-up when the
    /// flag is given).
    first_days_wanted: Vec<u32>,
    /// The half-lives (ms) whose trending bounds the store keeps
    /// (`trendkeys`), ascending: what every write of buckets keeps valid.
    trend: Vec<i64>,
}

impl Writer {
    fn hours_from(&self) -> i64 {
        self.hours_from
    }

    /// Brings the kept first-days totals to the wanted N (creating them
    /// when none are kept): every delta logged folded first, then one
    /// transaction.
    fn build_first_days(&mut self, path: &Path) -> Result<(), StoreError> {
        if self.first_days == self.first_days_wanted {
            return Ok(());
        }
        // Rows read from the buckets must see every delta logged.
        self.fold_all()?;
        let started = std::time::Instant::now();
        if firstdays::keep_now(&mut self.conn, &self.first_days_wanted)? {
            tracing::info!(days = ?self.first_days_wanted, path = %path.display(), took = ?started.elapsed(), "built the kept first-days totals");
        }
        self.first_days = firstdays::kept(&self.conn)?;
        Ok(())
    }
}

impl SqliteStore {
    /// The UTC day the named windows (`last_day` ... `last_year`) end on:
    /// the clock's. When the clock moves to another day, the kept totals
    /// roll to it (forwards in steps; backwards not at all: windowed lists
    /// ending on a day before the totals' anchor are summed from buckets).
    pub fn today(&self) -> i64 {
        self.clock.today()
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
        let open = OpenFile::take(&path)?;
        let mut conn = connections::open_writer(&path)?;
        schema::migrate(&mut conn, &path, clock.today())?;
        let hot = hot::Shared::default();
        let hours_from = hours::from_day(&conn)?;
        let first_days = firstdays::kept(&conn)?;
        let trend = trendkeys::kept(&conn)?;
        hot.lock().trend = trend.clone();
        let mut writer = Writer {
            conn,
            hot: hot.clone(),
            pass: None,
            logged: 0,
            hooks: Hooks::default(),
            hours_from,
            first_days: first_days.clone(),
            first_days_wanted: Vec::new(),
            trend: trend.clone(),
        };
        // What a crash left in the change log is folded before anything
        // reads: the rows are then exact, and nothing is pending.
        writer.fold_all()?;
        let mut conn = writer.conn;
        let window_state = windows::upkeep::open_windows(&mut conn, clock.today())?;
        hot.lock().windows.state = Some(window_state);
        schema::mark_current(&conn)?;
        let wal = match durability {
            Durability::Full => Some(Arc::new(flush::open_wal(data_dir, &path)?)),
            Durability::Relaxed => None,
        };
        let id_window_ms = i64::try_from(id_window.as_millis()).unwrap_or(i64::MAX);
        let ids = background::id_gauge(&conn)?;
        let hooks = Hooks::default();
        let writer = Arc::new(Mutex::new(Writer {
            conn,
            hot: hot.clone(),
            pass: None,
            logged: 0,
            hooks: hooks.clone(),
            hours_from,
            first_days,
            first_days_wanted: firstdays::DEFAULT_KEPT.to_vec(),
            trend,
        }));
        let hourly_retention_days = Arc::new(std::sync::atomic::AtomicU32::new(
            crate::domain::hours::DEFAULT_HOURLY_RETENTION_DAYS,
        ));
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
            hourly_retention_days: hourly_retention_days.clone(),
        });
        let halted = Arc::<AtomicBool>::default();
        let writes = Arc::new(Writes {
            writer: writer.clone(),
            id_window_ms,
            clock: clock.clone(),
            last_write: last_write.clone(),
            wal: wal.clone(),
            halted: halted.clone(),
            hooks: hooks.clone(),
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
            hooks,
            _open: open,
            halted,
            hourly_retention_days,
        })
    }

    /// How many days hour buckets are kept (`--hourly-retention-days`; 14
    /// until set): the background deletes the hours of older days.
    pub fn set_hourly_retention(&self, days: u32) {
        self.hourly_retention_days.store(days, Ordering::Relaxed);
    }

    /// Which `first_<N>_days` lists the store keeps totals for
    /// (`--milestone-days`; `firstdays::DEFAULT_KEPT` until set). The
    /// totals are built from the buckets by the first list of one of them,
    /// or here when `build_now` (the flag was given) or when the store
    /// already keeps another set: seconds per million counters, before the
    /// store serves. Other N are summed by a pass over the pair's counters.
    pub fn set_milestone_days(&self, days: &[u32], build_now: bool) -> Result<(), StoreError> {
        let mut w = self
            .writer
            .lock()
            .map_err(|_| StoreError::Internal("writer lock poisoned".into()))?;
        let mut want = days.to_vec();
        want.sort_unstable();
        want.dedup();
        w.first_days_wanted = want;
        if build_now || !w.first_days.is_empty() {
            w.build_first_days(&self.path)?;
        }
        Ok(())
    }

    /// Which half-lives (ms) trending bounds are kept for
    /// (`--trending-half-lives`; none until set): built here from the rows
    /// when they differ from those kept (a pass over every counter, before
    /// the store serves), dropped when `hls` is empty. Lists of other
    /// half-lives scan the plan's rows.
    pub fn set_trending_half_lives(&self, hls: &[i64]) -> Result<(), StoreError> {
        let mut w = self
            .writer
            .lock()
            .map_err(|_| StoreError::Internal("writer lock poisoned".into()))?;
        // Rows read for the keys must see every delta logged.
        w.fold_all()?;
        let started = std::time::Instant::now();
        let target = self.trend_target();
        if trendkeys::keep_now(&mut w.conn, hls, target)? {
            tracing::info!(half_lives_ms = ?hls, path = %self.path.display(), took = ?started.elapsed(), "built the kept trending bounds");
        }
        w.trend = trendkeys::kept(&w.conn)?;
        // Before the store serves: a day per transaction (a commit per
        // 2,000 rows made a day of 70,000 rows take several times longer).
        trendkeys::upkeep(&w.conn, &w.trend, target, usize::MAX, usize::MAX)?;
        self.hot.lock().trend = w.trend.clone();
        Ok(())
    }

    /// The first day the hourly retention keeps: the day buckets before it
    /// are in the kept trending bounds once the upkeep has run.
    fn trend_target(&self) -> i64 {
        self.clock.today() - i64::from(self.hourly_retention_days.load(Ordering::Relaxed))
    }

    /// The background's upkeep of the kept trending bounds, now, `rows`
    /// bucket rows a transaction, at most `chunks` of them (tests).
    #[doc(hidden)]
    pub fn trending_upkeep(&self, rows: usize, chunks: usize) -> Result<usize, StoreError> {
        let w = self
            .writer
            .lock()
            .map_err(|_| StoreError::Internal("writer lock poisoned".into()))?;
        trendkeys::upkeep(&w.conn, &w.trend, self.trend_target(), rows, chunks)
    }

    /// The candidates a trending list of a kept half-life scores (0 when
    /// none is kept for it) and whether the walk decided the list, for
    /// the bench's notes and tests.
    #[doc(hidden)]
    pub async fn trending_walk(
        &self,
        query: &super::TrendingQuery,
    ) -> Result<(usize, bool), StoreError> {
        self.fold_now().await?;
        let query = query.clone();
        self.with_reader(move |c| {
            let w = trending::walked(c, &query)?;
            Ok((w.candidates, w.entries.is_some()))
        })
        .await
    }

    /// The trending list by the scan of the plan's rows, whatever bounds
    /// are kept: what tests hold the walk to.
    #[doc(hidden)]
    pub async fn trending_by_scan(
        &self,
        query: &super::TrendingQuery,
    ) -> Result<super::TrendingList, StoreError> {
        self.fold_now().await?;
        let query = query.clone();
        self.with_reader(move |c| trending::top_scanned(c, &query))
            .await
    }

    /// The `first_<N>_days` list summed by a pass over the pair's counters
    /// (what a list of an N without kept totals runs), for tests that hold
    /// the kept totals to it.
    #[doc(hidden)]
    pub async fn top_first_days_by_walk(
        &self,
        query: &super::FirstDaysQuery,
    ) -> Result<Vec<super::FirstDaysEntry>, StoreError> {
        self.fold_now().await?;
        let query = query.clone();
        self.with_reader(move |c| publication::top(c, &query)).await
    }

    /// `Err(Halted)` once an fsync has failed.
    fn check_halted(&self) -> Result<(), StoreError> {
        if self.halted.load(Ordering::SeqCst) {
            return Err(StoreError::Halted(super::HALTED_AFTER_FSYNC.into()));
        }
        Ok(())
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
            let done = f(&mut w);
            connections::checkpoint_if_due(&w.conn);
            done
        })
        .await
        .map_err(|e| StoreError::Internal(format!("store task failed: {e}")))?
    }

    /// [`Self::with_reader`] for a read that walks every counter of a pair
    /// (trending, summed `first_<N>_days` lists): seconds of a core at a
    /// million counters, and a trending list's array of up to 64 MiB. At
    /// most [`SCANS`] run at once in the process, over every store; more
    /// wait their turn instead of taking every core from the writes (reads
    /// run on a pool of up to 512 blocking threads).
    async fn scan<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let _turn = SCANS
            .acquire()
            .await
            .map_err(|_| internal_msg("scans closed"))?;
        self.with_reader(f).await
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

/// Whole-pair reads running at once in the process ([`SqliteStore::scan`]).
static SCANS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);

fn internal_msg(m: &str) -> StoreError {
    StoreError::Internal(format!("sqlite: {m}"))
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
                .map_err(sql("store::get"))
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
                .map_err(sql("store::target_counters"))?;
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
                .map_err(sql("store::target_counters"))?;
            rows.collect::<Result<Vec<_>, _>>()
                .map_err(sql("store::target_counters"))
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
            let tx = w.conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(sql("store::delete"))?;
            let cid: Option<i64> = tx
                .query_row(
                    "DELETE FROM counters WHERE entity = ?1 AND action = ?2 AND uuid = ?3 RETURNING cid",
                    params![&*key.entity, &*key.action, &*key.uuid],
                    |r| r.get(0),
                )
                .optional()
                .map_err(sql("store::delete"))?;
            if let Some(cid) = cid {
                tx.execute("DELETE FROM buckets WHERE cid = ?1", [cid]).map_err(sql("store::delete"))?;
                firstdays::recompute(&tx, &w.first_days, cid)?;
                trendkeys::recompute(&tx, &w.trend, cid)?;
                hours::forget(&tx, cid)?;
                windows::forget(&tx, cid)?;
            }
            marks::forget(&tx, &key)?;
            // Its window totals leave memory with the commit: a later
            // counter given the same cid inherits nothing.
            let mut hot = w.hot.lock();
            tx.commit().map_err(sql("store::delete"))?;
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

    /// Folded first, as a `from`/`to` list: the hour rows then hold every
    /// acknowledged increment (memory keeps no hours).
    async fn hour_histogram(
        &self,
        key: &CounterKey,
        range: crate::domain::HourRange,
    ) -> Result<Option<super::HourHistogram>, StoreError> {
        self.fold_now().await?;
        let key = key.clone();
        self.with_reader(move |c| hours::histogram(c, &key, range))
            .await
    }

    async fn top_hours(&self, query: &super::TopHoursQuery) -> Result<TopList, StoreError> {
        self.fold_now().await?;
        let query = query.clone();
        self.with_reader(move |c| hours::top(c, &query)).await
    }

    /// Folded first, as a `last_24_hours` list: the hour and day rows
    /// then hold every acknowledged increment.
    async fn trending(
        &self,
        query: &super::TrendingQuery,
    ) -> Result<super::TrendingList, StoreError> {
        self.fold_now().await?;
        let query = query.clone();
        self.scan(move |c| trending::top(c, &query)).await
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
        // Every key in memory (counters touched lately, as a dashboard's
        // or a stream's often are): answered from it at once, under its
        // lock, which is one snapshot too, without a blocking thread and a
        // reader's transaction (measured: the one-key multi-read at 0.15x
        // of the single get of a counter in memory, 205 µs of server CPU a
        // request against 22; see scripts/bench/README.md).
        if let Some(found) = multiget::all_in_memory(keys, &self.hot.lock()) {
            return Ok(found);
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
                    .map_err(sql("store::set_days"))?;
                let mut cids = Vec::new();
                let out = backfill::set_days_in(&tx, &sets, &mut cids)?;
                if matches!(out, DaysOutcome::Applied { .. }) {
                    for &cid in &cids {
                        firstdays::recompute(&tx, &w.first_days, cid)?;
                        trendkeys::recompute(&tx, &w.trend, cid)?;
                    }
                    backfill::commit_set_directly(tx, &w.hot, &cids, sets.iter().map(|s| &s.key))?;
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

    async fn set_value(&self, set: CounterSet) -> Result<Counter, StoreError> {
        self.check_halted()?;
        let last_write = self.last_write.clone();
        let counter = self
            .with_writer(move |w| {
                // Folded first: the row it sets is then exact, and no
                // logged delta of an earlier flush is added on top later.
                w.fold_all()?;
                let tx = w
                    .conn
                    .transaction_with_behavior(TransactionBehavior::Immediate)
                    .map_err(sql("store::set_value"))?;
                let (cid, counter) = backfill::set_value_in(&tx, &set)?;
                backfill::commit_set_directly(tx, &w.hot, &[cid], std::iter::once(&set.key))?;
                last_write.wrote();
                Ok(counter)
            })
            .await?;
        if let Err(e) = self.sync().await {
            tracing::error!(error = %e, "sync after setting a value failed");
            return Err(StoreError::Halted(format!(
                "{}; the value reached the store but may or may not survive a crash (setting it again is safe)",
                super::HALTED_AFTER_FSYNC
            )));
        }
        Ok(counter)
    }

    async fn counter_page(
        &self,
        after: Option<CounterKey>,
        limit: usize,
        from_day: i64,
        hours_from_day: i64,
    ) -> Result<Vec<CounterHistory>, StoreError> {
        // Rows and buckets hold every acknowledged increment once folded.
        self.fold_now().await?;
        self.with_reader(move |c| {
            transfer::counter_page(c, after.as_ref(), limit, from_day, hours_from_day)
        })
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

    async fn key_marks(&self, key: &crate::domain::ActorKey) -> Result<u64, StoreError> {
        let key = key.clone();
        let path = self.path.clone();
        let rekeyed = self
            .with_writer(move |w| marks::key_for_tenant(&mut w.conn, &key))
            .await
            .map_err(|e| match e {
                StoreError::Internal(m) => StoreError::Internal(format!("{}: {m}", path.display())),
                other => other,
            })?;
        if rekeyed > 0 {
            tracing::info!(marks = rekeyed, path = %self.path.display(), "keyed the actor marks of an earlier version for their tenant");
        }
        Ok(rekeyed)
    }

    async fn mark_keying(&self) -> Result<super::MarkKeying, StoreError> {
        self.with_reader(marks::keying).await
    }

    /// One transaction on the writer (between two flushes, as a backfill),
    /// then an fsync of its own: answered only once durable.
    async fn countapi_records(
        &self,
        namespace: &str,
        key: &str,
    ) -> Result<crate::domain::countapi::Records, StoreError> {
        self.countapi_records_sql(namespace, key).await
    }

    async fn countapi_create(
        &self,
        creation: crate::domain::countapi::Creation,
    ) -> Result<crate::domain::countapi::Created, StoreError> {
        self.countapi_create_sql(creation).await
    }

    async fn countapi_page(
        &self,
        after: Option<(String, String)>,
        limit: usize,
    ) -> Result<Vec<crate::domain::countapi::KeyRecord>, StoreError> {
        self.countapi_page_sql(after, limit).await
    }

    async fn countapi_restore(
        &self,
        records: Vec<crate::domain::countapi::KeyRecord>,
    ) -> Result<crate::domain::countapi::Restored, StoreError> {
        self.countapi_restore_sql(records).await
    }

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
                    .map_err(sql("store::import"))?;
                let mut cids = Vec::new();
                let out = transfer::import_in(&tx, &batch, &mut cids)?;
                if out == ImportOutcome::Applied {
                    for &cid in &cids {
                        firstdays::recompute(&tx, &w.first_days, cid)?;
                        trendkeys::recompute(&tx, &w.trend, cid)?;
                    }
                    let keys = batch.counters.iter().map(|c| &c.key);
                    backfill::commit_set_directly(
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

    /// One transaction on the writer, then an fsync of its own, as
    /// `set_value`: answered only once durable.
    async fn set_published(&self, sets: Vec<super::PublishedSet>) -> Result<(), StoreError> {
        self.check_halted()?;
        let last_write = self.last_write.clone();
        self.with_writer(move |w| {
            publication::set(w, &sets)?;
            last_write.wrote();
            Ok(())
        })
        .await?;
        if let Err(e) = self.sync().await {
            tracing::error!(error = %e, "sync after setting publication times failed");
            return Err(StoreError::Halted(format!(
                "{}; the publication times reached the store but may or may not survive a crash (setting them again is safe)",
                super::HALTED_AFTER_FSYNC
            )));
        }
        Ok(())
    }

    async fn published(&self, entity: &str, uuid: &str) -> Result<Option<i64>, StoreError> {
        let (entity, uuid) = (entity.to_string(), uuid.to_string());
        self.with_reader(move |c| publication::get(c, &entity, &uuid))
            .await
    }

    /// Folded first, as a `from`/`to` list: the rows then hold every
    /// acknowledged increment.
    async fn top_first_days(
        &self,
        query: &super::FirstDaysQuery,
    ) -> Result<super::FirstDaysList, StoreError> {
        self.fold_now().await?;
        let days = query.days;
        let path = self.path.clone();
        let kept = self
            .with_writer(move |w| {
                if !w.first_days_wanted.contains(&days) {
                    return Ok(false);
                }
                if w.first_days.is_empty() {
                    // The first list of a kept N: the totals are built now,
                    // in one transaction that holds the writer, so only in
                    // a store small enough for that to be a short pause of
                    // its writes (ids are assigned in order: the highest
                    // bounds the counters, read in one index step).
                    let highest: i64 = w
                        .conn
                        .query_row("SELECT coalesce(max(cid), 0) FROM counters", [], |r| {
                            r.get(0)
                        })
                        .map_err(sql("top_first_days"))?;
                    if highest > firstdays::LAZY_BUILD_MAX_COUNTERS {
                        return Ok(false);
                    }
                    w.build_first_days(&path)?;
                }
                Ok(w.first_days.contains(&days))
            })
            .await?;
        let query = query.clone();
        let entries = match kept {
            true => self.with_reader(move |c| firstdays::top(c, &query)).await?,
            false => self.scan(move |c| publication::top(c, &query)).await?,
        };
        Ok(super::FirstDaysList {
            entries,
            exact: true,
        })
    }

    /// Folded first, as `top_first_days`.
    async fn top_first_days_local(
        &self,
        query: &super::LocalFirstDaysQuery,
    ) -> Result<super::FirstDaysList, StoreError> {
        self.fold_now().await?;
        let query = query.clone();
        self.scan(move |c| local_first_days::top(c, &query)).await
    }

    /// Publication times are written by their own transaction, never
    /// logged: nothing to fold first.
    async fn published_page(
        &self,
        after: Option<(String, String)>,
        limit: usize,
    ) -> Result<Vec<super::TargetPublished>, StoreError> {
        self.with_reader(move |c| publication::page(c, after.as_ref(), limit))
            .await
    }
}

#[cfg(test)]
mod tests;
