//! The usage read side's statements use the index migration 0021 created
//! (and the totals the hourly totals' key, migration 0025), shown by the
//! plan PostgreSQL chooses, not by timing.

use crate::plans::{Planner, plan_field};

/// Forty accounts of five hundred events each, spread over a day, so that a
/// sequential scan is plainly the worse plan for one account's hour.
const POPULATE: &str = "
    INSERT INTO tollgate_accounts (account_id, credited, available, reserved, next_fence)
        SELECT 'acct-' || i, 0, 0, 0, 1 FROM generate_series(0, 39) i;
    INSERT INTO tollgate_credentials (credential_id, account_id, label, key_hash,
        created_floor_us, created_submicro_ns)
        SELECT 'cred-' || i, 'acct-' || i, 'gateway', decode(lpad(to_hex(i), 4, '0'), 'hex'), 0, 0
        FROM generate_series(0, 39) i;
    INSERT INTO tollgate_usage_events (account_id, request_id, credential_id, units,
        occurred_at_floor_us, occurred_at_submicro_ns, dimensions)
        SELECT 'acct-' || i, 'r-' || n, 'cred-' || i, 1, n::int8 * 172800000, 0, '{\"model\": \"m\"}'
        FROM generate_series(0, 39) i, generate_series(0, 499) n;
    ANALYZE;
";

#[tokio::test]
async fn usage_statements_scan_the_occurred_at_index() {
    let mut planner = Planner::start(POPULATE).await;
    planner.plan_cache_mode("force_generic_plan").await;
    // One account's day by hour and dimension, its first half hour and last
    // one from the events and the hours between from the hourly totals;
    // then its pages.
    let cases = [
        (
            "USAGE_TOTALS_SQL",
            "int8, int2, int8, int2, int8, int2, int8, int2, int8, text, text, int8, int8",
            "0, 0, 1800000000, 0, 84600000000, 0, 86400000000, 0, 3600000000, 'dimension', 'model', 1, 23",
        ),
        ("USAGE_EVENTS_FIRST_SQL", "int8, int2, int8, int2, int8", "0, 0, 3600000000, 0, 101"),
        (
            "USAGE_EVENTS_AFTER_SQL",
            "int8, int2, int8, int2, int8, int2, text, int8",
            "0, 0, 3600000000, 0, 0, 0, 'r-0', 101",
        ),
    ];
    for (i, (name, types, values)) in cases.into_iter().enumerate() {
        let (types, values) = (format!("text, {types}"), format!("'acct-7', {values}"));
        let json = planner.explain(&format!("s{i}"), name, &types, &values).await;
        let indexes = plan_field(&json, "Index Name");
        let expected: &[&str] = match name {
            "USAGE_TOTALS_SQL" => {
                &["tollgate_usage_events_occurred", "tollgate_usage_events_occurred", "tollgate_usage_hourly_pkey"]
            }
            _ => &["tollgate_usage_events_occurred"],
        };
        assert_eq!(indexes, expected, "{name}: {json}");
    }
    planner.finish().await;
}

/// A query of whole hours has no partial hour at either end, and the store
/// sends `USAGE_HOURS_SQL`, the hourly totals alone, as the pool's
/// connections plan it, generically: its plan reads `tollgate_usage_hourly`
/// through its key and nothing else, serially. `USAGE_TOTALS_SQL`, planned
/// generically, could not know that its event parts are empty, and was
/// planned as parallel reads of the events, whose start-up was most of a
/// console page's query. (And planned for its values, with its event parts'
/// bounds NULL, `USAGE_TOTALS_SQL` also reads no event.)
#[tokio::test]
async fn usage_totals_of_whole_hours_read_no_event() {
    let mut planner = Planner::start(POPULATE).await;
    let types = "text, int8, int2, int8, int2, int8, int2, int8, int2, int8, text, text, int8, int8";
    let day = "'acct-7', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 3600000000, 'dimension', 'model', 0, 24";
    for (name, mode) in [("USAGE_HOURS_SQL", "force_generic_plan"), ("USAGE_TOTALS_SQL", "force_custom_plan")] {
        planner.plan_cache_mode(mode).await;
        let json = planner.explain(name, name, types, day).await;
        assert_eq!(plan_field(&json, "Relation Name"), ["tollgate_usage_hourly"], "{name}: {json}");
        assert_eq!(plan_field(&json, "Index Name"), ["tollgate_usage_hourly_pkey"], "{name}: {json}");
        assert!(!json.to_string().contains("Gather"), "{name}: a parallel plan: {json}");
    }
    planner.finish().await;
}
