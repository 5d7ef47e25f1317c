//! Writes `bench/RESULTS.md` from the rounds `bench/run` recorded.
//!
//! The rounds file has one line per measurement, tab-separated:
//! `pair side round rate round_trips p50_us p99_us`, with `-` for a figure that
//! was not measured. Rates are always "more is better" (operations, events or
//! leases per second), so every ratio is Tollgate / baseline.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{Context, bail};

mod console;

#[derive(clap::Args)]
pub struct ReportArgs {
    #[arg(long)]
    rounds: PathBuf,
    /// The JSON line `tollgate-bench-memory` printed.
    #[arg(long)]
    memory: PathBuf,
    /// `nproc`, `free` and `lscpu` output.
    #[arg(long)]
    machine: PathBuf,
    /// Hand-written analysis appended verbatim, when it exists.
    #[arg(long)]
    analysis: Option<PathBuf>,
    /// Peak RSS (VmHWM) of `tollgate serve` after the HTTP rounds, in KiB.
    #[arg(long)]
    server_hwm_kb: Option<u64>,
    /// Peak RSS of the baseline server, in KiB.
    #[arg(long)]
    baseline_hwm_kb: Option<u64>,
    /// Peak RSS of `tollgate serve` on PostgreSQL after its HTTP rounds, in KiB.
    #[arg(long)]
    pg_server_hwm_kb: Option<u64>,
    /// The two-server rounds' stale writes, fallbacks and requests, summed
    /// over both servers, as three numbers.
    #[arg(long)]
    two_servers: Option<String>,
    /// How the results were produced, quoted in the header.
    #[arg(long)]
    command: String,
    #[arg(long)]
    out: PathBuf,
}

struct Pair {
    key: &'static str,
    path: &'static str,
    unit: &'static str,
    target: f64,
    tollgate: &'static str,
    baseline: &'static str,
}

const PAIRS: &[Pair] = &[
    Pair {
        key: "pg_lease",
        path: "PostgreSQL lease cycle",
        unit: "cycles/s",
        target: 0.80,
        tollgate: "`PostgresStore` acquire + release, 8 tasks on 1 client thread, 1000 accounts",
        baseline: "`pgbench -M prepared -c 8 -j 1`, `bench/sql/lease_cycle.sql`",
    },
    Pair {
        key: "pg_lease_journal",
        path: "PostgreSQL lease cycle, journaled floor",
        unit: "cycles/s",
        target: 0.80,
        tollgate: "the same run of the store as the row above",
        baseline: "`pgbench -M prepared -c 8 -j 1`, `bench/sql/lease_cycle_journal.sql`",
    },
    Pair {
        key: "pg_ingest",
        path: "PostgreSQL ingestion",
        unit: "events/s",
        target: 0.50,
        tollgate: "`PostgresStore::ingest`, batches of 1000 (½ leased, ½ overage, ½ with two dimensions, 1% duplicates)",
        baseline: "`pgbench -M prepared -c 1`, `bench/sql/ingest_batch.sql`",
    },
    Pair {
        key: "pg_usage",
        path: "PostgreSQL usage query",
        unit: "queries/s",
        target: 0.80,
        tollgate: "`PostgresStore::usage`, hourly (720 buckets) by `dimension:model`, one account's 1 000 000 events over 30 days",
        baseline: "`pgbench -M prepared -c 1`, `bench/sql/usage_hourly.sql`",
    },
    Pair {
        key: "console_page",
        path: "Console account page on PostgreSQL",
        unit: "pages/s",
        target: 0.70,
        tollgate: "`tollgate serve --database-url`, `GET /console/accounts/console-1` signed in, one connection: 100 active leases, usage of the last 24 hours by credential over 1 000 000 events",
        baseline: "`pgbench -M prepared -c 1`, `bench/sql/console_account.sql`, the page's six statements",
    },
    Pair {
        key: "pg_reclaim",
        path: "Reclaim",
        unit: "leases/s",
        target: 0.50,
        tollgate: "`Store::reclaim` passes of 1000 over 100 000 due leases",
        baseline: "one statement, `bench/sql/reclaim_baseline.sql`",
    },
    Pair {
        key: "memory_lease",
        path: "Memory lease cycle",
        unit: "cycles/s",
        target: 0.50,
        tollgate: "`MemoryStore` acquire + release, one thread, an alert rule on every account",
        baseline: "`HashMap` model (`crates/tollgate-bench/src/model.rs`)",
    },
    Pair {
        key: "memory_ingest",
        path: "Memory ingestion",
        unit: "events/s",
        target: 0.50,
        tollgate: "`MemoryStore::ingest`, batches of 1000, an alert rule on every account",
        baseline: "the same `HashMap` model",
    },
    Pair {
        key: "memory_lease_rules",
        path: "Memory lease cycle: what alert rules cost",
        unit: "cycles/s",
        target: 0.90,
        tollgate: "the same run of the store as the memory lease cycle row (an alert rule on every account)",
        baseline: "the same store without alert rules (`memory_lease/tollgate_plain`)",
    },
    Pair {
        key: "memory_ingest_rules",
        path: "Memory ingestion: what alert rules cost",
        unit: "events/s",
        target: 0.90,
        tollgate: "the same run of the store as the memory ingestion row (an alert rule on every account)",
        baseline: "the same store without alert rules (`memory_ingest/tollgate_plain`)",
    },
    Pair {
        key: "http",
        path: "HTTP",
        unit: "requests/s",
        target: 0.60,
        tollgate: "`tollgate serve` (memory), acquire + release, 64 keep-alive connections, an alert rule on every account",
        baseline: "axum handler parsing the same JSON, constant answer",
    },
    Pair {
        key: "http_pg",
        path: "HTTP on PostgreSQL",
        unit: "requests/s",
        target: 0.60,
        tollgate: "`tollgate serve --database-url` (16 database connections, deriving webhook events), acquire + release, 64 keep-alive connections, 1000 accounts, an alert rule on each",
        baseline: "`pgbench -M prepared -c 16 -j 1`, `bench/sql/lease_cycle.sql`, each cycle's two statements counted as two requests",
    },
    Pair {
        key: "http_pg2",
        path: "HTTP on PostgreSQL, two servers",
        unit: "requests/s",
        target: 0.60,
        tollgate: "two `tollgate serve --database-url` (16 database connections each) on one database, 64 keep-alive connections split between them, each slot's two connections on the same accounts",
        baseline: "`pgbench -M prepared -c 32 -j 1`, `bench/sql/lease_cycle.sql`, two requests per cycle",
    },
    Pair {
        key: "http_ingest",
        path: "Usage ingestion end to end",
        unit: "events/s",
        target: 0.40,
        tollgate: "`UsageWriter` over HTTP to `tollgate serve` on PostgreSQL, batches of 1000 (the ingestion row's events)",
        baseline: "`pgbench -M prepared -c 1`, `bench/sql/ingest_batch.sql`",
    },
];

#[derive(Default)]
struct Side {
    /// Rate by round.
    rates: BTreeMap<u32, f64>,
    round_trips: Vec<f64>,
    p50_us: Vec<f64>,
    p99_us: Vec<f64>,
}

fn median(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let middle = sorted.len() / 2;
    Some(if sorted.len().is_multiple_of(2) { (sorted[middle - 1] + sorted[middle]) / 2.0 } else { sorted[middle] })
}

fn min_max(values: &[f64]) -> Option<(f64, f64)> {
    let min = values.iter().copied().min_by(f64::total_cmp)?;
    let max = values.iter().copied().max_by(f64::total_cmp)?;
    Some((min, max))
}

/// A rate with few enough digits to read.
fn rate(value: f64) -> String {
    if value >= 100.0 { format!("{value:.0}") } else { format!("{value:.2}") }
}

fn parse_field(field: &str) -> anyhow::Result<Option<f64>> {
    if field == "-" { Ok(None) } else { Ok(Some(field.parse().with_context(|| format!("not a number: {field:?}"))?)) }
}

fn read_rounds(text: &str) -> anyhow::Result<BTreeMap<(String, String), Side>> {
    let mut sides: BTreeMap<(String, String), Side> = BTreeMap::new();
    for (number, line) in text.lines().enumerate().filter(|(_, line)| !line.trim().is_empty()) {
        let fields: Vec<&str> = line.split('\t').collect();
        if fields.len() != 7 {
            bail!("rounds line {} has {} fields, expected 7: {line:?}", number + 1, fields.len());
        }
        let side = sides.entry((fields[0].to_owned(), fields[1].to_owned())).or_default();
        let round: u32 = fields[2].parse()?;
        if let Some(value) = parse_field(fields[3])? {
            side.rates.insert(round, value);
        }
        side.round_trips.extend(parse_field(fields[4])?);
        side.p50_us.extend(parse_field(fields[5])?);
        side.p99_us.extend(parse_field(fields[6])?);
    }
    Ok(sides)
}

fn memory_json(text: &str, key: &str) -> Option<f64> {
    let value: serde_json::Value = serde_json::from_str(text.trim()).ok()?;
    value.get(key)?.as_f64()
}

pub fn write(args: ReportArgs) -> anyhow::Result<()> {
    let rounds = std::fs::read_to_string(&args.rounds).with_context(|| format!("reading {}", args.rounds.display()))?;
    let sides = read_rounds(&rounds)?;
    let memory = std::fs::read_to_string(&args.memory).unwrap_or_default();
    let machine = std::fs::read_to_string(&args.machine).unwrap_or_default();

    let mut out = String::new();
    write_ratios(&mut out, &args.command, &sides)?;
    write_http(&mut out, &sides, [args.server_hwm_kb, args.baseline_hwm_kb, args.pg_server_hwm_kb])?;
    write_two_servers(&mut out, &sides, args.two_servers.as_deref())?;
    console::write_page_times(&mut out, &sides)?;
    write_memory(&mut out, &memory)?;
    if let Some(path) = &args.analysis
        && let Ok(text) = std::fs::read_to_string(path)
    {
        writeln!(out, "\n{}", text.trim_end())?;
    }
    writeln!(out, "\n## Machine\n\n```\n{}\n```", machine.trim_end())?;
    std::fs::write(&args.out, out).with_context(|| format!("writing {}", args.out.display()))?;
    Ok(())
}

type Sides = BTreeMap<(String, String), Side>;

fn side<'a>(sides: &'a Sides, pair: &str, which: &str) -> Option<&'a Side> {
    sides.get(&(pair.to_owned(), which.to_owned()))
}

/// The table of ratios, one row per pair.
fn write_ratios(out: &mut String, command: &str, sides: &Sides) -> anyhow::Result<()> {
    writeln!(out, "# Benchmark results\n")?;
    writeln!(
        out,
        "Produced by `{command}`. Every ratio is Tollgate / baseline, both measured in the same run on this \
         machine, interleaved round by round (A B A B …). *Ratio* is the ratio of the medians; \
         *per-round* is the range of the ratios of the two sides of each round. Rates are medians \
         with min–max over the rounds.\n",
    )?;
    writeln!(
        out,
        "| path | Tollgate | baseline | unit | Tollgate median (min–max) | baseline median (min–max) | ratio | per-round | target | met | round trips per op (Tollgate / baseline) |"
    )?;
    writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|")?;
    let empty = Side::default();
    for pair in PAIRS {
        let tollgate = side(sides, pair.key, "tollgate").unwrap_or(&empty);
        let baseline = side(sides, pair.key, "baseline").unwrap_or(&empty);
        write_ratio_row(out, pair, tollgate, baseline)?;
    }
    Ok(())
}

fn write_ratio_row(out: &mut String, pair: &Pair, tollgate: &Side, baseline: &Side) -> anyhow::Result<()> {
    let t_rates: Vec<f64> = tollgate.rates.values().copied().collect();
    let b_rates: Vec<f64> = baseline.rates.values().copied().collect();
    let describe = |rates: &[f64]| match (median(rates), min_max(rates)) {
        (Some(m), Some((lo, hi))) => format!("{} ({}–{})", rate(m), rate(lo), rate(hi)),
        _ => "not measured".to_owned(),
    };
    let ratio = match (median(&t_rates), median(&b_rates)) {
        (Some(t), Some(b)) if b > 0.0 => Some(t / b),
        _ => None,
    };
    let per_round: Vec<f64> = tollgate
        .rates
        .iter()
        .filter_map(|(round, t)| baseline.rates.get(round).filter(|b| **b > 0.0).map(|b| t / b))
        .collect();
    let per_round = min_max(&per_round).map_or("–".to_owned(), |(lo, hi)| format!("{lo:.2}–{hi:.2}"));
    let (ratio_text, met) = match ratio {
        Some(r) => (format!("**{r:.2}**"), if r >= pair.target { "yes" } else { "**no**" }),
        None => ("–".to_owned(), "not measured"),
    };
    let trips = |side: &Side| median(&side.round_trips).map_or("–".to_owned(), |m| format!("{m:.1}"));
    writeln!(
        out,
        "| {} | {} | {} | {} | {} | {} | {} | {} | ≥ {:.2} | {} | {} / {} |",
        pair.path,
        pair.tollgate,
        pair.baseline,
        pair.unit,
        describe(&t_rates),
        describe(&b_rates),
        ratio_text,
        per_round,
        pair.target,
        met,
        trips(tollgate),
        trips(baseline),
    )?;
    Ok(())
}

/// HTTP latency of the servers and their peak memory: `hwm_kb` is that of
/// `tollgate serve` on memory, of the axum baseline and of `tollgate serve` on
/// PostgreSQL.
fn write_http(out: &mut String, sides: &Sides, hwm_kb: [Option<u64>; 3]) -> anyhow::Result<()> {
    let empty = Side::default();
    let servers = [
        ("`tollgate serve` (memory)", side(sides, "http", "tollgate")),
        ("axum baseline", side(sides, "http", "baseline")),
        ("`tollgate serve` (PostgreSQL)", side(sides, "http_pg", "tollgate")),
    ];
    let latency = |values: &[f64]| median(values).map_or("–".to_owned(), |m| format!("{m:.0} µs"));
    let hwm = |kb: Option<u64>| kb.map_or("–".to_owned(), |kb| format!("{:.1} MiB", kb as f64 / 1024.0));
    writeln!(out, "\n## HTTP latency and server memory\n")?;
    writeln!(out, "Per request, medians over the rounds; 64 connections, each running acquire then release.\n")?;
    writeln!(out, "| server | p50 | p99 | peak RSS (VmHWM) |")?;
    writeln!(out, "|---|---|---|---|")?;
    for ((name, side), kb) in servers.into_iter().zip(hwm_kb) {
        let side = side.unwrap_or(&empty);
        writeln!(out, "| {name} | {} | {} | {} |", latency(&side.p50_us), latency(&side.p99_us), hwm(kb))?;
    }
    Ok(())
}

/// The two-server rounds against the one-server ones, and what sharing the
/// accounts cost the unlocked path.
fn write_two_servers(out: &mut String, sides: &Sides, counts: Option<&str>) -> anyhow::Result<()> {
    let rate = |pair: &str| {
        side(sides, pair, "tollgate").and_then(|side| median(&side.rates.values().copied().collect::<Vec<f64>>()))
    };
    let (Some(two), Some(one)) = (rate("http_pg2"), rate("http_pg")) else { return Ok(()) };
    writeln!(out, "\n## Two servers on one database\n")?;
    writeln!(
        out,
        "Two servers served {two:.0} requests/s together, {:.2} of one server's {one:.0} (medians over the rounds).",
        two / one
    )?;
    let numbers: Vec<u64> = counts.unwrap_or_default().split_whitespace().filter_map(|n| n.parse().ok()).collect();
    if let [stale, fallbacks, requests] = numbers[..] {
        let per_thousand = |n: u64| if requests == 0 { 0.0 } else { n as f64 * 1000.0 / requests as f64 };
        writeln!(
            out,
            "Over about {requests} requests, the unlocked path wrote nothing {stale} times (a remembered row the other \
             server had changed: {:.1} per 1000 requests, each one more round trip) and fell back to the locking path \
             {fallbacks} times ({:.2} per 1000), from both servers' `tollgate_store_stale_writes_total` and \
             `tollgate_store_fallbacks_total`.",
            per_thousand(stale),
            per_thousand(fallbacks)
        )?;
    }
    Ok(())
}

/// The memory store's bytes per item.
fn write_memory(out: &mut String, memory: &str) -> anyhow::Result<()> {
    writeln!(out, "\n## MemoryStore bytes\n")?;
    writeln!(
        out,
        "Live heap bytes counted by a global allocator (`tollgate-bench-memory`): the live bytes after \
         adding {} items to a fresh store minus those before, divided by the items. Usage events are \
         overage events in batches of 1000 over 10 accounts; their figure includes the account \
         journal's entries (one per account per batch).\n",
        memory_json(memory, "items").map_or("?".to_owned(), |n| format!("{n:.0}"))
    )?;
    writeln!(out, "| what | bytes each | target |")?;
    writeln!(out, "|---|---|---|")?;
    let bytes = |key: &str| memory_json(memory, key).map_or("not measured".to_owned(), |b| format!("{b:.0}"));
    let lease_met = match memory_json(memory, "active_lease_bytes") {
        Some(b) if b <= 256.0 => "≤ 256 (met)",
        Some(_) => "≤ 256 (**not met**)",
        None => "≤ 256",
    };
    writeln!(out, "| active lease | {} | {lease_met} |", bytes("active_lease_bytes"))?;
    writeln!(out, "| settled lease (kept as history) | {} | – |", bytes("settled_lease_bytes"))?;
    writeln!(
        out,
        "| accepted usage event, no dimensions (its {}-char request ID remembered) | {} | – |",
        memory_json(memory, "request_id_len").map_or("?".to_owned(), |n| format!("{n:.0}")),
        bytes("request_id_bytes")
    )?;
    writeln!(
        out,
        "| accepted usage event, two dimensions (`model`, `route`), same request IDs | {} | – |",
        bytes("event_two_dimensions_bytes")
    )?;
    Ok(())
}

/// Operations per second from criterion's `estimates.json`: the median time of
/// one iteration, in nanoseconds, against the operations one iteration runs.
pub fn criterion_rate(estimates: &std::path::Path, per_iteration: f64) -> anyhow::Result<f64> {
    let text = std::fs::read_to_string(estimates).with_context(|| format!("reading {}", estimates.display()))?;
    let value: serde_json::Value = serde_json::from_str(&text)?;
    let median_ns = value
        .pointer("/median/point_estimate")
        .and_then(serde_json::Value::as_f64)
        .context("estimates.json has no median point estimate")?;
    if median_ns <= 0.0 {
        bail!("median time {median_ns} ns is not positive");
    }
    Ok(per_iteration * 1e9 / median_ns)
}
