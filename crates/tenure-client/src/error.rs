//! The client's typed errors: what failed, and whether the caller may retry.
//!
//! Must not depend on: the connection or routing code; these are plain values.

use std::time::Duration;

use tenure_core::{ErrorCode, LeaseError};
use tenure_proto::client::WireError;

/// Everything a client call can fail with.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ClientError {
    /// The cluster answered with an error (the contract's error shape).
    #[error("{code}: {message}")]
    Server {
        /// The contract's code.
        code: ErrorCode,
        /// The server's message.
        message: String,
        /// Whether the same request may succeed when retried.
        retryable: bool,
        /// The state machine's decision, when it made one (e.g. the holder for `ALREADY_HELD`).
        lease_error: Option<LeaseError>,
        /// For `RATE_LIMITED` and `OVERLOADED`: the server's retry hint.
        retry_after_ms: Option<u32>,
    },
    /// The call's overall deadline passed before an answer; the last failure is attached.
    #[error("no answer within {timeout_ms} ms after {attempts} attempt(s); last failure: {last}")]
    DeadlineExceeded {
        /// The call's deadline.
        timeout_ms: u64,
        /// Attempts made.
        attempts: u32,
        /// Why the last attempt failed.
        last: String,
    },
    /// The call was retried the configured number of times without an answer.
    #[error("gave up after {attempts} attempts; last failure: {last}")]
    RetriesExhausted {
        /// Attempts made.
        attempts: u32,
        /// Why the last attempt failed.
        last: String,
    },
    /// Too many requests of this client are in flight to one node; the call waited up to one
    /// attempt's deadline for room (back-pressure; retry later or raise
    /// `inflight_per_node_max`).
    #[error("too many requests in flight to node {node}: waited {waited_ms} ms for room")]
    Busy {
        /// The node.
        node: String,
        /// How long the call waited.
        waited_ms: u64,
    },
    /// No node of the cluster could be reached or answered the routing request.
    #[error("no node reachable: {0}")]
    NoNodeReachable(String),
    /// A request that is invalid before it is sent (too big, a batch spanning groups, ...).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The configuration or the cluster file is unusable.
    #[error("configuration: {0}")]
    Config(String),
    /// The node answered something this client does not understand.
    #[error("protocol: {0}")]
    Protocol(String),
    /// The client was closed.
    #[error("the client is closed")]
    Closed,
}

impl ClientError {
    /// A stable name for the error: the contract's code (`ALREADY_HELD`, ...) when the cluster
    /// decided, else `DEADLINE_EXCEEDED`, `RETRIES_EXHAUSTED`, `BUSY`, `UNREACHABLE`,
    /// `INVALID_REQUEST`, `CONFIG`, `PROTOCOL` or `CLOSED`.
    pub fn code_str(&self) -> &'static str {
        match self {
            ClientError::Server { code, .. } => code.as_str(),
            ClientError::DeadlineExceeded { .. } => "DEADLINE_EXCEEDED",
            ClientError::RetriesExhausted { .. } => "RETRIES_EXHAUSTED",
            ClientError::Busy { .. } => "BUSY",
            ClientError::NoNodeReachable(_) => "UNREACHABLE",
            ClientError::InvalidRequest(_) => "INVALID_REQUEST",
            ClientError::Config(_) => "CONFIG",
            ClientError::Protocol(_) => "PROTOCOL",
            ClientError::Closed => "CLOSED",
        }
    }

    /// The contract's error code, when the cluster decided.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Server { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// Whether retrying may succeed: retryable server codes (`NOT_LEADER`, `UNAVAILABLE`,
    /// `RATE_LIMITED`, `OVERLOADED`), deadlines, back-pressure and unreachable clusters. A
    /// retry of a lease operation must reuse its request id (the client does this itself for
    /// the retries it makes; see [`crate::AcquireOptions::request_id`]).
    pub fn is_retryable(&self) -> bool {
        match self {
            ClientError::Server { retryable, .. } => *retryable,
            ClientError::DeadlineExceeded { .. }
            | ClientError::RetriesExhausted { .. }
            | ClientError::Busy { .. }
            | ClientError::NoNodeReachable(_) => true,
            ClientError::InvalidRequest(_)
            | ClientError::Config(_)
            | ClientError::Protocol(_)
            | ClientError::Closed => false,
        }
    }

    /// True when the resource is held by someone else (`ALREADY_HELD`).
    pub fn is_already_held(&self) -> bool {
        self.code() == Some(ErrorCode::AlreadyHeld)
    }

    /// For `ALREADY_HELD`: the current holder and the log-time milliseconds its lease has left.
    pub fn current_holder(&self) -> Option<(&str, u64)> {
        match self {
            ClientError::Server {
                lease_error:
                    Some(LeaseError::AlreadyHeld {
                        holder_id,
                        remaining_ttl_ms,
                    }),
                ..
            } => Some((holder_id.as_str(), *remaining_ttl_ms)),
            _ => None,
        }
    }

    /// True when the lease named is not (or no longer) the resource's current lease:
    /// `LEASE_EXPIRED`, `LEASE_MISMATCH` or `NOT_FOUND`. Renewing it again cannot succeed.
    pub fn is_lease_gone(&self) -> bool {
        matches!(
            self.code(),
            Some(ErrorCode::LeaseExpired | ErrorCode::LeaseMismatch | ErrorCode::NotFound)
        )
    }

    /// The server's retry hint, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            ClientError::Server {
                retry_after_ms: Some(ms),
                ..
            } => Some(Duration::from_millis(u64::from(*ms))),
            _ => None,
        }
    }

    pub(crate) fn from_wire(error: WireError) -> Self {
        ClientError::Server {
            code: error.code,
            message: error.message,
            retryable: error.retryable,
            lease_error: error.lease_error,
            retry_after_ms: error.retry_after_ms,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn classification_follows_the_contract() {
        let held = ClientError::from_wire(WireError::from_lease_error(LeaseError::AlreadyHeld {
            holder_id: "other".into(),
            remaining_ttl_ms: 900,
        }));
        assert!(held.is_already_held());
        assert!(!held.is_retryable());
        assert_eq!(held.current_holder(), Some(("other", 900)));
        let not_leader = ClientError::from_wire(WireError::new(ErrorCode::NotLeader, "moved"));
        assert!(not_leader.is_retryable());
        assert!(!not_leader.is_lease_gone());
        let gone = ClientError::from_wire(WireError::new(ErrorCode::LeaseMismatch, "no"));
        assert!(gone.is_lease_gone());
        assert!(
            ClientError::DeadlineExceeded {
                timeout_ms: 1,
                attempts: 1,
                last: String::new()
            }
            .is_retryable()
        );
        assert!(!ClientError::Closed.is_retryable());
    }
}
