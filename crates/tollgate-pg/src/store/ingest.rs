//! Usage ingestion: one transaction per batch that locks what the batch
//! names (accounts, then leases, then credentials), reads which request ids
//! are already recorded, and persists what `usage::classify` decided.

use std::collections::HashSet;

use jiff::Timestamp;
use sqlx::PgConnection;
use tollgate_core::journal::usage_changes;
use tollgate_core::usage::{self, UsageSnapshot};
use tollgate_core::{BATCH_EVENTS_MAX, Error, EventOutcome, IngestError, UsageEvent};

use super::errors::{ingest_error, storage_error};
use super::load::{Busy, finish, lock_accounts, lock_leases, sorted_ids};
use super::persist::{Changes, persist};
use super::rows::CredentialRow;
use super::sql::{LOCK_CREDENTIALS_SQL, READ_CREDENTIALS_ANY_ACCOUNT_SQL, RECORDED_EVENTS_SQL};
use super::{DOMAIN, Engine};

impl Engine {
    pub(super) async fn ingest_inner(
        &self,
        batch: &[UsageEvent],
        now: Timestamp,
    ) -> Result<Vec<EventOutcome>, IngestError> {
        // Bound what is loaded before loading it; the core enforces the same bound.
        if batch.len() > BATCH_EVENTS_MAX {
            return Err(IngestError::BatchTooLarge { events: batch.len(), max: BATCH_EVENTS_MAX });
        }
        let mut tx = self.begin().await.map_err(ingest_error)?;
        let result: Result<Vec<EventOutcome>, IngestError> = async {
            let snapshot = load_snapshot(&mut tx, batch).await.map_err(ingest_error)?;
            let plan = usage::classify(batch, now, &self.policy, DOMAIN, &snapshot)?;
            if plan.accepted.is_empty() {
                return Ok(plan.outcomes);
            }
            let journal = usage_changes(batch, &plan, |id| snapshot.accounts.get(id));
            let changes = Changes {
                journal,
                now,
                accounts: plan.accounts.into_values().collect(),
                leases: plan.leases.into_values().collect(),
                credentials: plan.credentials.into_values().collect(),
                events: plan.accepted.iter().map(|&index| &batch[index]).collect(),
                granted: Vec::new(),
            };
            persist(&mut tx, &changes).await.map_err(ingest_error)?;
            Ok(plan.outcomes)
        }
        .await;
        finish(tx, result, ingest_error).await
    }
}

/// Locks and reads what a batch names: its accounts, then those of its leases
/// and of its credentials that belong to them, and the request ids of these
/// accounts already accepted. A credential of no account of the batch is read
/// without a lock, to tell a credential of another account from an unknown one.
async fn load_snapshot(conn: &mut PgConnection, batch: &[UsageEvent]) -> Result<UsageSnapshot, Error> {
    let account_ids = sorted_ids(batch.iter().map(|e| e.account_id.as_str()));
    let lease_ids = sorted_ids(batch.iter().filter_map(|e| e.lease_id.as_deref()));
    let credential_ids = sorted_ids(batch.iter().map(|e| e.credential_id.as_str()));
    let request_ids = sorted_ids(batch.iter().map(|e| e.request_id.as_str()));

    let mut snapshot = UsageSnapshot {
        accounts: lock_accounts(conn, &account_ids, Busy::Wait).await?.into_iter().collect(),
        ..UsageSnapshot::default()
    };
    let locked: Vec<String> = snapshot.accounts.keys().cloned().collect();
    if !lease_ids.is_empty() {
        snapshot.leases =
            lock_leases(conn, &lease_ids, &locked).await?.into_iter().map(|(id, record)| (id, record.lease)).collect();
    }
    let credentials: Vec<CredentialRow> = sqlx::query_as(LOCK_CREDENTIALS_SQL)
        .bind(&credential_ids)
        .bind(&locked)
        .fetch_all(&mut *conn)
        .await
        .map_err(storage_error)?;
    remember_credentials(&mut snapshot, credentials)?;
    // A credential none of the batch's accounts holds is read, unlocked, only
    // to reject its events as naming another account's credential; nothing of
    // it is written, and its account never changes.
    let elsewhere: Vec<String> =
        credential_ids.iter().filter(|id| !snapshot.credentials.contains_key(*id)).cloned().collect();
    if !elsewhere.is_empty() {
        let credentials: Vec<CredentialRow> = sqlx::query_as(READ_CREDENTIALS_ANY_ACCOUNT_SQL)
            .bind(&elsewhere)
            .fetch_all(&mut *conn)
            .await
            .map_err(storage_error)?;
        remember_credentials(&mut snapshot, credentials)?;
    }
    // Read after the account locks, so no accepted ID of these accounts can
    // be missing from this statement's snapshot.
    let recorded: Vec<(String, String)> = sqlx::query_as(RECORDED_EVENTS_SQL)
        .bind(&account_ids)
        .bind(&request_ids)
        .fetch_all(&mut *conn)
        .await
        .map_err(storage_error)?;
    snapshot.recorded = recorded.into_iter().collect::<HashSet<_>>();
    Ok(snapshot)
}

/// Adds the credentials of `rows` to the batch's snapshot, by id.
fn remember_credentials(snapshot: &mut UsageSnapshot, rows: Vec<CredentialRow>) -> Result<(), Error> {
    for row in rows {
        let record = row.decode()?;
        snapshot.credentials.insert(record.credential.credential_id.clone(), record.credential);
    }
    Ok(())
}
