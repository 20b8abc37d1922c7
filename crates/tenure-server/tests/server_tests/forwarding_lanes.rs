//! Forwarding must not squeeze through the leader's stream limit (issue 19, item 9).
//!
//! A fake leader on loopback speaks the client protocol and allows 16 concurrent bidirectional
//! streams per connection, as a real node did for every connection at commit 8c6b922. It holds
//! every `Get` of a resource named `slow-*` for 10 seconds and answers everything else at once.
//! The test forwards 24 slow requests through a real [`Forwarder`], then one fast request, which
//! must be answered within its 2 s timeout.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tenure_core::{ErrorCode, ResourceKey};
use tenure_proto::client::{
    CLIENT_FRAME_BYTES_MAX, GetResult, Principal, RequestBody, RequestFlags, Response,
    ResponseBody, ResponseFrame, WireError, decode_request_frame, encode_client_frame,
};
use tenure_server::forward::{Forwarder, read_frame_body};
use tenure_transport::certs::write_cluster_certificates;
use tenure_transport::tls::NodeTls;

/// Streams the fake leader allows per connection (a node's limit at commit 8c6b922).
const LEADER_STREAMS: u32 = 16;

fn tls(dir: &std::path::Path, id: u64) -> NodeTls {
    NodeTls::load(
        id,
        &dir.join("ca.pem"),
        &dir.join(format!("node-{id}.pem")),
        &dir.join(format!("node-{id}.key")),
    )
    .unwrap()
}

/// Answers one request: `Get` of `slow-*` after 10 s, anything else at once.
async fn answer(id: u64, body: RequestBody) -> Response {
    let slow = matches!(&body, RequestBody::Get { key } if key.resource_id.starts_with("slow-"));
    if slow {
        tokio::time::sleep(Duration::from_secs(10)).await;
    }
    let result = match body {
        RequestBody::Get { .. } => Ok(ResponseBody::Get(GetResult {
            view: None,
            log_time_ms: 1,
            stale: false,
            group_id: 0,
        })),
        _ => Err(WireError::new(ErrorCode::InvalidArgument, "fake leader")),
    };
    Response { id, result }
}

async fn serve_stream(mut send: quinn::SendStream, mut recv: quinn::RecvStream) {
    let (responses, mut pending) = tokio::sync::mpsc::channel::<Response>(1024);
    let writer = tokio::spawn(async move {
        while let Some(response) = pending.recv().await {
            let frame = encode_client_frame(&ResponseFrame {
                responses: vec![response],
            })
            .unwrap();
            if send.write_all(&frame).await.is_err() {
                return;
            }
        }
        let _ = send.finish();
    });
    while let Ok(Some(body)) = read_frame_body(&mut recv, CLIENT_FRAME_BYTES_MAX).await {
        let Ok(frame) = decode_request_frame(&body) else {
            break;
        };
        for request in frame.requests {
            let responses = responses.clone();
            tokio::spawn(async move {
                let _ = responses.send(answer(request.id, request.body).await).await;
            });
        }
    }
    drop(responses);
    let _ = writer.await;
}

async fn fake_leader(tls: &NodeTls) -> (quinn::Endpoint, SocketAddr) {
    let mut transport = quinn::TransportConfig::default();
    transport.max_concurrent_bidi_streams(LEADER_STREAMS.into());
    let server = tls
        .quinn_server_config_for(Arc::new(transport), true)
        .unwrap();
    let endpoint = quinn::Endpoint::server(server, "127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = endpoint.local_addr().unwrap();
    let accepting = endpoint.clone();
    tokio::spawn(async move {
        while let Some(incoming) = accepting.accept().await {
            tokio::spawn(async move {
                let Ok(connection) = incoming.await else {
                    return;
                };
                while let Ok((send, recv)) = connection.accept_bi().await {
                    tokio::spawn(serve_stream(send, recv));
                }
            });
        }
    });
    (endpoint, addr)
}

fn get(resource: &str) -> RequestBody {
    RequestBody::Get {
        key: ResourceKey {
            tenant_id: "acme".into(),
            resource_id: resource.into(),
        },
    }
}

/// Runs alone (the cluster lock of this binary): the fast request's 2 s budget must not be spent
/// waiting for cores a cluster test beside it is using.
#[test]
fn forwarding_squeezes_through_16_streams() {
    crate::common::run_alone(squeeze_through_16_streams());
}

async fn squeeze_through_16_streams() {
    let dir = tempfile::tempdir().unwrap();
    write_cluster_certificates(dir.path(), "tenure-test", &[1, 2], &[]).unwrap();
    let (_leader, leader_addr) = fake_leader(&tls(dir.path(), 2)).await;
    let me = tls(dir.path(), 1);
    let client_config = me
        .quinn_client_config_for(
            Arc::new(quinn::TransportConfig::default()),
            tenure_proto::client::CLIENT_ALPN,
        )
        .unwrap();
    let endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    let forwarder = Forwarder::new(
        endpoint,
        client_config,
        BTreeMap::from([(2, leader_addr)]),
        None,
    );
    let principal = Principal {
        principal_id: "tests".into(),
        tenant_id: "acme".into(),
    };
    // Warm up: the connection exists before the slow requests arrive.
    forwarder
        .forward(
            2,
            &principal,
            RequestFlags::default(),
            get("warm-up"),
            Duration::from_secs(3),
        )
        .await
        .expect("the warm-up request is answered");
    let mut slow = Vec::new();
    for i in 0..(LEADER_STREAMS as usize + 8) {
        let forwarder = forwarder.clone();
        let principal = principal.clone();
        slow.push(tokio::spawn(async move {
            forwarder
                .forward(
                    2,
                    &principal,
                    RequestFlags::default(),
                    get(&format!("slow-{i}")),
                    Duration::from_secs(12),
                )
                .await
        }));
    }
    // Let the slow requests reach the leader.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let fast = forwarder
        .forward(
            2,
            &principal,
            RequestFlags::default(),
            get("fast"),
            Duration::from_secs(2),
        )
        .await;
    println!(
        "the fast forwarded request took {} ms: {:?}",
        started.elapsed().as_millis(),
        fast.as_ref().map(|_| "answered")
    );
    assert!(
        matches!(fast, Ok(ResponseBody::Get(_))),
        "a forwarded request behind {} slow ones was not answered: {fast:?}",
        slow.len()
    );
    for task in slow {
        task.abort();
    }
}
