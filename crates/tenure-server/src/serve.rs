//! `tenure serve`: one node from start until a signal stops it.
//!
//! Starts the node, then waits for SIGINT or SIGTERM, hands off its groups' leadership and
//! stops; a second SIGINT during the hand-off exits at once. The `tenure` binary and the
//! fault-injection suite's node processes both run exactly this.
//!
//! Must not depend on: the command line (the caller parses it and loads the configuration).

use tokio::signal::unix::{SignalKind, signal};
use tracing::{error, info};

use crate::config::ServerConfig;
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

/// Runs one node until SIGINT or SIGTERM, then stops it gracefully. Must run inside a tokio
/// runtime with I/O and time enabled.
pub async fn serve_until_signalled(config: ServerConfig) -> Result<(), ServerError> {
    let node_id = config.node_id;
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
    let received = tokio::select! {
        _ = interrupt.recv() => "SIGINT",
        _ = terminate.recv() => "SIGTERM",
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
    Ok(())
}
