//! Backfill on the embedded store: day buckets set to a value, each counter
//! moved by the difference, all in one transaction of the writer.
//!
//! The writer connection is the one the flusher applies flushes on, so a
//! set runs between two flushes: an increment committed before it is in the
//! bucket it reads and replaces, one committed after it adds to the new
//! value, and none is lost or counted twice. The counters it sets have
//! their window totals recomputed from their buckets in the same
//! transaction (`windows::recompute`, called by the store), so windowed
//! top lists stay exact.

use std::collections::HashMap;

use rusqlite::{params, Connection, OptionalExtension};

use super::{hot, read_counter, sql, windows};
use crate::domain::{Counter, CounterKey, CounterSet, DaySet};
use crate::store::{DaysOutcome, StoreError};

/// Sets the day buckets of `sets` inside a transaction the caller holds
/// (a backfill's own, or an import's for the day records of its batch),
/// and pushes the counters it changed onto `cids`. On `Overflow` part of
/// the sets may be written: the caller rolls back.
pub(super) fn set_days_in(
    tx: &Connection,
    sets: &[DaySet],
    cids: &mut Vec<i64>,
) -> Result<DaysOutcome, StoreError> {
    // The sets of each counter, in the order the counters first appear.
    let mut groups: Vec<(&CounterKey, Vec<usize>)> = Vec::new();
    let mut at: HashMap<&CounterKey, usize> = HashMap::new();
    for (i, s) in sets.iter().enumerate() {
        match at.get(&s.key) {
            Some(&g) => groups[g].1.push(i),
            None => {
                at.insert(&s.key, groups.len());
                groups.push((&s.key, vec![i]));
            }
        }
    }
    let mut previous = vec![0i64; sets.len()];
    let mut counters = HashMap::with_capacity(groups.len());
    {
        let mut find = tx
            .prepare_cached(
                "SELECT cid, value FROM counters WHERE entity = ?1 AND action = ?2 AND uuid = ?3",
            )
            .map_err(sql("backfill::set_days_in"))?;
        let mut create = tx
            .prepare_cached(
                "INSERT INTO counters (entity, action, uuid, value, category, first_ts, recorded_ts)
                 VALUES (?1, ?2, ?3, 0, NULL, ?4, ?4) RETURNING cid",
            )
            .map_err(sql("backfill::set_days_in"))?;
        let mut old_bucket = tx
            .prepare_cached("SELECT value FROM buckets WHERE day = ?1 AND cid = ?2")
            .map_err(sql("backfill::set_days_in"))?;
        let mut put_bucket = tx
            .prepare_cached(
                "INSERT INTO buckets (day, cid, value) VALUES (?1, ?2, ?3)
                 ON CONFLICT (day, cid) DO UPDATE SET value = excluded.value",
            )
            .map_err(sql("backfill::set_days_in"))?;
        let mut update = tx
            .prepare_cached(
                "UPDATE counters SET
                     value = ?2,
                     category = coalesce(?3, category),
                     first_ts = min(first_ts, ?4),
                     recorded_ts = max(recorded_ts, ?5)
                 WHERE cid = ?1
                 RETURNING value, category, first_ts, recorded_ts",
            )
            .map_err(sql("backfill::set_days_in"))?;
        let mut rest = super::hours::HourRows::prepare(tx)?;
        for (key, idx) in &groups {
            let key: &CounterKey = key;
            let found: Option<(i64, i64)> = find
                .query_row(params![&*key.entity, &*key.action, &*key.uuid], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .optional()
                .map_err(sql("backfill::set_days_in"))?;
            let first = idx.iter().map(|&i| sets[i].touch_ms()).min().unwrap_or(0);
            let last = idx.iter().map(|&i| sets[i].touch_ms()).max().unwrap_or(0);
            let (cid, value) = match found {
                Some(f) => f,
                None => (
                    create
                        .query_row(
                            params![&*key.entity, &*key.action, &*key.uuid, first],
                            |r| r.get(0),
                        )
                        .map_err(sql("backfill::set_days_in"))?,
                    0,
                ),
            };
            // i128: the sum of a counter's differences may pass i64 on the
            // way and come back; only the result must fit.
            let mut total = i128::from(value);
            let mut changes = Vec::with_capacity(idx.len());
            for &i in idx {
                let s = &sets[i];
                let old: Option<i64> = old_bucket
                    .query_row(params![s.day, cid], |r| r.get(0))
                    .optional()
                    .map_err(sql("backfill::set_days_in"))?;
                previous[i] = old.unwrap_or(0);
                total += i128::from(s.value) - i128::from(previous[i]);
                if old != Some(s.value) {
                    changes.push(i);
                }
            }
            let Ok(total) = i64::try_from(total) else {
                return Ok(DaysOutcome::Overflow {
                    index: *idx.last().unwrap_or(&0),
                });
            };
            for i in changes {
                let s = &sets[i];
                put_bucket
                    .execute(params![s.day, cid, s.value])
                    .map_err(sql("backfill::set_days_in"))?;
                // A set day has no hour to put its difference in: it is
                // the day's rest, and hour answers over it are not exact.
                rest.rest(cid, s.day, i128::from(s.value) - i128::from(previous[i]))?;
            }
            cids.push(cid);
            let category = idx.iter().rev().find_map(|&i| sets[i].category.clone());
            let counter: Counter = update
                .query_row(params![cid, total, category.as_deref(), first, last], |r| {
                    read_counter(r, key.clone())
                })
                .map_err(sql("backfill::set_days_in"))?;
            counters.insert(key.clone(), counter);
        }
    }
    Ok(DaysOutcome::Applied { previous, counters })
}

/// Sets the value of `set`'s counter inside a transaction the caller holds
/// (folded first, so the row is exact), creating the row when there is
/// none; its buckets are not touched. Answers the row's id and the
/// counter after the set.
pub(super) fn set_value_in(
    tx: &Connection,
    set: &CounterSet,
) -> Result<(i64, Counter), StoreError> {
    let key = &set.key;
    let mut upsert = tx
        .prepare_cached(
            "INSERT INTO counters (entity, action, uuid, value, category, first_ts, recorded_ts)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6)
             ON CONFLICT (entity, action, uuid) DO UPDATE SET
                 value = excluded.value,
                 category = coalesce(excluded.category, category)
             RETURNING cid, value, category, first_ts, recorded_ts",
        )
        .map_err(sql("backfill::set_value_in"))?;
    upsert
        .query_row(
            params![
                &*key.entity,
                &*key.action,
                &*key.uuid,
                set.value,
                set.category.as_deref(),
                set.now_ms
            ],
            |r| Ok((r.get("cid")?, read_counter(r, key.clone())?)),
        )
        .map_err(sql("backfill::set_value_in"))
}

/// Commits `tx`, in which a backfill or an import set the rows and buckets
/// of the counters `cids` (named `keys`) directly: their window totals are
/// recomputed from their buckets first, and memory forgets them with the
/// commit, under its lock (their rows, buckets and window rows are exact).
pub(super) fn commit_set_directly<'k>(
    tx: rusqlite::Transaction<'_>,
    hot: &hot::Shared,
    cids: &[i64],
    keys: impl Iterator<Item = &'k CounterKey>,
) -> Result<(), StoreError> {
    let state = hot.lock().windows.state;
    let mut cids = cids.to_vec();
    cids.sort_unstable();
    cids.dedup();
    if let Some(state) = state {
        for &cid in &cids {
            windows::recompute(&tx, &state, cid)?;
        }
    }
    let mut held = hot.lock();
    tx.commit().map_err(sql("backfill::commit_set_directly"))?;
    for k in keys {
        held.remove(k);
    }
    for &cid in &cids {
        held.windows.remove(cid);
    }
    Ok(())
}
