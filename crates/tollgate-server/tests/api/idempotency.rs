//! `Idempotency-Key` through the router: a retry answers with the original
//! status and body and applies nothing again; the key with another request is
//! 409 `idempotency_key_reused`; a malformed key is 400.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use jiff::SignedDuration;
use serde_json::{Value, json};
use tollgate_server::Limits;
use tollgate_server::worker::purge_tick;
use tollgate_store::MemoryStore;
use tower::ServiceExt;

use crate::support::{ADMIN, Api, App, As, GATEWAY, assert_error, policy};

/// Sends one request with `key` as its `Idempotency-Key`.
async fn keyed(app: &App, who: As, path: &str, key: &str, body: Value) -> (StatusCode, Value) {
    let token = if who == As::Admin { ADMIN } else { GATEWAY };
    let request = Request::builder()
        .method(Method::POST)
        .uri(path)
        .header("authorization", format!("Bearer {token}"))
        .header("idempotency-key", key)
        .body(Body::from(serde_json::to_vec(&body).unwrap()))
        .unwrap();
    let response = app.router.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
    (status, serde_json::from_slice(&bytes).unwrap())
}

async fn reserved(app: &App) -> (Value, Value) {
    let account = app.ok(As::Gateway, Method::GET, "/v1/accounts/acct", None, StatusCode::OK).await;
    (account["reserved"].clone(), account["active_leases"].clone())
}

#[tokio::test]
async fn a_retried_acquire_answers_the_same_lease_once() {
    let app = App::new();
    app.funded("acct", 100).await;
    let path = "/v1/accounts/acct/leases";
    let key = "0b9c6f1e-2d3a-4c5b-8e7f-123456789abc";
    let first = keyed(&app, As::Gateway, path, key, json!({"units": 10, "ttl": "PT30S"})).await;
    assert_eq!(first.0, StatusCode::CREATED, "{}", first.1);
    assert!(first.1["capability"].as_str().is_some_and(|c| c.starts_with("tgc_")));
    app.clock.set(crate::support::start() + SignedDuration::from_secs(5));
    let retry = keyed(&app, As::Gateway, path, key, json!({"units": 10, "ttl": "PT30S"})).await;
    assert_eq!(retry, first, "the original status and body, capability included");
    assert_eq!(reserved(&app).await, (json!(10), json!(1)));

    let reused = keyed(&app, As::Gateway, path, key, json!({"units": 11, "ttl": "PT30S"})).await;
    assert_error(reused, StatusCode::CONFLICT, "idempotency_key_reused", false);
    assert_eq!(reserved(&app).await, (json!(10), json!(1)));

    let too_long = "k".repeat(256);
    for bad in ["", "with space", too_long.as_str()] {
        let refused = keyed(&app, As::Gateway, path, bad, json!({"units": 1, "ttl": "PT30S"})).await;
        assert_error(refused, StatusCode::BAD_REQUEST, "invalid_idempotency_key", false);
    }
    assert_eq!(reserved(&app).await, (json!(10), json!(1)));
}

#[tokio::test]
async fn retried_release_issue_and_revoke_answer_as_the_first_time() {
    let app = App::new();
    let (credential_id, _) = app.funded("acct", 100).await;
    let lease =
        keyed(&app, As::Gateway, "/v1/accounts/acct/leases", "acquire-1", json!({"units": 10, "ttl": "PT30S"})).await.1;
    let release = format!("/v1/accounts/acct/leases/{}/release", lease["lease_id"].as_str().unwrap());
    let body = json!({"capability": lease["capability"]});
    let first = keyed(&app, As::Gateway, &release, "release-1", body.clone()).await;
    assert_eq!(first.0, StatusCode::OK, "{}", first.1);
    assert_eq!(keyed(&app, As::Gateway, &release, "release-1", body.clone()).await, first);
    // Without the key, a second release is what it always was.
    let again = app.call(As::Gateway, Method::POST, &release, Some(body)).await;
    assert_error(again, StatusCode::CONFLICT, "lease_not_active", false);

    let issue = "/v1/accounts/acct/credentials";
    let issued = keyed(&app, As::Admin, issue, "issue-1", json!({"label": "edge"})).await;
    assert_eq!(issued.0, StatusCode::CREATED);
    assert_eq!(keyed(&app, As::Admin, issue, "issue-1", json!({"label": "edge"})).await, issued);
    let reused = keyed(&app, As::Admin, issue, "issue-1", json!({"label": "other"})).await;
    assert_error(reused, StatusCode::CONFLICT, "idempotency_key_reused", false);

    let revoke = format!("/v1/accounts/acct/credentials/{credential_id}/revoke");
    let revoked = keyed(&app, As::Admin, &revoke, "revoke-1", Value::Null).await;
    assert_eq!(revoked.0, StatusCode::OK);
    app.clock.set(crate::support::start() + SignedDuration::from_secs(5));
    assert_eq!(keyed(&app, As::Admin, &revoke, "revoke-1", Value::Null).await, revoked);
}

/// After the configured retention the worker purges the record and the key is
/// new: the same request then grants a second lease.
#[tokio::test]
async fn records_expire_after_the_configured_retention_and_are_purged() {
    let limits = Limits { idempotency_retention: SignedDuration::from_secs(60), ..Limits::default() };
    let app = App::with_store(Arc::new(MemoryStore::new(policy())), limits);
    app.funded("acct", 100).await;
    let path = "/v1/accounts/acct/leases";
    let first = keyed(&app, As::Gateway, path, "retained-1", json!({"units": 10, "ttl": "PT30S"})).await.1;
    app.clock.set(crate::support::start() + SignedDuration::from_secs(59));
    assert_eq!(purge_tick(&app.state).await, Ok(0));
    assert_eq!(keyed(&app, As::Gateway, path, "retained-1", json!({"units": 10, "ttl": "PT30S"})).await.1, first);

    app.clock.set(crate::support::start() + SignedDuration::from_secs(60));
    assert_eq!(purge_tick(&app.state).await, Ok(1));
    let second = keyed(&app, As::Gateway, path, "retained-1", json!({"units": 10, "ttl": "PT30S"})).await.1;
    assert_ne!(second["lease_id"], first["lease_id"]);
    assert_eq!(reserved(&app).await, (json!(20), json!(2)));
}
