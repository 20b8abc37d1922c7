//! The state machine of one group replica: tenure-core's lease state, applied through openraft.
//!
//! The lease state lives in memory (that is what makes apply fast); its durable form is the
//! latest snapshot file plus the log after it. The *applied position that survives a restart* is
//! therefore the snapshot's last log id, persisted (synced) in the state column family together
//! with the snapshot's file name, size and checksum; on open, the state is restored from that file
//! and openraft re-applies the committed log after it.
//!
//! Snapshots use tenure-core's format, written and read as a stream straight to and from the file
//! (never a second copy of the file in memory; while a build writes, the chunks apply writes to
//! are held twice, copy-on-write). The state is frozen (`LeaseStateMachine::freeze`:
//! copy-on-write chunks, so it costs a pointer per chunk plus the small parts it copies) when
//! openraft asks for a builder, which it does on its state machine worker, the task that applies,
//! between two entries; the build then writes the frozen copy on a thread of its own while apply
//! goes on. A write to a chunk the frozen copy still shares copies that chunk first, inside that
//! apply. So the build's thread takes the state lock only to read and set the current snapshot's
//! pointer, never for the freeze: a builder thread that lost its core while holding the lock for
//! the freeze stopped apply for tens of ms on this machine (205 ms once at 10M leases, README).
//! Each freeze's time is recorded in the node's [`StorageStats`] (wall time, the thread's CPU
//! time, and wall time less the thread's wait for a core: `PauseClocks`), with the longest and
//! those over 10 ms (issue 25: builds used to hold the lock for the whole write, about 0.45 s
//! per million leases), and so is every entry's apply while a frozen copy is alive (the chunk
//! copies), with the longest and those over 10 ms.
//!
//! openraft builds snapshots in a task of their own, so a build can overlap an install of the
//! leader's snapshot. Three rules keep the durable pointer naming a file that exists and a state
//! at least as new as any acknowledged before: one snapshot operation at a time per group (an
//! exclusion held by build, install and open from start to end); a pointer never replaced by an
//! older one (a build with nothing newer to write answers with the current snapshot; an install
//! not newer than the current snapshot, or a pointer older than the saved one, is refused); and
//! temporary files named after the operation that writes them, which deletes its own on failure,
//! while the clean-up of stale files runs only under the exclusion.

use std::fs::{self, File};
use std::io::{self, BufReader, BufWriter, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures_util::{Stream, TryStreamExt};
use openraft::alias::{LogIdOf, SnapshotMetaOf, SnapshotOf, StoredMembershipOf};
use openraft::entry::RaftEntry;
use openraft::storage::{EntryResponder, RaftSnapshotBuilder, RaftStateMachine};
use openraft::{EntryPayload, OptionalSend};
use serde::{Deserialize, Serialize};
use tenure_core::{FrozenState, GroupId, LeaseStateMachine, StateOptions};

use crate::TenureRaft;
use crate::backend::{Batch, Cf};
use crate::codec::{self, STATE_SNAPSHOT};
use crate::error::StoreError;
use crate::node::{NodeStorage, Shared, StorageStats, TestStep, blocking};

/// Where the current snapshot of a group is, as recorded in the state column family.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct SnapshotPointer {
    meta: SnapshotMetaOf<TenureRaft>,
    file: String,
    bytes: u64,
    checksum: u64,
}

struct MachineState {
    leases: LeaseStateMachine,
    last_applied: Option<LogIdOf<TenureRaft>>,
    membership: StoredMembershipOf<TenureRaft>,
    current: Option<SnapshotPointer>,
}

/// Sees what every entry this replica applies produced (as leader or follower, in log order),
/// right after the state's lock is released: the server answers queued waits from it. It runs
/// on the apply path, so it must return quickly and never block. Entries a snapshot install
/// skips are never seen (a waiter parked across one is answered by its retry).
pub trait ApplyObserver: Send + Sync {
    /// The entry at log index `index` of `group` was applied: with the entry and what applying
    /// it produced for a command, `None` for a blank or membership entry. Called for every
    /// applied index in order (a snapshot install skips indexes: the next call's index jumps).
    fn applied(
        &self,
        group: u32,
        index: u64,
        applied: Option<(&tenure_core::Entry, &tenure_core::ApplyOutput)>,
    );
}

/// The state machine of one group replica. Clones share the state.
#[derive(Clone)]
pub struct GroupStateMachine {
    shared: Arc<Shared>,
    group: u32,
    options: StateOptions,
    state: Arc<Mutex<MachineState>>,
    observer: Option<Arc<dyn ApplyObserver>>,
    /// Frozen copies of this group's state alive (a build writing one): while there is one, a
    /// write to a chunk it shares copies the chunk inside apply, so apply is timed.
    frozen_copies: Arc<AtomicU32>,
}

/// Counts a frozen copy alive for as long as it lives (every exit of a build).
struct FrozenCopyAlive(Arc<AtomicU32>);

impl FrozenCopyAlive {
    fn new(count: &Arc<AtomicU32>) -> Self {
        count.fetch_add(1, Ordering::AcqRel);
        FrozenCopyAlive(Arc::clone(count))
    }
}

impl Drop for FrozenCopyAlive {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl std::fmt::Debug for GroupStateMachine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupStateMachine")
            .field("group", &self.group)
            .finish()
    }
}

fn lock(state: &Mutex<MachineState>) -> MutexGuard<'_, MachineState> {
    state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub(crate) fn snapshot_dir(data_dir: &Path, group: u32) -> PathBuf {
    data_dir.join("snapshots").join(format!("group-{group:05}"))
}

fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

impl NodeStorage {
    /// Opens the state machine of one group: restores the latest snapshot, if any.
    pub fn state_machine(
        &self,
        group: u32,
        options: StateOptions,
    ) -> Result<GroupStateMachine, StoreError> {
        GroupStateMachine::open(Arc::clone(&self.shared), group, options)
    }
}

impl GroupStateMachine {
    fn open(shared: Arc<Shared>, group: u32, options: StateOptions) -> Result<Self, StoreError> {
        let inner = &shared.inner;
        inner.check_group(group)?;
        let dir = snapshot_dir(&inner.data_dir, group);
        fs::create_dir_all(&dir).map_err(|err| StoreError::Io {
            group,
            operation: "create snapshot dir",
            detail: err.to_string(),
        })?;
        // Under the group's snapshot exclusion: no build or install of this group runs while the
        // pointer is read and leftovers are cleared.
        let exclusion = inner.snapshot_exclusion(group);
        let _exclusive = lock_exclusion(&exclusion);
        let pointer = read_pointer(inner, group).map_err(|err| inner.stop_group(group, err))?;
        let state = match pointer {
            None => MachineState {
                leases: LeaseStateMachine::new(GroupId(group), options),
                last_applied: None,
                membership: StoredMembershipOf::<TenureRaft>::default(),
                current: None,
            },
            Some(pointer) => {
                let path = dir.join(&pointer.file);
                let leases = read_snapshot_file(group, &path, options, Some(&pointer))
                    .map_err(|err| inner.stop_group(group, err))?;
                MachineState {
                    leases,
                    last_applied: pointer.meta.last_log_id,
                    membership: pointer.meta.last_membership.clone(),
                    current: Some(pointer),
                }
            }
        };
        // Files a crash left behind: temporary files, and snapshots whose pointer was never saved.
        remove_stale_except(&dir, state.current.as_ref().map(|p| p.file.as_str()));
        Ok(GroupStateMachine {
            shared,
            group,
            options,
            state: Arc::new(Mutex::new(state)),
            observer: None,
            frozen_copies: Arc::new(AtomicU32::new(0)),
        })
    }

    /// The same replica, with `observer` seeing every entry it applies. Set it before the Raft
    /// of the group starts (openraft applies through its own clone).
    pub fn with_apply_observer(mut self, observer: Arc<dyn ApplyObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// The group.
    pub fn group(&self) -> u32 {
        self.group
    }

    /// Runs `f` on the lease state with the log index it has applied through (0 before any
    /// entry): a read that must name the exact index it saw (a watch's starting point).
    pub fn with_leases_at_index<T>(&self, f: impl FnOnce(&LeaseStateMachine, u64) -> T) -> T {
        let state = lock(&self.state);
        let index = state.last_applied.as_ref().map_or(0, |id| id.index());
        f(&state.leases, index)
    }

    /// Runs `f` on the lease state (queries: get, list, stats, next expiry).
    pub fn with_leases<T>(&self, f: impl FnOnce(&LeaseStateMachine) -> T) -> T {
        f(&lock(&self.state).leases)
    }

    /// Runs `f` on the lease state when no one else holds it (apply, a snapshot's freeze),
    /// else returns `None` at once: for callers on a request path that may skip their work
    /// rather than block a runtime thread.
    pub fn try_with_leases<T>(&self, f: impl FnOnce(&LeaseStateMachine) -> T) -> Option<T> {
        match self.state.try_lock() {
            Ok(state) => Some(f(&state.leases)),
            Err(std::sync::TryLockError::Poisoned(poisoned)) => {
                Some(f(&poisoned.into_inner().leases))
            }
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// Runs `f` on the lease state and the last log id applied, read together (a simulation
    /// compares replicas at equal applied indexes).
    pub fn with_applied_leases<T>(
        &self,
        f: impl FnOnce(Option<&LogIdOf<TenureRaft>>, &LeaseStateMachine) -> T,
    ) -> T {
        let state = lock(&self.state);
        f(state.last_applied.as_ref(), &state.leases)
    }

    /// The last log id applied.
    pub fn last_applied(&self) -> Option<LogIdOf<TenureRaft>> {
        lock(&self.state).last_applied
    }

    fn dir(&self) -> PathBuf {
        snapshot_dir(&self.shared.inner.data_dir, self.group)
    }

    /// Freezes the state for a build (see [`FrozenForBuild`]). Normally called on the apply
    /// task, between two entries (openraft asks for a builder from its state machine worker, the
    /// task that applies; also at start, before the group serves): the freeze stops this group's
    /// apply for its own length only (a pointer per chunk), and no other thread holds the state
    /// lock for it. The time from asking for the lock to releasing it is recorded as the build's
    /// apply pause, in wall time, thread CPU time and wall time less the thread's wait for a
    /// core, whatever the build then does.
    fn freeze_for_build(&self) -> GroupSnapshotBuilder {
        let clocks = PauseClocks::start();
        let state = lock(&self.state);
        let frozen = if let Some(current) = &state.current
            && current.meta.last_log_id >= state.last_applied
        {
            // Nothing newer than the current snapshot: the build answers with it.
            None
        } else {
            Some(FrozenForBuild {
                meta: SnapshotMetaOf::<TenureRaft> {
                    last_log_id: state.last_applied,
                    last_membership: state.membership.clone(),
                },
                leases: state.leases.freeze(),
                alive: FrozenCopyAlive::new(&self.frozen_copies),
            })
        };
        drop(state);
        let stopped = Instant::now();
        if frozen.is_some() {
            record_freeze(&self.shared.inner.stats, clocks.stop_at(stopped));
        }
        GroupSnapshotBuilder {
            machine: self.clone(),
            frozen,
        }
    }

    /// Writes a frozen state to a new snapshot file and makes it current (blocking). Holds the
    /// group's snapshot exclusion throughout, so no install runs meanwhile. If the current
    /// snapshot is at least as new as the frozen state (nothing was applied since it, or an
    /// install of the leader's snapshot finished between the freeze and now), that snapshot is
    /// the answer: the pointer never goes back.
    fn build_blocking(
        &self,
        frozen: Option<FrozenForBuild>,
    ) -> Result<(SnapshotPointer, File), StoreError> {
        let inner = &self.shared.inner;
        let exclusion = inner.snapshot_exclusion(self.group);
        let _exclusive = lock_exclusion(&exclusion);
        inner.check_group(self.group)?;
        let dir = self.dir();
        let io_error = |operation: &'static str| {
            let group = self.group;
            move |err: io::Error| StoreError::Io {
                group,
                operation,
                detail: err.to_string(),
            }
        };
        let build_started = Instant::now();
        let current = lock(&self.state).current.clone();
        if let Some(current) = current
            && frozen
                .as_ref()
                .is_none_or(|frozen| current.meta.last_log_id >= frozen.meta.last_log_id)
        {
            let file = File::open(dir.join(&current.file)).map_err(io_error("open snapshot"))?;
            return Ok((current, file));
        }
        // A builder freezes nothing only when a current snapshot exists, and `current` is only
        // ever replaced by a newer one, so this is never `None`.
        let Some(frozen) = frozen else {
            return Err(StoreError::Snapshot {
                group: self.group,
                file: String::new(),
                detail: "the current snapshot vanished between freeze and build".to_owned(),
            });
        };
        let FrozenForBuild {
            meta,
            leases: frozen,
            alive: frozen_alive,
        } = frozen;
        let _ = inner.test_step(TestStep::BuildFrozen);
        let stem = snapshot_stem(&meta);
        let temp = TempFile::new(&dir, &stem, inner.next_snapshot_op(), "tmp");
        let file = File::create(temp.path()).map_err(io_error("create snapshot"))?;
        let mut writer = BufWriter::with_capacity(1 << 20, file);
        let stats = frozen
            .write_snapshot(&mut writer)
            .map_err(|err| StoreError::Snapshot {
                group: self.group,
                file: temp.path().display().to_string(),
                detail: err.to_string(),
            })?;
        // The chunks the frozen copy shared go back to the live state alone.
        drop(frozen);
        drop(frozen_alive);
        let file = writer
            .into_inner()
            .map_err(|err| io_error("write snapshot")(err.into_error()))?;
        file.sync_all().map_err(io_error("sync snapshot"))?;
        drop(file);
        let name = format!("{stem}.snap");
        temp.rename_to(&dir.join(&name))
            .map_err(io_error("rename snapshot"))?;
        fsync_dir(&dir).map_err(io_error("sync snapshot dir"))?;
        let _ = inner.test_step(TestStep::BuildWritten);
        let pointer = SnapshotPointer {
            meta,
            file: name,
            bytes: stats.bytes,
            checksum: stats.checksum,
        };
        self.save_pointer(&pointer)?;
        // Only build and install set `current`, both under the snapshot exclusion held here, so
        // nothing changed it since the check above.
        lock(&self.state).current = Some(pointer.clone());
        record_build(&inner.stats, build_started.elapsed(), stats.bytes);
        remove_stale(&dir, &pointer);
        let file = File::open(dir.join(&pointer.file)).map_err(io_error("open snapshot"))?;
        Ok((pointer, file))
    }

    /// Saves `pointer` as the group's durable snapshot pointer (synced). Refuses one older than
    /// the pointer already saved: the durable applied position never goes backwards. Callers hold
    /// the group's snapshot exclusion.
    fn save_pointer(&self, pointer: &SnapshotPointer) -> Result<(), StoreError> {
        let inner = &self.shared.inner;
        if let Some(saved) = read_pointer(inner, self.group)?
            && saved.meta.last_log_id > pointer.meta.last_log_id
        {
            return Err(StoreError::Snapshot {
                group: self.group,
                file: pointer.file.clone(),
                detail: format!(
                    "refusing to replace the saved snapshot pointer ({}) with an older one",
                    saved.file
                ),
            });
        }
        let bytes = codec::encode(pointer).map_err(|err| StoreError::Io {
            group: self.group,
            operation: "encode snapshot pointer",
            detail: err.to_string(),
        })?;
        let mut batch = Batch::default();
        batch.put(
            Cf::State,
            codec::tagged_key(self.group, STATE_SNAPSHOT),
            bytes,
        );
        inner.write_synced(self.group, batch, "save snapshot pointer")
    }

    /// Installs a snapshot received from the leader (blocking): copies it into this group's
    /// directory, validates it completely, then makes it current and replaces the state. Holds
    /// the group's snapshot exclusion throughout, so no build runs meanwhile.
    fn install_blocking(
        &self,
        meta: SnapshotMetaOf<TenureRaft>,
        mut incoming: File,
    ) -> Result<(), StoreError> {
        let inner = &self.shared.inner;
        let _ = inner.test_step(TestStep::InstallWaits);
        let exclusion = inner.snapshot_exclusion(self.group);
        let _exclusive = lock_exclusion(&exclusion);
        inner.check_group(self.group)?;
        let dir = self.dir();
        let group = self.group;
        let io_error = |operation: &'static str| {
            move |err: io::Error| StoreError::Io {
                group,
                operation,
                detail: err.to_string(),
            }
        };
        let current = lock(&self.state).current.clone();
        if let Some(current) = current
            && current.meta.last_log_id >= meta.last_log_id
        {
            // openraft installs only snapshots past what is committed here, so this is a
            // confused caller; taking it would move the durable applied position back.
            return Err(StoreError::Snapshot {
                group,
                file: snapshot_stem(&meta),
                detail: format!(
                    "refusing to install a snapshot not newer than the current one ({})",
                    current.file
                ),
            });
        }
        let stem = snapshot_stem(&meta);
        let temp = TempFile::new(&dir, &stem, inner.next_snapshot_op(), "installing");
        incoming
            .rewind()
            .map_err(io_error("rewind incoming snapshot"))?;
        let mut file = File::create(temp.path()).map_err(io_error("create snapshot"))?;
        let bytes = io::copy(&mut incoming, &mut file).map_err(io_error("copy snapshot"))?;
        file.sync_all().map_err(io_error("sync snapshot"))?;
        drop(file);
        // A bad incoming snapshot is the sender's problem; this group's data is intact (the
        // temporary file goes with `temp`).
        let leases = read_snapshot_file(group, temp.path(), self.options, None)?;
        let name = format!("{stem}.snap");
        temp.rename_to(&dir.join(&name))
            .map_err(io_error("rename snapshot"))?;
        fsync_dir(&dir).map_err(io_error("sync snapshot dir"))?;
        let checksum =
            trailer_checksum(&dir.join(&name)).map_err(io_error("read snapshot checksum"))?;
        let pointer = SnapshotPointer {
            meta: meta.clone(),
            file: name,
            bytes,
            checksum,
        };
        self.save_pointer(&pointer)?;
        let mut state = lock(&self.state);
        state.leases = leases;
        state.last_applied = meta.last_log_id;
        state.membership = meta.last_membership;
        state.current = Some(pointer.clone());
        drop(state);
        remove_stale(&dir, &pointer);
        Ok(())
    }
}

/// The calling thread's CPU time so far (`CLOCK_THREAD_CPUTIME_ID`): unlike wall time, it does
/// not grow while the thread waits for a core.
fn thread_cpu_time() -> Duration {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(
        u64::try_from(now.tv_sec).unwrap_or(0),
        u32::try_from(now.tv_nsec).unwrap_or(0),
    )
}

/// The time the calling thread has spent runnable but waiting for a core so far (the second
/// field of Linux's `/proc/thread-self/schedstat`, nanoseconds), or `None` where the kernel does
/// not say (no procfs, or the file could not be opened: then never again on this thread). The
/// file stays open per thread (each read regenerates it), so a reading is one `pread`.
fn thread_core_wait() -> Option<Duration> {
    use std::os::unix::fs::FileExt;
    thread_local! {
        static SCHEDSTAT: Option<File> = File::open("/proc/thread-self/schedstat").ok();
    }
    SCHEDSTAT
        .try_with(|file| {
            let mut buffer = [0u8; 128];
            let read = file.as_ref()?.read_at(&mut buffer, 0).ok()?;
            parse_schedstat_core_wait(std::str::from_utf8(buffer.get(..read)?).ok()?)
        })
        .ok()
        .flatten()
}

/// The run-queue wait of a `schedstat` line: `<on-cpu ns> <run-queue wait ns> <timeslices>`.
fn parse_schedstat_core_wait(text: &str) -> Option<Duration> {
    let waited_ns = text.split_ascii_whitespace().nth(1)?.parse::<u64>().ok()?;
    Some(Duration::from_nanos(waited_ns))
}

/// Where the applying thread's clocks stood when a pause began: wall, its CPU time and its wait
/// for a core, so a pause can be told apart from the machine's scheduling.
///
/// The CPU clock and the schedstat file are read with system calls, and a thread whose time
/// slice has run out is preempted on the way back from one. Read inside the timed window, they
/// put that preemption there: the freeze (a pointer per chunk) was timed at 11.9-16.5 ms of wall
/// time that way at 1M leases, and at 1.5-5.3 ms with them outside it (README, "Snapshot
/// pauses"). That preemption is the machine's (the slice ran out whatever the thread was doing)
/// and moves, it does not vanish: apply waits for it just before or after the window. And a
/// window that starts right after one begins with a fresh slice, so the wall figure is, if
/// anything, low. Hence the second figure, the pause less the thread's wait for a core, which
/// does not depend on where the preemption lands: the wait read at the start can include a
/// preemption at the start's readings, so it is taken off a wall time that includes them
/// (`outer`), and the stop's readings come after the stop's wall time (`stop_at`).
struct PauseClocks {
    outer: Instant,
    core_wait: Option<Duration>,
    cpu: Duration,
    wall: Instant,
}

/// How long a pause took: wall time, the thread's CPU time in it, and the thread's wait for a
/// core over `outer_wall` (`None` where the kernel does not say).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PauseTimes {
    /// From the start to the stop, the clocks' own readings excluded.
    wall: Duration,
    cpu: Duration,
    core_wait: Option<Duration>,
    /// `wall` plus the readings of the clocks at the start, the span `core_wait` was taken over.
    outer_wall: Duration,
}

impl PauseTimes {
    /// The pause without the wait for a core: what the snapshot itself cost apply (the work,
    /// and any wait for the lock), whatever else the machine's cores were busy with; never more
    /// than `wall`, and never less than the true figure (the start's readings are counted in
    /// it). `None` where the kernel does not report the wait.
    fn less_core_wait(&self) -> Option<Duration> {
        let core_wait = self.core_wait?;
        Some(self.outer_wall.saturating_sub(core_wait).min(self.wall))
    }
}

impl PauseClocks {
    fn start() -> Self {
        // Fields are evaluated in the order written.
        PauseClocks {
            outer: Instant::now(),
            core_wait: thread_core_wait(),
            cpu: thread_cpu_time(),
            wall: Instant::now(),
        }
    }

    /// The pause from the start to `stopped` (an `Instant` taken when it ended: the readings
    /// here may come later, out of a lock), on the same thread as the start.
    fn stop_at(&self, stopped: Instant) -> PauseTimes {
        let wall = stopped.saturating_duration_since(self.wall);
        let outer_wall = stopped.saturating_duration_since(self.outer);
        // A preemption on the way back from these readings lands after `stopped`, so in no
        // figure. A wait between `stopped` and the reading (an interrupt, a preemption inside
        // the read) is counted in the wait but not in `outer_wall`: the clamp keeps it from
        // exceeding the span, and the figure less the wait is then low by that much.
        let core_wait = match (self.core_wait, thread_core_wait()) {
            (Some(before), Some(after)) => Some(after.saturating_sub(before).min(outer_wall)),
            _ => None,
        };
        let cpu = thread_cpu_time().saturating_sub(self.cpu);
        PauseTimes {
            wall,
            cpu,
            core_wait,
            outer_wall,
        }
    }
}

/// Whole microseconds of `d` (saturating), as the storage statistics count time.
fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Counts a finished build in the node's storage statistics (its freeze is counted by
/// [`record_freeze`]).
fn record_build(stats: &StorageStats, took: Duration, bytes: u64) {
    stats.snapshot_builds.fetch_add(1, Ordering::Relaxed);
    stats
        .snapshot_build_micros
        .fetch_add(micros(took), Ordering::Relaxed);
    stats
        .snapshot_build_micros_max
        .fetch_max(micros(took), Ordering::Relaxed);
    stats.snapshot_bytes.fetch_add(bytes, Ordering::Relaxed);
    stats.snapshot_bytes_max.fetch_max(bytes, Ordering::Relaxed);
}

/// Counts a freeze for a build: how long it stopped the group's apply, in wall time, the
/// applying thread's CPU time (which also counts interrupts handled on that thread) and the wall
/// time less the thread's wait for a core.
fn record_freeze(stats: &StorageStats, pause: PauseTimes) {
    stats
        .snapshot_pause_cpu_micros_max
        .fetch_max(micros(pause.cpu), Ordering::Relaxed);
    record_longest_and_over_budget(
        &stats.snapshot_pause_micros_max,
        &stats.snapshot_pauses_over_10ms,
        pause.wall,
    );
    if let Some(less_core_wait) = pause.less_core_wait() {
        record_longest_and_over_budget(
            &stats.snapshot_pause_less_core_wait_micros_max,
            &stats.snapshot_pauses_less_core_wait_over_10ms,
            less_core_wait,
        );
    }
}

/// Counts an entry applied while a frozen copy of its group was alive (wall time, CPU time, and
/// wall time less the thread's wait for a core).
fn record_shared_apply(stats: &StorageStats, took: PauseTimes) {
    stats
        .snapshot_shared_apply_cpu_micros_max
        .fetch_max(micros(took.cpu), Ordering::Relaxed);
    stats
        .snapshot_shared_applies
        .fetch_add(1, Ordering::Relaxed);
    record_longest_and_over_budget(
        &stats.snapshot_shared_apply_micros_max,
        &stats.snapshot_shared_applies_over_10ms,
        took.wall,
    );
    if let Some(less_core_wait) = took.less_core_wait() {
        record_longest_and_over_budget(
            &stats.snapshot_shared_apply_less_core_wait_micros_max,
            &stats.snapshot_shared_applies_less_core_wait_over_10ms,
            less_core_wait,
        );
    }
}

/// Keeps the longest of a kind of pause (microseconds) and counts those over the 10 ms budget.
fn record_longest_and_over_budget(
    longest_micros: &AtomicU64,
    over_budget: &AtomicU64,
    took: Duration,
) {
    longest_micros.fetch_max(micros(took), Ordering::Relaxed);
    if took > SNAPSHOT_PAUSE_BUDGET {
        over_budget.fetch_add(1, Ordering::Relaxed);
    }
}

/// The longest a build may stop a group's apply (issue 25): longer pauses are counted.
const SNAPSHOT_PAUSE_BUDGET: Duration = Duration::from_millis(10);

/// The file name stem of a snapshot: its last log id.
fn snapshot_stem(meta: &SnapshotMetaOf<TenureRaft>) -> String {
    match &meta.last_log_id {
        Some(id) => format!("snap-{:020}-{}", id.index(), id.committed_leader_id()),
        None => "snap-none".to_owned(),
    }
}

/// Reads a group's durable snapshot pointer.
fn read_pointer(
    inner: &crate::node::Inner,
    group: u32,
) -> Result<Option<SnapshotPointer>, StoreError> {
    inner
        .get(Cf::State, &codec::tagged_key(group, STATE_SNAPSHOT))
        .map_err(|detail| StoreError::Io {
            group,
            operation: "read snapshot pointer",
            detail,
        })?
        .map(|bytes| {
            codec::decode::<SnapshotPointer>(&bytes).map_err(|source| StoreError::Corrupt {
                group,
                what: "snapshot pointer".to_owned(),
                source,
            })
        })
        .transpose()
}

fn lock_exclusion(exclusion: &Mutex<()>) -> MutexGuard<'_, ()> {
    exclusion
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A temporary snapshot file owned by one build or install: its name carries the operation's
/// number, so no two operations ever write the same file, and it is deleted when the operation
/// ends without renaming it into place.
struct TempFile {
    path: Option<PathBuf>,
}

impl TempFile {
    fn new(dir: &Path, stem: &str, op: u64, suffix: &str) -> Self {
        TempFile {
            path: Some(dir.join(format!("{stem}.op{op}.{suffix}"))),
        }
    }

    fn path(&self) -> &Path {
        self.path.as_deref().unwrap_or_else(|| Path::new(""))
    }

    /// Moves the file into place; from now on it is no longer temporary.
    fn rename_to(mut self, target: &Path) -> io::Result<()> {
        let Some(path) = self.path.take() else {
            return Err(io::Error::other("temporary snapshot file already moved"));
        };
        match fs::rename(&path, target) {
            Ok(()) => Ok(()),
            Err(err) => {
                self.path = Some(path);
                Err(err)
            }
        }
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(path) = self.path.take() {
            let _ = fs::remove_file(path);
        }
    }
}

/// Deletes every snapshot file of the group but `current`, and leftovers of operations that a
/// crash interrupted. Callers hold the group's snapshot exclusion, so no other build or install
/// of the group is in flight in this process, and no other process has the data directory open
/// (RocksDB's lock): no file deleted here belongs to a live operation.
fn remove_stale(dir: &Path, current: &SnapshotPointer) {
    remove_stale_except(dir, Some(current.file.as_str()));
}

fn remove_stale_except(dir: &Path, current: Option<&str>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let ours = name.starts_with("snap-")
            && (name.ends_with(".snap") || name.ends_with(".tmp") || name.ends_with(".installing"));
        if ours && Some(name.as_ref()) != current {
            let _ = fs::remove_file(entry.path());
        }
    }
}

/// The checksum a snapshot file ends with (its last 8 bytes, little-endian).
fn trailer_checksum(path: &Path) -> io::Result<u64> {
    let mut file = File::open(path)?;
    file.seek(SeekFrom::End(-8))?;
    let mut bytes = [0u8; 8];
    file.read_exact(&mut bytes)?;
    Ok(u64::from_le_bytes(bytes))
}

fn read_snapshot_file(
    group: u32,
    path: &Path,
    options: StateOptions,
    pointer: Option<&SnapshotPointer>,
) -> Result<LeaseStateMachine, StoreError> {
    let bad = |detail: String| StoreError::Snapshot {
        group,
        file: path.display().to_string(),
        detail,
    };
    let file = File::open(path).map_err(|err| bad(err.to_string()))?;
    if let Some(pointer) = pointer {
        let len = file.metadata().map_err(|err| bad(err.to_string()))?.len();
        if len != pointer.bytes {
            return Err(bad(format!(
                "{len} bytes, the pointer says {}",
                pointer.bytes
            )));
        }
    }
    let leases = LeaseStateMachine::read_snapshot(BufReader::with_capacity(1 << 20, file), options)
        .map_err(|err| bad(err.to_string()))?;
    if leases.group_id() != GroupId(group) {
        return Err(bad(format!("belongs to group {}", leases.group_id())));
    }
    Ok(leases)
}

/// A group's state frozen for one snapshot build, with what the snapshot's metadata says.
struct FrozenForBuild {
    meta: SnapshotMetaOf<TenureRaft>,
    leases: FrozenState,
    /// Counts the frozen copy as alive (applies beside it are timed) until the build drops it.
    alive: FrozenCopyAlive,
}

/// Builds one snapshot of one group: the state was frozen when openraft asked for the builder
/// (on the apply task), and the build writes that frozen copy while apply goes on.
pub struct GroupSnapshotBuilder {
    machine: GroupStateMachine,
    /// `None` when nothing was applied since the current snapshot. Taken by the first build.
    frozen: Option<FrozenForBuild>,
}

impl RaftSnapshotBuilder<TenureRaft> for GroupSnapshotBuilder {
    type SnapshotData = File;

    async fn build_snapshot(&mut self) -> Result<SnapshotOf<TenureRaft, File>, io::Error> {
        let machine = self.machine.clone();
        let frozen = self.frozen.take();
        let (pointer, file) = blocking(&self.machine.shared.inner, move || {
            machine.build_blocking(frozen)
        })
        .await?;
        Ok(SnapshotOf::<TenureRaft, File> {
            meta: pointer.meta,
            snapshot: file,
        })
    }
}

impl RaftStateMachine<TenureRaft> for GroupStateMachine {
    type SnapshotData = File;
    type SnapshotBuilder = GroupSnapshotBuilder;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogIdOf<TenureRaft>>, StoredMembershipOf<TenureRaft>), io::Error> {
        self.shared.inner.check_group(self.group)?;
        let state = lock(&self.state);
        Ok((state.last_applied, state.membership.clone()))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> Result<(), io::Error>
    where
        Strm: Stream<Item = Result<EntryResponder<TenureRaft>, io::Error>> + Unpin + OptionalSend,
    {
        self.shared.inner.check_group(self.group)?;
        while let Some((entry, responder)) = entries.try_next().await? {
            let index = entry.log_id().index();
            let mut shared_apply = None;
            let response = {
                let mut state = lock(&self.state);
                let log_id = entry.log_id();
                // Invariant: the applied index only grows. Applying an entry twice, or out of
                // order, would grant twice and break the replicas' agreement; the node stops.
                assert!(
                    state
                        .last_applied
                        .as_ref()
                        .is_none_or(|last| log_id.index() > last.index()),
                    "applied index would not grow: group {} applied {:?}, next {log_id:?}",
                    self.group,
                    state.last_applied
                );
                // Negative control (test builds only): a new leader term resets the tokens.
                if state
                    .last_applied
                    .as_ref()
                    .is_some_and(|last| last.committed_leader_id() != log_id.committed_leader_id())
                {
                    state.leases.negative_control_new_term();
                }
                let response = match &entry.payload {
                    EntryPayload::Blank => None,
                    EntryPayload::Normal(proposal) => {
                        // Timed only while a frozen copy is alive (its chunk copies land here).
                        let clocks = (self.frozen_copies.load(Ordering::Acquire) > 0)
                            .then(PauseClocks::start);
                        let output = state.leases.apply(proposal);
                        // Ended here; the clocks are read once the lock is released.
                        shared_apply = clocks.map(|clocks| (clocks, Instant::now()));
                        Some(output)
                    }
                    EntryPayload::Membership(membership) => {
                        state.membership =
                            StoredMembershipOf::<TenureRaft>::new(Some(log_id), membership.clone());
                        None
                    }
                };
                state.last_applied = Some(log_id);
                response
            };
            if let Some((clocks, stopped)) = shared_apply {
                record_shared_apply(&self.shared.inner.stats, clocks.stop_at(stopped));
            }
            if let Some(observer) = &self.observer {
                let applied = match (&entry.payload, &response) {
                    (EntryPayload::Normal(proposal), Some(output)) => Some((proposal, output)),
                    _ => None,
                };
                observer.applied(self.group, index, applied);
            }
            if let Some(responder) = responder {
                responder.send(response);
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.freeze_for_build()
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMetaOf<TenureRaft>,
        snapshot: File,
    ) -> Result<(), io::Error> {
        let machine = self.clone();
        let meta = meta.clone();
        blocking(&self.shared.inner, move || {
            machine.install_blocking(meta, snapshot)
        })
        .await
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<SnapshotOf<TenureRaft, File>>, io::Error> {
        self.shared.inner.check_group(self.group)?;
        // Opened under the state lock: a build or install replaces `current` under it and deletes
        // the file it replaced only afterwards, so the file named here still exists.
        let state = lock(&self.state);
        let Some(pointer) = state.current.clone() else {
            return Ok(None);
        };
        let path = self.dir().join(&pointer.file);
        let file = File::open(&path).map_err(|err| StoreError::Snapshot {
            group: self.group,
            file: path.display().to_string(),
            detail: err.to_string(),
        })?;
        drop(state);
        Ok(Some(SnapshotOf::<TenureRaft, File> {
            meta: pointer.meta,
            snapshot: file,
        }))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::sync::mpsc;
    use std::time::Duration;

    use openraft::testing::log_id;
    use tempfile::TempDir;
    use tenure_core::{AcquireRequest, Command, Entry, LeaseOp, ResourceKey};

    use super::*;
    use crate::node::TestHook;
    use crate::{LogEntry, StorageOptions};

    const GROUP: u32 = 7;
    const WAIT: Duration = Duration::from_secs(20);

    fn entries(range: std::ops::RangeInclusive<u64>) -> Vec<LogEntry> {
        range
            .map(|i| {
                LogEntry::new_normal(
                    log_id::<TenureRaft>(1, 0, i),
                    Entry {
                        log_time_ms: 1_000 + i,
                        command: Command::Lease(LeaseOp::Acquire(AcquireRequest {
                            key: ResourceKey::new("acme", format!("r{i}")),
                            holder_id: "holder".to_owned(),
                            ttl_ms: 60_000,
                            request_id: "q".to_owned(),
                        })),
                    },
                )
            })
            .collect()
    }

    async fn apply_all(machine: &mut GroupStateMachine, entries: Vec<LogEntry>) {
        let stream = futures_util::stream::iter(entries.into_iter().map(|e| Ok((e, None))));
        machine.apply(stream).await.unwrap();
    }

    /// The applied-index invariant fires: an entry at or below the last applied index stops the
    /// node (a panic, which `tenure_server::serve::abort_on_panic` turns into an abort).
    #[tokio::test]
    #[should_panic(expected = "applied index would not grow")]
    async fn applying_an_entry_again_breaks_the_applied_index_invariant() {
        let dir = TempDir::new().unwrap();
        let node = NodeStorage::open(dir.path(), StorageOptions::default()).unwrap();
        let mut machine = node.state_machine(GROUP, StateOptions::default()).unwrap();
        apply_all(&mut machine, entries(1..=3)).await;
        apply_all(&mut machine, entries(2..=2)).await;
    }

    /// Waits (bounded) for the next event a hook reported.
    async fn next_event(events: &mut tokio::sync::mpsc::UnboundedReceiver<TestStep>) -> TestStep {
        tokio::time::timeout(WAIT, events.recv())
            .await
            .expect("the operation reached its step in time")
            .expect("hook alive")
    }

    /// A leader's snapshot of entries 1..=40 (its directory, the snapshot, the state's bytes).
    async fn leader_snapshot_at_40() -> (TempDir, SnapshotOf<TenureRaft, File>, Vec<u8>) {
        let leader_dir = TempDir::new().unwrap();
        let leader_node = NodeStorage::open(leader_dir.path(), StorageOptions::default()).unwrap();
        let mut leader = leader_node
            .state_machine(GROUP, StateOptions::default())
            .unwrap();
        apply_all(&mut leader, entries(1..=40)).await;
        let snapshot = leader
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        let bytes = leader.with_leases(LeaseStateMachine::snapshot_to_vec);
        (leader_dir, snapshot, bytes)
    }

    /// Build and install overlap: the build has written its (older) snapshot and waits to make it
    /// current while an install of a newer snapshot from the leader runs as far as it can. Then
    /// the build goes on, both finish, and the replica restarts: it must come back with the
    /// installed state, from a snapshot file that exists.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn snapshot_build_racing_install_does_not_strand_replica() {
        let follower_dir = TempDir::new().unwrap();
        // The leader's snapshot at index 40, which the follower will install.
        let (_leader_dir, incoming, expected) = leader_snapshot_at_40().await;

        {
            let node = NodeStorage::open(follower_dir.path(), StorageOptions::default()).unwrap();
            let mut follower = node.state_machine(GROUP, StateOptions::default()).unwrap();
            // An older snapshot of its own (index 5), then more applied entries (to 10).
            apply_all(&mut follower, entries(1..=5)).await;
            follower
                .get_snapshot_builder()
                .await
                .build_snapshot()
                .await
                .unwrap();
            apply_all(&mut follower, entries(6..=10)).await;

            let (events_tx, mut events) = tokio::sync::mpsc::unbounded_channel();
            let (release_tx, release_rx) = mpsc::channel::<()>();
            let release_rx = Mutex::new(release_rx);
            let hook: TestHook = Arc::new(move |step| {
                // This race is about the build's last step; its freeze is not reported.
                if step != TestStep::BuildFrozen {
                    let _ = events_tx.send(step);
                }
                if step == TestStep::BuildWritten {
                    // The build pauses here until the test lets it go on.
                    let _ = lock_rx(&release_rx).recv_timeout(WAIT);
                }
                Ok(())
            });
            node.shared.inner.set_test_hook(hook);

            let mut builder = follower.get_snapshot_builder().await;
            let build = tokio::spawn(async move { builder.build_snapshot().await });
            assert_eq!(next_event(&mut events).await, TestStep::BuildWritten);

            let mut installer = follower.clone();
            let meta = incoming.meta.clone();
            let install =
                tokio::spawn(
                    async move { installer.install_snapshot(&meta, incoming.snapshot).await },
                );
            assert_eq!(next_event(&mut events).await, TestStep::InstallWaits);
            release_tx.send(()).unwrap();

            let built = tokio::time::timeout(WAIT, build).await.unwrap().unwrap();
            let installed = tokio::time::timeout(WAIT, install).await.unwrap().unwrap();
            eprintln!(
                "build: {:?}; install: {:?}",
                built.as_ref().map(|s| s.meta.last_log_id),
                installed
            );
            installed.unwrap();
            assert_eq!(
                follower.last_applied().map(|id| id.index()),
                Some(40),
                "the installed snapshot is the state"
            );
        }

        // Restart the replica.
        let node = NodeStorage::open(follower_dir.path(), StorageOptions::default()).unwrap();
        let follower = match node.state_machine(GROUP, StateOptions::default()) {
            Ok(follower) => follower,
            Err(err) => panic!("the replica is stranded at restart: {err}"),
        };
        assert_eq!(
            follower.last_applied().map(|id| id.index()),
            Some(40),
            "the durable snapshot pointer went backwards"
        );
        assert_eq!(
            follower.with_leases(LeaseStateMachine::snapshot_to_vec),
            expected
        );
    }

    /// A build writes the state of its freeze while apply goes on: paused between the freeze
    /// and the write, the group applies ten more entries (the state lock is free), those applies
    /// are counted as made beside a frozen copy, and the snapshot holds the frozen state, not
    /// the live one; after the build, applies are no longer counted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_build_writes_its_frozen_state_while_apply_goes_on() {
        let dir = TempDir::new().unwrap();
        let node = NodeStorage::open(dir.path(), StorageOptions::default()).unwrap();
        let mut machine = node.state_machine(GROUP, StateOptions::default()).unwrap();
        apply_all(&mut machine, entries(1..=10)).await;
        let frozen_bytes = machine.with_leases(LeaseStateMachine::snapshot_to_vec);

        let (events_tx, mut events) = tokio::sync::mpsc::unbounded_channel();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let release_rx = Mutex::new(release_rx);
        let hook: TestHook = Arc::new(move |step| {
            let _ = events_tx.send(step);
            if step == TestStep::BuildFrozen {
                let _ = lock_rx(&release_rx).recv_timeout(WAIT);
            }
            Ok(())
        });
        node.shared.inner.set_test_hook(hook);
        let mut builder = machine.get_snapshot_builder().await;
        let build = tokio::spawn(async move { builder.build_snapshot().await });
        assert_eq!(next_event(&mut events).await, TestStep::BuildFrozen);

        // The build holds no lock now: these applies finish while it waits.
        tokio::time::timeout(WAIT, apply_all(&mut machine, entries(11..=20)))
            .await
            .expect("apply goes on while a build writes");
        assert_eq!(node.stats().snapshot_shared_applies, 10);
        release_tx.send(()).unwrap();
        let built = tokio::time::timeout(WAIT, build).await.unwrap().unwrap();
        let built = built.unwrap();
        assert_eq!(built.meta.last_log_id.map(|id| id.index()), Some(10));

        // The file holds the frozen state; the live state went on to 20 entries.
        let mut written = Vec::new();
        let mut file = built.snapshot;
        file.seek(SeekFrom::Start(0)).unwrap();
        file.read_to_end(&mut written).unwrap();
        assert_eq!(written, frozen_bytes);
        assert_eq!(machine.last_applied().map(|id| id.index()), Some(20));
        apply_all(&mut machine, entries(21..=21)).await;
        assert_eq!(
            node.stats().snapshot_shared_applies,
            10,
            "an apply after the build is not counted"
        );
        assert_eq!(node.stats().snapshot_builds, 1);
    }

    /// The freeze happens when openraft asks for the builder (on the apply task), not when the
    /// build runs: entries applied between the two are not in the snapshot. And a builder whose
    /// freeze is older than a snapshot installed before its build runs answers with the
    /// installed snapshot: writing its older state would move the durable pointer back.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_builder_freezes_when_asked_and_never_goes_behind_an_install() {
        let (_leader_dir, incoming, installed_bytes) = leader_snapshot_at_40().await;

        let dir = TempDir::new().unwrap();
        {
            let node = NodeStorage::open(dir.path(), StorageOptions::default()).unwrap();
            let mut machine = node.state_machine(GROUP, StateOptions::default()).unwrap();
            apply_all(&mut machine, entries(1..=10)).await;
            let frozen_bytes = machine.with_leases(LeaseStateMachine::snapshot_to_vec);
            let mut builder = machine.get_snapshot_builder().await;
            apply_all(&mut machine, entries(11..=15)).await;
            assert_eq!(
                node.stats().snapshot_shared_applies,
                5,
                "applies after the freeze run beside the frozen copy"
            );
            let built = builder.build_snapshot().await.unwrap();
            assert_eq!(built.meta.last_log_id.map(|id| id.index()), Some(10));
            let mut written = Vec::new();
            let mut file = built.snapshot;
            file.seek(SeekFrom::Start(0)).unwrap();
            file.read_to_end(&mut written).unwrap();
            assert_eq!(
                written, frozen_bytes,
                "the snapshot holds the state at the freeze"
            );

            // A second builder frozen at 15; the leader's snapshot at 40 is installed first.
            let mut late_builder = machine.get_snapshot_builder().await;
            machine
                .install_snapshot(&incoming.meta, incoming.snapshot)
                .await
                .unwrap();
            let answered = late_builder.build_snapshot().await.unwrap();
            assert_eq!(
                answered.meta.last_log_id.map(|id| id.index()),
                Some(40),
                "a build frozen before an install answers with the installed snapshot"
            );
            assert_eq!(
                node.stats().snapshot_builds,
                1,
                "the late build wrote nothing"
            );
            // Both frozen copies are gone: applies are no longer counted beside one, and a
            // builder dropped without building leaves none behind either.
            apply_all(&mut machine, entries(41..=41)).await;
            drop(machine.get_snapshot_builder().await);
            apply_all(&mut machine, entries(42..=42)).await;
            assert_eq!(node.stats().snapshot_shared_applies, 5);
        }
        let node = NodeStorage::open(dir.path(), StorageOptions::default()).unwrap();
        let machine = node.state_machine(GROUP, StateOptions::default()).unwrap();
        assert_eq!(machine.last_applied().map(|id| id.index()), Some(40));
        assert_eq!(
            machine.with_leases(LeaseStateMachine::snapshot_to_vec),
            installed_bytes,
            "restored from the installed snapshot (the log after it is openraft's to re-apply)"
        );
    }

    fn snapshot_files(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir.join(format!("snapshots/group-{GROUP:05}")))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refused_install_and_a_crash_leave_no_snapshot_files_behind() {
        let dir = TempDir::new().unwrap();
        let current = {
            let node = NodeStorage::open(dir.path(), StorageOptions::default()).unwrap();
            let mut machine = node.state_machine(GROUP, StateOptions::default()).unwrap();
            apply_all(&mut machine, entries(1..=3)).await;
            machine
                .get_snapshot_builder()
                .await
                .build_snapshot()
                .await
                .unwrap();
            let current = snapshot_files(dir.path());
            assert_eq!(current.len(), 1, "{current:?}");
            // Nothing applied since: a second build answers with the same snapshot.
            let again = machine
                .get_snapshot_builder()
                .await
                .build_snapshot()
                .await
                .unwrap();
            assert_eq!(again.meta.last_log_id.map(|id| id.index()), Some(3));
            assert_eq!(snapshot_files(dir.path()), current);

            // A damaged snapshot from the leader is refused; its temporary copy goes with it.
            let mut garbage = tempfile::tempfile().unwrap();
            io::Write::write_all(&mut garbage, b"not a snapshot").unwrap();
            let meta = SnapshotMetaOf::<TenureRaft> {
                last_log_id: Some(log_id::<TenureRaft>(1, 0, 10)),
                last_membership: StoredMembershipOf::<TenureRaft>::default(),
            };
            machine.install_snapshot(&meta, garbage).await.unwrap_err();
            assert_eq!(snapshot_files(dir.path()), current);
            current
        };
        // What a crash can leave: temporary files of interrupted operations and a snapshot
        // renamed into place whose pointer was never saved.
        let group_dir = dir.path().join(format!("snapshots/group-{GROUP:05}"));
        for leftover in [
            "snap-00000000000000000009-1-0.op4.tmp",
            "snap-00000000000000000010-1-0.op5.installing",
            "snap-00000000000000000009-1-0.snap",
            "snap-00000000000000000003-1-0.tmp",
        ] {
            fs::write(group_dir.join(leftover), b"left over").unwrap();
        }
        let node = NodeStorage::open(dir.path(), StorageOptions::default()).unwrap();
        let machine = node.state_machine(GROUP, StateOptions::default()).unwrap();
        assert_eq!(machine.last_applied().map(|id| id.index()), Some(3));
        assert_eq!(snapshot_files(dir.path()), current);
    }

    #[test]
    fn a_schedstat_line_gives_its_run_queue_wait() {
        assert_eq!(
            parse_schedstat_core_wait("75061 71877 1\n"),
            Some(Duration::from_nanos(71_877))
        );
        assert_eq!(
            parse_schedstat_core_wait("18446744073709551615 5000000000 9"),
            Some(Duration::from_secs(5))
        );
        assert_eq!(parse_schedstat_core_wait("75061"), None);
        assert_eq!(parse_schedstat_core_wait("75061 -3 1"), None);
        assert_eq!(parse_schedstat_core_wait(""), None);
    }

    #[test]
    fn a_pause_is_timed_within_the_span_its_wait_for_a_core_is_taken_over() {
        let clocks = PauseClocks::start();
        let spin_until = Instant::now() + Duration::from_millis(20);
        while Instant::now() < spin_until {
            std::hint::spin_loop();
        }
        let stopped = Instant::now();
        let pause = clocks.stop_at(stopped);
        assert!(pause.wall >= Duration::from_millis(20), "{pause:?}");
        assert!(pause.wall <= pause.outer_wall, "{pause:?}");
        // The spin was on a core for most of its 20 ms.
        assert!(pause.cpu >= Duration::from_millis(1), "{pause:?}");
        match pause.core_wait {
            Some(core_wait) => {
                assert!(core_wait <= pause.outer_wall, "{pause:?}");
                assert_eq!(
                    pause.less_core_wait(),
                    Some((pause.outer_wall - core_wait).min(pause.wall))
                );
            }
            None => assert_eq!(pause.less_core_wait(), None),
        }
        // Less the wait is never more than the wall time, whatever the wait.
        let waited_long = PauseTimes {
            core_wait: Some(Duration::ZERO),
            outer_wall: pause.wall + Duration::from_millis(5),
            ..pause
        };
        assert_eq!(waited_long.less_core_wait(), Some(pause.wall));
        // Where the kernel reports run-queue waits, a reading is there and never goes back.
        if let Some(before) = thread_core_wait() {
            let after = thread_core_wait().expect("a second schedstat reading");
            assert!(after >= before);
        }
    }

    fn lock_rx<T>(rx: &Mutex<mpsc::Receiver<T>>) -> MutexGuard<'_, mpsc::Receiver<T>> {
        rx.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
