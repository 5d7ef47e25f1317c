//! The store's shared settings and status: the pinned reclaim grace, the
//! applied migrations and PostgreSQL's clock.

use jiff::{SignedDuration, Timestamp};
use tollgate_core::Error;
use tollgate_store::{MigrationStatus, StorageStatus};

use super::Engine;
use super::errors::{corrupt, storage_error};
use super::sql::{APPLIED_MIGRATIONS_SQL, PIN_SETTING_SQL, REPLACE_SETTING_SQL, SHARED_CLOCK_SQL};
use crate::migrations;

/// The settings row that pins the reclaim grace shared by every server, as an
/// ISO 8601 duration (exact to the nanosecond).
const RECLAIM_GRACE_SETTING: &str = "reclaim_grace";

/// Statements `pin_reclaim_grace` runs before giving up: the second one
/// always sees a row another server's concurrent insert committed
/// (`PIN_SETTING_SQL`).
const PIN_ATTEMPTS_MAX: u32 = 2;

impl Engine {
    pub(super) async fn storage_status(&self) -> Result<StorageStatus, Error> {
        let applied: Vec<i64> =
            sqlx::query_scalar(APPLIED_MIGRATIONS_SQL).fetch_all(&self.pool).await.map_err(storage_error)?;
        let known = migrations::MIGRATOR.iter().map(|m| m.version).collect();
        Ok(StorageStatus { backend: "postgres", migrations: Some(MigrationStatus { applied, known }) })
    }

    /// PostgreSQL's `clock_timestamp()`, to the microsecond it keeps.
    pub(super) async fn clock(&self) -> Result<Option<Timestamp>, Error> {
        let micros: i64 = sqlx::query_scalar(SHARED_CLOCK_SQL).fetch_one(&self.pool).await.map_err(storage_error)?;
        Timestamp::from_microsecond(micros)
            .map(Some)
            .map_err(|e| corrupt(format!("PostgreSQL's clock reads {micros} µs: {e}")))
    }

    pub(super) async fn pin_grace(&self, replace: bool) -> Result<(), Error> {
        let configured = self.policy.reclaim_grace();
        if replace {
            sqlx::query(REPLACE_SETTING_SQL)
                .bind(RECLAIM_GRACE_SETTING)
                .bind(configured.to_string())
                .execute(&self.pool)
                .await
                .map_err(storage_error)?;
            return Ok(());
        }
        let mut recorded = None;
        for _ in 0..PIN_ATTEMPTS_MAX {
            recorded = sqlx::query_scalar::<_, String>(PIN_SETTING_SQL)
                .bind(RECLAIM_GRACE_SETTING)
                .bind(configured.to_string())
                .fetch_optional(&self.pool)
                .await
                .map_err(storage_error)?;
            if recorded.is_some() {
                break;
            }
        }
        let recorded = recorded.ok_or_else(|| {
            corrupt(format!("tollgate_settings {RECLAIM_GRACE_SETTING} vanished as soon as it was recorded"))
        })?;
        let recorded_grace: SignedDuration = recorded
            .parse()
            .map_err(|e| corrupt(format!("tollgate_settings {RECLAIM_GRACE_SETTING} is {recorded:?}: {e}")))?;
        if recorded_grace != configured {
            return Err(Error::ReclaimGraceMismatch { recorded, configured: configured.to_string() });
        }
        Ok(())
    }
}
