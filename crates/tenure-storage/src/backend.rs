//! Where the node's bytes live: RocksDB, or (for a deterministic simulation) a [`MemoryDisk`].
//!
//! Both offer the few operations the stores use: point reads, ordered scans from a key, atomic
//! write batches (puts, deletes, range deletes) with or without a sync, and a sync of everything
//! written so far. The memory disk keeps what reads see apart from what a sync made durable, so a
//! simulated crash ([`MemoryDisk::crash`]) loses the unsynced writes, keeping only a prefix of
//! them in order, as RocksDB's write-ahead log does after a power loss.
//!
//! Must not depend on: the network, a clock, the openraft types.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard};

use rand::rngs::SmallRng;
use rand::{Rng as _, SeedableRng as _};
use rocksdb::{ColumnFamily, DB, Direction, IteratorMode, ReadOptions, WriteBatch, WriteOptions};

/// Column family of log entries.
pub const CF_LOG: &str = "log";
/// Column family of per-group Raft metadata (vote, committed, last purged).
pub const CF_META: &str = "meta";
/// Column family of per-group state-machine records (current snapshot pointer).
pub const CF_STATE: &str = "state";

/// A column family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Cf {
    /// Log entries.
    Log,
    /// Raft metadata.
    Meta,
    /// State-machine records.
    State,
}

impl Cf {
    /// RocksDB's name for it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Cf::Log => CF_LOG,
            Cf::Meta => CF_META,
            Cf::State => CF_STATE,
        }
    }

    fn index(self) -> usize {
        match self {
            Cf::Log => 0,
            Cf::Meta => 1,
            Cf::State => 2,
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    Put(Cf, Vec<u8>, Vec<u8>),
    Delete(Cf, Vec<u8>),
    /// `[from, to)`.
    DeleteRange(Cf, Vec<u8>, Vec<u8>),
}

/// Changes written together, atomically.
#[derive(Debug, Clone, Default)]
pub(crate) struct Batch {
    ops: Vec<Op>,
}

impl Batch {
    pub(crate) fn put(&mut self, cf: Cf, key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) {
        self.ops.push(Op::Put(cf, key.into(), value.into()));
    }

    pub(crate) fn delete(&mut self, cf: Cf, key: impl Into<Vec<u8>>) {
        self.ops.push(Op::Delete(cf, key.into()));
    }

    /// Deletes every key in `[from, to)`.
    pub(crate) fn delete_range(
        &mut self,
        cf: Cf,
        from: impl Into<Vec<u8>>,
        to: impl Into<Vec<u8>>,
    ) {
        self.ops.push(Op::DeleteRange(cf, from.into(), to.into()));
    }

    fn to_rocks(&self, db: &DB) -> Result<WriteBatch, String> {
        let mut batch = WriteBatch::default();
        for op in &self.ops {
            match op {
                Op::Put(cf, key, value) => batch.put_cf(rocks_cf(db, *cf)?, key, value),
                Op::Delete(cf, key) => batch.delete_cf(rocks_cf(db, *cf)?, key),
                Op::DeleteRange(cf, from, to) => {
                    batch.delete_range_cf(rocks_cf(db, *cf)?, from, to);
                }
            }
        }
        Ok(batch)
    }
}

fn rocks_cf(db: &DB, cf: Cf) -> Result<&ColumnFamily, String> {
    db.cf_handle(cf.name())
        .ok_or_else(|| format!("column family {} is missing", cf.name()))
}

type Table = BTreeMap<Vec<u8>, Vec<u8>>;

fn apply(tables: &mut [Table; 3], batch: &Batch) {
    for op in &batch.ops {
        match op {
            Op::Put(cf, key, value) => {
                tables[cf.index()].insert(key.clone(), value.clone());
            }
            Op::Delete(cf, key) => {
                tables[cf.index()].remove(key);
            }
            Op::DeleteRange(cf, from, to) => {
                let table = &mut tables[cf.index()];
                let doomed: Vec<Vec<u8>> = table
                    .range::<[u8], _>((
                        Bound::Included(from.as_slice()),
                        Bound::Excluded(to.as_slice()),
                    ))
                    .map(|(key, _)| key.clone())
                    .collect();
                for key in doomed {
                    table.remove(&key);
                }
            }
        }
    }
}

struct DiskState {
    /// What reads see: every write so far.
    visible: [Table; 3],
    /// What survives a crash for sure: every write up to the last sync.
    durable: [Table; 3],
    /// Batches written since the last sync, in order.
    unsynced: Vec<Batch>,
    /// Chooses how much of the unsynced tail a crash keeps.
    rng: SmallRng,
    /// Syncs so far.
    syncs: u64,
}

/// What a simulated crash did to a [`MemoryDisk`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CrashLoss {
    /// Unsynced batches that survived (a prefix, in write order).
    pub kept_batches: usize,
    /// Unsynced batches that were lost.
    pub lost_batches: usize,
}

/// A node's disk for a deterministic simulation: memory that outlives the node's process (clone
/// it into each incarnation of the node) and loses unsynced writes when [`MemoryDisk::crash`]
/// says the machine lost power.
#[derive(Clone)]
pub struct MemoryDisk {
    state: Arc<Mutex<DiskState>>,
    sync_latency_us: u64,
}

impl std::fmt::Debug for MemoryDisk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryDisk")
            .field("sync_latency_us", &self.sync_latency_us)
            .finish_non_exhaustive()
    }
}

impl MemoryDisk {
    /// An empty disk whose syncs take `sync_latency_us` (of the runtime's clock); `seed` chooses
    /// what crashes keep.
    pub fn new(seed: u64, sync_latency_us: u64) -> Self {
        MemoryDisk {
            state: Arc::new(Mutex::new(DiskState {
                visible: Default::default(),
                durable: Default::default(),
                unsynced: Vec::new(),
                rng: SmallRng::seed_from_u64(seed),
                syncs: 0,
            })),
            sync_latency_us,
        }
    }

    fn lock(&self) -> MutexGuard<'_, DiskState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// How long a sync takes, in microseconds.
    pub fn sync_latency_us(&self) -> u64 {
        self.sync_latency_us
    }

    /// The machine lost power: every synced write survives, and of the writes since the last
    /// sync a random prefix (possibly none, possibly all). Call it only while no node uses the
    /// disk (after its host crashed, before it restarts).
    pub fn crash(&self) -> CrashLoss {
        let mut state = self.lock();
        let unsynced = std::mem::take(&mut state.unsynced);
        let kept = state.rng.random_range(0..=unsynced.len());
        for batch in &unsynced[..kept] {
            apply(&mut state.durable, batch);
        }
        state.visible = state.durable.clone();
        CrashLoss {
            kept_batches: kept,
            lost_batches: unsynced.len() - kept,
        }
    }

    /// The disk was replaced (or its contents deleted): everything on it, synced or not, is
    /// gone. Call it only while no node uses the disk.
    pub fn wipe(&self) {
        let mut state = self.lock();
        state.unsynced.clear();
        state.durable = Default::default();
        state.visible = Default::default();
    }

    /// Syncs performed so far.
    pub fn syncs(&self) -> u64 {
        self.lock().syncs
    }

    /// Writes not yet made durable.
    pub fn unsynced_batches(&self) -> usize {
        self.lock().unsynced.len()
    }

    fn write(&self, batch: Batch, sync: bool) {
        let mut state = self.lock();
        apply(&mut state.visible, &batch);
        state.unsynced.push(batch);
        if sync {
            Self::sync_locked(&mut state);
        }
    }

    fn sync(&self) {
        Self::sync_locked(&mut self.lock());
    }

    fn sync_locked(state: &mut DiskState) {
        let unsynced = std::mem::take(&mut state.unsynced);
        for batch in &unsynced {
            apply(&mut state.durable, batch);
        }
        state.syncs += 1;
    }
}

/// The store's engine.
pub(crate) enum Backend {
    Rocks(DB),
    Memory(MemoryDisk),
}

impl Backend {
    pub(crate) fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>, String> {
        match self {
            Backend::Rocks(db) => db.get_cf(rocks_cf(db, cf)?, key).map_err(|e| e.to_string()),
            Backend::Memory(disk) => Ok(disk.lock().visible[cf.index()].get(key).cloned()),
        }
    }

    /// Calls `visit` with each key and value from `from` on (`forward`) or back (`!forward`),
    /// until it returns false or the scan reaches `limit`: going forward, keys before `limit`
    /// only (exclusive); going back, keys from `limit` on only (inclusive).
    ///
    /// A limit is not only a convenience: without one, RocksDB's iterator steps past the
    /// caller's last key into whatever follows, and when that is another group's purged log
    /// prefix (range-deleted, not yet compacted away) the step has to skip over it.
    pub(crate) fn scan(
        &self,
        cf: Cf,
        from: &[u8],
        forward: bool,
        limit: Option<&[u8]>,
        mut visit: impl FnMut(&[u8], &[u8]) -> Result<bool, String>,
    ) -> Result<(), String> {
        match self {
            Backend::Rocks(db) => {
                let direction = if forward {
                    Direction::Forward
                } else {
                    Direction::Reverse
                };
                let mut options = ReadOptions::default();
                match (limit, forward) {
                    (Some(limit), true) => options.set_iterate_upper_bound(limit),
                    (Some(limit), false) => options.set_iterate_lower_bound(limit),
                    (None, _) => {}
                }
                for item in db.iterator_cf_opt(
                    rocks_cf(db, cf)?,
                    options,
                    IteratorMode::From(from, direction),
                ) {
                    let (key, value) = item.map_err(|e| e.to_string())?;
                    if !visit(&key, &value)? {
                        break;
                    }
                }
                Ok(())
            }
            Backend::Memory(disk) => {
                let state = disk.lock();
                let table = &state.visible[cf.index()];
                if forward {
                    let end = limit.map_or(Bound::Unbounded, Bound::Excluded);
                    if limit.is_some_and(|limit| limit <= from) {
                        return Ok(());
                    }
                    for (key, value) in table.range::<[u8], _>((Bound::Included(from), end)) {
                        if !visit(key, value)? {
                            break;
                        }
                    }
                } else {
                    let start = limit.map_or(Bound::Unbounded, Bound::Included);
                    if limit.is_some_and(|limit| limit > from) {
                        return Ok(());
                    }
                    for (key, value) in table.range::<[u8], _>((start, Bound::Included(from))).rev()
                    {
                        if !visit(key, value)? {
                            break;
                        }
                    }
                }
                Ok(())
            }
        }
    }

    pub(crate) fn write(&self, batch: Batch, sync: bool) -> Result<(), String> {
        match self {
            Backend::Rocks(db) => {
                let mut options = WriteOptions::default();
                options.set_sync(sync);
                db.write_opt(batch.to_rocks(db)?, &options)
                    .map_err(|e| e.to_string())
            }
            Backend::Memory(disk) => {
                disk.write(batch, sync);
                Ok(())
            }
        }
    }

    /// Makes every write so far durable.
    pub(crate) fn sync(&self) -> Result<(), String> {
        match self {
            Backend::Rocks(db) => db.flush_wal(true).map_err(|e| e.to_string()),
            Backend::Memory(disk) => {
                disk.sync();
                Ok(())
            }
        }
    }

    pub(crate) fn is_memory(&self) -> bool {
        matches!(self, Backend::Memory(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disk_with(seed: u64) -> (Backend, MemoryDisk) {
        let disk = MemoryDisk::new(seed, 0);
        (Backend::Memory(disk.clone()), disk)
    }

    fn one(cf: Cf, key: &[u8], value: &[u8]) -> Batch {
        let mut batch = Batch::default();
        batch.put(cf, key, value);
        batch
    }

    #[test]
    fn synced_writes_survive_a_crash_and_unsynced_ones_keep_only_a_prefix() {
        for seed in 0..50 {
            let (backend, disk) = disk_with(seed);
            backend.write(one(Cf::Log, b"a", b"1"), true).unwrap();
            for i in 0..5u8 {
                backend
                    .write(one(Cf::Log, &[b'b', i], &[i]), false)
                    .unwrap();
            }
            assert_eq!(
                backend.get(Cf::Log, &[b'b', 4]).unwrap(),
                Some(vec![4]),
                "readable at once"
            );
            let loss = disk.crash();
            assert_eq!(loss.kept_batches + loss.lost_batches, 5);
            assert_eq!(backend.get(Cf::Log, b"a").unwrap(), Some(b"1".to_vec()));
            for i in 0..5u8 {
                let present = backend.get(Cf::Log, &[b'b', i]).unwrap().is_some();
                assert_eq!(
                    present,
                    usize::from(i) < loss.kept_batches,
                    "seed {seed}: a prefix survives"
                );
            }
        }
    }

    #[test]
    fn a_scan_stops_at_its_limit_exclusive_forward_and_inclusive_back() {
        let (backend, _disk) = disk_with(1);
        for i in 0..10u8 {
            backend.write(one(Cf::Log, &[i], &[i]), false).unwrap();
        }
        let collect = |from: u8, forward: bool, limit: Option<u8>| {
            let mut keys = Vec::new();
            let limit = limit.map(|l| [l]);
            backend
                .scan(
                    Cf::Log,
                    &[from],
                    forward,
                    limit.as_ref().map(|l| &l[..]),
                    |key, _| {
                        keys.push(key[0]);
                        Ok(true)
                    },
                )
                .unwrap();
            keys
        };
        assert_eq!(collect(2, true, Some(5)), [2, 3, 4]);
        assert_eq!(collect(2, true, None), [2, 3, 4, 5, 6, 7, 8, 9]);
        assert_eq!(collect(5, true, Some(5)), Vec::<u8>::new());
        assert_eq!(collect(5, true, Some(3)), Vec::<u8>::new());
        assert_eq!(collect(7, false, Some(5)), [7, 6, 5]);
        assert_eq!(collect(7, false, None), [7, 6, 5, 4, 3, 2, 1, 0]);
        assert_eq!(collect(3, false, Some(5)), Vec::<u8>::new());
    }

    #[test]
    fn a_sync_makes_earlier_writes_durable_and_range_deletes_apply_in_order() {
        let (backend, disk) = disk_with(1);
        for i in 0..10u8 {
            backend.write(one(Cf::Meta, &[i], &[i]), false).unwrap();
        }
        let mut batch = Batch::default();
        batch.delete_range(Cf::Meta, vec![2], vec![8]);
        backend.write(batch, false).unwrap();
        backend.sync().unwrap();
        assert_eq!(disk.crash().lost_batches, 0);
        let mut keys = Vec::new();
        backend
            .scan(Cf::Meta, &[0], true, None, |key, _| {
                keys.push(key[0]);
                Ok(true)
            })
            .unwrap();
        assert_eq!(keys, vec![0, 1, 8, 9]);
        let mut last = None;
        backend
            .scan(Cf::Meta, &[u8::MAX], false, None, |key, _| {
                last = Some(key[0]);
                Ok(false)
            })
            .unwrap();
        assert_eq!(last, Some(9));
    }
}
