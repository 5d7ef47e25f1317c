//! How a request fails: [`ClientError`], with the server's stable code when
//! it answered, and [`ClientBuildError`] for a client that cannot be built.

use reqwest::StatusCode;
use tollgate_api::ErrorBody;

use super::MUTATION_ATTEMPTS_MAX;

/// Why a client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientBuildError {
    #[error("base URL {url:?} is not an http(s) URL: {reason}")]
    InvalidBaseUrl { url: String, reason: String },
    #[error("operator token is not a valid header value")]
    InvalidToken,
    #[error("mutation_attempts_max must be 1 to {MUTATION_ATTEMPTS_MAX} and mutation_backoff_initial at most 10 s")]
    InvalidMutationRetry,
    #[error("the HTTP client could not be built: {0}")]
    Http(#[from] reqwest::Error),
}

/// What kind of failure a [`ClientError`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientErrorKind {
    /// The server answered with an error body; `code` is its stable code.
    Api,
    /// No connection could be made (refused, unreachable, DNS).
    Connect,
    /// The request did not finish within `request_timeout`. The server may
    /// still have processed it.
    Timeout,
    /// The connection broke during the exchange. The server may have
    /// processed the request.
    Transport,
    /// The server answered something that is not the documented body.
    InvalidResponse,
}

/// A failed request. `code` is the server's stable code for API errors, and
/// one of `connect_failed`, `timeout`, `transport_failed` or
/// `invalid_response` otherwise.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}{}: {message}", status.map(|s| format!(" (HTTP {s})")).unwrap_or_default())]
pub struct ClientError {
    pub kind: ClientErrorKind,
    /// The HTTP status, when a response arrived.
    pub status: Option<u16>,
    pub code: String,
    pub message: String,
    /// Whether sending the same request again can succeed.
    pub retryable: bool,
}

impl ClientError {
    pub fn code(&self) -> &str {
        &self.code
    }

    pub fn retryable(&self) -> bool {
        self.retryable
    }

    pub fn status(&self) -> Option<u16> {
        self.status
    }

    pub(super) fn without_response(kind: ClientErrorKind, code: &str, message: String) -> Self {
        Self { kind, status: None, code: code.to_owned(), message, retryable: true }
    }

    pub(super) fn of_reqwest(error: &reqwest::Error) -> Self {
        let message = error_chain(error);
        if error.is_timeout() {
            Self::without_response(ClientErrorKind::Timeout, "timeout", message)
        } else if error.is_connect() {
            Self::without_response(ClientErrorKind::Connect, "connect_failed", message)
        } else if error.is_decode() {
            let status = error.status().map(|s| s.as_u16());
            Self {
                kind: ClientErrorKind::InvalidResponse,
                status,
                code: "invalid_response".into(),
                message,
                retryable: true,
            }
        } else {
            Self::without_response(ClientErrorKind::Transport, "transport_failed", message)
        }
    }

    /// An error response: the documented error body when there is one.
    pub(super) fn of_response(status: StatusCode, body: &[u8]) -> Self {
        match serde_json::from_slice::<ErrorBody>(body) {
            Ok(ErrorBody { error }) => Self {
                kind: ClientErrorKind::Api,
                status: Some(status.as_u16()),
                code: error.code,
                message: error.message,
                retryable: error.retryable,
            },
            // Not Tollgate's body: a proxy or load balancer answered. Its 5xx,
            // 408 and 429 are worth retrying; anything else will not change.
            Err(_) => Self {
                kind: ClientErrorKind::InvalidResponse,
                status: Some(status.as_u16()),
                code: "invalid_response".into(),
                message: format!("HTTP {status} without an error body: {}", snippet(body)),
                retryable: status.is_server_error()
                    || status == StatusCode::TOO_MANY_REQUESTS
                    || status == StatusCode::REQUEST_TIMEOUT,
            },
        }
    }
}

/// The first bytes of a body, for error messages.
pub(super) fn snippet(body: &[u8]) -> String {
    const SNIPPET_BYTES_MAX: usize = 200;
    let text = String::from_utf8_lossy(&body[..body.len().min(SNIPPET_BYTES_MAX)]);
    text.into_owned()
}

/// reqwest's `Display` names only the outermost error; the cause (connection
/// refused, reset by peer) is what an operator needs.
fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}
