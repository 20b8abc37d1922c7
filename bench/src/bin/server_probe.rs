//! `server_probe`: a closed-loop probe of a running tenure cluster over the native QUIC client
//! protocol (feature `server`). It is not the load generator (issue 7 builds that); it answers
//! one question: how many lease operations per second do the node processes commit, and how
//! many operations share one log entry (server-side batching)?
//!
//! It reads `cluster.json` (written by `tenure dev`), learns the placement map and group leaders
//! (`Routing`), and runs `--workers` tasks, each sending one Acquire of a fresh key at a time
//! straight to the leader of the key's group (principal named in the request: the cluster must
//! run in insecure development mode). At the end it prints ops/s, latency percentiles, errors by
//! code, and the nodes' `tenure_raft_proposed_ops_total / tenure_raft_proposals_total`.
//!
//! `cargo run --release -p tenure-bench --features server --bin server_probe -- --cluster
//! tenure-dev/cluster.json --workers 512 --duration-s 10`

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use hdrhistogram::Histogram;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject as _;
use tenure_core::{AcquireRequest, ErrorCode, GroupId, PlacementMap, ResourceKey};
use tenure_proto::client::{
    CLIENT_ALPN, CLIENT_FRAME_BYTES_MAX, Principal, Request, RequestBody, RequestFlags,
    RequestFrame, ResponseBody, decode_response_frame, encode_client_frame,
};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

struct Options {
    cluster: String,
    workers: usize,
    duration: Duration,
    ttl_ms: u64,
    per_frame: usize,
}

fn options() -> Result<Options> {
    let mut options = Options {
        cluster: "tenure-dev/cluster.json".into(),
        workers: 256,
        duration: Duration::from_secs(10),
        ttl_ms: 60_000,
        per_frame: 1,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| anyhow!("{flag} needs a value"))?;
        match flag.as_str() {
            "--cluster" => options.cluster = value,
            "--workers" => options.workers = value.parse()?,
            "--duration-s" => options.duration = Duration::from_secs(value.parse()?),
            "--ttl-ms" => options.ttl_ms = value.parse()?,
            "--per-frame" => options.per_frame = value.parse::<usize>()?.max(1),
            other => bail!(
                "unknown option {other} (--cluster, --workers, --duration-s, --ttl-ms, --per-frame)"
            ),
        }
    }
    Ok(options)
}

struct Node {
    id: u64,
    connection: quinn::Connection,
    http: SocketAddr,
}

/// Sends `bodies` in one frame on one stream and returns one outcome per request.
async fn call_many(
    connection: &quinn::Connection,
    first_id: u64,
    bodies: Vec<RequestBody>,
) -> Vec<Result<ResponseBody, ErrorCode>> {
    let count = bodies.len();
    let exchange = async {
        let (mut send, mut recv) = connection.open_bi().await.ok()?;
        let requests = bodies
            .into_iter()
            .zip(first_id..)
            .map(|(body, id)| Request {
                id,
                timeout_ms: 5_000,
                flags: RequestFlags {
                    forward: true,
                    ..RequestFlags::default()
                },
                principal: Some(Principal {
                    principal_id: "probe".into(),
                    tenant_id: "probe".into(),
                }),
                body,
            })
            .collect();
        let frame = encode_client_frame(&RequestFrame { requests }).ok()?;
        send.write_all(&frame).await.ok()?;
        send.finish().ok()?;
        let mut outcomes = Vec::with_capacity(count);
        while outcomes.len() < count {
            let mut prefix = [0u8; 4];
            recv.read_exact(&mut prefix).await.ok()?;
            let length = u32::from_le_bytes(prefix) as usize;
            if length == 0 || length > CLIENT_FRAME_BYTES_MAX {
                return None;
            }
            let mut body = vec![0u8; length];
            recv.read_exact(&mut body).await.ok()?;
            for response in decode_response_frame(&body).ok()?.responses {
                outcomes.push(response.result.map_err(|error| error.code));
            }
        }
        Some(outcomes)
    };
    exchange
        .await
        .unwrap_or_else(|| (0..count).map(|_| Err(ErrorCode::Unavailable)).collect())
}

async fn call(
    connection: &quinn::Connection,
    id: u64,
    body: RequestBody,
) -> Result<ResponseBody, ErrorCode> {
    call_many(connection, id, vec![body])
        .await
        .pop()
        .unwrap_or(Err(ErrorCode::Unavailable))
}

async fn metric_sum(http: SocketAddr, name: &str) -> f64 {
    let Ok(mut stream) = tokio::net::TcpStream::connect(http).await else {
        return 0.0;
    };
    let request = format!("GET /metrics HTTP/1.1\r\nHost: {http}\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).await.is_err() {
        return 0.0;
    }
    let mut text = String::new();
    let _ = stream.read_to_string(&mut text).await;
    text.lines()
        .filter(|line| line.starts_with(name) && !line.starts_with(&format!("{name}_")))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::main]
async fn main() -> Result<()> {
    let options = options()?;
    let text = std::fs::read_to_string(&options.cluster)
        .with_context(|| format!("reading {}", options.cluster))?;
    let cluster: serde_json::Value = serde_json::from_str(&text)?;
    let ca_path = cluster["ca_cert"]
        .as_str()
        .ok_or_else(|| anyhow!("cluster.json has no ca_cert"))?;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_file(ca_path).context("reading the CA")?)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![CLIENT_ALPN.to_vec()];
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(tls)?;
    let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse()?)?;
    endpoint.set_default_client_config(quinn::ClientConfig::new(Arc::new(quic)));

    let mut nodes: BTreeMap<u64, Arc<Node>> = BTreeMap::new();
    for node in cluster["nodes"].as_array().into_iter().flatten() {
        let id = node["id"]
            .as_u64()
            .ok_or_else(|| anyhow!("node without id"))?;
        let client: SocketAddr = node["client"].as_str().unwrap_or_default().parse()?;
        let http: SocketAddr = node["http"]
            .as_str()
            .unwrap_or_default()
            .trim_start_matches("http://")
            .parse()?;
        let connection = endpoint
            .connect(client, &format!("node-{id}.tenure.internal"))?
            .await?;
        nodes.insert(
            id,
            Arc::new(Node {
                id,
                connection,
                http,
            }),
        );
    }
    let first = nodes
        .values()
        .next()
        .ok_or_else(|| anyhow!("no nodes"))?
        .clone();
    let ResponseBody::Routing(routing) = call(&first.connection, 0, RequestBody::Routing)
        .await
        .map_err(|code| anyhow!("routing: {code}"))?
    else {
        bail!("unexpected answer to Routing");
    };
    let map = Arc::new(PlacementMap::from_slots(
        routing.placement_version,
        routing.slot_groups.iter().map(|&g| GroupId(g)).collect(),
    )?);
    let leaders: Arc<Vec<Option<Arc<Node>>>> = Arc::new(
        routing
            .leaders
            .iter()
            .map(|leader| leader.leader.and_then(|id| nodes.get(&id).cloned()))
            .collect(),
    );
    let before_ops: f64 = futures_sum(&nodes, "tenure_raft_proposed_ops_total").await;
    let before_entries: f64 = futures_sum(&nodes, "tenure_raft_proposals_total").await;

    let run = std::process::id();
    let started = Instant::now();
    let deadline = started + options.duration;
    let mut tasks = Vec::new();
    for worker in 0..options.workers {
        let map = map.clone();
        let leaders = leaders.clone();
        let first = first.clone();
        let ttl_ms = options.ttl_ms;
        let per_frame = options.per_frame;
        let node_ids: Vec<u64> = nodes.keys().copied().collect();
        let target_id = node_ids[worker % node_ids.len()];
        tasks.push(tokio::spawn(async move {
            let mut latencies = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).ok();
            let mut errors: BTreeMap<&'static str, u64> = BTreeMap::new();
            let mut n = 0u64;
            while Instant::now() < deadline {
                // `per_frame` fresh keys whose groups this worker's node leads (any node when
                // the leader of a group is unknown), sent in one frame.
                let mut bodies = Vec::with_capacity(per_frame);
                let mut target = first.clone();
                while bodies.len() < per_frame {
                    n += 1;
                    let resource = format!("probe-{run}-{worker}-{n}");
                    let group = map.group_of("probe", &resource).0 as usize;
                    let node = leaders
                        .get(group)
                        .cloned()
                        .flatten()
                        .unwrap_or(first.clone());
                    if node.id != target_id && per_frame > 1 {
                        continue;
                    }
                    target = node;
                    bodies.push(RequestBody::Lease(tenure_core::LeaseOp::Acquire(
                        AcquireRequest {
                            key: ResourceKey::new("probe", resource),
                            holder_id: format!("w{worker}"),
                            ttl_ms,
                            request_id: format!("r{n}"),
                        },
                    )));
                }
                let sent = Instant::now();
                let outcomes = call_many(&target.connection, n, bodies).await;
                let micros = u64::try_from(sent.elapsed().as_micros()).unwrap_or(u64::MAX);
                for result in outcomes {
                    match result {
                        Ok(_) => {
                            if let Some(histogram) = latencies.as_mut() {
                                let _ = histogram.record(micros.max(1));
                            }
                        }
                        Err(code) => *errors.entry(code.as_str()).or_insert(0) += 1,
                    }
                }
            }
            (latencies, errors)
        }));
    }
    let mut all = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let mut errors: BTreeMap<&'static str, u64> = BTreeMap::new();
    for task in tasks {
        let (latencies, worker_errors) = task.await?;
        if let Some(latencies) = latencies {
            all.add(latencies)?;
        }
        for (code, count) in worker_errors {
            *errors.entry(code).or_insert(0) += count;
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let ops = futures_sum(&nodes, "tenure_raft_proposed_ops_total").await - before_ops;
    let entries = futures_sum(&nodes, "tenure_raft_proposals_total").await - before_entries;
    let line = format!(
        "server_probe: {} workers x {} per frame, {:.1} s: {} acquires ok = {:.0}/s; latency p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, max {:.2} ms; errors {:?}; {:.0} ops in {:.0} log entries = {:.1} ops/entry",
        options.workers,
        options.per_frame,
        elapsed,
        all.len(),
        all.len() as f64 / elapsed,
        all.value_at_quantile(0.5) as f64 / 1000.0,
        all.value_at_quantile(0.9) as f64 / 1000.0,
        all.value_at_quantile(0.99) as f64 / 1000.0,
        all.max() as f64 / 1000.0,
        errors,
        ops,
        entries,
        if entries > 0.0 { ops / entries } else { 0.0 },
    );
    let mut out = std::io::stdout().lock();
    std::io::Write::write_all(&mut out, line.as_bytes())?;
    std::io::Write::write_all(&mut out, b"\n")?;
    Ok(())
}

async fn futures_sum(nodes: &BTreeMap<u64, Arc<Node>>, name: &str) -> f64 {
    let mut total = 0.0;
    for node in nodes.values() {
        total += metric_sum(node.http, name).await;
    }
    total
}
