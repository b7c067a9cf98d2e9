//! The calendar moving under a running gateway, end to end over HTTP: the
//! clock crosses midnight between two requests, steps back over it (an NTP
//! correction), and runs past the idempotency window. The app's clock is a
//! manual one, started a tenth of a second before the midnight that follows
//! `common::test_now()`, so these tests pass on any date they run.

#[path = "common/mod.rs"]
mod common;

use chrono::{DateTime, Duration, Utc};
use common::{rendered, test_now, Options, Resp, TestApp};
use counter_gateway::domain::{day_of, ManualClock};
use serde_json::json;

/// 23:59:59.900 UTC of `test_now()`'s day.
fn before_midnight() -> DateTime<Utc> {
    let day = day_of(test_now());
    DateTime::from_timestamp((day + 1) * 86_400, 0).unwrap() - Duration::milliseconds(100)
}

fn day(ts: DateTime<Utc>) -> String {
    ts.format("%Y-%m-%d").to_string()
}

async fn start_at(at: DateTime<Utc>) -> (TestApp, ManualClock) {
    let clock = ManualClock::new(at);
    let app = TestApp::start_with(Options {
        clock: clock.clone(),
        ..Options::default()
    })
    .await;
    (app, clock)
}

fn top(r: &Resp) -> Vec<(String, i64)> {
    assert_eq!(r.status, 200, "{}", r.text);
    r.json["counters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["uuid"].as_str().unwrap().to_string(),
                c["value"].as_i64().unwrap(),
            )
        })
        .collect()
}

fn list(items: &[(&str, i64)]) -> Vec<(String, i64)> {
    items.iter().map(|(u, v)| (u.to_string(), *v)).collect()
}

#[tokio::test]
async fn midnight_passes_between_two_requests() {
    let d = before_midnight();
    let (app, clock) = start_at(d).await;
    let r = app
        .increment("VIDEO", "VIEW", "a", json!({"count": 2, "id": "e1"}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    app.increment("VIDEO", "VIEW", "b", json!({})).await;
    assert_eq!(
        top(&app.get("/v1/top/VIDEO/VIEW?interval=last_day").await),
        list(&[("a", 2), ("b", 1)])
    );

    clock.advance(Duration::milliseconds(200));
    let next = d + Duration::milliseconds(200);
    assert_eq!(day_of(next), day_of(d) + 1, "the clock crossed midnight");
    let r = app.increment("VIDEO", "VIEW", "a", json!({})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["value"], 3);
    assert_eq!(r.json["recorded_timestamp"], rendered(next));
    assert_eq!(r.json["first_timestamp"], rendered(d));

    let last_day = app.get("/v1/top/VIDEO/VIEW?interval=last_day").await;
    assert_eq!(top(&last_day), list(&[("a", 1)]));
    assert_eq!(last_day.json["from"], day(next));
    let week = app.get("/v1/top/VIDEO/VIEW?interval=last_week").await;
    assert_eq!(top(&week), list(&[("a", 3), ("b", 1)]));
    assert_eq!(week.json["to"], day(next));

    let h = app
        .get(&format!(
            "/v1/counters/VIDEO/VIEW/a/histogram?from={}&to={}",
            day(d),
            day(next)
        ))
        .await;
    assert_eq!(h.status, 200, "{}", h.text);
    assert_eq!(h.json["total"], 3);
    assert_eq!(
        h.json["buckets"],
        json!([{"day": day(d), "value": 2}, {"day": day(next), "value": 1}]),
        "{}",
        h.text
    );

    // The id sent before midnight is still remembered after it.
    let r = app
        .post(
            "/v1/events",
            json!({"events": [{"entity": "VIDEO", "action": "VIEW", "uuid": "a", "count": 2, "id": "e1"}]}),
        )
        .await;
    assert_eq!(
        r.json,
        json!({"accepted": 0, "duplicates": 1}),
        "{}",
        r.text
    );
    assert_eq!(app.value("VIDEO", "VIEW", "a").await, Some(3));
}

/// An NTP correction steps the clock back over midnight: nothing fails,
/// `recorded_timestamp` does not move backwards, increments land on the day
/// the clock shows, windowed lists end on that day and stay exact, and they
/// are exact again once the clock is forward.
#[tokio::test]
async fn a_clock_stepping_back_over_midnight_answers_truthfully() {
    let d = before_midnight();
    let (app, clock) = start_at(d + Duration::milliseconds(200)).await;
    let after = clock.now();
    app.increment("VIDEO", "VIEW", "a", json!({"count": 5}))
        .await;
    assert_eq!(
        top(&app.get("/v1/top/VIDEO/VIEW?interval=last_day").await),
        list(&[("a", 5)])
    );

    clock.set(d + Duration::milliseconds(50));
    let r = app.increment("VIDEO", "VIEW", "a", json!({})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["value"], 6);
    assert_eq!(
        r.json["recorded_timestamp"],
        rendered(after),
        "recorded_timestamp never moves backwards"
    );
    app.increment("VIDEO", "VIEW", "b", json!({"count": 2}))
        .await;
    for interval in ["last_day", "last_week", "last_month", "last_year"] {
        let r = app
            .get(&format!("/v1/top/VIDEO/VIEW?interval={interval}"))
            .await;
        assert_eq!(r.status, 200, "{interval}: {}", r.text);
        assert_eq!(r.json["to"], day(d), "{interval}");
    }
    assert_eq!(
        top(&app.get("/v1/top/VIDEO/VIEW?interval=last_day").await),
        list(&[("b", 2), ("a", 1)]),
        "the day before the step back holds only what was counted on it"
    );
    assert_eq!(
        top(&app.get("/v1/top/VIDEO/VIEW?interval=all").await),
        list(&[("a", 6), ("b", 2)])
    );

    clock.set(after + Duration::seconds(1));
    assert_eq!(
        top(&app.get("/v1/top/VIDEO/VIEW?interval=last_day").await),
        list(&[("a", 5)])
    );
    assert_eq!(
        top(&app.get("/v1/top/VIDEO/VIEW?interval=last_week").await),
        list(&[("a", 6), ("b", 2)])
    );
}

/// An event id is remembered for the idempotency window (7 days in the test
/// apps) and no longer: a week and a second later the same id counts again,
/// whether or not the store has cleaned its old ids up yet.
#[tokio::test]
async fn event_ids_are_remembered_for_their_window_and_no_longer() {
    let (app, clock) = start_at(test_now()).await;
    let send = || {
        app.post(
            "/v1/events",
            json!({"events": [{"entity": "V", "action": "VIEW", "uuid": "u", "id": "once"}]}),
        )
    };
    assert_eq!(send().await.json, json!({"accepted": 1, "duplicates": 0}));
    clock.advance(Duration::days(7) - Duration::seconds(1));
    assert_eq!(send().await.json, json!({"accepted": 0, "duplicates": 1}));
    clock.advance(Duration::seconds(2));
    assert_eq!(send().await.json, json!({"accepted": 1, "duplicates": 0}));
    assert_eq!(send().await.json, json!({"accepted": 0, "duplicates": 1}));
    assert_eq!(app.value("V", "VIEW", "u").await, Some(2));
}

/// The stale report's cut-off and the accepted range of event timestamps
/// follow the clock the gateway is given, not the wall clock.
#[tokio::test]
async fn cut_offs_and_retention_follow_the_clock() {
    let (app, clock) = start_at(test_now()).await;
    app.increment("V", "VIEW", "old", json!({})).await;
    clock.advance(Duration::days(31));
    app.increment("V", "VIEW", "new", json!({})).await;
    let stale = app.get("/v1/reports/stale?days=30").await;
    assert_eq!(stale.status, 200, "{}", stale.text);
    let uuids: Vec<&str> = stale.json["counters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["uuid"].as_str().unwrap())
        .collect();
    assert_eq!(uuids, ["old"]);
    // 400 days back from the moved clock is accepted, a day more is not.
    let now = clock.now();
    let at = |days| json!({"timestamp": common::rfc3339(now - Duration::days(days))});
    assert_eq!(app.increment("V", "VIEW", "h", at(399)).await.status, 200);
    let r = app.increment("V", "VIEW", "h", at(402)).await;
    assert_eq!(r.status, 400, "{}", r.text);
    let r = app
        .increment(
            "V",
            "VIEW",
            "h",
            json!({"timestamp": common::rfc3339(now + Duration::minutes(10))}),
        )
        .await;
    assert_eq!(r.status, 400, "{}", r.text);
}
