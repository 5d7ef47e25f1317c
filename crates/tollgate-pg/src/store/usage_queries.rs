//! Usage queries and exports: each one statement on one account's events
//! (the totals read whole hours from the hourly totals instead, as the
//! core's `HourlyPlan` says);
//! only an empty answer reads the account too, to tell an unknown account
//! (`Engine::existing`). The core validated the query, and its
//! `Aggregation` turns the statement's grouped sums into the same report the
//! memory store builds event by event.

use sqlx::PgConnection;
use tollgate_core::query::{Aggregation, ExportQuery, GroupBy, UsageQuery, UsageReport};
use tollgate_core::{Dimensions, Error, InstantPair, Page, UsageEvent};

use super::Engine;
use super::errors::{corrupt, storable, storage_error};
use super::sql::{CUSTOM_PLANS_SQL, USAGE_EVENTS_AFTER_SQL, USAGE_EVENTS_FIRST_SQL, USAGE_HOURS_SQL, USAGE_TOTALS_SQL};

/// An event's dimensions as the JSON text its column stores; `None` (NULL)
/// for none.
pub(super) fn dimensions_json(dimensions: &Dimensions) -> Result<Option<String>, Error> {
    if dimensions.is_empty() {
        return Ok(None);
    }
    serde_json::to_string(dimensions).map(Some).map_err(|e| corrupt(format!("dimensions: {e}")))
}

fn dimensions_of(text: Option<String>) -> Result<Dimensions, Error> {
    match text {
        None => Ok(Dimensions::new()),
        Some(text) => serde_json::from_str(&text).map_err(|e| corrupt(format!("stored dimensions {text}: {e}"))),
    }
}

/// `(bucket, group key, units, events)`, the sums as decimal text.
type TotalsRow = (i64, Option<String>, String, String);

/// An exported event's columns.
type EventRow = (String, String, i64, i64, i16, Option<String>, Option<i64>, Option<String>);

pub(super) fn decimal(text: &str) -> Result<u128, Error> {
    text.parse().map_err(|_| corrupt(format!("usage total {text} is not a nonnegative 128-bit integer")))
}

fn event_of(account_id: &str, row: EventRow) -> Result<UsageEvent, Error> {
    let (request_id, credential_id, units, floor_us, submicro_ns, lease_id, fencing_token, dimensions) = row;
    let negative = |column: &str| corrupt(format!("usage event {request_id}: negative {column}"));
    Ok(UsageEvent {
        units: u64::try_from(units).map_err(|_| negative("units"))?,
        occurred_at: InstantPair::decode(floor_us, i64::from(submicro_ns))
            .map_err(|e| corrupt(format!("usage event {request_id}: {e}")))?,
        fencing_token: fencing_token.map(u64::try_from).transpose().map_err(|_| negative("fencing_token"))?,
        dimensions: dimensions_of(dimensions)?,
        account_id: account_id.to_owned(),
        request_id,
        credential_id,
        lease_id,
    })
}

impl Engine {
    pub(super) async fn usage_report(&self, account_id: &str, query: &UsageQuery) -> Result<UsageReport, Error> {
        if !storable(account_id) {
            return Err(Error::AccountNotFound);
        }
        let plan = query.hourly_plan();
        let (grouping, key) = match &query.group_by {
            GroupBy::Nothing => ("none", None),
            GroupBy::Credential => ("credential", None),
            GroupBy::Lease => ("lease", None),
            GroupBy::Funding => ("funding", None),
            GroupBy::Dimension(key) => ("dimension", Some(key.as_str())),
        };
        let reads_events = [plan.head, plan.tail].iter().any(|(from, to)| from < to);
        let sql = if reads_events { USAGE_TOTALS_SQL } else { USAGE_HOURS_SQL };
        let mut statement = sqlx::query_as(sql).bind(account_id);
        // An empty part is bound as NULLs, which its statement part tests
        // first: planned for its values, the part is then no scan at all,
        // where an empty range would still be estimated as rows to read.
        for (from, to) in [plan.head, plan.tail] {
            let bounds = (from < to).then(|| (InstantPair::encode(from), InstantPair::encode(to)));
            statement = statement
                .bind(bounds.map(|(from, _)| from.floor_us))
                .bind(bounds.map(|(from, _)| from.submicro_ns))
                .bind(bounds.map(|(_, to)| to.floor_us))
                .bind(bounds.map(|(_, to)| to.submicro_ns));
        }
        let hours = (plan.hours.0 < plan.hours.1).then_some(plan.hours);
        let statement = statement
            .bind(query.window.map(|window| window.micros()))
            .bind(grouping)
            .bind(key)
            .bind(hours.map(|(first, _)| first))
            .bind(hours.map(|(_, end)| end));
        let rows: Vec<TotalsRow> = if reads_events {
            // Planned for its values (an index range or a scan of the events,
            // by how much of the table they are), in one read-only
            // transaction, so that the custom plans end with it.
            self.transaction(async |tx: &mut PgConnection| {
                sqlx::query(CUSTOM_PLANS_SQL).execute(&mut *tx).await.map_err(storage_error)?;
                statement.fetch_all(&mut *tx).await.map_err(storage_error)
            })
            .await?
        } else {
            // Whole hours only: the hourly totals alone, as the pool's
            // connections plan it, in one round trip.
            statement.fetch_all(&self.pool).await.map_err(storage_error)?
        };
        self.existing(account_id, rows.len()).await?;
        let mut aggregation = Aggregation::new(query);
        for (bucket, key, units, events) in rows {
            aggregation.add(bucket, key, decimal(&units)?, decimal(&events)?)?;
        }
        aggregation.finish()
    }

    pub(super) async fn usage_events_page(
        &self,
        account_id: &str,
        query: &ExportQuery,
    ) -> Result<Page<UsageEvent>, Error> {
        if !storable(account_id) {
            return Err(Error::AccountNotFound);
        }
        let (from, to) = (InstantPair::encode(query.range.from), InstantPair::encode(query.range.to));
        let rows = i64::from(query.limit.get()) + 1;
        let statement = match &query.after {
            None => sqlx::query_as(USAGE_EVENTS_FIRST_SQL),
            Some(_) => sqlx::query_as(USAGE_EVENTS_AFTER_SQL),
        };
        let mut statement = statement
            .bind(account_id)
            .bind(from.floor_us)
            .bind(from.submicro_ns)
            .bind(to.floor_us)
            .bind(to.submicro_ns);
        if let Some((at, request_id)) = &query.after {
            // A request id with NUL was never accepted; such a cursor is no
            // position (of an account that exists: an unknown one is that).
            if !storable(request_id) {
                self.existing(account_id, 0).await?;
                return Err(Error::InvalidCursor);
            }
            let after = InstantPair::encode(*at);
            statement = statement.bind(after.floor_us).bind(after.submicro_ns).bind(request_id.clone());
        }
        let rows: Vec<EventRow> = statement.bind(rows).fetch_all(&self.pool).await.map_err(storage_error)?;
        self.existing(account_id, rows.len()).await?;
        let events = rows.into_iter().map(|row| event_of(account_id, row)).collect::<Result<Vec<_>, _>>()?;
        Ok(query.page(events))
    }
}
