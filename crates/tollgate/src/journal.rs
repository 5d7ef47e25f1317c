//! `tollgate journal`: an account's journal on a running server, one row per
//! entry with the signed change of each counter, from
//! `GET /v1/accounts/{id}/journal`, following its pages.

use std::process::ExitCode;

use clap::Args;
use tollgate_api::JournalEntryBody;
use tollgate_core::{EntryIds, PageLimit};

use crate::remote::RemoteArgs;
use crate::table::{Cell, Table};

#[derive(Args)]
pub(crate) struct JournalArgs {
    /// The account whose journal to read.
    account_id: String,

    /// Only entries after this sequence number (0: from the first).
    #[arg(long, value_name = "SEQ", default_value_t = 0)]
    after: u64,

    /// At most this many entries (every later entry when absent).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    limit: Option<u64>,

    #[command(flatten)]
    remote: RemoteArgs,
}

const COLUMNS: [&str; 11] =
    ["seq", "kind", "at", "credited", "available", "reserved", "consumed", "overage", "billed", "next_fence", "ids"];

/// The ids an entry names, in one cell: `credit:ID`, `lease:ID`,
/// `leases:A+B`, `events:N` (`tollgate_core::EntryIds`'s one line).
fn ids(entry: &JournalEntryBody) -> String {
    EntryIds {
        credit_id: entry.credit_id.clone(),
        lease_id: entry.lease_id.clone(),
        leases: entry.leases.clone(),
        events: entry.events,
    }
    .to_string()
}

fn row(entry: &JournalEntryBody) -> Vec<Cell> {
    let d = &entry.deltas;
    let kind = serde_json::to_value(entry.kind).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default();
    vec![
        entry.seq.into(),
        kind.into(),
        entry.at.to_string().into(),
        Cell::Signed(d.credited),
        Cell::Signed(d.available),
        Cell::Signed(d.reserved),
        Cell::Signed(d.consumed),
        Cell::Signed(d.overage),
        Cell::Signed(d.billed),
        Cell::Signed(d.next_fence),
        ids(entry).into(),
    ]
}

pub(crate) async fn run(args: JournalArgs) -> anyhow::Result<ExitCode> {
    let client = args.remote.client()?;
    let page_size =
        args.limit.map_or(PageLimit::MAX, |limit| u32::try_from(limit).unwrap_or(u32::MAX).min(PageLimit::MAX));
    let mut table = Table::new(&COLUMNS);
    let mut after = args.after;
    let mut rows = 0;
    'pages: loop {
        let page = client.journal(&args.account_id, after, Some(page_size)).await?;
        for entry in &page.items {
            if args.limit.is_some_and(|limit| rows >= limit) {
                break 'pages;
            }
            table.push(row(entry));
            rows += 1;
        }
        match page.next_after {
            Some(next) => after = next,
            None => break,
        }
    }
    args.remote.print(&table)?;
    Ok(ExitCode::SUCCESS)
}
