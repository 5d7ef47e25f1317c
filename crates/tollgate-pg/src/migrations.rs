//! The embedded migration catalogue and the one way this crate applies it.
//!
//! Migrations are append-only history: a change is a new forward migration,
//! never an edit (sqlx refuses an edited file by checksum). There are no down
//! migrations. Applying always runs sqlx's own validation first, so a database
//! that holds a version this binary does not know is refused: that is the
//! fence that keeps an old binary from cold-starting on a newer schema.

use std::collections::BTreeSet;
use std::time::Duration;

use sqlx::migrate::{Migrate, MigrateError, Migrator};
use sqlx::{PgConnection, PgPool};

/// Every migration this binary carries, embedded at compile time.
pub static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// The table sqlx records applied versions in. `MIGRATOR` uses the default.
const MIGRATIONS_TABLE: &str = "_sqlx_migrations";

/// The highest version in the embedded catalogue.
pub fn latest_version() -> i64 {
    MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0)
}

/// The embedded versions from `first` on, in order: what applying the
/// catalogue to a database at version `first - 1` reports.
pub fn versions_from(first: i64) -> Vec<i64> {
    MIGRATOR.iter().map(|m| m.version).filter(|version| *version >= first).collect()
}

/// A catalogue holding only the embedded versions `<= version`, exactly as an
/// older binary built at that point would carry them. Tests use it to stand in
/// for old binaries (and to prepare a database at an old version).
pub fn migrator_through(version: i64) -> Migrator {
    let migrations = MIGRATOR.iter().filter(|m| m.version <= version).cloned().collect();
    Migrator::with_migrations(migrations)
}

/// One migration that `apply` ran, for `tollgate migrate` to report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppliedMigration {
    pub version: i64,
    pub description: String,
    pub duration: Duration,
}

/// Why migrating failed. Every variant that concerns one migration names it.
#[derive(Debug, thiserror::Error)]
pub enum MigrationError {
    /// The database is ahead of this binary. Refused by design: an old binary
    /// must not serve a newer schema (`docs/rules.md`, Migrations).
    #[error(
        "database has migration {version} applied, which this binary does not know \
         (its catalogue ends at {catalogue_latest}); refusing to start an older binary \
         against a newer schema"
    )]
    UnknownVersion { version: i64, catalogue_latest: i64 },

    /// An applied migration's text differs from the embedded file.
    #[error(
        "migration {version} was applied from different text than this binary carries \
         (checksum mismatch); migrations are append-only and must never be edited"
    )]
    Modified { version: i64 },

    /// A migration failed and its transaction rolled back; earlier versions stay
    /// applied and authoritative.
    #[error("migration {version} failed and was rolled back: {source}")]
    Failed {
        version: i64,
        #[source]
        source: sqlx::Error,
    },

    /// sqlx recorded the version as started but not finished.
    #[error("migration {version} is recorded as partially applied; inspect _sqlx_migrations")]
    Dirty { version: i64 },

    /// The database could not be reached or the bookkeeping queries failed.
    #[error("migrating the database failed: {0}")]
    Database(#[source] sqlx::Error),

    /// Anything else sqlx reports, kept whole.
    #[error("migrating the database failed: {0}")]
    Other(#[source] MigrateError),
}

impl MigrationError {
    /// The migration version the error is about, when it is about one.
    pub fn version(&self) -> Option<i64> {
        match self {
            MigrationError::UnknownVersion { version, .. }
            | MigrationError::Modified { version }
            | MigrationError::Failed { version, .. }
            | MigrationError::Dirty { version } => Some(*version),
            MigrationError::Database(_) | MigrationError::Other(_) => None,
        }
    }

    fn from_sqlx(error: MigrateError, migrator: &Migrator) -> MigrationError {
        let catalogue_latest = migrator.iter().map(|m| m.version).max().unwrap_or(0);
        match error {
            MigrateError::VersionMissing(version) => MigrationError::UnknownVersion { version, catalogue_latest },
            MigrateError::VersionMismatch(version) => MigrationError::Modified { version },
            MigrateError::ExecuteMigration(source, version) => MigrationError::Failed { version, source },
            MigrateError::Dirty(version) => MigrationError::Dirty { version },
            MigrateError::Execute(source) => MigrationError::Database(source),
            other => MigrationError::Other(other),
        }
    }
}

/// Applies every pending embedded migration, after sqlx's validation of the
/// applied history, and reports what ran in version order.
pub async fn apply(pool: &PgPool) -> Result<Vec<AppliedMigration>, MigrationError> {
    apply_with(&MIGRATOR, pool).await
}

/// `apply` with an explicit catalogue (tests pass `migrator_through(n)`).
///
/// sqlx's migrator does the work, validation included. To report which
/// versions *this* call applied, the migration advisory lock is held across a
/// before/after read of the history: PostgreSQL advisory locks are reentrant
/// per session, so sqlx's own lock inside `run` nests inside ours and a
/// concurrent migrator cannot interleave. The connection is closed afterwards
/// instead of being returned to the pool, so a failure can never leave a pooled
/// session holding the lock.
pub async fn apply_with(migrator: &Migrator, pool: &PgPool) -> Result<Vec<AppliedMigration>, MigrationError> {
    let mut conn = pool.acquire().await.map_err(MigrationError::Database)?;
    conn.close_on_drop();

    let to_error = |e| MigrationError::from_sqlx(e, migrator);
    conn.lock().await.map_err(to_error)?;
    conn.ensure_migrations_table(MIGRATIONS_TABLE).await.map_err(to_error)?;
    let before: BTreeSet<i64> = conn
        .list_applied_migrations(MIGRATIONS_TABLE)
        .await
        .map_err(to_error)?
        .into_iter()
        .map(|m| m.version)
        .collect();

    // `run_direct` is what `Migrator::run` calls after acquiring; calling it
    // on the connection directly keeps this future `Send` (sqlx's generic
    // `Acquire` path trips "not general enough" inside `tokio::spawn`).
    let conn_ref: &mut PgConnection = &mut conn;
    migrator.run_direct(None, conn_ref, false).await.map_err(to_error)?;

    let rows: Vec<(i64, String, i64)> = sqlx::query_as(
        "SELECT version, description, execution_time FROM _sqlx_migrations \
         WHERE success ORDER BY version",
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(MigrationError::Database)?;
    conn.unlock().await.map_err(to_error)?;

    Ok(rows
        .into_iter()
        .filter(|(version, _, _)| !before.contains(version))
        .map(|(version, description, execution_time_ns)| AppliedMigration {
            version,
            description,
            duration: Duration::from_nanos(u64::try_from(execution_time_ns).unwrap_or(0)),
        })
        .collect())
}
