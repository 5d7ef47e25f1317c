//! Body and path extractors whose rejections are the stable JSON error body,
//! never axum's plain-text defaults.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;
use tollgate_store::{Idempotency, IdempotencyKey};

use crate::AppState;
use crate::error::ApiError;

/// A JSON request body. Any content type is read as JSON, so that a plain
/// `curl -d` works; the body size limit applies as configured.
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(request, state).await.map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::PayloadTooLarge { bytes_max: state.limits().body_bytes_max }
            } else {
                ApiError::InvalidRequest(rejection.body_text())
            }
        })?;
        serde_json::from_slice(&bytes).map(ApiJson).map_err(|error| {
            if error.is_data() {
                ApiError::InvalidRequest(error.to_string())
            } else {
                ApiError::InvalidJson(error.to_string())
            }
        })
    }
}

/// A path parameter.
pub struct ApiPath<T>(pub T);

impl<T: DeserializeOwned + Send> FromRequestParts<AppState> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        Path::<T>::from_request_parts(parts, state)
            .await
            .map(|Path(value)| ApiPath(value))
            .map_err(|rejection| ApiError::InvalidPath(rejection.body_text()))
    }
}

/// The header a client names a retryable request with.
pub const IDEMPOTENCY_KEY_HEADER: &str = "Idempotency-Key";

/// The optional `Idempotency-Key` header of a mutating request, with the
/// server's retention. A header that is not 1 to 255 visible ASCII characters
/// is refused with 400 `invalid_idempotency_key`.
pub struct IdempotencyHeader(pub Option<Idempotency>);

impl FromRequestParts<AppState> for IdempotencyHeader {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let Some(value) = parts.headers.get(IDEMPOTENCY_KEY_HEADER) else {
            return Ok(IdempotencyHeader(None));
        };
        let value = value.to_str().map_err(|_| tollgate_core::Error::InvalidIdempotencyKey)?;
        let key = IdempotencyKey::parse(value)?;
        Ok(IdempotencyHeader(Some(Idempotency { key, retention: state.limits().idempotency_retention })))
    }
}
