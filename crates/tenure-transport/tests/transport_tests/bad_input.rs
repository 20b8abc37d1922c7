//! Bad input from the network: garbage, truncated frames, oversize lengths, unknown versions,
//! unknown groups, nodes outside the cluster, foreign certificates. Each is refused with a logged
//! reason (connection closed or message rejected), nothing panics, and the node keeps serving its
//! other peer throughout.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tenure_proto::peer::BatchEncoder;
use tenure_proto::{
    Frame, Hello, HelloReply, MessageKind, PEER_PROTOCOL_VERSION, decode_frame_body,
    decode_frame_length, decode_payload, encode_frame,
};
use tenure_transport::certs::{ClusterCa, generate_cluster_ca, issue_node_certificate};
use tenure_transport::tls::{NodeTls, node_server_name};
use tenure_transport::{
    CLOSE_PROTOCOL_ERROR, CLOSE_REFUSED, GroupRegistry, GroupTable, Transport, TransportConfig,
};

const WAIT: Duration = Duration::from_secs(10);

struct Setup {
    ca: ClusterCa,
    node1: Transport,
    node3: Transport,
    addr1: SocketAddr,
    _dir: tempfile::TempDir,
}

pub(crate) fn free_port() -> SocketAddr {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

pub(crate) fn node_tls(ca: &ClusterCa, id: u64) -> NodeTls {
    let certificate = issue_node_certificate(ca, id, &[]).unwrap();
    NodeTls::from_pem(
        id,
        &ca.cert_pem,
        &certificate.cert_pem,
        &certificate.key_pem,
    )
    .unwrap()
}

/// Node 1 and node 3 run real transports; node 2 is a member whose part the tests play by hand.
async fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let ca = generate_cluster_ca("tenure-test").unwrap();
    let peers: BTreeMap<u64, SocketAddr> = [(1, free_port()), (2, free_port()), (3, free_port())]
        .into_iter()
        .collect();
    let start = |id: u64| {
        let registry: Arc<dyn GroupRegistry> = Arc::new(GroupTable::new(dir.path().to_path_buf()));
        Transport::start(
            TransportConfig::new(id, peers[&id], peers.clone()),
            &node_tls(&ca, id),
            registry,
            None,
        )
        .unwrap()
    };
    let node1 = start(1);
    let node3 = start(3);
    let setup = Setup {
        addr1: node1.local_addr().unwrap(),
        ca,
        node1,
        node3,
        _dir: dir,
    };
    wait_until(|| setup.node1.is_connected(3) && setup.node3.is_connected(1)).await;
    setup
}

/// Waits (at most `WAIT`) until `condition` holds.
pub(crate) async fn wait_until(condition: impl Fn() -> bool) {
    tokio::time::timeout(WAIT, async {
        while !condition() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("condition not reached in time");
}

impl Setup {
    /// Still serving the real peer.
    fn assert_node3_still_connected(&self) {
        assert!(self.node1.is_connected(3) && self.node3.is_connected(1));
    }
}

async fn connect(
    ca: &ClusterCa,
    as_node: u64,
    addr: SocketAddr,
) -> Result<quinn::Connection, String> {
    let tls = node_tls(ca, as_node);
    let config = tls
        .quinn_client_config(Arc::new(quinn::TransportConfig::default()))
        .unwrap();
    let endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    let connecting = endpoint
        .connect_with(config, addr, &node_server_name(1))
        .unwrap();
    match tokio::time::timeout(WAIT, connecting).await {
        Ok(Ok(connection)) => Ok(connection),
        Ok(Err(error)) => Err(error.to_string()),
        Err(_) => Err("timed out".into()),
    }
}

async fn try_read_frame(recv: &mut quinn::RecvStream) -> Option<Frame> {
    let mut prefix = [0u8; 4];
    recv.read_exact(&mut prefix).await.ok()?;
    let length = decode_frame_length(prefix, 1 << 24).unwrap();
    let mut body = vec![0u8; length];
    recv.read_exact(&mut body).await.ok()?;
    Some(decode_frame_body(Bytes::from(body)).unwrap())
}

async fn read_frame(recv: &mut quinn::RecvStream) -> Frame {
    try_read_frame(recv)
        .await
        .expect("stream ended before a frame")
}

/// Every frame node 1 sends on any of its lanes. (Opening lane 2 implicitly opens lanes 0 and 1,
/// which may carry nothing, so each lane gets its own reader.)
fn answers(connection: quinn::Connection) -> tokio::sync::mpsc::Receiver<Frame> {
    let (sender, receiver) = tokio::sync::mpsc::channel(16);
    tokio::spawn(async move {
        while let Ok(mut lane) = connection.accept_uni().await {
            let sender = sender.clone();
            tokio::spawn(async move {
                while let Some(frame) = try_read_frame(&mut lane).await {
                    if sender.send(frame).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    receiver
}

async fn hello(connection: &quinn::Connection, hello: Hello) -> HelloReply {
    let (mut send, mut recv) = connection.open_bi().await.unwrap();
    let mut bytes = BytesMut::new();
    encode_frame(&Frame::Hello(hello), &mut bytes);
    send.write_all(&bytes).await.unwrap();
    match tokio::time::timeout(WAIT, read_frame(&mut recv))
        .await
        .unwrap()
    {
        Frame::HelloReply(reply) => reply,
        other => panic!("expected a HelloReply, got {other:?}"),
    }
}

fn valid_hello(from_node: u64) -> Hello {
    Hello {
        version: PEER_PROTOCOL_VERSION,
        from_node,
        to_node: 1,
        cluster: "tenure".into(),
    }
}

/// A member (node 2) that completed the handshake.
async fn member_connection(setup: &Setup) -> quinn::Connection {
    let connection = connect(&setup.ca, 2, setup.addr1).await.unwrap();
    let reply = hello(&connection, valid_hello(2)).await;
    assert!(reply.accepted, "refused: {}", reply.reason);
    connection
}

async fn closed_with(connection: &quinn::Connection) -> (u32, String) {
    match tokio::time::timeout(WAIT, connection.closed())
        .await
        .unwrap()
    {
        quinn::ConnectionError::ApplicationClosed(close) => (
            u32::try_from(close.error_code.into_inner()).unwrap(),
            String::from_utf8_lossy(&close.reason).into_owned(),
        ),
        other => panic!("closed without an application reason: {other}"),
    }
}

async fn send_on_lane(connection: &quinn::Connection, bytes: &[u8]) {
    let mut lane = connection.open_uni().await.unwrap();
    lane.write_all(bytes).await.unwrap();
    lane.finish().unwrap();
}

#[tokio::test]
async fn garbage_bytes_close_that_connection_only() {
    let setup = setup().await;
    let connection = member_connection(&setup).await;
    // A length prefix under the maximum followed by noise that is not a frame.
    let mut garbage = vec![12u8, 0, 0, 0];
    garbage.extend_from_slice(&[0xAB; 12]);
    send_on_lane(&connection, &garbage).await;
    let (code, reason) = closed_with(&connection).await;
    println!("garbage: closed with code {code}: {reason}");
    assert_eq!(code, CLOSE_PROTOCOL_ERROR);
    assert!(setup.node1.stats().protocol_errors >= 1);
    setup.assert_node3_still_connected();
    // The node still accepts the member afterwards.
    member_connection(&setup).await;
}

#[tokio::test]
async fn a_truncated_frame_closes_the_connection() {
    let setup = setup().await;
    let connection = member_connection(&setup).await;
    let mut frame = 100u32.to_le_bytes().to_vec();
    frame.extend_from_slice(&[3; 10]);
    send_on_lane(&connection, &frame).await;
    let (code, reason) = closed_with(&connection).await;
    println!("truncated: closed with code {code}: {reason}");
    assert_eq!(code, CLOSE_PROTOCOL_ERROR);
    assert!(reason.contains("truncated"), "{reason}");
    setup.assert_node3_still_connected();
}

#[tokio::test]
async fn a_length_over_the_maximum_closes_the_connection() {
    let setup = setup().await;
    let connection = member_connection(&setup).await;
    let max = setup.node1.config().frame_bytes_max;
    let prefix = u32::try_from(max + 1).unwrap().to_le_bytes();
    send_on_lane(&connection, &prefix).await;
    let (code, reason) = closed_with(&connection).await;
    println!("oversize: closed with code {code}: {reason}");
    assert_eq!(code, CLOSE_PROTOCOL_ERROR);
    assert!(reason.contains("exceeds"), "{reason}");
    setup.assert_node3_still_connected();
}

#[tokio::test]
async fn an_unknown_protocol_version_is_refused_with_a_reason() {
    let setup = setup().await;
    let connection = connect(&setup.ca, 2, setup.addr1).await.unwrap();
    let reply = hello(
        &connection,
        Hello {
            version: 99,
            ..valid_hello(2)
        },
    )
    .await;
    println!("version 99: {reply:?}");
    assert!(!reply.accepted);
    assert!(reply.reason.contains("version 99"), "{}", reply.reason);
    assert_eq!(closed_with(&connection).await.0, CLOSE_REFUSED);
    setup.assert_node3_still_connected();
}

#[tokio::test]
async fn a_message_for_an_unknown_group_is_answered_with_a_failure() {
    let setup = setup().await;
    let connection = member_connection(&setup).await;
    let mut bytes = BytesMut::new();
    let mut batch = BatchEncoder::begin(&mut bytes);
    batch.push(4242, MessageKind::VoteRequest, 77, b"whatever");
    batch.finish();
    let mut lane = connection.open_uni().await.unwrap();
    lane.write_all(&bytes).await.unwrap();
    let mut answers = answers(connection.clone());
    let Frame::Batch(messages) = tokio::time::timeout(WAIT, answers.recv())
        .await
        .unwrap()
        .unwrap()
    else {
        panic!("expected a batch");
    };
    assert_eq!(messages.len(), 1);
    assert_eq!(messages[0].kind, MessageKind::Failure);
    assert_eq!(messages[0].correlation_id, 77);
    let reason: String = decode_payload(&messages[0].payload, "failure").unwrap();
    println!("unknown group: {reason}");
    assert!(reason.contains("group 4242"), "{reason}");
    // The connection stays usable: a second request gets its own answer.
    let mut bytes = BytesMut::new();
    let mut batch = BatchEncoder::begin(&mut bytes);
    batch.push(4243, MessageKind::AppendRequest, 78, b"");
    batch.finish();
    lane.write_all(&bytes).await.unwrap();
    let Frame::Batch(messages) = tokio::time::timeout(WAIT, answers.recv())
        .await
        .unwrap()
        .unwrap()
    else {
        panic!("expected a batch");
    };
    assert_eq!(messages[0].correlation_id, 78);
    assert_eq!(setup.node1.stats().unknown_group_requests, 2);
    assert!(connection.close_reason().is_none());
    setup.assert_node3_still_connected();
}

#[tokio::test]
async fn a_node_outside_the_cluster_is_refused() {
    let setup = setup().await;
    let connection = connect(&setup.ca, 9, setup.addr1).await.unwrap();
    let reply = hello(&connection, valid_hello(9)).await;
    println!("node 9: {reply:?}");
    assert!(!reply.accepted);
    assert!(reply.reason.contains("not a member"), "{}", reply.reason);
    assert_eq!(closed_with(&connection).await.0, CLOSE_REFUSED);
    setup.assert_node3_still_connected();
}

#[tokio::test]
async fn a_certificate_for_another_node_cannot_claim_a_member() {
    let setup = setup().await;
    // Node 9's certificate is signed by the cluster CA but does not prove node 2.
    let connection = connect(&setup.ca, 9, setup.addr1).await.unwrap();
    let reply = hello(&connection, valid_hello(2)).await;
    println!("node 9 claiming node 2: {reply:?}");
    assert!(!reply.accepted);
    assert!(reply.reason.contains("certificate"), "{}", reply.reason);
    setup.assert_node3_still_connected();
}

#[tokio::test]
async fn a_certificate_from_another_ca_is_refused_by_tls() {
    let setup = setup().await;
    let foreign = generate_cluster_ca("someone-else").unwrap();
    let attempt = async {
        let connection = connect(&foreign, 2, setup.addr1).await?;
        // Depending on timing the refusal shows at connect or at the first exchange.
        let (mut send, _recv) = connection.open_bi().await.map_err(|e| e.to_string())?;
        send.write_all(b"hello").await.map_err(|e| e.to_string())?;
        match tokio::time::timeout(WAIT, connection.closed()).await {
            Ok(reason) => Err(reason.to_string()),
            Err(_) => Ok(()),
        }
    };
    let result = attempt.await;
    println!("foreign CA: {result:?}");
    assert!(
        result.is_err(),
        "a foreign certificate got a working connection"
    );
    wait_until(|| setup.node1.stats().connections_refused >= 1).await;
    setup.assert_node3_still_connected();
}
