//! The accepted usage events of the memory store, kept so that it can answer
//! usage queries and exports, and so that a replay is recognised.
//!
//! Each account's events sit in one ordered map keyed by
//! `(occurred_at, request_id)`, the export order, so a range or a page is one
//! range scan; a set of the request ids answers "was this id accepted?".
//! The set and the map of accounts hash with foldhash, not SipHash
//! (ARCHITECTURE.md, on the memory store, says why). An event is kept
//! compactly: its account is the map it sits in, its lease as the 128-bit key
//! of the id this store issued, and its dimensions only when it has any, as
//! a slice of pairs in key order rather than the map the event carried, whose
//! first node has room for eleven pairs however few it holds.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

use foldhash::{HashMap, HashSet};
use jiff::Timestamp;
use tollgate_core::query::{Aggregation, ExportQuery, UsageQuery, UsageReport};
use tollgate_core::{Error, Page, UsageEvent};

use super::{LeaseKey, State, lease_id_of, lease_key};

/// An event's dimensions as kept: its `(key, value)` pairs in key order.
type StoredDimensions = Box<[(Box<str>, Box<str>)]>;

/// An accepted event without its account, instant and request id (its keys).
struct StoredEvent {
    credential_id: Box<str>,
    units: u64,
    /// The lease and fence of a leased event. Accepted leased events always
    /// name a lease this store issued, whose id is a `LeaseKey`.
    funding: Option<(LeaseKey, u64)>,
    dimensions: Option<StoredDimensions>,
}

/// One account's events. The map and the set share one allocation of each request id.
#[derive(Default)]
struct AccountEvents {
    by_order: BTreeMap<(Timestamp, Arc<str>), StoredEvent>,
    by_request: HashSet<Arc<str>>,
}

/// Every accepted event, by account.
#[derive(Default)]
pub(super) struct EventLog {
    accounts: HashMap<String, AccountEvents>,
}

impl EventLog {
    /// Whether `(account_id, request_id)` was accepted.
    pub(super) fn is_recorded(&self, account_id: &str, request_id: &str) -> bool {
        self.accounts.get(account_id).is_some_and(|events| events.by_request.contains(request_id))
    }

    /// Keeps an event the core accepted. The event is moved in, so that its
    /// credential id and dimensions are kept without being copied.
    pub(super) fn record(&mut self, event: UsageEvent) {
        let funding = match (&event.lease_id, event.fencing_token) {
            (Some(lease_id), Some(fence)) => lease_key(lease_id).map(|key| (key, fence)),
            _ => None,
        };
        let stored = StoredEvent {
            credential_id: event.credential_id.into_boxed_str(),
            units: event.units,
            funding,
            dimensions: (!event.dimensions.is_empty()).then(|| {
                let pairs = event.dimensions.into_iter();
                pairs.map(|(key, value)| (key.into_boxed_str(), value.into_boxed_str())).collect()
            }),
        };
        // Looked up before it is entered, so that the account's id is kept
        // only with its first event.
        let events = match self.accounts.get_mut(&event.account_id) {
            Some(events) => events,
            None => self.accounts.entry(event.account_id).or_default(),
        };
        let request_id: Arc<str> = Arc::from(event.request_id);
        events.by_request.insert(Arc::clone(&request_id));
        events.by_order.insert((event.occurred_at, request_id), stored);
    }

    /// `account_id`'s events from `start` (exclusive when `after`) up to `to`, in order.
    fn scan<'a>(
        &'a self,
        account_id: &'a str,
        start: Bound<(Timestamp, Arc<str>)>,
        to: Timestamp,
    ) -> impl Iterator<Item = UsageEvent> + 'a {
        let end = Bound::Excluded((to, Arc::<str>::from("")));
        self.accounts.get(account_id).into_iter().flat_map(move |events| {
            events.by_order.range((start.clone(), end.clone())).map(move |((at, request_id), stored)| UsageEvent {
                request_id: request_id.to_string(),
                account_id: account_id.to_owned(),
                credential_id: stored.credential_id.to_string(),
                units: stored.units,
                occurred_at: *at,
                lease_id: stored.funding.map(|(key, _)| lease_id_of(key)),
                fencing_token: stored.funding.map(|(_, fence)| fence),
                dimensions: stored
                    .dimensions
                    .iter()
                    .flatten()
                    .map(|(key, value)| (String::from(&**key), String::from(&**value)))
                    .collect(),
            })
        })
    }
}

impl State {
    pub(super) fn usage(&self, account_id: &str, query: &UsageQuery) -> Result<UsageReport, Error> {
        self.account(account_id)?;
        let mut aggregation = Aggregation::new(query);
        let start = Bound::Included((query.range.from, Arc::<str>::from("")));
        for event in self.events.scan(account_id, start, query.range.to) {
            aggregation.add_event(&event)?;
        }
        aggregation.finish()
    }

    pub(super) fn usage_events(&self, account_id: &str, query: &ExportQuery) -> Result<Page<UsageEvent>, Error> {
        self.account(account_id)?;
        let start = match &query.after {
            None => Bound::Included((query.range.from, Arc::<str>::from(""))),
            Some((at, request_id)) => Bound::Excluded((*at, request_id.as_str().into())),
        };
        let rows = self
            .events
            .scan(account_id, start, query.range.to)
            .filter(|event| query.admits(event.occurred_at, &event.request_id))
            .take(query.limit.rows() + 1)
            .collect();
        Ok(query.page(rows))
    }
}
