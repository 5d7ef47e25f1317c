//! The frame every console page shares, and the small formatting rules the
//! pages agree on (times in UTC to the second, durations in words, paths
//! with their segments escaped).

use axum::http::StatusCode;
use jiff::{SignedDuration, Timestamp};
use maud::{DOCTYPE, Markup, html};

use super::extract::Signed;
use crate::auth::Role;

/// A whole page: the header with the navigation and the session's role and
/// sign-out form, then `body`.
pub(crate) fn page(title: &str, signed: Option<&Signed>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · Tollgate" }
                link rel="stylesheet" href="/console/console.css";
            }
            body {
                a.skip href="#main" { "Skip to content" }
                header {
                    nav aria-label="Console" {
                        a.brand href="/console/accounts" { "Tollgate" }
                        @if signed.is_some() {
                            a href="/console/accounts" { "Accounts" }
                            a href="/console/fleet" { "Fleet" }
                            a href="/console/webhooks" { "Webhooks" }
                        }
                    }
                    @if let Some(signed) = signed {
                        form.sign-out method="post" action="/console/sign-out" {
                            span #role data-role=(role_name(signed.session.role))
                                title={"The session ends at " (time(signed.session.expires))} {
                                "Signed in as " (role_name(signed.session.role))
                            }
                            input type="hidden" name="csrf" value=(signed.csrf);
                            button type="submit" { "Sign out" }
                        }
                    }
                }
                main #main { (body) }
            }
        }
    }
}

pub(crate) fn role_name(role: Role) -> &'static str {
    match role {
        Role::Admin => "admin",
        Role::Gateway => "gateway",
        Role::Viewer => "viewer",
    }
}

/// The sign-in page, with a problem from the last attempt if there was one.
pub(crate) fn sign_in(csrf: &str, problem: Option<&str>, has_viewer: bool) -> Markup {
    let body = html! {
        h1 { "Sign in" }
        @if let Some(problem) = problem {
            p.problem role="alert" { (problem) }
        }
        form #sign-in method="post" action="/console/sign-in" {
            input type="hidden" name="csrf" value=(csrf);
            label for="token" { @if has_viewer { "Admin or viewer token" } @else { "Admin token" } }
            input #token type="password" name="token" autocomplete="current-password" required autofocus;
            button #sign-in-button type="submit" { "Sign in" }
        }
        p.hint { "The token is exchanged for a session cookie that lasts eight hours; it is not stored." }
    };
    page("Sign in", None, body)
}

/// A page that says why a request was refused.
pub(crate) fn problem(status: StatusCode, problem: &str, signed: Option<&Signed>) -> Markup {
    let body = html! {
        h1 { (status.as_u16()) " " (status.canonical_reason().unwrap_or("")) }
        p.problem #problem role="alert" { (problem) }
        p { a href="/console/accounts" { "Back to the accounts" } }
    };
    page("Refused", signed, body)
}

/// A table that scrolls sideways on a narrow screen: `head` is its header
/// row's cells, `rows` its body rows.
pub(crate) fn scrolling_table(head: Markup, rows: Markup) -> Markup {
    html! { div.scroll { table { thead { tr { (head) } } tbody { (rows) } } } }
}

/// An instant as `2026-12-01 21:18:46Z`, to the second.
pub(crate) fn time(at: Timestamp) -> String {
    at.strftime("%Y-%m-%d %H:%M:%SZ").to_string()
}

/// A `<time>` element with the exact instant in its `datetime`.
pub(crate) fn time_element(at: Timestamp) -> Markup {
    html! { time datetime=(at.to_string()) { (time(at)) } }
}

/// A duration in its two largest units: `3 h 12 min`, `45 s`; negative
/// durations read `… ago`.
pub(crate) fn duration(span: SignedDuration) -> String {
    let seconds = span.as_secs().unsigned_abs();
    let (days, hours, minutes, secs) = (seconds / 86_400, seconds / 3_600 % 24, seconds / 60 % 60, seconds % 60);
    let text = match (days, hours, minutes) {
        (0, 0, 0) => format!("{secs} s"),
        (0, 0, _) => format!("{minutes} min {secs} s"),
        (0, _, _) => format!("{hours} h {minutes} min"),
        _ => format!("{days} d {hours} h"),
    };
    if span.is_negative() { format!("{text} ago") } else { text }
}

/// A path segment with everything but `A-Z a-z 0-9 - . _ ~` percent-encoded.
pub(crate) fn segment(text: &str) -> String {
    let mut encoded = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

/// The account page's path.
pub(crate) fn account_path(account_id: &str) -> String {
    format!("/console/accounts/{}", segment(account_id))
}

/// A query string from pairs, each value encoded.
pub(crate) fn query(pairs: &[(&str, &str)]) -> String {
    let mut serializer = form_urlencoded::Serializer::new(String::new());
    for (key, value) in pairs {
        serializer.append_pair(key, value);
    }
    serializer.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_in_their_two_largest_units() {
        assert_eq!(duration(SignedDuration::from_secs(45)), "45 s");
        assert_eq!(duration(SignedDuration::from_secs(125)), "2 min 5 s");
        assert_eq!(duration(SignedDuration::from_secs(3 * 3600 + 12 * 60 + 9)), "3 h 12 min");
        assert_eq!(duration(SignedDuration::from_secs(2 * 86_400 + 3600)), "2 d 1 h");
        assert_eq!(duration(SignedDuration::from_secs(-30)), "30 s ago");
    }

    #[test]
    fn segments_and_queries_are_encoded() {
        assert_eq!(segment("acme:eu-1"), "acme%3Aeu-1");
        assert_eq!(account_path("a b/c"), "/console/accounts/a%20b%2Fc");
        assert_eq!(query(&[("prefix", "<b>&"), ("by", "dimension:model")]), "prefix=%3Cb%3E%26&by=dimension%3Amodel");
    }

    #[test]
    fn a_problem_page_escapes_its_text() {
        let html = problem(StatusCode::FORBIDDEN, "<script>x</script>", None).into_string();
        assert!(html.contains("&lt;script&gt;x&lt;/script&gt;"), "{html}");
        assert!(!html.contains("<script>"), "{html}");
    }
}
