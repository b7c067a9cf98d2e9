//! The tracking pixel over HTTP (a real listener): its exact bytes and
//! headers, ids that make a prefetch and an open count once, keys as the
//! API checks them, bad parameters, HEAD, and known crawlers. The
//! conformance scenario `pixel.json` plays the store-facing part on both
//! stores.

mod common;

use common::{assert_error, key_line, Options, TestApp};

/// The 1x1 transparent GIF89a, byte for byte.
const GIF: [u8; 43] = [
    0x47, 0x49, 0x46, 0x38, 0x39, 0x61, 0x01, 0x00, 0x01, 0x00, 0x80, 0x00, 0x00, 0x00, 0x00, 0x00,
    0xff, 0xff, 0xff, 0x21, 0xf9, 0x04, 0x01, 0x00, 0x00, 0x00, 0x00, 0x2c, 0x00, 0x00, 0x00, 0x00,
    0x01, 0x00, 0x01, 0x00, 0x00, 0x02, 0x02, 0x44, 0x01, 0x00, 0x3b,
];

const THUNDERBIRD: &str =
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64; rv:128.0) Gecko/20100101 Thunderbird/128.5.0";

/// A GET as a mail client sends it; answers the status, headers and bytes.
async fn fetch(app: &TestApp, path: &str) -> (u16, reqwest::header::HeaderMap, Vec<u8>) {
    let res = app
        .http
        .get(app.url(path))
        .header("user-agent", THUNDERBIRD)
        .header("accept", "image/avif,image/webp,*/*")
        .send()
        .await
        .expect("GET");
    let status = res.status().as_u16();
    let headers = res.headers().clone();
    (status, headers, res.bytes().await.expect("body").to_vec())
}

fn header<'h>(h: &'h reqwest::header::HeaderMap, name: &str) -> Option<&'h str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

#[tokio::test]
async fn the_pixel_answers_the_exact_gif_and_headers_and_counts_one() {
    let app = TestApp::start().await;
    let (status, h, body) = fetch(&app, "/v1/pixel/MAIL/open/m1?category=newsletter").await;
    assert_eq!(status, 200);
    assert_eq!(body, GIF);
    assert_eq!(header(&h, "content-type"), Some("image/gif"));
    assert_eq!(header(&h, "content-length"), Some("43"));
    assert_eq!(header(&h, "cache-control"), Some("no-store"));
    assert_eq!(
        header(&h, "cross-origin-resource-policy"),
        Some("cross-origin")
    );
    assert_eq!(header(&h, "x-counter-ignored"), None);
    // The answer came once the count was durable: it is there to read.
    let r = app.get("/v1/counters/MAIL/open/m1").await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        (r.json["value"].as_i64(), r.json["category"].as_str()),
        (Some(1), Some("newsletter"))
    );
    assert_eq!(
        app.metric("counter_gateway_flushed_increments_total").await,
        1.0
    );
}

#[tokio::test]
async fn a_prefetch_then_an_open_with_one_id_count_once() {
    let app = TestApp::start().await;
    let url = "/v1/pixel/MAIL/open/m1?id=campaign-7-recipient-42";
    for _ in 0..3 {
        let (status, _, body) = fetch(&app, url).await;
        assert_eq!((status, body.as_slice()), (200, &GIF[..]));
    }
    assert_eq!(app.value("MAIL", "open", "m1").await, Some(1));
    // Another recipient's id counts; so does every fetch without one.
    fetch(&app, "/v1/pixel/MAIL/open/m1?id=campaign-7-recipient-43").await;
    fetch(&app, "/v1/pixel/MAIL/open/m1").await;
    fetch(&app, "/v1/pixel/MAIL/open/m1").await;
    assert_eq!(app.value("MAIL", "open", "m1").await, Some(4));
    // The id is an event id like any other: an increment with it is a repeat.
    let r = app
        .post(
            "/v1/counters/MAIL/open/m1/increment",
            serde_json::json!({"id": "campaign-7-recipient-42"}),
        )
        .await;
    assert_eq!((r.status, r.json["value"].as_i64()), (200, Some(4)));
}

#[tokio::test]
async fn an_actor_with_unique_counts_each_reader_once() {
    let app = TestApp::start().await;
    // Each subscriber's open counts once, however often the mail is opened.
    for reader in ["r1", "r2", "r1", "r2", "r1"] {
        let (status, _, body) = fetch(
            &app,
            &format!("/v1/pixel/MAIL/open/m9?actor={reader}&unique=ever"),
        )
        .await;
        assert_eq!((status, body.as_slice()), (200, &GIF[..]));
    }
    assert_eq!(app.value("MAIL", "open", "m9").await, Some(2));
    assert_eq!(app.metric("counter_gateway_actor_repeats_total").await, 3.0);
    // The rules of `unique` are an increment's: no scope without an actor.
    let r = app.get("/v1/pixel/MAIL/open/m9?unique=day").await;
    assert_error(&r, 400, "invalid_request", &["actor"]);
    let r = app.get("/v1/pixel/MAIL/open/m9?actor=r3&unique=week").await;
    assert_error(&r, 400, "invalid_request", &["unique"]);
    assert_eq!(app.value("MAIL", "open", "m9").await, Some(2));
}

#[tokio::test]
async fn a_head_answers_the_headers_and_counts_nothing() {
    let app = TestApp::start().await;
    let res = app
        .http
        .head(app.url("/v1/pixel/MAIL/open/h"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 200);
    assert_eq!(header(res.headers(), "content-type"), Some("image/gif"));
    assert_eq!(header(res.headers(), "content-length"), Some("43"));
    assert!(res.bytes().await.unwrap().is_empty());
    assert_eq!(app.value("MAIL", "open", "h").await, None);
    // A bad parameter is refused on HEAD too.
    let res = app
        .http
        .head(app.url("/v1/pixel/MAIL/open/h?bogus=1"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 400);
}

#[tokio::test]
async fn with_keys_the_pixel_needs_a_write_key_as_the_api_does() {
    let keys = key_line("write", "acme", "w-key")
        + &key_line("read", "acme", "r-key")
        + &key_line("write", "other", "o-key");
    let app = TestApp::start_with(Options {
        keys,
        ..Options::default()
    })
    .await;
    let path = "/v1/pixel/MAIL/open/k";
    let r = app.get(path).await;
    assert_error(&r, 401, "unauthorized", &["API key"]);
    assert_eq!(r.header("www-authenticate"), Some("Bearer"));
    assert_error(
        &app.get(&format!("{path}?key=nope")).await,
        401,
        "unauthorized",
        &[],
    );
    assert_error(
        &app.get(&format!("{path}?key=r-key")).await,
        403,
        "forbidden",
        &["write"],
    );
    // A key bound to one tenant cannot count in another.
    let r = app.get(&format!("{path}?key=o-key&tenant=acme")).await;
    assert_error(&r, 403, "forbidden", &["tenant"]);
    let (status, _, body) = fetch(&app, &format!("{path}?key=w-key&id=r1")).await;
    assert_eq!((status, body.as_slice()), (200, &GIF[..]));
    let (status, _, _) = fetch(&app, &format!("{path}?id=r1&key=w-key")).await;
    assert_eq!(status, 200);
    // Counted once, in the key's tenant.
    let read = app
        .send(
            app.http
                .get(app.url("/v1/counters/MAIL/open/k"))
                .bearer_auth("r-key"),
        )
        .await;
    assert_eq!(
        (read.status, read.json["value"].as_i64()),
        (200, Some(1)),
        "{}",
        read.text
    );
}

#[tokio::test]
async fn bad_parameters_are_named_in_json_and_nothing_counts() {
    let app = TestApp::start().await;
    let long_id = "x".repeat(257);
    for (path, says) in [
        ("/v1/pixel/MAIL/open/b?catgory=news", "catgory"),
        ("/v1/pixel/MAIL/open/b?category=", "category"),
        ("/v1/pixel/MAIL/open/b?category=a%0Ab", "category"),
        ("/v1/pixel/MAIL/open/b?id=", "id must not be empty"),
        (
            &format!("/v1/pixel/MAIL/open/b?id={long_id}"),
            "id is 257 bytes",
        ),
        ("/v1/pixel/MAIL/open/b?id=a&id=b", "id"),
        ("/v1/pixel/MAIL/open/b?count=5", "count"),
        ("/v1/pixel/MAIL/open/b?tenant=Bad", "tenant"),
    ] {
        assert_error(&app.get(path).await, 400, "invalid_request", &[says]);
    }
    let r = app.get("/v1/pixel/MAIL/open/%01").await;
    assert_error(&r, 400, "invalid_request", &["uuid"]);
    assert_eq!(app.value("MAIL", "open", "b").await, None);
    assert_eq!(
        app.metric("counter_gateway_flushed_increments_total").await,
        0.0
    );
}

#[tokio::test]
async fn a_crawler_gets_the_image_with_202_and_counts_nothing() {
    let app = TestApp::start().await;
    let res = app
        .http
        .get(app.url("/v1/pixel/MAIL/open/c"))
        .header(
            "user-agent",
            "Mozilla/5.0 (compatible; bingbot/2.0; +http://www.bing.com/bingbot.htm)",
        )
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 202);
    assert_eq!(header(res.headers(), "x-counter-ignored"), Some("crawler"));
    assert_eq!(header(res.headers(), "cache-control"), Some("no-store"));
    assert_eq!(res.bytes().await.unwrap().as_ref(), &GIF[..]);
    assert_eq!(app.value("MAIL", "open", "c").await, None);
    // Gmail's and Yahoo's image proxies fetch for the person who opened it.
    for ua in [
        "Mozilla/5.0 (Windows NT 5.1; rv:11.0) Gecko Firefox/11.0 (via ggpht.com GoogleImageProxy)",
        "YahooMailProxy; https://help.yahoo.com/kb/yahoo-mail-proxy-SLN28749.html",
    ] {
        let r = app
            .send(
                app.http
                    .get(app.url("/v1/pixel/MAIL/open/c"))
                    .header("user-agent", ua),
            )
            .await;
        assert_eq!(r.status, 200, "{ua}");
    }
    assert_eq!(app.value("MAIL", "open", "c").await, Some(2));
    assert_eq!(
        app.metric("counter_gateway_crawler_events_ignored_total")
            .await,
        1.0
    );
}
