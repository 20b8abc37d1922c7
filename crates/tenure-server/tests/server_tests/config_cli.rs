//! The `tenure` binary's configuration handling and tools, without a running cluster: bad
//! configuration files are refused with messages that name the problem, the example
//! configuration is valid and documents the true defaults, `tenure certs` writes and never
//! overwrites, `tenure hash-token` prints what the configuration stores.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use tenure_server::config::{
    self, AuthConfig, ClusterConfig, LimitsConfig, StorageConfig, TestingConfig, TimingConfig,
};

fn tenure(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tenure"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run the tenure binary")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn example_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../ops/config/tenure.example.toml")
}

const VALID: &str = r#"
node_id = 1
data_dir = "data"

[peers.1]
addr = "127.0.0.1:7401"
http_addr = "127.0.0.1:7501"

[peers.2]
addr = "127.0.0.1:7402"
http_addr = "127.0.0.1:7502"

[peers.3]
addr = "127.0.0.1:7403"
http_addr = "127.0.0.1:7503"

[tls]
ca_cert = "certs/ca.pem"
node_cert = "certs/node-1.pem"
node_key = "certs/node-1.key"
"#;

/// Writes `text` as a configuration file and runs `tenure ARGS --config FILE`.
fn with_config(text: &str, command: &str) -> (Output, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tenure.toml");
    std::fs::write(&path, text).unwrap();
    let output = tenure(&[command, "--config", path.to_str().unwrap()]);
    (output, dir)
}

/// Asserts that the configuration is refused by both `config-check` and `serve` with exit code 2
/// and a message containing every one of `expected`.
fn assert_refused(text: &str, expected: &[&str]) {
    for command in ["config-check", "serve"] {
        let (output, _dir) = with_config(text, command);
        let message = stderr(&output);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{command} should exit 2; stderr: {message}"
        );
        for part in expected {
            assert!(
                message.contains(part),
                "{command}: expected {part:?} in: {message}"
            );
        }
        assert!(stdout(&output).is_empty(), "{command} printed to stdout");
    }
}

#[test]
fn valid_config_passes_config_check() {
    let (output, dir) = with_config(VALID, "config-check");
    assert!(output.status.success(), "{}", stderr(&output));
    let printed = stdout(&output);
    assert!(printed.contains("valid"), "{printed}");
    // The effective configuration is complete TOML that reads back.
    let body: String = printed
        .lines()
        .filter(|line| !line.starts_with('#'))
        .map(|line| format!("{line}\n"))
        .collect();
    let reread = config::parse(&body, "printed").unwrap();
    let base = std::path::absolute(dir.path()).unwrap();
    assert_eq!(reread.data_dir, base.join("data"));
    assert_eq!(reread.timing, TimingConfig::default());
    assert_eq!(reread.groups, 64);
}

#[test]
fn syntax_error_names_file_line_and_column() {
    let text = VALID.replace("[tls]", "[tls");
    assert_refused(&text, &["tenure.toml:17:", "[tls"]);
}

#[test]
fn unknown_field_is_named() {
    let text = format!("{VALID}\n[timing]\nheartbeat_interval_ms = 300\n");
    assert_refused(
        &text,
        &[
            "field `timing.heartbeat_interval_ms`",
            "unknown field `heartbeat_interval_ms`",
        ],
    );
}

#[test]
fn wrong_type_is_named() {
    let text = format!("{VALID}\n[limits]\nttl_ms_max = \"1h\"\n");
    assert_refused(&text, &["field `limits.ttl_ms_max`", "invalid type"]);
}

#[test]
fn node_id_not_in_peers_is_refused() {
    let text = VALID.replace("node_id = 1", "node_id = 4");
    assert_refused(&text, &["invalid `node_id`", "node 4 is not in peers"]);
}

#[test]
fn replication_factor_above_peers_is_refused() {
    let text = VALID.replace(
        "data_dir = \"data\"",
        "data_dir = \"data\"\nreplication_factor = 5",
    );
    assert_refused(&text, &["invalid `replication_factor`", "1..=3"]);
}

#[test]
fn quota_limits_over_the_node_memory_budget_are_refused() {
    // 10 M lease records per group (the old default) over 64 groups on every node.
    let text = format!("{VALID}\n[limits]\ngroup_lease_records_max = 10000000\n");
    assert_refused(
        &text,
        &[
            "limits.node_memory_budget_bytes",
            "64 groups",
            "10000000 lease records",
        ],
    );
    // A budget too small for the default tenants alone.
    let text = format!("{VALID}\n[limits]\nnode_memory_budget_bytes = 100000\n");
    assert_refused(&text, &["limits.node_memory_budget_bytes", "no room"]);
}

#[test]
fn bad_token_hash_is_refused() {
    let text = format!(
        "{VALID}\n[[auth.tokens]]\nsha256 = \"not-a-hash\"\nprincipal_id = \"svc\"\ntenant_id = \"acme\"\n"
    );
    assert_refused(&text, &["auth.tokens[0].sha256", "64 hex digits"]);
}

#[test]
fn missing_required_field_is_named() {
    let text = VALID.replace("node_key = \"certs/node-1.key\"\n", "");
    assert_refused(&text, &["field `tls.node_key`", "missing field"]);
}

#[test]
fn unreadable_file_is_refused() {
    let output = tenure(&["config-check", "--config", "/nonexistent/tenure.toml"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains("cannot read the configuration file /nonexistent/tenure.toml"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn example_config_is_valid_and_states_the_defaults() {
    let path = example_path();
    let output = tenure(&["config-check", "--config", path.to_str().unwrap()]);
    assert!(output.status.success(), "{}", stderr(&output));

    // Every value the example sets is the documented default.
    let example = config::load(&path).unwrap();
    assert_eq!(example.cluster_name, "tenure");
    assert_eq!(example.groups, 64);
    assert_eq!(example.replication_factor, 3);
    assert_eq!(example.timing, TimingConfig::default());
    assert_eq!(example.limits, LimitsConfig::default());
    assert_eq!(example.auth, AuthConfig::default());
    assert_eq!(example.storage, StorageConfig::default());
    assert_eq!(example.cluster, ClusterConfig::default());
    assert_eq!(example.testing, TestingConfig::default());
    let config_dir = std::path::absolute(path.parent().unwrap()).unwrap();
    assert_eq!(example.data_dir, config_dir.join("data/node-1"));
    assert_eq!(example.tls.ca_cert, config_dir.join("certs/ca.pem"));

    // The commented token example is a real hash of "secret".
    let text = std::fs::read_to_string(&path).unwrap();
    let hash = tenure_server::auth::token_sha256_hex("secret");
    assert!(text.contains(&hash), "the example's token hash is stale");
}

#[test]
fn certs_for_nodes_are_written_once() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("certs");
    let out_str = out.to_str().unwrap();
    let output = tenure(&["certs", "--nodes", "1,2,3", "--out", out_str]);
    assert!(output.status.success(), "{}", stderr(&output));
    let printed = stdout(&output);
    for name in [
        "ca.pem",
        "ca.key",
        "node-1.pem",
        "node-1.key",
        "node-2.pem",
        "node-2.key",
        "node-3.pem",
        "node-3.key",
    ] {
        let path = out.join(name);
        assert!(path.is_file(), "{name} missing");
        assert!(
            printed.contains(path.to_str().unwrap()),
            "{name} not printed: {printed}"
        );
    }
    let ca_before = std::fs::read(out.join("ca.pem")).unwrap();
    let again = tenure(&["certs", "--nodes", "1,2,3", "--out", out_str]);
    assert_eq!(again.status.code(), Some(1), "{}", stderr(&again));
    assert!(stderr(&again).contains("ca.key"), "{}", stderr(&again));
    assert_eq!(std::fs::read(out.join("ca.pem")).unwrap(), ca_before);
}

#[test]
fn certs_for_a_config_land_where_the_config_expects_them() {
    let (output, dir) = with_config(VALID, "certs");
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(dir.path().join("certs/node-3.key").is_file());
    let config = config::load(&dir.path().join("tenure.toml")).unwrap();
    tenure_transport::tls::NodeTls::load(
        1,
        &config.tls.ca_cert,
        &config.tls.node_cert,
        &config.tls.node_key,
    )
    .unwrap();
}

#[test]
fn certs_needs_a_source() {
    let output = tenure(&["certs"]);
    assert_eq!(output.status.code(), Some(2));
    let output = tenure(&["certs", "--nodes", "1,2"]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
}

#[test]
fn hash_token_prints_the_sha256() {
    let output = tenure(&["hash-token", "secret"]);
    assert!(output.status.success());
    let printed = stdout(&output);
    let hash = printed.trim();
    assert_eq!(hash.len(), 64, "{printed}");
    assert!(hash.bytes().all(|b| b.is_ascii_hexdigit()));
    assert_eq!(hash, tenure_server::auth::token_sha256_hex("secret"));

    let mut child = Command::new(env!("CARGO_BIN_EXE_tenure"))
        .args(["hash-token", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(b"secret\n").unwrap();
    let output = child.wait_with_output().unwrap();
    assert_eq!(stdout(&output).trim(), hash);
}

#[test]
fn data_dir_of_another_node_is_refused_by_serve() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    tenure_server::identity::claim_data_dir(&data, 2, "tenure").unwrap();
    let path = dir.path().join("tenure.toml");
    std::fs::write(&path, VALID).unwrap();
    let output = tenure(&["serve", "--config", path.to_str().unwrap()]);
    assert!(!output.status.success());
    let message = stderr(&output);
    assert!(
        message.contains("belongs to node 2 of cluster \"tenure\", this is node 1"),
        "{message}"
    );
}

/// `tenure dev` end to end with one small node: `cluster.json` appears once the node is ready
/// and disappears at SIGTERM (exit 0); a second run restarts the same cluster; flags that
/// disagree with the recorded shape are refused.
#[test]
fn dev_writes_cluster_json_stops_on_sigterm_and_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let dev_dir = dir.path().join("dev");
    let dev_str = dev_dir.to_str().unwrap();
    let args = [
        "dev",
        "--data-dir",
        dev_str,
        "--nodes",
        "1",
        "--groups",
        "2",
        "--base-port",
        "0",
        "--fsync",
        "false",
        "--ready-timeout-s",
        "60",
    ];
    let mut child = Command::new(env!("CARGO_BIN_EXE_tenure"))
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let cluster_file = dev_dir.join("cluster.json");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    while !cluster_file.exists() {
        if let Some(status) = child.try_wait().unwrap() {
            let output = child.wait_with_output().unwrap();
            panic!("tenure dev exited early ({status}): {}", stderr(&output));
        }
        assert!(std::time::Instant::now() < deadline, "no cluster.json");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cluster_file).unwrap()).unwrap();
    assert_eq!(json["groups"], 2);
    assert_eq!(json["nodes"][0]["id"], 1);
    assert!(
        json["nodes"][0]["http"]
            .as_str()
            .unwrap()
            .starts_with("http://127.0.0.1:")
    );
    assert!(Path::new(json["ca_cert"].as_str().unwrap()).is_file());

    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(
        stdout(&output).contains("cluster.json"),
        "{}",
        stdout(&output)
    );
    assert!(stderr(&output).contains("INSECURE DEVELOPMENT MODE"));
    assert!(!cluster_file.exists());

    // The same directory restarts the same cluster (shape flags may be left out).
    let again = tenure(&["dev", "--data-dir", dev_str, "--duration-s", "0"]);
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(stdout(&again).contains("restarted"), "{}", stdout(&again));

    let refused = tenure(&["dev", "--data-dir", dev_str, "--nodes", "3"]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        stderr(&refused).contains("--nodes 1, not 3"),
        "{}",
        stderr(&refused)
    );
}
