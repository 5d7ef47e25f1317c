//! The listings: `GET` on the collections of accounts, and of an account's
//! leases, credentials and credits, one page at a time.
//!
//! Query parameters are read by [`QueryParams`], never by axum's `Query`,
//! whose rejection is plain text: every bad parameter is a typed JSON 400
//! (`invalid_limit`, `invalid_cursor`, `invalid_state`). A parameter given
//! empty counts as absent, and when one is given twice the last one counts.

use std::collections::HashMap;
use std::convert::Infallible;

use axum::extract::{FromRequestParts, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use tollgate_api::{AccountBody, CredentialBody, CreditBody, ErrorBody, LeaseBody, PageBody};
use tollgate_core::{Error, LeaseFilter, PageLimit, PageRequest};

use super::{ApiResult, json};
use crate::AppState;
use crate::auth::{AdminAuth, GatewayAuth};
use crate::extract::ApiPath;

/// The query string's parameters, percent-decoded. Reusable by any route
/// that takes query parameters: [`QueryParams::get`] for a value,
/// [`QueryParams::page`] for a listing's `cursor` and `limit`.
pub(crate) struct QueryParams(HashMap<String, String>);

impl<S: Send + Sync> FromRequestParts<S> for QueryParams {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Infallible> {
        let query = parts.uri.query().unwrap_or_default();
        Ok(Self(form_urlencoded::parse(query.as_bytes()).into_owned().collect()))
    }
}

impl QueryParams {
    /// The parameter `name`, `None` when absent or empty.
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str).filter(|value| !value.is_empty())
    }

    /// `limit`: absent is the default; anything but an integer from 1 to
    /// the maximum is `invalid_limit` (a value that is no number at all is
    /// reported as 0, one beyond `u32` as `u32::MAX`).
    pub(crate) fn limit(&self) -> Result<PageLimit, Error> {
        let requested = match self.get("limit") {
            None => None,
            Some(text) if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) => {
                Some(text.parse::<u32>().unwrap_or(u32::MAX))
            }
            Some(_) => Some(0),
        };
        PageLimit::new(requested)
    }

    /// `cursor` and `limit`.
    pub(crate) fn page(&self) -> Result<PageRequest, Error> {
        Ok(PageRequest { cursor: self.get("cursor").map(str::to_owned), limit: self.limit()? })
    }
}

/// Accounts in `account_id` order, optionally those whose id starts with
/// `prefix`.
#[utoipa::path(
    get, path = "/v1/accounts", tag = "accounts",
    params(
        ("prefix" = Option<String>, Query, description = "Only accounts whose id starts with this"),
        ("cursor" = Option<String>, Query, description = "The `next_cursor` of the previous page, with the same parameters"),
        ("limit" = Option<u32>, Query, minimum = 1, maximum = 1000, description = "Items per page, 1 to 1000; 100 when absent"),
    ),
    responses(
        (status = 200, description = "One page of accounts", body = PageBody<AccountBody>),
        (status = 400, description = "`invalid_limit` or `invalid_cursor`", body = ErrorBody),
    ),
)]
pub(crate) async fn list_accounts(_: AdminAuth, State(state): State<AppState>, query: QueryParams) -> ApiResult {
    let page = query.page()?;
    let accounts = state.store().list_accounts(query.get("prefix").unwrap_or(""), &page).await?;
    json(StatusCode::OK, PageBody::<AccountBody>::of(&accounts))
}

/// The account's leases in `lease_id` order, without their capabilities;
/// all of them, or those in one `state`.
#[utoipa::path(
    get, path = "/v1/accounts/{account_id}/leases", tag = "leases",
    params(
        ("account_id" = String, Path),
        ("state" = Option<String>, Query, description = "`active`, `released`, `reclaimed` or `consolidated`; every lease when absent"),
        ("cursor" = Option<String>, Query, description = "The `next_cursor` of the previous page, with the same parameters"),
        ("limit" = Option<u32>, Query, minimum = 1, maximum = 1000, description = "Items per page, 1 to 1000; 100 when absent"),
    ),
    responses(
        (status = 200, description = "One page of leases", body = PageBody<LeaseBody>),
        (status = 400, description = "`invalid_limit`, `invalid_cursor` or `invalid_state`", body = ErrorBody),
        (status = 404, description = "`account_not_found`", body = ErrorBody),
    ),
)]
pub(crate) async fn list_leases(
    _: GatewayAuth,
    State(state): State<AppState>,
    ApiPath(account_id): ApiPath<String>,
    query: QueryParams,
) -> ApiResult {
    let filter = LeaseFilter::parse(query.get("state"))?;
    let page = query.page()?;
    let leases = state.store().list_leases(&account_id, filter, &page).await?;
    json(StatusCode::OK, PageBody::<LeaseBody>::of(&leases))
}

/// The account's credentials in `credential_id` order, without their keys.
#[utoipa::path(
    get, path = "/v1/accounts/{account_id}/credentials", tag = "credentials",
    params(
        ("account_id" = String, Path),
        ("cursor" = Option<String>, Query, description = "The `next_cursor` of the previous page, with the same parameters"),
        ("limit" = Option<u32>, Query, minimum = 1, maximum = 1000, description = "Items per page, 1 to 1000; 100 when absent"),
    ),
    responses(
        (status = 200, description = "One page of credentials", body = PageBody<CredentialBody>),
        (status = 400, description = "`invalid_limit` or `invalid_cursor`", body = ErrorBody),
        (status = 404, description = "`account_not_found`", body = ErrorBody),
    ),
)]
pub(crate) async fn list_credentials(
    _: AdminAuth,
    State(state): State<AppState>,
    ApiPath(account_id): ApiPath<String>,
    query: QueryParams,
) -> ApiResult {
    let page = query.page()?;
    let credentials = state.store().list_credentials(&account_id, &page).await?;
    json(StatusCode::OK, PageBody::<CredentialBody>::of(&credentials))
}

/// The account's credits in `credit_id` order, with the units each added.
#[utoipa::path(
    get, path = "/v1/accounts/{account_id}/credits", tag = "accounts",
    params(
        ("account_id" = String, Path),
        ("cursor" = Option<String>, Query, description = "The `next_cursor` of the previous page, with the same parameters"),
        ("limit" = Option<u32>, Query, minimum = 1, maximum = 1000, description = "Items per page, 1 to 1000; 100 when absent"),
    ),
    responses(
        (status = 200, description = "One page of credits", body = PageBody<CreditBody>),
        (status = 400, description = "`invalid_limit` or `invalid_cursor`", body = ErrorBody),
        (status = 404, description = "`account_not_found`", body = ErrorBody),
    ),
)]
pub(crate) async fn list_credits(
    _: AdminAuth,
    State(state): State<AppState>,
    ApiPath(account_id): ApiPath<String>,
    query: QueryParams,
) -> ApiResult {
    let page = query.page()?;
    let credits = state.store().list_credits(&account_id, &page).await?;
    json(StatusCode::OK, PageBody::<CreditBody>::of(&credits))
}
