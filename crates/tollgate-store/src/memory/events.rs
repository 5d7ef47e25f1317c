//! The accepted usage events of the memory store, kept so that it can answer
//! usage queries and exports, and so that a replay is recognised.
//!
//! Each account's events sit in one ordered map keyed by
//! `(occurred_at, request_id)`, the export order, so a range or a page is one
//! range scan; a second map from request id to instant answers "was this id
//! accepted?". An event is kept compactly: its account is the map it sits in,
//! its lease as the 128-bit key of the id this store issued, and its
//! dimensions only when it has any.

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::sync::Arc;

use jiff::Timestamp;
use tollgate_core::query::{Aggregation, ExportQuery, UsageQuery, UsageReport};
use tollgate_core::{Dimensions, Error, Page, UsageEvent};

use super::{LeaseKey, State, lease_id_of, lease_key};

/// An accepted event without its account, instant and request id (its keys).
struct StoredEvent {
    credential_id: Box<str>,
    units: u64,
    /// The lease and fence of a leased event. Accepted leased events always
    /// name a lease this store issued, whose id is a `LeaseKey`.
    funding: Option<(LeaseKey, u64)>,
    dimensions: Option<Box<Dimensions>>,
}

/// Where an event sits in its account's export order: by instant, then by
/// request id, byte by byte.
///
/// `head` is the id's first 16 bytes as a big-endian number, padded with
/// zeros, so that most comparisons of two keys end before either id is read
/// from the heap. It orders as the bytes do: where two heads first differ,
/// either both ids have a byte there (and the larger byte wins) or one id
/// has ended there (and the shorter one, a prefix of the other, comes
/// first). Equal heads fall back to the whole ids.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord)]
struct OrderKey {
    at: Timestamp,
    head: u128,
    request_id: Arc<str>,
}

impl OrderKey {
    fn new(at: Timestamp, request_id: Arc<str>) -> Self {
        let mut head = [0u8; 16];
        let bytes = request_id.as_bytes();
        let len = bytes.len().min(head.len());
        head[..len].copy_from_slice(&bytes[..len]);
        Self { at, head: u128::from_be_bytes(head), request_id }
    }

    /// The first key at `at`, before every request id.
    fn first_at(at: Timestamp) -> Self {
        Self::new(at, Arc::from(""))
    }
}

/// One account's events. Both maps share one allocation of each request id.
#[derive(Default)]
struct AccountEvents {
    by_order: BTreeMap<OrderKey, StoredEvent>,
    by_request: HashMap<Arc<str>, Timestamp>,
}

/// Every accepted event, by account.
#[derive(Default)]
pub(super) struct EventLog {
    accounts: HashMap<String, AccountEvents>,
}

impl EventLog {
    /// Whether `(account_id, request_id)` was accepted.
    pub(super) fn is_recorded(&self, account_id: &str, request_id: &str) -> bool {
        self.accounts.get(account_id).is_some_and(|events| events.by_request.contains_key(request_id))
    }

    /// Keeps an event the core accepted.
    pub(super) fn record(&mut self, event: &UsageEvent) {
        let funding = match (&event.lease_id, event.fencing_token) {
            (Some(lease_id), Some(fence)) => lease_key(lease_id).map(|key| (key, fence)),
            _ => None,
        };
        let stored = StoredEvent {
            credential_id: event.credential_id.as_str().into(),
            units: event.units,
            funding,
            dimensions: (!event.dimensions.is_empty()).then(|| Box::new(event.dimensions.clone())),
        };
        // Looked up before it is entered, so that an account's id is copied
        // only with its first event rather than with every one.
        let events = match self.accounts.get_mut(&event.account_id) {
            Some(events) => events,
            None => self.accounts.entry(event.account_id.clone()).or_default(),
        };
        let request_id: Arc<str> = Arc::from(event.request_id.as_str());
        events.by_request.insert(Arc::clone(&request_id), event.occurred_at);
        events.by_order.insert(OrderKey::new(event.occurred_at, request_id), stored);
    }

    /// `account_id`'s events from `start` (exclusive when `after`) up to `to`, in order.
    fn scan<'a>(
        &'a self,
        account_id: &'a str,
        start: Bound<OrderKey>,
        to: Timestamp,
    ) -> impl Iterator<Item = UsageEvent> + 'a {
        let end = Bound::Excluded(OrderKey::first_at(to));
        self.accounts.get(account_id).into_iter().flat_map(move |events| {
            events.by_order.range((start.clone(), end.clone())).map(move |(order, stored)| UsageEvent {
                request_id: order.request_id.to_string(),
                account_id: account_id.to_owned(),
                credential_id: stored.credential_id.to_string(),
                units: stored.units,
                occurred_at: order.at,
                lease_id: stored.funding.map(|(key, _)| lease_id_of(key)),
                fencing_token: stored.funding.map(|(_, fence)| fence),
                dimensions: stored.dimensions.as_deref().cloned().unwrap_or_default(),
            })
        })
    }
}

impl State {
    pub(super) fn usage(&self, account_id: &str, query: &UsageQuery) -> Result<UsageReport, Error> {
        self.account(account_id)?;
        let mut aggregation = Aggregation::new(query);
        let start = Bound::Included(OrderKey::first_at(query.range.from));
        for event in self.events.scan(account_id, start, query.range.to) {
            aggregation.add_event(&event)?;
        }
        aggregation.finish()
    }

    pub(super) fn usage_events(&self, account_id: &str, query: &ExportQuery) -> Result<Page<UsageEvent>, Error> {
        self.account(account_id)?;
        let start = match &query.after {
            None => Bound::Included(OrderKey::first_at(query.range.from)),
            Some((at, request_id)) => Bound::Excluded(OrderKey::new(*at, request_id.as_str().into())),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys order exactly as `(instant, request id)` do, whatever the ids
    /// share: a head, a prefix, NUL bytes, a length around 16 bytes.
    #[test]
    fn order_keys_order_as_instant_then_request_id() {
        let long = "x".repeat(16);
        let ids = [
            "".to_owned(),
            "a".to_owned(),
            "a\0".to_owned(),
            "a\0\u{1}".to_owned(),
            "ab".to_owned(),
            "b".to_owned(),
            "é".to_owned(),
            long.clone(),
            format!("{long}\0"),
            format!("{long}a"),
            format!("{long}b"),
            format!("{}y", "x".repeat(15)),
            "req-1-10".to_owned(),
            "req-1-9".to_owned(),
        ];
        let instants = [Timestamp::UNIX_EPOCH, Timestamp::from_second(1).expect("instant")];
        let keys: Vec<_> = instants.iter().flat_map(|&at| ids.iter().map(move |id| (at, id.as_str()))).collect();
        for &(a_at, a) in &keys {
            for &(b_at, b) in &keys {
                let by_key = OrderKey::new(a_at, a.into()).cmp(&OrderKey::new(b_at, b.into()));
                assert_eq!(by_key, (a_at, a).cmp(&(b_at, b)), "{a_at} {a:?} against {b_at} {b:?}");
            }
        }
        for &(at, id) in &keys {
            assert!(OrderKey::first_at(at) <= OrderKey::new(at, id.into()));
        }
    }
}
