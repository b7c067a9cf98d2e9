//! HTTP tests of `POST /v1/events`: batches as JSON and as `text/plain`
//! (what `navigator.sendBeacon` sends), and event-id idempotency within a
//! batch, across requests and across a restart on the same data directory.

mod common;

use chrono::Duration;
use common::{counter_path, now_secs, rendered, rfc3339, TestApp};
use serde_json::{json, Value};

fn ev(uuid: &str, count: i64) -> Value {
    json!({"entity": "VIDEO", "action": "VIEW", "uuid": uuid, "count": count})
}

fn ev_id(uuid: &str, count: i64, id: &str) -> Value {
    json!({"entity": "VIDEO", "action": "VIEW", "uuid": uuid, "count": count, "id": id})
}

#[tokio::test]
async fn a_json_batch_is_applied_whole() {
    let app = TestApp::start().await;
    let r = app
        .post(
            "/v1/events",
            json!({"events": [
                ev("a", 1),
                ev("b", 10),
                ev("a", -3),
                {"entity": "VIDEO", "action": "like", "uuid": "a"},
                ev("a", 100),
            ]}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json, json!({"accepted": 5, "duplicates": 0}));
    assert_eq!(app.value("VIDEO", "VIEW", "a").await, Some(98));
    assert_eq!(app.value("VIDEO", "VIEW", "b").await, Some(10));
    // `count` defaults to 1 in events too.
    assert_eq!(app.value("VIDEO", "like", "a").await, Some(1));
}

#[tokio::test]
async fn a_text_plain_batch_from_send_beacon_is_accepted() {
    let app = TestApp::start().await;
    let body = json!({"events": [ev("s", 2), ev("s", 3)]}).to_string();
    let r = app
        .post_raw("/v1/events", Some("text/plain;charset=UTF-8"), body.clone())
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json, json!({"accepted": 2, "duplicates": 0}));
    let r = app.post_raw("/v1/events", Some("text/plain"), body).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(app.value("VIDEO", "VIEW", "s").await, Some(10));
}

#[tokio::test]
async fn events_carry_category_and_timestamp() {
    let app = TestApp::start().await;
    let now = now_secs();
    let old = now - Duration::days(5);
    let r = app
        .post(
            "/v1/events",
            json!({"events": [
                {"entity": "VIDEO", "action": "VIEW", "uuid": "ct", "count": 2,
                 "category": "sports", "timestamp": rfc3339(old)},
                {"entity": "VIDEO", "action": "VIEW", "uuid": "ct",
                 "timestamp": rfc3339(now - Duration::hours(2))},
            ]}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let got = app.get(&counter_path("VIDEO", "VIEW", "ct", "")).await;
    assert_eq!(got.json["value"], 3, "{}", got.text);
    assert_eq!(got.json["category"], "sports");
    assert_eq!(got.json["first_timestamp"], rendered(old));
    assert_eq!(
        got.json["recorded_timestamp"],
        rendered(now - Duration::hours(2))
    );
}

#[tokio::test]
async fn events_without_id_are_never_deduplicated() {
    let app = TestApp::start().await;
    let body = json!({"events": [ev("n", 1), ev("n", 1)]});
    assert_eq!(
        app.post("/v1/events", body.clone()).await.json["accepted"],
        2
    );
    assert_eq!(app.post("/v1/events", body).await.json["accepted"], 2);
    assert_eq!(app.value("VIDEO", "VIEW", "n").await, Some(4));
}

#[tokio::test]
async fn the_same_id_twice_in_one_batch_counts_once() {
    let app = TestApp::start().await;
    let r = app
        .post(
            "/v1/events",
            json!({"events": [ev_id("x", 5, "e-1"), ev_id("x", 5, "e-1"), ev_id("x", 7, "e-2")]}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json, json!({"accepted": 2, "duplicates": 1}));
    assert_eq!(app.value("VIDEO", "VIEW", "x").await, Some(12));
}

#[tokio::test]
async fn the_same_id_across_requests_counts_once() {
    let app = TestApp::start().await;
    let first = json!({"events": [ev_id("y", 5, "r-1"), ev_id("z", 1, "r-2")]});
    let r = app.post("/v1/events", first.clone()).await;
    assert_eq!(
        r.json,
        json!({"accepted": 2, "duplicates": 0}),
        "{}",
        r.text
    );

    // The whole batch retried: nothing new.
    let r = app.post("/v1/events", first).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json, json!({"accepted": 0, "duplicates": 2}));

    // A batch mixing a seen id, a new id and no id.
    let r = app
        .post(
            "/v1/events",
            json!({"events": [ev_id("y", 5, "r-1"), ev_id("y", 100, "r-3"), ev("y", 1000)]}),
        )
        .await;
    assert_eq!(
        r.json,
        json!({"accepted": 2, "duplicates": 1}),
        "{}",
        r.text
    );
    assert_eq!(app.value("VIDEO", "VIEW", "y").await, Some(1105));
    assert_eq!(app.value("VIDEO", "VIEW", "z").await, Some(1));

    // Ids are one namespace across endpoints: the increment endpoint sees it too.
    let r = app
        .increment("VIDEO", "VIEW", "y", json!({"count": 5, "id": "r-1"}))
        .await;
    assert_eq!(r.json["value"], 1105, "{}", r.text);
}

#[tokio::test]
async fn concurrent_retries_of_one_id_count_once() {
    let app = TestApp::start().await;
    let body = json!({"events": [ev_id("race", 3, "same")]});
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let (http, url, body) = (app.http.clone(), app.url("/v1/events"), body.clone());
            tokio::spawn(async move {
                common::read(http.post(url).json(&body).send().await.unwrap()).await
            })
        })
        .collect();
    let (mut accepted, mut duplicates) = (0, 0);
    for t in tasks {
        let r = t.await.unwrap();
        assert_eq!(r.status, 200, "{}", r.text);
        accepted += r.json["accepted"].as_i64().unwrap();
        duplicates += r.json["duplicates"].as_i64().unwrap();
    }
    assert_eq!((accepted, duplicates), (1, 15));
    assert_eq!(app.value("VIDEO", "VIEW", "race").await, Some(3));
}

#[tokio::test]
async fn ids_are_remembered_across_a_restart() {
    let app = TestApp::start().await;
    let body = json!({"events": [ev_id("p", 4, "persist-1"), ev("p", 1)]});
    let r = app.post("/v1/events", body.clone()).await;
    assert_eq!(
        r.json,
        json!({"accepted": 2, "duplicates": 0}),
        "{}",
        r.text
    );

    let app = app.restart().await;
    assert_eq!(app.value("VIDEO", "VIEW", "p").await, Some(5));
    let r = app.post("/v1/events", body).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json, json!({"accepted": 1, "duplicates": 1}));
    assert_eq!(app.value("VIDEO", "VIEW", "p").await, Some(6));
}

/// Strings with JSON escapes cannot borrow from the body; they must still
/// name the same counter, category and id as their plain spelling.
#[tokio::test]
async fn escaped_strings_in_a_batch_mean_what_they_spell() {
    let app = TestApp::start().await;
    let body = r#"{"events": [
        {"entity": "VIDE\u004f", "action": "VIEW", "uuid": "esc", "category": "n\u0065ws", "id": "e\u002d1"},
        {"entity": "VIDEO", "action": "VI\u0045W", "uuid": "\u0065sc", "id": "e-1"},
        {"entity": "VIDEO", "action": "VIEW", "uuid": "esc", "count": 2}
    ]}"#;
    let r = app
        .post_raw("/v1/events", Some("application/json"), body)
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json, json!({"accepted": 2, "duplicates": 1}));
    let got = app.get(&counter_path("VIDEO", "VIEW", "esc", "")).await;
    assert_eq!(got.json["value"], 3, "{}", got.text);
    assert_eq!(got.json["category"], "news");
}

/// Events of one batch share their names; each keeps its own key,
/// category and timestamp all the same.
#[tokio::test]
async fn events_sharing_names_keep_their_own_category_and_timestamp() {
    let app = TestApp::start().await;
    let now = now_secs();
    let (five, three) = (now - Duration::days(5), now - Duration::days(3));
    let (one_h, two_h) = (now - Duration::hours(1), now - Duration::hours(2));
    let e = |uuid: &str, category: Option<&str>, ts| {
        let mut v =
            json!({"entity": "VIDEO", "action": "VIEW", "uuid": uuid, "timestamp": rfc3339(ts)});
        if let Some(c) = category {
            v["category"] = json!(c);
        }
        v
    };
    let r = app
        .post(
            "/v1/events",
            json!({"events": [
                e("sa", Some("news"), five),
                e("sb", Some("sports"), one_h),
                e("sa", None, two_h),
                e("sb", Some("news"), three),
                e("sc", None, now),
            ]}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let a = app.get(&counter_path("VIDEO", "VIEW", "sa", "")).await;
    assert_eq!(a.json["value"], 2, "{}", a.text);
    assert_eq!(a.json["category"], "news");
    assert_eq!(a.json["first_timestamp"], rendered(five));
    assert_eq!(a.json["recorded_timestamp"], rendered(two_h));
    let b = app.get(&counter_path("VIDEO", "VIEW", "sb", "")).await;
    assert_eq!(b.json["value"], 2, "{}", b.text);
    assert_eq!(b.json["category"], "news", "the last category given wins");
    assert_eq!(b.json["first_timestamp"], rendered(three));
    assert_eq!(b.json["recorded_timestamp"], rendered(one_h));
    let c = app.get(&counter_path("VIDEO", "VIEW", "sc", "")).await;
    assert_eq!(c.json["value"], 1, "{}", c.text);
    assert_eq!(c.json["category"], Value::Null, "{}", c.text);
}
