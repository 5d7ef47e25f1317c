//! The reclaim worker: settles leases whose `expiry + reclaim_grace` has passed.
//!
//! Every interval it runs bounded passes of at most the policy's batch size,
//! and runs another while a pass comes back full, up to a bounded number of
//! passes per tick so that one tick can never run forever. Stores settle each
//! lease at most once even with several reclaimers, so several servers on one
//! database may all run this worker.
//!
//! Each tick also purges expired idempotency records, in batches of at most
//! `IDEMPOTENCY_PURGE_BATCH_MAX` and at most `PASSES_PER_TICK_MAX` batches. An
//! expired record no longer answers retries whether purged or not, so purging
//! bounds storage, never behaviour.

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::{Interval, MissedTickBehavior};
use tollgate_core::Error;
use tollgate_store::{IDEMPOTENCY_PURGE_BATCH_MAX, ReclaimReport};

use crate::AppState;
use crate::metrics::ReclaimCounts;

/// The most passes one tick runs. With the largest batch bound this is ten
/// million leases per tick; what is left waits for the next tick.
pub const PASSES_PER_TICK_MAX: u32 = 100;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReclaimConfig {
    /// Time between ticks.
    pub interval: Duration,
}

/// One reclaim pass at the state's current time, bounded by the policy's batch
/// size, counted in the metrics. The admin route and the worker both use it.
pub async fn reclaim_pass(state: &AppState) -> Result<ReclaimReport, Error> {
    let now = state.now();
    let limit = state.store().policy().reclaim_batch_max();
    let result = state.store().reclaim(now, limit).await;
    match &result {
        Ok(report) => {
            if !report.skipped.is_empty() {
                // Once per pass, naming every skipped lease and why: the rows
                // stay as they are until an operator repairs them.
                let leases: Vec<String> = report
                    .skipped
                    .iter()
                    .map(|s| format!("{} (account {}): {}", s.lease_id, s.account_id, s.reason))
                    .collect();
                tracing::warn!(
                    skipped = report.skipped.len(),
                    leases = ?leases,
                    "reclaim skipped corrupt due leases; the rest were settled; run `tollgate check`"
                );
            }
            let counts =
                ReclaimCounts { reclaimed: report.reclaimed.len() as u64, skipped: report.skipped.len() as u64 };
            state.metrics().observe_reclaim_pass(Ok(counts), now);
        }
        Err(_) => state.metrics().observe_reclaim_pass(Err(()), now),
    }
    result
}

/// Passes until one comes back not full, or the per-tick bound is reached.
/// Returns how many leases were settled.
pub async fn reclaim_tick(state: &AppState) -> Result<u64, Error> {
    let mut settled = 0u64;
    for _ in 0..PASSES_PER_TICK_MAX {
        let report = reclaim_pass(state).await?;
        settled += report.reclaimed.len() as u64;
        if !report.is_full() {
            return Ok(settled);
        }
    }
    tracing::warn!(
        settled,
        passes = PASSES_PER_TICK_MAX,
        "reclaim tick hit its pass bound; the rest waits for the next tick"
    );
    Ok(settled)
}

/// One tick of the worker: compares the clocks (`clock_check`), then
/// reclaims unless this server's clock is too far from its storage's: a
/// clock running ahead would settle leases that other servers still honour.
pub async fn worker_tick(state: &AppState) -> Result<u64, Error> {
    if let Err(error) = crate::clock_check::check(state).await {
        tracing::warn!(code = error.code(), %error, "cannot read the database's clock; retrying next tick");
    }
    if state.clock_guard().refusal().is_some() {
        return Ok(0);
    }
    reclaim_tick(state).await
}

/// Purges expired idempotency records until a batch comes back not full, or
/// the per-tick bound is reached. Returns how many were purged.
pub async fn purge_tick(state: &AppState) -> Result<u64, Error> {
    let mut purged = 0u64;
    for _ in 0..PASSES_PER_TICK_MAX {
        let batch = state.store().purge_idempotency(state.now(), IDEMPOTENCY_PURGE_BATCH_MAX).await?;
        purged += u64::from(batch);
        if batch < IDEMPOTENCY_PURGE_BATCH_MAX {
            break;
        }
    }
    Ok(purged)
}

/// Runs ticks until `stop` turns true (or its sender is dropped). A tick in
/// progress finishes first, so no pass is cut off half way.
pub async fn run(state: AppState, config: ReclaimConfig, stop: watch::Receiver<bool>) {
    tick_until_stopped(tokio::time::interval(config.interval), stop, || async {
        match worker_tick(&state).await {
            Ok(0) => {}
            Ok(settled) => tracing::info!(settled, "reclaimed leases past expiry and grace"),
            Err(error) => tracing::warn!(code = error.code(), %error, "reclaim pass failed; retrying next tick"),
        }
        if let Err(error) = purge_tick(&state).await {
            tracing::warn!(code = error.code(), %error, "idempotency purge failed; retrying next tick");
        }
    })
    .await;
}

/// Awaits `tick` at every tick of `ticker` until `stop` turns true (or its
/// sender is dropped). A tick in progress finishes first, and ticks missed
/// while one ran are not made up in a burst: the background workers share
/// this loop so that they stop alike.
pub(crate) async fn tick_until_stopped<F>(
    mut ticker: Interval,
    mut stop: watch::Receiver<bool>,
    mut tick: impl FnMut() -> F,
) where
    F: Future<Output = ()>,
{
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            changed = stop.changed() => {
                if changed.is_err() || *stop.borrow() {
                    return;
                }
            }
            _ = ticker.tick() => tick().await,
        }
    }
}
