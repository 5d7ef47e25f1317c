//! The 0020 upgrade's promise to key holders: a credential key issued before
//! keys named their account (`tgk_` and 64 hex digits) keeps verifying after
//! 0020, through the directory the migration fills, and its credential can
//! still be revoked. New keys never enter the directory.

use jiff::{SignedDuration, Timestamp};
use sqlx::PgPool;
use tollgate_core::{GrantPolicy, SecretHash};
use tollgate_pg::PostgresStore;
use tollgate_store::Store;

use crate::fixtures::migrated_through;

fn policy() -> GrantPolicy {
    GrantPolicy::new(SignedDuration::from_secs(3600), SignedDuration::from_secs(30), 100).expect("valid policy")
}

/// A key in the form every key had before 0020.
fn legacy_key(digit: char) -> String {
    format!("tgk_{}", digit.to_string().repeat(64))
}

/// Writes an account and a credential with `key`, as a binary from before
/// 0020 did.
async fn legacy_credential(pool: &PgPool, account_id: &str, credential_id: &str, key: &str) {
    sqlx::query(
        "INSERT INTO tollgate_accounts (account_id, credited, available, reserved, consumed, overage, billed, \
         next_fence) VALUES ($1, 0, 0, 0, 0, 0, 0, 1) ON CONFLICT DO NOTHING",
    )
    .bind(account_id)
    .execute(pool)
    .await
    .expect("account");
    sqlx::query(
        "INSERT INTO tollgate_credentials (credential_id, account_id, label, key_hash, created_floor_us, \
         created_submicro_ns, accepted_events, accepted_units) VALUES ($1, $2, 'legacy', $3, 0, 0, 0, 0)",
    )
    .bind(credential_id)
    .bind(account_id)
    .bind(SecretHash::of(key).as_bytes().to_vec())
    .execute(pool)
    .await
    .expect("credential");
}

async fn directory(pool: &PgPool) -> Vec<(Vec<u8>, String)> {
    sqlx::query_as("SELECT key_hash, account_id FROM tollgate_legacy_credential_keys ORDER BY account_id")
        .fetch_all(pool)
        .await
        .expect("directory")
}

#[tokio::test]
async fn a_key_issued_before_0020_still_verifies_and_its_credential_can_be_revoked() {
    let db = migrated_through(18).await;
    let (key, other_key) = (legacy_key('a'), legacy_key('b'));
    legacy_credential(db.pool(), "acct", "cred-old", &key).await;
    legacy_credential(db.pool(), "other_acct", "cred-other", &other_key).await;
    let pool = db.pool().clone();
    let store = PostgresStore::on_test_db(db, policy()).await.expect("the store migrates to the latest version");
    let filled = directory(&pool).await;
    assert_eq!(
        filled,
        vec![
            (SecretHash::of(&key).as_bytes().to_vec(), "acct".to_owned()),
            (SecretHash::of(&other_key).as_bytes().to_vec(), "other_acct".to_owned()),
        ]
    );

    let verdict = store.verify_credential(&key).await.expect("verify");
    assert_eq!(
        (verdict.valid, verdict.credential_id.as_deref(), verdict.account_id.as_deref()),
        (true, Some("cred-old"), Some("acct"))
    );
    assert!(store.verify_credential(&other_key).await.expect("verify").valid);
    // The legacy secret is no key of the new form, and an unknown legacy key is unknown.
    for unknown in [format!("tgk_acct_{}", "a".repeat(64)), legacy_key('c')] {
        let verdict = store.verify_credential(&unknown).await.expect("verify");
        assert_eq!((verdict.valid, verdict.reason), (false, Some("unknown_credential")), "{unknown}");
    }

    // Revoked on its account's route; under another account it is not found.
    let now = Timestamp::from_second(1_700_000_000).expect("instant");
    assert!(store.revoke_credential("other_acct", "cred-old", now).await.is_err());
    assert!(store.verify_credential(&key).await.expect("verify").valid);
    let revoked = store.revoke_credential("acct", "cred-old", now).await.expect("revoke");
    assert_eq!(revoked.revoked_at, Some(now));
    let verdict = store.verify_credential(&key).await.expect("verify");
    assert_eq!(
        (verdict.valid, verdict.reason, verdict.account_id.as_deref()),
        (false, Some("credential_revoked"), Some("acct"))
    );

    // A key issued now names its account and never enters the directory.
    let issued = store.issue_credential("acct", "new", now).await.expect("issue");
    assert!(issued.key.expose().starts_with("tgk_acct_"));
    assert!(store.verify_credential(issued.key.expose()).await.expect("verify").valid);
    assert_eq!(directory(&pool).await, filled);
}
