//! The QUIC client protocol's bounds against clients that have not authenticated, or that
//! misbehave (issue 19, item 1: "unauthenticated memory exhaustion over QUIC"). Each test is
//! named after the hole it closes; each runs a one-node cluster with bearer tokens (no insecure
//! development mode) and takes a few seconds.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    clippy::result_large_err
)]

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{ClusterOptions, ProcessCluster, TestToken};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject as _;
use tenure_core::ErrorCode;
use tenure_proto::client::{
    CLIENT_ALPN, CLIENT_FRAME_BYTES_MAX, Request, RequestBody, RequestFlags, RequestFrame,
    ResponseBody, WireError, decode_response_frame, encode_client_frame,
};
use tenure_transport::tls::node_server_name;

const TOKEN: &str = "quic-limits-token";

fn options() -> ClusterOptions {
    ClusterOptions {
        nodes: 1,
        groups: 16,
        insecure_dev_mode: false,
        tokens: vec![TestToken {
            token: TOKEN.to_string(),
            principal_id: "alice".to_string(),
            tenant_id: "acme".to_string(),
        }],
        ..ClusterOptions::default()
    }
}

fn quic_client_config(ca_pem: &str) -> quinn::ClientConfig {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![CLIENT_ALPN.to_vec()];
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap();
    let mut config = quinn::ClientConfig::new(Arc::new(quic));
    let mut transport = quinn::TransportConfig::default();
    transport.max_idle_timeout(Some(
        quinn::IdleTimeout::try_from(Duration::from_secs(30)).unwrap(),
    ));
    transport.keep_alive_interval(Some(Duration::from_secs(1)));
    config.transport_config(Arc::new(transport));
    config
}

/// A client endpoint of its own (one source port) and the CA to verify node 1 with.
struct Raw {
    endpoint: quinn::Endpoint,
    addr: SocketAddr,
}

impl Raw {
    fn new(cluster: &ProcessCluster) -> Raw {
        let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
        endpoint.set_default_client_config(quic_client_config(cluster.ca_pem()));
        Raw {
            endpoint,
            addr: cluster.node(1).quic_addr,
        }
    }

    async fn connect(&self) -> quinn::Connection {
        tokio::time::timeout(
            Duration::from_secs(5),
            self.endpoint
                .connect(self.addr, &node_server_name(1))
                .unwrap(),
        )
        .await
        .expect("handshake in time")
        .expect("handshake")
    }
}

fn frame(first_id: u64, bodies: Vec<RequestBody>) -> Vec<u8> {
    encode_client_frame(&RequestFrame {
        requests: bodies
            .into_iter()
            .enumerate()
            .map(|(i, body)| Request {
                id: first_id + i as u64,
                timeout_ms: 0,
                flags: RequestFlags::default(),
                principal: None,
                body,
            })
            .collect(),
    })
    .unwrap()
}

/// Sends `bodies` in one frame on a new stream and reads every answer.
async fn exchange(
    connection: &quinn::Connection,
    bodies: Vec<RequestBody>,
) -> Vec<Result<ResponseBody, WireError>> {
    let count = bodies.len();
    let (mut send, mut recv) = connection.open_bi().await.unwrap();
    send.write_all(&frame(1, bodies)).await.unwrap();
    let _ = send.finish();
    let mut answers = Vec::new();
    let read = async {
        while answers.len() < count {
            let mut prefix = [0u8; 4];
            recv.read_exact(&mut prefix).await.unwrap();
            let length = u32::from_le_bytes(prefix) as usize;
            assert!(length <= CLIENT_FRAME_BYTES_MAX);
            let mut body = vec![0u8; length];
            recv.read_exact(&mut body).await.unwrap();
            for response in decode_response_frame(&body).unwrap().responses {
                answers.push(response.result);
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("every answer within 10 s");
    answers
}

async fn authenticate(connection: &quinn::Connection, token: String) -> Result<(), WireError> {
    match exchange(connection, vec![RequestBody::Authenticate { token }])
        .await
        .remove(0)
    {
        Ok(ResponseBody::Authenticated(_)) => Ok(()),
        Ok(other) => panic!("unexpected answer {other:?}"),
        Err(error) => Err(error),
    }
}

/// The node's resident set size, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/PID/status")
}

/// Hole: a connection with no token could send `Routing` without admission, 4,096 in flight
/// plus 4,096 queued replies per stream, and never read them: the node's memory grew with every
/// request. Now the connection's requests in flight and queued reply bytes are bounded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_routing_flood_queues_unbounded_replies() {
    // The refusal bound would stop reading this connection after 64 RATE_LIMITED answers; this
    // test is about the in-flight and reply-byte bounds, so it is set out of the way.
    let cluster = ProcessCluster::start_ready(ClusterOptions {
        configure: Some(|_, config| config.limits.client.unauthenticated_refusals_max = 1 << 30),
        ..options()
    })
    .await;
    let pid = cluster.pid(1);
    let raw = Raw::new(&cluster);
    let connection = raw.connect().await;
    let before_kib = rss_kib(pid);
    // 8 streams x 4 frames x 1,024 Routing requests, never reading an answer.
    let mut writers = Vec::new();
    for stream in 0..8u64 {
        let Ok(Ok((mut send, recv))) =
            tokio::time::timeout(Duration::from_millis(500), connection.open_bi()).await
        else {
            break;
        };
        writers.push(tokio::spawn(async move {
            let _recv = recv;
            for f in 0..4u64 {
                let bytes = frame((stream * 4 + f) * 1024, vec![RequestBody::Routing; 1024]);
                if send.write_all(&bytes).await.is_err() {
                    return;
                }
            }
            // Keep the stream (and its unread answers) open.
            tokio::time::sleep(Duration::from_secs(30)).await;
        }));
    }
    let mut peak_kib = before_kib;
    let until = Instant::now() + Duration::from_secs(4);
    while Instant::now() < until {
        peak_kib = peak_kib.max(rss_kib(pid));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for writer in &writers {
        writer.abort();
    }
    let growth_mib = peak_kib.saturating_sub(before_kib) / 1024;
    println!(
        "node RSS {} MiB before, peak {} MiB during the flood (+{growth_mib} MiB)",
        before_kib / 1024,
        peak_kib / 1024
    );
    assert!(
        growth_mib < 64,
        "an unauthenticated connection that never reads grew the node by {growth_mib} MiB"
    );
}

/// Hole: a connection that never authenticated stayed open as long as it liked. Now it is closed
/// after a few seconds; an authenticated one stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_connection_stays_open_forever() {
    let cluster = ProcessCluster::start_ready(options()).await;
    let raw = Raw::new(&cluster);
    let idle = raw.connect().await;
    let authenticated = raw.connect().await;
    authenticate(&authenticated, TOKEN.to_string())
        .await
        .expect("the token is accepted");
    let closed = tokio::time::timeout(Duration::from_secs(8), idle.closed()).await;
    println!("unauthenticated connection after 8 s: {closed:?}");
    assert!(
        closed.is_ok(),
        "a connection that never authenticated was still open after 8 s"
    );
    assert!(
        authenticated.close_reason().is_none(),
        "the authenticated connection was closed: {:?}",
        authenticated.close_reason()
    );
    let answers = exchange(&authenticated, vec![RequestBody::Status]).await;
    assert!(matches!(answers[0], Ok(ResponseBody::Status(_))));
}

/// Hole: `Routing` and `Status` (each answer ~17 KiB at 64 groups) were not rate-limited: a
/// connection could ask for them as fast as it could write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routing_and_status_are_not_rate_limited() {
    let cluster = ProcessCluster::start_ready(options()).await;
    let raw = Raw::new(&cluster);
    let connection = raw.connect().await;
    authenticate(&connection, TOKEN.to_string()).await.unwrap();
    let mut bodies = vec![RequestBody::Routing; 100];
    bodies.extend(vec![RequestBody::Status; 100]);
    let answers = exchange(&connection, bodies).await;
    let limited = answers
        .iter()
        .filter(|answer| matches!(answer, Err(error) if error.code == ErrorCode::RateLimited))
        .count();
    println!("{limited} of 200 Routing/Status requests were rate-limited");
    assert!(
        limited > 0,
        "200 Routing/Status requests at once: none was rate-limited"
    );
    let limited_error = answers
        .iter()
        .filter_map(|answer| answer.as_ref().err())
        .find(|error| error.code == ErrorCode::RateLimited);
    if let Some(error) = limited_error {
        assert!(
            error.retryable && error.retry_after_ms.is_some(),
            "{error:?}"
        );
    }
    // Another connection has its own allowance.
    let other = raw.connect().await;
    authenticate(&other, TOKEN.to_string()).await.unwrap();
    let answers = exchange(&other, vec![RequestBody::Routing]).await;
    assert!(
        matches!(answers[0], Ok(ResponseBody::Routing(_))),
        "{answers:?}"
    );
}

/// Hole: any number of client connections from one source address were accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_connections_are_not_capped_per_source_address() {
    let cluster = ProcessCluster::start_ready(options()).await;
    let raw = Raw::new(&cluster);
    let mut connections = Vec::new();
    for _ in 0..80 {
        connections.push(raw.connect().await);
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut refused = 0;
    while Instant::now() < deadline {
        refused = connections
            .iter()
            .filter(|connection| connection.close_reason().is_some())
            .count();
        if refused > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("{refused} of 80 connections from one address were refused");
    assert!(refused > 0, "80 connections from one address: none refused");
    let reason = connections
        .iter()
        .find_map(quinn::Connection::close_reason)
        .unwrap();
    assert!(
        reason.to_string().contains("too many"),
        "refused with: {reason}"
    );
}

/// Hole: the QUIC limits of client connections were the peers' (16 bidirectional streams,
/// 16 MiB per stream, 64 MiB per connection). A client connection now gets a few streams.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_connections_get_peer_quic_limits() {
    let cluster = ProcessCluster::start_ready(options()).await;
    let raw = Raw::new(&cluster);
    let connection = raw.connect().await;
    let mut opened = 0;
    let mut streams = Vec::new();
    for _ in 0..16 {
        match tokio::time::timeout(Duration::from_millis(300), connection.open_bi()).await {
            Ok(Ok(stream)) => {
                opened += 1;
                streams.push(stream);
            }
            _ => break,
        }
    }
    println!("an unauthenticated client connection could open {opened} streams");
    assert!(
        opened <= 8,
        "an unauthenticated client connection could open {opened} streams at once"
    );
}

/// Hole: the QUIC `Authenticate` request hashed a token of any length (up to the 4 MiB frame);
/// HTTP refused tokens longer than `TOKEN_BYTES_MAX`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authenticate_token_has_no_length_bound() {
    let cluster = ProcessCluster::start_ready(options()).await;
    let raw = Raw::new(&cluster);
    let connection = raw.connect().await;
    // Longer than TOKEN_BYTES_MAX (4,096), within the frame bound of an unauthenticated
    // connection (64 KiB).
    let error = authenticate(&connection, "x".repeat(5_000))
        .await
        .expect_err("a 5,000-byte token is refused");
    println!("a 5,000-byte token: {error}");
    assert_eq!(error.code, ErrorCode::Unauthorized);
    assert!(
        error.message.contains("longer than"),
        "a 5,000-byte token was looked up instead of refused by its length: {error}"
    );
}

/// Hole: a connection that never authenticated could send requests the node refuses
/// (`UNAUTHORIZED`, `RATE_LIMITED`) as fast as it could write them, and the node decoded and
/// refused every one: no memory grew, but the node's CPU went to refusals (the QUIC attack run's
/// workload fell from about 5,000 to 215-614 ops/s). Now, after `unauthenticated_refusals_max` (64)
/// refusals, the node stops reading the connection; another connection that authenticates is
/// served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_refusals_are_answered_without_end() {
    let cluster = ProcessCluster::start_ready(options()).await;
    let raw = Raw::new(&cluster);
    let connection = raw.connect().await;
    let (mut send, mut recv) = connection.open_bi().await.unwrap();
    let acquire = |n: u64| {
        RequestBody::Lease(tenure_core::LeaseOp::Acquire(tenure_core::AcquireRequest {
            key: tenure_core::ResourceKey::new("acme", format!("r{n}")),
            holder_id: "h".to_string(),
            ttl_ms: 10_000,
            request_id: format!("q{n}"),
        }))
    };
    // 4 frames of 250 requests, none of which may be served.
    let writer = tokio::spawn(async move {
        for f in 0..4u64 {
            let bodies = (0..250).map(|i| acquire(f * 250 + i)).collect();
            if send.write_all(&frame(f * 250, bodies)).await.is_err() {
                return;
            }
        }
        let _ = send.finish();
        // Keep the stream open while the answers are read (the task is aborted after).
        std::future::pending::<()>().await;
    });
    let mut refused = 0usize;
    let read = async {
        loop {
            let mut prefix = [0u8; 4];
            if recv.read_exact(&mut prefix).await.is_err() {
                break;
            }
            let length = u32::from_le_bytes(prefix) as usize;
            assert!(length <= CLIENT_FRAME_BYTES_MAX);
            let mut body = vec![0u8; length];
            if recv.read_exact(&mut body).await.is_err() {
                break;
            }
            for response in decode_response_frame(&body).unwrap().responses {
                let error = response.result.expect_err("an unauthenticated acquire");
                assert_eq!(error.code, ErrorCode::Unauthorized, "{error}");
                refused += 1;
            }
        }
    };
    // The stream ends (the node finished its side) once the node stops reading.
    let ended = tokio::time::timeout(Duration::from_secs(4), read).await;
    writer.abort();
    println!(
        "an unauthenticated connection sent 1,000 acquires: {refused} refused, then {}",
        if ended.is_ok() {
            "the node stopped reading it"
        } else {
            "still answering after 4 s"
        }
    );
    assert!(ended.is_ok(), "the node kept answering: {refused} refusals");
    assert!(
        connection.close_reason().is_none(),
        "the stream ended because the connection was closed ({:?}), not because the node \
         stopped reading it",
        connection.close_reason()
    );
    // The maximum, plus the requests that were in flight when it was reached (at most 16).
    assert!(
        (64..=64 + 16).contains(&refused),
        "{refused} of 1,000 requests were refused before the node stopped reading"
    );
    let other = raw.connect().await;
    authenticate(&other, TOKEN.to_string()).await.unwrap();
    let answers = exchange(&other, vec![RequestBody::Status]).await;
    assert!(
        matches!(answers[0], Ok(ResponseBody::Status(_))),
        "{answers:?}"
    );
}
