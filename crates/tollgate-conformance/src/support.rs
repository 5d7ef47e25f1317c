//! Helpers the cases share: instants, policies, fixtures and the ledger check.

use jiff::{SignedDuration, Timestamp};
use tollgate_core::journal::check_replay;
use tollgate_core::{Entry, GrantPolicy, PageLimit, UsageEvent};
use tollgate_store::{IssuedLease, LeaseHandle, Store};

use crate::StoreFactory;

/// An instant `ns` nanoseconds from the epoch.
pub fn ts(ns: i128) -> Timestamp {
    Timestamp::from_nanosecond(ns).expect("instant in the timestamp domain")
}

pub fn nanos(ns: i64) -> SignedDuration {
    SignedDuration::from_nanos(ns)
}

pub fn secs(s: i64) -> SignedDuration {
    SignedDuration::from_secs(s)
}

pub fn policy(max_ttl: SignedDuration, grace: SignedDuration, batch_max: u32) -> GrantPolicy {
    GrantPolicy::new(max_ttl, grace, batch_max).expect("valid policy")
}

/// A policy with an hour of max TTL, the given grace, and batches of 100.
pub fn with_grace(grace: SignedDuration) -> GrantPolicy {
    policy(secs(3_600), grace, 100)
}

/// Expected counters of one account. `next_fence` starts at 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ledger {
    pub credited: u64,
    pub available: u64,
    pub reserved: u64,
    pub consumed: u64,
    pub overage: u64,
    pub billed: u64,
    pub next_fence: u64,
    pub active_leases: u64,
}

impl Default for Ledger {
    fn default() -> Self {
        Self {
            credited: 0,
            available: 0,
            reserved: 0,
            consumed: 0,
            overage: 0,
            billed: 0,
            next_fence: 1,
            active_leases: 0,
        }
    }
}

/// The [`Ledger`] a case expects, naming only the counters it moved: the
/// others keep their starting values, so a check reads as what happened.
macro_rules! ledger {
    ($($counter:ident: $value:expr),* $(,)?) => {
        $crate::support::Ledger { $($counter: $value,)* ..$crate::support::Ledger::default() }
    };
}
pub(crate) use ledger;

/// The counters of `account_id` as the store reports them.
pub async fn stored_ledger<S: Store>(store: &S, account_id: &str) -> Ledger {
    let view = store.account(account_id).await.expect("account readable");
    let a = &view.account;
    Ledger {
        credited: a.credited,
        available: a.available,
        reserved: a.reserved,
        consumed: a.consumed,
        overage: a.overage,
        billed: a.billed,
        next_fence: a.next_fence,
        active_leases: view.active_leases,
    }
}

/// The exact ledger check: every counter of `account_id` equals `expected`, and
/// the store reports no violated equation for any account.
pub async fn assert_ledger<S: Store>(store: &S, account_id: &str, expected: Ledger) {
    let actual = stored_ledger(store, account_id).await;
    assert_eq!(actual, expected, "ledger of {account_id}");
    // The equations, checked here from the expected values independently of the
    // store's own checker, then by the store's checker over its stored leases.
    assert_eq!(
        u128::from(expected.credited),
        u128::from(expected.available) + u128::from(expected.reserved) + u128::from(expected.consumed),
        "expected ledger of {account_id} violates credited = available + reserved + consumed"
    );
    let report = store.check().await.expect("check runs");
    assert!(report.violations.is_empty(), "conservation violated: {:?}", report.violations);
    // The journal, read whole, replays to the counters.
    let account = store.account(account_id).await.expect("account readable").account;
    let entries = journal(store, account_id).await;
    if let Err(error) = check_replay(&account, &entries) {
        panic!("journal of {account_id} does not replay to its counters: {error}; entries {entries:?}");
    }
    assert!(report.journal_mismatches.is_empty(), "journals do not replay: {:?}", report.journal_mismatches);
    let usage_totals = &report.usage_totals_mismatches;
    assert!(usage_totals.is_empty(), "usage totals differ from their events: {usage_totals:?}");
}

/// The whole journal of `account_id`, read page by page through `Store::journal`.
pub async fn journal<S: Store>(store: &S, account_id: &str) -> Vec<Entry> {
    let limit = PageLimit::new(Some(PageLimit::MAX)).expect("the largest limit");
    let mut entries = Vec::new();
    let mut after = 0;
    loop {
        let page = store.journal(account_id, after, limit).await.expect("journal readable");
        entries.extend(page.items);
        match page.next_after {
            Some(next) => after = next,
            None => return entries,
        }
    }
}

/// A store running `policy` with account `account_id` credited `units`.
pub async fn funded<S: Store>(store: &S, account_id: &str, units: u64) {
    store.create_account(account_id).await.expect("account created");
    if units > 0 {
        store
            .credit(account_id, &format!("seed-{account_id}"), units, jiff::Timestamp::UNIX_EPOCH)
            .await
            .expect("credited");
    }
}

/// A store on the policy most cases run under (grace zero, so that the expiry
/// itself is the boundary) with each `(account_id, units)` of `accounts`
/// created and credited.
pub async fn funded_store<F: StoreFactory>(factory: &F, accounts: &[(&str, u64)]) -> F::Store {
    let store = factory.create(with_grace(SignedDuration::ZERO)).await;
    for &(account_id, units) in accounts {
        funded(&store, account_id, units).await;
    }
    store
}

/// A credential for `account_id`; returns its id.
pub async fn credential<S: Store>(store: &S, account_id: &str, now: Timestamp) -> String {
    store.issue_credential(account_id, "gateway", now).await.expect("credential issued").credential.credential_id
}

pub fn handle(lease: &IssuedLease) -> LeaseHandle {
    LeaseHandle { lease_id: lease.lease.lease_id.clone(), capability: lease.capability.expose().to_owned() }
}

/// A usage event funded by `lease`.
pub fn leased(
    request_id: &str,
    credential_id: &str,
    lease: &IssuedLease,
    units: u64,
    occurred_at: Timestamp,
) -> UsageEvent {
    UsageEvent {
        request_id: request_id.to_owned(),
        account_id: lease.lease.account_id.clone(),
        credential_id: credential_id.to_owned(),
        units,
        occurred_at,
        lease_id: Some(lease.lease.lease_id.clone()),
        fencing_token: Some(lease.lease.fencing_token),
        dimensions: Default::default(),
    }
}

/// An overage event: no lease, billed after the fact.
pub fn overage(
    request_id: &str,
    account_id: &str,
    credential_id: &str,
    units: u64,
    occurred_at: Timestamp,
) -> UsageEvent {
    UsageEvent {
        request_id: request_id.to_owned(),
        account_id: account_id.to_owned(),
        credential_id: credential_id.to_owned(),
        units,
        occurred_at,
        lease_id: None,
        fencing_token: None,
        dimensions: Default::default(),
    }
}
