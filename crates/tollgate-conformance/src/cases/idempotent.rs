//! Idempotent retries: a keyed retry answers with the original answer and applies
//! nothing again; a key reused for another request changes nothing.

use tollgate_core::{Error, LeaseState};
use tollgate_store::{
    Acquisition, Consolidation, Idempotency, IdempotencyKey, NewCredential, Release, Revocation, Store,
};

use super::T0;
use crate::StoreFactory;
use crate::support::*;

/// Records answer retries for a minute in these cases.
const RETENTION_S: i64 = 60;

fn key(value: &str) -> Idempotency {
    Idempotency { key: IdempotencyKey::parse(value).expect("valid key"), retention: secs(RETENTION_S) }
}

/// One instant past the retention of a record written at `T0`.
fn expired_at_t0() -> i128 {
    T0 + i128::from(RETENTION_S) * 1_000_000_000
}

pub async fn keyed_acquire_replays_once_and_refuses_reuse<F: StoreFactory>(f: &F) {
    let s = funded_store(f, &[("acct", 100), ("other", 100)]).await;
    let k = key("3f0c1a52-0d1e-4c2b-9a7e-6b5d4c3b2a19");
    let first = s
        .acquire_idempotent(Some(&k), Acquisition { account_id: "acct", units: 10, ttl: secs(30) }, ts(T0))
        .await
        .unwrap();
    let once = ledger! { credited: 100, available: 90, reserved: 10, next_fence: 2, active_leases: 1 };
    assert_ledger(&s, "acct", once).await;

    // A retry later, even after the lease was used up, is the original answer.
    let retry = s
        .acquire_idempotent(Some(&k), Acquisition { account_id: "acct", units: 10, ttl: secs(30) }, ts(T0 + 5))
        .await
        .unwrap();
    assert_eq!(retry, first, "same lease id, fence, expiry and capability");
    assert_ledger(&s, "acct", once).await;

    // The same key with other arguments changes nothing.
    let reused =
        s.acquire_idempotent(Some(&k), Acquisition { account_id: "acct", units: 11, ttl: secs(30) }, ts(T0 + 5)).await;
    assert_eq!(reused.unwrap_err(), Error::IdempotencyKeyReused);
    let reused =
        s.acquire_idempotent(Some(&k), Acquisition { account_id: "acct", units: 10, ttl: secs(31) }, ts(T0 + 5)).await;
    assert_eq!(reused.unwrap_err(), Error::IdempotencyKeyReused);
    assert_ledger(&s, "acct", once).await;

    // Keys are scoped by account: the same key elsewhere is a new request.
    let elsewhere = s
        .acquire_idempotent(Some(&k), Acquisition { account_id: "other", units: 10, ttl: secs(30) }, ts(T0))
        .await
        .unwrap();
    assert_ne!(elsewhere.lease.lease_id, first.lease.lease_id);
    assert_ledger(&s, "other", once).await;

    // At the end of retention the key is new again.
    let renewed = s
        .acquire_idempotent(Some(&k), Acquisition { account_id: "acct", units: 10, ttl: secs(30) }, ts(expired_at_t0()))
        .await
        .unwrap();
    assert_ne!(renewed.lease.lease_id, first.lease.lease_id);
    assert_eq!(renewed.lease.fencing_token, 2);
    let twice = ledger! { credited: 100, available: 80, reserved: 20, next_fence: 3, active_leases: 2 };
    assert_ledger(&s, "acct", twice).await;
    // And the renewed record answers its own retries.
    let retry = s
        .acquire_idempotent(
            Some(&k),
            Acquisition { account_id: "acct", units: 10, ttl: secs(30) },
            ts(expired_at_t0() + 1),
        )
        .await
        .unwrap();
    assert_eq!(retry, renewed);
    assert_ledger(&s, "acct", twice).await;
}

pub async fn keyed_release_and_consolidate_replay_without_settling_twice<F: StoreFactory>(f: &F) {
    let s = funded_store(f, &[("acct", 100)]).await;
    let a = s.acquire("acct", 10, secs(30), ts(T0)).await.unwrap();
    let b = s.acquire("acct", 20, secs(30), ts(T0)).await.unwrap();
    let c = s.acquire("acct", 30, secs(30), ts(T0)).await.unwrap();
    let k = key("release-key-0001");

    let released = s
        .release_idempotent(
            Some(&k),
            Release { account_id: &a.lease.account_id, lease_id: &a.lease.lease_id, capability: a.capability.expose() },
            ts(T0 + 1),
        )
        .await
        .unwrap();
    assert_eq!(released.lease.state, LeaseState::Released);
    let after_release = ledger! { credited: 100, available: 50, reserved: 50, next_fence: 4, active_leases: 2 };
    assert_ledger(&s, "acct", after_release).await;
    // Unkeyed, a second release is refused; keyed, it is the first answer.
    let retry = s
        .release_idempotent(
            Some(&k),
            Release { account_id: &a.lease.account_id, lease_id: &a.lease.lease_id, capability: a.capability.expose() },
            ts(T0 + 2),
        )
        .await;
    assert_eq!(retry.unwrap(), released);
    let reused = s
        .release_idempotent(
            Some(&k),
            Release { account_id: &a.lease.account_id, lease_id: &a.lease.lease_id, capability: "tgc_other" },
            ts(T0 + 2),
        )
        .await;
    assert_eq!(reused.unwrap_err(), Error::IdempotencyKeyReused);
    assert_ledger(&s, "acct", after_release).await;

    let k = key("consolidate-key-0001");
    let sources = [handle(&b), handle(&c)];
    let merge = Consolidation { account_id: "acct", sources: &sources, extra_units: 5, ttl: secs(30) };
    let merged = s.consolidate_idempotent(Some(&k), merge, ts(T0 + 3)).await.unwrap();
    let after_merge = ledger! { credited: 100, available: 45, reserved: 55, next_fence: 5, active_leases: 1 };
    assert_ledger(&s, "acct", after_merge).await;
    let retry = s.consolidate_idempotent(Some(&k), merge, ts(T0 + 4)).await.unwrap();
    assert_eq!(retry, merged);
    let reused = s.consolidate_idempotent(Some(&k), Consolidation { extra_units: 6, ..merge }, ts(T0 + 4)).await;
    assert_eq!(reused.unwrap_err(), Error::IdempotencyKeyReused);
    assert_ledger(&s, "acct", after_merge).await;
}

pub async fn keyed_credential_issue_and_revoke_replay<F: StoreFactory>(f: &F) {
    let s = funded_store(f, &[("acct", 0)]).await;
    let k = key("issue-key-0001");
    let edge = NewCredential { account_id: "acct", label: "edge" };
    let issued = s.issue_credential_idempotent(Some(&k), edge, ts(T0)).await.unwrap();
    let retry = s.issue_credential_idempotent(Some(&k), edge, ts(T0 + 1)).await.unwrap();
    assert_eq!(retry, issued, "same credential id and key");
    let verdict = s.verify_credential(retry.key.expose()).await.unwrap();
    assert_eq!(verdict.credential_id.as_deref(), Some(issued.credential.credential_id.as_str()));
    let reused = s.issue_credential_idempotent(Some(&k), NewCredential { label: "other", ..edge }, ts(T0 + 1)).await;
    assert_eq!(reused.unwrap_err(), Error::IdempotencyKeyReused);

    let id = &issued.credential.credential_id;
    let k = key("revoke-key-0001");
    let revocation = Revocation { account_id: "acct", credential_id: id };
    let revoked = s.revoke_credential_idempotent(Some(&k), revocation, ts(T0 + 10)).await.unwrap();
    assert_eq!(revoked.revoked_at, Some(ts(T0 + 10)));
    let retry = s.revoke_credential_idempotent(Some(&k), revocation, ts(T0 + 20)).await.unwrap();
    assert_eq!(retry, revoked);
    assert_eq!(s.credential("acct", id).await.unwrap(), revoked);
    // The same key on another credential is another scope.
    let second = s.issue_credential("acct", "second", ts(T0)).await.unwrap();
    let revocation = Revocation { credential_id: &second.credential.credential_id, ..revocation };
    let other = s.revoke_credential_idempotent(Some(&k), revocation, ts(T0 + 30)).await;
    assert_eq!(other.unwrap().revoked_at, Some(ts(T0 + 30)));
}

/// A refused operation changed nothing, so nothing is recorded and its retry
/// runs again.
pub async fn refused_keyed_requests_record_nothing<F: StoreFactory>(f: &F) {
    let s = funded_store(f, &[("acct", 5)]).await;
    let k = key("refused-key-0001");
    let refused =
        s.acquire_idempotent(Some(&k), Acquisition { account_id: "acct", units: 10, ttl: secs(30) }, ts(T0)).await;
    assert_eq!(refused.unwrap_err(), Error::InsufficientBalance { available: 5, requested: 10 });
    s.credit("acct", "top-up", 5, jiff::Timestamp::UNIX_EPOCH).await.unwrap();
    let granted = s
        .acquire_idempotent(Some(&k), Acquisition { account_id: "acct", units: 10, ttl: secs(30) }, ts(T0 + 1))
        .await
        .unwrap();
    assert_eq!(granted.lease.granted, 10);
    let once = ledger! { credited: 10, available: 0, reserved: 10, next_fence: 2, active_leases: 1 };
    assert_ledger(&s, "acct", once).await;
    let missing = Revocation { account_id: "acct", credential_id: "cred_missing" };
    let missing = s.revoke_credential_idempotent(Some(&k), missing, ts(T0)).await;
    assert_eq!(missing.unwrap_err(), Error::CredentialNotFound);
    let missing = s
        .release_idempotent(
            Some(&k),
            Release { account_id: "acct", lease_id: "lse_missing", capability: "tgc_any" },
            ts(T0),
        )
        .await;
    assert_eq!(missing.unwrap_err(), Error::LeaseNotFound);
    let missing =
        s.acquire_idempotent(Some(&k), Acquisition { account_id: "nobody", units: 1, ttl: secs(30) }, ts(T0)).await;
    assert_eq!(missing.unwrap_err(), Error::AccountNotFound);
    assert_ledger(&s, "acct", once).await;
}

pub async fn expired_idempotency_records_are_purged_in_bounded_batches<F: StoreFactory>(f: &F) {
    let s = funded_store(f, &[("acct", 100)]).await;
    for (i, value) in ["purge-key-1", "purge-key-2", "purge-key-3"].into_iter().enumerate() {
        s.acquire_idempotent(
            Some(&key(value)),
            Acquisition { account_id: "acct", units: 1, ttl: secs(30) },
            ts(T0 + i as i128),
        )
        .await
        .unwrap();
    }
    assert_eq!(s.purge_idempotency(ts(expired_at_t0() - 1), 10).await.unwrap(), 0, "nothing expired yet");
    assert_eq!(s.purge_idempotency(ts(expired_at_t0() + 1), 10).await.unwrap(), 2);
    assert_eq!(s.purge_idempotency(ts(expired_at_t0() + 2), 0).await.unwrap(), 0, "a zero bound purges nothing");
    assert_eq!(s.purge_idempotency(ts(expired_at_t0() + 2), 10).await.unwrap(), 1);
    assert_eq!(s.purge_idempotency(ts(expired_at_t0() + 2), 10).await.unwrap(), 0);
}
