//! Unit tests of the embedded store that reach inside it: the writer's
//! flush paths, fold passes cut by a crash, window totals written back in
//! bulk or rebuilt, and the retention's floor.

use super::background::{expire_buckets, first_kept_day};
use super::flush::{apply_coalesced, apply_one_by_one};
use super::schema::SCHEMA;
use super::windows::upkeep::open_windows;
use super::*;
use crate::domain::Increment;
use crate::store::RequestOutcome;

const DAY: i64 = 21_974; // 2030-03-01

/// A store with relaxed durability in a new directory, its clock at
/// 01:00 on `DAY`.
fn relaxed_store_at_day() -> (tempfile::TempDir, crate::domain::ManualClock, SqliteStore) {
    let dir = tempfile::tempdir().unwrap();
    let clock = crate::domain::ManualClock::new(
        chrono::DateTime::from_timestamp(DAY * 86_400 + 3600, 0).unwrap(),
    );
    let store = SqliteStore::open(
        dir.path(),
        Durability::Relaxed,
        std::time::Duration::from_secs(60),
        400,
        clock.clock(),
    )
    .unwrap();
    (dir, clock, store)
}

fn memory_db() -> Writer {
    let mut c = Connection::open_in_memory().unwrap();
    c.execute_batch(SCHEMA).unwrap();
    c.execute_batch(queries::SCHEMA_V2).unwrap();
    c.execute_batch(&windows::schema()).unwrap();
    c.execute_batch(super::hours::SCHEMA).unwrap();
    let hot = hot::Shared::default();
    hot.lock().windows.state = Some(open_windows(&mut c, DAY).unwrap());
    Writer {
        conn: c,
        hot,
        pass: None,
        logged: 0,
        hooks: Hooks::default(),
        hours_from: i64::MIN / 48,
        first_days: Vec::new(),
        first_days_wanted: Vec::new(),
        trend: Vec::new(),
    }
}

fn inc(uuid: &str, delta: i64) -> Increment {
    Increment {
        key: CounterKey::new("VIDEO", "VIEW", uuid).unwrap(),
        delta,
        category: Some("news".into()),
        ts_ms: DAY * 86_400_000,
        day: DAY,
        id: None,
        kind: crate::domain::Kind::Counter,
        unique: None,
    }
}

/// Batches ask for no counter: a flush builds the state after it only
/// for the keys a request wanted, on both of its paths.
#[test]
fn a_flush_reads_back_only_the_wanted_counters() {
    let mut c = memory_db();
    let key = |u: &str| CounterKey::new("VIDEO", "VIEW", u).unwrap();
    let batch = WriteBatch {
        requests: vec![vec![inc("a", 1), inc("b", 2)], vec![inc("a", 3)]],
        wanted: [key("a")].into(),
    };
    let out = apply_coalesced(&mut c, &batch, DAY * 86_400_000, 1000)
        .unwrap()
        .unwrap();
    assert_eq!(out.counters.len(), 1, "{:?}", out.counters);
    assert_eq!(out.counters[&key("a")].value, 4);
    assert_eq!(out.counters[&key("a")].category.as_deref(), Some("news"));
    let none = WriteBatch {
        wanted: Default::default(),
        ..batch
    };
    let out = apply_coalesced(&mut c, &none, DAY * 86_400_000, 1000)
        .unwrap()
        .unwrap();
    assert!(out.counters.is_empty(), "{:?}", out.counters);
    // The overflow path, request by request, keeps to the wanted keys too.
    let batch = WriteBatch {
        requests: vec![vec![inc("b", i64::MAX)], vec![inc("a", 1), inc("b", 1)]],
        wanted: [key("a")].into(),
    };
    let out = apply_one_by_one(&mut c, &batch, DAY * 86_400_000, 1000).unwrap();
    assert_eq!(out.requests[0], RequestOutcome::Overflow { key: key("b") });
    assert_eq!(out.counters.len(), 1, "{:?}", out.counters);
    assert_eq!(out.counters[&key("a")].value, 9);
}

/// A fold pass of more counters than a chunk, interrupted: between
/// its chunks, reads are exact and flushes go on (their deltas wait for
/// the next pass); a crash in the middle resumes at the next counter,
/// so every delta is applied once.
#[tokio::test]
async fn a_fold_pass_resumes_where_a_crash_stopped_it() {
    let dir = tempfile::tempdir().unwrap();
    let copy = tempfile::tempdir().unwrap();
    let clock = crate::domain::ManualClock::new(
        chrono::DateTime::from_timestamp(DAY * 86_400 + 3600, 0).unwrap(),
    );
    let open = |d: &Path| {
        SqliteStore::open(
            d,
            Durability::Relaxed,
            std::time::Duration::from_secs(60),
            400,
            clock.clock(),
        )
        .unwrap()
    };
    let store = open(dir.path());
    store.fold_hold().hold();
    let n = 2 * fold::CHUNK + 10;
    let uuid = |i: usize| format!("u{i:05}");
    let all = |delta| vec![(0..n).map(|i| inc(&uuid(i), delta)).collect::<Vec<_>>()];
    let batch = |requests| WriteBatch {
        requests,
        wanted: Default::default(),
    };
    store.apply(batch(all(1))).await.unwrap();
    store.apply(batch(all(2))).await.unwrap();
    assert_eq!(store.hot.pending(), n);
    // One chunk: the first CHUNK counters are folded.
    assert!(store.writer.lock().unwrap().fold_step().unwrap());
    assert_eq!(store.hot.pending(), n - fold::CHUNK);
    let raw = |d: &Path, u: &str| -> i64 {
        Connection::open(d.join(DB_FILE))
            .unwrap()
            .query_row("SELECT value FROM counters WHERE uuid = ?1", [u], |r| {
                r.get(0)
            })
            .unwrap()
    };
    assert_eq!(raw(dir.path(), &uuid(0)), 3);
    assert_eq!(raw(dir.path(), &uuid(n - 1)), 1);
    crash_copy(dir.path(), copy.path());
    // A flush between chunks, on a folded and an unfolded counter.
    store
        .apply(batch(vec![vec![inc(&uuid(0), 10), inc(&uuid(n - 1), 10)]]))
        .await
        .unwrap();
    for u in [uuid(0), uuid(n - 1), uuid(n / 2)] {
        let c = store
            .get(&CounterKey::new("VIDEO", "VIEW", &u).unwrap())
            .await
            .unwrap();
        let want = if u == uuid(n / 2) { 3 } else { 13 };
        assert_eq!(c.unwrap().value, want, "{u}");
    }
    store.catch_up().await.unwrap();
    assert_eq!(store.hot.pending(), 0);
    assert_eq!(raw(dir.path(), &uuid(0)), 13);
    assert_eq!(raw(dir.path(), &uuid(n - 1)), 13);
    assert_eq!(raw(dir.path(), &uuid(n / 2)), 3);
    drop(store);

    // The copy crashed after the first chunk: the open resumes the pass.
    let state: (i64, i64) = Connection::open(copy.path().join(DB_FILE))
        .unwrap()
        .query_row("SELECT upto, done_cid FROM fold_state", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    assert!(state.1 > 0, "{state:?}");
    let store = open(copy.path());
    for i in [0, fold::CHUNK - 1, fold::CHUNK, n - 1] {
        assert_eq!(raw(copy.path(), &uuid(i)), 3, "{}", uuid(i));
    }
    let left: i64 = Connection::open(copy.path().join(DB_FILE))
        .unwrap()
        .query_row(
            "SELECT (SELECT count(*) FROM counter_log) + (SELECT count(*) FROM fold_state)",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(left, 0);
    let buckets: i64 = Connection::open(copy.path().join(DB_FILE))
        .unwrap()
        .query_row("SELECT sum(value) FROM buckets", [], |r| r.get(0))
        .unwrap();
    assert_eq!(buckets, 3 * n as i64);
    drop(store);
}

/// A bulk load of distinct counters: once `DIRECT_PENDING` counters
/// have deltas in the log, the others (nothing pending) are written
/// directly, so the pending counters stop growing; every value, bucket
/// and read stays exact, and a counter already pending stays logged.
#[tokio::test]
async fn past_the_pending_mark_counters_are_written_directly() {
    let (dir, _clock, store) = relaxed_store_at_day();
    store
        .set_milestone_days(&firstdays::DEFAULT_KEPT, true)
        .unwrap();
    store.fold_hold().hold();
    let n = write::DIRECT_PENDING + 500;
    let uuid = |i: usize| format!("u{i:06}");
    let batch = |events: Vec<Increment>| WriteBatch {
        requests: vec![events],
        wanted: Default::default(),
    };
    // Inserted whole (new), then touched twice more while they exist.
    store
        .apply(batch((0..n).map(|i| inc(&uuid(i), 1)).collect()))
        .await
        .unwrap();
    assert_eq!(store.hot.pending(), 0);
    store
        .apply(batch((0..n).map(|i| inc(&uuid(i), 2)).collect()))
        .await
        .unwrap();
    assert_eq!(store.hot.pending(), write::DIRECT_PENDING);
    let logged: i64 = Connection::open(dir.path().join(DB_FILE))
        .unwrap()
        .query_row("SELECT count(*) FROM counter_log", [], |r| r.get(0))
        .unwrap();
    assert_eq!(logged, 1);
    store
        .apply(batch((0..n).map(|i| inc(&uuid(i), 4)).collect()))
        .await
        .unwrap();
    assert_eq!(store.hot.pending(), write::DIRECT_PENDING);
    let raw = |u: &str| -> (i64, i64) {
        Connection::open(dir.path().join(DB_FILE))
            .unwrap()
            .query_row(
                "SELECT c.value, b.value FROM counters c JOIN buckets b ON b.cid = c.cid
                 WHERE c.uuid = ?1 AND b.day = ?2",
                params![u, DAY],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap()
    };
    // Logged ones: the row still holds the insert; direct ones: all.
    assert_eq!(raw(&uuid(0)), (1, 1));
    assert_eq!(raw(&uuid(n - 1)), (7, 7));
    for i in [0, write::DIRECT_PENDING - 1, write::DIRECT_PENDING, n - 1] {
        let key = CounterKey::new("VIDEO", "VIEW", &uuid(i)).unwrap();
        assert_eq!(store.get(&key).await.unwrap().unwrap().value, 7, "{i}");
        let days = store
            .histogram(
                &key,
                Window {
                    from_day: DAY,
                    to_day: DAY,
                },
            )
            .await
            .unwrap()
            .unwrap();
        assert_eq!(days, [Bucket { day: DAY, value: 7 }], "{i}");
    }
    store.catch_up().await.unwrap();
    assert_eq!(store.hot.pending(), 0);
    assert_eq!(raw(&uuid(0)), (7, 7));
    let total: i64 = Connection::open(dir.path().join(DB_FILE))
        .unwrap()
        .query_row("SELECT sum(value) FROM buckets", [], |r| r.get(0))
        .unwrap();
    assert_eq!(total, 7 * n as i64);
    // The kept first-days totals of the direct ones moved with them too.
    let conn = Connection::open(dir.path().join(DB_FILE)).unwrap();
    let sevens: i64 = conn
        .query_row(
            "SELECT count(*) FROM first_days WHERE cid <> 0 AND hi = 0 AND lo = 7",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(sevens, 3 * n as i64);
    firstdays::assert_exact(&conn);
}

/// Window totals memory holds written back in bulk (the indexes
/// dropped and built again), and the totals dropped and rebuilt from
/// the buckets (past the most memory may hold): lists stay exact through
/// both, and the tables and indexes are whole after.
#[tokio::test]
async fn window_totals_written_back_in_bulk_or_dropped_and_rebuilt_stay_exact() {
    let (dir, _clock, store) = relaxed_store_at_day();
    store.fold_hold().hold();
    let batch = |requests| WriteBatch {
        requests,
        wanted: Default::default(),
    };
    let week = TopQuery {
        entity: "VIDEO".into(),
        action: "VIEW".into(),
        window: Some(Window {
            from_day: DAY - 6,
            to_day: DAY,
        }),
        category: None,
        size: 5,
    };
    let top = |list: TopList| -> Vec<(String, i128)> {
        list.entries
            .into_iter()
            .map(|e| (e.uuid, e.value))
            .collect()
    };
    let want: Vec<(String, i128)> = (195..200)
        .rev()
        .map(|i| (format!("u{i:03}"), 3 * i as i128))
        .collect();
    store
        .apply(batch(vec![(0..200)
            .map(|i| inc(&format!("u{i:03}"), i))
            .collect()]))
        .await
        .unwrap();
    store
        .apply(batch(vec![(0..200)
            .map(|i| inc(&format!("u{i:03}"), 2 * i))
            .collect()]))
        .await
        .unwrap();
    let indexes = |d: &Path| -> i64 {
        Connection::open(d.join(DB_FILE))
            .unwrap()
            .query_row(
                "SELECT count(*) FROM sqlite_schema WHERE type = 'index' AND name LIKE 'windows_%'",
                [],
                |r| r.get(0),
            )
            .unwrap()
    };
    {
        let mut w = store.writer.lock().unwrap();
        w.fold_all().unwrap();
        assert_eq!(w.hot.lock().windows.len(), 200);
        assert!(w.write_back_bulk_past(1).unwrap());
        assert_eq!(w.hot.lock().windows.len(), 0);
    }
    assert_eq!(indexes(dir.path()), 8);
    assert_eq!(top(store.top(&week).await.unwrap()), want);
    // More than memory may hold: the totals are dropped, lists sum
    // buckets, and a rebuild brings the tables back.
    store
        .apply(batch(vec![(0..200)
            .map(|i| inc(&format!("u{i:03}"), 0))
            .collect()]))
        .await
        .unwrap();
    store.writer.lock().unwrap().drop_windows().unwrap();
    assert!(store.hot.lock().windows.state.is_none());
    store
        .apply(batch(vec![vec![inc("u007", 1_000)]]))
        .await
        .unwrap();
    let mut want_after = want.clone();
    want_after.insert(0, ("u007".to_string(), 1_021));
    want_after.truncate(5);
    assert_eq!(top(store.top(&week).await.unwrap()), want_after);
    store.catch_up().await.unwrap();
    assert!(store.hot.lock().windows.state.is_some());
    assert_eq!(indexes(dir.path()), 8);
    assert_eq!(top(store.top(&week).await.unwrap()), want_after);
}

fn crash_copy(from: &Path, to: &Path) {
    for name in [DB_FILE.to_string(), format!("{DB_FILE}-wal")] {
        if from.join(&name).exists() {
            std::fs::copy(from.join(&name), to.join(&name)).unwrap();
        }
    }
}

/// Totals still anchored 100 days back read the days of their year
/// from `buckets` when they move on: the retention leaves those days
/// until the totals are past them.
#[test]
fn retention_keeps_the_days_a_lagging_window_still_reads() {
    let c = Connection::open_in_memory().unwrap();
    c.execute_batch(SCHEMA).unwrap();
    c.execute_batch(queries::SCHEMA_V2).unwrap();
    c.execute_batch(&windows::schema()).unwrap();
    let anchor = DAY - 100;
    windows::rebuild(&c, anchor).unwrap();
    for day in [DAY - 465, DAY - 464, DAY - 401, DAY - 400] {
        c.execute(
            "INSERT INTO buckets (day, cid, value) VALUES (?1, 1, 1)",
            [day],
        )
        .unwrap();
    }
    assert_eq!(first_kept_day(&c, DAY, 400).unwrap(), anchor - 364);
    let budget = std::time::Duration::from_secs(5);
    assert_eq!(expire_buckets(&c, &[], DAY, 400, budget).unwrap(), 1);
    windows::rebuild(&c, DAY).unwrap();
    assert_eq!(first_kept_day(&c, DAY, 400).unwrap(), DAY - 400);
    assert_eq!(expire_buckets(&c, &[], DAY, 400, budget).unwrap(), 2);
    let left: Vec<i64> = c
        .prepare("SELECT day FROM buckets ORDER BY day")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(left, vec![DAY - 400]);
}

/// The writer checkpoints the write-ahead log itself, after its commits
/// and outside memory's lock (SQLite's automatic checkpoint, inside a
/// commit, held that lock and stalled reads): a load many times the
/// checkpoint's mark leaves a log about that mark's size, every value
/// read back.
#[test]
fn the_writer_checkpoints_the_log_a_load_grows() {
    let (dir, _clock, store) = relaxed_store_at_day();
    let writes = store.blocking_writes().unwrap();
    let per_flush = 4_000;
    let flushes = 20;
    for f in 0..flushes {
        let events = (0..per_flush)
            .map(|i| inc(&format!("f{f:03}-u{i:05}"), 1))
            .collect();
        writes
            .apply(WriteBatch {
                requests: vec![events],
                wanted: Default::default(),
            })
            .unwrap();
        writes.after_apply();
    }
    let wal = std::fs::metadata(dir.path().join(format!("{DB_FILE}-wal")))
        .unwrap()
        .len();
    let db = std::fs::metadata(dir.path().join(DB_FILE)).unwrap().len();
    // The load is several times the mark (1,000 pages of 4 KiB); the log
    // holds about the mark and a flush, the database the rest.
    assert!(db > 10 << 20, "database {db} bytes");
    assert!(wal < 8 << 20, "write-ahead log {wal} bytes");
    let c = Connection::open(dir.path().join(DB_FILE)).unwrap();
    let (n, sum): (i64, i64) = c
        .query_row("SELECT count(*), sum(value) FROM counters", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    assert_eq!((n, sum), (per_flush * flushes, per_flush * flushes));
}
