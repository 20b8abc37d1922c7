//! Starting, running and stopping one node.
//!
//! [`Node::start`] claims the data directory, opens storage, starts the QUIC endpoint (peer
//! protocol and client protocol on one port), creates the replicas of the groups this node hosts,
//! bootstraps fresh groups, and starts the background work: the heartbeat driver, the expiry
//! driver (leaders propose Expire commands, in expiry order, at a bounded rate), the leader
//! balancer (hands each group to its preferred leader when that node is connected and caught up,
//! so each node leads about groups/nodes of them after start and after a node returns), the
//! leader-table exchange for groups not hosted here, the metrics refresher, and the HTTP gateway.
//!
//! Placement of replicas: with node ids sorted `n_0 < n_1 < ...` and `N` nodes, group `g` lives
//! on `n_{(g+i) mod N}` for `i < replication_factor`; its preferred leader is `n_{g mod N}`, which
//! also bootstraps it on a fresh cluster. Keys map to groups with `tenure-core`'s placement
//! function over a uniform placement map (version 1).
//!
//! Must not depend on: the wire formats' details (client_server, http do that).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use openraft::impls::BasicNode;
use tenure_core::{
    ErrorCode, GroupLimits, LeaseOp, LeaseOutcome, LeaseStatus, LeaseView, NegativeControl,
    PlacementMap, SLOT_COUNT_DEFAULT, StateOptions,
};
use tenure_proto::client::{
    CLIENT_ALPN, GetResult, GroupLeader, LeaseResult, NodeAddress, NodeStatus, Principal,
    RequestBody, RequestFlags, ResponseBody, RoutingTable, WireError,
};
use tenure_storage::{NodeStorage, StorageOptions};
use tenure_transport::tls::NodeTls;
use tenure_transport::{
    FaultInjector, GroupNetworkFactory, GroupRaft, GroupRegistry, GroupTable, Transport,
    TransportConfig,
};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::admission::{
    Admission, AdmissionLimits, PressureSettings, RenewalPressure, RenewalTiming, RequestClass,
};
use crate::auth::{Authenticator, check_tenant};
use crate::client_server::ClientServer;
use crate::clock::{MonotonicClock, SystemClock, WallClock};
use crate::config::ServerConfig;
use crate::error::ServerError;
use crate::fault_control::FaultControls;
use crate::forward::Forwarder;
use crate::group::{GroupHandle, GroupSettings, LeaderView};
use crate::metrics as m;
use crate::service::{Readiness, RequestContext, Service};

/// Placement map version of a cluster created with a fixed group count.
pub const PLACEMENT_VERSION: u64 = 1;

/// State shared by the node's tasks and request handlers.
pub struct NodeShared {
    pub(crate) config: ServerConfig,
    pub(crate) auth: Authenticator,
    node_ids: Vec<u64>,
    groups: Vec<Option<Arc<GroupHandle>>>,
    placement: PlacementMap,
    remote_leaders: Mutex<Vec<LeaderView>>,
    forwarder: Arc<Forwarder>,
    transport: Transport,
    storage: NodeStorage,
    metrics_handle: Option<metrics_exporter_prometheus::PrometheusHandle>,
    shutting_down: AtomicBool,
    admission: Admission,
    renewal_pressure: RenewalPressure,
    /// The clock the groups' leader clocks read (and renewal pressure is timed by).
    clock: Arc<dyn MonotonicClock>,
    fault_controls: Option<Arc<FaultControls>>,
}

impl std::fmt::Debug for NodeShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeShared")
            .field("node_id", &self.config.node_id)
            .finish_non_exhaustive()
    }
}

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

/// The nodes hosting `group`, preferred leader first.
pub fn replicas_of(group: u32, node_ids: &[u64], replication_factor: u32) -> Vec<u64> {
    let count = node_ids.len();
    if count == 0 {
        return Vec::new();
    }
    let factor = usize::try_from(replication_factor)
        .unwrap_or(count)
        .clamp(1, count);
    let first = usize::try_from(group).unwrap_or(0) % count;
    (0..factor).map(|i| node_ids[(first + i) % count]).collect()
}

/// A read's status comes from the log (see [`GroupHandle::linearizable_read_time`]); its
/// remaining ttl from the leader's clock, which is fresher between entries: never more than the
/// log's, zero for a lease the clock says is due but no Expire entry has reclaimed yet.
fn clock_remaining_ttl(view: &mut LeaseView, clock_ms: u64) {
    view.remaining_ttl_ms = view
        .remaining_ttl_ms
        .min(view.expires_at_ms.saturating_sub(clock_ms));
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
    pub async fn start_with(config: ServerConfig, env: NodeEnv) -> Result<Node, ServerError> {
        config
            .validate()
            .map_err(|error| ServerError::Config(error.to_string()))?;
        let node_id = config.node_id;
        // Sized before any state is replayed: limits that do not fit the budget stop here.
        let desired_limits = desired_limits(&config)?;
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
        crate::identity::claim_data_dir(&config.data_dir, node_id, &config.cluster_name)?;
        let auth =
            Authenticator::new(&config.auth).map_err(|e| ServerError::Config(e.to_string()))?;
        if config.auth.insecure_dev_mode {
            warn!(
                node = node_id,
                "INSECURE DEVELOPMENT MODE: principal headers and request principals are trusted without authentication"
            );
        }
        let spool_dir = config.data_dir.join("spool");
        std::fs::create_dir_all(&spool_dir)
            .map_err(|e| ServerError::io(format!("creating {}", spool_dir.display()), e))?;
        let storage_options = StorageOptions {
            fsync: config.storage.fsync,
            block_cache_bytes: config.storage.block_cache_bytes,
            write_buffer_bytes: config.storage.write_buffer_bytes,
            ..StorageOptions::default()
        };
        let wal_sync_delay_us = storage_options.injected_sync_delay_us.clone();
        let storage = match env.storage {
            Some(storage) => storage,
            None => NodeStorage::open(&config.data_dir.join("db"), storage_options)?,
        };
        let tls = NodeTls::load(
            node_id,
            &config.tls.ca_cert,
            &config.tls.node_cert,
            &config.tls.node_key,
        )?;
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
        let mut transport_config = TransportConfig::new(node_id, own.addr, peer_addrs.clone());
        transport_config.cluster_name = config.cluster_name.clone();
        transport_config.seed = env.seed.unwrap_or_else(rand::random);
        if let Some(linger_us) = env.lane_linger_us {
            transport_config.linger_us = linger_us;
        }
        let client_limits = &config.limits.client;
        transport_config.client_quic.bidi_streams_max = client_limits.streams_max;
        transport_config.client_quic.stream_receive_window_bytes =
            client_limits.receive_window_bytes;
        transport_config.client_quic.receive_window_bytes = client_limits.receive_window_bytes;
        // A memory disk means a simulation: snapshot files are read and written inline there.
        transport_config.inline_file_io = storage.is_in_memory();
        let table = Arc::new(GroupTable::new(spool_dir));
        let registry: Arc<dyn GroupRegistry> = table.clone();
        let client_server = ClientServer::new();
        // The transport's fault layer exists only on a node whose faults tests control.
        let link_faults = config
            .testing
            .fault_control
            .then(|| Arc::new(FaultInjector::new(transport_config.seed)));
        let endpoint = match env.endpoint {
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
        let mut groups: Vec<Option<Arc<GroupHandle>>> = Vec::with_capacity(config.groups as usize);
        let state_options = StateOptions {
            hash_seed: env
                .seed
                .map_or_else(rand::random, |seed| seed ^ 0x5eed_0f7a_b1e5),
            negative_control,
        };
        let mut fresh = Vec::new();
        for group in 0..config.groups {
            let replicas = replicas_of(group, &node_ids, config.replication_factor);
            if !replicas.contains(&node_id) {
                groups.push(None);
                continue;
            }
            let state_machine = storage.state_machine(group, state_options)?;
            let raft = GroupRaft::new(
                node_id,
                raft_config.clone(),
                GroupNetworkFactory::new(transport.clone(), group),
                storage.log_store(group),
                state_machine.clone(),
            )
            .await
            .map_err(|e| ServerError::Raft(format!("creating group {group}: {e}")))?;
            table.insert(group, raft.clone());
            if replicas.first() == Some(&node_id)
                && !raft
                    .is_initialized()
                    .await
                    .map_err(|e| ServerError::Raft(e.to_string()))?
            {
                let members: BTreeMap<u64, BasicNode> = replicas
                    .iter()
                    .filter_map(|id| {
                        config
                            .peers
                            .get(id)
                            .map(|peer| (*id, BasicNode::new(peer.addr.to_string())))
                    })
                    .collect();
                fresh.push((raft.clone(), members, group));
            }
            groups.push(Some(GroupHandle::start(
                group,
                node_id,
                raft,
                state_machine,
                clock.clone(),
                settings.clone(),
            )));
        }
        let heartbeat = tenure_transport::spawn_heartbeat_driver(
            registry,
            Duration::from_millis(timing.heartbeat_interval_ms),
        );
        for (raft, members, group) in fresh {
            if let Err(error) = raft.initialize(members).await {
                warn!(group, "bootstrapping the group failed: {error}");
            } else {
                info!(group, "bootstrapped a fresh group");
            }
        }
        let placement = PlacementMap::uniform(PLACEMENT_VERSION, config.groups, SLOT_COUNT_DEFAULT)
            .map_err(|e| ServerError::Config(format!("placement: {e}")))?;
        let remote_leaders = vec![LeaderView::default(); config.groups as usize];
        let client_addr = transport.local_addr()?;
        let shared = Arc::new(NodeShared {
            auth,
            node_ids: node_ids.clone(),
            groups,
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
            renewal_pressure: RenewalPressure::new(PressureSettings::with_late_remaining_percent(
                config.limits.late_renewal_remaining_percent,
            )),
            clock: clock.clone(),
            fault_controls,
            config,
        });
        let service = Service {
            inner: shared.clone(),
        };
        client_server.set_service(service.clone(), node_ids);

        let (http_shutdown, mut http_stop) = watch::channel(false);
        let (http_addr, http_task) = if env.serve_http {
            let listener = tokio::net::TcpListener::bind(own.http_addr)
                .await
                .map_err(|e| ServerError::io(format!("binding HTTP {}", own.http_addr), e))?;
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
            (own.http_addr, tokio::spawn(async {}))
        };
        let tasks = vec![
            heartbeat,
            tokio::spawn(run_expiry(shared.clone())),
            tokio::spawn(run_balancer(shared.clone())),
            tokio::spawn(run_gauges(shared.clone())),
            tokio::spawn(run_leader_exchange(shared.clone())),
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
        self.shared.hosted().cloned().collect()
    }

    /// The fault knobs (`[testing] fault_control = true` only): a simulation turns them directly,
    /// as the fault-injection suite does through `/testing/faults`.
    pub fn fault_controls(&self) -> Option<Arc<FaultControls>> {
        self.shared.fault_controls.clone()
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
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut asked: HashMap<u32, Instant> = HashMap::new();
        let mut fewest_led = usize::MAX;
        let mut last_progress = Instant::now();
        loop {
            let led: Vec<Arc<GroupHandle>> = shared
                .hosted()
                .filter(|handle| handle.leader_view().leader == Some(shared.config.node_id))
                .cloned()
                .collect();
            if led.is_empty() {
                info!(node = shared.config.node_id, "handed off every group");
                break;
            }
            if led.len() < fewest_led {
                fewest_led = led.len();
                last_progress = Instant::now();
            }
            // Stop trying when nothing moved for a while (e.g. the peers are shutting down too
            // and hand the groups back) or the overall bound passed; the groups re-elect.
            if Instant::now() >= deadline || last_progress.elapsed() > Duration::from_secs(3) {
                warn!(
                    node = shared.config.node_id,
                    groups = led.len(),
                    "still leading some groups; stopping anyway (they re-elect)"
                );
                break;
            }
            let mut any_target = false;
            for handle in led {
                let group = handle.group_id();
                let Some(target) = shared.handoff_target(&handle) else {
                    continue;
                };
                any_target = true;
                if asked
                    .get(&group)
                    .is_some_and(|at| at.elapsed() < Duration::from_secs(2))
                {
                    continue;
                }
                asked.insert(group, Instant::now());
                ::metrics::counter!(m::LEADER_TRANSFERS_TOTAL).increment(1);
                handle.transfer_leadership(target).await;
            }
            if !any_target {
                warn!(
                    node = shared.config.node_id,
                    "no connected replica to hand leadership to; stopping"
                );
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.stop().await;
    }

    /// Stops at once (no leadership hand-off).
    pub async fn stop(self) {
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

fn error_code_label(error: &WireError) -> &'static str {
    error.code.as_str()
}

impl NodeShared {
    pub(crate) fn fault_controls(&self) -> Option<Arc<FaultControls>> {
        self.fault_controls.clone()
    }

    fn hosted(&self) -> impl Iterator<Item = &Arc<GroupHandle>> {
        self.groups.iter().flatten()
    }

    fn group(&self, group: u32) -> Option<&Arc<GroupHandle>> {
        self.groups.get(group as usize).and_then(Option::as_ref)
    }

    fn node_address(&self, node_id: u64) -> Option<NodeAddress> {
        self.config.peers.get(&node_id).map(|peer| NodeAddress {
            node_id,
            client_addr: peer.addr.to_string(),
            http_url: format!("http://{}", peer.http_addr),
        })
    }

    /// The leader of `group` as this node knows it.
    pub(crate) fn leader_of(&self, group: u32) -> LeaderView {
        match self.group(group) {
            Some(handle) => handle.leader_view(),
            None => self
                .remote_leaders
                .lock()
                .ok()
                .and_then(|views| views.get(group as usize).copied())
                .unwrap_or_default(),
        }
    }

    pub(crate) fn readiness(&self) -> Readiness {
        let groups = self.config.groups;
        let mut with_leader = 0u32;
        let mut led = 0u32;
        for group in 0..groups {
            let view = self.leader_of(group);
            if view.leader.is_some() {
                with_leader += 1;
            }
            if view.leader == Some(self.config.node_id) {
                led += 1;
            }
        }
        let shutting_down = self.shutting_down.load(Ordering::SeqCst);
        let storage_failure = self.storage.node_failure();
        Readiness {
            ready: with_leader == groups && !shutting_down && storage_failure.is_none(),
            groups,
            groups_with_leader: with_leader,
            groups_led: led,
            shutting_down,
            storage_failure,
        }
    }

    pub(crate) fn render_metrics(&self) -> String {
        self.metrics_handle
            .as_ref()
            .map(|handle| handle.render())
            .unwrap_or_default()
    }

    fn routing_table(&self) -> RoutingTable {
        RoutingTable {
            placement_version: self.placement.version(),
            slot_groups: self.placement.slot_groups().iter().map(|g| g.0).collect(),
            groups: self.config.groups,
            nodes: self
                .node_ids
                .iter()
                .filter_map(|&id| self.node_address(id))
                .collect(),
            leaders: (0..self.config.groups)
                .map(|group| {
                    let view = self.leader_of(group);
                    GroupLeader {
                        group_id: group,
                        leader: view.leader,
                        term: view.term,
                    }
                })
                .collect(),
        }
    }

    fn node_status(&self) -> NodeStatus {
        let readiness = self.readiness();
        NodeStatus {
            node_id: self.config.node_id,
            ready: readiness.ready,
            shutting_down: readiness.shutting_down,
            placement_version: self.placement.version(),
            groups: self.config.groups,
            hosted: (0..self.config.groups)
                .filter_map(|group| self.group(group).map(|handle| handle.status()))
                .collect(),
        }
    }

    /// Fills routing errors with the leader's addresses and the placement version.
    fn decorate(&self, mut error: WireError) -> WireError {
        error.placement_version = self.placement.version();
        if let Some(hint) = error.leader_hint.take() {
            error.leader_hint = self.node_address(hint.node_id);
        }
        error
    }

    fn not_leader(&self, group: u32) -> WireError {
        let view = self.leader_of(group);
        let mut error = WireError::new(
            ErrorCode::NotLeader,
            match view.leader {
                Some(leader) => format!("group {group} is led by node {leader}"),
                None => format!("group {group} has no known leader"),
            },
        );
        error.leader_hint = view.leader.and_then(|leader| self.node_address(leader));
        error
    }

    pub(crate) async fn handle(
        self: &Arc<Self>,
        ctx: RequestContext,
        body: RequestBody,
    ) -> Result<ResponseBody, WireError> {
        let op = body.op_name();
        let started = Instant::now();
        let result = self.handle_inner(ctx, body).await;
        let label = match &result {
            Ok(_) => "ok",
            Err(error) => error_code_label(error),
        };
        ::metrics::counter!(m::REQUESTS_TOTAL, "op" => op, "result" => label).increment(1);
        ::metrics::histogram!(m::REQUEST_DURATION_SECONDS, "op" => op)
            .record(started.elapsed().as_secs_f64());
        result.map_err(|error| self.decorate(error))
    }

    async fn handle_inner(
        self: &Arc<Self>,
        ctx: RequestContext,
        body: RequestBody,
    ) -> Result<ResponseBody, WireError> {
        match body {
            RequestBody::Authenticate { .. } => Err(WireError::new(
                ErrorCode::InvalidArgument,
                "Authenticate is a connection-level request of the QUIC protocol",
            )),
            RequestBody::Routing => Ok(ResponseBody::Routing(self.routing_table())),
            RequestBody::Status => Ok(ResponseBody::Status(self.node_status())),
            RequestBody::Acquire(request) => {
                self.lease_ops(ctx, vec![LeaseOp::Acquire(request)], false)
                    .await
            }
            RequestBody::Renew(request) => {
                ::metrics::histogram!(m::RENEWALS_PER_REQUEST).record(1.0);
                self.lease_ops(ctx, vec![LeaseOp::Renew(request)], false)
                    .await
            }
            RequestBody::Release(request) => {
                self.lease_ops(ctx, vec![LeaseOp::Release(request)], false)
                    .await
            }
            RequestBody::Batch { ops } => {
                if ops.is_empty() {
                    return Err(crate::service::invalid(
                        "a batch needs at least one operation",
                    ));
                }
                if ops.len() > tenure_proto::client::BATCH_OPS_MAX {
                    return Err(crate::service::invalid(format!(
                        "a batch may carry at most {} operations",
                        tenure_proto::client::BATCH_OPS_MAX
                    )));
                }
                let renewals = ops
                    .iter()
                    .filter(|op| matches!(op, LeaseOp::Renew(_)))
                    .count();
                if renewals > 0 {
                    ::metrics::histogram!(m::RENEWALS_PER_REQUEST).record(renewals as f64);
                }
                self.lease_ops(ctx, ops, true).await
            }
            RequestBody::Get { key } => {
                check_tenant(&ctx.principal, &key.tenant_id)?;
                key.validate().map_err(WireError::from_lease_error)?;
                let _admitted = self.admission.admit(&key.tenant_id, RequestClass::Other)?;
                let group = self.placement.group_of(&key.tenant_id, &key.resource_id).0;
                if let Some(handle) = self.group(group) {
                    if handle.is_ready_leader() {
                        let now = handle.linearizable_read_time(ctx.timeout).await?;
                        let mut view = handle.get_at(&key, now)?;
                        if let (Some(view), Some(clock_ms)) = (view.as_mut(), handle.log_now_ms()) {
                            clock_remaining_ttl(view, clock_ms);
                        }
                        return Ok(ResponseBody::Get(GetResult {
                            view,
                            log_time_ms: now,
                            stale: false,
                            group_id: group,
                        }));
                    }
                    if ctx.flags.stale_read {
                        let now = handle.applied_log_time_ms();
                        return Ok(ResponseBody::Get(GetResult {
                            view: handle.get_at(&key, now)?,
                            log_time_ms: now,
                            stale: true,
                            group_id: group,
                        }));
                    }
                }
                self.forward_or_refuse(group, &ctx, RequestBody::Get { key })
                    .await
            }
            RequestBody::List { group_id, request } => {
                check_tenant(&ctx.principal, &request.tenant_id)?;
                if group_id >= self.config.groups {
                    return Err(crate::service::invalid(format!(
                        "group {group_id} does not exist (the cluster has {})",
                        self.config.groups
                    )));
                }
                let _admitted = self
                    .admission
                    .admit(&request.tenant_id, RequestClass::Other)?;
                if let Some(handle) = self.group(group_id) {
                    if handle.is_ready_leader() {
                        let now = handle.linearizable_read_time(ctx.timeout).await?;
                        let mut page = handle.list_at(&request, now)?;
                        if let Some(clock_ms) = handle.log_now_ms() {
                            for view in &mut page.leases {
                                clock_remaining_ttl(view, clock_ms);
                            }
                        }
                        return Ok(ResponseBody::List(page));
                    }
                    if ctx.flags.stale_read {
                        let now = handle.applied_log_time_ms();
                        return Ok(ResponseBody::List(handle.list_at(&request, now)?));
                    }
                }
                self.forward_or_refuse(group_id, &ctx, RequestBody::List { group_id, request })
                    .await
            }
        }
    }

    async fn forward_or_refuse(
        &self,
        group: u32,
        ctx: &RequestContext,
        body: RequestBody,
    ) -> Result<ResponseBody, WireError> {
        let view = self.leader_of(group);
        match view.leader {
            Some(leader) if ctx.flags.forward && leader != self.config.node_id => {
                ::metrics::counter!(m::REQUESTS_FORWARDED_TOTAL, "op" => body.op_name())
                    .increment(1);
                self.forwarder
                    .forward(leader, &ctx.principal, ctx.flags, body, ctx.timeout)
                    .await
            }
            Some(_) | None => Err(self.not_leader(group)),
        }
    }

    async fn lease_ops(
        self: &Arc<Self>,
        ctx: RequestContext,
        ops: Vec<LeaseOp>,
        batch: bool,
    ) -> Result<ResponseBody, WireError> {
        let mut group: Option<u32> = None;
        let mut acquire = false;
        for op in &ops {
            let key = op.key();
            check_tenant(&ctx.principal, &key.tenant_id)?;
            key.validate().map_err(WireError::from_lease_error)?;
            acquire |= matches!(op, LeaseOp::Acquire(_));
            let op_group = self.placement.group_of(&key.tenant_id, &key.resource_id).0;
            match group {
                None => group = Some(op_group),
                Some(g) if g == op_group => {}
                Some(g) => {
                    return Err(crate::service::invalid(format!(
                        "a batch must stay in one group: {}/{} maps to group {op_group}, earlier items to group {g}",
                        key.tenant_id, key.resource_id
                    )));
                }
            }
        }
        let Some(group) = group else {
            return Err(crate::service::invalid("no operation"));
        };
        let tenant = ctx.principal.tenant_id.clone();
        let class = if acquire {
            RequestClass::Acquire
        } else {
            RequestClass::Other
        };
        let _admitted = self.admission.admit(&tenant, class)?;
        let mut ops = ops;
        if let Some(handle) = self.group(group) {
            if handle.is_ready_leader() {
                self.weigh_renewal_pressure(handle, &tenant, &ops, class)?;
                // The proposal consumes the operations; keep a copy only when a lost leadership
                // may still be answered by forwarding them.
                let fallback = ctx.flags.forward.then(|| ops.clone());
                match handle.propose(ops, ctx.timeout).await {
                    Ok(outcomes) => return lease_body(group, outcomes, batch),
                    Err(error) if error.code == ErrorCode::NotLeader => match fallback {
                        Some(copy) => ops = copy,
                        None => return Err(error),
                    },
                    Err(error) => return Err(error),
                }
            }
        }
        let body = if batch {
            RequestBody::Batch { ops }
        } else {
            match ops.into_iter().next() {
                Some(LeaseOp::Acquire(r)) => RequestBody::Acquire(r),
                Some(LeaseOp::Renew(r)) => RequestBody::Renew(r),
                Some(LeaseOp::Release(r)) => RequestBody::Release(r),
                None => return Err(crate::service::invalid("no operation")),
            }
        };
        self.forward_or_refuse(group, &ctx, body).await
    }

    /// As the group's leader: refuses a new acquire of a tenant whose renewals arrive late, and
    /// samples how late the request's first renewal arrives (a client library's batch starts
    /// with its most urgent lease). See [`RenewalPressure`].
    fn weigh_renewal_pressure(
        &self,
        handle: &GroupHandle,
        tenant: &str,
        ops: &[LeaseOp],
        class: RequestClass,
    ) -> Result<(), WireError> {
        let pressure = &self.renewal_pressure;
        if !pressure.enabled() {
            return Ok(());
        }
        let now_ms = self.clock.now_ms();
        if class == RequestClass::Acquire {
            if let Err(refused) = pressure.admit_acquire(tenant, now_ms) {
                ::metrics::counter!(m::ACQUIRES_REFUSED_RENEWAL_PRESSURE_TOTAL).increment(1);
                return Err(refused);
            }
        }
        let first_renewal = ops.iter().find_map(|op| match op {
            LeaseOp::Renew(renew) => Some(renew),
            _ => None,
        });
        let (Some(renew), Some(log_now_ms)) = (first_renewal, handle.log_now_ms()) else {
            return Ok(());
        };
        // Never waits for the state: while apply or a snapshot holds it, no sample.
        let Some(Ok(Some(view))) = handle.try_get_at(&renew.key, log_now_ms) else {
            return Ok(());
        };
        // Only a renewal of the active lease by its holder counts: one of an ended lease, or of
        // someone else's, is refused by the state machine and says nothing about timeliness.
        if view.lease_id != renew.lease_id
            || view.holder_id != renew.holder_id
            || view.status != LeaseStatus::Active
        {
            return Ok(());
        }
        let timing = pressure.timing(view.remaining_ttl_ms, view.ttl_ms);
        ::metrics::counter!(m::RENEWALS_SAMPLED_TOTAL).increment(1);
        if timing == RenewalTiming::Late {
            ::metrics::counter!(m::RENEWALS_LATE_TOTAL).increment(1);
        }
        pressure.record(&renew.key.tenant_id, now_ms, timing);
        Ok(())
    }

    /// A replica to hand `handle`'s leadership to: connected, most caught up.
    fn handoff_target(&self, handle: &GroupHandle) -> Option<u64> {
        let (_, progress) = handle.follower_progress()?;
        progress
            .into_iter()
            .filter(|(node, _)| *node != self.config.node_id && self.transport.is_connected(*node))
            .max_by_key(|(_, matched)| *matched)
            .map(|(node, _)| node)
    }
}

fn lease_body(
    group: u32,
    outcomes: Vec<LeaseOutcome>,
    batch: bool,
) -> Result<ResponseBody, WireError> {
    let mut results: Vec<Result<LeaseResult, WireError>> = outcomes
        .into_iter()
        .map(|outcome| match outcome.result {
            Ok(reply) => Ok(LeaseResult {
                reply,
                replayed: outcome.replayed,
                group_id: group,
                replay: outcome.replay,
            }),
            Err(error) => Err(WireError::from_lease_error(error)),
        })
        .collect();
    if batch {
        return Ok(ResponseBody::Batch(results));
    }
    match (results.pop(), results.is_empty()) {
        (Some(result), true) => result.map(ResponseBody::Lease),
        _ => Err(WireError::new(
            ErrorCode::Internal,
            "one operation produced a number of outcomes other than one",
        )),
    }
}

async fn run_expiry(shared: Arc<NodeShared>) {
    let interval = Duration::from_millis(shared.config.timing.expire_interval_ms.max(1));
    let min_gap_ms = 1_000 / u64::from(shared.config.timing.expire_commands_per_s_max.max(1));
    let leases_max = shared.config.timing.expire_batch_max;
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        for handle in shared.hosted() {
            handle.maybe_expire(leases_max, min_gap_ms);
        }
    }
}

async fn run_balancer(shared: Arc<NodeShared>) {
    let interval_ms = shared.config.timing.rebalance_interval_ms;
    if interval_ms == 0 {
        return;
    }
    let node_id = shared.config.node_id;
    // A node must have been connected for two whole rounds before groups move to it, so a node
    // that is shutting down (or flapping) is not handed leadership back.
    let mut connected_rounds: HashMap<u64, u32> = HashMap::new();
    let mut ticker = tokio::time::interval(Duration::from_millis(interval_ms));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        if shared.shutting_down.load(Ordering::SeqCst) {
            return;
        }
        for &peer in &shared.node_ids {
            if peer == node_id {
                continue;
            }
            let rounds = connected_rounds.entry(peer).or_insert(0);
            *rounds = if shared.transport.is_connected(peer) {
                rounds.saturating_add(1)
            } else {
                0
            };
        }
        let mut moved = 0;
        for handle in shared.hosted() {
            if moved >= 16 || !handle.is_ready_leader() {
                continue;
            }
            let replicas = replicas_of(
                handle.group_id(),
                &shared.node_ids,
                shared.config.replication_factor,
            );
            let Some(&preferred) = replicas.first() else {
                continue;
            };
            if preferred == node_id || connected_rounds.get(&preferred).copied().unwrap_or(0) < 2 {
                continue;
            }
            let Some((last, progress)) = handle.follower_progress() else {
                continue;
            };
            let caught_up = progress
                .iter()
                .any(|(node, matched)| *node == preferred && *matched >= last);
            if caught_up {
                info!(
                    group = handle.group_id(),
                    to = preferred,
                    "moving leadership to the preferred node"
                );
                ::metrics::counter!(m::LEADER_TRANSFERS_TOTAL).increment(1);
                handle.transfer_leadership(preferred).await;
                moved += 1;
            }
        }
    }
}

/// The notAfter (Unix seconds) of the node certificate in `path`, if it can be read.
fn certificate_expiry_unix_s(path: &std::path::Path) -> Option<i64> {
    let pem = std::fs::read(path).ok()?;
    let (_, pem) = x509_parser::pem::parse_x509_pem(&pem).ok()?;
    let certificate = pem.parse_x509().ok()?;
    Some(certificate.validity().not_after.timestamp())
}

async fn run_gauges(shared: Arc<NodeShared>) {
    m::register_all();
    let certificate_expiry = certificate_expiry_unix_s(&shared.config.tls.node_cert);
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    loop {
        ticker.tick().await;
        let mut led = 0u64;
        let mut active = 0u64;
        let mut lag = 0u64;
        let mut hosted = 0u64;
        let mut overdue_ms = 0u64;
        for handle in shared.hosted() {
            hosted += 1;
            lag += handle.apply_lag_entries();
            if handle.is_ready_leader() {
                led += 1;
                active += handle.active_leases();
                overdue_ms = overdue_ms.max(handle.expiry_overdue_ms().unwrap_or(0));
            }
        }
        let readiness = shared.readiness();
        ::metrics::gauge!(m::NODE_READY).set(if readiness.ready { 1.0 } else { 0.0 });
        ::metrics::gauge!(m::GROUPS_WITHOUT_LEADER)
            .set(f64::from(readiness.groups - readiness.groups_with_leader));
        ::metrics::gauge!(m::EXPIRY_OVERDUE_SECONDS).set(overdue_ms as f64 / 1_000.0);
        if let Some(expiry) = certificate_expiry {
            ::metrics::gauge!(m::CERTIFICATE_EXPIRY_TIMESTAMP_SECONDS).set(expiry as f64);
        }
        if let Ok(stats) = rustix::fs::statvfs(shared.storage.data_dir()) {
            let block = stats.f_frsize as f64;
            ::metrics::gauge!(m::DATA_DIR_AVAILABLE_BYTES).set(stats.f_bavail as f64 * block);
            ::metrics::gauge!(m::DATA_DIR_TOTAL_BYTES).set(stats.f_blocks as f64 * block);
        }
        ::metrics::gauge!(m::GROUPS_LED).set(led as f64);
        ::metrics::gauge!(m::GROUPS_HOSTED).set(hosted as f64);
        ::metrics::gauge!(m::ACTIVE_LEASES).set(active as f64);
        ::metrics::gauge!(m::APPLY_LAG_ENTRIES).set(lag as f64);
        ::metrics::gauge!(m::REQUESTS_INFLIGHT).set(f64::from(shared.admission.inflight()));
        let pressured = shared
            .renewal_pressure
            .tenants_under_pressure(shared.clock.now_ms());
        ::metrics::gauge!(m::RENEWAL_PRESSURE_TENANTS).set(pressured as f64);
        let storage = shared.storage.stats();
        ::metrics::counter!(m::FSYNCS_TOTAL).absolute(storage.fsyncs);
        ::metrics::gauge!(m::FSYNC_SECONDS_TOTAL).set(storage.fsync_micros as f64 / 1e6);
        if storage.fsyncs > 0 {
            ::metrics::gauge!(m::ENTRIES_PER_FSYNC)
                .set(storage.entries_appended as f64 / storage.fsyncs as f64);
        }
        let transport = shared.transport.stats();
        ::metrics::counter!(m::TRANSPORT_FRAMES_TOTAL).absolute(transport.frames_sent);
        ::metrics::counter!(m::TRANSPORT_MESSAGES_TOTAL).absolute(transport.messages_sent);
        ::metrics::counter!(m::TRANSPORT_APPEND_REQUESTS_TOTAL)
            .absolute(transport.append_requests_sent);
        ::metrics::counter!(m::TRANSPORT_APPEND_ENTRIES_TOTAL)
            .absolute(transport.append_entries_sent);
        ::metrics::counter!(m::TRANSPORT_APPEND_REQUESTS_WITHOUT_ENTRIES_TOTAL)
            .absolute(transport.append_requests_without_entries_sent);
        ::metrics::counter!(m::TRANSPORT_APPEND_COMMITS_CARRIED_TOTAL)
            .absolute(transport.append_requests_carried);
        if transport.frames_sent > 0 {
            ::metrics::gauge!(m::TRANSPORT_MESSAGES_PER_FRAME)
                .set(transport.messages_sent as f64 / transport.frames_sent as f64);
        }
    }
}

/// Learns the leaders of groups this node does not host by asking the other nodes (only when
/// the replication factor is below the node count).
async fn run_leader_exchange(shared: Arc<NodeShared>) {
    if shared.groups.iter().all(Option::is_some) {
        return;
    }
    let principal = Principal {
        principal_id: format!("node-{}", shared.config.node_id),
        tenant_id: String::new(),
    };
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    loop {
        ticker.tick().await;
        for &peer in &shared.node_ids {
            if peer == shared.config.node_id {
                continue;
            }
            let answer = shared
                .forwarder
                .forward(
                    peer,
                    &principal,
                    RequestFlags::default(),
                    RequestBody::Routing,
                    Duration::from_secs(2),
                )
                .await;
            let Ok(ResponseBody::Routing(table)) = answer else {
                continue;
            };
            if let Ok(mut views) = shared.remote_leaders.lock() {
                for leader in table.leaders {
                    if let Some(view) = views.get_mut(leader.group_id as usize) {
                        if leader.term >= view.term && leader.leader.is_some() {
                            *view = LeaderView {
                                leader: leader.leader,
                                term: leader.term,
                            };
                        }
                    }
                }
            }
        }
    }
}
