//! The migrated schema itself refuses rows that break Tollgate's invariants,
//! whatever writes them: these are direct SQL writes, not store calls. Each
//! test runs on its own database; each case runs in its own transaction,
//! rolled back afterwards, so cases cannot influence each other.

use sqlx::migrate::MigrationType;
use tollgate_pg::migrations::{MIGRATOR, MigrationError, latest_version, migrator_through};
use tollgate_pg::testing::{TestDb, pg_failure};

use crate::fixtures::migrated_through;

/// What a direct write must lead to.
#[derive(Debug, Clone, Copy)]
enum Expect {
    Accepted,
    /// A CHECK constraint violation (SQLSTATE 23514) of this constraint.
    CheckViolation(&'static str),
    /// A NOT NULL violation (SQLSTATE 23502) on this column.
    NotNull(&'static str),
    /// An undefined column (SQLSTATE 42703), named in the message.
    UndefinedColumn(&'static str),
}

struct Case {
    name: &'static str,
    sql: &'static str,
    expect: Expect,
}

const fn case(name: &'static str, sql: &'static str, expect: Expect) -> Case {
    Case { name, sql, expect }
}

/// One account with a live lease and a credential, so that every case below
/// writes exactly one row and changes exactly one thing.
const FIXTURE: &str = "
    INSERT INTO tollgate_accounts (account_id, credited, available, reserved, next_fence)
    VALUES ('acct', 100, 90, 10, 2);
    INSERT INTO tollgate_leases (lease_id, account_id, fencing_token, capability_hash, granted,
        used, state, expiry_floor_us, expiry_submicro_ns, expiry_is_upper_bound)
    VALUES ('lease-1', 'acct', 1, '\\x00', 10, 0, 'active', 1000, 0, false);
    INSERT INTO tollgate_credentials (credential_id, account_id, label, key_hash,
        created_floor_us, created_submicro_ns)
    VALUES ('cred', 'acct', 'fixture', '\\x01', 0, 0);
";

/// Runs every case on a migrated database of its own holding the fixture, each
/// case in its own rolled-back transaction, and checks its result. All failures
/// are collected so one run shows every broken case.
async fn check_cases(cases: &[Case]) {
    let db = TestDb::create_migrated().await;
    sqlx::raw_sql(FIXTURE).execute(db.pool()).await.expect("fixture");
    let mut failures = Vec::new();
    for case in cases {
        let mut tx = db.pool().begin().await.expect("begin");
        let result = sqlx::raw_sql(case.sql).execute(&mut *tx).await;
        tx.rollback().await.expect("rollback");

        let failure = result.as_ref().err().map(|e| (pg_failure(e), e.to_string()));
        let ok = match (case.expect, &failure) {
            (Expect::Accepted, None) => true,
            (Expect::CheckViolation(name), Some((Some(f), _))) => {
                f.sqlstate == "23514" && f.constraint.as_deref() == Some(name)
            }
            (Expect::NotNull(column), Some((Some(f), _))) => {
                f.sqlstate == "23502" && f.column.as_deref() == Some(column)
            }
            (Expect::UndefinedColumn(column), Some((Some(f), _))) => {
                f.sqlstate == "42703" && f.message.contains(column)
            }
            _ => false,
        };
        if !ok {
            failures.push(format!(
                "{}: expected {:?}, got {:?}",
                case.name,
                case.expect,
                failure.map(|(f, text)| f.map_or(text, |f| format!("{f:?}")))
            ));
        }
    }
    assert!(failures.is_empty(), "cases failed:\n{}", failures.join("\n"));
    db.drop_now().await;
}

// Usage-event columns in one place, so each case below shows only its values.
macro_rules! usage_insert {
    ($values:literal) => {
        concat!(
            "INSERT INTO tollgate_usage_events (account_id, request_id, credential_id, units, ",
            "occurred_at_floor_us, occurred_at_submicro_ns, lease_id, fencing_token) VALUES ",
            $values
        )
    };
}

macro_rules! lease_insert {
    ($values:literal) => {
        concat!(
            "INSERT INTO tollgate_leases (lease_id, account_id, fencing_token, capability_hash, ",
            "granted, used, state, expiry_floor_us, expiry_submicro_ns, expiry_is_upper_bound) VALUES ",
            $values
        )
    };
}

#[tokio::test]
async fn usage_event_writes_outside_the_guards_are_rejected() {
    use Expect::*;
    check_cases(&[
        case(
            "negative units",
            usage_insert!("('acct','r','cred',-1,0,0,NULL,NULL)"),
            CheckViolation("tollgate_usage_events_units_nonnegative"),
        ),
        case(
            "most negative units",
            usage_insert!("('acct','r','cred',-9223372036854775808,0,0,NULL,NULL)"),
            CheckViolation("tollgate_usage_events_units_nonnegative"),
        ),
        case(
            "zero fence",
            usage_insert!("('acct','r','cred',1,0,0,'lease-1',0)"),
            CheckViolation("tollgate_usage_events_fence_positive"),
        ),
        case(
            "negative fence",
            usage_insert!("('acct','r','cred',1,0,0,'lease-1',-1)"),
            CheckViolation("tollgate_usage_events_fence_positive"),
        ),
        case(
            "lease without fence",
            usage_insert!("('acct','r','cred',1,0,0,'lease-1',NULL)"),
            CheckViolation("tollgate_usage_events_funding_all_or_nothing"),
        ),
        case(
            "fence without lease",
            usage_insert!("('acct','r','cred',1,0,0,NULL,1)"),
            CheckViolation("tollgate_usage_events_funding_all_or_nothing"),
        ),
        case(
            "units updated negative",
            concat!(
                usage_insert!("('acct','r','cred',1,0,0,NULL,NULL)"),
                ";",
                "UPDATE tollgate_usage_events SET units = -1 WHERE request_id = 'r'"
            ),
            CheckViolation("tollgate_usage_events_units_nonnegative"),
        ),
    ])
    .await;
}

#[tokio::test]
async fn usage_event_boundary_values_are_accepted() {
    use Expect::*;
    check_cases(&[
        case("zero units", usage_insert!("('acct','r','cred',0,0,0,NULL,NULL)"), Accepted),
        case("maximum units", usage_insert!("('acct','r','cred',9223372036854775807,0,0,NULL,NULL)"), Accepted),
        case("fence one", usage_insert!("('acct','r','cred',1,0,0,'lease-1',1)"), Accepted),
        case("maximum fence", usage_insert!("('acct','r','cred',1,0,0,'lease-1',9223372036854775807)"), Accepted),
        case("overage, no funding", usage_insert!("('acct','r','cred',5,-1,999,NULL,NULL)"), Accepted),
    ])
    .await;
}

#[tokio::test]
async fn lease_and_account_writes_outside_the_guards_are_rejected() {
    use Expect::*;
    check_cases(&[
            case("lease zero fence", lease_insert!("('l','acct',0,'\\x00',1,0,'active',0,0,false)"),
                CheckViolation("tollgate_leases_fence_positive")),
            case("lease negative fence", lease_insert!("('l','acct',-7,'\\x00',1,0,'active',0,0,false)"),
                CheckViolation("tollgate_leases_fence_positive")),
            case("lease fence updated to zero",
                "UPDATE tollgate_leases SET fencing_token = 0 WHERE lease_id = 'lease-1'",
                CheckViolation("tollgate_leases_fence_positive")),
            case("submicro 1000", lease_insert!("('l','acct',2,'\\x00',1,0,'active',0,1000,false)"),
                CheckViolation("tollgate_leases_expiry_submicro_range")),
            case("submicro -1", lease_insert!("('l','acct',2,'\\x00',1,0,'active',0,-1,false)"),
                CheckViolation("tollgate_leases_expiry_submicro_range")),
            case("floor below Timestamp::MIN", lease_insert!("('l','acct',2,'\\x00',1,0,'active',-377705023201000001,0,false)"),
                CheckViolation("tollgate_leases_expiry_floor_in_domain")),
            case("floor above Timestamp::MAX", lease_insert!("('l','acct',2,'\\x00',1,0,'active',253402207201000000,0,false)"),
                CheckViolation("tollgate_leases_expiry_floor_in_domain")),
            case("floor i64::MAX", lease_insert!("('l','acct',2,'\\x00',1,0,'active',9223372036854775807,0,false)"),
                CheckViolation("tollgate_leases_expiry_floor_in_domain")),
            case("unknown state", lease_insert!("('l','acct',2,'\\x00',1,0,'expired',0,0,false)"),
                CheckViolation("tollgate_leases_state_check")),
            case("negative granted", lease_insert!("('l','acct',2,'\\x00',-1,0,'active',0,0,false)"),
                CheckViolation("tollgate_leases_granted_check")),
            case("missing submicro",
                "INSERT INTO tollgate_leases (lease_id, account_id, fencing_token, capability_hash, granted, state, expiry_floor_us, expiry_is_upper_bound) VALUES ('l','acct',2,'\\x00',1,'active',0,false)",
                NotNull("expiry_submicro_ns")),
            case("missing provenance (no default)",
                "INSERT INTO tollgate_leases (lease_id, account_id, fencing_token, capability_hash, granted, state, expiry_floor_us, expiry_submicro_ns) VALUES ('l','acct',2,'\\x00',1,'active',0,0)",
                NotNull("expiry_is_upper_bound")),
            case("pre-0017 expiry column",
                "INSERT INTO tollgate_leases (lease_id, account_id, fencing_token, capability_hash, granted, state, expires_at_us) VALUES ('l','acct',2,'\\x00',1,'active',0)",
                UndefinedColumn("expires_at_us")),
            case("next_fence zero", "UPDATE tollgate_accounts SET next_fence = 0 WHERE account_id = 'acct'",
                CheckViolation("tollgate_accounts_next_fence_positive")),
            case("next_fence negative", "INSERT INTO tollgate_accounts (account_id, next_fence) VALUES ('b', -1)",
                CheckViolation("tollgate_accounts_next_fence_positive")),
            case("negative available", "UPDATE tollgate_accounts SET available = -1 WHERE account_id = 'acct'",
                CheckViolation("tollgate_accounts_available_check")),
            case("negative billed", "UPDATE tollgate_accounts SET billed = -1 WHERE account_id = 'acct'",
                CheckViolation("tollgate_accounts_billed_check")),
            case("zero-unit credit",
                "INSERT INTO tollgate_credits (account_id, credit_id, units) VALUES ('acct', 'c', 0)",
                CheckViolation("tollgate_credits_units_check")),
        ])
    .await;
}

#[tokio::test]
async fn lease_boundary_values_are_accepted() {
    use Expect::*;
    check_cases(&[
        case(
            "Timestamp::MIN",
            lease_insert!("('l','acct',2,'\\x00',1,0,'active',-377705023201000000,0,false)"),
            Accepted,
        ),
        case(
            "Timestamp::MAX",
            lease_insert!("('l','acct',2,'\\x00',1,0,'active',253402207200999999,999,false)"),
            Accepted,
        ),
        case("submicro 0", lease_insert!("('l','acct',2,'\\x00',1,0,'active',0,0,false)"), Accepted),
        case("submicro 999", lease_insert!("('l','acct',2,'\\x00',1,0,'active',-1,999,false)"), Accepted),
        case("settled state", lease_insert!("('l','acct',2,'\\x00',0,0,'consolidated',0,0,true)"), Accepted),
        case("next_fence one", "UPDATE tollgate_accounts SET next_fence = 1 WHERE account_id = 'acct'", Accepted),
        case(
            "next_fence maximum",
            "UPDATE tollgate_accounts SET next_fence = 9223372036854775807 WHERE account_id = 'acct'",
            Accepted,
        ),
    ])
    .await;
}

/// The guards of 0015 are validated by 0016: none may be left NOT VALID.
#[tokio::test]
async fn every_constraint_is_validated_after_all_migrations() {
    let db = TestDb::create_migrated().await;
    let unvalidated: Vec<String> = sqlx::query_scalar(
        "SELECT conname::text FROM pg_constraint c JOIN pg_class t ON t.oid = c.conrelid \
         WHERE t.relname LIKE 'tollgate\\_%' AND NOT c.convalidated ORDER BY 1",
    )
    .fetch_all(db.pool())
    .await
    .expect("catalogue query");
    assert_eq!(unvalidated, Vec::<String>::new());
    db.drop_now().await;
}

/// The active expiry index covers both instant components, in tuple order,
/// and only active leases.
#[tokio::test]
async fn active_expiry_index_covers_both_components() {
    let db = TestDb::create_migrated().await;
    let definition: String =
        sqlx::query_scalar("SELECT indexdef FROM pg_indexes WHERE indexname = 'tollgate_leases_active_expiry'")
            .fetch_one(db.pool())
            .await
            .expect("index exists");
    assert!(
        definition.contains("(expiry_floor_us, expiry_submicro_ns) WHERE (state = 'active'::text)"),
        "{definition}"
    );
    db.drop_now().await;
}

/// The global tables, which a distributed engine replicates whole to every
/// node (reference tables) instead of distributing them by account, and which
/// `TestDb::partition_by_account` leaves unpartitioned:
/// - `tollgate_legacy_credential_keys` (0020): the read-only directory that
///   leads the hash of a key issued before keys named their account to that
///   account. It has an `account_id` column, but it is looked up by key hash
///   before the account is known, so it is keyed by `key_hash` alone; it is
///   small and never written after 0020, so replicating it keeps that lookup
///   local wherever it runs.
/// - `tollgate_settings`: deployment-wide settings, of no account.
/// - `tollgate_webhook_endpoints` (0024): the deployment's webhook endpoints,
///   of no account; few (`ENDPOINTS_MAX`) and written only by operators. No
///   foreign key joins it to a per-account table: deliveries name their
///   endpoint, and the store deletes them with it.
const GLOBAL_TABLES: [&str; 3] = ["tollgate_legacy_credential_keys", "tollgate_settings", "tollgate_webhook_endpoints"];

/// Every primary key, unique constraint and unique index of a per-account
/// table (one with an `account_id` column that is not global) leads with
/// `account_id`, and every foreign key joins rows of the same account, so
/// each such table can be distributed by account (the partitioned schema of
/// `partitioning.rs` depends on it). The global tables are exactly
/// `GLOBAL_TABLES`. Read from the catalogue, so a table added later is held
/// to this too.
#[tokio::test]
async fn every_key_of_a_per_account_table_leads_with_account_id() {
    assert_eq!(GLOBAL_TABLES, tollgate_pg::testing::GLOBAL_TABLES, "the harness partitions the others");
    let db = TestDb::create_migrated().await;
    let unique: Vec<(String, String, Option<String>)> = sqlx::query_as(
        "SELECT t.relname::text, i.relname::text, a.attname::text \
         FROM pg_index x JOIN pg_class t ON t.oid = x.indrelid JOIN pg_class i ON i.oid = x.indexrelid \
         LEFT JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = x.indkey[0] \
         WHERE x.indisunique AND t.relnamespace = current_schema()::regnamespace \
           AND t.relname LIKE 'tollgate\\_%' AND t.relname <> ALL($1) \
           AND EXISTS (SELECT FROM pg_attribute c WHERE c.attrelid = t.oid AND c.attname = 'account_id') \
         ORDER BY 1, 2",
    )
    .bind(GLOBAL_TABLES.to_vec())
    .fetch_all(db.pool())
    .await
    .expect("catalogue query");
    let leading: Vec<String> = unique.iter().map(|(t, i, first)| format!("{t} {i} {first:?}")).collect();
    assert_eq!(
        leading,
        [
            "tollgate_accounts tollgate_accounts_pkey",
            "tollgate_alert_rules tollgate_alert_rules_ordinal_key",
            "tollgate_alert_rules tollgate_alert_rules_pkey",
            "tollgate_credentials tollgate_credentials_account_key_hash_key",
            "tollgate_credentials tollgate_credentials_pkey",
            "tollgate_credits tollgate_credits_pkey",
            "tollgate_idempotency_keys tollgate_idempotency_keys_pkey",
            "tollgate_journal tollgate_journal_pkey",
            "tollgate_leases tollgate_leases_pkey",
            "tollgate_outbox_cursors tollgate_outbox_cursors_pkey",
            "tollgate_usage_events tollgate_usage_events_pkey",
            "tollgate_usage_hourly tollgate_usage_hourly_pkey",
            "tollgate_webhook_deliveries tollgate_webhook_deliveries_event_endpoint_key",
            "tollgate_webhook_deliveries tollgate_webhook_deliveries_pkey",
            "tollgate_webhook_events tollgate_webhook_events_pkey",
        ]
        .map(|key| format!("{key} Some(\"account_id\")"))
    );

    // The tables that cannot be distributed by account: those without an
    // account_id column, and those with a unique key not led by it.
    let global: Vec<String> = sqlx::query_scalar(
        "SELECT t.relname::text FROM pg_class t \
         WHERE t.relnamespace = current_schema()::regnamespace AND t.relkind IN ('r', 'p') \
           AND NOT t.relispartition AND t.relname LIKE 'tollgate\\_%' \
           AND (NOT EXISTS (SELECT FROM pg_attribute c WHERE c.attrelid = t.oid AND c.attname = 'account_id') \
                OR EXISTS (SELECT FROM pg_index x JOIN pg_attribute a \
                               ON a.attrelid = x.indrelid AND a.attnum = x.indkey[0] \
                           WHERE x.indrelid = t.oid AND x.indisunique AND a.attname <> 'account_id')) \
         ORDER BY 1",
    )
    .fetch_all(db.pool())
    .await
    .expect("catalogue query");
    assert_eq!(global, GLOBAL_TABLES);

    // Each foreign key's first columns are account_id on both sides.
    let foreign: Vec<String> = sqlx::query_scalar(
        "SELECT k.conrelid::regclass::text || ' ' || pg_get_constraintdef(k.oid) FROM pg_constraint k \
         WHERE k.contype = 'f' AND k.connamespace = current_schema()::regnamespace ORDER BY 1",
    )
    .fetch_all(db.pool())
    .await
    .expect("catalogue query");
    assert!(!foreign.is_empty());
    for key in &foreign {
        assert!(key.contains("FOREIGN KEY (account_id") && key.contains("(account_id"), "{key}");
        let references = key.split(" REFERENCES ").nth(1).unwrap_or_default();
        assert!(references.contains("(account_id"), "{key}");
        // A replicated table neither references a distributed one nor is
        // referenced by one.
        for table in GLOBAL_TABLES {
            assert!(!key.starts_with(&format!("{table} ")) && !references.starts_with(table), "{key}");
        }
    }
    db.drop_now().await;
}

#[test]
fn catalogue_is_contiguous_from_1_and_forward_only() {
    let versions: Vec<i64> = MIGRATOR.iter().map(|m| m.version).collect();
    assert_eq!(versions, (1..=25).collect::<Vec<i64>>());
    assert_eq!(latest_version(), 25);
    for migration in MIGRATOR.iter() {
        assert_eq!(migration.migration_type, MigrationType::Simple, "{}", migration.version);
        assert!(!migration.no_tx, "migration {} must run in a transaction", migration.version);
    }
    let through_14: Vec<i64> = migrator_through(14).iter().map(|m| m.version).collect();
    assert_eq!(through_14, (1..=14).collect::<Vec<i64>>());
}

#[tokio::test]
async fn apply_reports_each_version_once() {
    let db = TestDb::create().await;
    let first = db.migrate_through(14).await.expect("0001-0014 apply");
    let first: Vec<i64> = first.iter().map(|m| m.version).collect();
    assert_eq!(first, (1..=14).collect::<Vec<i64>>());

    let second = db.migrate().await.expect("0015 onwards apply");
    let described: Vec<(i64, &str)> = second.iter().map(|m| (m.version, m.description.as_str())).collect();
    assert_eq!(
        described,
        vec![
            (15, "add unit and fence guards"),
            (16, "validate unit and fence guards"),
            (17, "lease expiry nanoseconds"),
            (18, "create idempotency keys"),
            (19, "key every table by account"),
            (20, "create legacy credential keys"),
            (21, "add usage event dimensions"),
            (22, "create account journal"),
            (23, "index active leases by account expiry"),
            (24, "create alerts and webhooks"),
            (25, "create usage hourly totals"),
        ]
    );

    let third = db.migrate().await.expect("nothing pending");
    assert_eq!(third, vec![]);
    db.drop_now().await;
}

/// A binary whose catalogue ends at 0014 refuses a database at 0015, naming
/// the version it does not know, and changes nothing.
#[tokio::test]
async fn old_catalogue_refuses_a_newer_database() {
    let db = migrated_through(15).await;

    let error = tollgate_pg::migrations::apply_with(&migrator_through(14), db.pool())
        .await
        .expect_err("an old catalogue must refuse the database");
    assert!(matches!(error, MigrationError::UnknownVersion { version: 15, catalogue_latest: 14 }), "{error:?}");
    assert_eq!(error.version(), Some(15));
    assert!(error.to_string().contains("migration 15"), "{error}");

    let versions: Vec<i64> = sqlx::query_scalar("SELECT version FROM _sqlx_migrations ORDER BY version")
        .fetch_all(db.pool())
        .await
        .expect("history");
    assert_eq!(versions, (1..=15).collect::<Vec<i64>>());
    db.drop_now().await;
}
