//! Accounts: creating and crediting them, the reads of an account and of a
//! lease, and the fleet's lease summary.

use jiff::Timestamp;
use sqlx::{FromRow, PgConnection};
use tollgate_core::journal::EntryKind;
use tollgate_core::{Account, Change, EntryIds, Error, InstantPair, Lease, validate_id};
use tollgate_store::{AccountView, Credit, CreditReceipt, LeaseSummary};

use super::errors::{corrupt, db_i64, db_i64_delta, storable, storage_error};
use super::load::{lock_account, one_row};
use super::rows::{AccountRow, LeaseRow, counters};
use super::sql::{
    ACCOUNT_VIEW_SQL, CREATE_ACCOUNT_SQL, CREDIT_RECORDED_SQL, CREDIT_SQL, LEASE_SUMMARY_SQL, READ_ACCOUNT_SQL,
    READ_LEASE_SQL,
};
use super::{DOMAIN, Engine};

fn view_of(account: Account, active_leases: u64) -> AccountView {
    AccountView { account, active_leases }
}

impl Engine {
    pub(super) async fn create(&self, account_id: &str) -> Result<AccountView, Error> {
        validate_id("account_id", account_id)?;
        let account = Account::new(account_id.to_owned());
        let inserted = sqlx::query(CREATE_ACCOUNT_SQL)
            .bind(&account.account_id)
            .bind(counters(&account)?)
            .execute(&self.pool)
            .await
            .map_err(storage_error)?;
        if inserted.rows_affected() == 0 {
            return Err(Error::AccountExists);
        }
        Ok(view_of(account, 0))
    }

    pub(super) async fn credit_once(&self, credit: Credit<'_>, now: Timestamp) -> Result<CreditReceipt, Error> {
        let Credit { account_id, credit_id, units } = credit;
        validate_id("account_id", account_id)?;
        validate_id("credit_id", credit_id)?;
        self.transaction(async |tx: &mut PgConnection| -> Result<CreditReceipt, Error> {
            let mut account = lock_account(tx, account_id).await?;
            let before = account.clone();
            let (existing_units, active): (Option<i64>, i64) = sqlx::query_as(CREDIT_RECORDED_SQL)
                .bind(account_id)
                .bind(credit_id)
                .fetch_one(&mut *tx)
                .await
                .map_err(storage_error)?;
            let active_leases = active.unsigned_abs();
            let recorded = existing_units
                .map(|units| {
                    u64::try_from(units)
                        .map_err(|_| corrupt(format!("credit {account_id}/{credit_id}: units is {units}")))
                })
                .transpose()?;
            if !account.credit_once(recorded, units, DOMAIN)? {
                return Ok(CreditReceipt { account: view_of(account, active_leases), created: false });
            }
            let change = Change::between(EntryKind::Credit, &before, &account, EntryIds::credit(credit_id))
                .ok_or_else(|| corrupt(format!("credit {account_id}/{credit_id} changed no counter")))?;
            let at = InstantPair::encode(now);
            sqlx::query(CREDIT_SQL)
                .bind(account_id)
                .bind(credit_id)
                .bind(db_i64(account.credited, "credited")?)
                .bind(db_i64(account.available, "available")?)
                .bind(db_i64(units, "units")?)
                .bind(db_i64_delta(&change.deltas)?)
                .bind(at.floor_us)
                .bind(at.submicro_ns)
                .execute(&mut *tx)
                .await
                .map_err(storage_error)?;
            Ok(CreditReceipt { account: view_of(account, active_leases), created: true })
        })
        .await
    }

    pub(super) async fn view(&self, account_id: &str) -> Result<AccountView, Error> {
        if !storable(account_id) {
            return Err(Error::AccountNotFound);
        }
        #[derive(FromRow)]
        struct Row {
            #[sqlx(flatten)]
            account: AccountRow,
            active_leases: i64,
        }
        let row: Row =
            one_row(sqlx::query_as(ACCOUNT_VIEW_SQL).bind(account_id), &self.pool, Error::AccountNotFound).await?;
        Ok(view_of(row.account.decode()?, row.active_leases.unsigned_abs()))
    }

    /// `account_not_found` unless the account exists, for a read of the
    /// account's rows that found `rows` of them: only an empty answer can
    /// mean an unknown account, and accounts are never deleted, so a read
    /// that found rows needs no second one.
    pub(super) async fn existing(&self, account_id: &str, rows: usize) -> Result<(), Error> {
        if rows > 0 {
            return Ok(());
        }
        let found =
            sqlx::query(READ_ACCOUNT_SQL).bind(account_id).fetch_optional(&self.pool).await.map_err(storage_error)?;
        found.map(|_| ()).ok_or(Error::AccountNotFound)
    }

    pub(super) async fn read_lease(&self, account_id: &str, lease_id: &str) -> Result<Lease, Error> {
        if !storable(account_id) || !storable(lease_id) {
            return Err(Error::LeaseNotFound);
        }
        let query = sqlx::query_as(READ_LEASE_SQL).bind(account_id).bind(lease_id);
        let row: LeaseRow = one_row(query, &self.pool, Error::LeaseNotFound).await?;
        Ok(row.decode()?.lease)
    }

    /// The fleet's leases (`Store::lease_summary`) due at `cutoff`, the
    /// core's reclaim boundary; `None` (it underflowed) is bound as NULL,
    /// which no expiry is at or before.
    pub(super) async fn summarize_leases(&self, cutoff: Option<Timestamp>) -> Result<LeaseSummary, Error> {
        let cutoff = cutoff.map(InstantPair::encode);
        let (active, due, floor_us, submicro_ns): (i64, i64, Option<i64>, Option<i16>) =
            sqlx::query_as(LEASE_SUMMARY_SQL)
                .bind(cutoff.map(|pair| pair.floor_us))
                .bind(cutoff.map(|pair| pair.submicro_ns))
                .fetch_one(&self.pool)
                .await
                .map_err(storage_error)?;
        let oldest_due_expiry = match (floor_us, submicro_ns) {
            (Some(floor_us), Some(submicro_ns)) => Some(
                InstantPair::decode(floor_us, i64::from(submicro_ns))
                    .map_err(|e| corrupt(format!("the most overdue lease's expiry: {e}")))?,
            ),
            _ => None,
        };
        Ok(LeaseSummary { active: active.unsigned_abs(), due: due.unsigned_abs(), oldest_due_expiry })
    }
}
