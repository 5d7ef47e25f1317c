//! The parameters the routes share, each written once for the OpenAPI
//! document and, for the path parameters, for the handler that reads them.

use serde::Deserialize;

/// Declares each set of path parameters as one type that both documents them
/// (in the order given) and is what the handler's `ApiPath` reads.
macro_rules! path_params {
    ($($(#[doc = $doc:tt])* $name:ident { $($field:ident),+ })*) => {$(
        $(#[doc = $doc])*
        #[derive(Deserialize, utoipa::IntoParams)]
        #[into_params(parameter_in = Path)]
        pub(crate) struct $name {
            $(pub(crate) $field: String,)+
        }
    )*};
}

path_params! {
    /// `{account_id}`: the account a route acts on.
    AccountPath { account_id }
    /// `{account_id}/credentials/{credential_id}`: a credential is looked up
    /// under its account only.
    CredentialPath { account_id, credential_id }
    /// `{account_id}/leases/{lease_id}`: a lease is looked up under its
    /// account only.
    LeasePath { account_id, lease_id }
    /// `{account_id}/alert-rules/{rule_id}`.
    RulePath { account_id, rule_id }
    /// `{endpoint_id}`: a webhook endpoint.
    EndpointPath { endpoint_id }
    /// `{endpoint_id}/deliveries/{delivery_id}`.
    DeliveryPath { endpoint_id, delivery_id }
}

/// The `Idempotency-Key` header of the routes that apply a change, as the
/// OpenAPI document states it; the handlers read it through
/// [`IdempotencyHeader`](crate::extract::IdempotencyHeader).
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Header)]
#[expect(dead_code, reason = "documents the header; IdempotencyHeader reads it")]
pub(crate) struct IdempotencyKeyParams {
    /// 1 to 255 visible ASCII characters; a random UUIDv4 or better. A retry with the same key and request answers with the original status and body and applies nothing again
    #[param(rename = "Idempotency-Key", nullable = false)]
    idempotency_key: Option<String>,
}
