//! The listings over HTTP: the `{"items", "next_cursor"}` shape, paging by
//! the cursor, the roles, and a typed JSON 400 for every bad parameter,
//! never a 500 nor a plain-text rejection.

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::{Api, App, As, assert_error};

/// Every item of a listing, page by page at `limit`, as the values of `field`.
async fn walk(app: &App, who: As, path: &str, limit: u32, field: &str) -> Vec<Vec<String>> {
    let separator = if path.contains('?') { '&' } else { '?' };
    let mut pages = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut uri = format!("{path}{separator}limit={limit}");
        if let Some(cursor) = &cursor {
            uri.push_str(&format!("&cursor={cursor}"));
        }
        let page = app.ok(who, Method::GET, &uri, None, StatusCode::OK).await;
        let items = page["items"].as_array().unwrap();
        pages.push(items.iter().map(|item| item[field].as_str().unwrap().to_owned()).collect());
        match &page["next_cursor"] {
            Value::Null => return pages,
            Value::String(next) => cursor = Some(next.clone()),
            other => panic!("next_cursor is {other}"),
        }
    }
}

async fn acquire(app: &App, account_id: &str) -> Value {
    let path = format!("/v1/accounts/{account_id}/leases");
    app.ok(As::Gateway, Method::POST, &path, Some(json!({"units": 1, "ttl": "PT30S"})), StatusCode::CREATED).await
}

#[tokio::test]
async fn every_listing_pages_by_cursor_in_key_order() {
    let app = App::new();
    for account_id in ["acct-b", "acct-a", "other"] {
        app.funded(account_id, 100).await;
    }
    let accounts = walk(&app, As::Admin, "/v1/accounts", 2, "account_id").await;
    assert_eq!(accounts, vec![vec!["acct-a", "acct-b"], vec!["other"]]);
    let prefixed = walk(&app, As::Admin, "/v1/accounts?prefix=acct-", 1, "account_id").await;
    assert_eq!(prefixed, vec![vec!["acct-a"], vec!["acct-b"]]);
    let page = app.ok(As::Admin, Method::GET, "/v1/accounts", None, StatusCode::OK).await;
    let account = app.ok(As::Gateway, Method::GET, "/v1/accounts/acct-a", None, StatusCode::OK).await;
    assert_eq!(page["items"][0], account);
    assert_eq!(page["next_cursor"], Value::Null);

    let mut lease_ids = Vec::new();
    for _ in 0..3 {
        lease_ids.push(acquire(&app, "acct-a").await["lease_id"].as_str().unwrap().to_owned());
    }
    lease_ids.sort();
    let leases = walk(&app, As::Gateway, "/v1/accounts/acct-a/leases", 2, "lease_id").await;
    assert_eq!(leases.concat(), lease_ids);
    assert_eq!(leases.len(), 2);
    let active = walk(&app, As::Admin, "/v1/accounts/acct-a/leases?state=active", 10, "lease_id").await;
    assert_eq!(active.concat(), lease_ids);
    let released = walk(&app, As::Gateway, "/v1/accounts/acct-a/leases?state=released", 10, "lease_id").await;
    assert_eq!(released, vec![Vec::<String>::new()]);
    let page = app.ok(As::Gateway, Method::GET, "/v1/accounts/acct-a/leases", None, StatusCode::OK).await;
    let lease = format!("/v1/accounts/acct-a/leases/{}", lease_ids[0]);
    assert_eq!(page["items"][0], app.ok(As::Gateway, Method::GET, &lease, None, StatusCode::OK).await);
    assert!(page["items"][0].get("capability").is_none());

    let credentials = walk(&app, As::Admin, "/v1/accounts/acct-a/credentials", 1, "credential_id").await;
    assert_eq!(credentials.concat().len(), 1);
    let credits = app.ok(As::Admin, Method::GET, "/v1/accounts/acct-a/credits", None, StatusCode::OK).await;
    assert_eq!(credits, json!({"items": [{"credit_id": "c1", "units": 100}], "next_cursor": null}));
}

#[tokio::test]
async fn bad_parameters_are_typed_json_400s() {
    let app = App::new();
    app.funded("acct-a", 100).await;
    app.funded("acct-b", 100).await;
    acquire(&app, "acct-a").await;
    acquire(&app, "acct-a").await;
    let page = app.ok(As::Gateway, Method::GET, "/v1/accounts/acct-a/leases?limit=1", None, StatusCode::OK).await;
    let cursor = page["next_cursor"].as_str().unwrap().to_owned();

    let cases = [
        ("/v1/accounts?limit=0", "invalid_limit"),
        ("/v1/accounts?limit=1001", "invalid_limit"),
        ("/v1/accounts?limit=abc", "invalid_limit"),
        ("/v1/accounts?limit=-1", "invalid_limit"),
        ("/v1/accounts?limit=99999999999999999999", "invalid_limit"),
        ("/v1/accounts?cursor=garbage", "invalid_cursor"),
        ("/v1/accounts/acct-a/credits?limit=1.5", "invalid_limit"),
        ("/v1/accounts/acct-a/credentials?cursor=%00", "invalid_cursor"),
        ("/v1/accounts/acct-a/leases?state=expired", "invalid_state"),
        ("/v1/accounts/acct-a/leases?state=ACTIVE", "invalid_state"),
    ];
    for (path, code) in cases {
        assert_error(app.call(As::Admin, Method::GET, path, None).await, StatusCode::BAD_REQUEST, code, false);
    }
    for other in [
        format!("/v1/accounts/acct-b/leases?cursor={cursor}"),
        format!("/v1/accounts/acct-a/leases?state=active&cursor={cursor}"),
        format!("/v1/accounts/acct-a/credits?cursor={cursor}"),
        format!("/v1/accounts?cursor={cursor}"),
    ] {
        let refused = app.call(As::Admin, Method::GET, &other, None).await;
        assert_error(refused, StatusCode::BAD_REQUEST, "invalid_cursor", false);
    }
    let resumed = format!("/v1/accounts/acct-a/leases?cursor={cursor}&limit=1");
    let next = app.ok(As::Gateway, Method::GET, &resumed, None, StatusCode::OK).await;
    assert_eq!((next["items"].as_array().unwrap().len(), &next["next_cursor"]), (1, &Value::Null));
    for listing in ["leases", "credentials", "credits"] {
        let unknown = app.call(As::Admin, Method::GET, &format!("/v1/accounts/ghost/{listing}"), None).await;
        assert_error(unknown, StatusCode::NOT_FOUND, "account_not_found", false);
    }
}

#[tokio::test]
async fn listings_need_their_role() {
    let app = App::new();
    app.funded("acct-a", 100).await;
    for path in ["/v1/accounts", "/v1/accounts/acct-a/credentials", "/v1/accounts/acct-a/credits"] {
        assert_error(app.call(As::Gateway, Method::GET, path, None).await, StatusCode::FORBIDDEN, "forbidden", false);
    }
    for path in ["/v1/accounts", "/v1/accounts/acct-a/leases"] {
        let refused = app.call(As::Nobody, Method::GET, path, None).await;
        assert_error(refused, StatusCode::UNAUTHORIZED, "unauthorized", false);
    }
}
