//! The fleet's lease summary: the active leases of every account, those of
//! them due for reclaim at the core's boundary, and the most overdue expiry.

use jiff::{SignedDuration, Timestamp};
use tollgate_store::{LeaseSummary, Store};

use super::T0;
use crate::StoreFactory;
use crate::support::*;

fn summary(active: u64, due: u64, oldest_due_expiry: Option<Timestamp>) -> LeaseSummary {
    LeaseSummary { active, due, oldest_due_expiry }
}

/// "A lease is due exactly when `expiry <= now - grace`", counted over every
/// account: a lease at the boundary is due and one a nanosecond later is not,
/// a released lease is not active, a reclaim pass takes what it settles out
/// of the count, and the most overdue expiry is the smallest due one. An
/// underflowing cutoff makes nothing due, while the active count stays.
pub async fn the_lease_summary_counts_active_and_due_leases_of_every_account<F: StoreFactory>(f: &F) {
    let grace_ns = 1_000_000_001;
    let s = f.create(with_grace(SignedDuration::new(1, 1))).await;
    assert_eq!(s.lease_summary(ts(T0)).await.unwrap(), summary(0, 0, None));
    for account in ["a", "b", "c"] {
        funded(&s, account, 100).await;
    }
    let mut leases = Vec::new();
    for (account, ttl) in [("a", nanos(1_000)), ("a", nanos(5_000)), ("b", nanos(2_000)), ("b", secs(3))] {
        leases.push(s.acquire(account, 5, ttl, ts(T0)).await.unwrap());
    }
    let released = s.acquire("c", 5, nanos(4_000), ts(T0)).await.unwrap();
    s.acquire("c", 5, secs(10), ts(T0)).await.unwrap();
    let two = ledger! { credited: 100, available: 90, reserved: 10, next_fence: 3, active_leases: 2 };
    for account in ["a", "b", "c"] {
        assert_ledger(&s, account, two).await;
    }
    // The second lease of `a`, expiring at T0 + 5 µs, is exactly at the boundary.
    let boundary = T0 + 5_000 + grace_ns;
    assert_eq!(s.lease_summary(ts(T0)).await.unwrap(), summary(6, 0, None));
    assert_eq!(s.lease_summary(ts(boundary)).await.unwrap(), summary(6, 4, Some(ts(T0 + 1_000))));
    assert_eq!(s.lease_summary(Timestamp::MIN).await.unwrap(), summary(6, 0, None));

    let lease = &released.lease;
    s.release(&lease.account_id, &lease.lease_id, released.capability.expose(), ts(T0)).await.unwrap();
    let one = Ledger { available: 95, reserved: 5, active_leases: 1, ..two };
    assert_ledger(&s, "c", one).await;
    assert_eq!(s.lease_summary(ts(boundary - 1)).await.unwrap(), summary(5, 2, Some(ts(T0 + 1_000))));
    assert_eq!(s.lease_summary(ts(boundary)).await.unwrap(), summary(5, 3, Some(ts(T0 + 1_000))));

    // A pass of one settles the most overdue lease, `a`'s first.
    let first = s.reclaim(ts(boundary), 1).await.unwrap();
    let settled: Vec<&str> = first.reclaimed.iter().map(|r| r.lease_id.as_str()).collect();
    assert_eq!(settled, [leases[0].lease.lease_id.as_str()]);
    assert_ledger(&s, "a", one).await;
    assert_eq!(s.lease_summary(ts(boundary)).await.unwrap(), summary(4, 2, Some(ts(T0 + 2_000))));

    assert_eq!(s.reclaim(ts(boundary), 100).await.unwrap().reclaimed.len(), 2);
    assert_ledger(&s, "a", Ledger { available: 100, reserved: 0, active_leases: 0, ..two }).await;
    assert_ledger(&s, "b", one).await;
    assert_eq!(s.lease_summary(ts(boundary)).await.unwrap(), summary(2, 0, None));
    // The two left are due once their own expiries pass the boundary.
    let later = T0 + 10 * 1_000_000_000 + grace_ns;
    assert_eq!(s.lease_summary(ts(later)).await.unwrap(), summary(2, 2, Some(ts(T0 + 3 * 1_000_000_000))));
}
