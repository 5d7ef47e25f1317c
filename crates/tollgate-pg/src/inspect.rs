//! The operator's read-only inspection of stored rows that the 0015 guards
//! forbid: the three guard-inspection queries, runnable before deploying 0015, after
//! 0016 has failed, and by `tollgate check` on every upgraded database.
//!
//! The queries only read. They run in one `REPEATABLE READ, READ ONLY`
//! transaction, so the three results describe one snapshot and PostgreSQL
//! itself refuses any write. They work on every schema from 0008 on, because
//! they name only columns that no migration since has renamed; in particular
//! they work on a database where 0016 failed and no store can start.

use sqlx::{PgConnection, PgPool};
use tollgate_store::GuardViolation;

/// Rows read per query at most. A database with more offending rows than this
/// needs a planned bulk reconciliation, not a longer report; the queries below
/// without their `LIMIT` list the rest.
pub const GUARD_VIOLATIONS_PER_QUERY_MAX: i64 = 10_000;

/// The first inspection query (negative units), with the row key and a stable order added.
pub const USAGE_EVENTS_SQL: &str = "SELECT account_id, request_id, units, fencing_token \
     FROM tollgate_usage_events WHERE units < 0 OR fencing_token <= 0 \
     ORDER BY account_id, request_id LIMIT $1";

/// The second inspection query, with a stable order added.
pub const LEASES_SQL: &str = "SELECT lease_id, fencing_token FROM tollgate_leases \
     WHERE fencing_token <= 0 ORDER BY lease_id LIMIT $1";

/// The third inspection query, with a stable order added.
pub const ACCOUNTS_SQL: &str = "SELECT account_id, next_fence FROM tollgate_accounts \
     WHERE next_fence <= 0 ORDER BY account_id LIMIT $1";

pub const USAGE_EVENTS_TABLE: &str = "tollgate_usage_events";
pub const LEASES_TABLE: &str = "tollgate_leases";
pub const ACCOUNTS_TABLE: &str = "tollgate_accounts";

/// Every stored value that a 0015 guard forbids, sorted. An event with both
/// negative units and a nonpositive fence is reported once per column, so an
/// operator sees each value that needs evidence.
pub async fn inspect_guards(pool: &PgPool) -> Result<Vec<GuardViolation>, sqlx::Error> {
    let mut tx = pool.begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY").await?;
    let violations = inspect_guards_in(&mut tx).await?;
    tx.rollback().await?;
    Ok(violations)
}

/// `inspect_guards` on a connection the caller already holds, for example
/// inside the read-only snapshot of a store's own check.
pub async fn inspect_guards_in(conn: &mut PgConnection) -> Result<Vec<GuardViolation>, sqlx::Error> {
    let mut violations = Vec::new();

    let events: Vec<(String, String, i64, Option<i64>)> =
        sqlx::query_as(USAGE_EVENTS_SQL).bind(GUARD_VIOLATIONS_PER_QUERY_MAX).fetch_all(&mut *conn).await?;
    for (account_id, request_id, units, fencing_token) in events {
        let key = format!("{account_id}/{request_id}");
        if units < 0 {
            violations.push(violation(USAGE_EVENTS_TABLE, key.clone(), "units", units));
        }
        if let Some(fence) = fencing_token.filter(|fence| *fence <= 0) {
            violations.push(violation(USAGE_EVENTS_TABLE, key, "fencing_token", fence));
        }
    }

    let leases: Vec<(String, i64)> =
        sqlx::query_as(LEASES_SQL).bind(GUARD_VIOLATIONS_PER_QUERY_MAX).fetch_all(&mut *conn).await?;
    for (lease_id, fence) in leases {
        violations.push(violation(LEASES_TABLE, lease_id, "fencing_token", fence));
    }

    let accounts: Vec<(String, i64)> =
        sqlx::query_as(ACCOUNTS_SQL).bind(GUARD_VIOLATIONS_PER_QUERY_MAX).fetch_all(&mut *conn).await?;
    for (account_id, next_fence) in accounts {
        violations.push(violation(ACCOUNTS_TABLE, account_id, "next_fence", next_fence));
    }

    violations.sort();
    Ok(violations)
}

fn violation(table: &str, key: String, column: &str, value: i64) -> GuardViolation {
    GuardViolation { table: table.to_owned(), key, column: column.to_owned(), value }
}
