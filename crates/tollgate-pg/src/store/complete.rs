//! Operations that run to completion whatever their caller does.
//!
//! An operation is a sequence of awaits on one connection: a read, a write,
//! a COMMIT. A caller that drops the operation's future between two of them
//! (a client hanging up makes axum drop its handler; a request timeout drops
//! it too) would stop the operation wherever it stood, with a statement in
//! flight and, in a transaction, its session left open. So `PostgresStore`
//! runs each operation in a task of its own and the caller only awaits the
//! answer: dropping the caller's future drops the wait, and the operation
//! finishes (or fails) exactly as if someone were still listening. Its effect
//! is then whole or absent, never partial, and the connection goes back to
//! the pool clean. A caller that needs to know whether the operation took
//! effect asks again: idempotent retries (credit ids, request ids) or a read.
//!
//! The cost is one task spawn per operation, a few microseconds against a
//! round trip to PostgreSQL of a hundred or more.

use std::future::Future;
use std::sync::Arc;

use async_trait::async_trait;
use jiff::Timestamp;
use tokio::sync::watch;
use tollgate_core::{
    Credential, CreditEntry, Error, EventOutcome, ExportQuery, GrantPolicy, IngestError, Lease, Page, PageLimit,
    PageRequest, UnitDomain, UsageEvent, UsageQuery, UsageReport,
};
use tollgate_store::{
    AccountView, Acquisition, CheckReport, Consolidated, Consolidation, Credit, CreditReceipt, Idempotency,
    IssuedCredential, IssuedLease, JournalPage, LeaseListing, LeaseSummary, NewCredential, ReclaimReport, Release,
    Released, Revocation, StorageStatus, Store, UnlockedCounts, UsageSink, Verification,
};

use super::{Engine, PostgresStore};

/// How many operations of a store are running, for waiting until none is.
#[derive(Clone)]
pub(super) struct Running(Arc<watch::Sender<usize>>);

impl Default for Running {
    fn default() -> Self {
        Self(Arc::new(watch::Sender::new(0)))
    }
}

impl Running {
    fn enter(&self) -> RunningGuard {
        self.0.send_modify(|n| *n += 1);
        RunningGuard(self.clone())
    }

    pub(super) async fn settled(&self) {
        let mut count = self.0.subscribe();
        // The sender lives as long as `self`, so this cannot fail.
        let _ = count.wait_for(|n| *n == 0).await;
    }
}

struct RunningGuard(Running);

impl Drop for RunningGuard {
    fn drop(&mut self) {
        self.0.0.send_modify(|n| *n -= 1);
    }
}

/// What an operation answers when its task ended before it did, which only a
/// runtime shutting down does (a panic is passed on to the caller as a panic).
pub(super) trait Interrupted {
    fn interrupted() -> Self;
}

const INTERRUPTED: &str = "the server stopped while the operation was running; it either took effect whole or \
                           not at all, and a read or an idempotent retry tells which";

impl Interrupted for Error {
    fn interrupted() -> Self {
        Error::StorageUnavailable(INTERRUPTED.to_owned())
    }
}

impl Interrupted for IngestError {
    fn interrupted() -> Self {
        IngestError::Unavailable(INTERRUPTED.to_owned())
    }
}

impl PostgresStore {
    /// Runs `operation` on the engine in a task of its own and waits for its
    /// answer; dropping the returned future leaves the task running.
    pub(super) async fn complete<T, E, F, Fut>(&self, operation: F) -> Result<T, E>
    where
        F: FnOnce(Arc<Engine>) -> Fut,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
        T: Send + 'static,
        E: Interrupted + Send + 'static,
    {
        let running = self.running.enter();
        let work = operation(Arc::clone(&self.engine));
        if !self.tasks {
            let _running = running;
            return work.await;
        }
        let task = tokio::spawn(async move {
            let _running = running;
            work.await
        });
        match task.await {
            Ok(answer) => answer,
            Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
            Err(_) => Err(E::interrupted()),
        }
    }
}

#[async_trait]
impl UsageSink for PostgresStore {
    async fn ingest(&self, batch: Vec<UsageEvent>, now: Timestamp) -> Result<Vec<EventOutcome>, IngestError> {
        self.complete(move |e| async move { e.ingest(batch, now).await }).await
    }
}

#[async_trait]
impl Store for PostgresStore {
    fn policy(&self) -> &GrantPolicy {
        &self.engine.policy
    }

    fn unit_domain(&self) -> UnitDomain {
        self.engine.unit_domain()
    }

    fn unlocked_counts(&self) -> UnlockedCounts {
        self.engine.unlocked_counts()
    }

    async fn create_account(&self, account_id: &str) -> Result<AccountView, Error> {
        let account_id = account_id.to_owned();
        self.complete(move |e| async move { e.create_account(&account_id).await }).await
    }

    async fn apply_credit(&self, credit: Credit<'_>, now: Timestamp) -> Result<CreditReceipt, Error> {
        let (account_id, credit_id, units) = (credit.account_id.to_owned(), credit.credit_id.to_owned(), credit.units);
        self.complete(move |e| async move { e.credit(&account_id, &credit_id, units, now).await }).await
    }

    async fn acquire_idempotent(
        &self,
        idempotency: Option<&Idempotency>,
        request: Acquisition<'_>,
        now: Timestamp,
    ) -> Result<IssuedLease, Error> {
        let Acquisition { units, ttl, .. } = request;
        let (idempotency, account_id) = (idempotency.cloned(), request.account_id.to_owned());
        self.complete(move |e| async move {
            let request = Acquisition { account_id: &account_id, units, ttl };
            e.acquire_idempotent(idempotency.as_ref(), request, now).await
        })
        .await
    }

    async fn release_idempotent(
        &self,
        idempotency: Option<&Idempotency>,
        request: Release<'_>,
        now: Timestamp,
    ) -> Result<Released, Error> {
        let idempotency = idempotency.cloned();
        let Release { account_id, lease_id, capability } = request;
        let (account_id, lease_id, capability) = (account_id.to_owned(), lease_id.to_owned(), capability.to_owned());
        self.complete(move |e| async move {
            let request = Release { account_id: &account_id, lease_id: &lease_id, capability: &capability };
            e.release_idempotent(idempotency.as_ref(), request, now).await
        })
        .await
    }

    async fn consolidate_idempotent(
        &self,
        idempotency: Option<&Idempotency>,
        request: Consolidation<'_>,
        now: Timestamp,
    ) -> Result<Consolidated, Error> {
        let Consolidation { account_id, sources, extra_units, ttl } = request;
        let (idempotency, account_id, sources) = (idempotency.cloned(), account_id.to_owned(), sources.to_vec());
        self.complete(move |e| async move {
            let request = Consolidation { account_id: &account_id, sources: &sources, extra_units, ttl };
            e.consolidate_idempotent(idempotency.as_ref(), request, now).await
        })
        .await
    }

    async fn reclaim(&self, now: Timestamp, limit: u32) -> Result<ReclaimReport, Error> {
        self.complete(move |e| async move { e.reclaim(now, limit).await }).await
    }

    async fn lease_summary(&self, now: Timestamp) -> Result<LeaseSummary, Error> {
        self.complete(move |e| async move { e.lease_summary(now).await }).await
    }

    async fn issue_credential_idempotent(
        &self,
        idempotency: Option<&Idempotency>,
        request: NewCredential<'_>,
        now: Timestamp,
    ) -> Result<IssuedCredential, Error> {
        let NewCredential { account_id, label } = request;
        let (idempotency, account_id, label) = (idempotency.cloned(), account_id.to_owned(), label.to_owned());
        self.complete(move |e| async move {
            let request = NewCredential { account_id: &account_id, label: &label };
            e.issue_credential_idempotent(idempotency.as_ref(), request, now).await
        })
        .await
    }

    async fn verify_credential(&self, key: &str) -> Result<Verification, Error> {
        let key = key.to_owned();
        self.complete(move |e| async move { e.verify_credential(&key).await }).await
    }

    async fn revoke_credential_idempotent(
        &self,
        idempotency: Option<&Idempotency>,
        request: Revocation<'_>,
        now: Timestamp,
    ) -> Result<Credential, Error> {
        let (idempotency, account_id, credential_id) =
            (idempotency.cloned(), request.account_id.to_owned(), request.credential_id.to_owned());
        self.complete(move |e| async move {
            let request = Revocation { account_id: &account_id, credential_id: &credential_id };
            e.revoke_credential_idempotent(idempotency.as_ref(), request, now).await
        })
        .await
    }

    async fn purge_idempotency(&self, now: Timestamp, limit: u32) -> Result<u32, Error> {
        self.complete(move |e| async move { e.purge_idempotency(now, limit).await }).await
    }

    async fn account(&self, account_id: &str) -> Result<AccountView, Error> {
        let account_id = account_id.to_owned();
        self.complete(move |e| async move { e.account(&account_id).await }).await
    }

    async fn lease(&self, account_id: &str, lease_id: &str) -> Result<Lease, Error> {
        let (account_id, lease_id) = (account_id.to_owned(), lease_id.to_owned());
        self.complete(move |e| async move { e.lease(&account_id, &lease_id).await }).await
    }

    async fn credential(&self, account_id: &str, credential_id: &str) -> Result<Credential, Error> {
        let (account_id, credential_id) = (account_id.to_owned(), credential_id.to_owned());
        self.complete(move |e| async move { e.credential(&account_id, &credential_id).await }).await
    }

    async fn list_accounts(&self, prefix: &str, page: &PageRequest) -> Result<Page<AccountView>, Error> {
        let (prefix, page) = (prefix.to_owned(), page.clone());
        self.complete(move |e| async move { e.list_accounts(&prefix, &page).await }).await
    }

    async fn list_leases(&self, listing: LeaseListing<'_>) -> Result<Page<Lease>, Error> {
        let LeaseListing { account_id, filter, page } = listing;
        let (account_id, page) = (account_id.to_owned(), page.clone());
        self.complete(move |e| async move {
            e.list_leases(LeaseListing { account_id: &account_id, filter, page: &page }).await
        })
        .await
    }

    async fn list_credentials(&self, account_id: &str, page: &PageRequest) -> Result<Page<Credential>, Error> {
        let (account_id, page) = (account_id.to_owned(), page.clone());
        self.complete(move |e| async move { e.list_credentials(&account_id, &page).await }).await
    }

    async fn list_credits(&self, account_id: &str, page: &PageRequest) -> Result<Page<CreditEntry>, Error> {
        let (account_id, page) = (account_id.to_owned(), page.clone());
        self.complete(move |e| async move { e.list_credits(&account_id, &page).await }).await
    }

    async fn usage(&self, account_id: &str, query: &UsageQuery) -> Result<UsageReport, Error> {
        let (account_id, query) = (account_id.to_owned(), query.clone());
        self.complete(move |e| async move { e.usage(&account_id, &query).await }).await
    }

    async fn usage_events(&self, account_id: &str, query: &ExportQuery) -> Result<Page<UsageEvent>, Error> {
        let (account_id, query) = (account_id.to_owned(), query.clone());
        self.complete(move |e| async move { e.usage_events(&account_id, &query).await }).await
    }

    async fn journal(&self, account_id: &str, after: u64, limit: PageLimit) -> Result<JournalPage, Error> {
        let account_id = account_id.to_owned();
        self.complete(move |e| async move { e.journal(&account_id, after, limit).await }).await
    }

    async fn check(&self) -> Result<CheckReport, Error> {
        self.complete(move |e| async move { e.check().await }).await
    }

    async fn status(&self) -> Result<StorageStatus, Error> {
        self.complete(move |e| async move { e.status().await }).await
    }

    async fn shared_clock(&self) -> Result<Option<Timestamp>, Error> {
        self.complete(move |e| async move { e.shared_clock().await }).await
    }

    async fn pin_reclaim_grace(&self, replace: bool) -> Result<(), Error> {
        self.complete(move |e| async move { e.pin_reclaim_grace(replace).await }).await
    }
}
