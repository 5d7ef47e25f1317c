//! The accounts page: search by id prefix, a page at a time, each account
//! with its balance bar.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};
use tollgate_core::{PageLimit, PageRequest};
use tollgate_store::AccountView;

use super::extract::{Signed, failure, refusal};
use super::layout::{account_path, page, query};
use super::svg::{self, Segment};
use crate::AppState;
use crate::extract::QueryParams;

/// Accounts per page.
const PAGE_ROWS: u32 = 50;

pub(crate) async fn list(signed: Signed, State(state): State<AppState>, params: QueryParams) -> Response {
    let params = match params.only(&["prefix", "cursor"]) {
        Ok(params) => params,
        Err(_) => return refusal(StatusCode::BAD_REQUEST, "This page takes only prefix and cursor.", Some(&signed)),
    };
    let prefix = params.get("prefix").unwrap_or("").trim().to_owned();
    let limit = PageLimit::new(Some(PAGE_ROWS)).unwrap_or_default();
    let request = PageRequest { cursor: params.get("cursor").map(str::to_owned), limit };
    let accounts = match state.store().list_accounts(&prefix, &request).await {
        Ok(accounts) => accounts,
        Err(error) => return failure(&error, &signed),
    };
    let body = html! {
        h1 { "Accounts" }
        form.search #search method="get" action="/console/accounts" role="search" {
            label for="prefix" { "Account id starts with" }
            input #prefix type="search" name="prefix" value=(prefix) maxlength="128";
            button type="submit" { "Search" }
        }
        @if accounts.items.is_empty() {
            p #no-accounts { "No account matches." }
        } @else {
            div.scroll {
                table #accounts {
                    thead { tr {
                        th scope="col" { "Account" }
                        th scope="col" { "Balance" }
                        th.num scope="col" { "Available" }
                        th.num scope="col" { "Credited" }
                        th.num scope="col" { "Active leases" }
                    } }
                    tbody {
                        @for view in &accounts.items { (row(view)) }
                    }
                }
            }
        }
        @if let Some(cursor) = &accounts.next_cursor {
            p { a #next-page rel="next" href={"/console/accounts?" (query(&[("prefix", &prefix), ("cursor", cursor)]))} {
                "Next page"
            } }
        }
    };
    page("Accounts", Some(&signed), body).into_response()
}

fn row(view: &AccountView) -> Markup {
    let account = &view.account;
    html! {
        tr data-account-id=(account.account_id) {
            td { a href=(account_path(&account.account_id)) { (account.account_id) } }
            td.bar-cell { (balance_bar(account)) }
            td.num { (account.available) }
            td.num { (account.credited) }
            td.num { (view.active_leases) }
        }
    }
}

/// `credited` split into `available`, `reserved` and `consumed`.
pub(super) fn balance_bar(account: &tollgate_core::Account) -> Markup {
    let segments = [
        Segment { class: "seg-available", label: "available", value: account.available.into() },
        Segment { class: "seg-reserved", label: "reserved", value: account.reserved.into() },
        Segment { class: "seg-consumed", label: "consumed", value: account.consumed.into() },
    ];
    let title = format!("{} of {} credited units available", account.available, account.credited);
    svg::bar(&title, account.credited.into(), &segments)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_links_its_account_and_draws_its_balance() {
        let account = tollgate_core::Account {
            account_id: "acme".into(),
            credited: 100,
            available: 60,
            reserved: 30,
            consumed: 10,
            overage: 0,
            billed: 10,
            next_fence: 2,
        };
        let html = row(&AccountView { account, active_leases: 1 }).into_string();
        assert!(html.contains(r#"href="/console/accounts/acme""#), "{html}");
        assert!(html.contains("60 of 100 credited units available"), "{html}");
    }
}
