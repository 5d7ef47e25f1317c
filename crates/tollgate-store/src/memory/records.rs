//! The memory store's records of keyed requests.

use std::collections::{BTreeSet, HashMap};

use jiff::Timestamp;

use crate::idempotency::Claim;

/// Recorded answers of keyed requests, by lookup id. Bounded by retention:
/// every insert first purges a batch of expired records.
#[derive(Default)]
pub(super) struct IdempotencyRecords {
    records: HashMap<[u8; 32], IdempotencyRecord>,
    by_expiry: BTreeSet<(Timestamp, [u8; 32])>,
}

pub(super) struct IdempotencyRecord {
    pub(super) fingerprint: [u8; 32],
    pub(super) sealed: Vec<u8>,
    expires_at: Timestamp,
}

/// Expired records one insert purges; more than one, so purging outpaces
/// inserting whenever records are expiring.
const IDEMPOTENCY_PURGE_ON_INSERT: u32 = 4;

impl IdempotencyRecords {
    /// The record under `lookup_id` unless it has expired at `now`; an expired
    /// key is a new key.
    pub(super) fn live(&self, lookup_id: &[u8; 32], now: Timestamp) -> Option<&IdempotencyRecord> {
        self.records.get(lookup_id).filter(|record| now < record.expires_at)
    }

    pub(super) fn insert(&mut self, claim: &Claim, sealed: Vec<u8>, now: Timestamp) {
        self.purge(now, IDEMPOTENCY_PURGE_ON_INSERT);
        let record = IdempotencyRecord { fingerprint: claim.fingerprint, sealed, expires_at: claim.expires_at };
        if let Some(old) = self.records.insert(claim.lookup_id, record) {
            self.by_expiry.remove(&(old.expires_at, claim.lookup_id));
        }
        self.by_expiry.insert((claim.expires_at, claim.lookup_id));
    }

    pub(super) fn purge(&mut self, now: Timestamp, limit: u32) -> u32 {
        let expired: Vec<(Timestamp, [u8; 32])> = self
            .by_expiry
            .iter()
            .take_while(|(expires_at, _)| *expires_at <= now)
            .take(limit as usize)
            .copied()
            .collect();
        for entry in &expired {
            self.by_expiry.remove(entry);
            self.records.remove(&entry.1);
        }
        expired.len() as u32
    }
}
