//! The fleet's lease summary reads active leases only, through the partial
//! indexes over them, however many settled leases the table holds: shown by
//! the plan PostgreSQL chooses, not by timing.

use crate::plans::{Planner, plan_field, plan_nodes};

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

#[tokio::test]
async fn the_lease_summary_scans_only_the_active_lease_indexes() {
    let mut planner = Planner::start(POPULATE).await;
    planner.plan_cache_mode("force_generic_plan").await;
    let json = planner.explain("summary", "LEASE_SUMMARY_SQL", "int8, int2", "500500000, 0").await;
    assert!(plan_nodes(&json).iter().all(|node| node["Node Type"] != "Seq Scan"), "{json}");
    let indexes = plan_field(&json, "Index Name");
    assert_eq!(indexes.len(), 2, "one index scan for the counts, one for the most overdue: {json}");
    assert!(indexes.iter().all(|index| ACTIVE_INDEXES.contains(index)), "{json}");

    // What the plan reads is what the store answers: 80 active, of which
    // the 40 expiring at 500 s are due at a cutoff of 500.5 s.
    let answer: (i64, i64, Option<i64>, Option<i16>) =
        sqlx::query_as(sqlx::AssertSqlSafe(planner.statements["LEASE_SUMMARY_SQL"]))
            .bind(Some(500_500_000_i64))
            .bind(Some(0_i16))
            .fetch_one(&mut planner.conn)
            .await
            .expect("summary");
    assert_eq!(answer, (80, 40, Some(500_000_000), Some(0)));
    planner.finish().await;
}
