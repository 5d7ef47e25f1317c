//! `tollgate`: serve the HTTP API, migrate a database, or check one before
//! resuming traffic.

mod check;
mod config;
mod migrate;
mod serve;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "tollgate", version, about = "Prepaid units for a fleet of gateway workers.")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the HTTP API (on the in-memory store unless a database is given).
    Serve(Box<serve::ServeArgs>),
    /// Apply pending database migrations and report each one.
    Migrate(migrate::MigrateArgs),
    /// Check storage, migrations, conservation, legacy bounds and guards.
    Check(check::CheckArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("tollgate: error: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Serve(args) => serve::run(*args).await,
            Command::Migrate(args) => migrate::run(args).await,
            Command::Check(args) => check::run(args).await,
        }
    });
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("tollgate: error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// Logs go to stderr, so stdout carries only what scripts read (the listening
/// line, reports). `TOLLGATE_LOG` sets the level: error, warn, info (default),
/// debug or trace. At info, sqlx's own informational lines (PostgreSQL notices
/// such as "relation already exists, skipping") are left out as noise.
fn init_logging() {
    use tracing_subscriber::filter::Targets;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;

    let level = std::env::var("TOLLGATE_LOG")
        .ok()
        .and_then(|value| value.parse::<tracing::Level>().ok())
        .unwrap_or(tracing::Level::INFO);
    let sqlx_level = if level == tracing::Level::INFO { tracing::Level::WARN } else { level };
    let filter = Targets::new().with_default(level).with_target("sqlx", sqlx_level);
    tracing_subscriber::registry()
        .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_target(false))
        .with(filter)
        .init();
}
