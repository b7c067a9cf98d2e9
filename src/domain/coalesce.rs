//! Coalescing: many increments in, one delta per counter key out.
//!
//! This is what makes a store write cost one operation per distinct key per
//! flush instead of one per HTTP request. Sums are kept in `i128` so that a
//! flush whose total leaves the `i64` range is detected, not wrapped.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::sync::Arc;

use crate::domain::hours::hour_in_day;
use crate::domain::{CounterKey, Increment, Kind};

/// The summed effect of a flush on one counter.
#[derive(Clone, Debug, PartialEq)]
pub struct KeyDelta {
    pub key: CounterKey,
    pub delta: i128,
    /// The last category given in arrival order, if any was.
    pub category: Option<Arc<str>>,
    pub first_ms: i64,
    pub last_ms: i64,
    /// `(utc day, delta)` per day touched, in first-touch order; almost always one.
    pub buckets: Vec<(i64, i128)>,
    /// The same deltas per UTC hour touched (`crate::domain::hours`); the
    /// hours of a day sum to its entry of `buckets`.
    pub hours: Hours,
}

/// `(hour, delta)` per hour touched, in first-touch order: the first one
/// inline, so a key coalesced within one hour (nearly every key of a
/// flush) costs no allocation beyond what `buckets` already does.
#[derive(Clone, Debug, PartialEq)]
pub struct Hours {
    first: (i64, i128),
    more: Vec<(i64, i128)>,
}

impl Hours {
    pub fn new(hour: i64, delta: i128) -> Hours {
        Hours {
            first: (hour, delta),
            more: Vec::new(),
        }
    }

    pub fn add(&mut self, hour: i64, delta: i128) {
        if self.first.0 == hour {
            self.first.1 += delta;
            return;
        }
        match self.more.iter_mut().find(|(h, _)| *h == hour) {
            Some((_, d)) => *d += delta,
            None => self.more.push((hour, delta)),
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = (i64, i128)> + '_ {
        std::iter::once(self.first).chain(self.more.iter().copied())
    }
}

/// The summed effect of a flush on one average counter.
#[derive(Clone, Debug, PartialEq)]
pub struct AverageDelta {
    pub key: CounterKey,
    pub sum: i128,
    pub quantity: i128,
    pub category: Option<Arc<str>>,
    pub first_ms: i64,
    pub last_ms: i64,
    /// `(utc day, sum, quantity)` per day touched, in first-touch order.
    pub buckets: Vec<(i64, i128, i128)>,
}

/// The deltas of a flush, in the order their keys were first seen, so the
/// requests a store sends are deterministic.
#[derive(Debug, Default)]
pub struct Coalesced {
    pub keys: Vec<KeyDelta>,
    /// Where each key's delta is, by the key's hash: the first of the keys
    /// with that hash, the others chained through `next`. A key is hashed
    /// once per increment, and never cloned for a lookup.
    index: HashMap<u64, usize, BuildHasherDefault<Prehashed>>,
    /// Per entry of `keys`, the next key with the same hash (rare: a 64-bit
    /// keyed hash), or `usize::MAX`.
    next: Vec<usize>,
    hasher: RandomState,
    /// Average samples, apart from counters: a key may name both a counter
    /// and an average. Empty (and never allocated) without samples.
    pub averages: Vec<AverageDelta>,
    average_index: HashMap<CounterKey, usize>,
    /// Increments that went in; `increments / keys.len()` is the coalescing ratio.
    pub increments: usize,
}

impl Coalesced {
    pub fn add(&mut self, inc: &Increment) {
        self.increments += 1;
        if let Kind::Sample { quantity } = inc.kind {
            return self.add_sample(inc, quantity);
        }
        let hash = self.hasher.hash_one(&inc.key);
        let head = self.index.get(&hash).copied();
        let mut at = head.unwrap_or(usize::MAX);
        while at != usize::MAX && self.keys[at].key != inc.key {
            at = self.next[at];
        }
        if at != usize::MAX {
            let kd = &mut self.keys[at];
            kd.delta += i128::from(inc.delta);
            if inc.category.is_some() {
                kd.category.clone_from(&inc.category);
            }
            kd.first_ms = kd.first_ms.min(inc.ts_ms);
            kd.last_ms = kd.last_ms.max(inc.ts_ms);
            match kd.buckets.iter_mut().find(|(day, _)| *day == inc.day) {
                Some((_, d)) => *d += i128::from(inc.delta),
                None => kd.buckets.push((inc.day, i128::from(inc.delta))),
            }
            kd.hours
                .add(hour_in_day(inc.day, inc.ts_ms), i128::from(inc.delta));
            return;
        }
        self.index.insert(hash, self.keys.len());
        self.next.push(head.unwrap_or(usize::MAX));
        self.keys.push(KeyDelta {
            key: inc.key.clone(),
            delta: i128::from(inc.delta),
            category: inc.category.clone(),
            first_ms: inc.ts_ms,
            last_ms: inc.ts_ms,
            buckets: vec![(inc.day, i128::from(inc.delta))],
            hours: Hours::new(hour_in_day(inc.day, inc.ts_ms), i128::from(inc.delta)),
        });
    }

    /// Kept out of `add` so the counter path stays as it was.
    #[cold]
    fn add_sample(&mut self, inc: &Increment, quantity: i8) {
        let (sum, quantity) = (i128::from(inc.delta), i128::from(quantity));
        if let Some(&i) = self.average_index.get(&inc.key) {
            let ad = &mut self.averages[i];
            ad.sum += sum;
            ad.quantity += quantity;
            if inc.category.is_some() {
                ad.category.clone_from(&inc.category);
            }
            ad.first_ms = ad.first_ms.min(inc.ts_ms);
            ad.last_ms = ad.last_ms.max(inc.ts_ms);
            match ad.buckets.iter_mut().find(|(day, _, _)| *day == inc.day) {
                Some((_, s, q)) => {
                    *s += sum;
                    *q += quantity;
                }
                None => ad.buckets.push((inc.day, sum, quantity)),
            }
            return;
        }
        self.average_index
            .insert(inc.key.clone(), self.averages.len());
        self.averages.push(AverageDelta {
            key: inc.key.clone(),
            sum,
            quantity,
            category: inc.category.clone(),
            first_ms: inc.ts_ms,
            last_ms: inc.ts_ms,
            buckets: vec![(inc.day, sum, quantity)],
        });
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty() && self.averages.is_empty()
    }
}

/// The hasher of an index already keyed by a hash: passes it through.
#[derive(Default)]
struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only `u64`s are hashed; this is the fallback `Hasher` demands.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

pub fn coalesce<'a>(incs: impl IntoIterator<Item = &'a Increment>) -> Coalesced {
    let mut c = Coalesced::default();
    for inc in incs {
        c.add(inc);
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{IncrementSpec, TimePolicy};
    use chrono::{DateTime, Utc};

    /// One instant for every event of a test, so no test depends on when it
    /// runs (two reads of the wall clock may straddle midnight); a day's
    /// last tenth of a second, to show nothing leans on it being mid-day.
    fn now() -> DateTime<Utc> {
        "2028-02-29T23:59:59.900Z".parse().unwrap()
    }

    fn inc(uuid: &str, count: i64, ts: Option<&str>, category: Option<&str>) -> Increment {
        let spec = IncrementSpec {
            entity: "VIDEO",
            action: "VIEW",
            uuid,
            count: Some(count),
            timestamp: ts,
            category,
            ..Default::default()
        };
        Increment::from_spec(&spec, &TimePolicy::default(), now()).unwrap()
    }

    #[test]
    fn sums_per_key_and_per_day() {
        let yesterday = (now() - chrono::Duration::days(1)).to_rfc3339();
        let events = [
            inc("a", 1, None, None),
            inc("b", 5, None, Some("news")),
            inc("a", 2, Some(&yesterday), Some("sports")),
            inc("a", -4, None, None),
        ];
        let c = coalesce(&events);
        assert_eq!(c.increments, 4);
        assert_eq!(c.keys.len(), 2);
        let a = &c.keys[0];
        assert_eq!(&*a.key.uuid, "a");
        assert_eq!(a.delta, -1);
        assert_eq!(a.category.as_deref(), Some("sports"));
        assert_eq!(a.buckets, vec![(events[0].day, -3), (events[2].day, 2)]);
        let hour = |e: &Increment| hour_in_day(e.day, e.ts_ms);
        assert_eq!(
            a.hours.iter().collect::<Vec<_>>(),
            vec![(hour(&events[0]), -3), (hour(&events[2]), 2)]
        );
        assert_eq!(a.first_ms, events[2].ts_ms);
        assert_eq!(a.last_ms, events[3].ts_ms.max(events[0].ts_ms));
        assert_eq!(c.keys[1].delta, 5);
    }

    #[test]
    fn samples_coalesce_apart_from_counters_with_the_same_key() {
        use crate::domain::SampleSpec;
        let sample = |value, retract| {
            let spec = SampleSpec {
                entity: "VIDEO",
                action: "VIEW",
                uuid: "a",
                value,
                retract,
                ..Default::default()
            };
            Increment::sample(&spec, &TimePolicy::default(), now()).unwrap()
        };
        let events = [
            inc("a", 1, None, None),
            sample(4, false),
            sample(2, false),
            sample(4, true),
        ];
        let c = coalesce(&events);
        assert_eq!(c.keys.len(), 1);
        assert_eq!(c.keys[0].delta, 1);
        assert_eq!(c.averages.len(), 1);
        let a = &c.averages[0];
        assert_eq!((a.sum, a.quantity), (2, 1));
        assert_eq!(a.buckets, vec![(events[1].day, 2, 1)]);
    }

    #[test]
    fn sums_past_i64_are_kept_exact() {
        let events = [
            inc("a", i64::MAX, None, None),
            inc("a", i64::MAX, None, None),
        ];
        assert_eq!(coalesce(&events).keys[0].delta, 2 * i128::from(i64::MAX));
    }
}
