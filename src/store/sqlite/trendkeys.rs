//! Kept upper bounds of trending scores, one per counter and kept
//! half-life (`--trending-half-lives`), so a trending list of a kept
//! half-life walks the pair's counters best bound first and scores only
//! the few that may be listed (`trending::walked`), instead of every hour
//! and day row of the plan.
//!
//! The bound. A count in a bucket ending at `end` weighs
//! `2^(-max(0, now - end) / hl) <= 2^((end - now) / hl)` at every `now`
//! (a bucket not yet ended weighs 1). So `U = Σ max(v, 0) · 2^(end / hl)`
//! over every bucket a list may read gives `score <= U · 2^(-now / hl)`
//! for every `now`, and `U` does not depend on `now`: it is kept, as
//! `key = log2 U` (an f64: `2^(end / hl)` itself leaves f64 after a few
//! thousand half-lives), added to by log-sum-exp. A counter whose `U` is 0
//! has no row: it scores at most 0.
//!
//! Which buckets a list may read: every hour bucket (at its hour's end),
//! and the day buckets of the days before the hourly retention, at the
//! day's end. Those days are the days before `R`, the first day not yet
//! "rebased": when the hourly retention passes a day, the upkeep
//! ([`upkeep`], in the background, [`UPKEEP_ROWS`] bucket rows a
//! transaction) adds each counter's day bucket of it to its key, and
//! moves `R` on when the day is done. A list whose
//! plan reads a day bucket of a day at or after `R` scans instead (for a
//! moment after midnight, until the upkeep has run). Bounding today's
//! counts by their hours' ends, not the day's, keeps the bound within
//! `2^(1h / hl)` of the score for the hours read (the lead's first design
//! weighed every count at its day's end: up to twice the score at a 24h
//! half-life, and three times the candidates in the bench).
//!
//! Why it stays a bound:
//! - The fold (`fold`) adds, per counter and pass, the positive part of
//!   each hour's net delta at the hour's end, and of each day's net delta
//!   at the day's end for days before `R`: `max(v + δ, 0) <= max(v, 0) + max(δ, 0)`.
//! - Writes that set rows (imports, backfills, direct writes and new
//!   counters of a flush, deletes) sum the counter's key again from its
//!   rows ([`recompute`]).
//! - Retention only deletes rows, which lowers scores.
//!
//! Created only when asked for (the flag), built when the store opens (a
//! pass over `counters`, `buckets` and `hours` in counter order, about 20 s
//! at a million counters for three half-lives, before the store serves);
//! the kept half-lives are rows of counter 0, whose `key` holds `R`. A
//! store that keeps none pays nothing.

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use super::sql;
use crate::domain::trending::{day_end, hour_end};
use crate::store::StoreError;

pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS trend_keys (
    cid    INTEGER NOT NULL,
    hl     INTEGER NOT NULL,
    entity TEXT    NOT NULL,
    action TEXT    NOT NULL,
    key    REAL    NOT NULL,
    PRIMARY KEY (cid, hl)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS trend_keys_top ON trend_keys (entity, action, hl, key DESC);
";

/// `log2(2^a + 2^b)`, never overflowing.
pub(super) fn lse(a: f64, b: f64) -> f64 {
    let (m, n) = if a >= b { (a, b) } else { (b, a) };
    m + (n - m).exp2().ln_1p() / std::f64::consts::LN_2
}

/// The key of the terms `(end_ms, amount)` for half-life `hl` (ms):
/// `log2 Σ amount · 2^(end / hl)` over the positive amounts; `None` when
/// none is positive.
fn key_of(terms: &[(i64, i128)], hl: i64) -> Option<f64> {
    let mut key: Option<f64> = None;
    for &(end, a) in terms {
        if a <= 0 {
            continue;
        }
        let term = (a as f64).log2() + end as f64 / hl as f64;
        key = Some(key.map_or(term, |k| lse(k, term)));
    }
    key
}

/// The terms of a counter's rows: each hour row at its hour's end, each
/// day row of a day before `r` at the day's end.
fn terms_of(days: &[(i64, i64)], hours: &[(i64, i64)], r: i64) -> Vec<(i64, i128)> {
    let hours = hours.iter().map(|&(h, v)| (hour_end(h), i128::from(v)));
    let days = days
        .iter()
        .filter(|(d, _)| *d < r)
        .map(|&(d, v)| (day_end(d), i128::from(v)));
    hours.chain(days).collect()
}

/// Whether the store keeps keys at all (the table exists).
pub(super) fn exists(conn: &Connection) -> Result<bool, StoreError> {
    conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'trend_keys')",
        [],
        |r| r.get(0),
    )
    .map_err(sql("trendkeys::exists"))
}

/// The kept half-lives (ms), ascending.
pub(super) fn kept(conn: &Connection) -> Result<Vec<i64>, StoreError> {
    if !exists(conn)? {
        return Ok(Vec::new());
    }
    conn.prepare_cached("SELECT hl FROM trend_keys WHERE cid = 0 ORDER BY hl")
        .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
        .map_err(sql("trendkeys::kept"))
}

/// `R`: the first day whose day bucket is not in the keys (see the module
/// documentation).
pub(super) fn rebased(conn: &Connection) -> Result<i64, StoreError> {
    conn.prepare_cached("SELECT key FROM trend_keys WHERE cid = 0 LIMIT 1")
        .and_then(|mut s| s.query_row([], |r| r.get::<_, f64>(0)).optional())
        .map(|r| r.map_or(i64::MIN, |r| r as i64))
        .map_err(sql("trendkeys::rebased"))
}

/// Makes `hls` the kept half-lives, building every key from the rows (with
/// `R = r`) when they differ from those kept (an empty set drops the
/// table). Its own transaction on the writer's connection; returns whether
/// it rebuilt.
pub(super) fn keep_now(conn: &mut Connection, hls: &[i64], r: i64) -> Result<bool, StoreError> {
    let mut want = hls.to_vec();
    want.sort_unstable();
    want.dedup();
    if kept(conn)? == want {
        return Ok(false);
    }
    let e = sql("trendkeys::keep");
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(&e)?;
    if want.is_empty() {
        tx.execute_batch("DROP TABLE IF EXISTS trend_keys")
            .map_err(&e)?;
        tx.commit().map_err(&e)?;
        return Ok(true);
    }
    tx.execute_batch(SCHEMA).map_err(&e)?;
    tx.execute("DELETE FROM trend_keys", []).map_err(&e)?;
    {
        let mut counters = tx
            .prepare("SELECT cid, entity, action FROM counters ORDER BY cid")
            .map_err(&e)?;
        let mut buckets = tx
            .prepare(
                "SELECT cid, day, value FROM buckets INDEXED BY buckets_by_counter ORDER BY cid, day",
            )
            .map_err(&e)?;
        let mut hours = tx
            .prepare(
                "SELECT cid, hour, value FROM hours INDEXED BY hours_by_counter ORDER BY cid, hour",
            )
            .map_err(&e)?;
        let mut insert = tx
            .prepare(
                "INSERT INTO trend_keys (cid, hl, entity, action, key) VALUES (?1, ?2, ?3, ?4, ?5)",
            )
            .map_err(&e)?;
        let row3 = |r: &rusqlite::Row| -> rusqlite::Result<(i64, i64, i64)> {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        };
        let mut b_rows = buckets.query_map([], row3).map_err(&e)?.peekable();
        let mut h_rows = hours.query_map([], row3).map_err(&e)?.peekable();
        let mut c_rows = counters.query([]).map_err(&e)?;
        let (mut days, mut hrs) = (Vec::new(), Vec::new());
        while let Some(c) = c_rows.next().map_err(&e)? {
            let cid: i64 = c.get(0).map_err(&e)?;
            days.clear();
            hrs.clear();
            for (rows, out) in [(&mut b_rows, &mut days), (&mut h_rows, &mut hrs)] {
                loop {
                    let (c2, at, v) = match rows.peek() {
                        None => break,
                        Some(Ok(x)) => *x,
                        Some(Err(_)) => {
                            if let Some(Err(err)) = rows.next() {
                                return Err(e(err));
                            }
                            break;
                        }
                    };
                    if c2 > cid {
                        break;
                    }
                    rows.next();
                    if c2 == cid {
                        out.push((at, v));
                    }
                }
            }
            let terms = terms_of(&days, &hrs, r);
            let (entity, action): (String, String) = (c.get(1).map_err(&e)?, c.get(2).map_err(&e)?);
            for &hl in &want {
                if let Some(key) = key_of(&terms, hl) {
                    insert
                        .execute(params![cid, hl, entity, action, key])
                        .map_err(&e)?;
                }
            }
        }
        for &hl in &want {
            insert
                .execute(params![0, hl, "", "", r as f64])
                .map_err(&e)?;
        }
    }
    tx.commit().map_err(&e)?;
    Ok(true)
}

/// Bucket rows of the day being rebased taken per transaction of the
/// upkeep: a few tens of milliseconds of the writer per kept half-life.
pub(super) const UPKEEP_ROWS: usize = 2_000;

/// The day the writes count day buckets up to (excluded): `R`, or `R + 1`
/// while the upkeep is rebasing day `R` (the cursor row, counter -1, is
/// there): from its first chunk on, a delta of day `R` goes into the keys
/// as it is folded, so a counter whose bucket the upkeep has read misses
/// none; one it reads later gets the delta twice (a looser bound, still
/// one).
fn counted_before(conn: &Connection) -> Result<i64, StoreError> {
    let cursor: Option<f64> = conn
        .prepare_cached("SELECT key FROM trend_keys WHERE cid = -1")
        .and_then(|mut s| s.query_row([], |r| r.get(0)).optional())
        .map_err(sql("trendkeys::counted_before"))?;
    Ok(rebased(conn)? + i64::from(cursor.is_some()))
}

/// Moves `R` on towards `target` (the first day the hourly retention
/// keeps): each counter's positive day bucket of day `R` added to its
/// keys, `rows` bucket rows per transaction (a cursor row, counter -1,
/// says where a day stopped), at most `chunks` transactions. Returns how
/// many transactions it ran (0: nothing to do).
pub(super) fn upkeep(
    conn: &Connection,
    hls: &[i64],
    target: i64,
    rows: usize,
    chunks: usize,
) -> Result<usize, StoreError> {
    if hls.is_empty() {
        return Ok(0);
    }
    let e = sql("trendkeys::upkeep");
    let mut done = 0;
    while done < chunks {
        let r = rebased(conn)?;
        if r >= target {
            break;
        }
        let tx = conn.unchecked_transaction().map_err(&e)?;
        let after: i64 = tx
            .prepare_cached("SELECT key FROM trend_keys WHERE cid = -1")
            .and_then(|mut s| s.query_row([], |r| r.get::<_, f64>(0)).optional())
            .map_err(&e)?
            .map_or(i64::MIN, |c| c as i64);
        let got: Vec<(i64, i64)> = tx
            .prepare_cached(
                "SELECT cid, value FROM buckets
                 WHERE day = ?1 AND cid > ?2 AND value > 0 ORDER BY cid LIMIT ?3",
            )
            .and_then(|mut s| {
                s.query_map(
                    params![r, after, i64::try_from(rows).unwrap_or(i64::MAX)],
                    |x| Ok((x.get(0)?, x.get(1)?)),
                )?
                .collect()
            })
            .map_err(&e)?;
        for &(cid, v) in &got {
            for &hl in hls {
                if let Some(key) = key_of(&[(day_end(r), i128::from(v))], hl) {
                    add(&tx, cid, hl, key)?;
                }
            }
        }
        match got.last() {
            Some(&(last, _)) if got.len() == rows => {
                tx.prepare_cached(
                    "INSERT OR REPLACE INTO trend_keys (cid, hl, entity, action, key)
                     VALUES (-1, 0, '', '', ?1)",
                )
                .and_then(|mut s| s.execute([last as f64]))
                .map_err(&e)?;
            }
            // The day is done.
            _ => {
                tx.prepare_cached("DELETE FROM trend_keys WHERE cid = -1")
                    .and_then(|mut s| s.execute([]))
                    .map_err(&e)?;
                tx.prepare_cached("UPDATE trend_keys SET key = ?1 WHERE cid = 0")
                    .and_then(|mut s| s.execute([(r + 1) as f64]))
                    .map_err(&e)?;
            }
        }
        tx.commit().map_err(&e)?;
        done += 1;
    }
    Ok(done)
}

/// Adds `2^term` to the key of (`cid`, `hl`), creating it.
fn add(conn: &Connection, cid: i64, hl: i64, term: f64) -> Result<(), StoreError> {
    let e = sql("trendkeys::add");
    let old: Option<f64> = conn
        .prepare_cached("SELECT key FROM trend_keys WHERE cid = ?1 AND hl = ?2")
        .and_then(|mut s| s.query_row([cid, hl], |r| r.get(0)).optional())
        .map_err(&e)?;
    match old {
        Some(old) => conn
            .prepare_cached("UPDATE trend_keys SET key = ?3 WHERE cid = ?1 AND hl = ?2")
            .and_then(|mut s| s.execute(params![cid, hl, lse(old, term)]))
            .map_err(&e)?,
        None => conn
            .prepare_cached(
                "INSERT INTO trend_keys (cid, hl, entity, action, key)
                 SELECT cid, ?2, entity, action, ?3 FROM counters WHERE cid = ?1",
            )
            .and_then(|mut s| s.execute(params![cid, hl, term]))
            .map_err(&e)?,
    };
    Ok(())
}

/// Sums the keys of counter `cid` again from its rows (none when it is
/// gone or never counted up): after anything but the fold set its rows.
pub(super) fn recompute(conn: &Connection, hls: &[i64], cid: i64) -> Result<(), StoreError> {
    if hls.is_empty() {
        return Ok(());
    }
    let e = sql("trendkeys::recompute");
    conn.prepare_cached("DELETE FROM trend_keys WHERE cid = ?1")
        .and_then(|mut s| s.execute([cid]))
        .map_err(&e)?;
    let pair: Option<(String, String)> = conn
        .prepare_cached("SELECT entity, action FROM counters WHERE cid = ?1")
        .and_then(|mut s| {
            s.query_row([cid], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()
        })
        .map_err(&e)?;
    let Some((entity, action)) = pair else {
        return Ok(());
    };
    let terms = terms_of(
        &rows(conn, cid, "buckets", "day")?,
        &rows(conn, cid, "hours", "hour")?,
        counted_before(conn)?,
    );
    let mut insert = conn
        .prepare_cached(
            "INSERT INTO trend_keys (cid, hl, entity, action, key) VALUES (?1, ?2, ?3, ?4, ?5)",
        )
        .map_err(&e)?;
    for &hl in hls {
        if let Some(key) = key_of(&terms, hl) {
            insert
                .execute(params![cid, hl, entity, action, key])
                .map_err(&e)?;
        }
    }
    Ok(())
}

/// Every `(at, value)` row of `cid` in `table` (`buckets` by day, `hours` by
/// hour), in order.
fn rows(
    conn: &Connection,
    cid: i64,
    table: &str,
    column: &str,
) -> Result<Vec<(i64, i64)>, StoreError> {
    conn.prepare_cached(&format!(
        "SELECT {column}, value FROM {table} WHERE cid = ?1 ORDER BY {column}"
    ))
    .and_then(|mut s| {
        s.query_map([cid], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect()
    })
    .map_err(sql("trendkeys::rows"))
}

/// The fold's part for one counter, after its rows took the pass's deltas:
/// `days` (day, δ) and `hours` (hour, δ) are the pass's net deltas.
pub(super) fn fold(
    conn: &Connection,
    hls: &[i64],
    cid: i64,
    days: &[(i64, i128)],
    hours: &[(i64, i128)],
) -> Result<(), StoreError> {
    let r = counted_before(conn)?;
    let terms: Vec<(i64, i128)> = hours
        .iter()
        .map(|&(h, d)| (hour_end(h), d))
        .chain(
            days.iter()
                .filter(|(day, _)| *day < r)
                .map(|&(day, d)| (day_end(day), d)),
        )
        .collect();
    for &hl in hls {
        if let Some(key) = key_of(&terms, hl) {
            add(conn, cid, hl, key)?;
        }
    }
    Ok(())
}

/// The candidates of a list: `(cid, key)` of the pair's counters for
/// half-life `hl`, best key first, passed to `visit` until it says stop.
pub(super) fn walk(
    conn: &Connection,
    entity: &str,
    action: &str,
    hl: i64,
    mut visit: impl FnMut(i64, f64) -> Result<bool, StoreError>,
) -> Result<(), StoreError> {
    let e = sql("trendkeys::walk");
    let mut s = conn
        .prepare_cached(
            "SELECT cid, key FROM trend_keys INDEXED BY trend_keys_top
             WHERE entity = ?1 AND action = ?2 AND hl = ?3 ORDER BY key DESC",
        )
        .map_err(&e)?;
    let mut rows = s.query(params![entity, action, hl]).map_err(&e)?;
    while let Some(r) = rows.next().map_err(&e)? {
        if !visit(r.get(0).map_err(&e)?, r.get(1).map_err(&e)?)? {
            break;
        }
    }
    Ok(())
}

/// Test helper: every counter's kept key is at least the key summed from
/// its rows (and a counter with a positive row has one).
#[cfg(test)]
pub(super) fn assert_bounds(conn: &Connection) {
    let hls = kept(conn).unwrap();
    assert!(!hls.is_empty(), "no half-life kept");
    let r = rebased(conn).unwrap();
    let cids: Vec<i64> = conn
        .prepare("SELECT cid FROM counters")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    for cid in cids {
        let terms = terms_of(
            &rows(conn, cid, "buckets", "day").unwrap(),
            &rows(conn, cid, "hours", "hour").unwrap(),
            r,
        );
        for &hl in &hls {
            let kept: Option<f64> = conn
                .query_row(
                    "SELECT key FROM trend_keys WHERE cid = ?1 AND hl = ?2",
                    [cid, hl],
                    |r| r.get(0),
                )
                .optional()
                .unwrap();
            match (key_of(&terms, hl), kept) {
                (None, _) => {}
                (Some(want), Some(k)) => {
                    assert!(k >= want - 1e-9, "cid {cid} hl {hl}: kept {k} < {want}")
                }
                (Some(want), None) => panic!("cid {cid} hl {hl}: no key, rows say {want}"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: i64 = 86_400_000;

    #[test]
    fn log_sum_exp_adds_powers_of_two() {
        assert_eq!(lse(3.0, 3.0), 4.0);
        assert!((lse(10.0, 0.0) - (1025f64).log2()).abs() < 1e-12);
        // Far past f64's range of 2^x: still finite.
        assert!((lse(50_000.0, 50_000.0) - 50_001.0).abs() < 1e-9);
    }

    #[test]
    fn hours_count_at_their_ends_and_days_only_before_r() {
        // Day 10 (before R = 11): its row 5 at the day's end; day 11: its
        // row left to its hours (4 at 264's end, -3 not at all).
        let t = terms_of(&[(10, 5), (11, 7)], &[(264, 4), (265, -3)], 11);
        assert_eq!(
            t,
            vec![(265 * 3_600_000, 4), (266 * 3_600_000, -3), (11 * DAY, 5)]
        );
        assert_eq!(key_of(&[(DAY, 0), (DAY, -1)], 3_600_000), None);
        // 4·2^(265/24) + 5·2^11 with a day's half-life.
        let k = key_of(&t, DAY).unwrap();
        let want = (4.0 * (265.0f64 / 24.0).exp2() + 5.0 * 2048.0).log2();
        assert!((k - want).abs() < 1e-12, "{k} {want}");
    }
}

/// The lists a walk over the kept bounds answers against the scan's, on
/// random counts (decrements, categories, backfilled days, deletes) with
/// the clock moved across midnights and across the hourly retention.
#[cfg(test)]
mod against_the_scan {
    use rusqlite::Connection;

    use crate::domain::trending::plan;
    use crate::domain::{CounterKey, DaySet, Increment, ManualClock};
    use crate::store::sqlite::{Durability, SqliteStore, DB_FILE};
    use crate::store::{Store, TrendingQuery, WriteBatch};

    const HOUR: i64 = 3_600_000;
    const DAY: i64 = 86_400_000;
    /// 2030-03-01 05:00 UTC.
    const START: i64 = 21_974 * DAY + 5 * HOUR;

    /// A small deterministic generator (xorshift), so a failure replays.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    fn key(u: u64) -> CounterKey {
        CounterKey::new("VIDEO", "VIEW", &format!("u{u:03}")).unwrap()
    }

    #[tokio::test]
    async fn walked_lists_are_the_scans_bit_for_bit() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(chrono::DateTime::from_timestamp_millis(START).unwrap());
        let open = || {
            let store = SqliteStore::open(
                dir.path(),
                Durability::Relaxed,
                std::time::Duration::from_secs(60),
                400,
                clock.clock(),
            )
            .unwrap();
            store.set_hourly_retention(2);
            store
        };
        let mut store = open();
        let kept = [HOUR, 24 * HOUR, 7 * 24 * HOUR];
        // Hour buckets for today and the two days before (the plans'
        // `hourly_days` of 3 below).
        store.set_hourly_retention(2);
        store.set_trending_half_lives(&kept).unwrap();
        let conn = Connection::open(dir.path().join(DB_FILE)).unwrap();
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let (mut walked, mut lists) = (0, 0);
        let hourly_days = 3;
        for step in 0..60 {
            let now = START + step * 7 * HOUR;
            clock.set(chrono::DateTime::from_timestamp_millis(now).unwrap());
            // Increments over the last 25 days, a fifth of them decrements.
            let events: Vec<Increment> = (0..60)
                .map(|_| {
                    let ts = now - rng.next(25 * 24) as i64 * HOUR - rng.next(HOUR as u64) as i64;
                    let delta = match rng.next(5) {
                        0 => -(rng.next(30) as i64),
                        _ => 1 + rng.next(40) as i64,
                    };
                    Increment {
                        key: key(rng.next(80)),
                        delta,
                        category: match rng.next(3) {
                            0 => Some("a".into()),
                            1 => Some("b".into()),
                            _ => None,
                        },
                        ts_ms: ts,
                        day: ts.div_euclid(DAY),
                        id: None,
                        kind: crate::domain::Kind::Counter,
                        unique: None,
                    }
                })
                .collect();
            store
                .apply(WriteBatch {
                    requests: events.into_iter().map(|e| vec![e]).collect(),
                    wanted: Default::default(),
                })
                .await
                .unwrap();
            if step % 4 == 1 {
                let sets = (0..3)
                    .map(|_| DaySet {
                        key: key(rng.next(80)),
                        day: now.div_euclid(DAY) - rng.next(25) as i64,
                        value: rng.next(200) as i64 - 50,
                        category: None,
                    })
                    .collect();
                store.set_days(sets, 0).await.unwrap();
            }
            if step == 30 {
                // A restart: the bounds kept stay kept (by the new
                // counters of the flushes below too), nothing rebuilt.
                drop(store);
                store = open();
                store.set_trending_half_lives(&kept).unwrap();
            }
            if step % 7 == 3 {
                let day = now.div_euclid(DAY);
                let import = crate::store::CounterImport {
                    key: key(rng.next(80)),
                    before: 0,
                    days: (0..3)
                        .map(|i| crate::store::Bucket {
                            day: day - 1 - 4 * i - rng.next(2) as i64,
                            value: rng.next(60) as i64 - 10,
                        })
                        .collect(),
                    category: None,
                    first_ms: now - 20 * DAY,
                    recorded_ms: now,
                    hours: None,
                };
                let out = store
                    .import(crate::store::ImportBatch {
                        counters: vec![import],
                        averages: vec![],
                        days: vec![],
                        marks: vec![],
                        oldest_day: 0,
                    })
                    .await
                    .unwrap();
                assert_eq!(out, crate::store::ImportOutcome::Applied);
            }
            if step % 9 == 4 {
                store.delete(&key(rng.next(80))).await.unwrap();
            }
            store.trending_upkeep(7, 1).unwrap();
            // Folded first (a list folds), then the bounds checked.
            store
                .trending_by_scan(&query(now, HOUR, 1, None, hourly_days))
                .await
                .unwrap();
            super::assert_bounds(&conn);
            // Every other step, the upkeep runs before the lists (else they
            // come after a midnight it has not seen: scanned).
            // A day is rebased 7 bucket rows a transaction, a transaction
            // after each write below: lists and bounds hold in between.
            if step % 2 == 0 {
                store.trending_upkeep(7, 1).unwrap();
                super::assert_bounds(&conn);
            }
            for hl in [HOUR, 3 * HOUR, 24 * HOUR, 7 * 24 * HOUR] {
                for size in [1, 3, 10, 100] {
                    for category in [None, Some("a")] {
                        let q = query(now, hl, size, category, hourly_days);
                        let got = store.trending(&q).await.unwrap();
                        let want = store.trending_by_scan(&q).await.unwrap();
                        assert_eq!(got, want, "step {step} hl {hl} size {size} {category:?}");
                        for (g, w) in got.entries.iter().zip(&want.entries) {
                            assert_eq!(g.score.to_bits(), w.score.to_bits());
                        }
                        let (_, decided) = store.trending_walk(&q).await.unwrap();
                        // A list of 100 of 80 counters is always the scan's.
                        if kept.contains(&hl) && size < 100 {
                            lists += 1;
                            walked += usize::from(decided);
                        }
                    }
                }
            }
        }
        // The walk, not the scan it falls back to, answered most lists of
        // a kept half-life.
        assert!(walked * 2 > lists, "{walked} of {lists} walked");
    }

    fn query(
        now: i64,
        hl: i64,
        size: usize,
        category: Option<&str>,
        hourly_days: u32,
    ) -> TrendingQuery {
        TrendingQuery {
            entity: "VIDEO".into(),
            action: "VIEW".into(),
            category: category.map(str::to_string),
            size,
            now_ms: now,
            half_life_ms: hl,
            plan: plan(now, hl, hourly_days, 400),
        }
    }
}
