//! Alert rules and signed webhooks end to end, against a real receiver on
//! loopback, on both stores: one event per crossing through a concurrent
//! burst, a receiver that is down and then up, give-up and redelivery,
//! rotation, and two servers sharing one database's deliveries.

use std::collections::BTreeMap;

use futures_util::future::join_all;
use std::sync::Arc;

use axum::http::{Method, StatusCode};
use jiff::SignedDuration;
use serde_json::{Value, json};
use tollgate_core::Secret;
use tollgate_pg::PostgresStore;
use tollgate_pg::testing::TestDb;
use tollgate_server::webhooks::deliver_due;
use tollgate_server::{AppState, Clock, Limits, OperatorTokens, WebhookSettings};
use tollgate_store::WebhookKey;
use tollgate_testkit::receiver::{Receiver, signed_by};

use crate::support::{ADMIN, Api, App, As, GATEWAY, assert_error, policy};

async fn on_postgres() -> App {
    let store = PostgresStore::on_test_db(TestDb::create().await, policy()).await.expect("store");
    App::with_store(Arc::new(store), Limits::default())
}

/// The memory store and PostgreSQL, each behind its own server.
async fn both() -> Vec<(&'static str, App)> {
    vec![("memory", App::new()), ("postgres", on_postgres().await)]
}

/// Creates an endpoint at `receiver` for `types`, then moves the clock on a
/// millisecond, since an endpoint gets only events caused after its
/// creation; returns its id and secret.
async fn endpoint(app: &App, receiver: &Receiver, types: &[&str]) -> (String, String) {
    let body = json!({"url": receiver.url(), "event_types": types});
    let created = app.ok(As::Admin, Method::POST, "/v1/webhooks", Some(body), StatusCode::CREATED).await;
    app.clock.set(app.clock.now().checked_add(SignedDuration::from_millis(1)).unwrap());
    (created["endpoint_id"].as_str().unwrap().to_owned(), created["secret"].as_str().unwrap().to_owned())
}

async fn rule(app: &App, account: &str, condition: &str, threshold: Option<u64>) {
    let body = json!({"condition": condition, "threshold": threshold});
    let path = format!("/v1/accounts/{account}/alert-rules");
    app.ok(As::Admin, Method::POST, &path, Some(body), StatusCode::CREATED).await;
}

/// Attempts every due delivery until none is left at the current time.
async fn drain(app: &App) {
    for _ in 0..100 {
        if deliver_due(&app.state).await.expect("delivered") == 0 {
            return;
        }
    }
    panic!("deliveries were still due after 100 rounds");
}

async fn deliveries(app: &App, endpoint_id: &str) -> Vec<Value> {
    let path = format!("/v1/webhooks/{endpoint_id}/deliveries");
    let page = app.ok(As::Admin, Method::GET, &path, None, StatusCode::OK).await;
    page["items"].as_array().unwrap().clone()
}

fn overage_batch(i: usize, credential_id: &str) -> Value {
    json!({"events": [{
        "request_id": format!("burst-{i}"),
        "account_id": "acct",
        "credential_id": credential_id,
        "units": 1,
        "occurred_at": "2024-01-01T00:00:00Z",
    }]})
}

/// A thousand concurrent acquires draining the balance, a hundred
/// concurrent usage batches raising overage and twenty refused acquires
/// cross each rule once: the receiver gets exactly one signed event each.
#[tokio::test]
async fn a_concurrent_burst_crosses_each_rule_once_and_each_delivery_is_signed() {
    for (store, app) in both().await {
        let (credential_id, _) = app.funded("acct", 1_000).await;
        rule(&app, "acct", "available_below", Some(100)).await;
        rule(&app, "acct", "overage_above", Some(50)).await;
        rule(&app, "acct", "acquire_refused", None).await;
        let receiver = Receiver::start().await;
        let types = ["balance.threshold_crossed", "overage.threshold_crossed", "acquire.refused_insufficient_balance"];
        let (_, secret) = endpoint(&app, &receiver, &types).await;

        let acquire = json!({"units": 1, "ttl": "PT10M"});
        let path = "/v1/accounts/acct/leases";
        let acquires = (0..1_000).map(|_| app.call(As::Gateway, Method::POST, path, Some(acquire.clone())));
        let batches =
            (0..100).map(|i| app.call(As::Gateway, Method::POST, "/v1/usage", Some(overage_batch(i, &credential_id))));
        let (acquired, ingested) =
            tokio::join!(join_all(acquires.collect::<Vec<_>>()), join_all(batches.collect::<Vec<_>>()));
        assert!(acquired.iter().all(|(status, _)| *status == StatusCode::CREATED), "{store}");
        assert!(ingested.iter().all(|(status, _)| *status == StatusCode::OK), "{store}");
        let refused = (0..20).map(|_| app.call(As::Gateway, Method::POST, path, Some(acquire.clone())));
        assert!(join_all(refused.collect::<Vec<_>>()).await.iter().all(|(status, _)| *status == StatusCode::CONFLICT));

        drain(&app).await;
        let received = receiver.received();
        let mut kinds: Vec<String> = received.iter().map(|r| r.json()["type"].as_str().unwrap().to_owned()).collect();
        kinds.sort();
        let mut expected = types.map(str::to_owned).to_vec();
        expected.sort();
        assert_eq!(kinds, expected, "{store}");
        let now = app.state.now().as_second();
        for delivery in &received {
            assert_eq!(signed_by(delivery, &secret), Some(now), "{store}: {}", delivery.signature);
            assert_eq!(delivery.json()["id"], delivery.event_id.as_str(), "{store}");
            assert_eq!(delivery.attempt, 1, "{store}");
        }
        let crossed = received.iter().find(|r| r.json()["type"] == "balance.threshold_crossed").unwrap().json();
        assert_eq!(crossed["account"]["available"], 99, "{store}");
        let overage = received.iter().find(|r| r.json()["type"] == "overage.threshold_crossed").unwrap().json();
        assert_eq!(overage["account"]["overage"], 51, "{store}");
    }
}

/// A receiver that answers 503 gets the delivery again after the retry
/// wait, and keeps it once it answers 200; the log and the metrics show
/// the retry. An unreachable receiver is retried the same way.
#[tokio::test]
async fn a_receiver_that_was_down_gets_the_delivery_once_it_is_up() {
    for (store, app) in both().await {
        app.funded("acct", 10).await;
        let receiver = Receiver::start().await;
        let (hook, _) = endpoint(&app, &receiver, &["credit.received"]).await;
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
        let unreachable = json!({"url": format!("http://{closed}/hook"), "event_types": ["credit.received"]});
        let gone = app.ok(As::Admin, Method::POST, "/v1/webhooks", Some(unreachable), StatusCode::CREATED).await;
        app.clock.set(app.clock.now().checked_add(SignedDuration::from_millis(1)).unwrap());
        receiver.answer(503);
        let credit = json!({"credit_id": "c2", "units": 5});
        app.ok(As::Admin, Method::POST, "/v1/accounts/acct/credits", Some(credit), StatusCode::CREATED).await;

        assert_eq!(deliver_due(&app.state).await.unwrap(), 2, "{store}");
        let log = deliveries(&app, &hook).await;
        assert_eq!((log[0]["state"].as_str(), log[0]["attempts"].as_u64()), (Some("pending"), Some(1)), "{store}");
        assert_eq!(log[0]["last_status"], 503, "{store}");
        let unreachable_log = deliveries(&app, gone["endpoint_id"].as_str().unwrap()).await;
        assert!(unreachable_log[0]["last_error"].as_str().unwrap().starts_with("could not connect"), "{store}");
        assert_eq!(deliver_due(&app.state).await.unwrap(), 0, "{store}: nothing is due before the retry wait");

        receiver.answer(200);
        app.clock.set(app.clock.now().checked_add(SignedDuration::from_mins(5)).unwrap());
        assert_eq!(deliver_due(&app.state).await.unwrap(), 2, "{store}");
        let log = deliveries(&app, &hook).await;
        assert_eq!((log[0]["state"].as_str(), log[0]["attempts"].as_u64()), (Some("delivered"), Some(2)), "{store}");
        let received = receiver.received();
        assert_eq!(received.len(), 2, "{store}");
        assert_eq!(received[0].event_id, received[1].event_id, "{store}");
        assert_eq!((received[0].attempt, received[1].attempt), (1, 2), "{store}");

        let (_, metrics) = app.call(As::Admin, Method::GET, "/metrics", None).await;
        let metrics = metrics.as_str().unwrap().to_owned();
        for line in [
            r#"tollgate_webhook_attempts_total{result="retried"} 3"#,
            r#"tollgate_webhook_attempts_total{result="delivered"} 1"#,
            r#"tollgate_webhook_deliveries{state="delivered"} 1"#,
            r#"tollgate_webhook_deliveries{state="pending"} 1"#,
            "tollgate_webhook_delivery_seconds_count 1",
        ] {
            assert!(metrics.lines().any(|l| l == line), "{store}: missing {line} in\n{metrics}");
        }
    }
}

/// A delivery that still fails at its give-up time is failed; a redelivery
/// makes it due again and sends the same event.
#[tokio::test]
async fn a_failed_delivery_is_given_up_and_redelivered_on_request() {
    let app = App::new();
    app.funded("acct", 10).await;
    let receiver = Receiver::start().await;
    let (hook, _) = endpoint(&app, &receiver, &["credit.received"]).await;
    receiver.answer(500);
    let credit = json!({"credit_id": "c2", "units": 5});
    app.ok(As::Admin, Method::POST, "/v1/accounts/acct/credits", Some(credit), StatusCode::CREATED).await;
    drain(&app).await;
    app.clock.set(app.clock.now().checked_add(SignedDuration::from_hours(25)).unwrap());
    drain(&app).await;
    let log = deliveries(&app, &hook).await;
    assert_eq!((log[0]["state"].as_str(), log[0]["last_error"].as_str()), (Some("failed"), Some("HTTP 500")));
    assert!(log[0]["next_attempt_at"].is_null());

    receiver.answer(200);
    let id = log[0]["delivery_id"].as_str().unwrap();
    let path = format!("/v1/webhooks/{hook}/deliveries/{id}/redeliver");
    let again = app.ok(As::Admin, Method::POST, &path, None, StatusCode::ACCEPTED).await;
    assert_eq!(again["state"], "pending");
    drain(&app).await;
    assert_eq!(deliveries(&app, &hook).await[0]["state"], "delivered");
    let received = receiver.received();
    assert_eq!(received.first().unwrap().event_id, received.last().unwrap().event_id);
    let missing = format!("/v1/webhooks/{hook}/deliveries/dlv_none/redeliver");
    assert_error(
        app.call(As::Admin, Method::POST, &missing, None).await,
        StatusCode::NOT_FOUND,
        "delivery_not_found",
        false,
    );
}

/// Bad rules and endpoints are typed 400s; a secret is shown only when it
/// is made; during a rotation's overlap each delivery is signed by both
/// secrets, so a receiver holding either accepts it.
#[tokio::test]
async fn routes_refuse_bad_input_and_show_each_secret_once() {
    let app = App::new();
    app.funded("acct", 10).await;
    let bad_rules = [
        (json!({"condition": "available_below"}), "invalid_condition"),
        (json!({"condition": "available_below_percent", "threshold": 101}), "invalid_condition"),
        (json!({"condition": "whatever", "threshold": 1}), "invalid_condition"),
    ];
    for (body, code) in bad_rules {
        let answer = app.call(As::Admin, Method::POST, "/v1/accounts/acct/alert-rules", Some(body)).await;
        assert_error(answer, StatusCode::BAD_REQUEST, code, false);
    }
    let answer = app
        .call(As::Admin, Method::POST, "/v1/accounts/nobody/alert-rules", Some(json!({"condition": "acquire_refused"})))
        .await;
    assert_error(answer, StatusCode::NOT_FOUND, "account_not_found", false);
    let bad_hooks = [
        (json!({"url": "ftp://example.com", "event_types": ["credit.received"]}), "invalid_webhook_url"),
        (json!({"url": "https://example.com", "event_types": []}), "invalid_event_types"),
        (json!({"url": "https://example.com", "event_types": ["credit.sent"]}), "invalid_event_types"),
    ];
    for (body, code) in bad_hooks {
        let answer = app.call(As::Admin, Method::POST, "/v1/webhooks", Some(body)).await;
        assert_error(answer, StatusCode::BAD_REQUEST, code, false);
    }
    let gateway = app.call(As::Gateway, Method::GET, "/v1/webhooks", None).await;
    assert_eq!(gateway.0, StatusCode::FORBIDDEN);

    let receiver = Receiver::start().await;
    let (hook, old) = endpoint(&app, &receiver, &["credit.received"]).await;
    let listed = app.ok(As::Admin, Method::GET, "/v1/webhooks", None, StatusCode::OK).await;
    assert!(listed["endpoints"][0].get("secret").is_none());
    assert!(!listed.to_string().contains(&old));
    let rotate = format!("/v1/webhooks/{hook}/rotate-secret");
    let too_long = app.call(As::Admin, Method::POST, &rotate, Some(json!({"overlap_seconds": 999_999_999}))).await;
    assert_error(too_long, StatusCode::BAD_REQUEST, "invalid_overlap", false);
    let rotated = app.ok(As::Admin, Method::POST, &rotate, Some(json!({"overlap_seconds": 60})), StatusCode::OK).await;
    let new = rotated["secret"].as_str().unwrap();
    assert_ne!(new, old);
    let credit = json!({"credit_id": "c2", "units": 5});
    app.ok(As::Admin, Method::POST, "/v1/accounts/acct/credits", Some(credit), StatusCode::CREATED).await;
    drain(&app).await;
    let delivery = &receiver.received()[0];
    assert!(signed_by(delivery, new).is_some() && signed_by(delivery, &old).is_some(), "{}", delivery.signature);
    assert_eq!(delivery.signature.matches("v1=").count(), 2);

    app.clock.set(app.clock.now().checked_add(SignedDuration::from_mins(2)).unwrap());
    let credit = json!({"credit_id": "c3", "units": 5});
    app.ok(As::Admin, Method::POST, "/v1/accounts/acct/credits", Some(credit), StatusCode::CREATED).await;
    drain(&app).await;
    let after = &receiver.received()[1];
    assert!(signed_by(after, new).is_some() && signed_by(after, &old).is_none());
}

/// A server over `store` with webhook `settings`.
fn app_with(store: Arc<dyn tollgate_store::Store>, settings: WebhookSettings) -> App {
    let tokens = OperatorTokens::new(&Secret::new(ADMIN.into()), Some(&Secret::new(GATEWAY.into()))).unwrap();
    let clock = Arc::new(tollgate_server::ManualClock::new(crate::support::start()));
    let state = AppState::with_webhooks(store, clock.clone(), tokens, Limits::default(), settings);
    App { router: tollgate_server::router(state.clone()), clock, state }
}

/// With private addresses refused, a receiver on loopback is never sent
/// anything: each attempt fails, saying why, and is retried.
#[tokio::test]
async fn private_addresses_are_refused_when_so_configured() {
    let store = Arc::new(tollgate_store::MemoryStore::new(policy()));
    let app = app_with(store, WebhookSettings { allow_private: false, ..WebhookSettings::default() });
    app.funded("acct", 10).await;
    let receiver = Receiver::start().await;
    let (hook, _) = endpoint(&app, &receiver, &["credit.received"]).await;
    let credit = json!({"credit_id": "c2", "units": 5});
    app.ok(As::Admin, Method::POST, "/v1/accounts/acct/credits", Some(credit), StatusCode::CREATED).await;
    assert_eq!(deliver_due(&app.state).await.unwrap(), 1);
    let log = deliveries(&app, &hook).await;
    assert_eq!(log[0]["state"], "pending");
    assert!(log[0]["last_error"].as_str().unwrap().contains("not public"), "{log:?}");
    assert!(receiver.received().is_empty());
}

/// A PostgreSQL server without a webhook key cannot seal a secret, so it
/// refuses to create endpoints.
#[tokio::test]
async fn without_a_key_endpoints_are_refused() {
    let store = PostgresStore::on_test_db(TestDb::create().await, policy()).await.expect("store");
    let app = app_with(Arc::new(store), WebhookSettings { key: None, ..WebhookSettings::default() });
    let body = json!({"url": "http://127.0.0.1:9/hook", "event_types": ["credit.received"]});
    let answer = app.call(As::Admin, Method::POST, "/v1/webhooks", Some(body)).await;
    assert_error(answer, StatusCode::CONFLICT, "webhook_key_missing", false);
}

/// Two servers on one database, with one key, deliver concurrently: each
/// delivery is attempted once, by one of them.
#[tokio::test]
async fn two_servers_on_one_database_never_make_the_same_attempt_twice() {
    let db = TestDb::create().await;
    let other_pool = db.new_pool(4).await;
    let key = WebhookKey::random();
    let server = |store: PostgresStore| {
        app_with(Arc::new(store), WebhookSettings { key: Some(key.clone()), ..WebhookSettings::default() })
    };
    let first = server(PostgresStore::on_test_db(db, policy()).await.expect("store"));
    let second = server(PostgresStore::from_pool(other_pool, policy()).await.expect("store"));
    first.funded("acct", 10).await;
    let receiver = Receiver::start().await;
    endpoint(&first, &receiver, &["credit.received"]).await;
    for i in 0..200 {
        let credit = json!({"credit_id": format!("c-{i}"), "units": 1});
        first.ok(As::Admin, Method::POST, "/v1/accounts/acct/credits", Some(credit), StatusCode::CREATED).await;
    }
    for _ in 0..20 {
        let (a, b) = tokio::join!(deliver_due(&first.state), deliver_due(&second.state));
        if a.unwrap() + b.unwrap() == 0 {
            break;
        }
    }
    let mut attempts: BTreeMap<(String, u32), u32> = BTreeMap::new();
    for delivery in receiver.received() {
        *attempts.entry((delivery.delivery_id, delivery.attempt)).or_default() += 1;
    }
    assert_eq!(attempts.len(), 200);
    assert!(attempts.iter().all(|((_, attempt), sent)| *attempt == 1 && *sent == 1), "{attempts:?}");
}
