//! # tenure-server: the tenure node
//!
//! A node hosts replicas of many Raft groups (`tenure-transport` carries their messages,
//! `tenure-storage` keeps their logs and state machines), maps keys to groups with
//! `tenure-core`'s placement function, stamps log time on the commands its groups' leaders
//! propose, reclaims expired leases, and serves clients: the native QUIC client protocol
//! (`tenure-proto::client`, [`client_server`]) and the Tenure v1 HTTP API ([`http`]). Requests for
//! a group this node does not lead are forwarded to the leader ([`forward`]) or answered with
//! `NOT_LEADER`.
//!
//! Module map:
//! - [`config`]: the TOML configuration, defaults, validation.
//! - [`identity`]: the data directory's owner (a directory of another node is refused).
//! - [`admission`]: in-flight bounds per node and tenant; renewals ahead of acquires.
//! - [`auth`]: bearer tokens -> principals; tenant checks.
//! - [`clock`]: the monotonic clock abstraction (and its skewed test variant).
//! - [`fault_control`]: fault injection while the node runs (tests only: clock rate, slow WAL
//!   syncs, cut links).
//! - [`group`]: one hosted group: its leader clock, proposal batching, reads.
//! - [`expiry_pace`]: when a group leader may propose its next Expire (command rate, pacing).
//! - [`node`]: starting and stopping a node (start-up and wiring).
//! - [`serve`]: `tenure serve`: a node until SIGINT or SIGTERM, then a graceful stop.
//! - [`request`]: the request path, one request end to end: tenant check, admission, routing,
//!   local proposal or read, forwarding, answer, metrics.
//! - [`shared`]: the state the request path and the background tasks share; readiness.
//! - [`background`]: expiry, leader balancing, the leader-table exchange, gauges, and the
//!   shutdown hand-off, one module each.
//! - [`placement`]: the configured layout: which nodes a fresh cluster places each group on.
//! - [`replicas`]: this node's replicas: opened at start from the recorded set (the layout on a
//!   data directory's first start), created and dropped at run time.
//! - [`replica_gate`]: keeps peers away from a first start's replicas until the node table
//!   accepts this data directory (a member that lost its data must not vote or acknowledge).
//! - [`membership`]: moving a group's replica between nodes (learner, catch-up, joint
//!   consensus, drop), run by the group's leader.
//! - [`client_server`]: the QUIC side of the client protocol.
//! - [`forward`]: connections to other nodes' client endpoints for forwarding.
//! - [`http`]: the axum gateway (Tenure v1 routes, health, readiness, metrics, OpenAPI).
//! - [`metrics`]: metric names and the Prometheus exporter.
//! - [`limits`]: the bounds that tie one crate's limits to another's, checked at start.
//! - [`dev`], [`certs`]: the `tenure dev` and `tenure certs` commands.
//!
//! Must not depend on: anything above it (client library, loadgen, tests).

// `WireError` (about 150 bytes) is the error of most request paths and is returned by value on
// purpose: it crosses tasks and the wire unchanged, and boxing it would allocate on every refusal.
#![allow(clippy::result_large_err)]

pub mod admission;
pub mod auth;
pub mod background;
pub mod certs;
pub mod client_server;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod dev;
pub mod error;
pub(crate) mod expiry_pace;
pub mod fault_control;
pub mod forward;
pub mod founders;
pub mod group;
pub mod http;
pub mod identity;
pub mod limits;
pub mod membership;
pub mod metrics;
pub mod node;
pub mod placement;
pub mod replica_gate;
pub mod replicas;
pub mod request;
pub mod serve;
pub mod shared;
pub(crate) mod waits;
pub(crate) mod watch;

pub use config::ServerConfig;
pub use error::ServerError;
pub use node::{Node, NodeEnv};
pub use request::{RequestContext, Service};
