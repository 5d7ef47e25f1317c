//! The memory store's alert rules, endpoints and deliveries.
//!
//! Events are derived in the critical section that journals their entry
//! ([`OutboxState::derive`]), from the counters before the entry, so the
//! outbox and the change it reports are one step. An account's rules are
//! kept beside its counters (`AccountRecord`). Deriving is skipped while
//! there is no rule of the account and no endpoint at all, and for an entry
//! the core calls silent under the account's rules (`alerts::is_silent`: it
//! moves no counter a rule reads, re-arms no rule and is neither a credit
//! nor a reclaim): either way it could emit nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use async_trait::async_trait;
use jiff::{SignedDuration, Timestamp};
use tollgate_core::alerts::{
    ENDPOINTS_MAX, EntryView, RULES_PER_ACCOUNT_MAX, is_silent, refusal_events, validate_endpoint,
};
use tollgate_core::{AlertRule, COUNTERS, Error, Event, Listing, Page, PageRequest};

use super::journal::StoredEntry;
use super::{MemoryStore, State};
use crate::outbox::{
    AttemptResult, ClaimedDelivery, Delivery, DeliveryState, Outbox, OutboxCounts, WebhookEndpoint, derive_entries,
    event_body, new_delivery_id, new_endpoint_id, new_rule_id,
};
use crate::requests::{DeliveryClaim, FinishedAttempt, NewAlertRule, NewEndpoint, SecretRotation};

#[derive(Default)]
pub(super) struct OutboxState {
    /// Oldest first.
    endpoints: Vec<EndpointRecord>,
    deliveries: BTreeMap<String, DeliveryRecord>,
    /// Pending deliveries by `(next attempt, delivery id)`.
    due: BTreeSet<(Timestamp, String)>,
    /// Every delivery by `(endpoint id, delivery id)`, the log's order.
    by_endpoint: BTreeSet<(String, String)>,
}

struct EndpointRecord {
    endpoint: WebhookEndpoint,
    secret: Vec<u8>,
    previous_secret: Option<Vec<u8>>,
}

struct DeliveryRecord {
    delivery: Delivery,
    body: Arc<str>,
}

impl OutboxState {
    fn endpoint_mut(&mut self, endpoint_id: &str) -> Result<&mut EndpointRecord, Error> {
        self.endpoints
            .iter_mut()
            .find(|record| record.endpoint.endpoint_id == endpoint_id)
            .ok_or(Error::EndpointNotFound)
    }

    /// Keeps `event` with one pending delivery per endpoint that wants it,
    /// if any does.
    fn fan_out(&mut self, event: &Event) {
        let wanting: Vec<String> = self
            .endpoints
            .iter()
            .filter(|record| record.endpoint.wants(event))
            .map(|record| record.endpoint.endpoint_id.clone())
            .collect();
        if wanting.is_empty() {
            return;
        }
        let body: Arc<str> = event_body(event).into();
        for endpoint_id in wanting {
            let delivery_id = new_delivery_id(event.at);
            let delivery = Delivery {
                delivery_id: delivery_id.clone(),
                endpoint_id: endpoint_id.clone(),
                event_id: event.event_id.clone(),
                event_type: event.event_type,
                account_id: event.account_id.clone(),
                state: DeliveryState::Pending,
                attempts: 0,
                next_attempt_at: Some(event.at),
                last_error: None,
                last_status: None,
                created_at: event.at,
                delivered_at: None,
            };
            self.due.insert((event.at, delivery_id.clone()));
            self.by_endpoint.insert((endpoint_id, delivery_id.clone()));
            self.deliveries.insert(delivery_id, DeliveryRecord { delivery, body: body.clone() });
        }
    }

    fn claim(&mut self, delivery_id: &str, now: Timestamp, claim_for: SignedDuration) -> Option<ClaimedDelivery> {
        let record = self.deliveries.get_mut(delivery_id)?;
        let delivery = &mut record.delivery;
        let lapses = now.checked_add(claim_for).unwrap_or(Timestamp::MAX);
        delivery.attempts += 1;
        delivery.next_attempt_at = Some(lapses);
        self.due.insert((lapses, delivery_id.to_owned()));
        let endpoint = self.endpoints.iter().find(|e| e.endpoint.endpoint_id == record.delivery.endpoint_id)?;
        let previous = endpoint
            .previous_secret
            .as_ref()
            .filter(|_| endpoint.endpoint.previous_secret_until.is_some_and(|until| until > now));
        Some(ClaimedDelivery {
            delivery_id: delivery_id.to_owned(),
            endpoint_id: endpoint.endpoint.endpoint_id.clone(),
            event_id: record.delivery.event_id.clone(),
            attempt: record.delivery.attempts,
            url: endpoint.endpoint.url.clone(),
            sealed_secrets: std::iter::once(&endpoint.secret).chain(previous).cloned().collect(),
            body: record.body.to_string(),
            created_at: record.delivery.created_at,
        })
    }

    fn finish(&mut self, finished: FinishedAttempt<'_>, now: Timestamp) -> bool {
        let FinishedAttempt { delivery_id, attempt, result } = finished;
        let Some(record) = self.deliveries.get_mut(delivery_id) else { return false };
        let delivery = &mut record.delivery;
        if delivery.state != DeliveryState::Pending || delivery.attempts != attempt {
            return false;
        }
        if let Some(due) = delivery.next_attempt_at.take() {
            self.due.remove(&(due, delivery_id.to_owned()));
        }
        match result {
            AttemptResult::Delivered { status } => {
                delivery.state = DeliveryState::Delivered;
                delivery.delivered_at = Some(now);
                delivery.last_status = Some(status);
                delivery.last_error = None;
            }
            AttemptResult::Retry { at, error, status } => {
                delivery.next_attempt_at = Some(at);
                delivery.last_error = Some(error);
                delivery.last_status = status;
                self.due.insert((at, delivery_id.to_owned()));
            }
            AttemptResult::Failed { error, status } => {
                delivery.state = DeliveryState::Failed;
                delivery.last_error = Some(error);
                delivery.last_status = status;
            }
        }
        true
    }

    fn remove_endpoint(&mut self, endpoint_id: &str) -> Result<(), Error> {
        let index = self
            .endpoints
            .iter()
            .position(|record| record.endpoint.endpoint_id == endpoint_id)
            .ok_or(Error::EndpointNotFound)?;
        self.endpoints.remove(index);
        let start = (endpoint_id.to_owned(), String::new());
        let owned: Vec<(String, String)> =
            self.by_endpoint.range(start..).take_while(|(owner, _)| owner == endpoint_id).cloned().collect();
        for key in owned {
            self.by_endpoint.remove(&key);
            if let Some(record) = self.deliveries.remove(&key.1)
                && let Some(due) = record.delivery.next_attempt_at
            {
                self.due.remove(&(due, key.1));
            }
        }
        Ok(())
    }
}

impl OutboxState {
    /// Derives the events of an entry just journaled, whose account's
    /// counters before it were `before` and whose rules are `rules`.
    /// Nothing is allocated unless the entry emits an event or re-arms a
    /// rule.
    pub(super) fn derive(&mut self, rules: &mut [AlertRule], entry: &StoredEntry<'_>, before: [u64; COUNTERS]) {
        if rules.is_empty() && self.endpoints.is_empty() {
            return;
        }
        if is_silent(rules, entry.seq(), entry.kind(), &entry.deltas()) {
            return;
        }
        // The entry was made from `before` by this very step, so its deltas
        // always apply; a failure would be a bug in the memory store itself.
        let Ok((_, events)) = derive_entries(rules, before, std::slice::from_ref(entry)) else {
            debug_assert!(false, "a memory journal entry does not apply to its own counters");
            return;
        };
        for event in &events {
            self.fan_out(event);
        }
    }
}

impl State {
    fn note_refusal(&mut self, account_id: &str, now: Timestamp) -> Result<u32, Error> {
        let record = self.accounts.get_mut(account_id).ok_or(Error::AccountNotFound)?;
        let seq = record.journal.len();
        if record.rules.is_empty() {
            return Ok(0);
        }
        let counters = record.account.counters();
        let nonce = uuid::Uuid::new_v4().simple().to_string();
        let events = refusal_events(&mut record.rules, account_id, seq, &counters, now, &nonce);
        for event in &events {
            self.outbox.fan_out(event);
        }
        Ok(u32::try_from(events.len()).unwrap_or(u32::MAX))
    }

    fn deliveries_page(&self, endpoint_id: &str, page: &PageRequest) -> Result<Page<Delivery>, Error> {
        let listing = Listing::deliveries(endpoint_id, page)?;
        if !self.outbox.endpoints.iter().any(|record| record.endpoint.endpoint_id == endpoint_id) {
            return Err(Error::EndpointNotFound);
        }
        let start = (endpoint_id.to_owned(), listing.after().unwrap_or("").to_owned());
        let rows = self
            .outbox
            .by_endpoint
            .range(start..)
            .take_while(|(owner, _)| owner == endpoint_id)
            .filter(|(_, id)| listing.is_after(id))
            .take(listing.fetch())
            .filter_map(|(_, id)| self.outbox.deliveries.get(id).map(|record| record.delivery.clone()))
            .collect();
        Ok(listing.page(rows, |delivery: &Delivery| delivery.delivery_id.as_str()))
    }
}

#[async_trait]
impl Outbox for MemoryStore {
    async fn create_alert_rule(&self, rule: NewAlertRule<'_>, now: Timestamp) -> Result<AlertRule, Error> {
        let NewAlertRule { account_id, condition } = rule;
        let mut state = self.lock();
        let record = state.accounts.get_mut(account_id).ok_or(Error::AccountNotFound)?;
        let from_seq = record.journal.len();
        let rules = &mut record.rules;
        if rules.len() >= RULES_PER_ACCOUNT_MAX {
            return Err(Error::TooManyRules { max: RULES_PER_ACCOUNT_MAX });
        }
        let rule = AlertRule {
            rule_id: new_rule_id(),
            account_id: account_id.to_owned(),
            condition,
            created_at: now,
            from_seq,
            refused_at_seq: None,
        };
        rules.push(rule.clone());
        Ok(rule)
    }

    async fn alert_rules(&self, account_id: &str) -> Result<Vec<AlertRule>, Error> {
        let state = self.lock();
        Ok(state.accounts.get(account_id).ok_or(Error::AccountNotFound)?.rules.clone())
    }

    async fn delete_alert_rule(&self, account_id: &str, rule_id: &str) -> Result<(), Error> {
        let mut state = self.lock();
        let rules = &mut state.accounts.get_mut(account_id).ok_or(Error::AccountNotFound)?.rules;
        let index = rules.iter().position(|rule| rule.rule_id == rule_id).ok_or(Error::RuleNotFound)?;
        rules.remove(index);
        Ok(())
    }

    async fn create_endpoint(&self, endpoint: NewEndpoint<'_>, now: Timestamp) -> Result<WebhookEndpoint, Error> {
        let NewEndpoint { url, event_types, sealed_secret } = endpoint;
        validate_endpoint(url, event_types)?;
        let mut state = self.lock();
        if state.outbox.endpoints.len() >= ENDPOINTS_MAX {
            return Err(Error::TooManyEndpoints { max: ENDPOINTS_MAX });
        }
        let endpoint = WebhookEndpoint {
            endpoint_id: new_endpoint_id(),
            url: url.to_owned(),
            event_types: event_types.to_vec(),
            created_at: now,
            rotated_at: None,
            previous_secret_until: None,
        };
        let record = EndpointRecord { endpoint: endpoint.clone(), secret: sealed_secret, previous_secret: None };
        state.outbox.endpoints.push(record);
        Ok(endpoint)
    }

    async fn endpoints(&self) -> Result<Vec<WebhookEndpoint>, Error> {
        Ok(self.lock().outbox.endpoints.iter().map(|record| record.endpoint.clone()).collect())
    }

    async fn delete_endpoint(&self, endpoint_id: &str) -> Result<(), Error> {
        self.lock().outbox.remove_endpoint(endpoint_id)
    }

    async fn rotate_endpoint_secret(
        &self,
        rotation: SecretRotation<'_>,
        now: Timestamp,
    ) -> Result<WebhookEndpoint, Error> {
        let mut state = self.lock();
        let SecretRotation { endpoint_id, sealed_secret, previous_until } = rotation;
        let record = state.outbox.endpoint_mut(endpoint_id)?;
        record.previous_secret = Some(std::mem::replace(&mut record.secret, sealed_secret));
        record.endpoint.previous_secret_until = Some(previous_until);
        record.endpoint.rotated_at = Some(now);
        Ok(record.endpoint.clone())
    }

    async fn note_refusal(&self, account_id: &str, now: Timestamp) -> Result<u32, Error> {
        self.lock().note_refusal(account_id, now)
    }

    /// Events are derived as entries are journaled, so none are left here.
    async fn derive_events(&self, _limit: u32) -> Result<u32, Error> {
        Ok(0)
    }

    async fn claim_deliveries(&self, claim: DeliveryClaim<'_>, now: Timestamp) -> Result<Vec<ClaimedDelivery>, Error> {
        let DeliveryClaim { limit, claim_for, skip } = claim;
        let mut state = self.lock();
        let outbox = &mut state.outbox;
        let skipped =
            |id: &String| outbox.deliveries.get(id).is_some_and(|record| skip.contains(&record.delivery.endpoint_id));
        let due: Vec<(Timestamp, String)> = outbox
            .due
            .iter()
            .take_while(|(at, _)| *at <= now)
            .filter(|(_, id)| !skipped(id))
            .take(limit as usize)
            .cloned()
            .collect();
        let mut claimed = Vec::with_capacity(due.len());
        for key in due {
            outbox.due.remove(&key);
            claimed.extend(outbox.claim(&key.1, now, claim_for));
        }
        Ok(claimed)
    }

    async fn finish_delivery(&self, finished: FinishedAttempt<'_>, now: Timestamp) -> Result<bool, Error> {
        Ok(self.lock().outbox.finish(finished, now))
    }

    async fn deliveries(&self, endpoint_id: &str, page: &PageRequest) -> Result<Page<Delivery>, Error> {
        self.lock().deliveries_page(endpoint_id, page)
    }

    async fn redeliver(&self, endpoint_id: &str, delivery_id: &str, now: Timestamp) -> Result<Delivery, Error> {
        let mut state = self.lock();
        let outbox = &mut state.outbox;
        let record = outbox
            .deliveries
            .get_mut(delivery_id)
            .filter(|record| record.delivery.endpoint_id == endpoint_id)
            .ok_or(Error::DeliveryNotFound)?;
        let delivery = &mut record.delivery;
        if let Some(due) = delivery.next_attempt_at.replace(now) {
            outbox.due.remove(&(due, delivery_id.to_owned()));
        }
        delivery.state = DeliveryState::Pending;
        delivery.delivered_at = None;
        outbox.due.insert((now, delivery_id.to_owned()));
        Ok(delivery.clone())
    }

    async fn outbox_counts(&self) -> Result<OutboxCounts, Error> {
        let state = self.lock();
        let mut counts = OutboxCounts::default();
        for record in state.outbox.deliveries.values() {
            match record.delivery.state {
                DeliveryState::Pending => counts.pending += 1,
                DeliveryState::Delivered => counts.delivered += 1,
                DeliveryState::Failed => counts.failed += 1,
            }
        }
        Ok(counts)
    }
}
