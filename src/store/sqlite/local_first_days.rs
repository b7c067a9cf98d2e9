//! `first_<N>_days` lists in a zone's days (`tz=`): each counter's total
//! over the UTC hours of its first N local days, from hour buckets
//! (`crate::store::LocalFirstDaysQuery`).
//!
//! Why apart from `publication::top` (UTC days, day buckets, one grouped
//! statement): a local day's hours depend on the zone's rules at that
//! date (23 or 25 around a DST change), which SQL cannot look up. So one
//! statement walks the pair's counters in uuid order with their hour rows
//! near their own publication (a range seek into `hours_by_counter` per
//! counter, bounded by the hourly retention), and the exact hours of each
//! counter's days are cut and summed here, keeping the best `size`. Rows
//! read are the pair's hour buckets of the retention at most.

use rusqlite::{params, Connection};

use super::hours::{self, Of};
use super::sql;
use crate::domain::HourRange;
use crate::store::{keep_best, FirstDaysEntry, FirstDaysList, LocalFirstDaysQuery, StoreError};

/// Rows per counter window the statement reads on each side of the exact
/// one: offsets within -12..+14 hours and a few DST changes.
const SLACK_HOURS: i64 = 16;

/// The list, from rows that hold every acknowledged increment (the caller
/// folds first).
pub(super) fn top(conn: &Connection, q: &LocalFirstDaysQuery) -> Result<FirstDaysList, StoreError> {
    const PUB: &str = "coalesce(t.published_ms, c.first_ts)";
    let mut s = conn
        .prepare_cached(&format!(
            "SELECT c.uuid, c.category, {PUB}, t.published_ms IS NOT NULL, h.hour, h.value
             FROM counters c LEFT JOIN targets t ON t.entity = c.entity AND t.uuid = c.uuid
             JOIN hours h INDEXED BY hours_by_counter ON h.cid = c.cid
               AND h.hour BETWEEN max({PUB} / 3600000 - ?4, ?5) AND {PUB} / 3600000 + ?6
             WHERE c.entity = ?1 AND c.action = ?2 AND (?3 IS NULL OR c.category = ?3)
             ORDER BY c.uuid, h.hour"
        ))
        .map_err(sql("local_first_days::top"))?;
    let mut rows = s
        .query(params![
            q.entity,
            q.action,
            q.category,
            SLACK_HOURS,
            q.first_hour,
            i64::from(q.days) * 25 + SLACK_HOURS,
        ])
        .map_err(sql("local_first_days::top"))?;
    let mut best: Vec<FirstDaysEntry> = Vec::new();
    // The counter being summed: its row, its hours, whether one is in them.
    let mut current: Option<(FirstDaysEntry, HourRange, bool)> = None;
    let mut low: Option<i64> = None;
    let mut high: Option<i64> = None;
    while let Some(r) = rows.next().map_err(sql("local_first_days::top"))? {
        let read = |r: &rusqlite::Row<'_>| -> rusqlite::Result<(String, i64, i64)> {
            Ok((r.get(0)?, r.get(4)?, r.get(5)?))
        };
        let (uuid, hour, value) = read(r).map_err(sql("local_first_days::top"))?;
        if current.as_ref().map_or(true, |(e, _, _)| e.uuid != uuid) {
            if let Some((e, _, true)) = current.take() {
                best.push(e);
                if best.len() > 2 * q.size {
                    keep_best(&mut best, q.size);
                }
            }
            let published_ms: i64 = r.get(2).map_err(sql("local_first_days::top"))?;
            let range = q.zone.first_days_hours(published_ms, q.days);
            current = Some((
                FirstDaysEntry {
                    uuid,
                    value: 0,
                    category: r.get(1).map_err(sql("local_first_days::top"))?,
                    published_ms,
                    published_set: r.get(3).map_err(sql("local_first_days::top"))?,
                },
                range,
                false,
            ));
        }
        if let Some((e, range, seen)) = current.as_mut() {
            // A counter whose first local day began before the retention
            // is not listed: part of its hours are gone.
            if range.from_hour >= q.first_hour && (range.from_hour..=range.to_hour).contains(&hour)
            {
                e.value += i128::from(value);
                *seen = true;
                low = Some(low.map_or(range.from_hour, |l| l.min(range.from_hour)));
                high = Some(high.map_or(range.to_hour, |h| h.max(range.to_hour)));
            }
        }
    }
    if let Some((e, _, true)) = current.take() {
        best.push(e);
    }
    keep_best(&mut best, q.size);
    // Exact unless a day of the hours summed moved without an hour.
    let exact = match (low, high) {
        (Some(from_hour), Some(to_hour)) => hours::exact(
            conn,
            HourRange { from_hour, to_hour },
            Of::Pair(&q.entity, &q.action),
        )?,
        _ => true,
    };
    Ok(FirstDaysList {
        entries: best,
        exact,
    })
}
