//! The usage read side: totals by window and group, and the export of
//! accepted events as JSON pages or one NDJSON stream.
//!
//! Query strings are read by `QueryParams`: a parameter named twice or one
//! these routes do not take is `400 invalid_query`, and every value is
//! checked by the core's parsers, so each bad value answers its own typed
//! code (`invalid_timestamp`, `invalid_range`, `invalid_window`,
//! `invalid_group_by`, `too_many_buckets`, `invalid_limit`,
//! `invalid_cursor`), never a 500 or a plain-text rejection.

use axum::body::{Body, Bytes};
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use tollgate_api::{ErrorBody, ExportedEventBody, UsageEventsPage, UsageReportBody};
use tollgate_core::query::{ExportQuery, UsageQuery};
use tollgate_core::{Error, Page, PageLimit, UsageEvent};

use super::json;
use super::params::AccountPath;
use super::reads::read_route;
use super::responses::{AccountNotFound, StorageUnavailable};
use crate::AppState;
use crate::auth::GatewayAuth;
use crate::error::ApiError;

/// The media type of the streamed export.
pub(crate) const NDJSON: &str = "application/x-ndjson";

/// The range of a usage query or export, as the OpenAPI document states
/// it; the handlers read it through `QueryParams` and the core's parser.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[expect(dead_code, reason = "documents the parameters; QueryParams reads them")]
pub(crate) struct RangeParams {
    /// RFC 3339, up to 9 fractional digits; included.
    from: String,
    /// RFC 3339, up to 9 fractional digits; excluded; after `from`.
    to: String,
}

/// How usage totals are bucketed and grouped, as the OpenAPI document
/// states it; the handler reads it through `QueryParams` and the core's parser.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[expect(dead_code, reason = "documents the parameters; QueryParams reads them")]
pub(crate) struct GroupingParams {
    /// `PT1M`, `PT1H` or `P1D` (UTC-aligned); omitted: one bucket
    window: Option<String>,
    /// `credential`, `lease`, `funding` or `dimension:KEY`; omitted: one group
    group_by: Option<String>,
}

/// How the export pages and what it answers in, as the OpenAPI document
/// states it; the handler reads it through `QueryParams`.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[expect(dead_code, reason = "documents the parameters; QueryParams reads them")]
pub(crate) struct ExportParams {
    /// `next_cursor` of the previous page
    cursor: Option<String>,
    /// 1 to 1000, default 100; the page size (JSON only)
    limit: Option<u32>,
    /// `json` (default): one page; `ndjson`: the whole range, streamed
    format: Option<String>,
}

read_route! {
    /// Units and event counts of an account's accepted events in `[from, to)`,
    /// by UTC-aligned window and by group.
    ///
    /// The answer lists every bucket the range spans in time order, empty ones
    /// included, each clipped to the range, so the buckets tile `[from, to)`;
    /// each holds its nonempty groups. Totals are decimal strings.
    get_usage: GatewayAuth, "/v1/accounts/{account_id}/usage", tag "usage",
    params(AccountPath, RangeParams, GroupingParams),
    responses(
        (status = 200, description = "Every bucket of the range, in time order, and the total", body = UsageReportBody),
        (status = 400, description = "`invalid_timestamp`, `invalid_range`, `invalid_window`, `invalid_group_by`, \
            `too_many_buckets` (more than 10 000 windows) or `invalid_query`", body = ErrorBody),
        AccountNotFound,
        StorageUnavailable,
    ),
    |state, AccountPath { account_id }, params: ["from", "to", "window", "group_by"]| {
        let query =
            UsageQuery::parse(params.get("from"), params.get("to"), params.get("window"), params.get("group_by"))?;
        UsageReportBody::from(&state.store().usage(&account_id, &query).await?)
    }
}

read_route! {
    /// An account's accepted events in `[from, to)`, in `(occurred_at,
    /// request_id)` order (request ids compared byte by byte).
    ///
    /// By default one page of at most `limit` events and the cursor of the
    /// next page (`null` on the last); a cursor is valid only for the same
    /// account, `from` and `to`. Events accepted while a client pages never
    /// make it skip or repeat one. With `format=ndjson` the whole range (after
    /// `cursor`, if given) streams as `application/x-ndjson`, one event object
    /// per line, read from storage page by page; a storage failure in the
    /// middle ends the stream early without its final chunk, which HTTP clients
    /// report as an incomplete body.
    get_usage_events: GatewayAuth, "/v1/accounts/{account_id}/usage/events", tag "usage",
    params(AccountPath, RangeParams, ExportParams),
    responses(
        (status = 200, description = "A page of events, or with `format=ndjson` one event per line", body = UsageEventsPage,
            content(
                (UsageEventsPage = "application/json"),
                (ExportedEventBody = "application/x-ndjson"),
            )),
        (status = 400, description = "`invalid_timestamp`, `invalid_range`, `invalid_limit`, `invalid_cursor` or \
            `invalid_query`", body = ErrorBody),
        AccountNotFound,
        StorageUnavailable,
    ),
    |state, AccountPath { account_id }, params: ["from", "to", "cursor", "limit", "format"]| -> ApiResult {
        let streamed = match params.get("format") {
            None | Some("json") => false,
            Some("ndjson") => true,
            Some(other) => return Err(ApiError::InvalidQuery(format!("format must be json or ndjson, not {other:?}"))),
        };
        let (from, to, cursor) = (params.get("from"), params.get("to"), params.get("cursor"));
        if !streamed {
            let query = ExportQuery::parse(&account_id, from, to, cursor, params.limit()?)?;
            let page = state.store().usage_events(&account_id, &query).await?;
            let body = UsageEventsPage {
                items: page.items.iter().map(ExportedEventBody::from).collect(),
                next_cursor: page.next_cursor,
            };
            return json(StatusCode::OK, body);
        }
        let query = ExportQuery::parse(&account_id, from, to, cursor, PageLimit::new(Some(PageLimit::MAX))?)?;
        // The first page is read before answering, so that an unknown account or
        // an unavailable store is a proper error status, not a broken stream.
        let first = state.store().usage_events(&account_id, &query).await?;
        let stream = futures_util::stream::unfold(Some((state, account_id, query, Some(first))), next_chunk);
        Ok(([(CONTENT_TYPE, NDJSON)], Body::from_stream(stream)).into_response())
    }
}

/// What the stream holds between chunks: how to read the next page, and
/// that page when it was already read; `None` once the last page was sent.
type Pending = Option<(AppState, String, ExportQuery, Option<Page<UsageEvent>>)>;

/// Reads a page unless it was read already, and sends it as lines.
async fn next_chunk(pending: Pending) -> Option<(Result<Bytes, Error>, Pending)> {
    let (state, account_id, query, page) = pending?;
    let page = match page {
        Some(page) => page,
        None => match state.store().usage_events(&account_id, &query).await {
            Ok(page) => page,
            Err(error) => return Some((Err(error), None)),
        },
    };
    let mut chunk = Vec::new();
    for event in &page.items {
        // An event body always serialises: strings, integers and a map of strings.
        if serde_json::to_writer(&mut chunk, &ExportedEventBody::from(event)).is_err() {
            return Some((Err(Error::StorageCorrupt("an event did not serialise".into())), None));
        }
        chunk.push(b'\n');
    }
    let next = match page.next_cursor.map(|cursor| query.resume(&account_id, &cursor)) {
        None => None,
        Some(Ok(next)) => Some((state, account_id, next, None)),
        Some(Err(error)) => return Some((Err(error), None)),
    };
    Some((Ok(Bytes::from(chunk)), next))
}
