//! The one place where errors become HTTP statuses and bodies.
//!
//! Stores return `tollgate_core::Error` and `IngestError`; the server maps their
//! *kind* to a status here and nowhere else, so a new error code needs no new
//! mapping. Every error body is `{"error":{"code","message","retryable"}}`.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use tollgate_api::ErrorBody;
use tollgate_core::{Error, ErrorKind, IngestError};

/// Every way a request can fail.
#[derive(Debug)]
pub enum ApiError {
    /// A store refused or failed an operation.
    Store(Error),
    /// A usage batch failed as a whole.
    Ingest(IngestError),
    /// No bearer token, or one that matches no operator token.
    Unauthorized,
    /// A valid token whose role may not call this route.
    Forbidden,
    /// The body is not JSON.
    InvalidJson(String),
    /// The body is JSON but not the shape this route takes.
    InvalidRequest(String),
    /// A path segment could not be decoded.
    InvalidPath(String),
    /// The query string names a parameter twice, one the route does not
    /// take, or a value outside its set (a value's own rule, such as a
    /// timestamp's, has its own code).
    InvalidQuery(String),
    /// The body is larger than the server accepts.
    PayloadTooLarge { bytes_max: usize },
    /// The request did not finish within the per-request timeout.
    Timeout,
    /// No route has this path.
    NotFound { method: String, path: String },
    /// A route has this path but not this method.
    MethodNotAllowed,
    /// Storage does not answer or its schema is not current.
    NotReady(String),
    /// This server's clock is too far from its storage's to serve.
    ClockSkew(String),
}

impl From<Error> for ApiError {
    fn from(error: Error) -> Self {
        ApiError::Store(error)
    }
}

impl From<IngestError> for ApiError {
    fn from(error: IngestError) -> Self {
        ApiError::Ingest(error)
    }
}

/// The status of a store error, by kind.
pub fn status_of_kind(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::Input => StatusCode::BAD_REQUEST,
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::Conflict => StatusCode::CONFLICT,
        ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        ErrorKind::Corrupt => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The status of a failed usage batch.
pub fn status_of_ingest(error: &IngestError) -> StatusCode {
    match error {
        IngestError::BatchTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
        IngestError::Refused { .. } => StatusCode::UNPROCESSABLE_ENTITY,
        IngestError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        IngestError::Corrupt(_) => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::Store(error) => status_of_kind(error.kind()),
            ApiError::Ingest(error) => status_of_ingest(error),
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden => StatusCode::FORBIDDEN,
            ApiError::InvalidJson(_)
            | ApiError::InvalidRequest(_)
            | ApiError::InvalidPath(_)
            | ApiError::InvalidQuery(_) => StatusCode::BAD_REQUEST,
            ApiError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::Timeout | ApiError::NotReady(_) | ApiError::ClockSkew(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::NotFound { .. } => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
        }
    }

    pub fn body(&self) -> ErrorBody {
        match self {
            ApiError::Store(error) => ErrorBody::from(error),
            ApiError::Ingest(error) => ErrorBody::from(error),
            ApiError::Unauthorized => ErrorBody::new(
                "unauthorized",
                "missing or unknown bearer token (send Authorization: Bearer <operator token>)",
                false,
            ),
            ApiError::Forbidden => ErrorBody::new("forbidden", "this route needs the admin role", false),
            ApiError::InvalidJson(message) => {
                ErrorBody::new("invalid_json", format!("request body is not valid JSON: {message}"), false)
            }
            ApiError::InvalidRequest(message) => {
                ErrorBody::new("invalid_request", format!("request body has the wrong shape: {message}"), false)
            }
            ApiError::InvalidPath(message) => ErrorBody::new("invalid_path", message.clone(), false),
            ApiError::InvalidQuery(message) => ErrorBody::new("invalid_query", message.clone(), false),
            ApiError::PayloadTooLarge { bytes_max } => {
                ErrorBody::new("payload_too_large", format!("request body exceeds {bytes_max} bytes"), false)
            }
            ApiError::Timeout => ErrorBody::new(
                "timeout",
                "the request did not finish in time; its operation still runs to completion and may take \
                 effect: read the resource, or retry with the same idempotency key, credit_id or request_id",
                true,
            ),
            ApiError::NotFound { method, path } => {
                ErrorBody::new("not_found", format!("no route for {method} {path}"), false)
            }
            ApiError::MethodNotAllowed => {
                ErrorBody::new("method_not_allowed", "this route does not take that method", false)
            }
            ApiError::NotReady(message) => ErrorBody::new("not_ready", message.clone(), true),
            ApiError::ClockSkew(message) => ErrorBody::new("clock_skew", message.clone(), true),
        }
    }
}

/// What a 5xx answer said, attached to the response so that the request's
/// one log line (written by the router's `observe` layer, which knows the
/// request ID and route) can name it.
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    pub(crate) code: String,
    pub(crate) message: String,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let body = self.body();
        if status.is_server_error() {
            let failure = Failure { code: body.error.code.clone(), message: body.error.message.clone() };
            let mut response = (status, Json(body)).into_response();
            response.extensions_mut().insert(failure);
            return response;
        }
        (status, Json(body)).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_map_to_the_specified_statuses() {
        let cases = [
            (ErrorKind::Input, 400),
            (ErrorKind::NotFound, 404),
            (ErrorKind::Conflict, 409),
            (ErrorKind::Unavailable, 503),
            (ErrorKind::Corrupt, 500),
        ];
        for (kind, status) in cases {
            assert_eq!(status_of_kind(kind).as_u16(), status, "{kind:?}");
        }
        let ingest = [
            (IngestError::BatchTooLarge { events: 2, max: 1 }, 413),
            (IngestError::Refused { counter: "billed" }, 422),
            (IngestError::Unavailable("x".into()), 503),
            (IngestError::Corrupt("x".into()), 500),
        ];
        for (error, status) in ingest {
            assert_eq!(status_of_ingest(&error).as_u16(), status, "{error:?}");
        }
    }
}
