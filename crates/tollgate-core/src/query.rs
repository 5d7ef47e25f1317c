//! The read side of usage: totals of accepted events by time window and group,
//! and the export of the events themselves, page by page.
//!
//! A query names a half-open range `[from, to)` of `occurred_at`, exact to the
//! nanosecond. With a window (`PT1M`, `PT1H`, `P1D`) the range is cut into
//! UTC-aligned buckets: bucket `i` is `[i * window, (i + 1) * window)` since the
//! epoch, with floor division, so an instant before 1970 lands in the bucket
//! that starts at or before it. The first and last buckets are clipped to the
//! range, so the buckets of an answer tile `[from, to)` exactly; without a
//! window the whole range is one bucket. Every bucket the range spans is in
//! the answer, empty or not, in time order, so a chart can plot it directly;
//! an answer never holds more than [`BUCKETS_MAX`] buckets, and a query that
//! would is refused before any store reads an event.
//!
//! Every window is a whole number of microseconds, so the bucket of an
//! instant is also `floor(floor_us / window_us)` of its stored
//! `(floor_us, submicro_ns)` pair: PostgreSQL computes the same buckets from
//! the stored microseconds alone.
//!
//! Sums are `u128`: the sum of any number of `u64` units a store can hold fits,
//! so a total never wraps; the wire shows them as decimal strings.

use std::collections::BTreeMap;

use jiff::Timestamp;

use crate::error::Error;
use crate::page::{Page, PageLimit, Scope, Start};
use crate::usage::{UsageEvent, is_valid_dimension_key};

/// The most buckets one answer may hold.
pub const BUCKETS_MAX: u64 = 10_000;

const NS_PER_US: i128 = 1_000;

/// The width of a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Window {
    Minute,
    Hour,
    Day,
}

impl Window {
    pub const ALL: [Window; 3] = [Window::Minute, Window::Hour, Window::Day];

    /// The ISO 8601 duration that names it on the wire.
    pub fn code(self) -> &'static str {
        match self {
            Window::Minute => "PT1M",
            Window::Hour => "PT1H",
            Window::Day => "P1D",
        }
    }

    /// A window named on the wire; `None` (absent) means the whole range.
    pub fn parse(text: Option<&str>) -> Result<Option<Self>, Error> {
        match text {
            None => Ok(None),
            Some(text) => Window::ALL.into_iter().find(|w| w.code() == text).map(Some).ok_or(Error::InvalidWindow),
        }
    }

    /// Its width in microseconds (a UTC day is always 86 400 s: no leap seconds).
    pub fn micros(self) -> i64 {
        match self {
            Window::Minute => 60_000_000,
            Window::Hour => 3_600_000_000,
            Window::Day => 86_400_000_000,
        }
    }

    fn nanos(self) -> i128 {
        i128::from(self.micros()) * NS_PER_US
    }

    /// The index of the bucket holding `at`: floor division, before 1970 too.
    pub fn bucket_of(self, at: Timestamp) -> i64 {
        // |ns| < 2^69 and a window is at least 6e10 ns, so the index fits an i64.
        at.as_nanosecond().div_euclid(self.nanos()) as i64
    }
}

/// What the events of a bucket are grouped by.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum GroupBy {
    /// One group of every event.
    Nothing,
    Credential,
    /// The funding lease; overage events form their own group (key `None`).
    Lease,
    /// `leased` or `overage`.
    Funding,
    /// The value of one dimension; events without it form their own group
    /// (key `None`), distinct from every value.
    Dimension(String),
}

impl GroupBy {
    /// A grouping named on the wire: absent, `credential`, `lease`, `funding`
    /// or `dimension:KEY` with a valid dimension key.
    pub fn parse(text: Option<&str>) -> Result<Self, Error> {
        match text {
            None => Ok(GroupBy::Nothing),
            Some("credential") => Ok(GroupBy::Credential),
            Some("lease") => Ok(GroupBy::Lease),
            Some("funding") => Ok(GroupBy::Funding),
            Some(other) => match other.strip_prefix("dimension:") {
                Some(key) if is_valid_dimension_key(key) => Ok(GroupBy::Dimension(key.to_owned())),
                _ => Err(Error::InvalidGroupBy),
            },
        }
    }

    /// The wire name; `None` for no grouping.
    pub fn code(&self) -> Option<String> {
        match self {
            GroupBy::Nothing => None,
            GroupBy::Credential => Some("credential".into()),
            GroupBy::Lease => Some("lease".into()),
            GroupBy::Funding => Some("funding".into()),
            GroupBy::Dimension(key) => Some(format!("dimension:{key}")),
        }
    }

    /// The group key of `event`; `None` is the group of events without one
    /// (and the only group when nothing groups).
    pub fn key_of(&self, event: &UsageEvent) -> Option<String> {
        match self {
            GroupBy::Nothing => None,
            GroupBy::Credential => Some(event.credential_id.clone()),
            GroupBy::Lease => event.lease_id.clone(),
            GroupBy::Funding => Some(if event.lease_id.is_some() { "leased" } else { "overage" }.to_owned()),
            GroupBy::Dimension(key) => event.dimensions.get(key).cloned(),
        }
    }
}

/// Reads a query-string instant: RFC 3339 with at most 9 fractional digits.
pub fn parse_instant(field: &'static str, text: Option<&str>) -> Result<Timestamp, Error> {
    text.and_then(|text| text.parse::<Timestamp>().ok()).ok_or(Error::InvalidTimestamp { field })
}

/// A nonempty range `[from, to)` of the timestamp domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    pub from: Timestamp,
    pub to: Timestamp,
}

impl Range {
    /// `invalid_range` unless `from < to`.
    pub fn new(from: Timestamp, to: Timestamp) -> Result<Self, Error> {
        if from < to { Ok(Self { from, to }) } else { Err(Error::InvalidRange) }
    }

    pub fn contains(&self, at: Timestamp) -> bool {
        self.from <= at && at < self.to
    }
}

/// A validated usage query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageQuery {
    pub range: Range,
    pub window: Option<Window>,
    pub group_by: GroupBy,
}

impl UsageQuery {
    /// A query from its query-string values, each checked in order: `from`,
    /// `to`, the range, `window`, `group_by`, then the bucket count.
    pub fn parse(
        from: Option<&str>,
        to: Option<&str>,
        window: Option<&str>,
        group_by: Option<&str>,
    ) -> Result<Self, Error> {
        let range = Range::new(parse_instant("from", from)?, parse_instant("to", to)?)?;
        Self::new(range, Window::parse(window)?, GroupBy::parse(group_by)?)
    }

    /// `too_many_buckets` when the range spans more than [`BUCKETS_MAX`] windows.
    pub fn new(range: Range, window: Option<Window>, group_by: GroupBy) -> Result<Self, Error> {
        let query = Self { range, window, group_by };
        let buckets = query.bucket_count();
        if buckets > u128::from(BUCKETS_MAX) {
            return Err(Error::TooManyBuckets { buckets, max: BUCKETS_MAX });
        }
        Ok(query)
    }

    /// The index of the bucket of `at`; 0 when the whole range is one bucket.
    pub fn bucket_of(&self, at: Timestamp) -> i64 {
        self.window.map_or(0, |window| window.bucket_of(at))
    }

    /// The first and last bucket indices the range spans, partial ones included.
    pub fn bucket_bounds(&self) -> (i64, i64) {
        let last = self.range.to.as_nanosecond() - 1;
        match self.window {
            None => (0, 0),
            Some(window) => (window.bucket_of(self.range.from), last.div_euclid(window.nanos()) as i64),
        }
    }

    /// How many buckets the answer holds.
    pub fn bucket_count(&self) -> u128 {
        let (first, last) = self.bucket_bounds();
        (i128::from(last) - i128::from(first) + 1) as u128
    }

    /// Bucket `index`, clipped to the range.
    fn bucket_span(&self, index: i64) -> (Timestamp, Timestamp) {
        let Some(window) = self.window else { return (self.range.from, self.range.to) };
        let (from, to) = (self.range.from.as_nanosecond(), self.range.to.as_nanosecond());
        let start = (i128::from(index) * window.nanos()).max(from);
        let end = ((i128::from(index) + 1) * window.nanos()).min(to);
        // Both lie in [from, to], inside the domain.
        let at = |ns: i128| Timestamp::from_nanosecond(ns).unwrap_or(self.range.from);
        (at(start), at(end))
    }
}

/// How a store that keeps hourly totals of accepted events (PostgreSQL's
/// `tollgate_usage_hourly`, migration 0025) answers a query: the whole UTC
/// hours of the range from those totals, and only the partial hours at its
/// two ends from the events. Every event of the range lies in exactly one of
/// the three parts, and an hour lies in exactly one bucket of any window
/// other than a minute, so the sums equal those of the events alone. A
/// query by minute or by lease, which hourly totals do not resolve, or one
/// within an hour, reads its whole range from the events (`head`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HourlyPlan {
    /// The events `[from, to)` before the first whole hour; may be empty.
    pub head: (Timestamp, Timestamp),
    /// The whole hours `first..end`, as hour indices since the epoch
    /// (floor division); empty when `first == end`.
    pub hours: (i64, i64),
    /// The events `[from, to)` after the last whole hour; may be empty.
    pub tail: (Timestamp, Timestamp),
}

impl UsageQuery {
    /// This query's [`HourlyPlan`].
    pub fn hourly_plan(&self) -> HourlyPlan {
        let (from, to) = (self.range.from, self.range.to);
        let events_only = HourlyPlan { head: (from, to), hours: (0, 0), tail: (to, to) };
        if self.window == Some(Window::Minute) || self.group_by == GroupBy::Lease {
            return events_only;
        }
        let hour = Window::Hour.nanos();
        let first = -(-from.as_nanosecond()).div_euclid(hour);
        let end = to.as_nanosecond().div_euclid(hour);
        // Hour boundaries within [from, to] lie in the domain.
        let at = |index: i128| Timestamp::from_nanosecond(index * hour).ok();
        match (at(first), at(end)) {
            (Some(start), Some(stop)) if first < end => {
                // |index| < 2^69 / 3.6e12, well inside an i64.
                HourlyPlan { head: (from, start), hours: (first as i64, end as i64), tail: (stop, to) }
            }
            _ => events_only,
        }
    }
}

/// Units and events of a set of accepted events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Totals {
    pub units: u128,
    pub events: u128,
}

impl Totals {
    fn add(&mut self, units: u128, events: u128) -> Result<(), Error> {
        let overflow = || Error::StorageCorrupt("usage totals exceed 128 bits".into());
        self.units = self.units.checked_add(units).ok_or_else(overflow)?;
        self.events = self.events.checked_add(events).ok_or_else(overflow)?;
        Ok(())
    }
}

/// One group of a bucket; `key` is `None` for the group of events without one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupTotals {
    pub key: Option<String>,
    pub totals: Totals,
}

/// One bucket: its span (clipped to the range) and its nonempty groups, the
/// `None` group first, then by key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bucket {
    pub start: Timestamp,
    pub end: Timestamp,
    pub groups: Vec<GroupTotals>,
}

/// The answer to a usage query: every bucket in time order, and the total.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageReport {
    pub query: UsageQuery,
    pub buckets: Vec<Bucket>,
    pub total: Totals,
}

/// Totals by `(bucket, group)`, added event by event (the memory store) or
/// row by row (PostgreSQL's grouped sums); both end in the same report.
#[derive(Debug)]
pub struct Aggregation<'q> {
    query: &'q UsageQuery,
    cells: BTreeMap<(i64, Option<String>), Totals>,
}

impl<'q> Aggregation<'q> {
    pub fn new(query: &'q UsageQuery) -> Self {
        Self { query, cells: BTreeMap::new() }
    }

    /// Adds one event if it lies in the range.
    pub fn add_event(&mut self, event: &UsageEvent) -> Result<(), Error> {
        if !self.query.range.contains(event.occurred_at) {
            return Ok(());
        }
        let bucket = self.query.bucket_of(event.occurred_at);
        self.add(bucket, self.query.group_by.key_of(event), u128::from(event.units), 1)
    }

    /// Adds `events` events of `units` units in total to a cell. A bucket
    /// outside the range means the store summed the wrong rows.
    pub fn add(&mut self, bucket: i64, key: Option<String>, units: u128, events: u128) -> Result<(), Error> {
        let (first, last) = self.query.bucket_bounds();
        if !(first..=last).contains(&bucket) {
            return Err(Error::StorageCorrupt(format!("bucket {bucket} is outside {first}..={last}")));
        }
        self.cells.entry((bucket, key)).or_default().add(units, events)
    }

    /// The report: every bucket of the range, empty ones included.
    pub fn finish(self) -> Result<UsageReport, Error> {
        let (first, last) = self.query.bucket_bounds();
        let mut total = Totals::default();
        let mut cells = self.cells.into_iter().peekable();
        let mut buckets = Vec::with_capacity(self.query.bucket_count() as usize);
        for index in first..=last {
            let (start, end) = self.query.bucket_span(index);
            let mut groups = Vec::new();
            while let Some(((_, key), totals)) = cells.next_if(|((bucket, _), _)| *bucket == index) {
                total.add(totals.units, totals.events)?;
                groups.push(GroupTotals { key, totals });
            }
            buckets.push(Bucket { start, end, groups });
        }
        Ok(UsageReport { query: self.query.clone(), buckets, total })
    }
}

/// One page of the export of a range's accepted events, in
/// `(occurred_at, request_id)` order (request ids compared byte by byte).
#[derive(Debug, Clone)]
pub struct ExportQuery {
    pub range: Range,
    /// The key of the last event of the previous page.
    pub after: Option<(Timestamp, String)>,
    pub limit: PageLimit,
    scope: Scope,
}

impl ExportQuery {
    /// A page of `account_id`'s export from its query-string values. The
    /// cursor is scoped by the account and the exact range.
    pub fn parse(
        account_id: &str,
        from: Option<&str>,
        to: Option<&str>,
        cursor: Option<&str>,
        limit: PageLimit,
    ) -> Result<Self, Error> {
        let range = Range::new(parse_instant("from", from)?, parse_instant("to", to)?)?;
        Self::new(account_id, range, cursor, limit)
    }

    pub fn new(account_id: &str, range: Range, cursor: Option<&str>, limit: PageLimit) -> Result<Self, Error> {
        let (from, to) = (range.from.as_nanosecond().to_string(), range.to.as_nanosecond().to_string());
        let scope = Scope::new("usage_events", &[account_id, &from, &to]);
        let after = match Start::of(&scope, cursor, 2)? {
            Start::First => None,
            Start::After(key) => {
                let at = key[0].parse::<i128>().ok().and_then(|ns| Timestamp::from_nanosecond(ns).ok());
                Some((at.ok_or(Error::InvalidCursor)?, key[1].clone()))
            }
        };
        Ok(Self { range, after, limit, scope })
    }

    /// Whether an event at `at` with `request_id` belongs on this page or a later one.
    pub fn admits(&self, at: Timestamp, request_id: &str) -> bool {
        self.range.contains(at)
            && self.after.as_ref().is_none_or(|(after, id)| (at, request_id) > (*after, id.as_str()))
    }

    /// The page from up to `limit + 1` events in export order.
    pub fn page(&self, rows: Vec<UsageEvent>) -> Page<UsageEvent> {
        Page::from_rows(rows, self.limit, &self.scope, |event| {
            vec![event.occurred_at.as_nanosecond().to_string(), event.request_id.clone()]
        })
    }

    /// The query of the page after the one whose cursor is `cursor`.
    pub fn resume(&self, account_id: &str, cursor: &str) -> Result<Self, Error> {
        Self::new(account_id, self.range, Some(cursor), self.limit)
    }
}

#[cfg(test)]
mod tests;
