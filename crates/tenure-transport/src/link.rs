//! The state one node's transport shares among its tasks, and frame I/O: the peer links (lanes,
//! the table of requests waiting for an answer, the current connection), outbound messages and
//! replies, sending a request and waiting for its answer, and reading and writing length-prefixed
//! frames with a bound. Used by the connection tasks (`transport`), the inbound readers
//! (`inbound`) and the replication streams (`network`).
//!
//! The set of links changes at runtime (`Transport::add_peer` / `remove_peer`): it sits behind a
//! lock that is never held across an await, and tasks hold the `Arc<PeerLink>` they work on. A
//! link's address can change (later dials use the new one), and a removed link carries a stop
//! signal that its connection tasks and any waiting requester observe. The owner's admission
//! policy ([`PeerAdmission`](crate::tls::PeerAdmission)), when set, judges the certificate of
//! every peer connection (`Shared::admit`).
//!
//! Must not depend on: the connection tasks or the inbound readers (they build on this), the lease
//! state machine's semantics, RocksDB, configuration files, or the wall clock.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex, PoisonError, RwLock};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use dashmap::DashMap;
use quinn::VarInt;
use rand::Rng;
use rand::rngs::SmallRng;
use tenure_proto::peer::{FRAME_LENGTH_BYTES, MESSAGE_HEADER_BYTES};
use tenure_proto::{
    Frame, MessageKind, ProtoError, decode_frame_body, decode_frame_length, encode_frame,
};
use tokio::sync::{Mutex as AsyncMutex, Semaphore, mpsc, oneshot, watch};
use tokio::time::Instant;
use tracing::warn;

use crate::config::TransportConfig;
use crate::error::TransportError;
use crate::fault::{FaultInjector, Verdict};
use crate::registry::{ClientAcceptor, GroupRegistry};
use crate::stats::{TransportStats, add};
use crate::tls::{PeerAdmission, peer_certificate_sha256};

/// Close code: orderly shutdown.
pub const CLOSE_SHUTDOWN: u32 = 0;
/// Close code: the pair already has its preferred connection.
pub const CLOSE_DUPLICATE: u32 = 1;
/// Close code: the peer sent bytes that are not the peer protocol.
pub const CLOSE_PROTOCOL_ERROR: u32 = 2;
/// Close code: the handshake refused the peer (not a member, wrong certificate, version, or a
/// certificate the admission policy refuses).
pub const CLOSE_REFUSED: u32 = 3;
/// Close code: this node removed the peer from its cluster (`Transport::remove_peer`).
pub const CLOSE_REMOVED: u32 = 4;
/// Close code: this node's owner dropped the connection (the peer's address changed, or its
/// certificate was revoked: `Transport::close_peer_connection`); the link redials.
pub const CLOSE_DROPPED: u32 = 5;

/// Close reason sent with [`CLOSE_REMOVED`].
pub(crate) const REMOVED_REASON: &str = "removed from the cluster";

/// Largest handshake or snapshot control frame, in bytes.
pub(crate) const CONTROL_FRAME_BYTES_MAX: usize = 1024 * 1024;

pub(crate) fn is_control(kind: MessageKind) -> bool {
    matches!(
        kind,
        MessageKind::AppendRequest
            | MessageKind::AppendResponse
            | MessageKind::VoteRequest
            | MessageKind::PreVoteRequest
            | MessageKind::VoteResponse
            | MessageKind::TransferLeaderRequest
            | MessageKind::TransferLeaderResponse
    )
}

/// One queued outbound message.
#[derive(Debug, Clone)]
pub(crate) struct Outbound {
    pub(crate) group_id: u32,
    pub(crate) kind: MessageKind,
    pub(crate) correlation_id: u64,
    pub(crate) payload: Bytes,
}

/// An answer delivered to a waiting requester.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) kind: MessageKind,
    pub(crate) payload: Bytes,
}

pub(crate) struct Offer {
    pub(crate) connection: quinn::Connection,
    pub(crate) dialed_by: u64,
}

/// Everything this node keeps about one peer.
pub(crate) struct PeerLink {
    pub(crate) peer: u64,
    /// Where dials go; `Transport::add_peer` may change it.
    addr: StdMutex<SocketAddr>,
    /// Set once when the link is removed from the transport; its tasks stop.
    removed: watch::Sender<bool>,
    pub(crate) lanes: Vec<mpsc::Sender<Outbound>>,
    pub(crate) lane_receivers: Vec<Arc<AsyncMutex<mpsc::Receiver<Outbound>>>>,
    /// Fixed hasher and shard count: when the connection is lost, the waiters are failed in one
    /// order every run (on any machine), not in a random-seeded hash order.
    pub(crate) pending: DashMap<u64, oneshot::Sender<Reply>, FixedHasher>,
    pub(crate) next_correlation: AtomicU64,
    pub(crate) connection: watch::Sender<Option<quinn::Connection>>,
    pub(crate) offers: mpsc::Sender<Offer>,
    pub(crate) offers_receiver: StdMutex<Option<mpsc::Receiver<Offer>>>,
    pub(crate) dial_failing: AtomicBool,
}

impl PeerLink {
    pub(crate) fn new(peer: u64, addr: SocketAddr, config: &TransportConfig) -> Self {
        // One control lane plus at least one replication lane.
        let lanes_count = config.lanes_per_peer.max(2);
        let mut lanes = Vec::with_capacity(lanes_count);
        let mut lane_receivers = Vec::with_capacity(lanes_count);
        for _ in 0..lanes_count {
            let (sender, receiver) = mpsc::channel(config.lane_queue_messages_max.max(1));
            lanes.push(sender);
            lane_receivers.push(Arc::new(AsyncMutex::new(receiver)));
        }
        let (offers, offers_receiver) = mpsc::channel(4);
        Self {
            peer,
            addr: StdMutex::new(addr),
            removed: watch::Sender::new(false),
            lanes,
            lane_receivers,
            pending: DashMap::with_hasher_and_shard_amount(FixedHasher::default(), 16),
            next_correlation: AtomicU64::new(1),
            connection: watch::Sender::new(None),
            offers,
            offers_receiver: StdMutex::new(Some(offers_receiver)),
            dial_failing: AtomicBool::new(false),
        }
    }

    /// The address the next dial goes to.
    pub(crate) fn addr(&self) -> SocketAddr {
        *self.addr.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Makes later dials go to `addr`; whether it differs from the address before.
    pub(crate) fn set_addr(&self, addr: SocketAddr) -> bool {
        let mut current = self.addr.lock().unwrap_or_else(PoisonError::into_inner);
        let changed = *current != addr;
        *current = addr;
        changed
    }

    /// Marks the link removed: its connection tasks stop, waiting requesters fail.
    pub(crate) fn mark_removed(&self) {
        self.removed.send_replace(true);
    }

    pub(crate) fn is_removed(&self) -> bool {
        *self.removed.borrow()
    }

    /// A receiver of the removal signal, for [`removed`].
    pub(crate) fn removal(&self) -> watch::Receiver<bool> {
        self.removed.subscribe()
    }

    /// Closes the current connection, if any, with `code` and `reason`; the link's task then
    /// redials (or stops, when the link was removed).
    pub(crate) fn close_connection(&self, code: u32, reason: &str) {
        if let Some(connection) = self.current_connection() {
            close_connection(&connection, code, reason);
        }
    }

    /// The lane a message travels on. Lane 0 is the control lane: heartbeats (unary appends),
    /// votes, leader transfers and their answers, gathered with a longer linger so that every
    /// heartbeat due to the peer at one driver tick shares a frame. Replication streams use the
    /// other lanes, `1 + group_id % (lanes - 1)`, so one group's stream stays in order.
    pub(crate) fn lane_of(&self, group_id: u32, kind: MessageKind) -> &mpsc::Sender<Outbound> {
        let data_lanes = self.lanes.len() - 1;
        let index = if data_lanes == 0 || is_control(kind) {
            0
        } else {
            1 + usize::try_from(group_id).unwrap_or(0) % data_lanes
        };
        &self.lanes[index]
    }

    pub(crate) fn next_correlation_id(&self) -> u64 {
        self.next_correlation.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn current_connection(&self) -> Option<quinn::Connection> {
        self.connection.borrow().clone()
    }

    /// Waits until the link has a connection, or fails fast when dialling is failing.
    pub(crate) async fn connected(
        &self,
        deadline: Instant,
    ) -> Result<quinn::Connection, TransportError> {
        if self.is_removed() {
            return Err(TransportError::UnknownPeer(self.peer));
        }
        if let Some(connection) = self.current_connection() {
            return Ok(connection);
        }
        if self.dial_failing.load(Ordering::Relaxed) {
            return Err(TransportError::Unreachable {
                peer: self.peer,
                reason: "not connected (dialling is failing)".into(),
            });
        }
        let mut watcher = self.connection.subscribe();
        let mut removal = self.removal();
        let connection = async {
            tokio::select! {
                connection = watcher.wait_for(Option::is_some) => {
                    connection.ok().and_then(|connection| connection.clone())
                }
                () = removed(&mut removal) => None,
            }
        };
        match tokio::time::timeout_at(deadline, connection).await {
            Ok(Some(connection)) => Ok(connection),
            Ok(None) if self.is_removed() => Err(TransportError::UnknownPeer(self.peer)),
            Ok(None) => Err(TransportError::Unreachable {
                peer: self.peer,
                reason: "not connected".into(),
            }),
            Err(_) => Err(TransportError::Unreachable {
                peer: self.peer,
                reason: "no connection within the deadline".into(),
            }),
        }
    }

    pub(crate) fn fail_pending(&self) {
        // Dropping the senders wakes every waiting requester with "connection lost".
        self.pending.clear();
    }
}

/// Resolves once the link of `removal` ([`PeerLink::removal`]) is removed, also when that
/// happened before the receiver subscribed.
pub(crate) async fn removed(removal: &mut watch::Receiver<bool>) {
    // Only fails when the link is gone, and with it everything that could wait here.
    let _ = removal.wait_for(|removed| *removed).await;
}

/// What a requester received from `peer`: an answer, a `Failure` (the peer could not serve the
/// request), or nothing because the connection dropped.
pub(crate) fn answer(
    peer: u64,
    received: Result<Reply, oneshot::error::RecvError>,
) -> Result<Reply, TransportError> {
    match received {
        Ok(reply) if reply.kind == MessageKind::Failure => {
            let reason = tenure_proto::decode_payload::<String>(&reply.payload, "failure")
                .unwrap_or_else(|error| format!("undecodable failure: {error}"));
            Err(TransportError::Remote { peer, reason })
        }
        Ok(reply) => Ok(reply),
        Err(_) => Err(TransportError::ConnectionLost { peer }),
    }
}

/// A request sent and waiting for its answer. Dropping it forgets the correlation id.
pub(crate) struct PendingReply {
    pub(crate) link: Arc<PeerLink>,
    pub(crate) correlation_id: u64,
    pub(crate) receiver: oneshot::Receiver<Reply>,
}

impl Drop for PendingReply {
    fn drop(&mut self) {
        self.link.pending.remove(&self.correlation_id);
    }
}

impl PendingReply {
    /// Waits for the answer until `deadline`.
    pub(crate) async fn wait(mut self, deadline: Instant) -> Result<Reply, TransportError> {
        let peer = self.link.peer;
        match tokio::time::timeout_at(deadline, &mut self.receiver).await {
            Ok(received) => answer(peer, received),
            Err(_) => Err(TransportError::Timeout {
                peer,
                timeout_ms: 0,
            }),
        }
    }

    /// Polls for the answer without a deadline (the caller bounds it).
    pub(crate) fn receiver(&mut self) -> &mut oneshot::Receiver<Reply> {
        &mut self.receiver
    }

    /// The peer this request went to.
    pub(crate) fn peer(&self) -> u64 {
        self.link.peer
    }
}

/// A hasher without a random seed (SipHash with fixed keys).
pub(crate) type FixedHasher =
    std::hash::BuildHasherDefault<std::collections::hash_map::DefaultHasher>;

/// State shared by every task of one node's transport.
pub(crate) struct Shared {
    pub(crate) config: TransportConfig,
    pub(crate) endpoint: quinn::Endpoint,
    pub(crate) client_config: quinn::ClientConfig,
    /// By peer id, ordered: tasks start, and shutdown fails waiters, in one order every run.
    /// Changed by `Transport::add_peer` / `remove_peer`; never locked across an await.
    pub(crate) links: RwLock<BTreeMap<u64, Arc<PeerLink>>>,
    /// The owner's check of peer certificates, if any (`Transport::set_peer_admission`).
    pub(crate) admission: RwLock<Option<Arc<dyn PeerAdmission>>>,
    /// The runtime the transport started on: links added later spawn their tasks there.
    pub(crate) runtime: tokio::runtime::Handle,
    pub(crate) registry: Arc<dyn GroupRegistry>,
    pub(crate) client_acceptor: Option<Arc<dyn ClientAcceptor>>,
    pub(crate) faults: Option<Arc<FaultInjector>>,
    pub(crate) stats: TransportStats,
    pub(crate) shutdown: watch::Sender<bool>,
    pub(crate) snapshot_permits: Semaphore,
    /// Paces the snapshots this node sends (`snapshot_send_bytes_per_s`).
    pub(crate) snapshot_pacer: crate::pacer::Pacer,
    pub(crate) handshake_permits: Arc<Semaphore>,
    pub(crate) next_stream_id: AtomicU64,
    pub(crate) rng: StdMutex<SmallRng>,
}

impl Shared {
    pub(crate) fn node_id(&self) -> u64 {
        self.config.node_id
    }

    pub(crate) fn link(&self, peer: u64) -> Result<Arc<PeerLink>, TransportError> {
        if *self.shutdown.borrow() {
            return Err(TransportError::Shutdown);
        }
        self.read_links()
            .get(&peer)
            .cloned()
            .ok_or(TransportError::UnknownPeer(peer))
    }

    /// The links (a poisoned lock is recovered: the map is valid after any panic in between).
    pub(crate) fn read_links(
        &self,
    ) -> std::sync::RwLockReadGuard<'_, BTreeMap<u64, Arc<PeerLink>>> {
        self.links.read().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn write_links(
        &self,
    ) -> std::sync::RwLockWriteGuard<'_, BTreeMap<u64, Arc<PeerLink>>> {
        self.links.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every link now, by peer id.
    pub(crate) fn all_links(&self) -> Vec<Arc<PeerLink>> {
        self.read_links().values().cloned().collect()
    }

    /// Whether `peer` is a member (has a link) now.
    pub(crate) fn is_member(&self, peer: u64) -> bool {
        self.read_links().contains_key(&peer)
    }

    /// The admission policy's verdict on the certificate `connection`'s peer presented, as node
    /// `peer`; `Ok` when no policy is set.
    pub(crate) fn admit(&self, peer: u64, connection: &quinn::Connection) -> Result<(), String> {
        let policy = self
            .admission
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let Some(policy) = policy else {
            return Ok(());
        };
        let Some(cert_sha256) = peer_certificate_sha256(connection.peer_identity()) else {
            return Err(format!("node {peer} presented no certificate to admit"));
        };
        policy
            .admit(peer, &cert_sha256)
            .map_err(|reason| format!("the certificate of node {peer} is not admitted: {reason}"))
    }

    pub(crate) fn next_stream_id(&self) -> u64 {
        self.next_stream_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Sends a request and returns the handle its answer arrives on.
    pub(crate) async fn start_request(
        &self,
        peer: u64,
        group_id: u32,
        kind: MessageKind,
        payload: Bytes,
        deadline: Instant,
    ) -> Result<PendingReply, TransportError> {
        let link = self.link(peer)?;
        link.connected(deadline).await?;
        let correlation_id = link.next_correlation_id();
        let (sender, receiver) = oneshot::channel();
        link.pending.insert(correlation_id, sender);
        let pending = PendingReply {
            link: link.clone(),
            correlation_id,
            receiver,
        };
        self.send(
            &link,
            Outbound {
                group_id,
                kind,
                correlation_id,
                payload,
            },
            deadline,
        )
        .await?;
        Ok(pending)
    }

    /// Sends one request and waits for its answer.
    pub(crate) async fn request(
        &self,
        peer: u64,
        group_id: u32,
        kind: MessageKind,
        payload: Bytes,
        timeout: Duration,
    ) -> Result<Reply, TransportError> {
        let deadline = Instant::now() + timeout;
        let pending = self
            .start_request(peer, group_id, kind, payload, deadline)
            .await?;
        pending.wait(deadline).await.map_err(|error| match error {
            TransportError::Timeout { peer, .. } => TransportError::Timeout {
                peer,
                timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
            },
            other => other,
        })
    }

    /// Queues one message for `link`, through the fault layer, waiting for queue space until
    /// `deadline` (backpressure).
    pub(crate) async fn send(
        &self,
        link: &Arc<PeerLink>,
        message: Outbound,
        deadline: Instant,
    ) -> Result<(), TransportError> {
        let bytes = MESSAGE_HEADER_BYTES + message.payload.len() + FRAME_LENGTH_BYTES + 5;
        if bytes > self.config.frame_bytes_max {
            return Err(TransportError::MessageTooLarge {
                bytes,
                max: self.config.frame_bytes_max,
            });
        }
        let verdict = match &self.faults {
            Some(faults) => faults.judge(self.node_id(), link.peer),
            None => Verdict::Deliver,
        };
        let verdict = match verdict {
            // A replication stream's messages ride one QUIC stream: in order, exactly once.
            // Duplicating or reordering them would model a network QUIC cannot be, and the
            // receiver relies on stream order (a reordered stream fed to openraft can make it
            // see a conflict below an index it already matched, which it treats as a bug).
            // Drops stay: they end the stream with an error on its oldest request.
            Verdict::Perturb { .. } if !is_control(message.kind) => Verdict::Deliver,
            other => other,
        };
        match verdict {
            Verdict::Deliver => enqueue(link, message, deadline).await,
            Verdict::Drop => {
                add(&self.stats.fault_dropped, 1);
                Ok(())
            }
            Verdict::Perturb { copies, delay } => {
                add(&self.stats.fault_delayed, u64::from(!delay.is_zero()));
                add(&self.stats.fault_duplicated, u64::from(copies > 1));
                let link = link.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    let deadline = Instant::now() + Duration::from_secs(1);
                    for _ in 0..copies {
                        if enqueue(&link, message.clone(), deadline).await.is_err() {
                            break;
                        }
                    }
                });
                Ok(())
            }
        }
    }

    /// Whether the fault layer lets a new stream (snapshot) to `peer` through.
    pub(crate) fn stream_allowed(&self, peer: u64) -> bool {
        match &self.faults {
            Some(faults) => !faults.link(self.node_id(), peer).partitioned,
            None => true,
        }
    }

    pub(crate) fn jitter(&self, base: Duration) -> Duration {
        let mut rng = match self.rng.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        let millis = u64::try_from(base.as_millis()).unwrap_or(u64::MAX).max(1);
        Duration::from_millis(millis / 2 + rng.random_range(0..=millis / 2))
    }

    pub(crate) fn protocol_error(&self, connection: &quinn::Connection, peer: u64, reason: &str) {
        add(&self.stats.protocol_errors, 1);
        warn!(
            node = self.node_id(),
            peer,
            remote = %connection.remote_address(),
            "closing peer connection: protocol error: {reason}"
        );
        close_connection(connection, CLOSE_PROTOCOL_ERROR, reason);
    }
}

/// Longest close reason sent to a peer, in bytes (a close frame must fit a packet).
const CLOSE_REASON_BYTES_MAX: usize = 200;

/// Closes `connection` with application close `code` and `reason` (cut to
/// `CLOSE_REASON_BYTES_MAX`).
pub(crate) fn close_connection(connection: &quinn::Connection, code: u32, reason: &str) {
    let reason = reason.as_bytes();
    connection.close(
        VarInt::from_u32(code),
        &reason[..reason.len().min(CLOSE_REASON_BYTES_MAX)],
    );
}

pub(crate) async fn enqueue(
    link: &Arc<PeerLink>,
    message: Outbound,
    deadline: Instant,
) -> Result<(), TransportError> {
    let peer = link.peer;
    let lane = link.lane_of(message.group_id, message.kind);
    match tokio::time::timeout_at(deadline, lane.send(message)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(_)) => Err(TransportError::Shutdown),
        Err(_) => Err(TransportError::Timeout {
            peer,
            timeout_ms: 0,
        }),
    }
}

/// Reads one frame; `Ok(None)` is a clean end of stream at a frame boundary.
pub(crate) async fn read_frame(
    recv: &mut quinn::RecvStream,
    frame_bytes_max: usize,
) -> Result<Option<Frame>, FrameReadError> {
    let mut prefix = [0u8; FRAME_LENGTH_BYTES];
    match recv.read_exact(&mut prefix).await {
        Ok(()) => {}
        Err(quinn::ReadExactError::FinishedEarly(0)) => return Ok(None),
        Err(quinn::ReadExactError::FinishedEarly(_)) => {
            return Err(FrameReadError::Protocol("truncated frame length".into()));
        }
        Err(quinn::ReadExactError::ReadError(error)) => {
            return Err(FrameReadError::Stream(error.to_string()));
        }
    }
    let length = decode_frame_length(prefix, frame_bytes_max)
        .map_err(|error| FrameReadError::Protocol(error.to_string()))?;
    let mut body = vec![0u8; length];
    match recv.read_exact(&mut body).await {
        Ok(()) => {}
        Err(quinn::ReadExactError::FinishedEarly(read)) => {
            return Err(FrameReadError::Protocol(format!(
                "truncated frame: {read} of {length} body bytes"
            )));
        }
        Err(quinn::ReadExactError::ReadError(error)) => {
            return Err(FrameReadError::Stream(error.to_string()));
        }
    }
    decode_frame_body(Bytes::from(body))
        .map(Some)
        .map_err(|error: ProtoError| FrameReadError::Protocol(error.to_string()))
}

/// Why reading a frame failed.
#[derive(Debug)]
pub(crate) enum FrameReadError {
    /// The bytes are not the peer protocol: close the connection.
    Protocol(String),
    /// The stream or connection failed.
    Stream(String),
}

pub(crate) async fn write_frame(
    send: &mut quinn::SendStream,
    frame: &Frame,
) -> Result<(), quinn::WriteError> {
    let mut buffer = BytesMut::new();
    encode_frame(frame, &mut buffer);
    send.write_all(&buffer).await
}

// ---------------------------------------------------------------------------------------------
// Connection lifecycle
// ---------------------------------------------------------------------------------------------
