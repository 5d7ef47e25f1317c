//! PostgreSQL-only behaviour of keyed requests: concurrent retries with one key
//! apply one effect, and the stored record reveals no secret of its answer.
//! Each test has its own database.

use std::sync::Arc;

use jiff::{SignedDuration, Timestamp};
use sqlx::PgPool;
use tollgate_core::{GrantPolicy, SecretHash};
use tollgate_pg::PostgresStore;
use tollgate_pg::testing::TestDb;
use tollgate_store::{Acquisition, Idempotency, IdempotencyKey, NewCredential, Release, Store};

use crate::fixtures;

const T0: i128 = 1_700_000_000_123_456_789;

fn ts(ns: i128) -> Timestamp {
    Timestamp::from_nanosecond(ns).expect("instant in the domain")
}

async fn store() -> PostgresStore {
    let policy = GrantPolicy::new(SignedDuration::from_secs(3_600), SignedDuration::ZERO, 100).expect("policy");
    PostgresStore::on_test_db(TestDb::create().await, policy).await.expect("store")
}

fn key(value: &str) -> Idempotency {
    Idempotency { key: IdempotencyKey::parse(value).expect("key"), retention: SignedDuration::from_hours(24) }
}

async fn funded(s: &PostgresStore, account_id: &str, units: u64) {
    s.create_account(account_id).await.expect("account");
    s.credit(account_id, "seed", units, jiff::Timestamp::UNIX_EPOCH).await.expect("credit");
}

/// Every byte of every stored idempotency row.
async fn stored_rows(pool: &PgPool) -> Vec<Vec<u8>> {
    sqlx::query_scalar(
        "SELECT convert_to(account_id, 'UTF8') || lookup_id || fingerprint || sealed_answer \
         FROM tollgate_idempotency_keys ORDER BY lookup_id",
    )
    .fetch_all(pool)
    .await
    .expect("idempotency rows")
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|window| window == needle)
}

/// The backend whose current statement contains `fragment` and waits for a
/// lock, as PostgreSQL reports it.
async fn waiting_in(observer: &PgPool, fragment: &str) -> i32 {
    fixtures::poll_until(&format!("no backend ever waited in {fragment}"), || async move {
        sqlx::query_scalar(
            "SELECT a.pid FROM pg_stat_activity a \
             WHERE a.wait_event_type = 'Lock' AND strpos(a.query, $1) > 0 ORDER BY a.pid LIMIT 1",
        )
        .bind(fragment)
        .fetch_optional(observer)
        .await
        .expect("pg_stat_activity")
    })
    .await
}

/// Two acquires with one key, the second sent while the first is still in its
/// transaction: the second waits on the first's key row, then answers with
/// the first's lease. One lease is granted, and one row is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_with_one_key_apply_one_effect() {
    let s = Arc::new(store().await);
    funded(&s, "acct", 100).await;
    let k = key("5b0f2e7c-8a41-4d3b-9c62-0e1f2a3b4c5d");

    // Hold the account so that the first request stops inside its transaction,
    // after claiming the key.
    let mut holder = s.pool().begin().await.expect("begin");
    let holder_pid = fixtures::backend_pid(&mut holder).await;
    sqlx::query("SELECT 1 FROM tollgate_accounts WHERE account_id = 'acct' FOR NO KEY UPDATE")
        .fetch_one(&mut *holder)
        .await
        .expect("lock the account");
    let acquire = |s: Arc<PostgresStore>, k: Idempotency| {
        tokio::spawn(async move {
            s.acquire_idempotent(
                Some(&k),
                Acquisition { account_id: "acct", units: 10, ttl: SignedDuration::from_secs(60) },
                ts(T0),
            )
            .await
        })
    };
    let first = acquire(s.clone(), k.clone());
    let waiting = fixtures::statement_waiting_behind(s.pool(), holder_pid).await;
    assert!(waiting.contains("FROM tollgate_accounts a WHERE a.account_id = $1 FOR NO KEY UPDATE"), "{waiting}");

    let second = acquire(s.clone(), k.clone());
    let second_pid = waiting_in(s.pool(), "INSERT INTO tollgate_idempotency_keys").await;
    let blockers: Vec<i32> = sqlx::query_scalar("SELECT unnest(pg_blocking_pids($1))")
        .bind(second_pid)
        .fetch_all(s.pool())
        .await
        .expect("pg_blocking_pids");
    assert!(!blockers.contains(&holder_pid), "the second waits on the first's key, not on the account");
    holder.commit().await.expect("commit");

    let first = first.await.unwrap().expect("first acquire");
    let second = second.await.unwrap().expect("second acquire replays");
    assert_eq!(second, first);
    let account = s.account("acct").await.unwrap();
    assert_eq!((account.account.available, account.account.reserved, account.active_leases), (90, 10, 1));
    assert_eq!(stored_rows(s.pool()).await.len(), 1);
}

/// The stored row holds neither the capability nor the credential key, in
/// plaintext or as the hash the lease and credential rows keep; and a refused
/// request leaves no row.
#[tokio::test]
async fn stored_records_reveal_no_secret_and_refusals_store_nothing() {
    let s = store().await;
    funded(&s, "acct", 100).await;
    let refused = key("refused-1");
    let refused = s
        .acquire_idempotent(
            Some(&refused),
            Acquisition { account_id: "acct", units: 1_000, ttl: SignedDuration::from_secs(60) },
            ts(T0),
        )
        .await;
    assert!(refused.is_err());
    assert_eq!(stored_rows(s.pool()).await.len(), 0, "a refusal is not recorded");

    let lease = s
        .acquire_idempotent(
            Some(&key("acquire-1")),
            Acquisition { account_id: "acct", units: 10, ttl: SignedDuration::from_secs(60) },
            ts(T0),
        )
        .await
        .expect("acquired");
    let edge = NewCredential { account_id: "acct", label: "edge" };
    let issued = s.issue_credential_idempotent(Some(&key("issue-1")), edge, ts(T0)).await.expect("issued");
    let released = s
        .release_idempotent(
            Some(&key("release-1")),
            Release {
                account_id: &lease.lease.account_id,
                lease_id: &lease.lease.lease_id,
                capability: lease.capability.expose(),
            },
            ts(T0 + 1),
        )
        .await
        .expect("released");
    assert_eq!(released.lease.lease_id, lease.lease.lease_id);
    let rows = stored_rows(s.pool()).await;
    assert_eq!(rows.len(), 3);
    let secrets = [lease.capability.expose(), issued.key.expose(), "acquire-1", "issue-1", "release-1"];
    for row in &rows {
        for secret in secrets {
            assert!(!contains(row, secret.as_bytes()), "a row holds {secret} in plaintext");
            assert!(!contains(row, SecretHash::of(secret).as_bytes()), "a row holds the hash of {secret}");
            let hex: String = SecretHash::of(secret).as_bytes().iter().map(|b| format!("{b:02x}")).collect();
            assert!(!contains(row, hex.as_bytes()), "a row holds the hex hash of {secret}");
        }
    }
    // Each row is stored under the account of the resource it names, release included.
    let accounts: Vec<String> = sqlx::query_scalar("SELECT DISTINCT account_id FROM tollgate_idempotency_keys")
        .fetch_all(s.pool())
        .await
        .expect("accounts");
    assert_eq!(accounts, ["acct"]);
}
