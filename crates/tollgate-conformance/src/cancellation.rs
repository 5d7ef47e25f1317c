//! Cancellation: every store operation, dropped after 0, 1, 2, … polls.
//!
//! A caller can stop waiting at any `.await` of an operation: a client that
//! hangs up makes the server drop its handler, and a timeout drops it too.
//! [`drop_at_every_step`] drives each operation of the store contract with a
//! waker that counts wake-ups, drops it after `n` polls for `n = 0, 1, 2, …`
//! until it completes within `n`, and after each drop checks that:
//!
//! - the operation took effect whole or not at all: the account's counters
//!   moved by exactly what the same operation moves them by when it runs to
//!   completion, or not at all;
//! - every conservation equation holds (the store's checker);
//! - the backend is clean ([`Harness::settle`]: PostgreSQL asserts that no
//!   session of the pool is inside a transaction);
//! - the next operations behave as on a fresh store: an acquire and a release
//!   on the same account succeed and leave its counters where they were.
//!
//! Each attempt runs on an account of its own, so attempts cannot disturb
//! one another's expectations.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use jiff::Timestamp;
use tokio::sync::Notify;
use tollgate_core::UsageEvent;
use tollgate_store::{
    Acquisition, Consolidation, Idempotency, IdempotencyKey, IssuedLease, NewCredential, Release, Revocation, Store,
};

use crate::support::{Ledger, handle, leased, secs, stored_ledger, ts};

/// A store under test and what "clean" means for its backend.
pub trait Harness: Sync {
    type Store: Store;

    fn store(&self) -> &Self::Store;

    /// Waits until operations whose callers went away have finished, then
    /// asserts that the backend holds nothing half-done.
    fn settle(&self) -> impl Future<Output = ()> + Send;
}

/// The most polls an operation may need; a bound so that a driver bug cannot
/// loop for ever.
const POLLS_MAX: usize = 10_000;

/// An operation as a future over what its attempt prepared.
type Operation<'a> = Pin<Box<dyn Future<Output = Result<(), String>> + Send + 'a>>;

/// What one attempt works on: an account of its own, funded, with a
/// credential, a live lease and a lease already due for reclaim.
struct Fixture {
    account_id: String,
    credential_id: String,
    live: IssuedLease,
    now: Timestamp,
    attempt: usize,
}

const FUNDS: u64 = 1_000;

/// The operations, by name. Each is run to completion once to learn its
/// effect, then dropped at every step.
const OPERATIONS: &[&str] = &[
    "create_account",
    "credit",
    "acquire",
    "acquire_keyed",
    "release",
    "release_keyed",
    "consolidate",
    "consolidate_keyed",
    "reclaim",
    "ingest",
    "issue_credential",
    "issue_credential_keyed",
    "revoke_credential",
    "revoke_credential_keyed",
    "verify_credential",
    "account",
    "lease",
    "lease_summary",
    "check",
];

fn operation<'a, S: Store>(store: &'a S, name: &'static str, f: &'a Fixture) -> Operation<'a> {
    let now = f.now;
    match name {
        "create_account" => {
            Box::pin(async move { store.create_account(&format!("{}-new", f.account_id)).await.done() })
        }
        "credit" => {
            Box::pin(async move { store.credit(&f.account_id, "top-up", 7, jiff::Timestamp::UNIX_EPOCH).await.done() })
        }
        "acquire" => Box::pin(async move { store.acquire(&f.account_id, 10, secs(60), now).await.done() }),
        "acquire_keyed" => Box::pin(async move {
            let key = keyed(f);
            store
                .acquire_idempotent(
                    Some(&key),
                    Acquisition { account_id: &f.account_id, units: 10, ttl: secs(60) },
                    now,
                )
                .await
                .done()
        }),
        "release_keyed" => Box::pin(async move {
            let (key, live) = (keyed(f), &f.live);
            store
                .release_idempotent(
                    Some(&key),
                    Release {
                        account_id: &live.lease.account_id,
                        lease_id: &live.lease.lease_id,
                        capability: live.capability.expose(),
                    },
                    now,
                )
                .await
                .done()
        }),
        "consolidate_keyed" => Box::pin(async move {
            let key = keyed(f);
            store
                .consolidate_idempotent(
                    Some(&key),
                    Consolidation {
                        account_id: &f.account_id,
                        sources: &[handle(&f.live)],
                        extra_units: 5,
                        ttl: secs(60),
                    },
                    now,
                )
                .await
                .done()
        }),
        "issue_credential_keyed" => Box::pin(async move {
            let key = keyed(f);
            let request = NewCredential { account_id: &f.account_id, label: "second" };
            store.issue_credential_idempotent(Some(&key), request, now).await.done()
        }),
        "revoke_credential_keyed" => Box::pin(async move {
            let key = keyed(f);
            let request = Revocation { account_id: &f.account_id, credential_id: &f.credential_id };
            store.revoke_credential_idempotent(Some(&key), request, now).await.done()
        }),
        "release" => Box::pin(async move {
            let live = &f.live;
            store.release(&live.lease.account_id, &live.lease.lease_id, live.capability.expose(), now).await.done()
        }),
        "consolidate" => {
            Box::pin(async move { store.consolidate(&f.account_id, &[handle(&f.live)], 5, secs(60), now).await.done() })
        }
        "reclaim" => Box::pin(async move { store.reclaim(now, 1_000).await.done() }),
        "ingest" => Box::pin(async move {
            let event: UsageEvent = leased(&format!("r-{}", f.attempt), &f.credential_id, &f.live, 3, now);
            store.ingest(vec![event], now).await.done()
        }),
        "issue_credential" => {
            Box::pin(async move { store.issue_credential(&f.account_id, "second", now).await.done() })
        }
        "revoke_credential" => {
            Box::pin(async move { store.revoke_credential(&f.account_id, &f.credential_id, now).await.done() })
        }
        "verify_credential" => Box::pin(async move {
            // Well formed, so that the store looks it up on the account.
            store.verify_credential(&format!("tgk_{}_{}", f.account_id, "0".repeat(64))).await.done()
        }),
        "account" => Box::pin(async move { store.account(&f.account_id).await.done() }),
        "lease" => Box::pin(async move { store.lease(&f.live.lease.account_id, &f.live.lease.lease_id).await.done() }),
        "lease_summary" => Box::pin(async move { store.lease_summary(now).await.done() }),
        "check" => Box::pin(async move { store.check().await.done() }),
        other => unreachable!("no operation {other}"),
    }
}

/// An operation's result as the harness compares it: success, or the error's text.
trait Done {
    fn done(self) -> Result<(), String>;
}

impl<T, E: std::fmt::Display> Done for Result<T, E> {
    fn done(self) -> Result<(), String> {
        self.map(drop).map_err(|error| error.to_string())
    }
}

/// An idempotency key of this attempt's own.
fn keyed(f: &Fixture) -> Idempotency {
    let key = IdempotencyKey::parse(&format!("cancellation-{}", f.attempt)).expect("a valid key");
    Idempotency { key, retention: secs(3_600) }
}

/// Prepares attempt `attempt` of `name`: a new account with everything the
/// operations need, at an instant after every earlier attempt's.
async fn prepare<S: Store>(store: &S, name: &str, attempt: usize) -> Fixture {
    // Each attempt an hour after the last: the due lease of this attempt was
    // acquired an hour before `now`, past its TTL and the grace.
    let base = 1_000_000 + 2 * 3_600 * i128::try_from(attempt).expect("few attempts");
    let now = ts(base * 1_000_000_000);
    let then = ts((base - 3_600) * 1_000_000_000);
    // Earlier attempts' due leases are settled first, so that a reclaim
    // pass of this attempt reaches this attempt's lease.
    for pass in 0.. {
        assert!(pass < 1_000, "earlier attempts left more due leases than a thousand passes settle");
        if store.reclaim(now, u32::MAX).await.expect("reclaim").reclaimed.is_empty() {
            break;
        }
    }
    let account_id = format!("{name}-{attempt}");
    store.create_account(&account_id).await.expect("account created");
    store.credit(&account_id, "funds", FUNDS, jiff::Timestamp::UNIX_EPOCH).await.expect("account funded");
    let credential_id =
        store.issue_credential(&account_id, "gateway", then).await.expect("credential issued").credential.credential_id;
    store.acquire(&account_id, 20, secs(1), then).await.expect("due lease acquired");
    let live = store.acquire(&account_id, 100, secs(600), now).await.expect("live lease acquired");
    Fixture { account_id, credential_id, live, now, attempt }
}

/// A waker that counts as one step every time the operation can make
/// progress, so that "after n polls" means "at its n-th await".
struct Step(Notify);

impl Wake for Step {
    fn wake(self: Arc<Self>) {
        self.0.notify_one();
    }
}

/// Polls `operation` at most `polls` times, each time after it was woken.
/// Returns its answer if it finished; otherwise drops it.
async fn drive(mut operation: Operation<'_>, polls: usize) -> Option<Result<(), String>> {
    let step = Arc::new(Step(Notify::new()));
    let waker = Waker::from(Arc::clone(&step));
    for _ in 0..polls {
        if let Poll::Ready(answer) = operation.as_mut().poll(&mut Context::from_waker(&waker)) {
            return Some(answer);
        }
        // `notify_one` keeps a permit when nobody waits yet, so no wake-up is lost.
        step.0.notified().await;
    }
    None
}

/// Drops every operation at every step; see the module documentation.
pub async fn drop_at_every_step<H: Harness>(harness: &H) {
    let store = harness.store();
    let mut attempt = 0;
    let mut dropped = 0;
    for &name in OPERATIONS {
        // The whole effect, from one run to completion.
        attempt += 1;
        let fixture = prepare(store, name, attempt).await;
        let before = stored_ledger(store, &fixture.account_id).await;
        drive(operation(store, name, &fixture), POLLS_MAX)
            .await
            .expect("the operation finishes")
            .unwrap_or_else(|e| panic!("{name} run to completion failed: {e}"));
        let whole = stored_ledger(store, &fixture.account_id).await;

        let mut polls = 0;
        loop {
            attempt += 1;
            let fixture = prepare(store, name, attempt).await;
            let before_attempt = stored_ledger(store, &fixture.account_id).await;
            assert_eq!(before_attempt, before, "attempts of {name} start alike");
            let finished = drive(operation(store, name, &fixture), polls).await;
            harness.settle().await;

            let after = stored_ledger(store, &fixture.account_id).await;
            assert!(
                after == before || after == whole,
                "{name} dropped after {polls} polls is neither whole nor absent: before {before:?}, \
                 whole {whole:?}, found {after:?}"
            );
            if let Some(answer) = &finished {
                assert!(answer.is_ok(), "{name} finished within {polls} polls with {answer:?}");
                assert_eq!(after, whole, "{name} answered but did not take effect");
            }
            let report = store.check().await.expect("check runs");
            assert!(report.violations.is_empty(), "{name} after {polls} polls: {:?}", report.violations);
            // An entry exists exactly when its change committed.
            let journals = &report.journal_mismatches;
            assert!(journals.is_empty(), "{name} after {polls} polls: journals {journals:?}");

            // The next operations behave as on a fresh store.
            let probe = store
                .acquire(&fixture.account_id, 1, secs(60), fixture.now)
                .await
                .unwrap_or_else(|e| panic!("acquire after {name} dropped at poll {polls}: {e}"));
            store
                .release(&probe.lease.account_id, &probe.lease.lease_id, probe.capability.expose(), fixture.now)
                .await
                .unwrap_or_else(|e| panic!("release after {name} dropped at poll {polls}: {e}"));
            let probed = stored_ledger(store, &fixture.account_id).await;
            assert_eq!(
                Ledger { next_fence: after.next_fence + 1, ..after },
                probed,
                "a lease cycle after {name} dropped at poll {polls} moved more than the fence"
            );
            harness.settle().await;

            if finished.is_some() {
                break;
            }
            dropped += 1;
            polls += 1;
            assert!(polls <= POLLS_MAX, "{name} never finished");
        }
    }
    eprintln!("{} operations, each dropped at every step: {dropped} dropped, {attempt} attempts", OPERATIONS.len());
}
