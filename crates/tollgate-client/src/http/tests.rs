use super::*;

pub(super) fn api(status: u16, code: &str, message: &str, retryable: bool) -> ClientError {
    ClientError {
        kind: ClientErrorKind::Api,
        status: Some(status),
        code: code.into(),
        message: message.into(),
        retryable,
    }
}

#[test]
fn mutation_retries_are_bounded_at_construction() {
    let with = |attempts: u32, backoff_ms: u64| {
        let mut config = ClientConfig::new("http://127.0.0.1:1", None);
        config.mutation_attempts_max = attempts;
        config.mutation_backoff_initial = Duration::from_millis(backoff_ms);
        TollgateClient::new(config).map(|_| ())
    };
    assert!(with(1, 0).is_ok());
    assert!(with(MUTATION_ATTEMPTS_MAX, 10_000).is_ok());
    for (attempts, backoff_ms) in [(0, 100), (MUTATION_ATTEMPTS_MAX + 1, 100), (4, 10_001)] {
        assert!(matches!(with(attempts, backoff_ms), Err(ClientBuildError::InvalidMutationRetry)), "{attempts}");
    }
    let key = new_idempotency_key();
    assert_eq!(key.len(), 64);
    assert!(key.bytes().all(|b| b.is_ascii_hexdigit()));
    assert_ne!(new_idempotency_key(), key);
}

#[test]
fn error_bodies_keep_code_message_retryable_and_status() {
    let body = br#"{"error":{"code":"insufficient_balance","message":"insufficient balance: 1 available, 2 requested","retryable":false}}"#;
    let error = ClientError::of_response(StatusCode::CONFLICT, body);
    assert_eq!(error, api(409, "insufficient_balance", "insufficient balance: 1 available, 2 requested", false));
    assert_eq!(error.to_string(), "insufficient_balance (HTTP 409): insufficient balance: 1 available, 2 requested");

    let proxy = ClientError::of_response(StatusCode::BAD_GATEWAY, b"<html>bad gateway</html>");
    assert_eq!(
        (proxy.kind, proxy.code.as_str(), proxy.retryable),
        (ClientErrorKind::InvalidResponse, "invalid_response", true)
    );
    let teapot = ClientError::of_response(StatusCode::IM_A_TEAPOT, b"");
    assert!(!teapot.retryable);
    let throttled = ClientError::of_response(StatusCode::TOO_MANY_REQUESTS, b"");
    assert!(throttled.retryable);
}

#[test]
fn routes_are_joined_under_the_base_path_with_encoded_segments() {
    let client = |base: &str| TollgateClient::new(ClientConfig::new(base, Some("t"))).unwrap();
    assert_eq!(
        client("http://127.0.0.1:8080").url(&["v1", "accounts", "a-1"]).as_str(),
        "http://127.0.0.1:8080/v1/accounts/a-1"
    );
    assert_eq!(client("https://h/tollgate/").url(&["v1", "leases", "l"]).as_str(), "https://h/tollgate/v1/leases/l");
    assert_eq!(client("http://h").url(&["v1", "accounts", "../admin"]).as_str(), "http://h/v1/accounts/..%2Fadmin");
    assert!(matches!(
        TollgateClient::new(ClientConfig::new("ftp://h", None)),
        Err(ClientBuildError::InvalidBaseUrl { .. })
    ));
    assert!(matches!(
        TollgateClient::new(ClientConfig::new("not a url", None)),
        Err(ClientBuildError::InvalidBaseUrl { .. })
    ));
    assert!(matches!(
        TollgateClient::new(ClientConfig::new("http://h", Some("bad\ntoken"))),
        Err(ClientBuildError::InvalidToken)
    ));
    let debug = format!("{:?}", client("http://h"));
    assert!(!debug.contains("Bearer"), "{debug}");
}
