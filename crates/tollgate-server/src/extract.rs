//! Body, path and query extractors whose rejections are the stable JSON error
//! body, never axum's plain-text defaults.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;
use tollgate_core::{Error, PageLimit, PageRequest};
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

/// The query string of a route that takes query parameters, percent-decoded,
/// read here rather than by axum's `Query`, whose rejection is plain text.
/// One rule for every route: [`QueryParams::only`] refuses a parameter the
/// route does not take and one given twice (`400 invalid_query`); a
/// parameter given empty counts as absent; each value is then checked by the
/// core's parser for it, which answers its own typed code.
pub(crate) struct QueryParams(Vec<(String, String)>);

impl<S: Send + Sync> FromRequestParts<S> for QueryParams {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(Self::parse(parts.uri.query().unwrap_or_default()))
    }
}

impl QueryParams {
    /// The parameters of a raw query string (without its `?`).
    pub(crate) fn parse(query: &str) -> Self {
        Self(form_urlencoded::parse(query.as_bytes()).into_owned().collect())
    }

    /// These parameters, if the query names no other and none twice.
    pub(crate) fn only(self, names: &[&str]) -> Result<Self, ApiError> {
        for (at, (name, _)) in self.0.iter().enumerate() {
            if !names.contains(&name.as_str()) {
                return Err(ApiError::InvalidQuery(format!(
                    "unknown query parameter {name:?}; this route takes {names:?}"
                )));
            }
            if self.0[..at].iter().any(|(earlier, _)| earlier == name) {
                return Err(ApiError::InvalidQuery(format!("query parameter {name} is given twice")));
            }
        }
        Ok(self)
    }

    /// The parameter `name`, `None` when absent or empty.
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.0.iter().find(|(known, _)| known == name).map(|(_, value)| value.as_str()).filter(|v| !v.is_empty())
    }

    /// `limit`: absent is the default; anything but an integer from 1 to the
    /// maximum is `invalid_limit` (a value that is no number at all is
    /// reported as 0, one beyond `u32` as `u32::MAX`).
    pub(crate) fn limit(&self) -> Result<PageLimit, Error> {
        let requested = self.get("limit").map(|text| match digits(text) {
            Some(digits) => digits.parse::<u32>().unwrap_or(u32::MAX),
            None => 0,
        });
        PageLimit::new(requested)
    }

    /// A listing's `cursor` and `limit`.
    pub(crate) fn page(&self) -> Result<PageRequest, Error> {
        Ok(PageRequest { cursor: self.get("cursor").map(str::to_owned), limit: self.limit()? })
    }

    /// The journal's `after`: 0 when absent, else decimal digits of a `u64`
    /// (`invalid_after`).
    pub(crate) fn after(&self) -> Result<u64, Error> {
        match self.get("after") {
            None => Ok(0),
            Some(text) => digits(text).and_then(|digits| digits.parse().ok()).ok_or(Error::InvalidAfter),
        }
    }
}

/// `text` if it is one or more ASCII digits and nothing else.
fn digits(text: &str) -> Option<&str> {
    (!text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())).then_some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(query: &str) -> QueryParams {
        QueryParams::parse(query)
    }

    #[test]
    fn unknown_and_repeated_parameters_are_invalid_queries() {
        assert!(params("a=1&b=2").only(&["a", "b"]).is_ok());
        assert!(params("").only(&[]).is_ok());
        for bad in ["c=1", "a=1&a=2", "a=1&b=2&a=", "limit"] {
            assert!(matches!(params(bad).only(&["a", "b"]), Err(ApiError::InvalidQuery(_))), "{bad}");
        }
        assert_eq!(params("a=x%20y&b=").get("a"), Some("x y"));
        assert_eq!(params("a=x%20y&b=").get("b"), None, "empty is absent");
    }

    #[test]
    fn after_and_limit_take_their_numbers_only() {
        let max = PageLimit::MAX;
        assert_eq!(params("").after(), Ok(0));
        assert_eq!(params("after=7").after(), Ok(7));
        assert_eq!(params("after=18446744073709551615").after(), Ok(u64::MAX));
        for bad in ["after=-1", "after=1.5", "after=abc", "after=18446744073709551616", "after=%2B1"] {
            assert_eq!(params(bad).after(), Err(Error::InvalidAfter), "{bad}");
        }
        assert_eq!(params("").limit(), Ok(PageLimit::default()));
        assert_eq!(params("limit=2").limit().map(PageLimit::get), Ok(2));
        assert_eq!(params("limit=0").limit(), Err(Error::InvalidLimit { limit: 0, max }));
        assert_eq!(params("limit=1001").limit(), Err(Error::InvalidLimit { limit: 1001, max }));
        assert_eq!(params("limit=99999999999").limit(), Err(Error::InvalidLimit { limit: u32::MAX, max }));
        assert_eq!(params("limit=ten").limit(), Err(Error::InvalidLimit { limit: 0, max }));
        let page = params("cursor=c1.ab&limit=5").page().unwrap();
        assert_eq!((page.cursor.as_deref(), page.limit.get()), (Some("c1.ab"), 5));
    }
}
