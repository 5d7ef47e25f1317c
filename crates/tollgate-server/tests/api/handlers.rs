//! Every route through `router()`: each status and error code, and both roles.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::http::{Method, StatusCode};
use jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};
use tollgate_core::{
    AlertRule, Credential, CreditEntry, Error, EventOutcome, GrantPolicy, IngestError, Lease, Page, PageRequest,
    UnitDomain, UsageEvent,
};
use tollgate_server::Limits;
use tollgate_store::{
    AccountView, Acquisition, CheckReport, ClaimedDelivery, Consolidated, Consolidation, Credit, CreditReceipt,
    Delivery, DeliveryClaim, FinishedAttempt, Idempotency, IssuedCredential, IssuedLease, JournalPage, LeaseListing,
    NewAlertRule, NewCredential, NewEndpoint, Outbox, OutboxCounts, ReclaimReport, Released, Revocation,
    SecretRotation, StorageStatus, Store, UsageSink, Verification, WebhookEndpoint,
};
use tollgate_testkit::{outcomes, usage_event};

use crate::support::{Api, App, As, assert_error, start};

const ACCOUNT: &str = "acct-1";

/// A request and the error it must get: who, method, path, body, status, code.
type ErrorCase = (As, Method, String, Option<Value>, StatusCode, &'static str);

/// A request to a faulty store and the error it must get.
type FaultCase<'a> = (&'a App, Method, &'static str, Option<Value>, StatusCode, &'static str);

fn event(request_id: &str, credential_id: &str, units: u64, lease: Option<(&str, u64)>) -> Value {
    usage_event(ACCOUNT, "2024-01-01T00:00:00Z", request_id, credential_id, units, lease)
}

/// Each documented operation's role, read from the served document: one with
/// no `security` is public, one whose `x-tollgate-role` is `admin` is for the
/// admin only, and one whose role is `gateway` takes either operator token. Path parameters name things that do not
/// exist: auth is decided before the store is asked.
pub(crate) fn documented_routes() -> Vec<(Method, String, Option<bool>)> {
    let document: Value = serde_json::from_str(tollgate_server::openapi::document()).unwrap();
    let mut routes = vec![];
    for (template, item) in document["paths"].as_object().unwrap() {
        let path = concrete_path(template);
        for (method, operation) in item.as_object().unwrap() {
            let method = Method::from_bytes(method.to_ascii_uppercase().as_bytes()).unwrap();
            let role = operation[tollgate_server::openapi::ROLE_EXTENSION].as_str();
            assert_eq!(operation["security"].is_array(), role.is_some(), "{template}: a secured route names its role");
            let admin_only = role.map(|role| role == "admin");
            routes.push((method, path.clone(), admin_only));
        }
    }
    routes
}

/// A documented path template with each parameter named `x`, something that
/// does not exist.
pub(crate) fn concrete_path(template: &str) -> String {
    template
        .split('/')
        .map(|segment| if segment.starts_with('{') { "x" } else { segment })
        .collect::<Vec<_>>()
        .join("/")
}

#[tokio::test]
async fn every_route_enforces_its_role() {
    let app = App::new();
    let routes = documented_routes();
    assert_eq!(routes.iter().filter(|(_, _, role)| role.is_some()).count(), 30, "{routes:?}");
    for (method, path, admin_only) in routes {
        let Some(admin_only) = admin_only else {
            let (status, _) = app.call(As::Nobody, method.clone(), &path, None).await;
            assert_eq!(status, StatusCode::OK, "{method} {path}");
            continue;
        };
        for who in [As::Nobody, As::Stranger] {
            assert_error(
                app.call(who, method.clone(), &path, None).await,
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                false,
            );
        }
        let (status, body) = app.call(As::Gateway, method.clone(), &path, None).await;
        if admin_only {
            assert_error((status, body), StatusCode::FORBIDDEN, "forbidden", false);
        } else {
            assert!(
                status != StatusCode::UNAUTHORIZED && status != StatusCode::FORBIDDEN,
                "{method} {path}: {status} {body}"
            );
        }
        let (status, body) = app.call(As::Admin, method.clone(), &path, None).await;
        assert!(
            status != StatusCode::UNAUTHORIZED && status != StatusCode::FORBIDDEN,
            "{method} {path}: {status} {body}"
        );
    }
    // Another scheme, or the token without a scheme, is no token.
    for header in [format!("Basic {}", crate::support::ADMIN), crate::support::ADMIN.to_owned(), "Bearer".to_owned()] {
        let request = axum::http::Request::builder()
            .method(Method::GET)
            .uri("/v1/admin/check")
            .header("authorization", header)
            .body(axum::body::Body::empty())
            .unwrap();
        let response = tower::ServiceExt::oneshot(app.router.clone(), request).await.unwrap();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    }
}

#[tokio::test]
async fn accounts_credits_and_credentials() {
    let app = App::new();
    let created = app
        .ok(As::Admin, Method::POST, "/v1/accounts", Some(json!({"account_id": ACCOUNT})), StatusCode::CREATED)
        .await;
    assert_eq!(
        created,
        json!({"account_id": ACCOUNT, "credited": 0, "available": 0, "reserved": 0, "consumed": 0,
               "overage": 0, "billed": 0, "next_fence": 1, "active_leases": 0})
    );
    let cases: [ErrorCase; 7] = [
        (
            As::Admin,
            Method::POST,
            "/v1/accounts".into(),
            Some(json!({"account_id": ACCOUNT})),
            StatusCode::CONFLICT,
            "account_exists",
        ),
        (
            As::Admin,
            Method::POST,
            "/v1/accounts".into(),
            Some(json!({"account_id": "a b"})),
            StatusCode::BAD_REQUEST,
            "invalid_id",
        ),
        (As::Gateway, Method::GET, "/v1/accounts/nope".into(), None, StatusCode::NOT_FOUND, "account_not_found"),
        (
            As::Admin,
            Method::POST,
            format!("/v1/accounts/{ACCOUNT}/credits"),
            Some(json!({"credit_id": "c0", "units": 0})),
            StatusCode::BAD_REQUEST,
            "invalid_units",
        ),
        (
            As::Admin,
            Method::POST,
            "/v1/accounts/nope/credits".into(),
            Some(json!({"credit_id": "c0", "units": 1})),
            StatusCode::NOT_FOUND,
            "account_not_found",
        ),
        (
            As::Admin,
            Method::POST,
            "/v1/accounts/nope/credentials".into(),
            Some(json!({"label": "x"})),
            StatusCode::NOT_FOUND,
            "account_not_found",
        ),
        (
            As::Admin,
            Method::GET,
            format!("/v1/accounts/{ACCOUNT}/credentials/nope"),
            None,
            StatusCode::NOT_FOUND,
            "credential_not_found",
        ),
    ];
    for (who, method, path, body, status, code) in cases {
        assert_error(app.call(who, method, &path, body).await, status, code, false);
    }

    let credits = format!("/v1/accounts/{ACCOUNT}/credits");
    let first = app
        .ok(As::Admin, Method::POST, &credits, Some(json!({"credit_id": "c1", "units": u64::MAX})), StatusCode::CREATED)
        .await;
    assert_eq!((first["credited"].as_u64(), first["available"].as_u64()), (Some(u64::MAX), Some(u64::MAX)));
    let replay = app
        .ok(As::Admin, Method::POST, &credits, Some(json!({"credit_id": "c1", "units": u64::MAX})), StatusCode::OK)
        .await;
    assert_eq!(replay, first);
    assert_error(app.credit(ACCOUNT, "c1", 5).await, StatusCode::CONFLICT, "credit_conflict", false);
    assert_error(app.credit(ACCOUNT, "c2", 1).await, StatusCode::CONFLICT, "counter_overflow", false);

    let issued = app.issue_credential(ACCOUNT, "ci").await;
    let credential_id = issued["credential_id"].as_str().unwrap();
    let key = issued["key"].as_str().unwrap();
    assert_eq!(issued["account_id"], ACCOUNT);
    assert_eq!(issued["label"], "ci");
    assert_eq!(issued["created_at"], "2024-01-01T00:00:00.000000001Z");
    assert_eq!(issued["revoked_at"], Value::Null);
    assert_eq!(issued["activity"], json!({"last_used_at": null, "accepted_events": 0, "accepted_units": 0}));

    let read = app.credential(ACCOUNT, credential_id).await;
    assert!(read.get("key").is_none(), "the key is shown once: {read}");
    assert_eq!(read["credential_id"], credential_id);

    let valid = app.verify(key).await;
    assert_eq!(valid, json!({"valid": true, "credential_id": credential_id, "account_id": ACCOUNT}));
    let unknown = app.verify("tgk_nope").await;
    assert_eq!(unknown, json!({"valid": false, "reason": "unknown_credential"}));

    app.clock.set(start() + SignedDuration::from_secs(1));
    let revoked = app.revoke_credential(ACCOUNT, credential_id).await;
    assert_eq!(revoked["revoked_at"], "2024-01-01T00:00:01.000000001Z");
    let after = app.verify(key).await;
    assert_eq!(
        after,
        json!({"valid": false, "credential_id": credential_id, "account_id": ACCOUNT, "reason": "credential_revoked"})
    );
    assert_error(
        app.call(As::Admin, Method::POST, &format!("/v1/accounts/{ACCOUNT}/credentials/nope/revoke"), None).await,
        StatusCode::NOT_FOUND,
        "credential_not_found",
        false,
    );
}

#[tokio::test]
async fn leases_usage_settlement_and_reclaim() {
    let app = App::new();
    let (credential_id, _key) = app.funded(ACCOUNT, 100).await;

    // The expiry is exactly now + ttl, to the nanosecond.
    let a = app.acquire(ACCOUNT, 10, "PT0.000000001S").await;
    assert_eq!(a["expires_at"], "2024-01-01T00:00:00.000000002Z");
    assert_eq!((a["fencing_token"].as_u64(), a["granted"].as_u64(), a["used"].as_u64()), (Some(1), Some(10), Some(0)));
    assert_eq!((a["state"].as_str(), a["expiry_is_upper_bound"].as_bool()), (Some("active"), Some(false)));
    assert!(a["capability"].as_str().is_some_and(|c| !c.is_empty()));
    // A TTL beyond max_ttl (one hour) is clamped to it, not refused.
    let b = app.acquire(ACCOUNT, 20, "PT2H").await;
    assert_eq!(b["expires_at"], "2024-01-01T01:00:00.000000001Z");
    let c = app.acquire(ACCOUNT, 5, "PT30S").await;
    let (a_id, b_id, c_id) =
        (a["lease_id"].as_str().unwrap(), b["lease_id"].as_str().unwrap(), c["lease_id"].as_str().unwrap());

    let read =
        app.ok(As::Gateway, Method::GET, &format!("/v1/accounts/{ACCOUNT}/leases/{b_id}"), None, StatusCode::OK).await;
    assert!(read.get("capability").is_none(), "the capability is shown once: {read}");
    assert_eq!(read["expires_at"], b["expires_at"]);

    let refusals: [(&str, Value, StatusCode, &str); 5] = [
        ("acct-1", json!({"units": 1000, "ttl": "PT1S"}), StatusCode::CONFLICT, "insufficient_balance"),
        ("acct-1", json!({"units": 1, "ttl": "PT0S"}), StatusCode::BAD_REQUEST, "invalid_ttl"),
        ("acct-1", json!({"units": 1, "ttl": "-PT1S"}), StatusCode::BAD_REQUEST, "invalid_ttl"),
        ("acct-1", json!({"units": 0, "ttl": "PT1S"}), StatusCode::BAD_REQUEST, "invalid_units"),
        ("nope", json!({"units": 1, "ttl": "PT1S"}), StatusCode::NOT_FOUND, "account_not_found"),
    ];
    for (account, body, status, code) in refusals {
        assert_error(
            app.call(As::Gateway, Method::POST, &format!("/v1/accounts/{account}/leases"), Some(body)).await,
            status,
            code,
            false,
        );
    }

    // A mixed batch: each outcome class, in input order.
    let batch = json!({"events": [
        event("r1", &credential_id, 7, Some((b_id, 2))),
        event("r2", &credential_id, 3, None),
        event("r1", &credential_id, 99, None),
        event("r3", &credential_id, 1, Some((b_id, 9))),
        event("r4", "cred_nope", 1, None),
        json!({"request_id": "r5", "account_id": ACCOUNT, "credential_id": credential_id, "units": 1,
               "occurred_at": "2024-01-01T00:00:00Z", "lease_id": b_id}),
        event("r3", &credential_id, 1, Some((b_id, 2))),
    ]});
    let answered = app.report_usage(batch).await;
    assert_eq!(
        answered,
        outcomes(&[
            ("r1", "accepted"),
            ("r2", "accepted"),
            ("r1", "duplicate"),
            ("r3", "rejected:fence_mismatch"),
            ("r4", "rejected:unknown_credential"),
            ("r5", "rejected:funding_incomplete"),
            ("r3", "accepted")
        ])
    );

    // Release: the wrong capability is refused; the right one settles.
    let release = |id: &str| format!("/v1/accounts/{ACCOUNT}/leases/{id}/release");
    assert_error(
        app.call(As::Gateway, Method::POST, &release(b_id), Some(json!({"capability": "tgc_wrong"}))).await,
        StatusCode::CONFLICT,
        "capability_mismatch",
        false,
    );
    let settled = app
        .ok(As::Gateway, Method::POST, &release(b_id), Some(json!({"capability": b["capability"]})), StatusCode::OK)
        .await;
    assert_eq!(
        (settled["charged"].as_u64(), settled["returned"].as_u64(), settled["excess"].as_u64()),
        (Some(8), Some(12), Some(0))
    );
    assert_eq!((settled["lease"]["state"].as_str(), settled["lease"]["used"].as_u64()), (Some("released"), Some(8)));
    assert!(settled["lease"].get("capability").is_none());
    assert_error(
        app.call(As::Gateway, Method::POST, &release(b_id), Some(json!({"capability": b["capability"]}))).await,
        StatusCode::CONFLICT,
        "lease_not_active",
        false,
    );
    assert_error(
        app.call(As::Gateway, Method::POST, &release("lse_nope"), Some(json!({"capability": "x"}))).await,
        StatusCode::NOT_FOUND,
        "lease_not_found",
        false,
    );

    // Consolidate c and a fresh lease d into one, adding 2 units.
    let d = app.acquire(ACCOUNT, 4, "PT30S").await;
    let consolidate = format!("/v1/accounts/{ACCOUNT}/leases/consolidate");
    let merged = app
        .ok(
            As::Gateway,
            Method::POST,
            &consolidate,
            Some(json!({"leases": [{"lease_id": c_id, "capability": c["capability"]},
                                   {"lease_id": d["lease_id"], "capability": d["capability"]}],
                        "extra_units": 2, "ttl": "PT1M"})),
            StatusCode::CREATED,
        )
        .await;
    assert_eq!(merged["lease"]["granted"].as_u64(), Some(11));
    assert_eq!(merged["lease"]["fencing_token"].as_u64(), Some(5));
    assert_eq!(merged["lease"]["expires_at"], "2024-01-01T00:01:00.000000001Z");
    assert!(merged["lease"]["capability"].as_str().is_some());
    assert_eq!(merged["settlements"].as_array().map(Vec::len), Some(2));
    assert_eq!(merged["settlements"][0]["lease_id"], c_id);
    assert_eq!(merged["settlements"][0]["returned"].as_u64(), Some(5));
    let empty = json!({"leases": [], "extra_units": 1, "ttl": "PT1M"});
    assert_error(
        app.call(As::Gateway, Method::POST, &consolidate, Some(empty)).await,
        StatusCode::BAD_REQUEST,
        "no_source_leases",
        false,
    );

    // Lease a expired at start + 1 ns; with 10 s of grace it is still
    // releasable 10 s later minus a nanosecond, and due exactly at the boundary.
    let boundary = start() + SignedDuration::from_nanos(1) + SignedDuration::from_secs(10);
    app.clock.set(boundary);
    assert_error(
        app.call(As::Gateway, Method::POST, &release(a_id), Some(json!({"capability": a["capability"]}))).await,
        StatusCode::CONFLICT,
        "lease_expired",
        false,
    );
    let reclaimed = app.reclaim().await;
    assert_eq!(
        reclaimed,
        json!({"reclaimed": [{"lease_id": a_id, "account_id": ACCOUNT, "charged": 0, "returned": 10, "excess": 0}], "full": false})
    );
    let a_after =
        app.ok(As::Gateway, Method::GET, &format!("/v1/accounts/{ACCOUNT}/leases/{a_id}"), None, StatusCode::OK).await;
    assert_eq!(a_after["state"], "reclaimed");
    let again = app.reclaim().await;
    assert_eq!(again, json!({"reclaimed": [], "full": false}));

    let check = app
        .assert_ledger(
            ACCOUNT,
            json!({"account_id": ACCOUNT, "credited": 100, "available": 81, "reserved": 11, "consumed": 8,
               "overage": 3, "billed": 11, "next_fence": 6, "active_leases": 1}),
        )
        .await;
    assert_eq!(check["storage"], json!({"backend": "memory", "reachable": true, "migrations": null}));
    assert_eq!(check["ledger"]["accounts_checked"].as_u64(), Some(1));
    assert_eq!(check["ledger"]["violations"], json!([]));
    assert_eq!(check["guard_violations"], json!([]));
    assert_eq!(
        check["ledger"]["legacy_bounds"],
        json!([
            {"state": "active", "expiry_is_upper_bound": false, "count": 1},
            {"state": "released", "expiry_is_upper_bound": false, "count": 1},
            {"state": "reclaimed", "expiry_is_upper_bound": false, "count": 1},
            {"state": "consolidated", "expiry_is_upper_bound": false, "count": 2},
        ])
    );
}

#[tokio::test]
async fn usage_batch_bounds_and_refusal() {
    let app = App::new();
    let (credential_id, _) = app.funded(ACCOUNT, 1).await;
    let many = |count: usize| {
        let events: Vec<Value> = (0..count).map(|i| event(&format!("r{i}"), &credential_id, 0, None)).collect();
        json!({"events": events})
    };
    let full = app.report_usage(many(10_000)).await;
    assert_eq!(full["outcomes"].as_array().map(Vec::len), Some(10_000));
    assert_error(
        app.call(As::Gateway, Method::POST, "/v1/usage", Some(many(10_001))).await,
        StatusCode::PAYLOAD_TOO_LARGE,
        "batch_too_large",
        false,
    );

    // Each event fits u64; together they overflow `billed`: nothing applies.
    let overflow =
        json!({"events": [event("big-1", &credential_id, u64::MAX, None), event("big-2", &credential_id, 1, None)]});
    assert_error(
        app.call(As::Gateway, Method::POST, "/v1/usage", Some(overflow.clone())).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "batch_refused",
        false,
    );
    let account = app.account(ACCOUNT).await;
    assert_eq!(account["billed"].as_u64(), Some(0));
    let one = json!({"events": [event("big-1", &credential_id, u64::MAX, None)]});
    let accepted = app.report_usage(one).await;
    assert_eq!(accepted["outcomes"][0]["outcome"], "accepted");

    let metrics = app.call(As::Nobody, Method::GET, "/metrics", None).await.1;
    let text = metrics.as_str().unwrap();
    for line in [
        r#"tollgate_usage_events_total{outcome="accepted",reason=""} 10001"#,
        r#"tollgate_usage_batches_total{result="batch_refused"} 1"#,
        r#"tollgate_usage_batches_total{result="batch_too_large"} 1"#,
        r#"tollgate_http_requests_total{method="POST",route="/v1/usage",status="422"} 1"#,
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
    }
}

#[tokio::test]
async fn malformed_requests_get_the_stable_error_body() {
    let app = App::with_store(
        Arc::new(tollgate_store::MemoryStore::new(crate::support::policy())),
        Limits { body_bytes_max: 1024, ..Limits::default() },
    );
    let raw = |body: &str| body.as_bytes().to_vec();
    let cases: [(Method, &str, Vec<u8>, StatusCode, &str); 7] = [
        (Method::POST, "/v1/accounts", raw("{"), StatusCode::BAD_REQUEST, "invalid_json"),
        (Method::POST, "/v1/accounts", raw("not json"), StatusCode::BAD_REQUEST, "invalid_json"),
        (Method::POST, "/v1/accounts", raw(""), StatusCode::BAD_REQUEST, "invalid_json"),
        (Method::POST, "/v1/accounts", raw(r#"{"account":"x"}"#), StatusCode::BAD_REQUEST, "invalid_request"),
        (
            Method::POST,
            "/v1/accounts/a/leases",
            raw(r#"{"units":-1,"ttl":"PT1S"}"#),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            Method::POST,
            "/v1/accounts/a/leases",
            raw(r#"{"units":18446744073709551616,"ttl":"PT1S"}"#),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (Method::POST, "/v1/accounts", vec![b' '; 2048], StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
    ];
    for (method, path, body, status, code) in cases {
        assert_error(app.call_raw(As::Admin, method, path, body).await, status, code, false);
    }
    assert_error(
        app.call(As::Admin, Method::GET, "/v1/nothing/here", None).await,
        StatusCode::NOT_FOUND,
        "not_found",
        false,
    );
    assert_error(app.call(As::Nobody, Method::GET, "/", None).await, StatusCode::NOT_FOUND, "not_found", false);
    assert_error(
        app.call(As::Admin, Method::DELETE, "/v1/accounts", None).await,
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        false,
    );
    let metrics = app.call(As::Nobody, Method::GET, "/metrics", None).await.1;
    assert!(
        metrics
            .as_str()
            .unwrap()
            .contains(r#"tollgate_http_requests_total{method="GET",route="unmatched",status="404"} 2"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn health_readiness_and_metrics_hold_no_secrets() {
    let app = App::new();
    let (_, key) = app.funded(ACCOUNT, 10).await;
    let lease = app.acquire(ACCOUNT, 1, "PT1S").await;
    assert_eq!(app.call(As::Nobody, Method::GET, "/healthz", None).await, (StatusCode::OK, json!({"status": "ok"})));
    assert_eq!(
        app.call(As::Nobody, Method::GET, "/readyz", None).await,
        (
            StatusCode::OK,
            json!({"ready": true, "storage": {"backend": "memory", "reachable": true, "migrations": null}})
        )
    );
    let text = app.call(As::Nobody, Method::GET, "/metrics", None).await.1.as_str().unwrap().to_owned();
    for secret in [
        crate::support::ADMIN,
        crate::support::GATEWAY,
        key.as_str(),
        lease["capability"].as_str().unwrap(),
        lease["lease_id"].as_str().unwrap(),
        ACCOUNT,
    ] {
        assert!(!text.contains(secret), "metrics expose {secret}");
    }
    for line in [
        r#"tollgate_leases_total{event="acquired"} 1"#,
        r#"tollgate_http_requests_total{method="POST",route="/v1/accounts/{account_id}/leases",status="201"} 1"#,
        "tollgate_reclaim_lag_seconds 0.0",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
    }
}

/// A store whose every operation fails with one error, or never finishes.
struct FaultyStore {
    policy: GrantPolicy,
    fault: Fault,
}

#[derive(Clone)]
enum Fault {
    Fail(Error, IngestError),
    Hang,
    /// `account` announces itself and waits to be let through, then answers
    /// `account_not_found`; everything else is unavailable.
    Gate(Arc<Gate>),
}

#[derive(Default)]
struct Gate {
    entered: tokio::sync::Notify,
    release: tokio::sync::Notify,
}

impl FaultyStore {
    async fn fail<T>(&self) -> Result<T, Error> {
        match &self.fault {
            Fault::Fail(error, _) => Err(error.clone()),
            Fault::Hang => std::future::pending().await,
            Fault::Gate(_) => Err(Error::StorageUnavailable("gated".into())),
        }
    }
}

#[async_trait]
impl UsageSink for FaultyStore {
    async fn ingest(&self, _: Vec<UsageEvent>, _: Timestamp) -> Result<Vec<EventOutcome>, IngestError> {
        match &self.fault {
            Fault::Fail(_, error) => Err(error.clone()),
            Fault::Hang => std::future::pending().await,
            Fault::Gate(_) => Err(IngestError::Unavailable("gated".into())),
        }
    }
}

#[async_trait]
impl Store for FaultyStore {
    fn policy(&self) -> &GrantPolicy {
        &self.policy
    }
    fn unit_domain(&self) -> UnitDomain {
        UnitDomain::U64
    }
    async fn create_account(&self, _: &str) -> Result<AccountView, Error> {
        self.fail().await
    }
    async fn apply_credit(&self, _: Credit<'_>, _: Timestamp) -> Result<CreditReceipt, Error> {
        self.fail().await
    }
    async fn acquire_idempotent(
        &self,
        _: Option<&Idempotency>,
        _: Acquisition<'_>,
        _: Timestamp,
    ) -> Result<IssuedLease, Error> {
        self.fail().await
    }
    async fn release_idempotent(
        &self,
        _: Option<&Idempotency>,
        _: tollgate_store::Release<'_>,
        _: Timestamp,
    ) -> Result<Released, Error> {
        self.fail().await
    }
    async fn consolidate_idempotent(
        &self,
        _: Option<&Idempotency>,
        _: Consolidation<'_>,
        _: Timestamp,
    ) -> Result<Consolidated, Error> {
        self.fail().await
    }
    async fn reclaim(&self, _: Timestamp, _: u32) -> Result<ReclaimReport, Error> {
        self.fail().await
    }
    async fn lease_summary(&self, _: Timestamp) -> Result<tollgate_store::LeaseSummary, Error> {
        self.fail().await
    }
    async fn issue_credential_idempotent(
        &self,
        _: Option<&Idempotency>,
        _: NewCredential<'_>,
        _: Timestamp,
    ) -> Result<IssuedCredential, Error> {
        self.fail().await
    }
    async fn verify_credential(&self, _: &str) -> Result<Verification, Error> {
        self.fail().await
    }
    async fn revoke_credential_idempotent(
        &self,
        _: Option<&Idempotency>,
        _: Revocation<'_>,
        _: Timestamp,
    ) -> Result<Credential, Error> {
        self.fail().await
    }
    async fn purge_idempotency(&self, _: Timestamp, _: u32) -> Result<u32, Error> {
        self.fail().await
    }
    async fn account(&self, _: &str) -> Result<AccountView, Error> {
        if let Fault::Gate(gate) = &self.fault {
            gate.entered.notify_one();
            gate.release.notified().await;
            return Err(Error::AccountNotFound);
        }
        self.fail().await
    }
    async fn lease(&self, _: &str, _: &str) -> Result<Lease, Error> {
        self.fail().await
    }
    async fn credential(&self, _: &str, _: &str) -> Result<Credential, Error> {
        self.fail().await
    }
    async fn list_accounts(&self, _: &str, _: &PageRequest) -> Result<Page<AccountView>, Error> {
        self.fail().await
    }
    async fn list_leases(&self, _: LeaseListing<'_>) -> Result<Page<Lease>, Error> {
        self.fail().await
    }
    async fn list_credentials(&self, _: &str, _: &PageRequest) -> Result<Page<Credential>, Error> {
        self.fail().await
    }
    async fn list_credits(&self, _: &str, _: &PageRequest) -> Result<Page<CreditEntry>, Error> {
        self.fail().await
    }
    async fn usage(&self, _: &str, _: &tollgate_core::UsageQuery) -> Result<tollgate_core::UsageReport, Error> {
        self.fail().await
    }
    async fn usage_events(&self, _: &str, _: &tollgate_core::ExportQuery) -> Result<Page<UsageEvent>, Error> {
        self.fail().await
    }
    async fn journal(&self, _: &str, _: u64, _: tollgate_core::PageLimit) -> Result<JournalPage, Error> {
        self.fail().await
    }
    async fn check(&self) -> Result<CheckReport, Error> {
        self.fail().await
    }
    async fn status(&self) -> Result<StorageStatus, Error> {
        self.fail().await
    }
    async fn pin_reclaim_grace(&self, _: bool) -> Result<(), Error> {
        self.fail().await
    }
}

#[async_trait]
impl Outbox for FaultyStore {
    async fn create_alert_rule(&self, _: NewAlertRule<'_>, _: Timestamp) -> Result<AlertRule, Error> {
        self.fail().await
    }
    async fn alert_rules(&self, _: &str) -> Result<Vec<AlertRule>, Error> {
        self.fail().await
    }
    async fn delete_alert_rule(&self, _: &str, _: &str) -> Result<(), Error> {
        self.fail().await
    }
    async fn create_endpoint(&self, _: NewEndpoint<'_>, _: Timestamp) -> Result<WebhookEndpoint, Error> {
        self.fail().await
    }
    async fn endpoints(&self) -> Result<Vec<WebhookEndpoint>, Error> {
        self.fail().await
    }
    async fn delete_endpoint(&self, _: &str) -> Result<(), Error> {
        self.fail().await
    }
    async fn rotate_endpoint_secret(&self, _: SecretRotation<'_>, _: Timestamp) -> Result<WebhookEndpoint, Error> {
        self.fail().await
    }
    async fn note_refusal(&self, _: &str, _: Timestamp) -> Result<u32, Error> {
        self.fail().await
    }
    async fn derive_events(&self, _: u32) -> Result<u32, Error> {
        self.fail().await
    }
    async fn claim_deliveries(&self, _: DeliveryClaim<'_>, _: Timestamp) -> Result<Vec<ClaimedDelivery>, Error> {
        self.fail().await
    }
    async fn finish_delivery(&self, _: FinishedAttempt<'_>, _: Timestamp) -> Result<bool, Error> {
        self.fail().await
    }
    async fn deliveries(&self, _: &str, _: &PageRequest) -> Result<Page<Delivery>, Error> {
        self.fail().await
    }
    async fn redeliver(&self, _: &str, _: &str, _: Timestamp) -> Result<Delivery, Error> {
        self.fail().await
    }
    async fn outbox_counts(&self) -> Result<OutboxCounts, Error> {
        self.fail().await
    }
}

fn faulty(fault: Fault, limits: Limits) -> App {
    App::with_store(Arc::new(FaultyStore { policy: crate::support::policy(), fault }), limits)
}

#[tokio::test]
async fn storage_failures_map_to_retryable_statuses() {
    let unavailable = faulty(
        Fault::Fail(Error::StorageUnavailable("connection refused".into()), IngestError::Unavailable("down".into())),
        Limits::default(),
    );
    let corrupt = faulty(
        Fault::Fail(Error::StorageCorrupt("negative fence".into()), IngestError::Corrupt("negative units".into())),
        Limits::default(),
    );
    let batch = json!({"events": [event("r1", "cred", 1, None)]});
    let cases: [FaultCase; 6] = [
        (&unavailable, Method::GET, "/v1/accounts/a", None, StatusCode::SERVICE_UNAVAILABLE, "storage_unavailable"),
        (
            &unavailable,
            Method::POST,
            "/v1/usage",
            Some(batch.clone()),
            StatusCode::SERVICE_UNAVAILABLE,
            "storage_unavailable",
        ),
        (&unavailable, Method::POST, "/v1/admin/reclaim", None, StatusCode::SERVICE_UNAVAILABLE, "storage_unavailable"),
        (&corrupt, Method::GET, "/v1/accounts/a/leases/l", None, StatusCode::INTERNAL_SERVER_ERROR, "storage_corrupt"),
        (&corrupt, Method::POST, "/v1/usage", Some(batch), StatusCode::INTERNAL_SERVER_ERROR, "storage_corrupt"),
        (&unavailable, Method::GET, "/readyz", None, StatusCode::SERVICE_UNAVAILABLE, "not_ready"),
    ];
    for (app, method, path, body, status, code) in cases {
        assert_error(app.call(As::Admin, method, path, body).await, status, code, true);
    }
    let check = unavailable.check().await;
    assert_eq!(check["ok"], false);
    assert_eq!(check["storage"]["reachable"], false);
    assert_eq!(check["ledger"], Value::Null);
    assert_eq!(check["guard_violations"], Value::Null);
}

#[tokio::test]
async fn a_request_that_outlives_its_timeout_gets_503() {
    let app = faulty(Fault::Hang, Limits { request_timeout: Duration::from_millis(20), ..Limits::default() });
    assert_error(
        app.call(As::Gateway, Method::GET, "/v1/accounts/a", None).await,
        StatusCode::SERVICE_UNAVAILABLE,
        "timeout",
        true,
    );
    assert_error(
        app.call(As::Gateway, Method::POST, "/v1/usage", Some(json!({"events": []}))).await,
        StatusCode::SERVICE_UNAVAILABLE,
        "timeout",
        true,
    );
}

/// Shutdown stops accepting connections but lets a request in flight finish:
/// the request is held inside the store while shutdown begins, and still gets
/// its answer.
#[tokio::test]
async fn shutdown_drains_requests_in_flight() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let gate = Arc::new(Gate::default());
    let store = Arc::new(FaultyStore { policy: crate::support::policy(), fault: Fault::Gate(gate.clone()) });
    let app = App::with_store(store, Limits::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let reclaim = tollgate_server::ReclaimConfig { interval: Duration::from_secs(3_600) };
    let server = tokio::spawn(tollgate_server::serve(listener, app.state.clone(), reclaim, async {
        let _ = stopped.await;
    }));

    let mut connection = tokio::net::TcpStream::connect(address).await.unwrap();
    let request = format!(
        "GET /v1/accounts/a HTTP/1.1\r\nhost: test\r\nauthorization: Bearer {}\r\nconnection: close\r\n\r\n",
        crate::support::GATEWAY
    );
    connection.write_all(request.as_bytes()).await.unwrap();
    gate.entered.notified().await;

    stop.send(()).unwrap();
    // Shutdown has begun; the server waits for the request it holds.
    tokio::task::yield_now().await;
    assert!(!server.is_finished());
    gate.release.notify_one();

    let mut response = String::new();
    connection.read_to_string(&mut response).await.unwrap();
    assert!(response.starts_with("HTTP/1.1 404"), "{response}");
    assert!(response.contains(r#""code":"account_not_found""#), "{response}");
    server.await.unwrap().unwrap();
    assert!(tokio::net::TcpStream::connect(address).await.is_err(), "no connections after shutdown");
}

/// Every answer carries an `x-request-id`: the client's own when it sent one,
/// else a fresh one, different for each request.
#[tokio::test]
async fn every_answer_carries_a_request_id() {
    let app = App::new();
    let send = |id: Option<&str>, path: &str| {
        let mut request = axum::http::Request::builder().method(Method::GET).uri(path);
        if let Some(id) = id {
            request = request.header("x-request-id", id);
        }
        tower::ServiceExt::oneshot(app.router.clone(), request.body(axum::body::Body::empty()).unwrap())
    };
    let id_of = |response: &axum::http::Response<axum::body::Body>| {
        response.headers().get("x-request-id").map(|id| id.to_str().unwrap().to_owned())
    };
    let echoed = send(Some("client-chosen-id"), "/healthz").await.unwrap();
    assert_eq!(id_of(&echoed).as_deref(), Some("client-chosen-id"));
    let first = id_of(&send(None, "/healthz").await.unwrap()).unwrap();
    let refused = send(None, "/v1/accounts/a").await.unwrap();
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    let second = id_of(&refused).unwrap();
    let unrouted = id_of(&send(None, "/nowhere").await.unwrap()).unwrap();
    assert!(first != second && second != unrouted && !first.is_empty(), "{first} {second} {unrouted}");
}
