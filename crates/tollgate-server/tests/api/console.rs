//! The operator console through `router()`: sign-in and its cookies, the
//! security headers, CSRF and the viewer role, escaping, secrets, and the
//! numbers each page shows against the JSON routes. The same pages are
//! driven in a real browser in `console_browser`.

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use serde_json::json;
use tollgate_core::Secret;
use tollgate_server::{AppState, Limits, OperatorTokens, router};
use tollgate_store::MemoryStore;
use tower::ServiceExt;

use crate::support::{ADMIN, Api, App, As, GATEWAY, policy};

pub(crate) const VIEWER: &str = "viewer-token-for-handler-tests";

/// An answer: status, headers and body text.
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) headers: axum::http::HeaderMap,
    pub(crate) body: String,
}

impl Answer {
    pub(crate) fn header(&self, name: &str) -> &str {
        self.headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
    }

    /// The `name=value` part of each `Set-Cookie` named `name`.
    fn set_cookie(&self, name: &str) -> Option<String> {
        self.headers
            .get_all(header::SET_COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find(|v| v.starts_with(&format!("{name}=")))
            .map(str::to_owned)
    }
}

/// The value of the first `name="csrf" value="…"` input of a page.
pub(crate) fn csrf_of(page: &str) -> String {
    let at = page.find(r#"name="csrf" value=""#).expect("a CSRF input") + r#"name="csrf" value=""#.len();
    page[at..].split('"').next().unwrap().to_owned()
}

fn cookie_pair(set_cookie: &str) -> String {
    set_cookie.split(';').next().unwrap().to_owned()
}

pub(crate) fn app_with_viewer() -> App {
    app_with_viewer_over(std::sync::Arc::new(MemoryStore::new(policy())), crate::support::start())
}

/// A router over `store` at `start`, with the admin, gateway and viewer tokens.
pub(crate) fn app_with_viewer_over(store: std::sync::Arc<dyn tollgate_store::Store>, start: jiff::Timestamp) -> App {
    let clock = std::sync::Arc::new(tollgate_server::ManualClock::new(start));
    let tokens = OperatorTokens::new(&Secret::new(ADMIN.into()), Some(&Secret::new(GATEWAY.into())))
        .unwrap()
        .with_viewer(&Secret::new(VIEWER.into()))
        .unwrap();
    let state = AppState::with_limits(store, clock.clone(), tokens, Limits::default());
    App { router: router(state.clone()), clock, state }
}

/// Posts `form` to a console page, as its form would.
async fn post(app: &App, path: &str, cookie: &str, form: &str) -> Answer {
    send(app, Method::POST, path, cookie, Some(form)).await
}

pub(crate) async fn send(app: &App, method: Method, path: &str, cookie: &str, form: Option<&str>) -> Answer {
    let mut request = Request::builder().method(method).uri(path).header(header::HOST, "127.0.0.1");
    if !cookie.is_empty() {
        request = request.header(header::COOKIE, cookie);
    }
    if form.is_some() {
        request = request.header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
    }
    let request = request.body(Body::from(form.unwrap_or("").to_owned())).unwrap();
    let response = app.router.clone().oneshot(request).await.unwrap();
    let (status, headers) = (response.status(), response.headers().clone());
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
    Answer { status, headers, body: String::from_utf8_lossy(&bytes).into_owned() }
}

/// Signs in with `token` and returns the session cookie (`name=value`).
pub(crate) async fn sign_in(app: &App, token: &str) -> String {
    let form_page = send(app, Method::GET, "/console/sign-in", "", None).await;
    assert_eq!(form_page.status, StatusCode::OK);
    let sign_in_cookie = cookie_pair(&form_page.set_cookie("tollgate_sign_in").expect("a sign-in cookie"));
    let csrf = csrf_of(&form_page.body);
    let form = format!("csrf={csrf}&token={token}");
    let answer = post(app, "/console/sign-in", &sign_in_cookie, &form).await;
    assert_eq!(answer.status, StatusCode::SEE_OTHER, "{}", answer.body);
    assert_eq!(answer.header("location"), "/console/accounts");
    cookie_pair(&answer.set_cookie("tollgate_session").expect("a session cookie"))
}

#[tokio::test]
async fn signing_in_exchanges_a_token_for_a_strict_session_cookie() {
    let app = app_with_viewer();
    let unsigned = send(&app, Method::GET, "/console", "", None).await;
    assert_eq!(unsigned.status, StatusCode::SEE_OTHER);
    assert_eq!(unsigned.header("location"), "/console/sign-in");
    assert_eq!(send(&app, Method::GET, "/console/accounts", "", None).await.header("location"), "/console/sign-in");

    let form_page = send(&app, Method::GET, "/console/sign-in", "", None).await;
    let set = form_page.set_cookie("tollgate_sign_in").unwrap();
    let sign_in_cookie = cookie_pair(&set);
    let csrf = csrf_of(&form_page.body);
    for (token, status) in [(GATEWAY, StatusCode::UNAUTHORIZED), ("not-a-token-at-all-xx", StatusCode::UNAUTHORIZED)] {
        let form = format!("csrf={csrf}&token={token}");
        let answer = post(&app, "/console/sign-in", &sign_in_cookie, &form).await;
        assert_eq!(answer.status, status, "{token}");
        assert!(answer.set_cookie("tollgate_session").is_none());
    }
    let forged = post(&app, "/console/sign-in", "", &format!("csrf={csrf}&token={ADMIN}")).await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN, "a sign-in without its form's cookie");

    let request = Request::builder()
        .method(Method::POST)
        .uri("/console/sign-in")
        .header(header::COOKIE, &sign_in_cookie)
        .header("x-forwarded-proto", "https")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(format!("csrf={csrf}&token={ADMIN}")))
        .unwrap();
    let answer = app.router.clone().oneshot(request).await.unwrap();
    let session = answer
        .headers()
        .get_all(header::SET_COOKIE)
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .find(|v| v.starts_with("tollgate_session="))
        .unwrap();
    assert!(session.ends_with("; Path=/console; Max-Age=28800; HttpOnly; SameSite=Strict; Secure"), "{session}");
    let plain = sign_in(&app, ADMIN).await;
    assert!(!plain.contains(ADMIN), "the cookie does not hold the token");
    assert_eq!(send(&app, Method::GET, "/console", &plain, None).await.header("location"), "/console/accounts");
}

#[tokio::test]
async fn every_console_answer_forbids_scripts_framing_and_caching() {
    let app = app_with_viewer();
    app.funded("acme", 100).await;
    let cookie = sign_in(&app, ADMIN).await;
    for path in
        ["/console/sign-in", "/console/accounts", "/console/accounts/acme", "/console/fleet", "/console/webhooks"]
    {
        let answer = send(&app, Method::GET, path, &cookie, None).await;
        assert_eq!(answer.status, StatusCode::OK, "{path}: {}", answer.body);
        let csp = answer.header("content-security-policy");
        assert!(csp.starts_with("default-src 'none';"), "{path}: {csp}");
        assert!(!csp.contains("script-src"), "no script source is allowed at all: {csp}");
        assert!(!csp.contains("unsafe-inline"), "{csp}");
        assert_eq!(answer.header("x-frame-options"), "DENY");
        assert_eq!(answer.header("cache-control"), "no-store");
        assert!(answer.header("content-type").starts_with("text/html"), "{path}");
        assert!(!answer.body.contains("<script"), "{path}");
    }
    let css = send(&app, Method::GET, "/console/console.css", "", None).await;
    assert!(css.header("content-type").starts_with("text/css"));
}

#[tokio::test]
async fn a_change_without_its_csrf_token_is_refused_and_changes_nothing() {
    let app = app_with_viewer();
    app.funded("acme", 100).await;
    let cookie = sign_in(&app, ADMIN).await;
    let other = sign_in(&app, ADMIN).await;
    let other_csrf = csrf_of(&send(&app, Method::GET, "/console/accounts/acme", &other, None).await.body);
    for form in ["credit_id=x&units=5".to_owned(), format!("csrf={other_csrf}&credit_id=x&units=5")] {
        let answer = post(&app, "/console/accounts/acme/credits", &cookie, &form).await;
        assert_eq!(answer.status, StatusCode::FORBIDDEN, "{form}");
        assert!(answer.body.contains("CSRF"), "{}", answer.body);
    }
    let unsigned = post(&app, "/console/accounts/acme/credits", "", "credit_id=x&units=5").await;
    assert_eq!(unsigned.status, StatusCode::SEE_OTHER, "no session: sent to sign in");
    let account = app.ok(As::Admin, Method::GET, "/v1/accounts/acme", None, StatusCode::OK).await;
    assert_eq!(account["credited"], 100);

    let csrf = csrf_of(&send(&app, Method::GET, "/console/accounts/acme", &cookie, None).await.body);
    let form = format!("csrf={csrf}&credit_id=console-1&units=5");
    for _ in 0..2 {
        let answer = post(&app, "/console/accounts/acme/credits", &cookie, &form).await;
        assert_eq!(answer.status, StatusCode::SEE_OTHER, "{}", answer.body);
        assert_eq!(answer.header("location"), "/console/accounts/acme");
    }
    let account = app.ok(As::Admin, Method::GET, "/v1/accounts/acme", None, StatusCode::OK).await;
    assert_eq!(account["credited"], 105, "the same credit id credits once");
    let bad = post(&app, "/console/accounts/acme/credits", &cookie, &format!("csrf={csrf}&credit_id=y&units=-1")).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    let conflict = format!("csrf={csrf}&credit_id=console-1&units=6");
    let answer = post(&app, "/console/accounts/acme/credits", &cookie, &conflict).await;
    assert_eq!(answer.status, StatusCode::CONFLICT);
    assert!(answer.body.contains("credit_conflict"), "{}", answer.body);
}

#[tokio::test]
async fn a_viewer_sees_every_page_and_changes_nothing() {
    let app = app_with_viewer();
    let (credential_id, _) = app.funded("acme", 100).await;
    let cookie = sign_in(&app, VIEWER).await;
    let page = send(&app, Method::GET, "/console/accounts/acme", &cookie, None).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.body.contains(r#"data-role="viewer""#));
    assert!(!page.body.contains("add-credit") && !page.body.contains("class=\"revoke\""), "no form to change anything");
    let csrf = csrf_of(&page.body);
    let changes = [
        ("/console/accounts/acme/credits".to_owned(), format!("csrf={csrf}&credit_id=v&units=5")),
        (format!("/console/accounts/acme/credentials/{credential_id}/revoke"), format!("csrf={csrf}")),
        ("/console/accounts/acme/credentials".to_owned(), format!("csrf={csrf}&label=x")),
    ];
    for (path, form) in &changes {
        let answer = post(&app, path, &cookie, form).await;
        assert_eq!(answer.status, StatusCode::FORBIDDEN, "{path}");
        assert!(answer.body.contains("viewer"), "{}", answer.body);
    }
    let account = app.ok(As::Admin, Method::GET, "/v1/accounts/acme", None, StatusCode::OK).await;
    assert_eq!(account["credited"], 100);
    let credential = app
        .ok(As::Admin, Method::GET, &format!("/v1/accounts/acme/credentials/{credential_id}"), None, StatusCode::OK)
        .await;
    assert!(credential["revoked_at"].is_null());
    let secured: Vec<_> =
        crate::handlers::documented_routes().into_iter().filter(|(_, _, role)| role.is_some()).collect();
    assert!(secured.len() >= 30);
    for (method, path, _) in secured {
        let request = Request::builder()
            .method(method.clone())
            .uri(&path)
            .header(header::AUTHORIZATION, format!("Bearer {VIEWER}"))
            .body(Body::empty())
            .unwrap();
        let answer = app.router.clone().oneshot(request).await.unwrap();
        assert_eq!(answer.status(), StatusCode::FORBIDDEN, "the viewer token serves the console only: {method} {path}");
    }
}

#[tokio::test]
async fn markup_in_names_is_shown_as_text_and_no_secret_is_rendered() {
    let app = app_with_viewer();
    let (credential_id, key) = app.funded("acme", 100).await;
    let label = "<script>alert(1)</script><b>bold</b>";
    let issued = app.issue_credential("acme", label).await;
    let event = json!({"request_id": "r1", "account_id": "acme", "units": 3,
        "occurred_at": crate::support::start().to_string(), "credential_id": credential_id,
        "dimensions": {"model": "<img src=x onerror=alert(1)>"}});
    app.report_usage(json!({"events": [event]})).await;
    let cookie = sign_in(&app, ADMIN).await;
    let page = send(&app, Method::GET, "/console/accounts/acme?by=dimension&dimension=model", &cookie, None).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(page.body.contains("&lt;script&gt;alert(1)&lt;/script&gt;&lt;b&gt;bold&lt;/b&gt;"), "{}", page.body);
    assert!(page.body.contains("&lt;img src=x onerror=alert(1)&gt;"), "{}", page.body);
    assert!(!page.body.contains("<script") && !page.body.contains("<img") && !page.body.contains("<b>"));
    assert!(!page.body.contains(&key) && !page.body.contains(issued["key"].as_str().unwrap()), "keys are never shown");
    let search = send(&app, Method::GET, "/console/accounts?prefix=%22%3E%3Cb%3Ex", &cookie, None).await;
    assert!(search.body.contains("value=\"&quot;&gt;&lt;b&gt;x\""), "{}", search.body);

    let csrf = csrf_of(&page.body);
    let answer = post(&app, "/console/accounts/acme/credentials", &cookie, &format!("csrf={csrf}&label=new")).await;
    assert_eq!(answer.status, StatusCode::CREATED);
    let shown = answer.body.split(r#"<code id="issued-key">"#).nth(1).unwrap().split('<').next().unwrap().to_owned();
    assert!(shown.starts_with("tgk_acme_"), "{shown}");
    let verified = app.verify(&shown).await;
    assert_eq!(verified["valid"], true, "{verified}");
    let again = send(&app, Method::GET, "/console/accounts/acme", &cookie, None).await;
    assert!(!again.body.contains(&shown), "the key is shown once, on the page that issued it");
}

/// The text of the element with `data-counter="name"` (or another attribute).
pub(crate) fn data_text(page: &str, attribute: &str) -> String {
    let at = page.find(attribute).unwrap_or_else(|| panic!("{attribute} in {page}")) + attribute.len();
    let rest = &page[at..];
    let start = rest.find('>').unwrap() + 1;
    rest[start..].split('<').next().unwrap().to_owned()
}

#[tokio::test]
async fn the_account_and_fleet_pages_show_what_the_json_routes_answer() {
    let app = app_with_viewer();
    let (credential_id, _) = app.funded("acme", 1000).await;
    app.acquire("acme", 300, "PT10S").await;
    let events: Vec<_> = (0..3)
        .map(|i| {
            json!({"request_id": format!("r{i}"), "account_id": "acme", "units": 10 + i,
            "occurred_at": crate::support::start().to_string(), "credential_id": credential_id})
        })
        .chain([json!({"request_id": "x", "account_id": "nobody", "units": 1, "credential_id": "cred-x",
            "occurred_at": crate::support::start().to_string()})])
        .collect();
    app.report_usage(json!({"events": events})).await;
    let cookie = sign_in(&app, VIEWER).await;
    let page = send(&app, Method::GET, "/console/accounts/acme", &cookie, None).await.body;
    let account = app.ok(As::Admin, Method::GET, "/v1/accounts/acme", None, StatusCode::OK).await;
    for name in ["credited", "available", "reserved", "consumed", "billed", "overage"] {
        let shown = data_text(&page, &format!(r#"data-counter="{name}""#));
        assert_eq!(shown, account[name].to_string(), "{name}");
    }
    let usage = app
        .ok(
            As::Admin,
            Method::GET,
            "/v1/accounts/acme/usage?from=2023-12-31T01:00:00Z&to=2024-01-01T01:00:00Z&window=PT1H&group_by=credential",
            None,
            StatusCode::OK,
        )
        .await;
    assert_eq!(data_text(&page, r#"id="usage-total""#), usage["total"]["units"].as_str().unwrap(), "{usage}");
    assert_eq!(data_text(&page, r#"id="usage-total""#), "33");

    app.clock.set(crate::support::start().checked_add(jiff::SignedDuration::from_secs(60)).unwrap());
    let fleet = send(&app, Method::GET, "/console/fleet", &cookie, None).await.body;
    assert_eq!(data_text(&fleet, r#"data-count="active""#), "1");
    assert_eq!(data_text(&fleet, r#"data-count="due""#), "1", "expired past the 10 s grace: {fleet}");
    assert!(fleet.contains(r#"data-reason="unknown_account""#), "{fleet}");
    assert!(fleet.contains(r#"data-clean="unknown""#));
    let check = send(&app, Method::GET, "/console/check", &cookie, None).await.body;
    assert!(check.contains(r#"data-clean="true""#), "{check}");
    let fleet = send(&app, Method::GET, "/console/fleet", &cookie, None).await.body;
    assert!(fleet.contains(r#"data-clean="true""#), "the fleet page shows the last check");
}
