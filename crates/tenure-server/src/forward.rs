//! Forwarding: this node's connections to other nodes' client endpoints.
//!
//! A node that does not lead a key's group and was asked to forward sends the request to the
//! leader over the native client protocol (ALPN `tenure-client/1`), presenting its own node
//! certificate; the leader trusts the principal a cluster node names. One QUIC connection per
//! target node, reused; one bidirectional stream per forwarded request. Forwarded requests never
//! forward again (one hop).
//!
//! Must not depend on: the groups; this module only moves requests.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tenure_core::ErrorCode;
use tenure_proto::client::{
    CLIENT_FRAME_BYTES_MAX, Principal, Request, RequestBody, RequestFlags, RequestFrame,
    ResponseBody, WireError, decode_response_frame, encode_client_frame,
};
use tenure_transport::tls::node_server_name;
use tokio::sync::Mutex;

use crate::fault_control::FaultControls;

/// Reads one length-prefixed frame body from a QUIC stream.
pub async fn read_frame_body(
    recv: &mut quinn::RecvStream,
    frame_bytes_max: usize,
) -> Result<Option<Vec<u8>>, String> {
    let mut prefix = [0u8; 4];
    match recv.read_exact(&mut prefix).await {
        Ok(()) => {}
        Err(quinn::ReadExactError::FinishedEarly(0)) => return Ok(None),
        Err(quinn::ReadExactError::FinishedEarly(_)) => {
            return Err("stream ended inside a frame length".into());
        }
        Err(quinn::ReadExactError::ReadError(error)) => return Err(error.to_string()),
    }
    let length = u32::from_le_bytes(prefix) as usize;
    if length == 0 || length > frame_bytes_max {
        return Err(format!(
            "frame of {length} bytes outside 1..={frame_bytes_max}"
        ));
    }
    let mut body = vec![0u8; length];
    recv.read_exact(&mut body)
        .await
        .map_err(|error| format!("truncated frame: {error}"))?;
    Ok(Some(body))
}

fn unavailable(message: impl Into<String>) -> WireError {
    WireError::new(ErrorCode::Unavailable, message)
}

/// Connections to other nodes for forwarding.
pub struct Forwarder {
    endpoint: quinn::Endpoint,
    client_config: quinn::ClientConfig,
    nodes: BTreeMap<u64, SocketAddr>,
    connections: Mutex<HashMap<u64, quinn::Connection>>,
    next_id: AtomicU64,
    /// Fault injection (tests): requests to a node this node's traffic to is dropped fail as
    /// UNAVAILABLE, as if the link were cut.
    fault_controls: Option<Arc<FaultControls>>,
}

impl std::fmt::Debug for Forwarder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Forwarder")
            .field("nodes", &self.nodes)
            .finish_non_exhaustive()
    }
}

impl Forwarder {
    /// A forwarder dialling from `endpoint` with `client_config` (ALPN of the client protocol,
    /// this node's certificate) to the nodes' QUIC addresses; `fault_controls` (tests) may cut
    /// its links.
    pub fn new(
        endpoint: quinn::Endpoint,
        client_config: quinn::ClientConfig,
        nodes: BTreeMap<u64, SocketAddr>,
        fault_controls: Option<Arc<FaultControls>>,
    ) -> Arc<Self> {
        Arc::new(Forwarder {
            endpoint,
            client_config,
            nodes,
            connections: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            fault_controls,
        })
    }

    async fn connection(&self, node: u64) -> Result<quinn::Connection, WireError> {
        if self
            .fault_controls
            .as_ref()
            .is_some_and(|controls| controls.drops_to(node))
        {
            return Err(unavailable(format!(
                "the link to node {node} is cut (fault injection)"
            )));
        }
        let mut connections = self.connections.lock().await;
        if let Some(connection) = connections.get(&node) {
            if connection.close_reason().is_none() {
                return Ok(connection.clone());
            }
        }
        let addr = *self
            .nodes
            .get(&node)
            .ok_or_else(|| unavailable(format!("node {node} is not a member")))?;
        let connecting = self
            .endpoint
            .connect_with(self.client_config.clone(), addr, &node_server_name(node))
            .map_err(|error| unavailable(format!("dialling node {node}: {error}")))?;
        let connection = tokio::time::timeout(Duration::from_secs(3), connecting)
            .await
            .map_err(|_| unavailable(format!("dialling node {node} timed out")))?
            .map_err(|error| unavailable(format!("dialling node {node}: {error}")))?;
        connections.insert(node, connection.clone());
        Ok(connection)
    }

    /// Sends one request to `node` for `principal` and waits for its answer.
    pub async fn forward(
        &self,
        node: u64,
        principal: &Principal,
        flags: RequestFlags,
        body: RequestBody,
        timeout: Duration,
    ) -> Result<ResponseBody, WireError> {
        let exchange = async {
            let connection = self.connection(node).await?;
            let (mut send, mut recv) = connection
                .open_bi()
                .await
                .map_err(|error| unavailable(format!("stream to node {node}: {error}")))?;
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            let request = Request {
                id,
                timeout_ms: u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX),
                flags: RequestFlags {
                    forward: false,
                    ..flags
                },
                principal: Some(principal.clone()),
                body,
            };
            let frame = encode_client_frame(&RequestFrame {
                requests: vec![request],
            })
            .map_err(|error| WireError::new(ErrorCode::InvalidArgument, error.to_string()))?;
            send.write_all(&frame)
                .await
                .map_err(|error| unavailable(format!("writing to node {node}: {error}")))?;
            let _ = send.finish();
            let body = read_frame_body(&mut recv, CLIENT_FRAME_BYTES_MAX)
                .await
                .map_err(|error| unavailable(format!("reading from node {node}: {error}")))?
                .ok_or_else(|| unavailable(format!("node {node} closed the stream")))?;
            let frame = decode_response_frame(&body)
                .map_err(|error| unavailable(format!("node {node} answered garbage: {error}")))?;
            frame
                .responses
                .into_iter()
                .find(|response| response.id == id)
                .ok_or_else(|| unavailable(format!("node {node} did not answer request {id}")))?
                .result
        };
        match tokio::time::timeout(timeout, exchange).await {
            Ok(result) => result,
            Err(_) => Err(unavailable(format!(
                "forwarded request to node {node} timed out"
            ))),
        }
    }
}
