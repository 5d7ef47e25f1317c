//! Starts the real `tollgate` binary on port 0 and hands out clients for it.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use jiff::{SignedDuration, Timestamp};
use tollgate_client::{
    ClientConfig, LossReport, RetryConfig, TollgateClient, UsageWriter, WriterBuilder, WriterConfig, WriterStats,
};
use tollgate_core::{EventOutcome, IngestError, Outcome, RejectReason, UsageEvent};
use tollgate_store::UsageSink;
use tollgate_testkit::{ServeProcess, Stderr, clean_command, tollgate_binary};

pub(crate) const ADMIN_TOKEN: &str = "test-admin-token-0123456789";
pub(crate) const GATEWAY_TOKEN: &str = "test-gateway-token-0123456789";

/// A running `tollgate serve`. Killed when dropped.
pub(crate) struct Server {
    process: ServeProcess,
    pub address: SocketAddr,
}

/// Where a server keeps its state.
#[derive(Clone)]
pub(crate) enum Storage {
    Memory,
    Postgres { url: String },
}

impl Server {
    /// Starts a server on an OS-chosen port.
    pub(crate) async fn start(storage: &Storage) -> Server {
        Server::start_on(storage, "127.0.0.1:0").await
    }

    /// Starts a server on `listen`, e.g. the address of a server that was
    /// killed, so that clients pointed at it reach the new one.
    pub(crate) async fn start_on(storage: &Storage, listen: &str) -> Server {
        Server::start_with(storage, listen, "PT1H").await
    }

    /// As `start_on`, with the server's `--max-ttl`.
    pub(crate) async fn start_with(storage: &Storage, listen: &str, max_ttl: &str) -> Server {
        let mut command = clean_command(tollgate_binary());
        command
            .args(["serve", "--listen", listen, "--reclaim-grace", "PT30S", "--max-ttl", max_ttl])
            .env("TOLLGATE_ADMIN_TOKEN", ADMIN_TOKEN)
            .env("TOLLGATE_GATEWAY_TOKEN", GATEWAY_TOKEN);
        if let Storage::Postgres { url } = storage {
            command.args(["--database-url", url]);
        }
        match ServeProcess::start(command, Stderr::Inherit).await {
            Ok(process) => Server { address: process.address(), process },
            Err(failure) => panic!("tollgate serve exited with {} before listening", failure.status),
        }
    }

    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    pub(crate) fn admin(&self) -> TollgateClient {
        client(&self.url(), Some(ADMIN_TOKEN))
    }

    pub(crate) fn gateway(&self) -> TollgateClient {
        client(&self.url(), Some(GATEWAY_TOKEN))
    }

    /// SIGKILL: no graceful shutdown, requests in flight are cut off.
    pub(crate) async fn kill(&mut self) {
        self.process.kill().await;
    }
}

pub(crate) fn client(url: &str, token: Option<&str>) -> TollgateClient {
    TollgateClient::new(ClientConfig::new(url, token)).expect("a valid client configuration")
}

/// Writer settings for tests against a real server: small batches so that a
/// run has many of them, quick retries, and enough attempts to ride out a
/// server restart.
pub(crate) fn writer_config(batch_events_max: usize) -> WriterConfig {
    WriterConfig {
        queue_events_max: 10_000,
        batch_events_max,
        batch_age_max: Duration::from_millis(50),
        retry: RetryConfig {
            backoff_initial: Duration::from_millis(20),
            backoff_max: Duration::from_millis(500),
            attempts_max: 400,
        },
        ..WriterConfig::default()
    }
}

/// A writer whose loss reports are collected for the test to inspect.
pub(crate) fn writer(sink: Arc<dyn UsageSink>, config: WriterConfig) -> (UsageWriter, Arc<Mutex<Vec<LossReport>>>) {
    collecting_losses(UsageWriter::builder(sink, config))
}

/// As `writer`, delivering over HTTP with `client` (`UsageWriter::over_http`).
pub(crate) fn http_writer(client: TollgateClient, config: WriterConfig) -> (UsageWriter, Arc<Mutex<Vec<LossReport>>>) {
    collecting_losses(UsageWriter::over_http(client, config))
}

fn collecting_losses(builder: WriterBuilder) -> (UsageWriter, Arc<Mutex<Vec<LossReport>>>) {
    let losses = Arc::new(Mutex::new(Vec::new()));
    let collected = losses.clone();
    let writer = builder
        .on_loss(move |report| collected.lock().unwrap().push(report.clone()))
        .spawn()
        .expect("a valid writer configuration");
    (writer, losses)
}

/// An account with prepaid units and a credential, created over HTTP.
pub(crate) struct Tenant {
    pub account_id: String,
    pub credential_id: String,
}

impl Tenant {
    pub(crate) async fn create(admin: &TollgateClient, account_id: &str, units: u64) -> Tenant {
        admin.create_account(account_id).await.expect("account created");
        admin.credit(account_id, "initial", units).await.expect("account credited");
        let credential = admin.issue_credential(account_id, "gateway").await.expect("credential issued");
        Tenant { account_id: account_id.to_owned(), credential_id: credential.credential.credential_id }
    }

    pub(crate) fn overage(&self, request_id: &str, units: u64) -> UsageEvent {
        UsageEvent {
            request_id: request_id.to_owned(),
            account_id: self.account_id.clone(),
            credential_id: self.credential_id.clone(),
            units,
            occurred_at: Timestamp::now(),
            lease_id: None,
            fencing_token: None,
            dimensions: Default::default(),
        }
    }

    pub(crate) fn leased(&self, request_id: &str, units: u64, lease_id: &str, fencing_token: u64) -> UsageEvent {
        UsageEvent {
            lease_id: Some(lease_id.to_owned()),
            fencing_token: Some(fencing_token),
            dimensions: Default::default(),
            ..self.overage(request_id, units)
        }
    }
}

/// The resolution of Tokio's timers: a deadline is observed at most this late.
pub(crate) const TIMER_TICK: Duration = Duration::from_millis(1);

pub(crate) const LEASE_TTL: SignedDuration = SignedDuration::from_secs(600);

/// `recorded = accepted + duplicate + rejected + lost`, nothing pending.
pub(crate) fn assert_accounted(stats: &WriterStats) {
    assert!(stats.is_drained(), "{stats:#?}");
    assert!(stats.is_conserved(), "{stats:#?}");
    let mut settled = stats.accepted;
    for part in [stats.duplicate, stats.rejected_total(), stats.lost_total()] {
        settled.events += part.events;
        settled.units += part.units;
    }
    assert_eq!(stats.recorded, settled, "{stats:#?}");
}

/// The server's ledger is consistent and the account billed exactly what the
/// writer delivered.
pub(crate) async fn assert_ledger(admin: &TollgateClient, account_id: &str, stats: &WriterStats) {
    let check = admin.check().await.expect("check runs");
    assert!(check.ok, "{check:#?}");
    let account = admin.account(account_id).await.expect("account readable");
    assert_eq!(u128::from(account.billed), stats.delivered_units(), "{account:#?}\n{stats:#?}");
}

/// Counts calls and can kill the server right after one call has been
/// applied, so that its answer is lost exactly as when a server dies between
/// commit and response.
pub(crate) struct KillingSink {
    inner: TollgateClient,
    /// The call (counting from 1) after which the server dies.
    kill_after_call: Option<u32>,
    victim: tokio::sync::Mutex<Option<Server>>,
    calls: Mutex<u32>,
    /// Signalled once the server is dead.
    pub killed: tokio::sync::Notify,
}

impl KillingSink {
    pub(crate) fn new(inner: TollgateClient, kill_after_call: Option<u32>, victim: Option<Server>) -> Arc<Self> {
        Arc::new(Self {
            inner,
            kill_after_call,
            victim: tokio::sync::Mutex::new(victim),
            calls: Mutex::new(0),
            killed: tokio::sync::Notify::new(),
        })
    }

    pub(crate) fn calls(&self) -> u32 {
        *self.calls.lock().unwrap()
    }
}

#[async_trait]
impl UsageSink for KillingSink {
    async fn ingest(&self, batch: Vec<UsageEvent>, now: Timestamp) -> Result<Vec<EventOutcome>, IngestError> {
        let call = {
            let mut calls = self.calls.lock().unwrap();
            *calls += 1;
            *calls
        };
        let answer = ingest_over_http(&self.inner, batch, now).await;
        if Some(call) == self.kill_after_call {
            assert!(answer.is_ok(), "the batch before the kill was applied: {answer:?}");
            if let Some(mut server) = self.victim.lock().await.take() {
                server.kill().await;
            }
            self.killed.notify_one();
            return Err(IngestError::Unavailable("connection reset: the server died before answering".into()));
        }
        answer
    }
}

/// `POST /v1/usage` read as the store contract's answer, for the tests that
/// put their own `UsageSink` between a writer and a server. The client itself
/// is not a `UsageSink` (a writer over HTTP is `UsageWriter::over_http`); these
/// tests' servers only answer reasons this build knows.
async fn ingest_over_http(
    client: &TollgateClient,
    batch: Vec<UsageEvent>,
    _now: Timestamp,
) -> Result<Vec<EventOutcome>, IngestError> {
    let events = batch.len();
    let response = client.send_usage(&batch).await.map_err(|error| match error.status() {
        Some(422) => IngestError::Refused {
            counter: ["billed", "used", "overage"]
                .into_iter()
                .find(|counter| error.to_string().contains(counter))
                .unwrap_or("unknown"),
        },
        Some(413) => IngestError::BatchTooLarge { events, max: tollgate_core::BATCH_EVENTS_MAX },
        Some(500) => IngestError::Corrupt(error.to_string()),
        _ => IngestError::Unavailable(error.to_string()),
    })?;
    let outcome = |outcome: &str, reason: Option<&str>| match (outcome, reason) {
        ("accepted", _) => Outcome::Accepted,
        ("duplicate", _) => Outcome::Duplicate,
        (_, reason) => Outcome::Rejected(
            reason.and_then(RejectReason::parse).unwrap_or_else(|| panic!("an unknown outcome {outcome} {reason:?}")),
        ),
    };
    Ok(response
        .outcomes
        .into_iter()
        .map(|body| EventOutcome {
            outcome: outcome(&body.outcome, body.reason.as_deref()),
            request_id: body.request_id,
        })
        .collect())
}
