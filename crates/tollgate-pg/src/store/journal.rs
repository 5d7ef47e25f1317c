//! Reading an account's journal, and the check that every journal replays to
//! its account's counters. The entries themselves are written by the
//! statements that change the counters (`sql/journal.rs`).

use sqlx::{FromRow, PgConnection};
use tollgate_core::journal::{EntryIds, EntryKind, ReplayError};
use tollgate_core::{COUNTERS, Entry, Error, InstantPair, PageLimit};
use tollgate_store::{JournalMismatch, JournalPage};

use super::Engine;
use super::errors::{corrupt, storable, storage_error};
use super::sql::{CHECK_JOURNAL_SQL, READ_JOURNAL_SQL};

#[derive(FromRow)]
pub(super) struct JournalRow {
    account_id: String,
    seq: i64,
    kind: String,
    credited: i64,
    available: i64,
    reserved: i64,
    consumed: i64,
    overage: i64,
    billed: i64,
    next_fence: i64,
    credit_id: Option<String>,
    lease_id: Option<String>,
    leases: Vec<String>,
    events: Option<i64>,
    at_floor_us: i64,
    at_submicro_ns: i16,
}

impl JournalRow {
    pub(super) fn decode(self) -> Result<Entry, Error> {
        let (account_id, seq) = (self.account_id, self.seq);
        let bad = |what: String| corrupt(format!("journal entry {account_id}/{seq}: {what}"));
        let kind = EntryKind::parse(&self.kind).ok_or_else(|| bad(format!("kind {:?}", self.kind)))?;
        let at = InstantPair::decode(self.at_floor_us, i64::from(self.at_submicro_ns))
            .map_err(|error| bad(format!("at: {error}")))?;
        let events = self.events.map(|n| u64::try_from(n).map_err(|_| bad(format!("events is {n}")))).transpose()?;
        let deltas: [i64; COUNTERS] =
            [self.credited, self.available, self.reserved, self.consumed, self.overage, self.billed, self.next_fence];
        Ok(Entry {
            seq: u64::try_from(seq).map_err(|_| bad("sequence number is not positive".into()))?,
            account_id,
            kind,
            deltas: deltas.map(i128::from),
            ids: EntryIds { credit_id: self.credit_id, lease_id: self.lease_id, leases: self.leases, events },
            at,
        })
    }
}

impl Engine {
    pub(super) async fn read_journal(
        &self,
        account_id: &str,
        after: u64,
        limit: PageLimit,
    ) -> Result<JournalPage, Error> {
        if !storable(account_id) {
            return Err(Error::AccountNotFound);
        }
        // A position past every BIGINT sequence number has nothing after it.
        let rows: Vec<JournalRow> = match i64::try_from(after) {
            Ok(after) => sqlx::query_as(READ_JOURNAL_SQL)
                .bind(account_id)
                .bind(after)
                .bind(i64::from(limit.get()) + 1)
                .fetch_all(&self.pool)
                .await
                .map_err(storage_error)?,
            Err(_) => Vec::new(),
        };
        self.existing(account_id, rows.len()).await?;
        let entries = rows.into_iter().map(JournalRow::decode).collect::<Result<Vec<_>, _>>()?;
        Ok(JournalPage::of(entries, limit.rows()))
    }
}

/// The accounts among `account_ids` whose journal does not replay to their
/// counters, in account order. The comparison is one set-based statement,
/// which tells only that the sums or the sequence numbers differ
/// (`ReplayError::Diverges`); the account's journal
/// (`GET /v1/accounts/{account_id}/journal`) shows where.
pub(super) async fn journal_mismatches(
    conn: &mut PgConnection,
    account_ids: &[String],
) -> Result<Vec<JournalMismatch>, Error> {
    let ids: Vec<String> =
        sqlx::query_scalar(CHECK_JOURNAL_SQL).bind(account_ids).fetch_all(&mut *conn).await.map_err(storage_error)?;
    Ok(ids.into_iter().map(|account_id| JournalMismatch { account_id, error: ReplayError::Diverges }).collect())
}
