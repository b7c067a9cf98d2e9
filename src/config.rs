//! The command line: one documented struct per subcommand, every flag also
//! read from a `COUNTER_GATEWAY_*` environment variable, validated before any I/O.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::api::Limits;
use crate::domain::TimePolicy;
use crate::pipeline::PipelineConfig;
use crate::store::sqlite::Durability;

#[derive(Debug, Parser)]
#[command(
    name = "counter-gateway",
    version,
    about = "Counts views, likes, logins and ratings over HTTP, exactly."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the HTTP gateway.
    Serve(ServeArgs),
    /// Install the Elasticsearch index templates, ILM policy and stored scripts, then exit.
    Setup(crate::store::elasticsearch::SetupArgs),
}

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address to listen on (use port 0 for any free port).
    #[arg(long, env = "COUNTER_GATEWAY_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,

    /// Directory of the embedded store; created if missing.
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

    /// How long a flush waits for more requests once one has arrived (e.g. `0ms`, `5ms`).
    /// Requests always gather while the previous flush runs.
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

    /// How many days of histogram buckets are kept; events older than that are refused.
    #[arg(long, env = "COUNTER_GATEWAY_RETENTION_DAYS", default_value_t = 400)]
    pub retention_days: u32,

    /// How far ahead of the server clock an event timestamp may be.
    #[arg(long, env = "COUNTER_GATEWAY_MAX_CLOCK_SKEW", default_value = "5m", value_parser = humantime::parse_duration)]
    pub max_clock_skew: Duration,

    /// How long an event `id` is remembered, so a retry is counted once.
    #[arg(long, env = "COUNTER_GATEWAY_IDEMPOTENCY_WINDOW", default_value = "7days", value_parser = humantime::parse_duration)]
    pub idempotency_window: Duration,

    /// How long shutdown may take to flush what is queued.
    #[arg(long, env = "COUNTER_GATEWAY_SHUTDOWN_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub shutdown_timeout: Duration,

    #[command(flatten)]
    pub elasticsearch: crate::store::elasticsearch::ElasticsearchArgs,
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
        if self.queue_capacity < self.max_events_per_request {
            return Err(format!(
                "--queue-capacity ({}) must be at least --max-events-per-request ({}), or a full batch could never be queued",
                self.queue_capacity, self.max_events_per_request
            ));
        }
        if self.queue_capacity > u32::MAX as usize {
            return Err("--queue-capacity must be at most 4294967295".into());
        }
        if self.retention_days == 0 {
            return Err("--retention-days must be at least 1".into());
        }
        if self.ack_timeout.is_zero() {
            return Err("--ack-timeout must be more than zero".into());
        }
        if self.max_body_bytes < 1024 {
            return Err("--max-body-bytes must be at least 1024".into());
        }
        chrono::Duration::from_std(self.max_clock_skew)
            .map_err(|_| "--max-clock-skew is too large".to_string())?;
        Ok(())
    }

    pub fn pipeline(&self) -> PipelineConfig {
        PipelineConfig {
            flush_interval: self.flush_interval,
            max_batch_events: self.max_flush_events,
            queue_capacity: self.queue_capacity,
            ack_timeout: self.ack_timeout,
        }
    }

    pub fn time_policy(&self) -> TimePolicy {
        TimePolicy {
            retention_days: self.retention_days,
            max_skew: chrono::Duration::from_std(self.max_clock_skew)
                .unwrap_or_else(|_| chrono::Duration::minutes(5)),
        }
    }

    pub fn limits(&self) -> Limits {
        Limits {
            max_body_bytes: self.max_body_bytes,
            max_events_per_request: self.max_events_per_request,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> ServeArgs {
        let mut all = vec!["counter-gateway", "serve"];
        all.extend_from_slice(args);
        match Cli::try_parse_from(all).unwrap().command {
            Command::Serve(a) => a,
            Command::Setup(_) => unreachable!("parsed as serve"),
        }
    }

    #[test]
    fn defaults_are_valid() {
        let a = parse(&[]);
        assert_eq!(a.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(a.durability, Durability::Full);
        assert!(a.validate().is_ok());
    }

    #[test]
    fn inconsistent_limits_are_refused_before_any_io() {
        let a = parse(&["--queue-capacity", "10", "--max-events-per-request", "100"]);
        assert!(a.validate().unwrap_err().contains("--queue-capacity"));
        assert!(
            Cli::try_parse_from(["counter-gateway", "serve", "--flush-interval", "soon"]).is_err()
        );
    }
}
