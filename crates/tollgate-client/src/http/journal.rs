//! `GET /v1/accounts/{account_id}/journal`: a page of an account's journal,
//! and the whole journal read page by page.

use tollgate_api::{JournalEntryBody, JournalPageBody};

use super::{ClientError, TollgateClient};

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
        let (after, limit) = (after.to_string(), limit.map(|limit| limit.to_string()));
        let mut query = vec![("after", after.as_str())];
        query.extend(limit.as_deref().map(|limit| ("limit", limit)));
        self.get_with_query(&["v1", "accounts", account_id, "journal"], &query).await
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
