//! The `counter-gateway` binary: parse the command line, set up logging, run.

use clap::Parser;
use counter_gateway::config::{Cli, Command, LogFormat};
use counter_gateway::domain::Clock;

/// mimalloc, not glibc's malloc: measured in scripts/bench/README.md.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let logs = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr);
    match cli.log_format {
        // One JSON object per line, fields at the top, for log shippers.
        LogFormat::Json => logs.json().flatten_event(true).init(),
        LogFormat::Plain => logs.init(),
    }
    let result = match cli.command {
        Command::Serve(args) => counter_gateway::server::serve(*args).await,
        Command::Setup(args) => counter_gateway::server::setup(args).await,
        Command::Export(args) => {
            counter_gateway::transfer::run_export(*args, Clock::system()).await
        }
        Command::Import(args) => {
            counter_gateway::transfer::run_import(*args, Clock::system()).await
        }
        Command::Migrate(args) => {
            counter_gateway::transfer::run_migrate(*args, Clock::system()).await
        }
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "counter-gateway stopped");
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
