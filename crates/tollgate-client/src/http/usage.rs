//! How the usage writer over HTTP reads `POST /v1/usage`: every outcome of a
//! `200` answer settled at once (a rejection reason this client does not know
//! is kept under its wire code), and every failure classified as the store
//! contract's error or as a refusal no retry can change.

use tollgate_api::OutcomeBody;
use tollgate_core::{BATCH_EVENTS_MAX, IngestError, RejectReason, UsageEvent};

use super::{ClientError, ClientErrorKind, TollgateClient};
use crate::writer::{Failure, Settled, SettledOutcome};

impl TollgateClient {
    /// `POST /v1/usage` for the writer over HTTP: every outcome of a `200`
    /// answer, unknown rejection reasons by their wire code.
    pub(crate) async fn ingest_settled(&self, batch: &[UsageEvent]) -> Result<Vec<Settled>, Failure> {
        match self.send_usage(batch).await {
            Ok(response) => Ok(settled_of(response.outcomes)),
            Err(error) => Err(failure_of(&error, batch.len())),
        }
    }
}

/// How the writer over HTTP classifies a failed `POST /v1/usage`: as the
/// store contract does (`ingest_error_of`), except that a refusal the answer
/// marks not retryable (400, 401, 403, 404, …) is lost at once instead of
/// retried; see the table in `docs/client.md`.
pub(crate) fn failure_of(error: &ClientError, events: usize) -> Failure {
    let ingest = ingest_error_of(error, events);
    if let IngestError::BatchTooLarge { .. } = ingest {
        let code = if error.kind == ClientErrorKind::Api { intern_code(error.code()) } else { None };
        return Failure::TooLarge { code: code.unwrap_or("batch_too_large"), message: error.to_string() };
    }
    let refused_outright =
        ingest.retryable() && !error.retryable && error.status.is_some_and(|status| (400..500).contains(&status));
    if refused_outright {
        Failure::Refused { code: intern_code(error.code()).unwrap_or("request_refused"), message: error.to_string() }
    } else {
        Failure::Ingest(ingest)
    }
}

/// The most distinct unknown codes (rejection reasons, and error codes of
/// refused usage requests) kept by name per process; more
/// are counted under [`UNRECOGNISED_REASON`]. Codes are interned to fit the
/// writer's `&'static str` keys, so this bounds what an odd server can make
/// the process keep.
const UNKNOWN_CODES_MAX: usize = 64;
/// The longest unknown code kept by name.
const UNKNOWN_CODE_BYTES_MAX: usize = 64;
/// An unknown rejection whose code is not kept by name (too many distinct
/// codes, too long, or not a `snake_case` word), or a rejection without one.
pub const UNRECOGNISED_REASON: &str = "unrecognised_reason";

/// `code` as a `&'static str`: a known reason's own, an unknown one interned
/// within the bounds above.
fn reason_code(code: &str) -> &'static str {
    if let Some(known) = RejectReason::parse(code) {
        return known.code();
    }
    intern_code(code).unwrap_or(UNRECOGNISED_REASON)
}

/// `code` as a `&'static str` if it is a well-formed code and fewer than
/// `UNKNOWN_CODES_MAX` distinct codes were interned before.
fn intern_code(code: &str) -> Option<&'static str> {
    let well_formed = !code.is_empty()
        && code.len() <= UNKNOWN_CODE_BYTES_MAX
        && code.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if !well_formed {
        return None;
    }
    static INTERNED: std::sync::Mutex<Vec<&'static str>> = std::sync::Mutex::new(Vec::new());
    let mut interned = INTERNED.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(existing) = interned.iter().find(|existing| **existing == code) {
        return Some(existing);
    }
    if interned.len() >= UNKNOWN_CODES_MAX {
        return None;
    }
    let leaked: &'static str = Box::leak(code.to_owned().into_boxed_str());
    interned.push(leaked);
    Some(leaked)
}

/// Reads every outcome of a `200` answer. The server applied the batch and
/// said so per event: an event is billed only when it is `accepted` (or was
/// before, `duplicate`), so any other answer, whatever its wording, is a
/// rejection, counted under its code.
fn settled_of(outcomes: Vec<OutcomeBody>) -> Vec<Settled> {
    outcomes
        .into_iter()
        .map(|body| {
            let outcome = match (body.outcome.as_str(), body.reason.as_deref()) {
                ("accepted", _) => SettledOutcome::Accepted,
                ("duplicate", _) => SettledOutcome::Duplicate,
                ("rejected", Some(reason)) => SettledOutcome::Rejected(reason_code(reason)),
                (_, _) => SettledOutcome::Rejected(UNRECOGNISED_REASON),
            };
            Settled { request_id: body.request_id, outcome }
        })
        .collect()
}

/// Counter names the stores refuse a batch for. `IngestError::Refused` holds a
/// static name; the wire carries it only inside the message.
const REFUSABLE_COUNTERS: [&str; 11] = [
    "credential_accepted_events",
    "credential_accepted_units",
    "lease_used",
    "next_fence",
    "available",
    "consumed",
    "credited",
    "reserved",
    "overage",
    "granted",
    "billed",
];

/// Maps a failed `POST /v1/usage` to the store contract's error, which
/// `failure_of` refines.
pub(crate) fn ingest_error_of(error: &ClientError, events: usize) -> IngestError {
    let described = || error.to_string();
    match (error.kind, error.status) {
        (ClientErrorKind::Api, Some(422)) => {
            let counter =
                REFUSABLE_COUNTERS.into_iter().find(|counter| error.message.contains(counter)).unwrap_or("unknown");
            IngestError::Refused { counter }
        }
        (ClientErrorKind::Api | ClientErrorKind::InvalidResponse, Some(413)) => {
            IngestError::BatchTooLarge { events, max: BATCH_EVENTS_MAX }
        }
        (_, Some(500)) => IngestError::Corrupt(described()),
        _ => IngestError::Unavailable(described()),
    }
}

#[cfg(test)]
mod tests {
    use reqwest::StatusCode;

    use super::super::tests::api;
    use super::*;

    #[test]
    fn usage_failures_map_to_the_store_contract() {
        let refused = api(422, "batch_refused", "batch refused: accepting it would overflow lease_used", false);
        let cases: Vec<(ClientError, IngestError)> = vec![
            (refused, IngestError::Refused { counter: "lease_used" }),
            (
                api(422, "batch_refused", "batch refused: accepting it would overflow billed", false),
                IngestError::Refused { counter: "billed" },
            ),
            (api(422, "batch_refused", "something new", false), IngestError::Refused { counter: "unknown" }),
            (
                api(413, "batch_too_large", "batch holds 10001 events", false),
                IngestError::BatchTooLarge { events: 7, max: BATCH_EVENTS_MAX },
            ),
            (
                api(413, "payload_too_large", "request body exceeds 16 bytes", false),
                IngestError::BatchTooLarge { events: 7, max: BATCH_EVENTS_MAX },
            ),
        ];
        for (error, expected) in cases {
            assert_eq!(ingest_error_of(&error, 7), expected, "{error}");
        }
        let retryable: Vec<(ClientError, &str)> = vec![
            (api(503, "storage_unavailable", "db down", true), "storage_unavailable"),
            (api(503, "timeout", "slow", true), "storage_unavailable"),
            (api(500, "storage_corrupt", "bad row", true), "storage_corrupt"),
            (api(401, "unauthorized", "bad token", false), "storage_unavailable"),
            (api(404, "not_found", "no route", false), "storage_unavailable"),
            (
                ClientError::without_response(ClientErrorKind::Connect, "connect_failed", "refused".into()),
                "storage_unavailable",
            ),
            (ClientError::without_response(ClientErrorKind::Timeout, "timeout", "slow".into()), "storage_unavailable"),
            (
                ClientError::without_response(ClientErrorKind::Transport, "transport_failed", "reset".into()),
                "storage_unavailable",
            ),
            (ClientError::of_response(StatusCode::BAD_GATEWAY, b"<html>"), "storage_unavailable"),
        ];
        for (error, code) in retryable {
            let mapped = ingest_error_of(&error, 1);
            assert_eq!(mapped.code(), code, "{error}");
            assert!(mapped.retryable(), "{error}");
            assert!(mapped.to_string().contains(error.code()), "the cause stays visible: {mapped}");
        }
    }

    #[test]
    fn the_writer_over_http_follows_retryable() {
        let refused = |error: ClientError| match failure_of(&error, 3) {
            Failure::Refused { code, .. } => Some(code),
            Failure::Ingest(_) | Failure::TooLarge { .. } => None,
        };
        for (error, code) in [
            (api(400, "invalid_body", "bad", false), "invalid_body"),
            (api(401, "unauthorized", "bad token", false), "unauthorized"),
            (api(403, "forbidden", "admin token", false), "forbidden"),
            (api(404, "not_found", "no route", false), "not_found"),
            (ClientError::of_response(StatusCode::NOT_FOUND, b"<html>"), "invalid_response"),
        ] {
            assert_eq!(refused(error.clone()), Some(code), "{error}");
        }
        let too_large = failure_of(&api(413, "payload_too_large", "request body exceeds 16777216 bytes", false), 3);
        assert_eq!(
            too_large,
            Failure::TooLarge {
                code: "payload_too_large",
                message: "payload_too_large (HTTP 413): request body exceeds 16777216 bytes".into()
            }
        );
        for error in [
            api(422, "batch_refused", "overflow billed", false),
            api(503, "storage_unavailable", "down", true),
            api(500, "storage_corrupt", "bad row", true),
            api(429, "too_many_requests", "slow down", true),
            ClientError::of_response(StatusCode::REQUEST_TIMEOUT, b""),
            ClientError::of_response(StatusCode::BAD_GATEWAY, b"<html>"),
            ClientError::without_response(ClientErrorKind::Transport, "transport_failed", "reset".into()),
            ClientError::without_response(ClientErrorKind::Timeout, "timeout", "slow".into()),
        ] {
            let Failure::Ingest(mapped) = failure_of(&error, 3) else { panic!("{error} is not refused outright") };
            assert_eq!(mapped, ingest_error_of(&error, 3), "{error}");
        }
    }

    #[test]
    fn a_200_answer_settles_every_outcome_and_keeps_unknown_reasons_by_name() {
        let wire = |outcome: &str, reason: Option<&str>| OutcomeBody {
            request_id: "r".into(),
            outcome: outcome.into(),
            reason: reason.map(str::to_owned),
        };
        let long = "x".repeat(UNKNOWN_CODE_BYTES_MAX + 1);
        let read: Vec<SettledOutcome> = settled_of(vec![
            wire("accepted", None),
            wire("duplicate", None),
            wire("rejected", Some("fence_mismatch")),
            wire("rejected", Some("quota_frozen")),
            wire("rejected", Some("Not A Code")),
            wire("rejected", Some(&long)),
            wire("rejected", None),
            wire("deferred", None),
        ])
        .into_iter()
        .map(|settled| settled.outcome)
        .collect();
        assert_eq!(
            read,
            [
                SettledOutcome::Accepted,
                SettledOutcome::Duplicate,
                SettledOutcome::Rejected("fence_mismatch"),
                SettledOutcome::Rejected("quota_frozen"),
                SettledOutcome::Rejected(UNRECOGNISED_REASON),
                SettledOutcome::Rejected(UNRECOGNISED_REASON),
                SettledOutcome::Rejected(UNRECOGNISED_REASON),
                SettledOutcome::Rejected(UNRECOGNISED_REASON),
            ]
        );
        // Interned once: the same name comes back as the same string.
        assert!(std::ptr::eq(reason_code("quota_frozen"), reason_code("quota_frozen")));
    }
}
