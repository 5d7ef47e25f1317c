//! `TollgateClient::journal` against a running server, on both stores: the
//! entries of the operations the client made, pages, and typed errors.

use jiff::SignedDuration;
use tollgate_api::JournalKindBody;
use tollgate_client::ClientErrorKind;

use crate::faults::{on_both_stores, storage};
use crate::support::Server;

async fn journal_through_the_client(postgres: bool) {
    let (storage, _db) = storage(postgres).await;
    let server = Server::start(&storage).await;
    let (admin, gateway) = (server.admin(), server.gateway());
    admin.create_account("acct-journal").await.unwrap();
    admin.credit("acct-journal", "credit-1", 100).await.unwrap();
    let lease = gateway.acquire("acct-journal", 30, SignedDuration::from_secs(60)).await.unwrap();
    let capability = lease.capability.clone().expect("a new lease carries its capability");
    gateway.release("acct-journal", &lease.lease_id, &capability).await.unwrap();

    let entries = gateway.journal_all("acct-journal").await.unwrap();
    let kinds: Vec<(u64, JournalKindBody)> = entries.iter().map(|e| (e.seq, e.kind)).collect();
    assert_eq!(kinds, [(1, JournalKindBody::Credit), (2, JournalKindBody::Acquire), (3, JournalKindBody::Release)]);
    assert_eq!(entries[0].credit_id.as_deref(), Some("credit-1"));
    assert_eq!(entries[1].lease_id.as_deref(), Some(lease.lease_id.as_str()));
    assert_eq!((entries[1].deltas.available, entries[1].deltas.reserved), (-30, 30));
    assert_eq!((entries[2].deltas.available, entries[2].deltas.reserved), (30, -30));

    let page = admin.journal("acct-journal", 1, Some(1)).await.unwrap();
    assert_eq!((page.items.len(), page.items[0].seq, page.next_after), (1, 2, Some(2)));
    assert_eq!(page.items[0], entries[1]);

    let too_many = gateway.journal("acct-journal", 0, Some(1001)).await.unwrap_err();
    assert_eq!(
        (too_many.kind, too_many.status, too_many.code.as_str()),
        (ClientErrorKind::Api, Some(400), "invalid_limit")
    );
    let unknown = gateway.journal("nobody", 0, None).await.unwrap_err();
    assert_eq!((unknown.status, unknown.code.as_str()), (Some(404), "account_not_found"));
}

on_both_stores!(
    journal_through_the_client: the_journal_reads_through_the_client_on_memory,
    the_journal_reads_through_the_client_on_postgres
);
