//! The usage read side through the typed client, against a running server on
//! each store: dimensions reported, totals by window and group, and the
//! export as pages, as a pager and as an NDJSON stream, all alike.

use jiff::Timestamp;
use tollgate_client::{ClientErrorKind, UsageQueryParams};
use tollgate_core::query::{GroupBy, Window};
use tollgate_core::{Dimensions, UsageEvent};

use crate::faults::{on_both_stores, storage};
use crate::support::{Server, Tenant};

fn at(text: &str) -> Timestamp {
    text.parse().unwrap()
}

fn dims(pairs: &[(&str, &str)]) -> Dimensions {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

async fn exercise(postgres: bool) {
    let (storage, _db) = storage(postgres).await;
    let server = Server::start(&storage).await;
    let gateway = server.gateway();
    let tenant = Tenant::create(&server.admin(), "acct-usage", 1).await;
    let event = |id: &str, occurred_at: &str, units: u64, pairs: &[(&str, &str)]| UsageEvent {
        occurred_at: at(occurred_at),
        dimensions: dims(pairs),
        ..tenant.overage(id, units)
    };
    let mut events: Vec<UsageEvent> = (0..25)
        .map(|i| event(&format!("r{i:02}"), &format!("2026-01-01T00:00:{i:02}.5Z"), 1, &[("model", "a")]))
        .collect();
    events.push(event("late", "2026-01-01T00:01:00Z", 10, &[]));
    events.push(event("bad", "2026-01-01T00:01:00Z", 10, &[("Model", "x")]));
    let answer = gateway.send_usage(&events).await.unwrap();
    let outcomes: Vec<(String, Option<String>)> =
        answer.outcomes.iter().map(|o| (o.outcome.clone(), o.reason.clone())).collect();
    assert!(outcomes[..26].iter().all(|(o, _)| o == "accepted"), "{outcomes:?}");
    assert_eq!(outcomes[26], ("rejected".to_owned(), Some("invalid_dimensions".to_owned())));
    events.pop();

    let (from, to) = (at("2026-01-01T00:00:00Z"), at("2026-01-01T00:02:00Z"));
    let params =
        UsageQueryParams { from, to, window: Some(Window::Minute), group_by: GroupBy::Dimension("model".into()) };
    let report = gateway.usage(&tenant.account_id, &params).await.unwrap();
    assert_eq!(report.buckets.len(), 2);
    assert_eq!((report.buckets[0].start, report.buckets[0].end), (from, at("2026-01-01T00:01:00Z")));
    let groups = |i: usize| -> Vec<(Option<String>, String, String)> {
        report.buckets[i].groups.iter().map(|g| (g.key.clone(), g.units.clone(), g.events.clone())).collect()
    };
    assert_eq!(groups(0), [(Some("a".to_owned()), "25".to_owned(), "25".to_owned())]);
    assert_eq!(groups(1), [(None, "10".to_owned(), "1".to_owned())]);
    assert_eq!((report.total.units.as_str(), report.total.events.as_str()), ("35", "26"));

    // One page, every page in turn, and the stream: the same events, in order.
    let first = gateway.usage_events_page(&tenant.account_id, from, to, None, Some(10)).await.unwrap();
    assert_eq!(first.items.len(), 10);
    assert!(first.next_cursor.is_some());
    let mut pages = gateway.usage_events(&tenant.account_id, from, to, Some(7));
    let mut paged = Vec::new();
    let mut page_count = 0;
    while let Some(page) = pages.next_page().await {
        paged.extend(page.unwrap());
        page_count += 1;
    }
    assert_eq!(page_count, 4);
    let mut streamed = Vec::new();
    let mut stream = gateway.usage_events_ndjson(&tenant.account_id, from, to).await.unwrap();
    while let Some(event) = stream.next().await {
        streamed.push(event.unwrap());
    }
    assert_eq!(paged, events);
    assert_eq!(streamed, events);

    // Typed errors.
    let refused =
        gateway.usage(&tenant.account_id, &UsageQueryParams { to: from, ..params.clone() }).await.unwrap_err();
    assert_eq!(
        (refused.kind, refused.status, refused.code.as_str()),
        (ClientErrorKind::Api, Some(400), "invalid_range")
    );
    let ghost = gateway.usage("ghost", &params).await.unwrap_err();
    assert_eq!((ghost.status, ghost.code.as_str()), (Some(404), "account_not_found"));
    let ghost = gateway.usage_events_ndjson("ghost", from, to).await.unwrap_err();
    assert_eq!((ghost.status, ghost.code.as_str()), (Some(404), "account_not_found"));
    let cursor = first.next_cursor.unwrap();
    let other_range =
        gateway.usage_events_page(&tenant.account_id, from, at("2026-01-01T00:03:00Z"), Some(&cursor), None);
    let refused = other_range.await.unwrap_err();
    assert_eq!((refused.status, refused.code.as_str()), (Some(400), "invalid_cursor"));
}

on_both_stores!(exercise: usage_queries_and_exports_on_memory, usage_queries_and_exports_on_postgres);
