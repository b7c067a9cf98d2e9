//! Known crawlers left out of browser ingestion, over HTTP: which writes
//! are browser ingestion (a `text/plain` beacon, an `Origin`, a `write` key
//! with a browser's `User-Agent`) and which are server-to-server, the 202
//! answer, `--count-crawlers`, and the metric. The matcher itself is held
//! to isbot's own verdicts (`tests/fixtures/crawlers/`).
//!
//! The same behaviours run on both stores in the conformance scenario
//! `tests/conformance/scenarios/pixel.json`; what is here depends on the
//! access layer and the flag, not on the store.

mod common;

use common::{assert_error, counter_path, key_line, Options, TestApp};
use serde_json::{json, Value};

const CHROME: &str = "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36";
const GOOGLEBOT: &str = "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)";
const HEADLESS: &str = "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) HeadlessChrome/131.0.0.0 Safari/537.36";

/// Every verdict isbot gave (`scripts/refresh-isbot.sh` asked it) is ours.
#[test]
fn the_matcher_agrees_with_isbot_on_every_fixture() {
    let text = include_str!("fixtures/crawlers/isbot-verdicts.json");
    let fixture: Value = serde_json::from_str(text).unwrap();
    let list = counter_gateway::api::crawlers::list().unwrap();
    assert_eq!(
        list.name(),
        format!("isbot {}", fixture["isbot"].as_str().unwrap()),
        "the verdicts come from the vendored version"
    );
    let verdicts = fixture["verdicts"].as_array().unwrap();
    assert!(verdicts.len() > 50);
    let (mut crawlers, mut others) = (0, 0);
    for v in verdicts {
        let ua = v["ua"].as_str().unwrap();
        let isbot = v["crawler"].as_bool().unwrap();
        // The two mail proxies and GitHub's image proxy are the gateway's
        // own exceptions (see `READERS` in src/api/crawlers.rs): isbot
        // lists them.
        let reader = ua.contains("GoogleImageProxy")
            || ua.contains("YahooMailProxy")
            || ua.contains("github-camo");
        assert_eq!(
            list.is_crawler(ua.as_bytes()),
            isbot && !reader,
            "{ua}: isbot says {isbot}"
        );
        if isbot {
            crawlers += 1
        } else {
            others += 1
        }
    }
    assert!(crawlers > 20 && others > 15, "{crawlers} {others}");
}

fn events(n: usize, uuid: &str) -> String {
    let one = json!({"entity": "ARTICLE", "action": "VIEW", "uuid": uuid});
    json!({"events": vec![one; n]}).to_string()
}

/// `POST /v1/events` with these headers and a `text/plain` body when `beacon`.
async fn post_events(
    app: &TestApp,
    headers: &[(&str, &str)],
    body: String,
    beacon: bool,
) -> common::Resp {
    let ct = if beacon {
        "text/plain;charset=UTF-8"
    } else {
        "application/json"
    };
    let mut req = app
        .http
        .post(app.url("/v1/events"))
        .header("content-type", ct)
        .body(body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    app.send(req).await
}

/// A counter's value read with the admin key `a`; `None` on 404.
async fn value_with_key(app: &TestApp, uuid: &str) -> Option<i64> {
    let r = app
        .get(&format!(
            "{}?key=a",
            counter_path("ARTICLE", "VIEW", uuid, "")
        ))
        .await;
    match r.status {
        200 => r.json["value"].as_i64(),
        404 => None,
        s => panic!("GET counter answered {s}: {}", r.text),
    }
}

fn assert_ignored(r: &common::Resp, events: u64) {
    assert_eq!(r.status, 202, "{}", r.text);
    assert_eq!(r.header("x-counter-ignored"), Some("crawler"));
    assert_eq!(
        r.json,
        json!({"accepted": 0, "duplicates": 0, "ignored": events})
    );
}

#[tokio::test]
async fn a_crawler_beacon_is_ignored_and_a_browser_beacon_counted() {
    let app = TestApp::start().await;
    let r = post_events(&app, &[("user-agent", GOOGLEBOT)], events(3, "a1"), true).await;
    assert_ignored(&r, 3);
    assert_eq!(app.value("ARTICLE", "VIEW", "a1").await, None);
    let r = post_events(&app, &[("user-agent", CHROME)], events(2, "a1"), true).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.header("x-counter-ignored"), None);
    assert_eq!(r.json, json!({"accepted": 2, "duplicates": 0}));
    assert_eq!(app.value("ARTICLE", "VIEW", "a1").await, Some(2));
    // Without a User-Agent nothing says crawler: counted (as isbot does).
    let r = post_events(&app, &[], events(1, "a1"), true).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(app.value("ARTICLE", "VIEW", "a1").await, Some(3));
    assert_eq!(
        app.metric("counter_gateway_crawler_events_ignored_total")
            .await,
        3.0
    );
    // The 202 is a status of its own in the request counts.
    assert_eq!(
        app.metric(
            "counter_gateway_http_requests_total{route=\"/v1/events\",method=\"POST\",status=\"202\"}"
        )
        .await,
        1.0
    );
}

#[tokio::test]
async fn a_crawler_batch_with_a_bad_event_is_refused_not_ignored() {
    let app = TestApp::start().await;
    let body = json!({"events": [{"entity": "A", "action": "B", "uuid": ""}]}).to_string();
    let r = post_events(&app, &[("user-agent", GOOGLEBOT)], body, true).await;
    assert_error(&r, 400, "invalid_events", &[]);
    assert_eq!(
        app.metric("counter_gateway_crawler_events_ignored_total")
            .await,
        0.0
    );
}

/// Whatever its `User-Agent`, a write without a browser's mark counts: a
/// back end must never lose counts to the name its HTTP library goes by.
#[tokio::test]
async fn server_to_server_writes_with_a_crawler_user_agent_still_count() {
    let keys = key_line("write", "*", "w") + &key_line("admin", "*", "a");
    let app = TestApp::start_with(Options {
        keys,
        ..Options::default()
    })
    .await;
    let inc = counter_path("ARTICLE", "VIEW", "s", "/increment");
    let cases: [(&str, &str); 5] = [
        // A library's name, which isbot lists, with the page's write key.
        ("curl/8.5.0", "w"),
        ("python-requests/2.32.3", "w"),
        ("node", "w"),
        // A browser-like crawler's, but with an admin key: a back end.
        (GOOGLEBOT, "a"),
        (HEADLESS, "a"),
    ];
    for (n, (ua, key)) in cases.iter().enumerate() {
        let r = app
            .send(
                app.http
                    .post(app.url(&inc))
                    .bearer_auth(key)
                    .header("user-agent", *ua)
                    .json(&json!({"count": 1})),
            )
            .await;
        assert_eq!(r.status, 200, "{ua}: {}", r.text);
        assert_eq!(r.json["counted"], true, "{ua}");
        assert_eq!(value_with_key(&app, "s").await, Some(n as i64 + 1), "{ua}");
        let r = post_events(
            &app,
            &[
                ("user-agent", ua),
                ("authorization", &format!("Bearer {key}")),
            ],
            events(1, "s2"),
            false,
        )
        .await;
        assert_eq!(r.status, 200, "{ua}: {}", r.text);
        assert_eq!(r.json.get("ignored"), None);
    }
    assert_eq!(value_with_key(&app, "s2").await, Some(5));
}

/// Each browser's mark alone makes a crawler's write browser ingestion.
#[tokio::test]
async fn each_browser_mark_leaves_a_crawler_out() {
    let keys = key_line("write", "*", "w") + &key_line("admin", "*", "a");
    let app = TestApp::start_with(Options {
        keys,
        ..Options::default()
    })
    .await;
    let inc = app.url(&counter_path("ARTICLE", "VIEW", "m", "/increment"));
    let dec = app.url(&counter_path("ARTICLE", "VIEW", "m", "/decrement"));
    // A write key and a browser-like crawler's User-Agent (a rendering
    // crawler running the page's fetch).
    let r = app
        .send(
            app.http
                .post(&inc)
                .bearer_auth("w")
                .header("user-agent", GOOGLEBOT)
                .json(&json!({"count": 5})),
        )
        .await;
    assert_ignored(&r, 1);
    // The key may come as `?key=`, as a beacon sends it.
    let r = app
        .send(
            app.http
                .post(format!("{dec}?key=w"))
                .header("user-agent", HEADLESS),
        )
        .await;
    assert_ignored(&r, 1);
    // An Origin header, even with an admin key.
    let r = app
        .send(
            app.http
                .post(&inc)
                .bearer_auth("a")
                .header("origin", "https://shop.example")
                .header("user-agent", "curl/8.5.0"),
        )
        .await;
    assert_ignored(&r, 1);
    // A text/plain body, even with an admin key and a library's name.
    let r = app
        .send(
            app.http
                .post(&inc)
                .bearer_auth("a")
                .header("content-type", "text/plain")
                .header("user-agent", "Wget/1.21.4")
                .body("{\"count\": 2}"),
        )
        .await;
    assert_ignored(&r, 1);
    assert_eq!(value_with_key(&app, "m").await, None);
    // The same marks from a browser count.
    let r = app
        .send(
            app.http
                .post(&inc)
                .bearer_auth("w")
                .header("origin", "https://shop.example")
                .header("content-type", "text/plain")
                .header("user-agent", CHROME)
                .body("{\"count\": 2}"),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    // A write key learns that it counted, not the value.
    assert_eq!(r.json["counted"], true, "{}", r.text);
    assert_eq!(value_with_key(&app, "m").await, Some(2));
    let metrics = app.get("/metrics?key=a").await.text;
    assert_eq!(
        common::metric_in(&metrics, "counter_gateway_crawler_events_ignored_total"),
        Some(4.0)
    );
}

#[tokio::test]
async fn with_count_crawlers_crawlers_count() {
    let app = TestApp::start_with(Options {
        count_crawlers: true,
        ..Options::default()
    })
    .await;
    let r = post_events(&app, &[("user-agent", GOOGLEBOT)], events(2, "c"), true).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json, json!({"accepted": 2, "duplicates": 0}));
    let r = app
        .send(
            app.http
                .get(app.url("/v1/pixel/ARTICLE/VIEW/c"))
                .header("user-agent", GOOGLEBOT),
        )
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-counter-ignored"), None);
    assert_eq!(app.value("ARTICLE", "VIEW", "c").await, Some(3));
    assert_eq!(
        app.metric("counter_gateway_crawler_events_ignored_total")
            .await,
        0.0
    );
}

#[test]
fn the_flag_is_long_and_env() {
    use clap::Parser;
    use counter_gateway::config::{Cli, Command};
    let serve = |args: &[&str]| match Cli::try_parse_from(args).unwrap().command {
        Command::Serve(a) => a.count_crawlers,
        _ => unreachable!("a serve command line"),
    };
    assert!(!serve(&["counter-gateway", "serve"]));
    assert!(serve(&["counter-gateway", "serve", "--count-crawlers"]));
    let help = Cli::try_parse_from(["counter-gateway", "serve", "--help"])
        .unwrap_err()
        .to_string();
    assert!(help.contains("COUNTER_GATEWAY_COUNT_CRAWLERS"), "{help}");
}
