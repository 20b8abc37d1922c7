//! Request-id deduplication: the stored outcome of every recent lease request.
//!
//! A record is keyed by a 128-bit XXH3 digest of `(tenant_id, resource_id, request_id)` and
//! holds a 64-bit fingerprint of the rest of the request plus the outcome. Records sit in a ring
//! (a FIFO in recording order, which is log-time order); a compact hash index maps each key to the
//! sequence number of its live record. Retention is enforced from the ring's front, never by a
//! scan:
//! - a record is *visible* while `recorded_at_ms + retention_ms > now`; lookups check this, so the
//!   window is exact even though memory is reclaimed lazily (a bounded amount per entry);
//! - the ring never holds more than `dedup_records_max` records: at the bound the oldest record
//!   is dropped if it is older than `dedup_retention_ms_min`, else the new request is refused with
//!   `OVERLOADED` before it has any effect.
//!
//! A key recorded again after its retention leaves its older ring entry *stale* (the index points
//! past it); stale entries are skipped and dropped from the front. The ring, stale entries
//! included, is the snapshot's content; the index is rebuilt from it (the last entry of a key wins),
//! so lazy reclamation proceeds identically on every replica.

use std::collections::VecDeque;

use compact_str::CompactString;
use hashbrown::HashMap;
use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::{xxh3_64, xxh3_128};

use crate::command::{LeaseOp, LeaseReply};
use crate::error::{LeaseError, OverloadReason};
use crate::limits::GroupLimits;

pub(crate) type HashBuilder = foldhash::fast::FixedState;

/// Digest naming one `(tenant, resource, request id)`.
pub(crate) type DedupKey = u128;

/// One remembered outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DedupRecord {
    pub(crate) key: DedupKey,
    pub(crate) recorded_at_ms: u64,
    pub(crate) fingerprint: u64,
    pub(crate) outcome: Result<LeaseReply, LeaseError>,
}

fn push_part(scratch: &mut Vec<u8>, part: &[u8]) {
    scratch.extend_from_slice(&(part.len() as u64).to_le_bytes());
    scratch.extend_from_slice(part);
}

/// The record key of a request: XXH3-128 over the length-prefixed tenant, resource and request id.
pub(crate) fn dedup_key(op: &LeaseOp, scratch: &mut Vec<u8>) -> DedupKey {
    let key = op.key();
    scratch.clear();
    push_part(scratch, key.tenant_id.as_bytes());
    push_part(scratch, key.resource_id.as_bytes());
    push_part(scratch, op.request_id().as_bytes());
    xxh3_128(scratch)
}

/// Digest of everything in a request besides its key and request id: reusing a request id for
/// anything else (another operation, holder, lease or ttl) changes it.
pub(crate) fn fingerprint(op: &LeaseOp, scratch: &mut Vec<u8>) -> u64 {
    let (tag, holder, lease, ttl_ms): (u8, &str, Option<_>, Option<u64>) = match op {
        LeaseOp::Acquire(r) => (1, &r.holder_id, None, Some(r.ttl_ms)),
        LeaseOp::Renew(r) => (2, &r.holder_id, Some(r.lease_id), Some(r.ttl_ms)),
        LeaseOp::Release(r) => (3, &r.holder_id, Some(r.lease_id), None),
    };
    scratch.clear();
    scratch.push(tag);
    push_part(scratch, holder.as_bytes());
    if let Some(lease) = lease {
        scratch.extend_from_slice(&lease.group_id.0.to_le_bytes());
        scratch.extend_from_slice(&lease.sequence.to_le_bytes());
    }
    if let Some(ttl_ms) = ttl_ms {
        scratch.extend_from_slice(&ttl_ms.to_le_bytes());
    }
    xxh3_64(scratch)
}

#[derive(Debug, Clone)]
pub(crate) struct DedupTable {
    /// Key -> sequence number of its live record.
    index: HashMap<DedupKey, u64, HashBuilder>,
    /// Records in recording order; `ring[i]` has sequence `front_sequence + i`.
    ring: VecDeque<DedupRecord>,
    front_sequence: u64,
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

fn is_expired(record: &DedupRecord, now_ms: u64, limits: &GroupLimits) -> bool {
    record
        .recorded_at_ms
        .saturating_add(limits.dedup_retention_ms)
        <= now_ms
}

impl DedupTable {
    pub(crate) fn new(hash_builder: HashBuilder) -> Self {
        DedupTable {
            index: HashMap::with_hasher(hash_builder),
            ring: VecDeque::new(),
            front_sequence: 0,
        }
    }

    /// Live records (the index's size).
    pub(crate) fn len(&self) -> usize {
        self.index.len()
    }

    /// Ring entries, stale ones included: what the bound counts.
    pub(crate) fn ring_len(&self) -> usize {
        self.ring.len()
    }

    fn record_at(&self, sequence: u64) -> Option<&DedupRecord> {
        let offset = usize::try_from(sequence.checked_sub(self.front_sequence)?).ok()?;
        self.ring.get(offset)
    }

    fn front_is_live(&self) -> Option<bool> {
        let front = self.ring.front()?;
        Some(self.index.get(&front.key) == Some(&self.front_sequence))
    }

    fn pop_front(&mut self, live: bool) {
        if let Some(front) = self.ring.pop_front() {
            if live {
                self.index.remove(&front.key);
            }
            self.front_sequence += 1;
        }
    }

    pub(crate) fn lookup(
        &self,
        key: DedupKey,
        fingerprint: u64,
        now_ms: u64,
        limits: &GroupLimits,
    ) -> Lookup<'_> {
        let record = self
            .index
            .get(&key)
            .and_then(|&sequence| self.record_at(sequence));
        match record {
            Some(record) if !is_expired(record, now_ms, limits) => {
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
        while self.ring.len() as u64 >= limits.dedup_records_max {
            let (Some(live), Some(front)) = (self.front_is_live(), self.ring.front()) else {
                break;
            };
            if live {
                let age_ms = now_ms.saturating_sub(front.recorded_at_ms);
                if !is_expired(front, now_ms, limits) && age_ms < limits.dedup_retention_ms_min {
                    return Err(LeaseError::Overloaded {
                        reason: OverloadReason::DedupTableFull,
                    });
                }
            }
            self.pop_front(live);
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
        let sequence = self.front_sequence + self.ring.len() as u64;
        self.ring.push_back(DedupRecord {
            key,
            recorded_at_ms: now_ms,
            fingerprint,
            outcome,
        });
        self.index.insert(key, sequence);
    }

    /// Drops entries whose retention ended (live or stale) from the front, at most `budget`.
    pub(crate) fn collect_garbage(&mut self, now_ms: u64, limits: &GroupLimits, mut budget: usize) {
        while budget > 0 {
            // Only an expired front is worth the index probe: a fresh one (live or stale) stops
            // the sweep, so a table in steady state costs one sequential read per entry here.
            let Some(front) = self.ring.front() else {
                return;
            };
            if !is_expired(front, now_ms, limits) {
                return;
            }
            let live = self.front_is_live().unwrap_or(false);
            self.pop_front(live);
            budget -= 1;
        }
    }

    // ---- snapshot support ----

    pub(crate) fn front_sequence(&self) -> u64 {
        self.front_sequence
    }

    /// Ring entries in order, stale ones included.
    pub(crate) fn iter_ring(&self) -> impl Iterator<Item = &DedupRecord> {
        self.ring.iter()
    }

    pub(crate) fn set_front_sequence(&mut self, front_sequence: u64) {
        self.front_sequence = front_sequence;
    }

    /// Appends a restored ring entry; a later entry of the same key supersedes an earlier one.
    pub(crate) fn push_restored(&mut self, record: DedupRecord) {
        let sequence = self.front_sequence + self.ring.len() as u64;
        self.index.insert(record.key, sequence);
        self.ring.push_back(record);
    }

    /// Checks the index against the ring (tests and restore): O(n).
    pub(crate) fn check(&self) -> Result<(), String> {
        let mut live = 0usize;
        for (record, sequence) in self.ring.iter().zip(self.front_sequence..) {
            if self.index.get(&record.key) == Some(&sequence) {
                live += 1;
            }
        }
        if live != self.index.len() {
            return Err(format!(
                "dedup index has {} keys for {live} live ring entries",
                self.index.len()
            ));
        }
        Ok(())
    }
}

/// The error for a request id reused for a different request.
pub(crate) fn conflict_error() -> LeaseError {
    LeaseError::InvalidArgument {
        field: CompactString::const_new("request_id"),
        reason: "already used on this resource for a different operation, holder, lease or ttl"
            .to_owned(),
    }
}
