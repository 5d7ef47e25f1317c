//! The memory store's journal: each account's entries, written under the
//! store's one lock in the same critical section as the change they record.

use std::collections::{BTreeMap, HashMap};

use jiff::Timestamp;
use tollgate_core::journal::{Change, EntryIds, EntryKind, check_replay};
use tollgate_core::{Account, Entry, Error, PageLimit};

use super::State;
use crate::model::{JournalMismatch, JournalPage};

/// Every account's entries, in sequence order: entry `n` is at index `n - 1`.
#[derive(Default)]
pub(super) struct Journals {
    entries: HashMap<String, Vec<Entry>>,
}

impl Journals {
    /// Numbers `change` as its account's next entry and keeps it.
    pub(super) fn record(&mut self, change: Change, now: Timestamp) {
        let entries = self.entries.entry(change.account_id.clone()).or_default();
        let seq = entries.len() as u64 + 1;
        entries.push(change.numbered(seq, now));
    }

    fn of(&self, account_id: &str) -> &[Entry] {
        self.entries.get(account_id).map(Vec::as_slice).unwrap_or(&[])
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
    /// the change, if there is one, at `now`.
    pub(super) fn put_account(&mut self, account: Account, kind: EntryKind, ids: EntryIds, now: Timestamp) {
        if let Some(before) = self.accounts.get(&account.account_id)
            && let Some(change) = Change::between(kind, before, &account, ids)
        {
            self.journals.record(change, now);
        }
        self.accounts.insert(account.account_id.clone(), account);
    }

    /// One `reclaim` entry per account a pass settled leases in.
    pub(super) fn journal_reclaim(&mut self, touched: ReclaimTouched, now: Timestamp) {
        for (account_id, (before, leases)) in touched.accounts {
            let Some(after) = self.accounts.get(&account_id) else { continue };
            if let Some(change) = Change::between(EntryKind::Reclaim, &before, after, EntryIds::reclaim(leases)) {
                self.journals.record(change, now);
            }
        }
    }

    pub(super) fn journal_page(&self, account_id: &str, after: u64, limit: PageLimit) -> Result<JournalPage, Error> {
        self.account(account_id)?;
        let entries = self.journals.of(account_id);
        let start = usize::try_from(after).unwrap_or(usize::MAX).min(entries.len());
        let rows = entries[start..].iter().take(limit.rows() + 1).cloned().collect();
        Ok(JournalPage::of(rows, limit.rows()))
    }

    /// Accounts whose journal does not replay to their counters.
    pub(super) fn journal_mismatches(&self) -> Vec<JournalMismatch> {
        self.accounts
            .values()
            .filter_map(|account| {
                let error = check_replay(account, self.journals.of(&account.account_id)).err()?;
                Some(JournalMismatch { account_id: account.account_id.clone(), error })
            })
            .collect()
    }
}
