//! `/openapi.json` against the router it describes: every route documented,
//! every documented operation routed, and every status a range of good and
//! bad requests gets declared for its operation.

mod common;

use common::{key_line, Options, TestApp};
use counter_gateway::metrics::ROUTES;
use reqwest::Method;
use serde_json::Value;

/// A concrete path for a documented path template.
fn concrete(template: &str) -> String {
    template
        .replace("{entity}", "VIDEO")
        .replace("{action}", "VIEW")
        .replace("{uuid}", "v1")
}

fn operations(doc: &Value) -> Vec<(String, Method, Value)> {
    let mut ops = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, op) in item.as_object().expect("path item") {
            let m = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            ops.push((path.clone(), m, op.clone()));
        }
    }
    ops
}

#[tokio::test]
async fn every_route_is_documented_and_every_operation_routed() {
    let app = TestApp::start().await;
    let r = app.get("/openapi.json").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    let doc = r.json;
    assert_eq!(doc["openapi"], "3.0.3");
    assert!(doc["components"].get("securitySchemes").is_none());
    let paths = doc["paths"].as_object().unwrap();
    for route in ROUTES {
        assert!(paths.contains_key(*route), "{route} is not documented");
    }
    assert_eq!(
        paths.len(),
        ROUTES.len(),
        "documented paths that are not routes"
    );
    for (path, method, op) in operations(&doc) {
        assert!(op["responses"]["200"].is_object(), "{method} {path}");
        let r = app
            .send(app.http.request(method.clone(), app.url(&concrete(&path))))
            .await;
        assert_ne!(r.status, 405, "{method} {path}: {}", r.text);
        assert!(
            !r.text.contains("no such endpoint"),
            "{method} {path} is documented but not routed"
        );
    }
}

#[tokio::test]
async fn answered_statuses_are_declared() {
    let keys =
        key_line("write", "*", "w") + &key_line("read", "*", "r") + &key_line("admin", "*", "a");
    let app = TestApp::start_with(Options {
        keys,
        ..Options::default()
    })
    .await;
    let doc = app.send(app.http.get(app.url("/openapi.json"))).await.json;
    assert!(doc["components"]["securitySchemes"]["bearer"].is_object());
    let mut seen = 0;
    for (path, method, op) in operations(&doc) {
        let url = app.url(&concrete(&path));
        let mut attempts = vec![
            app.http.request(method.clone(), &url).bearer_auth("a"),
            app.http.request(method.clone(), &url),
            app.http.request(method.clone(), &url).bearer_auth("bad"),
            app.http
                .request(method.clone(), format!("{url}?bogus=1"))
                .bearer_auth("a"),
            app.http
                .request(method.clone(), format!("{url}?tenant=Bad"))
                .bearer_auth("a"),
        ];
        for key in ["w", "r"] {
            attempts.push(app.http.request(method.clone(), &url).bearer_auth(key));
        }
        if method == Method::POST {
            for (ct, body) in [
                ("application/json", "{\"bogus\": 1}"),
                ("application/json", "{"),
                ("application/xml", "<a/>"),
                ("text/plain", "{\"value\": 4, \"count\": 1}"),
            ] {
                attempts.push(
                    app.http
                        .request(method.clone(), &url)
                        .bearer_auth("a")
                        .header("content-type", ct)
                        .body(body),
                );
            }
        }
        for req in attempts {
            let r = app.send(req).await;
            let declared = op["responses"].get(r.status.to_string()).is_some();
            assert!(
                declared,
                "{method} {path} answered {} which is not declared: {}",
                r.status, r.text
            );
            seen += 1;
        }
    }
    assert!(seen > 100, "{seen}");
}

/// Found by schemathesis: a sample whose `id` was counted before on another
/// key added nothing, and the answer was a 500 ("missing after its write").
#[tokio::test]
async fn a_sample_with_an_id_already_counted_elsewhere_is_404_not_500() {
    let app = TestApp::start().await;
    let r = app
        .post(
            "/v1/averages/A/RATING/one",
            serde_json::json!({"value": 4, "id": "e1"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = app
        .post(
            "/v1/averages/A/RATING/two",
            serde_json::json!({"value": 4, "id": "e1"}),
        )
        .await;
    common::assert_error(&r, 404, "not_found", &["id was counted before"]);
}
