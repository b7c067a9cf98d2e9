//! The embedded store's kept totals over the first N days from publication
//! (`src/store/sqlite/firstdays.rs`) against the statement that sums them
//! by a pass over the pair's counters (`publication::top`, what an N without
//! kept totals runs): over randomized mixed traffic (backdated events,
//! decrements, categories, publication times set, moved and cleared,
//! backfills, imports, set values, deletes, restarts, a changed
//! `--milestone-days`, the retention's deletes)
//! every kept list equals the statement's, for every size, category and
//! oldest day kept (the retention), including windows that straddle it.
//! Days come from `common::test_now()`, so the gate's injected dates apply.

use std::sync::Arc;
use std::time::Duration;

use counter_gateway::domain::{
    day_of, CounterKey, CounterSet, DaySet, Increment, Kind, ManualClock, TimePolicy,
};
use counter_gateway::store::sqlite::{Durability, SqliteStore};
use counter_gateway::store::{
    Bucket, CounterImport, FirstDaysEntry, FirstDaysQuery, ImportBatch, ImportOutcome,
    PublishedSet, RequestOutcome, Store, WriteBatch,
};

#[path = "common/mod.rs"]
mod common;

const DAY_MS: i64 = 86_400_000;

fn t0() -> i64 {
    day_of(common::test_now())
}

fn open(dir: &std::path::Path, clock: &ManualClock) -> SqliteStore {
    SqliteStore::open(
        dir,
        Durability::Relaxed,
        Duration::from_secs(3600),
        TimePolicy::default().retention_days,
        clock.clock(),
    )
    .unwrap()
}

fn set_day(clock: &ManualClock, day: i64) {
    clock.set(common::test_now() + chrono::Duration::days(day - t0()));
}

fn key(uuid: &str) -> CounterKey {
    CounterKey::new("ARTICLE", "VIEW", uuid).unwrap()
}

fn inc(uuid: &str, day: i64, delta: i64, category: Option<&str>) -> Increment {
    Increment {
        key: key(uuid),
        delta,
        category: category.map(Arc::from),
        ts_ms: day * DAY_MS + 3_600_000,
        day,
        id: None,
        kind: Kind::Counter,
        unique: None,
    }
}

/// Applies `events` as one request; `false` when the store refused it as
/// taking a counter or bucket outside i64.
async fn write(store: &SqliteStore, events: Vec<Increment>) -> bool {
    let out = store
        .apply(WriteBatch {
            requests: vec![events],
            ..Default::default()
        })
        .await
        .unwrap();
    match &out.requests[0] {
        RequestOutcome::Applied { .. } => true,
        RequestOutcome::Overflow { .. } => false,
        other => panic!("{other:?}"),
    }
}

fn query(days: u32, category: Option<&str>, size: usize, oldest_day: i64) -> FirstDaysQuery {
    FirstDaysQuery {
        entity: "ARTICLE".into(),
        action: "VIEW".into(),
        days,
        category: category.map(String::from),
        size,
        oldest_day,
    }
}

/// Every kept N's list equals the statement's, at several sizes,
/// categories and oldest days; answers how many rows they listed.
async fn compare(store: &SqliteStore, kept: &[u32], today: i64, what: &str) -> usize {
    let mut rows = 0;
    for &days in kept {
        for category in [None, Some("k0"), Some("k1")] {
            for oldest in [today - 400, today - 20, today - 5, today] {
                for size in [1000, 3] {
                    let q = query(days, category, size, oldest);
                    let got: Vec<FirstDaysEntry> = store.top_first_days(&q).await.unwrap().entries;
                    let want = store.top_first_days_by_walk(&q).await.unwrap();
                    assert_eq!(got, want, "{what}: {q:?}");
                    rows += got.len();
                }
            }
        }
    }
    rows
}

/// Every kept row against its counter's buckets, read straight from the
/// database file: a counter with a bucket inside a kept window has its
/// row, with its window's day and the exact sum, and no other row exists.
/// What lists cannot show (a straddling window is summed from buckets) is
/// held here.
fn assert_rows_exact(dir: &std::path::Path, what: &str) {
    use std::collections::BTreeMap;
    let conn = rusqlite::Connection::open(dir.join("counters.sqlite3")).unwrap();
    let kept: Vec<i64> = conn
        .prepare("SELECT n FROM first_days WHERE cid = 0")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(!kept.is_empty(), "{what}: no kept N");
    let counters: Vec<(i64, i64, String)> = conn
        .prepare(
            "SELECT c.cid, coalesce(t.published_ms, c.first_ts), c.uuid FROM counters c
             LEFT JOIN targets t ON t.entity = c.entity AND t.uuid = c.uuid",
        )
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let mut want: BTreeMap<(i64, i64), (i128, i64, String)> = BTreeMap::new();
    let mut buckets = conn
        .prepare("SELECT day, value FROM buckets WHERE cid = ?1")
        .unwrap();
    for (cid, published, uuid) in counters {
        let pday = published.div_euclid(DAY_MS);
        let days: Vec<(i64, i64)> = buckets
            .query_map([cid], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        for &n in &kept {
            let inside: Vec<i64> = days
                .iter()
                .filter(|(d, _)| *d >= pday && *d < pday + n)
                .map(|(_, v)| *v)
                .collect();
            if !inside.is_empty() {
                let sum = inside.iter().map(|v| i128::from(*v)).sum();
                want.insert((cid, n), (sum, pday, uuid.clone()));
            }
        }
    }
    let mut got: BTreeMap<(i64, i64), (i128, i64, String)> = BTreeMap::new();
    let rows: Vec<(i64, i64, i64, i64, i64, String)> = conn
        .prepare("SELECT cid, n, hi, lo, pday, uuid FROM first_days WHERE cid <> 0")
        .unwrap()
        .query_map([], |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
            ))
        })
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    for (cid, n, hi, lo, pday, uuid) in rows {
        let total = (i128::from(hi) << 62) + i128::from(lo);
        assert!((0..1 << 62).contains(&lo), "{what}: lo {lo} of {cid}");
        got.insert((cid, n), (total, pday, uuid));
    }
    assert_eq!(got, want, "{what}: kept rows");
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[tokio::test]
async fn kept_first_days_lists_equal_the_summed_statement_over_random_traffic() {
    let t = t0();
    let mut listed = 0;
    for seed in 1..=4u64 {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(common::test_now());
        let mut store = open(dir.path(), &clock);
        let mut kept: Vec<u32> = vec![3, 7, 30];
        // Built at open (`--milestone-days` given) for odd seeds, at the
        // first list (after the first round's writes) for even ones.
        if seed % 2 == 1 {
            store.set_milestone_days(&kept, true).unwrap();
        }
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let mut today = t;
        for round in 0..14 {
            today += [0, 1, 2, 5, 1, 9, 3][round % 7];
            set_day(&clock, today);
            for _ in 0..(1 + rng.below(4)) {
                let mut events = Vec::new();
                for _ in 0..rng.below(50) {
                    let uuid = format!("a{}", rng.below(30));
                    let back = match rng.below(5) {
                        0 => rng.below(4) as i64,
                        1 => rng.below(12) as i64,
                        2 => rng.below(45) as i64,
                        3 => rng.below(390) as i64,
                        _ => 0,
                    };
                    let delta = rng.below(21) as i64 - 6;
                    let category = match rng.below(4) {
                        0 => None,
                        k => Some(format!("k{}", k % 2)),
                    };
                    events.push(inc(&uuid, today - back, delta, category.as_deref()));
                }
                if !events.is_empty() {
                    write(&store, events).await;
                }
                match rng.below(10) {
                    // An admin sets, moves or clears a publication time; an
                    // event sets one where none is.
                    0 | 1 => {
                        let at = (today - rng.below(60) as i64) * DAY_MS + 5_000;
                        let sets = (0..(1 + rng.below(3)))
                            .map(|_| PublishedSet {
                                entity: "ARTICLE".into(),
                                uuid: format!("a{}", rng.below(34)),
                                at_ms: (rng.below(4) != 0).then_some(at),
                                replace: rng.below(3) != 0,
                            })
                            .collect();
                        store.set_published(sets).await.unwrap();
                    }
                    // A backfill of some days (also of a new counter).
                    2 => {
                        let sets = (0..(1 + rng.below(5)))
                            .map(|_| DaySet {
                                key: key(&format!("a{}", rng.below(33))),
                                day: today - rng.below(40) as i64,
                                value: rng.below(50) as i64 - 10,
                                category: (rng.below(2) == 0).then(|| Arc::from("k1")),
                            })
                            .collect();
                        store.set_days(sets, today - 400).await.unwrap();
                    }
                    3 => {
                        let set = CounterSet {
                            key: key(&format!("a{}", rng.below(33))),
                            value: rng.below(1000) as i64,
                            category: Some(Arc::from("k0")),
                            now_ms: today * DAY_MS,
                        };
                        store.set_value(set).await.unwrap();
                    }
                    4 => {
                        store
                            .delete(&key(&format!("a{}", rng.below(30))))
                            .await
                            .unwrap();
                    }
                    // An import sets some counters' days (also of a new
                    // counter, and earlier first touches).
                    5 => {
                        let counters = (0..(1 + rng.below(3)))
                            .map(|i| {
                                let back = rng.below(40) as i64;
                                CounterImport {
                                    key: key(&format!("a{}", 30 + i + rng.below(6))),
                                    before: 0,
                                    days: vec![
                                        Bucket {
                                            day: today - back,
                                            value: rng.below(30) as i64,
                                        },
                                        Bucket {
                                            day: today - back + 1 + rng.below(3) as i64,
                                            value: rng.below(30) as i64 - 5,
                                        },
                                    ],
                                    category: None,
                                    first_ms: (today - back) * DAY_MS,
                                    recorded_ms: today * DAY_MS,
                                    // A file without hours (format 4): the
                                    // days it sets are what the totals read.
                                    hours: None,
                                }
                            })
                            .collect();
                        let out = store
                            .import(ImportBatch {
                                counters,
                                averages: vec![],
                                days: vec![],
                                marks: vec![],
                                oldest_day: today - 400,
                            })
                            .await
                            .unwrap();
                        assert_eq!(out, ImportOutcome::Applied);
                    }
                    _ => {}
                }
            }
            listed += compare(&store, &kept, today, &format!("seed {seed} round {round}")).await;
            assert_rows_exact(dir.path(), &format!("seed {seed} round {round}"));
            match round {
                // A restart; then one with another `--milestone-days`.
                4 | 9 => {
                    drop(store);
                    store = open(dir.path(), &clock);
                    if round == 9 {
                        kept = vec![1, 7, 12];
                        store.set_milestone_days(&kept, false).unwrap();
                    }
                    listed += compare(
                        &store,
                        &kept,
                        today,
                        &format!("seed {seed} reopened {round}"),
                    )
                    .await;
                }
                _ => {}
            }
        }
    }
    // The lists were not all empty.
    assert!(listed > 1000, "{listed}");
}

/// A first touch moved earlier by a backdated event moves the window of a
/// target without a set publication; setting one moves it again, clearing
/// it moves it back; a backfill inside the window and a bucket's decrement
/// to 0 keep the counter listed (a bucket is inside), its deletion does not.
#[tokio::test]
async fn publication_moves_and_backdated_first_touches_resum_the_totals() {
    let t = t0();
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(common::test_now());
    set_day(&clock, t);
    let store = open(dir.path(), &clock);
    let list = |days: u32| {
        let store = &store;
        async move {
            let q = query(days, None, 10, t - 400);
            let got = store.top_first_days(&q).await.unwrap().entries;
            assert_eq!(got, store.top_first_days_by_walk(&q).await.unwrap());
            got.into_iter()
                .map(|e| (e.uuid, e.value))
                .collect::<Vec<_>>()
        }
    };
    let pair = |u: &str, v: i128| (u.to_string(), v);
    write(&store, vec![inc("a", t - 2, 5, None), inc("a", t, 7, None)]).await;
    assert_eq!(list(3).await, vec![pair("a", 12)]);
    // A backdated event: the first touch is ten days back.
    write(&store, vec![inc("a", t - 10, 1, None)]).await;
    assert_eq!(list(3).await, vec![pair("a", 1)]);
    assert_eq!(list(30).await, vec![pair("a", 13)]);
    let set = |at_ms: Option<i64>| {
        vec![PublishedSet {
            entity: "ARTICLE".into(),
            uuid: "a".into(),
            at_ms,
            replace: true,
        }]
    };
    store
        .set_published(set(Some((t - 2) * DAY_MS + 1)))
        .await
        .unwrap();
    assert_eq!(list(3).await, vec![pair("a", 12)]);
    store.set_published(set(None)).await.unwrap();
    assert_eq!(list(3).await, vec![pair("a", 1)]);
    // A decrement to 0 on the only day inside: listed with 0.
    write(&store, vec![inc("a", t - 10, -1, None)]).await;
    assert_eq!(list(3).await, vec![pair("a", 0)]);
    // A backfill inside the window.
    let day = |d: i64, value: i64| DaySet {
        key: key("a"),
        day: d,
        value,
        category: None,
    };
    store.set_days(vec![day(t - 9, 40)], t - 400).await.unwrap();
    assert_eq!(list(3).await, vec![pair("a", 40)]);
    assert!(store.delete(&key("a")).await.unwrap());
    assert_eq!(list(3).await, vec![]);
}

/// Buckets that sum past i64 inside a window (a negative day outside it
/// keeps the counter's value in range) are ordered and answered exactly.
#[tokio::test]
async fn totals_past_i64_are_exact() {
    let t = t0();
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(common::test_now());
    set_day(&clock, t);
    let store = open(dir.path(), &clock);
    let big = i64::MAX / 2 + 7;
    assert!(write(&store, vec![inc("a", t - 5, -big, None)]).await);
    assert!(
        write(
            &store,
            vec![inc("a", t - 1, big, None), inc("a", t, big, None)]
        )
        .await
    );
    assert!(write(&store, vec![inc("b", t - 1, i64::MAX, None)]).await);
    // Publications two days back: the window [t - 1, t] of 3 days holds
    // both big days of `a`.
    let sets = ["a", "b"]
        .iter()
        .map(|u| PublishedSet {
            entity: "ARTICLE".into(),
            uuid: u.to_string(),
            at_ms: Some((t - 1) * DAY_MS),
            replace: true,
        })
        .collect();
    store.set_published(sets).await.unwrap();
    let q = query(3, None, 10, t - 400);
    let got = store.top_first_days(&q).await.unwrap().entries;
    assert_eq!(got, store.top_first_days_by_walk(&q).await.unwrap());
    let values: Vec<(String, i128)> = got.into_iter().map(|e| (e.uuid, e.value)).collect();
    assert_eq!(
        values,
        vec![
            ("a".to_string(), 2 * i128::from(big)),
            ("b".to_string(), i128::from(i64::MAX))
        ]
    );
    // Taken back below: the pair of integers carries down again.
    assert!(
        write(
            &store,
            vec![inc("a", t, -big, None), inc("a", t, -big, None)]
        )
        .await
    );
    let got = store.top_first_days(&q).await.unwrap().entries;
    assert_eq!(got, store.top_first_days_by_walk(&q).await.unwrap());
    assert_eq!(got[1].value, 0);
}

/// Days that leave the retention: a window straddling the oldest day kept
/// is answered over its kept days, as the statement answers it, before and
/// after the background deletes the old buckets (which brings the rows
/// down to what the lists already said); a window wholly before it is
/// not listed.
#[tokio::test]
async fn windows_straddling_the_retention_read_only_kept_days() {
    let t = t0();
    let retention = i64::from(TimePolicy::default().retention_days);
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(common::test_now());
    set_day(&clock, t);
    let store = open(dir.path(), &clock);
    let first = t - retention + 1; // still accepted on day t
    write(
        &store,
        vec![
            inc("a", first, 1, None),
            inc("a", first + 1, 10, None),
            inc("a", first + 2, 100, None),
            inc("b", first + 1, 50, None),
            inc("c", first, 7, None),
            inc("c", t, 3, None),
        ],
    )
    .await;
    let lists = |oldest: i64| {
        let store = &store;
        async move {
            let mut out = Vec::new();
            for days in [3, 7] {
                let q = query(days, None, 10, oldest);
                let got = store.top_first_days(&q).await.unwrap().entries;
                assert_eq!(
                    got,
                    store.top_first_days_by_walk(&q).await.unwrap(),
                    "{q:?}"
                );
                out.push(
                    got.into_iter()
                        .map(|e| (e.uuid, e.value))
                        .collect::<Vec<_>>(),
                );
            }
            out
        }
    };
    let pair = |u: &str, v: i128| (u.to_string(), v);
    assert_eq!(
        lists(first).await,
        vec![
            vec![pair("a", 111), pair("b", 50), pair("c", 7)],
            vec![pair("a", 111), pair("b", 50), pair("c", 7)]
        ]
    );
    // Two days on, `first` is past the retention (the oldest day kept is
    // `first + 1`): `a` straddles it, `c`'s one bucket in its windows left.
    set_day(&clock, t + 2);
    let oldest = day_of(TimePolicy::default().oldest_accepted(clock.clock().now()));
    assert_eq!(oldest, first + 1);
    let want = vec![
        vec![pair("a", 110), pair("b", 50)],
        vec![pair("a", 110), pair("b", 50)],
    ];
    assert_eq!(lists(oldest).await, want);
    // The background deletes the days before the oldest kept.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let conn = rusqlite::Connection::open(dir.path().join("counters.sqlite3")).unwrap();
        let old: i64 = conn
            .query_row(
                "SELECT count(*) FROM buckets WHERE day < ?1",
                [oldest],
                |r| r.get(0),
            )
            .unwrap();
        if old == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{old} old buckets are still there"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(lists(oldest).await, want);
    assert_rows_exact(dir.path(), "after the retention");
}

/// A database of the taken-back schema 9 (kept totals of triggers) loses
/// its triggers and tables when it opens, gets its totals built from its
/// buckets at its first list, and its lists are the statement's from then
/// on.
#[tokio::test]
async fn a_schema_9_database_loses_its_triggers_and_gets_totals_at_its_first_list() {
    let t = t0();
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(common::test_now());
    set_day(&clock, t);
    {
        let store = open(dir.path(), &clock);
        for i in 0..40i64 {
            let u = format!("a{i}");
            write(
                &store,
                vec![
                    inc(&u, t - i % 9, i + 1, None),
                    inc(&u, t - i % 5, 2 * i, None),
                ],
            )
            .await;
        }
    }
    {
        let conn = rusqlite::Connection::open(dir.path().join("counters.sqlite3")).unwrap();
        // What the taken-back build of schema 9 left: a table of kept N,
        // its totals of another shape, and triggers that write them.
        conn.execute_batch(
            "CREATE TABLE first_days_n (n INTEGER PRIMARY KEY);
             CREATE TABLE first_days (cid INTEGER, n INTEGER, nb INTEGER NOT NULL,
                                      PRIMARY KEY (cid, n)) WITHOUT ROWID;
             CREATE TRIGGER first_days_bucket_in AFTER INSERT ON buckets BEGIN
                 INSERT INTO first_days_n (n) VALUES (new.day);
             END;
             PRAGMA user_version = 9;",
        )
        .unwrap();
    }
    let store = open(dir.path(), &clock);
    let left: i64 = rusqlite::Connection::open(dir.path().join("counters.sqlite3"))
        .unwrap()
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE name LIKE 'first_days%'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(left, 0, "schema 9's triggers and tables are dropped");
    write(&store, vec![inc("late", t, 4, None)]).await;
    let rows = compare(&store, &[3, 7, 30], t, "upgraded").await;
    assert!(rows > 100, "{rows}");
    assert_rows_exact(dir.path(), "upgraded");
}

/// A read does not hold a large store's writes to build the totals: past
/// 20,000 counters, the first list of a kept N sums the buckets (the same
/// answer) and leaves the store without the table; a store at the bound
/// builds it.
#[tokio::test]
async fn a_large_store_sums_its_first_list_instead_of_building_the_totals() {
    let t = t0();
    for (counters, builds) in [(20_000i64, true), (20_001, false)] {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(common::test_now());
        set_day(&clock, t);
        let store = open(dir.path(), &clock);
        let events: Vec<Increment> = (0..counters)
            .map(|i| inc(&format!("c{i:05}"), t - i % 4, 1 + i % 97, None))
            .collect();
        assert!(write(&store, events).await);
        let q = query(3, None, 10, t - 400);
        let got = store.top_first_days(&q).await.unwrap().entries;
        assert_eq!(got, store.top_first_days_by_walk(&q).await.unwrap());
        assert_eq!(got.len(), 10);
        let tables: i64 = rusqlite::Connection::open(dir.path().join("counters.sqlite3"))
            .unwrap()
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE name = 'first_days'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(tables, i64::from(builds), "{counters} counters");
    }
}
