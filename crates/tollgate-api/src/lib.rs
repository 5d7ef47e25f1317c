//! The HTTP/JSON wire contract (`/v1`), shared by the server and the client.
//!
//! Field names are part of the contract: fields may be added, none renamed.
//! Timestamps are RFC 3339 with up to nine fractional digits (any offset is
//! accepted on input); durations are ISO 8601 (`"PT30S"`, `"PT0.000000001S"`);
//! units are JSON integers up to `u64::MAX`.

#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::too_many_lines))]

use std::collections::BTreeMap;

use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};
use tollgate_core::{Credential, Error, EventOutcome, IngestError, Lease, Outcome, Settlement, UsageEvent};
use tollgate_store::{AccountView, ReclaimReport, Verification};
use utoipa::ToSchema;

mod check;
mod journal;
mod listings;
mod objects;
mod usage_queries;
mod webhooks;

pub use check::{
    CheckBody, GuardViolationBody, LedgerCheckBody, LegacyBoundBody, MigrationsBody, StorageBody,
    UsageTotalsMismatchBody, ViolationBody,
};
pub use journal::{CounterDeltasBody, JournalEntryBody, JournalKindBody, JournalMismatchBody, JournalPageBody};
pub use listings::{CreditBody, PageBody};
pub use usage_queries::{
    ExportedEventBody, UsageBucketBody, UsageEventsPage, UsageGroupBody, UsageReportBody, UsageTotalsBody,
};
pub use webhooks::{
    AlertRuleBody, AlertRulesBody, CreateAlertRuleRequest, CreateWebhookRequest, DeliveryBody, RotateSecretRequest,
    WebhookEndpointBody, WebhookEndpointsBody,
};

use objects::object_only;

// Request bodies: objects only, with no field the type does not name.
object_only!(
    CreateAccountRequest,
    CreditRequest,
    CreateCredentialRequest,
    VerifyRequest,
    AcquireRequest,
    ReleaseRequest,
    LeaseHandleBody,
    ConsolidateRequest,
    UsageEventBody,
    IngestRequest,
    CreateAlertRuleRequest,
    CreateWebhookRequest,
    RotateSecretRequest,
);

/// `{"error":{"code","message","retryable"}}`, the body of every error response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorDetail {
    pub code: String,
    pub message: String,
    pub retryable: bool,
}

impl ErrorBody {
    pub fn new(code: &str, message: impl Into<String>, retryable: bool) -> Self {
        Self { error: ErrorDetail { code: code.to_owned(), message: message.into(), retryable } }
    }
}

impl From<&Error> for ErrorBody {
    fn from(error: &Error) -> Self {
        Self::new(error.code(), error.to_string(), error.retryable())
    }
}

impl From<&IngestError> for ErrorBody {
    fn from(error: &IngestError) -> Self {
        Self::new(error.code(), error.to_string(), error.retryable())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct CreateAccountRequest {
    pub account_id: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AccountBody {
    pub account_id: String,
    pub credited: u64,
    pub available: u64,
    pub reserved: u64,
    pub consumed: u64,
    pub overage: u64,
    pub billed: u64,
    pub next_fence: u64,
    pub active_leases: u64,
}

impl From<&AccountView> for AccountBody {
    fn from(view: &AccountView) -> Self {
        let a = &view.account;
        Self {
            account_id: a.account_id.clone(),
            credited: a.credited,
            available: a.available,
            reserved: a.reserved,
            consumed: a.consumed,
            overage: a.overage,
            billed: a.billed,
            next_fence: a.next_fence,
            active_leases: view.active_leases,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct CreditRequest {
    pub credit_id: String,
    pub units: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct CreateCredentialRequest {
    /// Free text for people, at most 256 characters and no NUL (`invalid_label`).
    #[serde(default)]
    #[schema(max_length = 256, pattern = "^[^\\u0000]*$")]
    pub label: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ActivityBody {
    #[schema(value_type = Option<String>, format = DateTime)]
    pub last_used_at: Option<Timestamp>,
    pub accepted_events: u64,
    pub accepted_units: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CredentialBody {
    pub credential_id: String,
    pub account_id: String,
    pub label: String,
    #[schema(value_type = String, format = DateTime)]
    pub created_at: Timestamp,
    #[schema(value_type = Option<String>, format = DateTime)]
    pub revoked_at: Option<Timestamp>,
    pub activity: ActivityBody,
}

impl From<&Credential> for CredentialBody {
    fn from(c: &Credential) -> Self {
        Self {
            credential_id: c.credential_id.clone(),
            account_id: c.account_id.clone(),
            label: c.label.clone(),
            created_at: c.created_at,
            revoked_at: c.revoked_at,
            activity: ActivityBody {
                last_used_at: c.last_used_at,
                accepted_events: c.accepted_events,
                accepted_units: c.accepted_units,
            },
        }
    }
}

/// The credential with its key, returned once at issue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct IssuedCredentialBody {
    #[serde(flatten)]
    pub credential: CredentialBody,
    pub key: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct VerifyRequest {
    pub key: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct VerifyResponse {
    pub valid: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl From<&Verification> for VerifyResponse {
    fn from(v: &Verification) -> Self {
        Self {
            valid: v.valid,
            credential_id: v.credential_id.clone(),
            account_id: v.account_id.clone(),
            reason: v.reason.map(str::to_owned),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct AcquireRequest {
    pub units: u64,
    /// A positive ISO 8601 duration in hours, minutes and seconds (`PT30S`,
    /// `PT1H30M`, `PT0.000000001S`); days and longer units are refused. A TTL
    /// above the server's maximum is clamped to it.
    #[schema(value_type = String, format = "duration", pattern = r"^PT(\d+H(\d+M)?(\d+(\.\d{1,9})?S)?|\d+M(\d+(\.\d{1,9})?S)?|\d+(\.\d{1,9})?S)$", example = "PT30S")]
    pub ttl: SignedDuration,
}

/// A lease. `capability` is present only in the acquire and consolidate responses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct LeaseBody {
    pub lease_id: String,
    pub account_id: String,
    pub fencing_token: u64,
    pub granted: u64,
    pub used: u64,
    pub state: String,
    #[schema(value_type = String, format = DateTime)]
    pub expires_at: Timestamp,
    pub expiry_is_upper_bound: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capability: Option<String>,
}

impl From<&Lease> for LeaseBody {
    fn from(l: &Lease) -> Self {
        Self {
            lease_id: l.lease_id.clone(),
            account_id: l.account_id.clone(),
            fencing_token: l.fencing_token,
            granted: l.granted,
            used: l.used,
            state: l.state.as_str().to_owned(),
            expires_at: l.expiry,
            expiry_is_upper_bound: l.expiry_is_upper_bound,
            capability: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct ReleaseRequest {
    pub capability: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ReleaseResponse {
    pub lease: LeaseBody,
    pub charged: u64,
    pub returned: u64,
    pub excess: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct LeaseHandleBody {
    pub lease_id: String,
    pub capability: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct ConsolidateRequest {
    /// The source leases, at least one (`no_source_leases`), each named once
    /// (`duplicate_source_lease`).
    #[schema(min_items = 1)]
    pub leases: Vec<LeaseHandleBody>,
    /// Units drawn from the account beyond what the sources return. Zero is
    /// allowed, but the new lease's grant (returned plus extra) must be
    /// positive (`invalid_units`).
    #[serde(default)]
    pub extra_units: u64,
    /// A positive ISO 8601 duration in hours, minutes and seconds (`PT30S`,
    /// `PT1H30M`, `PT0.000000001S`); days and longer units are refused. A TTL
    /// above the server's maximum is clamped to it.
    #[schema(value_type = String, format = "duration", pattern = r"^PT(\d+H(\d+M)?(\d+(\.\d{1,9})?S)?|\d+M(\d+(\.\d{1,9})?S)?|\d+(\.\d{1,9})?S)$", example = "PT30S")]
    pub ttl: SignedDuration,
}

/// How one lease was settled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SettlementBody {
    pub lease_id: String,
    pub account_id: String,
    pub charged: u64,
    pub returned: u64,
    pub excess: u64,
}

impl SettlementBody {
    pub fn new(lease_id: &str, account_id: &str, s: &Settlement) -> Self {
        Self {
            lease_id: lease_id.to_owned(),
            account_id: account_id.to_owned(),
            charged: s.charged,
            returned: s.returned,
            excess: s.excess,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ConsolidateResponse {
    pub lease: LeaseBody,
    pub settlements: Vec<SettlementBody>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct UsageEventBody {
    /// 1 to 128 characters, no NUL. An event outside this rule is not refused
    /// with the batch: its outcome is `rejected` with `invalid_request_id`.
    #[schema(min_length = 1, max_length = 128, pattern = "^[^\\u0000]*$")]
    pub request_id: String,
    pub account_id: String,
    pub credential_id: String,
    pub units: u64,
    #[schema(value_type = String, format = DateTime)]
    pub occurred_at: Timestamp,
    #[serde(default)]
    pub lease_id: Option<String>,
    #[serde(default)]
    pub fencing_token: Option<u64>,
    /// At most 8 pairs; keys 1 to 64 characters of `a-z 0-9 _ . -`, values 1
    /// to 256 characters without NUL. Absent means none. An event outside this
    /// rule is not refused with the batch: its outcome is `rejected` with
    /// `invalid_dimensions`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schema(value_type = Option<BTreeMap<String, String>>)]
    pub dimensions: BTreeMap<String, String>,
}

impl From<UsageEventBody> for UsageEvent {
    fn from(e: UsageEventBody) -> Self {
        Self {
            request_id: e.request_id,
            account_id: e.account_id,
            credential_id: e.credential_id,
            units: e.units,
            occurred_at: e.occurred_at,
            lease_id: e.lease_id,
            fencing_token: e.fencing_token,
            dimensions: e.dimensions,
        }
    }
}

impl From<&UsageEvent> for UsageEventBody {
    fn from(e: &UsageEvent) -> Self {
        Self {
            request_id: e.request_id.clone(),
            account_id: e.account_id.clone(),
            credential_id: e.credential_id.clone(),
            units: e.units,
            occurred_at: e.occurred_at,
            lease_id: e.lease_id.clone(),
            fencing_token: e.fencing_token,
            dimensions: e.dimensions.clone(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct IngestRequest {
    /// At most 10 000 events (`413 batch_too_large`).
    #[schema(max_items = 10000)]
    pub events: Vec<UsageEventBody>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct OutcomeBody {
    pub request_id: String,
    /// `accepted`, `duplicate` or `rejected`.
    pub outcome: String,
    /// The rejection reason; present only for `rejected`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl From<&EventOutcome> for OutcomeBody {
    fn from(o: &EventOutcome) -> Self {
        let reason = match o.outcome {
            Outcome::Rejected(reason) => Some(reason.code().to_owned()),
            Outcome::Accepted | Outcome::Duplicate => None,
        };
        Self { request_id: o.request_id.clone(), outcome: o.outcome.code().to_owned(), reason }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct IngestResponse {
    pub outcomes: Vec<OutcomeBody>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ReclaimResponse {
    pub reclaimed: Vec<SettlementBody>,
    /// True when the pass hit its bound and more leases may be due.
    pub full: bool,
}

impl From<&ReclaimReport> for ReclaimResponse {
    fn from(r: &ReclaimReport) -> Self {
        Self {
            reclaimed: r
                .reclaimed
                .iter()
                .map(|l| SettlementBody::new(&l.lease_id, &l.account_id, &l.settlement))
                .collect(),
            full: r.is_full(),
        }
    }
}

/// `GET /healthz`: the process is up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct HealthBody {
    pub status: String,
}

/// `GET /readyz`: storage answers and its schema is current.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ReadyBody {
    pub ready: bool,
    pub storage: StorageBody,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_formats_keep_nanoseconds_and_iso_durations() {
        let body: AcquireRequest =
            serde_json::from_str(r#"{"units":18446744073709551615,"ttl":"PT0.000000001S"}"#).unwrap();
        assert_eq!(body.units, u64::MAX);
        assert_eq!(body.ttl, SignedDuration::from_nanos(1));
        let json = serde_json::to_string(&body).unwrap();
        let back: AcquireRequest = serde_json::from_str(&json).unwrap();
        assert_eq!(back, body);
        assert!(json.contains("\"PT"), "{json}");

        let event: UsageEventBody = serde_json::from_str(
            r#"{"request_id":"r","account_id":"a","credential_id":"c","units":0,"occurred_at":"2024-01-01T05:00:00.123456789+05:00"}"#,
        )
        .unwrap();
        assert_eq!(event.occurred_at, "2024-01-01T00:00:00.123456789Z".parse::<Timestamp>().unwrap());
        assert_eq!((event.lease_id, event.fencing_token), (None, None));
        let ts: Timestamp = "1969-12-31T23:59:59.999999999Z".parse().unwrap();
        assert_eq!(serde_json::to_string(&ts).unwrap(), r#""1969-12-31T23:59:59.999999999Z""#);
    }

    /// Every request type is read from a JSON object only, at the top and
    /// nested, and refuses fields it does not name.
    #[test]
    fn request_bodies_are_objects_without_unknown_fields() {
        fn refused<T: serde::de::DeserializeOwned + std::fmt::Debug>(json: &str, expected: &str) {
            let error = serde_json::from_str::<T>(json).expect_err(json);
            assert!(error.is_data(), "{json}: {error}");
            assert!(error.to_string().contains(expected), "{json}: {error}");
        }
        refused::<CreateAccountRequest>(r#"["arr"]"#, "invalid type: sequence, expected a JSON object");
        refused::<CreditRequest>(r#"["c1",5]"#, "invalid type: sequence, expected a JSON object");
        refused::<CreditRequest>(r#""c1""#, "invalid type: string \"c1\", expected a JSON object");
        refused::<CreateCredentialRequest>("null", "expected a JSON object");
        refused::<IngestRequest>(
            r#"{"events":[["r","a","c",1,"2024-01-01T00:00:00Z"]]}"#,
            "invalid type: sequence, expected a JSON object",
        );
        refused::<ConsolidateRequest>(r#"{"leases":[["l","k"]],"ttl":"PT1S"}"#, "expected a JSON object");
        refused::<CreditRequest>(r#"{"credit_id":"c1","units":5,"unit":5}"#, "unknown field `unit`");
        refused::<UsageEventBody>(
            r#"{"request_id":"r","account_id":"a","credential_id":"c","units":1,"occurred_at":"2024-01-01T00:00:00Z","lease":"l"}"#,
            "unknown field `lease`",
        );

        let credit: CreditRequest = serde_json::from_str(r#"{"units":5,"credit_id":"c1"}"#).unwrap();
        assert_eq!(credit, CreditRequest { credit_id: "c1".into(), units: 5 });
        assert_eq!(serde_json::to_string(&credit).unwrap(), r#"{"credit_id":"c1","units":5}"#);
        let label: CreateCredentialRequest = serde_json::from_str("{}").unwrap();
        assert_eq!(label.label, "");
    }

    /// The TTLs the document's pattern admits parse; days and weeks, which
    /// the pattern excludes, do not.
    #[test]
    fn ttls_of_the_documented_shape_parse() {
        let ttl = |text: &str| serde_json::from_str::<AcquireRequest>(&format!(r#"{{"units":1,"ttl":"{text}"}}"#));
        for ok in ["PT30S", "PT1H", "PT1H2M", "PT1H2M3S", "PT1H3.5S", "PT2M", "PT2M0.000000001S", "PT0.000000001S"] {
            assert!(ttl(ok).is_ok(), "{ok}: {:?}", ttl(ok));
        }
        for refused in ["P1D", "P1W", "PT"] {
            assert!(ttl(refused).is_err(), "{refused}");
        }
    }

    #[test]
    fn outcome_reason_is_present_only_for_rejections() {
        let accepted = OutcomeBody::from(&EventOutcome { request_id: "a".into(), outcome: Outcome::Accepted });
        assert_eq!(serde_json::to_string(&accepted).unwrap(), r#"{"request_id":"a","outcome":"accepted"}"#);
        let rejected = OutcomeBody::from(&EventOutcome {
            request_id: "b".into(),
            outcome: Outcome::Rejected(tollgate_core::RejectReason::FenceMismatch),
        });
        assert_eq!(
            serde_json::to_string(&rejected).unwrap(),
            r#"{"request_id":"b","outcome":"rejected","reason":"fence_mismatch"}"#
        );
    }
}
