//! The conformance scenarios against the embedded (SQLite) store: every
//! scenario on a fresh store in its own temporary directory.

#[path = "common/mod.rs"]
mod common;
#[path = "conformance/runner.rs"]
mod runner;

use std::sync::Arc;

use counter_gateway::domain::{ManualClock, TimePolicy};
use counter_gateway::metrics::Metrics;
use counter_gateway::pipeline::{Pipeline, PipelineConfig};
use counter_gateway::store::sqlite::{Durability, SqliteStore};
use counter_gateway::store::Store;
use counter_gateway::{router, AppState, Limits};
use runner::Target;

/// Relaxed durability: these scenarios test answers, not fsync.
async fn embedded(clock: ManualClock) -> Target {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store: Arc<dyn Store> = Arc::new(
        SqliteStore::open(
            dir.path(),
            Durability::Relaxed,
            std::time::Duration::from_secs(86_400),
            TimePolicy::default().retention_days,
            clock.clock(),
        )
        .expect("the store opens"),
    );
    let metrics = Arc::new(Metrics::default());
    let (pipeline, _flusher) =
        Pipeline::start(store.clone(), PipelineConfig::default(), metrics.clone());
    let state = AppState {
        store,
        pipeline,
        time_policy: TimePolicy::default(),
        clock: clock.clock(),
        limits: Limits::default(),
        metrics,
        actors: runner::actors(),
        pending: None,
    };
    Target {
        router: router(state),
        clock,
        guard: Box::new(dir),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_scenario_passes_on_the_embedded_store() {
    runner::run_all(common::test_now(), embedded).await;
}
