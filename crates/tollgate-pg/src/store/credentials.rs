//! Credentials: issuing, verifying, revoking and reading them.

use jiff::Timestamp;
use sqlx::PgConnection;
use tollgate_core::ids::validate_label;
use tollgate_core::{Credential, Error, InstantPair, KeyRoute, SecretHash, route_credential_key};
use tollgate_store::{
    Idempotency, IssuedCredential, NewCredential, Request, Revocation, Verification, new_credential_id,
    new_credential_key,
};

use super::Engine;
use super::errors::{storable, storage_error};
use super::load::one_row;
use super::rows::CredentialRow;
use super::sql::{
    CREDENTIAL_BY_KEY_SQL, INSERT_CREDENTIAL_SQL, LEGACY_KEY_ACCOUNT_SQL, LOCK_CREDENTIAL_SQL, READ_CREDENTIAL_SQL,
    REVOKE_CREDENTIAL_SQL,
};

pub(super) async fn insert_credential(
    conn: &mut PgConnection,
    request: NewCredential<'_>,
    now: Timestamp,
) -> Result<IssuedCredential, Error> {
    let NewCredential { account_id, label } = request;
    let key = new_credential_key(account_id);
    let credential = Credential::issued(new_credential_id(), account_id.to_owned(), label.to_owned(), now);
    let created = InstantPair::encode(now);
    let inserted = sqlx::query(INSERT_CREDENTIAL_SQL)
        .bind(&credential.credential_id)
        .bind(account_id)
        .bind(label)
        .bind(key.hash().as_bytes().to_vec())
        .bind(created.floor_us)
        .bind(created.submicro_ns)
        .execute(conn)
        .await
        .map_err(storage_error)?;
    if inserted.rows_affected() == 0 {
        return Err(Error::AccountNotFound);
    }
    Ok(IssuedCredential { credential, key })
}

/// Revokes a credential under its row lock; revoking again keeps the first
/// revocation time.
pub(super) async fn revoke_locked(
    conn: &mut PgConnection,
    request: Revocation<'_>,
    now: Timestamp,
) -> Result<Credential, Error> {
    let query = sqlx::query_as(LOCK_CREDENTIAL_SQL).bind(request.account_id).bind(request.credential_id);
    let row: CredentialRow = one_row(query, &mut *conn, Error::CredentialNotFound).await?;
    let mut credential = row.decode()?.credential;
    credential.revoke(now);
    let revoked = credential.revoked_at.map(InstantPair::encode);
    sqlx::query(REVOKE_CREDENTIAL_SQL)
        .bind(request.account_id)
        .bind(request.credential_id)
        .bind(revoked.map(|p| p.floor_us))
        .bind(revoked.map(|p| p.submicro_ns))
        .execute(conn)
        .await
        .map_err(storage_error)?;
    Ok(credential)
}

impl Engine {
    pub(super) async fn issue_credential(
        &self,
        idempotency: Option<&Idempotency>,
        request: NewCredential<'_>,
        now: Timestamp,
    ) -> Result<IssuedCredential, Error> {
        validate_label(request.label)?;
        // PostgreSQL text cannot hold NUL; such a label is not storable here.
        if !storable(request.label) {
            return Err(Error::InvalidLabel);
        }
        if !storable(request.account_id) {
            return Err(Error::AccountNotFound);
        }
        let operation = async |conn: &mut PgConnection| insert_credential(conn, request, now).await;
        if let Some(idempotency) = idempotency {
            return self.keyed(idempotency, Request::IssueCredential(request), now, operation).await;
        }
        let mut conn = self.pool.acquire().await.map_err(storage_error)?;
        operation(&mut conn).await
    }

    /// Looks the key up under the account it names: one statement, on one
    /// account. A key in the legacy form (issued before keys named their
    /// account) finds its account in the directory migration 0020 filled,
    /// then its credential on that account: two statements, each on one key
    /// or one account. A malformed key runs none.
    pub(super) async fn verify(&self, key: &str) -> Result<Verification, Error> {
        let hash = SecretHash::of(key);
        let account_id = match route_credential_key(key) {
            KeyRoute::Account(account_id) if storable(account_id) => account_id.to_owned(),
            KeyRoute::Legacy => {
                let account: Option<String> = sqlx::query_scalar(LEGACY_KEY_ACCOUNT_SQL)
                    .bind(hash.as_bytes().to_vec())
                    .fetch_optional(&self.pool)
                    .await
                    .map_err(storage_error)?;
                match account {
                    Some(account_id) => account_id,
                    None => return Ok(Verification::of(None)),
                }
            }
            KeyRoute::Account(_) | KeyRoute::Malformed => return Ok(Verification::of(None)),
        };
        let row: Option<CredentialRow> = sqlx::query_as(CREDENTIAL_BY_KEY_SQL)
            .bind(&account_id)
            .bind(hash.as_bytes().to_vec())
            .fetch_optional(&self.pool)
            .await
            .map_err(storage_error)?;
        let record = row.map(CredentialRow::decode).transpose()?.filter(|record| record.key.matches(key));
        Ok(Verification::of(record.as_ref().map(|record| &record.credential)))
    }

    pub(super) async fn revoke(
        &self,
        idempotency: Option<&Idempotency>,
        request: Revocation<'_>,
        now: Timestamp,
    ) -> Result<Credential, Error> {
        if !storable(request.account_id) || !storable(request.credential_id) {
            return Err(Error::CredentialNotFound);
        }
        let operation = async |conn: &mut PgConnection| revoke_locked(conn, request, now).await;
        if let Some(idempotency) = idempotency {
            return self.keyed(idempotency, Request::RevokeCredential(request), now, operation).await;
        }
        self.transaction(operation).await
    }

    pub(super) async fn read_credential(&self, account_id: &str, credential_id: &str) -> Result<Credential, Error> {
        if !storable(account_id) || !storable(credential_id) {
            return Err(Error::CredentialNotFound);
        }
        let query = sqlx::query_as(READ_CREDENTIAL_SQL).bind(account_id).bind(credential_id);
        let row: CredentialRow = one_row(query, &self.pool, Error::CredentialNotFound).await?;
        Ok(row.decode()?.credential)
    }
}
