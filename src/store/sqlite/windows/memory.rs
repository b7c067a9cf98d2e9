//! The window totals held in memory: those of every counter whose rows in
//! the kept tables (`windows`) are out of date, exact as of the last flush.
//!
//! Why this shape:
//! - A flush only adds to these totals (a few additions per counter), so
//!   keeping every named window exact costs the acknowledgement path next
//!   to nothing; the rows are written later (`windows::write_rows`), off it.
//! - A counter here has no rows in the kept tables (they are deleted when
//!   it comes here), so a top list is the tables' index walk merged with the
//!   best of this memory, and neither source needs to skip the other.
//! - Stored by column, in blocks of [`BLOCK`] slots with an upper bound per
//!   block of each window's totals: a top list scans the blocks in the order
//!   of their bounds and stops at the first whose bound is below the list's
//!   worst entry, so a list right after a bulk load of a million counters
//!   reads a few of their blocks, not all of them. A bound is raised by
//!   every total written into its block and never lowered but when the
//!   block is rebuilt (a flip, memory emptied): a stale bound costs a
//!   block read, never a wrong list.
//! - Totals are kept as i64 (a total of several days may leave it: such a
//!   counter's exact sums go to `wide`, and its columns say so), which
//!   halves what a counter costs against i128.
//! - It also holds each counter's value and whether its row misses deltas
//!   (pending in the change log), with a bound per block of the pending
//!   ones' values: every such counter is here, so an all-time list is the
//!   `counters_top` walk, skipping those rows, merged with the best of
//!   them, without folding first.
//! - Bounded by the store's memory budget (`upkeep::held_max`), shared by
//!   every store of the process: [`held_total`] counts what all of them
//!   hold, about [`BYTES_PER_COUNTER`] each ([`Memory::bytes`] is the
//!   exact figure of one store).

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap};
use std::hash::Hash;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::sync::Arc;

use super::{Side, State, Totals};
use crate::domain::CounterKey;
use crate::store::TopEntry;

/// Slots per block of the totals' bounds: a top list reads whole blocks.
const BLOCK: usize = 256;

/// What a counter held here costs, about: its columns (cid, pair, category,
/// uuid and its string's allocation, membership, value, eight totals as
/// i64: some 125 bytes) and its entry in the map by cid (17 bytes a
/// bucket, the map at most 7/8 full and up to half empty after it grew);
/// 164 at a million counters with 8-byte uuids.
pub(in crate::store::sqlite) const BYTES_PER_COUNTER: usize = 170;

/// Counters held by the memory of every store of the process.
static HELD: AtomicUsize = AtomicUsize::new(0);

/// Counters whose window totals the stores of this process hold in memory.
pub(in crate::store::sqlite) fn held_total() -> usize {
    HELD.load(AtomicOrdering::Relaxed)
}

/// The bounds of the values of pending counters, after the eight columns'.
const PENDING: usize = 8;

/// A column value meaning "this counter's sums are in `wide`": no total
/// kept in a column is `i64::MIN`.
const WIDE: i64 = i64::MIN;

/// One counter's totals: the windows ending on the anchor day (`cur`) and
/// those ending on the day after (`next`), each `None` when the counter
/// has no bucket in that window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(in crate::store::sqlite) struct Sums {
    pub cur: Totals,
    /// `None`: not known yet (the copy of the day after has not reached
    /// the counter, `windows::copy_chunk`).
    pub next: Option<Totals>,
}

impl Sums {
    /// A counter without buckets: member of no window, the day after known.
    pub fn none() -> Sums {
        Sums {
            cur: [None; 4],
            next: Some([None; 4]),
        }
    }

    /// Adds `delta` to the bucket of `day`, which exists from now on: a
    /// member of every window that covers the day, even at a sum of 0.
    pub fn add(&mut self, state: &State, day: i64, delta: i128) {
        for i in 0..4 {
            if state.covers(Side::Cur, i, day) {
                self.cur[i] = Some(self.cur[i].unwrap_or(0) + delta);
            }
            if let Some(next) = &mut self.next {
                if state.covers(Side::Next, i, day) {
                    next[i] = Some(next[i].unwrap_or(0) + delta);
                }
            }
        }
    }

    /// Every total fits a column (`i64`, above [`WIDE`]).
    fn narrow(&self) -> bool {
        let fits = |v: &Option<i128>| {
            v.map_or(true, |v| v > i128::from(WIDE) && v <= i128::from(i64::MAX))
        };
        self.cur.iter().all(fits) && self.next.iter().flatten().all(fits)
    }
}

/// Names kept once, by number.
struct Interner<K> {
    ids: HashMap<K, u32>,
    names: Vec<K>,
}

impl<K> Default for Interner<K> {
    fn default() -> Self {
        Interner {
            ids: HashMap::new(),
            names: Vec::new(),
        }
    }
}

impl<K: Hash + Eq + Clone> Interner<K> {
    fn id(&mut self, k: &K) -> u32 {
        if let Some(&id) = self.ids.get(k) {
            return id;
        }
        let id = self.names.len() as u32;
        self.names.push(k.clone());
        self.ids.insert(k.clone(), id);
        id
    }

    fn get(&self, k: &K) -> Option<u32> {
        self.ids.get(k).copied()
    }

    fn name(&self, id: u32) -> &K {
        &self.names[id as usize]
    }
}

/// The counters whose totals are here, by column; see the module
/// documentation.
#[derive(Default)]
pub(in crate::store::sqlite) struct Memory {
    /// Where the kept tables stand; `None` while they are not kept (a
    /// rebuild is due): nothing is held here then.
    pub state: Option<State>,
    by_cid: HashMap<i64, u32>,
    cid: Vec<i64>,
    pair: Vec<u32>,
    /// 0: no category; `1 + id` of an interned one.
    cat: Vec<u32>,
    uuid: Vec<Box<str>>,
    /// Bit `i`: a member of window `i` ending on the anchor; bit `4 + i`:
    /// of window `i` ending on the day after.
    member: Vec<u8>,
    /// The totals ending on the day after are known.
    known: Vec<bool>,
    /// Slots whose totals of the day after are not known.
    unknown: usize,
    /// Totals by window ending on the anchor, then on the day after (0 for
    /// a window the counter is not a member of; [`WIDE`] in every column of
    /// a counter whose sums are in `wide`).
    cols: [Vec<i64>; 8],
    /// The exact sums of the counters with a total outside the columns.
    wide: HashMap<i64, Sums>,
    /// Per column of `cols` (and [`PENDING`]: the values of pending
    /// counters), per block of [`BLOCK`] slots: at least every total of a
    /// member in the block; `i128::MIN` when none was written.
    bound: [Vec<i128>; 9],
    /// The counter's value, and whether its row misses deltas of the change log.
    value: Vec<i64>,
    pending: Vec<bool>,
    pairs: Interner<(Arc<str>, Arc<str>)>,
    cats: Interner<Arc<str>>,
}

impl Drop for Memory {
    fn drop(&mut self) {
        HELD.fetch_sub(self.cid.len(), AtomicOrdering::Relaxed);
    }
}

/// A counter as written back to the kept tables.
pub(in crate::store::sqlite) struct Held {
    pub cid: i64,
    pub entity: Arc<str>,
    pub action: Arc<str>,
    pub uuid: Arc<str>,
    pub category: Option<Arc<str>>,
    pub sums: Sums,
}

/// The column of window `w` on `side`.
fn col(side: Side, w: usize) -> usize {
    match side {
        Side::Cur => w,
        Side::Next => 4 + w,
    }
}

impl Memory {
    /// Empty, with the kept tables standing at `state`.
    pub fn at(state: Option<State>) -> Memory {
        let mut m = Memory::default();
        m.state = state;
        m
    }

    pub fn len(&self) -> usize {
        self.cid.len()
    }

    /// What this memory takes of the heap, in bytes (its columns' room, its
    /// maps, the uuids' allocations as about 16 bytes past their length).
    pub fn bytes(&self) -> usize {
        let slot = 8 + 4 + 4 + std::mem::size_of::<Box<str>>() + 1 + 1 + 8 * 8 + 8 + 1;
        let strings: usize = self.uuid.iter().map(|u| u.len().div_ceil(16) * 16).sum();
        self.cid.capacity() * slot
            + strings
            + self.by_cid.capacity() * 8 / 7 * 17
            + self.wide.len() * 200
            + self.bound.iter().map(|b| b.capacity() * 16).sum::<usize>()
    }

    /// The counters held whose rows miss no delta (their buckets are exact).
    pub fn unpending(&self) -> Vec<i64> {
        self.cid
            .iter()
            .zip(&self.pending)
            .filter(|(_, p)| !**p)
            .map(|(c, _)| *c)
            .collect()
    }

    /// The counters held, in the order of their slots.
    pub fn cids(&self) -> &[i64] {
        &self.cid
    }

    pub fn get(&self, cid: i64) -> Option<Sums> {
        let i = *self.by_cid.get(&cid)? as usize;
        Some(self.sums(i))
    }

    fn is_wide(&self, i: usize) -> bool {
        self.cols[0][i] == WIDE
    }

    fn sums(&self, i: usize) -> Sums {
        if self.is_wide(i) {
            if let Some(s) = self.wide.get(&self.cid[i]) {
                return s.clone();
            }
        }
        let m = self.member[i];
        let take = |side: Side| -> Totals {
            std::array::from_fn(|w| {
                let c = col(side, w);
                (m >> c & 1 == 1).then(|| i128::from(self.cols[c][i]))
            })
        };
        Sums {
            cur: take(Side::Cur),
            next: self.known[i].then(|| take(Side::Next)),
        }
    }

    /// The total of slot `i` in column `c` (a member's).
    fn total(&self, i: usize, c: usize) -> i128 {
        match self.cols[c][i] {
            WIDE => self
                .wide
                .get(&self.cid[i])
                .and_then(|s| {
                    if c < 4 {
                        s.cur[c]
                    } else {
                        s.next.and_then(|n| n[c - 4])
                    }
                })
                .unwrap_or(0),
            v => i128::from(v),
        }
    }

    /// The counter `cid` as written back.
    pub fn held(&self, cid: i64) -> Option<Held> {
        let i = *self.by_cid.get(&cid)? as usize;
        let (entity, action) = self.pairs.name(self.pair[i]).clone();
        Some(Held {
            cid,
            entity,
            action,
            uuid: Arc::from(&*self.uuid[i]),
            category: self.category(i),
            sums: self.sums(i),
        })
    }

    fn category(&self, i: usize) -> Option<Arc<str>> {
        match self.cat[i] {
            0 => None,
            c => Some(self.cats.name(c - 1).clone()),
        }
    }

    /// Raises the bound of slot `i`'s block in column `c` to `v`.
    fn raise(&mut self, i: usize, c: usize, v: i128) {
        let b = &mut self.bound[c][i / BLOCK];
        if v > *b {
            *b = v;
        }
    }

    /// Writes the totals of slot `i` (its membership bits of the windows
    /// ending on the anchor, and on the day after if known, from `sums`).
    fn write(&mut self, i: usize, sums: &Sums) {
        let cid = self.cid[i];
        let narrow = sums.narrow();
        let mut m = 0u8;
        let all: [Option<i128>; 8] = std::array::from_fn(|c| {
            if c < 4 {
                sums.cur[c]
            } else {
                sums.next.and_then(|n| n[c - 4])
            }
        });
        for (c, v) in all.iter().enumerate() {
            self.cols[c][i] = if narrow {
                v.map_or(0, |v| v as i64)
            } else {
                WIDE
            };
            if let Some(v) = *v {
                m |= 1 << c;
                self.raise(i, c, v);
            }
        }
        if narrow {
            self.wide.remove(&cid);
        } else {
            self.wide.insert(cid, sums.clone());
        }
        self.member[i] = m;
        let known = sums.next.is_some();
        match (self.known[i], known) {
            (true, false) => self.unknown += 1,
            (false, true) => self.unknown -= 1,
            _ => {}
        }
        self.known[i] = known;
    }

    /// Sets the totals, category, value and pending state of `key`
    /// (counter `cid`).
    pub fn put(
        &mut self,
        cid: i64,
        key: &CounterKey,
        category: Option<&Arc<str>>,
        sums: &Sums,
        value: i64,
        pending: bool,
    ) {
        let cat = category.map_or(0, |c| 1 + self.cats.id(c));
        let i = match self.by_cid.get(&cid) {
            Some(&i) => i as usize,
            None => {
                let pair = self.pairs.id(&(key.entity.clone(), key.action.clone()));
                let i = self.cid.len();
                self.by_cid.insert(cid, i as u32);
                self.cid.push(cid);
                self.pair.push(pair);
                self.cat.push(0);
                self.uuid.push(Box::from(&*key.uuid));
                self.member.push(0);
                self.known.push(true);
                self.value.push(0);
                self.pending.push(false);
                for c in &mut self.cols {
                    c.push(0);
                }
                if i % BLOCK == 0 {
                    for b in &mut self.bound {
                        b.push(i128::MIN);
                    }
                }
                HELD.fetch_add(1, AtomicOrdering::Relaxed);
                i
            }
        };
        self.cat[i] = cat;
        self.value[i] = value;
        self.pending[i] = pending;
        if pending {
            self.raise(i, PENDING, i128::from(value));
        }
        self.write(i, sums);
    }

    /// Sets the totals ending on the day after, once the copy computed them.
    pub fn set_next(&mut self, cid: i64, next: &Totals) {
        let Some(&i) = self.by_cid.get(&cid) else {
            return;
        };
        let i = i as usize;
        let mut sums = self.sums(i);
        sums.next = Some(*next);
        self.write(i, &sums);
    }

    /// The row of `cid` holds every delta now (folded).
    pub fn unpend(&mut self, cid: i64) {
        if let Some(&i) = self.by_cid.get(&cid) {
            self.pending[i as usize] = false;
        }
    }

    /// Forgets `cid` (its rows were written, or it is gone).
    pub fn remove(&mut self, cid: i64) {
        let Some(i) = self.by_cid.remove(&cid) else {
            return;
        };
        let i = i as usize;
        HELD.fetch_sub(1, AtomicOrdering::Relaxed);
        self.wide.remove(&cid);
        if !self.known[i] {
            self.unknown -= 1;
        }
        self.cid.swap_remove(i);
        self.pair.swap_remove(i);
        self.cat.swap_remove(i);
        self.uuid.swap_remove(i);
        self.member.swap_remove(i);
        self.known.swap_remove(i);
        self.value.swap_remove(i);
        self.pending.swap_remove(i);
        for c in &mut self.cols {
            c.swap_remove(i);
        }
        let len = self.cid.len();
        if i < len {
            self.by_cid.insert(self.cid[i], i as u32);
            // The slot moved here from the last block: its block's bounds
            // take its totals.
            let m = self.member[i];
            for c in 0..8 {
                if m >> c & 1 == 1 {
                    let v = self.total(i, c);
                    self.raise(i, c, v);
                }
            }
            if self.pending[i] {
                self.raise(i, PENDING, i128::from(self.value[i]));
            }
        }
        if len % BLOCK == 0 {
            for b in &mut self.bound {
                b.truncate(len / BLOCK);
            }
        }
        if len == 0 {
            // The columns' room and the names of pairs and categories no
            // counter here uses any more: a bulk load's worth of memory
            // goes back once written.
            self.clear();
        } else if len * 4 < self.cid.capacity() && self.cid.capacity() > 4096 {
            self.shrink();
        }
    }

    /// Gives back the room of the columns down to twice what they hold.
    fn shrink(&mut self) {
        let room = self.cid.len() * 2;
        self.cid.shrink_to(room);
        self.pair.shrink_to(room);
        self.cat.shrink_to(room);
        self.uuid.shrink_to(room);
        self.member.shrink_to(room);
        self.known.shrink_to(room);
        self.value.shrink_to(room);
        self.pending.shrink_to(room);
        for c in &mut self.cols {
            c.shrink_to(room);
        }
        self.by_cid.shrink_to(room);
    }

    /// Forgets every counter (the tables are rebuilt from the buckets).
    pub fn clear(&mut self) {
        drop(self.take_all());
    }

    /// Forgets every counter, handing them back: a caller holding the lock
    /// drops them after releasing it (a million counters take some
    /// milliseconds to free).
    pub fn take_all(&mut self) -> Memory {
        std::mem::replace(self, Memory::at(self.state))
    }

    /// Midnight: the totals ending on the day after become the current ones
    /// (every one is known: the tables flip only once the copy is done), and
    /// those of the new day after are not known yet.
    pub fn flip(&mut self, state: State) {
        debug_assert_eq!(self.unknown, 0);
        let [c0, c1, c2, c3, n0, n1, n2, n3] = std::mem::take(&mut self.cols);
        self.cols = [n0, n1, n2, n3, c0, c1, c2, c3];
        let [c0, c1, c2, c3, n0, n1, n2, n3, p] = std::mem::take(&mut self.bound);
        self.bound = [n0, n1, n2, n3, c0, c1, c2, c3, p];
        for b in &mut self.bound[4..8] {
            b.iter_mut().for_each(|v| *v = i128::MIN);
        }
        for m in &mut self.member {
            *m >>= 4;
        }
        self.known.iter_mut().for_each(|k| *k = false);
        self.unknown = self.cid.len();
        for s in self.wide.values_mut() {
            s.cur = s.next.take().unwrap_or([None; 4]);
        }
        self.state = Some(state);
    }

    fn ids(
        &self,
        entity: &str,
        action: &str,
        category: Option<&str>,
    ) -> Option<(u32, Option<u32>)> {
        let pair = self.pairs.get(&(Arc::from(entity), Arc::from(action)))?;
        let cat = match category {
            None => None,
            Some(c) => Some(self.cats.get(&Arc::from(c))? + 1),
        };
        Some((pair, cat))
    }

    /// The best `n` counters of window `w` (its side) for the pair and
    /// category asked, value descending then uuid ascending; `None` when one
    /// of them has totals not known yet (the caller then sums buckets).
    pub fn top(
        &self,
        entity: &str,
        action: &str,
        category: Option<&str>,
        w: usize,
        side: Side,
        n: usize,
    ) -> Option<Vec<TopEntry>> {
        let Some((pair, cat)) = self.ids(entity, action, category) else {
            return Some(Vec::new());
        };
        if side == Side::Next
            && self.unknown > 0
            && (0..self.cid.len()).any(|i| {
                self.pair[i] == pair
                    && (cat.is_none() || cat == Some(self.cat[i]))
                    && !self.known[i]
            })
        {
            return None;
        }
        let c = col(side, w);
        let bit = 1u8 << c;
        let best = self.pruned(c, pair, cat, n, |i| {
            (self.member[i] & bit != 0).then(|| self.total(i, c))
        });
        Some(self.entries(best))
    }

    /// The best `n` of the counters of `pair` (and category `cat`) that
    /// `value` gives a value, reading the blocks best bound `b` first and
    /// stopping at the first that cannot enter.
    fn pruned(
        &self,
        b: usize,
        pair: u32,
        cat: Option<u32>,
        n: usize,
        value: impl Fn(usize) -> Option<i128>,
    ) -> Best<'_> {
        let bound = &self.bound[b];
        // Blocks with a member, best bound first.
        let mut blocks: Vec<u32> = (0..bound.len() as u32)
            .filter(|&k| bound[k as usize] > i128::MIN)
            .collect();
        blocks.sort_unstable_by_key(|&k| Reverse(bound[k as usize]));
        let mut best = Best::new(n);
        for k in blocks {
            let k = k as usize;
            // Nothing in this block, nor in any after it, can enter.
            if best.worst().is_some_and(|worst| bound[k] < worst) {
                break;
            }
            for i in k * BLOCK..((k + 1) * BLOCK).min(self.cid.len()) {
                if self.pair[i] != pair || cat.is_some_and(|c| self.cat[i] != c) {
                    continue;
                }
                if let Some(v) = value(i) {
                    best.offer(v, &self.uuid[i], i);
                }
            }
        }
        best
    }

    /// The best `n` counters by value (all time) among those whose rows
    /// miss deltas, for the pair and category asked.
    pub fn top_pending(
        &self,
        entity: &str,
        action: &str,
        category: Option<&str>,
        n: usize,
    ) -> Vec<TopEntry> {
        let Some((pair, cat)) = self.ids(entity, action, category) else {
            return Vec::new();
        };
        let best = self.pruned(PENDING, pair, cat, n, |i| {
            self.pending[i].then(|| i128::from(self.value[i]))
        });
        self.entries(best)
    }

    fn entries(&self, best: Best<'_>) -> Vec<TopEntry> {
        let mut out: Vec<Candidate<'_>> = best.heap.into_vec();
        out.sort();
        out.into_iter()
            .map(|c| TopEntry {
                uuid: c.uuid.to_string(),
                value: c.value,
                category: self.category(c.at).map(|c| c.to_string()),
            })
            .collect()
    }
}

/// The best `n` offered so far, the worst of them on top.
struct Best<'a> {
    n: usize,
    heap: BinaryHeap<Candidate<'a>>,
}

impl<'a> Best<'a> {
    fn new(n: usize) -> Best<'a> {
        Best {
            n,
            heap: BinaryHeap::with_capacity(n + 1),
        }
    }

    /// The value an entry must reach to enter, once `n` are kept (an equal
    /// value enters with a smaller uuid).
    fn worst(&self) -> Option<i128> {
        if self.heap.len() < self.n || self.n == 0 {
            return (self.n == 0).then_some(i128::MAX);
        }
        self.heap.peek().map(|c| c.value)
    }

    fn offer(&mut self, value: i128, uuid: &'a str, at: usize) {
        if self.n == 0 {
            return;
        }
        if self.heap.len() == self.n && self.heap.peek().is_some_and(|c| value < c.value) {
            return;
        }
        self.heap.push(Candidate { value, uuid, at });
        if self.heap.len() > self.n {
            self.heap.pop();
        }
    }
}

/// A counter in a top list being chosen, ordered worst last: value
/// descending, then uuid ascending.
struct Candidate<'a> {
    value: i128,
    uuid: &'a str,
    at: usize,
}

impl Ord for Candidate<'_> {
    fn cmp(&self, other: &Self) -> Ordering {
        (Reverse(self.value), self.uuid).cmp(&(Reverse(other.value), other.uuid))
    }
}

impl PartialOrd for Candidate<'_> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Candidate<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Candidate<'_> {}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(uuid: &str) -> CounterKey {
        CounterKey::new("E", "A", uuid).unwrap()
    }

    fn state() -> State {
        State {
            anchor: 100,
            parity: 0,
            copied: super::super::COMPLETE,
        }
    }

    #[test]
    fn a_delta_counts_in_the_windows_that_cover_its_day() {
        let s = state();
        let mut sums = Sums::none();
        sums.add(&s, 100, 5);
        sums.add(&s, 94, 2);
        sums.add(&s, 101, 7);
        sums.add(&s, 70, 0);
        sums.add(&s, 100 - 365, 9);
        assert_eq!(sums.cur, [Some(5), Some(7), Some(7), Some(7)]);
        assert_eq!(
            sums.next,
            Some([Some(7), Some(12), Some(14), Some(14)]),
            "the week after drops day 94, the month after day 71"
        );
    }

    #[test]
    fn lists_keep_the_best_in_order_and_follow_flips_and_removals() {
        let s = state();
        let mut m = Memory::at(Some(s));
        let sports: Arc<str> = "sports".into();
        for (i, v) in [5i128, 9, 9, 1, -3].into_iter().enumerate() {
            let mut sums = Sums::none();
            sums.add(&s, 100, v);
            sums.add(&s, 101, 10 * v);
            let cat = (i % 2 == 0).then_some(&sports);
            m.put(i as i64 + 1, &key(&format!("u{i}")), cat, &sums, 0, false);
        }
        let top = |m: &Memory, cat: Option<&str>, side, n| -> Vec<(String, i128)> {
            m.top("E", "A", cat, 1, side, n)
                .unwrap()
                .into_iter()
                .map(|e| (e.uuid, e.value))
                .collect()
        };
        let l = |v: &[(&str, i128)]| -> Vec<(String, i128)> {
            v.iter().map(|(u, x)| (u.to_string(), *x)).collect()
        };
        assert_eq!(
            top(&m, None, Side::Cur, 3),
            l(&[("u1", 9), ("u2", 9), ("u0", 5)])
        );
        assert_eq!(
            top(&m, Some("sports"), Side::Cur, 10),
            l(&[("u2", 9), ("u0", 5), ("u4", -3)])
        );
        assert_eq!(top(&m, Some("none"), Side::Cur, 10), l(&[]));
        assert!(m.top("E", "B", None, 1, Side::Cur, 10).unwrap().is_empty());
        assert_eq!(top(&m, None, Side::Next, 2), l(&[("u1", 99), ("u2", 99)]));
        m.remove(2);
        assert_eq!(top(&m, None, Side::Cur, 2), l(&[("u2", 9), ("u0", 5)]));
        assert_eq!(m.get(5).unwrap().cur[1], Some(-3));
        m.flip(State {
            anchor: 101,
            parity: 1,
            copied: -1,
        });
        assert_eq!(top(&m, None, Side::Cur, 2), l(&[("u2", 99), ("u0", 55)]));
        assert_eq!(m.top("E", "A", None, 1, Side::Next, 2), None);
        m.set_next(3, &[None, Some(4), None, None]);
        assert_eq!(
            m.get(3).unwrap(),
            Sums {
                cur: [Some(90), Some(99), Some(99), Some(99)],
                next: Some([None, Some(4), None, None]),
            }
        );
        for cid in 1..=5 {
            m.remove(cid);
        }
        assert_eq!(m.len(), 0);
    }

    /// Lists equal a sort of every counter's exact total through puts,
    /// removals (slots move between blocks), totals past i64, the copy of
    /// the day after and flips, over many blocks: the bounds only skip
    /// blocks that cannot enter.
    #[test]
    fn pruned_lists_equal_a_full_sort_over_many_blocks() {
        let mut seed = 0x2545_F491_4F6C_DD1Du64;
        let mut rnd = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let mut s = state();
        let mut m = Memory::at(Some(s));
        let mut model: HashMap<i64, (String, Option<&str>, Sums)> = HashMap::new();
        // The values of the counters whose rows miss deltas.
        let mut pending: HashMap<i64, i64> = HashMap::new();
        let cats = [None, Some("a"), Some("b")];
        for round in 0..6 {
            for _ in 0..3_000 {
                let cid = rnd(2_000) as i64 + 1;
                if rnd(10) == 0 {
                    m.remove(cid);
                    model.remove(&cid);
                    pending.remove(&cid);
                    continue;
                }
                if rnd(10) == 0 {
                    m.unpend(cid);
                    pending.remove(&cid);
                    continue;
                }
                let cat = cats[rnd(3) as usize];
                let mut sums = model
                    .get(&cid)
                    .map_or_else(Sums::none, |(_, _, s)| s.clone());
                let delta = match rnd(50) {
                    0 => i128::from(i64::MAX),
                    1 => -i128::from(i64::MAX),
                    _ => rnd(1_000) as i128 - 200,
                };
                sums.add(&s, s.anchor - rnd(40) as i64 + 1, delta);
                let uuid = format!("u{:04}", rnd(5_000));
                let uuid = model.get(&cid).map_or(uuid, |(u, _, _)| u.clone());
                let value = rnd(10_000) as i64 - 3_000;
                let is_pending = rnd(3) == 0;
                let c = cat.map(Arc::from);
                m.put(cid, &key(&uuid), c.as_ref(), &sums, value, is_pending);
                if is_pending {
                    pending.insert(cid, value);
                } else {
                    pending.remove(&cid);
                }
                model.insert(cid, (uuid, cat, sums));
            }
            assert_eq!(m.len(), model.len());
            for cat in cats {
                for n in [1, 10, 100] {
                    let mut want: Vec<(String, i128)> = pending
                        .iter()
                        .filter(|(cid, _)| cat.is_none() || model[cid].1 == cat)
                        .map(|(cid, v)| (model[cid].0.clone(), i128::from(*v)))
                        .collect();
                    want.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
                    want.truncate(n);
                    let got: Vec<(String, i128)> = m
                        .top_pending("E", "A", cat, n)
                        .into_iter()
                        .map(|e| (e.uuid, e.value))
                        .collect();
                    assert_eq!(got, want, "pending, round {round} {cat:?} n{n}");
                }
            }
            for side in [Side::Cur, Side::Next] {
                for w in 0..4 {
                    for cat in cats {
                        for n in [1, 10, 100] {
                            let mut want: Vec<(String, i128)> = model
                                .values()
                                .filter(|(_, c, _)| cat.is_none() || *c == cat)
                                .filter_map(|(u, _, sums)| {
                                    let t = match side {
                                        Side::Cur => sums.cur,
                                        Side::Next => sums.next?,
                                    };
                                    Some((u.clone(), t[w]?))
                                })
                                .collect();
                            want.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
                            want.truncate(n);
                            let got: Vec<(String, i128)> = m
                                .top("E", "A", cat, w, side, n)
                                .unwrap()
                                .into_iter()
                                .map(|e| (e.uuid, e.value))
                                .collect();
                            assert_eq!(got, want, "round {round} {side:?} w{w} {cat:?} n{n}");
                        }
                    }
                }
            }
            // Midnight: the day after becomes current, then is copied in.
            s = State {
                anchor: s.anchor + 1,
                parity: 1 - s.parity,
                copied: super::super::COMPLETE,
            };
            m.flip(s);
            assert_eq!(m.top("E", "A", None, 0, Side::Next, 5), None);
            for (cid, (_, _, sums)) in model.iter_mut() {
                sums.cur = sums.next.take().unwrap();
                let mut next = sums.cur;
                // The day that leaves each window is made up here: only
                // that memory keeps what it is given matters.
                next[0] = None;
                next[1] = next[1].map(|v| v + 3);
                sums.next = Some(next);
                m.set_next(*cid, &next);
            }
            for (cid, (_, _, sums)) in &model {
                assert_eq!(m.get(*cid).as_ref(), Some(sums));
            }
        }
    }
}
