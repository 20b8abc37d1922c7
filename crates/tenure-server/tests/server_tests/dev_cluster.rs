//! `tenure dev` as a newcomer uses it to watch a failover: a `kill -9` of one node process is
//! reported and the other nodes keep serving; `tenure dev restart|stop|start|kill N` act on one
//! node by id through the running supervisor; `--restart-after-s` brings a dead node back by
//! itself; a second supervisor on the same directory is refused; `tenure dev add` grows the
//! running cluster and `tenure dev replace N` swaps a node for a new one.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::{http_json, send_signal, tail, wait_child_exit, wait_for};

fn tenure(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tenure"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run the tenure binary")
}

/// `tenure dev ACTION [NODE] --data-dir DIR --json`, which must succeed; its JSON answer.
fn dev_action(dir: &str, action: &str, node: Option<u64>) -> Value {
    let node = node.map(|n| n.to_string());
    let mut args = vec!["dev", action];
    if let Some(node) = &node {
        args.push(node);
    }
    args.extend(["--data-dir", dir, "--json"]);
    let output = tenure(&args);
    assert!(
        output.status.success(),
        "tenure dev {action}: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

fn node_field<'a>(reply: &'a Value, id: u64, field: &str) -> &'a Value {
    reply["status"]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["id"] == id)
        .map(|n| &n[field])
        .unwrap()
}

/// A `tenure dev` child that is stopped (SIGTERM) if the test ends early, so a failed assertion
/// never leaves a cluster running (each run is also bounded by `--duration-s`).
struct DevProcess(Child);

impl Drop for DevProcess {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = Command::new("kill")
                .args(["-TERM", &self.0.id().to_string()])
                .status();
            let _ = wait_child_exit(&mut self.0, Duration::from_secs(30));
        }
    }
}

fn start_dev(dir: &Path, log: &Path, extra: &[&str]) -> DevProcess {
    let log_file = std::fs::File::create(log).unwrap();
    let mut args = vec![
        "dev",
        "--data-dir",
        dir.to_str().unwrap(),
        "--nodes",
        "3",
        "--groups",
        "2",
        "--base-port",
        "0",
        "--fsync",
        "false",
        "--ready-timeout-s",
        "90",
        "--duration-s",
        "300",
    ];
    args.extend(extra);
    DevProcess(
        Command::new(env!("CARGO_BIN_EXE_tenure"))
            .args(&args)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::from(log_file.try_clone().unwrap()))
            .stderr(Stdio::from(log_file))
            .spawn()
            .unwrap(),
    )
}

async fn wait_cluster_file(dir: &Path, dev: &mut DevProcess, log: &Path) {
    let child = &mut dev.0;
    let file = dir.join("cluster.json");
    let found = wait_for(Duration::from_secs(120), "cluster.json", || {
        let exists = file.exists();
        let exited = child.try_wait().unwrap();
        async move {
            match exited {
                Some(status) => Some(Err(status)),
                None => exists.then_some(Ok(())),
            }
        }
    })
    .await;
    match found {
        Ok(Ok(())) => {}
        Ok(Err(status)) => panic!("tenure dev exited ({status}):\n{}", tail(log, 40)),
        Err(error) => panic!("{error}:\n{}", tail(log, 40)),
    }
}

const PRINCIPAL: [(&str, &str); 2] = [
    ("x-tenure-principal-id", "dev"),
    ("x-tenure-principal-tenant", "acme"),
];

/// Acquires through `http`, following `NOT_LEADER` hints, until granted (bounded).
async fn acquire(http: &str, resource: &str, request_id: &str) -> Value {
    let body = json!({
        "tenant_id": "acme", "resource_id": resource, "holder_id": "w1",
        "ttl_seconds": 60, "request_id": request_id,
    });
    let mut url = http.to_owned();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (status, answer) = http_json(
            "POST",
            &format!("{url}/v1/leases/acquire"),
            &PRINCIPAL,
            Some(&body),
        )
        .await;
        if status == 200 {
            return answer;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no grant within 30 s: {status} {answer}"
        );
        if let Some(hint) = answer["leader_hint"].as_str() {
            url = hint.to_owned();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs alone (the cluster lock of this binary): three nodes of its own.
#[test]
fn a_killed_node_is_reported_the_rest_serve_and_it_restarts_by_id() {
    crate::common::run_alone(kill_report_restart());
}

async fn kill_report_restart() {
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("dev");
    let dir_str = dir.to_str().unwrap().to_owned();
    let log = temp.path().join("dev.log");
    let mut dev = start_dev(&dir, &log, &[]);
    wait_cluster_file(&dir, &mut dev, &log).await;

    // A second supervisor on the same directory is refused (exit code 2).
    let second = tenure(&["dev", "--data-dir", &dir_str, "--duration-s", "0"]);
    assert_eq!(second.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&second.stderr).contains("already running"),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );

    let status = dev_action(&dir_str, "status", None);
    let pid = node_field(&status, 2, "pid").as_u64().unwrap();
    let node1_http = node_field(&status, 1, "http").as_str().unwrap().to_owned();
    let node2_http = node_field(&status, 2, "http").as_str().unwrap().to_owned();

    // kill -9 from outside, as a newcomer would.
    send_signal(u32::try_from(pid).unwrap(), "KILL");
    wait_for(Duration::from_secs(20), "node 2 reported dead", || {
        let state = node_field(&dev_action(&dir_str, "status", None), 2, "state").clone();
        async move { (state == "died").then_some(()) }
    })
    .await
    .unwrap();
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(
        said.contains("node 2 died (signal: 9 (SIGKILL)); nodes 1, 3 keep serving"),
        "{said}"
    );
    assert!(said.contains("tenure dev restart 2"), "{said}");
    assert!(
        dev.0.try_wait().unwrap().is_none(),
        "tenure dev stopped: {said}"
    );

    // The surviving majority serves.
    let granted = acquire(&node1_http, "db-primary", "req-1").await;
    let token = granted["fencing_token"].clone();

    // Restart node 2 by id; it comes back from its data and is ready.
    let restarted = dev_action(&dir_str, "restart", Some(2));
    assert_eq!(node_field(&restarted, 2, "state"), "running");
    assert_eq!(node_field(&restarted, 2, "starts"), 2);
    let (status, lease) = http_json(
        "GET",
        &format!("{node2_http}/v1/leases/acme/db-primary"),
        &PRINCIPAL,
        None,
    )
    .await;
    assert_eq!(status, 200, "{lease}");
    assert_eq!(lease["lease"]["fencing_token"], token, "{lease}");
    assert_eq!(lease["lease"]["status"], "ACTIVE", "{lease}");

    // Stop and start node 1 by id (graceful: exit status 0).
    let stopped = dev_action(&dir_str, "stop", Some(1));
    assert_eq!(node_field(&stopped, 1, "state"), "stopped");
    assert_eq!(node_field(&stopped, 1, "exit"), "exit status: 0");
    let started = dev_action(&dir_str, "start", Some(1));
    assert_eq!(node_field(&started, 1, "state"), "running");
    // Unknown nodes and starting a running node are refused with exit code 1.
    let refused = tenure(&["dev", "start", "1", "--data-dir", &dir_str]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("already running"));
    let refused = tenure(&["dev", "kill", "9", "--data-dir", &dir_str]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("no node 9"));

    send_signal(dev.0.id(), "TERM");
    let exit = wait_child_exit(&mut dev.0, Duration::from_secs(60)).expect("tenure dev stops");
    assert!(exit.success(), "{}", tail(&log, 20));
    assert!(!dir.join("cluster.json").exists());
    assert!(!dir.join("control.sock").exists());
    let gone = tenure(&["dev", "status", "--data-dir", &dir_str]);
    assert_eq!(gone.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&gone.stderr).contains("no tenure dev is running"));

    // Again on the same data, with automatic restarts: a killed node comes back by itself.
    let log2 = temp.path().join("dev2.log");
    let mut dev = start_dev(&dir, &log2, &["--restart-after-s", "1"]);
    wait_cluster_file(&dir, &mut dev, &log2).await;
    dev_action(&dir_str, "kill", Some(3));
    // `kill` through the supervisor is a requested stop: it stays down.
    let status = dev_action(&dir_str, "status", None);
    assert_eq!(node_field(&status, 3, "state"), "stopped");
    dev_action(&dir_str, "start", Some(3));
    let pid = node_field(&dev_action(&dir_str, "status", None), 3, "pid")
        .as_u64()
        .unwrap();
    send_signal(u32::try_from(pid).unwrap(), "KILL");
    wait_for(
        Duration::from_secs(60),
        "node 3 restarted by itself",
        || {
            let reply = dev_action(&dir_str, "status", None);
            let back = node_field(&reply, 3, "state") == "running"
                && node_field(&reply, 3, "starts").as_u64() == Some(3);
            async move { back.then_some(()) }
        },
    )
    .await
    .unwrap();
    assert!(
        std::fs::read_to_string(&log2)
            .unwrap()
            .contains("restarting it in 1 s"),
        "{}",
        tail(&log2, 20)
    );
    // Grow the running cluster by node 4, then replace node 1 for good by node 5: each new
    // node joins, reports itself and is ready; node 1 stays down (removed from the node table).
    let added = dev_action(&dir_str, "add", None);
    assert_eq!(node_field(&added, 4, "state"), "running", "{added}");
    let replaced = dev_action(&dir_str, "replace", Some(1));
    assert_eq!(node_field(&replaced, 5, "state"), "running", "{replaced}");
    assert_eq!(node_field(&replaced, 1, "state"), "stopped", "{replaced}");
    assert!(dir.join("node-1").join("REMOVED").exists());
    let cluster_file = std::fs::read_to_string(dir.join("cluster.json")).unwrap();
    assert!(
        cluster_file.contains(node_field(&replaced, 5, "client").as_str().unwrap()),
        "{cluster_file}"
    );
    send_signal(dev.0.id(), "TERM");
    let exit = wait_child_exit(&mut dev.0, Duration::from_secs(60)).expect("tenure dev stops");
    assert!(exit.success(), "{}", tail(&log2, 20));
}
