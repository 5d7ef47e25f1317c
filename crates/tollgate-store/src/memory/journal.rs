//! The memory store's journal: each account's entries, written under the
//! store's one lock in the same critical section as the change they record.
//!
//! An entry is kept compactly, because every acquire and release writes one:
//! its account and sequence number are where it is kept (entry `n` of an
//! account is at index `n - 1` of its list), a lease it names is kept as the
//! lease's key, and deltas that fit `i64` (all but changes near `u64::MAX`)
//! are kept as such. [`Stored::entry`] gives back the core's [`Entry`].

use std::borrow::Cow;
use std::collections::BTreeMap;

use jiff::Timestamp;
use tollgate_core::alerts::EntryView;
use tollgate_core::journal::{Change, Deltas, EntryIds, EntryKind, changed, check_replay};
use tollgate_core::{Account, COUNTERS, Entry, Error, PageLimit};

use super::State;
use super::accounts::AccountNumber;
use super::lease_ids::{LeaseKey, lease_id_of};
use crate::model::{JournalMismatch, JournalPage};

/// One account's entries, in sequence order, kept in the account's record.
#[derive(Default)]
pub(super) struct Journal {
    entries: Vec<Stored>,
}

/// One entry as kept.
struct Stored {
    at: Timestamp,
    deltas: StoredDeltas,
    ids: StoredIds,
    kind: EntryKind,
}

enum StoredDeltas {
    Narrow([i64; COUNTERS]),
    Wide(Box<Deltas>),
}

/// The ids of an entry as kept: the one lease of an acquire or release by its
/// key, any other set as the core gives it.
pub(super) enum StoredIds {
    Lease(LeaseKey),
    Other(Box<EntryIds>),
}

impl StoredIds {
    pub(super) fn other(ids: EntryIds) -> Self {
        StoredIds::Other(Box::new(ids))
    }

    fn ids(&self) -> EntryIds {
        match self {
            StoredIds::Lease(key) => EntryIds::lease(&lease_id_of(*key)),
            StoredIds::Other(ids) => (**ids).clone(),
        }
    }
}

impl StoredDeltas {
    fn of(deltas: Deltas) -> Self {
        let mut narrow = [0i64; COUNTERS];
        for (kept, delta) in narrow.iter_mut().zip(deltas) {
            match i64::try_from(delta) {
                Ok(delta) => *kept = delta,
                Err(_) => return StoredDeltas::Wide(Box::new(deltas)),
            }
        }
        StoredDeltas::Narrow(narrow)
    }

    fn deltas(&self) -> Deltas {
        match self {
            StoredDeltas::Narrow(narrow) => narrow.map(i128::from),
            StoredDeltas::Wide(wide) => **wide,
        }
    }
}

impl Stored {
    fn entry(&self, account_id: &str, seq: u64) -> Entry {
        Entry {
            account_id: account_id.to_owned(),
            seq,
            kind: self.kind,
            deltas: self.deltas.deltas(),
            ids: self.ids.ids(),
            at: self.at,
        }
    }
}

/// An entry as kept, read through the core's `EntryView` without being
/// rebuilt: its ids are spelled only if an event needs them.
pub(super) struct StoredEntry<'a> {
    account_id: &'a str,
    seq: u64,
    stored: &'a Stored,
}

impl EntryView for StoredEntry<'_> {
    fn account_id(&self) -> &str {
        self.account_id
    }
    fn seq(&self) -> u64 {
        self.seq
    }
    fn kind(&self) -> EntryKind {
        self.stored.kind
    }
    fn deltas(&self) -> Deltas {
        self.stored.deltas.deltas()
    }
    fn at(&self) -> Timestamp {
        self.stored.at
    }
    fn ids(&self) -> Cow<'_, EntryIds> {
        Cow::Owned(self.stored.ids.ids())
    }
}

impl Journal {
    /// Keeps the next entry of `account_id`, whose journal this is, and
    /// lends it back.
    fn push<'a>(
        &'a mut self,
        account_id: &'a str,
        kind: EntryKind,
        deltas: Deltas,
        ids: StoredIds,
        at: Timestamp,
    ) -> StoredEntry<'a> {
        self.entries.push(Stored { at, deltas: StoredDeltas::of(deltas), ids, kind });
        let seq = self.entries.len() as u64;
        StoredEntry { account_id, seq, stored: &self.entries[self.entries.len() - 1] }
    }

    /// How many entries the account has: the sequence number of its latest.
    pub(super) fn len(&self) -> u64 {
        self.entries.len() as u64
    }

    /// Entries `after + 1 ..` of `account_id`, whose journal this is, at most
    /// `count` of them.
    fn read(&self, account_id: &str, after: u64, count: usize) -> Vec<Entry> {
        let start = usize::try_from(after).unwrap_or(usize::MAX).min(self.entries.len());
        (start as u64 + 1..)
            .zip(&self.entries[start..])
            .take(count)
            .map(|(seq, stored)| stored.entry(account_id, seq))
            .collect()
    }
}

/// Accounts touched by a reclaim pass: each one's counters before the pass
/// and the leases the pass settled in it, so that it writes one entry per
/// account.
#[derive(Default)]
pub(super) struct ReclaimTouched {
    accounts: BTreeMap<String, (Account, Vec<String>)>,
}

impl ReclaimTouched {
    pub(super) fn settled(&mut self, before: &Account, lease_id: &str) {
        let (_, leases) =
            self.accounts.entry(before.account_id.clone()).or_insert_with(|| (before.clone(), Vec::new()));
        leases.push(lease_id.to_owned());
    }
}

impl State {
    /// Stores the core's new counters for an existing account and journals
    /// the change, if there is one, at `now`, deriving its events.
    pub(super) fn put_account(
        &mut self,
        number: AccountNumber,
        account: Account,
        kind: EntryKind,
        ids: StoredIds,
        now: Timestamp,
    ) {
        let Some(record) = self.accounts.at_mut(number) else { return };
        let Some(deltas) = changed(&record.account, &account) else {
            record.account = account;
            return;
        };
        let before = std::mem::replace(&mut record.account, account).counters();
        let entry = record.journal.push(&record.account.account_id, kind, deltas, ids, now);
        self.outbox.derive(&mut record.rules, &entry, before);
    }

    /// Journals `change` of an account whose counters were `before` it, and
    /// derives its events; a change of an account not stored is not kept.
    pub(super) fn record(&mut self, change: Change, before: [u64; COUNTERS], now: Timestamp) {
        let Change { account_id, kind, deltas, ids } = change;
        let Some(record) = self.accounts.get_mut(&account_id) else { return };
        let entry = record.journal.push(&account_id, kind, deltas, StoredIds::other(ids), now);
        self.outbox.derive(&mut record.rules, &entry, before);
    }

    /// One `reclaim` entry per account a pass settled leases in.
    pub(super) fn journal_reclaim(&mut self, touched: ReclaimTouched, now: Timestamp) {
        for (account_id, (before, leases)) in touched.accounts {
            let Ok(after) = self.account(&account_id) else { continue };
            if let Some(change) = Change::between(EntryKind::Reclaim, &before, after, EntryIds::reclaim(leases)) {
                self.record(change, before.counters(), now);
            }
        }
    }

    pub(super) fn journal_page(&self, account_id: &str, after: u64, limit: PageLimit) -> Result<JournalPage, Error> {
        let record = self.accounts.get(account_id).ok_or(Error::AccountNotFound)?;
        Ok(JournalPage::of(record.journal.read(account_id, after, limit.rows() + 1), limit.rows()))
    }

    /// Accounts whose journal does not replay to their counters.
    pub(super) fn journal_mismatches(&self) -> Vec<JournalMismatch> {
        self.accounts
            .values()
            .filter_map(|record| {
                let account = &record.account;
                let entries = record.journal.read(&account.account_id, 0, usize::MAX);
                let error = check_replay(account, &entries).err()?;
                Some(JournalMismatch { account_id: account.account_id.clone(), error })
            })
            .collect()
    }
}
