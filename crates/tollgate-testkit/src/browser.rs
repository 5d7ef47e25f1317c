//! A W3C WebDriver client for tests that need a real browser: Debian's
//! Chromium, headless, driven by its chromedriver over HTTP on loopback
//! (the protocol's plumbing is in `webdriver`).
//!
//! Every failure is a panic that says what was asked and what the driver
//! answered: a test can do nothing with such an error but fail on it.

mod webdriver;

use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use webdriver::{Driver, Session, base64_decode, end_session, locate, string};

/// The bound on each wait: chromedriver starting, a page loading, a script
/// running, the session ending. It only keeps a broken browser from hanging
/// a suite; passing tests never come near it.
pub const BROWSER_WAIT_MAX: Duration = Duration::from_secs(30);

/// A headless Chromium with one WebDriver session. Dropping it ends the
/// session, which quits Chromium, and kills chromedriver.
pub struct Browser {
    session: Session,
    driver: Driver,
}

/// An element of the page it was found on.
pub struct Element {
    session: Session,
    /// `/element/{id}`, relative to the session.
    path: String,
}

/// A cookie as the browser holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cookie {
    pub name: String,
    pub value: String,
    pub http_only: bool,
    /// `Strict`, `Lax` or `None`, when the browser reports it.
    pub same_site: Option<String>,
    pub secure: bool,
    /// Seconds since the Unix epoch; `None` for a session cookie.
    pub expiry: Option<u64>,
}

impl Browser {
    /// Finds chromedriver and Chromium, starts chromedriver on a free
    /// loopback port and opens a session. Panics, saying how to install
    /// them, when either is missing.
    pub async fn start() -> Browser {
        let chromedriver = locate("chromedriver");
        let chromium = locate("chromium");
        let driver = Driver::start(&chromedriver).await;
        driver.wait_ready().await;
        let session = driver.open_session(&chromium).await;
        Browser { session, driver }
    }

    pub async fn goto(&self, url: &str) {
        self.session.post("/url", json!({ "url": url })).await;
    }

    pub async fn current_url(&self) -> String {
        string(self.session.get("/url").await)
    }

    pub async fn title(&self) -> String {
        string(self.session.get("/title").await)
    }

    /// The first element matching `css`; panics, naming `css` and the page,
    /// when there is none.
    pub async fn find(&self, css: &str) -> Element {
        self.session.expect_found("", css).await
    }

    pub async fn find_all(&self, css: &str) -> Vec<Element> {
        self.session.find_all("", css).await
    }

    pub async fn try_find(&self, css: &str) -> Option<Element> {
        self.session.find("", css).await
    }

    pub async fn page_source(&self) -> String {
        string(self.session.get("/source").await)
    }

    /// The viewport as a PNG image.
    pub async fn screenshot_png(&self) -> Vec<u8> {
        base64_decode(&string(self.session.get("/screenshot").await))
    }

    /// Sizes the window, including the browser's own frame: headless
    /// Chromium keeps one, so the page gets less height than asked for.
    pub async fn set_window_size(&self, width: u32, height: u32) {
        self.session.post("/window/rect", json!({ "width": width, "height": height })).await;
    }

    /// Sizes the window so that the page's viewport, and so a screenshot, is
    /// `width` by `height` CSS pixels.
    pub async fn set_viewport(&self, width: u32, height: u32) {
        let frame = self.execute("return [outerWidth - innerWidth, outerHeight - innerHeight];", &[]).await;
        let frame = |axis: usize| {
            let extra = frame[axis].as_u64().unwrap_or_else(|| panic!("the frame's size: {frame}"));
            u32::try_from(extra).expect("a frame narrower than 2^32 pixels")
        };
        self.set_window_size(width + frame(0), height + frame(1)).await;
    }

    pub async fn cookies(&self) -> Vec<Cookie> {
        let cookies = self.session.get("/cookie").await;
        let cookies = cookies.as_array().unwrap_or_else(|| panic!("cookies are a list: {cookies}"));
        cookies.iter().map(Cookie::of).collect()
    }

    pub async fn delete_cookies(&self) {
        self.session.call(Method::DELETE, "/cookie", None).await;
    }

    /// Runs `script` as a function body with `args` as `arguments`, and
    /// returns what it returns.
    pub async fn execute(&self, script: &str, args: &[Value]) -> Value {
        self.session.post("/execute/sync", json!({ "script": script, "args": args })).await
    }

    pub async fn back(&self) {
        self.session.post("/back", json!({})).await;
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Killing chromedriver alone would leave Chromium running; ending the
        // session quits it. Drop cannot await, so the request goes over a
        // blocking socket, bounded by its timeouts. chromedriver itself is
        // killed when its `Child` drops.
        end_session(self.driver.address, &self.session.path);
    }
}

impl Element {
    pub async fn text(&self) -> String {
        string(self.session.get(&format!("{}/text", self.path)).await)
    }

    /// The attribute as written in the markup, `None` when absent.
    pub async fn attr(&self, name: &str) -> Option<String> {
        self.session.get(&format!("{}/attribute/{name}", self.path)).await.as_str().map(str::to_owned)
    }

    /// The DOM property, which reflects what was typed or clicked.
    pub async fn property(&self, name: &str) -> Value {
        self.session.get(&format!("{}/property/{name}", self.path)).await
    }

    pub async fn click(&self) {
        self.session.post(&format!("{}/click", self.path), json!({})).await;
    }

    pub async fn clear(&self) {
        self.session.post(&format!("{}/clear", self.path), json!({})).await;
    }

    pub async fn send_keys(&self, text: &str) {
        self.session.post(&format!("{}/value", self.path), json!({ "text": text })).await;
    }

    /// The first element within this one matching `css`; panics, naming
    /// `css` and the page, when there is none.
    pub async fn find(&self, css: &str) -> Element {
        self.session.expect_found(&self.path, css).await
    }

    pub async fn find_all(&self, css: &str) -> Vec<Element> {
        self.session.find_all(&self.path, css).await
    }

    pub async fn is_displayed(&self) -> bool {
        let shown = self.session.get(&format!("{}/displayed", self.path)).await;
        shown.as_bool().unwrap_or_else(|| panic!("displayed is a boolean: {shown}"))
    }
}

impl Cookie {
    fn of(cookie: &Value) -> Cookie {
        let text = |key: &str| cookie[key].as_str().map(str::to_owned);
        Cookie {
            name: text("name").unwrap_or_else(|| panic!("a cookie has a name: {cookie}")),
            value: text("value").unwrap_or_else(|| panic!("a cookie has a value: {cookie}")),
            http_only: cookie["httpOnly"].as_bool().unwrap_or(false),
            same_site: text("sameSite"),
            secure: cookie["secure"].as_bool().unwrap_or(false),
            expiry: cookie["expiry"].as_u64(),
        }
    }
}
