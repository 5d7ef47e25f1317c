//! The 0022 upgrade's promise: every account that exists when the journal
//! begins gets one `opening` entry, its counters minus a new account's, so
//! that its journal replays to its counters from the first entry; later
//! changes follow it without a gap. And `check` names an account whose
//! counters no longer match its journal.

use jiff::{SignedDuration, Timestamp};
use tollgate_core::journal::{EntryIds, EntryKind, check_replay};
use tollgate_core::{Entry, GrantPolicy, PageLimit};
use tollgate_pg::PostgresStore;
use tollgate_pg::testing::TestDb;
use tollgate_store::Store;

use crate::fixtures::migrated_through;
use crate::fixtures::populated::{self, ACCOUNTS, GRACE_NS, NOW_US};

fn policy() -> GrantPolicy {
    GrantPolicy::new(SignedDuration::from_secs(3600), SignedDuration::from_nanos(GRACE_NS), 100).expect("valid policy")
}

async fn journal(store: &PostgresStore, account_id: &str) -> Vec<Entry> {
    let page = store.journal(account_id, 0, PageLimit::new(Some(1000)).expect("limit")).await.expect("journal");
    assert_eq!(page.next_after, None, "one page holds the journal of {account_id}");
    page.items
}

async fn assert_replays(store: &PostgresStore, account_id: &str) -> Vec<Entry> {
    let account = store.account(account_id).await.expect("account").account;
    let entries = journal(store, account_id).await;
    check_replay(&account, &entries).unwrap_or_else(|error| panic!("{account_id}: {error}"));
    entries
}

#[tokio::test]
async fn an_upgraded_account_opens_its_journal_with_its_counters_and_replays() {
    let db = migrated_through(16).await;
    populated::populate(db.pool()).await;
    let store = PostgresStore::connect(db.url(), policy()).await.expect("startup applies every later migration");

    for (account_id, counters) in ACCOUNTS {
        let entries = assert_replays(&store, account_id).await;
        assert_eq!(entries.len(), 1, "{account_id}");
        let opening = &entries[0];
        assert_eq!((opening.seq, opening.kind, &opening.ids), (1, EntryKind::Opening, &EntryIds::default()));
        let mut expected = counters.map(i128::from);
        expected[6] -= 1;
        assert_eq!(opening.deltas, expected, "{account_id}");
    }
    let report = store.check().await.expect("check");
    assert!(report.is_clean(), "{report:?}");

    // Traffic after the upgrade follows the opening entry without a gap.
    let now = Timestamp::from_microsecond(NOW_US).expect("now") + SignedDuration::from_secs(1);
    store.credit("acct-c", "after", 10, now).await.expect("credit");
    let lease = store.acquire("acct-c", 4, SignedDuration::from_secs(60), now).await.expect("acquire");
    store.release("acct-c", &lease.lease.lease_id, lease.capability.expose(), now).await.expect("release");
    let entries = assert_replays(&store, "acct-c").await;
    let kinds: Vec<(u64, EntryKind)> = entries.iter().map(|e| (e.seq, e.kind)).collect();
    assert_eq!(
        kinds,
        [(1, EntryKind::Opening), (2, EntryKind::Credit), (3, EntryKind::Acquire), (4, EntryKind::Release)]
    );
    assert!(entries[1..].iter().all(|e| e.at == now));
    assert!(store.check().await.expect("check").is_clean());
}

/// A counter changed behind the journal's back (here both `credited` and
/// `available`, so that every conservation equation still holds), or an
/// entry removed, is named by `check`; the other accounts are not.
#[tokio::test]
async fn check_names_an_account_whose_counters_do_not_replay() {
    let db = TestDb::create_migrated().await;
    let store = PostgresStore::connect(db.url(), policy()).await.expect("store");
    let now = Timestamp::from_microsecond(NOW_US).expect("now");
    for account_id in ["a", "b", "c"] {
        store.create_account(account_id).await.expect("account");
        store.credit(account_id, "seed", 100, now).await.expect("credit");
        store.acquire(account_id, 10, SignedDuration::from_secs(60), now).await.expect("acquire");
    }
    assert!(store.check().await.expect("check").is_clean());

    sqlx::query(
        "UPDATE tollgate_accounts SET credited = credited + 1, available = available + 1 WHERE account_id = 'b'",
    )
    .execute(db.pool())
    .await
    .expect("tamper with b's counters");
    let report = store.check().await.expect("check");
    assert_eq!(report.violations, vec![], "the equations still hold");
    let named: Vec<&str> = report.journal_mismatches.iter().map(|m| m.account_id.as_str()).collect();
    assert_eq!(named, ["b"]);
    assert!(!report.is_clean());

    sqlx::query("DELETE FROM tollgate_journal WHERE account_id = 'c' AND seq = 1")
        .execute(db.pool())
        .await
        .expect("remove c's first entry");
    let report = store.check().await.expect("check");
    let named: Vec<&str> = report.journal_mismatches.iter().map(|m| m.account_id.as_str()).collect();
    assert_eq!(named, ["b", "c"]);
}
