//! The queue's bounds under a stuck store: each tenant holds at most its
//! share of the shared bound, so a stuck tenant gets 503 while the others
//! keep writing; the bound in bytes refuses writes long before the bound
//! in events would; a bound too small for the largest request is refused
//! at start-up.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{assert_error, Options, Resp, Stuck, TestApp};
use counter_gateway::pipeline::PipelineConfig;
use counter_gateway::Limits;
use serde_json::{json, Value};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

/// `n` events on the one counter `BQ/VIEW/<uuid>`.
fn batch(uuid: &str, n: usize) -> Value {
    let events: Vec<Value> = (0..n)
        .map(|_| json!({"entity": "BQ", "action": "VIEW", "uuid": uuid}))
        .collect();
    json!({ "events": events })
}

/// Posts `body` to `/v1/events` of `tenant` in the background.
fn post(app: &TestApp, tenant: &str, body: Value) -> JoinHandle<Resp> {
    let req = app
        .http
        .post(app.url("/v1/events"))
        .header("x-tenant", tenant)
        .json(&body);
    tokio::spawn(async move { common::read(req.send().await.expect("POST")).await })
}

/// Waits until the POST is either queued (the queue depth reached `depth`)
/// or answered; the answer when it was.
async fn queued_or_answered(
    app: &TestApp,
    task: &mut JoinHandle<Resp>,
    depth: f64,
) -> Option<Resp> {
    loop {
        if task.is_finished() {
            return Some(task.await.expect("POST task"));
        }
        if app.metric("counter_gateway_queue_depth").await >= depth {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn value_in(app: &TestApp, tenant: &str, uuid: &str) -> Option<i64> {
    let path = common::counter_path("BQ", "VIEW", uuid, "");
    let r = app
        .send(app.http.get(app.url(&path)).header("x-tenant", tenant))
        .await;
    match r.status {
        200 => r.json["value"].as_i64(),
        404 => None,
        s => panic!("{s}: {}", r.text),
    }
}

/// A gateway whose default tenant's store is stuck until the gate opens
/// (the other tenants' stores are not), with a queue of 100 events in all,
/// a tenant at most half of them, and batches of at most 10.
async fn stuck_default_tenant() -> (TestApp, Arc<Semaphore>) {
    let gate = Arc::new(Semaphore::new(0));
    let g = gate.clone();
    let options = Options {
        limits: Limits {
            max_events_per_request: 10,
            ..Options::default().limits
        },
        pipeline: PipelineConfig {
            queue_capacity: 100,
            tenant_queue_share: 50,
            ..PipelineConfig::default()
        },
        ..Options::default()
    };
    let app =
        TestApp::start_wrapped(options, move |inner| Arc::new(Stuck { inner, gate: g })).await;
    (app, gate)
}

fn assert_overloaded(r: &Resp) {
    assert_error(r, 503, "overloaded", &["queue is full"]);
    assert_eq!(r.header("retry-after"), Some("1"), "{}", r.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_tenant_fills_its_share_and_the_others_keep_writing() {
    // The default tenant's store is stuck; the others' are not.
    let (app, gate) = stuck_default_tenant().await;

    let mut stuck = Vec::new();
    for i in 1..=5 {
        let mut task = post(&app, "default", batch("stuck", 10));
        let answered = queued_or_answered(&app, &mut task, 10.0 * i as f64).await;
        assert!(answered.is_none(), "batch {i} answered: {answered:?}");
        stuck.push(task);
    }
    // Its share is full, though half the queue is free.
    assert_eq!(app.metric("counter_gateway_queue_depth").await, 50.0);
    let r = post(&app, "default", batch("refused", 1)).await.unwrap();
    assert_overloaded(&r);
    assert_eq!(app.metric("counter_gateway_overloaded_total").await, 1.0);

    // Another tenant writes on, more than a share in all, some at once.
    for round in 0..5 {
        let tasks: Vec<_> = (0..4)
            .map(|_| post(&app, "acme", batch("ok", 10)))
            .collect();
        for t in tasks {
            let r = t.await.unwrap();
            assert_eq!(r.status, 200, "round {round}: {}", r.text);
            assert_eq!(
                r.json,
                json!({"accepted": 10, "duplicates": 0}),
                "{}",
                r.text
            );
        }
    }
    assert_eq!(value_in(&app, "acme", "ok").await, Some(200));
    let r = post(&app, "default", batch("refused", 1)).await.unwrap();
    assert_overloaded(&r);

    // Once the store moves, what the stuck tenant was told is queued is there.
    gate.add_permits(1_000);
    for t in stuck {
        let r = t.await.unwrap();
        assert_eq!(
            r.json,
            json!({"accepted": 10, "duplicates": 0}),
            "{}",
            r.text
        );
    }
    assert_eq!(value_in(&app, "default", "stuck").await, Some(50));
    assert_eq!(value_in(&app, "default", "refused").await, None);
    assert_eq!(app.metric("counter_gateway_queue_depth").await, 0.0);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_byte_bound_refuses_long_before_the_event_bound() {
    let gate = Arc::new(Semaphore::new(0));
    let g = gate.clone();
    const QUEUE_BYTES: usize = 1024 * 1024;
    let options = Options {
        pipeline: PipelineConfig {
            queue_capacity: 1_000_000,
            queue_bytes: QUEUE_BYTES,
            tenant_queue_share: 100,
            ..PipelineConfig::default()
        },
        ..Options::default()
    };
    let app =
        TestApp::start_wrapped(options, move |inner| Arc::new(Stuck { inner, gate: g })).await;

    // Batches of 100 events with long names, each on its own counter,
    // until one is refused.
    let uuid = |i: usize| format!("{i:0>400}");
    let mut queued = Vec::new();
    let refused = loop {
        let i = queued.len();
        assert!(i < 1_000, "a megabyte never filled");
        let mut task = post(&app, "default", batch(&uuid(i), 100));
        match queued_or_answered(&app, &mut task, 100.0 * (i + 1) as f64).await {
            None => queued.push(task),
            Some(r) => break (i, r),
        }
    };
    let (refused, r) = refused;
    assert_overloaded(&r);
    let depth = app.metric("counter_gateway_queue_depth").await;
    assert!(depth < 10_000.0, "{depth} events held at the byte bound");
    assert_eq!(depth, 100.0 * refused as f64);
    let bytes = app.metric("counter_gateway_queue_bytes").await;
    assert!(
        bytes > 0.0 && bytes <= QUEUE_BYTES as f64,
        "{bytes} bytes held under a bound of {QUEUE_BYTES}"
    );
    // Each of 100 events holds at least its 400-byte uuid.
    assert!(bytes >= (refused * 100 * 400) as f64, "{bytes}");
    assert_eq!(app.metric("counter_gateway_overloaded_total").await, 1.0);

    gate.add_permits(1_000_000);
    for t in queued {
        let r = t.await.unwrap();
        assert_eq!(
            r.json,
            json!({"accepted": 100, "duplicates": 0}),
            "{}",
            r.text
        );
    }
    for i in 0..refused {
        assert_eq!(
            value_in(&app, "default", &uuid(i)).await,
            Some(100),
            "batch {i}"
        );
    }
    assert_eq!(value_in(&app, "default", &uuid(refused)).await, None);
    assert_eq!(app.metric("counter_gateway_queue_bytes").await, 0.0);
    // With the store moving, the same batch fits again.
    let r = app.post("/v1/events", batch(&uuid(refused), 100)).await;
    assert_eq!(r.status, 200, "{}", r.text);
    app.stop().await;
}

/// `counter-gateway serve` with `args`, expected to refuse to start.
fn refused_start(args: &[&str]) -> String {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_counter-gateway"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&data)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run the gateway");
    // A gateway that accepted the flags serves until stopped: give it a
    // minute to refuse, then stop it and fail (a guard, not a measurement).
    let mut status = None;
    for _ in 0..600 {
        status = child.try_wait().expect("wait");
        if status.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
        panic!("the gateway started with {args:?}");
    }
    let out = child.wait_with_output().expect("stderr");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "started with {args:?}: {stderr}");
    assert!(!data.exists(), "refused after touching the disk: {stderr}");
    stderr
}

#[test]
fn a_queue_too_small_for_the_largest_request_is_refused_at_start() {
    // 4 MiB bodies of up to 10,000 events (the defaults) need more than 4 MiB.
    let e = refused_start(&["--queue-bytes", "4194304", "--tenant-queue-share", "100"]);
    for flag in [
        "--queue-bytes",
        "--max-body-bytes",
        "--max-events-per-request",
    ] {
        assert!(e.contains(flag), "{flag} not named in {e}");
    }
    // Enough for the whole queue, not for one tenant's share of it.
    let e = refused_start(&["--queue-bytes", "16777216", "--tenant-queue-share", "10"]);
    assert!(e.contains("--tenant-queue-share"), "{e}");
    let e = refused_start(&["--queue-capacity", "20000", "--tenant-queue-share", "25"]);
    assert!(e.contains("--queue-capacity"), "{e}");
}

#[tokio::test]
async fn stopping_one_pipeline_leaves_the_shared_bound_open_for_the_others() {
    use counter_gateway::domain::{CounterKey, Increment, IncrementSpec, TimePolicy};
    use counter_gateway::metrics::Metrics;
    use counter_gateway::pipeline::{Pipeline, SharedQueue, SubmitError};
    use counter_gateway::store::sqlite::{Durability, SqliteStore};

    let clock = counter_gateway::domain::ManualClock::new(common::test_now());
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let config = PipelineConfig::default();
    let shared = Arc::new(SharedQueue::new(&config));
    let metrics = Arc::new(Metrics::default());
    let [(a, a_flusher), (b, b_flusher)] = dirs.each_ref().map(|dir| {
        let store = SqliteStore::open(
            dir.path(),
            Durability::Relaxed,
            Duration::from_secs(86_400),
            TimePolicy::default().retention_days,
            clock.clock(),
        )
        .expect("open store");
        Pipeline::start_sharing(
            Arc::new(store),
            config.clone(),
            metrics.clone(),
            shared.clone(),
        )
    });
    let one = || {
        let spec = IncrementSpec {
            entity: "BQ",
            action: "VIEW",
            uuid: "u",
            ..IncrementSpec::default()
        };
        vec![Increment::from_spec(&spec, &TimePolicy::default(), common::test_now()).unwrap()]
    };
    let key = CounterKey::new("BQ", "VIEW", "u").unwrap();
    let value = |p: &Pipeline| {
        let (p, key) = (p.clone(), key.clone());
        async move {
            p.submit(one(), Some(key))
                .await
                .map(|a| a.counter.unwrap().value)
        }
    };

    assert_eq!(value(&a).await, Ok(1));
    a.stop();
    a_flusher.await.expect("a's flusher ends");
    assert_eq!(value(&a).await, Err(SubmitError::ShuttingDown));
    // The other tenant's pipeline goes on under the same bound.
    assert_eq!(value(&b).await, Ok(1));
    assert_eq!(value(&b).await, Ok(2));
    assert_eq!(shared.depth(), 0);
    // Shutdown closes the bound for every pipeline.
    b.close();
    b_flusher.await.expect("b's flusher ends");
    assert_eq!(value(&b).await, Err(SubmitError::ShuttingDown));
}

/// Once a tenant's writes found its queue full, its later writes are
/// refused before their bodies are parsed (a malformed one gets 503, not
/// 400) until the queue drains to three quarters; other tenants' writes
/// are parsed as ever, and the tenant takes writes again once drained.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_out_of_room_refuses_before_parsing_until_it_drains() {
    let (app, gate) = stuck_default_tenant().await;
    let malformed = json!({"events": [{"entity": 1}]});

    // Before any refusal a malformed batch is parsed and named.
    let r = post(&app, "default", malformed.clone()).await.unwrap();
    assert_error(&r, 400, "invalid_events", &["invalid event"]);
    let mut stuck = Vec::new();
    for i in 1..=5 {
        let mut task = post(&app, "default", batch("stuck", 10));
        assert!(queued_or_answered(&app, &mut task, 10.0 * i as f64)
            .await
            .is_none());
        stuck.push(task);
    }
    assert_overloaded(&post(&app, "default", batch("refused", 1)).await.unwrap());
    // Now refused unparsed, however small or malformed.
    assert_overloaded(&post(&app, "default", malformed.clone()).await.unwrap());
    let single = app
        .post("/v1/counters/BQ/VIEW/single/increment", json!({}))
        .await;
    assert_overloaded(&single);
    // Another tenant is parsed and served as ever.
    let r = post(&app, "acme", malformed.clone()).await.unwrap();
    assert_error(&r, 400, "invalid_events", &["invalid event"]);
    assert_eq!(
        post(&app, "acme", batch("ok", 3)).await.unwrap().status,
        200
    );

    gate.add_permits(1_000);
    for t in stuck {
        assert_eq!(t.await.unwrap().status, 200);
    }
    let r = post(&app, "default", malformed).await.unwrap();
    assert_error(&r, 400, "invalid_events", &["invalid event"]);
    assert_eq!(
        post(&app, "default", batch("later", 2))
            .await
            .unwrap()
            .status,
        200
    );
    assert_eq!(value_in(&app, "default", "stuck").await, Some(50));
    assert_eq!(value_in(&app, "default", "later").await, Some(2));
    assert_eq!(value_in(&app, "default", "refused").await, None);
    assert_eq!(value_in(&app, "default", "single").await, None);
    app.stop().await;
}
