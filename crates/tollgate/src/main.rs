//! `tollgate`: serve the HTTP API, migrate a database, or check one before
//! resuming traffic; and ask a running server (`accounts`, see `remote`).

#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::too_many_lines))]

mod accounts;
mod check;
mod config;
mod journal;
mod migrate;
mod remote;
mod serve;
mod table;
mod usage;

use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

/// The server allocates and frees small blocks on every request (JSON, the
/// request's headers, an acquire's records), from many threads, and the
/// memory store keeps every lease and journal entry it ever made. glibc's
/// allocator spent about 13 % of the HTTP benchmark's server CPU in its own
/// bookkeeping (`_int_malloc`, `unlink_chunk`, `malloc_consolidate`), and
/// more as the store grew; mimalloc keeps per-thread free lists of size
/// classes (bench/ANALYSIS.md, "HTTP"). Without transparent huge pages
/// (`no_thp` in Cargo.toml), its resident memory stays at glibc's per stored
/// lease; with them it started at twice glibc's idle size and kept more.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "tollgate", version, about = "Prepaid units for a fleet of gateway workers.")]
struct Cli {
    /// How log lines on stderr are written: `text` for people, `json` (one
    /// object per line) for log collectors.
    #[arg(long, global = true, value_enum, env = "TOLLGATE_LOG_FORMAT", default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the HTTP API (on the in-memory store unless a database is given).
    Serve(Box<serve::ServeArgs>),
    /// Apply pending database migrations and report each one.
    Migrate(migrate::MigrateArgs),
    /// Check storage, migrations, conservation, legacy bounds and guards.
    Check(check::CheckArgs),
    /// List a running server's accounts with their counters.
    Accounts(accounts::AccountsArgs),
    /// An account's usage by time window and group (credential, lease,
    /// funding or a dimension).
    Usage(usage::UsageArgs),
    /// An account's journal: every change to its counters, in order.
    Journal(journal::JournalArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
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
            Command::Accounts(args) => accounts::run(args).await,
            Command::Usage(args) => usage::run(args).await,
            Command::Journal(args) => journal::run(args).await,
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
/// `--log-format json` writes each line as one JSON object, with the fields of
/// the request span (method, route template, request ID) it was logged in.
fn init_logging(format: LogFormat) {
    use tracing_subscriber::Layer;
    use tracing_subscriber::filter::Targets;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;

    let level = std::env::var("TOLLGATE_LOG")
        .ok()
        .and_then(|value| value.parse::<tracing::Level>().ok())
        .unwrap_or(tracing::Level::INFO);
    let sqlx_level = if level == tracing::Level::INFO { tracing::Level::WARN } else { level };
    let filter = Targets::new().with_default(level).with_target("sqlx", sqlx_level);
    let lines = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_target(false);
    let lines = match format {
        LogFormat::Text => lines.boxed(),
        LogFormat::Json => lines.json().boxed(),
    };
    tracing_subscriber::registry().with(lines).with(filter).init();
}
