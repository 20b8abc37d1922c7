//! QUIC over turmoil: the real quinn endpoint on a simulated UDP socket.
//!
//! [`SimUdp`] adapts `turmoil::net::UdpSocket` to quinn's `AsyncUdpSocket`: a batch with a
//! segment size is sent as separate datagrams, send errors count as loss (as quinn-udp treats
//! them), ECN is not modelled, and a receive waits on the socket's readiness. [`endpoint`]
//! builds an endpoint whose every random choice (reset key, connection ids, the endpoint's own
//! generator) comes from a seed, on quinn's tokio runtime, which reads tokio's simulated clock.
//!
//! Must not depend on: the lease service (only bytes and addresses).

use std::fmt;
use std::future::Future;
use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use quinn::udp::{RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, ConnectionId, ConnectionIdGenerator, EndpointConfig, UdpPoller};
use rand::rngs::SmallRng;
use rand::{Rng as _, SeedableRng as _};

type Readable = Pin<Box<dyn Future<Output = io::Result<()>> + Send>>;

/// A turmoil UDP socket as quinn's socket.
pub struct SimUdp {
    socket: Arc<turmoil::net::UdpSocket>,
    local: SocketAddr,
    /// The pending readiness wait, kept across polls (it holds the socket's receive lock).
    readable: Mutex<Option<Readable>>,
}

impl fmt::Debug for SimUdp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimUdp")
            .field("local", &self.local)
            .finish()
    }
}

impl SimUdp {
    /// Binds `addr` on the current simulated host.
    pub async fn bind(addr: SocketAddr) -> io::Result<Arc<SimUdp>> {
        let socket = turmoil::net::UdpSocket::bind(addr).await?;
        let local = socket.local_addr()?;
        Ok(Arc::new(SimUdp {
            socket: Arc::new(socket),
            local,
            readable: Mutex::new(None),
        }))
    }
}

#[derive(Debug)]
struct AlwaysWritable;

impl UdpPoller for AlwaysWritable {
    fn poll_writable(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        // turmoil never pushes back on a send.
        Poll::Ready(Ok(()))
    }
}

impl AsyncUdpSocket for SimUdp {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        Box::pin(AlwaysWritable)
    }

    fn try_send(&self, transmit: &Transmit<'_>) -> io::Result<()> {
        if !turmoil::in_simulation() {
            // A close sent while the endpoint is dropped outside a simulated step: lost.
            return Ok(());
        }
        let segment = transmit
            .segment_size
            .unwrap_or(transmit.contents.len())
            .max(1);
        for datagram in transmit.contents.chunks(segment) {
            // An unreachable destination is a lost datagram, as for a real socket.
            let _ = self.socket.try_send_to(datagram, transmit.destination);
        }
        Ok(())
    }

    fn poll_recv(
        &self,
        cx: &mut Context<'_>,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        loop {
            let mut received = 0;
            while received < bufs.len().min(meta.len()) {
                match self.socket.try_recv_from(&mut bufs[received]) {
                    Ok((len, addr)) => {
                        meta[received] = RecvMeta {
                            addr,
                            len,
                            stride: len,
                            ecn: None,
                            dst_ip: None,
                        };
                        received += 1;
                    }
                    Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
                    Err(error) => return Poll::Ready(Err(error)),
                }
            }
            if received > 0 {
                return Poll::Ready(Ok(received));
            }
            let mut slot = self
                .readable
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let wait = slot.get_or_insert_with(|| {
                let socket = self.socket.clone();
                Box::pin(async move { socket.readable().await })
            });
            match wait.as_mut().poll(cx) {
                Poll::Ready(result) => {
                    // The wait released the receive lock: take the datagram.
                    *slot = None;
                    result?;
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }
}

/// Connection ids from a seeded generator.
struct SeededIds {
    rng: SmallRng,
}

impl ConnectionIdGenerator for SeededIds {
    fn generate_cid(&mut self) -> ConnectionId {
        ConnectionId::new(&self.rng.random::<[u8; 8]>())
    }

    fn cid_len(&self) -> usize {
        8
    }

    fn cid_lifetime(&self) -> Option<std::time::Duration> {
        None
    }
}

/// A quinn endpoint on a [`SimUdp`] bound to `addr`, every random choice from `seed`. Servers
/// install their configuration on it afterwards (the transport does). Must run on a simulated
/// host.
///
/// `reset_key` authenticates its stateless resets: a node's must stay the same across restarts
/// (as `tenure_transport::bind_endpoint` keeps it), so its peers drop their connections to its
/// previous incarnation at once. The seeded connection ids here are never refused as invalid;
/// `bind_endpoint`'s are hashed with a key that is also the same across restarts, so a restarted
/// node answers its previous incarnation's ids with a reset too (with quinn's default random key
/// it dropped them, and the simulation could not see that).
pub async fn endpoint(
    seed: u64,
    reset_key: ring::hmac::Key,
    addr: SocketAddr,
) -> io::Result<quinn::Endpoint> {
    let socket = SimUdp::bind(addr).await?;
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut config = EndpointConfig::new(Arc::new(reset_key));
    config.rng_seed(Some(rng.random()));
    let ids = Mutex::new(SmallRng::seed_from_u64(rng.random()));
    config.cid_generator(move || {
        let seed = ids
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .random();
        Box::new(SeededIds {
            rng: SmallRng::seed_from_u64(seed),
        })
    });
    quinn::Endpoint::new_with_abstract_socket(config, None, socket, Arc::new(quinn::TokioRuntime))
}

/// A stateless-reset key from a seed.
pub fn reset_key(seed: u64) -> ring::hmac::Key {
    let key: [u8; 32] = SmallRng::seed_from_u64(seed).random();
    ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &key)
}
