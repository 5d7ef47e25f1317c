//! Pages of a listing: the limit of one page and the cursor that resumes it.
//!
//! Every listing is in a stable order over a key that never changes once a row
//! exists (an id, or an instant and an id). A page ends at a row; the cursor
//! names that row's key, and the next page starts strictly after it. Rows
//! inserted while a client pages therefore never make it skip or repeat one:
//! each row is either before the cursor (seen) or after it (still to come).
//!
//! A cursor is opaque to clients but not secret. It carries the key of the
//! last row and a digest of its scope, the listing and every parameter that
//! shapes it (account, filters, range). A cursor presented to another listing,
//! another account or the same listing with other parameters is refused with
//! `invalid_cursor`, never read as a position in the wrong order. Altering a
//! cursor's position by hand only moves where the page starts; it cannot widen
//! the scope, which the store still applies.

use sha2::{Digest, Sha256};

use crate::error::Error;

/// How many rows a page holds: 1 to [`PageLimit::MAX`], [`PageLimit::DEFAULT`]
/// when the request names none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageLimit(u32);

impl PageLimit {
    pub const DEFAULT: u32 = 100;
    pub const MAX: u32 = 1_000;

    /// The limit a request asked for; `None` means the default.
    pub fn new(requested: Option<u32>) -> Result<Self, Error> {
        match requested {
            None => Ok(Self(Self::DEFAULT)),
            Some(limit) if (1..=Self::MAX).contains(&limit) => Ok(Self(limit)),
            Some(limit) => Err(Error::InvalidLimit { limit, max: Self::MAX }),
        }
    }

    pub fn get(self) -> u32 {
        self.0
    }

    /// The limit as a `usize`, for slicing and capacities.
    pub fn rows(self) -> usize {
        // A u32 always fits a usize on the platforms Tollgate builds for.
        self.0 as usize
    }
}

impl Default for PageLimit {
    fn default() -> Self {
        Self(Self::DEFAULT)
    }
}

/// The scope a cursor belongs to: the listing's name and every parameter that
/// shapes its rows, in a fixed order. Two scopes are equal only when the
/// listing, the account and every filter are.
#[derive(Debug, Clone)]
pub struct Scope {
    digest: [u8; SCOPE_DIGEST_BYTES],
}

const SCOPE_DIGEST_BYTES: usize = 8;
const CURSOR_VERSION: &str = "c1";
/// Separates the cursor's fields; a field is hex, so it never contains one.
const FIELD_SEPARATOR: char = '.';

impl Scope {
    /// The scope of `listing` with `parameters` (e.g. the account id, then each
    /// filter's value or `""` when absent). Parameters are length-prefixed, so
    /// `["ab", "c"]` and `["a", "bc"]` are different scopes.
    pub fn new(listing: &str, parameters: &[&str]) -> Self {
        let mut hasher = Sha256::new();
        for part in std::iter::once(listing).chain(parameters.iter().copied()) {
            hasher.update((part.len() as u64).to_be_bytes());
            hasher.update(part.as_bytes());
        }
        let full: [u8; 32] = hasher.finalize().into();
        let mut digest = [0; SCOPE_DIGEST_BYTES];
        digest.copy_from_slice(&full[..SCOPE_DIGEST_BYTES]);
        Self { digest }
    }

    /// The cursor that resumes this listing after the row whose key is `key`
    /// (its fields in the listing's order).
    pub fn cursor_after(&self, key: &[&str]) -> String {
        let mut cursor = format!("{CURSOR_VERSION}{FIELD_SEPARATOR}{}", hex(&self.digest));
        for field in key {
            cursor.push(FIELD_SEPARATOR);
            cursor.push_str(&hex(field.as_bytes()));
        }
        cursor
    }

    /// The key a cursor of this scope resumes after, with exactly `fields`
    /// fields. A cursor of another scope, of another shape or that is not a
    /// cursor at all is `invalid_cursor`.
    pub fn resume_after(&self, cursor: &str, fields: usize) -> Result<Vec<String>, Error> {
        let invalid = || Error::InvalidCursor;
        let mut parts = cursor.split(FIELD_SEPARATOR);
        if parts.next() != Some(CURSOR_VERSION) {
            return Err(invalid());
        }
        let digest = parts.next().and_then(unhex).ok_or_else(invalid)?;
        if digest != self.digest {
            return Err(invalid());
        }
        let key = parts
            .map(|part| unhex(part).and_then(|bytes| String::from_utf8(bytes).ok()))
            .collect::<Option<Vec<String>>>()
            .ok_or_else(invalid)?;
        if key.len() != fields {
            return Err(invalid());
        }
        Ok(key)
    }
}

/// Where a page starts: at the beginning, or strictly after a key.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Start {
    #[default]
    First,
    After(Vec<String>),
}

impl Start {
    /// Reads an optional cursor of `scope` whose key has `fields` fields.
    pub fn of(scope: &Scope, cursor: Option<&str>, fields: usize) -> Result<Self, Error> {
        match cursor {
            None => Ok(Self::First),
            Some(cursor) => scope.resume_after(cursor, fields).map(Self::After),
        }
    }
}

/// One page of rows and the cursor of the next page, `None` when this page is
/// the last.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub next_cursor: Option<String>,
}

impl<T> Page<T> {
    /// A page from up to `limit + 1` rows fetched in order: the extra row, if
    /// present, only shows that another page follows, and is dropped. `key`
    /// gives a row's key fields for the cursor.
    pub fn from_rows(mut rows: Vec<T>, limit: PageLimit, scope: &Scope, key: impl Fn(&T) -> Vec<String>) -> Self {
        let more = rows.len() > limit.rows();
        rows.truncate(limit.rows());
        let next_cursor = match rows.last() {
            Some(last) if more => {
                let fields = key(last);
                let fields: Vec<&str> = fields.iter().map(String::as_str).collect();
                Some(scope.cursor_after(&fields))
            }
            _ => None,
        };
        Self { items: rows, next_cursor }
    }
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
    out
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    let digit = |b: u8| match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        _ => None,
    };
    text.as_bytes().chunks(2).map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_default_and_bound() {
        assert_eq!(PageLimit::new(None).unwrap().get(), 100);
        assert_eq!(PageLimit::new(Some(1)).unwrap().get(), 1);
        assert_eq!(PageLimit::new(Some(1_000)).unwrap().get(), 1_000);
        assert_eq!(PageLimit::new(Some(0)), Err(Error::InvalidLimit { limit: 0, max: 1_000 }));
        assert_eq!(PageLimit::new(Some(1_001)), Err(Error::InvalidLimit { limit: 1_001, max: 1_000 }));
    }

    #[test]
    fn a_cursor_resumes_its_own_scope_only() {
        let scope = Scope::new("leases", &["acme", "active"]);
        let cursor = scope.cursor_after(&["2026-01-01T00:00:00Z", "lse_1"]);
        assert_eq!(scope.resume_after(&cursor, 2).unwrap(), vec!["2026-01-01T00:00:00Z", "lse_1"]);
        assert_eq!(
            Start::of(&scope, Some(&cursor), 2).unwrap(),
            Start::After(vec!["2026-01-01T00:00:00Z".into(), "lse_1".into()])
        );
        assert_eq!(Start::of(&scope, None, 2).unwrap(), Start::First);
        for other in [
            Scope::new("leases", &["acme", "released"]),
            Scope::new("leases", &["acm", "eactive"]),
            Scope::new("credits", &["acme", "active"]),
        ] {
            assert_eq!(other.resume_after(&cursor, 2), Err(Error::InvalidCursor));
        }
        assert_eq!(scope.resume_after(&cursor, 1), Err(Error::InvalidCursor));
        for garbage in ["", "c1", "c2.00", "c1.zz", &format!("{cursor}.0"), &format!("{cursor}.ff")] {
            assert_eq!(scope.resume_after(garbage, 2), Err(Error::InvalidCursor), "{garbage}");
        }
    }

    #[test]
    fn a_page_has_a_cursor_only_when_more_rows_follow() {
        let scope = Scope::new("accounts", &[]);
        let limit = PageLimit::new(Some(2)).unwrap();
        let key = |row: &&str| vec![(*row).to_owned()];
        let page = Page::from_rows(vec!["a", "b", "c"], limit, &scope, key);
        assert_eq!(page.items, vec!["a", "b"]);
        assert_eq!(scope.resume_after(page.next_cursor.as_deref().unwrap(), 1).unwrap(), vec!["b"]);
        let last = Page::from_rows(vec!["c", "d"], limit, &scope, key);
        assert_eq!((last.items.len(), last.next_cursor), (2, None));
        let empty = Page::from_rows(Vec::<&str>::new(), limit, &scope, key);
        assert_eq!((empty.items.len(), empty.next_cursor), (0, None));
    }
}
