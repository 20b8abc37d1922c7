//! Integration tests of the pure lease state machine: operations, the model-based property tests,
//! quotas and snapshots. One test binary for the crate, so its dependencies are linked once; one
//! module per concern.

mod common;
mod model;
mod operations;
mod quotas;
mod sessions;
mod snapshot;
mod transfer;
mod waits;
mod watch;
