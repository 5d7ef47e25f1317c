//! The typed HTTP client for every route of Tollgate's `/v1` API, and (in
//! `usage`) how the usage writer over HTTP reads `POST /v1/usage`.
//!
//! Bodies are the wire types of `tollgate-api`, so the client and the server
//! cannot disagree on a field name. Every failure is a [`ClientError`] that
//! carries the server's stable `code`, its `message`, whether a retry can
//! succeed, and the HTTP status when there was one.
//!
//! Every mutating call that the server deduplicates by `Idempotency-Key`
//! (acquire, release, consolidate, credential issue and revoke) is sent with a
//! fresh random key, and an error whose `retryable()` is true is retried with
//! the same key, so a lost answer is answered again instead of applied twice.
//! Attempts are bounded by `ClientConfig::mutation_attempts_max`, with a
//! backoff that doubles from `mutation_backoff_initial`.

use std::time::Duration;

use jiff::SignedDuration;
use reqwest::{Method, Response, StatusCode, Url};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tollgate_api::{
    AccountBody, AcquireRequest, CheckBody, ConsolidateRequest, ConsolidateResponse, CreateAccountRequest,
    CreateCredentialRequest, CredentialBody, CreditRequest, HealthBody, IngestRequest, IngestResponse,
    IssuedCredentialBody, LeaseBody, LeaseHandleBody, ReadyBody, ReclaimResponse, ReleaseRequest, ReleaseResponse,
    UsageEventBody, VerifyRequest, VerifyResponse,
};
use tollgate_core::{Secret, UsageEvent};

mod error;
mod journal;
mod listings;
mod usage;
mod usage_queries;

pub use usage_queries::{NdjsonEvents, UsageEventPages, UsageQueryParams};

pub use listings::{PageQuery, Pages};

pub use usage::UNRECOGNISED_REASON;

use error::snippet;
pub use error::{ClientBuildError, ClientError, ClientErrorKind};

/// Where the server is, how to authenticate, and how long to wait.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// The server's base URL, e.g. `http://127.0.0.1:8080`. A path prefix
    /// (`https://host/tollgate`) is kept in front of every route.
    pub base_url: String,
    /// The operator token sent as `Authorization: Bearer`: the gateway token
    /// for a gateway, the admin token for administration. Redacted in `Debug`.
    pub token: Option<Secret>,
    /// The whole request, connection included. The server answers 503 `timeout`
    /// after its own 30 s; a client that gives up earlier abandons a request
    /// the server may still complete, which idempotent ingestion tolerates.
    pub request_timeout: Duration,
    pub connect_timeout: Duration,
    /// Idle keep-alive connections kept per host, so that consecutive batches
    /// reuse a connection instead of paying a handshake each.
    pub idle_connections_per_host_max: usize,
    pub idle_timeout: Duration,
    /// Attempts of one keyed mutating call, the first included: 1 to
    /// [`MUTATION_ATTEMPTS_MAX`].
    pub mutation_attempts_max: u32,
    /// The wait before the second attempt; each later wait doubles. At most
    /// [`MUTATION_BACKOFF_INITIAL_MAX`].
    pub mutation_backoff_initial: Duration,
}

/// The most attempts one keyed mutating call may be configured to make.
pub const MUTATION_ATTEMPTS_MAX: u32 = 20;
/// The longest first backoff of a keyed mutating call.
pub const MUTATION_BACKOFF_INITIAL_MAX: Duration = Duration::from_secs(10);

/// The longest answer body the client reads. The largest documented answer,
/// the outcomes of a full usage batch with the longest escaped request ids,
/// is under 10 MiB; anything longer is not Tollgate's answer.
pub const RESPONSE_BYTES_MAX: usize = 32 * 1024 * 1024;

/// The header that names a mutating request for idempotent retries.
const IDEMPOTENCY_KEY_HEADER: &str = "Idempotency-Key";

/// A fresh key: 256 random bits, so that nobody can guess it (it unseals the
/// recorded answer on the server).
pub(crate) fn new_idempotency_key() -> String {
    rand::random::<[u8; 32]>().iter().map(|byte| format!("{byte:02x}")).collect()
}

impl ClientConfig {
    pub fn new(base_url: impl Into<String>, token: Option<&str>) -> Self {
        Self {
            base_url: base_url.into(),
            token: token.map(|token| Secret::new(token.to_owned())),
            request_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(2),
            idle_connections_per_host_max: 32,
            idle_timeout: Duration::from_secs(90),
            mutation_attempts_max: 4,
            mutation_backoff_initial: Duration::from_millis(100),
        }
    }
}

/// A credit's result: the account afterwards, and whether this call created
/// the credit (201) or replayed an identical one (200).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credited {
    pub account: AccountBody,
    pub created: bool,
}

/// The typed client. Cloning is cheap and clones share one connection pool.
#[derive(Clone)]
pub struct TollgateClient {
    http: reqwest::Client,
    base_url: Url,
    /// `Bearer <token>`, marked sensitive so it is never logged by the stack.
    authorization: Option<reqwest::header::HeaderValue>,
    mutation_attempts_max: u32,
    mutation_backoff_initial: Duration,
}

impl std::fmt::Debug for TollgateClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TollgateClient")
            .field("base_url", &self.base_url.as_str())
            .field("authorization", &self.authorization.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl TollgateClient {
    pub fn new(config: ClientConfig) -> Result<Self, ClientBuildError> {
        let invalid = |reason: String| ClientBuildError::InvalidBaseUrl { url: config.base_url.clone(), reason };
        let base_url = Url::parse(&config.base_url).map_err(|e| invalid(e.to_string()))?;
        if !matches!(base_url.scheme(), "http" | "https") || base_url.cannot_be_a_base() {
            return Err(invalid("the scheme must be http or https".into()));
        }
        let attempts = 1..=MUTATION_ATTEMPTS_MAX;
        if !attempts.contains(&config.mutation_attempts_max)
            || config.mutation_backoff_initial > MUTATION_BACKOFF_INITIAL_MAX
        {
            return Err(ClientBuildError::InvalidMutationRetry);
        }
        let authorization = match &config.token {
            None => None,
            Some(token) => {
                let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {}", token.expose()))
                    .map_err(|_| ClientBuildError::InvalidToken)?;
                value.set_sensitive(true);
                Some(value)
            }
        };
        let http = reqwest::Client::builder()
            .user_agent(concat!("tollgate-client/", env!("CARGO_PKG_VERSION")))
            .timeout(config.request_timeout)
            .connect_timeout(config.connect_timeout)
            .pool_max_idle_per_host(config.idle_connections_per_host_max)
            .pool_idle_timeout(config.idle_timeout)
            .tcp_nodelay(true)
            .build()?;
        Ok(Self {
            http,
            base_url,
            authorization,
            mutation_attempts_max: config.mutation_attempts_max,
            mutation_backoff_initial: config.mutation_backoff_initial,
        })
    }

    pub fn base_url(&self) -> &Url {
        &self.base_url
    }

    /// `POST /v1/accounts` (admin): 201 with the new account.
    pub async fn create_account(&self, account_id: &str) -> Result<AccountBody, ClientError> {
        let body = CreateAccountRequest { account_id: account_id.to_owned() };
        self.json(Method::POST, &["v1", "accounts"], Some(&body)).await.map(|(_, account)| account)
    }

    /// `GET /v1/accounts/{account_id}` (gateway).
    pub async fn account(&self, account_id: &str) -> Result<AccountBody, ClientError> {
        self.get(&["v1", "accounts", account_id]).await
    }

    /// `POST /v1/accounts/{account_id}/credits` (admin), idempotent on `credit_id`.
    pub async fn credit(&self, account_id: &str, credit_id: &str, units: u64) -> Result<Credited, ClientError> {
        let body = CreditRequest { credit_id: credit_id.to_owned(), units };
        let (status, account) =
            self.json(Method::POST, &["v1", "accounts", account_id, "credits"], Some(&body)).await?;
        Ok(Credited { account, created: status == StatusCode::CREATED })
    }

    /// `POST /v1/accounts/{account_id}/credentials` (admin). The key is in
    /// this response only.
    pub async fn issue_credential(&self, account_id: &str, label: &str) -> Result<IssuedCredentialBody, ClientError> {
        let body = CreateCredentialRequest { label: label.to_owned() };
        self.keyed(&["v1", "accounts", account_id, "credentials"], Some(&body)).await
    }

    /// `GET /v1/accounts/{account_id}/credentials/{credential_id}` (admin).
    pub async fn credential(&self, account_id: &str, credential_id: &str) -> Result<CredentialBody, ClientError> {
        self.get(&["v1", "accounts", account_id, "credentials", credential_id]).await
    }

    /// `POST /v1/accounts/{account_id}/credentials/{credential_id}/revoke` (admin).
    pub async fn revoke_credential(
        &self,
        account_id: &str,
        credential_id: &str,
    ) -> Result<CredentialBody, ClientError> {
        self.keyed(&["v1", "accounts", account_id, "credentials", credential_id, "revoke"], None::<&()>).await
    }

    /// `POST /v1/credentials/verify` (gateway). Never changes activity.
    pub async fn verify_credential(&self, key: &str) -> Result<VerifyResponse, ClientError> {
        let body = VerifyRequest { key: key.to_owned() };
        self.json(Method::POST, &["v1", "credentials", "verify"], Some(&body)).await.map(|(_, v)| v)
    }

    /// `POST /v1/accounts/{account_id}/leases` (gateway): 201 with the lease
    /// and its capability, which is shown only here.
    pub async fn acquire(&self, account_id: &str, units: u64, ttl: SignedDuration) -> Result<LeaseBody, ClientError> {
        self.acquire_keyed(&new_idempotency_key(), account_id, units, ttl).await
    }

    /// `acquire` under a key the caller keeps, so that it can ask again with
    /// the same key after an unclear answer and learn what happened.
    pub(crate) async fn acquire_keyed(
        &self,
        key: &str,
        account_id: &str,
        units: u64,
        ttl: SignedDuration,
    ) -> Result<LeaseBody, ClientError> {
        let body = AcquireRequest { units, ttl };
        self.keyed_with(key, &["v1", "accounts", account_id, "leases"], Some(&body)).await
    }

    /// `GET /v1/accounts/{account_id}/leases/{lease_id}` (gateway), without
    /// the capability.
    pub async fn lease(&self, account_id: &str, lease_id: &str) -> Result<LeaseBody, ClientError> {
        self.get(&["v1", "accounts", account_id, "leases", lease_id]).await
    }

    /// `POST /v1/accounts/{account_id}/leases/{lease_id}/release` (gateway).
    pub async fn release(
        &self,
        account_id: &str,
        lease_id: &str,
        capability: &str,
    ) -> Result<ReleaseResponse, ClientError> {
        let body = ReleaseRequest { capability: capability.to_owned() };
        self.keyed(&["v1", "accounts", account_id, "leases", lease_id, "release"], Some(&body)).await
    }

    /// `POST /v1/accounts/{account_id}/leases/consolidate` (gateway): settles
    /// the sources and grants one lease of their returned units plus
    /// `extra_units`, all or nothing.
    pub async fn consolidate(
        &self,
        account_id: &str,
        leases: Vec<LeaseHandleBody>,
        extra_units: u64,
        ttl: SignedDuration,
    ) -> Result<ConsolidateResponse, ClientError> {
        self.consolidate_keyed(&new_idempotency_key(), account_id, leases, extra_units, ttl).await
    }

    /// `consolidate` under a key the caller keeps; see `acquire_keyed`.
    pub(crate) async fn consolidate_keyed(
        &self,
        key: &str,
        account_id: &str,
        leases: Vec<LeaseHandleBody>,
        extra_units: u64,
        ttl: SignedDuration,
    ) -> Result<ConsolidateResponse, ClientError> {
        let body = ConsolidateRequest { leases, extra_units, ttl };
        self.keyed_with(key, &["v1", "accounts", account_id, "leases", "consolidate"], Some(&body)).await
    }

    /// `POST /v1/usage` (gateway): one outcome per event, in input order.
    /// Usually called through [`crate::UsageWriter`], which batches and retries.
    pub async fn send_usage(&self, events: &[UsageEvent]) -> Result<IngestResponse, ClientError> {
        let body = IngestRequest { events: events.iter().map(UsageEventBody::from).collect() };
        self.json(Method::POST, &["v1", "usage"], Some(&body)).await.map(|(_, r)| r)
    }

    /// `POST /v1/admin/reclaim` (admin): one bounded reclaim pass now.
    pub async fn reclaim(&self) -> Result<ReclaimResponse, ClientError> {
        self.json(Method::POST, &["v1", "admin", "reclaim"], None::<&()>).await.map(|(_, r)| r)
    }

    /// `GET /v1/admin/check` (admin): readiness, conservation, legacy bounds.
    pub async fn check(&self) -> Result<CheckBody, ClientError> {
        self.get(&["v1", "admin", "check"]).await
    }

    /// `GET /healthz`.
    pub async fn healthz(&self) -> Result<HealthBody, ClientError> {
        self.get(&["healthz"]).await
    }

    /// `GET /readyz`: an error with code `not_ready` while storage is not ready.
    pub async fn readyz(&self) -> Result<ReadyBody, ClientError> {
        self.get(&["readyz"]).await
    }

    /// `GET /metrics`: the Prometheus text exposition.
    pub async fn metrics(&self) -> Result<String, ClientError> {
        let (_, bytes) = self.send(Method::GET, &["metrics"], None::<&()>, None).await?;
        String::from_utf8(bytes).map_err(|e| ClientError {
            kind: ClientErrorKind::InvalidResponse,
            status: Some(200),
            code: "invalid_response".into(),
            message: format!("metrics are not UTF-8: {e}"),
            retryable: false,
        })
    }

    /// `GET /openapi.json`: the OpenAPI document.
    pub async fn openapi(&self) -> Result<serde_json::Value, ClientError> {
        self.get(&["openapi.json"]).await
    }

    /// The URL of a route. Each segment is percent-encoded, so an identifier
    /// can never change which route is called.
    fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.base_url.clone();
        url.path_segments_mut()
            .expect("the base URL was checked to be a base at construction")
            .pop_if_empty()
            .extend(segments);
        url
    }

    /// A `POST` under a fresh `Idempotency-Key`, retried with the same key
    /// while the error is retryable and attempts remain.
    async fn keyed<B: Serialize, T: DeserializeOwned>(
        &self,
        segments: &[&str],
        body: Option<&B>,
    ) -> Result<T, ClientError> {
        self.keyed_with(&new_idempotency_key(), segments, body).await
    }

    async fn keyed_with<B: Serialize, T: DeserializeOwned>(
        &self,
        key: &str,
        segments: &[&str],
        body: Option<&B>,
    ) -> Result<T, ClientError> {
        let mut backoff = self.mutation_backoff_initial;
        let mut attempt = 1;
        loop {
            match self.json_keyed(Method::POST, segments, body, Some(key)).await {
                Err(error) if error.retryable() && attempt < self.mutation_attempts_max => {
                    tokio::time::sleep(backoff).await;
                    backoff = backoff.saturating_mul(2);
                    attempt += 1;
                }
                result => return result.map(|(_, value)| value),
            }
        }
    }

    /// A `GET` of one JSON body; the status of a success says nothing more.
    async fn get<T: DeserializeOwned>(&self, segments: &[&str]) -> Result<T, ClientError> {
        self.json(Method::GET, segments, None::<&()>).await.map(|(_, body)| body)
    }

    async fn json<B: Serialize, T: DeserializeOwned>(
        &self,
        method: Method,
        segments: &[&str],
        body: Option<&B>,
    ) -> Result<(StatusCode, T), ClientError> {
        self.json_keyed(method, segments, body, None).await
    }

    async fn json_keyed<B: Serialize, T: DeserializeOwned>(
        &self,
        method: Method,
        segments: &[&str],
        body: Option<&B>,
        idempotency_key: Option<&str>,
    ) -> Result<(StatusCode, T), ClientError> {
        let (status, bytes) = self.send(method, segments, body, idempotency_key).await?;
        decode(status, &bytes)
    }

    /// The URL of a route with query parameters, each percent-encoded.
    fn url_with(&self, segments: &[&str], query: &[(&str, &str)]) -> Url {
        let mut url = self.url(segments);
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        url
    }

    /// `GET` of a route with query parameters, its answer decoded.
    pub(crate) async fn get_with_query<T: DeserializeOwned>(
        &self,
        segments: &[&str],
        query: &[(&str, &str)],
    ) -> Result<T, ClientError> {
        let (status, bytes) = self.send_to(Method::GET, self.url_with(segments, query), None::<&()>, None).await?;
        decode(status, &bytes).map(|(_, value)| value)
    }

    /// `GET` of a route with query parameters whose successful answer is
    /// read by the caller as it arrives (a stream); an error status is read
    /// whole and becomes a `ClientError` from its error body.
    pub(crate) async fn get_streamed(
        &self,
        segments: &[&str],
        query: &[(&str, &str)],
    ) -> Result<Response, ClientError> {
        let response = self.start(Method::GET, self.url_with(segments, query), None::<&()>, None).await?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        Err(ClientError::of_response(status, &read_bounded(response).await?))
    }

    /// Sends one request and reads the whole body; an error status becomes a
    /// `ClientError` from the error body.
    async fn send<B: Serialize>(
        &self,
        method: Method,
        segments: &[&str],
        body: Option<&B>,
        idempotency_key: Option<&str>,
    ) -> Result<(StatusCode, Vec<u8>), ClientError> {
        self.send_to(method, self.url(segments), body, idempotency_key).await
    }

    /// `send` to a URL built by the caller (one with a query string).
    async fn send_to<B: Serialize>(
        &self,
        method: Method,
        url: Url,
        body: Option<&B>,
        idempotency_key: Option<&str>,
    ) -> Result<(StatusCode, Vec<u8>), ClientError> {
        let response = self.start(method, url, body, idempotency_key).await?;
        let status = response.status();
        let bytes = read_bounded(response).await?;
        if status.is_success() { Ok((status, bytes)) } else { Err(ClientError::of_response(status, &bytes)) }
    }

    /// Sends one request with the operator token and the idempotency key, if
    /// any; the answer's body is not read yet.
    async fn start<B: Serialize>(
        &self,
        method: Method,
        url: Url,
        body: Option<&B>,
        idempotency_key: Option<&str>,
    ) -> Result<Response, ClientError> {
        let mut request = self.http.request(method, url);
        if let Some(authorization) = &self.authorization {
            request = request.header(reqwest::header::AUTHORIZATION, authorization.clone());
        }
        if let Some(key) = idempotency_key {
            let mut value = reqwest::header::HeaderValue::from_str(key).map_err(|e| ClientError {
                kind: ClientErrorKind::InvalidResponse,
                status: None,
                code: "invalid_idempotency_key".into(),
                message: e.to_string(),
                retryable: false,
            })?;
            value.set_sensitive(true);
            request = request.header(IDEMPOTENCY_KEY_HEADER, value);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        request.send().await.map_err(|e| ClientError::of_reqwest(&e))
    }
}

/// An answer's whole body, at most [`RESPONSE_BYTES_MAX`] bytes.
async fn read_bounded(mut response: Response) -> Result<Vec<u8>, ClientError> {
    let status = response.status();
    let mut bytes = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| ClientError::of_reqwest(&e))? {
        if bytes.len() + chunk.len() > RESPONSE_BYTES_MAX {
            return Err(ClientError {
                kind: ClientErrorKind::InvalidResponse,
                status: Some(status.as_u16()),
                code: "invalid_response".into(),
                message: format!("HTTP {status} answer is longer than {RESPONSE_BYTES_MAX} bytes"),
                // The request may have been applied; a retry (keyed, or
                // idempotent usage) is answered again.
                retryable: true,
            });
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes)
}

/// A success answer's body as `T`.
fn decode<T: DeserializeOwned>(status: StatusCode, bytes: &[u8]) -> Result<(StatusCode, T), ClientError> {
    let value = serde_json::from_slice(bytes).map_err(|e| ClientError {
        kind: ClientErrorKind::InvalidResponse,
        status: Some(status.as_u16()),
        code: "invalid_response".into(),
        message: format!("HTTP {status} body is not the documented shape: {e}: {}", snippet(bytes)),
        retryable: false,
    })?;
    Ok((status, value))
}

#[cfg(test)]
mod tests;
