//! The subcommands that talk to a running server (`tollgate accounts`, …):
//! their shared options and how they print, in one place.
//!
//! A remote subcommand declares its own arguments, flattens [`RemoteArgs`]
//! into them, and builds a [`Table`] with the typed client that
//! [`RemoteArgs::client`] makes; [`RemoteArgs::print`] writes the table in
//! the chosen format. A server's refusal comes back as the client's error,
//! which `main` prints with its code (`tollgate: error: invalid_limit (HTTP
//! 400): …`) before exiting non-zero.

use std::io::Write as _;

use anyhow::Context;
use clap::Args;
use tollgate_client::{ClientConfig, TollgateClient};

use crate::table::{Format, Table};

/// Where the server is, how to authenticate, and how to print.
#[derive(Args)]
pub(crate) struct RemoteArgs {
    /// The server's base URL.
    #[arg(long, env = "TOLLGATE_URL", default_value = "http://127.0.0.1:8080", value_name = "URL")]
    url: String,

    /// The admin operator token, sent as `Authorization: Bearer`.
    #[arg(long, env = "TOLLGATE_ADMIN_TOKEN", hide_env_values = true, value_name = "TOKEN")]
    token: Option<String>,

    /// Print one JSON document: an array with one object per row.
    #[arg(long, conflicts_with = "csv")]
    json: bool,

    /// Print CSV with a header line.
    #[arg(long)]
    csv: bool,
}

impl RemoteArgs {
    /// The typed client for the server, with the token if one is given.
    pub(crate) fn client(&self) -> anyhow::Result<TollgateClient> {
        TollgateClient::new(ClientConfig::new(self.url.clone(), self.token.as_deref()))
            .with_context(|| format!("cannot make a client for {}", self.url))
    }

    fn format(&self) -> Format {
        match (self.json, self.csv) {
            (true, _) => Format::Json,
            (_, true) => Format::Csv,
            _ => Format::Text,
        }
    }

    /// Writes `table` to stdout in the chosen format.
    pub(crate) fn print(&self, table: &Table) -> anyhow::Result<()> {
        let mut stdout = std::io::stdout().lock();
        stdout.write_all(table.render(self.format()).as_bytes()).context("cannot write to stdout")?;
        stdout.flush().context("cannot write to stdout")
    }
}
