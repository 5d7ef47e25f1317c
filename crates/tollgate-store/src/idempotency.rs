//! Idempotent retries: what a store records under an `Idempotency-Key`, and how.
//!
//! A client that lost an answer retries with the same key. The store then answers
//! with the original answer and applies nothing again; the same key with a
//! different request is refused with `idempotency_key_reused`. Every store writes
//! its record in the same atomic step as the operation's effect, so no crash can
//! separate the two. Only successful answers are recorded: a refused operation
//! changed nothing, so its retry runs again and may succeed.
//!
//! What is stored reveals nothing without the key. A key is scoped by the
//! operation and the resource it names (with its account, for a lease or a
//! credential), and three values are derived from the
//! scope and the key with domain separation: the lookup id the record is found
//! by, the fingerprint of the request's canonical arguments, and the key that
//! seals the answer with XChaCha20-Poly1305. Answers hold lease capabilities and
//! credential keys, so the Idempotency-Key is as sensitive as the answer it
//! protects and must be random (a UUIDv4 or better).

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use jiff::{SignedDuration, Timestamp};
use sha2::{Digest, Sha256};
use tollgate_core::{Credential, Error};

use crate::model::{Consolidated, IssuedCredential, IssuedLease, Released};
use crate::requests::{Acquisition, Consolidation, NewCredential, Release, Revocation};

mod answer;

pub use answer::Answer;

/// The longest `Idempotency-Key`, in characters.
pub const IDEMPOTENCY_KEY_CHARS_MAX: usize = 255;
/// How long a record answers retries unless configured otherwise.
pub const IDEMPOTENCY_RETENTION_DEFAULT: SignedDuration = SignedDuration::from_hours(24);
/// The most expired records one purge removes.
pub const IDEMPOTENCY_PURGE_BATCH_MAX: u32 = 1_000;

const NONCE_BYTES: usize = 24;

/// A client's `Idempotency-Key`: 1 to 255 visible ASCII characters. It is a
/// secret (it unseals the recorded answer), so its `Debug` output is redacted.
#[derive(Clone, PartialEq, Eq)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    pub fn parse(value: &str) -> Result<Self, Error> {
        let visible = value.bytes().all(|b| b.is_ascii_graphic());
        if value.is_empty() || value.len() > IDEMPOTENCY_KEY_CHARS_MAX || !visible {
            return Err(Error::InvalidIdempotencyKey);
        }
        Ok(Self(value.to_owned()))
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IdempotencyKey(<redacted>)")
    }
}

/// A key and how long its record answers retries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Idempotency {
    pub key: IdempotencyKey,
    /// Positive; a record expires this long after it was written.
    pub retention: SignedDuration,
}

/// A keyed request's canonical arguments. The caller's `now` is not one of them:
/// a retry happens later by nature.
#[derive(Debug, Clone, Copy)]
pub enum Request<'a> {
    Acquire(Acquisition<'a>),
    Release(Release<'a>),
    Consolidate(Consolidation<'a>),
    IssueCredential(NewCredential<'a>),
    RevokeCredential(Revocation<'a>),
}

impl Request<'_> {
    fn operation(&self) -> &'static str {
        match self {
            Request::Acquire(_) => "acquire",
            Request::Release(_) => "release",
            Request::Consolidate(_) => "consolidate",
            Request::IssueCredential(_) => "issue_credential",
            Request::RevokeCredential(_) => "revoke_credential",
        }
    }

    /// The account the request names, which its record is stored under.
    pub fn account_id(&self) -> &str {
        match self {
            Request::Acquire(Acquisition { account_id, .. })
            | Request::Release(Release { account_id, .. })
            | Request::Consolidate(Consolidation { account_id, .. })
            | Request::IssueCredential(NewCredential { account_id, .. })
            | Request::RevokeCredential(Revocation { account_id, .. }) => account_id,
        }
    }

    /// The account that scopes the key besides the resource, for a resource
    /// that is not itself an account.
    fn resource_account(&self) -> Option<&str> {
        match self {
            Request::Release(Release { account_id, .. }) | Request::RevokeCredential(Revocation { account_id, .. }) => {
                Some(account_id)
            }
            Request::Acquire(_) | Request::Consolidate(_) | Request::IssueCredential(_) => None,
        }
    }

    /// The resource the request names, which scopes its key.
    pub fn resource(&self) -> &str {
        match self {
            Request::Acquire(Acquisition { account_id, .. })
            | Request::Consolidate(Consolidation { account_id, .. })
            | Request::IssueCredential(NewCredential { account_id, .. }) => account_id,
            Request::Release(Release { lease_id, .. }) => lease_id,
            Request::RevokeCredential(Revocation { credential_id, .. }) => credential_id,
        }
    }

    fn write_arguments(&self, canon: &mut Canon) {
        match *self {
            Request::Acquire(Acquisition { account_id, units, ttl }) => {
                canon.text(account_id).number(units).duration(ttl);
            }
            Request::Release(Release { lease_id, capability, .. }) => {
                canon.text(lease_id).text(capability);
            }
            Request::Consolidate(Consolidation { account_id, sources, extra_units, ttl }) => {
                canon.text(account_id).number(sources.len() as u64);
                for source in sources {
                    canon.text(&source.lease_id).text(&source.capability);
                }
                canon.number(extra_units).duration(ttl);
            }
            Request::IssueCredential(NewCredential { account_id, label }) => {
                canon.text(account_id).text(label);
            }
            Request::RevokeCredential(Revocation { credential_id, .. }) => {
                canon.text(credential_id);
            }
        }
    }
}

/// An unambiguous encoding into a hash: every field is length-prefixed.
struct Canon(Sha256);

impl Canon {
    fn new(domain: &str, request: &Request<'_>, key: &IdempotencyKey) -> Self {
        let mut canon = Self(Sha256::new());
        canon.text(domain).text(request.operation()).text(request.resource());
        // The operation says whether an account follows, so this stays unambiguous.
        if let Some(account_id) = request.resource_account() {
            canon.text(account_id);
        }
        canon.text(key.expose());
        canon
    }

    fn text(&mut self, value: &str) -> &mut Self {
        self.0.update((value.len() as u64).to_be_bytes());
        self.0.update(value.as_bytes());
        self
    }

    fn number(&mut self, value: u64) -> &mut Self {
        self.0.update(value.to_be_bytes());
        self
    }

    fn duration(&mut self, value: SignedDuration) -> &mut Self {
        self.0.update(value.as_secs().to_be_bytes());
        self.0.update(value.subsec_nanos().to_be_bytes());
        self
    }

    fn finish(self) -> [u8; 32] {
        self.0.finalize().into()
    }
}

/// What a store needs to find, check, write and open one keyed request's
/// record. Both stores derive it here, so they agree byte for byte.
pub struct Claim {
    /// The record's primary key.
    pub lookup_id: [u8; 32],
    /// The request's fingerprint; keyed, so it reveals nothing of the arguments.
    pub fingerprint: [u8; 32],
    /// When a record written now stops answering retries.
    pub expires_at: Timestamp,
    seal_key: [u8; 32],
}

impl Claim {
    pub fn new(idempotency: &Idempotency, request: &Request<'_>, now: Timestamp) -> Self {
        let key = &idempotency.key;
        let lookup_id = Canon::new("tollgate idempotency id v1", request, key).finish();
        let seal_key = Canon::new("tollgate idempotency seal v1", request, key).finish();
        let mut fingerprint = Canon::new("tollgate idempotency fingerprint v1", request, key);
        request.write_arguments(&mut fingerprint);
        // A retention reaching past the last instant keeps the record until then.
        let expires_at = now.checked_add(idempotency.retention).unwrap_or(Timestamp::MAX);
        Self { lookup_id, fingerprint: fingerprint.finish(), expires_at, seal_key }
    }

    fn cipher(&self) -> XChaCha20Poly1305 {
        XChaCha20Poly1305::new_from_slice(&self.seal_key).expect("a 32-byte key")
    }

    /// The answer, encrypted and authenticated under this claim's key and bound
    /// to its lookup id: a random nonce followed by the ciphertext. The nonce is
    /// random because an expired key may seal a second answer.
    pub fn seal(&self, answer: &Answer) -> Vec<u8> {
        let nonce_bytes: [u8; NONCE_BYTES] = rand::random();
        let nonce = XNonce::from(nonce_bytes);
        let plaintext = answer.encode();
        let sealed = self
            .cipher()
            .encrypt(&nonce, Payload { msg: &plaintext, aad: &self.lookup_id })
            .expect("encryption of a bounded message cannot fail");
        [nonce_bytes.as_slice(), &sealed].concat()
    }

    fn open(&self, sealed: &[u8]) -> Result<Answer, Error> {
        let unreadable = || Error::StorageCorrupt("a recorded idempotent answer does not open".into());
        if sealed.len() < NONCE_BYTES {
            return Err(unreadable());
        }
        let (nonce, ciphertext) = sealed.split_at(NONCE_BYTES);
        let nonce = XNonce::try_from(nonce).map_err(|_| unreadable())?;
        let plaintext = self
            .cipher()
            .decrypt(&nonce, Payload { msg: ciphertext, aad: &self.lookup_id })
            .map_err(|_| unreadable())?;
        Answer::decode(&plaintext).ok_or_else(unreadable)
    }

    /// The answer to a retry that found a live record: the original answer if
    /// the record is of this very request, else `idempotency_key_reused`.
    pub fn replay<T: Replayable>(&self, fingerprint: &[u8], sealed: &[u8]) -> Result<T, Error> {
        if fingerprint != self.fingerprint {
            return Err(Error::IdempotencyKeyReused);
        }
        T::from_answer(self.open(sealed)?)
            .ok_or_else(|| Error::StorageCorrupt("a recorded idempotent answer is of another operation".into()))
    }
}

/// An operation's answer, as it is recorded and replayed.
pub trait Replayable: Sized {
    fn to_answer(&self) -> Answer;
    fn from_answer(answer: Answer) -> Option<Self>;
}

macro_rules! replayable {
    ($type:ty, $variant:ident) => {
        impl Replayable for $type {
            fn to_answer(&self) -> Answer {
                Answer::$variant(self.clone())
            }

            fn from_answer(answer: Answer) -> Option<Self> {
                match answer {
                    Answer::$variant(value) => Some(value),
                    _ => None,
                }
            }
        }
    };
}

replayable!(IssuedLease, Acquired);
replayable!(Released, Released);
replayable!(Consolidated, Consolidated);
replayable!(IssuedCredential, CredentialIssued);
replayable!(Credential, CredentialRevoked);

#[cfg(test)]
mod tests;
