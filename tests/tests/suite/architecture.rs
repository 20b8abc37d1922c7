//! Architecture rules written as absences (see ARCHITECTURE.md), enforced.
//!
//! tenure-core is the pure lease state machine: no async runtime, no storage engine, no network,
//! no clock, no randomness. These tests fail the build the day someone adds one.

use std::path::Path;
use std::process::Command;

use tenure_tests::workspace_root;

/// Crates that would give tenure-core a runtime, I/O, a network or randomness.
const FORBIDDEN_IN_CORE: &[&str] = &[
    "tokio",
    "async-std",
    "futures",
    "mio",
    "socket2",
    "quinn",
    "quinn-proto",
    "rustls",
    "openraft",
    "rocksdb",
    "librocksdb-sys",
    "rand",
    "rand_core",
    "getrandom",
    "libc",
    "tracing",
    "metrics",
];

fn normal_dependencies(package: &str) -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let manifest = workspace_root().join("Cargo.toml");
    let output = Command::new(cargo)
        .args([
            "tree",
            "--offline",
            "--locked",
            "-e",
            "normal",
            "--prefix",
            "none",
            "--format",
            "{p}",
            "-p",
            package,
        ])
        .arg("--manifest-path")
        .arg(&manifest)
        .output()
        .expect("run cargo tree");
    assert!(
        output.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut names: Vec<String> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next().map(str::to_owned))
        .collect();
    names.sort();
    names.dedup();
    names
}

#[test]
fn tenure_core_depends_on_no_runtime_storage_network_or_randomness() {
    let names = normal_dependencies("tenure-core");
    assert!(
        names.iter().any(|n| n == "tenure-core"),
        "cargo tree listed nothing: {names:?}"
    );
    let found: Vec<_> = names
        .iter()
        .filter(|name| FORBIDDEN_IN_CORE.contains(&name.as_str()))
        .collect();
    assert!(
        found.is_empty(),
        "tenure-core must not depend on {found:?}; its tree: {names:?}"
    );
}

#[test]
fn tenure_storage_depends_on_no_network_stack() {
    assert_tree_excludes(
        "tenure-storage",
        "rocksdb",
        &[
            "quinn",
            "quinn-proto",
            "rustls",
            "hyper",
            "axum",
            "tonic",
            "reqwest",
        ],
    );
}

#[test]
fn tenure_proto_is_sans_io() {
    assert_tree_excludes(
        "tenure-proto",
        "bytes",
        &[
            "tokio",
            "mio",
            "quinn",
            "quinn-proto",
            "rustls",
            "openraft",
            "rocksdb",
            "tracing",
        ],
    );
}

fn rust_sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read source dir") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn tenure_core_source_reads_no_clock_environment_file_socket_or_thread() {
    // Absences in the library source itself (tests may do as they like).
    let forbidden = [
        "std::time",
        "SystemTime",
        "Instant",
        "std::fs",
        "std::net",
        "std::env",
        "std::thread",
        "std::process",
        "RandomState",
        "thread_rng",
    ];
    let mut files = Vec::new();
    rust_sources(&workspace_root().join("crates/tenure-core/src"), &mut files);
    assert!(!files.is_empty());
    let mut violations = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read source");
        for (number, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for word in forbidden {
                if code.contains(word) {
                    violations.push(format!("{}:{}: {word}", file.display(), number + 1));
                }
            }
        }
    }
    assert!(
        violations.is_empty(),
        "tenure-core must stay pure:\n{}",
        violations.join("\n")
    );
}

/// Asserts `package`'s normal dependency tree contains `expected` (so the tree was listed) and
/// none of `forbidden`.
fn assert_tree_excludes(package: &str, expected: &str, forbidden: &[&str]) {
    let names = normal_dependencies(package);
    assert!(
        names.iter().any(|n| n == expected),
        "cargo tree listed no {expected}: {names:?}"
    );
    let found: Vec<_> = names
        .iter()
        .filter(|name| forbidden.contains(&name.as_str()))
        .collect();
    assert!(found.is_empty(), "{package} must not depend on {found:?}");
}

#[test]
fn tenure_client_depends_on_no_server_storage_or_raft() {
    assert_tree_excludes(
        "tenure-client",
        "quinn",
        &[
            "tenure-server",
            "tenure-storage",
            "tenure-transport",
            "openraft",
            "rocksdb",
            "librocksdb-sys",
            "axum",
        ],
    );
}

#[test]
fn tenure_loadgen_sees_tenure_only_as_a_client() {
    // The load generator measures tenure the way it measures etcd: through client libraries.
    assert_tree_excludes(
        "tenure-loadgen",
        "tenure-client",
        &[
            "tenure-server",
            "tenure-storage",
            "tenure-transport",
            "openraft",
            "rocksdb",
            "librocksdb-sys",
        ],
    );
}
