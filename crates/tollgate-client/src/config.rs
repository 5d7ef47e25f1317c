//! The usage writer's configuration: every queue, batch and retry has a bound,
//! and a configuration outside those bounds is a typed error at startup rather
//! than a surprise under load.

use std::time::Duration;

use tollgate_core::BATCH_EVENTS_MAX;

/// The most events a writer's queue may be configured to hold. At a few hundred
/// bytes an event this keeps a full queue within a few hundred megabytes.
pub const QUEUE_EVENTS_LIMIT: usize = 1_000_000;
/// The shortest batch age: a shorter one would send a request per event.
pub const BATCH_AGE_MIN: Duration = Duration::from_millis(1);
/// The longest batch age: usage older than this is not "recent" any more, and
/// a gateway that stops would have that much unsent usage at risk.
pub const BATCH_AGE_LIMIT: Duration = Duration::from_secs(60);
/// The shortest first backoff.
pub const BACKOFF_MIN: Duration = Duration::from_millis(1);
/// The longest first backoff.
pub const BACKOFF_INITIAL_LIMIT: Duration = Duration::from_secs(60);
/// The longest backoff between two attempts of one batch.
pub const BACKOFF_LIMIT: Duration = Duration::from_secs(300);
/// The most attempts one batch may be configured to get.
pub const ATTEMPTS_LIMIT: u32 = 1_000;

/// How the writer queues and batches. See [`crate::UsageWriter`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriterConfig {
    /// Events that may wait in the queue, not counting the batch in flight.
    /// `1..=QUEUE_EVENTS_LIMIT`.
    pub queue_events_max: usize,
    /// Events per batch: a batch is sent as soon as this many are queued.
    /// `1..=min(BATCH_EVENTS_MAX, queue_events_max)`.
    pub batch_events_max: usize,
    /// A batch is sent once its oldest event has waited this long, full or not.
    /// `BATCH_AGE_MIN..=BATCH_AGE_LIMIT`.
    pub batch_age_max: Duration,
    /// Which events share a batch. [`BatchGrouping::RecordingOrder`] by
    /// default.
    pub batch_grouping: BatchGrouping,
    pub retry: RetryConfig,
}

/// Which events the usage writer puts in one batch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum BatchGrouping {
    /// The oldest queued events, whatever their accounts: the fullest batches.
    #[default]
    RecordingOrder,
    /// The oldest queued events of one account (the oldest event's), so that
    /// each batch touches one account. On a database distributed by account
    /// every batch is then a single-shard transaction instead of one spanning
    /// a shard per account it names; when many accounts interleave, batches
    /// are smaller and more numerous.
    ByAccount,
}

/// Capped exponential backoff with jitter for retryable failures.
///
/// Attempt `n` (counting from 1) that fails retryably is followed by a pause
/// drawn uniformly from `[d/2, d]`, where `d = min(backoff_initial * 2^(n-1),
/// backoff_max)`. The jitter keeps many gateways that lost the same server
/// from retrying in lockstep; the lower half keeps a pause from being zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryConfig {
    /// `BACKOFF_MIN..=BACKOFF_INITIAL_LIMIT`.
    pub backoff_initial: Duration,
    /// `backoff_initial..=BACKOFF_LIMIT`.
    pub backoff_max: Duration,
    /// Attempts per batch, the first included; a batch that still fails
    /// retryably after this many is reported lost (`retries_exhausted`).
    /// `1..=ATTEMPTS_LIMIT`.
    pub attempts_max: u32,
}

impl Default for WriterConfig {
    fn default() -> Self {
        Self {
            queue_events_max: 100_000,
            batch_events_max: 1_000,
            batch_age_max: Duration::from_secs(1),
            batch_grouping: BatchGrouping::RecordingOrder,
            retry: RetryConfig::default(),
        }
    }
}

impl Default for RetryConfig {
    /// About two minutes of retrying before a batch is given up: long enough to
    /// ride out a server restart or a database failover.
    fn default() -> Self {
        Self { backoff_initial: Duration::from_millis(100), backoff_max: Duration::from_secs(10), attempts_max: 20 }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("queue_events_max is {value}; it must be 1 to {max}")]
    QueueEventsMaxOutOfRange { value: usize, max: usize },
    #[error("batch_events_max is {value}; it must be 1 to {max} (the smaller of the batch limit and queue_events_max)")]
    BatchEventsMaxOutOfRange { value: usize, max: usize },
    #[error("batch_age_max is {value:?}; it must be {min:?} to {max:?}")]
    BatchAgeMaxOutOfRange { value: Duration, min: Duration, max: Duration },
    #[error("backoff_initial is {value:?}; it must be {min:?} to {max:?}")]
    BackoffInitialOutOfRange { value: Duration, min: Duration, max: Duration },
    #[error("backoff_max is {value:?}; it must be {min:?} (backoff_initial) to {max:?}")]
    BackoffMaxOutOfRange { value: Duration, min: Duration, max: Duration },
    #[error("attempts_max is {value}; it must be 1 to {max}")]
    AttemptsMaxOutOfRange { value: u32, max: u32 },
}

impl WriterConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(1..=QUEUE_EVENTS_LIMIT).contains(&self.queue_events_max) {
            return Err(ConfigError::QueueEventsMaxOutOfRange {
                value: self.queue_events_max,
                max: QUEUE_EVENTS_LIMIT,
            });
        }
        let batch_max = BATCH_EVENTS_MAX.min(self.queue_events_max);
        if !(1..=batch_max).contains(&self.batch_events_max) {
            return Err(ConfigError::BatchEventsMaxOutOfRange { value: self.batch_events_max, max: batch_max });
        }
        if !(BATCH_AGE_MIN..=BATCH_AGE_LIMIT).contains(&self.batch_age_max) {
            return Err(ConfigError::BatchAgeMaxOutOfRange {
                value: self.batch_age_max,
                min: BATCH_AGE_MIN,
                max: BATCH_AGE_LIMIT,
            });
        }
        self.retry.validate()
    }
}

impl RetryConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(BACKOFF_MIN..=BACKOFF_INITIAL_LIMIT).contains(&self.backoff_initial) {
            return Err(ConfigError::BackoffInitialOutOfRange {
                value: self.backoff_initial,
                min: BACKOFF_MIN,
                max: BACKOFF_INITIAL_LIMIT,
            });
        }
        if !(self.backoff_initial..=BACKOFF_LIMIT).contains(&self.backoff_max) {
            return Err(ConfigError::BackoffMaxOutOfRange {
                value: self.backoff_max,
                min: self.backoff_initial,
                max: BACKOFF_LIMIT,
            });
        }
        if !(1..=ATTEMPTS_LIMIT).contains(&self.attempts_max) {
            return Err(ConfigError::AttemptsMaxOutOfRange { value: self.attempts_max, max: ATTEMPTS_LIMIT });
        }
        Ok(())
    }

    /// The uncapped-then-capped backoff `d` after failed attempt `failed_attempt`
    /// (counting from 1), before jitter.
    pub fn backoff_ceiling(&self, failed_attempt: u32) -> Duration {
        let doublings = failed_attempt.saturating_sub(1).min(63);
        let factor = 1u64 << doublings;
        let initial_ns = u64::try_from(self.backoff_initial.as_nanos()).unwrap_or(u64::MAX);
        let max_ns = u64::try_from(self.backoff_max.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(initial_ns.saturating_mul(factor).min(max_ns))
    }

    /// The pause after failed attempt `failed_attempt`: `ceiling/2 + pick(ceiling/2)`,
    /// where `pick(bound)` returns a value in `0..=bound` (nanoseconds). Taking
    /// the random draw as a function keeps this exact and testable.
    pub fn backoff(&self, failed_attempt: u32, pick: impl FnOnce(u64) -> u64) -> Duration {
        let ceiling_ns = u64::try_from(self.backoff_ceiling(failed_attempt).as_nanos()).unwrap_or(u64::MAX);
        let half_ns = ceiling_ns / 2;
        let jitter_ns = pick(ceiling_ns - half_ns).min(ceiling_ns - half_ns);
        Duration::from_nanos(half_ns + jitter_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(value: u64) -> Duration {
        Duration::from_millis(value)
    }

    #[test]
    fn defaults_are_valid() {
        assert_eq!(WriterConfig::default().validate(), Ok(()));
    }

    #[test]
    fn every_bound_is_checked() {
        let base = WriterConfig::default();
        let with = |change: &dyn Fn(&mut WriterConfig)| {
            let mut config = base;
            change(&mut config);
            config.validate()
        };
        let cases: Vec<(&str, Result<(), ConfigError>)> = vec![
            ("queue 0", with(&|c| c.queue_events_max = 0)),
            ("queue over", with(&|c| c.queue_events_max = QUEUE_EVENTS_LIMIT + 1)),
            ("queue max", with(&|c| c.queue_events_max = QUEUE_EVENTS_LIMIT)),
            ("batch 0", with(&|c| c.batch_events_max = 0)),
            ("batch over limit", with(&|c| c.batch_events_max = BATCH_EVENTS_MAX + 1)),
            ("batch max", with(&|c| c.batch_events_max = BATCH_EVENTS_MAX)),
            (
                "batch over queue",
                with(&|c| {
                    c.queue_events_max = 10;
                    c.batch_events_max = 11;
                }),
            ),
            ("age 0", with(&|c| c.batch_age_max = Duration::ZERO)),
            ("age over", with(&|c| c.batch_age_max = BATCH_AGE_LIMIT + Duration::from_nanos(1))),
            ("age min", with(&|c| c.batch_age_max = BATCH_AGE_MIN)),
            ("backoff 0", with(&|c| c.retry.backoff_initial = Duration::ZERO)),
            ("backoff over", with(&|c| c.retry.backoff_initial = BACKOFF_INITIAL_LIMIT + ms(1))),
            (
                "backoff max below initial",
                with(&|c| {
                    c.retry.backoff_initial = ms(10);
                    c.retry.backoff_max = ms(9);
                }),
            ),
            ("backoff max over", with(&|c| c.retry.backoff_max = BACKOFF_LIMIT + ms(1))),
            ("attempts 0", with(&|c| c.retry.attempts_max = 0)),
            ("attempts over", with(&|c| c.retry.attempts_max = ATTEMPTS_LIMIT + 1)),
            ("attempts 1", with(&|c| c.retry.attempts_max = 1)),
        ];
        let expected: Vec<(&str, Result<(), ConfigError>)> = vec![
            ("queue 0", Err(ConfigError::QueueEventsMaxOutOfRange { value: 0, max: QUEUE_EVENTS_LIMIT })),
            (
                "queue over",
                Err(ConfigError::QueueEventsMaxOutOfRange { value: QUEUE_EVENTS_LIMIT + 1, max: QUEUE_EVENTS_LIMIT }),
            ),
            ("queue max", Ok(())),
            ("batch 0", Err(ConfigError::BatchEventsMaxOutOfRange { value: 0, max: BATCH_EVENTS_MAX })),
            (
                "batch over limit",
                Err(ConfigError::BatchEventsMaxOutOfRange { value: BATCH_EVENTS_MAX + 1, max: BATCH_EVENTS_MAX }),
            ),
            ("batch max", Ok(())),
            ("batch over queue", Err(ConfigError::BatchEventsMaxOutOfRange { value: 11, max: 10 })),
            (
                "age 0",
                Err(ConfigError::BatchAgeMaxOutOfRange {
                    value: Duration::ZERO,
                    min: BATCH_AGE_MIN,
                    max: BATCH_AGE_LIMIT,
                }),
            ),
            (
                "age over",
                Err(ConfigError::BatchAgeMaxOutOfRange {
                    value: BATCH_AGE_LIMIT + Duration::from_nanos(1),
                    min: BATCH_AGE_MIN,
                    max: BATCH_AGE_LIMIT,
                }),
            ),
            ("age min", Ok(())),
            (
                "backoff 0",
                Err(ConfigError::BackoffInitialOutOfRange {
                    value: Duration::ZERO,
                    min: BACKOFF_MIN,
                    max: BACKOFF_INITIAL_LIMIT,
                }),
            ),
            (
                "backoff over",
                Err(ConfigError::BackoffInitialOutOfRange {
                    value: BACKOFF_INITIAL_LIMIT + ms(1),
                    min: BACKOFF_MIN,
                    max: BACKOFF_INITIAL_LIMIT,
                }),
            ),
            (
                "backoff max below initial",
                Err(ConfigError::BackoffMaxOutOfRange { value: ms(9), min: ms(10), max: BACKOFF_LIMIT }),
            ),
            (
                "backoff max over",
                Err(ConfigError::BackoffMaxOutOfRange {
                    value: BACKOFF_LIMIT + ms(1),
                    min: RetryConfig::default().backoff_initial,
                    max: BACKOFF_LIMIT,
                }),
            ),
            ("attempts 0", Err(ConfigError::AttemptsMaxOutOfRange { value: 0, max: ATTEMPTS_LIMIT })),
            (
                "attempts over",
                Err(ConfigError::AttemptsMaxOutOfRange { value: ATTEMPTS_LIMIT + 1, max: ATTEMPTS_LIMIT }),
            ),
            ("attempts 1", Ok(())),
        ];
        assert_eq!(cases, expected);
    }

    #[test]
    fn backoff_doubles_up_to_its_cap_and_jitters_within_the_upper_half() {
        let retry = RetryConfig { backoff_initial: ms(100), backoff_max: ms(1_000), attempts_max: 10 };
        let ceilings: Vec<Duration> = (1..=6).map(|n| retry.backoff_ceiling(n)).collect();
        assert_eq!(ceilings, vec![ms(100), ms(200), ms(400), ms(800), ms(1_000), ms(1_000)]);
        // Shifts past 63 and products past u64 saturate at the cap.
        assert_eq!(retry.backoff_ceiling(u32::MAX), ms(1_000));

        assert_eq!(retry.backoff(1, |_| 0), ms(50));
        assert_eq!(retry.backoff(1, |bound| bound), ms(100));
        assert_eq!(retry.backoff(3, |bound| bound / 2), ms(300));
        // A draw out of range is clamped rather than trusted.
        assert_eq!(retry.backoff(5, |_| u64::MAX), ms(1_000));
        let odd = RetryConfig {
            backoff_initial: Duration::from_nanos(3),
            backoff_max: Duration::from_nanos(3),
            attempts_max: 1,
        };
        assert_eq!(odd.backoff(1, |_| 0), Duration::from_nanos(1));
        assert_eq!(odd.backoff(1, |bound| bound), Duration::from_nanos(3));
    }
}
