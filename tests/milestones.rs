//! Milestones over HTTP on the embedded store: who may set a target's
//! publication time and in which tenant, that it is durable, that an
//! event's `published` is kept only once its whole batch is valid and
//! counted (not for crawlers), and sums that leave i64. What the totals,
//! lists, fallbacks and refusals are is in the conformance scenario
//! `tests/conformance/scenarios/milestones.json`, which every store plays.

mod common;

use chrono::Duration;
use common::{assert_error, counter_path, key_line, test_now, Options, TestApp};
use serde_json::{json, Value};

fn ts(days_ago: i64) -> String {
    common::rfc3339(test_now() - Duration::days(days_ago))
}

/// [`ts`] as answers write it.
fn shown(days_ago: i64) -> Value {
    json!(common::rendered(test_now() - Duration::days(days_ago)))
}

async fn put_target(
    app: &TestApp,
    key: Option<&str>,
    tenant: Option<&str>,
    body: Value,
) -> common::Resp {
    let mut req = app.http.put(app.url("/v1/targets/ARTICLE/a")).json(&body);
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    if let Some(t) = tenant {
        req = req.header("x-tenant", t);
    }
    app.send(req).await
}

async fn published(app: &TestApp, key: Option<&str>, tenant: Option<&str>) -> Value {
    let mut req = app.http.get(app.url("/v1/targets/ARTICLE/a"));
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    if let Some(t) = tenant {
        req = req.header("x-tenant", t);
    }
    let r = app.send(req).await;
    assert_eq!(r.status, 200, "{}", r.text);
    r.json["published"].clone()
}

#[tokio::test]
async fn only_admin_keys_set_a_publication_and_it_lands_in_their_tenant() {
    let keys =
        key_line("write", "*", "w") + &key_line("read", "*", "r") + &key_line("admin", "acme", "a");
    let app = TestApp::start_with(Options {
        keys,
        ..Options::default()
    })
    .await;
    let body = json!({"published": ts(3)});
    for key in ["w", "r"] {
        let r = put_target(&app, Some(key), None, body.clone()).await;
        assert_error(&r, 403, "forbidden", &["admin"]);
    }
    let r = put_target(&app, None, None, body.clone()).await;
    assert_eq!(r.status, 401, "{}", r.text);
    let r = put_target(&app, Some("a"), Some("other"), body.clone()).await;
    assert_eq!(r.status, 403, "{}", r.text);
    let r = put_target(&app, Some("a"), Some("acme"), body.clone()).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["published"], shown(3));
    // Read keys read it, in acme only.
    assert_eq!(published(&app, Some("r"), Some("acme")).await, shown(3));
    assert_eq!(published(&app, Some("r"), None).await, Value::Null);
    // A write key's event cannot move it (only a target without one is set).
    let r = app
        .send(
            app.http
                .post(app.url("/v1/events"))
                .bearer_auth("w")
                .header("x-tenant", "acme")
                .json(
                    &json!({"events": [{"entity": "ARTICLE", "action": "VIEW", "uuid": "a",
                    "published": ts(1)}]}),
                ),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(published(&app, Some("r"), Some("acme")).await, shown(3));
}

#[tokio::test]
async fn publications_are_durable_across_a_restart() {
    let app = TestApp::start().await;
    let r = put_target(&app, None, None, json!({"published": ts(5)})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = app
        .post(
            "/v1/events",
            json!({"events": [{"entity": "ARTICLE", "action": "VIEW", "uuid": "b",
                "count": 2, "timestamp": ts(2), "published": ts(2)}]}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let app = app.restart().await;
    assert_eq!(published(&app, None, None).await, shown(5));
    let r = app.get("/v1/targets/ARTICLE/b").await;
    assert_eq!(r.json["published"], shown(2), "{}", r.text);
    // Cleared by null: the first touch stands in again.
    let r = put_target(&app, None, None, json!({"published": null})).await;
    assert_eq!(
        (r.status, &r.json["published"]),
        (200, &Value::Null),
        "{}",
        r.text
    );
    let app = app.restart().await;
    assert_eq!(published(&app, None, None).await, Value::Null);
}

#[tokio::test]
async fn a_batch_refused_for_any_event_keeps_no_publication() {
    let app = TestApp::start().await;
    let r = app
        .post(
            "/v1/events",
            json!({"events": [
                {"entity": "ARTICLE", "action": "VIEW", "uuid": "a", "published": ts(3)},
                {"entity": "ARTICLE", "action": "VIEW", "uuid": "x", "timestamp": "soon"}
            ]}),
        )
        .await;
    assert_eq!(r.status, 400, "{}", r.text);
    assert_eq!(published(&app, None, None).await, Value::Null);
    assert_eq!(app.value("ARTICLE", "VIEW", "a").await, None);
    // An event field `published` of the wrong type is named too.
    let r = app
        .post(
            "/v1/events",
            json!({"events": [{"entity": "ARTICLE", "action": "VIEW", "uuid": "a", "published": 2020}]}),
        )
        .await;
    assert_eq!(r.status, 400, "{}", r.text);
    assert!(r.text.contains("published"), "{}", r.text);
    // A key written with an escape is the same field.
    let r = app
        .post_raw(
            "/v1/events",
            Some("application/json"),
            format!(
                r#"{{"events": [{{"entity": "ARTICLE", "action": "VIEW", "uuid": "a", "\u0070ublished": "{}"}}]}}"#,
                ts(3)
            ),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(published(&app, None, None).await, shown(3));
}

#[tokio::test]
async fn a_crawlers_events_keep_no_publication() {
    let app = TestApp::start().await;
    let r = app
        .send(
            app.http
                .post(app.url("/v1/events"))
                .header("content-type", "text/plain;charset=UTF-8")
                .header(
                    "user-agent",
                    "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)",
                )
                .json(
                    &json!({"events": [{"entity": "ARTICLE", "action": "VIEW", "uuid": "a",
                    "published": ts(3)}]}),
                ),
        )
        .await;
    assert_eq!(
        (r.status, &r.json["ignored"]),
        (202, &json!(1)),
        "{}",
        r.text
    );
    assert_eq!(published(&app, None, None).await, Value::Null);
}

/// Two days of i64::MAX inside the first two days, a large negative day
/// before them: the counter stays in range, its milestone does not, and
/// both the milestone and the list answer it exactly.
#[tokio::test]
async fn milestone_sums_past_i64_are_exact() {
    let app = TestApp::start().await;
    let max = i64::MAX;
    let r = app
        .post(
            "/v1/events",
            json!({"events": [
                {"entity": "ARTICLE", "action": "VIEW", "uuid": "a", "count": -max, "timestamp": ts(3)},
                {"entity": "ARTICLE", "action": "VIEW", "uuid": "a", "count": max, "timestamp": ts(2)},
                {"entity": "ARTICLE", "action": "VIEW", "uuid": "a", "count": max, "timestamp": ts(1)},
                {"entity": "ARTICLE", "action": "VIEW", "uuid": "b", "count": 1, "timestamp": ts(2)}
            ]}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = put_target(&app, None, None, json!({"published": ts(2)})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let want = (i128::from(max) * 2).to_string();
    let r = app
        .get(&counter_path(
            "ARTICLE",
            "VIEW",
            "a",
            "/milestones?days=2,3",
        ))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(
        r.text.contains(r#""days":2,"from""#) && r.text.contains(&format!(r#""total":{want}"#)),
        "{}",
        r.text
    );
    let r = app.get("/v1/top/ARTICLE/VIEW?interval=first_2_days").await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(
        r.text.contains(&format!(r#""uuid":"a","value":{want}"#)),
        "{}",
        r.text
    );
    assert_eq!(r.json["counters"][1]["uuid"], "b", "{}", r.text);
}

#[tokio::test]
async fn the_retention_bounds_n() {
    let app = TestApp::start_with(Options {
        time_policy: counter_gateway::domain::TimePolicy {
            retention_days: 30,
            ..Default::default()
        },
        ..Options::default()
    })
    .await;
    app.increment("ARTICLE", "VIEW", "a", json!({})).await;
    let r = app
        .get(&counter_path("ARTICLE", "VIEW", "a", "/milestones?days=31"))
        .await;
    assert_error(&r, 400, "invalid_request", &["days", "30"]);
    let r = app.get("/v1/top/ARTICLE/VIEW?interval=first_31_days").await;
    assert_error(&r, 400, "invalid_request", &["interval", "30"]);
    // The default list (3 and 30) fits a 30-day retention.
    let r = app
        .get(&counter_path("ARTICLE", "VIEW", "a", "/milestones"))
        .await;
    assert_eq!(
        r.json["milestones"].as_array().map(Vec::len),
        Some(2),
        "{}",
        r.text
    );
}
