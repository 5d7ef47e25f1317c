//! The operator console at `/console`: the ledger, usage and fleet as HTML
//! pages, rendered on the server from the same store calls the JSON routes
//! make.
//!
//! - Pages are `maud` templates; charts are SVG drawn by [`svg`]; the one
//!   stylesheet is compiled into the binary. No page needs JavaScript, so
//!   the Content-Security-Policy allows no script at all.
//! - Signing in exchanges the admin token, or the read-only viewer token,
//!   for a signed session cookie ([`session`]). Every form carries a CSRF
//!   token; a viewer sees every page and every change is refused to it.
//! - Every value is escaped by `maud`. No secret is rendered, except a new
//!   credential's key on the one page that answers its issue.
//! - The console is not part of the OpenAPI document: it is HTML for
//!   people, and its routes may change between releases.

mod account;
mod accounts;
mod extract;
mod fleet;
pub(crate) mod history;
mod layout;
mod session;
mod svg;
mod usage;
mod webhooks;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::header::{
    CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, LOCATION, REFERRER_POLICY, SET_COOKIE,
    X_CONTENT_TYPE_OPTIONS, X_FRAME_OPTIONS,
};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use jiff::SignedDuration;

use self::extract::{Form, Signed};
use self::session::{SESSION_COOKIE, SESSION_TTL, SIGN_IN_COOKIE, SIGN_IN_TTL, Session};
use crate::AppState;
use crate::auth::Role;

pub(crate) use self::history::IngestHistory;

/// What the console keeps between requests: the ingestion history and the
/// last check this server ran.
#[derive(Default)]
pub(crate) struct ConsoleState {
    pub(crate) ingest: IngestHistory,
    pub(crate) last_check: fleet::LastCheck,
}

/// The console's policy: nothing but this server's own stylesheet, forms
/// posting to itself, no scripts, no framing.
const CSP: &str = "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; \
                   frame-ancestors 'none'; base-uri 'none'";

/// The console's routes, each answered with [`headers`] added.
pub(crate) fn router() -> Router<AppState> {
    Router::new()
        .route("/console", get(index))
        .route("/console/", get(index))
        .route("/console/console.css", get(stylesheet))
        .route("/console/sign-in", get(sign_in_form).post(sign_in))
        .route("/console/sign-out", post(sign_out))
        .route("/console/accounts", get(accounts::list))
        .route("/console/accounts/{account_id}", get(account::show))
        .route("/console/accounts/{account_id}/journal", get(account::journal))
        .route("/console/accounts/{account_id}/credits", post(account::add_credit))
        .route("/console/accounts/{account_id}/credentials", post(account::issue_credential))
        .route("/console/accounts/{account_id}/credentials/{credential_id}/revoke", post(account::revoke))
        .route("/console/fleet", get(fleet::show))
        .route("/console/check", get(fleet::check))
        .route("/console/webhooks", get(webhooks::show))
        .layer(middleware::from_fn(headers))
}

/// Adds the console's security headers to every answer, and says that no
/// page may be cached: a page may hold a credential key or a CSRF token.
async fn headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    headers.insert(X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

async fn index(signed: Option<Signed>) -> Response {
    match signed {
        Some(_) => see_other("/console/accounts"),
        None => see_other("/console/sign-in"),
    }
}

async fn stylesheet() -> Response {
    const CSS: &str = include_str!("console/console.css");
    ([(CONTENT_TYPE, "text/css; charset=utf-8")], CSS).into_response()
}

/// A `303 See Other` to `location`.
pub(crate) fn see_other(location: &str) -> Response {
    let mut response = StatusCode::SEE_OTHER.into_response();
    if let Ok(value) = HeaderValue::from_str(location) {
        response.headers_mut().insert(LOCATION, value);
    }
    response
}

/// The sign-in form, bound to a fresh cookie of its own.
async fn sign_in_form(State(state): State<AppState>, request_headers: HeaderMap) -> Response {
    sign_in_page(&state, &request_headers, StatusCode::OK, None)
}

fn sign_in_page(state: &AppState, request_headers: &HeaderMap, status: StatusCode, problem: Option<&str>) -> Response {
    let nonce = session::new_sign_in_nonce(state.now());
    let csrf = session::sign_in_csrf(state.tokens(), &nonce);
    let cookie = session::set_cookie(SIGN_IN_COOKIE, &nonce, SIGN_IN_TTL, session::behind_tls(request_headers));
    let page = layout::sign_in(&csrf, problem, state.tokens().has_viewer());
    let mut response = (status, page).into_response();
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        response.headers_mut().append(SET_COOKIE, value);
    }
    response
}

/// Signs in with the admin or viewer token. The gateway token, which
/// serves machines, cannot sign in.
async fn sign_in(State(state): State<AppState>, request_headers: HeaderMap, form: Form) -> Response {
    let now = state.now();
    let nonce = session::cookie_value(&request_headers, SIGN_IN_COOKIE).unwrap_or("");
    if !session::sign_in_csrf_holds(state.tokens(), nonce, form.get("csrf").unwrap_or(""), now) {
        let problem = "This sign-in form has expired or did not come from this console. Try again.";
        return sign_in_page(&state, &request_headers, StatusCode::FORBIDDEN, Some(problem));
    }
    let role = state.tokens().role_of(form.get("token").unwrap_or("").trim());
    let session = match role {
        Some(role @ (Role::Admin | Role::Viewer)) => Session::open(state.tokens(), role, now),
        Some(Role::Gateway) | None => None,
    };
    let Some(session) = session else {
        let problem = "That is not the admin or viewer token of this server.";
        return sign_in_page(&state, &request_headers, StatusCode::UNAUTHORIZED, Some(problem));
    };
    let secure = session::behind_tls(&request_headers);
    let mut response = see_other("/console/accounts");
    for cookie in [
        session::set_cookie(SESSION_COOKIE, session.cookie(), SESSION_TTL, secure),
        session::set_cookie(SIGN_IN_COOKIE, "", SignedDuration::ZERO, secure),
    ] {
        if let Ok(value) = HeaderValue::from_str(&cookie) {
            response.headers_mut().append(SET_COOKIE, value);
        }
    }
    response
}

/// Clears the session cookie. Any signed-in role may sign out.
async fn sign_out(signed: Signed, State(state): State<AppState>, request_headers: HeaderMap, form: Form) -> Response {
    if !signed.session.csrf_holds(state.tokens(), form.get("csrf").unwrap_or("")) {
        return extract::refusal(StatusCode::FORBIDDEN, extract::CSRF_PROBLEM, Some(&signed));
    }
    let mut response = see_other("/console/sign-in");
    let cookie = session::set_cookie(SESSION_COOKIE, "", SignedDuration::ZERO, session::behind_tls(&request_headers));
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        response.headers_mut().append(SET_COOKIE, value);
    }
    response
}
