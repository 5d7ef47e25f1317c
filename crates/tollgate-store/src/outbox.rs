//! Alert rules, webhook endpoints and the delivery outbox: the contract every
//! store implements, and what both stores share.
//!
//! Events are derived from the account journal by `tollgate_core::alerts`.
//! The memory store derives an entry's events in the same critical section
//! that journals it; PostgreSQL derives them from the journal after commit,
//! in order, under a per-account cursor advanced in the same transaction that
//! stores the events, so each entry is derived exactly once. An event is kept
//! only when an endpoint asks for its type: it is kept once, with one
//! delivery per such endpoint.
//!
//! A delivery is attempted at least once. A server claims a due delivery by
//! numbering its next attempt and moving its next-attempt time past the
//! attempt's timeout, in one atomic step, so no two servers make the same
//! attempt; the attempt's result is recorded only by the claim that made it.
//! A server that dies mid-attempt leaves the delivery due again once the claim
//! lapses. Order across deliveries is not promised.

use async_trait::async_trait;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use jiff::Timestamp;
use serde_json::json;
use tollgate_core::alerts::{Derived, EntryView, derive, endpoint_wants};
use tollgate_core::{AlertRule, COUNTER_NAMES, COUNTERS, Error, Event, EventType, Page, PageRequest, Secret};

use crate::requests::{DeliveryClaim, FinishedAttempt, NewAlertRule, NewEndpoint, SecretRotation};

/// A webhook endpoint: where events of its types are sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookEndpoint {
    pub endpoint_id: String,
    pub url: String,
    pub event_types: Vec<EventType>,
    pub created_at: Timestamp,
    /// When the secret was last rotated.
    pub rotated_at: Option<Timestamp>,
    /// Until when deliveries are also signed with the secret before the last
    /// rotation.
    pub previous_secret_until: Option<Timestamp>,
}

impl WebhookEndpoint {
    /// Whether this endpoint receives `event` (`alerts::endpoint_wants`).
    pub fn wants(&self, event: &Event) -> bool {
        endpoint_wants(&self.event_types, self.created_at, event)
    }
}

/// A new endpoint and its secret, which is shown only here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssuedEndpoint {
    pub endpoint: WebhookEndpoint,
    pub secret: Secret,
}

/// Where a delivery stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryState {
    /// Not yet delivered; attempted again at `next_attempt_at`.
    Pending,
    Delivered,
    /// Given up: every attempt until the give-up time failed.
    Failed,
}

impl DeliveryState {
    pub const ALL: [DeliveryState; 3] = [DeliveryState::Pending, DeliveryState::Delivered, DeliveryState::Failed];

    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryState::Pending => "pending",
            DeliveryState::Delivered => "delivered",
            DeliveryState::Failed => "failed",
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|state| state.as_str() == value)
    }
}

/// One event's delivery to one endpoint, as the delivery log shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub delivery_id: String,
    pub endpoint_id: String,
    pub event_id: String,
    pub event_type: EventType,
    pub account_id: String,
    pub state: DeliveryState,
    /// Attempts made or under way.
    pub attempts: u32,
    /// For a pending delivery, when it is next due.
    pub next_attempt_at: Option<Timestamp>,
    pub last_error: Option<String>,
    /// The HTTP status of the last attempt that got a response.
    pub last_status: Option<u16>,
    pub created_at: Timestamp,
    pub delivered_at: Option<Timestamp>,
}

/// A delivery a server claimed for one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimedDelivery {
    pub delivery_id: String,
    pub endpoint_id: String,
    pub event_id: String,
    /// The attempt this claim makes, 1 for the first.
    pub attempt: u32,
    pub url: String,
    /// The endpoint's sealed secrets to sign with: the current one, then the
    /// previous one while its overlap lasts.
    pub sealed_secrets: Vec<Vec<u8>>,
    /// The event as JSON, exactly as it is sent.
    pub body: String,
    pub created_at: Timestamp,
}

/// What an attempt came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptResult {
    Delivered {
        status: u16,
    },
    /// Failed; due again at `at`.
    Retry {
        at: Timestamp,
        error: String,
        status: Option<u16>,
    },
    /// Failed past the give-up time.
    Failed {
        error: String,
        status: Option<u16>,
    },
}

/// How many deliveries are in each state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OutboxCounts {
    pub pending: u64,
    pub delivered: u64,
    pub failed: u64,
}

/// Alert rules, endpoints, event derivation and deliveries, with the same
/// contract on every store.
#[async_trait]
pub trait Outbox: Send + Sync {
    /// A rule of `rule.account_id`, judging the account's journal entries
    /// after its current one. At most `RULES_PER_ACCOUNT_MAX` per account.
    async fn create_alert_rule(&self, rule: NewAlertRule<'_>, now: Timestamp) -> Result<AlertRule, Error>;
    /// The rules of `account_id`, oldest first.
    async fn alert_rules(&self, account_id: &str) -> Result<Vec<AlertRule>, Error>;
    async fn delete_alert_rule(&self, account_id: &str, rule_id: &str) -> Result<(), Error>;

    /// An endpoint for its `event_types` at its `url`, whose secret the caller
    /// sealed. At most `ENDPOINTS_MAX`.
    async fn create_endpoint(&self, endpoint: NewEndpoint<'_>, now: Timestamp) -> Result<WebhookEndpoint, Error>;
    /// Every endpoint, oldest first.
    async fn endpoints(&self) -> Result<Vec<WebhookEndpoint>, Error>;
    /// Deletes an endpoint and all its deliveries.
    async fn delete_endpoint(&self, endpoint_id: &str) -> Result<(), Error>;
    /// Replaces an endpoint's secret; the one it replaces still signs until
    /// `previous_until`.
    async fn rotate_endpoint_secret(
        &self,
        rotation: SecretRotation<'_>,
        now: Timestamp,
    ) -> Result<WebhookEndpoint, Error>;

    /// Records a refused acquire of `account_id`: each armed `acquire_refused`
    /// rule fires once and is disarmed. Returns how many events it emitted.
    async fn note_refusal(&self, account_id: &str, now: Timestamp) -> Result<u32, Error>;
    /// Derives the events of up to `limit` journal entries not yet derived.
    /// Returns how many entries it derived; fewer than `limit` means none
    /// that can be derived are left. An account whose entries do not apply
    /// to its cursor is skipped, logged, and derived once repaired, so it
    /// never stops the others. A store that derives as it journals derives
    /// nothing here.
    async fn derive_events(&self, limit: u32) -> Result<u32, Error>;
    /// Claims up to the claim's `limit` deliveries due at `now` for one
    /// attempt each, earliest due first, passing over those of the endpoints
    /// in its `skip`, making them due again at `now + claim_for` unless the
    /// attempt's result is recorded first.
    async fn claim_deliveries(&self, claim: DeliveryClaim<'_>, now: Timestamp) -> Result<Vec<ClaimedDelivery>, Error>;
    /// Records the result of the finished attempt. Returns false, recording
    /// nothing, when that attempt is no longer the delivery's latest (its claim
    /// lapsed and another attempt began) or the delivery is gone.
    async fn finish_delivery(&self, finished: FinishedAttempt<'_>, now: Timestamp) -> Result<bool, Error>;
    /// An endpoint's deliveries, oldest first (by delivery id).
    async fn deliveries(&self, endpoint_id: &str, page: &PageRequest) -> Result<Page<Delivery>, Error>;
    /// Makes a delivery of `endpoint_id` due now, whatever its state; its
    /// attempts keep counting.
    async fn redeliver(&self, endpoint_id: &str, delivery_id: &str, now: Timestamp) -> Result<Delivery, Error>;
    async fn outbox_counts(&self) -> Result<OutboxCounts, Error>;
}

/// Derives `entries` (consecutive entries of one account) from the
/// counters `before` the first, under the account's `rules`, re-arming
/// rules as entries re-arm them. Returns the counters after the last entry
/// and the events, in entry order.
pub fn derive_entries<E: EntryView>(
    rules: &mut [AlertRule],
    mut before: [u64; COUNTERS],
    entries: &[E],
) -> Result<([u64; COUNTERS], Vec<Event>), Error> {
    let mut events = Vec::new();
    for entry in entries {
        let Derived { after, events: derived, rearmed } = derive(rules, &before, entry)?;
        for rule in rules.iter_mut().filter(|rule| rearmed.contains(&rule.rule_id)) {
            rule.refused_at_seq = None;
        }
        events.extend(derived);
        before = after;
    }
    Ok((before, events))
}

/// The JSON body a webhook receives for `event`.
pub fn event_body(event: &Event) -> String {
    let counters: serde_json::Map<String, serde_json::Value> =
        COUNTER_NAMES.iter().zip(event.counters).map(|(name, value)| ((*name).to_owned(), json!(value))).collect();
    json!({
        "id": event.event_id,
        "type": event.event_type.as_str(),
        "created_at": event.at.to_string(),
        "account_id": event.account_id,
        "journal_seq": event.journal_seq,
        "rule_id": event.rule_id,
        "lease_id": event.lease_id,
        "credit_id": event.credit_id,
        "units": event.units,
        "account": counters,
    })
    .to_string()
}

/// A new delivery id: `dlv_`, the creation time in nanoseconds since the
/// epoch (0 before it) and 64 random bits, so that ids sort by creation.
pub fn new_delivery_id(now: Timestamp) -> String {
    let nanos = u128::try_from(now.as_nanosecond()).unwrap_or(0);
    format!("dlv_{nanos:024x}{:016x}", rand::random::<u64>())
}

pub fn new_rule_id() -> String {
    format!("rule_{}", uuid::Uuid::new_v4().simple())
}

pub fn new_endpoint_id() -> String {
    format!("whe_{}", uuid::Uuid::new_v4().simple())
}

/// A webhook signing secret: `whsec_` and 256 random bits in hex.
pub fn new_webhook_secret() -> Secret {
    Secret::new(crate::secrets::random_hex_after("whsec_"))
}

const NONCE_BYTES: usize = 24;
const SEAL_CONTEXT: &[u8] = b"tollgate webhook secret v1";

/// The key webhook secrets are sealed with at rest (XChaCha20-Poly1305):
/// signing needs the secret itself, so it cannot be kept as a hash.
#[derive(Clone)]
pub struct WebhookKey([u8; 32]);

impl WebhookKey {
    /// A key from 64 hex digits.
    pub fn from_hex(hex_digits: &str) -> Option<Self> {
        let mut key = [0u8; 32];
        hex::decode_to_slice(hex_digits.trim(), &mut key).ok()?;
        Some(Self(key))
    }

    /// A random key, for a store whose secrets die with the process.
    pub fn random() -> Self {
        Self(rand::random())
    }

    fn cipher(&self) -> XChaCha20Poly1305 {
        XChaCha20Poly1305::new_from_slice(&self.0).expect("a 32-byte key")
    }

    /// `secret`, encrypted and authenticated: a random nonce, then the
    /// ciphertext.
    pub fn seal(&self, secret: &Secret) -> Vec<u8> {
        let nonce_bytes: [u8; NONCE_BYTES] = rand::random();
        let sealed = self
            .cipher()
            .encrypt(&XNonce::from(nonce_bytes), Payload { msg: secret.expose().as_bytes(), aad: SEAL_CONTEXT })
            .expect("encryption of a bounded message cannot fail");
        [nonce_bytes.as_slice(), &sealed].concat()
    }

    /// The secret `sealed` holds, or `storage_corrupt` when it does not open
    /// under this key (another key, or altered bytes).
    pub fn open(&self, sealed: &[u8]) -> Result<Vec<u8>, Error> {
        let unreadable = || Error::StorageCorrupt("a webhook secret does not open under this server's key".into());
        if sealed.len() < NONCE_BYTES {
            return Err(unreadable());
        }
        let (nonce, ciphertext) = sealed.split_at(NONCE_BYTES);
        let nonce = XNonce::try_from(nonce).map_err(|_| unreadable())?;
        self.cipher().decrypt(&nonce, Payload { msg: ciphertext, aad: SEAL_CONTEXT }).map_err(|_| unreadable())
    }
}

impl std::fmt::Debug for WebhookKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WebhookKey(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_secret_opens_only_under_its_key() {
        let key = WebhookKey::random();
        let secret = new_webhook_secret();
        let sealed = key.seal(&secret);
        assert_eq!(key.open(&sealed).unwrap(), secret.expose().as_bytes());
        assert!(WebhookKey::random().open(&sealed).is_err());
        let mut altered = sealed.clone();
        *altered.last_mut().unwrap() ^= 1;
        assert!(key.open(&altered).is_err());
        assert!(!String::from_utf8_lossy(&sealed).contains(secret.expose()));
    }

    #[test]
    fn delivery_ids_sort_by_creation() {
        let early = new_delivery_id(Timestamp::from_second(1_000).unwrap());
        let late = new_delivery_id(Timestamp::from_second(1_001).unwrap());
        assert!(early < late);
    }

    #[test]
    fn keys_parse_from_64_hex_digits_only() {
        assert!(WebhookKey::from_hex(&"ab".repeat(32)).is_some());
        assert!(WebhookKey::from_hex(&"ab".repeat(31)).is_none());
        assert!(WebhookKey::from_hex(&"zz".repeat(32)).is_none());
    }
}
