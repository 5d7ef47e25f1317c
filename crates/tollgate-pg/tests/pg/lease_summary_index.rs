//! The fleet's lease summary reads active leases only, through the partial
//! indexes over them, however many settled leases the table holds: shown by
//! the plan PostgreSQL chooses, not by timing.

use serde_json::Value;
use sqlx::{Connection, PgConnection, Row};
use tollgate_pg::testing::{TestDb, store_statements};

/// Forty accounts of five hundred settled leases and two active ones each,
/// so that a sequential scan is plainly the worse plan for the active ones.
const POPULATE: &str = "
    INSERT INTO tollgate_accounts (account_id, credited, available, reserved, next_fence)
        SELECT 'acct-' || i, 1000, 998, 2, 503 FROM generate_series(0, 39) i;
    INSERT INTO tollgate_leases (lease_id, account_id, fencing_token, capability_hash, granted, used,
        state, expiry_floor_us, expiry_submicro_ns, expiry_is_upper_bound)
        SELECT 'lease-' || i || '-' || n, 'acct-' || i, n + 1, '\\x00', 1,
            CASE WHEN n < 500 THEN 1 ELSE 0 END,
            CASE WHEN n < 500 THEN 'released' ELSE 'active' END,
            n::int8 * 1000000, 0, false
        FROM generate_series(0, 39) i, generate_series(0, 501) n;
    ANALYZE;
";

/// The active leases' partial indexes (migrations 0017 and 0023).
const ACTIVE_INDEXES: [&str; 2] = ["tollgate_leases_active_expiry", "tollgate_leases_active_account_expiry"];

/// Every plan node's type and the index it scans, if any.
fn nodes(plan: &Value, out: &mut Vec<(String, Option<String>)>) {
    let node_type = plan["Node Type"].as_str().unwrap_or_default().to_owned();
    out.push((node_type, plan["Index Name"].as_str().map(str::to_owned)));
    for child in plan["Plans"].as_array().into_iter().flatten() {
        nodes(child, out);
    }
}

#[tokio::test]
async fn the_lease_summary_scans_only_the_active_lease_indexes() {
    let db = TestDb::create_migrated().await;
    sqlx::raw_sql(POPULATE).execute(db.pool()).await.expect("populate");
    let mut conn = PgConnection::connect_with(&db.connect_options()).await.expect("connection");
    sqlx::raw_sql("SET plan_cache_mode = force_generic_plan").execute(&mut conn).await.expect("generic plans");
    let statements: std::collections::BTreeMap<&str, &str> = store_statements().iter().copied().collect();
    let prepare = format!("PREPARE summary (int8, int2) AS {}", statements["LEASE_SUMMARY_SQL"]);
    sqlx::raw_sql(sqlx::AssertSqlSafe(prepare)).execute(&mut conn).await.expect("prepare");
    let row = sqlx::raw_sql("EXPLAIN (FORMAT JSON) EXECUTE summary (500500000, 0)")
        .fetch_one(&mut conn)
        .await
        .expect("explain");
    let text = row.try_get_raw(0).expect("plan").as_str().expect("plan text").to_owned();
    let json: Value = serde_json::from_str(&text).expect("plan JSON");
    let mut scanned = Vec::new();
    nodes(&json[0]["Plan"], &mut scanned);
    assert!(scanned.iter().all(|(node_type, _)| node_type != "Seq Scan"), "{text}");
    let indexes: Vec<&str> = scanned.iter().filter_map(|(_, index)| index.as_deref()).collect();
    assert_eq!(indexes.len(), 2, "one index scan for the counts, one for the most overdue: {text}");
    assert!(indexes.iter().all(|index| ACTIVE_INDEXES.contains(index)), "{text}");

    // What the plan reads is what the store answers: 80 active, of which
    // the 40 expiring at 500 s are due at a cutoff of 500.5 s.
    let answer: (i64, i64, Option<i64>, Option<i16>) =
        sqlx::query_as(sqlx::AssertSqlSafe(statements["LEASE_SUMMARY_SQL"]))
            .bind(Some(500_500_000_i64))
            .bind(Some(0_i16))
            .fetch_one(&mut conn)
            .await
            .expect("summary");
    assert_eq!(answer, (80, 40, Some(500_000_000), Some(0)));
    drop(conn);
    db.drop_now().await;
}
