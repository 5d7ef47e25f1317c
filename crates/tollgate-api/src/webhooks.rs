//! The wire shape of alert rules, webhook endpoints and their deliveries.
//!
//! A webhook secret is shown in two answers only: the one that creates its
//! endpoint and the one that rotates it. Every other body names the endpoint
//! without it.

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use tollgate_core::AlertRule;
use tollgate_store::{Delivery, IssuedEndpoint, WebhookEndpoint};
use utoipa::ToSchema;

/// A new alert rule of an account.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct CreateAlertRuleRequest {
    /// `available_below` (units), `available_below_percent` (1 to 100, of
    /// `credited`), `overage_above` (units) or `acquire_refused` (no
    /// threshold): `invalid_condition` otherwise.
    pub condition: String,
    #[serde(default)]
    pub threshold: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AlertRuleBody {
    pub rule_id: String,
    pub account_id: String,
    pub condition: String,
    pub threshold: Option<u64>,
    #[schema(value_type = String, format = DateTime)]
    pub created_at: Timestamp,
    /// The account's journal sequence number at creation: the rule judges
    /// only later changes.
    pub from_seq: u64,
    /// False for an `acquire_refused` rule that fired and waits for
    /// `available` to rise; true otherwise.
    pub armed: bool,
}

impl From<&AlertRule> for AlertRuleBody {
    fn from(rule: &AlertRule) -> Self {
        Self {
            rule_id: rule.rule_id.clone(),
            account_id: rule.account_id.clone(),
            condition: rule.condition.kind().to_owned(),
            threshold: rule.condition.threshold(),
            created_at: rule.created_at,
            from_seq: rule.from_seq,
            armed: rule.refused_at_seq.is_none(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AlertRulesBody {
    pub rules: Vec<AlertRuleBody>,
}

/// A new webhook endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct CreateWebhookRequest {
    /// An `http` or `https` URL with a host, at most 2048 bytes, without
    /// credentials or fragment (`invalid_webhook_url`).
    pub url: String,
    /// At least one of `balance.threshold_crossed`, `balance.recovered`,
    /// `overage.threshold_crossed`, `acquire.refused_insufficient_balance`,
    /// `lease.reclaimed`, `credit.received` (`invalid_event_types`).
    pub event_types: Vec<String>,
}

/// Rotates an endpoint's secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct RotateSecretRequest {
    /// How long the replaced secret still signs, in seconds: 0 to 604800
    /// (7 days); 86400 (a day) by default.
    #[serde(default)]
    pub overlap_seconds: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WebhookEndpointBody {
    pub endpoint_id: String,
    pub url: String,
    pub event_types: Vec<String>,
    #[schema(value_type = String, format = DateTime)]
    pub created_at: Timestamp,
    #[schema(value_type = Option<String>, format = DateTime)]
    pub rotated_at: Option<Timestamp>,
    /// Until when deliveries also carry a signature by the replaced secret.
    #[schema(value_type = Option<String>, format = DateTime)]
    pub previous_secret_until: Option<Timestamp>,
    /// The signing secret: present only in the answer that created or
    /// rotated it, and never shown again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
}

impl From<&WebhookEndpoint> for WebhookEndpointBody {
    fn from(endpoint: &WebhookEndpoint) -> Self {
        Self {
            endpoint_id: endpoint.endpoint_id.clone(),
            url: endpoint.url.clone(),
            event_types: endpoint.event_types.iter().map(|t| t.as_str().to_owned()).collect(),
            created_at: endpoint.created_at,
            rotated_at: endpoint.rotated_at,
            previous_secret_until: endpoint.previous_secret_until,
            secret: None,
        }
    }
}

impl From<&IssuedEndpoint> for WebhookEndpointBody {
    fn from(issued: &IssuedEndpoint) -> Self {
        Self { secret: Some(issued.secret.expose().to_owned()), ..Self::from(&issued.endpoint) }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WebhookEndpointsBody {
    pub endpoints: Vec<WebhookEndpointBody>,
}

/// One event's delivery to one endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DeliveryBody {
    pub delivery_id: String,
    pub endpoint_id: String,
    pub event_id: String,
    pub event_type: String,
    pub account_id: String,
    /// `pending`, `delivered` or `failed`.
    pub state: String,
    pub attempts: u32,
    #[schema(value_type = Option<String>, format = DateTime)]
    pub next_attempt_at: Option<Timestamp>,
    pub last_error: Option<String>,
    pub last_status: Option<u16>,
    #[schema(value_type = String, format = DateTime)]
    pub created_at: Timestamp,
    #[schema(value_type = Option<String>, format = DateTime)]
    pub delivered_at: Option<Timestamp>,
}

impl From<&Delivery> for DeliveryBody {
    fn from(delivery: &Delivery) -> Self {
        Self {
            delivery_id: delivery.delivery_id.clone(),
            endpoint_id: delivery.endpoint_id.clone(),
            event_id: delivery.event_id.clone(),
            event_type: delivery.event_type.as_str().to_owned(),
            account_id: delivery.account_id.clone(),
            state: delivery.state.as_str().to_owned(),
            attempts: delivery.attempts,
            next_attempt_at: delivery.next_attempt_at,
            last_error: delivery.last_error.clone(),
            last_status: delivery.last_status,
            created_at: delivery.created_at,
            delivered_at: delivery.delivered_at,
        }
    }
}
