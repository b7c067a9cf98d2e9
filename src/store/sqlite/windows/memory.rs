//! The window totals held in memory: those of every counter whose rows in
//! the kept tables (`windows`) are out of date, exact as of the last flush.
//!
//! Why this shape:
//! - A flush only adds to these totals (a few additions per counter), so
//!   keeping every named window exact costs the acknowledgement path next
//!   to nothing; the rows are written later (`windows::write_rows`), off it.
//! - A counter here has no rows in the kept tables (they are deleted when
//!   it comes here), so a top list is the tables' index walk merged with a
//!   scan of this memory, and neither source needs to skip the other.
//! - Stored by column: a scan for one window of one pair reads the pair ids,
//!   the membership bits and that window's totals, a few megabytes at
//!   300,000 counters (under a millisecond), not every counter's state.
//! - It also holds each counter's value and whether its row misses deltas
//!   (pending in the change log): every such counter is here, so an
//!   all-time list is the `counters_top` walk, skipping those rows, merged
//!   with them, without folding first.
//! - Bounded by the store (`Writer::fold_after_flush`); the entries are
//!   about 250 bytes each.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap};
use std::hash::Hash;
use std::sync::Arc;

use super::{Side, State, Totals};
use crate::domain::CounterKey;
use crate::store::TopEntry;

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
    uuid: Vec<Arc<str>>,
    /// Bit `i`: a member of window `i` ending on the anchor; bit `4 + i`:
    /// of window `i` ending on the day after.
    member: Vec<u8>,
    /// The totals ending on the day after are known.
    known: Vec<bool>,
    /// The counter's value, and whether its row misses deltas of the change log.
    value: Vec<i64>,
    pending: Vec<bool>,
    cur: [Vec<i128>; 4],
    next: [Vec<i128>; 4],
    pairs: Interner<(Arc<str>, Arc<str>)>,
    cats: Interner<Arc<str>>,
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

impl Memory {
    pub fn len(&self) -> usize {
        self.cid.len()
    }

    /// The counters held, in the order of their slots.
    pub fn cids(&self) -> &[i64] {
        &self.cid
    }

    pub fn get(&self, cid: i64) -> Option<Sums> {
        let i = *self.by_cid.get(&cid)? as usize;
        Some(self.sums(i))
    }

    fn sums(&self, i: usize) -> Sums {
        let m = self.member[i];
        let take = |cols: &[Vec<i128>; 4], shift: u32| -> Totals {
            std::array::from_fn(|w| (m >> (shift + w as u32) & 1 == 1).then(|| cols[w][i]))
        };
        Sums {
            cur: take(&self.cur, 0),
            next: self.known[i].then(|| take(&self.next, 4)),
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
            uuid: self.uuid[i].clone(),
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
                self.uuid.push(key.uuid.clone());
                self.member.push(0);
                self.known.push(false);
                self.value.push(0);
                self.pending.push(false);
                for col in self.cur.iter_mut().chain(self.next.iter_mut()) {
                    col.push(0);
                }
                i
            }
        };
        self.cat[i] = cat;
        self.value[i] = value;
        self.pending[i] = pending;
        let mut m = 0u8;
        for w in 0..4 {
            if let Some(v) = sums.cur[w] {
                m |= 1 << w;
                self.cur[w][i] = v;
            }
        }
        self.known[i] = sums.next.is_some();
        if let Some(next) = &sums.next {
            for (w, v) in next.iter().enumerate() {
                if let Some(v) = *v {
                    m |= 1 << (4 + w);
                    self.next[w][i] = v;
                }
            }
        }
        self.member[i] = m;
    }

    /// Sets the totals ending on the day after, once the copy computed them.
    pub fn set_next(&mut self, cid: i64, next: &Totals) {
        let Some(&i) = self.by_cid.get(&cid) else {
            return;
        };
        let i = i as usize;
        let mut m = self.member[i] & 0x0f;
        for (w, v) in next.iter().enumerate() {
            if let Some(v) = *v {
                m |= 1 << (4 + w);
                self.next[w][i] = v;
            }
        }
        self.member[i] = m;
        self.known[i] = true;
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
        self.cid.swap_remove(i);
        self.pair.swap_remove(i);
        self.cat.swap_remove(i);
        self.uuid.swap_remove(i);
        self.member.swap_remove(i);
        self.known.swap_remove(i);
        self.value.swap_remove(i);
        self.pending.swap_remove(i);
        for col in self.cur.iter_mut().chain(self.next.iter_mut()) {
            col.swap_remove(i);
        }
        if i < self.cid.len() {
            self.by_cid.insert(self.cid[i], i as u32);
        }
        if self.cid.is_empty() {
            // The columns' room and the names of pairs and categories no
            // counter here uses any more: a bulk load's worth of memory
            // goes back once written.
            self.clear();
        } else if self.cid.len() * 4 < self.cid.capacity() && self.cid.capacity() > 4096 {
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
        for col in self.cur.iter_mut().chain(self.next.iter_mut()) {
            col.shrink_to(room);
        }
        self.by_cid.shrink_to(room);
    }

    /// Forgets every counter (the tables are rebuilt from the buckets).
    pub fn clear(&mut self) {
        *self = Memory {
            state: self.state,
            ..Memory::default()
        };
    }

    /// Midnight: the totals ending on the day after become the current ones
    /// (every one is known: the tables flip only once the copy is done), and
    /// those of the new day after are not known yet.
    pub fn flip(&mut self, state: State) {
        debug_assert!(self.known.iter().all(|k| *k));
        std::mem::swap(&mut self.cur, &mut self.next);
        for m in &mut self.member {
            *m >>= 4;
        }
        self.known.iter_mut().for_each(|k| *k = false);
        self.state = Some(state);
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
        let Some(pair) = self.pairs.get(&(Arc::from(entity), Arc::from(action))) else {
            return Some(Vec::new());
        };
        let cat = match category {
            None => None,
            Some(c) => match self.cats.get(&Arc::from(c)) {
                Some(id) => Some(id + 1),
                None => return Some(Vec::new()),
            },
        };
        let (col, bit) = match side {
            Side::Cur => (&self.cur[w], 1u8 << w),
            Side::Next => (&self.next[w], 1u8 << (4 + w)),
        };
        if side == Side::Next
            && (0..self.cid.len()).any(|i| {
                self.pair[i] == pair
                    && (cat.is_none() || cat == Some(self.cat[i]))
                    && !self.known[i]
            })
        {
            return None;
        }
        Some(self.best(pair, cat, n, |i| {
            (self.member[i] & bit != 0).then(|| col[i])
        }))
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
        let Some(pair) = self.pairs.get(&(Arc::from(entity), Arc::from(action))) else {
            return Vec::new();
        };
        let cat = match category {
            None => None,
            Some(c) => match self.cats.get(&Arc::from(c)) {
                Some(id) => Some(id + 1),
                None => return Vec::new(),
            },
        };
        self.best(pair, cat, n, |i| {
            self.pending[i].then(|| i128::from(self.value[i]))
        })
    }

    /// The best `n` of the counters of `pair` (and category `cat`) that
    /// `value` gives a value, value descending then uuid ascending.
    fn best(
        &self,
        pair: u32,
        cat: Option<u32>,
        n: usize,
        value: impl Fn(usize) -> Option<i128>,
    ) -> Vec<TopEntry> {
        // The worst of the best `n` on top.
        let mut best: BinaryHeap<Candidate<'_>> = BinaryHeap::with_capacity(n + 1);
        for i in 0..self.cid.len() {
            if self.pair[i] != pair || cat.is_some_and(|c| self.cat[i] != c) {
                continue;
            }
            let Some(value) = value(i) else {
                continue;
            };
            if best.len() == n {
                let worst = best.peek().map_or(i128::MIN, |c| c.value);
                if value < worst {
                    continue;
                }
            }
            best.push(Candidate {
                value,
                uuid: &self.uuid[i],
                at: i,
            });
            if best.len() > n {
                best.pop();
            }
        }
        let mut out: Vec<Candidate<'_>> = best.into_vec();
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
        let mut m = Memory {
            state: Some(s),
            ..Memory::default()
        };
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
}
