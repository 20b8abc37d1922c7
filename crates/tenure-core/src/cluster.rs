//! Cluster metadata: the node table, the revoked node certificates and the leader preferences,
//! kept in the replicated state of the metadata group (group 0).
//!
//! Every node follows this table (its peers, their addresses, which nodes may connect at all);
//! the placement controller on the metadata group's leader decides from it where replicas go.
//! A group's replica set itself stays in that group's own Raft membership (the only place a
//! membership change can be made safely); the table says which nodes exist and what they are
//! for, the controller reconciles the two.
//!
//! Pure like the rest of the crate: no clock (changes are stamped with the entry's log time), no
//! I/O, only ordered maps (the snapshot encodes them in order).
//!
//! Must not depend on: the server, the transport, or any notion of reachability (the controller
//! observes that and writes its conclusion, `Dead`, through the log).

use std::collections::BTreeMap;
// Address parsing only (`core::net`: no sockets, no I/O).
use core::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::ids::GroupId;

/// The group whose state holds the cluster metadata.
pub const METADATA_GROUP: GroupId = GroupId(0);
/// Most node records the table keeps (removed ones included: a removed id is never reused).
pub const CLUSTER_NODES_MAX: usize = 1024;
/// Most leader preferences (one per group).
pub const LEADER_PREFERENCES_MAX: usize = 65_536;
/// Longest address string accepted in a node record.
pub const NODE_ADDRESS_BYTES_MAX: usize = 128;

/// Where a node is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum NodeState {
    /// Announced by an operator; has not reported itself yet. Hosts nothing.
    Joining,
    /// Serving; the controller places replicas and leaders on it.
    Active,
    /// Being emptied: the controller moves its replicas away; it keeps serving until then.
    Draining,
    /// Unreachable longer than `node_dead_after` (the controller's conclusion): its replicas are
    /// re-created elsewhere. It becomes `Active` again when it reports itself.
    Dead,
    /// Gone for good: never a member again, its certificate refused by every node.
    Removed,
}

impl NodeState {
    /// The lower-case name used in output and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Joining => "joining",
            NodeState::Active => "active",
            NodeState::Draining => "draining",
            NodeState::Dead => "dead",
            NodeState::Removed => "removed",
        }
    }

    /// Whether the node may take part in the cluster's traffic (connect, host replicas).
    pub fn is_member(self) -> bool {
        !matches!(self, NodeState::Removed)
    }
}

/// One node of the table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    /// The node's id (>= 1, never reused).
    pub node_id: u64,
    /// Its QUIC endpoint (peers and clients), `ip:port`.
    pub addr: String,
    /// Its HTTP gateway, `ip:port`.
    pub http_addr: String,
    /// Where it is in its life.
    pub state: NodeState,
    /// SHA-256 of the certificate it last reported itself with (`None` until it did).
    pub cert_sha256: Option<[u8; 32]>,
    /// The incarnation of its data directory (0 until it reported itself, or for a founder
    /// until then unless `RecordFounders` pinned it): a node that comes back with another data
    /// directory under the same id is refused.
    pub incarnation: u64,
    /// The log time of its last state change.
    pub changed_at_ms: u64,
}

/// A change to the cluster metadata ([`crate::Command::Cluster`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClusterOp {
    /// Records the configured members as `Active` when the table is empty (a cluster's first
    /// start, or an existing cluster's first start with a build that keeps the table); a no-op
    /// otherwise. Builds since value format 3 propose [`ClusterOp::RecordFounders`] instead;
    /// this variant stays so that older logs still apply.
    Record {
        /// The configured members.
        nodes: Vec<NodeAddresses>,
    },
    /// An operator announces a new node (`Joining`).
    AddNode(NodeAddresses),
    /// A node reports itself at start: its addresses, certificate and data directory
    /// incarnation. `Joining` and `Dead` become `Active`.
    NodeUp {
        /// Its addresses.
        node: NodeAddresses,
        /// SHA-256 of its certificate.
        cert_sha256: [u8; 32],
        /// Its data directory's incarnation (nonzero).
        incarnation: u64,
    },
    /// An operator drains a node (`Active` -> `Draining`) or takes a drain back (-> `Active`);
    /// the controller declares a node `Dead`.
    SetState {
        /// The node.
        node_id: u64,
        /// Its new state (not `Removed` or `Joining`).
        state: NodeState,
    },
    /// An operator removes a node for good; its certificate is revoked.
    Remove {
        /// The node.
        node_id: u64,
    },
    /// The controller replaces the preferred leader of every group it lists (node 0 clears).
    SetLeaderPreferences {
        /// `(group, node)` pairs.
        preferences: Vec<(u32, u64)>,
    },
    /// Like [`ClusterOp::Record`], with the data directory incarnation each founding node had
    /// when the recording node's replicas opened (its pinned founders, `FOUNDERS` in its data
    /// directory): from this entry on, a founder that lost its data is refused by the table at
    /// once, not only after its first `NodeUp`. Incarnation 0 means not pinned (a cluster
    /// recorded by a node that never founded it). Appended after the other variants (postcard
    /// encodes variants by position): log value format 3, peer protocol 4.
    RecordFounders {
        /// The configured members and their pinned incarnations.
        nodes: Vec<FounderNode>,
    },
}

/// A founding node as [`ClusterOp::RecordFounders`] records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FounderNode {
    /// Its id and addresses.
    pub node: NodeAddresses,
    /// Its data directory's incarnation when the cluster was founded (0: not known).
    pub incarnation: u64,
}

/// A node's id and addresses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeAddresses {
    /// The node.
    pub node_id: u64,
    /// QUIC endpoint, `ip:port`.
    pub addr: String,
    /// HTTP gateway, `ip:port`.
    pub http_addr: String,
}

/// What applying a [`ClusterOp`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterChange {
    /// The table's version after the entry.
    pub version: u64,
    /// Whether the entry changed anything (a repeated change is a no-op, not an error).
    pub changed: bool,
}

/// The cluster metadata.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterMeta {
    /// Raised by every change; 0 while the table was never recorded.
    pub version: u64,
    /// Every node ever known, by id.
    pub nodes: BTreeMap<u64, NodeRecord>,
    /// Revoked certificates (SHA-256) and the node each belonged to.
    pub revoked: BTreeMap<[u8; 32], u64>,
    /// Preferred leader node per group (the controller's choice).
    pub leader_preferences: BTreeMap<u32, u64>,
}

/// Why a [`ClusterOp`] was refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum ClusterError {
    /// A field is malformed or the change is not allowed from the node's state.
    #[error("invalid {field}: {reason}")]
    Invalid {
        /// The field.
        field: String,
        /// Why.
        reason: String,
    },
    /// The node is not in the table.
    #[error("node {node_id} is not in the cluster's node table")]
    UnknownNode {
        /// The node.
        node_id: u64,
    },
    /// The node may not (any longer) be a member: removed, revoked, or another incarnation.
    #[error("refused: {reason}")]
    Refused {
        /// Why.
        reason: String,
    },
}

fn failed(field: &str, reason: impl Into<String>) -> ClusterError {
    ClusterError::Invalid {
        field: field.to_string(),
        reason: reason.into(),
    }
}

fn not_found(node_id: u64) -> ClusterError {
    ClusterError::UnknownNode { node_id }
}

fn check_addresses(node: &NodeAddresses) -> Result<(), ClusterError> {
    if node.node_id == 0 {
        return Err(failed("node_id", "must be >= 1"));
    }
    for (field, value) in [("addr", &node.addr), ("http_addr", &node.http_addr)] {
        if value.len() > NODE_ADDRESS_BYTES_MAX {
            return Err(failed(
                field,
                format!("longer than {NODE_ADDRESS_BYTES_MAX} bytes"),
            ));
        }
        if value.parse::<SocketAddr>().is_err() {
            return Err(failed(
                field,
                format!("{value:?} is not an ip:port address"),
            ));
        }
    }
    Ok(())
}

impl ClusterMeta {
    /// The node's record.
    pub fn node(&self, node_id: u64) -> Option<&NodeRecord> {
        self.nodes.get(&node_id)
    }

    /// Whether a certificate (by SHA-256) was revoked.
    pub fn is_revoked(&self, cert_sha256: &[u8; 32]) -> bool {
        self.revoked.contains_key(cert_sha256)
    }

    /// The nodes in `state`, in id order.
    pub fn nodes_in(&self, state: NodeState) -> Vec<u64> {
        self.nodes
            .values()
            .filter(|node| node.state == state)
            .map(|node| node.node_id)
            .collect()
    }

    /// Applies one change at log time `now_ms`. Deterministic; never panics.
    pub fn apply(&mut self, op: &ClusterOp, now_ms: u64) -> Result<ClusterChange, ClusterError> {
        let changed = self.apply_inner(op, now_ms)?;
        if changed {
            self.version += 1;
        }
        Ok(ClusterChange {
            version: self.version,
            changed,
        })
    }

    /// `Record` and `RecordFounders`: the founding members, `Active`, with their incarnations
    /// (0: not known). A no-op once the table exists.
    fn record_founders<'a>(
        &mut self,
        nodes: impl Iterator<Item = (&'a NodeAddresses, u64)>,
        count: usize,
        now_ms: u64,
    ) -> Result<bool, ClusterError> {
        if !self.nodes.is_empty() {
            return Ok(false);
        }
        if count == 0 || count > CLUSTER_NODES_MAX {
            return Err(failed(
                "nodes",
                format!("must list 1 to {CLUSTER_NODES_MAX} nodes"),
            ));
        }
        let mut table = BTreeMap::new();
        for (node, incarnation) in nodes {
            check_addresses(node)?;
            let record = NodeRecord {
                node_id: node.node_id,
                addr: node.addr.clone(),
                http_addr: node.http_addr.clone(),
                state: NodeState::Active,
                cert_sha256: None,
                incarnation,
                changed_at_ms: now_ms,
            };
            if table.insert(node.node_id, record).is_some() {
                return Err(failed(
                    "nodes",
                    format!("node {} appears twice", node.node_id),
                ));
            }
        }
        self.nodes = table;
        Ok(true)
    }

    fn apply_inner(&mut self, op: &ClusterOp, now_ms: u64) -> Result<bool, ClusterError> {
        match op {
            ClusterOp::Record { nodes } => {
                self.record_founders(nodes.iter().map(|node| (node, 0)), nodes.len(), now_ms)
            }
            ClusterOp::RecordFounders { nodes } => self.record_founders(
                nodes
                    .iter()
                    .map(|founder| (&founder.node, founder.incarnation)),
                nodes.len(),
                now_ms,
            ),
            ClusterOp::AddNode(node) => {
                check_addresses(node)?;
                if let Some(existing) = self.nodes.get(&node.node_id) {
                    // A repeated announcement (a retry after a lost answer) is a no-op, also
                    // once the node reported itself.
                    if existing.state != NodeState::Removed
                        && existing.addr == node.addr
                        && existing.http_addr == node.http_addr
                    {
                        return Ok(false);
                    }
                    return Err(failed(
                        "node_id",
                        format!(
                            "node {} already exists ({}); node ids are never reused",
                            node.node_id,
                            existing.state.as_str()
                        ),
                    ));
                }
                if self.nodes.len() >= CLUSTER_NODES_MAX {
                    return Err(failed(
                        "node_id",
                        format!("the table already has {CLUSTER_NODES_MAX} nodes"),
                    ));
                }
                if let Some(other) = self
                    .nodes
                    .values()
                    .find(|other| other.state.is_member() && other.addr == node.addr)
                {
                    return Err(failed(
                        "addr",
                        format!("{} is node {}'s address", node.addr, other.node_id),
                    ));
                }
                self.nodes.insert(
                    node.node_id,
                    NodeRecord {
                        node_id: node.node_id,
                        addr: node.addr.clone(),
                        http_addr: node.http_addr.clone(),
                        state: NodeState::Joining,
                        cert_sha256: None,
                        incarnation: 0,
                        changed_at_ms: now_ms,
                    },
                );
                Ok(true)
            }
            ClusterOp::NodeUp {
                node,
                cert_sha256,
                incarnation,
            } => {
                check_addresses(node)?;
                if *incarnation == 0 {
                    return Err(failed("incarnation", "must be nonzero"));
                }
                if let Some(owner) = self.revoked.get(cert_sha256) {
                    return Err(ClusterError::Refused {
                        reason: format!("this certificate was revoked (node {owner} was removed)"),
                    });
                }
                let record = self
                    .nodes
                    .get_mut(&node.node_id)
                    .ok_or_else(|| not_found(node.node_id))?;
                if record.state == NodeState::Removed {
                    return Err(ClusterError::Refused {
                        reason: format!(
                            "node {} was removed from the cluster; a replacement joins under a \
                             new id",
                            node.node_id
                        ),
                    });
                }
                if record.incarnation != 0 && record.incarnation != *incarnation {
                    return Err(ClusterError::Refused {
                        reason: format!(
                            "node {} is known with another data directory (incarnation {}, \
                             this one {incarnation}); a node whose data was lost must be \
                             removed and replaced under a new id",
                            node.node_id, record.incarnation
                        ),
                    });
                }
                let before = record.clone();
                record.addr = node.addr.clone();
                record.http_addr = node.http_addr.clone();
                record.cert_sha256 = Some(*cert_sha256);
                record.incarnation = *incarnation;
                if matches!(record.state, NodeState::Joining | NodeState::Dead) {
                    record.state = NodeState::Active;
                    record.changed_at_ms = now_ms;
                }
                Ok(*record != before)
            }
            ClusterOp::SetState { node_id, state } => {
                let record = self
                    .nodes
                    .get_mut(node_id)
                    .ok_or_else(|| not_found(*node_id))?;
                if record.state == *state {
                    return Ok(false);
                }
                // Only an active node is declared dead: a draining one is emptied anyway, and
                // keeping it `Draining` keeps the operator's intent when it comes back.
                let allowed = matches!(
                    (record.state, *state),
                    (NodeState::Active, NodeState::Draining)
                        | (NodeState::Draining, NodeState::Active)
                        | (NodeState::Active, NodeState::Dead)
                        | (NodeState::Dead, NodeState::Draining)
                );
                if !allowed {
                    return Err(failed(
                        "state",
                        format!(
                            "node {node_id} cannot go from {} to {}",
                            record.state.as_str(),
                            state.as_str()
                        ),
                    ));
                }
                record.state = *state;
                record.changed_at_ms = now_ms;
                Ok(true)
            }
            ClusterOp::Remove { node_id } => {
                let record = self
                    .nodes
                    .get_mut(node_id)
                    .ok_or_else(|| not_found(*node_id))?;
                match record.state {
                    NodeState::Removed => return Ok(false),
                    NodeState::Active => {
                        return Err(failed(
                            "state",
                            format!(
                                "node {node_id} is active: drain it first (it may hold \
                                 replicas); a node that is gone for good is removed once it \
                                 is dead"
                            ),
                        ));
                    }
                    NodeState::Joining | NodeState::Draining | NodeState::Dead => {}
                }
                record.state = NodeState::Removed;
                record.changed_at_ms = now_ms;
                if let Some(cert) = record.cert_sha256 {
                    self.revoked.insert(cert, *node_id);
                }
                self.leader_preferences.retain(|_, node| node != node_id);
                Ok(true)
            }
            ClusterOp::SetLeaderPreferences { preferences } => {
                if preferences.len() > LEADER_PREFERENCES_MAX {
                    return Err(failed(
                        "preferences",
                        format!("at most {LEADER_PREFERENCES_MAX}"),
                    ));
                }
                let mut changed = false;
                for &(group, node_id) in preferences {
                    if node_id == 0 {
                        changed |= self.leader_preferences.remove(&group).is_some();
                        continue;
                    }
                    match self.nodes.get(&node_id) {
                        Some(record) if record.state.is_member() => {}
                        _ => return Err(not_found(node_id)),
                    }
                    changed |= self.leader_preferences.insert(group, node_id) != Some(node_id);
                }
                Ok(changed)
            }
        }
    }

    /// Checks what the snapshot reader and the invariant check rely on.
    pub fn check(&self) -> Result<(), String> {
        if self.nodes.len() > CLUSTER_NODES_MAX {
            return Err(format!("{} node records", self.nodes.len()));
        }
        if self.leader_preferences.len() > LEADER_PREFERENCES_MAX {
            return Err(format!(
                "{} leader preferences",
                self.leader_preferences.len()
            ));
        }
        // (A `ClusterNodes` answer at version 0 lists founder pins: not a table, never checked.)
        if self.version == 0 && !self.nodes.is_empty() {
            return Err("node records at version 0".into());
        }
        for (id, record) in &self.nodes {
            if *id != record.node_id || *id == 0 {
                return Err(format!("node record {id} names node {}", record.node_id));
            }
        }
        for (cert, node_id) in &self.revoked {
            let removed = self.nodes.get(node_id).is_some_and(|node| {
                node.state == NodeState::Removed && node.cert_sha256 == Some(*cert)
            });
            if !removed {
                return Err(format!(
                    "a revoked certificate names node {node_id}, which is not removed with it"
                ));
            }
        }
        for (group, node_id) in &self.leader_preferences {
            if !self
                .nodes
                .get(node_id)
                .is_some_and(|node| node.state.is_member())
            {
                return Err(format!(
                    "group {group} prefers node {node_id}, not a member"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: u64) -> NodeAddresses {
        NodeAddresses {
            node_id: id,
            addr: format!("127.0.0.1:{}", 7000 + id),
            http_addr: format!("127.0.0.1:{}", 8000 + id),
        }
    }

    fn recorded() -> ClusterMeta {
        let mut meta = ClusterMeta::default();
        let change = meta
            .apply(
                &ClusterOp::Record {
                    nodes: vec![node(1), node(2), node(3)],
                },
                10,
            )
            .unwrap();
        assert!(change.changed);
        meta
    }

    #[test]
    fn record_happens_once() {
        let mut meta = recorded();
        assert_eq!(meta.nodes_in(NodeState::Active), vec![1, 2, 3]);
        let again = meta
            .apply(
                &ClusterOp::Record {
                    nodes: vec![node(9)],
                },
                20,
            )
            .unwrap();
        assert!(!again.changed);
        assert_eq!(meta.version, 1);
        meta.check().unwrap();
    }

    #[test]
    fn founders_recorded_with_their_incarnations_refuse_a_wiped_founder_at_once() {
        let mut meta = ClusterMeta::default();
        let founders = ClusterOp::RecordFounders {
            nodes: vec![
                FounderNode {
                    node: node(1),
                    incarnation: 11,
                },
                FounderNode {
                    node: node(2),
                    incarnation: 0,
                },
            ],
        };
        assert!(meta.apply(&founders, 10).unwrap().changed);
        assert!(!meta.apply(&founders, 11).unwrap().changed, "once only");
        assert_eq!(meta.node(1).unwrap().incarnation, 11);
        meta.check().unwrap();
        let up = |id: u64, incarnation: u64| ClusterOp::NodeUp {
            node: node(id),
            cert_sha256: [u8::try_from(id).unwrap(); 32],
            incarnation,
        };
        // Node 1 lost its data before it ever reported itself: refused all the same.
        assert!(matches!(
            meta.apply(&up(1, 12), 20),
            Err(ClusterError::Refused { .. })
        ));
        // Its own directory is admitted; node 2 (not pinned) is admitted with any.
        assert!(meta.apply(&up(1, 11), 21).unwrap().changed);
        assert!(meta.apply(&up(2, 99), 22).unwrap().changed);
        assert_eq!(meta.node(2).unwrap().incarnation, 99);
        // Duplicates and bad addresses are refused as for `Record`.
        let mut empty = ClusterMeta::default();
        let twice = ClusterOp::RecordFounders {
            nodes: vec![
                FounderNode {
                    node: node(1),
                    incarnation: 1,
                },
                FounderNode {
                    node: node(1),
                    incarnation: 2,
                },
            ],
        };
        assert!(empty.apply(&twice, 1).is_err());
        assert!(
            empty
                .apply(&ClusterOp::RecordFounders { nodes: vec![] }, 1)
                .is_err()
        );
        assert_eq!(empty, ClusterMeta::default());
    }

    #[test]
    fn a_node_joins_drains_and_is_removed_with_its_certificate_revoked() {
        let mut meta = recorded();
        meta.apply(&ClusterOp::AddNode(node(4)), 20).unwrap();
        assert_eq!(meta.node(4).unwrap().state, NodeState::Joining);
        // Adding it again is a no-op; under another address it is refused.
        assert!(
            !meta
                .apply(&ClusterOp::AddNode(node(4)), 21)
                .unwrap()
                .changed
        );
        let mut moved = node(4);
        moved.addr = "127.0.0.1:1".into();
        assert!(meta.apply(&ClusterOp::AddNode(moved), 21).is_err());
        let up = ClusterOp::NodeUp {
            node: node(4),
            cert_sha256: [4; 32],
            incarnation: 44,
        };
        assert!(meta.apply(&up, 30).unwrap().changed);
        assert_eq!(meta.node(4).unwrap().state, NodeState::Active);
        assert!(!meta.apply(&up, 31).unwrap().changed, "repeated report");
        // Another data directory under the same id is refused.
        let wiped = ClusterOp::NodeUp {
            node: node(4),
            cert_sha256: [4; 32],
            incarnation: 45,
        };
        assert!(matches!(
            meta.apply(&wiped, 32),
            Err(ClusterError::Refused { .. })
        ));
        let drain = ClusterOp::SetState {
            node_id: 4,
            state: NodeState::Draining,
        };
        assert!(meta.apply(&drain, 40).unwrap().changed);
        meta.apply(
            &ClusterOp::SetLeaderPreferences {
                preferences: vec![(7, 4), (8, 1)],
            },
            41,
        )
        .unwrap();
        assert!(
            meta.apply(&ClusterOp::Remove { node_id: 4 }, 50)
                .unwrap()
                .changed
        );
        assert!(meta.is_revoked(&[4; 32]));
        assert_eq!(meta.leader_preferences.get(&7), None);
        assert_eq!(meta.leader_preferences.get(&8), Some(&1));
        // Removed is final: no report, no drain, no re-add under the same id.
        assert!(matches!(
            meta.apply(&up, 60),
            Err(ClusterError::Refused { .. })
        ));
        assert!(meta.apply(&drain, 60).is_err());
        assert!(meta.apply(&ClusterOp::AddNode(node(4)), 60).is_err());
        // The revoked certificate cannot report itself as another node either.
        let impostor = ClusterOp::NodeUp {
            node: node(2),
            cert_sha256: [4; 32],
            incarnation: 2,
        };
        assert!(matches!(
            meta.apply(&impostor, 61),
            Err(ClusterError::Refused { .. })
        ));
        meta.check().unwrap();
    }

    #[test]
    fn dead_nodes_come_back_by_reporting_themselves() {
        let mut meta = recorded();
        // An active node cannot be removed without a drain (or being dead).
        assert!(meta.apply(&ClusterOp::Remove { node_id: 2 }, 15).is_err());
        let dead = ClusterOp::SetState {
            node_id: 2,
            state: NodeState::Dead,
        };
        meta.apply(&dead, 20).unwrap();
        assert_eq!(meta.nodes_in(NodeState::Dead), vec![2]);
        meta.apply(
            &ClusterOp::NodeUp {
                node: node(2),
                cert_sha256: [2; 32],
                incarnation: 7,
            },
            30,
        )
        .unwrap();
        assert_eq!(meta.node(2).unwrap().state, NodeState::Active);
        // Joining cannot be set by hand, and unknown nodes are not found.
        let join = ClusterOp::SetState {
            node_id: 2,
            state: NodeState::Joining,
        };
        assert!(meta.apply(&join, 31).is_err());
        let unknown = ClusterOp::Remove { node_id: 99 };
        assert_eq!(
            meta.apply(&unknown, 31),
            Err(ClusterError::UnknownNode { node_id: 99 })
        );
        meta.check().unwrap();
    }

    #[test]
    fn bad_addresses_are_refused() {
        let mut meta = recorded();
        let mut bad = node(5);
        bad.addr = "not an address".into();
        assert!(matches!(
            meta.apply(&ClusterOp::AddNode(bad), 1),
            Err(ClusterError::Invalid { .. })
        ));
        let mut long = node(5);
        long.http_addr = "1".repeat(NODE_ADDRESS_BYTES_MAX + 1);
        assert!(meta.apply(&ClusterOp::AddNode(long), 1).is_err());
        let mut taken = node(5);
        taken.addr = node(1).addr;
        assert!(meta.apply(&ClusterOp::AddNode(taken), 1).is_err());
    }
}
