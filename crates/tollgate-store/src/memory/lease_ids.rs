//! Lease ids as the memory store issues and keys them: `lse_` and 32
//! lowercase hex digits, stored as the number they spell.

/// The prefix of every lease id (`new_lease_key`, `crate::new_lease_id`); 32 lowercase hex digits
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

/// A fresh random key: a version 4 UUID, whose simple form is the hex digits
/// of the id it spells.
pub(super) fn new_lease_key() -> LeaseKey {
    uuid::Uuid::new_v4().as_u128()
}

pub(super) fn lease_id_of(key: LeaseKey) -> String {
    format!("{LEASE_ID_PREFIX}{key:032x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_ids_this_store_issues_have_keys_and_keys_spell_them_back() {
        for key in [0, 1, 0xabc, LeaseKey::MAX, 0x0123_4567_89ab_cdef_fedc_ba98_7654_3210] {
            assert_eq!(lease_key(&lease_id_of(key)), Some(key));
        }
        let issued = lease_id_of(new_lease_key());
        assert_eq!(issued.len(), "lse_".len() + 32);
        assert_eq!(lease_key(&issued).map(lease_id_of), Some(issued));
        let issued = crate::new_lease_id();
        assert_eq!(lease_key(&issued).map(lease_id_of), Some(issued));
        let digits = "0123456789abcdef0123456789abcdef";
        assert_eq!(lease_key(&format!("lse_{digits}")), Some(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef));
        for other in [
            format!("lse_{}", digits.to_uppercase()),
            format!("lse_{}", &digits[1..]),
            format!("lse_{digits}0"),
            format!("lsx_{digits}"),
            format!("lse_{}g", &digits[1..]),
            format!("lse_{}+", &digits[1..]),
            String::new(),
        ] {
            assert_eq!(lease_key(&other), None, "{other}");
        }
    }
}
