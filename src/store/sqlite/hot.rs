//! What the embedded store holds in memory of its counters: the exact state
//! now (the row plus every delta logged since) of the counters flushes
//! touched lately, and of their day buckets lately touched.
//!
//! - A flush checks overflow against it and answers a single increment
//!   from it, without reading SQLite for a counter it saw lately.
//! - Readers answer a counter from it when it is here: it is the row plus
//!   the deltas not folded yet, exact either way. A flush commits and
//!   updates it under its lock, so a reader sees the flush's rows and its
//!   counters' new state together or not at all; a fold commits and marks
//!   what it made current under the lock too.
//! - Bounded: past [`HOT_CAP`] counters, those with nothing pending are
//!   dropped (a later flush reads their row again). Those with pending
//!   deltas stay: their rows are not exact. How many there may be is
//!   bounded by the fold (see `Writer::fold_after_flush`).
//!
//! The rule that keeps reads exact: a counter with deltas in the change
//! log that its row does not hold is always here; any other counter's row
//! in `counters` (and its buckets) are exact.
//!
//! Entries live in slots, so a flush hashes a key once: it finds the slot
//! while it reads the state before, and writes the state after into it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::domain::{Counter, CounterKey};

/// Counters kept beyond those with pending deltas: about 200 bytes each
/// with their names, so at most ~13 MB per store.
pub(super) const HOT_CAP: usize = 65_536;

/// The value of one day bucket of a counter, now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Day {
    pub day: i64,
    pub value: i64,
    /// Logged deltas of this day are not folded into `buckets` yet.
    pub pending: bool,
}

/// The state of one counter now.
#[derive(Clone, Debug)]
pub(super) struct Entry {
    pub cid: i64,
    pub value: i64,
    pub category: Option<Arc<str>>,
    pub first_ms: i64,
    pub recorded_ms: i64,
    /// The buckets of days touched lately: every day with pending deltas,
    /// and others as read (a day not here is read from `buckets`).
    pub days: Vec<Day>,
    /// The newest log row with a delta of this counter that its row does
    /// not hold yet; 0 when none (the row is current).
    pub pending_seq: i64,
}

impl Entry {
    pub fn day(&self, day: i64) -> Option<i64> {
        self.days.iter().find(|d| d.day == day).map(|d| d.value)
    }

    pub fn counter(&self, key: &CounterKey) -> Counter {
        Counter {
            key: key.clone(),
            value: self.value,
            category: self.category.as_deref().map(String::from),
            first_ms: self.first_ms,
            recorded_ms: self.recorded_ms,
        }
    }
}

/// The counters in memory; see the module documentation.
#[derive(Default)]
pub(super) struct Hot {
    index: HashMap<CounterKey, usize>,
    by_cid: HashMap<i64, usize>,
    slots: Vec<Option<Entry>>,
    free: Vec<usize>,
    /// Entries with pending deltas.
    pending: usize,
    /// The window totals of the counters whose kept rows are out of date
    /// (`windows`): under the same lock, so that a flush's rows, its
    /// counters' state and their totals are seen together or not at all.
    pub windows: super::windows::memory::Memory,
    /// The half-lives whose trending bounds are kept (`trendkeys`), for
    /// the flush's writes of new counters and direct rows.
    pub trend: Vec<i64>,
}

impl Hot {
    /// The slot of `key`, if it is here.
    pub fn slot(&self, key: &CounterKey) -> Option<usize> {
        self.index.get(key).copied()
    }

    /// The entry in `slot` (one [`Hot::slot`] answered since the last change).
    pub fn entry(&self, slot: usize) -> Option<&Entry> {
        self.slots.get(slot)?.as_ref()
    }

    pub fn get(&self, key: &CounterKey) -> Option<&Entry> {
        self.entry(self.slot(key)?)
    }

    pub fn get_by_cid(&self, cid: i64) -> Option<&Entry> {
        self.entry(*self.by_cid.get(&cid)?)
    }

    /// Whether counter `cid` has deltas in the change log not folded yet.
    pub fn is_pending(&self, cid: i64) -> bool {
        self.get_by_cid(cid).is_some_and(|e| e.pending_seq != 0)
    }

    /// Counters with deltas not folded yet.
    pub fn pending(&self) -> usize {
        self.pending
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// At least [`HOT_CAP`] counters are kept.
    pub fn is_full(&self) -> bool {
        self.index.len() >= HOT_CAP
    }

    /// Sets the state of `key`, into `slot` when [`Hot::slot`] found it
    /// there (nothing has changed the slots since), else into a new slot.
    pub fn put(&mut self, slot: Option<usize>, key: CounterKey, entry: Entry) {
        let now_pending = entry.pending_seq != 0;
        // The slot found before holds this counter (a cid names one counter
        // for good), or the key's own slot if it has one.
        let found = match slot {
            Some(i) if self.entry(i).is_some_and(|e| e.cid == entry.cid) => Some(i),
            _ => self.slot(&key),
        };
        if let Some(i) = found {
            let old_cid = self.entry(i).map(|e| e.cid);
            if let Some(old) = old_cid.filter(|c| *c != entry.cid) {
                self.by_cid.remove(&old);
                self.by_cid.insert(entry.cid, i);
            }
            if let Some(Some(e)) = self.slots.get_mut(i) {
                let was_pending = e.pending_seq != 0;
                *e = entry;
                self.count(was_pending, now_pending);
                return;
            }
        }
        let cid = entry.cid;
        let i = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(None);
                self.slots.len() - 1
            }
        };
        self.index.insert(key, i);
        self.slots[i] = Some(entry);
        self.by_cid.insert(cid, i);
        self.count(false, now_pending);
    }

    fn count(&mut self, was: bool, now: bool) {
        match (was, now) {
            (false, true) => self.pending += 1,
            (true, false) => self.pending -= 1,
            _ => {}
        }
    }

    /// Forgets `key` (its row changed by other means: read it again).
    pub fn remove(&mut self, key: &CounterKey) {
        if let Some(i) = self.index.remove(key) {
            self.vacate(i);
        }
    }

    fn vacate(&mut self, i: usize) {
        if let Some(e) = self.slots.get_mut(i).and_then(Option::take) {
            self.by_cid.remove(&e.cid);
            if e.pending_seq != 0 {
                self.pending -= 1;
            }
            self.free.push(i);
        }
    }

    /// Drops counters with nothing pending until at most three quarters of
    /// [`HOT_CAP`] are kept, once past it. Which ones is left to the map's
    /// order: cheap, and no worse than any other guess for uniform keys.
    pub fn trim(&mut self) {
        if self.index.len() <= HOT_CAP {
            return;
        }
        let mut excess = self.index.len() - HOT_CAP * 3 / 4;
        let mut gone = Vec::with_capacity(excess);
        for (key, &i) in &self.index {
            if excess == 0 {
                break;
            }
            if self.entry(i).is_some_and(|e| e.pending_seq == 0) {
                gone.push((key.clone(), i));
                excess -= 1;
            }
        }
        for (key, i) in gone {
            self.index.remove(&key);
            self.vacate(i);
        }
    }

    /// After a fold of the log rows up to `seq` into the counters `cids`:
    /// those with nothing newer pending are current in their rows.
    pub fn folded(&mut self, cids: impl Iterator<Item = i64>, seq: i64) {
        for cid in cids {
            let Some(&i) = self.by_cid.get(&cid) else {
                continue;
            };
            let Some(Some(e)) = self.slots.get_mut(i) else {
                continue;
            };
            if e.pending_seq != 0 && e.pending_seq <= seq {
                e.pending_seq = 0;
                for d in &mut e.days {
                    d.pending = false;
                }
                // The latest day is the one the next increment lands on.
                if e.days.len() > 1 {
                    let latest = e.days.iter().map(|d| d.day).max().unwrap_or(0);
                    e.days.retain(|d| d.day == latest);
                }
                self.pending -= 1;
                self.windows.unpend(cid);
            }
        }
    }

    /// Forgets the buckets of days before `day` (deleted by the retention).
    pub fn forget_days_before(&mut self, day: i64) {
        for e in self.slots.iter_mut().flatten() {
            e.days.retain(|d| d.day >= day || d.pending);
        }
    }
}

/// The store's [`Hot`], shared by the writer and readers.
#[derive(Clone, Default)]
pub(super) struct Shared(Arc<Mutex<Hot>>);

impl Shared {
    /// Locked. A poisoned lock (a panic while held) still holds a
    /// consistent map: each change to it completes or leaves it as it was
    /// but for an entry's own fields, which are each a whole state.
    pub fn lock(&self) -> Locked<'_> {
        let guard = self.0.lock().unwrap_or_else(|p| p.into_inner());
        super::connections::memory_taken();
        Locked(guard)
    }

    /// Counters with deltas not folded yet.
    pub fn pending(&self) -> usize {
        self.lock().pending()
    }
}

/// Memory, locked. While a thread holds it, a commit on that thread does
/// not checkpoint the write-ahead log (see `connections::note_wal_pages`):
/// readers of memory would wait for the checkpoint too.
pub(super) struct Locked<'a>(MutexGuard<'a, Hot>);

impl std::ops::Deref for Locked<'_> {
    type Target = Hot;
    fn deref(&self) -> &Hot {
        &self.0
    }
}

impl std::ops::DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut Hot {
        &mut self.0
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        super::connections::memory_released();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(cid: i64, pending_seq: i64) -> Entry {
        Entry {
            cid,
            value: cid,
            category: None,
            first_ms: 0,
            recorded_ms: 0,
            days: vec![
                Day {
                    day: 10,
                    value: 1,
                    pending: pending_seq != 0,
                },
                Day {
                    day: 11,
                    value: 2,
                    pending: pending_seq != 0,
                },
            ],
            pending_seq,
        }
    }

    fn key(i: i64) -> CounterKey {
        CounterKey::new("E", "A", &format!("u{i}")).unwrap()
    }

    #[test]
    fn trimming_keeps_every_counter_with_pending_deltas() {
        let mut hot = Hot::default();
        let n = HOT_CAP as i64 + 100;
        for i in 0..n {
            hot.put(
                None,
                key(i),
                entry(i + 1, if i % 2 == 0 { i + 1 } else { 0 }),
            );
        }
        assert_eq!(hot.pending() as i64, (n + 1) / 2);
        hot.trim();
        assert_eq!(hot.len(), HOT_CAP * 3 / 4);
        assert_eq!(hot.pending() as i64, (n + 1) / 2);
        for i in (0..n).step_by(2) {
            assert_eq!(hot.get(&key(i)).map(|e| e.cid), Some(i + 1));
        }
        // Freed slots are taken again, found by key and by cid.
        hot.put(None, key(-1), entry(n + 7, 3));
        assert_eq!(hot.get(&key(-1)).map(|e| e.cid), Some(n + 7));
        hot.folded([n + 7].into_iter(), 3);
        assert_eq!(hot.get(&key(-1)).map(|e| e.pending_seq), Some(0));
    }

    #[test]
    fn a_fold_clears_only_what_it_covered() {
        let mut hot = Hot::default();
        hot.put(None, key(1), entry(1, 5));
        hot.put(None, key(2), entry(2, 9));
        assert_eq!(hot.pending(), 2);
        hot.folded([1, 2].into_iter(), 7);
        assert_eq!(hot.pending(), 1);
        let one = hot.get(&key(1)).unwrap();
        assert_eq!(one.pending_seq, 0);
        assert_eq!(
            one.days,
            [Day {
                day: 11,
                value: 2,
                pending: false
            }]
        );
        let two = hot.get(&key(2)).unwrap();
        assert_eq!(two.pending_seq, 9);
        assert!(two.days.iter().all(|d| d.pending));
        // A slot found before is updated in place; removing frees it.
        let slot = hot.slot(&key(2));
        hot.put(slot, key(2), entry(2, 0));
        assert_eq!(hot.pending(), 0);
        hot.remove(&key(2));
        assert!(hot.get(&key(2)).is_none());
        assert_eq!(hot.len(), 1);
    }
}
