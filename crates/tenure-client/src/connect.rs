//! Connecting: [`Client::connect`] builds a client (QUIC endpoint, links to the configured
//! nodes, routing), starts its renewer and fetches the routing table. It sits above `client` and
//! `renewer`, so that neither has to know the other's start-up.
//!
//! Must not depend on: the lease handle (`lease`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex, RwLock};

use rand::rngs::SmallRng;
use rand::{Rng as _, SeedableRng as _};
use tokio::sync::mpsc;

use crate::client::{Client, ClientCounters, ClientInner};
use crate::config::{ClientConfig, Credentials};
use crate::error::ClientError;
use crate::link::{FaultInjector, LinkSettings, NodeLink, quic_client_configs};
use crate::renewer::run_renewer;
use crate::routing::RoutingState;

/// Capacity of the renewer's command queue (registrations and releases of lease handles).
const RENEWER_QUEUE: usize = 65_536;

impl Client {
    /// Connects: checks the configuration, opens a QUIC endpoint, and fetches the routing table
    /// from the first endpoint that answers. Must run inside a tokio runtime.
    pub async fn connect(config: ClientConfig) -> Result<Client, ClientError> {
        config.validate()?;
        let bind: SocketAddr = if config.endpoints.iter().all(|e| e.addr.is_ipv6()) {
            SocketAddr::from(([0u16; 8], 0))
        } else {
            SocketAddr::from(([0u8; 4], 0))
        };
        let endpoint = quinn::Endpoint::client(bind)
            .map_err(|error| ClientError::Config(format!("opening a UDP socket: {error}")))?;
        Self::connect_on_endpoint(config, endpoint).await
    }

    /// Like [`Client::connect`] on a QUIC endpoint the caller made (over a simulated socket,
    /// say). The client dials from it and closes it in [`Client::close`].
    pub async fn connect_on_endpoint(
        config: ClientConfig,
        endpoint: quinn::Endpoint,
    ) -> Result<Client, ClientError> {
        config.validate()?;
        let (strict_tls, bootstrap_tls) = quic_client_configs(&config.ca_cert_pem)?;
        let link_settings = LinkSettings {
            lanes: config.lanes_per_node,
            frame_requests_max: config.frame_requests_max,
            inflight_max: config.inflight_per_node_max,
            connect_timeout: config.attempt_timeout,
            token: match &config.credentials {
                Credentials::Token(token) => Some(token.clone()),
                Credentials::InsecureDev { .. } => None,
            },
        };
        let faults = Arc::new(FaultInjector::default());
        let mut links = BTreeMap::new();
        let mut bootstrap_links = Vec::new();
        for endpoint_config in &config.endpoints {
            let link = Arc::new(NodeLink::new(
                endpoint_config.node_id,
                endpoint_config.addr,
                endpoint.clone(),
                if endpoint_config.node_id.is_some() {
                    strict_tls.clone()
                } else {
                    bootstrap_tls.clone()
                },
                link_settings.clone(),
                faults.clone(),
            ));
            match endpoint_config.node_id {
                Some(id) => {
                    links.insert(id, link);
                }
                None => bootstrap_links.push(link),
            }
        }
        let seed = config
            .seed
            .unwrap_or_else(|| SmallRng::from_os_rng().random());
        let rng = SmallRng::seed_from_u64(seed);
        // Request ids start with the client id, so it never comes from the (possibly fixed)
        // jitter seed: two clients with one seed must still never share a request id.
        let client_id = config
            .client_id
            .unwrap_or_else(|| SmallRng::from_os_rng().random());
        let (renewer, commands) = mpsc::channel(RENEWER_QUEUE);
        let inner = Arc::new(ClientInner {
            config,
            endpoint,
            strict_tls,
            link_settings,
            routing: RwLock::new(RoutingState::default()),
            links: Mutex::new(links),
            bootstrap_links,
            refresh: tokio::sync::Mutex::new(None),
            client_id,
            next_request: AtomicU64::new(1),
            next_node: AtomicUsize::new(0),
            rng: Mutex::new(rng),
            renewer,
            counters: ClientCounters::default(),
            leases_held: AtomicU64::new(0),
            leases_at_risk: AtomicU64::new(0),
            faults,
            closed: AtomicBool::new(false),
            keepalive_batchers: Mutex::new(BTreeMap::new()),
            keepalive_epoch: crate::time::now(),
        });
        tokio::spawn(run_renewer(Arc::downgrade(&inner), commands));
        let client = Client { inner };
        let call_timeout = client.inner.config.call_timeout;
        match tokio::time::timeout(call_timeout, client.refresh_routing()).await {
            Ok(Ok(())) => Ok(client),
            Ok(Err(error)) => {
                client.close().await;
                Err(error)
            }
            Err(_) => {
                client.close().await;
                Err(ClientError::DeadlineExceeded {
                    timeout_ms: u64::try_from(call_timeout.as_millis()).unwrap_or(u64::MAX),
                    attempts: 1,
                    last: "no node answered the routing request".to_string(),
                })
            }
        }
    }

    /// Reads `cluster.json` (see [`ClientConfig::from_cluster_file`]) and connects with the
    /// defaults.
    pub async fn from_cluster_file(
        path: &std::path::Path,
        credentials: Credentials,
    ) -> Result<Client, ClientError> {
        Client::connect(ClientConfig::from_cluster_file(path, credentials)?).await
    }
}
