//! The embedded store's kept totals of the named windows (`last_day`,
//! `last_week`, `last_month`, `last_year`) against a model that sums day
//! buckets the way src/store/README.md ("Time windows") defines windowed lists:
//! the counters with at least one bucket in the window, by their sum there
//! descending, ties by uuid. The store is given a manual clock, so midnight is
//! crossed (and the clock stepped back) exactly where a test says, on whatever
//! date the test starts from: `common::test_now()`, which the gate sets to a
//! month's last day, 31 December, 29 February and a second before midnight.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use counter_gateway::domain::{
    day_of, CounterKey, Increment, Kind, ManualClock, TimePolicy, Window,
};
use counter_gateway::store::sqlite::{Durability, SqliteStore};
use counter_gateway::store::{RequestOutcome, Store, TopEntry, TopQuery, WriteBatch};

#[path = "common/mod.rs"]
mod common;

const LENGTHS: [i64; 4] = [1, 7, 30, 365];

/// The day the tests start on: `test_now()`'s.
fn t0() -> i64 {
    day_of(common::test_now())
}

/// The store's clock, moved a whole day at a time (keeping the time of day
/// of `test_now()`) or anywhere.
struct Days(ManualClock);

impl Days {
    fn set_day(&self, day: i64) {
        self.0
            .set(common::test_now() + chrono::Duration::days(day - t0()));
    }
}

/// A store whose clock stands on `day`.
fn open(dir: &std::path::Path, day: i64) -> (SqliteStore, Days) {
    let days = Days(ManualClock::new(common::test_now()));
    days.set_day(day);
    let store = SqliteStore::open(
        dir,
        Durability::Relaxed,
        Duration::from_secs(3600),
        TimePolicy::default().retention_days,
        days.0.clock(),
    )
    .unwrap();
    (store, days)
}

fn inc(uuid: &str, day: i64, delta: i64, category: Option<&str>) -> Increment {
    Increment {
        key: CounterKey::new("VIDEO", "VIEW", uuid).unwrap(),
        delta,
        category: category.map(Arc::from),
        ts_ms: day * 86_400_000 + 1_000,
        day,
        id: None,
        kind: Kind::Counter,
        unique: None,
    }
}

async fn write(store: &SqliteStore, events: Vec<Increment>) {
    let out = store
        .apply(WriteBatch {
            requests: vec![events],
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(matches!(out.requests[0], RequestOutcome::Applied { .. }));
}

/// A named-window top list, after the store wrote every total memory held
/// back to its tables and brought them to today, so that `kept_rows` sees
/// them (the list is exact either way).
async fn top(store: &SqliteStore, len: i64, category: Option<&str>, size: usize) -> Vec<TopEntry> {
    store.catch_up().await.unwrap();
    let today = store.today();
    store
        .top(&TopQuery {
            entity: "VIDEO".into(),
            action: "VIEW".into(),
            window: Some(Window {
                from_day: today - len + 1,
                to_day: today,
            }),
            category: category.map(String::from),
            size,
        })
        .await
        .unwrap()
        .entries
}

fn pairs(entries: &[TopEntry]) -> Vec<(String, i128)> {
    entries.iter().map(|e| (e.uuid.clone(), e.value)).collect()
}

fn list(items: &[(&str, i128)]) -> Vec<(String, i128)> {
    items.iter().map(|(u, v)| (u.to_string(), *v)).collect()
}

/// Rows the store keeps for window `len` in its current table: proves an
/// answer came from the kept totals (they would be empty if only buckets
/// were summed).
fn kept_rows(dir: &std::path::Path, len: i64) -> i64 {
    let conn = rusqlite::Connection::open(dir.join("counters.sqlite3")).unwrap();
    let parity: usize = conn
        .query_row("SELECT parity FROM windows_state", [], |r| r.get(0))
        .unwrap();
    let table = ["windows_a", "windows_b"][parity];
    let column = ["d_hi", "w_hi", "m_hi", "y_hi"][LENGTHS.iter().position(|l| *l == len).unwrap()];
    conn.query_row(
        &format!("SELECT count(*) FROM {table} WHERE {column} IS NOT NULL"),
        [],
        |r| r.get(0),
    )
    .unwrap()
}

#[tokio::test]
async fn windows_move_at_midnight() {
    let t = t0();
    let dir = tempfile::tempdir().unwrap();
    let (store, clock) = open(dir.path(), t);
    write(
        &store,
        vec![
            inc("a", t - 6, 5, None),
            inc("a", t, 1, None),
            inc("b", t - 7, 100, None),
            inc("c", t, 3, None),
            inc("d", t - 29, 7, None),
            inc("e", t - 364, 9, None),
            inc("e", t - 365, 1000, None),
        ],
    )
    .await;
    assert_eq!(
        pairs(&top(&store, 1, None, 10).await),
        list(&[("c", 3), ("a", 1)])
    );
    assert_eq!(
        pairs(&top(&store, 7, None, 10).await),
        list(&[("a", 6), ("c", 3)])
    );
    assert_eq!(
        pairs(&top(&store, 30, None, 10).await),
        list(&[("b", 100), ("d", 7), ("a", 6), ("c", 3)])
    );
    assert_eq!(
        pairs(&top(&store, 365, None, 10).await),
        list(&[("b", 100), ("e", 9), ("d", 7), ("a", 6), ("c", 3)])
    );
    assert_eq!(kept_rows(dir.path(), 365), 5);

    clock.set_day(t + 1);
    assert_eq!(pairs(&top(&store, 1, None, 10).await), list(&[]));
    assert_eq!(
        pairs(&top(&store, 7, None, 10).await),
        list(&[("c", 3), ("a", 1)])
    );
    assert_eq!(
        pairs(&top(&store, 30, None, 10).await),
        list(&[("b", 100), ("a", 6), ("c", 3)])
    );
    assert_eq!(
        pairs(&top(&store, 365, None, 10).await),
        list(&[("b", 100), ("d", 7), ("a", 6), ("c", 3)])
    );
    // Far ahead: every window is empty.
    clock.set_day(t + 1000);
    for len in LENGTHS {
        assert_eq!(pairs(&top(&store, len, None, 10).await), list(&[]), "{len}");
    }
}

#[tokio::test]
async fn a_bucket_dated_ahead_enters_when_its_day_comes() {
    let t = t0();
    let dir = tempfile::tempdir().unwrap();
    let (store, clock) = open(dir.path(), t);
    // Within the clock skew an event may land on tomorrow.
    write(&store, vec![inc("x", t + 1, 4, None), inc("y", t, 2, None)]).await;
    assert_eq!(pairs(&top(&store, 1, None, 10).await), list(&[("y", 2)]));
    assert_eq!(pairs(&top(&store, 7, None, 10).await), list(&[("y", 2)]));
    clock.set_day(t + 1);
    assert_eq!(pairs(&top(&store, 1, None, 10).await), list(&[("x", 4)]));
    assert_eq!(
        pairs(&top(&store, 7, None, 10).await),
        list(&[("x", 4), ("y", 2)])
    );
}

#[tokio::test]
async fn zero_and_negative_totals_stay_while_a_bucket_is_in_the_window() {
    let t = t0();
    let dir = tempfile::tempdir().unwrap();
    let (store, clock) = open(dir.path(), t);
    write(
        &store,
        vec![
            inc("zero", t - 1, 5, None),
            inc("neg", t - 2, -3, None),
            inc("pos", t - 8, 1, None),
        ],
    )
    .await;
    write(&store, vec![inc("zero", t - 1, -5, None)]).await;
    assert_eq!(
        pairs(&top(&store, 7, None, 10).await),
        list(&[("zero", 0), ("neg", -3)])
    );
    clock.set_day(t + 5);
    assert_eq!(pairs(&top(&store, 7, None, 10).await), list(&[("zero", 0)]));
    clock.set_day(t + 6);
    assert_eq!(pairs(&top(&store, 7, None, 10).await), list(&[]));
    assert_eq!(kept_rows(dir.path(), 7), 0);
}

#[tokio::test]
async fn ties_by_uuid_and_categories_by_the_current_one() {
    let t = t0();
    let dir = tempfile::tempdir().unwrap();
    let (store, _clock) = open(dir.path(), t);
    write(
        &store,
        vec![
            inc("b", t, 2, Some("sports")),
            inc("a", t, 2, Some("news")),
            inc("c", t, 2, Some("sports")),
            inc("d", t - 3, 1, Some("sports")),
        ],
    )
    .await;
    assert_eq!(
        pairs(&top(&store, 7, None, 10).await),
        list(&[("a", 2), ("b", 2), ("c", 2), ("d", 1)])
    );
    assert_eq!(
        pairs(&top(&store, 7, None, 2).await),
        list(&[("a", 2), ("b", 2)])
    );
    assert_eq!(
        pairs(&top(&store, 7, Some("sports"), 10).await),
        list(&[("b", 2), ("c", 2), ("d", 1)])
    );
    // A counter's category is its latest: the lists follow it.
    write(&store, vec![inc("a", t - 40, 0, Some("sports"))]).await;
    let sports = top(&store, 7, Some("sports"), 10).await;
    assert_eq!(
        pairs(&sports),
        list(&[("a", 2), ("b", 2), ("c", 2), ("d", 1)])
    );
    assert!(sports
        .iter()
        .all(|e| e.category.as_deref() == Some("sports")));
    assert_eq!(pairs(&top(&store, 7, Some("news"), 10).await), list(&[]));
}

#[tokio::test]
async fn deleted_counters_leave_every_window_and_a_new_one_starts_afresh() {
    let t = t0();
    let dir = tempfile::tempdir().unwrap();
    let (store, _clock) = open(dir.path(), t);
    write(&store, vec![inc("a", t, 5, None), inc("z", t, 7, None)]).await;
    assert_eq!(
        pairs(&top(&store, 7, None, 10).await),
        list(&[("z", 7), ("a", 5)])
    );
    // Logged but not yet folded when the counter goes: `z` holds the
    // largest cid, which SQLite hands to the next new counter.
    write(&store, vec![inc("z", t - 1, 100, None)]).await;
    assert!(store
        .delete(&CounterKey::new("VIDEO", "VIEW", "z").unwrap())
        .await
        .unwrap());
    write(&store, vec![inc("n", t, 1, None)]).await;
    for len in LENGTHS {
        assert_eq!(
            pairs(&top(&store, len, None, 10).await),
            list(&[("a", 5), ("n", 1)]),
            "{len}"
        );
    }
}

#[tokio::test]
async fn a_database_without_window_totals_is_back_filled_at_open() {
    let t = t0();
    let dir = tempfile::tempdir().unwrap();
    {
        let (store, _clock) = open(dir.path(), t);
        write(
            &store,
            vec![inc("a", t, 5, None), inc("b", t - 10, 8, None)],
        )
        .await;
    }
    // What a schema-2 database looks like: no totals.
    let conn = rusqlite::Connection::open(dir.path().join("counters.sqlite3")).unwrap();
    conn.execute_batch(
        "DROP TABLE windows_a; DROP TABLE windows_b; DROP TABLE windows_state;
         DROP TABLE windows_dirty; PRAGMA user_version = 2;",
    )
    .unwrap();
    drop(conn);
    let (store, _clock) = open(dir.path(), t);
    assert_eq!(kept_rows(dir.path(), 30), 2);
    assert_eq!(pairs(&top(&store, 7, None, 10).await), list(&[("a", 5)]));
    assert_eq!(
        pairs(&top(&store, 30, None, 10).await),
        list(&[("b", 8), ("a", 5)])
    );
}

/// More counters on one day than a chunk of the copy of the day after
/// takes, so the day that leaves is subtracted in several chunks.
#[tokio::test]
async fn a_day_of_many_counters_rolls_in_chunks() {
    let t = t0();
    let dir = tempfile::tempdir().unwrap();
    let (store, clock) = open(dir.path(), t);
    let n = 45_000;
    let events = (0..n)
        .map(|i| inc(&format!("u{i:05}"), t - 6, 1 + (i % 7), None))
        .chain([inc("keep", t, 3, None)])
        .collect();
    write(&store, events).await;
    assert_eq!(top(&store, 7, None, 1000).await.len(), 1000);
    assert_eq!(kept_rows(dir.path(), 7), n + 1);
    clock.set_day(t + 1);
    assert_eq!(pairs(&top(&store, 7, None, 10).await), list(&[("keep", 3)]));
    assert_eq!(kept_rows(dir.path(), 7), 1);
    let month = top(&store, 30, None, 3).await;
    assert_eq!(
        pairs(&month),
        list(&[("u00006", 7), ("u00013", 7), ("u00020", 7)])
    );
}

/// A small deterministic generator (xorshift64*), so a failure names its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The model: buckets per counter and its latest category.
#[derive(Default)]
struct Model {
    buckets: HashMap<String, BTreeMap<i64, i64>>,
    category: HashMap<String, Option<String>>,
    /// Each counter's value (kept when the retention deletes old buckets).
    value: HashMap<String, i64>,
}

impl Model {
    fn top(&self, from: i64, to: i64, category: Option<&str>) -> Vec<(String, i128)> {
        let mut rows: Vec<(String, i128)> = self
            .buckets
            .iter()
            .filter(|(u, _)| category.is_none() || self.category[*u].as_deref() == category)
            .filter_map(|(u, b)| {
                let mut days = b.range(from..=to).peekable();
                days.peek()?;
                Some((u.clone(), days.map(|(_, v)| i128::from(*v)).sum()))
            })
            .collect();
        rows.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        rows
    }

    /// The all-time list: every counter by its value.
    fn all_time(&self, category: Option<&str>) -> Vec<(String, i128)> {
        let mut rows: Vec<(String, i128)> = self
            .value
            .iter()
            .filter(|(u, _)| category.is_none() || self.category[*u].as_deref() == category)
            .map(|(u, v)| (u.clone(), i128::from(*v)))
            .collect();
        rows.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        rows
    }
}

/// Random increments (negative too) across past, present and one future
/// day, categories that change, deletes, and day rolls of 1 to 400 days:
/// after every round each named window's list equals the model's sum over
/// buckets, with and without a category, and for a list cut short.
#[tokio::test]
async fn kept_totals_equal_summed_buckets_over_random_workloads() {
    let t = t0();
    for seed in 1..=6u64 {
        let dir = tempfile::tempdir().unwrap();
        let (store, clock) = open(dir.path(), t);
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let mut model = Model::default();
        let mut today = t;
        // The latest day the clock has shown: the kept totals never roll back.
        let mut latest = t;
        // Negative rolls: the clock stepped back (an NTP correction).
        let rolls = [0, 1, 1, 2, -1, 6, 7, 29, -3, 31, 1, 400, -2, 364, 1];
        for (round, roll) in rolls.into_iter().enumerate() {
            today += roll;
            latest = latest.max(today);
            clock.set_day(today);
            for _ in 0..(1 + rng.below(4)) {
                let mut events = Vec::new();
                for _ in 0..rng.below(60) {
                    let uuid = format!("c{}", rng.below(40));
                    let back = match rng.below(4) {
                        0 => rng.below(8) as i64,
                        1 => rng.below(32) as i64,
                        2 => rng.below(400) as i64,
                        _ => -1, // tomorrow, within the clock skew
                    };
                    let day = today - back;
                    let delta = rng.below(21) as i64 - 8;
                    let category = match rng.below(4) {
                        0 => None,
                        k => Some(format!("k{}", k % 2)),
                    };
                    let b = model.buckets.entry(uuid.clone()).or_default();
                    *b.entry(day).or_default() += delta;
                    let c = model.category.entry(uuid.clone()).or_default();
                    if category.is_some() {
                        *c = category.clone();
                    }
                    events.push(inc(&uuid, day, delta, category.as_deref()));
                }
                if !events.is_empty() {
                    write(&store, events).await;
                }
                if rng.below(5) == 0 {
                    let uuid = format!("c{}", rng.below(40));
                    let existed = model.buckets.remove(&uuid).is_some();
                    model.category.remove(&uuid);
                    let key = CounterKey::new("VIDEO", "VIEW", &uuid).unwrap();
                    assert_eq!(store.delete(&key).await.unwrap(), existed);
                }
            }
            for len in LENGTHS {
                for category in [None, Some("k0"), Some("k1")] {
                    let want = model.top(today - len + 1, today, category);
                    let got = pairs(&top(&store, len, category, 1000).await);
                    assert_eq!(
                        got, want,
                        "seed {seed} round {round} today {today} window {len} category {category:?}"
                    );
                    let got = pairs(&top(&store, len, category, 3).await);
                    assert_eq!(got, want[..want.len().min(3)], "seed {seed} round {round}");
                }
                // While the clock is behind the latest day it showed, the
                // lists above were summed from buckets; the kept totals stay
                // at that latest day, untouched, until the clock is back.
                let kept_day = latest;
                assert_eq!(
                    kept_rows(dir.path(), len),
                    model.top(kept_day - len + 1, kept_day, None).len() as i64,
                    "seed {seed} round {round} window {len}: rows kept"
                );
            }
        }
    }
}

/// The wall clock stepped back across midnight (an NTP correction): windowed
/// lists end on the clock's day and stay exact (summed from buckets while the
/// kept totals are ahead), nothing fails, and once the clock is forward again
/// the kept totals serve the lists as before.
#[tokio::test]
async fn a_clock_stepping_back_over_midnight_keeps_lists_exact() {
    let t = t0();
    let dir = tempfile::tempdir().unwrap();
    let (store, clock) = open(dir.path(), t);
    write(&store, vec![inc("a", t - 1, 5, None), inc("b", t, 2, None)]).await;
    assert_eq!(pairs(&top(&store, 1, None, 10).await), list(&[("b", 2)]));
    // Back to yesterday: last_day is yesterday's list.
    clock.set_day(t - 1);
    write(&store, vec![inc("c", t - 1, 1, None)]).await;
    assert_eq!(
        pairs(&top(&store, 1, None, 10).await),
        list(&[("a", 5), ("c", 1)])
    );
    assert_eq!(
        pairs(&top(&store, 7, None, 10).await),
        list(&[("a", 5), ("c", 1)]),
        "the week ending yesterday leaves out the day after it"
    );
    // Forward again: the kept totals (still anchored on `t`) answer.
    clock.set_day(t);
    assert_eq!(pairs(&top(&store, 1, None, 10).await), list(&[("b", 2)]));
    assert_eq!(
        pairs(&top(&store, 7, None, 10).await),
        list(&[("a", 5), ("b", 2), ("c", 1)])
    );
    assert_eq!(kept_rows(dir.path(), 7), 3);
}

/// Day buckets (of counters and of averages) at `day` or before, read from
/// the tables themselves: `interval=all` reaches back to the retention only.
fn rows_up_to(dir: &std::path::Path, table: &str, day: i64) -> i64 {
    let conn = rusqlite::Connection::open(dir.join("counters.sqlite3")).unwrap();
    conn.query_row(
        &format!("SELECT count(*) FROM {table} WHERE day <= ?1"),
        [day],
        |r| r.get(0),
    )
    .unwrap()
}

/// Issue 14 (retention): once the clock moves past the retention of a day,
/// the background deletes that day's buckets (of counters and of averages);
/// newer buckets, counter values and timestamps, and the window top lists
/// stay as they were.
#[tokio::test]
async fn buckets_past_the_retention_are_deleted_in_the_background() {
    let t = t0();
    let retention = i64::from(TimePolicy::default().retention_days);
    let dir = tempfile::tempdir().unwrap();
    let (store, clock) = open(dir.path(), t);
    let oldest = t - retention + 1; // still accepted on day t
    let sample = |uuid: &str, day: i64, value: i64| Increment {
        kind: Kind::Sample { quantity: 1 },
        ..inc(uuid, day, value, None)
    };
    write(
        &store,
        vec![
            inc("a", oldest, 1, None),
            inc("a", t - 300, 10, None),
            inc("a", t, 100, None),
            inc("b", oldest, 5, None),
            inc("b", t - 200, 50, None),
            inc("c", t - 350, 7, None),
        ],
    )
    .await;
    write(&store, vec![sample("s", oldest, 4), sample("s", t - 10, 6)]).await;
    let key = |u: &str| CounterKey::new("VIDEO", "VIEW", u).unwrap();
    let before: Vec<_> = {
        let mut v = Vec::new();
        for u in ["a", "b", "c"] {
            v.push(store.get(&key(u)).await.unwrap().unwrap());
        }
        v
    };
    assert_eq!(rows_up_to(dir.path(), "buckets", oldest), 2);
    assert_eq!(rows_up_to(dir.path(), "average_buckets", oldest), 1);

    // Fifty days on, `oldest` is past the retention; t - 350 is not.
    clock.set_day(t + 50);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while rows_up_to(dir.path(), "buckets", oldest) > 0
        || rows_up_to(dir.path(), "average_buckets", oldest) > 0
    {
        assert!(
            std::time::Instant::now() < deadline,
            "buckets past the retention are still there: {} of counters, {} of averages",
            rows_up_to(dir.path(), "buckets", oldest),
            rows_up_to(dir.path(), "average_buckets", oldest)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Only the expired day went.
    assert_eq!(rows_up_to(dir.path(), "buckets", t + 50), 4);
    assert_eq!(rows_up_to(dir.path(), "average_buckets", t + 50), 1);
    let all = Window {
        from_day: oldest - 10,
        to_day: t + 50,
    };
    let days = |b: Option<Vec<counter_gateway::store::Bucket>>| -> Vec<(i64, i64)> {
        b.unwrap().iter().map(|b| (b.day, b.value)).collect()
    };
    assert_eq!(
        days(store.histogram(&key("a"), all).await.unwrap()),
        vec![(t - 300, 10), (t, 100)]
    );
    assert_eq!(
        days(store.histogram(&key("b"), all).await.unwrap()),
        vec![(t - 200, 50)]
    );
    // Values and timestamps are the counters' own: untouched.
    for c in before {
        assert_eq!(store.get(&c.key).await.unwrap().unwrap(), c);
    }
    let avg = store.average(&key("s"), Some(all)).await.unwrap().unwrap();
    assert_eq!((avg.sum, avg.quantity), (6, 1));
    // The named windows (at most a year) never reached the deleted day.
    for len in [1, 7, 30] {
        assert_eq!(pairs(&top(&store, len, None, 10).await), list(&[]));
    }
    assert_eq!(
        pairs(&top(&store, 365, None, 10).await),
        list(&[("a", 110), ("b", 50)])
    );
}

/// The top list of any window, `from..=to`: summed from buckets unless it is
/// a named window ending today.
async fn top_of(store: &SqliteStore, from: i64, to: i64, category: Option<&str>) -> Vec<TopEntry> {
    store
        .top(&TopQuery {
            entity: "VIDEO".into(),
            action: "VIEW".into(),
            window: Some(Window {
                from_day: from,
                to_day: to,
            }),
            category: category.map(String::from),
            size: 10,
        })
        .await
        .expect("a window past i64 answers")
        .entries
}

/// Three increments near the i64 limits on different days: each bucket and
/// the counter's value stay in range (−MAX, MAX, MAX sums to MAX), but the
/// week over the last two days sums to 2·MAX, and another counter's to
/// −2·MAX. SQLite turned the kept `total + x` into a REAL (and `sum()`
/// failed), so these lists answered errors; every list, from the kept
/// totals (folded one write at a time, rolled, rebuilt at open) or by
/// summing buckets, answers the exact sum, in order, with the category filter.
#[tokio::test]
async fn window_sums_past_i64_stay_exact() {
    let t = t0();
    let dir = tempfile::tempdir().unwrap();
    let max = i64::MAX;
    let big = i128::from(max);
    {
        let (store, clock) = open(dir.path(), t);
        // One write (and one fold of the log) at a time: the third adds to
        // a kept total that is already MAX.
        for (day, delta) in [(t - 10, -max), (t - 1, max), (t, max)] {
            write(&store, vec![inc("a", day, delta, Some("k"))]).await;
            write(&store, vec![inc("b", day, -delta, Some("k"))]).await;
            top(&store, 7, None, 10).await;
        }
        write(&store, vec![inc("c", t, 5, None)]).await;
        let key = CounterKey::new("VIDEO", "VIEW", "a").unwrap();
        assert_eq!(store.get(&key).await.unwrap().unwrap().value, max);
        let week = list(&[("a", 2 * big), ("c", 5), ("b", -2 * big)]);
        let month = list(&[("a", big), ("c", 5), ("b", -big)]);
        assert_eq!(pairs(&top(&store, 7, None, 10).await), week);
        assert_eq!(kept_rows(dir.path(), 7), 3);
        assert_eq!(
            pairs(&top(&store, 7, Some("k"), 10).await),
            list(&[("a", 2 * big), ("b", -2 * big)])
        );
        assert_eq!(
            pairs(&top(&store, 7, None, 1).await),
            list(&[("a", 2 * big)])
        );
        assert_eq!(pairs(&top(&store, 30, None, 10).await), month);
        assert_eq!(pairs(&top(&store, 365, None, 10).await), month);
        // Summed from buckets: windows that are not named ones ending today.
        assert_eq!(pairs(&top_of(&store, t - 1, t, None).await), week);
        assert_eq!(
            pairs(&top_of(&store, t - 1, t, Some("k")).await),
            list(&[("a", 2 * big), ("b", -2 * big)])
        );
        assert_eq!(pairs(&top_of(&store, t - 30, t, None).await), month);
        // Rolled by a day: the week still holds both days, the last day
        // holds neither.
        clock.set_day(t + 1);
        assert_eq!(pairs(&top(&store, 7, None, 10).await), week);
        assert_eq!(pairs(&top(&store, 1, None, 10).await), list(&[]));
    }
    // Rebuilt from buckets at open (what a database without totals gets).
    let conn = rusqlite::Connection::open(dir.path().join("counters.sqlite3")).unwrap();
    conn.execute_batch("DELETE FROM windows_state;").unwrap();
    drop(conn);
    let (store, _clock) = open(dir.path(), t);
    assert_eq!(
        pairs(&top(&store, 7, None, 10).await),
        list(&[("a", 2 * big), ("c", 5), ("b", -2 * big)])
    );
}

/// A database of schema 3 kept window totals in one INTEGER column (and an
/// overflowing one as a REAL): at open they are dropped and rebuilt exactly
/// from the buckets, in one transaction, and the schema says the current
/// version (6).
#[tokio::test]
async fn a_schema_3_database_is_converted_at_open() {
    let t = t0();
    let dir = tempfile::tempdir().unwrap();
    let max = i64::MAX;
    {
        let (store, _clock) = open(dir.path(), t);
        write(
            &store,
            vec![
                inc("a", t - 20, -1, None),
                inc("a", t - 1, max, None),
                inc("a", t, 1, None),
            ],
        )
        .await;
    }
    let path = dir.path().join("counters.sqlite3");
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(
        "DROP TABLE windows_a; DROP TABLE windows_b; DROP TABLE windows_state;
         DROP TABLE windows_dirty;
         CREATE TABLE window_totals (
             win INTEGER NOT NULL, cid INTEGER NOT NULL, entity TEXT NOT NULL,
             action TEXT NOT NULL, uuid TEXT NOT NULL, total INTEGER NOT NULL,
             PRIMARY KEY (win, cid)) WITHOUT ROWID;
         CREATE INDEX window_totals_top ON window_totals (win, entity, action, total DESC, uuid);
         INSERT INTO window_totals SELECT 7, cid, entity, action, uuid, 9.3e18 FROM counters;
         PRAGMA user_version = 3;",
    )
    .unwrap();
    drop(conn);
    let (store, _clock) = open(dir.path(), t);
    assert_eq!(
        pairs(&top(&store, 7, None, 10).await),
        list(&[("a", i128::from(max) + 1)])
    );
    assert_eq!(kept_rows(dir.path(), 7), 1);
    let conn = rusqlite::Connection::open(&path).unwrap();
    let old: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_schema WHERE name LIKE 'window_totals%'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(old, 0, "the schema-3 table and its index are gone");
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, 11, "the current schema");
}

/// Over HTTP: a windowed top list past i64 answers 200 with the exact sum
/// as a JSON number (serde_json writes i128 digits), and so do the windowed
/// average, the windowed top averages and the histogram's total, whose sums
/// of samples leave i64 the same way.
#[tokio::test]
async fn a_window_past_i64_answers_exactly_over_http() {
    use common::{counter_path, rfc3339, TestApp};
    use serde_json::json;
    let app = TestApp::start().await;
    let max = i64::MAX;
    let at = |days: i64| rfc3339(common::test_now() - chrono::Duration::days(days));
    for (days, count) in [(10, -max), (1, max), (0, max)] {
        let r = app
            .increment(
                "VIDEO",
                "VIEW",
                "a",
                json!({"count": count, "timestamp": at(days)}),
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.text);
        let r = app
            .post(
                "/v1/averages/RATING/STARS/s",
                json!({"value": count, "timestamp": at(days)}),
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.text);
    }
    let r = app
        .post(
            "/v1/averages/RATING/STARS/t",
            json!({"value": 5, "timestamp": at(0)}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let two = (2 * i128::from(max)).to_string();
    let today = counter_gateway::domain::format_day(t0());
    let yesterday = counter_gateway::domain::format_day(t0() - 1);
    for q in [
        "interval=last_week".to_string(),
        format!("from={yesterday}&to={today}"),
    ] {
        let sum = format!("\"sum\":{two}");
        answers_with(
            &app,
            &format!("/v1/top/VIDEO/VIEW?{q}"),
            &format!("\"value\":{two}"),
        )
        .await;
        let top = answers_with(
            &app,
            &format!("/v1/top-averages/RATING/STARS?{q}"),
            &format!("{sum},\"quantity\":2"),
        )
        .await;
        let at_uuid = |u: &str| top.find(&format!("\"uuid\":\"{u}\""));
        assert!(
            at_uuid("s") < at_uuid("t") && at_uuid("t").is_some(),
            "{q}: {top}"
        );
        let two_or_more = answers_with(
            &app,
            &format!("/v1/top-averages/RATING/STARS?{q}&min_quantity=2"),
            &sum,
        )
        .await;
        assert!(
            !two_or_more.contains("\"uuid\":\"t\""),
            "{q}: {two_or_more}"
        );
        answers_with(&app, &format!("/v1/averages/RATING/STARS/s?{q}"), &sum).await;
        let histogram = counter_path("VIDEO", "VIEW", "a", "/histogram");
        answers_with(
            &app,
            &format!("{histogram}?{q}"),
            &format!("\"total\":{two}"),
        )
        .await;
    }
    let r = app.get("/v1/top/VIDEO/VIEW?interval=last_month").await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(r.text.contains(&format!("\"value\":{max}")), "{}", r.text);
}

/// GETs `path`, expects 200 and an answer whose text holds `needle` (the
/// exact digits of a value past i64, which JSON numbers in `Value` lose).
async fn answers_with(app: &common::TestApp, path: &str, needle: &str) -> String {
    let r = app.get(path).await;
    assert_eq!(r.status, 200, "{path}: {}", r.text);
    assert!(r.text.contains(needle), "{path}: no {needle} in {}", r.text);
    r.text
}

/// The week ending on `today`, as the store has it now (nothing caught up).
async fn week(store: &SqliteStore, today: i64) -> Vec<(String, i128)> {
    let q = TopQuery {
        entity: "VIDEO".into(),
        action: "VIEW".into(),
        window: Some(Window {
            from_day: today - 6,
            to_day: today,
        }),
        category: None,
        size: 10,
    };
    pairs(&store.top(&q).await.unwrap().entries)
}

/// Right after midnight the first windowed query answers from the totals
/// computed before it (the table of the day after), exactly, without
/// moving anything itself; the next flush makes that table the current
/// one, adding to the new day.
#[tokio::test]
async fn the_first_query_after_midnight_reads_the_totals_of_the_day_after() {
    let t = t0();
    let dir = tempfile::tempdir().unwrap();
    let (store, clock) = open(dir.path(), t);
    write(
        &store,
        vec![
            inc("a", t - 6, 5, None),
            inc("b", t, 3, None),
            inc("c", t - 200, 9, None),
        ],
    )
    .await;
    store.catch_up().await.unwrap();
    clock.set_day(t + 1);
    assert_eq!(week(&store, t + 1).await, list(&[("b", 3)]));
    let anchor = |dir: &std::path::Path| -> i64 {
        rusqlite::Connection::open(dir.join("counters.sqlite3"))
            .unwrap()
            .query_row("SELECT anchor FROM windows_state", [], |r| r.get(0))
            .unwrap()
    };
    assert_eq!(anchor(dir.path()), t, "the query moved nothing");
    write(&store, vec![inc("a", t + 1, 4, None)]).await;
    assert_eq!(anchor(dir.path()), t + 1, "the flush moved the totals");
    assert_eq!(week(&store, t + 1).await, list(&[("a", 4), ("b", 3)]));
    assert_eq!(
        pairs(&top(&store, 365, None, 10).await),
        list(&[("a", 9), ("c", 9), ("b", 3)])
    );
    assert_eq!(kept_rows(dir.path(), 365), 3);
}

/// A named-window top list as the store answers it now: nothing folded,
/// written back or copied for it.
async fn top_now(
    store: &SqliteStore,
    len: i64,
    category: Option<&str>,
    size: usize,
) -> Vec<(String, i128)> {
    let today = store.today();
    let list = store
        .top(&TopQuery {
            entity: "VIDEO".into(),
            action: "VIEW".into(),
            window: Some(Window {
                from_day: today - len + 1,
                to_day: today,
            }),
            category: category.map(String::from),
            size,
        })
        .await
        .unwrap();
    assert!(list.exact);
    pairs(&list.entries)
}

/// Every named window's list, with and without each category and cut
/// short, against the model's sums over buckets ending on `today`; and the
/// all-time lists against its values.
async fn all_lists_match(store: &SqliteStore, model: &Model, today: i64, when: &str) {
    for category in [None, Some("k0"), Some("k1")] {
        let mut want = model.all_time(category);
        want.truncate(1000);
        let list = store
            .top(&TopQuery {
                entity: "VIDEO".into(),
                action: "VIEW".into(),
                window: None,
                category: category.map(String::from),
                size: 1000,
            })
            .await
            .unwrap();
        assert!(
            pairs(&list.entries) == want,
            "{when}: all time, category {category:?}"
        );
    }
    for len in LENGTHS {
        for category in [None, Some("k0"), Some("k1")] {
            let mut want = model.top(today - len + 1, today, category);
            want.truncate(1000);
            let got = top_now(store, len, category, 1000).await;
            if got != want {
                let at = got.iter().zip(&want).position(|(g, w)| g != w);
                let at = at.unwrap_or(got.len().min(want.len()));
                panic!(
                    "{when}: window {len} category {category:?}: {} entries, {} wanted; first difference at {at}: {:?} against {:?}",
                    got.len(),
                    want.len(),
                    got.get(at),
                    want.get(at)
                );
            }
            let got = top_now(store, len, category, 3).await;
            assert_eq!(got, want[..want.len().min(3)], "{when}: window {len}, 3");
        }
    }
}

/// Counters whose window totals only memory holds (their rows are out).
fn held_in_memory(dir: &std::path::Path) -> i64 {
    rusqlite::Connection::open(dir.join("counters.sqlite3"))
        .unwrap()
        .query_row("SELECT count(*) FROM windows_dirty", [], |r| r.get(0))
        .unwrap()
}

/// Adds `events` to the model and writes them.
async fn write_both(store: &SqliteStore, model: &mut Model, events: Vec<Increment>) {
    for e in &events {
        let uuid = e.key.uuid.to_string();
        *model
            .buckets
            .entry(uuid.clone())
            .or_default()
            .entry(e.day)
            .or_default() += e.delta;
        *model.value.entry(uuid.clone()).or_default() += e.delta;
        let c = model.category.entry(uuid).or_default();
        if let Some(k) = &e.category {
            *c = Some(k.to_string());
        }
    }
    write(store, events).await;
}

/// Events for counters `c{from}..c{to}` on `day`: values of both signs and
/// a category that changes now and then.
fn events(rng: &mut Rng, from: usize, to: usize, day: i64) -> Vec<Increment> {
    (from..to)
        .map(|i| {
            let delta = rng.below(2_001) as i64 - 700;
            let category = match rng.below(5) {
                0 => None,
                k => Some(["k0", "k1"][(k % 2) as usize]),
            };
            inc(&format!("c{i:05}"), day, delta, category)
        })
        .collect()
}

/// The database as a crash at this moment leaves it: its file and its
/// write-ahead log, copied while the store is open and idle.
fn crash_copy(from: &std::path::Path, to: &std::path::Path) {
    for name in ["counters.sqlite3", "counters.sqlite3-wal"] {
        if from.join(name).exists() {
            std::fs::copy(from.join(name), to.join(name)).unwrap();
        }
    }
}

/// Issue 13: right after a bulk load (each counter once per flush, day by
/// day, nothing folded or written back: the fold held), every windowed
/// list equals the sum of the buckets, and every all-time list the values,
/// none of them folding first. Memory holds the totals of every
/// counter loaded and the tables none; once written back, the tables hold
/// them all and memory none, and the lists are the same.
#[tokio::test]
async fn lists_right_after_a_bulk_load_equal_the_summed_buckets() {
    let t = t0();
    let dir = tempfile::tempdir().unwrap();
    let (store, _clock) = open(dir.path(), t);
    store.fold_hold().hold();
    let mut model = Model::default();
    let mut rng = Rng(13);
    let n = 3_000;
    for day in [t - 40, t - 29, t - 6, t - 5, t - 1, t, t + 1] {
        for from in (0..n).step_by(1_000) {
            let batch = events(&mut rng, from, (from + 1_000).min(n), day);
            write_both(&store, &mut model, batch).await;
        }
    }
    assert_eq!(held_in_memory(dir.path()), n as i64);
    assert_eq!(kept_rows(dir.path(), 365), 0);
    all_lists_match(&store, &model, t, "right after the load").await;
    // No list folded the change log to answer (all-time ones included).
    let logged: i64 = rusqlite::Connection::open(dir.path().join("counters.sqlite3"))
        .unwrap()
        .query_row("SELECT count(*) FROM counter_log", [], |r| r.get(0))
        .unwrap();
    assert!(logged > 0);
    store.fold_hold().release();
    store.catch_up().await.unwrap();
    assert_eq!(held_in_memory(dir.path()), 0);
    assert_eq!(kept_rows(dir.path(), 365), n as i64);
    all_lists_match(&store, &model, t, "written back").await;
}

/// Midnight while memory holds window totals and the log is not folded:
/// the first lists after it (the table of the day after, merged with
/// memory's totals of the day after) are exact; so are they after the
/// flush that moves tables and memory to the new day, and once written back.
#[tokio::test]
async fn lists_across_midnight_with_totals_in_memory_are_exact() {
    let t = t0();
    let dir = tempfile::tempdir().unwrap();
    let (store, clock) = open(dir.path(), t);
    let mut model = Model::default();
    let mut rng = Rng(17);
    for day in [t - 29, t - 6, t - 3, t] {
        let batch = events(&mut rng, 0, 400, day);
        write_both(&store, &mut model, batch).await;
    }
    store.catch_up().await.unwrap();
    store.fold_hold().hold();
    // Into memory: counters with rows, new ones, the days that leave at
    // midnight and the one that enters.
    for day in [t - 29, t - 6, t, t + 1] {
        let batch = events(&mut rng, 200, 600, day);
        write_both(&store, &mut model, batch).await;
    }
    assert_eq!(held_in_memory(dir.path()), 400);
    all_lists_match(&store, &model, t, "before midnight").await;
    clock.set_day(t + 1);
    all_lists_match(&store, &model, t + 1, "right after midnight").await;
    let batch = events(&mut rng, 550, 650, t + 1);
    write_both(&store, &mut model, batch).await;
    all_lists_match(&store, &model, t + 1, "after the first flush of the day").await;
    store.fold_hold().release();
    store.catch_up().await.unwrap();
    assert_eq!(held_in_memory(dir.path()), 0);
    all_lists_match(&store, &model, t + 1, "written back").await;
}

/// Midnight again before the table of the day after is filled (the copy
/// held): lists are summed from the buckets, exact, until it is done and
/// the tables move. Two days ahead, the tables are rebuilt.
#[tokio::test]
async fn lists_stay_exact_when_midnight_comes_before_the_copy() {
    let t = t0();
    let dir = tempfile::tempdir().unwrap();
    let (store, clock) = open(dir.path(), t);
    let mut model = Model::default();
    let mut rng = Rng(19);
    for day in [t - 6, t - 1, t] {
        let batch = events(&mut rng, 0, 300, day);
        write_both(&store, &mut model, batch).await;
    }
    store.catch_up().await.unwrap();
    store.fold_hold().hold();
    clock.set_day(t + 1);
    // This flush moves the tables to t + 1; the copy of t + 2 is held.
    let batch = events(&mut rng, 100, 200, t + 1);
    write_both(&store, &mut model, batch).await;
    clock.set_day(t + 2);
    let batch = events(&mut rng, 150, 250, t + 2);
    write_both(&store, &mut model, batch).await;
    all_lists_match(&store, &model, t + 2, "the copy not done").await;
    let anchor: i64 = rusqlite::Connection::open(dir.path().join("counters.sqlite3"))
        .unwrap()
        .query_row("SELECT anchor FROM windows_state", [], |r| r.get(0))
        .unwrap();
    assert_eq!(anchor, t + 1, "the tables wait for the copy");
    store.fold_hold().release();
    store.catch_up().await.unwrap();
    all_lists_match(&store, &model, t + 2, "copied and moved").await;
    assert_eq!(
        kept_rows(dir.path(), 7),
        model.top(t + 2 - 6, t + 2, None).len() as i64
    );
    // Two midnights at once: the tables are not kept until rebuilt.
    clock.set_day(t + 4);
    let batch = events(&mut rng, 0, 50, t + 4);
    write_both(&store, &mut model, batch).await;
    all_lists_match(&store, &model, t + 4, "two days on").await;
    store.catch_up().await.unwrap();
    all_lists_match(&store, &model, t + 4, "rebuilt").await;
    assert_eq!(
        kept_rows(dir.path(), 30),
        model.top(t + 4 - 29, t + 4, None).len() as i64
    );
}

/// A crash while memory holds window totals (and the log holds deltas):
/// the next open recomputes those counters' rows from their buckets, so
/// the lists are exact and nothing is left in memory's list.
#[tokio::test]
async fn a_crash_with_totals_in_memory_loses_none_of_them() {
    let t = t0();
    let dir = tempfile::tempdir().unwrap();
    let copy = tempfile::tempdir().unwrap();
    let (store, _clock) = open(dir.path(), t);
    let mut model = Model::default();
    let mut rng = Rng(23);
    for day in [t - 6, t] {
        let batch = events(&mut rng, 0, 300, day);
        write_both(&store, &mut model, batch).await;
    }
    store.catch_up().await.unwrap();
    store.fold_hold().hold();
    for day in [t - 200, t - 6, t, t + 1] {
        let batch = events(&mut rng, 200, 500, day);
        write_both(&store, &mut model, batch).await;
    }
    assert_eq!(held_in_memory(dir.path()), 300);
    crash_copy(dir.path(), copy.path());
    let (recovered, _clock) = open(copy.path(), t);
    assert_eq!(held_in_memory(copy.path()), 0);
    for len in LENGTHS {
        assert_eq!(
            kept_rows(copy.path(), len),
            model.top(t - len + 1, t, None).len() as i64,
            "window {len}"
        );
    }
    all_lists_match(&recovered, &model, t, "after the crash").await;
    all_lists_match(&store, &model, t, "the store that went on").await;
}

/// A crash in the middle of a bulk load, memory holding the totals of more
/// counters than the next open recomputes one by one (65,536): that open
/// rebuilds the tables from the buckets instead, and the lists are exact.
#[tokio::test]
async fn a_crash_during_a_bulk_load_rebuilds_the_totals_at_open() {
    let t = t0();
    let dir = tempfile::tempdir().unwrap();
    let copy = tempfile::tempdir().unwrap();
    let (store, _clock) = open(dir.path(), t);
    let mut model = Model::default();
    store.fold_hold().hold();
    let mut rng = Rng(29);
    let n = 70_000;
    for day in [t - 6, t] {
        for from in (0..n).step_by(10_000) {
            let batch = events(&mut rng, from, (from + 10_000).min(n), day);
            write_both(&store, &mut model, batch).await;
        }
    }
    assert_eq!(held_in_memory(dir.path()), n as i64);
    crash_copy(dir.path(), copy.path());
    let (recovered, _clock) = open(copy.path(), t);
    assert_eq!(held_in_memory(copy.path()), 0);
    assert_eq!(kept_rows(copy.path(), 7), n as i64);
    all_lists_match(&recovered, &model, t, "after the crash").await;
}

/// Random increments across past, present and the next day, categories
/// that change, deletes, midnights one or a few days at a time and a clock
/// stepping back, with the fold, the writing back and the copy held or
/// running (the background works meanwhile, in real time): after every
/// step every named window's list, read as it stands, equals the sum of
/// the buckets.
#[tokio::test]
async fn lists_are_exact_at_every_moment_over_random_workloads() {
    let t = t0();
    for seed in 1..=4u64 {
        let dir = tempfile::tempdir().unwrap();
        let (store, clock) = open(dir.path(), t);
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let mut model = Model::default();
        let mut today = t;
        for round in 0..24 {
            match rng.below(10) {
                0..=3 => {}
                4..=7 => today += 1,
                8 => today += 2 + rng.below(3) as i64,
                _ => today -= 1,
            }
            clock.set_day(today);
            if rng.below(3) == 0 {
                store.fold_hold().hold();
            } else {
                store.fold_hold().release();
            }
            for _ in 0..(1 + rng.below(3)) {
                let mut batch = Vec::new();
                for _ in 0..rng.below(80) {
                    let uuid = format!("c{}", rng.below(60));
                    let back = match rng.below(4) {
                        0 => rng.below(8) as i64,
                        1 => rng.below(32) as i64,
                        2 => rng.below(370) as i64,
                        _ => -1,
                    };
                    let category = match rng.below(4) {
                        0 => None,
                        k => Some(["k0", "k1"][(k % 2) as usize]),
                    };
                    let delta = rng.below(21) as i64 - 8;
                    batch.push(inc(&uuid, today - back, delta, category));
                }
                if !batch.is_empty() {
                    write_both(&store, &mut model, batch).await;
                }
                if rng.below(6) == 0 {
                    let uuid = format!("c{}", rng.below(60));
                    let existed = model.buckets.remove(&uuid).is_some();
                    model.category.remove(&uuid);
                    model.value.remove(&uuid);
                    let key = CounterKey::new("VIDEO", "VIEW", &uuid).unwrap();
                    assert_eq!(store.delete(&key).await.unwrap(), existed);
                }
            }
            match rng.below(4) {
                0 => store.catch_up().await.unwrap(),
                1 => tokio::time::sleep(Duration::from_millis(rng.below(300))).await,
                _ => {}
            }
            let when = format!("seed {seed} round {round} today {today}");
            all_lists_match(&store, &model, today, &when).await;
        }
    }
}

/// A pause of a few seconds folds the change log but keeps the window
/// totals in memory: writing them back empties memory, and every counter
/// the next burst touched then entered it again (its kept rows read and
/// deleted), which cost about a third of the single increments'
/// throughput after each pause of a second. Lists stay exact meanwhile,
/// and half a minute of quiet writes the totals back (this test waits it).
#[tokio::test]
async fn a_short_pause_folds_the_log_and_keeps_the_totals_in_memory() {
    let t = t0();
    let dir = tempfile::tempdir().unwrap();
    let (store, _clock) = open(dir.path(), t);
    let mut model = Model::default();
    let mut rng = Rng(23);
    let n = 500;
    for day in [t - 3, t] {
        write_both(&store, &mut model, events(&mut rng, 0, n, day)).await;
    }
    assert_eq!(held_in_memory(dir.path()), n as i64);
    let logged = || -> i64 {
        rusqlite::Connection::open(dir.path().join("counters.sqlite3"))
            .unwrap()
            .query_row("SELECT count(*) FROM counter_log", [], |r| r.get(0))
            .unwrap()
    };
    assert!(logged() > 0);
    // The background folds once flushes paused for a second; give it a few.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while logged() > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the change log was not folded after a pause"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Several background turns after the fold (one every half second).
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(held_in_memory(dir.path()), n as i64);
    assert_eq!(kept_rows(dir.path(), 7), 0);
    all_lists_match(&store, &model, t, "after a short pause").await;
    // Another burst finds its counters in memory; lists stay exact.
    write_both(&store, &mut model, events(&mut rng, 0, n, t)).await;
    all_lists_match(&store, &model, t, "after the next burst").await;
    // Half a minute without flushes, and the background writes them back
    // on its own: memory empties, the tables hold them.
    let burst = std::time::Instant::now();
    let deadline = burst + Duration::from_secs(90);
    while held_in_memory(dir.path()) > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "memory's window totals were not written back after a long quiet"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(
        burst.elapsed() >= Duration::from_secs(25),
        "written back too soon"
    );
    assert_eq!(kept_rows(dir.path(), 7), n as i64);
    all_lists_match(&store, &model, t, "written back").await;
}
