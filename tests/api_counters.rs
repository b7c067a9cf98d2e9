//! HTTP tests of the single-counter endpoints, the target listing, delete,
//! timestamps, categories, document ids and the operational endpoints.

mod common;

use chrono::Duration;
use common::{assert_error, counter_path, metric_in, now_secs, rendered, rfc3339, TestApp};
use serde_json::{json, Value};

const UUID: &str = "88d19b07-86d2-471d-be33-ed10eef5d38e";

fn keys_of(v: &Value) -> Vec<&str> {
    let mut k: Vec<&str> = v
        .as_object()
        .expect("an object")
        .keys()
        .map(String::as_str)
        .collect();
    k.sort_unstable();
    k
}

#[tokio::test]
async fn increment_defaults_to_one_and_answers_the_counter() {
    let app = TestApp::start().await;
    let path = counter_path("VIDEO", "VIEW", UUID, "/increment");

    // No body, no content type: count 1.
    let r = app.post_empty(&path).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        keys_of(&r.json),
        [
            "action",
            "counted",
            "entity",
            "first_timestamp",
            "id",
            "recorded_timestamp",
            "uuid",
            "value"
        ]
    );
    // The counter, and whether this request counted (no `skipped` then).
    assert_eq!(r.json["counted"], true);
    assert_eq!(r.json["entity"], "VIDEO");
    assert_eq!(r.json["action"], "VIEW");
    assert_eq!(r.json["uuid"], UUID);
    assert_eq!(r.json["value"], 1);

    // An empty JSON object: count 1 too.
    assert_eq!(app.post(&path, json!({})).await.json["value"], 2);
    // count n, then a negative count.
    assert_eq!(
        app.post(&path, json!({"count": 40})).await.json["value"],
        42
    );
    assert_eq!(
        app.post(&path, json!({"count": -50})).await.json["value"],
        -8
    );
    assert_eq!(app.post(&path, json!({"count": 0})).await.json["value"], -8);
    // A whitespace-only body counts as no body.
    let r = app.post_raw(&path, Some("application/json"), " \n").await;
    assert_eq!(r.json["value"], -7, "{}", r.text);

    let got = app.get(&counter_path("VIDEO", "VIEW", UUID, "")).await;
    assert_eq!(got.status, 200);
    assert_eq!(got.json["value"], -7);
    assert_eq!(got.json["id"], format!("VIDEO_VIEW_{UUID}"));
}

#[tokio::test]
async fn decrement_subtracts_its_count() {
    let app = TestApp::start().await;
    let path = counter_path("ARTICLE", "like", "a1", "/decrement");
    assert_eq!(app.post_empty(&path).await.json["value"], -1);
    assert_eq!(app.post(&path, json!({"count": 4})).await.json["value"], -5);
    // Decrementing by a negative count adds.
    assert_eq!(app.post(&path, json!({"count": -7})).await.json["value"], 2);
    assert_eq!(
        app.increment("ARTICLE", "like", "a1", json!({"count": 10}))
            .await
            .json["value"],
        12
    );
    assert_eq!(app.value("ARTICLE", "like", "a1").await, Some(12));
    // i64::MAX can be decremented: it negates within range.
    let r = app.post(&path, json!({"count": i64::MAX})).await;
    assert_eq!(r.json["value"], 12 - i64::MAX, "{}", r.text);
}

#[tokio::test]
async fn a_counter_never_counted_is_a_404_in_the_error_shape() {
    let app = TestApp::start().await;
    let r = app.get(&counter_path("VIDEO", "VIEW", "nobody", "")).await;
    assert_error(
        &r,
        404,
        "not_found",
        &["VIDEO/VIEW/nobody", "never been counted"],
    );
    // Counting another action of the same target does not create this one.
    app.increment("VIDEO", "like", "nobody", json!({})).await;
    assert_eq!(app.value("VIDEO", "VIEW", "nobody").await, None);
    assert_eq!(app.value("VIDEO", "like", "nobody").await, Some(1));
}

#[tokio::test]
async fn target_lists_every_counter_of_one_target_only() {
    let app = TestApp::start().await;
    for (e, a, u, n) in [
        ("VIDEO", "VIEW", "v1", 3),
        ("VIDEO", "like", "v1", 2),
        ("VIDEO", "comments:approvedComments", "v1", 9),
        ("VIDEO", "VIEW", "v2", 100),
        ("ARTICLE", "VIEW", "v1", 50),
    ] {
        let r = app.increment(e, a, u, json!({ "count": n })).await;
        assert_eq!(r.json["value"], n, "{}", r.text);
    }
    let r = app.get("/v1/targets/VIDEO/v1/counters").await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["entity"], "VIDEO");
    assert_eq!(r.json["uuid"], "v1");
    let listed: Vec<(String, i64)> = r.json["counters"]
        .as_array()
        .expect("counters")
        .iter()
        .map(|c| {
            assert_eq!(c["entity"], "VIDEO");
            assert_eq!(c["uuid"], "v1");
            (
                c["action"].as_str().unwrap().to_owned(),
                c["value"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        listed,
        [
            ("VIEW".to_owned(), 3),
            ("comments:approvedComments".to_owned(), 9),
            ("like".to_owned(), 2)
        ]
    );

    let r = app.get("/v1/targets/VIDEO/nothing-here/counters").await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["counters"], json!([]));
}

#[tokio::test]
async fn delete_removes_the_counter_and_a_new_increment_starts_afresh() {
    let app = TestApp::start().await;
    let old = now_secs() - Duration::days(30);
    app.increment(
        "VIDEO",
        "VIEW",
        "d1",
        json!({"count": 7, "timestamp": rfc3339(old), "category": "sports"}),
    )
    .await;
    app.increment("VIDEO", "like", "d1", json!({"count": 2}))
        .await;

    let path = counter_path("VIDEO", "VIEW", "d1", "");
    let r = app.delete(&path).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json, json!({"deleted": true}));

    assert_error(&app.get(&path).await, 404, "not_found", &["VIDEO/VIEW/d1"]);
    assert_error(
        &app.delete(&path).await,
        404,
        "not_found",
        &["VIDEO/VIEW/d1"],
    );
    // The other counter of the target is untouched.
    let listed = app.get("/v1/targets/VIDEO/d1/counters").await;
    let counters = listed.json["counters"].as_array().unwrap();
    assert_eq!(counters.len(), 1, "{}", listed.text);
    assert_eq!(counters[0]["action"], "like");
    assert_eq!(counters[0]["value"], 2);

    // A new increment starts from its own value, with no trace of the old one.
    let r = app
        .increment("VIDEO", "VIEW", "d1", json!({"count": 5}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["value"], 5);
    assert!(r.json.get("category").is_none(), "{}", r.text);
    assert_ne!(r.json["first_timestamp"], rendered(old), "{}", r.text);
    assert_eq!(app.value("VIDEO", "VIEW", "d1").await, Some(5));
}

#[tokio::test]
async fn recorded_timestamp_never_moves_back_and_first_timestamp_does() {
    let app = TestApp::start().await;
    let now = now_secs();
    let t = |d: Duration| rfc3339(now + d);

    let r = app
        .increment(
            "VIDEO",
            "VIEW",
            "t1",
            json!({"timestamp": t(-Duration::hours(1))}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let hour_ago = rendered(now - Duration::hours(1));
    assert_eq!(r.json["first_timestamp"], hour_ago);
    assert_eq!(r.json["recorded_timestamp"], hour_ago);

    // Older events: recorded stays, first moves back to the earliest.
    let r = app
        .increment(
            "VIDEO",
            "VIEW",
            "t1",
            json!({"timestamp": t(-Duration::days(10))}),
        )
        .await;
    assert_eq!(r.json["recorded_timestamp"], hour_ago, "{}", r.text);
    assert_eq!(
        r.json["first_timestamp"],
        rendered(now - Duration::days(10))
    );
    let r = app
        .increment(
            "VIDEO",
            "VIEW",
            "t1",
            json!({"timestamp": t(-Duration::days(3))}),
        )
        .await;
    assert_eq!(r.json["recorded_timestamp"], hour_ago, "{}", r.text);
    assert_eq!(
        r.json["first_timestamp"],
        rendered(now - Duration::days(10))
    );

    // A newer event moves recorded forward; the small clock skew is accepted.
    let ahead = now + Duration::minutes(2);
    let r = app
        .increment("VIDEO", "VIEW", "t1", json!({"timestamp": rfc3339(ahead)}))
        .await;
    assert_eq!(r.json["recorded_timestamp"], rendered(ahead), "{}", r.text);
    // An event without a timestamp is "now", which is behind `ahead`.
    let r = app.increment("VIDEO", "VIEW", "t1", json!({})).await;
    assert_eq!(r.json["recorded_timestamp"], rendered(ahead), "{}", r.text);
    assert_eq!(r.json["value"], 5);

    // Offsets other than Z are the same instant.
    let r = app
        .increment(
            "VIDEO",
            "VIEW",
            "t2",
            json!({"timestamp": "2000-01-01T00:00:00Z"}),
        )
        .await;
    assert_error(&r, 400, "invalid_request", &["timestamp", "retention"]);
    let local =
        (now - Duration::days(1)).with_timezone(&chrono::FixedOffset::east_opt(2 * 3600).unwrap());
    let r = app
        .increment(
            "VIDEO",
            "VIEW",
            "t2",
            json!({"timestamp": local.to_rfc3339()}),
        )
        .await;
    assert_eq!(
        r.json["first_timestamp"],
        rendered(now - Duration::days(1)),
        "{}",
        r.text
    );

    let got = app.get(&counter_path("VIDEO", "VIEW", "t1", "")).await;
    assert_eq!(got.json["recorded_timestamp"], rendered(ahead));
    assert_eq!(
        got.json["first_timestamp"],
        rendered(now - Duration::days(10))
    );
}

#[tokio::test]
async fn category_is_stored_and_kept_until_replaced() {
    let app = TestApp::start().await;
    let r = app
        .increment("VIDEO", "VIEW", "c1", json!({"category": "sports"}))
        .await;
    assert_eq!(r.json["category"], "sports", "{}", r.text);
    // An increment without category keeps it.
    let r = app
        .increment("VIDEO", "VIEW", "c1", json!({"count": 2}))
        .await;
    assert_eq!(r.json["category"], "sports", "{}", r.text);
    assert_eq!(
        app.get(&counter_path("VIDEO", "VIEW", "c1", "")).await.json["category"],
        "sports"
    );
    let r = app
        .increment("VIDEO", "VIEW", "c1", json!({"category": "news"}))
        .await;
    assert_eq!(r.json["category"], "news", "{}", r.text);
    assert_eq!(r.json["value"], 4);
    let listed = app.get("/v1/targets/VIDEO/c1/counters").await;
    assert_eq!(
        listed.json["counters"][0]["category"], "news",
        "{}",
        listed.text
    );
}

#[tokio::test]
async fn document_ids_are_plain_or_escaped_and_never_collide() {
    let app = TestApp::start().await;
    let r = app.increment("VIDEO", "VIEW", UUID, json!({})).await;
    assert_eq!(r.json["id"], format!("VIDEO_VIEW_{UUID}"));

    let r = app
        .increment("my_site", "page_view", "a_b", json!({}))
        .await;
    assert_eq!(r.json["id"], "my%5Fsite_page%5Fview_a%5Fb", "{}", r.text);
    assert_eq!(r.json["entity"], "my_site");
    assert_eq!(r.json["action"], "page_view");
    assert_eq!(r.json["uuid"], "a_b");

    let r = app.increment("100%", "VIEW", "u", json!({})).await;
    assert_eq!(r.json["id"], "100%25_VIEW_u", "{}", r.text);

    // Two keys whose naive ids would both be `a_b_c_d` stay apart.
    let r1 = app.increment("a_b", "c", "d", json!({"count": 1})).await;
    let r2 = app.increment("a", "b_c", "d", json!({"count": 10})).await;
    assert_ne!(r1.json["id"], r2.json["id"]);
    assert_eq!(app.value("a_b", "c", "d").await, Some(1));
    assert_eq!(app.value("a", "b_c", "d").await, Some(10));

    // Any visible UTF-8, percent-encoded in the path, round-trips.
    let r = app.increment("vidéo 🎬", "j'aime", "ü/ß", json!({})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["entity"], "vidéo 🎬");
    assert_eq!(r.json["uuid"], "ü/ß");
    assert_eq!(r.json["id"], "vidéo 🎬_j'aime_ü/ß");
    assert_eq!(app.value("vidéo 🎬", "j'aime", "ü/ß").await, Some(1));
}

#[tokio::test]
async fn an_increment_id_is_counted_once() {
    let app = TestApp::start().await;
    let body = json!({"count": 3, "id": "click-1"});
    let r = app.increment("VIDEO", "VIEW", "i1", body.clone()).await;
    assert_eq!(r.json["value"], 3, "{}", r.text);
    // The retry answers the counter as it stands, without counting again.
    let r = app.increment("VIDEO", "VIEW", "i1", body).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["value"], 3, "{}", r.text);
    let r = app
        .increment("VIDEO", "VIEW", "i1", json!({"count": 3, "id": "click-2"}))
        .await;
    assert_eq!(r.json["value"], 6, "{}", r.text);
}

#[tokio::test]
async fn health_readiness_and_metrics() {
    let app = TestApp::start().await;
    let r = app.get("/healthz").await;
    assert_eq!((r.status, r.json.clone()), (200, json!({"status": "ok"})));
    let r = app.get("/readyz").await;
    assert_eq!(
        (r.status, r.json.clone()),
        (200, json!({"status": "ready"}))
    );

    let before = app.get("/metrics").await;
    assert!(
        before
            .header("content-type")
            .unwrap()
            .starts_with("text/plain"),
        "{:?}",
        before.headers
    );
    assert_eq!(
        metric_in(&before.text, "counter_gateway_flushed_increments_total"),
        Some(0.0)
    );

    for _ in 0..3 {
        app.increment("VIDEO", "VIEW", "m1", json!({"count": 100}))
            .await;
    }
    let events: Vec<Value> = (0..5)
        .map(|i| json!({"entity": "VIDEO", "action": "VIEW", "uuid": format!("m{i}")}))
        .collect();
    let r = app.post("/v1/events", json!({ "events": events })).await;
    assert_eq!(r.status, 200, "{}", r.text);
    // Refused requests are not counted.
    app.increment("VIDEO", "VIEW", "", json!({})).await;

    assert_eq!(
        app.metric("counter_gateway_flushed_increments_total").await,
        8.0
    );
    assert!(app.metric("counter_gateway_flushes_total").await >= 1.0);
    assert_eq!(app.metric("counter_gateway_queue_depth").await, 0.0);
    for kind in ["busy", "full", "read_only", "corrupt", "other"] {
        let name = format!("counter_gateway_store_errors_total{{kind=\"{kind}\"}}");
        assert_eq!(app.metric(&name).await, 0.0, "{kind}");
    }
}
