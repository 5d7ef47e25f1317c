use tollgate_core::COUNTER_NAMES;

use super::*;

#[test]
fn counter_lists_follow_the_core_names() {
    let names: Vec<&str> = counters!("").split(", ").collect();
    assert_eq!(names, COUNTER_NAMES);
    let written: Vec<String> = COUNTER_NAMES.iter().map(|name| format!("written_{name}")).collect();
    assert_eq!(WRITTEN_COUNTER_NAMES.to_vec(), written);
    for (i, name) in COUNTER_NAMES.iter().enumerate() {
        let k = i + 1;
        assert!(assign_elements!("$3").contains(&format!("{name} = $3[{k}]")));
        assert!(add_elements!("$5").contains(&format!("{name} = a.{name} + $5[{k}]")));
        assert!(elements!("$2").contains(&format!("$2[{k}]")));
    }
}

#[test]
fn the_release_writes_differ_only_in_the_account_condition() {
    assert!(!RELEASE_READ_IF_UNCHANGED_SQL.contains("$14"));
    assert!(RELEASE_GUESSED_IF_UNCHANGED_SQL.contains("$14[7]"));
    assert!(ACQUIRE_IF_UNCHANGED_SQL.contains("next_fence = $3[7]"));
}

/// Every statement that finds a lease or a credential for one request names
/// its account by equality first, so on an engine that distributes rows by
/// account each of them touches one account.
#[test]
fn lease_and_credential_statements_name_their_account() {
    for sql in [
        READ_LEASE_SQL,
        READ_HELD_LEASE_SQL,
        LOCK_HELD_LEASE_SQL,
        LOCK_ACCOUNT_LEASES_SQL,
        CREDENTIAL_BY_KEY_SQL,
        READ_CREDENTIAL_SQL,
        LOCK_CREDENTIAL_SQL,
        REVOKE_CREDENTIAL_SQL,
    ] {
        assert!(sql.contains("account_id = $1 AND "), "{sql}");
    }
    for sql in [RELEASE_READ_IF_UNCHANGED_SQL, RELEASE_GUESSED_IF_UNCHANGED_SQL] {
        assert!(sql.contains("WHERE a.account_id = $1"), "{sql}");
        assert!(sql.contains("WHERE l.account_id = $1\n      AND l.lease_id = $2"), "{sql}");
        assert!(sql.contains("WHERE a.account_id = $1 AND a.account_id = settled.account_id"), "{sql}");
        assert!(sql.ends_with("WHERE l.account_id = $1 AND l.lease_id = $2"), "{sql}");
    }
    assert!(PERSIST_SQL.contains("WHERE l.account_id = u.account_id AND l.lease_id = u.lease_id"));
    assert!(PERSIST_SQL.contains("WHERE c.account_id = u.account_id AND c.credential_id = u.credential_id"));
}
