//! The PostgreSQL drivers: the Tollgate side of each PostgreSQL pair. The
//! baselines are `pgbench` scripts and SQL files in `bench/sql`, run against
//! the same database by `bench/run`.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use jiff::Timestamp;
use tollgate_client::{ClientConfig, RecordError, TollgateClient, UsageWriter, WriterConfig};
use tollgate_pg::{PgStoreConfig, PostgresStore};
use tollgate_store::{Store, UsageSink};

use crate::roundtrips;
use crate::workload::{
    ACCOUNTS, BatchMaker, CREDIT_UNITS, Funding, USAGE_ACCOUNT, USAGE_BUCKETS, USAGE_EVENTS, USAGE_MODELS, account_id,
    policy, ttl, usage_query, usage_range,
};

/// Operations run one at a time, before timing, to count statements.
const COUNTED_OPERATIONS: u64 = 20;

/// One measurement: a rate, and the statements (round trips) per operation.
pub struct Measurement {
    pub per_second: f64,
    pub round_trips: Option<f64>,
}

impl Measurement {
    /// The line `bench/run` reads: the rate, round trips per operation, and the
    /// p50 and p99 latencies in microseconds, each `-` when not measured.
    pub fn line(&self) -> String {
        match self.round_trips {
            Some(round_trips) => format!("{:.3} {round_trips:.2} - -", self.per_second),
            None => format!("{:.3} - - -", self.per_second),
        }
    }
}

pub async fn connect(url: &str, connections_max: u32) -> anyhow::Result<PostgresStore> {
    let config = PgStoreConfig { connections_max, ..PgStoreConfig::default() };
    PostgresStore::connect_with(url, policy(), config).await.context("connecting the PostgreSQL store")
}

/// Creates the benchmark accounts, each credited, with one credential and one
/// long funding lease, which is therefore the account's fencing token 1: the
/// ingestion baseline finds it by that token.
pub async fn setup(url: &str) -> anyhow::Result<()> {
    let store = connect(url, 8).await?;
    for index in 0..ACCOUNTS {
        let account = account_id(index);
        store.create_account(&account).await?;
        store.credit(&account, "bench-credit", CREDIT_UNITS, jiff::Timestamp::UNIX_EPOCH).await?;
        store.issue_credential(&account, "bench", Timestamp::now()).await?;
        let funding = store.acquire(&account, CREDIT_UNITS / 2, policy().max_ttl(), Timestamp::now()).await?;
        if funding.lease.fencing_token != 1 {
            bail!("account {account} existed before setup; start from an empty database");
        }
    }
    Ok(())
}

/// Acquire and release in a loop on `tasks` concurrent tasks, each cycle on a
/// random account. The rate is cycles per second.
pub async fn lease_cycle(url: &str, seconds: f64, tasks: u32) -> anyhow::Result<Measurement> {
    let store = Arc::new(connect(url, tasks).await?);
    let cycle = |store: Arc<PostgresStore>| async move {
        let account = account_id(rand::random_range(0..ACCOUNTS));
        let issued = store.acquire(&account, 1, ttl(), Timestamp::now()).await?;
        store.release(&account, &issued.lease.lease_id, issued.capability.expose(), Timestamp::now()).await?;
        anyhow::Ok(())
    };
    let cycles = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let start = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..tasks {
        let (store, cycles) = (store.clone(), cycles.clone());
        workers.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                cycle(store.clone()).await?;
                cycles.fetch_add(1, Ordering::Relaxed);
            }
            anyhow::Ok(())
        }));
    }
    for worker in workers {
        worker.await??;
    }
    let per_second = cycles.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64();

    // Counted after the timed run, in the steady state it measured: the store
    // has seen every account, as a long-running server has.
    let counting = roundtrips::start();
    for _ in 0..COUNTED_OPERATIONS {
        cycle(store.clone()).await?;
    }
    let round_trips = counting.finish() as f64 / COUNTED_OPERATIONS as f64;
    Ok(Measurement { per_second, round_trips: Some(round_trips) })
}

/// The funding leases and credentials `setup` made.
async fn fundings(store: &PostgresStore) -> anyhow::Result<Vec<Funding>> {
    let rows: Vec<(String, String, i64, String)> = sqlx::query_as(
        "SELECT l.account_id, l.lease_id, l.fencing_token, c.credential_id \
         FROM tollgate_leases AS l JOIN tollgate_credentials AS c ON c.account_id = l.account_id \
         WHERE l.state = 'active' AND l.fencing_token = 1 ORDER BY l.account_id",
    )
    .fetch_all(store.pool())
    .await?;
    if rows.len() < ACCOUNTS {
        bail!("found {} funded accounts, expected {ACCOUNTS}; run pg-setup first", rows.len());
    }
    Ok(rows
        .into_iter()
        .map(|(account_id, lease_id, fencing_token, credential_id)| Funding {
            account_id,
            credential_id,
            lease_id,
            fencing_token: fencing_token as u64,
        })
        .collect())
}

/// Ingests batches of 1000 events, one batch at a time, half of the events
/// with two dimensions unless `dimensions` is false. The rate is events per
/// second. `run_tag` must differ between invocations on one database, so that
/// only the intended 1% are duplicates.
pub async fn ingest(url: &str, seconds: f64, run_tag: &str, dimensions: bool) -> anyhow::Result<Measurement> {
    let store = connect(url, 2).await?;
    let mut batches = BatchMaker::new(fundings(&store).await?, run_tag);
    if dimensions {
        batches = batches.with_dimensions();
    }

    let counting = roundtrips::start();
    store.ingest(batches.next_batch(), Timestamp::now()).await?;
    let round_trips = counting.finish() as f64;

    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let start = Instant::now();
    let mut events = 0u64;
    while Instant::now() < deadline {
        let batch = batches.next_batch();
        events += batch.len() as u64;
        store.ingest(batch, Timestamp::now()).await?;
    }
    let per_second = events as f64 / start.elapsed().as_secs_f64();
    Ok(Measurement { per_second, round_trips: Some(round_trips) })
}

/// Usage ingestion end to end: the batches of `ingest`, recorded one event at
/// a time into a `UsageWriter` that sends them over HTTP, in batches of 1000
/// (its default), to the server at `address`, which stores them on the
/// database at `url`. Events per second from the first event recorded until
/// the writer has delivered the last one; every event must come back
/// classified (accepted, duplicate or rejected) and none lost.
pub async fn http_ingest(
    url: &str,
    address: std::net::SocketAddr,
    gateway_token: &str,
    seconds: f64,
    run_tag: &str,
) -> anyhow::Result<Measurement> {
    let store = connect(url, 2).await?;
    let mut batches = BatchMaker::new(fundings(&store).await?, run_tag).with_dimensions();
    let client = TollgateClient::new(ClientConfig::new(format!("http://{address}"), Some(gateway_token)))?;
    let config = WriterConfig::default();
    let writer = UsageWriter::over_http(client, config).spawn()?;

    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let start = Instant::now();
    let mut events = 0u64;
    while Instant::now() < deadline {
        for event in batches.next_batch() {
            let mut event = event;
            loop {
                match writer.record(event) {
                    Ok(()) => break,
                    Err(RecordError::QueueFull { event: full, .. }) => {
                        event = *full;
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    Err(error) => bail!("recording an event: {error}"),
                }
            }
            events += 1;
        }
    }
    let stats = writer.flush().await.context("the usage writer stopped")?;
    let elapsed = start.elapsed();
    let rejected: u64 = stats.rejected.values().map(|tally| tally.events).sum();
    let lost: u64 = stats.lost.values().map(|tally| tally.events).sum();
    let classified = stats.accepted.events + stats.duplicate.events + rejected;
    if lost > 0 || classified != events {
        bail!("{events} events recorded, {classified} classified, {lost} lost");
    }
    writer.shutdown(Duration::from_secs(10)).await.context("the usage writer stopped")?;
    Ok(Measurement { per_second: events as f64 / elapsed.as_secs_f64(), round_trips: None })
}

/// Which side of the reclaim pair to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ReclaimSide {
    Tollgate,
    Baseline,
}

/// Seeds 100 000 due leases with `seed_sql`, then settles all of them: through
/// `Store::reclaim` in batches of `batch`, or with the one statement in
/// `baseline_sql`. Only the settling is timed. The rate is leases per second.
pub async fn reclaim(
    url: &str,
    side: ReclaimSide,
    batch: u32,
    seed_sql: &Path,
    baseline_sql: &Path,
) -> anyhow::Result<Measurement> {
    let store = connect(url, 2).await?;
    let seed = std::fs::read_to_string(seed_sql).with_context(|| format!("reading {}", seed_sql.display()))?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(seed)).execute(store.pool()).await.context("seeding due leases")?;
    sqlx::raw_sql("ANALYZE tollgate_leases, tollgate_accounts").execute(store.pool()).await?;
    let due: i64 =
        sqlx::query_scalar("SELECT count(*) FROM tollgate_leases WHERE state = 'active' AND lease_id LIKE 'due_%'")
            .fetch_one(store.pool())
            .await?;

    let start = Instant::now();
    let (settled, round_trips) = match side {
        ReclaimSide::Tollgate => {
            let counting = roundtrips::start();
            let mut settled = 0u64;
            let mut passes = 0u64;
            loop {
                let report = store.reclaim(Timestamp::now(), batch).await?;
                settled += report.reclaimed.len() as u64;
                passes += 1;
                if !report.is_full() {
                    break;
                }
            }
            let statements = counting.finish();
            (settled, Some(statements as f64 / passes as f64))
        }
        ReclaimSide::Baseline => {
            let sql =
                std::fs::read_to_string(baseline_sql).with_context(|| format!("reading {}", baseline_sql.display()))?;
            sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).execute(store.pool()).await?;
            let elapsed = start.elapsed();
            let left: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM tollgate_leases WHERE state = 'active' AND lease_id LIKE 'due_%'",
            )
            .fetch_one(store.pool())
            .await?;
            return finish((due - left) as u64, due, elapsed, Some(1.0));
        }
    };
    finish(settled, due, start.elapsed(), round_trips)
}

fn finish(settled: u64, due: i64, elapsed: Duration, round_trips: Option<f64>) -> anyhow::Result<Measurement> {
    if settled != due as u64 {
        bail!("settled {settled} of {due} due leases");
    }
    Ok(Measurement { per_second: settled as f64 / elapsed.as_secs_f64(), round_trips })
}

/// Fills the usage pair's table: `events` accepted events of one account,
/// evenly spaced over `[$3, $4)` µs in time order (as a gateway reports them),
/// 1 to 3 units each, each with a `model` dimension of `$6` values. Only the
/// events are written: the account's and credential's counters do not count
/// them, which no usage query reads.
const USAGE_EVENTS_SQL: &str = "\
INSERT INTO tollgate_usage_events (account_id, request_id, credential_id, units,
    occurred_at_floor_us, occurred_at_submicro_ns, dimensions)
SELECT $1, 'usage-' || k, $2, 1 + k % 3, $3 + k * ($4 - $3) / $5, (k * 7 % 1000)::int2,
    jsonb_build_object('model', 'model-' || k % $6)
FROM generate_series(0::int8, $5 - 1) AS k";

/// How long each step of [`usage_setup`] took.
pub struct UsageSetup {
    pub insert: Duration,
    pub vacuum: Duration,
}

/// Runs `fill`, a set-based insert of `expected` usage events (whose
/// trigger adds them to the hourly totals, migration 0025), then `VACUUM
/// ANALYZE` on both tables; returns how long each took.
pub(crate) async fn fill_events(
    store: &PostgresStore,
    fill: sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
    expected: u64,
    what: &str,
) -> anyhow::Result<(Duration, Duration)> {
    let start = Instant::now();
    let inserted = fill.execute(store.pool()).await.with_context(|| format!("inserting {what}"))?.rows_affected();
    let insert = start.elapsed();
    if inserted != expected {
        bail!("inserted {inserted} of {what}, expected {expected}");
    }
    let start = Instant::now();
    sqlx::raw_sql("VACUUM ANALYZE tollgate_usage_events, tollgate_usage_hourly").execute(store.pool()).await?;
    Ok((insert, start.elapsed()))
}

/// Creates the usage pair's account and credential through the store, fills
/// its events with one set-based statement, vacuums and analyzes the table,
/// and checks that the store's report and the baseline's statement
/// (`baseline_sql`, plain SQL) agree on the rows and events they aggregate.
pub async fn usage_setup(url: &str, baseline_sql: &Path) -> anyhow::Result<UsageSetup> {
    let store = connect(url, 1).await?;
    store.create_account(USAGE_ACCOUNT).await?;
    let credential = store.issue_credential(USAGE_ACCOUNT, "usage", Timestamp::now()).await?;
    let range = usage_range();
    let (from_us, to_us) = (range.from.as_microsecond(), range.to.as_microsecond());

    let fill = sqlx::query(USAGE_EVENTS_SQL)
        .bind(USAGE_ACCOUNT)
        .bind(&credential.credential.credential_id)
        .bind(from_us)
        .bind(to_us)
        .bind(USAGE_EVENTS as i64)
        .bind(USAGE_MODELS as i64);
    let (insert, vacuum) = fill_events(&store, fill, USAGE_EVENTS, "the usage events").await?;

    let report = store.usage(USAGE_ACCOUNT, &usage_query()).await?;
    let cells: usize = report.buckets.iter().map(|bucket| bucket.groups.len()).sum();
    if report.buckets.len() as u64 != USAGE_BUCKETS || report.total.events != u128::from(USAGE_EVENTS) {
        bail!(
            "the store's report has {} buckets and {} events, expected {USAGE_BUCKETS} and {USAGE_EVENTS}",
            report.buckets.len(),
            report.total.events
        );
    }
    let baseline =
        std::fs::read_to_string(baseline_sql).with_context(|| format!("reading {}", baseline_sql.display()))?;
    let baseline = baseline.trim_end().trim_end_matches(';');
    let (rows, events): (i64, i64) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT count(*)::int8, sum(b.events)::int8 FROM ({baseline}\n) AS b"
    )))
    .fetch_one(store.pool())
    .await
    .context("running the baseline's statement")?;
    if rows as usize != cells || events as u64 != USAGE_EVENTS {
        bail!("the baseline aggregates {events} events into {rows} rows; the store, {USAGE_EVENTS} into {cells}");
    }
    Ok(UsageSetup { insert, vacuum })
}

/// `PostgresStore::usage` of hourly totals by model over the usage account's
/// 30 days, one query at a time. The rate is queries per second.
pub async fn usage(url: &str, seconds: f64) -> anyhow::Result<Measurement> {
    let store = connect(url, 1).await?;
    let query = usage_query();

    let counting = roundtrips::start();
    let report = store.usage(USAGE_ACCOUNT, &query).await?;
    let round_trips = counting.finish() as f64;
    if report.total.events != u128::from(USAGE_EVENTS) {
        bail!("the report counts {} events, expected {USAGE_EVENTS}; run pg-usage-setup first", report.total.events);
    }

    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let start = Instant::now();
    let mut queries = 0u64;
    while Instant::now() < deadline {
        std::hint::black_box(store.usage(USAGE_ACCOUNT, &query).await?);
        queries += 1;
    }
    let per_second = queries as f64 / start.elapsed().as_secs_f64();
    Ok(Measurement { per_second, round_trips: Some(round_trips) })
}
