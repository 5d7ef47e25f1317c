//! The memory store's listings: each reads one ordered index from the page's
//! start, so a page costs its own rows, not the whole store's.

use std::ops::Bound;

use tollgate_core::listings::account_prefix_can_match;
use tollgate_core::{Credential, CreditEntry, Error, Lease, Listing, Page, PageRequest};

use super::{LeaseKey, State, lease_key};
use crate::model::AccountView;
use crate::requests::LeaseListing;

/// A range of `(account_id, key)` pairs.
type KeyRange = (Bound<(String, String)>, Bound<(String, String)>);

/// The pairs of one account strictly after the cursor's key, or all of them
/// on a first page (every key follows `""`).
fn account_range(account_id: &str, after: Option<&str>) -> KeyRange {
    let account_id = account_id.to_owned();
    match after {
        Some(after) => (Bound::Excluded((account_id, after.to_owned())), Bound::Unbounded),
        None => (Bound::Included((account_id, String::new())), Bound::Unbounded),
    }
}

/// The rows of one page of `account_id`'s, from `rows`: an index read from
/// `account_range`, each id with its row (none for an id whose row is gone).
fn account_rows<'a, T>(
    account_id: &str,
    listing: &Listing,
    rows: impl Iterator<Item = (&'a String, Option<T>)>,
) -> Vec<T> {
    rows.take_while(|(account, _)| *account == account_id).filter_map(|(_, row)| row).take(listing.fetch()).collect()
}

fn account_key(view: &AccountView) -> &str {
    view.account.account_id.as_str()
}

impl State {
    pub(super) fn accounts_page(&self, prefix: &str, page: &PageRequest) -> Result<Page<AccountView>, Error> {
        let listing = Listing::accounts(prefix, page)?;
        if !account_prefix_can_match(prefix) {
            return Ok(listing.page(Vec::new(), account_key));
        }
        // Ids with the prefix are contiguous in byte order, from the prefix on.
        let lower = match listing.after() {
            Some(after) if after >= prefix => Bound::Excluded(after),
            _ => Bound::Included(prefix),
        };
        let rows = self
            .accounts
            .ids_from(lower)
            .take_while(|id| id.starts_with(prefix))
            .take(listing.fetch())
            .map(|id| self.view(id))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(listing.page(rows, account_key))
    }

    pub(super) fn leases_page(&self, request: LeaseListing<'_>) -> Result<Page<Lease>, Error> {
        let LeaseListing { account_id, filter, page } = request;
        let listing = Listing::leases(account_id, filter, page)?;
        let (index, _) = self.account_numbered(account_id)?;
        // A cursor altered by hand may name no lease id this store issues;
        // `is_after` then still compares it as text, like PostgreSQL does.
        let lower = match listing.after().and_then(lease_key) {
            Some(key) => Bound::Excluded((index, key)),
            None => Bound::Included((index, LeaseKey::MIN)),
        };
        let rows = self
            .leases_by_account
            .range((lower, Bound::Included((index, LeaseKey::MAX))))
            .filter_map(|&(_, key)| self.leases.get(&key).map(|record| self.lease_of(key, record)))
            .filter(|lease| listing.is_after(&lease.lease_id) && filter.matches(lease.state))
            .take(listing.fetch())
            .collect();
        Ok(listing.page(rows, |lease| lease.lease_id.as_str()))
    }

    pub(super) fn credentials_page(&self, account_id: &str, page: &PageRequest) -> Result<Page<Credential>, Error> {
        let listing = Listing::credentials(account_id, page)?;
        self.account(account_id)?;
        let index = self.credentials_by_account.range(account_range(account_id, listing.after()));
        let rows = index.map(|(account, credential_id)| {
            (account, self.credentials.get(credential_id).map(|record| record.credential.clone()))
        });
        Ok(listing.page(account_rows(account_id, &listing, rows), |credential| credential.credential_id.as_str()))
    }

    pub(super) fn credits_page(&self, account_id: &str, page: &PageRequest) -> Result<Page<CreditEntry>, Error> {
        let listing = Listing::credits(account_id, page)?;
        self.account(account_id)?;
        let index = self.credits.range(account_range(account_id, listing.after()));
        let rows = index.map(|((account, credit_id), units)| {
            (account, Some(CreditEntry { credit_id: credit_id.clone(), units: *units }))
        });
        Ok(listing.page(account_rows(account_id, &listing, rows), |credit| credit.credit_id.as_str()))
    }
}
