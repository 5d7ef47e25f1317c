//! One helper for the handler tests: a router over a `MemoryStore` and a
//! settable clock, which sends each request of the shared [`Api`] through it.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use jiff::{SignedDuration, Timestamp};
use serde_json::Value;
use tollgate_core::{GrantPolicy, Secret};
use tollgate_server::{AppState, Limits, ManualClock, OperatorTokens, router};
use tollgate_store::{MemoryStore, Store};
use tollgate_testkit::body_value;
pub(crate) use tollgate_testkit::{Api, As, assert_error};
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

    /// Sends raw bytes as `who`.
    pub(crate) async fn call_raw(&self, who: As, method: Method, path: &str, body: Vec<u8>) -> (StatusCode, Value) {
        self.send(self.token(who), method, path, body).await
    }
}

impl Api for App {
    const ADMIN_TOKEN: &'static str = ADMIN;
    const GATEWAY_TOKEN: &'static str = GATEWAY;

    /// Sends one request through the router; the body as [`body_value`]
    /// reads it.
    async fn send(&self, token: Option<&str>, method: Method, path: &str, body: Vec<u8>) -> (StatusCode, Value) {
        let mut request = Request::builder().method(method).uri(path);
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        let request = request.body(Body::from(body)).unwrap();
        let response = self.router.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
        (status, body_value(&bytes))
    }
}
