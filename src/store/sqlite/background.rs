//! The one background worker of every embedded store in the process: a
//! single thread that gives each open store a turn in round-robin order
//! (idempotency-id expiry, id counting, bucket and day-mark retention,
//! folding the change log and writing window totals back once flushes
//! pause, the window totals' copy of the day after), so that 1,000 tenants
//! cost one thread, not 1,000.
//!
//! Why this shape:
//! - The worker holds only weak references to a store's connections: a
//!   dropped store closes its files at once (or at the end of a turn under
//!   way), and its entry is forgotten at its next turn.
//! - Fair: a store goes to the back of the queue after each turn, and a turn
//!   is bounded by the same budgets a store's own thread had, so a busy
//!   store delays the others by at most one bounded turn per round.
//! - A store whose writer is busy (a flush) is retried a little later,
//!   instead of the worker waiting on it while other stores are due; only
//!   after [`BUSY_RETRIES`] misses in a row does the worker wait for it, so
//!   the busy store's own expiry and retention still happen.
//! - A store with nothing to do (no write since its last turn, same day, no
//!   id due to expire, and that turn found no work) is not even locked:
//!   1,000 idle tenants cost next to nothing. A full turn still runs every
//!   [`RECHECK_EVERY`], in case the clock was set back.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Condvar, Mutex, TryLockError, Weak};
use std::time::{Duration, Instant};

use rusqlite::{params, Connection};

use super::connections::Readers;
use super::windows::upkeep::WINDOWS_CHUNK;
use super::{hot, sql, windows, Writer};
use crate::domain::Clock;
use crate::store::StoreError;

/// How often each store gets its turn, and how long a turn may hold the
/// writer for folding, writing window totals back and the copy of the day
/// after: flushes wait at most about this long.
const ROLLUP_EVERY: Duration = Duration::from_millis(500);
const ROLLUP_BUDGET: Duration = Duration::from_millis(50);
/// A store with no flush for [`ROLLUP_QUIET_MS`] whose work is not done
/// gets its next turn this soon instead: the writer is free. A flush still
/// waits at most one [`ROLLUP_BUDGET`].
const ROLLUP_AGAIN: Duration = Duration::from_millis(20);
/// Folding and writing window totals back skip their turn while flushes
/// came this recently: they compete with them for the writer and the CPU,
/// and nothing waits for them (lists and single reads are exact without
/// them; flushes fold and write back themselves past their marks). The
/// copy of the day after runs in every turn: it must be done by midnight.
const ROLLUP_QUIET_MS: i64 = 1_000;
/// Writing window totals back waits for a longer quiet than the fold: it
/// empties memory, and every counter the next burst touches then enters
/// it again (its kept rows read and deleted), which cost a gateway whose
/// traffic paused for a second or more about a third of its single
/// increments' throughput until the burst had touched its counters again
/// (48-60k against 66-72k a second, scripts/bench/README.md). Memory
/// stays bounded meanwhile: flushes write back past their marks, and a
/// store dropped or closed writes back at once.
const WRITE_BACK_QUIET_MS: i64 = 30_000;
/// How long each turn may keep deleting expired idempotency ids, and day
/// buckets past the retention: a flush waits at most this long for the writer.
const EXPIRE_BUDGET: Duration = Duration::from_millis(20);
const RETAIN_BUDGET: Duration = Duration::from_millis(20);
/// How often the kept ids are counted for `/metrics` (a scan of their index,
/// on a reader, so the writer is not held for it), when they may have changed.
const COUNT_IDS_EVERY: Duration = Duration::from_secs(2);
/// A store whose writer is held by a flush is retried after this long, at
/// most this many times in a row before the worker waits for the writer.
const BUSY_RETRY: Duration = Duration::from_millis(50);
const BUSY_RETRIES: u32 = 4;
/// A quiet store still gets a full turn this often.
const RECHECK_EVERY: Duration = Duration::from_secs(30);
/// Idle readers of a store that served no read for this long are closed,
/// so that quiet tenants give their share of the process-wide idle bound
/// to busy ones.
const READERS_UNUSED_FOR: Duration = Duration::from_secs(60);

/// What the worker needs of one store. Weak where the store owns files or
/// counts in `/metrics`: the worker must never keep a dropped store alive.
pub(super) struct Job {
    pub writer: Weak<Mutex<Writer>>,
    pub hot: hot::Shared,
    pub readers: Weak<Readers>,
    pub path: PathBuf,
    pub clock: Clock,
    pub idle: Arc<Idle>,
    pub id_window_ms: i64,
    pub ids: Weak<AtomicI64>,
    pub retention_days: u32,
    /// `--hourly-retention-days`, set on the store after it opened.
    pub hourly_retention_days: Arc<std::sync::atomic::AtomicU32>,
}

/// One store in the worker's queue, with what its last turns found.
struct Entry {
    job: Job,
    due: Instant,
    /// Turns in a row that found the writer busy.
    busy: u32,
    /// When the ids were last counted, and the store's last write then.
    counted: Instant,
    counted_write_ms: i64,
    /// Expiry deleted ids since the last count.
    expired_since_count: bool,
    /// Set by a full turn that found nothing to do.
    quiet: Option<Quiet>,
}

/// The conditions under which a store that had nothing to do still has nothing to do.
struct Quiet {
    write_ms: i64,
    today: i64,
    /// When the oldest kept id expires (`i64::MAX`: no id kept).
    expiry_due_ms: i64,
    /// When memory's window totals are due to be written back, on the
    /// store's monotonic milliseconds (`i64::MAX`: memory holds none).
    write_back_due_ms: i64,
    since: Instant,
}

struct Queue {
    entries: Mutex<VecDeque<Entry>>,
    added: Condvar,
}

/// The worker's queue; `None` until the first store opens (or while the
/// thread could not be started: the next open tries again).
static WORKER: Mutex<Option<Arc<Queue>>> = Mutex::new(None);

/// Gives the store of `job` its turns from now on, until it is dropped.
/// Starts the worker thread with the first store.
pub(super) fn register(job: Job) {
    let Ok(mut worker) = WORKER.lock() else {
        tracing::warn!(
            "no background expiry, folding or copy of the window totals: worker lock poisoned"
        );
        return;
    };
    if worker.is_none() {
        let queue = Arc::new(Queue {
            entries: Mutex::new(VecDeque::new()),
            added: Condvar::new(),
        });
        let for_thread = queue.clone();
        match std::thread::Builder::new()
            .name("store-background".into())
            .spawn(move || run(&for_thread))
        {
            Ok(_) => *worker = Some(queue),
            Err(e) => {
                tracing::warn!("no background expiry, folding or copy of the window totals: {e}");
                return;
            }
        }
    }
    let Some(queue) = worker.clone() else { return };
    drop(worker);
    let entry = Entry {
        job,
        due: Instant::now() + ROLLUP_EVERY,
        busy: 0,
        counted: Instant::now(),
        counted_write_ms: i64::MIN,
        expired_since_count: false,
        quiet: None,
    };
    let Ok(mut entries) = queue.entries.lock() else {
        return;
    };
    entries.push_back(entry);
    queue.added.notify_one();
}

fn run(queue: &Queue) {
    loop {
        let Some(mut entry) = next_due(queue) else {
            return;
        };
        // A bug in one store's work must not end every store's background:
        // that store is forgotten (its writer lock poisoned, as before).
        let kept = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| turn(&mut entry)))
            .unwrap_or_else(|_| {
                tracing::error!(path = %entry.job.path.display(), "background work of a store panicked; it gets no more turns");
                false
            });
        if kept {
            let Ok(mut entries) = queue.entries.lock() else {
                return;
            };
            entries.push_back(entry);
        }
    }
}

/// Waits until the store at the front of the queue is due and takes it out.
/// Entries go in at the back with a due time after every earlier one's, so
/// the front is the next due (a busy retry, due sooner, waits for those
/// ahead of it: its store still gets no second turn in a round).
fn next_due(queue: &Queue) -> Option<Entry> {
    let mut entries = queue.entries.lock().ok()?;
    loop {
        let now = Instant::now();
        match entries.front().map(|e| e.due) {
            None => entries = queue.added.wait(entries).ok()?,
            Some(due) if due <= now => return entries.pop_front(),
            Some(due) => entries = queue.added.wait_timeout(entries, due - now).ok()?.0,
        }
    }
}

/// One turn of one store; `false` when the store is gone.
fn turn(e: &mut Entry) -> bool {
    if let Some(readers) = e.job.readers.upgrade() {
        readers.close_unused_for(READERS_UNUSED_FOR);
    }
    let Some(writer) = e.job.writer.upgrade() else {
        return false;
    };
    let mut hurry = false;
    if !e.still_quiet() {
        let conn = match writer.try_lock() {
            Ok(conn) => conn,
            Err(TryLockError::WouldBlock) if e.busy < BUSY_RETRIES => {
                e.busy += 1;
                e.due = Instant::now() + BUSY_RETRY;
                return true;
            }
            Err(TryLockError::WouldBlock) => match writer.lock() {
                Ok(conn) => conn,
                Err(_) => return false,
            },
            Err(TryLockError::Poisoned(_)) => return false,
        };
        e.busy = 0;
        let mut w = conn;
        e.quiet = work(&e.job, &mut w, &mut e.expired_since_count, &mut hurry);
        super::connections::checkpoint_if_due(&w.conn);
    }
    drop(writer);
    e.count_ids_if_changed();
    e.due = Instant::now() + if hurry { ROLLUP_AGAIN } else { ROLLUP_EVERY };
    true
}

/// The work of a full turn, with the writer held (as a flush holds it: the
/// last write read here is exact). Returns the conditions of a quiet store
/// when there was nothing to do.
/// `hurry` is set when work ran without flushes coming and is not done.
fn work(job: &Job, w: &mut Writer, expired: &mut bool, hurry: &mut bool) -> Option<Quiet> {
    let write_ms = job.idle.last_write_ms();
    let today = job.clock.today();
    let mut nothing_to_do = true;
    let expired_before = job.clock.now_ms().saturating_sub(job.id_window_ms);
    match expire_ids(&w.conn, expired_before, EXPIRE_BUDGET) {
        Ok(0) => {}
        Ok(_) => {
            *expired = true;
            nothing_to_do = false;
        }
        Err(e) => {
            tracing::warn!("idempotency-id expiry failed (retried later): {e}");
            nothing_to_do = false;
        }
    }
    match expire_buckets(
        &w.conn,
        &w.first_days,
        today,
        job.retention_days,
        RETAIN_BUDGET,
    ) {
        Ok(0) => {}
        Ok(_) => {
            nothing_to_do = false;
            // The writer reads those days from `buckets` again (gone).
            if let Ok(day) = first_kept_day(&w.conn, today, job.retention_days) {
                w.hot.lock().forget_days_before(day);
            }
        }
        Err(e) => {
            tracing::warn!("bucket retention failed (retried later): {e}");
            nothing_to_do = false;
        }
    }
    // Hour buckets past their retention, beside the days': the first
    // complete day is recorded first, then the writer's copy moves to it.
    let hours_first = today
        - i64::from(
            job.hourly_retention_days
                .load(std::sync::atomic::Ordering::Relaxed),
        );
    // The kept trending bounds take in the days the hours no longer cover
    // (a transaction of a few tens of milliseconds per pass).
    match super::trendkeys::upkeep(
        &w.conn,
        &w.trend,
        hours_first,
        super::trendkeys::UPKEEP_ROWS,
        1,
    ) {
        Ok(0) => {}
        Ok(_) => nothing_to_do = false,
        Err(e) => {
            tracing::warn!("trending bounds upkeep failed (retried later): {e}");
            nothing_to_do = false;
        }
    }
    match super::hours::expire(&w.conn, hours_first, RETAIN_BUDGET) {
        Ok(n) => {
            w.hours_from = w.hours_from.max(hours_first);
            if n > 0 {
                nothing_to_do = false;
            }
        }
        Err(e) => {
            tracing::warn!("hour bucket retention failed (retried later): {e}");
            nothing_to_do = false;
        }
    }
    // Views' marks of days no event is accepted for any more.
    let oldest_day = today - i64::from(job.retention_days);
    match super::marks::expire(&w.conn, oldest_day, RETAIN_BUDGET) {
        Ok(0) => {}
        Ok(_) => nothing_to_do = false,
        Err(e) => {
            tracing::warn!("actor mark retention failed (retried later): {e}");
            nothing_to_do = false;
        }
    }
    let quiet_ms = job.idle.quiet_for_ms();
    let busy = quiet_ms < ROLLUP_QUIET_MS;
    let warm = quiet_ms < WRITE_BACK_QUIET_MS;
    let held = w.hooks.fold_held();
    // Bounded steps until the budget is spent; `true` when work is left.
    let mut run = |what: &str,
                   step: &mut dyn FnMut(&mut Writer) -> Result<bool, crate::store::StoreError>|
     -> bool {
        let started = Instant::now();
        loop {
            match step(w) {
                Ok(false) => return false,
                Ok(true) if started.elapsed() >= ROLLUP_BUDGET => return true,
                Ok(true) => {}
                Err(e) => {
                    tracing::warn!("{what} failed (retried later): {e}");
                    return true;
                }
            }
        }
    };
    // The window totals' own work first: the day's flip and the copy of the
    // day after, in every turn, busy or not (the copy must be complete by
    // midnight); a rebuild when they are not kept, once flushes pause (it
    // holds the writer for seconds at hundreds of thousands of counters).
    let mut left = !held
        && run("the window totals' day work", &mut |w| {
            w.windows_step(today, !busy)
        });
    // Once flushes pause: the change log folded, so that reports find the
    // log done; once they stayed away for longer, the window totals memory
    // holds written back, so that memory empties.
    if !busy && !held && !left {
        left = run("folding the change log", &mut |w| w.fold_step());
        if !left && !warm {
            left = run("writing window totals back", &mut |w| {
                if w.write_back_bulk()? {
                    return Ok(true);
                }
                w.write_back(WINDOWS_CHUNK).map(|n| n > 0)
            });
        }
    }
    let mut write_back_due_ms = i64::MAX;
    let (windows_held, windows_kept) = {
        let memory = job.hot.lock();
        (memory.windows.len(), memory.windows.state.is_some())
    };
    if left {
        nothing_to_do = false;
        *hurry = !busy;
    } else if job.hot.pending() > 0 || !windows_kept || (windows_held > 0 && (held || !warm)) {
        // Left for when flushes pause (or the hold is released).
        nothing_to_do = false;
    } else if windows_held > 0 {
        // Only the write-back is left, and it waits for a longer quiet:
        // no full turn until then, as for a store with nothing to do.
        write_back_due_ms = write_ms.saturating_add(WRITE_BACK_QUIET_MS);
    }
    let conn = &mut w.conn;
    if !nothing_to_do {
        return None;
    }
    let oldest: Option<i64> = conn
        .query_row("SELECT min(seen_ms) FROM event_ids", [], |r| r.get(0))
        .ok()?;
    Some(Quiet {
        write_ms,
        today,
        // An id is expired once seen before `now - window`.
        expiry_due_ms: oldest.map_or(i64::MAX, |o| {
            o.saturating_add(job.id_window_ms).saturating_add(1)
        }),
        write_back_due_ms,
        since: Instant::now(),
    })
}

impl Entry {
    /// Nothing can have become due since the full turn that found nothing to do.
    fn still_quiet(&self) -> bool {
        let Some(q) = &self.quiet else {
            return false;
        };
        q.since.elapsed() < RECHECK_EVERY
            && self.job.idle.last_write_ms() == q.write_ms
            && self.job.clock.today() == q.today
            && self.job.clock.now_ms() < q.expiry_due_ms
            && self.job.idle.now_ms() < q.write_back_due_ms
    }

    /// Counts the kept ids (for `/metrics`) when a write or the expiry may
    /// have changed them, at most every [`COUNT_IDS_EVERY`].
    fn count_ids_if_changed(&mut self) {
        let write_ms = self.job.idle.last_write_ms();
        let changed = self.expired_since_count || write_ms != self.counted_write_ms;
        if !changed || self.counted.elapsed() < COUNT_IDS_EVERY {
            return;
        }
        let (Some(readers), Some(ids)) = (self.job.readers.upgrade(), self.job.ids.upgrade())
        else {
            return;
        };
        self.counted = Instant::now();
        match readers.with(&self.job.path, count_ids) {
            Ok(n) => {
                ids.store(n, Ordering::Relaxed);
                self.counted_write_ms = write_ms;
                self.expired_since_count = false;
            }
            Err(e) => tracing::warn!("cannot count idempotency ids: {e}"),
        }
    }
}

/// Milliseconds since the store opened at which the last flush committed.
/// Monotonic on purpose: it schedules work and is not a calendar time, so a
/// wall clock stepping back must not make the store look busy for hours.
pub(super) struct Idle {
    opened: std::time::Instant,
    last_write_ms: AtomicI64,
}

impl Idle {
    pub(super) fn new() -> Idle {
        Idle {
            opened: std::time::Instant::now(),
            last_write_ms: AtomicI64::new(i64::MIN / 2),
        }
    }

    pub(super) fn now_ms(&self) -> i64 {
        i64::try_from(self.opened.elapsed().as_millis()).unwrap_or(i64::MAX)
    }

    pub(super) fn wrote(&self) {
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
        .map_err(sql("background::expire_ids"))?;
    loop {
        let n = s
            .execute(params![expired_before, EXPIRE_BATCH])
            .map_err(sql("background::expire_ids"))?;
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
pub(super) fn first_kept_day(
    conn: &Connection,
    today: i64,
    retention_days: u32,
) -> Result<i64, StoreError> {
    let retained = (today - i64::from(retention_days)).min(today - 364);
    Ok(windows::load_state(conn)?.map_or(retained, |s| s.first_day().min(retained)))
}

/// Deletes the day buckets of counters and of averages older than the first
/// kept day (see [`first_kept_day`]), oldest days first, in batches of
/// [`RETAIN_BATCH`] by primary key `(day, id)` (each its own transaction),
/// until none is left or `budget` is spent. Returns how many were deleted.
/// A counter's value and timestamps stay: only its old days go. The kept
/// first-N-days totals (`first_days`: the N kept) of a counter that loses a
/// bucket inside one of its windows are summed again in the same
/// transaction.
pub(super) fn expire_buckets(
    conn: &Connection,
    first_days: &[u32],
    today: i64,
    retention_days: u32,
    budget: std::time::Duration,
) -> Result<u64, StoreError> {
    let started = std::time::Instant::now();
    let before = first_kept_day(conn, today, retention_days)?;
    let mut deleted = 0u64;
    for stmt in [
        "DELETE FROM buckets WHERE (day, cid) IN (
             SELECT day, cid FROM buckets WHERE day < ?1 ORDER BY day, cid LIMIT ?2)",
        "DELETE FROM average_buckets WHERE (day, aid) IN (
             SELECT day, aid FROM average_buckets WHERE day < ?1 ORDER BY day, aid LIMIT ?2)",
    ] {
        let kept = if stmt.contains("FROM buckets") {
            first_days
        } else {
            &[]
        };
        loop {
            if started.elapsed() >= budget {
                return Ok(deleted);
            }
            let n = expire_batch(conn, stmt, kept, before)?;
            deleted += n as u64;
            if (n as i64) < RETAIN_BATCH {
                break;
            }
        }
    }
    Ok(deleted)
}

/// One batch of [`expire_buckets`] (`stmt`), its own transaction; with the
/// kept totals of `kept` N summed again for the counters it takes a
/// bucket of a window from. Returns how many rows it deleted.
fn expire_batch(
    conn: &Connection,
    stmt: &str,
    kept: &[u32],
    before: i64,
) -> Result<usize, StoreError> {
    let mut s = conn
        .prepare_cached(stmt)
        .map_err(sql("background::expire_buckets"))?;
    if kept.is_empty() {
        return s
            .execute(params![before, RETAIN_BATCH])
            .map_err(sql("background::expire_buckets"));
    }
    conn.prepare_cached("BEGIN IMMEDIATE")
        .and_then(|mut b| b.execute([]))
        .map_err(sql("background::expire_buckets"))?;
    let done = (|| {
        let gone: Vec<(i64, i64)> = conn
            .prepare_cached(&format!("{stmt} RETURNING day, cid"))
            .and_then(|mut s| {
                s.query_map(params![before, RETAIN_BATCH], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })?
                .collect()
            })
            .map_err(sql("background::expire_buckets"))?;
        let mut touched = Vec::new();
        for &(day, cid) in &gone {
            if super::firstdays::in_a_window(conn, cid, day)? {
                touched.push(cid);
            }
        }
        touched.sort_unstable();
        touched.dedup();
        for cid in touched {
            super::firstdays::recompute(conn, kept, cid)?;
        }
        conn.prepare_cached("COMMIT")
            .and_then(|mut c| c.execute([]))
            .map_err(sql("background::expire_buckets"))?;
        Ok(gone.len())
    })();
    if done.is_err() && !conn.is_autocommit() {
        let _ = conn.execute_batch("ROLLBACK");
    }
    done
}

fn count_ids(conn: &Connection) -> Result<i64, StoreError> {
    conn.query_row("SELECT count(*) FROM event_ids", [], |r| r.get(0))
        .map_err(sql("background::count_ids"))
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

/// The count of kept ids of a store opening on `conn`, which the worker
/// updates and [`idempotency_ids`] sums while the store holds it.
pub(super) fn id_gauge(conn: &Connection) -> Result<Arc<AtomicI64>, StoreError> {
    let ids = Arc::new(AtomicI64::new(count_ids(conn)?));
    if let Ok(mut gauges) = ID_GAUGES.lock() {
        gauges.push(Arc::downgrade(&ids));
    }
    Ok(ids)
}
