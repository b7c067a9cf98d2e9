//! Setting a counter's value over HTTP on the embedded store:
//! `PUT /v1/counters/{entity}/{action}/{uuid}` with `{"value": n}`. Admin
//! keys only, per tenant; durable and exact across a restart (including
//! over deltas the change log had not folded yet); ordered with
//! increments racing it; kept by an export and import; refused with
//! nothing written when the store cannot make it durable. What a set does
//! to buckets, lists, timestamps and bad values is in the conformance
//! scenario `tests/conformance/scenarios/set_value.json`, which every
//! store plays.

mod common;

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;

use chrono::Duration;
use common::{assert_error, counter_path, key_line, test_now, Options, TestApp};
use serde_json::{json, Value};

fn ts(n: i64) -> String {
    common::rfc3339(test_now() - Duration::days(n))
}

async fn set(app: &TestApp, uuid: &str, body: Value) -> common::Resp {
    let path = counter_path("VIDEO", "VIEW", uuid, "");
    app.send(app.http.put(app.url(&path)).json(&body)).await
}

/// The day buckets of a counter over the whole retention, as `(day, value)`.
async fn buckets(app: &TestApp, uuid: &str) -> Vec<(String, i64)> {
    let r = app
        .get(&counter_path(
            "VIDEO",
            "VIEW",
            uuid,
            "/histogram?interval=all",
        ))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    r.json["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                b["day"].as_str().unwrap().to_string(),
                b["value"].as_i64().unwrap(),
            )
        })
        .collect()
}

#[tokio::test]
async fn only_admin_keys_may_set_and_the_set_lands_in_their_tenant() {
    let keys =
        key_line("write", "*", "w") + &key_line("read", "*", "r") + &key_line("admin", "acme", "a");
    let app = TestApp::start_with(Options {
        keys,
        ..Options::default()
    })
    .await;
    let path = counter_path("VIDEO", "VIEW", "k", "");
    for key in ["w", "r"] {
        let r = app
            .send(
                app.http
                    .put(app.url(&path))
                    .bearer_auth(key)
                    .json(&json!({"value": 1})),
            )
            .await;
        assert_error(&r, 403, "forbidden", &["admin"]);
    }
    let r = app
        .send(app.http.put(app.url(&path)).json(&json!({"value": 1})))
        .await;
    assert_eq!(r.status, 401, "{}", r.text);
    // An admin key bound to acme naming another tenant.
    let r = app
        .send(
            app.http
                .put(app.url(&path))
                .bearer_auth("a")
                .header("x-tenant", "other")
                .json(&json!({"value": 1})),
        )
        .await;
    assert_eq!(r.status, 403, "{}", r.text);
    let r = app
        .send(
            app.http
                .put(app.url(&path))
                .bearer_auth("a")
                .json(&json!({"value": 77})),
        )
        .await;
    assert_eq!(
        (r.status, &r.json["value"]),
        (200, &json!(77)),
        "{}",
        r.text
    );
    // Nothing reached the default tenant; acme has it.
    let read = |tenant: Option<&'static str>| {
        let mut req = app.http.get(app.url(&path)).bearer_auth("r");
        if let Some(t) = tenant {
            req = req.header("x-tenant", t);
        }
        req
    };
    let r = app.send(read(None)).await;
    assert_eq!(r.status, 404, "{}", r.text);
    let r = app.send(read(Some("acme"))).await;
    assert_eq!(r.json["value"], 77, "{}", r.text);
}

/// A set over a counter whose recent increments are still in the change
/// log (not folded into its row): the fold that comes later (here: the
/// close of the store) must not add them on top of the set value.
#[tokio::test]
async fn a_set_is_durable_and_exact_over_deltas_not_folded_yet() {
    let app = TestApp::start().await;
    for _ in 0..3 {
        let r = app
            .increment(
                "VIDEO",
                "VIEW",
                "a",
                json!({"count": 5, "timestamp": ts(2)}),
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.text);
    }
    let r = set(&app, "a", json!({"value": 1000})).await;
    assert_eq!(
        (r.status, &r.json["value"]),
        (200, &json!(1000)),
        "{}",
        r.text
    );
    // Ordered after the set: this increment's answer shows it added.
    let r = app.increment("VIDEO", "VIEW", "a", json!({})).await;
    assert_eq!(r.json["value"], 1001, "{}", r.text);
    let app = app.restart().await;
    assert_eq!(app.value("VIDEO", "VIEW", "a").await, Some(1001));
    let today = common::rfc3339(test_now())[..10].to_string();
    let two_days_ago = ts(2)[..10].to_string();
    assert_eq!(
        buckets(&app, "a").await,
        vec![(two_days_ago, 15), (today, 1)]
    );
}

/// Increments racing a set of their counter: each acknowledged before the
/// set was sent is replaced by it, each sent after the set's answer adds
/// to it, and those in between count at most once each.
#[tokio::test]
async fn increments_racing_a_set_keep_its_order() {
    let app = Arc::new(TestApp::start().await);
    let r = app.increment("VIDEO", "VIEW", "hot", json!({})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let acked = Arc::new(AtomicI64::new(0));
    let after = Arc::new(AtomicI64::new(0));
    let set_done = Arc::new(AtomicBool::new(false));
    let adders: Vec<_> = (0..4)
        .map(|_| {
            let (app, acked, after, set_done) =
                (app.clone(), acked.clone(), after.clone(), set_done.clone());
            tokio::spawn(async move {
                for _ in 0..60 {
                    let sent_after_set = set_done.load(Ordering::SeqCst);
                    let r = app.increment("VIDEO", "VIEW", "hot", json!({})).await;
                    assert_eq!(r.status, 200, "{}", r.text);
                    acked.fetch_add(1, Ordering::SeqCst);
                    if sent_after_set {
                        after.fetch_add(1, Ordering::SeqCst);
                    }
                }
            })
        })
        .collect();
    // Let some increments be acknowledged first (no timing: a count).
    while acked.load(Ordering::SeqCst) < 20 {
        tokio::task::yield_now().await;
    }
    let acked_before = acked.load(Ordering::SeqCst);
    let r = set(&app, "hot", json!({"value": 10_000})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    set_done.store(true, Ordering::SeqCst);
    for a in adders {
        a.await.unwrap();
    }
    let total = acked.load(Ordering::SeqCst);
    let after = after.load(Ordering::SeqCst);
    let value = app.value("VIDEO", "VIEW", "hot").await.unwrap();
    assert!(
        value >= 10_000 + after && value <= 10_000 + (total - acked_before),
        "value {value}: {after} increments sent after the set, {acked_before} acknowledged before it, {total} in all"
    );
    // The buckets are what was counted, every increment once (+1: the first).
    let counted: i64 = buckets(&app, "hot").await.iter().map(|b| b.1).sum();
    assert_eq!(counted, total + 1);
}

/// An export writes the set as the part of the total no day holds
/// (`before`), so an import elsewhere gives the same counter and days.
#[tokio::test]
async fn an_export_and_import_keep_a_set_value() {
    let app = TestApp::start().await;
    let r = app
        .post(
            "/v1/events",
            json!({"events": [
                {"entity": "VIDEO", "action": "VIEW", "uuid": "a", "count": 4, "timestamp": ts(3)},
                {"entity": "VIDEO", "action": "VIEW", "uuid": "a", "count": 1},
            ]}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = set(&app, "a", json!({"value": 3})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let rules = counter_gateway::transfer::format::Rules {
        now: test_now(),
        policy: counter_gateway::domain::TimePolicy::default(),
    };
    let bar = indicatif::ProgressBar::hidden();
    let mut out = Vec::new();
    counter_gateway::transfer::export::write_all(
        app.state.store.as_ref(),
        &mut out,
        rules.oldest_day(),
        rules.oldest_hour_day(),
        &bar,
    )
    .await
    .unwrap();
    let text = String::from_utf8(out).unwrap();
    let line: Value = text
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|l| l["kind"] == "counter")
        .unwrap();
    assert_eq!((&line["value"], &line["before"]), (&json!(3), &json!(-2)));

    let other = TestApp::start().await;
    counter_gateway::transfer::import::read_all(
        other.state.store.as_ref(),
        text.as_bytes(),
        &rules,
        &counter_gateway::transfer::import::Options::default(),
        &bar,
    )
    .await
    .unwrap();
    assert_eq!(other.value("VIDEO", "VIEW", "a").await, Some(3));
    assert_eq!(buckets(&other, "a").await, buckets(&app, "a").await);
}

/// A set whose fsync fails is not acknowledged (503), and the store then
/// acknowledges nothing more, as for any write it cannot make durable.
#[tokio::test]
async fn a_set_that_cannot_be_made_durable_is_503() {
    let app = TestApp::start().await;
    let r = app.increment("VIDEO", "VIEW", "a", json!({})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    app.fsync_fault.arm();
    let r = set(&app, "a", json!({"value": 50})).await;
    assert_eq!(r.status, 503, "{}", r.text);
    assert!(r.text.contains("setting it again is safe"), "{}", r.text);
    let r = set(&app, "a", json!({"value": 50})).await;
    assert_eq!(r.status, 503, "{}", r.text);
}
