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
        ilm: true,
    };

const NEEDS: &str = "needs a real Elasticsearch or OpenSearch: set ELASTICSEARCH_URL, or run \
     `scripts/opensearch.sh run -- cargo test --test es_real -- --ignored`";

/// The cluster to test against, checked to answer; panics with the reason otherwise.
async fn cluster() -> String {
    common::logs();
    let url = match std::env::var("ELASTICSEARCH_URL") {
        Ok(u) if !u.trim().is_empty() => u.trim().trim_end_matches('/').to_string(),
        _ => panic!(
            "no search engine to test against: {NEEDS}. testcontainers is not compiled into this \
             suite (no Docker engine here; see tests/README.md)"
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
    let config = PipelineConfig {
        ack_timeout: Duration::from_secs(20),
        ..PipelineConfig::default()
    };
    router_with(store, clock, config)
}

fn router_with(store: Arc<dyn Store>, clock: Clock, config: PipelineConfig) -> Router {
    let metrics = Arc::new(Metrics::default());
    let (pipeline, _flusher) = Pipeline::start(store.clone(), config, metrics.clone());
    router(AppState {
        store,
        pipeline,
        time_policy: TimePolicy::default(),
        clock,
        limits: Limits::default(),
        metrics,
        actors: runner::actors(),
        pending: None,
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
    // The refused request's bucket addition (same day, same document) was
    // refused too: the day still holds exactly the first request.
    es.refresh().await;
    let (s, b) = call(&r, "GET", "/v1/counters/C/N/u/histogram", None).await;
    assert_eq!((s, &b["total"]), (200, &json!(max)), "{b}");
    // The counter at the maximum from yesterday's bucket: today's +1 would
    // create today's bucket (create, which succeeds) while the counter
    // refuses (update). The created bucket is undone: the request is
    // refused as a whole and the histogram keeps its total.
    let now = common::test_now();
    let yesterday = now - chrono::Duration::days(1);
    let (s, b) = call(
        &r,
        "POST",
        "/v1/counters/C/N/y/increment",
        Some(json!({"count": max, "timestamp": yesterday.to_rfc3339()})),
    )
    .await;
    assert_eq!((s, &b["value"]), (200, &json!(max)), "{b}");
    let (s, b) = call(&r, "POST", "/v1/counters/C/N/y/increment", None).await;
    assert_eq!(
        (s, &b["error"]["type"]),
        (409, &json!("counter_overflow")),
        "{b}"
    );
    let (s, b) = call(&r, "GET", "/v1/counters/C/N/y", None).await;
    assert_eq!((s, &b["value"]), (200, &json!(max)), "{b}");
    es.refresh().await;
    let (s, b) = call(
        &r,
        "GET",
        "/v1/counters/C/N/y/histogram?interval=last_week",
        None,
    )
    .await;
    assert_eq!((s, &b["total"]), (200, &json!(max)), "{b}");
    let nonzero: Vec<&Value> = b["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["value"] != json!(0))
        .collect();
    assert_eq!(
        nonzero,
        [&json!({"day": yesterday.format("%Y-%m-%d").to_string(), "value": max})],
        "{b}"
    );
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
    // Six scripts, eight component and nine index templates, and on
    // Elasticsearch the ILM policy (OpenSearch has no ILM).
    let want = if first.engine.has_ilm() { 24 } else { 23 };
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
            TimePolicy::default().retention_days,
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

/// The hot keys the three-gateway tests write: `HOT/hit/h0`..`h2`.
const HOT: [&str; 3] = ["h0", "h1", "h2"];

/// One request of the hot-key traffic: where it goes, its body, and what it
/// adds to each hot key (by index into [`HOT`]).
struct HotRequest {
    path: String,
    body: Value,
    adds: Vec<(usize, i64)>,
    /// Events in the request that carry an id (0 without ids).
    ids: u64,
}

/// Gateway `g`'s 200 requests over the hot keys: increments and decrements
/// of varied sizes, every fifth request a `/v1/events` batch of four events
/// over all three keys. With `with_ids` every increment and event has an
/// id unique to it.
fn hot_traffic(g: usize, with_ids: bool) -> Vec<HotRequest> {
    (0..200usize)
        .map(|i| {
            if i % 5 == 4 {
                let mut events = Vec::new();
                let mut adds = Vec::new();
                for j in 0..4usize {
                    let k = (i + j) % 3;
                    let count = j as i64 + 1;
                    let mut ev =
                        json!({"entity": "HOT", "action": "hit", "uuid": HOT[k], "count": count});
                    if with_ids {
                        ev["id"] = json!(format!("g{g}-r{i}-e{j}"));
                    }
                    events.push(ev);
                    adds.push((k, count));
                }
                HotRequest {
                    path: "/v1/events".into(),
                    body: json!({ "events": events }),
                    adds,
                    ids: if with_ids { 4 } else { 0 },
                }
            } else {
                let k = i % 3;
                let count = [1, 2, 3, -1, 7][i % 5];
                let mut body = json!({ "count": count });
                if with_ids {
                    body["id"] = json!(format!("g{g}-r{i}"));
                }
                HotRequest {
                    path: format!("/v1/counters/HOT/hit/{}/increment", HOT[k]),
                    body,
                    adds: vec![(k, count)],
                    ids: u64::from(with_ids),
                }
            }
        })
        .collect()
}

/// Three gateways (each its own store, pipeline and router) on one cluster
/// and prefix send their traffic concurrently, 8 requests in flight each.
/// With `with_ids`, every request of gateway `g` is also sent again (a
/// client retry) through gateway `g + 1`, interleaved with that gateway's
/// own requests, so an original and its retry are often in flight at once
/// on two gateways. Then the totals must be exact: the counter documents
/// and today's bucket documents, where the three gateways' scripted upserts
/// meet as version conflicts on the shard.
async fn three_gateways_on_hot_keys(with_ids: bool) {
    let url = cluster().await;
    let es = Es {
        url: url.clone(),
        prefix: prefix(),
        http: reqwest::Client::new(),
    };
    let mut gateways = Vec::new();
    for _ in 0..3 {
        // Histograms are searches: they see writes after a refresh.
        let r = es_router(&url, &es.prefix, clock()).await;
        gateways.push(refreshing(r, &url, &es.prefix));
    }
    let own: Vec<Vec<HotRequest>> = (0..3).map(|g| hot_traffic(g, with_ids)).collect();
    let mut expected = [0i64; 3];
    let mut id_events = 0u64;
    for r in own.iter().flatten() {
        for &(k, c) in &r.adds {
            expected[k] += c;
        }
        id_events += r.ids;
    }
    // What each gateway sends: its own requests, and with ids the previous
    // gateway's again, alternately.
    let work: Vec<Arc<Vec<(String, Value)>>> = (0..3)
        .map(|g| {
            let mut list = Vec::new();
            let retried = &own[(g + 2) % 3];
            for (i, r) in own[g].iter().enumerate() {
                list.push((r.path.clone(), r.body.clone()));
                if with_ids {
                    list.push((retried[i].path.clone(), retried[i].body.clone()));
                }
            }
            Arc::new(list)
        })
        .collect();
    let started = std::time::Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    const IN_FLIGHT: usize = 8;
    for (g, router) in gateways.iter().enumerate() {
        for w in 0..IN_FLIGHT {
            let (router, work) = (router.clone(), work[g].clone());
            tasks.spawn(async move {
                let mut duplicates = 0u64;
                for (path, body) in work.iter().skip(w).step_by(IN_FLIGHT) {
                    let (s, b) = call(&router, "POST", path, Some(body.clone())).await;
                    assert_eq!(s, 200, "gateway {g}: {path} {body}: {b}");
                    duplicates += b["duplicates"].as_u64().unwrap_or(0);
                }
                duplicates
            });
        }
    }
    let mut duplicates = 0;
    while let Some(d) = tasks.join_next().await {
        duplicates += d.expect("a client task");
    }
    let sent: usize = work.iter().map(|w| w.len()).sum();
    eprintln!(
        "three gateways, ids: {with_ids}: {sent} requests in {:?}",
        started.elapsed()
    );
    let today = common::test_now().format("%Y-%m-%d").to_string();
    for (k, uuid) in HOT.iter().enumerate() {
        for (g, r) in gateways.iter().enumerate() {
            let (s, b) = call(r, "GET", &format!("/v1/counters/HOT/hit/{uuid}"), None).await;
            assert_eq!(
                (s, &b["value"]),
                (200, &json!(expected[k])),
                "gateway {g}, {uuid}: {b}"
            );
        }
        let (s, b) = call(
            &gateways[0],
            "GET",
            &format!("/v1/counters/HOT/hit/{uuid}/histogram?from={today}&to={today}"),
            None,
        )
        .await;
        assert_eq!(s, 200, "{b}");
        assert_eq!(
            (&b["total"], &b["buckets"]),
            (
                &json!(expected[k]),
                &json!([{"day": today, "value": expected[k]}])
            ),
            "{uuid}: {b}"
        );
    }
    // One bucket document per hot key and day, however many writers.
    assert_eq!(es.count("default_histogram_counters-*").await, 3);
    if with_ids {
        // Of each event sent twice exactly one copy was counted; the other
        // was reported as a duplicate (only /v1/events reports them).
        let batch_ids: u64 = own
            .iter()
            .flatten()
            .filter(|r| r.path == "/v1/events")
            .map(|r| r.ids)
            .sum();
        assert_eq!(duplicates, batch_ids, "{id_events} events with ids");
    } else {
        assert_eq!(duplicates, 0);
    }
    es.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real search engine: the gate starts one (scripts/opensearch.sh), or set ELASTICSEARCH_URL"]
async fn three_gateways_on_hot_keys_count_exactly() {
    three_gateways_on_hot_keys(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real search engine: the gate starts one (scripts/opensearch.sh), or set ELASTICSEARCH_URL"]
async fn three_gateways_count_retried_events_once() {
    three_gateways_on_hot_keys(true).await;
}

/// Overflow decided for a whole flush. Requests gather for 300 ms before
/// each flush, so concurrent requests share one `_bulk`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real search engine: the gate starts one (scripts/opensearch.sh), or set ELASTICSEARCH_URL"]
async fn overflow_within_one_flush_refuses_exactly_the_overflowing_requests() {
    let url = cluster().await;
    let es = Es {
        url: url.clone(),
        prefix: prefix(),
        http: reqwest::Client::new(),
    };
    let store: Arc<dyn Store> = Arc::new(
        ElasticsearchStore::open(
            EsConfig::new(&url, &es.prefix, "default").unwrap(),
            clock(),
            true,
        )
        .await
        .expect("setup against the cluster"),
    );
    let config = PipelineConfig {
        flush_interval: Duration::from_millis(300),
        ack_timeout: Duration::from_secs(20),
        ..PipelineConfig::default()
    };
    let r = refreshing(router_with(store, clock(), config), &url, &es.prefix);
    let max = i64::MAX;
    // One request whose own events, coalesced, overflow a NEW key: refused
    // as a whole, nothing of it written (not even its other key).
    let (s, b) = call(
        &r,
        "POST",
        "/v1/events",
        Some(json!({"events": [
            {"entity": "O", "action": "n", "uuid": "new", "count": max},
            {"entity": "O", "action": "n", "uuid": "other", "count": 5},
            {"entity": "O", "action": "n", "uuid": "new", "count": 1}
        ]})),
    )
    .await;
    assert_eq!(
        (s, &b["error"]["type"]),
        (409, &json!("counter_overflow")),
        "{b}"
    );
    for uuid in ["new", "other"] {
        let (s, b) = call(&r, "GET", &format!("/v1/counters/O/n/{uuid}"), None).await;
        assert_eq!(s, 404, "{uuid}: {b}");
    }
    // A key at max - 10, then in one flush two +6 requests (each fits, their
    // sum does not: only the script sees it) and a +3 on another key. The
    // flush is undone and replayed request by request: one +6 is refused,
    // the other and the +3 are counted exactly once.
    let (s, b) = call(
        &r,
        "POST",
        "/v1/counters/O/n/hot/increment",
        Some(json!({"count": max - 10})),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    let mut tasks = tokio::task::JoinSet::new();
    for (uuid, count) in [("hot", 6), ("hot", 6), ("side", 3)] {
        let r = r.clone();
        tasks.spawn(async move {
            let path = format!("/v1/counters/O/n/{uuid}/increment");
            let (s, b) = call(&r, "POST", &path, Some(json!({ "count": count }))).await;
            (uuid, s, b)
        });
    }
    let mut statuses = Vec::new();
    while let Some(res) = tasks.join_next().await {
        let (uuid, s, b) = res.unwrap();
        if s == 409 {
            assert_eq!(b["error"]["type"], json!("counter_overflow"), "{b}");
        }
        statuses.push((uuid, s));
    }
    statuses.sort();
    assert_eq!(
        statuses,
        [("hot", 200), ("hot", 409), ("side", 200)],
        "{statuses:?}"
    );
    let (_, b) = call(&r, "GET", "/v1/counters/O/n/hot", None).await;
    assert_eq!(b["value"], json!(max - 4), "{b}");
    let (_, b) = call(&r, "GET", "/v1/counters/O/n/side", None).await;
    assert_eq!(b["value"], json!(3), "{b}");
    for (uuid, total) in [("hot", max - 4), ("side", 3)] {
        let (s, b) = call(
            &r,
            "GET",
            &format!("/v1/counters/O/n/{uuid}/histogram"),
            None,
        )
        .await;
        assert_eq!((s, &b["total"]), (200, &json!(total)), "{uuid}: {b}");
    }
    es.cleanup().await;
}

/// 23:00 UTC on the last day of `test_now()`'s month.
fn month_end_23h() -> chrono::DateTime<chrono::Utc> {
    use chrono::{Datelike, NaiveDate, TimeZone};
    let now = common::test_now();
    let (y, m) = if now.month() == 12 {
        (now.year() + 1, 1)
    } else {
        (now.year(), now.month() + 1)
    };
    let first_next = NaiveDate::from_ymd_opt(y, m, 1).unwrap();
    let last = first_next.pred_opt().unwrap();
    chrono::Utc.from_utc_datetime(&last.and_hms_opt(23, 0, 0).unwrap())
}

/// Counting across a month change: buckets land in two monthly indices,
/// and windows spanning both are summed exactly (and say so).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real search engine: the gate starts one (scripts/opensearch.sh), or set ELASTICSEARCH_URL"]
async fn a_month_change_splits_buckets_and_windows_still_add_up() {
    let url = cluster().await;
    let es = Es {
        url: url.clone(),
        prefix: prefix(),
        http: reqwest::Client::new(),
    };
    let start = month_end_23h();
    let manual = ManualClock::new(start);
    let r = refreshing(
        es_router(&url, &es.prefix, manual.clock()).await,
        &url,
        &es.prefix,
    );
    // Per-month orders differ from the total's: a leads the old month,
    // c the new one, c then b then a over both.
    let old = [("a", 10), ("b", 6), ("c", 1)];
    let new = [("b", 6), ("c", 12)];
    for (uuid, count) in old {
        let (s, b) = call(
            &r,
            "POST",
            &format!("/v1/counters/M/v/{uuid}/increment"),
            Some(json!({ "count": count })),
        )
        .await;
        assert_eq!(s, 200, "{b}");
    }
    manual.advance(chrono::Duration::hours(2));
    let later = manual.now();
    let events: Vec<Value> = new
        .iter()
        .map(|(uuid, count)| json!({"entity": "M", "action": "v", "uuid": uuid, "count": count}))
        .collect();
    let (s, b) = call(&r, "POST", "/v1/events", Some(json!({ "events": events }))).await;
    assert_eq!(s, 200, "{b}");

    // Where the buckets went, as the engine has them.
    es.refresh().await;
    let indices: Value = es
        .http
        .get(format!(
            "{url}/_cat/indices/{}_default_histogram_counters-*?format=json&h=index,docs.count",
            es.prefix
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut got: Vec<(String, String)> = indices
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i["index"].as_str().unwrap().to_string(),
                i["docs.count"].as_str().unwrap_or("?").to_string(),
            )
        })
        // The store creates next month's index ahead, empty: only the
        // indices holding buckets say where the writes went.
        .filter(|(_, docs)| docs != "0")
        .collect();
    got.sort();
    let index = |t: chrono::DateTime<chrono::Utc>| {
        format!(
            "{}_default_histogram_counters-{}",
            es.prefix,
            t.format("%Y.%m")
        )
    };
    assert_eq!(
        got,
        [
            (index(start), "3".to_string()),
            (index(later), "2".to_string())
        ],
        "{indices}"
    );

    let (d0, d1) = (
        start.format("%Y-%m-%d").to_string(),
        later.format("%Y-%m-%d").to_string(),
    );
    let top = |b: &Value| -> Vec<(String, i64)> {
        b["counters"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (
                    c["uuid"].as_str().unwrap().to_string(),
                    c["value"].as_i64().unwrap(),
                )
            })
            .collect()
    };
    let list = |v: &[(&str, i64)]| -> Vec<(String, i64)> {
        v.iter().map(|(u, n)| (u.to_string(), *n)).collect()
    };
    for path in [
        "/v1/top/M/v?interval=last_week".to_string(),
        format!("/v1/top/M/v?from={d0}&to={d1}"),
        "/v1/top/M/v".to_string(),
    ] {
        let (s, b) = call(&r, "GET", &path, None).await;
        assert_eq!(s, 200, "{path}: {b}");
        assert_eq!(
            top(&b),
            list(&[("c", 13), ("b", 12), ("a", 10)]),
            "{path}: {b}"
        );
        assert_eq!(b["exact"], json!(true), "{path}: {b}");
    }
    // A short list across the boundary: the order of the sums, not of
    // either month.
    let path = "/v1/top/M/v?interval=last_week&size=2";
    let (s, b) = call(&r, "GET", path, None).await;
    assert_eq!((s, &b["exact"]), (200, &json!(true)), "{b}");
    assert_eq!(top(&b), list(&[("c", 13), ("b", 12)]), "{path}: {b}");
    // One side of the boundary each.
    for (day, want) in [
        (&d0, list(&[("a", 10), ("b", 6), ("c", 1)])),
        (&d1, list(&[("c", 12), ("b", 6)])),
    ] {
        let path = format!("/v1/top/M/v?from={day}&to={day}");
        let (s, b) = call(&r, "GET", &path, None).await;
        assert_eq!((s, &b["exact"]), (200, &json!(true)), "{path}: {b}");
        assert_eq!(top(&b), want, "{path}: {b}");
    }
    // Histograms across the boundary.
    for (uuid, buckets) in [
        ("a", json!([{"day": d0, "value": 10}])),
        (
            "b",
            json!([{"day": d0, "value": 6}, {"day": d1, "value": 6}]),
        ),
        (
            "c",
            json!([{"day": d0, "value": 1}, {"day": d1, "value": 12}]),
        ),
    ] {
        let path = format!("/v1/counters/M/v/{uuid}/histogram?from={d0}&to={d1}");
        let (s, b) = call(&r, "GET", &path, None).await;
        assert_eq!(s, 200, "{path}: {b}");
        let total: i64 = buckets
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["value"].as_i64().unwrap())
            .sum();
        assert_eq!(
            (&b["buckets"], &b["total"]),
            (&buckets, &json!(total)),
            "{path}: {b}"
        );
        let path = format!("/v1/counters/M/v/{uuid}/histogram?interval=last_week");
        let (_, b) = call(&r, "GET", &path, None).await;
        assert_eq!(b["total"], json!(total), "{path}: {b}");
    }
    es.cleanup().await;
}

/// Lists across a month change whose leaders lead neither month: each
/// month's top 64 holds none of them, so the threshold walk
/// (`store/elasticsearch/walk.rs`) must read further, and still answers
/// the exact list and says so: windowed, `last_24_hours` and trending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real search engine: the gate starts one (scripts/opensearch.sh), or set ELASTICSEARCH_URL"]
async fn lists_whose_leaders_lead_no_month_are_exact() {
    let url = cluster().await;
    let es = Es {
        url: url.clone(),
        prefix: prefix(),
        http: reqwest::Client::new(),
    };
    let manual = ManualClock::new(month_end_23h());
    let r = refreshing(
        es_router(&url, &es.prefix, manual.clock()).await,
        &url,
        &es.prefix,
    );
    // o{i} and n{i}: 700 + i in the old month or the new one (at most 899
    // in all); m{j}: 600 in each, plus j in the new one (1200 + j).
    let post = |events: Vec<Value>| {
        let r = r.clone();
        async move {
            let (s, b) = call(&r, "POST", "/v1/events", Some(json!({ "events": events }))).await;
            assert_eq!(s, 200, "{b}");
        }
    };
    let ev = |uuid: String, count: i64| json!({"entity": "M", "action": "v", "uuid": uuid, "count": count});
    let mut old: Vec<Value> = (0..200).map(|i| ev(format!("o{i:03}"), 700 + i)).collect();
    old.extend((0..10).map(|j| ev(format!("m{j}"), 600)));
    post(old).await;
    manual.advance(chrono::Duration::hours(2));
    let mut new: Vec<Value> = (0..200).map(|i| ev(format!("n{i:03}"), 700 + i)).collect();
    new.extend((0..10).map(|j| ev(format!("m{j}"), 600 + j)));
    post(new).await;

    let uuids = |b: &Value, list: &str| -> Vec<String> {
        b[list]
            .as_array()
            .unwrap_or_else(|| panic!("{b}"))
            .iter()
            .map(|c| c["uuid"].as_str().unwrap().to_string())
            .collect()
    };
    let mids: Vec<String> = (0..10).rev().map(|j| format!("m{j}")).collect();
    // Past the mids, ties at 899, 898, ... go by uuid: n before o.
    let mut fifteen = mids.clone();
    fifteen.extend(["n199", "o199", "n198", "o198", "n197"].map(String::from));
    for (path, want) in [
        ("/v1/top/M/v?interval=last_week&size=10", &mids),
        ("/v1/top/M/v?interval=last_week&size=15", &fifteen),
        ("/v1/top/M/v?interval=last_24_hours&size=15", &fifteen),
    ] {
        let (s, b) = call(&r, "GET", path, None).await;
        assert_eq!(s, 200, "{path}: {b}");
        assert_eq!(&uuids(&b, "counters"), want, "{path}: {b}");
        assert_eq!(b["exact"], json!(true), "{path}: {b}");
        let m9 = &b["counters"][0];
        assert_eq!(
            (&m9["uuid"], &m9["value"]),
            (&json!("m9"), &json!(1209)),
            "{b}"
        );
    }
    // Trending: the old month's hour weighs a little less than the open
    // one, so the mids still lead, by their score.
    let path = "/v1/trending/M/v?half_life=24h&size=10";
    let (s, b) = call(&r, "GET", path, None).await;
    assert_eq!(s, 200, "{path}: {b}");
    assert_eq!(uuids(&b, "counters"), mids, "{path}: {b}");
    assert_eq!(b["exact"], json!(true), "{path}: {b}");
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

/// The multi-read on the real node: 1,000 keys in one `_mget`, read at once
/// after their writes (realtime, no refresh), in order, missing ones as
/// such; the same bytes, so the same ETag, as the embedded store over the
/// same writes; and a tenant without indices reads as all missing (the
/// node answers `index_not_found_exception` per document inside a 200).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real search engine: the gate starts one (scripts/opensearch.sh), or set ELASTICSEARCH_URL"]
async fn a_multi_read_of_1000_keys_sees_every_acknowledged_write() {
    let url = cluster().await;
    let es = Es {
        url: url.clone(),
        prefix: prefix(),
        http: reqwest::Client::new(),
    };
    let cfg = EsConfig::new(&url, &es.prefix, "default").unwrap();
    let store = ElasticsearchStore::open(cfg, clock(), true)
        .await
        .expect("setup against the cluster");
    let ghost: Arc<dyn Store> = Arc::new(store.for_tenant("ghost").unwrap());
    let on_es = router_over(Arc::new(store), clock());
    let dir = tempfile::tempdir().unwrap();
    let sqlite: Arc<dyn Store> = Arc::new(
        SqliteStore::open(
            dir.path(),
            Durability::Relaxed,
            Duration::from_secs(86_400),
            TimePolicy::default().retention_days,
            clock(),
        )
        .unwrap(),
    );
    let embedded = router_over(sqlite, clock());

    // Every other key of the 1,000 is counted, some with a category.
    let events: Vec<Value> = (0..1_000)
        .filter(|i| i % 2 == 0)
        .map(|i| {
            let mut ev = json!({"entity": "ARTICLE", "action": "VIEW", "uuid": format!("a{i}"), "count": i + 1});
            if i % 10 == 0 {
                ev["category"] = json!("news");
            }
            ev
        })
        .collect();
    for router in [&on_es, &embedded] {
        let (status, body) = call(
            router,
            "POST",
            "/v1/events",
            Some(json!({"events": events})),
        )
        .await;
        assert_eq!(status, 200, "{body}");
    }
    let keys: Vec<Value> = (0..1_000)
        .rev()
        .map(|i| json!({"entity": "ARTICLE", "action": "VIEW", "uuid": format!("a{i}")}))
        .collect();
    let body = json!({"keys": keys});
    let (status, got) = call(&on_es, "POST", "/v1/counters/get", Some(body.clone())).await;
    assert_eq!(status, 200, "{got}");
    let counters = got["counters"].as_array().unwrap();
    assert_eq!(counters.len(), 1_000);
    for (c, i) in counters.iter().zip((0..1_000).rev()) {
        assert_eq!(c["uuid"], format!("a{i}"));
        let counted = i % 2 == 0;
        assert_eq!(c["found"], counted, "{c}");
        assert_eq!(c["value"], if counted { i + 1 } else { 0 }, "{c}");
    }
    let (_, on_embedded) = call(&embedded, "POST", "/v1/counters/get", Some(body)).await;
    assert_eq!(got, on_embedded, "both stores answer alike");

    // The GET form: equal answers, equal bytes, equal tags.
    let path = "/v1/counters?keys=ARTICLE/VIEW/a10,ARTICLE/VIEW/a11,ARTICLE/VIEW/a0";
    let mut tags = Vec::new();
    for router in [&on_es, &embedded] {
        let res = router
            .clone()
            .oneshot(Request::builder().uri(path).body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        let tag = res.headers()["etag"].to_str().unwrap().to_string();
        let bytes = res.into_body().collect().await.unwrap().to_bytes();
        tags.push((tag, bytes));
    }
    assert_eq!(tags[0], tags[1], "the same tag and bytes on both stores");

    let asked: Vec<counter_gateway::domain::CounterKey> = (0..3)
        .map(|i| {
            counter_gateway::domain::CounterKey::new("ARTICLE", "VIEW", &format!("a{i}")).unwrap()
        })
        .collect();
    assert_eq!(ghost.get_many(&asked).await.unwrap(), vec![None; 3]);
    assert!(ghost.get_many(&[]).await.unwrap().is_empty());
    es.cleanup().await;
}

/// The UTC day `n` days before the tests' clock, as the API names days.
fn backfill_day(n: i64) -> String {
    (common::test_now() - chrono::Duration::days(n))
        .format("%Y-%m-%d")
        .to_string()
}

/// A backfill cut short between its two writes (the gateway died after
/// setting the bucket, before moving the counter) leaves the bucket naming
/// its set and the counter behind; increments go on meanwhile. Setting the
/// same value again completes the cut set exactly once and then sets the
/// day: the counter ends as the sum of its buckets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real search engine: the gate starts one (scripts/opensearch.sh), or set ELASTICSEARCH_URL"]
async fn a_backfill_cut_short_between_its_writes_is_completed_by_setting_it_again() {
    use counter_gateway::store::elasticsearch::request::{bucket_doc_id, encode_path_segment};
    let (es, r) = start().await;
    let ts = common::rfc3339(common::test_now() - chrono::Duration::days(2));
    let ev = json!({"events": [{"entity": "VIDEO", "action": "VIEW", "uuid": "cut", "count": 5, "timestamp": ts}]});
    assert_eq!(call(&r, "POST", "/v1/events", Some(ev)).await.0, 200);
    // What the dead gateway wrote in step 3 of setting the day to 9.
    let day = counter_gateway::domain::day_of(common::test_now()) - 2;
    let names = EsConfig::new(&es.url, &es.prefix, "default").unwrap().names;
    let doc = format!(
        "{}/{}/_doc/{}?routing=VIDEO_VIEW_cut",
        es.url,
        names.buckets(day),
        encode_path_segment(&bucket_doc_id("VIDEO_VIEW_cut", day))
    );
    let got: Value = es
        .http
        .get(&doc)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut src = got["_source"].clone();
    assert_eq!(src["value"], 5, "{got}");
    src["value"] = json!(9);
    src["last_set"] =
        json!({"id": "cut-short", "delta": "4", "touch_ms": day * 86_400_000, "category": null});
    let put = es.http.put(&doc).json(&src).send().await.unwrap();
    assert!(put.status().is_success(), "{}", put.text().await.unwrap());
    // An increment of the same day meanwhile: bucket 10, counter 6.
    let path = "/v1/counters/VIDEO/VIEW/cut";
    let inc = json!({"timestamp": ts});
    let (s, b) = call(&r, "POST", &format!("{path}/increment"), Some(inc)).await;
    assert_eq!((s, &b["value"]), (200, &json!(6)), "{b}");
    let set = format!("{path}/days/{}", backfill_day(2));
    for _ in 0..2 {
        let (s, b) = call(&r, "PUT", &set, Some(json!({"value": 9}))).await;
        assert_eq!(s, 200, "{b}");
        assert_eq!(b["counter"]["value"], 9, "{b}");
    }
    es.refresh().await;
    let (_, h) = call(&r, "GET", &format!("{path}/histogram"), None).await;
    assert_eq!(h["total"], 9, "{h}");
    let (_, c) = call(&r, "GET", path, None).await;
    assert_eq!(c["value"], 9, "{c}");
    es.cleanup().await;
}

/// Increments on the day being set and on another, racing sets from
/// another task: the conditional bucket writes re-read what the increments
/// changed, so nothing is lost or counted twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real search engine: the gate starts one (scripts/opensearch.sh), or set ELASTICSEARCH_URL"]
async fn increments_racing_backfills_keep_the_counter_the_sum_of_its_buckets() {
    let (es, r) = start().await;
    let path = "/v1/counters/VIDEO/VIEW/hot";
    let adders: Vec<_> = (0..3)
        .map(|_| {
            let r = r.clone();
            tokio::spawn(async move {
                for i in 0..30 {
                    let days = if i % 2 == 0 { 0 } else { 1 };
                    let ts = common::rfc3339(common::test_now() - chrono::Duration::days(days));
                    let (s, b) = call(
                        &r,
                        "POST",
                        &format!("{path}/increment"),
                        Some(json!({"timestamp": ts})),
                    )
                    .await;
                    assert_eq!(s, 200, "{b}");
                }
            })
        })
        .collect();
    for v in [100, 7, 100, 0, 55] {
        let (s, b) = call(
            &r,
            "PUT",
            &format!("{path}/days/{}", backfill_day(1)),
            Some(json!({"value": v})),
        )
        .await;
        assert_eq!(s, 200, "{b}");
    }
    for a in adders {
        a.await.unwrap();
    }
    es.refresh().await;
    let (_, h) = call(&r, "GET", &format!("{path}/histogram?interval=all"), None).await;
    let (_, c) = call(&r, "GET", path, None).await;
    assert_eq!(h["total"], c["value"], "{h} {c}");
    let today = h["buckets"].as_array().unwrap().last().cloned().unwrap();
    assert_eq!(today["value"], 45, "{h}");
    es.cleanup().await;
}

/// Indices created by an earlier version lack the backfill fields, and
/// their strict mappings would refuse them: the first set adds them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real search engine: the gate starts one (scripts/opensearch.sh), or set ELASTICSEARCH_URL"]
async fn a_backfill_adds_its_fields_to_indices_an_older_version_created() {
    let (es, r) = start().await;
    for (name, field) in [
        ("counter-mappings", "set_days"),
        ("bucket-mappings", "last_set"),
    ] {
        let url = format!("{}/_component_template/{}-{name}", es.url, es.prefix);
        let mut got: Value = es
            .http
            .get(&url)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let mut old = got["component_templates"][0]["component_template"].take();
        let props = old["template"]["mappings"]["properties"]
            .as_object_mut()
            .unwrap();
        assert!(props.remove(field).is_some(), "{name}");
        let put = es.http.put(&url).json(&old).send().await.unwrap();
        assert!(put.status().is_success(), "{}", put.text().await.unwrap());
    }
    let ts = common::rfc3339(common::test_now() - chrono::Duration::days(1));
    let path = "/v1/counters/VIDEO/VIEW/old";
    let (s, b) = call(
        &r,
        "POST",
        &format!("{path}/increment"),
        Some(json!({"timestamp": ts})),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    let mapping: Value = es
        .http
        .get(format!(
            "{}/{}_default_counters/_mapping",
            es.url, es.prefix
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        !mapping.to_string().contains("set_days"),
        "the index is as an older version made it: {mapping}"
    );
    let (s, b) = call(
        &r,
        "PUT",
        &format!("{path}/days/{}", backfill_day(1)),
        Some(json!({"value": 5})),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(
        (&b["previous"], &b["counter"]["value"]),
        (&json!(1), &json!(5)),
        "{b}"
    );
    es.cleanup().await;
}

/// Once per actor on the node, three gateways at once (as three instances
/// behind a balancer): every actor's like sent twice through each gateway
/// concurrently counts once; every unlike, sent likewise, takes exactly that
/// like back; views count once per actor and day. The marks' documents meet
/// as version conflicts on the shard, which `retry_on_conflict` re-runs.
/// No mark holds the raw actor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real search engine: the gate starts one (scripts/opensearch.sh), or set ELASTICSEARCH_URL"]
async fn three_gateways_count_each_actor_once() {
    let url = cluster().await;
    let es = Es {
        url: url.clone(),
        prefix: prefix(),
        http: reqwest::Client::new(),
    };
    let mut gateways = Vec::new();
    for _ in 0..3 {
        gateways.push(es_router(&url, &es.prefix, clock()).await);
    }
    const ACTORS: usize = 40;
    let actor = |i: usize| format!("person-{i}@example.org");
    // Each request twice through each gateway, all at once.
    async fn everywhere(gateways: &[Router], requests: Vec<(String, Value)>) -> (u64, u64) {
        let mut tasks = tokio::task::JoinSet::new();
        for r in gateways {
            for (path, body) in requests.iter().chain(requests.iter()) {
                let (r, path, body) = (r.clone(), path.clone(), body.clone());
                tasks.spawn(async move {
                    let (s, b) = call(&r, "POST", &path, Some(body.clone())).await;
                    assert_eq!(s, 200, "{path} {body}: {b}");
                    b
                });
            }
        }
        let (mut counted, mut repeats) = (0, 0);
        while let Some(b) = tasks.join_next().await {
            let b = b.expect("a client task");
            match b.get("counted") {
                Some(c) if c == &json!(true) => counted += 1,
                Some(_) => repeats += 1,
                None => {
                    counted += b["accepted"].as_u64().unwrap();
                    repeats += b["repeats"].as_u64().unwrap_or(0);
                }
            }
        }
        (counted, repeats)
    }
    let one = |i: usize, suffix: &str, unique: &str| {
        (
            format!("/v1/counters/ARTICLE/like/a1/{suffix}"),
            json!({"actor": actor(i), "unique": unique}),
        )
    };
    let value = |router: &Router, path: &'static str| {
        let router = router.clone();
        async move { call(&router, "GET", path, None).await.1["value"].clone() }
    };
    let likes = (0..ACTORS).map(|i| one(i, "increment", "ever")).collect();
    let (counted, repeats) = everywhere(&gateways, likes).await;
    assert_eq!((counted, repeats), (ACTORS as u64, 5 * ACTORS as u64));
    for g in &gateways {
        assert_eq!(
            value(g, "/v1/counters/ARTICLE/like/a1").await,
            json!(ACTORS)
        );
    }
    let unlikes = (0..ACTORS).map(|i| one(i, "decrement", "ever")).collect();
    let (counted, _) = everywhere(&gateways, unlikes).await;
    assert_eq!(counted, ACTORS as u64);
    assert_eq!(
        value(&gateways[1], "/v1/counters/ARTICLE/like/a1").await,
        json!(0)
    );
    // Half of them like again, in batches.
    let batch = |from: usize| {
        let events: Vec<Value> = (from..from + ACTORS / 4)
            .map(|i| json!({"entity": "ARTICLE", "action": "like", "uuid": "a1", "actor": actor(i), "unique": "ever"}))
            .collect();
        ("/v1/events".to_string(), json!({"events": events}))
    };
    let (counted, _) = everywhere(&gateways, vec![batch(0), batch(ACTORS / 4)]).await;
    assert_eq!(counted, (ACTORS / 2) as u64);
    assert_eq!(
        value(&gateways[2], "/v1/counters/ARTICLE/like/a1").await,
        json!(ACTORS / 2)
    );
    // Views, once per actor and day.
    let views = (0..ACTORS)
        .map(|i| {
            (
                "/v1/counters/ARTICLE/VIEW/a1/increment".to_string(),
                json!({"actor": actor(i), "unique": "day"}),
            )
        })
        .collect();
    let (counted, _) = everywhere(&gateways, views).await;
    assert_eq!(counted, ACTORS as u64);
    assert_eq!(
        value(&gateways[0], "/v1/counters/ARTICLE/VIEW/a1").await,
        json!(ACTORS)
    );
    // A mark per liking actor (unliked ones without ids are gone), one per
    // viewer; none holds the actor.
    assert_eq!(es.count("default_actor_marks").await, (ACTORS / 2) as u64);
    assert_eq!(es.count("default_actor_day_marks-*").await, ACTORS as u64);
    let all: Value = es
        .http
        .get(format!(
            "{}/{}_*_actor*/_search?size=1000",
            es.url, es.prefix
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let text = all.to_string();
    assert!(text.contains("\"state\":\"counted\""), "{text}");
    assert!(
        !text.contains("example.org") && !text.contains("person-"),
        "{text}"
    );
    es.cleanup().await;
}

/// What a crash between a mark and its count leaves, written as such a
/// flush would have left it: a mark says "counted" for a like that never
/// landed (the like is lost: the actor's next like is a repeat, never a
/// second count); a fresh retraction of a flush that died blocks the
/// actor's like and unlike (neither counts twice); once older than the
/// stale limit (10 minutes) it reads as counted again, and an unlike then
/// takes the like back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real search engine: the gate starts one (scripts/opensearch.sh), or set ELASTICSEARCH_URL"]
async fn marks_left_by_a_crash_lose_a_count_and_never_count_twice() {
    let (es, r) = start().await;
    let key = counter_gateway::domain::CounterKey::new("ARTICLE", "like", "a1").unwrap();
    let secret = runner::actors().key;
    let now = common::test_now().timestamp_millis();
    // Bob's like is counted the normal way: the counter exists at 1.
    let like = |who: &str| json!({"actor": who, "unique": "ever"});
    let (s, _) = call(
        &r,
        "POST",
        "/v1/counters/ARTICLE/like/a1/increment",
        Some(like("bob")),
    )
    .await;
    assert_eq!(s, 200);
    let leave = |who: &str, state: &str, since: i64| {
        let mark = secret.mark(&key, who).unwrap().hex();
        let id =
            counter_gateway::store::elasticsearch::request::mark_doc_id(&key.doc_id(), &mark, None);
        let (http, url, prefix, cid) = (
            es.http.clone(),
            es.url.clone(),
            es.prefix.clone(),
            key.doc_id(),
        );
        let doc = json!({"counter_id": key.doc_id(), "scope": "ever", "state": state,
            "token": "a-flush-that-died", "since": since, "outcome": "counted"});
        async move {
            let resp = http
                .put(format!(
                    "{url}/{prefix}_default_actor_marks/_doc/{}?routing={}",
                    counter_gateway::store::elasticsearch::request::encode_path_segment(&id),
                    cid
                ))
                .json(&doc)
                .send()
                .await
                .unwrap();
            assert!(resp.status().is_success(), "{}", resp.text().await.unwrap());
        }
    };
    leave("carol", "counted", now).await;
    leave("dave", "retracting", now - 60_000).await;
    leave("erin", "retracting", now - 11 * 60_000).await;
    let send = |suffix: &str, who: &str| {
        let (r, path, body) = (
            r.clone(),
            format!("/v1/counters/ARTICLE/like/a1/{suffix}"),
            like(who),
        );
        async move { call(&r, "POST", &path, Some(body)).await.1 }
    };
    // Carol's like was lost: her like is a repeat.
    let b = send("increment", "carol").await;
    assert_eq!(
        (&b["value"], &b["skipped"]),
        (&json!(1), &json!("repeat")),
        "{b}"
    );
    // Dave's retraction is fresh: neither a like nor an unlike counts.
    let b = send("increment", "dave").await;
    assert_eq!(
        (&b["value"], &b["skipped"]),
        (&json!(1), &json!("repeat")),
        "{b}"
    );
    let b = send("decrement", "dave").await;
    assert_eq!(
        (&b["value"], &b["skipped"]),
        (&json!(1), &json!("repeat")),
        "{b}"
    );
    // Erin's is stale: it reads as counted. A like is a repeat, an unlike counts.
    let b = send("increment", "erin").await;
    assert_eq!(
        (&b["value"], &b["skipped"]),
        (&json!(1), &json!("repeat")),
        "{b}"
    );
    let b = send("decrement", "erin").await;
    assert_eq!(
        (&b["value"], &b["counted"]),
        (&json!(0), &json!(true)),
        "{b}"
    );
    // And her next like counts once.
    let b = send("increment", "erin").await;
    assert_eq!(
        (&b["value"], &b["counted"]),
        (&json!(1), &json!(true)),
        "{b}"
    );
    let b = send("increment", "erin").await;
    assert_eq!(b["skipped"], "repeat", "{b}");
    es.cleanup().await;
}

/// Views' marks are in monthly indices with the strict mapping of the
/// template, created ahead; without ILM the gateway deletes a month of them
/// past the retention, as it does bucket months.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real search engine: the gate starts one (scripts/opensearch.sh), or set ELASTICSEARCH_URL"]
async fn view_marks_are_monthly_strict_and_expire() {
    let (es, r) = start().await;
    let body = json!({"actor": "alice", "unique": "day"});
    let (s, b) = call(
        &r,
        "POST",
        "/v1/counters/ARTICLE/VIEW/a1/increment",
        Some(body),
    )
    .await;
    assert_eq!((s, &b["counted"]), (200, &json!(true)), "{b}");
    let index = format!(
        "{}_default_actor_day_marks-{}",
        es.prefix,
        common::test_now().format("%Y.%m")
    );
    let mapping: Value = es
        .http
        .get(format!("{}/{index}/_mapping", es.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let m = &mapping[&index]["mappings"];
    assert_eq!(m["dynamic"], "strict", "{mapping}");
    assert_eq!(m["properties"]["state"]["type"], "keyword", "{mapping}");
    // A month 15 months back is past the 400-day retention.
    let old = format!(
        "{}_default_actor_day_marks-{}",
        es.prefix,
        (common::test_now() - chrono::Months::new(15)).format("%Y.%m")
    );
    let resp = es
        .http
        .put(format!("{}/{old}", es.url))
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success(), "{}", resp.text().await.unwrap());
    let cfg = EsConfig::new(&es.url, &es.prefix, "default").unwrap();
    let store = ElasticsearchStore::open(cfg, clock(), false).await.unwrap();
    let deleted = store.delete_expired_buckets(400).await;
    es.cleanup().await;
    assert_eq!(deleted, Ok(vec![old]));
}

/// A like of `actor` on ARTICLE/like/a1 with `mark`, applied to `store`:
/// whether it counted (`None`: the flush failed, with its reason).
async fn like_with_mark(
    store: &dyn Store,
    mark: counter_gateway::domain::Mark,
) -> Result<bool, String> {
    use counter_gateway::domain::{CounterKey, Increment, Kind, Scope, Unique};
    let now = common::test_now();
    let event = Increment {
        key: CounterKey::new("ARTICLE", "like", "a1").unwrap(),
        delta: 1,
        category: None,
        ts_ms: now.timestamp_millis(),
        day: now.timestamp_millis().div_euclid(86_400_000),
        id: None,
        kind: Kind::Counter,
        unique: Some(Unique {
            scope: Scope::Ever,
            mark,
        }),
    };
    let out = store
        .apply(counter_gateway::store::WriteBatch {
            requests: vec![vec![event]],
            ..Default::default()
        })
        .await
        .map_err(|e| e.to_string())?;
    match &out.requests[0] {
        counter_gateway::store::RequestOutcome::Applied { .. } => {
            Ok(out.repeats.first().copied().unwrap_or(0) == 0)
        }
        other => Err(format!("{other:?}")),
    }
}

/// Marks are keyed for their tenant on Elasticsearch too. Marks an earlier
/// version keyed without the tenant (documents, and no keying record on
/// the tenant's `actor_marks`) are refused, at start and at the tenant's
/// first mark, naming the indices; the way the refusal gives (export,
/// delete the tenant's mark indices, import with the secret) re-keys them,
/// and the actor they counted is then still counted once. Two tenants
/// sharing the secret get different mark documents for one actor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real search engine: the gate starts one (scripts/opensearch.sh), or set ELASTICSEARCH_URL"]
async fn marks_of_an_earlier_version_are_refused_then_reimported_for_their_tenant() {
    use counter_gateway::domain::{ActorKey, CounterKey};
    use counter_gateway::transfer::{export, format, import};
    let url = cluster().await;
    let es = Es {
        url: url.clone(),
        prefix: prefix(),
        http: reqwest::Client::new(),
    };
    let cfg = EsConfig::new(&url, &es.prefix, "default").unwrap();
    let base = ElasticsearchStore::open(cfg, clock(), true).await.unwrap();
    let secret_text = "the secret of every gateway here";
    let secret = ActorKey::new(secret_text.as_bytes()).unwrap();
    let key = CounterKey::new("ARTICLE", "like", "a1").unwrap();
    let acme_index = format!("{}_acme_actor_marks", es.prefix);

    // What an earlier version left: alice's like, marked without the
    // tenant, and no keying record.
    let acme = base.for_tenant("acme").unwrap();
    let old = secret.untenanted_mark(&key, "alice").unwrap();
    assert_eq!(like_with_mark(&acme, old).await, Ok(true));
    let r = es
        .http
        .put(format!("{url}/{acme_index}/_mapping"))
        .json(&json!({"_meta": {}}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    es.refresh().await;

    // Refused at start (every tenant of the prefix) and at acme's first
    // mark, naming the index; the default tenant is not held up.
    let e = base.check_mark_keying().await.unwrap_err();
    assert!(e.contains(&acme_index) && e.contains("import"), "{e}");
    let fresh = base.for_tenant("acme").unwrap();
    let e = fresh
        .key_marks(&secret.for_tenant("acme"))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains(&acme_index), "{e}");
    let e = like_with_mark(&fresh, secret.for_tenant("acme").mark(&key, "bob").unwrap())
        .await
        .unwrap_err();
    assert!(e.contains(&acme_index), "{e}");
    let default = base.for_tenant("default").unwrap();
    default.key_marks(&secret).await.unwrap();

    // The way on: export (its marks of the first keying, as the record
    // says), delete acme's mark indices, import with the secret.
    let rules = format::Rules {
        now: common::test_now(),
        policy: TimePolicy::default(),
    };
    let mut out = Vec::new();
    let what = export::Export {
        from_day: rules.oldest_day(),
        hours_from_day: rules.oldest_hour_day(),
        marks: true,
        fingerprint: secret.fingerprint(),
        tenant: "acme".into(),
    };
    export::write(&fresh, &mut out, &what, &indicatif::ProgressBar::hidden())
        .await
        .unwrap();
    let file = String::from_utf8(out).unwrap();
    let second: Value = serde_json::from_str(file.lines().nth(1).unwrap()).unwrap();
    assert_eq!(
        second,
        json!({"kind": "actor_secret", "fingerprint": secret.fingerprint().unwrap()})
    );
    let r = es
        .http
        .delete(format!("{url}/{acme_index}"))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    let importer = Arc::new(base.for_tenant("acme").unwrap());
    let options = import::Options {
        secret: counter_gateway::transfer::secret::SecretCheck::Cluster {
            store: importer.clone(),
            given: Some(secret_text.into()),
            key: None,
        },
        ..import::Options::default()
    };
    let done = import::read_all(
        &*importer,
        file.as_bytes(),
        &rules,
        &options,
        &indicatif::ProgressBar::hidden(),
    )
    .await
    .unwrap();
    assert_eq!(done.marks, 1);
    es.refresh().await;
    base.check_mark_keying().await.unwrap();

    // Alice is still counted once on acme; Bob is new. The default
    // tenant's Alice is another mark document.
    let acme = base.for_tenant("acme").unwrap();
    acme.key_marks(&secret.for_tenant("acme")).await.unwrap();
    let acme_key = secret.for_tenant("acme");
    assert_eq!(
        like_with_mark(&acme, acme_key.mark(&key, "alice").unwrap()).await,
        Ok(false)
    );
    assert_eq!(
        like_with_mark(&acme, acme_key.mark(&key, "bob").unwrap()).await,
        Ok(true)
    );
    assert_eq!(
        like_with_mark(&default, secret.mark(&key, "alice").unwrap()).await,
        Ok(true)
    );
    assert_eq!(acme.get(&key).await.unwrap().unwrap().value, 2);
    let ids = |tenant: &str| {
        let (http, url, prefix) = (es.http.clone(), url.clone(), es.prefix.clone());
        let tenant = tenant.to_string();
        async move {
            let r: Value = http
                .get(format!(
                    "{url}/{prefix}_{tenant}_actor_marks/_search?size=100"
                ))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            r["hits"]["hits"]
                .as_array()
                .unwrap()
                .iter()
                .map(|h| h["_id"].as_str().unwrap().to_string())
                .collect::<Vec<_>>()
        }
    };
    es.refresh().await;
    let (on_acme, on_default) = (ids("acme").await, ids("default").await);
    assert_eq!(
        (on_acme.len(), on_default.len()),
        (2, 1),
        "{on_acme:?} {on_default:?}"
    );
    assert!(
        !on_acme.contains(&on_default[0]),
        "{on_acme:?} {on_default:?}"
    );
    assert!(on_acme.contains(&format!(
        "{}@{}",
        key.doc_id(),
        acme_key.mark(&key, "alice").unwrap().hex()
    )));
    es.cleanup().await;
}

/// A day's increment of `VIDEO/VIEW/<uuid>` at the tests' now.
fn video_view(uuid: &str, id: Option<String>) -> counter_gateway::domain::Increment {
    let ts_ms = common::test_now().timestamp_millis();
    counter_gateway::domain::Increment {
        key: counter_gateway::domain::CounterKey::new("VIDEO", "VIEW", uuid).unwrap(),
        delta: 1,
        category: None,
        ts_ms,
        day: ts_ms.div_euclid(86_400_000),
        id: id.map(Arc::from),
        kind: counter_gateway::domain::Kind::Counter,
        unique: None,
    }
}

/// Bulks side by side on the node (four in flight, no counter in two of
/// them, `tests/flush_overlap.rs`): 48 clients on skewed keys (half the
/// events on four hot counters), single events and batches of five, every
/// tenth request sent again with its ids by another client. Then a burst
/// closed at once. Every total is exact, each retried event counted once,
/// every submission answered 200 applied, or refused as shutting down and
/// not applied; the flusher stops only once the node answered every bulk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real search engine: the gate starts one (scripts/opensearch.sh), or set ELASTICSEARCH_URL"]
async fn bulks_side_by_side_count_exactly_and_a_close_drains_them() {
    use counter_gateway::pipeline::SubmitError;
    let url = cluster().await;
    let es = Es {
        url: url.clone(),
        prefix: prefix(),
        http: reqwest::Client::new(),
    };
    let mut cfg = EsConfig::new(&url, &es.prefix, "default").unwrap();
    cfg.bulks_in_flight = 4;
    let store: Arc<dyn Store> = Arc::new(
        ElasticsearchStore::open(cfg, clock(), true)
            .await
            .expect("setup against the cluster"),
    );
    assert_eq!(store.bulks_in_flight(), 4);
    let config = PipelineConfig {
        ack_timeout: Duration::from_secs(60),
        ..PipelineConfig::default()
    };
    let (pipeline, flusher) = Pipeline::start(store.clone(), config, Arc::new(Metrics::default()));
    let mut expected: std::collections::BTreeMap<String, i64> = Default::default();
    let mut seed: u64 = 11;
    let mut next = |m: u64| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) % m
    };
    let mut pick = move || {
        if next(2) == 0 {
            format!("hot{}", next(4))
        } else {
            format!("cold{}", next(300))
        }
    };
    const CLIENTS: usize = 48;
    let mut work: Vec<Vec<Vec<counter_gateway::domain::Increment>>> = vec![Vec::new(); CLIENTS];
    let mut retried = 0u32;
    for r in 0..1_200usize {
        let events: Vec<_> = if r % 10 == 9 {
            (0..5)
                .map(|j| video_view(&pick(), Some(format!("r{r}-e{j}"))))
                .collect()
        } else {
            vec![video_view(&pick(), None)]
        };
        for e in &events {
            *expected.entry(e.key.uuid.to_string()).or_default() += 1;
        }
        if r % 10 == 9 {
            retried += 5;
            work[(r + 1) % CLIENTS].push(events.clone());
        }
        work[r % CLIENTS].push(events);
    }
    let mut tasks = tokio::task::JoinSet::new();
    for list in work {
        let p = pipeline.clone();
        tasks.spawn(async move {
            let mut duplicates = 0;
            for events in list {
                duplicates += p.submit(events, None).await.expect("applied").duplicates;
            }
            duplicates
        });
    }
    let mut duplicates = 0;
    while let Some(d) = tasks.join_next().await {
        duplicates += d.expect("a client task");
    }
    assert_eq!(duplicates, retried, "each retried event counted once");
    // A burst of single increments, closed while it is queued and flushing.
    let mut burst = tokio::task::JoinSet::new();
    for i in 0..400usize {
        let p = pipeline.clone();
        let uuid = if i % 2 == 0 {
            format!("hot{}", i % 4)
        } else {
            format!("burst{i}")
        };
        burst.spawn(async move {
            let r = p.submit(vec![video_view(&uuid, None)], None).await;
            (uuid, r)
        });
    }
    tokio::task::yield_now().await;
    pipeline.close();
    let (mut applied, mut refused) = (0, 0);
    while let Some(r) = burst.join_next().await {
        match r.expect("a burst task") {
            (uuid, Ok(_)) => {
                applied += 1;
                *expected.entry(uuid).or_default() += 1;
            }
            (_, Err(SubmitError::ShuttingDown)) => refused += 1,
            (uuid, Err(e)) => panic!("{uuid}: {e:?}"),
        }
    }
    flusher.await.expect("the flusher stops");
    eprintln!("burst: {applied} applied, {refused} refused at close");
    let keys: Vec<_> = expected
        .keys()
        .map(|u| counter_gateway::domain::CounterKey::new("VIDEO", "VIEW", u).unwrap())
        .collect();
    let got = store.get_many(&keys).await.expect("read back");
    for ((uuid, want), got) in expected.iter().zip(got) {
        assert_eq!(got.map_or(0, |c| c.value), *want, "{uuid}");
    }
    es.cleanup().await;
}

/// One bulk of a counter increment (with its day bucket) and an average's
/// sample (with its bucket), every item named `op`: what the gateway sends
/// for one flush.
fn named_bulk(prefix: &str, op: &str) -> Vec<u8> {
    use counter_gateway::domain::{Increment, SampleSpec};
    use counter_gateway::store::elasticsearch::request::{self, IndexNames, WriteSettings};
    use counter_gateway::store::elasticsearch::templates;
    let now = common::test_now();
    let ts = common::rfc3339(now);
    let sample = Increment::sample(
        &SampleSpec {
            entity: "ARTICLE",
            action: "rating",
            uuid: "replayed",
            value: 4,
            retract: false,
            category: None,
            timestamp: Some(&ts),
            id: None,
        },
        &TimePolicy::default(),
        now,
    )
    .unwrap();
    let mut view = video_view("replayed", None);
    view.delta = 3;
    let requests = [vec![view], vec![sample]];
    let slices: Vec<&[Increment]> = requests.iter().map(Vec::as_slice).collect();
    let plan = request::plan(&slices, i64::MAX).unwrap();
    assert_eq!(
        plan.writes.len(),
        4,
        "counter, bucket, average, average bucket"
    );
    let names = IndexNames::new(prefix, "default").unwrap();
    let settings = WriteSettings {
        counter_script: templates::counter_script_id(prefix),
        bucket_script: templates::bucket_script_id(prefix),
        average_script: templates::average_script_id(prefix),
        average_bucket_script: templates::average_bucket_script_id(prefix),
        retry_on_conflict: 5,
        now_ms: now.timestamp_millis(),
        id_window_ms: 7 * 86_400_000,
        max_ids: 10_000,
    };
    let actions: Vec<_> = plan
        .writes
        .iter()
        .map(|w| request::action(w, &names, &settings, op, true))
        .collect();
    let refs: Vec<_> = actions.iter().collect();
    request::bulk_body(&refs, 5)
}

impl Es {
    /// Sends a `_bulk` body; every item must come back 200.
    async fn bulk(&self, body: Vec<u8>) -> Vec<String> {
        let r: Value = self
            .http
            .post(format!("{}/_bulk", self.url))
            .header("content-type", "application/x-ndjson")
            .body(body)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(r["errors"], json!(false), "{r}");
        r["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["update"]["result"].as_str().unwrap().to_string())
            .collect()
    }

    /// The counter's value, its bucket's, the average's (sum, quantity)
    /// and its bucket's, read from the node.
    async fn replayed_totals(&self) -> Value {
        self.refresh().await;
        let mut out = Vec::new();
        for (pattern, field) in [
            ("default_counters", "value"),
            ("default_histogram_counters-*", "value"),
            ("default_average_counters", "sum"),
            ("default_average_counters", "quantity"),
            ("default_average_histogram_counters-*", "sum"),
            ("default_average_histogram_counters-*", "quantity"),
        ] {
            let r: Value = self
                .http
                .post(format!("{}/{}_{pattern}/_search", self.url, self.prefix))
                .json(&json!({"size": 0, "aggs": {"total": {"sum": {"field": field}}}}))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            out.push(r["aggregations"]["total"]["value"].as_f64().unwrap() as i64);
        }
        json!(out)
    }
}

/// What the node does when a primary fails after its replica took a bulk
/// item: it runs the item again on the new primary. Sent twice here, by
/// hand, the same named bulk changes each of its four documents once (the
/// second run answers `noop`); a bulk of another name adds again. A
/// document remembers the last `MAX_OPS_PER_DOC` names, and no more: past
/// them, the first name counts as new (the bound the store README states).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real search engine: the gate starts one (scripts/opensearch.sh), or set ELASTICSEARCH_URL"]
async fn a_replayed_bulk_item_changes_its_document_once() {
    use counter_gateway::store::elasticsearch::request::MAX_OPS_PER_DOC;
    let (es, _r) = start().await;
    let once = json!([3, 3, 4, 1, 4, 1]);
    assert_eq!(
        es.bulk(named_bulk(&es.prefix, "op-a")).await,
        ["created"; 4]
    );
    assert_eq!(es.replayed_totals().await, once);
    assert_eq!(es.bulk(named_bulk(&es.prefix, "op-a")).await, ["noop"; 4]);
    assert_eq!(es.replayed_totals().await, once, "a replay changes nothing");
    assert_eq!(
        es.bulk(named_bulk(&es.prefix, "op-b")).await,
        ["updated"; 4]
    );
    assert_eq!(es.replayed_totals().await, json!([6, 6, 8, 2, 8, 2]));
    // op-a and op-b are remembered; MAX_OPS_PER_DOC - 2 more keep op-a...
    for n in 0..MAX_OPS_PER_DOC - 2 {
        es.bulk(named_bulk(&es.prefix, &format!("op-{n}"))).await;
    }
    assert_eq!(es.bulk(named_bulk(&es.prefix, "op-a")).await, ["noop"; 4]);
    // ...and one more forgets it.
    es.bulk(named_bulk(&es.prefix, "op-last")).await;
    assert_eq!(
        es.bulk(named_bulk(&es.prefix, "op-a")).await,
        ["updated"; 4]
    );
    let n = i64::from(MAX_OPS_PER_DOC) + 2;
    assert_eq!(
        es.replayed_totals().await,
        json!([3 * n, 3 * n, 4 * n, n, 4 * n, n])
    );
    es.cleanup().await;
}

/// Counter and bucket indices an earlier version made lack `applied_ops`,
/// and their strict mappings would refuse every update of the v2 scripts:
/// setup adds the field to them, so a gateway upgraded over old indices
/// counts at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real search engine: the gate starts one (scripts/opensearch.sh), or set ELASTICSEARCH_URL"]
async fn setup_adds_applied_ops_to_indices_an_older_version_created() {
    use counter_gateway::store::elasticsearch::request::IndexNames;
    let (es, _r) = start().await;
    for name in [
        "counter-mappings",
        "bucket-mappings",
        "average-mappings",
        "average-bucket-mappings",
    ] {
        let url = format!("{}/_component_template/{}-{name}", es.url, es.prefix);
        let mut got: Value = es
            .http
            .get(&url)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let mut old = got["component_templates"][0]["component_template"].take();
        let props = old["template"]["mappings"]["properties"]
            .as_object_mut()
            .unwrap();
        assert!(props.remove("applied_ops").is_some(), "{name}");
        // An older version's template, so setup puts the current one back.
        old["version"] = json!(1);
        let put = es.http.put(&url).json(&old).send().await.unwrap();
        assert!(put.status().is_success(), "{}", put.text().await.unwrap());
    }
    let names = IndexNames::new(&es.prefix, "default").unwrap();
    let day = common::test_now().timestamp_millis().div_euclid(86_400_000);
    let old = [
        names.counters(),
        names.buckets(day),
        names.averages(),
        names.average_buckets(day),
    ];
    for index in &old {
        let put = es
            .http
            .put(format!("{}/{index}", es.url))
            .send()
            .await
            .unwrap();
        assert!(put.status().is_success(), "{}", put.text().await.unwrap());
    }
    let mapping = |index: String| {
        let es = &es;
        async move {
            es.http
                .get(format!("{}/{index}/_mapping", es.url))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap()
        }
    };
    for index in &old {
        assert!(
            !mapping(index.clone()).await.contains("applied_ops"),
            "{index}"
        );
    }
    // The node refuses the v2 scripts' write on such an index.
    let r: Value = es
        .http
        .post(format!("{}/_bulk", es.url))
        .header("content-type", "application/x-ndjson")
        .body(named_bulk(&es.prefix, "op-old"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["errors"], json!(true), "{r}");
    assert!(
        r.to_string().contains("strict_dynamic_mapping_exception"),
        "{r}"
    );
    // A gateway opened now runs setup, which brings the field.
    let r = es_router(&es.url, &es.prefix, clock()).await;
    for index in &old {
        assert!(
            mapping(index.clone()).await.contains("applied_ops"),
            "{index}"
        );
    }
    let ts = common::rfc3339(common::test_now());
    let (s, b) = call(
        &r,
        "POST",
        "/v1/counters/VIDEO/VIEW/upgraded/increment",
        Some(json!({"timestamp": ts})),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(
        es.bulk(named_bulk(&es.prefix, "op-new")).await,
        ["created"; 4]
    );
    es.cleanup().await;
}

/// Increments racing a set of their counter on a real node: each
/// acknowledged before the set was sent is replaced by it, each sent after
/// the set's answer adds to it, the ones in between count at most once;
/// the buckets hold every increment exactly once (the set wrote none);
/// repeating the set answers the same value and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real search engine: the gate starts one (scripts/opensearch.sh), or set ELASTICSEARCH_URL"]
async fn increments_racing_a_set_of_their_counter_keep_its_order() {
    use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
    let (es, r) = start().await;
    let path = "/v1/counters/SET/v/hot";
    let (s, b) = call(&r, "POST", &format!("{path}/increment"), None).await;
    assert_eq!(s, 200, "{b}");
    let acked = Arc::new(AtomicI64::new(0));
    let after = Arc::new(AtomicI64::new(0));
    let set_done = Arc::new(AtomicBool::new(false));
    let adders: Vec<_> = (0..4)
        .map(|_| {
            let (r, acked, after, set_done) =
                (r.clone(), acked.clone(), after.clone(), set_done.clone());
            tokio::spawn(async move {
                for _ in 0..40 {
                    let sent_after_set = set_done.load(Ordering::SeqCst);
                    let (s, b) = call(&r, "POST", &format!("{path}/increment"), None).await;
                    assert_eq!(s, 200, "{b}");
                    acked.fetch_add(1, Ordering::SeqCst);
                    if sent_after_set {
                        after.fetch_add(1, Ordering::SeqCst);
                    }
                }
            })
        })
        .collect();
    while acked.load(Ordering::SeqCst) < 20 {
        tokio::task::yield_now().await;
    }
    let acked_before = acked.load(Ordering::SeqCst);
    let (s, b) = call(&r, "PUT", path, Some(json!({"value": 10_000}))).await;
    assert_eq!(s, 200, "{b}");
    set_done.store(true, Ordering::SeqCst);
    for a in adders {
        a.await.unwrap();
    }
    let (total, after) = (acked.load(Ordering::SeqCst), after.load(Ordering::SeqCst));
    let (_, b) = call(&r, "GET", path, None).await;
    let value = b["value"].as_i64().unwrap();
    assert!(
        value >= 10_000 + after && value <= 10_000 + (total - acked_before),
        "value {value}: {after} sent after the set, {acked_before} acknowledged before it, {total} in all"
    );
    es.refresh().await;
    let (_, h) = call(&r, "GET", &format!("{path}/histogram?interval=all"), None).await;
    assert_eq!(h["total"], json!(total + 1), "{h}");
    for _ in 0..2 {
        let (s, b) = call(&r, "PUT", path, Some(json!({"value": 7}))).await;
        assert_eq!((s, &b["value"]), (200, &json!(7)), "{b}");
    }
    es.refresh().await;
    let (_, h) = call(&r, "GET", &format!("{path}/histogram?interval=all"), None).await;
    assert_eq!(h["total"], json!(total + 1), "{h}");
    let (_, t) = call(&r, "GET", "/v1/top/SET/v", None).await;
    assert_eq!(t["counters"][0]["value"], json!(7), "{t}");
    es.cleanup().await;
}

/// Ranked top averages over more averages than one page holds (1,100: two
/// `composite` pages in a window) give the same lists, scores and `C` as
/// the embedded store, all time and in a window, by both ranks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real search engine: the gate starts one (scripts/opensearch.sh), or set ELASTICSEARCH_URL"]
async fn ranked_averages_past_one_page_match_the_embedded_store() {
    let (es, on_es) = start().await;
    let on_es = refreshing(on_es, &es.url, &es.prefix);
    let dir = tempfile::tempdir().unwrap();
    let sqlite: Arc<dyn Store> = Arc::new(
        SqliteStore::open(
            dir.path(),
            Durability::Relaxed,
            Duration::from_secs(86_400),
            TimePolicy::default().retention_days,
            clock(),
        )
        .unwrap(),
    );
    let embedded = router_over(sqlite, clock());
    // Target i: 1 to 4 samples on 1..5, some ten days ago, so the window
    // and all time differ; a deterministic mix with many ties.
    let mut samples = Vec::new();
    for i in 0..1100u64 {
        for s in 0..(i % 4 + 1) {
            let mut body = json!({"value": ((i * 3 + s * 7) % 5) + 1});
            if (i + s) % 3 == 0 {
                body["timestamp"] =
                    json!((common::test_now() - chrono::Duration::days(10)).to_rfc3339());
            }
            samples.push((format!("/v1/averages/PRODUCT/stars/p{i:04}"), body));
        }
    }
    for chunk in samples.chunks(64) {
        let mut tasks = tokio::task::JoinSet::new();
        for (path, body) in chunk.iter().cloned() {
            let (a, b) = (on_es.clone(), embedded.clone());
            tasks.spawn(async move {
                let (x, _) = call(&a, "POST", &path, Some(body.clone())).await;
                let (y, _) = call(&b, "POST", &path, Some(body)).await;
                assert_eq!((x, y), (200, 200), "{path}");
            });
        }
        while let Some(r) = tasks.join_next().await {
            r.unwrap();
        }
    }
    for query in [
        "rank=bayesian&size=50",
        "rank=bayesian&prior_weight=3&interval=last_week&size=50",
        "rank=bayesian&min_quantity=2&interval=last_month&size=1000",
        "rank=wilson&scale=1..5&size=50",
        "rank=wilson&scale=1..5&z=1&interval=last_week&size=50",
    ] {
        let path = format!("/v1/top-averages/PRODUCT/stars?{query}");
        let (a, x) = call(&on_es, "GET", &path, None).await;
        let (b, y) = call(&embedded, "GET", &path, None).await;
        assert_eq!((a, &x), (b, &y), "{path}");
        assert_eq!(a, 200, "{path}: {x}");
        assert!(!x["averages"].as_array().unwrap().is_empty(), "{path}");
        assert_eq!(x["exact"], json!(true), "{path}");
    }
    es.cleanup().await;
}

/// CountAPI on a real node: two creates of keys of one new namespace at
/// once make the namespace once (one admin key answered), the records are
/// in a strict, routed index made without automatic index creation, and
/// hold the admin key's SHA-256, never the key; the key made answers
/// `set` with that admin key, and `hit`s count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real search engine: the gate starts one (scripts/opensearch.sh), or set ELASTICSEARCH_URL"]
async fn countapi_namespaces_are_made_once_in_a_strict_routed_index() {
    let (es, r) = start().await;
    let settings = |value: Value| {
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
    // Only this test's CountAPI index is left to the gateway to create.
    settings(json!(format!("-{}_*_countapi,+*", es.prefix))).await;
    let (a, b) = tokio::join!(
        call(
            &r,
            "GET",
            "/countapi/create?namespace=race.example&key=first&value=3",
            None
        ),
        call(
            &r,
            "GET",
            "/countapi/create?namespace=race.example&key=second",
            None
        ),
    );
    settings(Value::Null).await;
    let index = format!("{}_default_countapi", es.prefix);
    let mapping: Value = es
        .http
        .get(format!("{}/{index}/_mapping", es.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let docs: Value = es
        .http
        .post(format!("{}/{index}/_search", es.url))
        .json(&json!({"size": 10, "query": {"match_all": {}}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let admin_keys: Vec<String> = [&a.1, &b.1]
        .iter()
        .filter_map(|v| v["admin_key"].as_str().map(str::to_string))
        .collect();
    let again = call(
        &r,
        "GET",
        "/countapi/create?namespace=race.example&key=first",
        None,
    )
    .await;
    let hit = call(&r, "GET", "/countapi/hit/race.example/first", None).await;
    let set = match admin_keys.first() {
        Some(k) => {
            call(
                &r,
                "GET",
                &format!("/countapi/set/race.example/second?value=9&admin_key={k}"),
                None,
            )
            .await
        }
        None => (0, Value::Null),
    };
    let info = call(&r, "GET", "/countapi/info/race.example/second", None).await;
    es.cleanup().await;
    assert_eq!((a.0, b.0), (200, 200), "{} {}", a.1, b.1);
    assert_eq!(admin_keys.len(), 1, "one admin key: {} {}", a.1, b.1);
    let m = &mapping[&index]["mappings"];
    assert_eq!(m["dynamic"], "strict", "{mapping}");
    assert_eq!(m["_routing"]["required"], true, "{mapping}");
    let hits = docs["hits"]["hits"].as_array().unwrap();
    assert_eq!(hits.len(), 3, "{docs}");
    let ns = hits
        .iter()
        .find(|h| h["_source"]["kind"] == "namespace")
        .unwrap();
    assert_eq!(
        ns["_source"]["admin_key_sha256"],
        json!(counter_gateway::auth::digest_hex(&admin_keys[0]))
    );
    assert!(!docs.to_string().contains(&admin_keys[0]), "{docs}");
    assert_eq!(again.0, 409, "{}", again.1);
    assert_eq!(hit, (200, json!({"value": 4})));
    assert_eq!(set, (200, json!({"old_value": 0, "value": 9})));
    assert_eq!(info.1["value"], 9, "{}", info.1);
}

/// Live updates on a cluster: a stream on one gateway shows the writes
/// made through another gateway of the same cluster (its poll, one `_mget`
/// of the watched counters per interval), its own, and a delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real search engine: the gate starts one (scripts/opensearch.sh), or set ELASTICSEARCH_URL"]
async fn a_stream_shows_writes_made_through_another_gateway() {
    let (es, streaming) = start().await;
    let other = es_router(&es.url, &es.prefix, clock()).await;
    call(
        &other,
        "POST",
        "/v1/counters/S/view/x/increment",
        Some(json!({"count": 2})),
    )
    .await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let served = streaming.clone();
    tokio::spawn(async move {
        axum::serve(
            listener,
            served.into_make_service_with_connect_info::<std::net::SocketAddr>(),
        )
        .await
        .unwrap()
    });
    let mut s = common::sse::Events::open(
        common::client().get(format!("http://{addr}/v1/stream?keys=S/view/x,S/view/y")),
    )
    .await
    .unwrap_or_else(|r| panic!("{} {}", r.status, r.text));
    // The current values at once, by a realtime read: no refresh needed.
    let x = s.counter().await;
    assert_eq!((&x["found"], &x["value"]), (&json!(true), &json!(2)), "{x}");
    assert_eq!(s.counter().await["found"], false);
    // Through the other gateway: this one learns of it by its poll only.
    let (st, _) = call(
        &other,
        "POST",
        "/v1/counters/S/view/x/increment",
        Some(json!({"count": 3})),
    )
    .await;
    assert_eq!(st, 200);
    s.until("x", 5).await;
    let (st, _) = call(&other, "POST", "/v1/counters/S/view/y/increment", None).await;
    assert_eq!(st, 200);
    s.until("y", 1).await;
    // Through this one, then deleted through the other.
    let (st, _) = call(&streaming, "POST", "/v1/counters/S/view/x/increment", None).await;
    assert_eq!(st, 200);
    s.until("x", 6).await;
    let (st, _) = call(&other, "DELETE", "/v1/counters/S/view/x", None).await;
    assert_eq!(st, 200);
    let gone = s.until("x", 0).await.pop().unwrap();
    assert_eq!(gone["found"], false, "{gone}");
    drop(s);
    es.cleanup().await;
}

/// Hour buckets on a real node: mixed traffic (several hours and two days,
/// a retried id, a decrement), then every day's hours sum to its day
/// bucket, the lists of the last hour and 24 hours agree with them, and a
/// backfilled day says it is not exact. With `--nocapture` it prints the
/// hour indices' store size per document (`_cat/indices`), the figure of
/// scripts/bench/README.md ("Hour buckets").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real search engine: the gate starts one (scripts/opensearch.sh), or set ELASTICSEARCH_URL"]
async fn hour_buckets_sum_to_their_days_on_a_real_node() {
    let url = cluster().await;
    let es = Es {
        url: url.clone(),
        prefix: prefix(),
        http: reqwest::Client::new(),
    };
    // 00:30 of the test's day: the last 24 hours reach into yesterday.
    let day0 = common::test_now().date_naive();
    let now = day0.and_hms_opt(0, 30, 0).unwrap().and_utc();
    let manual = ManualClock::new(now);
    let r = refreshing(
        es_router(&url, &es.prefix, manual.clock()).await,
        &url,
        &es.prefix,
    );
    let ts = |minutes_ago: i64| {
        (now - chrono::Duration::minutes(minutes_ago))
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    };
    let mut events = Vec::new();
    for i in 0..40i64 {
        events.push(json!({"entity": "VIDEO", "action": "VIEW", "uuid": format!("h{}", i % 4),
            "count": i + 1, "timestamp": ts(i * 37), "category": if i % 4 == 0 { "news" } else { "sports" }}));
    }
    events.push(
        json!({"entity": "VIDEO", "action": "VIEW", "uuid": "h1", "count": 1000, "id": "once"}),
    );
    let (s, b) = call(
        &r,
        "POST",
        "/v1/events",
        Some(json!({"events": events.clone()})),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    // The same id again: counted once, in the hour as in the day.
    let (s, b) = call(
        &r,
        "POST",
        "/v1/events",
        Some(json!({"events": [events[40].clone()]})),
    )
    .await;
    assert_eq!((s, &b["duplicates"]), (200, &json!(1)), "{b}");
    let (s, b) = call(
        &r,
        "POST",
        "/v1/counters/VIDEO/VIEW/h2/decrement",
        Some(json!({"count": 3})),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    let mut last_24 = Vec::new();
    for u in 0..4 {
        let path = |q: &str| format!("/v1/counters/VIDEO/VIEW/h{u}/histogram?{q}");
        let (s, days) = call(&r, "GET", &path("interval=last_week"), None).await;
        assert_eq!(s, 200, "{days}");
        for d in [day0 - chrono::Duration::days(1), day0] {
            let d = d.format("%Y-%m-%d").to_string();
            let want = days["buckets"]
                .as_array()
                .unwrap()
                .iter()
                .find(|b| b["day"] == d.as_str())
                .map_or(0, |b| b["value"].as_i64().unwrap());
            let (s, hours) = call(
                &r,
                "GET",
                &path(&format!("bucket=hour&from={d}&to={d}")),
                None,
            )
            .await;
            assert_eq!(s, 200, "{hours}");
            assert_eq!(hours["total"], want, "h{u} on {d}: {hours}");
            assert_eq!(hours["exact"], true);
        }
        let (_, h) = call(&r, "GET", &path("bucket=hour"), None).await;
        last_24.push((format!("h{u}"), h["total"].as_i64().unwrap()));
    }
    last_24.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let (s, top) = call(&r, "GET", "/v1/top/VIDEO/VIEW?interval=last_24_hours", None).await;
    assert_eq!(s, 200, "{top}");
    let listed: Vec<(String, i64)> = top["counters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["uuid"].as_str().unwrap().to_string(),
                c["value"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(listed, last_24);
    assert_eq!(top["exact"], true);
    let (_, news) = call(
        &r,
        "GET",
        "/v1/top/VIDEO/VIEW?interval=last_hour&category=news",
        None,
    )
    .await;
    assert!(
        news["counters"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["uuid"] == "h0"),
        "{news}"
    );
    // A backfilled yesterday: hours over it are not exact.
    let yesterday = (day0 - chrono::Duration::days(1))
        .format("%Y-%m-%d")
        .to_string();
    let (s, b) = call(
        &r,
        "PUT",
        &format!("/v1/counters/VIDEO/VIEW/h1/days/{yesterday}"),
        Some(json!({"value": 1})),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    let (_, h) = call(
        &r,
        "GET",
        &format!("/v1/counters/VIDEO/VIEW/h1/histogram?bucket=hour&from={yesterday}"),
        None,
    )
    .await;
    assert_eq!(h["exact"], false, "{h}");
    // Storage per hour document, as the node reports it.
    es.refresh().await;
    let cat: Value = es
        .http
        .get(format!(
            "{url}/_cat/indices/{}_*?format=json&bytes=b&h=index,docs.count,store.size",
            es.prefix
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    for i in cat.as_array().into_iter().flatten() {
        println!("{i}");
    }
    assert!(es.count("default_hour_counters-*").await > 0);
    es.cleanup().await;
}
