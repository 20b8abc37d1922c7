//! The Raft log of one group: openraft's `RaftLogStorage` over the node's shared RocksDB.
//!
//! - `append` writes one unsynced batch and hands its callback to the node's flusher;
//! - `save_vote` is synced before it returns;
//! - `truncate_after` and `purge` are range deletes (purge records the purged id first);
//! - every read verifies checksums; a corrupt value stops the group with a typed error naming the
//!   group and the index.

use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use openraft::alias::{LogIdOf, VoteOf};
use openraft::entry::RaftEntry;
use openraft::storage::{IOFlushed, LogState, RaftLogStorage};
use openraft::{OptionalSend, RaftLogReader};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::backend::{Batch, Cf};
use crate::codec::{self, META_COMMITTED, META_LAST_PURGED, META_VOTE};
use crate::error::StoreError;
use crate::node::{NodeStorage, Shared, blocking};
use crate::{LogEntry, TenureRaft};

/// The log store of one group replica. Cheap to clone; clones share the node's database.
#[derive(Clone)]
pub struct GroupLogStore {
    shared: Arc<Shared>,
    group: u32,
    /// One past the highest committed index this store (and its clones) saved, 0 before any:
    /// the committed-index invariant's memory.
    committed_saved_next: Arc<AtomicU64>,
}

impl Debug for GroupLogStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupLogStore")
            .field("group", &self.group)
            .finish()
    }
}

impl NodeStorage {
    /// The log store of one group.
    pub fn log_store(&self, group: u32) -> GroupLogStore {
        GroupLogStore::new(Arc::clone(&self.shared), group)
    }
}

impl GroupLogStore {
    pub(crate) fn new(shared: Arc<Shared>, group: u32) -> Self {
        GroupLogStore {
            shared,
            group,
            committed_saved_next: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The group this store belongs to.
    pub fn group(&self) -> u32 {
        self.group
    }

    fn corrupt(&self, what: String, source: codec::DecodeError) -> StoreError {
        self.shared.inner.stop_group(
            self.group,
            StoreError::Corrupt {
                group: self.group,
                what,
                source,
            },
        )
    }

    fn read_error(&self, operation: &'static str, detail: String) -> StoreError {
        self.shared.inner.stop_group(
            self.group,
            StoreError::Io {
                group: self.group,
                operation,
                detail,
            },
        )
    }

    fn get_meta<T: DeserializeOwned>(&self, tag: u8, what: &str) -> Result<Option<T>, StoreError> {
        let inner = &self.shared.inner;
        inner.check_group(self.group)?;
        let bytes = inner
            .get(Cf::Meta, &codec::tagged_key(self.group, tag))
            .map_err(|err| self.read_error("meta read", err))?;
        bytes
            .map(|bytes| codec::decode(&bytes).map_err(|err| self.corrupt(what.to_owned(), err)))
            .transpose()
    }

    fn meta_batch<T: Serialize>(&self, tag: u8, value: &T) -> Result<Batch, StoreError> {
        let bytes = codec::encode(value).map_err(|err| StoreError::Io {
            group: self.group,
            operation: "encode meta",
            detail: err.to_string(),
        })?;
        let mut batch = Batch::default();
        batch.put(Cf::Meta, codec::tagged_key(self.group, tag), bytes);
        Ok(batch)
    }

    fn decode_entry(&self, key: &[u8], value: &[u8]) -> Result<LogEntry, StoreError> {
        let index = codec::parse_log_key(key).map_or(u64::MAX, |(_, index)| index);
        let entry: LogEntry =
            codec::decode(value).map_err(|err| self.corrupt(format!("log entry {index}"), err))?;
        if entry.index() != index {
            return Err(self.shared.inner.stop_group(
                self.group,
                StoreError::MisplacedEntry {
                    group: self.group,
                    stored_at: index,
                    found: entry.index(),
                },
            ));
        }
        Ok(entry)
    }

    /// Entries with index in `[start, end)`, in order, from the first present one. A hole after
    /// it is corruption: a typed error, and the group stops.
    pub fn read_range(&self, start: u64, end: u64) -> Result<Vec<LogEntry>, StoreError> {
        let inner = &self.shared.inner;
        inner.check_group(self.group)?;
        let mut entries = Vec::new();
        if start >= end {
            return Ok(entries);
        }
        let from = codec::log_key(self.group, start);
        let until = codec::log_key(self.group, end);
        let mut expected: Option<u64> = None;
        let mut failure: Option<StoreError> = None;
        inner
            .backend
            .scan(Cf::Log, &from, true, Some(&until), |key, value| {
                let Some((group, index)) = codec::parse_log_key(key) else {
                    return Ok(false);
                };
                if group != self.group || index >= end {
                    return Ok(false);
                }
                if let Some(missing) = expected.filter(|&e| e != index) {
                    // A log never has holes: this is damage, not the end of the range.
                    failure = Some(self.shared.inner.stop_group(
                        self.group,
                        StoreError::Hole {
                            group: self.group,
                            missing,
                        },
                    ));
                    return Ok(false);
                }
                match self.decode_entry(key, value) {
                    Ok(entry) => entries.push(entry),
                    Err(error) => {
                        failure = Some(error);
                        return Ok(false);
                    }
                }
                expected = index.checked_add(1);
                Ok(true)
            })
            .map_err(|err| self.read_error("log read", err))?;
        if let Some(error) = failure {
            return Err(error);
        }
        Ok(entries)
    }

    /// The last entry of this group's log, if any.
    pub fn last_entry(&self) -> Result<Option<LogEntry>, StoreError> {
        self.edge_entry(u64::MAX, false)
    }

    /// The first entry of this group's log, if any.
    pub fn first_entry(&self) -> Result<Option<LogEntry>, StoreError> {
        self.edge_entry(0, true)
    }

    /// The first entry of this group met when iterating from `index` forward or back.
    fn edge_entry(&self, index: u64, forward: bool) -> Result<Option<LogEntry>, StoreError> {
        let inner = &self.shared.inner;
        inner.check_group(self.group)?;
        let from = codec::log_key(self.group, index);
        // This group's keys only. Forward, the exclusive limit leaves out index `u64::MAX`, which
        // no log reaches.
        let limit = if forward {
            codec::log_key(self.group, u64::MAX)
        } else {
            codec::log_key(self.group, 0)
        };
        let mut found: Option<(Vec<u8>, Vec<u8>)> = None;
        inner
            .backend
            .scan(Cf::Log, &from, forward, Some(&limit), |key, value| {
                found = Some((key.to_vec(), value.to_vec()));
                Ok(false)
            })
            .map_err(|err| self.read_error("log read", err))?;
        let Some((key, value)) = found else {
            return Ok(None);
        };
        match codec::parse_log_key(&key) {
            Some((group, _)) if group == self.group => Ok(Some(self.decode_entry(&key, &value)?)),
            _ => Ok(None),
        }
    }
}

fn bounds(range: &impl RangeBounds<u64>) -> (u64, u64) {
    let start = match range.start_bound() {
        Bound::Included(&x) => x,
        Bound::Excluded(&x) => x.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&x) => x.saturating_add(1),
        Bound::Excluded(&x) => x,
        Bound::Unbounded => u64::MAX,
    };
    (start, end)
}

impl RaftLogReader<TenureRaft> for GroupLogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<LogEntry>, io::Error> {
        let (start, end) = bounds(&range);
        Ok(self.read_range(start, end)?)
    }

    async fn read_vote(&mut self) -> Result<Option<VoteOf<TenureRaft>>, io::Error> {
        Ok(self.get_meta(META_VOTE, "vote")?)
    }
}

impl RaftLogStorage<TenureRaft> for GroupLogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TenureRaft>, io::Error> {
        let last_purged: Option<LogIdOf<TenureRaft>> =
            self.get_meta(META_LAST_PURGED, "last purged log id")?;
        let last = self.last_entry()?.map(|entry| entry.log_id());
        Ok(LogState {
            last_log_id: last.or(last_purged),
            last_purged_log_id: last_purged,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &VoteOf<TenureRaft>) -> Result<(), io::Error> {
        self.shared.inner.check_group(self.group)?;
        let batch = self.meta_batch(META_VOTE, vote)?;
        let store = self.clone();
        blocking(&self.shared.inner, move || {
            store
                .shared
                .inner
                .write_synced(store.group, batch, "save vote")
        })
        .await
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogIdOf<TenureRaft>>,
    ) -> Result<(), io::Error> {
        self.shared.inner.check_group(self.group)?;
        if let Some(log_id) = &committed {
            // Invariant: the committed index only grows. openraft saves it only as it advances
            // (never back), so a smaller one means a bug in the layers above; the node stops.
            // Checked within one process lifetime of this group's store.
            let next = log_id.index().saturating_add(1);
            let before = self.committed_saved_next.fetch_max(next, Ordering::AcqRel);
            assert!(
                next >= before,
                "committed index would go back: group {} saved up to index {}, now {}",
                self.group,
                before.saturating_sub(1),
                log_id.index()
            );
        }
        let batch = self.meta_batch(META_COMMITTED, &committed)?;
        // Not synced: a lost committed id only means re-applying from the snapshot on restart.
        Ok(self
            .shared
            .inner
            .write_unsynced(self.group, batch, "save committed")?)
    }

    async fn read_committed(&mut self) -> Result<Option<LogIdOf<TenureRaft>>, io::Error> {
        Ok(self
            .get_meta::<Option<LogIdOf<TenureRaft>>>(META_COMMITTED, "committed log id")?
            .flatten())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: IOFlushed<TenureRaft>,
    ) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = LogEntry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let inner = &self.shared.inner;
        inner.check_group(self.group)?;
        let mut batch = Batch::default();
        let mut count = 0u64;
        for entry in entries {
            let value = codec::encode(&entry).map_err(|err| StoreError::Io {
                group: self.group,
                operation: "encode entry",
                detail: err.to_string(),
            })?;
            batch.put(Cf::Log, codec::log_key(self.group, entry.index()), value);
            count += 1;
        }
        inner.write_unsynced(self.group, batch, "append")?;
        inner.stats.appends.fetch_add(1, Ordering::Relaxed);
        inner
            .stats
            .entries_appended
            .fetch_add(count, Ordering::Relaxed);
        inner.enqueue_flush(callback);
        Ok(())
    }

    async fn truncate_after(
        &mut self,
        last_log_id: Option<LogIdOf<TenureRaft>>,
    ) -> Result<(), io::Error> {
        let inner = &self.shared.inner;
        inner.check_group(self.group)?;
        let first_removed = last_log_id.map_or(0, |id| id.index() + 1);
        let mut batch = Batch::default();
        batch.delete_range(
            Cf::Log,
            codec::log_key(self.group, first_removed),
            codec::log_key(self.group, u64::MAX),
        );
        batch.delete(Cf::Log, codec::log_key(self.group, u64::MAX));
        // Not synced: the entries removed were never committed, and a later append is synced
        // before it is acknowledged, which makes this delete durable too (same WAL, in order).
        Ok(inner.write_unsynced(self.group, batch, "truncate")?)
    }

    async fn purge(&mut self, log_id: LogIdOf<TenureRaft>) -> Result<(), io::Error> {
        let inner = &self.shared.inner;
        inner.check_group(self.group)?;
        let mut batch = self.meta_batch(META_LAST_PURGED, &log_id)?;
        batch.delete_range(
            Cf::Log,
            codec::log_key(self.group, 0),
            codec::log_key(self.group, log_id.index() + 1),
        );
        // One batch: the purged id and the deletion land together or not at all.
        Ok(inner.write_unsynced(self.group, batch, "purge")?)
    }
}
