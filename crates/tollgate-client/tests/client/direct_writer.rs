//! The usage writer over a real `MemoryStore` behind a fault-injecting sink.
//!
//! Time is Tokio's paused clock: backoffs, batch ages and shutdown deadlines
//! advance virtually, so no test waits in real time or depends on a machine's
//! speed. Every test ends by asserting the writer's accounting identity
//! `recorded = accepted + duplicate + rejected + lost` and, where the ledger is
//! involved, that the account billed exactly what the writer delivered.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use jiff::{SignedDuration, Timestamp};
use tokio::time::Instant;
use tollgate_client::{
    ATTEMPTS_LIMIT, BatchGrouping, ConfigError, LossReason, LossReport, RecordError, RetryConfig, Tally, UsageWriter,
    WriterConfig, WriterStats,
};
use tollgate_core::{EventOutcome, GrantPolicy, IngestError, RejectReason, UsageEvent};
use tollgate_store::{MemoryStore, Store, UsageSink};

use crate::support::{Tenant, assert_accounted};

/// What the faulty sink does with one call.
#[derive(Debug, Clone)]
enum Fault {
    /// Hands the batch to the store and returns its answer.
    Pass,
    /// Fails without touching the store.
    Fail(IngestError),
    /// Applies the batch, then loses the answer: the caller sees a retryable
    /// failure although every accepted event is stored.
    ApplyThenLoseAnswer,
    /// Applies the batch, then answers one outcome short.
    ApplyThenGarble,
    /// Never answers.
    Hang,
}

/// A `UsageSink` that wraps a real store and follows a script of faults, one
/// per call, then `otherwise` for every later call.
struct FaultySink {
    store: Arc<MemoryStore>,
    script: Mutex<VecDeque<Fault>>,
    otherwise: Fault,
    /// The request IDs of every batch it was called with, in call order.
    calls: Mutex<Vec<Vec<String>>>,
}

impl FaultySink {
    fn new(store: Arc<MemoryStore>, script: Vec<Fault>, otherwise: Fault) -> Arc<Self> {
        Arc::new(Self { store, script: Mutex::new(script.into()), otherwise, calls: Mutex::new(Vec::new()) })
    }

    /// The size of every batch it was called with, in call order.
    fn calls(&self) -> Vec<usize> {
        self.calls.lock().unwrap().iter().map(Vec::len).collect()
    }

    fn batches(&self) -> Vec<Vec<String>> {
        self.calls.lock().unwrap().clone()
    }
}

#[async_trait]
impl UsageSink for FaultySink {
    async fn ingest(&self, batch: Vec<UsageEvent>, now: Timestamp) -> Result<Vec<EventOutcome>, IngestError> {
        self.calls.lock().unwrap().push(batch.iter().map(|event| event.request_id.clone()).collect());
        let fault = self.script.lock().unwrap().pop_front().unwrap_or_else(|| self.otherwise.clone());
        match fault {
            Fault::Pass => self.store.ingest(batch, now).await,
            Fault::Fail(error) => Err(error),
            Fault::ApplyThenLoseAnswer => {
                self.store.ingest(batch, now).await?;
                Err(IngestError::Unavailable("connection reset after the request was sent".into()))
            }
            Fault::ApplyThenGarble => {
                let mut outcomes = self.store.ingest(batch, now).await?;
                outcomes.pop();
                Ok(outcomes)
            }
            Fault::Hang => std::future::pending().await,
        }
    }
}

/// An account with credit, a credential and an active lease on a fresh store.
struct Ledger {
    store: Arc<MemoryStore>,
    tenant: Tenant,
    lease_id: String,
    fencing_token: u64,
}

impl Ledger {
    async fn new() -> Self {
        let policy = GrantPolicy::new(SignedDuration::from_hours(24), SignedDuration::ZERO, 100).unwrap();
        let store = Arc::new(MemoryStore::new(policy));
        let account_id = "acct-1".to_owned();
        store.create_account(&account_id).await.unwrap();
        store.credit(&account_id, "credit-1", 1_000_000, jiff::Timestamp::UNIX_EPOCH).await.unwrap();
        let credential = store.issue_credential(&account_id, "gateway", Timestamp::now()).await.unwrap();
        let lease = store.acquire(&account_id, 1_000, SignedDuration::from_hours(1), Timestamp::now()).await.unwrap();
        Self {
            store,
            tenant: Tenant { account_id, credential_id: credential.credential.credential_id },
            lease_id: lease.lease.lease_id,
            fencing_token: lease.lease.fencing_token,
        }
    }

    /// A second account with credit and a credential on the same store.
    async fn other_tenant(&self, account_id: &str) -> Tenant {
        self.store.create_account(account_id).await.unwrap();
        self.store.credit(account_id, "credit-1", 1_000_000, jiff::Timestamp::UNIX_EPOCH).await.unwrap();
        let credential = self.store.issue_credential(account_id, "gateway", Timestamp::now()).await.unwrap();
        Tenant { account_id: account_id.to_owned(), credential_id: credential.credential.credential_id }
    }

    /// A usage event against the lease; `units` of it.
    fn leased(&self, request_id: &str, units: u64) -> UsageEvent {
        self.tenant.leased(request_id, units, &self.lease_id, self.fencing_token)
    }

    /// An overage event: no lease, billed after the fact.
    fn overage(&self, request_id: &str, units: u64) -> UsageEvent {
        self.tenant.overage(request_id, units)
    }

    async fn billed(&self) -> u128 {
        u128::from(self.store.account(&self.tenant.account_id).await.unwrap().account.billed)
    }

    /// The ledger's three equations hold and the account billed exactly what
    /// the writer delivered through it.
    async fn assert_billed_exactly(&self, stats: &WriterStats) {
        let check = self.store.check().await.unwrap();
        assert!(check.is_clean(), "{check:?}");
        assert_eq!(self.billed().await, stats.delivered_units(), "{stats:#?}");
    }
}

/// The resolution of Tokio's timers: a deadline is observed at most this late.
const TIMER_TICK: Duration = Duration::from_millis(1);

/// A fresh ledger and a sink that passes every batch to its store.
async fn passing() -> (Ledger, Arc<FaultySink>) {
    let ledger = Ledger::new().await;
    let sink = FaultySink::new(ledger.store.clone(), vec![], Fault::Pass);
    (ledger, sink)
}

fn config(batch_events_max: usize, attempts_max: u32) -> WriterConfig {
    WriterConfig {
        queue_events_max: 1_000,
        batch_events_max,
        batch_age_max: Duration::from_millis(200),
        retry: RetryConfig {
            backoff_initial: Duration::from_millis(10),
            backoff_max: Duration::from_secs(1),
            attempts_max,
        },
        ..WriterConfig::default()
    }
}

/// Spawns a writer whose loss reports land in the returned list.
fn writer_with_losses(sink: Arc<dyn UsageSink>, config: WriterConfig) -> (UsageWriter, Arc<Mutex<Vec<LossReport>>>) {
    let losses = Arc::new(Mutex::new(Vec::new()));
    let sink_losses = losses.clone();
    let writer = UsageWriter::builder(sink, config)
        .on_loss(move |report| sink_losses.lock().unwrap().push(report.clone()))
        .spawn()
        .unwrap();
    (writer, losses)
}

fn tally(events: u64, units: u128) -> Tally {
    Tally { events, units }
}

/// One scripted delivery scenario and what the writer must count for it.
struct Case {
    name: &'static str,
    script: Vec<Fault>,
    otherwise: Fault,
    /// Events recorded, with units 1, 2, 3, …
    events: u64,
    batch_events_max: usize,
    attempts_max: u32,
    accepted: u64,
    duplicate: u64,
    redelivered: u64,
    lost: Vec<(LossReason, u64)>,
    /// Batch sizes of the sink calls, in order.
    calls: Vec<usize>,
    /// Whether the lost events' reports say they may have been applied.
    lost_maybe_applied: bool,
}

fn unavailable() -> IngestError {
    IngestError::Unavailable("database is restarting".into())
}

#[tokio::test(start_paused = true)]
async fn scripted_faults_end_every_event_in_exactly_one_bucket() {
    let cases = vec![
        Case {
            name: "no faults: batches by size",
            script: vec![],
            otherwise: Fault::Pass,
            events: 5,
            batch_events_max: 2,
            attempts_max: 5,
            accepted: 5,
            duplicate: 0,
            redelivered: 0,
            lost: vec![],
            calls: vec![2, 2, 1],
            lost_maybe_applied: false,
        },
        Case {
            name: "unavailable three times, then delivered",
            script: vec![Fault::Fail(unavailable()), Fault::Fail(unavailable()), Fault::Fail(unavailable())],
            otherwise: Fault::Pass,
            events: 3,
            batch_events_max: 10,
            attempts_max: 5,
            accepted: 3,
            duplicate: 0,
            redelivered: 0,
            lost: vec![],
            calls: vec![3, 3, 3, 3],
            lost_maybe_applied: false,
        },
        Case {
            name: "corrupt is retried like unavailable",
            script: vec![Fault::Fail(IngestError::Corrupt("lease row names a missing account".into()))],
            otherwise: Fault::Pass,
            events: 2,
            batch_events_max: 10,
            attempts_max: 2,
            accepted: 2,
            duplicate: 0,
            redelivered: 0,
            lost: vec![],
            calls: vec![2, 2],
            lost_maybe_applied: false,
        },
        Case {
            name: "answer lost after applying: the resend is duplicate, billed once",
            script: vec![Fault::Pass, Fault::ApplyThenLoseAnswer],
            otherwise: Fault::Pass,
            events: 4,
            batch_events_max: 2,
            attempts_max: 5,
            accepted: 2,
            duplicate: 2,
            redelivered: 2,
            lost: vec![],
            calls: vec![2, 2, 2],
            lost_maybe_applied: false,
        },
        Case {
            name: "a broken answer after applying is retried and comes back duplicate",
            script: vec![Fault::ApplyThenGarble],
            otherwise: Fault::Pass,
            events: 3,
            batch_events_max: 3,
            attempts_max: 5,
            accepted: 0,
            duplicate: 3,
            redelivered: 3,
            lost: vec![],
            calls: vec![3, 3],
            lost_maybe_applied: false,
        },
        Case {
            name: "refused: lost once, never retried, later batches still delivered",
            script: vec![Fault::Fail(IngestError::Refused { counter: "billed" })],
            otherwise: Fault::Pass,
            events: 4,
            batch_events_max: 2,
            attempts_max: 5,
            accepted: 2,
            duplicate: 0,
            redelivered: 0,
            lost: vec![(LossReason::BatchRefused, 2)],
            calls: vec![2, 2],
            lost_maybe_applied: false,
        },
        Case {
            name: "batch too large: halved, and the halves delivered",
            script: vec![Fault::Fail(IngestError::BatchTooLarge { events: 2, max: 1 })],
            otherwise: Fault::Pass,
            events: 2,
            batch_events_max: 2,
            attempts_max: 5,
            accepted: 2,
            duplicate: 0,
            redelivered: 0,
            lost: vec![],
            calls: vec![2, 1, 1],
            lost_maybe_applied: false,
        },
        Case {
            name: "one event too large: lost once, never retried, its neighbours delivered",
            script: vec![
                Fault::Fail(IngestError::BatchTooLarge { events: 3, max: 1 }),
                Fault::Fail(IngestError::BatchTooLarge { events: 1, max: 1 }),
            ],
            otherwise: Fault::Pass,
            events: 3,
            batch_events_max: 3,
            attempts_max: 5,
            accepted: 2,
            duplicate: 0,
            redelivered: 0,
            lost: vec![(LossReason::BatchTooLarge, 1)],
            calls: vec![3, 1, 2],
            lost_maybe_applied: false,
        },
        Case {
            name: "always unavailable: each batch lost after exactly attempts_max calls",
            script: vec![],
            otherwise: Fault::Fail(unavailable()),
            events: 3,
            batch_events_max: 2,
            attempts_max: 3,
            accepted: 0,
            duplicate: 0,
            redelivered: 0,
            lost: vec![(LossReason::RetriesExhausted, 3)],
            calls: vec![2, 2, 2, 1, 1, 1],
            lost_maybe_applied: true,
        },
    ];
    for case in cases {
        run_case(case).await;
    }
}

/// The one helper every scripted case runs through.
async fn run_case(case: Case) {
    let name = case.name;
    let ledger = Ledger::new().await;
    let sink = FaultySink::new(ledger.store.clone(), case.script, case.otherwise);
    let (writer, losses) = writer_with_losses(sink.clone(), config(case.batch_events_max, case.attempts_max));
    for n in 1..=case.events {
        writer.record(ledger.leased(&format!("{name}/{n}"), n)).unwrap();
    }
    let stats = writer.flush().await.unwrap();

    assert_accounted(&stats);
    assert_eq!(stats.recorded, tally(case.events, u128::from(case.events * (case.events + 1) / 2)), "{name}");
    assert_eq!(stats.accepted.events, case.accepted, "{name}");
    assert_eq!(stats.duplicate.events, case.duplicate, "{name}");
    assert_eq!(stats.redelivered.events, case.redelivered, "{name}");
    assert_eq!(stats.rejected_total(), Tally::default(), "{name}");
    let lost: Vec<(LossReason, u64)> = stats.lost.iter().map(|(reason, tally)| (*reason, tally.events)).collect();
    assert_eq!(lost, case.lost, "{name}");
    assert_eq!(sink.calls(), case.calls, "{name}");
    assert_eq!(stats.attempts, case.calls.len() as u64, "{name}");

    // Every loss was reported exactly once, and the reports add up to the counters.
    let losses = losses.lock().unwrap().clone();
    let reported: u64 = losses.iter().map(|report| report.events.len() as u64).sum();
    assert_eq!(reported, stats.lost_total().events, "{name}");
    assert_eq!(losses.iter().map(|report| report.units).sum::<u128>(), stats.lost_total().units, "{name}");
    assert!(losses.iter().all(|report| report.maybe_applied == case.lost_maybe_applied), "{name}: {losses:#?}");

    // Nothing lost here was applied, so the ledger billed exactly what was delivered.
    ledger.assert_billed_exactly(&stats).await;
    let final_stats = writer.shutdown(Duration::from_secs(1)).await.unwrap();
    assert_eq!(final_stats, stats, "{name}");
}

#[tokio::test(start_paused = true)]
async fn a_lost_answer_is_not_double_billed() {
    let ledger = Ledger::new().await;
    let sink = FaultySink::new(ledger.store.clone(), vec![Fault::ApplyThenLoseAnswer], Fault::Pass);
    let (writer, losses) = writer_with_losses(sink.clone(), config(10, 5));
    writer.record(ledger.leased("r1", 7)).unwrap();
    writer.record(ledger.overage("r2", 11)).unwrap();
    let stats = writer.flush().await.unwrap();

    assert_accounted(&stats);
    assert_eq!(sink.calls(), vec![2, 2]);
    assert_eq!(stats.accepted, Tally::default());
    assert_eq!(stats.duplicate, tally(2, 18));
    assert_eq!(stats.redelivered, tally(2, 18));
    assert!(losses.lock().unwrap().is_empty());
    // Billed once: 18 units, not 36.
    assert_eq!(ledger.billed().await, 18);
    ledger.assert_billed_exactly(&stats).await;
    let lease = ledger.store.lease(&ledger.tenant.account_id, &ledger.lease_id).await.unwrap();
    assert_eq!(lease.used, 7);
}

#[tokio::test(start_paused = true)]
async fn an_overflowing_batch_is_refused_by_the_store_and_lost_once() {
    let (ledger, sink) = passing().await;
    let (writer, losses) = writer_with_losses(sink.clone(), config(2, ATTEMPTS_LIMIT));
    // Each event fits u64 on its own; together they pass u64::MAX, which the
    // memory store refuses as a whole.
    writer.record(ledger.overage("big-1", u64::MAX)).unwrap();
    writer.record(ledger.overage("big-2", 1)).unwrap();
    writer.record(ledger.leased("small", 5)).unwrap();
    let stats = writer.flush().await.unwrap();

    assert_accounted(&stats);
    // The refused batch was sent once, never again, however many attempts were allowed.
    assert_eq!(sink.calls(), vec![2, 1]);
    let overflow = u128::from(u64::MAX) + 1;
    assert_eq!(stats.lost_for(LossReason::BatchRefused), tally(2, overflow));
    assert_eq!(stats.accepted, tally(1, 5));
    let losses = losses.lock().unwrap().clone();
    assert_eq!(losses.len(), 1, "{losses:#?}");
    let report = &losses[0];
    assert_eq!(report.reason, LossReason::BatchRefused);
    assert_eq!(report.error_code, Some("batch_refused"));
    assert_eq!(report.units, overflow);
    assert_eq!(report.attempts, 1);
    assert!(!report.maybe_applied);
    let ids: Vec<&str> = report.events.iter().map(|event| event.request_id.as_str()).collect();
    assert_eq!(ids, ["big-1", "big-2"]);
    ledger.assert_billed_exactly(&stats).await;
    assert_eq!(ledger.billed().await, 5);

    // Later flushes and the shutdown neither resend nor report it again.
    writer.flush().await.unwrap();
    let stats = writer.shutdown(Duration::from_secs(5)).await.unwrap();
    assert_eq!(sink.calls(), vec![2, 1]);
    assert_eq!(losses.len(), 1);
    assert_accounted(&stats);
}

#[tokio::test(start_paused = true)]
async fn rejections_are_counted_by_reason_and_do_not_block_their_batch() {
    let (ledger, sink) = passing().await;
    let (writer, losses) = writer_with_losses(sink, config(100, 3));
    let stale = UsageEvent { fencing_token: Some(ledger.fencing_token + 1), ..ledger.leased("stale", 3) };
    let unknown = UsageEvent { credential_id: "nobody".into(), ..ledger.overage("stranger", 4) };
    let half_funded = UsageEvent { fencing_token: None, ..ledger.leased("half", 5) };
    for event in [ledger.leased("ok", 1), stale, unknown, half_funded, ledger.overage("ok", 6)] {
        writer.record(event).unwrap();
    }
    let stats = writer.flush().await.unwrap();

    assert_accounted(&stats);
    assert_eq!(stats.accepted, tally(1, 1));
    assert_eq!(stats.duplicate, tally(1, 6));
    assert_eq!(stats.redelivered, Tally::default(), "a first-attempt duplicate is a real replay");
    assert_eq!(stats.rejected_for(RejectReason::FenceMismatch), tally(1, 3));
    assert_eq!(stats.rejected_for(RejectReason::UnknownCredential), tally(1, 4));
    assert_eq!(stats.rejected_for(RejectReason::FundingIncomplete), tally(1, 5));
    assert_eq!(stats.rejected_total(), tally(3, 12));
    assert!(losses.lock().unwrap().is_empty());
    assert_eq!(ledger.billed().await, 1);
}

#[tokio::test(start_paused = true)]
async fn batches_leave_by_size_at_once_and_by_age_after_batch_age_max() {
    let (ledger, sink) = passing().await;
    let config = config(10, 3);
    let writer = UsageWriter::spawn(sink.clone(), config).unwrap();
    let started = Instant::now();
    for n in 0..25 {
        writer.record(ledger.leased(&format!("r{n}"), 1)).unwrap();
    }
    // Just short of the batch age: only the two full batches have left.
    tokio::time::sleep_until(started + config.batch_age_max - Duration::from_millis(1)).await;
    assert_eq!(sink.calls(), vec![10, 10]);
    assert_eq!(writer.stats().queued, tally(5, 5));
    // At the batch age the remainder leaves on its own, with no flush.
    tokio::time::sleep_until(started + config.batch_age_max).await;
    tokio::task::yield_now().await;
    assert_eq!(sink.calls(), vec![10, 10, 5]);
    let stats = writer.stats();
    assert_accounted(&stats);
    assert_eq!(stats.accepted, tally(25, 25));
    assert_eq!(stats.batches, 3);
}

#[tokio::test(start_paused = true)]
async fn batches_grouped_by_account_hold_one_account_each_and_keep_its_order() {
    let ledger = Ledger::new().await;
    let other = ledger.other_tenant("acct-2").await;
    let sink = FaultySink::new(ledger.store.clone(), vec![], Fault::Pass);
    let config = WriterConfig { batch_grouping: BatchGrouping::ByAccount, ..config(2, 3) };
    let writer = UsageWriter::spawn(sink.clone(), config).unwrap();
    // Interleaved accounts; `batch_events_max` is 2, so the first full batch
    // leaves as soon as two events are queued.
    writer.record(ledger.overage("a0", 1)).unwrap();
    writer.record(other.overage("b0", 10)).unwrap();
    writer.record(ledger.overage("a1", 1)).unwrap();
    writer.record(ledger.overage("a2", 1)).unwrap();
    writer.record(other.overage("b1", 10)).unwrap();
    let stats = writer.flush().await.unwrap();
    let batches = sink.batches();
    for batch in &batches {
        let accounts: std::collections::BTreeSet<char> = batch.iter().filter_map(|id| id.chars().next()).collect();
        assert_eq!(accounts.len(), 1, "a batch spans accounts: {batches:?}");
    }
    let order = |prefix: char| -> Vec<String> {
        batches.iter().flatten().filter(|id| id.starts_with(prefix)).cloned().collect()
    };
    assert_eq!(order('a'), ["a0", "a1", "a2"], "{batches:?}");
    assert_eq!(order('b'), ["b0", "b1"], "{batches:?}");
    assert_eq!(batches.first().map(Vec::as_slice), Some(["a0".to_owned(), "a1".to_owned()].as_slice()));
    assert_accounted(&stats);
    assert_eq!(stats.accepted, tally(5, 23));
    assert_eq!(ledger.billed().await, 3);
    assert_eq!(u128::from(ledger.store.account("acct-2").await.unwrap().account.billed), 20);
}

#[tokio::test(start_paused = true)]
async fn a_single_event_waits_for_its_age_unless_flushed() {
    let (ledger, sink) = passing().await;
    let config = config(10, 3);
    let writer = UsageWriter::spawn(sink.clone(), config).unwrap();
    writer.record(ledger.leased("early", 2)).unwrap();
    tokio::time::sleep(config.batch_age_max / 2).await;
    assert_eq!(sink.calls(), Vec::<usize>::new());
    let flushed_at = Instant::now();
    let stats = writer.flush().await.unwrap();
    // The flush sent the partial batch without waiting for its age.
    assert_eq!(Instant::now(), flushed_at);
    assert_eq!(sink.calls(), vec![1]);
    assert_accounted(&stats);
    assert_eq!(stats.accepted, tally(1, 2));
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_pushes_back_and_hands_the_event_back() {
    let (ledger, sink) = passing().await;
    let config = WriterConfig { queue_events_max: 3, batch_events_max: 3, ..config(3, 3) };
    let writer = UsageWriter::spawn(sink, config).unwrap();
    // The worker has not run yet (nothing yielded), so the queue fills.
    for n in 0..3 {
        writer.record(ledger.leased(&format!("r{n}"), 1)).unwrap();
    }
    let extra = ledger.leased("r3", 1);
    let refused = writer.record(extra.clone()).unwrap_err();
    assert_eq!(refused.code(), "queue_full");
    assert_eq!(refused, RecordError::QueueFull { event: Box::new(extra), queue_events_max: 3 });
    let stats = writer.stats();
    assert_eq!(stats.turned_away_full, 1);
    assert_eq!(stats.recorded, tally(3, 3), "a turned-away event is not recorded");

    // Once the batch left, the caller can record the event it got back.
    let stats = writer.flush().await.unwrap();
    assert_accounted(&stats);
    writer.record(refused.into_event()).unwrap();
    let stats = writer.flush().await.unwrap();
    assert_accounted(&stats);
    assert_eq!(stats.accepted, tally(4, 4));
}

#[tokio::test(start_paused = true)]
async fn shutdown_with_a_sink_that_always_fails_reports_everything_lost_by_the_deadline() {
    let ledger = Ledger::new().await;
    let sink = FaultySink::new(ledger.store.clone(), vec![], Fault::Fail(unavailable()));
    // Attempts are effectively unlimited, so only the deadline can end this.
    let (writer, losses) = writer_with_losses(sink.clone(), config(4, ATTEMPTS_LIMIT));
    for n in 0..10u64 {
        writer.record(ledger.leased(&format!("r{n}"), n)).unwrap();
    }
    let timeout = Duration::from_secs(30);
    let started = Instant::now();
    let stats = writer.shutdown(timeout).await.unwrap();

    assert!(started.elapsed() <= timeout + TIMER_TICK, "{:?} > {timeout:?}", started.elapsed());
    assert_accounted(&stats);
    assert_eq!(stats.lost_total(), tally(10, 45));
    assert_eq!(stats.lost_for(LossReason::ShutdownDeadline), tally(10, 45));
    assert_eq!(stats.accepted.events + stats.duplicate.events + stats.rejected_total().events, 0);
    let losses = losses.lock().unwrap().clone();
    assert_eq!(losses.iter().map(|report| report.events.len()).collect::<Vec<_>>(), vec![4, 4, 2]);
    // The batch that was being retried says it may have been applied; the ones
    // never sent say they were not.
    assert_eq!(losses.iter().map(|report| report.maybe_applied).collect::<Vec<_>>(), vec![true, false, false]);
    assert_eq!(losses[0].error_code, Some("storage_unavailable"));
    assert!(sink.calls().iter().all(|size| *size == 4), "only the first batch was ever sent");
    assert_eq!(ledger.billed().await, 0);

    let refused = writer.record(ledger.leased("late", 1)).unwrap_err();
    assert_eq!(refused.code(), "writer_closed");
    assert_eq!(writer.stats().turned_away_closed, 1);
    assert!(writer.is_closed());
}

#[tokio::test(start_paused = true)]
async fn shutdown_cuts_off_a_call_that_never_answers() {
    let ledger = Ledger::new().await;
    let sink = FaultySink::new(ledger.store.clone(), vec![], Fault::Hang);
    let (writer, losses) = writer_with_losses(sink.clone(), config(10, 3));
    writer.record(ledger.leased("r1", 3)).unwrap();
    writer.record(ledger.leased("r2", 4)).unwrap();
    tokio::task::yield_now().await;
    let timeout = Duration::from_secs(2);
    let started = Instant::now();
    let flushing = writer.clone();
    let flush = tokio::spawn(async move { flushing.flush().await });
    let stats = writer.shutdown(timeout).await.unwrap();

    // The hanging call ends only at the deadline, observed within one timer tick.
    assert!(started.elapsed() >= timeout && started.elapsed() <= timeout + TIMER_TICK, "{:?}", started.elapsed());
    assert_accounted(&stats);
    assert_eq!(stats.lost_for(LossReason::ShutdownDeadline), tally(2, 7));
    let losses = losses.lock().unwrap().clone();
    assert_eq!(losses.len(), 1);
    assert!(losses[0].maybe_applied, "the abandoned call might have been applied");
    assert_eq!(losses[0].error_code, Some("shutdown_deadline"));
    // A flush waiting on the same events returns once they are settled as lost.
    assert_eq!(flush.await.unwrap().unwrap().lost_total(), tally(2, 7));
}

#[tokio::test(start_paused = true)]
async fn shutdown_delivers_what_it_can_before_the_deadline() {
    let ledger = Ledger::new().await;
    // Two failures, then the store answers: well inside the deadline.
    let script = vec![Fault::Fail(unavailable()), Fault::Fail(unavailable())];
    let sink = FaultySink::new(ledger.store.clone(), script, Fault::Pass);
    let (writer, losses) = writer_with_losses(sink.clone(), config(3, 10));
    for n in 0..7u64 {
        writer.record(ledger.overage(&format!("r{n}"), 2)).unwrap();
    }
    let stats = writer.shutdown(Duration::from_secs(60)).await.unwrap();
    assert_accounted(&stats);
    assert_eq!(stats.accepted, tally(7, 14));
    assert!(losses.lock().unwrap().is_empty());
    assert_eq!(sink.calls(), vec![3, 3, 3, 3, 1]);
    ledger.assert_billed_exactly(&stats).await;
}

#[tokio::test(start_paused = true)]
async fn dropping_every_handle_still_delivers_what_was_queued() {
    let ledger = Ledger::new().await;
    let sink = FaultySink::new(ledger.store.clone(), vec![Fault::Fail(unavailable())], Fault::Pass);
    let writer = UsageWriter::spawn(sink.clone(), config(10, 5)).unwrap();
    writer.record(ledger.leased("r1", 9)).unwrap();
    let clone = writer.clone();
    drop(writer);
    assert!(!clone.is_closed(), "a remaining clone keeps the writer open");
    drop(clone);
    // Virtual time runs until the worker has retried and delivered.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(sink.calls(), vec![1, 1]);
    assert_eq!(ledger.billed().await, 9);
}

#[tokio::test(start_paused = true)]
async fn a_panicking_loss_subscriber_does_not_stop_the_writer() {
    let ledger = Ledger::new().await;
    let sink = FaultySink::new(
        ledger.store.clone(),
        vec![Fault::Fail(IngestError::Refused { counter: "billed" })],
        Fault::Pass,
    );
    let writer = UsageWriter::builder(sink, config(1, 3)).on_loss(|_| panic!("subscriber bug")).spawn().unwrap();
    writer.record(ledger.leased("refused", 1)).unwrap();
    writer.record(ledger.leased("fine", 2)).unwrap();
    let stats = writer.flush().await.unwrap();
    assert_accounted(&stats);
    assert_eq!(stats.lost_for(LossReason::BatchRefused), tally(1, 1));
    assert_eq!(stats.accepted, tally(1, 2));
}

#[tokio::test(start_paused = true)]
async fn a_panicking_clock_fails_attempts_without_stopping_the_writer() {
    let (ledger, sink) = passing().await;
    let losses_tx: Arc<Mutex<Vec<LossReport>>> = Arc::new(Mutex::new(Vec::new()));
    let collected = losses_tx.clone();
    let writer = UsageWriter::builder(sink.clone(), config(10, 3))
        .clock(|| panic!("clock bug"))
        .on_loss(move |report| collected.lock().unwrap().push(report.clone()))
        .spawn()
        .unwrap();
    writer.record(ledger.leased("r1", 2)).unwrap();
    let stats = writer.flush().await.expect("the worker is still running");
    assert_accounted(&stats);
    assert_eq!((stats.lost_for(LossReason::RetriesExhausted), stats.attempts), (tally(1, 2), 3));
    assert_eq!(losses_tx.lock().unwrap()[0].error_code, Some("storage_unavailable"));
    // Still recording and still answering.
    writer.record(ledger.leased("r2", 1)).unwrap();
    let stats = writer.shutdown(Duration::from_secs(60)).await.unwrap();
    assert_eq!(stats.lost_total(), tally(2, 3));
    assert!(sink.calls().is_empty(), "no call without a clock reading");
}

#[tokio::test(start_paused = true)]
async fn the_injected_clock_is_the_now_a_direct_store_judges_leases_by() {
    let (ledger, sink) = passing().await;
    // Two hours on, the one-hour lease is past its boundary (grace zero).
    let later = Timestamp::now() + SignedDuration::from_hours(2);
    let writer = UsageWriter::builder(sink, config(10, 3)).clock(move || later).spawn().unwrap();
    writer.record(ledger.leased("late", 4)).unwrap();
    let stats = writer.flush().await.unwrap();
    assert_accounted(&stats);
    assert_eq!(stats.rejected_for(RejectReason::LeaseExpired), tally(1, 4));
}

#[tokio::test(start_paused = true)]
async fn an_invalid_configuration_is_a_typed_error() {
    let store =
        Arc::new(MemoryStore::new(GrantPolicy::new(SignedDuration::from_hours(1), SignedDuration::ZERO, 1).unwrap()));
    let bad = WriterConfig { batch_events_max: 0, ..WriterConfig::default() };
    let error = UsageWriter::spawn(store, bad).err().unwrap();
    assert_eq!(error, ConfigError::BatchEventsMaxOutOfRange { value: 0, max: 10_000 });
}
