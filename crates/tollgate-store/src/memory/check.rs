//! The operator's check over the memory store: conservation per account,
//! lease counts by state and bound, and the journals' replay.

use std::collections::{BTreeMap, HashMap};

use tollgate_core::ledger::LeaseState;
use tollgate_core::{Lease, check_conservation};

use super::State;
use crate::model::{CheckReport, LegacyBoundCount};

impl State {
    pub(super) fn check_report(&self) -> CheckReport {
        let leases: Vec<Lease> = self.leases.iter().map(|(&key, record)| self.lease_of(key, record)).collect();
        let mut leases_by_account: HashMap<&str, Vec<&Lease>> = HashMap::new();
        let mut bounds: BTreeMap<(LeaseState, bool), u64> = BTreeMap::new();
        for lease in &leases {
            leases_by_account.entry(lease.account_id.as_str()).or_default().push(lease);
            *bounds.entry((lease.state, lease.expiry_is_upper_bound)).or_default() += 1;
        }
        let mut violations = Vec::new();
        for account in self.accounts.values().map(|record| &record.account) {
            let leases = leases_by_account.get(account.account_id.as_str()).map(Vec::as_slice).unwrap_or(&[]);
            violations.extend(check_conservation(account, leases.iter().copied()));
        }
        let legacy_bounds = bounds
            .into_iter()
            .map(|((state, expiry_is_upper_bound), count)| LegacyBoundCount { state, expiry_is_upper_bound, count })
            .collect();
        CheckReport {
            accounts_checked: self.accounts.len() as u64,
            violations,
            legacy_bounds,
            guard_violations: Vec::new(),
            journal_mismatches: self.journal_mismatches(),
            usage_totals_mismatches: Vec::new(),
        }
    }
}
