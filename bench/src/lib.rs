//! # tenure-bench: in-process micro-benchmarks of tenure's components
//!
//! Everything here runs inside one process, never over a network. By default the crate depends on
//! nothing but the pure lease state machine ([`tenure_core::LeaseStateMachine`]): no disk, no Raft,
//! no async runtime; it measures the cost of `apply` itself and the memory the replicated state
//! needs per lease, which bound what a single Raft group can do whatever the transport. The
//! feature `storage` adds `tenure-storage` (RocksDB, openraft, tokio) for the `storage_append`
//! binary only; quinn never.
//!
//! - `benches/state_machine.rs`: criterion benchmarks of `apply` for Acquire, Renew, Release and
//!   Expire with one million resident active leases (`cargo bench -p tenure-bench`).
//! - `src/bin/storage_append.rs` (feature `storage`): durable appends from 64 groups through one
//!   shared WAL sync, the time to reopen a store holding 1M leases, and reads of a group's newest
//!   log entry beside purged logs (`cargo run --release -p tenure-bench --features storage --bin storage_append`).
//! - `src/bin/lease_memory.rs`: heap bytes per active lease, with and without the request-id
//!   (idempotency) records, and a renews-per-second sanity figure
//!   (`cargo run --release -p tenure-bench --bin lease_memory`).
//!
//! This library holds what both share: [`Harness`] (a state machine plus a log clock and a
//! request-id source, so every operation has a unique request id and log time advances
//! realistically), [`bench_limits`], naming helpers, population helpers that verify every outcome,
//! and small deterministic pseudo-random index generators ([`XorShift64`], [`Walk`]).
//!
//! Commands are always built before they are applied, so a benchmark can build them outside its
//! timed section and time `apply` alone.

use anyhow::{Context, Result, bail, ensure};
use tenure_core::{
    AcquireRequest, ApplyOutput, Command, CommandResult, Entry, GroupId, GroupLimits, LeaseId,
    LeaseOp, LeaseOutcome, LeaseReply, LeaseStateMachine, ReleaseRequest, RenewRequest,
    ResourceKey, StateOptions,
};

/// The group every benchmark state belongs to.
pub const GROUP: GroupId = GroupId(1);
/// The single tenant that holds every benchmark lease.
pub const TENANT: &str = "tenant-a";
/// Resident active leases in the full benchmarks and in `lease_memory`.
pub const RESIDENT_LEASES: usize = 1_000_000;
/// Resident active leases when a benchmark runs as a quick smoke test (`cargo test`).
pub const RESIDENT_LEASES_SMOKE: usize = 10_000;
/// Ttl of the resident leases: the default group maximum (1 hour) so they stay active for the
/// whole run.
pub const LONG_TTL_MS: u64 = 3_600_000;
/// Ttl of leases meant to expire during a run: the default group minimum.
pub const SHORT_TTL_MS: u64 = 1_500;
/// Items per `Command::Batch` when populating (the default `batch_items_max`).
pub const POPULATE_BATCH_ITEMS: usize = 4_096;
/// Log time advances by 1 ms every this many lease operations (about 1 M ops/s of log time).
pub const OPS_PER_LOG_MS: u64 = 1_000;
/// Distinct holder ids; lease `i` is held by `holder-{i % HOLDERS}`.
pub const HOLDERS: u64 = 100_000;
/// Log time of the first entry applied to a fresh [`Harness`].
pub const START_LOG_TIME_MS: u64 = 1_000;

/// Resource id of resident lease `index`, e.g. `resource-0000042`.
pub fn resource_id(index: u64) -> String {
    format!("resource-{index:07}")
}

/// Resource id of the short-lived lease `index` the Expire benchmark reclaims.
pub fn expiring_resource_id(index: u64) -> String {
    format!("expiring-{index:07}")
}

/// Holder id of lease `index`, e.g. `holder-00042`.
pub fn holder_id(index: u64) -> String {
    format!("holder-{:05}", index % HOLDERS)
}

/// Group limits for benchmarking `resident` leases in one tenant.
///
/// - `tenant_active_leases_max_default` and `lease_records_max` are raised well above `resident`
///   (the defaults would turn the 19,533rd Acquire into `QUOTA_EXCEEDED`);
///   `inactive_records_max` is pinned at 1 M (the old default), which bounds the released
///   and expired records the benchmarks leave behind (the oldest is evicted beyond it).
/// - `dedup_retention_ms_min` is 0. The request-id table is bounded by `dedup_records_max`
///   (pinned at 1 M, the old default); once it is full, every new request must drop the oldest record. With the
///   default 10 s minimum retention a table filled in under 10 s of log time refuses new requests
///   with `OVERLOADED` instead, so a benchmark would measure the refusal path. With 0 it evicts the
///   oldest record at its bound: the per-operation cost measured includes that eviction, which is
///   the steady-state cost of a full table. Real deployments keep the 10 s minimum (a retry within
///   10 s is always deduplicated); the eviction cost is the same once records are older than that.
pub fn bench_limits(resident: usize) -> GroupLimits {
    let defaults = GroupLimits::default();
    let room = (resident as u64).saturating_mul(16).max(16_000_000);
    GroupLimits {
        tenant_active_leases_max_default: room,
        lease_records_max: room.min(u64::from(u32::MAX)),
        // The README's figures were taken with 1 M request-id and inactive records per group
        // (the old defaults); the defaults are now sized to a node memory budget (124 k), so the
        // benchmarks pin the old values to keep measuring the same tables.
        dedup_records_max: 1_000_000,
        inactive_records_max: 1_000_000,
        dedup_retention_ms_min: 0,
        ..defaults
    }
}

/// A lease state machine plus the log clock and request-id counter that feed it.
///
/// Log time starts at [`START_LOG_TIME_MS`] and advances by 1 ms per [`OPS_PER_LOG_MS`] lease
/// operations stamped ([`Harness::stamp`]), plus whatever [`Harness::advance_ms`] adds. Entries
/// are stamped when they are built, so build them in the order they will be applied.
#[derive(Debug)]
pub struct Harness {
    state: LeaseStateMachine,
    log_time_ms: u64,
    ops_this_ms: u64,
    next_request: u64,
}

impl Harness {
    /// A fresh state of group [`GROUP`] with `limits` applied through the log.
    pub fn new(limits: GroupLimits) -> Result<Self> {
        let mut harness = Harness {
            state: LeaseStateMachine::new(
                GROUP,
                StateOptions {
                    hash_seed: 0x7e4e_5eed,
                    ..StateOptions::default()
                },
            ),
            log_time_ms: START_LOG_TIME_MS,
            ops_this_ms: 0,
            next_request: 0,
        };
        let entry = harness.entry(Command::SetGroupLimits(limits), 0);
        match harness.state.apply(&entry).result {
            CommandResult::Config(Ok(())) => Ok(harness),
            other => bail!("SetGroupLimits was refused: {other:?}"),
        }
    }

    /// The state machine.
    pub fn state(&self) -> &LeaseStateMachine {
        &self.state
    }

    /// Consumes the harness, keeping the state.
    pub fn into_state(self) -> LeaseStateMachine {
        self.state
    }

    /// Applies one entry (the only thing a benchmark should time).
    #[inline]
    pub fn apply(&mut self, entry: &Entry) -> ApplyOutput {
        self.state.apply(entry)
    }

    /// The log time the next entry will be stamped with.
    pub fn log_time_ms(&self) -> u64 {
        self.log_time_ms
    }

    /// Returns the log time for an entry carrying `ops` operations, then advances the clock by
    /// those operations (1 ms per [`OPS_PER_LOG_MS`]).
    pub fn stamp(&mut self, ops: u64) -> u64 {
        let now_ms = self.log_time_ms;
        self.ops_this_ms += ops;
        self.log_time_ms += self.ops_this_ms / OPS_PER_LOG_MS;
        self.ops_this_ms %= OPS_PER_LOG_MS;
        now_ms
    }

    /// Moves log time forward by `ms` (time passing with no operations).
    pub fn advance_ms(&mut self, ms: u64) {
        self.log_time_ms += ms;
    }

    /// A request id never used before by this harness.
    pub fn request_id(&mut self) -> String {
        let id = self.next_request;
        self.next_request += 1;
        format!("req-{id:010}")
    }

    /// An entry carrying `command` worth `ops` operations, stamped now.
    pub fn entry(&mut self, command: Command, ops: u64) -> Entry {
        Entry {
            log_time_ms: self.stamp(ops),
            command,
        }
    }

    /// A single-operation entry (`Command::Lease`), stamped now.
    pub fn single(&mut self, op: LeaseOp) -> Entry {
        self.entry(Command::Lease(op), 1)
    }

    /// A `Command::Batch` entry, stamped now.
    pub fn batch(&mut self, ops: Vec<LeaseOp>) -> Entry {
        let count = ops.len() as u64;
        self.entry(Command::Batch(ops), count)
    }

    /// An Acquire with a fresh request id.
    pub fn acquire_op(&mut self, resource_id: String, holder_id: String, ttl_ms: u64) -> LeaseOp {
        LeaseOp::Acquire(AcquireRequest {
            key: ResourceKey::new(TENANT, resource_id),
            holder_id,
            ttl_ms,
            request_id: self.request_id(),
        })
    }

    /// A Renew with a fresh request id.
    pub fn renew_op(
        &mut self,
        resource_id: String,
        lease_id: LeaseId,
        holder_id: String,
        ttl_ms: u64,
    ) -> LeaseOp {
        LeaseOp::Renew(RenewRequest {
            key: ResourceKey::new(TENANT, resource_id),
            lease_id,
            holder_id,
            ttl_ms,
            request_id: self.request_id(),
        })
    }

    /// A Release with a fresh request id.
    pub fn release_op(
        &mut self,
        resource_id: String,
        lease_id: LeaseId,
        holder_id: String,
    ) -> LeaseOp {
        LeaseOp::Release(ReleaseRequest {
            key: ResourceKey::new(TENANT, resource_id),
            lease_id,
            holder_id,
            request_id: self.request_id(),
        })
    }

    /// Applies `ops` in `Command::Batch` entries of up to [`POPULATE_BATCH_ITEMS`], building each
    /// batch just before applying it, and checks every item succeeded freshly. `on_reply` gets
    /// each item's position in `ops` and its reply.
    pub fn apply_batched(
        &mut self,
        ops: impl IntoIterator<Item = LeaseOp>,
        mut on_reply: impl FnMut(usize, &LeaseReply),
    ) -> Result<()> {
        let mut ops = ops.into_iter().peekable();
        let mut position = 0usize;
        while ops.peek().is_some() {
            let chunk: Vec<LeaseOp> = ops.by_ref().take(POPULATE_BATCH_ITEMS).collect();
            let entry = self.batch(chunk);
            let output = self.state.apply(&entry);
            let outcomes = batch_outcomes(&output)?;
            for outcome in outcomes {
                let reply = fresh_ok(outcome)
                    .with_context(|| format!("batched operation {position} failed"))?;
                on_reply(position, reply);
                position += 1;
            }
        }
        Ok(())
    }

    /// Acquires resident lease `index` for every index in `indices` (resource
    /// [`resource_id`]`(index)`, holder [`holder_id`]`(index)`, `ttl_ms`), in batches, and calls
    /// `on_grant(index, lease_id)` for each grant. Fails on any refusal.
    pub fn acquire_indices(
        &mut self,
        indices: &[u64],
        ttl_ms: u64,
        name: fn(u64) -> String,
        mut on_grant: impl FnMut(u64, LeaseId),
    ) -> Result<()> {
        let mut ops = Vec::with_capacity(POPULATE_BATCH_ITEMS);
        for chunk in indices.chunks(POPULATE_BATCH_ITEMS) {
            ops.clear();
            for &index in chunk {
                let op = self.acquire_op(name(index), holder_id(index), ttl_ms);
                ops.push(op);
            }
            let mut failure = None;
            self.apply_batched(ops.drain(..), |position, reply| match reply {
                LeaseReply::Acquired(grant) => on_grant(chunk[position], grant.lease_id),
                other => {
                    failure.get_or_insert_with(|| format!("index {}: {other:?}", chunk[position]));
                }
            })?;
            if let Some(failure) = failure {
                bail!("Acquire did not answer Acquired: {failure}");
            }
        }
        Ok(())
    }
}

/// A state with `count` resident active leases (indices `0..count`, ttl [`LONG_TTL_MS`]) and the
/// lease id of each, by index.
#[derive(Debug)]
pub struct Resident {
    /// The state and its clock.
    pub harness: Harness,
    /// `lease_ids[i]` is the current lease on [`resource_id`]`(i)`, held by [`holder_id`]`(i)`.
    pub lease_ids: Vec<LeaseId>,
}

impl Resident {
    /// Builds the state with `limits`, acquiring in batches of [`POPULATE_BATCH_ITEMS`], and checks
    /// that every lease is active.
    pub fn build(count: usize, limits: GroupLimits) -> Result<Self> {
        let mut harness = Harness::new(limits)?;
        let placeholder = LeaseId {
            group_id: GROUP,
            sequence: 0,
        };
        let mut lease_ids = vec![placeholder; count];
        let indices: Vec<u64> = (0..count as u64).collect();
        harness.acquire_indices(&indices, LONG_TTL_MS, resource_id, |index, lease_id| {
            if let Some(slot) = usize::try_from(index)
                .ok()
                .and_then(|i| lease_ids.get_mut(i))
            {
                *slot = lease_id;
            }
        })?;
        let stats = harness.state().stats();
        ensure!(
            stats.active_leases == count as u64,
            "expected {count} active leases after population, found {}",
            stats.active_leases
        );
        Ok(Resident { harness, lease_ids })
    }

    /// Number of resident leases.
    pub fn len(&self) -> usize {
        self.lease_ids.len()
    }

    /// True when there are no resident leases.
    pub fn is_empty(&self) -> bool {
        self.lease_ids.is_empty()
    }

    /// A Renew of resident lease `index` (ttl [`LONG_TTL_MS`]) with a fresh request id.
    pub fn renew_op(&mut self, index: usize) -> LeaseOp {
        let lease_id = self.lease_ids[index];
        let index = index as u64;
        self.harness
            .renew_op(resource_id(index), lease_id, holder_id(index), LONG_TTL_MS)
    }

    /// A Release of resident lease `index` with a fresh request id.
    pub fn release_op(&mut self, index: usize) -> LeaseOp {
        let lease_id = self.lease_ids[index];
        let index = index as u64;
        self.harness
            .release_op(resource_id(index), lease_id, holder_id(index))
    }

    /// Renews `count` resident leases picked by `rng`, one per entry, and returns the time spent
    /// in `apply` alone (entries are built before the clock starts). Fails unless every renewal
    /// succeeded, so a benchmark can never time an error path.
    pub fn timed_random_renews(
        &mut self,
        rng: &mut XorShift64,
        count: usize,
    ) -> Result<std::time::Duration> {
        let entries: Vec<Entry> = (0..count)
            .map(|_| {
                let op = self.renew_op(rng.below(self.len()));
                self.harness.single(op)
            })
            .collect();
        let mut renewed = 0usize;
        let start = std::time::Instant::now();
        for entry in &entries {
            let output = self.harness.apply(entry);
            renewed += usize::from(matches!(
                single_reply(&output),
                Some(LeaseReply::Renewed(_))
            ));
            std::hint::black_box(output);
        }
        let elapsed = start.elapsed();
        ensure!(
            renewed == count,
            "{} of {count} renews failed",
            count - renewed
        );
        Ok(elapsed)
    }

    /// Re-acquires resident leases `indices` (after they were released) and records their new
    /// lease ids.
    pub fn reacquire(&mut self, indices: &[u64]) -> Result<()> {
        let lease_ids = &mut self.lease_ids;
        self.harness
            .acquire_indices(indices, LONG_TTL_MS, resource_id, |index, lease_id| {
                if let Some(slot) = usize::try_from(index)
                    .ok()
                    .and_then(|i| lease_ids.get_mut(i))
                {
                    *slot = lease_id;
                }
            })
    }
}

/// The outcomes of a `Command::Batch` entry, or why there are none.
pub fn batch_outcomes(output: &ApplyOutput) -> Result<&[LeaseOutcome]> {
    match &output.result {
        CommandResult::Batch(Ok(outcomes)) => Ok(outcomes),
        other => bail!("batch entry failed: {other:?}"),
    }
}

/// The reply of an outcome that succeeded and was not a replay.
pub fn fresh_ok(outcome: &LeaseOutcome) -> Result<&LeaseReply> {
    match outcome {
        LeaseOutcome {
            result: Ok(reply),
            replayed: false,
            ..
        } => Ok(reply),
        other => bail!("lease operation did not succeed freshly: {other:?}"),
    }
}

/// The reply of a single-operation (`Command::Lease`) entry that succeeded and was not a replay.
/// Cheap enough to call inside a timed loop.
#[inline]
pub fn single_reply(output: &ApplyOutput) -> Option<&LeaseReply> {
    match &output.result {
        CommandResult::Lease(LeaseOutcome {
            result: Ok(reply),
            replayed: false,
            ..
        }) => Some(reply),
        _ => None,
    }
}

/// Xorshift64: a tiny deterministic pseudo-random generator for picking indices.
#[derive(Debug, Clone)]
pub struct XorShift64(u64);

impl XorShift64 {
    /// A generator from `seed` (0 is replaced, xorshift's state must be non-zero).
    pub fn new(seed: u64) -> Self {
        XorShift64(if seed == 0 {
            0x9e37_79b9_7f4a_7c15
        } else {
            seed
        })
    }

    /// The next 64 pseudo-random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// A pseudo-random index below `bound` (which must be non-zero). The modulo bias is
    /// irrelevant here.
    pub fn below(&mut self, bound: usize) -> usize {
        let bound = bound as u64;
        // The result is below `bound`, which came from a usize.
        usize::try_from(self.next_u64() % bound).unwrap_or(0)
    }
}

/// Visits `0..len` in a scattered order without repeats: position `k` maps to `k * stride mod
/// len` with `stride` coprime to `len`, so any `len` consecutive indices are distinct.
#[derive(Debug, Clone)]
pub struct Walk {
    len: u64,
    stride: u64,
    position: u64,
}

impl Walk {
    /// A walk over `0..len` (non-zero) with a stride derived from `seed`.
    pub fn new(len: usize, seed: u64) -> Self {
        let len = (len as u64).max(1);
        let mut stride = (seed % len).max(1);
        while gcd(stride, len) != 1 {
            stride = stride % len + 1;
        }
        Walk {
            len,
            stride,
            position: 0,
        }
    }

    /// The next `count` indices (distinct when `count <= len`).
    pub fn take(&mut self, count: usize) -> Vec<u64> {
        (0..count)
            .map(|_| {
                let index =
                    u128::from(self.position) * u128::from(self.stride) % u128::from(self.len);
                self.position = (self.position + 1) % self.len;
                // `index < len`, which is a u64.
                u64::try_from(index).unwrap_or(0)
            })
            .collect()
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn walk_visits_every_index_once_per_cycle() {
        for len in [1usize, 7, 10, 1_000, 10_000] {
            let mut walk = Walk::new(len, 614_657);
            let mut seen = walk.take(len);
            seen.sort_unstable();
            assert_eq!(seen, (0..len as u64).collect::<Vec<_>>(), "len {len}");
        }
    }

    #[test]
    fn clock_advances_one_ms_per_thousand_ops() {
        let mut harness = Harness::new(bench_limits(10)).unwrap();
        let start = harness.log_time_ms();
        assert_eq!(harness.stamp(999), start);
        assert_eq!(harness.stamp(1), start);
        assert_eq!(harness.log_time_ms(), start + 1);
        assert_eq!(harness.stamp(4_096), start + 1);
        assert_eq!(harness.log_time_ms(), start + 5);
    }

    #[test]
    fn small_population_renews_and_releases() {
        let mut resident = Resident::build(100, bench_limits(100)).unwrap();
        assert_eq!(resident.len(), 100);
        let renew = resident.renew_op(42);
        let entry = resident.harness.single(renew);
        let output = resident.harness.apply(&entry);
        assert!(
            matches!(single_reply(&output), Some(LeaseReply::Renewed(_))),
            "{output:?}"
        );
        let release = resident.release_op(42);
        let entry = resident.harness.single(release);
        let output = resident.harness.apply(&entry);
        assert!(
            matches!(single_reply(&output), Some(LeaseReply::Released(_))),
            "{output:?}"
        );
        let old = resident.lease_ids[42];
        resident.reacquire(&[42]).unwrap();
        assert!(resident.lease_ids[42].sequence > old.sequence);
        assert_eq!(resident.harness.state().stats().active_leases, 100);
    }
}
