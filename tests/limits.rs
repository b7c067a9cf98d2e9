//! Each limit at the edge, in the one error shape: body size (413), events
//! per batch, the per-client rate limit (429 with Retry-After) and the
//! request timeout (503 `timeout`).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{
    assert_error, counter_path, key_line, Options, Stuck, TestApp, MAX_BODY_BYTES, MAX_EVENTS,
};
use serde_json::json;
use tokio::sync::Semaphore;

#[tokio::test]
async fn an_oversized_body_is_413() {
    let app = TestApp::start().await;
    let body = format!(
        "{{\"events\": [], \"pad\": \"{}\"}}",
        "x".repeat(MAX_BODY_BYTES)
    );
    let r = app
        .post_raw("/v1/events", Some("application/json"), body)
        .await;
    assert_error(&r, 413, "payload_too_large", &["limit"]);
}

#[tokio::test]
async fn too_many_events_in_a_batch_is_400_naming_the_limit() {
    let app = TestApp::start().await;
    let events: Vec<_> = (0..=MAX_EVENTS)
        .map(|i| json!({"entity": "L", "action": "VIEW", "uuid": format!("u{i}")}))
        .collect();
    let r = app.post("/v1/events", json!({ "events": events })).await;
    assert_error(
        &r,
        400,
        "invalid_request",
        &[&format!("limit of {MAX_EVENTS}")],
    );
    assert_eq!(app.value("L", "VIEW", "u0").await, None);
}

#[tokio::test]
async fn the_rate_limit_is_429_with_retry_after_per_client() {
    let keys = key_line("write", "*", "k1") + &key_line("write", "*", "k2");
    let app = TestApp::start_with(Options {
        keys,
        rate_limit_per_second: Some(1),
        ..Options::default()
    })
    .await;
    let path = counter_path("RL", "VIEW", "u", "/increment");
    let send = |key: &'static str| app.send(app.http.post(app.url(&path)).bearer_auth(key));
    // A burst of one passes; the next ones within the second do not.
    assert_eq!(send("k1").await.status, 200);
    let mut limited = None;
    for _ in 0..20 {
        let r = send("k1").await;
        if r.status == 429 {
            limited = Some(r);
            break;
        }
    }
    let r = limited.expect("20 requests at once stay within 1 a second");
    assert_error(&r, 429, "rate_limited", &["retry after"]);
    let after: u64 = r
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .unwrap();
    assert!((1..=2).contains(&after), "{after}");
    // Another key has its own budget.
    assert_eq!(send("k2").await.status, 200);
    // Guessing keys is limited too (by IP): 401s turn into 429s.
    let mut statuses = Vec::new();
    for _ in 0..20 {
        statuses.push(send("guess").await.status);
    }
    assert_eq!(statuses[0], 401);
    assert!(statuses.contains(&429), "{statuses:?}");
}

#[tokio::test]
async fn without_keys_the_rate_limit_counts_by_ip() {
    let app = TestApp::start_with(Options {
        rate_limit_per_second: Some(1),
        ..Options::default()
    })
    .await;
    let mut statuses = Vec::new();
    for _ in 0..20 {
        statuses.push(app.get("/v1/top/RL/VIEW").await.status);
    }
    assert_eq!(statuses[0], 200);
    assert!(statuses.contains(&429), "{statuses:?}");
    // Operations endpoints are not limited.
    assert_eq!(app.get("/healthz").await.status, 200);
}

#[tokio::test]
async fn a_request_past_the_timeout_is_503_timeout() {
    let gate = Arc::new(Semaphore::new(0));
    let g = gate.clone();
    let app = TestApp::start_wrapped(
        Options {
            request_timeout: Some(Duration::from_millis(200)),
            ..Options::default()
        },
        move |inner| Arc::new(Stuck { inner, gate: g }),
    )
    .await;
    let r = app.increment("TO", "VIEW", "u", json!({})).await;
    assert_error(&r, 503, "timeout", &["did not finish", "event id"]);
    // Reads do not wait for the store's writer and still answer.
    assert_eq!(app.get("/healthz").await.status, 200);
    gate.add_permits(1_000);
    app.stop().await;
}
