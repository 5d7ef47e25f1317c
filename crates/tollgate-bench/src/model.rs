//! The baseline for the memory benchmarks: the smallest single-threaded
//! `HashMap` model that makes the same state changes as `MemoryStore`.
//!
//! It keeps what the contract obliges any implementation to keep (counters,
//! lease records with a hashed random capability, the expiry index reclaim
//! needs, request IDs forever, credential activity) and nothing else: no lock,
//! no `async`, no error enums, and no copies of records before deciding. It is
//! the practical limit, not a correct store; it checks only what the benchmark
//! workload exercises.

use std::collections::{BTreeSet, HashMap, HashSet};

use jiff::{SignedDuration, Timestamp};
use sha2::{Digest, Sha256};
use tollgate_core::{EventOutcome, Outcome, RejectReason, UsageEvent};

#[derive(Default, Clone, Copy)]
struct ModelAccount {
    available: u64,
    reserved: u64,
    consumed: u64,
    overage: u64,
    billed: u64,
    next_fence: u64,
}

struct ModelLease {
    account_id: String,
    capability_hash: [u8; 32],
    fencing_token: u64,
    granted: u64,
    used: u64,
    active: bool,
    expiry: Timestamp,
}

struct ModelCredential {
    account_id: String,
    last_used_at: Option<Timestamp>,
    accepted_events: u64,
    accepted_units: u64,
}

/// The baseline state.
#[derive(Default)]
pub struct Model {
    accounts: HashMap<String, ModelAccount>,
    leases: HashMap<String, ModelLease>,
    active_by_expiry: BTreeSet<(Timestamp, String)>,
    credentials: HashMap<String, ModelCredential>,
    recorded: HashMap<String, HashSet<String>>,
    grace: SignedDuration,
    ttl_max: SignedDuration,
}

/// A lease the model granted: its id, fence and the capability shown once.
pub struct ModelGrant {
    pub lease_id: String,
    pub fencing_token: u64,
    pub capability: String,
}

impl Model {
    pub fn new(ttl_max: SignedDuration, grace: SignedDuration) -> Self {
        Self { ttl_max, grace, ..Self::default() }
    }

    pub fn create_account(&mut self, account_id: &str, units: u64) {
        let account = ModelAccount { available: units, next_fence: 1, ..ModelAccount::default() };
        self.accounts.insert(account_id.to_owned(), account);
    }

    pub fn create_credential(&mut self, credential_id: &str, account_id: &str) {
        let credential = ModelCredential {
            account_id: account_id.to_owned(),
            last_used_at: None,
            accepted_events: 0,
            accepted_units: 0,
        };
        self.credentials.insert(credential_id.to_owned(), credential);
    }

    /// Debits the account and records an active lease. The capability is 256
    /// random bits kept only as a SHA-256 hash, and the lease id is random too,
    /// because the contract requires both of any store.
    pub fn acquire(&mut self, account_id: &str, units: u64, ttl: SignedDuration, now: Timestamp) -> Option<ModelGrant> {
        let expiry = now.checked_add(ttl.min(self.ttl_max)).ok()?;
        let account = self.accounts.get_mut(account_id)?;
        if account.available < units {
            return None;
        }
        account.available -= units;
        account.reserved = account.reserved.checked_add(units)?;
        let fencing_token = account.next_fence;
        account.next_fence = fencing_token.checked_add(1)?;
        let lease_id = format!("lse_{}", hex::encode(rand::random::<[u8; 16]>()));
        let capability = format!("tgc_{}", hex::encode(rand::random::<[u8; 32]>()));
        let capability_hash: [u8; 32] = Sha256::digest(capability.as_bytes()).into();
        self.active_by_expiry.insert((expiry, lease_id.clone()));
        let lease = ModelLease {
            account_id: account_id.to_owned(),
            capability_hash,
            fencing_token,
            granted: units,
            used: 0,
            active: true,
            expiry,
        };
        self.leases.insert(lease_id.clone(), lease);
        Some(ModelGrant { lease_id, fencing_token, capability })
    }

    /// Settles the lease and returns `(charged, returned, excess)`.
    pub fn release(&mut self, lease_id: &str, capability: &str, now: Timestamp) -> Option<(u64, u64, u64)> {
        let lease = self.leases.get_mut(lease_id)?;
        let hash: [u8; 32] = Sha256::digest(capability.as_bytes()).into();
        if hash != lease.capability_hash || !lease.active {
            return None;
        }
        if lease.expiry.checked_add(self.grace).is_ok_and(|boundary| boundary <= now) {
            return None;
        }
        let charged = lease.used.min(lease.granted);
        let returned = lease.granted - charged;
        let excess = lease.used - charged;
        let account = self.accounts.get_mut(&lease.account_id)?;
        account.available = account.available.checked_add(returned)?;
        account.reserved -= lease.granted;
        account.consumed = account.consumed.checked_add(charged)?;
        account.overage = account.overage.checked_add(excess)?;
        lease.active = false;
        self.active_by_expiry.remove(&(lease.expiry, lease_id.to_owned()));
        Some((charged, returned, excess))
    }

    /// Classifies the batch in order and applies the accepted events, all or
    /// nothing: deltas are summed first and written only when none overflows.
    pub fn ingest(&mut self, batch: &[UsageEvent], now: Timestamp) -> Option<Vec<EventOutcome>> {
        let mut outcomes = Vec::with_capacity(batch.len());
        let mut claimed: HashSet<(&str, &str)> = HashSet::new();
        let mut accepted = Vec::with_capacity(batch.len());
        for (index, event) in batch.iter().enumerate() {
            let key = (event.account_id.as_str(), event.request_id.as_str());
            let recorded = self.recorded.get(key.0).is_some_and(|ids| ids.contains(key.1));
            let outcome = if recorded || claimed.contains(&key) {
                Outcome::Duplicate
            } else {
                match self.validate(event, now) {
                    Err(reason) => Outcome::Rejected(reason),
                    Ok(()) => {
                        claimed.insert(key);
                        accepted.push(index);
                        Outcome::Accepted
                    }
                }
            };
            outcomes.push(EventOutcome { request_id: event.request_id.clone(), outcome });
        }
        let mut account_deltas: HashMap<&str, (u64, u64)> = HashMap::new();
        let mut lease_deltas: HashMap<&str, u64> = HashMap::new();
        let mut credential_deltas: HashMap<&str, (u64, u64, Timestamp)> = HashMap::new();
        for &index in &accepted {
            let event = &batch[index];
            let (billed, overage) = account_deltas.entry(&event.account_id).or_default();
            *billed = billed.checked_add(event.units)?;
            match &event.lease_id {
                Some(lease_id) => {
                    let used = lease_deltas.entry(lease_id).or_default();
                    *used = used.checked_add(event.units)?;
                }
                None => *overage = overage.checked_add(event.units)?,
            }
            let activity = credential_deltas.entry(&event.credential_id).or_insert((0, 0, event.occurred_at));
            activity.0 += 1;
            activity.1 = activity.1.checked_add(event.units)?;
            activity.2 = activity.2.max(event.occurred_at);
        }
        for (&account_id, &(billed, overage)) in &account_deltas {
            let account = self.accounts.get(account_id)?;
            account.billed.checked_add(billed)?;
            account.overage.checked_add(overage)?;
        }
        for (&lease_id, &used) in &lease_deltas {
            self.leases.get(lease_id)?.used.checked_add(used)?;
        }
        for (account_id, (billed, overage)) in account_deltas {
            let account = self.accounts.get_mut(account_id)?;
            account.billed += billed;
            account.overage += overage;
        }
        for (lease_id, used) in lease_deltas {
            self.leases.get_mut(lease_id)?.used += used;
        }
        for (credential_id, (events, units, last)) in credential_deltas {
            let credential = self.credentials.get_mut(credential_id)?;
            credential.accepted_events = credential.accepted_events.saturating_add(events);
            credential.accepted_units = credential.accepted_units.saturating_add(units);
            credential.last_used_at = credential.last_used_at.max(Some(last));
        }
        for index in accepted {
            let event = &batch[index];
            self.recorded.entry(event.account_id.clone()).or_default().insert(event.request_id.clone());
        }
        Some(outcomes)
    }

    fn validate(&self, event: &UsageEvent, now: Timestamp) -> Result<(), RejectReason> {
        if !self.accounts.contains_key(&event.account_id) {
            return Err(RejectReason::UnknownAccount);
        }
        let credential = self.credentials.get(&event.credential_id).ok_or(RejectReason::UnknownCredential)?;
        if credential.account_id != event.account_id {
            return Err(RejectReason::CredentialAccountMismatch);
        }
        match (&event.lease_id, event.fencing_token) {
            (None, None) => Ok(()),
            (Some(lease_id), Some(fencing_token)) => {
                let lease = self
                    .leases
                    .get(lease_id)
                    .filter(|lease| lease.account_id == event.account_id)
                    .ok_or(RejectReason::UnknownLease)?;
                if lease.fencing_token != fencing_token {
                    return Err(RejectReason::FenceMismatch);
                }
                if !lease.active {
                    return Err(RejectReason::LeaseNotActive);
                }
                if lease.expiry.checked_add(self.grace).is_ok_and(|boundary| boundary <= now) {
                    return Err(RejectReason::LeaseExpired);
                }
                Ok(())
            }
            _ => Err(RejectReason::FundingIncomplete),
        }
    }
}
