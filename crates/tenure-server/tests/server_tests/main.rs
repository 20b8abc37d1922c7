//! Integration tests of the tenure node: real `tenure` processes on loopback, the HTTP and native
//! APIs, the client library, the configuration tools and the operations kit. One test binary for
//! the crate, so its dependencies (RocksDB above all) are linked once; one module per concern.

mod client_library;
mod client_quic_limits;
mod cluster_faults;
mod cluster_lifecycle;
mod common;
mod config_cli;
mod forwarding_lanes;
mod http_api;
mod http_slowloris;
mod insecure_switches;
mod loadgen;
mod ops_kit;
mod replay_expiry;
mod tenure_v1_compat;
