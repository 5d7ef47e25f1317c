//! The checked-in `docs/openapi.json` must be exactly what the server serves.
//! Regenerate it with `TOLLGATE_BLESS=1 cargo nextest run -p tollgate-server openapi`.

use std::path::PathBuf;

use crate::support::{App, As};
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

    // Every route of SPEC §4 is in the document, with its method.
    let paths = &served["paths"];
    for (path, method) in [
        ("/v1/accounts", "post"),
        ("/v1/accounts/{account_id}", "get"),
        ("/v1/accounts/{account_id}/credits", "post"),
        ("/v1/accounts/{account_id}/credentials", "post"),
        ("/v1/credentials/{credential_id}", "get"),
        ("/v1/credentials/{credential_id}/revoke", "post"),
        ("/v1/credentials/verify", "post"),
        ("/v1/accounts/{account_id}/leases", "post"),
        ("/v1/leases/{lease_id}", "get"),
        ("/v1/leases/{lease_id}/release", "post"),
        ("/v1/accounts/{account_id}/leases/consolidate", "post"),
        ("/v1/usage", "post"),
        ("/v1/admin/reclaim", "post"),
        ("/v1/admin/check", "get"),
        ("/healthz", "get"),
        ("/readyz", "get"),
        ("/metrics", "get"),
        ("/openapi.json", "get"),
    ] {
        assert!(paths[path][method].is_object(), "{method} {path} missing from the OpenAPI document");
    }
}
