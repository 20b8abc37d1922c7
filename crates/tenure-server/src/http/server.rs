//! The HTTP gateway's connection handling: the accept loop, the connection caps and the
//! per-connection timeouts that keep an unauthenticated client from holding a node's file
//! descriptors or memory (issue 19, "HTTP slowloris and file-descriptor exhaustion").
//!
//! - At most [`ServerLimits::connections_max`] connections are served at once, and at most
//!   [`ServerLimits::connections_per_source_max`] from one source IP address. A connection beyond
//!   either cap gets a fixed `503` answer (written without waiting) and is closed at once: it
//!   never waits in the process holding a descriptor. The node's descriptor limit is checked at
//!   startup against these caps (`crate::serve::check_descriptor_limit`), so the HTTP side can
//!   never take the descriptors RocksDB needs.
//! - hyper's HTTP/1.1 server runs with a tokio timer and a header read timeout: a connection that
//!   does not deliver a complete request header within [`ServerLimits::header_read_timeout`] of
//!   starting to wait for one (a slowloris client, or an idle keep-alive connection) is closed.
//! - A request body must arrive within [`ServerLimits::body_read_timeout`] (enforced where the
//!   gateway reads bodies), and a response write that makes no progress for that long closes the
//!   connection ([`StallIo`]): a client that never reads its answers cannot pin a connection.
//!
//! Must not depend on: the lease routes or the service (it serves any axum [`Router`]).

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};

use crate::config::LimitsConfig;
use crate::metrics as m;

/// Largest read buffer hyper keeps per connection (request line and headers must fit in it).
pub const READ_BUFFER_BYTES_MAX: usize = 64 * 1024;
/// Most request headers accepted.
pub const HEADERS_MAX: usize = 100;
/// How long a graceful shutdown waits for open connections to finish.
const SHUTDOWN_DRAIN: Duration = Duration::from_secs(10);
/// Pause after an accept error other than a per-connection one (e.g. out of descriptors).
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);
/// The answer of a connection beyond a cap (then closed).
const REFUSED_RESPONSE: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
connection: close\r\nretry-after: 1\r\ncontent-length: 110\r\n\r\n\
{\"code\":\"UNAVAILABLE\",\"message\":\"too many HTTP connections to this node\",\"retryable\":true,\"leader_hint\":null}\n";

/// The connection caps and timeouts of the HTTP server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerLimits {
    /// Concurrent connections at most.
    pub connections_max: usize,
    /// Concurrent connections from one source IP address at most.
    pub connections_per_source_max: usize,
    /// Longest wait for a complete request header, from the moment the connection waits for a
    /// request (also the keep-alive idle timeout).
    pub header_read_timeout: Duration,
    /// Longest time a request body may take to arrive, and a response write may stall.
    pub body_read_timeout: Duration,
}

impl ServerLimits {
    /// The limits a node's `[limits]` section sets.
    pub fn from_config(limits: &LimitsConfig) -> Self {
        ServerLimits {
            connections_max: usize::try_from(limits.http_connections_max).unwrap_or(usize::MAX),
            connections_per_source_max: usize::try_from(limits.http_connections_per_source_max)
                .unwrap_or(usize::MAX),
            header_read_timeout: Duration::from_millis(limits.http_header_read_timeout_ms),
            body_read_timeout: Duration::from_millis(limits.http_body_read_timeout_ms),
        }
    }
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits::from_config(&LimitsConfig::default())
    }
}

/// Counts open connections, in total and per source address.
#[derive(Debug)]
struct Gate {
    limits: ServerLimits,
    open: Mutex<GateCounts>,
    /// Notified when the last connection closes.
    drained: Notify,
}

#[derive(Debug, Default)]
struct GateCounts {
    total: usize,
    per_source: HashMap<IpAddr, usize>,
}

/// One admitted connection; dropping it frees its place.
#[derive(Debug)]
struct Permit {
    gate: Arc<Gate>,
    source: IpAddr,
}

impl Gate {
    fn lock(&self) -> std::sync::MutexGuard<'_, GateCounts> {
        self.open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A place for a connection from `source`, if both caps allow.
    fn admit(self: &Arc<Self>, source: IpAddr) -> Option<Permit> {
        let mut counts = self.lock();
        if counts.total >= self.limits.connections_max {
            return None;
        }
        let from_source = counts.per_source.entry(source).or_insert(0);
        if *from_source >= self.limits.connections_per_source_max {
            return None;
        }
        *from_source += 1;
        counts.total += 1;
        ::metrics::gauge!(m::HTTP_CONNECTIONS_OPEN).increment(1.0);
        Some(Permit {
            gate: self.clone(),
            source,
        })
    }

    fn total(&self) -> usize {
        self.lock().total
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut counts = self.gate.lock();
        if let Some(from_source) = counts.per_source.get_mut(&self.source) {
            *from_source = from_source.saturating_sub(1);
            if *from_source == 0 {
                counts.per_source.remove(&self.source);
            }
        }
        counts.total = counts.total.saturating_sub(1);
        ::metrics::gauge!(m::HTTP_CONNECTIONS_OPEN).decrement(1.0);
        if counts.total == 0 {
            self.gate.drained.notify_waiters();
        }
    }
}

/// An accept error that concerns only the connection being accepted (the loop goes on at once).
fn is_connection_error(error: &std::io::Error) -> bool {
    matches!(
        error.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
    )
}

/// Serves `app` on `listener` within `limits` until `shutdown` completes; then stops accepting,
/// lets every connection finish its request in flight (at most [`SHUTDOWN_DRAIN`]) and returns.
pub async fn serve_router(
    listener: TcpListener,
    app: Router,
    limits: ServerLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let gate = Arc::new(Gate {
        limits,
        open: Mutex::new(GateCounts::default()),
        drained: Notify::new(),
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(true)
        .max_buf_size(READ_BUFFER_BYTES_MAX)
        .max_headers(HEADERS_MAX);
    let builder = Arc::new(builder);
    let (closing, closing_watch) = watch::channel(false);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) if is_connection_error(&error) => continue,
                Err(error) => {
                    tracing::warn!(%error, "http: accept failed");
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                    continue;
                }
            },
        };
        let Some(permit) = gate.admit(peer.ip()) else {
            refuse(&stream);
            ::metrics::counter!(m::HTTP_CONNECTIONS_REFUSED_TOTAL).increment(1);
            tracing::debug!(%peer, "http: connection refused (connection cap)");
            continue;
        };
        if let Err(error) = stream.set_nodelay(true) {
            tracing::trace!(%error, "http: cannot set TCP_NODELAY");
        }
        let io = TokioIo::new(StallIo::new(stream, limits.body_read_timeout));
        let service = TowerToHyperService::new(app.clone());
        let builder = builder.clone();
        let mut closing = closing_watch.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let connection = builder.serve_connection(io, service);
            let mut connection = std::pin::pin!(connection);
            let closing_now = async move {
                // The guard is dropped here, before the connection is awaited again.
                let _ = closing.wait_for(|closing| *closing).await;
            };
            let result = tokio::select! {
                result = connection.as_mut() => result,
                () = closing_now => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            if let Err(error) = result {
                tracing::debug!(%peer, %error, "http: connection ended");
            }
        });
    }
    drop(listener);
    let _ = closing.send(true);
    let drained = async {
        loop {
            let notified = gate.drained.notified();
            if gate.total() == 0 {
                return;
            }
            notified.await;
        }
    };
    if tokio::time::timeout(SHUTDOWN_DRAIN, drained).await.is_err() {
        tracing::warn!(
            open = gate.total(),
            "http: connections still open after the shutdown drain"
        );
    }
    Ok(())
}

/// Answers a refused connection without waiting, then closes it (by dropping it).
fn refuse(stream: &TcpStream) {
    let _ = stream.try_write(REFUSED_RESPONSE);
}

/// A TCP stream whose writes fail with `TimedOut` when they make no progress for `stall`
/// (a peer that stopped reading). Reads are not bounded here: hyper's header read timeout and
/// the gateway's body read timeout bound them.
#[derive(Debug)]
pub struct StallIo {
    stream: TcpStream,
    stall: Duration,
    /// Armed while a write is blocked.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl StallIo {
    /// Wraps `stream`.
    pub fn new(stream: TcpStream, stall: Duration) -> Self {
        StallIo {
            stream,
            stall,
            deadline: None,
        }
    }

    /// After a write-side poll: disarms on progress, arms or checks the deadline when blocked.
    fn after_write<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<std::io::Result<T>>,
    ) -> Poll<std::io::Result<T>> {
        if polled.is_ready() {
            self.deadline = None;
            return polled;
        }
        let stall = self.stall;
        let deadline = self
            .deadline
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(stall)));
        match deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "http: the peer has not read its answer for too long",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncRead for StallIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for StallIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.after_write(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.after_write(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let polled = Pin::new(&mut self.stream).poll_flush(cx);
        self.after_write(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let polled = Pin::new(&mut self.stream).poll_shutdown(cx);
        self.after_write(cx, polled)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn limits(total: usize, per_source: usize) -> ServerLimits {
        ServerLimits {
            connections_max: total,
            connections_per_source_max: per_source,
            ..ServerLimits::default()
        }
    }

    #[test]
    fn the_gate_caps_connections_in_total_and_per_source() {
        let gate = Arc::new(Gate {
            limits: limits(3, 2),
            open: Mutex::new(GateCounts::default()),
            drained: Notify::new(),
        });
        let a: IpAddr = "127.0.0.2".parse().unwrap();
        let b: IpAddr = "127.0.0.3".parse().unwrap();
        let first = gate.admit(a).unwrap();
        let _second = gate.admit(a).unwrap();
        assert!(gate.admit(a).is_none(), "per-source cap");
        let _third = gate.admit(b).unwrap();
        assert!(gate.admit(b).is_none(), "total cap");
        drop(first);
        assert!(
            gate.admit(b).is_some(),
            "a closed connection frees its place"
        );
    }

    #[test]
    fn the_refusal_is_a_complete_http_answer() {
        let text = std::str::from_utf8(REFUSED_RESPONSE).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        let length: usize = head
            .lines()
            .find_map(|line| line.strip_prefix("content-length: "))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(body.len(), length);
        let json: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(json["code"], "UNAVAILABLE");
    }
}
