//! Webhooks across a killed server: a change committed by a server that is
//! killed with SIGKILL before its worker delivered the change's events is
//! delivered, once, by the server started again on the same database.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::json;
use tollgate_pg::testing::TestDb;
use tollgate_testkit::receiver::{Receiver, signed_by};

use crate::support::{Api, As, PROCESS_WAIT_MAX, Server};

#[tokio::test]
async fn events_committed_before_a_sigkill_are_delivered_once_after_restart() {
    let db = TestDb::create().await;
    let key = "5a".repeat(32);
    let env = [("DATABASE_URL", db.url()), ("TOLLGATE_WEBHOOK_KEY", key.as_str())];
    // The worker's first tick comes one interval after start: an hour, so
    // this server commits the changes and never delivers them.
    let server = Server::start(&["--webhook-interval", "PT1H"], &env).await;
    let receiver = Receiver::start().await;
    let created = StatusCode::CREATED;
    server.ok(As::Admin, Method::POST, "/v1/accounts", Some(json!({"account_id": "acct"})), created).await;
    let rule = json!({"condition": "available_below", "threshold": 100});
    server.ok(As::Admin, Method::POST, "/v1/accounts/acct/alert-rules", Some(rule), created).await;
    let hook = json!({"url": receiver.url(), "event_types": ["credit.received", "balance.threshold_crossed"]});
    let endpoint = server.ok(As::Admin, Method::POST, "/v1/webhooks", Some(hook), created).await;
    let (endpoint_id, secret) = (endpoint["endpoint_id"].as_str().unwrap(), endpoint["secret"].as_str().unwrap());
    let credit = json!({"credit_id": "c1", "units": 1000});
    server.ok(As::Admin, Method::POST, "/v1/accounts/acct/credits", Some(credit), created).await;
    let lease = json!({"units": 950, "ttl": "PT10M"});
    let (status, _) = server.call(As::Gateway, Method::POST, "/v1/accounts/acct/leases", Some(lease)).await;
    assert_eq!(status, StatusCode::CREATED);
    server.kill().await;
    assert!(receiver.received().is_empty(), "the killed server delivered before it was killed");

    let restarted = Server::start(&["--webhook-interval", "PT0.05S"], &env).await;
    // The receiver gets a request before the server records its answer:
    // wait for the log to say delivered.
    let path = format!("/v1/webhooks/{endpoint_id}/deliveries");
    let waited = tokio::time::Instant::now();
    let log = loop {
        let (_, log) = restarted.call(As::Admin, Method::GET, &path, None).await;
        let items = log["items"].as_array().unwrap();
        if items.len() == 2 && items.iter().all(|d| d["state"] == "delivered") {
            break log;
        }
        assert!(waited.elapsed() < PROCESS_WAIT_MAX, "not delivered after restart: {log}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(log["items"].as_array().unwrap().iter().all(|d| d["attempts"] == 1), "{log}");
    let received = receiver.received();
    assert_eq!(received.len(), 2, "each event once: {received:?}");
    let mut types: Vec<String> = received.iter().map(|r| r.json()["type"].as_str().unwrap().to_owned()).collect();
    types.sort();
    assert_eq!(types, ["balance.threshold_crossed", "credit.received"]);
    assert!(received.iter().all(|r| signed_by(r, secret).is_some()));
    let (stopped, stderr) = restarted.terminate().await;
    assert!(stopped, "{stderr}");
    db.drop_now().await;
}
