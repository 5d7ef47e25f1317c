//! The webhooks page: every endpoint (never its secret) and the newest
//! page of its delivery log.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};
use tollgate_core::{PageLimit, PageRequest};
use tollgate_store::{Delivery, WebhookEndpoint};

use super::extract::{Signed, failure};
use super::layout::{account_path, page, time_element};
use crate::AppState;

/// Deliveries shown per endpoint.
const ROWS: u32 = 20;

pub(crate) async fn show(signed: Signed, State(state): State<AppState>) -> Response {
    let endpoints = match state.store().endpoints().await {
        Ok(endpoints) => endpoints,
        Err(error) => return failure(&error, &signed),
    };
    let request = PageRequest { cursor: None, limit: PageLimit::new(Some(ROWS)).unwrap_or_default() };
    let mut logs = Vec::with_capacity(endpoints.len());
    for endpoint in &endpoints {
        match state.store().deliveries(&endpoint.endpoint_id, &request).await {
            Ok(page) => logs.push(page.items),
            Err(error) => return failure(&error, &signed),
        }
    }
    let body = html! {
        h1 { "Webhooks" }
        @if endpoints.is_empty() { p { "No webhook endpoint. Create one with POST /v1/webhooks." } }
        @for (endpoint, deliveries) in endpoints.iter().zip(&logs) { (endpoint_section(endpoint, deliveries)) }
    };
    page("Webhooks", Some(&signed), body).into_response()
}

fn endpoint_section(endpoint: &WebhookEndpoint, deliveries: &[Delivery]) -> Markup {
    html! {
        section.endpoint data-endpoint-id=(endpoint.endpoint_id) {
            h2 { (endpoint.url) }
            p { "Endpoint " span.id { (endpoint.endpoint_id) } ", created " (time_element(endpoint.created_at)) "; events: "
                @for (i, event_type) in endpoint.event_types.iter().enumerate() {
                    @if i > 0 { ", " } code { (event_type.as_str()) }
                }
            }
            @if deliveries.is_empty() { p { "No delivery yet." } } @else {
                div.scroll { table {
                    caption { "Deliveries" }
                    thead { tr {
                        th scope="col" { "Delivery" } th scope="col" { "Event" } th scope="col" { "Account" }
                        th scope="col" { "State" } th.num scope="col" { "Attempts" } th scope="col" { "Next attempt" }
                        th scope="col" { "Last error" }
                    } }
                    tbody { @for delivery in deliveries { (delivery_row(delivery)) } }
                } }
            }
        }
    }
}

fn delivery_row(delivery: &Delivery) -> Markup {
    html! {
        tr data-delivery-id=(delivery.delivery_id) {
            td.id { (delivery.delivery_id) }
            td { (delivery.event_type.as_str()) }
            td { a href=(account_path(&delivery.account_id)) { (delivery.account_id) } }
            td { (delivery.state.as_str()) }
            td.num { (delivery.attempts) }
            td { @if let Some(at) = delivery.next_attempt_at { (time_element(at)) } }
            td {
                @if let Some(status) = delivery.last_status { "HTTP " (status) " " }
                @if let Some(error) = &delivery.last_error { (error) }
            }
        }
    }
}
