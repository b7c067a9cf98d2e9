//! Tenants: each has its own store (its own SQLite database, or its own
//! Elasticsearch indices `<prefix>_<tenant>_<collection>`) and its own write
//! pipeline, created on first use, so no request of one tenant can reach
//! another's data. All pipelines share one queue bound, so memory stays
//! bounded however many tenants there are.
//!
//! The lookup on every request is one read of an `RwLock`ed map (none at all
//! for the `default` tenant); the lock is written only when a tenant is created.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::task::JoinHandle;

use crate::domain::{Clock, TimePolicy};
use crate::metrics::Metrics;
use crate::pipeline::{Pipeline, PipelineConfig, SharedQueue};
use crate::store::sqlite::{Durability, SqliteStore};
use crate::store::Store;

/// The tenant of requests that name none (and of every request of a
/// gateway without tenants): the data of a gateway before tenants came.
pub const DEFAULT_TENANT: &str = "default";

/// Request limits enforced at the edge.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_body_bytes: usize,
    pub max_events_per_request: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 4 * 1024 * 1024,
            max_events_per_request: 10_000,
        }
    }
}

/// Everything a handler may need for one tenant, cheap to clone: handlers
/// get it from the API's access extractors, for the request's tenant only.
#[derive(Clone)]
pub struct AppState {
    pub store: Arc<dyn Store>,
    pub pipeline: Pipeline,
    pub time_policy: TimePolicy,
    /// Every "now" of a request: event times, windows, report cut-offs.
    pub clock: Clock,
    pub limits: Limits,
    pub metrics: Arc<Metrics>,
}

/// Opens the store of one tenant (no other tenant's data reachable through it).
pub type OpenStore = Box<dyn Fn(&str) -> Result<Arc<dyn Store>, String> + Send + Sync>;

/// Opens tenants of the embedded store: each its own SQLite database in
/// `<data_dir>/tenants/<tenant>/`. (The default tenant stays in `<data_dir>`,
/// where it was before tenants came; tenant names hold no `.`, so they never
/// meet its files.)
pub fn embedded(
    data_dir: &Path,
    durability: Durability,
    id_window: Duration,
    retention_days: u32,
    clock: Clock,
) -> OpenStore {
    let dir = data_dir.join("tenants");
    Box::new(move |tenant| {
        let dir = dir.join(tenant);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        SqliteStore::open(&dir, durability, id_window, retention_days, clock.clone())
            .map(|s| Arc::new(s) as Arc<dyn Store>)
            .map_err(|e| e.to_string())
    })
}

/// Why a tenant name is refused. Names become index names and directory
/// names: 1-64 of `a-z`, `0-9` and `-`, not starting with `-`. `_` is out,
/// since it separates prefix, tenant and collection in index names (with it,
/// tenant `a_b` of collection `c` and tenant `a` of collection `b_c` would
/// share an index).
pub fn validate_tenant(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "tenant {:?} must be 1-64 characters of a-z, 0-9 and '-', not starting with '-'",
            name.chars().take(80).collect::<String>()
        ))
    }
}

/// Why a tenant cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum TenantError {
    #[error("{0}")]
    BadName(String),
    #[error("this gateway serves at most {0} tenants")]
    TooMany(usize),
    #[error("this gateway serves only the default tenant")]
    Disabled,
    #[error("cannot open the store of tenant {tenant}: {reason}")]
    Open { tenant: String, reason: String },
    #[error("the gateway is shutting down")]
    Closed,
}

/// Every tenant's store and pipeline.
pub struct Tenants {
    default: AppState,
    others: RwLock<HashMap<String, AppState>>,
    /// `None`: only the default tenant exists.
    open: Option<OpenStore>,
    max_tenants: usize,
    pipeline: PipelineConfig,
    /// The one queue bound of every tenant's pipeline.
    queue: Arc<SharedQueue>,
    /// Serializes creations, so two first requests of one tenant open one store.
    creating: Mutex<()>,
    flushers: Mutex<Vec<JoinHandle<()>>>,
    closed: AtomicBool,
}

/// What every tenant shares: the rules for event times, the clock, the
/// request limits and the metrics.
pub struct Shared {
    pub time_policy: TimePolicy,
    pub clock: Clock,
    pub limits: Limits,
    pub metrics: Arc<Metrics>,
}

impl Tenants {
    /// Starts the default tenant's pipeline over `store`; other tenants are
    /// opened with `open` when first named (none when `open` is `None`), at
    /// most `max_tenants` in all (the default counted).
    pub fn start(
        store: Arc<dyn Store>,
        pipeline: PipelineConfig,
        shared: Shared,
        open: Option<OpenStore>,
        max_tenants: usize,
    ) -> Tenants {
        let Shared {
            time_policy,
            clock,
            limits,
            metrics,
        } = shared;
        let queue = Arc::new(SharedQueue::new(&pipeline));
        let (p, flusher) = Pipeline::start_sharing(
            store.clone(),
            pipeline.clone(),
            metrics.clone(),
            queue.clone(),
        );
        Tenants {
            default: AppState {
                store,
                pipeline: p,
                time_policy,
                clock,
                limits,
                metrics,
            },
            others: RwLock::new(HashMap::new()),
            open,
            max_tenants: max_tenants.max(1),
            pipeline,
            queue,
            creating: Mutex::new(()),
            flushers: Mutex::new(vec![flusher]),
            closed: AtomicBool::new(false),
        }
    }

    /// Only the default tenant: `app`, whose pipeline its owner started and
    /// stops (what [`crate::api::router`] serves).
    pub fn single(app: AppState) -> Tenants {
        Tenants {
            queue: Arc::new(SharedQueue::new(&PipelineConfig::default())),
            pipeline: PipelineConfig::default(),
            default: app,
            others: RwLock::new(HashMap::new()),
            open: None,
            max_tenants: 1,
            creating: Mutex::new(()),
            flushers: Mutex::new(Vec::new()),
            closed: AtomicBool::new(false),
        }
    }

    /// The default tenant.
    pub fn default_tenant(&self) -> &AppState {
        &self.default
    }

    /// The app of `tenant`, opening its store and starting its pipeline on
    /// first use. `tenant` must have been validated.
    pub fn get(&self, tenant: &str) -> Result<AppState, TenantError> {
        if tenant == DEFAULT_TENANT {
            return Ok(self.default.clone());
        }
        if let Some(app) = self.others.read().expect("tenants lock").get(tenant) {
            return Ok(app.clone());
        }
        self.create(tenant)
    }

    /// Opens a tenant on the calling runtime thread, under a lock: once per
    /// tenant, a SQLite open of a few milliseconds (Elasticsearch: no I/O).
    fn create(&self, tenant: &str) -> Result<AppState, TenantError> {
        let open = self.open.as_ref().ok_or(TenantError::Disabled)?;
        validate_tenant(tenant).map_err(TenantError::BadName)?;
        let _one_at_a_time = self.creating.lock().expect("creating lock");
        if let Some(app) = self.others.read().expect("tenants lock").get(tenant) {
            return Ok(app.clone());
        }
        if self.closed.load(Ordering::Acquire) {
            return Err(TenantError::Closed);
        }
        let count = 1 + self.others.read().expect("tenants lock").len();
        if count >= self.max_tenants {
            return Err(TenantError::TooMany(self.max_tenants));
        }
        let store = open(tenant).map_err(|reason| TenantError::Open {
            tenant: tenant.to_string(),
            reason,
        })?;
        let (pipeline, flusher) = Pipeline::start_sharing(
            store.clone(),
            self.pipeline.clone(),
            self.default.metrics.clone(),
            self.queue.clone(),
        );
        self.flushers.lock().expect("flushers").push(flusher);
        let app = AppState {
            store,
            pipeline,
            ..self.default.clone()
        };
        self.others
            .write()
            .expect("tenants lock")
            .insert(tenant.to_string(), app.clone());
        tracing::info!(tenant, "tenant opened");
        Ok(app)
    }

    /// Tenants open right now, the default included.
    pub fn count(&self) -> usize {
        1 + self.others.read().expect("tenants lock").len()
    }

    /// Events queued or being flushed, over every tenant: the pipelines
    /// share one bound, so any of them sees the total.
    pub fn queue_depth(&self) -> usize {
        self.default.pipeline.depth()
    }

    /// Estimated bytes queued or being flushed, over every tenant.
    pub fn queue_bytes(&self) -> usize {
        self.default.pipeline.queued_bytes()
    }

    /// Closes every pipeline (each flushes what it holds, then stops) and
    /// answers their flusher tasks, to be awaited under the shutdown deadline.
    /// Tenants named after this are refused.
    pub fn close(&self) -> Vec<JoinHandle<()>> {
        let _no_more = self.creating.lock().expect("creating lock");
        self.closed.store(true, Ordering::Release);
        self.default.pipeline.close();
        for app in self.others.read().expect("tenants lock").values() {
            app.pipeline.close();
        }
        std::mem::take(&mut *self.flushers.lock().expect("flushers"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_names_are_index_and_directory_safe() {
        for ok in ["default", "acme", "a", "shop-42", &"x".repeat(64)] {
            assert!(validate_tenant(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "Acme",
            "-acme",
            "a_b",
            "a.b",
            "..",
            "a/b",
            "é",
            " a",
            &"x".repeat(65),
        ] {
            assert!(validate_tenant(bad).is_err(), "{bad:?}");
        }
    }
}
