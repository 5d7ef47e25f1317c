//! Property tests: every timing function against an independent oracle on `i128`
//! nanoseconds. The oracle never touches jiff arithmetic; it works on plain
//! integers and the published domain constants.

use jiff::{SignedDuration, Timestamp};
use proptest::prelude::*;
use tollgate_core::time::{FLOOR_US_MAX, FLOOR_US_MIN, legacy_truncated_us, legacy_upper_bound};
use tollgate_core::{Error, GrantPolicy, InstantPair};

const MIN_NS: i128 = -377_705_023_201 * 1_000_000_000;
const MAX_NS: i128 = 253_402_207_200 * 1_000_000_000 + 999_999_999;

fn ts(ns: i128) -> Timestamp {
    Timestamp::from_nanosecond(ns).unwrap()
}

/// Domain instants, biased toward the interesting places: both endpoints, the
/// epoch, and everything else.
fn instant_ns() -> impl Strategy<Value = i128> {
    prop_oneof![MIN_NS..=MAX_NS, MIN_NS..=MIN_NS + 5_000, MAX_NS - 5_000..=MAX_NS, -5_000i128..=5_000,]
}

/// Nonnegative graces, including ones longer than the whole domain.
fn grace_ns() -> impl Strategy<Value = i128> {
    prop_oneof![0i128..=2_000, 0i128..=(MAX_NS - MIN_NS), (MAX_NS - MIN_NS)..=i128::from(i64::MAX) * 1_000_000_000,]
}

fn duration(ns: i128) -> SignedDuration {
    let secs = ns.div_euclid(1_000_000_000) as i64;
    let nanos = ns.rem_euclid(1_000_000_000) as i32;
    SignedDuration::new(secs, nanos)
}

fn policy(max_ttl_ns: i128, grace: i128) -> GrantPolicy {
    GrantPolicy::new(duration(max_ttl_ns), duration(grace), 1).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn pair_encoding_round_trips(ns in instant_ns()) {
        let pair = InstantPair::encode(ts(ns));
        prop_assert!((0..=999).contains(&pair.submicro_ns));
        prop_assert!((FLOOR_US_MIN..=FLOOR_US_MAX).contains(&pair.floor_us));
        prop_assert_eq!(i128::from(pair.floor_us) * 1000 + i128::from(pair.submicro_ns), ns);
        prop_assert_eq!(pair.to_timestamp(), Ok(ts(ns)));
    }

    #[test]
    fn pair_order_is_instant_order(a in instant_ns(), b in instant_ns()) {
        let (pa, pb) = (InstantPair::encode(ts(a)), InstantPair::encode(ts(b)));
        prop_assert_eq!((pa.floor_us, pa.submicro_ns).cmp(&(pb.floor_us, pb.submicro_ns)), a.cmp(&b));
    }

    #[test]
    fn cutoff_is_equivalent_to_the_deadline(e in instant_ns(), n in instant_ns(), g in grace_ns()) {
        let p = policy(1, g);
        let due = e + g <= n;
        let cutoff = p.reclaim_cutoff(ts(n));
        let oracle_cutoff = if n - g >= MIN_NS { Some(ts(n - g)) } else { None };
        prop_assert_eq!(cutoff, oracle_cutoff);
        prop_assert_eq!(cutoff.is_some_and(|c| ts(e) <= c), due);
        prop_assert_eq!(p.is_reclaimable(ts(e), ts(n)), due);
    }

    #[test]
    fn deadline_past_max_is_never_due(e in MAX_NS - 10_000..=MAX_NS, g in 0i128..=20_000) {
        prop_assume!(e + g > MAX_NS);
        let p = policy(1, g);
        prop_assert!(!p.is_reclaimable(ts(e), Timestamp::MAX));
    }

    #[test]
    fn expiry_clamps_only_to_max_ttl(now in instant_ns(), ttl in -2_000i128..=i128::from(i64::MAX), max_ttl in 1i128..=4_000) {
        let p = policy(max_ttl, 0);
        let got = p.expiry(ts(now), duration(ttl));
        if ttl <= 0 {
            prop_assert_eq!(got, Err(Error::InvalidTtl));
        } else {
            let effective = ttl.min(max_ttl);
            prop_assert_eq!(p.effective_ttl(duration(ttl)), Ok(duration(effective)));
            if now + effective <= MAX_NS {
                prop_assert_eq!(got, Ok(ts(now + effective)));
            } else {
                prop_assert_eq!(got, Err(Error::ExpiryOutOfRange));
            }
        }
    }

    #[test]
    fn legacy_bound_is_conservative_and_tight(t in instant_ns()) {
        let u = legacy_truncated_us(ts(t));
        prop_assert_eq!(i128::from(u), t / 1000);
        let bound = legacy_upper_bound(u).unwrap().as_nanosecond();
        let oracle = if u >= 0 { i128::from(u) * 1000 + 999 } else { i128::from(u) * 1000 };
        prop_assert_eq!(bound, oracle);
        prop_assert!(t <= bound);
        if u == 0 {
            prop_assert!(bound - t <= 1998);
        } else {
            prop_assert!(bound - t <= 999);
        }
        prop_assert!((MIN_NS..=MAX_NS).contains(&bound));
    }
}

#[test]
fn zero_microsecond_bucket_spans_both_sides() {
    assert_eq!(legacy_truncated_us(ts(-999)), 0);
    assert_eq!(legacy_truncated_us(ts(999)), 0);
    assert_eq!(legacy_upper_bound(0).unwrap().as_nanosecond() - (-999), 1998);
}
