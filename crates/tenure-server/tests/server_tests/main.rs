//! Integration tests of the tenure node: real `tenure` processes on loopback (started by
//! `tenure-testkit`), the HTTP and native APIs, the configuration tools, the load generator
//! against a cluster and the operations kit. (The client library's tests are `tenure-client`'s.) One test binary for
//! the crate, so its dependencies (RocksDB above all) are linked once; one module per concern.

mod client_quic_limits;
mod cluster_faults;
mod cluster_lifecycle;
mod config_cli;
mod dev_cluster;
mod elastic;
mod forwarding_lanes;
mod http_api;
mod http_slowloris;
mod insecure_switches;
mod loadgen;
mod loadgen_scale;
mod membership;
mod ops_kit;
mod replay_expiry;
mod tenure_v1_compat;

/// The node-process harness, under the name the modules use.
pub(crate) use tenure_testkit as common;
