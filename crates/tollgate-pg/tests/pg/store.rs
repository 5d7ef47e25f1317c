//! PostgreSQL-only store behaviour: the `BIGINT` unit domain, stored rows that
//! break invariants, concurrency across pools, startup refusals, the shared
//! reclaim grace, and legacy (pre-0017) leases. Each test has its own database.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use jiff::{SignedDuration, Timestamp};
use tollgate_core::{
    Error, GrantPolicy, IngestError, Lease, LeaseState, Outcome, RejectReason, SecretHash, UsageEvent,
};
use tollgate_pg::migrations::{latest_version, versions_from};
use tollgate_pg::testing::TestDb;
use tollgate_pg::{ConnectError, MigrationError, PostgresStore};
use tollgate_store::{
    IssuedLease, LeaseHandle, LegacyBoundCount, ReclaimReport, Released, Store, UnlockedCounts, UnlockedOperation,
    UsageSink,
};

use crate::fixtures;

const T0: i128 = 1_700_000_000_123_456_789;
const I64_MAX: u64 = i64::MAX as u64;

fn ts(ns: i128) -> Timestamp {
    Timestamp::from_nanosecond(ns).expect("instant in the domain")
}

fn nanos(ns: i64) -> SignedDuration {
    SignedDuration::from_nanos(ns)
}

fn policy(grace: SignedDuration) -> GrantPolicy {
    GrantPolicy::new(SignedDuration::from_secs(3_600), grace, 100).expect("valid policy")
}

async fn store(grace: SignedDuration) -> PostgresStore {
    PostgresStore::on_test_db(TestDb::create().await, policy(grace)).await.expect("store")
}

async fn funded(s: &impl Store, account_id: &str, units: u64) {
    s.create_account(account_id).await.expect("account");
    if units > 0 {
        s.credit(account_id, "seed", units, jiff::Timestamp::UNIX_EPOCH).await.expect("credit");
    }
}

async fn credential(s: &impl Store, account_id: &str) -> String {
    s.issue_credential(account_id, "gw", ts(T0)).await.expect("credential").credential.credential_id
}

/// Accounts `acct-0` to `acct-{count - 1}`, each credited `units` and given a
/// credential; returns each account's id with its credential's id.
async fn funded_with_credentials(s: &impl Store, count: usize, units: u64) -> Vec<(String, String)> {
    let mut accounts = Vec::new();
    for a in 0..count {
        let account_id = format!("acct-{a}");
        funded(s, &account_id, units).await;
        let credential_id = credential(s, &account_id).await;
        accounts.push((account_id, credential_id));
    }
    accounts
}

fn event(
    request_id: &str,
    account_id: &str,
    credential_id: &str,
    units: u64,
    lease: Option<&IssuedLease>,
) -> UsageEvent {
    UsageEvent {
        request_id: request_id.into(),
        account_id: account_id.into(),
        credential_id: credential_id.into(),
        units,
        occurred_at: ts(T0),
        lease_id: lease.map(|l| l.lease.lease_id.clone()),
        fencing_token: lease.map(|l| l.lease.fencing_token),
        dimensions: Default::default(),
    }
}

fn handle(lease: &IssuedLease) -> LeaseHandle {
    LeaseHandle { lease_id: lease.lease.lease_id.clone(), capability: lease.capability.expose().to_owned() }
}

/// `(credited, available, reserved, consumed, overage, billed, next_fence)`.
type Counters = (u64, u64, u64, u64, u64, u64, u64);

async fn counters(s: &impl Store, account_id: &str) -> Counters {
    let a = s.account(account_id).await.expect("account").account;
    (a.credited, a.available, a.reserved, a.consumed, a.overage, a.billed, a.next_fence)
}

async fn assert_conserved(s: &impl Store) {
    let report = s.check().await.expect("check");
    assert_eq!(report.violations, vec![], "conservation");
    assert_eq!(report.guard_violations, vec![], "guards");
}

fn outcomes(result: Result<Vec<tollgate_core::EventOutcome>, IngestError>) -> Vec<(String, Outcome)> {
    result.expect("batch classified").into_iter().map(|o| (o.request_id, o.outcome)).collect()
}

// ------------------------------------------------------------- unit domain

/// "PostgreSQL rejects an individual event outside its domain while
/// retaining valid neighbors."
#[tokio::test]
async fn units_above_i64_max_are_rejected_individually_in_a_mixed_batch() {
    let s = store(nanos(0)).await;
    funded(&s, "acct", 100).await;
    let cred = credential(&s, "acct").await;
    let lease = s.acquire("acct", 10, nanos(60_000_000_000), ts(T0)).await.unwrap();
    let batch = vec![
        event("ok-1", "acct", &cred, 5, None),
        event("too-big", "acct", &cred, I64_MAX + 1, None),
        event("u64-max", "acct", &cred, u64::MAX, Some(&lease)),
        event("ok-2", "acct", &cred, 3, Some(&lease)),
        event("i64-max", "acct", &cred, I64_MAX - 8, None),
    ];
    let rejected = Outcome::Rejected(RejectReason::UnitsOutOfRange);
    assert_eq!(
        outcomes(s.ingest(batch, ts(T0)).await),
        vec![
            ("ok-1".into(), Outcome::Accepted),
            ("too-big".into(), rejected),
            ("u64-max".into(), rejected),
            ("ok-2".into(), Outcome::Accepted),
            ("i64-max".into(), Outcome::Accepted),
        ]
    );
    // Billed reaches exactly i64::MAX, the top of the domain.
    assert_eq!(counters(&s, "acct").await, (100, 90, 10, 0, I64_MAX - 3, I64_MAX, 2));
    assert_eq!(s.lease(&lease.lease.account_id, &lease.lease.lease_id).await.unwrap().used, 3);
    let c = s.credential("acct", &cred).await.unwrap();
    assert_eq!((c.accepted_events, c.accepted_units), (3, I64_MAX));

    // The rejected IDs were not claimed, but billed is full: even one more unit
    // refuses the whole batch, terminally, and applies nothing.
    let retry = s.ingest(vec![event("too-big", "acct", &cred, 1, None)], ts(T0)).await;
    assert!(matches!(retry, Err(IngestError::Refused { .. })), "{retry:?}");
    assert_conserved(&s).await;
}

/// Acquire, credit and consolidation take units above `i64::MAX` as
/// `units_out_of_range`, and change nothing.
#[tokio::test]
async fn acquire_credit_and_consolidate_above_i64_max_are_units_out_of_range() {
    let s = store(nanos(0)).await;
    funded(&s, "acct", 100).await;
    let lease = s.acquire("acct", 10, nanos(1_000), ts(T0)).await.unwrap();
    let before = counters(&s, "acct").await;
    let out_of_range = |units| Error::UnitsOutOfRange { units, max: I64_MAX };
    for units in [I64_MAX + 1, u64::MAX] {
        assert_eq!(s.acquire("acct", units, nanos(1_000), ts(T0)).await.unwrap_err(), out_of_range(units));
        assert_eq!(s.credit("acct", "big", units, jiff::Timestamp::UNIX_EPOCH).await.unwrap_err(), out_of_range(units));
        assert_eq!(
            s.consolidate("acct", &[handle(&lease)], units, nanos(1_000), ts(T0)).await.unwrap_err(),
            out_of_range(units)
        );
    }
    assert_eq!(counters(&s, "acct").await, before);
    assert_eq!(s.lease(&lease.lease.account_id, &lease.lease.lease_id).await.unwrap().state, LeaseState::Active);

    // The largest representable credit fits; one more unit overflows `credited`.
    funded(&s, "full", I64_MAX).await;
    assert_eq!(
        s.credit("full", "one-more", 1, jiff::Timestamp::UNIX_EPOCH).await.unwrap_err(),
        Error::CounterOverflow { counter: "credited" }
    );
    assert_eq!(counters(&s, "full").await, (I64_MAX, I64_MAX, 0, 0, 0, 0, 1));
    assert_conserved(&s).await;
}

// ----------------------------------------------------------- corrupt rows

/// What a store operation on a corrupt row must return.
fn expect_corrupt<T: std::fmt::Debug>(what: &str, result: Result<T, Error>) {
    match result {
        Err(Error::StorageCorrupt(message)) => assert!(!message.is_empty(), "{what}"),
        other => panic!("{what}: expected storage_corrupt, got {other:?}"),
    }
}

fn expect_ingest_corrupt<T: std::fmt::Debug>(what: &str, result: Result<T, IngestError>) {
    match result {
        Err(IngestError::Corrupt(_)) => {}
        other => panic!("{what}: expected IngestError::Corrupt, got {other:?}"),
    }
}

/// Negative and zero stored fences. Rows written before the guards
/// existed (here: with the guard dropped, then written by direct SQL) are found
/// by every operation that loads them as storage_corrupt, never a panic and
/// never a silent settlement; `check` lists them as guard violations.
#[tokio::test]
async fn zero_and_negative_stored_lease_fences_are_storage_corrupt() {
    for fence in [0_i64, -1, i64::MIN] {
        let s = store(nanos(0)).await;
        funded(&s, "acct", 100).await;
        let cred = credential(&s, "acct").await;
        let lease = s.acquire("acct", 10, nanos(1_000), ts(T0)).await.unwrap();
        sqlx::raw_sql("ALTER TABLE tollgate_leases DROP CONSTRAINT tollgate_leases_fence_positive")
            .execute(s.pool())
            .await
            .unwrap();
        sqlx::query("UPDATE tollgate_leases SET fencing_token = $1 WHERE lease_id = $2")
            .bind(fence)
            .bind(&lease.lease.lease_id)
            .execute(s.pool())
            .await
            .unwrap();
        let before = counters(&s, "acct").await;
        let what = |op: &str| format!("fence {fence}: {op}");

        expect_corrupt(&what("lease"), s.lease(&lease.lease.account_id, &lease.lease.lease_id).await);
        expect_corrupt(
            &what("release"),
            s.release(&lease.lease.account_id, &lease.lease.lease_id, lease.capability.expose(), ts(T0)).await,
        );
        expect_corrupt(&what("consolidate"), s.consolidate("acct", &[handle(&lease)], 0, nanos(1_000), ts(T0)).await);
        let mut leased = event("e", "acct", &cred, 1, Some(&lease));
        leased.fencing_token = Some(1);
        expect_ingest_corrupt(&what("ingest"), s.ingest(vec![leased], ts(T0)).await);
        let reclaim = s.reclaim(ts(T0 + 1_000), 10).await.expect("reclaim skips the corrupt lease");
        assert_eq!(reclaim.reclaimed, vec![], "{fence}");
        let skipped: Vec<&str> = reclaim.skipped.iter().map(|l| l.lease_id.as_str()).collect();
        assert_eq!(skipped, vec![lease.lease.lease_id.as_str()], "{fence}");

        // Nothing was settled or billed around the corrupt row.
        assert_eq!(counters(&s, "acct").await, before, "{fence}");
        let report = s.check().await.expect("check reports instead of failing");
        assert_eq!(report.violations, vec![]);
        assert_eq!(report.guard_violations.len(), 1, "{fence}: {:?}", report.guard_violations);
        let violation = &report.guard_violations[0];
        assert_eq!(
            (violation.table.as_str(), violation.key.as_str(), violation.column.as_str(), violation.value),
            ("tollgate_leases", lease.lease.lease_id.as_str(), "fencing_token", fence)
        );
    }
}

/// The same for an account's `next_fence` and for stored usage events.
#[tokio::test]
async fn zero_and_negative_next_fence_and_event_rows_are_storage_corrupt() {
    for next_fence in [0_i64, -5] {
        let s = store(nanos(0)).await;
        funded(&s, "acct", 100).await;
        let cred = credential(&s, "acct").await;
        sqlx::raw_sql(
            "ALTER TABLE tollgate_accounts DROP CONSTRAINT tollgate_accounts_next_fence_positive;
             ALTER TABLE tollgate_usage_events DROP CONSTRAINT tollgate_usage_events_units_nonnegative;
             ALTER TABLE tollgate_usage_events DROP CONSTRAINT tollgate_usage_events_fence_positive;",
        )
        .execute(s.pool())
        .await
        .unwrap();
        sqlx::query("UPDATE tollgate_accounts SET next_fence = $1 WHERE account_id = 'acct'")
            .bind(next_fence)
            .execute(s.pool())
            .await
            .unwrap();
        sqlx::query(
            "INSERT INTO tollgate_usage_events (account_id, request_id, credential_id, units, \
             occurred_at_floor_us, occurred_at_submicro_ns, lease_id, fencing_token) \
             VALUES ('acct', 'old', $1, -3, 0, 0, 'gone', $2)",
        )
        .bind(&cred)
        .bind(next_fence)
        .execute(s.pool())
        .await
        .unwrap();

        let what = |op: &str| format!("next_fence {next_fence}: {op}");
        expect_corrupt(&what("acquire"), s.acquire("acct", 1, nanos(1_000), ts(T0)).await);
        expect_corrupt(&what("account"), s.account("acct").await);
        expect_corrupt(&what("credit"), s.credit("acct", "more", 1, jiff::Timestamp::UNIX_EPOCH).await);
        expect_ingest_corrupt(&what("ingest"), s.ingest(vec![event("e", "acct", &cred, 1, None)], ts(T0)).await);

        let report = s.check().await.expect("check reports instead of failing");
        assert_eq!(report.violations, vec![]);
        let found: BTreeSet<(String, String, i64)> =
            report.guard_violations.iter().map(|v| (v.table.clone(), v.column.clone(), v.value)).collect();
        let expected: BTreeSet<(String, String, i64)> = [
            ("tollgate_accounts", "next_fence", next_fence),
            ("tollgate_usage_events", "fencing_token", next_fence),
            ("tollgate_usage_events", "units", -3),
        ]
        .into_iter()
        .map(|(t, c, v)| (t.to_owned(), c.to_owned(), v))
        .collect();
        assert_eq!(found, expected, "{next_fence}");
    }
}

/// One corrupt due lease, or one inconsistent account, stops no other
/// account's reclaim: a pass skips and reports each lease it cannot decode or
/// settle and settles every healthy due lease, even one behind as many corrupt
/// ones in expiry order as the pass's bound.
#[tokio::test]
async fn reclaim_skips_corrupt_leases_and_accounts_and_settles_the_healthy_ones() {
    let s = store(nanos(0)).await;
    for account in ["broken", "fenced", "healthy"] {
        funded(&s, account, 100).await;
    }
    // Expiry order: broken's lease, fenced's lease, then the healthy one.
    let broken = s.acquire("broken", 10, nanos(1_000), ts(T0)).await.unwrap();
    let fenced = s.acquire("fenced", 10, nanos(2_000), ts(T0)).await.unwrap();
    let healthy = s.acquire("healthy", 10, nanos(3_000), ts(T0)).await.unwrap();
    sqlx::raw_sql(
        "ALTER TABLE tollgate_accounts DROP CONSTRAINT tollgate_accounts_available_check;
         ALTER TABLE tollgate_leases DROP CONSTRAINT tollgate_leases_fence_positive;
         UPDATE tollgate_accounts SET available = -1 WHERE account_id = 'broken';
         UPDATE tollgate_leases SET fencing_token = 0 WHERE account_id = 'fenced';",
    )
    .execute(s.pool())
    .await
    .unwrap();

    let report = s.reclaim(ts(T0 + 10_000), 2).await.expect("the pass succeeds around corrupt rows");
    let reclaimed: Vec<&str> = report.reclaimed.iter().map(|r| r.lease_id.as_str()).collect();
    assert_eq!(reclaimed, vec![healthy.lease.lease_id.as_str()]);
    let skipped: Vec<(&str, &str)> =
        report.skipped.iter().map(|l| (l.lease_id.as_str(), l.account_id.as_str())).collect();
    assert_eq!(skipped, vec![(broken.lease.lease_id.as_str(), "broken"), (fenced.lease.lease_id.as_str(), "fenced")]);
    assert!(report.skipped[0].reason.contains("available is -1"), "{:?}", report.skipped[0]);
    assert!(report.skipped[1].reason.contains("fencing_token is 0"), "{:?}", report.skipped[1]);
    assert_eq!(counters(&s, "healthy").await, (100, 100, 0, 0, 0, 0, 2));
    assert_eq!(lease_state(&s, &broken.lease).await, LeaseState::Active);

    // The next pass finds the same corrupt leases and nothing else to do.
    let again = s.reclaim(ts(T0 + 10_000), 2).await.expect("second pass");
    assert_eq!((again.reclaimed.len(), again.skipped.len()), (0, 2));

    // `check` names both rows instead of failing on them.
    let report = s.check().await.expect("check reports instead of failing");
    let found: BTreeSet<(String, String, String, i64)> =
        report.guard_violations.iter().map(|v| (v.table.clone(), v.key.clone(), v.column.clone(), v.value)).collect();
    let expected: BTreeSet<(String, String, String, i64)> = [
        ("tollgate_accounts", "broken".to_owned(), "available", -1),
        ("tollgate_leases", fenced.lease.lease_id.clone(), "fencing_token", 0),
    ]
    .into_iter()
    .map(|(t, k, c, v)| (t.to_owned(), k, c.to_owned(), v))
    .collect();
    assert_eq!(found, expected);
    assert!(!report.is_clean());
    assert_eq!(report.violations, vec![], "the healthy accounts balance");
}

/// Other stored values no guard forbids but no writer produces: each is found
/// by the operations that load it as storage_corrupt, never decoded into a
/// wrong value and never a panic.
#[tokio::test]
async fn undecodable_stored_values_are_storage_corrupt() {
    // (what, direct SQL that breaks one stored value)
    let cases = [
        ("credential created_submicro_ns 1000", "UPDATE tollgate_credentials SET created_submicro_ns = 1000"),
        ("credential last_used with half its pair", "UPDATE tollgate_credentials SET last_used_floor_us = 5"),
        ("credential negative accepted_units", "UPDATE tollgate_credentials SET accepted_units = -1"),
        (
            "account negative available",
            "ALTER TABLE tollgate_accounts DROP CONSTRAINT tollgate_accounts_available_check;
             UPDATE tollgate_accounts SET available = -1",
        ),
        ("lease capability hash of 3 bytes", "UPDATE tollgate_leases SET capability_hash = '\\x010203'"),
    ];
    for (what, sql) in cases {
        let s = store(nanos(0)).await;
        funded(&s, "acct", 100).await;
        let issued = s.issue_credential("acct", "gw", ts(T0)).await.unwrap();
        let cred = issued.credential.credential_id.clone();
        let lease = s.acquire("acct", 10, nanos(1_000), ts(T0)).await.unwrap();
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned())).execute(s.pool()).await.unwrap();

        let usage = s.ingest(vec![event("e", "acct", &cred, 1, Some(&lease))], ts(T0)).await;
        expect_ingest_corrupt(what, usage);
        if what.starts_with("credential") {
            expect_corrupt(what, s.credential("acct", &cred).await);
            expect_corrupt(what, s.verify_credential(issued.key.expose()).await);
        } else if what.starts_with("account") {
            expect_corrupt(what, s.account("acct").await);
            expect_corrupt(what, s.acquire("acct", 1, nanos(1), ts(T0)).await);
            expect_corrupt(
                what,
                s.release(&lease.lease.account_id, &lease.lease.lease_id, lease.capability.expose(), ts(T0)).await,
            );
        } else {
            expect_corrupt(what, s.lease(&lease.lease.account_id, &lease.lease.lease_id).await);
            expect_corrupt(
                what,
                s.release(&lease.lease.account_id, &lease.lease.lease_id, lease.capability.expose(), ts(T0)).await,
            );
        }
    }
}

// ------------------------------------------------------------- concurrency

/// Two servers' stores over one new database, with no reclaim grace; the
/// second opens its own pool of `connections_max`.
async fn two_servers(connections_max: u32) -> (Arc<PostgresStore>, Arc<PostgresStore>) {
    let db = TestDb::create().await;
    let second_pool = db.new_pool(connections_max).await;
    let one = PostgresStore::on_test_db(db, policy(nanos(0))).await.unwrap();
    let two = PostgresStore::from_pool(second_pool, policy(nanos(0))).await.unwrap();
    (Arc::new(one), Arc::new(two))
}

/// Two reclaimers on two pools (two servers) over one database settle every
/// due lease exactly once, and the ledger is exact afterwards. Each pass reads
/// the oldest due leases, so the two race for the same leases pass after pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_reclaimers_never_settle_a_lease_twice() {
    const ACCOUNTS: usize = 4;
    const LEASES_PER_ACCOUNT: usize = 30;
    let (one, two) = two_servers(4).await;

    let mut expected_used: BTreeMap<String, u64> = BTreeMap::new();
    let mut all_leases = BTreeSet::new();
    for a in 0..ACCOUNTS {
        let account_id = format!("acct-{a}");
        funded(&*one, &account_id, 10_000).await;
        let cred = credential(&*one, &account_id).await;
        let mut batch = Vec::new();
        for i in 0..LEASES_PER_ACCOUNT {
            let lease = one.acquire(&account_id, 10, nanos(1_000 + i as i64), ts(T0)).await.unwrap();
            // Some usage inside, some beyond the grant.
            let used = (i as u64 * 7) % 15;
            batch.push(event(&format!("u-{i}"), &account_id, &cred, used, Some(&lease)));
            *expected_used.entry(account_id.clone()).or_default() += used;
            all_leases.insert(lease.lease.lease_id);
        }
        assert!(outcomes(one.ingest(batch, ts(T0)).await).iter().all(|(_, o)| *o == Outcome::Accepted));
    }

    let now = ts(T0 + 10_000);
    let reclaimer = |store: Arc<PostgresStore>| async move {
        let mut settled = Vec::new();
        // Bounded: every pass either settles something or finds nothing left.
        for _ in 0..1_000 {
            let report = store.reclaim(now, 7).await.expect("reclaim");
            settled.extend(report.reclaimed);
            let active: i64 = sqlx::query_scalar("SELECT count(*) FROM tollgate_leases WHERE state = 'active'")
                .fetch_one(store.pool())
                .await
                .unwrap();
            if active == 0 {
                break;
            }
        }
        settled
    };
    let (a, b) = tokio::join!(tokio::spawn(reclaimer(one.clone())), tokio::spawn(reclaimer(two.clone())));
    let (a, b) = (a.unwrap(), b.unwrap());

    let mut seen = BTreeSet::new();
    for reclaimed in a.iter().chain(&b) {
        assert!(seen.insert(reclaimed.lease_id.clone()), "lease {} settled twice", reclaimed.lease_id);
    }
    assert_eq!(seen, all_leases);
    for (account_id, used) in expected_used {
        let granted = 10 * LEASES_PER_ACCOUNT as u64;
        // Per lease: charged = min(used, 10), excess = used - charged.
        let (mut consumed, mut overage) = (0, 0);
        for i in 0..LEASES_PER_ACCOUNT {
            let u = (i as u64 * 7) % 15;
            consumed += u.min(10);
            overage += u - u.min(10);
        }
        assert_eq!(consumed + overage, used);
        assert_eq!(
            counters(&*one, &account_id).await,
            (10_000, 10_000 - consumed, 0, consumed, overage, used, LEASES_PER_ACCOUNT as u64 + 1),
            "{account_id}, granted {granted}"
        );
    }
    assert_conserved(&*one).await;
}

/// Reclaim passes on two servers run while usage batches and releases, which
/// lock accounts and then their leases, work on the same accounts' live
/// leases: every call succeeds (no deadlock is broken, no pass waits on an
/// account), every due lease is settled exactly once, and the ledger holds.
/// The settling write locks its accounts and not its leases, which is safe
/// only because every other writer of a lease holds the lease's account.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reclaim_passes_racing_usage_and_releases_on_the_same_accounts_never_deadlock() {
    const ACCOUNTS: usize = 4;
    const LEASES: usize = 40;
    let (one, two) = two_servers(4).await;
    let mut due = BTreeSet::new();
    let mut live = Vec::new();
    let accounts = funded_with_credentials(&*one, ACCOUNTS, 100_000).await;
    let credentials: Vec<String> = accounts.iter().map(|(_, credential_id)| credential_id.clone()).collect();
    for (account_id, _) in &accounts {
        for i in 0..LEASES {
            let expiring = one.acquire(account_id, 10, nanos(1_000 + i as i64), ts(T0)).await.unwrap();
            due.insert(expiring.lease.lease_id);
            live.push(one.acquire(account_id, 10, nanos(3_600_000_000_000), ts(T0)).await.unwrap());
        }
    }
    let now = ts(T0 + 10_000);

    let reclaimer = |store: Arc<PostgresStore>| async move {
        let mut settled = Vec::new();
        // Bounded: a pass settles nothing only while the accounts it chose are
        // busy, which they stop being when the usage and releases end.
        for _ in 0..10_000 {
            let report = store.reclaim(now, 9).await.expect("a reclaim pass");
            settled.extend(report.reclaimed.into_iter().map(|r| r.lease_id));
            if store.lease_summary(now).await.expect("the lease summary").due == 0 {
                return settled;
            }
        }
        panic!("due leases left after 10000 passes");
    };
    let usage = {
        let (store, live, credentials) = (one.clone(), live.clone(), credentials.clone());
        async move {
            // Each batch names a live lease of every account, so it locks all
            // four accounts and then four leases.
            for i in 0..LEASES {
                let batch = (0..ACCOUNTS)
                    .map(|a| {
                        let lease = &live[a * LEASES + i];
                        event(&format!("u-{a}-{i}"), &lease.lease.account_id, &credentials[a], 3, Some(lease))
                    })
                    .collect();
                store.ingest(batch, now).await.expect("a usage batch");
            }
        }
    };
    let releases = {
        let (store, live) = (two.clone(), live.clone());
        async move {
            for lease in live.iter().rev() {
                let released =
                    store.release(&lease.lease.account_id, &lease.lease.lease_id, lease.capability.expose(), now);
                released.await.expect("a release");
            }
        }
    };
    let (a, b, (), ()) =
        tokio::join!(tokio::spawn(reclaimer(one.clone())), tokio::spawn(reclaimer(two.clone())), usage, releases);

    let mut seen = BTreeSet::new();
    for lease_id in a.unwrap().into_iter().chain(b.unwrap()) {
        assert!(seen.insert(lease_id.clone()), "lease {lease_id} settled twice");
    }
    assert_eq!(seen, due, "every due lease settled, and no live one");
    for lease in &live {
        assert_eq!(lease_state(&one, &lease.lease).await, LeaseState::Released);
    }
    assert_conserved(&*one).await;
}

/// A pass whose bound is larger than the number of most overdue leases it
/// looks at first (64), over accounts with one due lease each, still settles
/// its whole bound, the most overdue leases: the read widens to as many
/// leases as the bound instead of stopping at the accounts it found first.
#[tokio::test]
async fn a_pass_over_accounts_with_one_due_lease_each_fills_its_bound_with_the_most_overdue() {
    let s = store(nanos(0)).await;
    let mut due = Vec::new();
    for a in 0..100 {
        let account_id = format!("acct-{a:03}");
        funded(&s, &account_id, 100).await;
        // Later accounts' leases expire earlier.
        due.insert(0, s.acquire(&account_id, 10, nanos(10_000 - a), ts(T0)).await.unwrap().lease.lease_id);
    }
    let settled = |report: ReclaimReport| report.reclaimed.into_iter().map(|r| r.lease_id).collect::<BTreeSet<_>>();
    let first = s.reclaim(ts(T0 + 20_000), 80).await.expect("a pass");
    assert_eq!(settled(first), due[..80].iter().cloned().collect(), "the 80 most overdue");
    let rest = s.reclaim(ts(T0 + 20_000), 80).await.expect("the next pass");
    assert_eq!(settled(rest), due[80..].iter().cloned().collect(), "the rest");
    assert_conserved(&s).await;
}

/// Many concurrent acquires on one account, from two pools, never overdraw:
/// exactly as many succeed as the balance allows, each with its own fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_acquires_on_one_account_never_overdraw() {
    const ATTEMPTS: usize = 40;
    let (one, two) = two_servers(8).await;
    funded(&*one, "acct", 100).await;

    let tasks: Vec<_> = (0..ATTEMPTS)
        .map(|i| {
            let store = if i % 2 == 0 { one.clone() } else { two.clone() };
            tokio::spawn(async move { store.acquire("acct", 7, nanos(60_000_000_000), ts(T0)).await })
        })
        .collect();
    let mut fences = BTreeSet::new();
    let mut refused = 0;
    for task in tasks {
        match task.await.unwrap() {
            Ok(lease) => assert!(fences.insert(lease.lease.fencing_token)),
            Err(Error::InsufficientBalance { requested: 7, available }) => {
                assert!(available < 7, "refused with {available} available");
                refused += 1;
            }
            Err(other) => panic!("unexpected error {other:?}"),
        }
    }
    assert_eq!(fences, (1..=14).collect::<BTreeSet<u64>>());
    assert_eq!(refused, ATTEMPTS - 14);
    assert_eq!(counters(&*one, "acct").await, (100, 2, 98, 0, 0, 0, 15));
    assert_conserved(&*one).await;
}

/// Release, consolidation, usage and reclaim racing on shared accounts from
/// two pools: the lock order admits no deadlock (a deadlock would surface as
/// storage_unavailable), and the ledger is exact afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_concurrent_operations_neither_deadlock_nor_leak_units() {
    const ACCOUNTS: usize = 3;
    const LEASES_PER_ACCOUNT: usize = 12;
    let (one, two) = two_servers(8).await;

    let mut leases = Vec::new();
    let accounts = funded_with_credentials(&*one, ACCOUNTS, 1_000).await;
    let creds: BTreeMap<String, String> = accounts.iter().cloned().collect();
    for (account_id, _) in &accounts {
        for i in 0..LEASES_PER_ACCOUNT {
            // Half expire at T0 + 500 (reclaimable at `late`), half live long.
            let ttl = if i % 2 == 0 { nanos(500) } else { nanos(60_000_000_000) };
            leases.push(one.acquire(account_id, 10, ttl, ts(T0)).await.unwrap());
        }
    }
    let late = ts(T0 + 1_000);
    let mut tasks = Vec::new();
    for (i, lease) in leases.iter().enumerate() {
        let store = if i % 2 == 0 { one.clone() } else { two.clone() };
        let lease = lease.clone();
        let cred = creds[&lease.lease.account_id].clone();
        tasks.push(tokio::spawn(async move {
            let usage = event(&format!("u-{i}"), &lease.lease.account_id, &cred, 3, Some(&lease));
            let ingest = store.ingest(vec![usage], late).await;
            assert!(ingest.is_ok(), "{ingest:?}");
            let settled = if i % 3 == 0 {
                store.consolidate(&lease.lease.account_id, &[handle(&lease)], 1, nanos(1_000), late).await.map(|_| ())
            } else {
                store
                    .release(&lease.lease.account_id, &lease.lease.lease_id, lease.capability.expose(), late)
                    .await
                    .map(|_| ())
            };
            match settled {
                Ok(()) | Err(Error::LeaseExpired) | Err(Error::LeaseNotActive { .. }) => {}
                Err(other) => panic!("lease {i}: {other:?}"),
            }
        }));
    }
    for store in [one.clone(), two.clone()] {
        tasks.push(tokio::spawn(async move {
            for _ in 0..20 {
                store.reclaim(late, 5).await.expect("reclaim never deadlocks");
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    // Drain whatever is left due, then every equation must hold.
    while !one.reclaim(ts(T0 + 10_000_000_000_000), 100).await.unwrap().reclaimed.is_empty() {}
    assert_conserved(&*one).await;
}

// ------------------------------------------------- the unlocked path's fallback

/// Holds a lock on one account row in an open transaction, as a concurrent
/// operation of another server would, until it is committed. Returns the
/// transaction and its backend's pid.
async fn hold_account(s: &PostgresStore, account_id: &str) -> (sqlx::Transaction<'static, sqlx::Postgres>, i32) {
    let mut tx = s.pool().begin().await.expect("begin");
    let pid = fixtures::backend_pid(&mut tx).await;
    sqlx::query("SELECT 1 FROM tollgate_accounts WHERE account_id = $1 FOR NO KEY UPDATE")
        .bind(account_id)
        .fetch_one(&mut *tx)
        .await
        .expect("lock the account");
    (tx, pid)
}

async fn lease_state(s: &PostgresStore, lease: &Lease) -> LeaseState {
    s.lease(&lease.account_id, &lease.lease_id).await.expect("lease").state
}

/// A release whose account another transaction holds writes nothing on the
/// unlocked path (it never waits there), then waits on the locking path and
/// settles once the holder commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_on_a_busy_account_waits_on_the_locking_path_and_settles_after_it() {
    let s = Arc::new(store(nanos(0)).await);
    funded(&*s, "acct", 100).await;
    let cred = credential(&*s, "acct").await;
    let lease = s.acquire("acct", 10, nanos(60_000_000_000), ts(T0)).await.unwrap();
    outcomes(s.ingest(vec![event("u-1", "acct", &cred, 4, Some(&lease))], ts(T0)).await);

    let (holder, holder_pid) = hold_account(&s, "acct").await;
    let releasing = {
        let (s, lease) = (s.clone(), lease.clone());
        tokio::spawn(async move {
            s.release(&lease.lease.account_id, &lease.lease.lease_id, lease.capability.expose(), ts(T0)).await
        })
    };
    let waiting = fixtures::statement_waiting_behind(s.pool(), holder_pid).await;
    assert!(waiting.contains("FOR NO KEY UPDATE OF a FOR UPDATE OF l"), "waits in the locking read: {waiting}");
    assert_eq!(lease_state(&s, &lease.lease).await, LeaseState::Active, "nothing written while it waits");
    holder.commit().await.expect("commit");

    let released = releasing.await.unwrap().expect("released");
    assert_eq!((released.settlement.charged, released.settlement.returned), (4, 6));
    assert_eq!(counters(&*s, "acct").await, (100, 96, 0, 4, 0, 4, 2));
    assert_conserved(&*s).await;
}

/// An acquire whose account changes between its read and its write stores
/// nothing it decided on the old state: its write waits for the holder, finds
/// the counters changed, and the locking path decides again on the new ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_racing_a_change_to_its_account_decides_again_on_the_committed_state() {
    let s = Arc::new(store(nanos(0)).await);
    funded(&*s, "acct", 100).await;

    // The holder takes the fence the unlocked read will have seen.
    let (mut holder, holder_pid) = hold_account(&s, "acct").await;
    sqlx::query("UPDATE tollgate_accounts SET next_fence = next_fence + 1 WHERE account_id = $1")
        .bind("acct")
        .execute(&mut *holder)
        .await
        .expect("take a fence");
    let acquiring = {
        let s = s.clone();
        tokio::spawn(async move { s.acquire("acct", 10, nanos(60_000_000_000), ts(T0)).await })
    };
    let waiting = fixtures::statement_waiting_behind(s.pool(), holder_pid).await;
    assert!(waiting.contains("UPDATE tollgate_accounts"), "waits in the conditional write: {waiting}");
    holder.commit().await.expect("commit");

    let issued = acquiring.await.unwrap().expect("acquired");
    assert_eq!(issued.lease.fencing_token, 2, "the fence after the holder's, not the one read before it");
    assert_eq!(counters(&*s, "acct").await, (100, 90, 10, 0, 0, 0, 3));
    assert_conserved(&*s).await;
}

/// A reclaim pass never waits: a due lease whose account another transaction
/// holds stays due, and the next pass after the holder commits settles it.
#[tokio::test]
async fn a_reclaim_pass_leaves_a_lease_on_a_busy_account_due_for_the_next_pass() {
    let s = store(nanos(0)).await;
    funded(&s, "busy", 100).await;
    funded(&s, "idle", 100).await;
    let busy = s.acquire("busy", 10, nanos(1_000), ts(T0)).await.unwrap();
    let idle = s.acquire("idle", 10, nanos(1_000), ts(T0)).await.unwrap();
    let later = ts(T0 + 2_000);

    let (holder, _) = hold_account(&s, "busy").await;
    let first = s.reclaim(later, 10).await.expect("first pass");
    let settled: Vec<&str> = first.reclaimed.iter().map(|r| r.lease_id.as_str()).collect();
    assert_eq!(settled, vec![idle.lease.lease_id.as_str()]);
    assert_eq!(lease_state(&s, &busy.lease).await, LeaseState::Active);
    holder.commit().await.expect("commit");

    let second = s.reclaim(later, 10).await.expect("second pass");
    let settled: Vec<&str> = second.reclaimed.iter().map(|r| r.lease_id.as_str()).collect();
    assert_eq!(settled, vec![busy.lease.lease_id.as_str()]);
    assert_eq!(counters(&s, "busy").await, (100, 100, 0, 0, 0, 0, 2));
    assert_conserved(&s).await;
}

/// An ingest for one account that names leases of two others (a buggy or
/// hostile gateway) locks neither lease, so it cannot close a cycle with a
/// writer that holds those accounts and takes their leases in another order.
/// The holder here plays that writer: it holds both accounts and the later
/// lease, and takes the earlier one once the ingest has run (or waits behind
/// it, which is the deadlock). Both events are rejected as unknown leases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ingest_naming_other_accounts_leases_never_deadlocks_with_their_writer() {
    let s = Arc::new(store(nanos(0)).await);
    for account in ["a", "b", "c"] {
        funded(&*s, account, 100).await;
    }
    let cred = credential(&*s, "c").await;
    let hour = nanos(3_600_000_000_000);
    let la = s.acquire("a", 10, hour, ts(T0)).await.unwrap();
    let lb = s.acquire("b", 10, hour, ts(T0)).await.unwrap();
    let (earlier, later) = if la.lease.lease_id < lb.lease.lease_id { (&la, &lb) } else { (&lb, &la) };

    let mut holder = s.pool().begin().await.expect("begin");
    let holder_pid = fixtures::backend_pid(&mut holder).await;
    let lock = |sql: &'static str, id: String| sqlx::query(sql).bind(id);
    let lock_accounts = "SELECT 1 FROM tollgate_accounts WHERE account_id = ANY(string_to_array($1, ',')) \
                         ORDER BY account_id FOR NO KEY UPDATE";
    let lock_lease = "SELECT 1 FROM tollgate_leases WHERE lease_id = $1 FOR UPDATE";
    lock(lock_accounts, "a,b".into()).execute(&mut *holder).await.expect("lock the accounts");
    lock(lock_lease, later.lease.lease_id.clone()).execute(&mut *holder).await.expect("lock the later lease");

    let mut ingesting = {
        let s = s.clone();
        let foreign_a = event("u-a", "c", &cred, 1, Some(&la));
        let foreign_b = event("u-b", "c", &cred, 1, Some(&lb));
        tokio::spawn(async move { s.ingest(vec![foreign_a, foreign_b], ts(T0)).await })
    };
    let ingested = tokio::select! {
        done = &mut ingesting => Some(done.unwrap()),
        _ = fixtures::statement_waiting_behind(s.pool(), holder_pid) => None,
    };
    // Whether or not the ingest finished, the holder now takes the earlier lease.
    let taken = lock(lock_lease, earlier.lease.lease_id.clone()).execute(&mut *holder).await;
    assert!(taken.is_ok(), "the holder takes the earlier lease: {taken:?}");
    holder.commit().await.expect("commit");
    let ingested = match ingested {
        Some(ingested) => ingested,
        None => ingesting.await.unwrap(),
    };
    let unknown = Outcome::Rejected(RejectReason::UnknownLease);
    assert_eq!(outcomes(ingested), vec![("u-a".into(), unknown), ("u-b".into(), unknown)]);
    assert_conserved(&*s).await;
}

/// A server writes from its last view of a row without reading it first. When
/// another server changed the row meanwhile, that view is stale: the write
/// changes nothing, and the operation decides on the committed row instead.
/// Every answer here is the one the committed state dictates.
#[tokio::test]
async fn another_servers_changes_are_decided_on_never_a_stale_view() {
    let (one, two) = two_servers(2).await;
    funded(&*one, "acct", 100).await;
    let cred = credential(&*one, "acct").await;
    let hour = nanos(3_600_000_000_000);

    // One's view after this: available 90, next fence 2.
    let first = one.acquire("acct", 10, hour, ts(T0)).await.unwrap();
    // Two takes fence 2 and 85 units; one's view is stale.
    assert_eq!(two.acquire("acct", 85, hour, ts(T0)).await.unwrap().lease.fencing_token, 2);
    assert_eq!(
        one.acquire("acct", 10, hour, ts(T0)).await.map(|l| l.lease.fencing_token),
        Err(Error::InsufficientBalance { available: 5, requested: 10 }),
        "refused on the committed balance, not granted on the view"
    );
    // Two credits 200; one's view (5 available) would refuse 150.
    two.credit("acct", "more", 200, jiff::Timestamp::UNIX_EPOCH).await.unwrap();
    let granted = one.acquire("acct", 150, hour, ts(T0)).await.expect("granted on the committed balance");
    assert_eq!(granted.lease.fencing_token, 3);

    // Usage reported through two; one releases from its view of `used` = 0.
    outcomes(two.ingest(vec![event("u-1", "acct", &cred, 4, Some(&first))], ts(T0)).await);
    let released =
        one.release(&first.lease.account_id, &first.lease.lease_id, first.capability.expose(), ts(T0)).await.unwrap();
    assert_eq!((released.lease.used, released.settlement.charged, released.settlement.returned), (4, 4, 6));
    // Two released a lease one still thinks active.
    two.release(&granted.lease.account_id, &granted.lease.lease_id, granted.capability.expose(), ts(T0)).await.unwrap();
    assert_eq!(
        one.release(&granted.lease.account_id, &granted.lease.lease_id, granted.capability.expose(), ts(T0))
            .await
            .map(|_| ()),
        Err(Error::LeaseNotActive { state: LeaseState::Released })
    );
    assert_eq!(counters(&*one, "acct").await, (300, 211, 85, 4, 0, 4, 4));
    assert_conserved(&*one).await;
}

/// Releases `lease` through `one`, running `between` after the release has
/// read the account and before it writes: another server's change in that
/// window is what the release's write must cope with. Returns the release's
/// answer and what `between` returned.
async fn release_around<T>(
    one: &Arc<PostgresStore>,
    lease: &IssuedLease,
    between: impl Future<Output = T>,
) -> (Result<Released, Error>, T) {
    let pause = one.pause_next_release_after_read();
    let releasing = {
        let (one, lease) = (one.clone(), lease.clone());
        tokio::spawn(async move {
            one.release(&lease.lease.account_id, &lease.lease.lease_id, lease.capability.expose(), ts(T0)).await
        })
    };
    pause.read.notified().await;
    let changed = between.await;
    pause.resume.notify_one();
    (releasing.await.unwrap(), changed)
}

/// A release that decided on a read remembers the account row its write
/// returned, not the row it read plus its change: another server's acquire
/// between the read and the write is in the row written, so the next
/// operation's first write, from the remembered row, finds it unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_remembers_the_account_row_it_wrote() {
    let (one, two) = two_servers(2).await;
    funded(&*one, "acct", 100).await;
    let hour = nanos(3_600_000_000_000);
    // Acquired through two, so one has no remembered row and reads.
    let lease = two.acquire("acct", 10, hour, ts(T0)).await.unwrap();

    let between = async {
        two.acquire("acct", 5, hour, ts(T0)).await.expect("traffic between the read and the write");
    };
    let (released, ()) = release_around(&one, &lease, between).await;
    released.expect("released");

    let committed = one.account("acct").await.unwrap().account;
    assert_eq!(one.remembered_account("acct"), Some(committed));
    let unwritten = one.unwritten_writes();
    one.acquire("acct", 1, hour, ts(T0)).await.expect("acquired");
    assert_eq!(one.unwritten_writes(), unwritten, "no write wasted on a wrong remembered row");
    assert_eq!(counters(&*one, "acct").await, (100, 94, 6, 0, 0, 0, 4));
    assert_conserved(&*one).await;
}

// ------------------------------------------------- settlement out of range

/// Sets one account's `available` directly, as no writer would: only so close
/// to `BIGINT`'s maximum that settling a lease must overflow it.
async fn set_available(s: &PostgresStore, account_id: &str, available: u64) {
    sqlx::query("UPDATE tollgate_accounts SET available = $2 WHERE account_id = $1")
        .bind(account_id)
        .bind(i64::try_from(available).unwrap())
        .execute(s.pool())
        .await
        .unwrap();
}

/// A release whose settlement would take `available` past `BIGINT` is
/// refused as `counter_overflow`, and neither the account nor the lease
/// changes.
#[tokio::test]
async fn a_release_whose_settlement_would_overflow_a_counter_changes_nothing() {
    let s = store(nanos(0)).await;
    funded(&s, "acct", 100).await;
    let lease = s.acquire("acct", 10, nanos(3_600_000_000_000), ts(T0)).await.unwrap();
    set_available(&s, "acct", I64_MAX - 5).await;
    let before = s.account("acct").await.unwrap();

    let released = s.release(&lease.lease.account_id, &lease.lease.lease_id, lease.capability.expose(), ts(T0)).await;
    assert_eq!(released.map(|r| r.settlement), Err(Error::CounterOverflow { counter: "available" }));
    assert_eq!(s.account("acct").await.unwrap(), before);
    assert_eq!(lease_state(&s, &lease.lease).await, LeaseState::Active);
}

/// A reclaim pass skips a lease whose settlement would overflow a counter of
/// its account, naming `counter_overflow`, settles the others, and is not
/// stalled by it: the next pass skips it again and finds nothing else.
#[tokio::test]
async fn a_reclaim_whose_settlement_would_overflow_a_counter_skips_that_lease() {
    let s = store(nanos(0)).await;
    funded(&s, "full", 100).await;
    funded(&s, "fine", 100).await;
    let stuck = s.acquire("full", 10, nanos(1_000), ts(T0)).await.unwrap();
    let due = s.acquire("fine", 10, nanos(1_000), ts(T0)).await.unwrap();
    set_available(&s, "full", I64_MAX - 5).await;
    let before = s.account("full").await.unwrap();

    let report = s.reclaim(ts(T0 + 10_000), 10).await.expect("reclaim pass");
    let reclaimed: Vec<&str> = report.reclaimed.iter().map(|r| r.lease_id.as_str()).collect();
    assert_eq!(reclaimed, vec![due.lease.lease_id.as_str()]);
    let skipped: Vec<(&str, &str)> =
        report.skipped.iter().map(|k| (k.lease_id.as_str(), k.account_id.as_str())).collect();
    assert_eq!(skipped, vec![(stuck.lease.lease_id.as_str(), "full")]);
    assert_eq!(report.skipped[0].reason, Error::CounterOverflow { counter: "available" }.to_string());
    assert_eq!(s.account("full").await.unwrap(), before);
    assert_eq!(lease_state(&s, &stuck.lease).await, LeaseState::Active);
    assert_eq!(lease_state(&s, &due.lease).await, LeaseState::Reclaimed);
    assert_eq!(counters(&s, "fine").await, (100, 100, 0, 0, 0, 0, 2));

    let again = s.reclaim(ts(T0 + 20_000), 10).await.expect("next pass");
    assert_eq!((again.reclaimed.len(), again.skipped.len()), (0, 1));
}

/// The unlocked release decides on a read, and PostgreSQL then refuses its
/// write for a range (`available` changed in between, so that adding the
/// release's change overflows `BIGINT`). Nothing is written; the release runs
/// the locking path, where the core gives its own answer, `counter_overflow`,
/// on the locked row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_write_postgres_refuses_for_its_ranges_falls_back_to_the_cores_error() {
    let (one, two) = two_servers(4).await;
    funded(&*one, "acct", 100).await;
    // Acquired through two, so one has no remembered row and reads.
    let lease = two.acquire("acct", 10, nanos(3_600_000_000_000), ts(T0)).await.unwrap();

    let between = async {
        set_available(&one, "acct", I64_MAX - 5).await;
        one.account("acct").await.unwrap()
    };
    let (released, before) = release_around(&one, &lease, between).await;
    assert_eq!(released.map(|r| r.settlement), Err(Error::CounterOverflow { counter: "available" }));
    assert_eq!(one.account("acct").await.unwrap(), before);
    assert_eq!(lease_state(&one, &lease.lease).await, LeaseState::Active);
    assert_eq!(one.unlocked_counts().fallbacks(UnlockedOperation::Release), 1, "counted as a fallback");
}

/// The unlocked path's counts (`Store::unlocked_counts`, which the server
/// exposes as `tollgate_store_stale_writes_total` and
/// `tollgate_store_fallbacks_total`): a write from a remembered row that
/// another server has changed since counts one stale write, and the
/// operation then succeeds on the unlocked path without falling back.
#[tokio::test]
async fn a_write_from_a_stale_remembered_row_counts_one_stale_write() {
    let (one, two) = two_servers(2).await;
    funded(&*one, "acct", 100).await;
    let hour = nanos(3_600_000_000_000);
    one.acquire("acct", 1, hour, ts(T0)).await.unwrap();
    two.acquire("acct", 1, hour, ts(T0)).await.unwrap();
    assert_eq!(one.unlocked_counts(), UnlockedCounts::default());

    let third = one.acquire("acct", 1, hour, ts(T0)).await.unwrap();
    assert_eq!(third.lease.fencing_token, 3, "decided on the committed row");
    let counts = one.unlocked_counts();
    assert_eq!(UnlockedOperation::ALL.map(|op| counts.stale_writes(op)), [1, 0, 0]);
    assert_eq!(UnlockedOperation::ALL.map(|op| counts.fallbacks(op)), [0, 0, 0]);
    assert_eq!(two.unlocked_counts(), UnlockedCounts::default());
}

/// Every store connection plans generically (its settings come in the
/// startup packet), so no prepared statement is re-planned per execution.
#[tokio::test]
async fn store_connections_use_generic_plans() {
    let s = store(nanos(0)).await;
    let mode: String = sqlx::query_scalar("SHOW plan_cache_mode").fetch_one(s.pool()).await.unwrap();
    assert_eq!(mode, "force_generic_plan");
}

// --------------------------------------------------------- startup, grace

/// A database holding a migration this binary does not know is refused at
/// startup, naming the version; nothing is served.
#[tokio::test]
async fn connect_refuses_a_database_from_a_newer_binary() {
    let db = TestDb::create_migrated().await;
    let (latest, future) = (latest_version(), latest_version() + 1);
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES ($1, 'from the future', true, '\\x00', 0)",
    )
    .bind(future)
    .execute(db.pool())
    .await
    .unwrap();
    let error = PostgresStore::connect(db.url(), policy(nanos(0))).await.err().expect("refused");
    assert!(
        matches!(error, ConnectError::Migration(MigrationError::UnknownVersion { version, catalogue_latest })
            if version == future && catalogue_latest == latest),
        "{error:?}"
    );
    assert!(error.to_string().contains(&format!("migration {future}")), "{error}");
    db.drop_now().await;
}

/// Restart durability: a new store on the same database, as after a server
/// restart, sees exactly what the previous one committed, and status reports
/// the schema current.
#[tokio::test]
async fn a_restarted_store_sees_everything_committed() {
    let db = TestDb::create().await;
    let url = db.url().to_owned();
    let first = PostgresStore::connect(&url, policy(nanos(7))).await.unwrap();
    assert_eq!(first.applied_migrations().iter().map(|m| m.version).collect::<Vec<_>>(), versions_from(1));
    funded(&first, "acct", 50).await;
    let cred = credential(&first, "acct").await;
    let lease = first.acquire("acct", 20, nanos(1_000), ts(T0)).await.unwrap();
    outcomes(first.ingest(vec![event("r", "acct", &cred, 4, Some(&lease))], ts(T0)).await);
    let before = counters(&first, "acct").await;
    first.pool().close().await;
    drop(first);

    let second = PostgresStore::connect(&url, policy(nanos(7))).await.unwrap();
    assert_eq!(second.applied_migrations(), &[]);
    second.pin_reclaim_grace(false).await.unwrap();
    assert_eq!(counters(&second, "acct").await, before);
    let stored = second.lease(&lease.lease.account_id, &lease.lease.lease_id).await.unwrap();
    assert_eq!(stored, tollgate_core::Lease { used: 4, ..lease.lease.clone() });
    let replay = second.ingest(vec![event("r", "acct", &cred, 4, Some(&lease))], ts(T0)).await;
    assert_eq!(outcomes(replay), vec![("r".into(), Outcome::Duplicate)]);
    let released = second
        .release(&lease.lease.account_id, &lease.lease.lease_id, lease.capability.expose(), ts(T0))
        .await
        .unwrap();
    assert_eq!((released.settlement.charged, released.settlement.returned), (4, 16));
    let status = second.status().await.unwrap();
    let migrations = status.migrations.expect("postgres has a schema");
    assert!(migrations.is_current(), "{migrations:?}");
    assert_eq!(status.backend, "postgres");
    assert_conserved(&second).await;
    second.pool().close().await;
    db.drop_now().await;
}

/// Servers sharing a database share one reclaim grace: the first records it,
/// a different one is refused unless an operator replaces it explicitly.
#[tokio::test]
async fn reclaim_grace_is_pinned_across_servers() {
    let db = TestDb::create().await;
    let url = db.url().to_owned();
    let grace = nanos(1_500);
    let first = PostgresStore::connect(&url, policy(grace)).await.unwrap();
    first.pin_reclaim_grace(false).await.unwrap();
    first.pin_reclaim_grace(false).await.unwrap();

    let other = PostgresStore::connect(&url, policy(nanos(1_501))).await.unwrap();
    assert_eq!(
        other.pin_reclaim_grace(false).await.unwrap_err(),
        Error::ReclaimGraceMismatch { recorded: grace.to_string(), configured: nanos(1_501).to_string() }
    );
    other.pin_reclaim_grace(true).await.unwrap();
    other.pin_reclaim_grace(false).await.unwrap();
    assert!(matches!(first.pin_reclaim_grace(false).await, Err(Error::ReclaimGraceMismatch { .. })));
    for store in [first, other] {
        store.pool().close().await;
    }
    db.drop_now().await;
}

/// Two servers starting together: one server's record of the grace is still
/// uncommitted while the other pins it. The second waits for the first and
/// then finds the grace recorded once; neither reports corruption.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_starting_together_record_the_grace_once() {
    let grace = nanos(1_500);
    let s = Arc::new(store(grace).await);
    let mut first = s.pool().begin().await.expect("begin");
    let first_pid = fixtures::backend_pid(&mut first).await;
    sqlx::query("INSERT INTO tollgate_settings (key, value) VALUES ('reclaim_grace', $1)")
        .bind(grace.to_string())
        .execute(&mut *first)
        .await
        .expect("the other server records the grace");
    let pinning = {
        let s = s.clone();
        tokio::spawn(async move { s.pin_reclaim_grace(false).await })
    };
    let waiting = fixtures::statement_waiting_behind(s.pool(), first_pid).await;
    assert!(waiting.contains("tollgate_settings"), "waits for the other server's insert: {waiting}");
    first.commit().await.expect("commit");

    assert_eq!(pinning.await.unwrap(), Ok(()));
    let recorded: Vec<String> = sqlx::query_scalar("SELECT value FROM tollgate_settings WHERE key = 'reclaim_grace'")
        .fetch_all(s.pool())
        .await
        .unwrap();
    assert_eq!(recorded, vec![grace.to_string()]);
}

/// PostgreSQL text cannot hold NUL: such identifiers are simply never found,
/// and a batch naming one is still classified event by event.
#[tokio::test]
async fn identifiers_postgres_cannot_store_are_not_found() {
    let s = store(nanos(0)).await;
    funded(&s, "acct", 10).await;
    let cred = credential(&s, "acct").await;
    assert_eq!(s.account("a\0b").await.unwrap_err(), Error::AccountNotFound);
    assert_eq!(s.lease("acct", "l\0").await.unwrap_err(), Error::LeaseNotFound);
    assert_eq!(s.lease("a\0", "l").await.unwrap_err(), Error::LeaseNotFound);
    assert_eq!(s.release("acct", "l\0", "cap", ts(T0)).await.unwrap_err(), Error::LeaseNotFound);
    assert_eq!(s.release("a\0", "l", "cap", ts(T0)).await.unwrap_err(), Error::LeaseNotFound);
    assert_eq!(s.credential("a\0", &cred).await.unwrap_err(), Error::CredentialNotFound);
    assert_eq!(s.revoke_credential("a\0", &cred, ts(T0)).await.unwrap_err(), Error::CredentialNotFound);
    assert!(!s.verify_credential(&format!("tgk_a\0_{}", "0".repeat(64))).await.unwrap().valid);
    assert_eq!(s.acquire("a\0", 1, nanos(1), ts(T0)).await.unwrap_err(), Error::AccountNotFound);
    assert_eq!(s.issue_credential("acct", "bad\0label", ts(T0)).await.unwrap_err(), Error::InvalidLabel);
    let batch = vec![event("x", "a\0", &cred, 1, None), event("y", "acct", &cred, 1, None)];
    assert_eq!(
        outcomes(s.ingest(batch, ts(T0)).await),
        vec![("x".into(), Outcome::Rejected(RejectReason::UnknownAccount)), ("y".into(), Outcome::Accepted)]
    );
    assert_conserved(&s).await;
}

// ------------------------------------------------------------ legacy leases

/// "Existing HTTP clients and retained lease capabilities continue to
/// work with the upgraded service", and ordinary release or reclaim drains the
/// active legacy bounds. A lease written by a 0016-era binary is released with
/// its capability; another is reclaimed exactly at its recorded upper bound.
#[tokio::test]
async fn legacy_leases_drain_through_release_and_reclaim_after_0017() {
    let db = TestDb::create().await;
    db.migrate_through(16).await.unwrap();
    let capability = "tgc_legacy";
    // Two legacy grants of 10 units; the second truncated from 1_700_000_000_000_000_500 ns.
    sqlx::query(
        "INSERT INTO tollgate_accounts (account_id, credited, available, reserved, next_fence) \
         VALUES ('acct', 100, 80, 20, 3)",
    )
    .execute(db.pool())
    .await
    .unwrap();
    for (lease_id, fence, expires_at_us) in
        [("old-1", 1_i64, 1_700_000_000_000_000_i64), ("old-2", 2, 1_700_000_000_000_000)]
    {
        sqlx::query(
            "INSERT INTO tollgate_leases (lease_id, account_id, fencing_token, capability_hash, \
             granted, used, state, expires_at_us) VALUES ($1, 'acct', $2, $3, 10, 0, 'active', $4)",
        )
        .bind(lease_id)
        .bind(fence)
        .bind(SecretHash::of(capability).as_bytes().to_vec())
        .bind(expires_at_us)
        .execute(db.pool())
        .await
        .unwrap();
    }
    let s = PostgresStore::on_test_db(db, policy(nanos(0))).await.unwrap();
    assert_eq!(s.applied_migrations().iter().map(|m| m.version).collect::<Vec<_>>(), versions_from(17));

    // The recorded upper bound is the stored µs + 999 ns.
    let bound = 1_700_000_000_000_000_999_i128;
    let old_1 = s.lease("acct", "old-1").await.unwrap();
    assert_eq!((old_1.expiry, old_1.expiry_is_upper_bound), (ts(bound), true));
    let released = s.release("acct", "old-1", capability, ts(bound - 1)).await.unwrap();
    assert_eq!(released.settlement.returned, 10);

    assert!(s.reclaim(ts(bound - 1), 10).await.unwrap().reclaimed.is_empty());
    let reclaimed = s.reclaim(ts(bound), 10).await.unwrap().reclaimed;
    assert_eq!(reclaimed.iter().map(|r| r.lease_id.as_str()).collect::<Vec<_>>(), vec!["old-2"]);

    // A new grant is exact; the legacy marker stays on settled history.
    let fresh = s.acquire("acct", 5, nanos(1), ts(T0)).await.unwrap();
    assert_eq!(fresh.lease.fencing_token, 3);
    let report = s.check().await.unwrap();
    assert_eq!(report.violations, vec![]);
    assert_eq!(
        report.legacy_bounds,
        vec![
            LegacyBoundCount { state: LeaseState::Active, expiry_is_upper_bound: false, count: 1 },
            LegacyBoundCount { state: LeaseState::Released, expiry_is_upper_bound: true, count: 1 },
            LegacyBoundCount { state: LeaseState::Reclaimed, expiry_is_upper_bound: true, count: 1 },
        ]
    );
}
