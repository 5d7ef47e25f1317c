//! The handlers of every route, annotated for the OpenAPI document.
//!
//! Each handler reads the clock once, calls the store once, and converts the
//! result to a wire body from `tollgate-api`. Auth extractors come first in
//! every signature, so a request without a valid token is refused before its
//! body is read.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use tollgate_api::{
    AccountBody, AcquireRequest, CheckBody, ConsolidateRequest, ConsolidateResponse, CreateAccountRequest,
    CreateCredentialRequest, CredentialBody, CreditRequest, ErrorBody, HealthBody, IngestRequest, IngestResponse,
    IssuedCredentialBody, LeaseBody, OutcomeBody, ReadyBody, ReclaimResponse, ReleaseRequest, ReleaseResponse,
    SettlementBody, StorageBody, VerifyRequest, VerifyResponse,
};
use tollgate_core::{BATCH_EVENTS_MAX, Error, IngestError, UsageEvent};
use tollgate_store::{Acquisition, Consolidation, IssuedLease, LeaseHandle, NewCredential, Release, Revocation};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::AppState;
use crate::auth::{AdminAuth, GatewayAuth, Role};
use crate::error::ApiError;
use crate::extract::{ApiJson, ApiPath, IdempotencyHeader};
use crate::metrics::LeaseEvent;
use crate::openapi;
use crate::worker;

mod journal;
mod listings;
mod params;
mod reads;
mod responses;
mod usage;
mod webhooks;

use params::{AccountPath, CredentialPath, IdempotencyKeyParams, LeasePath};
use responses::{
    AccountNotFound, BadBody, CredentialNotFound, IdempotencyKeyReused, LeaseNotFound, StorageUnavailable,
};

type ApiResult = Result<Response, ApiError>;

/// Every route, registered and documented at once, grouped by the operator
/// role it needs: each group's document gets the bearer security requirement
/// and the 401 (and, for admin routes, 403) answers from one modifier,
/// [`openapi::Secured`]. The handlers enforce the role with their auth
/// extractor; the role test reads each route's role back from the served
/// document and holds the handlers to it.
pub(crate) fn routes() -> OpenApiRouter<AppState> {
    let admin = OpenApiRouter::default()
        .routes(routes!(create_account))
        .routes(routes!(credit))
        .routes(routes!(issue_credential))
        .routes(routes!(reads::get_credential))
        .routes(routes!(revoke_credential))
        .routes(routes!(reclaim))
        .routes(routes!(check))
        .routes(routes!(listings::list_accounts))
        .routes(routes!(listings::list_credentials))
        .routes(routes!(listings::list_credits))
        .routes(routes!(webhooks::create_alert_rule, webhooks::list_alert_rules))
        .routes(routes!(webhooks::delete_alert_rule))
        .routes(routes!(webhooks::create_endpoint, webhooks::list_endpoints))
        .routes(routes!(webhooks::delete_endpoint))
        .routes(routes!(webhooks::rotate_secret))
        .routes(routes!(webhooks::list_deliveries))
        .routes(routes!(webhooks::redeliver));
    let gateway = OpenApiRouter::default()
        .routes(routes!(reads::get_account))
        .routes(routes!(journal::account_journal))
        .routes(routes!(acquire))
        .routes(routes!(consolidate))
        .routes(routes!(verify_credential))
        .routes(routes!(reads::get_lease))
        .routes(routes!(release))
        .routes(routes!(ingest))
        .routes(routes!(listings::list_leases))
        .routes(routes!(usage::get_usage))
        .routes(routes!(usage::get_usage_events));
    let public = OpenApiRouter::default()
        .routes(routes!(healthz))
        .routes(routes!(readyz))
        .routes(routes!(metrics))
        .routes(routes!(openapi_json));
    openapi::base()
        .merge(openapi::secured(admin, Role::Admin))
        .merge(openapi::secured(gateway, Role::Gateway))
        .merge(public)
}

fn json<T: serde::Serialize>(status: StatusCode, body: T) -> ApiResult {
    Ok((status, Json(body)).into_response())
}

fn issued_lease_body(issued: &IssuedLease) -> LeaseBody {
    LeaseBody { capability: Some(issued.capability.expose().to_owned()), ..LeaseBody::from(&issued.lease) }
}

/// Creates an empty account.
#[utoipa::path(
    post, path = "/v1/accounts", tag = "accounts",
    request_body = CreateAccountRequest,
    responses(
        (status = 201, description = "The new account", body = AccountBody),
        (status = 400, description = "Invalid account id or body", body = ErrorBody),
        (status = 409, description = "`account_exists`", body = ErrorBody),
    ),
)]
pub(crate) async fn create_account(
    _: AdminAuth,
    State(state): State<AppState>,
    ApiJson(body): ApiJson<CreateAccountRequest>,
) -> ApiResult {
    let view = state.store().create_account(&body.account_id).await?;
    json(StatusCode::CREATED, AccountBody::from(&view))
}

/// Adds prepaid units, idempotently on `credit_id`.
#[utoipa::path(
    post, path = "/v1/accounts/{account_id}/credits", tag = "accounts",
    params(AccountPath),
    request_body = CreditRequest,
    responses(
        (status = 201, description = "Credited; the account after the credit", body = AccountBody),
        (status = 200, description = "An identical replay; nothing changed", body = AccountBody),
        (status = 400, description = "`invalid_units`, `units_out_of_range`, `invalid_id` or bad body", body = ErrorBody),
        AccountNotFound,
        (status = 409, description = "`credit_conflict` or `counter_overflow`", body = ErrorBody),
    ),
)]
pub(crate) async fn credit(
    _: AdminAuth,
    State(state): State<AppState>,
    ApiPath(AccountPath { account_id }): ApiPath<AccountPath>,
    ApiJson(body): ApiJson<CreditRequest>,
) -> ApiResult {
    let receipt = state.store().credit(&account_id, &body.credit_id, body.units, state.now()).await?;
    let status = if receipt.created { StatusCode::CREATED } else { StatusCode::OK };
    json(status, AccountBody::from(&receipt.account))
}

/// Issues an end-user API key. The key is in this response only.
#[utoipa::path(
    post, path = "/v1/accounts/{account_id}/credentials", tag = "credentials",
    params(AccountPath, IdempotencyKeyParams),
    request_body = CreateCredentialRequest,
    responses(
        (status = 201, description = "The credential and its key, shown once", body = IssuedCredentialBody),
        (status = 400, description = "`invalid_label`, `invalid_idempotency_key` or bad body", body = ErrorBody),
        AccountNotFound,
        IdempotencyKeyReused,
    ),
)]
pub(crate) async fn issue_credential(
    _: AdminAuth,
    State(state): State<AppState>,
    ApiPath(AccountPath { account_id }): ApiPath<AccountPath>,
    IdempotencyHeader(idempotency): IdempotencyHeader,
    ApiJson(body): ApiJson<CreateCredentialRequest>,
) -> ApiResult {
    let request = NewCredential { account_id: &account_id, label: &body.label };
    let issued = state.store().issue_credential_idempotent(idempotency.as_ref(), request, state.now()).await?;
    json(
        StatusCode::CREATED,
        IssuedCredentialBody {
            credential: CredentialBody::from(&issued.credential),
            key: issued.key.expose().to_owned(),
        },
    )
}

/// Revokes a credential of the account. Revoking again keeps the first
/// revocation time; a credential of another account is `credential_not_found`.
#[utoipa::path(
    post, path = "/v1/accounts/{account_id}/credentials/{credential_id}/revoke", tag = "credentials",
    params(CredentialPath, IdempotencyKeyParams),
    responses(
        (status = 200, description = "The revoked credential", body = CredentialBody),
        (status = 400, description = "`invalid_idempotency_key`", body = ErrorBody),
        CredentialNotFound,
        IdempotencyKeyReused,
    ),
)]
pub(crate) async fn revoke_credential(
    _: AdminAuth,
    State(state): State<AppState>,
    ApiPath(CredentialPath { account_id, credential_id }): ApiPath<CredentialPath>,
    IdempotencyHeader(idempotency): IdempotencyHeader,
) -> ApiResult {
    let request = Revocation { account_id: &account_id, credential_id: &credential_id };
    let credential = state.store().revoke_credential_idempotent(idempotency.as_ref(), request, state.now()).await?;
    json(StatusCode::OK, CredentialBody::from(&credential))
}

/// Checks an end-user key. A key names its account
/// (`tgk_{account_id}_{secret}`) and is looked up on that account only; a key
/// whose account part was altered, or that is malformed, is
/// `unknown_credential`. Never changes the credential's activity.
#[utoipa::path(
    post, path = "/v1/credentials/verify", tag = "credentials",
    request_body = VerifyRequest,
    responses(
        (status = 200, description = "Whether the key is valid, and why not", body = VerifyResponse),
        BadBody,
    ),
)]
pub(crate) async fn verify_credential(
    _: GatewayAuth,
    State(state): State<AppState>,
    ApiJson(body): ApiJson<VerifyRequest>,
) -> ApiResult {
    let verification = state.store().verify_credential(&body.key).await?;
    json(StatusCode::OK, VerifyResponse::from(&verification))
}

/// Leases `units` for `ttl` (clamped to the server's max TTL). The response
/// carries the exact expiry and the capability, which is shown only here.
#[utoipa::path(
    post, path = "/v1/accounts/{account_id}/leases", tag = "leases",
    params(AccountPath, IdempotencyKeyParams),
    request_body = AcquireRequest,
    responses(
        (status = 201, description = "The lease with its capability", body = LeaseBody),
        (status = 400, description = "`invalid_units`, `invalid_ttl`, `units_out_of_range`, `invalid_idempotency_key` or bad body", body = ErrorBody),
        AccountNotFound,
        (status = 409, description = "`insufficient_balance`, `expiry_out_of_range`, `counter_overflow` or `idempotency_key_reused`", body = ErrorBody),
    ),
)]
pub(crate) async fn acquire(
    _: GatewayAuth,
    State(state): State<AppState>,
    ApiPath(AccountPath { account_id }): ApiPath<AccountPath>,
    IdempotencyHeader(idempotency): IdempotencyHeader,
    ApiJson(body): ApiJson<AcquireRequest>,
) -> ApiResult {
    let store = state.store();
    let now = state.now();
    let issued = match store
        .acquire_idempotent(
            idempotency.as_ref(),
            Acquisition { account_id: &account_id, units: body.units, ttl: body.ttl },
            now,
        )
        .await
    {
        Err(refused @ Error::InsufficientBalance { .. }) => {
            webhooks::note_refusal(&state, &account_id, now).await;
            return Err(refused.into());
        }
        other => other?,
    };
    state.metrics().count_leases(LeaseEvent::Acquired, 1);
    json(StatusCode::CREATED, issued_lease_body(&issued))
}

/// Settles a lease of the account: returns what was not used, bills usage
/// beyond the grant as overage. A lease of another account is
/// `lease_not_found` and nothing changes.
#[utoipa::path(
    post, path = "/v1/accounts/{account_id}/leases/{lease_id}/release", tag = "leases",
    params(LeasePath, IdempotencyKeyParams),
    request_body = ReleaseRequest,
    responses(
        (status = 200, description = "The settled lease and how it was split", body = ReleaseResponse),
        (status = 400, description = "`invalid_idempotency_key` or bad body", body = ErrorBody),
        LeaseNotFound,
        (status = 409, description = "`capability_mismatch`, `lease_not_active`, `lease_expired` or `idempotency_key_reused`", body = ErrorBody),
    ),
)]
pub(crate) async fn release(
    _: GatewayAuth,
    State(state): State<AppState>,
    ApiPath(LeasePath { account_id, lease_id }): ApiPath<LeasePath>,
    IdempotencyHeader(idempotency): IdempotencyHeader,
    ApiJson(body): ApiJson<ReleaseRequest>,
) -> ApiResult {
    let (store, now) = (state.store(), state.now());
    let released = store
        .release_idempotent(
            idempotency.as_ref(),
            Release { account_id: &account_id, lease_id: &lease_id, capability: &body.capability },
            now,
        )
        .await?;
    state.metrics().count_leases(LeaseEvent::Released, 1);
    let s = released.settlement;
    json(
        StatusCode::OK,
        ReleaseResponse {
            lease: LeaseBody::from(&released.lease),
            charged: s.charged,
            returned: s.returned,
            excess: s.excess,
        },
    )
}

/// Settles several leases of one account into one new lease of their returned
/// units plus `extra_units`, all or nothing. Every source is looked up under
/// the account: a lease of another account is `lease_not_found`.
#[utoipa::path(
    post, path = "/v1/accounts/{account_id}/leases/consolidate", tag = "leases",
    params(AccountPath, IdempotencyKeyParams),
    request_body = ConsolidateRequest,
    responses(
        (status = 201, description = "The new lease with its capability, and each source's settlement", body = ConsolidateResponse),
        (status = 400, description = "`no_source_leases`, `duplicate_source_lease`, `invalid_ttl`, `invalid_idempotency_key` or bad body", body = ErrorBody),
        (status = 404, description = "`account_not_found` or `lease_not_found`", body = ErrorBody),
        (status = 409, description = "`capability_mismatch`, `lease_not_active`, `lease_expired`, `insufficient_balance`, `expiry_out_of_range` or `idempotency_key_reused`", body = ErrorBody),
    ),
)]
pub(crate) async fn consolidate(
    _: GatewayAuth,
    State(state): State<AppState>,
    ApiPath(AccountPath { account_id }): ApiPath<AccountPath>,
    IdempotencyHeader(idempotency): IdempotencyHeader,
    ApiJson(body): ApiJson<ConsolidateRequest>,
) -> ApiResult {
    let sources: Vec<LeaseHandle> = body
        .leases
        .into_iter()
        .map(|handle| LeaseHandle { lease_id: handle.lease_id, capability: handle.capability })
        .collect();
    let (extra_units, ttl, now) = (body.extra_units, body.ttl, state.now());
    let consolidated = state
        .store()
        .consolidate_idempotent(
            idempotency.as_ref(),
            Consolidation { account_id: &account_id, sources: &sources, extra_units, ttl },
            now,
        )
        .await?;
    state.metrics().count_leases(LeaseEvent::Consolidated, consolidated.settlements.len() as u64);
    state.metrics().count_leases(LeaseEvent::Acquired, 1);
    let settlements = consolidated
        .settlements
        .iter()
        .map(|(lease, settlement)| SettlementBody::new(&lease.lease_id, &lease.account_id, settlement))
        .collect();
    json(StatusCode::CREATED, ConsolidateResponse { lease: issued_lease_body(&consolidated.lease), settlements })
}

/// Classifies every event as accepted, duplicate or rejected, in input order,
/// and applies the accepted ones. At most 10 000 events per batch.
#[utoipa::path(
    post, path = "/v1/usage", tag = "usage",
    request_body = IngestRequest,
    responses(
        (status = 200, description = "One outcome per event, in input order", body = IngestResponse),
        BadBody,
        (status = 413, description = "`batch_too_large` or `payload_too_large`", body = ErrorBody),
        (status = 422, description = "`batch_refused`: accepting the batch would overflow a counter; nothing was applied", body = ErrorBody),
        (status = 500, description = "`storage_corrupt`", body = ErrorBody),
        (status = 503, description = "`storage_unavailable` or `timeout`; retry", body = ErrorBody),
    ),
)]
pub(crate) async fn ingest(
    _: GatewayAuth,
    State(state): State<AppState>,
    ApiJson(body): ApiJson<IngestRequest>,
) -> ApiResult {
    let now = state.now();
    let result = ingest_events(&state, body, now).await;
    match &result {
        Ok(outcomes) => {
            state.metrics().observe_outcomes(outcomes);
            state.console().ingest.record(outcomes, now);
        }
        Err(error) => state.metrics().observe_batch_error(error),
    }
    let outcomes = result?;
    json(StatusCode::OK, IngestResponse { outcomes: outcomes.iter().map(OutcomeBody::from).collect() })
}

async fn ingest_events(
    state: &AppState,
    body: IngestRequest,
    now: jiff::Timestamp,
) -> Result<Vec<tollgate_core::EventOutcome>, IngestError> {
    // Checked before conversion too, so an oversized batch costs no more work.
    if body.events.len() > BATCH_EVENTS_MAX {
        return Err(IngestError::BatchTooLarge { events: body.events.len(), max: BATCH_EVENTS_MAX });
    }
    let events: Vec<UsageEvent> = body.events.into_iter().map(UsageEvent::from).collect();
    state.store().ingest(events, now).await
}

/// Runs one bounded reclaim pass now.
#[utoipa::path(
    post, path = "/v1/admin/reclaim", tag = "admin",
    responses(
        (status = 200, description = "What the pass settled; `full` means more may be due", body = ReclaimResponse),
        StorageUnavailable,
    ),
)]
pub(crate) async fn reclaim(_: AdminAuth, State(state): State<AppState>) -> ApiResult {
    let report = worker::reclaim_pass(&state).await?;
    json(StatusCode::OK, ReclaimResponse::from(&report))
}

/// Storage and migration readiness, conservation of every account, the
/// legacy-bound counts and database guard violations. `ok` is false on any
/// problem; the status is 200 whenever the check itself ran.
#[utoipa::path(
    get, path = "/v1/admin/check", tag = "admin",
    responses(
        (status = 200, description = "The check report", body = CheckBody),
    ),
)]
pub(crate) async fn check(_: AdminAuth, State(state): State<AppState>) -> ApiResult {
    json(StatusCode::OK, run_check(&state).await)
}

async fn run_check(state: &AppState) -> CheckBody {
    let store = state.store();
    let unreachable = |error: Error| StorageBody {
        backend: String::new(),
        reachable: false,
        error: Some(error.to_string()),
        migrations: None,
    };
    let mut storage = match store.status().await {
        Ok(status) => StorageBody::from_status(&status),
        Err(error) => return CheckBody::new(unreachable(error), None, None),
    };
    match store.check().await {
        Ok(report) => CheckBody::from_report(storage, &report),
        Err(error) => {
            storage.error = Some(error.to_string());
            CheckBody::new(storage, None, None)
        }
    }
}

/// The process is up.
#[utoipa::path(
    get, path = "/healthz", tag = "operations",
    responses((status = 200, description = "Up", body = HealthBody)),
)]
pub(crate) async fn healthz() -> ApiResult {
    json(StatusCode::OK, HealthBody { status: "ok".to_owned() })
}

/// Storage answers and its schema is exactly the one this binary knows.
#[utoipa::path(
    get, path = "/readyz", tag = "operations",
    responses(
        (status = 200, description = "Ready", body = ReadyBody),
        (status = 503, description = "`not_ready`", body = ErrorBody),
    ),
)]
pub(crate) async fn readyz(State(state): State<AppState>) -> ApiResult {
    if let Some(why) = state.clock_guard().refusal() {
        return Err(ApiError::NotReady(why));
    }
    let status = state.store().status().await.map_err(|error| ApiError::NotReady(error.to_string()))?;
    let storage = StorageBody::from_status(&status);
    if !storage.is_ready() {
        let detail = storage
            .migrations
            .as_ref()
            .map(|m| format!("migrations not current: pending {:?}, unknown {:?}", m.pending, m.unknown))
            .unwrap_or_default();
        return Err(ApiError::NotReady(detail));
    }
    json(StatusCode::OK, ReadyBody { ready: true, storage })
}

/// Prometheus metrics in the text exposition format.
#[utoipa::path(
    get, path = "/metrics", tag = "operations",
    responses((status = 200, description = "Metrics", body = String, content_type = "text/plain")),
)]
pub(crate) async fn metrics(State(state): State<AppState>) -> Response {
    let text = state.metrics().render(state.now());
    ([(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
}

/// This document.
#[utoipa::path(
    get, path = "/openapi.json", tag = "operations",
    responses((status = 200, description = "The OpenAPI document", content_type = "application/json")),
)]
pub(crate) async fn openapi_json() -> Response {
    ([(CONTENT_TYPE, "application/json")], openapi::document()).into_response()
}
