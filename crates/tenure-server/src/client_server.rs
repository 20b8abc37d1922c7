//! The QUIC side of the native client protocol (`tenure_proto::client`): connections arrive
//! from the transport's endpoint (ALPN `tenure-client/1`); each bidirectional stream carries
//! request frames one way and response frames the other. Requests of a stream run concurrently
//! (at most `STREAM_INFLIGHT_MAX`); every response ready when the writer wakes goes into one
//! frame.
//!
//! Identity per connection: a cluster node certificate marks a forwarding node (its requests
//! name the principal they act for); otherwise the connection authenticates with a bearer token
//! (`Authenticate`), or, in insecure development mode only, requests may name their principal.
//!
//! Must not depend on: the groups (it calls `Service`).

use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use tenure_core::ErrorCode;
use tenure_proto::client::{
    CLIENT_FRAME_BYTES_MAX, Principal, Request, RequestBody, Response, ResponseBody, WireError,
    decode_request_frame, encode_frames_split,
};
use tenure_transport::ClientAcceptor;
use tenure_transport::tls::verify_peer_node_id;
use tokio::sync::{Semaphore, mpsc};
use tracing::{debug, warn};

use crate::forward::read_frame_body;
use crate::node::NodeShared;
use crate::service::{RequestContext, Service};

/// Requests of one stream handled at once at most; further frames wait (back-pressure).
pub const STREAM_INFLIGHT_MAX: usize = 4_096;

/// Longest timeout a request may ask for.
const REQUEST_TIMEOUT_MAX: Duration = Duration::from_secs(60);

/// Stream reset code for a stream that sent a bad frame.
const STREAM_PROTOCOL_ERROR: u32 = 2;

/// Routes client connections to the service once the node is up.
///
/// It holds the node weakly: the transport holds it, and the node holds the transport, so a
/// strong reference would keep a stopped node (its endpoint, its socket) alive forever. That
/// matters where nodes restart inside one process (the deterministic simulation).
#[derive(Default)]
pub struct ClientServer {
    service: OnceLock<(Weak<NodeShared>, Vec<u64>)>,
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

    /// Starts serving with `service`; `members` are the node ids whose certificates mark
    /// forwarding nodes.
    pub fn set_service(&self, service: Service, members: Vec<u64>) {
        let _ = self.service.set((Arc::downgrade(&service.inner), members));
    }
}

impl ClientAcceptor for ClientServer {
    fn accept(&self, connection: quinn::Connection) {
        let Some((node, members)) = self.service.get() else {
            connection.close(3u32.into(), b"node is starting");
            return;
        };
        let Some(inner) = node.upgrade() else {
            connection.close(3u32.into(), b"node is stopping");
            return;
        };
        let service = Service { inner };
        let members = members.clone();
        tokio::spawn(serve_connection(service, members, connection));
    }
}

/// Who a connection acts for.
#[derive(Debug)]
enum Identity {
    /// A cluster node forwarding for the principals its requests name.
    Node(u64),
    /// A client; `None` until it authenticates.
    Client(Mutex<Option<Principal>>),
}

fn node_identity(connection: &quinn::Connection, members: &[u64]) -> Option<u64> {
    connection.peer_identity()?;
    members
        .iter()
        .copied()
        .find(|&node| verify_peer_node_id(connection.peer_identity(), node).is_ok())
}

async fn serve_connection(service: Service, members: Vec<u64>, connection: quinn::Connection) {
    let identity = Arc::new(match node_identity(&connection, &members) {
        Some(node) => {
            debug!(node, remote = %connection.remote_address(), "forwarding node connected");
            Identity::Node(node)
        }
        None => Identity::Client(Mutex::new(None)),
    });
    loop {
        match connection.accept_bi().await {
            Ok((send, recv)) => {
                tokio::spawn(serve_stream(service.clone(), identity.clone(), send, recv));
            }
            Err(error) => {
                debug!(remote = %connection.remote_address(), "client connection ended: {error}");
                return;
            }
        }
    }
}

async fn serve_stream(
    service: Service,
    identity: Arc<Identity>,
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
) {
    let (responses, mut pending) = mpsc::channel::<Response>(STREAM_INFLIGHT_MAX);
    let writer = tokio::spawn(async move {
        while let Some(first) = pending.recv().await {
            let mut batch = vec![first];
            while let Ok(next) = pending.try_recv() {
                batch.push(next);
                if batch.len() >= 1_024 {
                    break;
                }
            }
            for frame in encode_response_frames(batch) {
                if send.write_all(&frame).await.is_err() {
                    return;
                }
            }
        }
        let _ = send.finish();
    });
    let permits = Arc::new(Semaphore::new(STREAM_INFLIGHT_MAX));
    loop {
        let body = match read_frame_body(&mut recv, CLIENT_FRAME_BYTES_MAX).await {
            Ok(Some(body)) => body,
            Ok(None) => break,
            Err(reason) => {
                warn!("closing a client stream: {reason}");
                let _ = recv.stop(STREAM_PROTOCOL_ERROR.into());
                break;
            }
        };
        let frame = match decode_request_frame(&body) {
            Ok(frame) => frame,
            Err(error) => {
                warn!("closing a client stream: undecodable request frame: {error}");
                let _ = recv.stop(STREAM_PROTOCOL_ERROR.into());
                break;
            }
        };
        for request in frame.requests {
            let Ok(permit) = permits.clone().acquire_owned().await else {
                break;
            };
            let service = service.clone();
            let identity = identity.clone();
            let responses = responses.clone();
            tokio::spawn(async move {
                let id = request.id;
                let result = handle_request(&service, &identity, request).await;
                let _ = responses.send(Response { id, result }).await;
                drop(permit);
            });
        }
    }
    drop(responses);
    let _ = writer.await;
}

/// Encodes responses into frames within the protocol's bound; a single response that does not
/// fit is replaced by an `INTERNAL` error, so every request still gets an answer.
fn encode_response_frames(responses: Vec<Response>) -> Vec<Vec<u8>> {
    let (mut frames, too_large) = encode_frames_split(&responses);
    if !too_large.is_empty() {
        warn!(
            "{} response(s) do not fit in a frame; answering INTERNAL",
            too_large.len()
        );
        let replacements: Vec<Response> = too_large
            .into_iter()
            .map(|index| Response {
                id: responses[index].id,
                result: Err(WireError::new(
                    ErrorCode::Internal,
                    format!(
                        "the answer does not fit in a frame of {CLIENT_FRAME_BYTES_MAX} bytes; ask for less (a smaller page)"
                    ),
                )),
            })
            .collect();
        frames.extend(encode_frames_split(&replacements).0);
    }
    frames
}

fn unauthorized() -> WireError {
    WireError::new(
        ErrorCode::Unauthorized,
        "authenticate the connection first (Authenticate with a bearer token)",
    )
}

async fn handle_request(
    service: &Service,
    identity: &Identity,
    request: Request,
) -> Result<ResponseBody, WireError> {
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
        let principal = service.authenticator().authenticate_bearer(token)?;
        if let Ok(mut bound) = bound.lock() {
            *bound = Some(principal.clone());
        }
        return Ok(ResponseBody::Authenticated(principal));
    }
    let insecure = service.authenticator().insecure_dev_mode();
    let principal = match identity {
        Identity::Node(node) => {
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
                (None, _) if matches!(body, RequestBody::Routing | RequestBody::Status) => {
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
            },
            body,
        )
        .await
}
