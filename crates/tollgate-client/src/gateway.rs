//! The gateway helper: one lease per account, spent locally, with usage
//! reported through the writer.
//!
//! A gateway worker serves many requests per lease. It checks each request
//! against the units left on the account's lease without a round trip, records
//! the usage against the lease's fence, and talks to Tollgate only to get a
//! lease, top it up, renew it before it expires, and hand it back at shutdown.
//!
//! **Usage before settlement.** A lease is settled (consolidated or released)
//! only after the writer has flushed every event recorded against it.
//! Otherwise the settlement would charge less than was used, and the late
//! events would be rejected as `lease_not_active`: usage served but never
//! billed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use tokio::time::Instant;
use tollgate_api::{LeaseBody, LeaseHandleBody, ReleaseResponse};
use tollgate_core::{Secret, UsageEvent};

use crate::http::{ClientError, TollgateClient};
use crate::stats::WriterStats;
use crate::writer::{Clock, RecordError, UsageWriter, WriterStopped};

/// How the gateway sizes and renews its leases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GatewayConfig {
    /// Units asked for when a lease is acquired or topped up. Larger leases
    /// mean fewer round trips and more units parked away from other workers.
    pub lease_units: u64,
    /// The TTL asked for; the server clamps it to its `max_ttl`.
    pub lease_ttl: SignedDuration,
    /// A lease whose expiry is closer than this is renewed (consolidated into
    /// a fresh one) before it is spent from again, and by `renew_due`. It
    /// must exceed the time a flush and a consolidation take, plus clock skew
    /// between gateway and server.
    pub renew_margin: SignedDuration,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        Self {
            lease_units: 1_000,
            lease_ttl: SignedDuration::from_secs(300),
            renew_margin: SignedDuration::from_secs(60),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GatewayConfigError {
    #[error("lease_units must be positive")]
    LeaseUnitsZero,
    #[error("lease_ttl must be positive")]
    LeaseTtlNotPositive,
    #[error("renew_margin must be nonnegative and shorter than lease_ttl")]
    RenewMarginOutOfRange,
}

impl GatewayConfig {
    pub fn validate(&self) -> Result<(), GatewayConfigError> {
        if self.lease_units == 0 {
            return Err(GatewayConfigError::LeaseUnitsZero);
        }
        if !self.lease_ttl.is_positive() {
            return Err(GatewayConfigError::LeaseTtlNotPositive);
        }
        if self.renew_margin.is_negative() || self.renew_margin >= self.lease_ttl {
            return Err(GatewayConfigError::RenewMarginOutOfRange);
        }
        Ok(())
    }
}

/// Why a spend was not allowed. In every case nothing was recorded and no
/// units were taken from the lease, so the caller should refuse the request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpendError {
    /// Getting, topping up or renewing the lease failed; `insufficient_balance`
    /// means the account has run out of prepaid units.
    #[error("lease for account {account_id}: {error}")]
    Lease { account_id: String, error: ClientError },
    /// The writer turned the event away (queue full or closed).
    #[error(transparent)]
    Record(#[from] RecordError),
    /// The usage of a lease could not be flushed before settling it.
    #[error(transparent)]
    Writer(#[from] WriterStopped),
    /// The gateway is shutting down.
    #[error("the gateway is shutting down")]
    Closed,
}

/// One request's usage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spend {
    pub account_id: String,
    pub credential_id: String,
    /// Unique per account forever: the idempotency key of the event.
    pub request_id: String,
    pub units: u64,
}

/// Where a spend was charged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpendReceipt {
    pub lease_id: String,
    pub fencing_token: u64,
    /// Units left on the lease after this spend.
    pub remaining: u64,
}

/// What `shutdown` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayReport {
    /// The writer's final counters: nothing queued or in flight.
    pub writer: WriterStats,
    pub released: Vec<ReleaseResponse>,
    /// Leases that could not be released; the server reclaims them after their
    /// expiry and grace, charging exactly the usage it received.
    pub unreleased: Vec<(String, ClientError)>,
}

/// A lease the gateway holds, and how much of it it has spent.
struct HeldLease {
    lease_id: String,
    capability: Secret,
    fencing_token: u64,
    granted: u64,
    spent: u64,
    expires_at: Timestamp,
}

impl HeldLease {
    fn from_body(body: LeaseBody) -> Self {
        Self {
            capability: Secret::new(body.capability.unwrap_or_default()),
            lease_id: body.lease_id,
            fencing_token: body.fencing_token,
            granted: body.granted,
            spent: 0,
            expires_at: body.expires_at,
        }
    }

    fn remaining(&self) -> u64 {
        self.granted.saturating_sub(self.spent)
    }

    fn handle(&self) -> LeaseHandleBody {
        LeaseHandleBody { lease_id: self.lease_id.clone(), capability: self.capability.expose().to_owned() }
    }
}

type Slot = Arc<tokio::sync::Mutex<Option<HeldLease>>>;

/// Holds a lease per account, spends from it locally and records usage
/// through a [`UsageWriter`] whose sink is the same server.
pub struct Gateway {
    client: TollgateClient,
    writer: UsageWriter,
    config: GatewayConfig,
    clock: Clock,
    /// One slot per account; the slot's async lock serialises spends and
    /// settlements of that account's lease, never of other accounts.
    slots: Mutex<HashMap<String, Slot>>,
    closed: AtomicBool,
}

impl Gateway {
    /// `client` must carry the gateway token; `writer` should deliver to the
    /// same server (usually a writer over a clone of `client`).
    pub fn new(client: TollgateClient, writer: UsageWriter, config: GatewayConfig) -> Result<Self, GatewayConfigError> {
        Self::with_clock(client, writer, config, Arc::new(Timestamp::now))
    }

    /// As `new`, with the clock used for expiry decisions and `occurred_at`.
    pub fn with_clock(
        client: TollgateClient,
        writer: UsageWriter,
        config: GatewayConfig,
        clock: Clock,
    ) -> Result<Self, GatewayConfigError> {
        config.validate()?;
        Ok(Self { client, writer, config, clock, slots: Mutex::new(HashMap::new()), closed: AtomicBool::new(false) })
    }

    pub fn writer(&self) -> &UsageWriter {
        &self.writer
    }

    fn slot(&self, account_id: &str) -> Slot {
        let mut slots = self.slots.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        slots.entry(account_id.to_owned()).or_default().clone()
    }

    fn all_slots(&self) -> Vec<(String, Slot)> {
        let slots = self.slots.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        slots.iter().map(|(account_id, slot)| (account_id.clone(), slot.clone())).collect()
    }

    /// Whether `lease` is within `renew_margin` of its expiry at `now`. An
    /// expiry too early to subtract the margin from is due.
    fn is_due(&self, lease: &HeldLease, now: Timestamp) -> bool {
        lease.expires_at.checked_sub(self.config.renew_margin).ok().is_none_or(|renew_at| renew_at <= now)
    }

    /// Charges `spend` to the account's lease, getting, topping up or renewing
    /// the lease first when needed, and records the usage event. On `Ok` the
    /// request may be served.
    pub async fn spend(&self, spend: Spend) -> Result<SpendReceipt, SpendError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(SpendError::Closed);
        }
        let slot = self.slot(&spend.account_id);
        let mut held = slot.lock().await;
        let now = (self.clock)();
        let lease_error = |error| SpendError::Lease { account_id: spend.account_id.clone(), error };

        let renew = held.as_ref().is_some_and(|lease| self.is_due(lease, now));
        let short = held.as_ref().is_some_and(|lease| lease.remaining() < spend.units);
        if held.is_none() {
            let units = self.config.lease_units.max(spend.units);
            let body =
                self.client.acquire(&spend.account_id, units, self.config.lease_ttl).await.map_err(lease_error)?;
            *held = Some(HeldLease::from_body(body));
        } else if let Some(lease) = held.as_ref().filter(|_| renew || short) {
            let extra_units = if short { self.config.lease_units.max(spend.units - lease.remaining()) } else { 0 };
            // On failure the old lease stays held: a refused consolidation
            // changed nothing, so it can still be spent from.
            let renewed = self.settle_into_new(&spend.account_id, lease, extra_units, spend.units).await?;
            *held = Some(renewed);
        }
        let lease = held.as_mut().expect("a lease is held after the steps above");

        let event = UsageEvent {
            request_id: spend.request_id,
            account_id: spend.account_id,
            credential_id: spend.credential_id,
            units: spend.units,
            occurred_at: now,
            lease_id: Some(lease.lease_id.clone()),
            fencing_token: Some(lease.fencing_token),
        };
        self.writer.record(event)?;
        lease.spent += spend.units;
        Ok(SpendReceipt {
            lease_id: lease.lease_id.clone(),
            fencing_token: lease.fencing_token,
            remaining: lease.remaining(),
        })
    }

    /// Flushes the lease's usage, then consolidates it into a fresh lease with
    /// `extra_units` more. A fully spent lease with nothing to add is released
    /// and a new one acquired instead, and so is a lease the server already
    /// settled or expired.
    async fn settle_into_new(
        &self,
        account_id: &str,
        lease: &HeldLease,
        extra_units: u64,
        needed_units: u64,
    ) -> Result<HeldLease, SpendError> {
        let lease_error = |error| SpendError::Lease { account_id: account_id.to_owned(), error };
        self.writer.flush().await?;
        if lease.remaining() == 0 && extra_units == 0 {
            // Consolidating nothing into nothing is invalid; a fully spent
            // lease is simply handed back and a new one taken. A failed release
            // costs nothing: its usage is flushed, and reclaim settles it later.
            let _ = self.client.release(&lease.lease_id, lease.capability.expose()).await;
            let units = self.config.lease_units.max(needed_units);
            let body = self.client.acquire(account_id, units, self.config.lease_ttl).await.map_err(lease_error)?;
            return Ok(HeldLease::from_body(body));
        }
        match self.client.consolidate(account_id, vec![lease.handle()], extra_units, self.config.lease_ttl).await {
            Ok(consolidated) => Ok(HeldLease::from_body(consolidated.lease)),
            Err(error) if matches!(error.code(), "lease_expired" | "lease_not_active" | "lease_not_found") => {
                // The server settled it already (reclaim after expiry and
                // grace); its units are back in the pool. Start afresh.
                let units = self.config.lease_units.max(needed_units);
                let body = self.client.acquire(account_id, units, self.config.lease_ttl).await.map_err(lease_error)?;
                Ok(HeldLease::from_body(body))
            }
            Err(error) => Err(lease_error(error)),
        }
    }

    /// Renews every held lease whose expiry is within `renew_margin`, keeping
    /// its unspent units. Call it on an interval shorter than the margin so
    /// that idle accounts' leases do not run out. Returns how many were renewed.
    pub async fn renew_due(&self) -> Result<usize, SpendError> {
        let mut renewed = 0;
        for (account_id, slot) in self.all_slots() {
            let mut held = slot.lock().await;
            let now = (self.clock)();
            let due = held.as_ref().is_some_and(|lease| self.is_due(lease, now));
            if !due {
                continue;
            }
            let lease = held.as_ref().expect("checked above");
            if lease.remaining() == 0 {
                // Nothing to carry: hand it back and let the next spend acquire.
                // As above, a failed release is settled by reclaim later.
                self.writer.flush().await?;
                let _ = self.client.release(&lease.lease_id, lease.capability.expose()).await;
                *held = None;
            } else {
                let renewed = self.settle_into_new(&account_id, lease, 0, 0).await?;
                *held = Some(renewed);
            }
            renewed += 1;
        }
        Ok(renewed)
    }

    /// Stops spending, delivers the recorded usage (within `timeout`, the rest
    /// reported lost by the writer), then releases every held lease so its
    /// unspent units return to the account at once instead of after expiry.
    pub async fn shutdown(&self, timeout: Duration) -> Result<GatewayReport, WriterStopped> {
        self.closed.store(true, Ordering::Release);
        let deadline = Instant::now().checked_add(timeout);
        let writer = self.writer.shutdown(timeout).await?;
        let mut released = Vec::new();
        let mut unreleased = Vec::new();
        for (_, slot) in self.all_slots() {
            let Some(lease) = slot.lock().await.take() else { continue };
            let release = self.client.release(&lease.lease_id, lease.capability.expose());
            let result = match deadline {
                Some(deadline) => tokio::time::timeout_at(deadline, release).await.unwrap_or_else(|_| {
                    Err(ClientError {
                        kind: crate::http::ClientErrorKind::Timeout,
                        status: None,
                        code: "timeout".into(),
                        message: "the shutdown deadline passed before the lease was released".into(),
                        retryable: true,
                    })
                }),
                None => release.await,
            };
            match result {
                Ok(response) => released.push(response),
                Err(error) => unreleased.push((lease.lease_id, error)),
            }
        }
        Ok(GatewayReport { writer, released, unreleased })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configuration_is_validated() {
        let base = GatewayConfig::default();
        assert_eq!(base.validate(), Ok(()));
        let cases = [
            (GatewayConfig { lease_units: 0, ..base }, GatewayConfigError::LeaseUnitsZero),
            (GatewayConfig { lease_ttl: SignedDuration::ZERO, ..base }, GatewayConfigError::LeaseTtlNotPositive),
            (
                GatewayConfig { renew_margin: SignedDuration::from_secs(-1), ..base },
                GatewayConfigError::RenewMarginOutOfRange,
            ),
            (GatewayConfig { renew_margin: base.lease_ttl, ..base }, GatewayConfigError::RenewMarginOutOfRange),
        ];
        for (config, error) in cases {
            assert_eq!(config.validate(), Err(error));
        }
    }
}
