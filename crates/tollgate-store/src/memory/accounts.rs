//! The memory store's accounts: each record is kept once, under a number,
//! and found by id through a hash index, in id order through an ordered one,
//! and by number from the lease records that name their account.
//!
//! An operation on a lease reaches its account by number, with no string
//! lookup at all; an operation named by account id pays one hash lookup.

use std::collections::BTreeMap;
use std::ops::Bound;

use tollgate_core::{Account, AlertRule};

use super::journal::Journal;

/// An account's counters, its journal, its alert rules and how many active
/// leases it has, kept together: a change journaled on the account judges the
/// rules it finds beside the counters it changed, and an operation finds all
/// it writes of the account with one lookup.
pub(super) struct AccountRecord {
    pub(super) account: Account,
    pub(super) journal: Journal,
    /// Oldest first.
    pub(super) rules: Vec<AlertRule>,
    pub(super) active_leases: u64,
}

/// An account's number: its position in `Accounts::records`.
pub(super) type AccountNumber = u32;

#[derive(Default)]
pub(super) struct Accounts {
    /// By number; `None` only for a record removed to model corruption
    /// (`forget`), whose leases then name a missing account.
    records: Vec<Option<AccountRecord>>,
    /// Every id by number, so that a lease names its account's id even when
    /// the record is gone.
    ids: Vec<String>,
    by_id: foldhash::HashMap<String, AccountNumber>,
    in_order: BTreeMap<String, AccountNumber>,
}

impl Accounts {
    /// Stores a new account with zero counters; `false`, and nothing stored,
    /// when the id is taken.
    pub(super) fn insert(&mut self, account_id: &str) -> bool {
        if self.by_id.contains_key(account_id) {
            return false;
        }
        let number = AccountNumber::try_from(self.records.len()).expect("fewer than 2^32 accounts in memory");
        let account = Account::new(account_id.to_owned());
        let record = AccountRecord { account, journal: Journal::default(), rules: Vec::new(), active_leases: 0 };
        self.records.push(Some(record));
        self.ids.push(account_id.to_owned());
        self.by_id.insert(account_id.to_owned(), number);
        self.in_order.insert(account_id.to_owned(), number);
        true
    }

    pub(super) fn number(&self, account_id: &str) -> Option<AccountNumber> {
        self.by_id.get(account_id).copied()
    }

    pub(super) fn get(&self, account_id: &str) -> Option<&AccountRecord> {
        self.number(account_id).and_then(|number| self.at(number))
    }

    pub(super) fn get_mut(&mut self, account_id: &str) -> Option<&mut AccountRecord> {
        self.number(account_id).and_then(|number| self.at_mut(number))
    }

    pub(super) fn at(&self, number: AccountNumber) -> Option<&AccountRecord> {
        self.records.get(number as usize).and_then(Option::as_ref)
    }

    pub(super) fn at_mut(&mut self, number: AccountNumber) -> Option<&mut AccountRecord> {
        self.records.get_mut(number as usize).and_then(Option::as_mut)
    }

    /// The id of account `number`, kept even when its record is gone.
    pub(super) fn id(&self, number: AccountNumber) -> &str {
        &self.ids[number as usize]
    }

    pub(super) fn len(&self) -> usize {
        self.by_id.len()
    }

    /// The records in id order.
    pub(super) fn values(&self) -> impl Iterator<Item = &AccountRecord> {
        self.in_order.values().filter_map(|&number| self.at(number))
    }

    /// The ids from `lower` on, in order.
    pub(super) fn ids_from<'a>(&'a self, lower: Bound<&'a str>) -> impl Iterator<Item = &'a str> {
        self.in_order.range::<str, _>((lower, Bound::Unbounded)).map(|(id, _)| id.as_str())
    }

    /// Removes an account's record but not its leases: the one corruption a
    /// memory store can hold, made by tests.
    #[cfg(test)]
    pub(super) fn forget(&mut self, account_id: &str) {
        self.in_order.remove(account_id);
        if let Some(number) = self.by_id.remove(account_id) {
            self.records[number as usize] = None;
        }
    }
}
