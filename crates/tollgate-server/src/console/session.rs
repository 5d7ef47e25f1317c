//! Console sessions and CSRF tokens, signed and never stored.
//!
//! Signing in exchanges an operator token for a session cookie
//! `{role}.{expires}.{nonce}.{mac}`: the MAC is HMAC-SHA256 under the
//! console key ([`OperatorTokens::console_key`]) over the role, the expiry,
//! the nonce and the stored hash of the role's token. So a session needs no
//! server-side table (every server with the same tokens accepts it), it
//! expires on its own, and replacing the token that opened it, or the admin
//! token, ends it. Signing out clears the cookie in that browser; a copied
//! cookie stays valid until it expires ([`SESSION_TTL`]).
//!
//! Each form carries a CSRF token, an HMAC of the session cookie under its
//! own label: a page of another origin can neither read it nor compute it.
//! The sign-in form, which comes before any session, is bound the same way
//! to a random cookie of its own. Cookies are `HttpOnly`, `SameSite=Strict`,
//! scoped to `/console`, and `Secure` when the request came over TLS through
//! a proxy (`X-Forwarded-Proto: https`).

use axum::http::HeaderMap;
use axum::http::header::COOKIE;
use hmac::{Hmac, Mac};
use jiff::{SignedDuration, Timestamp};
use sha2::Sha256;

use crate::auth::{OperatorTokens, Role};

/// The session cookie's name.
pub(crate) const SESSION_COOKIE: &str = "tollgate_session";
/// The cookie the sign-in form's CSRF token is bound to.
pub(crate) const SIGN_IN_COOKIE: &str = "tollgate_sign_in";
/// How long a session lasts after signing in.
pub(crate) const SESSION_TTL: SignedDuration = SignedDuration::from_hours(8);
/// How long a sign-in form stays valid.
pub(crate) const SIGN_IN_TTL: SignedDuration = SignedDuration::from_hours(1);

/// A signed-in operator.
#[derive(Debug, Clone)]
pub(crate) struct Session {
    pub(crate) role: Role,
    pub(crate) expires: Timestamp,
    /// The cookie's value, which the session's CSRF tokens are derived from.
    cookie: String,
}

impl Session {
    /// A new session of `role`, signed for [`SESSION_TTL`] from `now`.
    pub(crate) fn open(tokens: &OperatorTokens, role: Role, now: Timestamp) -> Option<Session> {
        let expires = now.checked_add(SESSION_TTL).ok()?;
        let nonce = hex::encode(rand::random::<[u8; 16]>());
        let body = format!("{}.{}.{nonce}", role_code(role), expires.as_second());
        let mac = hex::encode(session_mac(tokens, role, &body)?.finalize().into_bytes());
        Some(Session { role, expires, cookie: format!("{body}.{mac}") })
    }

    /// The session a cookie value proves, if its MAC holds, its role's token
    /// is still configured and it has not expired.
    pub(crate) fn verify(tokens: &OperatorTokens, cookie: &str, now: Timestamp) -> Option<Session> {
        let (body, mac) = cookie.rsplit_once('.')?;
        let mut fields = body.split('.');
        let role = role_of_code(fields.next()?)?;
        let expires = Timestamp::from_second(fields.next()?.parse().ok()?).ok()?;
        let nonce = fields.next()?;
        if fields.next().is_some() || nonce.len() != 32 || expires <= now {
            return None;
        }
        session_mac(tokens, role, body)?.verify_slice(&hex::decode(mac).ok()?).ok()?;
        Some(Session { role, expires, cookie: cookie.to_owned() })
    }

    pub(crate) fn cookie(&self) -> &str {
        &self.cookie
    }

    /// The CSRF token every form of this session carries.
    pub(crate) fn csrf(&self, tokens: &OperatorTokens) -> String {
        csrf_token(tokens, "session", &self.cookie)
    }

    /// Whether `presented` is this session's CSRF token.
    pub(crate) fn csrf_holds(&self, tokens: &OperatorTokens, presented: &str) -> bool {
        csrf_holds(tokens, "session", &self.cookie, presented)
    }

    pub(crate) fn can_change(&self) -> bool {
        self.role == Role::Admin
    }
}

/// A fresh value for the sign-in cookie: its expiry and a nonce.
pub(crate) fn new_sign_in_nonce(now: Timestamp) -> String {
    let expires = now.checked_add(SIGN_IN_TTL).map_or(0, |at| at.as_second());
    format!("{expires}.{}", hex::encode(rand::random::<[u8; 16]>()))
}

/// The CSRF token of the sign-in form bound to `nonce`.
pub(crate) fn sign_in_csrf(tokens: &OperatorTokens, nonce: &str) -> String {
    csrf_token(tokens, "sign-in", nonce)
}

/// Whether `presented` is the sign-in form's token for `nonce`, and `nonce`
/// has not expired.
pub(crate) fn sign_in_csrf_holds(tokens: &OperatorTokens, nonce: &str, presented: &str, now: Timestamp) -> bool {
    let fresh = nonce
        .split_once('.')
        .and_then(|(expires, _)| expires.parse::<i64>().ok())
        .is_some_and(|expires| expires > now.as_second());
    fresh && csrf_holds(tokens, "sign-in", nonce, presented)
}

/// The value of cookie `name` in the request's `Cookie` headers.
pub(crate) fn cookie_value<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find_map(|(key, value)| (key == name).then_some(value))
}

/// Whether the request came over TLS through a proxy that says so.
pub(crate) fn behind_tls(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|value| value.to_str().ok())
        .is_some_and(|proto| proto.trim().eq_ignore_ascii_case("https"))
}

/// A `Set-Cookie` value for a console cookie; `max_age` 0 clears it.
pub(crate) fn set_cookie(name: &str, value: &str, max_age: SignedDuration, secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    format!("{name}={value}; Path=/console; Max-Age={}; HttpOnly; SameSite=Strict{secure}", max_age.as_secs())
}

type HmacSha256 = Hmac<Sha256>;

fn keyed(tokens: &OperatorTokens, label: &str) -> HmacSha256 {
    // HMAC takes a key of any length, so this cannot fail.
    let mut mac = <HmacSha256 as Mac>::new_from_slice(tokens.console_key()).unwrap_or_else(|_| unreachable!());
    mac.update(label.as_bytes());
    mac.update(b"\0");
    mac
}

fn session_mac(tokens: &OperatorTokens, role: Role, body: &str) -> Option<HmacSha256> {
    let mut mac = keyed(tokens, "session");
    mac.update(tokens.hash_of(role)?.as_bytes());
    mac.update(body.as_bytes());
    Some(mac)
}

fn csrf_mac(tokens: &OperatorTokens, label: &str, bound_to: &str) -> HmacSha256 {
    let mut mac = keyed(tokens, label);
    mac.update(b"csrf\0");
    mac.update(bound_to.as_bytes());
    mac
}

fn csrf_token(tokens: &OperatorTokens, label: &str, bound_to: &str) -> String {
    hex::encode(csrf_mac(tokens, label, bound_to).finalize().into_bytes())
}

fn csrf_holds(tokens: &OperatorTokens, label: &str, bound_to: &str, presented: &str) -> bool {
    let Ok(presented) = hex::decode(presented) else { return false };
    csrf_mac(tokens, label, bound_to).verify_slice(&presented).is_ok()
}

fn role_code(role: Role) -> &'static str {
    match role {
        Role::Admin => "admin",
        Role::Gateway => "gateway",
        Role::Viewer => "viewer",
    }
}

fn role_of_code(code: &str) -> Option<Role> {
    match code {
        "admin" => Some(Role::Admin),
        "viewer" => Some(Role::Viewer),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use tollgate_core::Secret;

    use super::*;

    fn tokens(admin: &str) -> OperatorTokens {
        OperatorTokens::new(&Secret::new(admin.into()), None)
            .unwrap()
            .with_viewer(&Secret::new("viewer-token-0123456789".into()))
            .unwrap()
    }

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(second).unwrap()
    }

    #[test]
    fn a_session_verifies_until_it_expires_and_only_under_its_tokens() {
        let tokens = tokens("admin-token-0123456789");
        let session = Session::open(&tokens, Role::Viewer, at(1_000)).unwrap();
        let verified = Session::verify(&tokens, session.cookie(), at(1_001)).unwrap();
        assert_eq!(verified.role, Role::Viewer);
        let expiry = at(1_000).checked_add(SESSION_TTL).unwrap();
        assert!(Session::verify(&tokens, session.cookie(), expiry).is_none());
        assert!(Session::verify(&self::tokens("admin-token-9876543210"), session.cookie(), at(1_001)).is_none());
        let without_viewer = OperatorTokens::new(&Secret::new("admin-token-0123456789".into()), None).unwrap();
        assert!(Session::verify(&without_viewer, session.cookie(), at(1_001)).is_none());
    }

    #[test]
    fn an_altered_session_is_refused() {
        let tokens = tokens("admin-token-0123456789");
        let cookie = Session::open(&tokens, Role::Viewer, at(1_000)).unwrap().cookie().to_owned();
        let promoted = cookie.replacen("viewer", "admin", 1);
        assert!(Session::verify(&tokens, &promoted, at(1_001)).is_none());
        let (body, _) = cookie.rsplit_once('.').unwrap();
        let (prefix, expiry_and_nonce) = body.split_once('.').unwrap();
        let (_, nonce) = expiry_and_nonce.split_once('.').unwrap();
        let extended = format!("{prefix}.99999999999.{nonce}.{}", cookie.rsplit_once('.').unwrap().1);
        assert!(Session::verify(&tokens, &extended, at(1_001)).is_none());
        assert!(Session::verify(&tokens, "", at(1_001)).is_none());
        assert!(Session::verify(&tokens, "admin.1.2.3.4", at(0)).is_none());
    }

    #[test]
    fn csrf_tokens_are_bound_to_their_session() {
        let tokens = tokens("admin-token-0123456789");
        let one = Session::open(&tokens, Role::Admin, at(1_000)).unwrap();
        let two = Session::open(&tokens, Role::Admin, at(1_000)).unwrap();
        assert!(one.csrf_holds(&tokens, &one.csrf(&tokens)));
        assert!(!one.csrf_holds(&tokens, &two.csrf(&tokens)));
        assert!(!one.csrf_holds(&tokens, ""));
        assert!(!one.csrf_holds(&tokens, "not hex"));
        assert!(one.can_change());
    }

    #[test]
    fn the_sign_in_token_is_bound_to_its_fresh_cookie() {
        let tokens = tokens("admin-token-0123456789");
        let nonce = new_sign_in_nonce(at(1_000));
        let token = sign_in_csrf(&tokens, &nonce);
        assert!(sign_in_csrf_holds(&tokens, &nonce, &token, at(1_001)));
        assert!(!sign_in_csrf_holds(&tokens, &new_sign_in_nonce(at(1_000)), &token, at(1_001)));
        let expired = at(1_000).checked_add(SIGN_IN_TTL).unwrap();
        assert!(!sign_in_csrf_holds(&tokens, &nonce, &token, expired));
    }

    #[test]
    fn cookies_are_read_by_name_and_written_strict() {
        let mut headers = HeaderMap::new();
        headers.append(COOKIE, "a=1; tollgate_session=abc".parse().unwrap());
        headers.append(COOKIE, "b=2".parse().unwrap());
        assert_eq!(cookie_value(&headers, SESSION_COOKIE), Some("abc"));
        assert_eq!(cookie_value(&headers, "b"), Some("2"));
        assert_eq!(cookie_value(&headers, "c"), None);
        let cookie = set_cookie(SESSION_COOKIE, "v", SESSION_TTL, true);
        assert_eq!(cookie, "tollgate_session=v; Path=/console; Max-Age=28800; HttpOnly; SameSite=Strict; Secure");
        headers.insert("x-forwarded-proto", "HTTPS".parse().unwrap());
        assert!(behind_tls(&headers));
    }
}
