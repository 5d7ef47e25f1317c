//! `tollgate accounts`: the accounts of a running server, with their
//! counters, following the listing's pages to its end or to `--limit` rows.

use std::process::ExitCode;

use clap::Args;
use tollgate_api::AccountBody;
use tollgate_core::PageLimit;

use crate::remote::RemoteArgs;
use crate::table::{Cell, Table};

#[derive(Args)]
pub(crate) struct AccountsArgs {
    /// Only accounts whose id starts with this.
    #[arg(long, value_name = "PREFIX")]
    prefix: Option<String>,

    /// At most this many accounts (every account when absent).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    limit: Option<u64>,

    #[command(flatten)]
    remote: RemoteArgs,
}

const COLUMNS: [&str; 8] =
    ["account_id", "credited", "available", "reserved", "consumed", "overage", "billed", "active_leases"];

fn row(account: &AccountBody) -> Vec<Cell> {
    vec![
        account.account_id.as_str().into(),
        account.credited.into(),
        account.available.into(),
        account.reserved.into(),
        account.consumed.into(),
        account.overage.into(),
        account.billed.into(),
        account.active_leases.into(),
    ]
}

pub(crate) async fn run(args: AccountsArgs) -> anyhow::Result<ExitCode> {
    let client = args.remote.client()?;
    // Pages no larger than the rows asked for, and never beyond the maximum.
    let page_size = args.limit.map(|limit| u32::try_from(limit).unwrap_or(u32::MAX).min(PageLimit::MAX));
    let mut accounts = client.account_pages(args.prefix.as_deref(), page_size);
    let mut table = Table::new(&COLUMNS);
    let mut rows = 0;
    while args.limit.is_none_or(|limit| rows < limit) {
        let Some(account) = accounts.next().await? else { break };
        table.push(row(&account));
        rows += 1;
    }
    args.remote.print(&table)?;
    Ok(ExitCode::SUCCESS)
}
