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
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use tokio::sync::watch;
use tokio::time::Instant;
use tollgate_api::{LeaseBody, LeaseHandleBody, ReleaseResponse};
use tollgate_core::{Dimensions, Secret, UsageEvent};

use crate::http::{ClientError, ClientErrorKind, TollgateClient};
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
    /// What the spend is about (`{"model": "gpt-4o"}`), reported with its
    /// event; see `UsageEvent::dimensions` for the rule.
    pub dimensions: Dimensions,
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
    /// Leases that could not be released, by lease id (or by account id for a
    /// lease operation whose answer was never heard); the server reclaims them
    /// after their expiry and grace, charging exactly the usage it received.
    pub unreleased: Vec<(String, ClientError)>,
}

/// A lease the gateway holds, and how much of it it has spent.
struct HeldLease {
    /// The account the lease belongs to, which every route that names the
    /// lease names too.
    account_id: String,
    lease_id: String,
    capability: Secret,
    fencing_token: u64,
    granted: u64,
    spent: u64,
    /// When the gateway renews it: `renew_margin` before expiry, or half
    /// way through the granted TTL when the server granted less than twice
    /// the margin (its `max_ttl` clamps what is asked for). Otherwise a short
    /// grant would be due at once and every spend would renew it.
    renew_at: Timestamp,
    /// The writer's number of the last usage event recorded against this
    /// lease (0 for none): what must be delivered before it is settled.
    last_recorded: u64,
}

impl HeldLease {
    fn from_body(body: LeaseBody, now: Timestamp, renew_margin: SignedDuration) -> Self {
        let granted_ttl = body.expires_at.duration_since(now);
        let margin = renew_margin.min(granted_ttl / 2).max(SignedDuration::ZERO);
        Self {
            // An expiry too early to subtract the margin from is due.
            renew_at: body.expires_at.checked_sub(margin).unwrap_or(Timestamp::MIN),
            capability: Secret::new(body.capability.unwrap_or_default()),
            account_id: body.account_id,
            lease_id: body.lease_id,
            fencing_token: body.fencing_token,
            granted: body.granted,
            spent: 0,
            last_recorded: 0,
        }
    }

    fn remaining(&self) -> u64 {
        self.granted.saturating_sub(self.spent)
    }

    /// Releases the lease on its account's route.
    async fn release(&self, client: &TollgateClient) -> Result<ReleaseResponse, ClientError> {
        client.release(&self.account_id, &self.lease_id, self.capability.expose()).await
    }

    fn handle(&self) -> LeaseHandleBody {
        LeaseHandleBody { lease_id: self.lease_id.clone(), capability: self.capability.expose().to_owned() }
    }
}

/// A lease operation sent to the server whose answer has not been heard: lost,
/// timed out, or abandoned because the caller dropped the future. It keeps the
/// idempotency key, so asking again with the same request and key either
/// replays the server's recorded answer (it was applied) or applies it now
/// (it never arrived). Until then the account's old lease is *not* spent from:
/// the server may have settled it, and usage against it would be rejected
/// `lease_not_active`, served but never billed.
enum Pending {
    Acquire { key: String, units: u64 },
    Consolidate { key: String, source: HeldLease, extra_units: u64 },
}

/// What the gateway holds for one account.
#[derive(Default)]
struct SlotState {
    lease: Option<HeldLease>,
    pending: Option<Pending>,
}

type Slot = Arc<tokio::sync::Mutex<SlotState>>;

/// A definite refusal: the server answered with its error body and said that
/// sending it again cannot succeed, so the request changed nothing. Every
/// other failure (transport, timeout, a retryable status, an unreadable
/// answer) leaves it unknown whether the request was applied.
fn is_definite_refusal(error: &ClientError) -> bool {
    error.kind == ClientErrorKind::Api && !error.retryable
}

/// The codes with which the server refuses to settle a lease it settled
/// already (consolidated, released or reclaimed).
fn is_already_settled(error: &ClientError) -> bool {
    matches!(error.code(), "lease_expired" | "lease_not_active" | "lease_not_found")
}

/// What `renew_due` did: the leases renewed, and the accounts whose renewal
/// failed (the others are renewed regardless).
#[derive(Debug, Default)]
pub struct RenewReport {
    pub renewed: usize,
    pub failed: Vec<(String, SpendError)>,
}

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
    /// Set by `shutdown`; spends and renewals in progress stop at their next
    /// wait.
    closing: watch::Sender<bool>,
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
        Ok(Self {
            client,
            writer,
            config,
            clock,
            slots: Mutex::new(HashMap::new()),
            closing: watch::Sender::new(false),
        })
    }

    pub fn writer(&self) -> &UsageWriter {
        &self.writer
    }

    /// How many accounts the gateway keeps a slot for: those holding a lease
    /// or a pending lease operation, and those in use right now.
    pub fn accounts_tracked(&self) -> usize {
        self.slots.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).len()
    }

    fn slot(&self, account_id: &str) -> Slot {
        let mut slots = self.slots.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        slots.entry(account_id.to_owned()).or_default().clone()
    }

    fn all_slots(&self) -> Vec<(String, Slot)> {
        let slots = self.slots.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        slots.iter().map(|(account_id, slot)| (account_id.clone(), slot.clone())).collect()
    }

    /// Whether `lease` has reached its renewal point at `now`.
    fn is_due(&self, lease: &HeldLease, now: Timestamp) -> bool {
        lease.renew_at <= now
    }

    /// Charges `spend` to the account's lease, getting, topping up or renewing
    /// the lease first when needed, and records the usage event. On `Ok` the
    /// request may be served.
    ///
    /// A lease operation whose answer was not heard (see [`Pending`]) is asked
    /// again, under its idempotency key, before anything is spent; while the
    /// answer stays unclear every spend of the account fails.
    ///
    /// `shutdown` cuts a spend off wherever it waits (for the account, the
    /// writer or the server); a lease operation it interrupts stays pending
    /// and `shutdown` settles it.
    pub async fn spend(&self, spend: Spend) -> Result<SpendReceipt, SpendError> {
        let mut closing = self.closing.subscribe();
        if *closing.borrow_and_update() {
            return Err(SpendError::Closed);
        }
        let account_id = spend.account_id.clone();
        let result = tokio::select! {
            result = self.spend_until_closed(spend) => result,
            _ = closing.wait_for(|closed| *closed) => Err(SpendError::Closed),
        };
        self.forget_if_idle(&account_id);
        result
    }

    /// Drops the account's slot when it holds nothing and nobody uses it, so
    /// that the map does not grow with every account id ever passed. Clones
    /// of a slot are only made under the map's lock, so none can appear
    /// while this looks.
    fn forget_if_idle(&self, account_id: &str) {
        let mut slots = self.slots.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let idle = slots.get(account_id).is_some_and(|slot| {
            Arc::strong_count(slot) == 1
                && slot.try_lock().is_ok_and(|state| state.lease.is_none() && state.pending.is_none())
        });
        if idle {
            slots.remove(account_id);
        }
    }

    async fn spend_until_closed(&self, spend: Spend) -> Result<SpendReceipt, SpendError> {
        let slot = self.slot(&spend.account_id);
        let mut state = slot.lock().await;
        let account_id = spend.account_id.clone();
        let lease_error = |error| SpendError::Lease { account_id: account_id.clone(), error };
        self.resolve_pending(&spend.account_id, &mut state).await.map_err(lease_error)?;
        let now = (self.clock)();

        let renew = state.lease.as_ref().is_some_and(|lease| self.is_due(lease, now));
        let short = state.lease.as_ref().is_some_and(|lease| lease.remaining() < spend.units);
        if let Some(lease) = state.lease.as_ref().filter(|_| renew || short) {
            let extra_units = if short { self.config.lease_units.max(spend.units - lease.remaining()) } else { 0 };
            self.settle_into_new(&spend.account_id, &mut state, extra_units).await?;
        }
        if state.lease.is_none() {
            let units = self.config.lease_units.max(spend.units);
            let key = crate::http::new_idempotency_key();
            state.pending = Some(Pending::Acquire { key, units });
            self.resolve_pending(&spend.account_id, &mut state).await.map_err(lease_error)?;
        }
        let lease = state.lease.as_mut().expect("a lease is held after the steps above");

        let event = UsageEvent {
            request_id: spend.request_id,
            account_id: spend.account_id,
            credential_id: spend.credential_id,
            units: spend.units,
            occurred_at: now,
            lease_id: Some(lease.lease_id.clone()),
            fencing_token: Some(lease.fencing_token),
            dimensions: spend.dimensions,
        };
        lease.last_recorded = self.writer.record_numbered(event)?;
        lease.spent += spend.units;
        Ok(SpendReceipt {
            lease_id: lease.lease_id.clone(),
            fencing_token: lease.fencing_token,
            remaining: lease.remaining(),
        })
    }

    /// Sends the pending operation of the slot, if any, under its key, and
    /// applies the answer: a lease on success; on a definite refusal nothing
    /// changed, so a consolidation's source lease is held again (unless the
    /// server says it was settled already); on any other failure the operation
    /// stays pending and the error is returned.
    async fn resolve_pending(&self, account_id: &str, state: &mut SlotState) -> Result<(), ClientError> {
        let ttl = self.config.lease_ttl;
        let answer = match &state.pending {
            None => return Ok(()),
            Some(Pending::Acquire { key, units }) => self.client.acquire_keyed(key, account_id, *units, ttl).await,
            Some(Pending::Consolidate { key, source, extra_units }) => self
                .client
                .consolidate_keyed(key, account_id, vec![source.handle()], *extra_units, ttl)
                .await
                .map(|consolidated| consolidated.lease),
        };
        match answer {
            Ok(body) => {
                state.pending = None;
                state.lease = Some(HeldLease::from_body(body, (self.clock)(), self.config.renew_margin));
                Ok(())
            }
            Err(error) if is_definite_refusal(&error) => {
                if let Some(Pending::Consolidate { source, .. }) = state.pending.take()
                    && !is_already_settled(&error)
                {
                    state.lease = Some(source);
                }
                Err(error)
            }
            Err(error) => Err(error),
        }
    }

    /// Delivers the usage recorded against the held lease (not what other
    /// accounts recorded since), then consolidates it into a fresh lease
    /// with `extra_units` more. The lease leaves the slot before the request
    /// is sent, so that a lost answer or a dropped future can never leave a
    /// lease the server has settled in the slot. A fully spent lease with
    /// nothing to add is released instead, and the slot left empty; so is a
    /// lease the server already settled or expired. On return the slot holds a
    /// lease, holds none (the caller acquires), or holds the pending request.
    async fn settle_into_new(
        &self,
        account_id: &str,
        state: &mut SlotState,
        extra_units: u64,
    ) -> Result<(), SpendError> {
        let lease_error = |error| SpendError::Lease { account_id: account_id.to_owned(), error };
        let last_recorded = state.lease.as_ref().map_or(0, |lease| lease.last_recorded);
        self.writer.flush_through(last_recorded).await?;
        let lease = state.lease.take().expect("the caller checked that a lease is held");
        if lease.remaining() == 0 && extra_units == 0 {
            // Consolidating nothing into nothing is invalid; a fully spent
            // lease is simply handed back and a new one taken. A failed release
            // costs nothing: its usage is flushed, and reclaim settles it later.
            let _ = lease.release(&self.client).await;
            return Ok(());
        }
        let key = crate::http::new_idempotency_key();
        state.pending = Some(Pending::Consolidate { key, source: lease, extra_units });
        match self.resolve_pending(account_id, state).await {
            Ok(()) => Ok(()),
            // The server settled it already (reclaim after expiry and grace);
            // its units are back in the pool. The caller starts afresh.
            Err(error) if is_already_settled(&error) && state.lease.is_none() && state.pending.is_none() => Ok(()),
            Err(error) => Err(lease_error(error)),
        }
    }

    /// Renews every held lease whose expiry is within `renew_margin`, keeping
    /// its unspent units, and asks again any lease operation whose answer was
    /// not heard. Call it on an interval shorter than the margin so that idle
    /// accounts' leases do not run out. An account that fails does not stop
    /// the others.
    pub async fn renew_due(&self) -> RenewReport {
        let mut report = RenewReport::default();
        for (account_id, slot) in self.all_slots() {
            let mut closing = self.closing.subscribe();
            if *closing.borrow_and_update() {
                break;
            }
            let renewal = self.renew_account(&account_id, &slot);
            let result = tokio::select! {
                result = renewal => result,
                _ = closing.wait_for(|closed| *closed) => break,
            };
            match result {
                Ok(renewed) => report.renewed += usize::from(renewed),
                Err(error) => report.failed.push((account_id, error)),
            }
        }
        report
    }

    /// `renew_due` for one account: whether a lease was renewed (or a pending
    /// operation answered).
    async fn renew_account(&self, account_id: &str, slot: &Slot) -> Result<bool, SpendError> {
        {
            let mut state = slot.lock().await;
            let had_pending = state.pending.is_some();
            self.resolve_pending(account_id, &mut state)
                .await
                .map_err(|error| SpendError::Lease { account_id: account_id.to_owned(), error })?;
            let now = (self.clock)();
            let due = state.lease.as_ref().is_some_and(|lease| self.is_due(lease, now));
            if !due {
                return Ok(had_pending);
            }
            self.settle_into_new(account_id, &mut state, 0).await?;
            Ok(true)
        }
    }

    /// Stops spending, delivers the recorded usage (within `timeout`, the rest
    /// reported lost by the writer), asks again any lease operation whose
    /// answer was not heard, then releases every held lease so its unspent
    /// units return to the account at once instead of after expiry. Every step
    /// is bounded by the one deadline.
    pub async fn shutdown(&self, timeout: Duration) -> Result<GatewayReport, WriterStopped> {
        self.closing.send_replace(true);
        let deadline = Instant::now().checked_add(timeout);
        let writer = self.writer.shutdown(timeout).await?;
        let mut released = Vec::new();
        let mut unreleased = Vec::new();
        for (account_id, slot) in self.all_slots() {
            let Some(mut state) = within(deadline, slot.lock()).await else {
                unreleased.push((account_id, shutdown_timeout("a spend in progress let go of the account")));
                continue;
            };
            if state.pending.is_some() {
                match within(deadline, self.resolve_pending(&account_id, &mut state)).await {
                    // Granted (now held, released below) or definitely refused.
                    Some(Ok(())) => {}
                    Some(Err(_)) if state.pending.is_none() => {}
                    Some(Err(error)) => unreleased.push((account_id.clone(), error)),
                    None => unreleased.push((account_id.clone(), shutdown_timeout("a lease operation was answered"))),
                }
            }
            let Some(lease) = state.lease.take() else { continue };
            let release = lease.release(&self.client);
            let result =
                within(deadline, release).await.unwrap_or_else(|| Err(shutdown_timeout("the lease was released")));
            match result {
                Ok(response) => released.push(response),
                Err(error) => unreleased.push((lease.lease_id, error)),
            }
        }
        Ok(GatewayReport { writer, released, unreleased })
    }
}

/// `step`, cut off at `deadline` (`None` when it passed first).
async fn within<T>(deadline: Option<Instant>, step: impl Future<Output = T>) -> Option<T> {
    match deadline {
        Some(deadline) => tokio::time::timeout_at(deadline, step).await.ok(),
        None => Some(step.await),
    }
}

/// The error of a shutdown step cut off by its deadline.
fn shutdown_timeout(step: &str) -> ClientError {
    ClientError {
        kind: ClientErrorKind::Timeout,
        status: None,
        code: "timeout".into(),
        message: format!("the shutdown deadline passed before {step}"),
        retryable: true,
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
