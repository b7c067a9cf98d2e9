//! Tenants over HTTP: each tenant's counters are its own, whether the tenant
//! comes from `X-Tenant`, the `tenant` parameter or the key; names are
//! checked; the number of tenants is bounded; tenants survive a restart.

mod common;

use common::{assert_error, counter_path, key_line, Options, TestApp};
use serde_json::json;

const PATH: &str = "/v1/counters/VIDEO/VIEW/v1";

async fn bump(app: &TestApp, tenant: Option<&str>, count: i64) -> common::Resp {
    let mut req = app
        .http
        .post(app.url(&format!("{PATH}/increment")))
        .json(&json!({ "count": count }));
    if let Some(t) = tenant {
        req = req.header("x-tenant", t);
    }
    app.send(req).await
}

async fn value_of(app: &TestApp, tenant: &str) -> Option<i64> {
    let r = app
        .send(app.http.get(app.url(PATH)).header("x-tenant", tenant))
        .await;
    match r.status {
        200 => r.json["value"].as_i64(),
        404 => None,
        s => panic!("{s}: {}", r.text),
    }
}

#[tokio::test]
async fn tenants_data_is_separate() {
    let app = TestApp::start().await;
    assert_eq!(bump(&app, None, 1).await.status, 200);
    assert_eq!(bump(&app, Some("acme"), 10).await.status, 200);
    assert_eq!(bump(&app, Some("acme"), 10).await.status, 200);
    assert_eq!(bump(&app, Some("globex"), 100).await.status, 200);

    assert_eq!(value_of(&app, "default").await, Some(1));
    assert_eq!(app.value("VIDEO", "VIEW", "v1").await, Some(1));
    assert_eq!(value_of(&app, "acme").await, Some(20));
    assert_eq!(value_of(&app, "globex").await, Some(100));
    assert_eq!(value_of(&app, "initech").await, None);

    // The query parameter names a tenant as the header does, and reads
    // with other parameters still parse.
    let r = app.get(&format!("{PATH}?tenant=acme")).await;
    assert_eq!(r.json["value"], 20, "{}", r.text);
    let r = app.get("/v1/top/VIDEO/VIEW?tenant=globex&size=5").await;
    assert_eq!(r.status, 200, "{}", r.text);
    let top = r.json["counters"].as_array().expect("counters");
    assert_eq!(top.len(), 1, "{}", r.text);
    assert_eq!(top[0]["value"], 100);

    // A delete in one tenant leaves the others alone.
    let r = app
        .send(app.http.delete(app.url(PATH)).header("x-tenant", "acme"))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(value_of(&app, "acme").await, None);
    assert_eq!(value_of(&app, "globex").await, Some(100));
    assert_eq!(value_of(&app, "default").await, Some(1));

    // Each tenant has its own database, the default where it always was.
    let dir = app.data_dir().to_path_buf();
    assert!(dir.join("tenants/acme").is_dir());
    assert!(dir.join("tenants/globex").is_dir());
    let app = app.restart().await;
    assert_eq!(value_of(&app, "globex").await, Some(100));
    assert_eq!(value_of(&app, "default").await, Some(1));
}

#[tokio::test]
async fn bad_tenant_names_are_400_and_create_nothing() {
    let app = TestApp::start().await;
    for bad in ["Acme", "-acme", "a_b", "..", "a.b", &"x".repeat(65)] {
        let r = bump(&app, Some(bad), 1).await;
        assert_error(&r, 400, "invalid_request", &["tenant"]);
    }
    let r = app
        .post(&format!("{PATH}/increment?tenant=..%2Fescape"), json!({}))
        .await;
    assert_error(&r, 400, "invalid_request", &["tenant"]);
    let r = app
        .send(
            app.http
                .get(app.url(&format!("{PATH}?tenant=acme")))
                .header("x-tenant", "globex"),
        )
        .await;
    assert_error(&r, 400, "invalid_request", &["disagree"]);
    assert!(!app.data_dir().join("tenants").exists());
}

#[tokio::test]
async fn the_number_of_tenants_is_bounded() {
    let app = TestApp::start_with(Options {
        max_tenants: 3,
        ..Options::default()
    })
    .await;
    assert_eq!(bump(&app, Some("t1"), 1).await.status, 200);
    assert_eq!(bump(&app, Some("t2"), 1).await.status, 200);
    let r = bump(&app, Some("t3"), 1).await;
    assert_error(&r, 503, "unavailable", &["at most 3 tenants"]);
    // Known tenants and the default still work.
    assert_eq!(bump(&app, Some("t1"), 1).await.status, 200);
    assert_eq!(bump(&app, None, 1).await.status, 200);
    assert_eq!(value_of(&app, "t1").await, Some(2));
    assert_eq!(app.metric("counter_gateway_tenants").await, 3.0);
}

#[tokio::test]
async fn a_key_bound_to_a_tenant_writes_only_there() {
    let keys = key_line("write", "acme", "acme-w") + &key_line("admin", "*", "root");
    let app = TestApp::start_with(Options {
        keys,
        ..Options::default()
    })
    .await;
    let inc = counter_path("VIDEO", "VIEW", "v1", "/increment");
    // No tenant named: the key's own.
    let r = app
        .send(app.http.post(app.url(&inc)).bearer_auth("acme-w"))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    // Naming its own tenant is fine; naming another is 403.
    let r = app
        .send(
            app.http
                .post(app.url(&inc))
                .bearer_auth("acme-w")
                .header("x-tenant", "acme"),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = app
        .send(
            app.http
                .post(app.url(&format!("{inc}?tenant=globex")))
                .bearer_auth("acme-w"),
        )
        .await;
    assert_error(&r, 403, "forbidden", &["tenant"]);

    let read = |tenant: &'static str| {
        app.send(
            app.http
                .get(app.url(PATH))
                .bearer_auth("root")
                .header("x-tenant", tenant),
        )
    };
    assert_eq!(read("acme").await.json["value"], 2);
    assert_eq!(read("globex").await.status, 404);
    assert_eq!(read("default").await.status, 404);
}

/// With Elasticsearch, a tenant's store is the same client over the
/// tenant's own indices `<prefix>_<tenant>_<collection>`.
#[test]
fn an_elasticsearch_tenant_has_its_own_indices() {
    use counter_gateway::store::elasticsearch::config::EsConfig;
    use counter_gateway::store::elasticsearch::ElasticsearchStore;
    let config = EsConfig::new("http://127.0.0.1:9", "cg", "default").unwrap();
    let base = ElasticsearchStore::new(config, counter_gateway::domain::Clock::system()).unwrap();
    let acme = base.for_tenant("acme").unwrap();
    assert_eq!(acme.config().names.counters(), "cg_acme_counters");
    assert_eq!(acme.config().names.averages(), "cg_acme_average_counters");
    assert_eq!(
        acme.config().names.buckets_pattern(),
        "cg_acme_histogram_counters-*"
    );
    assert_eq!(base.config().names.counters(), "cg_default_counters");
    // Names that could collide with another tenant's indices are refused.
    assert!(base.for_tenant("a_b").is_err());
    assert!(base.for_tenant("Acme").is_err());
}
