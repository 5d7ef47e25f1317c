//! Random identifiers and secrets. Secrets carry 256 bits from the operating
//! system's generator; the stores keep only their SHA-256 hashes.

use tollgate_core::Secret;

fn random_hex() -> String {
    hex::encode(rand::random::<[u8; 32]>())
}

pub fn new_capability() -> Secret {
    Secret::new(format!("tgc_{}", random_hex()))
}

pub fn new_credential_key() -> Secret {
    Secret::new(format!("tgk_{}", random_hex()))
}

pub fn new_lease_id() -> String {
    format!("lse_{}", uuid::Uuid::new_v4().simple())
}

pub fn new_credential_id() -> String {
    format!("cred_{}", uuid::Uuid::new_v4().simple())
}
