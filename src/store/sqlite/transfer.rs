//! Export and import on the embedded store: pages of counters (and of
//! averages) in key order with their day buckets, each page read from one
//! snapshot; and an import batch set in one transaction of the writer.
//!
//! The import runs on the writer connection, between two flushes, as a
//! backfill does (`backfill.rs`, whose sets it reuses for day records): an
//! increment committed before it is in the buckets it reads (replaced if
//! its day is named, counted in the total if not), one committed after it
//! adds to what it set. The counters it sets have their window totals
//! recomputed from their buckets in the same transaction (by the store), so
//! the kept window totals stay exact.

use rusqlite::{params, Connection, OptionalExtension};

use super::backfill::set_days_in;
use super::sql;
use crate::domain::{Counter, CounterKey};
use crate::store::{
    AverageBucket, AverageHistory, AverageImport, Bucket, CounterHistory, CounterImport,
    DaysOutcome, HourBucket, ImportBatch, ImportEntry, ImportOutcome, StoreError,
};

/// A key read back from a row (columns `entity`, `action`, `uuid`).
fn key_of(r: &rusqlite::Row<'_>) -> rusqlite::Result<CounterKey> {
    Ok(CounterKey {
        entity: r.get::<_, String>("entity")?.into(),
        action: r.get::<_, String>("action")?.into(),
        uuid: r.get::<_, String>("uuid")?.into(),
    })
}

/// Up to `limit` counters after `after` in key order, with their buckets
/// from `from_day` on and their hours of the days from `hours_from_day` on,
/// all read in one snapshot (a read transaction), so a day and its hours
/// agree as they did in the store.
pub(super) fn counter_page(
    conn: &Connection,
    after: Option<&CounterKey>,
    limit: usize,
    from_day: i64,
    hours_from_day: i64,
) -> Result<Vec<CounterHistory>, StoreError> {
    let tx = conn
        .unchecked_transaction()
        .map_err(sql("transfer::counter_page"))?;
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let cols =
        "SELECT cid, entity, action, uuid, value, category, first_ts, recorded_ts FROM counters";
    let read = |r: &rusqlite::Row<'_>| -> rusqlite::Result<(i64, Counter)> {
        Ok((
            r.get("cid")?,
            Counter {
                key: key_of(r)?,
                value: r.get("value")?,
                category: r.get("category")?,
                first_ms: r.get("first_ts")?,
                recorded_ms: r.get("recorded_ts")?,
            },
        ))
    };
    let rows: Vec<(i64, Counter)> = match after {
        // Row values walk the (entity, action, uuid) unique index from the key on.
        Some(k) => tx
            .prepare_cached(&format!(
                "{cols} WHERE (entity, action, uuid) > (?1, ?2, ?3)
                 ORDER BY entity, action, uuid LIMIT ?4"
            ))
            .and_then(|mut s| {
                s.query_map(params![&*k.entity, &*k.action, &*k.uuid, limit], read)?
                    .collect()
            }),
        None => tx
            .prepare_cached(&format!("{cols} ORDER BY entity, action, uuid LIMIT ?1"))
            .and_then(|mut s| s.query_map(params![limit], read)?.collect()),
    }
    .map_err(sql("transfer::counter_page"))?;
    let mut days = tx
        .prepare_cached("SELECT day, value FROM buckets WHERE cid = ?1 AND day >= ?2 ORDER BY day")
        .map_err(sql("transfer::counter_page"))?;
    let mut hours = tx
        .prepare_cached(
            "SELECT hour, value FROM hours INDEXED BY hours_by_counter
             WHERE cid = ?1 AND hour >= ?2 ORDER BY hour",
        )
        .map_err(sql("transfer::counter_page"))?;
    let first_hour = hours_from_day.max(from_day).saturating_mul(24);
    let mut out = Vec::with_capacity(rows.len());
    for (cid, counter) in rows {
        let hour_buckets = hours
            .query_map(params![cid, first_hour], |r| {
                Ok(HourBucket {
                    hour: r.get(0)?,
                    value: r.get(1)?,
                })
            })
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
            .map_err(sql("transfer::counter_page"))?;
        let buckets = days
            .query_map(params![cid, from_day], |r| {
                Ok(Bucket {
                    day: r.get(0)?,
                    value: r.get(1)?,
                })
            })
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
            .map_err(sql("transfer::counter_page"))?;
        out.push(CounterHistory {
            counter,
            days: buckets,
            hours: hour_buckets,
        });
    }
    Ok(out)
}

/// [`counter_page`] for average counters.
pub(super) fn average_page(
    conn: &Connection,
    after: Option<&CounterKey>,
    limit: usize,
    from_day: i64,
) -> Result<Vec<AverageHistory>, StoreError> {
    let tx = conn
        .unchecked_transaction()
        .map_err(sql("transfer::average_page"))?;
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let cols = "SELECT aid, entity, action, uuid, sum, quantity, category, first_ts, recorded_ts FROM averages";
    let read = |r: &rusqlite::Row<'_>| -> rusqlite::Result<(i64, AverageHistory)> {
        Ok((
            r.get("aid")?,
            AverageHistory {
                key: key_of(r)?,
                sum: r.get("sum")?,
                quantity: r.get("quantity")?,
                category: r.get("category")?,
                first_ms: r.get("first_ts")?,
                recorded_ms: r.get("recorded_ts")?,
                days: Vec::new(),
            },
        ))
    };
    let rows: Vec<(i64, AverageHistory)> = match after {
        Some(k) => tx
            .prepare_cached(&format!(
                "{cols} WHERE (entity, action, uuid) > (?1, ?2, ?3)
                 ORDER BY entity, action, uuid LIMIT ?4"
            ))
            .and_then(|mut s| {
                s.query_map(params![&*k.entity, &*k.action, &*k.uuid, limit], read)?
                    .collect()
            }),
        None => tx
            .prepare_cached(&format!("{cols} ORDER BY entity, action, uuid LIMIT ?1"))
            .and_then(|mut s| s.query_map(params![limit], read)?.collect()),
    }
    .map_err(sql("transfer::average_page"))?;
    let mut days = tx
        .prepare_cached(
            "SELECT day, sum, quantity FROM average_buckets
             WHERE aid = ?1 AND day >= ?2 ORDER BY day",
        )
        .map_err(sql("transfer::average_page"))?;
    let mut out = Vec::with_capacity(rows.len());
    for (aid, mut average) in rows {
        average.days = days
            .query_map(params![aid, from_day], |r| {
                Ok(AverageBucket {
                    day: r.get(0)?,
                    sum: r.get(1)?,
                    quantity: r.get(2)?,
                })
            })
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
            .map_err(sql("transfer::average_page"))?;
        out.push(average);
    }
    Ok(out)
}

/// Sets a whole batch inside a transaction the caller holds, pushing the
/// counters it set onto `cids`; on `Overflow` (an entry would leave the
/// signed 64-bit range) part of it may be written: the caller rolls back.
/// The caller commits without syncing and fsyncs before answering.
pub(super) fn import_in(
    tx: &Connection,
    batch: &ImportBatch,
    cids: &mut Vec<i64>,
) -> Result<ImportOutcome, StoreError> {
    for (i, c) in batch.counters.iter().enumerate() {
        if !import_counter(tx, c, batch.oldest_day, cids)? {
            return Ok(ImportOutcome::Overflow(ImportEntry::Counter(i)));
        }
    }
    for (i, a) in batch.averages.iter().enumerate() {
        if !import_average(tx, a, batch.oldest_day)? {
            return Ok(ImportOutcome::Overflow(ImportEntry::Average(i)));
        }
    }
    if !batch.days.is_empty() {
        match set_days_in(tx, &batch.days, cids)? {
            DaysOutcome::Applied { .. } => {}
            DaysOutcome::Overflow { index } => {
                return Ok(ImportOutcome::Overflow(ImportEntry::Day(index)))
            }
            DaysOutcome::Incomplete { reason, .. } => return Err(StoreError::Internal(reason)),
        }
    }
    super::marks::import(tx, &batch.marks)?;
    Ok(ImportOutcome::Applied)
}

/// One counter of an import; `false` when its total would leave i64.
fn import_counter(
    tx: &Connection,
    c: &CounterImport,
    oldest_day: i64,
    cids: &mut Vec<i64>,
) -> Result<bool, StoreError> {
    let k = &c.key;
    let found: Option<i64> = tx
        .prepare_cached("SELECT cid FROM counters WHERE entity = ?1 AND action = ?2 AND uuid = ?3")
        .and_then(|mut s| {
            s.query_row(params![&*k.entity, &*k.action, &*k.uuid], |r| r.get(0))
                .optional()
        })
        .map_err(sql("transfer::import_counter"))?;
    let cid = match found {
        Some(cid) => cid,
        None => tx
            .prepare_cached(
                "INSERT INTO counters (entity, action, uuid, value, category, first_ts, recorded_ts)
                 VALUES (?1, ?2, ?3, 0, NULL, ?4, ?5) RETURNING cid",
            )
            .and_then(|mut s| {
                s.query_row(
                    params![&*k.entity, &*k.action, &*k.uuid, c.first_ms, c.recorded_ms],
                    |r| r.get(0),
                )
            })
            .map_err(sql("transfer::import_counter"))?,
    };
    {
        let mut old = tx
            .prepare_cached("SELECT value FROM buckets WHERE day = ?1 AND cid = ?2")
            .map_err(sql("transfer::import_counter"))?;
        let mut put = tx
            .prepare_cached(
                "INSERT INTO buckets (day, cid, value) VALUES (?1, ?2, ?3)
                 ON CONFLICT (day, cid) DO UPDATE SET value = excluded.value",
            )
            .map_err(sql("transfer::import_counter"))?;
        // A day whose hours the record gives (format 5) gets them, and the
        // rest of what it holds as its rest, so day = its hours + its rest
        // (`hours.rs`). Otherwise (an older file, a day before the hourly
        // retention or before the store's complete hours) what the import
        // moves the day by is its rest: hour answers over it say they are
        // not exact.
        let hours_from = super::hours::from_day(tx)?;
        let mut rest = super::hours::HourRows::prepare(tx)?;
        for b in &c.days {
            let was: Option<i64> = old
                .query_row(params![b.day, cid], |r| r.get(0))
                .optional()
                .map_err(sql("transfer::import_counter"))?;
            if let Some(h) = c
                .hours
                .as_ref()
                .filter(|h| h.covers(b.day) && b.day >= hours_from)
            {
                if was != Some(b.value) {
                    put.execute(params![b.day, cid, b.value])
                        .map_err(sql("transfer::import_counter"))?;
                }
                super::hours::set_day(tx, cid, b.day, b.value, h.of_day(b.day))?;
                continue;
            }
            if was == Some(b.value) {
                continue;
            }
            put.execute(params![b.day, cid, b.value])
                .map_err(sql("transfer::import_counter"))?;
            rest.rest(
                cid,
                b.day,
                i128::from(b.value) - i128::from(was.unwrap_or(0)),
            )?;
        }
    }
    let mut total = c.before;
    {
        let mut s = tx
            .prepare_cached("SELECT value FROM buckets WHERE cid = ?1 AND day >= ?2")
            .map_err(sql("transfer::import_counter"))?;
        let mut rows = s
            .query(params![cid, oldest_day])
            .map_err(sql("transfer::import_counter"))?;
        while let Some(r) = rows.next().map_err(sql("transfer::import_counter"))? {
            total += i128::from(
                r.get::<_, i64>(0)
                    .map_err(sql("transfer::import_counter"))?,
            );
        }
    }
    let Ok(total) = i64::try_from(total) else {
        return Ok(false);
    };
    tx.prepare_cached(
        "UPDATE counters SET value = ?2, category = coalesce(?3, category),
             first_ts = min(first_ts, ?4), recorded_ts = max(recorded_ts, ?5)
         WHERE cid = ?1",
    )
    .and_then(|mut s| {
        s.execute(params![
            cid,
            total,
            c.category.as_deref(),
            c.first_ms,
            c.recorded_ms
        ])
    })
    .map_err(sql("transfer::import_counter"))?;
    cids.push(cid);
    Ok(true)
}

/// One average of an import; `false` when its sum or quantity would leave i64.
fn import_average(tx: &Connection, a: &AverageImport, oldest_day: i64) -> Result<bool, StoreError> {
    let k = &a.key;
    let found: Option<i64> = tx
        .prepare_cached("SELECT aid FROM averages WHERE entity = ?1 AND action = ?2 AND uuid = ?3")
        .and_then(|mut s| {
            s.query_row(params![&*k.entity, &*k.action, &*k.uuid], |r| r.get(0))
                .optional()
        })
        .map_err(sql("transfer::import_average"))?;
    let aid = match found {
        Some(aid) => aid,
        None => tx
            .prepare_cached(
                "INSERT INTO averages (entity, action, uuid, sum, quantity, category, first_ts, recorded_ts)
                 VALUES (?1, ?2, ?3, 0, 0, NULL, ?4, ?5) RETURNING aid",
            )
            .and_then(|mut s| {
                s.query_row(
                    params![&*k.entity, &*k.action, &*k.uuid, a.first_ms, a.recorded_ms],
                    |r| r.get(0),
                )
            })
            .map_err(sql("transfer::import_average"))?,
    };
    {
        let mut put = tx
            .prepare_cached(
                "INSERT INTO average_buckets (day, aid, sum, quantity) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (day, aid) DO UPDATE SET sum = excluded.sum, quantity = excluded.quantity",
            )
            .map_err(sql("transfer::import_average"))?;
        for b in &a.days {
            put.execute(params![b.day, aid, b.sum, b.quantity])
                .map_err(sql("transfer::import_average"))?;
        }
    }
    let (mut sum, mut quantity) = (a.before_sum, a.before_quantity);
    {
        let mut s = tx
            .prepare_cached(
                "SELECT sum, quantity FROM average_buckets WHERE aid = ?1 AND day >= ?2",
            )
            .map_err(sql("transfer::import_average"))?;
        let mut rows = s
            .query(params![aid, oldest_day])
            .map_err(sql("transfer::import_average"))?;
        while let Some(r) = rows.next().map_err(sql("transfer::import_average"))? {
            sum += i128::from(
                r.get::<_, i64>(0)
                    .map_err(sql("transfer::import_average"))?,
            );
            quantity += i128::from(
                r.get::<_, i64>(1)
                    .map_err(sql("transfer::import_average"))?,
            );
        }
    }
    let (Ok(sum), Ok(quantity)) = (i64::try_from(sum), i64::try_from(quantity)) else {
        return Ok(false);
    };
    tx.prepare_cached(
        "UPDATE averages SET sum = ?2, quantity = ?3, category = coalesce(?4, category),
             first_ts = min(first_ts, ?5), recorded_ts = max(recorded_ts, ?6)
         WHERE aid = ?1",
    )
    .and_then(|mut s| {
        s.execute(params![
            aid,
            sum,
            quantity,
            a.category.as_deref(),
            a.first_ms,
            a.recorded_ms
        ])
    })
    .map_err(sql("transfer::import_average"))?;
    Ok(true)
}
