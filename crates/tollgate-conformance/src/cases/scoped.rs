//! Every lease and credential is found under its account: named under
//! another account it is not found, exactly like an unknown one, and nothing
//! changes; a key whose account part was altered is unknown.

use tollgate_core::{Error, LeaseState};
use tollgate_store::{Idempotency, IdempotencyKey, Release, Revocation, Store};

use super::T0;
use crate::StoreFactory;
use crate::support::*;

fn key(value: &str) -> Idempotency {
    Idempotency { key: IdempotencyKey::parse(value).expect("valid key"), retention: secs(60) }
}

/// A lease read, released (with or without a key) or consolidated under
/// another account, existing or not, is `lease_not_found`, even with its
/// own capability; both ledgers stay as they were and the lease stays
/// active. A keyed release recorded under its own account is not replayed
/// under another.
pub async fn a_lease_under_another_account_is_not_found_and_nothing_changes<F: StoreFactory>(f: &F) {
    let s = funded_store(f, &[("a", 100), ("b", 100)]).await;
    let now = ts(T0);
    let held = s.acquire("a", 10, secs(60), now).await.unwrap();
    let b_lease = s.acquire("b", 5, secs(60), now).await.unwrap();
    let (id, capability) = (held.lease.lease_id.as_str(), held.capability.expose());
    let a_held = ledger! { credited: 100, available: 90, reserved: 10, next_fence: 2, active_leases: 1 };
    let b_held = ledger! { credited: 100, available: 95, reserved: 5, next_fence: 2, active_leases: 1 };

    for account in ["b", "ghost"] {
        assert_eq!(s.lease(account, id).await.unwrap_err(), Error::LeaseNotFound, "{account}");
        assert_eq!(s.release(account, id, capability, now).await.unwrap_err(), Error::LeaseNotFound, "{account}");
        let keyed = s
            .release_idempotent(
                Some(&key("wrong-account-1")),
                Release { account_id: account, lease_id: id, capability },
                now,
            )
            .await;
        assert_eq!(keyed.unwrap_err(), Error::LeaseNotFound, "{account}");
        assert_ledger(&s, "a", a_held).await;
        assert_ledger(&s, "b", b_held).await;
    }
    let foreign = s.consolidate("b", &[handle(&b_lease), handle(&held)], 0, secs(60), now).await;
    assert_eq!(foreign.unwrap_err(), Error::LeaseNotFound);
    assert_ledger(&s, "a", a_held).await;
    assert_ledger(&s, "b", b_held).await;
    assert_eq!(s.lease("a", id).await.unwrap().state, LeaseState::Active);
    assert_eq!(s.lease("b", &b_lease.lease.lease_id).await.unwrap().state, LeaseState::Active);

    // Under its own account the same key settles it once, and the record
    // answers only there.
    let k = key("scoped-release-1");
    let released =
        s.release_idempotent(Some(&k), Release { account_id: "a", lease_id: id, capability }, now).await.unwrap();
    assert_eq!(released.lease.state, LeaseState::Released);
    assert_eq!(
        s.release_idempotent(Some(&k), Release { account_id: "a", lease_id: id, capability }, now).await.unwrap(),
        released
    );
    let elsewhere = s.release_idempotent(Some(&k), Release { account_id: "b", lease_id: id, capability }, now).await;
    assert_eq!(elsewhere.unwrap_err(), Error::LeaseNotFound);
    assert_ledger(&s, "a", Ledger { available: 100, reserved: 0, active_leases: 0, ..a_held }).await;
    assert_ledger(&s, "b", b_held).await;
}

/// A credential read or revoked (with or without a key) under another
/// account is `credential_not_found`, and it stays unrevoked and valid.
pub async fn a_credential_under_another_account_is_not_found_and_stays_valid<F: StoreFactory>(f: &F) {
    let s = funded_store(f, &[("a", 0), ("b", 0)]).await;
    let now = ts(T0);
    let issued = s.issue_credential("a", "edge", now).await.unwrap();
    let id = issued.credential.credential_id.as_str();
    for account in ["b", "ghost"] {
        assert_eq!(s.credential(account, id).await.unwrap_err(), Error::CredentialNotFound, "{account}");
        assert_eq!(s.revoke_credential(account, id, now).await.unwrap_err(), Error::CredentialNotFound);
        let elsewhere = Revocation { account_id: account, credential_id: id };
        let keyed = s.revoke_credential_idempotent(Some(&key("wrong-account-2")), elsewhere, now).await;
        assert_eq!(keyed.unwrap_err(), Error::CredentialNotFound, "{account}");
    }
    assert_eq!(s.credential("a", id).await.unwrap(), issued.credential);
    assert!(s.verify_credential(issued.key.expose()).await.unwrap().valid);
    let revoked = s.revoke_credential("a", id, ts(T0 + 1)).await.unwrap();
    assert_eq!(revoked.revoked_at, Some(ts(T0 + 1)));
}

/// A key names its account and is looked up there only: with its account
/// part changed to another account (one that holds credentials of its own,
/// or none), or in any malformed form, it is `unknown_credential`, which
/// says nothing about whether the secret exists elsewhere. Account ids with
/// `_` route like any other.
pub async fn a_key_whose_account_part_was_altered_is_unknown<F: StoreFactory>(f: &F) {
    let s = f.create(with_grace(nanos(0))).await;
    let now = ts(T0);
    for account in ["a", "b", "a_b", "a_b_c"] {
        funded(&s, account, 0).await;
    }
    let a = s.issue_credential("a", "edge", now).await.unwrap();
    let b = s.issue_credential("b", "edge", now).await.unwrap();
    let underscored = s.issue_credential("a_b", "edge", now).await.unwrap();
    for issued in [&a, &b, &underscored] {
        let verdict = s.verify_credential(issued.key.expose()).await.unwrap();
        assert!(verdict.valid, "{:?}", issued.credential);
        assert_eq!(verdict.account_id.as_deref(), Some(issued.credential.account_id.as_str()));
    }
    let secret = a.key.expose().strip_prefix("tgk_a_").expect("the key names its account");
    let altered = [
        format!("tgk_b_{secret}"),
        format!("tgk_ghost_{secret}"),
        format!("tgk_a_b_{secret}"),
        format!("tgk_{secret}"),
        format!("tgk_a_{}", secret.to_uppercase()),
        format!("tgk_a_{}", &secret[1..]),
        format!("tgk_a_{secret}_"),
        format!("a_{secret}"),
        secret.to_owned(),
        String::new(),
    ];
    for key in &altered {
        let verdict = s.verify_credential(key).await.unwrap();
        assert_eq!(
            (verdict.valid, verdict.credential_id, verdict.account_id, verdict.reason),
            (false, None, None, Some("unknown_credential")),
            "{key}"
        );
    }
    // The key of `a_b` does not verify as a key of `a_b_c` either.
    let secret = underscored.key.expose().strip_prefix("tgk_a_b_").expect("the key names its account");
    assert!(!s.verify_credential(&format!("tgk_a_b_c_{secret}")).await.unwrap().valid);
}
