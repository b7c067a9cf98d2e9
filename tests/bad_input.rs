//! Every kind of bad input gets a 4xx in the one JSON error shape, naming the
//! problem, and leaves the store exactly as it was. Overflow is refused with a
//! 409 and changes nothing, while its neighbours in the same flush still land.

mod common;

use std::time::Duration as StdDuration;

use chrono::Duration;
use common::{
    assert_error, counter_path, now_secs, rfc3339, Options, Resp, TestApp, MAX_BODY_BYTES,
    MAX_EVENTS,
};
use counter_gateway::pipeline::PipelineConfig;
use serde_json::{json, Value};

const SEED: i64 = 5;

/// An app holding one counter, `VIDEO/VIEW/seed` = 5; every bad request below
/// aims at it (or at a key that must stay absent).
async fn seeded() -> TestApp {
    let app = TestApp::start().await;
    let r = app
        .increment("VIDEO", "VIEW", "seed", json!({"count": SEED}))
        .await;
    assert_eq!(r.json["value"], SEED, "{}", r.text);
    app
}

/// Nothing was written since [`seeded`]: the seed is intact, no other counter
/// of its target appeared, and the pipeline flushed no other increment.
async fn assert_unchanged(app: &TestApp) {
    assert_eq!(app.value("VIDEO", "VIEW", "seed").await, Some(SEED));
    let listed = app.get("/v1/targets/VIDEO/seed/counters").await;
    assert_eq!(
        listed.json["counters"].as_array().map(Vec::len),
        Some(1),
        "{}",
        listed.text
    );
    assert_eq!(
        app.metric("counter_gateway_flushed_increments_total").await,
        1.0
    );
}

const SEED_INC: &str = "/v1/counters/VIDEO/VIEW/seed/increment";

async fn post_text(app: &TestApp, path: &str, body: &str) -> Resp {
    app.post_raw(path, Some("application/json"), body.to_owned())
        .await
}

fn seed_event(extra: Value) -> Value {
    let mut e = json!({"entity": "VIDEO", "action": "VIEW", "uuid": "seed"});
    for (k, v) in extra.as_object().unwrap() {
        e[k] = v.clone();
    }
    e
}

/// Details of an `invalid_events` answer as `(index, reason)`.
fn details(r: &Resp) -> Vec<(u64, String)> {
    r.json["error"]["details"]
        .as_array()
        .unwrap_or_else(|| panic!("no details in {}", r.text))
        .iter()
        .map(|d| {
            (
                d["index"].as_u64().unwrap(),
                d["reason"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// Posts a batch of one event and expects it refused with `mentions` in the
/// reason of event 0.
async fn assert_bad_event(app: &TestApp, event: Value, mentions: &[&str]) {
    let r = app.post("/v1/events", json!({ "events": [event] })).await;
    assert_error(
        &r,
        400,
        "invalid_events",
        &["none of its events was applied"],
    );
    let d = details(&r);
    assert_eq!(d.len(), 1, "{}", r.text);
    assert_eq!(d[0].0, 0);
    for m in mentions {
        assert!(
            d[0].1.contains(m),
            "reason {:?} does not mention {m:?}",
            d[0].1
        );
    }
}

#[tokio::test]
async fn malformed_json_is_refused() {
    let app = seeded().await;
    for body in [
        r#"{"count": 1"#,
        "not json",
        r#"{"count": 1} {"count": 1}"#,
        "[1]",
        "\"x\"",
    ] {
        let r = post_text(&app, SEED_INC, body).await;
        assert_eq!(r.status, 400, "{body}: {}", r.text);
        assert_error(&r, 400, "invalid_request", &[]);
    }
    let r = post_text(&app, SEED_INC, r#"{"count": 1"#).await;
    assert_error(&r, 400, "invalid_request", &["malformed JSON"]);
    let r = post_text(&app, SEED_INC, r#"{"count": 1} x"#).await;
    assert_error(&r, 400, "invalid_request", &["trailing"]);
    let r = post_text(&app, "/v1/events", r#"{"events": [{"entity": "VIDEO""#).await;
    assert_error(&r, 400, "invalid_request", &["malformed JSON"]);
    let r = post_text(&app, "/v1/events", "{\"events\": [] ,}").await;
    assert_error(&r, 400, "invalid_request", &["malformed JSON"]);
    assert_unchanged(&app).await;
}

/// serde's derived structs also accept a JSON array, field by field in
/// order; `[7]` must not count 7, nor an event be given as a list.
#[tokio::test]
async fn arrays_in_place_of_objects_are_refused() {
    let app = seeded().await;
    for body in ["[7]", "[7, \"sports\"]", "[]"] {
        let r = post_text(&app, SEED_INC, body).await;
        assert_error(&r, 400, "invalid_request", &["object"]);
    }
    let r = post_text(
        &app,
        "/v1/events",
        r#"[[{"entity": "VIDEO", "action": "VIEW", "uuid": "seed"}]]"#,
    )
    .await;
    assert_error(&r, 400, "invalid_request", &["object"]);
    let r = post_text(
        &app,
        "/v1/events",
        r#"{"events": [{"entity": "VIDEO", "action": "VIEW", "uuid": "seed"}, ["VIDEO", "VIEW", "seed", 7]]}"#,
    )
    .await;
    assert_error(&r, 400, "invalid_events", &[]);
    let d = details(&r);
    assert_eq!(d.len(), 1, "{}", r.text);
    assert_eq!(d[0].0, 1);
    assert!(d[0].1.contains("object"), "{}", r.text);
    assert_unchanged(&app).await;
}

#[tokio::test]
async fn wrong_types_are_refused_naming_the_field() {
    let app = seeded().await;
    for (body, field) in [
        (json!({"count": "5"}), "count"),
        (json!({"count": true}), "count"),
        (json!({"count": null, "category": 5}), "category"),
        (json!({"timestamp": 1_700_000_000}), "timestamp"),
        (json!({"id": 7}), "id"),
    ] {
        let r = app.post(SEED_INC, body.clone()).await;
        assert_error(&r, 400, "invalid_request", &[field, "invalid type"]);
    }
    let r = app
        .post("/v1/events", json!({"events": {"entity": "VIDEO"}}))
        .await;
    assert_error(&r, 400, "invalid_request", &["events", "invalid type"]);
    assert_bad_event(
        &app,
        seed_event(json!({"entity": 1})),
        &["entity", "invalid type"],
    )
    .await;
    assert_bad_event(
        &app,
        seed_event(json!({"count": "1"})),
        &["count", "invalid type"],
    )
    .await;
    assert_bad_event(&app, json!("VIDEO/VIEW/seed"), &["invalid type"]).await;
    assert_unchanged(&app).await;
}

#[tokio::test]
async fn floats_and_numbers_past_i64_are_refused() {
    let app = seeded().await;
    for raw in [
        "1.5",
        "1.0",
        "1e3",
        "-0.5",
        "9223372036854775808",
        "-9223372036854775809",
        "18446744073709551616",
        "99999999999999999999999",
    ] {
        let r = post_text(&app, SEED_INC, &format!("{{\"count\": {raw}}}")).await;
        assert_error(&r, 400, "invalid_request", &["count"]);
        let r = post_text(
            &app,
            "/v1/events",
            &format!(
                r#"{{"events": [{{"entity": "VIDEO", "action": "VIEW", "uuid": "seed", "count": {raw}}}]}}"#
            ),
        )
        .await;
        assert_error(&r, 400, "invalid_events", &[]);
        assert_eq!(details(&r).len(), 1, "{}", r.text);
        assert!(details(&r)[0].1.contains("count"), "{}", r.text);
    }
    // The reason says what was wrong with the value.
    let r = post_text(&app, SEED_INC, "{\"count\": 1.5}").await;
    assert_error(&r, 400, "invalid_request", &["count", "floating point"]);
    assert_unchanged(&app).await;
}

#[tokio::test]
async fn unknown_fields_are_refused_by_name() {
    let app = seeded().await;
    let r = app.post(SEED_INC, json!({"cout": 2})).await;
    assert_error(&r, 400, "invalid_request", &["cout"]);
    let r = app
        .post(SEED_INC, json!({"count": 2, "categroy": "x"}))
        .await;
    assert_error(&r, 400, "invalid_request", &["categroy"]);
    let r = app
        .post(
            "/v1/events",
            json!({"events": [seed_event(json!({}))], "extra": 1}),
        )
        .await;
    assert_error(&r, 400, "invalid_request", &["extra"]);
    assert_bad_event(&app, seed_event(json!({"cont": 1})), &["cont"]).await;
    assert_unchanged(&app).await;
}

#[tokio::test]
async fn bad_names_in_the_path_are_refused() {
    let app = seeded().await;
    let long = "x".repeat(513);
    for (e, a, u, mentions) in [
        ("VIDEO", "VIEW", " ", vec!["uuid", "visible"]),
        ("VIDEO", &long[..], "seed", vec!["action", "513 bytes"]),
        (
            "VIDEO\n",
            "VIEW",
            "seed",
            vec!["entity", "control character U+000A"],
        ),
        (
            "VIDEO",
            "VI\0EW",
            "seed",
            vec!["action", "control character U+0000"],
        ),
        (
            "VIDEO",
            "VIEW",
            "seed\u{7f}",
            vec!["uuid", "control character U+007F"],
        ),
        (
            "VIDEO",
            "VIEW",
            "se\u{85}ed",
            vec!["uuid", "control character U+0085"],
        ),
    ] {
        for suffix in ["/increment", "/decrement", ""] {
            let path = counter_path(e, a, u, suffix);
            let r = if suffix.is_empty() {
                app.get(&path).await
            } else {
                app.post_empty(&path).await
            };
            assert_error(&r, 400, "invalid_request", &mentions);
        }
        let r = app.delete(&counter_path(e, a, u, "")).await;
        assert_error(&r, 400, "invalid_request", &mentions);
    }
    let r = app
        .get(&format!("/v1/targets/VIDEO/{}/counters", "%01"))
        .await;
    assert_error(&r, 400, "invalid_request", &["uuid", "control"]);
    // Invalid UTF-8 in the path.
    let r = app
        .post_empty("/v1/counters/VIDEO/%FF/seed/increment")
        .await;
    assert_error(&r, 400, "invalid_request", &[]);
    // An empty segment is an empty name.
    let r = app.post_empty("/v1/counters/VIDEO//seed/increment").await;
    assert_error(&r, 400, "invalid_request", &["action must not be empty"]);
    // 512 bytes is still a valid name (its id is then too long, see below).
    let ok = "y".repeat(500);
    let r = app.increment("V", "A", &ok, json!({})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(app.value("V", "A", &ok).await, Some(1));
    let r = app.delete(&counter_path("V", "A", &ok, "")).await;
    assert_eq!(r.status, 200, "{}", r.text);
    // Only that one valid request was counted.
    assert_eq!(
        app.metric("counter_gateway_flushed_increments_total").await,
        2.0
    );
    assert_eq!(app.value("VIDEO", "VIEW", "seed").await, Some(SEED));
}

#[tokio::test]
async fn bad_names_in_events_are_refused() {
    let app = seeded().await;
    let long = "x".repeat(513);
    for (extra, mentions) in [
        (json!({"entity": ""}), vec!["entity", "must not be empty"]),
        (json!({"action": long}), vec!["action", "513 bytes"]),
        (
            json!({"uuid": "a\tb"}),
            vec!["uuid", "control character U+0009"],
        ),
        (json!({"uuid": "\u{1b}[31m"}), vec!["uuid", "control"]),
        (
            json!({"category": ""}),
            vec!["category", "must not be empty"],
        ),
        (json!({"category": "a\nb"}), vec!["category", "control"]),
        (json!({"id": ""}), vec!["id", "empty"]),
        (json!({"id": "i".repeat(257)}), vec!["id", "257 bytes"]),
        (json!({"id": "a\u{0}"}), vec!["id", "control"]),
    ] {
        assert_bad_event(&app, seed_event(extra), &mentions).await;
    }
    // A missing part is named too.
    assert_bad_event(
        &app,
        json!({"entity": "VIDEO", "action": "VIEW"}),
        &["uuid"],
    )
    .await;
    assert_unchanged(&app).await;
}

#[tokio::test]
async fn bad_fields_of_a_single_increment_are_refused() {
    let app = seeded().await;
    for (body, mentions) in [
        (json!({"category": ""}), vec!["category"]),
        (json!({"category": "x\u{7}"}), vec!["category", "control"]),
        (json!({"id": ""}), vec!["id"]),
    ] {
        let r = app.post(SEED_INC, body).await;
        assert_error(&r, 400, "invalid_request", &mentions);
    }
    // -i64::MIN does not exist.
    let r = app
        .post(
            "/v1/counters/VIDEO/VIEW/seed/decrement",
            json!({"count": i64::MIN}),
        )
        .await;
    assert_error(&r, 400, "invalid_request", &["count", "negated"]);
    assert_unchanged(&app).await;
}

#[tokio::test]
async fn document_ids_over_512_bytes_are_refused_not_cut() {
    let app = seeded().await;
    let (e, a) = ("e".repeat(300), "a".repeat(300));
    let r = app
        .post_empty(&counter_path(&e, &a, "u", "/increment"))
        .await;
    assert_error(&r, 400, "invalid_request", &["document id", "512"]);
    // Escaping counts: 200 underscores become 600 bytes, 604 with the rest.
    let under = "_".repeat(200);
    let r = app
        .post_empty(&counter_path(&under, "a", "u", "/increment"))
        .await;
    assert_error(&r, 400, "invalid_request", &["document id", "604 bytes"]);
    assert_bad_event(
        &app,
        json!({"entity": e, "action": a, "uuid": "u"}),
        &["document id"],
    )
    .await;
    assert_unchanged(&app).await;
}

#[tokio::test]
async fn bad_timestamps_are_refused() {
    let app = seeded().await;
    let now = now_secs();
    let cases = [
        (rfc3339(now + Duration::hours(1)), "future"),
        (rfc3339(now + Duration::days(365 * 30)), "future"),
        (rfc3339(now - Duration::days(402)), "retention"),
        ("1970-01-01T00:00:00Z".to_owned(), "retention"),
        ("yesterday".to_owned(), "RFC 3339"),
        ("2024-01-01".to_owned(), "RFC 3339"),
        ("2024-01-01T00:00:00".to_owned(), "RFC 3339"),
        (now.timestamp().to_string(), "RFC 3339"),
        (String::new(), "RFC 3339"),
    ];
    for (ts, mention) in &cases {
        let r = app.post(SEED_INC, json!({"timestamp": ts})).await;
        assert_error(&r, 400, "invalid_request", &["timestamp", mention]);
        assert_bad_event(
            &app,
            seed_event(json!({"timestamp": ts})),
            &["timestamp", mention],
        )
        .await;
    }
    assert_unchanged(&app).await;
}

#[tokio::test]
async fn oversized_bodies_are_413() {
    let app = seeded().await;
    let pad = "x".repeat(MAX_BODY_BYTES);
    let body = format!(
        r#"{{"events": [{{"entity": "VIDEO", "action": "VIEW", "uuid": "seed", "category": "{pad}"}}]}}"#
    );
    let r = app
        .post_raw("/v1/events", Some("application/json"), body)
        .await;
    assert_error(&r, 413, "payload_too_large", &["limit"]);
    let body = format!(r#"{{"count": 1, "category": "{pad}"}}"#);
    let r = app.post_raw(SEED_INC, Some("text/plain"), body).await;
    assert_error(&r, 413, "payload_too_large", &["limit"]);
    assert_unchanged(&app).await;
}

#[tokio::test]
async fn wrong_content_types_are_415() {
    let app = seeded().await;
    for ct in [
        "application/x-www-form-urlencoded",
        "application/xml",
        "multipart/form-data; boundary=x",
        "text/html",
    ] {
        let r = app.post_raw(SEED_INC, Some(ct), "{\"count\": 1}").await;
        assert_error(&r, 415, "unsupported_media_type", &["application/json"]);
        let r = app
            .post_raw(
                "/v1/events",
                Some(ct),
                json!({"events": [seed_event(json!({}))]}).to_string(),
            )
            .await;
        assert_error(&r, 415, "unsupported_media_type", &[]);
    }
    // Parameters and case do not matter for accepted types.
    let r = app
        .post_raw(
            SEED_INC,
            Some("Application/JSON; charset=utf-8"),
            "{\"count\": 0}",
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["value"], SEED);
    assert_eq!(app.value("VIDEO", "VIEW", "seed").await, Some(SEED));
}

#[tokio::test]
async fn a_batch_with_bad_events_applies_none_and_lists_each() {
    let app = seeded().await;
    let events = json!([
        seed_event(json!({"count": 1})),
        {"entity": "VIDEO", "action": "VIEW", "uuid": "good-1", "count": 1},
        {"entity": "VIDEO", "action": "VIEW", "uuid": ""},
        {"entity": "VIDEO", "action": "VIEW", "uuid": "good-2"},
        seed_event(json!({"timestamp": rfc3339(now_secs() + Duration::days(1))})),
        seed_event(json!({"count": 2})),
    ]);
    let r = app.post("/v1/events", json!({ "events": events })).await;
    assert_error(&r, 400, "invalid_events", &["2 invalid event(s)"]);
    let d = details(&r);
    assert_eq!(
        d.iter().map(|x| x.0).collect::<Vec<_>>(),
        [2, 4],
        "{}",
        r.text
    );
    assert!(d[0].1.contains("uuid must not be empty"), "{}", r.text);
    assert!(
        d[1].1.contains("timestamp") && d[1].1.contains("future"),
        "{}",
        r.text
    );

    // Events that do not even parse are listed with those that are invalid.
    let r = post_text(
        &app,
        "/v1/events",
        r#"{"events": [
            {"entity": "VIDEO", "action": "VIEW", "uuid": "good-1"},
            {"entity": "VIDEO", "action": "VIEW", "uuid": "seed", "count": 1.5},
            {"entity": "VIDEO", "action": "VIEW", "uuid": "good-2", "colour": "red"},
            {"entity": "VIDEO", "action": "", "uuid": "good-3"},
            {"entity": "VIDEO", "action": "VIEW", "uuid": "seed"}
        ]}"#,
    )
    .await;
    assert_error(&r, 400, "invalid_events", &["3 invalid event(s)"]);
    let d = details(&r);
    assert_eq!(
        d.iter().map(|x| x.0).collect::<Vec<_>>(),
        [1, 2, 3],
        "{}",
        r.text
    );
    assert!(d[0].1.contains("count"), "{}", r.text);
    assert!(d[1].1.contains("colour"), "{}", r.text);
    assert!(d[2].1.contains("action must not be empty"), "{}", r.text);

    for u in ["good-1", "good-2", "good-3"] {
        assert_eq!(app.value("VIDEO", "VIEW", u).await, None);
    }
    assert_unchanged(&app).await;
}

#[tokio::test]
async fn empty_missing_and_too_many_events_are_refused() {
    let app = seeded().await;
    let r = app.post("/v1/events", json!({"events": []})).await;
    assert_error(&r, 400, "invalid_request", &["events", "at least one"]);
    let r = app.post_empty("/v1/events").await;
    assert_error(&r, 400, "invalid_request", &["empty"]);
    let r = app.post("/v1/events", json!({})).await;
    assert_error(&r, 400, "invalid_request", &["events"]);
    let r = app.post("/v1/events", json!(null)).await;
    assert_error(&r, 400, "invalid_request", &[]);
    let events: Vec<Value> = (0..=MAX_EVENTS).map(|_| seed_event(json!({}))).collect();
    let r = app.post("/v1/events", json!({ "events": events })).await;
    assert_error(
        &r,
        400,
        "invalid_request",
        &[&(MAX_EVENTS + 1).to_string(), &MAX_EVENTS.to_string()],
    );
    assert_unchanged(&app).await;
    // Exactly at the limit is fine.
    let events: Vec<Value> = (0..MAX_EVENTS).map(|_| seed_event(json!({}))).collect();
    let r = app.post("/v1/events", json!({ "events": events })).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        app.value("VIDEO", "VIEW", "seed").await,
        Some(SEED + MAX_EVENTS as i64)
    );
}

#[tokio::test]
async fn unknown_routes_and_wrong_methods_answer_in_the_error_shape() {
    let app = seeded().await;
    for path in [
        "/",
        "/v1/nope",
        "/v1/counters/VIDEO/VIEW",
        "/v1/counters/VIDEO/VIEW/seed/histogramm",
    ] {
        let r = app.get(path).await;
        assert_error(&r, 404, "not_found", &[]);
    }
    for (method, path) in [
        (reqwest::Method::PATCH, "/v1/counters/VIDEO/VIEW/seed"),
        (reqwest::Method::POST, "/v1/counters/VIDEO/VIEW/seed"),
        (reqwest::Method::GET, SEED_INC),
        (reqwest::Method::DELETE, SEED_INC),
        (reqwest::Method::GET, "/v1/events"),
        (reqwest::Method::POST, "/healthz"),
        (reqwest::Method::PATCH, "/v1/targets/VIDEO/seed/counters"),
    ] {
        let r = app.request(method.clone(), path).await;
        assert_error(&r, 405, "method_not_allowed", &[]);
    }
    assert_unchanged(&app).await;
}

/// An app whose flusher lingers, so concurrent requests share one flush.
async fn lingering() -> TestApp {
    TestApp::start_with(Options {
        pipeline: PipelineConfig {
            flush_interval: StdDuration::from_millis(50),
            ..PipelineConfig::default()
        },
        ..Options::default()
    })
    .await
}

#[tokio::test]
async fn overflow_is_409_and_changes_nothing() {
    let app = TestApp::start().await;
    let r = app
        .increment("R", "max", "u", json!({"count": i64::MAX}))
        .await;
    assert_eq!(r.json["value"], i64::MAX, "{}", r.text);
    let r = app
        .increment("R", "min", "u", json!({"count": i64::MIN}))
        .await;
    assert_eq!(r.json["value"], i64::MIN, "{}", r.text);

    let r = app.increment("R", "max", "u", json!({})).await;
    assert_error(
        &r,
        409,
        "counter_overflow",
        &["R/max/u", "64-bit", "nothing"],
    );
    let r = app
        .post("/v1/counters/R/min/u/decrement", json!({"count": 1}))
        .await;
    assert_error(&r, 409, "counter_overflow", &["R/min/u", "64-bit"]);
    let r = app.increment("R", "min", "u", json!({"count": -1})).await;
    assert_error(&r, 409, "counter_overflow", &["R/min/u"]);
    // A fresh counter overflows within one batch.
    let r = app
        .post(
            "/v1/events",
            json!({"events": [
                {"entity": "R", "action": "fresh", "uuid": "u", "count": i64::MAX},
                {"entity": "R", "action": "fresh", "uuid": "u", "count": 1},
            ]}),
        )
        .await;
    assert_error(&r, 409, "counter_overflow", &["R/fresh/u"]);

    assert_eq!(app.value("R", "max", "u").await, Some(i64::MAX));
    assert_eq!(app.value("R", "min", "u").await, Some(i64::MIN));
    assert_eq!(app.value("R", "fresh", "u").await, None);
    // Going back towards zero still works.
    let r = app.increment("R", "max", "u", json!({"count": -1})).await;
    assert_eq!(r.json["value"], i64::MAX - 1, "{}", r.text);
}

#[tokio::test]
async fn a_batch_with_one_overflowing_event_applies_none() {
    let app = TestApp::start().await;
    app.increment("R", "max", "u", json!({"count": i64::MAX}))
        .await;
    let r = app
        .post(
            "/v1/events",
            json!({"events": [
                {"entity": "R", "action": "other", "uuid": "u", "count": 3},
                {"entity": "R", "action": "max", "uuid": "u", "count": -10},
                {"entity": "R", "action": "max", "uuid": "u", "count": 11, "id": "ov-1"},
                {"entity": "R", "action": "another", "uuid": "u", "id": "ov-2"},
            ]}),
        )
        .await;
    assert_error(&r, 409, "counter_overflow", &["R/max/u"]);
    assert_eq!(app.value("R", "other", "u").await, None);
    assert_eq!(app.value("R", "another", "u").await, None);
    assert_eq!(app.value("R", "max", "u").await, Some(i64::MAX));
    // The ids of a refused batch were not spent: a retry without the
    // overflowing part counts them.
    let r = app
        .post(
            "/v1/events",
            json!({"events": [
                {"entity": "R", "action": "max", "uuid": "u", "count": -11, "id": "ov-1"},
                {"entity": "R", "action": "another", "uuid": "u", "id": "ov-2"},
            ]}),
        )
        .await;
    assert_eq!(
        r.json,
        json!({"accepted": 2, "duplicates": 0}),
        "{}",
        r.text
    );
    assert_eq!(app.value("R", "max", "u").await, Some(i64::MAX - 11));
    assert_eq!(app.value("R", "another", "u").await, Some(1));
}

#[tokio::test]
async fn an_overflow_does_not_sink_its_neighbours_in_the_flush() {
    let app = lingering().await;
    app.increment("R", "max", "u", json!({"count": i64::MAX - 1}))
        .await;
    let send = |action: &'static str, count: i64| {
        let (http, url) = (
            app.http.clone(),
            app.url(&counter_path("R", action, "u", "/increment")),
        );
        tokio::spawn(async move {
            common::read(
                http.post(url)
                    .json(&json!({ "count": count }))
                    .send()
                    .await
                    .unwrap(),
            )
            .await
        })
    };
    // Sent together: one overflows, the others land.
    let over = send("max", 2);
    let fine = send("other", 7);
    let fine_too = send("max", -5);
    let (over, fine, fine_too) = (
        over.await.unwrap(),
        fine.await.unwrap(),
        fine_too.await.unwrap(),
    );
    assert_eq!(fine.status, 200, "{}", fine.text);
    assert_eq!(fine.json["value"], 7);
    assert_eq!(fine_too.status, 200, "{}", fine_too.text);
    assert_eq!(app.value("R", "other", "u").await, Some(7));
    // Whether +2 overflows depends on whether -5 came first: additions that
    // stay in range commute, and the one refused changes nothing.
    match over.status {
        409 => {
            assert_error(&over, 409, "counter_overflow", &["R/max/u"]);
            assert_eq!(app.value("R", "max", "u").await, Some(i64::MAX - 6));
        }
        200 => assert_eq!(app.value("R", "max", "u").await, Some(i64::MAX - 4)),
        s => panic!("unexpected {s}: {}", over.text),
    }

    // Two +1 on MAX - 1, together: exactly one lands.
    app.increment("R", "edge", "u", json!({"count": i64::MAX - 1}))
        .await;
    let a = send("edge", 1);
    let b = send("edge", 1);
    let mut statuses = [a.await.unwrap().status, b.await.unwrap().status];
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 409]);
    assert_eq!(app.value("R", "edge", "u").await, Some(i64::MAX));
}
