//! The ledger: account counters, leases, settlement and the three conservation
//! equations.
//!
//! Every operation here takes the current state by reference and either returns an
//! error having changed nothing, or applies its whole effect. They compute on copies
//! and assign at the end, so a failure half way can never leave half an update.
//!
//! For every account, always:
//! 1. `credited = available + reserved + consumed`
//! 2. `reserved = Σ granted` over the account's active leases
//! 3. `billed = consumed + overage + Σ used` over the account's active leases

use jiff::{SignedDuration, Timestamp};

use crate::error::Error;
use crate::time::GrantPolicy;
use crate::units::UnitDomain;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LeaseState {
    Active,
    Released,
    Reclaimed,
    Consolidated,
}

impl LeaseState {
    pub const ALL: [LeaseState; 4] =
        [LeaseState::Active, LeaseState::Released, LeaseState::Reclaimed, LeaseState::Consolidated];

    pub fn as_str(self) -> &'static str {
        match self {
            LeaseState::Active => "active",
            LeaseState::Released => "released",
            LeaseState::Reclaimed => "reclaimed",
            LeaseState::Consolidated => "consolidated",
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        LeaseState::ALL.into_iter().find(|state| state.as_str() == value)
    }
}

impl std::fmt::Display for LeaseState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One account's counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub account_id: String,
    /// Monotonic: every unit ever credited.
    pub credited: u64,
    /// Units that may be leased now.
    pub available: u64,
    /// Units granted to active leases.
    pub reserved: u64,
    /// Units charged against grants at settlement.
    pub consumed: u64,
    /// Monotonic: usage beyond a grant, and usage reported without a lease.
    pub overage: u64,
    /// Monotonic: every accepted usage unit.
    pub billed: u64,
    /// Positive, monotonic: the fence the next lease gets.
    pub next_fence: u64,
}

/// The names of an account's counters, in their one order: the order of
/// `Account::counters`, of the counter columns of `tollgate_accounts`, and of
/// every array of counters a store binds.
pub const COUNTER_NAMES: [&str; COUNTERS] =
    ["credited", "available", "reserved", "consumed", "overage", "billed", "next_fence"];

/// How many counters an account has.
pub const COUNTERS: usize = 7;

impl Account {
    pub fn new(account_id: String) -> Self {
        Self { account_id, credited: 0, available: 0, reserved: 0, consumed: 0, overage: 0, billed: 0, next_fence: 1 }
    }

    /// The counters in `COUNTER_NAMES` order.
    pub fn counters(&self) -> [u64; COUNTERS] {
        [self.credited, self.available, self.reserved, self.consumed, self.overage, self.billed, self.next_fence]
    }

    /// An account with the counters in `COUNTER_NAMES` order.
    pub fn with_counters(account_id: String, counters: [u64; COUNTERS]) -> Self {
        let [credited, available, reserved, consumed, overage, billed, next_fence] = counters;
        Self { account_id, credited, available, reserved, consumed, overage, billed, next_fence }
    }

    /// Applies a credit once per credit id: `recorded` is the units of the
    /// credit already recorded under its id, if any. A repeat with the same
    /// units changes nothing and returns `false`; one with other units is a
    /// `credit_conflict`; a new credit is added (`credit`) and returns `true`.
    pub fn credit_once(&mut self, recorded: Option<u64>, units: u64, domain: UnitDomain) -> Result<bool, Error> {
        match recorded {
            Some(existing_units) if existing_units != units => Err(Error::CreditConflict { existing_units }),
            Some(_) => Ok(false),
            None => self.credit(units, domain).map(|()| true),
        }
    }

    /// Adds prepaid units. Idempotency on the credit id is `credit_once`'s
    /// job: this adds them unconditionally.
    pub fn credit(&mut self, units: u64, domain: UnitDomain) -> Result<(), Error> {
        if units == 0 {
            return Err(Error::InvalidUnits);
        }
        domain.check(units)?;
        let credited = domain.add_counter("credited", self.credited, units)?;
        let available = domain.add_counter("available", self.available, units)?;
        self.credited = credited;
        self.available = available;
        Ok(())
    }
}

/// A lease as every store records it. The capability is not here: stores keep its
/// hash beside the lease and check it before calling into the ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub lease_id: String,
    pub account_id: String,
    pub fencing_token: u64,
    pub granted: u64,
    pub used: u64,
    pub state: LeaseState,
    pub expiry: Timestamp,
    /// True for expiries reconstructed from legacy truncated microseconds: the
    /// stored instant is the latest one consistent with what was recorded.
    pub expiry_is_upper_bound: bool,
}

/// What a new lease gets; the store adds its id and capability.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    pub fencing_token: u64,
    pub granted: u64,
    pub expiry: Timestamp,
}

impl Grant {
    pub fn into_lease(self, lease_id: String, account_id: String) -> Lease {
        Lease {
            lease_id,
            account_id,
            fencing_token: self.fencing_token,
            granted: self.granted,
            used: 0,
            state: LeaseState::Active,
            expiry: self.expiry,
            expiry_is_upper_bound: false,
        }
    }
}

/// How a settled lease's grant and usage were split.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Settlement {
    /// Usage drawn from the grant: `min(used, granted)`.
    pub charged: u64,
    /// Grant returned to `available`: `granted - charged`.
    pub returned: u64,
    /// Usage beyond the grant, billed as overage: `used - charged`.
    pub excess: u64,
}

/// Splits a lease's grant and usage. Units are neither created nor destroyed:
/// `charged + returned = granted` and `charged + excess = used`.
pub fn settle(granted: u64, used: u64) -> Settlement {
    let charged = used.min(granted);
    Settlement { charged, returned: granted - charged, excess: used - charged }
}

/// What settling a lease does to its account's counters, as data: counter
/// `i` (in `COUNTER_NAMES` order) changes by
/// `granted × granted[i] + used × used[i] + min(granted, used) × least[i]`.
///
/// It is the change `release` and `reclaim` make (`settled_account`), written
/// so that a store can apply many settlements at once without a copy of the
/// rule: PostgreSQL's reclaim pass binds these three arrays and evaluates
/// them over the sums of a pass's leases (`RECLAIM_DUE_SQL` in
/// `tollgate-pg`). Two properties make the sum exact, and
/// `settlement_terms_are_the_settlement` holds the core to both:
///
/// - for every lease, `account + change` is what `settled_account` makes of
///   the account, and `settled_account` refuses exactly when some counter
///   would leave its domain;
/// - each counter moves in one direction only, whatever the lease (`reserved`
///   down, the others up or not at all), so the sum of a pass's changes is in
///   range exactly when each step on the way is, in any order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SettlementTerms {
    pub granted: [i64; COUNTERS],
    pub used: [i64; COUNTERS],
    pub least: [i64; COUNTERS],
}

/// The settlement's terms: `available` gets back `granted - charged`,
/// `reserved` gives up `granted`, `consumed` takes `charged` and `overage`
/// `used - charged`, where `charged = min(granted, used)` (`settle`).
pub const SETTLEMENT_TERMS: SettlementTerms = SettlementTerms {
    // credited, available, reserved, consumed, overage, billed, next_fence
    granted: [0, 1, -1, 0, 0, 0, 0],
    used: [0, 0, 0, 0, 1, 0, 0],
    least: [0, -1, 0, 1, -1, 0, 0],
};

impl SettlementTerms {
    /// The change to each counter of settling a lease of `granted` units that
    /// used `used`, in `COUNTER_NAMES` order. `i128` holds every term and sum
    /// of `u64` values times small coefficients.
    pub fn change(&self, granted: u64, used: u64) -> [i128; COUNTERS] {
        let (granted, used) = (i128::from(granted), i128::from(used));
        let least = granted.min(used);
        std::array::from_fn(|i| {
            granted * i128::from(self.granted[i]) + used * i128::from(self.used[i]) + least * i128::from(self.least[i])
        })
    }
}

/// Grants a new lease of `units` from `available`.
pub fn acquire(
    account: &mut Account,
    units: u64,
    ttl: SignedDuration,
    now: Timestamp,
    policy: &GrantPolicy,
    domain: UnitDomain,
) -> Result<Grant, Error> {
    if units == 0 {
        return Err(Error::InvalidUnits);
    }
    domain.check(units)?;
    // The expiry comes first: an unrepresentable one must fail before any debit.
    let expiry = policy.expiry(now, ttl)?;
    let mut next = account.clone();
    let grant = grant_from(&mut next, units, expiry, domain)?;
    *account = next;
    Ok(grant)
}

/// Moves `units` from available to reserved and takes the next fence.
fn grant_from(account: &mut Account, units: u64, expiry: Timestamp, domain: UnitDomain) -> Result<Grant, Error> {
    if account.available < units {
        return Err(Error::InsufficientBalance { available: account.available, requested: units });
    }
    let fencing_token = account.next_fence;
    if fencing_token == 0 {
        return Err(Error::StorageCorrupt(format!("account {} has next_fence 0", account.account_id)));
    }
    account.next_fence = domain.add_counter("next_fence", fencing_token, 1)?;
    account.reserved = domain.add_counter("reserved", account.reserved, units)?;
    account.available -= units;
    Ok(Grant { fencing_token, granted: units, expiry })
}

/// Refuses settlement by the lease's holder unless the lease is active and before
/// its reclaim boundary. Release, consolidation and leased usage share this rule,
/// so their outcome depends only on `now`, never on when a reclaim pass ran.
pub fn check_open(lease: &Lease, now: Timestamp, policy: &GrantPolicy) -> Result<(), Error> {
    if lease.state != LeaseState::Active {
        return Err(Error::LeaseNotActive { state: lease.state });
    }
    if policy.is_reclaimable(lease.expiry, now) {
        return Err(Error::LeaseExpired);
    }
    Ok(())
}

/// The account after settling `lease`; the lease itself is not changed.
fn settled_account(account: &Account, lease: &Lease, domain: UnitDomain) -> Result<(Account, Settlement), Error> {
    if lease.account_id != account.account_id {
        return Err(Error::StorageCorrupt(format!(
            "lease {} belongs to {}, not {}",
            lease.lease_id, lease.account_id, account.account_id
        )));
    }
    let settlement = settle(lease.granted, lease.used);
    let mut next = account.clone();
    next.reserved = account.reserved.checked_sub(lease.granted).ok_or_else(|| {
        Error::StorageCorrupt(format!(
            "account {} reserves {} units but active lease {} was granted {}",
            account.account_id, account.reserved, lease.lease_id, lease.granted
        ))
    })?;
    next.available = domain.add_counter("available", account.available, settlement.returned)?;
    next.consumed = domain.add_counter("consumed", account.consumed, settlement.charged)?;
    next.overage = domain.add_counter("overage", account.overage, settlement.excess)?;
    Ok((next, settlement))
}

/// Settles a lease at its holder's request.
pub fn release(
    account: &mut Account,
    lease: &mut Lease,
    now: Timestamp,
    policy: &GrantPolicy,
    domain: UnitDomain,
) -> Result<Settlement, Error> {
    check_open(lease, now, policy)?;
    let (next, settlement) = settled_account(account, lease, domain)?;
    *account = next;
    lease.state = LeaseState::Released;
    Ok(settlement)
}

/// Settles a lease whose holder vanished, if it is active and due at `now`.
/// Returns `None`, changing nothing, for any other lease: reclaiming is idempotent.
pub fn reclaim(
    account: &mut Account,
    lease: &mut Lease,
    now: Timestamp,
    policy: &GrantPolicy,
    domain: UnitDomain,
) -> Result<Option<Settlement>, Error> {
    if lease.state != LeaseState::Active || !policy.is_reclaimable(lease.expiry, now) {
        return Ok(None);
    }
    let (next, settlement) = settled_account(account, lease, domain)?;
    *account = next;
    lease.state = LeaseState::Reclaimed;
    Ok(Some(settlement))
}

/// Settles every source lease and grants one new lease of `Σ returned +
/// extra_units`, all or nothing. This is how a worker renews or compacts its leases
/// without handing units back to the pool. Capabilities are checked by the store
/// before this is called.
pub fn consolidate(
    account: &mut Account,
    sources: &mut [Lease],
    extra_units: u64,
    ttl: SignedDuration,
    now: Timestamp,
    policy: &GrantPolicy,
    domain: UnitDomain,
) -> Result<(Grant, Vec<Settlement>), Error> {
    if sources.is_empty() {
        return Err(Error::NoSourceLeases);
    }
    for (index, lease) in sources.iter().enumerate() {
        if sources[..index].iter().any(|earlier| earlier.lease_id == lease.lease_id) {
            return Err(Error::DuplicateSourceLease { lease_id: lease.lease_id.clone() });
        }
    }
    domain.check(extra_units)?;
    let expiry = policy.expiry(now, ttl)?;
    for lease in sources.iter() {
        if lease.account_id != account.account_id {
            return Err(Error::MixedAccounts);
        }
        check_open(lease, now, policy)?;
    }
    let mut next = account.clone();
    let mut settlements = Vec::with_capacity(sources.len());
    let mut carried: u64 = 0;
    for lease in sources.iter() {
        let (settled, settlement) = settled_account(&next, lease, domain)?;
        next = settled;
        carried = domain.add_counter("granted", carried, settlement.returned)?;
        settlements.push(settlement);
    }
    let granted = domain.add_counter("granted", carried, extra_units)?;
    if granted == 0 {
        return Err(Error::InvalidUnits);
    }
    let grant = grant_from(&mut next, granted, expiry, domain).map_err(|error| match error {
        // Report the shortfall against what the caller asked for beyond the
        // carried units, which is all consolidation draws from `available`.
        Error::InsufficientBalance { .. } => {
            Error::InsufficientBalance { available: account.available, requested: extra_units }
        }
        other => other,
    })?;
    *account = next;
    for lease in sources.iter_mut() {
        lease.state = LeaseState::Consolidated;
    }
    Ok((grant, settlements))
}

/// One of the three conservation equations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Equation {
    /// `credited = available + reserved + consumed`
    Balance,
    /// `reserved = Σ granted` over active leases
    Reserved,
    /// `billed = consumed + overage + Σ used` over active leases
    Billed,
}

impl Equation {
    pub fn code(self) -> &'static str {
        match self {
            Equation::Balance => "credited_eq_available_reserved_consumed",
            Equation::Reserved => "reserved_eq_active_granted",
            Equation::Billed => "billed_eq_consumed_overage_active_used",
        }
    }
}

/// A violated equation, with both sides as computed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub account_id: String,
    pub equation: Equation,
    pub left: u128,
    pub right: u128,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "account {}: {} violated ({} != {})", self.account_id, self.equation.code(), self.left, self.right)
    }
}

/// The six counters the conservation equations read (all but the fence).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Balances {
    pub credited: u64,
    pub available: u64,
    pub reserved: u64,
    pub consumed: u64,
    pub overage: u64,
    pub billed: u64,
}

impl From<&Account> for Balances {
    fn from(account: &Account) -> Self {
        let Account { credited, available, reserved, consumed, overage, billed, .. } = *account;
        Self { credited, available, reserved, consumed, overage, billed }
    }
}

/// Checks the three equations for one account against its leases (any state;
/// only active ones count).
pub fn check_conservation<'a>(account: &Account, leases: impl IntoIterator<Item = &'a Lease>) -> Vec<Violation> {
    let active = leases.into_iter().filter(|lease| lease.state == LeaseState::Active);
    check_balances(&account.account_id, &Balances::from(account), active.map(|lease| (lease.granted, lease.used)))
}

/// Checks the three equations for one account's balances against the
/// `(granted, used)` of each of its active leases: what a store that loads
/// only those columns checks. Sums are taken in `u128` so a corrupt store
/// cannot make the checker itself overflow.
pub fn check_balances(
    account_id: &str,
    balances: &Balances,
    active: impl IntoIterator<Item = (u64, u64)>,
) -> Vec<Violation> {
    let mut granted_active: u128 = 0;
    let mut used_active: u128 = 0;
    for (granted, used) in active {
        granted_active += u128::from(granted);
        used_active += u128::from(used);
    }
    let b = balances;
    let sides = [
        (
            Equation::Balance,
            u128::from(b.credited),
            u128::from(b.available) + u128::from(b.reserved) + u128::from(b.consumed),
        ),
        (Equation::Reserved, u128::from(b.reserved), granted_active),
        (Equation::Billed, u128::from(b.billed), u128::from(b.consumed) + u128::from(b.overage) + used_active),
    ];
    sides
        .into_iter()
        .filter(|(_, left, right)| left != right)
        .map(|(equation, left, right)| Violation { account_id: account_id.to_owned(), equation, left, right })
        .collect()
}

/// An issued end-user API key and its activity. The key itself is not here; the
/// store keeps its hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    pub credential_id: String,
    pub account_id: String,
    pub label: String,
    pub created_at: Timestamp,
    pub revoked_at: Option<Timestamp>,
    /// The latest `occurred_at` of an accepted event.
    pub last_used_at: Option<Timestamp>,
    pub accepted_events: u64,
    pub accepted_units: u64,
}

impl Credential {
    /// A credential issued at `now`: not revoked, not yet used.
    pub fn issued(credential_id: String, account_id: String, label: String, now: Timestamp) -> Self {
        Self {
            credential_id,
            account_id,
            label,
            created_at: now,
            revoked_at: None,
            last_used_at: None,
            accepted_events: 0,
            accepted_units: 0,
        }
    }

    /// Revokes at `now`; revoking again keeps the first revocation time.
    pub fn revoke(&mut self, now: Timestamp) {
        self.revoked_at.get_or_insert(now);
    }

    /// Whether the credential is revoked for usage that occurred at `occurred_at`.
    /// Usage that happened before the revocation is still billable.
    pub fn is_revoked_at(&self, occurred_at: Timestamp) -> bool {
        self.revoked_at.is_some_and(|revoked_at| revoked_at <= occurred_at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: UnitDomain = UnitDomain::U64;

    fn policy(grace_ns: i64) -> GrantPolicy {
        GrantPolicy::new(SignedDuration::from_secs(60), SignedDuration::from_nanos(grace_ns), 10).unwrap()
    }

    fn at(ns: i128) -> Timestamp {
        Timestamp::from_nanosecond(ns).unwrap()
    }

    #[test]
    fn balances_are_checked_over_granted_and_used_pairs() {
        let balances = Balances { credited: 10, available: 3, reserved: 5, consumed: 2, overage: 1, billed: 7 };
        assert_eq!(check_balances("a", &balances, [(2, 1), (3, 3)]), vec![]);
        let violations = check_balances("a", &balances, [(2, 1)]);
        assert_eq!(
            violations,
            vec![
                Violation { account_id: "a".into(), equation: Equation::Reserved, left: 5, right: 2 },
                Violation { account_id: "a".into(), equation: Equation::Billed, left: 7, right: 4 },
            ]
        );
        let broken = Balances { available: 4, ..balances };
        assert_eq!(
            check_balances("b", &broken, [(2, 1), (3, 3)]),
            vec![Violation { account_id: "b".into(), equation: Equation::Balance, left: 10, right: 11 }]
        );
        let account = Account::with_counters("c".into(), [10, 3, 5, 2, 1, 7, 9]);
        assert_eq!(Balances::from(&account), balances);
    }

    #[test]
    fn a_credit_applies_once_per_credit_id() {
        let mut account = Account::new("a".into());
        assert_eq!(account.credit_once(None, 7, D), Ok(true));
        assert_eq!((account.credited, account.available), (7, 7));
        assert_eq!(account.credit_once(Some(7), 7, D), Ok(false));
        assert_eq!(account.credit_once(Some(5), 7, D), Err(Error::CreditConflict { existing_units: 5 }));
        assert_eq!((account.credited, account.available), (7, 7));
        assert_eq!(account.credit_once(None, 0, D), Err(Error::InvalidUnits));
    }

    #[test]
    fn an_issued_credential_is_unrevoked_and_unused() {
        let credential = Credential::issued("c".into(), "a".into(), "gw".into(), at(5));
        assert_eq!(
            credential,
            Credential {
                credential_id: "c".into(),
                account_id: "a".into(),
                label: "gw".into(),
                created_at: at(5),
                revoked_at: None,
                last_used_at: None,
                accepted_events: 0,
                accepted_units: 0,
            }
        );
    }

    #[test]
    fn counters_follow_the_names_order_both_ways() {
        let account = Account::with_counters("a".into(), [1, 2, 3, 4, 5, 6, 7]);
        assert_eq!((account.credited, account.available, account.reserved, account.consumed), (1, 2, 3, 4));
        assert_eq!((account.overage, account.billed, account.next_fence), (5, 6, 7));
        assert_eq!(account.counters(), [1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(account.account_id, "a");
        assert_eq!(COUNTER_NAMES.len(), COUNTERS);
        assert_eq!(COUNTER_NAMES[6], "next_fence");
    }

    fn funded(units: u64) -> Account {
        let mut account = Account::new("a".into());
        account.credit(units, D).unwrap();
        account
    }

    fn lease(granted: u64, used: u64, state: LeaseState, expiry_ns: i128) -> Lease {
        Lease {
            lease_id: format!("l{granted}-{used}"),
            account_id: "a".into(),
            fencing_token: 1,
            granted,
            used,
            state,
            expiry: at(expiry_ns),
            expiry_is_upper_bound: false,
        }
    }

    #[test]
    fn states_parse_and_display_their_codes() {
        for (state, code) in [
            (LeaseState::Active, "active"),
            (LeaseState::Released, "released"),
            (LeaseState::Reclaimed, "reclaimed"),
            (LeaseState::Consolidated, "consolidated"),
        ] {
            assert_eq!(state.as_str(), code);
            assert_eq!(state.to_string(), code);
            assert_eq!(LeaseState::parse(code), Some(state));
        }
        assert_eq!(LeaseState::parse("expired"), None);
    }

    #[test]
    fn settlement_splits_without_creating_units() {
        assert_eq!(settle(10, 4), Settlement { charged: 4, returned: 6, excess: 0 });
        assert_eq!(settle(10, 10), Settlement { charged: 10, returned: 0, excess: 0 });
        assert_eq!(settle(10, 15), Settlement { charged: 10, returned: 0, excess: 5 });
        assert_eq!(settle(0, 3), Settlement { charged: 0, returned: 0, excess: 3 });
        assert_eq!(settle(u64::MAX, u64::MAX), Settlement { charged: u64::MAX, returned: 0, excess: 0 });
    }

    #[test]
    fn credit_validates_and_checks_both_counters() {
        let mut account = Account::new("a".into());
        assert_eq!(account.credit(0, D), Err(Error::InvalidUnits));
        assert_eq!(
            account.credit(u64::MAX, UnitDomain::I64),
            Err(Error::UnitsOutOfRange { units: u64::MAX, max: i64::MAX as u64 })
        );
        account.credit(7, D).unwrap();
        assert_eq!((account.credited, account.available), (7, 7));
        assert_eq!(account.credit(u64::MAX, D), Err(Error::CounterOverflow { counter: "credited" }));
        account.available = u64::MAX - 1;
        account.credited = 0;
        assert_eq!(account.credit(2, D), Err(Error::CounterOverflow { counter: "available" }));
        assert_eq!((account.credited, account.available), (0, u64::MAX - 1));
    }

    #[test]
    fn acquire_moves_units_and_takes_the_fence() {
        let mut account = funded(10);
        let grant = acquire(&mut account, 4, SignedDuration::from_nanos(5), at(100), &policy(0), D).unwrap();
        assert_eq!(grant, Grant { fencing_token: 1, granted: 4, expiry: at(105) });
        assert_eq!((account.available, account.reserved, account.next_fence), (6, 4, 2));
        let lease = grant.into_lease("l".into(), "a".into());
        assert_eq!((lease.used, lease.state, lease.expiry_is_upper_bound), (0, LeaseState::Active, false));

        let before = account.clone();
        assert_eq!(
            acquire(&mut account, 7, SignedDuration::from_secs(1), at(0), &policy(0), D),
            Err(Error::InsufficientBalance { available: 6, requested: 7 })
        );
        assert_eq!(
            acquire(&mut account, 6, SignedDuration::from_nanos(1), Timestamp::MAX, &policy(0), D),
            Err(Error::ExpiryOutOfRange)
        );
        account.next_fence = 0;
        assert!(matches!(
            acquire(&mut account, 1, SignedDuration::from_secs(1), at(0), &policy(0), D),
            Err(Error::StorageCorrupt(_))
        ));
        account.next_fence = u64::MAX;
        assert_eq!(
            acquire(&mut account, 1, SignedDuration::from_secs(1), at(0), &policy(0), D),
            Err(Error::CounterOverflow { counter: "next_fence" })
        );
        account.next_fence = before.next_fence;
        assert_eq!(account, before);
        // Exactly the available balance is grantable.
        acquire(&mut account, 6, SignedDuration::from_secs(1), at(0), &policy(0), D).unwrap();
        assert_eq!(account.available, 0);
    }

    #[test]
    fn release_and_reclaim_follow_the_boundary() {
        let p = policy(10);
        let mut account = funded(10);
        acquire(&mut account, 10, SignedDuration::from_nanos(100), at(0), &p, D).unwrap();
        let mut l = lease(10, 12, LeaseState::Active, 100);
        account.billed = 12;

        let mut early = l.clone();
        let mut untouched = account.clone();
        assert_eq!(reclaim(&mut untouched, &mut early, at(109), &p, D), Ok(None));
        assert_eq!((untouched.clone(), early.state), (account.clone(), LeaseState::Active));
        assert_eq!(release(&mut untouched, &mut early, at(110), &p, D), Err(Error::LeaseExpired));

        let mut released_account = account.clone();
        let mut released = l.clone();
        assert_eq!(
            release(&mut released_account, &mut released, at(109), &p, D),
            Ok(Settlement { charged: 10, returned: 0, excess: 2 })
        );
        assert_eq!(released.state, LeaseState::Released);
        assert_eq!(
            (
                released_account.available,
                released_account.reserved,
                released_account.consumed,
                released_account.overage
            ),
            (0, 0, 10, 2)
        );
        assert!(check_conservation(&released_account, [&released]).is_empty());
        assert_eq!(
            release(&mut released_account, &mut released, at(109), &p, D),
            Err(Error::LeaseNotActive { state: LeaseState::Released })
        );
        assert_eq!(reclaim(&mut released_account, &mut released, at(500), &p, D), Ok(None));

        assert_eq!(
            reclaim(&mut account, &mut l, at(110), &p, D),
            Ok(Some(Settlement { charged: 10, returned: 0, excess: 2 }))
        );
        assert_eq!(l.state, LeaseState::Reclaimed);
        assert!(check_conservation(&account, [&l]).is_empty());
    }

    #[test]
    fn settling_a_lease_of_another_account_or_over_reserved_is_corrupt() {
        let p = policy(0);
        let mut account = funded(10);
        let mut foreign = lease(5, 0, LeaseState::Active, 100);
        foreign.account_id = "b".into();
        assert!(matches!(release(&mut account, &mut foreign, at(0), &p, D), Err(Error::StorageCorrupt(_))));
        let mut over = lease(5, 0, LeaseState::Active, 100);
        assert!(matches!(release(&mut account, &mut over, at(0), &p, D), Err(Error::StorageCorrupt(_))));
        assert_eq!(over.state, LeaseState::Active);
        assert_eq!(account, funded(10));
    }

    #[test]
    fn consolidation_checks_everything_before_settling() {
        let p = policy(0);
        let ttl = SignedDuration::from_nanos(50);
        let mut account = funded(30);
        acquire(&mut account, 10, ttl, at(0), &p, D).unwrap();
        acquire(&mut account, 10, ttl, at(0), &p, D).unwrap();
        let mut a = lease(10, 3, LeaseState::Active, 50);
        a.lease_id = "a1".into();
        let mut b = lease(10, 12, LeaseState::Active, 50);
        b.lease_id = "b1".into();
        b.fencing_token = 2;
        account.billed = 15;
        let start = account.clone();

        let mut sources = [a.clone(), a.clone()];
        assert_eq!(
            consolidate(&mut account, &mut sources, 0, ttl, at(1), &p, D),
            Err(Error::DuplicateSourceLease { lease_id: "a1".into() })
        );
        assert_eq!(consolidate(&mut account, &mut [], 0, ttl, at(1), &p, D), Err(Error::NoSourceLeases));
        let mut sources = [a.clone(), b.clone()];
        assert_eq!(
            consolidate(&mut account, &mut sources, 11, ttl, at(1), &p, D),
            Err(Error::InsufficientBalance { available: 10, requested: 11 })
        );
        assert_eq!(consolidate(&mut account, &mut sources, 0, ttl, at(50), &p, D), Err(Error::LeaseExpired));
        assert_eq!(
            consolidate(&mut account, &mut sources, 0, ttl, Timestamp::MAX, &p, D),
            Err(Error::ExpiryOutOfRange)
        );
        assert_eq!(
            consolidate(&mut account, &mut sources, u64::MAX, ttl, at(1), &p, UnitDomain::I64),
            Err(Error::UnitsOutOfRange { units: u64::MAX, max: i64::MAX as u64 })
        );
        let mut fully_used = [b.clone()];
        assert_eq!(consolidate(&mut account, &mut fully_used, 0, ttl, at(1), &p, D), Err(Error::InvalidUnits));
        let mut mixed = [a.clone(), b.clone()];
        mixed[1].account_id = "b".into();
        assert_eq!(consolidate(&mut account, &mut mixed, 0, ttl, at(1), &p, D), Err(Error::MixedAccounts));
        let mut inactive = [a.clone(), b.clone()];
        inactive[1].state = LeaseState::Reclaimed;
        assert_eq!(
            consolidate(&mut account, &mut inactive, 0, ttl, at(1), &p, D),
            Err(Error::LeaseNotActive { state: LeaseState::Reclaimed })
        );
        assert_eq!(account, start);
        assert!(sources.iter().all(|l| l.state == LeaseState::Active));

        let (grant, settlements) = consolidate(&mut account, &mut sources, 10, ttl, at(1), &p, D).unwrap();
        assert_eq!(grant, Grant { fencing_token: 3, granted: 17, expiry: at(51) });
        assert_eq!(
            settlements,
            [Settlement { charged: 3, returned: 7, excess: 0 }, Settlement { charged: 10, returned: 0, excess: 2 }]
        );
        assert_eq!(
            (account.available, account.reserved, account.consumed, account.overage, account.next_fence),
            (0, 17, 13, 2, 4)
        );
        assert!(sources.iter().all(|l| l.state == LeaseState::Consolidated));
        let new_lease = grant.into_lease("n".into(), "a".into());
        assert!(check_conservation(&account, sources.iter().chain([&new_lease])).is_empty());
    }

    #[test]
    fn checker_names_each_violated_equation() {
        let mut account = funded(10);
        let active = lease(4, 1, LeaseState::Active, 0);
        let settled = lease(100, 100, LeaseState::Released, 0);
        account.available = 6;
        account.reserved = 4;
        account.billed = 1;
        assert!(check_conservation(&account, [&active, &settled]).is_empty());

        let mut broken = account.clone();
        broken.available = 5;
        let v = check_conservation(&broken, [&active]);
        assert_eq!(v, [Violation { account_id: "a".into(), equation: Equation::Balance, left: 10, right: 9 }]);
        assert_eq!(v[0].to_string(), "account a: credited_eq_available_reserved_consumed violated (10 != 9)");

        let v = check_conservation(&account, [&active, &active]);
        let equations: Vec<_> = v.iter().map(|v| (v.equation, v.left, v.right)).collect();
        assert_eq!(equations, [(Equation::Reserved, 4, 8), (Equation::Billed, 1, 2)]);
        assert_eq!(Equation::Reserved.code(), "reserved_eq_active_granted");
        assert_eq!(Equation::Billed.code(), "billed_eq_consumed_overage_active_used");

        let mut huge = account.clone();
        huge.credited = u64::MAX;
        huge.available = u64::MAX;
        huge.consumed = 1;
        huge.reserved = 0;
        let v = check_conservation(&huge, []);
        assert_eq!(v[0].right, u128::from(u64::MAX) + 1);
    }

    #[test]
    fn revocation_keeps_the_first_time_and_spares_earlier_usage() {
        let mut c = Credential {
            credential_id: "c".into(),
            account_id: "a".into(),
            label: String::new(),
            created_at: at(0),
            revoked_at: None,
            last_used_at: None,
            accepted_events: 0,
            accepted_units: 0,
        };
        assert!(!c.is_revoked_at(at(1_000)));
        c.revoke(at(10));
        c.revoke(at(20));
        assert_eq!(c.revoked_at, Some(at(10)));
        assert!(!c.is_revoked_at(at(9)));
        assert!(c.is_revoked_at(at(10)));
        assert!(c.is_revoked_at(at(11)));
    }

    /// A value near either end of `u64`, or anywhere: settlements overflow
    /// only near the top, and refuse near zero.
    fn units() -> impl proptest::strategy::Strategy<Value = u64> {
        use proptest::prelude::*;
        prop_oneof![
            0u64..100,
            (i64::MAX as u64 - 100)..=(i64::MAX as u64 + 100),
            (u64::MAX - 100)..=u64::MAX,
            any::<u64>()
        ]
    }

    proptest::proptest! {
        /// `SETTLEMENT_TERMS` is `settled_account`: the account it makes, or
        /// its refusal exactly when a counter would leave the domain; and
        /// each counter moves the same way for every lease.
        #[test]
        fn settlement_terms_are_the_settlement(
            counters in proptest::array::uniform7(units()),
            (granted, used) in (units(), units()),
            (other_granted, other_used) in (units(), units()),
            domain in proptest::prop_oneof![proptest::strategy::Just(D), proptest::strategy::Just(UnitDomain::I64)],
        ) {
            // An account holds counters of its store's domain only.
            let counters = counters.map(|counter| counter.min(domain.max()));
            let account = Account::with_counters("a".into(), counters);
            let lease = lease(granted, used, LeaseState::Active, 0);
            let change = SETTLEMENT_TERMS.change(granted, used);
            let expected: Option<Vec<u64>> = counters
                .iter()
                .zip(change)
                .map(|(&counter, delta)| {
                    u64::try_from(i128::from(counter) + delta).ok().filter(|&value| domain.contains(value))
                })
                .collect();
            match settled_account(&account, &lease, domain) {
                Ok((next, settlement)) => {
                    proptest::prop_assert_eq!(Some(next.counters().to_vec()), expected);
                    proptest::prop_assert_eq!(settlement, settle(granted, used));
                }
                Err(_) => proptest::prop_assert_eq!(expected, None),
            }
            let other = SETTLEMENT_TERMS.change(other_granted, other_used);
            for (counter, (a, b)) in COUNTER_NAMES.iter().zip(change.into_iter().zip(other)) {
                proptest::prop_assert!(a.signum() * b.signum() >= 0, "{counter} moves both ways: {a} and {b}");
            }
        }
    }
}
