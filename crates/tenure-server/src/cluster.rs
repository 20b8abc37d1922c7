//! The cluster's node table on this node: the view it follows, what follows the view (transport
//! peers, forwarding targets, certificate revocation, which connections are nodes), and the
//! node-table requests.
//!
//! The table lives in the metadata group's (group 0's) replicated state
//! (`tenure_core::ClusterMeta`). A node hosting a replica of group 0 reads it from its replica; the
//! others ask a node for it (`ClusterNodes`) every second (`background::cluster_sync`). Views only
//! move forward (a higher `version` replaces a lower one). Changes go to group 0's leader:
//! operators' `AddNode`, `SetState` (drain) and `Remove` through `ClusterChange` (forwarded there
//! when asked); a node's own `NodeUp` straight from the node, over its node certificate; the
//! controller's `SetState { Dead }` and leader preferences locally on the leader.
//!
//! Before the table was recorded (version 0: a new cluster's first seconds, or an existing
//! cluster's first start with this build, until its group 0 leader records the configured peers)
//! the configured `peers` are the members.
//!
//! Must not depend on: the request path's routing of lease operations, the background loops (they
//! build on this).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tenure_core::{
    ClusterChange, ClusterMeta, ClusterOp, Command, CommandResult, ErrorCode, METADATA_GROUP,
    NodeState,
};
use tenure_proto::client::{RequestBody, ResponseBody, WireError};
use tracing::{info, warn};

use crate::membership::node_principal;
use crate::request::RequestContext;
use crate::shared::NodeShared;

/// The transport's say on peer certificates: a removed node, or a revoked certificate, is
/// refused on both sides of a peer connection. Holds the node weakly (the node holds the
/// transport, which holds this).
pub(crate) struct NodeTableAdmission {
    shared: std::sync::Weak<NodeShared>,
}

impl NodeTableAdmission {
    pub(crate) fn new(shared: &Arc<NodeShared>) -> Self {
        NodeTableAdmission {
            shared: Arc::downgrade(shared),
        }
    }
}

impl tenure_transport::PeerAdmission for NodeTableAdmission {
    fn admit(&self, node_id: u64, cert_sha256: &[u8; 32]) -> Result<(), String> {
        let Some(shared) = self.shared.upgrade() else {
            return Ok(());
        };
        let view = shared.cluster_view();
        if let Some(owner) = view.revoked.get(cert_sha256) {
            return Err(format!(
                "this certificate was revoked (node {owner} was removed from the cluster)"
            ));
        }
        match view.node(node_id) {
            Some(record) if record.state == NodeState::Removed => {
                Err(format!("node {node_id} was removed from the cluster"))
            }
            None if view.version > 0 => Err(format!(
                "node {node_id} is not in the cluster's node table (announce it with \
                 `tenurectl node add` first)"
            )),
            _ => Ok(()),
        }
    }
}

/// How long one node-table call to another node may take.
const CLUSTER_CALL_TIMEOUT: Duration = Duration::from_secs(3);
/// `NOT_LEADER` hints a node-table call follows at most.
const LEADER_HOPS_MAX: usize = 3;

fn unavailable(message: impl Into<String>) -> WireError {
    WireError::new(ErrorCode::Unavailable, message)
}

/// A version-0 `ClusterNodes` answer from `(node, incarnation, addr, http_addr)` pins: each a
/// `Joining` record with its incarnation.
pub(crate) fn pins_as_table(
    pins: impl IntoIterator<Item = (u64, u64, String, String)>,
) -> ClusterMeta {
    let nodes = pins
        .into_iter()
        .map(|(node_id, incarnation, addr, http_addr)| {
            let record = tenure_core::NodeRecord {
                node_id,
                addr,
                http_addr,
                state: NodeState::Joining,
                cert_sha256: None,
                incarnation,
                changed_at_ms: 0,
            };
            (node_id, record)
        })
        .collect();
    ClusterMeta {
        version: 0,
        nodes,
        ..ClusterMeta::default()
    }
}

impl NodeShared {
    /// The newer of this node's view and its metadata replica's applied table (which a
    /// restarted node has from its first moment, before its view follows): what `ClusterNodes`
    /// answers, so that a node asking whether any node table exists is not told "none" by a
    /// node that just restarted (`crate::replica_gate`).
    ///
    /// While no table exists (version 0) the answer lists, instead of a table, this node's
    /// founder pins (`crate::founders`) and this node itself with its incarnation, each as a
    /// `Joining` record: what a founding node pins before its replicas open, and what tells a
    /// founder that lost its data that it was pinned with another directory.
    pub(crate) fn newest_cluster_meta(&self) -> ClusterMeta {
        let view = self.cluster_view();
        let newest = match self.group(METADATA_GROUP.0) {
            Some(handle) => {
                let applied = handle.cluster_meta();
                if applied.version > view.version {
                    applied
                } else {
                    view.as_ref().clone()
                }
            }
            None => view.as_ref().clone(),
        };
        if newest.version > 0 {
            return newest;
        }
        self.founder_pins_answer()
    }

    /// The version-0 `ClusterNodes` answer (see [`NodeShared::newest_cluster_meta`]).
    fn founder_pins_answer(&self) -> ClusterMeta {
        let mut pins = self.founder_pins();
        pins.entry(self.config.node_id).or_insert(self.incarnation);
        pins_as_table(pins.into_iter().map(|(node_id, incarnation)| {
            let (addr, http_addr) = self
                .config
                .peers
                .get(&node_id)
                .map(|peer| (peer.addr.to_string(), peer.http_addr.to_string()))
                .unwrap_or_default();
            (node_id, incarnation, addr, http_addr)
        }))
    }

    /// The founders' incarnations this node pinned (`crate::founders`).
    pub(crate) fn founder_pins(&self) -> crate::founders::FounderPins {
        match self.founder_pins.lock() {
            Ok(pins) => pins.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Pins `pins` durably (`crate::founders`), then keeps them for the answers above.
    pub(crate) fn set_founder_pins(
        &self,
        pins: crate::founders::FounderPins,
    ) -> Result<(), crate::ServerError> {
        crate::founders::write_founder_pins(&self.config.data_dir, &pins)?;
        match self.founder_pins.lock() {
            Ok(mut held) => *held = pins,
            Err(poisoned) => *poisoned.into_inner() = pins,
        }
        Ok(())
    }

    /// The node table as this node knows it.
    pub(crate) fn cluster_view(&self) -> Arc<ClusterMeta> {
        match self.cluster.read() {
            Ok(view) => view.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Takes `meta` when it is newer than the view, and makes the transport, the forwarder and
    /// the certificate checks follow it. Returns whether it was taken.
    pub(crate) fn adopt_cluster_view(&self, meta: ClusterMeta) -> bool {
        {
            let mut view = match self.cluster.write() {
                Ok(view) => view,
                Err(poisoned) => poisoned.into_inner(),
            };
            if meta.version <= view.version {
                return false;
            }
            info!(
                node = self.config.node_id,
                version = meta.version,
                nodes = ?meta.nodes.values().map(|n| (n.node_id, n.state.as_str())).collect::<Vec<_>>(),
                "cluster node table"
            );
            *view = Arc::new(meta);
        }
        self.follow_cluster_view();
        true
    }

    /// Makes peers, forwarding targets and live connections match the view. Serialized, and
    /// always from the newest view (two adoptions racing must not let an older view re-add a
    /// node a newer one removed).
    fn follow_cluster_view(&self) {
        let _following = match self.cluster_follow.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        let view = self.cluster_view();
        let me = self.config.node_id;
        // Peers the table does not know (a configured peer never recorded) are not members.
        for (peer, _) in self.transport.peers() {
            if view.node(peer).is_none() {
                self.transport.remove_peer(peer);
                self.forwarder.remove_node(peer);
            }
        }
        for record in view.nodes.values() {
            if record.node_id == me {
                continue;
            }
            if record.state == NodeState::Removed {
                self.transport.remove_peer(record.node_id);
                self.forwarder.remove_node(record.node_id);
                continue;
            }
            match record.addr.parse::<SocketAddr>() {
                Ok(addr) => {
                    self.transport.add_peer(record.node_id, addr);
                    self.forwarder.set_node(record.node_id, addr);
                }
                Err(error) => warn!(
                    node = record.node_id,
                    addr = record.addr,
                    "node table address does not parse: {error}"
                ),
            }
        }
    }

    /// The nodes that are members now (every node in the table but removed ones; before the
    /// table was recorded, the configured peers), ascending.
    pub(crate) fn member_nodes(&self) -> Vec<u64> {
        let view = self.cluster_view();
        if view.version == 0 {
            return self.node_ids.clone();
        }
        view.nodes
            .values()
            .filter(|node| node.state.is_member())
            .map(|node| node.node_id)
            .collect()
    }

    /// Whether `node` may receive replicas: active in the table (any configured peer before
    /// the table was recorded).
    pub(crate) fn hosts_replicas(&self, node: u64) -> bool {
        let view = self.cluster_view();
        if view.version == 0 {
            return self.node_ids.contains(&node);
        }
        view.node(node)
            .is_some_and(|record| record.state == NodeState::Active)
    }

    /// `node`'s QUIC and HTTP addresses (the table's, else the configuration's).
    pub(crate) fn node_addresses(&self, node: u64) -> Option<(SocketAddr, SocketAddr)> {
        let view = self.cluster_view();
        if let Some(record) = view.node(node).filter(|r| r.state.is_member()) {
            if let (Ok(addr), Ok(http)) = (record.addr.parse(), record.http_addr.parse()) {
                return Some((addr, http));
            }
        }
        if view.node(node).is_some() {
            return None;
        }
        self.config
            .peers
            .get(&node)
            .map(|peer| (peer.addr, peer.http_addr))
    }

    /// Whether a certificate (by SHA-256) was revoked.
    pub(crate) fn is_revoked(&self, cert_sha256: &[u8; 32]) -> bool {
        self.cluster_view().is_revoked(cert_sha256)
    }

    /// Operators, and cluster nodes acting for themselves (the placement controller).
    pub(crate) fn check_operator_or_node(&self, ctx: &RequestContext) -> Result<(), WireError> {
        if let Some(peer) = ctx.peer_node {
            if ctx.principal == node_principal(peer) {
                return Ok(());
            }
        }
        self.auth
            .check_operator(&ctx.principal, ctx.flags.principal_claimed)
    }

    /// Applies `op` through this node's replica of the metadata group, which must be its ready
    /// leader (`NOT_LEADER` otherwise).
    pub(crate) async fn propose_cluster_change(
        &self,
        op: ClusterOp,
    ) -> Result<ClusterChange, WireError> {
        let Some(handle) = self
            .group(METADATA_GROUP.0)
            .filter(|handle| handle.is_ready_leader())
        else {
            return Err(self.not_leader(METADATA_GROUP.0));
        };
        // A change the applied table refuses, or finds already made, is answered without a log
        // entry (a node retrying a refused report must not grow the log). Apply decides again.
        let mut trial = handle.cluster_meta();
        let trial_time_ms = handle.applied_log_time_ms();
        let tried = trial
            .apply(&op, trial_time_ms)
            .map_err(WireError::from_cluster_error)?;
        if !tried.changed {
            return Ok(tried);
        }
        let output = handle.propose_command(Command::Cluster(op)).await?;
        let change = match output.result {
            CommandResult::Cluster(result) => result.map_err(WireError::from_cluster_error)?,
            other => {
                return Err(WireError::new(
                    ErrorCode::Internal,
                    format!("a cluster change applied as {other:?}"),
                ));
            }
        };
        // The leader's own view follows at once (the sync task would within a second).
        self.adopt_cluster_view(handle.cluster_meta());
        Ok(change)
    }

    /// Applies `op` at the metadata group's leader, from this node: locally when it leads,
    /// else straight to the leader (following its `NOT_LEADER` hints), as this node.
    pub(crate) async fn cluster_change_from_here(
        &self,
        op: ClusterOp,
    ) -> Result<ClusterChange, WireError> {
        self.cluster_change_starting_at(op, self.leader_of(METADATA_GROUP.0).leader)
            .await
    }

    /// Like [`NodeShared::cluster_change_from_here`], for a node whose own view of the metadata
    /// group's leader may be empty (a first start, whose replicas peers cannot reach yet):
    /// starts at the leader it knows, then at every other member in turn, following each
    /// one's `NOT_LEADER` hints. Returns the first success or refusal (`FORBIDDEN`); else the
    /// last error.
    pub(crate) async fn cluster_change_anywhere(
        &self,
        op: ClusterOp,
    ) -> Result<ClusterChange, WireError> {
        let mut starts: Vec<u64> = self
            .leader_of(METADATA_GROUP.0)
            .leader
            .into_iter()
            .collect();
        starts.extend(self.other_nodes());
        let mut tried = BTreeSet::new();
        let mut last_error = unavailable("no other node is known");
        for start in starts {
            if !tried.insert(start) {
                continue;
            }
            match self
                .cluster_change_starting_at(op.clone(), Some(start))
                .await
            {
                Ok(change) => return Ok(change),
                // A refusal is the caller's to judge; anything else may go better elsewhere.
                Err(error) if error.code == ErrorCode::Forbidden => return Err(error),
                Err(error) => last_error = error,
            }
        }
        Err(last_error)
    }

    async fn cluster_change_starting_at(
        &self,
        op: ClusterOp,
        first: Option<u64>,
    ) -> Result<ClusterChange, WireError> {
        let mut target = first;
        let mut last_error = unavailable("the metadata group's leader is not known");
        for _ in 0..LEADER_HOPS_MAX {
            let Some(leader) = target else {
                break;
            };
            let answer = if leader == self.config.node_id {
                self.propose_cluster_change(op.clone()).await
            } else {
                match self
                    .ask_node(
                        leader,
                        RequestBody::ClusterChange(op.clone()),
                        CLUSTER_CALL_TIMEOUT,
                    )
                    .await
                {
                    Ok(ResponseBody::ClusterChanged(change)) => Ok(change),
                    Ok(other) => Err(unavailable(format!(
                        "node {leader} answered {} to a cluster change",
                        other.kind_name()
                    ))),
                    Err(error) => Err(error),
                }
            };
            match answer {
                Ok(change) => return Ok(change),
                Err(error) if error.code == ErrorCode::NotLeader => {
                    target = error
                        .leader_hint
                        .as_ref()
                        .map(|hint| hint.node_id)
                        .filter(|&next| Some(next) != target);
                    last_error = error;
                }
                Err(error) => return Err(error),
            }
        }
        Err(last_error)
    }

    /// `ClusterChange` from a client or a node.
    pub(crate) async fn cluster_change_request(
        &self,
        op: ClusterOp,
        ctx: &RequestContext,
    ) -> Result<ResponseBody, WireError> {
        match &op {
            ClusterOp::AddNode(_) | ClusterOp::SetState { .. } | ClusterOp::Remove { .. } => {
                self.auth
                    .check_operator(&ctx.principal, ctx.flags.principal_claimed)?;
                if let ClusterOp::SetState { state, .. } = &op {
                    if !matches!(state, NodeState::Draining | NodeState::Active) {
                        return Err(WireError::new(
                            ErrorCode::InvalidArgument,
                            "operators drain a node or take a drain back; `Dead` is the \
                             placement controller's conclusion",
                        ));
                    }
                }
            }
            ClusterOp::NodeUp {
                node, cert_sha256, ..
            } => {
                // Only the node itself, with the certificate it reports.
                if ctx.peer_node != Some(node.node_id)
                    || ctx.peer_cert_sha256.as_ref() != Some(cert_sha256)
                {
                    return Err(WireError::new(
                        ErrorCode::Forbidden,
                        format!(
                            "only node {} itself reports itself, over the certificate it names",
                            node.node_id
                        ),
                    ));
                }
                return self
                    .propose_cluster_change(op)
                    .await
                    .map(ResponseBody::ClusterChanged);
            }
            ClusterOp::Record { .. }
            | ClusterOp::RecordFounders { .. }
            | ClusterOp::SetLeaderPreferences { .. } => {
                return Err(WireError::new(
                    ErrorCode::Forbidden,
                    "the node table is recorded and leader preferences are set by the \
                     metadata group's leader itself",
                ));
            }
        }
        let local = self
            .group(METADATA_GROUP.0)
            .is_some_and(|handle| handle.is_ready_leader());
        if local {
            return self
                .propose_cluster_change(op)
                .await
                .map(ResponseBody::ClusterChanged);
        }
        self.forward_to_leader(METADATA_GROUP.0, RequestBody::ClusterChange(op), ctx)
            .await
    }

    /// Sends `body` on to `group`'s leader when the request asks for forwarding and the leader
    /// is another known node; `NOT_LEADER` otherwise.
    pub(crate) async fn forward_to_leader(
        &self,
        group: u32,
        body: RequestBody,
        ctx: &RequestContext,
    ) -> Result<ResponseBody, WireError> {
        match self.leader_of(group).leader {
            Some(leader) if ctx.flags.forward && leader != self.config.node_id => {
                self.forwarder
                    .forward(leader, &ctx.principal, ctx.flags, body, ctx.timeout)
                    .await
            }
            _ => Err(self.not_leader(group)),
        }
    }

    /// Asks the other nodes, the metadata group's leader first, for their node table, until one
    /// answers; takes it when newer.
    pub(crate) async fn fetch_cluster_view(&self) {
        let me = self.config.node_id;
        let mut order: Vec<u64> = Vec::new();
        if let Some(leader) = self.leader_of(METADATA_GROUP.0).leader {
            order.push(leader);
        }
        let known: BTreeSet<u64> = self
            .member_nodes()
            .into_iter()
            .chain(self.config.peers.keys().copied())
            .collect();
        order.extend(known);
        let mut asked = BTreeSet::new();
        for node in order {
            if node == me || !asked.insert(node) {
                continue;
            }
            let answer = self
                .ask_node(node, RequestBody::ClusterNodes, CLUSTER_CALL_TIMEOUT)
                .await;
            if let Ok(ResponseBody::Cluster(meta)) = answer {
                // Done once an answer is as new as this node's view (taken when newer).
                let known = self.cluster_view().version;
                if meta.version > 0 && meta.version >= known {
                    self.adopt_cluster_view(meta);
                    return;
                }
            }
        }
    }
}
