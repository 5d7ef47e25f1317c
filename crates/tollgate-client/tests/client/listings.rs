//! The listings through the typed client against a running server: one page
//! at a time, and `Pages` following the cursors to the last page, also while
//! rows are added between pages.

use jiff::SignedDuration;
use tollgate_client::{ClientErrorKind, PageQuery};

use crate::support::{Server, Storage};

#[tokio::test]
async fn pages_walk_every_listing_to_its_end() {
    let server = Server::start(&Storage::Memory).await;
    let admin = server.admin();
    let gateway = server.gateway();
    let ids: Vec<String> = (0..7).map(|i| format!("acct-{i}")).collect();
    for id in ids.iter().rev() {
        admin.create_account(id).await.unwrap();
    }
    admin.create_account("other").await.unwrap();

    let first = admin.list_accounts(Some("acct-"), &PageQuery::first(Some(3))).await.unwrap();
    assert_eq!(first.items.iter().map(|a| a.account_id.as_str()).collect::<Vec<_>>(), ["acct-0", "acct-1", "acct-2"]);
    let cursor = first.next_cursor.clone().expect("more pages");
    let second = PageQuery { cursor: Some(cursor), limit: Some(3) };
    let second = admin.list_accounts(Some("acct-"), &second).await.unwrap();
    assert_eq!(second.items[0].account_id, "acct-3");

    // Rows added while paging: every account that existed comes once, in order.
    let mut pages = admin.account_pages(Some("acct-"), Some(2));
    let mut seen = Vec::new();
    while let Some(page) = pages.next_page().await.unwrap() {
        assert!(page.len() <= 2);
        seen.extend(page.into_iter().map(|a| a.account_id));
        admin.create_account(&format!("acct-{}z", seen.len())).await.unwrap();
    }
    assert!(seen.windows(2).all(|pair| pair[0] < pair[1]), "{seen:?}");
    for id in &ids {
        assert_eq!(seen.iter().filter(|s| *s == id).count(), 1, "{id} in {seen:?}");
    }
    assert!(pages.next_page().await.unwrap().is_none(), "a finished listing stays finished");

    let everything = admin.account_pages(None, Some(1)).all().await.unwrap();
    assert_eq!(everything.last().unwrap().account_id, "other");

    admin.credit("acct-0", "c1", 50).await.unwrap();
    let mut leases = Vec::new();
    for _ in 0..5 {
        leases.push(gateway.acquire("acct-0", 1, SignedDuration::from_secs(60)).await.unwrap().lease_id);
    }
    leases.sort();
    let mut items = gateway.lease_pages("acct-0", Some("active"), Some(2));
    let mut listed = Vec::new();
    while let Some(lease) = items.next().await.unwrap() {
        assert_eq!(lease.capability, None);
        listed.push(lease.lease_id);
    }
    assert_eq!(listed, leases);
    assert!(gateway.lease_pages("acct-0", Some("released"), None).all().await.unwrap().is_empty());

    admin.issue_credential("acct-0", "k").await.unwrap();
    assert_eq!(admin.credential_pages("acct-0", Some(1)).all().await.unwrap().len(), 1);
    let credits = admin.credit_pages("acct-0", None).all().await.unwrap();
    assert_eq!((credits[0].credit_id.as_str(), credits[0].units), ("c1", 50));

    let refused = gateway.lease_pages("acct-0", Some("expired"), None).all().await.unwrap_err();
    assert_eq!(
        (refused.kind, refused.status, refused.code.as_str()),
        (ClientErrorKind::Api, Some(400), "invalid_state")
    );
    let refused = admin.list_credits("acct-1", &PageQuery { cursor: Some("nope".into()), limit: None }).await;
    assert_eq!(refused.unwrap_err().code, "invalid_cursor");
    let unknown = admin.credit_pages("ghost", None).all().await.unwrap_err();
    assert_eq!((unknown.status, unknown.code.as_str()), (Some(404), "account_not_found"));
}
