//! DNS rebinding on a keyless gateway: without API keys, only loopback
//! `Host` names and addresses and `--allowed-hosts` are answered.

mod common;

use common::{assert_error, counter_path, key_line, Options, Resp, TestApp};
use reqwest::header::{AUTHORIZATION, HOST};
use serde_json::json;

/// `method path` with this `Host` (and a JSON body for a POST).
async fn with_host(app: &TestApp, method: reqwest::Method, path: &str, host: &str) -> Resp {
    let mut req = app
        .http
        .request(method.clone(), app.url(path))
        .header(HOST, host);
    if method == reqwest::Method::POST {
        req = req.json(&json!({"count": 5}));
    }
    app.send(req).await
}

const READ: &str = "/v1/counters/page/view/p1";

fn write_path() -> String {
    counter_path("page", "view", "p1", "/increment")
}

#[tokio::test]
async fn a_keyless_gateway_refuses_foreign_hosts_and_writes_nothing() {
    let app = TestApp::start().await;
    for host in ["evil.example", "attacker.com:8080"] {
        let r = with_host(&app, reqwest::Method::GET, READ, host).await;
        assert_error(&r, 421, "host_not_allowed", &[host, "--allowed-hosts"]);

        let r = with_host(&app, reqwest::Method::POST, &write_path(), host).await;
        assert_error(&r, 421, "host_not_allowed", &[host, "--allowed-hosts"]);

        let r = with_host(&app, reqwest::Method::GET, "/dashboard", host).await;
        assert_error(&r, 421, "host_not_allowed", &[host, "--allowed-hosts"]);
    }
    // Nothing was written: read back under a loopback name.
    let r = with_host(&app, reqwest::Method::GET, READ, "localhost").await;
    assert_error(&r, 404, "not_found", &[]);
}

#[tokio::test]
async fn probes_answer_any_host() {
    let app = TestApp::start().await;
    for path in ["/healthz", "/readyz"] {
        let r = with_host(&app, reqwest::Method::GET, path, "10.1.2.3:8080").await;
        assert_eq!(r.status, 200, "{path}: {}", r.text);
    }
}

#[tokio::test]
async fn loopback_hosts_are_answered() {
    let app = TestApp::start().await;
    for host in ["localhost:8080", "127.0.0.1:9", "[::1]:9", "app.localhost"] {
        let r = with_host(&app, reqwest::Method::POST, &write_path(), host).await;
        assert_eq!(r.status, 200, "{host}: {}", r.text);
        let r = with_host(&app, reqwest::Method::GET, "/dashboard", host).await;
        assert_eq!(r.status, 200, "{host}: {}", r.text);
    }
    assert_eq!(app.value("page", "view", "p1").await, Some(20));
}

#[tokio::test]
async fn allowed_hosts_are_answered_and_star_allows_any() {
    let app = TestApp::start_with(Options {
        allowed_hosts: vec!["counts.example".into()],
        ..Options::default()
    })
    .await;
    let r = with_host(
        &app,
        reqwest::Method::POST,
        &write_path(),
        "counts.example:8443",
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = with_host(&app, reqwest::Method::GET, READ, "evil.example").await;
    assert_error(&r, 421, "host_not_allowed", &["evil.example"]);

    let app = TestApp::start_with(Options {
        allowed_hosts: vec!["*".into()],
        ..Options::default()
    })
    .await;
    for host in ["evil.example", "attacker.com:8080"] {
        let r = with_host(&app, reqwest::Method::POST, &write_path(), host).await;
        assert_eq!(r.status, 200, "{host}: {}", r.text);
    }
}

#[tokio::test]
async fn a_keyed_gateway_answers_any_host() {
    let app = TestApp::start_with(Options {
        keys: key_line("admin", "*", "k-admin"),
        ..Options::default()
    })
    .await;
    for host in ["evil.example", "attacker.com:8080"] {
        let req = app
            .http
            .post(app.url(&write_path()))
            .header(HOST, host)
            .header(AUTHORIZATION, "Bearer k-admin")
            .json(&json!({"count": 1}));
        let r = app.send(req).await;
        assert_eq!(r.status, 200, "{host}: {}", r.text);
    }
}
