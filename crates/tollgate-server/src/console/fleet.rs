//! The fleet page: the reclaim backlog, leases by state, what ingestion
//! classified over the last hour, webhook deliveries and the last `check`;
//! and the check page, which runs `check` and names every violation.

use std::sync::Mutex;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use jiff::Timestamp;
use maud::{Markup, html};
use tollgate_core::RejectReason;
use tollgate_store::{CheckReport, LeaseSummary};

use super::extract::{Signed, failure};
use super::history::Minute;
use super::layout::{duration, page, time_element};
use super::svg::{self, Stacked};
use crate::AppState;

/// What the last check on this server found, and when. `check` reads every
/// account, so the fleet page shows the last result and runs it only when
/// asked.
#[derive(Default)]
pub(crate) struct LastCheck(Mutex<Option<(Timestamp, CheckReport)>>);

impl LastCheck {
    fn get(&self) -> Option<(Timestamp, CheckReport)> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    fn set(&self, at: Timestamp, report: CheckReport) {
        *self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some((at, report));
    }
}

pub(crate) async fn show(signed: Signed, State(state): State<AppState>) -> Response {
    let now = state.now();
    let leases = match state.store().lease_summary(now).await {
        Ok(leases) => leases,
        Err(error) => return failure(&error, &signed),
    };
    let outbox = match state.store().outbox_counts().await {
        Ok(outbox) => outbox,
        Err(error) => return failure(&error, &signed),
    };
    let storage = match state.store().status().await {
        Ok(storage) => storage,
        Err(error) => return failure(&error, &signed),
    };
    let minutes = state.console().ingest.last_hour(now);
    let body = html! {
        h1 { "Fleet" }
        p { "Storage: " span #backend { (storage.backend) }
            @if let Some(migrations) = &storage.migrations {
                ", migrations " (migrations.applied.last().copied().unwrap_or(0)) " applied"
                @if !migrations.pending().is_empty() { ", " strong { (migrations.pending().len()) " pending" } }
            }
        }
        (reclaim(&state, &leases, now))
        (ingestion(&minutes))
        section #deliveries aria-labelledby="deliveries-heading" {
            h2 #deliveries-heading { "Webhook deliveries" }
            dl.counters {
                div { dt { "pending" } dd data-count="pending" { (outbox.pending) } }
                div { dt { "delivered" } dd data-count="delivered" { (outbox.delivered) } }
                div { dt { "failed" } dd data-count="failed" { (outbox.failed) } }
            }
        }
        (check_section(state.console().last_check.get().as_ref()))
    };
    page("Fleet", Some(&signed), body).into_response()
}

fn reclaim(state: &AppState, leases: &LeaseSummary, now: Timestamp) -> Markup {
    let settled = state.metrics().settled_leases();
    html! {
        section #reclaim aria-labelledby="reclaim-heading" {
            h2 #reclaim-heading { "Leases and reclaim" }
            dl.counters #leases-by-state {
                div { dt { "active" } dd data-count="active" { (leases.active) } }
                div { dt { "due for reclaim" } dd #reclaim-backlog data-count="due" { (leases.due) } }
                @for (name, count) in settled {
                    div { dt { (name) " by this server" } dd data-count=(name) { (count) } }
                }
            }
            @if let Some(oldest) = leases.oldest_due_expiry {
                p { "The most overdue lease expired at " (time_element(oldest)) ", "
                    (duration(oldest.duration_since(now))) "." }
            }
            @if let Some(last) = state.metrics().last_reclaim() {
                p { "Last successful reclaim pass (or start): " (time_element(last)) "." }
            }
            p.hint { "Settled counts are this server's since it started; active and due are the whole store's." }
        }
    }
}

fn ingestion(minutes: &[Minute]) -> Markup {
    let labels: Vec<String> = minutes.iter().map(|minute| minute_label(minute.minute)).collect();
    let series = ["accepted".to_owned(), "duplicate".to_owned(), "rejected".to_owned()];
    let columns: Vec<Vec<u128>> =
        minutes.iter().map(|m| vec![m.accepted.into(), m.duplicate.into(), m.rejected_total().into()]).collect();
    let title = "Usage events classified by this server, per minute, last hour (UTC)";
    let chart = Stacked { title, column_labels: &labels, label_every: 10, series: &series, columns: &columns };
    let sum = |pick: fn(&Minute) -> u64| minutes.iter().map(pick).sum::<u64>();
    let reasons: Vec<(&str, u64)> = RejectReason::ALL
        .iter()
        .enumerate()
        .map(|(i, reason)| (reason.code(), minutes.iter().map(|m| m.rejected[i]).sum()))
        .filter(|(_, count)| *count > 0)
        .collect();
    html! {
        section #ingestion aria-labelledby="ingestion-heading" {
            h2 #ingestion-heading { "Ingestion" }
            (svg::stacked(&chart))
            ul.legend {
                li { span.swatch.s0 {} "accepted " span data-count="accepted" { (sum(|m| m.accepted)) } }
                li { span.swatch.s1 {} "duplicate " span data-count="duplicate" { (sum(|m| m.duplicate)) } }
                li { span.swatch.s2 {} "rejected " span data-count="rejected" { (sum(Minute::rejected_total)) } }
            }
            @if reasons.is_empty() { p { "No event rejected in the last hour." } } @else {
                table #rejection-reasons {
                    caption { "Rejections by reason, last hour" }
                    thead { tr { th scope="col" { "Reason" } th.num scope="col" { "Events" } } }
                    tbody { @for (code, count) in &reasons {
                        tr data-reason=(code) { td { (code) } td.num { (count) } }
                    } }
                }
            }
        }
    }
}

fn minute_label(minute: i64) -> String {
    Timestamp::from_second(minute * 60).map_or_else(|_| String::new(), |at| at.strftime("%H:%M").to_string())
}

fn check_section(last: Option<&(Timestamp, CheckReport)>) -> Markup {
    html! {
        section #check aria-labelledby="check-heading" {
            h2 #check-heading { "Check" }
            @match last {
                None => p #check-status data-clean="unknown" { "Not run on this server yet." },
                Some((at, report)) => {
                    p #check-status data-clean=(report.is_clean()) {
                        @if report.is_clean() { "Clean: " } @else { strong { "Violations found: " } }
                        (report.accounts_checked) " accounts checked at " (time_element(*at)) "."
                    }
                    (findings(report))
                }
            }
            p { a #run-check href="/console/check" { "Run the check now" } }
            p.hint { "The check reads every account, lease and journal; run it when you need it." }
        }
    }
}

/// Every violated equation, guard and journal, each named.
fn findings(report: &CheckReport) -> Markup {
    html! {
        @if !report.is_clean() {
            ul #violations {
                @for violation in &report.violations {
                    li data-equation=(violation.equation.code()) { (violation.to_string()) }
                }
                @for guard in &report.guard_violations {
                    li data-guard=(guard.column) { (guard.table) " " (guard.key) ": " (guard.column) " = " (guard.value) }
                }
                @for mismatch in &report.journal_mismatches {
                    li data-journal=(mismatch.account_id) { (mismatch.to_string()) }
                }
                @for mismatch in &report.usage_totals_mismatches {
                    li data-usage-totals=(mismatch.account_id) { (mismatch.to_string()) }
                }
            }
        }
    }
}

/// Runs `check`, keeps its result for the fleet page and shows it.
pub(crate) async fn check(signed: Signed, State(state): State<AppState>) -> Response {
    let report = match state.store().check().await {
        Ok(report) => report,
        Err(error) => return failure(&error, &signed),
    };
    let at = state.now();
    state.console().last_check.set(at, report.clone());
    let body = html! {
        h1 { "Check" }
        (check_section(Some(&(at, report))))
        p { a href="/console/fleet" { "Back to the fleet" } }
    };
    page("Check", Some(&signed), body).into_response()
}
