//! Live updates, `GET /v1/stream?keys=...` (Server-Sent Events), over real
//! HTTP: on the embedded store (first values at once, updates after
//! writes, sets and deletes, coalescing, key roles and tenants, the bounds
//! on streams and keys, shutdown, idle streams reading nothing) and on a
//! fake Elasticsearch cluster (changes another gateway made arrive by the
//! poll, one `_mget` of every watched key per interval).

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{Method, Uri};
use common::sse::{Events, GUARD};
use common::{assert_error, counter_path, key_line, Options, TestApp};
use counter_gateway::api::stream::{StreamConfig, Streams};
use counter_gateway::domain::{ManualClock, TimePolicy};
use counter_gateway::metrics::Metrics;
use counter_gateway::pipeline::{Pipeline, PipelineConfig};
use counter_gateway::store::elasticsearch::config::EsConfig;
use counter_gateway::store::elasticsearch::ElasticsearchStore;
use counter_gateway::tenant::Tenants;
use counter_gateway::{gateway_router, AppState, Gateway, Limits};
use serde_json::{json, Value};

fn quick() -> StreamConfig {
    StreamConfig {
        interval: Duration::from_millis(50),
        keep_alive: Duration::from_millis(200),
        ..StreamConfig::default()
    }
}

async fn app_with(streams: StreamConfig, keys: String) -> TestApp {
    TestApp::start_with(Options {
        streams,
        keys,
        ..Options::default()
    })
    .await
}

async fn stream(app: &TestApp, query: &str) -> Events {
    match Events::open(app.http.get(app.url(&format!("/v1/stream?{query}")))).await {
        Ok(s) => s,
        Err(r) => panic!("{} {}", r.status, r.text),
    }
}

async fn add(app: &TestApp, uuid: &str, count: i64) {
    let r = app.increment("A", "V", uuid, json!({"count": count})).await;
    assert_eq!(r.status, 200, "{}", r.text);
}

#[tokio::test]
async fn the_current_values_come_at_once_each_key_once_with_sse_headers() {
    let app = app_with(quick(), String::new()).await;
    add(&app, "x", 3).await;
    let mut s = stream(&app, "keys=A/V/x,A/V/never,A/V/x").await;
    assert_eq!(s.header("content-type"), Some("text/event-stream"));
    assert_eq!(s.header("cache-control"), Some("no-cache"));
    assert_eq!(s.header("x-accel-buffering"), Some("no"));
    let first = s.block().await.unwrap();
    assert_eq!(first.retry.as_deref(), Some("3000"), "{first:?}");
    let x = s.counter().await;
    assert_eq!(
        (&x["id"], &x["found"], &x["value"]),
        (&json!("A_V_x"), &json!(true), &json!(3))
    );
    assert!(x["recorded_timestamp"].is_string(), "{x}");
    let never = s.counter().await;
    assert_eq!(
        never,
        json!({"id": "A_V_never", "entity": "A", "action": "V", "uuid": "never", "found": false, "value": 0})
    );
    // The repeated key is streamed once: the next thing is a keep-alive.
    s.keep_alives(1).await;
    // The multi-read answers the same entries.
    let r = app.get("/v1/counters?keys=A/V/x").await;
    assert_eq!(r.json["counters"][0], x);
}

#[tokio::test]
async fn writes_sets_and_deletes_arrive_and_a_deleted_counter_shows_found_false() {
    let app = app_with(quick(), String::new()).await;
    add(&app, "x", 1).await;
    let mut s = stream(&app, "keys=A/V/x,A/V/y").await;
    assert_eq!(s.counter().await["value"], 1);
    assert_eq!(s.counter().await["found"], false);
    add(&app, "x", 2).await;
    s.until("x", 3).await;
    add(&app, "y", 5).await;
    let c = s.until("y", 5).await.pop().unwrap();
    assert_eq!(c["found"], true);
    let r = app
        .send(
            app.http
                .put(app.url(&counter_path("A", "V", "x", "")))
                .json(&json!({"value": 40})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    s.until("x", 40).await;
    let r = app.delete(&counter_path("A", "V", "x", "")).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let gone = s.until("x", 0).await.pop().unwrap();
    assert_eq!(gone["found"], false, "{gone}");
    // A write that fails changes nothing, and nothing is sent: an
    // overflowing increment is refused, the next event is the next change.
    let r = app
        .increment("A", "V", "y", json!({"count": i64::MAX}))
        .await;
    assert_eq!(r.status, 409, "{}", r.text);
    add(&app, "y", 1).await;
    let next = s.counter().await;
    assert_eq!((&next["uuid"], &next["value"]), (&json!("y"), &json!(6)));
}

#[tokio::test]
async fn changes_within_an_interval_come_as_one_event_with_the_latest_value() {
    let app = app_with(
        StreamConfig {
            // Longer than the burst of writes below takes many times over.
            interval: Duration::from_secs(3),
            keep_alive: Duration::from_secs(60),
            ..StreamConfig::default()
        },
        String::new(),
    )
    .await;
    let mut s = stream(&app, "keys=A/V/x").await;
    assert_eq!(s.counter().await["value"], 0);
    for _ in 0..20 {
        add(&app, "x", 1).await;
    }
    let seen = s.until("x", 20).await;
    // One event, or two if an interval ended within the burst; never one
    // per write.
    assert!(seen.len() <= 2, "{seen:?}");
    let ids: Vec<&Value> = seen.iter().map(|c| &c["value"]).collect();
    assert_eq!(ids.last(), Some(&&json!(20)));
}

#[tokio::test]
async fn idle_streams_on_the_embedded_store_read_nothing() {
    let app = app_with(quick(), String::new()).await;
    let mut s = stream(&app, "keys=A/V/x").await;
    s.counter().await;
    // Several intervals without writes: the poller reads nothing.
    s.keep_alives(3).await;
    assert_eq!(app.metric("counter_gateway_stream_reads_total").await, 0.0);
    assert_eq!(app.metric("counter_gateway_streams_open").await, 1.0);
    add(&app, "x", 1).await;
    s.until("x", 1).await;
    assert!(app.metric("counter_gateway_stream_reads_total").await >= 1.0);
}

fn keyed() -> String {
    key_line("public", "acme", "pub")
        + &key_line("read", "acme", "rd")
        + &key_line("admin", "acme", "adm")
        + &key_line("write", "acme", "wr")
        + &key_line("read", "other", "rd-other")
        + &key_line("write", "other", "wr-other")
        + &key_line("admin", "*", "ops")
}

#[tokio::test]
async fn the_multi_reads_key_roles_and_tenants_apply() {
    let app = app_with(quick(), keyed()).await;
    let url = app.url("/v1/stream?keys=A/V/x");
    // Keys that may read values stream them; a page's EventSource sends
    // no header, so the key may come in the query.
    for key in ["pub", "rd", "adm"] {
        let mut s = Events::open(
            app.http
                .get(&url)
                .bearer_auth(key)
                .header("x-tenant", "acme"),
        )
        .await
        .unwrap_or_else(|r| panic!("{key}: {} {}", r.status, r.text));
        assert_eq!(s.counter().await["value"], 0);
        let cors = s.header("access-control-allow-origin");
        assert_eq!(cors, (key == "pub").then_some("*"), "{key}");
    }
    let q = app.url("/v1/stream?keys=A/V/x&key=pub&tenant=acme");
    let mut from_page = Events::open(app.http.get(&q))
        .await
        .unwrap_or_else(|r| panic!("{}", r.text));
    from_page.counter().await;
    // A write key may not read values, so it may not stream them.
    let r = Events::open(
        app.http
            .get(&url)
            .bearer_auth("wr")
            .header("x-tenant", "acme"),
    )
    .await
    .err()
    .expect("a write key is refused");
    assert_eq!(r.status, 403, "{}", r.text);
    let r = Events::open(app.http.get(&url))
        .await
        .err()
        .expect("no key");
    assert_eq!(r.status, 401, "{}", r.text);
    // A key of one tenant streams no other's.
    let r = Events::open(
        app.http
            .get(&url)
            .bearer_auth("rd")
            .header("x-tenant", "other"),
    )
    .await
    .err()
    .expect("another tenant");
    assert_eq!(r.status, 403, "{}", r.text);
    // The same key in two tenants: only the stream's tenant's writes arrive.
    let mut acme = Events::open(
        app.http
            .get(&url)
            .bearer_auth("rd")
            .header("x-tenant", "acme"),
    )
    .await
    .unwrap_or_else(|r| panic!("{}", r.text));
    assert_eq!(acme.counter().await["value"], 0);
    let mut other = Events::open(
        app.http
            .get(&url)
            .bearer_auth("rd-other")
            .header("x-tenant", "other"),
    )
    .await
    .unwrap_or_else(|r| panic!("{}", r.text));
    assert_eq!(other.counter().await["value"], 0);
    let write = |tenant: &'static str, key: &'static str, count: i64| {
        app.http
            .post(app.url(&counter_path("A", "V", "x", "/increment")))
            .bearer_auth(key)
            .header("x-tenant", tenant)
            .json(&json!({"count": count}))
    };
    assert_eq!(app.send(write("other", "wr-other", 5)).await.status, 200);
    assert_eq!(other.counter().await["value"], 5);
    assert_eq!(app.send(write("acme", "wr", 1)).await.status, 200);
    // Had the other tenant's 5 leaked, acme's stream would show it first.
    assert_eq!(acme.counter().await["value"], 1);
}

#[tokio::test]
async fn a_streamed_tenant_still_closes_when_idle_and_its_writes_arrive_after_reopening() {
    let app = app_with(quick(), String::new()).await;
    let write = |count: i64| {
        app.http
            .post(app.url(&counter_path("A", "V", "x", "/increment")))
            .header("x-tenant", "acme")
            .json(&json!({"count": count}))
    };
    assert_eq!(app.send(write(1)).await.status, 200);
    let mut s = Events::open(
        app.http
            .get(app.url("/v1/stream?keys=A/V/x"))
            .header("x-tenant", "acme"),
    )
    .await
    .unwrap_or_else(|r| panic!("{}", r.text));
    assert_eq!(s.counter().await["value"], 1);
    assert_eq!(app.send(write(1)).await.status, 200);
    s.until("x", 2).await;
    // The stream holds nothing of the tenant: it closes when idle.
    assert_eq!(app.tenants.close_idle(Duration::ZERO), 1);
    s.keep_alives(2).await;
    assert_eq!(app.metric("counter_gateway_tenants").await, 1.0);
    // A write opens it again (another store): the stream follows it.
    assert_eq!(app.send(write(3)).await.status, 200);
    s.until("x", 5).await;
}

#[tokio::test]
async fn streams_over_the_bound_are_refused_with_503_and_retry_after() {
    let app = app_with(
        StreamConfig {
            max_streams: 2,
            ..quick()
        },
        String::new(),
    )
    .await;
    let mut a = stream(&app, "keys=A/V/x").await;
    let b = stream(&app, "keys=A/V/y").await;
    a.counter().await;
    let r = Events::open(app.http.get(app.url("/v1/stream?keys=A/V/z")))
        .await
        .err()
        .expect("a third stream");
    assert_error(&r, 503, "unavailable", &["--max-streams", "at most 2"]);
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(
        app.metric("counter_gateway_streams_refused_total").await,
        1.0
    );
    // A closed stream gives its place back once the gateway notices (its
    // next keep-alive finds the connection gone).
    drop(b);
    loop {
        if app.metric("counter_gateway_streams_open").await == 1.0 {
            break;
        }
        a.keep_alives(1).await;
    }
    let mut c = stream(&app, "keys=A/V/z").await;
    assert_eq!(c.counter().await["uuid"], "z");
}

#[tokio::test]
async fn a_reader_that_stops_reading_is_dropped_not_buffered() {
    let app = app_with(
        StreamConfig {
            interval: Duration::from_millis(10),
            stall: Duration::from_millis(200),
            ..quick()
        },
        String::new(),
    )
    .await;
    let uuids: Vec<String> = (0..100)
        .map(|i| format!("u{i:03}-{}", "p".repeat(60)))
        .collect();
    let keys: Vec<String> = uuids.iter().map(|u| format!("A/V/{u}")).collect();
    // A client that asks and never reads, with a small receive window.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let addr: SocketAddr = app.base.trim_start_matches("http://").parse().unwrap();
    let mut conn = socket.connect(addr).await.unwrap();
    let request = format!(
        "GET /v1/stream?keys={} HTTP/1.1\r\nHost: {addr}\r\n\r\n",
        keys.join(",")
    );
    tokio::io::AsyncWriteExt::write_all(&mut conn, request.as_bytes())
        .await
        .unwrap();
    loop {
        if app.metric("counter_gateway_streams_open").await == 1.0 {
            break;
        }
        tokio::task::yield_now().await;
    }
    // Every key changes at every write: an event of each per interval,
    // until what the reader left unread fills every buffer on the way.
    let events: Vec<Value> = uuids
        .iter()
        .map(|u| json!({"entity": "A", "action": "V", "uuid": u}))
        .collect();
    let dropped = tokio::time::timeout(Duration::from_secs(120), async {
        loop {
            let r = app.post("/v1/events", json!({"events": events})).await;
            assert_eq!(r.status, 200, "{}", r.text);
            if app.metric("counter_gateway_streams_dropped_total").await >= 1.0 {
                return;
            }
        }
    })
    .await;
    assert!(dropped.is_ok(), "the stalled stream was never dropped");
    // The other streams go on.
    let mut s = stream(&app, "keys=A/V/x").await;
    s.counter().await;
    drop(conn);
}

#[tokio::test]
async fn key_lists_are_the_multi_reads() {
    let app = app_with(quick(), String::new()).await;
    let many = vec!["A/V/x"; 101].join(",");
    for (query, says) in [
        (format!("keys={many}"), "101 keys, over the limit of 100"),
        ("keys=A/V".into(), "keys[0] has 2 part(s)"),
        ("keys=A/V/x,A/V/".into(), "keys[1].uuid must not be empty"),
        (
            "keys=A/V/x&size=1".into(),
            "unknown query parameter \"size\"",
        ),
        (String::new(), "keys is required"),
    ] {
        let r = Events::open(app.http.get(app.url(&format!("/v1/stream?{query}"))))
            .await
            .err()
            .unwrap_or_else(|| panic!("{query} streamed"));
        assert_error(&r, 400, "invalid_request", &[says]);
        assert!(!r.text.contains("POST"), "{}", r.text);
    }
    assert_eq!(app.metric("counter_gateway_streams_open").await, 0.0);
}

#[tokio::test]
async fn streams_end_cleanly_at_shutdown() {
    let app = app_with(quick(), String::new()).await;
    let mut s = stream(&app, "keys=A/V/x").await;
    s.counter().await;
    let stopping = tokio::spawn(app.stop());
    let mut last = None;
    while let Some(b) = s.block().await {
        last = Some(b);
    }
    assert_eq!(
        last.and_then(|b| b.comment).as_deref(),
        Some("the gateway is shutting down")
    );
    tokio::time::timeout(GUARD, stopping)
        .await
        .expect("the server stopped")
        .expect("stop");
}

// ---------------------------------------------------------------------------
// On Elasticsearch: a fake cluster whose counter documents the tests change
// as another gateway would.
// ---------------------------------------------------------------------------

const COUNTERS: &str = "counter-gateway_default_counters";

/// Counter documents by id, and the ids of every `_mget` asked.
type Docs = (HashMap<String, Value>, Vec<Vec<String>>);

#[derive(Clone, Default)]
struct Fake(Arc<Mutex<Docs>>);

impl Fake {
    async fn start(&self) -> SocketAddr {
        let fake = self.clone();
        let app = axum::Router::new().fallback(move |method: Method, uri: Uri, body: Bytes| {
            let fake = fake.clone();
            async move { fake.handle(method, uri, body) }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        addr
    }

    /// The Multi get API as a node answers it (tests/es_behaviour.rs has
    /// the whole fake); anything else is a test's mistake.
    fn handle(&self, method: Method, uri: Uri, body: Bytes) -> axum::response::Response {
        let path = uri.path().trim_start_matches('/');
        let reply = |status: u16, body: Value| {
            axum::response::Response::builder()
                .status(status)
                .header("content-type", "application/json")
                .header("x-elastic-product", "Elasticsearch")
                .body(axum::body::Body::from(body.to_string()))
                .unwrap()
        };
        if method != Method::POST || path != format!("{COUNTERS}/_mget") {
            return reply(
                400,
                json!({"error": {"type": "unexpected", "reason": format!("{method} {uri}")}, "status": 400}),
            );
        }
        let q: Value = serde_json::from_slice(&body).unwrap();
        let ids: Vec<String> = q["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i.as_str().unwrap().to_string())
            .collect();
        let mut st = self.0.lock().unwrap();
        st.1.push(ids.clone());
        let docs: Vec<Value> = ids
            .iter()
            .map(|id| match st.0.get(id) {
                Some(src) => json!({"_index": COUNTERS, "_id": id, "_version": 1, "_seq_no": 0,
                    "_primary_term": 1, "found": true, "_source": src}),
                None => json!({"_index": COUNTERS, "_id": id, "found": false}),
            })
            .collect();
        reply(200, json!({"docs": docs}))
    }

    /// Another gateway's write: the document as the store keeps it.
    fn put(&self, uuid: &str, value: i64) {
        let id = format!("A_V_{uuid}");
        let now = common::test_now().timestamp_millis();
        let src = json!({"counter_id": id, "entity": "A", "action": "V", "uuid": uuid,
            "value": value, "first_timestamp": now, "recorded_timestamp": now + value});
        self.0.lock().unwrap().0.insert(id, src);
    }

    fn remove(&self, uuid: &str) {
        self.0.lock().unwrap().0.remove(&format!("A_V_{uuid}"));
    }

    fn mgets(&self) -> Vec<Vec<String>> {
        self.0.lock().unwrap().1.clone()
    }
}

/// The gateway over the fake cluster, served on a real listener.
async fn es_app(fake: &Fake) -> (String, Arc<Streams>) {
    let addr = fake.start().await;
    let mut cfg = EsConfig::new(&format!("http://{addr}"), "counter-gateway", "default").unwrap();
    cfg.request_timeout = Duration::from_secs(5);
    let clock = ManualClock::new(common::test_now()).clock();
    let store = Arc::new(ElasticsearchStore::new(cfg, clock.clone()).unwrap());
    let metrics = Arc::new(Metrics::default());
    let (pipeline, _flusher) =
        Pipeline::start(store.clone(), PipelineConfig::default(), metrics.clone());
    let state = AppState {
        store,
        pipeline,
        time_policy: TimePolicy::default(),
        clock,
        limits: Limits::default(),
        metrics,
        actors: counter_gateway::actors::Actors::new(
            counter_gateway::domain::ActorKey::new(b"a test secret of 32 bytes, long").unwrap(),
            None,
        ),
        pending: None,
    };
    let streams = Arc::new(Streams::new(quick()));
    let gw = Gateway {
        streams: streams.clone(),
        ..Gateway::open(Tenants::single(state))
    };
    let router = gateway_router(gw).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            router.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap()
    });
    (format!("http://{addr}"), streams)
}

#[tokio::test]
async fn on_elasticsearch_changes_through_other_gateways_arrive_by_the_poll() {
    let fake = Fake::default();
    fake.put("x", 7);
    let (base, _streams) = es_app(&fake).await;
    let http = common::client();
    let open = |q: &str| Events::open(http.get(format!("{base}/v1/stream?{q}")));
    let mut s = open("keys=A/V/x,A/V/y")
        .await
        .unwrap_or_else(|r| panic!("{}", r.text));
    let x = s.counter().await;
    assert_eq!((&x["found"], &x["value"]), (&json!(true), &json!(7)));
    assert_eq!(s.counter().await["found"], false);
    // Written by another gateway of the cluster: only the poll can see it.
    fake.put("y", 2);
    let y = s.until("y", 2).await.pop().unwrap();
    assert_eq!(y["found"], true);
    fake.put("x", 8);
    s.until("x", 8).await;
    fake.remove("x");
    let gone = s.until("x", 0).await.pop().unwrap();
    assert_eq!(gone["found"], false);
    // A second stream sharing a key: each poll is one `_mget` of every
    // watched key of the tenant, each once.
    let mut t = open("keys=A/V/y,A/V/z")
        .await
        .unwrap_or_else(|r| panic!("{}", r.text));
    assert_eq!(t.counter().await["value"], 2);
    let before = fake.mgets().len();
    fake.put("z", 1);
    t.until("z", 1).await;
    let polls: Vec<Vec<String>> = fake.mgets()[before..]
        .iter()
        .filter(|ids| ids.len() == 3)
        .cloned()
        .collect();
    assert!(!polls.is_empty(), "{:?}", fake.mgets());
    for mut ids in polls {
        ids.sort();
        assert_eq!(ids, ["A_V_x", "A_V_y", "A_V_z"]);
    }
}
