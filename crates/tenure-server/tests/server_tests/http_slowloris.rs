//! Regression tests of issue 19 item 2, "HTTP slowloris and file-descriptor exhaustion", against
//! real `tenure serve` processes on loopback:
//!
//! - a connection that sends a partial request header and trickles header lines, never finishing
//!   it, is closed by the node within the header read timeout;
//! - a request whose body trickles in is closed within the body read timeout;
//! - thousands of idle connections (from another loopback address, reopened as the node closes
//!   them) during a small write workload: the writes continue over HTTP and QUIC, and the node's
//!   open descriptors stay well under its limit;
//! - a node whose descriptor limit cannot hold its connection caps and RocksDB's open files
//!   refuses to start, saying why.
//!
//! Every wait is bounded; the whole file runs in well under a minute.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    clippy::cast_possible_truncation,
    missing_docs
)]

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{ClusterOptions, ProcessCluster, TENANT, http_request, wait_child_exit};
use serde_json::json;
use tenure_server::config::LimitsConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// The header read (and keep-alive idle) timeout the test nodes run with.
const HEADER_TIMEOUT: Duration = Duration::from_millis(1_500);
/// The body read timeout the test nodes run with.
const BODY_TIMEOUT: Duration = Duration::from_millis(1_500);
/// How long after the timeout the connection may still be open (scheduling slack).
const CLOSE_SLACK: Duration = Duration::from_secs(4);

fn test_limits() -> LimitsConfig {
    LimitsConfig {
        http_header_read_timeout_ms: HEADER_TIMEOUT.as_millis() as u64,
        http_body_read_timeout_ms: BODY_TIMEOUT.as_millis() as u64,
        http_connections_max: 512,
        http_connections_per_source_max: 256,
        ..LimitsConfig::default()
    }
}

fn one_node(limits: LimitsConfig) -> ClusterOptions {
    ClusterOptions {
        nodes: 1,
        groups: 2,
        limits: Some(limits),
        ..ClusterOptions::default()
    }
}

/// Reads until the peer closes (`Ok(0)` or an error) or `deadline`; `true` when closed.
async fn closed_before(stream: &mut TcpStream, deadline: Instant) -> bool {
    let mut buf = [0u8; 1024];
    let now = Instant::now();
    if now >= deadline {
        return false;
    }
    match tokio::time::timeout(deadline - now, stream.read(&mut buf)).await {
        Ok(Ok(0) | Err(_)) => true,
        // The node may answer (e.g. 408) before closing; keep reading.
        Ok(Ok(_)) => Box::pin(closed_before(stream, deadline)).await,
        Err(_) => false,
    }
}

/// Trickles `line` every 300 ms until the node closes the connection or `bound` passes;
/// returns how long the connection stayed open, `None` if still open at `bound`.
async fn trickle_until_closed(
    stream: &mut TcpStream,
    line: &[u8],
    bound: Duration,
) -> Option<Duration> {
    let started = Instant::now();
    loop {
        let step = Instant::now() + Duration::from_millis(300);
        if closed_before(stream, step.min(started + bound)).await {
            return Some(started.elapsed());
        }
        if started.elapsed() >= bound {
            return None;
        }
        if stream.write_all(line).await.is_err() {
            return Some(started.elapsed());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_slowloris_partial_header_is_closed_within_the_timeout() {
    let cluster = ProcessCluster::start_ready(one_node(test_limits())).await;
    let addr = cluster.node(1).http_addr;

    // A partial header, then one more header line every 300 ms, never the blank line.
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"POST /v1/leases/acquire HTTP/1.1\r\nHost: tenure\r\n")
        .await
        .unwrap();
    let bound = HEADER_TIMEOUT + CLOSE_SLACK;
    let open_for = trickle_until_closed(&mut stream, b"X-Slow: y\r\n", bound).await;
    let Some(open_for) = open_for else {
        panic!(
            "slowloris: a connection with a never-finished header is still open after {bound:?} \
             (header read timeout {HEADER_TIMEOUT:?})"
        );
    };
    println!("slowloris header: closed after {open_for:?} (timeout {HEADER_TIMEOUT:?})");

    // A connection that sends nothing at all is closed too (keep-alive idle).
    let mut idle = TcpStream::connect(addr).await.unwrap();
    let started = Instant::now();
    assert!(
        closed_before(&mut idle, started + bound).await,
        "an idle connection is still open after {bound:?}"
    );
    println!("idle connection: closed after {:?}", started.elapsed());

    // A body that trickles in is cut off by the body read timeout.
    let mut slow_body = TcpStream::connect(addr).await.unwrap();
    slow_body
        .write_all(
            b"POST /v1/leases/acquire HTTP/1.1\r\nHost: tenure\r\nContent-Type: application/json\r\n\
              X-Tenure-Principal-Tenant: acme\r\nX-Tenure-Principal-Id: p\r\nContent-Length: 4000\r\n\r\n{",
        )
        .await
        .unwrap();
    let bound = BODY_TIMEOUT + CLOSE_SLACK;
    let open_for = trickle_until_closed(&mut slow_body, b" ", bound).await;
    let Some(open_for) = open_for else {
        panic!(
            "slow body: the connection is still open after {bound:?} (body read timeout {BODY_TIMEOUT:?})"
        );
    };
    println!("slowloris body: closed after {open_for:?} (timeout {BODY_TIMEOUT:?})");

    // The node still serves.
    let (status, _, _) = http_request(
        "GET",
        &format!("{}/healthz", cluster.http_url(1)),
        &[],
        None,
    )
    .await
    .unwrap();
    assert_eq!(status, 200);
}

/// Open descriptors of a process (Linux `/proc`).
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |dir| dir.count())
}

/// Holds `count` idle TCP connections to `target` from `source` (a loopback address), reopening
/// each one the node closes, until `stop`. Counts connections opened.
async fn idle_flood(
    source: std::net::IpAddr,
    target: SocketAddr,
    count: usize,
    stop: Arc<AtomicBool>,
    opened: Arc<AtomicU64>,
) {
    let mut tasks = Vec::new();
    for _ in 0..count {
        let stop = stop.clone();
        let opened = opened.clone();
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let socket = TcpSocket::new_v4().unwrap();
                if socket.bind(SocketAddr::new(source, 0)).is_err() {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                let Ok(Ok(mut stream)) =
                    tokio::time::timeout(Duration::from_secs(1), socket.connect(target)).await
                else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                opened.fetch_add(1, Ordering::Relaxed);
                let mut buf = [0u8; 64];
                // Hold it until the node closes it or the attack ends.
                loop {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let read =
                        tokio::time::timeout(Duration::from_millis(200), stream.read(&mut buf))
                            .await;
                    if let Ok(Ok(0) | Err(_)) = read {
                        break;
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_idle_connection_flood_does_not_exhaust_descriptors() {
    const NOFILE: u64 = 2_048;
    const ATTACK_CONNECTIONS: usize = 3_000;
    const ATTACK: Duration = Duration::from_secs(6);
    let cluster = ProcessCluster::start_ready(ClusterOptions {
        nofile_limit: Some(NOFILE),
        ..one_node(test_limits())
    })
    .await;
    let pid = cluster.pid(1);
    let http = cluster.http_url(1);
    let target = cluster.node(1).http_addr;
    let client = cluster.client(1).await;
    let baseline_fds = open_fds(pid);

    let stop = Arc::new(AtomicBool::new(false));
    let opened = Arc::new(AtomicU64::new(0));
    let attacker_source = "127.0.0.2".parse().unwrap();
    let flood = tokio::spawn(idle_flood(
        attacker_source,
        target,
        ATTACK_CONNECTIONS,
        stop.clone(),
        opened.clone(),
    ));

    // The workload: one HTTP acquire (a new connection each, from 127.0.0.1) and one QUIC
    // acquire per round, each on a new resource.
    let started = Instant::now();
    let (mut http_ok, mut quic_ok, mut max_fds) = (0u64, 0u64, 0usize);
    let mut failures = Vec::new();
    let mut round = 0u64;
    while started.elapsed() < ATTACK {
        round += 1;
        let body = json!({
            "tenant_id": TENANT, "resource_id": format!("http-{round}"), "holder_id": "w",
            "ttl_seconds": 30, "request_id": format!("h{round}"),
        });
        let headers = [
            ("X-Tenure-Principal-Tenant", TENANT),
            ("X-Tenure-Principal-Id", "workload"),
            ("X-Tenure-Timeout-Ms", "2000"),
        ];
        let answer = tokio::time::timeout(
            Duration::from_secs(3),
            http_request(
                "POST",
                &format!("{http}/v1/leases/acquire"),
                &headers,
                Some(serde_json::to_vec(&body).unwrap()),
            ),
        )
        .await;
        match answer {
            Ok(Ok((200, _, _))) => http_ok += 1,
            Ok(Ok((status, _, body))) => failures.push(format!(
                "http round {round}: {status} {}",
                String::from_utf8_lossy(&body)
            )),
            Ok(Err(error)) => failures.push(format!("http round {round}: {error}")),
            Err(_) => failures.push(format!("http round {round}: no answer within 3 s")),
        }
        let quic = tokio::time::timeout(
            Duration::from_secs(3),
            client.acquire(
                TENANT,
                &format!("quic-{round}"),
                "w",
                30_000,
                &format!("q{round}"),
            ),
        )
        .await;
        match quic {
            Ok(Ok(_)) => quic_ok += 1,
            Ok(Err(error)) => failures.push(format!("quic round {round}: {error}")),
            Err(_) => failures.push(format!("quic round {round}: no answer within 3 s")),
        }
        max_fds = max_fds.max(open_fds(pid));
    }
    let elapsed = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let _ = tokio::time::timeout(Duration::from_secs(10), flood).await;
    println!(
        "idle flood: {} attacker connections opened from 127.0.0.2 ({ATTACK_CONNECTIONS} held at \
         once at most); workload {:.1} HTTP acquires/s and {:.1} QUIC acquires/s; node fds \
         {baseline_fds} before, {max_fds} at most during the attack (limit {NOFILE}); {} failures{}",
        opened.load(Ordering::Relaxed),
        http_ok as f64 / elapsed,
        quic_ok as f64 / elapsed,
        failures.len(),
        failures
            .first()
            .map(|first| format!(", the first: {first}"))
            .unwrap_or_default()
    );
    assert!(
        failures.is_empty(),
        "the workload failed during the idle flood: {failures:?}"
    );
    assert!(
        http_ok >= 5 && quic_ok >= 5,
        "too few writes: http {http_ok}, quic {quic_ok}"
    );
    assert!(
        (max_fds as u64) < NOFILE - 256,
        "the node used {max_fds} descriptors of {NOFILE}"
    );
    // The node is still healthy afterwards.
    client
        .acquire(TENANT, "after-the-flood", "w", 30_000, "after")
        .await
        .expect("an acquire after the flood");
    client.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_descriptor_limit_too_small_refuses_to_start() {
    // 300 descriptors cannot hold the default caps (thousands of HTTP connections).
    let mut cluster = ProcessCluster::start(ClusterOptions {
        nofile_limit: Some(300),
        ..one_node(LimitsConfig::default())
    })
    .await;
    let log_path = cluster.node(1).log_path.clone();
    let status = cluster.wait_exit(1, Duration::from_secs(20));
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    println!("exit {status}; log: {}", common::tail(&log_path, 5));
    assert!(!status.success(), "the node exited successfully");
    assert!(
        log.contains("RLIMIT_NOFILE") && log.contains("http_connections_max"),
        "the node's message does not name the descriptor limit and the caps: {log}"
    );
    let _ = wait_child_exit;
}
