//! The guard upgrade, proved on populated databases: 0015 installs the unit
//! and fence guards NOT VALID, 0016 validates them. Each test has its own
//! database, populated at 0014 through the 0016-era writer.
//!
//! What is proved here: an upgrade preserves every row byte for byte and the
//! guards then reject bad writes; an older binary refuses a cold start and
//! names the version; invalid history fails 0016 while 0015 stays committed,
//! keeps guarding and preserves the rows; an evidence-based repair lets the
//! next startup validate and serve; and the guard inspection queries (`src/inspect.rs`) report
//! exactly the offending rows.

use jiff::{SignedDuration, Timestamp};
use sqlx::{Connection, PgPool};
use tollgate_core::GrantPolicy;
use tollgate_pg::inspect;
use tollgate_pg::migrations::{MigrationError, versions_from};
use tollgate_pg::testing::pg_failure;
use tollgate_pg::{ConnectError, PostgresStore};
use tollgate_store::{GuardViolation, Store};

use crate::fixtures::legacy_0016_lease_sql::{LegacyEvent, LegacyWriter};
use crate::fixtures::populated::{self, GRACE_NS, GRACE_US, NOW_US};
use crate::fixtures::{
    CatalogueCase, Startup, applied_versions, check_old_catalogue, conservation_violations, constraints, exact_rows,
    failed_migration, migrated_through, migration_history,
};

const UNITS_GUARD: &str = "tollgate_usage_events_units_nonnegative";
const EVENT_FENCE_GUARD: &str = "tollgate_usage_events_fence_positive";
const LEASE_FENCE_GUARD: &str = "tollgate_leases_fence_positive";
const NEXT_FENCE_GUARD: &str = "tollgate_accounts_next_fence_positive";

/// The 0015 guards, by table, as `constraints` lists them.
const GUARDS: [(&str, &str); 4] = [
    ("tollgate_usage_events", UNITS_GUARD),
    ("tollgate_usage_events", EVENT_FENCE_GUARD),
    ("tollgate_leases", LEASE_FENCE_GUARD),
    ("tollgate_accounts", NEXT_FENCE_GUARD),
];

/// The policy the upgraded fleet runs: the legacy fleet's grace, unchanged.
fn policy() -> GrantPolicy {
    GrantPolicy::new(SignedDuration::from_secs(3600), SignedDuration::from_nanos(GRACE_NS), 100).expect("valid policy")
}

/// Whether each 0015 guard exists and is validated, in `GUARDS` order.
async fn guard_states(pool: &PgPool) -> Vec<Option<bool>> {
    let mut states = Vec::new();
    for (table, guard) in GUARDS {
        let found = constraints(pool, table).await;
        states.push(found.iter().find(|(name, _)| name == guard).map(|(_, valid)| *valid));
    }
    states
}

/// `(account_id, request_id, units, lease_id, fencing_token)` of an event.
type UsageRow = (String, String, i64, Option<String>, Option<i64>);

/// Every stored usage event, in key order.
async fn usage_rows(pool: &PgPool) -> Vec<UsageRow> {
    sqlx::query_as(
        "SELECT account_id, request_id, units, lease_id, fencing_token \
         FROM tollgate_usage_events ORDER BY account_id COLLATE \"C\", request_id COLLATE \"C\"",
    )
    .fetch_all(pool)
    .await
    .expect("usage rows")
}

fn usage(account_id: &str, request_id: &str, units: i64, funding: Option<(&str, i64)>) -> UsageRow {
    (
        account_id.to_owned(),
        request_id.to_owned(),
        units,
        funding.map(|(lease, _)| lease.to_owned()),
        funding.map(|(_, fence)| fence),
    )
}

/// The usage history `populated::populate` writes: leased events (zero
/// units and beyond-grant usage included) and overage events without a lease.
fn expected_usage() -> Vec<UsageRow> {
    vec![
        usage("acct-a", "r-a-over", 7, None),
        usage("acct-a", "r-a1-1", 10, Some(("a1", 1))),
        usage("acct-a", "r-a1-zero", 0, Some(("a1", 1))),
        usage("acct-a", "r-a3", 25, Some(("a3", 3))),
        usage("acct-a", "r-a4", 3, Some(("a4", 4))),
        usage("acct-b", "r-b-over", 12, None),
        usage("acct-b", "r-b1-1", 40, Some(("b1", 2))),
        usage("acct-b", "r-b1-2", 30, Some(("b1", 2))),
        usage("acct-b", "r-b2", 45, Some(("b2", 1))),
    ]
}

/// A direct write and whether the guards must let it through.
struct WriteCase {
    name: &'static str,
    sql: &'static str,
    /// The constraint that must reject it, or `None` when it is accepted.
    rejected_by: Option<&'static str>,
}

const fn write(name: &'static str, sql: &'static str, rejected_by: Option<&'static str>) -> WriteCase {
    WriteCase { name, sql, rejected_by }
}

/// New writes against the populated fixture in the 0015/0016 schema, which
/// still has `expires_at_us`: what the guards reject and what they admit.
const NEW_WRITES: [WriteCase; 13] = [
    write(
        "negative units",
        "INSERT INTO tollgate_usage_events (account_id, request_id, credential_id, units, \
         occurred_at_floor_us, occurred_at_submicro_ns) VALUES ('acct-a', 'new', 'cred-a', -1, 0, 0)",
        Some(UNITS_GUARD),
    ),
    write(
        "the most negative units",
        "INSERT INTO tollgate_usage_events (account_id, request_id, credential_id, units, \
         occurred_at_floor_us, occurred_at_submicro_ns) \
         VALUES ('acct-a', 'new', 'cred-a', -9223372036854775808, 0, 0)",
        Some(UNITS_GUARD),
    ),
    write(
        "units of a stored event turned negative",
        "UPDATE tollgate_usage_events SET units = -10 WHERE request_id = 'r-a-over'",
        Some(UNITS_GUARD),
    ),
    write(
        "usage with a zero fence",
        "INSERT INTO tollgate_usage_events (account_id, request_id, credential_id, units, \
         occurred_at_floor_us, occurred_at_submicro_ns, lease_id, fencing_token) \
         VALUES ('acct-a', 'new', 'cred-a', 1, 0, 0, 'a1', 0)",
        Some(EVENT_FENCE_GUARD),
    ),
    write(
        "usage with a negative fence",
        "INSERT INTO tollgate_usage_events (account_id, request_id, credential_id, units, \
         occurred_at_floor_us, occurred_at_submicro_ns, lease_id, fencing_token) \
         VALUES ('acct-a', 'new', 'cred-a', 1, 0, 0, 'a1', -1)",
        Some(EVENT_FENCE_GUARD),
    ),
    write(
        "a lease with a zero fence",
        "INSERT INTO tollgate_leases (lease_id, account_id, fencing_token, capability_hash, \
         granted, used, state, expires_at_us) VALUES ('new', 'acct-a', 0, '\\x00', 1, 0, 'active', 1)",
        Some(LEASE_FENCE_GUARD),
    ),
    write(
        "a stored lease's fence turned negative",
        "UPDATE tollgate_leases SET fencing_token = -1 WHERE lease_id = 'a1'",
        Some(LEASE_FENCE_GUARD),
    ),
    write(
        "next_fence set to zero",
        "UPDATE tollgate_accounts SET next_fence = 0 WHERE account_id = 'acct-a'",
        Some(NEXT_FENCE_GUARD),
    ),
    write(
        "an account created with a negative next_fence",
        "INSERT INTO tollgate_accounts (account_id, next_fence) VALUES ('new', -1)",
        Some(NEXT_FENCE_GUARD),
    ),
    // The funding check of 0008 still applies alongside the new guards.
    write(
        "a lease without its fence",
        "INSERT INTO tollgate_usage_events (account_id, request_id, credential_id, units, \
         occurred_at_floor_us, occurred_at_submicro_ns, lease_id, fencing_token) \
         VALUES ('acct-a', 'new', 'cred-a', 1, 0, 0, 'a1', NULL)",
        Some("tollgate_usage_events_funding_all_or_nothing"),
    ),
    write(
        "zero-unit overage usage, with a null lease and fence",
        "INSERT INTO tollgate_usage_events (account_id, request_id, credential_id, units, \
         occurred_at_floor_us, occurred_at_submicro_ns, lease_id, fencing_token) \
         VALUES ('acct-a', 'new', 'cred-a', 0, 0, 0, NULL, NULL)",
        None,
    ),
    write(
        "the largest units and fence",
        "INSERT INTO tollgate_usage_events (account_id, request_id, credential_id, units, \
         occurred_at_floor_us, occurred_at_submicro_ns, lease_id, fencing_token) \
         VALUES ('acct-a', 'new', 'cred-a', 9223372036854775807, 0, 0, 'a1', 9223372036854775807)",
        None,
    ),
    write(
        "a lease with fence one, in the 0016-era shape",
        "INSERT INTO tollgate_leases (lease_id, account_id, fencing_token, capability_hash, \
         granted, used, state, expires_at_us) VALUES ('new', 'acct-c', 1, '\\x00', 1, 0, 'active', 1)",
        None,
    ),
];

/// Runs every write in its own rolled-back transaction and collects every
/// case whose outcome differs from the expected one.
async fn check_writes(pool: &PgPool, cases: &[WriteCase]) {
    let mut failures = Vec::new();
    for case in cases {
        let mut tx = pool.begin().await.expect("begin");
        let result = sqlx::raw_sql(case.sql).execute(&mut *tx).await;
        tx.rollback().await.expect("rollback");
        let got = result
            .as_ref()
            .err()
            .map(|e| pg_failure(e).map(|f| (f.sqlstate, f.constraint)).unwrap_or_else(|| (e.to_string(), None)));
        let expected = case.rejected_by.map(|name| ("23514".to_owned(), Some(name.to_owned())));
        if got != expected {
            failures.push(format!("{}: expected {expected:?}, got {got:?}", case.name));
        }
    }
    assert!(failures.is_empty(), "writes:\n{}", failures.join("\n"));
}

#[tokio::test]
async fn upgrade_from_populated_0014_preserves_every_row_byte_for_byte_and_guards_new_writes() {
    let db = migrated_through(14).await;
    populated::populate(db.pool()).await;
    let rows_0014 = exact_rows(db.pool()).await;
    assert_eq!(conservation_violations(db.pool()).await, Vec::<String>::new());
    assert_eq!(guard_states(db.pool()).await, vec![None; 4]);

    // 0015: the guards exist, unvalidated, and no row was touched.
    let applied = db.migrate_through(15).await.expect("0015 applies");
    assert_eq!(applied.iter().map(|m| m.version).collect::<Vec<_>>(), vec![15]);
    assert_eq!(guard_states(db.pool()).await, vec![Some(false); 4]);
    assert_eq!(exact_rows(db.pool()).await, rows_0014, "0015 changed a row");

    // 0016: validated against the history, still without touching a row.
    let applied = db.migrate_through(16).await.expect("0016 applies");
    assert_eq!(applied.iter().map(|m| m.version).collect::<Vec<_>>(), vec![16]);
    assert_eq!(guard_states(db.pool()).await, vec![Some(true); 4]);
    assert_eq!(exact_rows(db.pool()).await, rows_0014, "0016 changed a row");

    // Leased and overage rows, every counter and the equations, exactly.
    assert_eq!(usage_rows(db.pool()).await, expected_usage());
    assert_eq!(populated::account_counters(db.pool()).await, populated::expected_accounts());
    assert_eq!(populated::lease_fields(db.pool()).await, populated::expected_leases());
    assert_eq!(populated::credential_activity(db.pool()).await, populated::expected_credentials());
    assert_eq!(conservation_violations(db.pool()).await, Vec::<String>::new());
    assert_eq!(inspect::inspect_guards(db.pool()).await.expect("inspection"), vec![]);

    check_writes(db.pool(), &NEW_WRITES).await;

    // A running 0016-era binary keeps its write shapes: valid usage is
    // accepted, an out-of-domain event is refused by the guard and its
    // transaction, lease usage included, rolls back.
    let writer = LegacyWriter { grace_us: GRACE_US };
    let mut old = db.pool().acquire().await.expect("connection");
    let valid = LegacyEvent {
        account_id: "acct-a",
        request_id: "r-after-0016",
        credential_id: "cred-a",
        units: 4,
        occurred_at_floor_us: NOW_US,
        occurred_at_submicro_ns: 0,
        funding: Some(("a1", 1)),
    };
    assert!(writer.ingest(&mut old, &valid, NOW_US).await.expect("old ingest"));
    let before_bad = exact_rows(db.pool()).await;
    let bad = LegacyEvent { request_id: "r-negative", units: -4, ..valid.clone() };
    let error =
        writer.ingest(&mut old, &bad, NOW_US).await.expect_err("the guard refuses the old writer's negative units");
    assert_eq!(error.failed_statement(), Some(("USAGE_INSERT", "23514".to_owned())), "{error:?}");
    assert_eq!(exact_rows(db.pool()).await, before_bad, "a refused write left a trace");
    let (a1_used,): (i64,) = sqlx::query_as("SELECT used FROM tollgate_leases WHERE lease_id = 'a1'")
        .fetch_one(db.pool())
        .await
        .expect("a1");
    assert_eq!(a1_used, 14);
    assert_eq!(conservation_violations(db.pool()).await, Vec::<String>::new());
    drop(old);
    db.drop_now().await;
}

#[tokio::test]
async fn a_catalogue_ending_at_0014_refuses_a_cold_start_after_0015_naming_the_version() {
    for case in [
        CatalogueCase { applied_through: 15, catalogue_through: 14, expect: Startup::Refused { unknown_version: 15 } },
        CatalogueCase { applied_through: 16, catalogue_through: 14, expect: Startup::Refused { unknown_version: 15 } },
        // A rollback build must know both migrations: one that knows only
        // 0015 is refused as well once 0016 is applied.
        CatalogueCase { applied_through: 16, catalogue_through: 15, expect: Startup::Refused { unknown_version: 16 } },
        // The rollback build that carries both unchanged files starts.
        CatalogueCase { applied_through: 16, catalogue_through: 16, expect: Startup::Starts },
    ] {
        check_old_catalogue(case).await;
    }
}

/// Legacy history with one kind of invalid value, written before the guards
/// existed, as a buggy writer could have left it.
struct InvalidHistoryCase {
    name: &'static str,
    corrupt: &'static str,
    guard: &'static str,
    violation: (&'static str, &'static str, &'static str, i64),
}

const INVALID_HISTORY: [InvalidHistoryCase; 7] = [
    InvalidHistoryCase {
        name: "negative units",
        corrupt: "UPDATE tollgate_usage_events SET units = -45 WHERE request_id = 'r-b2'",
        guard: UNITS_GUARD,
        violation: ("tollgate_usage_events", "acct-b/r-b2", "units", -45),
    },
    InvalidHistoryCase {
        name: "zero usage fence",
        corrupt: "UPDATE tollgate_usage_events SET fencing_token = 0 WHERE request_id = 'r-a1-1'",
        guard: EVENT_FENCE_GUARD,
        violation: ("tollgate_usage_events", "acct-a/r-a1-1", "fencing_token", 0),
    },
    InvalidHistoryCase {
        name: "negative usage fence",
        corrupt: "UPDATE tollgate_usage_events SET fencing_token = -4 WHERE request_id = 'r-a4'",
        guard: EVENT_FENCE_GUARD,
        violation: ("tollgate_usage_events", "acct-a/r-a4", "fencing_token", -4),
    },
    InvalidHistoryCase {
        name: "zero lease fence",
        corrupt: "UPDATE tollgate_leases SET fencing_token = 0 WHERE lease_id = 'a2'",
        guard: LEASE_FENCE_GUARD,
        violation: ("tollgate_leases", "a2", "fencing_token", 0),
    },
    InvalidHistoryCase {
        name: "negative lease fence",
        corrupt: "UPDATE tollgate_leases SET fencing_token = -6 WHERE lease_id = 'a6'",
        guard: LEASE_FENCE_GUARD,
        violation: ("tollgate_leases", "a6", "fencing_token", -6),
    },
    InvalidHistoryCase {
        name: "next_fence zero",
        corrupt: "UPDATE tollgate_accounts SET next_fence = 0 WHERE account_id = 'acct-c'",
        guard: NEXT_FENCE_GUARD,
        violation: ("tollgate_accounts", "acct-c", "next_fence", 0),
    },
    InvalidHistoryCase {
        name: "next_fence negative",
        corrupt: "UPDATE tollgate_accounts SET next_fence = -3 WHERE account_id = 'acct-a'",
        guard: NEXT_FENCE_GUARD,
        violation: ("tollgate_accounts", "acct-a", "next_fence", -3),
    },
];

fn violation(table: &str, key: &str, column: &str, value: i64) -> GuardViolation {
    GuardViolation { table: table.to_owned(), key: key.to_owned(), column: column.to_owned(), value }
}

#[tokio::test]
async fn each_kind_of_invalid_history_fails_0016_naming_its_guard_and_keeps_0015() {
    for case in INVALID_HISTORY {
        let name = case.name;
        let db = migrated_through(14).await;
        populated::populate(db.pool()).await;
        sqlx::raw_sql(case.corrupt).execute(db.pool()).await.expect(name);
        let rows = exact_rows(db.pool()).await;

        let error = db.migrate().await.expect_err(name);
        let (version, failure) = failed_migration(&error);
        assert_eq!(version, 16, "{name}");
        assert_eq!(failure.sqlstate, "23514", "{name}");
        assert_eq!(failure.constraint.as_deref(), Some(case.guard), "{name}");
        assert!(error.to_string().contains("migration 16 failed"), "{name}: {error}");

        assert_eq!(applied_versions(db.pool()).await, (1..=15).collect::<Vec<i64>>(), "{name}");
        assert_eq!(guard_states(db.pool()).await, vec![Some(false); 4], "{name}");
        assert_eq!(exact_rows(db.pool()).await, rows, "{name}: the failed 0016 changed a row");
        let (table, key, column, value) = case.violation;
        assert_eq!(
            inspect::inspect_guards(db.pool()).await.expect("inspection"),
            vec![violation(table, key, column, value)],
            "{name}"
        );
        db.drop_now().await;
    }
}

/// The invalid history of the repair test: one row per guard, each next to
/// the evidence it can be reconstructed from.
const CORRUPT_HISTORY: &str = "
    -- r-b1-2 reported 30 units; lease b1's used total, 70, is r-b1-1 + r-b1-2.
    UPDATE tollgate_usage_events SET units = -30 WHERE request_id = 'r-b1-2';
    -- Both events name a lease whose fence is intact.
    UPDATE tollgate_usage_events SET fencing_token = 0 WHERE request_id = 'r-a1-1';
    UPDATE tollgate_usage_events SET fencing_token = -4 WHERE request_id = 'r-a4';
    -- Both leases have an accepted event carrying the fence they were issued.
    UPDATE tollgate_leases SET fencing_token = 0 WHERE lease_id = 'a3';
    UPDATE tollgate_leases SET fencing_token = -1 WHERE lease_id = 'b2';
    -- acct-b issued fences 1 and 2, so its next fence is 3, not 1.
    UPDATE tollgate_accounts SET next_fence = 0 WHERE account_id = 'acct-b';
";

fn corrupt_history_violations() -> Vec<GuardViolation> {
    let mut expected = vec![
        violation("tollgate_usage_events", "acct-b/r-b1-2", "units", -30),
        violation("tollgate_usage_events", "acct-a/r-a1-1", "fencing_token", 0),
        violation("tollgate_usage_events", "acct-a/r-a4", "fencing_token", -4),
        violation("tollgate_leases", "a3", "fencing_token", 0),
        violation("tollgate_leases", "b2", "fencing_token", -1),
        violation("tollgate_accounts", "acct-b", "next_fence", 0),
    ];
    expected.sort();
    expected
}

const REPAIR: &str = include_str!("fixtures/repair_guard_violations_from_evidence.sql");

#[tokio::test]
async fn invalid_history_fails_startup_at_0016_then_an_evidence_based_repair_validates_and_serves() {
    let db = migrated_through(14).await;
    populated::populate(db.pool()).await;
    sqlx::raw_sql(CORRUPT_HISTORY).execute(db.pool()).await.expect("invalid history");
    let invalid_rows = exact_rows(db.pool()).await;
    assert_eq!(inspect::inspect_guards(db.pool()).await.expect("inspection"), corrupt_history_violations());

    // Startup fails at 0016, on the first guard it validates.
    let refused = PostgresStore::from_pool(db.pool().clone(), policy()).await;
    let error = match refused {
        Err(ConnectError::Migration(error)) => error,
        Err(other) => panic!("expected a migration failure, got {other}"),
        Ok(_) => panic!("startup must fail on invalid history"),
    };
    let (version, failure) = failed_migration(&error);
    assert_eq!((version, failure.constraint.as_deref()), (16, Some(UNITS_GUARD)));

    // 0015 stays committed with its guards, unvalidated; every invalid row is
    // preserved exactly as it was.
    assert_eq!(applied_versions(db.pool()).await, (1..=15).collect::<Vec<i64>>());
    let history_0015 = migration_history(db.pool()).await;
    assert_eq!(guard_states(db.pool()).await, vec![Some(false); 4]);
    assert_eq!(exact_rows(db.pool()).await, invalid_rows);

    // 0015 keeps checking new writes, on new rows and on the invalid ones:
    // an old binary cannot even credit the account whose counter is invalid.
    check_writes(db.pool(), &NEW_WRITES).await;
    let writer = LegacyWriter { grace_us: GRACE_US };
    let mut old = db.pool().acquire().await.expect("connection");
    let error = writer
        .credit(&mut old, "acct-b", "c-b3", 10)
        .await
        .expect_err("the invalid row cannot be rewritten unrepaired");
    assert_eq!(error.failed_statement(), Some(("CREDIT_ACCOUNT", "23514".to_owned())));
    drop(old);
    assert_eq!(exact_rows(db.pool()).await, invalid_rows);
    assert_eq!(inspect::inspect_guards(db.pool()).await.expect("inspection"), corrupt_history_violations());

    // Reconcile from the fixture's own evidence, with an audit trail.
    let mut operator = db.pool().acquire().await.expect("connection");
    sqlx::raw_sql(REPAIR).execute(&mut *operator).await.expect("the repair finds evidence for every row");
    drop(operator);
    let audit: Vec<(String, String, String, i64, i64)> = sqlx::query_as(
        "SELECT table_name, row_key, column_name, old_value, new_value \
         FROM tollgate_repair.audit \
         ORDER BY table_name COLLATE \"C\", row_key COLLATE \"C\", column_name COLLATE \"C\"",
    )
    .fetch_all(db.pool())
    .await
    .expect("audit trail");
    let owned = |t: &str, k: &str, c: &str, old: i64, new: i64| (t.to_owned(), k.to_owned(), c.to_owned(), old, new);
    assert_eq!(
        audit,
        vec![
            owned("tollgate_accounts", "acct-b", "next_fence", 0, 3),
            owned("tollgate_leases", "a3", "fencing_token", 0, 3),
            owned("tollgate_leases", "b2", "fencing_token", -1, 1),
            owned("tollgate_usage_events", "acct-a/r-a1-1", "fencing_token", 0, 1),
            owned("tollgate_usage_events", "acct-a/r-a4", "fencing_token", -4, 4),
            owned("tollgate_usage_events", "acct-b/r-b1-2", "units", -30, 30),
        ]
    );
    // The repaired history is the history the legacy writer wrote.
    assert_eq!(usage_rows(db.pool()).await, expected_usage());
    assert_eq!(populated::lease_fields(db.pool()).await, populated::expected_leases());
    assert_eq!(populated::account_counters(db.pool()).await, populated::expected_accounts());
    assert_eq!(inspect::inspect_guards(db.pool()).await.expect("inspection"), vec![]);
    assert_eq!(migration_history(db.pool()).await, history_0015, "the repair touched history");
    assert_eq!(guard_states(db.pool()).await, vec![Some(false); 4], "the repair touched a guard");

    // The next startup validates and serves.
    let store = PostgresStore::from_pool(db.pool().clone(), policy()).await.expect("startup after the repair");
    let applied: Vec<i64> = store.applied_migrations().iter().map(|m| m.version).collect();
    assert_eq!(applied, versions_from(16));
    assert_eq!(guard_states(db.pool()).await, vec![Some(true); 4]);
    let history = migration_history(db.pool()).await;
    assert_eq!(history[..15], history_0015[..], "0001-0015 history was rewritten");

    // acct-b continues its allocation sequence at 3: no fence is issued twice.
    let now = Timestamp::from_second(1_650_000_000).expect("instant");
    let lease =
        store.acquire("acct-b", 10, SignedDuration::from_secs(60), now).await.expect("acquire on the repaired account");
    assert_eq!(lease.lease.fencing_token, 3);
    assert!(!lease.lease.expiry_is_upper_bound);
    let report = store.check().await.expect("check");
    assert_eq!(report.violations, vec![]);
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(conservation_violations(db.pool()).await, Vec::<String>::new());
    drop(store);
    db.drop_now().await;
}

/// Evidence that is missing or ambiguous stops the repair before it changes
/// anything: the guards, not a guess, decide what may be stored.
#[tokio::test]
async fn repair_without_evidence_changes_nothing() {
    let cases: [(&str, &str, &str); 4] = [
        (
            "negative overage units have no lease to take a total from",
            "UPDATE tollgate_usage_events SET units = -7 WHERE request_id = 'r-a-over'",
            "names no lease",
        ),
        (
            "two negative events of one lease cannot be told apart",
            "UPDATE tollgate_usage_events SET units = -units - 1 \
             WHERE request_id IN ('r-b1-1', 'r-b1-2')",
            "several events with negative units",
        ),
        (
            "a lease without usage carries no evidence of its fence",
            "UPDATE tollgate_leases SET fencing_token = 0 WHERE lease_id = 'a2'",
            "no usage event carrying its fence",
        ),
        (
            "a gap in the allocation sequence leaves next_fence unknown",
            "UPDATE tollgate_leases SET fencing_token = 9 WHERE lease_id = 'b2'; \
             UPDATE tollgate_usage_events SET fencing_token = 9 WHERE request_id = 'r-b2'; \
             UPDATE tollgate_accounts SET next_fence = 0 WHERE account_id = 'acct-b'",
            "not exactly 1..max",
        ),
    ];
    for (name, corrupt, refusal) in cases {
        let db = migrated_through(14).await;
        populated::populate(db.pool()).await;
        sqlx::raw_sql(corrupt).execute(db.pool()).await.expect(name);
        let _ = db.migrate().await.expect_err(name);
        let rows = exact_rows(db.pool()).await;
        let violations = inspect::inspect_guards(db.pool()).await.expect("inspection");
        assert!(!violations.is_empty(), "{name}");

        let mut operator = sqlx::PgConnection::connect_with(&db.connect_options()).await.expect("connection");
        let error = sqlx::raw_sql(REPAIR).execute(&mut operator).await.expect_err(name);
        let failure = pg_failure(&error).unwrap_or_else(|| panic!("{name}: {error}"));
        assert_eq!(failure.sqlstate, "P0001", "{name}: {failure:?}");
        assert!(failure.message.contains(refusal), "{name}: {}", failure.message);
        // The failed transaction dies with its connection.
        operator.close().await.expect("close");

        assert_eq!(exact_rows(db.pool()).await, rows, "{name}");
        assert_eq!(inspect::inspect_guards(db.pool()).await.expect("inspection"), violations);
        let audit: Option<String> = sqlx::query_scalar("SELECT to_regclass('tollgate_repair.audit')::text")
            .fetch_one(db.pool())
            .await
            .expect("audit table lookup");
        assert_eq!(audit, None, "{name}: a refused repair left an audit table");
        assert!(matches!(db.migrate().await, Err(MigrationError::Failed { version: 16, .. })));
        db.drop_now().await;
    }
}

/// The guard inspection: exactly the offending rows, and only reads.
#[tokio::test]
async fn guard_inspection_reports_exactly_the_offending_rows_and_only_reads() {
    // The queries are `docs/upgrading.md`'s: their conditions appear verbatim.
    for (sql, condition) in [
        (inspect::USAGE_EVENTS_SQL, "FROM tollgate_usage_events WHERE units < 0 OR fencing_token <= 0"),
        (inspect::LEASES_SQL, "FROM tollgate_leases WHERE fencing_token <= 0"),
        (inspect::ACCOUNTS_SQL, "FROM tollgate_accounts WHERE next_fence <= 0"),
    ] {
        assert!(sql.contains(condition), "{sql}");
    }

    let db = migrated_through(14).await;
    populated::populate(db.pool()).await;
    assert_eq!(inspect::inspect_guards(db.pool()).await.expect("clean"), vec![]);

    // One event breaking both of its guards is reported once per column;
    // overage events, whose fence is null, never are.
    sqlx::raw_sql(CORRUPT_HISTORY).execute(db.pool()).await.expect("invalid history");
    sqlx::raw_sql(
        "UPDATE tollgate_usage_events SET units = -1, fencing_token = -2 \
         WHERE request_id = 'r-a1-zero'",
    )
    .execute(db.pool())
    .await
    .expect("doubly invalid event");
    let mut expected = corrupt_history_violations();
    expected.push(violation("tollgate_usage_events", "acct-a/r-a1-zero", "units", -1));
    expected.push(violation("tollgate_usage_events", "acct-a/r-a1-zero", "fencing_token", -2));
    expected.sort();

    let rows = exact_rows(db.pool()).await;
    assert_eq!(inspect::inspect_guards(db.pool()).await.expect("at 0014"), expected);
    // The same report after 0016 failed, on the schema an operator repairs.
    let _ = db.migrate().await.expect_err("0016 fails");
    assert_eq!(inspect::inspect_guards(db.pool()).await.expect("at 0015"), expected);
    assert_eq!(exact_rows(db.pool()).await, rows, "the inspection wrote");
    db.drop_now().await;
}
