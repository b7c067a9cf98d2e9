//! API keys and roles over HTTP: each role against each class of endpoint,
//! missing, malformed and unknown keys, the `key` query parameter of a
//! beacon, and the refusal to serve without keys beyond loopback.

mod common;

use common::{assert_error, counter_path, key_line, Options, TestApp};
use reqwest::Method;
use serde_json::json;

const WRITE: &str = "w-0123456789abcdef";
const READ: &str = "r-0123456789abcdef";
const ADMIN: &str = "a-0123456789abcdef";
const ROOT: &str = "root-0123456789abcdef";

async fn app_with_keys() -> TestApp {
    let keys = [
        key_line("write", "acme", WRITE),
        key_line("read", "acme", READ),
        key_line("admin", "acme", ADMIN),
        key_line("admin", "*", ROOT),
    ]
    .concat();
    TestApp::start_with(Options {
        keys,
        ..Options::default()
    })
    .await
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Class {
    Write,
    Read,
    Admin,
}

/// One request of every endpoint, with the role it needs.
fn endpoints() -> Vec<(Class, Method, String, Option<serde_json::Value>)> {
    let c = |s: &str| counter_path("VIDEO", "VIEW", "v1", s);
    vec![
        (Class::Write, Method::POST, c("/increment"), None),
        (Class::Write, Method::POST, c("/decrement"), None),
        (
            Class::Write,
            Method::POST,
            "/v1/events".into(),
            Some(json!({"events": [{"entity": "VIDEO", "action": "VIEW", "uuid": "v1"}]})),
        ),
        (
            Class::Write,
            Method::POST,
            "/v1/averages/VIDEO/RATING/v1".into(),
            Some(json!({"value": 4})),
        ),
        (Class::Read, Method::GET, c(""), None),
        (Class::Read, Method::GET, c("/histogram"), None),
        (
            Class::Read,
            Method::GET,
            "/v1/targets/VIDEO/v1/counters".into(),
            None,
        ),
        (Class::Read, Method::GET, "/v1/top/VIDEO/VIEW".into(), None),
        (
            Class::Read,
            Method::GET,
            "/v1/trending/VIDEO/VIEW".into(),
            None,
        ),
        (
            Class::Read,
            Method::GET,
            "/v1/top-averages/VIDEO/RATING".into(),
            None,
        ),
        (
            Class::Read,
            Method::GET,
            "/v1/averages/VIDEO/RATING/v1".into(),
            None,
        ),
        (Class::Read, Method::GET, "/v1/reports/stale".into(), None),
        (Class::Read, Method::GET, "/v1/reports/unused".into(), None),
        (Class::Admin, Method::DELETE, c(""), None),
    ]
}

async fn call(
    app: &TestApp,
    method: &Method,
    path: &str,
    body: &Option<serde_json::Value>,
    key: Option<&str>,
) -> common::Resp {
    let mut req = app.http.request(method.clone(), app.url(path));
    if let Some(b) = body {
        req = req.json(b);
    }
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    app.send(req).await
}

#[tokio::test]
async fn each_role_reaches_exactly_its_endpoints() {
    let app = app_with_keys().await;
    // Something to read and delete.
    let r = call(
        &app,
        &Method::POST,
        &counter_path("VIDEO", "VIEW", "v1", "/increment"),
        &None,
        Some(ADMIN),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);

    for (role, key) in [
        (Class::Write, WRITE),
        (Class::Read, READ),
        (Class::Admin, ADMIN),
    ] {
        for (class, method, path, body) in endpoints() {
            if class == Class::Admin && role == Class::Admin {
                continue; // the delete runs last, below
            }
            let r = call(&app, &method, &path, &body, Some(key)).await;
            let allowed = role == class || role == Class::Admin;
            if allowed {
                assert!(
                    r.status != 401 && r.status != 403,
                    "{role:?} key on {method} {path}: {} {}",
                    r.status,
                    r.text
                );
                assert!(r.status < 500, "{method} {path}: {}", r.text);
            } else {
                assert_error(&r, 403, "forbidden", &["key"]);
            }
        }
    }
    let r = call(
        &app,
        &Method::DELETE,
        &counter_path("VIDEO", "VIEW", "v1", ""),
        &None,
        Some(ADMIN),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
}

#[tokio::test]
async fn missing_malformed_and_unknown_keys_are_401() {
    let app = app_with_keys().await;
    for (_, method, path, body) in endpoints() {
        let r = call(&app, &method, &path, &body, None).await;
        assert_error(&r, 401, "unauthorized", &["API key"]);
        assert_eq!(r.header("www-authenticate"), Some("Bearer"));
    }
    let path = counter_path("VIDEO", "VIEW", "v1", "/increment");
    for auth in [
        "Basic dXNlcjpwYXNz",
        "Bearer",
        "Bearer ",
        WRITE,
        "Token abc",
    ] {
        let r = app
            .send(app.http.post(app.url(&path)).header("authorization", auth))
            .await;
        assert_error(&r, 401, "unauthorized", &["Authorization"]);
        assert_eq!(r.header("www-authenticate"), Some("Bearer"));
    }
    for wrong in ["nope", &WRITE[..WRITE.len() - 1], &format!("{WRITE}x")] {
        let r = app
            .send(app.http.post(app.url(&path)).bearer_auth(wrong))
            .await;
        assert_error(&r, 401, "unauthorized", &["not valid"]);
        let r = app.post(&format!("{path}?key={wrong}"), json!({})).await;
        assert_error(&r, 401, "unauthorized", &["not valid"]);
    }
    // Nothing of it was counted.
    let r = call(
        &app,
        &Method::GET,
        &counter_path("VIDEO", "VIEW", "v1", ""),
        &None,
        Some(READ),
    )
    .await;
    assert_error(&r, 404, "not_found", &[]);
}

#[tokio::test]
async fn a_key_of_tenant_a_cannot_touch_tenant_b() {
    let app = app_with_keys().await;
    let path = counter_path("VIDEO", "VIEW", "v1", "");
    let r = app
        .send(
            app.http
                .post(app.url(&format!("{path}/increment")))
                .bearer_auth(ROOT)
                .header("x-tenant", "globex"),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    for (key, method) in [
        (READ, Method::GET),
        (ADMIN, Method::DELETE),
        (WRITE, Method::POST),
    ] {
        let p = if method == Method::POST {
            format!("{path}/increment")
        } else {
            path.clone()
        };
        let r = app
            .send(
                app.http
                    .request(method.clone(), app.url(&format!("{p}?tenant=globex")))
                    .bearer_auth(key),
            )
            .await;
        assert_error(&r, 403, "forbidden", &["tenant"]);
    }
    // globex's counter is untouched; acme's own view of the same key is empty.
    let r = app
        .send(
            app.http
                .get(app.url(&path))
                .bearer_auth(ROOT)
                .header("x-tenant", "globex"),
        )
        .await;
    assert_eq!(r.json["value"], 1, "{}", r.text);
    let r = app
        .send(app.http.get(app.url(&path)).bearer_auth(READ))
        .await;
    assert_error(&r, 404, "not_found", &[]);
}

#[tokio::test]
async fn a_beacon_counts_with_a_text_plain_body_and_a_key_parameter() {
    let app = app_with_keys().await;
    let body = r#"{"events":[{"entity":"ARTICLE","action":"VIEW","uuid":"a1","count":2}]}"#;
    let r = app
        .post_raw(
            &format!("/v1/events?key={WRITE}"),
            Some("text/plain;charset=UTF-8"),
            body,
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["accepted"], 1);
    let r = app
        .send(app.http.get(app.url(&format!(
            "/v1/counters/ARTICLE/VIEW/a1?key={READ}&tenant=acme"
        ))))
        .await;
    assert_eq!(r.json["value"], 2, "{}", r.text);
    // The public write key cannot read what it wrote.
    let r = app
        .get(&format!("/v1/counters/ARTICLE/VIEW/a1?key={WRITE}"))
        .await;
    assert_error(&r, 403, "forbidden", &["write key"]);
}

#[tokio::test]
async fn operations_endpoints_and_metrics_access() {
    let app = app_with_keys().await;
    assert_eq!(app.get("/healthz").await.status, 200);
    assert_eq!(app.get("/readyz").await.status, 200);
    assert_eq!(app.get("/openapi.json").await.status, 200);
    // Metrics span every tenant: only an admin key of `*`.
    assert_error(&app.get("/metrics").await, 401, "unauthorized", &[]);
    let r = app
        .send(app.http.get(app.url("/metrics")).bearer_auth(ADMIN))
        .await;
    assert_error(&r, 403, "forbidden", &["tenant *"]);
    let r = app
        .send(app.http.get(app.url("/metrics")).bearer_auth(ROOT))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
}

#[test]
fn serving_without_keys_beyond_loopback_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_counter-gateway"))
        .args(["serve", "--listen", "0.0.0.0:0", "--data-dir"])
        .arg(dir.path())
        .env_remove("COUNTER_GATEWAY_API_KEYS")
        .env_remove("COUNTER_GATEWAY_API_KEYS_FILE")
        .env_remove("COUNTER_GATEWAY_ALLOW_UNAUTHENTICATED")
        .output()
        .expect("run the binary");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("without API keys"), "{err}");
    assert!(err.contains("--allow-unauthenticated"), "{err}");
    // Refused before any I/O: no store was created.
    assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none());
}
