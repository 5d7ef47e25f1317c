//! Errors with stable snake_case codes.
//!
//! The codes are part of the public contract (HTTP bodies, client errors, logs); the
//! messages are for people and may change. Every error says whether retrying the same
//! request can succeed.

use crate::ledger::LeaseState;

/// What kind of failure an error is. The server maps kinds, not individual errors, to
/// HTTP statuses, so that the mapping lives in one place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request itself is malformed; resending it unchanged fails again.
    Input,
    /// The named thing does not exist (or belongs to another scope).
    NotFound,
    /// The request is well formed but the current state refuses it.
    Conflict,
    /// Storage could not be reached; a retry may succeed.
    Unavailable,
    /// Stored data violates an invariant; a retry succeeds only after a repair.
    Corrupt,
}

/// Errors of the allocator, credential and read operations.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("units must be positive")]
    InvalidUnits,
    #[error("ttl must be positive")]
    InvalidTtl,
    #[error("{units} units exceed this store's unit domain (at most {max})")]
    UnitsOutOfRange { units: u64, max: u64 },
    #[error("{field} must be 1 to 128 characters of A-Z a-z 0-9 . _ : -")]
    InvalidId { field: &'static str },
    #[error("label must be at most 256 characters")]
    InvalidLabel,
    #[error("consolidation needs at least one source lease")]
    NoSourceLeases,
    #[error("lease {lease_id} is named twice in one consolidation")]
    DuplicateSourceLease { lease_id: String },
    #[error("account not found")]
    AccountNotFound,
    #[error("lease not found")]
    LeaseNotFound,
    #[error("credential not found")]
    CredentialNotFound,
    #[error("account already exists")]
    AccountExists,
    #[error("credit id already used with {existing_units} units")]
    CreditConflict { existing_units: u64 },
    #[error("insufficient balance: {available} available, {requested} requested")]
    InsufficientBalance { available: u64, requested: u64 },
    #[error("capability does not match the lease")]
    CapabilityMismatch,
    #[error("lease is not active (state {state})")]
    LeaseNotActive { state: LeaseState },
    #[error("lease is at or past its reclaim boundary")]
    LeaseExpired,
    #[error("source leases belong to another account")]
    MixedAccounts,
    #[error("the resulting expiry is outside the representable timestamp range")]
    ExpiryOutOfRange,
    #[error("counter {counter} would overflow")]
    CounterOverflow { counter: &'static str },
    #[error("idempotency key must be 1 to 255 visible ASCII characters")]
    InvalidIdempotencyKey,
    #[error("idempotency key was already used for a different request")]
    IdempotencyKeyReused,
    #[error("limit must be 1 to {max}, not {limit}")]
    InvalidLimit { limit: u32, max: u32 },
    #[error("cursor does not belong to this listing, account and query")]
    InvalidCursor,
    #[error("after must be a journal sequence number: a whole number from 0 to 18446744073709551615")]
    InvalidAfter,
    #[error("{field} must be an RFC 3339 instant with at most 9 fractional digits")]
    InvalidTimestamp { field: &'static str },
    #[error("the range is empty or outside the timestamp domain: from must be before to")]
    InvalidRange,
    #[error("window must be PT1M, PT1H, P1D or omitted for the whole range")]
    InvalidWindow,
    #[error("group_by must be credential, lease, funding or dimension:KEY")]
    InvalidGroupBy,
    #[error("lease state filter must be active, released, reclaimed or consolidated")]
    InvalidState,
    #[error("the query spans {buckets} buckets; at most {max} are allowed")]
    TooManyBuckets { buckets: u128, max: u64 },
    #[error("storage records reclaim grace {recorded}, this server is configured with {configured}")]
    ReclaimGraceMismatch { recorded: String, configured: String },
    #[error(
        "condition must be available_below or overage_above with a threshold in units, available_below_percent with a percent from 1 to 100, or acquire_refused without one"
    )]
    InvalidCondition,
    #[error(
        "event_types must name at least one of balance.threshold_crossed, balance.recovered, overage.threshold_crossed, acquire.refused_insufficient_balance, lease.reclaimed, credit.received"
    )]
    InvalidEventTypes,
    #[error("url must be an http or https URL of at most 2048 bytes with a host, no credentials and no fragment")]
    InvalidWebhookUrl,
    #[error("overlap_seconds must be 0 to {max}")]
    InvalidOverlap { max: u64 },
    #[error("alert rule not found")]
    RuleNotFound,
    #[error("webhook endpoint not found")]
    EndpointNotFound,
    #[error("webhook delivery not found")]
    DeliveryNotFound,
    #[error("an account holds at most {max} alert rules")]
    TooManyRules { max: usize },
    #[error("at most {max} webhook endpoints may exist")]
    TooManyEndpoints { max: usize },
    #[error(
        "webhook secrets are stored encrypted: start the server with --webhook-key (or TOLLGATE_WEBHOOK_KEY) to use webhooks on this store"
    )]
    WebhookKeyMissing,
    #[error("storage unavailable: {0}")]
    StorageUnavailable(String),
    #[error("stored data violates an invariant: {0}")]
    StorageCorrupt(String),
}

impl Error {
    /// The stable code of this error.
    pub fn code(&self) -> &'static str {
        self.class().0
    }

    pub fn kind(&self) -> ErrorKind {
        self.class().1
    }

    /// Each error's stable code beside its kind: one table, so that a new
    /// error states both where it is added.
    fn class(&self) -> (&'static str, ErrorKind) {
        use ErrorKind::{Conflict, Corrupt, Input, NotFound, Unavailable};
        match self {
            Error::InvalidUnits => ("invalid_units", Input),
            Error::InvalidTtl => ("invalid_ttl", Input),
            Error::UnitsOutOfRange { .. } => ("units_out_of_range", Input),
            Error::InvalidId { .. } => ("invalid_id", Input),
            Error::InvalidLabel => ("invalid_label", Input),
            Error::NoSourceLeases => ("no_source_leases", Input),
            Error::DuplicateSourceLease { .. } => ("duplicate_source_lease", Input),
            Error::AccountNotFound => ("account_not_found", NotFound),
            Error::LeaseNotFound => ("lease_not_found", NotFound),
            Error::CredentialNotFound => ("credential_not_found", NotFound),
            Error::AccountExists => ("account_exists", Conflict),
            Error::CreditConflict { .. } => ("credit_conflict", Conflict),
            Error::InsufficientBalance { .. } => ("insufficient_balance", Conflict),
            Error::CapabilityMismatch => ("capability_mismatch", Conflict),
            Error::LeaseNotActive { .. } => ("lease_not_active", Conflict),
            Error::LeaseExpired => ("lease_expired", Conflict),
            Error::MixedAccounts => ("mixed_accounts", Conflict),
            Error::ExpiryOutOfRange => ("expiry_out_of_range", Conflict),
            Error::CounterOverflow { .. } => ("counter_overflow", Conflict),
            Error::InvalidIdempotencyKey => ("invalid_idempotency_key", Input),
            Error::IdempotencyKeyReused => ("idempotency_key_reused", Conflict),
            Error::InvalidLimit { .. } => ("invalid_limit", Input),
            Error::InvalidCursor => ("invalid_cursor", Input),
            Error::InvalidAfter => ("invalid_after", Input),
            Error::InvalidTimestamp { .. } => ("invalid_timestamp", Input),
            Error::InvalidRange => ("invalid_range", Input),
            Error::InvalidWindow => ("invalid_window", Input),
            Error::InvalidGroupBy => ("invalid_group_by", Input),
            Error::InvalidState => ("invalid_state", Input),
            Error::TooManyBuckets { .. } => ("too_many_buckets", Input),
            Error::ReclaimGraceMismatch { .. } => ("reclaim_grace_mismatch", Conflict),
            Error::InvalidCondition => ("invalid_condition", Input),
            Error::InvalidEventTypes => ("invalid_event_types", Input),
            Error::InvalidWebhookUrl => ("invalid_webhook_url", Input),
            Error::InvalidOverlap { .. } => ("invalid_overlap", Input),
            Error::RuleNotFound => ("rule_not_found", NotFound),
            Error::EndpointNotFound => ("endpoint_not_found", NotFound),
            Error::DeliveryNotFound => ("delivery_not_found", NotFound),
            Error::TooManyRules { .. } => ("too_many_rules", Conflict),
            Error::TooManyEndpoints { .. } => ("too_many_endpoints", Conflict),
            Error::WebhookKeyMissing => ("webhook_key_missing", Conflict),
            Error::StorageUnavailable(_) => ("storage_unavailable", Unavailable),
            Error::StorageCorrupt(_) => ("storage_corrupt", Corrupt),
        }
    }

    /// Whether resending the same request can succeed. Corruption counts as
    /// retryable: it succeeds once an operator has repaired the data.
    pub fn retryable(&self) -> bool {
        matches!(self.kind(), ErrorKind::Unavailable | ErrorKind::Corrupt)
    }
}

/// Errors of `UsageSink::ingest`. A batch either yields one outcome per event or
/// fails as a whole with one of these, having applied nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IngestError {
    /// The batch holds more events than one batch may.
    #[error("batch holds {events} events; at most {max} are allowed")]
    BatchTooLarge { events: usize, max: usize },
    /// The accepted events would overflow a counter. Terminal for this unchanged
    /// batch: resending it fails the same way, so the writer reports it as lost.
    #[error("batch refused: accepting it would overflow {counter}")]
    Refused { counter: &'static str },
    /// Operational failure; retryable.
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    /// Stored data violates an invariant; retryable after an explicit repair.
    #[error("stored data violates an invariant: {0}")]
    Corrupt(String),
}

impl IngestError {
    pub fn code(&self) -> &'static str {
        match self {
            IngestError::BatchTooLarge { .. } => "batch_too_large",
            IngestError::Refused { .. } => "batch_refused",
            IngestError::Unavailable(_) => "storage_unavailable",
            IngestError::Corrupt(_) => "storage_corrupt",
        }
    }

    pub fn retryable(&self) -> bool {
        matches!(self, IngestError::Unavailable(_) | IngestError::Corrupt(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_storage_errors_are_retryable() {
        let cases: Vec<(Error, &str, bool)> = vec![
            (Error::InvalidUnits, "invalid_units", false),
            (Error::InvalidTtl, "invalid_ttl", false),
            (Error::UnitsOutOfRange { units: 2, max: 1 }, "units_out_of_range", false),
            (Error::AccountNotFound, "account_not_found", false),
            (Error::LeaseNotFound, "lease_not_found", false),
            (Error::AccountExists, "account_exists", false),
            (Error::CreditConflict { existing_units: 1 }, "credit_conflict", false),
            (Error::InsufficientBalance { available: 0, requested: 1 }, "insufficient_balance", false),
            (Error::CapabilityMismatch, "capability_mismatch", false),
            (Error::LeaseNotActive { state: LeaseState::Released }, "lease_not_active", false),
            (Error::LeaseExpired, "lease_expired", false),
            (Error::MixedAccounts, "mixed_accounts", false),
            (Error::ExpiryOutOfRange, "expiry_out_of_range", false),
            (Error::CounterOverflow { counter: "billed" }, "counter_overflow", false),
            (Error::InvalidIdempotencyKey, "invalid_idempotency_key", false),
            (Error::IdempotencyKeyReused, "idempotency_key_reused", false),
            (Error::InvalidLimit { limit: 0, max: 1 }, "invalid_limit", false),
            (Error::InvalidCursor, "invalid_cursor", false),
            (Error::InvalidAfter, "invalid_after", false),
            (Error::InvalidTimestamp { field: "from" }, "invalid_timestamp", false),
            (Error::InvalidRange, "invalid_range", false),
            (Error::InvalidWindow, "invalid_window", false),
            (Error::InvalidGroupBy, "invalid_group_by", false),
            (Error::InvalidState, "invalid_state", false),
            (Error::TooManyBuckets { buckets: 2, max: 1 }, "too_many_buckets", false),
            (Error::StorageUnavailable("x".into()), "storage_unavailable", true),
            (Error::StorageCorrupt("x".into()), "storage_corrupt", true),
        ];
        for (error, code, retryable) in cases {
            assert_eq!(error.code(), code);
            assert_eq!(error.retryable(), retryable, "{code}");
        }
        let ingest = [
            (IngestError::BatchTooLarge { events: 2, max: 1 }, "batch_too_large", false),
            (IngestError::Refused { counter: "billed" }, "batch_refused", false),
            (IngestError::Unavailable("x".into()), "storage_unavailable", true),
            (IngestError::Corrupt("x".into()), "storage_corrupt", true),
        ];
        for (error, code, retryable) in ingest {
            assert_eq!(error.code(), code);
            assert_eq!(error.retryable(), retryable, "{code}");
        }
    }
}
