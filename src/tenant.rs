//! Tenants: each has its own store (its own SQLite database, or its own
//! Elasticsearch indices `<prefix>_<tenant>_<collection>`) and its own write
//! pipeline, so no request of one tenant can reach another's data.
//!
//! A tenant is opened by its first write (on a blocking thread, never on a
//! runtime thread), and closed again once no request has used it for the
//! idle timeout. A read never creates a tenant: one without data is read
//! through an empty store. So what a gateway holds is bounded by the tenants
//! written to lately, at most `--max-tenants`, not by the names requests
//! make up. All pipelines share one queue bound.
//!
//! The lookup on every request is one read of an `RwLock`ed map (none at all
//! for the `default` tenant); the lock is written only when a tenant is
//! opened or closed.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use crate::domain::{Clock, TimePolicy};
use crate::metrics::Metrics;
use crate::pipeline::{Pipeline, PipelineConfig, SharedQueue};
use crate::store::elasticsearch::ElasticsearchStore;
use crate::store::empty::EmptyStore;
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
    /// The actor secret and the limits per actor (this tenant's buckets).
    pub actors: crate::actors::Actors,
    /// `Some` for a write to a tenant that is not open yet: the handler
    /// validates the request first, and only a write about to be applied
    /// opens (and, the first time, creates) the tenant through
    /// [`AppState::opened`]. Nothing of a bad request touches the disk.
    pub pending: Option<Pending>,
}

/// A tenant a write named that is not open: what [`AppState::opened`] needs
/// to open it.
#[derive(Clone)]
pub struct Pending {
    tenants: Arc<Tenants>,
    name: String,
}

impl AppState {
    /// The app a write is applied through: this one when its tenant is
    /// open, else the tenant opened now (created if it has no store yet).
    /// Called once the request is known to be valid and to be applied.
    pub async fn opened(self: Arc<Self>) -> Result<Arc<AppState>, TenantError> {
        match &self.pending {
            None => Ok(self),
            Some(p) => p.tenants.open_for_write(&p.name).await,
        }
    }
}

/// Where the stores of tenants other than the default come from.
pub trait TenantStores: Send + Sync + 'static {
    /// Opens (creating if needed) the store of `tenant`, a validated name.
    /// May block on I/O: it is called on a blocking thread.
    fn open(&self, tenant: &str) -> Result<Arc<dyn Store>, String>;
    /// How to read `tenant` while it is not open, without creating
    /// anything. May block on I/O (a look at the disk).
    fn unopened(&self, tenant: &str) -> Result<Unopened, String>;
    /// How many tenants other than the default hold a store now (open or
    /// not), or `None` when that cannot be told cheaply. Bounds what a
    /// write key of every tenant can create. May block on I/O.
    fn stored(&self) -> Result<Option<usize>, String> {
        Ok(None)
    }
}

/// How a tenant that is not open is read.
pub enum Unopened {
    /// It holds no data: reads answer as from an empty store.
    Empty,
    /// It holds data: it is opened (as a write would) to be read.
    Stored,
    /// It can be read as it is, without opening it (Elasticsearch: its
    /// indices, or none yet, which reads treat as empty).
    ReadThrough(Arc<dyn Store>),
}

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
) -> Arc<dyn TenantStores> {
    embedded_hourly(
        data_dir,
        durability,
        id_window,
        retention_days,
        crate::domain::hours::DEFAULT_HOURLY_RETENTION_DAYS,
        clock,
    )
}

/// [`embedded`] with the days hour buckets are kept (`--hourly-retention-days`).
pub fn embedded_hourly(
    data_dir: &Path,
    durability: Durability,
    id_window: Duration,
    retention_days: u32,
    hourly_retention_days: u32,
    clock: Clock,
) -> Arc<dyn TenantStores> {
    embedded_kept(
        data_dir,
        durability,
        id_window,
        retention_days,
        hourly_retention_days,
        (crate::domain::milestone::DEFAULT_KEPT_DAYS.to_vec(), false),
        Vec::new(),
        clock,
    )
}

/// [`embedded_hourly`] with the `first_<N>_days` lists whose totals each
/// tenant keeps (`--milestone-days`) and whether it builds them when it
/// opens (the flag was given) or at its first list of one of them; and
/// the trending half-lives whose bounds each keeps
/// (`--trending-half-lives`, built when a tenant's store opens).
#[allow(clippy::too_many_arguments)]
pub fn embedded_kept(
    data_dir: &Path,
    durability: Durability,
    id_window: Duration,
    retention_days: u32,
    hourly_retention_days: u32,
    milestone_days: (Vec<u32>, bool),
    trending_half_lives: Vec<i64>,
    clock: Clock,
) -> Arc<dyn TenantStores> {
    Arc::new(Embedded {
        dir: data_dir.join("tenants"),
        durability,
        id_window,
        retention_days,
        hourly_retention_days,
        milestone_days,
        trending_half_lives,
        clock,
    })
}

struct Embedded {
    dir: PathBuf,
    durability: Durability,
    id_window: Duration,
    retention_days: u32,
    hourly_retention_days: u32,
    milestone_days: (Vec<u32>, bool),
    trending_half_lives: Vec<i64>,
    clock: Clock,
}

impl TenantStores for Embedded {
    fn open(&self, tenant: &str) -> Result<Arc<dyn Store>, String> {
        let dir = self.dir.join(tenant);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        SqliteStore::open(
            &dir,
            self.durability,
            self.id_window,
            self.retention_days,
            self.clock.clone(),
        )
        .and_then(|s| {
            s.set_hourly_retention(self.hourly_retention_days);
            s.set_milestone_days(&self.milestone_days.0, self.milestone_days.1)?;
            s.set_trending_half_lives(&self.trending_half_lives)?;
            Ok(Arc::new(s) as Arc<dyn Store>)
        })
        .map_err(|e| e.to_string())
    }

    fn unopened(&self, tenant: &str) -> Result<Unopened, String> {
        let db = self.dir.join(tenant).join(crate::store::sqlite::DB_FILE);
        match db.try_exists() {
            Ok(true) => Ok(Unopened::Stored),
            Ok(false) => Ok(Unopened::Empty),
            Err(e) => Err(format!("{}: {e}", db.display())),
        }
    }

    fn stored(&self) -> Result<Option<usize>, String> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Some(0)),
            Err(e) => return Err(format!("{}: {e}", self.dir.display())),
        };
        let mut n = 0;
        for entry in entries {
            let entry = entry.map_err(|e| format!("{}: {e}", self.dir.display()))?;
            if entry.path().join(crate::store::sqlite::DB_FILE).exists() {
                n += 1;
            }
        }
        Ok(Some(n))
    }
}

/// Opens tenants of an Elasticsearch store: the same client over each
/// tenant's own indices. Opening costs no I/O; reads of a tenant never
/// written to go to its (missing) indices, which answer as empty.
pub fn elasticsearch(base: ElasticsearchStore) -> Arc<dyn TenantStores> {
    Arc::new(Elasticsearch(base))
}

struct Elasticsearch(ElasticsearchStore);

impl TenantStores for Elasticsearch {
    fn open(&self, tenant: &str) -> Result<Arc<dyn Store>, String> {
        self.0
            .for_tenant(tenant)
            .map(|s| Arc::new(s) as Arc<dyn Store>)
            .map_err(|e| e.to_string())
    }

    fn unopened(&self, tenant: &str) -> Result<Unopened, String> {
        self.open(tenant).map(Unopened::ReadThrough)
    }
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
    #[error("this gateway serves at most {0} tenants at once")]
    TooMany(usize),

    #[error("this gateway serves only the default tenant")]
    Disabled,
    #[error("cannot open the store of tenant {tenant}: {reason}")]
    Open { tenant: String, reason: String },
    #[error("the gateway is shutting down")]
    Closed,
}

/// What a client is told when its tenant cannot be served (the same
/// mapping the access layer makes).
impl From<TenantError> for crate::error::ApiError {
    fn from(e: TenantError) -> Self {
        use crate::error::ApiError;
        match e {
            TenantError::BadName(m) => ApiError::BadRequest(m),
            TenantError::Disabled => ApiError::BadRequest(e.to_string()),
            TenantError::TooMany(_) | TenantError::Closed | TenantError::Open { .. } => {
                ApiError::Unavailable(e.to_string())
            }
        }
    }
}

/// An open tenant other than the default.
struct OpenTenant {
    app: Arc<AppState>,
    flusher: JoinHandle<()>,
    /// When a request last used it, in milliseconds since [`Tenants::epoch`]
    /// (monotonic: it schedules closing, it is no calendar time).
    used_ms: AtomicU64,
}

/// A tenant being closed: done once its pipeline has stopped and its store
/// has been dropped (which folds the change log and writes window totals
/// back), so a reopening never runs a second store on the same files.
struct Closing {
    done: tokio::sync::watch::Receiver<bool>,
    task: Option<JoinHandle<()>>,
}

/// How long a reopening waits for the tenant's close before answering 503.
const CLOSE_WAIT: Duration = Duration::from_secs(30);

/// Every tenant's store and pipeline.
pub struct Tenants {
    default: Arc<AppState>,
    default_flusher: Mutex<Option<JoinHandle<()>>>,
    others: RwLock<HashMap<String, OpenTenant>>,
    /// Tenants closed by [`Tenants::close_idle`] whose close may still run.
    closing: Mutex<HashMap<String, Closing>>,
    /// `None`: only the default tenant exists.
    stores: Option<Arc<dyn TenantStores>>,
    /// What reads of a tenant that is not open get, with the store to read
    /// it through: a pipeline that is already stopped, so nothing read this
    /// way can ever be written to.
    read_only: Option<Arc<AppState>>,
    max_tenants: usize,
    pipeline: PipelineConfig,
    /// The one queue bound of every tenant's pipeline.
    queue: Arc<SharedQueue>,
    /// Serializes openings, so two first requests of one tenant open one store.
    creating: tokio::sync::Mutex<()>,
    closed: AtomicBool,
    epoch: Instant,
}

/// What every tenant shares: the rules for event times, the clock, the
/// request limits and the metrics.
pub struct Shared {
    pub time_policy: TimePolicy,
    pub clock: Clock,
    pub limits: Limits,
    pub metrics: Arc<Metrics>,
    pub actors: crate::actors::Actors,
}

impl Tenants {
    /// Starts the default tenant's pipeline over `store`; other tenants are
    /// opened through `stores` when first written to (none when `stores` is
    /// `None`), at most `max_tenants` open at once (the default counted).
    pub fn start(
        store: Arc<dyn Store>,
        pipeline: PipelineConfig,
        shared: Shared,
        stores: Option<Arc<dyn TenantStores>>,
        max_tenants: usize,
    ) -> Tenants {
        let Shared {
            time_policy,
            clock,
            limits,
            metrics,
            actors,
        } = shared;
        let queue = Arc::new(SharedQueue::new(&pipeline));
        let (p, flusher) = Pipeline::start_sharing(
            store.clone(),
            pipeline.clone(),
            metrics.clone(),
            queue.clone(),
        );
        let default = AppState {
            store,
            pipeline: p,
            time_policy,
            clock,
            limits,
            metrics,
            actors,
            pending: None,
        };
        let read_only = stores.as_ref().map(|_| {
            let empty: Arc<dyn Store> = Arc::new(EmptyStore);
            let (p, _ends_at_once) = Pipeline::start_sharing(
                empty.clone(),
                pipeline.clone(),
                default.metrics.clone(),
                queue.clone(),
            );
            p.stop();
            Arc::new(AppState {
                store: empty,
                pipeline: p,
                ..default.clone()
            })
        });
        Tenants {
            default: Arc::new(default),
            default_flusher: Mutex::new(Some(flusher)),
            others: RwLock::new(HashMap::new()),
            closing: Mutex::new(HashMap::new()),
            stores,
            read_only,
            max_tenants: max_tenants.max(1),
            pipeline,
            queue,
            creating: tokio::sync::Mutex::new(()),
            closed: AtomicBool::new(false),
            epoch: Instant::now(),
        }
    }

    /// Only the default tenant: `app`, whose pipeline its owner started and
    /// stops (what [`crate::api::router`] serves).
    pub fn single(app: AppState) -> Tenants {
        Tenants {
            queue: Arc::new(SharedQueue::new(&PipelineConfig::default())),
            pipeline: PipelineConfig::default(),
            default: Arc::new(app),
            default_flusher: Mutex::new(None),
            others: RwLock::new(HashMap::new()),
            closing: Mutex::new(HashMap::new()),
            stores: None,
            read_only: None,
            max_tenants: 1,
            creating: tokio::sync::Mutex::new(()),
            closed: AtomicBool::new(false),
            epoch: Instant::now(),
        }
    }

    /// The default tenant.
    pub fn default_tenant(&self) -> &AppState {
        &self.default
    }

    /// The app of `tenant` for a write: the open tenant's, else one that
    /// opens it only when the write is applied ([`AppState::opened`]), so
    /// that a request refused (a bad body, a crawler, a `HEAD`) creates
    /// nothing.
    pub async fn writer(self: &Arc<Self>, tenant: &str) -> Result<Arc<AppState>, TenantError> {
        if tenant == DEFAULT_TENANT {
            return Ok(self.default.clone());
        }
        if let Some(app) = self.lookup(tenant) {
            return Ok(app);
        }
        let read_only = self.read_only.as_ref().ok_or(TenantError::Disabled)?;
        validate_tenant(tenant).map_err(TenantError::BadName)?;
        if self.closed.load(Ordering::Acquire) {
            return Err(TenantError::Closed);
        }
        Ok(Arc::new(AppState {
            actors: self.default.actors.for_tenant(tenant),
            pending: Some(Pending {
                tenants: self.clone(),
                name: tenant.to_string(),
            }),
            ..AppState::clone(read_only)
        }))
    }

    /// The open app of `tenant` for a write being applied, opened now if
    /// it is not open.
    async fn open_for_write(&self, tenant: &str) -> Result<Arc<AppState>, TenantError> {
        if let Some(app) = self.lookup(tenant) {
            return Ok(app);
        }
        self.create(tenant).await
    }

    /// The app of `tenant` for a read: the open tenant, else one opened
    /// because it holds data, else a read-only view that creates nothing.
    pub async fn reader(&self, tenant: &str) -> Result<Arc<AppState>, TenantError> {
        if tenant == DEFAULT_TENANT {
            return Ok(self.default.clone());
        }
        if let Some(app) = self.lookup(tenant) {
            return Ok(app);
        }
        let (stores, read_only) = match (&self.stores, &self.read_only) {
            (Some(s), Some(r)) => (s.clone(), r),
            _ => return Err(TenantError::Disabled),
        };
        validate_tenant(tenant).map_err(TenantError::BadName)?;
        let name = tenant.to_string();
        let unopened = blocking(tenant, move || stores.unopened(&name)).await?;
        match unopened {
            Unopened::Empty => Ok(read_only.clone()),
            Unopened::ReadThrough(store) => Ok(Arc::new(AppState {
                store,
                ..AppState::clone(read_only)
            })),
            Unopened::Stored => self.create(tenant).await,
        }
    }

    /// The app of `tenant` if it is open (the default always is), without
    /// marking it used: the live streams' pollers look often, and a tenant
    /// only streamed may still close when idle.
    pub fn open_app(&self, tenant: &str) -> Option<Arc<AppState>> {
        if tenant == DEFAULT_TENANT {
            return Some(self.default.clone());
        }
        let others = self.others.read().expect("tenants lock");
        others.get(tenant).map(|open| open.app.clone())
    }

    /// The open tenant's app, marked as used now.
    fn lookup(&self, tenant: &str) -> Option<Arc<AppState>> {
        let others = self.others.read().expect("tenants lock");
        let open = others.get(tenant)?;
        open.used_ms.store(self.now_ms(), Ordering::Relaxed);
        Some(open.app.clone())
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Opens a tenant's store on a blocking thread and starts its pipeline,
    /// one opening at a time.
    async fn create(&self, tenant: &str) -> Result<Arc<AppState>, TenantError> {
        let stores = self.stores.clone().ok_or(TenantError::Disabled)?;
        validate_tenant(tenant).map_err(TenantError::BadName)?;
        self.closed_before(tenant).await?;
        let _one_at_a_time = self.creating.lock().await;
        if let Some(app) = self.lookup(tenant) {
            return Ok(app);
        }
        if self.closed.load(Ordering::Acquire) {
            return Err(TenantError::Closed);
        }
        if self.count() >= self.max_tenants {
            return Err(TenantError::TooMany(self.max_tenants));
        }
        let name = tenant.to_string();
        let max = self.max_tenants;
        let store = blocking(tenant, move || {
            // A tenant without a store yet is a new one on disk: counted
            // against the bound with every stored one, open or not.
            if matches!(stores.unopened(&name)?, Unopened::Empty) {
                if let Some(n) = stores.stored()? {
                    if n + 1 >= max {
                        return Err(format!(
                            "this gateway keeps at most {max} tenants on disk, the default counted, open or not: a new one is refused until an operator removes one (its directory) or raises --max-tenants"
                        ));
                    }
                }
            }
            stores.open(&name)
        })
        .await?;
        // Before anything writes: marks an earlier version keyed without
        // the tenant are brought to it (once), or the tenant is refused.
        let actors = self.default.actors.for_tenant(tenant);
        store
            .key_marks(&actors.key)
            .await
            .map_err(|e| TenantError::Open {
                tenant: tenant.to_string(),
                reason: e.to_string(),
            })?;
        let (pipeline, flusher) = Pipeline::start_sharing(
            store.clone(),
            self.pipeline.clone(),
            self.default.metrics.clone(),
            self.queue.clone(),
        );
        let app = Arc::new(AppState {
            store,
            pipeline,
            actors,
            ..AppState::clone(&self.default)
        });
        let mut others = self.others.write().expect("tenants lock");
        // Checked again under the lock `close` takes: a tenant opened while
        // the gateway shut down is stopped at once, never left running.
        if self.closed.load(Ordering::Acquire) {
            app.pipeline.stop();
            return Err(TenantError::Closed);
        }
        others.insert(
            tenant.to_string(),
            OpenTenant {
                app: app.clone(),
                flusher,
                used_ms: AtomicU64::new(self.now_ms()),
            },
        );
        tracing::info!(tenant, "tenant opened");
        Ok(app)
    }

    /// Waits until the close of `tenant` that [`Tenants::close_idle`]
    /// began (if any) is over: its store dropped, its files written back.
    async fn closed_before(&self, tenant: &str) -> Result<(), TenantError> {
        let done = match self.closing.lock().expect("closing lock").get(tenant) {
            Some(c) => c.done.clone(),
            None => return Ok(()),
        };
        let mut done = done;
        let waited = tokio::time::timeout(CLOSE_WAIT, done.wait_for(|d| *d))
            .await
            .map(|_| ());
        match waited {
            // Ended, or its task is gone (which drops the sender when done).
            Ok(_) => {
                let mut closing = self.closing.lock().expect("closing lock");
                if closing.get(tenant).is_some_and(|c| *c.done.borrow()) {
                    closing.remove(tenant);
                }
                Ok(())
            }
            Err(_) => Err(TenantError::Open {
                tenant: tenant.to_string(),
                reason: format!(
                    "its store is still being closed after {}s; try again",
                    CLOSE_WAIT.as_secs()
                ),
            }),
        }
    }

    /// Closes the tenants (never the default) that no request has used for
    /// `idle` and that no request holds right now: each one's pipeline
    /// flushes what it holds (nothing, since no request holds it) and
    /// stops, then its store is dropped on a blocking thread (folding its
    /// change log and writing window totals back). A later request opens
    /// it again once that is over. Answers how many were closed.
    pub fn close_idle(&self, idle: Duration) -> usize {
        let idle_ms = u64::try_from(idle.as_millis()).unwrap_or(u64::MAX);
        let now = self.now_ms();
        let mut closing = Vec::new();
        {
            // Under the write lock no request can take a new handle, so an
            // app with one handle (the map's), whose pipeline has one too,
            // has no request on it.
            let mut others = self.others.write().expect("tenants lock");
            let names: Vec<String> = others
                .iter()
                .filter(|(_, open)| {
                    let quiet = now.saturating_sub(open.used_ms.load(Ordering::Relaxed)) >= idle_ms;
                    let unheld =
                        Arc::strong_count(&open.app) == 1 && open.app.pipeline.handles() == 1;
                    quiet && unheld
                })
                .map(|(name, _)| name.clone())
                .collect();
            for name in names {
                if let Some(open) = others.remove(&name) {
                    open.app.pipeline.stop();
                    closing.push((name, open));
                }
            }
        }
        let n = closing.len();
        let mut waits = self.closing.lock().expect("closing lock");
        waits.retain(|_, c| !*c.done.borrow());
        for (tenant, open) in closing {
            let (tx, done) = tokio::sync::watch::channel(false);
            let task = tokio::spawn(finish_close(open, tx));
            waits.insert(
                tenant.clone(),
                Closing {
                    done,
                    task: Some(task),
                },
            );
            tracing::info!(tenant = %tenant, "idle tenant closed");
        }
        n
    }

    /// Closes idle tenants in the background, every so often, until the
    /// tenants are dropped or closed. `idle` zero: never.
    pub fn spawn_idle_closer(tenants: &Arc<Tenants>, idle: Duration) {
        if idle.is_zero() {
            return;
        }
        let every = (idle / 4).clamp(Duration::from_millis(100), Duration::from_secs(30));
        let tenants: Weak<Tenants> = Arc::downgrade(tenants);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(t) = tenants.upgrade() else { return };
                if t.closed.load(Ordering::Acquire) {
                    return;
                }
                t.close_idle(idle);
            }
        });
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
        let mut others = self.others.write().expect("tenants lock");
        self.closed.store(true, Ordering::Release);
        self.default.pipeline.close();
        let mut flushers: Vec<JoinHandle<()>> = self
            .default_flusher
            .lock()
            .expect("flusher lock")
            .take()
            .into_iter()
            .collect();
        for (_, open) in others.drain() {
            open.app.pipeline.close();
            flushers.push(open.flusher);
        }
        let mut closing = self.closing.lock().expect("closing lock");
        flushers.extend(closing.values_mut().filter_map(|c| c.task.take()));
        flushers
    }
}

/// The end of an idle tenant's close: its flusher stops, then the last
/// handle on its store is dropped here, on a blocking thread, so that
/// `done` says true only once the store's files are written back.
async fn finish_close(open: OpenTenant, done: tokio::sync::watch::Sender<bool>) {
    let OpenTenant { app, flusher, .. } = open;
    if let Err(e) = flusher.await {
        tracing::warn!(error = %e, "the flusher of a closing tenant failed");
    }
    let store = match Arc::try_unwrap(app) {
        Ok(app) => app.store,
        Err(app) => app.store.clone(),
    };
    let dropped = tokio::task::spawn_blocking(move || {
        // Whoever else still holds the store (a read that began before the
        // close) lets go soon; the drop must be the last one, here.
        while Arc::strong_count(&store) > 1 {
            std::thread::sleep(Duration::from_millis(2));
        }
        drop(store);
    })
    .await;
    if let Err(e) = dropped {
        tracing::warn!(error = %e, "closing a tenant's store failed");
    }
    let _ = done.send(true);
}

/// Runs `f` (store I/O) on a blocking thread, so a slow disk never stalls
/// the runtime threads that serve every other request.
async fn blocking<T: Send + 'static>(
    tenant: &str,
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, TenantError> {
    let failed = |reason: String| TenantError::Open {
        tenant: tenant.to_string(),
        reason,
    };
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| failed(format!("the opening task failed: {e}")))?
        .map_err(failed)
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
