//! Usage classification: every event of a batch is accepted, duplicate or rejected,
//! exactly once, in batch order.
//!
//! 1. An event is a duplicate when its `(account_id, request_id)` was already
//!    accepted, in storage or earlier in the batch. This test precedes payload
//!    validation, so a replay that changes its units or funding is still a
//!    duplicate.
//! 2. Otherwise an invalid event is rejected with a reason. A rejected event does
//!    not claim its request ID; a corrected event with that ID can be accepted.
//!    Dimensions are payload too: a replay with other dimensions is a
//!    duplicate, and an invalid set ([`dimensions_are_valid`]) is rejected
//!    with `invalid_dimensions`.
//! 3. Otherwise it is accepted. Only accepted events change lease usage, the
//!    account's `billed` and `overage`, and credential activity.
//!
//! If the accepted events would overflow any counter, the whole batch is refused
//! and nothing is applied. Sums do not depend on order, so this holds in every
//! event order.

use std::collections::{BTreeMap, HashMap, HashSet};

use jiff::Timestamp;

use crate::BATCH_EVENTS_MAX;
use crate::error::IngestError;
use crate::ids::is_valid_request_id;
use crate::ledger::{Account, Credential, Lease, LeaseState};
use crate::time::GrantPolicy;
use crate::units::UnitDomain;

/// One reported usage event. Funding is a lease and its fence together, or
/// neither (overage, billed after the fact).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageEvent {
    pub request_id: String,
    pub account_id: String,
    pub credential_id: String,
    pub units: u64,
    pub occurred_at: Timestamp,
    pub lease_id: Option<String>,
    pub fencing_token: Option<u64>,
    /// What the event is about (`{"model": "gpt-4o"}`), for grouping usage;
    /// empty when the reporter named none.
    pub dimensions: Dimensions,
}

/// An event's dimensions, in key order.
pub type Dimensions = BTreeMap<String, String>;

/// The most dimensions one event may carry.
pub const DIMENSIONS_MAX: usize = 8;
/// The longest dimension key, in characters.
pub const DIMENSION_KEY_CHARS_MAX: usize = 64;
/// The longest dimension value, in characters.
pub const DIMENSION_VALUE_CHARS_MAX: usize = 256;

/// Whether `key` may name a dimension: 1 to 64 characters of `a-z 0-9 _ . -`.
pub fn is_valid_dimension_key(key: &str) -> bool {
    let allowed = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'.' | b'-');
    (1..=DIMENSION_KEY_CHARS_MAX).contains(&key.len()) && key.as_bytes().iter().all(allowed)
}

/// Whether `value` may be a dimension's value: 1 to 256 characters, no NUL.
pub fn is_valid_dimension_value(value: &str) -> bool {
    (1..=DIMENSION_VALUE_CHARS_MAX).contains(&value.chars().count()) && !value.contains('\0')
}

/// Whether `dimensions` is a valid set: at most 8 pairs, each key and value valid.
pub fn dimensions_are_valid(dimensions: &Dimensions) -> bool {
    dimensions.len() <= DIMENSIONS_MAX
        && dimensions.iter().all(|(key, value)| is_valid_dimension_key(key) && is_valid_dimension_value(value))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RejectReason {
    InvalidRequestId,
    UnitsOutOfRange,
    UnknownAccount,
    UnknownCredential,
    CredentialAccountMismatch,
    CredentialRevoked,
    FundingIncomplete,
    UnknownLease,
    FenceMismatch,
    LeaseNotActive,
    LeaseExpired,
    InvalidDimensions,
}

impl RejectReason {
    pub const ALL: [RejectReason; 12] = [
        RejectReason::InvalidRequestId,
        RejectReason::UnitsOutOfRange,
        RejectReason::UnknownAccount,
        RejectReason::UnknownCredential,
        RejectReason::CredentialAccountMismatch,
        RejectReason::CredentialRevoked,
        RejectReason::FundingIncomplete,
        RejectReason::UnknownLease,
        RejectReason::FenceMismatch,
        RejectReason::LeaseNotActive,
        RejectReason::LeaseExpired,
        RejectReason::InvalidDimensions,
    ];

    pub fn code(self) -> &'static str {
        match self {
            RejectReason::InvalidRequestId => "invalid_request_id",
            RejectReason::UnitsOutOfRange => "units_out_of_range",
            RejectReason::UnknownAccount => "unknown_account",
            RejectReason::UnknownCredential => "unknown_credential",
            RejectReason::CredentialAccountMismatch => "credential_account_mismatch",
            RejectReason::CredentialRevoked => "credential_revoked",
            RejectReason::FundingIncomplete => "funding_incomplete",
            RejectReason::UnknownLease => "unknown_lease",
            RejectReason::FenceMismatch => "fence_mismatch",
            RejectReason::LeaseNotActive => "lease_not_active",
            RejectReason::LeaseExpired => "lease_expired",
            RejectReason::InvalidDimensions => "invalid_dimensions",
        }
    }

    pub fn parse(code: &str) -> Option<Self> {
        RejectReason::ALL.into_iter().find(|reason| reason.code() == code)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    Accepted,
    Duplicate,
    Rejected(RejectReason),
}

impl Outcome {
    pub fn code(self) -> &'static str {
        match self {
            Outcome::Accepted => "accepted",
            Outcome::Duplicate => "duplicate",
            Outcome::Rejected(_) => "rejected",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventOutcome {
    pub request_id: String,
    pub outcome: Outcome,
}

/// The stored state classification reads. Stores implement it over whatever they
/// loaded for the batch; it must cover every account, lease, credential and
/// request ID the batch names.
pub trait UsageView {
    /// Whether `(account_id, request_id)` was accepted by an earlier batch.
    fn is_recorded(&self, account_id: &str, request_id: &str) -> bool;
    fn account(&self, account_id: &str) -> Option<&Account>;
    fn lease(&self, lease_id: &str) -> Option<&Lease>;
    fn credential(&self, credential_id: &str) -> Option<&Credential>;
}

/// A `UsageView` over owned maps, for stores that load a batch's state up front.
#[derive(Debug, Clone, Default)]
pub struct UsageSnapshot {
    pub recorded: HashSet<(String, String)>,
    pub accounts: HashMap<String, Account>,
    pub leases: HashMap<String, Lease>,
    pub credentials: HashMap<String, Credential>,
}

impl UsageView for UsageSnapshot {
    fn is_recorded(&self, account_id: &str, request_id: &str) -> bool {
        self.recorded.contains(&(account_id.to_owned(), request_id.to_owned()))
    }

    fn account(&self, account_id: &str) -> Option<&Account> {
        self.accounts.get(account_id)
    }

    fn lease(&self, lease_id: &str) -> Option<&Lease> {
        self.leases.get(lease_id)
    }

    fn credential(&self, credential_id: &str) -> Option<&Credential> {
        self.credentials.get(credential_id)
    }
}

/// What a store persists for a classified batch: the outcomes, the accepted events
/// (as indices into the batch, in order), and the new value of every account, lease
/// and credential an accepted event touched.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IngestPlan {
    pub outcomes: Vec<EventOutcome>,
    pub accepted: Vec<usize>,
    pub accounts: BTreeMap<String, Account>,
    pub leases: BTreeMap<String, Lease>,
    pub credentials: BTreeMap<String, Credential>,
}

/// Classifies `batch` at `now` against `view`.
pub fn classify(
    batch: &[UsageEvent],
    now: Timestamp,
    policy: &GrantPolicy,
    domain: UnitDomain,
    view: &impl UsageView,
) -> Result<IngestPlan, IngestError> {
    if batch.len() > BATCH_EVENTS_MAX {
        return Err(IngestError::BatchTooLarge { events: batch.len(), max: BATCH_EVENTS_MAX });
    }
    let mut plan = IngestPlan::default();
    plan.outcomes.reserve(batch.len());
    let mut claimed: foldhash::HashSet<(&str, &str)> =
        HashSet::with_capacity_and_hasher(batch.len(), Default::default());
    for (index, event) in batch.iter().enumerate() {
        let key = (event.account_id.as_str(), event.request_id.as_str());
        let outcome = if claimed.contains(&key) || view.is_recorded(key.0, key.1) {
            Outcome::Duplicate
        } else {
            match validate(event, now, policy, domain, view) {
                Err(reason) => Outcome::Rejected(reason),
                Ok(validated) => {
                    apply(&mut plan, event, domain, validated)?;
                    claimed.insert(key);
                    plan.accepted.push(index);
                    Outcome::Accepted
                }
            }
        };
        plan.outcomes.push(EventOutcome { request_id: event.request_id.clone(), outcome });
    }
    Ok(plan)
}

/// The rows an event was validated against, as the view holds them: what
/// `apply` starts from when the plan holds no newer copy.
struct Validated<'v> {
    account: &'v Account,
    lease: Option<&'v Lease>,
    credential: &'v Credential,
}

fn validate<'v>(
    event: &UsageEvent,
    now: Timestamp,
    policy: &GrantPolicy,
    domain: UnitDomain,
    view: &'v impl UsageView,
) -> Result<Validated<'v>, RejectReason> {
    if !is_valid_request_id(&event.request_id) {
        return Err(RejectReason::InvalidRequestId);
    }
    if !domain.contains(event.units) {
        return Err(RejectReason::UnitsOutOfRange);
    }
    if !dimensions_are_valid(&event.dimensions) {
        return Err(RejectReason::InvalidDimensions);
    }
    let account = view.account(&event.account_id).ok_or(RejectReason::UnknownAccount)?;
    let credential = view.credential(&event.credential_id).ok_or(RejectReason::UnknownCredential)?;
    if credential.account_id != event.account_id {
        return Err(RejectReason::CredentialAccountMismatch);
    }
    if credential.is_revoked_at(event.occurred_at) {
        return Err(RejectReason::CredentialRevoked);
    }
    match (&event.lease_id, event.fencing_token) {
        (None, None) => Ok(Validated { account, lease: None, credential }),
        (Some(_), None) | (None, Some(_)) => Err(RejectReason::FundingIncomplete),
        (Some(lease_id), Some(fencing_token)) => {
            let lease = view
                .lease(lease_id)
                .filter(|lease| lease.account_id == event.account_id)
                .ok_or(RejectReason::UnknownLease)?;
            if lease.fencing_token != fencing_token {
                return Err(RejectReason::FenceMismatch);
            }
            if lease.state != LeaseState::Active {
                return Err(RejectReason::LeaseNotActive);
            }
            if policy.is_reclaimable(lease.expiry, now) {
                return Err(RejectReason::LeaseExpired);
            }
            Ok(Validated { account, lease: Some(lease), credential })
        }
    }
}

/// Applies one accepted event to the plan's copies of the state it touches.
fn apply(
    plan: &mut IngestPlan,
    event: &UsageEvent,
    domain: UnitDomain,
    validated: Validated<'_>,
) -> Result<(), IngestError> {
    let refused = |counter| IngestError::Refused { counter };
    let units = event.units;

    let account = planned(&mut plan.accounts, &event.account_id, validated.account);
    account.billed = domain.add(account.billed, units).ok_or(refused("billed"))?;
    match validated.lease {
        None => account.overage = domain.add(account.overage, units).ok_or(refused("overage"))?,
        Some(validated_lease) => {
            let lease = planned(&mut plan.leases, &validated_lease.lease_id, validated_lease);
            lease.used = domain.add(lease.used, units).ok_or(refused("lease_used"))?;
        }
    }

    let credential = planned(&mut plan.credentials, &event.credential_id, validated.credential);
    credential.accepted_events =
        domain.add(credential.accepted_events, 1).ok_or(refused("credential_accepted_events"))?;
    credential.accepted_units =
        domain.add(credential.accepted_units, units).ok_or(refused("credential_accepted_units"))?;
    credential.last_used_at = credential.last_used_at.max(Some(event.occurred_at));
    Ok(())
}

/// The plan's copy of the row `id`, made from `validated` on first use. The
/// key is cloned only then: most events of a batch touch rows an earlier
/// event of it already copied.
fn planned<'p, T: Clone>(rows: &'p mut BTreeMap<String, T>, id: &str, validated: &T) -> &'p mut T {
    if !rows.contains_key(id) {
        rows.insert(id.to_owned(), validated.clone());
    }
    rows.get_mut(id).expect("inserted above")
}

#[cfg(test)]
mod tests {
    use jiff::SignedDuration;

    use super::*;

    fn at(ns: i128) -> Timestamp {
        Timestamp::from_nanosecond(ns).unwrap()
    }

    /// Lease `l` of account `a`: one unit granted, none used, fenced by
    /// `fencing_token`, active until `at(100)`.
    fn active_lease(fencing_token: u64) -> Lease {
        Lease {
            lease_id: "l".into(),
            account_id: "a".into(),
            fencing_token,
            granted: 1,
            used: 0,
            state: LeaseState::Active,
            expiry: at(100),
            expiry_is_upper_bound: false,
        }
    }

    fn snapshot() -> UsageSnapshot {
        let mut view = UsageSnapshot::default();
        view.accounts.insert("a".into(), Account::new("a".into()));
        view.credentials.insert(
            "c".into(),
            Credential {
                credential_id: "c".into(),
                account_id: "a".into(),
                label: String::new(),
                created_at: at(0),
                revoked_at: None,
                last_used_at: None,
                accepted_events: 0,
                accepted_units: 0,
            },
        );
        view
    }

    fn event(request_id: &str, units: u64) -> UsageEvent {
        UsageEvent {
            request_id: request_id.into(),
            account_id: "a".into(),
            credential_id: "c".into(),
            units,
            occurred_at: at(5),
            lease_id: None,
            fencing_token: None,
            dimensions: Dimensions::new(),
        }
    }

    fn policy() -> GrantPolicy {
        GrantPolicy::new(SignedDuration::from_secs(1), SignedDuration::ZERO, 1).unwrap()
    }

    #[test]
    fn reasons_and_outcomes_have_stable_codes() {
        for reason in RejectReason::ALL {
            assert_eq!(RejectReason::parse(reason.code()), Some(reason));
        }
        assert_eq!(RejectReason::parse("accepted"), None);
        assert_eq!(RejectReason::UnitsOutOfRange.code(), "units_out_of_range");
        let outcomes = [Outcome::Accepted, Outcome::Duplicate, Outcome::Rejected(RejectReason::LeaseExpired)];
        let codes: Vec<_> = outcomes.iter().map(|o| o.code()).collect();
        assert_eq!(codes, ["accepted", "duplicate", "rejected"]);
    }

    #[test]
    fn batch_bound_is_inclusive() {
        let view = snapshot();
        let full: Vec<_> = (0..BATCH_EVENTS_MAX).map(|i| event(&i.to_string(), 1)).collect();
        let plan = classify(&full, at(0), &policy(), UnitDomain::U64, &view).unwrap();
        assert_eq!(plan.accepted.len(), BATCH_EVENTS_MAX);
        assert_eq!(plan.accounts["a"].billed, BATCH_EVENTS_MAX as u64);
        let mut over = full;
        over.push(event("one-more", 1));
        assert_eq!(
            classify(&over, at(0), &policy(), UnitDomain::U64, &view),
            Err(IngestError::BatchTooLarge { events: BATCH_EVENTS_MAX + 1, max: BATCH_EVENTS_MAX })
        );
    }

    #[test]
    fn plan_holds_new_values_and_accepted_indices() {
        let mut view = snapshot();
        view.recorded.insert(("a".into(), "old".into()));
        let batch = [event("x", 3), event("old", 1), event("y", 0)];
        let plan = classify(&batch, at(0), &policy(), UnitDomain::U64, &view).unwrap();
        assert_eq!(plan.accepted, [0, 2]);
        let outcomes: Vec<_> = plan.outcomes.iter().map(|o| (o.request_id.as_str(), o.outcome)).collect();
        assert_eq!(outcomes, [("x", Outcome::Accepted), ("old", Outcome::Duplicate), ("y", Outcome::Accepted)]);
        let account = &plan.accounts["a"];
        assert_eq!((account.billed, account.overage), (3, 3));
        let credential = &plan.credentials["c"];
        assert_eq!(
            (credential.accepted_events, credential.accepted_units, credential.last_used_at),
            (2, 3, Some(at(5)))
        );
        assert!(plan.leases.is_empty());
    }

    #[test]
    fn refusal_names_the_counter() {
        let mut view = snapshot();
        let lease = active_lease(1);
        view.leases.insert("l".into(), lease);
        let max = UnitDomain::I64.max();
        let run = |view: &UsageSnapshot, batch: &[UsageEvent]| classify(batch, at(0), &policy(), UnitDomain::I64, view);
        assert_eq!(run(&view, &[event("a", max), event("b", 1)]), Err(IngestError::Refused { counter: "billed" }));

        let mut leased = event("l", max);
        leased.lease_id = Some("l".into());
        leased.fencing_token = Some(1);
        view.leases.get_mut("l").unwrap().used = 1;
        assert_eq!(run(&view, &[leased.clone()]), Err(IngestError::Refused { counter: "lease_used" }));
        view.leases.get_mut("l").unwrap().used = 0;

        view.accounts.get_mut("a").unwrap().overage = 1;
        assert_eq!(run(&view, &[event("o", max)]), Err(IngestError::Refused { counter: "overage" }));
        view.accounts.get_mut("a").unwrap().overage = 0;

        view.credentials.get_mut("c").unwrap().accepted_units = 1;
        assert_eq!(run(&view, &[event("u", max)]), Err(IngestError::Refused { counter: "credential_accepted_units" }));
        let credential = view.credentials.get_mut("c").unwrap();
        credential.accepted_units = 0;
        credential.accepted_events = max;
        assert_eq!(run(&view, &[event("e", 0)]), Err(IngestError::Refused { counter: "credential_accepted_events" }));
    }

    #[test]
    fn dimensions_are_validated_after_duplicates() {
        let mut view = snapshot();
        view.recorded.insert(("a".into(), "old".into()));
        let with = |request_id: &str, pairs: &[(&str, &str)]| {
            let mut e = event(request_id, 1);
            e.dimensions = pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
            e
        };
        let long_key = "k".repeat(65);
        let long_value = "é".repeat(257);
        let eight: Vec<(String, String)> = (0..8).map(|i| (format!("k{i}"), "v".to_owned())).collect();
        let mut nine = eight.clone();
        nine.push(("k8".into(), "v".into()));
        let as_refs = |pairs: &[(String, String)]| pairs.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        let mut too_many = event("n", 1);
        too_many.dimensions = as_refs(&nine);
        let mut most = event("m", 1);
        most.dimensions = as_refs(&eight);
        let batch = [
            with("old", &[("BAD", "x")]),
            with("a", &[("Model", "x")]),
            with("b", &[("", "x")]),
            with("c", &[(&long_key, "x")]),
            with("d", &[("model", "")]),
            with("e", &[("model", "nul\0")]),
            with("f", &[("model", &long_value)]),
            too_many,
            with("a", &[("model.name_1-x", &"é".repeat(256)), (&"k".repeat(64), "v")]),
            most,
        ];
        let plan = classify(&batch, at(0), &policy(), UnitDomain::U64, &view).unwrap();
        let outcomes: Vec<_> = plan.outcomes.iter().map(|o| o.outcome).collect();
        let bad = Outcome::Rejected(RejectReason::InvalidDimensions);
        assert_eq!(
            outcomes,
            [Outcome::Duplicate, bad, bad, bad, bad, bad, bad, bad, Outcome::Accepted, Outcome::Accepted]
        );
    }

    #[test]
    fn lease_checks_run_in_order() {
        let mut view = snapshot();
        let lease = active_lease(7);
        let mut foreign = lease.clone();
        foreign.lease_id = "f".into();
        foreign.account_id = "b".into();
        view.leases.insert("l".into(), lease);
        view.leases.insert("f".into(), foreign);
        let funded = |lease_id: &str, fence: u64| {
            let mut e = event("r", 1);
            e.lease_id = Some(lease_id.into());
            e.fencing_token = Some(fence);
            e
        };
        let reason = |view: &UsageSnapshot, e: UsageEvent, now: i128| {
            classify(&[e], at(now), &policy(), UnitDomain::U64, view).unwrap().outcomes[0].outcome
        };
        assert_eq!(reason(&view, funded("f", 7), 0), Outcome::Rejected(RejectReason::UnknownLease));
        assert_eq!(reason(&view, funded("l", 8), 0), Outcome::Rejected(RejectReason::FenceMismatch));
        assert_eq!(reason(&view, funded("l", 7), 99), Outcome::Accepted);
        assert_eq!(reason(&view, funded("l", 7), 100), Outcome::Rejected(RejectReason::LeaseExpired));
        view.leases.get_mut("l").unwrap().state = LeaseState::Released;
        assert_eq!(reason(&view, funded("l", 7), 100), Outcome::Rejected(RejectReason::LeaseNotActive));
    }
}
