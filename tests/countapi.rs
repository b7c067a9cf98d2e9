//! The CountAPI-compatible surface over HTTP (a real listener) on the
//! embedded store: a page's calls answered in CountAPI's shapes and read
//! back through `/v1`, `create` and its admin key (once, kept as a hash,
//! across a restart, per tenant), the rules of `set` and `update`, the
//! names refused, JSONP, cache and CORS headers, crawlers and `HEAD`, the
//! key roles of a gateway with keys, and the cross-site check of a
//! keyless one. The same calls on both stores (the fake cluster and a real
//! node too) are the conformance scenario
//! `tests/conformance/scenarios/countapi.json`.

mod common;

use common::{assert_error, key_line, Options, Resp, TestApp};
use serde_json::json;

const CHROME: &str = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36";
const GOOGLEBOT: &str = "Mozilla/5.0 AppleWebKit/537.36 (KHTML, like Gecko; compatible; Googlebot/2.1; +http://www.google.com/bot.html) Chrome/131.0.0.0 Safari/537.36";

async fn get_with(app: &TestApp, path: &str, headers: &[(&str, &str)]) -> Resp {
    let mut req = app.http.get(app.url(path));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    app.send(req).await
}

#[tokio::test]
async fn a_page_written_for_countapi_counts_and_reads_here() {
    let app = TestApp::start().await;
    for want in 1..=3 {
        let r = app.get("/countapi/hit/mysite.com/visits").await;
        assert_eq!(r.status, 200, "{}", r.text);
        assert_eq!(r.json, json!({ "value": want }));
        assert_eq!(r.header("cache-control"), Some("no-store"));
        assert_eq!(r.header("access-control-allow-origin"), Some("*"));
        assert_eq!(r.header("content-type"), Some("application/json"));
    }
    let r = app.get("/countapi/get/mysite.com/visits").await;
    assert_eq!((r.status, r.json.clone()), (200, json!({"value": 3})));
    assert_eq!(r.header("cache-control"), Some("no-store"));
    // The namespace is optional: `default`.
    assert_eq!(
        app.get("/countapi/hit/visits").await.json,
        json!({"value": 1})
    );
    assert_eq!(
        app.get("/countapi/get/default/visits").await.json,
        json!({"value": 1})
    );
    // An ordinary counter: every other endpoint reads it.
    assert_eq!(app.value("countapi", "mysite.com", "visits").await, Some(3));
    let top = app.get("/v1/top/countapi/mysite.com").await;
    assert_eq!(top.json["counters"][0]["uuid"], "visits");
    assert_eq!(top.json["counters"][0]["value"], 3);
    // A key never hit: 404 in the one error shape.
    let r = app.get("/countapi/get/mysite.com/never").await;
    assert_error(&r, 404, "not_found", &["never", "mysite.com"]);
    assert_eq!(r.header("cache-control"), Some("no-store"));
    let r = app.get("/countapi/info/mysite.com/visits").await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["value"], 3);
    assert_eq!(r.json["enable_reset"], false);
    assert_eq!(
        (&r.json["update_lowerbound"], &r.json["update_upperbound"]),
        (&json!(-1), &json!(1))
    );
    assert_eq!(r.json["ttl"], json!(null));
    assert_eq!(
        r.json["created"],
        json!(common::test_now().timestamp_millis())
    );
}

#[tokio::test]
async fn names_follow_countapis_rule_and_bad_input_writes_nothing() {
    let app = TestApp::start().await;
    for (path, says) in [
        ("/countapi/hit/ab/visits", "namespace"),
        ("/countapi/hit/mysite.com/vi", "key"),
        ("/countapi/hit/my%20site/visits", "namespace"),
        ("/countapi/hit/mysite.com/v%C3%A9lo", "key"),
        ("/countapi/update/mysite.com/visits?amount=x", "amount"),
        ("/countapi/update/mysite.com/visits", "amount"),
        (
            "/countapi/update/mysite.com/visits?amount=1&ammount=1",
            "ammount",
        ),
        (
            "/countapi/hit/mysite.com/visits?callback=alert(1)",
            "callback",
        ),
        ("/countapi/create?namespace=ab", "namespace"),
        ("/countapi/create?key=x%2Fy", "key"),
        ("/countapi/create?update_lowerbound=2", "update_lowerbound"),
        ("/countapi/create?update_upperbound=-2", "update_upperbound"),
        ("/countapi/create?enable_reset=yes", "enable_reset"),
        ("/countapi/create?value=1.5", "value"),
        ("/countapi/create?bogus=1", "bogus"),
    ] {
        let r = app.get(path).await;
        assert_error(&r, 400, "invalid_request", &[says]);
    }
    assert_eq!(app.value("countapi", "mysite.com", "visits").await, None);
    assert_eq!(
        app.get("/v1/top/countapi/mysite.com").await.json["counters"],
        json!([])
    );
}

#[tokio::test]
async fn create_answers_the_admin_key_once_and_set_and_update_need_it() {
    let app = TestApp::start().await;
    let r = app
        .get("/countapi/create?namespace=mysite.com&key=likes&value=5")
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        (&r.json["namespace"], &r.json["key"], &r.json["value"]),
        (&json!("mysite.com"), &json!("likes"), &json!(5))
    );
    let admin = r.json["admin_key"].as_str().unwrap().to_string();
    assert_eq!(admin.len(), 32);
    // A second key of the namespace: no admin key again.
    let r = app
        .get("/countapi/create?namespace=mysite.com&key=resettable&enable_reset=1&update_lowerbound=0&update_upperbound=10")
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(r.json.get("admin_key").is_none(), "{}", r.text);
    assert_eq!(r.json["value"], 0);
    // The same key again: 409, nothing changed.
    let r = app
        .get("/countapi/create?namespace=mysite.com&key=likes&value=99")
        .await;
    assert_error(&r, 409, "conflict", &["likes", "exists"]);
    assert_eq!(
        app.get("/countapi/get/mysite.com/likes").await.json,
        json!({"value": 5})
    );
    // A key a hit made exists too.
    app.get("/countapi/hit/mysite.com/visits").await;
    let r = app
        .get("/countapi/create?namespace=mysite.com&key=visits")
        .await;
    assert_error(&r, 409, "conflict", &["visits"]);

    // set: the admin key, or enable_reset.
    let r = app.get("/countapi/set/mysite.com/likes?value=42").await;
    assert_error(&r, 403, "forbidden", &["admin_key", "enable_reset"]);
    let r = app
        .get("/countapi/set/mysite.com/likes?value=42&admin_key=0123456789abcdef0123456789abcdef")
        .await;
    assert_error(&r, 403, "forbidden", &["not the admin key"]);
    assert_eq!(app.value("countapi", "mysite.com", "likes").await, Some(5));
    let r = app
        .get(&format!(
            "/countapi/set/mysite.com/likes?value=42&admin_key={admin}"
        ))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json, json!({"old_value": 5, "value": 42}));
    let r = app.get("/countapi/set/mysite.com/resettable?value=7").await;
    assert_eq!(
        (r.status, r.json.clone()),
        (200, json!({"old_value": 0, "value": 7}))
    );
    // A key of a namespace no create made has no admin key to give.
    let r = app.get("/countapi/hit/other.org/visits").await;
    assert_eq!(r.status, 200);
    let r = app.get("/countapi/set/other.org/visits?value=9").await;
    assert_error(&r, 403, "forbidden", &[]);
    let r = app
        .get(&format!(
            "/countapi/set/other.org/visits?value=9&admin_key={admin}"
        ))
        .await;
    assert_error(&r, 403, "forbidden", &["no admin key"]);
    let r = app.get("/countapi/set/mysite.com/nothing?value=9").await;
    assert_error(&r, 404, "not_found", &["nothing"]);

    // update: inside the bounds, or anything with the admin key.
    let r = app.get("/countapi/update/mysite.com/likes?amount=-1").await;
    assert_eq!((r.status, r.json.clone()), (200, json!({"value": 41})));
    let r = app.get("/countapi/update/mysite.com/likes?amount=2").await;
    assert_error(
        &r,
        400,
        "invalid_request",
        &["amount 2", "update_upperbound 1"],
    );
    let r = app
        .get("/countapi/update/mysite.com/resettable?amount=-1")
        .await;
    assert_error(&r, 400, "invalid_request", &["update_lowerbound 0"]);
    let r = app
        .get("/countapi/update/mysite.com/resettable?amount=10")
        .await;
    assert_eq!(r.json, json!({"value": 17}));
    let r = app
        .get(&format!(
            "/countapi/update/mysite.com/likes?amount=100&admin_key={admin}"
        ))
        .await;
    assert_eq!((r.status, r.json.clone()), (200, json!({"value": 141})));
    assert_eq!(
        app.value("countapi", "mysite.com", "likes").await,
        Some(141)
    );
    let r = app.get("/countapi/info/mysite.com/resettable").await;
    assert_eq!(r.json["enable_reset"], true);
    assert_eq!(
        (&r.json["update_lowerbound"], &r.json["update_upperbound"]),
        (&json!(0), &json!(10))
    );

    // The admin key survives a restart and is kept only as its hash.
    let app = app.restart().await;
    let r = app
        .get(&format!(
            "/countapi/set/mysite.com/likes?value=1&admin_key={admin}"
        ))
        .await;
    assert_eq!(
        (r.status, r.json.clone()),
        (200, json!({"old_value": 141, "value": 1}))
    );
    let digest = counter_gateway::auth::digest(&admin);
    let (mut clear, mut hashed) = (false, false);
    for f in walk(app.data_dir()) {
        let bytes = std::fs::read(&f).unwrap();
        clear |= bytes.windows(admin.len()).any(|w| w == admin.as_bytes());
        hashed |= bytes.windows(32).any(|w| w == digest);
    }
    assert!(!clear, "the admin key is stored in clear");
    assert!(hashed, "the admin key's digest is not stored");
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[tokio::test]
async fn a_create_without_names_makes_a_uuid_key_in_default() {
    let app = TestApp::start().await;
    let r = app.get("/countapi/create").await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["namespace"], "default");
    let key = r.json["key"].as_str().unwrap();
    assert_eq!(key.len(), 36, "{key}");
    assert!(r.json["admin_key"].is_string());
    assert_eq!(
        app.get(&format!("/countapi/hit/{key}")).await.json,
        json!({"value": 1})
    );
}

#[tokio::test]
async fn namespaces_and_admin_keys_are_per_tenant() {
    let app = TestApp::start().await;
    let r = app
        .get("/countapi/create?namespace=shared.name&key=visits&tenant=acme")
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let admin = r.json["admin_key"].as_str().unwrap().to_string();
    // Another tenant: the same names are another namespace, made anew.
    let r = app
        .get("/countapi/get/shared.name/visits?tenant=globex")
        .await;
    assert_error(&r, 404, "not_found", &[]);
    let r = app
        .get("/countapi/create?namespace=shared.name&key=visits&tenant=globex")
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let other = r.json["admin_key"].as_str().unwrap().to_string();
    assert_ne!(admin, other);
    let r = app
        .get(&format!(
            "/countapi/set/shared.name/visits?value=5&tenant=globex&admin_key={admin}"
        ))
        .await;
    assert_error(&r, 403, "forbidden", &["not the admin key"]);
    assert_eq!(
        app.get("/countapi/hit/shared.name/visits?tenant=acme")
            .await
            .json,
        json!({"value": 1})
    );
    assert_eq!(
        app.get("/countapi/get/shared.name/visits?tenant=globex")
            .await
            .json,
        json!({"value": 0})
    );
}

#[tokio::test]
async fn jsonp_wraps_every_answer_for_a_script_tag() {
    let app = TestApp::start().await;
    let r = app.get("/countapi/hit/mysite.com/visits?callback=cb").await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("content-type"),
        Some("application/javascript; charset=utf-8")
    );
    assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
    assert_eq!(
        r.text,
        "/**/ typeof cb === 'function' && cb({\"value\":1});"
    );
    let r = app
        .get("/countapi/get/mysite.com/visits?callback=my.cb")
        .await;
    assert_eq!(
        r.text,
        "/**/ typeof my.cb === 'function' && my.cb({\"value\":1});"
    );
    // A refusal is the JSON error with its status (a script tag's onerror).
    let r = app
        .get("/countapi/get/mysite.com/never?callback=my.cb")
        .await;
    assert_error(&r, 404, "not_found", &["never"]);
    assert_eq!(r.header("cache-control"), Some("no-store"));
    // A callback that is not a name is refused as JSON, never echoed.
    let r = app
        .get("/countapi/get/mysite.com/visits?callback=%3C/script%3E")
        .await;
    assert_error(&r, 400, "invalid_request", &["callback"]);
}

#[tokio::test]
async fn crawlers_and_head_count_nothing() {
    let app = TestApp::start().await;
    app.get("/countapi/hit/mysite.com/visits").await;
    let r = get_with(
        &app,
        "/countapi/hit/mysite.com/visits",
        &[
            ("user-agent", GOOGLEBOT),
            ("origin", "http://localhost:3000"),
        ],
    )
    .await;
    assert_eq!((r.status, r.json.clone()), (202, json!({"value": 1})));
    assert_eq!(r.header("x-counter-ignored"), Some("crawler"));
    let r = get_with(
        &app,
        "/countapi/hit/mysite.com/visits",
        &[("user-agent", CHROME), ("origin", "http://localhost:3000")],
    )
    .await;
    assert_eq!((r.status, r.json.clone()), (200, json!({"value": 2})));
    let r = app
        .send(app.http.head(app.url("/countapi/hit/mysite.com/visits")))
        .await;
    assert_eq!(r.status, 200);
    let r = app
        .send(
            app.http
                .head(app.url("/countapi/update/mysite.com/visits?amount=1")),
        )
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(app.value("countapi", "mysite.com", "visits").await, Some(2));
}

#[tokio::test]
async fn a_keyless_gateway_takes_no_countapi_writes_from_other_sites() {
    let app = TestApp::start().await;
    let evil = [("origin", "https://evil.example"), ("user-agent", CHROME)];
    for path in [
        "/countapi/hit/mysite.com/visits",
        "/countapi/update/mysite.com/visits?amount=1",
        "/countapi/create?namespace=mysite.com&key=visits",
        "/countapi/set/mysite.com/visits?value=1",
    ] {
        let r = get_with(&app, path, &evil).await;
        assert_error(&r, 403, "cross_site_write", &["evil.example"]);
    }
    assert_eq!(app.value("countapi", "mysite.com", "visits").await, None);
    // Reads are left to CORS, which lets any page read CountAPI's counts.
    let r = get_with(&app, "/countapi/get/mysite.com/visits", &evil).await;
    assert_error(&r, 404, "not_found", &[]);
    let app2 = TestApp::start_with(Options {
        allowed_hosts: vec!["*".into()],
        ..Options::default()
    })
    .await;
    let r = get_with(&app2, "/countapi/hit/mysite.com/visits", &evil).await;
    assert_eq!((r.status, r.json.clone()), (200, json!({"value": 1})));
}

#[tokio::test]
async fn with_keys_each_verb_takes_its_role() {
    let keys = key_line("write", "*", "w")
        + &key_line("public", "*", "p")
        + &key_line("read", "*", "r")
        + &key_line("admin", "*", "a");
    let app = TestApp::start_with(Options {
        keys: keys.clone(),
        ..Options::default()
    })
    .await;
    let hit = "/countapi/hit/mysite.com/visits";
    assert_error(&app.get(hit).await, 401, "unauthorized", &[]);
    assert_error(
        &app.get(&format!("{hit}?key=w")).await,
        403,
        "forbidden",
        &["--write-keys-read-values"],
    );
    assert_error(
        &app.get(&format!("{hit}?key=p")).await,
        403,
        "forbidden",
        &[],
    );
    assert_error(
        &app.get(&format!("{hit}?key=r")).await,
        403,
        "forbidden",
        &[],
    );
    assert_eq!(
        app.get(&format!("{hit}?key=a")).await.json,
        json!({"value": 1})
    );
    // Reads: a public key, as the multi-read.
    let get = "/countapi/get/mysite.com/visits";
    assert_eq!(
        app.get(&format!("{get}?key=p")).await.json,
        json!({"value": 1})
    );
    assert_eq!(
        app.get(&format!("{get}?key=r")).await.json,
        json!({"value": 1})
    );
    assert_error(
        &app.get(&format!("{get}?key=w")).await,
        403,
        "forbidden",
        &[],
    );
    // create: an admin key, in the header (`key` is CountAPI's own).
    let create = "/countapi/create?namespace=mysite.com&key=likes";
    assert_error(&app.get(create).await, 401, "unauthorized", &[]);
    let r = app
        .send(app.http.get(app.url(create)).bearer_auth("w"))
        .await;
    assert_error(&r, 403, "forbidden", &[]);
    let r = app
        .send(app.http.get(app.url(create)).bearer_auth("a"))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["key"], "likes");
    assert!(r.json["admin_key"].is_string());

    // A gateway whose write keys may read values: a page's write key hits.
    let app = TestApp::start_with(Options {
        keys,
        write_keys_read_values: true,
        ..Options::default()
    })
    .await;
    assert_eq!(
        app.get(&format!("{hit}?key=w")).await.json,
        json!({"value": 1})
    );
}

#[tokio::test]
async fn img_answers_a_gif_for_an_image_tag() {
    let app = TestApp::start().await;
    let r = app
        .send(app.http.get(app.url("/countapi/hit/mysite.com/visits?img")))
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("image/gif"));
    assert_eq!(r.header("cache-control"), Some("no-store"));
    let bytes = app
        .http
        .get(app.url("/countapi/hit/mysite.com/visits?img"))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert!(bytes.starts_with(b"GIF89a") && bytes.len() == 43);
    assert_eq!(app.value("countapi", "mysite.com", "visits").await, Some(2));
    // A refusal stays JSON, naming why.
    let r = app.get("/countapi/get/mysite.com/never?img").await;
    assert_error(&r, 404, "not_found", &[]);
    let r = app
        .get("/countapi/hit/mysite.com/visits?img&callback=cb")
        .await;
    assert_error(&r, 400, "invalid_request", &["callback and img"]);
    assert_eq!(app.value("countapi", "mysite.com", "visits").await, Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_racing_for_a_new_namespace_make_it_once() {
    let app = TestApp::start().await;
    let mut set = tokio::task::JoinSet::new();
    for i in 0..8 {
        let url = app.url(&format!(
            "/countapi/create?namespace=race.example&key=key-{i}"
        ));
        let http = app.http.clone();
        set.spawn(async move { common::read(http.get(url).send().await.unwrap()).await });
    }
    let answers = set.join_all().await;
    let mut admin_keys = Vec::new();
    for r in &answers {
        assert_eq!(r.status, 200, "{}", r.text);
        admin_keys.extend(r.json["admin_key"].as_str().map(str::to_string));
    }
    assert_eq!(admin_keys.len(), 1, "{answers:?}");
    let r = app
        .get(&format!(
            "/countapi/set/race.example/key-5?value=3&admin_key={}",
            admin_keys[0]
        ))
        .await;
    assert_eq!(r.json, json!({"old_value": 0, "value": 3}));
}
