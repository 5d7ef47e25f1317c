//! The memory store's reclaim pass.

use jiff::Timestamp;
use tollgate_core::ledger;
use tollgate_core::{Error, GrantPolicy, Lease, ReclaimPass};

use super::journal::ReclaimTouched;
use super::lease_ids::LeaseKey;
use super::{DOMAIN, State, orphan, skip};
use crate::model::{LeaseSummary, ReclaimReport, ReclaimedLease, SkippedLease, reclaim_read_max};

impl State {
    /// Settles the due leases of one pass (`due_leases`), in account order,
    /// with one journal entry per account.
    pub(super) fn reclaim(
        &mut self,
        now: Timestamp,
        cutoff: Timestamp,
        limit: u32,
        policy: &GrantPolicy,
    ) -> Result<ReclaimReport, Error> {
        let (mut due, mut skipped) = self.due_leases(cutoff, limit);
        // Keys order like the ids they spell.
        due.sort_by(|(a_key, a), (b_key, b)| (&a.account_id, a_key).cmp(&(&b.account_id, b_key)));
        let mut reclaimed = Vec::with_capacity(due.len());
        let mut touched = ReclaimTouched::default();
        for (key, mut lease) in due {
            let mut account = self.account(&lease.account_id).map_err(|_| orphan(&lease))?.clone();
            let before = account.clone();
            match ledger::reclaim(&mut account, &mut lease, now, policy, DOMAIN) {
                Ok(Some(settlement)) => {
                    reclaimed.push(ReclaimedLease {
                        lease_id: lease.lease_id.clone(),
                        account_id: lease.account_id.clone(),
                        settlement,
                    });
                    touched.settled(&before, &lease.lease_id);
                    self.store_account(account);
                    self.store_settled(key, &lease);
                }
                Ok(None) => {}
                Err(error) => skipped.push(skip(&lease, &error)),
            }
        }
        self.journal_reclaim(touched, now);
        Ok(ReclaimReport { reclaimed, skipped, limit })
    }

    /// The due leases a reclaim pass settles (`ReclaimPass::accounts`): the
    /// accounts of the most overdue leases, each with its due leases in
    /// expiry order, up to `limit`, each with its key; and the most overdue
    /// leases whose account is gone, skipped.
    fn due_leases(&self, cutoff: Timestamp, limit: u32) -> (Vec<(LeaseKey, Lease)>, Vec<SkippedLease>) {
        let mut skipped = Vec::new();
        let mut heads = Vec::new();
        let most_overdue = self.active_by_expiry.iter().take_while(|(expiry, _)| *expiry <= cutoff);
        for &(_, key) in most_overdue.take(reclaim_read_max(limit) as usize) {
            let Some(record) = self.leases.get(&key) else { continue };
            if self.accounts.at(record.account).is_some() {
                heads.push(record.account);
            } else {
                let lease = self.lease_of(key, record);
                skipped.push(skip(&lease, &orphan(&lease)));
            }
        }
        let mut due = Vec::with_capacity(limit as usize);
        for account in ReclaimPass::accounts(heads) {
            let account_due =
                self.active_by_account.range((account, Timestamp::MIN, 0)..=(account, cutoff, LeaseKey::MAX));
            for &(_, _, key) in account_due.take(limit as usize - due.len()) {
                if let Some(record) = self.leases.get(&key) {
                    due.push((key, self.lease_of(key, record)));
                }
            }
            if due.len() == limit as usize {
                break;
            }
        }
        (due, skipped)
    }

    /// The fleet's leases (`Store::lease_summary`) from the expiry index,
    /// which holds exactly the active leases in `(expiry, lease_id)` order:
    /// the due ones are its prefix up to `cutoff`, the core's reclaim
    /// boundary, and none is due when that underflowed (`None`).
    pub(super) fn lease_summary(&self, cutoff: Option<Timestamp>) -> LeaseSummary {
        let active = self.active_by_expiry.len() as u64;
        let Some(cutoff) = cutoff else {
            return LeaseSummary { active, due: 0, oldest_due_expiry: None };
        };
        let due = self.active_by_expiry.range(..=(cutoff, LeaseKey::MAX)).count() as u64;
        let oldest_due_expiry = self.active_by_expiry.first().map(|&(expiry, _)| expiry).filter(|&e| e <= cutoff);
        LeaseSummary { active, due, oldest_due_expiry }
    }
}
