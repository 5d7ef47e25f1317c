//! One request vocabulary for the suites that drive Tollgate's HTTP API, so
//! that the handler tests (through the router, in process) and the end-to-end
//! tests (the real binary, over a socket) say a step the same way: an [`Api`]
//! only says how one request travels, and the steps are written once here.

use std::future::Future;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

/// Who sends a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum As {
    Admin,
    Gateway,
    /// No `Authorization` header at all.
    Nobody,
    /// A bearer token that is no operator's.
    Stranger,
}

/// The token a stranger presents: well formed, but no operator's.
pub const STRANGER_TOKEN: &str = "not-an-operator-token-at-all";

/// A Tollgate API under test. An implementation says how one request travels
/// and which token each sender presents; the steps are shared.
pub trait Api: Sync {
    /// The admin's operator token this API was started with.
    const ADMIN_TOKEN: &'static str;
    /// The gateway's operator token this API was started with.
    const GATEWAY_TOKEN: &'static str;

    /// The bearer token `who` presents; `None` sends no `Authorization` header.
    fn token(&self, who: As) -> Option<&'static str> {
        match who {
            As::Admin => Some(Self::ADMIN_TOKEN),
            As::Gateway => Some(Self::GATEWAY_TOKEN),
            As::Nobody => None,
            As::Stranger => Some(STRANGER_TOKEN),
        }
    }

    /// Sends `body` as it is with an optional bearer token; returns the status
    /// and the body as [`crate::body_value`] reads it.
    fn send(
        &self,
        token: Option<&str>,
        method: Method,
        path: &str,
        body: Vec<u8>,
    ) -> impl Future<Output = (StatusCode, Value)> + Send;

    /// Sends one request as `who`, `body` as JSON.
    fn call(
        &self,
        who: As,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> impl Future<Output = (StatusCode, Value)> + Send {
        async move {
            let bytes = body.map(|b| serde_json::to_vec(&b).expect("JSON")).unwrap_or_default();
            self.send(self.token(who), method, path, bytes).await
        }
    }

    /// A request expected to answer `expected`; returns the body.
    fn ok(
        &self,
        who: As,
        method: Method,
        path: &str,
        body: Option<Value>,
        expected: StatusCode,
    ) -> impl Future<Output = Value> + Send {
        async move {
            let (status, value) = self.call(who, method.clone(), path, body).await;
            assert_eq!(status, expected, "{method} {path}: {value}");
            value
        }
    }

    /// The admin creates `account_id` and credits it `units` (credit `c1`).
    fn open_account(&self, account_id: &str, units: u64) -> impl Future<Output = ()> + Send {
        async move {
            let account = Some(json!({"account_id": account_id}));
            self.ok(As::Admin, Method::POST, "/v1/accounts", account, StatusCode::CREATED).await;
            let (status, credited) = self.credit(account_id, "c1", units).await;
            assert_eq!(status, StatusCode::CREATED, "{credited}");
        }
    }

    /// As [`Api::open_account`], with one credential for it; returns the
    /// credential's id and key.
    fn funded(&self, account_id: &str, units: u64) -> impl Future<Output = (String, String)> + Send {
        async move {
            self.open_account(account_id, units).await;
            let credential = self.issue_credential(account_id, "test").await;
            let text = |field: &str| credential[field].as_str().expect("a credential field").to_owned();
            (text("credential_id"), text("key"))
        }
    }

    /// The admin credits `units` to `account_id` under `credit_id`; the answer
    /// as it comes, for a case that expects a refusal.
    fn credit(
        &self,
        account_id: &str,
        credit_id: &str,
        units: u64,
    ) -> impl Future<Output = (StatusCode, Value)> + Send {
        let path = format!("/v1/accounts/{account_id}/credits");
        async move { self.call(As::Admin, Method::POST, &path, Some(json!({"credit_id": credit_id, "units": units}))).await }
    }

    /// The gateway acquires a lease of `units` for `ttl` (an ISO 8601
    /// duration); the body is the lease with its capability.
    fn acquire(&self, account_id: &str, units: u64, ttl: &str) -> impl Future<Output = Value> + Send {
        let path = format!("/v1/accounts/{account_id}/leases");
        let body = json!({"units": units, "ttl": ttl});
        async move { self.ok(As::Gateway, Method::POST, &path, Some(body), StatusCode::CREATED).await }
    }

    /// The admin issues a credential labelled `label`; the body shows its key.
    fn issue_credential(&self, account_id: &str, label: &str) -> impl Future<Output = Value> + Send {
        let path = format!("/v1/accounts/{account_id}/credentials");
        async move { self.ok(As::Admin, Method::POST, &path, Some(json!({"label": label})), StatusCode::CREATED).await }
    }

    /// The admin reads a credential back.
    fn credential(&self, account_id: &str, credential_id: &str) -> impl Future<Output = Value> + Send {
        let path = format!("/v1/accounts/{account_id}/credentials/{credential_id}");
        async move { self.ok(As::Admin, Method::GET, &path, None, StatusCode::OK).await }
    }

    /// The admin revokes a credential.
    fn revoke_credential(&self, account_id: &str, credential_id: &str) -> impl Future<Output = Value> + Send {
        let path = format!("/v1/accounts/{account_id}/credentials/{credential_id}/revoke");
        async move { self.ok(As::Admin, Method::POST, &path, None, StatusCode::OK).await }
    }

    /// The gateway asks whether `key` is a valid credential key.
    fn verify(&self, key: &str) -> impl Future<Output = Value> + Send {
        let body = json!({"key": key});
        async move { self.ok(As::Gateway, Method::POST, "/v1/credentials/verify", Some(body), StatusCode::OK).await }
    }

    /// The gateway reports a usage batch (`{"events": [...]}`); returns the
    /// outcomes.
    fn report_usage(&self, batch: Value) -> impl Future<Output = Value> + Send {
        async move { self.ok(As::Gateway, Method::POST, "/v1/usage", Some(batch), StatusCode::OK).await }
    }

    /// The admin runs one reclaim pass.
    fn reclaim(&self) -> impl Future<Output = Value> + Send {
        async move { self.ok(As::Admin, Method::POST, "/v1/admin/reclaim", None, StatusCode::OK).await }
    }

    /// The gateway reads an account's counters.
    fn account(&self, account_id: &str) -> impl Future<Output = Value> + Send {
        let path = format!("/v1/accounts/{account_id}");
        async move { self.ok(As::Gateway, Method::GET, &path, None, StatusCode::OK).await }
    }

    /// The admin runs the consistency check.
    fn check(&self) -> impl Future<Output = Value> + Send {
        async move { self.ok(As::Admin, Method::GET, "/v1/admin/check", None, StatusCode::OK).await }
    }

    /// Asserts the exact ledger of `account_id` (its whole account body) and
    /// that the consistency check passes; returns the check's report.
    fn assert_ledger(&self, account_id: &str, expected: Value) -> impl Future<Output = Value> + Send {
        async move {
            assert_eq!(self.account(account_id).await, expected);
            let check = self.check().await;
            assert_eq!(check["ok"], true, "{check}");
            check
        }
    }
}

/// The answer to a usage batch, from each event's request id and outcome in
/// batch order: `accepted`, `duplicate`, or `rejected:<reason>`.
pub fn outcomes(expected: &[(&str, &str)]) -> Value {
    let outcome = |&(request_id, outcome): &(&str, &str)| match outcome.split_once(':') {
        Some((rejected, reason)) => json!({"request_id": request_id, "outcome": rejected, "reason": reason}),
        None => json!({"request_id": request_id, "outcome": outcome}),
    };
    json!({"outcomes": expected.iter().map(outcome).collect::<Vec<_>>()})
}

/// A usage event as the gateway reports it, funded by `lease` (`(lease_id,
/// fencing_token)`) or, without one, overage.
pub fn usage_event(
    account_id: &str,
    occurred_at: &str,
    request_id: &str,
    credential_id: &str,
    units: u64,
    lease: Option<(&str, u64)>,
) -> Value {
    let mut event = json!({
        "request_id": request_id,
        "account_id": account_id,
        "credential_id": credential_id,
        "units": units,
        "occurred_at": occurred_at,
    });
    if let Some((lease_id, fence)) = lease {
        event["lease_id"] = json!(lease_id);
        event["fencing_token"] = json!(fence);
    }
    event
}
