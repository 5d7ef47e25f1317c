//! A fresh PostgreSQL database per test.
//!
//! Every PostgreSQL test gets its own database, created from `DATABASE_URL`
//! and dropped when the test is done, so tests never see each other's rows and
//! can run in parallel. Without `DATABASE_URL` a test fails and says how to get
//! one; it never skips.

use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection, PgConnection, PgPool};

use crate::migrations::{self, AppliedMigration, MigrationError};
use crate::store::connect_pool;

/// Every database this harness creates starts with this prefix, followed by
/// its creation time in Unix seconds and a random suffix.
pub const TEST_DATABASE_PREFIX: &str = "tollgate_t_";

/// Leftovers (from killed test processes) older than this are dropped when the
/// next test database is created.
const LEFTOVER_AGE_MAX: Duration = Duration::from_secs(3600);

/// Connections per test pool: enough for the concurrency tests, small enough
/// that two test processes per core stay far below `max_connections`.
const POOL_CONNECTIONS_MAX: u32 = 8;

const HOW_TO_GET_A_DATABASE: &str = "DATABASE_URL is not set. PostgreSQL tests need a \
    server: run them through `scripts/with-postgres`, e.g. \
    `scripts/with-postgres cargo nextest run -p tollgate-pg`, which finds or starts one \
    and exports DATABASE_URL; or set DATABASE_URL=postgres://USER@HOST:PORT/DB yourself \
    (the role must be allowed to CREATE DATABASE)";

/// One uniquely named database, with a pool connected to it.
pub struct TestDb {
    name: String,
    url: String,
    pool: PgPool,
    server: PgConnectOptions,
    dropped: bool,
}

impl TestDb {
    /// Creates an empty database (no migrations applied).
    ///
    /// Panics if `DATABASE_URL` is unset or the server cannot create a
    /// database: a PostgreSQL test without PostgreSQL must fail, loudly.
    pub async fn create() -> TestDb {
        let server_url = std::env::var("DATABASE_URL")
            .ok()
            .filter(|url| !url.trim().is_empty())
            .unwrap_or_else(|| panic!("{HOW_TO_GET_A_DATABASE}"));
        let server = PgConnectOptions::from_str(&server_url)
            .unwrap_or_else(|e| panic!("DATABASE_URL is not a PostgreSQL URL ({e}): {server_url}"));

        let mut maintenance = server.connect().await.unwrap_or_else(|e| {
            panic!(
                "cannot connect to DATABASE_URL={server_url}: {e}. \
                 Start PostgreSQL or run the tests through `scripts/with-postgres`."
            )
        });
        drop_leftovers(&mut maintenance).await;

        let created_s = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        let name = format!("{TEST_DATABASE_PREFIX}{created_s}_{}", uuid::Uuid::new_v4().simple());
        // Identifiers cannot be bound as parameters; the name is generated
        // here from [a-z0-9_] only, which the assertion keeps true.
        assert!(is_plain_identifier(&name));
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut maintenance)
            .await
            .unwrap_or_else(|e| panic!("cannot CREATE DATABASE {name} on {server_url}: {e}"));
        let _ = maintenance.close().await;

        let pool = connect_pool(server.clone().database(&name), POOL_CONNECTIONS_MAX, Duration::from_secs(30))
            .await
            .unwrap_or_else(|e| panic!("cannot connect to the new test database {name}: {e}"));

        TestDb { url: url_with_database(&server_url, &name), name, pool, server, dropped: false }
    }

    /// Creates a database with every embedded migration applied.
    pub async fn create_migrated() -> TestDb {
        let db = TestDb::create().await;
        db.migrate().await.expect("embedded migrations apply to an empty database");
        db
    }

    /// Applies the embedded migrations, as `PostgresStore::connect` would.
    pub async fn migrate(&self) -> Result<Vec<AppliedMigration>, MigrationError> {
        migrations::apply(&self.pool).await
    }

    /// Applies embedded migrations up to and including `version`, leaving the
    /// database as an older binary would have left it.
    pub async fn migrate_through(&self, version: i64) -> Result<Vec<AppliedMigration>, MigrationError> {
        migrations::apply_with(&migrations::migrator_through(version), &self.pool).await
    }

    /// The database's URL, for code under test that connects by itself.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A pool connected to the database.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Connect options for the database, to open extra connections or pools.
    pub fn connect_options(&self) -> PgConnectOptions {
        self.server.clone().database(&self.name)
    }

    /// Opens a separate pool on the same database, as a second server would.
    pub async fn new_pool(&self, connections_max: u32) -> PgPool {
        connect_pool(self.connect_options(), connections_max, Duration::from_secs(30))
            .await
            .unwrap_or_else(|e| panic!("cannot open another pool on {}: {e}", self.name))
    }

    /// Closes the pool and drops the database now. Best effort: a failure is
    /// reported on stderr and the database is left for the leftover sweep.
    pub async fn drop_now(mut self) {
        self.dropped = true;
        self.pool.close().await;
        drop_database(&self.server, &self.name).await;
    }
}

impl Drop for TestDb {
    /// The fallback when a test did not call `drop_now` (or panicked): drop the
    /// database from a separate thread with its own runtime, because Drop cannot
    /// await and the test's runtime may already be shutting down. Set
    /// `TOLLGATE_KEEP_TEST_DB=1` to keep databases for inspection.
    fn drop(&mut self) {
        if self.dropped || std::env::var_os("TOLLGATE_KEEP_TEST_DB").is_some() {
            return;
        }
        self.dropped = true;
        let server = self.server.clone();
        let name = self.name.clone();
        let dropper = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
                return;
            };
            runtime.block_on(drop_database(&server, &name));
        });
        let _ = dropper.join();
    }
}

/// Drops one test database, terminating any session still connected to it.
async fn drop_database(server: &PgConnectOptions, name: &str) {
    if !is_plain_identifier(name) {
        return;
    }
    let result = async {
        let mut conn = server.connect().await?;
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")))
            .execute(&mut conn)
            .await?;
        conn.close().await
    }
    .await;
    if let Err(e) = result {
        eprintln!("note: could not drop test database {name}: {e}");
    }
}

/// Drops test databases older than `LEFTOVER_AGE_MAX`, left by test processes
/// that were killed before they could clean up. Errors are ignored: another
/// process may be dropping the same leftover.
async fn drop_leftovers(conn: &mut PgConnection) {
    let Ok(names) = sqlx::query_scalar::<_, String>("SELECT datname FROM pg_database WHERE starts_with(datname, $1)")
        .bind(TEST_DATABASE_PREFIX)
        .fetch_all(&mut *conn)
        .await
    else {
        return;
    };
    let now_s = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    for name in names {
        let Some(created_s) = name
            .strip_prefix(TEST_DATABASE_PREFIX)
            .and_then(|rest| rest.split('_').next())
            .and_then(|s| s.parse::<u64>().ok())
        else {
            continue;
        };
        if now_s.saturating_sub(created_s) > LEFTOVER_AGE_MAX.as_secs() && is_plain_identifier(&name) {
            let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")))
                .execute(&mut *conn)
                .await;
        }
    }
}

/// The fields of a PostgreSQL error that tests assert on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgFailure {
    /// The SQLSTATE, e.g. `23514` for a check violation.
    pub sqlstate: String,
    /// The violated constraint, for constraint violations.
    pub constraint: Option<String>,
    /// The column, for not-null violations.
    pub column: Option<String>,
    pub message: String,
}

/// The PostgreSQL error inside `error`, if it is one.
pub fn pg_failure(error: &sqlx::Error) -> Option<PgFailure> {
    let db = error.as_database_error()?;
    let pg = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>()?;
    Some(PgFailure {
        sqlstate: pg.code().to_owned(),
        constraint: pg.constraint().map(str::to_owned),
        column: pg.column().map(str::to_owned),
        message: pg.message().to_owned(),
    })
}

fn is_plain_identifier(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// Replaces the database path of a PostgreSQL URL, keeping user, host, port
/// and query parameters.
fn url_with_database(url: &str, database: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let authority_start = base.find("://").map(|i| i + 3).unwrap_or(0);
    let path_start = base[authority_start..].find('/').map(|i| authority_start + i).unwrap_or(base.len());
    let mut out = format!("{}/{}", &base[..path_start], database);
    if let Some(query) = query {
        out.push('?');
        out.push_str(query);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::url_with_database;

    #[test]
    fn url_with_database_replaces_only_the_path() {
        let cases = [
            ("postgres://postgres@127.0.0.1:5432/test", "postgres://postgres@127.0.0.1:5432/d"),
            ("postgres://u:p@h/test?sslmode=disable", "postgres://u:p@h/d?sslmode=disable"),
            ("postgres://u@h:5", "postgres://u@h:5/d"),
            ("postgres:///test?host=/tmp/x&port=5", "postgres:///d?host=/tmp/x&port=5"),
        ];
        for (url, expected) in cases {
            assert_eq!(url_with_database(url, "d"), expected, "{url}");
        }
    }
}
