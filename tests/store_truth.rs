//! The embedded store tells the truth under faults: a failure after the
//! commit is never reported as "nothing applied", a failed fsync stops every
//! later acknowledgement until restart, no answer precedes the fsync that
//! covers it, and store errors reach clients as a stable type and a short
//! reason (the detail stays in the log, under a request id).

mod common;

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{assert_error, counter_path, Options, TestApp};
use counter_gateway::domain::{
    Counter, CounterKey, Increment, Kind, ManualClock, TimePolicy, Window,
};
use counter_gateway::store::sqlite::{Durability, SqliteStore};
use counter_gateway::store::{
    Average, BatchOutcome, BlockingWrites, Bucket, RequestOutcome, StaleQuery, Store, StoreError,
    TopAverages, TopAveragesQuery, TopList, TopQuery, UnusedPair, WriteBatch,
};
use serde_json::json;

fn inc(uuid: &str, id: Option<&str>, now_ms: i64) -> Increment {
    Increment {
        key: CounterKey::new("VIDEO", "VIEW", uuid).unwrap(),
        delta: 1,
        category: None,
        ts_ms: now_ms,
        day: now_ms.div_euclid(86_400_000),
        id: id.map(Arc::from),
        kind: Kind::Counter,
        unique: None,
    }
}

fn at_ms(ms: i64) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::from_timestamp_millis(ms).unwrap()
}

fn id_rows(dir: &std::path::Path) -> i64 {
    let conn = rusqlite::Connection::open(dir.join("counters.sqlite3")).unwrap();
    conn.query_row("SELECT count(*) FROM event_ids", [], |r| r.get(0))
        .unwrap()
}

/// The expiry of old idempotency ids failing (a full disk) after a flush
/// committed must not turn that flush into "nothing applied": the clients
/// would retry and count twice. Expiry is background work, not part of a
/// flush's result, and still runs (driven by the store's clock).
#[tokio::test]
async fn a_failing_id_expiry_never_fails_a_committed_flush() {
    let dir = tempfile::tempdir().unwrap();
    // On a multiple of 64 ms: the old code expired ids inside such a flush.
    let t0 = common::test_now().timestamp_millis() / 64 * 64;
    let clock = ManualClock::new(at_ms(t0 + 1));
    let window = Duration::from_secs(3600);
    let store = SqliteStore::open(
        dir.path(),
        Durability::Relaxed,
        window,
        TimePolicy::default().retention_days,
        clock.clock(),
    )
    .unwrap();
    let one = |uuid: &str, id: &str, ms: i64| WriteBatch {
        requests: vec![vec![inc(uuid, Some(id), ms)]],
        ..Default::default()
    };
    let out = store.apply(one("a", "old", t0 + 1)).await.unwrap();
    assert_eq!(out.requests[0], RequestOutcome::Applied { duplicates: 0 });
    // Deleting an id now fails the way a full disk makes it fail.
    rusqlite::Connection::open(dir.path().join("counters.sqlite3"))
        .unwrap()
        .execute_batch(
            "CREATE TRIGGER disk_full BEFORE DELETE ON event_ids
             BEGIN SELECT RAISE(FAIL, 'database or disk is full'); END;",
        )
        .unwrap();
    let later = t0 + 64 * 60_000 * 2; // two id windows on, still a multiple of 64
    clock.set(at_ms(later));
    let out = store
        .apply(one("b", "new", later))
        .await
        .expect("a committed flush is reported as applied, whatever follows it");
    assert_eq!(out.requests[0], RequestOutcome::Applied { duplicates: 0 });
    let key = CounterKey::new("VIDEO", "VIEW", "b").unwrap();
    assert_eq!(store.get(&key).await.unwrap().unwrap().value, 1);
    // The retry of the same id is a duplicate: the flush was committed.
    let out = store.apply(one("b", "new", later)).await.unwrap();
    assert_eq!(out.requests[0], RequestOutcome::Applied { duplicates: 1 });

    // Once deletes work again, the background forgets the expired id.
    rusqlite::Connection::open(dir.path().join("counters.sqlite3"))
        .unwrap()
        .execute_batch("DROP TRIGGER disk_full")
        .unwrap();
    for _ in 0..200 {
        if id_rows(dir.path()) == 1 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "the expired id was never deleted: {} rows",
        id_rows(dir.path())
    );
}

/// `/metrics` tells how many idempotency ids the embedded store keeps.
#[tokio::test]
async fn metrics_count_the_kept_idempotency_ids() {
    let app = TestApp::start().await;
    let events: Vec<_> = (0..5)
        .map(|i| json!({"entity": "V", "action": "VIEW", "uuid": "m", "id": format!("m-{i}")}))
        .collect();
    let r = app.post("/v1/events", json!({ "events": events })).await;
    assert_eq!(r.status, 200, "{}", r.text);
    for _ in 0..200 {
        if app.metric("counter_gateway_idempotency_ids").await >= 5.0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("counter_gateway_idempotency_ids never reached 5");
}

/// After a failed fsync the kernel may have dropped the dirty pages and
/// report the next fsync as fine (PostgreSQL's lesson): the store then
/// acknowledges nothing more until restart, and says so.
#[tokio::test]
async fn after_a_failed_fsync_nothing_more_is_acknowledged_until_restart() {
    let app = TestApp::start().await;
    let path = counter_path("V", "VIEW", "f", "/increment");
    assert_eq!(app.post(&path, json!({})).await.status, 200);
    app.fsync_fault.arm();
    let r = app.post(&path, json!({})).await;
    assert_error(&r, 503, "unavailable", &["may or may not"]);
    // The disk "recovers": the next fsync would succeed, and prove nothing.
    app.fsync_fault.disarm();
    let r = app.post(&path, json!({})).await;
    assert_error(&r, 503, "unavailable", &["fsync", "restart"]);
    let r = app
        .post(
            "/v1/events",
            json!({"events": [{"entity": "V", "action": "VIEW", "uuid": "g"}]}),
        )
        .await;
    assert_error(&r, 503, "unavailable", &["fsync", "restart"]);
    let r = app.get("/readyz").await;
    assert_error(&r, 503, "unavailable", &["fsync"]);
    let app = app.restart().await;
    assert_eq!(app.get("/readyz").await.status, 200);
    assert_eq!(app.post(&path, json!({})).await.status, 200);
}

/// What the recording store saw, in one order shared with the client's replies.
#[derive(Clone, Debug, PartialEq)]
enum Event {
    /// `apply` returned, with the uuids of its batch.
    Applied(Vec<String>),
    SyncStarted(usize),
    SyncEnded(usize, bool),
    /// The pipeline's call of `after_apply` began, and ended.
    AfterApplyStarted,
    AfterApplyEnded,
    /// The client got an answer for this uuid.
    Reply(String, u16),
}

/// Wraps the real store: records apply and sync, and can make them fail with
/// a message that must never reach a client. With `blocking`, it offers the
/// pipeline the store's blocking writes (recorded the same way), so the
/// pipeline runs them on its own threads as it does for the real store.
struct Recorder {
    inner: Arc<dyn Store>,
    log: Arc<Mutex<Vec<Event>>>,
    fail_apply: Arc<AtomicBool>,
    fail_sync: Arc<AtomicBool>,
    fail_reads: Arc<AtomicBool>,
    blocking: Option<Arc<RecordedWrites>>,
}

/// The store's blocking writes, recorded as [`Recorder`] records its own.
struct RecordedWrites {
    inner: Arc<dyn BlockingWrites>,
    log: Arc<Mutex<Vec<Event>>>,
    /// While set, `after_apply` waits (up to 10 s) before it forwards.
    hold_after_apply: Arc<AtomicBool>,
    fail_apply: Arc<AtomicBool>,
    fail_sync: Arc<AtomicBool>,
}

impl BlockingWrites for RecordedWrites {
    fn apply(&self, batch: WriteBatch) -> Result<BatchOutcome, StoreError> {
        let uuids = batch
            .requests
            .iter()
            .flatten()
            .map(|e| e.key.uuid.to_string())
            .collect();
        if self.fail_apply.load(SeqCst) {
            return Err(StoreError::Internal(SECRET.into()));
        }
        let out = self.inner.apply(batch)?;
        self.log.lock().unwrap().push(Event::Applied(uuids));
        Ok(out)
    }

    fn after_apply(&self) {
        self.log.lock().unwrap().push(Event::AfterApplyStarted);
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while self.hold_after_apply.load(SeqCst) && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
        self.inner.after_apply();
        self.log.lock().unwrap().push(Event::AfterApplyEnded);
    }

    fn sync(&self) -> Result<(), StoreError> {
        let n = {
            let mut log = self.log.lock().unwrap();
            let n = log
                .iter()
                .filter(|e| matches!(e, Event::SyncStarted(_)))
                .count();
            log.push(Event::SyncStarted(n));
            n
        };
        // Long enough for the next flush to be applied meanwhile.
        std::thread::sleep(Duration::from_millis(3));
        let result = if self.fail_sync.load(SeqCst) {
            Err(StoreError::Internal(SECRET.into()))
        } else {
            self.inner.sync()
        };
        self.log
            .lock()
            .unwrap()
            .push(Event::SyncEnded(n, result.is_ok()));
        result
    }
}

const SECRET: &str = "SECRET-DETAIL /var/lib/counters.sqlite3 errno 28";

impl Recorder {
    fn reads(&self) -> Result<(), StoreError> {
        if self.fail_reads.load(SeqCst) {
            return Err(StoreError::Unavailable(SECRET.into()));
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl Store for Recorder {
    async fn apply(&self, batch: WriteBatch) -> Result<BatchOutcome, StoreError> {
        let uuids = batch
            .requests
            .iter()
            .flatten()
            .map(|e| e.key.uuid.to_string())
            .collect();
        if self.fail_apply.load(SeqCst) {
            return Err(StoreError::Internal(SECRET.into()));
        }
        let out = self.inner.apply(batch).await?;
        self.log.lock().unwrap().push(Event::Applied(uuids));
        Ok(out)
    }
    async fn sync(&self) -> Result<(), StoreError> {
        let n = {
            let mut log = self.log.lock().unwrap();
            let n = log
                .iter()
                .filter(|e| matches!(e, Event::SyncStarted(_)))
                .count();
            log.push(Event::SyncStarted(n));
            n
        };
        // Long enough for the next flush to be applied meanwhile.
        tokio::time::sleep(Duration::from_millis(3)).await;
        let result = if self.fail_sync.load(SeqCst) {
            Err(StoreError::Internal(SECRET.into()))
        } else {
            self.inner.sync().await
        };
        self.log
            .lock()
            .unwrap()
            .push(Event::SyncEnded(n, result.is_ok()));
        result
    }
    async fn get(&self, key: &CounterKey) -> Result<Option<Counter>, StoreError> {
        self.reads()?;
        self.inner.get(key).await
    }
    async fn target_counters(&self, e: &str, u: &str) -> Result<Vec<Counter>, StoreError> {
        self.reads()?;
        self.inner.target_counters(e, u).await
    }
    async fn delete(&self, key: &CounterKey) -> Result<bool, StoreError> {
        self.inner.delete(key).await
    }
    async fn ready(&self) -> Result<(), StoreError> {
        self.inner.ready().await
    }
    async fn histogram(
        &self,
        key: &CounterKey,
        window: Window,
    ) -> Result<Option<Vec<Bucket>>, StoreError> {
        self.reads()?;
        self.inner.histogram(key, window).await
    }
    async fn top(&self, q: &TopQuery) -> Result<TopList, StoreError> {
        self.reads()?;
        self.inner.top(q).await
    }
    async fn stale(&self, q: &StaleQuery) -> Result<Vec<Counter>, StoreError> {
        self.inner.stale(q).await
    }
    async fn unused(&self, before_ms: i64) -> Result<Vec<UnusedPair>, StoreError> {
        self.inner.unused(before_ms).await
    }
    async fn average(
        &self,
        key: &CounterKey,
        window: Option<Window>,
    ) -> Result<Option<Average>, StoreError> {
        self.inner.average(key, window).await
    }
    async fn top_averages(&self, q: &TopAveragesQuery) -> Result<TopAverages, StoreError> {
        self.inner.top_averages(q).await
    }
    async fn get_many(&self, keys: &[CounterKey]) -> Result<Vec<Option<Counter>>, StoreError> {
        self.reads()?;
        self.inner.get_many(keys).await
    }

    async fn set_days(
        &self,
        sets: Vec<counter_gateway::domain::DaySet>,
        oldest_day: i64,
    ) -> Result<counter_gateway::store::DaysOutcome, StoreError> {
        self.inner.set_days(sets, oldest_day).await
    }
    async fn set_value(
        &self,
        set: counter_gateway::domain::CounterSet,
    ) -> Result<counter_gateway::domain::Counter, StoreError> {
        self.inner.set_value(set).await
    }
    async fn counter_page(
        &self,
        after: Option<CounterKey>,
        limit: usize,
        from_day: i64,
        hours_from_day: i64,
    ) -> Result<Vec<counter_gateway::store::CounterHistory>, StoreError> {
        self.inner
            .counter_page(after, limit, from_day, hours_from_day)
            .await
    }
    async fn average_page(
        &self,
        after: Option<CounterKey>,
        limit: usize,
        from_day: i64,
    ) -> Result<Vec<counter_gateway::store::AverageHistory>, StoreError> {
        self.inner.average_page(after, limit, from_day).await
    }
    async fn mark_page(
        &self,
        after: Option<counter_gateway::store::ActorMark>,
        limit: usize,
        from_day: i64,
    ) -> Result<Vec<counter_gateway::store::ActorMark>, StoreError> {
        self.inner.mark_page(after, limit, from_day).await
    }
    async fn import(
        &self,
        batch: counter_gateway::store::ImportBatch,
    ) -> Result<counter_gateway::store::ImportOutcome, StoreError> {
        self.inner.import(batch).await
    }
    async fn set_published(
        &self,
        sets: Vec<counter_gateway::store::PublishedSet>,
    ) -> Result<(), counter_gateway::store::StoreError> {
        self.inner.set_published(sets).await
    }
    async fn published(
        &self,
        entity: &str,
        uuid: &str,
    ) -> Result<Option<i64>, counter_gateway::store::StoreError> {
        self.inner.published(entity, uuid).await
    }
    async fn top_first_days(
        &self,
        q: &counter_gateway::store::FirstDaysQuery,
    ) -> Result<counter_gateway::store::FirstDaysList, counter_gateway::store::StoreError> {
        self.inner.top_first_days(q).await
    }
    async fn published_page(
        &self,
        after: Option<(String, String)>,
        limit: usize,
    ) -> Result<Vec<counter_gateway::store::TargetPublished>, counter_gateway::store::StoreError>
    {
        self.inner.published_page(after, limit).await
    }

    fn blocking_writes(&self) -> Option<Arc<dyn BlockingWrites>> {
        self.blocking.clone().map(|w| w as Arc<dyn BlockingWrites>)
    }
}

struct Recorded {
    app: TestApp,
    log: Arc<Mutex<Vec<Event>>>,
    hold_after_apply: Arc<AtomicBool>,
    fail_apply: Arc<AtomicBool>,
    fail_sync: Arc<AtomicBool>,
    fail_reads: Arc<AtomicBool>,
}

async fn recorded() -> Recorded {
    recorded_on(false).await
}

/// [`recorded`], with the pipeline on its own threads (`blocking`) or on
/// tasks calling the async `apply` and `sync`.
async fn recorded_on(blocking: bool) -> Recorded {
    let log = Arc::new(Mutex::new(Vec::new()));
    let fail_apply = Arc::new(AtomicBool::new(false));
    let fail_sync = Arc::new(AtomicBool::new(false));
    let fail_reads = Arc::new(AtomicBool::new(false));
    let hold_after_apply = Arc::new(AtomicBool::new(false));
    let held = hold_after_apply.clone();
    let (l, a, s, r) = (
        log.clone(),
        fail_apply.clone(),
        fail_sync.clone(),
        fail_reads.clone(),
    );
    let app = TestApp::start_wrapped(Options::default(), move |inner| {
        let writes = blocking.then(|| {
            Arc::new(RecordedWrites {
                inner: inner
                    .blocking_writes()
                    .expect("the embedded store's blocking writes"),
                log: l.clone(),
                hold_after_apply: held.clone(),
                fail_apply: a.clone(),
                fail_sync: s.clone(),
            })
        });
        Arc::new(Recorder {
            inner,
            log: l,
            fail_apply: a,
            fail_sync: s,
            fail_reads: r,
            blocking: writes,
        })
    })
    .await;
    Recorded {
        app,
        log,
        hold_after_apply,
        fail_apply,
        fail_sync,
        fail_reads,
    }
}

/// Sends one increment per uuid, all at once, and logs each answer into the
/// store's log as it arrives.
async fn increments(rec: &Recorded, prefix: &str, n: usize) {
    let mut tasks = Vec::new();
    for i in 0..n {
        let uuid = format!("{prefix}{i}");
        let url = rec.app.url(&counter_path("V", "VIEW", &uuid, "/increment"));
        let http = rec.app.http.clone();
        let log = rec.log.clone();
        tasks.push(tokio::spawn(async move {
            let r = common::read(http.post(url).json(&json!({})).send().await.unwrap()).await;
            log.lock().unwrap().push(Event::Reply(uuid, r.status));
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

/// No answer precedes the sync that began after its apply (and ended well);
/// a failed sync answers no 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_acknowledgement_precedes_the_fsync_that_covers_it() {
    acknowledgements_follow_their_fsync(false).await;
}

/// The same on the pipeline's own threads, the way it runs the embedded
/// store ([`BlockingWrites`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_acknowledgement_precedes_the_fsync_that_covers_it_on_the_pipelines_threads() {
    acknowledgements_follow_their_fsync(true).await;
}

async fn acknowledgements_follow_their_fsync(blocking: bool) {
    let rec = recorded_on(blocking).await;
    increments(&rec, "ok-", 64).await;
    let log = rec.log.lock().unwrap().clone();
    let mut acked = 0;
    for (at, e) in log.iter().enumerate() {
        let Event::Reply(uuid, status) = e else {
            continue;
        };
        assert_eq!(*status, 200, "{uuid}");
        acked += 1;
        let applied = log
            .iter()
            .position(|e| matches!(e, Event::Applied(u) if u.contains(uuid)))
            .unwrap_or_else(|| panic!("{uuid} answered but never applied"));
        assert!(applied < at, "{uuid} answered before its apply returned");
        let covered = log[applied..at].iter().any(|e| match e {
            Event::SyncStarted(k) => log[applied..at].contains(&Event::SyncEnded(*k, true)),
            _ => false,
        });
        assert!(
            covered,
            "{uuid} answered before a sync that began after its apply ended: {log:?}"
        );
    }
    assert_eq!(acked, 64);

    rec.fail_sync.store(true, SeqCst);
    rec.log.lock().unwrap().clear();
    increments(&rec, "lost-", 16).await;
    let log = rec.log.lock().unwrap().clone();
    for e in &log {
        if let Event::Reply(uuid, status) = e {
            assert_eq!(*status, 503, "{uuid} acknowledged though its sync failed");
        }
    }
}

/// The work a flush leaves (folding the change log, writing window totals
/// back) runs while its fsync does: an answer never waits for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_work_after_a_flush_never_delays_its_answer() {
    let rec = recorded_on(true).await;
    rec.hold_after_apply.store(true, SeqCst);
    increments(&rec, "held-", 1).await;
    rec.hold_after_apply.store(false, SeqCst);
    increments(&rec, "after-", 1).await;
    let log = rec.log.lock().unwrap().clone();
    let at = |e: &Event| log.iter().position(|x| x == e).unwrap();
    let applied = log
        .iter()
        .position(|e| matches!(e, Event::Applied(u) if u == &["held-0"]))
        .expect("applied");
    let started = at(&Event::AfterApplyStarted);
    let ended = at(&Event::AfterApplyEnded);
    let replied = at(&Event::Reply("held-0".into(), 200));
    assert!(applied < started, "after_apply before its flush: {log:?}");
    assert!(
        started < replied && replied < ended,
        "the answer waited for the work after its flush: {log:?}"
    );
    assert!(
        log.contains(&Event::Reply("after-0".into(), 200)),
        "{log:?}"
    );
}

/// A store's own words (paths, SQLite messages) stay in the log; clients
/// get a stable type and a short reason that keeps the meaning exact.
#[tokio::test]
async fn store_errors_reach_clients_as_a_type_and_a_short_reason() {
    let rec = recorded().await;
    let app = &rec.app;
    let path = counter_path("V", "VIEW", "e", "/increment");

    rec.fail_apply.store(true, SeqCst);
    let r = app.post(&path, json!({})).await;
    assert_error(&r, 503, "unavailable", &["nothing", "applied", "logged as"]);
    assert!(!r.text.contains("SECRET"), "{}", r.text);
    rec.fail_apply.store(false, SeqCst);

    rec.fail_sync.store(true, SeqCst);
    let r = app.post(&path, json!({})).await;
    assert_error(&r, 503, "unavailable", &["may or may not", "logged as"]);
    assert!(!r.text.contains("SECRET"), "{}", r.text);
    rec.fail_sync.store(false, SeqCst);

    rec.fail_reads.store(true, SeqCst);
    let r = app.get(&counter_path("V", "VIEW", "e", "")).await;
    assert_error(&r, 503, "unavailable", &["logged as"]);
    assert!(!r.text.contains("SECRET"), "{}", r.text);
    let r = app.get("/v1/top/V/VIEW").await;
    assert_error(&r, 503, "unavailable", &["logged as"]);
    assert!(!r.text.contains("SECRET"), "{}", r.text);
}

/// A full disk and a read-only database are told apart in the answer's
/// type and status and in `/metrics`, through the write pipeline and on a
/// direct write; SQLite's own words stay in the log.
#[tokio::test]
async fn a_full_or_read_only_database_answers_its_type() {
    let app = TestApp::start().await;
    let seed = counter_path("V", "VIEW", "seed", "");
    assert_eq!(
        app.post(&format!("{seed}/increment"), json!({}))
            .await
            .status,
        200
    );
    let batch = |from: usize| {
        let events: Vec<_> = (from..from + 500)
            .map(|i| json!({"entity": "V", "action": "VIEW", "uuid": format!("u{i}")}))
            .collect();
        json!({ "events": events })
    };
    let errors = |kind: &str| format!("counter_gateway_store_errors_total{{kind=\"{kind}\"}}");

    // Not one page more than the database has: 500 new counters need some.
    app.writer_sql.run("PRAGMA max_page_count = 1");
    let r = app.post("/v1/events", batch(0)).await;
    assert_error(
        &r,
        507,
        "store_full",
        &[
            "disk is full",
            "nothing of the request was applied",
            "logged as",
        ],
    );
    assert!(r.header("retry-after").is_none(), "{:?}", r.headers);
    assert!(!r.text.contains("database or disk"), "{}", r.text);
    assert_eq!(app.metric(&errors("full")).await, 1.0);
    assert_eq!(
        app.get(&counter_path("V", "VIEW", "u0", "")).await.status,
        404
    );

    app.writer_sql
        .run("PRAGMA max_page_count = 1073741823; PRAGMA query_only = ON");
    let r = app.post("/v1/events", batch(0)).await;
    assert_error(
        &r,
        500,
        "store_read_only",
        &[
            "read-only",
            "nothing of the request was applied",
            "logged as",
        ],
    );
    assert!(!r.text.contains("readonly"), "{}", r.text);
    assert_eq!(app.metric(&errors("read_only")).await, 1.0);
    // A delete writes on its own, outside the pipeline: the same type.
    let r = app.delete(&seed).await;
    assert_error(&r, 500, "store_read_only", &["logged as"]);
    // Reads have connections of their own, and still answer.
    assert_eq!(app.get(&seed).await.json["value"], 1);

    app.writer_sql.run("PRAGMA query_only = OFF");
    assert_eq!(app.post("/v1/events", batch(0)).await.status, 200);
    assert_eq!(
        app.get(&counter_path("V", "VIEW", "u499", "")).await.json["value"],
        1
    );
}
