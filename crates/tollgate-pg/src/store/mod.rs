//! `PostgresStore`: the store contract over PostgreSQL.
//!
//! Like `MemoryStore`, every operation loads the state it needs, hands it to the
//! same `tollgate-core` functions, and persists what they decided; the two
//! stores differ only in how they load and persist. Here there are two ways:
//!
//! - the locking path: a locking read and one write statement inside one
//!   transaction per operation;
//! - the unlocked path (`unlocked`), which acquire, release and reclaim try
//!   first: the core decides on the rows as this server last wrote them, or
//!   as a plain read returns them, and one autocommitted write applies the
//!   decision only if the rows it depended on are unchanged, falling back to
//!   the locking path when they keep changing.
//!
//! Locks are taken in one global order so that no two operations can wait on
//! each other in a cycle: a keyed request's idempotency key row first
//! (`idempotency`), then account rows (in `account_id` order), then lease rows
//! (in `lease_id` order), then credential rows. Every lease and credential
//! is found under its account: a statement that names one by its id names
//! its account by equality too. Every write to a lease happens
//! under its account's lock, and no lease is locked without it: ingestion and
//! consolidation lock only the leases of accounts they hold. The locking reclaim pass is the
//! exception that proves the rule: it finds due leases with `FOR UPDATE SKIP
//! LOCKED` and then takes their accounts with `SKIP LOCKED` as well, so it
//! never waits at all; a lease whose account is busy stays due for the next
//! pass.
//!
//! Reads that depend on a lock come in a statement *after* the one that took
//! it: under READ COMMITTED each statement sees everything committed before it
//! began, while a statement that waited for a row lock re-reads only the locked
//! rows, not its joins or subqueries.

mod accounts;
mod check;
mod complete;
mod connect;
mod credentials;
mod errors;
mod guesses;
mod idempotency;
mod ingest;
mod journal;
mod listings;
mod load;
mod locking;
mod outbox;
mod persist;
mod reclaim;
mod rows;
mod settings;
mod sql;
#[cfg(feature = "testing")]
mod statements;
mod tx;
mod unlocked;
mod usage_queries;

use std::sync::Arc;

use async_trait::async_trait;
use jiff::Timestamp;
use sqlx::{PgConnection, PgPool};
use tollgate_core::{
    Credential, CreditEntry, Error, EventOutcome, ExportQuery, GrantPolicy, IngestError, InstantPair, Lease, Page,
    PageLimit, PageRequest, ReclaimPass, UnitDomain, UsageEvent, UsageQuery, UsageReport,
};
use tollgate_store::{
    AccountView, Acquisition, CheckReport, Consolidated, Consolidation, Credit, CreditReceipt, Idempotency,
    IssuedCredential, IssuedLease, JournalPage, LeaseListing, LeaseSummary, NewCredential, ReclaimReport, Release,
    Released, Request, Revocation, StorageStatus, Store, UnlockedCounts, UnlockedOperation, UsageSink, Verification,
};

pub use connect::{ConnectError, PgStoreConfig, connect_pool};
#[cfg(feature = "testing")]
pub use guesses::ReleasePause;
#[cfg(feature = "testing")]
pub(crate) use statements::STATEMENTS;

use crate::migrations::{self, AppliedMigration};
use errors::{storable, storage_error};
use load::finish;
use sqlx::postgres::PgConnectOptions;
use tx::Tx;
use unlocked::Attempt;

/// PostgreSQL's unit domain: nonnegative `BIGINT`.
const DOMAIN: UnitDomain = UnitDomain::I64;

/// The PostgreSQL-backed store.
///
/// Every operation runs to completion in a task of its own (`complete`): a
/// caller that goes away (a client that hangs up, a request timeout, a
/// dropped future) stops waiting for the answer, never the operation. Cheap
/// to clone; clones share the pool and the remembered rows.
#[derive(Clone)]
pub struct PostgresStore {
    engine: Arc<Engine>,
    running: complete::Running,
    /// Whether operations run in tasks of their own; always, except for
    /// tests of the layer beneath (`inline`).
    tasks: bool,
}

/// The operations themselves, which `PostgresStore` runs to completion.
pub(crate) struct Engine {
    pool: PgPool,
    policy: GrantPolicy,
    /// Rows as this server last wrote them: the unlocked path's first guess.
    guesses: guesses::Guesses,
    applied: Vec<AppliedMigration>,
    /// The test database this store lives in, dropped with the store.
    #[cfg(feature = "testing")]
    _test_db: Option<crate::testing::TestDb>,
}

impl PostgresStore {
    /// Connects with default pool settings; see `connect_with`.
    pub async fn connect(url: &str, policy: GrantPolicy) -> Result<Self, ConnectError> {
        Self::connect_with(url, policy, PgStoreConfig::default()).await
    }

    /// Connects and applies the embedded migrations after sqlx's validation of
    /// the applied history: a database holding a version this binary does not
    /// know is refused before anything is served. Servers then call
    /// `Store::pin_reclaim_grace`.
    pub async fn connect_with(url: &str, policy: GrantPolicy, config: PgStoreConfig) -> Result<Self, ConnectError> {
        let mut options: PgConnectOptions = url.parse().map_err(ConnectError::Unavailable)?;
        if let Some(lock_timeout) = config.lock_timeout {
            // Whole milliseconds, at least one: zero would mean "no timeout".
            let ms = lock_timeout.as_millis().max(1);
            options = options.options([("lock_timeout", format!("{ms}ms"))]);
        }
        let pool = connect_pool(options, config.connections_max, config.acquire_timeout)
            .await
            .map_err(ConnectError::Unavailable)?;
        Self::from_pool(pool, policy).await
    }

    /// `connect_with` over an existing pool, which should be opened with
    /// `connect_pool` as `connect_with`'s is.
    pub async fn from_pool(pool: PgPool, policy: GrantPolicy) -> Result<Self, ConnectError> {
        let applied = migrations::apply(&pool).await?;
        Ok(Self::new(Engine {
            pool,
            policy,
            guesses: guesses::Guesses::default(),
            applied,
            #[cfg(feature = "testing")]
            _test_db: None,
        }))
    }

    fn new(engine: Engine) -> Self {
        Self { engine: Arc::new(engine), running: complete::Running::default(), tasks: true }
    }

    /// The same store with operations run in the caller's task, so that a
    /// dropped future stops them where they stand. Only for tests that show
    /// the connections stay clean even then.
    #[cfg(feature = "testing")]
    pub fn inline(&self) -> Self {
        Self { tasks: false, ..self.clone() }
    }

    /// A store on a test database, which is dropped when the store is.
    #[cfg(feature = "testing")]
    pub async fn on_test_db(db: crate::testing::TestDb, policy: GrantPolicy) -> Result<Self, ConnectError> {
        let applied = migrations::apply(db.pool()).await?;
        Ok(Self::new(Engine {
            pool: db.pool().clone(),
            policy,
            guesses: guesses::Guesses::default(),
            applied,
            _test_db: Some(db),
        }))
    }

    pub fn pool(&self) -> &PgPool {
        &self.engine.pool
    }

    /// The migrations that connecting applied (empty when none were pending).
    pub fn applied_migrations(&self) -> &[AppliedMigration] {
        &self.engine.applied
    }

    /// Waits until no operation of this store (or of its clones) is running,
    /// including operations whose callers stopped waiting for them.
    pub async fn settled(&self) {
        self.running.settled().await;
    }
}

impl Engine {
    async fn begin(&self) -> Result<Tx, Error> {
        Tx::begin(&self.pool).await.map_err(storage_error)
    }

    /// Runs `operation` in a transaction of its own, committed if it
    /// succeeds and rolled back at once if it fails (`finish`).
    async fn transaction<T>(
        &self,
        operation: impl AsyncFnOnce(&mut PgConnection) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let mut tx = self.begin().await?;
        let result = operation(&mut tx).await;
        finish(tx, result, std::convert::identity).await
    }

    /// An operation that tries the unlocked path first: the `unlocked`
    /// attempt's answer, or, when it gave way, the counted fallback to the
    /// `locked` operation in a transaction of its own.
    async fn unlocked_first<T>(
        &self,
        which: UnlockedOperation,
        unlocked: impl Future<Output = Result<Attempt<T>, Error>>,
        locked: impl AsyncFnOnce(&mut PgConnection) -> Result<T, Error>,
    ) -> Result<T, Error> {
        if let Attempt::Done(done) = unlocked.await? {
            return Ok(done);
        }
        self.guesses.count_fallback(which);
        self.transaction(locked).await
    }
}

#[async_trait]
impl UsageSink for Engine {
    async fn ingest(&self, batch: Vec<UsageEvent>, now: Timestamp) -> Result<Vec<EventOutcome>, IngestError> {
        self.ingest_inner(&batch, now).await
    }
}

/// Each operation in a few lines: a keyed request takes the locking path
/// (`idempotency`); acquire, release and reclaim try the unlocked path
/// (`unlocked`) and run the locking one (`locking`) when it gives way; the
/// rest have one path, in the module of their concern.
#[async_trait]
impl Store for Engine {
    fn policy(&self) -> &GrantPolicy {
        &self.policy
    }

    fn unit_domain(&self) -> UnitDomain {
        DOMAIN
    }

    fn unlocked_counts(&self) -> UnlockedCounts {
        self.guesses.counts()
    }

    async fn create_account(&self, account_id: &str) -> Result<AccountView, Error> {
        self.create(account_id).await
    }

    async fn apply_credit(&self, credit: Credit<'_>, now: Timestamp) -> Result<CreditReceipt, Error> {
        self.credit_once(credit, now).await
    }

    async fn acquire_idempotent(
        &self,
        idempotency: Option<&Idempotency>,
        request: Acquisition<'_>,
        now: Timestamp,
    ) -> Result<IssuedLease, Error> {
        let operation = async |conn: &mut PgConnection| self.acquire_locked(conn, request, now).await;
        match idempotency {
            Some(idempotency) => self.keyed(idempotency, Request::Acquire(request), now, operation).await,
            None => {
                self.unlocked_first(UnlockedOperation::Acquire, self.acquire_unlocked(request, now), operation).await
            }
        }
    }

    async fn release_idempotent(
        &self,
        idempotency: Option<&Idempotency>,
        request: Release<'_>,
        now: Timestamp,
    ) -> Result<Released, Error> {
        if !storable(request.account_id) || !storable(request.lease_id) {
            return Err(Error::LeaseNotFound);
        }
        let operation = async |conn: &mut PgConnection| self.release_locked(conn, request, now).await;
        match idempotency {
            Some(idempotency) => self.keyed(idempotency, Request::Release(request), now, operation).await,
            None => {
                self.unlocked_first(UnlockedOperation::Release, self.release_unlocked(request, now), operation).await
            }
        }
    }

    async fn consolidate_idempotent(
        &self,
        idempotency: Option<&Idempotency>,
        request: Consolidation<'_>,
        now: Timestamp,
    ) -> Result<Consolidated, Error> {
        let operation = async |conn: &mut PgConnection| self.consolidate_locked(conn, request, now).await;
        match idempotency {
            Some(idempotency) => self.keyed(idempotency, Request::Consolidate(request), now, operation).await,
            None => self.transaction(operation).await,
        }
    }

    async fn reclaim(&self, now: Timestamp, limit: u32) -> Result<ReclaimReport, Error> {
        let ReclaimPass { limit, cutoff } = self.policy.reclaim_pass(now, limit);
        let Some(cutoff) = cutoff.map(InstantPair::encode) else {
            return Ok(ReclaimReport { limit, ..ReclaimReport::default() });
        };
        self.reclaim_pass(now, cutoff, limit).await
    }

    async fn lease_summary(&self, now: Timestamp) -> Result<LeaseSummary, Error> {
        self.summarize_leases(self.policy.reclaim_cutoff(now)).await
    }

    async fn issue_credential_idempotent(
        &self,
        idempotency: Option<&Idempotency>,
        request: NewCredential<'_>,
        now: Timestamp,
    ) -> Result<IssuedCredential, Error> {
        self.issue_credential(idempotency, request, now).await
    }

    async fn verify_credential(&self, key: &str) -> Result<Verification, Error> {
        self.verify(key).await
    }

    async fn revoke_credential_idempotent(
        &self,
        idempotency: Option<&Idempotency>,
        request: Revocation<'_>,
        now: Timestamp,
    ) -> Result<Credential, Error> {
        self.revoke(idempotency, request, now).await
    }

    async fn purge_idempotency(&self, now: Timestamp, limit: u32) -> Result<u32, Error> {
        self.purge_expired_keys(now, limit).await
    }

    async fn account(&self, account_id: &str) -> Result<AccountView, Error> {
        self.view(account_id).await
    }

    async fn lease(&self, account_id: &str, lease_id: &str) -> Result<Lease, Error> {
        self.read_lease(account_id, lease_id).await
    }

    async fn usage(&self, account_id: &str, query: &UsageQuery) -> Result<UsageReport, Error> {
        self.usage_report(account_id, query).await
    }

    async fn usage_events(&self, account_id: &str, query: &ExportQuery) -> Result<Page<UsageEvent>, Error> {
        self.usage_events_page(account_id, query).await
    }

    async fn credential(&self, account_id: &str, credential_id: &str) -> Result<Credential, Error> {
        self.read_credential(account_id, credential_id).await
    }

    async fn list_accounts(&self, prefix: &str, page: &PageRequest) -> Result<Page<AccountView>, Error> {
        self.accounts_page(prefix, page).await
    }

    async fn list_leases(&self, listing: LeaseListing<'_>) -> Result<Page<Lease>, Error> {
        self.leases_page(listing).await
    }

    async fn list_credentials(&self, account_id: &str, page: &PageRequest) -> Result<Page<Credential>, Error> {
        self.credentials_page(account_id, page).await
    }

    async fn list_credits(&self, account_id: &str, page: &PageRequest) -> Result<Page<CreditEntry>, Error> {
        self.credits_page(account_id, page).await
    }

    async fn journal(&self, account_id: &str, after: u64, limit: PageLimit) -> Result<JournalPage, Error> {
        self.read_journal(account_id, after, limit).await
    }

    async fn check(&self) -> Result<CheckReport, Error> {
        self.check_all().await
    }

    async fn status(&self) -> Result<StorageStatus, Error> {
        self.storage_status().await
    }

    async fn shared_clock(&self) -> Result<Option<Timestamp>, Error> {
        self.clock().await
    }

    async fn pin_reclaim_grace(&self, replace: bool) -> Result<(), Error> {
        self.pin_grace(replace).await
    }
}
