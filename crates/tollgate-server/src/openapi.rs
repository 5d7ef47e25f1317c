//! The OpenAPI document, generated from the routes the router serves (each
//! registered with its handler's annotation, `routes.rs`) and the wire types
//! of `tollgate-api`, so it cannot drift from what the server does.
//!
//! A copy is checked in at `docs/openapi.json`; a test fails when the served
//! document differs from it. Regenerate the copy with
//! `TOLLGATE_BLESS=1 cargo nextest run -p tollgate-server openapi`.

use std::sync::OnceLock;

use tollgate_core::ids::ID_CHARS_MAX;
use utoipa::openapi::content::ContentBuilder;
use utoipa::openapi::response::ResponseBuilder;
use utoipa::openapi::schema::Ref;
use utoipa::openapi::schema::{Schema, SchemaFormat, SchemaType, Type};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{KnownFormat, RefOr};
use utoipa::{Modify, Number, OpenApi};

use utoipa_axum::router::OpenApiRouter;

use crate::auth::Role;
use crate::{AppState, routes};

#[derive(OpenApi)]
#[openapi(info(
    title = "Tollgate",
    description = "Prepaid units for a fleet of gateway workers: accounts, leases with TTL and fencing tokens, usage ingestion and credentials.",
    license(name = "Apache-2.0", identifier = "Apache-2.0"),
))]
struct ApiDoc;

/// The router the routes are registered on: the document's title,
/// description and licence, and no routes yet.
pub(crate) fn base() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
}

/// `router`'s routes documented as needing `role`'s operator token.
pub(crate) fn secured(mut router: OpenApiRouter<AppState>, role: Role) -> OpenApiRouter<AppState> {
    Secured(role).modify(router.get_openapi_mut());
    router
}

/// The operation extension naming the least role that may call it: `admin`
/// (the admin token only) or `gateway` (the admin or gateway token).
pub const ROLE_EXTENSION: &str = "x-tollgate-role";

/// What every route behind an operator token shares: its role
/// ([`ROLE_EXTENSION`]), the `bearer` security requirement, 401 without a valid token, and 403 for a token whose role may
/// not call it (the gateway token on admin routes; the console's viewer token
/// on every route). Written here once instead of on each handler.
struct Secured(Role);

impl Modify for Secured {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        for item in openapi.paths.paths.values_mut() {
            let operations = [&mut item.get, &mut item.post, &mut item.put, &mut item.delete, &mut item.patch];
            for operation in operations.into_iter().flatten() {
                operation.security = Some(vec![SecurityRequirement::new("bearer", Vec::<String>::new())]);
                let role = if self.0 == Role::Admin { "admin" } else { "gateway" };
                operation
                    .extensions
                    .get_or_insert_with(Default::default)
                    .merge([(ROLE_EXTENSION, role)].into_iter().collect());
                let responses = &mut operation.responses.responses;
                responses.insert("401".to_owned(), RefOr::T(error_response("No or unknown token")));
                let forbidden = match self.0 {
                    Role::Admin => "Not the admin token",
                    Role::Gateway | Role::Viewer => "The viewer token, which serves the console only",
                };
                responses.insert("403".to_owned(), RefOr::T(error_response(forbidden)));
            }
        }
    }
}

/// Declares the `bearer` scheme the routes' `security` entries name.
struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        let mut http = Http::new(HttpAuthScheme::Bearer);
        http.description = Some(
            "An operator token: the admin token, or the gateway token where the route allows it. The viewer token \
                  signs in to the console only and is refused here with 403."
                .to_owned(),
        );
        components.add_security_scheme("bearer", SecurityScheme::Http(http));
    }
}

/// States in the document what the server enforces beyond the shape serde and
/// utoipa derive: the identifier rule, the unsigned 64-bit range of every
/// counter with each store's bound, which unit counts must be positive, and
/// the error statuses every `/v1` operation can answer.
/// Each rule is applied by name here, in one place, rather than repeated on
/// every field and path parameter.
struct Enforced;

/// Fields and path parameters that hold an identifier under `validate_id`
/// (`tollgate_core::ids`): 1 to 128 characters of `A-Z a-z 0-9 . _ : -`.
const ID_NAMES: [&str; 4] = ["account_id", "credit_id", "lease_id", "credential_id"];
const ID_PATTERN: &str = "^[A-Za-z0-9._:-]+$";

/// Unit counts the core refuses when zero (`invalid_units`): a credit and a
/// new lease's grant.
const POSITIVE_UNITS: [(&str, &str); 2] = [("CreditRequest", "units"), ("AcquireRequest", "units")];

/// Every counter on the wire is a `u64`. The memory store's domain is all of
/// it; PostgreSQL keeps counters in `bigint`, so its domain ends at
/// `i64::MAX` and it refuses larger units with `units_out_of_range`. One
/// document serves both stores, so it states the wider range with its
/// PostgreSQL bound: `format: uint64` tells client generators not to use a
/// signed 64-bit integer, which could not hold the memory store's answers.
const U64_DESCRIPTION: &str = "Unsigned 64-bit integer: 0 to 18446744073709551615 on the memory store; \
     0 to 9223372036854775807 on PostgreSQL, which refuses larger units with `units_out_of_range`.";

impl Modify for Enforced {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        if let Some(components) = openapi.components.as_mut() {
            for (name, schema) in components.schemas.iter_mut() {
                let RefOr::T(Schema::Object(object)) = schema else { continue };
                for (field, property) in object.properties.iter_mut() {
                    let RefOr::T(Schema::Object(property)) = property else { continue };
                    if is_u64(property) {
                        let positive = POSITIVE_UNITS.contains(&(name.as_str(), field.as_str()));
                        state_u64(property, if positive { 1 } else { 0 });
                    }
                    if ID_NAMES.contains(&field.as_str()) {
                        state_id(property);
                    }
                }
            }
        }
        for (path, item) in openapi.paths.paths.iter_mut() {
            let operations = [&mut item.get, &mut item.post, &mut item.put, &mut item.delete, &mut item.patch];
            for operation in operations.into_iter().flatten() {
                let has_body = operation.request_body.is_some();
                for (status, description) in COMMON_ERRORS {
                    let applies = path.starts_with("/v1/") && (has_body || status != "413");
                    if applies && !operation.responses.responses.contains_key(status) {
                        operation.responses.responses.insert(status.to_owned(), RefOr::T(error_response(description)));
                    }
                }
                for parameter in operation.parameters.iter_mut().flatten() {
                    let RefOr::T(parameter) = parameter else { continue };
                    if !ID_NAMES.contains(&parameter.name.as_str()) {
                        continue;
                    }
                    if let Some(RefOr::T(Schema::Object(schema))) = parameter.schema.as_mut() {
                        state_id(schema);
                    }
                }
            }
        }
    }
}

/// Errors any `/v1` operation can answer besides those its annotation names:
/// the router's request timeout, storage failures, and (with a body) the body
/// limit. Listing them makes the document's statuses complete, so a client
/// generated from it, and the schema fuzzer, can hold the server to them.
const COMMON_ERRORS: [(&str, &str); 3] = [
    ("413", "`payload_too_large`: the body exceeds the server's limit"),
    ("500", "`storage_corrupt`: stored data violates an invariant; retryable only after a repair"),
    ("503", "`timeout` or `storage_unavailable`: retryable"),
];

fn error_response(description: &str) -> utoipa::openapi::Response {
    let content = ContentBuilder::new().schema(Some(Ref::from_schema_name("ErrorBody"))).build();
    ResponseBuilder::new().description(description).content("application/json", content).build()
}

/// What utoipa derives for `u64` and `Option<u64>`.
fn is_u64(object: &utoipa::openapi::schema::Object) -> bool {
    let integer = match &object.schema_type {
        SchemaType::Type(kind) => *kind == Type::Integer,
        SchemaType::Array(kinds) => kinds.contains(&Type::Integer),
        SchemaType::AnyValue => false,
    };
    integer
        && object.format == Some(SchemaFormat::KnownFormat(KnownFormat::Int64))
        && matches!(object.minimum, Some(Number::Int(0) | Number::UInt(0) | Number::Float(0.0)))
}

fn state_u64(object: &mut utoipa::openapi::schema::Object, minimum: usize) {
    object.format = Some(SchemaFormat::Custom("uint64".to_owned()));
    object.minimum = Some(Number::UInt(minimum));
    object.maximum = Some(Number::UInt(usize::try_from(u64::MAX).expect("a 64-bit target")));
    object.description = Some(match object.description.take() {
        Some(own) => format!("{own} {U64_DESCRIPTION}"),
        None => U64_DESCRIPTION.to_owned(),
    });
}

fn state_id(object: &mut utoipa::openapi::schema::Object) {
    object.pattern = Some(ID_PATTERN.to_owned());
    object.min_length = Some(1);
    object.max_length = Some(ID_CHARS_MAX);
}

/// The document as pretty JSON with a trailing newline, built once from the
/// routes the router serves.
pub fn document() -> &'static str {
    static DOCUMENT: OnceLock<String> = OnceLock::new();
    DOCUMENT.get_or_init(|| {
        let mut openapi = routes::routes().into_openapi();
        BearerAuth.modify(&mut openapi);
        Enforced.modify(&mut openapi);
        let mut json = openapi.to_pretty_json().expect("the OpenAPI document serialises to JSON");
        json.push('\n');
        json
    })
}
