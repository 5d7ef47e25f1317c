//! The embedded in-memory store.
//!
//! All state sits behind one mutex. Every operation takes the lock once, loads what
//! it needs by reading the maps, calls the core, and writes back what the core
//! decided before releasing the lock, so each operation is atomic and operations
//! are serialisable. The unit domain is the whole `u64` range.
//!
//! Leases are kept compact, because a store holds one record for every lease it
//! ever granted: the id is kept as the 128-bit number its hex digits spell, the
//! account as an index into an interning table, and a full `Lease` is rebuilt
//! only when an operation needs one. Loading is the only thing that changes; the
//! core still decides everything.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Mutex, MutexGuard};

use async_trait::async_trait;
use jiff::Timestamp;
use tollgate_core::ids::validate_label;
use tollgate_core::journal::{EntryIds, EntryKind};
use tollgate_core::ledger::{self, LeaseState};
use tollgate_core::{
    Account, Credential, CreditEntry, Error, ExportQuery, GrantPolicy, KeyRoute, Lease, Page, PageLimit, PageRequest,
    ReclaimPass, Secret, SecretHash, UnitDomain, UsageEvent, UsageQuery, UsageReport, route_credential_key,
    validate_id,
};

use crate::Store;
use crate::idempotency::{Claim, IDEMPOTENCY_PURGE_BATCH_MAX, Idempotency, Replayable, Request};
use crate::model::{
    AccountView, CheckReport, Consolidated, CreditReceipt, IssuedCredential, IssuedLease, JournalPage, LeaseSummary,
    ReclaimReport, Released, SkippedLease, StorageStatus, Verification,
};
use crate::requests::{Acquisition, Consolidation, Credit, LeaseListing, NewCredential, Release, Revocation};
use crate::secrets::{new_capability, new_credential_id, new_credential_key};

mod accounts;
mod check;
mod events;
mod ingest;
mod journal;
mod lease_ids;
mod listings;
mod outbox;
mod reclaim;
mod records;

use accounts::{AccountNumber, Accounts};
use events::EventLog;
use journal::StoredIds;
use lease_ids::{LeaseKey, LeaseMap, lease_id_of, lease_key, new_lease_key};
use records::IdempotencyRecords;

const DOMAIN: UnitDomain = UnitDomain::U64;

pub struct MemoryStore {
    policy: GrantPolicy,
    state: Mutex<State>,
}

/// Everything a `Lease` holds except its id (the map key) and its account's id
/// (the account's number, `accounts::AccountNumber`).
struct LeaseRecord {
    capability: SecretHash,
    fencing_token: u64,
    granted: u64,
    used: u64,
    expiry: Timestamp,
    account: AccountNumber,
    state: LeaseState,
    expiry_is_upper_bound: bool,
}

impl LeaseRecord {
    fn write(&mut self, lease: &Lease) {
        self.fencing_token = lease.fencing_token;
        self.granted = lease.granted;
        self.used = lease.used;
        self.state = lease.state;
        self.expiry = lease.expiry;
        self.expiry_is_upper_bound = lease.expiry_is_upper_bound;
    }
}

struct CredentialRecord {
    credential: Credential,
    key: SecretHash,
}

#[derive(Default)]
struct State {
    accounts: Accounts,
    /// Ordered by `(account_id, credit_id)`, the credit listing's order.
    credits: BTreeMap<(String, String), u64>,
    leases: LeaseMap<LeaseRecord>,
    /// Every lease by `(account number, key)`, the lease listing's order.
    leases_by_account: BTreeSet<(AccountNumber, LeaseKey)>,
    /// Active leases by `(expiry, lease_id)`, the order reclaim reads the
    /// most overdue ones in.
    active_by_expiry: BTreeSet<(Timestamp, LeaseKey)>,
    /// Active leases by `(account number, expiry, lease_id)`: an account's due
    /// leases in the order a reclaim pass settles them.
    active_by_account: BTreeSet<(AccountNumber, Timestamp, LeaseKey)>,
    /// Accepted events per account, kept forever.
    events: EventLog,
    credentials: foldhash::HashMap<String, CredentialRecord>,
    credential_by_key: HashMap<SecretHash, String>,
    /// Every credential by `(account_id, credential_id)`, the listing's order.
    credentials_by_account: BTreeSet<(String, String)>,
    idempotency: IdempotencyRecords,
    outbox: outbox::OutboxState,
}

/// A new lease's id and capability, drawn before the store's lock is taken,
/// so that drawing random bytes and hashing the capability keep no other
/// request waiting. One drawn for an operation the core refuses is dropped.
struct FreshLease {
    key: LeaseKey,
    capability: Secret,
    hash: SecretHash,
}

impl FreshLease {
    fn new() -> Self {
        let capability = new_capability();
        Self { key: new_lease_key(), hash: capability.hash(), capability }
    }
}

/// A stored lease its holder presented, with its key and its account's number.
struct Held {
    key: LeaseKey,
    account: AccountNumber,
    lease: Lease,
}

impl MemoryStore {
    pub fn new(policy: GrantPolicy) -> Self {
        Self { policy, state: Mutex::new(State::default()) }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock is a bug; the state it guards was only
        // ever assigned whole values, so continuing with it is sound.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs `operation` under the lock; with a key, the record is looked up and
    /// written under the same lock, so the answer and its effect are one step.
    fn run<T: Replayable>(
        &self,
        idempotency: Option<&Idempotency>,
        request: Request<'_>,
        now: Timestamp,
        operation: impl FnOnce(&mut State) -> Result<T, Error>,
    ) -> Result<T, Error> {
        // The claim's hashes are computed before the lock is taken.
        let claim = idempotency.map(|idempotency| Claim::new(idempotency, &request, now));
        let mut state = self.lock();
        let Some(claim) = claim else {
            return operation(&mut state);
        };
        if let Some(record) = state.idempotency.live(&claim.lookup_id, now) {
            return claim.replay(&record.fingerprint, &record.sealed);
        }
        let answer = operation(&mut state)?;
        let sealed = claim.seal(&answer.to_answer());
        state.idempotency.insert(&claim, sealed, now);
        Ok(answer)
    }
}

impl State {
    fn account(&self, account_id: &str) -> Result<&Account, Error> {
        self.accounts.get(account_id).map(|record| &record.account).ok_or(Error::AccountNotFound)
    }

    /// The account `account_id` and its number.
    fn account_numbered(&self, account_id: &str) -> Result<(AccountNumber, &Account), Error> {
        let number = self.accounts.number(account_id).ok_or(Error::AccountNotFound)?;
        let record = self.accounts.at(number).ok_or(Error::AccountNotFound)?;
        Ok((number, &record.account))
    }

    /// Stores counters the core decided for a stored account, keeping the
    /// rest of its record.
    fn store_account(&mut self, account: Account) {
        if let Some(record) = self.accounts.get_mut(&account.account_id) {
            record.account = account;
        }
    }

    fn view(&self, account_id: &str) -> Result<AccountView, Error> {
        let record = self.accounts.get(account_id).ok_or(Error::AccountNotFound)?;
        Ok(AccountView { account: record.account.clone(), active_leases: record.active_leases })
    }

    fn lease_of(&self, key: LeaseKey, record: &LeaseRecord) -> Lease {
        Lease {
            lease_id: lease_id_of(key),
            account_id: self.accounts.id(record.account).to_owned(),
            fencing_token: record.fencing_token,
            granted: record.granted,
            used: record.used,
            state: record.state,
            expiry: record.expiry,
            expiry_is_upper_bound: record.expiry_is_upper_bound,
        }
    }

    /// The credential `credential_id` of `account_id`; one of another account
    /// is not found, exactly like an unknown one.
    fn account_credential(&self, account_id: &str, credential_id: &str) -> Option<&CredentialRecord> {
        self.credentials.get(credential_id).filter(|record| record.credential.account_id == account_id)
    }

    fn load_lease(&self, lease_id: &str) -> Option<Lease> {
        let key = lease_key(lease_id)?;
        self.leases.get(&key).map(|record| self.lease_of(key, record))
    }

    /// The record of the lease `lease_id` of `account_id`: a lease of another
    /// account is not found, exactly like an unknown one.
    fn account_lease(&self, account_id: &str, lease_id: &str) -> Option<(LeaseKey, &LeaseRecord)> {
        let key = lease_key(lease_id)?;
        let record = self.leases.get(&key)?;
        (self.accounts.id(record.account) == account_id).then_some((key, record))
    }

    /// The active or settled lease `lease_id` of `account_id`, for the holder
    /// of the capability whose hash is `capability`.
    fn held_lease(&self, account_id: &str, lease_id: &str, capability: &SecretHash) -> Result<Held, Error> {
        let (key, record) = self.account_lease(account_id, lease_id).ok_or(Error::LeaseNotFound)?;
        if !record.capability.matches_hash(capability) {
            return Err(Error::CapabilityMismatch);
        }
        Ok(Held { key, account: record.account, lease: self.lease_of(key, record) })
    }

    /// Writes what the core decided about a stored lease into its record.
    fn write_lease(&mut self, lease: &Lease) {
        if let Some(record) = lease_key(&lease.lease_id).and_then(|key| self.leases.get_mut(&key)) {
            record.write(lease);
        }
    }

    /// Stores a new lease of account `account` under `key`.
    fn insert_lease(&mut self, key: LeaseKey, account: AccountNumber, lease: &Lease, capability: SecretHash) {
        self.active_by_expiry.insert((lease.expiry, key));
        self.active_by_account.insert((account, lease.expiry, key));
        self.leases_by_account.insert((account, key));
        if let Some(record) = self.accounts.at_mut(account) {
            record.active_leases += 1;
        }
        let record = LeaseRecord {
            capability,
            fencing_token: lease.fencing_token,
            granted: lease.granted,
            used: lease.used,
            expiry: lease.expiry,
            account,
            state: lease.state,
            expiry_is_upper_bound: lease.expiry_is_upper_bound,
        };
        self.leases.insert(key, record);
    }

    /// Stores a lease the core settled, stored under `key`, taking it out of
    /// the active indexes.
    fn store_settled(&mut self, key: LeaseKey, lease: &Lease) {
        self.active_by_expiry.remove(&(lease.expiry, key));
        let Some(record) = self.leases.get_mut(&key) else { return };
        self.active_by_account.remove(&(record.account, lease.expiry, key));
        record.write(lease);
        if let Some(account) = self.accounts.at_mut(record.account) {
            account.active_leases = account.active_leases.saturating_sub(1);
        }
    }

    /// Stores a lease of account `account` for `grant` under `fresh`'s id and
    /// capability, and answers it.
    fn grant_lease(&mut self, account: AccountNumber, grant: ledger::Grant, fresh: FreshLease) -> IssuedLease {
        let FreshLease { key, capability, hash } = fresh;
        let lease = grant.into_lease(lease_id_of(key), self.accounts.id(account).to_owned());
        self.insert_lease(key, account, &lease, hash);
        IssuedLease { lease, capability }
    }
}

#[async_trait]
impl Store for MemoryStore {
    fn policy(&self) -> &GrantPolicy {
        &self.policy
    }

    fn unit_domain(&self) -> UnitDomain {
        DOMAIN
    }

    async fn create_account(&self, account_id: &str) -> Result<AccountView, Error> {
        validate_id("account_id", account_id)?;
        let mut state = self.lock();
        if !state.accounts.insert(account_id) {
            return Err(Error::AccountExists);
        }
        state.view(account_id)
    }

    async fn apply_credit(&self, credit: Credit<'_>, now: Timestamp) -> Result<CreditReceipt, Error> {
        let Credit { account_id, credit_id, units } = credit;
        validate_id("account_id", account_id)?;
        validate_id("credit_id", credit_id)?;
        let mut state = self.lock();
        let (number, account) = state.account_numbered(account_id)?;
        let mut account = account.clone();
        let key = (account_id.to_owned(), credit_id.to_owned());
        let created = account.credit_once(state.credits.get(&key).copied(), units, DOMAIN)?;
        if created {
            state.put_account(number, account, EntryKind::Credit, StoredIds::other(EntryIds::credit(credit_id)), now);
            state.credits.insert(key, units);
        }
        Ok(CreditReceipt { account: state.view(account_id)?, created })
    }

    async fn acquire_idempotent(
        &self,
        idempotency: Option<&Idempotency>,
        request: Acquisition<'_>,
        now: Timestamp,
    ) -> Result<IssuedLease, Error> {
        let Acquisition { account_id, units, ttl } = request;
        let fresh = FreshLease::new();
        self.run(idempotency, Request::Acquire(request), now, |state| {
            let (number, account) = state.account_numbered(account_id)?;
            let mut account = account.clone();
            let grant = ledger::acquire(&mut account, units, ttl, now, &self.policy, DOMAIN)?;
            let key = fresh.key;
            let issued = state.grant_lease(number, grant, fresh);
            state.put_account(number, account, EntryKind::Acquire, StoredIds::Lease(key), now);
            Ok(issued)
        })
    }

    async fn release_idempotent(
        &self,
        idempotency: Option<&Idempotency>,
        request: Release<'_>,
        now: Timestamp,
    ) -> Result<Released, Error> {
        let Release { account_id, lease_id, capability } = request;
        let presented = SecretHash::of(capability);
        self.run(idempotency, Request::Release(request), now, |state| {
            let Held { key, account: number, mut lease } = state.held_lease(account_id, lease_id, &presented)?;
            let mut account = state.accounts.at(number).ok_or_else(|| orphan(&lease))?.account.clone();
            let settlement = ledger::release(&mut account, &mut lease, now, &self.policy, DOMAIN)?;
            state.put_account(number, account, EntryKind::Release, StoredIds::Lease(key), now);
            state.store_settled(key, &lease);
            Ok(Released { lease, settlement })
        })
    }

    async fn consolidate_idempotent(
        &self,
        idempotency: Option<&Idempotency>,
        request: Consolidation<'_>,
        now: Timestamp,
    ) -> Result<Consolidated, Error> {
        let Consolidation { account_id, sources, extra_units, ttl } = request;
        let presented: Vec<SecretHash> = sources.iter().map(|handle| SecretHash::of(&handle.capability)).collect();
        let fresh = FreshLease::new();
        self.run(idempotency, Request::Consolidate(request), now, |state| {
            let (number, account) = state.account_numbered(account_id)?;
            let mut account = account.clone();
            let held = sources
                .iter()
                .zip(&presented)
                .map(|(handle, capability)| state.held_lease(account_id, &handle.lease_id, capability))
                .collect::<Result<Vec<_>, _>>()?;
            let (keys, mut leases): (Vec<LeaseKey>, Vec<Lease>) =
                held.into_iter().map(|Held { key, lease, .. }| (key, lease)).unzip();
            let (grant, settlements) =
                ledger::consolidate(&mut account, &mut leases, extra_units, ttl, now, &self.policy, DOMAIN)?;
            for (&key, lease) in keys.iter().zip(&leases) {
                state.store_settled(key, lease);
            }
            let lease = state.grant_lease(number, grant, fresh);
            let sources = leases.iter().map(|l| l.lease_id.clone()).collect();
            let ids = EntryIds::consolidate(&lease.lease.lease_id, sources);
            state.put_account(number, account, EntryKind::Consolidate, StoredIds::other(ids), now);
            Ok(Consolidated { lease, settlements: leases.into_iter().zip(settlements).collect() })
        })
    }

    async fn reclaim(&self, now: Timestamp, limit: u32) -> Result<ReclaimReport, Error> {
        let ReclaimPass { limit, cutoff } = self.policy.reclaim_pass(now, limit);
        let Some(cutoff) = cutoff else {
            return Ok(ReclaimReport { limit, ..ReclaimReport::default() });
        };
        self.lock().reclaim(now, cutoff, limit, &self.policy)
    }

    async fn lease_summary(&self, now: Timestamp) -> Result<LeaseSummary, Error> {
        Ok(self.lock().lease_summary(self.policy.reclaim_cutoff(now)))
    }

    async fn issue_credential_idempotent(
        &self,
        idempotency: Option<&Idempotency>,
        request: NewCredential<'_>,
        now: Timestamp,
    ) -> Result<IssuedCredential, Error> {
        let NewCredential { account_id, label } = request;
        validate_label(label)?;
        self.run(idempotency, Request::IssueCredential(request), now, |state| {
            state.account(account_id)?;
            let key = new_credential_key(account_id);
            let credential = Credential::issued(new_credential_id(), account_id.to_owned(), label.to_owned(), now);
            state.credential_by_key.insert(key.hash(), credential.credential_id.clone());
            state.credentials_by_account.insert((account_id.to_owned(), credential.credential_id.clone()));
            state.credentials.insert(
                credential.credential_id.clone(),
                CredentialRecord { credential: credential.clone(), key: key.hash() },
            );
            Ok(IssuedCredential { credential, key })
        })
    }

    /// Only keys that name their account were ever issued here, so a key in
    /// the legacy form names no credential of this store.
    async fn verify_credential(&self, key: &str) -> Result<Verification, Error> {
        let KeyRoute::Account(account_id) = route_credential_key(key) else {
            return Ok(Verification::of(None));
        };
        let state = self.lock();
        let record = state
            .credential_by_key
            .get(&SecretHash::of(key))
            .and_then(|credential_id| state.account_credential(account_id, credential_id))
            .filter(|record| record.key.matches(key));
        Ok(Verification::of(record.map(|record| &record.credential)))
    }

    async fn revoke_credential_idempotent(
        &self,
        idempotency: Option<&Idempotency>,
        request: Revocation<'_>,
        now: Timestamp,
    ) -> Result<Credential, Error> {
        self.run(idempotency, Request::RevokeCredential(request), now, |state| {
            let record = state
                .credentials
                .get_mut(request.credential_id)
                .filter(|record| record.credential.account_id == request.account_id)
                .ok_or(Error::CredentialNotFound)?;
            record.credential.revoke(now);
            Ok(record.credential.clone())
        })
    }

    async fn purge_idempotency(&self, now: Timestamp, limit: u32) -> Result<u32, Error> {
        Ok(self.lock().idempotency.purge(now, limit.min(IDEMPOTENCY_PURGE_BATCH_MAX)))
    }

    async fn account(&self, account_id: &str) -> Result<AccountView, Error> {
        self.lock().view(account_id)
    }

    async fn lease(&self, account_id: &str, lease_id: &str) -> Result<Lease, Error> {
        let state = self.lock();
        let (key, record) = state.account_lease(account_id, lease_id).ok_or(Error::LeaseNotFound)?;
        Ok(state.lease_of(key, record))
    }

    async fn credential(&self, account_id: &str, credential_id: &str) -> Result<Credential, Error> {
        let state = self.lock();
        let record = state.account_credential(account_id, credential_id).ok_or(Error::CredentialNotFound)?;
        Ok(record.credential.clone())
    }

    async fn list_accounts(&self, prefix: &str, page: &PageRequest) -> Result<Page<AccountView>, Error> {
        self.lock().accounts_page(prefix, page)
    }

    async fn list_leases(&self, listing: LeaseListing<'_>) -> Result<Page<Lease>, Error> {
        self.lock().leases_page(listing)
    }

    async fn list_credentials(&self, account_id: &str, page: &PageRequest) -> Result<Page<Credential>, Error> {
        self.lock().credentials_page(account_id, page)
    }

    async fn list_credits(&self, account_id: &str, page: &PageRequest) -> Result<Page<CreditEntry>, Error> {
        self.lock().credits_page(account_id, page)
    }

    async fn usage(&self, account_id: &str, query: &UsageQuery) -> Result<UsageReport, Error> {
        self.lock().usage(account_id, query)
    }

    async fn usage_events(&self, account_id: &str, query: &ExportQuery) -> Result<Page<UsageEvent>, Error> {
        self.lock().usage_events(account_id, query)
    }

    async fn journal(&self, account_id: &str, after: u64, limit: PageLimit) -> Result<JournalPage, Error> {
        self.lock().journal_page(account_id, after, limit)
    }

    async fn check(&self) -> Result<CheckReport, Error> {
        Ok(self.lock().check_report())
    }

    async fn status(&self) -> Result<StorageStatus, Error> {
        Ok(StorageStatus { backend: "memory", migrations: None })
    }

    /// A memory store is private to its process, so there is no other server whose
    /// grace could differ.
    async fn pin_reclaim_grace(&self, _replace: bool) -> Result<(), Error> {
        Ok(())
    }
}

/// A due lease a reclaim pass passes over, and why.
fn skip(lease: &Lease, error: &Error) -> SkippedLease {
    SkippedLease { lease_id: lease.lease_id.clone(), account_id: lease.account_id.clone(), reason: error.to_string() }
}

fn orphan(lease: &Lease) -> Error {
    Error::StorageCorrupt(format!("lease {} names missing account {}", lease.lease_id, lease.account_id))
}

#[cfg(test)]
mod tests;
