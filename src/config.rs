//! The command line: one documented struct per subcommand, every flag also
//! read from a `COUNTER_GATEWAY_*` environment variable, validated before any I/O.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::domain::TimePolicy;
use crate::pipeline::PipelineConfig;
use crate::store::sqlite::Durability;
use crate::tenant::Limits;

#[derive(Debug, Parser)]
#[command(
    name = "counter-gateway",
    version,
    about = "Counts views, likes, logins and ratings over HTTP, exactly."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,

    /// Log lines as `plain` text or as one `json` object per line.
    #[arg(
        long,
        global = true,
        env = "COUNTER_GATEWAY_LOG_FORMAT",
        value_enum,
        default_value = "plain"
    )]
    pub log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Plain,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the HTTP gateway.
    Serve(Box<ServeArgs>),
    /// Install the Elasticsearch index templates, ILM policy and stored scripts, then exit.
    Setup(crate::store::elasticsearch::SetupArgs),
    /// Write a tenant's counters, averages and day buckets as NDJSON (see src/transfer/README.md).
    Export(Box<ExportArgs>),
    /// Set counters, averages and days from NDJSON written by `export` (or by hand).
    Import(Box<ImportArgs>),
    /// Copy every tenant of the embedded store into Elasticsearch, then verify the copy.
    Migrate(Box<MigrateArgs>),
}

/// `export`: from the embedded store (`--data-dir`), or from Elasticsearch
/// when `--elasticsearch-url` is given.
#[derive(Debug, Clone, Args)]
pub struct ExportArgs {
    #[command(flatten)]
    pub store: StoreArgs,

    /// The tenant to export.
    #[arg(long, env = "COUNTER_GATEWAY_TENANT", default_value = crate::tenant::DEFAULT_TENANT)]
    pub tenant: String,

    /// File to write (replaced only once the export is complete); `-` or
    /// absent: standard output.
    #[arg(long, short, env = "COUNTER_GATEWAY_EXPORT_OUTPUT")]
    pub output: Option<PathBuf>,

    #[command(flatten)]
    pub secret: SecretArgs,
}

/// The actor secret of the commands that move marks of actors (`export`,
/// `import`, `migrate`): named in files by its fingerprint, never itself.
#[derive(Debug, Clone, Default, Args)]
pub struct SecretArgs {
    /// The actor secret the gateways of this store key actors with (as
    /// `serve --actor-secret`). Without it the embedded store's is read
    /// from `<data-dir>/actor-secret`, and a cluster's from what `migrate`
    /// or `import` recorded there. Only its fingerprint is ever written.
    #[arg(long, env = "COUNTER_GATEWAY_ACTOR_SECRET", hide_env_values = true)]
    pub actor_secret: Option<String>,

    /// Leave the marks of actors (once per actor) out: not written
    /// (`export`, `migrate`) or not set (`import`). Every actor then counts
    /// once more where the data lands.
    #[arg(long, env = "COUNTER_GATEWAY_SKIP_MARKS")]
    pub skip_marks: bool,
}

/// `import`: into the embedded store (`--data-dir`, with no gateway
/// running on it), or into Elasticsearch when `--elasticsearch-url` is given.
#[derive(Debug, Clone, Args)]
pub struct ImportArgs {
    #[command(flatten)]
    pub store: StoreArgs,

    /// The tenant to import into.
    #[arg(long, env = "COUNTER_GATEWAY_TENANT", default_value = crate::tenant::DEFAULT_TENANT)]
    pub tenant: String,

    /// File to read; `-` or absent: standard input.
    #[arg(long, short, env = "COUNTER_GATEWAY_IMPORT_INPUT")]
    pub input: Option<PathBuf>,

    /// File recording the last line applied, after every batch. When it
    /// exists at the start, the import resumes after that line; it is
    /// removed once the import is complete.
    #[arg(long, env = "COUNTER_GATEWAY_IMPORT_CHECKPOINT")]
    pub checkpoint: Option<PathBuf>,

    /// Write bad lines to this file (after a header line, so it can be
    /// corrected and imported) and go on, instead of stopping at the first.
    #[arg(long, env = "COUNTER_GATEWAY_IMPORT_SKIP_BAD")]
    pub skip_bad: Option<PathBuf>,

    /// Start at this line (lines before it, but the header, are skipped):
    /// to resume without a checkpoint.
    #[arg(long, env = "COUNTER_GATEWAY_IMPORT_FROM_LINE", default_value_t = 1)]
    pub from_line: u64,

    /// Records set per batch: one transaction and fsync on the embedded
    /// store, one round of `_bulk` on Elasticsearch.
    #[arg(long, env = "COUNTER_GATEWAY_IMPORT_BATCH_SIZE", default_value_t = 1_000,
          value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub batch_size: u64,

    #[command(flatten)]
    pub secret: SecretArgs,
}

/// `migrate`: needs both `--data-dir` (the embedded store, stopped) and
/// `--elasticsearch-url`.
#[derive(Debug, Clone, Args)]
pub struct MigrateArgs {
    #[command(flatten)]
    pub store: StoreArgs,

    #[command(flatten)]
    pub secret: SecretArgs,
}

/// Where the counters are kept and the time rules their data follows:
/// shared by `serve` and the commands that move data (`export`, `import`,
/// `migrate`), so each reads the store as the gateway does.
#[derive(Debug, Clone, Args)]
pub struct StoreArgs {
    /// Directory of the embedded store; created if missing (by `serve` and `import`).
    #[arg(long, env = "COUNTER_GATEWAY_DATA_DIR", default_value = "./data")]
    pub data_dir: PathBuf,

    /// `full`: every acknowledged increment is fsync'd (survives power loss).
    /// `relaxed`: no fsync per commit (survives a crash of the process only).
    #[arg(
        long,
        env = "COUNTER_GATEWAY_DURABILITY",
        value_enum,
        default_value = "full"
    )]
    pub durability: Durability,

    /// How many days of histogram buckets are kept; events older than that are refused.
    #[arg(long, env = "COUNTER_GATEWAY_RETENTION_DAYS", default_value_t = 400)]
    pub retention_days: u32,

    /// How many days of hour buckets are kept (histograms with
    /// `bucket=hour`, top lists of `last_hour` and `last_24_hours`); at most
    /// `--retention-days`. Hour buckets cost about 24 times the storage of
    /// day buckets per active counter and day (see scripts/bench/README.md).
    #[arg(long, env = "COUNTER_GATEWAY_HOURLY_RETENTION_DAYS", default_value_t = crate::domain::hours::DEFAULT_HOURLY_RETENTION_DAYS)]
    pub hourly_retention_days: u32,

    /// The `first_<N>_days` top lists the embedded store keeps a total per
    /// counter for (comma-separated N, at most 8, each within
    /// `--retention-days`; 3,7,30 when not given): those lists are an index
    /// walk; other N are summed over every counter of the pair (seconds per
    /// million). Not given, a store (a tenant) of at most 20,000 counters
    /// builds its totals at its first list of one of these N (a pause of its
    /// writes of a few tenths of a second, once), a larger one sums its
    /// lists, and a store that never lists them pays nothing; given, every
    /// store builds them when it opens (about 25 s at a million counters,
    /// once). Kept totals cost each store's connections
    /// their schema and statements (about 20 KiB per open store), a row per
    /// counter and N, and work per bucket written (see
    /// scripts/bench/README.md, "Milestones"); a changed list rebuilds them.
    #[arg(long, env = "COUNTER_GATEWAY_MILESTONE_DAYS", value_delimiter = ',')]
    pub milestone_days: Option<Vec<u32>>,

    /// The trending half-lives (comma-separated, e.g. `24h,7d`) whose score
    /// bounds the embedded store keeps per counter, so a
    /// `GET /v1/trending/...?half_life=` list of one of them walks a few
    /// counters best bound first instead of scanning every hour and day
    /// row of the plan (scripts/bench/README.md, "Trending"). Built when the
    /// store opens (seconds a million counters), kept by every write of
    /// buckets; other half-lives scan. None when not given; every store
    /// (each tenant's when it opens) keeps them.
    #[arg(long, env = "COUNTER_GATEWAY_TRENDING_HALF_LIVES", value_delimiter = ',', value_parser = crate::domain::trending::parse_half_life)]
    pub trending_half_lives: Vec<i64>,

    /// How far ahead of the server clock an event timestamp may be.
    #[arg(long, env = "COUNTER_GATEWAY_MAX_CLOCK_SKEW", default_value = "5m", value_parser = humantime::parse_duration)]
    pub max_clock_skew: Duration,

    /// How long an event `id` is remembered, so a retry is counted once.
    #[arg(long, env = "COUNTER_GATEWAY_IDEMPOTENCY_WINDOW", default_value = "7days", value_parser = humantime::parse_duration)]
    pub idempotency_window: Duration,

    /// Memory of every embedded store together (SQLite's page caches and
    /// connections, all tenants), e.g. `256MiB`, `1GiB`; past it SQLite
    /// evicts the least recently used cached pages of any tenant. The
    /// default leaves a 1 GiB machine room for the queue and the OS's own
    /// file cache, and gives a single tenant the 64 MiB cache it always had.
    #[arg(long, env = "COUNTER_GATEWAY_SQLITE_MEMORY_BUDGET", default_value = "256MiB", value_parser = parse_bytes)]
    pub sqlite_memory_budget: u64,

    #[command(flatten)]
    pub elasticsearch: crate::store::elasticsearch::ElasticsearchArgs,
}

impl StoreArgs {
    /// The N of `--milestone-days` (the default when not given) and
    /// whether they were given (the stores then build their totals when
    /// they open, not at their first list).
    pub fn kept_days(&self) -> (Vec<u32>, bool) {
        match &self.milestone_days {
            Some(days) => (days.clone(), true),
            None => (crate::domain::milestone::DEFAULT_KEPT_DAYS.to_vec(), false),
        }
    }

    /// Checks these flags; the error names the flag to change.
    pub fn validate(&self) -> Result<(), String> {
        if self.retention_days == 0 {
            return Err("--retention-days must be at least 1".into());
        }
        if self.hourly_retention_days == 0 || self.hourly_retention_days > self.retention_days {
            return Err(format!(
                "--hourly-retention-days must be between 1 and --retention-days ({}): hours of days no longer kept would not sum to anything",
                self.retention_days
            ));
        }
        if let Some(days) = &self.milestone_days {
            crate::domain::milestone::check_kept_days(days, self.retention_days)?;
        }
        chrono::Duration::from_std(self.max_clock_skew)
            .map_err(|_| "--max-clock-skew is too large".to_string())?;
        if self.sqlite_memory_budget < 1 << 20 {
            return Err("--sqlite-memory-budget must be at least 1MiB".into());
        }
        Ok(())
    }

    /// The time rules of data moved in and out; `unique` events arrive
    /// only at `serve`, which sets their bound ([`ServeArgs::time_policy`]).
    pub fn time_policy(&self) -> TimePolicy {
        TimePolicy {
            retention_days: self.retention_days,
            hourly_retention_days: self.hourly_retention_days,
            max_skew: chrono::Duration::from_std(self.max_clock_skew)
                .unwrap_or_else(|_| chrono::Duration::minutes(5)),
            unique_max_age: crate::domain::DEFAULT_UNIQUE_MAX_AGE,
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address to listen on (use port 0 for any free port).
    #[arg(long, env = "COUNTER_GATEWAY_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,

    #[command(flatten)]
    pub store: StoreArgs,

    /// How long a flush waits for more requests once one has arrived (e.g. `0ms`, `5ms`).
    /// Requests always gather while earlier flushes run.
    #[arg(long, env = "COUNTER_GATEWAY_FLUSH_INTERVAL", default_value = "0ms", value_parser = humantime::parse_duration)]
    pub flush_interval: Duration,

    /// Most events applied in one flush.
    #[arg(
        long,
        env = "COUNTER_GATEWAY_MAX_FLUSH_EVENTS",
        default_value_t = 100_000
    )]
    pub max_flush_events: usize,

    /// Most events queued or being written; past it, writes get 503 with Retry-After.
    #[arg(
        long,
        env = "COUNTER_GATEWAY_QUEUE_CAPACITY",
        default_value_t = 1_000_000
    )]
    pub queue_capacity: usize,

    /// Most bytes of memory (a conservative estimate from the events: their
    /// structs and strings) held by writes queued or being written; past
    /// it, writes get 503 with Retry-After. The default is 256 MiB.
    #[arg(
        long,
        env = "COUNTER_GATEWAY_QUEUE_BYTES",
        default_value_t = crate::pipeline::DEFAULT_QUEUE_BYTES
    )]
    pub queue_bytes: usize,

    /// Percent of --queue-capacity and of --queue-bytes one tenant may hold
    /// (1-100), so a tenant whose store is stuck gets 503 while the others
    /// keep writing: it takes 100/share stuck tenants to fill the queue.
    #[arg(
        long,
        env = "COUNTER_GATEWAY_TENANT_QUEUE_SHARE",
        default_value_t = crate::pipeline::DEFAULT_TENANT_QUEUE_SHARE,
        value_parser = clap::value_parser!(u8).range(1..=100)
    )]
    pub tenant_queue_share: u8,

    /// How long a write waits for the store to confirm it before it gets 503.
    #[arg(long, env = "COUNTER_GATEWAY_ACK_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub ack_timeout: Duration,

    /// Largest request body in bytes (413 past it).
    #[arg(long, env = "COUNTER_GATEWAY_MAX_BODY_BYTES", default_value_t = 4 * 1024 * 1024)]
    pub max_body_bytes: usize,

    /// Most events in one `POST /v1/events`.
    #[arg(
        long,
        env = "COUNTER_GATEWAY_MAX_EVENTS_PER_REQUEST",
        default_value_t = 10_000
    )]
    pub max_events_per_request: usize,

    /// How long shutdown may take to flush what is queued.
    #[arg(long, env = "COUNTER_GATEWAY_SHUTDOWN_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub shutdown_timeout: Duration,

    /// File of API keys, one per line: `<role> <tenant|*> <sha256-hex-of-key>`,
    /// role `write`, `read` or `admin` (see src/api/README.md, "Tenants and API keys"). Without any key the
    /// gateway listens on loopback only.
    #[arg(long, env = "COUNTER_GATEWAY_API_KEYS_FILE")]
    pub api_keys_file: Option<PathBuf>,

    /// API keys in the format of --api-keys-file, entries separated by `;`.
    #[arg(long, env = "COUNTER_GATEWAY_API_KEYS", hide_env_values = true)]
    pub api_keys: Option<String>,

    /// Serve without API keys on an address other than loopback: anyone who
    /// reaches it can read, write and delete every tenant's counters.
    #[arg(long, env = "COUNTER_GATEWAY_ALLOW_UNAUTHENTICATED")]
    pub allow_unauthenticated: bool,

    /// Origins whose pages may call the API from a browser, comma-separated
    /// (e.g. `https://shop.example,https://www.shop.example`; `*` for any).
    /// Without API keys, the pages of these origins (not `*`) may also write.
    #[arg(long, env = "COUNTER_GATEWAY_CORS_ORIGINS", value_delimiter = ',')]
    pub cors_origins: Vec<String>,

    /// Without API keys, the `Host` names (or `name:port`) answered besides
    /// loopback ones, comma-separated; `*` for any (only behind a proxy that
    /// checks Host itself). Guards a keyless gateway against DNS rebinding;
    /// pages on these hosts (besides loopback ones) may also write to it,
    /// those of other sites get 403 `cross_site_write`.
    #[arg(long, env = "COUNTER_GATEWAY_ALLOWED_HOSTS", value_delimiter = ',')]
    pub allowed_hosts: Vec<String>,

    /// Longest a request may take, reading its body included; past it the
    /// answer is 503 `timeout`. `0s` turns the limit off.
    #[arg(long, env = "COUNTER_GATEWAY_REQUEST_TIMEOUT", default_value = "60s", value_parser = humantime::parse_duration)]
    pub request_timeout: Duration,

    /// Requests a second per client (API key, else IP address), in bursts of
    /// as many; past it, 429 with Retry-After. Off when absent.
    #[arg(long, env = "COUNTER_GATEWAY_RATE_LIMIT_PER_SECOND")]
    pub rate_limit_per_second: Option<u32>,

    /// Most tenants open at once (each has its own store and pipeline), the
    /// default included; a tenant is opened by its first write and closed
    /// after --tenant-idle-timeout without requests.
    #[arg(long, env = "COUNTER_GATEWAY_MAX_TENANTS", default_value_t = 1000)]
    pub max_tenants: usize,

    /// How long a tenant (other than the default) stays open without
    /// requests; then its store is closed, to be opened again by the next
    /// request that needs it. `0s`: never closed.
    #[arg(long, env = "COUNTER_GATEWAY_TENANT_IDLE_TIMEOUT", default_value = "5m", value_parser = humantime::parse_duration)]
    pub tenant_idle_timeout: Duration,

    /// Lets browsers and CDNs keep `GET /v1/counters` answers this long
    /// (`Cache-Control: public, max-age=<seconds>` for a `public` key or a
    /// keyless gateway; `private, ...` for `read` and `admin` keys, which
    /// only the browser may keep), whole seconds, e.g. `30s`. Absent: `Cache-Control: no-cache` (kept, but revalidated by
    /// ETag on every use, so a page never shows a stale value).
    #[arg(long, env = "COUNTER_GATEWAY_COUNTERS_CACHE_MAX_AGE", value_parser = humantime::parse_duration)]
    pub counters_cache_max_age: Option<Duration>,

    /// The secret actors are hashed with (HMAC-SHA256) before a store keeps
    /// them, at least 16 bytes; needed for `unique` (once per actor). Every
    /// gateway sharing an Elasticsearch cluster needs the same one; without
    /// it, Elasticsearch refuses `unique` with 400, and the embedded store
    /// makes one in `<data-dir>/actor-secret` on first start. Prefer the
    /// environment variable: a flag shows in the process list.
    #[arg(long, env = "COUNTER_GATEWAY_ACTOR_SECRET", hide_env_values = true)]
    pub actor_secret: Option<String>,

    /// How far back of the server clock a `unique` event (once per actor)
    /// may be dated; older ones get 400. A `unique: day` view counts once
    /// per actor and day, so this bounds the days one actor can add a view
    /// to by backdating (the default: at most three, today's included).
    #[arg(long, env = "COUNTER_GATEWAY_UNIQUE_MAX_AGE", default_value = "2days", value_parser = humantime::parse_duration)]
    pub unique_max_age: Duration,

    /// A limit per actor, repeatable: `[<entity>/]<action>: <n> per [<k>]
    /// <second|minute|hour|day> per actor`, e.g. `like: 10 per hour per
    /// actor` or `ARTICLE/like: 3 per day per actor` (for that entity, in
    /// place of the action's rule). Events over it get 429 `throttled`, and
    /// nothing of their request is applied. Kept in memory, per gateway
    /// instance. In the environment, rules are separated by `;`.
    #[arg(
        long = "actor-limit",
        env = "COUNTER_GATEWAY_ACTOR_LIMIT",
        value_delimiter = ';'
    )]
    pub actor_limits: Vec<String>,

    /// Count known crawlers in browser ingestion too (beacons, the pixel,
    /// writes with a `write` key from a browser). By default a write whose
    /// User-Agent is on isbot's crawler list is answered 202 and counts
    /// nothing there; server-to-server writes always count.
    #[arg(long, env = "COUNTER_GATEWAY_COUNT_CRAWLERS")]
    pub count_crawlers: bool,

    /// Let `write` keys read the counters they count: the answer to an
    /// increment or decrement made with a `write` key then carries the
    /// counter's value, category and timestamps, as it does for `read` and
    /// `admin` keys. By default it says only whether the write was counted
    /// (`counted`, `skipped`): a `write` key is in public pages, and with
    /// the value any visitor could read any counter (a decrement that
    /// changes nothing is a free read).
    #[arg(long, env = "COUNTER_GATEWAY_WRITE_KEYS_READ_VALUES")]
    pub write_keys_read_values: bool,

    /// Live streams (`GET /v1/stream`): the shortest time between two
    /// events of one counter (changes within it are coalesced, the latest
    /// value wins), and how often the watched counters are read (on
    /// Elasticsearch every interval, for writes through other gateways;
    /// on the embedded store only after writes). At least 10ms.
    #[arg(long, env = "COUNTER_GATEWAY_STREAM_INTERVAL", default_value = "1s", value_parser = humantime::parse_duration)]
    pub stream_interval: Duration,

    /// Most live streams open at once, over every tenant; beyond it a new
    /// one gets 503 with Retry-After. An idle stream holds a connection
    /// and about 40 KiB of memory: 10,000 about 400 MiB
    /// (scripts/bench/README.md).
    #[arg(long, env = "COUNTER_GATEWAY_MAX_STREAMS", default_value_t = crate::api::stream::DEFAULT_MAX_STREAMS)]
    pub max_streams: usize,
}

impl ServeArgs {
    /// Checks the combination of flags; the error says which flag to change.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_flush_events == 0 {
            return Err("--max-flush-events must be at least 1".into());
        }
        if self.max_events_per_request == 0 {
            return Err("--max-events-per-request must be at least 1".into());
        }
        if self.max_body_bytes < 1024 {
            return Err("--max-body-bytes must be at least 1024".into());
        }
        if self.stream_interval < Duration::from_millis(10) {
            return Err("--stream-interval must be at least 10ms".into());
        }
        let share = self.tenant_queue_share;
        let events = crate::pipeline::share_of(self.queue_capacity, share);
        if events < self.max_events_per_request {
            return Err(format!(
                "--queue-capacity ({}) at --tenant-queue-share {share}% leaves a tenant {events} events, fewer than --max-events-per-request ({}): a full batch could never be queued",
                self.queue_capacity, self.max_events_per_request
            ));
        }
        let bytes = crate::pipeline::share_of(self.queue_bytes, share);
        let largest = crate::pipeline::largest_request_bytes(
            self.max_body_bytes,
            self.max_events_per_request,
        );
        if bytes < largest {
            return Err(format!(
                "--queue-bytes ({}) at --tenant-queue-share {share}% leaves a tenant {bytes} bytes, less than the {largest} bytes the largest request --max-body-bytes ({}) and --max-events-per-request ({}) admit may take in memory: such a request could never be queued. Raise --queue-bytes or --tenant-queue-share, or lower --max-body-bytes or --max-events-per-request",
                self.queue_bytes, self.max_body_bytes, self.max_events_per_request
            ));
        }
        self.store.validate()?;
        if self.ack_timeout.is_zero() {
            return Err("--ack-timeout must be more than zero".into());
        }
        if self.max_tenants == 0 {
            return Err("--max-tenants must be at least 1".into());
        }
        if self.rate_limit_per_second == Some(0) {
            return Err(
                "--rate-limit-per-second must be at least 1 (leave it out for no limit)".into(),
            );
        }
        crate::api::edge::cors(&self.cors_origins)?;
        if let Some(bad) = self
            .allowed_hosts
            .iter()
            .find(|h| h.trim().is_empty() || h.trim().contains(['/', ' ']))
        {
            return Err(format!(
                "--allowed-hosts: {bad:?} is not a host name like counts.example or counts.example:8080"
            ));
        }
        if let Some(age) = self.counters_cache_max_age {
            if age.as_secs() == 0 || age.subsec_nanos() != 0 {
                return Err("--counters-cache-max-age must be whole seconds, at least 1s (leave it out for no-cache)".into());
            }
        }
        if let Some(secret) = &self.actor_secret {
            crate::domain::ActorKey::new(secret.as_bytes())
                .map_err(|e| format!("--actor-secret: {e}"))?;
        }
        self.actor_limits()?;
        if self.unique_max_age < Duration::from_secs(60) {
            return Err("--unique-max-age must be at least 1m: a client's clock and its queue of beacons lag the server's".into());
        }
        let retention = Duration::from_secs(u64::from(self.store.retention_days) * 86_400);
        if chrono::Duration::from_std(self.unique_max_age).is_err()
            || self.unique_max_age > retention
        {
            return Err(format!(
                "--unique-max-age must not exceed the retention (--retention-days {}): older events are refused anyway",
                self.store.retention_days
            ));
        }
        Ok(())
    }

    /// The limits per actor of every `--actor-limit`; the error names the
    /// rule that does not parse.
    pub fn actor_limits(&self) -> Result<Option<crate::actors::ActorLimits>, String> {
        let rules: Vec<String> = self
            .actor_limits
            .iter()
            .filter(|r| !r.trim().is_empty())
            .cloned()
            .collect();
        crate::actors::ActorLimits::parse(&rules)
    }

    /// The configured API keys, from the file and the environment.
    pub fn keys(&self) -> Result<crate::auth::Keys, String> {
        let mut keys = crate::auth::Keys::default();
        if let Some(path) = &self.api_keys_file {
            keys.add_file(path)?;
        }
        if let Some(text) = &self.api_keys {
            keys.add(text, "--api-keys")?;
        }
        Ok(keys)
    }

    /// Refuses to serve without keys on anything but loopback, unless told to.
    pub fn check_exposure(&self, keys: &crate::auth::Keys) -> Result<(), String> {
        if keys.is_empty() && !self.listen.ip().is_loopback() && !self.allow_unauthenticated {
            return Err(format!(
                "refusing to listen on {} without API keys: anyone reaching it could read, write and delete every counter. Configure keys (--api-keys-file or COUNTER_GATEWAY_API_KEYS), listen on 127.0.0.1, or pass --allow-unauthenticated",
                self.listen
            ));
        }
        Ok(())
    }

    pub fn pipeline(&self) -> PipelineConfig {
        PipelineConfig {
            flush_interval: self.flush_interval,
            max_batch_events: self.max_flush_events,
            queue_capacity: self.queue_capacity,
            queue_bytes: self.queue_bytes,
            tenant_queue_share: self.tenant_queue_share,
            ack_timeout: self.ack_timeout,
        }
    }

    pub fn time_policy(&self) -> TimePolicy {
        TimePolicy {
            unique_max_age: chrono::Duration::from_std(self.unique_max_age)
                .unwrap_or(crate::domain::DEFAULT_UNIQUE_MAX_AGE),
            ..self.store.time_policy()
        }
    }

    pub fn streams(&self) -> crate::api::stream::StreamConfig {
        crate::api::stream::StreamConfig {
            interval: self.stream_interval,
            max_streams: self.max_streams,
            ..Default::default()
        }
    }

    pub fn limits(&self) -> Limits {
        Limits {
            max_body_bytes: self.max_body_bytes,
            max_events_per_request: self.max_events_per_request,
        }
    }
}

/// A size in bytes: a whole number with an optional unit, `B`, `KiB`,
/// `MiB`, `GiB` (powers of 1024) or `KB`, `MB`, `GB` (powers of 1000).
fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size: expected e.g. 256MiB"))?;
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        other => {
            return Err(format!(
                "unknown size unit {other:?}: use B, KiB, MiB, GiB, KB, MB or GB"
            ))
        }
    };
    number
        .checked_mul(scale)
        .ok_or_else(|| format!("{text:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> ServeArgs {
        let mut all = vec!["counter-gateway", "serve"];
        all.extend_from_slice(args);
        match Cli::try_parse_from(all).unwrap().command {
            Command::Serve(a) => *a,
            _ => unreachable!("parsed as serve"),
        }
    }

    #[test]
    fn defaults_are_valid() {
        let a = parse(&[]);
        assert_eq!(a.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(a.store.durability, Durability::Full);
        assert!(a.validate().is_ok());
    }

    #[test]
    fn no_keys_on_a_public_address_is_refused_unless_allowed() {
        let keys = crate::auth::Keys::default();
        assert!(parse(&[]).check_exposure(&keys).is_ok());
        let e = parse(&["--listen", "0.0.0.0:8080"])
            .check_exposure(&keys)
            .unwrap_err();
        assert!(e.contains("--allow-unauthenticated"), "{e}");
        assert!(
            parse(&["--listen", "0.0.0.0:8080", "--allow-unauthenticated"])
                .check_exposure(&keys)
                .is_ok()
        );
        let line = format!("admin * {}", crate::auth::digest_hex("k"));
        let a = parse(&["--listen", "[::]:8080", "--api-keys", &line]);
        assert!(a.check_exposure(&a.keys().unwrap()).is_ok());
        assert!(parse(&["--cors-origins", "shop.example"])
            .validate()
            .is_err());
    }

    #[test]
    fn inconsistent_limits_are_refused_before_any_io() {
        let a = parse(&["--queue-capacity", "10", "--max-events-per-request", "100"]);
        assert!(a.validate().unwrap_err().contains("--queue-capacity"));
        // A tenant's share must hold the largest batch too.
        let a = parse(&["--queue-capacity", "100", "--max-events-per-request", "100"]);
        assert!(a.validate().unwrap_err().contains("--tenant-queue-share"));
        let a = parse(&[
            "--queue-capacity",
            "100",
            "--max-events-per-request",
            "100",
            "--tenant-queue-share",
            "100",
        ]);
        assert!(a.validate().is_ok());
        assert!(
            Cli::try_parse_from(["counter-gateway", "serve", "--tenant-queue-share", "0"]).is_err()
        );
        assert!(
            Cli::try_parse_from(["counter-gateway", "serve", "--flush-interval", "soon"]).is_err()
        );
    }

    #[test]
    fn the_sqlite_memory_budget_is_a_size_with_a_unit() {
        assert_eq!(parse(&[]).store.sqlite_memory_budget, 256 << 20);
        let a = parse(&["--sqlite-memory-budget", "1GiB"]);
        assert_eq!(a.store.sqlite_memory_budget, 1 << 30);
        assert_eq!(parse_bytes("64 MB"), Ok(64_000_000));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert!(parse_bytes("12 parsecs").unwrap_err().contains("unit"));
        assert!(parse_bytes("MiB").is_err());
        assert!(parse_bytes("99999999999999GiB").is_err());
        let small = parse(&["--sqlite-memory-budget", "64KiB"]);
        assert!(small
            .validate()
            .unwrap_err()
            .contains("--sqlite-memory-budget"));
    }

    #[test]
    fn the_transfer_commands_take_the_store_flags_of_serve() {
        let cli = Cli::try_parse_from([
            "counter-gateway",
            "import",
            "--data-dir",
            "/d",
            "--retention-days",
            "30",
            "--tenant",
            "acme",
            "--checkpoint",
            "c",
            "--batch-size",
            "10",
        ])
        .unwrap();
        let Command::Import(a) = cli.command else {
            panic!("not an import")
        };
        assert_eq!(a.store.data_dir, PathBuf::from("/d"));
        assert_eq!(a.store.time_policy().retention_days, 30);
        assert_eq!(
            (a.tenant.as_str(), a.batch_size, a.from_line),
            ("acme", 10, 1)
        );
        assert_eq!(a.checkpoint, Some(PathBuf::from("c")));
        assert!(Cli::try_parse_from(["counter-gateway", "import", "--batch-size", "0"]).is_err());
        let cli = Cli::try_parse_from(["counter-gateway", "export"]).unwrap();
        let Command::Export(a) = cli.command else {
            panic!("not an export")
        };
        assert_eq!((a.tenant.as_str(), a.output), ("default", None));
        assert!(a.store.elasticsearch.url.is_empty());
        let cli = Cli::try_parse_from([
            "counter-gateway",
            "migrate",
            "--elasticsearch-url",
            "http://es:9200",
        ])
        .unwrap();
        let Command::Migrate(a) = cli.command else {
            panic!("not a migrate")
        };
        assert_eq!(a.store.data_dir, PathBuf::from("./data"));
        assert!(a.store.validate().is_ok());
    }

    #[test]
    fn actor_limits_and_the_secret_are_checked_before_start() {
        let a = parse(&[
            "--actor-limit",
            "like: 10 per hour per actor",
            "--actor-limit",
            "ARTICLE/like: 3 per day per actor",
        ]);
        assert!(a.validate().is_ok());
        assert_eq!(a.actor_limits().unwrap().unwrap().rules().len(), 2);
        let e = parse(&["--actor-limit", "like: lots per hour per actor"])
            .validate()
            .unwrap_err();
        assert!(e.contains("like: lots per hour per actor"), "{e}");
        let e = parse(&["--actor-secret", "too short"])
            .validate()
            .unwrap_err();
        assert!(e.contains("--actor-secret"), "{e}");
        assert!(parse(&["--actor-secret", "0123456789abcdef"])
            .validate()
            .is_ok());
        assert!(parse(&[]).actor_limits().unwrap().is_none());
    }

    #[test]
    fn the_unique_max_age_defaults_to_two_days_and_is_bounded() {
        let a = parse(&[]);
        assert_eq!(a.time_policy().unique_max_age, chrono::Duration::days(2));
        let a = parse(&["--unique-max-age", "6h"]);
        assert!(a.validate().is_ok());
        assert_eq!(a.time_policy().unique_max_age, chrono::Duration::hours(6));
        for bad in ["10s", "500days"] {
            let e = parse(&["--unique-max-age", bad]).validate().unwrap_err();
            assert!(e.contains("--unique-max-age"), "{bad}: {e}");
        }
    }

    #[test]
    fn live_streams_take_an_interval_of_10ms_or_more_and_a_bound() {
        let a = parse(&[]);
        assert_eq!(a.streams().interval, Duration::from_secs(1));
        assert_eq!(a.streams().max_streams, 10_000);
        let a = parse(&["--stream-interval", "250ms", "--max-streams", "5"]);
        assert!(a.validate().is_ok());
        assert_eq!(a.streams().interval, Duration::from_millis(250));
        assert_eq!(a.streams().max_streams, 5);
        let e = parse(&["--stream-interval", "5ms"]).validate().unwrap_err();
        assert!(e.contains("--stream-interval"), "{e}");
    }

    #[test]
    fn the_counters_cache_max_age_is_whole_seconds_or_absent() {
        assert_eq!(parse(&[]).counters_cache_max_age, None);
        let a = parse(&["--counters-cache-max-age", "1m"]);
        assert_eq!(a.counters_cache_max_age, Some(Duration::from_secs(60)));
        assert!(a.validate().is_ok());
        for bad in ["0s", "1500ms"] {
            let e = parse(&["--counters-cache-max-age", bad])
                .validate()
                .unwrap_err();
            assert!(e.contains("--counters-cache-max-age"), "{bad}: {e}");
        }
    }
}
