//! Which group replicas this node hosts, recorded beside their data.
//!
//! The server creates replicas at run time (a membership change adds this node to a group) and
//! drops them (it leaves one); at restart it finds them again from this record, never from its
//! configuration's layout. The record is one synced value in the `meta` column family under the
//! node-wide key prefix [`codec::NODE_RECORDS_GROUP`] (no group has that id), so it cannot be
//! touched by any group's range deletes.
//!
//! Deleting a replica's data ([`NodeStorage::delete_replica`], for a purge: the server's drop
//! keeps the data) removes, in one synced batch with the new record, the group's log, its
//! committed and purged marks and its state records; its snapshot files go after that batch (a
//! crash in between leaves files no pointer names, which a later replica of the group replaces).
//! It keeps the group's **vote**: a node must never vote twice in one term of a group.
//!
//! Must not depend on: the server's placement rules or configuration.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::backend::{Batch, Cf};
use crate::codec::{self, META_COMMITTED, META_LAST_PURGED, NODE_RECORDS_GROUP, NODE_REPLICAS};
use crate::error::StoreError;
use crate::node::NodeStorage;

/// The stored record: the groups this node hosts a replica of.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaRecord {
    /// Group ids, ascending.
    pub groups: Vec<u32>,
}

impl ReplicaRecord {
    /// The record of `groups`.
    pub fn of(groups: &BTreeSet<u32>) -> Self {
        ReplicaRecord {
            groups: groups.iter().copied().collect(),
        }
    }
}

fn record_key() -> [u8; 5] {
    codec::tagged_key(NODE_RECORDS_GROUP, NODE_REPLICAS)
}

fn node_io(operation: &'static str, detail: impl ToString) -> StoreError {
    StoreError::Io {
        group: NODE_RECORDS_GROUP,
        operation,
        detail: detail.to_string(),
    }
}

impl NodeStorage {
    /// The groups this node records hosting; `None` when nothing was ever recorded (a fresh data
    /// directory, or one written before replicas were recorded: the caller then takes its
    /// configured layout and records it).
    pub fn recorded_replicas(&self) -> Result<Option<BTreeSet<u32>>, StoreError> {
        let inner = &self.shared.inner;
        let Some(bytes) = inner
            .get(Cf::Meta, &record_key())
            .map_err(|detail| node_io("reading the replica record", detail))?
        else {
            return Ok(None);
        };
        let record: ReplicaRecord =
            codec::decode(&bytes).map_err(|source| StoreError::Corrupt {
                group: NODE_RECORDS_GROUP,
                what: "replica record".to_owned(),
                source,
            })?;
        Ok(Some(record.groups.into_iter().collect()))
    }

    /// Records that this node hosts exactly `groups` (synced before it returns).
    pub fn record_replicas(&self, groups: &BTreeSet<u32>) -> Result<(), StoreError> {
        let mut batch = Batch::default();
        put_record(&mut batch, groups)?;
        self.shared
            .inner
            .write_synced(NODE_RECORDS_GROUP, batch, "recording replicas")
    }

    /// Deletes the data of `group`'s replica (its Raft must be shut down first) and records
    /// `remaining` as the hosted groups, in one synced batch; then removes its snapshot files.
    /// Keeps its vote (see the module docs).
    ///
    /// Not used by the server yet, and only safe for a replica that can never vote in the group
    /// again under this node id: an empty log with a kept vote would grant any candidate's
    /// request (even one whose configuration is stale), which breaks the log-freshness argument
    /// that keeps stale configurations from electing a leader. A purge must first make sure the
    /// node cannot be added back, or that a re-added replica catches up before it votes.
    pub fn delete_replica(&self, group: u32, remaining: &BTreeSet<u32>) -> Result<(), StoreError> {
        if remaining.contains(&group) {
            return Err(node_io(
                "deleting a replica",
                format!("group {group} is still in the remaining set"),
            ));
        }
        let next = group.checked_add(1).ok_or_else(|| {
            node_io(
                "deleting a replica",
                format!("no replica has group id {group}"),
            )
        })?;
        let mut batch = Batch::default();
        batch.delete_range(
            Cf::Log,
            codec::log_key(group, 0).to_vec(),
            codec::log_key(next, 0).to_vec(),
        );
        batch.delete(Cf::Meta, codec::tagged_key(group, META_COMMITTED).to_vec());
        batch.delete(
            Cf::Meta,
            codec::tagged_key(group, META_LAST_PURGED).to_vec(),
        );
        batch.delete_range(
            Cf::State,
            codec::tagged_key(group, 0).to_vec(),
            codec::tagged_key(next, 0).to_vec(),
        );
        put_record(&mut batch, remaining)?;
        let inner = &self.shared.inner;
        inner.write_synced(group, batch, "deleting a replica")?;
        inner.forget_group(group);
        let dir = crate::state_machine::snapshot_dir(&inner.data_dir, group);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(error) => Err(StoreError::Io {
                group,
                operation: "removing snapshot files",
                detail: format!("{}: {error}", dir.display()),
            }),
        }
    }
}

fn put_record(batch: &mut Batch, groups: &BTreeSet<u32>) -> Result<(), StoreError> {
    let bytes = codec::encode(&ReplicaRecord::of(groups))
        .map_err(|error| node_io("encoding the replica record", error))?;
    batch.put(Cf::Meta, record_key().to_vec(), bytes);
    Ok(())
}
