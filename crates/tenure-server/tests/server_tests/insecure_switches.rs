//! Test and insecure switches are locked out of production (issue 19, item 4): `tenure serve`
//! refuses `auth.insecure_dev_mode`, `storage.fsync = false`, `[testing] fault_control`,
//! `clock_rate_ppm`, `clock_offset_ms` and `negative_control` unless `--allow-insecure-loopback-only` is given and every address it binds
//! is loopback; a secure node refuses a principal that an insecure node forwards on its client's
//! word; `/testing/faults` answers only authenticated callers.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    missing_docs
)]

use crate::common;

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{ClusterOptions, ProcessCluster, TENANT, TestToken, http_json};
use serde_json::json;
use tenure_core::{AcquireRequest, ErrorCode, NegativeControl, ResourceKey};
use tenure_proto::client::{Principal, RequestBody};
use tenure_server::config::{PeerConfig, ServerConfig};

/// The flag, spelled out (the test must mean the same flag on every build).
const FLAG: &str = "--allow-insecure-loopback-only";
const TENANT_HEADER: &str = "X-Tenure-Principal-Tenant";
const TOKEN: &str = "token-of-acme";

/// A change of a configuration that turns one switch on.
type Switch = fn(&mut ServerConfig);

fn switches() -> Vec<(&'static str, Switch)> {
    let mut switches: Vec<(&'static str, Switch)> = vec![
        ("auth.insecure_dev_mode", |c| {
            c.auth.insecure_dev_mode = true
        }),
        ("testing.fault_control", |c| c.testing.fault_control = true),
        ("testing.clock_rate_ppm", |c| {
            c.testing.clock_rate_ppm = 100_000
        }),
        ("testing.clock_offset_ms", |c| {
            c.testing.clock_offset_ms = 600_000
        }),
        ("storage.fsync", |c| c.storage.fsync = false),
    ];
    // A build without the `negative-controls` feature refuses the control in validation already.
    if NegativeControl::AVAILABLE {
        switches.push(("testing.negative_control", |c| {
            c.testing.negative_control = NegativeControl::SkipExpiryCheck
        }));
    }
    switches
}

/// A one-node configuration with real certificates, binding `ip` on ports free a moment ago.
fn one_node_config(dir: &std::path::Path, ip: Ipv4Addr) -> ServerConfig {
    let certs = common::write_certs(dir, &[1]);
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let peers: BTreeMap<u64, PeerConfig> = [(
        1,
        PeerConfig {
            addr: SocketAddr::from((ip, udp.local_addr().unwrap().port())),
            http_addr: SocketAddr::from((ip, tcp.local_addr().unwrap().port())),
        },
    )]
    .into();
    let options = ClusterOptions {
        nodes: 1,
        groups: 1,
        insecure_dev_mode: false,
        ..ClusterOptions::default()
    };
    common::node_config(1, &dir.join("data"), &certs, &peers, &options)
}

/// Runs `tenure serve --config FILE [FLAG]` on `config`; `Ok(stderr)` when it exits by itself
/// within 10 s with code 2, `Err(what happened)` otherwise (a node that starts is stopped).
fn serve_refuses(
    config: &ServerConfig,
    dir: &std::path::Path,
    flag: bool,
) -> Result<String, String> {
    let path = dir.join("tenure.toml");
    common::write_config(&path, config);
    let log_path = dir.join("serve.log");
    let log = common::append_file(&log_path);
    let mut command = Command::new(common::tenure_bin());
    command
        .arg("serve")
        .arg("--config")
        .arg(&path)
        .env("RUST_LOG", "info,openraft=warn")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log);
    if flag {
        command.arg(FLAG);
    }
    let mut child = command.spawn().unwrap();
    let status = common::wait_child_exit(&mut child, Duration::from_secs(10));
    let output = std::fs::read_to_string(&log_path).unwrap_or_default();
    match status {
        Some(status) if status.code() == Some(2) => Ok(output),
        Some(status) => Err(format!("exited with {status}: {output}")),
        None => {
            let _ = child.kill();
            let _ = child.wait();
            Err(format!(
                "started and ran for 10 s: {}",
                common::tail(&log_path, 5)
            ))
        }
    }
}

#[test]
fn insecure_switches_are_refused_by_serve_on_non_loopback_addresses() {
    let mut failures = Vec::new();
    for (field, switch) in switches() {
        for flag in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            // 0.0.0.0: every interface, the address a production node typically binds.
            let mut config = one_node_config(dir.path(), Ipv4Addr::UNSPECIFIED);
            switch(&mut config);
            match serve_refuses(&config, dir.path(), flag) {
                Ok(message) if message.contains(field) && message.contains("non-loopback") => {
                    println!(
                        "{field} on 0.0.0.0 (flag: {flag}) refused: {}",
                        message.trim()
                    );
                }
                Ok(message) => failures.push(format!(
                    "{field} on 0.0.0.0 (flag: {flag}): refused without naming the switch and the \
                     address: {message}"
                )),
                Err(what) => failures.push(format!("{field} on 0.0.0.0 (flag: {flag}): {what}")),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn insecure_switches_need_the_flag_even_on_loopback() {
    let mut failures = Vec::new();
    for (field, switch) in switches() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = one_node_config(dir.path(), Ipv4Addr::LOCALHOST);
        switch(&mut config);
        match serve_refuses(&config, dir.path(), false) {
            Ok(message) if message.contains(field) && message.contains(FLAG) => {
                println!(
                    "{field} on loopback without the flag refused: {}",
                    message.trim()
                );
            }
            Ok(message) => failures.push(format!(
                "{field} on loopback: refused without naming the switch and the flag: {message}"
            )),
            Err(what) => failures.push(format!("{field} on loopback without the flag: {what}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn acme_token() -> TestToken {
    TestToken {
        token: TOKEN.to_string(),
        principal_id: "svc-acme".to_string(),
        tenant_id: TENANT.to_string(),
    }
}

fn acquire(resource: &str, request: &str) -> serde_json::Value {
    json!({
        "tenant_id": TENANT,
        "resource_id": resource,
        "holder_id": "h",
        "ttl_seconds": 30,
        "request_id": request,
    })
}

/// Node 1 runs in insecure development mode, nodes 2 and 3 require tokens. A request that only
/// claims its tenant reaches node 1 for a key led by node 2 or 3: the leader must refuse the
/// principal node 1 forwards on the client's word, while the same request with a token is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_claimed_principal_from_insecure_peer_is_refused() {
    let cluster = ProcessCluster::start_ready(ClusterOptions {
        nodes: 3,
        groups: 3,
        insecure_dev_mode: false,
        tokens: vec![acme_token()],
        configure: Some(|id, config| config.auth.insecure_dev_mode = id == 1),
        ..ClusterOptions::default()
    })
    .await;
    let leaders = cluster
        .wait_balanced(&[1, 2, 3], Duration::from_secs(30))
        .await;
    let bearer = format!("Bearer {TOKEN}");
    let url = cluster.http_url(1);
    for (group, leader) in leaders.iter().enumerate() {
        let group = u32::try_from(group).unwrap();
        let leader = leader.leader.unwrap();
        let resource = cluster.resource_in_group(TENANT, group, "fwd", 0);
        let (status, body) = http_json(
            "POST",
            &format!("{url}/v1/leases/acquire"),
            &[
                (TENANT_HEADER, TENANT),
                ("x-tenure-principal-id", "claimed"),
            ],
            Some(&acquire(&resource, "claimed")),
        )
        .await;
        println!(
            "group {group} (leader {leader}), claimed principal through node 1: {status} {body}"
        );
        if leader == 1 {
            // Node 1 decides itself: its own insecurity is its own (and loopback-only).
            assert_eq!(status, 200, "{body}");
        } else {
            assert_eq!(status, 401, "group {group} led by node {leader}: {body}");
            assert_eq!(body["code"], "UNAUTHORIZED", "{body}");
        }
        let resource = cluster.resource_in_group(TENANT, group, "fwd", 1);
        let (status, body) = http_json(
            "POST",
            &format!("{url}/v1/leases/acquire"),
            &[("Authorization", &bearer)],
            Some(&acquire(&resource, "token")),
        )
        .await;
        println!("group {group} (leader {leader}), token through node 1: {status}");
        assert_eq!(
            status, 200,
            "a token-authenticated request is forwarded: {body}"
        );
    }

    // The same through the native protocol: a QUIC client of node 1 that names a principal
    // without a token.
    let client = cluster.bare_client(1).await.unwrap();
    for (group, leader) in leaders.iter().enumerate() {
        let group = u32::try_from(group).unwrap();
        let leader = leader.leader.unwrap();
        let resource = cluster.resource_in_group(TENANT, group, "fwd-quic", 0);
        let claimed = Principal {
            principal_id: "claimed".to_string(),
            tenant_id: TENANT.to_string(),
        };
        let body = RequestBody::Lease(tenure_core::LeaseOp::Acquire(AcquireRequest {
            key: ResourceKey::new(TENANT, &resource),
            holder_id: "h".to_string(),
            ttl_ms: 30_000,
            request_id: format!("claimed-quic-{group}"),
        }));
        let answer = client
            .call_with(body, common::forward(), Some(claimed), 0)
            .await;
        println!(
            "group {group} (leader {leader}), claimed principal over QUIC through node 1: {:?}",
            answer.as_ref().map(|body| body.kind_name())
        );
        if leader == 1 {
            assert!(answer.is_ok(), "{answer:?}");
        } else {
            let error = answer.expect_err("a forwarded claimed principal");
            assert_eq!(error.code, ErrorCode::Unauthorized, "{error}");
            assert!(error.message.contains("forwarded a principal"), "{error}");
        }
    }
    client.close().await;
}

/// `/testing/faults` of a node with fault control: refused without credentials, served with a
/// token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn testing_routes_require_authentication() {
    let cluster = ProcessCluster::start_ready(ClusterOptions {
        nodes: 1,
        groups: 1,
        insecure_dev_mode: false,
        tokens: vec![acme_token()],
        configure: Some(|_, config| config.testing.fault_control = true),
        ..ClusterOptions::default()
    })
    .await;
    let url = format!("{}/testing/faults", cluster.http_url(1));
    let bearer = format!("Bearer {TOKEN}");
    let skew = json!({"clock_rate_ppm": 100_000});
    let (status, body) = http_json("POST", &url, &[], Some(&skew)).await;
    println!("POST /testing/faults without credentials: {status} {body}");
    assert_eq!(status, 401, "{body}");
    let (status, body) = http_json("GET", &url, &[], None).await;
    println!("GET /testing/faults without credentials: {status} {body}");
    assert_eq!(status, 401, "{body}");
    let (status, body) = http_json("GET", &url, &[("Authorization", &bearer)], None).await;
    println!("GET /testing/faults with a token: {status} {body}");
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["clock_rate_ppm"], 0,
        "the anonymous request changed nothing: {body}"
    );
}
