//! A reclaim pass: one statement when every row it chooses decodes, else the
//! unlocked path's read and write, else the locking pass.
//!
//! A vanished fleet leaves many due leases at once, and this is the path that
//! returns their units. The one statement (`RECLAIM_DUE_SQL`) chooses, locks,
//! settles and journals a pass without sending a lease to the client and
//! back. It applies no rule of its own: the cutoff and the bound are the
//! core's (`GrantPolicy::reclaim_pass`), and each account's change is the
//! core's `SETTLEMENT_TERMS` evaluated over the sums of its settled leases,
//! which the core's own tests hold to `ledger::reclaim` and
//! `tests/pg/reclaim.rs` holds to the statement's results. Whatever the
//! statement cannot decide as the core would (a row that does not decode, a
//! counter PostgreSQL refuses) it leaves entirely to the unlocked path, where
//! the core decides lease by lease and names each lease it skips.

use jiff::Timestamp;
use sqlx::{FromRow, PgConnection};
use tollgate_core::time::{FLOOR_US_MAX, FLOOR_US_MIN};
use tollgate_core::{Error, InstantPair, SETTLEMENT_TERMS, settle};
use tollgate_store::{ReclaimReport, ReclaimedLease, UnlockedOperation};

use super::Engine;
use super::errors::{corrupt, out_of_range, storage_error};
use super::sql::RECLAIM_DUE_SQL;
use super::unlocked::{DUE_HEADS_FIRST, journal_at, must_widen};

/// A row of `RECLAIM_DUE_SQL`: an account's settled leases (or none), with
/// what the statement considered, read and decided.
#[derive(FromRow)]
struct ReclaimedRow {
    considered: i64,
    due: i64,
    decodes: bool,
    account_id: Option<String>,
    lease_each: Option<Vec<String>>,
    granted_each: Option<Vec<i64>>,
    used_each: Option<Vec<i64>>,
}

/// What one `RECLAIM_DUE_SQL` came to.
enum Statement {
    /// It settled these leases, having read `due` rows with its accounts
    /// chosen from `considered` of the most overdue leases.
    Settled { reclaimed: Vec<ReclaimedLease>, considered: u32, due: u32 },
    /// A row did not decode, or PostgreSQL refused a counter's range: it
    /// wrote nothing.
    Declined,
}

impl Engine {
    /// One reclaim pass of at most `limit` leases due at `cutoff`. Reports
    /// settled leases in account and lease order.
    pub(super) async fn reclaim_pass(
        &self,
        now: Timestamp,
        cutoff: InstantPair,
        limit: u32,
    ) -> Result<ReclaimReport, Error> {
        // One connection for the whole pass: a statement that declined was
        // refused by PostgreSQL, which ends its transaction, and releases its
        // locks, only after it has answered; the pass's next statement on the
        // same connection runs after that, so it never finds the accounts
        // still locked by the statement it follows and skips them.
        let mut conn = self.pool.acquire().await.map_err(storage_error)?;
        let (mut reclaimed, left) = self.reclaim_in_statements(&mut conn, now, cutoff, limit).await?;
        let mut skipped = Vec::new();
        if left > 0 {
            let unlocked = self.reclaim_unlocked(&mut conn, now, cutoff, left);
            let locked = async |tx: &mut PgConnection| self.reclaim_locking(tx, now, cutoff, left).await;
            let rest = self.unlocked_first(UnlockedOperation::Reclaim, unlocked, locked).await?;
            reclaimed.extend(rest.reclaimed);
            skipped = rest.skipped;
        }
        reclaimed.sort_unstable_by(|a, b| (&a.account_id, &a.lease_id).cmp(&(&b.account_id, &b.lease_id)));
        Ok(ReclaimReport { reclaimed, skipped, limit })
    }

    /// As much of the pass as `RECLAIM_DUE_SQL` settles: the leases, and how
    /// many of the pass's `limit` are left to the unlocked path (none unless
    /// a statement declined). The first statement chooses its accounts from
    /// the `DUE_HEADS_FIRST` most overdue leases; when their accounts held
    /// fewer due leases than the pass may settle while more were due, a
    /// second one chooses from as many leases as are left to settle, as
    /// `read_due_rows` widens its read.
    async fn reclaim_in_statements(
        &self,
        conn: &mut PgConnection,
        now: Timestamp,
        cutoff: InstantPair,
        limit: u32,
    ) -> Result<(Vec<ReclaimedLease>, u32), Error> {
        let mut reclaimed = Vec::new();
        let (mut left, mut heads) = (limit, limit.min(DUE_HEADS_FIRST));
        loop {
            let Statement::Settled { reclaimed: settled, considered, due } =
                reclaim_due(conn, cutoff, left, heads, now).await?
            else {
                self.guesses.count_declined_reclaim();
                return Ok((reclaimed, left));
            };
            for lease in &settled {
                self.guesses.forget(&lease.account_id, Some(&lease.lease_id));
            }
            reclaimed.extend(settled);
            if !must_widen(due as usize, left, i64::from(considered), heads) {
                return Ok((reclaimed, 0));
            }
            left -= due;
            heads = left;
        }
    }
}

/// Runs `RECLAIM_DUE_SQL` for at most `limit` leases, choosing accounts from
/// the `heads` most overdue.
async fn reclaim_due(
    conn: &mut PgConnection,
    cutoff: InstantPair,
    limit: u32,
    heads: u32,
    now: Timestamp,
) -> Result<Statement, Error> {
    let at = journal_at(now);
    let terms = SETTLEMENT_TERMS;
    let result = sqlx::query_as::<_, ReclaimedRow>(RECLAIM_DUE_SQL)
        .bind(cutoff.floor_us)
        .bind(cutoff.submicro_ns)
        .bind(i64::from(limit))
        .bind(i64::from(heads))
        .bind(at.floor_us)
        .bind(at.submicro_ns)
        .bind(terms.granted.to_vec())
        .bind(terms.used.to_vec())
        .bind(terms.least.to_vec())
        .bind(FLOOR_US_MIN)
        .bind(FLOOR_US_MAX)
        .fetch_all(&mut *conn)
        .await;
    let rows = match result {
        Ok(rows) => rows,
        Err(error) if out_of_range(&error) => return Ok(Statement::Declined),
        Err(error) => return Err(storage_error(error)),
    };
    let Some(first) = rows.first() else {
        return Err(corrupt("the reclaim statement returned no row".to_owned()));
    };
    if !first.decodes {
        return Ok(Statement::Declined);
    }
    let count = |value: i64| u32::try_from(value).map_err(|_| corrupt(format!("a reclaim pass counted {value}")));
    let (considered, due) = (count(first.considered)?, count(first.due)?);
    let mut reclaimed = Vec::with_capacity(due as usize);
    for row in rows {
        let (Some(account_id), Some(leases), Some(granted), Some(used)) =
            (row.account_id, row.lease_each, row.granted_each, row.used_each)
        else {
            continue;
        };
        if leases.len() != granted.len() || leases.len() != used.len() {
            return Err(corrupt(format!("the reclaim statement returned uneven lists for account {account_id}")));
        }
        for ((lease_id, granted), used) in leases.into_iter().zip(granted).zip(used) {
            let units = |value: i64| {
                u64::try_from(value).map_err(|_| corrupt(format!("lease {lease_id} settled with {value} units")))
            };
            let settlement = settle(units(granted)?, units(used)?);
            reclaimed.push(ReclaimedLease { lease_id, account_id: account_id.clone(), settlement });
        }
    }
    Ok(Statement::Settled { reclaimed, considered, due })
}
