#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Mutual TLS of peer links over real quinn endpoints on 127.0.0.1: nodes of one cluster CA
//! connect and talk; a client with another CA's certificate, a client without a certificate and a
//! server with the wrong node's certificate are all refused; certificate files are written with
//! private keys 0600, load back, and are never overwritten.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use quinn::crypto::rustls::QuicClientConfig;
use quinn::{Connection, Endpoint, TransportConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tenure_transport::certs::{
    ClusterCa, NodeCertificate, generate_cluster_ca, issue_node_certificate,
    write_cluster_certificates,
};
use tenure_transport::tls::{NodeTls, PEER_ALPN, TlsError, node_server_name, verify_peer_node_id};
use tokio::time::timeout;

/// Bound on every network wait; a refused handshake ends in milliseconds on loopback.
const WAIT: Duration = Duration::from_secs(10);

const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

fn transport() -> Arc<TransportConfig> {
    Arc::new(TransportConfig::default())
}

fn node(ca: &ClusterCa, node_id: u64) -> (NodeCertificate, NodeTls) {
    let cert = issue_node_certificate(ca, node_id, &[LOCALHOST]).unwrap();
    let tls = NodeTls::from_pem(node_id, &ca.cert_pem, &cert.cert_pem, &cert.key_pem).unwrap();
    (cert, tls)
}

fn server_endpoint(tls: &NodeTls) -> Endpoint {
    let config = tls.quinn_server_config(transport()).unwrap();
    Endpoint::server(config, SocketAddr::new(LOCALHOST, 0)).unwrap()
}

fn client_endpoint() -> Endpoint {
    Endpoint::client(SocketAddr::new(LOCALHOST, 0)).unwrap()
}

/// Serves one connection: checks that the client is node `claimed_node_id` (and not another) and
/// that ALPN is [`PEER_ALPN`], then answers every bidirectional stream with its own bytes until
/// the client closes the connection.
async fn echo_server(endpoint: Endpoint, claimed_node_id: u64) -> anyhow::Result<()> {
    let incoming = endpoint.accept().await.expect("endpoint closed");
    let conn = incoming.await?;
    verify_peer_node_id(conn.peer_identity(), claimed_node_id)?;
    assert!(matches!(
        verify_peer_node_id(conn.peer_identity(), claimed_node_id + 100),
        Err(TlsError::PeerNodeMismatch { claimed_node_id: id, .. }) if id == claimed_node_id + 100
    ));
    assert_eq!(
        conn.handshake_data()
            .unwrap()
            .downcast::<quinn::crypto::rustls::HandshakeData>()
            .unwrap()
            .protocol,
        Some(PEER_ALPN.to_vec())
    );
    loop {
        match conn.accept_bi().await {
            Ok((mut send, mut recv)) => {
                let data = recv.read_to_end(1 << 16).await?;
                send.write_all(&data).await?;
                send.finish()?;
            }
            Err(quinn::ConnectionError::ApplicationClosed(_)) => return Ok(()),
            Err(err) => return Err(err.into()),
        }
    }
}

/// Sends `payload` on a new bidirectional stream and returns the answer.
async fn echo(conn: &Connection, payload: &[u8]) -> anyhow::Result<Vec<u8>> {
    let (mut send, mut recv) = conn.open_bi().await?;
    send.write_all(payload).await?;
    send.finish()?;
    Ok(recv.read_to_end(1 << 16).await?)
}

/// Connects a node to another node's echo server over loopback, checks identities on both sides
/// and that a stream echoes.
async fn connect_and_echo(client: &NodeTls, server: &NodeTls) {
    let server_endpoint = server_endpoint(server);
    let server_addr = server_endpoint.local_addr().unwrap();
    let server_task = tokio::spawn(echo_server(server_endpoint.clone(), client.node_id()));

    let mut client_endpoint = client_endpoint();
    client_endpoint.set_default_client_config(client.quinn_client_config(transport()).unwrap());
    let conn = timeout(
        WAIT,
        client_endpoint
            .connect(server_addr, &node_server_name(server.node_id()))
            .unwrap(),
    )
    .await
    .expect("handshake timed out")
    .expect("handshake failed");

    verify_peer_node_id(conn.peer_identity(), server.node_id()).unwrap();
    assert!(matches!(
        verify_peer_node_id(conn.peer_identity(), client.node_id()),
        Err(TlsError::PeerNodeMismatch { .. })
    ));

    let answer = timeout(WAIT, echo(&conn, b"append entries, please"))
        .await
        .expect("echo timed out")
        .expect("echo failed");
    assert_eq!(answer, b"append entries, please");

    conn.close(0u32.into(), b"done");
    timeout(WAIT, server_task)
        .await
        .expect("server did not finish")
        .unwrap()
        .expect("server side failed");
    timeout(WAIT, client_endpoint.wait_idle()).await.unwrap();
    server_endpoint.close(0u32.into(), b"done");
}

/// How one side of a connection attempt that must be refused ended.
#[derive(Debug)]
enum Outcome {
    /// The handshake failed, for this reason.
    HandshakeFailed(String),
    /// The handshake completed on this side but the connection died before a stream round trip.
    FailedAfterHandshake(String),
    /// A stream round trip worked: the test must fail.
    Worked,
}

impl Outcome {
    fn handshake_failed(&self) -> bool {
        match self {
            Outcome::HandshakeFailed(reason) => {
                eprintln!("refused during the handshake: {reason}");
                true
            }
            _ => false,
        }
    }

    fn refused(&self) -> bool {
        match self {
            Outcome::FailedAfterHandshake(reason) => {
                eprintln!("refused after the handshake: {reason}");
                true
            }
            _ => self.handshake_failed(),
        }
    }
}

/// The server side of an attempt that must be refused: accepts one incoming connection and, should
/// the handshake succeed, tries to serve a stream.
async fn refusing_server(endpoint: Endpoint) -> Outcome {
    let incoming = endpoint.accept().await.expect("endpoint closed");
    let conn = match incoming.await {
        Ok(conn) => conn,
        Err(err) => return Outcome::HandshakeFailed(err.to_string()),
    };
    let served = async {
        let (mut send, mut recv) = conn.accept_bi().await?;
        let data = recv.read_to_end(1 << 16).await?;
        send.write_all(&data).await?;
        send.finish()?;
        anyhow::Ok(())
    };
    match served.await {
        Ok(()) => Outcome::Worked,
        Err(err) => Outcome::FailedAfterHandshake(err.to_string()),
    }
}

/// The client side of an attempt that must be refused: connects and, should that succeed, tries a
/// stream round trip (with TLS 1.3 the client may finish its handshake before the server has
/// checked the client's certificate).
async fn refused_client(
    endpoint: &Endpoint,
    server_addr: SocketAddr,
    server_name: &str,
) -> Outcome {
    let conn = match endpoint.connect(server_addr, server_name).unwrap().await {
        Ok(conn) => conn,
        Err(err) => return Outcome::HandshakeFailed(err.to_string()),
    };
    match echo(&conn, b"let me in").await {
        Ok(_) => Outcome::Worked,
        Err(err) => Outcome::FailedAfterHandshake(err.to_string()),
    }
}

/// Runs a connection attempt that must be refused and asserts that neither side got a working
/// stream, that the server refused during the handshake, and that both sides learnt of the refusal
/// within [`WAIT`]. Returns the client's outcome.
async fn assert_refused(
    server: &NodeTls,
    client_config: quinn::ClientConfig,
    server_name: &str,
) -> Outcome {
    let server_endpoint = server_endpoint(server);
    let server_addr = server_endpoint.local_addr().unwrap();
    let server_task = tokio::spawn(refusing_server(server_endpoint.clone()));

    let mut client_endpoint = client_endpoint();
    client_endpoint.set_default_client_config(client_config);
    let client_outcome = timeout(
        WAIT,
        refused_client(&client_endpoint, server_addr, server_name),
    )
    .await
    .expect("client side neither failed nor succeeded in time");
    let server_outcome = timeout(WAIT, server_task)
        .await
        .expect("server side neither failed nor succeeded in time")
        .unwrap();
    // The server never accepts the connection; the client may complete its half of the
    // handshake before the server rejects its certificate, but then gets no answer.
    assert!(
        server_outcome.handshake_failed(),
        "server: {server_outcome:?}"
    );
    assert!(client_outcome.refused(), "client: {client_outcome:?}");

    client_endpoint.close(0u32.into(), b"done");
    server_endpoint.close(0u32.into(), b"done");
    client_outcome
}

/// A rustls client that trusts `ca` and presents `client_cert` (or no certificate at all).
fn custom_client_config(
    ca: &ClusterCa,
    client_cert: Option<&NodeCertificate>,
) -> quinn::ClientConfig {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca.cert_pem.as_bytes()).unwrap())
        .unwrap();
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots);
    let mut tls = match client_cert {
        Some(cert) => builder
            .with_client_auth_cert(
                vec![CertificateDer::from_pem_slice(cert.cert_pem.as_bytes()).unwrap()],
                PrivateKeyDer::from_pem_slice(cert.key_pem.as_bytes()).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    tls.alpn_protocols = vec![PEER_ALPN.to_vec()];
    quinn::ClientConfig::new(Arc::new(QuicClientConfig::try_from(tls).unwrap()))
}

#[tokio::test]
async fn nodes_of_one_ca_connect_and_echo() {
    let ca = generate_cluster_ca("test-cluster").unwrap();
    let (_, node1) = node(&ca, 1);
    let (_, node2) = node(&ca, 2);
    connect_and_echo(&node1, &node2).await;
    connect_and_echo(&node2, &node1).await;
}

#[tokio::test]
async fn client_certificate_from_another_ca_is_refused() {
    let ca = generate_cluster_ca("test-cluster").unwrap();
    let (_, server) = node(&ca, 2);
    // Same cluster name, hence the same CA subject name: only the CA key tells them apart.
    let foreign_ca = generate_cluster_ca("test-cluster").unwrap();
    let (foreign_cert, _) = node(&foreign_ca, 1);

    // NodeTls itself refuses to pair the cluster CA with a foreign certificate ...
    assert!(matches!(
        NodeTls::from_pem(
            1,
            &ca.cert_pem,
            &foreign_cert.cert_pem,
            &foreign_cert.key_pem
        ),
        Err(TlsError::NotIssuedByCa { .. })
    ));
    // ... so the intruder builds its client by hand: it trusts the cluster CA (and so accepts the
    // server) but presents the foreign certificate.
    let client = custom_client_config(&ca, Some(&foreign_cert));
    assert_refused(&server, client, &node_server_name(2)).await;
}

#[tokio::test]
async fn client_without_certificate_is_refused() {
    let ca = generate_cluster_ca("test-cluster").unwrap();
    let (_, server) = node(&ca, 2);
    let client = custom_client_config(&ca, None);
    assert_refused(&server, client, &node_server_name(2)).await;
}

#[tokio::test]
async fn server_with_another_nodes_certificate_is_refused() {
    let ca = generate_cluster_ca("test-cluster").unwrap();
    let (_, server) = node(&ca, 2);
    let (_, client) = node(&ca, 1);
    let client_config = client.quinn_client_config(transport()).unwrap();
    // The client means to reach node 3; whoever answers holds node 2's certificate.
    let client_outcome = assert_refused(&server, client_config, &node_server_name(3)).await;
    // Here the client itself refuses, during the handshake.
    assert!(
        client_outcome.handshake_failed(),
        "client: {client_outcome:?}"
    );
}

#[tokio::test]
async fn certificate_files_are_written_loaded_and_never_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let certs_dir = dir.path().join("certs");
    let paths =
        write_cluster_certificates(&certs_dir, "test-cluster", &[1, 2, 3], &[LOCALHOST]).unwrap();

    assert_eq!(paths.ca_cert, certs_dir.join("ca.pem"));
    assert_eq!(paths.ca_key, certs_dir.join("ca.key"));
    let ids: Vec<u64> = paths.nodes.iter().map(|(id, _, _)| *id).collect();
    assert_eq!(ids, [1, 2, 3]);
    for (id, cert, key) in &paths.nodes {
        assert_eq!(*cert, certs_dir.join(format!("node-{id}.pem")));
        assert_eq!(*key, certs_dir.join(format!("node-{id}.key")));
    }

    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode =
            |path: &std::path::Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&paths.ca_key), 0o600);
        for (_, cert, key) in &paths.nodes {
            assert_eq!(mode(key), 0o600, "{}", key.display());
            assert_eq!(mode(cert), 0o644, "{}", cert.display());
        }
        assert_eq!(mode(&paths.ca_cert), 0o644);
    }

    let loaded: Vec<NodeTls> = paths
        .nodes
        .iter()
        .map(|(id, cert, key)| NodeTls::load(*id, &paths.ca_cert, cert, key).unwrap())
        .collect();
    for (tls, (id, _, _)) in loaded.iter().zip(&paths.nodes) {
        assert_eq!(tls.node_id(), *id);
    }
    connect_and_echo(&loaded[0], &loaded[2]).await;

    // A node's files loaded under another node's id are refused, naming the file.
    let (_, cert1, key1) = &paths.nodes[0];
    match NodeTls::load(2, &paths.ca_cert, cert1, key1) {
        Err(err @ TlsError::NodeCertificateMismatch { node_id: 2, .. }) => {
            assert!(
                err.to_string().contains(&cert1.display().to_string()),
                "{err}"
            );
        }
        other => panic!("expected NodeCertificateMismatch, got {other:?}"),
    }
    // A missing file is an I/O error naming it.
    let missing = certs_dir.join("node-9.pem");
    assert!(matches!(
        NodeTls::load(9, &paths.ca_cert, &missing, key1),
        Err(TlsError::Io { path, .. }) if path == missing
    ));

    // The CA written can issue certificates for nodes added later.
    let ca = ClusterCa::load(&paths.ca_cert, &paths.ca_key).unwrap();
    let (_, node4) = node(&ca, 4);
    connect_and_echo(&node4, &loaded[1]).await;

    // A second run refuses to replace the CA key, and leaves every file as it was.
    let before: Vec<Vec<u8>> = [&paths.ca_cert, &paths.ca_key]
        .into_iter()
        .map(|path| std::fs::read(path).unwrap())
        .collect();
    match write_cluster_certificates(&certs_dir, "test-cluster", &[1, 2, 3], &[LOCALHOST]) {
        Err(TlsError::CaKeyExists { path }) => assert_eq!(path, paths.ca_key),
        other => panic!("expected CaKeyExists, got {other:?}"),
    }
    match write_cluster_certificates(&certs_dir, "test-cluster", &[4], &[]) {
        Err(TlsError::CaKeyExists { path }) => assert_eq!(path, paths.ca_key),
        other => panic!("expected CaKeyExists, got {other:?}"),
    }
    let after: Vec<Vec<u8>> = [&paths.ca_cert, &paths.ca_key]
        .into_iter()
        .map(|path| std::fs::read(path).unwrap())
        .collect();
    assert_eq!(before, after);
    assert!(!certs_dir.join("node-4.pem").exists());
}
