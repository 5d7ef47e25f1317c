//! The 0017 upgrade, proved on populated 0016 databases: migration 0017
//! turns truncated microsecond expiries into conservative nanosecond upper
//! bounds, fences off every 0016-era lease statement, waits for running old
//! transactions, rolls back whole on an out-of-domain row, and survives a
//! restart. Each test has its own database, written through the 0016-era
//! writer in `fixtures/legacy_0016_lease_sql.rs`.
//!
//! Expected bounds come from an independent oracle over i128 nanoseconds
//! that searches for the latest instant a legacy writer would have stored as
//! the given microseconds; it does not restate the migration's rule.

use std::collections::BTreeMap;

use jiff::{SignedDuration, Timestamp};
use sqlx::{Connection, PgConnection, PgPool};
use tollgate_core::{GrantPolicy, LeaseState, Outcome};
use tollgate_pg::migrations;
use tollgate_pg::migrations::versions_from;
use tollgate_pg::testing::pg_failure;
use tollgate_pg::{PgStoreConfig, PostgresStore};
use tollgate_store::{LegacyBoundCount, Store, UsageSink};

use crate::fixtures::legacy_0016_lease_sql::{
    self as legacy, ACQUIRE_DEBIT, ACQUIRE_INSERT, EXPIRY_STATEMENTS, LegacyEvent, LegacyWriter, truncated_us,
};
use crate::fixtures::populated::{self, GRACE_NS, GRACE_US, NOW_US};
use crate::fixtures::{
    CatalogueCase, Startup, applied_versions, backend_pid, check_old_catalogue, columns, conservation_violations,
    constraints, exact_rows, failed_migration, granted_modes, lease_index_columns, lease_indexes, legacy_bound_counts,
    lock_wait_on, migrated_through, migration_history, prepared_statements, rows_without_lease_expiry,
};

const NS_PER_US: i128 = 1_000;
/// `Timestamp::MIN` and `Timestamp::MAX` in nanoseconds, written out here
/// rather than taken from the code under test.
const MIN_NS: i128 = -377_705_023_201_000_000_000;
const MAX_NS: i128 = 253_402_207_200_999_999_999;

const LEGACY_COLUMN: &str = "expires_at_us";
const NEW_COLUMNS: [&str; 3] = ["expiry_floor_us", "expiry_submicro_ns", "expiry_is_upper_bound"];

/// The instants a legacy writer could have meant by `stored_us`: every `t`
/// in the timestamp domain that truncates toward zero to it. Found by
/// checking the 1,999 candidates around `stored_us * 1000` one by one.
fn consistent_instants(stored_us: i64) -> (i128, i128) {
    let base = i128::from(stored_us) * NS_PER_US;
    let matches = |t: &i128| (MIN_NS..=MAX_NS).contains(t) && t / NS_PER_US == i128::from(stored_us);
    let earliest = (-999..=999).map(|k| base + k).find(matches);
    let latest = (-999..=999).rev().map(|k| base + k).find(matches);
    match (earliest, latest) {
        (Some(earliest), Some(latest)) => (earliest, latest),
        _ => panic!("no instant in the domain truncates to {stored_us} µs"),
    }
}

fn timestamp(ns: i128) -> Timestamp {
    Timestamp::from_nanosecond(ns).expect("instant in the domain")
}

/// The upgraded fleet's policy: the legacy fleet's grace, unchanged.
fn policy() -> GrantPolicy {
    GrantPolicy::new(SignedDuration::from_secs(3600), SignedDuration::from_nanos(GRACE_NS), 100).expect("valid policy")
}

/// How a legacy lease of the bounds fixture ended before the upgrade.
#[derive(Debug, Clone, Copy)]
enum End {
    Active,
    Released,
    Reclaimed,
    /// Consolidated into a new legacy lease with this true expiry.
    Consolidated {
        successor_true_ns: i128,
    },
}

struct BoundCase {
    lease_id: &'static str,
    true_ns: i128,
    end: End,
}

const fn bound(lease_id: &'static str, true_ns: i128, end: End) -> BoundCase {
    BoundCase { lease_id, true_ns, end }
}

/// Positive, negative, the zero-microsecond bucket from both sides, both
/// domain endpoints, and every state. The true instant is what the legacy
/// writer's caller asked for; the writer stored it truncated.
const BOUND_CASES: [BoundCase; 17] = [
    bound("pos-fraction", 1_700_000_000_123_456_789, End::Active),
    bound("pos-whole-us", 5_000, End::Active),
    bound("pos-1ns", 1, End::Released),
    bound("zero-bucket-minus-999", -999, End::Active),
    bound("zero-bucket-plus-999", 999, End::Active),
    bound("zero-bucket-minus-1", -1, End::Released),
    bound("zero-bucket-exact", 0, End::Reclaimed),
    bound("zero-bucket-minus-999-settled", -999, End::Consolidated { successor_true_ns: 2_000_000_000_000_000_777 }),
    bound("neg-fraction", -1_500, End::Active),
    bound("neg-whole-us", -2_000, End::Reclaimed),
    bound("neg-1001", -1_001, End::Released),
    bound("neg-far", -1_234_567_890_123_456_789, End::Reclaimed),
    bound("min", MIN_NS, End::Active),
    bound("min-plus-999", MIN_NS + 999, End::Reclaimed),
    bound("max", MAX_NS, End::Active),
    bound("max-minus-999", MAX_NS - 999, End::Released),
    bound("max-minus-1000", MAX_NS - 1_000, End::Consolidated { successor_true_ns: MAX_NS - 1 }),
];

/// A legacy lease as written, with the instant its writer truly meant.
#[derive(Debug, Clone)]
struct Written {
    lease_id: String,
    true_ns: i128,
    state: &'static str,
    capability: String,
}

/// Writes every case through the legacy writer on a 0016 database. Leases
/// that end reclaimed are written and reclaimed first, one at a time, so
/// that each legacy reclaim pass finds exactly that lease due.
async fn write_bound_cases(pool: &PgPool) -> Vec<Written> {
    // Zero grace keeps the legacy cutoff at the lease's own microsecond.
    let writer = LegacyWriter { grace_us: 0 };
    let mut conn = pool.acquire().await.expect("connection");
    let conn = &mut *conn;
    writer.create_account(conn, "acct").await.expect("account");
    writer.credit(conn, "acct", "c1", 1_000).await.expect("credit");
    // The legacy clock reads earlier than every expiry, so release and
    // consolidation are before their legacy boundary.
    let early_us = i64::MIN;

    let mut written = Vec::new();
    let reclaimed_first = BOUND_CASES.iter().filter(|c| matches!(c.end, End::Reclaimed));
    let others = BOUND_CASES.iter().filter(|c| !matches!(c.end, End::Reclaimed));
    for case in reclaimed_first.chain(others) {
        let capability = format!("tgc_{}", case.lease_id);
        let grant = writer
            .acquire(conn, "acct", case.lease_id, &capability, 1, truncated_us(case.true_ns))
            .await
            .unwrap_or_else(|e| panic!("{}: {e:?}", case.lease_id));
        let mut record =
            Written { lease_id: case.lease_id.to_owned(), true_ns: case.true_ns, state: "active", capability };
        match case.end {
            End::Active => {}
            End::Released => {
                writer
                    .release(conn, case.lease_id, &record.capability, early_us)
                    .await
                    .unwrap_or_else(|e| panic!("{}: {e:?}", case.lease_id));
                record.state = "released";
            }
            End::Reclaimed => {
                let reclaimed = writer
                    .reclaim(conn, grant.expires_at_us, 10)
                    .await
                    .unwrap_or_else(|e| panic!("{}: {e:?}", case.lease_id));
                assert_eq!(reclaimed, vec![case.lease_id.to_owned()]);
                record.state = "reclaimed";
            }
            End::Consolidated { successor_true_ns } => {
                let successor = format!("{}-next", case.lease_id);
                let successor_capability = format!("tgc_{successor}");
                writer
                    .consolidate(
                        conn,
                        "acct",
                        &[(case.lease_id, &record.capability)],
                        0,
                        &successor,
                        &successor_capability,
                        truncated_us(successor_true_ns),
                        early_us,
                    )
                    .await
                    .unwrap_or_else(|e| panic!("{}: {e:?}", case.lease_id));
                record.state = "consolidated";
                written.push(Written {
                    lease_id: successor,
                    true_ns: successor_true_ns,
                    state: "active",
                    capability: successor_capability,
                });
            }
        }
        written.push(record);
    }
    written.sort_by(|a, b| a.lease_id.cmp(&b.lease_id));
    written
}

#[tokio::test]
async fn legacy_expiries_become_the_latest_consistent_instant_marked_as_upper_bounds() {
    let db = migrated_through(16).await;
    let written = write_bound_cases(db.pool()).await;

    // The legacy rows hold exactly the truncated microseconds.
    let stored: BTreeMap<String, i64> =
        sqlx::query_as::<_, (String, i64)>("SELECT lease_id, expires_at_us FROM tollgate_leases")
            .fetch_all(db.pool())
            .await
            .expect("legacy rows")
            .into_iter()
            .collect();
    for w in &written {
        assert_eq!(stored[&w.lease_id], truncated_us(w.true_ns), "{}", w.lease_id);
    }
    let before = rows_without_lease_expiry(db.pool()).await;

    let applied = db.migrate().await.expect("0017 applies");
    assert_eq!(applied.iter().map(|m| m.version).collect::<Vec<_>>(), versions_from(17));

    let rows: Vec<(String, String, i64, i16, bool)> = sqlx::query_as(
        "SELECT lease_id, state, expiry_floor_us, expiry_submicro_ns, expiry_is_upper_bound \
         FROM tollgate_leases ORDER BY lease_id COLLATE \"C\"",
    )
    .fetch_all(db.pool())
    .await
    .expect("migrated rows");
    assert_eq!(rows.len(), written.len());
    for ((lease_id, state, floor_us, submicro_ns, upper_bound), w) in rows.iter().zip(&written) {
        assert_eq!(lease_id, &w.lease_id);
        assert_eq!(state, w.state, "{lease_id}");
        let stored_us = stored[lease_id];
        let (earliest, latest) = consistent_instants(stored_us);
        assert!((earliest..=latest).contains(&w.true_ns), "{lease_id}: fixture inconsistent");
        let bound_ns = i128::from(*floor_us) * NS_PER_US + i128::from(*submicro_ns);
        assert!((0..=999).contains(submicro_ns), "{lease_id}");
        assert_eq!(bound_ns, latest, "{lease_id}: not the latest consistent instant");
        assert!(*upper_bound, "{lease_id}: the marker is set on every legacy row");
        assert!(bound_ns >= w.true_ns, "{lease_id}: the expiry moved earlier");
        // The delay is at most 999 ns, or 1,998 ns in the zero bucket.
        let delay_max = if stored_us == 0 { 1_998 } else { 999 };
        assert!(bound_ns - w.true_ns <= delay_max, "{lease_id}: delayed by {}", bound_ns - w.true_ns);
    }
    // Both ends of the zero bucket delay by the documented amounts.
    let delay = |id: &str| {
        let (_, latest) = consistent_instants(stored[id]);
        latest - written.iter().find(|w| w.lease_id == id).expect(id).true_ns
    };
    assert_eq!(delay("zero-bucket-minus-999"), 1_998);
    assert_eq!(delay("zero-bucket-plus-999"), 0);
    assert_eq!(delay("min"), 0);
    assert_eq!(delay("max"), 0);

    // Tuple order is instant order, before the epoch and at both ends.
    let by_tuple: Vec<String> = sqlx::query_scalar(
        "SELECT lease_id FROM tollgate_leases \
         ORDER BY expiry_floor_us, expiry_submicro_ns, lease_id COLLATE \"C\"",
    )
    .fetch_all(db.pool())
    .await
    .expect("tuple order");
    let mut by_instant: Vec<(i128, String)> =
        written.iter().map(|w| (consistent_instants(stored[&w.lease_id]).1, w.lease_id.clone())).collect();
    by_instant.sort();
    assert_eq!(by_tuple, by_instant.into_iter().map(|(_, id)| id).collect::<Vec<_>>());

    // The legacy-bound query of `docs/upgrading.md`: every legacy row, settled history included, is marked.
    let mut expected_counts: BTreeMap<(String, bool), i64> = BTreeMap::new();
    for w in &written {
        *expected_counts.entry((w.state.to_owned(), true)).or_default() += 1;
    }
    let expected_counts: Vec<(String, bool, i64)> = expected_counts.into_iter().map(|((s, b), n)| (s, b, n)).collect();
    assert_eq!(legacy_bound_counts(db.pool()).await, expected_counts);
    assert_eq!(
        expected_counts,
        vec![
            ("active".to_owned(), true, 9),
            ("consolidated".to_owned(), true, 2),
            ("reclaimed".to_owned(), true, 4),
            ("released".to_owned(), true, 4),
        ]
    );

    // Nothing but the expiry changed, and the index covers both components.
    assert_eq!(rows_without_lease_expiry(db.pool()).await, before);
    assert_eq!(conservation_violations(db.pool()).await, Vec::<String>::new());
    let active_expiry_index = lease_indexes(db.pool())
        .await
        .into_iter()
        .find(|def| def.contains("tollgate_leases_active_expiry"))
        .expect("the active expiry index exists");
    assert!(
        active_expiry_index.contains("(expiry_floor_us, expiry_submicro_ns) WHERE (state = 'active'::text)"),
        "{active_expiry_index}"
    );

    // The store decodes the same instants, marker included.
    let store = PostgresStore::from_pool(db.pool().clone(), policy()).await.expect("store");
    for w in &written {
        let lease = store.lease("acct", &w.lease_id).await.expect("lease");
        assert_eq!(lease.expiry, timestamp(consistent_instants(stored[&w.lease_id]).1), "{}", w.lease_id);
        assert!(lease.expiry_is_upper_bound, "{}", w.lease_id);
    }
    drop(store);
    db.drop_now().await;
}

/// One 0016-era operation, run through the legacy writer on `conn`.
#[derive(Debug, Clone, Copy)]
enum OldOperation {
    Acquire,
    Release,
    Consolidate,
    Reclaim,
    LeasedUsage,
}

impl OldOperation {
    const ALL: [OldOperation; 5] = [
        OldOperation::Acquire,
        OldOperation::Release,
        OldOperation::Consolidate,
        OldOperation::Reclaim,
        OldOperation::LeasedUsage,
    ];

    /// The statement that must hit the fence: the first one naming the expiry.
    fn fenced_statement(self) -> &'static str {
        match self {
            OldOperation::Acquire => "ACQUIRE_INSERT",
            OldOperation::Release => "RELEASE_LOCK",
            OldOperation::Consolidate => "CONSOLIDATE_LOCK",
            OldOperation::Reclaim => "RECLAIM_DUE",
            OldOperation::LeasedUsage => "USAGE_LEASE_LOCK",
        }
    }

    async fn run(self, conn: &mut PgConnection, tag: &str) -> Result<(), legacy::LegacyError> {
        let writer = LegacyWriter { grace_us: GRACE_US };
        let later_us = NOW_US + 60_000_000;
        match self {
            OldOperation::Acquire => {
                writer.acquire(conn, "acct-a", &format!("{tag}-new"), "tgc_new", 5, later_us).await.map(drop)
            }
            OldOperation::Release => writer.release(conn, "a1", "tgc_legacy_a1", NOW_US).await.map(drop),
            OldOperation::Consolidate => writer
                .consolidate(
                    conn,
                    "acct-a",
                    &[("a2", "tgc_legacy_a2"), ("a6", "tgc_legacy_a6")],
                    0,
                    &format!("{tag}-merged"),
                    "tgc_merged",
                    later_us,
                    NOW_US,
                )
                .await
                .map(drop),
            OldOperation::Reclaim => writer.reclaim(conn, i64::MAX, 100).await.map(drop),
            OldOperation::LeasedUsage => {
                let request_id = format!("{tag}-usage");
                let event = LegacyEvent {
                    account_id: "acct-b",
                    request_id: &request_id,
                    credential_id: "cred-b",
                    units: 1,
                    occurred_at_floor_us: NOW_US,
                    occurred_at_submicro_ns: 0,
                    funding: Some(("b1", 2)),
                };
                writer.ingest(conn, &event, NOW_US).await.map(drop)
            }
        }
    }
}

/// Runs every legacy lease operation once on `conn` on a throwaway lease of
/// acct-c, so that every statement the old binary uses is prepared there.
async fn prepare_every_old_statement(conn: &mut PgConnection) {
    let writer = LegacyWriter { grace_us: GRACE_US };
    let later_us = NOW_US + 60_000_000;
    writer.acquire(conn, "acct-c", "warm-1", "tgc_warm_1", 1, later_us).await.expect("old acquire before 0017");
    let event = LegacyEvent {
        account_id: "acct-c",
        request_id: "warm-usage",
        credential_id: "cred-c",
        units: 0,
        occurred_at_floor_us: NOW_US,
        occurred_at_submicro_ns: 0,
        funding: Some(("warm-1", 1)),
    };
    writer.ingest(conn, &event, NOW_US).await.expect("old usage before 0017");
    writer.acquire(conn, "acct-c", "warm-2", "tgc_warm_2", 1, later_us).await.expect("old acquire before 0017");
    writer
        .consolidate(
            conn,
            "acct-c",
            &[("warm-1", "tgc_warm_1"), ("warm-2", "tgc_warm_2")],
            0,
            "warm-3",
            "tgc_warm_3",
            later_us,
            NOW_US,
        )
        .await
        .expect("old consolidation before 0017");
    writer.release(conn, "warm-3", "tgc_warm_3", NOW_US).await.expect("old release before 0017");
    assert_eq!(writer.reclaim(conn, NOW_US, 100).await.expect("old reclaim before 0017"), Vec::<String>::new());
}

#[tokio::test]
async fn every_old_lease_statement_fails_with_42703_after_0017_even_prepared_before_it() {
    let db = migrated_through(16).await;
    populated::populate(db.pool()).await;

    // The old binary's connection, opened before the migration, with every
    // lease statement it uses prepared on it.
    let mut retained = PgConnection::connect_with(&db.connect_options()).await.expect("old connection");
    prepare_every_old_statement(&mut retained).await;
    let prepared = prepared_statements(&mut retained).await;
    for (name, sql) in EXPIRY_STATEMENTS.iter().chain(&[("ACQUIRE_DEBIT", ACQUIRE_DEBIT)]) {
        assert!(prepared.iter().any(|p| p == sql), "{name} is not prepared");
    }

    let applied = db.migrate().await.expect("0017 applies");
    assert_eq!(applied.iter().map(|m| m.version).collect::<Vec<_>>(), versions_from(17));
    let accounts = populated::account_counters(db.pool()).await;
    let rows = rows_without_lease_expiry(db.pool()).await;

    // A connection opened after the migration fares no better.
    let mut fresh = PgConnection::connect_with(&db.connect_options()).await.expect("new connection");
    for (which, conn) in [("retained", &mut retained), ("fresh", &mut fresh)] {
        for operation in OldOperation::ALL {
            let error = operation.run(conn, which).await.expect_err("the old statement must hit the fence");
            assert_eq!(
                error.failed_statement(),
                Some((operation.fenced_statement(), "42703".to_owned())),
                "{which} {operation:?}: {error:?}"
            );
            if let legacy::LegacyError::Statement { source, .. } = &error {
                let message = pg_failure(source).expect("database error").message;
                assert!(message.contains(LEGACY_COLUMN), "{which} {operation:?}: {message}");
            }
            assert_eq!(populated::account_counters(db.pool()).await, accounts, "{which} {operation:?}");
            assert_eq!(rows_without_lease_expiry(db.pool()).await, rows, "{which} {operation:?}");
        }
    }

    // The old acquire really debited the account before the fence stopped
    // it; the transaction's rollback is what restores the balance.
    let mut tx = retained.begin().await.expect("begin");
    let fence: i64 = sqlx::query_scalar(ACQUIRE_DEBIT)
        .bind("acct-a")
        .bind(5_i64)
        .fetch_one(&mut *tx)
        .await
        .expect("the debit still matches the schema");
    assert_eq!(fence, 7);
    let available: i64 = sqlx::query_scalar("SELECT available FROM tollgate_accounts WHERE account_id = 'acct-a'")
        .fetch_one(&mut *tx)
        .await
        .expect("balance inside the transaction");
    assert_eq!(available, 790 - 5);
    let insert = sqlx::query(ACQUIRE_INSERT)
        .bind("debit-then-fence")
        .bind("acct-a")
        .bind(fence)
        .bind(vec![0_u8; 32])
        .bind(5_i64)
        .bind(NOW_US)
        .execute(&mut *tx)
        .await;
    assert_eq!(pg_failure(&insert.expect_err("fenced")).map(|f| f.sqlstate), Some("42703".to_owned()));
    tx.rollback().await.expect("rollback");
    assert_eq!(populated::account_counters(db.pool()).await, accounts, "the debit leaked");
    assert_eq!(populated::account_counters(db.pool()).await, {
        let mut expected = populated::expected_accounts();
        // acct-c took fences 1-3 and gave back its units while preparing.
        expected[2].next_fence = 4;
        expected
    });
    assert_eq!(conservation_violations(db.pool()).await, Vec::<String>::new());

    retained.close().await.expect("close");
    fresh.close().await.expect("close");
    db.drop_now().await;
}

#[tokio::test]
async fn a_running_old_transaction_delays_0017_whose_columns_stay_invisible_until_it_commits() {
    let db = migrated_through(16).await;
    populated::populate(db.pool()).await;
    let observer = db.new_pool(4).await;
    let old_columns = columns(&observer, "tollgate_leases").await;
    let old_indexes = lease_index_columns(&observer).await;
    assert!(old_indexes.contains(&("tollgate_leases_active_expiry".to_owned(), vec![LEGACY_COLUMN.to_owned()])));
    assert!(old_columns.iter().any(|c| c == LEGACY_COLUMN));

    // An old acquire, half done: its debit and lease insert are in, its
    // transaction is open and holds the lease table.
    let mut old = PgConnection::connect_with(&db.connect_options()).await.expect("old connection");
    let old_pid = backend_pid(&mut old).await;
    let mut old_tx = old.begin().await.expect("begin");
    let fence: i64 =
        sqlx::query_scalar(ACQUIRE_DEBIT).bind("acct-a").bind(5_i64).fetch_one(&mut *old_tx).await.expect("old debit");
    let in_flight_true_ns: i128 = 1_700_000_000_000_000_500;
    let hash = legacy::capability_hash(&mut old_tx, "tgc_in_flight").await.expect("hash");
    sqlx::query(ACQUIRE_INSERT)
        .bind("in-flight")
        .bind("acct-a")
        .bind(fence)
        .bind(hash)
        .bind(5_i64)
        .bind(truncated_us(in_flight_true_ns))
        .execute(&mut *old_tx)
        .await
        .expect("old insert");

    let pool = db.pool().clone();
    let migration = tokio::spawn(async move { migrations::apply(&pool).await });

    // PostgreSQL shows the migration waiting for the table lock that the
    // old transaction holds, at its explicit LOCK TABLE.
    let wait = lock_wait_on(&observer, "tollgate_leases").await;
    let migration_pid = wait.pid;
    assert_eq!(wait.mode, "AccessExclusiveLock");
    assert_eq!(wait.wait_event_type.as_deref(), Some("Lock"));
    assert_eq!(wait.wait_event.as_deref(), Some("relation"));
    assert_eq!(wait.blocked_by, vec![old_pid]);
    assert!(wait.query.contains("LOCK TABLE tollgate_leases IN ACCESS EXCLUSIVE MODE"), "{}", wait.query);
    assert!(!migration.is_finished());
    assert_eq!(columns(&observer, "tollgate_leases").await, old_columns);

    // Hold the migration once more, after its changes and before its
    // commit: sqlx records the version inside the migration's transaction,
    // and a SHARE lock on the history table makes that insert wait.
    let mut gate = PgConnection::connect_with(&db.connect_options()).await.expect("gate connection");
    let gate_pid = backend_pid(&mut gate).await;
    let mut gate_tx = gate.begin().await.expect("begin");
    sqlx::query("LOCK TABLE _sqlx_migrations IN SHARE MODE").execute(&mut *gate_tx).await.expect("gate lock");

    // The old transaction completes in the old format.
    old_tx.commit().await.expect("the old acquire commits");

    let recording = lock_wait_on(&observer, "_sqlx_migrations").await;
    assert_eq!(recording.pid, migration_pid);
    assert_eq!(recording.mode, "RowExclusiveLock");
    assert_eq!(recording.blocked_by, vec![gate_pid]);
    assert!(
        granted_modes(&observer, migration_pid, "tollgate_leases").await.contains(&"AccessExclusiveLock".to_owned()),
        "the migration holds the lease table while it waits to record itself"
    );
    assert!(!migration.is_finished());

    // The migration has renamed, added, backfilled and re-indexed inside its
    // transaction; no other session can see any of it.
    assert_eq!(columns(&observer, "tollgate_leases").await, old_columns);
    for column in NEW_COLUMNS {
        assert!(!old_columns.iter().any(|c| c == column), "{column}");
    }
    assert_eq!(lease_index_columns(&observer).await, old_indexes);
    assert_eq!(applied_versions(&observer).await, (1..=16).collect::<Vec<i64>>());

    // An old statement arriving now queues behind the migration...
    let mut late = PgConnection::connect_with(&db.connect_options()).await.expect("late connection");
    let late_read = tokio::spawn(async move {
        let result = sqlx::query_scalar::<_, i64>("SELECT expires_at_us FROM tollgate_leases WHERE lease_id = 'a1'")
            .fetch_one(&mut late)
            .await;
        let _ = late.close().await;
        result
    });
    let queued = lock_wait_on(&observer, "tollgate_leases").await;
    assert_eq!(queued.mode, "AccessShareLock");
    assert_eq!(queued.blocked_by, vec![migration_pid]);

    gate_tx.commit().await.expect("release the gate");
    let applied = migration.await.expect("join").expect("0017 applies");
    assert_eq!(applied.iter().map(|m| m.version).collect::<Vec<_>>(), versions_from(17));

    // ...and meets the new schema once the migration commits.
    let late_error = late_read.await.expect("join").expect_err("fenced");
    assert_eq!(pg_failure(&late_error).map(|f| f.sqlstate), Some("42703".to_owned()));

    let new_columns = columns(&observer, "tollgate_leases").await;
    for column in NEW_COLUMNS {
        assert!(new_columns.iter().any(|c| c == column), "{column}");
    }
    assert!(!new_columns.iter().any(|c| c == LEGACY_COLUMN));
    assert!(lease_index_columns(&observer).await.contains(&(
        "tollgate_leases_active_expiry".to_owned(),
        vec!["expiry_floor_us".to_owned(), "expiry_submicro_ns".to_owned()]
    )));

    // The lease the old transaction committed was backfilled like the rest.
    let in_flight: (i64, i16, bool) = sqlx::query_as(
        "SELECT expiry_floor_us, expiry_submicro_ns, expiry_is_upper_bound \
         FROM tollgate_leases WHERE lease_id = 'in-flight'",
    )
    .fetch_one(&observer)
    .await
    .expect("in-flight lease");
    let (_, latest) = consistent_instants(truncated_us(in_flight_true_ns));
    assert_eq!(i128::from(in_flight.0) * NS_PER_US + i128::from(in_flight.1), latest);
    assert!(in_flight.2);
    assert_eq!(conservation_violations(&observer).await, Vec::<String>::new());

    old.close().await.expect("close");
    gate.close().await.expect("close");
    observer.close().await;
    db.drop_now().await;
}

/// Legacy expiries outside the timestamp domain, which no valid writer could
/// store but a legacy one did not check.
const OUT_OF_DOMAIN_US: [(&str, i64); 4] = [
    ("one microsecond past Timestamp::MAX", 253_402_207_201_000_000),
    ("one microsecond before Timestamp::MIN", -377_705_023_201_000_001),
    ("i64::MAX", i64::MAX),
    ("i64::MIN", i64::MIN),
];

/// The operator's read-only inspection of legacy expiries before 0017.
const OUT_OF_DOMAIN_INSPECTION: &str = "SELECT lease_id, account_id, state, expires_at_us \
     FROM tollgate_leases \
     WHERE expires_at_us NOT BETWEEN -377705023201000000 AND 253402207200999999";

#[tokio::test]
async fn an_out_of_domain_legacy_expiry_fails_0017_and_leaves_0016_authoritative() {
    for (name, expires_at_us) in OUT_OF_DOMAIN_US {
        let db = migrated_through(16).await;
        populated::populate(db.pool()).await;
        let writer = LegacyWriter { grace_us: GRACE_US };
        let mut conn = db.pool().acquire().await.expect("connection");
        writer.acquire(&mut conn, "acct-c", "far", "tgc_far", 1, expires_at_us).await.expect(name);
        drop(conn);

        let found: Vec<(String, String, String, i64)> =
            sqlx::query_as(OUT_OF_DOMAIN_INSPECTION).fetch_all(db.pool()).await.expect("inspection");
        assert_eq!(found, vec![("far".to_owned(), "acct-c".to_owned(), "active".to_owned(), expires_at_us)], "{name}");

        let lease_columns = columns(db.pool(), "tollgate_leases").await;
        let lease_constraints = constraints(db.pool(), "tollgate_leases").await;
        let indexes = lease_indexes(db.pool()).await;
        let history = migration_history(db.pool()).await;
        let rows = exact_rows(db.pool()).await;

        let error = db.migrate().await.expect_err(name);
        let (version, failure) = failed_migration(&error);
        assert_eq!(version, 17, "{name}");
        assert_eq!(failure.sqlstate, "23514", "{name}");
        assert_eq!(failure.constraint.as_deref(), Some("tollgate_leases_expiry_floor_in_domain"), "{name}");

        // Schema, data and history are exactly as 0016 left them: the
        // rename, new columns, backfill, constraints and index are all gone,
        // and every row, the offending one included, is untouched.
        assert_eq!(columns(db.pool(), "tollgate_leases").await, lease_columns, "{name}");
        assert!(lease_columns.iter().any(|c| c == LEGACY_COLUMN), "{name}");
        assert_eq!(constraints(db.pool(), "tollgate_leases").await, lease_constraints, "{name}");
        assert_eq!(lease_indexes(db.pool()).await, indexes, "{name}");
        assert_eq!(migration_history(db.pool()).await, history, "{name}");
        assert_eq!(applied_versions(db.pool()).await, (1..=16).collect::<Vec<i64>>(), "{name}");
        assert_eq!(exact_rows(db.pool()).await, rows, "{name}");

        // 0016 is authoritative: a rollback build that ends at 0016 starts,
        // and the old writer still serves its leases.
        let rollback_build = migrations::apply_with(&migrations::migrator_through(16), db.pool()).await.expect(name);
        assert_eq!(rollback_build, vec![], "{name}");
        let mut conn = db.pool().acquire().await.expect("connection");
        writer.release(&mut conn, "a1", "tgc_legacy_a1", NOW_US).await.expect(name);
        drop(conn);
        assert_eq!(conservation_violations(db.pool()).await, Vec::<String>::new(), "{name}");
        db.drop_now().await;
    }
}

#[tokio::test]
async fn a_catalogue_ending_at_0016_refuses_to_start_after_0017() {
    for case in [
        CatalogueCase { applied_through: 17, catalogue_through: 16, expect: Startup::Refused { unknown_version: 17 } },
        CatalogueCase { applied_through: 17, catalogue_through: 14, expect: Startup::Refused { unknown_version: 15 } },
        CatalogueCase { applied_through: 17, catalogue_through: 17, expect: Startup::Starts },
    ] {
        check_old_catalogue(case).await;
    }
}

/// Everything a store reports about its data, for comparison across restarts.
async fn store_view(store: &PostgresStore, lease_ids: &[(String, String)]) -> Vec<String> {
    let mut view = Vec::new();
    for account_id in ["acct-a", "acct-b", "acct-c"] {
        view.push(format!("{:?}", store.account(account_id).await.expect("account")));
    }
    for (account_id, lease_id) in lease_ids {
        view.push(format!("{:?}", store.lease(account_id, lease_id).await.expect("lease")));
    }
    for (account_id, credential_id) in [("acct-a", "cred-a"), ("acct-b", "cred-b"), ("acct-c", "cred-c")] {
        view.push(format!("{:?}", store.credential(account_id, credential_id).await.expect("credential")));
    }
    view
}

fn bound_counts(store_counts: &[LegacyBoundCount]) -> Vec<(LeaseState, bool, u64)> {
    store_counts.iter().map(|c| (c.state, c.expiry_is_upper_bound, c.count)).collect()
}

#[tokio::test]
async fn a_restart_after_the_upgrade_keeps_every_balance_lease_event_and_marker() {
    let db = migrated_through(16).await;
    populated::populate(db.pool()).await;
    assert_eq!(conservation_violations(db.pool()).await, Vec::<String>::new());
    let before_upgrade = rows_without_lease_expiry(db.pool()).await;

    // The upgrade is a real startup, on its own pool.
    let config = PgStoreConfig::default();
    let store = PostgresStore::connect_with(db.url(), policy(), config.clone()).await.expect("startup applies 0017");
    let applied: Vec<i64> = store.applied_migrations().iter().map(|m| m.version).collect();
    assert_eq!(applied, versions_from(17));
    store.pin_reclaim_grace(false).await.expect("the legacy fleet's recorded grace is this one");
    assert_eq!(rows_without_lease_expiry(db.pool()).await, before_upgrade);

    // Traffic after the upgrade: a new exact grant and accepted usage.
    let now = Timestamp::from_microsecond(NOW_US).expect("now");
    let issued = store.acquire("acct-c", 2, SignedDuration::from_nanos(1_500), now).await.expect("acquire");
    assert_eq!(issued.lease.expiry, now + SignedDuration::from_nanos(1_500));
    let outcomes = store
        .ingest(
            vec![tollgate_core::UsageEvent {
                request_id: "r-after".into(),
                account_id: "acct-c".into(),
                credential_id: "cred-c".into(),
                units: 1,
                occurred_at: now,
                lease_id: None,
                fencing_token: None,
                dimensions: Default::default(),
            }],
            now,
        )
        .await;
    let outcomes = outcomes.expect("ingest");
    assert_eq!(outcomes.iter().map(|o| o.outcome).collect::<Vec<_>>(), vec![Outcome::Accepted]);

    let report = store.check().await.expect("check");
    assert_eq!(report.violations, vec![]);
    let counts = bound_counts(&report.legacy_bounds);
    assert_eq!(
        counts,
        vec![
            (LeaseState::Active, false, 1),
            (LeaseState::Active, true, 4),
            (LeaseState::Released, true, 1),
            (LeaseState::Reclaimed, true, 1),
            (LeaseState::Consolidated, true, 2),
        ]
    );
    let mut lease_ids: Vec<(String, String)> =
        sqlx::query_as("SELECT account_id, lease_id FROM tollgate_leases ORDER BY lease_id")
            .fetch_all(db.pool())
            .await
            .expect("lease ids");
    lease_ids.sort();
    let view = store_view(&store, &lease_ids).await;
    let rows = exact_rows(db.pool()).await;

    // Close every pool, and see that no session of this database is left.
    store.pool().close().await;
    drop(store);
    db.pool().close().await;
    let mut watcher = PgConnection::connect_with(&db.connect_options()).await.expect("watcher");
    let mut others = i64::MAX;
    for _ in 0..6_000 {
        others = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        .fetch_one(&mut watcher)
        .await
        .expect("pg_stat_activity");
        if others == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(others, 0, "a session outlived its pool");
    watcher.close().await.expect("close");

    // A cold start finds everything as it was, with nothing to migrate.
    let store = PostgresStore::connect_with(db.url(), policy(), config).await.expect("restart");
    store.pin_reclaim_grace(false).await.expect("same grace");
    assert!(store.applied_migrations().is_empty());
    assert_eq!(exact_rows(store.pool()).await, rows, "a row changed across the restart");
    assert_eq!(store_view(&store, &lease_ids).await, view);
    let report = store.check().await.expect("check after restart");
    assert_eq!(report.violations, vec![]);
    assert_eq!(bound_counts(&report.legacy_bounds), counts);
    assert_eq!(conservation_violations(store.pool()).await, Vec::<String>::new());
    store.pool().close().await;
    drop(store);
    db.drop_now().await;
}
