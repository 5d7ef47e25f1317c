//! The testkit's own tests, as one test binary: the WebDriver client
//! (`browser`) against a real headless Chromium and a page served on loopback.

mod browser;
