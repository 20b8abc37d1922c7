//! `attack_quic`: the unauthenticated QUIC memory-exhaustion attack of issue 19 (item 1), run
//! against one real node on loopback while a normal workload runs.
//!
//! `cargo run --release -p tenure-tests --bin attack_quic -- --duration-s 20` starts a one-node
//! cluster (bearer tokens, no insecure mode, 64 groups so a routing table answer is ~17 KiB)
//! as a child process, then runs two phases of `--duration-s` each: the workload alone
//! (acquire, renew, release with a token), then the workload while a second child process, the
//! attacker, opens `--connections` client connections that send `Routing` and `Status` on every
//! stream they may open and never read an answer (reconnecting when the node closes them). It
//! prints the node's RSS (VmRSS of `/proc/<pid>/status`) and the workload's ops/s of each phase.
//! Every process it starts is killed at the end; a node RSS above `--rss-limit-mib` stops the
//! attack early. Loopback only.
//!
//! Must not depend on: the fault-suite harness (it builds its own single-node cluster).
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};
use tenure_client::{Client, ClientConfig, Credentials, Endpoint};
use tenure_proto::client::{
    CLIENT_ALPN, Request, RequestBody, RequestFlags, RequestFrame, encode_client_frame,
};

const TOKEN: &str = "attack-quic-workload-token";
const CLUSTER_NAME: &str = "tenure-attack";

#[derive(Parser, Debug)]
#[command(about = "Unauthenticated QUIC flood against one node during a workload")]
struct Args {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    /// Seconds of each phase (workload alone, workload under attack).
    #[arg(long, default_value_t = 20)]
    duration_s: u64,
    /// Attacking connections.
    #[arg(long, default_value_t = 50)]
    connections: usize,
    /// Streams per attacking connection (at most; the node may allow fewer).
    #[arg(long, default_value_t = 16)]
    streams: usize,
    /// Concurrent workload callers.
    #[arg(long, default_value_t = 16)]
    workers: usize,
    /// Raft groups of the node.
    #[arg(long, default_value_t = 64)]
    groups: u32,
    /// Stop the attack when the node's RSS passes this many MiB.
    #[arg(long, default_value_t = 6_144)]
    rss_limit_mib: u64,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run the node (internal).
    Node {
        /// Its configuration file.
        #[arg(long)]
        config: PathBuf,
    },
    /// Run the attacker (internal).
    Attacker {
        /// The node's QUIC address.
        #[arg(long)]
        addr: SocketAddr,
        /// The cluster CA (PEM).
        #[arg(long)]
        ca: PathBuf,
        /// Connections.
        #[arg(long)]
        connections: usize,
        /// Streams per connection.
        #[arg(long)]
        streams: usize,
        /// How long to attack.
        #[arg(long)]
        duration_s: u64,
    },
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    match args.cmd {
        Some(Cmd::Node { config }) => run_node(&config),
        Some(Cmd::Attacker {
            addr,
            ca,
            connections,
            streams,
            duration_s,
        }) => runtime()?.block_on(attacker(
            addr,
            &ca,
            connections,
            streams,
            Duration::from_secs(duration_s),
        )),
        None => runtime()?.block_on(orchestrate(&args)),
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")
}

fn run_node(config: &Path) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("warn"))
        .with_writer(std::io::stderr)
        .init();
    tenure_server::serve::abort_on_panic();
    let config = tenure_server::config::load(config).context("loading the configuration")?;
    runtime()?
        .block_on(tenure_server::serve::serve_until_signalled(config))
        .context("node")?;
    Ok(())
}

/// Kills a child process when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_udp_port() -> anyhow::Result<u16> {
    Ok(std::net::UdpSocket::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn free_tcp_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The node's resident set size, in MiB.
fn rss_mib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib / 1024)
}

async fn wait_ready(http_addr: SocketAddr, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(mut stream) = tokio::net::TcpStream::connect(http_addr).await {
            use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
            let request =
                format!("GET /readyz HTTP/1.1\r\nHost: {http_addr}\r\nConnection: close\r\n\r\n");
            if stream.write_all(request.as_bytes()).await.is_ok() {
                let mut answer = Vec::new();
                let _ =
                    tokio::time::timeout(Duration::from_secs(2), stream.read_to_end(&mut answer))
                        .await;
                if answer.starts_with(b"HTTP/1.1 200") {
                    return Ok(());
                }
            }
        }
        if Instant::now() >= deadline {
            bail!("the node was not ready within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[derive(Debug, Default)]
struct Phase {
    ops: u64,
    errors: u64,
    seconds: f64,
    rss_start_mib: u64,
    rss_peak_mib: u64,
    rss_end_mib: u64,
    stopped_early: bool,
}

async fn orchestrate(args: &Args) -> anyhow::Result<()> {
    let dir = tempfile::Builder::new()
        .prefix("tenure-attack-quic-")
        .tempdir()
        .context("creating a temporary directory")?;
    let certs = dir.path().join("certs");
    tenure_transport::certs::write_cluster_certificates(
        &certs,
        CLUSTER_NAME,
        &[1],
        &["127.0.0.1".parse()?],
    )
    .context("writing certificates")?;
    let quic_addr: SocketAddr = format!("127.0.0.1:{}", free_udp_port()?).parse()?;
    let http_addr: SocketAddr = format!("127.0.0.1:{}", free_tcp_port()?).parse()?;
    let sha = tenure_server::auth::token_sha256_hex(TOKEN);
    let config = format!(
        r#"node_id = 1
cluster_name = "{CLUSTER_NAME}"
data_dir = "{data}"
groups = {groups}
replication_factor = 1

[peers.1]
addr = "{quic_addr}"
http_addr = "{http_addr}"

[tls]
ca_cert = "{certs}/ca.pem"
node_cert = "{certs}/node-1.pem"
node_key = "{certs}/node-1.key"

[[auth.tokens]]
sha256 = "{sha}"
principal_id = "workload"
tenant_id = "acme"
"#,
        data = dir.path().join("data").display(),
        groups = args.groups,
        certs = certs.display(),
    );
    let config_path = dir.path().join("tenure.toml");
    std::fs::write(&config_path, config)?;
    let exe = std::env::current_exe()?;
    let log = std::fs::File::create(dir.path().join("node.log"))?;
    let node = Killed(
        Command::new(&exe)
            .arg("node")
            .arg("--config")
            .arg(&config_path)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting the node")?,
    );
    let pid = node.0.id();
    wait_ready(http_addr, Duration::from_secs(60)).await?;
    let ca_pem = std::fs::read_to_string(certs.join("ca.pem"))?;
    let mut client_config = ClientConfig::new(
        vec![Endpoint {
            node_id: Some(1),
            addr: quic_addr,
        }],
        ca_pem,
        Credentials::Token(TOKEN.to_string()),
    );
    client_config.call_timeout = Duration::from_secs(5);
    let client = Client::connect(client_config)
        .await
        .context("connecting the workload")?;
    let duration = Duration::from_secs(args.duration_s);
    println!(
        "node pid {pid}, {} groups; phases of {} s; attack: {} connections x up to {} streams",
        args.groups, args.duration_s, args.connections, args.streams
    );
    // Warm up (leaders, connections, allocator).
    let _ = run_phase(&client, pid, args, Duration::from_secs(2), None).await;
    let quiet = run_phase(&client, pid, args, duration, None).await;
    report("workload alone", &quiet);
    let attacker = Killed(
        Command::new(&exe)
            .arg("attacker")
            .arg("--addr")
            .arg(quic_addr.to_string())
            .arg("--ca")
            .arg(certs.join("ca.pem"))
            .arg("--connections")
            .arg(args.connections.to_string())
            .arg("--streams")
            .arg(args.streams.to_string())
            .arg("--duration-s")
            .arg(args.duration_s.to_string())
            .stdout(Stdio::inherit())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting the attacker")?,
    );
    let attacked = run_phase(&client, pid, args, duration, Some(args.rss_limit_mib)).await;
    drop(attacker);
    report("workload under attack", &attacked);
    tokio::time::sleep(Duration::from_secs(2)).await;
    println!(
        "node RSS 2 s after the attack: {} MiB",
        rss_mib(pid).unwrap_or(0)
    );
    println!(
        "summary: ops/s {:.0} alone, {:.0} under attack; node RSS peak {} MiB alone, {} MiB under attack",
        quiet.ops as f64 / quiet.seconds,
        attacked.ops as f64 / attacked.seconds,
        quiet.rss_peak_mib,
        attacked.rss_peak_mib
    );
    client.close().await;
    drop(node);
    Ok(())
}

fn report(name: &str, phase: &Phase) {
    println!(
        "{name}: {} ops in {:.1} s = {:.0} ops/s ({} errors); node RSS {} MiB at start, peak {} MiB, {} MiB at end{}",
        phase.ops,
        phase.seconds,
        phase.ops as f64 / phase.seconds,
        phase.errors,
        phase.rss_start_mib,
        phase.rss_peak_mib,
        phase.rss_end_mib,
        if phase.stopped_early {
            " (stopped early: RSS limit)"
        } else {
            ""
        }
    );
}

/// Runs the workload for `duration` (acquire, renew, release per worker), sampling the node's
/// RSS every 250 ms.
async fn run_phase(
    client: &Client,
    pid: u32,
    args: &Args,
    duration: Duration,
    rss_limit_mib: Option<u64>,
) -> Phase {
    let ops = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let started = Instant::now();
    let mut workers = Vec::new();
    for worker in 0..args.workers {
        let client = client.clone();
        let ops = ops.clone();
        let errors = errors.clone();
        let stop = stop.clone();
        workers.push(tokio::spawn(async move {
            let mut round = 0u64;
            while !stop.load(Ordering::Relaxed) {
                round += 1;
                let resource = format!("r-{worker}-{round}");
                let grant = match client
                    .acquire_grant(tenure_client::AcquireOptions::new(
                        "acme",
                        resource,
                        "workload",
                        Duration::from_secs(10),
                    ))
                    .await
                {
                    Ok(grant) => grant,
                    Err(_) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                };
                ops.fetch_add(1, Ordering::Relaxed);
                match client
                    .renew(
                        grant.key.clone(),
                        grant.lease_id,
                        "workload",
                        Duration::from_secs(10),
                        None,
                    )
                    .await
                {
                    Ok(_) => ops.fetch_add(1, Ordering::Relaxed),
                    Err(_) => errors.fetch_add(1, Ordering::Relaxed),
                };
                match client
                    .release(grant.key.clone(), grant.lease_id, "workload", None)
                    .await
                {
                    Ok(_) => ops.fetch_add(1, Ordering::Relaxed),
                    Err(_) => errors.fetch_add(1, Ordering::Relaxed),
                };
            }
        }));
    }
    let rss_start_mib = rss_mib(pid).unwrap_or(0);
    let mut phase = Phase {
        rss_start_mib,
        rss_peak_mib: rss_start_mib,
        ..Phase::default()
    };
    while started.elapsed() < duration {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let rss = rss_mib(pid).unwrap_or(0);
        phase.rss_peak_mib = phase.rss_peak_mib.max(rss);
        if rss_limit_mib.is_some_and(|limit| rss > limit) {
            phase.stopped_early = true;
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    phase.seconds = started.elapsed().as_secs_f64();
    phase.ops = ops.load(Ordering::Relaxed);
    phase.errors = errors.load(Ordering::Relaxed);
    phase.rss_end_mib = rss_mib(pid).unwrap_or(0);
    for worker in workers {
        let _ = tokio::time::timeout(Duration::from_secs(6), worker).await;
    }
    phase
}

fn attacker_quic_config(ca: &Path) -> anyhow::Result<quinn::ClientConfig> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject as _;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca)? {
        roots.add(cert?)?;
    }
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![CLIENT_ALPN.to_vec()];
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(tls)?;
    let mut config = quinn::ClientConfig::new(Arc::new(quic));
    let mut transport = quinn::TransportConfig::default();
    transport.max_idle_timeout(Some(quinn::IdleTimeout::try_from(Duration::from_secs(30))?));
    transport.keep_alive_interval(Some(Duration::from_secs(1)));
    config.transport_config(Arc::new(transport));
    Ok(config)
}

/// One attacking connection, again and again until `until`: every stream the node allows
/// writes frames of 1,024 `Routing` and `Status` requests, no answer is ever read.
async fn attack_connection(
    endpoint: quinn::Endpoint,
    addr: SocketAddr,
    streams: usize,
    until: Instant,
    frames: Arc<AtomicU64>,
    connects: Arc<AtomicU64>,
) {
    let mut bodies = vec![RequestBody::Routing; 512];
    bodies.extend(vec![RequestBody::Status; 512]);
    let frame = encode_client_frame(&RequestFrame {
        requests: bodies
            .into_iter()
            .enumerate()
            .map(|(id, body)| Request {
                id: id as u64,
                timeout_ms: 0,
                flags: RequestFlags::default(),
                principal: None,
                body,
            })
            .collect(),
    })
    .unwrap_or_default();
    let frame = bytes::Bytes::from(frame);
    while Instant::now() < until {
        let Ok(connecting) = endpoint.connect(addr, "node-1.tenure.internal") else {
            return;
        };
        let connection = match tokio::time::timeout(Duration::from_secs(5), connecting).await {
            Ok(Ok(connection)) => connection,
            _ => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        connects.fetch_add(1, Ordering::Relaxed);
        let mut tasks = Vec::new();
        for _ in 0..streams {
            let Ok(Ok((mut send, recv))) =
                tokio::time::timeout(Duration::from_millis(500), connection.open_bi()).await
            else {
                break;
            };
            let frame = frame.clone();
            let frames = frames.clone();
            tasks.push(tokio::spawn(async move {
                // Held, never read.
                let _recv = recv;
                while Instant::now() < until {
                    if send.write_all(&frame).await.is_err() {
                        return;
                    }
                    frames.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
        let remaining = until.saturating_duration_since(Instant::now());
        let _ = tokio::time::timeout(remaining, connection.closed()).await;
        for task in tasks {
            task.abort();
        }
        connection.close(0u32.into(), b"attack over");
    }
}

async fn attacker(
    addr: SocketAddr,
    ca: &Path,
    connections: usize,
    streams: usize,
    duration: Duration,
) -> anyhow::Result<()> {
    let config = attacker_quic_config(ca)?;
    let until = Instant::now() + duration;
    let frames = Arc::new(AtomicU64::new(0));
    let connects = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    // A few client endpoints (source ports); many connections each.
    let mut endpoints = Vec::new();
    for _ in 0..connections.div_ceil(16).max(1) {
        let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse()?)?;
        endpoint.set_default_client_config(config.clone());
        endpoints.push(endpoint);
    }
    for index in 0..connections {
        tasks.push(tokio::spawn(attack_connection(
            endpoints[index % endpoints.len()].clone(),
            addr,
            streams,
            until,
            frames.clone(),
            connects.clone(),
        )));
    }
    for task in tasks {
        let _ = task.await;
    }
    println!(
        "attacker: {} connections made, {} frames of 1,024 Routing/Status requests written ({} requests)",
        connects.load(Ordering::Relaxed),
        frames.load(Ordering::Relaxed),
        frames.load(Ordering::Relaxed) * 1024
    );
    Ok(())
}
