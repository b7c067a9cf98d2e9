//! The multi-read over HTTP on the embedded store: `POST /v1/counters/get`
//! and its cacheable `GET /v1/counters?keys=` form (order, missing keys,
//! bounds, bad keys named, ETag and 304, Cache-Control, the `public` role
//! and its CORS answer).

mod common;

use std::ops::Deref;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use common::{assert_error, encode, key_line, Options, Resp, TestApp};
use counter_gateway::domain::{Counter, CounterKey};
use counter_gateway::store::{Store, StoreError};
use serde_json::{json, Value};

/// The store, with its multi-reads counted: a refused request must have
/// read nothing. Every other method reaches the store through `Deref`
/// (an inherent method wins over the trait's), so new `Store` methods need
/// nothing here.
struct Counting {
    store: Arc<dyn Store>,
    reads: Arc<AtomicUsize>,
}

impl Deref for Counting {
    type Target = dyn Store;
    fn deref(&self) -> &dyn Store {
        &*self.store
    }
}

impl Counting {
    async fn get_many(&self, keys: &[CounterKey]) -> Result<Vec<Option<Counter>>, StoreError> {
        self.reads.fetch_add(1, SeqCst);
        self.store.get_many(keys).await
    }
}

struct Counted {
    inner: Counting,
}

store_wrapper!(Counted, |self, batch| { self.inner.apply(batch).await });

async fn counted(options: Options) -> (TestApp, Arc<AtomicUsize>) {
    let reads = Arc::new(AtomicUsize::new(0));
    let r = reads.clone();
    let app = TestApp::start_wrapped(options, move |store| {
        Arc::new(Counted {
            inner: Counting { store, reads: r },
        })
    })
    .await;
    (app, reads)
}

fn k(e: &str, a: &str, u: &str) -> Value {
    json!({"entity": e, "action": a, "uuid": u})
}

/// `keys=` of the GET form for `(entity, action, uuid)` triples.
fn keys_param(keys: &[(&str, &str, &str)]) -> String {
    keys.iter()
        .map(|(e, a, u)| format!("{}/{}/{}", encode(e), encode(a), encode(u)))
        .collect::<Vec<_>>()
        .join(",")
}

async fn count(app: &TestApp, e: &str, a: &str, u: &str, body: Value) {
    let r = app.increment(e, a, u, body).await;
    assert_eq!(r.status, 200, "{}", r.text);
}

fn values(r: &Resp) -> Vec<(String, bool, i64)> {
    r.json["counters"]
        .as_array()
        .unwrap_or_else(|| panic!("no counters in {}", r.text))
        .iter()
        .map(|c| {
            (
                c["uuid"].as_str().unwrap().to_string(),
                c["found"].as_bool().unwrap(),
                c["value"].as_i64().unwrap(),
            )
        })
        .collect()
}

#[tokio::test]
async fn every_key_is_answered_in_the_order_asked_missing_ones_as_zero() {
    let (app, reads) = counted(Options::default()).await;
    count(&app, "VIDEO", "VIEW", "b", json!({"count": 2})).await;
    count(
        &app,
        "VIDEO",
        "VIEW",
        "a",
        json!({"count": 5, "category": "news"}),
    )
    .await;
    count(&app, "VIDEO", "like", "a_1/x,y", json!({})).await;

    let asked = [
        ("VIDEO", "VIEW", "b"),
        ("VIDEO", "VIEW", "never"),
        ("VIDEO", "VIEW", "a"),
        ("VIDEO", "like", "a_1/x,y"),
        ("VIDEO", "VIEW", "b"),
    ];
    let body = json!({"keys": asked.iter().map(|(e, a, u)| k(e, a, u)).collect::<Vec<_>>()});
    let r = app.post("/v1/counters/get", body).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(
        values(&r),
        [
            ("b".into(), true, 2),
            ("never".into(), false, 0),
            ("a".into(), true, 5),
            ("a_1/x,y".into(), true, 1),
            ("b".into(), true, 2),
        ]
    );
    let got = &r.json["counters"];
    // A found counter is answered as the single GET answers it, plus `found`.
    let single = app.get("/v1/counters/VIDEO/VIEW/a").await.json;
    let mut a = got[2].clone();
    assert_eq!(
        a.as_object_mut().unwrap().remove("found"),
        Some(json!(true))
    );
    assert_eq!(a, single);
    assert_eq!(got[3]["id"], "VIDEO_like_a%5F1/x,y");
    assert_eq!(
        got[1],
        json!({"id": "VIDEO_VIEW_never", "entity": "VIDEO", "action": "VIEW", "uuid": "never", "found": false, "value": 0})
    );
    assert_eq!(reads.load(SeqCst), 1, "one read for all keys");

    // The GET form answers the same bytes; `/` and `,` inside a part are encoded.
    let g = app
        .get(&format!("/v1/counters?keys={}", keys_param(&asked)))
        .await;
    assert_eq!(g.status, 200, "{}", g.text);
    assert_eq!(g.text, r.text);

    let empty = app.post("/v1/counters/get", json!({"keys": []})).await;
    assert_eq!(empty.status, 200, "{}", empty.text);
    assert_eq!(empty.json, json!({"counters": []}));
    assert_eq!(
        app.get("/v1/counters?keys=").await.json,
        json!({"counters": []})
    );
}

#[tokio::test]
async fn more_than_1000_keys_are_refused_and_nothing_is_read() {
    let (app, reads) = counted(Options::default()).await;
    count(&app, "A", "V", "u7", json!({"count": 7})).await;
    let keys = |n: usize| -> Value {
        json!({"keys": (0..n).map(|i| k("A", "V", &format!("u{i}"))).collect::<Vec<_>>()})
    };
    let r = app.post("/v1/counters/get", keys(1_001)).await;
    assert_error(&r, 400, "invalid_request", &["1001 keys", "limit of 1000"]);
    assert_eq!(reads.load(SeqCst), 0);

    let r = app.post("/v1/counters/get", keys(1_000)).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let v = values(&r);
    assert_eq!(v.len(), 1_000);
    assert_eq!(v[7], ("u7".into(), true, 7));
    assert_eq!(v.iter().filter(|(_, found, _)| *found).count(), 1);
    assert_eq!(reads.load(SeqCst), 1);

    // The GET form is bounded lower, for URLs that proxies and CDNs take.
    let many: Vec<(&str, &str, &str)> = vec![("A", "V", "u7"); 101];
    let r = app
        .get(&format!("/v1/counters?keys={}", keys_param(&many)))
        .await;
    assert_error(
        &r,
        400,
        "invalid_request",
        &["101 keys", "limit of 100", "POST"],
    );
    let r = app
        .get(&format!("/v1/counters?keys={}", keys_param(&many[..100])))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(values(&r).len(), 100);
    assert_eq!(reads.load(SeqCst), 2);
}

#[tokio::test]
async fn a_malformed_key_is_refused_naming_its_index_and_field() {
    let (app, reads) = counted(Options::default()).await;
    let good = k("A", "V", "x");
    for (body, says) in [
        (
            json!({"keys": [good, k("A", "V", "")]}),
            "keys[1].uuid must not be empty",
        ),
        (
            json!({"keys": [good, good, k("A\u{7}", "V", "x")]}),
            "keys[2].entity contains the control character U+0007",
        ),
        (
            json!({"keys": [good, {"entity": "A", "action": "V"}]}),
            "keys[1]: missing field `uuid`",
        ),
        (
            json!({"keys": [good, {"entity": "A", "action": "V", "uuid": "x", "count": 1}]}),
            "keys[1].count: unknown field `count`",
        ),
        (
            json!({"keys": [good, {"entity": "A", "action": 3, "uuid": "x"}]}),
            "keys[1].action: invalid type",
        ),
        (
            json!({"keys": [["A", "V", "x"]]}),
            "keys[0]: invalid type: sequence, expected a JSON object",
        ),
        (
            json!({"keys": [good, k("A", &"v".repeat(513), "x")]}),
            "keys[1].action is 513 bytes",
        ),
        (
            json!({"keys": [k("A", &"v".repeat(300), &"u".repeat(300))]}),
            "keys[0]: the document id of this counter would be 603 bytes",
        ),
        (json!({"keys": "A/V/x"}), "keys: invalid type"),
        (json!({"key": [good]}), "unknown field `key`"),
        (json!({}), "missing field `keys`"),
    ] {
        let r = app.post("/v1/counters/get", body.clone()).await;
        assert_error(&r, 400, "invalid_request", &[says]);
    }
    let r = app
        .post_raw("/v1/counters/get", Some("application/json"), "")
        .await;
    assert_error(&r, 400, "invalid_request", &["body is empty"]);
    let r = app
        .post_raw("/v1/counters/get", Some("application/xml"), "<a/>")
        .await;
    assert_error(&r, 415, "unsupported_media_type", &[]);

    for (query, says) in [
        ("keys=A/V/x,A/V", "keys[1] has 2 part(s)"),
        ("keys=A/V/x,A/V/x/y", "keys[1] has 4 part(s)"),
        ("keys=A/V/x,,A/V/y", "keys[1] has 1 part(s)"),
        ("keys=A/V/x,A/V/", "keys[1].uuid must not be empty"),
        (
            "keys=A/V/x,A%00/V/x",
            "keys[1].entity contains the control character U+0000",
        ),
        ("keys=A/V/%C3", "keys[0].uuid is not UTF-8"),
        ("keys=A/V/x&keys=A/V/y", "keys is given twice"),
        (
            "keys=A/V/x&interval=all",
            "unknown query parameter \"interval\"",
        ),
        ("", "keys is required"),
    ] {
        let r = app.get(&format!("/v1/counters?{query}")).await;
        assert_error(&r, 400, "invalid_request", &[says]);
    }
    assert_eq!(reads.load(SeqCst), 0, "no refused request read anything");
}

#[tokio::test]
async fn an_etag_round_trip_gives_304_and_a_change_gives_a_new_etag_and_200() {
    let app = TestApp::start().await;
    count(&app, "ARTICLE", "VIEW", "a1", json!({"count": 3})).await;
    let url = "/v1/counters?keys=ARTICLE/VIEW/a1,ARTICLE/VIEW/a2";
    let first = app.get(url).await;
    assert_eq!(first.status, 200, "{}", first.text);
    let tag = first.header("etag").expect("an ETag").to_string();
    assert!(tag.starts_with('"') && tag.ends_with('"'), "strong: {tag}");
    assert_eq!(
        app.get(url).await.header("etag"),
        Some(tag.as_str()),
        "stable"
    );

    let with = |inm: &str| {
        app.http
            .get(app.url(url))
            .header("if-none-match", inm.to_string())
    };
    for inm in [
        tag.clone(),
        format!("W/{tag}"),
        format!("\"other\", {tag}"),
        "*".to_string(),
    ] {
        let r = app.send(with(&inm)).await;
        assert_eq!(r.status, 304, "If-None-Match: {inm}: {}", r.text);
        assert_eq!(r.text, "", "a 304 has no body");
        assert_eq!(r.header("etag"), Some(tag.as_str()));
        assert_eq!(r.header("cache-control"), Some("no-cache"));
        assert_eq!(r.header("vary"), Some("authorization, x-tenant"));
    }
    let r = app.send(with("\"other\"")).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.text, first.text);
    assert_eq!(
        app.metric("counter_gateway_http_requests_total{route=\"/v1/counters\",method=\"GET\",status=\"304\"}")
            .await,
        4.0,
        "304s are counted as such, under the route"
    );

    // A missing key that gets counted changes the answer, so its tag.
    count(&app, "ARTICLE", "VIEW", "a2", json!({})).await;
    let r = app.send(with(&tag)).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(values(&r), [("a1".into(), true, 3), ("a2".into(), true, 1)]);
    let second = r.header("etag").expect("an ETag").to_string();
    assert_ne!(second, tag);
    assert_eq!(app.send(with(&second)).await.status, 304);

    // A touch without a change of value moves `recorded_timestamp`: the
    // bytes change, so the strong tag does (after the clock moved).
    app.options.clock.advance(chrono::Duration::seconds(5));
    count(&app, "ARTICLE", "VIEW", "a1", json!({"count": 0})).await;
    let r = app.send(with(&second)).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_ne!(r.header("etag"), Some(second.as_str()));

    // Another order is another answer.
    let swapped = app
        .get("/v1/counters?keys=ARTICLE/VIEW/a2,ARTICLE/VIEW/a1")
        .await;
    assert_ne!(swapped.header("etag"), r.header("etag"));
}

#[tokio::test]
async fn cache_control_follows_the_flag() {
    let url = "/v1/counters?keys=A/V/x";
    let off = TestApp::start().await;
    let r = off.get(url).await;
    assert_eq!(r.header("cache-control"), Some("no-cache"));
    // The POST form is not for caches: it carries no validator.
    let p = off
        .post("/v1/counters/get", json!({"keys": [k("A", "V", "x")]}))
        .await;
    assert_eq!(p.status, 200, "{}", p.text);
    assert_eq!(p.header("etag"), None);
    assert_eq!(p.header("cache-control"), None);

    let on = TestApp::start_with(Options {
        counters_max_age: Some(Duration::from_secs(30)),
        ..Options::default()
    })
    .await;
    let r = on.get(url).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.header("cache-control"), Some("public, max-age=30"));
    let tag = r.header("etag").unwrap().to_string();
    let not_modified = on
        .send(on.http.get(on.url(url)).header("if-none-match", tag))
        .await;
    assert_eq!(not_modified.status, 304);
    assert_eq!(
        not_modified.header("cache-control"),
        Some("public, max-age=30")
    );
}

/// `public` lets a shared cache keep an answer to a request that carried
/// `Authorization`, and many CDNs ignore `Vary`: only answers any page may
/// have (a `public` key's, a keyless gateway's) are `public`; a `read` or
/// `admin` key's are `private`, kept by the browser alone. On a 304 too.
#[tokio::test]
async fn only_public_keys_and_keyless_gateways_get_public_cache_control() {
    let url = "/v1/counters?keys=A/V/x";
    let keys = key_line("public", "*", "pub")
        + &key_line("read", "*", "rd")
        + &key_line("admin", "*", "adm")
        + &key_line("write", "*", "wr");
    let app = TestApp::start_with(Options {
        keys,
        counters_max_age: Some(Duration::from_secs(30)),
        ..Options::default()
    })
    .await;
    for (key, expected) in [
        ("pub", "public, max-age=30"),
        ("rd", "private, max-age=30"),
        ("adm", "private, max-age=30"),
    ] {
        for in_url in [false, true] {
            let req = if in_url {
                app.http.get(app.url(&format!("{url}&key={key}")))
            } else {
                app.http.get(app.url(url)).bearer_auth(key)
            };
            let r = app.send(req).await;
            assert_eq!(r.status, 200, "{key}: {}", r.text);
            assert_eq!(r.header("cache-control"), Some(expected), "{key}");
            let tag = r.header("etag").unwrap().to_string();
            let again = app
                .send(
                    app.http
                        .get(app.url(url))
                        .bearer_auth(key)
                        .header("if-none-match", tag),
                )
                .await;
            assert_eq!(again.status, 304, "{key}");
            assert_eq!(again.header("cache-control"), Some(expected), "{key}");
        }
    }
    // A write key reads nothing, so it has no answer to cache.
    let r = app.send(app.http.get(app.url(url)).bearer_auth("wr")).await;
    assert_error(&r, 403, "forbidden", &[]);
    assert_eq!(r.header("cache-control"), None);

    let keyless = TestApp::start_with(Options {
        counters_max_age: Some(Duration::from_secs(30)),
        ..Options::default()
    })
    .await;
    let r = keyless.get(url).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.header("cache-control"), Some("public, max-age=30"));
}

#[tokio::test]
async fn a_public_key_reads_counters_by_key_only_and_any_page_may_read_the_answer() {
    let keys = key_line("public", "acme", "pub")
        + &key_line("read", "acme", "rd")
        + &key_line("write", "acme", "wr");
    let app = TestApp::start_with(Options {
        keys,
        ..Options::default()
    })
    .await;
    let r = app
        .send(
            app.http
                .post(app.url("/v1/counters/VIDEO/VIEW/v1/increment"))
                .bearer_auth("wr"),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);

    // The key in the URL: a simple cross-origin GET, no preflight.
    let url = "/v1/counters?keys=VIDEO/VIEW/v1&key=pub";
    let r = app
        .send(
            app.http
                .get(app.url(url))
                .header("origin", "https://blog.example"),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(values(&r), [("v1".into(), true, 1)]);
    assert_eq!(r.header("access-control-allow-origin"), Some("*"));
    let exposed = r
        .header("access-control-expose-headers")
        .unwrap_or_default();
    assert!(exposed.contains("etag"), "{exposed}");
    let tag = r.header("etag").unwrap().to_string();
    let r = app
        .send(app.http.get(app.url(url)).header("if-none-match", tag))
        .await;
    assert_eq!(r.status, 304);
    assert_eq!(r.header("access-control-allow-origin"), Some("*"));
    let r = app
        .send(
            app.http
                .post(app.url("/v1/counters/get?key=pub"))
                .header("content-type", "text/plain")
                .body(json!({"keys": [k("VIDEO", "VIEW", "v1")]}).to_string()),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.header("access-control-allow-origin"), Some("*"));

    // Nothing else: no single counter, no list that would reveal keys.
    for path in [
        "/v1/counters/VIDEO/VIEW/v1",
        "/v1/targets/VIDEO/v1/counters",
        "/v1/top/VIDEO/VIEW",
        "/v1/reports/stale",
        "/v1/counters/VIDEO/VIEW/v1/histogram",
    ] {
        let r = app
            .send(app.http.get(app.url(path)).bearer_auth("pub"))
            .await;
        assert_error(&r, 403, "forbidden", &["public key"]);
    }
    let r = app
        .send(
            app.http
                .post(app.url("/v1/counters/VIDEO/VIEW/v1/increment"))
                .bearer_auth("pub"),
        )
        .await;
    assert_error(&r, 403, "forbidden", &["public key"]);

    // A read key may multi-read too, but its answers are not for any page.
    let r = app
        .send(
            app.http
                .get(app.url("/v1/counters?keys=VIDEO/VIEW/v1"))
                .bearer_auth("rd")
                .header("origin", "https://blog.example"),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.header("access-control-allow-origin"), None);
    // A write key may not read.
    let r = app
        .send(
            app.http
                .get(app.url("/v1/counters?keys=VIDEO/VIEW/v1"))
                .bearer_auth("wr"),
        )
        .await;
    assert_error(
        &r,
        403,
        "forbidden",
        &["write key", "needs a public or read key"],
    );
    let r = app.get("/v1/counters?keys=VIDEO/VIEW/v1").await;
    assert_error(&r, 401, "unauthorized", &[]);
    // The public key is bound to its tenant like any other.
    let r = app
        .get("/v1/counters?keys=VIDEO/VIEW/v1&key=pub&tenant=other")
        .await;
    assert_error(&r, 403, "forbidden", &["another tenant"]);
}

/// With `--cors-origins`, an allowed origin is echoed (the CORS layer's
/// answer) and the ETag is still exposed to the page.
#[tokio::test]
async fn allowed_origins_see_the_etag_of_a_public_answer() {
    let app = TestApp::start_with(Options {
        keys: key_line("public", "*", "pub"),
        cors_origins: vec!["https://shop.example".into()],
        ..Options::default()
    })
    .await;
    let r = app
        .send(
            app.http
                .get(app.url("/v1/counters?keys=A/V/x&key=pub"))
                .header("origin", "https://shop.example"),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://shop.example")
    );
    let exposed = r
        .header("access-control-expose-headers")
        .unwrap_or_default();
    assert!(exposed.contains("etag"), "{exposed}");
    let vary: Vec<&str> = r
        .headers
        .get_all("vary")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    assert!(vary.iter().any(|v| v.contains("x-tenant")), "{vary:?}");
    assert!(vary.iter().any(|v| v.contains("origin")), "{vary:?}");
}

#[tokio::test]
async fn a_multi_read_of_a_tenant_never_written_creates_nothing() {
    let app = TestApp::start().await;
    let before = app.tenants.count();
    let r = app
        .send(
            app.http
                .get(app.url("/v1/counters?keys=A/V/x"))
                .header("x-tenant", "ghost"),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(values(&r), [("x".into(), false, 0)]);
    let r = app
        .send(
            app.http
                .post(app.url("/v1/counters/get?tenant=ghost"))
                .json(&json!({"keys": [k("A", "V", "x")]})),
        )
        .await;
    assert_eq!(values(&r), [("x".into(), false, 0)]);
    assert_eq!(app.tenants.count(), before, "no tenant was opened");
}

/// Not a test: the multi-read of 50 keys against 50 single GETs, over HTTP
/// on one connection each, in one run (µs per key, and the ratio).
/// `cargo test --release --test multiread -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn bench_multi_read_against_single_gets() {
    let app = TestApp::start().await;
    let uuids: Vec<String> = (0..50).map(|i| format!("article-{i}")).collect();
    let events: Vec<Value> = uuids
        .iter()
        .map(|u| json!({"entity": "ARTICLE", "action": "VIEW", "uuid": u, "count": 3}))
        .collect();
    let r = app.post("/v1/events", json!({"events": events})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let keys: Vec<(&str, &str, &str)> = uuids
        .iter()
        .map(|u| ("ARTICLE", "VIEW", u.as_str()))
        .collect();
    let multi_url = app.url(&format!("/v1/counters?keys={}", keys_param(&keys)));
    let post_body =
        json!({"keys": uuids.iter().map(|u| k("ARTICLE", "VIEW", u)).collect::<Vec<_>>()});
    let singles: Vec<String> = uuids
        .iter()
        .map(|u| app.url(&format!("/v1/counters/ARTICLE/VIEW/{u}")))
        .collect();
    let rounds = 400;
    for _ in 0..20 {
        app.http.get(&multi_url).send().await.unwrap();
    }
    let t = std::time::Instant::now();
    for _ in 0..rounds {
        let r = app.http.get(&multi_url).send().await.unwrap();
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap();
    }
    let multi = t.elapsed();
    let t = std::time::Instant::now();
    for _ in 0..rounds {
        let r = app
            .http
            .post(app.url("/v1/counters/get"))
            .json(&post_body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap();
    }
    let post = t.elapsed();
    let t = std::time::Instant::now();
    for _ in 0..rounds {
        for url in &singles {
            let r = app.http.get(url).send().await.unwrap();
            assert_eq!(r.status(), 200);
            r.bytes().await.unwrap();
        }
    }
    let single = t.elapsed();
    let per_key = |d: Duration| d.as_secs_f64() * 1e6 / (rounds * 50) as f64;
    println!(
        "50 keys, {rounds} rounds: GET multi-read {:.1} µs/key, POST multi-read {:.1} µs/key, single GETs {:.1} µs/key; single/multi {:.1}x (GET), {:.1}x (POST)",
        per_key(multi),
        per_key(post),
        per_key(single),
        single.as_secs_f64() / multi.as_secs_f64(),
        single.as_secs_f64() / post.as_secs_f64(),
    );
}
