//! The locking path: each operation in one transaction, a locking read and
//! one write (`persist`). Keyed requests and the operations without an
//! unlocked path always run here; acquire, release and reclaim run here when
//! their unlocked attempt gives way.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use jiff::Timestamp;
use sqlx::PgConnection;
use tollgate_core::journal::EntryKind::{Acquire, Consolidate, Reclaim, Release};
use tollgate_core::ledger;
use tollgate_core::{Account, Change, EntryIds, Error, InstantPair, Lease};
use tollgate_store::{
    Acquisition, Consolidated, Consolidation, IssuedLease, ReclaimReport, Released, SkippedLease, new_capability,
    new_lease_id,
};

use super::errors::storage_error;
use super::load::{Busy, held, load_held, lock_account, lock_account_leases, lock_account_rows, sorted_ids};
use super::persist::{Changes, persist};
use super::rows::LeaseRow;
use super::sql::{LOCK_DUE_SQL, LOCK_HELD_LEASE_SQL};
use super::unlocked::{read_due, reclaimed_lease, skip};
use super::{DOMAIN, Engine};

impl Engine {
    /// Names a lease the core granted and draws its capability.
    pub(super) fn issue(account_id: &str, grant: ledger::Grant) -> IssuedLease {
        let capability = new_capability();
        IssuedLease { lease: grant.into_lease(new_lease_id(), account_id.to_owned()), capability }
    }

    /// Grants a lease the core decided and stages it for persisting.
    pub(super) fn stage_grant(account_id: &str, grant: ledger::Grant, changes: &mut Changes<'_>) -> IssuedLease {
        let issued = Self::issue(account_id, grant);
        changes.granted.push((issued.lease.clone(), issued.capability.hash()));
        issued
    }

    pub(super) async fn acquire_locked(
        &self,
        conn: &mut PgConnection,
        request: Acquisition<'_>,
        now: Timestamp,
    ) -> Result<IssuedLease, Error> {
        let Acquisition { account_id, units, ttl } = request;
        let mut account = lock_account(conn, account_id).await?;
        let before = account.clone();
        let grant = ledger::acquire(&mut account, units, ttl, now, &self.policy, DOMAIN)?;
        let mut changes = Changes { now, ..Changes::default() };
        let issued = Self::stage_grant(account_id, grant, &mut changes);
        changes.journal.extend(Change::between(Acquire, &before, &account, EntryIds::lease(&issued.lease.lease_id)));
        changes.accounts.push(account);
        persist(conn, &changes).await?;
        Ok(issued)
    }

    pub(super) async fn release_locked(
        &self,
        conn: &mut PgConnection,
        request: tollgate_store::Release<'_>,
        now: Timestamp,
    ) -> Result<Released, Error> {
        let tollgate_store::Release { account_id, lease_id, capability } = request;
        let (mut account, record) = load_held(conn, LOCK_HELD_LEASE_SQL, account_id, lease_id).await?;
        let before = account.clone();
        let mut lease = held(Some(&record), capability)?;
        let settlement = ledger::release(&mut account, &mut lease, now, &self.policy, DOMAIN)?;
        let journal = Change::between(Release, &before, &account, EntryIds::lease(lease_id)).into_iter().collect();
        let changes =
            Changes { accounts: vec![account], leases: vec![lease.clone()], journal, now, ..Changes::default() };
        persist(conn, &changes).await?;
        Ok(Released { lease, settlement })
    }

    pub(super) async fn consolidate_locked(
        &self,
        conn: &mut PgConnection,
        request: Consolidation<'_>,
        now: Timestamp,
    ) -> Result<Consolidated, Error> {
        let Consolidation { account_id, sources, extra_units, ttl } = request;
        let mut account = lock_account(conn, account_id).await?;
        let before = account.clone();
        let lease_ids = sorted_ids(sources.iter().map(|h| h.lease_id.as_str()));
        // Sources are found under the account alone: a lease of another
        // account is not found, exactly like an unknown one.
        let records = lock_account_leases(conn, account_id, &lease_ids).await?;
        let mut leases = sources
            .iter()
            .map(|handle| held(records.get(&handle.lease_id), &handle.capability))
            .collect::<Result<Vec<_>, _>>()?;
        let (grant, settlements) =
            ledger::consolidate(&mut account, &mut leases, extra_units, ttl, now, &self.policy, DOMAIN)?;
        let mut changes = Changes { leases: leases.clone(), now, ..Changes::default() };
        let lease = Self::stage_grant(account_id, grant, &mut changes);
        let sources = leases.iter().map(|l| l.lease_id.clone()).collect();
        let ids = EntryIds::consolidate(&lease.lease.lease_id, sources);
        changes.journal.extend(Change::between(Consolidate, &before, &account, ids));
        changes.accounts.push(account);
        persist(conn, &changes).await?;
        Ok(Consolidated { lease, settlements: leases.into_iter().zip(settlements).collect() })
    }

    /// The locking reclaim pass: locks due leases and then their accounts,
    /// both with `SKIP LOCKED`, so it never waits. Corrupt rows are skipped
    /// and reported, as on the unlocked path.
    pub(super) async fn reclaim_locking(
        &self,
        tx: &mut PgConnection,
        now: Timestamp,
        cutoff: InstantPair,
        limit: u32,
    ) -> Result<ReclaimReport, Error> {
        let (due, mut skipped) = lock_due(tx, cutoff, limit).await?;
        let account_ids = sorted_ids(due.iter().map(|l| l.account_id.as_str()));
        let (mut accounts, corrupt_accounts) = lock_due_accounts(tx, &account_ids).await?;
        let before = accounts.clone();
        let mut reclaimed = Vec::with_capacity(due.len());
        let mut changes = Changes { now, ..Changes::default() };
        for mut lease in due {
            if let Some(error) = corrupt_accounts.get(&lease.account_id) {
                skipped.push(skip(&lease.lease_id, &lease.account_id, error));
                continue;
            }
            // Not locked: another transaction holds the account; next pass.
            let Some(account) = accounts.get_mut(&lease.account_id) else {
                continue;
            };
            match ledger::reclaim(account, &mut lease, now, &self.policy, DOMAIN) {
                Ok(Some(settlement)) => {
                    reclaimed.push(reclaimed_lease(&lease, settlement));
                    changes.leases.push(lease);
                }
                Ok(None) => {}
                Err(error) => skipped.push(skip(&lease.lease_id, &lease.account_id, &error)),
            }
        }
        let touched: BTreeSet<&str> = changes.leases.iter().map(|l| l.account_id.as_str()).collect();
        changes.accounts = accounts.into_values().filter(|a| touched.contains(a.account_id.as_str())).collect();
        changes.journal = reclaim_changes(&before, &changes.accounts, &changes.leases);
        if !changes.leases.is_empty() {
            persist(tx, &changes).await?;
        }
        Ok(ReclaimReport { reclaimed, skipped, limit })
    }
}

/// One `reclaim` change per account the pass settled leases in, naming
/// them in `lease_id` order.
fn reclaim_changes(before: &BTreeMap<String, Account>, after: &[Account], settled: &[Lease]) -> Vec<Change> {
    after
        .iter()
        .filter_map(|account| {
            let mut leases: Vec<String> =
                settled.iter().filter(|l| l.account_id == account.account_id).map(|l| l.lease_id.clone()).collect();
            leases.sort();
            Change::between(Reclaim, before.get(&account.account_id)?, account, EntryIds::reclaim(leases))
        })
        .collect()
}

/// Locks the leases of one pass, skipping those another transaction holds:
/// up to `limit` due leases in the order of `ReclaimPass::accounts`, chosen
/// by `read_due` and then locked, still due and active, by
/// `LOCK_DUE_SQL`; decoded, in account order. A lease whose row, or whose
/// account's row, does not decode is skipped.
async fn lock_due(
    tx: &mut PgConnection,
    cutoff: InstantPair,
    limit: u32,
) -> Result<(Vec<Lease>, Vec<SkippedLease>), Error> {
    let (chosen, mut skipped) = read_due(tx, cutoff, limit).await?;
    let (accounts, leases): (Vec<String>, Vec<String>) =
        chosen.leases.iter().map(|l| (l.account_id.clone(), l.lease_id.clone())).unzip();
    let rows: Vec<LeaseRow> = sqlx::query_as(LOCK_DUE_SQL)
        .bind(&accounts)
        .bind(&leases)
        .bind(cutoff.floor_us)
        .bind(cutoff.submicro_ns)
        .fetch_all(&mut *tx)
        .await
        .map_err(storage_error)?;
    let mut due = Vec::with_capacity(rows.len());
    for row in rows {
        let (lease_id, account_id) = (row.lease_id.clone(), row.lease_account_id.clone());
        match row.decode() {
            Ok(record) => due.push(record.lease),
            Err(error) => skipped.push(skip(&lease_id, &account_id, &error)),
        }
    }
    Ok((due, skipped))
}

/// Locks the due leases' accounts that no other transaction holds, decoded;
/// the accounts whose rows do not decode come apart, with their errors.
async fn lock_due_accounts(
    tx: &mut PgConnection,
    account_ids: &[String],
) -> Result<(BTreeMap<String, Account>, HashMap<String, Error>), Error> {
    let mut accounts = BTreeMap::new();
    let mut corrupt_accounts = HashMap::new();
    for row in lock_account_rows(tx, account_ids, Busy::Skip).await? {
        let account_id = row.account_id.clone();
        match row.decode() {
            Ok(account) => {
                accounts.insert(account_id, account);
            }
            Err(error) => {
                corrupt_accounts.insert(account_id, error);
            }
        }
    }
    Ok((accounts, corrupt_accounts))
}
