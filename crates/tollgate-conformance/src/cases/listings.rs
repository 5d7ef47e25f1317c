//! Listings: accounts, and an account's leases, credentials and credits, in
//! the order of their immutable key, one page after a cursor that belongs to
//! one listing, account and filter (`tollgate_core::listings`).

use std::future::Future;

use tollgate_core::{Error, LeaseFilter, LeaseState, Page, PageLimit, PageRequest};
use tollgate_store::{LeaseListing, Store};

use super::T0;
use crate::StoreFactory;
use crate::support::*;

fn limit(rows: u32) -> PageLimit {
    PageLimit::new(Some(rows)).expect("a valid limit")
}

/// Every page of a listing, from the first, as the keys of each page's rows.
async fn pages<T, Fut>(
    limit: PageLimit,
    mut fetch: impl FnMut(PageRequest) -> Fut,
    key: impl Fn(&T) -> String,
) -> Vec<Vec<String>>
where
    Fut: Future<Output = Result<Page<T>, Error>>,
{
    let mut request = PageRequest::first(limit);
    let mut pages = Vec::new();
    loop {
        let page = fetch(request.clone()).await.expect("a page");
        assert!(page.items.len() <= limit.rows(), "a page longer than its limit");
        pages.push(page.items.iter().map(&key).collect());
        match page.next_cursor {
            Some(cursor) => request = PageRequest::after(cursor, limit),
            None => return pages,
        }
    }
}

async fn account_pages<S: Store>(s: &S, prefix: &str, rows: u32) -> Vec<Vec<String>> {
    pages(limit(rows), |page| async move { s.list_accounts(prefix, &page).await }, |v| v.account.account_id.clone())
        .await
}

/// The page `page` of every lease of `account_id`.
fn all_leases<'a>(account_id: &'a str, page: &'a PageRequest) -> LeaseListing<'a> {
    LeaseListing { account_id, filter: LeaseFilter::All, page }
}

async fn lease_pages<S: Store>(s: &S, account_id: &str, filter: LeaseFilter, rows: u32) -> Vec<Vec<String>> {
    let fetch = |page| async move { s.list_leases(LeaseListing { account_id, filter, page: &page }).await };
    pages(limit(rows), fetch, |lease: &tollgate_core::Lease| lease.lease_id.clone()).await
}

fn strs(ids: &[&str]) -> Vec<String> {
    ids.iter().map(|id| (*id).to_owned()).collect()
}

fn sorted(mut ids: Vec<String>) -> Vec<String> {
    ids.sort();
    ids
}

/// Accounts come in `account_id` order, a page at a time: limit 1 gives one
/// per page, limit 2 pairs, the default all at once, and the last page has
/// no cursor. A prefix keeps the ids that start with it, and one that no id
/// can start with is an empty page. Each item is the account as
/// `Store::account` reads it.
pub async fn accounts_are_listed_in_id_order_page_by_page<F: StoreFactory>(f: &F) {
    let s = f.create(with_grace(nanos(0))).await;
    for id in ["b", "ab", "a", "c", "a-1"] {
        funded(&s, id, 10).await;
    }
    s.acquire("ab", 4, secs(60), ts(T0)).await.unwrap();
    let order = strs(&["a", "a-1", "ab", "b", "c"]);
    let flat = |pages: Vec<Vec<String>>| pages.concat();
    assert_eq!(account_pages(&s, "", 1).await, order.iter().map(|id| vec![id.clone()]).collect::<Vec<_>>());
    assert_eq!(account_pages(&s, "", 2).await, vec![strs(&["a", "a-1"]), strs(&["ab", "b"]), strs(&["c"])]);
    let all = s.list_accounts("", &PageRequest::default()).await.unwrap();
    assert_eq!(all.next_cursor, None);
    assert_eq!(all.items.iter().map(|v| v.account.account_id.clone()).collect::<Vec<_>>(), order);
    for view in &all.items {
        assert_eq!(view, &s.account(&view.account.account_id).await.unwrap());
    }
    assert_eq!(all.items[2].active_leases, 1);
    assert_eq!(flat(account_pages(&s, "a", 1).await), strs(&["a", "a-1", "ab"]));
    assert_eq!(flat(account_pages(&s, "ab", 2).await), strs(&["ab"]));
    assert_eq!(flat(account_pages(&s, "z", 2).await), Vec::<String>::new());
    assert_eq!(account_pages(&s, "a b", 2).await, vec![Vec::<String>::new()]);
    assert_ledger(&s, "ab", ledger! { credited: 10, available: 6, reserved: 4, next_fence: 2, active_leases: 1 }).await;
}

/// Leases come in `lease_id` order, all of them or those of one state; a
/// lease is the one `Store::lease` reads. An unknown account is
/// `account_not_found`, an empty one an empty last page.
pub async fn leases_are_listed_by_id_and_filtered_by_state<F: StoreFactory>(f: &F) {
    let s = funded_store(f, &[("a", 100), ("b", 100)]).await;
    s.create_account("empty").await.unwrap();
    let now = ts(T0);
    let mut held = Vec::new();
    for _ in 0..5 {
        held.push(s.acquire("a", 10, secs(60), now).await.unwrap());
    }
    s.acquire("b", 1, secs(60), now).await.unwrap();
    let released = [&held[1], &held[3]];
    for lease in released {
        s.release("a", &lease.lease.lease_id, lease.capability.expose(), now).await.unwrap();
    }
    let all = sorted(held.iter().map(|l| l.lease.lease_id.clone()).collect());
    let released_ids = sorted(released.iter().map(|l| l.lease.lease_id.clone()).collect());
    let active_ids: Vec<String> = all.iter().filter(|id| !released_ids.contains(id)).cloned().collect();

    let pages2 = lease_pages(&s, "a", LeaseFilter::All, 2).await;
    assert_eq!(pages2.iter().map(Vec::len).collect::<Vec<_>>(), vec![2, 2, 1]);
    assert_eq!(pages2.concat(), all);
    assert_eq!(lease_pages(&s, "a", LeaseFilter::All, 1).await.concat(), all);
    assert_eq!(lease_pages(&s, "a", LeaseFilter::All, 100).await, vec![all.clone()]);
    let active = LeaseFilter::State(LeaseState::Active);
    assert_eq!(lease_pages(&s, "a", active, 2).await.concat(), active_ids);
    let released_filter = LeaseFilter::State(LeaseState::Released);
    assert_eq!(lease_pages(&s, "a", released_filter, 1).await.concat(), released_ids);
    let reclaimed = LeaseFilter::State(LeaseState::Reclaimed);
    assert_eq!(lease_pages(&s, "a", reclaimed, 2).await, vec![Vec::<String>::new()]);
    assert_eq!(lease_pages(&s, "empty", LeaseFilter::All, 2).await, vec![Vec::<String>::new()]);

    let page = s.list_leases(all_leases("a", &PageRequest::default())).await.unwrap();
    for lease in &page.items {
        assert_eq!(lease, &s.lease("a", &lease.lease_id).await.unwrap());
    }
    let unknown = s.list_leases(all_leases("ghost", &PageRequest::default())).await;
    assert_eq!(unknown.unwrap_err(), Error::AccountNotFound);
    assert_ledger(&s, "a", ledger! { credited: 100, available: 70, reserved: 30, next_fence: 6, active_leases: 3 })
        .await;
}

/// Credentials come in `credential_id` order and credits in `credit_id`
/// order with their units; an unknown account is `account_not_found`.
pub async fn credentials_and_credits_are_listed_by_id<F: StoreFactory>(f: &F) {
    let s = f.create(with_grace(nanos(0))).await;
    s.create_account("a").await.unwrap();
    s.create_account("b").await.unwrap();
    let now = ts(T0);
    let mut issued = Vec::new();
    for label in ["one", "two", "three"] {
        issued.push(s.issue_credential("a", label, now).await.unwrap().credential);
    }
    s.issue_credential("b", "other", now).await.unwrap();
    s.revoke_credential("a", &issued[0].credential_id, now).await.unwrap();
    for (credit_id, units) in [("c2", 20), ("c10", 10), ("c1", 1)] {
        s.credit("a", credit_id, units, jiff::Timestamp::UNIX_EPOCH).await.unwrap();
    }
    s.credit("b", "c0", 5, jiff::Timestamp::UNIX_EPOCH).await.unwrap();

    let ids = sorted(issued.iter().map(|c| c.credential_id.clone()).collect());
    let s = &s;
    let fetch = |page| async move { s.list_credentials("a", &page).await };
    let by_one = pages(limit(1), fetch, |c: &tollgate_core::Credential| c.credential_id.clone()).await;
    assert_eq!(by_one.concat(), ids);
    assert_eq!(by_one.len(), 3);
    let all = s.list_credentials("a", &PageRequest::default()).await.unwrap();
    for credential in &all.items {
        assert_eq!(credential, &s.credential("a", &credential.credential_id).await.unwrap());
    }

    let fetch = |page| async move { s.list_credits("a", &page).await };
    let credits = pages(limit(2), fetch, |c: &tollgate_core::CreditEntry| format!("{}={}", c.credit_id, c.units)).await;
    assert_eq!(credits, vec![strs(&["c1=1", "c10=10"]), strs(&["c2=20"])]);
    for unknown in [
        s.list_credentials("ghost", &PageRequest::default()).await.map(|_| ()),
        s.list_credits("ghost", &PageRequest::default()).await.map(|_| ()),
    ] {
        assert_eq!(unknown.unwrap_err(), Error::AccountNotFound);
    }
    assert_ledger(s, "a", ledger! { credited: 31, available: 31 }).await;
}

/// A cursor belongs to its listing, account and filter: presented to
/// another it is `invalid_cursor`, as is anything that is not a cursor.
pub async fn cursors_are_refused_across_listings_accounts_and_filters<F: StoreFactory>(f: &F) {
    let s = f.create(with_grace(nanos(0))).await;
    let now = ts(T0);
    for account in ["a", "b"] {
        funded(&s, account, 100).await;
        for _ in 0..2 {
            s.acquire(account, 1, secs(60), now).await.unwrap();
            s.issue_credential(account, "k", now).await.unwrap();
        }
        s.credit(account, "extra", 1, jiff::Timestamp::UNIX_EPOCH).await.unwrap();
    }
    let one = PageRequest::first(limit(1));
    let after = |page: Option<String>| PageRequest::after(page.expect("a next page"), limit(1));
    let leases = after(s.list_leases(all_leases("a", &one)).await.unwrap().next_cursor);
    let credentials = after(s.list_credentials("a", &one).await.unwrap().next_cursor);
    let credits = after(s.list_credits("a", &one).await.unwrap().next_cursor);
    let accounts = after(s.list_accounts("", &one).await.unwrap().next_cursor);
    let active = LeaseFilter::State(LeaseState::Active);

    assert!(s.list_leases(all_leases("a", &leases)).await.is_ok());
    assert!(s.list_credentials("a", &credentials).await.is_ok());
    assert!(s.list_credits("a", &credits).await.is_ok());
    assert!(s.list_accounts("", &accounts).await.is_ok());
    let refused = [
        s.list_leases(all_leases("b", &leases)).await.map(|_| ()),
        s.list_leases(LeaseListing { filter: active, ..all_leases("a", &leases) }).await.map(|_| ()),
        s.list_leases(all_leases("a", &credentials)).await.map(|_| ()),
        s.list_credentials("b", &credentials).await.map(|_| ()),
        s.list_credentials("a", &credits).await.map(|_| ()),
        s.list_credits("b", &credits).await.map(|_| ()),
        s.list_credits("a", &leases).await.map(|_| ()),
        s.list_accounts("a", &accounts).await.map(|_| ()),
        s.list_accounts("", &credits).await.map(|_| ()),
    ];
    for (i, result) in refused.into_iter().enumerate() {
        assert_eq!(result.unwrap_err(), Error::InvalidCursor, "case {i}");
    }
    for garbage in ["", "garbage", "c1.00", "c1.zz.61"] {
        let request = PageRequest::after(garbage, limit(1));
        assert_eq!(s.list_accounts("", &request).await.unwrap_err(), Error::InvalidCursor, "{garbage}");
        let leases = s.list_leases(all_leases("a", &request)).await;
        assert_eq!(leases.unwrap_err(), Error::InvalidCursor, "{garbage}");
    }
    assert_ledger(&s, "a", ledger! { credited: 101, available: 99, reserved: 2, next_fence: 3, active_leases: 2 })
        .await;
}

/// Rows inserted between pages never make a listing skip or repeat a row:
/// every row that existed before the first page comes exactly once, in key
/// order, and an inserted row comes only if its key is after the cursor.
pub async fn rows_inserted_between_pages_are_neither_skipped_nor_repeated<F: StoreFactory>(f: &F) {
    let s = f.create(with_grace(nanos(0))).await;
    let now = ts(T0);
    for id in ["k02", "k04", "k06", "k08"] {
        funded(&s, id, 100).await;
    }
    for _ in 0..6 {
        s.acquire("k02", 1, secs(60), now).await.unwrap();
    }
    for credit_id in ["c2", "c4", "c6"] {
        s.credit("k04", credit_id, 1, jiff::Timestamp::UNIX_EPOCH).await.unwrap();
    }
    let before = s.list_leases(all_leases("k02", &PageRequest::default())).await.unwrap();
    let before: Vec<String> = before.items.iter().map(|l| l.lease_id.clone()).collect();

    let mut seen = Vec::new();
    let mut request = PageRequest::first(limit(2));
    let mut inserted = Vec::new();
    loop {
        let page = s.list_accounts("", &request).await.unwrap();
        seen.extend(page.items.iter().map(|v| v.account.account_id.clone()));
        let last = seen.last().cloned().unwrap_or_default();
        for id in [format!("{last}a"), format!("k0{}", seen.len()), "k00".to_owned()] {
            if s.create_account(&id).await.is_ok() {
                inserted.push(id);
            }
        }
        match page.next_cursor {
            Some(cursor) => request = PageRequest::after(cursor, limit(2)),
            None => break,
        }
    }
    assert!(seen.windows(2).all(|pair| pair[0] < pair[1]), "out of order or repeated: {seen:?}");
    for id in ["k02", "k04", "k06", "k08"] {
        assert_eq!(seen.iter().filter(|s| s.as_str() == id).count(), 1, "{id} in {seen:?}");
    }
    assert!(inserted.iter().any(|id| seen.contains(id)), "a row inserted after the cursor is listed");
    assert!(!seen.contains(&"k00".to_owned()), "a row inserted before the cursor is not");

    let mut seen = Vec::new();
    let mut request = PageRequest::first(limit(2));
    loop {
        let page = s.list_leases(all_leases("k02", &request)).await.unwrap();
        seen.extend(page.items.iter().map(|l| l.lease_id.clone()));
        s.acquire("k02", 1, secs(60), now).await.unwrap();
        match page.next_cursor {
            Some(cursor) => request = PageRequest::after(cursor, limit(2)),
            None => break,
        }
    }
    assert!(seen.windows(2).all(|pair| pair[0] < pair[1]), "out of order or repeated: {seen:?}");
    for id in &before {
        assert_eq!(seen.iter().filter(|s| *s == id).count(), 1, "{id} in {seen:?}");
    }

    let first = s.list_credits("k04", &PageRequest::first(limit(2))).await.unwrap();
    for credit_id in ["c1", "c3", "c5", "c7"] {
        s.credit("k04", credit_id, 1, jiff::Timestamp::UNIX_EPOCH).await.unwrap();
    }
    let request = PageRequest::after(first.next_cursor.clone().expect("a next page"), limit(100));
    let rest = s.list_credits("k04", &request).await.unwrap();
    let ids = |page: &Page<tollgate_core::CreditEntry>| -> Vec<String> {
        page.items.iter().map(|c| c.credit_id.clone()).collect()
    };
    assert_eq!(ids(&first), strs(&["c2", "c4"]));
    assert_eq!(ids(&rest), strs(&["c5", "c6", "c7", "seed-k04"]));
}
