//! Typed errors of the peer transport, by what the caller does next.
//!
//! Must not depend on openraft's error types: the network adapter (`network.rs`) maps these into
//! openraft's `RPCError` / `StreamingError`.

use crate::tls::TlsError;

/// Why a transport operation failed.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// The peer is not a member of this node's transport (never configured or added, or
    /// removed).
    #[error("node {0} is not a member of this cluster's transport")]
    UnknownPeer(u64),
    /// No connection to the peer within the deadline (retry later, with backoff).
    #[error("node {peer} unreachable: {reason}")]
    Unreachable {
        /// The peer.
        peer: u64,
        /// What happened.
        reason: String,
    },
    /// The request was sent but no answer came within the deadline (outcome unknown).
    #[error("no answer from node {peer} within {timeout_ms} ms")]
    Timeout {
        /// The peer.
        peer: u64,
        /// The deadline.
        timeout_ms: u64,
    },
    /// The connection carrying the request closed before the answer (outcome unknown).
    #[error("connection to node {peer} lost before the answer")]
    ConnectionLost {
        /// The peer.
        peer: u64,
    },
    /// The peer answered that it could not handle the request (unknown group, group stopped).
    #[error("node {peer} refused the request: {reason}")]
    Remote {
        /// The peer.
        peer: u64,
        /// Its reason.
        reason: String,
    },
    /// The message is larger than a frame may be.
    #[error("message of {bytes} bytes exceeds the frame maximum of {max} bytes")]
    MessageTooLarge {
        /// Message size.
        bytes: usize,
        /// Frame maximum.
        max: usize,
    },
    /// Bytes that do not decode (from a peer) or a value that does not encode.
    #[error(transparent)]
    Proto(#[from] tenure_proto::ProtoError),
    /// A local I/O failure (snapshot spool file, socket bind).
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Certificates or TLS configuration.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The transport was shut down.
    #[error("transport shut down")]
    Shutdown,
}

impl TransportError {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
    }
}
