//! Random identifiers and secrets. Secrets carry 256 bits from the operating
//! system's generator; the stores keep only their SHA-256 hashes.

use tollgate_core::{CREDENTIAL_KEY_PREFIX, Secret};

fn random_hex() -> String {
    hex::encode(rand::random::<[u8; 32]>())
}

pub fn new_capability() -> Secret {
    Secret::new(format!("tgc_{}", random_hex()))
}

/// A credential key of `account_id`: `tgk_{account_id}_{64 lowercase hex}`.
/// The account part routes a presented key to its account
/// (`tollgate_core::route_credential_key`); the secret is the hex part.
pub fn new_credential_key(account_id: &str) -> Secret {
    Secret::new(format!("{CREDENTIAL_KEY_PREFIX}{account_id}_{}", random_hex()))
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
