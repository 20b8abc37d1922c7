//! Request-id deduplication: the stored outcome of every recent lease request.
//!
//! A record stores the request's full identity `(tenant_id, resource_id, request_id)` (packed
//! into one byte string, [`DedupIdentity`]), a 64-bit fingerprint of the rest of the request and
//! the outcome. A lookup is a match only when the stored identity equals the request's
//! (contract 3.4): the hash that finds candidates is an in-memory, per-process seeded hash
//! whose collisions cost a comparison, never a wrong replay, so no tenant can replay another
//! tenant's outcome by crafting a colliding request id. (Issue 19 item 6: this table used to
//! trust a 128-bit XXH3 digest with XXH3's public secret as the identity.)
//!
//! Records sit in a ring (a FIFO in recording order, which is log-time order); a hash table of
//! sequence numbers, hashed by identity and compared on the identity stored in the ring, finds
//! the live record of an identity. Retention is enforced from the ring's front, never by a scan:
//! - a record is *visible* while `recorded_at_ms + retention_ms > now`; lookups check this, so the
//!   window is exact even though memory is reclaimed lazily (a bounded amount per entry);
//! - the ring never holds more than `dedup_records_max` records: at the bound the oldest record
//!   is dropped if it is older than `dedup_retention_ms_min`, else the new request is refused with
//!   `OVERLOADED` before it has any effect;
//! - **fair share** (issue 19 item 7): while the ring is at its bound, a tenant holding fewer
//!   than its fair share of it (`dedup_records_max` divided by the number of tenants with
//!   entries, itself included) may drop the oldest record even if it is young, when that
//!   record's tenant holds more than its fair share. So one tenant flooding the table cannot make
//!   the others' requests `OVERLOADED` for longer than the oldest non-flooding record takes to
//!   reach `dedup_retention_ms_min`; a tenant at or above its share is refused, as before, and
//!   the records it holds beyond its share lose the minimum-retention guarantee (a retry of one
//!   of them after it was dropped is applied as a new request).
//!
//! An identity recorded again after its retention leaves its older ring entry *stale* (the index
//! points past it); stale entries are skipped and dropped from the front. The ring, stale entries
//! included, is the snapshot's content; the index is rebuilt from it (the last entry of an
//! identity wins), so lazy reclamation proceeds identically on every replica.
//!
//! Memory per record (measured by `tenure-bench`'s `lease_memory`): the ring entry (96 bytes),
//! the identity's heap bytes (3 + the three ids' lengths, at most 451), about two 8-byte index
//! buckets plus control bytes; plus one per-tenant counter per tenant with records.
//!
//! Depends only on the command types and limits; no clock, no I/O, no randomness (the index's
//! hash seed changes the memory layout only, never a decision).

use std::hash::BuildHasher;

use compact_str::CompactString;
use hashbrown::{HashMap, HashTable};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use xxhash_rust::xxh3::xxh3_64;

use crate::command::{LeaseOp, LeaseReply};
use crate::error::{LeaseError, OverloadReason};
use crate::limits::GroupLimits;
use crate::validate::{validate_request_id, validate_resource_id, validate_tenant_id};

use super::chunked_ring::ChunkedRing;

pub(crate) type HashBuilder = foldhash::fast::FixedState;

/// The identity a record answers for: `(tenant_id, resource_id, request_id)` packed as
/// `tenant length (u8) | resource length (u16 LE) | tenant | resource | request id`. The ids are
/// validated before a record is made (at most 64, 256 and 128 bytes), so the lengths fit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DedupIdentity(Box<[u8]>);

/// Packs `(tenant, resource, request id)` into `out` (cleared first), in [`DedupIdentity`]'s layout.
/// Ids longer than the layout allows are truncated in the length fields only if validation was
/// skipped, which apply never does; the identity then still compares exactly on its bytes.
pub(crate) fn pack_identity(out: &mut Vec<u8>, tenant: &str, resource: &str, request_id: &str) {
    out.clear();
    out.push(u8::try_from(tenant.len()).unwrap_or(u8::MAX));
    out.extend_from_slice(
        &u16::try_from(resource.len())
            .unwrap_or(u16::MAX)
            .to_le_bytes(),
    );
    out.extend_from_slice(tenant.as_bytes());
    out.extend_from_slice(resource.as_bytes());
    out.extend_from_slice(request_id.as_bytes());
}

/// The tenant part of a packed identity.
fn packed_tenant(packed: &[u8]) -> &[u8] {
    let tenant_len = packed.first().copied().map_or(0, usize::from);
    packed.get(3..3 + tenant_len).unwrap_or_default()
}

/// Packs a request's identity into `out`.
///
/// Session-record operations (no key) are never deduplicated; for them the identity is the
/// tenant alone, which no keyed request's identity equals.
pub(crate) fn pack_op_identity(op: &LeaseOp, out: &mut Vec<u8>) {
    let resource_id = op.key().map_or("", |key| key.resource_id.as_str());
    pack_identity(out, op.tenant_id(), resource_id, op.request_id());
}

impl DedupIdentity {
    fn from_packed(packed: &[u8]) -> Self {
        DedupIdentity(packed.into())
    }

    fn bytes(&self) -> &[u8] {
        &self.0
    }

    /// The three ids, for the snapshot. Only well-formed identities are ever built.
    fn parts(&self) -> (&str, &str, &str) {
        let bytes = self.bytes();
        let tenant_len = bytes.first().copied().map_or(0, usize::from);
        let resource_len = match bytes.get(1..3) {
            Some(&[lo, hi]) => usize::from(u16::from_le_bytes([lo, hi])),
            _ => 0,
        };
        let text = |range: std::ops::Range<usize>| {
            bytes
                .get(range)
                .and_then(|part| std::str::from_utf8(part).ok())
                .unwrap_or_default()
        };
        let resource_start = 3 + tenant_len;
        let request_start = resource_start + resource_len;
        (
            text(3..resource_start),
            text(resource_start..request_start),
            text(request_start..bytes.len()),
        )
    }
}

/// In snapshots an identity is the tuple of its three ids (strings), validated when read.
impl Serialize for DedupIdentity {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.parts().serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for DedupIdentity {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let (tenant, resource, request_id) = <(String, String, String)>::deserialize(deserializer)?;
        let checked = validate_tenant_id(&tenant)
            .and_then(|()| validate_resource_id(&resource))
            .and_then(|()| validate_request_id(&request_id));
        if let Err(err) = checked {
            return Err(serde::de::Error::custom(format!(
                "request-id record identity: {err}"
            )));
        }
        let mut packed = Vec::with_capacity(3 + tenant.len() + resource.len() + request_id.len());
        pack_identity(&mut packed, &tenant, &resource, &request_id);
        Ok(DedupIdentity(packed.into_boxed_slice()))
    }
}

/// One remembered outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DedupRecord {
    pub(crate) identity: DedupIdentity,
    pub(crate) recorded_at_ms: u64,
    pub(crate) fingerprint: u64,
    pub(crate) outcome: Result<LeaseReply, LeaseError>,
}

fn push_part(scratch: &mut Vec<u8>, part: &[u8]) {
    scratch.extend_from_slice(&(part.len() as u64).to_le_bytes());
    scratch.extend_from_slice(part);
}

/// Digest of everything in a request besides its key and request id: reusing a request id for
/// anything else (another operation, holder, lease, ttl or new holder) changes it. (Compared
/// only after the identity matched, i.e. between requests of one tenant on one resource.)
///
/// The bytes hashed are part of the snapshot format (records store the digest): kind tag,
/// holder, then the lease id, the ttl, the new holder and the session when the operation has
/// them. An operation without a new holder hashes exactly what it did before Transfer existed,
/// one without a session what it did before sessions.
pub(crate) fn fingerprint(op: &LeaseOp, scratch: &mut Vec<u8>) -> u64 {
    let parts = op.parts();
    scratch.clear();
    scratch.push(parts.kind.fingerprint_tag());
    push_part(scratch, parts.holder_id.as_bytes());
    if let Some(lease) = parts.lease_id {
        scratch.extend_from_slice(&lease.group_id.0.to_le_bytes());
        scratch.extend_from_slice(&lease.sequence.to_le_bytes());
    }
    if let Some(ttl_ms) = parts.ttl_ms {
        scratch.extend_from_slice(&ttl_ms.to_le_bytes());
    }
    if let Some(new_holder_id) = parts.new_holder_id {
        push_part(scratch, new_holder_id.as_bytes());
    }
    if let Some(session_id) = parts.session_id {
        scratch.extend_from_slice(&session_id.0.to_le_bytes());
    }
    xxh3_64(scratch)
}

#[derive(Debug, Clone)]
pub(crate) struct DedupTable {
    /// Sequence numbers of live records, hashed by identity; equality is the stored identity's.
    index: HashTable<u64>,
    /// Records in recording order; `ring[i]` has sequence `front_sequence + i`.
    /// Copy-on-write chunks: a snapshot freezes it without copying the records.
    ring: ChunkedRing<DedupRecord>,
    front_sequence: u64,
    /// Ring entries (stale ones included) per tenant id: the fair-share rule counts these.
    per_tenant: HashMap<Box<[u8]>, u64, HashBuilder>,
    hash_builder: HashBuilder,
    /// Test hook: every identity hashes alike, so lookups rest on identity comparison alone.
    #[cfg(test)]
    force_collisions: bool,
}

/// What a lookup found.
pub(crate) enum Lookup<'a> {
    /// Never seen, or its retention ended.
    Miss,
    /// Seen with the same fingerprint: return this record's outcome.
    Replay(&'a DedupRecord),
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
            index: HashTable::new(),
            ring: ChunkedRing::new(),
            front_sequence: 0,
            per_tenant: HashMap::with_hasher(hash_builder.clone()),
            hash_builder,
            #[cfg(test)]
            force_collisions: false,
        }
    }

    /// Test hook: makes every identity collide in the index.
    #[cfg(test)]
    pub(crate) fn force_collisions(&mut self) {
        self.force_collisions = true;
    }

    /// Live records (the index's size).
    pub(crate) fn len(&self) -> usize {
        self.index.len()
    }

    fn hash_of(&self, packed: &[u8]) -> u64 {
        #[cfg(test)]
        if self.force_collisions {
            return 0;
        }
        self.hash_builder.hash_one(packed)
    }

    fn record_at(&self, sequence: u64) -> Option<&DedupRecord> {
        record_at(&self.ring, self.front_sequence, sequence)
    }

    /// Whether the ring entry with `sequence` (holding `identity`) is its identity's live one.
    fn is_live(&self, identity: &DedupIdentity, sequence: u64) -> bool {
        self.index
            .find(self.hash_of(identity.bytes()), |&s| s == sequence)
            .is_some()
    }

    fn front_is_live(&self) -> Option<bool> {
        let front = self.ring.front()?;
        Some(self.is_live(&front.identity, self.front_sequence))
    }

    fn pop_front(&mut self, live: bool) {
        let Some(front) = self.ring.front() else {
            return;
        };
        if live {
            let hash = self.hash_of(front.identity.bytes());
            let sequence = self.front_sequence;
            if let Ok(entry) = self.index.find_entry(hash, |&s| s == sequence) {
                entry.remove();
            }
        }
        let tenant = packed_tenant(front.identity.bytes());
        if let Some(count) = self.per_tenant.get_mut(tenant) {
            *count -= 1;
            if *count == 0 {
                self.per_tenant.remove(tenant);
            }
        }
        self.ring.drop_front();
        self.front_sequence += 1;
    }

    /// Looks up a request by its packed identity (see [`pack_op_identity`]).
    pub(crate) fn lookup(
        &self,
        packed: &[u8],
        fingerprint: u64,
        now_ms: u64,
        limits: &GroupLimits,
    ) -> Lookup<'_> {
        let record = self
            .index
            .find(self.hash_of(packed), |&sequence| {
                self.record_at(sequence)
                    .is_some_and(|record| record.identity.bytes() == packed)
            })
            .and_then(|&sequence| self.record_at(sequence));
        match record {
            Some(record) if !is_expired(record, now_ms, limits) => {
                if record.fingerprint == fingerprint {
                    Lookup::Replay(record)
                } else {
                    Lookup::Conflict
                }
            }
            _ => Lookup::Miss,
        }
    }

    /// The live record of a packed identity within its retention, whatever its fingerprint.
    pub(crate) fn lookup_identity(
        &self,
        packed: &[u8],
        now_ms: u64,
        limits: &GroupLimits,
    ) -> Option<&DedupRecord> {
        self.index
            .find(self.hash_of(packed), |&sequence| {
                self.record_at(sequence)
                    .is_some_and(|record| record.identity.bytes() == packed)
            })
            .and_then(|&sequence| self.record_at(sequence))
            .filter(|record| !is_expired(record, now_ms, limits))
    }

    fn tenant_entries(&self, tenant: &[u8]) -> u64 {
        self.per_tenant.get(tenant).copied().unwrap_or(0)
    }

    /// Fair share of the ring for a table that `tenant` is about to add to: the bound divided by
    /// the number of tenants holding entries, `tenant` included.
    fn fair_share(&self, tenant: &[u8], limits: &GroupLimits) -> u64 {
        let tenants =
            self.per_tenant.len() as u64 + u64::from(!self.per_tenant.contains_key(tenant));
        limits.dedup_records_max / tenants.max(1)
    }

    /// Makes room for one more record of the request whose packed identity is `packed`, or
    /// refuses with `OVERLOADED` (changing nothing then, except dropping records that were
    /// droppable anyway). O(1) per dropped record: only the ring's front is ever dropped.
    pub(crate) fn reserve_one(
        &mut self,
        packed: &[u8],
        now_ms: u64,
        limits: &GroupLimits,
    ) -> Result<(), LeaseError> {
        let tenant = packed_tenant(packed);
        while self.ring.len() as u64 >= limits.dedup_records_max {
            let (Some(live), Some(front)) = (self.front_is_live(), self.ring.front()) else {
                break;
            };
            if live {
                let age_ms = now_ms.saturating_sub(front.recorded_at_ms);
                let young =
                    !is_expired(front, now_ms, limits) && age_ms < limits.dedup_retention_ms_min;
                if young {
                    // Fair share: a tenant below its share may drop a young record of a tenant
                    // above it; anyone else waits for the oldest record to age.
                    let share = self.fair_share(tenant, limits);
                    let front_tenant = packed_tenant(front.identity.bytes());
                    let may_drop = self.tenant_entries(tenant) < share
                        && self.tenant_entries(front_tenant) > share;
                    if !may_drop {
                        return Err(LeaseError::Overloaded {
                            reason: OverloadReason::DedupTableFull,
                        });
                    }
                }
            }
            self.pop_front(live);
        }
        Ok(())
    }

    /// Stores an outcome under its packed identity. Call [`DedupTable::reserve_one`] first.
    pub(crate) fn record(
        &mut self,
        packed: &[u8],
        fingerprint: u64,
        now_ms: u64,
        outcome: Result<LeaseReply, LeaseError>,
    ) {
        let sequence = self.front_sequence + self.ring.len() as u64;
        self.count_entry(packed);
        self.ring.push_back(DedupRecord {
            identity: DedupIdentity::from_packed(packed),
            recorded_at_ms: now_ms,
            fingerprint,
            outcome,
        });
        self.set_live(sequence);
    }

    fn count_entry(&mut self, packed: &[u8]) {
        let tenant = packed_tenant(packed);
        match self.per_tenant.get_mut(tenant) {
            Some(count) => *count += 1,
            None => {
                self.per_tenant.insert(tenant.into(), 1);
            }
        }
    }

    /// Makes the ring entry `sequence` its identity's live one (replacing an older entry's).
    fn set_live(&mut self, sequence: u64) {
        let Some(record) = self.record_at(sequence) else {
            return;
        };
        let hash = self.hash_of(record.identity.bytes());
        #[cfg(test)]
        let collide = self.force_collisions;
        #[cfg(not(test))]
        let collide = false;
        let Self {
            index,
            ring,
            front_sequence,
            hash_builder,
            ..
        } = self;
        let front = *front_sequence;
        let ring = &*ring;
        let identity_of = |s: u64| record_at(ring, front, s).map(|r| r.identity.bytes());
        let packed = identity_of(sequence).unwrap_or_default();
        match index.find_mut(hash, |&s| identity_of(s) == Some(packed)) {
            Some(slot) => *slot = sequence,
            None => {
                index.insert_unique(hash, sequence, |&s| {
                    if collide {
                        0
                    } else {
                        hash_builder.hash_one(identity_of(s).unwrap_or_default())
                    }
                });
            }
        }
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

    /// The ring, stale entries included (cloning it is cheap: see [`ChunkedRing`]).
    pub(crate) fn ring(&self) -> &ChunkedRing<DedupRecord> {
        &self.ring
    }

    pub(crate) fn set_front_sequence(&mut self, front_sequence: u64) {
        self.front_sequence = front_sequence;
    }

    /// Room in the index for `records` restored entries at once (the caller bounds the count by
    /// a constant: it comes from the file), so a restore does not grow the table step by step. Only on an empty
    /// index (a restore's start): there is nothing to rehash then, so no hasher is needed.
    pub(crate) fn reserve_restored(&mut self, records: usize) {
        if self.index.is_empty() {
            self.index.reserve(records, |_| 0);
        }
    }

    /// Appends a restored ring entry; a later entry of the same identity supersedes an earlier
    /// one.
    pub(crate) fn push_restored(&mut self, record: DedupRecord) {
        let sequence = self.front_sequence + self.ring.len() as u64;
        self.count_entry(record.identity.bytes());
        self.ring.push_back(record);
        self.set_live(sequence);
    }

    /// Checks the index and the per-tenant counts against the ring (tests and restore): O(n).
    pub(crate) fn check(&self) -> Result<(), String> {
        let mut live = 0usize;
        let mut per_tenant: HashMap<&[u8], u64, HashBuilder> =
            HashMap::with_hasher(self.hash_builder.clone());
        for (record, sequence) in self.ring.iter().zip(self.front_sequence..) {
            if self.is_live(&record.identity, sequence) {
                live += 1;
            }
            *per_tenant
                .entry(packed_tenant(record.identity.bytes()))
                .or_insert(0) += 1;
        }
        if per_tenant.len() != self.per_tenant.len()
            || per_tenant
                .iter()
                .any(|(tenant, count)| self.per_tenant.get(*tenant) != Some(count))
        {
            return Err("dedup per-tenant counts disagree with the ring".to_owned());
        }
        if live != self.index.len() {
            return Err(format!(
                "dedup index has {} entries for {live} live ring entries",
                self.index.len()
            ));
        }
        for &sequence in &self.index {
            if self.record_at(sequence).is_none() {
                return Err(format!(
                    "dedup index names sequence {sequence} outside the ring"
                ));
            }
        }
        Ok(())
    }
}

fn record_at(ring: &ChunkedRing<DedupRecord>, front: u64, sequence: u64) -> Option<&DedupRecord> {
    let offset = usize::try_from(sequence.checked_sub(front)?).ok()?;
    ring.get(offset)
}

/// The error for a request id reused for a different request.
pub(crate) fn conflict_error() -> LeaseError {
    LeaseError::InvalidArgument {
        field: CompactString::const_new("request_id"),
        reason: "already used on this resource for a different operation, holder, lease or ttl"
            .to_owned(),
    }
}
