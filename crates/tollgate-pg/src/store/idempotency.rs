//! Keyed requests: the idempotency record and the operation's effect in one
//! transaction.
//!
//! A keyed request always takes the locking path. Its transaction first claims
//! the key's row (`CLAIM_KEY_SQL`): an insert that, on conflict with an expired record,
//! overwrites it, and on conflict with a live one changes nothing but still
//! locks it. The claim comes first in the global lock order (idempotency key,
//! then accounts, leases, credentials): only keyed transactions take key rows,
//! each takes one, and before any other lock. A concurrent request with the
//! same key waits on the unique index until the first commits or rolls back,
//! then sees its record (and replays it) or claims the key itself. Then the
//! operation runs on the same transaction, and its sealed answer is stored
//! (`RECORD_KEY_SQL`) before the commit. A refused operation rolls the claim back, so
//! refusals are never recorded.

use jiff::Timestamp;
use sqlx::{FromRow, PgConnection};
use tollgate_core::{Error, InstantPair};
use tollgate_store::{Claim, IDEMPOTENCY_PURGE_BATCH_MAX, Idempotency, Replayable, Request};

use super::Engine;
use super::errors::{storable, storage_error};
use super::sql::{CLAIM_KEY_SQL, PURGE_KEYS_SQL, RECORD_KEY_SQL, RECORDED_KEY_SQL};

#[derive(FromRow)]
struct RecordedRow {
    fingerprint: Vec<u8>,
    sealed_answer: Vec<u8>,
}

impl Engine {
    /// Runs `operation` on a transaction that holds the key's record: replays a
    /// live record of the same request, refuses one of another request, and
    /// otherwise records the operation's answer with its effect.
    pub(super) async fn keyed<T: Replayable>(
        &self,
        idempotency: &Idempotency,
        request: Request<'_>,
        now: Timestamp,
        operation: impl AsyncFnOnce(&mut PgConnection) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let account_id = Self::account_of(&request)?.to_owned();
        let claim = Claim::new(idempotency, &request, now);
        self.transaction(async |tx: &mut PgConnection| {
            if !claim_key(tx, &account_id, &claim, now).await? {
                let row: RecordedRow = sqlx::query_as(RECORDED_KEY_SQL)
                    .bind(&account_id)
                    .bind(claim.lookup_id.as_slice())
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(storage_error)?;
                return claim.replay(&row.fingerprint, &row.sealed_answer);
            }
            let answer = operation(tx).await?;
            sqlx::query(RECORD_KEY_SQL)
                .bind(&account_id)
                .bind(claim.lookup_id.as_slice())
                .bind(claim.seal(&answer.to_answer()))
                .execute(&mut *tx)
                .await
                .map_err(storage_error)?;
            Ok(answer)
        })
        .await
    }

    /// The account the request names, which the record is stored under: a
    /// lease or a credential is named with its account, so no read is needed.
    /// One that PostgreSQL cannot store is the operation's own refusal.
    fn account_of<'r>(request: &'r Request<'_>) -> Result<&'r str, Error> {
        let missing = match request {
            Request::Acquire(_) | Request::Consolidate(_) | Request::IssueCredential { .. } => Error::AccountNotFound,
            Request::Release(_) => Error::LeaseNotFound,
            Request::RevokeCredential { .. } => Error::CredentialNotFound,
        };
        let account_id = request.account_id();
        if storable(account_id) && storable(request.resource()) { Ok(account_id) } else { Err(missing) }
    }

    pub(super) async fn purge_expired_keys(&self, now: Timestamp, limit: u32) -> Result<u32, Error> {
        let limit = limit.min(IDEMPOTENCY_PURGE_BATCH_MAX);
        if limit == 0 {
            return Ok(0);
        }
        let now = InstantPair::encode(now);
        let purged = sqlx::query(PURGE_KEYS_SQL)
            .bind(now.floor_us)
            .bind(now.submicro_ns)
            .bind(i64::from(limit))
            .execute(&self.pool)
            .await
            .map_err(storage_error)?;
        // At most `limit` rows, which fits.
        Ok(purged.rows_affected() as u32)
    }
}

/// Whether this transaction now owns the key (a new or expired record).
async fn claim_key(conn: &mut PgConnection, account_id: &str, claim: &Claim, now: Timestamp) -> Result<bool, Error> {
    let created = InstantPair::encode(now);
    let expires = InstantPair::encode(claim.expires_at);
    let claimed: Option<Vec<u8>> = sqlx::query_scalar(CLAIM_KEY_SQL)
        .bind(account_id)
        .bind(claim.lookup_id.as_slice())
        .bind(claim.fingerprint.as_slice())
        .bind(created.floor_us)
        .bind(created.submicro_ns)
        .bind(expires.floor_us)
        .bind(expires.submicro_ns)
        .fetch_optional(conn)
        .await
        .map_err(storage_error)?;
    Ok(claimed.is_some())
}
