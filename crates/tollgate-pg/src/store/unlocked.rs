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

use jiff::Timestamp;
use sqlx::PgConnection;
use tollgate_core::journal::EntryKind;
use tollgate_core::ledger::{self, LeaseState};
use tollgate_core::{Account, COUNTERS, Change, EntryIds, Error, InstantPair, Lease, Settlement};
use tollgate_store::{
    Acquisition, IssuedLease, ReclaimReport, ReclaimedLease, Release, Released, SkippedLease, UnlockedOperation,
    reclaim_read_max,
};

use super::errors::{corrupt, db_i64, db_i64_delta, out_of_range, storage_error};
use super::load::{held, load_account, load_held};
use super::rows::{
    AccountRow, DueRow, HeldLeaseRow, LeaseRecord, LeaseRow, WrittenAccountRow, WrittenHeldRow, counters, difference,
};
use super::sql::{
    ACQUIRE_IF_UNCHANGED_SQL, READ_ACCOUNT_SQL, READ_DUE_SQL, READ_HELD_LEASE_SQL, RELEASE_GUESSED_IF_UNCHANGED_SQL,
    RELEASE_READ_IF_UNCHANGED_SQL, SETTLE_IF_UNCHANGED_SQL,
};
use super::{DOMAIN, Engine};

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

/// A settlement the core decided on an unlocked read.
struct Settling {
    /// The lease as read: its id, account and `used` are compared.
    before: Lease,
    /// The state the core moved it to.
    state: LeaseState,
    /// The core's change to the lease's account.
    difference: [i64; COUNTERS],
}

/// When an unlocked write ran, as its journal entry records it.
pub(super) fn journal_at(now: Timestamp) -> InstantPair {
    InstantPair::encode(now)
}

/// Writes `settling` with `SETTLE_IF_UNCHANGED_SQL`. `None` when PostgreSQL
/// refused the write for its ranges (nothing was written).
async fn settle_if_unchanged(
    conn: &mut PgConnection,
    settling: &[Settling],
    now: Timestamp,
) -> Result<Option<HashSet<String>>, Error> {
    let mut query = sqlx::query_scalar::<_, String>(SETTLE_IF_UNCHANGED_SQL)
        .bind(settling.iter().map(|s| s.before.account_id.clone()).collect::<Vec<_>>())
        .bind(settling.iter().map(|s| s.before.lease_id.clone()).collect::<Vec<_>>())
        .bind(settling.iter().map(|s| db_i64(s.before.used, "lease_used")).collect::<Result<Vec<_>, _>>()?)
        .bind(settling.iter().map(|s| s.state.as_str().to_owned()).collect::<Vec<_>>());
    // One array per counter, in `COUNTER_NAMES` order: a column of `unnest`.
    for i in 0..COUNTERS {
        query = query.bind(settling.iter().map(|s| s.difference[i]).collect::<Vec<i64>>());
    }
    let at = journal_at(now);
    let result = query.bind(at.floor_us).bind(at.submicro_ns).fetch_all(&mut *conn).await;
    match result {
        Ok(ids) => Ok(Some(ids.into_iter().collect())),
        Err(error) if out_of_range(&error) => Ok(None),
        Err(error) => Err(storage_error(error)),
    }
}

/// What a release decided on: the account and lease as viewed, and whether
/// the view is a guess (`Guesses`) rather than a read.
struct ReleaseView<'a> {
    account: &'a Account,
    lease: &'a Lease,
    record: &'a LeaseRecord,
    guessed: bool,
}

/// Writes a release decided on `view` (`RELEASE_GUESSED_IF_UNCHANGED_SQL` for
/// a guess, `RELEASE_READ_IF_UNCHANGED_SQL` for a read), moving the lease to
/// `state` and the account to `account`. `None` when PostgreSQL refused the
/// write for its ranges (nothing was written); `Some(None)` when the lease
/// does not exist.
async fn release_if_unchanged(
    conn: &mut PgConnection,
    view: ReleaseView<'_>,
    account: &Account,
    state: LeaseState,
    now: Timestamp,
) -> Result<Option<Option<WrittenHeldRow>>, Error> {
    let ReleaseView { account: account_before, lease: lease_before, record, guessed } = view;
    let sql = if guessed { RELEASE_GUESSED_IF_UNCHANGED_SQL } else { RELEASE_READ_IF_UNCHANGED_SQL };
    let expiry = InstantPair::encode(lease_before.expiry);
    let mut query = sqlx::query_as::<_, WrittenHeldRow>(sql)
        .bind(&lease_before.account_id)
        .bind(&lease_before.lease_id)
        .bind(db_i64(lease_before.used, "lease_used")?)
        .bind(state.as_str())
        .bind(difference(account_before, account)?)
        .bind(db_i64(lease_before.fencing_token, "fencing_token")?)
        .bind(record.capability.as_bytes().to_vec())
        .bind(db_i64(lease_before.granted, "granted")?)
        .bind(expiry.floor_us)
        .bind(expiry.submicro_ns)
        .bind(lease_before.expiry_is_upper_bound)
        .bind(journal_at(now).floor_us)
        .bind(journal_at(now).submicro_ns);
    if guessed {
        query = query.bind(counters(account_before)?);
    }
    match query.fetch_optional(&mut *conn).await {
        Ok(found) => Ok(Some(found)),
        Err(error) if out_of_range(&error) => Ok(None),
        Err(error) => Err(storage_error(error)),
    }
}

impl Engine {
    pub(super) async fn acquire_unlocked(
        &self,
        request: Acquisition<'_>,
        now: Timestamp,
    ) -> Result<Attempt<IssuedLease>, Error> {
        let Acquisition { account_id, units, ttl } = request;
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
            let change = Change::between(EntryKind::Acquire, &before, &account, EntryIds::lease(&lease.lease_id))
                .ok_or_else(|| corrupt(format!("acquire on {account_id} changed no counter")))?;
            let at = journal_at(now);
            let found = sqlx::query_as::<_, WrittenAccountRow>(ACQUIRE_IF_UNCHANGED_SQL)
                .bind(account_id)
                .bind(counters(&before)?)
                .bind(counters(&account)?)
                .bind(&lease.lease_id)
                .bind(db_i64(lease.fencing_token, "next_fence")?)
                .bind(capability.as_bytes().to_vec())
                .bind(db_i64(lease.granted, "granted")?)
                .bind(db_i64(lease.used, "lease_used")?)
                .bind(lease.state.as_str())
                .bind(expiry.floor_us)
                .bind(expiry.submicro_ns)
                .bind(lease.expiry_is_upper_bound)
                .bind(db_i64_delta(&change.deltas)?)
                .bind(at.floor_us)
                .bind(at.submicro_ns)
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
            self.guesses.count_unwritten(UnlockedOperation::Acquire);
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
        request: Release<'_>,
        now: Timestamp,
    ) -> Result<Attempt<Released>, Error> {
        let Release { account_id, lease_id, capability } = request;
        let mut conn = self.pool.acquire().await.map_err(storage_error)?;
        let (mut account_before, mut record, mut guessed) = match self.guesses.held(account_id, lease_id) {
            Some((account, record)) => (account, record, true),
            None => {
                let (account, record) = load_held(&mut conn, READ_HELD_LEASE_SQL, account_id, lease_id).await?;
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
                    (account_before, record) = load_held(&mut conn, READ_HELD_LEASE_SQL, account_id, lease_id).await?;
                    continue;
                }
                Err(refusal) => return Err(refusal),
            };
            let view = ReleaseView { account: &account_before, lease: &lease_before, record: &record, guessed };
            let Some(found) = release_if_unchanged(&mut conn, view, &account, lease.state, now).await? else {
                self.guesses.forget(&lease_before.account_id, Some(lease_id));
                return Ok(Attempt::Conflict);
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
            self.guesses.count_unwritten(UnlockedOperation::Release);
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

    /// One reclaim pass on `conn`. Leases that changed since the read, or
    /// whose account is busy, stay due for a later pass; `Conflict` only when
    /// PostgreSQL refused the write's ranges.
    pub(super) async fn reclaim_unlocked(
        &self,
        conn: &mut PgConnection,
        now: Timestamp,
        cutoff: InstantPair,
        limit: u32,
    ) -> Result<Attempt<ReclaimReport>, Error> {
        let (mut due, mut skipped) = read_due(conn, cutoff, limit).await?;
        let mut accounts = due.accounts;
        due.leases.sort_by(|a, b| (&a.account_id, &a.lease_id).cmp(&(&b.account_id, &b.lease_id)));

        let mut settling = Vec::with_capacity(due.leases.len());
        let mut reclaimed = Vec::with_capacity(due.leases.len());
        for before_lease in due.leases {
            let Some(account) = accounts.get_mut(&before_lease.account_id) else {
                return Err(corrupt(format!("lease {} read without its account", before_lease.lease_id)));
            };
            let before = account.clone();
            let mut lease = before_lease.clone();
            match ledger::reclaim(account, &mut lease, now, &self.policy, DOMAIN) {
                Ok(Some(settlement)) => {
                    reclaimed.push(reclaimed_lease(&lease, settlement));
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
        let Some(settled) = settle_if_unchanged(conn, &settling, now).await? else {
            return Ok(Attempt::Conflict);
        };
        reclaimed.retain(|r| settled.contains(&r.lease_id));
        for r in &reclaimed {
            self.guesses.forget(&r.account_id, Some(&r.lease_id));
        }
        Ok(Attempt::Done(ReclaimReport { reclaimed, skipped, limit }))
    }
}

/// How many of the most overdue leases a pass looks at first to choose its
/// accounts (`READ_DUE_SQL`'s $4), when its bound is larger.
pub(super) const DUE_HEADS_FIRST: u32 = 64;

/// Whether a pass's read (`READ_DUE_SQL`, `RECLAIM_DUE_SQL`) that found
/// `found` of the `wanted` due leases, choosing its accounts from the
/// `heads` most overdue leases of which `considered` were due, must look at
/// as many leases as it wants: it found too few while at least as many
/// leases were due as it looked at.
pub(super) fn must_widen(found: usize, wanted: u32, considered: i64, heads: u32) -> bool {
    found < wanted as usize && considered >= i64::from(heads) && heads < wanted
}

/// The due leases of one pass (`READ_DUE_SQL`), decoded, with their accounts,
/// and the leases skipped because a row did not decode. It reads the bound's
/// worth of rows, and reads again up to twice the bound
/// (`reclaim_read_max`) only when some of those did not decode, so that
/// corrupt rows never stop the healthy ones behind them and a pass without
/// any reads no row it does not settle.
///
/// Each read chooses its accounts from the `DUE_HEADS_FIRST` most overdue
/// leases first, which finds the bound's worth when the backlog's accounts
/// each hold several due leases, and looks at as many leases as it reads
/// rows only when that found too few rows while more leases were due: the
/// rows are then those the wider read alone would return.
pub(super) async fn read_due(
    conn: &mut PgConnection,
    cutoff: InstantPair,
    limit: u32,
) -> Result<(Due, Vec<SkippedLease>), Error> {
    let mut rows_max = limit;
    loop {
        let rows = read_due_rows(conn, cutoff, rows_max).await?;
        let complete = rows.len() < rows_max as usize || rows_max == reclaim_read_max(limit);
        let (due, skipped) = due_leases(rows.into_iter().map(|row| (row.account, row.lease)), limit);
        if skipped.is_empty() || complete {
            return Ok((due, skipped));
        }
        rows_max = reclaim_read_max(limit);
    }
}

/// Up to `rows_max` rows of `READ_DUE_SQL`, exactly those it returns when it
/// looks at `rows_max` of the most overdue leases.
async fn read_due_rows(
    conn: &mut PgConnection,
    cutoff: InstantPair,
    rows_max: u32,
) -> Result<Vec<HeldLeaseRow>, Error> {
    let mut heads = rows_max.min(DUE_HEADS_FIRST);
    loop {
        let rows: Vec<DueRow> = sqlx::query_as(READ_DUE_SQL)
            .bind(cutoff.floor_us)
            .bind(cutoff.submicro_ns)
            .bind(i64::from(rows_max))
            .bind(i64::from(heads))
            .fetch_all(&mut *conn)
            .await
            .map_err(storage_error)?;
        let considered = rows.first().map_or(0, |row| row.considered);
        if !must_widen(rows.len(), rows_max, considered, heads) {
            return Ok(rows.into_iter().map(|row| row.held).collect());
        }
        heads = rows_max;
    }
}

/// Due leases a pass settles, decoded, with their accounts.
pub(super) struct Due {
    pub(super) leases: Vec<Lease>,
    pub(super) accounts: BTreeMap<String, Account>,
}

/// A lease the pass settled, as its report names it.
pub(super) fn reclaimed_lease(lease: &Lease, settlement: Settlement) -> ReclaimedLease {
    ReclaimedLease { lease_id: lease.lease_id.clone(), account_id: lease.account_id.clone(), settlement }
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
