//! # tenure-storage: durable storage for many Raft groups on one node
//!
//! One RocksDB instance per node holds the Raft logs, Raft metadata and state-machine records of
//! every group replica on the node, in three column families (`log`, `meta`, `state`) with keys
//! prefixed by group id. All groups share one write-ahead log, so one WAL sync makes every
//! group's pending appends durable: appends write unsynced batches and register their openraft
//! `IOFlushed` callback; a single flusher thread per node syncs once and completes every callback
//! registered before that sync.
//!
//! - [`NodeStorage`]: opens the database, runs the flusher, hands out per-group stores.
//! - [`GroupLogStore`]: openraft's `RaftLogStorage` for one group.
//! - [`GroupStateMachine`]: openraft's `RaftStateMachine` for one group, applying entries through
//!   `tenure-core` and snapshotting in `tenure-core`'s format to files.
//! - [`TenureRaft`]: the openraft type configuration every tenure crate shares.
//! - [`NodeStorage::recorded_replicas`], [`NodeStorage::record_replicas`],
//!   [`NodeStorage::delete_replica`]: which replicas the node hosts, and dropping one's data
//!   (keeping its vote).
//! - [`MemoryDisk`]: an in-memory stand-in for RocksDB (for a deterministic simulation) that
//!   loses unsynced writes when told the machine crashed; [`NodeStorage::open_in_memory`].
//!
//! Every stored value carries a checksum; corruption is a typed [`StoreError`] naming group and
//! key, and the group stops serving rather than serve wrong state. An I/O error also stops the
//! group's writes; nothing acknowledged is lost because acknowledgement waits for the sync. A
//! failed WAL sync is sticky: every later sync and write fails ([`StoreError::SyncFailed`]) until
//! the node restarts. A WAL damaged inside (not merely torn at its end by a crash) makes the
//! store refuse to open ([`StoreError::CorruptStore`]) instead of dropping synced writes.
//!
//! Must not depend on: the network (quinn), the server's configuration, or any clock in a
//! decision. It uses tokio only to move blocking RocksDB calls off the caller's runtime; it never
//! creates a runtime.

mod backend;
pub mod codec;
mod error;
mod log_store;
mod node;
mod replicas;
mod runtime;
mod state_machine;

pub use backend::{CF_LOG, CF_META, CF_STATE, CrashLoss, MemoryDisk};
pub use error::StoreError;
pub use log_store::GroupLogStore;
pub use node::{
    FILE_DESCRIPTORS_BESIDES_TABLES_MAX, FSYNC_DURATION_SECONDS_METRIC, MAX_OPEN_FILES_DEFAULT,
    NodeStorage, SNAPSHOT_FILES_PER_GROUP_MAX, StatsSnapshot, StorageOptions, StorageStats,
};
pub use replicas::ReplicaRecord;
pub use runtime::{TenureRuntime, seed_raft_randomness};
pub use state_machine::{ApplyObserver, GroupSnapshotBuilder, GroupStateMachine};

openraft::declare_raft_types!(
    /// The openraft type configuration of tenure: log entries carry a leader-stamped
    /// [`tenure_core::Entry`]; applying one yields its [`tenure_core::ApplyOutput`] (`None` for
    /// blank and membership entries).
    pub TenureRaft:
        D = tenure_core::Entry,
        R = Option<tenure_core::ApplyOutput>,
        NodeId = u64,
        Node = openraft::impls::BasicNode,
        AsyncRuntime = crate::TenureRuntime,
);

/// A log entry of a tenure group.
pub type LogEntry = openraft::alias::EntryOf<TenureRaft>;
