//! A gateway worker that embeds the usage writer and the lease helper.
//!
//! Start a server, then run the example against it:
//!
//! ```text
//! TOLLGATE_ADMIN_TOKEN=admin-token-0123456789 TOLLGATE_GATEWAY_TOKEN=gateway-token-0123456789 \
//!     cargo run -p tollgate --bin tollgate -- serve --listen 127.0.0.1:8080 &
//! TOLLGATE_URL=http://127.0.0.1:8080 \
//! TOLLGATE_ADMIN_TOKEN=admin-token-0123456789 TOLLGATE_GATEWAY_TOKEN=gateway-token-0123456789 \
//!     cargo run -p tollgate-client --example gateway
//! ```
//!
//! With `TOLLGATE_ADMIN_TOKEN` set, the example creates a demo account, credits
//! it and issues a credential, and at the end compares the account's `billed`
//! with what the writer delivered. Without it, name an existing account and
//! credential with `TOLLGATE_ACCOUNT` and `TOLLGATE_CREDENTIAL`.
//! `TOLLGATE_EXAMPLE_REQUESTS` sets how many requests to simulate (1000).

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use tollgate_client::{
    ClientConfig, Gateway, GatewayConfig, LossReport, RecordError, Spend, SpendError, TollgateClient, UsageWriter,
    WriterConfig,
};

type AnyError = Box<dyn std::error::Error + Send + Sync>;

fn env(name: &str) -> Result<String, AnyError> {
    std::env::var(name).map_err(|_| format!("set {name} (see the top of examples/gateway.rs)").into())
}

#[tokio::main]
async fn main() -> Result<(), AnyError> {
    let url = std::env::var("TOLLGATE_URL").unwrap_or_else(|_| "http://127.0.0.1:8080".to_owned());
    let requests: u64 = std::env::var("TOLLGATE_EXAMPLE_REQUESTS").ok().and_then(|n| n.parse().ok()).unwrap_or(1_000);
    let client = TollgateClient::new(ClientConfig::new(&url, Some(&env("TOLLGATE_GATEWAY_TOKEN")?)))?;
    let admin = match std::env::var("TOLLGATE_ADMIN_TOKEN") {
        Ok(token) => Some(TollgateClient::new(ClientConfig::new(&url, Some(&token)))?),
        Err(_) => None,
    };
    // Request IDs are unique per account forever, so each run gets its own prefix.
    let run = Timestamp::now().as_millisecond();
    let (account_id, credential_id) = match &admin {
        Some(admin) => {
            let account_id = format!("example-{run}");
            admin.create_account(&account_id).await?;
            admin.credit(&account_id, "example-credit", 1_000_000).await?;
            let credential = admin.issue_credential(&account_id, "example gateway").await?;
            (account_id, credential.credential.credential_id)
        }
        None => (env("TOLLGATE_ACCOUNT")?, env("TOLLGATE_CREDENTIAL")?),
    };

    // Loss reports go through a bounded channel to a task that logs them. The
    // callback runs on the writer's worker, so it only hands the report over.
    let (loss_tx, mut loss_rx) = tokio::sync::mpsc::channel::<LossReport>(1_024);
    let writer = UsageWriter::over_http(client.clone(), WriterConfig::default())
        .on_loss(move |report| {
            if loss_tx.try_send(report.clone()).is_err() {
                // The counters still hold it; only this log line is skipped.
                eprintln!("loss log is behind: {} events lost ({})", report.events.len(), report.reason);
            }
        })
        .spawn()?;
    let loss_log = tokio::spawn(async move {
        while let Some(report) = loss_rx.recv().await {
            eprintln!(
                "LOST {} events / {} units: {} ({}), maybe applied: {}",
                report.events.len(),
                report.units,
                report.reason,
                report.message,
                report.maybe_applied
            );
        }
    });

    let gateway = Arc::new(Gateway::new(client.clone(), writer.clone(), GatewayConfig::default())?);
    // Renew leases more often than the renew margin, so that an idle
    // account's lease never runs out.
    let renewer = {
        let gateway = gateway.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(15));
            loop {
                tick.tick().await;
                for (account_id, error) in gateway.renew_due().await.failed {
                    eprintln!("lease renewal of {account_id} failed: {error}");
                }
            }
        })
    };

    // The request path: check and spend locally, serve only on Ok.
    let (mut served, mut refused) = (0u64, 0u64);
    for n in 0..requests {
        let spend = Spend {
            dimensions: Default::default(),
            account_id: account_id.clone(),
            credential_id: credential_id.clone(),
            request_id: format!("example-{run}-{n}"),
            units: 1 + n % 5,
        };
        match gateway.spend(spend).await {
            Ok(_) => served += 1,
            Err(SpendError::Record(RecordError::QueueFull { .. })) => {
                // Back-pressure: usage cannot be recorded right now, so the
                // request is refused rather than served unmetered.
                refused += 1;
            }
            Err(error) => {
                eprintln!("request {n} refused: {error}");
                refused += 1;
            }
        }
    }
    renewer.abort();

    // Deliver the usage, then hand the leases back.
    let report = gateway.shutdown(Duration::from_secs(30)).await?;
    drop(writer);
    drop(gateway);
    let _ = loss_log.await;

    let stats = &report.writer;
    println!("served {served}, refused {refused}");
    println!(
        "recorded {} events / {} units: accepted {}, duplicate {}, rejected {}, lost {}",
        stats.recorded.events,
        stats.recorded.units,
        stats.accepted.events,
        stats.duplicate.events,
        stats.rejected_total().events,
        stats.lost_total().events
    );
    for (reason, tally) in &stats.rejected {
        println!("  rejected {reason}: {} events / {} units", tally.events, tally.units);
    }
    for (reason, tally) in &stats.lost {
        println!("  lost {reason}: {} events / {} units", tally.events, tally.units);
    }
    println!("released {} leases, {} left for reclaim", report.released.len(), report.unreleased.len());
    if let Some(admin) = &admin {
        let account = admin.account(&account_id).await?;
        println!(
            "account {account_id}: billed {} (the writer delivered {}), available {}, reserved {}",
            account.billed,
            stats.delivered_units(),
            account.available,
            account.reserved
        );
    }
    Ok(())
}
