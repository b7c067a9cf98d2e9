//! What the answer to a counting write may show, per role: a `write` key
//! (in public pages) learns whether its write was counted, not the counter,
//! unless `--write-keys-read-values`; `admin` keys and a keyless gateway
//! get the counter; `read` and `public` keys may not write at all.

mod common;

use common::{assert_error, counter_path, key_line, Options, Resp, TestApp};
use serde_json::{json, Value};

const WRITE: &str = "w-0123456789abcdef";
const READ: &str = "r-0123456789abcdef";
const PUBLIC: &str = "p-0123456789abcdef";
const ADMIN: &str = "a-0123456789abcdef";

async fn app(write_keys_read_values: bool) -> TestApp {
    let keys = [
        key_line("write", "*", WRITE),
        key_line("read", "*", READ),
        key_line("public", "*", PUBLIC),
        key_line("admin", "*", ADMIN),
    ]
    .concat();
    TestApp::start_with(Options {
        keys,
        write_keys_read_values,
        ..Options::default()
    })
    .await
}

async fn write(app: &TestApp, key: &str, suffix: &str, body: Value) -> Resp {
    let path = counter_path("ARTICLE", "like", "a1", suffix);
    app.send(app.http.post(app.url(&path)).bearer_auth(key).json(&body))
        .await
}

/// The counter's fields an answer may or may not carry.
const COUNTER_FIELDS: [&str; 4] = ["value", "category", "first_timestamp", "recorded_timestamp"];

fn assert_outcome_only(r: &Resp, counted: bool, skipped: Option<&str>) {
    assert_eq!(r.status, 200, "{}", r.text);
    for field in COUNTER_FIELDS {
        assert!(r.json.get(field).is_none(), "{field} in {}", r.text);
    }
    assert_eq!(r.json["counted"], counted, "{}", r.text);
    assert_eq!(
        r.json.get("skipped").and_then(Value::as_str),
        skipped,
        "{}",
        r.text
    );
    assert_eq!(r.json["entity"], "ARTICLE", "{}", r.text);
}

/// Fills the counter (value 10, a category) with the admin key.
async fn seed(app: &TestApp) {
    let r = write(
        app,
        ADMIN,
        "/increment",
        json!({"count": 10, "category": "news"}),
    )
    .await;
    assert_eq!(r.json["value"], 10, "{}", r.text);
}

#[tokio::test]
async fn a_write_key_learns_whether_it_counted_not_the_counter() {
    let app = app(false).await;
    seed(&app).await;
    let r = write(&app, WRITE, "/increment", json!({"id": "e1"})).await;
    assert_outcome_only(&r, true, None);
    // The same id again: the outcome of the id, still no counter.
    let r = write(&app, WRITE, "/increment", json!({"id": "e1"})).await;
    assert_outcome_only(&r, false, Some("duplicate"));
    // A decrement that changes nothing (an unlike never given) was a free
    // read of the counter.
    let r = write(
        &app,
        WRITE,
        "/decrement",
        json!({"actor": "mallory", "unique": "ever"}),
    )
    .await;
    assert_outcome_only(&r, false, Some("repeat"));
    let r = write(&app, WRITE, "/decrement", json!({"count": 2})).await;
    assert_outcome_only(&r, true, None);
    // A counter that does not exist reads as nothing either.
    let path = counter_path("ARTICLE", "like", "never", "/decrement");
    let body = json!({"actor": "mallory", "unique": "ever"});
    let r = app
        .send(app.http.post(app.url(&path)).bearer_auth(WRITE).json(&body))
        .await;
    assert_outcome_only(&r, false, Some("repeat"));
    // Each write was applied as answered.
    let r = app
        .send(
            app.http
                .get(app.url("/v1/counters/ARTICLE/like/a1"))
                .bearer_auth(READ),
        )
        .await;
    assert_eq!(r.json["value"], 9, "{}", r.text);
}

#[tokio::test]
async fn write_keys_read_values_gives_a_write_key_the_counter() {
    let app = app(true).await;
    seed(&app).await;
    let r = write(&app, WRITE, "/increment", json!({"id": "e1"})).await;
    assert_eq!(r.json["value"], 11, "{}", r.text);
    assert_eq!(r.json["category"], "news", "{}", r.text);
    assert!(r.json["first_timestamp"].is_string(), "{}", r.text);
    let r = write(&app, WRITE, "/increment", json!({"id": "e1"})).await;
    assert_eq!(
        (&r.json["value"], &r.json["skipped"]),
        (&json!(11), &json!("duplicate"))
    );
}

#[tokio::test]
async fn admin_keys_and_a_keyless_gateway_get_the_counter_and_read_keys_cannot_write() {
    let app = app(false).await;
    seed(&app).await;
    let r = write(
        &app,
        ADMIN,
        "/decrement",
        json!({"actor": "a", "unique": "ever"}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["value"], 10, "{}", r.text);
    assert_eq!(r.json["category"], "news", "{}", r.text);
    assert!(r.json["recorded_timestamp"].is_string(), "{}", r.text);
    for key in [READ, PUBLIC] {
        let r = write(&app, key, "/increment", json!({})).await;
        assert_error(&r, 403, "forbidden", &["needs a write key"]);
    }

    let keyless = TestApp::start().await;
    let r = keyless
        .increment(
            "ARTICLE",
            "like",
            "a1",
            json!({"count": 3, "category": "news"}),
        )
        .await;
    assert_eq!(r.json["value"], 3, "{}", r.text);
    assert_eq!(r.json["category"], "news", "{}", r.text);
    // A decrement of a counter that does not exist: the key at 0.
    let r = keyless
        .post(
            &counter_path("ARTICLE", "like", "none", "/decrement"),
            json!({"actor": "a", "unique": "ever"}),
        )
        .await;
    assert_eq!(
        (&r.json["value"], &r.json["counted"]),
        (&json!(0), &json!(false))
    );
}

#[tokio::test]
async fn a_write_keys_sample_learns_whether_it_counted_not_the_average() {
    for read_values in [false, true] {
        let app = app(read_values).await;
        let sample = |key: &'static str, body: Value| {
            let req = app
                .http
                .post(app.url("/v1/averages/VIDEO/RATING/r1"))
                .bearer_auth(key)
                .json(&body);
            app.send(req)
        };
        let r = sample(ADMIN, json!({"value": 5})).await;
        assert_eq!(r.json["average"], 5.0, "{}", r.text);
        let r = sample(WRITE, json!({"value": 3, "id": "s1"})).await;
        assert_eq!(r.status, 200, "{}", r.text);
        if read_values {
            assert_eq!(
                (&r.json["average"], &r.json["quantity"]),
                (&json!(4.0), &json!(2))
            );
        } else {
            assert_eq!(
                r.json,
                json!({"id": "VIDEO_RATING_r1", "entity": "VIDEO", "action": "RATING",
                       "uuid": "r1", "counted": true})
            );
        }
        let r = sample(WRITE, json!({"value": 3, "id": "s1"})).await;
        if read_values {
            assert_eq!(r.json["quantity"], 2, "{}", r.text);
        } else {
            assert_eq!(r.json["counted"], false, "{}", r.text);
            assert!(r.json.get("sum").is_none(), "{}", r.text);
        }
        let r = app
            .send(
                app.http
                    .get(app.url("/v1/averages/VIDEO/RATING/r1"))
                    .bearer_auth(READ),
            )
            .await;
        assert_eq!(r.json["quantity"], 2, "{}", r.text);
    }
}
