//! # tenure-tests: workspace-level tests
//!
//! One integration-test crate for everything that spans crates: today the architecture rules
//! (what each crate must not depend on); later the cluster, fault-injection and simulation suites
//! with their history checker. All tests live in one test binary, `tests/suite/`, so adding a
//! module never adds a link step.
//!
//! This library part holds helpers shared by the suite's modules; it must never be a dependency
//! of a shipped crate.

/// Root of the workspace (the directory holding the top-level `Cargo.toml`).
pub fn workspace_root() -> std::path::PathBuf {
    let manifest_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .parent()
        .map_or_else(|| manifest_dir.to_path_buf(), std::path::Path::to_path_buf)
}
