//! One helper for the handler tests: a router over a `MemoryStore` and a
//! settable clock, and a `call` that sends one request through it.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use jiff::{SignedDuration, Timestamp};
use serde_json::Value;
use tollgate_core::{GrantPolicy, Secret};
use tollgate_server::{AppState, Limits, ManualClock, OperatorTokens, router};
use tollgate_store::{MemoryStore, Store};
pub(crate) use tollgate_testkit::assert_error;
use tollgate_testkit::body_value;
use tower::ServiceExt;

pub(crate) const ADMIN: &str = "admin-token-for-handler-tests";
pub(crate) const GATEWAY: &str = "gateway-token-for-handler-tests";

/// 2024-01-01T00:00:00.000000001Z: a start with a nonzero nanosecond, so that
/// any rounding would show.
pub(crate) fn start() -> Timestamp {
    "2024-01-01T00:00:00.000000001Z".parse().unwrap()
}

pub(crate) fn policy() -> GrantPolicy {
    GrantPolicy::new(SignedDuration::from_secs(3_600), SignedDuration::from_secs(10), 100).unwrap()
}

pub(crate) struct App {
    pub router: Router,
    pub clock: Arc<ManualClock>,
    pub state: AppState,
}

/// Who sends a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum As {
    Admin,
    Gateway,
    Nobody,
    Stranger,
}

impl As {
    fn header(self) -> Option<String> {
        match self {
            As::Admin => Some(format!("Bearer {ADMIN}")),
            As::Gateway => Some(format!("Bearer {GATEWAY}")),
            As::Nobody => None,
            As::Stranger => Some("Bearer not-an-operator-token-at-all".to_owned()),
        }
    }
}

impl App {
    pub(crate) fn new() -> App {
        App::with_store(Arc::new(MemoryStore::new(policy())), Limits::default())
    }

    pub(crate) fn with_store(store: Arc<dyn Store>, limits: Limits) -> App {
        let clock = Arc::new(ManualClock::new(start()));
        let tokens = OperatorTokens::new(&Secret::new(ADMIN.into()), Some(&Secret::new(GATEWAY.into()))).unwrap();
        let state = AppState::with_limits(store, clock.clone(), tokens, limits);
        App { router: router(state.clone()), clock, state }
    }

    /// Sends one request and returns its status and JSON body (`Null` when the
    /// body is empty, a JSON string when it is not JSON).
    pub(crate) async fn call(&self, who: As, method: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let bytes = body.map(|b| serde_json::to_vec(&b).unwrap()).unwrap_or_default();
        self.call_raw(who, method, path, bytes).await
    }

    pub(crate) async fn call_raw(&self, who: As, method: Method, path: &str, body: Vec<u8>) -> (StatusCode, Value) {
        let mut request = Request::builder().method(method).uri(path);
        if let Some(header) = who.header() {
            request = request.header("authorization", header);
        }
        let request = request.body(Body::from(body)).unwrap();
        let response = self.router.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
        (status, body_value(&bytes))
    }

    pub(crate) async fn ok(
        &self,
        who: As,
        method: Method,
        path: &str,
        body: Option<Value>,
        expected: StatusCode,
    ) -> Value {
        let (status, value) = self.call(who, method.clone(), path, body).await;
        assert_eq!(status, expected, "{method} {path}: {value}");
        value
    }

    /// A funded account `acct` with `units` credited and one credential.
    /// Returns the credential's id and key.
    pub(crate) async fn funded(&self, account_id: &str, units: u64) -> (String, String) {
        self.ok(
            As::Admin,
            Method::POST,
            "/v1/accounts",
            Some(serde_json::json!({"account_id": account_id})),
            StatusCode::CREATED,
        )
        .await;
        self.ok(
            As::Admin,
            Method::POST,
            &format!("/v1/accounts/{account_id}/credits"),
            Some(serde_json::json!({"credit_id": "c1", "units": units})),
            StatusCode::CREATED,
        )
        .await;
        let credential = self
            .ok(
                As::Admin,
                Method::POST,
                &format!("/v1/accounts/{account_id}/credentials"),
                Some(serde_json::json!({"label": "test"})),
                StatusCode::CREATED,
            )
            .await;
        (credential["credential_id"].as_str().unwrap().to_owned(), credential["key"].as_str().unwrap().to_owned())
    }
}
