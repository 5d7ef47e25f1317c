//! Operator tokens and their three roles.
//!
//! The server keeps only the SHA-256 hash of each token. A presented token is
//! hashed and compared with every configured hash in constant time, so neither
//! the comparison's duration nor a log line can reveal a token.
//!
//! The viewer role exists for the operator console only: it signs in to
//! `/console` and sees every page, and every `/v1` route refuses it with
//! 403, so a read-only token can never change anything.

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use sha2::{Digest, Sha256};
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
    /// Read the operator console; nothing else.
    Viewer,
}

/// The shortest operator token accepted: long enough that guessing is hopeless
/// even without rate limiting.
pub const TOKEN_CHARS_MIN: usize = 16;

/// Why a set of operator tokens is unusable. Each names its setting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenError {
    TooShort {
        setting: &'static str,
    },
    NotPrintable {
        setting: &'static str,
    },
    SameForBothRoles,
    /// The viewer token equals the admin or the gateway token.
    ViewerSameAsAnother,
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
            TokenError::ViewerSameAsAnother => f.write_str(
                "the viewer token must differ from the admin and gateway tokens, or a read-only sign-in could act",
            ),
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
    viewer: Option<SecretHash>,
    /// Signs console sessions and their CSRF tokens. Derived from the admin
    /// token under its own label (not its stored hash), so every server
    /// with the same admin token accepts the same sessions, and changing
    /// the admin token ends them all.
    console_key: [u8; 32],
}

impl std::fmt::Debug for OperatorTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperatorTokens")
            .field("admin", &"<redacted>")
            .field("gateway", &self.gateway.as_ref().map(|_| "<redacted>"))
            .field("viewer", &self.viewer.as_ref().map(|_| "<redacted>"))
            .finish_non_exhaustive()
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
        let console_key = Sha256::new()
            .chain_update(b"tollgate console session key v1\0")
            .chain_update(admin.expose().as_bytes())
            .finalize()
            .into();
        Ok(Self { admin: admin.hash(), gateway: gateway.map(Secret::hash), viewer: None, console_key })
    }

    /// Adds the read-only viewer token, which signs in to the console only.
    pub fn with_viewer(mut self, viewer: &Secret) -> Result<Self, TokenError> {
        check_token("viewer token", viewer)?;
        let presented = viewer.hash();
        if self.admin.matches_hash(&presented)
            || self.gateway.as_ref().is_some_and(|hash| hash.matches_hash(&presented))
        {
            return Err(TokenError::ViewerSameAsAnother);
        }
        self.viewer = Some(presented);
        Ok(self)
    }

    /// The role of `token`, if it is one of the operator tokens. Every hash is
    /// always compared, so the time taken does not depend on which one matched.
    /// The token is hashed once for all of them.
    pub fn role_of(&self, token: &str) -> Option<Role> {
        let presented = SecretHash::of(token);
        let is_admin = self.admin.matches_hash(&presented);
        let is_gateway = self.gateway.as_ref().is_some_and(|hash| hash.matches_hash(&presented));
        let is_viewer = self.viewer.as_ref().is_some_and(|hash| hash.matches_hash(&presented));
        match (is_admin, is_gateway, is_viewer) {
            (true, _, _) => Some(Role::Admin),
            (false, true, _) => Some(Role::Gateway),
            (false, false, true) => Some(Role::Viewer),
            (false, false, false) => None,
        }
    }

    pub fn has_gateway(&self) -> bool {
        self.gateway.is_some()
    }

    pub fn has_viewer(&self) -> bool {
        self.viewer.is_some()
    }

    /// The key console sessions are signed with.
    pub(crate) fn console_key(&self) -> &[u8; 32] {
        &self.console_key
    }

    /// The stored hash of `role`'s token, which a console session is bound
    /// to, so that replacing a token ends the sessions it opened.
    pub(crate) fn hash_of(&self, role: Role) -> Option<&SecretHash> {
        match role {
            Role::Admin => Some(&self.admin),
            Role::Gateway => self.gateway.as_ref(),
            Role::Viewer => self.viewer.as_ref(),
        }
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

/// Extracting this succeeds for the admin and gateway tokens: 401 without a
/// valid token, 403 for the viewer token.
pub struct GatewayAuth;

impl FromRequestParts<AppState> for AdminAuth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        match caller_role(parts, state.tokens())? {
            Role::Admin => Ok(AdminAuth),
            Role::Gateway | Role::Viewer => Err(ApiError::Forbidden),
        }
    }
}

impl FromRequestParts<AppState> for GatewayAuth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        match caller_role(parts, state.tokens())? {
            Role::Admin | Role::Gateway => Ok(GatewayAuth),
            Role::Viewer => Err(ApiError::Forbidden),
        }
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
        let gateway = secret("gateway-token-0123456789");
        let both = OperatorTokens::new(&good, Some(&gateway)).unwrap();
        assert_eq!(both.clone().with_viewer(&good).unwrap_err(), TokenError::ViewerSameAsAnother);
        assert_eq!(both.clone().with_viewer(&gateway).unwrap_err(), TokenError::ViewerSameAsAnother);
        assert_eq!(both.with_viewer(&secret("short")).unwrap_err(), TokenError::TooShort { setting: "viewer token" });
    }

    #[test]
    fn the_viewer_token_has_the_viewer_role_only() {
        let admin = secret("admin-token-0123456789");
        let viewer = secret("viewer-token-0123456789");
        let tokens = OperatorTokens::new(&admin, None).unwrap().with_viewer(&viewer).unwrap();
        assert_eq!(tokens.role_of("viewer-token-0123456789"), Some(Role::Viewer));
        assert_eq!(tokens.role_of("admin-token-0123456789"), Some(Role::Admin));
        assert!(tokens.has_viewer());
        assert!(!format!("{tokens:?}").contains("0123456789"));
    }

    #[test]
    fn the_console_key_follows_the_admin_token_only() {
        let admin = secret("admin-token-0123456789");
        let one = OperatorTokens::new(&admin, None).unwrap();
        let two = OperatorTokens::new(&admin, Some(&secret("gateway-token-0123456789"))).unwrap();
        let other = OperatorTokens::new(&secret("admin-token-9876543210"), None).unwrap();
        assert_eq!(one.console_key(), two.console_key());
        assert_ne!(one.console_key(), other.console_key());
        assert_ne!(one.console_key(), admin.hash().as_bytes());
    }
}
