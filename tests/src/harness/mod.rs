//! The fault-injection harness: real clusters of separate node processes, client processes that
//! record a history, a seeded nemesis, and a run that ties them together and hands the history
//! to the [`crate::checker`].
//!
//! - [`network`]: namespaces, veths and iptables (root), or loopback and the nodes' fault layer.
//! - [`cluster`]: certificates, configurations and node processes (`nemesis node`, which runs
//!   `tenure_server::serve`, exactly what `tenure serve` runs), kill -9, SIGSTOP, restart, clock
//!   and disk faults, partitions, status.
//! - [`workload`]: a client process (`nemesis client`): tasks using `tenure-client` on a small
//!   contended keyspace, fenced writes, exactly-once probes, one JSON line per operation.
//! - [`locker`]: `tenurectl lock` run again and again by a client process, its command
//!   (`nemesis lock-child`) writing signs of life the checker judges.
//! - [`schedule`]: the nemesis plan, a pure function of the seed.
//! - [`run`]: one run from start to verdict, and its report.
//! - [`zombie`]: the fencing demo's holder (`nemesis zombie`), paused between checking its
//!   deadline and writing.
//!
//! Must not be a dependency of any shipped crate.

pub mod cluster;
pub mod locker;
pub mod network;
pub mod run;
pub mod schedule;
pub mod workload;
pub mod zombie;

/// Everything that can stop a run before the checker judges it.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// An I/O operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The error.
        source: std::io::Error,
    },
    /// The network could not be set up as asked.
    #[error("network: {0}")]
    Network(String),
    /// The cluster could not be set up or did not become ready.
    #[error("cluster: {0}")]
    Cluster(String),
    /// A client process failed.
    #[error("client: {0}")]
    Client(String),
    /// The fenced store failed.
    #[error(transparent)]
    Store(#[from] crate::fencing::StoreError),
}

impl HarnessError {
    /// An I/O error with context.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        HarnessError::Io {
            context: context.into(),
            source,
        }
    }
}
