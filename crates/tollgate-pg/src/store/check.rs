//! The operator's check: the guard inspection, the conservation equations of
//! every account, the hourly usage totals against the events, and the
//! legacy-bound readiness count, in one snapshot.

use std::collections::{HashMap, HashSet};

use sqlx::PgConnection;
use tollgate_core::ledger::LeaseState;
use tollgate_core::{Balances, COUNTER_NAMES, Error, check_balances};
use tollgate_store::{CheckReport, GuardViolation, LegacyBoundCount, UsageTotalsMismatch};

use super::Engine;
use super::errors::{corrupt, negative_counter, storage_error};
use super::journal::journal_mismatches;
use super::rows::AccountRow;
use super::sql::{CHECK_ACCOUNTS_SQL, CHECK_LEASES_SQL, CHECK_SNAPSHOT_SQL, CHECK_USAGE_HOURLY_SQL, LEGACY_BOUNDS_SQL};
use super::usage_queries::decimal;
use crate::inspect;

/// Accounts per page in `check`, which bounds its memory.
const CHECK_PAGE_ACCOUNTS: i64 = 1_000;

/// The most usage totals mismatches one report lists; the check goes on
/// checking the rest of the ledger.
pub(super) const USAGE_TOTALS_MISMATCHES_MAX: usize = 1_000;

impl Engine {
    pub(super) async fn check_all(&self) -> Result<CheckReport, Error> {
        // One snapshot for the whole report, read in bounded pages of accounts;
        // read only: committing it commits nothing, it only ends the snapshot.
        self.transaction(async |tx: &mut PgConnection| -> Result<CheckReport, Error> {
            sqlx::query(CHECK_SNAPSHOT_SQL).execute(&mut *tx).await.map_err(storage_error)?;
            // The guard inspection (`inspect.rs`), in the same snapshot.
            let guard_violations = inspect::inspect_guards_in(&mut *tx).await.map_err(storage_error)?;
            let mut report = CheckReport { guard_violations, ..CheckReport::default() };
            let mut after = String::new();
            while let Some(last) = check_page(tx, &after, &mut report).await? {
                after = last;
            }
            report.legacy_bounds = legacy_bounds(tx).await?;
            Ok(report)
        })
        .await
    }
}

/// Checks the page of accounts after `after` into `report`; returns the last
/// account id checked, or `None` when there was none left.
///
/// Only the counters and each active lease's `granted` and `used` enter the
/// equations, so only those are loaded: a row that breaks a guard (a fence,
/// say) is reported by the guard inspection instead of failing the check. A
/// negative counter breaks a column's `CHECK`; such a row is reported as a
/// guard violation (reclaim skips it too), and its account's equations, which
/// it would falsify, are not checked.
async fn check_page(conn: &mut PgConnection, after: &str, report: &mut CheckReport) -> Result<Option<String>, Error> {
    let accounts: Vec<AccountRow> = sqlx::query_as(CHECK_ACCOUNTS_SQL)
        .bind(after)
        .bind(CHECK_PAGE_ACCOUNTS)
        .fetch_all(&mut *conn)
        .await
        .map_err(storage_error)?;
    let Some(last) = accounts.last().map(|row| row.account_id.clone()) else { return Ok(None) };
    let page_ids: Vec<String> = accounts.iter().map(|row| row.account_id.clone()).collect();
    report.journal_mismatches.extend(journal_mismatches(conn, &page_ids).await?);
    usage_totals_mismatches(conn, &page_ids, &mut report.usage_totals_mismatches).await?;
    let leases: Vec<(String, String, i64, i64)> =
        sqlx::query_as(CHECK_LEASES_SQL).bind(&page_ids).fetch_all(&mut *conn).await.map_err(storage_error)?;
    let mut unchecked: HashSet<String> = HashSet::new();
    let mut active: HashMap<String, Vec<(u64, u64)>> = HashMap::new();
    for (lease_id, account_id, granted, used) in leases {
        match (u64::try_from(granted), u64::try_from(used)) {
            (Ok(granted), Ok(used)) => active.entry(account_id).or_default().push((granted, used)),
            _ => {
                for (column, value) in [("granted", granted), ("used", used)].into_iter().filter(|(_, v)| *v < 0) {
                    report.guard_violations.push(negative_counter("tollgate_leases", &lease_id, column, value));
                }
                unchecked.insert(account_id);
            }
        }
    }
    for row in accounts {
        let Some(balances) = balances(&row, &mut report.guard_violations) else { continue };
        if unchecked.contains(&row.account_id) {
            continue;
        }
        let pairs = active.remove(&row.account_id).unwrap_or_default();
        report.violations.extend(check_balances(&row.account_id, &balances, pairs));
        report.accounts_checked += 1;
    }
    Ok(Some(last))
}

/// Adds the hourly usage totals of the accounts `ids` that differ from their
/// events to `found`, up to [`USAGE_TOTALS_MISMATCHES_MAX`] in all.
async fn usage_totals_mismatches(
    conn: &mut PgConnection,
    ids: &[String],
    found: &mut Vec<UsageTotalsMismatch>,
) -> Result<(), Error> {
    let room = USAGE_TOTALS_MISMATCHES_MAX.saturating_sub(found.len());
    if room == 0 {
        return Ok(());
    }
    type Row = (String, i64, String, bool, String, String, String, String, String);
    let rows: Vec<Row> = sqlx::query_as(CHECK_USAGE_HOURLY_SQL)
        .bind(ids)
        .bind(room as i64)
        .fetch_all(&mut *conn)
        .await
        .map_err(storage_error)?;
    for (account_id, hour, credential_id, leased, dimensions, kept_units, kept_events, units, events) in rows {
        found.push(UsageTotalsMismatch {
            account_id,
            hour,
            credential_id,
            funding: if leased { "leased" } else { "overage" },
            dimensions,
            kept: (decimal(&kept_units)?, decimal(&kept_events)?),
            counted: (decimal(&units)?, decimal(&events)?),
        });
    }
    Ok(())
}

/// The balances of an account row, or `None` after reporting each of them
/// that is negative. The fence is not an equation's and is left to the guard
/// inspection.
fn balances(row: &AccountRow, violations: &mut Vec<GuardViolation>) -> Option<Balances> {
    let mut values = [0u64; 6];
    let mut negative = false;
    for ((value, stored), column) in values.iter_mut().zip(row.counters).zip(COUNTER_NAMES) {
        match u64::try_from(stored) {
            Ok(stored) => *value = stored,
            Err(_) => {
                violations.push(negative_counter("tollgate_accounts", &row.account_id, column, stored));
                negative = true;
            }
        }
    }
    let [credited, available, reserved, consumed, overage, billed] = values;
    (!negative).then_some(Balances { credited, available, reserved, consumed, overage, billed })
}

/// The legacy-bound readiness count: leases by state and by whether their
/// expiry is an upper bound.
async fn legacy_bounds(conn: &mut PgConnection) -> Result<Vec<LegacyBoundCount>, Error> {
    let bounds: Vec<(String, bool, i64)> =
        sqlx::query_as(LEGACY_BOUNDS_SQL).fetch_all(&mut *conn).await.map_err(storage_error)?;
    let mut legacy_bounds = bounds
        .into_iter()
        .map(|(state, expiry_is_upper_bound, count)| {
            let state = LeaseState::parse(&state).ok_or_else(|| corrupt(format!("a lease has state {state:?}")))?;
            Ok(LegacyBoundCount { state, expiry_is_upper_bound, count: count.unsigned_abs() })
        })
        .collect::<Result<Vec<_>, Error>>()?;
    legacy_bounds.sort();
    Ok(legacy_bounds)
}
