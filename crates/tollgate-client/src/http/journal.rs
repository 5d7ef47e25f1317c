//! `GET /v1/accounts/{account_id}/journal`: a page of an account's journal,
//! and the whole journal read page by page.

use reqwest::Method;
use tollgate_api::{JournalEntryBody, JournalPageBody};

use super::{ClientError, ClientErrorKind, TollgateClient, snippet};

impl TollgateClient {
    /// `GET /v1/accounts/{account_id}/journal?after=…&limit=…` (either
    /// operator token): the entries after the sequence number `after`, at
    /// most `limit` (the server's default when `None`), in sequence order.
    pub async fn journal(
        &self,
        account_id: &str,
        after: u64,
        limit: Option<u32>,
    ) -> Result<JournalPageBody, ClientError> {
        let mut url = self.url(&["v1", "accounts", account_id, "journal"]);
        {
            let mut query = url.query_pairs_mut();
            query.append_pair("after", &after.to_string());
            if let Some(limit) = limit {
                query.append_pair("limit", &limit.to_string());
            }
        }
        let (status, bytes) = self.send_to(Method::GET, url, None::<&()>, None).await?;
        serde_json::from_slice(&bytes).map_err(|e| ClientError {
            kind: ClientErrorKind::InvalidResponse,
            status: Some(status.as_u16()),
            code: "invalid_response".into(),
            message: format!("HTTP {status} body is not the documented shape: {e}: {}", snippet(&bytes)),
            retryable: false,
        })
    }

    /// Every entry of an account's journal, read in pages of the largest
    /// size from the first entry on.
    pub async fn journal_all(&self, account_id: &str) -> Result<Vec<JournalEntryBody>, ClientError> {
        let mut entries = Vec::new();
        let mut after = 0;
        loop {
            let page = self.journal(account_id, after, Some(tollgate_core::PageLimit::MAX)).await?;
            entries.extend(page.items);
            match page.next_after {
                Some(next) => after = next,
                None => return Ok(entries),
            }
        }
    }
}
