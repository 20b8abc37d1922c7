//! In-process clusters over real QUIC on loopback with real RocksDB storage, for tests and
//! benchmarks (feature `testing`).
//!
//! [`LocalCluster::start`] generates a cluster CA and node certificates, opens one
//! `NodeStorage` per node in a temporary directory, binds one [`Transport`] per node on
//! 127.0.0.1, creates every group's openraft replica on every node, starts the node-wide
//! heartbeat driver and initializes each group from one node (spreading first leaderships).
//! Nodes can be stopped and restarted from their data; one shared [`FaultInjector`] cuts or
//! perturbs links. [`LocalCluster::add_node`] starts one more node later, which the running
//! nodes' transports learn of only when the test adds it (`Transport::add_peer`).
//!
//! This is scaffolding, not the server: placement is "every group on every node", log time is
//! milliseconds since the cluster started, and there is no client API. Must not be used by
//! production code paths.

use std::collections::BTreeMap;
use std::net::{SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::ServerState;
use openraft::impls::BasicNode;
use openraft::type_config::async_runtime::WatchReceiver;
use tenure_core::{ApplyOutput, Command, Entry, StateOptions};
use tenure_storage::{GroupStateMachine, NodeStorage, StorageOptions};
use tokio::task::JoinHandle;

use crate::certs::{ClusterCa, generate_cluster_ca, issue_node_certificate};
use crate::config::{GroupTiming, TransportConfig};
use crate::fault::FaultInjector;
use crate::network::GroupNetworkFactory;
use crate::registry::{GroupRaft, GroupRegistry, GroupTable};
use crate::stats::TransportStatsSnapshot;
use crate::tls::NodeTls;
use crate::transport::Transport;

/// What went wrong in the harness.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ClusterError(pub String);

fn fail(context: &str, error: impl std::fmt::Display) -> ClusterError {
    ClusterError(format!("{context}: {error}"))
}

/// Shape of a local cluster.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Node count (ids 1..=nodes).
    pub nodes: u64,
    /// Group count (ids 0..groups); every node hosts every group.
    pub groups: u32,
    /// Raft timing.
    pub timing: GroupTiming,
    /// Sync the WAL before acknowledging appends (the production setting).
    pub fsync: bool,
    /// Seed of the fault injector and the transports' jitter.
    pub seed: u64,
    /// Lane writer linger, in microseconds.
    pub linger_us: u64,
    /// Snapshot after this many applied entries (openraft `since_last`); `None` uses openraft's
    /// default.
    pub snapshot_every_entries: Option<u64>,
    /// How long an entry-less append waits for the next entry to carry its commit, in
    /// microseconds (`TransportConfig::commit_linger_us`).
    pub commit_linger_us: u64,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        Self {
            nodes: 3,
            groups: 8,
            timing: GroupTiming::default(),
            fsync: true,
            seed: 1,
            linger_us: 100,
            snapshot_every_entries: None,
            commit_linger_us: 5_000,
        }
    }
}

/// One running node of a [`LocalCluster`].
pub struct LocalNode {
    /// Node id.
    pub id: u64,
    /// Its transport.
    pub transport: Transport,
    /// Its storage.
    pub storage: NodeStorage,
    /// Its group replicas.
    pub table: Arc<GroupTable>,
    /// Each group's state machine (clones share state with the replica's).
    pub state_machines: BTreeMap<u32, GroupStateMachine>,
    heartbeat: JoinHandle<()>,
}

impl LocalNode {
    /// The replica of `group`.
    pub fn raft(&self, group: u32) -> Option<GroupRaft> {
        self.table.group(group)
    }
}

/// An in-process cluster.
pub struct LocalCluster {
    options: ClusterOptions,
    dir: tempfile::TempDir,
    ca: ClusterCa,
    addrs: BTreeMap<u64, SocketAddr>,
    nodes: BTreeMap<u64, LocalNode>,
    faults: Arc<FaultInjector>,
    started: Instant,
}

fn free_loopback_port() -> Result<SocketAddr, ClusterError> {
    let socket = UdpSocket::bind("127.0.0.1:0").map_err(|e| fail("binding a probe socket", e))?;
    socket
        .local_addr()
        .map_err(|e| fail("reading the probe socket", e))
}

impl LocalCluster {
    /// Starts every node and initializes every group (first leaders spread over the nodes).
    pub async fn start(options: ClusterOptions) -> Result<Self, ClusterError> {
        let dir = tempfile::tempdir().map_err(|e| fail("creating the cluster directory", e))?;
        let ca = generate_cluster_ca("tenure-test").map_err(|e| fail("generating the CA", e))?;
        let mut addrs = BTreeMap::new();
        for id in 1..=options.nodes {
            addrs.insert(id, free_loopback_port()?);
        }
        let faults = Arc::new(FaultInjector::new(options.seed));
        let mut cluster = Self {
            options,
            dir,
            ca,
            addrs,
            nodes: BTreeMap::new(),
            faults,
            started: Instant::now(),
        };
        let ids: Vec<u64> = cluster.addrs.keys().copied().collect();
        for &id in &ids {
            cluster.start_node(id).await?;
        }
        let members: BTreeMap<u64, BasicNode> = cluster
            .addrs
            .iter()
            .map(|(&id, addr)| (id, BasicNode::new(addr.to_string())))
            .collect();
        for group in 0..cluster.options.groups {
            let initializer = ids[usize::try_from(group).unwrap_or(0) % ids.len()];
            let raft = cluster
                .node(initializer)
                .and_then(|node| node.raft(group))
                .ok_or_else(|| ClusterError(format!("group {group} missing on {initializer}")))?;
            raft.initialize(members.clone())
                .await
                .map_err(|e| fail(&format!("initializing group {group}"), e))?;
        }
        Ok(cluster)
    }

    /// Starts a new node, id one above the highest so far, on a fresh address: its transport
    /// knows every node; its group replicas are uninitialized (a member to be, for the test to
    /// add to groups). The running nodes' transports do not know it until the test calls
    /// `Transport::add_peer` on them (nodes started later know it from the start). Returns its
    /// id.
    pub async fn add_node(&mut self) -> Result<u64, ClusterError> {
        let id = self.addrs.keys().next_back().map_or(1, |last| last + 1);
        self.addrs.insert(id, free_loopback_port()?);
        self.start_node(id).await?;
        Ok(id)
    }

    /// The address of node `id`'s transport.
    pub fn addr(&self, id: u64) -> Option<SocketAddr> {
        self.addrs.get(&id).copied()
    }

    /// (Re)starts node `id` from its data directory.
    pub async fn start_node(&mut self, id: u64) -> Result<(), ClusterError> {
        let addr = *self
            .addrs
            .get(&id)
            .ok_or_else(|| ClusterError(format!("no node {id}")))?;
        let node_dir = self.dir.path().join(format!("node-{id}"));
        let spool_dir = node_dir.join("spool");
        std::fs::create_dir_all(&spool_dir).map_err(|e| fail("creating the spool dir", e))?;
        let certificate = issue_node_certificate(&self.ca, id, &[addr.ip()])
            .map_err(|e| fail("issuing a node certificate", e))?;
        let tls = NodeTls::from_pem(
            id,
            &self.ca.cert_pem,
            &certificate.cert_pem,
            &certificate.key_pem,
        )
        .map_err(|e| fail("loading node TLS", e))?;
        let storage = NodeStorage::open(
            &node_dir.join("db"),
            StorageOptions {
                fsync: self.options.fsync,
                block_cache_bytes: 8 << 20,
                write_buffer_bytes: 8 << 20,
                ..StorageOptions::default()
            },
        )
        .map_err(|e| fail("opening node storage", e))?;
        let table = Arc::new(GroupTable::new(spool_dir));
        let mut config = TransportConfig::new(id, addr, self.addrs.clone());
        config.linger_us = self.options.linger_us;
        config.commit_linger_us = self.options.commit_linger_us;
        config.seed = self.options.seed ^ id;
        config.reconnect_backoff_max_ms = 500;
        let registry: Arc<dyn GroupRegistry> = table.clone();
        let transport = Transport::start(config, &tls, registry, Some(self.faults.clone()))
            .map_err(|e| fail("starting the transport", e))?;
        let mut raft_config = self
            .options
            .timing
            .openraft_config()
            .map_err(|e| fail("group timing", e))?;
        if let Some(entries) = self.options.snapshot_every_entries {
            raft_config.snapshot_policy = openraft::SnapshotPolicy::LogsSinceLast(entries);
            raft_config.max_in_snapshot_log_to_keep = 0;
            raft_config.purge_batch_size = 1;
        }
        let raft_config = Arc::new(raft_config);
        let mut state_machines = BTreeMap::new();
        for group in 0..self.options.groups {
            let log = storage.log_store(group);
            let state_machine = storage
                .state_machine(group, StateOptions::default())
                .map_err(|e| fail("opening a state machine", e))?;
            state_machines.insert(group, state_machine.clone());
            let raft = GroupRaft::new(
                id,
                raft_config.clone(),
                GroupNetworkFactory::new(transport.clone(), group),
                log,
                state_machine,
            )
            .await
            .map_err(|e| fail(&format!("creating group {group} on node {id}"), e))?;
            table.insert(group, raft);
        }
        let registry: Arc<dyn GroupRegistry> = table.clone();
        let heartbeat = crate::heartbeat::spawn_heartbeat_driver(
            registry,
            Duration::from_millis(self.options.timing.heartbeat_interval_ms),
        );
        self.nodes.insert(
            id,
            LocalNode {
                id,
                transport,
                storage,
                table,
                state_machines,
                heartbeat,
            },
        );
        Ok(())
    }

    /// Stops node `id`: every replica, the heartbeat driver, the transport, the storage.
    pub async fn stop_node(&mut self, id: u64) {
        let Some(node) = self.nodes.remove(&id) else {
            return;
        };
        node.heartbeat.abort();
        for raft in node.table.groups() {
            let _ = raft.shutdown().await;
        }
        node.transport.shutdown().await;
        for group in 0..self.options.groups {
            node.table.remove(group);
        }
    }

    /// Stops every node.
    pub async fn shutdown(mut self) {
        let ids: Vec<u64> = self.nodes.keys().copied().collect();
        for id in ids {
            self.stop_node(id).await;
        }
    }

    /// A running node.
    pub fn node(&self, id: u64) -> Option<&LocalNode> {
        self.nodes.get(&id)
    }

    /// Ids of the running nodes.
    pub fn live_nodes(&self) -> Vec<u64> {
        self.nodes.keys().copied().collect()
    }

    /// The shared fault injector.
    pub fn faults(&self) -> &Arc<FaultInjector> {
        &self.faults
    }

    /// The group count.
    pub fn groups(&self) -> u32 {
        self.options.groups
    }

    /// The data directory of node `id`.
    pub fn node_dir(&self, id: u64) -> PathBuf {
        self.dir.path().join(format!("node-{id}"))
    }

    /// Transport counters of every running node.
    pub fn transport_stats(&self) -> BTreeMap<u64, TransportStatsSnapshot> {
        self.nodes
            .iter()
            .map(|(&id, node)| (id, node.transport.stats()))
            .collect()
    }

    /// The leader of `group` as seen by `among` (running nodes only): a node that believes it
    /// leads with the highest term among them.
    pub fn leader_among(&self, group: u32, among: &[u64]) -> Option<u64> {
        let mut best: Option<(u64, u64)> = None;
        for id in among {
            let Some(raft) = self.nodes.get(id).and_then(|node| node.raft(group)) else {
                continue;
            };
            let metrics = raft.metrics().borrow_watched().clone();
            if metrics.state == ServerState::Leader
                && best.is_none_or(|(term, _)| metrics.current_term > term)
            {
                best = Some((metrics.current_term, *id));
            }
        }
        best.map(|(_, id)| id)
    }

    /// Waits until every group has a leader among `among` that a majority of `among` follows.
    pub async fn wait_for_leaders(
        &self,
        among: &[u64],
        timeout: Duration,
    ) -> Result<BTreeMap<u32, u64>, ClusterError> {
        let deadline = Instant::now() + timeout;
        loop {
            let mut leaders = BTreeMap::new();
            for group in 0..self.options.groups {
                let Some(leader) = self.leader_among(group, among) else {
                    break;
                };
                let followers = among
                    .iter()
                    .filter_map(|id| self.nodes.get(id).and_then(|node| node.raft(group)))
                    .filter(|raft| raft.metrics().borrow_watched().current_leader == Some(leader))
                    .count();
                if followers * 2 <= self.addrs.len() {
                    break;
                }
                leaders.insert(group, leader);
            }
            if leaders.len() == usize::try_from(self.options.groups).unwrap_or(usize::MAX) {
                return Ok(leaders);
            }
            if Instant::now() >= deadline {
                return Err(ClusterError(format!(
                    "only {} of {} groups have a settled leader among {among:?} after {timeout:?}",
                    leaders.len(),
                    self.options.groups
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The log time for a new entry: milliseconds since the cluster started.
    pub fn log_time_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Proposes `command` to `group` through its current leader among the running nodes,
    /// retrying on leader changes until `timeout`.
    pub async fn write(
        &self,
        group: u32,
        command: Command,
        timeout: Duration,
    ) -> Result<Option<ApplyOutput>, ClusterError> {
        let deadline = Instant::now() + timeout;
        let live = self.live_nodes();
        let mut last_error = String::from("no leader");
        while Instant::now() < deadline {
            if let Some(raft) = self
                .leader_among(group, &live)
                .and_then(|id| self.nodes.get(&id))
                .and_then(|node| node.raft(group))
            {
                let entry = Entry {
                    log_time_ms: self.log_time_ms(),
                    command: command.clone(),
                };
                let remaining = deadline.saturating_duration_since(Instant::now());
                match tokio::time::timeout(remaining, raft.client_write(entry)).await {
                    Ok(Ok(response)) => return Ok(response.data),
                    Ok(Err(error)) => last_error = error.to_string(),
                    Err(_) => last_error = "timed out".into(),
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err(ClusterError(format!(
            "write to group {group} failed within {timeout:?}: {last_error}"
        )))
    }

    /// Waits until every running replica of `group` applied the same last log id, then checks
    /// that their lease states are byte-identical. Returns the applied index.
    pub async fn wait_replicas_agree(
        &self,
        group: u32,
        timeout: Duration,
    ) -> Result<u64, ClusterError> {
        let deadline = Instant::now() + timeout;
        loop {
            let applied: Vec<_> = self
                .nodes
                .values()
                .filter_map(|node| node.state_machines.get(&group))
                .map(GroupStateMachine::last_applied)
                .collect();
            let leader_last = self
                .leader_among(group, &self.live_nodes())
                .and_then(|id| self.nodes.get(&id))
                .and_then(|node| node.raft(group))
                .and_then(|raft| raft.metrics().borrow_watched().last_log_index);
            let all_equal = applied.windows(2).all(|pair| pair[0] == pair[1]);
            let index = applied
                .first()
                .copied()
                .flatten()
                .map(|log_id| log_id.index);
            if all_equal && index.is_some() && index == leader_last {
                let states: Vec<Vec<u8>> = self
                    .nodes
                    .values()
                    .filter_map(|node| node.state_machines.get(&group))
                    .map(|machine| machine.with_leases(|leases| leases.snapshot_to_vec()))
                    .collect();
                if states.windows(2).all(|pair| pair[0] == pair[1]) {
                    return Ok(index.unwrap_or(0));
                }
                return Err(ClusterError(format!(
                    "group {group}: replicas applied the same log but hold different states"
                )));
            }
            if Instant::now() >= deadline {
                return Err(ClusterError(format!(
                    "group {group}: replicas did not converge within {timeout:?}: applied {applied:?}, leader's last index {leader_last:?}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
