//! The read queries of the embedded store (histograms, top lists, reports,
//! averages) and the write of average samples, as SQL over the schema of
//! `schema.rs`. Each function runs on a connection it is handed, so the
//! store decides which (a reader, or the writer inside its transaction).

use rusqlite::{params, Connection, OptionalExtension};

use super::hot::Hot;
use super::sql;
use super::windows::{join, split_sum};
use crate::domain::rank::{MeanOfAverages, Rank};
use crate::domain::AverageDelta;
use crate::domain::{Counter, CounterKey, Window};
use crate::store::ranked::RankedTop;
use crate::store::{
    Average, AverageEntry, Bucket, StaleQuery, StoreError, TopAverages, TopAveragesQuery, TopEntry,
    TopList, TopQuery, UnusedPair,
};

/// Schema added in version 2: the indexes behind top lists and reports, and
/// the average counters with their day buckets (laid out like `counters` and
/// `buckets`).
pub(super) const SCHEMA_V2: &str = "
-- All-time top lists read this index in order and stop after `size` rows.
CREATE INDEX IF NOT EXISTS counters_top ON counters (entity, action, value DESC, uuid);
-- Stale reports walk this index from the oldest touch.
CREATE INDEX IF NOT EXISTS counters_by_recorded ON counters (recorded_ts);
CREATE TABLE IF NOT EXISTS averages (
    aid         INTEGER PRIMARY KEY,
    entity      TEXT    NOT NULL,
    action      TEXT    NOT NULL,
    uuid        TEXT    NOT NULL,
    sum         INTEGER NOT NULL,
    quantity    INTEGER NOT NULL,
    category    TEXT,
    first_ts    INTEGER NOT NULL,
    recorded_ts INTEGER NOT NULL,
    UNIQUE (entity, action, uuid)
);
CREATE TABLE IF NOT EXISTS average_buckets (
    day      INTEGER NOT NULL,
    aid      INTEGER NOT NULL,
    sum      INTEGER NOT NULL,
    quantity INTEGER NOT NULL,
    PRIMARY KEY (day, aid)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS average_buckets_by_average ON average_buckets (aid, day);
";

/// Guards `sum + excluded.sum` and `quantity + excluded.quantity` against
/// leaving i64, written so the guard itself cannot overflow.
fn no_overflow(col: &str) -> String {
    format!(
        "((excluded.{col} >= 0 AND {col} <= 9223372036854775807 - excluded.{col})
          OR (excluded.{col} < 0 AND {col} >= (-9223372036854775807 - 1) - excluded.{col}))"
    )
}

/// Upserts the coalesced average samples of a flush. `Err(key)` names the
/// first average whose sum or quantity would leave i64; the caller rolls back.
pub(super) fn write_averages(
    tx: &Connection,
    averages: &[AverageDelta],
    writes: &mut usize,
) -> Result<Result<(), CounterKey>, StoreError> {
    let mut upsert = tx
        .prepare_cached(&format!(
            "INSERT INTO averages (entity, action, uuid, sum, quantity, category, first_ts, recorded_ts)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
             ON CONFLICT (entity, action, uuid) DO UPDATE SET
                 sum = sum + excluded.sum,
                 quantity = quantity + excluded.quantity,
                 category = coalesce(excluded.category, category),
                 first_ts = min(first_ts, excluded.first_ts),
                 recorded_ts = max(recorded_ts, excluded.recorded_ts)
             WHERE {} AND {}
             RETURNING aid",
            no_overflow("sum"),
            no_overflow("quantity")
        ))
        .map_err(sql("queries::write_averages"))?;
    let mut bucket = tx
        .prepare_cached(&format!(
            "INSERT INTO average_buckets (day, aid, sum, quantity) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (day, aid) DO UPDATE SET
                 sum = sum + excluded.sum, quantity = quantity + excluded.quantity
             WHERE {} AND {}",
            no_overflow("sum"),
            no_overflow("quantity")
        ))
        .map_err(sql("queries::write_averages"))?;
    for a in averages {
        let (Ok(sum), Ok(quantity)) = (i64::try_from(a.sum), i64::try_from(a.quantity)) else {
            return Ok(Err(a.key.clone()));
        };
        *writes += 1;
        let aid: Option<i64> = upsert
            .query_row(
                params![
                    &*a.key.entity,
                    &*a.key.action,
                    &*a.key.uuid,
                    sum,
                    quantity,
                    a.category.as_deref(),
                    a.first_ms,
                    a.last_ms
                ],
                |r| r.get(0),
            )
            .optional()
            .map_err(sql("queries::write_averages"))?;
        let Some(aid) = aid else {
            return Ok(Err(a.key.clone()));
        };
        for &(day, s, q) in &a.buckets {
            let (Ok(s), Ok(q)) = (i64::try_from(s), i64::try_from(q)) else {
                return Ok(Err(a.key.clone()));
            };
            *writes += 1;
            if bucket
                .execute(params![day, aid, s, q])
                .map_err(sql("queries::write_averages"))?
                == 0
            {
                return Ok(Err(a.key.clone()));
            }
        }
    }
    Ok(Ok(()))
}

pub(super) fn histogram(
    conn: &Connection,
    key: &CounterKey,
    window: Window,
) -> Result<Option<Vec<Bucket>>, StoreError> {
    let cid: Option<i64> = conn
        .prepare_cached("SELECT cid FROM counters WHERE entity = ?1 AND action = ?2 AND uuid = ?3")
        .and_then(|mut s| {
            s.query_row(params![&*key.entity, &*key.action, &*key.uuid], |r| {
                r.get(0)
            })
            .optional()
        })
        .map_err(sql("queries::histogram"))?;
    let Some(cid) = cid else { return Ok(None) };
    let mut s = conn
        .prepare_cached(
            "SELECT day, value FROM buckets INDEXED BY buckets_by_counter
             WHERE cid = ?1 AND day BETWEEN ?2 AND ?3 ORDER BY day",
        )
        .map_err(sql("queries::histogram"))?;
    let rows = s
        .query_map(params![cid, window.from_day, window.to_day], |r| {
            Ok(Bucket {
                day: r.get(0)?,
                value: r.get(1)?,
            })
        })
        .map_err(sql("queries::histogram"))?;
    rows.collect::<Result<Vec<_>, _>>()
        .map(Some)
        .map_err(sql("queries::histogram"))
}

fn limit(size: usize) -> i64 {
    i64::try_from(size).unwrap_or(i64::MAX)
}

/// All time: an ordered walk of `counters_top`, stopping after `size` rows
/// (a category filter skips rows of other categories on the way).
/// A window: the sum of the window's buckets per counter of the pair.
pub(super) fn top(conn: &Connection, q: &TopQuery) -> Result<TopList, StoreError> {
    let entries = match q.window {
        None => {
            let read = |r: &rusqlite::Row<'_>| {
                Ok(TopEntry {
                    uuid: r.get(0)?,
                    value: r.get::<_, i64>(1)?.into(),
                    category: r.get(2)?,
                })
            };
            let mut s = conn
                .prepare_cached(
                    "SELECT uuid, value, category FROM counters INDEXED BY counters_top
                     WHERE entity = ?1 AND action = ?2 AND (?3 IS NULL OR category = ?3)
                     ORDER BY value DESC, uuid LIMIT ?4",
                )
                .map_err(sql("queries::top"))?;
            let rows = s
                .query_map(params![q.entity, q.action, q.category, limit(q.size)], read)
                .map_err(sql("queries::top"))?;
            rows.collect::<Result<Vec<_>, _>>()
                .map_err(sql("queries::top"))?
        }
        Some(w) => top_of_sums(
            conn,
            &SumOver {
                table: "buckets",
                column: "day",
                from: w.from_day,
                to: w.to_day,
                entity: &q.entity,
                action: &q.action,
                category: q.category.as_deref(),
                size: q.size,
            },
        )
        .map_err(sql("queries::top"))?,
    };
    Ok(TopList {
        entries,
        exact: true,
    })
}

/// The all-time list as of now without folding first: the `counters_top`
/// walk, skipping the rows that miss deltas of the change log, merged with
/// those counters' exact values, which memory holds (every one of them
/// while the window totals are kept: `windows::memory`). `None` when they
/// are not kept (the caller folds, then walks). The caller holds memory's
/// lock: no flush or fold commits while the rows are read.
pub(super) fn top_all_time(
    conn: &Connection,
    hot: &Hot,
    q: &TopQuery,
) -> Result<Option<Vec<TopEntry>>, StoreError> {
    if hot.windows.state.is_none() {
        return Ok(None);
    }
    let mut s = conn
        .prepare_cached(
            "SELECT cid, uuid, value, category FROM counters INDEXED BY counters_top
             WHERE entity = ?1 AND action = ?2 AND (?3 IS NULL OR category = ?3)
             ORDER BY value DESC, uuid",
        )
        .map_err(sql("queries::top_all_time"))?;
    let mut rows = s
        .query(params![q.entity, q.action, q.category])
        .map_err(sql("queries::top_all_time"))?;
    let mut entries = Vec::with_capacity(q.size);
    while entries.len() < q.size {
        let Some(r) = rows.next().map_err(sql("queries::top_all_time"))? else {
            break;
        };
        if hot.is_pending(r.get(0).map_err(sql("queries::top_all_time"))?) {
            continue;
        }
        entries.push(TopEntry {
            uuid: r.get(1).map_err(sql("queries::top_all_time"))?,
            value: r
                .get::<_, i64>(2)
                .map_err(sql("queries::top_all_time"))?
                .into(),
            category: r.get(3).map_err(sql("queries::top_all_time"))?,
        });
    }
    let held = hot
        .windows
        .top_pending(&q.entity, &q.action, q.category.as_deref(), q.size);
    if !held.is_empty() {
        entries.extend(held);
        entries.sort_by(|a, b| b.value.cmp(&a.value).then_with(|| a.uuid.cmp(&b.uuid)));
        entries.truncate(q.size);
    }
    Ok(Some(entries))
}

/// SQLite's `sum()` left i64 ("integer overflow"): the one failure that
/// summing again in 32-bit halves answers.
fn overflowed(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(_, Some(m)) if m == "integer overflow")
}

/// What a top list of sums reads: one pair's rows of a bucket table
/// (`buckets` by `day`, or `hours` by `hour`) over a range of its column.
pub(super) struct SumOver<'q> {
    pub table: &'static str,
    pub column: &'static str,
    pub from: i64,
    pub to: i64,
    pub entity: &'q str,
    pub action: &'q str,
    pub category: Option<&'q str>,
    pub size: usize,
}

/// The counters with the highest sums of their buckets in the range.
/// Buckets first: one sequential read of the range's rows (clustered by
/// day or hour), then one lookup per counter; driving from the counters of
/// the pair instead costs a random seek into the buckets per counter, ten
/// times slower at 1M. Summed again in 32-bit halves, carried into the
/// kept totals' pair (`windows::join`), when a plain `sum()` leaves i64,
/// so the list stays exact whatever the values.
pub(super) fn top_of_sums(
    conn: &Connection,
    over: &SumOver<'_>,
) -> rusqlite::Result<Vec<TopEntry>> {
    match summed_top(conn, over, false) {
        Err(e) if overflowed(&e) => summed_top(conn, over, true),
        r => r,
    }
}

fn summed_top(
    conn: &Connection,
    over: &SumOver<'_>,
    wide: bool,
) -> rusqlite::Result<Vec<TopEntry>> {
    const FILTER: &str = "JOIN counters c ON c.cid = s.cid
         WHERE c.entity = ?1 AND c.action = ?2 AND (?5 IS NULL OR c.category = ?5)";
    let (table, column) = (over.table, over.column);
    let sql = if wide {
        format!(
            "SELECT c.uuid, s.hi, s.lo, c.category
             FROM (SELECT cid, {} FROM (
                       SELECT cid, sum(value >> 32) AS h, sum(value & 4294967295) AS l
                       FROM {table} WHERE {column} BETWEEN ?3 AND ?4 GROUP BY cid)) s
             {FILTER} ORDER BY s.hi DESC, s.lo DESC, c.uuid LIMIT ?6",
            split_sum("h", "l", "")
        )
    } else {
        format!(
            "SELECT c.uuid, s.total, c.category
             FROM (SELECT cid, sum(value) AS total FROM {table}
                   WHERE {column} BETWEEN ?3 AND ?4 GROUP BY cid) s
             {FILTER} ORDER BY s.total DESC, c.uuid LIMIT ?6"
        )
    };
    let mut s = conn.prepare_cached(&sql)?;
    let rows = s.query_map(
        params![
            over.entity,
            over.action,
            over.from,
            over.to,
            over.category,
            limit(over.size)
        ],
        |r| {
            let value = if wide {
                join(r.get(1)?, r.get(2)?)
            } else {
                r.get::<_, i64>(1)?.into()
            };
            Ok(TopEntry {
                uuid: r.get(0)?,
                value,
                category: r.get(if wide { 3 } else { 2 })?,
            })
        },
    )?;
    rows.collect()
}

pub(super) fn stale(conn: &Connection, q: &StaleQuery) -> Result<Vec<Counter>, StoreError> {
    const COLS: &str = "entity, action, uuid, value, category, first_ts, recorded_ts";
    const FILTER: &str = "(?2 IS NULL OR entity = ?2) AND (?3 IS NULL OR action = ?3)";
    const ORDER: &str = "ORDER BY recorded_ts, entity, action, uuid LIMIT ?4";
    let read = |r: &rusqlite::Row<'_>| {
        let key = CounterKey {
            entity: r.get::<_, String>(0)?.into(),
            action: r.get::<_, String>(1)?.into(),
            uuid: r.get::<_, String>(2)?.into(),
        };
        Ok(Counter {
            key,
            value: r.get(3)?,
            category: r.get(4)?,
            first_ms: r.get(5)?,
            recorded_ms: r.get(6)?,
        })
    };
    let rows = match &q.after {
        None => {
            let mut s = conn
                .prepare_cached(&format!(
                    "SELECT {COLS} FROM counters WHERE recorded_ts < ?1 AND {FILTER} {ORDER}"
                ))
                .map_err(sql("queries::stale"))?;
            let rows = s
                .query_map(
                    params![q.before_ms, q.entity, q.action, limit(q.limit)],
                    read,
                )
                .map_err(sql("queries::stale"))?;
            rows.collect::<Result<Vec<_>, _>>()
        }
        Some((ts, k)) => {
            // The plain `recorded_ts >= ?5` bound lets the index seek to the page.
            let mut s = conn
                .prepare_cached(&format!(
                    "SELECT {COLS} FROM counters
                     WHERE recorded_ts < ?1 AND recorded_ts >= ?5 AND {FILTER}
                       AND (recorded_ts, entity, action, uuid) > (?5, ?6, ?7, ?8) {ORDER}"
                ))
                .map_err(sql("queries::stale"))?;
            let rows = s
                .query_map(
                    params![
                        q.before_ms,
                        q.entity,
                        q.action,
                        limit(q.limit),
                        ts,
                        &*k.entity,
                        &*k.action,
                        &*k.uuid
                    ],
                    read,
                )
                .map_err(sql("queries::stale"))?;
            rows.collect::<Result<Vec<_>, _>>()
        }
    };
    rows.map_err(sql("queries::stale"))
}

/// The total is summed as high and low 32-bit halves, each of which fits
/// SQLite's integer sum, so a pair whose total leaves i64 is still exact.
pub(super) fn unused(conn: &Connection, before_ms: i64) -> Result<Vec<UnusedPair>, StoreError> {
    let mut s = conn
        .prepare_cached(
            "SELECT entity, action, max(recorded_ts) AS last, sum(value >> 32),
                    sum(value & 4294967295), count(*)
             FROM counters GROUP BY entity, action HAVING last < ?1
             ORDER BY last, entity, action",
        )
        .map_err(sql("queries::unused"))?;
    let rows = s
        .query_map([before_ms], |r| {
            let hi: i64 = r.get(3)?;
            let lo: i64 = r.get(4)?;
            Ok(UnusedPair {
                entity: r.get(0)?,
                action: r.get(1)?,
                last_ms: r.get(2)?,
                total: (i128::from(hi) << 32) + i128::from(lo),
                counters: r.get::<_, i64>(5)?.try_into().unwrap_or(0),
            })
        })
        .map_err(sql("queries::unused"))?;
    rows.collect::<Result<Vec<_>, _>>()
        .map_err(sql("queries::unused"))
}

pub(super) fn average(
    conn: &Connection,
    key: &CounterKey,
    window: Option<Window>,
) -> Result<Option<Average>, StoreError> {
    let row = conn
        .prepare_cached(
            "SELECT aid, sum, quantity, category, first_ts, recorded_ts FROM averages
             WHERE entity = ?1 AND action = ?2 AND uuid = ?3",
        )
        .and_then(|mut s| {
            s.query_row(params![&*key.entity, &*key.action, &*key.uuid], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    Average {
                        key: key.clone(),
                        sum: r.get::<_, i64>(1)?.into(),
                        quantity: r.get::<_, i64>(2)?.into(),
                        category: r.get(3)?,
                        first_ms: r.get(4)?,
                        recorded_ms: r.get(5)?,
                    },
                ))
            })
            .optional()
        })
        .map_err(sql("queries::average"))?;
    let Some((aid, mut avg)) = row else {
        return Ok(None);
    };
    if let Some(w) = window {
        // In 32-bit halves, like the unused report: a window's sum of
        // several days may leave i64 (where `sum()` fails).
        let halves = |r: &rusqlite::Row<'_>, i: usize| -> rusqlite::Result<i128> {
            let (h, l): (i64, i64) = (r.get(i)?, r.get(i + 1)?);
            Ok((i128::from(h) << 32) + i128::from(l))
        };
        let (sum, quantity) = conn
            .prepare_cached(
                "SELECT coalesce(sum(sum >> 32), 0), coalesce(sum(sum & 4294967295), 0),
                        coalesce(sum(quantity >> 32), 0), coalesce(sum(quantity & 4294967295), 0)
                 FROM average_buckets INDEXED BY average_buckets_by_average
                 WHERE aid = ?1 AND day BETWEEN ?2 AND ?3",
            )
            .and_then(|mut s| {
                s.query_row(params![aid, w.from_day, w.to_day], |r| {
                    Ok((halves(r, 0)?, halves(r, 2)?))
                })
            })
            .map_err(sql("queries::average"))?;
        avg.sum = sum;
        avg.quantity = quantity;
    }
    Ok(Some(avg))
}

/// A kept pair `(hi, lo)` as a double: one rounding, the same as
/// `CAST(x AS REAL)`, while the value fits i64.
fn real(hi: &str, lo: &str) -> String {
    format!(
        "(CASE WHEN {hi} BETWEEN -2 AND 1 THEN CAST({hi} * 4611686018427387904 + {lo} AS REAL)
          ELSE {hi} * 4611686018427387904.0 + {lo} END)"
    )
}

/// Over a window, the sums and quantities of the plain query are summed
/// again in 32-bit halves when one leaves i64 (as for [`summed_top`]).
pub(super) fn top_averages(
    conn: &Connection,
    q: &TopAveragesQuery,
) -> Result<TopAverages, StoreError> {
    if q.rank != Rank::Average {
        return top_ranked_averages(conn, q);
    }
    let entries = with_halves(q, |exact| {
        let mut entries = Vec::with_capacity(q.size);
        ranked_averages(conn, q, exact, ByAverage(q.size), |e| {
            entries.push(e);
            true
        })?;
        Ok(entries)
    })
    .map_err(sql("queries::top_averages"))?;
    Ok(TopAverages::by_average(entries, true))
}

/// Runs `f` with plain sums, then, over a window where one left i64, again
/// in 32-bit halves.
fn with_halves<T>(
    q: &TopAveragesQuery,
    mut f: impl FnMut(bool) -> rusqlite::Result<T>,
) -> rusqlite::Result<T> {
    match f(false) {
        Err(e) if q.window.is_some() && overflowed(&e) => f(true),
        r => r,
    }
}

/// A confidence-adjusted rank: every target the list considers, read in
/// uuid order with no `LIMIT`, scored in Rust ([`RankedTop`]: a heap of
/// `size`), exactly. A Bayesian rank reads them twice, first for `C` (the
/// mean of their averages), then to score them; both in one read
/// transaction, so both passes see the same snapshot.
fn top_ranked_averages(conn: &Connection, q: &TopAveragesQuery) -> Result<TopAverages, StoreError> {
    let op = sql("queries::top_averages");
    let tx = conn.unchecked_transaction().map_err(op)?;
    let prior_mean = match q.rank {
        Rank::Bayesian { .. } => {
            let mean = with_halves(q, |exact| {
                let mut mean = MeanOfAverages::default();
                ranked_averages(&tx, q, exact, ByUuid, |e| {
                    mean.push(e.sum, e.quantity);
                    true
                })?;
                Ok(mean)
            })
            .map_err(sql("queries::top_averages"))?;
            match mean.mean() {
                Some(c) => Some(c),
                None => return Ok(RankedTop::new(q.rank, None, q.size).finish(true)),
            }
        }
        _ => None,
    };
    let top = with_halves(q, |exact| {
        let mut top = RankedTop::new(q.rank, prior_mean, q.size);
        ranked_averages(&tx, q, exact, ByUuid, |e| top.push(e))?;
        Ok(top)
    })
    .map_err(sql("queries::top_averages"))?;
    Ok(top.finish(true))
}

/// The order rows are read in: the list's (by average, `LIMIT size`), or
/// every row by uuid for a rank scored in Rust.
#[derive(Clone, Copy)]
enum Order {
    ByAverage(usize),
    ByUuid,
}
use Order::{ByAverage, ByUuid};

/// `exact` (a window only): sums and quantities as the kept totals' pairs
/// (`hi · 2^62 + lo`, `windows::join`), ordered by the quotient of their doubles as the plain
/// query orders by `CAST(s AS REAL) / n`, then by quantity. Each row goes
/// to `row` until it answers `false`.
fn ranked_averages(
    conn: &Connection,
    q: &TopAveragesQuery,
    exact: bool,
    order: Order,
    mut row: impl FnMut(AverageEntry) -> bool,
) -> rusqlite::Result<()> {
    let by_uuid = matches!(order, ByUuid);
    let sql = match (q.window, exact) {
        (None, _) => format!(
            "SELECT uuid, sum, quantity, category FROM averages
             WHERE entity = ?1 AND action = ?2 AND (?3 IS NULL OR category = ?3)
               AND quantity >= ?4 AND ?5 IS NULL AND ?6 IS NULL
             ORDER BY {} LIMIT ?7",
            if by_uuid {
                "uuid"
            } else {
                "CAST(sum AS REAL) / quantity DESC, quantity DESC, uuid"
            }
        ),
        (Some(_), false) => format!(
            "SELECT a.uuid, sum(b.sum) AS s, sum(b.quantity) AS n, a.category
             FROM average_buckets b JOIN averages a ON a.aid = b.aid
             WHERE b.day BETWEEN ?5 AND ?6 AND a.entity = ?1 AND a.action = ?2
               AND (?3 IS NULL OR a.category = ?3)
             GROUP BY b.aid HAVING n >= ?4
             ORDER BY {} LIMIT ?7",
            if by_uuid {
                "a.uuid"
            } else {
                "CAST(s AS REAL) / n DESC, n DESC, a.uuid"
            }
        ),
        (Some(_), true) => format!(
            "SELECT a.uuid, w.shi, w.slo, w.nhi, w.nlo, a.category
             FROM (SELECT aid, {s}, {n} FROM (
                       SELECT b.aid, sum(b.sum >> 32) AS sh, sum(b.sum & 4294967295) AS sl,
                              sum(b.quantity >> 32) AS nh, sum(b.quantity & 4294967295) AS nl
                       FROM average_buckets b JOIN averages a ON a.aid = b.aid
                       WHERE b.day BETWEEN ?5 AND ?6 AND a.entity = ?1 AND a.action = ?2
                         AND (?3 IS NULL OR a.category = ?3)
                       GROUP BY b.aid)) w
             JOIN averages a ON a.aid = w.aid
             WHERE (w.nhi, w.nlo) >= (?4 >> 62, ?4 & 4611686018427387903)
             ORDER BY {order} LIMIT ?7",
            s = split_sum("sh", "sl", "s"),
            n = split_sum("nh", "nl", "n"),
            order = if by_uuid {
                "a.uuid".to_string()
            } else {
                format!(
                    "{} / {} DESC, w.nhi DESC, w.nlo DESC, a.uuid",
                    real("w.shi", "w.slo"),
                    real("w.nhi", "w.nlo")
                )
            },
        ),
    };
    let exact = exact && q.window.is_some();
    // A negative LIMIT is none: every row, for a rank scored here.
    let limit = match order {
        ByAverage(size) => limit(size),
        ByUuid => -1,
    };
    let mut s = conn.prepare_cached(&sql)?;
    let mut rows = s.query(params![
        q.entity,
        q.action,
        q.category,
        q.min_quantity,
        q.window.map(|w| w.from_day),
        q.window.map(|w| w.to_day),
        limit
    ])?;
    while let Some(r) = rows.next()? {
        let entry = if exact {
            AverageEntry {
                uuid: r.get(0)?,
                sum: join(r.get(1)?, r.get(2)?),
                quantity: join(r.get(3)?, r.get(4)?),
                category: r.get(5)?,
                score: None,
            }
        } else {
            AverageEntry {
                uuid: r.get(0)?,
                sum: r.get::<_, i64>(1)?.into(),
                quantity: r.get::<_, i64>(2)?.into(),
                category: r.get(3)?,
                score: None,
            }
        };
        if !row(entry) {
            break;
        }
    }
    Ok(())
}
