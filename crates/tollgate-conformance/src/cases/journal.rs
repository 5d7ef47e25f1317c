//! The account journal: every change to an account's counters is one entry,
//! numbered 1, 2, 3, … with no gaps, of the kind of operation that made it,
//! naming the ids involved, at the caller's `now`; an operation that changes
//! nothing, or is refused, writes none. (`assert_ledger` replays the whole
//! journal after every step of every case.)

use tollgate_core::journal::{EntryIds, EntryKind};
use tollgate_core::{Entry, Error, LeaseState, PageLimit};
use tollgate_store::{Acquisition, Idempotency, IdempotencyKey, Release, Store, UsageSink};

use super::T0;
use crate::StoreFactory;
use crate::support::*;

fn kinds(entries: &[Entry]) -> Vec<&'static str> {
    entries.iter().map(|e| e.kind.as_str()).collect()
}

fn seqs(entries: &[Entry]) -> Vec<u64> {
    entries.iter().map(|e| e.seq).collect()
}

fn limit(rows: u32) -> PageLimit {
    PageLimit::new(Some(rows)).expect("a valid limit")
}

/// Credit, acquire, usage, release, consolidate and reclaim each write one
/// entry with their deltas, ids and `now`, numbered without gaps.
pub async fn journal_records_each_kind_with_its_ids_in_sequence<F: StoreFactory>(f: &F) {
    let s = f.create(with_grace(nanos(0))).await;
    s.create_account("acct").await.unwrap();
    assert!(journal(&s, "acct").await.is_empty());
    let t = |ns: i128| ts(T0 + ns);
    s.credit("acct", "c1", 100, t(1)).await.unwrap();
    let a = s.acquire("acct", 10, secs(60), t(2)).await.unwrap();
    let b = s.acquire("acct", 20, secs(60), t(3)).await.unwrap();
    let cred = credential(&s, "acct", t(3)).await;
    let batch = vec![
        leased("r1", &cred, &a, 4, t(3)),
        overage("r2", "acct", &cred, 3, t(3)),
        leased("r3", &cred, &a, 1, t(3)),
        leased("r4", &cred, &b, 2, t(3)),
    ];
    s.ingest(batch, t(4)).await.unwrap();
    s.release("acct", &a.lease.lease_id, a.capability.expose(), t(5)).await.unwrap();
    let merged = s.consolidate("acct", &[handle(&b)], 5, nanos(10), t(6)).await.unwrap();
    let reclaimed = s.reclaim(t(6 + 10), 10).await.unwrap();
    assert_eq!(reclaimed.reclaimed.len(), 1);
    let done = ledger! { credited: 100, available: 93, consumed: 7, overage: 3, billed: 10, next_fence: 4 };
    assert_ledger(&s, "acct", done).await;

    let entries = journal(&s, "acct").await;
    assert_eq!(kinds(&entries), ["credit", "acquire", "acquire", "usage", "release", "consolidate", "reclaim"]);
    assert_eq!(seqs(&entries), [1, 2, 3, 4, 5, 6, 7]);
    assert!(entries.iter().all(|e| e.account_id == "acct"));
    let at: Vec<_> = entries.iter().map(|e| e.at).collect();
    assert_eq!(at, [t(1), t(2), t(3), t(4), t(5), t(6), t(16)]);
    let (new_lease, b_id) = (merged.lease.lease.lease_id.clone(), b.lease.lease_id.clone());
    let usage =
        EntryIds { leases: vec![a.lease.lease_id.clone(), b_id.clone()], events: Some(4), ..EntryIds::default() };
    let ids: Vec<EntryIds> = entries.iter().map(|e| e.ids.clone()).collect();
    assert_eq!(
        ids,
        [
            EntryIds::credit("c1"),
            EntryIds::lease(&a.lease.lease_id),
            EntryIds::lease(&b_id),
            usage,
            EntryIds::lease(&a.lease.lease_id),
            EntryIds::consolidate(&new_lease, vec![b_id.clone()]),
            EntryIds::reclaim(vec![new_lease.clone()]),
        ]
    );
    // credited, available, reserved, consumed, overage, billed, next_fence
    let deltas: Vec<[i128; 7]> = entries.iter().map(|e| e.deltas).collect();
    assert_eq!(
        deltas,
        [
            [100, 100, 0, 0, 0, 0, 0],
            [0, -10, 10, 0, 0, 0, 1],
            [0, -20, 20, 0, 0, 0, 1],
            [0, 0, 0, 0, 3, 10, 0],
            [0, 5, -10, 5, 0, 0, 0],
            // b (20, used 2) carried 18 plus 5 extra into a new lease of 23.
            [0, -5, 3, 2, 0, 0, 1],
            [0, 23, -23, 0, 0, 0, 0],
        ]
    );
    assert_eq!(entries[0].kind, EntryKind::Credit);
}

/// A credit replayed, a batch of duplicates and every refusal (an unknown
/// account, a conflicting credit, an overdraw, a wrong capability, a
/// consolidation refused half way, a refused batch) write no entry.
pub async fn no_entry_for_an_operation_that_changes_nothing_or_is_refused<F: StoreFactory>(f: &F) {
    let s = f.create(with_grace(nanos(0))).await;
    s.create_account("acct").await.unwrap();
    let now = ts(T0);
    s.credit("acct", "c1", 50, now).await.unwrap();
    let lease = s.acquire("acct", 10, secs(60), now).await.unwrap();
    let cred = credential(&s, "acct", now).await;
    s.ingest(vec![leased("r1", &cred, &lease, 2, now)], now).await.unwrap();
    let before = journal(&s, "acct").await;
    assert_eq!(kinds(&before), ["credit", "acquire", "usage"]);
    let held = ledger! { credited: 50, available: 40, reserved: 10, billed: 2, next_fence: 2, active_leases: 1 };

    assert!(!s.credit("acct", "c1", 50, now).await.unwrap().created);
    assert_eq!(s.credit("acct", "c1", 51, now).await.unwrap_err(), Error::CreditConflict { existing_units: 50 });
    assert_eq!(s.credit("ghost", "c2", 1, now).await.unwrap_err(), Error::AccountNotFound);
    let overdraw = s.acquire("acct", 41, secs(60), now).await.unwrap_err();
    assert!(matches!(overdraw, Error::InsufficientBalance { .. }), "{overdraw:?}");
    assert_eq!(s.release("acct", &lease.lease.lease_id, "wrong", now).await.unwrap_err(), Error::CapabilityMismatch);
    let refused = s.consolidate("acct", &[handle(&lease)], 41, secs(60), now).await;
    assert!(matches!(refused, Err(Error::InsufficientBalance { .. })), "{refused:?}");
    let outcomes = s.ingest(vec![leased("r1", &cred, &lease, 9, now)], now).await.unwrap();
    assert_eq!(outcomes[0].outcome.code(), "duplicate");
    let zero = s.ingest(vec![overage("r-zero", "acct", &cred, 0, now)], now).await.unwrap();
    assert_eq!(zero[0].outcome.code(), "accepted");
    assert!(s.ingest(vec![overage("r-big", "acct", &cred, 1, now); 10_001], now).await.is_err());
    assert_eq!(s.reclaim(now, 10).await.unwrap().reclaimed.len(), 0);
    assert_ledger(&s, "acct", held).await;
    assert_eq!(journal(&s, "acct").await, before);
    assert_eq!(s.journal("ghost", 0, limit(10)).await.unwrap_err(), Error::AccountNotFound);
}

/// A keyed request replayed answers from its record and writes no new
/// entry; the same key refused for another request writes none either.
pub async fn keyed_replays_write_no_new_entry<F: StoreFactory>(f: &F) {
    let s = funded_store(f, &[("acct", 30)]).await;
    let now = ts(T0);
    let key = |value: &str| Idempotency { key: IdempotencyKey::parse(value).expect("key"), retention: secs(60) };
    let (k1, k2) = (key("journal-acquire-1"), key("journal-release-1"));
    let first = s
        .acquire_idempotent(Some(&k1), Acquisition { account_id: "acct", units: 10, ttl: secs(60) }, now)
        .await
        .unwrap();
    assert_eq!(
        s.acquire_idempotent(Some(&k1), Acquisition { account_id: "acct", units: 10, ttl: secs(60) }, now)
            .await
            .unwrap(),
        first
    );
    let reused =
        s.acquire_idempotent(Some(&k1), Acquisition { account_id: "acct", units: 11, ttl: secs(60) }, now).await;
    assert_eq!(reused.unwrap_err(), Error::IdempotencyKeyReused);
    let (id, capability) = (first.lease.lease_id.as_str(), first.capability.expose());
    let released =
        s.release_idempotent(Some(&k2), Release { account_id: "acct", lease_id: id, capability }, now).await.unwrap();
    assert_eq!(released.lease.state, LeaseState::Released);
    assert_eq!(
        s.release_idempotent(Some(&k2), Release { account_id: "acct", lease_id: id, capability }, now).await.unwrap(),
        released
    );
    assert_ledger(&s, "acct", ledger! { credited: 30, available: 30, next_fence: 2 }).await;
    let entries = journal(&s, "acct").await;
    assert_eq!(kinds(&entries), ["credit", "acquire", "release"]);
    assert_eq!(seqs(&entries), [1, 2, 3]);
}

/// A reclaim pass writes one entry per account, naming every lease it
/// settled there in `lease_id` order; pages follow sequence numbers, and a
/// position past the end is an empty last page.
pub async fn reclaim_writes_one_entry_per_account_and_pages_follow_the_sequence<F: StoreFactory>(f: &F) {
    let s = funded_store(f, &[("a", 30), ("b", 30)]).await;
    let now = ts(T0);
    let mut a_leases = Vec::new();
    for ttl in 1..=3 {
        a_leases.push(s.acquire("a", 5, nanos(ttl), now).await.unwrap().lease.lease_id);
    }
    s.acquire("b", 5, nanos(1), now).await.unwrap();
    assert_eq!(s.reclaim(ts(T0 + 10), 10).await.unwrap().reclaimed.len(), 4);
    let idle = ledger! { credited: 30, available: 30 };
    assert_ledger(&s, "a", Ledger { next_fence: 4, ..idle }).await;
    assert_ledger(&s, "b", Ledger { next_fence: 2, ..idle }).await;

    let entries = journal(&s, "a").await;
    assert_eq!(kinds(&entries), ["credit", "acquire", "acquire", "acquire", "reclaim"]);
    a_leases.sort();
    assert_eq!(entries[4].ids, EntryIds::reclaim(a_leases));
    assert_eq!(entries[4].deltas, [0, 15, -15, 0, 0, 0, 0]);
    assert_eq!(kinds(&journal(&s, "b").await), ["credit", "acquire", "reclaim"]);

    let first = s.journal("a", 0, limit(2)).await.unwrap();
    assert_eq!((seqs(&first.items), first.next_after), (vec![1, 2], Some(2)));
    let second = s.journal("a", 2, limit(2)).await.unwrap();
    assert_eq!((seqs(&second.items), second.next_after), (vec![3, 4], Some(4)));
    let last = s.journal("a", 4, limit(2)).await.unwrap();
    assert_eq!((seqs(&last.items), last.next_after), (vec![5], None));
    let exact = s.journal("a", 3, limit(2)).await.unwrap();
    assert_eq!((seqs(&exact.items), exact.next_after), (vec![4, 5], None));
    let past = s.journal("a", u64::MAX, limit(1)).await.unwrap();
    assert_eq!((past.items.len(), past.next_after), (0, None));
}
