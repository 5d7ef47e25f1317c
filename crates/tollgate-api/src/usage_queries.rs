//! Wire types of the usage read side: totals by window and group, and the
//! export of accepted events.
//!
//! Totals are decimal strings: a sum of `u64` units over many events can
//! exceed what a JSON number carries exactly (and `u64`), and a string never
//! wraps or rounds.

use std::collections::BTreeMap;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use tollgate_core::query::{Bucket, GroupTotals, Totals};
use tollgate_core::{UsageEvent, UsageReport};
use utoipa::ToSchema;

/// Units and event count, as decimal strings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct UsageTotalsBody {
    /// The sum of the events' units, a decimal string (it never wraps).
    #[schema(pattern = "^[0-9]+$", example = "1200")]
    pub units: String,
    /// How many events, a decimal string.
    #[schema(pattern = "^[0-9]+$", example = "3")]
    pub events: String,
}

impl From<&Totals> for UsageTotalsBody {
    fn from(totals: &Totals) -> Self {
        Self { units: totals.units.to_string(), events: totals.events.to_string() }
    }
}

/// One group of a bucket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct UsageGroupBody {
    /// The group: a credential id, a lease id, `leased`/`overage` or a
    /// dimension's value. `null` is the group of events without one (overage
    /// events when grouping by lease, events without the dimension) and the
    /// only group when the query groups by nothing.
    pub key: Option<String>,
    /// The sum of the group's units, a decimal string.
    #[schema(pattern = "^[0-9]+$")]
    pub units: String,
    /// How many events the group holds, a decimal string.
    #[schema(pattern = "^[0-9]+$")]
    pub events: String,
}

impl From<&GroupTotals> for UsageGroupBody {
    fn from(group: &GroupTotals) -> Self {
        let totals = UsageTotalsBody::from(&group.totals);
        Self { key: group.key.clone(), units: totals.units, events: totals.events }
    }
}

/// One bucket: `[start, end)`, clipped to the query's range, and its nonempty
/// groups (the `null` group first, then by key). Empty buckets are listed
/// with no groups.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct UsageBucketBody {
    #[schema(value_type = String, format = DateTime)]
    pub start: Timestamp,
    #[schema(value_type = String, format = DateTime)]
    pub end: Timestamp,
    pub groups: Vec<UsageGroupBody>,
}

impl From<&Bucket> for UsageBucketBody {
    fn from(bucket: &Bucket) -> Self {
        Self { start: bucket.start, end: bucket.end, groups: bucket.groups.iter().map(UsageGroupBody::from).collect() }
    }
}

/// Usage of an account over `[from, to)`: every bucket the range spans, in
/// time order (UTC-aligned windows; one bucket when no window was asked
/// for), and the total over the whole range.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct UsageReportBody {
    #[schema(value_type = String, format = DateTime)]
    pub from: Timestamp,
    #[schema(value_type = String, format = DateTime)]
    pub to: Timestamp,
    /// `PT1M`, `PT1H`, `P1D`, or `null` for the whole range.
    pub window: Option<String>,
    /// `credential`, `lease`, `funding`, `dimension:KEY`, or `null`.
    pub group_by: Option<String>,
    pub buckets: Vec<UsageBucketBody>,
    pub total: UsageTotalsBody,
}

impl From<&UsageReport> for UsageReportBody {
    fn from(report: &UsageReport) -> Self {
        Self {
            from: report.query.range.from,
            to: report.query.range.to,
            window: report.query.window.map(|window| window.code().to_owned()),
            group_by: report.query.group_by.code(),
            buckets: report.buckets.iter().map(UsageBucketBody::from).collect(),
            total: UsageTotalsBody::from(&report.total),
        }
    }
}

/// An accepted event as exported: every field it was accepted with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ExportedEventBody {
    pub request_id: String,
    pub credential_id: String,
    pub units: u64,
    #[schema(value_type = String, format = DateTime)]
    pub occurred_at: Timestamp,
    /// The funding lease; `null` for overage.
    pub lease_id: Option<String>,
    pub fencing_token: Option<u64>,
    /// The event's dimensions; `{}` for none.
    pub dimensions: BTreeMap<String, String>,
}

impl From<&UsageEvent> for ExportedEventBody {
    fn from(event: &UsageEvent) -> Self {
        Self {
            request_id: event.request_id.clone(),
            credential_id: event.credential_id.clone(),
            units: event.units,
            occurred_at: event.occurred_at,
            lease_id: event.lease_id.clone(),
            fencing_token: event.fencing_token,
            dimensions: event.dimensions.clone(),
        }
    }
}

impl ExportedEventBody {
    /// The event, as the account `account_id` accepted it.
    pub fn into_event(self, account_id: &str) -> UsageEvent {
        UsageEvent {
            request_id: self.request_id,
            account_id: account_id.to_owned(),
            credential_id: self.credential_id,
            units: self.units,
            occurred_at: self.occurred_at,
            lease_id: self.lease_id,
            fencing_token: self.fencing_token,
            dimensions: self.dimensions,
        }
    }
}

/// One page of exported events in `(occurred_at, request_id)` order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct UsageEventsPage {
    pub items: Vec<ExportedEventBody>,
    /// Resumes after this page's last event (same account, `from` and `to`
    /// only); `null` on the last page.
    pub next_cursor: Option<String>,
}
