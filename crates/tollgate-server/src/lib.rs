//! Tollgate's HTTP service.
//!
//! [`router`] builds the whole HTTP surface (every route in `routes.rs`,
//! registered together with its OpenAPI description, served at
//! `/openapi.json` and checked in as `docs/openapi.json`) over an [`AppState`]:
//! a store, a clock, operator tokens and metrics. Handler tests call it
//! directly with a `MemoryStore` and a [`ManualClock`]; the `tollgate` binary
//! wraps it in [`serve`], which adds the reclaim worker and graceful shutdown.
//!
//! Errors become HTTP statuses in one place, [`error`].

#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::too_many_lines))]

pub mod auth;
pub mod clock_check;
mod connection;
mod console;
pub mod error;
pub mod extract;
pub mod metrics;
pub mod openapi;
mod routes;
pub mod webhooks;
pub mod worker;

use std::future::Future;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::error_handling::HandleErrorLayer;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::Method;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use jiff::Timestamp;
use tokio::net::TcpListener;
use tollgate_store::Store;
use tower::ServiceBuilder;
use tower::timeout::TimeoutLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;

pub use auth::{OperatorTokens, Role, TokenError};
pub use connection::{HEAD_BYTES_MAX, HEADERS_MAX};
pub use error::ApiError;
pub use metrics::Metrics;
pub use webhooks::WebhookSettings;
pub use worker::ReclaimConfig;

/// Where the server reads the time. Core logic never reads a clock; the server
/// reads this one once per request and passes the instant down.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> Timestamp;
}

/// The operating system's clock, for production.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// A clock that only moves when told to, for tests.
#[derive(Debug)]
pub struct ManualClock {
    now: Mutex<Timestamp>,
}

impl ManualClock {
    pub fn new(now: Timestamp) -> Self {
        Self { now: Mutex::new(now) }
    }

    pub fn set(&self, now: Timestamp) {
        *self.now.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = now;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        *self.now.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The largest request body, in bytes. A full batch of 10 000 usage events with
/// 128-character identifiers and escaped text stays well below it.
pub const BODY_BYTES_MAX: usize = 16 * 1024 * 1024;

/// How long one request may take before it is answered with 503 `timeout`.
pub const REQUEST_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);

/// How long a client may take to send one request head, from its first byte.
pub const HEADER_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);

/// How long a connection may wait for a request: after it is accepted, and
/// between keep-alive requests.
pub const IDLE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(60);

/// The most connections open at once. It stays well below the common limit of
/// 1024 open files, leaving room for the database pool and the process's own
/// files, so the accept loop never runs out of descriptors.
pub const CONNECTIONS_MAX_DEFAULT: NonZeroU32 = NonZeroU32::new(512).unwrap();

/// Bounds on requests and on the connections that carry them. The body limit
/// and the request timeout apply in [`router`]; the rest apply in [`serve`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub body_bytes_max: usize,
    pub request_timeout: Duration,
    /// How long a keyed request's answer answers its retries; positive.
    pub idempotency_retention: jiff::SignedDuration,
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
    pub connections_max: NonZeroU32,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            body_bytes_max: BODY_BYTES_MAX,
            request_timeout: REQUEST_TIMEOUT_DEFAULT,
            idempotency_retention: tollgate_store::IDEMPOTENCY_RETENTION_DEFAULT,
            header_timeout: HEADER_TIMEOUT_DEFAULT,
            idle_timeout: IDLE_TIMEOUT_DEFAULT,
            connections_max: CONNECTIONS_MAX_DEFAULT,
        }
    }
}

/// Everything a handler needs. Cloning is cheap.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    tokens: OperatorTokens,
    metrics: Metrics,
    limits: Limits,
    clock_guard: clock_check::ClockGuard,
    webhooks: WebhookSettings,
    console: console::ConsoleState,
}

impl AppState {
    pub fn new(store: Arc<dyn Store>, clock: Arc<dyn Clock>, tokens: OperatorTokens) -> Self {
        Self::with_limits(store, clock, tokens, Limits::default())
    }

    pub fn with_limits(store: Arc<dyn Store>, clock: Arc<dyn Clock>, tokens: OperatorTokens, limits: Limits) -> Self {
        Self::with_webhooks(store, clock, tokens, limits, WebhookSettings::default())
    }

    pub fn with_webhooks(
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        tokens: OperatorTokens,
        limits: Limits,
        webhooks: WebhookSettings,
    ) -> Self {
        let metrics = Metrics::new(clock.now()).with_store(store.clone());
        let clock_guard = clock_check::ClockGuard::default();
        let console = console::ConsoleState::default();
        Self { inner: Arc::new(Inner { store, clock, tokens, metrics, limits, clock_guard, webhooks, console }) }
    }

    /// How webhooks are sealed and delivered.
    pub fn webhooks(&self) -> &WebhookSettings {
        &self.inner.webhooks
    }

    pub fn store(&self) -> &dyn Store {
        &*self.inner.store
    }

    pub fn now(&self) -> Timestamp {
        self.inner.clock.now()
    }

    pub fn tokens(&self) -> &OperatorTokens {
        &self.inner.tokens
    }

    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    pub fn limits(&self) -> Limits {
        self.inner.limits
    }

    /// Whether this server's clock agrees with its storage's.
    pub fn clock_guard(&self) -> &clock_check::ClockGuard {
        &self.inner.clock_guard
    }

    /// What the operator console keeps between requests.
    pub(crate) fn console(&self) -> &console::ConsoleState {
        &self.inner.console
    }
}

/// The whole HTTP surface: `/v1` routes, health, readiness, metrics, the
/// OpenAPI document and the operator console (`/console`), with request IDs, request tracing, request metrics, the
/// per-request timeout and the body limit applied to every route.
///
/// Layers, outermost first:
/// - `SetRequestIdLayer` gives each request an `x-request-id` (a UUIDv4,
///   unless the client sent one) and `PropagateRequestIdLayer` copies it onto
///   the response; `TraceLayer` opens one span per request carrying it, at
///   `debug` level: under the default `info` level a span per request cost
///   several percent of the server's CPU in the HTTP benchmark for lines
///   that are almost never written. Its own failure lines are off.
/// - `observe` records the request's metrics, refuses `/v1` requests while
///   the clocks disagree, and writes the one `warn` line of a 5xx answer
///   with its request ID, route, status, code and message, so that a
///   failure is traceable at the default level without the span.
/// - The timeout is `tower`'s `TimeoutLayer` behind axum's
///   `HandleErrorLayer`, so an expired request answers the typed 503
///   `timeout` body. `tower-http`'s `TimeoutLayer` is not used: it answers a
///   bare status with an empty body.
/// - The body limit stays axum's `DefaultBodyLimit`: it only bounds what
///   [`extract::ApiJson`] reads, so an oversized body is refused with the
///   typed 413 `payload_too_large` body, after authentication.
///   `tower-http`'s `RequestBodyLimitLayer` would answer a plain-text 413
///   before the route's auth extractor runs.
pub fn router(state: AppState) -> Router {
    let limits = state.limits();
    let (routes, _) = routes::routes().split_for_parts();
    let timeout = ServiceBuilder::new()
        .layer(HandleErrorLayer::new(|_: tower::BoxError| async { ApiError::Timeout }))
        .layer(TimeoutLayer::new(limits.request_timeout));
    let requests = ServiceBuilder::new()
        .layer(SetRequestIdLayer::x_request_id(MakeRequestUuid))
        .layer(TraceLayer::new_for_http().make_span_with(request_span).on_failure(()))
        .layer(PropagateRequestIdLayer::x_request_id());
    routes
        .merge(console::router())
        .fallback(unknown_route)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(limits.body_bytes_max))
        .layer(timeout)
        .layer(middleware::from_fn_with_state(state.clone(), observe))
        .layer(requests)
        .with_state(state)
}

const X_REQUEST_ID: &str = "x-request-id";

/// The span of one request: its method, route template and request ID, never
/// its path, which holds identifiers.
fn request_span(request: &Request) -> tracing::Span {
    let route = request.extensions().get::<MatchedPath>().map_or("unmatched", MatchedPath::as_str);
    let request_id = request.headers().get(X_REQUEST_ID).and_then(|id| id.to_str().ok()).unwrap_or("");
    tracing::debug_span!("request", method = %request.method(), route, request_id)
}

async fn unknown_route(method: Method, uri: axum::http::Uri) -> ApiError {
    ApiError::NotFound { method: method.to_string(), path: uri.path().to_owned() }
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}

/// Records the request's metrics. The route label is the matched template,
/// or `unmatched`, never the raw path. While this server's clock is too far
/// from its storage's, `/v1` requests are refused before they reach a
/// handler (`clock_check`).
async fn observe(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = metrics::HttpMethod::of(request.method());
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|path| path.as_str().to_owned())
        .unwrap_or_else(|| "unmatched".to_owned());
    let request_id = request.headers().get(X_REQUEST_ID).cloned();
    let refusal = request.uri().path().starts_with("/v1/").then(|| state.clock_guard().refusal()).flatten();
    let response = match refusal {
        Some(why) => ApiError::ClockSkew(why).into_response(),
        None => next.run(request).await,
    };
    let status = response.status().as_u16();
    if let Some(failure) = response.extensions().get::<error::Failure>() {
        let request_id = request_id.as_ref().and_then(|id| id.to_str().ok()).unwrap_or("");
        tracing::warn!(
            status, code = %failure.code, detail = %failure.message, %route, request_id, "request failed"
        );
    }
    state.metrics().observe_request(method, &route, status, started.elapsed());
    response
}

/// Serves `router(state)` on `listener` with the reclaim and webhook workers beside it until
/// `shutdown` resolves; then stops accepting, lets in-flight requests finish,
/// and stops the worker before returning. The state's [`Limits`] bound every
/// connection: at most `connections_max` are open (a connection beyond the cap
/// is closed as soon as it is accepted), one waiting for a request is closed
/// after `idle_timeout`, and one sending a request head is closed if the head
/// is not complete `header_timeout` after its first byte.
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    reclaim: ReclaimConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (stop_worker, worker_stopped) = tokio::sync::watch::channel(false);
    let worker = tokio::spawn(worker::run(state.clone(), reclaim, worker_stopped.clone()));
    let deliveries = tokio::spawn(webhooks::run(state.clone(), worker_stopped));
    let limits = state.limits();
    let served = connection::accept_loop(listener, router(state), limits, shutdown).await;
    let _ = stop_worker.send(true);
    if let Err(error) = worker.await {
        tracing::error!(%error, "reclaim worker ended abnormally");
    }
    if let Err(error) = deliveries.await {
        tracing::error!(%error, "webhook worker ended abnormally");
    }
    served
}
