//! `attack_http`: the HTTP slowloris / descriptor-exhaustion attack of issue 19 item 2, alone and
//! bounded in time, on loopback.
//!
//! - `attack_http [--duration-s 20] [--connections 3000] [--sources 3]`: starts a one-node
//!   cluster of its own (a temporary directory, `attack_http node` as the node process, insecure
//!   development mode, loopback only), then runs a small write workload (HTTP acquires on new
//!   connections from 127.0.0.1 and native QUIC acquires) for `--duration-s` seconds alone and
//!   for `--duration-s` seconds while `--connections` idle or slowloris connections (from
//!   127.0.0.2 and up, `--sources` addresses, reopened whenever the node closes one) are held;
//!   prints the workload's ops/s and the node's RSS and open descriptors in both phases.
//! - `attack_http --cluster cluster.json [--node-pid PID]`: the same against a running cluster
//!   (`tenure dev` writes cluster.json; its first node is attacked); RSS and descriptors are
//!   printed when the node's pid is given.
//! - `attack_http node --config FILE`: one node (what `tenure serve` runs).
//!
//! Must not depend on: anything but the `tenure_server`, `tenure_client` and
//! `tenure_transport` libraries.

// A command-line report: standard output is its interface.
#![allow(clippy::print_stdout)]

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bytes::Bytes;
use clap::{Parser, Subcommand};
use http_body_util::{BodyExt as _, Full};
use tenure_client::{AcquireOptions, Client, ClientConfig, Credentials};
use tenure_server::config::{
    AuthConfig, LimitsConfig, PeerConfig, ServerConfig, StorageConfig, TestingConfig, TimingConfig,
    TlsConfig,
};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpSocket;

const TENANT: &str = "attack";
const CLUSTER_NAME: &str = "tenure-attack";

/// The HTTP slowloris / descriptor-exhaustion attack, measured.
#[derive(Debug, Parser)]
#[command(name = "attack_http", about, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Cmd>,
    /// Seconds of each phase (workload alone, then under attack).
    #[arg(long, default_value_t = 20)]
    duration_s: u64,
    /// Attacking connections held at once.
    #[arg(long, default_value_t = 3_000)]
    connections: usize,
    /// Source addresses the attack uses (127.0.0.2 and up).
    #[arg(long, default_value_t = 3)]
    sources: u8,
    /// Attack this cluster (cluster.json as `tenure dev` writes it) instead of starting one.
    #[arg(long)]
    cluster: Option<PathBuf>,
    /// The attacked node's pid (with --cluster), for its RSS and descriptors.
    #[arg(long)]
    node_pid: Option<u32>,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// One node process.
    Node {
        /// Its configuration file.
        #[arg(long)]
        config: PathBuf,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Some(Cmd::Node { config }) = &cli.command {
        return run_node(config);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    runtime.block_on(run_attack(&cli))
}

fn run_node(config: &Path) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("warn"))
        .init();
    tenure_server::serve::abort_on_panic();
    let config = tenure_server::config::load(config).context("loading the configuration")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    runtime
        .block_on(tenure_server::serve::serve_until_signalled(config))
        .context("node")
}

/// A one-node cluster started by this process; killed on drop.
struct OwnCluster {
    _dir: tempfile::TempDir,
    child: Child,
    cluster_file: PathBuf,
    http: SocketAddr,
}

impl Drop for OwnCluster {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_ports() -> anyhow::Result<(SocketAddr, SocketAddr)> {
    let udp = std::net::UdpSocket::bind("127.0.0.1:0")?;
    let tcp = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok((udp.local_addr()?, tcp.local_addr()?))
}

fn start_cluster() -> anyhow::Result<OwnCluster> {
    let dir = tempfile::Builder::new()
        .prefix("tenure-attack-http-")
        .tempdir()?;
    let certs = dir.path().join("certs");
    tenure_transport::certs::write_cluster_certificates(
        &certs,
        CLUSTER_NAME,
        &[1],
        &[IpAddr::V4(Ipv4Addr::LOCALHOST)],
    )
    .context("writing certificates")?;
    let (addr, http_addr) = free_ports()?;
    let peers = BTreeMap::from([(1, PeerConfig { addr, http_addr })]);
    let config = ServerConfig {
        node_id: 1,
        cluster_name: CLUSTER_NAME.into(),
        data_dir: dir.path().join("data"),
        peers,
        groups: 4,
        replication_factor: 1,
        tls: TlsConfig {
            ca_cert: certs.join("ca.pem"),
            node_cert: certs.join("node-1.pem"),
            node_key: certs.join("node-1.key"),
        },
        timing: TimingConfig::default(),
        limits: LimitsConfig::default(),
        auth: AuthConfig {
            insecure_dev_mode: true,
            tokens: Vec::new(),
        },
        storage: StorageConfig::default(),
        cluster: Default::default(),
        testing: TestingConfig::default(),
    };
    config.validate().context("the node's configuration")?;
    let config_path = dir.path().join("tenure.toml");
    std::fs::write(
        &config_path,
        config.to_toml().context("configuration as TOML")?,
    )?;
    let cluster_file = dir.path().join("cluster.json");
    let json = serde_json::json!({
        "nodes": [{"id": 1, "client": addr.to_string(), "http": format!("http://{http_addr}")}],
        "groups": 4,
        "ca_cert": certs.join("ca.pem"),
    });
    std::fs::write(&cluster_file, json.to_string())?;
    let log = std::fs::File::create(dir.path().join("node-1.log"))?;
    let child = Command::new(std::env::current_exe()?)
        .arg("node")
        .arg("--config")
        .arg(&config_path)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("spawning the node")?;
    Ok(OwnCluster {
        _dir: dir,
        child,
        cluster_file,
        http: http_addr,
    })
}

/// `(http address of the first node, pid)` from a cluster.json.
fn first_http(cluster_file: &Path) -> anyhow::Result<SocketAddr> {
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(cluster_file)?)?;
    let url = json["nodes"][0]["http"]
        .as_str()
        .context("cluster.json: nodes[0].http")?;
    url.trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .context("cluster.json: nodes[0].http is not host:port")
}

/// Resident memory (KiB) and open descriptors of a process (Linux `/proc`).
fn rss_and_fds(pid: u32) -> Option<(u64, usize)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss_kib = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count();
    Some((rss_kib, fds))
}

#[derive(Debug, Default)]
struct Phase {
    http_ok: u64,
    http_failed: u64,
    quic_ok: u64,
    quic_failed: u64,
    seconds: f64,
    rss_kib_max: u64,
    fds_max: usize,
    first_failure: Option<String>,
}

impl Phase {
    fn print(&self, name: &str, pid: Option<u32>) {
        let node = if pid.is_some() {
            format!(
                "node RSS {:.1} MiB max, open fds {} max",
                self.rss_kib_max as f64 / 1024.0,
                self.fds_max
            )
        } else {
            "node RSS/fds unknown (give --node-pid)".into()
        };
        println!(
            "{name:>14}: HTTP acquires {:.1}/s ({} failed), QUIC acquires {:.1}/s ({} failed); {node}{}",
            self.http_ok as f64 / self.seconds,
            self.http_failed,
            self.quic_ok as f64 / self.seconds,
            self.quic_failed,
            self.first_failure
                .as_ref()
                .map(|f| format!("; first failure: {f}"))
                .unwrap_or_default()
        );
    }
}

async fn http_acquire(http: SocketAddr, resource: &str) -> Result<(), String> {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let body = serde_json::json!({
        "tenant_id": TENANT, "resource_id": resource, "holder_id": "workload",
        "ttl_seconds": 30, "request_id": resource,
    });
    let request = hyper::Request::post(format!("http://{http}/v1/leases/acquire"))
        .header("content-type", "application/json")
        .header("x-tenure-principal-id", "workload")
        .header("x-tenure-principal-tenant", TENANT)
        .body(Full::new(Bytes::from(body.to_string())))
        .map_err(|e| e.to_string())?;
    let exchange = async {
        let response = client.request(request).await.map_err(|e| e.to_string())?;
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        if status.is_success() {
            Ok(())
        } else {
            Err(format!("{status} {}", String::from_utf8_lossy(&bytes)))
        }
    };
    tokio::time::timeout(Duration::from_secs(3), exchange)
        .await
        .map_err(|_| "no answer within 3 s".to_string())?
}

/// Runs the workload for `duration`, sampling the node every 200 ms.
async fn workload(
    http: SocketAddr,
    client: &Client,
    pid: Option<u32>,
    duration: Duration,
    phase_name: &str,
) -> Phase {
    let mut phase = Phase::default();
    let started = Instant::now();
    let mut round = 0u64;
    let mut sampled = Instant::now();
    while started.elapsed() < duration {
        round += 1;
        let resource = format!("{phase_name}-http-{round}");
        match http_acquire(http, &resource).await {
            Ok(()) => phase.http_ok += 1,
            Err(error) => {
                phase.http_failed += 1;
                phase.first_failure.get_or_insert(format!("HTTP: {error}"));
            }
        }
        let options = AcquireOptions {
            auto_renew: false,
            ..AcquireOptions::new(
                TENANT,
                format!("{phase_name}-quic-{round}"),
                "workload",
                Duration::from_secs(30),
            )
        };
        match tokio::time::timeout(Duration::from_secs(3), client.acquire_grant(options)).await {
            Ok(Ok(_)) => phase.quic_ok += 1,
            Ok(Err(error)) => {
                phase.quic_failed += 1;
                phase.first_failure.get_or_insert(format!("QUIC: {error}"));
            }
            Err(_) => {
                phase.quic_failed += 1;
                phase
                    .first_failure
                    .get_or_insert("QUIC: no answer within 3 s".into());
            }
        }
        if sampled.elapsed() >= Duration::from_millis(200) {
            sampled = Instant::now();
            if let Some((rss, fds)) = pid.and_then(rss_and_fds) {
                phase.rss_kib_max = phase.rss_kib_max.max(rss);
                phase.fds_max = phase.fds_max.max(fds);
            }
        }
    }
    phase.seconds = started.elapsed().as_secs_f64();
    phase
}

#[derive(Debug, Default)]
struct AttackCounts {
    opened: AtomicU64,
    refused: AtomicU64,
    closed_by_node: AtomicU64,
    connect_failed: AtomicU64,
}

/// Holds one attacking connection after another from `source` until `stop`: half of them send
/// nothing, half trickle a never-ending header (slowloris).
async fn attacker(
    source: IpAddr,
    target: SocketAddr,
    slowloris: bool,
    stop: Arc<AtomicBool>,
    counts: Arc<AttackCounts>,
) {
    while !stop.load(Ordering::Relaxed) {
        let Ok(socket) = TcpSocket::new_v4() else {
            return;
        };
        if socket.bind(SocketAddr::new(source, 0)).is_err() {
            counts.connect_failed.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        let Ok(Ok(mut stream)) =
            tokio::time::timeout(Duration::from_secs(2), socket.connect(target)).await
        else {
            counts.connect_failed.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        counts.opened.fetch_add(1, Ordering::Relaxed);
        if slowloris {
            let _ = stream
                .write_all(b"POST /v1/leases/acquire HTTP/1.1\r\nHost: tenure\r\n")
                .await;
        }
        let mut buf = [0u8; 512];
        let mut answered = false;
        loop {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            match tokio::time::timeout(Duration::from_millis(500), stream.read(&mut buf)).await {
                Ok(Ok(0) | Err(_)) => break,
                Ok(Ok(read)) => {
                    answered |= buf[..read].starts_with(b"HTTP/1.1 503");
                }
                Err(_) => {
                    if slowloris && stream.write_all(b"X-Slow: y\r\n").await.is_err() {
                        break;
                    }
                }
            }
        }
        if answered {
            counts.refused.fetch_add(1, Ordering::Relaxed);
        } else {
            counts.closed_by_node.fetch_add(1, Ordering::Relaxed);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn run_attack(cli: &Cli) -> anyhow::Result<()> {
    let own = match &cli.cluster {
        Some(_) => None,
        None => Some(start_cluster()?),
    };
    let (cluster_file, http, pid) = match (&own, &cli.cluster) {
        (Some(own), _) => (own.cluster_file.clone(), own.http, Some(own.child.id())),
        (None, Some(file)) => (file.clone(), first_http(file)?, cli.node_pid),
        (None, None) => anyhow::bail!("no cluster"),
    };
    let mut config = ClientConfig::from_cluster_file(
        &cluster_file,
        Credentials::InsecureDev {
            principal_id: "workload".into(),
        },
    )
    .context("reading cluster.json")?;
    config.call_timeout = Duration::from_secs(3);
    // Wait (bounded) for the node to serve.
    let deadline = Instant::now() + Duration::from_secs(60);
    let client = loop {
        match Client::connect(config.clone()).await {
            Ok(client) if http_acquire(http, "warm-up").await.is_ok() => break client,
            Ok(_) | Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Ok(_) => anyhow::bail!("the node does not serve HTTP acquires"),
            Err(error) => anyhow::bail!("the node does not serve: {error}"),
        }
    };
    let duration = Duration::from_secs(cli.duration_s);
    println!(
        "attack_http: node HTTP {http}{}; phases of {} s; attack: {} connections from {} \
         source addresses (127.0.0.2 and up), half idle, half slowloris",
        pid.map(|p| format!(" (pid {p})")).unwrap_or_default(),
        cli.duration_s,
        cli.connections,
        cli.sources
    );
    let baseline = workload(http, &client, pid, duration, "baseline").await;
    baseline.print("no attack", pid);

    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new(AttackCounts::default());
    let mut tasks = Vec::new();
    for index in 0..cli.connections {
        let offset = u8::try_from(index % usize::from(cli.sources.max(1))).unwrap_or(0);
        let source = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2u8.saturating_add(offset)));
        tasks.push(tokio::spawn(attacker(
            source,
            http,
            index % 2 == 1,
            stop.clone(),
            counts.clone(),
        )));
    }
    let attacked = workload(http, &client, pid, duration, "attacked").await;
    stop.store(true, Ordering::Relaxed);
    attacked.print("under attack", pid);
    for task in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
    }
    println!(
        "        attack: {} connections opened, {} refused at once with 503 (a cap), {} closed \
         by the node (timeouts), {} connects failed",
        counts.opened.load(Ordering::Relaxed),
        counts.refused.load(Ordering::Relaxed),
        counts.closed_by_node.load(Ordering::Relaxed),
        counts.connect_failed.load(Ordering::Relaxed),
    );
    if let Some((rss, fds)) = pid.and_then(rss_and_fds) {
        println!(
            "         after: node RSS {:.1} MiB, open fds {fds}",
            rss as f64 / 1024.0
        );
    }
    client.close().await;
    drop(own);
    Ok(())
}
