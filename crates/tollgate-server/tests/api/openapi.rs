//! The checked-in `docs/openapi.json` must be exactly what the server serves.
//! Regenerate it with `TOLLGATE_BLESS=1 cargo nextest run -p tollgate-server openapi`.

use std::path::PathBuf;

use crate::handlers::concrete_path;
use crate::support::{Api, App, As};
use axum::http::{Method, StatusCode};

fn checked_in_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/openapi.json")
}

#[tokio::test]
async fn served_openapi_matches_the_checked_in_document() {
    let app = App::new();
    let (status, served) = app.call(As::Nobody, Method::GET, "/openapi.json", None).await;
    assert_eq!(status, StatusCode::OK);
    let served_text = tollgate_server::openapi::document();
    assert_eq!(serde_json::from_str::<serde_json::Value>(served_text).unwrap(), served);

    let path = checked_in_path();
    if std::env::var_os("TOLLGATE_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(&path, served_text).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == served_text,
        "{} differs from the served OpenAPI document. If the API change is intended, regenerate it with\n  \
         TOLLGATE_BLESS=1 cargo nextest run -p tollgate-server openapi\nand review the diff.",
        path.display()
    );

    // The router serves every documented operation: none answers the
    // router's own 404 `not_found` or 405 `method_not_allowed`.
    let mut operations = 0;
    for (template, item) in served["paths"].as_object().unwrap() {
        let path = concrete_path(template);
        for method in item.as_object().unwrap().keys() {
            let method = Method::from_bytes(method.to_ascii_uppercase().as_bytes()).unwrap();
            let (status, body) = app.call(As::Admin, method.clone(), &path, None).await;
            let code = &body["error"]["code"];
            assert!(code != "not_found" && code != "method_not_allowed", "{method} {template}: {status} {body}");
            operations += 1;
        }
    }
    assert_eq!(operations, 34, "the document lists every route the router serves");
}

/// The document states what the server enforces: objects with no unknown
/// fields, the identifier rule, positive units where zero is refused, the
/// unsigned 64-bit range of counters, and the bounds on lists.
#[tokio::test]
async fn the_document_states_the_enforced_rules() {
    let document: serde_json::Value = serde_json::from_str(tollgate_server::openapi::document()).unwrap();
    let schemas = &document["components"]["schemas"];
    for request in [
        "CreateAccountRequest",
        "CreditRequest",
        "CreateCredentialRequest",
        "VerifyRequest",
        "AcquireRequest",
        "ReleaseRequest",
        "LeaseHandleBody",
        "ConsolidateRequest",
        "UsageEventBody",
        "IngestRequest",
    ] {
        assert_eq!(schemas[request]["type"], "object", "{request}");
        assert_eq!(schemas[request]["additionalProperties"], false, "{request}");
    }
    let id = serde_json::json!({"type": "string", "pattern": "^[A-Za-z0-9._:-]+$", "minLength": 1, "maxLength": 128});
    assert_eq!(schemas["CreditRequest"]["properties"]["credit_id"], id);
    assert_eq!(schemas["CreateAccountRequest"]["properties"]["account_id"], id);
    let parameters = &document["paths"]["/v1/accounts/{account_id}/leases/{lease_id}/release"]["post"]["parameters"];
    for (i, name) in ["account_id", "lease_id"].into_iter().enumerate() {
        assert_eq!((&parameters[i]["name"], &parameters[i]["schema"]), (&serde_json::json!(name), &id));
    }

    let units = |schema: &str, field: &str| {
        let property = &schemas[schema]["properties"][field];
        assert_eq!(property["type"], "integer", "{schema}.{field}");
        assert_eq!(property["format"], "uint64", "{schema}.{field}");
        assert_eq!(property["maximum"].as_u64(), Some(u64::MAX), "{schema}.{field}");
        assert!(property["description"].as_str().unwrap().contains("9223372036854775807 on PostgreSQL"));
        property["minimum"].as_u64().unwrap()
    };
    assert_eq!(units("CreditRequest", "units"), 1);
    assert_eq!(units("AcquireRequest", "units"), 1);
    assert_eq!(units("ConsolidateRequest", "extra_units"), 0);
    assert_eq!(units("UsageEventBody", "units"), 0);
    assert_eq!(units("AccountBody", "credited"), 0);
    assert_eq!(units("LeaseBody", "fencing_token"), 0);
    assert_eq!(schemas["ConsolidateRequest"]["properties"]["leases"]["minItems"], 1);
    assert_eq!(schemas["IngestRequest"]["properties"]["events"]["maxItems"], tollgate_core::BATCH_EVENTS_MAX);
    assert_eq!(schemas["CreateCredentialRequest"]["properties"]["label"]["maxLength"], 256);
    for request in ["AcquireRequest", "ConsolidateRequest"] {
        let pattern = schemas[request]["properties"]["ttl"]["pattern"].as_str().unwrap();
        assert!(pattern.starts_with("^PT") && pattern.ends_with(")$"), "{request}: {pattern}");
    }

    // Every /v1 operation lists the statuses any request can meet.
    for (path, item) in document["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            let responses = &operation["responses"];
            let mut expected = vec![];
            if path.starts_with("/v1/") {
                expected.extend(["401", "500", "503"]);
            }
            if operation["requestBody"].is_object() {
                expected.extend(["400", "413"]);
            }
            for status in expected {
                assert!(responses[status].is_object(), "{method} {path} does not list {status}");
            }
        }
    }
}
