//! Tenants over HTTP: each tenant's counters are its own, whether the tenant
//! comes from `X-Tenant`, the `tenant` parameter or the key; names are
//! checked; the number of tenants is bounded; tenants survive a restart.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{assert_error, counter_path, key_line, Options, TestApp};
use counter_gateway::pipeline::PipelineConfig;
use counter_gateway::store::Store;
use counter_gateway::tenant::{Shared, TenantStores, Tenants, Unopened};
use counter_gateway::{gateway_router, Gateway};
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

/// A read names a tenant without creating it: no directory, no pipeline,
/// no slot among `--max-tenants`, and every read answers as empty.
#[tokio::test]
async fn a_read_never_creates_a_tenant() {
    let app = TestApp::start_with(Options {
        max_tenants: 2,
        ..Options::default()
    })
    .await;
    let read = |path: &str| {
        app.send(
            app.http
                .get(app.url(&format!("{path}{}tenant=ghost", sep(path))))
                .header("accept", "application/json"),
        )
    };
    assert_eq!(read(PATH).await.status, 404);
    assert_eq!(read(&format!("{PATH}/histogram")).await.status, 404);
    assert_eq!(read("/v1/averages/VIDEO/rating/v1").await.status, 404);
    for list in [
        "/v1/top/VIDEO/VIEW",
        "/v1/top/VIDEO/VIEW?interval=last_week",
        "/v1/top-averages/VIDEO/rating",
        "/v1/targets/VIDEO/v1/counters",
        "/v1/reports/stale?days=1",
        "/v1/reports/unused?days=1",
    ] {
        let r = read(list).await;
        assert_eq!(r.status, 200, "{list}: {}", r.text);
        let rows = ["counters", "averages", "pairs"]
            .iter()
            .find_map(|k| r.json[*k].as_array())
            .unwrap_or_else(|| panic!("{list}: no list in {}", r.text));
        assert!(rows.is_empty(), "{list}: {}", r.text);
    }
    let r = app
        .send(app.http.delete(app.url(PATH)).header("x-tenant", "ghost"))
        .await;
    assert_eq!(r.status, 404, "{}", r.text);
    assert!(!app.data_dir().join("tenants").exists());
    assert_eq!(app.metric("counter_gateway_tenants").await, 1.0);

    // Reads of many made-up tenants take no slot: a first write still opens one.
    for i in 0..20 {
        let r = app
            .send(
                app.http
                    .get(app.url(PATH))
                    .header("x-tenant", format!("made-up-{i}")),
            )
            .await;
        assert_eq!(r.status, 404, "{}", r.text);
    }
    assert_eq!(bump(&app, Some("real"), 3).await.status, 200);
    assert_eq!(value_of(&app, "real").await, Some(3));
    assert_eq!(app.metric("counter_gateway_tenants").await, 2.0);
}

fn sep(path: &str) -> char {
    if path.contains('?') {
        '&'
    } else {
        '?'
    }
}

/// Idle tenants are closed (their store and pipeline dropped) and open
/// again, with their data, on the next request; a tenant a request holds
/// is never closed under it.
#[tokio::test]
async fn idle_tenants_close_and_reopen_with_their_data() {
    let app = TestApp::start().await;
    assert_eq!(bump(&app, Some("acme"), 5).await.status, 200);
    assert_eq!(app.metric("counter_gateway_tenants").await, 2.0);
    // Used just now: not idle for an hour.
    assert_eq!(app.tenants.close_idle(Duration::from_secs(3600)), 0);

    // A request holding the tenant keeps it open, however idle.
    let held = app.tenants.writer("acme").await.expect("acme");
    assert_eq!(app.tenants.close_idle(Duration::ZERO), 0);
    drop(held);
    assert_eq!(app.tenants.close_idle(Duration::ZERO), 1);
    assert_eq!(app.metric("counter_gateway_tenants").await, 1.0);

    // A read opens it again (it holds data), a write goes on counting.
    assert_eq!(value_of(&app, "acme").await, Some(5));
    assert_eq!(app.metric("counter_gateway_tenants").await, 2.0);
    assert_eq!(bump(&app, Some("acme"), 1).await.status, 200);
    assert_eq!(app.tenants.close_idle(Duration::ZERO), 1);
    assert_eq!(bump(&app, Some("acme"), 1).await.status, 200);
    assert_eq!(value_of(&app, "acme").await, Some(7));
    // The default tenant is never closed.
    assert_eq!(bump(&app, None, 1).await.status, 200);
    app.tenants.close_idle(Duration::ZERO);
    assert_eq!(app.value("VIDEO", "VIEW", "v1").await, Some(1));
}

/// Tenant stores that open only when the test lets them, and say whether
/// an opening is under way.
struct SlowStores {
    inner: std::sync::Arc<dyn TenantStores>,
    release: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
    started: std::sync::Arc<std::sync::atomic::AtomicBool>,
    opening: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl TenantStores for SlowStores {
    fn open(&self, tenant: &str) -> Result<std::sync::Arc<dyn Store>, String> {
        self.started.store(true, Ordering::SeqCst);
        self.opening.store(true, Ordering::SeqCst);
        let waited = self
            .release
            .lock()
            .expect("release")
            .recv_timeout(Duration::from_secs(3));
        let opened = self.inner.open(tenant);
        self.opening.store(false, Ordering::SeqCst);
        waited.map_err(|e| e.to_string())?;
        opened
    }

    fn unopened(&self, tenant: &str) -> Result<Unopened, String> {
        self.inner.unopened(tenant)
    }
}

/// Opening a tenant's store (disk I/O, a few milliseconds, or seconds on a
/// slow disk) runs on a blocking thread: on a one-thread runtime, other
/// requests are answered while it is under way.
#[tokio::test(flavor = "current_thread")]
async fn opening_a_tenant_does_not_stall_other_requests() {
    use counter_gateway::domain::Clock;
    use counter_gateway::store::sqlite::{Durability, SqliteStore};
    use tower::ServiceExt;

    let dir = tempfile::tempdir().expect("temp dir");
    let clock = Clock::system();
    let window = Duration::from_secs(86_400);
    let store = SqliteStore::open(dir.path(), Durability::Relaxed, window, 400, clock.clone())
        .expect("store");
    let (release, released) = std::sync::mpsc::channel();
    let opening = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let started = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stores = SlowStores {
        started: started.clone(),
        inner: counter_gateway::tenant::embedded(
            dir.path(),
            Durability::Relaxed,
            window,
            400,
            clock.clone(),
        ),
        release: std::sync::Mutex::new(released),
        opening: opening.clone(),
    };
    let tenants = Tenants::start(
        std::sync::Arc::new(store),
        PipelineConfig::default(),
        Shared {
            time_policy: Options::default().time_policy,
            clock,
            limits: Options::default().limits,
            metrics: Default::default(),
            actors: Default::default(),
        },
        Some(std::sync::Arc::new(stores)),
        10,
    );
    let router = gateway_router(Gateway::open(tenants)).expect("router");
    let post = |tenant: &str| {
        axum::http::Request::post(format!("{PATH}/increment"))
            .header("x-tenant", tenant)
            .body(axum::body::Body::empty())
            .expect("request")
    };
    let slow = tokio::spawn(router.clone().oneshot(post("slow")));
    let waiting = std::time::Instant::now();
    while !started.load(Ordering::SeqCst) {
        assert!(
            waiting.elapsed() < Duration::from_secs(10),
            "the opening never began"
        );
        tokio::task::yield_now().await;
        std::thread::sleep(Duration::from_millis(1));
    }
    // The default tenant is served while "slow" is still being opened.
    let r = router
        .clone()
        .oneshot(post("default"))
        .await
        .expect("default");
    assert_eq!(r.status(), 200);
    assert!(
        opening.load(Ordering::SeqCst),
        "the other request was answered only after the opening ended"
    );
    let _ = release.send(());
    let r = slow.await.expect("task").expect("slow");
    assert_eq!(r.status(), 200);
}

/// A write that a tenant would refuse, or that counts nothing, creates no
/// tenant: the body is validated before the tenant is opened (issue 21,
/// item 9: a 400 batch, a `HEAD` of the pixel and a crawler's write each
/// made a directory and a database).
#[tokio::test]
async fn only_an_applied_write_creates_a_tenant() {
    const GOOGLEBOT: &str =
        "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)";
    let app = TestApp::start().await;
    let tenants = app.data_dir().join("tenants");
    let made = |name: &str| tenants.join(name).exists();
    let batch = |tenant: &str, body: serde_json::Value| {
        app.http
            .post(app.url("/v1/events"))
            .header("x-tenant", tenant)
            .json(&body)
    };
    let r = app
        .send(batch(
            "bad-batch",
            json!({"events": [{"entity": "V", "action": "VIEW"}]}),
        ))
        .await;
    assert_error(&r, 400, "invalid_events", &["invalid event"]);
    let r = app
        .send(
            app.http
                .post(app.url(&format!("{PATH}/increment")))
                .header("x-tenant", "bad-body")
                .body("{not json"),
        )
        .await;
    assert_eq!(r.status, 400, "{}", r.text);
    let r = app
        .request(
            reqwest::Method::HEAD,
            "/v1/pixel/V/VIEW/u1?tenant=head-only",
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = app
        .send(
            batch(
                "crawled",
                json!({"events": [{"entity": "V", "action": "VIEW", "uuid": "u1"}]}),
            )
            .header("user-agent", GOOGLEBOT)
            .header("origin", "http://localhost:3000"),
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.text);
    let r = app
        .send(
            app.http
                .put(app.url("/v1/counters/V/VIEW/u1/days/not-a-day"))
                .header("x-tenant", "bad-day")
                .json(&json!({"value": 1})),
        )
        .await;
    assert_eq!(r.status, 400, "{}", r.text);
    let r = app
        .send(
            app.http
                .put(app.url("/v1/counters/V/VIEW/u1"))
                .header("x-tenant", "bad-value")
                .json(&json!({"value": 1.5})),
        )
        .await;
    assert_eq!(r.status, 400, "{}", r.text);
    for name in [
        "bad-batch",
        "bad-body",
        "head-only",
        "crawled",
        "bad-day",
        "bad-value",
    ] {
        assert!(!made(name), "a refused write created tenant {name}");
    }
    assert_eq!(app.metric("counter_gateway_tenants").await, 1.0);
    // The write that is applied creates it.
    let r = app
        .send(batch(
            "counted",
            json!({"events": [{"entity": "V", "action": "VIEW", "uuid": "u1"}]}),
        ))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(made("counted"));
    assert_eq!(value_of(&app, "counted").await, None);
    let r = app
        .send(
            app.http
                .get(app.url("/v1/counters/V/VIEW/u1"))
                .header("x-tenant", "counted"),
        )
        .await;
    assert_eq!(r.json["value"], 1, "{}", r.text);
}

/// `--max-tenants` bounds the tenants kept on disk, not only those open:
/// closing idle tenants makes no room for new ones (issue 21, item 9: a
/// write key of `*` could fill the disk with made-up tenants, closed as
/// they went idle). The known ones reopen.
#[tokio::test]
async fn the_bound_on_tenants_counts_those_on_disk() {
    let app = TestApp::start_with(Options {
        max_tenants: 3,
        ..Options::default()
    })
    .await;
    assert_eq!(bump(&app, Some("t1"), 1).await.status, 200);
    assert_eq!(bump(&app, Some("t2"), 1).await.status, 200);
    assert_eq!(app.tenants.close_idle(Duration::ZERO), 2);
    assert_eq!(app.metric("counter_gateway_tenants").await, 1.0);
    let r = bump(&app, Some("t3"), 1).await;
    assert_error(&r, 503, "unavailable", &["at most 3 tenants", "on disk"]);
    assert!(!app.data_dir().join("tenants/t3").exists());
    assert_eq!(bump(&app, Some("t1"), 1).await.status, 200);
    assert_eq!(bump(&app, Some("t2"), 1).await.status, 200);
    assert_eq!(value_of(&app, "t1").await, Some(2));
}

/// Tenant stores that keep a handle on every store they open (as a close
/// still under way would) and count the openings.
struct HeldStores {
    inner: std::sync::Arc<dyn TenantStores>,
    held: std::sync::Mutex<Vec<std::sync::Arc<dyn Store>>>,
    opened: std::sync::atomic::AtomicUsize,
}

impl TenantStores for HeldStores {
    fn open(&self, tenant: &str) -> Result<std::sync::Arc<dyn Store>, String> {
        let store = self.inner.open(tenant)?;
        self.held.lock().expect("held").push(store.clone());
        self.opened.fetch_add(1, Ordering::SeqCst);
        Ok(store)
    }

    fn unopened(&self, tenant: &str) -> Result<Unopened, String> {
        self.inner.unopened(tenant)
    }

    fn stored(&self) -> Result<Option<usize>, String> {
        self.inner.stored()
    }
}

/// An idle tenant written to again while its close is still under way
/// (its old store not yet dropped: the drop folds the change log and
/// writes window totals back) waits for that close, and never runs a
/// second store on the same files: every count and window total is there
/// afterwards (issue 21, item 13).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_reopened_while_closing_waits_for_the_close() {
    use counter_gateway::domain::{Clock, Increment, IncrementSpec, Interner, ManualClock};
    use counter_gateway::store::sqlite::{Durability, SqliteStore};

    let dir = tempfile::tempdir().expect("temp dir");
    let manual = ManualClock::new(common::test_now());
    let clock: Clock = manual.clock();
    let window = Duration::from_secs(86_400);
    let store =
        SqliteStore::open(dir.path(), Durability::Full, window, 400, clock.clone()).expect("store");
    let stores = std::sync::Arc::new(HeldStores {
        inner: counter_gateway::tenant::embedded(
            dir.path(),
            Durability::Full,
            window,
            400,
            clock.clone(),
        ),
        held: Default::default(),
        opened: Default::default(),
    });
    let tenants = std::sync::Arc::new(Tenants::start(
        std::sync::Arc::new(store),
        PipelineConfig::default(),
        Shared {
            time_policy: Options::default().time_policy,
            clock: clock.clone(),
            limits: Options::default().limits,
            metrics: Default::default(),
            actors: Default::default(),
        },
        Some(stores.clone()),
        10,
    ));
    let views = |n: usize, from: usize| -> Vec<Increment> {
        (from..from + n)
            .map(|i| {
                let uuid = format!("v{}", i % 50);
                let spec = IncrementSpec {
                    entity: "VIDEO",
                    action: "VIEW",
                    uuid: &uuid,
                    count: Some(1),
                    ..IncrementSpec::default()
                };
                Increment::from_event(
                    &spec,
                    &Options::default().time_policy,
                    clock.now(),
                    &mut Interner::default(),
                    &Default::default(),
                )
                .expect("a view")
            })
            .collect()
    };
    let today = counter_gateway::domain::day_of(clock.now());
    let write = |tenants: std::sync::Arc<Tenants>, incs: Vec<Increment>| async move {
        let app = tenants.writer("acme").await.expect("writer");
        let app = app.opened().await.expect("opened");
        app.pipeline.submit(incs, None).await.expect("submit");
    };
    write(tenants.clone(), views(5_000, 0)).await;
    assert_eq!(tenants.close_idle(Duration::ZERO), 1);
    // Written again while the old store is still held (its close not over).
    let again = tokio::spawn(write(tenants.clone(), views(500, 5_000)));
    let waiting = std::time::Instant::now();
    while stores.opened.load(Ordering::SeqCst) < 2 && waiting.elapsed() < Duration::from_millis(500)
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let reopened_under_the_old = stores.opened.load(Ordering::SeqCst) == 2;
    // The old store lets go: its drop folds and writes back.
    let old = stores.held.lock().expect("held").remove(0);
    drop(old);
    again.await.expect("the second write");
    assert!(
        !reopened_under_the_old,
        "a second store was opened on the files of one still closing"
    );
    // Every view is there, in the counters and in the window's totals,
    // read now and after another close and reopening.
    for round in 0..2 {
        let app = tenants.reader("acme").await.expect("reader");
        let mut total = 0;
        let mut in_day: i128 = 0;
        for i in 0..50 {
            let key = counter_gateway::domain::CounterKey::new("VIDEO", "VIEW", &format!("v{i}"))
                .expect("key");
            total += app
                .store
                .get(&key)
                .await
                .expect("get")
                .map_or(0, |c| c.value);
        }
        let top = app
            .store
            .top(&counter_gateway::store::TopQuery {
                entity: "VIDEO".into(),
                action: "VIEW".into(),
                window: Some(counter_gateway::domain::Window {
                    from_day: today - 6,
                    to_day: today,
                }),
                category: None,
                size: 100,
            })
            .await
            .expect("top");
        for e in &top.entries {
            in_day += e.value;
        }
        assert_eq!((total, in_day), (5_500, 5_500), "round {round}");
        drop(app);
        stores.held.lock().expect("held").clear();
        tenants.close_idle(Duration::ZERO);
    }
    for f in tenants.close() {
        let _ = f.await;
    }
}
