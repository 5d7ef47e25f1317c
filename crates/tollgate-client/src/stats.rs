//! What the usage writer counts, and how it reports loss.
//!
//! Every recorded event ends in exactly one of four buckets: accepted,
//! duplicate, rejected or lost. Until then it is queued or in flight. So at
//! every moment `recorded = accepted + duplicate + rejected + lost + queued +
//! in_flight`, in events and in units, and after a completed `flush` or
//! `shutdown` the last two are zero.

use std::collections::BTreeMap;

use tollgate_core::{IngestError, RejectReason, UsageEvent};

/// A count of events and the units they carry. Units are `u128` because the
/// units of many `u64` events can exceed `u64::MAX`; a batch that does is
/// exactly what the store refuses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    pub events: u64,
    pub units: u128,
}

impl Tally {
    pub fn of(events: &[UsageEvent]) -> Self {
        let mut tally = Tally::default();
        for event in events {
            tally.add_event(event.units);
        }
        tally
    }

    pub(crate) fn add_event(&mut self, units: u64) {
        self.events += 1;
        self.units += u128::from(units);
    }

    pub(crate) fn add(&mut self, other: Tally) {
        self.events += other.events;
        self.units += other.units;
    }

    pub(crate) fn remove(&mut self, other: Tally) {
        self.events -= other.events;
        self.units -= other.units;
    }

    fn sum<'a>(tallies: impl IntoIterator<Item = &'a Tally>) -> Tally {
        let mut total = Tally::default();
        for tally in tallies {
            total.add(*tally);
        }
        total
    }
}

/// Why events were lost: reported by [`LossReport`] and counted in
/// [`WriterStats::lost`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LossReason {
    /// The sink refused the batch (`IngestError::Refused`, HTTP 422): accepting
    /// it would overflow a counter. Terminal for the unchanged batch, so it is
    /// never retried.
    BatchRefused,
    /// The sink said the batch is too large (`IngestError::BatchTooLarge`, HTTP
    /// 413). Never retried.
    BatchTooLarge,
    /// The server (or a proxy in front of it) refused the request itself, not
    /// retryably: HTTP 400, 401, 403, 404 and any other 4xx but 408, 413, 422
    /// and 429. Resending the unchanged request cannot succeed, so it is never
    /// retried; `error_code` holds the answer's code (`unauthorized`, …).
    RequestRefused,
    /// Every attempt the retry policy allows failed retryably.
    RetriesExhausted,
    /// `shutdown`'s deadline passed before the events were delivered.
    ShutdownDeadline,
}

impl LossReason {
    pub const ALL: [LossReason; 5] = [
        LossReason::BatchRefused,
        LossReason::BatchTooLarge,
        LossReason::RequestRefused,
        LossReason::RetriesExhausted,
        LossReason::ShutdownDeadline,
    ];

    pub fn code(self) -> &'static str {
        match self {
            LossReason::BatchRefused => "batch_refused",
            LossReason::BatchTooLarge => "batch_too_large",
            LossReason::RequestRefused => "request_refused",
            LossReason::RetriesExhausted => "retries_exhausted",
            LossReason::ShutdownDeadline => "shutdown_deadline",
        }
    }

    /// The loss reason of a non-retryable ingest error.
    pub(crate) fn of_terminal(error: &IngestError) -> Option<LossReason> {
        match error {
            IngestError::Refused { .. } => Some(LossReason::BatchRefused),
            IngestError::BatchTooLarge { .. } => Some(LossReason::BatchTooLarge),
            IngestError::Unavailable(_) | IngestError::Corrupt(_) => None,
        }
    }
}

impl std::fmt::Display for LossReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.code())
    }
}

/// One batch (or the part of one) that the writer gave up on. The loss
/// callback receives each exactly once, and the counters in
/// [`WriterStats::lost`] include it before `flush` or `shutdown` returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LossReport {
    pub reason: LossReason,
    /// The stable code of the last error, e.g. `batch_refused` or
    /// `storage_unavailable`; `shutdown_deadline` for a call cut off in
    /// flight; `None` when the deadline passed before any attempt was made.
    pub error_code: Option<&'static str>,
    /// For people: the last error's message or what the deadline interrupted.
    pub message: String,
    pub events: Vec<UsageEvent>,
    pub units: u128,
    /// Attempts made for this batch.
    pub attempts: u32,
    /// Whether an earlier attempt may have been applied although its answer
    /// never arrived (a retryable failure, or an attempt cut off by the
    /// deadline). When true the ledger may hold some of these events after
    /// all; when false it certainly holds none of them from this writer.
    pub maybe_applied: bool,
}

/// A snapshot of the writer's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriterStats {
    /// Every event `record` took.
    pub recorded: Tally,
    pub accepted: Tally,
    pub duplicate: Tally,
    /// The part of `duplicate` that came back on a retry after an attempt
    /// whose answer was lost: those events were most likely applied by that
    /// earlier attempt, so they are billed once, through this writer.
    pub redelivered: Tally,
    /// By rejection reason code (`RejectReason::code`).
    pub rejected: BTreeMap<&'static str, Tally>,
    pub lost: BTreeMap<LossReason, Tally>,
    /// Waiting in the queue.
    pub queued: Tally,
    /// In the batch being delivered.
    pub in_flight: Tally,
    /// `record` calls turned away because the queue was full. These events
    /// were handed back to the caller and are not part of `recorded`.
    pub turned_away_full: u64,
    /// `record` calls turned away because the writer was shutting down.
    pub turned_away_closed: u64,
    /// `record` calls turned away because a field was longer than the server
    /// accepts (`RecordError::FieldTooLong`). Not part of `recorded` either.
    pub turned_away_invalid: u64,
    /// Batches taken from the queue.
    pub batches: u64,
    /// Calls to the sink, retries included.
    pub attempts: u64,
}

impl WriterStats {
    pub fn rejected_total(&self) -> Tally {
        Tally::sum(self.rejected.values())
    }

    pub fn rejected_for(&self, reason: RejectReason) -> Tally {
        self.rejected.get(reason.code()).copied().unwrap_or_default()
    }

    pub fn lost_total(&self) -> Tally {
        Tally::sum(self.lost.values())
    }

    pub fn lost_for(&self, reason: LossReason) -> Tally {
        self.lost.get(&reason).copied().unwrap_or_default()
    }

    /// Events that reached their final bucket.
    pub fn settled(&self) -> Tally {
        let mut total = self.accepted;
        total.add(self.duplicate);
        total.add(self.rejected_total());
        total.add(self.lost_total());
        total
    }

    /// `recorded = accepted + duplicate + rejected + lost + queued + in_flight`,
    /// in events and in units. It holds at every snapshot.
    pub fn is_conserved(&self) -> bool {
        let mut accounted = self.settled();
        accounted.add(self.queued);
        accounted.add(self.in_flight);
        accounted == self.recorded
    }

    /// Nothing queued or in flight: every recorded event is settled.
    pub fn is_drained(&self) -> bool {
        self.queued == Tally::default() && self.in_flight == Tally::default()
    }

    /// Units this writer knows the ledger billed through it: accepted ones and
    /// redelivered ones. While request IDs are unique per account, as Tollgate
    /// requires, an account's `billed` grows by exactly this much through this
    /// writer, plus at most the units of losses with `maybe_applied` set.
    pub fn delivered_units(&self) -> u128 {
        self.accepted.units + self.redelivered.units
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loss_reasons_have_stable_codes() {
        let codes: Vec<&str> = LossReason::ALL.iter().map(|r| r.code()).collect();
        assert_eq!(
            codes,
            ["batch_refused", "batch_too_large", "request_refused", "retries_exhausted", "shutdown_deadline"]
        );
        assert_eq!(
            LossReason::of_terminal(&IngestError::Refused { counter: "billed" }),
            Some(LossReason::BatchRefused)
        );
        assert_eq!(
            LossReason::of_terminal(&IngestError::BatchTooLarge { events: 2, max: 1 }),
            Some(LossReason::BatchTooLarge)
        );
        assert_eq!(LossReason::of_terminal(&IngestError::Unavailable("x".into())), None);
        assert_eq!(LossReason::of_terminal(&IngestError::Corrupt("x".into())), None);
    }

    #[test]
    fn conservation_counts_every_bucket() {
        let mut stats = WriterStats::default();
        let one = |units| Tally { events: 1, units };
        stats.recorded = Tally { events: 6, units: u128::from(u64::MAX) + 20 };
        stats.accepted = one(1);
        stats.duplicate = one(2);
        stats.rejected.insert("fence_mismatch", one(3));
        stats.lost.insert(LossReason::BatchRefused, one(u128::from(u64::MAX)));
        stats.queued = one(5);
        assert!(!stats.is_conserved());
        stats.in_flight = one(9);
        assert!(stats.is_conserved());
        assert!(!stats.is_drained());
        assert_eq!(stats.rejected_for(RejectReason::FenceMismatch), one(3));
        assert_eq!(stats.rejected_for(RejectReason::LeaseExpired), Tally::default());
        assert_eq!(stats.lost_for(LossReason::BatchRefused), one(u128::from(u64::MAX)));
    }
}
