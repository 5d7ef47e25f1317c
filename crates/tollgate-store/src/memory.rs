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
    Account, AlertRule, Credential, CreditEntry, Error, ExportQuery, GrantPolicy, KeyRoute, Lease, Page, PageLimit,
    PageRequest, ReclaimPass, Secret, SecretHash, UnitDomain, UsageEvent, UsageQuery, UsageReport,
    route_credential_key, validate_id,
};

use crate::Store;
use crate::idempotency::{Claim, IDEMPOTENCY_PURGE_BATCH_MAX, Idempotency, Replayable, Request};
use crate::model::{
    AccountView, CheckReport, Consolidated, CreditReceipt, IssuedCredential, IssuedLease, JournalPage, LeaseSummary,
    ReclaimReport, Released, SkippedLease, StorageStatus, Verification,
};
use crate::requests::{Acquisition, Consolidation, Credit, LeaseListing, NewCredential, Release, Revocation};
use crate::secrets::{new_capability, new_credential_id, new_credential_key};

mod check;
mod events;
mod ingest;
mod journal;
mod lease_ids;
mod listings;
mod outbox;
mod reclaim;
mod records;

use events::EventLog;
use journal::{Journals, StoredIds};
use lease_ids::{LeaseKey, lease_id_of, lease_key, new_lease_key};
use records::IdempotencyRecords;

const DOMAIN: UnitDomain = UnitDomain::U64;

pub struct MemoryStore {
    policy: GrantPolicy,
    state: Mutex<State>,
}

/// Everything a `Lease` holds except its id (the map key) and its account's id
/// (an index into `State::account_ids`).
struct LeaseRecord {
    capability: SecretHash,
    fencing_token: u64,
    granted: u64,
    used: u64,
    expiry: Timestamp,
    account: u32,
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

/// An account's counters and its alert rules, kept together: a change
/// journaled on the account judges the rules it finds beside the counters it
/// changed, with no lookup of its own.
struct AccountRecord {
    account: Account,
    /// Oldest first.
    rules: Vec<AlertRule>,
}

impl AccountRecord {
    fn new(account: Account) -> Self {
        Self { account, rules: Vec::new() }
    }
}

struct CredentialRecord {
    credential: Credential,
    key: SecretHash,
}

#[derive(Default)]
struct State {
    /// Ordered by id, which is the lock order reclaim reports in.
    accounts: BTreeMap<String, AccountRecord>,
    /// Every account id once, so that lease records name their account by index.
    account_ids: Vec<String>,
    account_index: HashMap<String, u32>,
    /// Ordered by `(account_id, credit_id)`, the credit listing's order.
    credits: BTreeMap<(String, String), u64>,
    leases: HashMap<LeaseKey, LeaseRecord>,
    /// Every lease by `(account index, key)`, the lease listing's order.
    leases_by_account: BTreeSet<(u32, LeaseKey)>,
    /// Active leases by `(expiry, lease_id)`, the order reclaim reads the
    /// most overdue ones in.
    active_by_expiry: BTreeSet<(Timestamp, LeaseKey)>,
    /// Active leases by `(account index, expiry, lease_id)`: an account's due
    /// leases in the order a reclaim pass settles them.
    active_by_account: BTreeSet<(u32, Timestamp, LeaseKey)>,
    active_per_account: HashMap<String, u64>,
    /// Accepted events per account, kept forever.
    events: EventLog,
    credentials: HashMap<String, CredentialRecord>,
    credential_by_key: HashMap<SecretHash, String>,
    /// Every credential by `(account_id, credential_id)`, the listing's order.
    credentials_by_account: BTreeSet<(String, String)>,
    idempotency: IdempotencyRecords,
    journals: Journals,
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

    /// Stores counters the core decided for an account, keeping its rules.
    fn store_account(&mut self, account: Account) {
        match self.accounts.get_mut(&account.account_id) {
            Some(record) => record.account = account,
            None => {
                self.accounts.insert(account.account_id.clone(), AccountRecord::new(account));
            }
        }
    }

    fn view(&self, account_id: &str) -> Result<AccountView, Error> {
        let account = self.account(account_id)?.clone();
        let active_leases = self.active_per_account.get(account_id).copied().unwrap_or(0);
        Ok(AccountView { account, active_leases })
    }

    fn insert_account(&mut self, account_id: &str) {
        let index = u32::try_from(self.account_ids.len()).expect("fewer than 2^32 accounts in memory");
        self.account_ids.push(account_id.to_owned());
        self.account_index.insert(account_id.to_owned(), index);
        self.accounts.insert(account_id.to_owned(), AccountRecord::new(Account::new(account_id.to_owned())));
    }

    fn lease_of(&self, key: LeaseKey, record: &LeaseRecord) -> Lease {
        Lease {
            lease_id: lease_id_of(key),
            account_id: self.account_ids[record.account as usize].clone(),
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
        (self.account_ids[record.account as usize] == account_id).then_some((key, record))
    }

    /// The active or settled lease `lease_id` of `account_id`, for the holder
    /// of the capability whose hash is `capability`.
    fn held_lease(&self, account_id: &str, lease_id: &str, capability: &SecretHash) -> Result<Lease, Error> {
        let (key, record) = self.account_lease(account_id, lease_id).ok_or(Error::LeaseNotFound)?;
        if !record.capability.matches_hash(capability) {
            return Err(Error::CapabilityMismatch);
        }
        Ok(self.lease_of(key, record))
    }

    /// Writes what the core decided about a stored lease into its record.
    fn write_lease(&mut self, lease: &Lease) {
        if let Some(record) = lease_key(&lease.lease_id).and_then(|key| self.leases.get_mut(&key)) {
            record.write(lease);
        }
    }

    fn insert_lease(&mut self, key: LeaseKey, lease: Lease, capability: SecretHash) {
        let account = *self.account_index.get(&lease.account_id).expect("leases are granted on stored accounts");
        self.active_by_expiry.insert((lease.expiry, key));
        self.active_by_account.insert((account, lease.expiry, key));
        self.leases_by_account.insert((account, key));
        match self.active_per_account.get_mut(&lease.account_id) {
            Some(count) => *count += 1,
            None => {
                self.active_per_account.insert(lease.account_id.clone(), 1);
            }
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

    /// Stores a lease the core settled, taking it out of the active indexes.
    fn store_settled(&mut self, lease: Lease) {
        if let Some(count) = self.active_per_account.get_mut(&lease.account_id) {
            *count = count.saturating_sub(1);
        }
        let Some(key) = lease_key(&lease.lease_id) else { return };
        self.active_by_expiry.remove(&(lease.expiry, key));
        if let Some(record) = self.leases.get_mut(&key) {
            self.active_by_account.remove(&(record.account, lease.expiry, key));
            record.write(&lease);
        }
    }

    /// Stores a lease for `grant` under `fresh`'s id and capability, and
    /// answers it with its key.
    fn grant_lease(&mut self, account_id: &str, grant: ledger::Grant, fresh: FreshLease) -> (IssuedLease, LeaseKey) {
        let FreshLease { key, capability, hash } = fresh;
        let lease = grant.into_lease(lease_id_of(key), account_id.to_owned());
        self.insert_lease(key, lease.clone(), hash);
        (IssuedLease { lease, capability }, key)
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
        if state.accounts.contains_key(account_id) {
            return Err(Error::AccountExists);
        }
        state.insert_account(account_id);
        state.view(account_id)
    }

    async fn apply_credit(&self, credit: Credit<'_>, now: Timestamp) -> Result<CreditReceipt, Error> {
        let Credit { account_id, credit_id, units } = credit;
        validate_id("account_id", account_id)?;
        validate_id("credit_id", credit_id)?;
        let mut state = self.lock();
        let mut account = state.account(account_id)?.clone();
        let key = (account_id.to_owned(), credit_id.to_owned());
        let created = account.credit_once(state.credits.get(&key).copied(), units, DOMAIN)?;
        if created {
            state.put_account(account, EntryKind::Credit, StoredIds::other(EntryIds::credit(credit_id)), now);
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
            let mut account = state.account(account_id)?.clone();
            let grant = ledger::acquire(&mut account, units, ttl, now, &self.policy, DOMAIN)?;
            let (issued, key) = state.grant_lease(account_id, grant, fresh);
            state.put_account(account, EntryKind::Acquire, StoredIds::Lease(key), now);
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
            let mut lease = state.held_lease(account_id, lease_id, &presented)?;
            let mut account = state.account(&lease.account_id).map_err(|_| orphan(&lease))?.clone();
            let settlement = ledger::release(&mut account, &mut lease, now, &self.policy, DOMAIN)?;
            state.put_account(account, EntryKind::Release, StoredIds::lease(lease_id), now);
            state.store_settled(lease.clone());
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
            let mut account = state.account(account_id)?.clone();
            let mut leases = sources
                .iter()
                .zip(&presented)
                .map(|(handle, capability)| state.held_lease(account_id, &handle.lease_id, capability))
                .collect::<Result<Vec<_>, _>>()?;
            let (grant, settlements) =
                ledger::consolidate(&mut account, &mut leases, extra_units, ttl, now, &self.policy, DOMAIN)?;
            for lease in &leases {
                state.store_settled(lease.clone());
            }
            let (lease, _) = state.grant_lease(account_id, grant, fresh);
            let sources = leases.iter().map(|l| l.lease_id.clone()).collect();
            let ids = EntryIds::consolidate(&lease.lease.lease_id, sources);
            state.put_account(account, EntryKind::Consolidate, StoredIds::other(ids), now);
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
