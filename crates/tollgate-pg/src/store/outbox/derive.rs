//! Deriving events from the journal after commit (`Outbox::derive_events`):
//! each account's entries after its cursor, judged by the rules of their
//! time, fanned out to the endpoints that want them, and the cursor moved
//! past them, in the caller's transaction.
//!
//! One account's corrupt rows never stop the others. An account whose
//! cursor, entries or rules do not decode, or whose entries do not apply to
//! its cursor's counters, is skipped: nothing of it is stored, so its cursor
//! stays where it is and the first pass after its repair derives it. Each
//! pass names the accounts it skipped in one warning. A pass reads on past
//! the entries of the accounts it skipped, up to its bound again
//! (`read_max`), so that they do not take the place of the others': else an
//! account with more pending entries than the bound, first in account
//! order, would stop every account after it.
//!
//! All the rules a pass judges by are locked, in account order, before the
//! endpoints are share-locked, as with a single read (the module's lock
//! order): the events fan out only once every read is done.

use std::collections::HashMap;

use sqlx::{FromRow, PgConnection};
use tollgate_core::{Account, AlertRule, COUNTER_NAMES, COUNTERS, Entry, Error, Event};
use tollgate_store::derive_entries;

use super::outgoing::{CursorWrite, Outgoing, RuleWrite, share_endpoints};
use super::rows::{RuleRow, StoredRule, Wanting, nonnegative};
use crate::store::Engine;
use crate::store::errors::{corrupt, storage_error};
use crate::store::journal::JournalRow;
use crate::store::sql::{DERIVE_PENDING_SQL, LOCK_DERIVE_RULES_SQL, TRY_DERIVE_LOCK_SQL};

/// The most journal rows one pass reads: its bound, and as many again to
/// read past the entries of the accounts it skips (as a reclaim pass reads
/// past corrupt leases, `tollgate_store::reclaim_read_max`).
fn read_max(limit: u32) -> u32 {
    limit.saturating_mul(2)
}

/// A journal entry not yet derived, with its account's cursor.
#[derive(FromRow)]
struct PendingRow {
    /// The entry's account, apart from the entry's columns, so that an
    /// entry that does not decode still names the account to skip.
    due_account_id: String,
    cursor_seq: Option<i64>,
    cursor_counters: Option<Vec<i64>>,
    #[sqlx(flatten)]
    entry: JournalRow,
}

/// An account's entries to derive, and its counters before the first.
struct PendingAccount {
    account_id: String,
    before: [u64; COUNTERS],
    /// The sequence number of the last entry here, or the cursor's.
    seq: u64,
    entries: Vec<Entry>,
}

impl PendingAccount {
    /// An account at its cursor: none means an account created after
    /// migration 0024, whose journal is complete from entry 1, so it starts
    /// from a new account's counters.
    fn at_cursor(account_id: &str, seq: Option<i64>, counters: Option<Vec<i64>>) -> Result<Self, Error> {
        let what = format!("outbox cursor of account {account_id}");
        let (seq, before) = match (seq, counters) {
            (None, _) => (0, Account::new(account_id.to_owned()).counters()),
            (Some(seq), Some(values)) if values.len() == COUNTERS => {
                let mut before = [0; COUNTERS];
                for ((slot, value), name) in before.iter_mut().zip(values).zip(COUNTER_NAMES) {
                    *slot = nonnegative(&format!("{what}: {name}"), value)?;
                }
                (nonnegative(&format!("{what}: seq"), seq)?, before)
            }
            (Some(_), _) => return Err(corrupt(format!("{what}: the counters are not all there"))),
        };
        Ok(Self { account_id: account_id.to_owned(), before, seq, entries: Vec::new() })
    }

    /// Adds the next entry; `derive_entries` needs them consecutive.
    fn push(&mut self, entry: Entry) -> Result<(), Error> {
        if entry.seq != self.seq + 1 {
            return Err(corrupt(format!(
                "journal of account {}: entry {} follows entry {}",
                self.account_id, entry.seq, self.seq
            )));
        }
        self.seq = entry.seq;
        self.entries.push(entry);
        Ok(())
    }
}

/// An account a pass skipped, and why: the error its rows gave, which names
/// rows, sequence numbers and counters, never a secret.
struct Skipped {
    account_id: String,
    reason: String,
}

impl Skipped {
    fn new(account_id: &str, error: &Error) -> Self {
        Self { account_id: account_id.to_owned(), reason: error.to_string() }
    }
}

/// What one pass did.
#[derive(Default)]
struct Pass {
    /// The entries derived: what `derive_events` answers. The skipped
    /// accounts' entries are not among them, so callers that add up what
    /// was derived count each entry once; and unless a pass read past more
    /// than `limit` rows it did not derive (`read_max`), fewer than `limit`
    /// still means that nothing derivable is left.
    derived: u32,
    /// The journal rows read, whether derived or not.
    read: u32,
    /// In the order found.
    skipped: Vec<Skipped>,
}

impl Pass {
    /// How many rows the next read asks for: the entries still to derive,
    /// within what is left of `read_max`.
    fn want(&self, limit: u32) -> u32 {
        limit.saturating_sub(self.derived).min(read_max(limit).saturating_sub(self.read))
    }

    /// Once per pass, naming each skipped account and why. Their cursors
    /// stay until an operator repairs the rows, and every pass tries them
    /// again, as a reclaim pass does corrupt leases.
    fn warn_skipped(&self) {
        if self.skipped.is_empty() {
            return;
        }
        let accounts: Vec<String> =
            self.skipped.iter().map(|skipped| format!("{}: {}", skipped.account_id, skipped.reason)).collect();
        tracing::warn!(
            skipped = self.skipped.len(),
            accounts = ?accounts,
            "event derivation skipped accounts whose journal entries do not apply to their outbox cursor or \
             whose rows do not decode; the other accounts were derived; each is derived once its rows are \
             repaired"
        );
    }
}

/// One account's derivation, before its events fan out: ready to store, its
/// values converted, so that adding it to `Outgoing` cannot fail halfway.
struct DerivedAccount {
    account_id: String,
    entries: usize,
    events: Vec<Event>,
    cursor: CursorWrite,
    /// The rules whose `refused_at_seq` its entries changed.
    changed: Vec<RuleWrite>,
    /// The deleted rules that judge none of its entries left to derive.
    purged: Vec<AlertRule>,
}

impl DerivedAccount {
    fn fan_out(self, outgoing: &mut Outgoing, endpoints: &[Wanting]) {
        for event in &self.events {
            outgoing.fan_out(event, endpoints);
        }
        outgoing.cursor(self.cursor);
        for rule in &self.purged {
            outgoing.purge(rule);
        }
        for rule in self.changed {
            outgoing.rule(rule);
        }
    }
}

/// The rows of `DERIVE_PENDING_SQL`, by account. An account whose cursor or
/// entries do not decode, or whose entries are not consecutive, is skipped.
fn by_account(rows: Vec<PendingRow>, skipped: &mut Vec<Skipped>) -> Vec<PendingAccount> {
    let mut accounts: Vec<PendingAccount> = Vec::new();
    // The rows of one account are consecutive.
    let mut skipping: Option<String> = None;
    for row in rows {
        let account_id = row.due_account_id.clone();
        if skipping.as_ref() == Some(&account_id) {
            continue;
        }
        if let Err(error) = add_row(&mut accounts, row) {
            if accounts.last().is_some_and(|account| account.account_id == account_id) {
                accounts.pop();
            }
            skipped.push(Skipped::new(&account_id, &error));
            skipping = Some(account_id);
        }
    }
    accounts
}

/// Adds a row's entry to its account, the last of `accounts` or a new one.
fn add_row(accounts: &mut Vec<PendingAccount>, row: PendingRow) -> Result<(), Error> {
    let entry = row.entry.decode()?;
    if accounts.last().is_none_or(|account| account.account_id != entry.account_id) {
        accounts.push(PendingAccount::at_cursor(&entry.account_id, row.cursor_seq, row.cursor_counters)?);
    }
    if let Some(account) = accounts.last_mut() {
        account.push(entry)?;
    }
    Ok(())
}

/// Locks the rules of `accounts`, by account; an account with a rule that
/// does not decode is skipped, and leaves `accounts`.
async fn lock_rules(
    conn: &mut PgConnection,
    accounts: &mut Vec<PendingAccount>,
    skipped: &mut Vec<Skipped>,
) -> Result<HashMap<String, Vec<StoredRule>>, Error> {
    let mut rules: HashMap<String, Vec<StoredRule>> = HashMap::new();
    if accounts.is_empty() {
        return Ok(rules);
    }
    let account_ids: Vec<&str> = accounts.iter().map(|account| account.account_id.as_str()).collect();
    let rows: Vec<RuleRow> =
        sqlx::query_as(LOCK_DERIVE_RULES_SQL).bind(account_ids).fetch_all(&mut *conn).await.map_err(storage_error)?;
    let mut broken: HashMap<String, Error> = HashMap::new();
    for row in rows {
        let account_id = row.account_id().to_owned();
        match row.stored() {
            Ok(stored) => rules.entry(account_id).or_default().push(stored),
            Err(error) => {
                broken.entry(account_id).or_insert(error);
            }
        }
    }
    accounts.retain(|account| match broken.remove(&account.account_id) {
        Some(error) => {
            skipped.push(Skipped::new(&account.account_id, &error));
            false
        }
        None => true,
    });
    Ok(rules)
}

/// Up to `want` entries not yet derived of the accounts from `from` on, in
/// account order, but those of the accounts skipped.
async fn read_pending(
    conn: &mut PgConnection,
    want: u32,
    from: &str,
    skipped: &[Skipped],
) -> Result<Vec<PendingRow>, Error> {
    let skipped: Vec<&str> = skipped.iter().map(|skipped| skipped.account_id.as_str()).collect();
    sqlx::query_as(DERIVE_PENDING_SQL)
        .bind(i64::from(want))
        .bind(from)
        .bind(skipped)
        .fetch_all(&mut *conn)
        .await
        .map_err(storage_error)
}

/// Derives the accounts of one read as far as their rows allow, adding those
/// they do not allow to `skipped`.
async fn derive_read(
    conn: &mut PgConnection,
    rows: Vec<PendingRow>,
    skipped: &mut Vec<Skipped>,
) -> Result<Vec<DerivedAccount>, Error> {
    let mut accounts = by_account(rows, skipped);
    let mut rules = lock_rules(conn, &mut accounts, skipped).await?;
    let mut derived = Vec::with_capacity(accounts.len());
    for account in accounts {
        let account_rules = rules.remove(&account.account_id).unwrap_or_default();
        let account_id = account.account_id.clone();
        match derive_account(account, account_rules) {
            Ok(account) => derived.push(account),
            Err(error) => skipped.push(Skipped::new(&account_id, &error)),
        }
    }
    Ok(derived)
}

/// Derives up to `limit` entries in the caller's transaction; none when
/// another server is deriving. A read that came back full and skipped an
/// account is followed by another, from its last account on, but the
/// skipped ones: that last account may have been cut short by the read's
/// bound, so it is left whole to the next read.
async fn derive_in(conn: &mut PgConnection, limit: u32) -> Result<Pass, Error> {
    let granted: bool = sqlx::query_scalar(TRY_DERIVE_LOCK_SQL).fetch_one(&mut *conn).await.map_err(storage_error)?;
    let mut pass = Pass::default();
    if !granted {
        return Ok(pass);
    }
    let mut derived: Vec<DerivedAccount> = Vec::new();
    let mut from = String::new();
    loop {
        let want = pass.want(limit);
        if want == 0 {
            break;
        }
        let rows = read_pending(conn, want, &from, &pass.skipped).await?;
        let read = u32::try_from(rows.len()).unwrap_or(u32::MAX);
        let last = rows.last().map(|row| row.due_account_id.clone());
        pass.read = pass.read.saturating_add(read);
        let skipped_before = pass.skipped.len();
        let mut batch = derive_read(conn, rows, &mut pass.skipped).await?;
        let again = read == want && pass.skipped.len() > skipped_before;
        // The next read starts at this read's last account, which its bound
        // may have cut short: if it was derived here, it is left to that read.
        if let Some(last) = last.filter(|_| again) {
            if batch.last().is_some_and(|account| account.account_id == last) {
                batch.pop();
            }
            from = last;
        }
        let entries: usize = batch.iter().map(|account| account.entries).sum();
        pass.derived = pass.derived.saturating_add(u32::try_from(entries).unwrap_or(u32::MAX));
        derived.append(&mut batch);
        if !again {
            break;
        }
    }
    if !derived.is_empty() {
        let endpoints = share_endpoints(conn).await?;
        let mut outgoing = Outgoing::default();
        for account in derived {
            account.fan_out(&mut outgoing, &endpoints);
        }
        outgoing.store(conn).await?;
    }
    Ok(pass)
}

/// Derives one account's entries, each under the rules that existed when it
/// was made: their events, where its cursor moves, the rules they re-armed
/// and the deleted rules they were the last entries of. Stores nothing, so
/// an account whose entries do not apply leaves nothing behind.
fn derive_account(account: PendingAccount, mut rules: Vec<StoredRule>) -> Result<DerivedAccount, Error> {
    let armed_before: Vec<Option<u64>> = rules.iter().map(|stored| stored.rule.refused_at_seq).collect();
    let mut counters = account.before;
    let mut events = Vec::new();
    for entry in &account.entries {
        let mut judging: Vec<AlertRule> =
            rules.iter().filter(|stored| stored.judges(entry.seq)).map(|stored| stored.rule.clone()).collect();
        let (after, derived) = derive_entries(&mut judging, counters, std::slice::from_ref(entry))?;
        events.extend(derived);
        for judged in judging {
            if let Some(stored) = rules.iter_mut().find(|stored| stored.rule.rule_id == judged.rule_id) {
                stored.rule.refused_at_seq = judged.refused_at_seq;
            }
        }
        counters = after;
    }
    let cursor = CursorWrite::new(&account.account_id, account.seq, &counters)?;
    let (mut changed, mut purged) = (Vec::new(), Vec::new());
    for (stored, before) in rules.into_iter().zip(armed_before) {
        if !stored.judges(account.seq + 1) {
            purged.push(stored.rule);
        } else if stored.rule.refused_at_seq != before {
            changed.push(RuleWrite::new(&stored.rule)?);
        }
    }
    let entries = account.entries.len();
    Ok(DerivedAccount { account_id: account.account_id, entries, events, cursor, changed, purged })
}

impl Engine {
    pub(super) async fn derive(&self, limit: u32) -> Result<u32, Error> {
        if limit == 0 {
            return Ok(0);
        }
        let pass = self.transaction(async |conn: &mut PgConnection| derive_in(conn, limit).await).await?;
        // Only a committed pass is reported.
        pass.warn_skipped();
        Ok(pass.derived)
    }
}
