//! # tenure-tests: workspace-level tests
//!
//! One integration-test crate for everything that spans crates: the architecture rules (what
//! each crate must not depend on) and the fault-injection suite. All tests live in one test
//! binary, `tests/suite/`, so adding a module never adds a link step.
//!
//! The fault-injection suite (Jepsen-style):
//! - [`history`]: what a run records (operations with invoke and completion times, outcomes,
//!   lease ids, fencing tokens, safe deadlines; fenced writes; faults).
//! - [`checker`]: the lease-safety checker (single holder, fencing, nothing acknowledged lost,
//!   exactly-once, linearizability, liveness after heal), each violation with its slice of
//!   history. Pure: the deterministic simulation will share it.
//! - [`faults`]: the one list of fault kinds, with one name each, that the fault suite and the
//!   simulation share.
//! - [`fencing`]: the toy downstream store that rejects stale tokens.
//! - [`harness`]: real node processes, network namespaces and iptables (or the nodes' fault
//!   layer), client processes, the seeded nemesis, one run end to end.
//! - the `nemesis` binary: the long mode (`--runs N --duration 60s --summary-json FILE`), and
//!   the `node` and `client` processes of a run.
//!
//! The deterministic simulation ([`sim`]): whole clusters of the real server code in one
//! thread on turmoil, every fault from a seed, checked after every step and by the same
//! checker; the `sim` binary is its long mode (`--seeds N --summary-json FILE`).
//!
//! This crate must never be a dependency of a shipped crate.

pub mod checker;
pub mod faults;
pub mod fencing;
pub mod harness;
pub mod history;
pub mod sim;

/// Root of the workspace (the directory holding the top-level `Cargo.toml`).
pub fn workspace_root() -> std::path::PathBuf {
    let manifest_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .parent()
        .map_or_else(|| manifest_dir.to_path_buf(), std::path::Path::to_path_buf)
}
