//! The QUIC side of the native client protocol (`tenure_proto::client`): connections arrive
//! from the transport's endpoint (ALPN `tenure-client/8`); each bidirectional stream carries
//! request frames one way and response frames the other. Requests of a connection run
//! concurrently; every response ready when a stream's writer wakes goes into one frame.
//!
//! Identity per connection: a cluster node certificate marks a forwarding node (its requests
//! name the principal they act for); otherwise the connection authenticates with a bearer token
//! (`Authenticate`), or, in insecure development mode only, requests may name their principal.
//!
//! Bounds (contract section 6; `[limits.client]`, [`ClientLimitsConfig`]): what a client
//! connection can make the node hold is bounded whether or not it authenticated and whether or
//! not it reads its answers.
//! - Connections: at most `connections_max` client connections per node and
//!   `connections_per_source_max` per source IP address; beyond, a new one is closed at once. A
//!   connection that has not authenticated within `auth_timeout_ms` is closed (not in insecure
//!   development mode).
//! - QUIC: client connections start with the transport's client limits (few streams, small
//!   windows); a forwarding node's connection is raised to the node grade once its certificate
//!   proved it.
//! - Frames: at most `CLIENT_FRAME_BYTES_MAX` (`UNAUTHENTICATED_FRAME_BYTES_MAX` before the
//!   connection authenticated); the request count is checked before any request is decoded.
//! - Requests: a connection's requests hold a slot from decoding until their reply was written
//!   to the stream (`inflight_requests_max`, `unauthenticated_inflight_requests_max`); a reply
//!   also holds its encoded bytes against `reply_bytes_max` until written. A client that does not
//!   read its answers therefore stops its own requests (its frames wait, QUIC flow control stops
//!   its writes), not the node.
//! - `Routing` and `Status` (answers of ~17 KiB at 64 groups) are rate-limited per connection.
//! - Refusals: a connection that has not authenticated and has had
//!   `unauthenticated_refusals_max` requests refused (any error answer) is no longer read: its
//!   streams are stopped, new streams are not read, and the authentication timeout closes it.
//!   Otherwise a client that ignores its `UNAUTHORIZED` and `RATE_LIMITED` answers would make the
//!   node decode and refuse requests as fast as it can write them (CPU, not memory).
//! - The `Authenticate` token is at most `TOKEN_BYTES_MAX` bytes.
//!
//! So one unauthenticated connection holds at most about: its QUIC receive window (1 MiB), one
//! frame being read (64 KiB) and its decoded requests, 16 requests in flight and 256 KiB of
//! replies, for at most 5 s at a time; the node holds at most `connections_max` of them.
//!
//! Must not depend on: the groups (it calls `Service`).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use tenure_core::ErrorCode;
use tenure_proto::client::{
    CLIENT_FRAME_BYTES_MAX, Principal, Request, RequestBody, Response, ResponseBody,
    TOKEN_BYTES_MAX, WireError, decode_request_frame,
};
use tenure_transport::ClientAcceptor;
use tenure_transport::tls::verify_peer_node_id;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::config::ClientLimitsConfig;
use crate::forward::read_frame_body;
use crate::request::{RequestContext, Service};
use crate::shared::NodeShared;

/// Largest request frame accepted before the connection authenticated, in bytes (an
/// `Authenticate` with the longest token fits many times).
pub const UNAUTHENTICATED_FRAME_BYTES_MAX: usize = 64 * 1024;

/// Requests in flight on a forwarding node's connection at most (the leader's admission bounds
/// them further).
const NODE_INFLIGHT_REQUESTS_MAX: usize = 65_536;

/// Reply bytes a forwarding node's connection may have queued.
const NODE_REPLY_BYTES_MAX: usize = 64 << 20;

/// Streams a forwarding node's connection may have open (its lanes, and older nodes that open
/// one stream per request).
const NODE_STREAMS_MAX: u32 = 256;

/// Receive and send windows of a forwarding node's connection, in bytes.
const NODE_WINDOW_BYTES: u32 = 16 << 20;

/// Responses one frame carries at most.
const RESPONSES_PER_FRAME_MAX: usize = 1_024;

/// Room kept in a frame for the response count's varint, in bytes.
const FRAME_COUNT_BYTES: usize = 10;

/// Longest timeout a request may ask for.
const REQUEST_TIMEOUT_MAX: Duration = Duration::from_secs(60);

/// Stream reset code for a stream that sent a bad frame.
const STREAM_PROTOCOL_ERROR: u32 = 2;
/// Stream stop code for a stream of a connection that is no longer read (too many refusals
/// before authenticating).
const STREAM_REFUSED: u32 = 6;

/// Connection close code: the node is starting or stopping.
const CLOSE_UNAVAILABLE: u32 = 3;
/// Connection close code: too many connections (node-wide or from the source address).
pub const CLOSE_TOO_MANY_CONNECTIONS: u32 = 4;
/// Connection close code: the connection did not authenticate in time.
pub const CLOSE_NOT_AUTHENTICATED: u32 = 5;

/// Routes client connections to the service once the node is up.
///
/// It holds the node weakly: the transport holds it, and the node holds the transport, so a
/// strong reference would keep a stopped node (its endpoint, its socket) alive forever. That
/// matters where nodes restart inside one process (the deterministic simulation).
#[derive(Default)]
pub struct ClientServer {
    service: OnceLock<(Weak<NodeShared>, ClientLimitsConfig)>,
    connections: Arc<Mutex<ConnectionCounts>>,
}

impl std::fmt::Debug for ClientServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientServer").finish_non_exhaustive()
    }
}

impl ClientServer {
    /// A server that refuses connections until [`ClientServer::set_service`].
    pub fn new() -> Arc<Self> {
        Arc::new(ClientServer::default())
    }

    /// Starts serving with `service` (which node a node certificate proves, and whether it is
    /// a member, is asked of its node table per request). The bounds are the node
    /// configuration's `[limits.client]`.
    pub fn set_service(&self, service: Service) {
        let limits = service.inner.config.limits.client.clone();
        let _ = self.service.set((Arc::downgrade(&service.inner), limits));
    }
}

/// Client connections open now, in total and by source address.
#[derive(Debug, Default)]
pub struct ConnectionCounts {
    total: usize,
    by_source: HashMap<IpAddr, usize>,
}

/// One client connection counted; uncounted when dropped.
#[derive(Debug)]
pub struct ConnectionSlot {
    counts: Arc<Mutex<ConnectionCounts>>,
    source: IpAddr,
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        if let Ok(mut counts) = self.counts.lock() {
            counts.total = counts.total.saturating_sub(1);
            if let Some(count) = counts.by_source.get_mut(&self.source) {
                *count -= 1;
                if *count == 0 {
                    counts.by_source.remove(&self.source);
                }
            }
        }
    }
}

/// Counts a new client connection from `source`, or says why it is refused.
pub fn claim_connection(
    counts: &Arc<Mutex<ConnectionCounts>>,
    source: IpAddr,
    limits: &ClientLimitsConfig,
) -> Result<ConnectionSlot, String> {
    let Ok(mut guard) = counts.lock() else {
        return Err("connection table unavailable".into());
    };
    if guard.total >= limits.connections_max as usize {
        return Err(format!(
            "too many client connections on this node ({})",
            limits.connections_max
        ));
    }
    let from_source = guard.by_source.get(&source).copied().unwrap_or(0);
    if from_source >= limits.connections_per_source_max as usize {
        return Err(format!(
            "too many client connections from {source} ({})",
            limits.connections_per_source_max
        ));
    }
    guard.total += 1;
    *guard.by_source.entry(source).or_insert(0) += 1;
    Ok(ConnectionSlot {
        counts: counts.clone(),
        source,
    })
}

impl ClientAcceptor for ClientServer {
    fn accept(&self, connection: quinn::Connection) {
        let Some((node, limits)) = self.service.get() else {
            connection.close(CLOSE_UNAVAILABLE.into(), b"node is starting");
            return;
        };
        let Some(inner) = node.upgrade() else {
            connection.close(CLOSE_UNAVAILABLE.into(), b"node is stopping");
            return;
        };
        let node_cert = NodeCert::of(&connection);
        let cert_sha256 = node_cert.as_ref().map(|cert| cert.sha256);
        if let Some(cert) = &cert_sha256 {
            if inner.is_revoked(cert) {
                debug!(remote = %connection.remote_address(), "refused a connection: revoked certificate");
                connection.close(
                    CLOSE_TOO_MANY_CONNECTIONS.into(),
                    b"this certificate was revoked (its node was removed from the cluster)",
                );
                return;
            }
        }
        let service = Service { inner };
        let (identity, slot) = match node_cert {
            Some(cert) => {
                debug!(
                    node = ?cert.node_now(&service.inner),
                    remote = %connection.remote_address(),
                    "forwarding node connected"
                );
                connection.set_max_concurrent_bi_streams(NODE_STREAMS_MAX.into());
                connection.set_receive_window(NODE_WINDOW_BYTES.into());
                connection.set_send_window(u64::from(NODE_WINDOW_BYTES));
                (Identity::Node(cert), None)
            }
            None => {
                let source = connection.remote_address().ip().to_canonical();
                match claim_connection(&self.connections, source, limits) {
                    Ok(slot) => (Identity::Client(Mutex::new(None)), Some(slot)),
                    Err(reason) => {
                        debug!(remote = %connection.remote_address(), "refused a client connection: {reason}");
                        connection.close(CLOSE_TOO_MANY_CONNECTIONS.into(), reason.as_bytes());
                        return;
                    }
                }
            }
        };
        let mut state = ConnectionState::new(service, identity, limits);
        state.cert_sha256 = cert_sha256;
        let state = Arc::new(state);
        tokio::spawn(serve_connection(state, connection, slot));
    }
}

/// Who a connection acts for.
#[derive(Debug)]
enum Identity {
    /// A cluster node (a certificate of the cluster CA) forwarding for the principals its
    /// requests name.
    Node(NodeCert),
    /// A client; `None` until it authenticates.
    Client(Mutex<Option<Principal>>),
}

/// The certificate a connection presented: any certificate the cluster CA signed is a node's
/// (the CA issues node certificates only; the TLS handshake checked the chain). Which node, and
/// whether it is still a member, is decided per request against the node table as it is then
/// ([`NodeCert::node_now`]): a node removed while its connection is open loses its powers at once,
/// and a node announced after it connected gains them.
#[derive(Debug)]
struct NodeCert {
    leaf_der: Vec<u8>,
    sha256: [u8; 32],
    /// The node table version of the last resolution, and the node it found.
    resolved: Mutex<Option<(u64, Option<u64>)>>,
}

impl NodeCert {
    fn of(connection: &quinn::Connection) -> Option<Self> {
        let chain = connection
            .peer_identity()?
            .downcast::<Vec<rustls_pki_types::CertificateDer<'static>>>()
            .ok()?;
        let leaf = chain.first()?.as_ref().to_vec();
        Some(NodeCert {
            sha256: tenure_transport::certificate_sha256(&leaf),
            leaf_der: leaf,
            resolved: Mutex::new(None),
        })
    }

    /// The member node this certificate proves now (none when its node is not a member, was
    /// removed, or the certificate was revoked); cached per node table version.
    fn node_now(&self, shared: &crate::shared::NodeShared) -> Option<u64> {
        let version = shared.cluster_view().version;
        if let Ok(resolved) = self.resolved.lock() {
            if let Some((seen, node)) = *resolved {
                if seen == version {
                    return node;
                }
            }
        }
        let node = if shared.is_revoked(&self.sha256) {
            None
        } else {
            shared.member_nodes().into_iter().find(|&node| {
                let chain = vec![rustls_pki_types::CertificateDer::from(
                    self.leaf_der.clone(),
                )];
                verify_peer_node_id(Some(Box::new(chain)), node).is_ok()
            })
        };
        if let Ok(mut resolved) = self.resolved.lock() {
            *resolved = Some((version, node));
        }
        node
    }
}

/// A token bucket: `rate_per_s` tokens a second, at most `burst` saved.
#[derive(Debug)]
struct TokenBucket {
    rate_per_s: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    fn new(rate_per_s: u32) -> Self {
        let rate_per_s = f64::from(rate_per_s.max(1));
        TokenBucket {
            rate_per_s,
            burst: rate_per_s * 2.0,
            tokens: rate_per_s * 2.0,
            at: Instant::now(),
        }
    }

    /// Takes a token, or says in how many milliseconds one will be there.
    fn take(&mut self) -> Result<(), u32> {
        self.take_at(Instant::now())
    }

    fn take_at(&mut self, now: Instant) -> Result<(), u32> {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.at = now;
        self.tokens = (self.tokens + elapsed * self.rate_per_s).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            let wait_ms = ((1.0 - self.tokens) / self.rate_per_s * 1_000.0).ceil();
            // Within 1..=1000 ms (the rate is at least 1 a second), so the cast is exact.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let wait_ms = wait_ms.clamp(1.0, 1_000.0) as u32;
            Err(wait_ms)
        }
    }
}

/// One connection: its identity and its budgets.
struct ConnectionState {
    service: Service,
    identity: Identity,
    /// Requests in flight (decoded, reply not yet written).
    requests: Arc<Semaphore>,
    /// Encoded reply bytes not yet written.
    reply_bytes: Arc<Semaphore>,
    reply_bytes_max: Mutex<usize>,
    /// True once the budgets are the authenticated ones.
    full_budget: AtomicBool,
    limits: ClientLimitsConfig,
    routing_status: Mutex<TokenBucket>,
    /// Requests refused while the connection had not authenticated.
    unauthenticated_refusals: AtomicU32,
    /// Set once `unauthenticated_refusals` reached its maximum: nothing more is read.
    muted: AtomicBool,
    /// Wakes a muted connection's accept loop when an Authenticate unmutes it.
    unmuted: tokio::sync::Notify,
    /// SHA-256 of the client certificate, when it presented one.
    cert_sha256: Option<[u8; 32]>,
}

impl ConnectionState {
    fn new(service: Service, identity: Identity, limits: &ClientLimitsConfig) -> Self {
        let trusted = match &identity {
            Identity::Node(_) => true,
            Identity::Client(_) => service.authenticator().insecure_dev_mode(),
        };
        let (requests, reply_bytes) = match &identity {
            Identity::Node(_) => (NODE_INFLIGHT_REQUESTS_MAX, NODE_REPLY_BYTES_MAX),
            Identity::Client(_) if trusted => (
                limits.inflight_requests_max as usize,
                limits.reply_bytes_max as usize,
            ),
            Identity::Client(_) => (
                limits.unauthenticated_inflight_requests_max as usize,
                limits.unauthenticated_reply_bytes_max as usize,
            ),
        };
        ConnectionState {
            service,
            identity,
            requests: Arc::new(Semaphore::new(requests)),
            reply_bytes: Arc::new(Semaphore::new(reply_bytes)),
            reply_bytes_max: Mutex::new(reply_bytes),
            full_budget: AtomicBool::new(trusted),
            routing_status: Mutex::new(TokenBucket::new(limits.routing_status_per_s)),
            limits: limits.clone(),
            unauthenticated_refusals: AtomicU32::new(0),
            muted: AtomicBool::new(false),
            unmuted: tokio::sync::Notify::new(),
            cert_sha256: None,
        }
    }

    /// Counts a refused request of a connection that has not authenticated; mutes the
    /// connection at `unauthenticated_refusals_max`.
    fn refused(&self) {
        if self.is_trusted() {
            return;
        }
        let refusals = self.unauthenticated_refusals.fetch_add(1, Ordering::AcqRel) + 1;
        if refusals >= self.limits.unauthenticated_refusals_max
            && !self.muted.swap(true, Ordering::AcqRel)
        {
            debug!(
                refusals,
                "stopped reading a connection that had {refusals} requests refused before authenticating"
            );
        }
    }

    /// True once the connection is no longer read (see [`ConnectionState::refused`]).
    fn is_muted(&self) -> bool {
        self.muted.load(Ordering::Acquire)
    }

    /// True for a forwarding node, an authenticated client, or any client in insecure mode.
    fn is_trusted(&self) -> bool {
        self.full_budget.load(Ordering::Acquire)
    }

    fn frame_bytes_max(&self) -> usize {
        if self.is_trusted() {
            CLIENT_FRAME_BYTES_MAX
        } else {
            UNAUTHENTICATED_FRAME_BYTES_MAX
        }
    }

    /// Grows the budgets to the authenticated ones (once).
    fn authenticated(&self) {
        // An Authenticate that was already running when the connection was muted still counts:
        // the connection is read again.
        if self.muted.swap(false, Ordering::AcqRel) {
            // A stored permit: the accept loop wakes even if it was not waiting yet.
            self.unmuted.notify_one();
        }
        if self.full_budget.swap(true, Ordering::AcqRel) {
            return;
        }
        let limits = &self.limits;
        self.requests.add_permits(
            (limits.inflight_requests_max as usize)
                .saturating_sub(limits.unauthenticated_inflight_requests_max as usize),
        );
        let grow = (limits.reply_bytes_max as usize)
            .saturating_sub(limits.unauthenticated_reply_bytes_max as usize);
        self.reply_bytes.add_permits(grow);
        if let Ok(mut max) = self.reply_bytes_max.lock() {
            *max += grow;
        }
    }

    /// Reply bytes one reply holds: its size, or the whole budget for a larger one (so it still
    /// goes out, alone).
    fn reply_permits(&self, bytes: usize) -> u32 {
        let max = self.reply_bytes_max.lock().map_or(bytes, |max| *max);
        u32::try_from(bytes.min(max).max(1)).unwrap_or(u32::MAX)
    }
}

async fn serve_connection(
    state: Arc<ConnectionState>,
    connection: quinn::Connection,
    slot: Option<ConnectionSlot>,
) {
    let _slot = slot;
    let watchdog = match &state.identity {
        Identity::Client(_) if !state.is_trusted() => {
            let state = state.clone();
            let connection = connection.clone();
            Some(tokio::spawn(async move {
                let timeout = Duration::from_millis(state.limits.auth_timeout_ms);
                tokio::time::sleep(timeout).await;
                if !state.is_trusted() {
                    debug!(remote = %connection.remote_address(), "closing a connection that did not authenticate");
                    connection.close(
                        CLOSE_NOT_AUTHENTICATED.into(),
                        format!(
                            "not authenticated within {} ms",
                            state.limits.auth_timeout_ms
                        )
                        .as_bytes(),
                    );
                }
            }))
        }
        _ => None,
    };
    'accept: loop {
        match connection.accept_bi().await {
            Ok((send, recv)) => {
                if state.is_muted() {
                    // Nothing more is read: new streams wait at the QUIC stream limit until
                    // the authentication timeout closes the connection (or an Authenticate
                    // that was already running when it was muted unmutes it).
                    drop((send, recv));
                    tokio::select! {
                        _ = connection.closed() => break 'accept,
                        () = state.unmuted.notified() => continue,
                    }
                }
                tokio::spawn(serve_stream(state.clone(), send, recv));
            }
            Err(error) => {
                debug!(remote = %connection.remote_address(), "client connection ended: {error}");
                break;
            }
        }
    }
    if let Some(watchdog) = watchdog {
        watchdog.abort();
    }
}

/// An encoded response waiting for its stream's writer, with the slot and reply bytes it holds
/// until written.
struct Encoded {
    bytes: Vec<u8>,
    _slot: OwnedSemaphorePermit,
    _reply_bytes: OwnedSemaphorePermit,
}

async fn serve_stream(
    state: Arc<ConnectionState>,
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
) {
    // Unbounded, yet bounded: every entry holds one of the connection's request slots.
    let (responses, mut pending) = mpsc::unbounded_channel::<Encoded>();
    let writer = tokio::spawn(async move {
        while let Some(first) = pending.recv().await {
            let mut batch = vec![first];
            let mut bytes = batch[0].bytes.len();
            while batch.len() < RESPONSES_PER_FRAME_MAX {
                match pending.try_recv() {
                    Ok(next) => {
                        if bytes + next.bytes.len() + FRAME_COUNT_BYTES > CLIENT_FRAME_BYTES_MAX {
                            // Written after this frame, in its own.
                            let frame = response_frame(&batch);
                            if send.write_all(&frame).await.is_err() {
                                return;
                            }
                            bytes = 0;
                            batch.clear();
                        }
                        bytes += next.bytes.len();
                        batch.push(next);
                    }
                    Err(_) => break,
                }
            }
            let frame = response_frame(&batch);
            if send.write_all(&frame).await.is_err() {
                return;
            }
            // The slots and reply bytes are released only now, with the reply written.
            drop(batch);
        }
        let _ = send.finish();
    });
    loop {
        // Checked before each frame: a stream already waiting for its next frame when the
        // connection was muted reads (and decodes, at most 64 KiB) that one frame, then stops.
        if state.is_muted() {
            let _ = recv.stop(STREAM_REFUSED.into());
            break;
        }
        let body = match read_frame_body(&mut recv, state.frame_bytes_max()).await {
            Ok(Some(body)) => body,
            Ok(None) => break,
            Err(reason) => {
                warn!("closing a client stream: {reason}");
                let _ = recv.stop(STREAM_PROTOCOL_ERROR.into());
                break;
            }
        };
        // The request count is checked before any request is decoded.
        let frame = match decode_request_frame(&body) {
            Ok(frame) => frame,
            Err(error) => {
                warn!("closing a client stream: undecodable request frame: {error}");
                let _ = recv.stop(STREAM_PROTOCOL_ERROR.into());
                break;
            }
        };
        drop(body);
        for request in frame.requests {
            let Ok(slot) = state.requests.clone().acquire_owned().await else {
                break;
            };
            if state.is_muted() {
                break;
            }
            let state = state.clone();
            let responses = responses.clone();
            tokio::spawn(async move {
                let id = request.id;
                let result = handle_request(&state, request).await;
                if result.is_err() {
                    state.refused();
                }
                let bytes = encode_response(Response { id, result });
                let Ok(reply_bytes) = state
                    .reply_bytes
                    .clone()
                    .acquire_many_owned(state.reply_permits(bytes.len()))
                    .await
                else {
                    return;
                };
                let _ = responses.send(Encoded {
                    bytes,
                    _slot: slot,
                    _reply_bytes: reply_bytes,
                });
            });
        }
    }
    drop(responses);
    let _ = writer.await;
}

/// One response's postcard bytes, as an item of a `ResponseFrame`; a response too large for a
/// frame is replaced by an `INTERNAL` error, so every request still gets an answer.
fn encode_response(response: Response) -> Vec<u8> {
    let id = response.id;
    match postcard::to_allocvec(&response) {
        Ok(bytes) if bytes.len() + FRAME_COUNT_BYTES <= CLIENT_FRAME_BYTES_MAX => bytes,
        outcome => {
            warn!(
                id,
                "a response does not fit in a frame ({:?}); answering INTERNAL",
                outcome.as_ref().map(Vec::len)
            );
            let replacement = Response {
                id,
                result: Err(WireError::new(
                    ErrorCode::Internal,
                    format!(
                        "the answer does not fit in a frame of {CLIENT_FRAME_BYTES_MAX} bytes; ask for less (a smaller page)"
                    ),
                )),
            };
            postcard::to_allocvec(&replacement).unwrap_or_default()
        }
    }
}

/// A response frame (length prefix included) of already encoded responses: postcard writes a
/// `ResponseFrame` as its vector, i.e. the count as a varint and then each item, so these bytes
/// equal `encode_client_frame(&ResponseFrame { responses })` (a test checks it).
fn response_frame(batch: &[Encoded]) -> Vec<u8> {
    let items: usize = batch.iter().map(|encoded| encoded.bytes.len()).sum();
    let mut frame = Vec::with_capacity(4 + FRAME_COUNT_BYTES + items);
    frame.extend_from_slice(&[0u8; 4]);
    let mut count = batch.len() as u64;
    loop {
        let low = u8::try_from(count & 0x7f).unwrap_or(0);
        count >>= 7;
        if count == 0 {
            frame.push(low);
            break;
        }
        frame.push(low | 0x80);
    }
    for encoded in batch {
        frame.extend_from_slice(&encoded.bytes);
    }
    let length = u32::try_from(frame.len() - 4).unwrap_or(u32::MAX);
    frame[..4].copy_from_slice(&length.to_le_bytes());
    frame
}

fn unauthorized() -> WireError {
    WireError::new(
        ErrorCode::Unauthorized,
        "authenticate the connection first (Authenticate with a bearer token)",
    )
}

async fn handle_request(
    state: &ConnectionState,
    request: Request,
) -> Result<ResponseBody, WireError> {
    let service = &state.service;
    let identity = &state.identity;
    let Request {
        timeout_ms,
        mut flags,
        principal: named,
        body,
        ..
    } = request;
    if let RequestBody::Authenticate { token } = &body {
        let Identity::Client(bound) = identity else {
            return Err(WireError::new(
                ErrorCode::InvalidArgument,
                "forwarding nodes do not authenticate",
            ));
        };
        if token.len() > TOKEN_BYTES_MAX {
            return Err(WireError::new(
                ErrorCode::Unauthorized,
                format!("the bearer token is longer than {TOKEN_BYTES_MAX} bytes"),
            ));
        }
        let principal = service.authenticator().authenticate_bearer(token)?;
        if let Ok(mut bound) = bound.lock() {
            *bound = Some(principal.clone());
        }
        state.authenticated();
        return Ok(ResponseBody::Authenticated(principal));
    }
    let insecure = service.authenticator().insecure_dev_mode();
    if matches!(identity, Identity::Client(_))
        && matches!(
            body,
            RequestBody::Routing
                | RequestBody::Status
                | RequestBody::GroupMembers { .. }
                | RequestBody::ClusterNodes
        )
    {
        let taken = state
            .routing_status
            .lock()
            .map_or(Ok(()), |mut bucket| bucket.take());
        if let Err(retry_after_ms) = taken {
            let mut error = WireError::new(
                ErrorCode::RateLimited,
                format!(
                    "at most {} Routing and Status requests per second per connection",
                    state.limits.routing_status_per_s
                ),
            );
            error.retry_after_ms = Some(retry_after_ms);
            return Err(error);
        }
    }
    let node_now = match identity {
        Identity::Node(cert) => cert.node_now(&service.inner),
        Identity::Client(_) => None,
    };
    let principal = match identity {
        Identity::Node(_) if node_now.is_none() => {
            // A node certificate whose node is not a member now: it may read what anyone may
            // (to learn the node table) and nothing else.
            if !matches!(
                body,
                RequestBody::Routing | RequestBody::Status | RequestBody::ClusterNodes
            ) {
                return Err(WireError::new(
                    ErrorCode::Forbidden,
                    "this node certificate's node is not a member of the cluster (not announced \
                     yet, removed, or its certificate revoked)",
                ));
            }
            Principal {
                principal_id: String::new(),
                tenant_id: String::new(),
            }
        }
        Identity::Node(_) => {
            let node = node_now.unwrap_or_default();
            // A forwarding node is trusted to name the principal only when it authenticated
            // that principal itself; a claim it took on trust is taken on trust here only if
            // this node is insecure too.
            if flags.principal_claimed && !insecure {
                return Err(WireError::new(
                    ErrorCode::Unauthorized,
                    format!(
                        "node {node} forwarded a principal its client claimed without \
                         authentication (insecure development mode); this node requires \
                         authentication: send a bearer token"
                    ),
                ));
            }
            named.ok_or_else(|| {
                WireError::new(
                    ErrorCode::InvalidArgument,
                    format!("a request forwarded by node {node} must name its principal"),
                )
            })?
        }
        Identity::Client(bound) => {
            let bound = bound.lock().ok().and_then(|bound| bound.clone());
            // This node decides how a client's principal was established.
            flags.principal_claimed = false;
            match (bound, named) {
                (Some(bound), None) => bound,
                (Some(bound), Some(named)) => {
                    crate::auth::check_tenant(&bound, &named.tenant_id)?;
                    bound
                }
                (None, Some(named)) if insecure => {
                    flags.principal_claimed = true;
                    named
                }
                (None, _)
                    if matches!(
                        body,
                        RequestBody::Routing
                            | RequestBody::Status
                            | RequestBody::GroupMembers { .. }
                            | RequestBody::ClusterNodes
                    ) =>
                {
                    Principal {
                        principal_id: String::new(),
                        tenant_id: String::new(),
                    }
                }
                (None, _) => return Err(unauthorized()),
            }
        }
    };
    let timeout = if timeout_ms == 0 {
        service.request_timeout()
    } else {
        Duration::from_millis(u64::from(timeout_ms)).min(REQUEST_TIMEOUT_MAX)
    };
    service
        .handle(
            RequestContext {
                principal,
                flags,
                timeout,
                peer_node: node_now,
                peer_cert_sha256: state.cert_sha256,
            },
            body,
        )
        .await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::net::Ipv4Addr;

    use tenure_proto::client::{ResponseFrame, encode_client_frame};

    use super::*;

    fn encoded(response: &Response) -> Encoded {
        let semaphore = Arc::new(Semaphore::new(2));
        Encoded {
            bytes: encode_response(response.clone()),
            _slot: semaphore.clone().try_acquire_owned().unwrap(),
            _reply_bytes: semaphore.try_acquire_owned().unwrap(),
        }
    }

    #[test]
    fn a_frame_of_encoded_responses_is_the_encoded_frame() {
        for count in [1usize, 3, 127, 128, 300] {
            let responses: Vec<Response> = (0..count as u64)
                .map(|id| Response {
                    id: id * 1_000_003,
                    result: Err(WireError::new(
                        ErrorCode::NotFound,
                        "x".repeat(usize::try_from(id % 7).unwrap()),
                    )),
                })
                .collect();
            let batch: Vec<Encoded> = responses.iter().map(encoded).collect();
            assert_eq!(
                response_frame(&batch),
                encode_client_frame(&ResponseFrame { responses }).unwrap(),
                "{count} responses"
            );
        }
    }

    #[test]
    fn connections_are_capped_per_node_and_per_source() {
        let counts = Arc::new(Mutex::new(ConnectionCounts::default()));
        let limits = ClientLimitsConfig {
            connections_max: 3,
            connections_per_source_max: 2,
            ..ClientLimitsConfig::default()
        };
        let a = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
        let b = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
        let first = claim_connection(&counts, a, &limits).unwrap();
        let _second = claim_connection(&counts, a, &limits).unwrap();
        assert!(
            claim_connection(&counts, a, &limits)
                .unwrap_err()
                .contains("from 10.0.0.1")
        );
        let _third = claim_connection(&counts, b, &limits).unwrap();
        assert!(
            claim_connection(&counts, b, &limits)
                .unwrap_err()
                .contains("on this node")
        );
        drop(first);
        claim_connection(&counts, a, &limits).unwrap();
    }

    #[test]
    fn the_routing_bucket_refills_at_its_rate() {
        let mut bucket = TokenBucket::new(10);
        let start = bucket.at;
        for _ in 0..20 {
            bucket.take_at(start).unwrap();
        }
        let wait_ms = bucket.take_at(start).unwrap_err();
        assert!((1..=100).contains(&wait_ms), "{wait_ms}");
        let later = start + Duration::from_millis(100);
        bucket.take_at(later).unwrap();
        assert!(bucket.take_at(later).is_err());
    }
}
