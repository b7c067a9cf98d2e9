//! The write and read scenarios against a real search engine, and the
//! shared conformance scenarios (`tests/conformance/`) on the Elasticsearch
//! store.
//!
//! Every test here is ignored by default; the gate (`scripts/test.sh`) runs
//! them against a real OpenSearch 2.19 node that `scripts/opensearch.sh`
//! starts, or against `ELASTICSEARCH_URL` when set:
//! `ELASTICSEARCH_URL=http://localhost:9200 cargo test --test es_real -- --ignored`.
//! Run without a reachable cluster, each test fails and says why: it never
//! passes without having run. Each test writes under its own index prefix
//! (`cg-test-<n>`) and removes its indices, templates and scripts afterwards.

#[path = "common/mod.rs"]
mod common;
#[path = "conformance/runner.rs"]
mod runner;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::Request;
use axum::Router;
use counter_gateway::domain::{Clock, ManualClock, TimePolicy};
use counter_gateway::metrics::Metrics;
use counter_gateway::pipeline::{Pipeline, PipelineConfig};
use counter_gateway::store::elasticsearch::config::EsConfig;
use counter_gateway::store::elasticsearch::ElasticsearchStore;
use counter_gateway::store::sqlite::{Durability, SqliteStore};
use counter_gateway::store::Store;
use counter_gateway::{router, AppState, Limits};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

/// The engine the contract fixtures describe (with ILM).
const ES8: counter_gateway::store::elasticsearch::templates::Engine =
    counter_gateway::store::elasticsearch::templates::Engine::Elasticsearch {
        major: 8,
        minor: 15,
    };

const NEEDS: &str = "needs a real Elasticsearch or OpenSearch: set ELASTICSEARCH_URL, or run \
     `scripts/opensearch.sh run -- cargo test --test es_real -- --ignored`";

/// The cluster to test against, checked to answer; panics with the reason otherwise.
async fn cluster() -> String {
    let url = match std::env::var("ELASTICSEARCH_URL") {
        Ok(u) if !u.trim().is_empty() => u.trim().trim_end_matches('/').to_string(),
        _ => panic!(
            "no search engine to test against: {NEEDS}. testcontainers is not compiled into this \
             suite (no Docker engine here; see README)"
        ),
    };
    match reqwest::get(&url).await {
        Ok(r) if r.status().is_success() => url,
        Ok(r) => panic!("ELASTICSEARCH_URL={url} answered {}: {NEEDS}", r.status()),
        Err(e) => panic!("ELASTICSEARCH_URL={url} is not reachable ({e}): {NEEDS}"),
    }
}

/// A fresh prefix per test, so tests never see each other's documents.
fn prefix() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "cg-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

struct Es {
    url: String,
    prefix: String,
    http: reqwest::Client,
}

impl Es {
    async fn refresh(&self) {
        let r = self
            .http
            .post(format!("{}/{}_*/_refresh", self.url, self.prefix))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "refresh: {}", r.status());
    }

    async fn count(&self, index_pattern: &str) -> u64 {
        self.refresh().await;
        let r: Value = self
            .http
            .get(format!(
                "{}/{}_{index_pattern}/_count?ignore_unavailable=true&allow_no_indices=true",
                self.url, self.prefix
            ))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        r["count"].as_u64().unwrap_or(0)
    }

    /// Removes this test's indices, templates and scripts (names, not
    /// wildcards: clusters refuse wildcard deletes by default).
    async fn cleanup(&self) {
        let indices: Value = self
            .http
            .get(format!(
                "{}/_cat/indices/{}_*?format=json&h=index",
                self.url, self.prefix
            ))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap_or(json!([]));
        for i in indices.as_array().into_iter().flatten() {
            let name = i["index"].as_str().unwrap();
            let _ = self
                .http
                .delete(format!("{}/{name}", self.url))
                .send()
                .await;
        }
        let names = EsConfig::new(&self.url, &self.prefix, "default")
            .unwrap()
            .names;
        for step in counter_gateway::store::elasticsearch::templates::steps(&names, ES8)
            .iter()
            .rev()
        {
            let _ = self
                .http
                .delete(format!("{}{}", self.url, step.path))
                .send()
                .await;
        }
    }
}

/// The tests' clock: it stands at `common::test_now()`.
fn clock() -> Clock {
    ManualClock::new(common::test_now()).clock()
}

async fn es_router(url: &str, prefix: &str, clock: Clock) -> Router {
    let cfg = EsConfig::new(url, prefix, "default").unwrap();
    let store: Arc<dyn Store> = Arc::new(
        ElasticsearchStore::open(cfg, clock.clone(), true)
            .await
            .expect("setup against the cluster"),
    );
    router_over(store, clock)
}

fn router_over(store: Arc<dyn Store>, clock: Clock) -> Router {
    let metrics = Arc::new(Metrics::default());
    let config = PipelineConfig {
        ack_timeout: Duration::from_secs(20),
        ..PipelineConfig::default()
    };
    let (pipeline, _flusher) = Pipeline::start(store.clone(), config, metrics.clone());
    router(AppState {
        store,
        pipeline,
        time_policy: TimePolicy::default(),
        clock,
        limits: Limits::default(),
        metrics,
    })
}

async fn start() -> (Es, Router) {
    let url = cluster().await;
    let es = Es {
        url: url.clone(),
        prefix: prefix(),
        http: reqwest::Client::new(),
    };
    let r = es_router(&url, &es.prefix, clock()).await;
    (es, r)
}

async fn call(router: &Router, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let mut req = Request::builder().method(method).uri(path);
    let body = match body {
        Some(b) => {
            req = req.header("content-type", "application/json");
            Body::from(b.to_string())
        }
        None => Body::empty(),
    };
    let res = router
        .clone()
        .oneshot(req.body(body).unwrap())
        .await
        .unwrap();
    let status = res.status().as_u16();
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real search engine: the gate starts one (scripts/opensearch.sh), or set ELASTICSEARCH_URL"]
async fn increments_batches_decrements_and_reads() {
    let (es, r) = start().await;
    let (s, b) = call(
        &r,
        "POST",
        "/v1/counters/VIDEO/VIEW/v1/increment",
        Some(json!({"count": 2, "category": "sports"})),
    )
    .await;
    assert_eq!((s, &b["value"]), (200, &json!(2)), "{b}");
    let (s, b) = call(&r, "POST", "/v1/counters/VIDEO/VIEW/v1/decrement", None).await;
    assert_eq!((s, &b["value"]), (200, &json!(1)), "{b}");
    let (s, b) = call(
        &r,
        "POST",
        "/v1/events",
        Some(json!({"events": [
            {"entity": "VIDEO", "action": "VIEW", "uuid": "v1", "count": 5},
            {"entity": "VIDEO", "action": "like", "uuid": "v1"},
            {"entity": "USER", "action": "user:number_of_logins", "uuid": "a_b", "count": 3}
        ]})),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    let (s, b) = call(&r, "GET", "/v1/counters/VIDEO/VIEW/v1", None).await;
    assert_eq!(
        (s, &b["value"], &b["category"]),
        (200, &json!(6), &json!("sports")),
        "{b}"
    );
    let (s, b) = call(
        &r,
        "GET",
        "/v1/counters/USER/user:number_of_logins/a_b",
        None,
    )
    .await;
    assert_eq!(
        (s, &b["id"], &b["value"]),
        (
            200,
            &json!("USER_user:number%5Fof%5Flogins_a%5Fb"),
            &json!(3)
        )
    );
    es.refresh().await;
    let (s, b) = call(&r, "GET", "/v1/targets/VIDEO/v1/counters", None).await;
    assert_eq!(s, 200);
    let actions: Vec<_> = b["counters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["action"].clone())
        .collect();
    assert_eq!(actions, [json!("VIEW"), json!("like")]);
    // Buckets: one per counter and day.
    assert_eq!(es.count("default_histogram_counters-*").await, 3);
    let (s, _) = call(&r, "GET", "/v1/counters/VIDEO/VIEW/nope", None).await;
    assert_eq!(s, 404);
    es.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real search engine: the gate starts one (scripts/opensearch.sh), or set ELASTICSEARCH_URL"]
async fn overflow_is_refused_by_the_script() {
    let (es, r) = start().await;
    let max = i64::MAX;
    let (s, b) = call(
        &r,
        "POST",
        "/v1/counters/C/N/u/increment",
        Some(json!({"count": max})),
    )
    .await;
    assert_eq!((s, &b["value"]), (200, &json!(max)), "{b}");
    let (s, b) = call(&r, "POST", "/v1/counters/C/N/u/increment", None).await;
    assert_eq!(
        (s, &b["error"]["type"]),
        (409, &json!("counter_overflow")),
        "{b}"
    );
    let (s, b) = call(&r, "GET", "/v1/counters/C/N/u", None).await;
    assert_eq!((s, &b["value"]), (200, &json!(max)));
    // Small numbers arrive in Painless as Integer: no int wrap-around either.
    let (s, b) = call(
        &r,
        "POST",
        "/v1/counters/C/N/small/increment",
        Some(json!({"count": 2_147_483_647})),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    let (_, b) = call(
        &r,
        "POST",
        "/v1/counters/C/N/small/increment",
        Some(json!({"count": 1})),
    )
    .await;
    assert_eq!(b["value"], json!(2_147_483_648_i64));
    es.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real search engine: the gate starts one (scripts/opensearch.sh), or set ELASTICSEARCH_URL"]
async fn event_ids_are_counted_once() {
    let (es, r) = start().await;
    let batch = json!({"events": [
        {"entity": "A", "action": "click", "uuid": "u", "id": "e-1"},
        {"entity": "A", "action": "click", "uuid": "u", "id": "e-1"},
        {"entity": "A", "action": "click", "uuid": "u", "id": "e-2"}
    ]});
    let (s, b) = call(&r, "POST", "/v1/events", Some(batch.clone())).await;
    assert_eq!((s, &b["duplicates"]), (200, &json!(1)), "{b}");
    let (s, b) = call(&r, "POST", "/v1/events", Some(batch)).await;
    assert_eq!((s, &b["duplicates"]), (200, &json!(3)), "{b}");
    let (_, b) = call(&r, "GET", "/v1/counters/A/click/u", None).await;
    assert_eq!(b["value"], json!(2));
    es.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real search engine: the gate starts one (scripts/opensearch.sh), or set ELASTICSEARCH_URL"]
async fn delete_removes_the_counter_and_its_buckets() {
    let (es, r) = start().await;
    let yesterday = (common::test_now() - chrono::Duration::days(1)).to_rfc3339();
    call(&r, "POST", "/v1/counters/D/x/u/increment", None).await;
    call(
        &r,
        "POST",
        "/v1/counters/D/x/u/increment",
        Some(json!({"timestamp": yesterday})),
    )
    .await;
    call(&r, "POST", "/v1/counters/D/y/u/increment", None).await;
    assert_eq!(es.count("default_histogram_counters-*").await, 3);
    let (s, _) = call(&r, "DELETE", "/v1/counters/D/x/u", None).await;
    assert_eq!(s, 200);
    assert_eq!(es.count("default_histogram_counters-*").await, 1);
    let (s, _) = call(&r, "GET", "/v1/counters/D/x/u", None).await;
    assert_eq!(s, 404);
    let (s, _) = call(&r, "DELETE", "/v1/counters/D/x/u", None).await;
    assert_eq!(s, 404);
    es.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real search engine: the gate starts one (scripts/opensearch.sh), or set ELASTICSEARCH_URL"]
async fn setup_is_idempotent() {
    let url = cluster().await;
    let prefix = prefix();
    let store =
        ElasticsearchStore::new(EsConfig::new(&url, &prefix, "default").unwrap(), clock()).unwrap();
    let first = store.setup().await.unwrap();
    // Four scripts, five component and four index templates, and on
    // Elasticsearch the ILM policy (OpenSearch has no ILM).
    let want = if first.engine.has_ilm() { 14 } else { 13 };
    assert_eq!(first.installed.len(), want, "{first:?}");
    let second = store.setup().await.unwrap();
    assert!(second.installed.is_empty(), "{second:?}");
    assert_eq!(second.current.len(), want, "{second:?}");
    // A script changed on the cluster (an older gateway's copy) is replaced.
    let script = counter_gateway::store::elasticsearch::templates::counter_script_id(&prefix);
    let http = reqwest::Client::new();
    let r = http
        .put(format!("{url}/_scripts/{script}/update"))
        .json(&json!({"script": {"lang": "painless", "source": "ctx._source.value = 0"}}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{:?}", r.text().await);
    let third = store.setup().await.unwrap();
    assert_eq!(third.installed, vec![script], "{third:?}");
    let es = Es {
        url,
        prefix,
        http: reqwest::Client::new(),
    };
    es.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real search engine: the gate starts one (scripts/opensearch.sh), or set ELASTICSEARCH_URL"]
async fn same_totals_as_the_embedded_store() {
    let (es, on_es) = start().await;
    let dir = tempfile::tempdir().unwrap();
    let sqlite: Arc<dyn Store> = Arc::new(
        SqliteStore::open(
            dir.path(),
            Durability::Relaxed,
            Duration::from_secs(86_400),
            clock(),
        )
        .unwrap(),
    );
    let embedded = router_over(sqlite, clock());
    // A deterministic mix: many keys, repeats, negatives, categories, past
    // hours, and every fifth event sent twice with its id (a client retry).
    let mut requests = Vec::new();
    for i in 0..200u64 {
        let uuid = format!("u{}", (i * 7) % 13);
        let action = ["VIEW", "like", "share"][(i % 3) as usize];
        let hours_ago = chrono::Duration::hours((i % 50) as i64);
        let mut ev = json!({"entity": "VIDEO", "action": action, "uuid": uuid,
            "count": (i as i64 % 5) - 1,
            "timestamp": (common::test_now() - hours_ago).to_rfc3339()});
        if i % 4 == 0 {
            ev["category"] = json!(["news", "sports"][(i % 8 / 4) as usize]);
        }
        if i % 5 == 0 {
            ev["id"] = json!(format!("id-{i}"));
            requests.push(ev.clone());
        }
        requests.push(ev);
    }
    for chunk in requests.chunks(17) {
        let body = json!({ "events": chunk });
        let (a, x) = call(&on_es, "POST", "/v1/events", Some(body.clone())).await;
        let (b, y) = call(&embedded, "POST", "/v1/events", Some(body)).await;
        assert_eq!((a, &x), (b, &y));
    }
    for u in 0..13 {
        for action in ["VIEW", "like", "share"] {
            let path = format!("/v1/counters/VIDEO/{action}/u{u}");
            let (a, x) = call(&on_es, "GET", &path, None).await;
            let (b, y) = call(&embedded, "GET", &path, None).await;
            assert_eq!((a, &x), (b, &y), "{path}");
        }
    }
    es.cleanup().await;
}

/// The router, with a `_refresh` of the test's indices before every read.
///
/// The scenarios read their writes at once, as the embedded store allows.
/// On Elasticsearch, gets by id are realtime but searches and aggregations
/// (targets, top lists, reports, windows) see writes after the refresh
/// interval (1 s). The gateway does not refresh per write (ES-NOTES), so the
/// test does what a reader waiting one interval would see.
fn refreshing(router: Router, url: &str, prefix: &str) -> Router {
    let refresh = format!("{url}/{prefix}_*/_refresh");
    let http = reqwest::Client::new();
    router.layer(axum::middleware::from_fn(
        move |req: Request<Body>, next: axum::middleware::Next| {
            let (http, refresh) = (http.clone(), refresh.clone());
            async move {
                if req.method() == axum::http::Method::GET {
                    let r = http.post(&refresh).send().await;
                    assert!(
                        r.as_ref().is_ok_and(|r| r.status().is_success()),
                        "refresh before a read failed: {r:?}"
                    );
                }
                next.run(req).await
            }
        },
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real search engine: the gate starts one (scripts/opensearch.sh), or set ELASTICSEARCH_URL"]
async fn conformance_scenarios_pass_on_elasticsearch() {
    let url = cluster().await;
    runner::run_all(common::test_now(), |clock| {
        let url = url.clone();
        async move {
            let prefix = prefix();
            let router = refreshing(es_router(&url, &prefix, clock.clock()).await, &url, &prefix);
            runner::Target {
                router,
                clock,
                guard: Box::new(prefix),
            }
        }
    })
    .await;
}

/// A tenant that never wrote (no index exists yet) reads empty lists, not
/// errors: the engine answers such searches without `aggregations`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real search engine: the gate starts one (scripts/opensearch.sh), or set ELASTICSEARCH_URL"]
async fn a_new_tenant_reads_empty_lists() {
    let (es, r) = start().await;
    for path in [
        "/v1/top/VIDEO/VIEW?interval=last_week",
        "/v1/top/VIDEO/VIEW",
        "/v1/top-averages/VIDEO/rating?interval=last_month",
        "/v1/top-averages/VIDEO/rating",
        "/v1/reports/unused?days=30",
        "/v1/reports/stale?days=30",
        "/v1/targets/VIDEO/x/counters",
    ] {
        let (status, body) = call(&r, "GET", path, None).await;
        assert_eq!(status, 200, "{path}: {body}");
    }
    let (status, body) = call(&r, "GET", "/v1/top/VIDEO/VIEW?interval=last_week", None).await;
    assert_eq!((status, &body["counters"]), (200, &json!([])), "{body}");
    es.cleanup().await;
}

/// The indices' shared settings keep a one-node cluster green:
/// `auto_expand_replicas` drops the replica no second node could hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real search engine: the gate starts one (scripts/opensearch.sh), or set ELASTICSEARCH_URL"]
async fn indices_are_green_on_one_node() {
    let (es, r) = start().await;
    let (status, body) = call(&r, "POST", "/v1/counters/VIDEO/VIEW/a/increment", None).await;
    assert_eq!(status, 200, "{body}");
    let health: Value = es
        .http
        .get(format!(
            "{}/_cluster/health/{}_*?wait_for_status=green&timeout=20s",
            es.url, es.prefix
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    es.cleanup().await;
    assert_eq!(health["status"], "green", "{health}");
}

/// With automatic creation of this prefix's bucket indices refused, writes
/// still succeed: the store creates the month's indices itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real search engine: the gate starts one (scripts/opensearch.sh), or set ELASTICSEARCH_URL"]
async fn writes_do_not_need_automatic_index_creation() {
    let (es, r) = start().await;
    let setting = |value: Value| {
        let es = &es;
        async move {
            let resp = es
                .http
                .put(format!("{}/_cluster/settings", es.url))
                .json(&json!({"persistent": {"action.auto_create_index": value}}))
                .send()
                .await
                .unwrap();
            assert!(resp.status().is_success(), "{}", resp.text().await.unwrap());
        }
    };
    // Only this test's bucket indices: tests running alongside are not affected.
    setting(json!(format!("-{}_*_histogram_counters-*,+*", es.prefix))).await;
    let (status, body) = call(&r, "POST", "/v1/counters/VIDEO/VIEW/a/increment", None).await;
    setting(Value::Null).await;
    let month = common::test_now().format("%Y.%m");
    let next = (common::test_now() + chrono::Months::new(1)).format("%Y.%m");
    let mut missing = Vec::new();
    for collection in ["histogram_counters", "average_histogram_counters"] {
        for m in [month.to_string(), next.to_string()] {
            let index = format!("{}_default_{collection}-{m}", es.prefix);
            let s = es
                .http
                .head(format!("{}/{index}", es.url))
                .send()
                .await
                .unwrap()
                .status();
            if s != 200 {
                missing.push(index);
            }
        }
    }
    let buckets = es.count("default_histogram_counters-*").await;
    es.cleanup().await;
    assert_eq!(status, 200, "{body}");
    assert!(missing.is_empty(), "not created ahead: {missing:?}");
    assert_eq!(buckets, 1);
}

/// Without ILM (OpenSearch) the gateway deletes bucket months past the
/// retention; months still inside it and other indices stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real search engine: the gate starts one (scripts/opensearch.sh), or set ELASTICSEARCH_URL"]
async fn expired_bucket_months_are_deleted() {
    let url = cluster().await;
    let es = Es {
        url: url.clone(),
        prefix: prefix(),
        http: reqwest::Client::new(),
    };
    let cfg = EsConfig::new(&url, &es.prefix, "default").unwrap();
    let store = ElasticsearchStore::open(cfg, clock(), true).await.unwrap();
    let old = (common::test_now() - chrono::Months::new(15)).format("%Y.%m");
    let kept = (common::test_now() - chrono::Months::new(12)).format("%Y.%m");
    let expired = format!("{}_default_histogram_counters-{old}", es.prefix);
    let expired_avg = format!("{}_t2_average_histogram_counters-{old}", es.prefix);
    let recent = format!("{}_default_histogram_counters-{kept}", es.prefix);
    for index in [&expired, &expired_avg, &recent] {
        let resp = es.http.put(format!("{url}/{index}")).send().await.unwrap();
        assert!(resp.status().is_success(), "{}", resp.text().await.unwrap());
    }
    let deleted = store.delete_expired_buckets(400).await;
    let exists = |index: String| {
        let es = &es;
        async move {
            es.http
                .head(format!("{}/{index}", es.url))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    let after = (
        exists(expired.clone()).await,
        exists(expired_avg.clone()).await,
        exists(recent.clone()).await,
    );
    es.cleanup().await;
    let mut want = vec![expired, expired_avg];
    want.sort();
    assert_eq!(deleted, Ok(want));
    assert_eq!(after, (404, 404, 200));
}
