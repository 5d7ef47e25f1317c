//! The store contract every Tollgate backend implements, and [`MemoryStore`], the
//! embedded default.
//!
//! A store does two things only: it loads the state an operation needs and persists
//! what `tollgate-core` decided. The rules themselves live in the core.

mod memory;
mod model;
mod secrets;

pub use memory::MemoryStore;
pub use model::{
    AccountView, CheckReport, Consolidated, CreditReceipt, GuardViolation, IssuedCredential, IssuedLease, LeaseHandle,
    LegacyBoundCount, MigrationStatus, ReclaimReport, ReclaimedLease, Released, SkippedLease, StorageStatus,
    Verification, reclaim_read_max,
};
pub use secrets::{new_capability, new_credential_id, new_credential_key, new_lease_id};

use async_trait::async_trait;
use jiff::{SignedDuration, Timestamp};
use tollgate_core::{Credential, Error, EventOutcome, GrantPolicy, IngestError, Lease, UnitDomain, UsageEvent};

/// Where usage goes. Implemented by every store and by the HTTP client, so that
/// the usage writer works over either.
#[async_trait]
pub trait UsageSink: Send + Sync {
    /// Classifies every event of `batch` at `now` and applies the accepted ones,
    /// atomically. Returns one outcome per event, in input order.
    async fn ingest(&self, batch: Vec<UsageEvent>, now: Timestamp) -> Result<Vec<EventOutcome>, IngestError>;
}

/// The allocator, credential, read and check operations, with the same contract on
/// every backend. Time is always the caller's `now`.
#[async_trait]
pub trait Store: UsageSink {
    fn policy(&self) -> &GrantPolicy;
    fn unit_domain(&self) -> UnitDomain;

    async fn create_account(&self, account_id: &str) -> Result<AccountView, Error>;
    /// Idempotent on `credit_id`: a replay with the same units returns the account
    /// with `created = false`; the same id with other units is `credit_conflict`.
    async fn credit(&self, account_id: &str, credit_id: &str, units: u64) -> Result<CreditReceipt, Error>;
    async fn acquire(
        &self,
        account_id: &str,
        units: u64,
        ttl: SignedDuration,
        now: Timestamp,
    ) -> Result<IssuedLease, Error>;
    async fn release(&self, lease_id: &str, capability: &str, now: Timestamp) -> Result<Released, Error>;
    async fn consolidate(
        &self,
        account_id: &str,
        sources: &[LeaseHandle],
        extra_units: u64,
        ttl: SignedDuration,
        now: Timestamp,
    ) -> Result<Consolidated, Error>;
    /// Settles at most `limit` (and at most the policy's batch bound) due leases.
    async fn reclaim(&self, now: Timestamp, limit: u32) -> Result<ReclaimReport, Error>;

    async fn issue_credential(&self, account_id: &str, label: &str, now: Timestamp) -> Result<IssuedCredential, Error>;
    /// Never changes activity.
    async fn verify_credential(&self, key: &str) -> Result<Verification, Error>;
    async fn revoke_credential(&self, credential_id: &str, now: Timestamp) -> Result<Credential, Error>;

    async fn account(&self, account_id: &str) -> Result<AccountView, Error>;
    async fn lease(&self, lease_id: &str) -> Result<Lease, Error>;
    async fn credential(&self, credential_id: &str) -> Result<Credential, Error>;

    /// Conservation of every account, the legacy-bound counts and, where the
    /// storage can hold them, rows that violate the database guards.
    async fn check(&self) -> Result<CheckReport, Error>;

    /// Whether storage answers and its schema is current.
    async fn status(&self) -> Result<StorageStatus, Error>;

    /// Makes this store's reclaim grace the one every server on the same storage
    /// shares: records it when none is recorded (or when `replace` is set, an
    /// explicit operator decision), and otherwise refuses with
    /// `reclaim_grace_mismatch` when the recorded grace differs. Servers call this
    /// at startup, so two servers can never settle the same grants under two
    /// different boundaries.
    async fn pin_reclaim_grace(&self, replace: bool) -> Result<(), Error>;
}
