//! Webhook endpoints: creating, listing, deleting (with their deliveries)
//! and rotating their secrets, which the caller sealed.

use jiff::Timestamp;
use sqlx::PgConnection;
use tollgate_core::alerts::{ENDPOINTS_MAX, validate_endpoint};
use tollgate_core::{Error, InstantPair};
use tollgate_store::{NewEndpoint, SecretRotation, WebhookEndpoint, new_endpoint_id};

use super::rows::{EndpointRow, bound};
use crate::store::Engine;
use crate::store::errors::{storable, storage_error};
use crate::store::load::one_row;
use crate::store::sql::{
    DELETE_ENDPOINT_DELIVERIES_SQL, DELETE_ENDPOINT_SQL, ENDPOINTS_LOCK_SQL, INSERT_ENDPOINT_SQL, READ_ENDPOINTS_SQL,
    ROTATE_SECRET_SQL,
};

impl Engine {
    pub(super) async fn add_endpoint(
        &self,
        endpoint: NewEndpoint<'_>,
        now: Timestamp,
    ) -> Result<WebhookEndpoint, Error> {
        let NewEndpoint { url, event_types: types, sealed_secret } = endpoint;
        validate_endpoint(url, types)?;
        let endpoint_id = new_endpoint_id();
        let names: Vec<&str> = types.iter().map(|kind| kind.as_str()).collect();
        let created = InstantPair::encode(now);
        self.transaction(async |tx: &mut PgConnection| {
            sqlx::query(ENDPOINTS_LOCK_SQL).execute(&mut *tx).await.map_err(storage_error)?;
            let inserted: Option<String> = sqlx::query_scalar(INSERT_ENDPOINT_SQL)
                .bind(&endpoint_id)
                .bind(url)
                .bind(names)
                .bind(sealed_secret)
                .bind(created.floor_us)
                .bind(created.submicro_ns)
                .bind(bound(ENDPOINTS_MAX))
                .fetch_optional(&mut *tx)
                .await
                .map_err(storage_error)?;
            inserted.ok_or(Error::TooManyEndpoints { max: ENDPOINTS_MAX })?;
            Ok(WebhookEndpoint {
                endpoint_id: endpoint_id.clone(),
                url: url.to_owned(),
                event_types: types.to_vec(),
                created_at: now,
                rotated_at: None,
                previous_secret_until: None,
            })
        })
        .await
    }

    pub(super) async fn all_endpoints(&self) -> Result<Vec<WebhookEndpoint>, Error> {
        let rows: Vec<EndpointRow> =
            sqlx::query_as(READ_ENDPOINTS_SQL).fetch_all(&self.pool).await.map_err(storage_error)?;
        rows.into_iter().map(EndpointRow::decode).collect()
    }

    pub(super) async fn remove_endpoint(&self, endpoint_id: &str) -> Result<(), Error> {
        if !storable(endpoint_id) {
            return Err(Error::EndpointNotFound);
        }
        self.transaction(async |tx: &mut PgConnection| {
            let deleted =
                sqlx::query(DELETE_ENDPOINT_SQL).bind(endpoint_id).execute(&mut *tx).await.map_err(storage_error)?;
            if deleted.rows_affected() == 0 {
                return Err(Error::EndpointNotFound);
            }
            sqlx::query(DELETE_ENDPOINT_DELIVERIES_SQL)
                .bind(endpoint_id)
                .execute(&mut *tx)
                .await
                .map_err(storage_error)?;
            Ok(())
        })
        .await
    }

    pub(super) async fn rotate_secret(
        &self,
        rotation: SecretRotation<'_>,
        now: Timestamp,
    ) -> Result<WebhookEndpoint, Error> {
        let SecretRotation { endpoint_id, sealed_secret, previous_until } = rotation;
        if !storable(endpoint_id) {
            return Err(Error::EndpointNotFound);
        }
        let (until, rotated) = (InstantPair::encode(previous_until), InstantPair::encode(now));
        let query = sqlx::query_as(ROTATE_SECRET_SQL)
            .bind(endpoint_id)
            .bind(sealed_secret)
            .bind(until.floor_us)
            .bind(until.submicro_ns)
            .bind(rotated.floor_us)
            .bind(rotated.submicro_ns);
        let row: EndpointRow = one_row(query, &self.pool, Error::EndpointNotFound).await?;
        row.decode()
    }
}
