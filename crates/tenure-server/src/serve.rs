//! `tenure serve`: one node from start until a signal stops it.
//!
//! Checks first that the process's descriptor limit can hold everything the node opens (see
//! [`check_descriptor_limit`]), raising the soft limit to the hard one. Starts the node, then
//! waits for SIGINT or SIGTERM, hands off its groups' leadership and
//! stops; a second SIGINT during the hand-off exits at once. The `tenure` binary and the
//! fault-injection suite's node processes both run exactly this.
//!
//! It does not check the configuration's test and insecure switches: `tenure serve` does that
//! before calling it ([`crate::config::ServerConfig::check_insecure_switches`]: refused unless
//! the operator passes the flag and every bound address is loopback). The fault suite's node
//! processes call it directly because they run fault control inside network namespaces the suite
//! creates, on addresses that are not loopback; they are test executables, never shipped.
//!
//! Must not depend on: the command line (the caller parses it and loads the configuration).

use tokio::signal::unix::{SignalKind, signal};
use tracing::{error, info};

use crate::config::{LimitsConfig, ServerConfig};
use crate::error::ServerError;
use crate::node::Node;

/// Makes any panic, on any thread, end the process (after the usual message): a broken internal
/// invariant (a fencing token that would not increase, an index naming an empty slot) must stop
/// the node, not just the tokio task it happened on, which would leave a replica half-alive.
/// Binaries that run a node call this first.
pub fn abort_on_panic() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        std::process::abort();
    }));
}

/// Files RocksDB keeps open at most: the storage's `max_open_files` default.
pub const ROCKSDB_OPEN_FILES_MAX: u64 = tenure_storage::MAX_OPEN_FILES_DEFAULT as u64;
/// Descriptors a node uses besides RocksDB's files and HTTP connections: the QUIC endpoint's UDP
/// socket (every QUIC connection, client or peer, shares it, so the QUIC connection caps cost no
/// descriptors), the HTTP listener, the log and snapshot files, the runtime's epoll and event
/// descriptors, standard streams, and room for a connection being refused.
pub const DESCRIPTORS_MARGIN: u64 = 256;

/// The descriptor limit a node runs with, as [`check_descriptor_limit`] left it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DescriptorBudget {
    /// The soft `RLIMIT_NOFILE` now in force (`None`: unlimited).
    pub limit: Option<u64>,
    /// The soft limit before the check raised it, when it did.
    pub raised_from: Option<u64>,
    /// What the node needs at most.
    pub needed: u64,
}

/// The descriptors a node with these limits needs at most.
pub fn descriptors_needed(limits: &LimitsConfig) -> u64 {
    u64::from(limits.http_connections_max)
        .saturating_add(ROCKSDB_OPEN_FILES_MAX)
        .saturating_add(DESCRIPTORS_MARGIN)
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (when allowed), then checks that it can hold
/// [`descriptors_needed`]: `limits.http_connections_max` connections, RocksDB's open files and
/// [`DESCRIPTORS_MARGIN`]. Otherwise the node must not start: an HTTP flood would otherwise take
/// the descriptors RocksDB needs, a WAL sync would fail and every group on the node would stop.
pub fn check_descriptor_limit(limits: &LimitsConfig) -> Result<DescriptorBudget, ServerError> {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let needed = descriptors_needed(limits);
    let before = getrlimit(Resource::Nofile);
    let mut raised_from = None;
    if before.current.is_some() && before.current != before.maximum {
        let raised = Rlimit {
            current: before.maximum,
            maximum: before.maximum,
        };
        match setrlimit(Resource::Nofile, raised) {
            Ok(()) => raised_from = before.current,
            Err(error) => tracing::warn!(%error, "cannot raise RLIMIT_NOFILE to its hard limit"),
        }
    }
    let now = getrlimit(Resource::Nofile);
    match now.current {
        Some(limit) if limit < needed => Err(ServerError::DescriptorLimit(format!(
            "the descriptor limit RLIMIT_NOFILE is {limit} (hard limit {}), but this node needs              up to {needed}: limits.http_connections_max = {} HTTP connections + {} RocksDB              open files + {} for its own sockets and files. Raise the limit (`ulimit -n`,              systemd `LimitNOFILE=`) or lower limits.http_connections_max",
            now.maximum
                .map_or_else(|| "unlimited".to_owned(), |hard| hard.to_string()),
            limits.http_connections_max,
            ROCKSDB_OPEN_FILES_MAX,
            DESCRIPTORS_MARGIN,
        ))),
        limit => Ok(DescriptorBudget {
            limit,
            raised_from,
            needed,
        }),
    }
}

/// Runs one node until SIGINT or SIGTERM, then stops it gracefully. Must run inside a tokio
/// runtime with I/O and time enabled.
pub async fn serve_until_signalled(config: ServerConfig) -> Result<(), ServerError> {
    let node_id = config.node_id;
    let budget = check_descriptor_limit(&config.limits)?;
    info!(
        node = node_id,
        limit = ?budget.limit,
        raised_from = ?budget.raised_from,
        needed = budget.needed,
        "descriptor limit"
    );
    // Listen before starting, so a signal during start-up is not lost.
    let mut interrupt = signal(SignalKind::interrupt())
        .map_err(|error| ServerError::io("listening for SIGINT", error))?;
    let mut terminate = signal(SignalKind::terminate())
        .map_err(|error| ServerError::io("listening for SIGTERM", error))?;
    let node = Node::start(config).await?;
    info!(
        node = node_id,
        client = %node.client_addr(),
        http = %node.http_addr(),
        "node started"
    );
    let excluded = node.excluded();
    let mut retired = node.retired();
    let received = tokio::select! {
        _ = interrupt.recv() => "SIGINT",
        _ = terminate.recv() => "SIGTERM",
        // Excluded: exit once retired (at once, or for a founder excluded before any node table
        // existed, once one exists: `crate::replica_gate`).
        Ok(()) = async { retired.wait_for(|retired| *retired).await.map(|_| ()) } => {
            let reason = excluded.borrow().clone();
            node.stop().await;
            return Err(ServerError::Excluded(reason.unwrap_or_default()));
        }
    };
    info!(
        node = node_id,
        "{received}: handing off leadership and stopping"
    );
    let stopping = tokio::spawn(node.shutdown_gracefully());
    tokio::select! {
        joined = stopping => {
            if let Err(join_error) = joined {
                error!(node = node_id, "shutdown failed: {join_error}");
                return Err(ServerError::io(
                    "stopping the node",
                    std::io::Error::other(join_error.to_string()),
                ));
            }
        }
        _ = interrupt.recv() => {
            error!(node = node_id, "second SIGINT: exiting without finishing the shutdown");
            return Err(ServerError::io(
                "stopping the node",
                std::io::Error::other("interrupted during shutdown"),
            ));
        }
    }
    info!(node = node_id, "stopped");
    // Signalled while excluded (lingering: `crate::replica_gate`): the exit still says why.
    if let Some(reason) = excluded.borrow().clone() {
        return Err(ServerError::Excluded(reason));
    }
    Ok(())
}
