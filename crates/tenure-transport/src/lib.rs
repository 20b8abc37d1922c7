//! # tenure-transport: many Raft groups over one QUIC connection per node pair
//!
//! Hundreds of groups on a few nodes must not mean hundreds of connections, thousands of
//! heartbeat packets and one syscall per message. Each node runs one quinn endpoint
//! ([`Transport`]); exactly one mutually authenticated QUIC connection per pair of nodes carries
//! the Raft traffic of every group between them, in both directions. Messages to one peer are
//! gathered by per-lane writers into length-prefixed batch frames (format in `tenure-proto`).
//! Lane 0 carries heartbeats, votes and leader transfers (with a longer linger, so every heartbeat
//! due to one peer at a driver tick shares a frame); a group's replication stream always uses the
//! same other lane, so it stays in order while other lanes flow.
//!
//! - [`Transport`]: endpoint, peer links, handshake (version, cluster, node identity proven by
//!   the certificate), reconnect with capped exponential backoff and jitter, bounded queues.
//!   Peers are added and removed at runtime ([`Transport::add_peer`],
//!   [`Transport::remove_peer`]); a [`PeerAdmission`] policy refuses certificates by their
//!   SHA-256 (revoked ones) on both sides of a connection.
//! - [`GroupNetworkFactory`]: openraft's network traits (pipelined `stream_append`, votes and
//!   pre-votes, leader transfer, snapshots on their own streams) for one group.
//! - [`GroupRegistry`] / [`GroupTable`]: how incoming messages find their group.
//! - [`spawn_heartbeat_driver`] and [`GroupTiming`]: node-wide heartbeats, so every heartbeat due
//!   to one peer leaves in one frame; timing fit for many groups.
//! - [`tls`]: cluster CA and node certificates (rcgen), rustls/quinn configurations.
//! - [`FaultInjector`]: drop, delay, duplicate, reorder and partition per directed link, for
//!   tests.
//!
//! Bad input from a peer (garbage, truncated frames, oversize lengths, unknown kinds or versions,
//! unknown nodes) closes that connection with a logged reason; unknown groups get a failure
//! answer. Nothing a peer sends can panic the node.
//!
//! Must not depend on: the lease semantics of `tenure-core` beyond the shared type config,
//! configuration files, or the wall clock (timeouts use tokio's monotonic clock). It never
//! creates a runtime: the server owns it.

pub mod certs;
pub mod config;
pub mod connection_ids;
pub mod error;
pub mod fault;
mod heartbeat;
mod inbound;
mod link;
mod network;
mod pacer;
mod registry;
pub mod stats;
#[cfg(feature = "testing")]
pub mod testing;
pub mod tls;
mod transport;

pub use config::{ClientQuicLimits, FRAME_BYTES_MAX_DEFAULT, GroupTiming, TransportConfig};
pub use error::TransportError;
pub use fault::{FaultInjector, LinkFaults, Verdict};
pub use heartbeat::spawn_heartbeat_driver;
pub use link::{
    CLOSE_DROPPED, CLOSE_DUPLICATE, CLOSE_PROTOCOL_ERROR, CLOSE_REFUSED, CLOSE_REMOVED,
    CLOSE_SHUTDOWN,
};
pub use network::{GroupNetworkFactory, PeerRaftClient};
pub use registry::{ClientAcceptor, GroupRaft, GroupRegistry, GroupTable};
pub use stats::{TransportStats, TransportStatsSnapshot};
pub use tls::{PeerAdmission, certificate_sha256, peer_certificate_sha256};
pub use transport::{Transport, bind_endpoint, grant_peer_limits};
