//! One walk through the whole API against a running server, the same on both
//! stores: accounts, credits, credentials, leases, usage, settlement,
//! reclaim, check, revocation and the error paths, with exact ledger checks.

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use tollgate_testkit::{outcomes, usage_event};

use crate::support::{ADMIN, Api, As, GATEWAY, PROCESS_WAIT_MAX, Server, assert_error};

/// The arguments the walk needs: a short grace and a fast reclaim interval,
/// so an abandoned lease is reclaimed within a second.
pub(crate) const SERVE_ARGS: [&str; 6] =
    ["--max-ttl", "PT1H", "--reclaim-grace", "PT0.1S", "--reclaim-interval", "PT0.05S"];

const ACCOUNT: &str = "acct-e2e";

/// What the walk needs to know about the store behind the server.
pub(crate) struct Backend {
    pub name: &'static str,
    /// The largest units one event may carry on this store.
    pub units_max: u64,
}

fn event(request_id: &str, credential_id: &str, units: u64, lease: Option<(&str, u64)>) -> Value {
    usage_event(ACCOUNT, "2024-01-01T00:00:00.5+01:00", request_id, credential_id, units, lease)
}

fn ts(value: &Value) -> Timestamp {
    value.as_str().expect("a timestamp string").parse().expect("an RFC 3339 timestamp")
}

pub(crate) async fn walk(server: &Server, backend: Backend) {
    let s = server;
    let account_path = format!("/v1/accounts/{ACCOUNT}");

    // Accounts.
    let created =
        s.ok(As::Admin, Method::POST, "/v1/accounts", Some(json!({"account_id": ACCOUNT})), StatusCode::CREATED).await;
    assert_eq!(created["credited"], 0);
    assert_eq!(created["next_fence"], 1);
    assert_error(
        s.call(As::Admin, Method::POST, "/v1/accounts", Some(json!({"account_id": ACCOUNT}))).await,
        StatusCode::CONFLICT,
        "account_exists",
        false,
    );

    // Credits: created, replayed, conflicting.
    let credits = format!("{account_path}/credits");
    let credit = json!({"credit_id": "invoice-1", "units": 1000});
    let first = s.ok(As::Admin, Method::POST, &credits, Some(credit.clone()), StatusCode::CREATED).await;
    assert_eq!((first["credited"].as_u64(), first["available"].as_u64()), (Some(1000), Some(1000)));
    let replay = s.ok(As::Admin, Method::POST, &credits, Some(credit), StatusCode::OK).await;
    assert_eq!(replay, first);
    assert_error(s.credit(ACCOUNT, "invoice-1", 999).await, StatusCode::CONFLICT, "credit_conflict", false);

    // A credential, verified.
    let issued = s.issue_credential(ACCOUNT, "e2e").await;
    let credential_id = issued["credential_id"].as_str().unwrap().to_owned();
    let key = issued["key"].as_str().unwrap().to_owned();
    let verified = s.verify(&key).await;
    assert_eq!(verified, json!({"valid": true, "credential_id": credential_id, "account_id": ACCOUNT}));

    // Acquire: the expiry is the server's now plus the exact TTL, and reading
    // the lease back gives the same instant to the nanosecond.
    let leases = format!("{account_path}/leases");
    let ttl = SignedDuration::new(600, 1);
    let before = Timestamp::now();
    let a = s.acquire(ACCOUNT, 100, "PT10M0.000000001S").await;
    let after = Timestamp::now();
    let expires_at = ts(&a["expires_at"]);
    assert!(
        before + ttl <= expires_at && expires_at <= after + ttl,
        "{before} + {ttl} <= {expires_at} <= {after} + {ttl}"
    );
    assert_eq!((a["fencing_token"].as_u64(), a["granted"].as_u64()), (Some(1), Some(100)));
    let a_id = a["lease_id"].as_str().unwrap().to_owned();
    let read =
        s.ok(As::Gateway, Method::GET, &format!("/v1/accounts/{ACCOUNT}/leases/{a_id}"), None, StatusCode::OK).await;
    assert_eq!(read["expires_at"], a["expires_at"]);
    assert_eq!(ts(&read["expires_at"]), expires_at);
    assert!(read.get("capability").is_none());
    let b = s.acquire(ACCOUNT, 50, "PT10M").await;
    let b_id = b["lease_id"].as_str().unwrap().to_owned();

    // A mixed batch: each outcome class.
    let batch = json!({"events": [
        event("u1", &credential_id, 30, Some((&a_id, 1))),
        event("u2", &credential_id, 4, None),
        event("u1", &credential_id, 30, Some((&a_id, 1))),
        event("u3", &credential_id, 1, Some((&a_id, 2))),
        event("u4", "cred_unknown", 1, None),
    ]});
    let answered = s.report_usage(batch).await;
    assert_eq!(
        answered,
        outcomes(&[
            ("u1", "accepted"),
            ("u2", "accepted"),
            ("u1", "duplicate"),
            ("u3", "rejected:fence_mismatch"),
            ("u4", "rejected:unknown_credential")
        ])
    );

    // Release A: 30 used, 70 returned.
    let released = s
        .ok(
            As::Gateway,
            Method::POST,
            &format!("/v1/accounts/{ACCOUNT}/leases/{a_id}/release"),
            Some(json!({"capability": a["capability"]})),
            StatusCode::OK,
        )
        .await;
    assert_eq!(
        (released["charged"].as_u64(), released["returned"].as_u64(), released["excess"].as_u64()),
        (Some(30), Some(70), Some(0))
    );
    assert_eq!(released["lease"]["state"], "released");

    // Consolidate B with 10 extra units into C.
    let merged = s
        .ok(
            As::Gateway,
            Method::POST,
            &format!("{leases}/consolidate"),
            Some(json!({"leases": [{"lease_id": b_id, "capability": b["capability"]}], "extra_units": 10, "ttl": "PT10M"})),
            StatusCode::CREATED,
        )
        .await;
    assert_eq!((merged["lease"]["granted"].as_u64(), merged["lease"]["fencing_token"].as_u64()), (Some(60), Some(3)));
    assert_eq!(
        merged["settlements"],
        json!([{"lease_id": b_id, "account_id": ACCOUNT, "charged": 0, "returned": 50, "excess": 0}])
    );
    assert!(merged["lease"]["capability"].as_str().is_some());

    // An abandoned lease is reclaimed by the worker once expiry + grace passed.
    let d = s.acquire(ACCOUNT, 20, "PT0.2S").await;
    let d_path = format!("/v1/accounts/{ACCOUNT}/leases/{}", d["lease_id"].as_str().unwrap());
    let deadline = tokio::time::Instant::now() + PROCESS_WAIT_MAX;
    loop {
        let lease = s.ok(As::Gateway, Method::GET, &d_path, None, StatusCode::OK).await;
        if lease["state"] == "reclaimed" {
            break;
        }
        assert_eq!(lease["state"], "active");
        assert!(tokio::time::Instant::now() < deadline, "lease {d_path} was not reclaimed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pass = s.reclaim().await;
    assert_eq!(pass, json!({"reclaimed": [], "full": false}));

    // The exact ledger after all of that.
    let account = json!({"account_id": ACCOUNT, "credited": 1000, "available": 910, "reserved": 60, "consumed": 30,
                         "overage": 4, "billed": 34, "next_fence": 5, "active_leases": 1});
    let check = s.assert_ledger(ACCOUNT, account.clone()).await;
    assert_eq!(check["storage"]["backend"], backend.name);
    if backend.name == "postgres" {
        assert_eq!(check["storage"]["migrations"]["current"], true, "{check}");
    }
    assert_eq!(check["ledger"]["violations"], json!([]));
    assert_eq!(check["guard_violations"], json!([]));
    let bounds = check["ledger"]["legacy_bounds"].as_array().unwrap();
    assert!(bounds.iter().all(|b| b["expiry_is_upper_bound"] == false), "{check}");
    let count =
        |state: &str| bounds.iter().filter(|b| b["state"] == state).map(|b| b["count"].as_u64().unwrap()).sum::<u64>();
    assert_eq!([count("active"), count("released"), count("consolidated"), count("reclaimed")], [1, 1, 1, 1]);

    // Revocation.
    s.revoke_credential(ACCOUNT, &credential_id).await;
    let revoked = s.verify(&key).await;
    assert_eq!(revoked["reason"], "credential_revoked");
    let credential = s.credential(ACCOUNT, &credential_id).await;
    assert_eq!(credential["activity"]["accepted_events"], 2);
    assert_eq!(credential["activity"]["accepted_units"], 34);
    assert_eq!(ts(&credential["activity"]["last_used_at"]), "2023-12-31T23:00:00.5Z".parse::<Timestamp>().unwrap());
    assert!(credential["revoked_at"].is_string());

    // The error paths, each with its status and stable code.
    let raw = |token: Option<&'static str>, method: Method, path: String, body: &str| {
        let body = body.as_bytes().to_vec();
        async move { s.send(token, method, &path, body).await }
    };
    assert_error(
        raw(Some(ADMIN), Method::POST, "/v1/accounts".into(), "{nope").await,
        StatusCode::BAD_REQUEST,
        "invalid_json",
        false,
    );
    assert_error(
        raw(None, Method::GET, account_path.clone(), "").await,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        false,
    );
    assert_error(
        raw(Some("wrong-token-0123456789"), Method::GET, account_path.clone(), "").await,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        false,
    );
    assert_error(
        raw(Some(GATEWAY), Method::GET, "/v1/admin/check".into(), "").await,
        StatusCode::FORBIDDEN,
        "forbidden",
        false,
    );
    assert_error(
        s.call(As::Gateway, Method::GET, &format!("/v1/accounts/{ACCOUNT}/leases/lse_missing"), None).await,
        StatusCode::NOT_FOUND,
        "lease_not_found",
        false,
    );
    assert_error(
        s.call(As::Admin, Method::GET, "/v1/no/such/route", None).await,
        StatusCode::NOT_FOUND,
        "not_found",
        false,
    );
    assert_error(
        s.call(As::Gateway, Method::POST, &leases, Some(json!({"units": 5000, "ttl": "PT1M"}))).await,
        StatusCode::CONFLICT,
        "insufficient_balance",
        false,
    );
    let too_many: Vec<Value> = (0..10_001).map(|i| event(&format!("bulk-{i}"), &credential_id, 0, None)).collect();
    assert_error(
        s.call(As::Gateway, Method::POST, "/v1/usage", Some(json!({"events": too_many}))).await,
        StatusCode::PAYLOAD_TOO_LARGE,
        "batch_too_large",
        false,
    );
    // Two events the store can each hold whose sum overflows `billed`: the
    // batch is refused whole and nothing changes.
    let overflow = json!({"events": [
        event("big-1", &credential_id, backend.units_max, None),
        event("big-2", &credential_id, backend.units_max, None),
    ]});
    assert_error(
        s.call(As::Gateway, Method::POST, "/v1/usage", Some(overflow)).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "batch_refused",
        false,
    );
    let unchanged = s.account(ACCOUNT).await;
    assert_eq!(unchanged, account);

    let metrics = s.call(As::Nobody, Method::GET, "/metrics", None).await;
    let text = metrics.1.as_str().expect("metrics are text").to_owned();
    for line in [
        r#"tollgate_leases_total{event="reclaimed"} 1"#,
        r#"tollgate_leases_total{event="released"} 1"#,
        r#"tollgate_usage_events_total{outcome="duplicate",reason=""} 1"#,
        r#"tollgate_usage_batches_total{result="batch_refused"} 1"#,
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
    }
    for secret in [ADMIN, GATEWAY, key.as_str(), a["capability"].as_str().unwrap()] {
        assert!(!text.contains(secret));
    }
    assert_eq!(s.call(As::Nobody, Method::GET, "/readyz", None).await.0, StatusCode::OK);
}
