//! Operator tokens and their two roles.
//!
//! The server keeps only the SHA-256 hash of each token. A presented token is
//! hashed and compared with every configured hash in constant time, so neither
//! the comparison's duration nor a log line can reveal a token.

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use tollgate_core::{Secret, SecretHash};

use crate::AppState;
use crate::error::ApiError;

/// What an operator token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Everything.
    Admin,
    /// Acquire, release, consolidate, ingest, verify credentials, read leases
    /// and accounts.
    Gateway,
}

/// The shortest operator token accepted: long enough that guessing is hopeless
/// even without rate limiting.
pub const TOKEN_CHARS_MIN: usize = 16;

/// Why a set of operator tokens is unusable. Each names its setting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenError {
    TooShort { setting: &'static str },
    NotPrintable { setting: &'static str },
    SameForBothRoles,
}

impl std::fmt::Display for TokenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TokenError::TooShort { setting } => {
                write!(f, "{setting} must be at least {TOKEN_CHARS_MIN} characters")
            }
            TokenError::NotPrintable { setting } => {
                write!(f, "{setting} must be printable ASCII without spaces")
            }
            TokenError::SameForBothRoles => {
                f.write_str("the admin and gateway tokens must differ, or the gateway role could act as admin")
            }
        }
    }
}

impl std::error::Error for TokenError {}

/// Hashes of the configured operator tokens. Its `Debug` shows only which roles
/// are configured.
#[derive(Clone)]
pub struct OperatorTokens {
    admin: SecretHash,
    gateway: Option<SecretHash>,
}

impl std::fmt::Debug for OperatorTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperatorTokens")
            .field("admin", &"<redacted>")
            .field("gateway", &self.gateway.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl OperatorTokens {
    /// Checks and hashes the tokens. The secrets themselves are not kept.
    pub fn new(admin: &Secret, gateway: Option<&Secret>) -> Result<Self, TokenError> {
        check_token("admin token", admin)?;
        if let Some(gateway) = gateway {
            check_token("gateway token", gateway)?;
            if gateway.expose() == admin.expose() {
                return Err(TokenError::SameForBothRoles);
            }
        }
        Ok(Self { admin: admin.hash(), gateway: gateway.map(Secret::hash) })
    }

    /// The role of `token`, if it is one of the operator tokens. Both hashes are
    /// always compared, so the time taken does not depend on which one matched.
    pub fn role_of(&self, token: &str) -> Option<Role> {
        let is_admin = self.admin.matches(token);
        let is_gateway = self.gateway.as_ref().is_some_and(|hash| hash.matches(token));
        match (is_admin, is_gateway) {
            (true, _) => Some(Role::Admin),
            (false, true) => Some(Role::Gateway),
            (false, false) => None,
        }
    }

    pub fn has_gateway(&self) -> bool {
        self.gateway.is_some()
    }
}

fn check_token(setting: &'static str, token: &Secret) -> Result<(), TokenError> {
    let value = token.expose();
    if value.chars().count() < TOKEN_CHARS_MIN {
        return Err(TokenError::TooShort { setting });
    }
    if !value.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(TokenError::NotPrintable { setting });
    }
    Ok(())
}

/// The caller's role, from `Authorization: Bearer <token>`.
fn caller_role(parts: &Parts, tokens: &OperatorTokens) -> Result<Role, ApiError> {
    let header = parts.headers.get(AUTHORIZATION).ok_or(ApiError::Unauthorized)?;
    let value = header.to_str().map_err(|_| ApiError::Unauthorized)?;
    let (scheme, token) = value.split_once(' ').ok_or(ApiError::Unauthorized)?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(ApiError::Unauthorized);
    }
    tokens.role_of(token.trim()).ok_or(ApiError::Unauthorized)
}

/// Extracting this succeeds only for the admin token: 401 without a valid
/// token, 403 for the gateway token.
pub struct AdminAuth;

/// Extracting this succeeds for either operator token.
pub struct GatewayAuth;

impl FromRequestParts<AppState> for AdminAuth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        match caller_role(parts, state.tokens())? {
            Role::Admin => Ok(AdminAuth),
            Role::Gateway => Err(ApiError::Forbidden),
        }
    }
}

impl FromRequestParts<AppState> for GatewayAuth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        caller_role(parts, state.tokens()).map(|_| GatewayAuth)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(value: &str) -> Secret {
        Secret::new(value.to_owned())
    }

    #[test]
    fn roles_come_only_from_exact_tokens() {
        let admin = secret("admin-token-0123456789");
        let gateway = secret("gateway-token-0123456789");
        let tokens = OperatorTokens::new(&admin, Some(&gateway)).unwrap();
        assert_eq!(tokens.role_of("admin-token-0123456789"), Some(Role::Admin));
        assert_eq!(tokens.role_of("gateway-token-0123456789"), Some(Role::Gateway));
        assert_eq!(tokens.role_of("admin-token-012345678"), None);
        assert_eq!(tokens.role_of(""), None);
        let admin_only = OperatorTokens::new(&admin, None).unwrap();
        assert_eq!(admin_only.role_of("gateway-token-0123456789"), None);
        assert!(!format!("{tokens:?}").contains("0123456789"));
    }

    #[test]
    fn unusable_tokens_name_their_setting() {
        let good = secret("admin-token-0123456789");
        assert_eq!(
            OperatorTokens::new(&secret("short"), None).unwrap_err(),
            TokenError::TooShort { setting: "admin token" }
        );
        assert_eq!(
            OperatorTokens::new(&good, Some(&secret("gateway token with spaces"))).unwrap_err(),
            TokenError::NotPrintable { setting: "gateway token" }
        );
        assert_eq!(OperatorTokens::new(&good, Some(&good)).unwrap_err(), TokenError::SameForBothRoles);
    }
}
