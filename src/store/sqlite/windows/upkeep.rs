//! The writer's upkeep of the kept window totals: writing back the totals
//! memory holds (a few at a time after flushes, in bulk after a load), the
//! day's flip and the copy of the day after, dropping them past what memory
//! may hold and rebuilding them from the buckets, and bringing them to
//! today when a store opens.

use rusqlite::{Connection, TransactionBehavior};

use super::super::{connections, sql, windows, Writer};
use super::memory;
use crate::store::StoreError;

/// Counters written back per flush once a store holds three quarters of
/// what it may ([`held_max`]), so that steady traffic over many counters
/// keeps memory bounded without a drop.
pub(in crate::store::sqlite) const WINDOWS_WRITE_BACK: usize = 500;

/// Counters whose window totals the stores of the process may hold in
/// memory together: three quarters of the memory budget
/// (`--sqlite-memory-budget`, whose SQLite share shrinks by as much while
/// they are held, `connections::windows_hold`), at about
/// [`memory::BYTES_PER_COUNTER`] each; 1.18 million at the default 256 MiB.
///
/// Past it a store stops keeping its totals until a rebuild from the
/// buckets once flushes pause (lists sum buckets meanwhile, exact): a load
/// of this many distinct counters between two pauses would otherwise run
/// at the pace of writing rows, some 50 µs per counter, where a rebuild
/// after it costs a few µs per bucket.
pub(in crate::store::sqlite) fn held_max() -> usize {
    let budget = connections::memory_budget();
    usize::try_from(budget / 4 * 3 / memory::BYTES_PER_COUNTER as u64).unwrap_or(usize::MAX)
}

/// Counters held past which writing them back in bulk may pay
/// (`Writer::write_back_bulk`).
pub(in crate::store::sqlite) const WINDOWS_BULK: usize = 65_536;
/// Counters whose window rows are written per transaction, and taken by
/// the copy of the day after per transaction: a few tens of milliseconds
/// of the writer, so a flush waits that long at most.
pub(in crate::store::sqlite) const WINDOWS_CHUNK: usize = 2_000;

impl Writer {
    /// Writes the window rows of up to `n` counters memory holds (those
    /// with nothing pending: their buckets are exact, as the copy of the day
    /// after needs them), in chunks; returns how many.
    pub(in crate::store::sqlite) fn write_back(&mut self, n: usize) -> Result<usize, StoreError> {
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

    pub(in crate::store::sqlite) fn write_back_chunk(
        &mut self,
        n: usize,
    ) -> Result<usize, StoreError> {
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
            .map_err(sql("upkeep::write_back_chunk"))?;
        for h in &held {
            windows::write_rows(&tx, &state, h)?;
        }
        let mut hot = self.hot.lock();
        tx.commit().map_err(sql("upkeep::write_back_chunk"))?;
        for h in &held {
            hot.windows.remove(h.cid);
        }
        Ok(held.len())
    }

    /// Writes the window rows of every counter memory holds with nothing
    /// pending (all of them once the log is folded).
    pub(in crate::store::sqlite) fn write_back_all(&mut self) -> Result<(), StoreError> {
        while self.write_back_chunk(WINDOWS_CHUNK)? > 0 {}
        Ok(())
    }

    /// Writes back, in one transaction, every counter memory holds with
    /// nothing pending, when they are at least [`WINDOWS_BULK`] and as many
    /// as the rows of the current table (after a bulk load): with the top
    /// indexes dropped and built again after, one sort each instead of a
    /// random insert per row (measured at 300,000 counters: about 50 µs
    /// per counter row by row). `false` when it does not pay.
    pub(in crate::store::sqlite) fn write_back_bulk(&mut self) -> Result<bool, StoreError> {
        self.write_back_bulk_past(WINDOWS_BULK)
    }

    pub(in crate::store::sqlite) fn write_back_bulk_past(
        &mut self,
        bulk: usize,
    ) -> Result<bool, StoreError> {
        let (state, cids) = {
            let hot = self.hot.lock();
            let Some(state) = hot.windows.state else {
                return Ok(false);
            };
            if hot.windows.len() < bulk {
                return Ok(false);
            }
            (state, hot.windows.unpending())
        };
        if cids.len() < bulk || (cids.len() as i64) < windows::rows(&self.conn, &state)? {
            return Ok(false);
        }
        let started = std::time::Instant::now();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql("upkeep::write_back_bulk_past"))?;
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
        // Committed without memory's lock (writing a million rows' pages
        // to the log takes seconds): a list meanwhile may read the rows and
        // memory's totals of the same counters, equal (no flush comes
        // between: this holds the writer), which it counts once
        // (`windows::top`).
        tx.commit().map_err(sql("upkeep::write_back_bulk_past"))?;
        let mut hot = self.hot.lock();
        // Every counter held, as after a bulk load: memory is handed back
        // whole and freed once the lock is released (lists wait for it).
        let bytes = hot.windows.bytes();
        let freed = if sorted.len() == hot.windows.len() {
            Some(hot.windows.take_all())
        } else {
            for &cid in &sorted {
                hot.windows.remove(cid);
            }
            None
        };
        drop(hot);
        drop(freed);
        tracing::info!(
            counters = sorted.len(),
            memory_bytes = bytes,
            ms = started.elapsed().as_millis() as u64,
            "window totals written back in bulk"
        );
        Ok(true)
    }

    /// After a flush: writes back [`WINDOWS_WRITE_BACK`] counters once this
    /// store holds three quarters of its room, and stops keeping the totals
    /// past it (see [`held_max`]). A store's room is what the process may
    /// hold less what the other stores hold.
    pub(in crate::store::sqlite) fn windows_after_flush(&mut self) -> Result<(), StoreError> {
        let own = self.hot.lock().windows.len();
        let total = memory::held_total();
        connections::windows_hold((total * memory::BYTES_PER_COUNTER) as u64);
        match bound(own, total, held_max()) {
            Bound::Drop => self.drop_windows(),
            Bound::WriteBack => self.write_back(WINDOWS_WRITE_BACK).map(|_| ()),
            Bound::Keep => Ok(()),
        }
    }

    /// Moves the kept window totals to `today` when the day changed: one
    /// flip once the table of the day after is complete (until then lists
    /// sum buckets); two days or more, and they are not kept until rebuilt.
    /// Cheap when nothing is due: every flush asks.
    pub(in crate::store::sqlite) fn windows_day(&mut self, today: i64) -> Result<(), StoreError> {
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
            .map_err(sql("upkeep::windows_day"))?;
        if today != state.anchor + 1 {
            drop(tx);
            return self.drop_windows();
        }
        let next = windows::flip(&tx, &state)?;
        let mut hot = self.hot.lock();
        tx.commit().map_err(sql("upkeep::windows_day"))?;
        hot.windows.flip(next);
        Ok(())
    }

    /// Stops keeping the window totals until a rebuild from the buckets
    /// (`windows_step`, once flushes pause): what memory held is dropped
    /// (it is in the buckets), and lists sum buckets meanwhile.
    pub(in crate::store::sqlite) fn drop_windows(&mut self) -> Result<(), StoreError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql("upkeep::drop_windows"))?;
        windows::drop_state(&tx)?;
        let mut hot = self.hot.lock();
        tx.commit().map_err(sql("upkeep::drop_windows"))?;
        hot.windows.state = None;
        let (counters, bytes) = (hot.windows.len(), hot.windows.bytes());
        let freed = hot.windows.take_all();
        drop(hot);
        drop(freed);
        tracing::info!(
            counters,
            memory_bytes = bytes,
            "window totals no longer kept until rebuilt (a bulk load, or the clock days ahead)"
        );
        Ok(())
    }

    /// One bounded step of the window totals' own work: the day's flip,
    /// emptying then filling the table of the day after a chunk at a time,
    /// or (if `may_rebuild`) a rebuild from the buckets when they are not
    /// kept. `false` when there is nothing to do.
    pub(in crate::store::sqlite) fn windows_step(
        &mut self,
        today: i64,
        may_rebuild: bool,
    ) -> Result<bool, StoreError> {
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
                .map_err(sql("upkeep::windows_step"))?;
            let state = windows::rebuild(&tx, today)?;
            let mut hot = self.hot.lock();
            tx.commit().map_err(sql("upkeep::windows_step"))?;
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
            .map_err(sql("upkeep::windows_step"))?;
        // Committed without memory's lock: these steps write only the
        // table of the day after, which no list reads until memory's state
        // says it is complete (set below, under the lock), and no flush
        // comes in between (this holds the writer). A commit may take tens
        // of milliseconds (a checkpoint of the log), lists meanwhile none.
        if state.copied < 0 {
            let next = windows::clear_next(&tx, &state)?;
            tx.commit().map_err(sql("upkeep::windows_step"))?;
            self.hot.lock().windows.state = Some(next);
            return Ok(true);
        }
        let copied = windows::copy_chunk(&tx, &state, &self.hot, WINDOWS_CHUNK)?;
        tx.commit().map_err(sql("upkeep::windows_step"))?;
        let mut hot = self.hot.lock();
        for (cid, next) in &copied.next {
            hot.windows.set_next(*cid, next);
        }
        hot.windows.state = Some(copied.state);
        Ok(true)
    }
}

/// What a flush does about the window totals its store holds in memory.
#[derive(Debug, PartialEq, Eq)]
enum Bound {
    Keep,
    WriteBack,
    Drop,
}

/// A store holding `own` counters, the process `total`, of at most `max`:
/// its room is `max` less what the other stores hold.
fn bound(own: usize, total: usize, max: usize) -> Bound {
    let room = max.saturating_sub(total.saturating_sub(own));
    if own > room {
        Bound::Drop
    } else if own > room / 4 * 3 {
        Bound::WriteBack
    } else {
        Bound::Keep
    }
}

/// Brings the kept window totals to `today` at open (the change log is
/// folded: buckets are exact): a flip if the day after is complete, a
/// rebuild from the buckets if they are missing (a new database, or one of
/// schema 5 or before) or two days or more behind; the counters memory
/// held at a crash (`windows_dirty`) are recomputed from their buckets,
/// or, past [`WINDOWS_BULK`] of them, the tables rebuilt.
pub(in crate::store::sqlite) fn open_windows(
    conn: &mut Connection,
    today: i64,
) -> Result<windows::State, StoreError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(sql("upkeep::open_windows"))?;
    let state = match windows::load_state(&tx)? {
        // Current, the day before, or the clock behind the anchor.
        Some(s) if today <= s.anchor + 1 => s,
        _ => windows::rebuild(&tx, today)?,
    };
    let held: Vec<i64> = tx
        .prepare("SELECT cid FROM windows_dirty")
        .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
        .map_err(sql("upkeep::open_windows"))?;
    // Many counters held at a crash (a bulk load under way): one rebuild
    // reads each bucket once, where a recompute per counter costs a few
    // random reads and writes of rows each (about 50 µs).
    let (state, held) = if held.len() > WINDOWS_BULK {
        (windows::rebuild(&tx, today)?, Vec::new())
    } else {
        (state, held)
    };
    for cid in held {
        windows::recompute(&tx, &state, cid)?;
    }
    let state = if today == state.anchor + 1 && state.copied == windows::COMPLETE {
        windows::flip(&tx, &state)?
    } else {
        state
    };
    tx.commit().map_err(sql("upkeep::open_windows"))?;
    Ok(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_keeps_what_the_budget_leaves_it_beside_the_others() {
        // The default budget holds a million counters' totals.
        assert!(held_max() > 1_000_000, "{}", held_max());
        assert_eq!(bound(700, 700, 1_000), Bound::Keep);
        assert_eq!(bound(800, 800, 1_000), Bound::WriteBack);
        assert_eq!(bound(1_001, 1_001, 1_000), Bound::Drop);
        // Other stores hold 500: this one's room is the other half.
        assert_eq!(bound(300, 800, 1_000), Bound::Keep);
        assert_eq!(bound(400, 900, 1_000), Bound::WriteBack);
        assert_eq!(bound(501, 1_001, 1_000), Bound::Drop);
        // The others alone past the bound: any holding is dropped.
        assert_eq!(bound(1, 1_200, 1_000), Bound::Drop);
        assert_eq!(bound(0, 1_200, 1_000), Bound::Keep);
    }
}
