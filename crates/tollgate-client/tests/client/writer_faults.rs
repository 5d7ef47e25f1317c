//! The usage writer over HTTP through the fault proxy, on both stores: the
//! server's billing equals what the writer counts as delivered, and every
//! recorded event is accounted for.

use std::time::Duration;

use tollgate_client::{ClientConfig, LossReason, RetryConfig, Tally, TollgateClient, WriterConfig};
use tollgate_pg::testing::TestDb;

use crate::faults::{Fault, FaultProxy, on_both_stores, storage};
use crate::support::{GATEWAY_TOKEN, Server, Tenant, assert_accounted, assert_ledger, http_writer};

/// A fresh store (PostgreSQL when `postgres`: keep its `TestDb`, first so
/// that it is dropped last, for as long as the server runs), a server on it,
/// its admin client and a tenant `account_id` with 1 000 units.
async fn served(postgres: bool, account_id: &str) -> (Option<TestDb>, Server, TollgateClient, Tenant) {
    let (storage, db) = storage(postgres).await;
    let server = Server::start(&storage).await;
    let admin = server.admin();
    let tenant = Tenant::create(&admin, account_id, 1_000).await;
    (db, server, admin, tenant)
}

/// Few quick attempts: a scenario that should settle at once must not be
/// rescued by retrying.
fn config() -> WriterConfig {
    WriterConfig {
        queue_events_max: 1_000,
        batch_events_max: 100,
        batch_age_max: Duration::from_millis(20),
        retry: RetryConfig {
            backoff_initial: Duration::from_millis(5),
            backoff_max: Duration::from_millis(20),
            attempts_max: 3,
        },
        ..WriterConfig::default()
    }
}

/// A newer server rejects an event for a reason this client does not know.
/// The answer still settles the whole batch: the accepted events are
/// delivered (and billed), the unknown one is counted under its wire code.
async fn unknown_rejection_reason(postgres: bool) {
    let (_db, server, admin, tenant) = served(postgres, "acct-new-reason").await;
    let proxy = FaultProxy::start(server.address).await;
    proxy.once("POST", "/v1/usage", 1, Fault::RewriteAnswer { from: "\"unknown_credential\"", to: "\"quota_frozen\"" });
    let client = TollgateClient::new(ClientConfig::new(proxy.url(), Some(GATEWAY_TOKEN))).unwrap();
    let (writer, losses) = http_writer(client, config());

    for n in 0..5 {
        writer.record(tenant.overage(&format!("ok-{n}"), 1)).unwrap();
    }
    let mut stranger = tenant.overage("stranger", 1);
    stranger.credential_id = "no-such-credential".into();
    writer.record(stranger).unwrap();
    let stats = writer.shutdown(Duration::from_secs(30)).await.unwrap();

    assert_eq!(proxy.faults().len(), 1, "the answer was rewritten");
    assert_accounted(&stats);
    assert_eq!(stats.accepted, Tally { events: 5, units: 5 }, "{stats:#?}");
    assert_eq!(stats.rejected.get("quota_frozen"), Some(&Tally { events: 1, units: 1 }), "{stats:#?}");
    assert_eq!((stats.lost_total(), stats.attempts), (Tally::default(), 1), "{stats:#?}");
    assert!(losses.lock().unwrap().is_empty());
    assert_ledger(&admin, &tenant.account_id, &stats).await;
}

on_both_stores!(
    unknown_rejection_reason: memory_unknown_rejection_reason_settles_the_batch,
    postgres_unknown_rejection_reason_settles_the_batch
);

/// A request the server refuses outright (here a wrong token, 401, or a base
/// URL with a wrong path, 404) is lost once, on its first attempt,
/// with the answer's code, and flagged as not applied.
async fn refused_request_is_lost_once(postgres: bool) {
    let (_db, server, admin, tenant) = served(postgres, "acct-refused").await;
    let wrong_path = format!("{}/nowhere", server.url());
    for (base_url, token, status_code) in
        [(server.url(), "not-the-token", "unauthorized"), (wrong_path, GATEWAY_TOKEN, "not_found")]
    {
        let client = TollgateClient::new(ClientConfig::new(base_url, Some(token))).unwrap();
        let (writer, losses) = http_writer(client, config());
        for n in 0..4 {
            writer.record(tenant.overage(&format!("{status_code}-{n}"), 2)).unwrap();
        }
        let stats = writer.shutdown(Duration::from_secs(30)).await.unwrap();
        assert_accounted(&stats);
        assert_eq!(stats.attempts, 1, "never retried: {stats:#?}");
        assert_eq!(stats.lost.get(&LossReason::RequestRefused), Some(&Tally { events: 4, units: 8 }), "{stats:#?}");
        let losses = losses.lock().unwrap();
        assert_eq!(losses.len(), 1);
        assert_eq!(
            (losses[0].error_code, losses[0].attempts, losses[0].maybe_applied),
            (Some(status_code), 1, false),
            "{:#?}",
            losses[0]
        );
    }
    let account = admin.account(&tenant.account_id).await.unwrap();
    assert_eq!(account.billed, 0);
}

on_both_stores!(
    refused_request_is_lost_once: memory_refused_request_is_lost_once,
    postgres_refused_request_is_lost_once
);

/// An event with a 17 MiB request id is turned away by `record`, with the
/// event handed back; the 99 valid events of the same moment are delivered.
async fn an_oversized_event_is_turned_away(postgres: bool) {
    let (_db, server, admin, tenant) = served(postgres, "acct-oversized").await;
    let (writer, losses) = http_writer(server.gateway(), config());
    for n in 0..99 {
        writer.record(tenant.overage(&format!("ok-{n}"), 1)).unwrap();
    }
    let huge = tenant.overage(&"r".repeat(17 * 1024 * 1024), 1);
    let refused = writer.record(huge.clone()).unwrap_err();
    assert_eq!(refused.code(), "field_too_long");
    assert_eq!(refused.into_event(), huge);
    let stats = writer.shutdown(Duration::from_secs(30)).await.unwrap();
    assert_accounted(&stats);
    assert_eq!((stats.accepted, stats.turned_away_invalid), (Tally { events: 99, units: 99 }, 1), "{stats:#?}");
    assert!(losses.lock().unwrap().is_empty());
    assert_ledger(&admin, &tenant.account_id, &stats).await;
}

/// A batch of valid-sized events whose body is still over the server's 16 MiB
/// (escaped control characters take six bytes each) is answered 413; the
/// writer halves it until the halves fit, so nobody's events are lost.
async fn a_batch_over_the_body_limit_is_split(postgres: bool) {
    let (_db, server, admin, tenant) = served(postgres, "acct-split").await;
    let config = WriterConfig {
        queue_events_max: 20_000,
        batch_events_max: 10_000,
        batch_age_max: Duration::from_secs(60),
        ..config()
    };
    let (writer, losses) = http_writer(server.gateway(), config);
    let control = "\u{1}".repeat(123);
    let strangers = 8_000;
    for n in 0..strangers {
        let mut event = tenant.overage(&format!("{n:05}{control}"), 1);
        event.credential_id = "\u{1}".repeat(128);
        event.lease_id = Some("\u{1}".repeat(128));
        event.fencing_token = Some(1);
        writer.record(event).unwrap();
    }
    for n in 0..100 {
        writer.record(tenant.overage(&format!("valid-{n}"), 1)).unwrap();
    }
    let stats = writer.shutdown(Duration::from_secs(120)).await.unwrap();
    assert_accounted(&stats);
    assert_eq!(stats.accepted, Tally { events: 100, units: 100 }, "{stats:#?}");
    assert_eq!(stats.rejected_total(), Tally { events: strangers, units: u128::from(strangers) }, "{stats:#?}");
    assert!(stats.batches == 1 && stats.attempts >= 3, "one batch, refused whole, then its halves: {stats:#?}");
    assert!(losses.lock().unwrap().is_empty(), "{:#?}", losses.lock().unwrap().len());
    assert_ledger(&admin, &tenant.account_id, &stats).await;
}

on_both_stores!(
    an_oversized_event_is_turned_away: memory_an_oversized_event_is_turned_away,
    postgres_an_oversized_event_is_turned_away
);

on_both_stores!(
    a_batch_over_the_body_limit_is_split: memory_a_batch_over_the_body_limit_is_split,
    postgres_a_batch_over_the_body_limit_is_split
);
