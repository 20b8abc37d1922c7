//! Changing a group's replica set on a running cluster: moving one replica from one node to
//! another (the building block of adding capacity, draining and replacing nodes).
//!
//! A move runs on the group's ready leader, in a task of its own (it outlives the request that
//! started it; a second request for the same move waits for the same task):
//!
//! 1. `to` creates an empty replica of the group (`CreateReplica`, node to node; a replica it
//!    dropped earlier is reopened with its data);
//! 2. the leader adds `to` as a **learner** and waits until it has caught up (log or a streamed
//!    snapshot), at most [`CATCH_UP_TIMEOUT`]: the voters are untouched until then, so a quorum
//!    of caught-up voters exists throughout;
//! 3. the voters change from `V` to `V - from + to` by openraft's **joint consensus** (a joint
//!    entry needing a majority of both sets, then the new set alone); `from` leaves the group;
//! 4. `from` drops its replica (`DropReplica` with the log index of the membership entry that
//!    no longer lists it; on the leader itself, at once), which stops it and keeps its data (see
//!    [`crate::replicas`]). A node refuses a drop when its own replica lists it again at a later
//!    index (it was added back since); a node that was down is caught up with by the replica
//!    collector (`background::replica_gc`).
//!
//! A move is declarative: its goal is "`to` holds a voting replica, `from` none". A move whose
//! goal already holds answers the replica set (so a retried or repeated move is harmless). A
//! move interrupted by a leader change leaves a learner or a joint configuration behind;
//! repeating the same move finishes it (each step is idempotent: an existing replica, learner or
//! voter set is taken as it is). A failed catch-up removes the learner again. At most
//! [`MOVES_INFLIGHT_MAX`] moves run on one leader at a time.
//!
//! Also here: creating and dropping this node's replicas at run time, and founding fresh groups
//! on a data directory's first start ([`bootstrap`]: only once every other node answered that
//! no initialized replica of the group exists).
//!
//! Must not depend on: the request path's wire handling (it returns typed `WireError`s).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use openraft::ChangeMembers;
use openraft::impls::BasicNode;
use tenure_core::ErrorCode;
use tenure_proto::client::{
    GroupMembers, Principal, RequestBody, RequestFlags, ResponseBody, WireError,
};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::group::GroupHandle;
use crate::metrics as m;
use crate::replicas::{FreshGroup, MoveResult, RunningMove};
use crate::request::{RequestContext, invalid};
use crate::shared::NodeShared;

/// Moves one node runs at a time as a group leader.
pub const MOVES_INFLIGHT_MAX: usize = 2;
/// How long a new replica may take to catch up as a learner before the move gives up.
pub const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(600);
/// How long one node-to-node call of a move may take.
const NODE_CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Attempts to tell the old node to drop its replica (it may be down: then the replica
/// collector of its node drops it once it is back, `background::replica_gc`).
const DROP_ATTEMPTS: u32 = 3;

fn unavailable(message: impl Into<String>) -> WireError {
    WireError::new(ErrorCode::Unavailable, message)
}

/// The principal a node's own calls to other nodes carry.
pub(crate) fn node_principal(node_id: u64) -> Principal {
    Principal {
        principal_id: format!("node-{node_id}"),
        tenant_id: String::new(),
    }
}

fn raft_error(
    group: u32,
    step: &str,
    error: openraft::error::RaftError<
        tenure_storage::TenureRaft,
        openraft::error::ClientWriteError<tenure_storage::TenureRaft>,
    >,
) -> WireError {
    let mut wire = match error {
        openraft::error::RaftError::APIError(error) => crate::group::write_error(group, error),
        openraft::error::RaftError::Fatal(fatal) => unavailable(fatal.to_string()),
    };
    wire.message = format!("group {group}: {step}: {}", wire.message);
    wire
}

impl NodeShared {
    /// `GroupMembers`: the leader's view (this replica when it leads; forwarded when asked and
    /// the leader is known), else this node's replica's view, else `NOT_LEADER`.
    pub(crate) async fn group_members(
        self: &Arc<Self>,
        group: u32,
        ctx: &RequestContext,
    ) -> Result<ResponseBody, WireError> {
        self.check_group_id(group)?;
        let local = self.group(group);
        if let Some(handle) = &local {
            if handle.is_ready_leader() {
                return Ok(ResponseBody::Members(handle.members()));
            }
        }
        let view = self.leader_of(group);
        if let Some(leader) = view.leader.filter(|&l| l != self.config.node_id) {
            if ctx.flags.forward {
                let forwarded = self
                    .forwarder
                    .forward(
                        leader,
                        &ctx.principal,
                        ctx.flags,
                        RequestBody::GroupMembers { group_id: group },
                        ctx.timeout,
                    )
                    .await;
                if forwarded.is_ok() || local.is_none() {
                    return forwarded;
                }
            }
        }
        match local {
            Some(handle) => Ok(ResponseBody::Members(handle.members())),
            None => Err(self.not_leader(group)),
        }
    }

    /// `MoveReplica`: as the group's ready leader, starts the move (or joins the same move
    /// already running) and waits for it up to the request's timeout; elsewhere forwards it to
    /// the leader when asked.
    pub(crate) async fn move_replica(
        self: &Arc<Self>,
        group: u32,
        from: u64,
        to: u64,
        ctx: &RequestContext,
    ) -> Result<ResponseBody, WireError> {
        self.check_operator_or_node(ctx)?;
        self.check_group_id(group)?;
        if from == to {
            return Err(invalid("a move needs two different nodes"));
        }
        let members = self.member_nodes();
        if !members.contains(&to) {
            return Err(invalid(format!(
                "node {to} is not a member of this cluster (nodes {members:?})"
            )));
        }
        if self.cluster_view().version > 0 && !self.hosts_replicas(to) {
            return Err(invalid(format!(
                "node {to} does not take replicas (it is not active in the node table)"
            )));
        }
        let Some(handle) = self.group(group).filter(|h| h.is_ready_leader()) else {
            let body = RequestBody::MoveReplica {
                group_id: group,
                from,
                to,
            };
            return self.forward_to_leader(group, body, ctx).await;
        };
        let mut done = self.start_move(handle, from, to)?;
        let waited = tokio::time::timeout(ctx.timeout, done.wait_for(Option::is_some)).await;
        match waited {
            Ok(Ok(result)) => match result.clone() {
                Some(outcome) => outcome.map(ResponseBody::Members),
                None => Err(unavailable("the move ended without an outcome")),
            },
            Ok(Err(_)) => Err(unavailable("the move's task ended without an outcome")),
            Err(_) => Err(unavailable(format!(
                "group {group}: the move from node {from} to node {to} is still running after \
                 {} ms; `GroupMembers` shows its progress",
                ctx.timeout.as_millis()
            ))),
        }
    }

    /// Starts a move (or returns the running one's outcome channel).
    fn start_move(
        self: &Arc<Self>,
        handle: Arc<GroupHandle>,
        from: u64,
        to: u64,
    ) -> Result<watch::Receiver<MoveResult>, WireError> {
        let group = handle.group_id();
        let mut running = self
            .moves
            .running
            .lock()
            .map_err(|_| unavailable("the move table is poisoned"))?;
        if let Some(current) = running.get(&group) {
            if current.done.borrow().is_none() {
                if current.from == from && current.to == to {
                    return Ok(current.done.clone());
                }
                return Err(WireError::new(
                    ErrorCode::Unavailable,
                    format!(
                        "group {group} is already moving a replica from node {} to node {}",
                        current.from, current.to
                    ),
                ));
            }
        }
        if self.moves.inflight() >= MOVES_INFLIGHT_MAX {
            return Err(WireError::new(
                ErrorCode::Overloaded,
                format!("this node already runs {MOVES_INFLIGHT_MAX} replica moves"),
            ));
        }
        let (sender, done) = watch::channel(None);
        running.insert(
            group,
            RunningMove {
                from,
                to,
                done: done.clone(),
            },
        );
        self.moves.inflight.fetch_add(1, Ordering::Relaxed);
        let shared = self.clone();
        tokio::spawn(async move {
            // Whatever ends this task (an outcome, a panic, the runtime stopping), the slot is
            // given back and waiters get an outcome.
            let mut guard = MoveGuard {
                shared: shared.clone(),
                sender: Some(sender),
            };
            info!(group, from, to, "moving a replica");
            let outcome = run_move(&shared, &handle, from, to).await;
            let label = match &outcome {
                Ok(_) => "ok",
                Err(error) => error.code.as_str(),
            };
            match &outcome {
                Ok(members) => info!(group, from, to, voters = ?members.voters, "replica moved"),
                Err(error) => warn!(group, from, to, "replica move failed: {}", error.message),
            }
            ::metrics::counter!(m::REPLICA_MOVES_TOTAL, "result" => label).increment(1);
            guard.finish(outcome);
        });
        Ok(done)
    }

    /// Asks `node` (or this node) to create or drop its replica of `group`.
    async fn replica_call(&self, node: u64, body: RequestBody) -> Result<(), WireError> {
        if node == self.config.node_id {
            return match body {
                RequestBody::CreateReplica { group_id } => self.add_replica(group_id).await,
                RequestBody::DropReplica {
                    group_id,
                    membership_log_index,
                } => self.drop_left_replica(group_id, membership_log_index).await,
                _ => Err(invalid("not a replica request")),
            }
            .map(|_| ());
        }
        match self.ask_node(node, body, NODE_CALL_TIMEOUT).await? {
            ResponseBody::Replica(_) => Ok(()),
            other => Err(unavailable(format!(
                "node {node} answered {} to a replica request",
                other.kind_name()
            ))),
        }
    }

    /// One request from this node to `node` (not forwarded further), within `timeout`.
    pub(crate) async fn ask_node(
        &self,
        node: u64,
        body: RequestBody,
        timeout: Duration,
    ) -> Result<ResponseBody, WireError> {
        self.forwarder
            .forward(
                node,
                &node_principal(self.config.node_id),
                RequestFlags::default(),
                body,
                timeout,
            )
            .await
    }

    /// `CreateReplica` / `DropReplica` from another node.
    pub(crate) async fn replica_request(
        &self,
        body: RequestBody,
        ctx: &RequestContext,
    ) -> Result<ResponseBody, WireError> {
        let Some(peer) = ctx.peer_node else {
            return Err(WireError::new(
                ErrorCode::Forbidden,
                "only cluster nodes (a node certificate) may create or drop replicas",
            ));
        };
        let (group, changed) = match body {
            RequestBody::CreateReplica { group_id } => {
                (group_id, self.add_replica(group_id).await?)
            }
            RequestBody::DropReplica {
                group_id,
                membership_log_index,
            } => {
                if self.group(group_id).is_some_and(|h| h.is_ready_leader()) {
                    return Err(unavailable(format!(
                        "node {} leads group {group_id}; it does not drop its replica on node \
                         {peer}'s word",
                        self.config.node_id
                    )));
                }
                (
                    group_id,
                    self.drop_left_replica(group_id, membership_log_index)
                        .await?,
                )
            }
            _ => return Err(invalid("not a replica request")),
        };
        Ok(ResponseBody::Replica(tenure_proto::client::ReplicaChange {
            group_id: group,
            node_id: self.config.node_id,
            changed,
        }))
    }
}

/// Gives a move's slot back and answers its waiters, also when its task panics or is dropped.
struct MoveGuard {
    shared: Arc<NodeShared>,
    sender: Option<watch::Sender<MoveResult>>,
}

impl MoveGuard {
    fn finish(&mut self, outcome: Result<GroupMembers, WireError>) {
        if let Some(sender) = self.sender.take() {
            sender.send_replace(Some(outcome));
        }
    }
}

impl Drop for MoveGuard {
    fn drop(&mut self) {
        self.finish(Err(unavailable("the move's task ended early")));
        self.shared.moves.inflight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The move itself (see the module docs).
async fn run_move(
    shared: &Arc<NodeShared>,
    handle: &Arc<GroupHandle>,
    from: u64,
    to: u64,
) -> Result<GroupMembers, WireError> {
    let group = handle.group_id();
    let before = handle.members();
    let last_set = last_voter_set(&before);
    let joint = before.voter_sets.len() > 1;
    if !joint && !last_set.contains(&from) && last_set.contains(&to) {
        // Done already (a repeated request): make sure `from` is gone for good.
        finish_removal(shared, handle, from).await;
        return Ok(handle.members());
    }
    if !before.voters.contains(&from) {
        return Err(invalid(format!(
            "node {from} holds no voting replica of group {group} (voters {:?})",
            before.voters
        )));
    }
    if last_set.contains(&to) && !joint {
        return Err(invalid(format!(
            "node {to} already holds a voting replica of group {group} (voters {:?})",
            before.voters
        )));
    }
    let addr = shared
        .node_addresses(to)
        .map(|(addr, _)| addr.to_string())
        .ok_or_else(|| invalid(format!("node {to} is not a member of this cluster")))?;
    shared
        .replica_call(to, RequestBody::CreateReplica { group_id: group })
        .await?;
    let raft = handle.raft();
    let added = tokio::time::timeout(
        CATCH_UP_TIMEOUT,
        raft.add_learner(to, BasicNode::new(addr), true),
    )
    .await;
    let failed = match added {
        Ok(Ok(_)) => None,
        Ok(Err(error)) => Some(raft_error(group, "adding the learner", error)),
        Err(_) => Some(unavailable(format!(
            "group {group}: node {to} did not catch up within {CATCH_UP_TIMEOUT:?}"
        ))),
    };
    if let Some(error) = failed {
        // Take the learner out again (best effort; a new leader may have to), and let its node
        // drop the replica only when the group no longer lists it.
        if error.code != ErrorCode::NotLeader {
            let _ = raft
                .change_membership(ChangeMembers::RemoveNodes([to].into()), false)
                .await;
            let now = handle.members();
            if !now.voters.contains(&to) && !now.learners.contains(&to) {
                let _ = shared
                    .replica_call(
                        to,
                        RequestBody::DropReplica {
                            group_id: group,
                            membership_log_index: now.membership_log_index,
                        },
                    )
                    .await;
            }
        }
        return Err(error);
    }
    // The node table may have changed during the catch-up (minutes): a node that is no longer
    // active (draining, dead, removed) does not become a voter; its learner is taken out again.
    if shared.cluster_view().version > 0 && !shared.hosts_replicas(to) {
        let _ = raft
            .change_membership(ChangeMembers::RemoveNodes([to].into()), false)
            .await;
        return Err(invalid(format!(
            "group {group}: node {to} stopped being active while it caught up; the move is \
             abandoned"
        )));
    }
    // The voters as they are now (the catch-up may have taken minutes).
    let mut voters = last_voter_set(&handle.members());
    voters.remove(&from);
    voters.insert(to);
    raft.change_membership(ChangeMembers::ReplaceAllVoters(voters.clone()), false)
        .await
        .map_err(|error| raft_error(group, "changing the voters", error))?;
    let after = handle.members();
    finish_removal(shared, handle, from).await;
    Ok(after)
}

/// The last (or only) voter set of a membership.
fn last_voter_set(members: &GroupMembers) -> BTreeSet<u64> {
    members
        .voter_sets
        .last()
        .map(|set| set.iter().copied().collect())
        .unwrap_or_default()
}

/// After `from` stopped being a voter: removes it from the group's nodes when it is still there
/// as a learner (a repeated move from a joint configuration leaves it so), then has its node drop
/// the replica: at once when it is this node (after handing leadership to a remaining voter),
/// else in the background, re-checking before each attempt that the group still does not list
/// it.
async fn finish_removal(shared: &Arc<NodeShared>, handle: &Arc<GroupHandle>, from: u64) {
    let group = handle.group_id();
    let raft = handle.raft();
    if handle.members().learners.contains(&from) {
        if let Err(error) = raft
            .change_membership(ChangeMembers::RemoveNodes([from].into()), false)
            .await
        {
            warn!(
                group,
                node = from,
                "removing the old replica's learner: {error}"
            );
            return;
        }
    }
    let members = handle.members();
    if members.voters.contains(&from) || members.learners.contains(&from) {
        return;
    }
    if from == shared.config.node_id {
        if let Some(&next) = members.voters.first() {
            handle.transfer_leadership(next).await;
        }
        let _ = shared.drop_replica(group).await;
        return;
    }
    let shared = shared.clone();
    let handle = handle.clone();
    tokio::spawn(async move {
        for attempt in 1..=DROP_ATTEMPTS {
            let members = handle.members();
            if members.voters.contains(&from) || members.learners.contains(&from) {
                return; // added again meanwhile
            }
            let body = RequestBody::DropReplica {
                group_id: group,
                membership_log_index: members.membership_log_index,
            };
            match shared.replica_call(from, body).await {
                Ok(()) => return,
                Err(error) => warn!(
                    group,
                    node = from,
                    attempt,
                    "telling the node to drop its replica failed: {}",
                    error.message
                ),
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
}

// ----- creating and dropping this node's replicas -----

fn internal(message: impl Into<String>) -> WireError {
    WireError::new(tenure_core::ErrorCode::Internal, message)
}

impl NodeShared {
    fn hosted_set(&self) -> BTreeSet<u32> {
        self.hosted()
            .iter()
            .map(|handle| handle.group_id())
            .collect()
    }

    /// Creates this node's replica of `group` (empty, or reopened from the data a dropped one
    /// left) and records it. `Ok(false)` when it already hosts one.
    pub(crate) async fn add_replica(&self, group: u32) -> Result<bool, WireError> {
        self.check_group_id(group)?;
        if !self.replica_gate.is_open() {
            return Err(WireError::new(
                tenure_core::ErrorCode::Unavailable,
                if self.replica_gate.is_excluded() {
                    "this node was excluded from the cluster (its data directory is not the one \
                     the node table knows for its id): it hosts no replica"
                } else {
                    "this node's data directory is not admitted by the node table yet"
                },
            ));
        }
        let factory = &self.replicas;
        let _serial = factory.serial.lock().await;
        if self.group(group).is_some() {
            return Ok(false);
        }
        let (raft, handle) = factory
            .open(group)
            .await
            .map_err(|e| internal(format!("opening a replica of group {group}: {e}")))?;
        let mut hosted = self.hosted_set();
        hosted.insert(group);
        if let Err(error) = self.record(&hosted).await {
            factory.table.remove(group);
            handle.stop().await;
            drop(raft);
            return Err(error);
        }
        if let Ok(mut groups) = self.groups.write() {
            if let Some(slot) = groups.get_mut(group as usize) {
                *slot = Some(handle);
            }
        }
        ::metrics::counter!(m::REPLICAS_CREATED_TOTAL).increment(1);
        info!(group, "created a replica of the group on this node");
        Ok(true)
    }

    /// Stops this node's replica of `group` and removes it from the record (its data stays).
    /// `Ok(false)` when it hosts none.
    pub(crate) async fn drop_replica(&self, group: u32) -> Result<bool, WireError> {
        let factory = &self.replicas;
        let _serial = factory.serial.lock().await;
        let Some(handle) = self.group(group) else {
            return Ok(false);
        };
        let mut hosted = self.hosted_set();
        hosted.remove(&group);
        self.record(&hosted).await?;
        if let Ok(mut groups) = self.groups.write() {
            if let Some(slot) = groups.get_mut(group as usize) {
                *slot = None;
            }
        }
        factory.table.remove(group);
        handle.stop().await;
        // Its applies have stopped: the group's watch ring goes with it.
        factory.watches().forget(group);
        ::metrics::counter!(m::REPLICAS_DROPPED_TOTAL).increment(1);
        info!(group, "dropped this node's replica of the group");
        Ok(true)
    }

    async fn record(&self, hosted: &BTreeSet<u32>) -> Result<(), WireError> {
        // The replica record opens the gate at the next start: never written for a data
        // directory the node table has not admitted (`crate::replica_gate`).
        if !self.replica_gate.is_open() {
            return Err(WireError::new(
                tenure_core::ErrorCode::Unavailable,
                "this node's data directory is not admitted by the node table: its replicas \
                 are not recorded",
            ));
        }
        let storage = self.replicas.storage.clone();
        let hosted = hosted.clone();
        let result = if storage.is_in_memory() {
            storage.record_replicas(&hosted)
        } else {
            tokio::task::spawn_blocking(move || storage.record_replicas(&hosted))
                .await
                .map_err(|e| internal(format!("recording replicas: {e}")))?
        };
        result.map_err(|error| {
            warn!("recording this node's replicas failed: {error}");
            internal(format!("recording this node's replicas: {error}"))
        })
    }
}

impl NodeShared {
    /// Drops this node's replica of `group` on the word of a membership entry at
    /// `membership_log_index` that no longer lists it, unless this replica's own membership lists
    /// this node at a later index (it was added again since that entry).
    pub(crate) async fn drop_left_replica(
        &self,
        group: u32,
        membership_log_index: u64,
    ) -> Result<bool, WireError> {
        if let Some(handle) = self.group(group) {
            let mine = handle.members();
            let me = self.config.node_id;
            if mine.membership_log_index > membership_log_index
                && (mine.voters.contains(&me) || mine.learners.contains(&me))
            {
                return Err(invalid(format!(
                    "group {group} lists node {me} again at log index {} (after {})",
                    mine.membership_log_index, membership_log_index
                )));
            }
        }
        self.drop_replica(group).await
    }
}

/// Founds this node's fresh groups (its first start only: `fresh` are the groups it is the
/// preferred node of, not initialized here), then records its replicas (`to_record`).
///
/// Runs once the replica gate settled (`crate::replica_gate`; `crate::node` settles it first):
/// a data directory the node table knows under another incarnation (a member that lost its
/// data) is excluded and founds, joins and records nothing. A group is founded only after every other node answered `Status`
/// and none holds an initialized replica of it (a term or a log): on a new cluster nobody does;
/// a node admitted on its first start into a running cluster (one the table never saw report,
/// such as a node that crashed before its first report) finds its groups alive elsewhere and
/// joins them instead. Until every node answered, it asks again every second (bounded per
/// attempt), saying whom it waits for every 30 s; a node removed from the table meanwhile is
/// no longer waited for.
pub(crate) async fn bootstrap(
    shared: Arc<NodeShared>,
    fresh: Vec<FreshGroup>,
    to_record: Option<BTreeSet<u32>>,
) {
    let me = shared.config.node_id;
    if !shared.replica_gate.is_open() {
        // Excluded while the gate settled (`crate::node` runs this only after it settled).
        return;
    }
    let mut existing: BTreeMap<u32, u64> = BTreeMap::new();
    if !fresh.is_empty() {
        let mut answered: BTreeSet<u64> = BTreeSet::new();
        let mut others = shared.other_nodes();
        let started = tokio::time::Instant::now();
        let mut last_said = started;
        while answered.len() < others.len() {
            // A node removed meanwhile (an operator's way out when one never answers, such as a
            // founder excluded for a lost data directory that has exited) is not waited for.
            let members = shared.other_nodes();
            others.retain(|peer| members.contains(peer));
            answered.retain(|peer| others.contains(peer));
            if answered.len() >= others.len() {
                break;
            }
            let waiting: Vec<u64> = others
                .iter()
                .copied()
                .filter(|p| !answered.contains(p))
                .collect();
            for peer in waiting {
                let answer = shared
                    .ask_node(peer, RequestBody::Status, NODE_CALL_TIMEOUT)
                    .await;
                if let Ok(ResponseBody::Status(status)) = answer {
                    answered.insert(peer);
                    for hosted in status.hosted {
                        if hosted.term > 0 || hosted.last_log_index > 0 {
                            existing.entry(hosted.group_id).or_insert(peer);
                        }
                    }
                }
            }
            if answered.len() < others.len() {
                if last_said.elapsed() >= Duration::from_secs(30) {
                    last_said = tokio::time::Instant::now();
                    let waiting: Vec<u64> = others
                        .iter()
                        .copied()
                        .filter(|p| !answered.contains(p))
                        .collect();
                    warn!(
                        node = me,
                        ?waiting,
                        "not founding this node's fresh groups until every node answers"
                    );
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
    for (raft, members, group) in fresh {
        if let Some(peer) = existing.get(&group) {
            info!(
                group,
                node = peer,
                "the group exists already (an initialized replica on node {peer}): joining it, \
                 not founding it"
            );
            continue;
        }
        match raft.initialize(members).await {
            Ok(()) => info!(group, "bootstrapped a fresh group"),
            Err(error) => warn!(group, "bootstrapping the group failed: {error}"),
        }
    }
    if let Some(hosted) = to_record {
        if let Err(error) = shared.record(&hosted).await {
            warn!(
                node = me,
                "recording this node's replicas failed (the next start records them): {}",
                error.message
            );
        }
    }
}
