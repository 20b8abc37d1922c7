//! The gate between the peer transport and this node's replicas: closed on a data directory's
//! first start until the node has shown it is not a member that lost its data.
//!
//! Raft's safety rests on every voter remembering its votes and the entries it acknowledged. A
//! node whose data directory was wiped (a disk replaced, a directory deleted) and that comes back
//! under its old id would start with empty replicas: it could grant a second vote in a term it
//! already voted in, or help elect a leader without an entry it had acknowledged, and a
//! committed, acknowledged lease would be lost. The data directory's incarnation (its identity
//! file's creation time, reported in `NodeUp` and kept in the replicated node table) tells the
//! two apart: the table refuses a `NodeUp` of a known node with another incarnation. So on a
//! first start the gate stays closed (the transport sees no replica: no vote, no append, no
//! snapshot reaches one, and no replica is created) until either every other node says no node
//! table exists yet (a new cluster) and none of them pinned this node with another data
//! directory (`crate::founders`: each founder pins every founder's incarnation durably before
//! its replicas open, and the table's first entry records those pins), or the node table
//! accepts this node's `NodeUp`. When the table refuses it, the node is excluded: the gate stays closed, its
//! replicas and its transport stop (so the placement controller sees it unreachable and
//! re-creates its replicas elsewhere after `node_dead_after_ms`), and `tenure serve` exits with
//! the reason. The way back is a new id (`tenurectl node remove`, then join as a new node).
//!
//! A founder excluded before any node table exists (another founder pinned it with another
//! directory) keeps its transport, refusing every request but the questions about the cluster
//! (`ClusterNodes`, `Routing`, `Status`), until it learns of a table and 30 s more: a founder
//! whose own first start is still pending waits for an answer from every other node (its gate
//! asks `ClusterNodes`, its bootstrap `Status`), and would wait forever for one that exited.
//! Only then does it stop its transport and exit (no controller can count it dead before a
//! table exists anyway).
//!
//! A restart from a data directory that holds recorded replicas, or a replica with a durable
//! vote or log (a first start that crashed before recording), opens the gate at once; the
//! replica record is written only while the gate is open.
//!
//! A cluster's birth: a founder's replicas open before any table exists, so the table cannot
//! protect it then; the founder pins (`crate::founders`) do. A founder is pinned by each other
//! founder before that one's replicas open, so whatever a founder's replicas did with a quorum,
//! that quorum holds a founder that pinned it; coming back wiped, it asks every other node,
//! and the one that pinned it refuses it. Once the table exists, its first entry
//! (`RecordFounders`) carries the pins of the founder that recorded it. A founder wiped before
//! any other founder pinned it had never served with anyone, and is admitted as new.
//!
//! Must not depend on: the request path, the background loops (they consult the gate).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use tenure_transport::{GroupRaft, GroupRegistry, GroupTable};
use tokio::sync::watch;

const PENDING: u8 = 0;
const OPEN: u8 = 1;
const EXCLUDED: u8 = 2;

/// The gate (see the module documentation). The transport and the heartbeat driver hold it as
/// their [`GroupRegistry`].
#[derive(Debug)]
pub struct ReplicaGate {
    table: Arc<GroupTable>,
    state: AtomicU8,
    /// True once the gate was open, even if it was closed again (for simulations' checks).
    ever_opened: AtomicBool,
    /// The reason once excluded (`None` until then).
    excluded: watch::Sender<Option<String>>,
    /// True once an excluded node stopped its replicas and its transport (at once, or, when
    /// excluded before any node table existed, once one does: see the module documentation).
    retired: watch::Sender<bool>,
}

impl ReplicaGate {
    /// A gate over `table`: open when `open` (a restart with recorded replicas), else pending.
    pub fn new(table: Arc<GroupTable>, open: bool) -> Self {
        ReplicaGate {
            table,
            state: AtomicU8::new(if open { OPEN } else { PENDING }),
            ever_opened: AtomicBool::new(open),
            excluded: watch::Sender::new(None),
            retired: watch::Sender::new(false),
        }
    }

    /// True once the replicas may be reached by peers.
    pub fn is_open(&self) -> bool {
        self.state.load(Ordering::SeqCst) == OPEN
    }

    /// True when the gate was open at some moment of this process (even if closed since).
    pub fn ever_opened(&self) -> bool {
        self.ever_opened.load(Ordering::SeqCst)
    }

    /// True once this node was excluded.
    pub fn is_excluded(&self) -> bool {
        self.state.load(Ordering::SeqCst) == EXCLUDED
    }

    /// Opens a pending gate. An excluded node stays excluded: returns false then.
    pub(crate) fn open(&self) -> bool {
        match self
            .state
            .compare_exchange(PENDING, OPEN, Ordering::SeqCst, Ordering::SeqCst)
        {
            Ok(_) => {
                self.ever_opened.store(true, Ordering::SeqCst);
                true
            }
            Err(current) => current == OPEN,
        }
    }

    /// Closes the gate for good and records why. Returns false when it was excluded already.
    pub(crate) fn exclude(&self, reason: String) -> bool {
        if self.state.swap(EXCLUDED, Ordering::SeqCst) == EXCLUDED {
            return false;
        }
        self.excluded.send_replace(Some(reason));
        true
    }

    /// The reason this node was excluded, as soon as it is (`None` until then).
    pub fn excluded(&self) -> watch::Receiver<Option<String>> {
        self.excluded.subscribe()
    }

    /// Marks an excluded node's replicas and transport stopped: the node may exit now.
    pub(crate) fn retire(&self) {
        self.retired.send_replace(true);
    }

    /// True once an excluded node stopped its replicas and transport (see [`ReplicaGate::retire`]).
    pub fn retired(&self) -> watch::Receiver<bool> {
        self.retired.subscribe()
    }
}

impl GroupRegistry for ReplicaGate {
    fn group(&self, group_id: u32) -> Option<GroupRaft> {
        if self.is_open() {
            self.table.group(group_id)
        } else {
            None
        }
    }

    fn groups(&self) -> Vec<GroupRaft> {
        if self.is_open() {
            self.table.groups()
        } else {
            Vec::new()
        }
    }

    fn snapshot_spool_dir(&self) -> &Path {
        self.table.snapshot_spool_dir()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Arc<GroupTable> {
        Arc::new(GroupTable::new(std::env::temp_dir()))
    }

    #[test]
    fn a_pending_gate_opens_and_an_excluded_one_never_does() {
        let gate = ReplicaGate::new(table(), false);
        assert!(!gate.is_open());
        assert!(gate.groups().is_empty());
        assert!(!gate.ever_opened());
        assert!(gate.open());
        assert!(gate.is_open() && gate.ever_opened());
        let excluded = gate.excluded();
        assert!(gate.exclude("another incarnation".into()));
        assert!(!gate.is_open() && gate.is_excluded());
        assert_eq!(excluded.borrow().as_deref(), Some("another incarnation"));
        assert!(!gate.open(), "an excluded node must never reopen");
        assert!(gate.ever_opened(), "it was open once");
        assert!(!gate.exclude("again".into()));
        let retired = gate.retired();
        assert!(!*retired.borrow(), "excluded is not yet retired");
        gate.retire();
        assert!(*retired.borrow());
    }

    #[test]
    fn a_restart_with_recorded_replicas_is_open_at_once() {
        assert!(ReplicaGate::new(table(), true).is_open());
    }
}
