//! Who is asking: bearer tokens (stored as SHA-256 hashes) mapped to a principal and its tenant,
//! and the insecure development mode that trusts principal headers.
//!
//! Must not depend on: the network or the groups; this is a lookup table.

use std::collections::{HashMap, HashSet};

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
    /// The principal is a cluster operator: it may also change the cluster's membership (move a
    /// group's replicas). A property of the principal: all its tokens must agree. Default false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub operator: bool,
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
    operators: HashSet<String>,
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
        let mut operator_of: HashMap<&str, bool> = HashMap::new();
        for (index, token) in config.tokens.iter().enumerate() {
            if *operator_of
                .entry(token.principal_id.as_str())
                .or_insert(token.operator)
                != token.operator
            {
                return Err(TokenConfigError {
                    index,
                    reason: format!(
                        "principal {:?} has tokens that disagree on `operator`",
                        token.principal_id
                    ),
                });
            }
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
        let operators = operator_of
            .into_iter()
            .filter(|(_, operator)| *operator)
            .map(|(principal, _)| principal.to_owned())
            .collect();
        Ok(Authenticator {
            by_hash,
            operators,
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

impl Authenticator {
    /// `FORBIDDEN` unless `principal` is a cluster operator: a principal whose tokens say
    /// `operator = true` and who authenticated (`claimed` is false), or anyone in insecure
    /// development mode.
    pub fn check_operator(&self, principal: &Principal, claimed: bool) -> Result<(), WireError> {
        if self.insecure_dev_mode || (!claimed && self.operators.contains(&principal.principal_id))
        {
            return Ok(());
        }
        Err(WireError::new(
            ErrorCode::Forbidden,
            format!(
                "principal {:?} is not a cluster operator (a token with `operator = true`)",
                principal.principal_id
            ),
        ))
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn token(principal: &str, secret: &str, operator: bool) -> TokenConfig {
        TokenConfig {
            sha256: token_sha256_hex(secret),
            principal_id: principal.into(),
            tenant_id: "acme".into(),
            operator,
        }
    }

    #[test]
    fn only_authenticated_operators_may_change_membership() {
        let auth = Authenticator::new(&AuthConfig {
            insecure_dev_mode: false,
            tokens: vec![token("ops", "s1", true), token("svc", "s2", false)],
        })
        .unwrap();
        let ops = auth.authenticate_bearer("s1").unwrap();
        let svc = auth.authenticate_bearer("s2").unwrap();
        assert!(auth.check_operator(&ops, false).is_ok());
        // A claimed (unauthenticated) operator name is not an operator.
        assert_eq!(
            auth.check_operator(&ops, true).unwrap_err().code,
            ErrorCode::Forbidden
        );
        assert_eq!(
            auth.check_operator(&svc, false).unwrap_err().code,
            ErrorCode::Forbidden
        );
        // Insecure development mode trusts everyone.
        let dev = Authenticator::new(&AuthConfig {
            insecure_dev_mode: true,
            tokens: Vec::new(),
        })
        .unwrap();
        assert!(dev.check_operator(&svc, true).is_ok());
    }

    #[test]
    fn tokens_of_one_principal_must_agree_on_operator() {
        let error = Authenticator::new(&AuthConfig {
            insecure_dev_mode: false,
            tokens: vec![token("ops", "s1", true), token("ops", "s2", false)],
        })
        .unwrap_err();
        assert_eq!(error.index, 1);
        assert!(error.reason.contains("disagree"), "{error}");
    }
}
