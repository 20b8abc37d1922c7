//! A node that crashed and restarted resets, as soon as a packet arrives on one, the QUIC
//! connections its peers still hold to its previous incarnation, whichever side dialled them: its
//! connection ids are tagged under a key derived from its private key, so it recognises them
//! (with quinn's default random key it dropped their packets as invalid and the connections
//! lived until the 10 s idle timeout), and its stateless resets are keyed the same way.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tenure_transport::bind_endpoint;
use tenure_transport::certs::generate_cluster_ca;
use tenure_transport::tls::{NodeTls, node_server_name};

use super::bad_input::{free_port, node_tls};

fn transport() -> Arc<quinn::TransportConfig> {
    let mut transport = quinn::TransportConfig::default();
    transport.max_idle_timeout(Some(Duration::from_secs(10).try_into().unwrap()));
    transport.keep_alive_interval(Some(Duration::from_millis(500)));
    Arc::new(transport)
}

/// A node's endpoint, serving, on its own runtime: dropping the runtime is a crash (nothing is
/// sent, the socket goes away).
struct Incarnation {
    runtime: tokio::runtime::Runtime,
    endpoint: quinn::Endpoint,
}

impl Incarnation {
    /// Started from a plain thread: a runtime cannot be started from within another.
    fn start(tls: &NodeTls, addr: SocketAddr) -> Incarnation {
        std::thread::scope(|scope| scope.spawn(|| Self::start_here(tls, addr)).join().unwrap())
    }

    fn start_here(tls: &NodeTls, addr: SocketAddr) -> Incarnation {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let endpoint = runtime.block_on(async {
            let endpoint = bind_endpoint(addr, tls).unwrap();
            endpoint.set_server_config(Some(tls.quinn_server_config(transport()).unwrap()));
            let acceptor = endpoint.clone();
            tokio::spawn(async move {
                while let Some(incoming) = acceptor.accept().await {
                    tokio::spawn(async move {
                        let Ok(connection) = incoming.await else {
                            return;
                        };
                        // Read (and drop) whatever the peer sends, until it goes.
                        while let Ok(mut recv) = connection.accept_uni().await {
                            tokio::spawn(async move {
                                while let Ok(Some(_)) = recv.read_chunk(1 << 16, true).await {}
                            });
                        }
                    });
                }
            });
            endpoint
        });
        Incarnation { runtime, endpoint }
    }

    /// Dials `addr` (node `node`) from this incarnation's endpoint and keeps the connection
    /// open (the incarnation's runtime owns it).
    fn dial(&self, tls: &NodeTls, addr: SocketAddr, node: u64) -> std::thread::JoinHandle<()> {
        let endpoint = self.endpoint.clone();
        let config = tls.quinn_client_config(transport()).unwrap();
        let handle = self.runtime.handle().clone();
        std::thread::spawn(move || {
            handle.block_on(async move {
                let connection = endpoint
                    .connect_with(config, addr, &node_server_name(node))
                    .unwrap()
                    .await
                    .unwrap();
                // Held until the crash.
                tokio::spawn(async move {
                    connection.closed().await;
                });
            });
        })
    }

    /// Drops the runtime and with it every task (nothing is sent); returns once they are gone,
    /// so the port is free again. From a plain thread: the caller may be inside a runtime.
    fn crash(self) {
        drop(self.endpoint);
        let runtime = self.runtime;
        std::thread::spawn(move || runtime.shutdown_timeout(Duration::from_secs(5)))
            .join()
            .unwrap();
    }
}

/// Runs a node that crashes and restarts (node 2, same key, same port) and a surviving node
/// (node 1) with a connection between them, dialled by the crashing node or by the survivor; returns how long after the
/// restart the survivor's old connection closed, and why. The survivor keeps sending into it,
/// as a leader's heartbeats would.
fn survivor_connection_after_restart(
    crashing_node_dials: bool,
) -> (Duration, quinn::ConnectionError) {
    let ca = generate_cluster_ca("tenure-test").unwrap();
    let tls_crashing = node_tls(&ca, 2);
    let tls_surviving = node_tls(&ca, 1);
    let crashing_addr = free_port();
    let surviving_addr = free_port();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let survivor = runtime.block_on(async {
        let mut endpoint = bind_endpoint(surviving_addr, &tls_surviving).unwrap();
        endpoint.set_server_config(Some(
            tls_surviving.quinn_server_config(transport()).unwrap(),
        ));
        endpoint.set_default_client_config(tls_surviving.quinn_client_config(transport()).unwrap());
        endpoint
    });
    let first = Incarnation::start(&tls_crashing, crashing_addr);
    let connection = runtime.block_on(async {
        if crashing_node_dials {
            let dialled = first.dial(&tls_crashing, surviving_addr, 1);
            let accepted = tokio::time::timeout(Duration::from_secs(10), async {
                survivor.accept().await.unwrap().await.unwrap()
            })
            .await
            .expect("the crashing node's dial never arrived");
            dialled.join().unwrap();
            accepted
        } else {
            survivor
                .connect(crashing_addr, &node_server_name(2))
                .unwrap()
                .await
                .unwrap()
        }
    });
    runtime.block_on(async {
        let mut send = connection.open_uni().await.unwrap();
        send.write_all(b"hello").await.unwrap();
        // As a long-lived link is: the handshake confirmed and the survivor on a connection id
        // the restarted node issued with a reset token (a client's handshake id has none, so a
        // server can recognise its resets only after the first NEW_CONNECTION_ID).
        let settled = Instant::now() + Duration::from_secs(10);
        loop {
            let frames = connection.stats().frame_rx;
            // A server confirms the handshake itself; a client learns it from HANDSHAKE_DONE.
            let confirmed = crashing_node_dials || frames.handshake_done > 0;
            if confirmed && frames.new_connection_id > 0 {
                break;
            }
            assert!(
                Instant::now() < settled,
                "the connection never settled: {frames:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }

        first.crash();
        let second = Incarnation::start(&tls_crashing, crashing_addr);
        let restarted = Instant::now();
        let writer = tokio::spawn(async move {
            loop {
                if send.write_all(&[0u8; 64]).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        let reason = tokio::time::timeout(Duration::from_secs(15), connection.closed())
            .await
            .expect("the old connection never closed");
        let took = restarted.elapsed();
        writer.abort();
        second.crash();
        survivor.close(0u32.into(), b"done");
        (took, reason)
    })
}

#[test]
fn a_restarted_node_resets_the_connection_its_survivor_dialled() {
    let (took, reason) = survivor_connection_after_restart(false);
    println!("restart reset (survivor dialled): old connection closed after {took:?}: {reason}");
    assert!(
        matches!(reason, quinn::ConnectionError::Reset),
        "closed by {reason}, not by a stateless reset"
    );
    assert!(took < Duration::from_secs(2), "took {took:?}");
}

#[test]
fn a_restarted_node_resets_the_connection_it_had_dialled() {
    let (took, reason) = survivor_connection_after_restart(true);
    println!(
        "restart reset (restarted node dialled): old connection closed after {took:?}: {reason}"
    );
    assert!(
        matches!(reason, quinn::ConnectionError::Reset),
        "closed by {reason}, not by a stateless reset"
    );
    assert!(took < Duration::from_secs(2), "took {took:?}");
}
