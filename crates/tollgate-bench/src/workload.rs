//! The workloads both sides of a pair run, so that a ratio compares like with
//! like: the same accounts, the same batches, the same clock.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use jiff::{SignedDuration, Timestamp};
use tollgate_core::query::{BUCKETS_MAX, GroupBy, Range, UsageQuery, Window};
use tollgate_core::{Dimensions, GrantPolicy, UsageEvent};

/// Accounts every lease benchmark spreads its operations over.
pub const ACCOUNTS: usize = 1_000;
/// Events per ingestion batch.
pub const BATCH_EVENTS: usize = 1_000;
/// Accounts one ingestion batch touches; each has one funding lease.
pub const BATCH_ACCOUNTS: usize = 10;
/// Duplicates per batch: 1% of its events replay request IDs accepted earlier.
pub const BATCH_DUPLICATES: usize = BATCH_EVENTS / 100;
/// Units credited to every benchmark account: enough never to run out.
pub const CREDIT_UNITS: u64 = 1 << 50;

pub fn account_id(index: usize) -> String {
    format!("acct-{}", index + 1)
}

pub fn policy() -> GrantPolicy {
    GrantPolicy::new(SignedDuration::from_hours(1), SignedDuration::from_secs(30), 10_000).expect("a valid policy")
}

pub fn ttl() -> SignedDuration {
    SignedDuration::from_secs(60)
}

/// A fixed clock, so that no lease ever expires during a run and both sides
/// see the same instants.
pub fn now() -> Timestamp {
    Timestamp::from_second(1_800_000_000).expect("a valid instant")
}

/// Runs a future that never waits on anything, such as a `MemoryStore` call,
/// without the cost of a runtime, so that the memory pairs time only the store.
pub fn run_ready<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    let mut context = Context::from_waker(Waker::noop());
    match future.as_mut().poll(&mut context) {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("a memory store call waited, which it never does"),
    }
}

/// What one ingestion event names: its account, credential and funding lease.
#[derive(Clone)]
pub struct Funding {
    pub account_id: String,
    pub credential_id: String,
    pub lease_id: String,
    pub fencing_token: u64,
}

/// The two dimensions `model` and `route`, over a handful of values each, of
/// event `n` of a batch.
pub fn two_dimensions(n: usize) -> Dimensions {
    Dimensions::from([
        ("model".to_owned(), format!("model-{}", n % 5)),
        ("route".to_owned(), format!("/v1/route-{}", n % 3)),
    ])
}

/// Builds ingestion batches: half leased, half overage, and 1% replays of
/// request IDs accepted in the previous batch; with dimensions, half of the
/// events (half of the leased ones, half of the overage ones) carry
/// [`two_dimensions`].
pub struct BatchMaker {
    fundings: Vec<Funding>,
    next_batch: u64,
    run_tag: String,
    previous: Vec<UsageEvent>,
    dimensions: bool,
}

impl BatchMaker {
    /// `run_tag` keeps request IDs of different runs on the same database apart.
    pub fn new(fundings: Vec<Funding>, run_tag: &str) -> Self {
        assert!(fundings.len() >= BATCH_ACCOUNTS, "a batch spreads over {BATCH_ACCOUNTS} funded accounts");
        Self { fundings, next_batch: 0, run_tag: run_tag.to_owned(), previous: Vec::new(), dimensions: false }
    }

    /// Half of the events carry two dimensions.
    pub fn with_dimensions(mut self) -> Self {
        self.dimensions = true;
        self
    }

    pub fn next_batch(&mut self) -> Vec<UsageEvent> {
        let batch_index = self.next_batch;
        self.next_batch += 1;
        let groups = self.fundings.len() / BATCH_ACCOUNTS;
        let group = (batch_index as usize) % groups;
        let fundings = &self.fundings[group * BATCH_ACCOUNTS..(group + 1) * BATCH_ACCOUNTS];
        let mut events = Vec::with_capacity(BATCH_EVENTS);
        let fresh = if self.previous.is_empty() { BATCH_EVENTS } else { BATCH_EVENTS - BATCH_DUPLICATES };
        for n in 0..fresh {
            let funding = &fundings[n % BATCH_ACCOUNTS];
            let leased = n % 2 == 0;
            events.push(UsageEvent {
                request_id: format!("{}-{batch_index}-{n}", self.run_tag),
                account_id: funding.account_id.clone(),
                credential_id: funding.credential_id.clone(),
                units: 1,
                occurred_at: now(),
                lease_id: leased.then(|| funding.lease_id.clone()),
                fencing_token: leased.then_some(funding.fencing_token),
                dimensions: if self.dimensions && n % 4 < 2 { two_dimensions(n) } else { Dimensions::new() },
            });
        }
        events.append(&mut self.previous);
        self.previous = events.iter().take(BATCH_DUPLICATES).cloned().collect();
        events
    }
}

/// The account of the usage query pair.
pub const USAGE_ACCOUNT: &str = "usage-1";
/// Accepted events of that account, spread evenly over [`USAGE_DAYS`].
pub const USAGE_EVENTS: u64 = 1_000_000;
/// Days the usage query spans, ending at [`now`].
pub const USAGE_DAYS: i64 = 30;
/// Distinct values of the `model` dimension the events carry.
pub const USAGE_MODELS: u64 = 5;
/// Hourly buckets of the query: 30 × 24 = 720.
pub const USAGE_BUCKETS: u64 = USAGE_DAYS as u64 * 24;
const _: () = assert!(USAGE_BUCKETS <= BUCKETS_MAX, "the usage query must stay within the bucket limit");

/// The usage query's range: the [`USAGE_DAYS`] days before [`now`], which
/// begins and ends on a whole hour.
pub fn usage_range() -> Range {
    let from = now().checked_sub(SignedDuration::from_hours(USAGE_DAYS * 24)).expect("a valid instant");
    Range::new(from, now()).expect("a nonempty range")
}

/// Hourly totals over the range, grouped by the `model` dimension.
pub fn usage_query() -> UsageQuery {
    UsageQuery::new(usage_range(), Some(Window::Hour), GroupBy::Dimension("model".to_owned()))
        .expect("720 buckets are within the bucket limit")
}

/// A `MemoryStore` with `accounts` credited accounts.
pub fn memory_store(accounts: usize) -> tollgate_store::MemoryStore {
    use tollgate_store::Store;
    let store = tollgate_store::MemoryStore::new(policy());
    for index in 0..accounts {
        let account = account_id(index);
        run_ready(store.create_account(&account)).expect("a new account");
        run_ready(store.credit(&account, "bench-credit", CREDIT_UNITS, jiff::Timestamp::UNIX_EPOCH)).expect("a credit");
    }
    store
}

/// Gives each of the first `accounts` accounts of `store` a credential and a
/// funding lease that outlives the run.
pub fn memory_fundings(store: &tollgate_store::MemoryStore, accounts: usize) -> Vec<Funding> {
    use tollgate_store::Store;
    (0..accounts)
        .map(|index| {
            let account = account_id(index);
            let credential = run_ready(store.issue_credential(&account, "bench", now())).expect("a credential");
            let lease = run_ready(store.acquire(&account, CREDIT_UNITS / 2, ttl(), now())).expect("a lease");
            Funding {
                account_id: account,
                credential_id: credential.credential.credential_id,
                lease_id: lease.lease.lease_id,
                fencing_token: lease.lease.fencing_token,
            }
        })
        .collect()
}

/// The model's counterpart of `memory_store` and `memory_fundings`.
pub fn model(accounts: usize, funded: usize) -> (crate::model::Model, Vec<Funding>) {
    let policy = policy();
    let mut model = crate::model::Model::new(policy.max_ttl(), policy.reclaim_grace());
    for index in 0..accounts {
        model.create_account(&account_id(index), CREDIT_UNITS);
    }
    let fundings = (0..funded)
        .map(|index| {
            let account = account_id(index);
            let credential_id = format!("cred-{}", index + 1);
            model.create_credential(&credential_id, &account);
            let grant = model.acquire(&account, CREDIT_UNITS / 2, ttl(), now()).expect("a lease");
            Funding { account_id: account, credential_id, lease_id: grant.lease_id, fencing_token: grant.fencing_token }
        })
        .collect();
    (model, fundings)
}
