//! Data in and out: `export` (a tenant as NDJSON), `import` (NDJSON set
//! into a store) and `migrate` (every tenant of the embedded store into
//! Elasticsearch, then verified). The format is in [`format`]; the stores
//! only answer pages and apply batches (`Store::counter_page`,
//! `Store::average_page`, `Store::mark_page`, `Store::import`), so every
//! command works on both. The actor secret the marks are keyed with is
//! followed by its fingerprint ([`secret`]).
//!
//! ```text
//! export:  store ─▶ pages in key order ─▶ format ─▶ file or stdout
//! import:  file or stdin ─▶ lines ─▶ format (checked) ─▶ batches ─▶ store (checkpoint after each)
//! migrate: per tenant, export(embedded) ─▶ in-memory pipe ─▶ import(Elasticsearch), then verify
//! ```
//!
#![doc = include_str!("README.md")]

pub mod export;
pub mod format;
pub mod import;
pub mod migrate;
pub mod secret;

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::{ExportArgs, ImportArgs, MigrateArgs, StoreArgs};
use crate::domain::Clock;
use crate::store::elasticsearch::ElasticsearchStore;
use crate::store::sqlite::{SqliteStore, DB_FILE};
use crate::store::Store;
use crate::tenant::{validate_tenant, DEFAULT_TENANT};

/// What a progress bar counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// Bytes read, of a total when the input's size is known.
    Bytes(Option<u64>),
    /// Records written.
    Records,
}

/// A progress bar on stderr when it is a terminal (hidden otherwise, so
/// logs and pipes get only the final count).
pub fn progress(unit: Unit) -> indicatif::ProgressBar {
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let (bar, template) = match unit {
        Unit::Bytes(Some(n)) => (
            indicatif::ProgressBar::new(n),
            "{bar:30} {bytes}/{total_bytes} {msg} ({elapsed}, {eta} left)",
        ),
        Unit::Bytes(None) => (
            indicatif::ProgressBar::new_spinner(),
            "{spinner} {bytes} read, {msg} ({elapsed}, {bytes_per_sec})",
        ),
        Unit::Records => (
            indicatif::ProgressBar::new_spinner(),
            "{spinner} {pos} records {msg} ({elapsed}, {per_sec})",
        ),
    };
    if let Ok(style) = indicatif::ProgressStyle::with_template(template) {
        bar.set_style(style);
    }
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    bar
}

/// The directory of `tenant`'s embedded store: the data directory itself
/// for the default tenant, `tenants/<tenant>/` in it for the others.
pub fn embedded_dir(data_dir: &Path, tenant: &str) -> PathBuf {
    if tenant == DEFAULT_TENANT {
        data_dir.to_path_buf()
    } else {
        data_dir.join("tenants").join(tenant)
    }
}

/// Opens `tenant`'s embedded store; unless `create`, only one that exists
/// (an export of a mistyped directory must not create an empty store).
pub fn open_embedded(
    args: &StoreArgs,
    tenant: &str,
    create: bool,
    clock: Clock,
) -> Result<SqliteStore, String> {
    let dir = embedded_dir(&args.data_dir, tenant);
    if !create && !dir.join(DB_FILE).exists() {
        return Err(format!(
            "no embedded store of tenant {tenant} in {} (no {DB_FILE}): check --data-dir and --tenant",
            dir.display()
        ));
    }
    SqliteStore::open(
        &dir,
        args.durability,
        args.idempotency_window,
        args.retention_days,
        clock,
    )
    .map_err(|e| format!("{}: {e}", dir.display()))
}

/// The Elasticsearch store of `args` (`None` without `--elasticsearch-url`),
/// for `tenant`; with `setup`, templates and scripts installed first
/// (unless `--skip-setup`).
pub async fn open_elasticsearch(
    args: &StoreArgs,
    tenant: &str,
    setup: bool,
    clock: Clock,
) -> Result<Option<ElasticsearchStore>, String> {
    let Some(cfg) = args.elasticsearch.to_config(args.idempotency_window)? else {
        return Ok(None);
    };
    let run_setup = setup && !args.elasticsearch.skip_setup;
    let base = ElasticsearchStore::open(cfg, clock, run_setup)
        .await
        .map_err(|e| e.to_string())?;
    base.for_tenant(tenant).map(Some).map_err(|e| e.to_string())
}

/// The store an export or import names.
enum Opened {
    /// The embedded store of a tenant of the data directory `data_dir`.
    Embedded {
        store: Arc<SqliteStore>,
        data_dir: PathBuf,
        tenant: String,
    },
    /// A tenant on Elasticsearch.
    Cluster(Arc<ElasticsearchStore>),
}

impl Opened {
    fn store(&self) -> Arc<dyn Store> {
        match self {
            Opened::Embedded { store, .. } => store.clone(),
            Opened::Cluster(store) => store.clone(),
        }
    }

    /// What an import into this store checks a file's secret against.
    fn secret_check(&self, given: Option<&str>) -> secret::SecretCheck {
        let given = given.map(str::to_string);
        match self {
            Opened::Embedded {
                data_dir, tenant, ..
            } => secret::SecretCheck::Embedded {
                data_dir: data_dir.clone(),
                tenant: tenant.clone(),
                given,
            },
            Opened::Cluster(store) => secret::SecretCheck::Cluster {
                store: store.clone(),
                given,
                key: None,
            },
        }
    }

    /// The fingerprint of the secret this store's marks are keyed with, as
    /// far as it is known: `--actor-secret`'s; else the embedded store's
    /// `actor-secret` file's (read, never made), or the one recorded in the
    /// cluster. Both known and different is an error.
    async fn fingerprint(&self, given: Option<&str>) -> Result<Option<String>, String> {
        let given = secret::given_fingerprint(given)?;
        let (stored, source) = match self {
            Opened::Embedded { data_dir, .. } => (
                crate::actors::existing_embedded_secret(data_dir)?.and_then(|k| k.fingerprint()),
                format!("{}", data_dir.join(crate::actors::SECRET_FILE).display()),
            ),
            Opened::Cluster(store) => (
                // Reading it needs `view_index_metadata`: an export by a
                // user without it goes on, naming no secret.
                match store.recorded_fingerprint().await {
                    Ok(fp) => fp,
                    Err(e) => {
                        eprintln!("could not read the actor secret's fingerprint recorded in the cluster ({e}); the export names none");
                        None
                    }
                },
                format!(
                    "the fingerprint recorded on {}",
                    store.config().names.actor_marks()
                ),
            ),
        };
        match (given, stored) {
            (Some(g), Some(s)) if g != s && matches!(self, Opened::Cluster(_)) => Err(format!(
                "--actor-secret has fingerprint {g}, and {source} says the marks are keyed with {s}: give the secret the gateways use"
            )),
            // An embedded gateway given --actor-secret uses it, not the file.
            (Some(g), _) => Ok(Some(g)),
            (None, s) => Ok(s),
        }
    }
}

/// The store an export or import names: Elasticsearch with a URL, else
/// the embedded store.
async fn open_store(
    args: &StoreArgs,
    tenant: &str,
    writing: bool,
    given: Option<&str>,
    clock: Clock,
) -> Result<Opened, String> {
    validate_tenant(tenant).map_err(|e| format!("--tenant: {e}"))?;
    args.validate()?;
    crate::store::sqlite::set_memory_budget(args.sqlite_memory_budget);
    match open_elasticsearch(args, tenant, writing, clock.clone()).await? {
        Some(es) => Ok(Opened::Cluster(Arc::new(es))),
        None => {
            let store = open_embedded(args, tenant, writing, clock)?;
            key_embedded_marks(&store, &args.data_dir, tenant, given).await?;
            Ok(Opened::Embedded {
                store: Arc::new(store),
                data_dir: args.data_dir.clone(),
                tenant: tenant.to_string(),
            })
        }
    }
}

/// Brings an embedded store's marks to its tenant's keying (as its gateway
/// does when it opens it) when their secret is known here: `given`
/// (`--actor-secret`), else the data directory's. Unknown, they are left,
/// and an export says they are of the first keying.
pub async fn key_embedded_marks(
    store: &SqliteStore,
    data_dir: &Path,
    tenant: &str,
    given: Option<&str>,
) -> Result<(), String> {
    let key = match given {
        Some(s) => Some(
            crate::domain::ActorKey::new(s.as_bytes())
                .map_err(|e| format!("--actor-secret: {e}"))?,
        ),
        None => crate::actors::existing_embedded_secret(data_dir)?,
    };
    if let Some(k) = key {
        store
            .key_marks(&k.for_tenant(tenant))
            .await
            .map_err(|e| format!("tenant {tenant}: {e}"))?;
    }
    Ok(())
}

/// `counter-gateway export`.
pub async fn run_export(args: ExportArgs, clock: Clock) -> Result<(), String> {
    let opened = open_store(
        &args.store,
        &args.tenant,
        false,
        args.secret.actor_secret.as_deref(),
        clock.clone(),
    )
    .await?;
    let store = opened.store();
    let rules = format::Rules {
        now: clock.now(),
        policy: args.store.time_policy(),
    };
    let marks = !args.secret.skip_marks;
    let fingerprint = if marks {
        opened
            .fingerprint(args.secret.actor_secret.as_deref())
            .await?
    } else {
        None
    };
    let what = export::Export {
        from_day: rules.oldest_day(),
        hours_from_day: rules.oldest_hour_day(),
        marks,
        fingerprint,
        tenant: args.tenant.clone(),
    };
    let bar = progress(Unit::Records);
    let started = std::time::Instant::now();
    let target = args.output.filter(|p| p.as_os_str() != "-");
    let done = match &target {
        Some(path) => {
            // Written beside the target and renamed at the end, so a file
            // of that name is always a complete export.
            let mut tmp = path.as_os_str().to_owned();
            tmp.push(".partial");
            let tmp = PathBuf::from(tmp);
            let file = tokio::fs::File::create(&tmp)
                .await
                .map_err(|e| format!("--output {}: {e}", tmp.display()))?;
            let mut out = tokio::io::BufWriter::with_capacity(1 << 20, file);
            let done = export::write(&*store, &mut out, &what, &bar).await?;
            out.into_inner()
                .sync_all()
                .await
                .map_err(|e| format!("--output {}: {e}", tmp.display()))?;
            tokio::fs::rename(&tmp, path)
                .await
                .map_err(|e| format!("--output {}: {e}", path.display()))?;
            done
        }
        None => {
            let mut out = tokio::io::BufWriter::with_capacity(1 << 20, tokio::io::stdout());
            export::write(&*store, &mut out, &what, &bar).await?
        }
    };
    bar.finish_and_clear();
    eprintln!(
        "exported {} counters and {} averages with {} day buckets and {} hour buckets, {} publication times, {} CountAPI keys and {} marks of actors ({} lines) of tenant {} to {} in {:.1} s",
        done.counters,
        done.averages,
        done.days,
        done.hours,
        done.published,
        done.countapi,
        done.marks,
        done.lines(),
        args.tenant,
        target.as_deref().map_or("standard output".into(), |p| p.display().to_string()),
        started.elapsed().as_secs_f64()
    );
    if done.marks > 0 && !done.fingerprint {
        eprintln!(
            "the marks are written without their secret's fingerprint (no --actor-secret, {}): an import cannot check that the gateways it serves key actors the same way; give --actor-secret to name it",
            match &opened {
                Opened::Embedded { data_dir, .. } => format!("no {}", data_dir.join(crate::actors::SECRET_FILE).display()),
                Opened::Cluster(_) => "none recorded in the cluster".into(),
            }
        );
    }
    Ok(())
}

/// `counter-gateway import`.
pub async fn run_import(args: ImportArgs, clock: Clock) -> Result<(), String> {
    let opened = open_store(
        &args.store,
        &args.tenant,
        true,
        args.secret.actor_secret.as_deref(),
        clock.clone(),
    )
    .await?;
    let store = opened.store();
    let rules = format::Rules {
        now: clock.now(),
        policy: args.store.time_policy(),
    };
    let source = args.input.filter(|p| p.as_os_str() != "-");
    let options = import::Options {
        batch_records: usize::try_from(args.batch_size).unwrap_or(1_000),
        checkpoint: args.checkpoint,
        skip_bad: args.skip_bad,
        from_line: args.from_line.max(1),
        input_name: source
            .as_deref()
            .map_or("-".into(), |p| p.display().to_string()),
        skip_marks: args.secret.skip_marks,
        secret: opened.secret_check(args.secret.actor_secret.as_deref()),
        ..import::Options::default()
    };
    let started = std::time::Instant::now();
    let (done, bar) = match &source {
        Some(path) => {
            let file = tokio::fs::File::open(path)
                .await
                .map_err(|e| format!("--input {}: {e}", path.display()))?;
            let len = file.metadata().await.ok().map(|m| m.len());
            let bar = progress(Unit::Bytes(len));
            let input = tokio::io::BufReader::with_capacity(1 << 20, file);
            (
                import::read_all(&*store, input, &rules, &options, &bar).await,
                bar,
            )
        }
        None => {
            let bar = progress(Unit::Bytes(None));
            let input = tokio::io::BufReader::with_capacity(1 << 20, tokio::io::stdin());
            (
                import::read_all(&*store, input, &rules, &options, &bar).await,
                bar,
            )
        }
    };
    bar.finish_and_clear();
    let done = done?;
    eprintln!(
        "imported {} counters, {} averages, {} day records ({} day buckets and {} hour buckets set), {} publication times, {} CountAPI keys and {} marks of actors into tenant {} from {} in {:.1} s{}{}{}",
        done.counters,
        done.averages,
        done.day_records,
        done.days,
        done.hours,
        done.published,
        done.countapi,
        done.marks,
        args.tenant,
        options.input_name,
        started.elapsed().as_secs_f64(),
        marks_left_out(&done),
        if done.resumed_after > 1 {
            format!("; lines up to {} were skipped as applied before", done.resumed_after)
        } else {
            String::new()
        },
        match (&options.skip_bad, done.bad) {
            (Some(p), n) if n > 0 => format!("; {n} bad lines set aside in {}", p.display()),
            _ => String::new(),
        }
    );
    Ok(())
}

/// What an import says of the marks it left out, if any.
fn marks_left_out(done: &import::Imported) -> String {
    let mut out = String::new();
    if done.marks_expired > 0 {
        out.push_str(&format!(
            "; {} marks of days past the retention left out",
            done.marks_expired
        ));
    }
    if done.marks_skipped > 0 {
        out.push_str(&format!(
            "; {} marks left out (--skip-marks)",
            done.marks_skipped
        ));
    }
    out
}

/// `counter-gateway migrate`.
pub async fn run_migrate(args: MigrateArgs, clock: Clock) -> Result<(), String> {
    migrate::run_with(&args.store, &args.secret, clock)
        .await
        .map(|_| ())
}
