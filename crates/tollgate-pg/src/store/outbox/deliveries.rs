//! Deliveries: claiming due ones for an attempt, recording an attempt's
//! result, the delivery log, redelivery and the counts by state.

use jiff::Timestamp;
use tollgate_core::{Error, InstantPair, Listing, Page, PageRequest};
use tollgate_store::{
    AttemptResult, ClaimedDelivery, Delivery, DeliveryClaim, DeliveryState, FinishedAttempt, OutboxCounts,
};

use super::rows::{ClaimRow, DeliveryRow, bound, nonnegative};
use crate::store::Engine;
use crate::store::errors::{corrupt, storable, storage_error};
use crate::store::load::one_row;
use crate::store::sql::{
    CLAIM_DELIVERIES_SQL, FINISH_DELIVERY_SQL, LIST_DELIVERIES_SQL, OUTBOX_COUNTS_SQL, READ_ENDPOINT_SQL, REDELIVER_SQL,
};

/// An attempt's result as the delivery's columns record it.
struct Finished {
    state: DeliveryState,
    next_attempt: Option<InstantPair>,
    error: Option<String>,
    status: Option<u16>,
    delivered: Option<InstantPair>,
}

impl Finished {
    fn of(result: AttemptResult, now: Timestamp) -> Self {
        // PostgreSQL text cannot hold NUL, which an error message could.
        let text = |error: String| Some(error.replace('\0', "\u{fffd}"));
        match result {
            AttemptResult::Delivered { status } => Self {
                state: DeliveryState::Delivered,
                next_attempt: None,
                error: None,
                status: Some(status),
                delivered: Some(InstantPair::encode(now)),
            },
            AttemptResult::Retry { at, error, status } => Self {
                state: DeliveryState::Pending,
                next_attempt: Some(InstantPair::encode(at)),
                error: text(error),
                status,
                delivered: None,
            },
            AttemptResult::Failed { error, status } => {
                Self { state: DeliveryState::Failed, next_attempt: None, error: text(error), status, delivered: None }
            }
        }
    }
}

impl Engine {
    pub(super) async fn claim(&self, claim: DeliveryClaim<'_>, now: Timestamp) -> Result<Vec<ClaimedDelivery>, Error> {
        let DeliveryClaim { limit, claim_for, skip } = claim;
        if limit == 0 {
            return Ok(Vec::new());
        }
        // An id PostgreSQL cannot store names no endpoint.
        let skip: Vec<&str> = skip.iter().map(String::as_str).filter(|id| storable(id)).collect();
        let at = InstantPair::encode(now);
        let lapses = InstantPair::encode(now.checked_add(claim_for).unwrap_or(Timestamp::MAX));
        let rows: Vec<ClaimRow> = sqlx::query_as(CLAIM_DELIVERIES_SQL)
            .bind(at.floor_us)
            .bind(at.submicro_ns)
            .bind(i64::from(limit))
            .bind(lapses.floor_us)
            .bind(lapses.submicro_ns)
            .bind(skip)
            .fetch_all(&self.pool)
            .await
            .map_err(storage_error)?;
        rows.into_iter().map(ClaimRow::decode).collect()
    }

    pub(super) async fn finish_attempt(&self, finished: FinishedAttempt<'_>, now: Timestamp) -> Result<bool, Error> {
        let FinishedAttempt { delivery_id, attempt, result } = finished;
        // No stored delivery has such an id, or so many attempts.
        let Ok(attempt) = i32::try_from(attempt) else { return Ok(false) };
        if !storable(delivery_id) {
            return Ok(false);
        }
        let finished = Finished::of(result, now);
        let updated = sqlx::query(FINISH_DELIVERY_SQL)
            .bind(delivery_id)
            .bind(attempt)
            .bind(finished.state.as_str())
            .bind(finished.next_attempt.map(|at| at.floor_us))
            .bind(finished.next_attempt.map(|at| at.submicro_ns))
            .bind(finished.error)
            .bind(finished.status.map(i32::from))
            .bind(finished.delivered.map(|at| at.floor_us))
            .bind(finished.delivered.map(|at| at.submicro_ns))
            .execute(&self.pool)
            .await
            .map_err(storage_error)?;
        Ok(updated.rows_affected() > 0)
    }

    pub(super) async fn deliveries_page(&self, endpoint_id: &str, page: &PageRequest) -> Result<Page<Delivery>, Error> {
        let listing = Listing::deliveries(endpoint_id, page)?;
        if !storable(endpoint_id) {
            return Err(Error::EndpointNotFound);
        }
        let rows: Vec<DeliveryRow> = sqlx::query_as(LIST_DELIVERIES_SQL)
            .bind(endpoint_id)
            .bind(listing.after().unwrap_or(""))
            .bind(bound(listing.fetch()))
            .fetch_all(&self.pool)
            .await
            .map_err(storage_error)?;
        // An endpoint's deliveries are deleted with it, so only an empty
        // page may mean an unknown endpoint.
        if rows.is_empty() {
            let found: Option<String> = sqlx::query_scalar(READ_ENDPOINT_SQL)
                .bind(endpoint_id)
                .fetch_optional(&self.pool)
                .await
                .map_err(storage_error)?;
            found.ok_or(Error::EndpointNotFound)?;
        }
        let deliveries = rows.into_iter().map(DeliveryRow::decode).collect::<Result<Vec<_>, _>>()?;
        Ok(listing.page(deliveries, |delivery| delivery.delivery_id.as_str()))
    }

    pub(super) async fn deliver_again(
        &self,
        endpoint_id: &str,
        delivery_id: &str,
        now: Timestamp,
    ) -> Result<Delivery, Error> {
        if !storable(endpoint_id) || !storable(delivery_id) {
            return Err(Error::DeliveryNotFound);
        }
        let due = InstantPair::encode(now);
        let query =
            sqlx::query_as(REDELIVER_SQL).bind(endpoint_id).bind(delivery_id).bind(due.floor_us).bind(due.submicro_ns);
        let row: DeliveryRow = one_row(query, &self.pool, Error::DeliveryNotFound).await?;
        row.decode()
    }

    pub(super) async fn counts(&self) -> Result<OutboxCounts, Error> {
        let rows: Vec<(String, i64)> =
            sqlx::query_as(OUTBOX_COUNTS_SQL).fetch_all(&self.pool).await.map_err(storage_error)?;
        let mut counts = OutboxCounts::default();
        for (state, deliveries) in rows {
            let deliveries = nonnegative("webhook deliveries", deliveries)?;
            match DeliveryState::parse(&state) {
                Some(DeliveryState::Pending) => counts.pending = deliveries,
                Some(DeliveryState::Delivered) => counts.delivered = deliveries,
                Some(DeliveryState::Failed) => counts.failed = deliveries,
                None => return Err(corrupt(format!("webhook deliveries in state {state:?}"))),
            }
        }
        Ok(counts)
    }
}
