//! The writes of a flush, inside its transaction: counters that exist get
//! their deltas appended to the change log (one blob, `log`), new ones are
//! inserted whole; overflow is checked against the exact state each counter
//! has now, which the writer keeps in memory (`hot`) or reads from its row.
//!
//! Once [`DIRECT_PENDING`] counters have deltas in the log, a counter with
//! none there is written directly (its row and buckets set to the state the
//! flush leaves), as before the log existed: a bulk load of distinct
//! counters gains nothing from logging (each counter comes once per flush,
//! nothing coalesces) and would pay for its deltas twice, logged and then
//! folded, while the pending counters, all in memory, would grow without
//! bound. Counters already pending stay logged: their rows miss deltas.
//!
//! The claims of idempotency ids (and any other claim) stay steps of their
//! own in `flush.rs`, before these writes.

use std::collections::HashMap;
use std::sync::Arc;

use rusqlite::{params, Connection, OptionalExtension};

use super::hot::{self, Day, Entry, Hot};
use super::windows::{self, memory::Sums};

/// Pending counters (with deltas in the log) past which a counter with none
/// is written directly instead of logged; see the module documentation.
pub(super) const DIRECT_PENDING: usize = 32_768;
use super::{log, queries, sql};
use crate::domain::{Coalesced, Counter, CounterKey, KeyDelta};
use crate::store::StoreError;

/// Why a coalesced write could not be applied as a whole.
pub(super) struct Overflowed(pub CounterKey);

/// A counter a flush touches: its state as the flush leaves it.
struct Touch {
    key: CounterKey,
    /// Where the writer's memory holds it (`None`: not there).
    slot: Option<usize>,
    entry: Entry,
    /// Not in `counters` before this flush: inserted whole, not logged.
    new: bool,
    /// Written directly (row and buckets set), not logged.
    direct: bool,
    /// Its window totals as the flush leaves them (`None`: the totals are
    /// not kept now, a rebuild is due).
    windows: Option<Sums>,
    /// What this flush logs of an existing counter: its delta per day and
    /// hour of the day (`None`: a day before the first one whose hours are
    /// kept, `hours_from`), and the category, first and last touch it
    /// brings. The hours of a day sum to its delta.
    deltas: Vec<(i64, Option<u8>, i128)>,
    category: Option<Arc<str>>,
    first_ms: i64,
    last_ms: i64,
}

/// The counters of one flush, checked and accumulated, then written.
pub(super) struct Flush<'h> {
    hot: &'h hot::Shared,
    touched: Vec<Touch>,
    /// Where each key is in `touched`; kept only when keys may repeat (a
    /// flush whose requests are checked one by one).
    index: Option<HashMap<CounterKey, usize>>,
    /// Rows and log entries written, for the metrics.
    pub writes: usize,
    /// The first day whose increments also land in hour buckets (see
    /// `hours`): the store's first complete day, read before the flush.
    hours_from: i64,
}

impl<'h> Flush<'h> {
    /// For a flush whose deltas are coalesced over all its requests: each
    /// key comes once.
    pub fn coalesced(hot: &'h hot::Shared, keys: usize, hours_from: i64) -> Flush<'h> {
        Flush {
            hot,
            touched: Vec::with_capacity(keys),
            index: None,
            writes: 0,
            hours_from,
        }
    }

    /// For a flush checked request by request: a key may come again.
    pub fn by_request(hot: &'h hot::Shared, hours_from: i64) -> Flush<'h> {
        Flush {
            hot,
            touched: Vec::new(),
            index: Some(HashMap::new()),
            writes: 0,
            hours_from,
        }
    }

    /// Adds every counter delta of `c`, or none of them if one would take
    /// a counter or a day bucket outside i64 (the first such key is named).
    /// Averages are not here: they are written directly (`queries`).
    pub fn add(
        &mut self,
        tx: &Connection,
        c: &Coalesced,
    ) -> Result<Result<(), Overflowed>, StoreError> {
        Ok(self.check(tx, c)?.map(|at| self.apply(c, at)))
    }

    /// Checks the counter deltas of `c` against the state the flush has
    /// reached, changing nothing: where each key is, to [`Flush::apply`]
    /// them, or the first key that would leave i64.
    pub fn check(
        &mut self,
        tx: &Connection,
        c: &Coalesced,
    ) -> Result<Result<Vec<usize>, Overflowed>, StoreError> {
        let mut at = Vec::with_capacity(c.keys.len());
        if self.index.is_none() {
            // Each key comes once: their states are read from memory under
            // one hold of the lock, the others from their rows after.
            let first = self.touched.len();
            {
                let hot = self.hot.lock();
                for kd in &c.keys {
                    let slot = hot.slot(&kd.key);
                    let found = slot.and_then(|i| hot.entry(i)).cloned();
                    self.touched.push(touch(kd, slot, found));
                }
            }
            for (t, kd) in self.touched[first..].iter_mut().zip(&c.keys) {
                complete(tx, t, kd)?;
            }
            for (i, kd) in c.keys.iter().enumerate() {
                if let Err(o) = check(&self.touched[first + i], kd) {
                    return Ok(Err(o));
                }
                at.push(first + i);
            }
            return Ok(Ok(at));
        }
        for kd in &c.keys {
            let i = self.find(tx, kd)?;
            if let Err(o) = check(&self.touched[i], kd) {
                return Ok(Err(o));
            }
            at.push(i);
        }
        Ok(Ok(at))
    }

    /// Adds the deltas of `c`, checked by [`Flush::check`] into `at`.
    pub fn apply(&mut self, c: &Coalesced, at: Vec<usize>) {
        for (kd, i) in c.keys.iter().zip(at) {
            apply(&mut self.touched[i], kd, self.hours_from);
        }
    }

    /// The index in `touched` of the key of `kd`, loading its state.
    fn find(&mut self, tx: &Connection, kd: &KeyDelta) -> Result<usize, StoreError> {
        if let Some(i) = self.index.as_ref().and_then(|m| m.get(&kd.key)) {
            let i = *i;
            // Days this flush has not read yet for the key.
            complete_days(tx, &mut self.touched[i], kd)?;
            return Ok(i);
        }
        let (slot, found) = {
            let hot = self.hot.lock();
            let slot = hot.slot(&kd.key);
            (slot, slot.and_then(|i| hot.entry(i)).cloned())
        };
        let mut t = touch(kd, slot, found);
        complete(tx, &mut t, kd)?;
        let i = self.touched.len();
        self.touched.push(t);
        if let Some(m) = &mut self.index {
            m.insert(kd.key.clone(), i);
        }
        Ok(i)
    }

    /// Writes what was added: new counters inserted with their buckets,
    /// the deltas of the others appended to the log as one blob, or written
    /// directly past [`DIRECT_PENDING`] pending counters (see the module
    /// documentation). Returns the log row (0: nothing logged).
    pub fn write(&mut self, tx: &Connection, first_days: &[u32]) -> Result<i64, StoreError> {
        let mut blob = log::Writer::new();
        let mut insert = None;
        let mut direct = None;
        let mut hours = None;
        let mut trend = None;
        let mut pending = self.hot.pending();
        for t in &mut self.touched {
            // Loaded for a request that was then refused: nothing to write.
            if t.deltas.is_empty() {
                continue;
            }
            self.writes += 1 + t.deltas.len();
            if t.new {
                let insert = match &mut insert {
                    Some(i) => i,
                    None => insert.insert(NewRows::prepare(tx)?),
                };
                t.entry.cid = insert.counter(&t.key, &t.entry)?;
                for d in &t.entry.days {
                    insert.bucket(t.entry.cid, d.day, d.value)?;
                }
                if !first_days.is_empty() {
                    let days: Vec<(i64, i64)> =
                        t.entry.days.iter().map(|d| (d.day, d.value)).collect();
                    super::firstdays::new_counter(
                        tx,
                        first_days,
                        t.entry.cid,
                        &t.key,
                        t.entry.first_ms,
                        &days,
                    )?;
                }
                write_hours(tx, &mut hours, t)?;
                trend_recompute(tx, self.hot, &mut trend, t.entry.cid)?;
                continue;
            }
            if t.entry.pending_seq == 0 {
                if pending >= DIRECT_PENDING {
                    let direct = match &mut direct {
                        Some(d) => d,
                        None => direct.insert(DirectRows::prepare(tx)?),
                    };
                    direct.write(t)?;
                    // Nothing of it is pending: its buckets are whole.
                    super::firstdays::recompute(tx, first_days, t.entry.cid)?;
                    write_hours(tx, &mut hours, t)?;
                    trend_recompute(tx, self.hot, &mut trend, t.entry.cid)?;
                    t.direct = true;
                    continue;
                }
                pending += 1;
            }
            for &(day, hour, delta) in &t.deltas {
                for part in super::log::split(delta) {
                    blob.push(&log::Entry {
                        cid: t.entry.cid,
                        day,
                        delta: part,
                        first_ms: t.first_ms,
                        last_ms: t.last_ms,
                        category: t.category.as_deref(),
                        hour,
                    });
                }
            }
        }
        self.windows(tx)?;
        if blob.is_empty() {
            return Ok(0);
        }
        tx.prepare_cached("INSERT INTO counter_log (entries) VALUES (?1)")
            .and_then(|mut s| s.execute([blob.bytes()]))
            .map_err(sql("write::write"))?;
        let seq = tx.last_insert_rowid();
        for t in self
            .touched
            .iter_mut()
            .filter(|t| !t.new && !t.direct && !t.deltas.is_empty())
        {
            t.entry.pending_seq = seq;
            for d in &mut t.entry.days {
                if t.deltas.iter().any(|(day, _, _)| *day == d.day) {
                    d.pending = true;
                }
            }
        }
        Ok(seq)
    }

    /// The window totals each counter written has after the flush: from
    /// memory when it holds them, else from the kept rows, which leave the
    /// tables (`windows::take_rows`) while memory holds the counter.
    fn windows(&mut self, tx: &Connection) -> Result<(), StoreError> {
        let (state, held): (_, Vec<Option<Sums>>) = {
            let hot = self.hot.lock();
            let Some(state) = hot.windows.state else {
                return Ok(());
            };
            let held = self
                .touched
                .iter()
                .map(|t| {
                    (!t.deltas.is_empty())
                        .then(|| hot.windows.get(t.entry.cid))
                        .flatten()
                })
                .collect();
            (state, held)
        };
        for (t, held) in self.touched.iter_mut().zip(held) {
            if t.deltas.is_empty() {
                continue;
            }
            let mut sums = match held {
                Some(s) => s,
                // Every bucket of a new counter is in this flush.
                None if t.new => {
                    windows::mark_dirty(tx, t.entry.cid)?;
                    Sums::none()
                }
                None => windows::take_rows(tx, &state, t.entry.cid)?,
            };
            for &(day, _, delta) in &t.deltas {
                sums.add(&state, day, delta);
            }
            t.windows = Some(sums);
        }
        Ok(())
    }

    /// The counters written, no longer borrowing the writer's memory.
    pub fn finish(self) -> Written {
        Written(
            self.touched
                .into_iter()
                .filter(|t| !t.deltas.is_empty())
                .collect(),
        )
    }
}

/// The counters a flush wrote, to publish once it is committed.
pub(super) struct Written(Vec<Touch>);

impl Written {
    /// Log entries the flush appended.
    pub fn logged(&self) -> usize {
        self.0
            .iter()
            .filter(|t| !t.new && !t.direct)
            .map(|t| t.deltas.len())
            .sum()
    }

    /// The state after the flush of each counter of `wanted` it touched.
    pub fn counters(
        &self,
        wanted: &std::collections::HashSet<CounterKey>,
    ) -> HashMap<CounterKey, Counter> {
        if wanted.is_empty() {
            return HashMap::new();
        }
        // Sized once (at most every wanted counter was touched): growing the
        // map rehashed every key (a profile's hottest hashing).
        let mut out = HashMap::with_capacity(wanted.len());
        out.extend(
            self.0
                .iter()
                .filter(|t| wanted.contains(&t.key))
                .map(|t| (t.key.clone(), t.entry.counter(&t.key))),
        );
        out
    }

    /// Once committed: memory takes the counters' new state (the caller
    /// holds its lock across the commit and this).
    /// A counter that was not in memory and has nothing pending (new, or
    /// written directly) is left out once memory is full: its row is exact,
    /// and a bulk load would only churn memory.
    pub fn publish(self, hot: &mut Hot) {
        for t in self.0 {
            if let Some(sums) = &t.windows {
                hot.windows.put(
                    t.entry.cid,
                    &t.key,
                    t.entry.category.as_ref(),
                    sums,
                    t.entry.value,
                    t.entry.pending_seq != 0,
                );
            }
            if t.slot.is_none() && t.entry.pending_seq == 0 && hot.is_full() {
                continue;
            }
            hot.put(t.slot, t.key, t.entry);
        }
    }
}

/// Whether `kd` keeps its counter and each of its day buckets within i64.
fn check(t: &Touch, kd: &KeyDelta) -> Result<(), Overflowed> {
    let fits = |v: i128| i64::try_from(v).is_ok();
    if !fits(i128::from(t.entry.value) + kd.delta) {
        return Err(Overflowed(kd.key.clone()));
    }
    for &(day, d) in &kd.buckets {
        let now = t.entry.day(day).unwrap_or(0);
        if !fits(i128::from(now) + d) {
            return Err(Overflowed(kd.key.clone()));
        }
    }
    Ok(())
}

/// The hour buckets of a counter a flush writes itself (new, or written
/// directly): added to, as nothing of it is pending in the log.
fn write_hours<'c>(
    tx: &'c Connection,
    rows: &mut Option<super::hours::HourRows<'c>>,
    t: &Touch,
) -> Result<(), StoreError> {
    for &(day, hour, delta) in &t.deltas {
        if let Some(h) = hour {
            let rows = match rows {
                Some(r) => r,
                None => rows.insert(super::hours::HourRows::prepare(tx)?),
            };
            rows.add(t.entry.cid, day * 24 + i64::from(h), delta)?;
        }
    }
    Ok(())
}

/// Adds `kd` (checked) to the state of its counter and to what is logged:
/// per hour for the days from `hours_from` on, per day before.
fn apply(t: &mut Touch, kd: &KeyDelta, hours_from: i64) {
    let e = &mut t.entry;
    e.value = (i128::from(e.value) + kd.delta) as i64;
    if kd.category.is_some() {
        e.category.clone_from(&kd.category);
        t.category.clone_from(&kd.category);
    }
    e.first_ms = e.first_ms.min(kd.first_ms);
    e.recorded_ms = e.recorded_ms.max(kd.last_ms);
    t.first_ms = t.first_ms.min(kd.first_ms);
    t.last_ms = t.last_ms.max(kd.last_ms);
    for &(day, d) in &kd.buckets {
        if let Some(b) = e.days.iter_mut().find(|b| b.day == day) {
            b.value = (i128::from(b.value) + d) as i64;
        }
        if day < hours_from {
            add_delta(&mut t.deltas, day, None, d);
        }
    }
    for (hour, d) in kd.hours.iter() {
        let day = hour.div_euclid(24);
        if day >= hours_from {
            add_delta(&mut t.deltas, day, Some(hour.rem_euclid(24) as u8), d);
        }
    }
}

fn add_delta(deltas: &mut Vec<(i64, Option<u8>, i128)>, day: i64, hour: Option<u8>, d: i128) {
    match deltas.iter_mut().find(|(x, h, _)| *x == day && *h == hour) {
        Some((_, _, x)) => *x += d,
        None => deltas.push((day, hour, d)),
    }
}

/// A counter of `kd` as the flush finds it in the writer's memory
/// (`found`), or to be read by [`complete`].
fn touch(kd: &KeyDelta, slot: Option<usize>, found: Option<Entry>) -> Touch {
    let (entry, new) = match found {
        Some(e) => (e, false),
        // Read from its row by `complete`, or new.
        None => (
            // The touches come with the deltas applied (`apply`).
            Entry {
                cid: 0,
                value: 0,
                category: None,
                first_ms: i64::MAX,
                recorded_ms: i64::MIN,
                days: Vec::with_capacity(kd.buckets.len()),
                pending_seq: 0,
            },
            true,
        ),
    };
    Touch {
        key: kd.key.clone(),
        slot,
        entry,
        new,
        direct: false,
        windows: None,
        deltas: Vec::new(),
        category: None,
        first_ms: i64::MAX,
        last_ms: i64::MIN,
    }
}

/// Completes the state of `t` before this flush with what memory did not
/// hold: the row of a counter not in memory (exact: a counter with pending
/// deltas is always there; none means it is new) and the buckets of the
/// days of `kd` not read yet.
fn complete(tx: &Connection, t: &mut Touch, kd: &KeyDelta) -> Result<(), StoreError> {
    if t.slot.is_none() && t.new {
        let row = tx
            .prepare_cached(
                "SELECT cid, value, category, first_ts, recorded_ts FROM counters
                 WHERE entity = ?1 AND action = ?2 AND uuid = ?3",
            )
            .and_then(|mut s| {
                s.query_row(
                    params![&*kd.key.entity, &*kd.key.action, &*kd.key.uuid],
                    |r| {
                        Ok(Entry {
                            cid: r.get(0)?,
                            value: r.get(1)?,
                            category: r.get::<_, Option<String>>(2)?.map(Arc::from),
                            first_ms: r.get(3)?,
                            recorded_ms: r.get(4)?,
                            days: Vec::with_capacity(kd.buckets.len()),
                            pending_seq: 0,
                        })
                    },
                )
                .optional()
            })
            .map_err(sql("write::complete"))?;
        if let Some(e) = row {
            t.entry = e;
            t.new = false;
        }
    }
    complete_days(tx, t, kd)
}

/// Reads the buckets of the days of `kd` that `t` does not hold yet.
fn complete_days(tx: &Connection, t: &mut Touch, kd: &KeyDelta) -> Result<(), StoreError> {
    for &(day, _) in &kd.buckets {
        if t.entry.day(day).is_none() {
            let value = if t.new {
                0
            } else {
                bucket(tx, t.entry.cid, day)?
            };
            t.entry.days.push(Day {
                day,
                value,
                pending: false,
            });
        }
    }
    Ok(())
}

/// The value of a bucket in `buckets` (0 when there is none).
fn bucket(tx: &Connection, cid: i64, day: i64) -> Result<i64, StoreError> {
    tx.prepare_cached("SELECT value FROM buckets WHERE day = ?1 AND cid = ?2")
        .and_then(|mut s| s.query_row(params![day, cid], |r| r.get(0)).optional())
        .map(Option::unwrap_or_default)
        .map_err(sql("write::bucket"))
}

/// The statements that insert new counters, prepared once per flush.
struct NewRows<'c> {
    counter: rusqlite::CachedStatement<'c>,
    bucket: rusqlite::CachedStatement<'c>,
}

impl<'c> NewRows<'c> {
    fn prepare(tx: &'c Connection) -> Result<NewRows<'c>, StoreError> {
        Ok(NewRows {
            counter: tx
                .prepare_cached(
                    "INSERT INTO counters (entity, action, uuid, value, category, first_ts, recorded_ts)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) RETURNING cid",
                )
                .map_err(sql("write::prepare"))?,
            bucket: tx
                .prepare_cached("INSERT INTO buckets (day, cid, value) VALUES (?1, ?2, ?3)")
                .map_err(sql("write::prepare"))?,
        })
    }

    fn counter(&mut self, key: &CounterKey, e: &Entry) -> Result<i64, StoreError> {
        self.counter
            .query_row(
                params![
                    &*key.entity,
                    &*key.action,
                    &*key.uuid,
                    e.value,
                    e.category.as_deref(),
                    e.first_ms,
                    e.recorded_ms
                ],
                |r| r.get(0),
            )
            .map_err(sql("write::counter"))
    }

    fn bucket(&mut self, cid: i64, day: i64, value: i64) -> Result<(), StoreError> {
        self.bucket
            .execute(params![day, cid, value])
            .map_err(sql("write::bucket"))?;
        Ok(())
    }
}

/// The kept trending bounds (`trendkeys`) of a counter whose rows the
/// flush wrote whole (new, or direct); `trend` is the kept half-lives,
/// read from memory once per flush that needs them.
fn trend_recompute(
    tx: &Connection,
    hot: &hot::Shared,
    trend: &mut Option<Vec<i64>>,
    cid: i64,
) -> Result<(), StoreError> {
    let hls = trend.get_or_insert_with(|| hot.lock().trend.clone());
    super::trendkeys::recompute(tx, hls, cid)
}

/// The statements that write counters directly (not logged), prepared
/// once per flush.
struct DirectRows<'c> {
    counter: rusqlite::CachedStatement<'c>,
    bucket: rusqlite::CachedStatement<'c>,
}

impl<'c> DirectRows<'c> {
    fn prepare(tx: &'c Connection) -> Result<DirectRows<'c>, StoreError> {
        Ok(DirectRows {
            counter: tx
                .prepare_cached(
                    "UPDATE counters SET value = ?2, category = ?3, first_ts = ?4, recorded_ts = ?5
                     WHERE cid = ?1",
                )
                .map_err(sql("write::prepare"))?,
            bucket: tx
                .prepare_cached(
                    "INSERT INTO buckets (day, cid, value) VALUES (?1, ?2, ?3)
                     ON CONFLICT (day, cid) DO UPDATE SET value = excluded.value",
                )
                .map_err(sql("write::prepare"))?,
        })
    }

    /// Sets the row and the touched buckets of `t` to the state the flush
    /// leaves (exact: the counter has nothing pending, so its row and
    /// buckets were exact when read).
    fn write(&mut self, t: &Touch) -> Result<(), StoreError> {
        let e = &t.entry;
        self.counter
            .execute(params![
                e.cid,
                e.value,
                e.category.as_deref(),
                e.first_ms,
                e.recorded_ms
            ])
            .map_err(sql("write::write"))?;
        for &(day, _, _) in &t.deltas {
            let value = e
                .day(day)
                .ok_or_else(|| super::internal_msg("a direct write lacks the bucket it changed"))?;
            self.bucket
                .execute(params![day, e.cid, value])
                .map_err(sql("write::write"))?;
        }
        Ok(())
    }
}

/// Writes the average samples of `c` (directly: they are not on the hot
/// path of single increments).
pub(super) fn averages(
    tx: &Connection,
    c: &Coalesced,
    writes: &mut usize,
) -> Result<Result<(), Overflowed>, StoreError> {
    if c.averages.is_empty() {
        return Ok(Ok(()));
    }
    Ok(queries::write_averages(tx, &c.averages, writes)?.map_err(Overflowed))
}

/// Takes the lock of memory, runs `commit`, and on success publishes
/// `flush` under the same hold: a reader sees the flush's rows and its
/// counters' new state together or not at all.
pub(super) fn commit_and_publish(
    commit: impl FnOnce() -> Result<(), StoreError>,
    flush: Written,
    hot: &hot::Shared,
) -> Result<(), StoreError> {
    let mut hot = hot.lock();
    commit()?;
    flush.publish(&mut hot);
    hot.trim();
    Ok(())
}
