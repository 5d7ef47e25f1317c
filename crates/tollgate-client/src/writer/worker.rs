//! The writer's worker task: takes batches from the queue, delivers them to
//! the sink with retries, and settles every event as accepted, duplicate,
//! rejected or lost.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use rand::Rng;
use tokio::sync::watch;
use tokio::time::Instant;
use tollgate_core::{EventOutcome, IngestError, Outcome, UsageEvent};
use tollgate_store::UsageSink;

use super::{Clock, LossCallback, Shared};
use crate::http::TollgateClient;
use crate::stats::{LossReason, LossReport, Tally};

/// Where batches go.
#[derive(Clone)]
pub(super) enum Destination {
    Sink(Arc<dyn UsageSink>),
    Http(TollgateClient),
}

pub(super) struct Worker {
    pub(super) shared: Arc<Shared>,
    pub(super) sink: Destination,
    pub(super) on_loss: Option<LossCallback>,
    pub(super) clock: Clock,
    pub(super) settled: watch::Sender<u64>,
    pub(super) done: watch::Sender<bool>,
}

/// How one attempt ended.
enum Attempt {
    Answered(Result<Vec<Settled>, Failure>),
    /// The shutdown deadline passed while the sink call was in flight.
    CutOff,
}

impl Worker {
    pub(super) async fn run(self) {
        while let Some(batch) = self.next_batch().await {
            self.deliver(batch).await;
            let settled = self.shared.lock().advance_settled();
            self.settled.send_replace(settled);
        }
        self.done.send_replace(true);
    }

    /// Waits until a batch is due and takes it; `None` once closed and empty.
    async fn next_batch(&self) -> Option<Vec<UsageEvent>> {
        let config = &self.shared.config;
        loop {
            let due = {
                let mut state = self.shared.lock();
                match state.queue.front() {
                    None if state.closing => return None,
                    None => None,
                    Some(front) => {
                        let due = front.recorded_at + config.batch_age_max;
                        let ready = state.closing
                            || state.queue.len() >= config.batch_events_max
                            || state.flush_upto > state.settled_through
                            || due <= Instant::now();
                        if ready {
                            return Some(state.take_batch(config.batch_events_max, config.batch_grouping));
                        }
                        Some(due)
                    }
                }
            };
            match due {
                Some(due) => {
                    tokio::select! {
                        () = self.shared.wake.notified() => {}
                        () = tokio::time::sleep_until(due) => {}
                    }
                }
                None => self.shared.wake.notified().await,
            }
        }
    }

    /// Delivers `batch`, halving it while the sink answers that it is too
    /// large (HTTP 413): one event too many bytes, or a server with a smaller
    /// body limit, must not lose the other events with it. The halves go in
    /// order, so batches still settle in recording order; only a single event
    /// that is too large is lost, as `batch_too_large`.
    fn deliver(&self, batch: Vec<UsageEvent>) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            if let Err(TooLarge(mut batch)) = self.deliver_whole(batch).await {
                let second = batch.split_off(batch.len() / 2);
                self.deliver(batch).await;
                self.deliver(second).await;
            }
        })
    }

    /// Sends one batch until it is answered, refused, out of attempts or out of
    /// time, and settles every event of it; or hands back a batch of more than
    /// one event that the sink said is too large.
    async fn deliver_whole(&self, batch: Vec<UsageEvent>) -> Result<(), TooLarge> {
        let retry = self.shared.config.retry;
        let mut deadline = self.shared.deadline.subscribe();
        let mut attempts: u32 = 0;
        // Set once an attempt may have been applied without us hearing so.
        let mut ambiguous = false;
        let mut last_error: Option<IngestError> = None;
        loop {
            if deadline.borrow().is_some_and(|deadline| deadline <= Instant::now()) {
                let message = match &last_error {
                    Some(error) => format!("shutdown deadline passed while retrying after: {error}"),
                    None => "shutdown deadline passed before the batch was sent".to_owned(),
                };
                let code = last_error.as_ref().map(IngestError::code);
                self.lose(batch, LossReason::ShutdownDeadline, code, message, attempts, ambiguous);
                return Ok(());
            }
            attempts += 1;
            self.shared.lock().stats.attempts += 1;
            let answer = match self.attempt(&batch, &mut deadline).await {
                Attempt::Answered(answer) => {
                    answer.and_then(|outcomes| check_outcomes(&batch, outcomes).map_err(Failure::Ingest))
                }
                Attempt::CutOff => {
                    let message = "shutdown deadline passed while the batch was in flight".to_owned();
                    let code = Some(LossReason::ShutdownDeadline.code());
                    self.lose(batch, LossReason::ShutdownDeadline, code, message, attempts, true);
                    return Ok(());
                }
            };
            let error = match answer {
                Ok(outcomes) => {
                    self.settle(&batch, &outcomes, ambiguous);
                    return Ok(());
                }
                Err(Failure::Refused { code, message }) => {
                    self.lose(batch, LossReason::RequestRefused, Some(code), message, attempts, ambiguous);
                    return Ok(());
                }
                Err(Failure::TooLarge { .. } | Failure::Ingest(IngestError::BatchTooLarge { .. }))
                    if batch.len() > 1 =>
                {
                    return Err(TooLarge(batch));
                }
                Err(Failure::TooLarge { code, message }) => {
                    self.lose(batch, LossReason::BatchTooLarge, Some(code), message, attempts, ambiguous);
                    return Ok(());
                }
                Err(Failure::Ingest(error)) => error,
            };
            if let Some(reason) = LossReason::of_terminal(&error) {
                self.lose(batch, reason, Some(error.code()), error.to_string(), attempts, ambiguous);
                return Ok(());
            }
            ambiguous = true;
            if attempts >= retry.attempts_max {
                let message = format!("gave up after {attempts} attempts; the last failed with: {error}");
                self.lose(batch, LossReason::RetriesExhausted, Some(error.code()), message, attempts, true);
                return Ok(());
            }
            let pause = retry.backoff(attempts, |bound| rand::rng().random_range(0..=bound));
            last_error = Some(error);
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                () = deadline_passed(&mut deadline) => {}
            }
        }
    }

    /// One call to the sink, on its own task so that a panicking sink becomes
    /// a retryable failure and a call in flight can be abandoned at the deadline.
    async fn attempt(&self, batch: &[UsageEvent], deadline: &mut watch::Receiver<Option<Instant>>) -> Attempt {
        let sink = self.sink.clone();
        let events = batch.to_vec();
        // A panicking clock fails this attempt, retryably, like a failing
        // sink: the worker goes on and the batch ends in a counted bucket.
        let now = match std::panic::catch_unwind(AssertUnwindSafe(|| (self.clock)())) {
            Ok(now) => now,
            Err(_) => {
                let error = IngestError::Unavailable("the writer's clock panicked".into());
                return Attempt::Answered(Err(Failure::Ingest(error)));
            }
        };
        let mut call = tokio::spawn(async move {
            match sink {
                Destination::Sink(sink) => sink
                    .ingest(events, now)
                    .await
                    .map(|outcomes| outcomes.into_iter().map(Settled::from).collect())
                    .map_err(Failure::Ingest),
                Destination::Http(client) => client.ingest_settled(&events).await,
            }
        });
        tokio::select! {
            joined = &mut call => Attempt::Answered(joined.unwrap_or_else(|join_error| {
                Err(Failure::Ingest(IngestError::Unavailable(format!("the usage sink failed: {join_error}"))))
            })),
            () = deadline_passed(deadline) => {
                call.abort();
                Attempt::CutOff
            }
        }
    }

    fn settle(&self, batch: &[UsageEvent], outcomes: &[Settled], after_ambiguous: bool) {
        {
            let mut state = self.shared.lock();
            let stats = &mut state.stats;
            for (event, outcome) in batch.iter().zip(outcomes) {
                match outcome.outcome {
                    SettledOutcome::Accepted => stats.accepted.add_event(event.units),
                    SettledOutcome::Duplicate => {
                        stats.duplicate.add_event(event.units);
                        if after_ambiguous {
                            stats.redelivered.add_event(event.units);
                        }
                    }
                    SettledOutcome::Rejected(code) => stats.rejected.entry(code).or_default().add_event(event.units),
                }
            }
            stats.in_flight.remove(Tally::of(batch));
        }
    }

    fn lose(
        &self,
        events: Vec<UsageEvent>,
        reason: LossReason,
        error_code: Option<&'static str>,
        message: String,
        attempts: u32,
        maybe_applied: bool,
    ) {
        let tally = Tally::of(&events);
        {
            let mut state = self.shared.lock();
            state.stats.lost.entry(reason).or_default().add(tally);
            state.stats.in_flight.remove(tally);
        }
        if let Some(callback) = &self.on_loss {
            let report =
                LossReport { reason, error_code, message, events, units: tally.units, attempts, maybe_applied };
            // A panicking subscriber must not stop delivery of everyone else's
            // usage; the counters above already hold the loss.
            let _ = std::panic::catch_unwind(AssertUnwindSafe(|| callback(&report)));
        }
    }
}

/// Why an attempt failed: an error of the store contract, or (over HTTP only)
/// a request the server refused outright, which no retry can change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Failure {
    Ingest(IngestError),
    Refused {
        code: &'static str,
        message: String,
    },
    /// HTTP 413 with the server's own code and message (`payload_too_large`
    /// names the byte limit, not an event count).
    TooLarge {
        code: &'static str,
        message: String,
    },
}

/// A batch of more than one event that the sink said is too large.
struct TooLarge(Vec<UsageEvent>);

/// One event's outcome as the writer counts it: a rejection by its code, so
/// that a reason this client does not know is still counted, under its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Settled {
    pub(crate) request_id: String,
    pub(crate) outcome: SettledOutcome,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SettledOutcome {
    Accepted,
    Duplicate,
    Rejected(&'static str),
}

impl From<EventOutcome> for Settled {
    fn from(outcome: EventOutcome) -> Self {
        let settled = match outcome.outcome {
            Outcome::Accepted => SettledOutcome::Accepted,
            Outcome::Duplicate => SettledOutcome::Duplicate,
            Outcome::Rejected(reason) => SettledOutcome::Rejected(reason.code()),
        };
        Settled { request_id: outcome.request_id, outcome: settled }
    }
}

/// A sink must answer with one outcome per event, in order. Anything else is a
/// broken answer that says nothing reliable about what was applied, so it is
/// treated like corruption: retryable, with the batch possibly applied.
pub(super) fn check_outcomes(batch: &[UsageEvent], outcomes: Vec<Settled>) -> Result<Vec<Settled>, IngestError> {
    if outcomes.len() != batch.len() {
        return Err(IngestError::Corrupt(format!(
            "the sink answered {} outcomes for {} events",
            outcomes.len(),
            batch.len()
        )));
    }
    if let Some((index, _)) =
        batch.iter().zip(&outcomes).enumerate().find(|(_, (event, outcome))| event.request_id != outcome.request_id)
    {
        return Err(IngestError::Corrupt(format!("the sink answered out of order at event {index}")));
    }
    Ok(outcomes)
}

/// Completes when a shutdown deadline is set and has passed; never otherwise.
async fn deadline_passed(deadline: &mut watch::Receiver<Option<Instant>>) {
    loop {
        let current = *deadline.borrow_and_update();
        match current {
            Some(at) => {
                tokio::select! {
                    () = tokio::time::sleep_until(at) => return,
                    changed = deadline.changed() => {
                        if changed.is_err() {
                            tokio::time::sleep_until(at).await;
                            return;
                        }
                    }
                }
            }
            None => {
                if deadline.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use jiff::Timestamp;

    use super::*;

    pub(in crate::writer) fn event(request_id: &str) -> UsageEvent {
        UsageEvent {
            request_id: request_id.to_owned(),
            account_id: "a".to_owned(),
            credential_id: "c".to_owned(),
            units: 1,
            occurred_at: Timestamp::UNIX_EPOCH,
            lease_id: None,
            fencing_token: None,
            dimensions: Default::default(),
        }
    }

    fn outcome(request_id: &str) -> Settled {
        Settled { request_id: request_id.to_owned(), outcome: SettledOutcome::Accepted }
    }

    #[test]
    fn answers_must_match_the_batch_one_to_one_in_order() {
        let batch = vec![event("r1"), event("r2")];
        assert_eq!(check_outcomes(&batch, vec![outcome("r1"), outcome("r2")]), Ok(vec![outcome("r1"), outcome("r2")]));
        assert_eq!(
            check_outcomes(&batch, vec![outcome("r1")]),
            Err(IngestError::Corrupt("the sink answered 1 outcomes for 2 events".into()))
        );
        assert_eq!(
            check_outcomes(&batch, vec![outcome("r2"), outcome("r1")]),
            Err(IngestError::Corrupt("the sink answered out of order at event 0".into()))
        );
    }
}
