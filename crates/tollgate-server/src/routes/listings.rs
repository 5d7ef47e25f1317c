//! The listings: `GET` on the collections of accounts, and of an account's
//! leases, credentials and credits, one page at a time.
//!
//! Query parameters are read by [`QueryParams`]: every bad parameter is a
//! typed JSON 400 (`invalid_limit`, `invalid_cursor`, `invalid_state`,
//! `invalid_query` for one a listing does not take or one given twice).

use axum::extract::State;
use axum::http::StatusCode;
use tollgate_api::{AccountBody, CredentialBody, CreditBody, ErrorBody, LeaseBody, PageBody};
use tollgate_core::LeaseFilter;
use tollgate_store::LeaseListing;

use super::params::AccountPath;
use super::reads::read_route;
use super::responses::{AccountNotFound, PageRefused};
use super::{ApiResult, json};
use crate::AppState;
use crate::auth::{AdminAuth, GatewayAuth};
use crate::extract::QueryParams;

/// A listing's paging parameters, as the OpenAPI document states them; the
/// handlers read them through [`QueryParams::page`].
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[expect(dead_code, reason = "documents the parameters; QueryParams reads them")]
pub(crate) struct PageParams {
    /// The `next_cursor` of the previous page, with the same parameters.
    cursor: Option<String>,
    /// Items per page, 1 to 1000; 100 when absent.
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
}

/// Accounts in `account_id` order, optionally those whose id starts with
/// `prefix`.
#[utoipa::path(
    get, path = "/v1/accounts", tag = "accounts",
    params(
        ("prefix" = Option<String>, Query, description = "Only accounts whose id starts with this"),
        PageParams,
    ),
    responses(
        (status = 200, description = "One page of accounts", body = PageBody<AccountBody>),
        PageRefused,
    ),
)]
pub(crate) async fn list_accounts(_: AdminAuth, State(state): State<AppState>, query: QueryParams) -> ApiResult {
    let query = query.only(&["prefix", "cursor", "limit"])?;
    let page = query.page()?;
    let accounts = state.store().list_accounts(query.get("prefix").unwrap_or(""), &page).await?;
    json(StatusCode::OK, PageBody::<AccountBody>::of(&accounts))
}

read_route! {
    /// The account's leases in `lease_id` order, without their capabilities;
    /// all of them, or those in one `state`.
    list_leases: GatewayAuth, "/v1/accounts/{account_id}/leases", tag "leases",
    params(
        AccountPath,
        ("state" = Option<String>, Query,
            description = "`active`, `released`, `reclaimed` or `consolidated`; every lease when absent"),
        PageParams,
    ),
    responses(
        (status = 200, description = "One page of leases", body = PageBody<LeaseBody>),
        (status = 400, description = "`invalid_limit`, `invalid_cursor`, `invalid_state` or `invalid_query`",
            body = ErrorBody),
        AccountNotFound,
    ),
    |state, AccountPath { account_id }, query: ["state", "cursor", "limit"]| {
        let filter = LeaseFilter::parse(query.get("state"))?;
        let page = query.page()?;
        let leases = state.store().list_leases(LeaseListing { account_id: &account_id, filter, page: &page }).await?;
        PageBody::<LeaseBody>::of(&leases)
    }
}

read_route! {
    /// The account's credentials in `credential_id` order, without their keys.
    list_credentials: AdminAuth, "/v1/accounts/{account_id}/credentials", tag "credentials",
    AccountPath { account_id }, AccountNotFound,
    "One page of credentials" => PageBody<CredentialBody>, list_credentials
}

read_route! {
    /// The account's credits in `credit_id` order, with the units each added.
    list_credits: AdminAuth, "/v1/accounts/{account_id}/credits", tag "accounts",
    AccountPath { account_id }, AccountNotFound,
    "One page of credits" => PageBody<CreditBody>, list_credits
}
