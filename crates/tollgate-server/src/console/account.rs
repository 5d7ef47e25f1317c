//! One account's page: its balance equation, usage chart, active leases,
//! credentials, credits and alert rules; its journal; and the three changes
//! the console makes (add a credit, issue a credential, revoke one).

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};
use tollgate_core::{
    Account, AlertRule, Credential, CreditEntry, Lease, LeaseFilter, LeaseState, PageLimit, PageRequest,
};
use tollgate_store::LeaseListing;

use super::extract::{AccountPage, Change, Signed, failure, refusal};
use super::layout::{account_path, duration, page, scrolling_table, segment, time_element};
use super::usage::{self, UsageView};
use crate::AppState;

/// Rows of each listing on the account page.
const ROWS: u32 = 100;

/// Everything the account page shows, read before anything is drawn.
struct Sections {
    account: tollgate_store::AccountView,
    leases: Vec<Lease>,
    more_leases: bool,
    credentials: Vec<Credential>,
    credits: Vec<CreditEntry>,
    more_credits: bool,
    rules: Vec<AlertRule>,
    usage: UsageView,
}

fn first_page() -> PageRequest {
    PageRequest { cursor: None, limit: PageLimit::new(Some(ROWS)).unwrap_or_default() }
}

/// Reads the account page's sections: the same store calls as the JSON
/// routes' account, listings, alert rules and usage query. They are
/// independent reads, each its own statement (and so its own snapshot)
/// whether awaited in turn or not, so they run concurrently: the page
/// waits for the slowest, not for their sum. Their results are then taken
/// in a fixed order, so that a page failing on several reports the same
/// error every time.
async fn read(state: &AppState, account_id: &str, choice: &usage::Choice) -> Result<Sections, tollgate_core::Error> {
    let (store, page) = (state.store(), first_page());
    let (account, leases, credentials, credits, rules, usage) = tokio::join!(
        store.account(account_id),
        store.list_leases(LeaseListing { account_id, filter: LeaseFilter::State(LeaseState::Active), page: &page }),
        store.list_credentials(account_id, &page),
        store.list_credits(account_id, &page),
        store.alert_rules(account_id),
        usage::read(state, account_id, choice),
    );
    let (account, leases, credentials, credits, rules, report) =
        (account?, leases?, credentials?, credits?, rules?, usage?);
    let usage = UsageView::new(report, choice, &credentials.items);
    Ok(Sections {
        account,
        more_leases: leases.next_cursor.is_some(),
        leases: leases.items,
        credentials: credentials.items,
        more_credits: credits.next_cursor.is_some(),
        credits: credits.items,
        rules,
        usage,
    })
}

pub(crate) async fn show(State(state): State<AppState>, request: AccountPage) -> Response {
    let AccountPage { signed, account_id, params } = request;
    let choice = match usage::Choice::of(params) {
        Ok(choice) => choice,
        Err(problem) => return refusal(StatusCode::BAD_REQUEST, &problem, Some(&signed)),
    };
    let sections = match read(&state, &account_id, &choice).await {
        Ok(sections) => sections,
        Err(error) => return failure(&error, &signed),
    };
    let now = state.now();
    let body = html! {
        h1 { "Account " span #account-id { (account_id) } }
        (balance(&sections.account.account, sections.account.active_leases))
        (usage::section(&account_id, &choice, &sections.usage))
        (leases(&sections.leases, sections.more_leases, now))
        (credentials(&signed, &account_id, &sections.credentials))
        (credits(&signed, &account_id, &sections.credits, sections.more_credits))
        (rules(&sections.rules))
        section #journal-link aria-labelledby="journal-heading" {
            h2 #journal-heading { "Journal" }
            p { a href={(account_path(&account_id)) "/journal"} { "Every change to this account's counters" } }
        }
    };
    page(&format!("Account {account_id}"), Some(&signed), body).into_response()
}

fn counter(name: &str, value: u64) -> Markup {
    html! { div { dt { (name) } dd data-counter=(name) { (value) } } }
}

fn balance(account: &Account, active_leases: u64) -> Markup {
    html! {
        section #balance aria-labelledby="balance-heading" {
            h2 #balance-heading { "Balance" }
            p.equation {
                "credited = available + reserved + consumed: "
                (account.credited) " = " (account.available) " + " (account.reserved) " + " (account.consumed)
            }
            (super::accounts::balance_bar(account))
            ul.legend {
                li { span.swatch.seg-available {} "available" }
                li { span.swatch.seg-reserved {} "reserved" }
                li { span.swatch.seg-consumed {} "consumed" }
            }
            dl.counters {
                (counter("credited", account.credited))
                (counter("available", account.available))
                (counter("reserved", account.reserved))
                (counter("consumed", account.consumed))
                (counter("billed", account.billed))
                (counter("overage", account.overage))
                div { dt { "active leases" } dd data-counter="active_leases" { (active_leases) } }
            }
        }
    }
}

fn leases(leases: &[Lease], more: bool, now: jiff::Timestamp) -> Markup {
    html! {
        section #leases aria-labelledby="leases-heading" {
            h2 #leases-heading { "Active leases" }
            @if leases.is_empty() { p { "No active lease." } } @else {
                (scrolling_table(html! {
                    th scope="col" { "Lease" } th.num scope="col" { "Fence" } th.num scope="col" { "Granted" }
                    th.num scope="col" { "Used" } th scope="col" { "Expires" } th scope="col" { "Time left" }
                }, html! { @for lease in leases {
                    tr data-lease-id=(lease.lease_id) {
                        td.id { (lease.lease_id) }
                        td.num { (lease.fencing_token) }
                        td.num { (lease.granted) }
                        td.num { (lease.used) }
                        td { (time_element(lease.expiry)) @if lease.expiry_is_upper_bound { " (at the latest)" } }
                        td { (time_left(lease.expiry, now)) }
                    }
                } }))
                @if more { p { "The first " (ROWS) " active leases, by lease id." } }
            }
        }
    }
}

/// `12 min 5 s`, or `expired 3 s ago` for a lease the reclaim worker has
/// yet to settle.
fn time_left(expiry: jiff::Timestamp, now: jiff::Timestamp) -> String {
    let left = expiry.duration_since(now);
    if left.is_negative() { format!("expired {}", duration(left)) } else { duration(left) }
}

fn credentials(signed: &Signed, account_id: &str, credentials: &[Credential]) -> Markup {
    let base = account_path(account_id);
    html! {
        section #credentials aria-labelledby="credentials-heading" {
            h2 #credentials-heading { "Credentials" }
            @if credentials.is_empty() { p { "No credential." } } @else {
                (scrolling_table(html! {
                    th scope="col" { "Credential" } th scope="col" { "Label" } th scope="col" { "Created" }
                    th scope="col" { "Last used" } th.num scope="col" { "Events" } th.num scope="col" { "Units" }
                    th scope="col" { "State" }
                }, html! { @for credential in credentials {
                    tr data-credential-id=(credential.credential_id) {
                        td.id { (credential.credential_id) }
                        td.label { (credential.label) }
                        td { (time_element(credential.created_at)) }
                        td { @match credential.last_used_at { Some(at) => (time_element(at)), None => "never" } }
                        td.num { (credential.accepted_events) }
                        td.num { (credential.accepted_units) }
                        td.state { @match credential.revoked_at {
                            Some(at) => { "revoked " (time_element(at)) }
                            None => {
                                "active"
                                @if signed.session.can_change() {
                                    form.revoke method="post"
                                        action={(base) "/credentials/" (segment(&credential.credential_id)) "/revoke"} {
                                        input type="hidden" name="csrf" value=(signed.csrf);
                                        button type="submit" aria-label={"Revoke " (credential.label)} { "Revoke" }
                                    }
                                }
                            }
                        } }
                    }
                } }))
            }
            @if signed.session.can_change() {
                form #issue-credential method="post" action={(base) "/credentials"} {
                    input type="hidden" name="csrf" value=(signed.csrf);
                    label for="label" { "New credential's label" }
                    input #label type="text" name="label" maxlength="256";
                    button type="submit" { "Issue a credential" }
                }
            }
        }
    }
}

fn credits(signed: &Signed, account_id: &str, credits: &[CreditEntry], more: bool) -> Markup {
    let fresh_id = format!("console-{}", uuid_like());
    html! {
        section #credits aria-labelledby="credits-heading" {
            h2 #credits-heading { "Credits" }
            @if credits.is_empty() { p { "No credit." } } @else {
                (scrolling_table(html! { th scope="col" { "Credit" } th.num scope="col" { "Units" } }, html! {
                    @for credit in credits {
                        tr data-credit-id=(credit.credit_id) { td.id { (credit.credit_id) } td.num { (credit.units) } }
                    }
                }))
                @if more { p { "The first " (ROWS) " credits, by credit id." } }
            }
            @if signed.session.can_change() {
                form #add-credit method="post" action={(account_path(account_id)) "/credits"} {
                    input type="hidden" name="csrf" value=(signed.csrf);
                    label for="credit_id" { "Credit id (a repeated id adds nothing)" }
                    input #credit_id type="text" name="credit_id" value=(fresh_id) maxlength="128" required;
                    label for="units" { "Units" }
                    input #units type="number" name="units" min="1" step="1" inputmode="numeric" required;
                    button type="submit" { "Add credit" }
                }
            }
        }
    }
}

fn rules(rules: &[AlertRule]) -> Markup {
    html! {
        section #alert-rules aria-labelledby="rules-heading" {
            h2 #rules-heading { "Alert rules" }
            @if rules.is_empty() { p { "No alert rule. " a href="/console/webhooks" { "Webhooks" } } } @else {
                (scrolling_table(html! {
                    th scope="col" { "Rule" } th scope="col" { "Condition" } th.num scope="col" { "Threshold" }
                    th scope="col" { "Created" }
                }, html! { @for rule in rules {
                    tr data-rule-id=(rule.rule_id) {
                        td.id { (rule.rule_id) }
                        td { (rule.condition.kind()) }
                        td.num { @if let Some(threshold) = rule.condition.threshold() { (threshold) } }
                        td { (time_element(rule.created_at)) }
                    }
                } }))
            }
        }
    }
}

/// 128 random bits in hex: a fresh credit id for the form, so that
/// submitting it twice credits once.
fn uuid_like() -> String {
    hex::encode(rand::random::<[u8; 16]>())
}

/// Adds a credit from the form; idempotent on its `credit_id`.
pub(crate) async fn add_credit(State(state): State<AppState>, change: Change<String>) -> Response {
    let Change { signed, path: account_id, form } = change;
    let units = match form.get("units").map(str::trim).and_then(|units| units.parse::<u64>().ok()) {
        Some(units) => units,
        None => {
            let problem = "Units must be a whole number of at least 1.";
            return refusal(StatusCode::BAD_REQUEST, problem, Some(&signed));
        }
    };
    let credit_id = form.get("credit_id").unwrap_or("").trim();
    let credited = state.store().credit(&account_id, credit_id, units, state.now()).await;
    back_to_account(credited, &account_id, &signed)
}

/// After a change: back to the account page, or the refusal's page.
fn back_to_account<T>(result: Result<T, tollgate_core::Error>, account_id: &str, signed: &Signed) -> Response {
    match result {
        Ok(_) => super::see_other(&account_path(account_id)),
        Err(error) => failure(&error, signed),
    }
}

/// Issues a credential and shows its key, on this page only.
pub(crate) async fn issue_credential(State(state): State<AppState>, change: Change<String>) -> Response {
    let Change { signed, path: account_id, form } = change;
    let label = form.get("label").unwrap_or("");
    let issued = match state.store().issue_credential(&account_id, label, state.now()).await {
        Ok(issued) => issued,
        Err(error) => return failure(&error, &signed),
    };
    let body = html! {
        h1 { "Credential issued" }
        p { "Credential " span.id { (issued.credential.credential_id) } " of account " (account_id) "." }
        p role="alert" { "Copy its key now: it is shown on this page only, and no page shows it again." }
        p { code #issued-key { (issued.key.expose()) } }
        p { a href=(account_path(&account_id)) { "Back to the account" } }
    };
    (StatusCode::CREATED, page("Credential issued", Some(&signed), body)).into_response()
}

/// Revokes a credential of the account.
pub(crate) async fn revoke(State(state): State<AppState>, change: Change<(String, String)>) -> Response {
    let Change { signed, path: (account_id, credential_id), .. } = change;
    let revoked = state.store().revoke_credential(&account_id, &credential_id, state.now()).await;
    back_to_account(revoked, &account_id, &signed)
}

/// The account's journal, a page at a time from `after`.
pub(crate) async fn journal(State(state): State<AppState>, request: AccountPage) -> Response {
    let AccountPage { signed, account_id, params } = request;
    let after = match params.only(&["after"]).map(|params| params.after()) {
        Ok(Ok(after)) => after,
        _ => return refusal(StatusCode::BAD_REQUEST, "after must be a journal sequence number.", Some(&signed)),
    };
    let limit = PageLimit::new(Some(ROWS)).unwrap_or_default();
    let page_of = match state.store().journal(&account_id, after, limit).await {
        Ok(page_of) => page_of,
        Err(error) => return failure(&error, &signed),
    };
    let body = html! {
        h1 { "Journal of " a href=(account_path(&account_id)) { (account_id) } }
        form.search method="get" {
            label for="after" { "Entries after sequence number" }
            input #after type="number" name="after" min="0" value=(after);
            button type="submit" { "Show" }
        }
        (journal_table(&page_of.items))
        @if let Some(next) = page_of.next_after {
            p { a #next-page rel="next" href={"?after=" (next)} { "Next entries" } }
        }
    };
    page(&format!("Journal of {account_id}"), Some(&signed), body).into_response()
}

fn journal_table(entries: &[tollgate_core::Entry]) -> Markup {
    html! {
        @if entries.is_empty() { p { "No entry after this one." } } @else {
            div.scroll { table #journal {
                thead { tr {
                    th.num scope="col" { "Seq" } th scope="col" { "Kind" } th scope="col" { "At" }
                    @for name in tollgate_core::COUNTER_NAMES { th.num scope="col" { (name) } }
                    th scope="col" { "Ids" }
                } }
                tbody { @for entry in entries {
                    tr data-seq=(entry.seq) {
                        td.num { (entry.seq) }
                        td { (entry.kind.as_str()) }
                        td { (time_element(entry.at)) }
                        @for delta in entry.deltas { td.num { @if delta != 0 { (signed_number(delta)) } } }
                        td.id { (entry.ids.to_string()) }
                    }
                } }
            } }
        }
    }
}

fn signed_number(delta: i128) -> String {
    if delta > 0 { format!("+{delta}") } else { delta.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_cells_show_signed_changes() {
        assert_eq!(signed_number(5), "+5");
        assert_eq!(signed_number(-5), "-5");
    }
}
