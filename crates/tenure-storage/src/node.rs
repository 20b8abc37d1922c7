//! One RocksDB instance per node, shared by every group replica on it, and the single flusher
//! that makes all groups' appends durable with one WAL sync.
//!
//! Appends write unsynced batches (they are readable at once) and queue their `IOFlushed`
//! callbacks. The flusher thread takes every callback queued so far, syncs the WAL once
//! (`flush_wal(true)`), and completes them all: a callback is only ever completed by a sync that
//! started after its write returned, so success means durable. While one sync runs, new
//! callbacks gather for the next: group commit without a timer.
//!
//! A failed sync is sticky. After a failed fsync the kernel may have dropped the pages it could
//! not write and marked them clean, so a later sync can succeed without them ("fsyncgate"): from
//! the first failure on, every later sync completes its callbacks with
//! [`StoreError::SyncFailed`], every write is refused, and so every group on the node stops (an
//! error from storage stops an openraft group) until the node restarts and RocksDB's recovery
//! reads back what really reached the disk.
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
use rocksdb::{ColumnFamilyDescriptor, DB, DBRecoveryMode, Options};

use crate::TenureRaft;
use crate::backend::{Backend, Batch, CF_LOG, CF_META, CF_STATE, MemoryDisk};
use crate::error::StoreError;

/// The histogram of WAL sync durations (seconds) the RocksDB flusher records through the
/// `metrics` facade, an injected slow-disk delay included (nothing is recorded unless the process
/// installed a recorder; a memory disk records nothing).
pub const FSYNC_DURATION_SECONDS_METRIC: &str = "tenure_fsync_duration_seconds";

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
    /// Most table files RocksDB keeps open at once ([`MAX_OPEN_FILES_DEFAULT`] unless set). It
    /// bounds the store's file descriptors (see [`StorageOptions::file_descriptors_max`]) well
    /// under the process's limit, so descriptors used up by sockets can never leave RocksDB
    /// unable to open a table file (and a failed read or sync stop the node's groups). More open
    /// tables than this are closed and reopened on demand (a table cache).
    pub max_open_files: u32,
}

/// The default of [`StorageOptions::max_open_files`]: 1024 table files (at RocksDB's 64 MiB
/// default target file size, 64 GiB of tables stay open; more are opened on demand).
pub const MAX_OPEN_FILES_DEFAULT: u32 = 1024;

/// File descriptors the store may hold besides table files: WAL files, MANIFEST, LOCK, the info
/// log, directories opened to sync them, files being written by flushes and compactions.
pub const FILE_DESCRIPTORS_BESIDES_TABLES_MAX: u64 = 64;

/// Snapshot files one group may hold open at once: one being built or installed, and the
/// current one being sent to a follower (openraft sends one at a time per follower; two spare).
pub const SNAPSHOT_FILES_PER_GROUP_MAX: u64 = 4;

impl StorageOptions {
    /// An upper bound on the file descriptors the store holds with `groups` group replicas:
    /// [`StorageOptions::max_open_files`] table files, [`FILE_DESCRIPTORS_BESIDES_TABLES_MAX`]
    /// and [`SNAPSHOT_FILES_PER_GROUP_MAX`] per group. A node's start-up check compares it (plus
    /// its sockets) with the process's descriptor limit.
    pub fn file_descriptors_max(&self, groups: u32) -> u64 {
        u64::from(self.max_open_files)
            .saturating_add(FILE_DESCRIPTORS_BESIDES_TABLES_MAX)
            .saturating_add(u64::from(groups).saturating_mul(SNAPSHOT_FILES_PER_GROUP_MAX))
    }
}

impl Default for StorageOptions {
    fn default() -> Self {
        StorageOptions {
            fsync: true,
            block_cache_bytes: 64 << 20,
            write_buffer_bytes: 64 << 20,
            injected_sync_delay_us: Arc::new(AtomicU64::new(0)),
            max_open_files: MAX_OPEN_FILES_DEFAULT,
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
    /// Snapshots built (a build with nothing new to write is not counted).
    pub snapshot_builds: AtomicU64,
    /// Total microseconds those builds took, from taking the group's snapshot exclusion (after
    /// the freeze) to the durable pointer.
    pub snapshot_build_micros: AtomicU64,
    /// The longest of those builds, in microseconds.
    pub snapshot_build_micros_max: AtomicU64,
    /// The largest snapshot built, in bytes.
    pub snapshot_bytes_max: AtomicU64,
    /// Bytes of every snapshot built.
    pub snapshot_bytes: AtomicU64,
    /// The longest time a build's freeze stopped a group's apply (the freeze runs on the apply
    /// task, from asking for the state lock to releasing it), in microseconds, wall time.
    pub snapshot_pause_micros_max: AtomicU64,
    /// Builds whose freeze stopped a group's apply for more than 10 ms.
    pub snapshot_pauses_over_10ms: AtomicU64,
    /// The most CPU time the applying thread spent in one build's freeze, in microseconds
    /// (beside the wall time above: the difference is the thread waiting for a core or the lock).
    pub snapshot_pause_cpu_micros_max: AtomicU64,
    /// The longest freeze pause less the applying thread's wait for a core in it (Linux's
    /// `/proc/thread-self/schedstat`; not recorded where the kernel does not say), in
    /// microseconds: the freeze's work and any wait for the state lock.
    pub snapshot_pause_less_core_wait_micros_max: AtomicU64,
    /// Freezes whose pause less the wait for a core was over 10 ms.
    pub snapshot_pauses_less_core_wait_over_10ms: AtomicU64,
    /// The most CPU time one entry's apply took while a frozen copy was alive, in microseconds.
    pub snapshot_shared_apply_cpu_micros_max: AtomicU64,
    /// The longest apply of one entry while a frozen copy of its group was alive (the chunk
    /// copies of copy-on-write land there), in microseconds.
    pub snapshot_shared_apply_micros_max: AtomicU64,
    /// Entries applied while a frozen copy was alive that took more than 10 ms.
    pub snapshot_shared_applies_over_10ms: AtomicU64,
    /// The longest apply of one entry beside a frozen copy less the thread's wait for a core in
    /// it, in microseconds.
    pub snapshot_shared_apply_less_core_wait_micros_max: AtomicU64,
    /// Entries applied beside a frozen copy whose apply less the wait for a core was over 10 ms.
    pub snapshot_shared_applies_less_core_wait_over_10ms: AtomicU64,
    /// Entries applied while a frozen copy of their group was alive.
    pub snapshot_shared_applies: AtomicU64,
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
    /// Snapshots built.
    pub snapshot_builds: u64,
    /// Total microseconds those builds took.
    pub snapshot_build_micros: u64,
    /// The longest build, in microseconds.
    pub snapshot_build_micros_max: u64,
    /// The largest snapshot built, in bytes.
    pub snapshot_bytes_max: u64,
    /// Bytes of every snapshot built.
    pub snapshot_bytes: u64,
    /// The longest time a build's freeze stopped a group's apply, in microseconds.
    pub snapshot_pause_micros_max: u64,
    /// Builds whose freeze stopped a group's apply for more than 10 ms.
    pub snapshot_pauses_over_10ms: u64,
    /// The most CPU time the applying thread spent in one build's freeze, in microseconds.
    pub snapshot_pause_cpu_micros_max: u64,
    /// The longest freeze pause less the applying thread's wait for a core, in microseconds.
    pub snapshot_pause_less_core_wait_micros_max: u64,
    /// Freezes whose pause less the wait for a core was over 10 ms.
    pub snapshot_pauses_less_core_wait_over_10ms: u64,
    /// The most CPU time one entry's apply took while a frozen copy was alive, in microseconds.
    pub snapshot_shared_apply_cpu_micros_max: u64,
    /// The longest apply of one entry while a frozen copy of its group was alive, in
    /// microseconds.
    pub snapshot_shared_apply_micros_max: u64,
    /// Entries applied while a frozen copy was alive that took more than 10 ms.
    pub snapshot_shared_applies_over_10ms: u64,
    /// The longest apply of one entry beside a frozen copy less the wait for a core, in
    /// microseconds.
    pub snapshot_shared_apply_less_core_wait_micros_max: u64,
    /// Entries applied beside a frozen copy whose apply less the wait for a core was over 10 ms.
    pub snapshot_shared_applies_less_core_wait_over_10ms: u64,
    /// Entries applied while a frozen copy of their group was alive.
    pub snapshot_shared_applies: u64,
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
    /// Set when a WAL sync fails: nothing written since can be called durable (a later sync may
    /// succeed without the pages the failed one lost), so every later sync fails and every group
    /// stops until the node restarts. Set and read under `sync_serial`.
    node_failure: Mutex<Option<String>>,
    /// Held across every WAL sync (the flusher's and synced writes'), so none starts after a
    /// failed one without seeing the failure.
    sync_serial: Mutex<()>,
    /// One snapshot operation (build or install) at a time per group: see `state_machine`.
    snapshot_exclusion: Mutex<HashMap<u32, Arc<Mutex<()>>>>,
    /// Numbers the snapshot operations, so each one's temporary file has a name of its own.
    snapshot_ops: AtomicU64,
    /// Test builds only: called at the [`TestStep`]s, to pause an operation or fail a sync.
    #[cfg(test)]
    test_hook: Mutex<Option<TestHook>>,
}

/// A point inside a storage operation where a test can pause it or make it fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TestStep {
    /// A snapshot build holds the group's snapshot exclusion with the state it froze (when its
    /// builder was made) and is about to write it.
    BuildFrozen,
    /// A snapshot build has written its file and is about to make it current.
    BuildWritten,
    /// A snapshot install is about to wait for what it needs to make its snapshot current.
    InstallWaits,
    /// The flusher is about to sync the WAL (an `Err` from the hook fails the sync).
    WalSync,
}

/// What a test runs at each [`TestStep`]; an `Err` is an injected failure of that step.
#[cfg(test)]
pub(crate) type TestHook = Arc<dyn Fn(TestStep) -> Result<(), String> + Send + Sync>;

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
            sync_serial: Mutex::new(()),
            snapshot_exclusion: Mutex::new(HashMap::new()),
            snapshot_ops: AtomicU64::new(0),
            #[cfg(test)]
            test_hook: Mutex::new(None),
        }
    }

    /// The exclusion every snapshot build and install of `group` holds while it runs.
    pub(crate) fn snapshot_exclusion(&self, group: u32) -> Arc<Mutex<()>> {
        Arc::clone(lock(&self.snapshot_exclusion).entry(group).or_default())
    }

    /// Forgets a dropped replica's failure mark and snapshot exclusion (a new replica of the
    /// group starts clean).
    pub(crate) fn forget_group(&self, group: u32) {
        lock(&self.stopped).remove(&group);
        lock(&self.snapshot_exclusion).remove(&group);
    }

    /// A number no other snapshot operation of this store has.
    pub(crate) fn next_snapshot_op(&self) -> u64 {
        self.snapshot_ops.fetch_add(1, Ordering::Relaxed)
    }

    /// Test builds only: runs `hook` at every [`TestStep`] from now on.
    #[cfg(test)]
    pub(crate) fn set_test_hook(&self, hook: TestHook) {
        *lock(&self.test_hook) = Some(hook);
    }

    /// Runs the test hook at `step` (test builds only; elsewhere nothing happens).
    #[allow(clippy::unnecessary_wraps)]
    pub(crate) fn test_step(&self, step: TestStep) -> Result<(), String> {
        #[cfg(test)]
        {
            let hook = lock(&self.test_hook).clone();
            if let Some(hook) = hook {
                return hook(step);
            }
        }
        let _ = step;
        Ok(())
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
        self.check_syncs()?;
        match lock(&self.stopped).get(&group) {
            Some(reason) => Err(StoreError::GroupStopped {
                group,
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Refuses work after a failed WAL sync (sticky until the node restarts).
    fn check_syncs(&self) -> Result<(), StoreError> {
        match lock(&self.node_failure).as_ref() {
            Some(first_failure) => Err(StoreError::SyncFailed {
                first_failure: first_failure.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Records a failed WAL sync: from now on every sync and write fails.
    fn fail_syncs(&self, detail: &str) {
        tracing::error!(error = %detail, "WAL sync failed: every group on this node stops until it restarts");
        lock(&self.node_failure).get_or_insert_with(|| format!("WAL sync failed: {detail}"));
    }

    /// Syncs the WAL for the flusher, unless an earlier sync failed.
    fn sync_wal(&self) -> Result<(), SyncError> {
        let _serial = lock(&self.sync_serial);
        if let Some(first_failure) = lock(&self.node_failure).clone() {
            return Err(SyncError::Earlier(first_failure));
        }
        self.test_step(TestStep::WalSync)
            .and_then(|()| self.backend.sync())
            .map_err(|detail| {
                self.fail_syncs(&detail);
                SyncError::Failed(detail)
            })
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
        // Unsynced writes also stop after a failed sync: they could only become durable through
        // a later sync, and none is trusted any more.
        self.check_syncs()?;
        let _serial = sync.then(|| lock(&self.sync_serial));
        if sync {
            self.check_syncs()?;
            // A memory disk's synced writes cost nothing: sleeping would stop the simulation.
            if !self.backend.is_memory() {
                self.injected_sync_delay();
            }
        }
        self.backend.write(batch, sync).map_err(|detail| {
            if sync {
                // The write or its sync failed: either way the WAL can no longer be trusted.
                self.fail_syncs(&detail);
            }
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

    fn node_failure_text(&self) -> String {
        lock(&self.node_failure).clone().unwrap_or_default()
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
    fn complete(
        &self,
        batch: Vec<IOFlushed<TenureRaft>>,
        result: Result<(), SyncError>,
        micros: u64,
    ) {
        if !matches!(result, Err(SyncError::Earlier(_))) {
            self.stats.fsyncs.fetch_add(1, Ordering::Relaxed);
            self.stats.fsync_micros.fetch_add(micros, Ordering::Relaxed);
        }
        // Counted before the callbacks run: whoever a callback wakes sees it counted.
        self.stats
            .callbacks_completed
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        for callback in batch {
            callback.io_completed(match &result {
                Ok(()) => Ok(()),
                Err(err) => Err(io::Error::from(err.to_store_error())),
            });
        }
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
                self.sync_wal()
            } else {
                self.check_syncs()
                    .map_err(|_| SyncError::Earlier(self.node_failure_text()))
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
                self.sync_wal()
            } else {
                self.check_syncs()
                    .map_err(|_| SyncError::Earlier(self.node_failure_text()))
            };
            let elapsed = started.elapsed();
            if self.options.fsync {
                ::metrics::histogram!(FSYNC_DURATION_SECONDS_METRIC).record(elapsed.as_secs_f64());
            }
            let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
            self.complete(batch, result, micros);
        }
    }
}

/// Why a flusher sync acknowledges nothing.
enum SyncError {
    /// This sync failed.
    Failed(String),
    /// An earlier sync failed (the first failure): this one did not run.
    Earlier(String),
}

impl SyncError {
    fn to_store_error(&self) -> StoreError {
        match self {
            SyncError::Failed(detail) => StoreError::Io {
                group: u32::MAX,
                operation: "WAL sync",
                detail: detail.clone(),
            },
            SyncError::Earlier(first_failure) => StoreError::SyncFailed {
                first_failure: first_failure.clone(),
            },
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
        // Recovery replays the WAL and refuses to open if a record inside it is damaged; only an
        // incomplete last record (a write torn by a crash, never synced, never acknowledged) is
        // dropped. RocksDB's default (point in time) would instead stop replaying at the damage
        // and silently drop every synced write after it, votes included: a replica that forgot
        // its vote or acknowledged entries can elect a second leader or lose a commit. Absolute
        // consistency would also refuse the torn tail every power loss can leave, so a node could
        // not restart after an ordinary crash.
        db_options.set_wal_recovery_mode(DBRecoveryMode::TolerateCorruptedTailRecords);
        // Table files open at once: bounded, so that sockets cannot use up the descriptors
        // RocksDB needs (see `StorageOptions::max_open_files`).
        db_options.set_max_open_files(i32::try_from(options.max_open_files).unwrap_or(i32::MAX));
        let descriptors = [CF_LOG, CF_META, CF_STATE]
            .into_iter()
            .map(|name| ColumnFamilyDescriptor::new(name, cf_options()));
        let db = DB::open_cf_descriptors(&db_options, data_dir.join("db"), descriptors).map_err(
            |err| {
                if err.kind() == rocksdb::ErrorKind::Corruption {
                    let err = StoreError::CorruptStore {
                        path: data_dir.to_path_buf(),
                        detail: err.to_string(),
                    };
                    tracing::error!(error = %err, "storage failure: the store is corrupt");
                    err
                } else {
                    open_error(err.to_string())
                }
            },
        )?;
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

    /// True on a memory disk (`open_in_memory`, the simulation): blocking work runs inline and in
    /// order there, so a seeded run replays exactly. A caller that would spread storage work over
    /// threads must do it in order on the caller's thread instead.
    pub fn runs_blocking_work_inline(&self) -> bool {
        self.shared.inner.backend.is_memory()
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
            snapshot_builds: stats.snapshot_builds.load(Ordering::Relaxed),
            snapshot_build_micros: stats.snapshot_build_micros.load(Ordering::Relaxed),
            snapshot_build_micros_max: stats.snapshot_build_micros_max.load(Ordering::Relaxed),
            snapshot_bytes_max: stats.snapshot_bytes_max.load(Ordering::Relaxed),
            snapshot_bytes: stats.snapshot_bytes.load(Ordering::Relaxed),
            snapshot_pause_micros_max: stats.snapshot_pause_micros_max.load(Ordering::Relaxed),
            snapshot_pauses_over_10ms: stats.snapshot_pauses_over_10ms.load(Ordering::Relaxed),
            snapshot_pause_cpu_micros_max: stats
                .snapshot_pause_cpu_micros_max
                .load(Ordering::Relaxed),
            snapshot_shared_apply_cpu_micros_max: stats
                .snapshot_shared_apply_cpu_micros_max
                .load(Ordering::Relaxed),
            snapshot_shared_apply_micros_max: stats
                .snapshot_shared_apply_micros_max
                .load(Ordering::Relaxed),
            snapshot_shared_applies_over_10ms: stats
                .snapshot_shared_applies_over_10ms
                .load(Ordering::Relaxed),
            snapshot_shared_applies: stats.snapshot_shared_applies.load(Ordering::Relaxed),
            snapshot_pause_less_core_wait_micros_max: stats
                .snapshot_pause_less_core_wait_micros_max
                .load(Ordering::Relaxed),
            snapshot_pauses_less_core_wait_over_10ms: stats
                .snapshot_pauses_less_core_wait_over_10ms
                .load(Ordering::Relaxed),
            snapshot_shared_apply_less_core_wait_micros_max: stats
                .snapshot_shared_apply_less_core_wait_micros_max
                .load(Ordering::Relaxed),
            snapshot_shared_applies_less_core_wait_over_10ms: stats
                .snapshot_shared_applies_less_core_wait_over_10ms
                .load(Ordering::Relaxed),
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::time::Duration;

    use openraft::entry::RaftEntry;
    use openraft::storage::RaftLogStorage;
    use openraft::testing::log_id;
    use openraft::type_config::TypeConfigExt;
    use tempfile::TempDir;
    use tenure_core::{Command, Entry};

    use super::*;
    use crate::LogEntry;

    const WAIT: Duration = Duration::from_secs(20);

    fn entry(index: u64) -> LogEntry {
        LogEntry::new_normal(
            log_id::<TenureRaft>(1, 0, index),
            Entry {
                log_time_ms: index,
                command: Command::Expire { leases_max: 1 },
            },
        )
    }

    type Flushed =
        openraft::type_config::alias::OneshotReceiverOf<TenureRaft, Result<(), io::Error>>;

    async fn append(node: &NodeStorage, group: u32, index: u64) -> Flushed {
        let (tx, rx) = TenureRaft::oneshot();
        node.log_store(group)
            .append([entry(index)], IOFlushed::signal(tx))
            .await
            .unwrap();
        rx
    }

    async fn flushed(rx: Flushed) -> Result<(), io::Error> {
        tokio::time::timeout(WAIT, rx)
            .await
            .expect("the flusher answers in time")
            .expect("flusher alive")
    }

    /// fsyncgate: after a WAL sync fails, the kernel may have dropped the pages it could not
    /// write, so a later sync can succeed without them. Group 2's append was written before the
    /// failure but its callback waits for the next sync: that sync must not acknowledge it, and
    /// nothing after it either, until the node restarts.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_wal_sync_is_sticky_and_no_later_sync_acknowledges_anything() {
        let dir = TempDir::new().unwrap();
        let node = NodeStorage::open(dir.path(), StorageOptions::default()).unwrap();
        let (events_tx, mut events) = tokio::sync::mpsc::unbounded_channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let release_rx = Mutex::new(release_rx);
        let syncs = AtomicU64::new(0);
        node.shared.inner.set_test_hook(Arc::new(move |step| {
            if step != TestStep::WalSync {
                return Ok(());
            }
            if syncs.fetch_add(1, Ordering::Relaxed) == 0 {
                let _ = events_tx.send(());
                let _ = lock(&release_rx).recv_timeout(WAIT);
                return Err("injected EIO".to_owned());
            }
            Ok(())
        }));

        let first = append(&node, 1, 1).await;
        tokio::time::timeout(WAIT, events.recv())
            .await
            .expect("the first sync starts")
            .unwrap();
        // Written while the first sync runs: its callback waits for the next sync.
        let second = append(&node, 2, 1).await;
        release_tx.send(()).unwrap();

        let first = flushed(first).await;
        assert!(first.is_err(), "the failed sync acknowledged an append");
        let second = flushed(second).await;
        eprintln!("after a failed sync: first {first:?}; second {second:?}");
        let second = second.expect_err("a sync after a failed one acknowledged an append");
        assert!(
            matches!(
                StoreError::from_io(&second),
                Some(StoreError::SyncFailed { .. })
            ),
            "{second}"
        );

        // Every later append and synced write is refused with the same typed error.
        let (tx, _rx) = TenureRaft::oneshot();
        let refused = node
            .log_store(3)
            .append([entry(1)], IOFlushed::signal(tx))
            .await
            .unwrap_err();
        assert!(
            matches!(
                StoreError::from_io(&refused),
                Some(StoreError::SyncFailed { .. })
            ),
            "{refused}"
        );
        let vote = openraft::Vote::new(2, 1);
        let refused = node.log_store(4).save_vote(&vote).await.unwrap_err();
        assert!(
            matches!(
                StoreError::from_io(&refused),
                Some(StoreError::SyncFailed { .. })
            ),
            "{refused}"
        );
        assert!(node.node_failure().is_some());

        // A restart (reopening the store) is the way back.
        drop(node);
        let node = NodeStorage::open(dir.path(), StorageOptions::default()).unwrap();
        flushed(append(&node, 3, 1).await).await.unwrap();
    }
}
