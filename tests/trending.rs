//! `GET /v1/trending/{entity}/{action}` on the embedded store: scores
//! against numbers computed by hand, the order a half-life gives, a
//! category, a target busy long ago against one busy now, hour buckets
//! inside the hourly retention and day buckets before it (never both for
//! one day), a backfilled day, and refusals. The clock is the app's manual
//! one, set to noon of the test's day, so every age is whole hours.

mod common;

use chrono::{DateTime, Duration, Utc};
use common::{assert_error, counter_path, rfc3339, test_now, Options, TestApp};
use serde_json::{json, Value};

/// 12:00 UTC of the test's day.
fn noon() -> DateTime<Utc> {
    test_now()
        .date_naive()
        .and_hms_opt(12, 0, 0)
        .unwrap()
        .and_utc()
}

async fn app_at_noon(options: Options) -> TestApp {
    let app = TestApp::start_with(options).await;
    app.options.clock.set(noon());
    app
}

/// Counts `count` on `uuid` at `at`.
async fn count_at(
    app: &TestApp,
    uuid: &str,
    count: i64,
    at: DateTime<Utc>,
    category: Option<&str>,
) {
    let mut body = json!({"count": count, "timestamp": rfc3339(at)});
    if let Some(c) = category {
        body["category"] = json!(c);
    }
    let r = app.increment("VIDEO", "VIEW", uuid, body).await;
    assert_eq!(r.status, 200, "{}", r.text);
}

async fn trending(app: &TestApp, query: &str) -> Value {
    let r = app.get(&format!("/v1/trending/VIDEO/VIEW?{query}")).await;
    assert_eq!(r.status, 200, "{query}: {}", r.text);
    assert_eq!(r.header("cache-control"), None, "as the other top lists");
    r.json
}

/// `(uuid, score)` of a list.
fn scores(list: &Value) -> Vec<(String, f64)> {
    list["counters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["uuid"].as_str().unwrap().to_string(),
                c["score"].as_f64().unwrap(),
            )
        })
        .collect()
}

/// `x` to 9 significant digits, as the API writes scores.
fn nine(x: f64) -> f64 {
    format!("{x:.8e}").parse().unwrap()
}

fn assert_scores(list: &Value, want: &[(&str, f64)]) {
    let got = scores(list);
    let want: Vec<(String, f64)> = want
        .iter()
        .map(|(u, s)| (u.to_string(), nine(*s)))
        .collect();
    assert_eq!(got, want, "{list}");
}

#[tokio::test]
async fn scores_halve_with_each_half_life_and_order_follows_them() {
    let app = app_at_noon(Options::default()).await;
    let t = noon();
    // a: 4 in the current hour (weight 1: its bucket has not ended) and 8
    // in 10:00-11:00 (ended an hour ago). b: 2 now, 16 in 09:00-10:00
    // (ended two hours ago). c: 1 in 11:00-12:00 (ended just now).
    count_at(&app, "a", 4, t, Some("news")).await;
    count_at(&app, "a", 8, t - Duration::minutes(90), None).await;
    count_at(&app, "b", 2, t, Some("sports")).await;
    count_at(&app, "b", 16, t - Duration::minutes(150), None).await;
    count_at(&app, "c", 1, t - Duration::minutes(45), Some("news")).await;

    // 1h: a = 4 + 8/2 = 8, b = 2 + 16/4 = 6, c = 1.
    let l = trending(&app, "half_life=1h").await;
    assert_scores(&l, &[("a", 8.0), ("b", 6.0), ("c", 1.0)]);
    assert_eq!(l["half_life"], "1h");
    assert_eq!(l["half_life_seconds"], 3600);
    assert_eq!(l["now"], t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string());
    assert_eq!(l["exact"], true);
    assert_eq!(l["counters"][0]["id"], "VIDEO_VIEW_a");
    assert_eq!(l["counters"][0]["category"], "news");
    // 2h: a = 4 + 8·2^-0.5 = 9.65685425, b = 2 + 16/2 = 10: b first.
    let l = trending(&app, "half_life=2h").await;
    assert_scores(
        &l,
        &[("b", 10.0), ("a", 4.0 + 8.0 * 0.5f64.sqrt()), ("c", 1.0)],
    );
    // A category keeps its counters only; size cuts the list.
    let l = trending(&app, "half_life=1h&category=news").await;
    assert_scores(&l, &[("a", 8.0), ("c", 1.0)]);
    assert_eq!(l["category"], "news");
    let l = trending(&app, "half_life=1h&size=1").await;
    assert_scores(&l, &[("a", 8.0)]);
    assert_eq!(l["size"], 1);
    // The default half-life is 24h: a = 4 + 8·2^(-1/24), b = 2 + 16·2^(-2/24).
    let l = trending(&app, "").await;
    assert_eq!(l["half_life"], "24h");
    let w = |hours: f64| (-hours / 24.0).exp2();
    assert_scores(
        &l,
        &[
            ("b", 2.0 + 16.0 * w(2.0)),
            ("a", 4.0 + 8.0 * w(1.0)),
            ("c", 1.0),
        ],
    );
    // An hour later, 12:00-13:00 has just ended (weight still 1) and the
    // older buckets are an hour older: a = 4 + 8/4, b = 2 + 16/8, c = 1/2.
    app.options.clock.set(t + Duration::hours(1));
    let l = trending(&app, "half_life=1h").await;
    assert_scores(&l, &[("a", 6.0), ("b", 4.0), ("c", 0.5)]);
}

#[tokio::test]
async fn a_target_busy_now_trends_above_one_busy_long_ago() {
    let app = app_at_noon(Options::default()).await;
    let t = noon();
    // old: 1000 ten days ago (its hour ended 239 hours ago); new: 5 now.
    count_at(&app, "old", 1000, t - Duration::days(10), None).await;
    count_at(&app, "new", 5, t, None).await;
    let top = app.get("/v1/top/VIDEO/VIEW").await;
    assert_eq!(top.json["counters"][0]["uuid"], "old", "{}", top.text);
    let l = trending(&app, "half_life=24h").await;
    assert_scores(
        &l,
        &[("new", 5.0), ("old", 1000.0 * (-239.0f64 / 24.0).exp2())],
    );
    // With a 7-day half-life the old thousand still wins.
    let l = trending(&app, "half_life=7d").await;
    assert_eq!(scores(&l)[0].0, "old", "{l}");
    // Past 20 half-lives a count is not read at all: with 1h, 239 hours.
    let l = trending(&app, "half_life=1h").await;
    assert_scores(&l, &[("new", 5.0)]);
}

#[tokio::test]
async fn hours_are_read_inside_the_hourly_retention_and_days_before_it_never_both() {
    // Hours kept for today and the two days before (today - 2 .. today).
    let mut options = Options::default();
    options.time_policy.hourly_retention_days = 2;
    let app = app_at_noon(options).await;
    let t = noon();
    let today = t.date_naive().and_hms_opt(0, 0, 0).unwrap().and_utc();
    // x: 10 at 12:00 three days ago, read from its day bucket (which ends
    // at midnight two days ago: 2.5 days before now); 10 at 00:30 two days
    // ago, read from its hour bucket (ends at 01:00: 59 hours before now),
    // not from that day's bucket (which would end 36 hours before now).
    count_at(
        &app,
        "x",
        10,
        today - Duration::days(3) + Duration::hours(12),
        None,
    )
    .await;
    count_at(
        &app,
        "x",
        10,
        today - Duration::days(2) + Duration::minutes(30),
        None,
    )
    .await;
    let w = |hours: f64| (-hours / 24.0).exp2();
    let l = trending(&app, "half_life=24h").await;
    assert_scores(&l, &[("x", 10.0 * w(60.0) + 10.0 * w(59.0))]);
    assert_eq!(l["exact"], true);
    // The day buckets hold both counts, each once.
    let h = app
        .get(&counter_path(
            "VIDEO",
            "VIEW",
            "x",
            "/histogram?interval=last_week",
        ))
        .await;
    assert_eq!(h.json["total"], 20, "{}", h.text);

    // A backfilled day inside the hours read moved without an hour.
    let yesterday = (today - Duration::days(1)).format("%Y-%m-%d").to_string();
    let r = app
        .send(
            app.http
                .put(app.url(&counter_path(
                    "VIDEO",
                    "VIEW",
                    "y",
                    &format!("/days/{yesterday}"),
                )))
                .json(&json!({"value": 7})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let l = trending(&app, "half_life=24h").await;
    assert_eq!(l["exact"], false, "{l}");
    // y's day is read from hours, which do not hold it.
    assert!(scores(&l).iter().all(|(u, _)| u != "y"), "{l}");
}

#[tokio::test]
async fn bad_parameters_are_refused_naming_them() {
    let app = app_at_noon(Options::default()).await;
    count_at(&app, "a", 1, noon(), None).await;
    for (query, mentions) in [
        ("half_life=59m", &["half_life", "1h to 365d"][..]),
        ("half_life=366d", &["half_life"]),
        ("half_life=soon", &["half_life", "duration"]),
        ("half_life=", &["half_life"]),
        ("size=0", &["size"]),
        ("size=1001", &["size", "1000"]),
        ("size=ten", &["size"]),
        ("category=", &["category"]),
        ("interval=last_day", &["interval"]),
    ] {
        let r = app.get(&format!("/v1/trending/VIDEO/VIEW?{query}")).await;
        assert_error(&r, 400, "invalid_request", mentions);
    }
    let r = app.get("/v1/trending/VIDEO/%01/").await;
    assert!(r.status == 400 || r.status == 404, "{}", r.text);
    let r = app.get("/v1/trending/VIDEO/VIEW%01").await;
    assert_error(&r, 400, "invalid_request", &["action"]);
}

#[tokio::test]
async fn an_empty_pair_trends_nothing() {
    let app = app_at_noon(Options::default()).await;
    let l = trending(&app, "half_life=36h&size=5").await;
    assert_eq!(l["counters"], json!([]));
    assert_eq!(l["half_life_seconds"], 36 * 3600);
    assert_eq!(l["exact"], true);
}

#[tokio::test]
async fn ties_come_out_by_uuid_and_another_pairs_many_counters_are_left_out() {
    let app = app_at_noon(Options::default()).await;
    let t = noon();
    // Four counters of the pair tie at 3; the size cuts among them by uuid.
    for uuid in ["t4", "t2", "t3", "t1"] {
        count_at(&app, uuid, 3, t, None).await;
    }
    count_at(&app, "top", 5, t, None).await;
    let l = trending(&app, "half_life=1h&size=3").await;
    assert_scores(&l, &[("top", 5.0), ("t1", 3.0), ("t2", 3.0)]);
    // 21,000 counters of another pair score higher: more than the store
    // looks up one by one before it reads the pair's counters whole.
    for batch in 0..21 {
        let events: Vec<Value> = (0..1000)
            .map(|i| {
                json!({"entity": "VIDEO", "action": "LIKE", "uuid": format!("l{batch}-{i}"),
                       "count": 100, "timestamp": rfc3339(t)})
            })
            .collect();
        let r = app.post("/v1/events", json!({ "events": events })).await;
        assert_eq!(r.status, 200, "{}", r.text);
    }
    let l = trending(&app, "half_life=1h&size=3").await;
    assert_scores(&l, &[("top", 5.0), ("t1", 3.0), ("t2", 3.0)]);
    let likes = app.get("/v1/trending/VIDEO/LIKE?half_life=1h&size=2").await;
    assert_eq!(likes.status, 200, "{}", likes.text);
    assert_eq!(likes.json["counters"][0]["uuid"], "l0-0", "{}", likes.text);
    assert_eq!(likes.json["counters"][1]["uuid"], "l0-1", "{}", likes.text);
}

/// A store that keeps bounds for some half-lives (`--trending-half-lives`)
/// answers every list, kept half-life or not, byte for byte as one that
/// scans, over HTTP: increments and decrements over two weeks, categories,
/// sizes, and the clock moved across midnight.
#[tokio::test]
async fn kept_half_lives_answer_as_the_scan() {
    let hour = 3_600_000;
    let kept = app_at_noon(Options {
        trending_half_lives: vec![hour, 24 * hour, 7 * 24 * hour],
        ..Options::default()
    })
    .await;
    let scan = app_at_noon(Options::default()).await;
    let t = noon();
    // 60 targets; target i counts at hours spread over 16 days, some
    // counts negative, every third in a category.
    let mut writes = Vec::new();
    for i in 0..60i64 {
        for j in 0..(1 + i % 5) {
            let ago = Duration::hours((i * 7 + j * 37) % (16 * 24));
            let count = if (i + j) % 7 == 3 {
                -(i % 4) - 1
            } else {
                1 + (i * j) % 9
            };
            let category = ["news", "sports", ""][(i % 3) as usize];
            writes.push((format!("t{i:02}"), count, t - ago, category));
        }
    }
    for app in [&kept, &scan] {
        for (uuid, count, at, category) in &writes {
            let c = (!category.is_empty()).then_some(*category);
            count_at(app, uuid, *count, *at, c).await;
        }
    }
    for step in 0..3 {
        for query in [
            "half_life=24h",
            "half_life=24h&size=5",
            "half_life=1h&size=3",
            "half_life=7d&size=100",
            "half_life=7d&category=news",
            "half_life=24h&category=sports&size=2",
            "half_life=3h",
        ] {
            let (a, b) = (trending(&kept, query).await, trending(&scan, query).await);
            assert_eq!(a, b, "step {step}, {query}");
            // At noon every list has counters to order (later, a 1h
            // half-life reads only the last 20 hours, which hold none).
            assert!(
                step > 0 || !a["counters"].as_array().unwrap().is_empty(),
                "{query}: {a}"
            );
        }
        // Past midnight, then into the next afternoon.
        for app in [&kept, &scan] {
            app.options.clock.set(t + Duration::hours(13 * (step + 1)));
        }
    }
}
