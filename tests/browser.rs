//! Browser ingestion: CORS preflights from an allowed and a refused origin,
//! and the headers a page on an allowed origin gets on its requests.

mod common;

use common::{counter_path, key_line, Options, TestApp};
use reqwest::Method;

async fn app() -> TestApp {
    TestApp::start_with(Options {
        keys: key_line("write", "acme", "public-write"),
        cors_origins: vec!["https://shop.example".into()],
        ..Options::default()
    })
    .await
}

fn preflight(app: &TestApp, origin: &str) -> reqwest::RequestBuilder {
    app.http
        .request(Method::OPTIONS, app.url("/v1/events"))
        .header("origin", origin)
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "authorization,content-type",
        )
}

#[tokio::test]
async fn a_preflight_from_an_allowed_origin_is_answered() {
    let app = app().await;
    let r = app.send(preflight(&app, "https://shop.example")).await;
    assert!(r.status < 300, "{} {}", r.status, r.text);
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://shop.example")
    );
    let methods = r.header("access-control-allow-methods").unwrap_or_default();
    assert!(methods.contains("POST"), "{methods}");
    let headers = r
        .header("access-control-allow-headers")
        .unwrap_or_default()
        .to_ascii_lowercase();
    assert!(
        headers.contains("authorization") && headers.contains("content-type"),
        "{headers}"
    );
}

#[tokio::test]
async fn a_preflight_from_another_origin_gets_no_allowance() {
    let app = app().await;
    for origin in ["https://evil.example", "https://shop.example.evil", "null"] {
        let r = app.send(preflight(&app, origin)).await;
        assert_eq!(r.header("access-control-allow-origin"), None, "{origin}");
    }
}

#[tokio::test]
async fn a_page_on_an_allowed_origin_counts_and_may_read_the_answer() {
    let app = app().await;
    let path = counter_path("ARTICLE", "VIEW", "a1", "/increment");
    let r = app
        .send(
            app.http
                .post(app.url(&path))
                .header("origin", "https://shop.example")
                .bearer_auth("public-write"),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://shop.example")
    );
    let r = app
        .send(
            app.http
                .post(app.url(&path))
                .header("origin", "https://evil.example")
                .bearer_auth("public-write"),
        )
        .await;
    // Counted (CORS guards reads by pages, not requests), but the page on
    // the refused origin cannot read the answer.
    assert_eq!(r.header("access-control-allow-origin"), None);
}
