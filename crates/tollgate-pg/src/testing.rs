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

/// Partitions per per-account table in `TestDb::partition_by_account`.
pub const HASH_PARTITIONS: u32 = 8;

/// The global tables: a distributed engine replicates each whole to every
/// node (a reference table) rather than distributing it by account, so
/// `TestDb::partition_by_account` leaves them unpartitioned, and they are not
/// per-account tables. `tollgate_legacy_credential_keys` has an `account_id`
/// column but is found by key hash before the account is known (the
/// read-only directory of keys issued before keys named their account, 0020);
/// `tollgate_settings` and `tollgate_webhook_endpoints` (0024) belong to no
/// account. `tests/pg/schema.rs` holds the schema to exactly this list.
pub const GLOBAL_TABLES: &[&str] =
    &["tollgate_legacy_credential_keys", "tollgate_settings", "tollgate_webhook_endpoints"];

/// The conversion `TestDb::partition_by_account` runs: one PL/pgSQL block that
/// reads the per-account tables and their keys, indexes, foreign keys and
/// triggers from the catalogue, then renames each table, creates the
/// partitioned table `LIKE` it (columns, defaults, checks), its partitions,
/// copies the rows, drops the old table, and recreates keys, indexes, foreign
/// keys and triggers from their catalogue definitions. Identifiers are quoted with `format('%I')`.
const PARTITION_BY_ACCOUNT_SQL: &str = include_str!("testing/partition_by_account.sql");

/// Tables of the current schema with an `account_id` column that are neither
/// partitions themselves nor global (`$1`, `GLOBAL_TABLES`): name, whether
/// partitioned by `HASH (account_id)`, and the number of partitions.
const PER_ACCOUNT_TABLES_SQL: &str = "
    SELECT c.relname::text,
        coalesce(p.partstrat = 'h' AND p.partnatts = 1
            AND (SELECT a.attname FROM pg_attribute a
                 WHERE a.attrelid = c.oid AND a.attnum = p.partattrs[0]) = 'account_id', false),
        (SELECT count(*) FROM pg_inherits i WHERE i.inhparent = c.oid)
    FROM pg_class c
    LEFT JOIN pg_partitioned_table p ON p.partrelid = c.oid
    WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p') AND NOT c.relispartition
      AND c.relname <> ALL($1)
      AND EXISTS (SELECT FROM pg_attribute a
                  WHERE a.attrelid = c.oid AND a.attname = 'account_id' AND NOT a.attisdropped)
    ORDER BY 1";

/// The tables among `$1` that exist in the current schema as plain tables,
/// neither partitioned nor partitions.
const GLOBAL_TABLES_LEFT_AS_THEY_ARE_SQL: &str = "
    SELECT c.relname::text FROM pg_class c
    WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind = 'r' AND NOT c.relispartition
      AND c.relname = ANY($1)
    ORDER BY 1";

/// A per-account table as the catalogue describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PerAccountTable {
    pub name: String,
    /// Whether it is partitioned by `HASH (account_id)`.
    pub partitioned: bool,
    pub partitions: i64,
}

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

    /// Creates a database with every embedded migration applied, then every
    /// per-account table hash-partitioned by `account_id` into
    /// `HASH_PARTITIONS` partitions (`partition_by_account`): the schema as a
    /// distributed engine would shard it, on one server.
    pub async fn create_partitioned() -> TestDb {
        let db = TestDb::create_migrated().await;
        db.partition_by_account().await;
        db
    }

    /// Converts every per-account table (every table of the current schema
    /// with an `account_id` column but those in `GLOBAL_TABLES`, read from
    /// the catalogue, so a table added later is converted too) into a table `PARTITION BY HASH (account_id)`
    /// with `HASH_PARTITIONS` partitions, keeping its columns, defaults, checks,
    /// keys, indexes, foreign keys and rows, in one transaction. PostgreSQL
    /// refuses a primary key or unique constraint of a partitioned table that
    /// does not include `account_id`, so this fails for any table whose keys
    /// would not shard by account. Panics on any failure, and unless every
    /// per-account table ends up partitioned that way.
    pub async fn partition_by_account(&self) {
        let mut tx = self.pool.begin().await.expect("begin the partitioning transaction");
        sqlx::query("SELECT set_config('tollgate.test_hash_partitions', $1, true)")
            .bind(HASH_PARTITIONS.to_string())
            .execute(&mut *tx)
            .await
            .expect("set the partition count");
        sqlx::query("SELECT set_config('tollgate.test_global_tables', $1, true)")
            .bind(GLOBAL_TABLES.join(","))
            .execute(&mut *tx)
            .await
            .expect("set the global tables");
        sqlx::raw_sql(PARTITION_BY_ACCOUNT_SQL)
            .execute(&mut *tx)
            .await
            .unwrap_or_else(|e| panic!("cannot partition {} by account: {e}", self.name));
        tx.commit().await.expect("commit the partitioning");

        let global: Vec<String> = sqlx::query_scalar(GLOBAL_TABLES_LEFT_AS_THEY_ARE_SQL)
            .bind(GLOBAL_TABLES)
            .fetch_all(&self.pool)
            .await
            .expect("read the global tables from the catalogue");
        assert_eq!(global, GLOBAL_TABLES, "a global table is missing or was partitioned");

        let tables = self.per_account_tables().await;
        assert!(!tables.is_empty(), "no per-account table found");
        for table in &tables {
            assert_eq!(
                (table.partitioned, table.partitions),
                (true, i64::from(HASH_PARTITIONS)),
                "{} is not hash-partitioned by account_id into {HASH_PARTITIONS} partitions",
                table.name
            );
        }
    }

    /// The per-account tables of the current schema (those with an
    /// `account_id` column, partitions excluded), how each is partitioned and
    /// its partitions.
    pub async fn per_account_tables(&self) -> Vec<PerAccountTable> {
        let rows: Vec<(String, bool, i64)> = sqlx::query_as(PER_ACCOUNT_TABLES_SQL)
            .bind(GLOBAL_TABLES)
            .fetch_all(&self.pool)
            .await
            .expect("read the per-account tables from the catalogue");
        rows.into_iter()
            .map(|(name, partitioned, partitions)| PerAccountTable { name, partitioned, partitions })
            .collect()
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

/// Every SQL statement constant of the store (`src/store/sql.rs`) with its
/// name, for the tests that hold each statement to the sharding rules.
pub fn store_statements() -> &'static [(&'static str, &'static str)] {
    crate::store::STATEMENTS
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
