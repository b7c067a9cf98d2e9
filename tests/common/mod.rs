//! Shared helpers of the HTTP tests: the real router over a fresh SQLite store
//! in a temporary directory, served on a real listener on port 0, and a small
//! client that answers `(status, headers, JSON body)`.

// Each test crate uses a different part of these helpers.
#![allow(dead_code)]

pub mod chromium;
pub mod sse;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use counter_gateway::actors::{ActorLimits, Actors};
use counter_gateway::auth::Keys;
use counter_gateway::domain::{ActorKey, ManualClock, TimePolicy};
use counter_gateway::metrics::Metrics;
use counter_gateway::pipeline::PipelineConfig;
use counter_gateway::ratelimit::RateLimiter;
use counter_gateway::store::sqlite::{Durability, FsyncFault, SqliteStore, WriterSql};
use counter_gateway::store::Store;
use counter_gateway::tenant::{Shared, Tenants};
use counter_gateway::{gateway_app, gateway_router, AppState, Gateway, Limits};
use serde_json::Value;
use tempfile::TempDir;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// How a test app is configured; the defaults are those of `serve`, with
/// smaller request limits so the limits themselves are cheap to test.
#[derive(Clone, Debug)]
pub struct Options {
    pub limits: Limits,
    pub pipeline: PipelineConfig,
    pub time_policy: TimePolicy,
    /// API key entries as in a key file (`<role> <tenant|*> <sha256>` lines);
    /// empty: no keys, every request allowed.
    pub keys: String,
    pub rate_limit_per_second: Option<u32>,
    pub request_timeout: Option<Duration>,
    pub cors_origins: Vec<String>,
    /// `--allowed-hosts`.
    pub allowed_hosts: Vec<String>,
    pub max_tenants: usize,
    /// The app's clock: it stands at [`test_now`] until a test moves it.
    pub clock: ManualClock,
    /// `--counters-cache-max-age`.
    pub counters_max_age: Option<Duration>,
    /// `--actor-secret`; `None`: the one made in the data directory, as
    /// `serve` does for the embedded store.
    pub actor_secret: Option<String>,
    /// `--actor-limit` rules.
    pub actor_limits: Vec<String>,
    /// `--count-crawlers`.
    pub count_crawlers: bool,
    /// `--write-keys-read-values`.
    pub write_keys_read_values: bool,
    /// `--stream-interval`, `--max-streams` and the streams' timings.
    pub streams: counter_gateway::api::stream::StreamConfig,
    /// Serve the router alone, without the single increment's fast path
    /// in front of it (`tests/fast_path.rs` compares the two).
    pub router_only: bool,
    /// `--trending-half-lives` (ms): the default store keeps trending
    /// bounds for these.
    pub trending_half_lives: Vec<i64>,
}

/// Body limit of the test apps.
pub const MAX_BODY_BYTES: usize = 256 * 1024;
/// Events per `POST /v1/events` in the test apps.
pub const MAX_EVENTS: usize = 1_000;

impl Default for Options {
    fn default() -> Self {
        Options {
            limits: Limits {
                max_body_bytes: MAX_BODY_BYTES,
                max_events_per_request: MAX_EVENTS,
            },
            pipeline: PipelineConfig::default(),
            time_policy: TimePolicy::default(),
            keys: String::new(),
            rate_limit_per_second: None,
            request_timeout: None,
            cors_origins: Vec::new(),
            allowed_hosts: Vec::new(),
            max_tenants: 100,
            clock: ManualClock::new(test_now()),
            counters_max_age: None,
            actor_secret: None,
            actor_limits: Vec::new(),
            count_crawlers: false,
            write_keys_read_values: false,
            streams: Default::default(),
            router_only: false,
            trending_half_lives: Vec::new(),
        }
    }
}

/// A key-file line granting `role` on `tenant` (`*` for all) to the clear key `key`.
/// The gateway's logs in a test's captured output (shown when it fails),
/// filtered by `RUST_LOG`; nothing without it. A 5xx answer names only a
/// request id: its cause is in these logs.
#[allow(dead_code)]
pub fn logs() {
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
    }
}

pub fn key_line(role: &str, tenant: &str, key: &str) -> String {
    format!(
        "{role} {tenant} {}\n",
        counter_gateway::auth::digest_hex(key)
    )
}

/// The app served on `127.0.0.1:<free port>` over its own data directory.
pub struct TestApp {
    pub base: String,
    pub http: reqwest::Client,
    /// The default tenant.
    pub state: AppState,
    pub tenants: Arc<Tenants>,
    pub options: Options,
    /// Makes the default tenant's WAL fsync fail while armed.
    pub fsync_fault: FsyncFault,
    /// Runs SQL on the default tenant's writer connection.
    pub writer_sql: WriterSql,
    /// Kept alive (and removed on drop) by the app that created it.
    dir: Arc<TempDir>,
    server: JoinHandle<()>,
    stop_server: oneshot::Sender<()>,
}

/// One HTTP answer.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub text: String,
    /// The body as JSON, `Value::Null` when it is not JSON.
    pub json: Value,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

impl TestApp {
    pub async fn start() -> TestApp {
        Self::start_with(Options::default()).await
    }

    pub async fn start_with(options: Options) -> TestApp {
        Self::start_wrapped(options, |s| s).await
    }

    /// Starts over a fresh SQLite store seen through `wrap` (a store that
    /// delays or fails on purpose).
    pub async fn start_wrapped(
        options: Options,
        wrap: impl FnOnce(Arc<dyn Store>) -> Arc<dyn Store>,
    ) -> TestApp {
        let dir = Arc::new(tempfile::tempdir().expect("temp dir"));
        Self::start_in(dir, options, wrap).await
    }

    async fn start_in(
        dir: Arc<TempDir>,
        options: Options,
        wrap: impl FnOnce(Arc<dyn Store>) -> Arc<dyn Store>,
    ) -> TestApp {
        let sqlite = SqliteStore::open(
            dir.path(),
            Durability::Full,
            Duration::from_secs(7 * 86_400),
            options.time_policy.retention_days,
            options.clock.clock(),
        )
        .expect("open store");
        sqlite.set_hourly_retention(options.time_policy.hourly_retention_days);
        sqlite
            .set_trending_half_lives(&options.trending_half_lives)
            .expect("trending bounds");
        let fsync_fault = sqlite.fsync_fault();
        let writer_sql = sqlite.writer_sql();
        let store: Arc<dyn Store> = wrap(Arc::new(sqlite));
        let metrics = Arc::new(Metrics::default());
        let window = Duration::from_secs(7 * 86_400);
        let actor_key = match &options.actor_secret {
            Some(s) => ActorKey::new(s.as_bytes()).expect("a test actor secret"),
            None => counter_gateway::actors::embedded_secret(dir.path()).expect("actor secret"),
        };
        // As `serve` does before anything writes: the default tenant's marks
        // brought to its keying.
        store
            .key_marks(&actor_key)
            .await
            .expect("the default tenant's actor marks");
        let actor_limits = ActorLimits::parse(&options.actor_limits).expect("test actor limits");
        let tenants = Arc::new(Tenants::start(
            store,
            options.pipeline.clone(),
            Shared {
                time_policy: options.time_policy,
                clock: options.clock.clock(),
                limits: options.limits,
                metrics: metrics.clone(),
                actors: Actors::new(actor_key, actor_limits),
            },
            Some(counter_gateway::tenant::embedded_hourly(
                dir.path(),
                Durability::Full,
                window,
                options.time_policy.retention_days,
                options.time_policy.hourly_retention_days,
                options.clock.clock(),
            )),
            options.max_tenants,
        ));
        let state = tenants.default_tenant().clone();
        let gateway = Gateway {
            tenants: tenants.clone(),
            keys: Arc::new(Keys::parse(&options.keys, "test keys").expect("test keys")),
            rate_limit: options
                .rate_limit_per_second
                .map(|n| Arc::new(RateLimiter::new(n))),
            request_timeout: options.request_timeout,
            cors_origins: options.cors_origins.clone().into(),
            allowed_hosts: options.allowed_hosts.clone().into(),
            metrics,
            counters_max_age: options.counters_max_age,
            count_crawlers: options.count_crawlers,
            write_keys_read_values: options.write_keys_read_values,
            streams: Arc::new(counter_gateway::api::stream::Streams::new(
                options.streams.clone(),
            )),
        };
        let streams = gateway.streams.clone();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let (stop_server, stopped) = oneshot::channel::<()>();
        // What `serve` runs (the increment's fast path in front of the
        // router), or the router alone.
        macro_rules! serve {
            ($app:expr) => {{
                let app = $app;
                tokio::spawn(async move {
                    axum::serve(listener, app)
                        .with_graceful_shutdown(async move {
                            let _ = stopped.await;
                            streams.close();
                        })
                        .await
                        .expect("serve");
                })
            }};
        }
        let server = if options.router_only {
            serve!(gateway_router(gateway)
                .expect("router")
                .into_make_service_with_connect_info::<std::net::SocketAddr>())
        } else {
            serve!(gateway_app(gateway).expect("app").into_make_service())
        };
        TestApp {
            base: format!("http://{addr}"),
            http: client(),
            state,
            tenants,
            options,
            fsync_fault,
            writer_sql,
            dir,
            server,
            stop_server,
        }
    }

    pub fn data_dir(&self) -> &Path {
        self.dir.path()
    }

    /// Stops in the order of the real server: no more requests, flush what
    /// is queued, wait for the flusher. Returns the data directory.
    pub async fn stop(self) -> (Arc<TempDir>, Options) {
        let _ = self.stop_server.send(());
        self.server.await.expect("server task");
        for flusher in self.tenants.close() {
            flusher.await.expect("flusher task");
        }
        drop(self.state);
        drop(self.tenants);
        (self.dir, self.options)
    }

    /// Starts over an existing data directory (one [`TestApp::stop`]
    /// returned), with other options.
    pub async fn start_in_dir(dir: Arc<TempDir>, options: Options) -> TestApp {
        Self::start_in(dir, options, |s| s).await
    }

    /// Stops this app and starts a new one (new store, pipeline, listener)
    /// over the same data directory.
    pub async fn restart(self) -> TestApp {
        let (dir, options) = self.stop().await;
        Self::start_in(dir, options, |s| s).await
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    pub async fn get(&self, path: &str) -> Resp {
        read(self.http.get(self.url(path)).send().await.expect("GET")).await
    }

    pub async fn delete(&self, path: &str) -> Resp {
        read(
            self.http
                .delete(self.url(path))
                .send()
                .await
                .expect("DELETE"),
        )
        .await
    }

    /// POST with a JSON body (`application/json`).
    pub async fn post(&self, path: &str, body: Value) -> Resp {
        let req = self.http.post(self.url(path)).json(&body);
        read(req.send().await.expect("POST")).await
    }

    /// POST without any body and without a content type.
    pub async fn post_empty(&self, path: &str) -> Resp {
        read(self.http.post(self.url(path)).send().await.expect("POST")).await
    }

    /// POST of raw bytes, with the given content type (none when `None`).
    pub async fn post_raw(
        &self,
        path: &str,
        content_type: Option<&str>,
        body: impl Into<reqwest::Body>,
    ) -> Resp {
        let mut req = self.http.post(self.url(path)).body(body);
        if let Some(ct) = content_type {
            req = req.header(reqwest::header::CONTENT_TYPE, ct);
        }
        read(req.send().await.expect("POST")).await
    }

    /// Sends a request built on `self.http` (headers, keys, bodies of any kind).
    pub async fn send(&self, req: reqwest::RequestBuilder) -> Resp {
        read(req.send().await.expect("request")).await
    }

    pub async fn request(&self, method: reqwest::Method, path: &str) -> Resp {
        let req = self.http.request(method, self.url(path));
        read(req.send().await.expect("request")).await
    }

    /// `POST .../increment` with `body`; answers the response.
    pub async fn increment(&self, e: &str, a: &str, u: &str, body: Value) -> Resp {
        self.post(&counter_path(e, a, u, "/increment"), body).await
    }

    /// The value of a counter read back through the API; `None` on 404.
    pub async fn value(&self, e: &str, a: &str, u: &str) -> Option<i64> {
        let r = self.get(&counter_path(e, a, u, "")).await;
        match r.status {
            200 => Some(r.json["value"].as_i64().expect("value is an i64")),
            404 => {
                assert_error(&r, 404, "not_found", &[]);
                None
            }
            s => panic!("GET counter answered {s}: {}", r.text),
        }
    }

    /// A metric of `/metrics`, by its exact name.
    pub async fn metric(&self, name: &str) -> f64 {
        let r = self.get("/metrics").await;
        assert_eq!(r.status, 200, "{}", r.text);
        metric_in(&r.text, name).unwrap_or_else(|| panic!("no metric {name} in {}", r.text))
    }
}

/// `/v1/counters/{e}/{a}/{u}{suffix}` with each part percent-encoded.
pub fn counter_path(e: &str, a: &str, u: &str, suffix: &str) -> String {
    format!(
        "/v1/counters/{}/{}/{}{suffix}",
        encode(e),
        encode(a),
        encode(u)
    )
}

/// Percent-encodes everything but unreserved characters (RFC 3986).
pub fn encode(part: &str) -> String {
    let mut out = String::with_capacity(part.len());
    for b in part.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("http client")
}

pub async fn read(res: reqwest::Response) -> Resp {
    let status = res.status().as_u16();
    let headers = res.headers().clone();
    let text = res.text().await.expect("body");
    let json = serde_json::from_str(&text).unwrap_or(Value::Null);
    Resp {
        status,
        headers,
        text,
        json,
    }
}

/// Asserts the one error shape, `{"error": {"type", "reason"[, "details"]}}`,
/// with this status and type, and that the reason mentions each of `mentions`.
pub fn assert_error(r: &Resp, status: u16, kind: &str, mentions: &[&str]) {
    assert_eq!(r.status, status, "status of {}", r.text);
    assert_eq!(
        r.header("content-type"),
        Some("application/json"),
        "content type of {}",
        r.text
    );
    let obj = r.json.as_object().expect("a JSON object");
    assert_eq!(obj.len(), 1, "only `error` at the top: {}", r.text);
    let err = obj["error"].as_object().expect("error is an object");
    assert_eq!(err["type"], kind, "type of {}", r.text);
    let reason = err["reason"].as_str().expect("reason is a string");
    for m in mentions {
        assert!(
            reason.contains(m),
            "reason {reason:?} does not mention {m:?}"
        );
    }
    for k in err.keys() {
        assert!(
            ["type", "reason", "details"].contains(&k.as_str()),
            "unexpected key {k} in {}",
            r.text
        );
    }
}

/// The value of a metric line `name value` in a Prometheus exposition.
pub fn metric_in(text: &str, name: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (n, v) = l.split_once(' ')?;
        (n == name).then(|| v.trim().parse().ok())?
    })
}

/// RFC 3339 with whole seconds, as a client would send it.
pub fn rfc3339(ts: chrono::DateTime<chrono::Utc>) -> String {
    ts.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// The same instant as the API renders it (milliseconds, `Z`).
pub fn rendered(ts: chrono::DateTime<chrono::Utc>) -> String {
    ts.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// The instant every test app's clock starts at, in whole seconds (as
/// clients send timestamps), the same for the whole test binary:
/// `COUNTER_GATEWAY_TEST_NOW` (RFC 3339) when set, so the gate can run the
/// suites at chosen dates (a month's last day, 31 December, 29 February, a
/// second before midnight), else the wall clock when the binary started.
/// A test compares the server's answers with this instant, never with a
/// fresh read of the wall clock, so it passes on any date and across midnight.
pub fn test_now() -> chrono::DateTime<chrono::Utc> {
    static NOW: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    let secs = *NOW.get_or_init(|| match std::env::var("COUNTER_GATEWAY_TEST_NOW") {
        Ok(raw) => chrono::DateTime::parse_from_rfc3339(&raw)
            .unwrap_or_else(|e| panic!("COUNTER_GATEWAY_TEST_NOW={raw:?}: {e}"))
            .timestamp(),
        Err(_) => chrono::Utc::now().timestamp(),
    });
    chrono::DateTime::from_timestamp(secs, 0).expect("a representable test time")
}

/// The test apps' now (see [`test_now`]).
pub fn now_secs() -> chrono::DateTime<chrono::Utc> {
    test_now()
}

/// A test `Store` wrapper that changes only `apply` and passes `sync` and
/// every read through to its `inner` store. The trait has no defaults (a
/// wrapper must not drop durability by forgetting `sync`), so each wrapper
/// says what it does by naming its `apply` here:
/// `store_wrapper!(Stuck, |self, batch| { ...; self.inner.apply(batch).await });`
/// The inner store's bulks in flight pass through too, unless a third part
/// says otherwise: `store_wrapper!(T, |self, batch| {...}, |this| 4)`.
#[macro_export]
macro_rules! store_wrapper {
    ($ty:ty, |$this:ident, $batch:ident| $apply:block) => {
        $crate::store_wrapper!($ty, |$this, $batch| $apply, |this| this.inner.bulks_in_flight());
    };
    ($ty:ty, |$this:ident, $batch:ident| $apply:block, |$b:ident| $bulks:expr) => {
        #[async_trait::async_trait]
        impl counter_gateway::store::Store for $ty {
            async fn apply(
                &$this,
                $batch: counter_gateway::store::WriteBatch,
            ) -> Result<counter_gateway::store::BatchOutcome, counter_gateway::store::StoreError>
            $apply
            async fn sync(&self) -> Result<(), counter_gateway::store::StoreError> {
                self.inner.sync().await
            }
            async fn get(
                &self,
                key: &counter_gateway::domain::CounterKey,
            ) -> Result<Option<counter_gateway::domain::Counter>, counter_gateway::store::StoreError>
            {
                self.inner.get(key).await
            }
            async fn target_counters(
                &self,
                entity: &str,
                uuid: &str,
            ) -> Result<Vec<counter_gateway::domain::Counter>, counter_gateway::store::StoreError>
            {
                self.inner.target_counters(entity, uuid).await
            }
            async fn delete(
                &self,
                key: &counter_gateway::domain::CounterKey,
            ) -> Result<bool, counter_gateway::store::StoreError> {
                self.inner.delete(key).await
            }
            async fn ready(&self) -> Result<(), counter_gateway::store::StoreError> {
                self.inner.ready().await
            }
            async fn histogram(
                &self,
                key: &counter_gateway::domain::CounterKey,
                window: counter_gateway::domain::Window,
            ) -> Result<Option<Vec<counter_gateway::store::Bucket>>, counter_gateway::store::StoreError>
            {
                self.inner.histogram(key, window).await
            }
            async fn top(
                &self,
                q: &counter_gateway::store::TopQuery,
            ) -> Result<counter_gateway::store::TopList, counter_gateway::store::StoreError> {
                self.inner.top(q).await
            }
            async fn hour_histogram(
                &self,
                key: &counter_gateway::domain::CounterKey,
                hours: counter_gateway::domain::HourRange,
            ) -> Result<Option<counter_gateway::store::HourHistogram>, counter_gateway::store::StoreError>
            {
                self.inner.hour_histogram(key, hours).await
            }
            async fn top_hours(
                &self,
                q: &counter_gateway::store::TopHoursQuery,
            ) -> Result<counter_gateway::store::TopList, counter_gateway::store::StoreError> {
                self.inner.top_hours(q).await
            }
            async fn trending(
                &self,
                q: &counter_gateway::store::TrendingQuery,
            ) -> Result<counter_gateway::store::TrendingList, counter_gateway::store::StoreError> {
                self.inner.trending(q).await
            }
            async fn stale(
                &self,
                q: &counter_gateway::store::StaleQuery,
            ) -> Result<Vec<counter_gateway::domain::Counter>, counter_gateway::store::StoreError>
            {
                self.inner.stale(q).await
            }
            async fn unused(
                &self,
                before_ms: i64,
            ) -> Result<Vec<counter_gateway::store::UnusedPair>, counter_gateway::store::StoreError>
            {
                self.inner.unused(before_ms).await
            }
            async fn average(
                &self,
                key: &counter_gateway::domain::CounterKey,
                window: Option<counter_gateway::domain::Window>,
            ) -> Result<Option<counter_gateway::store::Average>, counter_gateway::store::StoreError>
            {
                self.inner.average(key, window).await
            }
            async fn top_averages(
                &self,
                q: &counter_gateway::store::TopAveragesQuery,
            ) -> Result<counter_gateway::store::TopAverages, counter_gateway::store::StoreError>
            {
                self.inner.top_averages(q).await
            }
            async fn get_many(
                &self,
                keys: &[counter_gateway::domain::CounterKey],
            ) -> Result<
                Vec<Option<counter_gateway::domain::Counter>>,
                counter_gateway::store::StoreError,
            > {
                self.inner.get_many(keys).await
            }
            async fn set_days(
                &self,
                sets: Vec<counter_gateway::domain::DaySet>,
                oldest_day: i64,
            ) -> Result<counter_gateway::store::DaysOutcome, counter_gateway::store::StoreError>
            {
                self.inner.set_days(sets, oldest_day).await
            }
            async fn set_value(
                &self,
                set: counter_gateway::domain::CounterSet,
            ) -> Result<counter_gateway::domain::Counter, counter_gateway::store::StoreError> {
                self.inner.set_value(set).await
            }
            async fn counter_page(
                &self,
                after: Option<counter_gateway::domain::CounterKey>,
                limit: usize,
                from_day: i64,
                hours_from_day: i64,
            ) -> Result<
                Vec<counter_gateway::store::CounterHistory>,
                counter_gateway::store::StoreError,
            > {
                self.inner
                    .counter_page(after, limit, from_day, hours_from_day)
                    .await
            }
            async fn average_page(
                &self,
                after: Option<counter_gateway::domain::CounterKey>,
                limit: usize,
                from_day: i64,
            ) -> Result<
                Vec<counter_gateway::store::AverageHistory>,
                counter_gateway::store::StoreError,
            > {
                self.inner.average_page(after, limit, from_day).await
            }
            async fn mark_page(
                &self,
                after: Option<counter_gateway::store::ActorMark>,
                limit: usize,
                from_day: i64,
            ) -> Result<
                Vec<counter_gateway::store::ActorMark>,
                counter_gateway::store::StoreError,
            > {
                self.inner.mark_page(after, limit, from_day).await
            }
            async fn import(
                &self,
                batch: counter_gateway::store::ImportBatch,
            ) -> Result<counter_gateway::store::ImportOutcome, counter_gateway::store::StoreError>
            {
                self.inner.import(batch).await
            }
            async fn set_published(
                &self,
                sets: Vec<counter_gateway::store::PublishedSet>,
            ) -> Result<(), counter_gateway::store::StoreError> {
                self.inner.set_published(sets).await
            }
            async fn published(
                &self,
                entity: &str,
                uuid: &str,
            ) -> Result<Option<i64>, counter_gateway::store::StoreError> {
                self.inner.published(entity, uuid).await
            }
            async fn top_first_days(
                &self,
                q: &counter_gateway::store::FirstDaysQuery,
            ) -> Result<counter_gateway::store::FirstDaysList, counter_gateway::store::StoreError> {
                self.inner.top_first_days(q).await
            }
            async fn top_first_days_local(
                &self,
                q: &counter_gateway::store::LocalFirstDaysQuery,
            ) -> Result<counter_gateway::store::FirstDaysList, counter_gateway::store::StoreError> {
                self.inner.top_first_days_local(q).await
            }
            async fn published_page(
                &self,
                after: Option<(String, String)>,
                limit: usize,
            ) -> Result<Vec<counter_gateway::store::TargetPublished>, counter_gateway::store::StoreError>
            {
                self.inner.published_page(after, limit).await
            }
            fn bulks_in_flight(&self) -> usize {
                let $b = self;
                $bulks
            }
        }
    };
}

/// A store whose writes wait until the test opens its gate (adds permits),
/// so a queue fills deterministically.
pub struct Stuck {
    pub inner: Arc<dyn Store>,
    pub gate: Arc<tokio::sync::Semaphore>,
}

store_wrapper!(Stuck, |self, batch| {
    let _open = self.gate.acquire().await.expect("gate");
    self.inner.apply(batch).await
});

/// Options whose `--unique-max-age` reaches back to the retention, for
/// scenarios that make marks of long-past days (`liked_and_viewed`).
pub fn backdating() -> Options {
    let mut options = Options::default();
    options.time_policy.unique_max_age =
        chrono::Duration::days(i64::from(options.time_policy.retention_days));
    options
}

/// Likes, an unlike and views over HTTP, by actors whose names must never
/// leave the gateway (a file, a document): on ARTICLE/like,
/// alice@example.org and bob like a1 (carol likes it, then takes it back),
/// dave likes a2; on ARTICLE/VIEW/a1, visitor-1 views today and yesterday,
/// visitor-2 today, visitor-3 399 days ago.
pub async fn liked_and_viewed(app: &TestApp) {
    use serde_json::json;
    for (who, uuid) in [
        ("alice@example.org", "a1"),
        ("bob", "a1"),
        ("carol", "a1"),
        ("dave", "a2"),
    ] {
        let r = app
            .increment(
                "ARTICLE",
                "like",
                uuid,
                json!({"actor": who, "unique": "ever"}),
            )
            .await;
        assert_eq!(
            (r.status, &r.json["counted"]),
            (200, &json!(true)),
            "{}",
            r.text
        );
    }
    let r = app
        .post(
            &counter_path("ARTICLE", "like", "a1", "/decrement"),
            json!({"actor": "carol", "unique": "ever"}),
        )
        .await;
    assert_eq!(
        (r.status, &r.json["counted"]),
        (200, &json!(true)),
        "{}",
        r.text
    );
    let views: Vec<Value> = [
        ("visitor-1", 0),
        ("visitor-1", 1),
        ("visitor-2", 0),
        ("visitor-3", 399),
    ]
    .iter()
    .map(|(who, n)| {
        json!({"entity": "ARTICLE", "action": "VIEW", "uuid": "a1", "actor": who,
               "unique": "day",
               "timestamp": rfc3339(test_now() - chrono::Duration::days(*n))})
    })
    .collect();
    let r = app.post("/v1/events", json!({ "events": views })).await;
    assert_eq!(
        r.json,
        json!({"accepted": 4, "duplicates": 0}),
        "{}",
        r.text
    );
}

/// The actor secret a gateway made in its data directory, and its
/// fingerprint.
pub fn actor_secret_of(dir: &Path) -> (String, String) {
    let secret = std::fs::read_to_string(dir.join("actor-secret")).unwrap();
    let secret = secret.trim().to_string();
    let fp = ActorKey::new(secret.as_bytes())
        .unwrap()
        .fingerprint()
        .unwrap();
    (secret, fp)
}
