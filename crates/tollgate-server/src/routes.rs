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
use tollgate_core::{BATCH_EVENTS_MAX, Error, IngestError, Settlement, UsageEvent};
use tollgate_store::{Acquisition, Consolidation, IssuedLease, LeaseHandle, NewCredential, Release, Revocation};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::AppState;
use crate::auth::{AdminAuth, GatewayAuth, Role};
use crate::error::ApiError;
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
mod writes;

use writes::write_route;

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

write_route! {
    /// Creates an empty account.
    create_account: AdminAuth, post "/v1/accounts", tag "accounts",
    answers 201 => AccountBody, "The new account";
    400 "Invalid account id or body"; 409 "`account_exists`";
    |state, body body: CreateAccountRequest| {
        let view = state.store().create_account(&body.account_id).await?;
        json(StatusCode::CREATED, AccountBody::from(&view))
    }
}

write_route! {
    /// Adds prepaid units, idempotently on `credit_id`.
    credit: AdminAuth, post "/v1/accounts/{account_id}/credits", tag "accounts",
    params(AccountPath),
    answers 201 => AccountBody, "Credited; the account after the credit";
    answers 200 => AccountBody, "An identical replay; nothing changed";
    errors(AccountNotFound);
    400 "`invalid_units`, `units_out_of_range`, `invalid_id` or bad body";
    409 "`credit_conflict` or `counter_overflow`";
    |state, path AccountPath { account_id }, body body: CreditRequest| {
        let receipt = state.store().credit(&account_id, &body.credit_id, body.units, state.now()).await?;
        let status = if receipt.created { StatusCode::CREATED } else { StatusCode::OK };
        json(status, AccountBody::from(&receipt.account))
    }
}

write_route! {
    /// Issues an end-user API key. The key is in this response only.
    issue_credential: AdminAuth, post "/v1/accounts/{account_id}/credentials", tag "credentials",
    params(AccountPath, IdempotencyKeyParams),
    answers 201 => IssuedCredentialBody, "The credential and its key, shown once";
    errors(AccountNotFound, IdempotencyKeyReused);
    400 "`invalid_label`, `invalid_idempotency_key` or bad body";
    |state, path AccountPath { account_id }, key idempotency, body body: CreateCredentialRequest| {
        let request = NewCredential { account_id: &account_id, label: &body.label };
        let issued = state.store().issue_credential_idempotent(idempotency.as_ref(), request, state.now()).await?;
        let credential = CredentialBody::from(&issued.credential);
        json(StatusCode::CREATED, IssuedCredentialBody { credential, key: issued.key.expose().to_owned() })
    }
}

write_route! {
    /// Revokes a credential of the account. Revoking again keeps the first
    /// revocation time; a credential of another account is `credential_not_found`.
    revoke_credential: AdminAuth, post "/v1/accounts/{account_id}/credentials/{credential_id}/revoke",
    tag "credentials",
    params(CredentialPath, IdempotencyKeyParams),
    answers 200 => CredentialBody, "The revoked credential";
    errors(CredentialNotFound, IdempotencyKeyReused);
    400 "`invalid_idempotency_key`";
    |state, path CredentialPath { account_id, credential_id }, key idempotency| {
        let request = Revocation { account_id: &account_id, credential_id: &credential_id };
        let credential = state.store().revoke_credential_idempotent(idempotency.as_ref(), request, state.now()).await?;
        json(StatusCode::OK, CredentialBody::from(&credential))
    }
}

write_route! {
    /// Checks an end-user key. A key names its account
    /// (`tgk_{account_id}_{secret}`) and is looked up on that account only; a key
    /// whose account part was altered, or that is malformed, is
    /// `unknown_credential`. Never changes the credential's activity.
    verify_credential: GatewayAuth, post "/v1/credentials/verify", tag "credentials",
    answers 200 => VerifyResponse, "Whether the key is valid, and why not";
    errors(BadBody);
    |state, body body: VerifyRequest| {
        let verification = state.store().verify_credential(&body.key).await?;
        json(StatusCode::OK, VerifyResponse::from(&verification))
    }
}

write_route! {
    /// Leases `units` for `ttl` (clamped to the server's max TTL). The response
    /// carries the exact expiry and the capability, which is shown only here.
    acquire: GatewayAuth, post "/v1/accounts/{account_id}/leases", tag "leases",
    params(AccountPath, IdempotencyKeyParams),
    answers 201 => LeaseBody, "The lease with its capability";
    errors(AccountNotFound);
    400 "`invalid_units`, `invalid_ttl`, `units_out_of_range`, `invalid_idempotency_key` or bad body";
    409 "`insufficient_balance`, `expiry_out_of_range`, `counter_overflow` or `idempotency_key_reused`";
    |state, path AccountPath { account_id }, key idempotency, body body: AcquireRequest| {
        let now = state.now();
        let request = Acquisition { account_id: &account_id, units: body.units, ttl: body.ttl };
        let issued = match state.store().acquire_idempotent(idempotency.as_ref(), request, now).await {
            Err(refused @ Error::InsufficientBalance { .. }) => {
                webhooks::note_refusal(&state, &account_id, now).await;
                return Err(refused.into());
            }
            other => other?,
        };
        state.metrics().count_leases(LeaseEvent::Acquired, 1);
        json(StatusCode::CREATED, issued_lease_body(&issued))
    }
}

write_route! {
    /// Settles a lease of the account: returns what was not used, bills usage
    /// beyond the grant as overage. A lease of another account is
    /// `lease_not_found` and nothing changes.
    release: GatewayAuth, post "/v1/accounts/{account_id}/leases/{lease_id}/release", tag "leases",
    params(LeasePath, IdempotencyKeyParams),
    answers 200 => ReleaseResponse, "The settled lease and how it was split";
    errors(LeaseNotFound);
    400 "`invalid_idempotency_key` or bad body";
    409 "`capability_mismatch`, `lease_not_active`, `lease_expired` or `idempotency_key_reused`";
    |state, path LeasePath { account_id, lease_id }, key idempotency, body body: ReleaseRequest| {
        let request = Release { account_id: &account_id, lease_id: &lease_id, capability: &body.capability };
        let released = state.store().release_idempotent(idempotency.as_ref(), request, state.now()).await?;
        state.metrics().count_leases(LeaseEvent::Released, 1);
        let Settlement { charged, returned, excess } = released.settlement;
        json(StatusCode::OK, ReleaseResponse { lease: LeaseBody::from(&released.lease), charged, returned, excess })
    }
}

write_route! {
    /// Settles several leases of one account into one new lease of their returned
    /// units plus `extra_units`, all or nothing. Every source is looked up under
    /// the account: a lease of another account is `lease_not_found`.
    consolidate: GatewayAuth, post "/v1/accounts/{account_id}/leases/consolidate", tag "leases",
    params(AccountPath, IdempotencyKeyParams),
    answers 201 => ConsolidateResponse, "The new lease with its capability, and each source's settlement";
    400 "`no_source_leases`, `duplicate_source_lease`, `invalid_ttl`, `invalid_idempotency_key` or bad body";
    404 "`account_not_found` or `lease_not_found`";
    409 "`capability_mismatch`, `lease_not_active`, `lease_expired`, `insufficient_balance`, \
         `expiry_out_of_range` or `idempotency_key_reused`";
    |state, path AccountPath { account_id }, key idempotency, body body: ConsolidateRequest| {
        let sources: Vec<LeaseHandle> = body
            .leases
            .into_iter()
            .map(|handle| LeaseHandle { lease_id: handle.lease_id, capability: handle.capability })
            .collect();
        let (extra_units, ttl) = (body.extra_units, body.ttl);
        let request = Consolidation { account_id: &account_id, sources: &sources, extra_units, ttl };
        let consolidated = state.store().consolidate_idempotent(idempotency.as_ref(), request, state.now()).await?;
        state.metrics().count_leases(LeaseEvent::Consolidated, consolidated.settlements.len() as u64);
        state.metrics().count_leases(LeaseEvent::Acquired, 1);
        let settlements = consolidated
            .settlements
            .iter()
            .map(|(lease, settlement)| SettlementBody::new(&lease.lease_id, &lease.account_id, settlement))
            .collect();
        json(StatusCode::CREATED, ConsolidateResponse { lease: issued_lease_body(&consolidated.lease), settlements })
    }
}

write_route! {
    /// Classifies every event as accepted, duplicate or rejected, in input order,
    /// and applies the accepted ones. At most 10 000 events per batch.
    ingest: GatewayAuth, post "/v1/usage", tag "usage",
    answers 200 => IngestResponse, "One outcome per event, in input order";
    errors(BadBody);
    413 "`batch_too_large` or `payload_too_large`";
    422 "`batch_refused`: accepting the batch would overflow a counter; nothing was applied";
    500 "`storage_corrupt`";
    503 "`storage_unavailable` or `timeout`; retry";
    |state, body body: IngestRequest| {
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

write_route! {
    /// Runs one bounded reclaim pass now.
    reclaim: AdminAuth, post "/v1/admin/reclaim", tag "admin",
    answers 200 => ReclaimResponse, "What the pass settled; `full` means more may be due";
    errors(StorageUnavailable);
    |state| {
        let report = worker::reclaim_pass(&state).await?;
        json(StatusCode::OK, ReclaimResponse::from(&report))
    }
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
