//! This node's group replicas: opening them at start, creating and dropping them at run time.
//!
//! Which replicas a node hosts is recorded in its storage (`NodeStorage::recorded_replicas`),
//! never derived from the configuration after the first start: the first start of a data
//! directory opens the configured layout (`placement::replicas_of`) and records it once its
//! bootstrap is settled, and membership changes ([`crate::membership`]) add and drop replicas
//! from then on. A group is founded (openraft `initialize`) only by its preferred node, only on
//! that node's first start, and only after every other node answered that it holds no
//! initialized replica of the group ([`crate::membership`]'s bootstrap): a node whose data was
//! lost, starting empty, joins the existing group instead of founding a second copy.
//!
//! Dropping a replica (`crate::membership`) stops it and removes it from the record; its data stays on disk (a later
//! `CreateReplica` of the same group reopens it, a lagging replica Raft brings up to date), so a
//! drop can only cost availability, never a vote or an acknowledged entry.
//!
//! Also the table of replica moves this node runs ([`Moves`]; the moves themselves are
//! [`crate::membership`]'s).
//!
//! Must not depend on: the request path, the shared node state or the background tasks (the
//! run-time creating and dropping, which needs them, is [`crate::membership`]'s).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use openraft::impls::BasicNode;
use tenure_core::StateOptions;
use tenure_proto::client::{GroupMembers, WireError};
use tenure_storage::{GroupStateMachine, NodeStorage};
use tenure_transport::{GroupNetworkFactory, GroupRaft, GroupTable, Transport};
use tokio::sync::watch;

use crate::clock::MonotonicClock;
use crate::config::ServerConfig;
use crate::error::ServerError;
use crate::group::{GroupHandle, GroupSettings};
use crate::placement::replicas_of;

/// Threads restoring the groups' state machines at start, at most.
const RESTORE_THREADS_MAX: usize = 8;

/// What every replica of this node is created with.
#[derive(Clone)]
pub(crate) struct ReplicaSettings {
    pub(crate) state_options: StateOptions,
    pub(crate) raft_config: Arc<openraft::Config>,
    pub(crate) clock: Arc<dyn MonotonicClock>,
    pub(crate) settings: GroupSettings,
    /// Sees every entry the replicas apply: answers the AcquireWait calls parked here.
    pub(crate) waits: Arc<crate::waits::WaitRegistry>,
    /// Sees every entry the replicas apply: the watch rings.
    pub(crate) watches: Arc<crate::watch::WatchHub>,
}

/// Opens replicas: their stores, their Raft, their registration with the transport.
pub(crate) struct ReplicaFactory {
    node_id: u64,
    pub(crate) storage: NodeStorage,
    transport: Transport,
    pub(crate) table: Arc<GroupTable>,
    settings: ReplicaSettings,
    /// One create or drop at a time (each rewrites the replica record).
    pub(crate) serial: tokio::sync::Mutex<()>,
}

/// A group this node bootstraps on a fresh cluster: its Raft, members and id.
pub(crate) type FreshGroup = (GroupRaft, BTreeMap<u64, BasicNode>, u32);

impl ReplicaFactory {
    pub(crate) fn new(
        node_id: u64,
        storage: NodeStorage,
        transport: Transport,
        table: Arc<GroupTable>,
        settings: ReplicaSettings,
    ) -> Self {
        ReplicaFactory {
            node_id,
            storage,
            transport,
            table,
            settings,
            serial: tokio::sync::Mutex::new(()),
        }
    }

    /// The registry of AcquireWait calls parked on this node, which every replica's applies feed.
    pub(crate) fn waits(&self) -> Arc<crate::waits::WaitRegistry> {
        Arc::clone(&self.settings.waits)
    }

    /// The watch rings, which every replica's applies feed.
    pub(crate) fn watches(&self) -> Arc<crate::watch::WatchHub> {
        Arc::clone(&self.settings.watches)
    }

    /// Opens this node's replica of `group` (empty when it has no data) and registers it with
    /// the transport.
    pub(crate) async fn open(
        &self,
        group: u32,
    ) -> Result<(GroupRaft, Arc<GroupHandle>), ServerError> {
        let state_machine = self
            .storage
            .state_machine(group, self.settings.state_options)?;
        self.open_restored(group, state_machine).await
    }

    /// Restores the state machines of `groups` from their snapshots, several at once on blocking
    /// threads (one per core, at most [`RESTORE_THREADS_MAX`]): a restart with millions of
    /// leases reads and checks every record, and the groups are independent (issue 25). The
    /// first failure joined is the answer, and it stops the other threads at their next group.
    /// On a memory disk (the simulation) one after another, so that a seed replays exactly.
    async fn restore_state_machines(
        &self,
        groups: &BTreeSet<u32>,
    ) -> Result<BTreeMap<u32, GroupStateMachine>, ServerError> {
        if self.storage.runs_blocking_work_inline() {
            // A memory disk (the simulation): in order, on this thread, so a seed replays.
            let mut machines = BTreeMap::new();
            for &group in groups {
                let machine = self
                    .storage
                    .state_machine(group, self.settings.state_options)?;
                machines.insert(group, machine);
            }
            return Ok(machines);
        }
        let threads = std::thread::available_parallelism()
            .map_or(1, std::num::NonZeroUsize::get)
            .clamp(1, RESTORE_THREADS_MAX)
            .min(groups.len().max(1));
        let queue = Arc::new(Mutex::new(groups.iter().copied().collect::<Vec<u32>>()));
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..threads {
            let queue = Arc::clone(&queue);
            let storage = self.storage.clone();
            let options = self.settings.state_options;
            tasks.spawn_blocking(move || {
                let mut restored = Vec::new();
                loop {
                    let next = queue
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .pop();
                    let Some(group) = next else {
                        return Ok(restored);
                    };
                    match storage.state_machine(group, options) {
                        Ok(machine) => restored.push((group, machine)),
                        Err(error) => {
                            // The start fails: the other threads stop at their next group
                            // instead of restoring every snapshot first.
                            queue
                                .lock()
                                .unwrap_or_else(std::sync::PoisonError::into_inner)
                                .clear();
                            return Err(error);
                        }
                    }
                }
            });
        }
        let mut machines = BTreeMap::new();
        while let Some(joined) = tasks.join_next().await {
            let restored: Result<Vec<_>, tenure_storage::StoreError> = joined.map_err(|err| {
                ServerError::DataDir(format!("restoring the groups' state machines: {err}"))
            })?;
            machines.extend(restored?);
        }
        Ok(machines)
    }

    /// [`Self::open`] with the group's state machine already restored.
    async fn open_restored(
        &self,
        group: u32,
        state_machine: GroupStateMachine,
    ) -> Result<(GroupRaft, Arc<GroupHandle>), ServerError> {
        let ReplicaSettings {
            state_options: _,
            raft_config,
            clock,
            settings,
            waits,
            watches,
        } = &self.settings;
        let observer: Arc<dyn tenure_storage::ApplyObserver> =
            Arc::new(crate::watch::AppliedFeed {
                waits: waits.clone(),
                watches: watches.clone(),
            });
        let state_machine = state_machine.with_apply_observer(observer);
        let raft = GroupRaft::new(
            self.node_id,
            raft_config.clone(),
            GroupNetworkFactory::new(self.transport.clone(), group),
            self.storage.log_store(group),
            state_machine.clone(),
        )
        .await
        .map_err(|e| ServerError::Raft(format!("creating group {group}: {e}")))?;
        self.table.insert(group, raft.clone());
        let handle = GroupHandle::start(
            group,
            self.node_id,
            raft.clone(),
            state_machine,
            clock.clone(),
            settings.clone(),
        );
        Ok((raft, handle))
    }

    /// Opens the replicas this node hosts at start: the recorded ones, or, when nothing is
    /// recorded (a data directory's first start, or one whose data was lost), the configured
    /// layout (none for a node that joins a running cluster, `cluster.join_existing`). Returns the replicas by group id, the groups this node is the preferred node of
    /// and may have to found (first start only), and the set to record once that is settled
    /// (`None` when the record exists).
    pub(crate) async fn open_at_start(
        &self,
        config: &ServerConfig,
    ) -> Result<AtStart, ServerError> {
        let node_ids: Vec<u64> = config.peers.keys().copied().collect();
        let recorded = self.storage.recorded_replicas()?;
        let first_start = recorded.is_none();
        let hosted: BTreeSet<u32> = match recorded {
            Some(groups) => groups,
            // A node joining a running cluster starts empty: the placement controller moves
            // replicas to it; it never founds a group.
            None if config.cluster.join_existing => BTreeSet::new(),
            None => (0..config.groups)
                .filter(|&group| {
                    replicas_of(group, &node_ids, config.replication_factor).contains(&self.node_id)
                })
                .collect(),
        };
        if let Some(beyond) = hosted.iter().find(|&&group| group >= config.groups) {
            return Err(ServerError::Config(format!(
                "this node's data holds a replica of group {beyond}, but the configuration has \
                 only {} groups",
                config.groups
            )));
        }
        let mut groups: Vec<Option<Arc<GroupHandle>>> = vec![None; config.groups as usize];
        let mut fresh = Vec::new();
        let mut raft_state_found = false;
        let restore_started = std::time::Instant::now();
        let mut restored = self.restore_state_machines(&hosted).await?;
        let restored_leases: u64 = restored
            .values()
            .map(|machine| machine.with_leases(|leases| leases.stats().lease_records))
            .sum();
        tracing::info!(
            node = self.node_id,
            groups = restored.len(),
            lease_records = restored_leases,
            seconds = restore_started.elapsed().as_secs_f64(),
            "restored the groups' state machines from their snapshots"
        );
        for &group in &hosted {
            let Some(state_machine) = restored.remove(&group) else {
                return Err(ServerError::DataDir(format!(
                    "group {group}'s state machine was not restored (a bug)"
                )));
            };
            let (raft, handle) = self.open_restored(group, state_machine).await?;
            if first_start && !raft_state_found {
                raft_state_found = self.has_raft_state(group).await?;
            }
            let replicas = replicas_of(group, &node_ids, config.replication_factor);
            if first_start
                && replicas.first() == Some(&self.node_id)
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
                fresh.push((raft, members, group));
            }
            if let Some(slot) = groups.get_mut(group as usize) {
                *slot = Some(handle);
            }
        }
        Ok(AtStart {
            groups,
            fresh,
            to_record: first_start.then_some(hosted),
            raft_state_found,
        })
    }

    /// True when this node's storage holds a vote or a log (entries or a purge mark) of
    /// `group`: written by an earlier run of this data directory, never by a wiped one.
    async fn has_raft_state(&self, group: u32) -> Result<bool, ServerError> {
        use openraft::RaftLogReader as _;
        use openraft::storage::RaftLogStorage as _;
        let mut log = self.storage.log_store(group);
        let failed = |e: std::io::Error| {
            ServerError::Raft(format!("reading group {group}'s vote and log state: {e}"))
        };
        let vote = log.read_vote().await.map_err(failed)?;
        let state = log.get_log_state().await.map_err(failed)?;
        Ok(vote.is_some() || state.last_log_id.is_some())
    }
}

/// What a node opens at start (see [`ReplicaFactory::open_at_start`]).
pub(crate) struct AtStart {
    pub(crate) groups: Vec<Option<Arc<GroupHandle>>>,
    pub(crate) fresh: Vec<FreshGroup>,
    pub(crate) to_record: Option<BTreeSet<u32>>,
    /// On a first start: some replica's storage holds a vote or a log (the directory ran
    /// before and crashed before recording its replicas; `crate::replica_gate`).
    pub(crate) raft_state_found: bool,
}

pub(crate) type MoveResult = Option<Result<GroupMembers, WireError>>;

/// A move in progress on this node.
pub(crate) struct RunningMove {
    pub(crate) from: u64,
    pub(crate) to: u64,
    pub(crate) done: watch::Receiver<MoveResult>,
}

/// The moves this node runs as a leader.
pub(crate) struct Moves {
    pub(crate) running: Mutex<BTreeMap<u32, RunningMove>>,
    pub(crate) inflight: AtomicUsize,
}

impl Moves {
    pub(crate) fn new() -> Self {
        Moves {
            running: Mutex::new(BTreeMap::new()),
            inflight: AtomicUsize::new(0),
        }
    }

    /// Moves running now.
    pub(crate) fn inflight(&self) -> usize {
        self.inflight.load(Ordering::Relaxed)
    }
}
