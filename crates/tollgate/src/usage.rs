//! `tollgate usage`: an account's usage on a running server, one row per
//! bucket and group, from the usage query (`GET /v1/accounts/{id}/usage`).

use std::process::ExitCode;

use anyhow::anyhow;
use clap::Args;
use jiff::{SignedDuration, Timestamp};
use tollgate_api::UsageReportBody;
use tollgate_client::UsageQueryParams;
use tollgate_core::query::{GroupBy, Window};

use crate::remote::RemoteArgs;
use crate::table::{Cell, Table};

/// How far back `--from` reaches when it is not given.
const DEFAULT_SPAN: SignedDuration = SignedDuration::from_hours(24);

#[derive(Args)]
pub(crate) struct UsageArgs {
    /// The account whose usage to read.
    account_id: String,

    /// The range's first instant (RFC 3339); 24 hours before `--to` when absent.
    #[arg(long, value_name = "INSTANT")]
    from: Option<Timestamp>,

    /// The instant after the range (RFC 3339); now when absent.
    #[arg(long, value_name = "INSTANT")]
    to: Option<Timestamp>,

    /// Bucket width: PT1M, PT1H or P1D; the whole range is one bucket when absent.
    #[arg(long, value_name = "WINDOW")]
    window: Option<String>,

    /// Group by credential, lease, funding or dimension:KEY.
    #[arg(long, value_name = "GROUP")]
    group_by: Option<String>,

    #[command(flatten)]
    remote: RemoteArgs,
}

const COLUMNS: [&str; 5] = ["start", "end", "group", "units", "events"];

/// One row per non-empty group of each bucket; an empty bucket is one row
/// with no group and zero totals, so a day without usage still shows.
fn table(report: &UsageReportBody) -> Table {
    let mut table = Table::new(&COLUMNS);
    for bucket in &report.buckets {
        let (start, end) = (bucket.start.to_string(), bucket.end.to_string());
        if bucket.groups.is_empty() {
            table.push(vec![start.as_str().into(), end.as_str().into(), "".into(), "0".into(), "0".into()]);
        }
        for group in &bucket.groups {
            let key = group.key.clone().unwrap_or_default();
            let row: Vec<Cell> = vec![
                start.as_str().into(),
                end.as_str().into(),
                key.into(),
                group.units.as_str().into(),
                group.events.as_str().into(),
            ];
            table.push(row);
        }
    }
    table
}

/// A refusal of the command line itself, with the code the server would give.
fn refused(error: tollgate_core::Error) -> anyhow::Error {
    anyhow!("{}: {error}", error.code())
}

pub(crate) async fn run(args: UsageArgs) -> anyhow::Result<ExitCode> {
    let to = args.to.unwrap_or_else(Timestamp::now);
    let from = match args.from {
        Some(from) => from,
        None => to.checked_sub(DEFAULT_SPAN).map_err(|_| refused(tollgate_core::Error::InvalidRange))?,
    };
    let window = Window::parse(args.window.as_deref()).map_err(refused)?;
    let group_by = GroupBy::parse(args.group_by.as_deref()).map_err(refused)?;
    let client = args.remote.client()?;
    let report = client.usage(&args.account_id, &UsageQueryParams { from, to, window, group_by }).await?;
    args.remote.print(&table(&report))?;
    Ok(ExitCode::SUCCESS)
}
