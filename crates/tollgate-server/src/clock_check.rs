//! The check that this server's clock agrees with its storage's.
//!
//! Servers sharing a database each decide expiries and the reclaim boundary
//! with their own clock. A clock running ahead would reclaim leases that the
//! other servers still honour, and the usage reported against them would
//! then be rejected: units lost. So, where the store has a shared clock
//! (`Store::shared_clock`: PostgreSQL's), the server compares it with its own
//! at startup and on every reclaim tick. While the clocks are certainly
//! further apart than the bound (`tollgate_core::ClockSample::exceeds`), the
//! server does not serve: `/readyz` answers 503 with the offset, every `/v1`
//! request answers 503 `clock_skew`, and the reclaim worker skips its passes.
//! The offset is exported as a metric, and each change between in and out of
//! bounds is logged once. The memory store has no shared clock and is never
//! held back.

use std::sync::Mutex;

use jiff::SignedDuration;
use tollgate_core::{ClockSample, Error};

use crate::AppState;

/// Samples taken per check; the most certain one counts.
pub const SAMPLES_PER_CHECK: usize = 3;

/// The bound used when none is configured: one second, well inside the
/// default reclaim grace of thirty.
pub const OFFSET_MAX_DEFAULT: SignedDuration = SignedDuration::from_secs(1);

/// What the last check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockStatus {
    pub sample: ClockSample,
    pub bound: SignedDuration,
}

impl ClockStatus {
    pub fn skewed(&self) -> bool {
        self.sample.exceeds(self.bound)
    }

    /// Why the server is not serving, for logs, `/readyz` and error bodies.
    pub fn explain(&self) -> String {
        format!(
            "this server's clock is {} from the database's (± {}), beyond the bound of {}; \
             fix its time synchronisation (it serves again once within the bound)",
            self.sample.offset, self.sample.uncertainty, self.bound
        )
    }
}

/// The bound and the last status; shared by every handler of one server.
pub struct ClockGuard {
    bound: Mutex<SignedDuration>,
    last: Mutex<Option<ClockStatus>>,
}

impl Default for ClockGuard {
    fn default() -> Self {
        Self { bound: Mutex::new(OFFSET_MAX_DEFAULT), last: Mutex::new(None) }
    }
}

impl ClockGuard {
    pub fn set_bound(&self, bound: SignedDuration) {
        *self.bound.lock().unwrap_or_else(|p| p.into_inner()) = bound;
    }

    pub fn bound(&self) -> SignedDuration {
        *self.bound.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The last status, if the store has a shared clock and was checked.
    pub fn last(&self) -> Option<ClockStatus> {
        *self.last.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Why the server must not serve now, if it must not.
    pub fn refusal(&self) -> Option<String> {
        self.last().filter(ClockStatus::skewed).map(|status| status.explain())
    }

    fn record(&self, status: ClockStatus) -> Option<ClockStatus> {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).replace(status)
    }
}

/// Compares the clocks now and records the result; returns it (`None` when
/// the store has no shared clock). A storage error leaves the last status as
/// it was: the next check tries again.
pub async fn check(state: &AppState) -> Result<Option<ClockStatus>, Error> {
    let mut samples = Vec::with_capacity(SAMPLES_PER_CHECK);
    for _ in 0..SAMPLES_PER_CHECK {
        let before = state.now();
        let Some(storage) = state.store().shared_clock().await? else {
            return Ok(None);
        };
        let after = state.now();
        samples.extend(ClockSample::new(before, storage, after));
    }
    let Some(sample) = ClockSample::best(samples) else {
        // Every sample saw this server's clock step back; try next time.
        return Ok(None);
    };
    let guard = state.clock_guard();
    let status = ClockStatus { sample, bound: guard.bound() };
    let previous = guard.record(status);
    state.metrics().observe_clock(&status);
    match (previous.is_some_and(|p| p.skewed()), status.skewed()) {
        (false, true) => tracing::error!("not serving: {}", status.explain()),
        (true, false) => tracing::info!(
            offset = %status.sample.offset,
            bound = %status.bound,
            "serving again: this server's clock is within the bound of the database's"
        ),
        _ => {}
    }
    Ok(Some(status))
}
