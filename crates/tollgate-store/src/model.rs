//! What store operations return.

use tollgate_core::{Account, Credential, Lease, LeaseState, Secret, Settlement, Violation};

/// An account's counters and how many active leases it has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccountView {
    pub account: Account,
    pub active_leases: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreditReceipt {
    pub account: AccountView,
    /// False when this was an identical replay of an earlier credit.
    pub created: bool,
}

/// A new lease and its capability, which is shown only here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssuedLease {
    pub lease: Lease,
    pub capability: Secret,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Released {
    pub lease: Lease,
    pub settlement: Settlement,
}

/// A lease to settle and the capability that proves the caller holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseHandle {
    pub lease_id: String,
    pub capability: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Consolidated {
    pub lease: IssuedLease,
    /// One per source lease, in request order.
    pub settlements: Vec<(Lease, Settlement)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReclaimedLease {
    pub lease_id: String,
    pub account_id: String,
    pub settlement: Settlement,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReclaimReport {
    /// Settled leases, in account order.
    pub reclaimed: Vec<ReclaimedLease>,
    /// The bound this pass applied; a pass that settled exactly this many may have
    /// left more due leases behind.
    pub limit: u32,
}

impl ReclaimReport {
    pub fn is_full(&self) -> bool {
        self.limit > 0 && self.reclaimed.len() >= self.limit as usize
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssuedCredential {
    pub credential: Credential,
    /// The key, shown only here.
    pub key: Secret,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verification {
    pub valid: bool,
    pub credential_id: Option<String>,
    pub account_id: Option<String>,
    /// `unknown_credential` or `credential_revoked` when not valid.
    pub reason: Option<&'static str>,
}

/// `(state, expiry_is_upper_bound, count)`, as seed 000's inspection query groups.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct LegacyBoundCount {
    pub state: LeaseState,
    pub expiry_is_upper_bound: bool,
    pub count: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CheckReport {
    pub accounts_checked: u64,
    pub violations: Vec<Violation>,
    pub legacy_bounds: Vec<LegacyBoundCount>,
}
