//! `GET /v1/accounts/{account_id}/journal`: the entries of the operations the
//! routes ran, at the server's clock, in pages; bad `after` and `limit` are
//! typed 400s, an unknown account a 404, and either operator token reads it.

use axum::http::{Method, StatusCode};
use serde_json::json;

use crate::support::{Api, App, As, assert_error, start};

#[tokio::test]
async fn the_journal_lists_each_change_in_pages_at_the_servers_time() {
    let app = App::new();
    app.funded("acct", 100).await;
    let lease = app.acquire("acct", 10, "PT30S").await;
    let id = lease["lease_id"].as_str().unwrap();

    let page = app.ok(As::Gateway, Method::GET, "/v1/accounts/acct/journal", None, StatusCode::OK).await;
    let at = serde_json::to_value(start()).unwrap();
    assert_eq!(
        page,
        json!({
            "items": [
                {"seq": 1, "kind": "credit", "credit_id": "c1", "lease_id": null, "leases": [], "events": null,
                 "deltas": {"credited": 100, "available": 100, "reserved": 0, "consumed": 0, "overage": 0,
                            "billed": 0, "next_fence": 0},
                 "at": at},
                {"seq": 2, "kind": "acquire", "credit_id": null, "lease_id": id, "leases": [], "events": null,
                 "deltas": {"credited": 0, "available": -10, "reserved": 10, "consumed": 0, "overage": 0,
                            "billed": 0, "next_fence": 1},
                 "at": at},
            ],
            "next_after": null,
        })
    );
    let first = app.ok(As::Admin, Method::GET, "/v1/accounts/acct/journal?limit=1", None, StatusCode::OK).await;
    assert_eq!((first["items"][0]["seq"].clone(), first["next_after"].clone()), (json!(1), json!(1)));
    let rest =
        app.ok(As::Gateway, Method::GET, "/v1/accounts/acct/journal?after=1&limit=1", None, StatusCode::OK).await;
    assert_eq!((rest["items"][0]["seq"].clone(), rest["next_after"].clone()), (json!(2), json!(null)));
    let past = app.ok(As::Gateway, Method::GET, "/v1/accounts/acct/journal?after=2", None, StatusCode::OK).await;
    assert_eq!(past, json!({"items": [], "next_after": null}));
}

#[tokio::test]
async fn bad_parameters_are_typed_and_an_unknown_account_is_not_found() {
    let app = App::new();
    app.funded("acct", 100).await;
    for query in ["limit=0", "limit=1001", "limit=many", "limit=-1", "limit=99999999999"] {
        let answer = app.call(As::Gateway, Method::GET, &format!("/v1/accounts/acct/journal?{query}"), None).await;
        assert_error(answer, StatusCode::BAD_REQUEST, "invalid_limit", false);
    }
    for query in ["after=-1", "after=x", "after=18446744073709551616"] {
        let answer = app.call(As::Gateway, Method::GET, &format!("/v1/accounts/acct/journal?{query}"), None).await;
        assert_error(answer, StatusCode::BAD_REQUEST, "invalid_after", false);
    }
    // One rule for every route's query string: a parameter the route does
    // not take, or one given twice, is refused; one given empty is absent.
    for query in ["cursor=x", "after=1&after=2"] {
        let answer = app.call(As::Gateway, Method::GET, &format!("/v1/accounts/acct/journal?{query}"), None).await;
        assert_error(answer, StatusCode::BAD_REQUEST, "invalid_query", false);
    }
    app.ok(As::Gateway, Method::GET, "/v1/accounts/acct/journal?after=", None, StatusCode::OK).await;
    let unknown = app.call(As::Gateway, Method::GET, "/v1/accounts/nobody/journal", None).await;
    assert_error(unknown, StatusCode::NOT_FOUND, "account_not_found", false);
    let anonymous = app.call(As::Nobody, Method::GET, "/v1/accounts/acct/journal", None).await;
    assert_eq!(anonymous.0, StatusCode::UNAUTHORIZED);
}
