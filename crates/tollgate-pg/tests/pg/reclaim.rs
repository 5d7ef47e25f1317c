//! The reclaim pass in one statement (`RECLAIM_DUE_SQL`, `store/reclaim.rs`)
//! against the core: on accounts and leases anywhere in `BIGINT`, it settles
//! exactly what `ledger::reclaim` settles, with the core's settlements and
//! journal entries, and a pass it cannot decide as the core would (a row that
//! does not decode, a counter PostgreSQL refuses) is left whole to the core.

use std::sync::atomic::{AtomicUsize, Ordering};

use jiff::{SignedDuration, Timestamp};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use tollgate_core::ledger::{self, LeaseState};
use tollgate_core::{Account, COUNTERS, EntryKind, GrantPolicy, Lease, PageLimit, UnitDomain};
use tollgate_pg::PostgresStore;
use tollgate_pg::testing::TestDb;
use tollgate_store::Store;

const T0: i128 = 1_700_000_000_123_456_789;
const HOUR_NS: i128 = 3_600_000_000_000;
const I64_MAX: u64 = i64::MAX as u64;

fn ts(ns: i128) -> Timestamp {
    Timestamp::from_nanosecond(ns).expect("instant in the domain")
}

fn policy() -> GrantPolicy {
    GrantPolicy::new(SignedDuration::from_secs(3_600), SignedDuration::ZERO, 100).expect("valid policy")
}

/// An account's counters before the pass and its due leases' `(granted,
/// used)`.
#[derive(Debug, Clone)]
struct AccountCase {
    counters: [u64; COUNTERS],
    leases: Vec<(u64, u64)>,
}

/// A value near either end of `BIGINT`'s nonnegative range, or anywhere in it.
fn units() -> impl Strategy<Value = u64> {
    prop_oneof![0u64..50, (I64_MAX - 50)..=I64_MAX, 0..=I64_MAX]
}

/// Accounts whose `reserved` covers their leases' grants, or falls short of
/// them by a little (which the core refuses as corrupt), and whose other
/// counters may sit anywhere, near `BIGINT`'s top included.
fn account_case() -> impl Strategy<Value = AccountCase> {
    (proptest::array::uniform7(units()), proptest::collection::vec((units(), units()), 1..5), -2i64..3).prop_map(
        |(mut counters, leases, slack)| {
            let granted: u128 = leases.iter().map(|&(g, _)| u128::from(g)).sum();
            let reserved = i128::try_from(granted).unwrap_or(i128::MAX).saturating_add(i128::from(slack));
            counters[2] = u64::try_from(reserved.clamp(0, i128::from(I64_MAX))).unwrap_or(I64_MAX);
            counters[6] = counters[6].max(1);
            AccountCase { counters, leases }
        },
    )
}

/// What the core makes of one account's due leases, taken in `lease_id`
/// order as the pass's fallback takes them: the account after, and each
/// lease's settlement or the reason it was skipped.
fn core_pass(
    account: &Account,
    leases: &[Lease],
    now: Timestamp,
) -> (Account, Vec<Result<ledger::Settlement, String>>) {
    let mut account = account.clone();
    let outcomes = leases
        .iter()
        .map(|lease| {
            let mut lease = lease.clone();
            match ledger::reclaim(&mut account, &mut lease, now, &policy(), UnitDomain::I64) {
                Ok(Some(settlement)) => Ok(settlement),
                Ok(None) => Err("not due".to_owned()),
                Err(error) => Err(error.to_string()),
            }
        })
        .collect();
    (account, outcomes)
}

async fn insert_case(s: &PostgresStore, tag: &str, cases: &[AccountCase]) -> Vec<(Account, Vec<Lease>)> {
    let mut accounts = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let account = Account::with_counters(format!("{tag}-a{i}"), case.counters);
        let values: Vec<i64> = case.counters.iter().map(|&c| i64::try_from(c).expect("in BIGINT")).collect();
        sqlx::query(
            "INSERT INTO tollgate_accounts \
             (account_id, credited, available, reserved, consumed, overage, billed, next_fence) \
             VALUES ($1, $2[1], $2[2], $2[3], $2[4], $2[5], $2[6], $2[7])",
        )
        .bind(&account.account_id)
        .bind(&values)
        .execute(s.pool())
        .await
        .expect("account row");
        let mut leases = Vec::new();
        for (j, &(granted, used)) in case.leases.iter().enumerate() {
            let lease = Lease {
                lease_id: format!("{tag}-a{i}-l{j}"),
                account_id: account.account_id.clone(),
                fencing_token: 1 + j as u64,
                granted,
                used,
                state: LeaseState::Active,
                expiry: ts(T0 - HOUR_NS),
                expiry_is_upper_bound: false,
            };
            sqlx::query(
                "INSERT INTO tollgate_leases (lease_id, account_id, fencing_token, capability_hash, granted, used, \
                 state, expiry_floor_us, expiry_submicro_ns, expiry_is_upper_bound) \
                 VALUES ($1, $2, $3, sha256(convert_to($1, 'UTF8')), $4, $5, 'active', $6, 789, false)",
            )
            .bind(&lease.lease_id)
            .bind(&lease.account_id)
            .bind(i64::try_from(lease.fencing_token).expect("small"))
            .bind(i64::try_from(granted).expect("in BIGINT"))
            .bind(i64::try_from(used).expect("in BIGINT"))
            .bind(i64::try_from((T0 - HOUR_NS).div_euclid(1000)).expect("in BIGINT"))
            .execute(s.pool())
            .await
            .expect("lease row");
            leases.push(lease);
        }
        accounts.push((account, leases));
    }
    accounts
}

/// Empties the tables a case writes, so that a case (or a failed one before
/// it) leaves no due lease to the next.
async fn remove_cases(s: &PostgresStore) {
    sqlx::raw_sql("DELETE FROM tollgate_journal; DELETE FROM tollgate_leases; DELETE FROM tollgate_accounts;")
        .execute(s.pool())
        .await
        .expect("cleanup");
}

/// One case: the pass's report, each account's counters, lease states and
/// journal entry are the core's, and the statement declined exactly when the
/// core skipped a lease.
async fn check_case(s: &PostgresStore, tag: &str, cases: &[AccountCase]) {
    let now = ts(T0);
    remove_cases(s).await;
    let accounts = insert_case(s, tag, cases).await;
    let declined_before = s.declined_reclaims();
    let report = s.reclaim(now, 1_000).await.expect("pass");

    let mut expected_reclaimed = Vec::new();
    let mut expected_skipped = Vec::new();
    for (account, leases) in &accounts {
        let (after, outcomes) = core_pass(account, leases, now);
        for (lease, outcome) in leases.iter().zip(outcomes) {
            match outcome {
                Ok(settlement) => expected_reclaimed.push((lease.lease_id.clone(), settlement)),
                Err(reason) => expected_skipped.push((lease.lease_id.clone(), reason)),
            }
        }
        let stored = s.account(&account.account_id).await.expect("account").account;
        assert_eq!(stored.counters(), after.counters(), "{}: counters after {report:?}", account.account_id);
        let settled: Vec<String> = leases
            .iter()
            .map(|l| l.lease_id.clone())
            .filter(|id| expected_reclaimed.iter().any(|(r, _)| r == id))
            .collect();
        let journal = s.journal(&account.account_id, 0, PageLimit::new(None).expect("limit")).await.expect("journal");
        if settled.is_empty() {
            assert_eq!(journal.items, vec![], "{}: nothing settled, nothing journaled", account.account_id);
        } else {
            assert_eq!(journal.items.len(), 1, "{}: one entry", account.account_id);
            let entry = &journal.items[0];
            assert_eq!((entry.kind, entry.seq, entry.at), (EntryKind::Reclaim, 1, now));
            assert_eq!(entry.ids.leases, settled);
            let deltas: Vec<i128> =
                stored.counters().iter().zip(account.counters()).map(|(&a, b)| i128::from(a) - i128::from(b)).collect();
            assert_eq!(entry.deltas.to_vec(), deltas, "{}: deltas", account.account_id);
        }
    }
    let reclaimed: Vec<_> = report.reclaimed.iter().map(|r| (r.lease_id.clone(), r.settlement)).collect();
    assert_eq!(reclaimed, expected_reclaimed, "reclaimed, in account and lease order");
    let skipped: Vec<_> = report.skipped.iter().map(|k| (k.lease_id.clone(), k.reason.clone())).collect();
    assert_eq!(skipped, expected_skipped, "skipped");
    let declined = s.declined_reclaims() - declined_before;
    assert_eq!(declined, u64::from(!expected_skipped.is_empty()), "declined exactly when the core skipped");
}

/// The property, over accounts and leases anywhere in `BIGINT`: usage below,
/// at and above the grant, counters one unit from overflowing, `reserved`
/// short of the grants.
#[test]
fn a_pass_in_one_statement_settles_as_the_core_does() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let s =
        runtime.block_on(async { PostgresStore::on_test_db(TestDb::create().await, policy()).await.expect("store") });
    let case_number = AtomicUsize::new(0);
    let mut runner = TestRunner::new(Config { cases: 64, failure_persistence: None, ..Config::default() });
    runner
        .run(&proptest::collection::vec(account_case(), 1..4), |cases| {
            let tag = format!("c{}", case_number.fetch_add(1, Ordering::Relaxed));
            runtime.block_on(check_case(&s, &tag, &cases));
            Ok(())
        })
        .expect("every case as the core decides it");
}

/// A due lease or account broken in each way the store's row decoding
/// refuses (with the guard that forbids it dropped, as in a database written
/// before the guards): the statement declines the pass, which the core then
/// decides lease by lease, skipping and naming the broken lease and settling
/// the healthy one. Were the statement's decoding conditions weaker than the
/// store's, it would settle the broken lease instead.
#[tokio::test]
async fn a_due_row_that_does_not_decode_leaves_the_pass_to_the_core() {
    // (what, the guard dropped, the break, a fragment of the reason)
    let cases = [
        (
            "lease fence",
            "tollgate_leases_fence_positive",
            "UPDATE tollgate_leases SET fencing_token = 0",
            "fencing_token is 0",
        ),
        ("lease granted", "tollgate_leases_granted_check", "UPDATE tollgate_leases SET granted = -1", "granted is -1"),
        ("lease used", "tollgate_leases_used_check", "UPDATE tollgate_leases SET used = -1", "used is -1"),
        (
            "lease capability",
            "",
            "UPDATE tollgate_leases SET capability_hash = '\\x010203'",
            "capability_hash has 3 bytes",
        ),
        (
            "lease submicro",
            "tollgate_leases_expiry_submicro_range",
            "UPDATE tollgate_leases SET expiry_submicro_ns = 1000",
            "submicro_ns 1000",
        ),
        (
            "lease floor",
            "tollgate_leases_expiry_floor_in_domain",
            "UPDATE tollgate_leases SET expiry_floor_us = -377705023201000001",
            "floor_us -377705023201000001",
        ),
        (
            "account credited",
            "tollgate_accounts_credited_check",
            "UPDATE tollgate_accounts SET credited = -1",
            "credited is -1",
        ),
        (
            "account available",
            "tollgate_accounts_available_check",
            "UPDATE tollgate_accounts SET available = -1",
            "available is -1",
        ),
        (
            "account reserved",
            "tollgate_accounts_reserved_check",
            "UPDATE tollgate_accounts SET reserved = -1",
            "reserved is -1",
        ),
        (
            "account consumed",
            "tollgate_accounts_consumed_check",
            "UPDATE tollgate_accounts SET consumed = -1",
            "consumed is -1",
        ),
        (
            "account overage",
            "tollgate_accounts_overage_check",
            "UPDATE tollgate_accounts SET overage = -1",
            "overage is -1",
        ),
        (
            "account billed",
            "tollgate_accounts_billed_check",
            "UPDATE tollgate_accounts SET billed = -1",
            "billed is -1",
        ),
        (
            "account next_fence",
            "tollgate_accounts_next_fence_positive",
            "UPDATE tollgate_accounts SET next_fence = 0",
            "next_fence is 0",
        ),
    ];
    let s = PostgresStore::on_test_db(TestDb::create().await, policy()).await.expect("store");
    let now = ts(T0);
    let healthy = AccountCase { counters: [10, 0, 10, 0, 0, 0, 2], leases: vec![(10, 4)] };
    for (what, guard, break_sql, reason) in cases {
        remove_cases(&s).await;
        if !guard.is_empty() {
            let table = if guard.starts_with("tollgate_leases") { "tollgate_leases" } else { "tollgate_accounts" };
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!("ALTER TABLE {table} DROP CONSTRAINT IF EXISTS {guard}")))
                .execute(s.pool())
                .await
                .expect("drop the guard");
        }
        // a0 is broken, a1 is healthy; a0's lease is the more overdue.
        let accounts =
            insert_case(&s, what.split(' ').next().unwrap_or(what), &[healthy.clone(), healthy.clone()]).await;
        let (broken, fine) = (&accounts[0], &accounts[1]);
        sqlx::query(sqlx::AssertSqlSafe(format!("{break_sql} WHERE account_id = $1")))
            .bind(&broken.0.account_id)
            .execute(s.pool())
            .await
            .expect("break the row");
        let declined_before = s.declined_reclaims();

        let report = s.reclaim(now, 1_000).await.expect("the pass succeeds around the broken row");
        let reclaimed: Vec<&str> = report.reclaimed.iter().map(|r| r.lease_id.as_str()).collect();
        assert_eq!(reclaimed, vec![fine.1[0].lease_id.as_str()], "{what}");
        assert_eq!(report.skipped.len(), 1, "{what}: {:?}", report.skipped);
        assert_eq!(report.skipped[0].lease_id, broken.1[0].lease_id, "{what}");
        assert!(report.skipped[0].reason.contains(reason), "{what}: {}", report.skipped[0].reason);
        assert_eq!(s.declined_reclaims() - declined_before, 1, "{what}: the statement declined");
    }
}

/// A healthy backlog over more accounts than a pass's first statement looks
/// at, in passes of a bound the first statement cannot fill: every pass runs
/// in statements alone (none declines), settles the bound's most overdue
/// accounts' leases, and the whole backlog is settled once.
#[tokio::test]
async fn a_healthy_backlog_is_settled_in_statements_alone() {
    let s = PostgresStore::on_test_db(TestDb::create().await, policy()).await.expect("store");
    let cases: Vec<AccountCase> =
        (0..90).map(|i| AccountCase { counters: [5, 0, 5, 0, 0, 1, 2], leases: vec![(5, i % 7)] }).collect();
    let accounts = insert_case(&s, "b", &cases).await;
    let mut settled = 0;
    loop {
        let report = s.reclaim(ts(T0), 80).await.expect("pass");
        if report.reclaimed.is_empty() {
            break;
        }
        settled += report.reclaimed.len();
    }
    assert_eq!(settled, 90);
    assert_eq!(s.declined_reclaims(), 0);
    for (account, leases) in &accounts {
        let (after, _) = core_pass(account, leases, ts(T0));
        assert_eq!(s.account(&account.account_id).await.expect("account").account.counters(), after.counters());
    }
}
