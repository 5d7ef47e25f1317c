//! The store contract every Tollgate backend implements, and [`MemoryStore`], the
//! embedded default.
//!
//! A store does two things only: it loads the state an operation needs and persists
//! what `tollgate-core` decided. The rules themselves live in the core.

#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::too_many_lines))]

mod idempotency;
mod memory;
mod model;
mod outbox;
mod requests;
mod secrets;

pub use idempotency::{
    Answer, Claim, IDEMPOTENCY_KEY_CHARS_MAX, IDEMPOTENCY_PURGE_BATCH_MAX, IDEMPOTENCY_RETENTION_DEFAULT, Idempotency,
    IdempotencyKey, Replayable, Request,
};
pub use memory::MemoryStore;
pub use model::{
    AccountView, CheckReport, Consolidated, CreditReceipt, GuardViolation, IssuedCredential, IssuedLease,
    JournalMismatch, JournalPage, LeaseHandle, LeaseSummary, LegacyBoundCount, MigrationStatus, ReclaimReport,
    ReclaimedLease, Released, SkippedLease, StorageStatus, UnlockedCounts, UnlockedOperation, UsageTotalsMismatch,
    Verification, reclaim_read_max,
};
pub use outbox::{
    AttemptResult, ClaimedDelivery, Delivery, DeliveryState, IssuedEndpoint, Outbox, OutboxCounts, WebhookEndpoint,
    WebhookKey, derive_entries, event_body, new_delivery_id, new_endpoint_id, new_rule_id, new_webhook_secret,
};
pub use requests::{
    Acquisition, Consolidation, Credit, DeliveryClaim, FinishedAttempt, LeaseListing, NewAlertRule, NewCredential,
    NewEndpoint, Release, Revocation, SecretRotation,
};
pub use secrets::{new_capability, new_credential_id, new_credential_key, new_lease_id};

use async_trait::async_trait;
use jiff::{SignedDuration, Timestamp};
use tollgate_core::{
    Credential, CreditEntry, Error, EventOutcome, ExportQuery, GrantPolicy, IngestError, Lease, Page, PageLimit,
    PageRequest, UnitDomain, UsageEvent, UsageQuery, UsageReport,
};

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
pub trait Store: UsageSink + Outbox {
    fn policy(&self) -> &GrantPolicy;
    fn unit_domain(&self) -> UnitDomain;

    /// How often the store's unlocked path gave way since it started; all
    /// zero for a store without one.
    fn unlocked_counts(&self) -> UnlockedCounts {
        UnlockedCounts::default()
    }

    async fn create_account(&self, account_id: &str) -> Result<AccountView, Error>;
    /// Idempotent on `credit_id`: a replay with the same units returns the account
    /// with `created = false`; the same id with other units is `credit_conflict`.
    /// A credit that changes the counters is journaled at `now`.
    async fn apply_credit(&self, credit: Credit<'_>, now: Timestamp) -> Result<CreditReceipt, Error>;
    /// [`Store::apply_credit`] with the credit's fields as arguments.
    async fn credit(
        &self,
        account_id: &str,
        credit_id: &str,
        units: u64,
        now: Timestamp,
    ) -> Result<CreditReceipt, Error> {
        self.apply_credit(Credit { account_id, credit_id, units }, now).await
    }
    /// The five mutating operations below each have an `_idempotent` form taking
    /// an optional [`Idempotency`]. With one, the operation and its record are
    /// one atomic step: a retry with the same key and request answers with the
    /// original answer and applies nothing, the same key with another request is
    /// `idempotency_key_reused`, and a refusal records nothing (see
    /// [`idempotency`](crate::Idempotency)). Without one it is the plain operation.
    async fn acquire_idempotent(
        &self,
        idempotency: Option<&Idempotency>,
        request: Acquisition<'_>,
        now: Timestamp,
    ) -> Result<IssuedLease, Error>;
    async fn acquire(
        &self,
        account_id: &str,
        units: u64,
        ttl: SignedDuration,
        now: Timestamp,
    ) -> Result<IssuedLease, Error> {
        self.acquire_idempotent(None, Acquisition { account_id, units, ttl }, now).await
    }
    /// Settles the lease `lease_id` of `account_id`. A lease of another
    /// account is `lease_not_found`, exactly as an unknown lease is.
    async fn release_idempotent(
        &self,
        idempotency: Option<&Idempotency>,
        request: Release<'_>,
        now: Timestamp,
    ) -> Result<Released, Error>;
    async fn release(
        &self,
        account_id: &str,
        lease_id: &str,
        capability: &str,
        now: Timestamp,
    ) -> Result<Released, Error> {
        self.release_idempotent(None, Release { account_id, lease_id, capability }, now).await
    }
    /// Every source lease is looked up under `account_id`: one of another
    /// account is `lease_not_found`.
    async fn consolidate_idempotent(
        &self,
        idempotency: Option<&Idempotency>,
        request: Consolidation<'_>,
        now: Timestamp,
    ) -> Result<Consolidated, Error>;
    async fn consolidate(
        &self,
        account_id: &str,
        sources: &[LeaseHandle],
        extra_units: u64,
        ttl: SignedDuration,
        now: Timestamp,
    ) -> Result<Consolidated, Error> {
        self.consolidate_idempotent(None, Consolidation { account_id, sources, extra_units, ttl }, now).await
    }
    /// Settles at most `limit` (and at most the policy's batch bound) due leases.
    async fn reclaim(&self, now: Timestamp, limit: u32) -> Result<ReclaimReport, Error>;
    /// The leases the fleet holds now: how many are active, how many of those are
    /// due for reclaim at `now` (expiry at or before `now - grace`, the reclaim boundary
    /// the core decides), and the expiry of the most overdue one.
    async fn lease_summary(&self, now: Timestamp) -> Result<LeaseSummary, Error>;

    async fn issue_credential_idempotent(
        &self,
        idempotency: Option<&Idempotency>,
        request: NewCredential<'_>,
        now: Timestamp,
    ) -> Result<IssuedCredential, Error>;
    async fn issue_credential(&self, account_id: &str, label: &str, now: Timestamp) -> Result<IssuedCredential, Error> {
        self.issue_credential_idempotent(None, NewCredential { account_id, label }, now).await
    }
    /// Looks the key up only under the account it names
    /// (`tollgate_core::route_credential_key`); a key that names no account,
    /// or another account than its credential's, is `unknown_credential`.
    /// Never changes activity.
    async fn verify_credential(&self, key: &str) -> Result<Verification, Error>;
    /// Revokes the credential `credential_id` of `account_id`; one of another
    /// account is `credential_not_found`.
    async fn revoke_credential_idempotent(
        &self,
        idempotency: Option<&Idempotency>,
        request: Revocation<'_>,
        now: Timestamp,
    ) -> Result<Credential, Error>;
    async fn revoke_credential(
        &self,
        account_id: &str,
        credential_id: &str,
        now: Timestamp,
    ) -> Result<Credential, Error> {
        self.revoke_credential_idempotent(None, Revocation { account_id, credential_id }, now).await
    }

    /// Deletes at most `limit` (and at most [`IDEMPOTENCY_PURGE_BATCH_MAX`])
    /// idempotency records expired at `now`; returns how many it deleted. An
    /// expired record never answers a retry, purged or not.
    async fn purge_idempotency(&self, now: Timestamp, limit: u32) -> Result<u32, Error>;

    async fn account(&self, account_id: &str) -> Result<AccountView, Error>;
    /// The lease `lease_id` of `account_id`; one of another account is
    /// `lease_not_found`.
    async fn lease(&self, account_id: &str, lease_id: &str) -> Result<Lease, Error>;
    /// The credential `credential_id` of `account_id`; one of another account
    /// is `credential_not_found`.
    async fn credential(&self, account_id: &str, credential_id: &str) -> Result<Credential, Error>;

    /// Accounts whose id starts with `prefix` (`""`: all), in `account_id`
    /// order, one page after the request's cursor
    /// (`tollgate_core::listings`). A cursor of another listing or prefix
    /// is `invalid_cursor`.
    async fn list_accounts(&self, prefix: &str, page: &PageRequest) -> Result<Page<AccountView>, Error>;
    /// The leases of `listing.account_id` that `listing.filter` keeps, in
    /// `lease_id` order. An unknown account is `account_not_found`; a cursor
    /// of another listing, account or filter is `invalid_cursor`.
    async fn list_leases(&self, listing: LeaseListing<'_>) -> Result<Page<Lease>, Error>;
    /// The credentials of `account_id`, in `credential_id` order.
    async fn list_credentials(&self, account_id: &str, page: &PageRequest) -> Result<Page<Credential>, Error>;
    /// The credits of `account_id`, in `credit_id` order.
    async fn list_credits(&self, account_id: &str, page: &PageRequest) -> Result<Page<CreditEntry>, Error>;

    /// The units and event counts of `account_id`'s accepted events in the
    /// query's range, by bucket and group (`tollgate_core::query`);
    /// `account_not_found` for an unknown account.
    async fn usage(&self, account_id: &str, query: &UsageQuery) -> Result<UsageReport, Error>;
    /// One page of `account_id`'s accepted events in the query's range, in
    /// `(occurred_at, request_id)` order, after the query's cursor;
    /// `account_not_found` for an unknown account.
    async fn usage_events(&self, account_id: &str, query: &ExportQuery) -> Result<Page<UsageEvent>, Error>;
    /// The entries of the journal of `account_id` after sequence number
    /// `after`, at most `limit`, in sequence order (`tollgate_core::journal`).
    /// An unknown account is `account_not_found`.
    async fn journal(&self, account_id: &str, after: u64, limit: PageLimit) -> Result<JournalPage, Error>;

    /// Conservation of every account, the legacy-bound counts and, where the
    /// storage can hold them, rows that violate the database guards.
    async fn check(&self) -> Result<CheckReport, Error>;

    /// Whether storage answers and its schema is current.
    async fn status(&self) -> Result<StorageStatus, Error>;

    /// The clock of storage that several servers share, read now; `None` when
    /// the storage belongs to this process alone, as the memory store does.
    /// Servers compare it with their own clock (`tollgate_core::ClockSample`)
    /// and stop serving while the two are too far apart.
    async fn shared_clock(&self) -> Result<Option<Timestamp>, Error> {
        Ok(None)
    }

    /// Makes this store's reclaim grace the one every server on the same storage
    /// shares: records it when none is recorded (or when `replace` is set, an
    /// explicit operator decision), and otherwise refuses with
    /// `reclaim_grace_mismatch` when the recorded grace differs. Servers call this
    /// at startup, so two servers can never settle the same grants under two
    /// different boundaries.
    async fn pin_reclaim_grace(&self, replace: bool) -> Result<(), Error>;
}
