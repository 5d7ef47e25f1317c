//! Secrets (credential keys, lease capabilities) and their stored hashes.
//!
//! A secret is shown to its holder once and never stored: stores keep its SHA-256
//! hash and compare hashes in constant time. Generating secrets needs randomness,
//! which is I/O, so the stores do it; this module only hashes and compares.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

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
        let other = Self::of(candidate);
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

#[cfg(test)]
mod tests {
    use super::*;

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
