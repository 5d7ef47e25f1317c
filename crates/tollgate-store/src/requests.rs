//! What the operations with several arguments are asked, one value each: the
//! allocator's credit and lease operations, the lease listing, issuing and
//! revoking a credential, and the outbox's alert rule, endpoint and delivery
//! operations.
//!
//! Every layer an operation passes through (the trait, each store, the
//! PostgreSQL store's task wrapper, its locked and unlocked paths, the keyed
//! request's fingerprint) hands on the same arguments; one value per operation
//! keeps them from drifting apart, and the idempotency [`Request`](crate::Request)
//! fingerprints exactly the value the store ran.

use jiff::{SignedDuration, Timestamp};
use tollgate_core::{Condition, EventType, LeaseFilter, PageRequest};

use crate::model::LeaseHandle;
use crate::outbox::AttemptResult;

/// `units` of prepaid credit for `account_id`, applied once under `credit_id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Credit<'a> {
    pub account_id: &'a str,
    pub credit_id: &'a str,
    pub units: u64,
}

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

/// One page of the leases of `account_id` that `filter` keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseListing<'a> {
    pub account_id: &'a str,
    pub filter: LeaseFilter,
    pub page: &'a PageRequest,
}

/// A credential of `account_id` to issue, named `label`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewCredential<'a> {
    pub account_id: &'a str,
    pub label: &'a str,
}

/// The credential `credential_id` of `account_id`, to revoke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Revocation<'a> {
    pub account_id: &'a str,
    pub credential_id: &'a str,
}

/// An alert rule of `account_id`, watching `condition`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewAlertRule<'a> {
    pub account_id: &'a str,
    pub condition: Condition,
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
