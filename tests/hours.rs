//! Hour buckets over HTTP on the embedded store: `bucket=hour` histograms,
//! `last_hour` and `last_24_hours` top lists, their retention and bounds,
//! and the rule that the hours of a day sum to its day bucket after every
//! kind of write (increments with their own timestamps, batches, retried
//! ids, decrements, set values, backfills). The clock is the app's manual
//! one, set to chosen instants of the test's day: midnight and hour
//! boundaries are crossed on purpose, on whatever date the suite runs.

mod common;

use chrono::{DateTime, Duration, Utc};
use common::{assert_error, counter_path, rfc3339, test_now, Options, TestApp};
use serde_json::{json, Value};

/// 23:30 UTC of the test's day: the first writes land half an hour before
/// midnight.
fn evening() -> DateTime<Utc> {
    let day = test_now().date_naive();
    day.and_hms_opt(23, 30, 0).unwrap().and_utc()
}

fn hour(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:00:00Z").to_string()
}

fn day(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d").to_string()
}

async fn inc(app: &TestApp, uuid: &str, body: Value) {
    let r = app.increment("VIDEO", "VIEW", uuid, body).await;
    assert_eq!(r.status, 200, "{}", r.text);
}

async fn get_ok(app: &TestApp, path: &str) -> Value {
    let r = app.get(path).await;
    assert_eq!(r.status, 200, "{path}: {}", r.text);
    r.json
}

/// `(hour, value)` of a counter's hour buckets in `query`.
async fn hours(app: &TestApp, uuid: &str, query: &str) -> (Vec<(String, i64)>, bool) {
    let j = get_ok(
        app,
        &counter_path(
            "VIDEO",
            "VIEW",
            uuid,
            &format!("/histogram?bucket=hour&{query}"),
        ),
    )
    .await;
    assert_eq!(j["bucket"], "hour");
    let buckets: Vec<(String, i64)> = j["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                b["hour"].as_str().unwrap().into(),
                b["value"].as_i64().unwrap(),
            )
        })
        .collect();
    let total: i64 = buckets.iter().map(|(_, v)| v).sum();
    assert_eq!(j["total"], total);
    (buckets, j["exact"].as_bool().unwrap())
}

/// `(uuid, value)` of a top list.
async fn top(app: &TestApp, query: &str) -> (Vec<(String, i64)>, Value) {
    let j = get_ok(app, &format!("/v1/top/VIDEO/VIEW?{query}")).await;
    let list = j["counters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["uuid"].as_str().unwrap().into(),
                c["value"].as_i64().unwrap(),
            )
        })
        .collect();
    (list, j)
}

/// Checks, for every day the hourly retention keeps, that the counter's
/// hours of the day sum to its day bucket, and that the answer says exact.
async fn assert_days_are_their_hours(app: &TestApp, uuid: &str) {
    let days = get_ok(
        app,
        &counter_path("VIDEO", "VIEW", uuid, "/histogram?interval=last_week"),
    )
    .await;
    let now = app.options.clock.now();
    for offset in 0..7 {
        let d = day(now - Duration::days(offset));
        let want = days["buckets"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["day"] == d.as_str())
            .map_or(0, |b| b["value"].as_i64().unwrap());
        let (hs, exact) = hours(app, uuid, &format!("from={d}&to={d}")).await;
        let sum: i64 = hs.iter().map(|(_, v)| v).sum();
        assert_eq!(sum, want, "{uuid} on {d}: hours {hs:?}");
        assert!(exact, "{uuid} on {d}");
    }
}

#[tokio::test]
async fn increments_land_in_their_hour_across_midnight() {
    let app = TestApp::start().await;
    let clock = app.options.clock.clone();
    let t0 = evening();
    clock.set(t0);
    inc(&app, "a", json!({"count": 2, "category": "news"})).await;
    clock.set(t0 + Duration::minutes(40)); // 00:10 the next day
    inc(&app, "a", json!({"count": 3})).await;
    inc(&app, "b", json!({"count": 1, "category": "sports"})).await;
    clock.set(t0 + Duration::minutes(95)); // 01:05
    inc(&app, "a", json!({"count": 4})).await;

    let (hs, exact) = hours(&app, "a", "interval=last_24_hours").await;
    assert!(exact);
    assert_eq!(
        hs,
        vec![
            (hour(t0), 2),
            (hour(t0 + Duration::minutes(40)), 3),
            (hour(t0 + Duration::minutes(95)), 4)
        ]
    );
    // The default range is the last 24 hours; an hour is the clock's hour.
    assert_eq!(hours(&app, "a", "").await.0.len(), 3);
    assert_eq!(
        hours(&app, "a", "interval=last_hour").await.0,
        vec![(hour(clock.now()), 4)]
    );
    // A range of instants takes the hours they fall in.
    let from = rfc3339(t0 + Duration::minutes(31));
    let to = rfc3339(t0 + Duration::minutes(89));
    let q = format!("from={}&to={}", common::encode(&from), common::encode(&to));
    assert_eq!(
        hours(&app, "a", &q).await.0,
        vec![(hour(t0 + Duration::minutes(40)), 3)]
    );

    let (list, j) = top(&app, "interval=last_hour").await;
    assert_eq!(list, vec![("a".to_string(), 4)]);
    assert_eq!(j["interval"], "last_hour");
    assert_eq!(j["from"], hour(clock.now()));
    assert_eq!(j["exact"], true);
    let (list, j) = top(&app, "interval=last_24_hours").await;
    assert_eq!(list, vec![("a".to_string(), 9), ("b".to_string(), 1)]);
    assert_eq!(j["from"], hour(clock.now() - Duration::hours(23)));
    assert_eq!(j["to"], hour(clock.now()));
    let (list, _) = top(&app, "interval=last_24_hours&category=sports").await;
    assert_eq!(list, vec![("b".to_string(), 1)]);
    // The last day (today only) and the hours agree.
    let (list, _) = top(&app, "interval=last_day").await;
    assert_eq!(list, vec![("a".to_string(), 7), ("b".to_string(), 1)]);

    // An hour later the last hour is empty; 24 hours later, the 23:00
    // bucket has left the last 24 hours.
    clock.set(t0 + Duration::minutes(150));
    assert_eq!(top(&app, "interval=last_hour").await.0, vec![]);
    clock.set(t0 + Duration::minutes(40) + Duration::hours(23));
    let (list, _) = top(&app, "interval=last_24_hours").await;
    assert_eq!(list, vec![("a".to_string(), 7), ("b".to_string(), 1)]);
    assert_days_are_their_hours(&app, "a").await;
}

#[tokio::test]
async fn the_hours_of_a_day_sum_to_it_after_mixed_traffic() {
    let app = TestApp::start().await;
    let clock = app.options.clock.clone();
    let t0 = evening() - Duration::hours(2); // 21:30
    clock.set(t0);
    // Own timestamps: now, earlier this hour, an hour and a day back, a
    // minute ahead (within the skew).
    for (uuid, back_minutes, count) in [
        ("m", 0, 1),
        ("m", 25, 2),
        ("m", 70, 3),
        ("m", 24 * 60 + 5, 5),
        ("m", -1, 7),
        ("n", 130, 11),
    ] {
        let ts = rfc3339(t0 - Duration::minutes(back_minutes));
        inc(&app, uuid, json!({"count": count, "timestamp": ts})).await;
    }
    // A retried id counts once; a decrement takes back.
    for _ in 0..3 {
        inc(&app, "m", json!({"count": 100, "id": "retry-1"})).await;
    }
    let r = app
        .post(
            &counter_path("VIDEO", "VIEW", "m", "/decrement"),
            json!({"count": 4}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    // A batch over two days and three hours, with a repeated id inside.
    let events: Vec<Value> = (0..30)
        .map(|i| {
            json!({"entity": "VIDEO", "action": "VIEW", "uuid": if i % 3 == 0 { "n" } else { "m" },
                   "count": i, "id": format!("batch-{}", i % 25),
                   "timestamp": rfc3339(t0 - Duration::minutes(i * 53))})
        })
        .collect();
    let r = app.post("/v1/events", json!({"events": events})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    // Past midnight, then the same traffic again into the new day.
    clock.set(t0 + Duration::hours(3));
    inc(&app, "m", json!({"count": 13, "timestamp": rfc3339(t0)})).await;
    inc(&app, "m", json!({"count": 17})).await;
    // A set value moves the all-time value, no bucket: hours stay true.
    let r = app
        .send(
            app.http
                .put(app.url(&counter_path("VIDEO", "VIEW", "m", "")))
                .json(&json!({"value": 1000})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_days_are_their_hours(&app, "m").await;
    assert_days_are_their_hours(&app, "n").await;
    // After a restart (the change log folded at close), the same.
    let app = app.restart().await;
    assert_days_are_their_hours(&app, "m").await;
    assert_days_are_their_hours(&app, "n").await;
    inc(&app, "m", json!({"count": 19})).await;
    assert_days_are_their_hours(&app, "m").await;
    let (list, _) = top(&app, "interval=last_24_hours").await;
    let (hs, _) = hours(&app, "m", "interval=last_24_hours").await;
    assert_eq!(list[0], ("m".to_string(), hs.iter().map(|(_, v)| v).sum()));
}

#[tokio::test]
async fn a_backfilled_day_has_no_exact_hours_and_says_so() {
    let app = TestApp::start().await;
    let clock = app.options.clock.clone();
    // 00:30: the last 24 hours reach into yesterday.
    let t0 = evening() - Duration::hours(23);
    clock.set(t0);
    inc(&app, "a", json!({"count": 2})).await;
    let yesterday = day(t0 - Duration::days(1));
    let (_, exact) = hours(&app, "a", &format!("from={yesterday}")).await;
    assert!(exact);
    let r = app
        .send(
            app.http
                .put(app.url(&counter_path(
                    "VIDEO",
                    "VIEW",
                    "a",
                    &format!("/days/{yesterday}"),
                )))
                .json(&json!({"value": 10})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    // Yesterday's 10 has no hour: its hours are not exact, today's are.
    let (hs, exact) = hours(&app, "a", &format!("from={yesterday}&to={yesterday}")).await;
    assert_eq!((hs, exact), (vec![], false));
    let (hs, exact) = hours(&app, "a", &format!("from={}", day(t0))).await;
    assert_eq!((hs, exact), (vec![(hour(t0), 2)], true));
    // Lists over that day say so too; the last hour is today's alone.
    let (_, j) = top(&app, "interval=last_24_hours").await;
    assert_eq!(j["exact"], false);
    let (list, j) = top(&app, "interval=last_hour").await;
    assert_eq!(
        (list, j["exact"].clone()),
        (vec![("a".to_string(), 2)], json!(true))
    );
    // Set back to what its hours hold (none): exact again.
    let r = app
        .send(
            app.http
                .put(app.url(&counter_path(
                    "VIDEO",
                    "VIEW",
                    "a",
                    &format!("/days/{yesterday}"),
                )))
                .json(&json!({"value": 0})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(hours(&app, "a", &format!("from={yesterday}")).await.1);
    // A backfill of another pair leaves this pair's lists exact.
    let r = app
        .send(
            app.http
                .put(app.url(&counter_path(
                    "VIDEO",
                    "like",
                    "a",
                    &format!("/days/{yesterday}"),
                )))
                .json(&json!({"value": 4})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(top(&app, "interval=last_24_hours").await.1["exact"], true);
    let j = get_ok(&app, "/v1/top/VIDEO/like?interval=last_24_hours").await;
    assert_eq!(j["exact"], false);
}

#[tokio::test]
async fn hour_ranges_are_bounded_by_the_retention_and_refused_clearly() {
    let app = TestApp::start().await;
    let clock = app.options.clock.clone();
    let t0 = evening();
    clock.set(t0);
    // Twenty days back: a day bucket, no hour (older than 14 days).
    let old = t0 - Duration::days(20);
    inc(&app, "a", json!({"count": 5, "timestamp": rfc3339(old)})).await;
    inc(&app, "a", json!({"count": 1})).await;
    let path = |q: &str| counter_path("VIDEO", "VIEW", "a", &format!("/histogram?{q}"));
    let r = app
        .get(&path(&format!("bucket=hour&from={}", day(old))))
        .await;
    assert_error(
        &r,
        400,
        "invalid_request",
        &["--hourly-retention-days", "14 days"],
    );
    // Fourteen days back is the oldest day kept.
    let oldest = day(t0 - Duration::days(14));
    let (hs, exact) = hours(&app, "a", &format!("from={oldest}")).await;
    assert_eq!((hs, exact), (vec![(hour(t0), 1)], true));
    assert_eq!(hours(&app, "a", "interval=all").await.0.len(), 1);
    // The day buckets still have both.
    let j = get_ok(&app, &path("interval=last_month")).await;
    assert_eq!(j["total"], 6);
    for (q, mentions) in [
        ("bucket=week", vec!["bucket", "week"]),
        ("interval=last_hour", vec!["bucket=hour"]),
        ("bucket=hour&interval=last_fortnight", vec!["interval"]),
        (
            "bucket=hour&interval=last_hour&from=2026-01-01",
            vec!["interval"],
        ),
    ] {
        let r = app.get(&path(q)).await;
        assert_error(&r, 400, "invalid_request", &mentions);
    }
    let r = app
        .get(&format!(
            "/v1/top/VIDEO/VIEW?interval=last_hour&from={}",
            day(t0)
        ))
        .await;
    assert_error(&r, 400, "invalid_request", &["interval"]);
    let r = app
        .get(&counter_path(
            "VIDEO",
            "VIEW",
            "nobody",
            "/histogram?bucket=hour",
        ))
        .await;
    assert_eq!(r.status, 404);

    // With hours kept 400 days, an answer still holds at most 744.
    let app = TestApp::start_with(Options {
        time_policy: counter_gateway::domain::TimePolicy {
            hourly_retention_days: 400,
            ..Default::default()
        },
        ..Options::default()
    })
    .await;
    app.options.clock.set(t0);
    inc(&app, "a", json!({"count": 1})).await;
    let r = app
        .get(&counter_path(
            "VIDEO",
            "VIEW",
            "a",
            "/histogram?bucket=hour&interval=last_year",
        ))
        .await;
    assert_error(&r, 400, "invalid_request", &["744"]);
    assert_eq!(
        hours(&app, "a", "interval=last_week").await.0,
        vec![(hour(t0), 1)]
    );
}

#[tokio::test]
async fn a_deleted_counter_takes_its_hours_with_it() {
    let app = TestApp::start().await;
    app.options.clock.set(evening());
    inc(&app, "a", json!({"count": 3})).await;
    let r = app.delete(&counter_path("VIDEO", "VIEW", "a", "")).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(top(&app, "interval=last_hour").await.0, vec![]);
    inc(&app, "a", json!({"count": 1})).await;
    assert_eq!(hours(&app, "a", "").await.0, vec![(hour(evening()), 1)]);
}
