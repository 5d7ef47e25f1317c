//! Random identifiers and secrets. Secrets carry 256 bits from the operating
//! system's generator; the stores keep only their SHA-256 hashes.

use tollgate_core::{CREDENTIAL_KEY_PREFIX, Secret};

/// `prefix` followed by 256 random bits as 64 lowercase hex digits.
pub(crate) fn random_hex_after(prefix: &str) -> String {
    hex_after(prefix, &rand::random::<[u8; 32]>())
}

/// `prefix` followed by `bytes` (at most 32) as lowercase hex digits.
pub(crate) fn hex_after(prefix: &str, bytes: &[u8]) -> String {
    let mut buffer = [0u8; 64];
    let digits = &mut buffer[..2 * bytes.len()];
    hex::encode_to_slice(bytes, digits).expect("two digits per byte, at most 32 bytes");
    let mut text = String::with_capacity(prefix.len() + digits.len());
    text.push_str(prefix);
    text.extend(digits.iter().map(|&digit| char::from(digit)));
    text
}

pub fn new_capability() -> Secret {
    Secret::new(random_hex_after("tgc_"))
}

/// A credential key of `account_id`: `tgk_{account_id}_{64 lowercase hex}`.
/// The account part routes a presented key to its account
/// (`tollgate_core::route_credential_key`); the secret is the hex part.
pub fn new_credential_key(account_id: &str) -> Secret {
    Secret::new(random_hex_after(&format!("{CREDENTIAL_KEY_PREFIX}{account_id}_")))
}

pub fn new_lease_id() -> String {
    format!("lse_{}", uuid::Uuid::new_v4().simple())
}

pub fn new_credential_id() -> String {
    format!("cred_{}", uuid::Uuid::new_v4().simple())
}

#[cfg(test)]
mod tests {
    use tollgate_core::{KeyRoute, route_credential_key};

    use super::*;

    #[test]
    fn new_keys_route_to_their_account_and_differ() {
        for account in ["acme", "a_b", "A.b_c:d-9"] {
            let (first, second) = (new_credential_key(account), new_credential_key(account));
            assert_eq!(route_credential_key(first.expose()), KeyRoute::Account(account));
            assert_ne!(first, second);
        }
    }
}
