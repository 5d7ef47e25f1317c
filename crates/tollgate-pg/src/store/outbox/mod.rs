//! Alert rules, webhook endpoints, events and their deliveries: the `Outbox`
//! contract on PostgreSQL (statements in `sql/outbox.rs`).
//!
//! The memory store derives an entry's events as it journals the entry. Here
//! the statements that journal are the hot path and derive nothing:
//! `derive_events` derives later, in order. It reads the entries after each
//! account's cursor and stores their events, their deliveries and the
//! advanced cursors in one transaction, so each entry is derived exactly
//! once. One server derives at a time, under an advisory lock that the others
//! skip rather than wait for. An account whose rows do not decode, or whose
//! entries do not apply to its cursor's counters, is skipped and named in a
//! warning, and the others are derived (`derive.rs`).
//!
//! Deriving late must not change what an entry emits, so each entry is judged
//! by the rules and endpoints of its time, as the memory store judges it: a
//! rule by the journal positions it existed between (`from_seq`, and
//! `deleted_seq` for a deleted rule, kept until the deriver passes it), an
//! endpoint by its creation time against the cause's (`Wanting`). A refused
//! acquire has no entry, and may come before the deriver reached the entry
//! that re-armed a rule, so a refusal reads the journal for that
//! (`REFUSAL_ACCOUNT_SQL`).
//!
//! Locks: refusals and derivations lock rules in account and then creation
//! order, and then share-lock the endpoints; deleting an endpoint locks it
//! and then its deliveries. Only creating a rule locks an account, and only
//! to insert that one rule; nothing here waits for a rule while holding an
//! account, so none of this waits in a cycle with the account writers.
//!
//! One concern per file: `rows.rs` decodes the rows, `rules.rs` keeps the
//! alert rules and fires them at refusals, `endpoints.rs` keeps the
//! endpoints, `derive.rs` derives the journal, `outgoing.rs` stores what a
//! derivation or a refusal decided, and `deliveries.rs` claims, finishes,
//! lists and redelivers deliveries. Here each operation is a line or two.

mod deliveries;
mod derive;
mod endpoints;
mod outgoing;
mod rows;
mod rules;

use async_trait::async_trait;
use jiff::Timestamp;
use tollgate_core::{AlertRule, Error, Page, PageRequest};
use tollgate_store::{
    ClaimedDelivery, Delivery, DeliveryClaim, FinishedAttempt, NewAlertRule, NewEndpoint, Outbox, OutboxCounts,
    SecretRotation, WebhookEndpoint,
};

use super::{Engine, PostgresStore};

/// Each operation in one line, on the engine.
#[async_trait]
impl Outbox for Engine {
    async fn create_alert_rule(&self, rule: NewAlertRule<'_>, now: Timestamp) -> Result<AlertRule, Error> {
        self.create_rule(rule, now).await
    }

    async fn alert_rules(&self, account_id: &str) -> Result<Vec<AlertRule>, Error> {
        self.rules_of(account_id).await
    }

    async fn delete_alert_rule(&self, account_id: &str, rule_id: &str) -> Result<(), Error> {
        self.delete_rule(account_id, rule_id).await
    }

    async fn create_endpoint(&self, endpoint: NewEndpoint<'_>, now: Timestamp) -> Result<WebhookEndpoint, Error> {
        self.add_endpoint(endpoint, now).await
    }

    async fn endpoints(&self) -> Result<Vec<WebhookEndpoint>, Error> {
        self.all_endpoints().await
    }

    async fn delete_endpoint(&self, endpoint_id: &str) -> Result<(), Error> {
        self.remove_endpoint(endpoint_id).await
    }

    async fn rotate_endpoint_secret(
        &self,
        rotation: SecretRotation<'_>,
        now: Timestamp,
    ) -> Result<WebhookEndpoint, Error> {
        self.rotate_secret(rotation, now).await
    }

    async fn note_refusal(&self, account_id: &str, now: Timestamp) -> Result<u32, Error> {
        self.refuse(account_id, now).await
    }

    async fn derive_events(&self, limit: u32) -> Result<u32, Error> {
        self.derive(limit).await
    }

    async fn claim_deliveries(&self, claim: DeliveryClaim<'_>, now: Timestamp) -> Result<Vec<ClaimedDelivery>, Error> {
        self.claim(claim, now).await
    }

    async fn finish_delivery(&self, finished: FinishedAttempt<'_>, now: Timestamp) -> Result<bool, Error> {
        self.finish_attempt(finished, now).await
    }

    async fn deliveries(&self, endpoint_id: &str, page: &PageRequest) -> Result<Page<Delivery>, Error> {
        self.deliveries_page(endpoint_id, page).await
    }

    async fn redeliver(&self, endpoint_id: &str, delivery_id: &str, now: Timestamp) -> Result<Delivery, Error> {
        self.deliver_again(endpoint_id, delivery_id, now).await
    }

    async fn outbox_counts(&self) -> Result<OutboxCounts, Error> {
        self.counts().await
    }
}

/// Each operation runs to completion in a task of its own (`complete`), like
/// every other operation of the store.
#[async_trait]
impl Outbox for PostgresStore {
    async fn create_alert_rule(&self, rule: NewAlertRule<'_>, now: Timestamp) -> Result<AlertRule, Error> {
        let NewAlertRule { account_id, condition } = rule;
        let account_id = account_id.to_owned();
        self.complete(move |e| async move {
            e.create_alert_rule(NewAlertRule { account_id: &account_id, condition }, now).await
        })
        .await
    }

    async fn alert_rules(&self, account_id: &str) -> Result<Vec<AlertRule>, Error> {
        let account_id = account_id.to_owned();
        self.complete(move |e| async move { e.alert_rules(&account_id).await }).await
    }

    async fn delete_alert_rule(&self, account_id: &str, rule_id: &str) -> Result<(), Error> {
        let (account_id, rule_id) = (account_id.to_owned(), rule_id.to_owned());
        self.complete(move |e| async move { e.delete_alert_rule(&account_id, &rule_id).await }).await
    }

    async fn create_endpoint(&self, endpoint: NewEndpoint<'_>, now: Timestamp) -> Result<WebhookEndpoint, Error> {
        let NewEndpoint { url, event_types, sealed_secret } = endpoint;
        let (url, event_types) = (url.to_owned(), event_types.to_vec());
        self.complete(move |e| async move {
            e.create_endpoint(NewEndpoint { url: &url, event_types: &event_types, sealed_secret }, now).await
        })
        .await
    }

    async fn endpoints(&self) -> Result<Vec<WebhookEndpoint>, Error> {
        self.complete(move |e| async move { e.endpoints().await }).await
    }

    async fn delete_endpoint(&self, endpoint_id: &str) -> Result<(), Error> {
        let endpoint_id = endpoint_id.to_owned();
        self.complete(move |e| async move { e.delete_endpoint(&endpoint_id).await }).await
    }

    async fn rotate_endpoint_secret(
        &self,
        rotation: SecretRotation<'_>,
        now: Timestamp,
    ) -> Result<WebhookEndpoint, Error> {
        let SecretRotation { endpoint_id, sealed_secret, previous_until } = rotation;
        let endpoint_id = endpoint_id.to_owned();
        self.complete(move |e| async move {
            e.rotate_endpoint_secret(SecretRotation { endpoint_id: &endpoint_id, sealed_secret, previous_until }, now)
                .await
        })
        .await
    }

    async fn note_refusal(&self, account_id: &str, now: Timestamp) -> Result<u32, Error> {
        let account_id = account_id.to_owned();
        self.complete(move |e| async move { e.note_refusal(&account_id, now).await }).await
    }

    async fn derive_events(&self, limit: u32) -> Result<u32, Error> {
        self.complete(move |e| async move { e.derive_events(limit).await }).await
    }

    async fn claim_deliveries(&self, claim: DeliveryClaim<'_>, now: Timestamp) -> Result<Vec<ClaimedDelivery>, Error> {
        let DeliveryClaim { limit, claim_for, skip } = claim;
        let skip = skip.to_vec();
        self.complete(
            move |e| async move { e.claim_deliveries(DeliveryClaim { limit, claim_for, skip: &skip }, now).await },
        )
        .await
    }

    async fn finish_delivery(&self, finished: FinishedAttempt<'_>, now: Timestamp) -> Result<bool, Error> {
        let FinishedAttempt { delivery_id, attempt, result } = finished;
        let delivery_id = delivery_id.to_owned();
        self.complete(move |e| async move {
            e.finish_delivery(FinishedAttempt { delivery_id: &delivery_id, attempt, result }, now).await
        })
        .await
    }

    async fn deliveries(&self, endpoint_id: &str, page: &PageRequest) -> Result<Page<Delivery>, Error> {
        let (endpoint_id, page) = (endpoint_id.to_owned(), page.clone());
        self.complete(move |e| async move { e.deliveries(&endpoint_id, &page).await }).await
    }

    async fn redeliver(&self, endpoint_id: &str, delivery_id: &str, now: Timestamp) -> Result<Delivery, Error> {
        let (endpoint_id, delivery_id) = (endpoint_id.to_owned(), delivery_id.to_owned());
        self.complete(move |e| async move { e.redeliver(&endpoint_id, &delivery_id, now).await }).await
    }

    async fn outbox_counts(&self) -> Result<OutboxCounts, Error> {
        self.complete(move |e| async move { e.outbox_counts().await }).await
    }
}
