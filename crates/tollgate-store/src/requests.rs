//! What the allocator's three lease operations and the outbox's endpoint and
//! delivery operations are asked, one value each.
//!
//! Every layer an operation passes through (the trait, each store, the
//! PostgreSQL store's task wrapper, its locked and unlocked paths, the keyed
//! request's fingerprint) hands on the same arguments; one value per operation
//! keeps them from drifting apart, and the idempotency [`Request`](crate::Request)
//! fingerprints exactly the value the store ran.

use jiff::{SignedDuration, Timestamp};
use tollgate_core::EventType;

use crate::model::LeaseHandle;
use crate::outbox::AttemptResult;

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

/// A webhook endpoint to create: where it is, what it wants, and its secret as
/// the caller sealed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEndpoint<'a> {
    pub url: &'a str,
    pub event_types: &'a [EventType],
    pub sealed_secret: Vec<u8>,
}

/// A new sealed secret for `endpoint_id`; the one it replaces still signs
/// until `previous_until`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretRotation<'a> {
    pub endpoint_id: &'a str,
    pub sealed_secret: Vec<u8>,
    pub previous_until: Timestamp,
}

/// Up to `limit` due deliveries, passing over the endpoints in `skip`, each
/// due again `claim_for` after the claim unless its attempt is recorded first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeliveryClaim<'a> {
    pub limit: u32,
    pub claim_for: SignedDuration,
    pub skip: &'a [String],
}

/// The result of attempt `attempt` of delivery `delivery_id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FinishedAttempt<'a> {
    pub delivery_id: &'a str,
    pub attempt: u32,
    pub result: AttemptResult,
}
