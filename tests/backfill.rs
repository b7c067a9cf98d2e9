//! Backfill over HTTP on the embedded store: `PUT .../days/{day}` and
//! `PUT /v1/days` set day buckets, move counters by the difference, refuse
//! bad days and overflows with nothing applied, keep windowed top lists
//! exact, and survive a restart. Every day is relative to the app's clock.

mod common;

use chrono::Duration;
use common::{assert_error, counter_path, key_line, test_now, Options, TestApp};
use serde_json::{json, Value};

/// The UTC day `n` days before the app's clock, as the API writes days.
fn day(n: i64) -> String {
    (test_now() - Duration::days(n))
        .format("%Y-%m-%d")
        .to_string()
}

/// The start of that day as the API renders timestamps.
fn day_start(n: i64) -> String {
    format!("{}T00:00:00.000Z", day(n))
}

fn ts(n: i64) -> String {
    common::rfc3339(test_now() - Duration::days(n))
}

async fn put(app: &TestApp, path: &str, body: Value) -> common::Resp {
    app.send(app.http.put(app.url(path)).json(&body)).await
}

async fn set_day(app: &TestApp, uuid: &str, n: i64, value: i64) -> common::Resp {
    put(
        app,
        &counter_path("VIDEO", "VIEW", uuid, &format!("/days/{}", day(n))),
        json!({"value": value}),
    )
    .await
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

async fn events(app: &TestApp, events: Value) {
    let r = app.post("/v1/events", json!({ "events": events })).await;
    assert_eq!(r.status, 200, "{}", r.text);
}

fn top(list: &Value) -> Vec<(String, i64)> {
    list["counters"]
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

fn pairs(list: &[(&str, i64)]) -> Vec<(String, i64)> {
    list.iter().map(|(u, v)| (u.to_string(), *v)).collect()
}

#[tokio::test]
async fn setting_a_day_twice_is_once_and_moves_the_counter_by_the_difference() {
    let app = TestApp::start().await;
    events(
        &app,
        json!([
            {"entity": "VIDEO", "action": "VIEW", "uuid": "a", "count": 3, "timestamp": ts(3)},
            {"entity": "VIDEO", "action": "VIEW", "uuid": "a", "count": 2},
        ]),
    )
    .await;
    let r = set_day(&app, "a", 3, 10).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["day"], day(3));
    assert_eq!(
        (&r.json["value"], &r.json["previous"]),
        (&json!(10), &json!(3))
    );
    assert_eq!(r.json["counter"]["value"], 12, "{}", r.text);
    let r = set_day(&app, "a", 3, 10).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["previous"], 10);
    assert_eq!(app.value("VIDEO", "VIEW", "a").await, Some(12));
    // Lowering moves it down by the difference.
    let r = set_day(&app, "a", 3, 1).await;
    assert_eq!(
        (r.status, &r.json["counter"]["value"]),
        (200, &json!(3)),
        "{}",
        r.text
    );
    assert_eq!(
        buckets(&app, "a").await,
        vec![(day(3), 1), (day(0), 2)],
        "the histogram shows the set value beside the counted day"
    );
    // A day that had no bucket gets one; set to 0 it stays, and counts nothing.
    let r = set_day(&app, "a", 5, 0).await;
    assert_eq!(
        (r.status, &r.json["previous"]),
        (200, &json!(0)),
        "{}",
        r.text
    );
    assert_eq!(
        buckets(&app, "a").await,
        vec![(day(5), 0), (day(3), 1), (day(0), 2)]
    );
    assert_eq!(app.value("VIDEO", "VIEW", "a").await, Some(3));
    // Increments after a set add to the set value.
    app.increment(
        "VIDEO",
        "VIEW",
        "a",
        json!({"count": 4, "timestamp": ts(3)}),
    )
    .await;
    assert_eq!(buckets(&app, "a").await[1], (day(3), 5));
    assert_eq!(app.value("VIDEO", "VIEW", "a").await, Some(7));
}

#[tokio::test]
async fn a_set_creates_the_counter_and_touches_it_at_the_start_of_its_day() {
    let app = TestApp::start().await;
    let path = counter_path("VIDEO", "VIEW", "new", &format!("/days/{}", day(5)));
    let r = put(&app, &path, json!({"value": 7, "category": "sports"})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let c = &r.json["counter"];
    assert_eq!((&c["value"], &c["category"]), (&json!(7), &json!("sports")));
    assert_eq!(c["first_timestamp"], day_start(5));
    assert_eq!(c["recorded_timestamp"], day_start(5));
    // A later day moves the last touch forward, an earlier one the first back.
    set_day(&app, "new", 2, 1).await;
    let r = set_day(&app, "new", 40, 1).await;
    let c = &r.json["counter"];
    assert_eq!(c["first_timestamp"], day_start(40), "{}", r.text);
    assert_eq!(c["recorded_timestamp"], day_start(2), "{}", r.text);
    assert_eq!(c["category"], "sports", "no category given leaves it");
    // A backfill of last year does not make a counter touched today look
    // touched then, nor one touched long ago look touched today.
    app.increment("VIDEO", "VIEW", "live", json!({})).await;
    let before = app
        .get(&counter_path("VIDEO", "VIEW", "live", ""))
        .await
        .json;
    let r = set_day(&app, "live", 300, 9).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        r.json["counter"]["recorded_timestamp"],
        before["recorded_timestamp"]
    );
    assert_eq!(r.json["counter"]["first_timestamp"], day_start(300));
    let stale = app.get("/v1/reports/stale?days=30").await;
    let uuids: Vec<&str> = stale.json["counters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["uuid"].as_str().unwrap())
        .collect();
    assert!(uuids.is_empty(), "{}", stale.text);
    set_day(&app, "old", 300, 9).await;
    let stale = app.get("/v1/reports/stale?days=30").await;
    assert_eq!(stale.json["counters"][0]["uuid"], "old", "{}", stale.text);
}

#[tokio::test]
async fn days_past_the_retention_or_in_the_future_are_refused_naming_the_day() {
    let app = TestApp::start().await;
    for (n, why) in [(401, "retention"), (-1, "future")] {
        let r = set_day(&app, "a", n, 5).await;
        assert_error(&r, 400, "invalid_request", &[&day(n), why]);
    }
    // The oldest retained day and today are fine.
    assert_eq!(set_day(&app, "a", 400, 1).await.status, 200);
    assert_eq!(set_day(&app, "a", 0, 1).await.status, 200);
    for bad in ["2026-1-5", "yesterday", "2026-02-30"] {
        let path = counter_path("VIDEO", "VIEW", "b", &format!("/days/{bad}"));
        let r = put(&app, &path, json!({"value": 1})).await;
        assert_error(&r, 400, "invalid_request", &["day", "YYYY-MM-DD"]);
    }
    let path = counter_path("VIDEO", "VIEW", "b", &format!("/days/{}", day(1)));
    for (body, field) in [
        (json!({"value": 1.5}), "value"),
        (json!({"value": "1"}), "value"),
        (json!({}), "value"),
        (json!({"value": 1, "count": 2}), "count"),
        (json!({"value": 18446744073709551615u64}), "value"),
        (json!({"value": 1, "category": "\n"}), "category"),
    ] {
        let r = put(&app, &path, body.clone()).await;
        assert_error(&r, 400, "invalid_request", &[field]);
    }
    let r = app.send(app.http.put(app.url(&path))).await;
    assert_error(&r, 400, "invalid_request", &["empty"]);
    assert_eq!(
        app.value("VIDEO", "VIEW", "b").await,
        None,
        "nothing applied"
    );
}

#[tokio::test]
async fn a_total_past_i64_is_refused_with_nothing_applied() {
    let app = TestApp::start().await;
    app.increment(
        "VIDEO",
        "VIEW",
        "big",
        json!({"count": i64::MAX - 5, "timestamp": ts(1)}),
    )
    .await;
    let r = set_day(&app, "big", 2, 10).await;
    assert_error(&r, 409, "counter_overflow", &[&day(2), "nothing"]);
    assert_eq!(app.value("VIDEO", "VIEW", "big").await, Some(i64::MAX - 5));
    assert_eq!(buckets(&app, "big").await, vec![(day(1), i64::MAX - 5)]);
    // Lowering the day that holds it makes room, and in one batch the
    // sum of the differences counts, not the order of the days.
    let r = put(
        &app,
        "/v1/days",
        json!({"days": [
            {"entity": "VIDEO", "action": "VIEW", "uuid": "big", "day": day(2), "value": 10},
            {"entity": "VIDEO", "action": "VIEW", "uuid": "big", "day": day(1), "value": i64::MAX - 10},
        ]}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json, json!({"set": 2, "changed": 2}));
    assert_eq!(app.value("VIDEO", "VIEW", "big").await, Some(i64::MAX));
    // From i64::MIN to i64::MAX in one bucket: a difference past i64.
    let r = set_day(&app, "swing", 3, i64::MIN).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = set_day(&app, "swing", 3, i64::MAX).await;
    assert_eq!(r.json["counter"]["value"], i64::MAX, "{}", r.text);
    let r = app.get("/v1/top/VIDEO/VIEW?interval=last_week").await;
    assert_eq!(r.status, 200, "{}", r.text);
    let swing = r.json["counters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["uuid"] == "swing")
        .cloned();
    assert_eq!(swing.map(|c| c["value"].clone()), Some(json!(i64::MAX)));
}

#[tokio::test]
async fn a_batch_is_validated_whole_and_applied_all_or_nothing() {
    let app = TestApp::start().await;
    events(
        &app,
        json!([{"entity": "VIDEO", "action": "VIEW", "uuid": "full", "count": i64::MAX}]),
    )
    .await;
    let good = |uuid: &str, n: i64, value: i64| json!({"entity": "VIDEO", "action": "VIEW", "uuid": uuid, "day": day(n), "value": value});
    let r = put(
        &app,
        "/v1/days",
        json!({"days": [good("a", 1, 5), good("a", 401, 5), good("b", 2, 1), good("b", -1, 1), good("a", 1, 6)]}),
    )
    .await;
    assert_error(&r, 400, "invalid_days", &["3 invalid day"]);
    let details: Vec<(u64, String)> = r.json["error"]["details"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["index"].as_u64().unwrap(),
                d["reason"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(
        details.iter().map(|d| d.0).collect::<Vec<_>>(),
        vec![1, 3, 4]
    );
    assert!(details[0].1.contains(&day(401)) && details[0].1.contains("retention"));
    assert!(details[1].1.contains(&day(-1)) && details[1].1.contains("future"));
    assert!(details[2].1.contains("days[0]"), "{}", details[2].1);
    // One overflowing counter refuses the whole batch.
    let r = put(
        &app,
        "/v1/days",
        json!({"days": [good("a", 1, 5), good("full", 3, 1), good("b", 2, 1)]}),
    )
    .await;
    assert_error(&r, 409, "counter_overflow", &["full", "days[1]", "nothing"]);
    for uuid in ["a", "b"] {
        assert_eq!(app.value("VIDEO", "VIEW", uuid).await, None, "{uuid}");
    }
    // Bounded like /v1/events.
    let many: Vec<Value> = (0..=common::MAX_EVENTS as i64)
        .map(|i| good(&format!("u{i}"), 1, 1))
        .collect();
    let r = put(&app, "/v1/days", json!({ "days": many })).await;
    assert_error(&r, 400, "invalid_request", &["over the limit"]);
    for (body, mention) in [
        (json!({"days": []}), "at least one"),
        (json!({"days": [{"entity": "VIDEO"}]}), "days[0]"),
        (json!({"days": [good("a", 1, 1)], "extra": 1}), "extra"),
    ] {
        let r = put(&app, "/v1/days", body).await;
        assert_error(&r, 400, "invalid_request", &[mention]);
    }
    let r = put(
        &app,
        "/v1/days",
        json!({"days": [good("a", 1, 5), good("b", 2, 1)]}),
    )
    .await;
    assert_eq!(r.json, json!({"set": 2, "changed": 2}), "{}", r.text);
    let r = put(
        &app,
        "/v1/days",
        json!({"days": [good("a", 1, 5), good("b", 2, 3)]}),
    )
    .await;
    assert_eq!(r.json, json!({"set": 2, "changed": 1}), "{}", r.text);
}

/// The kept window totals fold a set like an increment: a day inside the
/// week moves the week's list, a day outside it only the month's.
#[tokio::test]
async fn windowed_top_lists_stay_exact_after_a_backfill() {
    let app = TestApp::start().await;
    events(
        &app,
        json!([
            {"entity": "VIDEO", "action": "VIEW", "uuid": "a", "count": 10, "timestamp": ts(2)},
            {"entity": "VIDEO", "action": "VIEW", "uuid": "b", "count": 20, "timestamp": ts(1)},
            {"entity": "VIDEO", "action": "VIEW", "uuid": "c", "count": 5, "timestamp": ts(20)},
        ]),
    )
    .await;
    let list = |interval: &str| {
        let app = &app;
        let path = format!("/v1/top/VIDEO/VIEW?interval={interval}");
        async move {
            let r = app.get(&path).await;
            assert_eq!(r.status, 200, "{}", r.text);
            assert_eq!(r.json["exact"], true);
            top(&r.json)
        }
    };
    assert_eq!(list("last_week").await, pairs(&[("b", 20), ("a", 10)]));
    let r = put(
        &app,
        "/v1/days",
        json!({"days": [
            {"entity": "VIDEO", "action": "VIEW", "uuid": "a", "day": day(2), "value": 30},
            {"entity": "VIDEO", "action": "VIEW", "uuid": "c", "day": day(20), "value": 50},
            {"entity": "VIDEO", "action": "VIEW", "uuid": "d", "day": day(10), "value": 1},
        ]}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(list("last_week").await, pairs(&[("a", 30), ("b", 20)]));
    assert_eq!(
        list("last_month").await,
        pairs(&[("c", 50), ("a", 30), ("b", 20), ("d", 1)])
    );
    assert_eq!(
        list("all").await,
        pairs(&[("c", 50), ("a", 30), ("b", 20), ("d", 1)])
    );
    // Lowered below another, set twice: still exact, and the same as the
    // buckets summed for the same days.
    for _ in 0..2 {
        assert_eq!(set_day(&app, "a", 2, 15).await.status, 200);
    }
    assert_eq!(list("last_week").await, pairs(&[("b", 20), ("a", 15)]));
    let from = day(6);
    let summed = app
        .get(&format!("/v1/top/VIDEO/VIEW?from={from}&to={}", day(1)))
        .await;
    assert_eq!(top(&summed.json), pairs(&[("b", 20), ("a", 15)]));
}

/// The same on the store itself, with the change log folded first so the
/// lists come from the kept totals (not a bucket sum), and across a day
/// change that rolls a set day out of the week.
#[tokio::test]
async fn the_kept_window_totals_fold_sets_and_roll_them_out() {
    use counter_gateway::domain::{day_of, CounterKey, DaySet, ManualClock, Window};
    use counter_gateway::store::sqlite::{Durability, SqliteStore};
    use counter_gateway::store::{DaysOutcome, Store, TopQuery};
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(test_now());
    let store = SqliteStore::open(
        dir.path(),
        Durability::Relaxed,
        std::time::Duration::from_secs(3600),
        400,
        clock.clock(),
    )
    .unwrap();
    let today = day_of(test_now());
    let set = |uuid: &str, day: i64, value: i64| DaySet {
        key: CounterKey::new("VIDEO", "VIEW", uuid).unwrap(),
        day,
        value,
        category: None,
    };
    let out = store
        .set_days(
            vec![
                set("a", today - 6, 30),
                set("b", today - 1, 20),
                set("c", today - 20, 50),
            ],
            today - 400,
        )
        .await
        .unwrap();
    assert!(matches!(out, DaysOutcome::Applied { .. }), "{out:?}");
    let list = |len: i64| {
        let store = &store;
        let today = store.today();
        async move {
            store.catch_up().await.unwrap();
            let l = store
                .top(&TopQuery {
                    entity: "VIDEO".into(),
                    action: "VIEW".into(),
                    window: Some(Window {
                        from_day: today - len + 1,
                        to_day: today,
                    }),
                    category: None,
                    size: 10,
                })
                .await
                .unwrap();
            l.entries
                .iter()
                .map(|e| (e.uuid.clone(), i64::try_from(e.value).unwrap()))
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(list(7).await, pairs(&[("a", 30), ("b", 20)]));
    assert_eq!(list(30).await, pairs(&[("c", 50), ("a", 30), ("b", 20)]));
    store
        .set_days(
            vec![set("a", today - 6, 5), set("c", today - 20, 60)],
            today - 400,
        )
        .await
        .unwrap();
    assert_eq!(list(7).await, pairs(&[("b", 20), ("a", 5)]));
    assert_eq!(list(30).await, pairs(&[("c", 60), ("b", 20), ("a", 5)]));
    // The next day, a's set day has left the week.
    clock.advance(Duration::days(1));
    assert_eq!(list(7).await, pairs(&[("b", 20)]));
    assert_eq!(list(30).await, pairs(&[("c", 60), ("b", 20), ("a", 5)]));
}

#[tokio::test]
async fn set_days_are_durable_across_a_restart() {
    let app = TestApp::start().await;
    app.increment("VIDEO", "VIEW", "a", json!({"count": 2}))
        .await;
    assert_eq!(set_day(&app, "a", 4, 40).await.status, 200);
    let r = put(
        &app,
        "/v1/days",
        json!({"days": [{"entity": "VIDEO", "action": "VIEW", "uuid": "b", "day": day(3), "value": 8}]}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let app = app.restart().await;
    assert_eq!(app.value("VIDEO", "VIEW", "a").await, Some(42));
    assert_eq!(buckets(&app, "a").await, vec![(day(4), 40), (day(0), 2)]);
    assert_eq!(app.value("VIDEO", "VIEW", "b").await, Some(8));
    let r = app.get("/v1/top/VIDEO/VIEW?interval=last_week").await;
    assert_eq!(top(&r.json), pairs(&[("a", 42), ("b", 8)]));
}

/// Increments racing sets of the same counter, on the day being set and on
/// another: whatever the interleaving, the counter is the sum of its
/// buckets (no increment lost or counted twice), and the day set last
/// holds its value plus only the increments acknowledged after it.
#[tokio::test]
async fn increments_racing_sets_are_neither_lost_nor_counted_twice() {
    let app = std::sync::Arc::new(TestApp::start().await);
    let adders: Vec<_> = (0..4)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move {
                for i in 0..50 {
                    let when = if i % 2 == 0 { ts(0) } else { ts(1) };
                    let r = app
                        .increment("VIDEO", "VIEW", "hot", json!({"timestamp": when}))
                        .await;
                    assert_eq!(r.status, 200, "{}", r.text);
                }
            })
        })
        .collect();
    for v in [100, 7, 100, 0, 55] {
        let r = set_day(&app, "hot", 1, v).await;
        assert_eq!(r.status, 200, "{}", r.text);
    }
    for a in adders {
        a.await.unwrap();
    }
    let total: i64 = buckets(&app, "hot").await.iter().map(|b| b.1).sum();
    assert_eq!(app.value("VIDEO", "VIEW", "hot").await, Some(total));
    // Quiet now: a set is exact, and the increments of today all count.
    let r = set_day(&app, "hot", 1, 1000).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let b = buckets(&app, "hot").await;
    assert_eq!(b, vec![(day(1), 1000), (day(0), 100)]);
    assert_eq!(app.value("VIDEO", "VIEW", "hot").await, Some(1100));
}

#[tokio::test]
async fn only_admin_keys_may_backfill() {
    let keys =
        key_line("write", "*", "w") + &key_line("read", "*", "r") + &key_line("admin", "acme", "a");
    let app = TestApp::start_with(Options {
        keys,
        ..Options::default()
    })
    .await;
    let path = counter_path("VIDEO", "VIEW", "k", &format!("/days/{}", day(1)));
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
    let r = app
        .send(
            app.http
                .put(app.url(&path))
                .bearer_auth("a")
                .json(&json!({"value": 3})),
        )
        .await;
    assert_eq!(
        (r.status, &r.json["counter"]["value"]),
        (200, &json!(3)),
        "{}",
        r.text
    );
    // The admin key's tenant got it, not the default tenant.
    let r = app
        .send(
            app.http
                .get(app.url(&counter_path("VIDEO", "VIEW", "k", "")))
                .bearer_auth("r"),
        )
        .await;
    assert_eq!(r.status, 404, "{}", r.text);
    let r = app
        .send(
            app.http
                .get(app.url(&counter_path("VIDEO", "VIEW", "k", "")))
                .header("x-tenant", "acme")
                .bearer_auth("r"),
        )
        .await;
    assert_eq!(r.json["value"], 3, "{}", r.text);
}

/// Days set per second through the batch form (one figure, not an
/// assertion): `cargo test --release --test backfill -- --ignored --nocapture`.
#[tokio::test]
#[ignore]
async fn bench_days_set_per_second() {
    let app = TestApp::start_with(Options {
        limits: counter_gateway::Limits {
            max_body_bytes: 4 * 1024 * 1024,
            max_events_per_request: 10_000,
        },
        ..Options::default()
    })
    .await;
    let counters = 1_000;
    let days = 365;
    let bodies: Vec<Value> = (0..counters / 10)
        .map(|chunk| {
            let mut items = Vec::new();
            for c in chunk * 10..chunk * 10 + 10 {
                for d in 0..days {
                    items.push(
                        json!({"entity": "VIDEO", "action": "VIEW", "uuid": format!("c{c}"),
                                      "day": day(d), "value": (c * d) % 97}),
                    );
                }
            }
            json!({ "days": items })
        })
        .collect();
    let started = std::time::Instant::now();
    for b in &bodies {
        let r = put(&app, "/v1/days", b.clone()).await;
        assert_eq!(r.status, 200, "{}", r.text);
    }
    let took = started.elapsed();
    let n = counters * days;
    println!(
        "backfill: {n} days of {counters} counters in batches of {}: {:.2} s, {:.0} days/s",
        10 * days,
        took.as_secs_f64(),
        n as f64 / took.as_secs_f64()
    );
}
