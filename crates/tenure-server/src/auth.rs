//! Who is asking: bearer tokens (stored as SHA-256 hashes) mapped to a principal and its tenant,
//! and the insecure development mode that trusts principal headers.
//!
//! Must not depend on: the network or the groups; this is a lookup table.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tenure_core::ErrorCode;
use tenure_proto::client::{Principal, WireError};

/// Authentication.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// Development only: accept the Tenure principal headers (HTTP) and request principals (QUIC)
    /// without authentication. `tenure dev` sets it and logs loudly. Default false.
    pub insecure_dev_mode: bool,
    /// Bearer tokens, stored as SHA-256 hashes (`tenure hash-token TOKEN` prints one). In TOML:
    /// one `[[auth.tokens]]` table per token. Default none.
    pub tokens: Vec<TokenConfig>,
}

/// One bearer token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenConfig {
    /// Hex SHA-256 of the token (64 hex digits, as `tenure hash-token` prints). Required.
    pub sha256: String,
    /// The principal it authenticates. Required, non-empty.
    pub principal_id: String,
    /// The only tenant it may touch. Required, non-empty.
    pub tenant_id: String,
}

/// Hex SHA-256 of a token, as the configuration stores it.
pub fn token_sha256_hex(token: &str) -> String {
    let digest = Sha256::digest(token.as_bytes());
    digest.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// Resolves credentials to principals.
#[derive(Debug, Clone)]
pub struct Authenticator {
    by_hash: HashMap<[u8; 32], Principal>,
    insecure_dev_mode: bool,
}

/// Why a configured token hash is unusable.
#[derive(Debug, thiserror::Error)]
#[error("auth.tokens[{index}].sha256: {reason}")]
pub struct TokenConfigError {
    /// Position in the list.
    pub index: usize,
    /// What is wrong.
    pub reason: String,
}

impl Authenticator {
    /// Builds the table from the configuration.
    pub fn new(config: &AuthConfig) -> Result<Self, TokenConfigError> {
        let mut by_hash = HashMap::new();
        for (index, token) in config.tokens.iter().enumerate() {
            let text = token.sha256.trim();
            if text.len() != 64 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(TokenConfigError {
                    index,
                    reason: "expected 64 hex digits (SHA-256 of the token)".into(),
                });
            }
            let mut hash = [0u8; 32];
            for (i, byte) in hash.iter_mut().enumerate() {
                *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).map_err(|e| {
                    TokenConfigError {
                        index,
                        reason: e.to_string(),
                    }
                })?;
            }
            if token.tenant_id.trim().is_empty() || token.principal_id.trim().is_empty() {
                return Err(TokenConfigError {
                    index,
                    reason: "principal_id and tenant_id must not be empty".into(),
                });
            }
            by_hash.insert(
                hash,
                Principal {
                    principal_id: token.principal_id.clone(),
                    tenant_id: token.tenant_id.clone(),
                },
            );
        }
        Ok(Authenticator {
            by_hash,
            insecure_dev_mode: config.insecure_dev_mode,
        })
    }

    /// Whether principal headers are trusted without authentication.
    pub fn insecure_dev_mode(&self) -> bool {
        self.insecure_dev_mode
    }

    /// The principal of a bearer token, or `UNAUTHORIZED`.
    pub fn authenticate_bearer(&self, token: &str) -> Result<Principal, WireError> {
        let hash: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        self.by_hash
            .get(&hash)
            .cloned()
            .ok_or_else(|| WireError::new(ErrorCode::Unauthorized, "unknown bearer token"))
    }
}

/// `FORBIDDEN` unless `principal` belongs to `tenant_id`.
pub fn check_tenant(principal: &Principal, tenant_id: &str) -> Result<(), WireError> {
    if principal.tenant_id == tenant_id {
        Ok(())
    } else {
        Err(WireError::new(
            ErrorCode::Forbidden,
            format!(
                "principal {:?} of tenant {:?} may not touch tenant {:?}",
                principal.principal_id, principal.tenant_id, tenant_id
            ),
        ))
    }
}
