//! The 0025 upgrade's promise: the hourly usage totals start as the events
//! already accepted say, and stay so whoever inserts events afterwards (a
//! server older than 0025 still running during a rollout inserts them
//! without knowing of the totals); a usage query over whole hours answers
//! as the events do. And `check` names each hour whose totals were altered.

use jiff::{SignedDuration, Timestamp};
use tollgate_core::GrantPolicy;
use tollgate_core::query::{GroupBy, Range, UsageQuery, Window};
use tollgate_pg::PostgresStore;
use tollgate_pg::testing::TestDb;
use tollgate_store::Store;

use crate::fixtures::migrated_through_holding;

const HOUR_US: i64 = 3_600_000_000;

/// Two accounts and their events as a 0024-era server stored them: across
/// hours before and after 1970, with and without a lease and dimensions,
/// several in one hour of one credential.
const POPULATE: &str = "
    INSERT INTO tollgate_accounts (account_id, credited, available, reserved, next_fence)
        VALUES ('acct-a', 0, 0, 0, 1), ('acct-b', 0, 0, 0, 1);
    INSERT INTO tollgate_usage_events (account_id, request_id, credential_id, units,
        occurred_at_floor_us, occurred_at_submicro_ns, lease_id, fencing_token, dimensions)
    VALUES ('acct-a', 'r-1', 'cred-1', 1, -1, 999, NULL, NULL, NULL),
           ('acct-a', 'r-2', 'cred-1', 2, 0, 0, 'lease-1', 1, '{\"model\": \"x\"}'),
           ('acct-a', 'r-3', 'cred-1', 4, 3599999999, 5, 'lease-1', 1, '{\"model\": \"x\"}'),
           ('acct-a', 'r-4', 'cred-2', 8, 1800000000, 0, NULL, NULL, '{\"model\": \"y\"}'),
           ('acct-a', 'r-5', 'cred-1', 16, 3600000000, 0, NULL, NULL, NULL),
           ('acct-b', 'r-1', 'cred-b', 32, 0, 0, NULL, NULL, NULL);
";

/// An event inserted as a 0024-era server's ingestion writes it.
const OLD_SERVER_INSERT: &str = "
    INSERT INTO tollgate_usage_events (account_id, request_id, credential_id, units,
        occurred_at_floor_us, occurred_at_submicro_ns, lease_id, fencing_token, dimensions)
    SELECT u.account_id, u.request_id, u.credential_id, u.units, u.occurred_at_floor_us,
        u.occurred_at_submicro_ns, u.lease_id, u.fencing_token, u.dimensions::jsonb
    FROM unnest($1::text[], $2::text[], $3::text[], $4::int8[], $5::int8[], $6::int2[],
                $7::text[], $8::int8[], $9::text[])
        AS u(account_id, request_id, credential_id, units, occurred_at_floor_us,
             occurred_at_submicro_ns, lease_id, fencing_token, dimensions)";

fn policy() -> GrantPolicy {
    GrantPolicy::new(SignedDuration::from_secs(3600), SignedDuration::ZERO, 100).expect("valid policy")
}

fn at_us(us: i64) -> Timestamp {
    Timestamp::from_microsecond(us).expect("instant")
}

/// `(bucket start µs, [(group key, units, events)])` of a whole-range or
/// hourly query.
async fn usage(
    store: &PostgresStore,
    from_us: i64,
    to_us: i64,
    window: Option<Window>,
    group_by: GroupBy,
) -> Vec<(i64, Vec<(Option<String>, u128, u128)>)> {
    let query =
        UsageQuery::new(Range::new(at_us(from_us), at_us(to_us)).expect("range"), window, group_by).expect("query");
    let report = store.usage("acct-a", &query).await.expect("usage");
    report
        .buckets
        .iter()
        .map(|b| {
            let groups = b.groups.iter().map(|g| (g.key.clone(), g.totals.units, g.totals.events)).collect();
            (b.start.as_microsecond(), groups)
        })
        .collect()
}

fn group(key: Option<&str>, units: u128, events: u128) -> (Option<String>, u128, u128) {
    (key.map(str::to_owned), units, events)
}

async fn hourly_rows(db: &TestDb) -> Vec<(String, i64, String, bool, String, String, i64)> {
    sqlx::query_as(
        "SELECT account_id, hour, credential_id, leased, dimensions::text, units::text, events \
         FROM tollgate_usage_hourly ORDER BY account_id, hour, credential_id, leased, dimensions::text",
    )
    .fetch_all(db.pool())
    .await
    .expect("hourly totals")
}

#[tokio::test]
async fn the_upgrade_totals_existing_events_and_an_old_servers_inserts_keep_them_exact() {
    let db = migrated_through_holding(24, POPULATE, "populate").await;
    let store = PostgresStore::connect(db.url(), policy()).await.expect("startup applies 0025");

    let row = |account: &str, hour: i64, credential: &str, leased: bool, dimensions: &str, units: &str, events| {
        (account.to_owned(), hour, credential.to_owned(), leased, dimensions.to_owned(), units.to_owned(), events)
    };
    let mut expected = vec![
        row("acct-a", -1, "cred-1", false, "{}", "1", 1),
        row("acct-a", 0, "cred-1", true, r#"{"model": "x"}"#, "6", 2),
        row("acct-a", 0, "cred-2", false, r#"{"model": "y"}"#, "8", 1),
        row("acct-a", 1, "cred-1", false, "{}", "16", 1),
        row("acct-b", 0, "cred-b", false, "{}", "32", 1),
    ];
    assert_eq!(hourly_rows(&db).await, expected);
    let report = store.check().await.expect("check");
    assert!(report.is_clean(), "{report:?}");

    // A whole-hours query reads the totals and answers as the events do.
    let hours = usage(&store, -HOUR_US, 2 * HOUR_US, Some(Window::Hour), GroupBy::Funding).await;
    assert_eq!(
        hours,
        vec![
            (-HOUR_US, vec![group(Some("overage"), 1, 1)]),
            (0, vec![group(Some("leased"), 6, 2), group(Some("overage"), 8, 1)]),
            (HOUR_US, vec![group(Some("overage"), 16, 1)]),
        ]
    );

    // An old server's insert, after the upgrade, adds to the totals too.
    sqlx::query(OLD_SERVER_INSERT)
        .bind(vec!["acct-a", "acct-a"])
        .bind(vec!["r-6", "r-7"])
        .bind(vec!["cred-1", "cred-1"])
        .bind(vec![64i64, 128])
        .bind(vec![10i64, HOUR_US + 10])
        .bind(vec![0i16, 0])
        .bind(vec![Some("lease-1"), None])
        .bind(vec![Some(1i64), None])
        .bind(vec![Some(r#"{"model": "x"}"#), None])
        .execute(db.pool())
        .await
        .expect("an old server's insert");
    expected[1] = row("acct-a", 0, "cred-1", true, r#"{"model": "x"}"#, "70", 3);
    expected[3] = row("acct-a", 1, "cred-1", false, "{}", "144", 2);
    assert_eq!(hourly_rows(&db).await, expected);
    let report = store.check().await.expect("check");
    assert!(report.is_clean(), "{report:?}");
    let models = usage(&store, 0, 2 * HOUR_US, None, GroupBy::Dimension("model".into())).await;
    assert_eq!(models, vec![(0, vec![group(None, 144, 2), group(Some("x"), 70, 3), group(Some("y"), 8, 1)])]);
    db.drop_now().await;
}

#[tokio::test]
async fn check_names_each_hour_whose_totals_differ_from_its_events() {
    let db = migrated_through_holding(24, POPULATE, "populate").await;
    let store = PostgresStore::connect(db.url(), policy()).await.expect("startup applies 0025");
    sqlx::raw_sql(
        "UPDATE tollgate_usage_hourly SET units = units + 1 WHERE account_id = 'acct-a' AND hour = 0 AND leased;
         DELETE FROM tollgate_usage_hourly WHERE account_id = 'acct-a' AND hour = 1;",
    )
    .execute(db.pool())
    .await
    .expect("alter the totals");

    let report = store.check().await.expect("check");
    assert!(!report.is_clean());
    assert!(report.violations.is_empty() && report.guard_violations.is_empty(), "{report:?}");
    let found: Vec<String> = report
        .usage_totals_mismatches
        .iter()
        .map(|m| format!("{} {} {} {} {:?} {:?}", m.account_id, m.hour, m.credential_id, m.funding, m.kept, m.counted))
        .collect();
    assert_eq!(found, ["acct-a 0 cred-1 leased (7, 2) (6, 2)", "acct-a 1 cred-1 overage (0, 0) (16, 1)"]);
    db.drop_now().await;
}
