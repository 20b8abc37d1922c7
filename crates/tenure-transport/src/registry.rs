//! Where incoming Raft messages find their group: the [`GroupRegistry`] trait and a simple
//! concurrent implementation, [`GroupTable`].
//!
//! The transport only looks groups up; creating, moving and stopping replicas belongs to the
//! server. Must not depend on how groups are placed on nodes.

use std::path::{Path, PathBuf};

use dashmap::DashMap;
use tenure_storage::{GroupStateMachine, TenureRaft};

/// One local replica of a Raft group, as the transport drives it.
pub type GroupRaft = openraft::Raft<TenureRaft, GroupStateMachine>;

/// Finds local group replicas for incoming messages.
pub trait GroupRegistry: Send + Sync + 'static {
    /// The local replica of `group_id`, if this node hosts one.
    fn group(&self, group_id: u32) -> Option<GroupRaft>;
    /// Every local replica (the heartbeat driver walks them).
    fn groups(&self) -> Vec<GroupRaft>;
    /// A directory on the same file system as the node's data where incoming snapshots are
    /// spooled before their group installs them.
    fn snapshot_spool_dir(&self) -> &Path;
}

/// Receives connections that negotiated the client protocol's ALPN
/// (`tenure_proto::client::CLIENT_ALPN`) on the node's endpoint. The transport only routes them;
/// serving them is the server's business.
pub trait ClientAcceptor: Send + Sync + 'static {
    /// Takes an established client connection (TLS done; the client certificate, if any, has
    /// been verified against the cluster CA).
    fn accept(&self, connection: quinn::Connection);
}

/// A concurrent map of group id to local replica.
#[derive(Debug)]
pub struct GroupTable {
    groups: DashMap<u32, GroupRaft>,
    spool_dir: PathBuf,
}

impl GroupTable {
    /// An empty table spooling snapshots into `spool_dir` (which must exist).
    pub fn new(spool_dir: PathBuf) -> Self {
        Self {
            groups: DashMap::new(),
            spool_dir,
        }
    }

    /// Registers (or replaces) the local replica of `group_id`.
    pub fn insert(&self, group_id: u32, raft: GroupRaft) {
        self.groups.insert(group_id, raft);
    }

    /// Forgets the local replica of `group_id`.
    pub fn remove(&self, group_id: u32) -> Option<GroupRaft> {
        self.groups.remove(&group_id).map(|(_, raft)| raft)
    }

    /// Number of registered replicas.
    pub fn len(&self) -> usize {
        self.groups.len()
    }

    /// True when no replica is registered.
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }
}

impl GroupRegistry for GroupTable {
    fn group(&self, group_id: u32) -> Option<GroupRaft> {
        self.groups
            .get(&group_id)
            .map(|entry| entry.value().clone())
    }

    fn groups(&self) -> Vec<GroupRaft> {
        // By group id: heartbeats (and anything else walking the replicas) go out in one order
        // every run, not in the hash map's.
        let mut groups: Vec<(u32, GroupRaft)> = self
            .groups
            .iter()
            .map(|entry| (*entry.key(), entry.value().clone()))
            .collect();
        groups.sort_by_key(|(group_id, _)| *group_id);
        groups.into_iter().map(|(_, raft)| raft).collect()
    }

    fn snapshot_spool_dir(&self) -> &Path {
        &self.spool_dir
    }
}
