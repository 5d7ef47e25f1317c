//! Request bodies are JSON objects naming only known fields: anything else is
//! `400 invalid_request`, says what is wrong, and changes nothing.

use axum::http::{Method, StatusCode};
use serde_json::json;

use crate::support::{Api, App, As, assert_error};

#[tokio::test]
async fn bodies_that_are_not_objects_or_name_unknown_fields_are_refused() {
    let app = App::new();
    app.funded("a", 10).await;
    let cases: [(&str, &str, &str); 8] = [
        ("/v1/accounts", r#"["arr"]"#, "expected a JSON object"),
        ("/v1/accounts", r#""arr""#, "expected a JSON object"),
        ("/v1/accounts", r#"{"account_id":"b","owner":"x"}"#, "unknown field `owner`"),
        ("/v1/accounts/a/credits", r#"["c2",5]"#, "expected a JSON object"),
        ("/v1/accounts/a/credits", r#"{"credit_id":"c2","units":5,"note":"x"}"#, "unknown field `note`"),
        ("/v1/accounts/a/leases", r#"[5,"PT1S"]"#, "expected a JSON object"),
        ("/v1/accounts/a/leases/consolidate", r#"{"leases":[["l","k"]],"ttl":"PT1S"}"#, "expected a JSON object"),
        ("/v1/usage", r#"{"events":[["r","a","c",1,"2024-01-01T00:00:00Z"]]}"#, "expected a JSON object"),
    ];
    for (path, body, message) in cases {
        let response = app.call_raw(As::Admin, Method::POST, path, body.as_bytes().to_vec()).await;
        let text = response.1["error"]["message"].as_str().unwrap_or_default().to_owned();
        assert_error(response, StatusCode::BAD_REQUEST, "invalid_request", false);
        assert!(text.contains(message), "{path} {body}: {text}");
    }

    // Nothing was created or credited.
    for account_id in ["arr", "b"] {
        let (status, _) = app.call(As::Admin, Method::GET, &format!("/v1/accounts/{account_id}"), None).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{account_id}");
    }
    let account = app.ok(As::Admin, Method::GET, "/v1/accounts/a", None, StatusCode::OK).await;
    assert_eq!((account["credited"].clone(), account["reserved"].clone()), (json!(10), json!(0)));
}
