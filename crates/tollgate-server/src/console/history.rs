//! The usage events this server classified, per minute, over the last hour:
//! what the fleet page charts. Duplicates and rejections are never stored,
//! so no store can answer this; each server keeps its own, from its own
//! answers, and forgets it when it stops.

use std::collections::VecDeque;
use std::sync::Mutex;

use jiff::Timestamp;
use tollgate_core::{EventOutcome, Outcome, RejectReason};

/// How many minutes the history keeps.
pub(crate) const MINUTES: usize = 60;

const REASONS: usize = RejectReason::ALL.len();

/// One minute's outcomes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Minute {
    /// Minutes since the epoch.
    pub(crate) minute: i64,
    pub(crate) accepted: u64,
    pub(crate) duplicate: u64,
    /// By [`RejectReason::ALL`]'s order.
    pub(crate) rejected: [u64; REASONS],
}

impl Minute {
    pub(crate) fn rejected_total(&self) -> u64 {
        self.rejected.iter().sum()
    }
}

/// The last [`MINUTES`] minutes that saw events, oldest first. One lock per
/// batch, never per event.
#[derive(Default)]
pub(crate) struct IngestHistory {
    minutes: Mutex<VecDeque<Minute>>,
}

impl IngestHistory {
    /// Counts one batch's outcomes in the minute of `now`.
    pub(crate) fn record(&self, outcomes: &[EventOutcome], now: Timestamp) {
        let minute = now.as_second().div_euclid(60);
        let mut minutes = self.minutes.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if minutes.back().is_none_or(|last| last.minute < minute) {
            minutes.push_back(Minute { minute, ..Minute::default() });
        }
        while minutes.front().is_some_and(|first| first.minute <= minute - MINUTES as i64) {
            minutes.pop_front();
        }
        // A clock that stepped back counts into the latest minute.
        let Some(current) = minutes.back_mut() else { return };
        for outcome in outcomes {
            match outcome.outcome {
                Outcome::Accepted => current.accepted += 1,
                Outcome::Duplicate => current.duplicate += 1,
                Outcome::Rejected(reason) => {
                    if let Some(index) = RejectReason::ALL.iter().position(|known| *known == reason) {
                        current.rejected[index] += 1;
                    }
                }
            }
        }
    }

    /// Every minute of the hour before `now`, oldest first, zero where
    /// nothing was classified.
    pub(crate) fn last_hour(&self, now: Timestamp) -> Vec<Minute> {
        let current = now.as_second().div_euclid(60);
        let minutes = self.minutes.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        (current - MINUTES as i64 + 1..=current)
            .map(|minute| {
                minutes
                    .iter()
                    .find(|kept| kept.minute == minute)
                    .copied()
                    .unwrap_or(Minute { minute, ..Minute::default() })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(outcome: Outcome) -> EventOutcome {
        EventOutcome { request_id: "r".into(), outcome }
    }

    #[test]
    fn outcomes_count_in_their_minute_and_the_hour_rolls_over() {
        let history = IngestHistory::default();
        let at = |second: i64| Timestamp::from_second(second).unwrap();
        let batch = [
            outcome(Outcome::Accepted),
            outcome(Outcome::Duplicate),
            outcome(Outcome::Rejected(RejectReason::UnknownAccount)),
        ];
        history.record(&batch, at(600));
        history.record(&batch[..1], at(659));
        let hour = history.last_hour(at(660));
        assert_eq!(hour.len(), MINUTES);
        let ten = hour.iter().find(|minute| minute.minute == 10).unwrap();
        assert_eq!((ten.accepted, ten.duplicate, ten.rejected_total()), (2, 1, 1));
        let reason = RejectReason::ALL.iter().position(|r| *r == RejectReason::UnknownAccount).unwrap();
        assert_eq!(ten.rejected[reason], 1);
        assert_eq!(hour.last().unwrap().minute, 11);
        assert_eq!(hour.last().unwrap().accepted, 0);
        let later = history.last_hour(at(600 + 60 * 60));
        assert!(later.iter().all(|minute| minute.accepted == 0), "the minute an hour ago is gone");
        history.record(&batch[..1], at(600 + 60 * 60));
        assert_eq!(history.minutes.lock().unwrap().len(), 1, "minutes older than an hour are dropped");
    }
}
