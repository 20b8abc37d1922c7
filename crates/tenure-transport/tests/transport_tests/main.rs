//! Integration tests of the QUIC transport: bad input from peers, TLS identities, in-process
//! clusters, peers added, removed and refused at runtime. One test binary for the crate, so its
//! dependencies (RocksDB above all) are linked once; one module per concern.

mod bad_input;
mod cluster;
mod membership;
mod restart_reset;
mod tls;
