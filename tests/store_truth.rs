//! The embedded store tells the truth under faults: a failure after the
//! commit is never reported as "nothing applied", a failed fsync stops every
//! later acknowledgement until restart, no answer precedes the fsync that
//! covers it, and store errors reach clients as a stable type and a short
//! reason (the detail stays in the log, under a request id).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{assert_error, counter_path, TestApp};
use counter_gateway::domain::{CounterKey, Increment, Kind, ManualClock};
use counter_gateway::store::sqlite::{Durability, SqliteStore};
use counter_gateway::store::{RequestOutcome, Store, WriteBatch};
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
    let store = SqliteStore::open(dir.path(), Durability::Relaxed, window, clock.clock()).unwrap();
    let one = |uuid: &str, id: &str, ms: i64| WriteBatch {
        requests: vec![vec![inc(uuid, Some(id), ms)]],
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
