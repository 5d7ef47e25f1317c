//! The rows this server last wrote, which the unlocked path decides on first.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use tollgate_core::{Account, Lease, SecretHash};
use tollgate_store::{UnlockedCounts, UnlockedOperation};

use super::rows::LeaseRecord;

/// Entries each map of `Guesses` holds; a full map is emptied and refilled.
const GUESSES_MAX: usize = 65_536;

/// One counter per `UnlockedOperation`, at its `index`.
type PerOperation = [AtomicU64; UnlockedOperation::ALL.len()];

/// Accounts and active leases as this server last wrote them: the first guess
/// of the unlocked path, which then writes without reading first. A guess is
/// never an answer: the write compares it with the row, and one that is stale
/// (another server or another kind of operation changed the row) costs one
/// write that changes nothing and returns the committed row, which is then
/// decided on. A refusal of a guess is never returned either; the committed
/// row is read and decided on instead. So guesses change how many round trips
/// an operation takes, never its result. Bounded: `GUESSES_MAX` entries each.
#[derive(Default)]
pub(super) struct Guesses {
    accounts: Mutex<HashMap<String, Account>>,
    leases: Mutex<HashMap<String, (Lease, SecretHash)>>,
    /// Unlocked writes that wrote nothing, and fallbacks to the locking
    /// path, by `UnlockedOperation` (`Store::unlocked_counts`).
    stale_writes: PerOperation,
    fallbacks: PerOperation,
    /// What tests inspect and drive (feature `testing`).
    #[cfg(feature = "testing")]
    probe: Probe,
}

/// Test-only inspection of the unlocked path: how many writes found their
/// rows changed (each a round trip wasted), and a pause a test can hold a
/// release in, between its read and its write, to interleave traffic there.
#[cfg(feature = "testing")]
#[derive(Default)]
struct Probe {
    unwritten: AtomicU64,
    declined_reclaims: AtomicU64,
    release_pause: Mutex<Option<std::sync::Arc<ReleasePause>>>,
}

/// A release held between its read and its write: it signals `read` and
/// waits for `resume`.
#[cfg(feature = "testing")]
#[derive(Default)]
pub struct ReleasePause {
    pub read: tokio::sync::Notify,
    pub resume: tokio::sync::Notify,
}

fn locked<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding the lock leaves at worst a stale guess.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn remember<V>(map: &Mutex<HashMap<String, V>>, key: String, value: V) {
    let mut map = locked(map);
    if map.len() >= GUESSES_MAX && !map.contains_key(&key) {
        map.clear();
    }
    map.insert(key, value);
}

impl Guesses {
    pub(super) fn account(&self, account_id: &str) -> Option<Account> {
        locked(&self.accounts).get(account_id).cloned()
    }

    /// The lease `lease_id` of `account_id` with its capability hash, and its
    /// account; nothing for a lease of another account.
    pub(super) fn held(&self, account_id: &str, lease_id: &str) -> Option<(Account, LeaseRecord)> {
        let (lease, capability) =
            locked(&self.leases).get(lease_id).filter(|(l, _)| l.account_id == account_id).cloned()?;
        let account = self.account(account_id)?;
        Some((account, LeaseRecord { lease, capability }))
    }

    pub(super) fn remember_account(&self, account: Account) {
        remember(&self.accounts, account.account_id.clone(), account);
    }

    pub(super) fn remember_lease(&self, lease: &Lease, capability: SecretHash) {
        remember(&self.leases, lease.lease_id.clone(), (lease.clone(), capability));
    }

    pub(super) fn forget_lease(&self, lease_id: &str) {
        locked(&self.leases).remove(lease_id);
    }

    /// Counts a write that found its rows changed and wrote nothing.
    pub(super) fn count_unwritten(&self, operation: UnlockedOperation) {
        self.stale_writes[operation.index()].fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "testing")]
        self.probe.unwritten.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts an operation that left the unlocked path for the locking one.
    pub(super) fn count_fallback(&self, operation: UnlockedOperation) {
        self.fallbacks[operation.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a reclaim statement that declined its pass (`reclaim.rs`).
    pub(super) fn count_declined_reclaim(&self) {
        #[cfg(feature = "testing")]
        self.probe.declined_reclaims.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn counts(&self) -> UnlockedCounts {
        fn load(counts: &PerOperation) -> impl Fn(UnlockedOperation) -> u64 + '_ {
            |operation| counts[operation.index()].load(Ordering::Relaxed)
        }
        UnlockedCounts::new(load(&self.stale_writes), load(&self.fallbacks))
    }

    #[cfg(feature = "testing")]
    pub(super) async fn pause_after_read(&self) {
        let pause = locked(&self.probe.release_pause).take();
        if let Some(pause) = pause {
            pause.read.notify_one();
            pause.resume.notified().await;
        }
    }

    pub(super) fn forget(&self, account_id: &str, lease_id: Option<&str>) {
        locked(&self.accounts).remove(account_id);
        if let Some(lease_id) = lease_id {
            self.forget_lease(lease_id);
        }
    }
}

#[cfg(feature = "testing")]
impl super::PostgresStore {
    /// The account row this server remembers having written, if any.
    pub fn remembered_account(&self, account_id: &str) -> Option<Account> {
        self.engine.guesses.account(account_id)
    }

    /// Unlocked writes so far that found their rows changed and wrote nothing.
    pub fn unwritten_writes(&self) -> u64 {
        self.engine.guesses.probe.unwritten.load(Ordering::Relaxed)
    }

    /// Reclaim statements so far that declined their pass (a row that does
    /// not decode, a counter out of range) and left it to the unlocked path.
    pub fn declined_reclaims(&self) -> u64 {
        self.engine.guesses.probe.declined_reclaims.load(Ordering::Relaxed)
    }

    /// Holds the next release that reads its rows (rather than deciding on
    /// remembered ones) between that read and its write.
    pub fn pause_next_release_after_read(&self) -> std::sync::Arc<ReleasePause> {
        let pause = std::sync::Arc::new(ReleasePause::default());
        *locked(&self.engine.guesses.probe.release_pause) = Some(pause.clone());
        pause
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guesses_stay_within_their_bound_and_keep_the_newest() {
        let guesses = Guesses::default();
        for i in 0..=GUESSES_MAX {
            guesses.remember_account(Account::new(format!("a{i}")));
        }
        assert!(locked(&guesses.accounts).len() <= GUESSES_MAX);
        assert!(guesses.account(&format!("a{GUESSES_MAX}")).is_some());
        // Replacing a remembered row never empties the map.
        let before = locked(&guesses.accounts).len();
        guesses.remember_account(Account::new(format!("a{GUESSES_MAX}")));
        assert_eq!(locked(&guesses.accounts).len(), before);
    }
}
