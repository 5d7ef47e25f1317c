//! The console pair's HTTP/1.1 client: one keep-alive connection to the
//! server, signed in to the console as a browser is (the sign-in form's
//! cookie and CSRF token, then the session cookie), plus the JSON calls the
//! setup makes with the admin token. Loopback only.

use std::net::SocketAddr;

use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper::header::SET_COOKIE;

use crate::http::Sender;

/// The sign-in form's cookie and the session's, as the server names them.
const SIGN_IN_COOKIE: &str = "tollgate_sign_in";
const SESSION_COOKIE: &str = "tollgate_session";

/// An answer: its status, its `Set-Cookie` values and its body.
pub(crate) struct Answer {
    pub(crate) status: u16,
    set_cookies: Vec<String>,
    pub(crate) body: Bytes,
}

impl Answer {
    /// The value the answer sets for cookie `name`.
    fn cookie(&self, name: &str) -> Option<&str> {
        self.set_cookies.iter().find_map(|cookie| {
            let (pair, _) = cookie.split_once(';').unwrap_or((cookie, ""));
            pair.split_once('=').and_then(|(key, value)| (key.trim() == name).then_some(value))
        })
    }

    pub(crate) fn text(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.body)
    }
}

/// One connection to the server.
pub(crate) struct Connection {
    sender: Sender,
}

impl Connection {
    pub(crate) async fn open(address: SocketAddr) -> anyhow::Result<Connection> {
        Ok(Connection { sender: crate::http::open(address).await? })
    }

    /// Sends a request: a GET without `body`, else a POST of `body` with
    /// its content type; `cookie` and `bearer` go in their headers.
    async fn send(
        &mut self,
        path: &str,
        body: Option<(&str, String)>,
        cookie: Option<String>,
        bearer: Option<&str>,
    ) -> anyhow::Result<Answer> {
        self.sender.ready().await?;
        let mut request = Request::builder().uri(path).header("host", "127.0.0.1");
        if let Some(cookie) = cookie {
            request = request.header("cookie", cookie);
        }
        if let Some(token) = bearer {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        let request = match body {
            None => request.method("GET").body(Full::new(Bytes::new()))?,
            Some((content_type, body)) => {
                request.method("POST").header("content-type", content_type).body(Full::new(Bytes::from(body)))?
            }
        };
        let response = self.sender.send_request(request).await?;
        let status = response.status().as_u16();
        let set_cookies = response
            .headers()
            .get_all(SET_COOKIE)
            .iter()
            .filter_map(|value| value.to_str().ok().map(str::to_owned))
            .collect();
        let body = response.into_body().collect().await?.to_bytes();
        Ok(Answer { status, set_cookies, body })
    }

    /// A JSON POST with the admin token; `Ok` only for the `expected` status.
    pub(crate) async fn post_json(
        &mut self,
        token: &str,
        path: &str,
        body: String,
        expected: u16,
    ) -> anyhow::Result<Answer> {
        let answer = self.send(path, Some(("application/json", body)), None, Some(token)).await?;
        if answer.status != expected {
            bail!("POST {path}: {} {}", answer.status, answer.text());
        }
        Ok(answer)
    }

    /// Signs in to the console with `token`, as a browser does: the form
    /// sets its cookie and carries its CSRF token, and the POST of both
    /// answers 303 with the session cookie.
    pub(crate) async fn sign_in(mut self, token: &str) -> anyhow::Result<Console> {
        let form = self.send("/console/sign-in", None, None, None).await?;
        if form.status != 200 {
            bail!("GET /console/sign-in: {} {}", form.status, form.text());
        }
        let nonce = form.cookie(SIGN_IN_COOKIE).context("the sign-in form sets no sign-in cookie")?.to_owned();
        let csrf = hidden_csrf(&form.text()).context("the sign-in form has no CSRF token")?;
        let body = format!("csrf={}&token={}", form_component(&csrf), form_component(token));
        let cookie = format!("{SIGN_IN_COOKIE}={nonce}");
        let signed = self
            .send("/console/sign-in", Some(("application/x-www-form-urlencoded", body)), Some(cookie), None)
            .await?;
        if signed.status != 303 {
            bail!("POST /console/sign-in: {} {}", signed.status, signed.text());
        }
        let session = signed.cookie(SESSION_COOKIE).filter(|value| !value.is_empty());
        let session = session.context("signing in set no session cookie")?.to_owned();
        Ok(Console { connection: self, cookie: format!("{SESSION_COOKIE}={session}") })
    }
}

/// A connection signed in to the console.
pub(crate) struct Console {
    connection: Connection,
    cookie: String,
}

impl Console {
    /// GETs a console page with the session cookie.
    pub(crate) async fn get(&mut self, path: &str) -> anyhow::Result<Answer> {
        let cookie = self.cookie.clone();
        self.connection.send(path, None, Some(cookie), None).await
    }
}

/// The value of the form's hidden `csrf` input.
fn hidden_csrf(page: &str) -> Option<String> {
    let marker = r#"name="csrf" value=""#;
    let start = page.find(marker)? + marker.len();
    let end = page[start..].find('"')?;
    Some(page[start..start + end].to_owned())
}

/// `value` percent-encoded for an `application/x-www-form-urlencoded` body.
fn form_component(value: &str) -> String {
    let mut encoded = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'*') {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

/// The number a page shows right after `marker`, such as
/// `data-counter="credited">`.
pub(crate) fn number_after(page: &str, marker: &str) -> Option<u64> {
    let start = page.find(marker)? + marker.len();
    let digits: String = page[start..].chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_form_and_its_fields_are_read_as_the_server_writes_them() {
        let page = r#"<form><input type="hidden" name="csrf" value="0a1b"><input name="token"></form>"#;
        assert_eq!(hidden_csrf(page).as_deref(), Some("0a1b"));
        assert_eq!(hidden_csrf("<form></form>"), None);
        assert_eq!(form_component("bench-token_0.1 +&="), "bench-token_0.1%20%2B%26%3D");
        let counters = r#"<dd data-counter="credited">5000</dd><td class="num" id="usage-events">12</td>"#;
        assert_eq!(number_after(counters, r#"data-counter="credited">"#), Some(5000));
        assert_eq!(number_after(counters, r#"id="usage-events">"#), Some(12));
        assert_eq!(number_after(counters, r#"data-counter="reserved">"#), None);
    }

    #[test]
    fn a_cookie_is_read_from_its_set_cookie_value() {
        let answer = Answer {
            status: 303,
            set_cookies: vec![
                "tollgate_session=admin.1.2.3; Path=/console; HttpOnly".to_owned(),
                "tollgate_sign_in=; Path=/console; Max-Age=0".to_owned(),
            ],
            body: Bytes::new(),
        };
        assert_eq!(answer.cookie(SESSION_COOKIE), Some("admin.1.2.3"));
        assert_eq!(answer.cookie(SIGN_IN_COOKIE), Some(""));
        assert_eq!(answer.cookie("other"), None);
    }
}
