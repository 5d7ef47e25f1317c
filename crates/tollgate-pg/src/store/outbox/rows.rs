//! The outbox's rows and their decoding into the core's and the store's
//! types. A row that does not decode is `storage_corrupt`, naming the row.

use jiff::Timestamp;
use sqlx::FromRow;
use tollgate_core::{AlertRule, Condition, Error, Event, EventType, InstantPair};
use tollgate_store::{ClaimedDelivery, Delivery, DeliveryState, WebhookEndpoint};

use crate::store::errors::corrupt;

fn instant(what: &str, floor_us: i64, submicro_ns: i16) -> Result<Timestamp, Error> {
    InstantPair::decode(floor_us, i64::from(submicro_ns)).map_err(|error| corrupt(format!("{what}: {error}")))
}

fn optional_instant(what: &str, floor_us: Option<i64>, submicro_ns: Option<i16>) -> Result<Option<Timestamp>, Error> {
    match (floor_us, submicro_ns) {
        (None, None) => Ok(None),
        (Some(floor_us), Some(submicro_ns)) => instant(what, floor_us, submicro_ns).map(Some),
        _ => Err(corrupt(format!("{what} has only one of its two columns"))),
    }
}

/// A stored value the core holds as `u64` (a sequence number, a threshold).
pub(super) fn nonnegative(what: &str, value: i64) -> Result<u64, Error> {
    u64::try_from(value).map_err(|_| corrupt(format!("{what} is {value}")))
}

fn event_types(what: &str, names: &[String]) -> Result<Vec<EventType>, Error> {
    names
        .iter()
        .map(|name| EventType::parse(name).ok_or_else(|| corrupt(format!("{what}: event type {name:?}"))))
        .collect()
}

/// A count bound (`RULES_PER_ACCOUNT_MAX`, `ENDPOINTS_MAX`, a page's rows)
/// as a `BIGINT` parameter.
pub(super) fn bound(max: usize) -> i64 {
    i64::try_from(max).unwrap_or(i64::MAX)
}

#[derive(FromRow)]
pub(super) struct RuleRow {
    account_id: String,
    rule_id: String,
    kind: String,
    threshold: Option<i64>,
    created_floor_us: i64,
    created_submicro_ns: i16,
    from_seq: i64,
    refused_at_seq: Option<i64>,
    deleted_seq: Option<i64>,
}

/// A rule as the deriver judges entries by it: deleted rules judge the
/// entries up to their deletion.
pub(super) struct StoredRule {
    pub(super) rule: AlertRule,
    deleted_seq: Option<u64>,
}

impl StoredRule {
    /// Whether the rule existed when entry `seq` was made (its creation is
    /// `AlertRule::from_seq`'s concern).
    pub(super) fn judges(&self, seq: u64) -> bool {
        self.deleted_seq.is_none_or(|deleted| seq <= deleted)
    }
}

impl RuleRow {
    /// The account the rule is of, even when the rest does not decode.
    pub(super) fn account_id(&self) -> &str {
        &self.account_id
    }

    pub(super) fn stored(self) -> Result<StoredRule, Error> {
        let deleted_seq = self
            .deleted_seq
            .map(|seq| nonnegative(&format!("alert rule {}/{}: deleted_seq", self.account_id, self.rule_id), seq))
            .transpose()?;
        Ok(StoredRule { rule: self.decode()?, deleted_seq })
    }

    pub(super) fn decode(self) -> Result<AlertRule, Error> {
        let what = format!("alert rule {}/{}", self.account_id, self.rule_id);
        let threshold = self.threshold.map(|value| nonnegative(&format!("{what}: threshold"), value)).transpose()?;
        let condition = Condition::parse(&self.kind, threshold)
            .map_err(|_| corrupt(format!("{what}: kind {:?} with threshold {:?}", self.kind, self.threshold)))?;
        let created_at = instant(&format!("{what}: created"), self.created_floor_us, self.created_submicro_ns)?;
        let from_seq = nonnegative(&format!("{what}: from_seq"), self.from_seq)?;
        let refused_at_seq =
            self.refused_at_seq.map(|seq| nonnegative(&format!("{what}: refused_at_seq"), seq)).transpose()?;
        Ok(AlertRule {
            rule_id: self.rule_id,
            account_id: self.account_id,
            condition,
            created_at,
            from_seq,
            refused_at_seq,
        })
    }
}

#[derive(FromRow)]
pub(super) struct EndpointRow {
    endpoint_id: String,
    url: String,
    event_types: Vec<String>,
    created_floor_us: i64,
    created_submicro_ns: i16,
    rotated_floor_us: Option<i64>,
    rotated_submicro_ns: Option<i16>,
    previous_secret_until_floor_us: Option<i64>,
    previous_secret_until_submicro_ns: Option<i16>,
}

impl EndpointRow {
    pub(super) fn decode(self) -> Result<WebhookEndpoint, Error> {
        let what = format!("webhook endpoint {}", self.endpoint_id);
        Ok(WebhookEndpoint {
            event_types: event_types(&what, &self.event_types)?,
            created_at: instant(&format!("{what}: created"), self.created_floor_us, self.created_submicro_ns)?,
            rotated_at: optional_instant(&format!("{what}: rotated"), self.rotated_floor_us, self.rotated_submicro_ns)?,
            previous_secret_until: optional_instant(
                &format!("{what}: previous_secret_until"),
                self.previous_secret_until_floor_us,
                self.previous_secret_until_submicro_ns,
            )?,
            endpoint_id: self.endpoint_id,
            url: self.url,
        })
    }
}

/// An endpoint as fanning out needs it: which event types it asks for, and
/// since when (`alerts::endpoint_wants`: derivation here may come long after
/// the cause, the memory store's never does, and both send the same events).
pub(super) struct Wanting {
    pub(super) endpoint_id: String,
    event_types: Vec<EventType>,
    created_at: Timestamp,
}

impl Wanting {
    pub(super) fn wants(&self, event: &Event) -> bool {
        tollgate_core::alerts::endpoint_wants(&self.event_types, self.created_at, event)
    }
}

#[derive(FromRow)]
pub(super) struct WantingRow {
    endpoint_id: String,
    event_types: Vec<String>,
    created_floor_us: i64,
    created_submicro_ns: i16,
}

impl WantingRow {
    pub(super) fn decode(self) -> Result<Wanting, Error> {
        let what = format!("webhook endpoint {}", self.endpoint_id);
        let event_types = event_types(&what, &self.event_types)?;
        let created_at = instant(&format!("{what}: created"), self.created_floor_us, self.created_submicro_ns)?;
        Ok(Wanting { endpoint_id: self.endpoint_id, event_types, created_at })
    }
}

#[derive(FromRow)]
pub(super) struct DeliveryRow {
    account_id: String,
    delivery_id: String,
    endpoint_id: String,
    event_id: String,
    event_type: String,
    state: String,
    attempts: i32,
    next_attempt_floor_us: Option<i64>,
    next_attempt_submicro_ns: Option<i16>,
    last_error: Option<String>,
    last_status: Option<i32>,
    created_floor_us: i64,
    created_submicro_ns: i16,
    delivered_floor_us: Option<i64>,
    delivered_submicro_ns: Option<i16>,
}

impl DeliveryRow {
    pub(super) fn decode(self) -> Result<Delivery, Error> {
        let what = format!("webhook delivery {}", self.delivery_id);
        let bad = |detail: String| corrupt(format!("{what}: {detail}"));
        let state = DeliveryState::parse(&self.state).ok_or_else(|| bad(format!("state {:?}", self.state)))?;
        let event_type =
            EventType::parse(&self.event_type).ok_or_else(|| bad(format!("event type {:?}", self.event_type)))?;
        let attempts = u32::try_from(self.attempts).map_err(|_| bad(format!("attempts is {}", self.attempts)))?;
        let last_status = self
            .last_status
            .map(|status| u16::try_from(status).map_err(|_| bad(format!("last_status is {status}"))))
            .transpose()?;
        let next_attempt_at = optional_instant(
            &format!("{what}: next attempt"),
            self.next_attempt_floor_us,
            self.next_attempt_submicro_ns,
        )?;
        Ok(Delivery {
            state,
            event_type,
            attempts,
            // Only a pending delivery is due again.
            next_attempt_at: next_attempt_at.filter(|_| state == DeliveryState::Pending),
            last_status,
            created_at: instant(&format!("{what}: created"), self.created_floor_us, self.created_submicro_ns)?,
            delivered_at: optional_instant(
                &format!("{what}: delivered"),
                self.delivered_floor_us,
                self.delivered_submicro_ns,
            )?,
            last_error: self.last_error,
            delivery_id: self.delivery_id,
            endpoint_id: self.endpoint_id,
            event_id: self.event_id,
            account_id: self.account_id,
        })
    }
}

/// A claimed delivery with what its attempt sends. Holds sealed secrets:
/// deliberately not `Debug`.
#[derive(FromRow)]
pub(super) struct ClaimRow {
    delivery_id: String,
    endpoint_id: String,
    event_id: String,
    attempts: i32,
    created_floor_us: i64,
    created_submicro_ns: i16,
    url: String,
    secret: Vec<u8>,
    previous_secret: Option<Vec<u8>>,
    body: String,
}

impl ClaimRow {
    pub(super) fn decode(self) -> Result<ClaimedDelivery, Error> {
        let what = format!("webhook delivery {}", self.delivery_id);
        let attempt =
            u32::try_from(self.attempts).map_err(|_| corrupt(format!("{what}: attempts is {}", self.attempts)))?;
        Ok(ClaimedDelivery {
            attempt,
            created_at: instant(&format!("{what}: created"), self.created_floor_us, self.created_submicro_ns)?,
            sealed_secrets: std::iter::once(self.secret).chain(self.previous_secret).collect(),
            delivery_id: self.delivery_id,
            endpoint_id: self.endpoint_id,
            event_id: self.event_id,
            url: self.url,
            body: self.body,
        })
    }
}
