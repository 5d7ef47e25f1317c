use jiff::{SignedDuration, Timestamp};
use tollgate_core::{Error, Lease, LeaseState, Secret};

use super::*;
use crate::model::LeaseHandle;

fn idempotency(key: &str) -> Idempotency {
    Idempotency { key: IdempotencyKey::parse(key).unwrap(), retention: SignedDuration::from_secs(60) }
}

fn issued() -> IssuedLease {
    IssuedLease {
        lease: Lease {
            lease_id: "lse_1".into(),
            account_id: "acct".into(),
            fencing_token: 7,
            granted: 10,
            used: 0,
            state: LeaseState::Active,
            expiry: Timestamp::from_nanosecond(1_700_000_000_123_456_789).unwrap(),
            expiry_is_upper_bound: false,
        },
        capability: Secret::new("tgc_secret_capability".into()),
    }
}

const ACQUIRE: Request<'static> =
    Request::Acquire(Acquisition { account_id: "acct", units: 10, ttl: SignedDuration::from_secs(5) });

#[test]
fn keys_are_one_to_255_visible_ascii_characters() {
    let longest = "k".repeat(IDEMPOTENCY_KEY_CHARS_MAX);
    for good in ["a", "0b9c6f1e-2d3a-4c5b-8e7f-123456789abc", "!~", longest.as_str()] {
        assert_eq!(IdempotencyKey::parse(good).map(|k| k.expose().to_owned()), Ok(good.to_owned()));
    }
    let over = "k".repeat(IDEMPOTENCY_KEY_CHARS_MAX + 1);
    for bad in ["", "a b", "tab\t", "é", "nul\0", over.as_str()] {
        assert_eq!(IdempotencyKey::parse(bad), Err(Error::InvalidIdempotencyKey), "{bad:?}");
    }
    assert_eq!(format!("{:?}", IdempotencyKey::parse("secret").unwrap()), "IdempotencyKey(<redacted>)");
}

#[test]
fn a_sealed_answer_replays_exactly_and_hides_its_secrets() {
    let now = Timestamp::from_second(1_700_000_000).unwrap();
    let claim = Claim::new(&idempotency("key-1"), &ACQUIRE, now);
    assert_eq!(claim.expires_at, now + SignedDuration::from_secs(60));
    let sealed = claim.seal(&issued().to_answer());
    for secret in [b"tgc_secret_capability".as_slice(), issued().capability.hash().as_bytes()] {
        assert!(!sealed.windows(secret.len()).any(|w| w == secret), "sealed bytes contain a secret");
    }
    // The same key and request at a later instant finds and opens the record.
    let retry = Claim::new(&idempotency("key-1"), &ACQUIRE, now + SignedDuration::from_secs(30));
    assert_eq!(retry.lookup_id, claim.lookup_id);
    assert_eq!(retry.replay::<IssuedLease>(&claim.fingerprint, &sealed), Ok(issued()));
    // The same answer sealed twice differs: nonces are fresh.
    assert_ne!(claim.seal(&issued().to_answer()), sealed);
}

#[test]
fn another_request_under_the_key_is_reused_and_other_keys_cannot_open() {
    let now = Timestamp::from_second(1_700_000_000).unwrap();
    let claim = Claim::new(&idempotency("key-1"), &ACQUIRE, now);
    let sealed = claim.seal(&issued().to_answer());
    let more = Request::Acquire(Acquisition { account_id: "acct", units: 11, ttl: SignedDuration::from_secs(5) });
    let changed = Claim::new(&idempotency("key-1"), &more, now);
    assert_eq!(changed.lookup_id, claim.lookup_id, "the scope is the operation and the account");
    assert_eq!(changed.replay::<IssuedLease>(&claim.fingerprint, &sealed), Err(Error::IdempotencyKeyReused));

    let other_account =
        Request::Acquire(Acquisition { account_id: "acct2", units: 10, ttl: SignedDuration::from_secs(5) });
    assert_ne!(Claim::new(&idempotency("key-1"), &other_account, now).lookup_id, claim.lookup_id);
    let other_key = Claim::new(&idempotency("key-2"), &ACQUIRE, now);
    assert_ne!(other_key.lookup_id, claim.lookup_id);
    // Forcing another key's fingerprint still cannot open the sealed answer.
    assert!(matches!(other_key.replay::<IssuedLease>(&other_key.fingerprint, &sealed), Err(Error::StorageCorrupt(_))));
    // A record of another operation is not replayed as this one.
    assert!(matches!(claim.replay::<Released>(&claim.fingerprint, &sealed), Err(Error::StorageCorrupt(_))));
}

#[test]
fn fingerprints_cover_every_argument_unambiguously() {
    let now = Timestamp::from_second(0).unwrap();
    let key = idempotency("k");
    let handles = |ids: &[(&str, &str)]| -> Vec<LeaseHandle> {
        ids.iter().map(|(l, c)| LeaseHandle { lease_id: (*l).into(), capability: (*c).into() }).collect()
    };
    let ab = handles(&[("a", "b")]);
    let a_b = handles(&[("ab", "")]);
    let ttl = SignedDuration::from_secs(1);
    let requests = [
        Request::Consolidate(Consolidation { account_id: "x", sources: &ab, extra_units: 0, ttl }),
        Request::Consolidate(Consolidation { account_id: "x", sources: &a_b, extra_units: 0, ttl }),
        Request::Consolidate(Consolidation { account_id: "x", sources: &ab, extra_units: 1, ttl }),
        Request::Consolidate(Consolidation {
            account_id: "x",
            sources: &ab,
            extra_units: 0,
            ttl: SignedDuration::from_nanos(1),
        }),
        Request::Release(Release { account_id: "x", lease_id: "x", capability: "c1" }),
        Request::Release(Release { account_id: "x", lease_id: "x", capability: "c2" }),
        Request::IssueCredential(NewCredential { account_id: "x", label: "" }),
        Request::IssueCredential(NewCredential { account_id: "x", label: "l" }),
    ];
    let prints: std::collections::HashSet<[u8; 32]> =
        requests.iter().map(|r| Claim::new(&key, r, now).fingerprint).collect();
    assert_eq!(prints.len(), requests.len());
}

/// A lease's or credential's key is scoped by its account too, so the same
/// key under another account's path is a new key, never the first answer.
#[test]
fn lease_and_credential_keys_are_scoped_by_their_account() {
    let now = Timestamp::from_second(0).unwrap();
    let key = idempotency("k");
    let pairs = [
        (
            Request::Release(Release { account_id: "a", lease_id: "lse_1", capability: "c" }),
            Request::Release(Release { account_id: "b", lease_id: "lse_1", capability: "c" }),
        ),
        (
            Request::RevokeCredential(Revocation { account_id: "a", credential_id: "cred_1" }),
            Request::RevokeCredential(Revocation { account_id: "b", credential_id: "cred_1" }),
        ),
        // The account and the resource are separate fields of the scope.
        (
            Request::Release(Release { account_id: "a", lease_id: "b", capability: "c" }),
            Request::Release(Release { account_id: "ab", lease_id: "", capability: "c" }),
        ),
    ];
    for (first, second) in pairs {
        let (first, second) = (Claim::new(&key, &first, now), Claim::new(&key, &second, now));
        assert_ne!(first.lookup_id, second.lookup_id);
        assert_ne!(first.fingerprint, second.fingerprint);
    }
    assert_eq!(Request::RevokeCredential(Revocation { account_id: "a", credential_id: "c" }).account_id(), "a");
    assert_eq!(ACQUIRE.account_id(), "acct");
}

#[test]
fn every_answer_kind_round_trips() {
    let lease = issued().lease;
    let credential = tollgate_core::Credential {
        credential_id: "cred_1".into(),
        account_id: "acct".into(),
        label: "edge".into(),
        created_at: Timestamp::from_second(5).unwrap(),
        revoked_at: Some(Timestamp::from_nanosecond(6_000_000_001).unwrap()),
        last_used_at: None,
        accepted_events: 3,
        accepted_units: u64::MAX,
    };
    let settlement = tollgate_core::Settlement { charged: 1, returned: 2, excess: 3 };
    let answers = [
        Answer::Acquired(issued()),
        Answer::Released(Released { lease: lease.clone(), settlement }),
        Answer::Consolidated(Consolidated { lease: issued(), settlements: vec![(lease, settlement)] }),
        Answer::CredentialIssued(IssuedCredential { credential: credential.clone(), key: Secret::new("tgk_x".into()) }),
        Answer::CredentialRevoked(credential),
    ];
    for answer in answers {
        assert_eq!(Answer::decode(&answer.encode()), Some(answer));
    }
    assert_eq!(Answer::decode(b"{}"), None);
}

/// The lookup id and fingerprint of one request of every operation, as the
/// stores have written them since keyed requests began: a record written by
/// an earlier build must still be found, and its request recognised, by this
/// one.
#[test]
fn lookup_ids_and_fingerprints_are_stable() {
    let now = Timestamp::from_second(0).unwrap();
    let key = idempotency("stable-key");
    let sources = [LeaseHandle { lease_id: "lse_1".into(), capability: "cap_1".into() }];
    let ttl = SignedDuration::new(5, 7);
    let expected = [
        (
            Request::Acquire(Acquisition { account_id: "acct", units: 10, ttl }),
            "44c9c9f81ff3289ffcac9dee8c7016b71588a9c4283a88dd794058d6378e18ac",
            "f4b0182a591ca708c26a9a95cdf12da5a375cd8dbe1022418328e6ba8c7d45b4",
        ),
        (
            Request::Release(Release { account_id: "acct", lease_id: "lse_1", capability: "cap_1" }),
            "1e6dfd1d74ab4aef8f94f5d9dc0feeb944adbcf900799e79a3451e5209e3df6f",
            "88d4e4ee0add3e221a6b05ebf7de8b36752c3c6ca2547d7d94a5c34f596c234e",
        ),
        (
            Request::Consolidate(Consolidation { account_id: "acct", sources: &sources, extra_units: 3, ttl }),
            "daefa756136a7ed0967d42b97c9522018c3dcc1b0402ff231d0fcab748feed76",
            "02b39a598d779c99d3b7ab3c4bd5535f78bf9db031389d94904feef8793477fa",
        ),
        (
            Request::IssueCredential(NewCredential { account_id: "acct", label: "edge" }),
            "47916e293558e1c60cf907fdf13eadef4895a97ba397e714bd8c3cd2977762dd",
            "90292bda1f524661b569392eb01eb889809b5aa2d7c4e743a11d7e9c0018df2d",
        ),
        (
            Request::RevokeCredential(Revocation { account_id: "acct", credential_id: "cred_1" }),
            "bba0ed4a9ddbb3647498cee48f600dbe56ceaaf448c31dfaa6eae958b64dc010",
            "2bcacae84bcf7cf28e99e62857ea1ce090b25bdb9a874e6c159314684be3d211",
        ),
    ];
    for (request, lookup_id, fingerprint) in expected {
        let claim = Claim::new(&key, &request, now);
        assert_eq!(hex::encode(claim.lookup_id), lookup_id, "{request:?}");
        assert_eq!(hex::encode(claim.fingerprint), fingerprint, "{request:?}");
    }
}
