//! Lease ids as the memory store issues and keys them: `lse_` and 32
//! lowercase hex digits, stored as the number they spell.

/// The prefix of every lease id `new_lease_id` makes; 32 lowercase hex digits
/// follow it.
const LEASE_ID_PREFIX: &str = "lse_";
const LEASE_ID_HEX_DIGITS: usize = 32;

/// A lease id as stored: the number its hex digits spell. Fixed-width
/// lowercase hex orders like the number, so ordering by key is ordering by id.
pub(super) type LeaseKey = u128;

/// The key of a lease id this store could have issued, or `None` for any
/// other string, which therefore names no lease.
pub(super) fn lease_key(lease_id: &str) -> Option<LeaseKey> {
    let digits = lease_id.strip_prefix(LEASE_ID_PREFIX)?;
    let lowercase_hex = |b: &u8| b.is_ascii_digit() || (b'a'..=b'f').contains(b);
    if digits.len() != LEASE_ID_HEX_DIGITS || !digits.as_bytes().iter().all(lowercase_hex) {
        return None;
    }
    LeaseKey::from_str_radix(digits, 16).ok()
}

pub(super) fn lease_id_of(key: LeaseKey) -> String {
    format!("{LEASE_ID_PREFIX}{key:032x}")
}
