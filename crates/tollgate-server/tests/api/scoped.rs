//! Lease and credential routes name their account: under another account a
//! lease or credential is not found, exactly like an unknown one, and
//! nothing changes; a key whose account part was altered is unknown.

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::{Api, App, As, assert_error};

#[tokio::test]
async fn a_lease_under_another_accounts_route_is_not_found_and_nothing_changes() {
    let app = App::new();
    app.funded("acct-a", 100).await;
    app.funded("acct-b", 100).await;
    let lease = app.acquire("acct-a", 10, "PT30S").await;
    let (id, capability) = (lease["lease_id"].as_str().unwrap(), lease["capability"].clone());
    let before = (app.account("acct-a").await, app.account("acct-b").await);

    for other in ["acct-b", "nobody"] {
        let read = app.call(As::Gateway, Method::GET, &format!("/v1/accounts/{other}/leases/{id}"), None).await;
        assert_error(read, StatusCode::NOT_FOUND, "lease_not_found", false);
        let release = format!("/v1/accounts/{other}/leases/{id}/release");
        let released = app.call(As::Gateway, Method::POST, &release, Some(json!({"capability": capability}))).await;
        assert_error(released, StatusCode::NOT_FOUND, "lease_not_found", false);
    }
    assert_eq!((app.account("acct-a").await, app.account("acct-b").await), before);
    let read =
        app.ok(As::Gateway, Method::GET, &format!("/v1/accounts/acct-a/leases/{id}"), None, StatusCode::OK).await;
    assert_eq!(read["state"], "active");

    // The old routes are gone.
    let old = app.call(As::Gateway, Method::GET, &format!("/v1/leases/{id}"), None).await;
    assert_eq!(old.0, StatusCode::NOT_FOUND);
    let release = format!("/v1/accounts/acct-a/leases/{id}/release");
    let settled = app.ok(As::Gateway, Method::POST, &release, Some(json!({"capability": capability})), StatusCode::OK);
    assert_eq!(settled.await["returned"], 10);
}

#[tokio::test]
async fn a_credential_under_another_accounts_route_is_not_found_and_a_rerouted_key_is_unknown() {
    let app = App::new();
    let (credential_id, key) = app.funded("acct-a", 1).await;
    app.funded("acct-b", 1).await;
    for other in ["acct-b", "nobody"] {
        let path = format!("/v1/accounts/{other}/credentials/{credential_id}");
        assert_error(
            app.call(As::Admin, Method::GET, &path, None).await,
            StatusCode::NOT_FOUND,
            "credential_not_found",
            false,
        );
        let revoke = app.call(As::Admin, Method::POST, &format!("{path}/revoke"), None).await;
        assert_error(revoke, StatusCode::NOT_FOUND, "credential_not_found", false);
    }
    let path = format!("/v1/accounts/acct-a/credentials/{credential_id}");
    let read = app.ok(As::Admin, Method::GET, &path, None, StatusCode::OK).await;
    assert_eq!(read["revoked_at"], Value::Null);

    let app = &app;
    let verify = |key: String| async move { app.verify(&key).await };
    assert!(key.starts_with("tgk_acct-a_"), "{key}");
    assert_eq!(verify(key.clone()).await["valid"], true);
    let secret = key.strip_prefix("tgk_acct-a_").unwrap();
    for rerouted in [format!("tgk_acct-b_{secret}"), format!("tgk_nobody_{secret}"), format!("tgk_{secret}")] {
        assert_eq!(verify(rerouted).await, json!({"valid": false, "reason": "unknown_credential"}));
    }
}
