//! Local days (`tz=<IANA zone>`) over HTTP on the embedded store: what the
//! conformance scenario `local_days.json` does not show. `tz=UTC` answers
//! byte for byte as no `tz`; the zones furthest from UTC (UTC+14, UTC-12);
//! instants as `from` taken in the zone; a backfilled day making a local
//! answer inexact; a local week across a DST change summing to its hours;
//! a milestone published ahead of the clock. The app's clock is set to
//! fixed instants before the store opens, so nothing depends on the date
//! the suite runs on.

mod common;

use chrono::{DateTime, Duration, Utc};
use common::{assert_error, counter_path, encode, Options, TestApp};
use serde_json::{json, Value};

fn at(s: &str) -> DateTime<Utc> {
    s.parse().unwrap()
}

/// An app whose clock stands at `now` from the start.
async fn app_at(now: &str) -> TestApp {
    let options = Options::default();
    options.clock.set(at(now));
    TestApp::start_with(options).await
}

async fn inc(app: &TestApp, uuid: &str, count: i64, ts: &str) {
    let r = app
        .increment(
            "VIDEO",
            "VIEW",
            uuid,
            json!({"count": count, "timestamp": ts}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
}

async fn get_ok(app: &TestApp, path: &str) -> Value {
    let r = app.get(path).await;
    assert_eq!(r.status, 200, "{path}: {}", r.text);
    r.json
}

fn histogram(uuid: &str, query: &str) -> String {
    counter_path("VIDEO", "VIEW", uuid, &format!("/histogram?{query}"))
}

/// `(day, value)` of a histogram answer.
fn days(j: &Value) -> Vec<(String, i64)> {
    j["buckets"]
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

fn pairs(list: &[(&str, i64)]) -> Vec<(String, i64)> {
    list.iter().map(|(d, v)| (d.to_string(), *v)).collect()
}

#[tokio::test]
async fn tz_utc_answers_byte_for_byte_as_without_tz() {
    let app = app_at("2026-11-30T12:00:00Z").await;
    inc(&app, "a", 2, "2026-11-29T23:30:00Z").await;
    inc(&app, "a", 3, "2026-11-30T01:00:00Z").await;
    inc(&app, "b", 1, "2026-11-30T11:00:00Z").await;
    for (with, without) in [
        (
            histogram("a", "tz=UTC&from=2026-11-29"),
            histogram("a", "from=2026-11-29"),
        ),
        (histogram("a", "tz=Etc/UTC"), histogram("a", "")),
        (
            "/v1/top/VIDEO/VIEW?interval=last_week&tz=UTC".to_string(),
            "/v1/top/VIDEO/VIEW?interval=last_week".to_string(),
        ),
        (
            "/v1/top/VIDEO/VIEW?tz=UTC".to_string(),
            "/v1/top/VIDEO/VIEW".to_string(),
        ),
        (
            counter_path("VIDEO", "VIEW", "a", "/milestones?days=1,3&tz=UTC"),
            counter_path("VIDEO", "VIEW", "a", "/milestones?days=1,3"),
        ),
    ] {
        let (w, wo) = (app.get(&with).await, app.get(&without).await);
        assert_eq!(w.status, 200, "{with}: {}", w.text);
        assert_eq!(w.text, wo.text, "{with} and {without} differ");
        assert!(!w.text.contains("\"tz\""), "{}", w.text);
    }
}

#[tokio::test]
async fn the_zones_furthest_from_utc_take_their_days_half_a_day_away() {
    // 12:00 UTC on 30 November: already 02:00 on 1 December at UTC+14,
    // still 00:00 on the 30th at UTC-12.
    let app = app_at("2026-11-30T12:00:00Z").await;
    inc(&app, "a", 1, "2026-11-29T09:30:00Z").await; // 23:30 on the 29th at +14
    inc(&app, "a", 2, "2026-11-29T10:30:00Z").await; // 00:30 on the 30th at +14
    inc(&app, "a", 4, "2026-11-30T11:30:00Z").await; // 01:30 on 1 December at +14, 23:30 on the 29th at -12
    let j = get_ok(
        &app,
        &histogram("a", "tz=Pacific/Kiritimati&from=2026-11-29"),
    )
    .await;
    assert_eq!(j["to"], "2026-12-01");
    assert_eq!(
        days(&j),
        pairs(&[("2026-11-29", 1), ("2026-11-30", 2), ("2026-12-01", 4)]),
        "{j}"
    );
    let j = get_ok(&app, &histogram("a", "tz=Etc/GMT%2B12&from=2026-11-28")).await;
    assert_eq!(j["tz"], "Etc/GMT+12");
    assert_eq!(j["to"], "2026-11-30");
    assert_eq!(days(&j), pairs(&[("2026-11-28", 3), ("2026-11-29", 4)]));
    // Today at -12 began this hour: its one hour is empty.
    let j = get_ok(&app, "/v1/top/VIDEO/VIEW?interval=last_day&tz=Etc/GMT%2B12").await;
    assert_eq!(j["from"], "2026-11-30");
    assert_eq!(j["counters"], json!([]));
}

#[tokio::test]
async fn instants_as_from_and_to_take_the_local_day_they_fall_in() {
    let app = app_at("2026-11-30T23:30:00Z").await;
    inc(&app, "a", 1, "2026-11-30T22:30:00Z").await; // Berlin: the 30th
    inc(&app, "a", 2, "2026-11-30T23:10:00Z").await; // Berlin: 1 December
                                                     // 23:00 UTC is midnight in Berlin: 1 December there, the 30th in UTC.
    let from = encode("2026-11-30T23:00:00Z");
    let j = get_ok(
        &app,
        &histogram("a", &format!("tz=Europe/Berlin&from={from}")),
    )
    .await;
    assert_eq!(j["from"], "2026-12-01");
    assert_eq!(days(&j), pairs(&[("2026-12-01", 2)]));
    let j = get_ok(&app, &histogram("a", &format!("from={from}"))).await;
    assert_eq!(days(&j), pairs(&[("2026-11-30", 3)]));
    // A local date after today there is refused as in UTC.
    let r = app
        .get(&histogram("a", "tz=America/New_York&from=2026-12-01"))
        .await;
    assert_error(&r, 400, "invalid_request", &["from", "future"]);
}

#[tokio::test]
async fn a_local_week_across_a_dst_change_is_its_hours_and_a_backfill_makes_it_inexact() {
    // Sunday 25 October 2026, 23:30 UTC: Berlin fell back at 01:00 UTC, its
    // 25th had 25 hours.
    let app = app_at("2026-10-25T23:30:00Z").await;
    let mut hourly = 0;
    for h in 0..72 {
        // One count per hour of the last three days, 1..=72.
        let ts = at("2026-10-23T00:10:00Z") + Duration::hours(h);
        inc(
            &app,
            "w",
            h + 1,
            &ts.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        )
        .await;
        hourly += h + 1;
    }
    let j = get_ok(
        &app,
        &histogram("w", "tz=Europe/Berlin&from=2026-10-22&to=2026-10-26"),
    )
    .await;
    assert_eq!(j["exact"], true);
    // Berlin's 23rd runs from 22:00 UTC on the 22nd (the first count,
    // 00:10 UTC, is 02:10 CEST) to 21:59 UTC, the 24th likewise, the 25th
    // from 22:00 UTC on the 24th to 22:59 UTC on the 25th (25 hours), and
    // the 26th from 23:00 UTC.
    let sum = |from: i64, to: i64| (from..=to).map(|h| h + 1).sum::<i64>();
    assert_eq!(
        days(&j),
        pairs(&[
            ("2026-10-23", sum(0, 21)),
            ("2026-10-24", sum(22, 45)),
            ("2026-10-25", sum(46, 70)),
            ("2026-10-26", sum(71, 71)),
        ])
    );
    assert_eq!(j["total"], hourly);
    let hours = get_ok(
        &app,
        &histogram(
            "w",
            "bucket=hour&from=2026-10-24T22:00:00Z&to=2026-10-25T22:59:00Z",
        ),
    )
    .await;
    assert_eq!(hours["buckets"].as_array().unwrap().len(), 25);
    assert_eq!(hours["total"], sum(46, 70));

    // A backfill sets a UTC day without hours: the local days over it are
    // no longer exact (nor are the UTC hours).
    let put = app
        .send(
            app.http
                .put(app.url(&counter_path("VIDEO", "VIEW", "w", "/days/2026-10-24")))
                .json(&json!({"value": 1})),
        )
        .await;
    assert_eq!(put.status, 200, "{}", put.text);
    let j = get_ok(
        &app,
        &histogram("w", "tz=Europe/Berlin&from=2026-10-24&to=2026-10-24"),
    )
    .await;
    assert_eq!(j["exact"], false, "{j}");
    let j = get_ok(
        &app,
        "/v1/top/VIDEO/VIEW?tz=Europe/Berlin&from=2026-10-24&to=2026-10-25",
    )
    .await;
    assert_eq!(j["exact"], false, "{j}");
}

#[tokio::test]
async fn milestones_in_local_days_complete_at_local_midnight() {
    // 23:59:30 EST on 7 March 2026; New York springs forward on the 8th.
    let app = app_at("2026-03-08T04:59:30Z").await;
    // Published a minute ahead (within the skew), on the 8th there: its
    // first local day has not begun, nothing of it is counted yet.
    let r = app
        .post(
            "/v1/events",
            json!({"events": [{"entity": "VIDEO", "action": "VIEW", "uuid": "p", "count": 1,
                "published": "2026-03-08T05:00:30Z"}]}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let milestones = |uuid: &str| {
        counter_path(
            "VIDEO",
            "VIEW",
            uuid,
            "/milestones?days=1,2&tz=America/New_York",
        )
    };
    let m = get_ok(&app, &milestones("p")).await;
    assert_eq!(m["tz"], "America/New_York");
    assert_eq!(m["milestones"][0]["from"], "2026-03-08");
    assert_eq!(m["milestones"][0]["total"], 0);
    // The 8th has 23 hours: 05:00 UTC to 04:00 UTC the next day.
    assert_eq!(m["milestones"][0]["completes"], "2026-03-09T04:00:00.000Z");
    assert_eq!(m["milestones"][1]["completes"], "2026-03-10T04:00:00.000Z");
    // In UTC days the same publication counts from the 8th too, and the
    // count of 04:59 UTC is on it.
    let m = get_ok(
        &app,
        &counter_path("VIDEO", "VIEW", "p", "/milestones?days=1"),
    )
    .await;
    assert_eq!(m["milestones"][0]["total"], 1);

    app.options.clock.set(at("2026-03-08T05:30:00Z")); // 00:30 EST on the 8th
    inc(&app, "p", 5, "2026-03-08T05:30:00Z").await;
    let m = get_ok(&app, &milestones("p")).await;
    assert_eq!(m["milestones"][0]["total"], 5, "{m}");
    assert_eq!(m["milestones"][0]["complete"], false);
    app.options.clock.set(at("2026-03-09T04:00:00Z")); // 00:00 EDT on the 9th
    let m = get_ok(&app, &milestones("p")).await;
    assert_eq!(m["milestones"][0]["complete"], true);
    assert_eq!(m["milestones"][1]["complete"], false);
    assert_eq!(m["exact"], true);

    // The list by first local day agrees; in UTC days the count of 04:59
    // UTC is on the publication day.
    let j = get_ok(
        &app,
        "/v1/top/VIDEO/VIEW?interval=first_1_days&tz=America/New_York",
    )
    .await;
    assert_eq!(j["tz"], "America/New_York");
    assert_eq!(
        j["counters"],
        json!([{"id": "VIDEO_VIEW_p", "uuid": "p", "value": 5,
            "published": "2026-03-08T05:00:30.000Z", "published_source": "set", "complete": true}])
    );
    let j = get_ok(&app, "/v1/top/VIDEO/VIEW?interval=first_1_days").await;
    assert_eq!(j["counters"][0]["value"], 6);
    assert!(j.get("tz").is_none());
}

#[tokio::test]
async fn refusals_name_their_reason_and_write_nothing() {
    let app = app_at("2026-11-30T12:00:00Z").await;
    inc(&app, "a", 1, "2026-11-30T11:00:00Z").await;
    for (path, mentions) in [
        (
            histogram("a", "tz=Asia/Kathmandu&interval=last_day"),
            &["tz", "Asia/Kathmandu", "+05:45"][..],
        ),
        (histogram("a", "tz=europe/berlin"), &["tz", "IANA"][..]),
        (histogram("a", "tz="), &["tz", "IANA"][..]),
        (
            histogram("a", "tz=Europe/Berlin&from=2026-11-01"),
            &["--hourly-retention-days", "Europe/Berlin"][..],
        ),
        (
            histogram("a", "tz=Europe/Berlin&bucket=hour"),
            &["tz", "hour buckets"][..],
        ),
        (
            histogram("a", "tz=Europe/Berlin&interval=last_24_hours"),
            &["bucket=hour"][..],
        ),
        (
            "/v1/top/VIDEO/VIEW?tz=Asia/Kolkata&interval=last_week".into(),
            &["+05:30"][..],
        ),
        (
            "/v1/top/VIDEO/VIEW?tz=Asia/Kolkata&interval=first_2_days".into(),
            &["tz", "+05:30"][..],
        ),
        (
            "/v1/averages/VIDEO/VIEW/a?tz=Europe/Berlin".into(),
            &["tz", "averages"][..],
        ),
        (
            counter_path(
                "VIDEO",
                "VIEW",
                "a",
                "/milestones?days=30&tz=Australia/Adelaide",
            ),
            &["Australia/Adelaide", "+10:30"][..],
        ),
    ] {
        let r = app.get(&path).await;
        assert_error(&r, 400, "invalid_request", mentions);
    }
    // A counter never counted is still a 404 with a zone.
    let r = app
        .get(&histogram("nobody", "tz=Europe/Berlin&interval=last_day"))
        .await;
    assert_eq!(r.status, 404, "{}", r.text);
    assert_eq!(app.value("VIDEO", "VIEW", "a").await, Some(1));
}
