//! Lease timing: the grant policy, the reclaim boundary and the stored instant
//! encoding.
//!
//! Instants are `jiff::Timestamp` over the whole domain `Timestamp::MIN ..=
//! Timestamp::MAX` with full nanosecond precision; durations are
//! `jiff::SignedDuration`. Nothing here rounds, saturates or converts a duration to
//! microseconds: every rule is exact checked arithmetic on the caller's values.

use jiff::{SignedDuration, Timestamp};

use crate::error::Error;

/// The largest reclaim batch a policy may ask for. It bounds one reclaim
/// transaction's locks and memory.
pub const RECLAIM_BATCH_LIMIT: u32 = 100_000;

/// Why a grant policy is invalid. Invalid policies are startup errors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("max_ttl must be positive, got {0}")]
    MaxTtlNotPositive(SignedDuration),
    #[error("reclaim_grace must be zero or positive, got {0}")]
    ReclaimGraceNegative(SignedDuration),
    #[error("reclaim_batch_max must be between 1 and {limit}, got {value}")]
    ReclaimBatchMaxOutOfRange { value: u32, limit: u32 },
}

/// How leases are granted and when they may be reclaimed.
///
/// Several servers sharing one database must share one policy grace; otherwise one
/// server could reclaim a lease another still accepts usage against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrantPolicy {
    max_ttl: SignedDuration,
    reclaim_grace: SignedDuration,
    reclaim_batch_max: u32,
}

impl GrantPolicy {
    pub fn new(
        max_ttl: SignedDuration,
        reclaim_grace: SignedDuration,
        reclaim_batch_max: u32,
    ) -> Result<Self, PolicyError> {
        if !max_ttl.is_positive() {
            return Err(PolicyError::MaxTtlNotPositive(max_ttl));
        }
        if reclaim_grace.is_negative() {
            return Err(PolicyError::ReclaimGraceNegative(reclaim_grace));
        }
        if reclaim_batch_max == 0 || reclaim_batch_max > RECLAIM_BATCH_LIMIT {
            return Err(PolicyError::ReclaimBatchMaxOutOfRange {
                value: reclaim_batch_max,
                limit: RECLAIM_BATCH_LIMIT,
            });
        }
        Ok(Self { max_ttl, reclaim_grace, reclaim_batch_max })
    }

    pub fn max_ttl(&self) -> SignedDuration {
        self.max_ttl
    }

    pub fn reclaim_grace(&self) -> SignedDuration {
        self.reclaim_grace
    }

    pub fn reclaim_batch_max(&self) -> u32 {
        self.reclaim_batch_max
    }

    /// The TTL a lease actually gets: the requested one, clamped only to `max_ttl`.
    /// It is never rounded and has no minimum.
    pub fn effective_ttl(&self, ttl: SignedDuration) -> Result<SignedDuration, Error> {
        if !ttl.is_positive() {
            return Err(Error::InvalidTtl);
        }
        Ok(ttl.min(self.max_ttl))
    }

    /// The exact expiry of a lease granted at `now` for `ttl`, or
    /// `expiry_out_of_range` when it is past `Timestamp::MAX`.
    pub fn expiry(&self, now: Timestamp, ttl: SignedDuration) -> Result<Timestamp, Error> {
        let ttl_effective = self.effective_ttl(ttl)?;
        now.checked_add(ttl_effective).map_err(|_| Error::ExpiryOutOfRange)
    }

    /// The bounds of one reclaim pass at `now` asked to settle up to `limit`
    /// leases: the limit clamped to `reclaim_batch_max`, and the cutoff, which
    /// is `None` when nothing can be due (the cutoff underflows, or the pass
    /// may settle none).
    pub fn reclaim_pass(&self, now: Timestamp, limit: u32) -> ReclaimPass {
        let limit = limit.min(self.reclaim_batch_max);
        let cutoff = if limit == 0 { None } else { self.reclaim_cutoff(now) };
        ReclaimPass { limit, cutoff }
    }

    /// `now - reclaim_grace` in checked arithmetic. `None` means the subtraction
    /// underflows the domain, so no representable expiry is due.
    pub fn reclaim_cutoff(&self, now: Timestamp) -> Option<Timestamp> {
        now.checked_sub(self.reclaim_grace).ok()
    }

    /// Whether a lease expiring at `expiry` is reclaimable at `now`: exactly when
    /// `expiry + reclaim_grace <= now`. A deadline past `Timestamp::MAX` is never
    /// due, because then `now - grace < expiry` for every representable `now`.
    pub fn is_reclaimable(&self, expiry: Timestamp, now: Timestamp) -> bool {
        match self.reclaim_cutoff(now) {
            Some(cutoff) => expiry <= cutoff,
            None => false,
        }
    }
}

/// Nanoseconds in a microsecond.
const SUBMICRO_NS_PER_US: i128 = 1000;

/// `Timestamp::MIN` in whole microseconds (it is a whole second).
pub const FLOOR_US_MIN: i64 = -377_705_023_201_000_000;
/// The floor, in microseconds, of `Timestamp::MAX` (253402207200.999999999 s).
pub const FLOOR_US_MAX: i64 = 253_402_207_200_999_999;

/// Why a stored instant cannot be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InstantError {
    #[error("submicro_ns {0} is outside 0..=999")]
    SubmicroOutOfRange(i64),
    #[error("floor_us {0} is outside the timestamp domain")]
    FloorOutOfRange(i64),
}

/// An instant as PostgreSQL stores it: `1000 * floor_us + submicro_ns` nanoseconds
/// since the Unix epoch, with `submicro_ns` in `0..=999`. Floor division keeps the
/// remainder nonnegative before the epoch too, so tuple order equals instant order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct InstantPair {
    pub floor_us: i64,
    pub submicro_ns: i16,
}

impl InstantPair {
    pub fn encode(instant: Timestamp) -> Self {
        let ns = instant.as_nanosecond();
        // The domain is about 2.5e20 ns, so the floor fits i64 and the remainder i16.
        let floor_us = ns.div_euclid(SUBMICRO_NS_PER_US) as i64;
        let submicro_ns = ns.rem_euclid(SUBMICRO_NS_PER_US) as i16;
        Self { floor_us, submicro_ns }
    }

    /// Decodes a stored pair, checking both components against the domain.
    pub fn decode(floor_us: i64, submicro_ns: i64) -> Result<Timestamp, InstantError> {
        if !(0..=999).contains(&submicro_ns) {
            return Err(InstantError::SubmicroOutOfRange(submicro_ns));
        }
        if !(FLOOR_US_MIN..=FLOOR_US_MAX).contains(&floor_us) {
            return Err(InstantError::FloorOutOfRange(floor_us));
        }
        let ns = i128::from(floor_us) * SUBMICRO_NS_PER_US + i128::from(submicro_ns);
        // The rectangle above is exactly the timestamp domain, so this cannot fail.
        Timestamp::from_nanosecond(ns).map_err(|_| InstantError::FloorOutOfRange(floor_us))
    }

    pub fn to_timestamp(self) -> Result<Timestamp, InstantError> {
        Self::decode(self.floor_us, i64::from(self.submicro_ns))
    }
}

/// The microsecond value a legacy (pre-0017) writer stored for `instant`:
/// nanoseconds divided by 1000, truncated toward zero.
pub fn legacy_truncated_us(instant: Timestamp) -> i64 {
    (instant.as_nanosecond() / SUBMICRO_NS_PER_US) as i64
}

/// The latest instant consistent with a legacy truncated microsecond value: 999 ns
/// later for nonnegative values, the stored instant itself for negative ones (their
/// true instant was truncated upward, toward zero). Never earlier than the true
/// expiry, so the upgrade never makes an advertised expiry earlier.
pub fn legacy_upper_bound(expires_at_us: i64) -> Result<Timestamp, InstantError> {
    let submicro_ns = if expires_at_us >= 0 { 999 } else { 0 };
    InstantPair::decode(expires_at_us, submicro_ns)
}

/// What one reclaim pass may settle (`GrantPolicy::reclaim_pass`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReclaimPass {
    /// The most leases the pass settles.
    pub limit: u32,
    /// Leases expiring at or before it are due; `None`: the pass has nothing to do.
    pub cutoff: Option<Timestamp>,
}

impl ReclaimPass {
    /// The accounts a pass takes due leases of, in the order it takes them.
    ///
    /// A pass reads the most overdue leases first: the due leases in
    /// `(expiry, lease_id)` order, as many as it may read. `heads` are their
    /// accounts in that order; a pass takes those accounts in the order of
    /// their first appearance and settles all of one account's due leases, in
    /// expiry order, before the next account's, until its limit. So a pass
    /// writes each account it touches once, and a backlog of due leases
    /// spread over many accounts costs one account write per account per
    /// pass, not one per lease; and the account of the most overdue lease
    /// always comes first, so every due lease is settled within finitely many
    /// passes.
    pub fn accounts<T: Eq + std::hash::Hash + Clone>(heads: impl IntoIterator<Item = T>) -> Vec<T> {
        let mut seen = std::collections::HashSet::new();
        heads.into_iter().filter(|account| seen.insert(account.clone())).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_takes_accounts_in_the_order_of_their_most_overdue_lease() {
        assert_eq!(ReclaimPass::accounts(["b", "a", "b", "c", "a"]), ["b", "a", "c"]);
        assert_eq!(ReclaimPass::accounts(Vec::<u32>::new()), Vec::<u32>::new());
    }

    fn policy(max_ttl_ns: i64, grace_ns: i64) -> GrantPolicy {
        GrantPolicy::new(SignedDuration::from_nanos(max_ttl_ns), SignedDuration::from_nanos(grace_ns), 10).unwrap()
    }

    #[test]
    fn domain_constants_match_jiff() {
        assert_eq!(InstantPair::encode(Timestamp::MIN), InstantPair { floor_us: FLOOR_US_MIN, submicro_ns: 0 });
        assert_eq!(InstantPair::encode(Timestamp::MAX), InstantPair { floor_us: FLOOR_US_MAX, submicro_ns: 999 });
        assert_eq!(Timestamp::MIN.as_second(), -377_705_023_201);
        assert_eq!(Timestamp::MAX.as_second(), 253_402_207_200);
    }

    #[test]
    fn a_reclaim_pass_is_bounded_by_the_policy() {
        let policy = GrantPolicy::new(SignedDuration::from_secs(1), SignedDuration::from_nanos(5), 10).unwrap();
        let now = Timestamp::from_nanosecond(100).unwrap();
        let cutoff = Some(Timestamp::from_nanosecond(95).unwrap());
        assert_eq!(policy.reclaim_pass(now, 3), ReclaimPass { limit: 3, cutoff });
        assert_eq!(policy.reclaim_pass(now, 10), ReclaimPass { limit: 10, cutoff });
        assert_eq!(policy.reclaim_pass(now, 11), ReclaimPass { limit: 10, cutoff });
        assert_eq!(policy.reclaim_pass(now, 0), ReclaimPass { limit: 0, cutoff: None });
        assert_eq!(policy.reclaim_pass(Timestamp::MIN, 3), ReclaimPass { limit: 3, cutoff: None });
    }

    #[test]
    fn policy_validation_names_the_setting() {
        let s = SignedDuration::from_secs;
        assert_eq!(GrantPolicy::new(s(0), s(0), 1), Err(PolicyError::MaxTtlNotPositive(s(0))));
        assert_eq!(GrantPolicy::new(s(-1), s(0), 1), Err(PolicyError::MaxTtlNotPositive(s(-1))));
        assert_eq!(
            GrantPolicy::new(s(1), SignedDuration::from_nanos(-1), 1),
            Err(PolicyError::ReclaimGraceNegative(SignedDuration::from_nanos(-1)))
        );
        assert_eq!(
            GrantPolicy::new(s(1), s(0), 0),
            Err(PolicyError::ReclaimBatchMaxOutOfRange { value: 0, limit: RECLAIM_BATCH_LIMIT })
        );
        assert_eq!(
            GrantPolicy::new(s(1), s(0), RECLAIM_BATCH_LIMIT + 1),
            Err(PolicyError::ReclaimBatchMaxOutOfRange { value: RECLAIM_BATCH_LIMIT + 1, limit: RECLAIM_BATCH_LIMIT })
        );
        let edge = GrantPolicy::new(SignedDuration::from_nanos(1), SignedDuration::from_nanos(7), RECLAIM_BATCH_LIMIT)
            .unwrap();
        assert_eq!(edge.max_ttl(), SignedDuration::from_nanos(1));
        assert_eq!(edge.reclaim_grace(), SignedDuration::from_nanos(7));
        assert_eq!(edge.reclaim_batch_max(), RECLAIM_BATCH_LIMIT);
        assert!(GrantPolicy::new(s(1), s(0), 1).is_ok());
        assert!(GrantPolicy::new(s(1), SignedDuration::MAX, 1).is_ok());
    }

    #[test]
    fn ttl_is_clamped_only_to_max_ttl() {
        let p = policy(1_000, 0);
        let n = SignedDuration::from_nanos;
        assert_eq!(p.effective_ttl(n(1)), Ok(n(1)));
        assert_eq!(p.effective_ttl(n(999)), Ok(n(999)));
        assert_eq!(p.effective_ttl(n(1_000)), Ok(n(1_000)));
        assert_eq!(p.effective_ttl(n(1_001)), Ok(n(1_000)));
        assert_eq!(p.effective_ttl(n(0)), Err(Error::InvalidTtl));
        assert_eq!(p.effective_ttl(n(-1)), Err(Error::InvalidTtl));
    }

    #[test]
    fn expiry_is_exact_and_typed_at_the_edge() {
        let p = policy(1_000, 0);
        let n = SignedDuration::from_nanos;
        let before_epoch = Timestamp::from_nanosecond(-1_500).unwrap();
        assert_eq!(p.expiry(before_epoch, n(7)), Ok(Timestamp::from_nanosecond(-1_493).unwrap()));
        assert_eq!(p.expiry(Timestamp::MAX - n(1), n(1)), Ok(Timestamp::MAX));
        assert_eq!(p.expiry(Timestamp::MAX, n(1)), Err(Error::ExpiryOutOfRange));
        assert_eq!(p.expiry(Timestamp::MIN, n(5_000)), Ok(Timestamp::MIN + n(1_000)));
        assert_eq!(p.expiry(Timestamp::MIN, n(0)), Err(Error::InvalidTtl));
    }

    #[test]
    fn reclaim_boundary_is_inclusive_and_never_saturates() {
        let n = SignedDuration::from_nanos;
        let p = policy(1_000, 999);
        let e = Timestamp::from_nanosecond(10_000).unwrap();
        assert!(!p.is_reclaimable(e, e + n(998)));
        assert!(p.is_reclaimable(e, e + n(999)));
        assert_eq!(p.reclaim_cutoff(e + n(999)), Some(e));

        let zero = policy(1_000, 0);
        assert!(!zero.is_reclaimable(e, e - n(1)));
        assert!(zero.is_reclaimable(e, e));
        assert_eq!(zero.reclaim_cutoff(Timestamp::MIN), Some(Timestamp::MIN));

        // Underflow: nothing is due, not even the earliest expiry.
        assert_eq!(p.reclaim_cutoff(Timestamp::MIN), None);
        assert!(!p.is_reclaimable(Timestamp::MIN, Timestamp::MIN + n(998)));
        assert!(p.is_reclaimable(Timestamp::MIN, Timestamp::MIN + n(999)));

        // A grace longer than the whole domain: nothing is ever due.
        let huge = GrantPolicy::new(n(1), SignedDuration::MAX, 1).unwrap();
        assert_eq!(huge.reclaim_cutoff(Timestamp::MAX), None);
        assert!(!huge.is_reclaimable(Timestamp::MIN, Timestamp::MAX));

        // A deadline past MAX is not due even at MAX.
        assert!(!p.is_reclaimable(Timestamp::MAX - n(998), Timestamp::MAX));
        assert!(p.is_reclaimable(Timestamp::MAX - n(999), Timestamp::MAX));
    }

    #[test]
    fn pairs_round_trip_and_reject_out_of_domain() {
        for ns in [-1_001i128, -1_000, -999, -1, 0, 1, 999, 1_000, 1_001] {
            let t = Timestamp::from_nanosecond(ns).unwrap();
            let pair = InstantPair::encode(t);
            assert_eq!(pair.to_timestamp(), Ok(t));
            assert_eq!(i128::from(pair.floor_us) * 1000 + i128::from(pair.submicro_ns), ns);
        }
        assert_eq!(
            InstantPair::encode(Timestamp::from_nanosecond(-1).unwrap()),
            InstantPair { floor_us: -1, submicro_ns: 999 }
        );
        assert_eq!(InstantPair::decode(0, 1000), Err(InstantError::SubmicroOutOfRange(1000)));
        assert_eq!(InstantPair::decode(0, -1), Err(InstantError::SubmicroOutOfRange(-1)));
        assert_eq!(InstantPair::decode(0, 999), Ok(Timestamp::from_nanosecond(999).unwrap()));
        assert_eq!(InstantPair::decode(0, 0), Ok(Timestamp::UNIX_EPOCH));
        assert_eq!(InstantPair::decode(FLOOR_US_MAX + 1, 0), Err(InstantError::FloorOutOfRange(FLOOR_US_MAX + 1)));
        assert_eq!(InstantPair::decode(FLOOR_US_MIN - 1, 999), Err(InstantError::FloorOutOfRange(FLOOR_US_MIN - 1)));
        assert_eq!(InstantPair::decode(FLOOR_US_MAX, 999), Ok(Timestamp::MAX));
        assert_eq!(InstantPair::decode(FLOOR_US_MIN, 0), Ok(Timestamp::MIN));
    }

    #[test]
    fn legacy_bounds_are_the_latest_consistent_instant() {
        let t = |ns: i128| Timestamp::from_nanosecond(ns).unwrap();
        assert_eq!(legacy_truncated_us(t(1_999)), 1);
        assert_eq!(legacy_truncated_us(t(-1_999)), -1);
        assert_eq!(legacy_truncated_us(t(999)), 0);
        assert_eq!(legacy_truncated_us(t(-999)), 0);
        assert_eq!(legacy_upper_bound(1), Ok(t(1_999)));
        assert_eq!(legacy_upper_bound(0), Ok(t(999)));
        assert_eq!(legacy_upper_bound(-1), Ok(t(-1_000)));
        assert_eq!(legacy_upper_bound(FLOOR_US_MAX), Ok(Timestamp::MAX));
        assert_eq!(legacy_upper_bound(FLOOR_US_MIN), Ok(Timestamp::MIN));
        assert_eq!(legacy_upper_bound(FLOOR_US_MAX + 1), Err(InstantError::FloorOutOfRange(FLOOR_US_MAX + 1)));
        assert_eq!(legacy_upper_bound(FLOOR_US_MIN - 1), Err(InstantError::FloorOutOfRange(FLOOR_US_MIN - 1)));
    }
}
