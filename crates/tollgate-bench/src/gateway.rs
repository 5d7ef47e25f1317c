//! `tollgate-bench gateway`: a realistic gateway workload against a running
//! server, for operators sizing a deployment. Many accounts; each worker holds
//! one lease at a time, reports usage against it in batches, renews it by
//! consolidation, and releases it at the end. A live progress line goes to
//! stderr and a summary table to stdout.

use std::io::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use jiff::{SignedDuration, Timestamp};
use tokio::sync::Mutex;
use tollgate_api::{LeaseBody, LeaseHandleBody};
use tollgate_client::{ClientConfig, TollgateClient};
use tollgate_core::UsageEvent;

#[derive(clap::Args)]
pub struct GatewayArgs {
    /// The server, such as http://127.0.0.1:8080.
    #[arg(long, env = "TOLLGATE_URL", default_value = "http://127.0.0.1:8080")]
    url: String,
    #[arg(long, env = "TOLLGATE_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: String,
    #[arg(long, env = "TOLLGATE_GATEWAY_TOKEN", hide_env_values = true)]
    gateway_token: String,
    /// Accounts created and credited for the run.
    #[arg(long, default_value_t = 100)]
    accounts: usize,
    /// Concurrent gateway workers; worker `w` bills account `w mod accounts`.
    #[arg(long, default_value_t = 16)]
    workers: usize,
    #[arg(long, default_value_t = 30.0)]
    seconds: f64,
    /// Units each lease is granted, and added again at each renewal.
    #[arg(long, default_value_t = 10_000)]
    lease_units: u64,
    /// Events per usage batch.
    #[arg(long, default_value_t = 200)]
    batch_events: usize,
    /// Usage batches between renewals of a worker's lease.
    #[arg(long, default_value_t = 5)]
    batches_per_renewal: u32,
}

/// Latencies of one operation kind, bounded by the run's duration.
#[derive(Default)]
struct Latencies(Vec<u32>);

impl Latencies {
    fn record(&mut self, since: Instant) {
        self.0.push(since.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
    }

    fn quantile(&self, q: f64) -> u32 {
        let mut sorted = self.0.clone();
        sorted.sort_unstable();
        sorted.get(((sorted.len().max(1) - 1) as f64 * q).round() as usize).copied().unwrap_or(0)
    }
}

#[derive(Default)]
struct Counters {
    acquires: AtomicU64,
    renewals: AtomicU64,
    releases: AtomicU64,
    batches: AtomicU64,
    accepted: AtomicU64,
    duplicate: AtomicU64,
    rejected: AtomicU64,
    errors: AtomicU64,
}

#[derive(Default)]
struct AllLatencies {
    acquire: Latencies,
    usage: Latencies,
    consolidate: Latencies,
    release: Latencies,
}

pub async fn run(args: GatewayArgs) -> anyhow::Result<()> {
    let admin = TollgateClient::new(ClientConfig::new(&args.url, Some(&args.admin_token)))?;
    let gateway = TollgateClient::new(ClientConfig::new(&args.url, Some(&args.gateway_token)))?;
    // Request IDs are unique per account forever, so each run has its own prefix.
    let run = Timestamp::now().as_millisecond();
    let credentials = create_accounts(&admin, run, args.accounts).await?;

    let counters = Arc::new(Counters::default());
    let latencies = Arc::new(Mutex::new(AllLatencies::default()));
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(args.seconds);
    let mut workers = Vec::new();
    for worker in 0..args.workers {
        let (account, credential) = credentials[worker % credentials.len()].clone();
        let worker = Worker {
            gateway: gateway.clone(),
            counters: counters.clone(),
            request_prefix: format!("{run}-{worker}"),
            account,
            credential,
            lease_units: args.lease_units,
            batch_events: args.batch_events,
            batches_per_renewal: args.batches_per_renewal,
        };
        let latencies = latencies.clone();
        workers.push(tokio::spawn(async move {
            let local = worker.run(deadline).await?;
            latencies.lock().await.extend(local);
            anyhow::Ok(())
        }));
    }

    let progress = tokio::spawn(show_progress(counters.clone(), start));
    let mut failures = 0;
    for worker in workers {
        if let Err(error) = worker.await? {
            failures += 1;
            eprintln!("\nworker failed: {error:#}");
        }
    }
    progress.abort();
    let elapsed = start.elapsed().as_secs_f64();
    eprintln!();
    print_summary(&counters, &*latencies.lock().await, elapsed);
    println!("\n{} workers over {} accounts for {elapsed:.1} s", args.workers, args.accounts);
    if failures > 0 {
        anyhow::bail!("{failures} workers failed");
    }
    Ok(())
}

/// Creates and credits the run's accounts, each with one credential.
async fn create_accounts(admin: &TollgateClient, run: i64, accounts: usize) -> anyhow::Result<Vec<(String, String)>> {
    let mut credentials = Vec::with_capacity(accounts);
    eprintln!("creating {accounts} accounts…");
    for index in 0..accounts {
        let account = format!("gw-{run}-{index}");
        admin.create_account(&account).await.with_context(|| format!("creating {account}"))?;
        admin.credit(&account, "gateway-bench", 1 << 50).await?;
        let credential = admin.issue_credential(&account, "gateway bench").await?;
        credentials.push((account, credential.credential.credential_id));
    }
    Ok(credentials)
}

impl AllLatencies {
    fn extend(&mut self, other: AllLatencies) {
        self.acquire.0.extend(other.acquire.0);
        self.usage.0.extend(other.usage.0);
        self.consolidate.0.extend(other.consolidate.0);
        self.release.0.extend(other.release.0);
    }
}

/// One gateway worker: one lease at a time on one account.
struct Worker {
    gateway: TollgateClient,
    counters: Arc<Counters>,
    request_prefix: String,
    account: String,
    credential: String,
    lease_units: u64,
    batch_events: usize,
    batches_per_renewal: u32,
}

impl Worker {
    const TTL: SignedDuration = SignedDuration::from_secs(60);

    /// Acquires, reports usage and renews until `deadline`, then releases.
    async fn run(self, deadline: Instant) -> anyhow::Result<AllLatencies> {
        let mut local = AllLatencies::default();
        let sent = Instant::now();
        let mut lease = self.gateway.acquire(&self.account, self.lease_units, Self::TTL).await?;
        local.acquire.record(sent);
        self.counters.acquires.fetch_add(1, Ordering::Relaxed);
        let mut sequence = 0u64;
        let mut batches_on_lease = 0u32;
        while Instant::now() < deadline {
            let events: Vec<UsageEvent> = (0..self.batch_events).map(|_| self.event(&lease, &mut sequence)).collect();
            let sent = Instant::now();
            if self.report(&events).await {
                local.usage.record(sent);
            }
            batches_on_lease += 1;
            if batches_on_lease >= self.batches_per_renewal {
                let capability = lease.capability.clone().context("a granted lease carries its capability")?;
                let handle = LeaseHandleBody { lease_id: lease.lease_id.clone(), capability };
                let sent = Instant::now();
                lease = self.gateway.consolidate(&self.account, vec![handle], self.lease_units, Self::TTL).await?.lease;
                local.consolidate.record(sent);
                self.counters.renewals.fetch_add(1, Ordering::Relaxed);
                batches_on_lease = 0;
            }
        }
        let capability = lease.capability.clone().context("a granted lease carries its capability")?;
        let sent = Instant::now();
        self.gateway.release(&self.account, &lease.lease_id, &capability).await?;
        local.release.record(sent);
        self.counters.releases.fetch_add(1, Ordering::Relaxed);
        Ok(local)
    }

    fn event(&self, lease: &LeaseBody, sequence: &mut u64) -> UsageEvent {
        *sequence += 1;
        UsageEvent {
            request_id: format!("{}-{sequence}", self.request_prefix),
            account_id: self.account.clone(),
            credential_id: self.credential.clone(),
            units: 1 + *sequence % 5,
            occurred_at: Timestamp::now(),
            lease_id: Some(lease.lease_id.clone()),
            fencing_token: Some(lease.fencing_token),
            dimensions: Default::default(),
        }
    }

    /// Sends one batch and counts its outcomes; a failed batch is counted as
    /// an error. Whether the batch was answered.
    async fn report(&self, events: &[UsageEvent]) -> bool {
        let counters = &self.counters;
        match self.gateway.send_usage(events).await {
            Ok(response) => {
                counters.batches.fetch_add(1, Ordering::Relaxed);
                for outcome in response.outcomes {
                    let counter = match outcome.outcome.as_str() {
                        "accepted" => &counters.accepted,
                        "duplicate" => &counters.duplicate,
                        _ => &counters.rejected,
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                }
                true
            }
            Err(_) => {
                counters.errors.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }
}

/// A live progress line on stderr, every half second.
async fn show_progress(counters: Arc<Counters>, start: Instant) {
    let mut interval = tokio::time::interval(Duration::from_millis(500));
    loop {
        interval.tick().await;
        let elapsed = start.elapsed().as_secs_f64();
        let accepted = counters.accepted.load(Ordering::Relaxed);
        eprint!(
            "\r{elapsed:6.1}s  leases {:>6}  renewals {:>6}  batches {:>7}  events {:>9} ({:>8.0}/s)  errors {:>4}",
            counters.acquires.load(Ordering::Relaxed),
            counters.renewals.load(Ordering::Relaxed),
            counters.batches.load(Ordering::Relaxed),
            accepted,
            accepted as f64 / elapsed.max(0.001),
            counters.errors.load(Ordering::Relaxed),
        );
        let _ = std::io::stderr().flush();
    }
}

/// The summary tables on stdout.
fn print_summary(c: &Counters, all: &AllLatencies, elapsed: f64) {
    println!("| operation | count | per second | p50 | p99 |");
    println!("|---|---|---|---|---|");
    let row = |name: &str, count: u64, latencies: &Latencies| {
        println!(
            "| {name} | {count} | {:.1} | {} µs | {} µs |",
            count as f64 / elapsed,
            latencies.quantile(0.5),
            latencies.quantile(0.99)
        );
    };
    row("acquire", c.acquires.load(Ordering::Relaxed), &all.acquire);
    row("usage batch", c.batches.load(Ordering::Relaxed), &all.usage);
    row("consolidate (renewal)", c.renewals.load(Ordering::Relaxed), &all.consolidate);
    row("release", c.releases.load(Ordering::Relaxed), &all.release);
    println!();
    println!("| events | count |");
    println!("|---|---|");
    println!("| accepted | {} |", c.accepted.load(Ordering::Relaxed));
    println!("| duplicate | {} |", c.duplicate.load(Ordering::Relaxed));
    println!("| rejected | {} |", c.rejected.load(Ordering::Relaxed));
    println!("| failed batches | {} |", c.errors.load(Ordering::Relaxed));
}
