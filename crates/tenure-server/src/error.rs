//! Errors of starting and running a node (request errors are `tenure_proto::client::WireError`).
//!
//! Must not depend on: anything but the error types of the crates below.

/// Why a node could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The configuration is unusable.
    #[error("configuration: {0}")]
    Config(String),
    /// The data directory belongs to another node or cluster, or cannot be used.
    #[error("data directory: {0}")]
    DataDir(String),
    /// Storage failed.
    #[error("storage: {0}")]
    Storage(#[from] tenure_storage::StoreError),
    /// The transport failed.
    #[error("transport: {0}")]
    Transport(#[from] tenure_transport::TransportError),
    /// TLS material is unusable.
    #[error("tls: {0}")]
    Tls(#[from] tenure_transport::tls::TlsError),
    /// Raft refused something at start.
    #[error("raft: {0}")]
    Raft(String),
    /// The node table refused this data directory as this node's (a member that lost its data
    /// came back under its old id, or the node was removed): the node stopped serving.
    #[error(
        "excluded from the cluster: {0} (remove the node with `tenurectl node remove` and start \
         it under a new node_id with cluster.join_existing = true)"
    )]
    Excluded(String),
    /// The process's descriptor limit cannot hold what the node may open.
    #[error("descriptor limit: {0}")]
    DescriptorLimit(String),
    /// An I/O operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The error.
        source: std::io::Error,
    },
}

impl ServerError {
    /// An I/O error with context.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        ServerError::Io {
            context: context.into(),
            source,
        }
    }
}
