//! What a console request brings: its session ([`Signed`]), its form
//! ([`Form`]) and, for a form that changes something, both checked together
//! ([`Change`]); a read of one account's page ([`AccountPage`]); and how a
//! console refusal is answered (an HTML page with the status, never a JSON
//! body).

use axum::RequestPartsExt;
use axum::body::to_bytes;
use axum::extract::{FromRequest, FromRequestParts, OptionalFromRequestParts, Path, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;

use super::layout;
use super::session::{SESSION_COOKIE, Session, cookie_value};
use crate::AppState;
use crate::error::{Failure, status_of_kind};

/// The most bytes a console form may send; every form is a few fields.
pub(crate) const FORM_BYTES_MAX: usize = 64 * 1024;

pub(crate) const CSRF_PROBLEM: &str = "This form's CSRF token is missing or does not belong to your session, so nothing was changed. \
     Reload the page and submit the form again.";

pub(crate) const VIEWER_PROBLEM: &str = "The viewer role can see every page but change nothing.";

/// A request from a signed-in operator, with the CSRF token its page's forms
/// carry. A request without a valid session is sent to the sign-in page.
pub(crate) struct Signed {
    pub(crate) session: Session,
    pub(crate) csrf: String,
}

impl Signed {
    /// The refusal of a change, unless it comes from the admin role and from
    /// a form of its own session.
    fn refuses_change(&self, state: &AppState, form: &Form) -> Option<Response> {
        if !self.session.csrf_holds(state.tokens(), form.get("csrf").unwrap_or("")) {
            return Some(refusal(StatusCode::FORBIDDEN, CSRF_PROBLEM, Some(self)));
        }
        if !self.session.can_change() {
            return Some(refusal(StatusCode::FORBIDDEN, VIEWER_PROBLEM, Some(self)));
        }
        None
    }
}

fn signed(parts: &Parts, state: &AppState) -> Option<Signed> {
    let cookie = cookie_value(&parts.headers, SESSION_COOKIE)?;
    let session = Session::verify(state.tokens(), cookie, state.now())?;
    let csrf = session.csrf(state.tokens());
    Some(Signed { session, csrf })
}

impl FromRequestParts<AppState> for Signed {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Response> {
        signed(parts, state).ok_or_else(|| super::see_other("/console/sign-in"))
    }
}

impl OptionalFromRequestParts<AppState> for Signed {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Option<Self>, Self::Rejection> {
        Ok(signed(parts, state))
    }
}

/// An `application/x-www-form-urlencoded` body of at most
/// [`FORM_BYTES_MAX`] bytes.
pub(crate) struct Form(Vec<(String, String)>);

impl Form {
    /// The first value of field `name`.
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.0.iter().find(|(key, _)| key == name).map(|(_, value)| value.as_str())
    }
}

impl FromRequest<AppState> for Form {
    type Rejection = Response;

    async fn from_request(request: Request, _: &AppState) -> Result<Self, Response> {
        let body = to_bytes(request.into_body(), FORM_BYTES_MAX).await.map_err(|_| {
            refusal(StatusCode::PAYLOAD_TOO_LARGE, "The form sent more than the console accepts.", None)
        })?;
        Ok(Form(form_urlencoded::parse(&body).into_owned().collect()))
    }
}

/// A form that changes something: the operator who sent it, the route's
/// path parameters and the form, once the form has shown it comes from an
/// admin's own session. Read in the order separate extractors would be: the
/// session, the path, the form, then the check.
pub(crate) struct Change<P> {
    pub(crate) signed: Signed,
    pub(crate) path: P,
    pub(crate) form: Form,
}

impl<P: DeserializeOwned + Send + 'static> FromRequest<AppState> for Change<P> {
    type Rejection = Response;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, Response> {
        let (mut parts, body) = request.into_parts();
        let signed: Signed = parts.extract_with_state(state).await?;
        let Path(path) = parts.extract_with_state::<Path<P>, _>(state).await.map_err(IntoResponse::into_response)?;
        let form = Form::from_request(Request::from_parts(parts, body), state).await?;
        if let Some(refused) = signed.refuses_change(state, &form) {
            return Err(refused);
        }
        Ok(Change { signed, path, form })
    }
}

/// A signed-in read of one account's page: who asks, the account the path
/// names, and the query string.
pub(crate) struct AccountPage {
    pub(crate) signed: Signed,
    pub(crate) account_id: String,
    pub(crate) params: crate::extract::QueryParams,
}

impl FromRequestParts<AppState> for AccountPage {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Response> {
        let signed: Signed = parts.extract_with_state(state).await?;
        let Path(account_id) = parts.extract::<Path<String>>().await.map_err(IntoResponse::into_response)?;
        let Ok(params) = parts.extract().await;
        Ok(AccountPage { signed, account_id, params })
    }
}

/// An HTML page that says why a request was refused.
pub(crate) fn refusal(status: StatusCode, problem: &str, signed: Option<&Signed>) -> Response {
    (status, layout::problem(status, problem, signed)).into_response()
}

/// A store's refusal or failure as a page with the status the JSON routes
/// would answer; a server error is logged by the router as theirs are.
pub(crate) fn failure(error: &tollgate_core::Error, signed: &Signed) -> Response {
    let status = status_of_kind(error.kind());
    let problem = format!("{} ({})", error, error.code());
    let mut response = refusal(status, &problem, Some(signed));
    if status.is_server_error() {
        response.extensions_mut().insert(Failure { code: error.code().to_owned(), message: error.to_string() });
    }
    response
}
