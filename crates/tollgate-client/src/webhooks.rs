//! Verifying the webhooks Tollgate sends, for Rust receivers.
//!
//! Each delivery is a `POST` of the event as JSON with a `Tollgate-Signature`
//! header `t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">`, one `v1`
//! per secret while a rotation overlaps. A receiver checks the signature over
//! the body exactly as received, refuses a timestamp far from its clock
//! (a replay), and drops an event id it has already handled: delivery is at
//! least once, and order is not promised.

pub use tollgate_core::alerts::SignatureError;

/// The header that carries the signature.
pub const SIGNATURE_HEADER: &str = "Tollgate-Signature";
/// How far a signature's timestamp may be from the receiver's clock, by
/// default: five minutes.
pub const TOLERANCE_DEFAULT_S: u64 = 300;

/// Checks `header` (the `Tollgate-Signature` value) over `body` (the raw
/// request body) against the endpoint's secrets (`whsec_…`; two during a
/// rotation), at the receiver's `now`, with `tolerance_s` seconds of clock
/// difference allowed.
pub fn verify(
    header: &str,
    body: &[u8],
    secrets: &[&str],
    tolerance_s: u64,
    now: jiff::Timestamp,
) -> Result<(), SignatureError> {
    let secrets: Vec<&[u8]> = secrets.iter().map(|secret| secret.as_bytes()).collect();
    tollgate_core::alerts::verify_signature(header, body, &secrets, tolerance_s, now.as_second())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delivery_signed_with_the_secret_verifies_and_a_tampered_one_does_not() {
        let body = br#"{"id":"evt_1","type":"credit.received"}"#;
        let header = tollgate_core::alerts::signature_header([b"whsec_abc".as_slice()], 1_700_000_000, body);
        let now = jiff::Timestamp::from_second(1_700_000_010).unwrap();
        assert_eq!(verify(&header, body, &["whsec_abc"], TOLERANCE_DEFAULT_S, now), Ok(()));
        assert_eq!(verify(&header, b"{}", &["whsec_abc"], TOLERANCE_DEFAULT_S, now), Err(SignatureError::Mismatch));
        let later = jiff::Timestamp::from_second(1_700_001_000).unwrap();
        assert_eq!(verify(&header, body, &["whsec_abc"], TOLERANCE_DEFAULT_S, later), Err(SignatureError::Stale));
    }
}
