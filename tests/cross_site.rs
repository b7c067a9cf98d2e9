//! Cross-site writes on a keyless gateway: a page of another site (as the
//! browser says with `Origin`, `Referer` or `Sec-Fetch-Site`) may not count,
//! delete or backfill on it, by any of the write paths; loopback pages,
//! `--allowed-hosts`, `--cors-origins` and clients that are not browsers may.

mod common;

use common::{assert_error, counter_path, key_line, Options, Resp, TestApp};
use reqwest::Method;
use serde_json::json;

/// The write paths, each as a request of `app` with `headers`.
#[derive(Clone, Copy, Debug)]
enum Write {
    Single,
    Decrement,
    Beacon,
    Batch,
    Pixel,
    Backfill,
    Delete,
}

const WRITES: [Write; 7] = [
    Write::Single,
    Write::Decrement,
    Write::Beacon,
    Write::Batch,
    Write::Pixel,
    Write::Backfill,
    Write::Delete,
];

async fn write(app: &TestApp, what: Write, headers: &[(&str, &str)]) -> Resp {
    let http = &app.http;
    let mut req = match what {
        Write::Single => http
            .post(app.url(&counter_path("V", "VIEW", "v1", "/increment")))
            .json(&json!({"count": 1})),
        Write::Decrement => http
            .post(app.url(&counter_path("V", "VIEW", "v1", "/decrement")))
            .json(&json!({"count": 1})),
        Write::Beacon => http
            .post(app.url("/v1/events"))
            .header("content-type", "text/plain;charset=UTF-8")
            .body(r#"{"events": [{"entity": "V", "action": "VIEW", "uuid": "v1"}]}"#),
        Write::Batch => http
            .post(app.url("/v1/events"))
            .json(&json!({"events": [{"entity": "V", "action": "VIEW", "uuid": "v1"}]})),
        Write::Pixel => http.get(app.url("/v1/pixel/V/VIEW/v1")),
        Write::Backfill => http
            .put(app.url("/v1/counters/V/VIEW/v1/days/2026-01-02"))
            .json(&json!({"value": 7})),
        Write::Delete => http.delete(app.url("/v1/counters/V/VIEW/v1")),
    };
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    app.send(req).await
}

/// What a page of another site sends, by each of the three headers.
const FOREIGN: [(&[(&str, &str)], &str); 5] = [
    (&[("origin", "https://evil.example")], "Origin"),
    (&[("origin", "null")], "Origin"),
    (&[("referer", "https://evil.example/post.html")], "Referer"),
    (&[("sec-fetch-site", "cross-site")], "Sec-Fetch-Site"),
    (
        &[
            ("origin", "https://evil.example"),
            ("sec-fetch-site", "same-origin"),
        ],
        "Origin",
    ),
];

#[tokio::test]
async fn a_keyless_gateway_refuses_every_write_of_another_site_and_writes_nothing() {
    let app = TestApp::start().await;
    app.increment("V", "VIEW", "v1", json!({"count": 3})).await;
    for (headers, named) in FOREIGN {
        for what in WRITES {
            let r = write(&app, what, headers).await;
            assert_error(
                &r,
                403,
                "cross_site_write",
                &[named, "--allowed-hosts", "nothing was written"],
            );
        }
    }
    // Not counted, decremented, backfilled (which moves the value) nor deleted.
    assert_eq!(app.value("V", "VIEW", "v1").await, Some(3));
}

#[tokio::test]
async fn loopback_pages_and_clients_without_browser_headers_write() {
    let app = TestApp::start().await;
    let local: [&[(&str, &str)]; 5] = [
        &[],
        &[
            ("origin", "http://localhost:3000"),
            ("sec-fetch-site", "same-site"),
        ],
        &[("referer", "http://127.0.0.1:5173/index.html")],
        // A page on 127.0.0.1 writing to localhost: cross-site to the
        // browser, but its origin is loopback.
        &[
            ("origin", "http://127.0.0.1:3000"),
            ("sec-fetch-site", "cross-site"),
        ],
        &[("sec-fetch-site", "none")],
    ];
    let counting = [Write::Single, Write::Beacon, Write::Batch, Write::Pixel];
    for headers in local {
        for what in counting {
            let r = write(&app, what, headers).await;
            assert_eq!(r.status, 200, "{what:?} {headers:?}: {}", r.text);
        }
    }
    assert_eq!(app.value("V", "VIEW", "v1").await, Some(20));
    let r = write(&app, Write::Delete, &[("origin", "http://localhost:3000")]).await;
    assert_eq!(r.status, 200, "{}", r.text);
}

#[tokio::test]
async fn reads_and_a_head_of_the_pixel_are_not_writes() {
    let app = TestApp::start().await;
    app.increment("V", "VIEW", "v1", json!({})).await;
    let cross = |req: reqwest::RequestBuilder| {
        req.header("origin", "https://evil.example")
            .header("sec-fetch-site", "cross-site")
    };
    let r = app
        .send(cross(app.http.get(app.url("/v1/counters/V/VIEW/v1"))))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = app
        .send(cross(app.http.post(app.url("/v1/counters/get")).json(
            &json!({"keys": [{"entity": "V", "action": "VIEW", "uuid": "v1"}]}),
        )))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = app
        .send(cross(
            app.http
                .request(Method::HEAD, app.url("/v1/pixel/V/VIEW/v1")),
        ))
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(app.value("V", "VIEW", "v1").await, Some(1));
}

#[tokio::test]
async fn allowed_hosts_and_cors_origins_may_write() {
    let app = TestApp::start_with(Options {
        allowed_hosts: vec!["counts.example".into()],
        cors_origins: vec!["https://shop.example".into()],
        ..Options::default()
    })
    .await;
    // `Host` stays loopback: only the page's origin is at stake here.
    let pages: [&[(&str, &str)]; 3] = [
        &[
            ("origin", "https://counts.example:8443"),
            ("sec-fetch-site", "cross-site"),
        ],
        &[
            ("origin", "https://shop.example"),
            ("sec-fetch-site", "cross-site"),
        ],
        &[("referer", "https://shop.example/cart")],
    ];
    for headers in pages {
        for what in [Write::Beacon, Write::Pixel] {
            let r = write(&app, what, headers).await;
            assert_eq!(r.status, 200, "{what:?} {headers:?}: {}", r.text);
        }
    }
    // The CORS origin is matched whole: scheme and port included.
    for origin in ["http://shop.example", "https://shop.example:8443"] {
        let r = write(&app, Write::Beacon, &[("origin", origin)]).await;
        assert_error(&r, 403, "cross_site_write", &[origin]);
    }
    assert_eq!(app.value("V", "VIEW", "v1").await, Some(6));

    // `--cors-origins *` lets any page read, not write.
    let app = TestApp::start_with(Options {
        cors_origins: vec!["*".into()],
        ..Options::default()
    })
    .await;
    let r = write(&app, Write::Beacon, &[("origin", "https://evil.example")]).await;
    assert_error(&r, 403, "cross_site_write", &["evil.example"]);
    // `--allowed-hosts *`: any page, any host.
    let app = TestApp::start_with(Options {
        allowed_hosts: vec!["*".into()],
        ..Options::default()
    })
    .await;
    let r = write(&app, Write::Beacon, &[("origin", "https://evil.example")]).await;
    assert_eq!(r.status, 200, "{}", r.text);
}

#[tokio::test]
async fn with_keys_the_key_decides() {
    let app = TestApp::start_with(Options {
        keys: key_line("write", "*", "k-write"),
        ..Options::default()
    })
    .await;
    let r = app
        .send(
            app.http
                .get(app.url("/v1/pixel/V/VIEW/v1?key=k-write"))
                .header("referer", "https://evil.example/")
                .header("sec-fetch-site", "cross-site"),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = write(
        &app,
        Write::Beacon,
        &[
            ("origin", "https://evil.example"),
            ("authorization", "Bearer k-write"),
        ],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = write(&app, Write::Beacon, &[("origin", "https://evil.example")]).await;
    assert_error(&r, 401, "unauthorized", &[]);
}
