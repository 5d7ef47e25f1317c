//! Loading the rows an operation needs: reads by key, locking reads in the
//! global lock order, and the end of a locking transaction.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::QueryAs;
use sqlx::{Executor, FromRow, PgConnection, Postgres};
use tollgate_core::{Account, Error, Lease};

use super::errors::{storable, storage_error};
use super::rows::{AccountRow, HeldLeaseRow, LeaseRecord, LeaseRow};
use super::sql::{
    LOCK_ACCOUNT_LEASES_SQL, LOCK_ACCOUNT_SQL, LOCK_ACCOUNTS_SKIP_LOCKED_SQL, LOCK_ACCOUNTS_SQL, LOCK_LEASES_SQL,
};
use super::tx::Tx;

/// Loads one account with `sql`, a read by `account_id` ($1) that may lock it.
pub(super) async fn load_account(
    conn: &mut PgConnection,
    sql: &'static str,
    account_id: &str,
) -> Result<Account, Error> {
    if !storable(account_id) {
        return Err(Error::AccountNotFound);
    }
    let row: AccountRow = one_row(sqlx::query_as(sql).bind(account_id), conn, Error::AccountNotFound).await?;
    row.decode()
}

/// The row `query` finds, or `missing` when it finds none: a read by key,
/// where no row means the thing named does not exist.
pub(super) async fn one_row<'c, R>(
    query: QueryAs<'_, Postgres, R, PgArguments>,
    conn: impl Executor<'c, Database = Postgres>,
    missing: Error,
) -> Result<R, Error>
where
    R: Send + Unpin + for<'r> FromRow<'r, PgRow>,
{
    query.fetch_optional(conn).await.map_err(storage_error)?.ok_or(missing)
}

/// Locks one account.
pub(super) async fn lock_account(conn: &mut PgConnection, account_id: &str) -> Result<Account, Error> {
    load_account(conn, LOCK_ACCOUNT_SQL, account_id).await
}

/// Loads a lease and its account with `sql`, a read of `sql::held_lease_select!` by
/// `account_id` ($1) and `lease_id` ($2) that may lock both. A lease of another
/// account is not found.
pub(super) async fn load_held(
    conn: &mut PgConnection,
    sql: &'static str,
    account_id: &str,
    lease_id: &str,
) -> Result<(Account, LeaseRecord), Error> {
    let query = sqlx::query_as(sql).bind(account_id).bind(lease_id);
    let row: HeldLeaseRow = one_row(query, conn, Error::LeaseNotFound).await?;
    Ok((row.account.decode()?, row.lease.decode()?))
}

/// What locking an account another transaction holds does.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Busy {
    /// Wait for it.
    Wait,
    /// Leave the account out of the result.
    Skip,
}

/// Locks accounts in `account_id` order.
pub(super) async fn lock_accounts(
    conn: &mut PgConnection,
    account_ids: &[String],
    busy: Busy,
) -> Result<BTreeMap<String, Account>, Error> {
    let rows = lock_account_rows(conn, account_ids, busy).await?;
    rows.into_iter().map(|row| row.decode().map(|account| (account.account_id.clone(), account))).collect()
}

/// Locks accounts in `account_id` order, without decoding them.
pub(super) async fn lock_account_rows(
    conn: &mut PgConnection,
    account_ids: &[String],
    busy: Busy,
) -> Result<Vec<AccountRow>, Error> {
    let sql = if busy == Busy::Skip { LOCK_ACCOUNTS_SKIP_LOCKED_SQL } else { LOCK_ACCOUNTS_SQL };
    sqlx::query_as(sql).bind(account_ids).fetch_all(&mut *conn).await.map_err(storage_error)
}

/// Locks, in `lease_id` order, the leases among `lease_ids` that belong to
/// `account_ids`, whose rows the caller has locked already. A lease of any
/// other account is neither locked nor returned: locking it would take a lease
/// lock without its account's lock, which a concurrent writer holding that
/// account (a reclaim pass, say) could wait on in a cycle. The core treats a
/// lease of another account as it treats one it does not find.
pub(super) async fn lock_leases(
    conn: &mut PgConnection,
    lease_ids: &[String],
    account_ids: &[String],
) -> Result<HashMap<String, LeaseRecord>, Error> {
    lock_by_lease_id(conn, sqlx::query_as(LOCK_LEASES_SQL).bind(lease_ids).bind(account_ids)).await
}

/// Locks, in `lease_id` order, the leases among `lease_ids` of `account_id`,
/// whose row the caller has locked already. A lease of another account is
/// neither locked nor returned, so the caller finds it as it finds an
/// unknown lease.
pub(super) async fn lock_account_leases(
    conn: &mut PgConnection,
    account_id: &str,
    lease_ids: &[String],
) -> Result<HashMap<String, LeaseRecord>, Error> {
    lock_by_lease_id(conn, sqlx::query_as(LOCK_ACCOUNT_LEASES_SQL).bind(account_id).bind(lease_ids)).await
}

/// Runs `query`, a locking read of leases, and keys what it locked by
/// `lease_id`.
async fn lock_by_lease_id(
    conn: &mut PgConnection,
    query: QueryAs<'_, Postgres, LeaseRow, PgArguments>,
) -> Result<HashMap<String, LeaseRecord>, Error> {
    let rows = query.fetch_all(&mut *conn).await.map_err(storage_error)?;
    rows.into_iter().map(|row| row.decode().map(|record| (record.lease.lease_id.clone(), record))).collect()
}

/// The lease, after checking the caller's capability against its hash.
pub(super) fn held(record: Option<&LeaseRecord>, capability: &str) -> Result<Lease, Error> {
    let record = record.ok_or(Error::LeaseNotFound)?;
    if !record.capability.matches(capability) {
        return Err(Error::CapabilityMismatch);
    }
    Ok(record.lease.clone())
}

/// Sorted, deduplicated, storable values.
pub(super) fn sorted_ids<'a>(ids: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    ids.into_iter().filter(|id| storable(id)).collect::<BTreeSet<&str>>().into_iter().map(str::to_owned).collect()
}

/// Ends an operation's transaction: commits what succeeded, and rolls back
/// what failed at once, so its row locks are released before the error
/// reaches the caller (a dropped transaction would release them only when its
/// pooled connection is next used). A failed commit is answered as
/// `commit_failed` makes the store's error into the operation's.
pub(super) async fn finish<T, E>(tx: Tx, result: Result<T, E>, commit_failed: impl FnOnce(Error) -> E) -> Result<T, E> {
    match result {
        Ok(value) => {
            tx.commit().await.map_err(|error| commit_failed(storage_error(error)))?;
            Ok(value)
        }
        Err(error) => {
            rollback(tx).await;
            Err(error)
        }
    }
}

/// Rolls back, best effort: if even that fails, the connection is closed
/// instead of going back to the pool, and PostgreSQL ends the transaction.
async fn rollback(tx: Tx) {
    let _ = tx.rollback().await;
}
