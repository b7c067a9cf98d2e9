//! HTTP tests of the read endpoints that the conformance scenarios cannot
//! express: concurrency and durability of average samples, paging a report
//! while it changes, the retention reach of histograms, the error shape.

mod common;

use chrono::Duration;
use common::{assert_error, now_secs, rendered, rfc3339, TestApp};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_samples_and_retractions_are_exact_and_durable() {
    let app = TestApp::start().await;
    let path = "/v1/averages/ARTICLE/rating/hot";
    let mut tasks = Vec::new();
    for client in 0..16i64 {
        let http = app.http.clone();
        let url = app.url(path);
        tasks.push(tokio::spawn(async move {
            for i in 0..20i64 {
                let value = (client + i) % 5 + 1;
                for body in [json!({"value": value}), json!({"value": 3})] {
                    let r = http.post(&url).json(&body).send().await.unwrap();
                    assert_eq!(r.status(), 200);
                }
                // Every other round withdraws the 3 it just gave.
                if i % 2 == 0 {
                    let r = http
                        .post(&url)
                        .json(&json!({"value": 3, "retract": true}))
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(r.status(), 200);
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let mut sum = 0;
    for client in 0..16i64 {
        for i in 0..20i64 {
            sum += (client + i) % 5 + 1 + if i % 2 == 0 { 0 } else { 3 };
        }
    }
    let quantity = 16 * 20 + 16 * 10;
    let got = app.get(path).await;
    assert_eq!(got.status, 200, "{}", got.text);
    assert_eq!(got.json["sum"], sum);
    assert_eq!(got.json["quantity"], quantity);
    let app = app.restart().await;
    let got = app.get(path).await;
    assert_eq!(
        (got.json["sum"].as_i64(), got.json["quantity"].as_i64()),
        (Some(sum), Some(quantity))
    );
    assert_eq!(got.json["average"], sum as f64 / quantity as f64);
}

#[tokio::test]
async fn a_report_paged_while_it_changes_repeats_nothing() {
    let app = TestApp::start().await;
    let base = now_secs() - Duration::days(60);
    let events: Vec<_> = (0..9)
        .map(|i| {
            json!({"entity": "DOC", "action": "VIEW", "uuid": format!("d{i}"),
                   "timestamp": rfc3339(base + Duration::hours(i))})
        })
        .collect();
    assert_eq!(
        app.post("/v1/events", json!({"events": events}))
            .await
            .status,
        200
    );

    let page1 = app.get("/v1/reports/stale?days=30&size=4").await;
    assert_eq!(page1.status, 200, "{}", page1.text);
    let uuids = |r: &common::Resp| -> Vec<String> {
        r.json["counters"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["uuid"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(uuids(&page1), ["d0", "d1", "d2", "d3"]);
    // Between pages, d5 is touched (no longer stale) and d1 too (already seen).
    for u in ["d5", "d1"] {
        assert_eq!(app.increment("DOC", "VIEW", u, json!({})).await.status, 200);
    }
    let cursor = page1.json["next_cursor"].as_str().unwrap();
    let page2 = app
        .get(&format!("/v1/reports/stale?days=30&size=4&cursor={cursor}"))
        .await;
    assert_eq!(uuids(&page2), ["d4", "d6", "d7", "d8"]);
    assert_eq!(page2.json["next_cursor"], serde_json::Value::Null);
    assert_eq!(
        page2.json["counters"][0]["recorded_timestamp"],
        rendered(base + Duration::hours(4))
    );
}

#[tokio::test]
async fn histogram_all_reaches_back_to_the_retention() {
    let app = TestApp::start().await;
    let old = now_secs() - Duration::days(399);
    let r = app
        .increment(
            "V",
            "VIEW",
            "u",
            json!({"count": 3, "timestamp": rfc3339(old)}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    app.increment("V", "VIEW", "u", json!({})).await;

    let all = app
        .get("/v1/counters/V/VIEW/u/histogram?interval=all")
        .await;
    assert_eq!(all.status, 200, "{}", all.text);
    assert_eq!(all.json["total"], 4);
    assert_eq!(
        all.json["from"],
        (now_secs() - Duration::days(400))
            .format("%Y-%m-%d")
            .to_string()
    );
    // The default window (last_month) sees only today's increment.
    let month = app.get("/v1/counters/V/VIEW/u/histogram").await;
    assert_eq!(month.json["total"], 1);
}

#[tokio::test]
async fn bad_parameters_get_the_one_error_shape_naming_them() {
    let app = TestApp::start().await;
    app.increment("V", "VIEW", "u", json!({})).await;
    let cases: [(&str, &[&str]); 7] = [
        ("/v1/top/V/VIEW?size=1&size=2", &["size"]),
        ("/v1/top/V/VIEW?interval=weekly", &["interval", "last_week"]),
        ("/v1/top/V/VIEW?sise=2", &["sise"]),
        ("/v1/top-averages/V/VIEW?min_quantity=-1", &["min_quantity"]),
        ("/v1/reports/stale?cursor=c1.00", &["cursor"]),
        ("/v1/reports/stale?days=1.5", &["days"]),
        ("/v1/counters/V/VIEW/u/histogram?from=2020-02-30", &["from"]),
    ];
    for (path, mentions) in cases {
        let r = app.get(path).await;
        assert_error(&r, 400, "invalid_request", mentions);
    }
}

/// A name or category a spreadsheet would evaluate (`=`, `+`, `-`, `@`;
/// a tab or CR cannot start a name, see the unit test of `csv_field`) is
/// written with a `'` in front, inside its quotes, in the stale report's
/// CSV; the JSON form keeps every name as it is.
#[tokio::test]
async fn the_stale_csv_neutralises_fields_a_spreadsheet_would_evaluate() {
    let app = TestApp::start().await;
    let old = rfc3339(now_secs() - Duration::days(40));
    let mut events = Vec::new();
    for (i, c) in ["=", "+", "-", "@"].iter().enumerate() {
        events.push(json!({
            "entity": format!("{c}E"), "action": "VIEW",
            "uuid": format!("{c}cmd|' /C calc'!A{i}"),
            "category": format!("{c}HYPERLINK(\"http://x\")"),
            "timestamp": old,
        }));
    }
    let r = app.post("/v1/events", json!({ "events": events })).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = app
        .send(
            app.http
                .get(app.url("/v1/reports/stale?days=30"))
                .header("accept", "text/csv"),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let lines: Vec<&str> = r.text.lines().skip(1).collect();
    assert_eq!(lines.len(), 4, "{}", r.text);
    for c in ["=", "+", "-", "@"] {
        let line = lines
            .iter()
            .find(|l| l.starts_with(&format!("\"'{c}E_VIEW_")))
            .unwrap_or_else(|| panic!("{c}: no neutralised line in {}", r.text));
        assert!(
            line.contains(&format!(",\"'{c}E\",VIEW,\"'{c}cmd|")),
            "{line}"
        );
        assert!(
            line.contains(&format!(",1,\"'{c}HYPERLINK(\"\"http://x\"\")\",")),
            "{line}"
        );
    }
    // No field of any line starts a formula outside quotes.
    for l in &lines {
        for f in l.split(',') {
            assert!(!f.starts_with(['=', '+', '-', '@']), "{f} in {l}");
        }
    }
    let json = app.get("/v1/reports/stale?days=30").await;
    let entities: Vec<&str> = json.json["counters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["entity"].as_str().unwrap())
        .collect();
    assert!(
        entities.contains(&"=E") && entities.contains(&"@E"),
        "{entities:?}"
    );
}
