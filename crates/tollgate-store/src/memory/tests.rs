use jiff::SignedDuration;

use super::*;

fn at(ns: i64) -> Timestamp {
    Timestamp::from_nanosecond(i128::from(ns)).expect("instant")
}

/// The memory store cannot be corrupted through its API; the one
/// corruption it can hold is a lease whose account is gone, made here by
/// removing the account directly. That lease is skipped and reported, and
/// the healthy due lease behind it in expiry order is still settled by
/// the same pass, even when the pass's bound is one lease.
#[tokio::test]
async fn reclaim_skips_a_lease_of_a_missing_account_and_settles_the_rest() {
    let policy = GrantPolicy::new(SignedDuration::from_secs(3_600), SignedDuration::ZERO, 100).unwrap();
    let store = MemoryStore::new(policy);
    for account in ["broken", "healthy"] {
        store.create_account(account).await.unwrap();
        store.credit(account, "seed", 100, jiff::Timestamp::UNIX_EPOCH).await.unwrap();
    }
    let broken = store.acquire("broken", 10, SignedDuration::from_nanos(1_000), at(0)).await.unwrap();
    let healthy = store.acquire("healthy", 10, SignedDuration::from_nanos(2_000), at(0)).await.unwrap();
    store.lock().accounts.forget("broken");

    // The second pass finds the corrupt lease again, and nothing else.
    for expected in [vec![healthy.lease.lease_id.clone()], vec![]] {
        let report = store.reclaim(at(5_000), 1).await.expect("the pass succeeds around the corrupt lease");
        assert_eq!(report.reclaimed.iter().map(|r| r.lease_id.clone()).collect::<Vec<_>>(), expected);
        assert_eq!(
            report.skipped.iter().map(|s| (s.lease_id.as_str(), s.account_id.as_str())).collect::<Vec<_>>(),
            vec![(broken.lease.lease_id.as_str(), "broken")]
        );
        assert!(report.skipped[0].reason.contains("missing account"), "{:?}", report.skipped);
    }
    let healthy_now = store.lease("healthy", &healthy.lease.lease_id).await.unwrap();
    assert_eq!(healthy_now.state, LeaseState::Reclaimed);
    assert_eq!(store.account("healthy").await.unwrap().account.available, 100);
}
