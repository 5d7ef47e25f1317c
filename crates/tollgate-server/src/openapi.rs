//! The OpenAPI document, generated from the handlers' annotations and the wire
//! types of `tollgate-api`, so it cannot drift from what the server does.
//!
//! A copy is checked in at `docs/openapi.json`; a test fails when the served
//! document differs from it. Regenerate the copy with
//! `TOLLGATE_BLESS=1 cargo nextest run -p tollgate-server openapi`.

use std::sync::OnceLock;

use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::routes;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Tollgate",
        description = "Prepaid units for a fleet of gateway workers: accounts, leases with TTL and fencing tokens, usage ingestion and credentials.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    paths(
        routes::create_account,
        routes::get_account,
        routes::credit,
        routes::issue_credential,
        routes::get_credential,
        routes::revoke_credential,
        routes::verify_credential,
        routes::acquire,
        routes::get_lease,
        routes::release,
        routes::consolidate,
        routes::ingest,
        routes::reclaim,
        routes::check,
        routes::healthz,
        routes::readyz,
        routes::metrics,
        routes::openapi_json,
    ),
    modifiers(&BearerAuth),
)]
struct ApiDoc;

/// Declares the `bearer` scheme the routes' `security` entries name.
struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        let mut http = Http::new(HttpAuthScheme::Bearer);
        http.description =
            Some("An operator token: the admin token, or the gateway token where the route allows it.".to_owned());
        components.add_security_scheme("bearer", SecurityScheme::Http(http));
    }
}

/// The document as pretty JSON with a trailing newline, built once.
pub fn document() -> &'static str {
    static DOCUMENT: OnceLock<String> = OnceLock::new();
    DOCUMENT.get_or_init(|| {
        let mut json = ApiDoc::openapi().to_pretty_json().expect("the OpenAPI document serialises to JSON");
        json.push('\n');
        json
    })
}
