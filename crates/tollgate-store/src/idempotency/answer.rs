//! The recorded form of an answer: JSON of record types defined here, so that
//! the core's types stay free of serialisation and a rename there cannot change
//! what records already written decode to. Secrets appear only inside the
//! sealed plaintext.

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use tollgate_core::{Credential, Lease, LeaseState, Secret, Settlement};

use crate::model::{Consolidated, IssuedCredential, IssuedLease, Released};

/// An operation's successful answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Acquired(IssuedLease),
    Released(Released),
    Consolidated(Consolidated),
    CredentialIssued(IssuedCredential),
    CredentialRevoked(Credential),
}

impl Answer {
    pub(super) fn encode(&self) -> Vec<u8> {
        let record = match self {
            Answer::Acquired(issued) => AnswerRecord::Acquired(issued.into()),
            Answer::Released(released) => {
                AnswerRecord::Released { lease: (&released.lease).into(), settlement: released.settlement.into() }
            }
            Answer::Consolidated(consolidated) => AnswerRecord::Consolidated {
                lease: (&consolidated.lease).into(),
                settlements: consolidated
                    .settlements
                    .iter()
                    .map(|(lease, settlement)| (lease.into(), (*settlement).into()))
                    .collect(),
            },
            Answer::CredentialIssued(issued) => AnswerRecord::CredentialIssued {
                credential: (&issued.credential).into(),
                key: issued.key.expose().into(),
            },
            Answer::CredentialRevoked(credential) => AnswerRecord::CredentialRevoked(credential.into()),
        };
        serde_json::to_vec(&record).expect("answer records serialise")
    }

    /// `None` when the bytes are no answer record of a known state.
    pub(super) fn decode(bytes: &[u8]) -> Option<Self> {
        Some(match serde_json::from_slice::<AnswerRecord>(bytes).ok()? {
            AnswerRecord::Acquired(issued) => Answer::Acquired(issued.decode()?),
            AnswerRecord::Released { lease, settlement } => {
                Answer::Released(Released { lease: lease.decode()?, settlement: settlement.into() })
            }
            AnswerRecord::Consolidated { lease, settlements } => Answer::Consolidated(Consolidated {
                lease: lease.decode()?,
                settlements: settlements
                    .into_iter()
                    .map(|(lease, settlement)| Some((lease.decode()?, settlement.into())))
                    .collect::<Option<_>>()?,
            }),
            AnswerRecord::CredentialIssued { credential, key } => {
                Answer::CredentialIssued(IssuedCredential { credential: credential.into(), key: Secret::new(key) })
            }
            AnswerRecord::CredentialRevoked(credential) => Answer::CredentialRevoked(credential.into()),
        })
    }
}

#[derive(Serialize, Deserialize)]
enum AnswerRecord {
    Acquired(IssuedLeaseRecord),
    Released { lease: LeaseRecord, settlement: SettlementRecord },
    Consolidated { lease: IssuedLeaseRecord, settlements: Vec<(LeaseRecord, SettlementRecord)> },
    CredentialIssued { credential: CredentialRecord, key: String },
    CredentialRevoked(CredentialRecord),
}

#[derive(Serialize, Deserialize)]
struct IssuedLeaseRecord {
    lease: LeaseRecord,
    capability: String,
}

impl From<&IssuedLease> for IssuedLeaseRecord {
    fn from(issued: &IssuedLease) -> Self {
        Self { lease: (&issued.lease).into(), capability: issued.capability.expose().into() }
    }
}

impl IssuedLeaseRecord {
    fn decode(self) -> Option<IssuedLease> {
        Some(IssuedLease { lease: self.lease.decode()?, capability: Secret::new(self.capability) })
    }
}

#[derive(Serialize, Deserialize)]
struct LeaseRecord {
    lease_id: String,
    account_id: String,
    fencing_token: u64,
    granted: u64,
    used: u64,
    state: String,
    expiry: Timestamp,
    expiry_is_upper_bound: bool,
}

impl From<&Lease> for LeaseRecord {
    fn from(lease: &Lease) -> Self {
        Self {
            lease_id: lease.lease_id.clone(),
            account_id: lease.account_id.clone(),
            fencing_token: lease.fencing_token,
            granted: lease.granted,
            used: lease.used,
            state: lease.state.as_str().into(),
            expiry: lease.expiry,
            expiry_is_upper_bound: lease.expiry_is_upper_bound,
        }
    }
}

impl LeaseRecord {
    fn decode(self) -> Option<Lease> {
        Some(Lease {
            lease_id: self.lease_id,
            account_id: self.account_id,
            fencing_token: self.fencing_token,
            granted: self.granted,
            used: self.used,
            state: LeaseState::parse(&self.state)?,
            expiry: self.expiry,
            expiry_is_upper_bound: self.expiry_is_upper_bound,
        })
    }
}

#[derive(Serialize, Deserialize)]
struct SettlementRecord {
    charged: u64,
    returned: u64,
    excess: u64,
}

impl From<Settlement> for SettlementRecord {
    fn from(s: Settlement) -> Self {
        Self { charged: s.charged, returned: s.returned, excess: s.excess }
    }
}

impl From<SettlementRecord> for Settlement {
    fn from(s: SettlementRecord) -> Self {
        Self { charged: s.charged, returned: s.returned, excess: s.excess }
    }
}

#[derive(Serialize, Deserialize)]
struct CredentialRecord {
    credential_id: String,
    account_id: String,
    label: String,
    created_at: Timestamp,
    revoked_at: Option<Timestamp>,
    last_used_at: Option<Timestamp>,
    accepted_events: u64,
    accepted_units: u64,
}

impl From<&Credential> for CredentialRecord {
    fn from(c: &Credential) -> Self {
        Self {
            credential_id: c.credential_id.clone(),
            account_id: c.account_id.clone(),
            label: c.label.clone(),
            created_at: c.created_at,
            revoked_at: c.revoked_at,
            last_used_at: c.last_used_at,
            accepted_events: c.accepted_events,
            accepted_units: c.accepted_units,
        }
    }
}

impl From<CredentialRecord> for Credential {
    fn from(c: CredentialRecord) -> Self {
        Self {
            credential_id: c.credential_id,
            account_id: c.account_id,
            label: c.label,
            created_at: c.created_at,
            revoked_at: c.revoked_at,
            last_used_at: c.last_used_at,
            accepted_events: c.accepted_events,
            accepted_units: c.accepted_units,
        }
    }
}
