//! The node's QUIC endpoint and its peer links.
//!
//! One [`Transport`] per node binds one quinn endpoint. For every other member of the cluster it
//! keeps a [`PeerLink`](crate::link::PeerLink): exactly one live QUIC connection (whichever side dialled it; when both
//! dial at once the pair keeps the connection dialled by the lower node id and closes the other),
//! `lanes_per_peer` bounded outbound queues, each drained by a lane writer onto its own long-lived
//! unidirectional stream, and the table of requests waiting for an answer.
//!
//! A lane writer takes everything queued on its lane up to `batch_bytes_max` (when the queue ran
//! dry and its linger is under a millisecond, after one more pass of the scheduler; with a longer
//! linger, such as the control lane's `control_linger_us`, after sleeping until it ends) and
//! writes it as one batch frame: under load many
//! Raft messages share a frame and a syscall, and every heartbeat due to one peer at a driver tick
//! leaves in one frame. Readers decode frames from the peer's lanes and hand each message to
//! `inbound` (requests) or to the waiting requester (responses).
//!
//! Peers come and go at runtime: [`Transport::add_peer`] creates a link and its task (or points
//! an existing one at a new address, dropping its connection so it redials there),
//! [`Transport::remove_peer`] closes the link's connection, fails its waiting requests and stops
//! its tasks; from then on requests to that node fail as `UnknownPeer` and its `Hello` is refused
//! as not a member. An owner's [`PeerAdmission`] policy ([`Transport::set_peer_admission`]) can
//! refuse certificates that still chain to the CA (revoked ones): checked when accepting a
//! `Hello`, right after dialling, and when a connection is put to use;
//! [`Transport::close_peer_connection`] drops a live connection whose certificate it just
//! revoked.
//!
//! Must not depend on: the lease state machine's semantics, RocksDB, configuration files, or the
//! wall clock in any decision (timeouts use tokio's monotonic clock).

use std::net::SocketAddr;
use std::sync::Mutex as StdMutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use bytes::BytesMut;
use quinn::VarInt;
use rand::SeedableRng;
use rand::rngs::{SmallRng, StdRng};
use tenure_proto::client::CLIENT_ALPN;
use tenure_proto::peer::BatchEncoder;
use tenure_proto::{Frame, Hello, HelloReply, PEER_PROTOCOL_VERSION};
use tokio::sync::{Mutex as AsyncMutex, Semaphore, mpsc, watch};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::config::TransportConfig;
use crate::connection_ids::SignedConnectionIds;
use crate::error::TransportError;
use crate::fault::FaultInjector;
use crate::inbound;
use crate::link::{
    CLOSE_DROPPED, CLOSE_DUPLICATE, CLOSE_REFUSED, CLOSE_REMOVED, CLOSE_SHUTDOWN,
    CONTROL_FRAME_BYTES_MAX, FrameReadError, Offer, Outbound, PeerLink, REMOVED_REASON, Shared,
    close_connection, read_frame, removed, write_frame,
};
use crate::registry::{ClientAcceptor, GroupRegistry};
use crate::stats::{TransportStats, TransportStatsSnapshot, add};
use crate::tls::{NodeTls, PeerAdmission, node_server_name, verify_peer_node_id};

/// One node's peer transport. Cheap to clone.
#[derive(Clone)]
pub struct Transport {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transport")
            .field("node_id", &self.shared.config.node_id)
            .field("local_addr", &self.local_addr().ok())
            .finish()
    }
}

/// Bidirectional streams a peer may open: snapshot transfers both ways and the handshake.
fn peer_bidi_streams(config: &TransportConfig) -> u32 {
    u32::try_from(config.snapshot_receives_max).unwrap_or(16) * 2 + 8
}

/// Unidirectional streams a peer may open: its lanes, twice over (a reconnect overlaps).
fn peer_uni_streams(config: &TransportConfig) -> u32 {
    u32::try_from(config.lanes_per_peer)
        .unwrap_or(64)
        .saturating_mul(2)
        + 8
}

/// Receive window of a peer connection (all streams), in bytes.
const PEER_RECEIVE_WINDOW_BYTES: u32 = 64 * 1024 * 1024;
/// Receive window of one stream of a connection this node dials, in bytes.
const PEER_STREAM_RECEIVE_WINDOW_BYTES: u32 = 16 * 1024 * 1024;
/// Send window of a peer connection, in bytes.
const PEER_SEND_WINDOW_BYTES: u64 = 64 * 1024 * 1024;

fn common_transport_config(config: &TransportConfig) -> quinn::TransportConfig {
    let mut transport = quinn::TransportConfig::default();
    transport.keep_alive_interval(Some(Duration::from_millis(config.keep_alive_ms)));
    if let Ok(idle) =
        quinn::IdleTimeout::try_from(Duration::from_millis(config.idle_timeout_ms.max(1)))
    {
        transport.max_idle_timeout(Some(idle));
    }
    transport
}

/// The limits of connections this node dials (to peers): the peer grade.
fn quinn_transport_config(config: &TransportConfig) -> Arc<quinn::TransportConfig> {
    let mut transport = common_transport_config(config);
    transport.max_concurrent_uni_streams(VarInt::from_u32(peer_uni_streams(config)));
    transport.max_concurrent_bidi_streams(VarInt::from_u32(peer_bidi_streams(config)));
    transport.stream_receive_window(VarInt::from_u32(PEER_STREAM_RECEIVE_WINDOW_BYTES));
    transport.receive_window(VarInt::from_u32(PEER_RECEIVE_WINDOW_BYTES));
    transport.send_window(PEER_SEND_WINDOW_BYTES);
    Arc::new(transport)
}

/// The limits every accepted connection starts with: a client's ([`ClientQuicLimits`]); a
/// connection that proves to be a peer gets [`grant_peer_limits`].
fn quinn_server_transport_config(config: &TransportConfig) -> Arc<quinn::TransportConfig> {
    let limits = &config.client_quic;
    let mut transport = common_transport_config(config);
    transport.max_concurrent_uni_streams(VarInt::from_u32(limits.uni_streams_max));
    transport.max_concurrent_bidi_streams(VarInt::from_u32(limits.bidi_streams_max.max(1)));
    transport.stream_receive_window(VarInt::from_u32(limits.stream_receive_window_bytes));
    transport.receive_window(VarInt::from_u32(limits.receive_window_bytes));
    transport.send_window(limits.send_window_bytes);
    Arc::new(transport)
}

/// Raises an accepted connection's QUIC limits to the peer grade (streams, connection windows),
/// once it proved to be a cluster node: the peer handshake does it for peer connections, the
/// client protocol for a forwarding node's connection.
pub fn grant_peer_limits(connection: &quinn::Connection, config: &TransportConfig) {
    connection.set_max_concurrent_uni_streams(VarInt::from_u32(peer_uni_streams(config)));
    connection.set_max_concurrent_bi_streams(VarInt::from_u32(peer_bidi_streams(config).max(64)));
    connection.set_receive_window(VarInt::from_u32(PEER_RECEIVE_WINDOW_BYTES));
    connection.set_send_window(PEER_SEND_WINDOW_BYTES);
}

/// Binds a node's QUIC endpoint at `addr`, without a server configuration (the transport
/// installs it), its stateless resets keyed by [`NodeTls::stateless_reset_key`] and its
/// connection ids tagged under [`NodeTls::connection_id_key`] ([`SignedConnectionIds`]), both
/// stable across restarts: a restarted node resets the connections peers and clients still hold
/// to its previous incarnation as soon as a packet arrives on one. A reset is always smaller than
/// the packet that prompts it (no amplification), so the endpoint may send one every
/// [`RESET_INTERVAL_MIN`] rather than quinn's 20 ms: a node that restarts under a thousand clients
/// resets their connections within about a second.
pub fn bind_endpoint(addr: SocketAddr, tls: &NodeTls) -> Result<quinn::Endpoint, TransportError> {
    let bind_error =
        |e: std::io::Error| TransportError::io(format!("binding the peer endpoint {addr}"), e);
    let socket = std::net::UdpSocket::bind(addr).map_err(bind_error)?;
    let mut config = quinn::EndpointConfig::new(Arc::new(tls.stateless_reset_key()));
    let connection_id_key = tls.connection_id_key();
    let seeds = StdMutex::new(StdRng::try_from_os_rng().map_err(|error| {
        TransportError::io(
            format!("seeding the connection ids of {addr}"),
            std::io::Error::other(error.to_string()),
        )
    })?);
    config.cid_generator(move || {
        let rng = StdRng::from_rng(&mut *seeds.lock().unwrap_or_else(PoisonError::into_inner));
        Box::new(SignedConnectionIds::new(connection_id_key.clone(), rng))
    });
    config.min_reset_interval(RESET_INTERVAL_MIN);
    quinn::Endpoint::new(config, None, socket, Arc::new(quinn::TokioRuntime)).map_err(bind_error)
}

/// Shortest time between two stateless resets of a node's endpoint (see [`bind_endpoint`]).
pub const RESET_INTERVAL_MIN: Duration = Duration::from_millis(1);

impl Transport {
    /// Binds the endpoint, starts accepting peers and dialling the configured ones
    /// (`config.peers`, the members at start; [`Transport::add_peer`] and
    /// [`Transport::remove_peer`] change them later).
    ///
    /// `registry` finds the local replica of a group for incoming requests; `faults`, when given,
    /// judges every message this node sends (tests).
    pub fn start(
        config: TransportConfig,
        tls: &NodeTls,
        registry: Arc<dyn GroupRegistry>,
        faults: Option<Arc<FaultInjector>>,
    ) -> Result<Self, TransportError> {
        Self::start_with_clients(config, tls, registry, faults, None)
    }

    /// Like [`Transport::start`], and when `client_acceptor` is given the endpoint also accepts
    /// the client protocol (`tenure_proto::client::CLIENT_ALPN`, client certificate optional) and
    /// hands those connections to it. Peer connections still need a node certificate (checked in
    /// the handshake).
    pub fn start_with_clients(
        config: TransportConfig,
        tls: &NodeTls,
        registry: Arc<dyn GroupRegistry>,
        faults: Option<Arc<FaultInjector>>,
        client_acceptor: Option<Arc<dyn ClientAcceptor>>,
    ) -> Result<Self, TransportError> {
        let endpoint = bind_endpoint(config.listen_addr, tls)?;
        Self::start_on_endpoint(endpoint, config, tls, registry, faults, client_acceptor)
    }

    /// Like [`Transport::start_with_clients`] on an endpoint the caller made (over an abstract
    /// socket, say: a deterministic simulation's); the transport installs its server
    /// configuration on it. Must run inside a tokio runtime.
    pub fn start_on_endpoint(
        endpoint: quinn::Endpoint,
        config: TransportConfig,
        tls: &NodeTls,
        registry: Arc<dyn GroupRegistry>,
        faults: Option<Arc<FaultInjector>>,
        client_acceptor: Option<Arc<dyn ClientAcceptor>>,
    ) -> Result<Self, TransportError> {
        let server_config = tls.quinn_server_config_for(
            quinn_server_transport_config(&config),
            client_acceptor.is_some(),
        )?;
        endpoint.set_server_config(Some(server_config));
        let client_config = tls.quinn_client_config(quinn_transport_config(&config))?;
        let links = config
            .peers
            .iter()
            .filter(|(id, _)| **id != config.node_id)
            .map(|(&id, &addr)| (id, Arc::new(PeerLink::new(id, addr, &config))))
            .collect();
        let runtime = tokio::runtime::Handle::try_current().map_err(|error| {
            TransportError::io(
                "starting the transport outside a tokio runtime",
                std::io::Error::other(error),
            )
        })?;
        let snapshot_permits = Semaphore::new(config.snapshot_receives_max.max(1));
        let handshake_permits = Arc::new(Semaphore::new(config.handshakes_inflight_max.max(1)));
        let rng = StdMutex::new(SmallRng::seed_from_u64(config.seed));
        let snapshot_pacer = crate::pacer::Pacer::new(config.snapshot_send_bytes_per_s);
        let shared = Arc::new(Shared {
            config,
            endpoint,
            client_config,
            links: RwLock::new(links),
            admission: RwLock::new(None),
            runtime,
            registry,
            client_acceptor,
            faults,
            stats: TransportStats::default(),
            shutdown: watch::Sender::new(false),
            snapshot_permits,
            snapshot_pacer,
            handshake_permits,
            next_stream_id: AtomicU64::new(1),
            rng,
        });
        shared.runtime.spawn(accept_loop(shared.clone()));
        for link in shared.all_links() {
            shared.runtime.spawn(run_link(shared.clone(), link));
        }
        Ok(Self { shared })
    }

    /// This node's id.
    pub fn node_id(&self) -> u64 {
        self.shared.config.node_id
    }

    /// The node's QUIC endpoint (for dialling other nodes' client protocol).
    pub fn endpoint(&self) -> quinn::Endpoint {
        self.shared.endpoint.clone()
    }

    /// The bound UDP address.
    pub fn local_addr(&self) -> Result<SocketAddr, TransportError> {
        self.shared
            .endpoint
            .local_addr()
            .map_err(|e| TransportError::io("reading the endpoint address", e))
    }

    /// The transport's counters.
    pub fn stats(&self) -> TransportStatsSnapshot {
        self.shared.stats.snapshot()
    }

    /// The settings it runs with.
    pub fn config(&self) -> &TransportConfig {
        &self.shared.config
    }

    /// Whether a connection to `peer` is up right now.
    pub fn is_connected(&self, peer: u64) -> bool {
        self.shared
            .read_links()
            .get(&peer)
            .is_some_and(|link| link.current_connection().is_some())
    }

    /// The peers now (every member but this node), by id, with the address dials go to.
    pub fn peers(&self) -> Vec<(u64, SocketAddr)> {
        self.shared
            .read_links()
            .iter()
            .map(|(&peer, link)| (peer, link.addr()))
            .collect()
    }

    /// Makes `peer` a member reached at `addr`, without a restart. A new peer gets its link and
    /// its task (it dials, and its connections are accepted); a known peer at the same address
    /// is left alone; a known peer at another address is dialled there from now on, and its
    /// current connection is closed so that the link reconnects. This node's own id, and any call
    /// after [`Transport::shutdown`], are ignored.
    pub fn add_peer(&self, peer: u64, addr: SocketAddr) {
        let shared = &self.shared;
        let me = shared.node_id();
        if peer == me || *shared.shutdown.borrow() {
            return;
        }
        let mut links = shared.write_links();
        if let Some(link) = links.get(&peer).cloned() {
            drop(links);
            if link.set_addr(addr) {
                info!(node = me, peer, %addr, "peer address changed");
                link.close_connection(CLOSE_DROPPED, "peer address changed");
            }
            return;
        }
        let link = Arc::new(PeerLink::new(peer, addr, &shared.config));
        links.insert(peer, link.clone());
        drop(links);
        info!(node = me, peer, %addr, "peer added");
        shared.runtime.spawn(run_link(shared.clone(), link));
    }

    /// Takes `peer` out of the cluster, without a restart: closes its connection (code
    /// [`CLOSE_REMOVED`](crate::CLOSE_REMOVED)), fails the requests waiting for it and stops its
    /// tasks. Afterwards requests to it fail with `UnknownPeer` and its connections are refused
    /// as not a member, until [`Transport::add_peer`] adds it again. Unknown peers are ignored.
    pub fn remove_peer(&self, peer: u64) {
        let Some(link) = self.shared.write_links().remove(&peer) else {
            return;
        };
        link.mark_removed();
        link.close_connection(CLOSE_REMOVED, REMOVED_REASON);
        link.fail_pending();
        info!(node = self.node_id(), peer, "peer removed");
    }

    /// Installs the owner's check of peer certificates (replacing any before): from now on every
    /// peer connection, accepted or dialled, is refused unless `policy` admits the certificate
    /// the peer presented. Connections already up stay; drop the ones the new policy refuses
    /// with [`Transport::close_peer_connection`].
    pub fn set_peer_admission(&self, policy: Arc<dyn PeerAdmission>) {
        *self
            .shared
            .admission
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Some(policy);
    }

    /// Closes the current connection to `peer`, if any (code
    /// [`CLOSE_DROPPED`](crate::CLOSE_DROPPED), with `reason`), keeping the peer a member: the
    /// link reconnects, through the admission policy. For a peer whose certificate was just
    /// revoked.
    pub fn close_peer_connection(&self, peer: u64, reason: &str) {
        if let Ok(link) = self.shared.link(peer) {
            info!(
                node = self.node_id(),
                peer, "closing the peer connection: {reason}"
            );
            link.close_connection(CLOSE_DROPPED, reason);
        }
    }

    /// Closes every connection and stops every task; later requests fail with `Shutdown`.
    pub async fn shutdown(&self) {
        self.shared.shutdown.send_replace(true);
        self.shared
            .endpoint
            .close(VarInt::from_u32(CLOSE_SHUTDOWN), b"shutdown");
        for link in self.shared.all_links() {
            link.fail_pending();
        }
        let _ =
            tokio::time::timeout(Duration::from_secs(2), self.shared.endpoint.wait_idle()).await;
    }
}

async fn accept_loop(shared: Arc<Shared>) {
    while let Some(incoming) = shared.endpoint.accept().await {
        // Handshakes in progress are bounded: each holds TLS state until it completes or times
        // out, and anyone who can reach the port may start one.
        let Ok(permit) = shared.handshake_permits.clone().try_acquire_owned() else {
            add(&shared.stats.connections_refused, 1);
            debug!(
                node = shared.node_id(),
                remote = %incoming.remote_address(),
                "refused a connection attempt: too many handshakes in progress"
            );
            incoming.refuse();
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            handshake_incoming(shared, incoming).await;
            drop(permit);
        });
    }
}

async fn handshake_incoming(shared: Arc<Shared>, incoming: quinn::Incoming) {
    let remote = incoming.remote_address();
    let timeout = shared.config.connect_timeout();
    let connection = match tokio::time::timeout(timeout, incoming).await {
        Ok(Ok(connection)) => connection,
        Ok(Err(error @ quinn::ConnectionError::ApplicationClosed(_))) => {
            // The dialer closed it on purpose (it went away, or shut down).
            add(&shared.stats.handshakes_abandoned, 1);
            debug!(node = shared.node_id(), %remote, "peer abandoned the handshake: {error}");
            return;
        }
        Ok(Err(error)) => {
            // TLS refusals (no certificate, a foreign CA) end here.
            add(&shared.stats.connections_refused, 1);
            warn!(node = shared.node_id(), %remote, "refused peer connection: handshake failed: {error}");
            return;
        }
        Err(_) => {
            add(&shared.stats.connections_refused, 1);
            warn!(node = shared.node_id(), %remote, "refused peer connection: TLS handshake timed out");
            return;
        }
    };
    if let Some(acceptor) = &shared.client_acceptor {
        let protocol = connection
            .handshake_data()
            .and_then(|data| data.downcast::<quinn::crypto::rustls::HandshakeData>().ok())
            .and_then(|data| data.protocol);
        if protocol.as_deref() == Some(CLIENT_ALPN) {
            acceptor.accept(connection);
            return;
        }
    }
    let hello = async {
        let (send, mut recv) = connection.accept_bi().await.map_err(|e| e.to_string())?;
        match read_frame(&mut recv, CONTROL_FRAME_BYTES_MAX).await {
            Ok(Some(Frame::Hello(hello))) => Ok((send, hello)),
            Ok(Some(_)) => Err("first frame is not a Hello".to_string()),
            Ok(None) => Err("stream ended before the Hello".to_string()),
            Err(FrameReadError::Protocol(reason) | FrameReadError::Stream(reason)) => {
                Err(format!("malformed Hello: {reason}"))
            }
        }
    };
    let (mut send, hello) = match tokio::time::timeout(timeout, hello).await {
        Ok(Ok(pair)) => pair,
        Ok(Err(reason)) => {
            refuse(&shared, &connection, None, &reason).await;
            return;
        }
        Err(_) => {
            refuse(
                &shared,
                &connection,
                None,
                "no Hello within the handshake timeout",
            )
            .await;
            return;
        }
    };
    if let Err(reason) = check_hello(&shared, &connection, &hello) {
        refuse(&shared, &connection, Some(&mut send), &reason).await;
        return;
    }
    // A proven peer: its lanes and snapshots need the peer limits (before the reply, so its
    // lanes find room when they open).
    grant_peer_limits(&connection, &shared.config);
    let reply = Frame::HelloReply(HelloReply {
        accepted: true,
        version: PEER_PROTOCOL_VERSION,
        reason: String::new(),
    });
    if write_frame(&mut send, &reply).await.is_err() {
        return;
    }
    let _ = send.finish();
    let Ok(link) = shared.link(hello.from_node) else {
        // Removed (or shut down) since the check.
        close_connection(&connection, CLOSE_REMOVED, REMOVED_REASON);
        return;
    };
    let offer = Offer {
        connection,
        dialed_by: hello.from_node,
    };
    if let Err(refused) = link.offers.send(offer).await {
        // The link's task stopped: it was removed.
        close_connection(&refused.0.connection, CLOSE_REMOVED, REMOVED_REASON);
    }
}

fn check_hello(
    shared: &Shared,
    connection: &quinn::Connection,
    hello: &Hello,
) -> Result<(), String> {
    hello.check_version().map_err(|error| error.to_string())?;
    if hello.cluster != shared.config.cluster_name {
        return Err(format!(
            "cluster {:?} is not this node's cluster {:?}",
            hello.cluster, shared.config.cluster_name
        ));
    }
    if hello.to_node != shared.node_id() {
        return Err(format!(
            "dialled node {} but this is node {}",
            hello.to_node,
            shared.node_id()
        ));
    }
    if !shared.is_member(hello.from_node) {
        return Err(format!(
            "node {} is not a member of this cluster",
            hello.from_node
        ));
    }
    verify_peer_node_id(connection.peer_identity(), hello.from_node).map_err(|error| {
        format!(
            "certificate does not prove node {}: {error}",
            hello.from_node
        )
    })?;
    shared.admit(hello.from_node, connection)
}

async fn refuse(
    shared: &Shared,
    connection: &quinn::Connection,
    send: Option<&mut quinn::SendStream>,
    reason: &str,
) {
    add(&shared.stats.connections_refused, 1);
    warn!(
        node = shared.node_id(),
        remote = %connection.remote_address(),
        "refused peer connection: {reason}"
    );
    if let Some(send) = send {
        let reply = Frame::HelloReply(HelloReply {
            accepted: false,
            version: PEER_PROTOCOL_VERSION,
            reason: reason.to_string(),
        });
        if write_frame(send, &reply).await.is_ok() {
            let _ = send.finish();
            // Give the reply a moment to leave before the close frame overtakes it.
            let _ = tokio::time::timeout(Duration::from_millis(200), send.stopped()).await;
        }
    }
    close_connection(connection, CLOSE_REFUSED, reason);
}

async fn dial(shared: &Shared, link: &PeerLink) -> Result<(quinn::Connection, u64), String> {
    let server_name = node_server_name(link.peer);
    let addr = link.addr();
    let connecting = shared
        .endpoint
        .connect_with(shared.client_config.clone(), addr, &server_name)
        .map_err(|e| format!("cannot dial {addr}: {e}"))?;
    let attempt = async {
        let connection = connecting.await.map_err(|e| e.to_string())?;
        // Keep no connection to a peer whose certificate the owner refuses, nor one to an
        // address the peer no longer has.
        if let Err(reason) = shared.admit(link.peer, &connection) {
            warn!(
                node = shared.node_id(),
                peer = link.peer,
                remote = %addr,
                "refused the dialled peer: {reason}"
            );
            close_connection(&connection, CLOSE_REFUSED, &reason);
            return Err(reason);
        }
        if link.addr() != addr {
            close_connection(&connection, CLOSE_DROPPED, "peer address changed");
            return Err(format!(
                "the peer's address changed from {addr} during the dial"
            ));
        }
        let (mut send, mut recv) = connection.open_bi().await.map_err(|e| e.to_string())?;
        let hello = Frame::Hello(Hello {
            version: PEER_PROTOCOL_VERSION,
            from_node: shared.node_id(),
            to_node: link.peer,
            cluster: shared.config.cluster_name.clone(),
        });
        write_frame(&mut send, &hello)
            .await
            .map_err(|e| e.to_string())?;
        let _ = send.finish();
        match read_frame(&mut recv, CONTROL_FRAME_BYTES_MAX).await {
            Ok(Some(Frame::HelloReply(reply))) if reply.accepted => {
                if reply.version == PEER_PROTOCOL_VERSION {
                    Ok((connection, shared.node_id()))
                } else {
                    Err(format!("peer answered with version {}", reply.version))
                }
            }
            Ok(Some(Frame::HelloReply(reply))) => Err(format!("refused: {}", reply.reason)),
            Ok(_) => Err("no HelloReply".to_string()),
            Err(FrameReadError::Protocol(reason) | FrameReadError::Stream(reason)) => {
                Err(format!("handshake failed: {reason}"))
            }
        }
    };
    match tokio::time::timeout(shared.config.connect_timeout(), attempt).await {
        Ok(result) => result,
        Err(_) => Err("connect timed out".to_string()),
    }
}

async fn run_link(shared: Arc<Shared>, link: Arc<PeerLink>) {
    let Some(mut offers) = link
        .offers_receiver
        .lock()
        .ok()
        .and_then(|mut slot| slot.take())
    else {
        return;
    };
    let mut shutdown = shared.shutdown.subscribe();
    let mut removal = link.removal();
    let me = shared.node_id();
    let preferred_dialer = me.min(link.peer);
    let grace = Duration::from_millis(shared.config.higher_id_dial_grace_ms);
    let backoff_min = Duration::from_millis(shared.config.reconnect_backoff_min_ms.max(1));
    let backoff_max = Duration::from_millis(shared.config.reconnect_backoff_max_ms.max(1));
    let mut backoff = backoff_min;
    let mut dial_delay = if me == preferred_dialer {
        Duration::ZERO
    } else {
        grace
    };
    let mut next_offer: Option<Offer> = None;
    loop {
        if *shutdown.borrow() || link.is_removed() {
            break;
        }
        let offer = match next_offer.take() {
            Some(offer) => offer,
            None => {
                let sleep = tokio::time::sleep(dial_delay);
                tokio::select! {
                    _ = shutdown.changed() => break,
                    () = removed(&mut removal) => break,
                    offer = offers.recv() => match offer {
                        Some(offer) => offer,
                        None => break,
                    },
                    () = sleep => {
                        // The dial runs to completion (bounded by the connect timeout) even if
                        // the peer's own connection arrives meanwhile: abandoning a dial half way
                        // could leave the peer holding a connection this side dropped. Offers that
                        // arrive meanwhile are resolved by `run_connection`.
                        match dial(&shared, &link).await {
                            Ok((connection, dialed_by)) => Offer { connection, dialed_by },
                            Err(reason) => {
                                add(&shared.stats.dial_failures, 1);
                                link.dial_failing.store(true, Ordering::Relaxed);
                                link.fail_pending();
                                debug!(node = me, peer = link.peer, "dial failed: {reason}");
                                dial_delay = shared.jitter(backoff);
                                backoff = (backoff * 2).min(backoff_max);
                                continue;
                            }
                        }
                    }
                }
            }
        };
        if link.is_removed() {
            // Removed while the dial ran.
            close_connection(&offer.connection, CLOSE_REMOVED, REMOVED_REASON);
            break;
        }
        link.dial_failing.store(false, Ordering::Relaxed);
        backoff = backoff_min;
        next_offer = run_connection(&shared, &link, offer, &mut offers, &mut shutdown).await;
        dial_delay = if me == preferred_dialer {
            shared.jitter(backoff_min)
        } else {
            grace
        };
    }
    link.connection.send_replace(None);
    link.fail_pending();
}

/// Serves one connection until it closes, the link is removed, or a preferred one replaces it
/// (returned).
async fn run_connection(
    shared: &Arc<Shared>,
    link: &Arc<PeerLink>,
    offer: Offer,
    offers: &mut mpsc::Receiver<Offer>,
    shutdown: &mut watch::Receiver<bool>,
) -> Option<Offer> {
    let me = shared.node_id();
    let preferred_dialer = me.min(link.peer);
    let Offer {
        connection,
        dialed_by,
    } = offer;
    // Checked at the handshake already; again here, for a connection admitted just before the
    // owner revoked its certificate and waiting in the offer queue since.
    if let Err(reason) = shared.admit(link.peer, &connection) {
        warn!(
            node = me,
            peer = link.peer,
            "dropping a peer connection: {reason}"
        );
        close_connection(&connection, CLOSE_REFUSED, &reason);
        return None;
    }
    add(&shared.stats.connections_established, 1);
    info!(
        node = me,
        peer = link.peer,
        dialed_by,
        remote = %connection.remote_address(),
        "peer connection up"
    );
    let (stop_sender, stop) = watch::channel(false);
    let mut writers = Vec::with_capacity(link.lane_receivers.len());
    for (index, receiver) in link.lane_receivers.iter().enumerate() {
        let linger = if index == 0 {
            Duration::from_micros(shared.config.control_linger_us)
        } else {
            Duration::from_micros(shared.config.linger_us)
        };
        writers.push(tokio::spawn(lane_writer(
            shared.clone(),
            link.peer,
            connection.clone(),
            receiver.clone(),
            linger,
            stop.clone(),
        )));
    }
    let acceptor = tokio::spawn(inbound::accept_streams(
        shared.clone(),
        link.clone(),
        connection.clone(),
    ));
    link.connection.send_replace(Some(connection.clone()));
    let mut removal = link.removal();
    let replacement = loop {
        tokio::select! {
            reason = connection.closed() => {
                info!(node = me, peer = link.peer, "peer connection closed: {reason}");
                break None;
            }
            _ = shutdown.changed() => {
                connection.close(VarInt::from_u32(CLOSE_SHUTDOWN), b"shutdown");
                break None;
            }
            () = removed(&mut removal) => {
                close_connection(&connection, CLOSE_REMOVED, REMOVED_REASON);
                break None;
            }
            offer = offers.recv() => match offer {
                None => break None,
                Some(offer) => {
                    add(&shared.stats.connections_deduplicated, 1);
                    if dialed_by == preferred_dialer || offer.dialed_by != preferred_dialer {
                        debug!(node = me, peer = link.peer, "closing a duplicate connection");
                        offer.connection.close(VarInt::from_u32(CLOSE_DUPLICATE), b"duplicate connection");
                    } else {
                        debug!(node = me, peer = link.peer, "switching to the preferred connection");
                        connection.close(VarInt::from_u32(CLOSE_DUPLICATE), b"duplicate connection");
                        break Some(offer);
                    }
                }
            },
        }
    };
    link.connection.send_replace(None);
    stop_sender.send_replace(true);
    acceptor.abort();
    for writer in writers {
        let _ = writer.await;
    }
    link.fail_pending();
    if replacement.is_none() {
        // Requests queued for a dead connection would only be answered into the void.
        for receiver in &link.lane_receivers {
            let mut receiver = receiver.lock().await;
            while receiver.try_recv().is_ok() {}
        }
    }
    replacement
}

async fn lane_writer(
    shared: Arc<Shared>,
    peer: u64,
    connection: quinn::Connection,
    receiver: Arc<AsyncMutex<mpsc::Receiver<Outbound>>>,
    linger: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut receiver = receiver.lock().await;
    let mut send = tokio::select! {
        opened = connection.open_uni() => match opened {
            Ok(send) => send,
            Err(error) => {
                debug!(node = shared.node_id(), peer, "cannot open a lane: {error}");
                return;
            }
        },
        _ = stop.changed() => return,
    };
    let batch_bytes_max = shared.config.batch_bytes_max.max(1);
    let mut buffer = BytesMut::with_capacity(batch_bytes_max + 64 * 1024);
    loop {
        let first = tokio::select! {
            message = receiver.recv() => message,
            _ = stop.changed() => return,
        };
        let Some(first) = first else { return };
        buffer.clear();
        let mut batch = BatchEncoder::begin(&mut buffer);
        batch.push(
            first.group_id,
            first.kind,
            first.correlation_id,
            &first.payload,
        );
        // The runtime's clock (a simulation pauses it).
        let linger_until = Instant::now() + linger;
        let mut yielded = false;
        loop {
            while batch.frame_len() < batch_bytes_max {
                match receiver.try_recv() {
                    Ok(message) => batch.push(
                        message.group_id,
                        message.kind,
                        message.correlation_id,
                        &message.payload,
                    ),
                    Err(_) => break,
                }
            }
            if batch.frame_len() >= batch_bytes_max || linger.is_zero() {
                break;
            }
            if linger >= Duration::from_millis(1) {
                // A long linger (control lane) sleeps; the timer's resolution is a millisecond.
                if Instant::now() >= linger_until {
                    break;
                }
                tokio::time::sleep_until(linger_until).await;
            } else {
                // A short linger is one pass of the scheduler: the tasks that are ready to
                // produce messages (the other groups' replication streams woken by the same
                // event) run once, and then the frame leaves. Never a spin: a loop of yields
                // until a deadline kept a worker thread busy for the whole linger of every
                // frame, and took the time slices the other processes on the machine needed.
                if yielded {
                    break;
                }
                yielded = true;
                tokio::task::yield_now().await;
            }
        }
        let messages = u64::from(batch.count());
        batch.finish();
        if let Err(error) = send.write_all(&buffer).await {
            debug!(node = shared.node_id(), peer, "lane write failed: {error}");
            return;
        }
        add(&shared.stats.frames_sent, 1);
        add(&shared.stats.messages_sent, messages);
        add(&shared.stats.bytes_sent, buffer.len() as u64);
    }
}
