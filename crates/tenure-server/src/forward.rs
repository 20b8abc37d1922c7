//! Forwarding: this node's connections to other nodes' client endpoints.
//!
//! A node that does not lead a key's group and was asked to forward sends the request to the
//! leader over the native client protocol (ALPN `tenure-client/8`), presenting its own node
//! certificate; the leader trusts the principal a cluster node names, unless the forwarder marks
//! it as claimed without authentication (`RequestFlags::principal_claimed`), which only a leader
//! in insecure development mode accepts. Forwarded requests never forward again (one hop).
//!
//! As the client library's links do (`tenure-client`'s `link` module): one QUIC connection per
//! target node, with [`LANES_PER_NODE`] long-lived bidirectional streams (lanes). A lane's writer
//! puts every request queued when it wakes into one frame; its reader hands each response to the
//! call waiting for its id, so any number of slow requests share the lanes with fast ones (one
//! stream per request would stop at the leader's stream limit). Requests in flight per target
//! are bounded ([`INFLIGHT_PER_NODE_MAX`]; a caller waits for room until its deadline). No lock
//! is held across a dial: a dial runs in its own task and callers wait for its outcome, each
//! until its own deadline; targets never wait for each other. Targets follow the cluster's node
//! table at run time ([`Forwarder::set_node`], [`Forwarder::remove_node`]).
//!
//! Must not depend on: the groups; this module only moves requests.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tenure_core::ErrorCode;
use tenure_proto::client::{
    CLIENT_FRAME_BYTES_MAX, Principal, Request, RequestBody, RequestFlags, ResponseBody, WireError,
    decode_response_frame, encode_frames_split,
};
use tenure_transport::tls::node_server_name;
use tokio::sync::{Semaphore, mpsc, oneshot, watch};
use tracing::debug;

use crate::fault_control::FaultControls;

/// Reads one length-prefixed frame body from a QUIC stream. The body's buffer grows as its
/// bytes arrive: a length prefix alone costs nothing.
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
    let mut body = Vec::with_capacity(length.min(BODY_CAPACITY_FIRST));
    while body.len() < length {
        match recv.read_chunk(length - body.len(), true).await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk.bytes),
            Ok(None) => {
                return Err(format!(
                    "truncated frame: {} of {length} body bytes",
                    body.len()
                ));
            }
            Err(error) => return Err(format!("truncated frame: {error}")),
        }
    }
    Ok(Some(body))
}

/// Bytes reserved for a frame body before its bytes arrive.
const BODY_CAPACITY_FIRST: usize = 64 * 1024;

fn unavailable(message: impl Into<String>) -> WireError {
    WireError::new(ErrorCode::Unavailable, message)
}

/// Long-lived bidirectional streams per target node.
pub const LANES_PER_NODE: usize = 4;

/// Forwarded requests in flight per target node at most; more wait for room until their
/// deadline.
pub const INFLIGHT_PER_NODE_MAX: usize = 16_384;

/// Requests one frame carries at most.
const FRAME_REQUESTS_MAX: usize = 1_024;

/// A dial (QUIC handshake and opening the lanes) must finish within this.
const DIAL_TIMEOUT: Duration = Duration::from_secs(3);

type Answer = Result<ResponseBody, WireError>;
/// Waiting calls by correlation id. Ordered: when a connection dies, its waiting calls are woken
/// in id order (a randomly seeded hash map woke them in a different order in each run, and the
/// deterministic simulation diverged when two forwarded calls were pending on a dying connection).
type PendingMap = Arc<Mutex<BTreeMap<u64, oneshot::Sender<Answer>>>>;

/// A live connection to a target and its lanes.
struct Lanes {
    connection: quinn::Connection,
    lanes: Vec<mpsc::Sender<Request>>,
    pending: PendingMap,
    next_lane: AtomicUsize,
    dead: Arc<AtomicBool>,
}

impl Lanes {
    fn is_usable(&self) -> bool {
        !self.dead.load(Ordering::Acquire) && self.connection.close_reason().is_none()
    }
}

type DialOutcome = Option<Result<Arc<Lanes>, String>>;

enum TargetState {
    Idle,
    Dialling(watch::Receiver<DialOutcome>),
    Live(Arc<Lanes>),
}

/// One node requests are forwarded to.
struct Target {
    node: u64,
    addr: SocketAddr,
    state: Mutex<TargetState>,
    permits: Arc<Semaphore>,
}

impl Target {
    fn new(node: u64, addr: SocketAddr) -> Arc<Self> {
        Arc::new(Target {
            node,
            addr,
            state: Mutex::new(TargetState::Idle),
            permits: Arc::new(Semaphore::new(INFLIGHT_PER_NODE_MAX)),
        })
    }

    /// Closes the live connection, if any (callers waiting on it fail at once).
    fn close(&self, reason: &str) {
        if let Ok(state) = self.state.lock() {
            if let TargetState::Live(lanes) = &*state {
                lanes.connection.close(0u32.into(), reason.as_bytes());
            }
        }
    }
}

/// Forgets a waiting call's id when the call ends (answered, timed out or abandoned).
struct PendingGuard {
    pending: PendingMap,
    id: u64,
}

impl Drop for PendingGuard {
    fn drop(&mut self) {
        if let Ok(mut pending) = self.pending.lock() {
            pending.remove(&self.id);
        }
    }
}

/// Connections to other nodes for forwarding.
pub struct Forwarder {
    endpoint: quinn::Endpoint,
    client_config: quinn::ClientConfig,
    /// By node; changed at run time as the cluster's node table changes.
    targets: std::sync::RwLock<BTreeMap<u64, Arc<Target>>>,
    next_id: AtomicU64,
    /// Fault injection (tests): requests to a node this node's traffic to is dropped fail as
    /// UNAVAILABLE, as if the link were cut.
    fault_controls: Option<Arc<FaultControls>>,
}

impl std::fmt::Debug for Forwarder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Forwarder")
            .field("nodes", &self.nodes())
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
        let targets = nodes
            .into_iter()
            .map(|(node, addr)| (node, Target::new(node, addr)))
            .collect();
        Arc::new(Forwarder {
            endpoint,
            client_config,
            targets: std::sync::RwLock::new(targets),
            next_id: AtomicU64::new(1),
            fault_controls,
        })
    }

    /// The nodes requests can go to, with their addresses.
    pub fn nodes(&self) -> Vec<(u64, SocketAddr)> {
        self.targets
            .read()
            .map(|targets| targets.values().map(|t| (t.node, t.addr)).collect())
            .unwrap_or_default()
    }

    /// Makes `node` reachable at `addr` (a new node, or a node that moved: its old connection
    /// is closed). No-op when nothing changed.
    pub fn set_node(&self, node: u64, addr: SocketAddr) {
        let Ok(mut targets) = self.targets.write() else {
            return;
        };
        if targets.get(&node).is_some_and(|target| target.addr == addr) {
            return;
        }
        if let Some(old) = targets.insert(node, Target::new(node, addr)) {
            old.close("the node moved to another address");
        }
    }

    /// Forgets `node` (removed from the cluster) and closes its connection.
    pub fn remove_node(&self, node: u64) {
        let removed = self
            .targets
            .write()
            .ok()
            .and_then(|mut targets| targets.remove(&node));
        if let Some(target) = removed {
            target.close("the node was removed from the cluster");
        }
    }

    /// The target's live lanes, dialling them when there are none. The state lock is held only
    /// to look and to start a dial, never across one.
    async fn lanes(&self, target: &Arc<Target>) -> Result<Arc<Lanes>, WireError> {
        let mut outcome = {
            let mut state = target
                .state
                .lock()
                .map_err(|_| unavailable("forwarder state poisoned"))?;
            match &*state {
                TargetState::Live(lanes) if lanes.is_usable() => return Ok(lanes.clone()),
                TargetState::Dialling(outcome) => outcome.clone(),
                TargetState::Live(_) | TargetState::Idle => {
                    if let TargetState::Live(old) = &*state {
                        old.dead.store(true, Ordering::Release);
                        old.connection.close(0u32.into(), b"replaced");
                    }
                    let (sender, outcome) = watch::channel(None);
                    *state = TargetState::Dialling(outcome.clone());
                    tokio::spawn(dial(
                        self.endpoint.clone(),
                        self.client_config.clone(),
                        target.clone(),
                        sender,
                    ));
                    outcome
                }
            }
        };
        let node = target.node;
        let settled = outcome
            .wait_for(Option::is_some)
            .await
            .map_err(|_| unavailable(format!("dialling node {node} was abandoned")))?;
        match &*settled {
            Some(Ok(lanes)) => Ok(lanes.clone()),
            Some(Err(reason)) => Err(unavailable(reason.clone())),
            None => Err(unavailable(format!("dialling node {node} was abandoned"))),
        }
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
        if self
            .fault_controls
            .as_ref()
            .is_some_and(|controls| controls.drops_to(node))
        {
            return Err(unavailable(format!(
                "the link to node {node} is cut (fault injection)"
            )));
        }
        let target = self
            .targets
            .read()
            .ok()
            .and_then(|targets| targets.get(&node).cloned())
            .ok_or_else(|| unavailable(format!("node {node} is not a member")))?;
        let target = &target;
        let started = tokio::time::Instant::now();
        let exchange = async {
            let _permit = target
                .permits
                .clone()
                .acquire_owned()
                .await
                .map_err(|_| unavailable("forwarder closed"))?;
            let lanes = self.lanes(target).await?;
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            let remaining = timeout.saturating_sub(started.elapsed());
            let request = Request {
                id,
                timeout_ms: u32::try_from(remaining.as_millis())
                    .unwrap_or(u32::MAX)
                    .max(1),
                flags: RequestFlags {
                    forward: false,
                    ..flags
                },
                principal: Some(principal.clone()),
                body,
            };
            let (answer, waiting) = oneshot::channel();
            if let Ok(mut pending) = lanes.pending.lock() {
                pending.insert(id, answer);
            }
            let _guard = PendingGuard {
                pending: lanes.pending.clone(),
                id,
            };
            let lane = lanes.next_lane.fetch_add(1, Ordering::Relaxed) % lanes.lanes.len();
            lanes.lanes[lane]
                .send(request)
                .await
                .map_err(|_| unavailable(format!("the lane to node {node} closed")))?;
            waiting.await.map_err(|_| {
                unavailable(format!(
                    "connection to node {node} lost before the answer: {}",
                    lanes
                        .connection
                        .close_reason()
                        .map_or_else(|| "a lane failed".to_string(), |r| r.to_string())
                ))
            })?
        };
        match tokio::time::timeout(timeout, exchange).await {
            Ok(result) => result,
            Err(_) => Err(unavailable(format!(
                "forwarded request to node {node} timed out"
            ))),
        }
    }
}

/// Dials `target` and opens its lanes, in a task of its own; publishes the outcome to the
/// waiting callers and in the target's state.
async fn dial(
    endpoint: quinn::Endpoint,
    client_config: quinn::ClientConfig,
    target: Arc<Target>,
    outcome: watch::Sender<DialOutcome>,
) {
    let node = target.node;
    let attempt = async {
        let connecting = endpoint
            .connect_with(client_config, target.addr, &node_server_name(node))
            .map_err(|error| format!("dialling node {node}: {error}"))?;
        let connection = connecting
            .await
            .map_err(|error| format!("dialling node {node}: {error}"))?;
        open_lanes(node, connection).await
    };
    let result = match tokio::time::timeout(DIAL_TIMEOUT, attempt).await {
        Ok(result) => result.map(Arc::new),
        Err(_) => Err(format!("dialling node {node} timed out")),
    };
    if let Ok(mut state) = target.state.lock() {
        *state = match &result {
            Ok(lanes) => TargetState::Live(lanes.clone()),
            Err(_) => TargetState::Idle,
        };
    }
    if let Err(reason) = &result {
        debug!(node, "forwarding dial failed: {reason}");
    }
    outcome.send_replace(Some(result));
}

async fn open_lanes(node: u64, connection: quinn::Connection) -> Result<Lanes, String> {
    let pending: PendingMap = Arc::default();
    let dead = Arc::new(AtomicBool::new(false));
    let mut lanes = Vec::with_capacity(LANES_PER_NODE);
    for _ in 0..LANES_PER_NODE {
        let (send, recv) = connection
            .open_bi()
            .await
            .map_err(|error| format!("opening a lane to node {node}: {error}"))?;
        let (queue, queued) = mpsc::channel(INFLIGHT_PER_NODE_MAX);
        tokio::spawn(lane_writer(send, queued, pending.clone(), dead.clone()));
        tokio::spawn(lane_reader(recv, pending.clone(), dead.clone()));
        lanes.push(queue);
    }
    Ok(Lanes {
        connection,
        lanes,
        pending,
        next_lane: AtomicUsize::new(0),
        dead,
    })
}

fn fail_all(pending: &PendingMap, dead: &AtomicBool) {
    dead.store(true, Ordering::Release);
    if let Ok(mut pending) = pending.lock() {
        // Dropping the senders wakes every waiting call with "lost".
        pending.clear();
    }
}

async fn lane_writer(
    mut send: quinn::SendStream,
    mut queued: mpsc::Receiver<Request>,
    pending: PendingMap,
    dead: Arc<AtomicBool>,
) {
    while let Some(first) = queued.recv().await {
        let mut requests = vec![first];
        while requests.len() < FRAME_REQUESTS_MAX {
            match queued.try_recv() {
                Ok(next) => requests.push(next),
                Err(_) => break,
            }
        }
        let (frames, too_large) = encode_frames_split(&requests);
        for index in too_large {
            let waiting = pending
                .lock()
                .ok()
                .and_then(|mut pending| pending.remove(&requests[index].id));
            if let Some(waiting) = waiting {
                let _ = waiting.send(Err(WireError::new(
                    ErrorCode::InvalidArgument,
                    format!(
                        "the request does not fit in a frame of {CLIENT_FRAME_BYTES_MAX} bytes"
                    ),
                )));
            }
        }
        for frame in frames {
            if send.write_all(&frame).await.is_err() {
                fail_all(&pending, &dead);
                return;
            }
        }
    }
    let _ = send.finish();
}

async fn lane_reader(mut recv: quinn::RecvStream, pending: PendingMap, dead: Arc<AtomicBool>) {
    loop {
        let body = match read_frame_body(&mut recv, CLIENT_FRAME_BYTES_MAX).await {
            Ok(Some(body)) => body,
            Ok(None) => break,
            Err(reason) => {
                debug!("a forwarding lane failed: {reason}");
                break;
            }
        };
        let frame = match decode_response_frame(&body) {
            Ok(frame) => frame,
            Err(error) => {
                debug!("a node answered an undecodable frame: {error}");
                break;
            }
        };
        let Ok(mut waiting) = pending.lock() else {
            break;
        };
        for response in frame.responses {
            if let Some(answer) = waiting.remove(&response.id) {
                let _ = answer.send(response.result);
            }
        }
    }
    fail_all(&pending, &dead);
}
