//! The listings: one statement per page, in key order after the cursor
//! (`sql/listings.rs`), with the page rules of `tollgate_core::listings`.
//!
//! An empty page of a per-account listing may mean an unknown account, so
//! only then is the account read as well ([`Engine::existing`]).

use sqlx::FromRow;
use tollgate_core::listings::account_prefix_can_match;
use tollgate_core::{Credential, CreditEntry, Error, Lease, Listing, Page, PageRequest};
use tollgate_store::{AccountView, LeaseListing};

use super::Engine;
use super::errors::{corrupt, db_i64, storable, storage_error};
use super::rows::{AccountRow, CredentialRow, LeaseRow};
use super::sql::{LIST_ACCOUNTS_SQL, LIST_CREDENTIALS_SQL, LIST_CREDITS_SQL, LIST_LEASES_SQL};

#[derive(FromRow)]
struct AccountViewRow {
    #[sqlx(flatten)]
    account: AccountRow,
    active_leases: i64,
}

#[derive(FromRow)]
struct CreditRow {
    credit_id: String,
    units: i64,
}

fn account_key(view: &AccountView) -> &str {
    &view.account.account_id
}

impl Engine {
    /// The rows' bound: `limit + 1`, as the statements' `LIMIT`.
    fn fetch(listing: &Listing) -> Result<i64, Error> {
        db_i64(listing.fetch() as u64, "limit")
    }

    /// The rows of `sql` for one page of an account's listing that takes
    /// the account, the cursor's key and the bound; `account_not_found` for
    /// an unknown account.
    async fn account_rows<R>(&self, sql: &'static str, account_id: &str, listing: &Listing) -> Result<Vec<R>, Error>
    where
        R: for<'r> FromRow<'r, sqlx::postgres::PgRow> + Send + Unpin,
    {
        if !storable(account_id) {
            return Err(Error::AccountNotFound);
        }
        let rows: Vec<R> = sqlx::query_as(sql)
            .bind(account_id)
            .bind(listing.after().unwrap_or(""))
            .bind(Self::fetch(listing)?)
            .fetch_all(&self.pool)
            .await
            .map_err(storage_error)?;
        self.existing(account_id, rows.len()).await?;
        Ok(rows)
    }

    pub(super) async fn accounts_page(&self, prefix: &str, page: &PageRequest) -> Result<Page<AccountView>, Error> {
        let listing = Listing::accounts(prefix, page)?;
        if !account_prefix_can_match(prefix) {
            return Ok(listing.page(Vec::new(), account_key));
        }
        let rows: Vec<AccountViewRow> = sqlx::query_as(LIST_ACCOUNTS_SQL)
            .bind(prefix)
            .bind(listing.after().unwrap_or(""))
            .bind(Self::fetch(&listing)?)
            .fetch_all(&self.pool)
            .await
            .map_err(storage_error)?;
        let views = rows
            .into_iter()
            .map(|row| {
                Ok(AccountView { account: row.account.decode()?, active_leases: row.active_leases.unsigned_abs() })
            })
            .collect::<Result<Vec<_>, Error>>()?;
        Ok(listing.page(views, account_key))
    }

    pub(super) async fn leases_page(&self, request: LeaseListing<'_>) -> Result<Page<Lease>, Error> {
        let LeaseListing { account_id, filter, page } = request;
        let listing = Listing::leases(account_id, filter, page)?;
        if !storable(account_id) {
            return Err(Error::AccountNotFound);
        }
        let states: Vec<&str> = filter.states().into_iter().map(|state| state.as_str()).collect();
        let rows: Vec<LeaseRow> = sqlx::query_as(LIST_LEASES_SQL)
            .bind(account_id)
            .bind(listing.after().unwrap_or(""))
            .bind(states)
            .bind(Self::fetch(&listing)?)
            .fetch_all(&self.pool)
            .await
            .map_err(storage_error)?;
        self.existing(account_id, rows.len()).await?;
        let leases = rows.into_iter().map(|row| Ok(row.decode()?.lease)).collect::<Result<Vec<_>, Error>>()?;
        Ok(listing.page(leases, |lease| lease.lease_id.as_str()))
    }

    pub(super) async fn credentials_page(
        &self,
        account_id: &str,
        page: &PageRequest,
    ) -> Result<Page<Credential>, Error> {
        let listing = Listing::credentials(account_id, page)?;
        let rows: Vec<CredentialRow> = self.account_rows(LIST_CREDENTIALS_SQL, account_id, &listing).await?;
        let credentials =
            rows.into_iter().map(|row| Ok(row.decode()?.credential)).collect::<Result<Vec<_>, Error>>()?;
        Ok(listing.page(credentials, |credential| credential.credential_id.as_str()))
    }

    pub(super) async fn credits_page(&self, account_id: &str, page: &PageRequest) -> Result<Page<CreditEntry>, Error> {
        let listing = Listing::credits(account_id, page)?;
        let rows: Vec<CreditRow> = self.account_rows(LIST_CREDITS_SQL, account_id, &listing).await?;
        let credits = rows
            .into_iter()
            .map(|row| {
                let units = u64::try_from(row.units)
                    .map_err(|_| corrupt(format!("credit {account_id}/{}: units is {}", row.credit_id, row.units)))?;
                Ok(CreditEntry { credit_id: row.credit_id, units })
            })
            .collect::<Result<Vec<_>, Error>>()?;
        Ok(listing.page(credits, |credit| credit.credit_id.as_str()))
    }
}
