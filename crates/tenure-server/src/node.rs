//! Starting, running and stopping one node: start-up and wiring only.
//!
//! [`Node::start`] claims the data directory, opens storage, starts the QUIC endpoint (peer
//! protocol and client protocol on one port), opens the replicas this node hosts (the recorded
//! ones, or the configured layout on a data directory's first start: [`crate::replicas`]),
//! starts the heartbeat driver, bootstraps fresh groups, builds
//! the [`NodeShared`] state, and starts the HTTP gateway and the background tasks
//! ([`crate::background`]: expiry, leader balancing, the leader-table exchange, gauges). Requests
//! are served by [`crate::request`]; a graceful stop hands leadership off
//! ([`crate::background::handoff`]).
//!
//! Must not depend on: the wire formats' details (client_server, http do that).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tenure_core::{GroupLimits, NegativeControl, PlacementMap, SLOT_COUNT_DEFAULT, StateOptions};
use tenure_proto::client::CLIENT_ALPN;
use tenure_storage::{NodeStorage, StorageOptions};
use tenure_transport::tls::NodeTls;
use tenure_transport::{FaultInjector, GroupRegistry, GroupTable, Transport, TransportConfig};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::admission::{Admission, AdmissionLimits, PressureSettings, RenewalPressure};
use crate::auth::Authenticator;
use crate::background;
use crate::client_server::ClientServer;
use crate::clock::{MonotonicClock, SystemClock, WallClock};
use crate::config::ServerConfig;
use crate::error::ServerError;
use crate::fault_control::FaultControls;
use crate::forward::Forwarder;
use crate::group::{GroupHandle, GroupSettings, LeaderView};
use crate::metrics as m;
use crate::replica_gate::ReplicaGate;
use crate::replicas::{ReplicaFactory, ReplicaSettings};
use crate::request::Service;
use crate::shared::NodeShared;

pub use crate::placement::{PLACEMENT_VERSION, replicas_of};

/// A running node.
pub struct Node {
    shared: Arc<NodeShared>,
    table: Arc<GroupTable>,
    tasks: Vec<JoinHandle<()>>,
    http_shutdown: watch::Sender<bool>,
    http_task: JoinHandle<()>,
    client_addr: SocketAddr,
    http_addr: SocketAddr,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("node_id", &self.shared.config.node_id)
            .field("client_addr", &self.client_addr)
            .field("http_addr", &self.http_addr)
            .finish_non_exhaustive()
    }
}

/// The group limits a node's configuration asks for (every leader installs them through the
/// log, so all replicas enforce them): the ttl range, the expire batch, and the sizing of
/// [`ServerConfig::state_memory_plan`] (a group's share of each tenant's cluster-wide quota, the
/// record maxima that fit the node memory budget). Fails, naming the budget, when the limits do
/// not fit it: the node then refuses to start rather than replay into exhaustion later.
///
/// Every member must run with the same limits (the same `[limits]` and membership): the values
/// are replicated, so replicas never disagree, but each new leader installs its own.
pub fn desired_limits(config: &ServerConfig) -> Result<GroupLimits, ServerError> {
    let plan = config
        .state_memory_plan()
        .map_err(|e| ServerError::Config(e.to_string()))?;
    Ok(plan.apply_to(GroupLimits {
        ttl_ms_min: config.effective_ttl_ms_min(),
        ttl_ms_max: config.limits.ttl_ms_max,
        expire_batch_max: config.timing.expire_batch_max,
        ..GroupLimits::default()
    }))
}

/// What a node takes from its surroundings besides its configuration. The defaults are the real
/// ones (`tenure serve`): RocksDB in the data directory, a UDP socket bound to the configured
/// address, the HTTP gateway, seeds from the operating system. A deterministic simulation
/// supplies its own.
pub struct NodeEnv {
    /// The QUIC endpoint to serve on instead of binding the configured address (over a
    /// simulated socket, say); the node installs its server configuration on it.
    pub endpoint: Option<quinn::Endpoint>,
    /// The storage to use instead of opening RocksDB in the data directory.
    pub storage: Option<NodeStorage>,
    /// Seeds the node's own random choices (the transport's reconnect jitter and fault layer,
    /// the state machines' hash seeds) instead of the operating system.
    pub seed: Option<u64>,
    /// Serve the HTTP gateway (default true).
    pub serve_http: bool,
    /// The data lanes' linger in microseconds, instead of the transport's default (see
    /// `TransportConfig::linger_us`: 0 writes at once, under 1,000 one scheduler pass, else a
    /// sleep).
    pub lane_linger_us: Option<u64>,
    /// The wall clock the negative control `expire-by-wall-clock` reads instead of the
    /// system's (a simulation's, which its nemesis can jump).
    pub wall_clock: Option<Arc<dyn MonotonicClock>>,
}

impl std::fmt::Debug for NodeEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeEnv")
            .field("endpoint", &self.endpoint.is_some())
            .field("storage", &self.storage.is_some())
            .field("seed", &self.seed)
            .field("serve_http", &self.serve_http)
            .field("lane_linger_us", &self.lane_linger_us)
            .field("wall_clock", &self.wall_clock.is_some())
            .finish()
    }
}

impl Default for NodeEnv {
    fn default() -> Self {
        NodeEnv {
            endpoint: None,
            storage: None,
            seed: None,
            serve_http: true,
            lane_linger_us: None,
            wall_clock: None,
        }
    }
}

impl Node {
    /// Starts a node from its configuration (already validated by the caller or not: it is
    /// validated again here).
    pub async fn start(config: ServerConfig) -> Result<Node, ServerError> {
        Self::start_with(config, NodeEnv::default()).await
    }

    /// Starts a node with parts of its environment supplied (see [`NodeEnv`]).
    pub async fn start_with(config: ServerConfig, mut env: NodeEnv) -> Result<Node, ServerError> {
        let node_id = config.node_id;
        let (desired_limits, auth) = check_and_claim(&config)?;
        let spool_dir = config.data_dir.join("spool");
        std::fs::create_dir_all(&spool_dir)
            .map_err(|e| ServerError::io(format!("creating {}", spool_dir.display()), e))?;
        let (storage, wal_sync_delay_us) = open_storage(&config, env.storage.take())?;
        let tls = NodeTls::load(
            node_id,
            &config.tls.ca_cert,
            &config.tls.node_cert,
            &config.tls.node_key,
        )?;
        let cert_sha256 = certificate_sha256(&config.tls.node_cert)?;
        let incarnation = crate::identity::read_identity(&config.data_dir)?
            .map_or(1, |identity| identity.created_unix_ms.max(1));
        let founder_pins = crate::founders::read_founder_pins(&config.data_dir)?;
        let node_ids: Vec<u64> = config.peers.keys().copied().collect();
        let peer_addrs: BTreeMap<u64, SocketAddr> = config
            .peers
            .iter()
            .map(|(&id, peer)| (id, peer.addr))
            .collect();
        let own = config
            .peers
            .get(&node_id)
            .ok_or_else(|| ServerError::Config(format!("node {node_id} is not in peers")))?
            .clone();
        let timing = config.timing();
        let transport_config =
            transport_config(&config, &env, own.addr, peer_addrs.clone(), &storage);
        let table = Arc::new(GroupTable::new(spool_dir));
        // Pending until the replicas this node opens are known to be safe to reach (restarts with
        // recorded replicas open it below; a first start settles it in `membership::bootstrap`).
        let replica_gate = Arc::new(ReplicaGate::new(table.clone(), false));
        let registry: Arc<dyn GroupRegistry> = replica_gate.clone();
        let client_server = ClientServer::new();
        // The transport's fault layer exists only on a node whose faults tests control.
        let link_faults = config
            .testing
            .fault_control
            .then(|| Arc::new(FaultInjector::new(transport_config.seed)));
        let endpoint = match env.endpoint.take() {
            Some(endpoint) => endpoint,
            None => tenure_transport::bind_endpoint(own.addr, &tls)?,
        };
        let transport = Transport::start_on_endpoint(
            endpoint,
            transport_config.clone(),
            &tls,
            registry.clone(),
            link_faults.clone(),
            Some(client_server.clone()),
        )?;

        let mut raft_config = timing
            .openraft_config()
            .map_err(|e| ServerError::Config(format!("timing: {e}")))?;
        raft_config.cluster_name = config.cluster_name.clone();
        raft_config.snapshot_policy =
            openraft::SnapshotPolicy::LogsSinceLast(config.timing.snapshot_every_entries);
        let raft_config = Arc::new(raft_config);
        let negative_control = config.testing.negative_control;
        let (system_clock, clock) = node_clocks(&config, &env);
        let fault_controls = link_faults.map(|links| {
            warn!(
                node = node_id,
                "FAULT CONTROL IS ON: /testing/faults can skew this node's clock, slow its disk \
                 and cut its links (tests only, never in production)"
            );
            Arc::new(FaultControls::new(
                node_id,
                node_ids.iter().copied(),
                system_clock.clone(),
                wal_sync_delay_us,
                links,
            ))
        });
        let forward_config =
            tls.quinn_client_config_for(Arc::new(quinn::TransportConfig::default()), CLIENT_ALPN)?;
        let forwarder = Forwarder::new(
            transport.endpoint(),
            forward_config,
            peer_addrs,
            fault_controls.clone(),
        );
        let settings = GroupSettings {
            ops_per_entry_max: config.limits.ops_per_entry_max as usize,
            proposals_inflight_max: config.limits.proposals_inflight_per_group_max as usize,
            queue_max: config.limits.group_queue_ops_max as usize,
            desired_limits,
        };
        let state_options = StateOptions {
            hash_seed: env
                .seed
                .map_or_else(rand::random, |seed| seed ^ 0x5eed_0f7a_b1e5),
            negative_control,
        };
        let waits = crate::waits::WaitRegistry::new();
        let watches = crate::watch::WatchHub::with_negative_control(negative_control);
        let factory = ReplicaFactory::new(
            node_id,
            storage.clone(),
            transport.clone(),
            table.clone(),
            ReplicaSettings {
                state_options,
                raft_config,
                clock: clock.clone(),
                settings,
                waits: waits.clone(),
                watches: watches.clone(),
            },
        );
        let at_start = factory.open_at_start(&config).await?;
        // Recorded replicas, or a replica with a durable vote or log (a first start that crashed
        // before recording its replicas): this directory has been a member all along. A wiped
        // directory has neither.
        if at_start.to_record.is_none() || at_start.raft_state_found {
            replica_gate.open();
        }
        let heartbeat = tenure_transport::spawn_heartbeat_driver(
            registry,
            Duration::from_millis(timing.heartbeat_interval_ms),
        );
        let client_addr = transport.local_addr()?;
        let shared = Arc::new(shared_state(
            config,
            auth,
            (at_start.groups, factory),
            forwarder,
            transport,
            storage,
            clock.clone(),
            fault_controls,
            (cert_sha256, incarnation, founder_pins),
            replica_gate,
        )?);
        shared
            .transport
            .set_peer_admission(Arc::new(crate::cluster::NodeTableAdmission::new(&shared)));
        let service = Service {
            inner: shared.clone(),
        };
        client_server.set_service(service.clone());

        let (http_shutdown, http_addr, http_task) =
            start_http(env.serve_http, own.http_addr, service).await?;
        let tasks = vec![
            heartbeat,
            // Settles the replica gate (a first start's replicas stay closed to peers until the
            // node table admits the data directory), then founds fresh groups once every other
            // node says they exist nowhere yet, then records the replicas (a data directory's
            // first start only).
            tokio::spawn({
                let shared = shared.clone();
                async move {
                    if background::cluster_sync::settle_replica_gate(&shared).await {
                        crate::membership::bootstrap(shared, at_start.fresh, at_start.to_record)
                            .await;
                    }
                }
            }),
            tokio::spawn(background::replica_gc::run_replica_gc(shared.clone())),
            tokio::spawn(background::expiry::run_expiry(shared.clone())),
            tokio::spawn(background::balancer::run_balancer(shared.clone())),
            tokio::spawn(background::gauges::run_gauges(shared.clone())),
            tokio::spawn(background::leader_exchange::run_leader_exchange(
                shared.clone(),
            )),
            tokio::spawn(background::cluster_sync::run_cluster_sync(shared.clone())),
            tokio::spawn(background::placement::run_placement_controller(
                shared.clone(),
            )),
        ];
        info!(
            node = node_id,
            %client_addr,
            %http_addr,
            groups = shared.config.groups,
            "node started"
        );
        Ok(Node {
            shared,
            table,
            tasks,
            http_shutdown,
            http_task,
            client_addr,
            http_addr,
        })
    }

    /// The group replicas this node hosts, by group id (for tests and simulations that watch
    /// them).
    pub fn groups(&self) -> Vec<Arc<GroupHandle>> {
        self.shared.hosted()
    }

    /// The fault knobs (`[testing] fault_control = true` only): a simulation turns them directly,
    /// as the fault-injection suite does through `/testing/faults`.
    pub fn fault_controls(&self) -> Option<Arc<FaultControls>> {
        self.shared.fault_controls.clone()
    }

    /// Why this node was excluded from the cluster (a data directory the node table does not
    /// know as this node's: `crate::replica_gate`), as soon as it is; `None` until then.
    pub fn excluded(&self) -> watch::Receiver<Option<String>> {
        self.shared.replica_gate.excluded()
    }

    /// True once this excluded node stopped its replicas and transport: the moment to exit
    /// (`crate::replica_gate`: at once, or, when excluded before any node table existed, once
    /// one exists).
    pub fn retired(&self) -> watch::Receiver<bool> {
        self.shared.replica_gate.retired()
    }

    /// True once peers may reach this node's replicas (`crate::replica_gate`: at once on a
    /// restart, after the node table admitted the data directory on a first start).
    pub fn replicas_admitted(&self) -> bool {
        self.shared.replica_gate.is_open()
    }

    /// True when this process's replicas were admitted at some moment (even if the node was
    /// excluded since).
    pub fn replicas_ever_admitted(&self) -> bool {
        self.shared.replica_gate.ever_opened()
    }

    /// The request handler.
    pub fn service(&self) -> Service {
        Service {
            inner: self.shared.clone(),
        }
    }

    /// The QUIC endpoint's address (peer and client protocol).
    pub fn client_addr(&self) -> SocketAddr {
        self.client_addr
    }

    /// The HTTP gateway's address.
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    /// Hands leadership of every group this node leads to another replica (bounded wait), then
    /// stops. Acknowledged requests are already durable on a quorum; requests in flight get a
    /// retryable error.
    pub async fn shutdown_gracefully(self) {
        let shared = self.shared.clone();
        shared.shutting_down.store(true, Ordering::SeqCst);
        crate::background::handoff::hand_off_leadership(&shared).await;
        self.stop().await;
    }

    /// Stops at once (no leadership hand-off).
    pub async fn stop(self) {
        // Also ends an excluded node's linger (`crate::background::cluster_sync`), a detached
        // task.
        self.shared.shutting_down.store(true, Ordering::SeqCst);
        let _ = self.http_shutdown.send(true);
        for task in &self.tasks {
            task.abort();
        }
        let _ = tokio::time::timeout(Duration::from_secs(5), self.http_task).await;
        for raft in self.table.groups() {
            let _ = raft.shutdown().await;
        }
        self.shared.transport.shutdown().await;
        info!(node = self.shared.config.node_id, "node stopped");
    }
}

/// The checks before anything is opened: the configuration is valid, the group limits fit the
/// memory budget (sized before any state is replayed: limits that do not fit stop here) and the
/// other crates' bounds (`limits::check_relations`), the data directory belongs to this node and
/// cluster, and the token table loads.
fn check_and_claim(config: &ServerConfig) -> Result<(GroupLimits, Authenticator), ServerError> {
    config
        .validate()
        .map_err(|error| ServerError::Config(error.to_string()))?;
    let node_id = config.node_id;
    let desired_limits = desired_limits(config)?;
    if let Ok(plan) = config.state_memory_plan() {
        info!(
            node = node_id,
            hosted_groups_max = plan.hosted_groups_max,
            group_lease_records_max = plan.group_lease_records_max,
            group_dedup_records_max = plan.group_dedup_records_max,
            tenant_group_share = plan.tenant_group_share,
            node_state_bytes_max = plan.node_state_bytes_max,
            budget_bytes = config.limits.node_memory_budget_bytes,
            "lease state sized to the node memory budget"
        );
    }
    // Before anything is written: the transport's frame bound is its default (not configurable).
    crate::limits::check_relations(&crate::limits::LimitSettings {
        ops_per_entry_max: config.limits.ops_per_entry_max,
        group: &desired_limits,
        append_entries_max: config.timing().append_entries_max,
        frame_bytes_max: tenure_transport::FRAME_BYTES_MAX_DEFAULT,
    })
    .map_err(|error| ServerError::Config(error.to_string()))?;
    crate::identity::claim_data_dir(&config.data_dir, node_id, &config.cluster_name)?;
    let auth = Authenticator::new(&config.auth).map_err(|e| ServerError::Config(e.to_string()))?;
    if config.auth.insecure_dev_mode {
        warn!(
            node = node_id,
            "INSECURE DEVELOPMENT MODE: principal headers and request principals are trusted without authentication"
        );
    }
    Ok((desired_limits, auth))
}

/// The peer transport's settings from the configuration, and a simulation's seed and linger.
fn transport_config(
    config: &ServerConfig,
    env: &NodeEnv,
    listen_addr: SocketAddr,
    peer_addrs: BTreeMap<u64, SocketAddr>,
    storage: &NodeStorage,
) -> TransportConfig {
    let mut transport_config = TransportConfig::new(config.node_id, listen_addr, peer_addrs);
    transport_config.cluster_name = config.cluster_name.clone();
    transport_config.seed = env.seed.unwrap_or_else(rand::random);
    if let Some(linger_us) = env.lane_linger_us {
        transport_config.linger_us = linger_us;
    }
    let client_limits = &config.limits.client;
    transport_config.client_quic.bidi_streams_max = client_limits.streams_max;
    transport_config.client_quic.stream_receive_window_bytes = client_limits.receive_window_bytes;
    transport_config.client_quic.receive_window_bytes = client_limits.receive_window_bytes;
    transport_config.snapshot_send_bytes_per_s = config.cluster.snapshot_send_bytes_per_s;
    // A memory disk means a simulation: snapshot files are read and written inline there.
    transport_config.inline_file_io = storage.is_in_memory();
    transport_config
}

/// The node's clock (the groups' leader clocks read it): the system's monotonic clock, skewed as
/// `[testing]` asks, or (negative control only) the wall clock. Also returns the system clock,
/// which the fault knobs skew at run time. Warns about every test setting in use.
fn node_clocks(
    config: &ServerConfig,
    env: &NodeEnv,
) -> (Arc<SystemClock>, Arc<dyn MonotonicClock>) {
    let node_id = config.node_id;
    let system_clock = Arc::new(SystemClock::skewed(
        config.testing.clock_rate_ppm,
        config.testing.clock_offset_ms,
    ));
    let negative_control = config.testing.negative_control;
    let clock: Arc<dyn MonotonicClock> =
        if negative_control.breaks(NegativeControl::ExpireByWallClock) {
            env.wall_clock
                .clone()
                .unwrap_or_else(|| Arc::new(WallClock))
        } else {
            system_clock.clone()
        };
    if negative_control.breaks(negative_control) {
        warn!(
            node = node_id,
            control = negative_control.name(),
            "NEGATIVE CONTROL: a guarantee is broken on purpose (tests of the checkers only)"
        );
    }
    if config.testing.clock_rate_ppm != 0 || config.testing.clock_offset_ms != 0 {
        warn!(
            node = node_id,
            rate_ppm = config.testing.clock_rate_ppm,
            offset_ms = config.testing.clock_offset_ms,
            "test clock skew is configured"
        );
    }
    (system_clock, clock)
}

/// Starts the HTTP gateway on `addr` (or, when `serve`, is false, a task that ends at once):
/// returns the switch that stops it, the address it listens on and its task.
async fn start_http(
    serve: bool,
    addr: SocketAddr,
    service: Service,
) -> Result<(watch::Sender<bool>, SocketAddr, JoinHandle<()>), ServerError> {
    let (http_shutdown, mut http_stop) = watch::channel(false);
    let (http_addr, http_task) = if serve {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| ServerError::io(format!("binding HTTP {}", addr), e))?;
        let http_addr = listener
            .local_addr()
            .map_err(|e| ServerError::io("reading the HTTP address", e))?;
        let task = tokio::spawn(async move {
            let stop = async move {
                let _ = http_stop.wait_for(|stop| *stop).await;
            };
            if let Err(error) = crate::http::serve(listener, service, stop).await {
                warn!("HTTP gateway stopped: {error}");
            }
        });
        (http_addr, task)
    } else {
        (addr, tokio::spawn(async {}))
    };
    Ok((http_shutdown, http_addr, http_task))
}

/// The state the request path and the background tasks share.
#[allow(clippy::too_many_arguments)]
fn shared_state(
    config: ServerConfig,
    auth: Authenticator,
    (groups, replicas): (Vec<Option<Arc<GroupHandle>>>, ReplicaFactory),
    forwarder: Arc<Forwarder>,
    transport: Transport,
    storage: NodeStorage,
    clock: Arc<dyn MonotonicClock>,
    fault_controls: Option<Arc<FaultControls>>,
    (cert_sha256, incarnation, founder_pins): ([u8; 32], u64, crate::founders::FounderPins),
    replica_gate: Arc<ReplicaGate>,
) -> Result<NodeShared, ServerError> {
    let placement = PlacementMap::uniform(PLACEMENT_VERSION, config.groups, SLOT_COUNT_DEFAULT)
        .map_err(|e| ServerError::Config(format!("placement: {e}")))?;
    let remote_leaders = vec![LeaderView::default(); config.groups as usize];
    let waits = replicas.waits();
    let watches = replicas.watches();
    Ok(NodeShared {
        waits,
        watches,
        auth,
        node_ids: config.peers.keys().copied().collect(),
        groups: std::sync::RwLock::new(groups),
        replicas,
        moves: crate::replicas::Moves::new(),
        placement,
        remote_leaders: Mutex::new(remote_leaders),
        forwarder,
        transport,
        storage,
        metrics_handle: m::install(),
        shutting_down: AtomicBool::new(false),
        admission: Admission::new(AdmissionLimits {
            node_max: config.limits.inflight_requests_max,
            tenant_max: config.limits.tenant_inflight_requests_max,
            acquire_percent: config.limits.acquire_inflight_percent,
        }),
        renewal_pressure: RenewalPressure::new(
            PressureSettings::with_late_remaining_percent(
                config.limits.late_renewal_remaining_percent,
            )
            .with_loaded_proposal_ms(config.limits.late_renewal_loaded_proposal_ms),
        ),
        clock,
        fault_controls,
        cluster: std::sync::RwLock::new(Arc::default()),
        cluster_follow: Mutex::new(()),
        cert_sha256,
        incarnation,
        replica_gate,
        founder_pins: Mutex::new(founder_pins),
        config,
    })
}

/// SHA-256 of the first certificate in the PEM file `path` (this node's own).
fn certificate_sha256(path: &std::path::Path) -> Result<[u8; 32], ServerError> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    let cert = CertificateDer::from_pem_file(path).map_err(|error| {
        ServerError::Config(format!(
            "reading the node certificate {}: {error}",
            path.display()
        ))
    })?;
    Ok(tenure_transport::certificate_sha256(cert.as_ref()))
}

/// The node's storage: RocksDB in the data directory with the configured options, or the one a
/// simulation supplies. Also returns the WAL sync delay the fault knobs set.
fn open_storage(
    config: &ServerConfig,
    supplied: Option<NodeStorage>,
) -> Result<(NodeStorage, Arc<std::sync::atomic::AtomicU64>), ServerError> {
    let storage_options = StorageOptions {
        fsync: config.storage.fsync,
        block_cache_bytes: config.storage.block_cache_bytes,
        write_buffer_bytes: config.storage.write_buffer_bytes,
        ..StorageOptions::default()
    };
    let wal_sync_delay_us = storage_options.injected_sync_delay_us.clone();
    let storage = match supplied {
        Some(storage) => storage,
        None => NodeStorage::open(&config.data_dir.join("db"), storage_options)?,
    };
    Ok((storage, wal_sync_delay_us))
}
