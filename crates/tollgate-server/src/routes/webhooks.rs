//! Alert rules, webhook endpoints and their delivery logs (admin routes),
//! and the hook that reports refused acquires to the outbox.
//!
//! An endpoint's secret is generated here, sealed with the server's webhook
//! key before the store sees it, and shown in the one answer that created
//! (or rotated) it.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use jiff::{SignedDuration, Timestamp};
use tollgate_api::{
    AlertRuleBody, AlertRulesBody, CreateAlertRuleRequest, CreateWebhookRequest, DeliveryBody, PageBody,
    RotateSecretRequest, WebhookEndpointBody, WebhookEndpointsBody,
};
use tollgate_core::alerts::validate_url;
use tollgate_core::{Condition, Error, EventType};
use tollgate_store::{IssuedEndpoint, NewAlertRule, NewEndpoint, SecretRotation, WebhookKey, new_webhook_secret};

use super::listings::PageParams;
use super::params::{AccountPath, DeliveryPath, EndpointPath, RulePath};
use super::reads::read_route;
use super::responses::{AccountNotFound, EndpointNotFound, PageRefused};
use super::writes::write_route;
use super::{ApiResult, json};
use crate::AppState;
use crate::auth::AdminAuth;

/// How long a replaced secret still signs unless the request says.
const OVERLAP_DEFAULT_S: u64 = 86_400;
/// The longest overlap a rotation may ask for: a week.
const OVERLAP_MAX_S: u64 = 7 * 86_400;

/// Reports a refused acquire to the outbox. The refusal is the answer
/// either way: a failure to record it is logged, never returned.
pub(crate) async fn note_refusal(state: &AppState, account_id: &str, now: Timestamp) {
    if let Err(error) = state.store().note_refusal(account_id, now).await {
        tracing::warn!(code = error.code(), %error, "cannot record a refused acquire for alert rules");
    }
}

fn key(state: &AppState) -> Result<&WebhookKey, Error> {
    state.webhooks().key.as_ref().ok_or(Error::WebhookKeyMissing)
}

write_route! {
    /// Creates an alert rule of the account. It judges only changes after its
    /// creation: it fires once when its condition becomes true, and a balance
    /// rule emits `balance.recovered` once when it becomes false again.
    create_alert_rule: AdminAuth, post "/v1/accounts/{account_id}/alert-rules", tag "alerts",
    params(AccountPath),
    answers 201 => AlertRuleBody, "The new rule";
    errors(AccountNotFound);
    400 "`invalid_condition` or bad body";
    409 "`too_many_rules`: at most 20 per account";
    |state, path AccountPath { account_id }, body body: CreateAlertRuleRequest| {
        let condition = Condition::parse(&body.condition, body.threshold)?;
        let request = NewAlertRule { account_id: &account_id, condition };
        let rule = state.store().create_alert_rule(request, state.now()).await?;
        json(StatusCode::CREATED, AlertRuleBody::from(&rule))
    }
}

read_route! {
    /// The account's alert rules, oldest first.
    list_alert_rules: AdminAuth, "/v1/accounts/{account_id}/alert-rules", tag "alerts",
    params(AccountPath),
    responses((status = 200, description = "The rules", body = AlertRulesBody), AccountNotFound),
    |state, AccountPath { account_id }| {
        let rules = state.store().alert_rules(&account_id).await?;
        AlertRulesBody { rules: rules.iter().map(AlertRuleBody::from).collect() }
    }
}

write_route! {
    /// Deletes an alert rule; it emits nothing more.
    delete_alert_rule: AdminAuth, delete "/v1/accounts/{account_id}/alert-rules/{rule_id}", tag "alerts",
    params(RulePath),
    answers 204, "Deleted";
    404 "`account_not_found` or `rule_not_found`";
    |state, path RulePath { account_id, rule_id }| {
        state.store().delete_alert_rule(&account_id, &rule_id).await?;
        Ok(StatusCode::NO_CONTENT.into_response())
    }
}

write_route! {
    /// Creates a webhook endpoint. The answer shows its signing secret, once.
    /// Events whose cause is older than the endpoint are not sent to it.
    create_endpoint: AdminAuth, post "/v1/webhooks", tag "webhooks",
    answers 201 => WebhookEndpointBody, "The new endpoint with its secret";
    400 "`invalid_webhook_url`, `invalid_event_types` or bad body";
    409 "`too_many_endpoints` (at most 50) or `webhook_key_missing`";
    |state, body body: CreateWebhookRequest| {
        validate_url(&body.url)?;
        let event_types = EventType::parse_list(body.event_types.iter().map(String::as_str))?;
        let secret = new_webhook_secret();
        let sealed_secret = key(&state)?.seal(&secret);
        let request = NewEndpoint { url: &body.url, event_types: &event_types, sealed_secret };
        let endpoint = state.store().create_endpoint(request, state.now()).await?;
        json(StatusCode::CREATED, WebhookEndpointBody::from(&IssuedEndpoint { endpoint, secret }))
    }
}

/// Every webhook endpoint, oldest first, without secrets.
#[utoipa::path(
    get, path = "/v1/webhooks", tag = "webhooks",
    responses((status = 200, description = "The endpoints", body = WebhookEndpointsBody)),
)]
pub(crate) async fn list_endpoints(_: AdminAuth, State(state): State<AppState>) -> ApiResult {
    let endpoints = state.store().endpoints().await?;
    json(StatusCode::OK, WebhookEndpointsBody { endpoints: endpoints.iter().map(WebhookEndpointBody::from).collect() })
}

write_route! {
    /// Deletes an endpoint with its deliveries; nothing more is sent to it.
    delete_endpoint: AdminAuth, delete "/v1/webhooks/{endpoint_id}", tag "webhooks",
    params(EndpointPath),
    answers 204, "Deleted";
    errors(EndpointNotFound);
    |state, path EndpointPath { endpoint_id }| {
        state.store().delete_endpoint(&endpoint_id).await?;
        Ok(StatusCode::NO_CONTENT.into_response())
    }
}

write_route! {
    /// Replaces the endpoint's secret and shows the new one, once. Until the
    /// overlap ends, each delivery carries a signature by each secret, so a
    /// receiver can switch without refusing a delivery.
    rotate_secret: AdminAuth, post "/v1/webhooks/{endpoint_id}/rotate-secret", tag "webhooks",
    params(EndpointPath),
    answers 200 => WebhookEndpointBody, "The endpoint with its new secret";
    errors(EndpointNotFound);
    400 "`invalid_overlap` or bad body";
    409 "`webhook_key_missing`";
    |state, path EndpointPath { endpoint_id }, body body: RotateSecretRequest| {
        let overlap = body.overlap_seconds.unwrap_or(OVERLAP_DEFAULT_S);
        if overlap > OVERLAP_MAX_S {
            return Err(Error::InvalidOverlap { max: OVERLAP_MAX_S }.into());
        }
        let now = state.now();
        let previous_until =
            now.checked_add(SignedDuration::from_secs(overlap.cast_signed())).unwrap_or(Timestamp::MAX);
        let secret = new_webhook_secret();
        let sealed_secret = key(&state)?.seal(&secret);
        let rotation = SecretRotation { endpoint_id: &endpoint_id, sealed_secret, previous_until };
        let endpoint = state.store().rotate_endpoint_secret(rotation, now).await?;
        json(StatusCode::OK, WebhookEndpointBody::from(&IssuedEndpoint { endpoint, secret }))
    }
}

read_route! {
    /// The endpoint's deliveries, oldest first: each one's state, attempts,
    /// last error and next attempt.
    list_deliveries: AdminAuth, "/v1/webhooks/{endpoint_id}/deliveries", tag "webhooks",
    EndpointPath { endpoint_id }, EndpointNotFound,
    "One page of deliveries" => PageBody<DeliveryBody>, deliveries
}

write_route! {
    /// Makes a delivery due now, whatever its state: the event is sent again,
    /// with the same event id for the receiver's dedupe.
    redeliver: AdminAuth, post "/v1/webhooks/{endpoint_id}/deliveries/{delivery_id}/redeliver", tag "webhooks",
    params(DeliveryPath),
    answers 202 => DeliveryBody, "The delivery, due now";
    404 "`delivery_not_found`";
    |state, path DeliveryPath { endpoint_id, delivery_id }| {
        let delivery = state.store().redeliver(&endpoint_id, &delivery_id, state.now()).await?;
        json(StatusCode::ACCEPTED, DeliveryBody::from(&delivery))
    }
}
