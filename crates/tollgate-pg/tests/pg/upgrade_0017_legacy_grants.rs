//! The 0017 upgrade's promise to running gateways: grants issued by the 0016-era
//! writer keep working after 0017. Their retained capabilities release and
//! consolidate them; reclaim settles them exactly at their recorded upper
//! bound plus the unchanged grace, never a nanosecond before; and every new
//! grant is exact. Each test upgrades its own populated 0016 database by
//! starting a `PostgresStore` on it, as the new binary would.

use jiff::{SignedDuration, Timestamp};
use tollgate_core::{Error, GrantPolicy, LeaseState, Outcome, RejectReason, UsageEvent};
use tollgate_pg::PostgresStore;
use tollgate_pg::migrations::versions_from;
use tollgate_store::{LeaseHandle, Store, UsageSink};

use crate::fixtures::legacy_0016_lease_sql::{LegacyWriter, truncated_us};
use crate::fixtures::populated::{self, GRACE_NS, GRACE_US, NOW_US};
use crate::fixtures::{conservation_violations, legacy_bound_counts, migrated_through};

const NS_PER_US: i128 = 1_000;

fn policy_with_grace(grace_ns: i64) -> GrantPolicy {
    GrantPolicy::new(SignedDuration::from_secs(3600), SignedDuration::from_nanos(grace_ns), 100).expect("valid policy")
}

/// The upgraded fleet's policy: the legacy fleet's grace, unchanged.
fn policy() -> GrantPolicy {
    policy_with_grace(GRACE_NS)
}

fn timestamp(ns: i128) -> Timestamp {
    Timestamp::from_nanosecond(ns).expect("instant in the domain")
}

/// The latest instant a legacy writer could have meant by `stored_us`,
/// found by checking every candidate, independently of the migration.
fn latest_consistent_ns(stored_us: i64) -> i128 {
    let base = i128::from(stored_us) * NS_PER_US;
    (-999..=999)
        .rev()
        .map(|k| base + k)
        .find(|t| t / NS_PER_US == i128::from(stored_us))
        .expect("an instant truncates to every value")
}

/// A populated 0016 database, upgraded by the first start of the new store.
async fn upgraded() -> (PostgresStore, populated::Populated) {
    let db = migrated_through(16).await;
    let fixture = populated::populate(db.pool()).await;
    let store = PostgresStore::on_test_db(db, policy()).await.expect("the new binary starts and migrates");
    let applied: Vec<i64> = store.applied_migrations().iter().map(|m| m.version).collect();
    assert_eq!(applied, versions_from(17));
    store.pin_reclaim_grace(false).await.expect("the legacy fleet's recorded grace is this one");
    (store, fixture)
}

fn counts(rows: &[(&str, bool, i64)]) -> Vec<(String, bool, i64)> {
    rows.iter().map(|(s, b, n)| ((*s).to_owned(), *b, *n)).collect()
}

/// The `(state, expiry_is_upper_bound, count)` rows of the store's check.
async fn checked_counts(store: &PostgresStore) -> Vec<(LeaseState, bool, u64)> {
    let report = store.check().await.expect("check");
    assert_eq!(report.violations, vec![], "conservation");
    report.legacy_bounds.iter().map(|c| (c.state, c.expiry_is_upper_bound, c.count)).collect()
}

#[tokio::test]
async fn retained_capabilities_release_and_consolidate_legacy_grants_until_none_is_active() {
    let (store, fixture) = upgraded().await;
    let pool = store.pool().clone();
    assert_eq!(
        legacy_bound_counts(&pool).await,
        counts(&[("active", true, 4), ("consolidated", true, 2), ("reclaimed", true, 1), ("released", true, 1),])
    );
    let now = Timestamp::from_microsecond(NOW_US).expect("now");

    // The capability is checked as before: a wrong one is refused.
    assert_eq!(
        store.release("acct-a", "a1", "tgc_legacy_a2", now).await.map(|r| r.settlement),
        Err(Error::CapabilityMismatch)
    );

    // Release with the capability the legacy writer handed out.
    let a1 = fixture.lease("a1");
    let released =
        store.release(&a1.grant.account_id, "a1", &a1.grant.capability, now).await.expect("legacy grant released");
    assert_eq!((released.settlement.charged, released.settlement.returned, released.settlement.excess), (10, 90, 0));
    assert_eq!(released.lease.state, LeaseState::Released);
    // Settled history keeps its marker and its recorded bound.
    assert!(released.lease.expiry_is_upper_bound);
    assert_eq!(released.lease.expiry, timestamp(latest_consistent_ns(a1.grant.expires_at_us)));
    assert!(released.lease.expiry.as_nanosecond() >= a1.true_expiry_ns);

    // Consolidate two legacy grants into one new, exact grant.
    let ttl = SignedDuration::from_nanos(30_000_000_001);
    let consolidated = store
        .consolidate(
            "acct-a",
            &[
                LeaseHandle { lease_id: "a2".into(), capability: fixture.lease("a2").grant.capability.clone() },
                LeaseHandle { lease_id: "a6".into(), capability: fixture.lease("a6").grant.capability.clone() },
            ],
            3,
            ttl,
            now,
        )
        .await
        .expect("legacy grants consolidated");
    let merged = &consolidated.lease.lease;
    assert_eq!((merged.granted, merged.fencing_token), (50 + 32 + 3, 7));
    assert_eq!(merged.expiry, now + ttl);
    assert!(!merged.expiry_is_upper_bound, "a new grant is exact");
    for (lease, settlement) in &consolidated.settlements {
        assert_eq!(lease.state, LeaseState::Consolidated);
        assert!(lease.expiry_is_upper_bound, "{}", lease.lease_id);
        assert_eq!(settlement.excess, 0);
    }

    // b1 was used beyond its grant; its release bills the excess as overage.
    let b1 =
        store.release("acct-b", "b1", &fixture.lease("b1").grant.capability, now).await.expect("legacy grant released");
    assert_eq!((b1.settlement.charged, b1.settlement.returned, b1.settlement.excess), (60, 0, 10));

    // No active legacy bound is left; settled history is still marked.
    assert_eq!(
        legacy_bound_counts(&pool).await,
        counts(&[("active", false, 1), ("consolidated", true, 4), ("reclaimed", true, 1), ("released", true, 3),])
    );
    let issued = store.acquire("acct-b", 7, SignedDuration::from_nanos(1), now).await.expect("new grant");
    assert!(!issued.lease.expiry_is_upper_bound);
    assert_eq!(issued.lease.expiry, now + SignedDuration::from_nanos(1));
    assert_eq!(
        checked_counts(&store).await,
        vec![
            (LeaseState::Active, false, 2),
            (LeaseState::Released, true, 3),
            (LeaseState::Reclaimed, true, 1),
            (LeaseState::Consolidated, true, 4),
        ]
    );

    // Every counter, exactly.
    let accounts = populated::account_counters(&pool).await;
    assert_eq!(
        accounts,
        vec![
            populated::Counters::new("acct-a", [1000, 877, 85, 38, 7, 45, 8]),
            populated::Counters::new("acct-b", [750, 653, 7, 90, 37, 127, 4]),
            populated::Counters::new("acct-c", [5, 5, 0, 0, 0, 0, 1]),
        ]
    );
    assert_eq!(conservation_violations(&pool).await, Vec::<String>::new());
}

#[tokio::test]
async fn legacy_grants_are_reclaimed_exactly_at_their_upper_bound_plus_grace() {
    let (store, fixture) = upgraded().await;
    let pool = store.pool().clone();

    // The active legacy grants in the order their deadlines fall.
    let mut active: Vec<&populated::PopulatedLease> = fixture.leases.iter().filter(|l| l.state == "active").collect();
    active.sort_by_key(|l| latest_consistent_ns(l.grant.expires_at_us));
    let ids: Vec<&str> = active.iter().map(|l| l.grant.lease_id.as_str()).collect();
    assert_eq!(ids, vec!["b1", "a2", "a1", "a6"]);

    for lease in active {
        let id = lease.grant.lease_id.as_str();
        let bound_ns = latest_consistent_ns(lease.grant.expires_at_us);
        assert!(bound_ns >= lease.true_expiry_ns, "{id}: the bound is before the true expiry");
        let deadline_ns = bound_ns + i128::from(GRACE_NS);

        // Not due where the legacy writer would have reclaimed it (its
        // truncated microsecond plus grace), nor one nanosecond early.
        let legacy_deadline_ns = i128::from(truncated_us(lease.true_expiry_ns)) * NS_PER_US + i128::from(GRACE_NS);
        for early_ns in [legacy_deadline_ns, deadline_ns - 1] {
            let report = store.reclaim(timestamp(early_ns), 100).await.expect("reclaim");
            assert_eq!(report.reclaimed, vec![], "{id} reclaimed at {early_ns} ns");
        }

        // Still usable one nanosecond before its deadline, refused at it.
        let fence = lease.grant.fencing_token.unsigned_abs();
        let usage = |request_id: &str, at: Timestamp| UsageEvent {
            request_id: request_id.to_owned(),
            account_id: lease.grant.account_id.clone(),
            credential_id: if lease.grant.account_id == "acct-a" { "cred-a" } else { "cred-b" }.to_owned(),
            units: 1,
            occurred_at: at,
            lease_id: Some(id.to_owned()),
            fencing_token: Some(fence),
            dimensions: Default::default(),
        };
        let before = timestamp(deadline_ns - 1);
        let at = timestamp(deadline_ns);
        let outcomes = store.ingest(vec![usage(&format!("{id}-before"), before)], before).await.expect("ingest");
        assert_eq!(outcomes[0].outcome, Outcome::Accepted, "{id}");
        let outcomes = store.ingest(vec![usage(&format!("{id}-at"), at)], at).await.expect("ingest");
        assert_eq!(outcomes[0].outcome, Outcome::Rejected(RejectReason::LeaseExpired), "{id}");

        // Due exactly at the deadline, and settled once.
        let report = store.reclaim(at, 100).await.expect("reclaim");
        let reclaimed: Vec<&str> = report.reclaimed.iter().map(|r| r.lease_id.as_str()).collect();
        assert_eq!(reclaimed, vec![id], "at {deadline_ns} ns");
        let again = store.reclaim(at, 100).await.expect("reclaim");
        assert_eq!(again.reclaimed, vec![], "{id} reclaimed twice");
        let settled = store.lease(&lease.grant.account_id, id).await.expect("lease");
        assert_eq!(settled.state, LeaseState::Reclaimed);
        assert!(settled.expiry_is_upper_bound, "{id} lost its marker");
        assert_eq!(conservation_violations(&pool).await, Vec::<String>::new(), "{id}");
    }

    // Reclaim drained every active legacy grant.
    assert_eq!(
        legacy_bound_counts(&pool).await,
        counts(&[("consolidated", true, 2), ("reclaimed", true, 5), ("released", true, 1),])
    );

    // A new grant is exact, and so is its deadline.
    let now = timestamp(1_900_000_000_000_000_000);
    let ttl = SignedDuration::from_nanos(1_001);
    let issued = store.acquire("acct-a", 3, ttl, now).await.expect("new grant");
    assert!(!issued.lease.expiry_is_upper_bound);
    let deadline = now + ttl + SignedDuration::from_nanos(GRACE_NS);
    let early = store.reclaim(deadline - SignedDuration::from_nanos(1), 100).await.expect("reclaim");
    assert_eq!(early.reclaimed, vec![]);
    let due = store.reclaim(deadline, 100).await.expect("reclaim");
    assert_eq!(due.reclaimed.len(), 1);
    assert_eq!(
        checked_counts(&store).await,
        vec![
            (LeaseState::Released, true, 1),
            (LeaseState::Reclaimed, false, 1),
            (LeaseState::Reclaimed, true, 5),
            (LeaseState::Consolidated, true, 2),
        ]
    );
}

/// The 0017 upgrade keeps one reclaim grace throughout the upgrade: the grace the
/// legacy fleet recorded is the only one an upgraded server may pin.
#[tokio::test]
async fn the_upgraded_fleet_must_keep_the_legacy_reclaim_grace() {
    let db = migrated_through(16).await;
    populated::populate(db.pool()).await;
    let recorded = LegacyWriter { grace_us: GRACE_US }.grace_iso8601();

    for grace_ns in [0, GRACE_NS - 1, GRACE_NS + 1, 1_000_000] {
        let store = PostgresStore::from_pool(db.pool().clone(), policy_with_grace(grace_ns)).await.expect("startup");
        match store.pin_reclaim_grace(false).await {
            Err(Error::ReclaimGraceMismatch { recorded: found, .. }) => {
                assert_eq!(found, recorded, "grace {grace_ns} ns");
            }
            other => panic!("grace {grace_ns} ns: expected a mismatch, got {other:?}"),
        }
    }
    let store = PostgresStore::from_pool(db.pool().clone(), policy()).await.expect("startup");
    store.pin_reclaim_grace(false).await.expect("the recorded grace is the configured one");
    let stored: String = sqlx::query_scalar("SELECT value FROM tollgate_settings WHERE key = 'reclaim_grace'")
        .fetch_one(db.pool())
        .await
        .expect("recorded grace");
    assert_eq!(stored, recorded, "pinning the same grace rewrote it");
    drop(store);
    db.drop_now().await;
}
