//! The embedded store's change log: a flush logs the deltas of counters
//! that exist instead of updating their rows, and the fold brings the rows
//! up to date later. These tests hold the fold (`SqliteStore::fold_hold`)
//! so that reads happen while deltas are logged and not folded, and check
//! that every read is exact then, that overflow is refused per request
//! against the state the log implies, and that a crash with deltas in the
//! log loses none of them (the next open folds them before any read).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use counter_gateway::domain::{day_of, CounterKey, DaySet, Increment, Kind, ManualClock, Window};
use counter_gateway::store::sqlite::{Durability, SqliteStore};
use counter_gateway::store::{
    Bucket, DaysOutcome, RequestOutcome, StaleQuery, Store, TopQuery, WriteBatch,
};

#[path = "common/mod.rs"]
mod common;

const DB: &str = "counters.sqlite3";

fn today() -> i64 {
    day_of(common::test_now())
}

fn open(dir: &Path) -> SqliteStore {
    SqliteStore::open(
        dir,
        Durability::Relaxed,
        Duration::from_secs(3600),
        400,
        ManualClock::new(common::test_now()).clock(),
    )
    .unwrap()
}

fn key(uuid: &str) -> CounterKey {
    CounterKey::new("VIDEO", "VIEW", uuid).unwrap()
}

fn inc(uuid: &str, day: i64, delta: i64) -> Increment {
    Increment {
        key: key(uuid),
        delta,
        category: None,
        ts_ms: day * 86_400_000 + 5_000,
        day,
        id: None,
        unique: None,
        kind: Kind::Counter,
    }
}

async fn apply(store: &SqliteStore, requests: Vec<Vec<Increment>>) -> Vec<RequestOutcome> {
    store
        .apply(WriteBatch {
            requests,
            wanted: HashSet::new(),
        })
        .await
        .unwrap()
        .requests
}

/// `counters.value` of a uuid and the log rows, read from the file itself.
fn raw(dir: &Path, uuid: &str) -> (Option<i64>, i64) {
    let conn = rusqlite::Connection::open(dir.join(DB)).unwrap();
    let value = conn
        .query_row("SELECT value FROM counters WHERE uuid = ?1", [uuid], |r| {
            r.get(0)
        })
        .ok();
    let log: i64 = conn
        .query_row("SELECT count(*) FROM counter_log", [], |r| r.get(0))
        .unwrap();
    (value, log)
}

/// The database as a crash at this moment leaves it: its file and its
/// write-ahead log, copied while the store is open and idle.
fn crash_copy(from: &Path, to: &Path) {
    for name in [DB.to_string(), format!("{DB}-wal")] {
        let src = from.join(&name);
        if src.exists() {
            std::fs::copy(&src, to.join(&name)).unwrap();
        }
    }
}

fn window(from: i64, to: i64) -> Window {
    Window {
        from_day: from,
        to_day: to,
    }
}

/// Reads of single counters, of many, of a target and of a histogram, and
/// top lists, see deltas that are logged and not folded; reports fold first.
#[tokio::test]
async fn reads_between_a_flush_and_its_fold_are_exact() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    store.fold_hold().hold();
    let t = today();
    apply(&store, vec![vec![inc("a", t, 1), inc("b", t - 1, 10)]]).await;
    // Existing counters from here on: their deltas are logged.
    apply(&store, vec![vec![inc("a", t, 2), inc("a", t - 2, 4)]]).await;
    apply(&store, vec![vec![inc("b", t, -3)], vec![inc("a", t, 5)]]).await;
    let (row, log) = raw(dir.path(), "a");
    assert_eq!(
        (row, log),
        (Some(1), 2),
        "a's deltas are in the log, not its row"
    );

    let a = store.get(&key("a")).await.unwrap().unwrap();
    assert_eq!(a.value, 12);
    let many = store
        .get_many(&[key("b"), key("x"), key("a")])
        .await
        .unwrap();
    let values: Vec<Option<i64>> = many.iter().map(|c| c.as_ref().map(|c| c.value)).collect();
    assert_eq!(values, [Some(7), None, Some(12)]);
    let target = store.target_counters("VIDEO", "a").await.unwrap();
    assert_eq!(target.len(), 1);
    assert_eq!(target[0].value, 12);
    let hist = store
        .histogram(&key("a"), window(t - 6, t))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        hist,
        [
            Bucket {
                day: t - 2,
                value: 4
            },
            Bucket { day: t, value: 8 }
        ]
    );
    assert_eq!(
        raw(dir.path(), "a"),
        (Some(1), 2),
        "reads of one counter fold nothing"
    );

    // Lists answer without folding: the rows merged with memory's values
    // of the counters whose rows miss deltas.
    let top = store
        .top(&TopQuery {
            entity: "VIDEO".into(),
            action: "VIEW".into(),
            window: None,
            category: None,
            size: 10,
        })
        .await
        .unwrap();
    let listed: Vec<(String, i128)> = top
        .entries
        .iter()
        .map(|e| (e.uuid.clone(), e.value))
        .collect();
    assert_eq!(listed, [("a".to_string(), 12), ("b".to_string(), 7)]);
    assert_eq!(raw(dir.path(), "a"), (Some(1), 2), "lists fold nothing");

    // The stale report folds first, then reads the rows; windowed lists
    // are exact without folding, as all-time ones.
    apply(&store, vec![vec![inc("b", t, 100)]]).await;
    let stale = store
        .stale(&StaleQuery {
            entity: None,
            action: None,
            before_ms: i64::MAX,
            after: None,
            limit: 10,
        })
        .await
        .unwrap();
    let b = stale.iter().find(|c| &*c.key.uuid == "b").unwrap();
    assert_eq!(b.value, 107);
    assert_eq!(raw(dir.path(), "a"), (Some(12), 0));
    assert_eq!(raw(dir.path(), "b"), (Some(107), 0));
    apply(&store, vec![vec![inc("a", t, 1000)]]).await;
    let week = store
        .top(&TopQuery {
            entity: "VIDEO".into(),
            action: "VIEW".into(),
            window: Some(window(t - 6, t)),
            category: None,
            size: 10,
        })
        .await
        .unwrap();
    let listed: Vec<(String, i128)> = week
        .entries
        .iter()
        .map(|e| (e.uuid.clone(), e.value))
        .collect();
    assert_eq!(listed, [("a".to_string(), 1012), ("b".to_string(), 107)]);
}

/// A crash leaves deltas in the log: the next open folds them before it
/// answers anything, so the counters, their buckets and the windows hold
/// every acknowledged increment, once.
#[tokio::test]
async fn a_crash_with_deltas_in_the_log_loses_none_of_them() {
    let dir = tempfile::tempdir().unwrap();
    let copy = tempfile::tempdir().unwrap();
    let t = today();
    {
        let store = open(dir.path());
        store.fold_hold().hold();
        apply(&store, vec![vec![inc("a", t, 1), inc("b", t, 1)]]).await;
        for i in 0..20 {
            apply(
                &store,
                vec![vec![inc("a", t - (i % 3), 2), inc("b", t, -1)]],
            )
            .await;
        }
        assert_eq!(raw(dir.path(), "a"), (Some(1), 20));
        crash_copy(dir.path(), copy.path());
    }
    let (row, log) = raw(copy.path(), "a");
    assert_eq!((row, log), (Some(1), 20), "the copy holds the log unfolded");
    let store = open(copy.path());
    assert_eq!(raw(copy.path(), "a"), (Some(41), 0), "folded at open");
    assert_eq!(raw(copy.path(), "b"), (Some(-19), 0));
    let hist = store
        .histogram(&key("a"), window(t - 6, t))
        .await
        .unwrap()
        .unwrap();
    let by_day: Vec<(i64, i64)> = hist.iter().map(|b| (b.day, b.value)).collect();
    assert_eq!(by_day, [(t - 2, 12), (t - 1, 14), (t, 15)]);
    store.catch_up().await.unwrap();
    let week = store
        .top(&TopQuery {
            entity: "VIDEO".into(),
            action: "VIEW".into(),
            window: Some(window(t - 6, t)),
            category: None,
            size: 10,
        })
        .await
        .unwrap();
    let listed: Vec<(String, i128)> = week
        .entries
        .iter()
        .map(|e| (e.uuid.clone(), e.value))
        .collect();
    assert_eq!(listed, [("a".to_string(), 41), ("b".to_string(), -19)]);
}

/// Overflow is checked against the state the log implies, not the stale
/// row: a request that would take a counter, or one of its day buckets,
/// outside i64 is refused, alone, and the requests around it land.
#[tokio::test]
async fn overflow_is_refused_per_request_with_deltas_in_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    store.fold_hold().hold();
    let t = today();
    let max = i64::MAX;
    apply(&store, vec![vec![inc("a", t, 0)]]).await;
    apply(&store, vec![vec![inc("a", t, max - 10)]]).await;
    assert_eq!(raw(dir.path(), "a"), (Some(0), 1));
    let out = apply(
        &store,
        vec![
            vec![inc("a", t, 11)],
            vec![inc("a", t, 10)],
            vec![inc("a", t, 1), inc("c", t, 1)],
            vec![inc("a", t, -5), inc("c", t, 2)],
        ],
    )
    .await;
    assert_eq!(
        out,
        [
            RequestOutcome::Overflow { key: key("a") },
            RequestOutcome::Applied { duplicates: 0 },
            RequestOutcome::Overflow { key: key("a") },
            RequestOutcome::Applied { duplicates: 0 },
        ]
    );
    assert_eq!(store.get(&key("a")).await.unwrap().unwrap().value, max - 5);
    assert_eq!(store.get(&key("c")).await.unwrap().unwrap().value, 2);

    // A counter in range whose day bucket would leave it: b is -MAX on one
    // day and MAX on another, 0 in all; one more on the second day is refused.
    apply(&store, vec![vec![inc("b", t - 1, -max)]]).await;
    apply(&store, vec![vec![inc("b", t, max)]]).await;
    let out = apply(&store, vec![vec![inc("b", t, 1)], vec![inc("b", t - 1, 1)]]).await;
    assert_eq!(
        out,
        [
            RequestOutcome::Overflow { key: key("b") },
            RequestOutcome::Applied { duplicates: 0 },
        ]
    );
    let b = store.get(&key("b")).await.unwrap().unwrap();
    assert_eq!(b.value, 1);
    store.fold_hold().release();
    store.catch_up().await.unwrap();
    assert_eq!(raw(dir.path(), "a"), (Some(max - 5), 0));
    assert_eq!(raw(dir.path(), "b"), (Some(1), 0));
    let hist = store
        .histogram(&key("b"), window(t - 1, t))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        hist,
        [
            Bucket {
                day: t - 1,
                value: 1 - max
            },
            Bucket { day: t, value: max }
        ]
    );
}

/// A delete and a backfill act on the folded rows: the log's deltas of the
/// counter are applied first, none is lost or applied again afterwards.
#[tokio::test]
async fn deletes_and_backfills_with_deltas_in_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    store.fold_hold().hold();
    let t = today();
    apply(&store, vec![vec![inc("a", t, 1), inc("b", t, 1)]]).await;
    apply(&store, vec![vec![inc("a", t, 5), inc("b", t - 1, 3)]]).await;
    assert!(store.delete(&key("a")).await.unwrap());
    assert!(store.get(&key("a")).await.unwrap().is_none());
    apply(&store, vec![vec![inc("a", t, 2)]]).await;
    assert_eq!(
        store.get(&key("a")).await.unwrap().unwrap().value,
        2,
        "a new counter starts afresh"
    );

    apply(&store, vec![vec![inc("b", t, 7)]]).await;
    let out = store
        .set_days(
            vec![DaySet {
                key: key("b"),
                day: t - 1,
                value: 10,
                category: None,
            }],
            t - 400,
        )
        .await
        .unwrap();
    let DaysOutcome::Applied { previous, counters } = out else {
        panic!("{out:?}");
    };
    assert_eq!(previous, [3]);
    assert_eq!(counters[&key("b")].value, 1 + 3 + 7 + 7);
    apply(&store, vec![vec![inc("b", t, 1)]]).await;
    let b = store.get(&key("b")).await.unwrap().unwrap();
    assert_eq!(b.value, 19);
    store.catch_up().await.unwrap();
    assert_eq!(raw(dir.path(), "b"), (Some(19), 0));
    assert_eq!(raw(dir.path(), "a"), (Some(2), 0));
}

/// A counter as the model keeps it.
#[derive(Clone, Debug, Default, PartialEq)]
struct Model {
    value: i64,
    category: Option<String>,
    first_ms: i64,
    recorded_ms: i64,
    days: BTreeMap<i64, i64>,
}

/// The effect of some events on the model's counters, or the first key
/// that would leave i64 (a counter or a day bucket).
fn applied(
    model: &HashMap<String, Model>,
    events: &[&Increment],
) -> Result<HashMap<String, Model>, String> {
    let mut next = model.clone();
    // In the order keys first come, the order the store checks them in.
    let mut order: Vec<String> = Vec::new();
    let mut sums: HashMap<String, (i128, BTreeMap<i64, i128>)> = HashMap::new();
    for e in events {
        if !sums.contains_key(&*e.key.uuid) {
            order.push(e.key.uuid.to_string());
        }
        let m = next.entry(e.key.uuid.to_string()).or_insert_with(|| Model {
            first_ms: i64::MAX,
            recorded_ms: i64::MIN,
            ..Model::default()
        });
        let s = sums.entry(e.key.uuid.to_string()).or_default();
        s.0 += i128::from(e.delta);
        *s.1.entry(e.day).or_default() += i128::from(e.delta);
        if let Some(c) = &e.category {
            m.category = Some(c.to_string());
        }
        m.first_ms = m.first_ms.min(e.ts_ms);
        m.recorded_ms = m.recorded_ms.max(e.ts_ms);
    }
    for uuid in order {
        let (delta, days) = &sums[&uuid];
        let (delta, days) = (*delta, days.clone());
        let m = next.get_mut(&uuid).unwrap();
        m.value = i64::try_from(i128::from(m.value) + delta).map_err(|_| uuid.clone())?;
        for (day, d) in days {
            let b = m.days.entry(day).or_default();
            *b = i64::try_from(i128::from(*b) + d).map_err(|_| uuid.clone())?;
        }
    }
    Ok(next)
}

/// What the store does with a flush, modelled: ids claimed in order (an id
/// already claimed is a duplicate); if the whole flush keeps every counter
/// and bucket in range, it lands; else each request is taken on its own,
/// in order, and refused if it alone would leave the range (its ids then
/// stay unclaimed).
fn model_flush(
    model: &mut HashMap<String, Model>,
    claimed: &mut HashSet<String>,
    requests: &[Vec<Increment>],
) -> Vec<RequestOutcome> {
    let fresh = |claimed: &mut HashSet<String>, events: &[Increment]| {
        let mut out = Vec::new();
        let mut dups = 0;
        for e in events {
            match &e.id {
                Some(id) if !claimed.insert(id.to_string()) => dups += 1,
                _ => out.push(e.clone()),
            }
        }
        (out, dups)
    };
    let mut all_claimed = claimed.clone();
    let mut all = Vec::new();
    let mut outcomes = Vec::new();
    for r in requests {
        let (f, dups) = fresh(&mut all_claimed, r);
        all.extend(f);
        outcomes.push(RequestOutcome::Applied { duplicates: dups });
    }
    if let Ok(next) = applied(model, &all.iter().collect::<Vec<_>>()) {
        *model = next;
        *claimed = all_claimed;
        return outcomes;
    }
    outcomes.clear();
    for r in requests {
        let mut mine = claimed.clone();
        let (f, dups) = fresh(&mut mine, r);
        match applied(model, &f.iter().collect::<Vec<_>>()) {
            Ok(next) => {
                *model = next;
                *claimed = mine;
                outcomes.push(RequestOutcome::Applied { duplicates: dups });
            }
            Err(uuid) => outcomes.push(RequestOutcome::Overflow { key: key(&uuid) }),
        }
    }
    outcomes
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

async fn compare(store: &SqliteStore, model: &HashMap<String, Model>, t: i64, when: &str) {
    for (uuid, m) in model {
        let c = store
            .get(&key(uuid))
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{when}: {uuid} missing"));
        let got = (c.value, c.category.clone(), c.first_ms, c.recorded_ms);
        let want = (m.value, m.category.clone(), m.first_ms, m.recorded_ms);
        assert_eq!(got, want, "{when}: {uuid}");
        let hist = store
            .histogram(&key(uuid), window(t - 10, t))
            .await
            .unwrap()
            .unwrap();
        let got: Vec<(i64, i64)> = hist.iter().map(|b| (b.day, b.value)).collect();
        let want: Vec<(i64, i64)> = m.days.iter().map(|(d, v)| (*d, *v)).collect();
        assert_eq!(got, want, "{when}: buckets of {uuid}");
    }
}

/// Random flushes over few counters (large deltas, so some overflow;
/// idempotency ids, some repeated; categories; several days), with folds,
/// crashes and reopenings at random moments: every read equals a model of
/// the documented rules, and so do the rows once folded.
#[tokio::test]
async fn random_flushes_folds_and_crashes_match_a_model() {
    let rounds: usize = std::env::var("STORE_LOG_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let t = today();
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let mut dirs = vec![tempfile::tempdir().unwrap()];
    let mut store = open(dirs[0].path());
    store.fold_hold().hold();
    let mut model: HashMap<String, Model> = HashMap::new();
    let mut claimed: HashSet<String> = HashSet::new();
    let big = [i64::MAX / 2, i64::MAX, i64::MIN / 2, i64::MIN + 1];
    for round in 0..rounds {
        let mut requests = Vec::new();
        for _ in 0..1 + rng.below(4) {
            let mut events = Vec::new();
            for _ in 0..1 + rng.below(5) {
                let day = t - rng.below(4) as i64;
                let delta = match rng.below(10) {
                    0 => big[rng.below(4) as usize],
                    1 => 0,
                    _ => rng.below(20) as i64 - 8,
                };
                events.push(Increment {
                    key: key(&format!("k{}", rng.below(8))),
                    delta,
                    category: match rng.below(4) {
                        0 => Some(Arc::from("news")),
                        1 => Some(Arc::from("sports")),
                        _ => None,
                    },
                    ts_ms: day * 86_400_000 + rng.below(86_400_000) as i64,
                    day,
                    id: (rng.below(3) == 0).then(|| Arc::from(format!("id{}", rng.below(40)))),
                    unique: None,
                    kind: Kind::Counter,
                });
            }
            requests.push(events);
        }
        let want = model_flush(&mut model, &mut claimed, &requests);
        let got = apply(&store, requests).await;
        assert_eq!(got, want, "round {round}");
        match rng.below(20) {
            0 => store.catch_up().await.unwrap(),
            1 => {
                // A crash now: the next store opens a copy of the files.
                let next = tempfile::tempdir().unwrap();
                crash_copy(dirs.last().unwrap().path(), next.path());
                drop(store);
                store = open(next.path());
                store.fold_hold().hold();
                dirs.push(next);
            }
            2 => store.fold_hold().release(),
            3 => store.fold_hold().hold(),
            _ => {}
        }
        if round % 10 == 0 {
            compare(&store, &model, t, &format!("round {round}")).await;
        }
    }
    compare(&store, &model, t, "the end").await;
    store.catch_up().await.unwrap();
    let dir = dirs.last().unwrap().path();
    let conn = rusqlite::Connection::open(dir.join(DB)).unwrap();
    for (uuid, m) in &model {
        let (value, category, first, recorded): (i64, Option<String>, i64, i64) = conn
            .query_row(
                "SELECT value, category, first_ts, recorded_ts FROM counters WHERE uuid = ?1",
                [uuid],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .unwrap();
        assert_eq!(
            (value, category, first, recorded),
            (m.value, m.category.clone(), m.first_ms, m.recorded_ms),
            "folded row of {uuid}"
        );
    }
    let log: i64 = conn
        .query_row("SELECT count(*) FROM counter_log", [], |r| r.get(0))
        .unwrap();
    assert_eq!(log, 0);
}
