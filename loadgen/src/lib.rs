//! tenure-loadgen: measures lease services under the same workload, side by side.
//!
//! It drives `tenure` through the native client library (`tenure-client`, QUIC), `tenure-http`
//! through the Tenure v1 HTTP routes, and `etcd` through its v3 gRPC API (cargo feature `etcd`),
//! in closed loop (N workers, each waiting for its answer) or open loop (a fixed arrival rate,
//! latency measured from each operation's intended start so coordinated omission cannot hide a
//! stall). Scenarios: `acquire`, `mixed`, `hold`, `contended`, `expiry`, `handoff`, `scale`
//! (see [`scenario`]).
//!
//! Layout: [`target`] hides the service behind four lease operations; [`keys`] picks resources;
//! [`stats`] records latencies in hdrhistograms and a per-second timeline; [`scenario`] runs the
//! workers; [`node_metrics`] reads the nodes' own counters and gauges; [`node_control`] kills
//! and starts nodes (through `tenure dev`); [`report`] prints the table, writes the JSON report
//! and draws the SVG plot.
//!
//! Must not depend on: any server crate (`tenure-server`, `tenure-storage`,
//! `tenure-transport`), openraft or RocksDB. It sees tenure only as a client does, like the etcd
//! target sees etcd, so both are measured the same way.

pub mod keys;
pub mod node_control;
pub mod node_metrics;
pub mod report;
pub mod scenario;
pub mod stats;
pub mod target;

/// Parses a duration such as `20s`, `1m30s` or `500ms` (humantime syntax).
pub fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    humantime::parse_duration(text).map_err(|error| format!("{text:?}: {error}"))
}
