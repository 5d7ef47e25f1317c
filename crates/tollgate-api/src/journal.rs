//! The account journal on the wire: `GET /v1/accounts/{account_id}/journal`.
//!
//! An entry's `deltas` is an object with one member per counter, named as in
//! the account body, each the signed change of that counter as a JSON
//! integer. The memory store's counters span `0..=u64::MAX`, so a delta spans
//! `-(2^64-1)..=2^64-1`, beyond a 64-bit integer; like the account's
//! counters, they are plain JSON numbers, which a client that reads numbers
//! as doubles holds exactly only up to 2^53. Ids an entry does not name are
//! `null` (`leases` is `[]`).

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use tollgate_core::{Entry, EntryKind};
use tollgate_store::{JournalMismatch, JournalPage};
use utoipa::ToSchema;

/// What an entry records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum JournalKindBody {
    /// The counters an account had when its journal began (accounts that
    /// existed before the journal).
    Opening,
    Credit,
    Acquire,
    Release,
    Reclaim,
    Consolidate,
    Usage,
}

impl From<EntryKind> for JournalKindBody {
    fn from(kind: EntryKind) -> Self {
        match kind {
            EntryKind::Opening => Self::Opening,
            EntryKind::Credit => Self::Credit,
            EntryKind::Acquire => Self::Acquire,
            EntryKind::Release => Self::Release,
            EntryKind::Reclaim => Self::Reclaim,
            EntryKind::Consolidate => Self::Consolidate,
            EntryKind::Usage => Self::Usage,
        }
    }
}

/// The signed change of each counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CounterDeltasBody {
    pub credited: i128,
    pub available: i128,
    pub reserved: i128,
    pub consumed: i128,
    pub overage: i128,
    pub billed: i128,
    pub next_fence: i128,
}

/// One change to an account's counters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct JournalEntryBody {
    /// 1, 2, 3, … per account, with no gaps.
    pub seq: u64,
    pub kind: JournalKindBody,
    pub deltas: CounterDeltasBody,
    /// `credit`: the credit.
    pub credit_id: Option<String>,
    /// `acquire`, `consolidate`: the lease granted; `release`: the lease released.
    pub lease_id: Option<String>,
    /// `consolidate`: the sources, in request order; `reclaim`: the leases of
    /// the account the pass settled; `usage`: the leases the accepted events
    /// touched.
    pub leases: Vec<String>,
    /// `usage`: how many events of the batch were accepted for the account.
    pub events: Option<u64>,
    /// The server's time when the change was made.
    #[schema(value_type = String, format = DateTime)]
    pub at: Timestamp,
}

impl From<&Entry> for JournalEntryBody {
    fn from(entry: &Entry) -> Self {
        let [credited, available, reserved, consumed, overage, billed, next_fence] = entry.deltas;
        Self {
            seq: entry.seq,
            kind: entry.kind.into(),
            deltas: CounterDeltasBody { credited, available, reserved, consumed, overage, billed, next_fence },
            credit_id: entry.ids.credit_id.clone(),
            lease_id: entry.ids.lease_id.clone(),
            leases: entry.ids.leases.clone(),
            events: entry.ids.events,
            at: entry.at,
        }
    }
}

/// A page of an account's journal, in sequence order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct JournalPageBody {
    pub items: Vec<JournalEntryBody>,
    /// Pass as `after` to read the next page; `null` when this page holds the
    /// last entry.
    pub next_after: Option<u64>,
}

impl From<&JournalPage> for JournalPageBody {
    fn from(page: &JournalPage) -> Self {
        Self { items: page.items.iter().map(JournalEntryBody::from).collect(), next_after: page.next_after }
    }
}

/// An account whose journal does not replay to its counters (`check`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct JournalMismatchBody {
    pub account_id: String,
    /// How they differ, as far as the store can tell.
    pub reason: String,
}

impl From<&JournalMismatch> for JournalMismatchBody {
    fn from(m: &JournalMismatch) -> Self {
        Self { account_id: m.account_id.clone(), reason: m.error.to_string() }
    }
}

#[cfg(test)]
mod tests {
    use tollgate_core::journal::EntryIds;

    use super::*;

    #[test]
    fn an_entry_serialises_its_deltas_by_counter_name_and_beyond_i64() {
        let entry = Entry {
            account_id: "a".into(),
            seq: 1,
            kind: EntryKind::Credit,
            deltas: [i128::from(u64::MAX), -i128::from(u64::MAX), 0, 0, 0, 0, 1],
            ids: EntryIds::credit("c1"),
            at: Timestamp::UNIX_EPOCH,
        };
        let body = JournalPageBody::from(&JournalPage { items: vec![entry], next_after: None });
        let json = serde_json::to_string(&body).expect("serialises");
        assert_eq!(
            json,
            concat!(
                r#"{"items":[{"seq":1,"kind":"credit","deltas":{"credited":18446744073709551615,"#,
                r#""available":-18446744073709551615,"reserved":0,"consumed":0,"overage":0,"billed":0,"#,
                r#""next_fence":1},"credit_id":"c1","lease_id":null,"leases":[],"events":null,"#,
                r#""at":"1970-01-01T00:00:00Z"}],"next_after":null}"#
            )
        );
        let back: JournalPageBody = serde_json::from_str(&json).expect("deserialises");
        assert_eq!(back, body);
    }
}
