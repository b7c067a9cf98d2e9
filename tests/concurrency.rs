//! Many concurrent clients on a few hot keys: single increments, decrements
//! and batches, positive and negative, end with exact totals; a full queue
//! answers 503 with `Retry-After`; a failing store answers 503 and applies
//! nothing.

mod common;

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use common::{assert_error, counter_path, Options, TestApp};
use counter_gateway::pipeline::PipelineConfig;
use counter_gateway::store::{Store, StoreError};
use counter_gateway::Limits;
use serde_json::{json, Value};
use tokio::sync::Semaphore;

/// Concurrent clients, and requests each sends (sequentially).
#[derive(Clone, Copy)]
struct Load {
    tasks: usize,
    requests: usize,
}

const HEAVY: Load = Load {
    tasks: 64,
    requests: 60,
};
const HOT: [&str; 3] = ["hot-a", "hot-b", "hot-c"];

/// What request `j` of task `i` sends: `(uuid, count)` pairs, and whether it
/// goes as a batch (`/v1/events`), an increment or a decrement.
enum Req {
    Increment(&'static str, i64),
    Decrement(&'static str, i64),
    Batch(Vec<(&'static str, i64)>),
}

fn request(i: usize, j: usize) -> Req {
    let count = |k: usize| ((i * 31 + j * 7 + k * 13) % 23) as i64 - 9;
    let key = |k: usize| HOT[(i + j + k) % HOT.len()];
    match j % 4 {
        0 | 1 => Req::Increment(key(0), count(0)),
        2 => Req::Decrement(key(0), count(0)),
        _ => Req::Batch((0..(1 + (i + j) % 7)).map(|k| (key(k), count(k))).collect()),
    }
}

/// The totals the requests of all tasks must add up to.
fn expected(load: Load) -> [i64; 3] {
    let mut totals = [0i64; 3];
    let mut add = |u: &str, n: i64| {
        let idx = HOT.iter().position(|h| *h == u).unwrap();
        totals[idx] += n;
    };
    for i in 0..load.tasks {
        for j in 0..load.requests {
            match request(i, j) {
                Req::Increment(u, n) => add(u, n),
                Req::Decrement(u, n) => add(u, -n),
                Req::Batch(evs) => evs.into_iter().for_each(|(u, n)| add(u, n)),
            }
        }
    }
    totals
}

async fn hammer(app: &TestApp, load: Load) {
    let tasks: Vec<_> = (0..load.tasks)
        .map(|i| {
            let (http, base) = (app.http.clone(), app.base.clone());
            tokio::spawn(async move {
                for j in 0..load.requests {
                    let (path, body) = match request(i, j) {
                        Req::Increment(u, n) => (
                            counter_path("VIDEO", "VIEW", u, "/increment"),
                            json!({ "count": n }),
                        ),
                        Req::Decrement(u, n) => (
                            counter_path("VIDEO", "VIEW", u, "/decrement"),
                            json!({ "count": n }),
                        ),
                        Req::Batch(evs) => {
                            let events: Vec<Value> = evs
                                .iter()
                                .map(|(u, n)| json!({"entity": "VIDEO", "action": "VIEW", "uuid": u, "count": n}))
                                .collect();
                            ("/v1/events".to_owned(), json!({ "events": events }))
                        }
                    };
                    let res = http
                        .post(format!("{base}{path}"))
                        .json(&body)
                        .send()
                        .await
                        .expect("send");
                    let r = common::read(res).await;
                    assert_eq!(r.status, 200, "task {i} request {j}: {}", r.text);
                    if path == "/v1/events" {
                        let n = body["events"].as_array().unwrap().len();
                        assert_eq!(r.json, json!({"accepted": n, "duplicates": 0}));
                    } else {
                        assert!(r.json["value"].is_i64(), "{}", r.text);
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("client task");
    }
}

async fn assert_totals(app: &TestApp, load: Load) {
    let want = expected(load);
    // The workload must not cancel itself out to something trivial.
    assert!(want.iter().all(|&t| t != 0), "{want:?}");
    for (u, total) in HOT.iter().zip(want) {
        assert_eq!(app.value("VIDEO", "VIEW", u).await, Some(total), "{u}");
    }
    let listed = app.get("/v1/targets/VIDEO/hot-a/counters").await;
    assert_eq!(
        listed.json["counters"][0]["value"], want[0],
        "{}",
        listed.text
    );
    let requests = (load.tasks * load.requests) as f64;
    let events: usize = (0..load.tasks)
        .flat_map(|i| (0..load.requests).map(move |j| (i, j)))
        .map(|(i, j)| match request(i, j) {
            Req::Batch(e) => e.len(),
            _ => 1,
        })
        .sum();
    assert_eq!(
        app.metric("counter_gateway_flushed_increments_total").await,
        events as f64
    );
    // Coalescing: fewer flushes than requests is expected, but never more.
    assert!(app.metric("counter_gateway_flushes_total").await <= requests);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_clients_on_hot_keys_end_with_exact_totals() {
    let app = TestApp::start().await;
    hammer(&app, HEAVY).await;
    assert_totals(&app, HEAVY).await;
    // And they are durable: a restart reads the same.
    let app = app.restart().await;
    for (u, total) in HOT.iter().zip(expected(HEAVY)) {
        assert_eq!(app.value("VIDEO", "VIEW", u).await, Some(total), "{u}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exact_totals_with_a_lingering_flusher_and_small_flushes() {
    let app = TestApp::start_with(Options {
        pipeline: PipelineConfig {
            flush_interval: Duration::from_millis(2),
            max_batch_events: 16,
            ..PipelineConfig::default()
        },
        ..Options::default()
    })
    .await;
    let load = Load {
        tasks: 32,
        requests: 25,
    };
    hammer(&app, load).await;
    assert_totals(&app, load).await;
}

/// A store whose flushes wait until the test opens the gate, so the queue
/// fills deterministically.
struct Gated {
    inner: Arc<dyn Store>,
    gate: Arc<Semaphore>,
    /// While set, flushes fail as an unreachable store would.
    fail: Arc<AtomicBool>,
}

store_wrapper!(Gated, |self, batch| {
    let _open = self.gate.acquire().await.expect("gate");
    if self.fail.load(SeqCst) {
        return Err(StoreError::Unavailable("disk on fire".into()));
    }
    self.inner.apply(batch).await
});

async fn wait_for_depth(app: &TestApp, depth: f64) {
    for _ in 0..2_000 {
        if app.metric("counter_gateway_queue_depth").await == depth {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("queue depth never reached {depth}");
}

fn batch(uuid: &str, n: usize) -> Value {
    let events: Vec<Value> = (0..n)
        .map(|_| json!({"entity": "BP", "action": "VIEW", "uuid": uuid}))
        .collect();
    json!({ "events": events })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_answers_503_with_retry_after_and_applies_nothing() {
    let gate = Arc::new(Semaphore::new(0));
    let options = Options {
        limits: Limits {
            max_events_per_request: 10,
            ..Options::default().limits
        },
        pipeline: PipelineConfig {
            queue_capacity: 10,
            // One tenant, all of the queue its own.
            tenant_queue_share: 100,
            ..PipelineConfig::default()
        },
        ..Options::default()
    };
    let g = gate.clone();
    let app = TestApp::start_wrapped(options, move |inner| {
        Arc::new(Gated {
            inner,
            gate: g,
            fail: Arc::default(),
        })
    })
    .await;
    let post = |path: String, body: Value| {
        let (http, url) = (app.http.clone(), app.url(&path));
        tokio::spawn(
            async move { common::read(http.post(url).json(&body).send().await.unwrap()).await },
        )
    };

    // Six events held in a flush the store has not confirmed.
    let first = post("/v1/events".into(), batch("a", 6));
    wait_for_depth(&app, 6.0).await;
    // Five more do not fit in a queue of ten.
    let r = app.post("/v1/events", batch("b", 5)).await;
    assert_error(&r, 503, "overloaded", &["queue is full"]);
    assert_eq!(r.header("retry-after"), Some("1"));
    // One more does.
    let second = post(counter_path("BP", "VIEW", "b", "/increment"), json!({}));
    wait_for_depth(&app, 7.0).await;
    assert_eq!(app.metric("counter_gateway_overloaded_total").await, 1.0);

    gate.add_permits(1_000);
    let first = first.await.unwrap();
    assert_eq!(
        first.json,
        json!({"accepted": 6, "duplicates": 0}),
        "{}",
        first.text
    );
    let second = second.await.unwrap();
    assert_eq!(second.json["value"], 1, "{}", second.text);
    assert_eq!(app.value("BP", "VIEW", "a").await, Some(6));
    assert_eq!(app.value("BP", "VIEW", "b").await, Some(1));
    assert_eq!(app.metric("counter_gateway_queue_depth").await, 0.0);
}

#[tokio::test]
async fn a_failing_store_is_503_and_nothing_is_applied() {
    let fail = Arc::new(AtomicBool::new(false));
    let f = fail.clone();
    let app = TestApp::start_wrapped(Options::default(), move |inner| {
        Arc::new(Gated {
            inner,
            gate: Arc::new(Semaphore::new(1_000)),
            fail: f,
        })
    })
    .await;
    let r = app.increment("SF", "VIEW", "u", json!({"count": 2})).await;
    assert_eq!(r.json["value"], 2, "{}", r.text);

    fail.store(true, SeqCst);
    let r = app.increment("SF", "VIEW", "u", json!({"count": 5})).await;
    assert_error(
        &r,
        503,
        "unavailable",
        &["nothing of the request was applied"],
    );
    let r = app.post("/v1/events", batch("u", 3)).await;
    assert_error(
        &r,
        503,
        "unavailable",
        &["nothing of the request was applied"],
    );
    assert_eq!(
        app.metric("counter_gateway_store_errors_total{kind=\"unavailable\"}")
            .await,
        2.0
    );

    fail.store(false, SeqCst);
    assert_eq!(app.value("SF", "VIEW", "u").await, Some(2));
    assert_eq!(app.value("BP", "VIEW", "u").await, None);
    let r = app.increment("SF", "VIEW", "u", json!({"count": 5})).await;
    assert_eq!(r.json["value"], 7, "{}", r.text);
}
