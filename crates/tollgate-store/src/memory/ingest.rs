//! Usage ingestion into the memory store: the core classifies a batch over
//! the store's maps, and the store applies what it accepted.

use async_trait::async_trait;
use jiff::Timestamp;
use tollgate_core::journal::usage_changes;
use tollgate_core::usage::{self, UsageView};
use tollgate_core::{Account, Credential, EventOutcome, IngestError, Lease, UsageEvent};

use super::{DOMAIN, MemoryStore, State};
use crate::UsageSink;

/// What classification of one batch reads: the store's state, plus the full
/// `Lease` of every lease the batch names, rebuilt once from its record.
struct BatchView<'a> {
    state: &'a State,
    leases: foldhash::HashMap<&'a str, Lease>,
}

impl<'a> BatchView<'a> {
    fn new(state: &'a State, batch: &'a [UsageEvent]) -> Self {
        let mut leases = foldhash::HashMap::default();
        for lease_id in batch.iter().filter_map(|event| event.lease_id.as_deref()) {
            if !leases.contains_key(lease_id)
                && let Some(lease) = state.load_lease(lease_id)
            {
                leases.insert(lease_id, lease);
            }
        }
        Self { state, leases }
    }
}

impl UsageView for BatchView<'_> {
    fn is_recorded(&self, account_id: &str, request_id: &str) -> bool {
        self.state.events.is_recorded(account_id, request_id)
    }

    fn account(&self, account_id: &str) -> Option<&Account> {
        self.state.account(account_id).ok()
    }

    fn lease(&self, lease_id: &str) -> Option<&Lease> {
        self.leases.get(lease_id)
    }

    fn credential(&self, credential_id: &str) -> Option<&Credential> {
        self.state.credentials.get(credential_id).map(|record| &record.credential)
    }
}

#[async_trait]
impl UsageSink for MemoryStore {
    async fn ingest(&self, batch: Vec<UsageEvent>, now: Timestamp) -> Result<Vec<EventOutcome>, IngestError> {
        let mut state = self.lock();
        let plan = usage::classify(&batch, now, &self.policy, DOMAIN, &BatchView::new(&state, &batch))?;
        for change in usage_changes(&batch, &plan, |id| state.account(id).ok()) {
            let Some(before) = state.account(&change.account_id).ok().map(Account::counters) else { continue };
            state.record(change, before, now);
        }
        let mut accepted = plan.accepted.into_iter().peekable();
        for (index, event) in batch.into_iter().enumerate() {
            if accepted.next_if_eq(&index).is_some() {
                state.events.record(event);
            }
        }
        for account in plan.accounts.into_values() {
            state.store_account(account);
        }
        for lease in plan.leases.values() {
            state.write_lease(lease);
        }
        for (credential_id, credential) in plan.credentials {
            if let Some(record) = state.credentials.get_mut(&credential_id) {
                record.credential = credential;
            }
        }
        Ok(plan.outcomes)
    }
}
