//! The conformance cases. Each one names the rule it proves (`docs/rules.md`
//! states them all); a subtle rule is quoted in the case's doc comment.

use jiff::{SignedDuration, Timestamp};
use tollgate_core::{Error, EventOutcome, IngestError, LeaseState, Settlement, UsageEvent};
use tollgate_store::{LeaseHandle, ReclaimReport, ReclaimedLease, Store, UsageSink};

use crate::StoreFactory;
use crate::support::*;

mod idempotent;
mod journal;
mod listings;
mod outbox;
mod scoped;
mod summary;
mod usage_queries;
pub use idempotent::*;
pub use journal::*;
pub use listings::*;
pub use outbox::*;
pub use scoped::*;
pub use summary::*;
pub use usage_queries::*;

/// An ordinary instant with a nanosecond fraction.
const T0: i128 = 1_700_000_000_123_456_789;

fn codes(outcomes: &[EventOutcome]) -> Vec<String> {
    outcomes
        .iter()
        .map(|o| match o.outcome {
            tollgate_core::Outcome::Rejected(reason) => format!("{}:rejected:{}", o.request_id, reason.code()),
            other => format!("{}:{}", o.request_id, other.code()),
        })
        .collect()
}

async fn ingest_codes<S: Store>(s: &S, batch: Vec<UsageEvent>, now: Timestamp) -> Vec<String> {
    codes(&s.ingest(batch, now).await.expect("batch classified"))
}

fn settled(charged: u64, returned: u64, excess: u64) -> Settlement {
    Settlement { charged, returned, excess }
}

// ---------------------------------------------------------------- lease timing

/// "Both allocators preserve the nanosecond precision of the caller's
/// Timestamp and positive SignedDuration."
pub async fn nanosecond_ttl_and_grace<F: StoreFactory>(f: &F) {
    let s = f.create(with_grace(nanos(999))).await;
    funded(&s, "acct", 100).await;
    let lease = s.acquire("acct", 10, nanos(1), ts(T0)).await.unwrap();
    let e = T0 + 1;
    assert_eq!(lease.lease.expiry, ts(e));
    assert_eq!((lease.lease.granted, lease.lease.used, lease.lease.fencing_token), (10, 0, 1));
    assert_eq!(lease.lease.state, LeaseState::Active);
    assert!(!lease.lease.expiry_is_upper_bound);
    assert_eq!(s.lease(&lease.lease.account_id, &lease.lease.lease_id).await.unwrap(), lease.lease);
    let held = ledger! { credited: 100, available: 90, reserved: 10, next_fence: 2, active_leases: 1 };
    assert_ledger(&s, "acct", held).await;

    assert!(s.reclaim(ts(e + 998), 100).await.unwrap().reclaimed.is_empty());
    assert_ledger(&s, "acct", held).await;

    let report = s.reclaim(ts(e + 999), 100).await.unwrap();
    assert_eq!(
        report.reclaimed,
        vec![ReclaimedLease {
            lease_id: lease.lease.lease_id.clone(),
            account_id: "acct".into(),
            settlement: settled(0, 10, 0)
        }]
    );
    assert_eq!(s.lease(&lease.lease.account_id, &lease.lease.lease_id).await.unwrap().state, LeaseState::Reclaimed);
    assert_ledger(&s, "acct", ledger! { credited: 100, available: 100, next_fence: 2 }).await;
}

/// "The policy clamps a requested TTL only to max_ttl": exactly, never rounded.
pub async fn ttl_above_max_is_clamped_exactly<F: StoreFactory>(f: &F) {
    let max_ttl = SignedDuration::new(2, 7);
    let s = f.create(policy(max_ttl, nanos(0), 100)).await;
    funded(&s, "acct", 10).await;
    let cases = [(secs(3_600), 2_000_000_007), (max_ttl, 2_000_000_007), (SignedDuration::new(2, 6), 2_000_000_006)];
    for (fence, (ttl, expected_ns)) in (1u64..).zip(cases) {
        let lease = s.acquire("acct", 1, ttl, ts(T0)).await.unwrap();
        assert_eq!(lease.lease.expiry, ts(T0 + expected_ns), "ttl {ttl}");
        assert_eq!(lease.lease.fencing_token, fence);
        assert_ledger(
            &s,
            "acct",
            ledger! { credited: 10, available: 10 - fence, reserved: fence, next_fence: fence + 1, active_leases: fence },
        )
        .await;
    }
}

/// "The TTL must be positive": zero and negative are refused, and so are zero units
/// and overdrafts, all before any debit.
pub async fn ttl_zero_and_negative_are_refused_without_debit<F: StoreFactory>(f: &F) {
    let s = funded_store(f, &[("acct", 10)]).await;
    let untouched = ledger! { credited: 10, available: 10 };
    let refusals = [
        (1, nanos(0), Error::InvalidTtl),
        (1, nanos(-1), Error::InvalidTtl),
        (1, secs(-3_600), Error::InvalidTtl),
        (0, secs(1), Error::InvalidUnits),
        (11, secs(1), Error::InsufficientBalance { available: 10, requested: 11 }),
    ];
    for (units, ttl, error) in refusals {
        assert_eq!(s.acquire("acct", units, ttl, ts(T0)).await, Err(error));
        assert_ledger(&s, "acct", untouched).await;
    }
}

/// Negative timestamps (before 1970) and both ends of the timestamp domain.
pub async fn acquire_before_the_epoch_and_at_both_domain_endpoints<F: StoreFactory>(f: &F) {
    let s = funded_store(f, &[("acct", 30)]).await;

    let before_epoch = -86_400_000_000_001;
    let lease = s.acquire("acct", 10, nanos(1_500), ts(before_epoch)).await.unwrap();
    assert_eq!(lease.lease.expiry, ts(before_epoch + 1_500));
    assert_eq!(s.lease(&lease.lease.account_id, &lease.lease.lease_id).await.unwrap().expiry, ts(before_epoch + 1_500));
    let released = s
        .release(&lease.lease.account_id, &lease.lease.lease_id, lease.capability.expose(), ts(before_epoch + 1_499))
        .await
        .unwrap();
    assert_eq!(released.settlement, settled(0, 10, 0));
    assert_ledger(&s, "acct", ledger! { credited: 30, available: 30, next_fence: 2 }).await;

    let at_min = s.acquire("acct", 10, nanos(1), Timestamp::MIN).await.unwrap();
    assert_eq!(at_min.lease.expiry, Timestamp::MIN + nanos(1));
    assert_eq!(
        s.lease(&at_min.lease.account_id, &at_min.lease.lease_id).await.unwrap().expiry,
        Timestamp::MIN + nanos(1)
    );
    s.release(&at_min.lease.account_id, &at_min.lease.lease_id, at_min.capability.expose(), Timestamp::MIN)
        .await
        .unwrap();
    assert_ledger(&s, "acct", ledger! { credited: 30, available: 30, next_fence: 3 }).await;

    let at_max = s.acquire("acct", 10, nanos(1), Timestamp::MAX - nanos(1)).await.unwrap();
    assert_eq!(at_max.lease.expiry, Timestamp::MAX);
    assert_eq!(s.lease(&at_max.lease.account_id, &at_max.lease.lease_id).await.unwrap().expiry, Timestamp::MAX);
    assert_ledger(&s, "acct", ledger! { credited: 30, available: 20, reserved: 10, next_fence: 4, active_leases: 1 })
        .await;
    // With zero grace, MAX is this lease's boundary: release is refused and reclaim settles it.
    assert_eq!(
        s.release(&at_max.lease.account_id, &at_max.lease.lease_id, at_max.capability.expose(), Timestamp::MAX)
            .await
            .unwrap_err(),
        Error::LeaseExpired
    );
    let report = s.reclaim(Timestamp::MAX, 10).await.unwrap();
    assert_eq!(report.reclaimed.len(), 1);
    assert_ledger(&s, "acct", ledger! { credited: 30, available: 30, next_fence: 4 }).await;
}

/// "An unrepresentable expiry returns a structured storage error before any balance
/// debit or settlement."
pub async fn expiry_past_max_is_refused_without_debit<F: StoreFactory>(f: &F) {
    let s = funded_store(f, &[("acct", 10)]).await;
    let untouched = ledger! { credited: 10, available: 10 };
    assert_eq!(s.acquire("acct", 1, nanos(1), Timestamp::MAX).await, Err(Error::ExpiryOutOfRange));
    assert_ledger(&s, "acct", untouched).await;
    assert_eq!(s.acquire("acct", 1, nanos(2), Timestamp::MAX - nanos(1)).await, Err(Error::ExpiryOutOfRange));
    assert_ledger(&s, "acct", untouched).await;

    // Consolidation: the sources stay active and unsettled.
    let now = Timestamp::MAX - nanos(10);
    let source = s.acquire("acct", 1, nanos(1), now).await.unwrap();
    let held = ledger! { credited: 10, available: 9, reserved: 1, next_fence: 2, active_leases: 1 };
    assert_ledger(&s, "acct", held).await;
    assert_eq!(s.consolidate("acct", &[handle(&source)], 0, secs(60), now).await, Err(Error::ExpiryOutOfRange));
    assert_eq!(s.lease(&source.lease.account_id, &source.lease.lease_id).await.unwrap().state, LeaseState::Active);
    assert_ledger(&s, "acct", held).await;
}

/// "A lease with expiry e is reclaimable at supplied time n exactly when
/// e + reclaim_grace <= n", with a fractional grace.
pub async fn reclaim_boundary_is_exact_to_the_nanosecond<F: StoreFactory>(f: &F) {
    let grace_ns = 1_000_000_001;
    let s = f.create(with_grace(SignedDuration::new(1, 1))).await;
    funded(&s, "acct", 10).await;
    let first = s.acquire("acct", 4, nanos(1_000), ts(T0)).await.unwrap();
    let second = s.acquire("acct", 6, nanos(1_001), ts(T0)).await.unwrap();
    let boundary = T0 + 1_000 + grace_ns;
    let both = ledger! { credited: 10, reserved: 10, next_fence: 3, active_leases: 2 };
    assert_ledger(&s, "acct", both).await;

    assert!(s.reclaim(ts(boundary - 1), 10).await.unwrap().reclaimed.is_empty());
    assert_ledger(&s, "acct", both).await;

    let report = s.reclaim(ts(boundary), 10).await.unwrap();
    let ids: Vec<_> = report.reclaimed.iter().map(|r| r.lease_id.clone()).collect();
    assert_eq!(ids, vec![first.lease.lease_id.clone()]);
    assert_ledger(&s, "acct", ledger! { credited: 10, available: 4, reserved: 6, next_fence: 3, active_leases: 1 })
        .await;

    let report = s.reclaim(ts(boundary + 1), 10).await.unwrap();
    let ids: Vec<_> = report.reclaimed.iter().map(|r| r.lease_id.clone()).collect();
    assert_eq!(ids, vec![second.lease.lease_id.clone()]);
    assert_ledger(&s, "acct", ledger! { credited: 10, available: 10, next_fence: 3 }).await;
}

/// "Release is accepted before that boundary", including inside the grace after
/// expiry, and refused with lease_expired at it even though no reclaim ran.
pub async fn release_and_usage_inside_grace_then_refused_at_the_boundary<F: StoreFactory>(f: &F) {
    let s = f.create(with_grace(nanos(999))).await;
    funded(&s, "acct", 10).await;
    let cred = credential(&s, "acct", ts(T0)).await;
    let a = s.acquire("acct", 5, nanos(100), ts(T0)).await.unwrap();
    let b = s.acquire("acct", 5, nanos(100), ts(T0)).await.unwrap();
    let boundary = T0 + 100 + 999;
    let inside = ts(boundary - 1);
    assert_ledger(&s, "acct", ledger! { credited: 10, reserved: 10, next_fence: 3, active_leases: 2 }).await;

    let got = ingest_codes(&s, vec![leased("use-a", &cred, &a, 2, inside)], inside).await;
    assert_eq!(got, ["use-a:accepted"]);
    assert_ledger(&s, "acct", ledger! { credited: 10, reserved: 10, billed: 2, next_fence: 3, active_leases: 2 }).await;

    let released = s.release(&a.lease.account_id, &a.lease.lease_id, a.capability.expose(), inside).await.unwrap();
    assert_eq!(released.settlement, settled(2, 3, 0));
    assert_eq!(released.lease.state, LeaseState::Released);
    let after_a =
        ledger! { credited: 10, available: 3, reserved: 5, consumed: 2, billed: 2, next_fence: 3, active_leases: 1 };
    assert_ledger(&s, "acct", after_a).await;

    let at = ts(boundary);
    let got = ingest_codes(&s, vec![leased("use-b", &cred, &b, 1, at)], at).await;
    assert_eq!(got, ["use-b:rejected:lease_expired"]);
    assert_eq!(
        s.release(&b.lease.account_id, &b.lease.lease_id, b.capability.expose(), at).await.unwrap_err(),
        Error::LeaseExpired
    );
    assert_eq!(s.consolidate("acct", &[handle(&b)], 0, secs(1), at).await.unwrap_err(), Error::LeaseExpired);
    assert_eq!(s.lease(&b.lease.account_id, &b.lease.lease_id).await.unwrap().state, LeaseState::Active);
    assert_ledger(&s, "acct", after_a).await;

    assert_eq!(s.reclaim(at, 10).await.unwrap().reclaimed.len(), 1);
    assert_ledger(&s, "acct", ledger! { credited: 10, available: 8, consumed: 2, billed: 2, next_fence: 3 }).await;
}

/// Grace zero: the expiry itself is the boundary.
pub async fn grace_zero_makes_the_expiry_the_boundary<F: StoreFactory>(f: &F) {
    let s = funded_store(f, &[("acct", 10)]).await;
    let cred = credential(&s, "acct", ts(T0)).await;
    let e = T0 + 10;
    let early = s.acquire("acct", 5, nanos(10), ts(T0)).await.unwrap();
    let late = s.acquire("acct", 5, nanos(10), ts(T0)).await.unwrap();
    s.release(&early.lease.account_id, &early.lease.lease_id, early.capability.expose(), ts(e - 1)).await.unwrap();
    let one_left = ledger! { credited: 10, available: 5, reserved: 5, next_fence: 3, active_leases: 1 };
    assert_ledger(&s, "acct", one_left).await;

    assert_eq!(
        s.release(&late.lease.account_id, &late.lease.lease_id, late.capability.expose(), ts(e)).await.unwrap_err(),
        Error::LeaseExpired
    );
    assert_eq!(
        ingest_codes(&s, vec![leased("late", &cred, &late, 1, ts(e))], ts(e)).await,
        ["late:rejected:lease_expired"]
    );
    assert!(s.reclaim(ts(e - 1), 10).await.unwrap().reclaimed.is_empty());
    assert_ledger(&s, "acct", one_left).await;
    assert_eq!(s.reclaim(ts(e), 10).await.unwrap().reclaimed.len(), 1);
    assert_ledger(&s, "acct", ledger! { credited: 10, available: 10, next_fence: 3 }).await;
}

/// "Grace remains a nonnegative duration, including ... values too large for a
/// timestamp deadline." Underflow means no representable expiry is due.
pub async fn grace_longer_than_the_domain_is_never_due<F: StoreFactory>(f: &F) {
    let s = f.create(with_grace(SignedDuration::MAX)).await;
    assert_eq!(s.policy().reclaim_cutoff(Timestamp::MAX), None);
    funded(&s, "acct", 10).await;
    let lease = s.acquire("acct", 10, nanos(1), Timestamp::MIN).await.unwrap();
    assert!(s.reclaim(Timestamp::MAX, 10).await.unwrap().reclaimed.is_empty());
    assert_ledger(&s, "acct", ledger! { credited: 10, reserved: 10, next_fence: 2, active_leases: 1 }).await;
    let released = s
        .release(&lease.lease.account_id, &lease.lease.lease_id, lease.capability.expose(), Timestamp::MAX)
        .await
        .unwrap();
    assert_eq!(released.settlement, settled(0, 10, 0));
    assert_ledger(&s, "acct", ledger! { credited: 10, available: 10, next_fence: 2 }).await;
}

/// "A deadline beyond Timestamp::MAX has not elapsed even at Timestamp::MAX; it is
/// never saturated to an earlier time."
pub async fn deadline_past_max_is_not_due_even_at_max<F: StoreFactory>(f: &F) {
    let s = f.create(with_grace(nanos(10))).await;
    funded(&s, "acct", 10).await;
    let cred = credential(&s, "acct", ts(T0)).await;
    let exactly_due = s.acquire("acct", 3, nanos(1), Timestamp::MAX - nanos(11)).await.unwrap();
    let past_max = s.acquire("acct", 7, nanos(1), Timestamp::MAX - nanos(5)).await.unwrap();
    assert_eq!(exactly_due.lease.expiry, Timestamp::MAX - nanos(10));
    assert_eq!(past_max.lease.expiry, Timestamp::MAX - nanos(4));

    let report = s.reclaim(Timestamp::MAX, 10).await.unwrap();
    let ids: Vec<_> = report.reclaimed.iter().map(|r| r.lease_id.clone()).collect();
    assert_eq!(ids, vec![exactly_due.lease.lease_id.clone()]);
    assert_ledger(&s, "acct", ledger! { credited: 10, available: 3, reserved: 7, next_fence: 3, active_leases: 1 })
        .await;

    let got = ingest_codes(&s, vec![leased("at-max", &cred, &past_max, 2, Timestamp::MAX)], Timestamp::MAX).await;
    assert_eq!(got, ["at-max:accepted"]);
    let released = s
        .release(&past_max.lease.account_id, &past_max.lease.lease_id, past_max.capability.expose(), Timestamp::MAX)
        .await
        .unwrap();
    assert_eq!(released.settlement, settled(2, 5, 0));
    assert_ledger(&s, "acct", ledger! { credited: 10, available: 8, consumed: 2, billed: 2, next_fence: 3 }).await;
}

// ------------------------------------------------------ release, consolidation

pub async fn release_refusals_wrong_capability_twice_and_after_reclaim<F: StoreFactory>(f: &F) {
    let s = funded_store(f, &[("acct", 10)]).await;
    let one = s.acquire("acct", 4, secs(10), ts(T0)).await.unwrap();
    let two = s.acquire("acct", 6, nanos(5), ts(T0)).await.unwrap();
    let both = ledger! { credited: 10, reserved: 10, next_fence: 3, active_leases: 2 };
    assert_ledger(&s, "acct", both).await;

    let now = ts(T0 + 1);
    assert_eq!(
        s.release(&one.lease.account_id, &one.lease.lease_id, "tgc_wrong", now).await.unwrap_err(),
        Error::CapabilityMismatch
    );
    assert_eq!(
        s.release(&one.lease.account_id, &one.lease.lease_id, two.capability.expose(), now).await.unwrap_err(),
        Error::CapabilityMismatch
    );
    assert_eq!(s.release("acct", "lse_missing", one.capability.expose(), now).await.unwrap_err(), Error::LeaseNotFound);
    assert_ledger(&s, "acct", both).await;

    s.release(&one.lease.account_id, &one.lease.lease_id, one.capability.expose(), now).await.unwrap();
    let after_one = ledger! { credited: 10, available: 4, reserved: 6, next_fence: 3, active_leases: 1 };
    assert_ledger(&s, "acct", after_one).await;
    assert_eq!(
        s.release(&one.lease.account_id, &one.lease.lease_id, one.capability.expose(), now).await.unwrap_err(),
        Error::LeaseNotActive { state: LeaseState::Released }
    );
    assert_ledger(&s, "acct", after_one).await;

    assert_eq!(s.reclaim(ts(T0 + 5), 10).await.unwrap().reclaimed.len(), 1);
    assert_eq!(
        s.release(&two.lease.account_id, &two.lease.lease_id, two.capability.expose(), ts(T0 + 5)).await.unwrap_err(),
        Error::LeaseNotActive { state: LeaseState::Reclaimed }
    );
    assert_ledger(&s, "acct", ledger! { credited: 10, available: 10, next_fence: 3 }).await;
}

/// Consolidation settles every source and carries `Σ returned + extra_units` into
/// one new lease with a new fence and an exact new expiry.
pub async fn consolidation_carries_units_exactly<F: StoreFactory>(f: &F) {
    let s = funded_store(f, &[("acct", 100)]).await;
    let cred = credential(&s, "acct", ts(T0)).await;
    let a = s.acquire("acct", 10, nanos(1_000), ts(T0)).await.unwrap();
    let b = s.acquire("acct", 20, nanos(1_000), ts(T0)).await.unwrap();
    let c = s.acquire("acct", 5, nanos(1_000), ts(T0)).await.unwrap();
    let used = vec![leased("a", &cred, &a, 4, ts(T0)), leased("b", &cred, &b, 25, ts(T0))];
    assert_eq!(ingest_codes(&s, used, ts(T0 + 1)).await, ["a:accepted", "b:accepted"]);
    assert_ledger(
        &s,
        "acct",
        ledger! { credited: 100, available: 65, reserved: 35, billed: 29, next_fence: 4, active_leases: 3 },
    )
    .await;

    let now = ts(T0 + 50);
    let merged = s.consolidate("acct", &[handle(&a), handle(&b), handle(&c)], 7, nanos(2_000), now).await.unwrap();
    let lease = &merged.lease.lease;
    assert_eq!((lease.granted, lease.used, lease.fencing_token), (18, 0, 4));
    assert_eq!(lease.expiry, ts(T0 + 50 + 2_000));
    assert_eq!(lease.state, LeaseState::Active);
    assert!(!lease.expiry_is_upper_bound);
    let settlements: Vec<_> = merged.settlements.iter().map(|(l, s)| (l.lease_id.clone(), l.state, *s)).collect();
    assert_eq!(
        settlements,
        vec![
            (a.lease.lease_id.clone(), LeaseState::Consolidated, settled(4, 6, 0)),
            (b.lease.lease_id.clone(), LeaseState::Consolidated, settled(20, 0, 5)),
            (c.lease.lease_id.clone(), LeaseState::Consolidated, settled(0, 5, 0)),
        ]
    );
    for source in [&a, &b, &c] {
        assert_eq!(
            s.lease(&source.lease.account_id, &source.lease.lease_id).await.unwrap().state,
            LeaseState::Consolidated
        );
    }
    assert_eq!(s.lease(&lease.account_id, &lease.lease_id).await.unwrap(), *lease);
    let merged_ledger = Ledger {
        credited: 100,
        available: 58,
        reserved: 18,
        consumed: 24,
        overage: 5,
        billed: 29,
        next_fence: 5,
        active_leases: 1,
    };
    assert_ledger(&s, "acct", merged_ledger).await;

    let got = ingest_codes(&s, vec![leased("new", &cred, &merged.lease, 3, now)], now).await;
    assert_eq!(got, ["new:accepted"]);
    assert_ledger(&s, "acct", Ledger { billed: 32, ..merged_ledger }).await;
}

/// Consolidation is all-or-nothing: one bad source refuses the whole request and
/// every source stays active, with nothing settled.
pub async fn consolidation_is_refused_atomically<F: StoreFactory>(f: &F) {
    let s = funded_store(f, &[("a", 100), ("b", 100)]).await;
    let a1 = s.acquire("a", 10, nanos(1_000), ts(T0)).await.unwrap();
    let a2 = s.acquire("a", 10, nanos(1_000), ts(T0)).await.unwrap();
    let b1 = s.acquire("b", 10, nanos(1_000), ts(T0)).await.unwrap();
    let held = ledger! { credited: 100, available: 80, reserved: 20, next_fence: 3, active_leases: 2 };
    let b_held = ledger! { credited: 100, available: 90, reserved: 10, next_fence: 2, active_leases: 1 };
    let now = ts(T0 + 1);
    let wrong_cap = LeaseHandle { lease_id: a2.lease.lease_id.clone(), capability: a1.capability.expose().to_owned() };
    let missing = LeaseHandle { lease_id: "lse_missing".into(), capability: "tgc_x".into() };
    // (account, sources, extra units, ttl, now, the refusal)
    type Refusal<'a> = (&'a str, Vec<LeaseHandle>, u64, SignedDuration, Timestamp, Error);
    let refusals: Vec<Refusal> = vec![
        ("a", vec![handle(&a1), wrong_cap], 0, secs(1), now, Error::CapabilityMismatch),
        // A source of another account is looked up under this one: not found.
        ("a", vec![handle(&a1), handle(&b1)], 0, secs(1), now, Error::LeaseNotFound),
        (
            "a",
            vec![handle(&a1), LeaseHandle { capability: "tgc_wrong".into(), ..handle(&b1) }],
            0,
            secs(1),
            now,
            Error::LeaseNotFound,
        ),
        (
            "a",
            vec![handle(&a1), handle(&a1)],
            0,
            secs(1),
            now,
            Error::DuplicateSourceLease { lease_id: a1.lease.lease_id.clone() },
        ),
        ("a", vec![], 5, secs(1), now, Error::NoSourceLeases),
        ("a", vec![handle(&a1), missing], 0, secs(1), now, Error::LeaseNotFound),
        ("a", vec![handle(&a1)], 1_000, secs(1), now, Error::InsufficientBalance { available: 80, requested: 1_000 }),
        ("a", vec![handle(&a1)], 0, nanos(0), now, Error::InvalidTtl),
        ("a", vec![handle(&a1), handle(&a2)], 0, secs(1), ts(T0 + 1_000), Error::LeaseExpired),
        ("ghost", vec![handle(&a1)], 0, secs(1), now, Error::AccountNotFound),
    ];
    for (account, sources, extra, ttl, at, error) in refusals {
        assert_eq!(s.consolidate(account, &sources, extra, ttl, at).await.unwrap_err(), error);
        assert_ledger(&s, "a", held).await;
        assert_ledger(&s, "b", b_held).await;
        for lease in [&a1, &a2, &b1] {
            assert_eq!(
                s.lease(&lease.lease.account_id, &lease.lease.lease_id).await.unwrap().state,
                LeaseState::Active
            );
        }
    }

    s.release(&a2.lease.account_id, &a2.lease.lease_id, a2.capability.expose(), now).await.unwrap();
    let one_left = ledger! { credited: 100, available: 90, reserved: 10, next_fence: 3, active_leases: 1 };
    assert_eq!(
        s.consolidate("a", &[handle(&a1), handle(&a2)], 0, secs(1), now).await.unwrap_err(),
        Error::LeaseNotActive { state: LeaseState::Released }
    );
    assert_eq!(s.lease(&a1.lease.account_id, &a1.lease.lease_id).await.unwrap().state, LeaseState::Active);
    assert_ledger(&s, "a", one_left).await;
}

/// Reclaim settles at most the batch bound, reports in account order, and a
/// second pass over the same state settles nothing and changes no counter.
pub async fn reclaim_is_bounded_in_account_order_and_idempotent<F: StoreFactory>(f: &F) {
    let s = f.create(policy(secs(60), nanos(0), 3)).await;
    for account in ["c", "a", "b"] {
        funded(&s, account, 10).await;
    }
    for (account, ttl) in [("c", 1), ("c", 2), ("a", 3), ("b", 4), ("b", 5)] {
        s.acquire(account, 5, nanos(ttl), ts(T0)).await.unwrap();
    }
    assert!(s.reclaim(ts(T0), 10).await.unwrap().reclaimed.is_empty());

    let now = ts(T0 + 100);
    let first = s.reclaim(now, 10).await.unwrap();
    let accounts: Vec<_> = first.reclaimed.iter().map(|r| r.account_id.as_str()).collect();
    assert_eq!(accounts, ["a", "c", "c"]);
    assert!(first.is_full());
    assert_ledger(&s, "a", ledger! { credited: 10, available: 10, next_fence: 2 }).await;
    assert_ledger(&s, "c", ledger! { credited: 10, available: 10, next_fence: 3 }).await;
    assert_ledger(&s, "b", ledger! { credited: 10, reserved: 10, next_fence: 3, active_leases: 2 }).await;

    let second = s.reclaim(now, 1).await.unwrap();
    assert_eq!(second.reclaimed.len(), 1);
    assert_eq!(second.reclaimed[0].settlement, settled(0, 5, 0));
    let third = s.reclaim(now, 10).await.unwrap();
    assert_eq!(third.reclaimed.len(), 1);
    assert!(!third.is_full());
    let done = ledger! { credited: 10, available: 10, next_fence: 3 };
    assert_ledger(&s, "b", done).await;

    let again = s.reclaim(now, 10).await.unwrap();
    assert!(again.reclaimed.is_empty());
    assert_ledger(&s, "a", Ledger { next_fence: 2, ..done }).await;
    assert_ledger(&s, "b", done).await;
    assert_ledger(&s, "c", done).await;
}

/// A pass takes the account of the most overdue lease first and settles all of
/// that account's due leases before the next account's: here `a`'s second
/// lease expired after `b`'s first, and still goes in the first pass, whose
/// bound is 2; `b`'s leases wait for the second pass.
pub async fn reclaim_settles_the_most_overdue_accounts_leases_together<F: StoreFactory>(f: &F) {
    let s = f.create(policy(secs(60), nanos(0), 2)).await;
    for account in ["a", "b"] {
        funded(&s, account, 10).await;
    }
    let mut leases = Vec::new();
    for (account, ttl) in [("a", 1), ("b", 2), ("a", 3), ("b", 4)] {
        leases.push(s.acquire(account, 1, nanos(ttl), ts(T0)).await.unwrap().lease.lease_id);
    }
    let now = ts(T0 + 100);
    let settled = |report: &ReclaimReport| -> Vec<String> {
        report.reclaimed.iter().map(|r| format!("{}/{}", r.account_id, r.lease_id)).collect()
    };
    let first = s.reclaim(now, 10).await.unwrap();
    let mut expected = vec![format!("a/{}", leases[0]), format!("a/{}", leases[2])];
    expected.sort();
    assert_eq!(settled(&first), expected);
    assert_ledger(&s, "a", ledger! { credited: 10, available: 10, next_fence: 3 }).await;
    assert_ledger(&s, "b", ledger! { credited: 10, available: 8, reserved: 2, next_fence: 3, active_leases: 2 }).await;

    let second = s.reclaim(now, 10).await.unwrap();
    let mut expected = vec![format!("b/{}", leases[1]), format!("b/{}", leases[3])];
    expected.sort();
    assert_eq!(settled(&second), expected);
    assert_ledger(&s, "b", ledger! { credited: 10, available: 10, next_fence: 3 }).await;
    assert!(s.reclaim(now, 10).await.unwrap().reclaimed.is_empty());
}

// ------------------------------------------------------------------- ingestion

/// Every outcome class and every rejection reason, in one batch, in input order.
pub async fn ingest_classifies_a_mixed_batch<F: StoreFactory>(f: &F) {
    let s = funded_store(f, &[("acct", 100), ("other", 0)]).await;
    let now = ts(T0);
    let cred = credential(&s, "acct", now).await;
    let foreign = credential(&s, "other", now).await;
    let revoked = credential(&s, "acct", now).await;
    s.revoke_credential("acct", &revoked, now).await.unwrap();
    let lease = s.acquire("acct", 10, secs(60), now).await.unwrap();
    let settled_lease = s.acquire("acct", 10, secs(60), now).await.unwrap();
    s.release(&settled_lease.lease.account_id, &settled_lease.lease.lease_id, settled_lease.capability.expose(), now)
        .await
        .unwrap();
    assert_eq!(ingest_codes(&s, vec![overage("stored", "acct", &cred, 1, now)], now).await, ["stored:accepted"]);
    let start =
        ledger! { credited: 100, available: 90, reserved: 10, overage: 1, billed: 1, next_fence: 3, active_leases: 1 };
    assert_ledger(&s, "acct", start).await;

    let mut no_fence = leased("no-fence", &cred, &lease, 1, now);
    no_fence.fencing_token = None;
    let mut no_lease = leased("no-lease", &cred, &lease, 1, now);
    no_lease.lease_id = Some("lse_missing".into());
    let mut bad_fence = leased("bad-fence", &cred, &lease, 1, now);
    bad_fence.fencing_token = Some(lease.lease.fencing_token + 1);
    let mut batch = vec![
        leased("ok-leased", &cred, &lease, 3, now),
        overage("ok-overage", "acct", &cred, 4, now),
        leased("ok-leased", &cred, &lease, 3, now),
        overage("stored", "acct", &cred, 1, now),
        overage("no-account", "ghost", &cred, 1, now),
        overage("no-credential", "acct", "cred_missing", 1, now),
        overage("mismatch", "acct", &foreign, 1, now),
        overage("revoked", "acct", &revoked, 1, now),
        no_fence,
        no_lease,
        bad_fence,
        leased("settled", &cred, &settled_lease, 1, now),
        overage("", "acct", &cred, 1, now),
        overage(&"x".repeat(129), "acct", &cred, 1, now),
        overage("nul\0id", "acct", &cred, 1, now),
    ];
    let mut expected = vec![
        "ok-leased:accepted".to_owned(),
        "ok-overage:accepted".into(),
        "ok-leased:duplicate".into(),
        "stored:duplicate".into(),
        "no-account:rejected:unknown_account".into(),
        "no-credential:rejected:unknown_credential".into(),
        "mismatch:rejected:credential_account_mismatch".into(),
        "revoked:rejected:credential_revoked".into(),
        "no-fence:rejected:funding_incomplete".into(),
        "no-lease:rejected:unknown_lease".into(),
        "bad-fence:rejected:fence_mismatch".into(),
        "settled:rejected:lease_not_active".into(),
        ":rejected:invalid_request_id".into(),
        format!("{}:rejected:invalid_request_id", "x".repeat(129)),
        "nul\0id:rejected:invalid_request_id".into(),
    ];
    let max = s.unit_domain().max();
    if max < u64::MAX {
        batch.push(overage("too-big", "acct", &cred, max + 1, now));
        expected.push("too-big:rejected:units_out_of_range".into());
    }
    assert_eq!(ingest_codes(&s, batch, now).await, expected);
    assert_eq!(s.lease(&lease.lease.account_id, &lease.lease.lease_id).await.unwrap().used, 3);
    assert_ledger(&s, "acct", Ledger { overage: 5, billed: 8, ..start }).await;
    assert_ledger(&s, "other", Ledger::default()).await;
    let activity = s.credential("acct", &cred).await.unwrap();
    assert_eq!((activity.accepted_events, activity.accepted_units), (3, 8));
    for (account, untouched) in [("other", &foreign), ("acct", &revoked)] {
        let c = s.credential(account, untouched).await.unwrap();
        assert_eq!((c.accepted_events, c.accepted_units, c.last_used_at), (0, 0, None));
    }
}

/// "Duplicate detection precedes payload validation, including when a replay
/// changes its units or funding source."
pub async fn duplicate_detection_precedes_validation<F: StoreFactory>(f: &F) {
    let s = funded_store(f, &[("acct", 10), ("other", 0)]).await;
    let now = ts(T0);
    let cred = credential(&s, "acct", now).await;
    let other_cred = credential(&s, "other", now).await;
    let lease = s.acquire("acct", 10, secs(60), now).await.unwrap();
    let first = vec![overage("r1", "acct", &cred, 5, now), leased("r2", &cred, &lease, 2, now)];
    assert_eq!(ingest_codes(&s, first, now).await, ["r1:accepted", "r2:accepted"]);
    let after = ledger! { credited: 10, reserved: 10, overage: 5, billed: 7, next_fence: 2, active_leases: 1 };
    assert_ledger(&s, "acct", after).await;

    let mut r1_now_leased = leased("r1", &cred, &lease, 500, now);
    r1_now_leased.units = 500;
    let mut r2_now_overage_and_huge = overage("r2", "acct", &cred, u64::MAX, now);
    r2_now_overage_and_huge.fencing_token = Some(99);
    let r1_bad_credential = overage("r1", "acct", "cred_missing", 1, now);
    let replays =
        vec![r1_now_leased, r2_now_overage_and_huge, r1_bad_credential, overage("r1", "other", &other_cred, 1, now)];
    assert_eq!(ingest_codes(&s, replays, now).await, ["r1:duplicate", "r2:duplicate", "r1:duplicate", "r1:accepted"]);
    assert_eq!(s.lease(&lease.lease.account_id, &lease.lease.lease_id).await.unwrap().used, 2);
    assert_ledger(&s, "acct", after).await;
    assert_ledger(&s, "other", ledger! { overage: 1, billed: 1 }).await;
}

/// "A rejected input does not claim its request ID; a corrected event with that ID
/// can still be accepted", later in the same batch or in a later batch.
pub async fn rejected_request_id_is_reusable<F: StoreFactory>(f: &F) {
    let s = funded_store(f, &[("acct", 0)]).await;
    let now = ts(T0);
    let cred = credential(&s, "acct", now).await;
    let mut incomplete = overage("y", "acct", &cred, 2, now);
    incomplete.fencing_token = Some(1);
    let batch = vec![
        overage("x", "acct", "cred_missing", 1, now),
        overage("x", "acct", &cred, 1, now),
        overage("x", "acct", &cred, 1, now),
        incomplete,
    ];
    assert_eq!(
        ingest_codes(&s, batch, now).await,
        ["x:rejected:unknown_credential", "x:accepted", "x:duplicate", "y:rejected:funding_incomplete"]
    );
    assert_ledger(&s, "acct", ledger! { overage: 1, billed: 1 }).await;
    assert_eq!(ingest_codes(&s, vec![overage("y", "acct", &cred, 2, now)], now).await, ["y:accepted"]);
    assert_ledger(&s, "acct", ledger! { overage: 3, billed: 3 }).await;
}

/// "Both admit zero-unit events", and the largest unit the store's domain holds.
pub async fn zero_and_maximum_units<F: StoreFactory>(f: &F) {
    let s = f.create(with_grace(nanos(0))).await;
    let max = s.unit_domain().max();
    let now = ts(T0);
    funded(&s, "zero", 10).await;
    let cred = credential(&s, "zero", now).await;
    let lease = s.acquire("zero", 10, secs(60), now).await.unwrap();
    let zeros = vec![leased("z1", &cred, &lease, 0, now), overage("z2", "zero", &cred, 0, now)];
    assert_eq!(ingest_codes(&s, zeros, now).await, ["z1:accepted", "z2:accepted"]);
    let c = s.credential("zero", &cred).await.unwrap();
    assert_eq!((c.accepted_events, c.accepted_units, c.last_used_at), (2, 0, Some(now)));
    assert_ledger(&s, "zero", ledger! { credited: 10, reserved: 10, next_fence: 2, active_leases: 1 }).await;

    funded(&s, "over", 0).await;
    let over_cred = credential(&s, "over", now).await;
    assert_eq!(ingest_codes(&s, vec![overage("max", "over", &over_cred, max, now)], now).await, ["max:accepted"]);
    assert_ledger(&s, "over", ledger! { overage: max, billed: max }).await;

    funded(&s, "leased", max).await;
    let leased_cred = credential(&s, "leased", now).await;
    let big = s.acquire("leased", max, secs(60), now).await.unwrap();
    assert_eq!(ingest_codes(&s, vec![leased("max", &leased_cred, &big, max, now)], now).await, ["max:accepted"]);
    assert_ledger(&s, "leased", ledger! { credited: max, reserved: max, billed: max, next_fence: 2, active_leases: 1 })
        .await;
    let released = s.release(&big.lease.account_id, &big.lease.lease_id, big.capability.expose(), now).await.unwrap();
    assert_eq!(released.settlement, settled(max, 0, 0));
    assert_ledger(&s, "leased", ledger! { credited: max, consumed: max, billed: max, next_fence: 2 }).await;
}

/// "Either lease_id and fencing_token together, or neither."
pub async fn funding_must_be_complete<F: StoreFactory>(f: &F) {
    let s = funded_store(f, &[("acct", 10)]).await;
    let now = ts(T0);
    let cred = credential(&s, "acct", now).await;
    let lease = s.acquire("acct", 10, secs(60), now).await.unwrap();
    let mut lease_only = leased("e", &cred, &lease, 1, now);
    lease_only.fencing_token = None;
    let mut fence_only = leased("e", &cred, &lease, 1, now);
    fence_only.lease_id = None;
    let batch = vec![lease_only, fence_only, leased("e", &cred, &lease, 1, now)];
    assert_eq!(
        ingest_codes(&s, batch, now).await,
        ["e:rejected:funding_incomplete", "e:rejected:funding_incomplete", "e:accepted"]
    );
    assert_eq!(s.lease(&lease.lease.account_id, &lease.lease.lease_id).await.unwrap().used, 1);
    assert_ledger(&s, "acct", ledger! { credited: 10, reserved: 10, billed: 1, next_fence: 2, active_leases: 1 }).await;
}

/// "Usage beyond a grant is billed as overage, never dropped", on release and on
/// reclaim.
pub async fn usage_beyond_the_grant_is_billed_as_overage<F: StoreFactory>(f: &F) {
    let s = funded_store(f, &[("acct", 20)]).await;
    let now = ts(T0);
    let cred = credential(&s, "acct", now).await;
    let released = s.acquire("acct", 10, secs(60), now).await.unwrap();
    let reclaimed = s.acquire("acct", 4, nanos(10), now).await.unwrap();
    let usage = vec![
        leased("u1", &cred, &released, 6, now),
        leased("u2", &cred, &released, 9, now),
        leased("u3", &cred, &reclaimed, 7, now),
    ];
    assert_eq!(ingest_codes(&s, usage, now).await, ["u1:accepted", "u2:accepted", "u3:accepted"]);
    assert_ledger(
        &s,
        "acct",
        ledger! { credited: 20, available: 6, reserved: 14, billed: 22, next_fence: 3, active_leases: 2 },
    )
    .await;

    let r = s
        .release(&released.lease.account_id, &released.lease.lease_id, released.capability.expose(), now)
        .await
        .unwrap();
    assert_eq!(r.settlement, settled(10, 0, 5));
    assert_eq!(r.lease.used, 15);
    assert_ledger(
        &s,
        "acct",
        Ledger {
            credited: 20,
            available: 6,
            reserved: 4,
            consumed: 10,
            overage: 5,
            billed: 22,
            next_fence: 3,
            active_leases: 1,
        },
    )
    .await;

    let report = s.reclaim(ts(T0 + 10), 10).await.unwrap();
    assert_eq!(report.reclaimed[0].settlement, settled(4, 0, 3));
    assert_ledger(
        &s,
        "acct",
        ledger! { credited: 20, available: 6, consumed: 14, overage: 8, billed: 22, next_fence: 3 },
    )
    .await;
}

/// "A batch of individually representable events can still overflow an aggregate
/// ... Both backends then return IngestError::Refused and apply none of the batch,
/// including request IDs and credential activity." In both event orders.
pub async fn refused_batch_applies_nothing_in_both_orders<F: StoreFactory>(f: &F) {
    let s = f.create(with_grace(nanos(0))).await;
    let max = s.unit_domain().max();
    funded(&s, "acct", 10).await;
    let now = ts(T0);
    let cred = credential(&s, "acct", now).await;
    let lease = s.acquire("acct", 10, secs(60), now).await.unwrap();
    let held = ledger! { credited: 10, reserved: 10, next_fence: 2, active_leases: 1 };
    let big = overage("big", "acct", &cred, max - 5, now);
    let small = leased("small", &cred, &lease, 6, ts(T0 + 1));
    for batch in [vec![big.clone(), small.clone()], vec![small.clone(), big.clone()]] {
        let result = s.ingest(batch, now).await;
        assert!(matches!(result, Err(IngestError::Refused { .. })), "{result:?}");
        assert_ledger(&s, "acct", held).await;
        assert_eq!(s.lease(&lease.lease.account_id, &lease.lease.lease_id).await.unwrap().used, 0);
        let c = s.credential("acct", &cred).await.unwrap();
        assert_eq!((c.accepted_events, c.accepted_units, c.last_used_at), (0, 0, None));
    }
    // Neither request ID was claimed: each is accepted on its own.
    assert_eq!(ingest_codes(&s, vec![big], now).await, ["big:accepted"]);
    let result = s.ingest(vec![small.clone()], now).await;
    assert!(matches!(result, Err(IngestError::Refused { .. })), "{result:?}");
    let mut fits = small;
    fits.units = 5;
    assert_eq!(ingest_codes(&s, vec![fits], now).await, ["small:accepted"]);
    assert_ledger(&s, "acct", Ledger { overage: max - 5, billed: max, ..held }).await;
}

/// "Only accepted events affect ... credential activity"; verification never does.
pub async fn credential_activity_moves_only_on_accepted_events<F: StoreFactory>(f: &F) {
    let s = funded_store(f, &[("acct", 10)]).await;
    let now = ts(T0);
    let issued = s.issue_credential("acct", "edge", now).await.unwrap();
    let cred = issued.credential.credential_id.clone();
    let mut unknown_lease = overage("bad", "acct", &cred, 50, ts(T0 + 9));
    unknown_lease.lease_id = Some("lse_missing".into());
    unknown_lease.fencing_token = Some(1);
    let batch = vec![
        overage("a", "acct", &cred, 2, ts(T0 + 5)),
        unknown_lease,
        overage("b", "acct", &cred, 3, ts(T0 + 7)),
        overage("c", "acct", &cred, 4, ts(T0 + 6)),
    ];
    assert_eq!(
        ingest_codes(&s, batch, now).await,
        ["a:accepted", "bad:rejected:unknown_lease", "b:accepted", "c:accepted"]
    );
    let expected = (3, 9, Some(ts(T0 + 7)));
    let c = s.credential("acct", &cred).await.unwrap();
    assert_eq!((c.accepted_events, c.accepted_units, c.last_used_at), expected);

    assert_eq!(ingest_codes(&s, vec![overage("a", "acct", &cred, 100, ts(T0 + 100))], now).await, ["a:duplicate"]);
    assert!(s.verify_credential(issued.key.expose()).await.unwrap().valid);
    let c = s.credential("acct", &cred).await.unwrap();
    assert_eq!((c.accepted_events, c.accepted_units, c.last_used_at), expected);
    assert_ledger(&s, "acct", ledger! { credited: 10, available: 10, overage: 9, billed: 9 }).await;
}

/// A stale worker can never report against a lease that was settled or superseded.
pub async fn stale_fence_cannot_report_after_settlement<F: StoreFactory>(f: &F) {
    let s = funded_store(f, &[("acct", 10)]).await;
    let now = ts(T0);
    let cred = credential(&s, "acct", now).await;
    let old = s.acquire("acct", 5, secs(60), now).await.unwrap();
    let merged = s.consolidate("acct", &[handle(&old)], 0, secs(60), now).await.unwrap();
    let mut new_lease_old_fence = leased("mixed", &cred, &merged.lease, 1, now);
    new_lease_old_fence.fencing_token = Some(old.lease.fencing_token);
    let batch = vec![leased("stale", &cred, &old, 1, now), new_lease_old_fence];
    assert_eq!(
        ingest_codes(&s, batch, now).await,
        ["stale:rejected:lease_not_active", "mixed:rejected:fence_mismatch"]
    );
    assert_eq!(
        s.release(&old.lease.account_id, &old.lease.lease_id, old.capability.expose(), now).await.unwrap_err(),
        Error::LeaseNotActive { state: LeaseState::Consolidated }
    );
    assert_ledger(&s, "acct", ledger! { credited: 10, available: 5, reserved: 5, next_fence: 3, active_leases: 1 })
        .await;
}

// ------------------------------------------------------ accounts, credentials

pub async fn accounts_and_credits<F: StoreFactory>(f: &F) {
    let s = f.create(with_grace(nanos(0))).await;
    let created = s.create_account("acct").await.unwrap();
    assert_eq!(created.account.account_id, "acct");
    assert_ledger(&s, "acct", Ledger::default()).await;
    assert_eq!(s.create_account("acct").await.unwrap_err(), Error::AccountExists);
    assert_eq!(s.create_account("a b").await.unwrap_err(), Error::InvalidId { field: "account_id" });
    assert_eq!(s.create_account("").await.unwrap_err(), Error::InvalidId { field: "account_id" });

    let first = s.credit("acct", "c1", 10, jiff::Timestamp::UNIX_EPOCH).await.unwrap();
    assert!(first.created);
    assert_eq!(first.account.account.credited, 10);
    let replay = s.credit("acct", "c1", 10, jiff::Timestamp::UNIX_EPOCH).await.unwrap();
    assert!(!replay.created);
    assert_eq!(replay.account.account.credited, 10);
    assert_eq!(
        s.credit("acct", "c1", 11, jiff::Timestamp::UNIX_EPOCH).await.unwrap_err(),
        Error::CreditConflict { existing_units: 10 }
    );
    assert_eq!(s.credit("acct", "c2", 0, jiff::Timestamp::UNIX_EPOCH).await.unwrap_err(), Error::InvalidUnits);
    assert_eq!(
        s.credit("acct", "bad id", 1, jiff::Timestamp::UNIX_EPOCH).await.unwrap_err(),
        Error::InvalidId { field: "credit_id" }
    );
    assert_eq!(s.credit("ghost", "c1", 1, jiff::Timestamp::UNIX_EPOCH).await.unwrap_err(), Error::AccountNotFound);
    assert_ledger(&s, "acct", ledger! { credited: 10, available: 10 }).await;

    let max = s.unit_domain().max();
    if max < u64::MAX {
        assert_eq!(
            s.credit("acct", "c3", max + 1, jiff::Timestamp::UNIX_EPOCH).await.unwrap_err(),
            Error::UnitsOutOfRange { units: max + 1, max }
        );
        assert_eq!(
            s.acquire("acct", max + 1, secs(1), ts(T0)).await.unwrap_err(),
            Error::UnitsOutOfRange { units: max + 1, max }
        );
    }
    assert_eq!(
        s.credit("acct", "c4", max, jiff::Timestamp::UNIX_EPOCH).await.unwrap_err(),
        Error::CounterOverflow { counter: "credited" }
    );
    assert_ledger(&s, "acct", ledger! { credited: 10, available: 10 }).await;

    assert_eq!(s.account("ghost").await.unwrap_err(), Error::AccountNotFound);
    assert_eq!(s.lease("acct", "lse_ghost").await.unwrap_err(), Error::LeaseNotFound);
    assert_eq!(s.credential("acct", "cred_ghost").await.unwrap_err(), Error::CredentialNotFound);
    assert_eq!(s.acquire("ghost", 1, secs(1), ts(T0)).await.unwrap_err(), Error::AccountNotFound);
}

pub async fn credential_lifecycle<F: StoreFactory>(f: &F) {
    let s = funded_store(f, &[("acct", 0)]).await;
    let now = ts(T0);
    let issued = s.issue_credential("acct", "edge worker", now).await.unwrap();
    let key = issued.key.expose().to_owned();
    assert_eq!(tollgate_core::route_credential_key(&key), tollgate_core::KeyRoute::Account("acct"), "{key}");
    assert!(key.starts_with("tgk_acct_") && key.len() == 9 + 64, "key carries 256 random bits after its account");
    let c = &issued.credential;
    assert_eq!(
        (c.account_id.as_str(), c.label.as_str(), c.created_at, c.revoked_at),
        ("acct", "edge worker", now, None)
    );
    assert_eq!(s.credential("acct", &c.credential_id).await.unwrap(), *c);
    let other = s.issue_credential("acct", "", now).await.unwrap();
    assert_ne!(other.key, issued.key);
    assert_ne!(other.credential.credential_id, c.credential_id);

    let valid = s.verify_credential(&key).await.unwrap();
    assert!(valid.valid);
    assert_eq!(
        (valid.credential_id.as_deref(), valid.account_id.as_deref(), valid.reason),
        (Some(c.credential_id.as_str()), Some("acct"), None)
    );
    let unknown = s.verify_credential("tgk_wrong").await.unwrap();
    assert_eq!((unknown.valid, unknown.credential_id, unknown.reason), (false, None, Some("unknown_credential")));

    let revoked = s.revoke_credential("acct", &c.credential_id, ts(T0 + 10)).await.unwrap();
    assert_eq!(revoked.revoked_at, Some(ts(T0 + 10)));
    let again = s.revoke_credential("acct", &c.credential_id, ts(T0 + 20)).await.unwrap();
    assert_eq!(again.revoked_at, Some(ts(T0 + 10)));
    let verdict = s.verify_credential(&key).await.unwrap();
    assert_eq!(
        (verdict.valid, verdict.reason, verdict.account_id.as_deref()),
        (false, Some("credential_revoked"), Some("acct"))
    );

    // Usage that happened before the revocation is still billable.
    let batch = vec![
        overage("before", "acct", &c.credential_id, 1, ts(T0 + 9)),
        overage("at", "acct", &c.credential_id, 1, ts(T0 + 10)),
    ];
    assert_eq!(ingest_codes(&s, batch, ts(T0 + 30)).await, ["before:accepted", "at:rejected:credential_revoked"]);
    assert_ledger(&s, "acct", ledger! { overage: 1, billed: 1 }).await;

    assert_eq!(s.issue_credential("ghost", "x", now).await.unwrap_err(), Error::AccountNotFound);
    assert_eq!(s.issue_credential("acct", &"x".repeat(257), now).await.unwrap_err(), Error::InvalidLabel);
    assert_eq!(s.issue_credential("acct", "nul\0label", now).await.unwrap_err(), Error::InvalidLabel);
    assert_eq!(s.revoke_credential("acct", "cred_ghost", now).await.unwrap_err(), Error::CredentialNotFound);
}
