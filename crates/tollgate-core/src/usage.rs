//! Usage classification: every event of a batch is accepted, duplicate or rejected,
//! exactly once, in batch order.
//!
//! 1. An event is a duplicate when its `(account_id, request_id)` was already
//!    accepted, in storage or earlier in the batch. This test precedes payload
//!    validation, so a replay that changes its units or funding is still a
//!    duplicate.
//! 2. Otherwise an invalid event is rejected with a reason. A rejected event does
//!    not claim its request ID; a corrected event with that ID can be accepted.
//! 3. Otherwise it is accepted. Only accepted events change lease usage, the
//!    account's `billed` and `overage`, and credential activity.
//!
//! If the accepted events would overflow any counter, the whole batch is refused
//! and nothing is applied. Sums do not depend on order, so this holds in every
//! event order.

use std::collections::{BTreeMap, HashMap, HashSet};

use jiff::Timestamp;

use crate::error::IngestError;
use crate::ids::is_valid_request_id;
use crate::ledger::{Account, Credential, Lease, LeaseState};
use crate::time::GrantPolicy;
use crate::units::UnitDomain;
use crate::BATCH_EVENTS_MAX;

/// One reported usage event. Funding is a lease and its fence together, or
/// neither (overage, billed after the fact).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageEvent {
    pub request_id: String,
    pub account_id: String,
    pub credential_id: String,
    pub units: u64,
    pub occurred_at: Timestamp,
    pub lease_id: Option<String>,
    pub fencing_token: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RejectReason {
    InvalidRequestId,
    UnitsOutOfRange,
    UnknownAccount,
    UnknownCredential,
    CredentialAccountMismatch,
    CredentialRevoked,
    FundingIncomplete,
    UnknownLease,
    FenceMismatch,
    LeaseNotActive,
    LeaseExpired,
}

impl RejectReason {
    pub const ALL: [RejectReason; 11] = [
        RejectReason::InvalidRequestId,
        RejectReason::UnitsOutOfRange,
        RejectReason::UnknownAccount,
        RejectReason::UnknownCredential,
        RejectReason::CredentialAccountMismatch,
        RejectReason::CredentialRevoked,
        RejectReason::FundingIncomplete,
        RejectReason::UnknownLease,
        RejectReason::FenceMismatch,
        RejectReason::LeaseNotActive,
        RejectReason::LeaseExpired,
    ];

    pub fn code(self) -> &'static str {
        match self {
            RejectReason::InvalidRequestId => "invalid_request_id",
            RejectReason::UnitsOutOfRange => "units_out_of_range",
            RejectReason::UnknownAccount => "unknown_account",
            RejectReason::UnknownCredential => "unknown_credential",
            RejectReason::CredentialAccountMismatch => "credential_account_mismatch",
            RejectReason::CredentialRevoked => "credential_revoked",
            RejectReason::FundingIncomplete => "funding_incomplete",
            RejectReason::UnknownLease => "unknown_lease",
            RejectReason::FenceMismatch => "fence_mismatch",
            RejectReason::LeaseNotActive => "lease_not_active",
            RejectReason::LeaseExpired => "lease_expired",
        }
    }

    pub fn parse(code: &str) -> Option<Self> {
        RejectReason::ALL.into_iter().find(|reason| reason.code() == code)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    Accepted,
    Duplicate,
    Rejected(RejectReason),
}

impl Outcome {
    pub fn code(self) -> &'static str {
        match self {
            Outcome::Accepted => "accepted",
            Outcome::Duplicate => "duplicate",
            Outcome::Rejected(_) => "rejected",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventOutcome {
    pub request_id: String,
    pub outcome: Outcome,
}

/// The stored state classification reads. Stores implement it over whatever they
/// loaded for the batch; it must cover every account, lease, credential and
/// request ID the batch names.
pub trait UsageView {
    /// Whether `(account_id, request_id)` was accepted by an earlier batch.
    fn is_recorded(&self, account_id: &str, request_id: &str) -> bool;
    fn account(&self, account_id: &str) -> Option<&Account>;
    fn lease(&self, lease_id: &str) -> Option<&Lease>;
    fn credential(&self, credential_id: &str) -> Option<&Credential>;
}

/// A `UsageView` over owned maps, for stores that load a batch's state up front.
#[derive(Debug, Clone, Default)]
pub struct UsageSnapshot {
    pub recorded: HashSet<(String, String)>,
    pub accounts: HashMap<String, Account>,
    pub leases: HashMap<String, Lease>,
    pub credentials: HashMap<String, Credential>,
}

impl UsageView for UsageSnapshot {
    fn is_recorded(&self, account_id: &str, request_id: &str) -> bool {
        self.recorded.contains(&(account_id.to_owned(), request_id.to_owned()))
    }

    fn account(&self, account_id: &str) -> Option<&Account> {
        self.accounts.get(account_id)
    }

    fn lease(&self, lease_id: &str) -> Option<&Lease> {
        self.leases.get(lease_id)
    }

    fn credential(&self, credential_id: &str) -> Option<&Credential> {
        self.credentials.get(credential_id)
    }
}

/// What a store persists for a classified batch: the outcomes, the accepted events
/// (as indices into the batch, in order), and the new value of every account, lease
/// and credential an accepted event touched.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IngestPlan {
    pub outcomes: Vec<EventOutcome>,
    pub accepted: Vec<usize>,
    pub accounts: BTreeMap<String, Account>,
    pub leases: BTreeMap<String, Lease>,
    pub credentials: BTreeMap<String, Credential>,
}

/// Classifies `batch` at `now` against `view`.
pub fn classify(
    batch: &[UsageEvent],
    now: Timestamp,
    policy: &GrantPolicy,
    domain: UnitDomain,
    view: &impl UsageView,
) -> Result<IngestPlan, IngestError> {
    if batch.len() > BATCH_EVENTS_MAX {
        return Err(IngestError::BatchTooLarge { events: batch.len(), max: BATCH_EVENTS_MAX });
    }
    let mut plan = IngestPlan { outcomes: Vec::with_capacity(batch.len()), ..IngestPlan::default() };
    let mut claimed: HashSet<(&str, &str)> = HashSet::new();
    for (index, event) in batch.iter().enumerate() {
        let key = (event.account_id.as_str(), event.request_id.as_str());
        let outcome = if claimed.contains(&key) || view.is_recorded(key.0, key.1) {
            Outcome::Duplicate
        } else {
            match validate(event, now, policy, domain, view) {
                Err(reason) => Outcome::Rejected(reason),
                Ok(()) => {
                    apply(&mut plan, event, domain, view)?;
                    claimed.insert(key);
                    plan.accepted.push(index);
                    Outcome::Accepted
                }
            }
        };
        plan.outcomes.push(EventOutcome { request_id: event.request_id.clone(), outcome });
    }
    Ok(plan)
}

fn validate(
    event: &UsageEvent,
    now: Timestamp,
    policy: &GrantPolicy,
    domain: UnitDomain,
    view: &impl UsageView,
) -> Result<(), RejectReason> {
    if !is_valid_request_id(&event.request_id) {
        return Err(RejectReason::InvalidRequestId);
    }
    if !domain.contains(event.units) {
        return Err(RejectReason::UnitsOutOfRange);
    }
    if view.account(&event.account_id).is_none() {
        return Err(RejectReason::UnknownAccount);
    }
    let credential = view.credential(&event.credential_id).ok_or(RejectReason::UnknownCredential)?;
    if credential.account_id != event.account_id {
        return Err(RejectReason::CredentialAccountMismatch);
    }
    if credential.is_revoked_at(event.occurred_at) {
        return Err(RejectReason::CredentialRevoked);
    }
    match (&event.lease_id, event.fencing_token) {
        (None, None) => Ok(()),
        (Some(_), None) | (None, Some(_)) => Err(RejectReason::FundingIncomplete),
        (Some(lease_id), Some(fencing_token)) => {
            let lease = view
                .lease(lease_id)
                .filter(|lease| lease.account_id == event.account_id)
                .ok_or(RejectReason::UnknownLease)?;
            if lease.fencing_token != fencing_token {
                return Err(RejectReason::FenceMismatch);
            }
            if lease.state != LeaseState::Active {
                return Err(RejectReason::LeaseNotActive);
            }
            if policy.is_reclaimable(lease.expiry, now) {
                return Err(RejectReason::LeaseExpired);
            }
            Ok(())
        }
    }
}

/// Applies one accepted event to the plan's copies of the state it touches.
fn apply(plan: &mut IngestPlan, event: &UsageEvent, domain: UnitDomain, view: &impl UsageView) -> Result<(), IngestError> {
    let refused = |counter| IngestError::Refused { counter };
    let units = event.units;

    let account = plan
        .accounts
        .entry(event.account_id.clone())
        .or_insert_with(|| view.account(&event.account_id).expect("validated account").clone());
    account.billed = domain.add(account.billed, units).ok_or(refused("billed"))?;
    match &event.lease_id {
        None => account.overage = domain.add(account.overage, units).ok_or(refused("overage"))?,
        Some(lease_id) => {
            let lease = plan
                .leases
                .entry(lease_id.clone())
                .or_insert_with(|| view.lease(lease_id).expect("validated lease").clone());
            lease.used = domain.add(lease.used, units).ok_or(refused("lease_used"))?;
        }
    }

    let credential = plan
        .credentials
        .entry(event.credential_id.clone())
        .or_insert_with(|| view.credential(&event.credential_id).expect("validated credential").clone());
    credential.accepted_events =
        domain.add(credential.accepted_events, 1).ok_or(refused("credential_accepted_events"))?;
    credential.accepted_units =
        domain.add(credential.accepted_units, units).ok_or(refused("credential_accepted_units"))?;
    credential.last_used_at = credential.last_used_at.max(Some(event.occurred_at));
    Ok(())
}
