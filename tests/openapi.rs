//! `/openapi.json` against the router it describes: every route documented
//! (routes come only from the documented table) and every documented
//! operation routed, the metrics labelled by the same table, every answer
//! with a schema that says its fields, and every status a range of good and
//! bad requests gets declared for its operation.

mod common;

use common::{key_line, Options, TestApp};
use counter_gateway::metrics::routes;
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

/// The router is built from the table of routes alone (`routes!`, which
/// documents what it routes): any other way of adding a route to it would
/// route something the description and the metrics do not know.
#[test]
fn routes_come_only_from_the_documented_table() {
    let source = include_str!("../src/api/mod.rs");
    for forbidden in [
        ".route(",
        ".route_service(",
        ".nest(",
        ".nest_service(",
        ".merge(",
        "axum::routing",
    ] {
        assert!(
            !source.contains(forbidden),
            "src/api/mod.rs uses `{forbidden}`: add routes to `table()` with \
             `.routes(routes!(handler))` and a `#[utoipa::path]` on the handler"
        );
    }
    assert!(source.contains(".routes(routes!("));
}

#[tokio::test]
async fn every_route_is_documented_and_every_operation_routed() {
    let app = TestApp::start().await;
    let r = app.get("/openapi.json").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    let doc = r.json;
    assert_eq!(doc["openapi"], "3.1.0");
    assert!(doc["components"].get("securitySchemes").is_none());
    let paths = doc["paths"].as_object().unwrap();
    let labels = routes();
    for route in labels {
        assert!(paths.contains_key(route), "{route} is not documented");
    }
    assert_eq!(
        paths.len(),
        labels.len(),
        "documented paths without a label"
    );
    let mut ids = std::collections::HashSet::new();
    for (path, method, op) in operations(&doc) {
        assert!(op["responses"]["200"].is_object(), "{method} {path}");
        let id = op["operationId"].as_str().expect("an operationId");
        assert!(ids.insert(id.to_string()), "{id} is not unique");
        let r = app
            .send(app.http.request(method.clone(), app.url(&concrete(&path))))
            .await;
        assert_ne!(r.status, 405, "{method} {path}: {}", r.text);
        assert!(
            !r.text.contains("no such endpoint"),
            "{method} {path} is documented but not routed"
        );
    }
    // Every request above was counted under its documented pattern.
    let metrics = app.get("/metrics").await.text;
    for (path, method, _) in operations(&doc) {
        let series = format!(
            "counter_gateway_http_request_duration_seconds_count{{route=\"{path}\",method=\"{method}\"}}"
        );
        assert!(metrics.contains(&series), "no {series} in:\n{metrics}");
    }
    assert!(!metrics.contains("route=\"unmatched\""), "{metrics}");
}

/// `$ref` and `allOf` resolved into one object schema's properties and
/// required fields.
fn fields(doc: &Value, schema: &Value) -> (serde_json::Map<String, Value>, Vec<String>) {
    if let Some(r) = schema["$ref"].as_str() {
        let name = r
            .strip_prefix("#/components/schemas/")
            .expect("a local $ref");
        return fields(doc, &doc["components"]["schemas"][name]);
    }
    let mut props = schema["properties"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let mut required: Vec<String> = schema["required"]
        .as_array()
        .map(|r| r.iter().map(|v| v.as_str().unwrap().to_string()).collect())
        .unwrap_or_default();
    for part in schema["allOf"].as_array().into_iter().flatten() {
        let (p, r) = fields(doc, part);
        props.extend(p);
        required.extend(r);
    }
    (props, required)
}

/// Every JSON answer, success or error, has a schema naming its fields and
/// the ones always present: no bare `object` a response check cannot fail on.
#[tokio::test]
async fn every_json_answer_has_a_schema_with_its_fields() {
    let app = TestApp::start().await;
    let doc = app.get("/openapi.json").await.json;
    let mut checked = 0;
    for (path, method, op) in operations(&doc) {
        for (status, response) in op["responses"].as_object().unwrap() {
            let Some(schema) = response.pointer("/content/application~1json/schema") else {
                continue;
            };
            // An answer of several shapes (a sample's, by the key's role):
            // each of them is checked.
            let resolved = match schema["$ref"].as_str() {
                Some(r) => &doc["components"]["schemas"][&r["#/components/schemas/".len()..]],
                None => schema,
            };
            let shapes = match resolved["oneOf"].as_array() {
                Some(alternatives) => alternatives.iter().collect(),
                None => vec![schema],
            };
            for shape in shapes {
                let (props, required) = fields(&doc, shape);
                assert!(!props.is_empty(), "{method} {path} {status}: no properties");
                assert!(
                    !required.is_empty(),
                    "{method} {path} {status}: nothing required"
                );
                for r in &required {
                    assert!(
                        props.contains_key(r),
                        "{method} {path} {status}: {r} undefined"
                    );
                }
                for (name, p) in &props {
                    assert!(
                        p.get("type").is_some()
                            || p.get("$ref").is_some()
                            || p.get("oneOf").is_some(),
                        "{method} {path} {status}: {name} has no type"
                    );
                }
            }
            // Every success (200; 202, a crawler's write left out) has its
            // own shape; every refusal the one error shape.
            if !status.starts_with('2') {
                assert_eq!(
                    schema["$ref"], "#/components/schemas/Error",
                    "{method} {path} {status}"
                );
            }
            checked += 1;
        }
    }
    assert!(checked > 80, "{checked}");
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
    let increment = &doc["paths"]["/v1/counters/{entity}/{action}/{uuid}/increment"]["post"];
    assert_eq!(increment["security"][0]["bearer"][0], "write");
    assert!(increment["responses"]["401"]["headers"]["WWW-Authenticate"].is_object());
    assert!(increment["responses"]["503"]["headers"]["Retry-After"].is_object());
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
