//! `GET /v1/accounts/{account_id}/journal`: one page of an account's journal.
//!
//! The query string is read raw and parsed here, so that a bad `after` or
//! `limit` is the typed `400` of every other input error (`invalid_after`,
//! `invalid_limit`) rather than a framework rejection. Both take plain
//! decimal digits only; other parameters are ignored, and of a repeated one
//! the last counts.

use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use tollgate_api::{ErrorBody, JournalPageBody};
use tollgate_core::{Error, PageLimit};

use super::{ApiResult, json};
use crate::AppState;
use crate::auth::GatewayAuth;
use crate::extract::ApiPath;

/// The `after` and `limit` of a journal request.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct JournalQuery {
    pub(crate) after: u64,
    pub(crate) limit: PageLimit,
}

fn digits(value: &str) -> Option<&str> {
    (!value.is_empty() && value.bytes().all(|b| b.is_ascii_digit())).then_some(value)
}

impl JournalQuery {
    /// `after` defaults to 0 (from the first entry), `limit` to
    /// `PageLimit::DEFAULT`. A limit too large for any page is refused as
    /// the largest `u32`; one that is not a number at all as 0.
    pub(crate) fn parse(query: Option<&str>) -> Result<Self, Error> {
        let (mut after, mut limit) = (None, None);
        for pair in query.unwrap_or_default().split('&') {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            match name {
                "after" => after = Some(value),
                "limit" => limit = Some(value),
                _ => {}
            }
        }
        let after = match after {
            None => 0,
            Some(value) => digits(value).and_then(|v| v.parse().ok()).ok_or(Error::InvalidAfter)?,
        };
        let limit = limit
            .map(|value| match digits(value) {
                Some(v) => Ok(v.parse::<u32>().unwrap_or(u32::MAX)),
                None => Err(Error::InvalidLimit { limit: 0, max: PageLimit::MAX }),
            })
            .transpose()?;
        Ok(Self { after, limit: PageLimit::new(limit)? })
    }
}

/// The entries of an account's journal after the sequence number `after`,
/// in sequence order: every change to its counters, with the operation's
/// kind, ids and time. Replaying them from the first, starting from a new
/// account's counters, gives the account's counters.
#[utoipa::path(
    get, path = "/v1/accounts/{account_id}/journal", tag = "accounts",
    params(
        ("account_id" = String, Path),
        ("after" = Option<u64>, Query, description = "Entries after this sequence number; 0 (the default) reads from the first"),
        ("limit" = Option<u32>, Query, description = "At most this many entries, 1 to 1000; 100 by default"),
    ),
    responses(
        (status = 200, description = "A page of the journal", body = JournalPageBody),
        (status = 400, description = "`invalid_after`, `invalid_limit` or `invalid_path`", body = ErrorBody),
        (status = 404, description = "`account_not_found`", body = ErrorBody),
    ),
)]
pub(crate) async fn account_journal(
    _: GatewayAuth,
    State(state): State<AppState>,
    ApiPath(account_id): ApiPath<String>,
    RawQuery(query): RawQuery,
) -> ApiResult {
    let JournalQuery { after, limit } = JournalQuery::parse(query.as_deref())?;
    let page = state.store().journal(&account_id, after, limit).await?;
    json(StatusCode::OK, JournalPageBody::from(&page))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(rows: u32) -> PageLimit {
        PageLimit::new(Some(rows)).unwrap()
    }

    #[test]
    fn after_and_limit_default_and_refuse_anything_but_their_numbers() {
        let parse = JournalQuery::parse;
        assert_eq!(parse(None), Ok(JournalQuery { after: 0, limit: PageLimit::default() }));
        assert_eq!(parse(Some("after=7&limit=2&x=y")), Ok(JournalQuery { after: 7, limit: limit(2) }));
        assert_eq!(parse(Some("after=18446744073709551615")).map(|q| q.after), Ok(u64::MAX));
        let max = PageLimit::MAX;
        for bad in ["after=", "after=-1", "after=1.5", "after=abc", "after=18446744073709551616", "after"] {
            assert_eq!(parse(Some(bad)), Err(Error::InvalidAfter), "{bad}");
        }
        assert_eq!(parse(Some("limit=0")), Err(Error::InvalidLimit { limit: 0, max }));
        assert_eq!(parse(Some("limit=1001")), Err(Error::InvalidLimit { limit: 1001, max }));
        assert_eq!(parse(Some("limit=99999999999")), Err(Error::InvalidLimit { limit: u32::MAX, max }));
        assert_eq!(parse(Some("limit=ten")), Err(Error::InvalidLimit { limit: 0, max }));
        assert_eq!(parse(Some("limit=")), Err(Error::InvalidLimit { limit: 0, max }));
    }
}
