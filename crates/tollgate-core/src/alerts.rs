//! Balance alerts and the events webhooks deliver: which event a change of an
//! account's counters causes, and when a failed delivery is tried again.
//!
//! Events are derived from the account journal. Every change of an account's
//! counters is journaled in the same atomic step as the change
//! ([`crate::journal`]), so the journal is the outbox: an entry exists exactly
//! when its change committed, and deriving the entry's events later, in order
//! and once, emits an event exactly when its cause committed. A rolled-back
//! change has no entry and emits nothing; a committed one whose server died
//! before delivering is derived by whichever server reads the journal next.
//!
//! A counter condition ([`Condition::holds`]) fires when it becomes true and
//! recovers when it becomes false: one event per crossing, judged from the
//! counters before and after each entry, so a balance that stays below its
//! threshold emits nothing more however often it changes. A refused acquire
//! changes no counter and has no entry; its rule fires at the refusal, once,
//! and is re-armed by the first later entry that raises `available`
//! ([`rearms`]).

use hmac::{Hmac, Mac};
use jiff::{SignedDuration, Timestamp};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::error::Error;
use std::borrow::Cow;

use crate::journal::{Deltas, Entry, EntryIds, EntryKind};
use crate::ledger::COUNTERS;

/// The most alert rules one account may hold.
pub const RULES_PER_ACCOUNT_MAX: usize = 20;
/// The most webhook endpoints a deployment may hold.
pub const ENDPOINTS_MAX: usize = 50;
/// The longest webhook URL, in bytes.
pub const URL_BYTES_MAX: usize = 2_048;

const AVAILABLE: usize = 1;
const CREDITED: usize = 0;
const OVERAGE: usize = 4;

/// What an alert rule watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Condition {
    /// `available < units`.
    AvailableBelow { units: u64 },
    /// `available < percent % of credited`, for `percent` in 1..=100.
    AvailableBelowPercent { percent: u8 },
    /// `overage > units`.
    OverageAbove { units: u64 },
    /// An acquire was refused for `insufficient_balance`.
    AcquireRefused,
}

impl Condition {
    /// The condition named `kind` with its `threshold` (units, or a percent);
    /// `acquire_refused` takes none.
    pub fn parse(kind: &str, threshold: Option<u64>) -> Result<Self, Error> {
        let condition = match (kind, threshold) {
            ("available_below", Some(units)) => Condition::AvailableBelow { units },
            ("available_below_percent", Some(percent @ 1..=100)) => {
                Condition::AvailableBelowPercent { percent: u8::try_from(percent).unwrap_or(100) }
            }
            ("overage_above", Some(units)) => Condition::OverageAbove { units },
            ("acquire_refused", None) => Condition::AcquireRefused,
            _ => return Err(Error::InvalidCondition),
        };
        Ok(condition)
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Condition::AvailableBelow { .. } => "available_below",
            Condition::AvailableBelowPercent { .. } => "available_below_percent",
            Condition::OverageAbove { .. } => "overage_above",
            Condition::AcquireRefused => "acquire_refused",
        }
    }

    /// The threshold in units, or the percent; none for `acquire_refused`.
    pub fn threshold(&self) -> Option<u64> {
        match *self {
            Condition::AvailableBelow { units } | Condition::OverageAbove { units } => Some(units),
            Condition::AvailableBelowPercent { percent } => Some(u64::from(percent)),
            Condition::AcquireRefused => None,
        }
    }

    /// Whether the condition holds for an account's counters (in
    /// `COUNTER_NAMES` order); `None` for a condition that is not about
    /// counters.
    pub fn holds(&self, counters: &[u64; COUNTERS]) -> Option<bool> {
        let (available, credited) = (u128::from(counters[AVAILABLE]), u128::from(counters[CREDITED]));
        match *self {
            Condition::AvailableBelow { units } => Some(available < u128::from(units)),
            Condition::AvailableBelowPercent { percent } => Some(available * 100 < credited * u128::from(percent)),
            Condition::OverageAbove { units } => Some(counters[OVERAGE] > units),
            Condition::AcquireRefused => None,
        }
    }

    /// Whether the condition reads the counter at index `counter` (in
    /// `COUNTER_NAMES` order): a change that moves none of the counters it
    /// reads cannot make it cross. `acquire_refused` reads none; it is judged
    /// at refusals.
    pub fn watches(&self, counter: usize) -> bool {
        match self {
            Condition::AvailableBelow { .. } => counter == AVAILABLE,
            Condition::AvailableBelowPercent { .. } => counter == AVAILABLE || counter == CREDITED,
            Condition::OverageAbove { .. } => counter == OVERAGE,
            Condition::AcquireRefused => false,
        }
    }

    /// The event a change from `before` to `after` causes under this
    /// condition, if any: crossing into the condition, or out of it for a
    /// balance condition. Overage never falls, so it has no recovery.
    pub fn crossing(&self, before: &[u64; COUNTERS], after: &[u64; COUNTERS]) -> Option<EventType> {
        let (was, is) = (self.holds(before)?, self.holds(after)?);
        match (self, was, is) {
            (Condition::OverageAbove { .. }, false, true) => Some(EventType::OverageThresholdCrossed),
            (_, false, true) => Some(EventType::BalanceThresholdCrossed),
            (Condition::OverageAbove { .. }, true, false) => None,
            (_, true, false) => Some(EventType::BalanceRecovered),
            _ => None,
        }
    }
}

/// An account's alert rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlertRule {
    pub rule_id: String,
    pub account_id: String,
    pub condition: Condition,
    pub created_at: Timestamp,
    /// The account's journal sequence number when the rule was created: the
    /// rule judges only later entries.
    pub from_seq: u64,
    /// For `acquire_refused`: the account's journal sequence number at the
    /// refusal that fired it, until an entry after it re-arms the rule.
    pub refused_at_seq: Option<u64>,
}

/// A journal entry as deriving reads it. A store that keeps entries in
/// another shape lends them through this, so that an entry that emits
/// nothing (nearly all of them) is never rebuilt: its ids are read only for
/// an entry that emits a credit or reclaim event.
pub trait EntryView {
    fn account_id(&self) -> &str;
    fn seq(&self) -> u64;
    fn kind(&self) -> EntryKind;
    fn deltas(&self) -> Deltas;
    fn at(&self) -> Timestamp;
    fn ids(&self) -> Cow<'_, EntryIds>;
}

impl EntryView for Entry {
    fn account_id(&self) -> &str {
        &self.account_id
    }
    fn seq(&self) -> u64 {
        self.seq
    }
    fn kind(&self) -> EntryKind {
        self.kind
    }
    fn deltas(&self) -> Deltas {
        self.deltas
    }
    fn at(&self) -> Timestamp {
        self.at
    }
    fn ids(&self) -> Cow<'_, EntryIds> {
        Cow::Borrowed(&self.ids)
    }
}

/// Whether an entry numbered `seq` with `deltas` re-arms an
/// `acquire_refused` rule that fired at `refused_at_seq`: it is a later
/// entry that raises `available`.
pub fn rearms(refused_at_seq: u64, seq: u64, deltas: &Deltas) -> bool {
    seq > refused_at_seq && deltas[AVAILABLE] > 0
}

/// The kinds of event a webhook endpoint may ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EventType {
    BalanceThresholdCrossed,
    BalanceRecovered,
    OverageThresholdCrossed,
    AcquireRefused,
    LeaseReclaimed,
    CreditReceived,
}

impl EventType {
    pub const ALL: [EventType; 6] = [
        EventType::BalanceThresholdCrossed,
        EventType::BalanceRecovered,
        EventType::OverageThresholdCrossed,
        EventType::AcquireRefused,
        EventType::LeaseReclaimed,
        EventType::CreditReceived,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EventType::BalanceThresholdCrossed => "balance.threshold_crossed",
            EventType::BalanceRecovered => "balance.recovered",
            EventType::OverageThresholdCrossed => "overage.threshold_crossed",
            EventType::AcquireRefused => "acquire.refused_insufficient_balance",
            EventType::LeaseReclaimed => "lease.reclaimed",
            EventType::CreditReceived => "credit.received",
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        EventType::ALL.into_iter().find(|kind| kind.as_str() == value)
    }

    /// A non-empty list of event type names, without repeats, sorted.
    pub fn parse_list<'a>(values: impl IntoIterator<Item = &'a str>) -> Result<Vec<Self>, Error> {
        let mut types = values
            .into_iter()
            .map(|v| Self::parse(v).ok_or(Error::InvalidEventTypes))
            .collect::<Result<Vec<_>, _>>()?;
        types.sort();
        types.dedup();
        if types.is_empty() {
            return Err(Error::InvalidEventTypes);
        }
        Ok(types)
    }
}

/// An event, as derived: what happened to which account, and its counters
/// after the change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Unique, and the same however often the same cause is derived, so a
    /// store that derives an entry twice keeps one event.
    pub event_id: String,
    pub event_type: EventType,
    pub account_id: String,
    /// The account's counters after the change, in `COUNTER_NAMES` order.
    pub counters: [u64; COUNTERS],
    /// The journal entry that caused the event; none for a refused acquire.
    pub journal_seq: Option<u64>,
    pub rule_id: Option<String>,
    pub lease_id: Option<String>,
    pub credit_id: Option<String>,
    /// Units credited, for `credit.received`.
    pub units: Option<u64>,
    /// When the cause happened (the entry's time, or the refusal's).
    pub at: Timestamp,
}

/// The id of the event `event_type` that `subject` (a rule or lease id) of
/// entry `seq` of `account_id` caused.
fn event_id(account_id: &str, seq: u64, event_type: EventType, subject: &str) -> String {
    let mut hash = Sha256::new();
    for part in [account_id, &seq.to_string(), event_type.as_str(), subject] {
        hash.update(part.len().to_be_bytes());
        hash.update(part.as_bytes());
    }
    let digest = hash.finalize();
    let hex: String = digest[..16].iter().map(|byte| format!("{byte:02x}")).collect();
    format!("evt_{hex}")
}

/// Whether an endpoint created at `created_at` for `event_types` receives
/// `event`: it asks for the event's type, and the event's cause came after
/// the endpoint's creation. A store that derives events after the fact thus
/// sends an endpoint the same events as one that derives them as they happen
/// (a cause at the very instant of the creation is sent by neither).
pub fn endpoint_wants(event_types: &[EventType], created_at: Timestamp, event: &Event) -> bool {
    event_types.contains(&event.event_type) && event.at > created_at
}

/// What deriving one entry decides.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Derived {
    /// The account's counters after the entry.
    pub after: [u64; COUNTERS],
    pub events: Vec<Event>,
    /// The `acquire_refused` rules the entry re-arms.
    pub rearmed: Vec<String>,
}

/// The events `entry` causes for an account whose counters were `before`
/// it, under `rules` (the account's rules). An entry whose deltas do not
/// apply to `before` means the journal and the derivation's cursor disagree.
pub fn derive(rules: &[AlertRule], before: &[u64; COUNTERS], entry: &impl EntryView) -> Result<Derived, Error> {
    let (seq, deltas) = (entry.seq(), entry.deltas());
    let after = apply(before, &deltas, seq, entry.account_id())?;
    let mut derived = Derived { after, ..Derived::default() };
    let base = |event_type: EventType, subject: &str| Event {
        event_id: event_id(entry.account_id(), seq, event_type, subject),
        event_type,
        account_id: entry.account_id().to_owned(),
        counters: after,
        journal_seq: Some(seq),
        rule_id: None,
        lease_id: None,
        credit_id: None,
        units: None,
        at: entry.at(),
    };
    for rule in rules.iter().filter(|rule| rule.from_seq < seq) {
        if let Some(event_type) = rule.condition.crossing(before, &after) {
            derived.events.push(Event { rule_id: Some(rule.rule_id.clone()), ..base(event_type, &rule.rule_id) });
        }
        if rule.refused_at_seq.is_some_and(|refused| rearms(refused, seq, &deltas)) {
            derived.rearmed.push(rule.rule_id.clone());
        }
    }
    match entry.kind() {
        EntryKind::Credit => {
            let credit_id = entry.ids().credit_id.clone().unwrap_or_default();
            let units = u64::try_from(deltas[CREDITED]).ok();
            derived.events.push(Event {
                credit_id: Some(credit_id.clone()),
                units,
                ..base(EventType::CreditReceived, &credit_id)
            });
        }
        EntryKind::Reclaim => {
            for lease_id in &entry.ids().leases {
                derived
                    .events
                    .push(Event { lease_id: Some(lease_id.clone()), ..base(EventType::LeaseReclaimed, lease_id) });
            }
        }
        _ => {}
    }
    Ok(derived)
}

/// Whether [`derive`] decides nothing for an entry numbered `seq` of
/// `kind` that moves its account's counters by `deltas`, under `rules`: no
/// rule judging it reads a counter it moves (`Condition::watches`), it
/// re-arms no rule, and its kind causes no event of its own (only a credit
/// or a reclaim does). Such an entry emits no event whatever the counters
/// were before it, so a store may skip deriving it.
pub fn is_silent(rules: &[AlertRule], seq: u64, kind: EntryKind, deltas: &Deltas) -> bool {
    if matches!(kind, EntryKind::Credit | EntryKind::Reclaim) {
        return false;
    }
    let moved = |condition: &Condition| deltas.iter().enumerate().any(|(i, &d)| d != 0 && condition.watches(i));
    rules
        .iter()
        .filter(|rule| rule.from_seq < seq)
        .all(|rule| !moved(&rule.condition) && !rule.refused_at_seq.is_some_and(|refused| rearms(refused, seq, deltas)))
}

fn apply(before: &[u64; COUNTERS], deltas: &Deltas, seq: u64, account_id: &str) -> Result<[u64; COUNTERS], Error> {
    let mut after = [0u64; COUNTERS];
    for (i, slot) in after.iter_mut().enumerate() {
        *slot = u64::try_from(i128::from(before[i]) + deltas[i]).map_err(|_| {
            Error::StorageCorrupt(format!(
                "journal entry {seq} of account {account_id} does not apply to the derived counters"
            ))
        })?;
    }
    Ok(after)
}

/// The events a refused acquire causes: one per armed `acquire_refused`
/// rule, each of which it disarms (`refused_at_seq = seq`). `seq` is the
/// account's journal sequence number at the refusal, `counters` its
/// counters, `nonce` makes the ids of two refusals at one `seq` distinct.
pub fn refusal_events(
    rules: &mut [AlertRule],
    account_id: &str,
    seq: u64,
    counters: &[u64; COUNTERS],
    at: Timestamp,
    nonce: &str,
) -> Vec<Event> {
    let armed =
        rules.iter_mut().filter(|rule| rule.condition == Condition::AcquireRefused && rule.refused_at_seq.is_none());
    let mut events = Vec::new();
    for rule in armed {
        rule.refused_at_seq = Some(seq);
        events.push(Event {
            event_id: event_id(account_id, seq, EventType::AcquireRefused, &format!("{}:{nonce}", rule.rule_id)),
            event_type: EventType::AcquireRefused,
            account_id: account_id.to_owned(),
            counters: *counters,
            journal_seq: None,
            rule_id: Some(rule.rule_id.clone()),
            lease_id: None,
            credit_id: None,
            units: None,
            at,
        });
    }
    events
}

/// Checks a new endpoint: its URL ([`validate_url`]) and at least one
/// event type.
pub fn validate_endpoint(url: &str, event_types: &[EventType]) -> Result<(), Error> {
    validate_url(url)?;
    if event_types.is_empty() {
        return Err(Error::InvalidEventTypes);
    }
    Ok(())
}

/// When and for how long failed deliveries are tried again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// The wait after the first failed attempt; it doubles after each.
    pub first: SignedDuration,
    /// The longest wait between two attempts.
    pub cap: SignedDuration,
    /// How long after its event a delivery is given up as failed.
    pub give_up_after: SignedDuration,
}

impl RetryPolicy {
    pub const DEFAULT: RetryPolicy = RetryPolicy {
        first: SignedDuration::from_secs(5),
        cap: SignedDuration::from_hours(1),
        give_up_after: SignedDuration::from_hours(24),
    };

    /// What follows the failed `attempt` (1 for the first) of a delivery
    /// created at `created_at`, failed at `now`: the next attempt's time, or
    /// `None` when that would be past the give-up time. `jitter` in [0, 1]
    /// spreads the wait over its upper half, so receivers that come back are
    /// not met by every delivery at once.
    pub fn after_failure(&self, attempt: u32, created_at: Timestamp, now: Timestamp, jitter: f64) -> Option<Timestamp> {
        let doublings = attempt.saturating_sub(1).min(40);
        let wait = self.first.checked_mul(1 << doublings.min(30)).unwrap_or(self.cap).min(self.cap);
        let spread = wait.as_secs_f64() * (0.5 + 0.5 * jitter.clamp(0.0, 1.0));
        let next = now.checked_add(SignedDuration::from_secs_f64(spread)).ok()?;
        let deadline = created_at.checked_add(self.give_up_after).unwrap_or(Timestamp::MAX);
        (next <= deadline).then_some(next)
    }
}

/// A webhook URL: `http` or `https`, with a host, at most
/// [`URL_BYTES_MAX`] bytes, no credentials and no fragment.
pub fn validate_url(url: &str) -> Result<(), Error> {
    let rest = url.strip_prefix("https://").or_else(|| url.strip_prefix("http://"));
    let host = rest.map(|rest| rest.split(['/', '?']).next().unwrap_or(""));
    let valid = url.len() <= URL_BYTES_MAX
        && host.is_some_and(|host| !host.is_empty() && !host.contains('@'))
        && !url.contains('#')
        && url.bytes().all(|b| b.is_ascii_graphic());
    if valid { Ok(()) } else { Err(Error::InvalidWebhookUrl) }
}

/// The `Tollgate-Signature` header of `body` sent at `timestamp` (Unix
/// seconds): `t=<timestamp>` and one `v1=<hex HMAC-SHA256 of
/// "<timestamp>.<body>">` per secret, so that a receiver holding either
/// secret of a rotation accepts it.
pub fn signature_header<'a>(secrets: impl IntoIterator<Item = &'a [u8]>, timestamp: i64, body: &[u8]) -> String {
    let mut header = format!("t={timestamp}");
    for secret in secrets {
        let mac = hmac_sha256(secret, &[timestamp.to_string().as_bytes(), b".", body]);
        header.push_str(",v1=");
        header.extend(mac.iter().map(|byte| format!("{byte:02x}")));
    }
    header
}

/// Why a signature header does not verify.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("the signature header is not t=<seconds>,v1=<hex>[,v1=<hex>…]")]
    Malformed,
    #[error("the signature's timestamp is outside the tolerance")]
    Stale,
    #[error("no signature matches any of the secrets")]
    Mismatch,
}

/// Checks a `Tollgate-Signature` header against the exact `body` received:
/// its timestamp within `tolerance_s` seconds of `now_s`, and one of its
/// `v1` signatures made with one of `secrets` (each compared in constant
/// time). Receivers should also drop event ids they have seen.
pub fn verify_signature(
    header: &str,
    body: &[u8],
    secrets: &[&[u8]],
    tolerance_s: u64,
    now_s: i64,
) -> Result<(), SignatureError> {
    let mut timestamp = None;
    let mut signatures = Vec::new();
    for part in header.split(',').map(str::trim) {
        match part.split_once('=') {
            Some(("t", value)) => timestamp = Some(value.parse::<i64>().map_err(|_| SignatureError::Malformed)?),
            Some(("v1", value)) => signatures.push(decode_hex(value).ok_or(SignatureError::Malformed)?),
            _ => {}
        }
    }
    let timestamp = timestamp.ok_or(SignatureError::Malformed)?;
    if signatures.is_empty() {
        return Err(SignatureError::Malformed);
    }
    if now_s.abs_diff(timestamp) > tolerance_s {
        return Err(SignatureError::Stale);
    }
    let matches = secrets.iter().any(|secret| {
        let expected = hmac_sha256(secret, &[timestamp.to_string().as_bytes(), b".", body]);
        signatures.iter().any(|candidate| bool::from(candidate.as_slice().ct_eq(expected.as_slice())))
    });
    if matches { Ok(()) } else { Err(SignatureError::Mismatch) }
}

fn decode_hex(value: &str) -> Option<Vec<u8>> {
    if !value.len().is_multiple_of(2) {
        return None;
    }
    (0..value.len()).step_by(2).map(|i| u8::from_str_radix(value.get(i..i + 2)?, 16).ok()).collect()
}

/// HMAC-SHA256 of the concatenated `parts` under `key`.
fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    for part in parts {
        mac.update(part);
    }
    mac.finalize().into_bytes().into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::EntryIds;

    fn counters(credited: u64, available: u64, overage: u64) -> [u64; COUNTERS] {
        [credited, available, credited - available, 0, overage, 0, 1]
    }

    fn rule(id: &str, condition: Condition) -> AlertRule {
        AlertRule {
            rule_id: id.into(),
            account_id: "acme".into(),
            condition,
            created_at: Timestamp::UNIX_EPOCH,
            from_seq: 0,
            refused_at_seq: None,
        }
    }

    fn entry(seq: u64, kind: EntryKind, available: i128) -> Entry {
        let mut deltas = [0; COUNTERS];
        deltas[AVAILABLE] = available;
        deltas[2] = -available;
        Entry { account_id: "acme".into(), seq, kind, deltas, ids: EntryIds::default(), at: Timestamp::UNIX_EPOCH }
    }

    #[test]
    fn a_balance_fires_once_per_crossing_and_recovers_once() {
        let rules = [rule("r", Condition::AvailableBelow { units: 100 })];
        let mut now = counters(1_000, 150, 0);
        let mut fired = Vec::new();
        for (seq, step) in [(1, -40), (2, -20), (3, -10), (4, 5), (5, 100), (6, -100)] {
            let derived = derive(&rules, &now, &entry(seq, EntryKind::Acquire, step)).unwrap();
            fired.extend(derived.events.iter().map(|e| e.event_type));
            now = derived.after;
        }
        assert_eq!(
            fired,
            [EventType::BalanceThresholdCrossed, EventType::BalanceRecovered, EventType::BalanceThresholdCrossed]
        );
    }

    #[test]
    fn percent_and_overage_conditions_hold_at_their_bounds() {
        let percent = Condition::AvailableBelowPercent { percent: 10 };
        assert_eq!(percent.holds(&counters(1_000, 99, 0)), Some(true));
        assert_eq!(percent.holds(&counters(1_000, 100, 0)), Some(false));
        let overage = Condition::OverageAbove { units: 5 };
        assert_eq!(
            overage.crossing(&counters(10, 10, 5), &counters(10, 10, 6)),
            Some(EventType::OverageThresholdCrossed)
        );
        assert_eq!(overage.crossing(&counters(10, 10, 6), &counters(10, 10, 9)), None);
        assert_eq!(Condition::AcquireRefused.holds(&counters(1, 1, 0)), None);
    }

    #[test]
    fn conditions_parse_only_with_their_thresholds() {
        assert_eq!(Condition::parse("available_below", Some(3)), Ok(Condition::AvailableBelow { units: 3 }));
        assert_eq!(Condition::parse("available_below_percent", Some(101)), Err(Error::InvalidCondition));
        assert_eq!(Condition::parse("available_below_percent", Some(0)), Err(Error::InvalidCondition));
        assert_eq!(Condition::parse("acquire_refused", Some(1)), Err(Error::InvalidCondition));
        assert_eq!(Condition::parse("acquire_refused", None), Ok(Condition::AcquireRefused));
        assert_eq!(Condition::parse("balance", Some(1)), Err(Error::InvalidCondition));
    }

    #[test]
    fn a_rule_judges_only_entries_after_its_creation() {
        let mut later = rule("r", Condition::AvailableBelow { units: 100 });
        later.from_seq = 5;
        let derived = derive(&[later.clone()], &counters(1_000, 150, 0), &entry(5, EntryKind::Acquire, -100)).unwrap();
        assert!(derived.events.is_empty());
        let derived = derive(&[later], &counters(1_000, 150, 0), &entry(6, EntryKind::Acquire, -100)).unwrap();
        assert_eq!(derived.events.len(), 1);
    }

    #[test]
    fn the_same_cause_has_the_same_event_id_and_distinct_causes_differ() {
        let rules = [rule("r", Condition::AvailableBelow { units: 100 })];
        let before = counters(1_000, 150, 0);
        let first = derive(&rules, &before, &entry(2, EntryKind::Acquire, -100)).unwrap();
        let again = derive(&rules, &before, &entry(2, EntryKind::Acquire, -100)).unwrap();
        let other = derive(&rules, &before, &entry(3, EntryKind::Acquire, -100)).unwrap();
        assert_eq!(first.events[0].event_id, again.events[0].event_id);
        assert_ne!(first.events[0].event_id, other.events[0].event_id);
    }

    #[test]
    fn reclaims_and_credits_emit_one_event_per_lease_and_credit() {
        let mut reclaim = entry(2, EntryKind::Reclaim, 30);
        reclaim.ids.leases = vec!["l1".into(), "l2".into()];
        let derived = derive(&[], &counters(1_000, 100, 0), &reclaim).unwrap();
        assert_eq!(derived.events.iter().map(|e| e.lease_id.as_deref().unwrap()).collect::<Vec<_>>(), ["l1", "l2"]);
        let mut credit = entry(3, EntryKind::Credit, 50);
        credit.deltas = [50, 50, 0, 0, 0, 0, 0];
        credit.ids.credit_id = Some("c1".into());
        let derived = derive(&[], &counters(1_000, 100, 0), &credit).unwrap();
        assert_eq!(derived.events[0].event_type, EventType::CreditReceived);
        assert_eq!(derived.events[0].units, Some(50));
        assert_eq!(derived.after[0], 1_050);
    }

    #[test]
    fn a_refusal_fires_once_until_available_rises() {
        let mut refused = [rule("r", Condition::AcquireRefused)];
        let fired = refusal_events(&mut refused, "acme", 4, &counters(10, 0, 0), Timestamp::UNIX_EPOCH, "n");
        assert_eq!(fired.len(), 1);
        assert_eq!(refused[0].refused_at_seq, Some(4), "the rule that fired is disarmed");
        assert!(refusal_events(&mut refused, "acme", 4, &counters(10, 0, 0), Timestamp::UNIX_EPOCH, "n").is_empty());
        let [refused] = refused;
        let falling =
            derive(std::slice::from_ref(&refused), &counters(10, 5, 0), &entry(5, EntryKind::Acquire, -1)).unwrap();
        assert!(falling.rearmed.is_empty());
        let rising = derive(&[refused], &counters(10, 5, 0), &entry(5, EntryKind::Release, 1)).unwrap();
        assert_eq!(rising.rearmed, ["r"]);
    }

    /// Every condition, armed or waiting for re-arming, against an entry
    /// of every kind that moves one counter, either way, across each
    /// condition's threshold: an entry `is_silent` calls silent emits
    /// nothing and re-arms nothing, and every other one that moves a
    /// counter a rule reads is not silent.
    #[test]
    fn a_silent_entry_is_one_derive_decides_nothing_for() {
        let conditions = [
            Condition::AvailableBelow { units: 100 },
            Condition::AvailableBelowPercent { percent: 10 },
            Condition::OverageAbove { units: 5 },
            Condition::AcquireRefused,
        ];
        // Every counter above zero, so that a change of one by either sign applies.
        let before = [1_000, 100, 900, 10, 5, 10, 2];
        let kinds = [EntryKind::Acquire, EntryKind::Release, EntryKind::Consolidate, EntryKind::Usage];
        let mut silent = 0;
        for (condition, refused_at_seq, kind, counter, delta) in conditions
            .into_iter()
            .flat_map(|c| [(c, None), (c, Some(1))])
            .flat_map(|(c, r)| kinds.map(|k| (c, r, k)))
            .flat_map(|(c, r, k)| (0..COUNTERS).flat_map(move |i| [(c, r, k, i, -1), (c, r, k, i, 1)]))
        {
            let rules = [AlertRule { refused_at_seq, ..rule("r", condition) }];
            let mut moved = entry(2, kind, 0);
            moved.deltas[counter] = delta;
            let derived = derive(&rules, &before, &moved).unwrap();
            let decided = !derived.events.is_empty() || !derived.rearmed.is_empty();
            let quiet = is_silent(&rules, 2, kind, &moved.deltas);
            assert!(!(quiet && decided), "{condition:?} {refused_at_seq:?} {kind:?} counter {counter} by {delta}");
            assert_eq!(quiet, !condition.watches(counter) && !derived.rearmed.contains(&"r".to_owned()));
            silent += usize::from(quiet);
        }
        assert!(silent > 0);
        // A rule created at or after the entry does not judge it.
        let later = [AlertRule { from_seq: 2, ..rule("r", Condition::AvailableBelow { units: 100 }) }];
        assert!(is_silent(&later, 2, EntryKind::Acquire, &entry(2, EntryKind::Acquire, -1).deltas));
        // Credits and reclaims cause events of their own, with or without rules.
        for kind in [EntryKind::Credit, EntryKind::Reclaim] {
            assert!(!is_silent(&[], 2, kind, &[0; COUNTERS]));
        }
    }

    #[test]
    fn an_entry_that_does_not_apply_is_corruption() {
        let result = derive(&[], &counters(10, 5, 0), &entry(1, EntryKind::Acquire, -6));
        assert!(matches!(result, Err(Error::StorageCorrupt(_))));
    }

    #[test]
    fn retries_double_up_to_the_cap_and_stop_at_the_give_up_time() {
        let policy = RetryPolicy {
            first: SignedDuration::from_secs(10),
            cap: SignedDuration::from_secs(60),
            give_up_after: SignedDuration::from_secs(300),
        };
        let start = Timestamp::UNIX_EPOCH;
        let at = |attempt, jitter| policy.after_failure(attempt, start, start, jitter).map(|t| t.as_second());
        assert_eq!(at(1, 1.0), Some(10));
        assert_eq!(at(1, 0.0), Some(5));
        assert_eq!(at(3, 1.0), Some(40));
        assert_eq!(at(9, 1.0), Some(60));
        let late = start.checked_add(SignedDuration::from_secs(280)).unwrap();
        assert_eq!(policy.after_failure(9, start, late, 0.0), None);
    }

    #[test]
    fn urls_must_be_http_with_a_host() {
        for good in ["http://127.0.0.1:9000/hook", "https://example.com", "https://h.example/p?q=1"] {
            assert_eq!(validate_url(good), Ok(()), "{good}");
        }
        for bad in ["ftp://x", "http://", "https://u:p@h/", "http://h/#f", "http://h/ x", "example.com"] {
            assert_eq!(validate_url(bad), Err(Error::InvalidWebhookUrl), "{bad}");
        }
        assert_eq!(validate_url(&format!("https://h/{}", "a".repeat(URL_BYTES_MAX))), Err(Error::InvalidWebhookUrl));
    }

    #[test]
    fn hmac_matches_rfc_4231_case_2_and_long_keys_are_hashed() {
        let mac = hmac_sha256(b"Jefe", &[b"what do ya want ", b"for nothing?"]);
        let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
        // RFC 4231 case 6: a 131-byte key.
        let mac = hmac_sha256(&[0xaa; 131], &[b"Test Using Larger Than Block-Size Key - Hash Key First"]);
        let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
    }

    #[test]
    fn a_signature_verifies_under_either_secret_within_the_tolerance_only() {
        let header = signature_header([b"new".as_slice(), b"old".as_slice()], 1_000, b"{\"a\":1}");
        assert_eq!(verify_signature(&header, b"{\"a\":1}", &[b"old"], 300, 1_200), Ok(()));
        assert_eq!(verify_signature(&header, b"{\"a\":1}", &[b"other", b"new"], 300, 700), Ok(()));
        assert_eq!(verify_signature(&header, b"{\"a\":2}", &[b"new"], 300, 1_000), Err(SignatureError::Mismatch));
        assert_eq!(verify_signature(&header, b"{\"a\":1}", &[b"other"], 300, 1_000), Err(SignatureError::Mismatch));
        assert_eq!(verify_signature(&header, b"{\"a\":1}", &[b"new"], 300, 1_301), Err(SignatureError::Stale));
        for bad in ["", "t=1", "v1=00", "t=x,v1=00", "t=1,v1=0g", "t=1,v1=abc"] {
            assert_eq!(verify_signature(bad, b"", &[b"new"], 300, 1), Err(SignatureError::Malformed), "{bad}");
        }
    }

    #[test]
    fn the_signature_header_names_the_time_and_one_mac_per_secret() {
        let header = signature_header([b"one".as_slice(), b"two".as_slice()], 1_700_000_000, b"{}");
        let parts: Vec<&str> = header.split(',').collect();
        assert_eq!(parts[0], "t=1700000000");
        assert_eq!(parts.len(), 3);
        assert!(parts[1].starts_with("v1=") && parts[1].len() == 67 && parts[1] != parts[2]);
    }
}
