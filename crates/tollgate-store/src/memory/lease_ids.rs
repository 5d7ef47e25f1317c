//! Lease ids as the memory store issues and keys them: `lse_` and 32
//! lowercase hex digits, stored as the number they spell.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

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
    if digits.len() != LEASE_ID_HEX_DIGITS {
        return None;
    }
    digits.bytes().try_fold(0, |key: LeaseKey, digit| {
        let value = match digit {
            b'0'..=b'9' => digit - b'0',
            b'a'..=b'f' => digit - b'a' + 10,
            _ => return None,
        };
        Some(key << 4 | LeaseKey::from(value))
    })
}

/// A fresh random key: a version 4 UUID, whose simple form is the hex digits
/// of the id it spells.
pub(super) fn new_lease_key() -> LeaseKey {
    uuid::Uuid::new_v4().as_u128()
}

pub(super) fn lease_id_of(key: LeaseKey) -> String {
    crate::secrets::hex_after(LEASE_ID_PREFIX, &key.to_be_bytes())
}

/// A map keyed by lease keys, hashed by folding the key's two halves.
///
/// Keys are drawn at random by this store (`new_lease_key`), never chosen by
/// a caller: a presented id that is not a stored key only misses. So the
/// bits are already uniform, and no caller can pile keys into one bucket,
/// which is what a keyed hash like the standard SipHash defends against.
pub(super) type LeaseMap<V> = HashMap<LeaseKey, V, BuildHasherDefault<FoldHasher>>;

#[derive(Default)]
pub(super) struct FoldHasher(u64);

impl Hasher for FoldHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write_u128(&mut self, key: u128) {
        self.0 ^= (key as u64) ^ ((key >> 64) as u64);
    }

    /// Only `u128` keys are hashed here; any other input is still hashed,
    /// a byte at a time.
    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(byte);
        }
    }
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
