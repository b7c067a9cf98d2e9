//! Kept upper bounds of trending scores, one per counter and kept
//! half-life (`--trending-half-lives`), so a trending list of a kept
//! half-life walks the pair's counters best bound first and scores only
//! the few that may be listed (`trending::top`), instead of every hour and
//! day row of the plan.
//!
//! The bound. A count in a bucket of UTC day `d` weighs at most
//! `2^((end(d) - now) / hl)` whatever bucket it is read from (its hour or
//! its day, ended or not: every such bucket ends at or before `end(d)`,
//! and one not ended weighs 1 <= that). So with `P_d >= max(v_d, 0)` and
//! `P_d >= Σ_h max(v_h, 0)` over the hours of `d` (what a plan may read of
//! the day: the day bucket, or some of its hours), every list at every
//! `now` has `score <= U · 2^(-now / hl)`, `U = Σ_d P_d · 2^(end(d) / hl)`.
//! `U` does not depend on `now`: it is kept, as `key = log2 U` (an f64;
//! `2^(end / hl)` itself leaves f64 after a few thousand half-lives),
//! added to by log-sum-exp. A counter whose `U` is 0 has no row: it never
//! had a positive count, and scores at most 0.
//!
//! Why it stays a bound:
//! - The fold (`fold`) adds, per counter and pass, for each day, the
//!   positive part of each hour's net delta plus the positive part of what
//!   moved the day without an hour: `max(v + δ, 0) <= max(v, 0) + max(δ, 0)`,
//!   so both sides of `P_d` stay covered.
//! - Writes that set rows (imports, backfills, direct writes and new
//!   counters of a flush, deletes) sum the counter's key again from its
//!   rows ([`recompute`]).
//! - Retention only deletes rows, which lowers scores.
//!
//! Created only when asked for (the flag), built at open from the rows (a
//! pass over `counters`, `buckets` and `hours` in counter order); the kept
//! half-lives are rows of counter 0. A store that keeps none pays nothing.

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use super::sql;
use crate::store::StoreError;

const DAY_MS: i64 = 86_400_000;

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

/// The key of `(day, P_d)` for half-life `hl` (ms): `log2 Σ P_d 2^(end(d)/hl)`;
/// `None` when no `P_d` is positive.
fn key_of(days: &[(i64, i128)], hl: i64) -> Option<f64> {
    let mut key: Option<f64> = None;
    for &(day, p) in days {
        if p <= 0 {
            continue;
        }
        let term = (p as f64).log2() + ((day + 1) * DAY_MS) as f64 / hl as f64;
        key = Some(key.map_or(term, |k| lse(k, term)));
    }
    key
}

/// `P_d` per day from a counter's day rows and hour rows (each `(at, value)`,
/// days sorted, hours sorted): `max(max(v_d, 0), Σ_h max(v_h, 0))`.
fn bounds_of(days: &[(i64, i64)], hours: &[(i64, i64)]) -> Vec<(i64, i128)> {
    let mut out: Vec<(i64, i128, i128)> = Vec::new();
    let slot = |out: &mut Vec<(i64, i128, i128)>, day: i64| -> usize {
        match out.iter().position(|(d, _, _)| *d == day) {
            Some(i) => i,
            None => {
                out.push((day, 0, 0));
                out.len() - 1
            }
        }
    };
    for &(day, v) in days {
        let i = slot(&mut out, day);
        out[i].1 += i128::from(v.max(0));
    }
    for &(hour, v) in hours {
        let i = slot(&mut out, hour.div_euclid(24));
        out[i].2 += i128::from(v.max(0));
    }
    out.into_iter().map(|(d, a, b)| (d, a.max(b))).collect()
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
    conn.prepare("SELECT hl FROM trend_keys WHERE cid = 0 ORDER BY hl")
        .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
        .map_err(sql("trendkeys::kept"))
}

/// Makes `hls` the kept half-lives, building every key from the rows when
/// they differ from those kept (an empty set drops the table). Its own
/// transaction on the writer's connection; returns whether it rebuilt.
pub(super) fn keep_now(conn: &mut Connection, hls: &[i64]) -> Result<bool, StoreError> {
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
            .prepare("SELECT cid, day, value FROM buckets INDEXED BY buckets_by_counter ORDER BY cid, day")
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
            let bounds = bounds_of(&days, &hrs);
            let (entity, action): (String, String) = (c.get(1).map_err(&e)?, c.get(2).map_err(&e)?);
            for &hl in &want {
                if let Some(key) = key_of(&bounds, hl) {
                    insert
                        .execute(params![cid, hl, entity, action, key])
                        .map_err(&e)?;
                }
            }
        }
        for &hl in &want {
            insert.execute(params![0, hl, "", "", 0.0]).map_err(&e)?;
        }
    }
    tx.commit().map_err(&e)?;
    Ok(true)
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
    let bounds = bounds_of(
        &rows(conn, cid, "buckets", "day")?,
        &rows(conn, cid, "hours", "hour")?,
    );
    let mut insert = conn
        .prepare_cached(
            "INSERT INTO trend_keys (cid, hl, entity, action, key) VALUES (?1, ?2, ?3, ?4, ?5)",
        )
        .map_err(&e)?;
    for &hl in hls {
        if let Some(key) = key_of(&bounds, hl) {
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
    // Per day: the positive parts of its hours' deltas and of the rest.
    let mut added: Vec<(i64, i128)> = Vec::with_capacity(days.len());
    for &(day, d) in days {
        let (mut up, mut net) = (0i128, 0i128);
        for &(hour, h) in hours {
            if hour.div_euclid(24) == day {
                up += h.max(0);
                net += h;
            }
        }
        added.push((day, up + (d - net).max(0)));
    }
    let e = sql("trendkeys::fold");
    for &hl in hls {
        let Some(add) = key_of(&added, hl) else {
            continue;
        };
        let old: Option<f64> = conn
            .prepare_cached("SELECT key FROM trend_keys WHERE cid = ?1 AND hl = ?2")
            .and_then(|mut s| s.query_row([cid, hl], |r| r.get(0)).optional())
            .map_err(&e)?;
        match old {
            Some(old) => conn
                .prepare_cached("UPDATE trend_keys SET key = ?3 WHERE cid = ?1 AND hl = ?2")
                .and_then(|mut s| s.execute(params![cid, hl, lse(old, add)]))
                .map_err(&e)?,
            None => conn
                .prepare_cached(
                    "INSERT INTO trend_keys (cid, hl, entity, action, key)
                     SELECT cid, ?2, entity, action, ?3 FROM counters WHERE cid = ?1",
                )
                .and_then(|mut s| s.execute(params![cid, hl, add]))
                .map_err(&e)?,
        };
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
    let cids: Vec<i64> = conn
        .prepare("SELECT cid FROM counters")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    for cid in cids {
        let bounds = bounds_of(
            &rows(conn, cid, "buckets", "day").unwrap(),
            &rows(conn, cid, "hours", "hour").unwrap(),
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
            match (key_of(&bounds, hl), kept) {
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

    #[test]
    fn log_sum_exp_adds_powers_of_two() {
        assert_eq!(lse(3.0, 3.0), 4.0);
        assert!((lse(10.0, 0.0) - (1025f64).log2()).abs() < 1e-12);
        // Far past f64's range of 2^x: still finite.
        assert!((lse(50_000.0, 50_000.0) - 50_001.0).abs() < 1e-9);
    }

    #[test]
    fn a_day_is_bounded_by_its_day_row_or_its_hours_whichever_is_more() {
        // Day 10: row 5, hours 4 and -3 (positive part 4): 5. Day 11: row
        // -2, hours 3 and 3: 6. Day 12: only a day row, negative: 0.
        let b = bounds_of(
            &[(10, 5), (11, -2), (12, -1)],
            &[(240, 4), (241, -3), (264, 3), (265, 3)],
        );
        assert_eq!(b, vec![(10, 5), (11, 6), (12, 0)]);
        assert_eq!(key_of(&[(12, 0)], 3_600_000), None);
        let k = key_of(&b, DAY_MS).unwrap();
        // 5·2^11 + 6·2^12 = 34,816.
        assert!((k - 34_816f64.log2()).abs() < 1e-12);
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
        let store = SqliteStore::open(
            dir.path(),
            Durability::Relaxed,
            std::time::Duration::from_secs(60),
            400,
            clock.clock(),
        )
        .unwrap();
        let kept = [HOUR, 24 * HOUR, 7 * 24 * HOUR];
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
            if step % 9 == 4 {
                store.delete(&key(rng.next(80))).await.unwrap();
            }
            // Folded first (a list folds), then the bounds checked.
            store
                .trending_by_scan(&query(now, HOUR, 1, None, hourly_days))
                .await
                .unwrap();
            super::assert_bounds(&conn);
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
