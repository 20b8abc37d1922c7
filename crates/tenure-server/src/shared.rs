//! The state one node's request path and background tasks share: its configuration, the group
//! replicas it hosts, the leaders it knows, admission, forwarding, transport and storage handles,
//! and the readiness they add up to.
//!
//! Must not depend on: the request path (`request`), the background tasks or the node's start-up
//! (`node`); they all build on this.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use tenure_core::PlacementMap;
use tenure_storage::NodeStorage;
use tenure_transport::Transport;

use crate::admission::{Admission, RenewalPressure};
use crate::auth::Authenticator;
use crate::clock::MonotonicClock;
use crate::config::ServerConfig;
use crate::fault_control::FaultControls;
use crate::forward::Forwarder;
use crate::group::{GroupHandle, LeaderView};

/// Readiness as `GET /readyz` reports it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Readiness {
    /// True when this node sees a leader for every group, is not shutting down and its storage
    /// has not failed.
    pub ready: bool,
    /// Groups in the cluster.
    pub groups: u32,
    /// Groups whose leader this node knows.
    pub groups_with_leader: u32,
    /// Groups this node leads.
    pub groups_led: u32,
    /// True once a graceful shutdown began.
    pub shutting_down: bool,
    /// The failure that stopped this node's storage (a failed WAL sync: every group on the node
    /// stops until it restarts, runbook `ops/runbooks/StorageCorrupt.md`), else `None` (JSON
    /// `null`). A node with a storage failure is not ready.
    pub storage_failure: Option<String>,
}

/// State shared by the node's tasks and request handlers.
pub struct NodeShared {
    pub(crate) config: ServerConfig,
    pub(crate) auth: Authenticator,
    /// The configured peers (the members until the node table is recorded).
    pub(crate) node_ids: Vec<u64>,
    /// The replicas this node hosts, by group id (`None`: not hosted here). Replicas are added
    /// and dropped at run time by membership changes (`crate::replicas`).
    pub(crate) groups: RwLock<Vec<Option<Arc<GroupHandle>>>>,
    /// Creates and drops replicas at run time.
    pub(crate) replicas: crate::replicas::ReplicaFactory,
    /// Replica moves this node runs as a group's leader.
    pub(crate) moves: crate::replicas::Moves,
    pub(crate) placement: PlacementMap,
    pub(crate) remote_leaders: Mutex<Vec<LeaderView>>,
    pub(crate) forwarder: Arc<Forwarder>,
    pub(crate) transport: Transport,
    pub(crate) storage: NodeStorage,
    pub(crate) metrics_handle: Option<metrics_exporter_prometheus::PrometheusHandle>,
    pub(crate) shutting_down: AtomicBool,
    pub(crate) admission: Admission,
    pub(crate) renewal_pressure: RenewalPressure,
    /// The AcquireWait calls parked on this node (`crate::waits`).
    pub(crate) waits: Arc<crate::waits::WaitRegistry>,
    /// The watch rings of the groups hosted here (`crate::watch`).
    pub(crate) watches: Arc<crate::watch::WatchHub>,
    /// The clock the groups' leader clocks read (and renewal pressure is timed by).
    pub(crate) clock: Arc<dyn MonotonicClock>,
    pub(crate) fault_controls: Option<Arc<FaultControls>>,
    /// The cluster's node table as this node knows it (`crate::cluster`).
    pub(crate) cluster: RwLock<Arc<tenure_core::ClusterMeta>>,
    /// Serializes making the transport and the forwarder follow the table.
    pub(crate) cluster_follow: Mutex<()>,
    /// SHA-256 of this node's certificate (reported in `NodeUp`).
    pub(crate) cert_sha256: [u8; 32],
    /// This node's data directory incarnation (its creation time; reported in `NodeUp`).
    pub(crate) incarnation: u64,
    /// Whether peers may reach this node's replicas (`crate::replica_gate`).
    pub(crate) replica_gate: Arc<crate::replica_gate::ReplicaGate>,
    /// The founders' incarnations this node pinned before its replicas first opened
    /// (`crate::founders`; empty until then, and on nodes that joined an existing cluster).
    pub(crate) founder_pins: Mutex<crate::founders::FounderPins>,
}

impl std::fmt::Debug for NodeShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeShared")
            .field("node_id", &self.config.node_id)
            .finish_non_exhaustive()
    }
}

impl NodeShared {
    pub(crate) fn fault_controls(&self) -> Option<Arc<FaultControls>> {
        self.fault_controls.clone()
    }

    /// The replicas hosted here now, by group id.
    pub(crate) fn hosted(&self) -> Vec<Arc<GroupHandle>> {
        self.groups
            .read()
            .map(|groups| groups.iter().flatten().cloned().collect())
            .unwrap_or_default()
    }

    /// This node's replica of `group`, if it hosts one.
    pub(crate) fn group(&self, group: u32) -> Option<Arc<GroupHandle>> {
        self.groups
            .read()
            .ok()
            .and_then(|groups| groups.get(group as usize).cloned().flatten())
    }

    /// Voters each group should have: the replication factor, at most the number of members.
    pub(crate) fn voters_wanted(&self) -> usize {
        usize::try_from(self.config.replication_factor)
            .unwrap_or(usize::MAX)
            .clamp(1, self.member_nodes().len().max(1))
    }

    /// `INVALID_ARGUMENT` unless `group` is one of the cluster's groups.
    pub(crate) fn check_group_id(&self, group: u32) -> Result<(), tenure_proto::client::WireError> {
        if group >= self.config.groups {
            return Err(tenure_proto::client::WireError::new(
                tenure_core::ErrorCode::InvalidArgument,
                format!(
                    "group {group} does not exist (the cluster has {})",
                    self.config.groups
                ),
            ));
        }
        Ok(())
    }

    /// Every member but this one.
    pub(crate) fn other_nodes(&self) -> Vec<u64> {
        self.member_nodes()
            .into_iter()
            .filter(|&node| node != self.config.node_id)
            .collect()
    }

    /// True when this node hosts a replica of every group.
    pub(crate) fn hosts_every_group(&self) -> bool {
        self.groups
            .read()
            .map(|groups| groups.iter().all(Option::is_some))
            .unwrap_or(false)
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
            ready: with_leader == groups
                && !shutting_down
                && storage_failure.is_none()
                && self.replica_gate.is_open(),
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
}
