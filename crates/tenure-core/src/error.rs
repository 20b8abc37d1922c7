//! Error codes of the lease contract and the typed errors the state machine produces.
//!
//! [`ErrorCode`] lists exactly the codes of the contract (sections 2 and 7); every layer maps
//! its errors onto it. [`LeaseError`] is what applying a command can decide. Errors are values
//! of the replicated state (they are stored for request-id deduplication and snapshotted), so
//! they are plain data: serialisable, comparable, no boxed sources.

use std::fmt;

use compact_str::CompactString;
use serde::{Deserialize, Serialize};

use crate::ids::{LeaseId, SessionId};

/// Every error code of the contract. Names and wire spellings are fixed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ErrorCode {
    /// The request is malformed or outside a documented bound.
    InvalidArgument,
    /// The caller is not authenticated.
    Unauthorized,
    /// The caller may not act on this tenant.
    Forbidden,
    /// The resource has no lease record.
    NotFound,
    /// Another lease on the resource is active.
    AlreadyHeld,
    /// The lease named has expired or was released.
    LeaseExpired,
    /// The lease id or holder id does not match the current lease.
    LeaseMismatch,
    /// A tenant or group quota would be exceeded.
    QuotaExceeded,
    /// The tenant's request rate is over its limit.
    RateLimited,
    /// The node or group cannot take more work now.
    Overloaded,
    /// The node is not the leader of the key's group.
    NotLeader,
    /// The group has no leader or cannot reach a quorum.
    Unavailable,
    /// A bug or an unexpected failure inside tenure.
    Internal,
}

impl ErrorCode {
    /// All codes, in documentation order.
    pub const ALL: [ErrorCode; 13] = [
        ErrorCode::InvalidArgument,
        ErrorCode::Unauthorized,
        ErrorCode::Forbidden,
        ErrorCode::NotFound,
        ErrorCode::AlreadyHeld,
        ErrorCode::LeaseExpired,
        ErrorCode::LeaseMismatch,
        ErrorCode::QuotaExceeded,
        ErrorCode::RateLimited,
        ErrorCode::Overloaded,
        ErrorCode::NotLeader,
        ErrorCode::Unavailable,
        ErrorCode::Internal,
    ];

    /// The wire spelling, e.g. `ALREADY_HELD`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidArgument => "INVALID_ARGUMENT",
            ErrorCode::Unauthorized => "UNAUTHORIZED",
            ErrorCode::Forbidden => "FORBIDDEN",
            ErrorCode::NotFound => "NOT_FOUND",
            ErrorCode::AlreadyHeld => "ALREADY_HELD",
            ErrorCode::LeaseExpired => "LEASE_EXPIRED",
            ErrorCode::LeaseMismatch => "LEASE_MISMATCH",
            ErrorCode::QuotaExceeded => "QUOTA_EXCEEDED",
            ErrorCode::RateLimited => "RATE_LIMITED",
            ErrorCode::Overloaded => "OVERLOADED",
            ErrorCode::NotLeader => "NOT_LEADER",
            ErrorCode::Unavailable => "UNAVAILABLE",
            ErrorCode::Internal => "INTERNAL",
        }
    }

    /// Whether a caller may retry the same request unchanged (contract section 2).
    pub fn retryable(self) -> bool {
        matches!(
            self,
            ErrorCode::NotLeader
                | ErrorCode::Unavailable
                | ErrorCode::RateLimited
                | ErrorCode::Overloaded
        )
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which quota an operation ran into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum QuotaKind {
    /// The tenant's maximum number of active leases.
    TenantActiveLeases,
    /// The group's maximum number of lease records (active and retained inactive ones).
    GroupLeaseRecords,
    /// The group's maximum number of distinct tenants.
    GroupTenants,
    /// The group's maximum number of session records (appended with sessions).
    GroupSessions,
    /// The tenant's maximum number of active sessions in one group.
    TenantSessions,
    /// The most waiters one resource's queue holds (appended with wait queues).
    ResourceWaiters,
    /// The most waiters one group holds.
    GroupWaiters,
    /// The most waiters one tenant has in one group (its active-lease quota).
    TenantWaiters,
}

impl fmt::Display for QuotaKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            QuotaKind::TenantActiveLeases => "tenant active leases",
            QuotaKind::GroupLeaseRecords => "group lease records",
            QuotaKind::GroupTenants => "group tenants",
            QuotaKind::GroupSessions => "group session records",
            QuotaKind::TenantSessions => "tenant active sessions",
            QuotaKind::ResourceWaiters => "resource waiters",
            QuotaKind::GroupWaiters => "group waiters",
            QuotaKind::TenantWaiters => "tenant waiters",
        })
    }
}

/// Why the state machine refused work it could otherwise do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum OverloadReason {
    /// The request-id table is full of records younger than the guaranteed retention, so a new
    /// record would have to drop one a client may still retry.
    DedupTableFull,
}

impl fmt::Display for OverloadReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OverloadReason::DedupTableFull => {
                "request-id table is full within its minimum retention"
            }
        })
    }
}

/// Why a queued wait ended without a grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum WaitEndReason {
    /// Its `wait_ms` passed before the resource was handed to it.
    TimedOut,
    /// Its holder cancelled it.
    Cancelled,
    /// Its session's record in the group ended (expired or closed) before a hand-off reached it.
    SessionEnded,
    /// The resource was handed over while the waiter's ttl no longer fitted the tenant's bounds.
    TtlOutOfBounds,
}

impl fmt::Display for WaitEndReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WaitEndReason::TimedOut => "its wait passed",
            WaitEndReason::Cancelled => "it was cancelled",
            WaitEndReason::SessionEnded => "its session ended",
            WaitEndReason::TtlOutOfBounds => "its ttl is outside the tenant's bounds",
        })
    }
}

/// An error decided by the lease state machine. Deterministic: every replica decides the same.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum LeaseError {
    /// The request is malformed or outside a documented bound; `reason` names field and bound.
    #[error("invalid argument: {field}: {reason}")]
    InvalidArgument {
        /// The offending field.
        field: CompactString,
        /// What is wrong with it, naming the bound where there is one.
        reason: String,
    },
    /// The resource has no lease record (never leased, or its record was garbage-collected).
    #[error("no lease record for this resource")]
    NotFound,
    /// Another lease is active; acquire is not re-entrant, so this includes the same holder.
    #[error("resource is held by {holder_id:?} for another {remaining_ttl_ms} ms")]
    AlreadyHeld {
        /// The current holder.
        holder_id: CompactString,
        /// Log-time milliseconds until the current lease expires unless renewed.
        remaining_ttl_ms: u64,
    },
    /// The resource's lease has expired or was released.
    #[error("lease {lease_id} has expired or was released")]
    LeaseExpired {
        /// The lease id named in the request.
        lease_id: LeaseId,
    },
    /// The lease id or holder id does not match the resource's current lease.
    #[error("lease {lease_id} with this holder is not the resource's current lease")]
    LeaseMismatch {
        /// The lease id named in the request.
        lease_id: LeaseId,
    },
    /// A quota would be exceeded.
    #[error("quota exceeded: {kind} (limit {limit})")]
    QuotaExceeded {
        /// Which quota.
        kind: QuotaKind,
        /// Its value.
        limit: u64,
    },
    /// The group cannot take this request now; retry later.
    #[error("overloaded: {reason}")]
    Overloaded {
        /// What is full.
        reason: OverloadReason,
    },
    /// The group has no record of the session (never opened here, or its record's retention
    /// ended). Appended with sessions; code NOT_FOUND.
    #[error("session {session_id} is not open in this group")]
    SessionNotFound {
        /// The session named in the request.
        session_id: SessionId,
    },
    /// The group's record of the session has expired or was closed; a session never comes back.
    /// Code LEASE_EXPIRED.
    #[error("session {session_id} has expired or was closed in this group")]
    SessionExpired {
        /// The session named in the request.
        session_id: SessionId,
    },
    /// A queued wait ended without the resource being handed to it. Appended with wait queues;
    /// code ALREADY_HELD (the resource stayed with others for the whole wait).
    #[error("wait ended without a grant: {reason}")]
    WaitEnded {
        /// Why.
        reason: WaitEndReason,
    },
}

impl LeaseError {
    /// Builds an [`LeaseError::InvalidArgument`].
    pub fn invalid(field: &str, reason: impl Into<String>) -> Self {
        LeaseError::InvalidArgument {
            field: CompactString::from(field),
            reason: reason.into(),
        }
    }

    /// The contract code of this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            LeaseError::InvalidArgument { .. } => ErrorCode::InvalidArgument,
            LeaseError::NotFound => ErrorCode::NotFound,
            LeaseError::AlreadyHeld { .. } => ErrorCode::AlreadyHeld,
            LeaseError::LeaseExpired { .. } => ErrorCode::LeaseExpired,
            LeaseError::LeaseMismatch { .. } => ErrorCode::LeaseMismatch,
            LeaseError::QuotaExceeded { .. } => ErrorCode::QuotaExceeded,
            LeaseError::Overloaded { .. } => ErrorCode::Overloaded,
            LeaseError::SessionNotFound { .. } => ErrorCode::NotFound,
            LeaseError::SessionExpired { .. } => ErrorCode::LeaseExpired,
            LeaseError::WaitEnded { .. } => ErrorCode::AlreadyHeld,
        }
    }

    /// Whether the caller may retry the same request unchanged.
    pub fn retryable(&self) -> bool {
        self.code().retryable()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retryable_codes_are_exactly_those_of_the_contract() {
        let retryable: Vec<_> = ErrorCode::ALL
            .iter()
            .filter(|c| c.retryable())
            .map(|c| c.as_str())
            .collect();
        assert_eq!(
            retryable,
            ["RATE_LIMITED", "OVERLOADED", "NOT_LEADER", "UNAVAILABLE"]
        );
    }

    #[test]
    fn wire_spellings_are_upper_snake_case_and_distinct() {
        let mut seen = std::collections::HashSet::new();
        for code in ErrorCode::ALL {
            let text = code.as_str();
            assert!(
                text.chars().all(|c| c.is_ascii_uppercase() || c == '_'),
                "{text}"
            );
            assert!(seen.insert(text));
        }
    }
}
