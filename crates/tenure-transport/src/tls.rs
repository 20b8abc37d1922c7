//! # Mutual TLS for peer links
//!
//! Every node of a cluster holds a certificate issued by the cluster CA and valid for the DNS name
//! [`node_server_name`]`(node_id)`. Peer links are QUIC connections on which *both* sides present
//! their certificate: the server requires a client certificate chaining to the cluster CA, the
//! client requires the server's certificate to chain to the cluster CA *and* to be valid for the
//! name of the node it dialled. A connection without a valid cluster certificate is refused during
//! the handshake. After the handshake, [`verify_peer_node_id`] binds the node id a peer claims (for
//! example in its first frame) to the certificate it presented.
//!
//! A certificate that chains to the CA can still be revoked by its owner: [`certificate_sha256`]
//! and [`peer_certificate_sha256`] name a certificate by the SHA-256 of its DER, and a
//! [`PeerAdmission`] policy (consulted by the transport on both sides of every peer connection)
//! refuses the ones it lists.
//!
//! Issuing the certificates (the cluster CA, node certificates, the files `tenure certs` writes)
//! is [`crate::certs`]'s job, not this module's.
//!
//! ## What it must not depend on
//!
//! - No process-global rustls state: the *ring* provider is passed explicitly to every builder
//!   and verifier, never installed as the default provider.
//! - No other module of this crate, no openraft, no storage and no wire format: the module turns
//!   PEM into quinn configurations and certificates into yes/no answers, nothing else, so the
//!   command line can use it without a running node.
//! - No I/O except in [`NodeTls::load`], which touches only the paths it is given. No network, no environment variables.
//!
//! ## Choices
//!
//! - TLS 1.3 only, ALPN [`PEER_ALPN`]; no 0-RTT (peer messages must not be replayable) and no
//!   session resumption, so every connection runs a full certificate verification.
//! - The CA may not sign intermediate CAs (path length 0); node certificates carry both the
//!   serverAuth and clientAuth extended key usages, because every node is both.
//! - [`NodeTls`] checks its material when it is built (chain to the CA, name, key match), so a
//!   misconfigured node fails at start-up with the file named instead of at its first handshake.

use std::any::Any;
use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use quinn::crypto::rustls::{NoInitialCipherSuite, QuicClientConfig, QuicServerConfig};
use rustls::RootCertStore;
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::server::{VerifierBuilderError, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::{self, PemObject as _};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, TrustAnchor, UnixTime};

/// ALPN protocol identifier of tenure peer links; both sides require it.
pub const PEER_ALPN: &[u8] = b"tenure-peer/1";

pub use tenure_proto::client::CLIENT_ALPN;

/// DNS suffix of the names in node certificates; see [`node_server_name`].
pub const NODE_NAME_SUFFIX: &str = ".tenure.internal";

/// File name of the cluster CA certificate written by [`write_cluster_certificates`].
pub const CA_CERT_FILE: &str = "ca.pem";

/// File name of the cluster CA private key written by [`write_cluster_certificates`].
pub const CA_KEY_FILE: &str = "ca.key";

/// The DNS name in node `node_id`'s certificate and the server name a client dials to reach it:
/// `node-{id}.tenure.internal`. It is a name only; nothing resolves it.
pub fn node_server_name(node_id: u64) -> String {
    format!("node-{node_id}{NODE_NAME_SUFFIX}")
}

/// File name of node `node_id`'s certificate written by [`write_cluster_certificates`].
pub fn node_cert_file_name(node_id: u64) -> String {
    format!("node-{node_id}.pem")
}

/// File name of node `node_id`'s private key written by [`write_cluster_certificates`].
pub fn node_key_file_name(node_id: u64) -> String {
    format!("node-{node_id}.key")
}

/// Errors of certificate generation, loading, configuration building and peer checks.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// The cluster name cannot be put into a certificate.
    #[error("invalid cluster name {name:?}: {reason}")]
    InvalidClusterName {
        /// The name given.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Generating a key or signing a certificate failed.
    #[error("cannot generate the {what}: {source}")]
    Generate {
        /// What was being generated, e.g. "certificate of node 3".
        what: String,
        /// rcgen's error.
        source: rcgen::Error,
    },
    /// The cluster CA private key does not parse.
    #[error("cannot read the cluster CA private key: {source}")]
    CaKey {
        /// rcgen's error.
        source: rcgen::Error,
    },
    /// The cluster CA private key belongs to another certificate than the cluster CA certificate.
    #[error("the cluster CA private key does not belong to the cluster CA certificate")]
    CaKeyMismatch,
    /// The cluster CA certificate is valid but not one this module can issue certificates from.
    #[error("cannot issue certificates from this cluster CA certificate: {reason}")]
    UnsupportedCaCertificate {
        /// Why.
        reason: String,
    },
    /// A PEM document does not parse.
    #[error("cannot parse the PEM in {origin}: {source}")]
    Pem {
        /// The file, or which in-memory document.
        origin: String,
        /// The PEM parser's error.
        source: pem::Error,
    },
    /// A PEM document holds no certificate.
    #[error("no certificate found in {origin}")]
    NoCertificate {
        /// The file, or which in-memory document.
        origin: String,
    },
    /// A PEM document holds no private key.
    #[error("no private key found in {origin}")]
    NoPrivateKey {
        /// The file, or which in-memory document.
        origin: String,
    },
    /// A certificate does not parse as X.509.
    #[error("invalid certificate in {origin}: {source}")]
    InvalidCertificate {
        /// The file, or which in-memory document.
        origin: String,
        /// webpki's error.
        source: webpki::Error,
    },
    /// A node's own certificate is not valid for that node's name.
    #[error(
        "the certificate in {origin} is not valid for node {node_id} ({expected_name}): {source}"
    )]
    NodeCertificateMismatch {
        /// The file, or which in-memory document.
        origin: String,
        /// The node the certificate was loaded for.
        node_id: u64,
        /// [`node_server_name`] of that node.
        expected_name: String,
        /// webpki's error.
        source: webpki::Error,
    },
    /// A node's own certificate does not chain to the cluster CA (or is expired, or lacks a usage).
    #[error(
        "the certificate in {origin} is not a valid node certificate of the cluster CA in {ca_origin}: {source}"
    )]
    NotIssuedByCa {
        /// The file, or which in-memory document, of the node certificate.
        origin: String,
        /// The file, or which in-memory document, of the CA certificate.
        ca_origin: String,
        /// webpki's error.
        source: webpki::Error,
    },
    /// A private key is unusable or does not belong to the certificate it was given with.
    #[error(
        "the private key in {key_origin} cannot be used with the certificate in {cert_origin}: {source}"
    )]
    KeyRejected {
        /// The file, or which in-memory document, of the key.
        key_origin: String,
        /// The file, or which in-memory document, of the certificate.
        cert_origin: String,
        /// rustls' error.
        source: rustls::Error,
    },
    /// Reading or writing a file failed.
    #[error("I/O error on {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error.
        source: io::Error,
    },
    /// [`write_cluster_certificates`] found an existing cluster CA key; it never replaces one.
    #[error("refusing to overwrite the existing cluster CA key {path}")]
    CaKeyExists {
        /// The existing key file.
        path: PathBuf,
    },
    /// [`write_cluster_certificates`] found an existing file it would have written.
    #[error("refusing to overwrite the existing file {path}")]
    FileExists {
        /// The existing file.
        path: PathBuf,
    },
    /// A node id was listed twice.
    #[error("node id {node_id} is listed more than once")]
    DuplicateNodeId {
        /// The repeated id.
        node_id: u64,
    },
    /// The system clock reads before 1970.
    #[error("the system clock reads before the Unix epoch")]
    Clock,
    /// [`node_server_name`] did not parse as a server name (cannot happen for valid ids).
    #[error("{name:?} is not a valid server name")]
    InvalidServerName {
        /// The name.
        name: String,
    },
    /// Building a certificate verifier failed.
    #[error("cannot build the {side} certificate verifier of node {node_id}: {source}")]
    Verifier {
        /// This node.
        node_id: u64,
        /// "server" or "client".
        side: &'static str,
        /// rustls' error.
        source: VerifierBuilderError,
    },
    /// Building a rustls configuration failed.
    #[error("cannot build the {side} TLS configuration of node {node_id}: {source}")]
    Config {
        /// This node.
        node_id: u64,
        /// "server" or "client".
        side: &'static str,
        /// rustls' error.
        source: rustls::Error,
    },
    /// quinn refused the rustls configuration.
    #[error("cannot use the {side} TLS configuration of node {node_id} for QUIC: {source}")]
    Quic {
        /// This node.
        node_id: u64,
        /// "server" or "client".
        side: &'static str,
        /// quinn's error.
        source: NoInitialCipherSuite,
    },
    /// The connection has no peer certificate (the handshake is not complete, or it was not made
    /// with this module's configurations).
    #[error("peer claiming to be node {claimed_node_id} presented no certificate")]
    PeerIdentityMissing {
        /// The node id the peer claims.
        claimed_node_id: u64,
    },
    /// The connection's peer identity is not a non-empty certificate chain.
    #[error("peer claiming to be node {claimed_node_id} has an unexpected identity: {reason}")]
    PeerIdentityUnexpected {
        /// The node id the peer claims.
        claimed_node_id: u64,
        /// What was found instead.
        reason: &'static str,
    },
    /// The peer's certificate does not parse.
    #[error(
        "peer claiming to be node {claimed_node_id} presented an invalid certificate: {source}"
    )]
    PeerCertificateInvalid {
        /// The node id the peer claims.
        claimed_node_id: u64,
        /// webpki's error.
        source: webpki::Error,
    },
    /// The peer's certificate is not valid for the node id it claims.
    #[error(
        "peer claims to be node {claimed_node_id} but its certificate is not valid for {expected_name}: {source}"
    )]
    PeerNodeMismatch {
        /// The node id the peer claims.
        claimed_node_id: u64,
        /// [`node_server_name`] of the claimed id.
        expected_name: String,
        /// webpki's error.
        source: webpki::Error,
    },
}

/// One node's TLS material, checked: the cluster CA certificate(s) it trusts, its own certificate
/// chain and its private key. Builds the quinn configurations of its peer links.
pub struct NodeTls {
    node_id: u64,
    /// Trust anchors made from the CA certificate(s).
    roots: Arc<RootCertStore>,
    /// This node's certificate first, then any intermediates.
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    provider: Arc<CryptoProvider>,
}

impl NodeTls {
    /// The key this node's QUIC endpoint authenticates stateless resets with: derived from the
    /// node's private key, so it is the same after a restart. A restarted node can then reset,
    /// at once, the connections its peers still hold to its previous incarnation (a peer that
    /// cannot check the reset keeps sending into the dead connection until its idle timeout:
    /// found by the deterministic simulation, a group without a quorum for 7 s after a crash).
    pub fn stateless_reset_key(&self) -> ring::hmac::Key {
        let mut context = ring::digest::Context::new(&ring::digest::SHA256);
        context.update(b"tenure stateless reset key v1\0");
        context.update(self.key.secret_der());
        ring::hmac::Key::new(ring::hmac::HMAC_SHA256, context.finish().as_ref())
    }

    /// The key that tags this node's QUIC connection ids ([`crate::connection_ids`]): derived
    /// from the node's private key like [`NodeTls::stateless_reset_key`] (another label), so a
    /// restarted node recognises the ids of its previous incarnation and answers packets on
    /// them with a stateless reset, instead of dropping them as invalid (which left its peers
    /// and clients on dead connections until the idle timeout: found by the fault suite).
    pub fn connection_id_key(&self) -> ring::hmac::Key {
        let mut context = ring::digest::Context::new(&ring::digest::SHA256);
        context.update(b"tenure connection id key v1\0");
        context.update(self.key.secret_der());
        ring::hmac::Key::new(ring::hmac::HMAC_SHA256, context.finish().as_ref())
    }
}

impl fmt::Debug for NodeTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeTls")
            .field("node_id", &self.node_id)
            .field("trusted_cas", &self.roots.roots.len())
            .field("chain_len", &self.chain.len())
            .field("key", &"<redacted>")
            .finish()
    }
}

impl NodeTls {
    /// Builds node `node_id`'s TLS material from PEM text: the CA certificate (every certificate
    /// in `ca_cert_pem` is trusted), this node's certificate (first in `cert_pem`, optionally
    /// followed by intermediates) and its private key (PKCS#8, PKCS#1 or SEC1).
    ///
    /// Fails unless the certificate is valid for [`node_server_name`]`(node_id)`, chains to the CA
    /// for both serverAuth and clientAuth at the current time, and belongs to the key.
    pub fn from_pem(
        node_id: u64,
        ca_cert_pem: &str,
        cert_pem: &str,
        key_pem: &str,
    ) -> Result<Self, TlsError> {
        Self::from_pem_bytes(
            node_id,
            (ca_cert_pem.as_bytes(), "the CA certificate PEM"),
            (
                cert_pem.as_bytes(),
                &format!("the certificate PEM of node {node_id}"),
            ),
            (
                key_pem.as_bytes(),
                &format!("the key PEM of node {node_id}"),
            ),
        )
    }

    /// Reads node `node_id`'s TLS material from files (as written by
    /// [`write_cluster_certificates`]) and checks it as [`NodeTls::from_pem`] does; errors name
    /// the file concerned.
    pub fn load(node_id: u64, ca_cert: &Path, cert: &Path, key: &Path) -> Result<Self, TlsError> {
        let ca_pem = read_file(ca_cert)?;
        let cert_pem = read_file(cert)?;
        let key_pem = read_file(key)?;
        Self::from_pem_bytes(
            node_id,
            (&ca_pem, &ca_cert.display().to_string()),
            (&cert_pem, &cert.display().to_string()),
            (&key_pem, &key.display().to_string()),
        )
    }

    /// The node this material belongs to.
    pub fn node_id(&self) -> u64 {
        self.node_id
    }

    /// Server side of a peer link: TLS 1.3, ALPN [`PEER_ALPN`], this node's certificate, and a
    /// client certificate chaining to the cluster CA required (rustls' `WebPkiClientVerifier`).
    /// Which node the client is must still be checked with [`verify_peer_node_id`].
    pub fn quinn_server_config(
        &self,
        transport: Arc<quinn::TransportConfig>,
    ) -> Result<quinn::ServerConfig, TlsError> {
        self.quinn_server_config_for(transport, false)
    }

    /// The server configuration of the node's endpoint. With `accept_clients`, it also offers
    /// the client protocol's ALPN (`tenure_proto::client::CLIENT_ALPN`) and a client certificate
    /// becomes optional (when one is presented it must still chain to the cluster CA); the peer
    /// handshake then refuses peers without one ([`verify_peer_node_id`]).
    pub fn quinn_server_config_for(
        &self,
        transport: Arc<quinn::TransportConfig>,
        accept_clients: bool,
    ) -> Result<quinn::ServerConfig, TlsError> {
        const SIDE: &str = "server";
        let node_id = self.node_id;
        let mut verifier_builder =
            WebPkiClientVerifier::builder_with_provider(self.roots.clone(), self.provider.clone());
        if accept_clients {
            verifier_builder = verifier_builder.allow_unauthenticated();
        }
        let verifier = verifier_builder
            .build()
            .map_err(|source| TlsError::Verifier {
                node_id,
                side: SIDE,
                source,
            })?;
        let config_error = |source| TlsError::Config {
            node_id,
            side: SIDE,
            source,
        };
        let mut tls = rustls::ServerConfig::builder_with_provider(self.provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(config_error)?
            .with_client_cert_verifier(verifier)
            .with_single_cert(self.chain.clone(), self.key.clone_key())
            .map_err(config_error)?;
        tls.alpn_protocols = if accept_clients {
            vec![PEER_ALPN.to_vec(), CLIENT_ALPN.to_vec()]
        } else {
            vec![PEER_ALPN.to_vec()]
        };
        tls.max_early_data_size = 0;
        tls.send_tls13_tickets = 0;
        tls.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});

        let quic = QuicServerConfig::try_from(tls).map_err(|source| TlsError::Quic {
            node_id,
            side: SIDE,
            source,
        })?;
        let mut config = quinn::ServerConfig::with_crypto(Arc::new(quic));
        config.transport_config(transport);
        Ok(config)
    }

    /// Client side of a peer link: TLS 1.3, ALPN [`PEER_ALPN`], presents this node's certificate,
    /// and requires the server's certificate to chain to the cluster CA and to be valid for the
    /// server name dialled (connect with [`node_server_name`] of the node meant).
    pub fn quinn_client_config(
        &self,
        transport: Arc<quinn::TransportConfig>,
    ) -> Result<quinn::ClientConfig, TlsError> {
        self.quinn_client_config_for(transport, PEER_ALPN)
    }

    /// Client side of a connection with the given ALPN (the peer protocol's, or the client
    /// protocol's when a node forwards requests to another node), presenting this node's
    /// certificate.
    pub fn quinn_client_config_for(
        &self,
        transport: Arc<quinn::TransportConfig>,
        alpn: &[u8],
    ) -> Result<quinn::ClientConfig, TlsError> {
        const SIDE: &str = "client";
        let node_id = self.node_id;
        let verifier =
            WebPkiServerVerifier::builder_with_provider(self.roots.clone(), self.provider.clone())
                .build()
                .map_err(|source| TlsError::Verifier {
                    node_id,
                    side: SIDE,
                    source,
                })?;
        let config_error = |source| TlsError::Config {
            node_id,
            side: SIDE,
            source,
        };
        let mut tls = rustls::ClientConfig::builder_with_provider(self.provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(config_error)?
            .with_webpki_verifier(verifier)
            .with_client_auth_cert(self.chain.clone(), self.key.clone_key())
            .map_err(config_error)?;
        tls.alpn_protocols = vec![alpn.to_vec()];
        tls.resumption = rustls::client::Resumption::disabled();
        tls.enable_early_data = false;

        let quic = QuicClientConfig::try_from(tls).map_err(|source| TlsError::Quic {
            node_id,
            side: SIDE,
            source,
        })?;
        let mut config = quinn::ClientConfig::new(Arc::new(quic));
        config.transport_config(transport);
        Ok(config)
    }

    fn from_pem_bytes(
        node_id: u64,
        (ca_pem, ca_origin): (&[u8], &str),
        (cert_pem, cert_origin): (&[u8], &str),
        (key_pem, key_origin): (&[u8], &str),
    ) -> Result<Self, TlsError> {
        let ca_certs = certificates(ca_pem, ca_origin)?;
        let chain = certificates(cert_pem, cert_origin)?;
        let key = private_key(key_pem, key_origin)?;

        let anchors = ca_certs
            .iter()
            .map(|der| {
                webpki::anchor_from_trusted_cert(der)
                    .map(|anchor| anchor.to_owned())
                    .map_err(|source| TlsError::InvalidCertificate {
                        origin: ca_origin.to_owned(),
                        source,
                    })
            })
            .collect::<Result<Vec<TrustAnchor<'static>>, _>>()?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());

        let (end_entity, intermediates) = match chain.split_first() {
            Some(split) => split,
            None => {
                return Err(TlsError::NoCertificate {
                    origin: cert_origin.to_owned(),
                });
            }
        };
        let cert = webpki::EndEntityCert::try_from(end_entity).map_err(|source| {
            TlsError::InvalidCertificate {
                origin: cert_origin.to_owned(),
                source,
            }
        })?;
        let expected_name = node_server_name(node_id);
        cert.verify_is_valid_for_subject_name(&parse_server_name(&expected_name)?)
            .map_err(|source| TlsError::NodeCertificateMismatch {
                origin: cert_origin.to_owned(),
                node_id,
                expected_name: expected_name.clone(),
                source,
            })?;
        verify_node_chain(&cert, intermediates, &anchors, &provider).map_err(|source| {
            TlsError::NotIssuedByCa {
                origin: cert_origin.to_owned(),
                ca_origin: ca_origin.to_owned(),
                source,
            }
        })?;
        CertifiedKey::from_der(chain.clone(), key.clone_key(), &provider).map_err(|source| {
            TlsError::KeyRejected {
                key_origin: key_origin.to_owned(),
                cert_origin: cert_origin.to_owned(),
                source,
            }
        })?;

        Ok(Self {
            node_id,
            roots: Arc::new(RootCertStore { roots: anchors }),
            chain,
            key,
            provider,
        })
    }
}

/// Checks, after a handshake made with [`NodeTls`]'s configurations, that the peer's certificate is
/// valid for [`node_server_name`]`(claimed_node_id)`.
///
/// `peer_identity` is what `quinn::Connection::peer_identity()` returns: with rustls, a
/// `Vec<CertificateDer<'static>>` whose first certificate is the peer's. The handshake already
/// verified the chain to the cluster CA; this binds the node id the peer claims to it. The server
/// side of a link must call it (its verifier checks the chain only); the client side may, as a
/// second check of the name it dialled.
pub fn verify_peer_node_id(
    peer_identity: Option<Box<dyn Any>>,
    claimed_node_id: u64,
) -> Result<(), TlsError> {
    let identity = peer_identity.ok_or(TlsError::PeerIdentityMissing { claimed_node_id })?;
    let end_entity =
        leaf_certificate(identity).map_err(|reason| TlsError::PeerIdentityUnexpected {
            claimed_node_id,
            reason,
        })?;
    let cert = webpki::EndEntityCert::try_from(&end_entity).map_err(|source| {
        TlsError::PeerCertificateInvalid {
            claimed_node_id,
            source,
        }
    })?;
    let expected_name = node_server_name(claimed_node_id);
    cert.verify_is_valid_for_subject_name(&parse_server_name(&expected_name)?)
        .map_err(|source| TlsError::PeerNodeMismatch {
            claimed_node_id,
            expected_name,
            source,
        })
}

/// The peer's own (leaf) certificate out of what `quinn::Connection::peer_identity()` returns
/// with rustls: a certificate chain, the peer's first.
fn leaf_certificate(identity: Box<dyn Any>) -> Result<CertificateDer<'static>, &'static str> {
    let chain = identity
        .downcast::<Vec<CertificateDer<'static>>>()
        .map_err(|_| "not a certificate chain")?;
    chain.into_iter().next().ok_or("an empty certificate chain")
}

/// The SHA-256 of a certificate's DER: the name of that one certificate (a node's re-issued
/// certificate has another), as revocation lists give it.
pub fn certificate_sha256(der: &[u8]) -> [u8; 32] {
    let digest = ring::digest::digest(&ring::digest::SHA256, der);
    let mut sha256 = [0u8; 32];
    for (byte, digested) in sha256.iter_mut().zip(digest.as_ref()) {
        *byte = *digested;
    }
    sha256
}

/// [`certificate_sha256`] of the peer's own certificate, out of what
/// `quinn::Connection::peer_identity()` returns after a handshake made with [`NodeTls`]'s
/// configurations; `None` when there is no certificate chain.
pub fn peer_certificate_sha256(peer_identity: Option<Box<dyn Any>>) -> Option<[u8; 32]> {
    let leaf = leaf_certificate(peer_identity?).ok()?;
    Some(certificate_sha256(leaf.as_ref()))
}

/// The owner's say on which peer certificates may carry a peer link, beyond the CA's: for
/// example a list of revoked certificates. Set on a running transport with
/// `Transport::set_peer_admission`; consulted on both sides of every peer connection, after
/// the certificate proved the node id (the accepting side refuses the `Hello` with the reason,
/// the dialling side closes the connection), and again when a connection is put to use.
pub trait PeerAdmission: Send + Sync + 'static {
    /// Whether node `node_id` may connect with the certificate whose [`certificate_sha256`] is
    /// `cert_sha256`; `Err` carries the reason the peer is told and the log shows. Called on the
    /// connection tasks: it must answer quickly and never block.
    fn admit(&self, node_id: u64, cert_sha256: &[u8; 32]) -> Result<(), String>;
}

/// Verifies that `cert` chains to one of `anchors` now and may be used both as a TLS server and
/// as a TLS client certificate.
pub(crate) fn verify_node_chain(
    cert: &webpki::EndEntityCert<'_>,
    intermediates: &[CertificateDer<'_>],
    anchors: &[TrustAnchor<'_>],
    provider: &CryptoProvider,
) -> Result<(), webpki::Error> {
    let algorithms = provider.signature_verification_algorithms.all;
    let now = UnixTime::now();
    for usage in [
        webpki::KeyUsage::server_auth(),
        webpki::KeyUsage::client_auth(),
    ] {
        cert.verify_for_usage(algorithms, anchors, intermediates, now, usage, None, None)?;
    }
    Ok(())
}

pub(crate) fn parse_server_name(name: &str) -> Result<ServerName<'static>, TlsError> {
    ServerName::try_from(name.to_owned()).map_err(|_| TlsError::InvalidServerName {
        name: name.to_owned(),
    })
}

pub(crate) fn certificates(
    pem: &[u8],
    origin: &str,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| TlsError::Pem {
            origin: origin.to_owned(),
            source,
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            origin: origin.to_owned(),
        });
    }
    Ok(certs)
}

pub(crate) fn first_certificate(
    pem: &[u8],
    origin: &str,
) -> Result<CertificateDer<'static>, TlsError> {
    let mut certs = certificates(pem, origin)?;
    Ok(certs.swap_remove(0))
}

pub(crate) fn private_key(pem: &[u8], origin: &str) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|source| match source {
        pem::Error::NoItemsFound => TlsError::NoPrivateKey {
            origin: origin.to_owned(),
        },
        source => TlsError::Pem {
            origin: origin.to_owned(),
            source,
        },
    })
}

fn read_file(path: &Path) -> Result<Vec<u8>, TlsError> {
    fs::read(path).map_err(|source| TlsError::Io {
        path: path.to_owned(),
        source,
    })
}

pub(crate) fn read_to_string(path: &Path) -> Result<String, TlsError> {
    fs::read_to_string(path).map_err(|source| TlsError::Io {
        path: path.to_owned(),
        source,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use rcgen::string::PrintableString;
    use rcgen::{DnValue, KeyIdMethod};

    use std::net::IpAddr;

    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};

    use super::*;
    use crate::certs::*;

    #[test]
    fn server_name_format() {
        assert_eq!(node_server_name(7), "node-7.tenure.internal");
        assert!(parse_server_name(&node_server_name(u64::MAX)).is_ok());
    }

    #[test]
    fn cluster_names_are_validated() {
        for bad in ["", "a\nb", &"x".repeat(65)] {
            assert!(matches!(
                generate_cluster_ca(bad),
                Err(TlsError::InvalidClusterName { .. })
            ));
        }
        generate_cluster_ca(&"x".repeat(64)).unwrap();
        generate_cluster_ca("prod-eu west/1 ÄÖ").unwrap();
    }

    #[test]
    fn node_certificate_names_node_and_chains_to_ca() {
        let ca = generate_cluster_ca("unit").unwrap();
        let ip: IpAddr = "10.0.0.7".parse().unwrap();
        let node = issue_node_certificate(&ca, 7, &[ip]).unwrap();
        let der = CertificateDer::from_pem_slice(node.cert_pem.as_bytes()).unwrap();
        let cert = webpki::EndEntityCert::try_from(&der).unwrap();
        let name = |s: &str| ServerName::try_from(s.to_owned()).unwrap();
        cert.verify_is_valid_for_subject_name(&name("node-7.tenure.internal"))
            .unwrap();
        cert.verify_is_valid_for_subject_name(&name("10.0.0.7"))
            .unwrap();
        assert!(
            cert.verify_is_valid_for_subject_name(&name("node-8.tenure.internal"))
                .is_err()
        );
        NodeTls::from_pem(7, &ca.cert_pem, &node.cert_pem, &node.key_pem).unwrap();
    }

    /// The DER of an AuthorityKeyIdentifier extension value holding only `key_id`:
    /// `SEQUENCE { keyIdentifier [0] IMPLICIT OCTET STRING }`.
    fn authority_key_identifier(key_id: &[u8]) -> Vec<u8> {
        let len = u8::try_from(key_id.len()).unwrap();
        let mut aki = vec![0x30, len + 2, 0x80, len];
        aki.extend_from_slice(key_id);
        aki
    }

    fn contains(haystack: &[u8], needle: &[u8]) -> bool {
        haystack
            .windows(needle.len())
            .any(|window| window == needle)
    }

    #[test]
    fn authority_key_identifier_repeats_ca_subject_key_identifier() {
        let ca = generate_cluster_ca("key ids").unwrap();
        let ca_der = CertificateDer::from_pem_slice(ca.cert_pem.as_bytes()).unwrap();
        let ca_key = KeyPair::from_pem(&ca.key_pem).unwrap();
        // generate_cluster_ca leaves rcgen's default key identifier method (truncated SHA-256).
        let ca_key_id = CertificateParams::default().key_identifier(&ca_key);
        assert_eq!(ca_key_id.len(), 20);
        // SubjectKeyIdentifier ::= OCTET STRING
        let mut ski = vec![0x04, 20];
        ski.extend_from_slice(&ca_key_id);
        assert!(contains(ca_der.as_ref(), &ski));

        let node = issue_node_certificate(&ca, 1, &[]).unwrap();
        let node_der = CertificateDer::from_pem_slice(node.cert_pem.as_bytes()).unwrap();
        assert!(contains(
            node_der.as_ref(),
            &authority_key_identifier(&ca_key_id)
        ));
    }

    #[test]
    fn ca_not_made_here_is_repeated_exactly() {
        // A CA with a PrintableString attribute, attributes generate_cluster_ca does not use, and
        // a subject key identifier that is not a hash rcgen would compute.
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = CertificateParams::default();
        params.distinguished_name.push(
            DnType::CountryName,
            DnValue::PrintableString(PrintableString::try_from("DE").unwrap()),
        );
        params
            .distinguished_name
            .push(DnType::LocalityName, "Zürich");
        params
            .distinguished_name
            .push(DnType::OrganizationName, "elsewhere");
        params
            .distinguished_name
            .push(DnType::CommonName, "imported CA");
        let key_id = b"imported key id".to_vec();
        params.key_identifier_method = KeyIdMethod::PreSpecified(key_id.clone());
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
        set_validity(&mut params, CA_VALIDITY).unwrap();
        let ca = ClusterCa {
            cert_pem: params.self_signed(&key).unwrap().pem(),
            key_pem: key.serialize_pem(),
        };

        let node = issue_node_certificate(&ca, 5, &[]).unwrap();
        let ca_der = CertificateDer::from_pem_slice(ca.cert_pem.as_bytes()).unwrap();
        let anchor = webpki::anchor_from_trusted_cert(&ca_der).unwrap();
        let node_der = CertificateDer::from_pem_slice(node.cert_pem.as_bytes()).unwrap();
        let issued = webpki::EndEntityCert::try_from(&node_der).unwrap();
        assert_eq!(issued.issuer(), anchor.subject.as_ref());
        assert!(contains(
            node_der.as_ref(),
            &authority_key_identifier(&key_id)
        ));
        NodeTls::from_pem(5, &ca.cert_pem, &node.cert_pem, &node.key_pem).unwrap();
    }

    #[test]
    fn ca_key_must_match_ca_certificate() {
        let ca = generate_cluster_ca("one").unwrap();
        let other = generate_cluster_ca("two").unwrap();
        let mixed = ClusterCa {
            cert_pem: ca.cert_pem,
            key_pem: other.key_pem,
        };
        assert!(matches!(
            issue_node_certificate(&mixed, 1, &[]),
            Err(TlsError::CaKeyMismatch)
        ));
    }

    #[test]
    fn peer_identity_must_be_a_certificate_chain() {
        assert!(matches!(
            verify_peer_node_id(None, 1),
            Err(TlsError::PeerIdentityMissing { claimed_node_id: 1 })
        ));
        assert!(matches!(
            verify_peer_node_id(Some(Box::new(1u64)), 1),
            Err(TlsError::PeerIdentityUnexpected { .. })
        ));
        let empty: Vec<CertificateDer<'static>> = Vec::new();
        assert!(matches!(
            verify_peer_node_id(Some(Box::new(empty)), 1),
            Err(TlsError::PeerIdentityUnexpected { .. })
        ));
        let garbage = vec![CertificateDer::from(vec![0x30, 0x00])];
        assert!(matches!(
            verify_peer_node_id(Some(Box::new(garbage)), 1),
            Err(TlsError::PeerCertificateInvalid { .. })
        ));
        let ca = generate_cluster_ca("peers").unwrap();
        let node = issue_node_certificate(&ca, 4, &[]).unwrap();
        let chain = vec![CertificateDer::from_pem_slice(node.cert_pem.as_bytes()).unwrap()];
        verify_peer_node_id(Some(Box::new(chain.clone())), 4).unwrap();
        assert!(matches!(
            verify_peer_node_id(Some(Box::new(chain)), 40),
            Err(TlsError::PeerNodeMismatch {
                claimed_node_id: 40,
                ..
            })
        ));
    }

    #[test]
    fn the_peer_certificate_is_named_by_its_sha256() {
        let ca = generate_cluster_ca("fingerprints").unwrap();
        let node = issue_node_certificate(&ca, 4, &[]).unwrap();
        let der = CertificateDer::from_pem_slice(node.cert_pem.as_bytes()).unwrap();
        let expected: [u8; 32] = ring::digest::digest(&ring::digest::SHA256, der.as_ref())
            .as_ref()
            .try_into()
            .unwrap();
        assert_eq!(certificate_sha256(der.as_ref()), expected);
        let ca_der = CertificateDer::from_pem_slice(ca.cert_pem.as_bytes()).unwrap();
        let chain = vec![der.clone(), ca_der];
        assert_eq!(
            peer_certificate_sha256(Some(Box::new(chain))),
            Some(expected)
        );
        // A re-issued certificate of the same node is another certificate.
        let reissued = issue_node_certificate(&ca, 4, &[]).unwrap();
        let reissued = CertificateDer::from_pem_slice(reissued.cert_pem.as_bytes()).unwrap();
        assert_ne!(certificate_sha256(reissued.as_ref()), expected);
        let empty: Vec<CertificateDer<'static>> = Vec::new();
        assert_eq!(peer_certificate_sha256(Some(Box::new(empty))), None);
        assert_eq!(peer_certificate_sha256(Some(Box::new(1u64))), None);
        assert_eq!(peer_certificate_sha256(None), None);
    }

    #[test]
    fn debug_output_hides_keys() {
        let ca = generate_cluster_ca("secret").unwrap();
        let node = issue_node_certificate(&ca, 1, &[]).unwrap();
        let tls = NodeTls::from_pem(1, &ca.cert_pem, &node.cert_pem, &node.key_pem).unwrap();
        for text in [format!("{ca:?}"), format!("{node:?}"), format!("{tls:?}")] {
            assert!(!text.contains("PRIVATE KEY"), "{text}");
        }
    }
}
