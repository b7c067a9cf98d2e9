//! `/metrics` after known traffic: requests by matched route (never the raw
//! path), method and status, latency histograms, and the write path's flushes.

mod common;

use common::{counter_path, metric_in, TestApp};
use serde_json::json;

fn requests(route: &str, method: &str, status: u16) -> String {
    format!(
        "counter_gateway_http_requests_total{{route=\"{route}\",method=\"{method}\",status=\"{status}\"}}"
    )
}

#[tokio::test]
async fn metrics_show_known_traffic_by_route_and_status() {
    let app = TestApp::start().await;
    for uuid in ["a", "b", "c"] {
        let r = app.increment("M", "VIEW", uuid, json!({"count": 2})).await;
        assert_eq!(r.status, 200, "{}", r.text);
    }
    assert_eq!(
        app.get(&counter_path("M", "VIEW", "nope", "")).await.status,
        404
    );
    let r = app.increment("M", "VIEW", "a", json!({"count": 1.5})).await;
    assert_eq!(r.status, 400);
    assert_eq!(app.get("/no/such/path/x1").await.status, 404);
    assert_eq!(app.get("/no/such/path/x2").await.status, 404);

    let text = app.get("/metrics").await.text;
    let m = |name: &str| metric_in(&text, name).unwrap_or_else(|| panic!("no {name} in\n{text}"));
    let inc = "/v1/counters/{entity}/{action}/{uuid}/increment";
    assert_eq!(m(&requests(inc, "POST", 200)), 3.0);
    assert_eq!(m(&requests(inc, "POST", 400)), 1.0);
    assert_eq!(
        m(&requests(
            "/v1/counters/{entity}/{action}/{uuid}",
            "GET",
            404
        )),
        1.0
    );
    assert_eq!(m(&requests("unmatched", "GET", 404)), 2.0);
    // Raw paths never become labels.
    assert!(!text.contains("/no/such"), "{text}");
    assert!(!text.contains("route=\"/v1/counters/M/"), "{text}");

    let hist = format!(
        "counter_gateway_http_request_duration_seconds_count{{route=\"{inc}\",method=\"POST\"}}"
    );
    assert_eq!(m(&hist), 4.0);
    let inf = format!(
        "counter_gateway_http_request_duration_seconds_bucket{{route=\"{inc}\",method=\"POST\",le=\"+Inf\"}}"
    );
    assert_eq!(m(&inf), 4.0);

    // Three single increments of 2: at least one flush, 3 increments.
    assert_eq!(m("counter_gateway_flushed_increments_total"), 3.0);
    let flushes = m("counter_gateway_flushes_total");
    assert!(flushes >= 1.0);
    assert_eq!(m("counter_gateway_flush_increments_count"), flushes);
    assert_eq!(m("counter_gateway_flush_duration_seconds_count"), flushes);
    assert!(m("counter_gateway_increments_per_store_write") > 0.0);
    assert_eq!(m("counter_gateway_queue_depth"), 0.0);
    // The scrape itself is counted from the next one on.
    let text = app.get("/metrics").await.text;
    assert_eq!(
        metric_in(&text, &requests("/metrics", "GET", 200)),
        Some(1.0)
    );
}

/// `--log-format json`: every log line is one JSON object with level and message.
#[test]
fn json_logs_are_one_object_per_line() {
    let dir = tempfile::tempdir().unwrap();
    // Refused at start-up (no keys beyond loopback), so it logs and exits.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_counter-gateway"))
        .args(["--log-format", "json", "serve", "--listen", "0.0.0.0:0"])
        .arg("--data-dir")
        .arg(dir.path())
        .env_remove("COUNTER_GATEWAY_API_KEYS")
        .env_remove("COUNTER_GATEWAY_API_KEYS_FILE")
        .env_remove("COUNTER_GATEWAY_ALLOW_UNAUTHENTICATED")
        .env("RUST_LOG", "info")
        .output()
        .expect("run the binary");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let logs: Vec<serde_json::Value> = err
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let stopped = logs
        .iter()
        .find(|l| l["message"] == "counter-gateway stopped")
        .unwrap_or_else(|| panic!("no stop line in {err}"));
    assert_eq!(stopped["level"], "ERROR");
    assert!(stopped["error"]
        .as_str()
        .unwrap()
        .contains("without API keys"));
}
