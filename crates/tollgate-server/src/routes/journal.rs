//! `GET /v1/accounts/{account_id}/journal`: one page of an account's journal.
//!
//! The query string is read by `QueryParams`, so a bad `after` or `limit` is
//! the typed `400` of every other input error (`invalid_after`,
//! `invalid_limit`); both take plain decimal digits only. Another parameter,
//! or one given twice, is `invalid_query`.

use tollgate_api::{ErrorBody, JournalPageBody};

use super::params::AccountPath;
use super::reads::read_route;
use super::responses::AccountNotFound;
use crate::auth::GatewayAuth;

read_route! {
    /// The entries of an account's journal after the sequence number `after`,
    /// in sequence order: every change to its counters, with the operation's
    /// kind, ids and time. Replaying them from the first, starting from a new
    /// account's counters, gives the account's counters.
    account_journal: GatewayAuth, "/v1/accounts/{account_id}/journal", tag "accounts",
    params(
        AccountPath,
        ("after" = Option<u64>, Query, description = "Entries after this sequence number; 0 (the default) reads from the first"),
        ("limit" = Option<u32>, Query, description = "At most this many entries, 1 to 1000; 100 by default"),
    ),
    responses(
        (status = 200, description = "A page of the journal", body = JournalPageBody),
        (status = 400, description = "`invalid_after`, `invalid_limit`, `invalid_query` or `invalid_path`", body = ErrorBody),
        AccountNotFound,
    ),
    |state, AccountPath { account_id }, query: ["after", "limit"]| {
        let (after, limit) = (query.after()?, query.limit()?);
        JournalPageBody::from(&state.store().journal(&account_id, after, limit).await?)
    }
}
