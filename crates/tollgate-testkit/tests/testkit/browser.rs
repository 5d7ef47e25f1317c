//! Each method of `Browser` and `Element` against a page served from a
//! loopback listener, in a real headless Chromium.

use std::sync::Arc;

use axum::http::header;
use axum::response::Html;
use axum::routing::get;
use serde_json::json;
use tollgate_testkit::browser::{Browser, Cookie};

const PAGE: &str = r#"<!doctype html>
<html><head><title>Browser self-test</title></head>
<body>
  <p id="escaped">&lt;b&gt;not bold&lt;/b&gt;</p>
  <ul id="list"><li>one</li><li>two</li><li>three</li></ul>
  <p id="hidden" hidden>not shown</p>
  <form method="post" action="/submit">
    <input id="note" name="note" value="initial">
    <button id="send" type="submit">Send</button>
  </form>
</body></html>"#;

/// Serves `PAGE` at `/` (setting a cookie) and, at `/submit`, echoes the
/// posted form body; returns the base URL.
async fn serve() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a loopback port");
    let address = listener.local_addr().expect("an address");
    let page = || async {
        let cookie = "visit=abc123; Path=/; HttpOnly; SameSite=Strict; Max-Age=3600";
        ([(header::SET_COOKIE, cookie)], Html(PAGE))
    };
    let submit = |body: String| async move {
        let body = body.replace('&', "&amp;").replace('<', "&lt;");
        Html(format!("<!doctype html><title>Submitted</title><pre id=\"posted\">{body}</pre>"))
    };
    let app = axum::Router::new().route("/", get(page)).route("/submit", axum::routing::post(submit));
    tokio::spawn(async move { axum::serve(listener, app).await.expect("the page serves") });
    format!("http://{address}")
}

#[tokio::test]
async fn a_form_is_filled_submitted_and_left_with_back() {
    let base = serve().await;
    let browser = Browser::start().await;
    browser.goto(&format!("{base}/")).await;
    assert_eq!(browser.title().await, "Browser self-test");
    let note = browser.find("#note").await;
    assert_eq!(note.attr("value").await.as_deref(), Some("initial"));
    assert_eq!(note.attr("placeholder").await, None);
    note.clear().await;
    note.send_keys("hello <world>").await;
    assert_eq!(note.property("value").await, json!("hello <world>"));
    assert_eq!(note.attr("value").await.as_deref(), Some("initial"), "the attribute is the markup's");

    browser.find("#send").await.click().await;
    assert_eq!(browser.current_url().await, format!("{base}/submit"));
    assert_eq!(browser.title().await, "Submitted");
    assert_eq!(browser.find("#posted").await.text().await, "note=hello+%3Cworld%3E");
    assert!(browser.page_source().await.contains(r#"<pre id="posted">note=hello+%3Cworld%3E</pre>"#));

    browser.back().await;
    assert_eq!(browser.current_url().await, format!("{base}/"));
    assert_eq!(browser.title().await, "Browser self-test");
}

#[tokio::test]
async fn escaped_markup_reads_as_text_and_elements_are_found_within_elements() {
    let base = serve().await;
    let browser = Browser::start().await;
    browser.goto(&format!("{base}/")).await;
    let escaped = browser.find("#escaped").await;
    assert_eq!(escaped.text().await, "<b>not bold</b>");
    assert!(escaped.find_all("b").await.is_empty(), "escaped markup made no element");

    let list = browser.find("#list").await;
    let mut items = Vec::new();
    for item in list.find_all("li").await {
        items.push(item.text().await);
    }
    assert_eq!(items, ["one", "two", "three"]);
    assert_eq!(list.find("li:last-child").await.text().await, "three");
    assert_eq!(browser.find_all("li").await.len(), 3);
    assert!(browser.try_find("#absent").await.is_none());
    assert!(browser.try_find("#list").await.is_some());

    assert!(list.is_displayed().await);
    assert!(!browser.find("#hidden").await.is_displayed().await);
    let sum = browser.execute("return arguments[0] + arguments[1];", &[json!(2), json!(3)]).await;
    assert_eq!(sum, json!(5));
}

#[tokio::test]
async fn cookies_are_read_with_their_attributes_and_deleted() {
    let base = serve().await;
    let browser = Browser::start().await;
    browser.goto(&format!("{base}/")).await;
    let cookies = browser.cookies().await;
    let [cookie] = cookies.as_slice() else { panic!("one cookie: {cookies:?}") };
    let Cookie { name, value, http_only, same_site, secure, expiry } = cookie;
    assert_eq!((name.as_str(), value.as_str()), ("visit", "abc123"));
    assert!(*http_only);
    assert_eq!(same_site.as_deref(), Some("Strict"));
    assert!(!*secure);
    assert!(expiry.is_some(), "Max-Age gives an expiry");
    let script_sees = browser.execute("return document.cookie;", &[]).await;
    assert_eq!(script_sees, json!(""), "an HttpOnly cookie is hidden from scripts");

    browser.delete_cookies().await;
    assert_eq!(browser.cookies().await, []);
}

#[tokio::test]
async fn a_screenshot_is_a_png_of_the_viewport() {
    let base = serve().await;
    let browser = Browser::start().await;
    browser.goto(&format!("{base}/")).await;
    let sizes = "return [outerWidth, outerHeight, innerWidth, innerHeight];";

    browser.set_window_size(800, 600).await;
    let [outer_width, outer_height, inner_width, inner_height] = numbers(browser.execute(sizes, &[]).await);
    assert_eq!((outer_width, outer_height), (800, 600));
    assert_eq!(png_size(&browser.screenshot_png().await), (inner_width, inner_height));

    browser.set_viewport(640, 480).await;
    let [_, _, inner_width, inner_height] = numbers(browser.execute(sizes, &[]).await);
    assert_eq!((inner_width, inner_height), (640, 480));
    assert_eq!(png_size(&browser.screenshot_png().await), (640, 480));
}

fn numbers<const N: usize>(value: serde_json::Value) -> [u64; N] {
    let numbers: Vec<u64> = value.as_array().expect("a list").iter().map(|n| n.as_u64().expect("a number")).collect();
    numbers.try_into().expect("as many numbers as asked for")
}

/// A PNG's width and height, after checking its signature: the first chunk
/// is IHDR, with both as big-endian 32-bit integers at bytes 16..24.
fn png_size(png: &[u8]) -> (u64, u64) {
    assert_eq!(png[..8], *b"\x89PNG\r\n\x1a\n", "PNG signature");
    assert_eq!(&png[12..16], b"IHDR");
    let number = |at: usize| u64::from(u32::from_be_bytes(png[at..at + 4].try_into().expect("four bytes")));
    (number(16), number(20))
}

#[tokio::test]
async fn a_missing_element_panics_naming_the_selector_and_the_page() {
    let base = serve().await;
    let browser = Arc::new(Browser::start().await);
    browser.goto(&format!("{base}/")).await;
    let finding = Arc::clone(&browser);
    let failed = tokio::spawn(async move { finding.find("#absent").await }).await;
    let panic = failed.err().expect("find panics when nothing matches").into_panic();
    let message = panic.downcast_ref::<String>().expect("a formatted panic message");
    assert_eq!(message, &format!("no element matches `#absent` on {base}/"));
}
