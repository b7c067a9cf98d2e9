//! The flush and sync path of the embedded store: a batch claimed (ids,
//! marks), coalesced and written in one transaction of the writer (`write`
//! says what it writes), then the write-ahead log fsync'd outside the
//! writer lock, so the next flush is written while this one reaches the disk.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use rusqlite::{params, Connection, TransactionBehavior};

use super::background::Idle;
use super::hooks::Hooks;
use super::write::{self, Overflowed};
use super::{marks, multiget, sql, Writer};
use crate::domain::{Clock, Coalesced, Increment};
use crate::store::{BatchOutcome, BlockingWrites, RequestOutcome, StoreError, WriteBatch};

/// What a flush and its fsync need of the store, apart from it so that the
/// pipeline can call them from threads of its own.
pub(super) struct Writes {
    pub writer: Arc<Mutex<Writer>>,
    pub id_window_ms: i64,
    pub clock: Clock,
    pub last_write: Arc<Idle>,
    pub wal: Option<Arc<std::fs::File>>,
    pub halted: Arc<AtomicBool>,
    pub hooks: Hooks,
}

impl BlockingWrites for Writes {
    fn apply(&self, batch: WriteBatch) -> Result<BatchOutcome, StoreError> {
        if self.halted.load(Ordering::SeqCst) {
            return Err(StoreError::Halted(crate::store::HALTED_AFTER_FSYNC.into()));
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
            return Err(StoreError::Halted(crate::store::HALTED_AFTER_FSYNC.into()));
        }
        let Some(wal) = &self.wal else {
            return Ok(());
        };
        let synced = if self.hooks.fsync_fails() {
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

/// Opens the WAL file that the writer connection keeps for its lifetime
/// (SQLite removes it only when the last connection closes), and makes its
/// directory entry and the schema written so far durable.
pub(super) fn open_wal(data_dir: &Path, db: &Path) -> Result<std::fs::File, StoreError> {
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
        .map_err(sql("flush::claim_ids"))?;
    let expired_before = now_ms.saturating_sub(id_window_ms);
    for (i, e) in events.iter().enumerate() {
        if let Some(id) = &e.id {
            let claimed = claim
                .execute(params![&**id, now_ms, expired_before])
                .map_err(sql("flush::claim_ids"))?;
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
pub(super) fn apply_coalesced(
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
    let mut flush = write::Flush::coalesced(&hot, all.keys.len(), w.hours_from());
    if flush.add(&tx, &all)?.is_err() {
        return Ok(None);
    }
    if write::averages(&tx, &all, &mut out.store_writes)?.is_err() {
        return Ok(None);
    }
    flush.write(&tx, &w.first_days)?;
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
            .map_err(sql("flush::begin"))?;
        Ok(Flushing { conn })
    }

    fn commit(self) -> Result<(), StoreError> {
        self.conn
            .prepare_cached("COMMIT")
            .and_then(|mut s| s.execute([]))
            .map_err(sql("flush::commit"))?;
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
pub(super) fn apply_one_by_one(
    w: &mut Writer,
    batch: &WriteBatch,
    now_ms: i64,
    id_window_ms: i64,
) -> Result<BatchOutcome, StoreError> {
    let hours_from = w.hours_from();
    let mut tx = w
        .conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(sql("flush::apply_one_by_one"))?;
    let mut out = BatchOutcome::default();
    let hot = w.hot.clone();
    let mut flush = write::Flush::by_request(&hot, hours_from);
    for events in &batch.requests {
        let sp = tx.savepoint().map_err(sql("flush::apply_one_by_one"))?;
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
                sp.commit().map_err(sql("flush::apply_one_by_one"))?;
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
    flush.write(&tx, &w.first_days)?;
    out.store_writes += flush.writes;
    let done = flush.finish();
    out.counters = done.counters(&batch.wanted);
    multiget::unwritten_wanted(&tx, &batch.wanted, &mut out.counters, &hot.lock())?;
    w.logged += done.logged();
    write::commit_and_publish(
        || tx.commit().map_err(sql("flush::apply_one_by_one")),
        done,
        &hot,
    )?;
    Ok(out)
}
