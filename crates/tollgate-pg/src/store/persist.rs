//! Persisting what the core decided on the locking path: one statement
//! (`PERSIST_SQL`) per operation.

use jiff::Timestamp;
use sqlx::PgConnection;
use tollgate_core::{Account, COUNTERS, Change, Credential, Error, InstantPair, Lease, SecretHash, UsageEvent};

use super::errors::{corrupt, db_i64, db_i64_delta, storage_error};
use super::rows::counters;
use super::sql::PERSIST_SQL;
use super::usage_queries::dimensions_json;

/// Everything one operation decided, written by one statement.
#[derive(Default)]
pub(super) struct Changes<'a> {
    /// Accounts with their new counters.
    pub(super) accounts: Vec<Account>,
    /// Existing leases with their new `used` and `state`.
    pub(super) leases: Vec<Lease>,
    /// New leases with their capability hashes.
    pub(super) granted: Vec<(Lease, SecretHash)>,
    /// Credentials with their new activity.
    pub(super) credentials: Vec<Credential>,
    /// Newly accepted usage events.
    pub(super) events: Vec<&'a UsageEvent>,
    /// The journal entries of the operation, one per account whose counters
    /// it changed, all of one kind, each numbered by its account's update.
    pub(super) journal: Vec<Change>,
    /// When the operation ran: its entries' `at`.
    pub(super) now: Timestamp,
}

pub(super) async fn persist(conn: &mut PgConnection, changes: &Changes<'_>) -> Result<(), Error> {
    let query = sqlx::query_as::<_, (i64, i64, i64, i64, i64, i64)>(PERSIST_SQL);
    let query = bind_journal(bind_rows(query, changes)?, &changes.journal, changes.now)?
        // $53: each event's dimensions as JSON text, NULL for none (migration 0021).
        .bind(changes.events.iter().map(|x| dimensions_json(&x.dimensions)).collect::<Result<Vec<_>, _>>()?);
    let written = query.fetch_one(&mut *conn).await.map_err(storage_error)?;
    let (a, l, g, c, e, j) = (
        changes.accounts.len(),
        changes.leases.len(),
        changes.granted.len(),
        changes.credentials.len(),
        changes.events.len(),
        changes.journal.len(),
    );
    let expected = (a, l, g, c, e, j);
    let written_usize = (
        written.0 as usize,
        written.1 as usize,
        written.2 as usize,
        written.3 as usize,
        written.4 as usize,
        written.5 as usize,
    );
    if written_usize != expected {
        return Err(corrupt(format!(
            "wrote {written_usize:?} (accounts, leases, new leases, credentials, events, journal entries) \
             rows, expected {expected:?}: rows vanished under their locks"
        )));
    }
    Ok(())
}

type PersistQuery<'q> =
    sqlx::query::QueryAs<'q, sqlx::Postgres, (i64, i64, i64, i64, i64, i64), sqlx::postgres::PgArguments>;

/// Binds the journal entries ($37–$52): their kind, one array per column,
/// and the leases they name as `(account, lease)` pairs.
fn bind_journal<'q>(
    mut query: PersistQuery<'q>,
    journal: &[Change],
    now: Timestamp,
) -> Result<PersistQuery<'q>, Error> {
    let kind = journal.first().map_or("usage", |change| change.kind.as_str());
    query = query.bind(kind).bind(journal.iter().map(|x| x.account_id.clone()).collect::<Vec<_>>());
    let deltas = journal.iter().map(|x| db_i64_delta(&x.deltas)).collect::<Result<Vec<_>, Error>>()?;
    for i in 0..COUNTERS {
        query = query.bind(deltas.iter().map(|row| row[i]).collect::<Vec<i64>>());
    }
    let pairs: Vec<(String, String)> = journal
        .iter()
        .flat_map(|x| x.ids.leases.iter().map(|lease_id| (x.account_id.clone(), lease_id.clone())))
        .collect();
    let at = InstantPair::encode(now);
    Ok(query
        .bind(journal.iter().map(|x| x.ids.credit_id.clone()).collect::<Vec<_>>())
        .bind(journal.iter().map(|x| x.ids.lease_id.clone()).collect::<Vec<_>>())
        .bind(
            journal
                .iter()
                .map(|x| x.ids.events.map(|n| db_i64(n, "events")).transpose())
                .collect::<Result<Vec<_>, _>>()?,
        )
        .bind(pairs.iter().map(|(account_id, _)| account_id.clone()).collect::<Vec<_>>())
        .bind(pairs.into_iter().map(|(_, lease_id)| lease_id).collect::<Vec<_>>())
        .bind(at.floor_us)
        .bind(at.submicro_ns))
}

/// Binds the rows of `changes` ($1–$36).
fn bind_rows<'q>(mut query: PersistQuery<'q>, changes: &Changes<'_>) -> Result<PersistQuery<'q>, Error> {
    let a = &changes.accounts;
    // One array per counter, in `COUNTER_NAMES` order.
    let rows = a.iter().map(counters).collect::<Result<Vec<_>, Error>>()?;
    query = query.bind(a.iter().map(|x| x.account_id.clone()).collect::<Vec<_>>());
    for i in 0..COUNTERS {
        query = query.bind(rows.iter().map(|row| row[i]).collect::<Vec<i64>>());
    }

    let l = &changes.leases;
    query = query
        .bind(l.iter().map(|x| x.lease_id.clone()).collect::<Vec<_>>())
        .bind(l.iter().map(|x| db_i64(x.used, "lease_used")).collect::<Result<Vec<_>, _>>()?)
        .bind(l.iter().map(|x| x.state.as_str().to_owned()).collect::<Vec<_>>());

    let g = &changes.granted;
    let expiries: Vec<InstantPair> = g.iter().map(|(x, _)| InstantPair::encode(x.expiry)).collect();
    query = query
        .bind(g.iter().map(|(x, _)| x.lease_id.clone()).collect::<Vec<_>>())
        .bind(g.iter().map(|(x, _)| x.account_id.clone()).collect::<Vec<_>>())
        .bind(g.iter().map(|(x, _)| db_i64(x.fencing_token, "next_fence")).collect::<Result<Vec<_>, _>>()?)
        .bind(g.iter().map(|(_, hash)| hash.as_bytes().to_vec()).collect::<Vec<_>>())
        .bind(g.iter().map(|(x, _)| db_i64(x.granted, "granted")).collect::<Result<Vec<_>, _>>()?)
        .bind(g.iter().map(|(x, _)| db_i64(x.used, "lease_used")).collect::<Result<Vec<_>, _>>()?)
        .bind(g.iter().map(|(x, _)| x.state.as_str().to_owned()).collect::<Vec<_>>())
        .bind(expiries.iter().map(|p| p.floor_us).collect::<Vec<_>>())
        .bind(expiries.iter().map(|p| p.submicro_ns).collect::<Vec<_>>())
        .bind(g.iter().map(|(x, _)| x.expiry_is_upper_bound).collect::<Vec<_>>());

    let c = &changes.credentials;
    let last_used: Vec<Option<InstantPair>> = c.iter().map(|x| x.last_used_at.map(InstantPair::encode)).collect();
    query = query
        .bind(c.iter().map(|x| x.credential_id.clone()).collect::<Vec<_>>())
        .bind(c.iter().map(|x| db_i64(x.accepted_events, "credential_accepted_events")).collect::<Result<Vec<_>, _>>()?)
        .bind(c.iter().map(|x| db_i64(x.accepted_units, "credential_accepted_units")).collect::<Result<Vec<_>, _>>()?)
        .bind(last_used.iter().map(|p| p.map(|p| p.floor_us)).collect::<Vec<_>>())
        .bind(last_used.iter().map(|p| p.map(|p| p.submicro_ns)).collect::<Vec<_>>());

    let e = &changes.events;
    let occurred: Vec<InstantPair> = e.iter().map(|x| InstantPair::encode(x.occurred_at)).collect();
    query = query
        .bind(e.iter().map(|x| x.account_id.clone()).collect::<Vec<_>>())
        .bind(e.iter().map(|x| x.request_id.clone()).collect::<Vec<_>>())
        .bind(e.iter().map(|x| x.credential_id.clone()).collect::<Vec<_>>())
        .bind(e.iter().map(|x| db_i64(x.units, "units")).collect::<Result<Vec<_>, _>>()?)
        .bind(occurred.iter().map(|p| p.floor_us).collect::<Vec<_>>())
        .bind(occurred.iter().map(|p| p.submicro_ns).collect::<Vec<_>>())
        .bind(e.iter().map(|x| x.lease_id.clone()).collect::<Vec<_>>())
        .bind(
            e.iter()
                .map(|x| x.fencing_token.map(|f| db_i64(f, "fencing_token")).transpose())
                .collect::<Result<Vec<_>, _>>()?,
        )
        // The accounts of the existing leases and of the credentials, which
        // their updates name with their ids.
        .bind(l.iter().map(|x| x.account_id.clone()).collect::<Vec<_>>())
        .bind(c.iter().map(|x| x.account_id.clone()).collect::<Vec<_>>());
    Ok(query)
}
