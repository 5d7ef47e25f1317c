//! The unlocked path: acquire and release in one round trip when this server
//! last wrote the rows, two otherwise; a reclaim pass in two.
//!
//! The locking path spends four round trips on an operation: BEGIN, a locking
//! read, the write, COMMIT, each waited for in turn, since a transaction's
//! statements cannot be sent before its BEGIN is answered. On this path an
//! operation is autocommitted statements on one connection:
//!
//! 1. a view of the rows the core needs: the rows as this server last wrote
//!    them (`Guesses`), or else an ordinary read (no lock, no transaction),
//!    which is a committed state as of the statement's snapshot;
//! 2. the core decides on that view, exactly as on the locking path;
//! 3. one write that applies the decision only if the rows it depended on
//!    still hold what the view showed, under row locks taken in the global
//!    order (account before lease), re-checked by PostgreSQL on the newest row
//!    version. It also returns the rows as its snapshot found them.
//!
//! A refusal by the core on a read is final: it was decided on a committed
//! state, so the operation takes effect (as a refusal) at the read. A refusal
//! on a remembered view is not: the committed rows are read and decided on. A
//! write that finds its rows changed writes nothing; the core decides again on
//! the rows it returned, and after a second such write the caller runs the
//! locking path, which waits for the rows and decides again. So the result is
//! always one the locking path could have produced; a stale view or
//! contention costs round trips, never a wrong answer.
//!
//! What "unchanged" means differs by operation, and is the whole argument:
//!
//! - **Acquire** depends on every counter of the account (the balance, the
//!   fence, and the ranges of the others), so the write compares all seven
//!   and stores the core's new values only if all are unchanged.
//! - **Release and reclaim** settle a lease: the core's settlement is a
//!   function of the lease's `granted` and `used` alone, and the lease may be
//!   settled only while it is active. So the write compares the lease's
//!   `state` and `used` (the only lease columns that change), and adds the
//!   core's change to the account (new minus old, counter by counter) to
//!   whatever the account holds by then, so that unrelated changes to the
//!   account (another lease's acquire or usage) do not conflict. The core's
//!   range checks on the account are repeated by PostgreSQL: the columns'
//!   `CHECK (… >= 0)` and `BIGINT`'s own range. A write that would leave them
//!   fails as a whole, and the locking path then gives the core's own answer.
//! - **A remembered view** was never decoded from the row, so it cannot vouch
//!   that the row is well-formed. A write from one compares every column of
//!   the rows it used (release: the account's counters too); a row that
//!   differs is returned and decoded, and a corrupt one is reported as
//!   `storage_corrupt` exactly as a read would have.
//!
//! The settling writes lock the accounts with `SKIP LOCKED`: a lease whose
//! account another transaction holds is left as it is (for release, that is
//! a conflict; for reclaim, the lease stays due for the next pass), so they
//! never wait on an account lock, and, since every other writer of a lease
//! holds its account's lock first, never on a lease lock either, except
//! behind a locking reclaim pass, which itself never waits.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Mutex, PoisonError};

use jiff::{SignedDuration, Timestamp};
use sqlx::PgConnection;
use tollgate_core::ledger::{self, LeaseState};
use tollgate_core::{Account, Error, InstantPair, Lease, SecretHash};
use tollgate_store::{IssuedLease, ReclaimReport, ReclaimedLease, Released, SkippedLease, reclaim_read_max};

use super::{
    AccountRow, DOMAIN, Engine, HeldLeaseRow, LeaseRecord, LeaseRow, db_i64, held, load_account, load_held,
    storage_error,
};

/// What an attempt on the unlocked path came to.
pub(super) enum Attempt<T> {
    /// Decided and, if it changed anything, written.
    Done(T),
    /// Each write found its rows changed, or PostgreSQL refused a write's
    /// ranges: nothing was written; run the locking path.
    Conflict,
}

/// Writes an attempt may make before it gives way to the locking path: the
/// first on a guess or a read, the second on the row the first one found.
const WRITES_MAX: u32 = 2;

/// Entries each map of `Guesses` holds; a full map is emptied and refilled.
const GUESSES_MAX: usize = 65_536;

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
    unwritten: std::sync::atomic::AtomicU64,
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
    fn account(&self, account_id: &str) -> Option<Account> {
        locked(&self.accounts).get(account_id).cloned()
    }

    /// A lease with its capability hash, and its account.
    fn held(&self, lease_id: &str) -> Option<(Account, LeaseRecord)> {
        let (lease, capability) = locked(&self.leases).get(lease_id).cloned()?;
        let account = self.account(&lease.account_id)?;
        Some((account, LeaseRecord { lease, capability }))
    }

    fn remember_account(&self, account: Account) {
        remember(&self.accounts, account.account_id.clone(), account);
    }

    fn remember_lease(&self, lease: &Lease, capability: SecretHash) {
        remember(&self.leases, lease.lease_id.clone(), (lease.clone(), capability));
    }

    fn forget_lease(&self, lease_id: &str) {
        locked(&self.leases).remove(lease_id);
    }

    /// Counts a write that found its rows changed and wrote nothing.
    fn count_unwritten(&self) {
        #[cfg(feature = "testing")]
        self.probe.unwritten.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    #[cfg(feature = "testing")]
    async fn pause_after_read(&self) {
        let pause = locked(&self.probe.release_pause).take();
        if let Some(pause) = pause {
            pause.read.notify_one();
            pause.resume.notified().await;
        }
    }

    fn forget(&self, account_id: &str, lease_id: Option<&str>) {
        locked(&self.accounts).remove(account_id);
        if let Some(lease_id) = lease_id {
            self.forget_lease(lease_id);
        }
    }
}

#[derive(sqlx::FromRow)]
struct WrittenAccountRow {
    written: i64,
    #[sqlx(flatten)]
    account: AccountRow,
}

#[derive(sqlx::FromRow)]
struct WrittenHeldRow {
    written: i64,
    written_credited: Option<i64>,
    written_available: Option<i64>,
    written_reserved: Option<i64>,
    written_consumed: Option<i64>,
    written_overage: Option<i64>,
    written_billed: Option<i64>,
    written_next_fence: Option<i64>,
    #[sqlx(flatten)]
    account: AccountRow,
    #[sqlx(flatten)]
    lease: LeaseRow,
}

impl WrittenHeldRow {
    /// The account as the write left it, when it wrote.
    fn written_account(&self) -> Option<Result<Account, Error>> {
        let row = AccountRow {
            account_id: self.account.account_id.clone(),
            credited: self.written_credited?,
            available: self.written_available?,
            reserved: self.written_reserved?,
            consumed: self.written_consumed?,
            overage: self.written_overage?,
            billed: self.written_billed?,
            next_fence: self.written_next_fence?,
        };
        Some(row.decode())
    }
}

/// The seven account counters, in column order, as `BIGINT` values.
fn counters(account: &Account) -> Result<[i64; 7], Error> {
    Ok([
        db_i64(account.credited, "credited")?,
        db_i64(account.available, "available")?,
        db_i64(account.reserved, "reserved")?,
        db_i64(account.consumed, "consumed")?,
        db_i64(account.overage, "overage")?,
        db_i64(account.billed, "billed")?,
        db_i64(account.next_fence, "next_fence")?,
    ])
}

/// The core's change to an account, counter by counter (`after - before`).
/// Both sides are within `BIGINT`, so no difference overflows.
fn difference(before: &Account, after: &Account) -> Result<[i64; 7], Error> {
    let (before, after) = (counters(before)?, counters(after)?);
    Ok(std::array::from_fn(|i| after[i] - before[i]))
}

/// Whether PostgreSQL refused a write for its values' ranges (22: data
/// exception, such as `BIGINT` overflow; 23: integrity, such as a `CHECK`).
fn out_of_range(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Database(db) => db.code().is_some_and(|code| code.starts_with("22") || code.starts_with("23")),
        _ => false,
    }
}

const READ_ACCOUNT_SQL: &str =
    concat!("SELECT ", account_columns!(), " FROM tollgate_accounts a WHERE a.account_id = $1");

const READ_HELD_LEASE_SQL: &str = concat!(held_lease_select!(), " WHERE l.lease_id = $1");

const READ_DUE_SQL: &str = concat!(
    held_lease_select!(),
    " WHERE l.state = 'active' AND (l.expiry_floor_us, l.expiry_submicro_ns) <= ($1, $2) \
     ORDER BY l.expiry_floor_us, l.expiry_submicro_ns, l.lease_id LIMIT $3"
);

/// Stores the account's new counters and inserts the granted lease, only if
/// every counter still holds what the core decided on ($2–$8). Returns
/// whether it wrote, and the account as the statement found it (its snapshot,
/// from before the write), for deciding again when it did not.
const ACQUIRE_IF_UNCHANGED_SQL: &str = concat!(
    "
WITH account AS (
    UPDATE tollgate_accounts AS a
    SET credited = $9, available = $10, reserved = $11, consumed = $12, overage = $13,
        billed = $14, next_fence = $15
    WHERE a.account_id = $1
      AND (a.credited, a.available, a.reserved, a.consumed, a.overage, a.billed, a.next_fence)
          = ($2, $3, $4, $5, $6, $7, $8)
    RETURNING a.account_id
), granted AS (
    INSERT INTO tollgate_leases (lease_id, account_id, fencing_token, capability_hash, granted,
        used, state, expiry_floor_us, expiry_submicro_ns, expiry_is_upper_bound)
    SELECT $16, account.account_id, $17, $18, $19, $20, $21, $22, $23, $24
    FROM account
    RETURNING 1
)
SELECT (SELECT count(*) FROM granted) AS written, ",
    account_columns!(),
    " FROM tollgate_accounts a WHERE a.account_id = $1"
);

/// Settles one lease if every column of its row still holds what the core
/// decided on ($1–$3, $12–$17; `state` must be active), under its account's
/// lock taken without waiting, and adds the lease's account change ($5–$11) to
/// the account. When $18 is true the account's counters must also still be
/// $19–$25: a guess was never decoded from the row, so only a row equal to
/// it in every column is known to be well-formed. Returns whether it wrote,
/// the account's counters as written (the change is added to whatever the
/// row held by then, which may differ from the view), and the lease and
/// account as the statement found them (its snapshot).
const RELEASE_IF_UNCHANGED_SQL: &str = concat!(
    "
WITH locked AS (
    SELECT a.account_id
    FROM tollgate_accounts AS a
    WHERE a.account_id = $2
      AND (NOT $18::bool
           OR (a.credited, a.available, a.reserved, a.consumed, a.overage, a.billed, a.next_fence)
              = ($19, $20, $21, $22, $23, $24, $25))
    FOR NO KEY UPDATE SKIP LOCKED
), settled AS (
    UPDATE tollgate_leases AS l
    SET state = $4, settled_at = now()
    FROM locked
    WHERE l.lease_id = $1
      AND l.account_id = locked.account_id
      AND l.state = 'active'
      AND l.used = $3
      AND (l.fencing_token, l.capability_hash, l.granted, l.expiry_floor_us, l.expiry_submicro_ns,
           l.expiry_is_upper_bound) = ($12, $13, $14, $15, $16, $17)
    RETURNING l.account_id
), accounts AS (
    UPDATE tollgate_accounts AS a
    SET credited = a.credited + $5, available = a.available + $6, reserved = a.reserved + $7,
        consumed = a.consumed + $8, overage = a.overage + $9, billed = a.billed + $10,
        next_fence = a.next_fence + $11
    FROM settled
    WHERE a.account_id = settled.account_id
    RETURNING a.credited, a.available, a.reserved, a.consumed, a.overage, a.billed, a.next_fence
)
SELECT (SELECT count(*) FROM accounts) AS written, w.credited AS written_credited,
    w.available AS written_available, w.reserved AS written_reserved,
    w.consumed AS written_consumed, w.overage AS written_overage, w.billed AS written_billed,
    w.next_fence AS written_next_fence, ",
    account_columns!(),
    ", ",
    lease_columns!(),
    " FROM tollgate_leases l JOIN tollgate_accounts a ON a.account_id = l.account_id \
     LEFT JOIN accounts w ON true WHERE l.lease_id = $1"
);

/// Settles every listed lease that is still active with the `used` the core
/// read, whose account it can lock without waiting, and adds each settled
/// lease's account change to its account. Returns the settled lease ids.
/// Locks follow the global order: accounts by `account_id`, then their leases
/// by `lease_id` (`leases`), before the UPDATE touches any lease row.
const SETTLE_IF_UNCHANGED_SQL: &str = "
WITH locked AS (
    SELECT u.*
    FROM unnest($1::text[], $2::text[], $3::int8[], $4::text[], $5::int8[], $6::int8[], $7::int8[],
                $8::int8[], $9::int8[], $10::int8[], $11::int8[])
        AS u(account_id, lease_id, used, state, credited, available, reserved, consumed, overage,
             billed, next_fence)
    JOIN tollgate_accounts AS a ON a.account_id = u.account_id
    ORDER BY a.account_id
    FOR NO KEY UPDATE OF a SKIP LOCKED
), leases AS (
    SELECT l.lease_id
    FROM tollgate_leases AS l
    JOIN locked AS k ON k.lease_id = l.lease_id AND k.account_id = l.account_id
    ORDER BY l.lease_id
    FOR UPDATE OF l
), settled AS (
    UPDATE tollgate_leases AS l
    SET state = k.state, settled_at = now()
    FROM locked AS k
    JOIN leases AS x ON x.lease_id = k.lease_id
    WHERE l.lease_id = k.lease_id
      AND l.account_id = k.account_id
      AND l.state = 'active'
      AND l.used = k.used
    RETURNING l.lease_id, l.account_id, k.credited, k.available, k.reserved, k.consumed,
        k.overage, k.billed, k.next_fence
), totals AS (
    SELECT s.account_id, sum(s.credited) AS credited, sum(s.available) AS available,
        sum(s.reserved) AS reserved, sum(s.consumed) AS consumed, sum(s.overage) AS overage,
        sum(s.billed) AS billed, sum(s.next_fence) AS next_fence
    FROM settled AS s
    GROUP BY s.account_id
), accounts AS (
    UPDATE tollgate_accounts AS a
    SET credited = a.credited + t.credited, available = a.available + t.available,
        reserved = a.reserved + t.reserved, consumed = a.consumed + t.consumed,
        overage = a.overage + t.overage, billed = a.billed + t.billed,
        next_fence = a.next_fence + t.next_fence
    FROM totals AS t
    WHERE a.account_id = t.account_id
    RETURNING 1
)
SELECT s.lease_id FROM settled AS s";

/// A settlement the core decided on an unlocked read.
struct Settling {
    /// The lease as read: its id, account and `used` are compared.
    before: Lease,
    /// The state the core moved it to.
    state: LeaseState,
    /// The core's change to the lease's account.
    difference: [i64; 7],
}

/// Writes `settling` with `SETTLE_IF_UNCHANGED_SQL`. `None` when PostgreSQL
/// refused the write for its ranges (nothing was written).
async fn settle_if_unchanged(conn: &mut PgConnection, settling: &[Settling]) -> Result<Option<HashSet<String>>, Error> {
    let column = |i: usize| settling.iter().map(|s| s.difference[i]).collect::<Vec<i64>>();
    let result = sqlx::query_scalar::<_, String>(SETTLE_IF_UNCHANGED_SQL)
        .bind(settling.iter().map(|s| s.before.account_id.clone()).collect::<Vec<_>>())
        .bind(settling.iter().map(|s| s.before.lease_id.clone()).collect::<Vec<_>>())
        .bind(settling.iter().map(|s| db_i64(s.before.used, "lease_used")).collect::<Result<Vec<_>, _>>()?)
        .bind(settling.iter().map(|s| s.state.as_str().to_owned()).collect::<Vec<_>>())
        .bind(column(0))
        .bind(column(1))
        .bind(column(2))
        .bind(column(3))
        .bind(column(4))
        .bind(column(5))
        .bind(column(6))
        .fetch_all(&mut *conn)
        .await;
    match result {
        Ok(ids) => Ok(Some(ids.into_iter().collect())),
        Err(error) if out_of_range(&error) => Ok(None),
        Err(error) => Err(storage_error(error)),
    }
}

impl Engine {
    pub(super) async fn acquire_unlocked(
        &self,
        account_id: &str,
        units: u64,
        ttl: SignedDuration,
        now: Timestamp,
    ) -> Result<Attempt<IssuedLease>, Error> {
        let mut conn = self.pool.acquire().await.map_err(storage_error)?;
        let (mut before, mut guessed) = match self.guesses.account(account_id) {
            Some(guess) => (guess, true),
            None => (load_account(&mut conn, READ_ACCOUNT_SQL, account_id).await?, false),
        };
        let mut writes = 0;
        loop {
            let mut account = before.clone();
            let grant = match ledger::acquire(&mut account, units, ttl, now, &self.policy, DOMAIN) {
                Ok(grant) => grant,
                // A refusal of a guess proves nothing: decide on what is committed.
                Err(_) if std::mem::take(&mut guessed) => {
                    before = load_account(&mut conn, READ_ACCOUNT_SQL, account_id).await?;
                    continue;
                }
                Err(refusal) => return Err(refusal),
            };
            let issued = Self::issue(account_id, grant);
            let capability = issued.capability.hash();
            let lease = &issued.lease;
            let expiry = InstantPair::encode(lease.expiry);
            let mut query = sqlx::query_as::<_, WrittenAccountRow>(ACQUIRE_IF_UNCHANGED_SQL).bind(account_id);
            for value in counters(&before)?.into_iter().chain(counters(&account)?) {
                query = query.bind(value);
            }
            let found = query
                .bind(&lease.lease_id)
                .bind(db_i64(lease.fencing_token, "next_fence")?)
                .bind(capability.as_bytes().to_vec())
                .bind(db_i64(lease.granted, "granted")?)
                .bind(db_i64(lease.used, "lease_used")?)
                .bind(lease.state.as_str())
                .bind(expiry.floor_us)
                .bind(expiry.submicro_ns)
                .bind(lease.expiry_is_upper_bound)
                .fetch_optional(&mut *conn)
                .await
                .map_err(storage_error)?;
            let Some(found) = found else {
                self.guesses.forget(account_id, None);
                return Err(Error::AccountNotFound);
            };
            if found.written == 1 {
                self.guesses.remember_account(account);
                self.guesses.remember_lease(lease, capability);
                return Ok(Attempt::Done(issued));
            }
            self.guesses.count_unwritten();
            writes += 1;
            if writes == WRITES_MAX {
                self.guesses.forget(account_id, None);
                return Ok(Attempt::Conflict);
            }
            // Committed, as of the write's snapshot: what to decide on next.
            before = found.account.decode()?;
            guessed = false;
        }
    }

    pub(super) async fn release_unlocked(
        &self,
        lease_id: &str,
        capability: &str,
        now: Timestamp,
    ) -> Result<Attempt<Released>, Error> {
        let mut conn = self.pool.acquire().await.map_err(storage_error)?;
        let (mut account_before, mut record, mut guessed) = match self.guesses.held(lease_id) {
            Some((account, record)) => (account, record, true),
            None => {
                let (account, record) = load_held(&mut conn, READ_HELD_LEASE_SQL, lease_id).await?;
                #[cfg(feature = "testing")]
                self.guesses.pause_after_read().await;
                (account, record, false)
            }
        };
        let mut writes = 0;
        loop {
            let decided = held(Some(&record), capability).and_then(|lease_before| {
                let (mut account, mut lease) = (account_before.clone(), lease_before.clone());
                let settlement = ledger::release(&mut account, &mut lease, now, &self.policy, DOMAIN)?;
                Ok((lease_before, account, lease, settlement))
            });
            let (lease_before, account, lease, settlement) = match decided {
                Ok(decided) => decided,
                // A refusal of a guess proves nothing: decide on what is committed.
                Err(_) if std::mem::take(&mut guessed) => {
                    (account_before, record) = load_held(&mut conn, READ_HELD_LEASE_SQL, lease_id).await?;
                    continue;
                }
                Err(refusal) => return Err(refusal),
            };
            let mut query = sqlx::query_as::<_, WrittenHeldRow>(RELEASE_IF_UNCHANGED_SQL)
                .bind(lease_id)
                .bind(&lease_before.account_id)
                .bind(db_i64(lease_before.used, "lease_used")?)
                .bind(lease.state.as_str());
            for value in difference(&account_before, &account)? {
                query = query.bind(value);
            }
            let expiry = InstantPair::encode(lease_before.expiry);
            query = query
                .bind(db_i64(lease_before.fencing_token, "fencing_token")?)
                .bind(record.capability.as_bytes().to_vec())
                .bind(db_i64(lease_before.granted, "granted")?)
                .bind(expiry.floor_us)
                .bind(expiry.submicro_ns)
                .bind(lease_before.expiry_is_upper_bound)
                .bind(guessed);
            for value in counters(&account_before)? {
                query = query.bind(value);
            }
            let found = match query.fetch_optional(&mut *conn).await {
                Ok(found) => found,
                Err(error) if out_of_range(&error) => {
                    self.guesses.forget(&lease_before.account_id, Some(lease_id));
                    return Ok(Attempt::Conflict);
                }
                Err(error) => return Err(storage_error(error)),
            };
            let Some(found) = found else {
                self.guesses.forget(&lease_before.account_id, Some(lease_id));
                return Err(Error::LeaseNotFound);
            };
            if found.written == 1 {
                self.guesses.forget_lease(lease_id);
                // The row as written, not the view plus the change: traffic
                // between the view and the write went into the row too.
                match found.written_account() {
                    Some(Ok(written)) => self.guesses.remember_account(written),
                    _ => self.guesses.forget(&lease_before.account_id, None),
                }
                return Ok(Attempt::Done(Released { lease, settlement }));
            }
            self.guesses.count_unwritten();
            writes += 1;
            if writes == WRITES_MAX {
                self.guesses.forget(&lease_before.account_id, Some(lease_id));
                return Ok(Attempt::Conflict);
            }
            // Committed, as of the write's snapshot: what to decide on next.
            account_before = found.account.decode()?;
            record = found.lease.decode()?;
            guessed = false;
        }
    }

    /// One reclaim pass. Leases that changed since the read, or whose account
    /// is busy, stay due for a later pass; `Conflict` only when PostgreSQL
    /// refused the write's ranges.
    pub(super) async fn reclaim_unlocked(
        &self,
        now: Timestamp,
        cutoff: InstantPair,
        limit: u32,
    ) -> Result<Attempt<ReclaimReport>, Error> {
        let mut conn = self.pool.acquire().await.map_err(storage_error)?;
        let rows: Vec<HeldLeaseRow> = sqlx::query_as(READ_DUE_SQL)
            .bind(cutoff.floor_us)
            .bind(cutoff.submicro_ns)
            .bind(i64::from(reclaim_read_max(limit)))
            .fetch_all(&mut *conn)
            .await
            .map_err(storage_error)?;
        let (mut due, mut skipped) = due_leases(rows.into_iter().map(|row| (row.account, row.lease)), limit);
        let mut accounts = due.accounts;
        due.leases.sort_by(|a, b| (&a.account_id, &a.lease_id).cmp(&(&b.account_id, &b.lease_id)));

        let mut settling = Vec::with_capacity(due.leases.len());
        let mut reclaimed = Vec::with_capacity(due.leases.len());
        for before_lease in due.leases {
            let Some(account) = accounts.get_mut(&before_lease.account_id) else {
                return Err(super::corrupt(format!("lease {} read without its account", before_lease.lease_id)));
            };
            let before = account.clone();
            let mut lease = before_lease.clone();
            match ledger::reclaim(account, &mut lease, now, &self.policy, DOMAIN) {
                Ok(Some(settlement)) => {
                    reclaimed.push(ReclaimedLease {
                        lease_id: lease.lease_id.clone(),
                        account_id: lease.account_id.clone(),
                        settlement,
                    });
                    settling.push(Settling {
                        state: lease.state,
                        difference: difference(&before, account)?,
                        before: before_lease,
                    });
                }
                Ok(None) => {}
                Err(error) => skipped.push(skip(&before_lease.lease_id, &before_lease.account_id, &error)),
            }
        }
        if settling.is_empty() {
            return Ok(Attempt::Done(ReclaimReport { reclaimed, skipped, limit }));
        }
        let Some(settled) = settle_if_unchanged(&mut conn, &settling).await? else {
            return Ok(Attempt::Conflict);
        };
        reclaimed.retain(|r| settled.contains(&r.lease_id));
        for r in &reclaimed {
            self.guesses.forget(&r.account_id, Some(&r.lease_id));
        }
        Ok(Attempt::Done(ReclaimReport { reclaimed, skipped, limit }))
    }
}

/// Due leases a pass settles, decoded, with their accounts.
pub(super) struct Due {
    pub(super) leases: Vec<Lease>,
    pub(super) accounts: BTreeMap<String, Account>,
}

pub(super) fn skip(lease_id: &str, account_id: &str, error: &Error) -> SkippedLease {
    SkippedLease { lease_id: lease_id.to_owned(), account_id: account_id.to_owned(), reason: error.to_string() }
}

/// Decodes due rows in the order read (expiry order) until `limit` healthy
/// leases are found. A lease whose row, or whose account's row, does not
/// decode is skipped, so one corrupt row never stops the others; the rows of
/// one account carry the same counters (one snapshot or one lock), so an
/// account is decoded once.
pub(super) fn due_leases(
    rows: impl IntoIterator<Item = (AccountRow, LeaseRow)>,
    limit: u32,
) -> (Due, Vec<SkippedLease>) {
    let mut due = Due { leases: Vec::new(), accounts: BTreeMap::new() };
    let mut corrupt_accounts: HashMap<String, Error> = HashMap::new();
    let mut skipped = Vec::new();
    for (account_row, lease_row) in rows {
        if due.leases.len() == limit as usize {
            break;
        }
        let (lease_id, account_id) = (lease_row.lease_id.clone(), lease_row.lease_account_id.clone());
        let lease = match lease_row.decode() {
            Ok(record) => record.lease,
            Err(error) => {
                skipped.push(skip(&lease_id, &account_id, &error));
                continue;
            }
        };
        if !due.accounts.contains_key(&account_id) && !corrupt_accounts.contains_key(&account_id) {
            match account_row.decode() {
                Ok(account) => {
                    due.accounts.insert(account_id.clone(), account);
                }
                Err(error) => {
                    corrupt_accounts.insert(account_id.clone(), error);
                }
            }
        }
        if let Some(error) = corrupt_accounts.get(&account_id) {
            skipped.push(skip(&lease_id, &account_id, error));
            continue;
        }
        due.leases.push(lease);
    }
    (due, skipped)
}

#[cfg(feature = "testing")]
impl super::PostgresStore {
    /// The account row this server remembers having written, if any.
    pub fn remembered_account(&self, account_id: &str) -> Option<Account> {
        self.engine.guesses.account(account_id)
    }

    /// Unlocked writes so far that found their rows changed and wrote nothing.
    pub fn unwritten_writes(&self) -> u64 {
        self.engine.guesses.probe.unwritten.load(std::sync::atomic::Ordering::Relaxed)
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
