//! One QUIC connection per node, and the lanes that carry requests over it.
//!
//! A [`NodeLink`] owns at most one live connection to its node, opened on first use and again
//! after a failure. Each connection has `lanes_per_node` long-lived bidirectional streams; a
//! lane's writer puts every request queued when it wakes into one frame (so concurrent calls
//! share frames), and its reader hands each response to the call waiting for its id. Requests in
//! flight per node are bounded by a semaphore: a caller waits for room until its deadline
//! (back-pressure), never queues without bound.
//!
//! Must not depend on: routing or retries (the client decides where and how often to send).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};
use tenure_core::ErrorCode;
use tenure_proto::client::{
    CLIENT_ALPN, CLIENT_FRAME_BYTES_MAX, Request, RequestBody, ResponseBody, WireError,
    decode_response_frame, encode_frames_split,
};
use tokio::sync::{Semaphore, mpsc, oneshot};
use tracing::debug;

use crate::error::ClientError;

/// Server name under which node `node_id`'s certificate is issued.
pub fn node_server_name(node_id: u64) -> String {
    format!("node-{node_id}.tenure.internal")
}

/// Server name used for a first contact whose node id is unknown; only the chain to the CA is
/// checked for it.
const ANY_NODE_NAME: &str = "any-node.tenure.internal";

/// Why one attempt failed below the protocol (the request may or may not have been applied).
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum LinkError {
    #[error("connecting to {addr}: {reason}")]
    Connect { addr: SocketAddr, reason: String },
    #[error("no answer from {addr} within {timeout_ms} ms")]
    Timeout { addr: SocketAddr, timeout_ms: u64 },
    #[error("connection to {addr} lost before the answer: {reason}")]
    Lost { addr: SocketAddr, reason: String },
    /// An answer that ends the call (local back-pressure, a refused token).
    #[error("{0}")]
    Final(ClientError),
}

type Answer = Result<ResponseBody, WireError>;

/// Test hooks: responses dropped on purpose (feature `fault-injection`).
#[derive(Debug, Default)]
pub struct FaultInjector {
    drop_lease_responses: AtomicU64,
}

impl FaultInjector {
    /// Drops the next `count` responses to Acquire, Renew, Release and Batch requests after the
    /// node sent them, as if the network lost them: the call sees its attempt fail and retries
    /// with the same request ids.
    pub fn drop_next_lease_responses(&self, count: u64) {
        self.drop_lease_responses.store(count, Ordering::SeqCst);
    }

    fn take_drop(&self, op: &'static str) -> bool {
        matches!(op, "acquire" | "renew" | "release" | "batch")
            && self
                .drop_lease_responses
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
    }
}

/// Builds the two client TLS configurations: one checking the node's name, one (first contact
/// with an endpoint of unknown id) checking only the chain to the cluster CA.
pub(crate) fn quic_client_configs(
    ca_cert_pem: &str,
) -> Result<(quinn::ClientConfig, quinn::ClientConfig), ClientError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_cert_pem.as_bytes()) {
        let cert = cert.map_err(|error| ClientError::Config(format!("CA PEM: {error}")))?;
        roots
            .add(cert)
            .map_err(|error| ClientError::Config(format!("CA certificate: {error}")))?;
    }
    if roots.is_empty() {
        return Err(ClientError::Config(
            "the CA PEM holds no certificate".to_string(),
        ));
    }
    let strict = rustls::client::WebPkiServerVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .map_err(|error| ClientError::Config(format!("certificate verifier: {error}")))?;
    let lenient = Arc::new(ChainOnlyVerifier {
        inner: strict.clone(),
    });
    let build =
        |verifier: Arc<dyn ServerCertVerifier>| -> Result<quinn::ClientConfig, ClientError> {
            let mut tls = rustls::ClientConfig::builder_with_provider(provider.clone())
                .with_protocol_versions(&[&rustls::version::TLS13])
                .map_err(|error| ClientError::Config(format!("TLS: {error}")))?
                .dangerous()
                .with_custom_certificate_verifier(verifier)
                .with_no_client_auth();
            tls.alpn_protocols = vec![CLIENT_ALPN.to_vec()];
            let quic = quinn::crypto::rustls::QuicClientConfig::try_from(tls)
                .map_err(|error| ClientError::Config(format!("QUIC TLS: {error}")))?;
            let mut config = quinn::ClientConfig::new(Arc::new(quic));
            let mut transport = quinn::TransportConfig::default();
            transport.max_idle_timeout(Some(
                quinn::IdleTimeout::try_from(Duration::from_secs(10))
                    .map_err(|error| ClientError::Config(error.to_string()))?,
            ));
            transport.keep_alive_interval(Some(Duration::from_secs(2)));
            config.transport_config(Arc::new(transport));
            Ok(config)
        };
    Ok((build(strict)?, build(lenient)?))
}

/// Verifies the chain to the cluster CA; when dialled as [`ANY_NODE_NAME`], accepts any name the
/// CA certified (every certificate the cluster CA signs belongs to a node of the cluster).
#[derive(Debug)]
struct ChainOnlyVerifier {
    inner: Arc<rustls::client::WebPkiServerVerifier>,
}

impl ServerCertVerifier for ChainOnlyVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            // The name is checked after the chain, so a name error means the chain is good.
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if matches!(server_name, ServerName::DnsName(name) if name.as_ref() == ANY_NODE_NAME) => {
                Ok(ServerCertVerified::assertion())
            }
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// Settings a link needs from the client configuration.
#[derive(Debug, Clone)]
pub(crate) struct LinkSettings {
    pub lanes: usize,
    pub frame_requests_max: usize,
    pub inflight_max: usize,
    pub connect_timeout: Duration,
    pub token: Option<String>,
}

struct Pending {
    op: &'static str,
    answer: oneshot::Sender<Answer>,
}

/// A live connection and its lanes.
struct LiveConnection {
    connection: quinn::Connection,
    lanes: Vec<mpsc::Sender<Request>>,
    pending: Arc<Mutex<BTreeMap<u64, Pending>>>,
    next_lane: AtomicUsize,
    dead: Arc<AtomicBool>,
}

impl LiveConnection {
    fn is_usable(&self) -> bool {
        !self.dead.load(Ordering::SeqCst) && self.connection.close_reason().is_none()
    }
}

/// The client's link to one node.
pub(crate) struct NodeLink {
    /// The node's id, when known.
    pub node_id: Option<u64>,
    /// Its address.
    pub addr: SocketAddr,
    endpoint: quinn::Endpoint,
    tls: quinn::ClientConfig,
    settings: LinkSettings,
    live: tokio::sync::Mutex<Option<Arc<LiveConnection>>>,
    permits: Arc<Semaphore>,
    next_request_id: AtomicU64,
    faults: Arc<FaultInjector>,
    /// Until when (ms on the link's own clock) the node is suspected down, after a failure.
    suspect_until_ms: AtomicU64,
    created: Instant,
}

/// How long a node stays suspected after a failed attempt; calls go elsewhere meanwhile.
const SUSPECT_FOR: Duration = Duration::from_secs(2);

impl NodeLink {
    pub(crate) fn new(
        node_id: Option<u64>,
        addr: SocketAddr,
        endpoint: quinn::Endpoint,
        tls: quinn::ClientConfig,
        settings: LinkSettings,
        faults: Arc<FaultInjector>,
    ) -> Self {
        let permits = Arc::new(Semaphore::new(settings.inflight_max));
        NodeLink {
            node_id,
            addr,
            endpoint,
            tls,
            settings,
            live: tokio::sync::Mutex::new(None),
            permits,
            next_request_id: AtomicU64::new(1),
            faults,
            suspect_until_ms: AtomicU64::new(0),
            created: crate::time::now(),
        }
    }

    fn clock_ms(&self) -> u64 {
        millis(crate::time::elapsed(self.created))
    }

    /// True while a recent failure makes the node a poor first choice.
    pub(crate) fn is_suspect(&self) -> bool {
        self.suspect_until_ms.load(Ordering::Relaxed) > self.clock_ms()
    }

    /// Marks the node suspected for a while (a failed attempt), or clears that (an answer).
    pub(crate) fn set_suspect(&self, suspect: bool) {
        let until = if suspect {
            self.clock_ms() + millis(SUSPECT_FOR)
        } else {
            0
        };
        self.suspect_until_ms.store(until, Ordering::Relaxed);
    }

    fn label(&self) -> String {
        match self.node_id {
            Some(id) => format!("{id} ({})", self.addr),
            None => self.addr.to_string(),
        }
    }

    /// Sends one request and waits for its answer until `deadline`.
    pub(crate) async fn call(
        &self,
        mut request: Request,
        deadline: Instant,
    ) -> Result<Answer, LinkError> {
        let started = crate::time::now();
        let permit =
            match tokio::time::timeout_at(deadline.into(), self.permits.clone().acquire_owned())
                .await
            {
                Ok(Ok(permit)) => permit,
                Ok(Err(_)) | Err(_) => {
                    return Err(LinkError::Final(ClientError::Busy {
                        node: self.label(),
                        waited_ms: millis(crate::time::elapsed(started)),
                    }));
                }
            };
        let live = self.connection(deadline).await?;
        let id = self.next_request_id.fetch_add(1, Ordering::Relaxed);
        request.id = id;
        let remaining = deadline.saturating_duration_since(crate::time::now());
        request.timeout_ms = u32::try_from(remaining.as_millis())
            .unwrap_or(u32::MAX)
            .max(1);
        let (answer, waiting) = oneshot::channel();
        if let Ok(mut pending) = live.pending.lock() {
            pending.insert(
                id,
                Pending {
                    op: request.body.op_name(),
                    answer,
                },
            );
        }
        let lane = live.next_lane.fetch_add(1, Ordering::Relaxed) % live.lanes.len();
        if live.lanes[lane].send(request).await.is_err() {
            self.forget_pending(&live, id);
            return Err(LinkError::Lost {
                addr: self.addr,
                reason: "the lane closed".to_string(),
            });
        }
        let outcome = tokio::time::timeout_at(deadline.into(), waiting).await;
        drop(permit);
        match outcome {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(_)) => Err(LinkError::Lost {
                addr: self.addr,
                reason: live
                    .connection
                    .close_reason()
                    .map_or_else(|| "the response was lost".to_string(), |r| r.to_string()),
            }),
            Err(_) => {
                self.forget_pending(&live, id);
                if tracing::enabled!(tracing::Level::DEBUG) {
                    let stats = live.connection.stats();
                    debug!(
                        node = self.label(),
                        rtt_ms = millis(live.connection.rtt()),
                        cwnd = stats.path.cwnd,
                        lost_packets = stats.path.lost_packets,
                        datagrams_received = stats.udp_rx.datagrams,
                        datagrams_sent = stats.udp_tx.datagrams,
                        "no answer before the deadline"
                    );
                }
                Err(LinkError::Timeout {
                    addr: self.addr,
                    timeout_ms: millis(crate::time::elapsed(started)),
                })
            }
        }
    }

    fn forget_pending(&self, live: &LiveConnection, id: u64) {
        if let Ok(mut pending) = live.pending.lock() {
            pending.remove(&id);
        }
    }

    /// Closes the connection (pending calls fail and retry elsewhere).
    pub(crate) async fn close(&self) {
        if let Some(live) = self.live.lock().await.take() {
            live.dead.store(true, Ordering::SeqCst);
            live.connection.close(0u32.into(), b"client closed");
        }
    }

    async fn connection(&self, deadline: Instant) -> Result<Arc<LiveConnection>, LinkError> {
        let mut live = self.live.lock().await;
        if let Some(current) = live.take() {
            if current.is_usable() {
                *live = Some(current.clone());
                return Ok(current);
            }
            // A lane failed or the connection closed: close it for good (its pending calls
            // already failed) and open a new one.
            current.dead.store(true, Ordering::SeqCst);
            current.connection.close(0u32.into(), b"replaced");
        }
        let connect_deadline = deadline.min(crate::time::now() + self.settings.connect_timeout);
        let fresh = tokio::time::timeout_at(connect_deadline.into(), self.open())
            .await
            .map_err(|_| LinkError::Connect {
                addr: self.addr,
                reason: "handshake timed out".to_string(),
            })??;
        *live = Some(fresh.clone());
        Ok(fresh)
    }

    async fn open(&self) -> Result<Arc<LiveConnection>, LinkError> {
        let connect_error = |reason: String| LinkError::Connect {
            addr: self.addr,
            reason,
        };
        let name = self
            .node_id
            .map_or_else(|| ANY_NODE_NAME.to_string(), node_server_name);
        let connection = self
            .endpoint
            .connect_with(self.tls.clone(), self.addr, &name)
            .map_err(|error| connect_error(error.to_string()))?
            .await
            .map_err(|error| connect_error(error.to_string()))?;
        let pending: Arc<Mutex<BTreeMap<u64, Pending>>> = Arc::default();
        let dead = Arc::new(AtomicBool::new(false));
        let mut lanes = Vec::with_capacity(self.settings.lanes);
        for _ in 0..self.settings.lanes {
            let (send, recv) = connection
                .open_bi()
                .await
                .map_err(|error| connect_error(format!("opening a stream: {error}")))?;
            let (queue, queued) = mpsc::channel(self.settings.inflight_max);
            tokio::spawn(lane_writer(
                send,
                queued,
                self.settings.frame_requests_max,
                pending.clone(),
                dead.clone(),
            ));
            tokio::spawn(lane_reader(
                recv,
                pending.clone(),
                dead.clone(),
                self.faults.clone(),
            ));
            lanes.push(queue);
        }
        let live = Arc::new(LiveConnection {
            connection,
            lanes,
            pending,
            next_lane: AtomicUsize::new(0),
            dead,
        });
        if let Some(token) = &self.settings.token {
            self.authenticate(&live, token).await?;
        }
        debug!(node = self.label(), "connected");
        Ok(live)
    }

    async fn authenticate(&self, live: &Arc<LiveConnection>, token: &str) -> Result<(), LinkError> {
        let id = self.next_request_id.fetch_add(1, Ordering::Relaxed);
        let (answer, waiting) = oneshot::channel();
        if let Ok(mut pending) = live.pending.lock() {
            pending.insert(
                id,
                Pending {
                    op: "authenticate",
                    answer,
                },
            );
        }
        let request = Request {
            id,
            timeout_ms: 0,
            flags: Default::default(),
            principal: None,
            body: RequestBody::Authenticate {
                token: token.to_string(),
            },
        };
        let failed = |reason: String| LinkError::Connect {
            addr: self.addr,
            reason,
        };
        live.lanes[0]
            .send(request)
            .await
            .map_err(|_| failed("the lane closed".to_string()))?;
        match waiting.await {
            Ok(Ok(ResponseBody::Authenticated(_))) => Ok(()),
            // A refused token is the caller's problem, not the link's: report it as the
            // server's error so it is not retried.
            Ok(Err(error)) if error.code == ErrorCode::Unauthorized => {
                live.connection.close(0u32.into(), b"unauthorized");
                Err(LinkError::Final(ClientError::from_wire(error)))
            }
            Ok(Err(error)) => Err(failed(format!("authentication: {error}"))),
            Ok(Ok(other)) => Err(failed(format!(
                "unexpected answer to Authenticate: {}",
                other.kind_name()
            ))),
            Err(_) => Err(failed("connection lost while authenticating".to_string())),
        }
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

fn fail_all(pending: &Mutex<BTreeMap<u64, Pending>>, dead: &AtomicBool) {
    dead.store(true, Ordering::SeqCst);
    if let Ok(mut pending) = pending.lock() {
        // Dropping the senders wakes every waiting call with "lost".
        pending.clear();
    }
}

async fn lane_writer(
    mut send: quinn::SendStream,
    mut queued: mpsc::Receiver<Request>,
    frame_requests_max: usize,
    pending: Arc<Mutex<BTreeMap<u64, Pending>>>,
    dead: Arc<AtomicBool>,
) {
    while let Some(first) = queued.recv().await {
        let mut requests = vec![first];
        while requests.len() < frame_requests_max {
            match queued.try_recv() {
                Ok(next) => requests.push(next),
                Err(_) => break,
            }
        }
        for frame in encode_frames(requests, &pending) {
            if send.write_all(&frame).await.is_err() {
                fail_all(&pending, &dead);
                return;
            }
        }
    }
    let _ = send.finish();
}

/// Encodes requests into frames no larger than the protocol allows; a single request too large
/// for a frame is answered locally with `INVALID_ARGUMENT`.
fn encode_frames(requests: Vec<Request>, pending: &Mutex<BTreeMap<u64, Pending>>) -> Vec<Vec<u8>> {
    let (frames, too_large) = encode_frames_split(&requests);
    for index in too_large {
        let id = requests[index].id;
        let waiting = pending.lock().ok().and_then(|mut p| p.remove(&id));
        if let Some(waiting) = waiting {
            let _ = waiting.answer.send(Err(WireError::new(
                ErrorCode::InvalidArgument,
                format!("the request does not fit in a frame of {CLIENT_FRAME_BYTES_MAX} bytes"),
            )));
        }
    }
    frames
}

async fn lane_reader(
    mut recv: quinn::RecvStream,
    pending: Arc<Mutex<BTreeMap<u64, Pending>>>,
    dead: Arc<AtomicBool>,
    faults: Arc<FaultInjector>,
) {
    let mut length = [0u8; 4];
    let mut body = Vec::new();
    loop {
        if recv.read_exact(&mut length).await.is_err() {
            break;
        }
        let len = u32::from_le_bytes(length) as usize;
        if len == 0 || len > CLIENT_FRAME_BYTES_MAX {
            debug!(
                len,
                "a node sent a frame of a bad length; dropping the connection"
            );
            break;
        }
        body.resize(len, 0);
        if recv.read_exact(&mut body).await.is_err() {
            break;
        }
        let frame = match decode_response_frame(&body) {
            Ok(frame) => frame,
            Err(error) => {
                debug!("undecodable response frame: {error}");
                break;
            }
        };
        let Ok(mut waiting) = pending.lock() else {
            break;
        };
        for response in frame.responses {
            if let Some(entry) = waiting.remove(&response.id) {
                if faults.take_drop(entry.op) {
                    debug!(id = response.id, "fault injection: dropped a response");
                    continue;
                }
                let _ = entry.answer.send(response.result);
            }
        }
    }
    fail_all(&pending, &dead);
}
