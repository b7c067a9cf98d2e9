//! Running the gateway: open the store, start the pipeline, serve HTTP, and
//! shut down in order (stop accepting, flush what is queued, close).

use std::sync::Arc;

use tokio::net::{TcpListener, TcpSocket};

use crate::actors::Actors;
use crate::api::{self, Gateway};
use crate::config::ServeArgs;
use crate::domain::{ActorKey, Clock};
use crate::metrics::Metrics;
use crate::store::elasticsearch::{ElasticsearchStore, SetupArgs};
use crate::store::sqlite::SqliteStore;
use crate::store::Store;
use crate::tenant::{self, Shared, TenantStores, Tenants, DEFAULT_TENANT};

pub async fn serve(args: ServeArgs) -> Result<(), String> {
    args.validate()?;
    crate::store::sqlite::set_memory_budget(args.store.sqlite_memory_budget);
    // The one clock of the process: every store and handler reads it.
    let clock = Clock::system();
    let keys = args.keys()?;
    args.check_exposure(&keys)?;
    let actor_limits = args.actor_limits()?;
    let configured_secret = match &args.actor_secret {
        Some(s) => Some(ActorKey::new(s.as_bytes()).map_err(|e| format!("--actor-secret: {e}"))?),
        None => None,
    };
    let mut actor_key = ActorKey::none();
    // Compiled before serving: the first beacon does not wait for it.
    let crawlers = api::crawlers::list().map_err(str::to_string)?;
    let (store, open): (Arc<dyn Store>, Arc<dyn TenantStores>) = match args
        .store
        .elasticsearch
        .to_config(args.store.idempotency_window)?
    {
        Some(mut es) => {
            es.hourly_retention_days = args.store.hourly_retention_days;
            es.check_script_loops(args.max_events_per_request)?;
            let (url, prefix) = (es.urls.join(","), es.names.prefix().to_string());
            // Templates and scripts are installed once, for every tenant.
            let store =
                ElasticsearchStore::open(es, clock.clone(), !args.store.elasticsearch.skip_setup)
                    .await
                    .map_err(|e| e.to_string())?;
            tracing::info!(%url, nodes = ?store.node_urls(), index_prefix = %prefix, "elasticsearch store open");
            // A secret made here would differ per gateway, and every one
            // sharing the cluster must mark an actor the same way.
            match &configured_secret {
                Some(k) => actor_key = k.clone(),
                None => tracing::warn!(
                    "no --actor-secret: events with `unique` are refused (400); give every gateway of this cluster the same secret to count once per actor"
                ),
            }
            // Marks copied in (migrate, import) are keyed with the secret
            // recorded with them: another one would count every actor again.
            match store.recorded_fingerprints().await {
                Ok(recorded) => {
                    if let Some(warning) =
                        crate::actors::check_recorded_secret(&recorded, &actor_key)?
                    {
                        tracing::warn!("{warning}");
                    }
                }
                Err(e) => tracing::warn!(
                    error = %e,
                    "could not read the actor secret's fingerprint recorded in the cluster: this gateway's secret is not checked against it"
                ),
            }
            // Marks an earlier version keyed without their tenant are not
            // re-keyed in place on a cluster: refused, saying how to go on.
            store.check_mark_keying().await?;
            // Without ILM (OpenSearch) the gateway deletes expired bucket
            // months itself, in the background, never on the write path.
            let retention = Arc::new(
                store
                    .for_tenant(DEFAULT_TENANT)
                    .map_err(|e| e.to_string())?,
            );
            tokio::spawn(retention.run_retention(args.store.retention_days));
            let base = store
                .for_tenant(DEFAULT_TENANT)
                .map_err(|e| e.to_string())?;
            (Arc::new(store), tenant::elasticsearch(base))
        }
        None => {
            let kept_days = args.store.kept_days();
            let store = SqliteStore::open(
                &args.store.data_dir,
                args.store.durability,
                args.store.idempotency_window,
                args.store.retention_days,
                clock.clone(),
            )
            .map_err(|e| e.to_string())?;
            store.set_hourly_retention(args.store.hourly_retention_days);
            store
                .set_milestone_days(&kept_days.0, kept_days.1)
                .map_err(|e| e.to_string())?;
            store
                .set_trending_half_lives(&args.store.trending_half_lives)
                .map_err(|e| e.to_string())?;
            tracing::info!(data_dir = %args.store.data_dir.display(), durability = ?args.store.durability, "embedded store open");
            actor_key = match &configured_secret {
                Some(k) => k.clone(),
                None => crate::actors::embedded_secret(&args.store.data_dir)?,
            };
            (
                Arc::new(store),
                tenant::embedded_kept(
                    &args.store.data_dir,
                    args.store.durability,
                    args.store.idempotency_window,
                    args.store.retention_days,
                    args.store.hourly_retention_days,
                    kept_days,
                    args.store.trending_half_lives.clone(),
                    clock.clone(),
                ),
            )
        }
    };
    // Before anything writes: the default tenant's marks an earlier version
    // keyed without the tenant are brought to it (once), or start-up stops.
    store
        .key_marks(&actor_key)
        .await
        .map_err(|e| format!("the actor marks of the default tenant: {e}"))?;
    let metrics = Arc::new(Metrics::default());
    let tenants = Tenants::start(
        store,
        args.pipeline(),
        Shared {
            time_policy: args.time_policy(),
            clock,
            limits: args.limits(),
            metrics: metrics.clone(),
            actors: Actors::new(actor_key, actor_limits),
        },
        Some(open),
        args.max_tenants,
    );
    tracing::info!(
        keys = keys.len(),
        cors_origins = ?args.cors_origins,
        allowed_hosts = ?args.allowed_hosts,
        rate_limit_per_second = ?args.rate_limit_per_second,
        request_timeout = ?args.request_timeout,
        max_tenants = args.max_tenants,
        actor_limits = args.actor_limits.len(),
        crawlers = %crawlers.name(),
        count_crawlers = args.count_crawlers,
        write_keys_read_values = args.write_keys_read_values,
        "access"
    );
    let gateway = Gateway {
        tenants: Arc::new(tenants),
        keys: Arc::new(keys),
        rate_limit: args
            .rate_limit_per_second
            .map(|n| Arc::new(crate::ratelimit::RateLimiter::new(n))),
        request_timeout: (!args.request_timeout.is_zero()).then_some(args.request_timeout),
        cors_origins: args.cors_origins.clone().into(),
        allowed_hosts: args
            .allowed_hosts
            .iter()
            .map(|h| h.trim().to_owned())
            .collect(),
        metrics,
        counters_max_age: args.counters_cache_max_age,
        count_crawlers: args.count_crawlers,
        write_keys_read_values: args.write_keys_read_values,
        streams: Arc::new(api::stream::Streams::new(args.streams())),
    };
    let streams = gateway.streams.clone();
    let tenants = gateway.tenants.clone();
    Tenants::spawn_idle_closer(&tenants, args.tenant_idle_timeout);
    let app = api::gateway_app(gateway)?;
    let listener =
        listen(args.listen).map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    tracing::info!(%addr, "listening");

    // Answers go out as soon as they are written: a client waiting on one
    // is never held back by Nagle's algorithm for the rest of a segment.
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY not set");
        }
    });
    axum::serve(listener, app.into_make_service())
        .with_graceful_shutdown(async move {
            shutdown_signal().await;
            // Live streams never end on their own: the server would wait for
            // them forever.
            streams.close();
        })
        .await
        .map_err(|e| format!("server error: {e}"))?;

    tracing::info!(
        tenants = tenants.count(),
        "no longer accepting; flushing what is queued"
    );
    let flushers = tenants.close();
    let all = async {
        for f in flushers {
            let _ = f.await;
        }
    };
    match tokio::time::timeout(args.shutdown_timeout, all).await {
        Ok(()) => tracing::info!("stopped cleanly"),
        Err(_) => tracing::warn!("flush at shutdown did not finish in time"),
    }
    Ok(())
}

/// `counter-gateway setup`: installs what `index-templates/` holds, then exits.
/// With `--kibana-url`, also imports the Kibana objects (after the
/// templates, so the data views find their indices' mappings).
pub async fn setup(args: SetupArgs) -> Result<(), String> {
    let es = args.elasticsearch.to_config(std::time::Duration::ZERO)?;
    if es.is_none() && args.kibana_url.is_none() {
        return Err(
            "setup needs --elasticsearch-url (or COUNTER_GATEWAY_ELASTICSEARCH_URL), --kibana-url, or both"
                .into(),
        );
    }
    if let Some(es) = es {
        let store = ElasticsearchStore::new(es, Clock::system()).map_err(|e| e.to_string())?;
        let report = store.setup().await.map_err(|e| e.to_string())?;
        tracing::info!(engine = %report.engine, installed = ?report.installed, current = ?report.current, newer = ?report.newer, "setup done");
    }
    if let Some(url) = &args.kibana_url {
        let auth = args.elasticsearch.auth();
        let report =
            crate::kibana::import(url, auth.as_ref(), &args.elasticsearch.index_prefix).await?;
        tracing::info!(kibana = %url, objects = report.objects, "kibana objects imported");
    }
    Ok(())
}

/// Connections the kernel holds for us before `accept`. The usual 128 is
/// what a burst of a thousand clients overflows while the gateway is busy:
/// the kernel then resets connections, requests that get no answer at all
/// (seen in the overload soak). Linux caps it at `net.core.somaxconn`.
const LISTEN_BACKLOG: u32 = 4096;

fn listen(addr: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    // A restarted gateway can bind while the old one's connections linger.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
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
