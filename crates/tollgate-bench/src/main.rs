//! `tollgate-bench`: the drivers `bench/run` calls, one measurement per
//! invocation, and the operator's gateway workload.
//!
//! Every measuring subcommand prints one line: the rate, the round trips per
//! operation, and the p50 and p99 latencies in microseconds, each `-` when
//! not measured.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use tollgate_bench::pg::ReclaimSide;
use tollgate_bench::{console, gateway, http, pg, report};

#[derive(Parser)]
#[command(name = "tollgate-bench", about = "Tollgate benchmark drivers")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Creates the 1000 benchmark accounts in an empty, migrated database.
    PgSetup {
        #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
        database_url: String,
    },
    /// PostgresStore acquire + release on concurrent tasks; cycles per second.
    PgLease {
        #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
        database_url: String,
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
        #[arg(long, default_value_t = 8)]
        tasks: u32,
        /// Threads driving the tasks, as pgbench's `-j` on the baseline side.
        #[arg(long, default_value_t = 1)]
        client_threads: usize,
    },
    /// PostgresStore::ingest of 1000-event batches; events per second.
    PgIngest {
        #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
        database_url: String,
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
        /// Differs between invocations, so request IDs never collide by accident.
        #[arg(long)]
        run_tag: String,
        /// Sends no dimensions, to tell their cost from the rest.
        #[arg(long)]
        without_dimensions: bool,
    },
    /// Usage ingestion end to end: the `pg-ingest` batches through a
    /// `UsageWriter` over HTTP to a running server on the same database.
    HttpIngest {
        #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
        database_url: String,
        /// The server, a loopback address such as 127.0.0.1:8080.
        #[arg(long)]
        address: SocketAddr,
        #[arg(long, env = "TOLLGATE_GATEWAY_TOKEN", hide_env_values = true)]
        gateway_token: String,
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
        /// Differs between invocations, so request IDs never collide by accident.
        #[arg(long)]
        run_tag: String,
    },
    /// Creates the usage account and its 1 000 000 events over 30 days, and
    /// checks the baseline's statement against the store; prints how long the
    /// insert and the VACUUM ANALYZE took.
    PgUsageSetup {
        #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
        database_url: String,
        #[arg(long)]
        baseline_sql: PathBuf,
    },
    /// PostgresStore::usage, hourly by model over 30 days; queries per second.
    PgUsage {
        #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
        database_url: String,
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
    },
    /// Creates the console account through a running server, with 100
    /// active leases, and its 1 000 000 usage events in the chart's window;
    /// prints how long the insert and the VACUUM ANALYZE took and the
    /// chart's window (from, to and bucket width in µs) for the baseline.
    ConsoleSetup(console::SetupArgs),
    /// The console's account page, signed in, on one connection; pages per
    /// second and the p50 and p99 page times.
    ConsolePage(console::PageArgs),
    /// Seeds 100 000 due leases and settles them; leases per second.
    PgReclaim {
        #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
        database_url: String,
        #[arg(long, value_enum)]
        side: ReclaimSide,
        #[arg(long, default_value_t = 1_000)]
        batch: u32,
        #[arg(long)]
        seed_sql: PathBuf,
        #[arg(long)]
        baseline_sql: PathBuf,
    },
    /// The HTTP baseline: parses the cycle's JSON and answers constants.
    BaselineServer {
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: SocketAddr,
    },
    /// Acquire + release over HTTP/1.1 keep-alive; requests per second.
    HttpLoad {
        /// A loopback address such as 127.0.0.1:8080; repeated, connection
        /// `i` goes to the `i mod n`-th of the `n` servers.
        #[arg(long = "address", required = true)]
        addresses: Vec<SocketAddr>,
        #[arg(long, default_value_t = 64)]
        connections: usize,
        /// Accounts `http-0 … http-(N-1)` the connections cycle through, each
        /// connection over its own share; one per connection when absent.
        #[arg(long)]
        accounts: Option<usize>,
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
        #[arg(long, env = "TOLLGATE_GATEWAY_TOKEN", hide_env_values = true)]
        gateway_token: String,
        /// Creates and credits the accounts first when given.
        #[arg(long)]
        admin_token: Option<String>,
        /// With --admin-token: one alert rule on each account it creates,
        /// and a webhook endpoint.
        #[arg(long, requires = "admin_token")]
        alert_rules: bool,
    },
    /// Drives a realistic gateway workload against a running server.
    Gateway(gateway::GatewayArgs),
    /// Turns a criterion estimates.json into a rate: `per_iteration` operations
    /// per timed iteration divided by the median time of one iteration.
    CriterionRate {
        #[arg(long)]
        estimates: PathBuf,
        #[arg(long, default_value_t = 1.0)]
        per_iteration: f64,
    },
    /// Writes bench/RESULTS.md from the rounds `bench/run` recorded.
    Report(report::ReportArgs),
}

fn main() -> anyhow::Result<()> {
    let command = Cli::parse().command;
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Command::PgLease { client_threads, .. } = &command {
        runtime.worker_threads((*client_threads).max(1));
    }
    runtime.enable_all().build()?.block_on(run(command))
}

async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::PgSetup { database_url } => pg::setup(&database_url).await?,
        Command::PgLease { database_url, seconds, tasks, client_threads: _ } => {
            println!("{}", pg::lease_cycle(&database_url, seconds, tasks).await?.line());
        }
        Command::PgIngest { database_url, seconds, run_tag, without_dimensions } => {
            println!("{}", pg::ingest(&database_url, seconds, &run_tag, !without_dimensions).await?.line());
        }
        Command::HttpIngest { database_url, address, gateway_token, seconds, run_tag } => {
            println!("{}", pg::http_ingest(&database_url, address, &gateway_token, seconds, &run_tag).await?.line());
        }
        Command::PgUsageSetup { database_url, baseline_sql } => {
            let setup = pg::usage_setup(&database_url, &baseline_sql).await?;
            println!("{:.1} {:.1}", setup.insert.as_secs_f64(), setup.vacuum.as_secs_f64());
        }
        Command::PgUsage { database_url, seconds } => {
            println!("{}", pg::usage(&database_url, seconds).await?.line());
        }
        Command::ConsoleSetup(args) => println!("{}", console::setup(args).await?.line()),
        Command::ConsolePage(args) => println!("{}", console::pages(args).await?.line()),
        Command::PgReclaim { database_url, side, batch, seed_sql, baseline_sql } => {
            println!("{}", pg::reclaim(&database_url, side, batch, &seed_sql, &baseline_sql).await?.line());
        }
        Command::BaselineServer { listen } => http::baseline_server(listen).await?,
        Command::HttpLoad { addresses, connections, accounts, seconds, gateway_token, admin_token, alert_rules } => {
            let config = http::LoadConfig {
                addresses,
                connections,
                accounts: accounts.unwrap_or(connections),
                duration: Duration::from_secs_f64(seconds),
                gateway_token,
                admin_token,
                alert_rules,
            };
            let report = http::load(config).await?;
            println!("{:.3} - {} {}", report.requests_per_second, report.p50_us, report.p99_us);
        }
        Command::Gateway(args) => gateway::run(args).await?,
        Command::CriterionRate { estimates, per_iteration } => {
            println!("{:.3} - - -", report::criterion_rate(&estimates, per_iteration)?);
        }
        Command::Report(args) => report::write(args)?,
    }
    Ok(())
}
