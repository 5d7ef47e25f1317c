//! The operator console in a real browser: headless Chromium, driven over
//! WebDriver (`tollgate_testkit::browser`), against a server listening on
//! loopback, on both stores. `scripts/test` installs Chromium and
//! chromedriver; without them these tests fail and say how to install them.
//!
//! `console_screenshots` also writes `console-account.png` and
//! `console-fleet.png` to `TOLLGATE_SCREENSHOTS_DIR` when it is set
//! (`scripts/screenshots` sets it to `docs/`).

use std::sync::Arc;

use axum::http::{Method, StatusCode};
use jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};
use tollgate_pg::PostgresStore;
use tollgate_pg::testing::TestDb;
use tollgate_testkit::browser::Browser;

use crate::console::VIEWER;
use crate::support::{ADMIN, Api, App, As, policy};

/// The time every browser test runs at: a whole hour, so that the usage
/// chart's range is the one computed below.
fn now() -> Timestamp {
    "2026-12-01T12:30:00Z".parse().unwrap()
}

fn app_over(store: Arc<dyn tollgate_store::Store>) -> App {
    crate::console::app_with_viewer_over(store, now())
}

/// Serves `app` on a free loopback port; returns its base URL.
async fn listen(app: &App) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let router = app.router.clone();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    format!("http://{address}")
}

const LABEL: &str = "<b>mobile</b> app & \"more\"";

/// An account with a credit, two credentials (one labelled with markup),
/// an active lease and usage by two models over the last day.
async fn seed(app: &App) -> String {
    let (credential_id, _) = app.funded("acme", 5_000).await;
    let other = app.issue_credential("acme", LABEL).await;
    app.acquire("acme", 400, "PT30M").await;
    let events: Vec<Value> = (0..40)
        .map(|i: i64| {
            let at = now().checked_sub(SignedDuration::from_mins(i * 35)).unwrap();
            let credential = if i % 3 == 0 { other["credential_id"].clone() } else { json!(credential_id) };
            json!({"request_id": format!("r{i}"), "account_id": "acme", "units": 5 + i % 7,
                "occurred_at": at.to_string(), "credential_id": credential,
                "dimensions": {"model": if i % 2 == 0 { "large" } else { "<i>small</i>" }}})
        })
        .collect();
    app.report_usage(json!({"events": events})).await;
    credential_id
}

async fn sign_in(browser: &Browser, base: &str, token: &str) {
    browser.delete_cookies().await;
    browser.goto(&format!("{base}/console")).await;
    assert!(browser.current_url().await.ends_with("/console/sign-in"), "{}", browser.current_url().await);
    browser.find("#token").await.send_keys(token).await;
    click_through(browser, "#sign-in-button").await;
    assert!(browser.current_url().await.ends_with("/console/accounts"), "{}", browser.page_source().await);
}

/// Clicks `css`, which submits a form or follows a link, and waits until
/// the next page has loaded: a mark left on this page's window is gone and
/// the new document is complete.
async fn click_through(browser: &Browser, css: &str) {
    browser.execute("window.tollgateTestMark = true;", &[]).await;
    browser.find(css).await.click().await;
    for _ in 0..200 {
        let done = browser
            .execute("return window.tollgateTestMark === undefined && document.readyState === 'complete';", &[])
            .await;
        if done == Value::Bool(true) {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("clicking {css} did not load another page: {}", browser.current_url().await);
}

/// The number an element of the page shows.
async fn number(browser: &Browser, css: &str) -> u64 {
    let text = browser.find(css).await.text().await;
    text.trim().parse().unwrap_or_else(|_| panic!("{css} shows {text:?}"))
}

async fn account_json(app: &App) -> Value {
    app.ok(As::Admin, Method::GET, "/v1/accounts/acme", None, StatusCode::OK).await
}

/// Everything the console test asks of one store.
async fn drive(app: App) {
    let credential_id = seed(&app).await;
    let base = listen(&app).await;
    let browser = Browser::start().await;
    sign_in(&browser, &base, ADMIN).await;
    let cookie = browser.cookies().await.into_iter().find(|c| c.name == "tollgate_session").expect("session");
    assert!(cookie.http_only, "{cookie:?}");
    assert_eq!(cookie.same_site.as_deref(), Some("Strict"));

    browser.find("#prefix").await.send_keys("ac").await;
    click_through(&browser, "#search button").await;
    click_through(&browser, r#"tr[data-account-id="acme"] a"#).await;
    assert!(browser.current_url().await.ends_with("/console/accounts/acme"));

    let account = account_json(&app).await;
    for name in ["credited", "available", "reserved", "consumed", "billed", "overage"] {
        let shown = number(&browser, &format!(r#"#balance [data-counter="{name}"]"#)).await;
        assert_eq!(shown, account[name].as_u64().unwrap(), "{name}");
    }
    assert_chart_matches_usage(&app, &browser).await;
    assert_markup_is_text(&browser, &base).await;
    add_credit(&app, &browser).await;
    revoke(&app, &browser, &credential_id).await;
    refuse_without_csrf(&app, &browser, &base).await;
    viewer_changes_nothing(&app, &browser, &base).await;
}

async fn assert_chart_matches_usage(app: &App, browser: &Browser) {
    let path = "/v1/accounts/acme/usage?from=2026-11-30T13:00:00Z&to=2026-12-01T13:00:00Z&window=PT1H";
    let usage = app.ok(As::Admin, Method::GET, &format!("{path}&group_by=credential"), None, StatusCode::OK).await;
    let total: u64 = usage["total"]["units"].as_str().unwrap().parse().unwrap();
    assert!(total > 0);
    assert_eq!(number(browser, "#usage-total").await, total);
    assert!(browser.find("#usage svg.chart").await.is_displayed().await);
    browser.find("#by").await.send_keys("dimension").await;
    browser.find("#dimension").await.send_keys("model").await;
    click_through(browser, "#usage-grouping button").await;
    let by_model =
        app.ok(As::Admin, Method::GET, &format!("{path}&group_by=dimension:model"), None, StatusCode::OK).await;
    let sum = |value: &str| -> u64 {
        by_model["buckets"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|bucket| bucket["groups"].as_array().unwrap().clone())
            .filter(|group| group["key"] == value)
            .map(|group| group["units"].as_str().unwrap().parse::<u64>().unwrap())
            .sum()
    };
    assert_eq!(number(browser, r#"#usage-totals tr[data-series="large"] td.units"#).await, sum("large"));
    let small = browser.find(r#"#usage-totals tr[data-series="<i>small</i>"]"#).await;
    assert_eq!(small.find("td.units").await.text().await.parse::<u64>().unwrap(), sum("<i>small</i>"));
    assert!(small.find("th").await.text().await.ends_with("<i>small</i>"), "markup in a dimension is text");
    click_through(browser, r#"#usage a[href*="range=30d"]"#).await;
    assert_eq!(number(browser, "#usage-total").await, total, "every event is within the last 30 days too");
}

async fn assert_markup_is_text(browser: &Browser, base: &str) {
    browser.goto(&format!("{base}/console/accounts/acme")).await;
    let labels = browser.find_all("#credentials td.label").await;
    let mut texts = Vec::new();
    for label in &labels {
        texts.push(label.text().await);
    }
    assert!(texts.iter().any(|text| text == LABEL), "{texts:?}");
    assert!(browser.try_find("#credentials td.label b").await.is_none(), "no element came from a label");
}

async fn add_credit(app: &App, browser: &Browser) {
    let before = account_json(app).await["credited"].as_u64().unwrap();
    let credit_id = browser.find("#credit_id").await.property("value").await;
    assert!(credit_id.as_str().unwrap().starts_with("console-"), "a fresh credit id is filled in");
    browser.find("#units").await.send_keys("250").await;
    click_through(browser, "#add-credit button").await;
    assert_eq!(number(browser, r#"#balance [data-counter="credited"]"#).await, before + 250);
    assert_eq!(account_json(app).await["credited"].as_u64().unwrap(), before + 250);
    let row = format!(r#"#credits tr[data-credit-id="{}"]"#, credit_id.as_str().unwrap());
    assert_eq!(browser.find(&row).await.find("td.num").await.text().await, "250");
}

async fn revoke(app: &App, browser: &Browser, credential_id: &str) {
    let row = format!(r#"#credentials tr[data-credential-id="{credential_id}"]"#);
    click_through(browser, &format!("{row} form.revoke button")).await;
    assert!(browser.find(&format!("{row} td.state")).await.text().await.starts_with("revoked"));
    let path = format!("/v1/accounts/acme/credentials/{credential_id}");
    let credential = app.ok(As::Admin, Method::GET, &path, None, StatusCode::OK).await;
    assert!(credential["revoked_at"].is_string(), "{credential}");
}

/// A POST carrying the browser's session but no CSRF token, as a page of
/// another origin would send it if the cookie went along, is refused.
async fn refuse_without_csrf(app: &App, browser: &Browser, base: &str) {
    let session = browser.cookies().await.into_iter().find(|c| c.name == "tollgate_session").unwrap();
    let before = account_json(app).await["credited"].as_u64().unwrap();
    let answer = reqwest::Client::new()
        .post(format!("{base}/console/accounts/acme/credits"))
        .header("cookie", format!("tollgate_session={}", session.value))
        .header("content-type", "application/x-www-form-urlencoded")
        .body("credit_id=forged&units=1000")
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status().as_u16(), 403);
    assert_eq!(account_json(app).await["credited"].as_u64().unwrap(), before);
}

async fn viewer_changes_nothing(app: &App, browser: &Browser, base: &str) {
    sign_in(browser, base, VIEWER).await;
    browser.goto(&format!("{base}/console/accounts/acme")).await;
    assert_eq!(browser.find("#role").await.attr("data-role").await.as_deref(), Some("viewer"));
    assert!(browser.try_find("#add-credit").await.is_none());
    assert!(browser.try_find("form.revoke").await.is_none());
    assert!(browser.try_find("#issue-credential").await.is_none());
    let csrf = browser.find(r#"form.sign-out input[name="csrf"]"#).await.property("value").await;
    let session = browser.cookies().await.into_iter().find(|c| c.name == "tollgate_session").unwrap();
    let before = account_json(app).await;
    let answer = reqwest::Client::new()
        .post(format!("{base}/console/accounts/acme/credits"))
        .header("cookie", format!("tollgate_session={}", session.value))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("csrf={}&credit_id=viewer&units=1000", csrf.as_str().unwrap()))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status().as_u16(), 403, "a viewer's own valid form is refused too");
    assert_eq!(account_json(app).await, before);
    browser.goto(&format!("{base}/console/fleet")).await;
    assert!(browser.find("#reclaim-backlog").await.is_displayed().await);
}

#[tokio::test]
async fn the_console_in_a_browser_on_memory() {
    drive(app_over(Arc::new(tollgate_store::MemoryStore::new(policy())))).await;
}

#[tokio::test]
async fn the_console_in_a_browser_on_postgres() {
    let store = PostgresStore::on_test_db(TestDb::create().await, policy()).await.expect("store");
    drive(app_over(Arc::new(store))).await;
}

/// The account and fleet pages at 1280 px, written to
/// `TOLLGATE_SCREENSHOTS_DIR` when it is set; and every page readable at
/// 360 px wide without scrolling sideways.
#[tokio::test]
async fn console_screenshots() {
    let app = app_over(Arc::new(tollgate_store::MemoryStore::new(policy())));
    seed(&app).await;
    app.clock.set(now().checked_add(SignedDuration::from_mins(40)).unwrap());
    let base = listen(&app).await;
    let browser = Browser::start().await;
    sign_in(&browser, &base, ADMIN).await;
    browser.goto(&format!("{base}/console/check")).await;
    assert_eq!(browser.find("#check-status").await.attr("data-clean").await.as_deref(), Some("true"));
    let dir = std::env::var_os("TOLLGATE_SCREENSHOTS_DIR").map(std::path::PathBuf::from);
    for (page, file) in [("/console/accounts/acme", "console-account.png"), ("/console/fleet", "console-fleet.png")] {
        browser.set_viewport(1280, 800).await;
        browser.goto(&format!("{base}{page}")).await;
        let height = browser.execute("return document.documentElement.scrollHeight;", &[]).await;
        browser.set_viewport(1280, u32::try_from(height.as_u64().unwrap()).unwrap()).await;
        let png = browser.screenshot_png().await;
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        if let Some(dir) = &dir {
            std::fs::write(dir.join(file), &png).unwrap();
        }
    }
    browser.set_viewport(360, 800).await;
    for page in [
        "/console/sign-in",
        "/console/accounts",
        "/console/accounts/acme",
        "/console/accounts/acme/journal",
        "/console/fleet",
        "/console/check",
        "/console/webhooks",
    ] {
        browser.goto(&format!("{base}{page}")).await;
        let width = browser.execute("return document.documentElement.scrollWidth;", &[]).await;
        assert!(width.as_u64().unwrap() <= 360, "{page} is readable at 360 px without scrolling sideways: {width}");
    }
}
