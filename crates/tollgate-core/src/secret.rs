//! Secrets (credential keys, lease capabilities) and their stored hashes.
//!
//! A secret is shown to its holder once and never stored: stores keep its SHA-256
//! hash and compare hashes in constant time. Generating secrets needs randomness,
//! which is I/O, so the stores do it; this module only hashes and compares.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::ids::validate_id;

/// A secret value. Its `Debug` output is redacted so it cannot leak into logs.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: String) -> Self {
        Self(value)
    }

    /// The secret itself, for the one response that shows it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn hash(&self) -> SecretHash {
        SecretHash::of(&self.0)
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// The SHA-256 hash of a secret.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct SecretHash(pub [u8; 32]);

impl SecretHash {
    pub fn of(secret: &str) -> Self {
        Self(Sha256::digest(secret.as_bytes()).into())
    }

    /// Whether `candidate` hashes to this value, compared in constant time.
    pub fn matches(&self, candidate: &str) -> bool {
        self.matches_hash(&Self::of(candidate))
    }

    /// Whether `other`, a candidate's hash, is this value, compared in
    /// constant time: `matches` for a caller that hashed the candidate
    /// beforehand (outside a lock, say).
    pub fn matches_hash(&self, other: &SecretHash) -> bool {
        self.0.ct_eq(&other.0).into()
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Reads a stored hash; `None` unless it is exactly 32 bytes.
    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        <[u8; 32]>::try_from(bytes).ok().map(Self)
    }
}

/// The prefix of every credential key.
pub const CREDENTIAL_KEY_PREFIX: &str = "tgk_";
/// The lowercase hex digits of a credential key's secret part (256 bits).
pub const CREDENTIAL_KEY_SECRET_HEX: usize = 64;

/// Where a presented credential key leads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyRoute<'a> {
    /// `tgk_{account_id}_{64 lowercase hex}`: the key names its account, and
    /// only that account's credentials can match it.
    Account(&'a str),
    /// `tgk_{64 lowercase hex}`: a key issued before keys named their account,
    /// whose account only a directory of those keys knows.
    Legacy,
    /// Anything else: no credential can match it.
    Malformed,
}

/// Reads where a credential key leads, without judging whether it is valid:
/// the account part is only a route, so a key whose route was altered leads to
/// an account whose credentials it does not match. The secret part comes last
/// and has no `_`, so the route is everything between the prefix and the last
/// `_`; account ids may themselves contain `_`.
pub fn route_credential_key(key: &str) -> KeyRoute<'_> {
    let Some(rest) = key.strip_prefix(CREDENTIAL_KEY_PREFIX) else {
        return KeyRoute::Malformed;
    };
    if is_secret_hex(rest) {
        return KeyRoute::Legacy;
    }
    match rest.rsplit_once('_') {
        Some((account_id, secret)) if is_secret_hex(secret) && validate_id("account_id", account_id).is_ok() => {
            KeyRoute::Account(account_id)
        }
        _ => KeyRoute::Malformed,
    }
}

fn is_secret_hex(value: &str) -> bool {
    value.len() == CREDENTIAL_KEY_SECRET_HEX && value.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_route_to_the_account_they_name() {
        let hex = "0123456789abcdef".repeat(4);
        let key = |route: &str| format!("tgk_{route}_{hex}");
        for account in ["acme", "a_b_c", "A.b_c:d-9", "_", "x".repeat(128).as_str()] {
            assert_eq!(route_credential_key(&key(account)), KeyRoute::Account(account), "{account}");
        }
        assert_eq!(route_credential_key(&format!("tgk_{hex}")), KeyRoute::Legacy);
        let upper = hex.to_uppercase();
        let malformed = [
            String::new(),
            "tgk_".to_owned(),
            hex.clone(),
            format!("tgc_acme_{hex}"),
            format!("tgk__{hex}"),
            format!("tgk_{upper}"),
            format!("tgk_acme_{upper}"),
            format!("tgk_acme_{}", &hex[1..]),
            format!("tgk_acme_{hex}0"),
            format!("tgk_acme_{hex}_"),
            format!("tgk_a/b_{hex}"),
            format!("tgk_{}_{hex}", "x".repeat(129)),
            format!("tgk_{hex}_{hex}_x"),
        ];
        for key in &malformed {
            assert_eq!(route_credential_key(key), KeyRoute::Malformed, "{key}");
        }
        // An account id may itself look like a secret part; the last one is the secret.
        assert_eq!(route_credential_key(&format!("tgk_{hex}_{hex}")), KeyRoute::Account(&hex));
    }

    #[test]
    fn hashes_match_only_their_secret_and_debug_is_redacted() {
        let secret = Secret::new("tgc_abc".into());
        let hash = secret.hash();
        assert!(hash.matches("tgc_abc"));
        assert!(!hash.matches("tgc_abd"));
        assert!(!hash.matches(""));
        assert_eq!(format!("{secret:?}"), "Secret(<redacted>)");
        assert_eq!(SecretHash::from_slice(hash.as_bytes()), Some(hash));
        assert_eq!(SecretHash::from_slice(&[0u8; 31]), None);
        assert_eq!(secret.expose(), "tgc_abc");
        // The known SHA-256 of the empty string guards against a wrong digest.
        assert_eq!(SecretHash::of("").0[..4], [0xe3, 0xb0, 0xc4, 0x42]);
    }
}
