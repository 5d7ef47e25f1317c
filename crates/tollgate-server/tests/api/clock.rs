//! A server whose clock is offset from PostgreSQL's stops serving, and serves
//! again once the clocks agree. The offset is injected into the server's
//! clock; the database is a real PostgreSQL.

use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use jiff::{SignedDuration, Timestamp};
use serde_json::Value;
use tollgate_core::{GrantPolicy, Secret};
use tollgate_pg::PostgresStore;
use tollgate_pg::testing::TestDb;
use tollgate_server::{AppState, Clock, OperatorTokens, clock_check, router, worker};
use tollgate_store::Store;
use tower::ServiceExt;

const ADMIN: &str = "admin-token-for-the-clock-tests";
const REQUEST_ID: &str = "clock-test-request";

/// Log lines written as JSON into memory while a subscriber from
/// [`subscriber`](Self::subscriber) is the thread's default.
#[derive(Clone, Default)]
struct CapturedLog(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for CapturedLog {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log").extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl CapturedLog {
    fn subscriber(&self) -> impl tracing::Subscriber + Send + Sync + use<> {
        let log = self.clone();
        tracing_subscriber::fmt().json().with_max_level(tracing::Level::INFO).with_writer(move || log.clone()).finish()
    }

    fn lines(&self) -> Vec<Value> {
        let bytes = self.0.lock().expect("log").clone();
        String::from_utf8(bytes).expect("utf-8").lines().map(|line| serde_json::from_str(line).expect("json")).collect()
    }
}

/// The system clock plus an offset the test sets.
struct OffsetClock(Mutex<SignedDuration>);

impl Clock for OffsetClock {
    fn now(&self) -> Timestamp {
        Timestamp::now() + *self.0.lock().expect("offset")
    }
}

async fn call(state: &AppState, method: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header("authorization", format!("Bearer {ADMIN}"))
        .header("x-request-id", REQUEST_ID)
        .body(body.map(|b| Body::from(b.to_string())).unwrap_or_default())
        .expect("request");
    let response = router(state.clone()).oneshot(request).await.expect("response");
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.expect("body");
    let value =
        serde_json::from_slice(&bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()));
    (status, value)
}

#[tokio::test]
async fn a_server_whose_clock_is_off_does_not_serve_or_reclaim_until_it_agrees() {
    // A grace of 2 s and a bound of 1 s: the offset below puts the server's
    // clock 5 s ahead of the database's.
    let policy = GrantPolicy::new(SignedDuration::from_secs(3_600), SignedDuration::from_secs(2), 100).expect("policy");
    let store = PostgresStore::on_test_db(TestDb::create().await, policy).await.expect("store");
    let clock = Arc::new(OffsetClock(Mutex::new(SignedDuration::ZERO)));
    let tokens = OperatorTokens::new(&Secret::new(ADMIN.to_owned()), None).expect("tokens");
    let state = AppState::new(Arc::new(store.clone()), clock.clone(), tokens);
    state.clock_guard().set_bound(SignedDuration::from_secs(1));

    // In agreement: serving, and a lease that expires in a second.
    let status = clock_check::check(&state).await.expect("clock read").expect("PostgreSQL has a shared clock");
    assert!(!status.skewed(), "{status:?}");
    assert_eq!(call(&state, Method::GET, "/readyz", None).await.0, StatusCode::OK);
    let created = call(&state, Method::POST, "/v1/accounts", Some(serde_json::json!({"account_id": "a"}))).await;
    assert_eq!(created.0, StatusCode::CREATED, "{}", created.1);
    store.credit("a", "c", 100, jiff::Timestamp::UNIX_EPOCH).await.expect("credit");
    let lease = store.acquire("a", 10, SignedDuration::from_secs(1), Timestamp::now()).await.expect("lease");

    // Five seconds ahead: by this server's clock the lease is past expiry and
    // grace, by the database's it is not. Nothing is served or reclaimed.
    *clock.0.lock().expect("offset") = SignedDuration::from_secs(5);
    assert_eq!(worker::worker_tick(&state).await.expect("tick"), 0);
    let status = state.clock_guard().last().expect("checked");
    assert!(status.skewed(), "{status:?}");
    assert!(status.sample.offset < SignedDuration::from_secs(-4), "{status:?}");
    assert_eq!(
        store.lease(&lease.lease.account_id, &lease.lease.lease_id).await.expect("lease").state.as_str(),
        "active"
    );

    let (ready, body) = call(&state, Method::GET, "/readyz", None).await;
    assert_eq!(ready, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(body["error"]["message"].as_str().is_some_and(|m| m.contains("clock")), "{body}");
    let log = CapturedLog::default();
    let (refused, body) = {
        let _log = tracing::subscriber::set_default(log.subscriber());
        call(&state, Method::POST, "/v1/accounts", Some(serde_json::json!({"account_id": "b"}))).await
    };
    assert_eq!(refused, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    // The refusal's one log line names the request, its route and the code.
    let lines = log.lines();
    let line = lines.iter().find(|line| line["fields"]["message"] == "request failed");
    let line = line.unwrap_or_else(|| panic!("no failure line in {lines:?}"));
    assert_eq!(line["level"], "WARN", "{line}");
    assert_eq!(line["fields"]["request_id"], REQUEST_ID, "{line}");
    assert_eq!(line["fields"]["route"], "/v1/accounts", "{line}");
    assert_eq!(line["fields"]["status"], 503, "{line}");
    assert_eq!(line["fields"]["code"], "clock_skew", "{line}");
    assert!(line["fields"]["detail"].as_str().is_some_and(|detail| detail.contains("clock")), "{line}");
    assert_eq!(body["error"]["code"], "clock_skew", "{body}");
    assert_eq!(body["error"]["retryable"], true, "{body}");
    assert!(matches!(store.account("b").await, Err(tollgate_core::Error::AccountNotFound)));
    let (_, metrics) = call(&state, Method::GET, "/metrics", None).await;
    let metrics = metrics.as_str().expect("text").to_owned();
    assert!(metrics.lines().any(|l| l == "tollgate_clock_skewed 1"), "{metrics}");
    assert!(metrics.lines().any(|l| l.starts_with("tollgate_clock_offset_seconds -")), "{metrics}");

    // Back in agreement: serving again.
    *clock.0.lock().expect("offset") = SignedDuration::ZERO;
    worker::worker_tick(&state).await.expect("tick");
    assert!(!state.clock_guard().last().expect("checked").skewed());
    assert_eq!(call(&state, Method::GET, "/readyz", None).await.0, StatusCode::OK);
    let created = call(&state, Method::POST, "/v1/accounts", Some(serde_json::json!({"account_id": "b"}))).await;
    assert_eq!(created.0, StatusCode::CREATED, "{}", created.1);
    let (_, metrics) = call(&state, Method::GET, "/metrics", None).await;
    assert!(metrics.as_str().expect("text").lines().any(|l| l == "tollgate_clock_skewed 0"));
}

#[tokio::test]
async fn the_memory_store_has_no_shared_clock_and_is_never_held_back() {
    let policy = GrantPolicy::new(SignedDuration::from_secs(3_600), SignedDuration::from_secs(2), 100).expect("policy");
    let store = tollgate_store::MemoryStore::new(policy);
    let clock = Arc::new(OffsetClock(Mutex::new(SignedDuration::from_secs(3_600))));
    let tokens = OperatorTokens::new(&Secret::new(ADMIN.to_owned()), None).expect("tokens");
    let state = AppState::new(Arc::new(store), clock, tokens);
    assert_eq!(clock_check::check(&state).await.expect("no storage clock"), None);
    assert_eq!(call(&state, Method::GET, "/readyz", None).await.0, StatusCode::OK);
}
