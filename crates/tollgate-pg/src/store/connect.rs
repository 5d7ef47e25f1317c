//! Connecting: the pool settings every `PostgresStore` pool has.

use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::migrations::MigrationError;

/// Pool settings for `PostgresStore::connect_with`.
#[derive(Debug, Clone)]
pub struct PgStoreConfig {
    pub connections_max: u32,
    /// How long an operation waits for a pooled connection.
    pub acquire_timeout: Duration,
    /// How long one statement waits for a row lock before it fails, having
    /// changed nothing, as retryable `storage_unavailable` (PostgreSQL's
    /// `lock_timeout`; `None` waits without bound). A server sets both waits
    /// below its request timeout, so that a write never waits for a lock past
    /// the moment its caller was answered.
    pub lock_timeout: Option<Duration>,
}

impl Default for PgStoreConfig {
    fn default() -> Self {
        Self { connections_max: 16, acquire_timeout: Duration::from_secs(10), lock_timeout: None }
    }
}

/// Opens a pool with the settings every `PostgresStore` pool has.
///
/// No ping before each use (sqlx's `test_before_acquire`): it would cost every
/// operation a round trip. A connection that broke while idle fails the one
/// operation that next uses it, as `storage_unavailable` (retryable, nothing
/// applied), and the pool drops it.
///
/// Each connection starts with `plan_cache_mode = force_generic_plan`, sent in
/// the startup packet (no round trip): each statement here has one fixed
/// shape, keyed by primary keys or by `unnest` of parameter arrays, so its
/// plan does not depend on the values bound. PostgreSQL's default re-plans a
/// prepared statement for its values on each of its first executions and
/// keeps doing so when the generic plan's estimate looks no cheaper, which for
/// the array statements it never does; on the lease cycle that planning cost
/// about as much as executing the write (`bench/ANALYSIS.md`).
pub async fn connect_pool(
    options: PgConnectOptions,
    connections_max: u32,
    acquire_timeout: Duration,
) -> Result<PgPool, sqlx::Error> {
    PgPoolOptions::new()
        .max_connections(connections_max)
        .acquire_timeout(acquire_timeout)
        .test_before_acquire(false)
        .connect_with(options.options([("plan_cache_mode", "force_generic_plan")]))
        .await
}

/// Why a `PostgresStore` could not start.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("cannot reach PostgreSQL: {0}")]
    Unavailable(#[source] sqlx::Error),
    #[error(transparent)]
    Migration(#[from] MigrationError),
}
