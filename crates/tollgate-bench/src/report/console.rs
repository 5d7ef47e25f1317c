//! The console pair's page times against the bound the console is held to.

use std::fmt::Write as _;

use super::{Side, Sides, median, side};

/// The longest an account page may take: 100 active leases and 1 000 000
/// events in its chart, on PostgreSQL.
const PAGE_TIME_BOUND_US: f64 = 300_000.0;

/// The p50 and p99 page times of both sides of the console pair, medians
/// over the rounds, and whether the server's p99 is within the bound.
pub(super) fn write_page_times(out: &mut String, sides: &Sides) -> anyhow::Result<()> {
    let (Some(tollgate), Some(baseline)) =
        (side(sides, "console_page", "tollgate"), side(sides, "console_page", "baseline"))
    else {
        return Ok(());
    };
    let time = |values: &[f64]| median(values).map_or("–".to_owned(), |m| format!("{:.0} ms", m / 1000.0));
    writeln!(out, "\n## Console account page\n")?;
    writeln!(
        out,
        "Per page, medians over the rounds of each round's p50 and p99; one client. The bound is {:.0} ms per page \
         for an account with 100 active leases and 1 000 000 events in its chart, judged on the server's p99.\n",
        PAGE_TIME_BOUND_US / 1000.0
    )?;
    writeln!(out, "| side | p50 | p99 | within {:.0} ms |", PAGE_TIME_BOUND_US / 1000.0)?;
    writeln!(out, "|---|---|---|---|")?;
    let within = |side: &Side| match median(&side.p99_us) {
        Some(p99) if p99 <= PAGE_TIME_BOUND_US => "yes",
        Some(_) => "**no**",
        None => "not measured",
    };
    for (name, side) in [("`tollgate serve` (PostgreSQL), the page", tollgate), ("pgbench, its statements", baseline)] {
        writeln!(out, "| {name} | {} | {} | {} |", time(&side.p50_us), time(&side.p99_us), within(side))?;
    }
    Ok(())
}
