//! The usage read side: totals by window and group, export pages, every
//! page of a range in turn, and the NDJSON stream of a whole range.

use jiff::Timestamp;
use reqwest::Response;
use tollgate_api::{ExportedEventBody, UsageEventsPage, UsageReportBody};
use tollgate_core::UsageEvent;
use tollgate_core::query::{GroupBy, Window};

use super::{ClientError, ClientErrorKind, TollgateClient, snippet};

/// What a usage query asks for: `[from, to)`, an optional window and a grouping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageQueryParams {
    pub from: Timestamp,
    pub to: Timestamp,
    /// `None`: the whole range is one bucket.
    pub window: Option<Window>,
    pub group_by: GroupBy,
}

/// A stream that is not the documented NDJSON export.
fn invalid(message: String) -> ClientError {
    ClientError {
        kind: ClientErrorKind::InvalidResponse,
        status: None,
        code: "invalid_response".into(),
        message,
        retryable: false,
    }
}

impl TollgateClient {
    /// `GET /v1/accounts/{account_id}/usage` (gateway): every bucket of the
    /// range in time order, with its groups, and the total.
    pub async fn usage(&self, account_id: &str, params: &UsageQueryParams) -> Result<UsageReportBody, ClientError> {
        let (from, to, group_by) = (params.from.to_string(), params.to.to_string(), params.group_by.code());
        let mut query = vec![("from", from.as_str()), ("to", to.as_str())];
        query.extend(params.window.map(|window| ("window", window.code())));
        query.extend(group_by.as_deref().map(|group_by| ("group_by", group_by)));
        self.get_with_query(&["v1", "accounts", account_id, "usage"], &query).await
    }

    /// `GET /v1/accounts/{account_id}/usage/events` (gateway): one page of
    /// the range's events, after `cursor`, at most `limit` (server default
    /// 100) of them.
    pub async fn usage_events_page(
        &self,
        account_id: &str,
        from: Timestamp,
        to: Timestamp,
        cursor: Option<&str>,
        limit: Option<u32>,
    ) -> Result<UsageEventsPage, ClientError> {
        let (from, to, limit) = (from.to_string(), to.to_string(), limit.map(|limit| limit.to_string()));
        let mut query = vec![("from", from.as_str()), ("to", to.as_str())];
        query.extend(cursor.map(|cursor| ("cursor", cursor)));
        query.extend(limit.as_deref().map(|limit| ("limit", limit)));
        self.get_with_query(&["v1", "accounts", account_id, "usage", "events"], &query).await
    }

    /// Every event of the range, page by page (`UsageEventPages::next_page`).
    pub fn usage_events(
        &self,
        account_id: &str,
        from: Timestamp,
        to: Timestamp,
        limit: Option<u32>,
    ) -> UsageEventPages {
        UsageEventPages {
            client: self.clone(),
            account_id: account_id.to_owned(),
            from,
            to,
            limit,
            cursor: None,
            done: false,
        }
    }

    /// `GET /v1/accounts/{account_id}/usage/events?format=ndjson` (gateway):
    /// the whole range as one stream, read event by event
    /// (`NdjsonEvents::next`) without holding the range in memory.
    pub async fn usage_events_ndjson(
        &self,
        account_id: &str,
        from: Timestamp,
        to: Timestamp,
    ) -> Result<NdjsonEvents, ClientError> {
        let (from, to) = (from.to_string(), to.to_string());
        let query = [("from", from.as_str()), ("to", to.as_str()), ("format", "ndjson")];
        let response = self.get_streamed(&["v1", "accounts", account_id, "usage", "events"], &query).await?;
        Ok(NdjsonEvents { response, account_id: account_id.to_owned(), buffer: Vec::new(), done: false })
    }
}

/// The pages of one export, in order; each page resumes after the last.
#[derive(Debug)]
pub struct UsageEventPages {
    client: TollgateClient,
    account_id: String,
    from: Timestamp,
    to: Timestamp,
    limit: Option<u32>,
    cursor: Option<String>,
    done: bool,
}

impl UsageEventPages {
    /// The next page's events, or `None` after the last page. After an
    /// error, calling again retries the same page.
    pub async fn next_page(&mut self) -> Option<Result<Vec<UsageEvent>, ClientError>> {
        if self.done {
            return None;
        }
        let page = self
            .client
            .usage_events_page(&self.account_id, self.from, self.to, self.cursor.as_deref(), self.limit)
            .await;
        Some(page.map(|page| {
            self.done = page.next_cursor.is_none();
            self.cursor = page.next_cursor;
            page.items.into_iter().map(|item| item.into_event(&self.account_id)).collect()
        }))
    }
}

/// The events of an NDJSON export, read line by line as they arrive.
#[derive(Debug)]
pub struct NdjsonEvents {
    response: Response,
    account_id: String,
    buffer: Vec<u8>,
    done: bool,
}

/// The longest line an NDJSON export may send: one event, with its dimensions.
const LINE_BYTES_MAX: usize = 64 * 1024;

impl NdjsonEvents {
    /// The next event, `None` at the end of the stream. A stream the server
    /// broke off is an error (`transport_failed`), never a silent end.
    pub async fn next(&mut self) -> Option<Result<UsageEvent, ClientError>> {
        loop {
            if let Some(end) = self.buffer.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buffer.drain(..=end).collect();
                return Some(self.event_of(&line[..end]));
            }
            if self.done {
                return match self.buffer.is_empty() {
                    true => None,
                    false => Some(Err(invalid("the export ended inside a line".into()))),
                };
            }
            if self.buffer.len() > LINE_BYTES_MAX {
                self.done = true;
                return Some(Err(invalid(format!("an export line is longer than {LINE_BYTES_MAX} bytes"))));
            }
            match self.response.chunk().await {
                Ok(Some(chunk)) => self.buffer.extend_from_slice(&chunk),
                Ok(None) => self.done = true,
                Err(error) => {
                    self.done = true;
                    self.buffer.clear();
                    return Some(Err(ClientError::of_reqwest(&error)));
                }
            }
        }
    }

    fn event_of(&self, line: &[u8]) -> Result<UsageEvent, ClientError> {
        serde_json::from_slice::<ExportedEventBody>(line)
            .map(|body| body.into_event(&self.account_id))
            .map_err(|e| invalid(format!("an export line is not an event: {e}: {}", snippet(line))))
    }
}
