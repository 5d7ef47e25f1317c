//! Upgrades through 0015-0017 on populated databases, each test on its own
//! database: what the upgrade promises about history, locks, fences and failures
//! (`docs/upgrading.md`).
//!
//! The SQL written before 0017 here is deliberately the 0016-era lease SQL
//! (`expires_at_us`): it is the fixture that proves the compatibility fence.

use std::time::Duration;

use sqlx::{Connection, PgConnection, PgPool};
use tollgate_pg::migrations::{self, MigrationError, versions_from};
use tollgate_pg::testing::{PgFailure, TestDb, pg_failure};

use crate::fixtures::{conservation_violations, migrated_through_holding, rows_without_lease_expiry};

/// A populated 0014-era account: seven leases covering positive, zero-µs,
/// negative and both domain-endpoint expiries, one settled; leased and
/// overage usage; a credential; a credit. The ledger equations hold:
/// credited 1000 = available 793 + reserved 177 + consumed 30, and
/// billed 47 = consumed 30 + overage 7 + Σ active used 10.
const LEGACY_FIXTURE: &str = "
    INSERT INTO tollgate_accounts (account_id, credited, available, reserved, consumed,
        overage, billed, next_fence)
    VALUES ('acct', 1000, 793, 177, 30, 7, 47, 8);
    INSERT INTO tollgate_credits (account_id, credit_id, units) VALUES ('acct', 'c1', 1000);
    INSERT INTO tollgate_leases (lease_id, account_id, fencing_token, capability_hash,
        granted, used, state, expires_at_us, settled_at) VALUES
        ('pos',     'acct', 1, '\\xaa', 100, 10, 'active',    1500,                NULL),
        ('zero',    'acct', 2, '\\xab',  50,  0, 'active',    0,                   NULL),
        ('neg',     'acct', 3, '\\xac',  20,  0, 'active',    -1,                  NULL),
        ('neg-big', 'acct', 4, '\\xad',   5,  0, 'active',    -1500,               NULL),
        ('min',     'acct', 5, '\\xae',   1,  0, 'active',    -377705023201000000, NULL),
        ('max',     'acct', 6, '\\xaf',   1,  0, 'active',    253402207200999999,  NULL),
        ('done',    'acct', 7, '\\xb0',  30, 30, 'released',  1000,                now());
    INSERT INTO tollgate_credentials (credential_id, account_id, label, key_hash,
        created_floor_us, created_submicro_ns, last_used_floor_us, last_used_submicro_ns,
        accepted_events, accepted_units)
    VALUES ('cred', 'acct', 'gateway', '\\x01', 0, 0, 10, 5, 3, 47);
    INSERT INTO tollgate_usage_events (account_id, request_id, credential_id, units,
        occurred_at_floor_us, occurred_at_submicro_ns, lease_id, fencing_token) VALUES
        ('acct', 'r-lease', 'cred', 10, 1, 0, 'pos',  1),
        ('acct', 'r-done',  'cred', 30, 2, 0, 'done', 7),
        ('acct', 'r-over',  'cred',  7, 10, 5, NULL, NULL);
";

async fn applied_versions(pool: &PgPool) -> Vec<i64> {
    sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success ORDER BY version")
        .fetch_all(pool)
        .await
        .expect("migration history")
}

async fn lease_columns(pool: &PgPool) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT column_name::text FROM information_schema.columns \
         WHERE table_name = 'tollgate_leases' ORDER BY ordinal_position",
    )
    .fetch_all(pool)
    .await
    .expect("columns")
}

fn failed_version(error: &MigrationError) -> (i64, Option<PgFailure>) {
    match error {
        MigrationError::Failed { version, source } => (*version, pg_failure(source)),
        other => panic!("expected a failed migration, got {other:?}"),
    }
}

/// Upgrades a populated database from `from` to the latest version and checks
/// everything the upgrade promises about the result.
async fn check_upgrade_from(from: i64) {
    let db = TestDb::create().await;
    db.migrate_through(from).await.expect("old migrations apply");
    sqlx::raw_sql(LEGACY_FIXTURE).execute(db.pool()).await.expect("legacy fixture");
    let before = rows_without_lease_expiry(db.pool()).await;

    let applied: Vec<i64> = db.migrate().await.expect("upgrade").iter().map(|m| m.version).collect();
    assert_eq!(applied, versions_from(from + 1));

    assert_eq!(rows_without_lease_expiry(db.pool()).await, before, "a non-expiry field changed");
    assert_eq!(conservation_violations(db.pool()).await, Vec::<String>::new());

    // The latest instant consistent with each truncated value: +999 ns for
    // nonnegative µs (the zero bucket included), the stored instant for negative.
    let expiries: Vec<(String, i64, i16, bool)> = sqlx::query_as(
        "SELECT lease_id, expiry_floor_us, expiry_submicro_ns, expiry_is_upper_bound \
         FROM tollgate_leases ORDER BY lease_id",
    )
    .fetch_all(db.pool())
    .await
    .expect("expiries");
    let expected: Vec<(String, i64, i16, bool)> = [
        ("done", 1000, 999),
        ("max", 253_402_207_200_999_999, 999),
        ("min", -377_705_023_201_000_000, 0),
        ("neg", -1, 0),
        ("neg-big", -1500, 0),
        ("pos", 1500, 999),
        ("zero", 0, 999),
    ]
    .into_iter()
    .map(|(id, floor_us, submicro_ns)| (id.to_owned(), floor_us, submicro_ns, true))
    .collect();
    assert_eq!(expiries, expected);

    // The legacy-bound readiness query: every pre-0017 lease is a marked upper bound,
    // settled history included.
    let counts: Vec<(String, bool, i64)> = sqlx::query_as(
        "SELECT state, expiry_is_upper_bound, count(*) FROM tollgate_leases \
         GROUP BY state, expiry_is_upper_bound ORDER BY 1, 2",
    )
    .fetch_all(db.pool())
    .await
    .expect("legacy-bound counts");
    assert_eq!(counts, vec![("active".into(), true, 6), ("released".into(), true, 1)]);

    // A cold restart (fresh pool) finds the data and nothing left to apply.
    let restarted = db.new_pool(2).await;
    assert_eq!(migrations::apply(&restarted).await.expect("restart"), vec![]);
    assert_eq!(rows_without_lease_expiry(&restarted).await, before);
    restarted.close().await;
    db.drop_now().await;
}

#[tokio::test]
async fn upgrade_from_populated_0014_preserves_accounting_and_bounds_legacy_expiries() {
    check_upgrade_from(14).await;
}

#[tokio::test]
async fn upgrade_from_populated_0016_preserves_accounting_and_bounds_legacy_expiries() {
    check_upgrade_from(16).await;
}

/// Invalid history fails 0016 while 0015 stays committed and keeps
/// guarding new writes; an evidence-based repair then lets startup pass, with
/// migration history kept.
#[tokio::test]
async fn invalid_history_fails_0016_then_evidence_based_repair_passes() {
    let db = migrated_through_holding(14, LEGACY_FIXTURE, "legacy fixture").await;
    // Corrupt history, as a buggy legacy writer could have left it, next to
    // the evidence an operator would reconcile it from (here: a table standing
    // in for the gateway's own usage log and the account's allocation record).
    sqlx::raw_sql(
        "UPDATE tollgate_usage_events SET units = -10 WHERE request_id = 'r-lease';
         UPDATE tollgate_leases SET fencing_token = 0 WHERE lease_id = 'zero';
         CREATE TABLE fixture_evidence (kind TEXT, id TEXT, value BIGINT);
         INSERT INTO fixture_evidence VALUES
             ('usage_units', 'r-lease', 10), ('lease_fence', 'zero', 2);",
    )
    .execute(db.pool())
    .await
    .expect("invalid history");
    let invalid = rows_without_lease_expiry(db.pool()).await;

    let error = db.migrate().await.expect_err("0016 must find the invalid rows");
    let (version, failure) = failed_version(&error);
    assert_eq!(version, 16);
    assert_eq!(failure.as_ref().map(|f| f.sqlstate.as_str()), Some("23514"), "{error}");
    assert!(error.to_string().contains("migration 16"), "{error}");

    // 0015 stays committed; the invalid rows are preserved, not clamped.
    assert_eq!(applied_versions(db.pool()).await, (1..=15).collect::<Vec<i64>>());
    assert_eq!(rows_without_lease_expiry(db.pool()).await, invalid);
    let installed_15: String = sqlx::query_scalar("SELECT installed_on::text FROM _sqlx_migrations WHERE version = 15")
        .fetch_one(db.pool())
        .await
        .expect("0015 recorded");

    // The NOT VALID guards already check new writes.
    let new_write = sqlx::query(
        "INSERT INTO tollgate_usage_events (account_id, request_id, credential_id, units, \
         occurred_at_floor_us, occurred_at_submicro_ns) VALUES ('acct', 'new', 'cred', -1, 0, 0)",
    )
    .execute(db.pool())
    .await
    .expect_err("guard of 0015 is active");
    assert_eq!(
        pg_failure(&new_write).and_then(|f| f.constraint),
        Some("tollgate_usage_events_units_nonnegative".to_owned())
    );

    // Reconcile from the evidence, keeping an audit trail of what changed.
    sqlx::raw_sql(
        "CREATE TABLE fixture_repair_audit AS
             SELECT 'usage_units' AS kind, request_id AS id, units AS old_value
             FROM tollgate_usage_events WHERE units < 0
             UNION ALL
             SELECT 'lease_fence', lease_id, fencing_token FROM tollgate_leases WHERE fencing_token <= 0;
         UPDATE tollgate_usage_events u SET units = e.value FROM fixture_evidence e
             WHERE e.kind = 'usage_units' AND e.id = u.request_id AND u.units < 0;
         UPDATE tollgate_leases l SET fencing_token = e.value FROM fixture_evidence e
             WHERE e.kind = 'lease_fence' AND e.id = l.lease_id AND l.fencing_token <= 0;",
    )
    .execute(db.pool())
    .await
    .expect("repair");

    let applied: Vec<i64> = db.migrate().await.expect("startup after repair").iter().map(|m| m.version).collect();
    assert_eq!(applied, versions_from(16));
    assert_eq!(applied_versions(db.pool()).await, versions_from(1));
    let installed_15_after: String =
        sqlx::query_scalar("SELECT installed_on::text FROM _sqlx_migrations WHERE version = 15")
            .fetch_one(db.pool())
            .await
            .expect("0015 still recorded");
    assert_eq!(installed_15_after, installed_15, "history of 0015 was rewritten");
    assert_eq!(conservation_violations(db.pool()).await, Vec::<String>::new());
    db.drop_now().await;
}

/// An out-of-domain legacy expiry (either side) fails 0017, which
/// rolls back every change and leaves 0016 authoritative; repairing the row
/// from evidence then lets it apply.
#[tokio::test]
async fn out_of_domain_legacy_expiry_rolls_back_0017_entirely() {
    let cases: [(&str, i64); 2] =
        [("above Timestamp::MAX", 253_402_207_201_000_000), ("below Timestamp::MIN", -377_705_023_201_000_001)];
    for (name, expires_at_us) in cases {
        let db = migrated_through_holding(16, LEGACY_FIXTURE, "legacy fixture").await;
        sqlx::query("UPDATE tollgate_leases SET expires_at_us = $1 WHERE lease_id = 'pos'")
            .bind(expires_at_us)
            .execute(db.pool())
            .await
            .expect("out-of-domain legacy row");
        let columns_0016 = lease_columns(db.pool()).await;
        let rows_0016 = rows_without_lease_expiry(db.pool()).await;

        let error = db.migrate().await.expect_err(name);
        let (version, failure) = failed_version(&error);
        assert_eq!(version, 17, "{name}");
        let failure = failure.unwrap_or_else(|| panic!("{name}: not a database error: {error}"));
        assert_eq!(failure.sqlstate, "23514", "{name}");
        assert_eq!(failure.constraint.as_deref(), Some("tollgate_leases_expiry_floor_in_domain"), "{name}");

        // Nothing of 0017 is left: old column, old index, no new columns,
        // no backfill, history ends at 0016.
        assert_eq!(lease_columns(db.pool()).await, columns_0016, "{name}");
        assert!(columns_0016.contains(&"expires_at_us".to_owned()));
        let index: String =
            sqlx::query_scalar("SELECT indexdef FROM pg_indexes WHERE indexname = 'tollgate_leases_active_expiry'")
                .fetch_one(db.pool())
                .await
                .expect("index");
        assert!(index.contains("(expires_at_us)"), "{name}: {index}");
        assert_eq!(applied_versions(db.pool()).await, (1..=16).collect::<Vec<i64>>(), "{name}");
        assert_eq!(rows_without_lease_expiry(db.pool()).await, rows_0016, "{name}");
        let stored: i64 = sqlx::query_scalar("SELECT expires_at_us FROM tollgate_leases WHERE lease_id = 'pos'")
            .fetch_one(db.pool())
            .await
            .expect("row kept");
        assert_eq!(stored, expires_at_us, "{name}: the offending row was changed");

        // Repair from authoritative evidence (the fixture's original value).
        sqlx::query("UPDATE tollgate_leases SET expires_at_us = 1500 WHERE lease_id = 'pos'")
            .execute(db.pool())
            .await
            .expect("repair");
        let applied: Vec<i64> = db.migrate().await.expect(name).iter().map(|m| m.version).collect();
        assert_eq!(applied, versions_from(17), "{name}");
        db.drop_now().await;
    }
}

/// The rename is the compatibility fence: old lease SQL on a connection
/// opened (and its statements prepared) before 0017 fails with 42703 after
/// it, and the rollback of that transaction leaves the account as it was.
#[tokio::test]
async fn old_lease_sql_on_a_retained_connection_fails_and_rolls_back_its_debit() {
    let db = migrated_through_holding(16, LEGACY_FIXTURE, "legacy fixture").await;

    // The old binary's connection, with its 0016-era statements prepared.
    let mut old: PgConnection = PgConnection::connect_with(&db.connect_options()).await.expect("old connection");
    let old_acquire_debit = "UPDATE tollgate_accounts SET available = available - $1, \
         reserved = reserved + $1, next_fence = next_fence + 1 WHERE account_id = $2 \
         RETURNING next_fence - 1";
    let old_acquire_insert = "INSERT INTO tollgate_leases (lease_id, account_id, fencing_token, \
         capability_hash, granted, state, expires_at_us) VALUES ($1, $2, $3, $4, $5, 'active', $6)";
    let old_reclaim = "SELECT lease_id FROM tollgate_leases WHERE state = 'active' \
         AND expires_at_us <= $1 ORDER BY expires_at_us, lease_id LIMIT 10 FOR UPDATE SKIP LOCKED";
    let old_release = "SELECT lease_id, expires_at_us FROM tollgate_leases WHERE lease_id = $1 FOR UPDATE";
    let due: Vec<String> =
        sqlx::query_scalar(old_reclaim).bind(-1_i64).fetch_all(&mut old).await.expect("old reclaim before");
    assert_eq!(due, vec!["min".to_owned(), "neg-big".to_owned(), "neg".to_owned()]);
    sqlx::query(old_release).bind("pos").execute(&mut old).await.expect("old release before");

    let accounts_before = rows_without_lease_expiry(db.pool()).await;
    db.migrate().await.expect("0017 applies");

    // An old acquire: the debit succeeds, the lease insert hits the fence.
    let mut tx = old.begin().await.expect("begin");
    let fence: i64 = sqlx::query_scalar(old_acquire_debit)
        .bind(5_i64)
        .bind("acct")
        .fetch_one(&mut *tx)
        .await
        .expect("old debit statement still matches the schema");
    let insert = sqlx::query(old_acquire_insert)
        .bind("new-lease")
        .bind("acct")
        .bind(fence)
        .bind(vec![1_u8])
        .bind(5_i64)
        .bind(2_000_i64)
        .execute(&mut *tx)
        .await
        .expect_err("old insert must hit the compatibility fence");
    tx.rollback().await.expect("rollback");
    let failure = pg_failure(&insert).expect("database error");
    assert_eq!(failure.sqlstate, "42703", "{failure:?}");

    // Old reclaim and release statements, prepared before the migration, fail too.
    for (name, result) in [
        ("reclaim", sqlx::query(old_reclaim).bind(i64::MAX).execute(&mut old).await),
        ("release", sqlx::query(old_release).bind("pos").execute(&mut old).await),
    ] {
        let error = result.expect_err(name);
        assert_eq!(pg_failure(&error).map(|f| f.sqlstate), Some("42703".to_owned()), "{name}: {error}");
    }

    assert_eq!(rows_without_lease_expiry(db.pool()).await, accounts_before, "the debit leaked");
    assert_eq!(conservation_violations(db.pool()).await, Vec::<String>::new());
    old.close().await.expect("close");
    db.drop_now().await;
}

/// 0017 takes its table lock explicitly, so it waits for an old transaction
/// that holds lease rows, and that transaction completes in the old format.
#[tokio::test]
async fn migration_waits_for_a_running_old_transaction() {
    let db = migrated_through_holding(16, LEGACY_FIXTURE, "legacy fixture").await;

    let mut old = PgConnection::connect_with(&db.connect_options()).await.expect("old connection");
    let mut tx = old.begin().await.expect("begin");
    let held: i64 = sqlx::query_scalar("SELECT expires_at_us FROM tollgate_leases WHERE lease_id = 'pos' FOR UPDATE")
        .fetch_one(&mut *tx)
        .await
        .expect("old lock");
    assert_eq!(held, 1500);

    let pool = db.pool().clone();
    let migration = tokio::spawn(async move { migrations::apply(&pool).await });

    // Wait (bounded) until the migration is blocked on our lock.
    let mut waiting = false;
    for _ in 0..200 {
        let blocked: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation \
             WHERE c.relname = 'tollgate_leases' AND NOT l.granted",
        )
        .fetch_one(db.pool())
        .await
        .expect("pg_locks");
        if blocked > 0 {
            waiting = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(waiting, "0017 did not wait for the old transaction's lock");
    assert!(!migration.is_finished());

    // The old transaction still sees and writes the old format, then commits.
    sqlx::query("UPDATE tollgate_leases SET expires_at_us = 1600 WHERE lease_id = 'pos'")
        .execute(&mut *tx)
        .await
        .expect("old write under its lock");
    tx.commit().await.expect("old commit");

    let applied = migration.await.expect("join").expect("0017 applies after the old commit");
    assert_eq!(applied.iter().map(|m| m.version).collect::<Vec<_>>(), versions_from(17));
    let pair: (i64, i16, bool) = sqlx::query_as(
        "SELECT expiry_floor_us, expiry_submicro_ns, expiry_is_upper_bound \
         FROM tollgate_leases WHERE lease_id = 'pos'",
    )
    .fetch_one(db.pool())
    .await
    .expect("migrated row");
    assert_eq!(pair, (1600, 999, true));
    old.close().await.expect("close");
    db.drop_now().await;
}
