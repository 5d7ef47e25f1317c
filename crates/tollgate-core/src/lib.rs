//! Tollgate's rules, as pure functions over plain data.
//!
//! This crate does no I/O, reads no clock and knows nothing of sqlx, axum or JSON.
//! Every store loads the state an operation needs, hands it to the functions here
//! together with the caller's `now`, and persists what they decide. Two stores that
//! disagree therefore have a bug in a loader, never two copies of a rule.

#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::too_many_lines))]

pub mod alerts;
pub mod clock;
pub mod error;
pub mod ids;
pub mod journal;
pub mod ledger;
pub mod listings;
pub mod page;
pub mod query;
pub mod secret;
pub mod time;
pub mod units;
pub mod usage;

pub use alerts::{AlertRule, Condition, Event, EventType, RetryPolicy};
pub use clock::ClockSample;
pub use error::{Error, ErrorKind, IngestError};
pub use ids::validate_id;
pub use journal::{Change, Deltas, Entry, EntryIds, EntryKind, ReplayError};
pub use ledger::{
    Account, Balances, COUNTER_NAMES, COUNTERS, Credential, Equation, Grant, Lease, LeaseState, SETTLEMENT_TERMS,
    Settlement, SettlementTerms, Violation, check_balances, check_conservation, settle,
};
pub use listings::{CreditEntry, LeaseFilter, Listing, PageRequest};
pub use page::{Page, PageLimit, Scope, Start};
pub use query::{ExportQuery, GroupBy, Range, UsageQuery, UsageReport, Window};
pub use secret::{CREDENTIAL_KEY_PREFIX, KeyRoute, Secret, SecretHash, route_credential_key};
pub use time::{GrantPolicy, InstantError, InstantPair, PolicyError, ReclaimPass};
pub use units::UnitDomain;
pub use usage::{Dimensions, EventOutcome, IngestPlan, Outcome, RejectReason, UsageEvent, UsageSnapshot, UsageView};

/// The largest number of events one usage batch may hold.
pub const BATCH_EVENTS_MAX: usize = 10_000;
