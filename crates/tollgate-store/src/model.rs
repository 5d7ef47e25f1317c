//! What store operations return.

use jiff::Timestamp;
use tollgate_core::journal::ReplayError;
use tollgate_core::{Account, Credential, Entry, Lease, LeaseState, Secret, Settlement, Violation};

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

/// A due lease a reclaim pass could not settle because its row or its
/// account's row is corrupt. It stays active until an operator repairs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedLease {
    pub lease_id: String,
    pub account_id: String,
    /// Why, as the `storage_corrupt` error that loading or settling it gave.
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReclaimReport {
    /// Settled leases, in account order.
    pub reclaimed: Vec<ReclaimedLease>,
    /// Due leases passed over as corrupt, in the order the pass found them. One
    /// corrupt lease never stops the others: a pass reads past up to `limit`
    /// of them (`reclaim_read_max`), so they cannot starve the healthy ones
    /// behind them in expiry order unless more than `limit` are due at once.
    pub skipped: Vec<SkippedLease>,
    /// The bound this pass applied; a pass that settled exactly this many may have
    /// left more due leases behind.
    pub limit: u32,
}

/// The leases the fleet holds at one instant (`Store::lease_summary`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LeaseSummary {
    /// Active leases, of every account.
    pub active: u64,
    /// Active leases due for reclaim: expiring at or before the reclaim
    /// cutoff (`GrantPolicy::reclaim_cutoff`); none when it underflows.
    pub due: u64,
    /// The expiry of the most overdue due lease; `None` when none is due.
    pub oldest_due_expiry: Option<Timestamp>,
}

/// Due leases one pass of bound `limit` reads: its bound, and as many again to
/// read past corrupt ones.
pub fn reclaim_read_max(limit: u32) -> u32 {
    limit.saturating_mul(2)
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

impl Verification {
    /// The verdict on a presented key: `credential` is the one whose key hash
    /// matched, if any. Unknown keys and revoked credentials are not valid,
    /// each with its reason.
    pub fn of(credential: Option<&Credential>) -> Self {
        match credential {
            None => Self { valid: false, credential_id: None, account_id: None, reason: Some("unknown_credential") },
            Some(credential) => {
                let revoked = credential.revoked_at.is_some();
                Self {
                    valid: !revoked,
                    credential_id: Some(credential.credential_id.clone()),
                    account_id: Some(credential.account_id.clone()),
                    reason: revoked.then_some("credential_revoked"),
                }
            }
        }
    }
}

/// `(state, expiry_is_upper_bound, count)`, as the legacy-bound query of `docs/upgrading.md` groups.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct LegacyBoundCount {
    pub state: LeaseState,
    pub expiry_is_upper_bound: bool,
    pub count: u64,
}

/// A stored row that a database guard (migration 0015) forbids, found by the
/// read-only guard inspection queries (`tollgate_pg::inspect`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct GuardViolation {
    /// `tollgate_usage_events`, `tollgate_leases` or `tollgate_accounts`.
    pub table: String,
    /// The row's key: `account_id/request_id`, `lease_id` or `account_id`.
    pub key: String,
    pub column: String,
    pub value: i64,
}

/// One page of an account's journal.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct JournalPage {
    /// In sequence order.
    pub items: Vec<Entry>,
    /// The sequence number to read on after when more entries follow this
    /// page; `None` when this page holds the last one.
    pub next_after: Option<u64>,
}

impl JournalPage {
    /// The page of `limit` entries of `rows`, the entries after the
    /// requested position in sequence order, at most `limit + 1` of them (the
    /// one past the page only tells that more follow).
    pub fn of(mut rows: Vec<Entry>, limit: usize) -> Self {
        let more = rows.len() > limit;
        rows.truncate(limit);
        let next_after = if more { rows.last().map(|entry| entry.seq) } else { None };
        Self { items: rows, next_after }
    }
}

/// An account whose journal does not replay to its counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalMismatch {
    pub account_id: String,
    pub error: ReplayError,
}

impl std::fmt::Display for JournalMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "account {}: journal does not replay to its counters: {}", self.account_id, self.error)
    }
}

/// A store's hourly usage totals that differ from the accepted events they
/// total (PostgreSQL's `tollgate_usage_hourly`, migration 0025): one UTC hour
/// of one credential, funding and set of dimensions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageTotalsMismatch {
    pub account_id: String,
    /// The hour, its start as an index of hours since the epoch.
    pub hour: i64,
    pub credential_id: String,
    /// `leased` or `overage`.
    pub funding: &'static str,
    /// The dimensions' JSON text.
    pub dimensions: String,
    /// Units and events as the totals keep them, and as the events count them.
    pub kept: (u128, u128),
    pub counted: (u128, u128),
}

impl std::fmt::Display for UsageTotalsMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "account {}: hourly usage totals of hour {} (credential {}, {}, dimensions {}) keep {} units in {} \
             events, but its events count {} units in {}",
            self.account_id,
            self.hour,
            self.credential_id,
            self.funding,
            self.dimensions,
            self.kept.0,
            self.kept.1,
            self.counted.0,
            self.counted.1
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CheckReport {
    pub accounts_checked: u64,
    pub violations: Vec<Violation>,
    pub legacy_bounds: Vec<LegacyBoundCount>,
    /// Always empty on stores whose types cannot hold such rows.
    pub guard_violations: Vec<GuardViolation>,
    /// Accounts whose journal does not replay to their counters, in account
    /// order.
    pub journal_mismatches: Vec<JournalMismatch>,
    /// Hourly usage totals that differ from their events, in account order,
    /// at most 1 000; always empty on stores that keep none.
    pub usage_totals_mismatches: Vec<UsageTotalsMismatch>,
}

impl CheckReport {
    /// Whether an operator may resume traffic: no equation and no guard
    /// violated, every journal replays to its account's counters, and the
    /// usage totals are their events'.
    pub fn is_clean(&self) -> bool {
        self.violations.is_empty()
            && self.guard_violations.is_empty()
            && self.journal_mismatches.is_empty()
            && self.usage_totals_mismatches.is_empty()
    }
}

/// An operation a store may first try on an unlocked path (deciding on a
/// view of its rows and writing only if they still hold it), falling back to
/// a locking one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UnlockedOperation {
    Acquire,
    Release,
    Reclaim,
}

impl UnlockedOperation {
    pub const ALL: [UnlockedOperation; 3] =
        [UnlockedOperation::Acquire, UnlockedOperation::Release, UnlockedOperation::Reclaim];

    pub fn as_str(self) -> &'static str {
        match self {
            UnlockedOperation::Acquire => "acquire",
            UnlockedOperation::Release => "release",
            UnlockedOperation::Reclaim => "reclaim",
        }
    }

    /// Its position in `ALL`, for counters kept in an array per operation.
    pub fn index(self) -> usize {
        self as usize
    }
}

/// How often a store's unlocked path gave way since it started, by
/// operation; all zero for a store without one (`MemoryStore`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UnlockedCounts {
    /// Unlocked writes that found their rows changed since the view the core
    /// decided on, and wrote nothing: each costs one more round trip. A
    /// server's remembered rows go stale this way when another server writes
    /// the account.
    stale_writes: [u64; UnlockedOperation::ALL.len()],
    /// Operations that left the unlocked path for the locking one.
    fallbacks: [u64; UnlockedOperation::ALL.len()],
}

impl UnlockedCounts {
    pub fn new(stale_writes: impl Fn(UnlockedOperation) -> u64, fallbacks: impl Fn(UnlockedOperation) -> u64) -> Self {
        Self {
            stale_writes: UnlockedOperation::ALL.map(&stale_writes),
            fallbacks: UnlockedOperation::ALL.map(&fallbacks),
        }
    }

    pub fn stale_writes(&self, operation: UnlockedOperation) -> u64 {
        self.stale_writes[operation.index()]
    }

    pub fn fallbacks(&self, operation: UnlockedOperation) -> u64 {
        self.fallbacks[operation.index()]
    }
}

/// Where a store keeps its state and whether its schema is current.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageStatus {
    /// `memory` or `postgres`.
    pub backend: &'static str,
    /// `None` for stores without a schema.
    pub migrations: Option<MigrationStatus>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationStatus {
    /// Versions recorded as applied in the database.
    pub applied: Vec<i64>,
    /// Versions this binary carries.
    pub known: Vec<i64>,
}

impl MigrationStatus {
    /// Applied versions this binary does not know: a newer binary migrated here.
    pub fn unknown(&self) -> Vec<i64> {
        self.applied.iter().copied().filter(|v| !self.known.contains(v)).collect()
    }

    /// Known versions not applied yet.
    pub fn pending(&self) -> Vec<i64> {
        self.known.iter().copied().filter(|v| !self.applied.contains(v)).collect()
    }

    pub fn is_current(&self) -> bool {
        self.unknown().is_empty() && self.pending().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_verification_names_why_a_key_is_not_valid() {
        let unknown = Verification::of(None);
        assert_eq!(
            unknown,
            Verification { valid: false, credential_id: None, account_id: None, reason: Some("unknown_credential") }
        );
        let mut credential = Credential::issued("c".into(), "a".into(), "gw".into(), Timestamp::UNIX_EPOCH);
        let valid = Verification::of(Some(&credential));
        assert_eq!(
            valid,
            Verification { valid: true, credential_id: Some("c".into()), account_id: Some("a".into()), reason: None }
        );
        credential.revoke(Timestamp::UNIX_EPOCH);
        let revoked = Verification::of(Some(&credential));
        assert_eq!(
            revoked,
            Verification {
                valid: false,
                credential_id: Some("c".into()),
                account_id: Some("a".into()),
                reason: Some("credential_revoked"),
            }
        );
    }
}
