//! One RocksDB instance per node, shared by every group replica on it, and the single flusher
//! that makes all groups' appends durable with one WAL sync.
//!
//! Appends write unsynced batches (they are readable at once) and queue their `IOFlushed`
//! callbacks. The flusher thread takes every callback queued so far, syncs the WAL once
//! (`flush_wal(true)`), and completes them all: a callback is only ever completed by a sync that
//! started after its write returned, so success means durable. While one sync runs, new
//! callbacks gather for the next: group commit without a timer.
//!
//! On a [`MemoryDisk`] (a deterministic simulation) the same rules hold, but the flusher is a
//! task on the caller's runtime, a sync takes the disk's latency on the runtime's clock, and work
//! that would block runs inline: no thread of its own, so a simulation replays it exactly.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use openraft::storage::IOFlushed;
use rocksdb::{ColumnFamilyDescriptor, DB, Options};

use crate::TenureRaft;
use crate::backend::{Backend, Batch, MemoryDisk};
use crate::error::StoreError;

/// Column family of log entries.
pub const CF_LOG: &str = "log";
/// Column family of per-group Raft metadata (vote, committed, last purged).
pub const CF_META: &str = "meta";
/// Column family of per-group state-machine records (current snapshot pointer).
pub const CF_STATE: &str = "state";

/// How the store runs.
#[derive(Debug, Clone)]
pub struct StorageOptions {
    /// Sync the WAL before acknowledging appends and votes. Only tests of non-durability turn this
    /// off; a node must never run without it.
    pub fsync: bool,
    /// Size of RocksDB's block cache shared by all column families, in bytes.
    pub block_cache_bytes: usize,
    /// Write buffer (memtable) size per column family, in bytes.
    pub write_buffer_bytes: usize,
    /// Fault injection (a slow disk): microseconds added to every WAL sync, read at each sync
    /// so a test can change it while the store runs. Zero, the default, adds nothing.
    pub injected_sync_delay_us: Arc<AtomicU64>,
}

impl Default for StorageOptions {
    fn default() -> Self {
        StorageOptions {
            fsync: true,
            block_cache_bytes: 64 << 20,
            write_buffer_bytes: 64 << 20,
            injected_sync_delay_us: Arc::new(AtomicU64::new(0)),
        }
    }
}

/// Counters of the node's storage activity.
#[derive(Debug, Default)]
pub struct StorageStats {
    /// WAL syncs performed by the flusher.
    pub fsyncs: AtomicU64,
    /// Append calls.
    pub appends: AtomicU64,
    /// Log entries appended.
    pub entries_appended: AtomicU64,
    /// Append callbacks completed by the flusher.
    pub callbacks_completed: AtomicU64,
    /// Total microseconds spent inside WAL syncs.
    pub fsync_micros: AtomicU64,
}

/// A point-in-time copy of [`StorageStats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// WAL syncs performed by the flusher.
    pub fsyncs: u64,
    /// Append calls.
    pub appends: u64,
    /// Log entries appended.
    pub entries_appended: u64,
    /// Append callbacks completed by the flusher.
    pub callbacks_completed: u64,
    /// Total microseconds spent inside WAL syncs.
    pub fsync_micros: u64,
}

#[derive(Default)]
struct FlushQueue {
    pending: Vec<IOFlushed<TenureRaft>>,
    shutdown: bool,
}

pub(crate) struct Inner {
    pub(crate) backend: Backend,
    pub(crate) data_dir: PathBuf,
    pub(crate) options: StorageOptions,
    pub(crate) stats: StorageStats,
    queue: Mutex<FlushQueue>,
    queue_ready: Condvar,
    /// Wakes the flusher task of a memory disk.
    flush_wakeup: tokio::sync::Notify,
    stopped: Mutex<HashMap<u32, String>>,
    /// Set when a WAL sync fails: nothing pending can be called durable, so every group stops.
    node_failure: Mutex<Option<String>>,
}

impl Inner {
    fn new(backend: Backend, data_dir: &Path, options: StorageOptions) -> Self {
        Inner {
            backend,
            data_dir: data_dir.to_path_buf(),
            options,
            stats: StorageStats::default(),
            queue: Mutex::new(FlushQueue::default()),
            queue_ready: Condvar::new(),
            flush_wakeup: tokio::sync::Notify::new(),
            stopped: Mutex::new(HashMap::new()),
            node_failure: Mutex::new(None),
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks leaves plain data behind; keep going.
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Inner {
    /// Refuses work for a group that has stopped.
    pub(crate) fn check_group(&self, group: u32) -> Result<(), StoreError> {
        if let Some(reason) = lock(&self.node_failure).as_ref() {
            return Err(StoreError::GroupStopped {
                group,
                reason: reason.clone(),
            });
        }
        match lock(&self.stopped).get(&group) {
            Some(reason) => Err(StoreError::GroupStopped {
                group,
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Records that a group must stop serving, and returns the error for the caller.
    pub(crate) fn stop_group(&self, group: u32, err: StoreError) -> StoreError {
        tracing::error!(group, error = %err, "storage failure: the group stops serving");
        lock(&self.stopped)
            .entry(group)
            .or_insert_with(|| err.to_string());
        err
    }

    /// Writes a batch without syncing (readable at once, durable at the next flush).
    pub(crate) fn write_unsynced(
        &self,
        group: u32,
        batch: Batch,
        operation: &'static str,
    ) -> Result<(), StoreError> {
        self.write(group, batch, operation, false)
    }

    /// Writes a batch and syncs the WAL before returning (blocking).
    pub(crate) fn write_synced(
        &self,
        group: u32,
        batch: Batch,
        operation: &'static str,
    ) -> Result<(), StoreError> {
        self.write(group, batch, operation, self.options.fsync)
    }

    fn write(
        &self,
        group: u32,
        batch: Batch,
        operation: &'static str,
        sync: bool,
    ) -> Result<(), StoreError> {
        // A memory disk's synced writes cost nothing: sleeping here would stop the simulation.
        if sync && !self.backend.is_memory() {
            self.injected_sync_delay();
        }
        self.backend.write(batch, sync).map_err(|detail| {
            self.stop_group(
                group,
                StoreError::Io {
                    group,
                    operation,
                    detail,
                },
            )
        })
    }

    /// Reads one value (a failure is reported by the caller, which knows the group).
    pub(crate) fn get(
        &self,
        cf: crate::backend::Cf,
        key: &[u8],
    ) -> Result<Option<Vec<u8>>, String> {
        self.backend.get(cf, key)
    }

    /// Sleeps for the injected sync delay, if a test set one (a slow disk).
    fn injected_sync_delay(&self) {
        let delay_us = self.options.injected_sync_delay_us.load(Ordering::Relaxed);
        if delay_us > 0 {
            std::thread::sleep(std::time::Duration::from_micros(delay_us));
        }
    }

    pub(crate) fn enqueue_flush(&self, callback: IOFlushed<TenureRaft>) {
        let mut queue = lock(&self.queue);
        queue.pending.push(callback);
        drop(queue);
        self.queue_ready.notify_one();
        self.flush_wakeup.notify_one();
    }

    /// Takes every queued callback, or `None` at shutdown with nothing queued.
    fn take_pending(&self) -> Option<Vec<IOFlushed<TenureRaft>>> {
        let mut queue = lock(&self.queue);
        if queue.pending.is_empty() {
            return (!queue.shutdown).then(Vec::new);
        }
        Some(std::mem::take(&mut queue.pending))
    }

    /// Completes `batch` with the result of the sync that made it durable.
    fn complete(&self, batch: Vec<IOFlushed<TenureRaft>>, result: Result<(), String>, micros: u64) {
        if let Err(detail) = &result {
            tracing::error!(error = %detail, "WAL sync failed: every group on this node stops");
            lock(&self.node_failure).get_or_insert_with(|| format!("WAL sync failed: {detail}"));
        }
        self.stats.fsyncs.fetch_add(1, Ordering::Relaxed);
        self.stats.fsync_micros.fetch_add(micros, Ordering::Relaxed);
        let completed = batch.len() as u64;
        for callback in batch {
            callback.io_completed(result.clone().map_err(|detail| {
                io::Error::from(StoreError::Io {
                    group: u32::MAX,
                    operation: "WAL sync",
                    detail,
                })
            }));
        }
        self.stats
            .callbacks_completed
            .fetch_add(completed, Ordering::Relaxed);
    }

    /// The memory disk's flusher: a task on the runtime that opened the store.
    async fn memory_flusher(self: Arc<Self>, latency_us: u64) {
        loop {
            let Some(batch) = self.take_pending() else {
                return;
            };
            if batch.is_empty() {
                self.flush_wakeup.notified().await;
                continue;
            }
            let delay_us = latency_us
                .saturating_add(self.options.injected_sync_delay_us.load(Ordering::Relaxed));
            if delay_us > 0 {
                tokio::time::sleep(std::time::Duration::from_micros(delay_us)).await;
            }
            // Everything written before the callbacks were taken is in this sync.
            let result = if self.options.fsync {
                self.backend.sync()
            } else {
                Ok(())
            };
            self.complete(batch, result, delay_us);
        }
    }

    fn flusher_loop(self: Arc<Self>) {
        loop {
            let batch = {
                let mut queue = lock(&self.queue);
                while queue.pending.is_empty() && !queue.shutdown {
                    queue = self
                        .queue_ready
                        .wait(queue)
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                }
                if queue.pending.is_empty() {
                    return;
                }
                std::mem::take(&mut queue.pending)
            };
            let started = std::time::Instant::now();
            let result = if self.options.fsync {
                self.injected_sync_delay();
                self.backend.sync()
            } else {
                Ok(())
            };
            let micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
            self.complete(batch, result, micros);
        }
    }
}

enum Flusher {
    Thread(JoinHandle<()>),
    Task(tokio::task::JoinHandle<()>),
}

/// Owns the flusher; dropped with the last handle to the store.
pub(crate) struct Shared {
    pub(crate) inner: Arc<Inner>,
    flusher: Mutex<Option<Flusher>>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        lock(&self.inner.queue).shutdown = true;
        self.inner.queue_ready.notify_all();
        self.inner.flush_wakeup.notify_one();
        match lock(&self.flusher).take() {
            Some(Flusher::Thread(handle)) => {
                let _ = handle.join();
            }
            Some(Flusher::Task(task)) => task.abort(),
            None => {}
        }
    }
}

/// The storage of one node: one RocksDB instance for every group replica on it.
#[derive(Clone)]
pub struct NodeStorage {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for NodeStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeStorage")
            .field("data_dir", &self.shared.inner.data_dir)
            .finish_non_exhaustive()
    }
}

impl NodeStorage {
    /// Opens (creating if needed) the store in `data_dir`. Reopening after a crash needs no
    /// repair: RocksDB replays its WAL, and only synced writes were ever acknowledged.
    pub fn open(data_dir: &Path, options: StorageOptions) -> Result<Self, StoreError> {
        let open_error = |detail: String| StoreError::Open {
            path: data_dir.to_path_buf(),
            detail,
        };
        std::fs::create_dir_all(data_dir.join("snapshots"))
            .map_err(|err| open_error(err.to_string()))?;
        let cache = rocksdb::Cache::new_lru_cache(options.block_cache_bytes);
        let mut table = rocksdb::BlockBasedOptions::default();
        table.set_block_cache(&cache);
        let cf_options = || {
            let mut cf = Options::default();
            cf.set_block_based_table_factory(&table);
            cf.set_write_buffer_size(options.write_buffer_bytes);
            cf
        };
        let mut db_options = Options::default();
        db_options.create_if_missing(true);
        db_options.create_missing_column_families(true);
        // Checksums on every block read, and paranoid checks when opening.
        db_options.set_paranoid_checks(true);
        let descriptors = [CF_LOG, CF_META, CF_STATE]
            .into_iter()
            .map(|name| ColumnFamilyDescriptor::new(name, cf_options()));
        let db = DB::open_cf_descriptors(&db_options, data_dir.join("db"), descriptors)
            .map_err(|err| open_error(err.to_string()))?;
        let inner = Arc::new(Inner::new(Backend::Rocks(db), data_dir, options));
        let flusher_inner = Arc::clone(&inner);
        let handle = std::thread::Builder::new()
            .name("tenure-wal-flusher".to_owned())
            .spawn(move || flusher_loop_entry(flusher_inner))
            .map_err(|err| open_error(format!("cannot start the flusher: {err}")))?;
        Ok(NodeStorage {
            shared: Arc::new(Shared {
                inner,
                flusher: Mutex::new(Some(Flusher::Thread(handle))),
            }),
        })
    }

    /// Opens a store on a [`MemoryDisk`] (a deterministic simulation's): what the disk holds is
    /// what a previous incarnation of the node synced (after [`MemoryDisk::crash`], what a crash
    /// kept). Snapshot files still go to `data_dir`, written inline. Must run inside a tokio
    /// runtime: the flusher is a task on it, and it dies with the runtime.
    pub fn open_in_memory(
        data_dir: &Path,
        disk: MemoryDisk,
        options: StorageOptions,
    ) -> Result<Self, StoreError> {
        std::fs::create_dir_all(data_dir.join("snapshots")).map_err(|err| StoreError::Open {
            path: data_dir.to_path_buf(),
            detail: err.to_string(),
        })?;
        let latency_us = disk.sync_latency_us();
        let inner = Arc::new(Inner::new(Backend::Memory(disk), data_dir, options));
        let task = tokio::spawn(Arc::clone(&inner).memory_flusher(latency_us));
        Ok(NodeStorage {
            shared: Arc::new(Shared {
                inner,
                flusher: Mutex::new(Some(Flusher::Task(task))),
            }),
        })
    }

    /// The log store of one group.
    pub fn log_store(&self, group: u32) -> crate::GroupLogStore {
        crate::GroupLogStore::new(Arc::clone(&self.shared), group)
    }

    /// Counters of storage activity since open.
    pub fn stats(&self) -> StatsSnapshot {
        let stats = &self.shared.inner.stats;
        StatsSnapshot {
            fsyncs: stats.fsyncs.load(Ordering::Relaxed),
            appends: stats.appends.load(Ordering::Relaxed),
            entries_appended: stats.entries_appended.load(Ordering::Relaxed),
            callbacks_completed: stats.callbacks_completed.load(Ordering::Relaxed),
            fsync_micros: stats.fsync_micros.load(Ordering::Relaxed),
        }
    }

    /// The failure that stopped every group on this node (a failed WAL sync), if any.
    pub fn node_failure(&self) -> Option<String> {
        lock(&self.shared.inner.node_failure).clone()
    }

    /// Groups that have stopped after a failure, with the first failure of each.
    pub fn stopped_groups(&self) -> Vec<(u32, String)> {
        let mut stopped: Vec<_> = lock(&self.shared.inner.stopped)
            .iter()
            .map(|(group, reason)| (*group, reason.clone()))
            .collect();
        stopped.sort();
        stopped
    }

    /// True when the store lives on a [`MemoryDisk`] (a simulation).
    pub fn is_in_memory(&self) -> bool {
        self.shared.inner.backend.is_memory()
    }

    /// The directory holding this node's data.
    pub fn data_dir(&self) -> &Path {
        &self.shared.inner.data_dir
    }
}

/// Runs blocking storage work off the async caller's thread (on a memory disk, inline: it does
/// not block, and a thread of its own would make a simulation irreproducible).
pub(crate) async fn blocking<T, F>(inner: &Inner, work: F) -> Result<T, io::Error>
where
    F: FnOnce() -> Result<T, StoreError> + Send + 'static,
    T: Send + 'static,
{
    if inner.backend.is_memory() {
        return work().map_err(io::Error::from);
    }
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|err| io::Error::other(format!("storage task failed: {err}")))?
        .map_err(io::Error::from)
}

fn flusher_loop_entry(inner: Arc<Inner>) {
    inner.flusher_loop();
}
