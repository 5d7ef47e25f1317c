//! The reads of one resource by its path (an account, a credential, a
//! lease), and `read_route!`, which declares a route that reads what its
//! path names and answers `200` with it.

use tollgate_api::{AccountBody, CredentialBody, LeaseBody};

use super::params::{AccountPath, CredentialPath, LeasePath};
use super::responses::{AccountNotFound, CredentialNotFound, LeaseNotFound};
use crate::auth::{AdminAuth, GatewayAuth};

/// Declares a `GET` route that reads what its path names and answers `200`
/// with it: the route's `#[utoipa::path]` annotation and its handler, which
/// takes the auth extractor first, then the path and, on a route that takes
/// a query, the query parameters.
///
/// A route is written as its doc comment, then `handler: Auth, "/path", tag
/// "tag",`, its `params(..)` and `responses(..)` as `#[utoipa::path]` writes
/// them (the names in them resolve where the route is declared), and its
/// read, `|state, Path { fields }, query: ["name", ..]| body`: the fields are
/// bound from the path, `query` (only on a route that takes one) holds the
/// named query parameters (any other, or one given twice, is
/// `invalid_query`), and `body` is the JSON body of the `200`. A read written
/// `|..| -> ApiResult { .. }` gives the whole answer instead.
///
/// The paged listing of a path's collection is shorter: `Path { fields },
/// NotFound, "description" => PageBody<ItemBody>, store_method`. It takes
/// only the paging parameters (`PageParams`, refused as `PageRefused`, both
/// resolved where the route is declared too) and answers the page the store
/// method reads for the path's fields.
macro_rules! read_route {
    (
        $(#[doc = $doc:tt])*
        $handler:ident: $auth:ident, $path:literal, tag $tag:literal,
        $path_params:ident { $($field:ident),+ }, $not_found:ident,
        $described:literal => PageBody<$body:ident>, $list:ident
    ) => {
        read_route! {
            $(#[doc = $doc])*
            $handler: $auth, $path, tag $tag,
            params($path_params, PageParams),
            responses((status = 200, description = $described, body = PageBody<$body>), PageRefused, $not_found),
            |state, $path_params { $($field),+ }, query: ["cursor", "limit"]| {
                let page = query.page()?;
                PageBody::<$body>::of(&state.store().$list($(&$field,)+ &page).await?)
            }
        }
    };
    (
        $(#[doc = $doc:tt])*
        $handler:ident: $auth:ident, $path:literal, tag $tag:literal,
        params($($params:tt)*),
        responses($($responses:tt)*),
        |$state:ident, $path_params:ident { $($field:ident),+ } $(, $query:ident: [$($name:literal),+])?|
            -> ApiResult $answer:block
    ) => {
        $(#[doc = $doc])*
        #[utoipa::path(get, path = $path, tag = $tag, params($($params)*), responses($($responses)*))]
        pub(crate) async fn $handler(
            _: $auth,
            ::axum::extract::State($state): ::axum::extract::State<$crate::AppState>,
            $crate::extract::ApiPath($path_params { $($field),+ }): $crate::extract::ApiPath<$path_params>,
            $($query: $crate::extract::QueryParams,)?
        ) -> $crate::routes::ApiResult {
            $(let $query = $query.only(&[$($name),+])?;)?
            $answer
        }
    };
    (
        $(#[doc = $doc:tt])*
        $handler:ident: $auth:ident, $path:literal, tag $tag:literal,
        params($($params:tt)*),
        responses($($responses:tt)*),
        |$state:ident, $path_params:ident { $($field:ident),+ } $(, $query:ident: [$($name:literal),+])?| $read:expr
    ) => {
        read_route! {
            $(#[doc = $doc])*
            $handler: $auth, $path, tag $tag,
            params($($params)*),
            responses($($responses)*),
            |$state, $path_params { $($field),+ } $(, $query: [$($name),+])?| -> ApiResult {
                let body = $read;
                $crate::routes::json(::axum::http::StatusCode::OK, body)
            }
        }
    };
}
pub(crate) use read_route;

read_route! {
    /// An account with all its counters.
    get_account: GatewayAuth, "/v1/accounts/{account_id}", tag "accounts",
    params(AccountPath),
    responses((status = 200, description = "The account", body = AccountBody), AccountNotFound),
    |state, AccountPath { account_id }| AccountBody::from(&state.store().account(&account_id).await?)
}

read_route! {
    /// A credential of the account and its activity, without its key. A
    /// credential of another account is `credential_not_found`.
    get_credential: AdminAuth, "/v1/accounts/{account_id}/credentials/{credential_id}", tag "credentials",
    params(CredentialPath),
    responses((status = 200, description = "The credential", body = CredentialBody), CredentialNotFound),
    |state, CredentialPath { account_id, credential_id }| {
        CredentialBody::from(&state.store().credential(&account_id, &credential_id).await?)
    }
}

read_route! {
    /// A lease of the account, without its capability. A lease of another account
    /// is `lease_not_found`.
    get_lease: GatewayAuth, "/v1/accounts/{account_id}/leases/{lease_id}", tag "leases",
    params(LeasePath),
    responses((status = 200, description = "The lease", body = LeaseBody), LeaseNotFound),
    |state, LeasePath { account_id, lease_id }| LeaseBody::from(&state.store().lease(&account_id, &lease_id).await?)
}
