//! Operational counters, declared in one place and rendered for Prometheus.
//!
//! Requests are counted by matched route pattern (one of [`routes`]), never
//! by raw path, so a client cannot grow the set of series.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;
use std::time::Duration;

use crate::store::StoreErrorKind;

static ROUTES: OnceLock<Vec<String>> = OnceLock::new();

/// Every route pattern of the API, as the router matches it, in the order of
/// the table of routes (`crate::api::table`): a route is labelled by the
/// same table that routes and documents it. The router hands them over when
/// it is built ([`register_routes`]), so this layer needs nothing of the API;
/// empty until then (no request can have been answered before).
pub fn routes() -> &'static [String] {
    ROUTES.get().map_or(&[], Vec::as_slice)
}

/// Fixes the route labels for the life of the process; the first call wins
/// (every router of a process is built from the same table).
pub fn register_routes(patterns: impl FnOnce() -> Vec<String>) {
    ROUTES.get_or_init(patterns);
}

/// The route label of requests no route matched (any index past
/// [`routes`] is counted as this one).
pub const UNMATCHED: usize = usize::MAX;

const METHODS: [&str; 5] = ["GET", "POST", "DELETE", "OTHER", "PUT"];
/// Statuses counted on their own; any other is counted as `other`.
/// 304 is what a cacheable multi-read mostly answers once pages revalidate;
/// 202 what a known crawler's browser ingestion gets.
const STATUSES: [u16; 18] = [
    200, 202, 204, 304, 400, 401, 403, 404, 405, 408, 409, 413, 415, 429, 500, 503, 507, 0,
];
/// Upper bounds of the request latency buckets, in seconds.
const LATENCY_BOUNDS: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0, 30.0,
];
/// Upper bounds of the flush size buckets, in increments.
const FLUSH_SIZE_BOUNDS: [f64; 7] = [1.0, 10.0, 100.0, 1e3, 1e4, 1e5, 1e6];
/// Upper bounds of the flush duration buckets, in seconds.
const FLUSH_SECONDS_BOUNDS: [f64; 9] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.5, 2.5];

/// The index of a matched route pattern in [`routes`].
pub fn route_index(pattern: &str) -> usize {
    routes()
        .iter()
        .position(|r| r == pattern)
        .unwrap_or(UNMATCHED)
}

/// A Prometheus histogram with fixed bounds: one atomic per bucket, no lock.
struct Histogram {
    bounds: &'static [f64],
    /// Per bucket (not cumulative), then +Inf.
    buckets: Vec<AtomicU64>,
    /// Sum in millionths of the unit.
    sum_micros: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_micros: AtomicU64::new(0),
        }
    }

    fn observe(&self, v: f64) {
        let i = self
            .bounds
            .iter()
            .position(|b| v <= *b)
            .unwrap_or(self.bounds.len());
        self.buckets[i].fetch_add(1, Relaxed);
        self.sum_micros.fetch_add((v * 1e6) as u64, Relaxed);
    }

    fn count(&self) -> u64 {
        self.buckets.iter().map(|b| b.load(Relaxed)).sum()
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cumulative = 0;
        for (i, b) in self.buckets.iter().enumerate() {
            cumulative += b.load(Relaxed);
            let le = self
                .bounds
                .get(i)
                .map_or_else(|| "+Inf".to_string(), |b| b.to_string());
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels}{sep}le=\"{le}\"}} {cumulative}"
            );
        }
        let braces = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let _ = writeln!(
            out,
            "{name}_sum{braces} {}\n{name}_count{braces} {cumulative}",
            self.sum_micros.load(Relaxed) as f64 / 1e6
        );
    }
}

/// Requests by route, method and status, and their latency by route and method.
struct HttpMetrics {
    /// Route labels known when these were made (then one for `unmatched`).
    routes: usize,
    /// `[route][method][status]`, flattened.
    requests: Vec<AtomicU64>,
    /// `[route][method]`, flattened.
    latency: Vec<Histogram>,
}

impl Default for HttpMetrics {
    fn default() -> Self {
        let routes = routes().len();
        let route_labels = routes + 1;
        HttpMetrics {
            routes,
            requests: (0..route_labels * METHODS.len() * STATUSES.len())
                .map(|_| AtomicU64::new(0))
                .collect(),
            latency: (0..route_labels * METHODS.len())
                .map(|_| Histogram::new(&LATENCY_BOUNDS))
                .collect(),
        }
    }
}

struct FlushHistograms {
    size: Histogram,
    seconds: Histogram,
}

impl Default for FlushHistograms {
    fn default() -> Self {
        FlushHistograms {
            size: Histogram::new(&FLUSH_SIZE_BOUNDS),
            seconds: Histogram::new(&FLUSH_SECONDS_BOUNDS),
        }
    }
}

#[derive(Default)]
pub struct Metrics {
    /// Sized by the route labels, so made at the first request, once the
    /// router has registered them.
    http: OnceLock<HttpMetrics>,
    flush_histograms: FlushHistograms,
    flushes: AtomicU64,
    flushed_increments: AtomicU64,
    store_writes: AtomicU64,
    flush_micros: AtomicU64,
    /// By [`StoreErrorKind::ALL`].
    store_errors: [AtomicU64; StoreErrorKind::ALL.len()],
    rejected_overloaded: AtomicU64,
    throttled: AtomicU64,
    actor_repeats: AtomicU64,
    crawler_events_ignored: AtomicU64,
}

impl Metrics {
    fn http(&self) -> &HttpMetrics {
        self.http.get_or_init(HttpMetrics::default)
    }

    pub fn record_flush(&self, increments: usize, store_writes: usize, took: Duration) {
        self.flushes.fetch_add(1, Relaxed);
        self.flushed_increments
            .fetch_add(increments as u64, Relaxed);
        self.store_writes.fetch_add(store_writes as u64, Relaxed);
        self.flush_micros
            .fetch_add(u64::try_from(took.as_micros()).unwrap_or(u64::MAX), Relaxed);
        self.flush_histograms.size.observe(increments as f64);
        self.flush_histograms.seconds.observe(took.as_secs_f64());
    }

    /// One answered request; `route` from [`route_index`] or [`UNMATCHED`].
    pub fn record_request(
        &self,
        route: usize,
        method: &axum::http::Method,
        status: u16,
        took: Duration,
    ) {
        let m = match *method {
            axum::http::Method::GET => 0,
            axum::http::Method::POST => 1,
            axum::http::Method::DELETE => 2,
            axum::http::Method::PUT => 4,
            _ => 3,
        };
        let s = STATUSES
            .iter()
            .position(|x| *x == status)
            .unwrap_or(STATUSES.len() - 1);
        let http = self.http();
        let rm = route.min(http.routes) * METHODS.len() + m;
        http.requests[rm * STATUSES.len() + s].fetch_add(1, Relaxed);
        http.latency[rm].observe(took.as_secs_f64());
    }

    pub fn record_store_error(&self, kind: StoreErrorKind) {
        let i = StoreErrorKind::ALL.iter().position(|k| *k == kind);
        if let Some(i) = i {
            self.store_errors[i].fetch_add(1, Relaxed);
        }
    }

    pub fn record_overloaded(&self) {
        self.rejected_overloaded.fetch_add(1, Relaxed);
    }

    /// A request refused by a limit per actor.
    pub fn record_throttled(&self) {
        self.throttled.fetch_add(1, Relaxed);
    }

    /// Events a request had left out as repeats of their actor (`unique`).
    pub fn record_repeats(&self, n: u32) {
        if n > 0 {
            self.actor_repeats.fetch_add(u64::from(n), Relaxed);
        }
    }

    /// Events of browser ingestion left out because a known crawler sent them.
    pub fn record_crawler_events_ignored(&self, events: usize) {
        self.crawler_events_ignored
            .fetch_add(events as u64, Relaxed);
    }

    /// Prometheus text exposition format, with the gauges read at scrape time.
    pub fn render(
        &self,
        queue_depth: usize,
        queue_bytes: usize,
        tenants: usize,
        idempotency_ids: i64,
    ) -> String {
        let mut out = String::new();
        let name = "counter_gateway_store_errors_total";
        let _ = writeln!(
            out,
            "# HELP {name} Flushes the store failed, by kind (busy, full, read_only, corrupt: SQLite's; unavailable, halted, other).\n# TYPE {name} counter"
        );
        for (kind, n) in StoreErrorKind::ALL.iter().zip(&self.store_errors) {
            let _ = writeln!(
                out,
                "{name}{{kind=\"{}\"}} {}",
                kind.as_str(),
                n.load(Relaxed)
            );
        }
        let mut put = |name: &str, kind: &str, help: &str, value: f64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
            );
        };
        put(
            "counter_gateway_flushes_total",
            "counter",
            "Flushes applied to the store.",
            self.flushes.load(Relaxed) as f64,
        );
        put(
            "counter_gateway_flushed_increments_total",
            "counter",
            "Increments carried by applied flushes.",
            self.flushed_increments.load(Relaxed) as f64,
        );
        put(
            "counter_gateway_store_writes_total",
            "counter",
            "Store operations (rows upserted, bulk items) sent by flushes.",
            self.store_writes.load(Relaxed) as f64,
        );
        put(
            "counter_gateway_flush_seconds_total",
            "counter",
            "Time spent applying flushes.",
            self.flush_micros.load(Relaxed) as f64 / 1e6,
        );
        put(
            "counter_gateway_overloaded_total",
            "counter",
            "Requests refused with 503 because the queue (events or bytes, the whole or the tenant's share) was full.",
            self.rejected_overloaded.load(Relaxed) as f64,
        );
        put(
            "counter_gateway_throttled_total",
            "counter",
            "Requests refused with 429 throttled: an actor of theirs was over a limit per actor (--actor-limit).",
            self.throttled.load(Relaxed) as f64,
        );
        put(
            "counter_gateway_actor_repeats_total",
            "counter",
            "Events not counted because of unique: their actor was counted already, or had nothing to take back.",
            self.actor_repeats.load(Relaxed) as f64,
        );
        put(
            "counter_gateway_crawler_events_ignored_total",
            "counter",
            "Events of browser ingestion (beacons, the pixel, writes with a write key from a browser) not counted because the User-Agent is a known crawler's (off with --count-crawlers).",
            self.crawler_events_ignored.load(Relaxed) as f64,
        );
        put(
            "counter_gateway_queue_depth",
            "gauge",
            "Events queued or being flushed.",
            queue_depth as f64,
        );
        put(
            "counter_gateway_queue_bytes",
            "gauge",
            "Estimated bytes of the writes queued or being flushed (bounded by --queue-bytes).",
            queue_bytes as f64,
        );
        put(
            "counter_gateway_tenants",
            "gauge",
            "Tenants open, each with its own store and pipeline.",
            tenants as f64,
        );
        put(
            "counter_gateway_idempotency_ids",
            "gauge",
            "Idempotency ids the embedded store keeps (counted every few seconds; expired ones are deleted in the background).",
            idempotency_ids as f64,
        );
        {
            use crate::store::elasticsearch::pool;
            put(
                "counter_gateway_elasticsearch_nodes",
                "gauge",
                "Elasticsearch nodes requests can go to (the URLs given and those sniffed); 0 on the embedded store.",
                pool::NODES.load(Relaxed) as f64,
            );
            put(
                "counter_gateway_elasticsearch_nodes_dead",
                "gauge",
                "Elasticsearch nodes set aside because their connection failed, not heard from since (each is tried again after a pause growing from 1 s to 30 s).",
                pool::DEAD_NODES.load(Relaxed) as f64,
            );
            put(
                "counter_gateway_elasticsearch_node_failures_total",
                "counter",
                "Times an Elasticsearch node was set aside because its connection failed.",
                pool::NODE_FAILURES.load(Relaxed) as f64,
            );
            put(
                "counter_gateway_elasticsearch_writes_taken_already_total",
                "counter",
                "Counter and bucket updates their document had already taken (the engine running a bulk again on a new primary, or a resend): skipped, so counted once.",
                crate::store::elasticsearch::request::WRITES_TAKEN_ALREADY.load(Relaxed) as f64,
            );
        }
        let (incs, writes) = (
            self.flushed_increments.load(Relaxed),
            self.store_writes.load(Relaxed),
        );
        put(
            "counter_gateway_increments_per_store_write",
            "gauge",
            "Increments received per store operation sent, since start (coalescing at work).",
            if writes == 0 {
                0.0
            } else {
                incs as f64 / writes as f64
            },
        );
        self.render_histograms(&mut out);
        out
    }

    fn render_histograms(&self, out: &mut String) {
        let name = "counter_gateway_flush_increments";
        let _ = writeln!(
            out,
            "# HELP {name} Increments per applied flush.\n# TYPE {name} histogram"
        );
        self.flush_histograms.size.render(out, name, "");
        let name = "counter_gateway_flush_duration_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} Time to apply one flush.\n# TYPE {name} histogram"
        );
        self.flush_histograms.seconds.render(out, name, "");

        let name = "counter_gateway_http_requests_total";
        let _ = writeln!(
            out,
            "# HELP {name} Answered requests by matched route, method and status.\n# TYPE {name} counter"
        );
        let http = self.http();
        let route_name = |r: usize| match routes().get(r) {
            Some(route) if r < http.routes => route.as_str(),
            _ => "unmatched",
        };
        for (i, c) in http.requests.iter().enumerate() {
            let n = c.load(Relaxed);
            if n == 0 {
                continue;
            }
            let (rm, s) = (i / STATUSES.len(), i % STATUSES.len());
            let status = match STATUSES[s] {
                0 => "other".to_string(),
                code => code.to_string(),
            };
            let _ = writeln!(
                out,
                "{name}{{route=\"{}\",method=\"{}\",status=\"{status}\"}} {n}",
                route_name(rm / METHODS.len()),
                METHODS[rm % METHODS.len()]
            );
        }
        let name = "counter_gateway_http_request_duration_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} Request latency by matched route and method.\n# TYPE {name} histogram"
        );
        for (rm, h) in http.latency.iter().enumerate() {
            if h.count() == 0 {
                continue;
            }
            let labels = format!(
                "route=\"{}\",method=\"{}\"",
                route_name(rm / METHODS.len()),
                METHODS[rm % METHODS.len()]
            );
            h.render(out, name, &labels);
        }
    }
}
