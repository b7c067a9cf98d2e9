//! The conformance scenarios against the embedded (SQLite) store: every
//! scenario on a fresh store in its own temporary directory.

#[path = "conformance/runner.rs"]
mod runner;

use std::sync::Arc;

use counter_gateway::domain::TimePolicy;
use counter_gateway::metrics::Metrics;
use counter_gateway::pipeline::{Pipeline, PipelineConfig};
use counter_gateway::store::sqlite::{Durability, SqliteStore};
use counter_gateway::store::Store;
use counter_gateway::{router, AppState, Limits};
use runner::Target;

/// Relaxed durability: these scenarios test answers, not fsync.
async fn embedded() -> Target {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store: Arc<dyn Store> = Arc::new(
        SqliteStore::open(
            dir.path(),
            Durability::Relaxed,
            std::time::Duration::from_secs(86_400),
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
        limits: Limits::default(),
        metrics,
    };
    Target {
        router: router(state),
        guard: Box::new(dir),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_scenario_passes_on_the_embedded_store() {
    runner::run_all(embedded).await;
}
