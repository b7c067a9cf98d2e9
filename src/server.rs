//! Running the gateway: open the store, start the pipeline, serve HTTP, and
//! shut down in order (stop accepting, flush what is queued, close).

use std::sync::Arc;

use tokio::net::TcpListener;

use crate::api::{self, AppState};
use crate::config::ServeArgs;
use crate::metrics::Metrics;
use crate::pipeline::Pipeline;
use crate::store::elasticsearch::{ElasticsearchStore, SetupArgs};
use crate::store::sqlite::SqliteStore;
use crate::store::Store;

pub async fn serve(args: ServeArgs) -> Result<(), String> {
    args.validate()?;
    let store: Arc<dyn Store> = match args.elasticsearch.to_config(args.idempotency_window)? {
        Some(es) => {
            let (url, prefix) = (es.url.clone(), es.names.prefix().to_string());
            let store = ElasticsearchStore::open(es, !args.elasticsearch.skip_setup)
                .await
                .map_err(|e| e.to_string())?;
            tracing::info!(%url, index_prefix = %prefix, "elasticsearch store open");
            Arc::new(store)
        }
        None => {
            let store = SqliteStore::open(&args.data_dir, args.durability, args.idempotency_window)
                .map_err(|e| e.to_string())?;
            tracing::info!(data_dir = %args.data_dir.display(), durability = ?args.durability, "embedded store open");
            Arc::new(store)
        }
    };
    let metrics = Arc::new(Metrics::default());
    let (pipeline, flusher) = Pipeline::start(store.clone(), args.pipeline(), metrics.clone());
    let state = AppState {
        store,
        pipeline: pipeline.clone(),
        time_policy: args.time_policy(),
        limits: args.limits(),
        metrics,
    };
    let listener = TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    tracing::info!(%addr, "listening");

    axum::serve(listener, api::router(state))
        .with_graceful_shutdown(shutdown_signal())
        .await
        .map_err(|e| format!("server error: {e}"))?;

    tracing::info!("no longer accepting; flushing what is queued");
    pipeline.close();
    match tokio::time::timeout(args.shutdown_timeout, flusher).await {
        Ok(_) => tracing::info!("stopped cleanly"),
        Err(_) => tracing::warn!("flush at shutdown did not finish in time"),
    }
    Ok(())
}

/// `counter-gateway setup`: installs what `index-templates/` holds, then exits.
pub async fn setup(args: SetupArgs) -> Result<(), String> {
    let es = args
        .elasticsearch
        .to_config(std::time::Duration::ZERO)?
        .ok_or("setup needs --elasticsearch-url (or COUNTER_GATEWAY_ELASTICSEARCH_URL)")?;
    let store = ElasticsearchStore::new(es).map_err(|e| e.to_string())?;
    let report = store.setup().await.map_err(|e| e.to_string())?;
    tracing::info!(installed = ?report.installed, current = ?report.current, newer = ?report.newer, "setup done");
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
    tracing::info!("shutdown signal received");
}
