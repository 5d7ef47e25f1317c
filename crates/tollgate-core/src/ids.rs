//! Identifier rules shared by every store and the HTTP paths.

use crate::error::Error;

/// The longest identifier, in characters.
pub const ID_CHARS_MAX: usize = 128;
/// The longest credential label, in characters.
pub const LABEL_CHARS_MAX: usize = 256;

/// Checks that `value` is 1 to 128 characters of `A-Z a-z 0-9 . _ : -`, which keeps
/// identifiers safe in URL paths, logs and SQL without escaping.
pub fn validate_id(field: &'static str, value: &str) -> Result<(), Error> {
    let well_formed = !value.is_empty()
        && value.len() <= ID_CHARS_MAX
        && value.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'));
    if well_formed { Ok(()) } else { Err(Error::InvalidId { field }) }
}

/// Checks a credential label: text of at most 256 characters without NUL, which
/// no PostgreSQL text column can hold.
pub fn validate_label(label: &str) -> Result<(), Error> {
    if label.chars().count() <= LABEL_CHARS_MAX && !label.contains('\0') { Ok(()) } else { Err(Error::InvalidLabel) }
}

/// A usage request ID is 1 to 128 characters of any kind but NUL. NUL is refused
/// because PostgreSQL text cannot store it: an event the memory store accepted
/// would otherwise fail every retry on PostgreSQL.
pub fn is_valid_request_id(request_id: &str) -> bool {
    let chars = request_id.chars().count();
    (1..=ID_CHARS_MAX).contains(&chars) && !request_id.contains('\0')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_bounded_and_url_safe() {
        let max = "a".repeat(ID_CHARS_MAX);
        let over = "a".repeat(ID_CHARS_MAX + 1);
        for ok in ["a", "acct-1", "A.b_c:d-9", max.as_str()] {
            assert_eq!(validate_id("account_id", ok), Ok(()), "{ok}");
        }
        for bad in ["", "a b", "a/b", "é", over.as_str()] {
            assert_eq!(validate_id("account_id", bad), Err(Error::InvalidId { field: "account_id" }), "{bad}");
        }
        assert_eq!(validate_label(&"é".repeat(LABEL_CHARS_MAX)), Ok(()));
        assert_eq!(validate_label(&"é".repeat(LABEL_CHARS_MAX + 1)), Err(Error::InvalidLabel));
        assert!(is_valid_request_id(&"é".repeat(ID_CHARS_MAX)));
        assert!(!is_valid_request_id(&"é".repeat(ID_CHARS_MAX + 1)));
        assert!(is_valid_request_id("x"));
        assert!(!is_valid_request_id("a\0b"));
        assert_eq!(validate_label("a\0b"), Err(Error::InvalidLabel));
        assert!(!is_valid_request_id(""));
    }
}
