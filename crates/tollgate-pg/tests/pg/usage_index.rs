//! The usage read side's statements use the index migration 0021 created
//! (and the totals the hourly totals' key, migration 0025), shown by the
//! plan PostgreSQL chooses, not by timing.

use serde_json::Value;
use sqlx::{Connection, PgConnection, Row};
use tollgate_pg::testing::{TestDb, store_statements};

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

fn index_names(plan: &Value, out: &mut Vec<String>) {
    if let Some(name) = plan["Index Name"].as_str() {
        out.push(name.to_owned());
    }
    for child in plan["Plans"].as_array().into_iter().flatten() {
        index_names(child, out);
    }
}

#[tokio::test]
async fn usage_statements_scan_the_occurred_at_index() {
    let db = TestDb::create_migrated().await;
    sqlx::raw_sql(POPULATE).execute(db.pool()).await.expect("populate");
    let mut conn = PgConnection::connect_with(&db.connect_options()).await.expect("connection");
    sqlx::raw_sql("SET plan_cache_mode = force_generic_plan").execute(&mut conn).await.expect("generic plans");
    let statements: std::collections::BTreeMap<&str, &str> = store_statements().iter().copied().collect();
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
        let prepare = format!("PREPARE s{i} (text, {types}) AS {}", statements[name]);
        sqlx::raw_sql(sqlx::AssertSqlSafe(prepare)).execute(&mut conn).await.expect("prepare");
        let explain = format!("EXPLAIN (FORMAT JSON) EXECUTE s{i} ('acct-7', {values})");
        let row = sqlx::raw_sql(sqlx::AssertSqlSafe(explain)).fetch_one(&mut conn).await.expect("explain");
        let text = row.try_get_raw(0).expect("plan").as_str().expect("plan text").to_owned();
        let json: Value = serde_json::from_str(&text).expect("plan JSON");
        let mut indexes = Vec::new();
        index_names(&json[0]["Plan"], &mut indexes);
        let expected: &[&str] = match name {
            "USAGE_TOTALS_SQL" => {
                &["tollgate_usage_events_occurred", "tollgate_usage_events_occurred", "tollgate_usage_hourly_pkey"]
            }
            _ => &["tollgate_usage_events_occurred"],
        };
        assert_eq!(indexes, expected, "{name}: {text}");
    }
    drop(conn);
    db.drop_now().await;
}

fn relation_names(plan: &Value, out: &mut Vec<String>) {
    if let Some(name) = plan["Relation Name"].as_str() {
        out.push(name.to_owned());
    }
    for child in plan["Plans"].as_array().into_iter().flatten() {
        relation_names(child, out);
    }
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
    let db = TestDb::create_migrated().await;
    sqlx::raw_sql(POPULATE).execute(db.pool()).await.expect("populate");
    let mut conn = PgConnection::connect_with(&db.connect_options()).await.expect("connection");
    let statements: std::collections::BTreeMap<&str, &str> = store_statements().iter().copied().collect();
    let types = "text, int8, int2, int8, int2, int8, int2, int8, int2, int8, text, text, int8, int8";
    let day = "('acct-7', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 3600000000, 'dimension', 'model', 0, 24)";
    for (name, mode) in [("USAGE_HOURS_SQL", "force_generic_plan"), ("USAGE_TOTALS_SQL", "force_custom_plan")] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("SET plan_cache_mode = {mode}")))
            .execute(&mut conn)
            .await
            .expect("plan mode");
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("PREPARE {name} ({types}) AS {}", statements[name])))
            .execute(&mut conn)
            .await
            .expect("prepare");
        let json = explain(&mut conn, &format!("EXPLAIN (FORMAT JSON) EXECUTE {name} {day}")).await;
        let mut relations = Vec::new();
        relation_names(&json[0]["Plan"], &mut relations);
        assert_eq!(relations, ["tollgate_usage_hourly"], "{name}: {json}");
        let mut indexes = Vec::new();
        index_names(&json[0]["Plan"], &mut indexes);
        assert_eq!(indexes, ["tollgate_usage_hourly_pkey"], "{name}: {json}");
        assert!(!json.to_string().contains("Gather"), "{name}: a parallel plan: {json}");
    }
    drop(conn);
    db.drop_now().await;
}

async fn explain(conn: &mut PgConnection, sql: &str) -> Value {
    let row = sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned())).fetch_one(conn).await.expect("explain");
    let text = row.try_get_raw(0).expect("plan").as_str().expect("plan text").to_owned();
    serde_json::from_str(&text).expect("plan JSON")
}
