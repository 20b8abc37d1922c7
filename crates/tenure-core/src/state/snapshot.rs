//! The snapshot format: a versioned, checksummed, canonical binary encoding of a group's state.
//!
//! ```text
//! "TENURESN"                 8 bytes magic
//! format_version             u32 little-endian (currently 6)
//! frame*                     u32 little-endian length, then that many bytes of postcard
//!   Meta                     counts of everything below, limits, counters, log time
//!   TenantState   x tenants  in tenant-index order
//!   Option<Record> x slots   every slot below the high-water mark, in slot order
//!   Vec<u32>                 free list, in chunks of at most 16384
//!   Vec<(u32,u64)>           inactive queue (slot, token), in chunks, stale entries included
//!   DedupRecord   x ring     request-id ring in order, stale entries included; each names its
//!                            full identity (tenant, resource, request id) as three strings
//!                            (version 1 had only a 128-bit hash of it, so a version 1 snapshot
//!                            cannot be read: its records cannot be matched on identity)
//!   ClusterMeta              (version 4) the cluster metadata: node table, revoked
//!                            certificates, leader preferences (empty outside the metadata group)
//!   SessionsMeta             (version 5) counts of the session frames below
//!   Option<SessionRecord> x session slots, in slot order
//!   Vec<u32>                 session free list, in chunks
//!   Vec<u32>                 ended sessions kept for retention, in queue order, in chunks
//!   Vec<(u32,u32)>           bindings (session slot, lease slot) in that order, in chunks: the
//!                            lease records themselves do not name their session, so a version
//!                            4 record reads unchanged
//!   WaitsMeta                (version 6) waiter count and the next waiter sequence number
//!   (u64, Waiter) x waiters  every queued AcquireWait in sequence order (a resource's queue
//!                            order); the queues and the deadline index are rebuilt
//! checksum                   u64 little-endian XXH3-64 of every byte before it
//! ```
//!
//! The encoding is canonical: two states that would decide identically on every future entry
//! encode to identical bytes, so comparing snapshot bytes compares replicas. Writing and reading
//! stream frame by frame (the file is never held in memory; a [`FrozenState`] shares the state's
//! chunks, and the live state copies those it writes to while a frozen copy is alive). Reading validates
//! everything (bounds, uniqueness, index consistency) and then the checksum; any failure is a
//! typed [`SnapshotError`] and never a panic.

use std::collections::{BTreeMap, VecDeque};
use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize, de::DeserializeOwned};
use xxhash_rust::xxh3::Xxh3Default;

use super::chunked_ring::ChunkedRing;
use super::dedup::DedupRecord;
use super::queue::Waiter;
use super::session::{SessionRecord, SessionStatus};
use super::slab::Slab;
use super::{LeaseRecord, LeaseStateMachine, RecordStatus, StateOptions, TenantState};
use crate::cluster::ClusterMeta;
use crate::ids::GroupId;
use crate::limits::GroupLimits;
use crate::validate::{
    validate_holder_id, validate_request_id, validate_resource_id, validate_tenant_id,
};

/// The snapshot format this build writes (and the newest it reads).
///
/// - 2: request-id records carry their full identity instead of a hash of it.
/// - 3: the same layout; a request-id record's outcome may be `LeaseReply::Transferred` (an
///   appended variant a version-2 reader cannot decode), so older builds refuse it by version.
/// - 4: a last frame before the checksum carries the cluster metadata (group 0's node table);
///   versions 2 and 3 are read with an empty table.
/// - 5: the session frames follow the cluster metadata; versions 2 to 4 are read with no
///   sessions. (Request-id outcomes may now hold the appended session replies and errors.)
/// - 6: the wait-queue frames follow the session frames; versions 2 to 5 are read with no
///   waiters. (Request-id outcomes may now hold the appended WAIT_ENDED error.)
pub const SNAPSHOT_FORMAT_VERSION: u32 = 6;

/// The oldest snapshot format this build reads (2 and 3 share their layout; 4 adds a frame, 5
/// the session frames, 6 the wait-queue frames).
pub const SNAPSHOT_FORMAT_VERSION_MIN: u32 = 2;

const MAGIC: &[u8; 8] = b"TENURESN";
/// Largest frame accepted: a corrupted length cannot make the reader allocate more than this.
const FRAME_BYTES_MAX: usize = 1 << 20;
const LIST_CHUNK_ITEMS: usize = 16_384;

/// Why a snapshot could not be written or restored.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The underlying reader or writer failed.
    #[error("snapshot I/O failed: {0}")]
    Io(#[source] io::Error),
    /// The data does not start with the snapshot magic.
    #[error("not a tenure snapshot (bad magic)")]
    BadMagic,
    /// The format version is not one this build reads.
    #[error(
        "snapshot format version {found} is not supported (this build reads \
         {SNAPSHOT_FORMAT_VERSION_MIN} to {SNAPSHOT_FORMAT_VERSION})"
    )]
    UnsupportedVersion {
        /// The version found.
        found: u32,
    },
    /// The data ends early.
    #[error("snapshot is truncated")]
    Truncated,
    /// The data is well-framed but its checksum does not match.
    #[error("snapshot checksum mismatch: stored {stored:016x}, computed {computed:016x}")]
    ChecksumMismatch {
        /// Checksum in the trailer.
        stored: u64,
        /// Checksum of the bytes read.
        computed: u64,
    },
    /// The data decodes to something no state could be.
    #[error("snapshot is corrupt: {0}")]
    Corrupt(String),
}

impl From<io::Error> for SnapshotError {
    fn from(err: io::Error) -> Self {
        if err.kind() == io::ErrorKind::UnexpectedEof {
            SnapshotError::Truncated
        } else {
            SnapshotError::Io(err)
        }
    }
}

/// What writing a snapshot produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotStats {
    /// Bytes written.
    pub bytes: u64,
    /// The checksum in the trailer: equal checksums mean equal states.
    pub checksum: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct Meta {
    group_id: GroupId,
    last_log_time_ms: u64,
    next_sequence: u64,
    limits: GroupLimits,
    tenants: u32,
    slots: u32,
    free_slots: u32,
    inactive_queue: u64,
    inactive_count: u64,
    dedup_ring: u64,
    dedup_front_sequence: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct WaitsMeta {
    waiters: u64,
    next_sequence: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct SessionsMeta {
    slots: u32,
    free_slots: u32,
    ended_queue: u64,
    bindings: u64,
}

struct HashingWriter<W> {
    inner: W,
    hasher: Xxh3Default,
    bytes: u64,
    buffer: Vec<u8>,
}

impl<W: Write> HashingWriter<W> {
    fn raw(&mut self, data: &[u8]) -> Result<(), SnapshotError> {
        self.hasher.update(data);
        self.bytes += data.len() as u64;
        self.inner.write_all(data).map_err(SnapshotError::Io)
    }

    fn frame<T: Serialize>(&mut self, value: &T) -> Result<(), SnapshotError> {
        let mut buffer = std::mem::take(&mut self.buffer);
        buffer.clear();
        let buffer = postcard::to_extend(value, buffer)
            .map_err(|err| SnapshotError::Corrupt(format!("cannot encode: {err}")))?;
        if buffer.len() > FRAME_BYTES_MAX {
            return Err(SnapshotError::Corrupt(format!(
                "frame of {} bytes",
                buffer.len()
            )));
        }
        // Bounded by FRAME_BYTES_MAX above.
        let len = u32::try_from(buffer.len()).unwrap_or(u32::MAX);
        self.raw(&len.to_le_bytes())?;
        self.raw(&buffer)?;
        self.buffer = buffer;
        Ok(())
    }
}

struct HashingReader<R> {
    inner: R,
    hasher: Xxh3Default,
    buffer: Vec<u8>,
}

impl<R: Read> HashingReader<R> {
    fn raw<const N: usize>(&mut self) -> Result<[u8; N], SnapshotError> {
        let mut data = [0u8; N];
        self.inner.read_exact(&mut data)?;
        self.hasher.update(&data);
        Ok(data)
    }

    fn frame<T: DeserializeOwned>(&mut self, what: &str) -> Result<T, SnapshotError> {
        let len = u32::from_le_bytes(self.raw::<4>()?) as usize;
        if len > FRAME_BYTES_MAX {
            return Err(SnapshotError::Corrupt(format!(
                "{what}: frame length {len} over the limit"
            )));
        }
        self.buffer.resize(len, 0);
        self.inner.read_exact(&mut self.buffer)?;
        self.hasher.update(&self.buffer);
        postcard::from_bytes(&self.buffer)
            .map_err(|err| SnapshotError::Corrupt(format!("{what}: {err}")))
    }
}

/// Reads a slab's free list (`free_slots` entries in chunks), each slot below `slots`, empty
/// (`occupied` false) and listed once. `what` prefixes the messages ("", "session ").
fn read_free_list<R: Read>(
    input: &mut HashingReader<R>,
    what: &str,
    slots: u32,
    free_slots: u32,
    occupied: impl Fn(u32) -> bool,
) -> Result<Vec<u32>, SnapshotError> {
    let mut free = Vec::with_capacity(free_slots as usize);
    let mut seen_free = vec![false; slots as usize];
    while free.len() < free_slots as usize {
        let chunk: Vec<u32> = input.frame(&format!("{what}free list"))?;
        if chunk.is_empty() || free.len() + chunk.len() > free_slots as usize {
            return Err(corrupt(format!("{what}free list length")));
        }
        for slot in chunk {
            let Some(seen) = seen_free.get_mut(slot as usize) else {
                return Err(corrupt(format!("free {what}slot {slot} out of range")));
            };
            if *seen || occupied(slot) {
                return Err(corrupt(format!(
                    "free {what}slot {slot} is occupied or listed twice"
                )));
            }
            *seen = true;
            free.push(slot);
        }
    }
    Ok(free)
}

/// The most entries a restore reserves in a hash table before reading them (1,048,576: about
/// 6 MB for the key table, 10 MB for the request-id index); beyond it the tables grow as records
/// are read. A bound independent of the file: its counts and limits are not yet checksummed.
const RESTORE_RESERVE_MAX: u64 = 1 << 20;

/// The entries to reserve for `count` records announced by a snapshot.
fn restore_reservation(count: u64) -> usize {
    usize::try_from(count.min(RESTORE_RESERVE_MAX)).unwrap_or(0)
}

fn corrupt(message: impl Into<String>) -> SnapshotError {
    SnapshotError::Corrupt(message.into())
}

/// Everything a snapshot holds, frozen at one applied entry: taken between two applies in time
/// proportional to the number of chunks (the records sit in copy-on-write chunks,
/// [`super::slab`] and [`super::chunked_ring`]) and the small bounded parts it copies, then written
/// while apply goes on, so apply stops only for the freeze (issue 25: a build used to hold the
/// state for its whole write, about 0.45 s per million leases).
///
/// What the freeze copies outright: the tenants, the free lists and the ended-sessions queue
/// (plain integers), the cluster metadata and the queued waiters (at most
/// [`super::GROUP_WAITERS_MAX`]). The inactive queue, which holds every lease end of the
/// retention window, is a [`ChunkedRing`] like the request-id ring. The session bindings are not copied: they are the lease
/// records' own `session` fields, collected when written.
#[derive(Debug, Clone)]
pub struct FrozenState {
    group_id: GroupId,
    last_log_time_ms: u64,
    next_sequence: u64,
    limits: GroupLimits,
    tenants: Vec<TenantState>,
    slab: Slab<LeaseRecord>,
    inactive: ChunkedRing<(u32, u64)>,
    inactive_count: u64,
    dedup_ring: ChunkedRing<DedupRecord>,
    dedup_front_sequence: u64,
    cluster: ClusterMeta,
    session_records: Slab<SessionRecord>,
    session_ended: VecDeque<u32>,
    waiters: BTreeMap<u64, Waiter>,
    waits_next_sequence: u64,
}

impl LeaseStateMachine {
    /// Freezes the state for a snapshot (see [`FrozenState`]): cheap, and the state goes on
    /// changing without touching the frozen copy.
    pub fn freeze(&self) -> FrozenState {
        FrozenState {
            group_id: self.group_id,
            last_log_time_ms: self.last_log_time_ms,
            next_sequence: self.next_sequence,
            limits: self.limits.clone(),
            tenants: self.tenants.clone(),
            slab: self.slab.clone(),
            inactive: self.inactive.clone(),
            inactive_count: self.inactive_count,
            dedup_ring: self.dedup.ring().clone(),
            dedup_front_sequence: self.dedup.front_sequence(),
            cluster: self.cluster.clone(),
            session_records: self.sessions.records.clone(),
            session_ended: self.sessions.ended.clone(),
            waiters: self.waits.waiters.clone(),
            waits_next_sequence: self.waits.next_sequence,
        }
    }

    /// Writes the whole state as a snapshot, streaming (a freeze, then its write).
    pub fn write_snapshot<W: Write>(&self, writer: W) -> Result<SnapshotStats, SnapshotError> {
        self.freeze().write_snapshot(writer)
    }
}

impl FrozenState {
    /// The group the state belongs to.
    pub fn group_id(&self) -> GroupId {
        self.group_id
    }

    /// Writes the frozen state as a snapshot, streaming.
    pub fn write_snapshot<W: Write>(&self, writer: W) -> Result<SnapshotStats, SnapshotError> {
        let mut out = HashingWriter {
            inner: writer,
            hasher: Xxh3Default::new(),
            bytes: 0,
            buffer: Vec::new(),
        };
        out.raw(MAGIC)?;
        out.raw(&SNAPSHOT_FORMAT_VERSION.to_le_bytes())?;
        let count = |n: usize, what: &str| {
            u32::try_from(n).map_err(|_| corrupt(format!("{what}: {n} is too many")))
        };
        out.frame(&Meta {
            group_id: self.group_id,
            last_log_time_ms: self.last_log_time_ms,
            next_sequence: self.next_sequence,
            limits: self.limits.clone(),
            tenants: count(self.tenants.len(), "tenants")?,
            slots: self.slab.high_water(),
            free_slots: count(self.slab.free_list().len(), "free slots")?,
            inactive_queue: self.inactive.len() as u64,
            inactive_count: self.inactive_count,
            dedup_ring: self.dedup_ring.len() as u64,
            dedup_front_sequence: self.dedup_front_sequence,
        })?;
        for tenant in &self.tenants {
            out.frame(tenant)?;
        }
        for (_, record) in self.slab.iter_slots() {
            out.frame(&record)?;
        }
        for chunk in self.slab.free_list().chunks(LIST_CHUNK_ITEMS) {
            out.frame(&chunk)?;
        }
        write_chunked(&mut out, self.inactive.iter().copied())?;
        for record in self.dedup_ring.iter() {
            out.frame(record)?;
        }
        out.frame(&self.cluster)?;
        self.write_sessions(&mut out)?;
        out.frame(&WaitsMeta {
            waiters: self.waiters.len() as u64,
            next_sequence: self.waits_next_sequence,
        })?;
        for (sequence, waiter) in &self.waiters {
            out.frame(&(sequence, waiter))?;
        }
        let checksum = out.hasher.digest();
        out.inner
            .write_all(&checksum.to_le_bytes())
            .map_err(SnapshotError::Io)?;
        out.inner.flush().map_err(SnapshotError::Io)?;
        Ok(SnapshotStats {
            bytes: out.bytes + 8,
            checksum,
        })
    }

    fn write_sessions<W: Write>(&self, out: &mut HashingWriter<W>) -> Result<(), SnapshotError> {
        let records = &self.session_records;
        let free_slots = u32::try_from(records.free_list().len())
            .map_err(|_| corrupt("too many free session slots"))?;
        // The bindings `(session slot, lease slot)` in that order: the lease records' own
        // `session` fields (the live state's `by_session` index is derived from the same fields,
        // and its invariants check both agree).
        let mut bindings: Vec<(u32, u32)> = self
            .slab
            .iter_slots()
            .filter_map(|(slot, record)| Some((record?.session?, slot)))
            .collect();
        bindings.sort_unstable();
        out.frame(&SessionsMeta {
            slots: records.high_water(),
            free_slots,
            ended_queue: self.session_ended.len() as u64,
            bindings: bindings.len() as u64,
        })?;
        for (_, record) in records.iter_slots() {
            out.frame(&record)?;
        }
        for chunk in records.free_list().chunks(LIST_CHUNK_ITEMS) {
            out.frame(&chunk)?;
        }
        write_chunked(out, self.session_ended.iter().copied())?;
        write_chunked(out, bindings.into_iter())?;
        Ok(())
    }
}

/// Writes `items` as frames of at most [`LIST_CHUNK_ITEMS`] each (none when empty).
fn write_chunked<W: Write, T: Serialize>(
    out: &mut HashingWriter<W>,
    items: impl Iterator<Item = T>,
) -> Result<(), SnapshotError> {
    let mut chunk: Vec<T> = Vec::new();
    for item in items {
        chunk.push(item);
        if chunk.len() == LIST_CHUNK_ITEMS {
            out.frame(&chunk)?;
            chunk.clear();
        }
    }
    if !chunk.is_empty() {
        out.frame(&chunk)?;
    }
    Ok(())
}

impl LeaseStateMachine {
    /// The snapshot as bytes (convenience for tests and small states).
    pub fn snapshot_to_vec(&self) -> Vec<u8> {
        let mut bytes = Vec::new();
        // Writing to a Vec cannot fail, and every count fits (the state enforces it).
        match self.write_snapshot(&mut bytes) {
            Ok(_) => bytes,
            Err(err) => panic!("writing a snapshot to memory failed: {err}"),
        }
    }

    /// Restores a state from a snapshot, streaming. Validates everything; never panics.
    pub fn read_snapshot<R: Read>(reader: R, options: StateOptions) -> Result<Self, SnapshotError> {
        let mut input = HashingReader {
            inner: reader,
            hasher: Xxh3Default::new(),
            buffer: Vec::new(),
        };
        if &input.raw::<8>().map_err(|_| SnapshotError::BadMagic)? != MAGIC {
            return Err(SnapshotError::BadMagic);
        }
        let version = u32::from_le_bytes(input.raw::<4>()?);
        if !(SNAPSHOT_FORMAT_VERSION_MIN..=SNAPSHOT_FORMAT_VERSION).contains(&version) {
            return Err(SnapshotError::UnsupportedVersion { found: version });
        }
        let meta: Meta = input.frame("meta")?;
        meta.limits
            .validate()
            .map_err(|err| corrupt(format!("limits: {err}")))?;
        if meta.free_slots > meta.slots {
            return Err(corrupt("more free slots than slots"));
        }
        let mut state = LeaseStateMachine::new(meta.group_id, options);
        state.limits = meta.limits;
        state.last_log_time_ms = meta.last_log_time_ms;
        state.next_sequence = meta.next_sequence;

        for index in 0..meta.tenants {
            let tenant: TenantState = input.frame("tenant")?;
            validate_tenant_id(&tenant.name)
                .map_err(|err| corrupt(format!("tenant {index}: {err}")))?;
            tenant
                .policy
                .validate()
                .map_err(|err| corrupt(format!("tenant {index}: {err}")))?;
            if state
                .tenant_index
                .insert(tenant.name.clone(), index)
                .is_some()
            {
                return Err(corrupt(format!("tenant {} appears twice", tenant.name)));
            }
            state.tenants.push(tenant);
        }

        // Restore speed (a node restarts with every group's snapshot to read): the key table is
        // sized once from the snapshot's own count, and the two ordered indexes are built in
        // bulk from sorted entries instead of one B-tree insert a record. The count (like the
        // limits beside it) comes from the file, before its checksum is known: the reservation
        // is capped by a constant, so a hostile count costs at most that much up front; past it
        // the table grows with the records actually read.
        let occupied_slots = u64::from(meta.slots - meta.free_slots);
        state
            .by_key
            .reserve(restore_reservation(occupied_slots), |_| 0);
        let mut tenant_entries: Vec<(u32, u64, u32)> = Vec::new();
        let mut expiry_entries: Vec<(u64, u32)> = Vec::new();
        let mut empty_slots = 0u32;
        for slot in 0..meta.slots {
            let record: Option<LeaseRecord> = input.frame("slot")?;
            if let Some(record) = &record {
                state.check_restored_record(slot, record)?;
            } else {
                empty_slots += 1;
            }
            let restored = state.slab.push_restored(record);
            if restored != Some(slot) {
                return Err(corrupt("slot numbering"));
            }
            if let Some(record) = state.slab.get(slot) {
                let (tenant, token, expires_at_ms, indexed_expiry_ms, status) = (
                    record.tenant,
                    record.fencing_token,
                    record.expires_at_ms,
                    record.indexed_expiry_ms,
                    record.status,
                );
                if !state.index_new_key(slot) {
                    return Err(corrupt(format!("slot {slot}: resource appears twice")));
                }
                tenant_entries.push((tenant, token, slot));
                if status == RecordStatus::Active {
                    if indexed_expiry_ms > expires_at_ms {
                        return Err(corrupt(format!("slot {slot}: indexed after its expiry")));
                    }
                    expiry_entries.push((indexed_expiry_ms, slot));
                }
            }
        }
        if empty_slots != meta.free_slots {
            return Err(corrupt(format!(
                "{empty_slots} empty slots but a free list of {}",
                meta.free_slots
            )));
        }
        // Entries are unique by construction (each names its own slot); checked all the same.
        tenant_entries.sort_unstable();
        if tenant_entries.windows(2).any(|pair| pair[0] == pair[1]) {
            return Err(corrupt("duplicate tenant index entry"));
        }
        expiry_entries.sort_unstable();
        state.by_tenant = tenant_entries.into_iter().collect();
        state.by_expiry = expiry_entries.into_iter().collect();

        let free = read_free_list(&mut input, "", meta.slots, meta.free_slots, |slot| {
            state.slab.get(slot).is_some()
        })?;
        state.slab.set_free_list(free);

        let mut inactive_read = 0u64;
        while inactive_read < meta.inactive_queue {
            let chunk: Vec<(u32, u64)> = input.frame("inactive queue")?;
            if chunk.is_empty() || inactive_read + chunk.len() as u64 > meta.inactive_queue {
                return Err(corrupt("inactive queue length"));
            }
            inactive_read += chunk.len() as u64;
            for (slot, token) in chunk {
                if slot >= meta.slots {
                    return Err(corrupt(format!(
                        "inactive queue names slot {slot} out of range"
                    )));
                }
                state.inactive.push_back((slot, token));
            }
        }
        state.inactive_count = meta.inactive_count;

        state.dedup.set_front_sequence(meta.dedup_front_sequence);
        state
            .dedup
            .reserve_restored(restore_reservation(meta.dedup_ring));
        for _ in 0..meta.dedup_ring {
            let record: DedupRecord = input.frame("dedup record")?;
            state.dedup.push_restored(record);
        }
        if version >= 4 {
            let cluster: ClusterMeta = input.frame("cluster metadata")?;
            cluster
                .check()
                .map_err(|err| corrupt(format!("cluster metadata: {err}")))?;
            if meta.group_id != crate::cluster::METADATA_GROUP && cluster != ClusterMeta::default()
            {
                return Err(corrupt(format!(
                    "cluster metadata in group {}, not the metadata group",
                    meta.group_id
                )));
            }
            state.cluster = cluster;
        }
        if version >= 5 {
            state.read_sessions(&mut input)?;
        }
        if version >= 6 {
            state.read_waits(&mut input)?;
        }

        let computed = input.hasher.digest();
        let mut stored = [0u8; 8];
        input.inner.read_exact(&mut stored)?;
        let stored = u64::from_le_bytes(stored);
        if stored != computed {
            return Err(SnapshotError::ChecksumMismatch { stored, computed });
        }
        let mut extra = [0u8; 1];
        if input.inner.read(&mut extra)? != 0 {
            return Err(corrupt("data after the checksum"));
        }
        state
            .check_invariants_with(super::KeyIndexCheck::BuiltFromRecords)
            .map_err(corrupt)?;
        Ok(state)
    }

    /// Reads the session frames into a state whose lease records are restored. Everything
    /// derived (indexes, per-tenant counts) is rebuilt; `check_invariants` then cross-checks.
    fn read_sessions<R: Read>(
        &mut self,
        input: &mut HashingReader<R>,
    ) -> Result<(), SnapshotError> {
        let meta: SessionsMeta = input.frame("sessions meta")?;
        if meta.free_slots > meta.slots {
            return Err(corrupt("more free session slots than session slots"));
        }
        let mut empty_slots = 0u32;
        for slot in 0..meta.slots {
            let record: Option<SessionRecord> = input.frame("session")?;
            if record.is_none() {
                empty_slots += 1;
            }
            if let Some(record) = &record {
                let bad = |what: String| corrupt(format!("session slot {slot}: {what}"));
                if record.tenant as usize >= self.tenants.len() {
                    return Err(bad(format!("unknown tenant {}", record.tenant)));
                }
                validate_holder_id(&record.owner_id).map_err(|err| bad(err.to_string()))?;
                if self
                    .find_session(record.tenant, record.session_id)
                    .is_some()
                {
                    return Err(bad("session appears twice".into()));
                }
            }
            if self.sessions.records.push_restored(record) != Some(slot) {
                return Err(corrupt("session slot numbering"));
            }
            let Some(record) = self.sessions.records.get(slot) else {
                continue;
            };
            let (tenant, status, indexed, expires, bound) = (
                record.tenant,
                record.status,
                record.indexed_expiry_ms,
                record.expires_at_ms,
                record.bound_leases,
            );
            self.index_session(slot);
            match status {
                SessionStatus::Active => {
                    if indexed > expires {
                        return Err(corrupt(format!(
                            "session slot {slot}: indexed after its expiry"
                        )));
                    }
                    self.sessions.by_expiry.insert((indexed, slot));
                    let counts = &mut self.sessions.active_per_tenant;
                    if counts.len() <= tenant as usize {
                        counts.resize(tenant as usize + 1, 0);
                    }
                    counts[tenant as usize] += 1;
                }
                SessionStatus::Expired | SessionStatus::Closed if bound > 0 => {
                    self.sessions.ending.insert((expires, slot));
                }
                SessionStatus::Expired | SessionStatus::Closed => {}
            }
        }
        if empty_slots != meta.free_slots {
            return Err(corrupt(format!(
                "{empty_slots} empty session slots but a free list of {}",
                meta.free_slots
            )));
        }
        let free = read_free_list(input, "session ", meta.slots, meta.free_slots, |slot| {
            self.sessions.records.get(slot).is_some()
        })?;
        self.sessions.records.set_free_list(free);
        let mut ended_read = 0u64;
        while ended_read < meta.ended_queue {
            let chunk: Vec<u32> = input.frame("ended sessions")?;
            if chunk.is_empty() || ended_read + chunk.len() as u64 > meta.ended_queue {
                return Err(corrupt("ended session queue length"));
            }
            ended_read += chunk.len() as u64;
            for slot in chunk {
                match self.sessions.records.get(slot) {
                    Some(record)
                        if record.status != SessionStatus::Active && record.bound_leases == 0 => {}
                    _ => {
                        return Err(corrupt(format!(
                            "ended session queue names slot {slot}, not an ended session"
                        )));
                    }
                }
                self.sessions.ended.push_back(slot);
            }
        }
        let mut bindings_read = 0u64;
        while bindings_read < meta.bindings {
            let chunk: Vec<(u32, u32)> = input.frame("session bindings")?;
            if chunk.is_empty() || bindings_read + chunk.len() as u64 > meta.bindings {
                return Err(corrupt("session bindings length"));
            }
            bindings_read += chunk.len() as u64;
            for (session_slot, lease_slot) in chunk {
                if self.sessions.records.get(session_slot).is_none() {
                    return Err(corrupt(format!(
                        "binding names empty session slot {session_slot}"
                    )));
                }
                let Some(lease) = self.slab.get_mut(lease_slot) else {
                    return Err(corrupt(format!(
                        "binding names empty lease slot {lease_slot}"
                    )));
                };
                if lease.status != RecordStatus::Active || lease.session.is_some() {
                    return Err(corrupt(format!(
                        "binding names lease slot {lease_slot}, not an unbound active lease"
                    )));
                }
                lease.session = Some(session_slot);
                let indexed = lease.indexed_expiry_ms;
                self.by_expiry.remove(&(indexed, lease_slot));
                self.sessions.by_session.insert((session_slot, lease_slot));
            }
        }
        Ok(())
    }

    /// Reads the wait-queue frames into a state whose lease and session records are restored.
    fn read_waits<R: Read>(&mut self, input: &mut HashingReader<R>) -> Result<(), SnapshotError> {
        let meta: WaitsMeta = input.frame("waits meta")?;
        if meta.waiters > super::GROUP_WAITERS_MAX {
            return Err(corrupt(format!("{} waiters", meta.waiters)));
        }
        self.waits.next_sequence = meta.next_sequence;
        let mut last_sequence = 0u64;
        for _ in 0..meta.waiters {
            let (sequence, waiter): (u64, Waiter) = input.frame("waiter")?;
            let bad = |what: String| corrupt(format!("waiter {sequence}: {what}"));
            if sequence <= last_sequence || sequence >= meta.next_sequence {
                return Err(bad("sequence out of order or range".into()));
            }
            last_sequence = sequence;
            if waiter.tenant as usize >= self.tenants.len() {
                return Err(bad(format!("unknown tenant {}", waiter.tenant)));
            }
            validate_resource_id(&waiter.resource_id).map_err(|err| bad(err.to_string()))?;
            validate_holder_id(&waiter.holder_id).map_err(|err| bad(err.to_string()))?;
            validate_request_id(&waiter.request_id).map_err(|err| bad(err.to_string()))?;
            self.waits.insert(sequence, waiter);
        }
        Ok(())
    }

    fn check_restored_record(&self, slot: u32, record: &LeaseRecord) -> Result<(), SnapshotError> {
        let bad = |what: String| corrupt(format!("slot {slot}: {what}"));
        if record.tenant as usize >= self.tenants.len() {
            return Err(bad(format!("unknown tenant {}", record.tenant)));
        }
        validate_resource_id(&record.resource_id).map_err(|err| bad(err.to_string()))?;
        validate_holder_id(&record.holder_id).map_err(|err| bad(err.to_string()))?;
        if record.origin_group == self.group_id.0 && record.fencing_token >= self.next_sequence {
            return Err(bad(format!(
                "token {} not below the next sequence",
                record.fencing_token
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]

    use super::*;

    /// A snapshot's header announcing absurd counts, with limits that allow them (both come from
    /// the file, before its checksum is known): the restore reserves at most a bounded amount up
    /// front and ends with a typed error when the records are not there, instead of reserving
    /// for the announced counts (a hash table capacity overflow panics; 2^40 entries abort on
    /// the failed allocation).
    #[test]
    fn a_header_announcing_absurd_counts_is_refused_without_reserving_for_them() {
        for (slots, dedup_ring) in [(0u32, 1u64 << 61), (0, 1 << 40), (u32::MAX, 0)] {
            let limits = GroupLimits {
                lease_records_max: u64::from(u32::MAX),
                dedup_records_max: u64::MAX / 2,
                ..GroupLimits::default()
            };
            let mut out = HashingWriter {
                inner: Vec::new(),
                hasher: Xxh3Default::new(),
                bytes: 0,
                buffer: Vec::new(),
            };
            out.raw(MAGIC).unwrap();
            out.raw(&SNAPSHOT_FORMAT_VERSION.to_le_bytes()).unwrap();
            out.frame(&Meta {
                group_id: GroupId(1),
                last_log_time_ms: 0,
                next_sequence: 1,
                limits,
                tenants: 0,
                slots,
                free_slots: 0,
                inactive_queue: 0,
                inactive_count: 0,
                dedup_ring,
                dedup_front_sequence: 0,
            })
            .unwrap();
            let bytes = out.inner;
            let restored = LeaseStateMachine::read_snapshot(&bytes[..], StateOptions::default());
            assert!(
                restored.is_err(),
                "slots {slots}, dedup ring {dedup_ring}: restored from a header alone"
            );
        }
    }
}
