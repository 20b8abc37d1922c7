//! Integration tests of the client library and `tenurectl` against clusters of real `tenure`
//! node processes (started by `tenure-testkit`; the `tenure` binary comes from the workspace's
//! test build). One test binary for the crate; one module per concern.

mod client_library;
mod fence_check;
mod recipes;
mod sessions;
mod transfer;
mod waits;
mod watch;
