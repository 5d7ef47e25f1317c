//! The console pair: the operator console's account page, rendered by
//! `tollgate serve` on PostgreSQL, against `bench/sql/console_account.sql`,
//! the same statements the page's store calls send, run by pgbench.
//!
//! `console-setup` makes the account through the server (a credit,
//! credentials, an alert rule and 100 active leases, so that its counters
//! and journal are the store's own) and then writes its 1 000 000 usage
//! events with one set-based statement, as the usage pair does, at instants
//! of the last 22 hours, which both of the page's charts cover. `console-page`
//! signs in and reads the page in a loop on one connection.

mod http;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use jiff::{SignedDuration, Timestamp};
use tollgate_client::{ClientConfig, TollgateClient};

use self::http::{Connection, Console, number_after};
use crate::pg::{connect, fill_events};

/// The console pair's account.
pub const CONSOLE_ACCOUNT: &str = "console-1";
/// Accepted usage events of that account.
pub const CONSOLE_EVENTS: u64 = 1_000_000;
/// Active leases of that account: the page lists the first 100.
pub const CONSOLE_LEASES: u64 = 100;
/// Credentials of that account; the events are spread over them, and the
/// chart, stacked by credential, has one series each.
const CONSOLE_CREDENTIALS: usize = 4;
/// Units credited, and units each lease holds: no lease runs the account dry.
const CONSOLE_CREDIT_UNITS: u64 = 1_000_000;
const LEASE_UNITS: u64 = 10;
/// The events lie in the last this many hours before the setup. The hourly
/// chart's 24 buckets end with the one that holds the present, so they cover
/// the events until the hour after the setup's has begun.
const EVENT_HOURS: i64 = 22;
/// Distinct values of the `model` dimension the events carry.
const EVENT_MODELS: i64 = 5;

/// Fills the console account's events: `$5` accepted events of account `$1`,
/// evenly spaced over `[$3, $4)` µs in time order, spread over the
/// credentials `$2`, 1 to 3 units each, each with a `model` dimension of
/// `$6` values. Like the usage pair's setup, only the events are written:
/// the account's and credentials' counters do not count them (the page's
/// usage chart reads the events alone).
const CONSOLE_EVENTS_SQL: &str = "\
INSERT INTO tollgate_usage_events (account_id, request_id, credential_id, units,
    occurred_at_floor_us, occurred_at_submicro_ns, dimensions)
SELECT $1, 'console-' || k, ($2::text[])[1 + k % cardinality($2::text[])], 1 + k % 3,
    $3 + k * ($4 - $3) / $5, (k * 7 % 1000)::int2, jsonb_build_object('model', 'model-' || k % $6)
FROM generate_series(0::int8, $5 - 1) AS k";

/// Which chart the page shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ChartRange {
    /// The last 24 hours by hour, the page's default.
    #[value(name = "24h")]
    Day,
    /// The last 30 days by day.
    #[value(name = "30d")]
    Month,
}

impl ChartRange {
    /// The page's path for this chart.
    fn path(self, account: &str) -> String {
        match self {
            ChartRange::Day => format!("/console/accounts/{account}"),
            ChartRange::Month => format!("/console/accounts/{account}?range=30d"),
        }
    }

    /// The chart's bucket width and count.
    fn buckets(self) -> (SignedDuration, i64) {
        match self {
            ChartRange::Day => (SignedDuration::from_hours(1), 24),
            ChartRange::Month => (SignedDuration::from_hours(24), 30),
        }
    }

    /// The chart's window at `now`, `(from, to, width)` in µs, as the page
    /// computes it: its buckets end with the one that holds `now`.
    pub fn window_us(self, now: Timestamp) -> (i64, i64, i64) {
        let (width, buckets) = self.buckets();
        let width = width.as_micros() as i64;
        let to = (now.as_microsecond().div_euclid(width) + 1) * width;
        (to - width * buckets, to, width)
    }
}

#[derive(clap::Args)]
pub struct SetupArgs {
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    database_url: String,
    /// The server on that database, a loopback address such as 127.0.0.1:8080.
    #[arg(long)]
    address: SocketAddr,
    #[arg(long, env = "TOLLGATE_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: String,
    /// The chart whose window the baseline is given.
    #[arg(long, value_enum, default_value = "24h")]
    range: ChartRange,
}

#[derive(clap::Args)]
pub struct PageArgs {
    /// The server, a loopback address such as 127.0.0.1:8080.
    #[arg(long)]
    address: SocketAddr,
    #[arg(long, env = "TOLLGATE_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: String,
    #[arg(long, default_value = CONSOLE_ACCOUNT)]
    account: String,
    #[arg(long, value_enum, default_value = "24h")]
    range: ChartRange,
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
}

/// What `console-setup` reports: how long the insert and the VACUUM
/// ANALYZE took, and the chart's window at the end of the setup, which
/// the baseline is run with.
pub struct Setup {
    pub insert: Duration,
    pub vacuum: Duration,
    pub window_us: (i64, i64, i64),
}

impl Setup {
    /// `insert_s vacuum_s from_us to_us width_us`.
    pub fn line(&self) -> String {
        let (from, to, width) = self.window_us;
        format!("{:.1} {:.1} {from} {to} {width}", self.insert.as_secs_f64(), self.vacuum.as_secs_f64())
    }
}

/// Makes the console account through the server, fills its events, and
/// checks that the page shows them all and the 100 leases.
pub async fn setup(args: SetupArgs) -> anyhow::Result<Setup> {
    let credentials = account_through_server(&args).await?;
    let store = connect(&args.database_url, 1).await?;
    let now = Timestamp::now();
    let to_us = now.as_microsecond();
    let from_us = to_us - SignedDuration::from_hours(EVENT_HOURS).as_micros() as i64;
    let fill = sqlx::query(CONSOLE_EVENTS_SQL)
        .bind(CONSOLE_ACCOUNT)
        .bind(&credentials)
        .bind(from_us)
        .bind(to_us)
        .bind(CONSOLE_EVENTS as i64)
        .bind(EVENT_MODELS);
    let (insert, vacuum) = fill_events(&store, fill, CONSOLE_EVENTS, "the console account's usage events").await?;

    let mut console = Connection::open(args.address).await?.sign_in(&args.admin_token).await?;
    let page = console.get(&args.range.path(CONSOLE_ACCOUNT)).await?;
    let text = page.text();
    let events = number_after(&text, r#"id="usage-events">"#);
    let leases = number_after(&text, r#"data-counter="active_leases">"#);
    if page.status != 200 || events != Some(CONSOLE_EVENTS) || leases != Some(CONSOLE_LEASES) {
        bail!(
            "the account page answered {} with {events:?} events and {leases:?} active leases, \
             expected 200 with {CONSOLE_EVENTS} and {CONSOLE_LEASES}",
            page.status
        );
    }
    Ok(Setup { insert, vacuum, window_us: args.range.window_us(Timestamp::now()) })
}

/// Creates, credits and funds the account over HTTP, as an operator and a
/// gateway would: its credentials, one alert rule (never crossed) and its
/// active leases. Returns the credential ids.
async fn account_through_server(args: &SetupArgs) -> anyhow::Result<Vec<String>> {
    let client =
        TollgateClient::new(ClientConfig::new(format!("http://{}", args.address), Some(args.admin_token.as_str())))?;
    client
        .create_account(CONSOLE_ACCOUNT)
        .await
        .context("creating the console account; start from a fresh database")?;
    client.credit(CONSOLE_ACCOUNT, "console-credit", CONSOLE_CREDIT_UNITS).await?;
    let mut credentials = Vec::with_capacity(CONSOLE_CREDENTIALS);
    for index in 1..=CONSOLE_CREDENTIALS {
        let issued = client.issue_credential(CONSOLE_ACCOUNT, &format!("gateway-{index}")).await?;
        credentials.push(issued.credential.credential_id);
    }
    let mut connection = Connection::open(args.address).await?;
    let rule = r#"{"condition":"available_below","threshold":1000}"#.to_owned();
    let path = format!("/v1/accounts/{CONSOLE_ACCOUNT}/alert-rules");
    connection.post_json(&args.admin_token, &path, rule, 201).await?;
    for _ in 0..CONSOLE_LEASES {
        client.acquire(CONSOLE_ACCOUNT, LEASE_UNITS, SignedDuration::from_hours(1)).await?;
    }
    Ok(credentials)
}

/// The console pair's Tollgate side: pages per second and the p50 and p99
/// page times.
pub struct PageReport {
    pub per_second: f64,
    pub p50_us: u64,
    pub p99_us: u64,
}

impl PageReport {
    /// The line `bench/run` reads: `rate round_trips p50 p99`.
    pub fn line(&self) -> String {
        format!("{:.3} - {} {}", self.per_second, self.p50_us, self.p99_us)
    }
}

/// Signs in and GETs the account page in a loop on one connection until
/// `seconds` are up, each page checked to be a 200 that shows the
/// account's `credited` counter as its JSON route gives it.
pub async fn pages(args: PageArgs) -> anyhow::Result<PageReport> {
    let client =
        TollgateClient::new(ClientConfig::new(format!("http://{}", args.address), Some(args.admin_token.as_str())))?;
    let credited = client.account(&args.account).await.context("reading the account")?.credited;
    let marker = format!(r#"data-counter="credited">{credited}<"#);
    let mut console: Console = Connection::open(args.address).await?.sign_in(&args.admin_token).await?;
    let path = args.range.path(&args.account);

    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(args.seconds);
    // Bounded by the duration: one entry per page.
    let mut latencies_us: Vec<u64> = Vec::new();
    while Instant::now() < deadline {
        let sent = Instant::now();
        let page = console.get(&path).await?;
        latencies_us.push(sent.elapsed().as_micros() as u64);
        if page.status != 200 || !page.text().contains(&marker) {
            bail!("GET {path}: {} without {marker}: {}", page.status, page.text());
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    if latencies_us.is_empty() {
        bail!("no page was read in {} s", args.seconds);
    }
    latencies_us.sort_unstable();
    let quantile = |q: f64| latencies_us[((latencies_us.len() - 1) as f64 * q).round() as usize];
    Ok(PageReport { per_second: latencies_us.len() as f64 / elapsed, p50_us: quantile(0.50), p99_us: quantile(0.99) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_ends_with_the_bucket_that_holds_now() {
        let now: Timestamp = "2026-12-01T21:18:46Z".parse().unwrap();
        let at = |text: &str| text.parse::<Timestamp>().unwrap().as_microsecond();
        let hour = 3_600_000_000;
        assert_eq!(ChartRange::Day.window_us(now), (at("2026-11-30T22:00:00Z"), at("2026-12-01T22:00:00Z"), hour));
        assert_eq!(
            ChartRange::Month.window_us(now),
            (at("2026-11-02T00:00:00Z"), at("2026-12-02T00:00:00Z"), 24 * hour)
        );
        assert_eq!(ChartRange::Month.path("a"), "/console/accounts/a?range=30d");
    }

    #[test]
    fn the_events_stay_in_the_hourly_window_until_the_next_hour_ends() {
        let setup: Timestamp = "2026-12-01T21:59:59Z".parse().unwrap();
        let first_event = setup.as_microsecond() - SignedDuration::from_hours(EVENT_HOURS).as_micros() as i64;
        let an_hour_on = setup.checked_add(SignedDuration::from_hours(1)).unwrap();
        for now in [setup, an_hour_on] {
            let (from, to, _) = ChartRange::Day.window_us(now);
            assert!(from <= first_event && setup.as_microsecond() < to);
        }
    }
}
