//! What the allocator's three lease operations are asked, one value each.
//!
//! Every layer an operation passes through (the trait, each store, the
//! PostgreSQL store's task wrapper, its locked and unlocked paths, the keyed
//! request's fingerprint) hands on the same arguments; one value per operation
//! keeps them from drifting apart, and the idempotency [`Request`](crate::Request)
//! fingerprints exactly the value the store ran.

use jiff::SignedDuration;

use crate::model::LeaseHandle;

/// `units` for `ttl` out of the balance of `account_id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acquisition<'a> {
    pub account_id: &'a str,
    pub units: u64,
    pub ttl: SignedDuration,
}

/// The lease `lease_id` of `account_id`, proven held by `capability`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Release<'a> {
    pub account_id: &'a str,
    pub lease_id: &'a str,
    pub capability: &'a str,
}

/// The leases `sources` of `account_id` settled into one new lease of their
/// remaining units plus `extra_units`, held for `ttl`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Consolidation<'a> {
    pub account_id: &'a str,
    pub sources: &'a [LeaseHandle],
    pub extra_units: u64,
    pub ttl: SignedDuration,
}
