//! `write_route!`, which declares a route that changes something: its
//! `#[utoipa::path]` annotation and its handler, from one statement of what
//! the route takes and answers.

/// Declares a route that changes something: the route's `#[utoipa::path]`
/// annotation and its handler.
///
/// A route is written as its doc comment, then
///
/// - `handler: Auth, method "/path", tag "tag",` and, where the path or a
///   header takes parameters, `params(..)` as `#[utoipa::path]` writes it;
/// - each answer that is not an error, `answers STATUS => Body,
///   "description";` (`answers STATUS, "description";` without a body);
/// - its errors: `errors(Named, ..);` for the answers that several routes
///   document alike (`responses.rs`), then `STATUS "description";` for each
///   other error status, documented with the error body;
/// - its work, `|state, path Path { fields }, key idempotency, body body:
///   Request| { .. }`, which answers an `ApiResult`. `path`, `key` and `body`
///   are each there only when the route takes them: the fields are bound
///   from the path, `key` binds the `Idempotency-Key` header (an
///   `Option<Idempotency>`), and `body` binds the JSON request body, whose
///   type is also the documented request body.
///
/// The handler takes the auth extractor first, so a request without a valid
/// token is refused before its body is read, then the path, the header and
/// the body, in that order. Names in the statement resolve where the route is
/// declared.
macro_rules! write_route {
    (
        $(#[doc = $doc:tt])*
        $handler:ident: $auth:ident, $method:ident $path:literal, tag $tag:literal,
        $(params($($params:tt)*),)?
        $(answers $status:literal $(=> $answer:ty)?, $described:literal;)+
        $(errors($($named:ident),+);)?
        $($code:literal $error:literal;)*
        |$state:ident
            $(, path $path_params:ident { $($field:ident),+ })?
            $(, key $idempotency:ident)?
            $(, body $body:ident: $request:ty)?| $work:block
    ) => {
        $(#[doc = $doc])*
        #[utoipa::path(
            $method, path = $path, tag = $tag,
            $(params($($params)*),)?
            $(request_body = $request,)?
            responses(
                $((status = $status, description = $described $(, body = $answer)?),)+
                $($($named,)+)?
                $((status = $code, description = $error, body = ::tollgate_api::ErrorBody),)*
            ),
        )]
        pub(crate) async fn $handler(
            _: $auth,
            ::axum::extract::State($state): ::axum::extract::State<$crate::AppState>,
            $($crate::extract::ApiPath($path_params { $($field),+ }): $crate::extract::ApiPath<$path_params>,)?
            $($crate::extract::IdempotencyHeader($idempotency): $crate::extract::IdempotencyHeader,)?
            $($crate::extract::ApiJson($body): $crate::extract::ApiJson<$request>,)?
        ) -> $crate::routes::ApiResult $work
    };
}
pub(crate) use write_route;
