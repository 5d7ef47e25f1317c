//! The usage writer: a bounded, batching, retrying queue in front of any
//! [`UsageSink`].

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use jiff::Timestamp;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tollgate_core::UsageEvent;
use tollgate_core::ids::ID_CHARS_MAX;
use tollgate_store::UsageSink;

use crate::config::{BatchGrouping, ConfigError, WriterConfig};
use crate::http::TollgateClient;
use crate::stats::{LossReport, Tally, WriterStats};

mod worker;

use worker::{Destination, Worker};
pub(crate) use worker::{Failure, Settled, SettledOutcome};

/// Called once for every [`LossReport`], on the writer's worker task. It must
/// return quickly and must not block: hand the report to a channel or a log.
/// A panic inside it is caught and does not stop the writer.
pub type LossCallback = Arc<dyn Fn(&LossReport) + Send + Sync>;

/// The wall clock the writer passes to [`UsageSink::ingest`] as `now`. The HTTP
/// sink ignores it (the server supplies its own); a store used directly judges
/// lease expiry by it.
pub type Clock = Arc<dyn Fn() -> Timestamp + Send + Sync>;

/// Why `record` did not take an event. Either way the caller gets the event
/// back, so nothing is dropped without the caller knowing. The event is boxed
/// to keep `record`'s result small on the hot path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("the usage queue is full ({queue_events_max} events); the event was not recorded")]
    QueueFull { event: Box<UsageEvent>, queue_events_max: usize },
    #[error("the usage writer is shutting down; the event was not recorded")]
    Closed { event: Box<UsageEvent> },
    /// A field is longer than the server ever accepts (`ID_CHARS_MAX`
    /// characters). The server would reject the event anyway, and an
    /// unbounded field could make its whole batch too large to send.
    #[error("the event's {field} is longer than {max} characters; the event was not recorded")]
    FieldTooLong { event: Box<UsageEvent>, field: &'static str, max: usize },
}

impl RecordError {
    pub fn code(&self) -> &'static str {
        match self {
            RecordError::QueueFull { .. } => "queue_full",
            RecordError::Closed { .. } => "writer_closed",
            RecordError::FieldTooLong { .. } => "field_too_long",
        }
    }

    /// The event that was not recorded.
    pub fn into_event(self) -> UsageEvent {
        match self {
            RecordError::QueueFull { event, .. }
            | RecordError::Closed { event }
            | RecordError::FieldTooLong { event, .. } => *event,
        }
    }
}

/// The worker task ended without settling everything: a bug in the writer, as
/// every failure of a sink or a callback is caught and settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the usage writer's worker stopped unexpectedly")]
pub struct WriterStopped;

/// A bounded, batching writer of usage events over any [`UsageSink`]: the HTTP
/// client ([`crate::TollgateClient`]) or a store used directly.
///
/// **Recording.** [`record`](Self::record) never blocks and never waits for the
/// network. It appends the event to an in-memory queue of at most
/// `queue_events_max` events. When the queue is full the writer applies
/// back-pressure rather than loss: `record` returns
/// [`RecordError::QueueFull`] with the event, counts it in
/// [`WriterStats::turned_away_full`], and the event is not part of `recorded`.
/// The caller, who still holds the end-user request, decides what to do: refuse
/// the request, wait and record again, or serve it unmetered knowingly. Silently
/// evicting queued events instead would bill less than was served with nobody
/// deciding so.
///
/// **Batching.** One worker task takes up to `batch_events_max` events from the
/// front of the queue as soon as that many are queued, or once the oldest has
/// waited `batch_age_max`, or when a `flush` or `shutdown` asks for them. It
/// sends one batch at a time, in recording order. With
/// [`BatchGrouping::ByAccount`] a batch holds only the front event's account:
/// its first `batch_events_max` queued events, the others waiting their turn.
/// On a database distributed by account such a batch is a single-shard
/// transaction; the price is smaller batches when accounts interleave.
///
/// **Retrying.** `IngestError::Unavailable` and `IngestError::Corrupt` (for
/// the HTTP sink also connection errors, timeouts, 503 and 500) are retried with
/// the same batch, with capped exponential backoff and jitter, at most
/// `retry.attempts_max` attempts in all; then the batch is lost as
/// `retries_exhausted`. Resending the same request IDs is safe because ingestion
/// is idempotent per `(account, request_id)`: an event applied by an attempt
/// whose answer was lost comes back `duplicate` and is billed once.
///
/// **Never retried.** `IngestError::Refused` (HTTP 422: accepting the batch
/// would overflow a counter) is terminal for the unchanged batch and
/// `IngestError::BatchTooLarge` (HTTP 413) cannot succeed either: the batch goes
/// straight to loss reporting, once. A writer built with
/// [`over_http`](Self::over_http) also loses at once, as `request_refused`, a
/// request the server refuses and marks not retryable (400, 401, 403, 404);
/// the full table is in `docs/client.md`.
///
/// **Accounting.** Every recorded event ends in exactly one of accepted,
/// duplicate, rejected (by reason) or lost (by reason); see [`WriterStats`].
/// Losses are also reported, one [`LossReport`] per batch, to the callback set
/// with [`WriterBuilder::on_loss`].
///
/// **Draining.** [`flush`](Self::flush) returns once every event recorded
/// before it is settled. [`shutdown`](Self::shutdown) stops recording, delivers
/// what it can before its deadline and reports the rest lost as
/// `shutdown_deadline`, cutting off a sink call still in flight at the deadline
/// (observed within the timer's millisecond resolution).
///
/// The handle is cheap to clone. When the last clone is dropped without
/// `shutdown`, the writer stops recording and its worker delivers what is
/// queued under the normal retry policy before it exits.
#[derive(Clone)]
pub struct UsageWriter {
    handle: Arc<Handle>,
}

/// Builds a [`UsageWriter`] with optional loss callback and clock.
pub struct WriterBuilder {
    sink: Destination,
    config: WriterConfig,
    on_loss: Option<LossCallback>,
    clock: Clock,
}

impl WriterBuilder {
    /// Subscribes to loss reports. See [`LossCallback`].
    pub fn on_loss(mut self, callback: impl Fn(&LossReport) + Send + Sync + 'static) -> Self {
        self.on_loss = Some(Arc::new(callback));
        self
    }

    /// Replaces the wall clock, `Timestamp::now` by default.
    pub fn clock(mut self, clock: impl Fn() -> Timestamp + Send + Sync + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Validates the configuration and starts the worker task. Must be called
    /// inside a Tokio runtime.
    pub fn spawn(self) -> Result<UsageWriter, ConfigError> {
        self.config.validate()?;
        let (settled_tx, settled_rx) = watch::channel(0u64);
        let (done_tx, done_rx) = watch::channel(false);
        let (deadline_tx, _) = watch::channel(None);
        let shared = Arc::new(Shared {
            config: self.config,
            state: Mutex::new(State {
                queue: VecDeque::new(),
                stats: WriterStats::default(),
                settled_through: 0,
                flush_upto: 0,
                closing: false,
            }),
            wake: Notify::new(),
            deadline: deadline_tx,
            settled: settled_rx,
            done: done_rx,
        });
        let worker = Worker {
            shared: shared.clone(),
            sink: self.sink,
            on_loss: self.on_loss,
            clock: self.clock,
            settled: settled_tx,
            done: done_tx,
        };
        tokio::spawn(worker.run());
        Ok(UsageWriter { handle: Arc::new(Handle { shared }) })
    }
}

impl UsageWriter {
    /// A writer with no loss callback and the system clock.
    pub fn spawn(sink: Arc<dyn UsageSink>, config: WriterConfig) -> Result<Self, ConfigError> {
        Self::builder(sink, config).spawn()
    }

    pub fn builder(sink: Arc<dyn UsageSink>, config: WriterConfig) -> WriterBuilder {
        WriterBuilder { sink: Destination::Sink(sink), config, on_loss: None, clock: Arc::new(Timestamp::now) }
    }

    /// A writer that delivers over HTTP with `client`. Unlike a writer over
    /// `Arc::new(client)` as a [`UsageSink`], it reads a `200` answer's
    /// outcomes as the server wrote them: a rejection reason this client does
    /// not know (from a newer server) is counted under its wire code in
    /// [`WriterStats::rejected`], and every other outcome of the batch is
    /// settled with it. The `UsageSink` contract has no room for an unknown
    /// reason, so through it such an answer is `Corrupt`.
    pub fn over_http(client: TollgateClient, config: WriterConfig) -> WriterBuilder {
        WriterBuilder { sink: Destination::Http(client), config, on_loss: None, clock: Arc::new(Timestamp::now) }
    }

    pub fn config(&self) -> &WriterConfig {
        &self.handle.shared.config
    }

    /// Queues `event` without waiting. See the type's documentation for what
    /// happens when the queue is full.
    pub fn record(&self, event: UsageEvent) -> Result<(), RecordError> {
        self.record_numbered(event).map(|_| ())
    }

    /// `record`, returning the event's place in recording order (the first
    /// recorded event is 1), for [`flush_through`](Self::flush_through).
    pub(crate) fn record_numbered(&self, event: UsageEvent) -> Result<u64, RecordError> {
        if let Some(field) = overlong_field(&event) {
            self.handle.shared.lock().stats.turned_away_invalid += 1;
            return Err(RecordError::FieldTooLong { event: Box::new(event), field, max: ID_CHARS_MAX });
        }
        let shared = &self.handle.shared;
        let mut state = shared.lock();
        if state.closing {
            state.stats.turned_away_closed += 1;
            return Err(RecordError::Closed { event: Box::new(event) });
        }
        if state.queue.len() >= shared.config.queue_events_max {
            state.stats.turned_away_full += 1;
            return Err(RecordError::QueueFull {
                event: Box::new(event),
                queue_events_max: shared.config.queue_events_max,
            });
        }
        state.stats.recorded.add_event(event.units);
        state.stats.queued.add_event(event.units);
        let number = state.stats.recorded.events;
        state.queue.push_back(Queued { event, recorded_at: Instant::now(), number });
        let queued = state.queue.len();
        drop(state);
        // The worker needs waking only to start an age timer or to send a full
        // batch; in between it already knows when to look again.
        if queued == 1 || queued >= shared.config.batch_events_max {
            shared.wake.notify_one();
        }
        Ok(number)
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> WriterStats {
        self.handle.shared.lock().stats.clone()
    }

    /// Returns once every event recorded before this call is settled
    /// (accepted, duplicate, rejected or lost), sending partial batches at once
    /// rather than waiting for their age. How long that takes is bounded by the
    /// retry policy: at most `attempts_max` attempts and backoffs per batch.
    pub async fn flush(&self) -> Result<WriterStats, WriterStopped> {
        let recorded = self.handle.shared.lock().stats.recorded.events;
        self.flush_through(recorded).await?;
        Ok(self.stats())
    }

    /// Returns once the first `number` recorded events are settled, sending
    /// them at once. Events recorded after them are not waited for, so a
    /// gateway settling one account's lease does not wait for the usage other
    /// accounts record meanwhile. (Batches settle in recording order, so the
    /// events recorded before them are settled too.)
    pub(crate) async fn flush_through(&self, number: u64) -> Result<(), WriterStopped> {
        let shared = &self.handle.shared;
        if *shared.settled.borrow() >= number {
            return Ok(());
        }
        {
            let mut state = shared.lock();
            state.flush_upto = state.flush_upto.max(number);
        }
        shared.wake.notify_one();
        let mut settled = shared.settled.clone();
        settled.wait_for(|events| *events >= number).await.map_err(|_| WriterStopped)?;
        Ok(())
    }

    /// Stops recording, delivers what it can within `timeout`, reports the rest
    /// lost (`shutdown_deadline`) and returns the final counters, in which
    /// nothing is queued or in flight. It returns at the deadline at the
    /// latest, give or take the timer's resolution (Tokio's timers tick in
    /// milliseconds) and the loss callback's own run time: a sink call still
    /// in flight then is abandoned, and its events are reported lost with
    /// `maybe_applied` set. Calling it again (or from a clone) shortens the
    /// deadline if the new one is earlier.
    pub async fn shutdown(&self, timeout: Duration) -> Result<WriterStats, WriterStopped> {
        let shared = &self.handle.shared;
        shared.close(Instant::now().checked_add(timeout));
        let mut done = shared.done.clone();
        done.wait_for(|done| *done).await.map_err(|_| WriterStopped)?;
        Ok(self.stats())
    }

    /// Whether `shutdown` was called or every handle dropped.
    pub fn is_closed(&self) -> bool {
        self.handle.shared.lock().closing
    }
}

/// Owned by every clone of a `UsageWriter`; dropping the last one closes it.
struct Handle {
    shared: Arc<Shared>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.shared.close(None);
    }
}

struct Shared {
    config: WriterConfig,
    state: Mutex<State>,
    /// Wakes the worker: new work, a flush, or closing.
    wake: Notify,
    /// The shutdown deadline, watched by the worker so that a sink call or a
    /// backoff in progress is cut off when it passes.
    deadline: watch::Sender<Option<Instant>>,
    /// Settled event count, published by the worker after each batch.
    settled: watch::Receiver<u64>,
    /// Set by the worker when it exits after draining.
    done: watch::Receiver<bool>,
}

struct State {
    queue: VecDeque<Queued>,
    stats: WriterStats,
    /// Every event numbered up to this one is settled (events are numbered
    /// from 1 in recording order). The worker advances it after each batch it
    /// took from the queue is settled: the queue keeps recording order, so its
    /// front is the first event not yet settled.
    settled_through: u64,
    /// A flush wants every event recorded before this count sent now.
    flush_upto: u64,
    closing: bool,
}

struct Queued {
    event: UsageEvent,
    recorded_at: Instant,
    /// Its place in recording order, from 1.
    number: u64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Every critical section only moves whole values and counters, so the
        // state is consistent even if a holder panicked.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn close(&self, deadline: Option<Instant>) {
        self.lock().closing = true;
        if let Some(deadline) = deadline {
            self.deadline.send_modify(|current| {
                *current = Some(current.map_or(deadline, |current| current.min(deadline)));
            });
        }
        self.wake.notify_one();
    }
}

impl State {
    /// Takes the next batch: the first `events_max` queued events, or, with
    /// [`BatchGrouping::ByAccount`], the first `events_max` queued events of
    /// the front event's account, leaving the others queued in their order.
    fn take_batch(&mut self, events_max: usize, grouping: BatchGrouping) -> Vec<UsageEvent> {
        let batch: Vec<UsageEvent> = match (grouping, self.queue.front()) {
            (BatchGrouping::ByAccount, Some(front)) => {
                let account = front.event.account_id.clone();
                let mut batch = Vec::with_capacity(events_max.min(self.queue.len()));
                let mut rest = VecDeque::with_capacity(self.queue.len());
                for queued in self.queue.drain(..) {
                    if batch.len() < events_max && queued.event.account_id == account {
                        batch.push(queued.event);
                    } else {
                        rest.push_back(queued);
                    }
                }
                self.queue = rest;
                batch
            }
            _ => {
                let count = events_max.min(self.queue.len());
                self.queue.drain(..count).map(|queued| queued.event).collect()
            }
        };
        let tally = Tally::of(&batch);
        self.stats.queued.remove(tally);
        self.stats.in_flight.add(tally);
        self.stats.batches += 1;
        batch
    }

    /// Called between batches, when nothing is in flight: everything before
    /// the queue's front, or everything recorded when the queue is empty, is
    /// settled.
    fn advance_settled(&mut self) -> u64 {
        self.settled_through = self.queue.front().map_or(self.stats.recorded.events, |front| front.number - 1);
        self.settled_through
    }
}

/// The first identifier of `event` longer than any the server accepts. Only
/// size is checked here; anything else the server judges per event.
fn overlong_field(event: &UsageEvent) -> Option<&'static str> {
    let too_long = |value: &str| value.len() > ID_CHARS_MAX && value.chars().count() > ID_CHARS_MAX;
    [
        ("request_id", Some(event.request_id.as_str())),
        ("account_id", Some(event.account_id.as_str())),
        ("credential_id", Some(event.credential_id.as_str())),
        ("lease_id", event.lease_id.as_deref()),
    ]
    .into_iter()
    .find_map(|(field, value)| value.filter(|value| too_long(value)).map(|_| field))
}

#[cfg(test)]
mod tests {
    use super::worker::tests::event;
    use super::*;

    #[test]
    fn record_errors_hand_the_event_back() {
        let full = RecordError::QueueFull { event: Box::new(event("r")), queue_events_max: 1 };
        assert_eq!(full.code(), "queue_full");
        assert_eq!(full.into_event(), event("r"));
        let closed = RecordError::Closed { event: Box::new(event("s")) };
        assert_eq!(closed.code(), "writer_closed");
        assert_eq!(closed.into_event(), event("s"));
    }
}
