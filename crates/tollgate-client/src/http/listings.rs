//! The listings: one typed call per page, and [`Pages`], which follows the
//! cursors of any listing until its last page.
//!
//! A listing answers `{"items": [...], "next_cursor": "…" | null}`
//! ([`PageBody`]); the next page is the same request with `cursor` set to
//! the previous `next_cursor`. [`Pages`] does that for any route, so a new
//! listing needs only its path and filters ([`TollgateClient::pages`]).

use std::collections::VecDeque;

use serde::de::DeserializeOwned;
use tollgate_api::{AccountBody, CredentialBody, CreditBody, LeaseBody, PageBody};

use super::{ClientError, TollgateClient};

/// Which page of a listing: after `cursor` (the first page when `None`),
/// of at most `limit` items (the server's default, 100, when `None`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PageQuery {
    pub cursor: Option<String>,
    pub limit: Option<u32>,
}

impl PageQuery {
    /// The first page of at most `limit` items.
    pub fn first(limit: Option<u32>) -> Self {
        Self { cursor: None, limit }
    }
}

/// The pages of one listing, fetched one request at a time as they are
/// read: [`Pages::next_page`] for whole pages, [`Pages::next`] for items,
/// [`Pages::all`] for everything. An error leaves the position where it
/// was, so calling again retries the same page.
pub struct Pages<'a, T> {
    client: &'a TollgateClient,
    segments: Vec<String>,
    filters: Vec<(String, String)>,
    query: PageQuery,
    done: bool,
    buffered: VecDeque<T>,
}

impl<T: DeserializeOwned> Pages<'_, T> {
    /// The next page's items, or `None` after the last page.
    pub async fn next_page(&mut self) -> Result<Option<Vec<T>>, ClientError> {
        if self.done {
            return Ok(None);
        }
        let segments: Vec<&str> = self.segments.iter().map(String::as_str).collect();
        let page: PageBody<T> = self.client.list(&segments, &pairs(&self.filters), &self.query).await?;
        match page.next_cursor {
            Some(cursor) => self.query.cursor = Some(cursor),
            None => self.done = true,
        }
        Ok(Some(page.items))
    }

    /// The next item, fetching the next page when this one is used up;
    /// `None` after the last item.
    pub async fn next(&mut self) -> Result<Option<T>, ClientError> {
        while self.buffered.is_empty() {
            match self.next_page().await? {
                Some(items) => self.buffered.extend(items),
                None => return Ok(None),
            }
        }
        Ok(self.buffered.pop_front())
    }

    /// Every remaining item, in order.
    pub async fn all(mut self) -> Result<Vec<T>, ClientError> {
        let mut items: Vec<T> = self.buffered.drain(..).collect();
        while let Some(page) = self.next_page().await? {
            items.extend(page);
        }
        Ok(items)
    }
}

fn pairs(filters: &[(String, String)]) -> Vec<(&str, &str)> {
    filters.iter().map(|(name, value)| (name.as_str(), value.as_str())).collect()
}

impl TollgateClient {
    /// Every page of the listing at `segments` with the query parameters
    /// `filters`, `limit` items per page (the server's default when `None`).
    pub fn pages<T: DeserializeOwned>(
        &self,
        segments: &[&str],
        filters: &[(&str, &str)],
        limit: Option<u32>,
    ) -> Pages<'_, T> {
        Pages {
            client: self,
            segments: segments.iter().map(|s| (*s).to_owned()).collect(),
            filters: filters.iter().map(|(n, v)| ((*n).to_owned(), (*v).to_owned())).collect(),
            query: PageQuery::first(limit),
            done: false,
            buffered: VecDeque::new(),
        }
    }

    /// One page of the listing at `segments`.
    async fn list<T: DeserializeOwned>(
        &self,
        segments: &[&str],
        filters: &[(&str, &str)],
        page: &PageQuery,
    ) -> Result<PageBody<T>, ClientError> {
        let limit = page.limit.map(|limit| limit.to_string());
        let mut query = filters.to_vec();
        query.extend(page.cursor.as_deref().map(|cursor| ("cursor", cursor)));
        query.extend(limit.as_deref().map(|limit| ("limit", limit)));
        self.get_with_query(segments, &query).await
    }

    /// `GET /v1/accounts` (admin): a page of accounts whose id starts with
    /// `prefix` (every account when `None`), in `account_id` order.
    pub async fn list_accounts(
        &self,
        prefix: Option<&str>,
        page: &PageQuery,
    ) -> Result<PageBody<AccountBody>, ClientError> {
        self.list(&["v1", "accounts"], &optional("prefix", prefix), page).await
    }

    /// Every account whose id starts with `prefix`, page by page.
    pub fn account_pages(&self, prefix: Option<&str>, limit: Option<u32>) -> Pages<'_, AccountBody> {
        self.pages(&["v1", "accounts"], &optional("prefix", prefix), limit)
    }

    /// `GET /v1/accounts/{account_id}/leases` (gateway or admin): a page of
    /// the account's leases in `state` (every lease when `None`), in
    /// `lease_id` order, without capabilities.
    pub async fn list_leases(
        &self,
        account_id: &str,
        state: Option<&str>,
        page: &PageQuery,
    ) -> Result<PageBody<LeaseBody>, ClientError> {
        self.list(&["v1", "accounts", account_id, "leases"], &optional("state", state), page).await
    }

    /// Every lease of the account in `state`, page by page.
    pub fn lease_pages(&self, account_id: &str, state: Option<&str>, limit: Option<u32>) -> Pages<'_, LeaseBody> {
        self.pages(&["v1", "accounts", account_id, "leases"], &optional("state", state), limit)
    }

    /// `GET /v1/accounts/{account_id}/credentials` (admin), in
    /// `credential_id` order, without keys.
    pub async fn list_credentials(
        &self,
        account_id: &str,
        page: &PageQuery,
    ) -> Result<PageBody<CredentialBody>, ClientError> {
        self.list(&["v1", "accounts", account_id, "credentials"], &[], page).await
    }

    /// Every credential of the account, page by page.
    pub fn credential_pages(&self, account_id: &str, limit: Option<u32>) -> Pages<'_, CredentialBody> {
        self.pages(&["v1", "accounts", account_id, "credentials"], &[], limit)
    }

    /// `GET /v1/accounts/{account_id}/credits` (admin), in `credit_id` order.
    pub async fn list_credits(&self, account_id: &str, page: &PageQuery) -> Result<PageBody<CreditBody>, ClientError> {
        self.list(&["v1", "accounts", account_id, "credits"], &[], page).await
    }

    /// Every credit of the account, page by page.
    pub fn credit_pages(&self, account_id: &str, limit: Option<u32>) -> Pages<'_, CreditBody> {
        self.pages(&["v1", "accounts", account_id, "credits"], &[], limit)
    }
}

/// The query parameter `name` when it has a value.
fn optional<'v>(name: &'static str, value: Option<&'v str>) -> Vec<(&'static str, &'v str)> {
    value.map(|value| vec![(name, value)]).unwrap_or_default()
}
