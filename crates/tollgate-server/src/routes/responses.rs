//! The error answers that several routes document with the same words,
//! each written once. An answer whose description names route-specific
//! codes stays in its route's annotation.

use tollgate_api::ErrorBody;

/// Declares each answer as a type that documents one error status and its
/// description with the error body; `ApiError` writes the answer itself.
macro_rules! error_answers {
    ($($name:ident = $status:literal, $description:literal;)*) => {$(
        #[derive(utoipa::IntoResponses)]
        #[response(status = $status, description = $description)]
        #[expect(dead_code, reason = "documents the answer; ApiError writes it")]
        pub(crate) struct $name(ErrorBody);
    )*};
}

error_answers! {
    AccountNotFound = 404, "`account_not_found`";
    CredentialNotFound = 404, "`credential_not_found`";
    LeaseNotFound = 404, "`lease_not_found`";
    EndpointNotFound = 404, "`endpoint_not_found`";
    IdempotencyKeyReused = 409, "`idempotency_key_reused`";
    BadBody = 400, "Bad body";
    PageRefused = 400, "`invalid_limit`, `invalid_cursor` or `invalid_query`";
    StorageUnavailable = 503, "`storage_unavailable`";
}
