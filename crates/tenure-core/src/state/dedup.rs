//! Request-id deduplication: the stored outcome of every recent lease request.
//!
//! A record is keyed by a 128-bit XXH3 digest of `(tenant_id, resource_id, request_id)` and
//! holds a 64-bit fingerprint of the rest of the request plus the outcome. Records live in a
//! hash map and in a FIFO queue in recording order, which is log-time order, so retention is
//! enforced from the queue's front without scanning:
//! - a record is *visible* while `recorded_at_ms + retention_ms > now`; lookups check this, so the
//!   window is exact even though memory is reclaimed lazily (a bounded amount per entry);
//! - the table never holds more than `dedup_records_max` records: at the bound the oldest record
//!   is dropped if it is older than `dedup_retention_ms_min`, else the new request is refused with
//!   `OVERLOADED` before it has any effect.
//!
//! Queue entries carry the record's sequence number; an entry whose record was replaced (a key
//! reused after its retention) is stale and skipped. The queue, stale entries included, is part
//! of the snapshot, so lazy reclamation proceeds identically on every replica.

use std::collections::VecDeque;

use compact_str::CompactString;
use hashbrown::HashMap;
use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::Xxh3Default;

use crate::command::{LeaseOp, LeaseReply};
use crate::error::{LeaseError, OverloadReason};
use crate::limits::GroupLimits;

pub(crate) type HashBuilder = foldhash::fast::FixedState;

/// Digest naming one `(tenant, resource, request id)`.
pub(crate) type DedupKey = u128;

/// One remembered outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DedupRecord {
    pub(crate) sequence: u64,
    pub(crate) recorded_at_ms: u64,
    pub(crate) fingerprint: u64,
    pub(crate) outcome: Result<LeaseReply, LeaseError>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct QueueEntry {
    pub(crate) key: DedupKey,
    pub(crate) sequence: u64,
}

pub(crate) fn dedup_key(op: &LeaseOp) -> DedupKey {
    let key = op.key();
    let mut hasher = Xxh3Default::new();
    for part in [
        key.tenant_id.as_str(),
        key.resource_id.as_str(),
        op.request_id(),
    ] {
        hasher.update(&(part.len() as u64).to_le_bytes());
        hasher.update(part.as_bytes());
    }
    hasher.digest128()
}

/// Digest of everything in a request besides its key and request id: reusing a request id for
/// anything else (another operation, holder, lease or ttl) changes it.
pub(crate) fn fingerprint(op: &LeaseOp) -> u64 {
    let mut hasher = Xxh3Default::new();
    let (tag, holder, lease, ttl_ms): (u8, &str, Option<_>, Option<u64>) = match op {
        LeaseOp::Acquire(r) => (1, &r.holder_id, None, Some(r.ttl_ms)),
        LeaseOp::Renew(r) => (2, &r.holder_id, Some(r.lease_id), Some(r.ttl_ms)),
        LeaseOp::Release(r) => (3, &r.holder_id, Some(r.lease_id), None),
    };
    hasher.update(&[tag]);
    hasher.update(&(holder.len() as u64).to_le_bytes());
    hasher.update(holder.as_bytes());
    if let Some(lease) = lease {
        hasher.update(&lease.group_id.0.to_le_bytes());
        hasher.update(&lease.sequence.to_le_bytes());
    }
    if let Some(ttl_ms) = ttl_ms {
        hasher.update(&ttl_ms.to_le_bytes());
    }
    hasher.digest()
}

#[derive(Debug, Clone)]
pub(crate) struct DedupTable {
    records: HashMap<DedupKey, DedupRecord, HashBuilder>,
    queue: VecDeque<QueueEntry>,
    next_sequence: u64,
}

/// What a lookup found.
pub(crate) enum Lookup<'a> {
    /// Never seen, or its retention ended.
    Miss,
    /// Seen with the same fingerprint: return this outcome.
    Replay(&'a Result<LeaseReply, LeaseError>),
    /// Seen with another fingerprint: the request id is being reused for something else.
    Conflict,
}

impl DedupTable {
    pub(crate) fn new(hash_builder: HashBuilder) -> Self {
        DedupTable {
            records: HashMap::with_hasher(hash_builder),
            queue: VecDeque::new(),
            next_sequence: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.records.len()
    }

    pub(crate) fn lookup(
        &self,
        key: DedupKey,
        fingerprint: u64,
        now_ms: u64,
        limits: &GroupLimits,
    ) -> Lookup<'_> {
        match self.records.get(&key) {
            Some(record)
                if record
                    .recorded_at_ms
                    .saturating_add(limits.dedup_retention_ms)
                    > now_ms =>
            {
                if record.fingerprint == fingerprint {
                    Lookup::Replay(&record.outcome)
                } else {
                    Lookup::Conflict
                }
            }
            _ => Lookup::Miss,
        }
    }

    /// Makes room for one more record, or refuses with `OVERLOADED` (changing nothing then,
    /// except dropping records that were droppable anyway).
    pub(crate) fn reserve_one(
        &mut self,
        now_ms: u64,
        limits: &GroupLimits,
    ) -> Result<(), LeaseError> {
        while self.records.len() as u64 >= limits.dedup_records_max {
            let Some(front) = self.queue.front().copied() else {
                // Records without queue entries cannot exist; refuse rather than grow.
                return Err(LeaseError::Overloaded {
                    reason: OverloadReason::DedupTableFull,
                });
            };
            match self.records.get(&front.key) {
                Some(record) if record.sequence == front.sequence => {
                    let age_ms = now_ms.saturating_sub(record.recorded_at_ms);
                    let expired = record
                        .recorded_at_ms
                        .saturating_add(limits.dedup_retention_ms)
                        <= now_ms;
                    if !expired && age_ms < limits.dedup_retention_ms_min {
                        return Err(LeaseError::Overloaded {
                            reason: OverloadReason::DedupTableFull,
                        });
                    }
                    self.records.remove(&front.key);
                    self.queue.pop_front();
                }
                _ => {
                    self.queue.pop_front();
                }
            }
        }
        Ok(())
    }

    /// Stores an outcome. Call [`DedupTable::reserve_one`] first.
    pub(crate) fn record(
        &mut self,
        key: DedupKey,
        fingerprint: u64,
        now_ms: u64,
        outcome: Result<LeaseReply, LeaseError>,
    ) {
        let sequence = self.next_sequence;
        self.next_sequence += 1;
        self.records.insert(
            key,
            DedupRecord {
                sequence,
                recorded_at_ms: now_ms,
                fingerprint,
                outcome,
            },
        );
        self.queue.push_back(QueueEntry { key, sequence });
    }

    /// Drops records whose retention ended and stale queue entries, at most `budget` of them.
    pub(crate) fn collect_garbage(&mut self, now_ms: u64, limits: &GroupLimits, mut budget: usize) {
        while budget > 0 {
            let Some(front) = self.queue.front().copied() else {
                return;
            };
            match self.records.get(&front.key) {
                Some(record) if record.sequence == front.sequence => {
                    if record
                        .recorded_at_ms
                        .saturating_add(limits.dedup_retention_ms)
                        > now_ms
                    {
                        return;
                    }
                    self.records.remove(&front.key);
                }
                _ => {}
            }
            self.queue.pop_front();
            budget -= 1;
        }
    }

    // ---- snapshot support ----

    pub(crate) fn next_sequence(&self) -> u64 {
        self.next_sequence
    }

    pub(crate) fn queue_len(&self) -> usize {
        self.queue.len()
    }

    /// Queue entries in order, each with its record when the entry is the record's live one.
    pub(crate) fn iter_queue(&self) -> impl Iterator<Item = (QueueEntry, Option<&DedupRecord>)> {
        self.queue.iter().map(|entry| {
            let record = self
                .records
                .get(&entry.key)
                .filter(|record| record.sequence == entry.sequence);
            (*entry, record)
        })
    }

    /// Appends a restored queue entry (and its record). Returns false if it contradicts the
    /// entries already restored.
    pub(crate) fn push_restored(&mut self, entry: QueueEntry, record: Option<DedupRecord>) -> bool {
        if entry.sequence >= self.next_sequence {
            return false;
        }
        if let Some(record) = record {
            if record.sequence != entry.sequence {
                return false;
            }
            // At most one live record per key: a replaced record's queue entry is stale.
            if self.records.contains_key(&entry.key) {
                return false;
            }
            self.records.insert(entry.key, record);
        }
        self.queue.push_back(entry);
        true
    }

    pub(crate) fn set_next_sequence(&mut self, next_sequence: u64) {
        self.next_sequence = next_sequence;
    }
}

/// Short description of a reuse conflict, for the `INVALID_ARGUMENT` message.
pub(crate) fn conflict_error() -> LeaseError {
    LeaseError::InvalidArgument {
        field: CompactString::const_new("request_id"),
        reason: "already used on this resource for a different operation, holder, lease or ttl"
            .to_owned(),
    }
}
