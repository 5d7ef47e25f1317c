//! The account journal: one entry per change to an account's counters, and
//! the replay that proves the journal and the counters agree.
//!
//! Every operation that changes an account's counters records what it did to
//! them as one entry: the signed change of each counter (`deltas`, in
//! `COUNTER_NAMES` order), the kind of operation, the ids it involved, and the
//! server's `now`. Entries of one account are numbered 1, 2, 3, … with no
//! gaps. An operation that changes no counter (a credit replayed, a batch of
//! duplicates) records nothing, and a store writes an entry in the same atomic
//! step as the change it records, so an entry exists exactly when its change
//! does.
//!
//! Deltas are `i128`: a change between two `u64` counters always fits, so the
//! memory store's whole domain is covered; PostgreSQL's counters are
//! `BIGINT >= 0`, so its deltas always fit `BIGINT`.
//!
//! Replaying an account's entries from the first, starting from the counters
//! of a new account (`Account::new`), gives its counters exactly
//! ([`replay`]). Accounts that existed before the journal start with one
//! `opening` entry whose deltas are their counters at that time minus those of
//! a new account.

use jiff::Timestamp;

use crate::ledger::{Account, COUNTER_NAMES, COUNTERS};
use crate::usage::{IngestPlan, UsageEvent};

/// The signed change of each counter, in `COUNTER_NAMES` order.
pub type Deltas = [i128; COUNTERS];

/// What an entry records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EntryKind {
    /// The counters an account had when the journal began (written once, by
    /// the migration that introduced it, for accounts that existed then).
    Opening,
    Credit,
    Acquire,
    Release,
    Reclaim,
    Consolidate,
    Usage,
}

impl EntryKind {
    pub const ALL: [EntryKind; 7] = [
        EntryKind::Opening,
        EntryKind::Credit,
        EntryKind::Acquire,
        EntryKind::Release,
        EntryKind::Reclaim,
        EntryKind::Consolidate,
        EntryKind::Usage,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EntryKind::Opening => "opening",
            EntryKind::Credit => "credit",
            EntryKind::Acquire => "acquire",
            EntryKind::Release => "release",
            EntryKind::Reclaim => "reclaim",
            EntryKind::Consolidate => "consolidate",
            EntryKind::Usage => "usage",
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        EntryKind::ALL.into_iter().find(|kind| kind.as_str() == value)
    }
}

impl std::fmt::Display for EntryKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The ids an entry names. Which are set depends on the kind:
///
/// | kind | `credit_id` | `lease_id` | `leases` | `events` |
/// |---|---|---|---|---|
/// | `credit` | the credit | | | |
/// | `acquire` | | the lease granted | | |
/// | `release` | | the lease released | | |
/// | `consolidate` | | the lease granted | the sources, in request order | |
/// | `reclaim` | | | the leases of the account this pass settled | |
/// | `usage` | | | the leases the batch's accepted events touched | accepted events |
///
/// A usage batch holds up to 10,000 events, so its entry counts them rather
/// than naming every request id; the events themselves are stored apart.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EntryIds {
    pub credit_id: Option<String>,
    pub lease_id: Option<String>,
    pub leases: Vec<String>,
    pub events: Option<u64>,
}

/// One account's change, as an operation decided it, before the store
/// numbers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub account_id: String,
    pub kind: EntryKind,
    pub deltas: Deltas,
    pub ids: EntryIds,
}

/// A numbered entry of an account's journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub account_id: String,
    /// 1, 2, 3, … per account, with no gaps.
    pub seq: u64,
    pub kind: EntryKind,
    pub deltas: Deltas,
    pub ids: EntryIds,
    /// The server's `now` when the change was made.
    pub at: Timestamp,
}

/// `after - before` for each counter.
pub fn deltas(before: &Account, after: &Account) -> Deltas {
    let (before, after) = (before.counters(), after.counters());
    std::array::from_fn(|i| i128::from(after[i]) - i128::from(before[i]))
}

/// The deltas from `before` to `after`, or `None` when no counter changed: an
/// operation that changes no counter writes no entry.
pub fn changed(before: &Account, after: &Account) -> Option<Deltas> {
    Some(deltas(before, after)).filter(|deltas| *deltas != [0; COUNTERS])
}

impl Change {
    /// The change from `before` to `after` of one account, or `None` when no
    /// counter changed (`changed`).
    pub fn between(kind: EntryKind, before: &Account, after: &Account, ids: EntryIds) -> Option<Self> {
        let deltas = changed(before, after)?;
        Some(Change { account_id: after.account_id.clone(), kind, deltas, ids })
    }

    /// The entry this change becomes as the account's `seq`-th, at `at`.
    pub fn numbered(self, seq: u64, at: Timestamp) -> Entry {
        Entry { account_id: self.account_id, seq, kind: self.kind, deltas: self.deltas, ids: self.ids, at }
    }
}

impl EntryIds {
    pub fn credit(credit_id: &str) -> Self {
        Self { credit_id: Some(credit_id.to_owned()), ..Self::default() }
    }

    /// For an acquire (the lease granted) or a release (the lease released).
    pub fn lease(lease_id: &str) -> Self {
        Self { lease_id: Some(lease_id.to_owned()), ..Self::default() }
    }

    pub fn consolidate(granted: &str, sources: Vec<String>) -> Self {
        Self { lease_id: Some(granted.to_owned()), leases: sources, ..Self::default() }
    }

    pub fn reclaim(settled: Vec<String>) -> Self {
        Self { leases: settled, ..Self::default() }
    }
}

/// The ids in one line, as the CLI and the console print them:
/// `credit:ID lease:ID leases:A+B events:N`, each part only when present.
impl std::fmt::Display for EntryIds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        if let Some(credit_id) = &self.credit_id {
            parts.push(format!("credit:{credit_id}"));
        }
        if let Some(lease_id) = &self.lease_id {
            parts.push(format!("lease:{lease_id}"));
        }
        if !self.leases.is_empty() {
            parts.push(format!("leases:{}", self.leases.join("+")));
        }
        if let Some(events) = self.events {
            parts.push(format!("events:{events}"));
        }
        f.write_str(&parts.join(" "))
    }
}

/// One `usage` change per account whose counters a classified batch changed:
/// `before` gives each account as it was loaded. The leases are those the
/// accepted events of the account named, in first-named order.
pub fn usage_changes<'a>(
    batch: &[UsageEvent],
    plan: &IngestPlan,
    before: impl Fn(&str) -> Option<&'a Account>,
) -> Vec<Change> {
    let mut changes = Vec::new();
    for (account_id, after) in &plan.accounts {
        let Some(before) = before(account_id) else { continue };
        let mut leases: Vec<String> = Vec::new();
        let mut events = 0u64;
        for event in plan.accepted.iter().map(|&i| &batch[i]).filter(|e| &e.account_id == account_id) {
            events += 1;
            if let Some(lease_id) = &event.lease_id
                && !leases.contains(lease_id)
            {
                leases.push(lease_id.clone());
            }
        }
        let ids = EntryIds { leases, events: Some(events), ..EntryIds::default() };
        changes.extend(Change::between(EntryKind::Usage, before, after, ids));
    }
    changes
}

/// Why a journal does not replay to an account's counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplayError {
    /// The entry at `position` (0-based) has sequence number `found`, not
    /// `position + 1`.
    Gap { expected: u64, found: u64 },
    /// The entry `seq` is another account's.
    Foreign { seq: u64, account_id: String },
    /// Replayed, the counter differs from the account's.
    Counter { counter: &'static str, replayed: i128, stored: u64 },
    /// The sums of the deltas, or the count and last of the sequence numbers,
    /// differ from the account's counters and its count of entries (what a
    /// store that compares them set-based can tell).
    Diverges,
}

impl std::fmt::Display for ReplayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReplayError::Gap { expected, found } => write!(f, "entry {found} where {expected} was expected"),
            ReplayError::Foreign { seq, account_id } => write!(f, "entry {seq} belongs to account {account_id}"),
            ReplayError::Counter { counter, replayed, stored } => {
                write!(f, "{counter} replays to {replayed} but is {stored}")
            }
            ReplayError::Diverges => f.write_str("the sums of its deltas or its sequence numbers differ"),
        }
    }
}

/// The counters `entries` (the whole journal of one account, in sequence
/// order) replay to from those of a new account. Refuses a journal whose
/// sequence numbers are not 1, 2, 3, … .
pub fn replay<'a>(entries: impl IntoIterator<Item = &'a Entry>) -> Result<Deltas, ReplayError> {
    let mut counters: Deltas = Account::new(String::new()).counters().map(i128::from);
    for (expected, entry) in (1u64..).zip(entries) {
        if entry.seq != expected {
            return Err(ReplayError::Gap { expected, found: entry.seq });
        }
        for (counter, delta) in counters.iter_mut().zip(entry.deltas) {
            *counter += delta;
        }
    }
    Ok(counters)
}

/// Whether `entries`, the whole journal of `account`, replays to its counters;
/// the first difference otherwise.
pub fn check_replay<'a>(account: &Account, entries: impl IntoIterator<Item = &'a Entry>) -> Result<(), ReplayError> {
    let entries: Vec<&Entry> = entries.into_iter().collect();
    if let Some(entry) = entries.iter().find(|e| e.account_id != account.account_id) {
        return Err(ReplayError::Foreign { seq: entry.seq, account_id: entry.account_id.clone() });
    }
    let replayed = replay(entries)?;
    for ((counter, replayed), stored) in COUNTER_NAMES.into_iter().zip(replayed).zip(account.counters()) {
        if replayed != i128::from(stored) {
            return Err(ReplayError::Counter { counter, replayed, stored });
        }
    }
    Ok(())
}

#[cfg(test)]
mod display_tests {
    use super::*;

    #[test]
    fn ids_print_each_present_part_in_one_line() {
        let ids = EntryIds {
            credit_id: Some("c".into()),
            lease_id: Some("l".into()),
            leases: vec!["a".into(), "b".into()],
            events: Some(3),
        };
        assert_eq!(ids.to_string(), "credit:c lease:l leases:a+b events:3");
        assert_eq!(EntryIds::default().to_string(), "");
        assert_eq!(EntryIds::reclaim(vec!["x".into()]).to_string(), "leases:x");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::UnitDomain;

    fn entry(seq: u64, change: Change) -> Entry {
        change.numbered(seq, Timestamp::UNIX_EPOCH)
    }

    #[test]
    fn an_unchanged_account_makes_no_change_and_deltas_are_signed() {
        let before = Account::new("a".into());
        assert_eq!(Change::between(EntryKind::Credit, &before, &before, EntryIds::default()), None);
        let mut after = before.clone();
        after.credit(u64::MAX, UnitDomain::U64).unwrap();
        let change = Change::between(EntryKind::Credit, &before, &after, EntryIds::credit("c")).unwrap();
        assert_eq!(change.deltas, [i128::from(u64::MAX), i128::from(u64::MAX), 0, 0, 0, 0, 0]);
        let back = Change::between(EntryKind::Opening, &after, &before, EntryIds::default()).unwrap();
        assert_eq!(back.deltas[1], -i128::from(u64::MAX));
    }

    #[test]
    fn replay_reproduces_the_counters_and_names_the_first_difference() {
        let new = Account::new("a".into());
        let mut credited = new.clone();
        credited.credit(10, UnitDomain::U64).unwrap();
        let mut acquired = credited.clone();
        crate::ledger::acquire(
            &mut acquired,
            4,
            jiff::SignedDuration::from_secs(1),
            Timestamp::UNIX_EPOCH,
            &crate::time::GrantPolicy::new(jiff::SignedDuration::from_secs(60), jiff::SignedDuration::ZERO, 10)
                .unwrap(),
            UnitDomain::U64,
        )
        .unwrap();
        let entries = vec![
            entry(1, Change::between(EntryKind::Credit, &new, &credited, EntryIds::credit("c")).unwrap()),
            entry(2, Change::between(EntryKind::Acquire, &credited, &acquired, EntryIds::lease("l")).unwrap()),
        ];
        assert_eq!(check_replay(&acquired, &entries), Ok(()));
        assert_eq!(check_replay(&new, &[]), Ok(()));
        assert_eq!(
            check_replay(&credited, &entries),
            Err(ReplayError::Counter { counter: "available", replayed: 6, stored: 10 })
        );
        let gap = [entries[1].clone()];
        assert_eq!(check_replay(&acquired, &gap), Err(ReplayError::Gap { expected: 1, found: 2 }));
        let other = Account::new("b".into());
        assert!(matches!(check_replay(&other, &entries), Err(ReplayError::Foreign { seq: 1, .. })));
    }

    #[test]
    fn kinds_round_trip_through_their_names() {
        for kind in EntryKind::ALL {
            assert_eq!(EntryKind::parse(kind.as_str()), Some(kind));
        }
        assert_eq!(EntryKind::parse("refund"), None);
    }
}
