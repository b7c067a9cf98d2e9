//! Operational counters, declared in one place and rendered for Prometheus.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

#[derive(Default)]
pub struct Metrics {
    flushes: AtomicU64,
    flushed_increments: AtomicU64,
    store_writes: AtomicU64,
    flush_micros: AtomicU64,
    store_errors: AtomicU64,
    rejected_overloaded: AtomicU64,
}

impl Metrics {
    pub fn record_flush(&self, increments: usize, store_writes: usize, took: Duration) {
        self.flushes.fetch_add(1, Relaxed);
        self.flushed_increments
            .fetch_add(increments as u64, Relaxed);
        self.store_writes.fetch_add(store_writes as u64, Relaxed);
        self.flush_micros
            .fetch_add(u64::try_from(took.as_micros()).unwrap_or(u64::MAX), Relaxed);
    }

    pub fn record_store_error(&self) {
        self.store_errors.fetch_add(1, Relaxed);
    }

    pub fn record_overloaded(&self) {
        self.rejected_overloaded.fetch_add(1, Relaxed);
    }

    /// Prometheus text exposition format.
    pub fn render(&self, queue_depth: usize) -> String {
        let mut out = String::new();
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
            "counter_gateway_store_errors_total",
            "counter",
            "Flushes the store failed.",
            self.store_errors.load(Relaxed) as f64,
        );
        put(
            "counter_gateway_overloaded_total",
            "counter",
            "Requests refused with 503 because the queue was full.",
            self.rejected_overloaded.load(Relaxed) as f64,
        );
        put(
            "counter_gateway_queue_depth",
            "gauge",
            "Events queued or being flushed.",
            queue_depth as f64,
        );
        out
    }
}
