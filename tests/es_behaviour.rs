//! Behaviour of the Elasticsearch store against a local HTTP server that
//! answers like Elasticsearch (shapes from `tests/fixtures/es/responses/`,
//! which follow the documented ones): success, `errors: true` with mixed
//! items, 429, 503, 409 after retries, the overflow script error, connection
//! refused. Each test checks which items were resent, what was acknowledged
//! and what the client sees. Back-off uses the fast test variant.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Method, Request, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use chrono::Utc;
use counter_gateway::domain::{CounterKey, Increment, IncrementSpec, TimePolicy};
use counter_gateway::metrics::Metrics;
use counter_gateway::pipeline::{Pipeline, PipelineConfig};
use counter_gateway::store::elasticsearch::config::EsConfig;
use counter_gateway::store::elasticsearch::retry::Backoff;
use counter_gateway::store::elasticsearch::ElasticsearchStore;
use counter_gateway::store::{RequestOutcome, Store, WriteBatch};
use counter_gateway::{router, AppState, Limits};
use http_body_util::BodyExt;
use serde_json::{json, Map, Value};
use tower::ServiceExt;

// ---------------------------------------------------------------------------
// The fake cluster
// ---------------------------------------------------------------------------

/// Decides the fate of one bulk item: `None` applies it, `Some((status,
/// error))` answers that error instead. Arguments: bulk call number (0-based)
/// and the item's `_id`.
type ItemFault = Box<dyn Fn(usize, &str) -> Option<(u16, Value)> + Send>;
/// Answers a whole bulk call with `(status, body)` instead of handling it.
type RequestFault = Box<dyn Fn(usize) -> Option<(u16, Value)> + Send>;

#[derive(Default)]
struct State {
    /// `(index, _id)` -> `_source`.
    docs: HashMap<(String, String), Map<String, Value>>,
    /// Every bulk call: the `_id` of each item, in order.
    bulks: Vec<Vec<String>>,
    /// Every bulk call's raw body and content type.
    raw: Vec<(String, Vec<u8>)>,
    /// Every other call: `METHOD path?query`.
    calls: Vec<String>,
    item_fault: Option<ItemFault>,
    request_fault: Option<RequestFault>,
}

#[derive(Clone, Default)]
struct Fake(Arc<Mutex<State>>);

fn fixture(name: &str) -> Value {
    let path = format!(
        "{}/tests/fixtures/es/responses/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// The error objects of the captured mixed answer, by status.
fn item_error(status: u16) -> Value {
    let mixed = fixture("bulk_mixed.json");
    mixed["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| &i["update"])
        .find(|i| i["status"] == json!(status))
        .map(|i| i["error"].clone())
        .unwrap_or_else(|| panic!("no item with status {status} in bulk_mixed.json"))
}

/// The overflow error as the script raises it, for `counter_id`.
fn overflow_error(counter_id: &str) -> Value {
    let mut e = item_error(400);
    assert_eq!(e["type"], "illegal_argument_exception");
    e["caused_by"]["caused_by"]["reason"] = json!(format!(
        "counter_overflow: counter {counter_id} would leave the signed 64-bit range"
    ));
    e
}

fn n(v: &Value) -> i128 {
    i128::from(v.as_i64().unwrap_or(0))
}

/// What the stored scripts do, in Rust: the fake applies params the way the
/// Painless source does (see `index-templates/scripts/`).
fn run_script(src: &mut Map<String, Value>, p: &Value, bucket: bool) -> Result<(), String> {
    if !src.contains_key("counter_id") {
        for f in ["counter_id", "entity", "action", "uuid"] {
            src.insert(f.into(), p[f].clone());
        }
        if bucket {
            src.insert("day".into(), p["day"].clone());
        }
    }
    let mut total = src.get("value").map_or(0, n) + n(&p["delta"]);
    let mut first = p["first_ms"].as_i64();
    let mut last = p["last_ms"].as_i64();
    let mut category = p["category"].as_str().map(str::to_string);
    let mut cat_pos = p["category_pos"].as_i64().unwrap_or(-1);
    let mut seen = src
        .get("event_ids")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    for id in p["forget"].as_array().into_iter().flatten() {
        seen.remove(id.as_str().unwrap());
    }
    let mut skipped = Vec::new();
    for (i, e) in p["events"].as_array().into_iter().flatten().enumerate() {
        let id = e[0].as_str().unwrap();
        if seen.contains_key(id) {
            skipped.push(json!(i));
            continue;
        }
        seen.insert(id.into(), p["now_ms"].clone());
        total += n(&e[1]);
        let ts = e[2].as_i64().unwrap();
        first = Some(first.map_or(ts, |f| f.min(ts)));
        last = Some(last.map_or(ts, |l| l.max(ts)));
        if let Some(c) = e[3].as_str() {
            if e[4].as_i64().unwrap() > cat_pos {
                category = Some(c.into());
                cat_pos = e[4].as_i64().unwrap();
            }
        }
    }
    let value = i64::try_from(total).map_err(|_| "overflow".to_string())?;
    src.insert("value".into(), json!(value));
    if let Some(c) = category {
        src.insert("category".into(), json!(c));
    }
    if !bucket {
        if let Some(f) = first {
            let old = src.get("first_timestamp").and_then(Value::as_i64);
            src.insert("first_timestamp".into(), json!(old.map_or(f, |o| o.min(f))));
        }
        if let Some(l) = last {
            let old = src.get("recorded_timestamp").and_then(Value::as_i64);
            src.insert(
                "recorded_timestamp".into(),
                json!(old.map_or(l, |o| o.max(l))),
            );
        }
    }
    if seen.is_empty() {
        src.remove("event_ids");
    } else {
        src.insert("event_ids".into(), Value::Object(seen));
    }
    if skipped.is_empty() {
        src.remove("skipped_events");
    } else {
        src.insert("skipped_events".into(), Value::Array(skipped));
    }
    Ok(())
}

fn filtered(src: &Map<String, Value>, includes: &Value) -> Value {
    let mut out = Map::new();
    for f in includes.as_array().into_iter().flatten() {
        let f = f.as_str().unwrap();
        if let Some(v) = src.get(f) {
            out.insert(f.into(), v.clone());
        }
    }
    Value::Object(out)
}

fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let h = u8::from_str_radix(&s[i + 1..i + 3], 16).unwrap();
            out.push(h);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

fn es(status: u16, body: Value) -> Response {
    (
        StatusCode::from_u16(status).unwrap(),
        [
            ("content-type", "application/json"),
            ("x-elastic-product", "Elasticsearch"),
        ],
        body.to_string(),
    )
        .into_response()
}

impl Fake {
    fn bulk(&self, headers: &HeaderMap, body: Bytes) -> Response {
        let mut st = self.0.lock().unwrap();
        let call = st.bulks.len();
        let ct = headers
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        st.raw.push((ct, body.to_vec()));
        let text = std::str::from_utf8(&body).unwrap();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let ids: Vec<String> = lines
            .chunks(2)
            .map(|c| c[0]["update"]["_id"].as_str().unwrap().to_string())
            .collect();
        st.bulks.push(ids);
        if let Some((status, body)) = st.request_fault.as_ref().and_then(|f| f(call)) {
            return es(status, body);
        }
        let mut items = Vec::new();
        let mut errors = false;
        for pair in lines.chunks(2) {
            let meta = &pair[0]["update"];
            let payload = &pair[1];
            let index = meta["_index"].as_str().unwrap().to_string();
            let id = meta["_id"].as_str().unwrap().to_string();
            let bucket = index.contains("_histogram_counters-");
            if bucket {
                assert!(meta["routing"].is_string(), "bucket items are routed");
            }
            assert_eq!(meta["retry_on_conflict"], json!(5));
            assert_eq!(payload["scripted_upsert"], json!(true));
            let fault = st.item_fault.as_ref().and_then(|f| f(call, &id));
            if let Some((status, error)) = fault {
                errors = true;
                items.push(json!({"update": {"_index": index, "_id": id, "status": status, "error": error}}));
                continue;
            }
            let key = (index.clone(), id.clone());
            let existed = st.docs.contains_key(&key);
            let mut src = st.docs.get(&key).cloned().unwrap_or_default();
            let params = &payload["script"]["params"];
            match run_script(&mut src, params, bucket) {
                Ok(()) => {
                    let got = filtered(&src, &payload["_source"]["includes"]);
                    st.docs.insert(key, src);
                    items.push(json!({"update": {
                        "_index": index, "_id": id, "_version": 1,
                        "result": if existed { "updated" } else { "created" },
                        "_shards": {"total": 2, "successful": 1, "failed": 0},
                        "_seq_no": call, "_primary_term": 1,
                        "status": if existed { 200 } else { 201 },
                        "get": {"_seq_no": call, "_primary_term": 1, "found": true, "_source": got}
                    }}));
                }
                Err(_) => {
                    errors = true;
                    let cid = params["counter_id"].as_str().unwrap();
                    items.push(json!({"update": {"_index": index, "_id": id, "status": 400, "error": overflow_error(cid)}}));
                }
            }
        }
        es(200, json!({"took": 3, "errors": errors, "items": items}))
    }

    fn handle(&self, method: Method, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
        let path = uri.path().to_string();
        let query = uri.query().unwrap_or("").to_string();
        if path == "/_bulk" {
            return self.bulk(&headers, body);
        }
        let mut st = self.0.lock().unwrap();
        st.calls.push(format!("{method} {path}?{query}"));
        let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        match (method.as_str(), parts.as_slice()) {
            ("GET", [""]) => es(200, fixture("root.json")),
            ("GET", ["_scripts" | "_ilm" | "_component_template" | "_index_template", ..]) => {
                es(404, json!({}))
            }
            ("PUT", ["_scripts" | "_ilm" | "_component_template" | "_index_template", ..]) => {
                es(200, json!({"acknowledged": true}))
            }
            ("GET", [index, "_doc", id]) => match st.docs.get(&(index.to_string(), decode(id))) {
                Some(src) => {
                    let mut f = fixture("get_found.json");
                    f["_index"] = json!(index);
                    f["_id"] = json!(decode(id));
                    f["_source"] = Value::Object(src.clone());
                    es(200, f)
                }
                None => es(404, fixture("get_missing.json")),
            },
            ("POST", [index, "_search"]) => {
                let q: Value = serde_json::from_slice(&body).unwrap();
                let filters = &q["query"]["bool"]["filter"];
                let entity = filters[0]["term"]["entity"].as_str().unwrap();
                let uuid = filters[1]["term"]["uuid"].as_str().unwrap();
                let mut hits: Vec<&Map<String, Value>> = st
                    .docs
                    .iter()
                    .filter(|((i, _), s)| {
                        i == index && s["entity"] == json!(entity) && s["uuid"] == json!(uuid)
                    })
                    .map(|(_, s)| s)
                    .collect();
                hits.sort_by_key(|s| s["action"].as_str().unwrap().to_string());
                let mut f = fixture("search_target.json");
                f["hits"]["hits"] = hits
                    .iter()
                    .map(|s| json!({"_index": index, "_id": s["counter_id"], "_score": null, "_source": s, "sort": [s["action"]]}))
                    .collect();
                es(200, f)
            }
            ("POST", [_, "_refresh"]) => es(
                200,
                json!({"_shards": {"total": 1, "successful": 1, "failed": 0}}),
            ),
            ("POST", [pattern, "_delete_by_query"]) => {
                assert!(query.contains("routing="), "bucket deletes are routed");
                let q: Value = serde_json::from_slice(&body).unwrap();
                let cid = q["query"]["term"]["counter_id"].clone();
                let prefix = pattern.trim_end_matches('*').to_string();
                let before = st.docs.len();
                st.docs
                    .retain(|(i, _), s| !(i.starts_with(&prefix) && s["counter_id"] == cid));
                let mut f = fixture("delete_by_query.json");
                let deleted = before - st.docs.len();
                f["deleted"] = json!(deleted);
                f["total"] = json!(deleted);
                es(200, f)
            }
            ("DELETE", [index, "_doc", id]) => {
                if st.docs.remove(&(index.to_string(), decode(id))).is_some() {
                    es(200, fixture("delete_found.json"))
                } else {
                    es(404, fixture("delete_not_found.json"))
                }
            }
            _ => es(
                400,
                json!({"error": {"type": "unexpected", "reason": format!("{method} {path}")}, "status": 400}),
            ),
        }
    }

    async fn start(&self) -> SocketAddr {
        let fake = self.clone();
        let app = Router::new().fallback(
            move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
                let fake = fake.clone();
                async move { fake.handle(method, uri, headers, body) }
            },
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        addr
    }

    fn set_item_fault(&self, f: impl Fn(usize, &str) -> Option<(u16, Value)> + Send + 'static) {
        self.0.lock().unwrap().item_fault = Some(Box::new(f));
    }

    fn set_request_fault(&self, f: impl Fn(usize) -> Option<(u16, Value)> + Send + 'static) {
        self.0.lock().unwrap().request_fault = Some(Box::new(f));
    }

    fn bulks(&self) -> Vec<Vec<String>> {
        self.0.lock().unwrap().bulks.clone()
    }

    fn value(&self, index: &str, id: &str) -> Option<i64> {
        let st = self.0.lock().unwrap();
        st.docs
            .get(&(index.to_string(), id.to_string()))
            .map(|s| s["value"].as_i64().unwrap())
    }

    fn put_value(&self, index: &str, id: &str, value: i64) {
        let mut st = self.0.lock().unwrap();
        let (e, a, u) = counter_gateway::domain::decode_doc_id(id).unwrap();
        let now = Utc::now().timestamp_millis();
        let src = json!({"counter_id": id, "entity": e, "action": a, "uuid": u, "value": value,
            "first_timestamp": now, "recorded_timestamp": now});
        st.docs.insert(
            (index.to_string(), id.to_string()),
            src.as_object().unwrap().clone(),
        );
    }
}

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

const COUNTERS: &str = "counter-gateway_default_counters";

fn today_buckets() -> String {
    format!(
        "counter-gateway_default_histogram_counters-{}",
        Utc::now().format("%Y.%m")
    )
}

fn bucket_id(counter_id: &str) -> String {
    format!("{counter_id}@{}", Utc::now().format("%Y-%m-%d"))
}

fn store_at(url: &str) -> Arc<ElasticsearchStore> {
    let mut cfg = EsConfig::new(url, "counter-gateway", "default").unwrap();
    cfg.backoff = Backoff::for_test();
    cfg.request_timeout = Duration::from_secs(5);
    Arc::new(ElasticsearchStore::new(cfg).unwrap())
}

fn app(store: Arc<ElasticsearchStore>) -> Router {
    let metrics = Arc::new(Metrics::default());
    let config = PipelineConfig {
        ack_timeout: Duration::from_secs(5),
        ..PipelineConfig::default()
    };
    let (pipeline, _flusher) = Pipeline::start(store.clone(), config, metrics.clone());
    router(AppState {
        store,
        pipeline,
        time_policy: TimePolicy::default(),
        limits: Limits::default(),
        metrics,
    })
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

fn inc(uuid: &str, count: i64, id: Option<&str>) -> Increment {
    let spec = IncrementSpec {
        entity: "VIDEO",
        action: "VIEW",
        uuid,
        count: Some(count),
        id,
        ..Default::default()
    };
    Increment::from_spec(&spec, &TimePolicy::default(), Utc::now()).unwrap()
}

fn cid(uuid: &str) -> String {
    format!("VIDEO_VIEW_{uuid}")
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

#[tokio::test]
async fn increments_read_list_and_delete_through_the_router() {
    let fake = Fake::default();
    let addr = fake.start().await;
    let router = app(store_at(&format!("http://{addr}")));

    let (status, body) = call(
        &router,
        "POST",
        "/v1/counters/VIDEO/VIEW/u1/increment",
        Some(json!({"count": 2, "category": "sports"})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["value"], 2);
    assert_eq!(body["category"], "sports");
    let (status, body) = call(
        &router,
        "POST",
        "/v1/counters/VIDEO/VIEW/u1/decrement",
        None,
    )
    .await;
    assert_eq!((status, &body["value"]), (200, &json!(1)));
    call(
        &router,
        "POST",
        "/v1/counters/VIDEO/like/u1/increment",
        None,
    )
    .await;

    // One bulk per flush, a counter item and a bucket item each, as NDJSON.
    let bulks = fake.bulks();
    assert_eq!(bulks.len(), 3);
    assert_eq!(bulks[0], vec![cid("u1"), bucket_id(&cid("u1"))]);
    {
        let st = fake.0.lock().unwrap();
        for (ct, raw) in &st.raw {
            assert_eq!(ct, "application/x-ndjson");
            assert!(raw.ends_with(b"\n"));
        }
    }
    assert_eq!(
        fake.value(&today_buckets(), &bucket_id(&cid("u1"))),
        Some(1)
    );

    let (status, body) = call(&router, "GET", "/v1/counters/VIDEO/VIEW/u1", None).await;
    assert_eq!((status, &body["value"]), (200, &json!(1)));
    let (status, body) = call(&router, "GET", "/v1/targets/VIDEO/u1/counters", None).await;
    assert_eq!(status, 200);
    let actions: Vec<_> = body["counters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["VIEW", "like"]);

    let (status, _) = call(&router, "DELETE", "/v1/counters/VIDEO/VIEW/u1", None).await;
    assert_eq!(status, 200);
    assert_eq!(fake.value(&today_buckets(), &bucket_id(&cid("u1"))), None);
    let (status, _) = call(&router, "GET", "/v1/counters/VIDEO/VIEW/u1", None).await;
    assert_eq!(status, 404);
    let (status, _) = call(&router, "DELETE", "/v1/counters/VIDEO/VIEW/u1", None).await;
    assert_eq!(status, 404);
    let (status, _) = call(&router, "GET", "/readyz", None).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn mixed_item_errors_resend_only_the_failed_items() {
    let fake = Fake::default();
    let addr = fake.start().await;
    let store = store_at(&format!("http://{addr}"));
    let b_counter = cid("b");
    let c_bucket = bucket_id(&cid("c"));
    let (bc, cb) = (b_counter.clone(), c_bucket.clone());
    fake.set_item_fault(move |call, id| match call {
        0 if id == bc => Some((429, item_error(429))),
        0 if id == cb => Some((503, item_error(503))),
        _ => None,
    });
    let batch = WriteBatch {
        requests: vec![
            vec![inc("a", 1, None)],
            vec![inc("b", 2, None)],
            vec![inc("c", 3, None), inc("a", 4, None)],
        ],
    };
    let out = store.apply(batch).await.unwrap();
    assert_eq!(
        out.requests,
        vec![RequestOutcome::Applied { duplicates: 0 }; 3]
    );
    let bulks = fake.bulks();
    assert_eq!(bulks.len(), 2);
    assert_eq!(
        bulks[0].len(),
        6,
        "a, b, c: counter + bucket each (a coalesced)"
    );
    assert_eq!(
        bulks[1],
        vec![b_counter.clone(), c_bucket.clone()],
        "only the failed items are resent"
    );
    assert_eq!(out.store_writes, 8);
    // Nothing applied twice.
    assert_eq!(fake.value(COUNTERS, &cid("a")), Some(5));
    assert_eq!(fake.value(COUNTERS, &cid("b")), Some(2));
    assert_eq!(fake.value(&today_buckets(), &c_bucket), Some(3));
    assert_eq!(
        out.counters[&CounterKey::new("VIDEO", "VIEW", "b").unwrap()].value,
        2
    );
}

#[tokio::test]
async fn a_bulk_refused_with_429_is_resent_whole_once_accepted() {
    let fake = Fake::default();
    let addr = fake.start().await;
    let store = store_at(&format!("http://{addr}"));
    fake.set_request_fault(|call| (call < 2).then(|| (429, fixture("bulk_request_429.json"))));
    let out = store
        .apply(WriteBatch {
            requests: vec![vec![inc("a", 1, None)]],
        })
        .await
        .unwrap();
    assert_eq!(
        out.requests,
        vec![RequestOutcome::Applied { duplicates: 0 }]
    );
    assert_eq!(fake.bulks().len(), 3);
    assert_eq!(fake.value(COUNTERS, &cid("a")), Some(1));
}

#[tokio::test]
async fn a_conflict_that_outlives_retry_on_conflict_is_retried() {
    let fake = Fake::default();
    let addr = fake.start().await;
    let store = store_at(&format!("http://{addr}"));
    let a = cid("a");
    fake.set_item_fault(move |call, id| (call < 2 && id == a).then(|| (409, item_error(409))));
    let out = store
        .apply(WriteBatch {
            requests: vec![vec![inc("a", 1, None)]],
        })
        .await
        .unwrap();
    assert_eq!(
        out.requests,
        vec![RequestOutcome::Applied { duplicates: 0 }]
    );
    let bulks = fake.bulks();
    assert_eq!(bulks.len(), 3);
    assert_eq!(bulks[1], vec![cid("a")]);
    assert_eq!(bulks[2], vec![cid("a")]);
    assert_eq!(fake.value(COUNTERS, &cid("a")), Some(1));
    assert_eq!(fake.value(&today_buckets(), &bucket_id(&cid("a"))), Some(1));
}

#[tokio::test]
async fn a_persistent_503_fails_only_its_requests_after_the_budget() {
    let fake = Fake::default();
    let addr = fake.start().await;
    let store = store_at(&format!("http://{addr}"));
    let b = cid("b");
    fake.set_item_fault(move |_, id| (id == b).then(|| (503, item_error(503))));
    let started = std::time::Instant::now();
    let out = store
        .apply(WriteBatch {
            requests: vec![vec![inc("a", 1, None)], vec![inc("b", 1, None)]],
        })
        .await
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the budget bounds the wait"
    );
    assert_eq!(out.requests[0], RequestOutcome::Applied { duplicates: 0 });
    assert!(
        matches!(&out.requests[1], RequestOutcome::Failed { reason } if reason.contains("unavailable_shards_exception")),
        "{:?}",
        out.requests[1]
    );
    let bulks = fake.bulks();
    assert!(bulks.len() > 2);
    for resend in &bulks[1..] {
        assert_eq!(resend, &vec![cid("b")], "applied items are never resent");
    }
    // Not atomic across documents: b's bucket landed though b failed.
    assert_eq!(fake.value(&today_buckets(), &bucket_id(&cid("b"))), Some(1));
    assert_eq!(fake.value(COUNTERS, &cid("a")), Some(1));
}

#[tokio::test]
async fn a_coalesced_overflow_refuses_exactly_the_overflowing_requests() {
    let fake = Fake::default();
    let addr = fake.start().await;
    let store = store_at(&format!("http://{addr}"));
    fake.put_value(COUNTERS, &cid("k"), i64::MAX - 1);
    // r0 fits; r1 fits only without r0; r1 also touches j, which must not
    // keep r1's part; r2 on j alone is fine.
    let batch = WriteBatch {
        requests: vec![
            vec![inc("k", 1, None)],
            vec![inc("j", 5, None), inc("k", 1, None)],
            vec![inc("j", 1, None)],
        ],
    };
    let out = store.apply(batch).await.unwrap();
    assert_eq!(out.requests[0], RequestOutcome::Applied { duplicates: 0 });
    assert_eq!(
        out.requests[1],
        RequestOutcome::Overflow {
            key: CounterKey::new("VIDEO", "VIEW", "k").unwrap()
        }
    );
    assert_eq!(out.requests[2], RequestOutcome::Applied { duplicates: 0 });
    assert_eq!(fake.value(COUNTERS, &cid("k")), Some(i64::MAX));
    assert_eq!(fake.value(COUNTERS, &cid("j")), Some(1));
    assert_eq!(fake.value(&today_buckets(), &bucket_id(&cid("j"))), Some(1));
    assert_eq!(fake.value(&today_buckets(), &bucket_id(&cid("k"))), Some(1));
    assert_eq!(
        out.counters[&CounterKey::new("VIDEO", "VIEW", "k").unwrap()].value,
        i64::MAX
    );
}

#[tokio::test]
async fn the_client_sees_409_on_overflow() {
    let fake = Fake::default();
    let addr = fake.start().await;
    let router = app(store_at(&format!("http://{addr}")));
    fake.put_value(COUNTERS, &cid("k"), i64::MAX);
    let (status, body) = call(&router, "POST", "/v1/counters/VIDEO/VIEW/k/increment", None).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["type"], "counter_overflow");
    assert_eq!(fake.value(COUNTERS, &cid("k")), Some(i64::MAX));
    // The bucket that landed in the same bulk was taken back.
    assert_eq!(fake.value(&today_buckets(), &bucket_id(&cid("k"))), Some(0));
}

#[tokio::test]
async fn event_ids_are_counted_once_and_repair_a_partial_failure() {
    let fake = Fake::default();
    let addr = fake.start().await;
    let store = store_at(&format!("http://{addr}"));
    let bucket = bucket_id(&cid("a"));
    let failing = bucket.clone();
    // First flush: the bucket item keeps failing, the counter item lands.
    fake.set_item_fault(move |call, id| {
        (call < 100 && id == failing).then(|| (503, item_error(503)))
    });
    let out = store
        .apply(WriteBatch {
            requests: vec![vec![inc("a", 1, Some("e1"))]],
        })
        .await
        .unwrap();
    assert!(matches!(out.requests[0], RequestOutcome::Failed { .. }));
    assert_eq!(fake.value(COUNTERS, &cid("a")), Some(1));
    assert_eq!(fake.value(&today_buckets(), &bucket), None);
    // The client retries with the same id: the counter skips it, the bucket takes it.
    fake.set_item_fault(|_, _| None);
    let out = store
        .apply(WriteBatch {
            requests: vec![vec![inc("a", 1, Some("e1"))], vec![inc("a", 1, Some("e1"))]],
        })
        .await
        .unwrap();
    assert_eq!(out.requests[0], RequestOutcome::Applied { duplicates: 1 });
    assert_eq!(out.requests[1], RequestOutcome::Applied { duplicates: 1 });
    assert_eq!(fake.value(COUNTERS, &cid("a")), Some(1));
    assert_eq!(fake.value(&today_buckets(), &bucket), Some(1));
}

#[tokio::test]
async fn unreachable_elasticsearch_fails_readiness_and_writes_with_503() {
    // A port nobody listens on: connection refused.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let router = app(store_at(&format!("http://{addr}")));
    let (status, body) = call(&router, "GET", "/readyz", None).await;
    assert_eq!(status, 503, "{body}");
    let started = std::time::Instant::now();
    let (status, body) = call(&router, "POST", "/v1/counters/VIDEO/VIEW/a/increment", None).await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body["error"]["reason"]
            .as_str()
            .unwrap()
            .contains("unreachable"),
        "{body}"
    );
    assert!(started.elapsed() < Duration::from_secs(3));
    let (status, _) = call(&router, "GET", "/v1/counters/VIDEO/VIEW/a", None).await;
    assert_eq!(status, 503);
}

#[tokio::test]
async fn setup_installs_every_object_in_order() {
    let fake = Fake::default();
    let addr = fake.start().await;
    let store = store_at(&format!("http://{addr}"));
    let report = store.setup().await.unwrap();
    assert_eq!(report.installed.len(), 12);
    let calls = fake.0.lock().unwrap().calls.clone();
    let puts: Vec<_> = calls.iter().filter(|c| c.starts_with("PUT")).collect();
    assert_eq!(puts.len(), 12);
    assert!(puts[0].starts_with("PUT /_scripts/counter-gateway-counter-update-v1"));
    assert!(puts[11].starts_with("PUT /_index_template/counter-gateway-average_histogram_counters"));
}

#[tokio::test]
async fn a_lost_answer_is_never_resent() {
    // A server that reads the request and hangs up without answering: the
    // bulk may or may not have been applied, so it must not be sent again.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        loop {
            let (mut sock, _) = listener.accept().await.unwrap();
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let mut buf = vec![0u8; 64 * 1024];
            let _ = tokio::io::AsyncReadExt::read(&mut sock, &mut buf).await;
            drop(sock);
        }
    });
    let store = store_at(&format!("http://{addr}"));
    let out = store
        .apply(WriteBatch {
            requests: vec![vec![inc("a", 1, None)]],
        })
        .await
        .unwrap();
    assert!(
        matches!(&out.requests[0], RequestOutcome::Failed { reason } if reason.contains("outcome unknown")),
        "{:?}",
        out.requests[0]
    );
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_items_are_bounded_by_distinct_keys_not_requests() {
    let fake = Fake::default();
    let addr = fake.start().await;
    let store = store_at(&format!("http://{addr}"));
    let metrics = Arc::new(Metrics::default());
    let config = PipelineConfig {
        flush_interval: Duration::from_millis(5),
        ack_timeout: Duration::from_secs(5),
        ..PipelineConfig::default()
    };
    let (pipeline, _flusher) = Pipeline::start(store.clone(), config, metrics.clone());
    let router = router(AppState {
        store,
        pipeline,
        time_policy: TimePolicy::default(),
        limits: Limits::default(),
        metrics,
    });
    let mut tasks = Vec::new();
    for i in 0..300 {
        let router = router.clone();
        tasks.push(tokio::spawn(async move {
            let path = format!("/v1/counters/VIDEO/VIEW/k{}/increment", i % 3);
            call(&router, "POST", &path, None).await.0
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), 200);
    }
    let bulks = fake.bulks();
    let items: usize = bulks.iter().map(Vec::len).sum();
    // Three keys, one day: at most six items per flush, whatever the load.
    assert!(bulks.iter().all(|b| b.len() <= 6), "{bulks:?}");
    assert!(items < 300, "{items} bulk items for 300 increments");
    for k in 0..3 {
        assert_eq!(fake.value(COUNTERS, &cid(&format!("k{k}"))), Some(100));
    }
}
