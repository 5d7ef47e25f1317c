//! The usage writer over HTTP against a real server on PostgreSQL, each test
//! on a fresh database.

use std::time::Duration;

use tollgate_client::{LossReason, Tally};
use tollgate_pg::testing::TestDb;

use crate::support::{
    GATEWAY_TOKEN, KillingSink, LEASE_TTL, Server, Storage, Tenant, assert_accounted, assert_ledger, client, writer,
    writer_config,
};

/// The server dies right after applying the third batch, before answering;
/// usage keeps being recorded while it is down; it restarts on the same
/// database and address. The writer's retries deliver everything, the batch
/// whose answer was lost comes back `duplicate`, and the ledger billed every
/// unit exactly once.
#[tokio::test]
async fn server_killed_mid_stream_and_restarted_on_the_same_database() {
    let db = TestDb::create().await;
    let storage = Storage::Postgres { url: db.url().to_owned() };
    let server = Server::start(&storage).await;
    let address = server.address.to_string();
    let tenant = Tenant::create(&server.admin(), "acct-pg-restart", 1_000_000).await;
    let lease = server.gateway().acquire(&tenant.account_id, 100_000, LEASE_TTL).await.unwrap();

    let sink = KillingSink::new(client(&server.url(), Some(GATEWAY_TOKEN)), Some(3), Some(server));
    let (writer, losses) = writer(sink.clone(), writer_config(10));
    let mut leased_units = 0u64;
    let mut record = |n: u64| {
        let units = n % 11;
        let event = if n.is_multiple_of(3) {
            tenant.overage(&format!("pg-{n}"), units)
        } else {
            leased_units += units;
            tenant.leased(&format!("pg-{n}"), units, &lease.lease_id, lease.fencing_token)
        };
        writer.record(event).unwrap();
    };
    for n in 0..60 {
        record(n);
    }
    sink.killed.notified().await;
    // The server is dead; the gateway keeps serving and recording.
    for n in 60..100 {
        record(n);
    }
    let restarted = Server::start_on(&storage, &address).await;
    let stats = writer.flush().await.unwrap();

    assert_accounted(&stats);
    assert!(losses.lock().unwrap().is_empty(), "{:#?}", losses.lock().unwrap());
    assert_eq!(stats.lost_total(), Tally::default());
    // Events 20..30 (the third batch) were applied before the kill; their
    // resend comes back duplicate and is counted as redelivered.
    let third_batch_units: u128 = (20..30u64).map(|n| u128::from(n % 11)).sum();
    assert_eq!(stats.redelivered, Tally { events: 10, units: third_batch_units });
    assert_eq!(stats.duplicate, stats.redelivered);
    assert_eq!(stats.accepted.events, 90);
    assert!(sink.calls() > 10, "the writer retried while the server was down: {} calls", sink.calls());
    // Billed exactly once per event: the writer's accepted units plus the
    // units whose first answer was lost, which is every recorded unit.
    assert_eq!(stats.delivered_units(), stats.recorded.units);
    let admin = restarted.admin();
    assert_ledger(&admin, &tenant.account_id, &stats).await;
    assert_eq!(admin.lease(&lease.account_id, &lease.lease_id).await.unwrap().used, leased_units);
    let activity = admin.credential(&tenant.account_id, &tenant.credential_id).await.unwrap().activity;
    assert_eq!((activity.accepted_events, u128::from(activity.accepted_units)), (100, stats.recorded.units));

    let stats = writer.shutdown(Duration::from_secs(10)).await.unwrap();
    assert_accounted(&stats);
    drop(restarted);
    db.drop_now().await;
}

/// PostgreSQL's unit domain is `0..=i64::MAX`: two events that each fit but
/// together overflow `billed` are refused as a batch, reported lost once, and
/// leave nothing behind.
#[tokio::test]
async fn a_batch_refused_for_overflow_on_postgres_is_lost_once() {
    let db = TestDb::create().await;
    let storage = Storage::Postgres { url: db.url().to_owned() };
    let server = Server::start(&storage).await;
    let admin = server.admin();
    let tenant = Tenant::create(&admin, "acct-pg-refused", 10).await;
    let sink = KillingSink::new(server.gateway(), None, None);
    let (writer, losses) = writer(sink.clone(), writer_config(2));

    let max = i64::MAX as u64;
    writer.record(tenant.overage("pg-huge", max)).unwrap();
    writer.record(tenant.overage("pg-one-more", 1)).unwrap();
    writer.record(tenant.overage("pg-after", 4)).unwrap();
    let stats = writer.shutdown(Duration::from_secs(30)).await.unwrap();

    assert_accounted(&stats);
    assert_eq!(sink.calls(), 2, "the refused batch was sent once");
    assert_eq!(stats.lost_for(LossReason::BatchRefused), Tally { events: 2, units: u128::from(max) + 1 });
    assert_eq!(stats.accepted, Tally { events: 1, units: 4 });
    assert_eq!(losses.lock().unwrap().len(), 1);
    assert_ledger(&admin, &tenant.account_id, &stats).await;
    // The refused request IDs were not claimed: a corrected event reuses one.
    let corrected = server.gateway().send_usage(&[tenant.overage("pg-huge", 6)]).await.unwrap();
    assert_eq!(corrected.outcomes[0].outcome, "accepted");
    drop(server);
    db.drop_now().await;
}
