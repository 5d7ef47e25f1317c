//! The usage read routes: every bad query string is a typed JSON 400 (never
//! a 500, never plain text), reports have the documented shape, and the
//! NDJSON export streams the whole range in order across storage pages.

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::support::{Api, App, As, GATEWAY, assert_error};

const FROM: &str = "2024-01-01T00:00:00Z";
const TO: &str = "2024-01-01T00:03:00Z";

async fn ingest(app: &App, events: Vec<Value>) {
    let body = app.report_usage(json!({ "events": events })).await;
    for outcome in body["outcomes"].as_array().unwrap() {
        assert_eq!(outcome["outcome"], "accepted", "{outcome}");
    }
}

fn event(request_id: &str, credential_id: &str, occurred_at: &str, units: u64, dimensions: Value) -> Value {
    json!({
        "request_id": request_id, "account_id": "acme", "credential_id": credential_id,
        "units": units, "occurred_at": occurred_at, "dimensions": dimensions,
    })
}

#[tokio::test]
async fn bad_query_strings_are_typed_400s() {
    let app = App::new();
    app.funded("acme", 1).await;
    let usage = |query: &str| format!("/v1/accounts/acme/usage?{query}");
    let events = |query: &str| format!("/v1/accounts/acme/usage/events?{query}");
    let range = format!("from={FROM}&to={TO}");
    let cases = [
        (usage(""), "invalid_timestamp"),
        (usage(&format!("from={FROM}")), "invalid_timestamp"),
        (usage(&format!("from=yesterday&to={TO}")), "invalid_timestamp"),
        (usage(&format!("from=2024-01-01T00:00:00.0000000001Z&to={TO}")), "invalid_timestamp"),
        (usage(&format!("from={TO}&to={FROM}")), "invalid_range"),
        (usage(&format!("from={FROM}&to={FROM}")), "invalid_range"),
        (usage(&format!("{range}&window=PT1S")), "invalid_window"),
        (usage(&format!("{range}&window=p1d")), "invalid_window"),
        (usage(&format!("{range}&group_by=account")), "invalid_group_by"),
        (usage(&format!("{range}&group_by=dimension:Bad")), "invalid_group_by"),
        (usage(&format!("from={FROM}&to=2024-01-08T00:00:00Z&window=PT1M")), "too_many_buckets"),
        (usage(&format!("{range}&window=PT1M&window=PT1H")), "invalid_query"),
        (usage(&format!("{range}&limit=5")), "invalid_query"),
        (events(""), "invalid_timestamp"),
        (events(&format!("from={TO}&to={FROM}")), "invalid_range"),
        (events(&format!("{range}&limit=0")), "invalid_limit"),
        (events(&format!("{range}&limit=1001")), "invalid_limit"),
        (events(&format!("{range}&limit=ten")), "invalid_limit"),
        (events(&format!("{range}&cursor=c1.00")), "invalid_cursor"),
        (events(&format!("{range}&cursor=nonsense&format=ndjson")), "invalid_cursor"),
        (events(&format!("{range}&format=csv")), "invalid_query"),
        (events(&format!("{range}&window=PT1M")), "invalid_query"),
    ];
    for (path, code) in cases {
        let answer = app.call(As::Gateway, Method::GET, &path, None).await;
        assert_eq!(answer.0, StatusCode::BAD_REQUEST, "{path}: {}", answer.1);
        assert_error(answer, StatusCode::BAD_REQUEST, code, false);
    }
    for path in [usage(&range), events(&range), events(&format!("{range}&format=ndjson"))] {
        let ghost = path.replace("/acme/", "/ghost/");
        assert_error(
            app.call(As::Gateway, Method::GET, &ghost, None).await,
            StatusCode::NOT_FOUND,
            "account_not_found",
            false,
        );
        assert_error(
            app.call(As::Nobody, Method::GET, &path, None).await,
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            false,
        );
    }
}

#[tokio::test]
async fn a_report_lists_every_bucket_with_decimal_totals() {
    let app = App::new();
    let (credential, _) = app.funded("acme", 1).await;
    // Units up to the memory store's whole u64 domain, summed exactly.
    let big = u64::MAX / 2;
    ingest(
        &app,
        vec![
            event("r1", &credential, "2024-01-01T00:00:59.999999999Z", big, json!({"model": "m"})),
            event("r2", &credential, "2024-01-01T00:00:00Z", big, json!({})),
            event("r3", &credential, "2024-01-01T00:02:00Z", 1, json!({"model": "m"})),
        ],
    )
    .await;
    let path = format!("/v1/accounts/acme/usage?from={FROM}&to={TO}&window=PT1M&group_by=dimension:model");
    let body = app.ok(As::Admin, Method::GET, &path, None, StatusCode::OK).await;
    assert_eq!(
        body,
        json!({
            "from": FROM, "to": TO, "window": "PT1M", "group_by": "dimension:model",
            "buckets": [
                {"start": FROM, "end": "2024-01-01T00:01:00Z", "groups": [
                    {"key": null, "units": big.to_string(), "events": "1"},
                    {"key": "m", "units": big.to_string(), "events": "1"},
                ]},
                {"start": "2024-01-01T00:01:00Z", "end": "2024-01-01T00:02:00Z", "groups": []},
                {"start": "2024-01-01T00:02:00Z", "end": TO, "groups": [{"key": "m", "units": "1", "events": "1"}]},
            ],
            "total": {"units": u64::MAX.to_string(), "events": "3"},
        })
    );
    let whole = app
        .ok(As::Gateway, Method::GET, &format!("/v1/accounts/acme/usage?from={FROM}&to={TO}"), None, StatusCode::OK)
        .await;
    assert_eq!(whole["buckets"][0]["groups"], json!([{"key": null, "units": u64::MAX.to_string(), "events": "3"}]));
}

#[tokio::test]
async fn ndjson_streams_the_whole_range_across_pages() {
    let app = App::new();
    let (credential, _) = app.funded("acme", 1).await;
    // 2 500 events: three storage pages of at most 1 000.
    let events: Vec<Value> = (0..2_500)
        .map(|i| {
            let at = format!("2024-01-01T00:00:{:02}.{:09}Z", i % 60, i);
            event(&format!("r{i:05}"), &credential, &at, 1, json!({"n": i.to_string()}))
        })
        .collect();
    ingest(&app, events).await;
    let uri = format!("/v1/accounts/acme/usage/events?from={FROM}&to={TO}&format=ndjson");
    let request = Request::builder()
        .method(Method::GET)
        .uri(uri)
        .header("authorization", format!("Bearer {GATEWAY}"))
        .body(Body::empty())
        .unwrap();
    let response = app.router.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "application/x-ndjson");
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
    let text = std::str::from_utf8(&bytes).unwrap();
    assert!(text.ends_with('\n'));
    let lines: Vec<Value> = text.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    assert_eq!(lines.len(), 2_500);
    let keys: Vec<(String, String)> = lines
        .iter()
        .map(|l| (l["occurred_at"].as_str().unwrap().to_owned(), l["request_id"].as_str().unwrap().to_owned()))
        .collect();
    let mut sorted = keys.clone();
    sorted.sort_by_key(|(at, id)| (at.parse::<jiff::Timestamp>().unwrap(), id.clone()));
    sorted.dedup();
    assert_eq!(keys, sorted);
    assert_eq!(lines[0]["credential_id"], credential.as_str());
    assert!(lines.iter().all(|l| l["dimensions"]["n"].is_string() && l["lease_id"].is_null()));

    // The same events page by page as JSON.
    let mut seen = 0;
    let mut cursor: Option<String> = None;
    loop {
        let mut path = format!("/v1/accounts/acme/usage/events?from={FROM}&to={TO}&limit=1000");
        if let Some(cursor) = &cursor {
            path.push_str(&format!("&cursor={cursor}"));
        }
        let page = app.ok(As::Gateway, Method::GET, &path, None, StatusCode::OK).await;
        let items = page["items"].as_array().unwrap();
        for item in items {
            assert_eq!(item, &lines[seen]);
            seen += 1;
        }
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    assert_eq!(seen, 2_500);
}
