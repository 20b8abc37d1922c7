//! The state machine of one group replica: tenure-core's lease state, applied through openraft.
//!
//! The lease state lives in memory (that is what makes apply fast); its durable form is the
//! latest snapshot file plus the log after it. The *applied position that survives a restart* is
//! therefore the snapshot's last log id, persisted (synced) in the state column family together
//! with the snapshot's file name, size and checksum; on open, the state is restored from that file
//! and openraft re-applies the committed log after it.
//!
//! Snapshots use tenure-core's format, written and read as a stream straight to and from the file
//! (never a second copy in memory). Building one holds the group's state lock while it writes, so
//! apply pauses for that time (about a second per million leases on these machines).

use std::fs::{self, File};
use std::io::{self, BufReader, BufWriter, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use futures_util::{Stream, TryStreamExt};
use openraft::alias::{LogIdOf, SnapshotMetaOf, SnapshotOf, StoredMembershipOf};
use openraft::entry::RaftEntry;
use openraft::storage::{EntryResponder, RaftSnapshotBuilder, RaftStateMachine};
use openraft::{EntryPayload, OptionalSend};
use serde::{Deserialize, Serialize};
use tenure_core::{GroupId, LeaseStateMachine, StateOptions};

use crate::TenureRaft;
use crate::backend::{Batch, Cf};
use crate::codec::{self, STATE_SNAPSHOT};
use crate::error::StoreError;
use crate::node::{NodeStorage, Shared, blocking};

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

/// The state machine of one group replica. Clones share the state.
#[derive(Clone)]
pub struct GroupStateMachine {
    shared: Arc<Shared>,
    group: u32,
    options: StateOptions,
    state: Arc<Mutex<MachineState>>,
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

fn snapshot_dir(data_dir: &Path, group: u32) -> PathBuf {
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
        let pointer = inner
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
            .map_err(|err| inner.stop_group(group, err))?;
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
        Ok(GroupStateMachine {
            shared,
            group,
            options,
            state: Arc::new(Mutex::new(state)),
        })
    }

    /// The group.
    pub fn group(&self) -> u32 {
        self.group
    }

    /// Runs `f` on the lease state (queries: get, list, stats, next expiry).
    pub fn with_leases<T>(&self, f: impl FnOnce(&LeaseStateMachine) -> T) -> T {
        f(&lock(&self.state).leases)
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

    /// Writes the state to a new snapshot file and makes it current (blocking).
    fn build_blocking(&self) -> Result<(SnapshotPointer, File), StoreError> {
        let inner = &self.shared.inner;
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
        let mut state = lock(&self.state);
        let meta = SnapshotMetaOf::<TenureRaft> {
            last_log_id: state.last_applied,
            last_membership: state.membership.clone(),
        };
        let stem = match &meta.last_log_id {
            Some(id) => format!("snap-{:020}-{}", id.index(), id.committed_leader_id()),
            None => "snap-none".to_owned(),
        };
        let temp = dir.join(format!("{stem}.tmp"));
        let file = File::create(&temp).map_err(io_error("create snapshot"))?;
        let mut writer = BufWriter::with_capacity(1 << 20, file);
        let stats =
            state
                .leases
                .write_snapshot(&mut writer)
                .map_err(|err| StoreError::Snapshot {
                    group: self.group,
                    file: temp.display().to_string(),
                    detail: err.to_string(),
                })?;
        let file = writer
            .into_inner()
            .map_err(|err| io_error("write snapshot")(err.into_error()))?;
        file.sync_all().map_err(io_error("sync snapshot"))?;
        let name = format!("{stem}.snap");
        fs::rename(&temp, dir.join(&name)).map_err(io_error("rename snapshot"))?;
        fsync_dir(&dir).map_err(io_error("sync snapshot dir"))?;
        let pointer = SnapshotPointer {
            meta,
            file: name,
            bytes: stats.bytes,
            checksum: stats.checksum,
        };
        self.save_pointer(&pointer)?;
        let previous = state.current.replace(pointer.clone());
        drop(state);
        remove_stale(&dir, previous.as_ref(), &pointer);
        let file = File::open(dir.join(&pointer.file)).map_err(io_error("open snapshot"))?;
        Ok((pointer, file))
    }

    fn save_pointer(&self, pointer: &SnapshotPointer) -> Result<(), StoreError> {
        let inner = &self.shared.inner;
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
    /// directory, validates it completely, then makes it current and replaces the state.
    fn install_blocking(
        &self,
        meta: SnapshotMetaOf<TenureRaft>,
        mut incoming: File,
    ) -> Result<(), StoreError> {
        let inner = &self.shared.inner;
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
        let stem = match &meta.last_log_id {
            Some(id) => format!("snap-{:020}-{}", id.index(), id.committed_leader_id()),
            None => "snap-none".to_owned(),
        };
        let temp = dir.join(format!("{stem}.installing"));
        incoming
            .rewind()
            .map_err(io_error("rewind incoming snapshot"))?;
        let mut file = File::create(&temp).map_err(io_error("create snapshot"))?;
        let bytes = io::copy(&mut incoming, &mut file).map_err(io_error("copy snapshot"))?;
        file.sync_all().map_err(io_error("sync snapshot"))?;
        drop(file);
        let leases = match read_snapshot_file(group, &temp, self.options, None) {
            Ok(leases) => leases,
            Err(err) => {
                let _ = fs::remove_file(&temp);
                // A bad incoming snapshot is the sender's problem; this group's data is intact.
                return Err(err);
            }
        };
        let name = format!("{stem}.snap");
        fs::rename(&temp, dir.join(&name)).map_err(io_error("rename snapshot"))?;
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
        let previous = state.current.replace(pointer.clone());
        drop(state);
        remove_stale(&dir, previous.as_ref(), &pointer);
        Ok(())
    }
}

/// Deletes the previous snapshot file and leftovers of interrupted writes.
fn remove_stale(dir: &Path, previous: Option<&SnapshotPointer>, current: &SnapshotPointer) {
    if let Some(previous) = previous
        && previous.file != current.file
    {
        let _ = fs::remove_file(dir.join(&previous.file));
    }
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name != current.file && (name.ends_with(".tmp") || name.ends_with(".installing")) {
                let _ = fs::remove_file(entry.path());
            }
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

/// Builds snapshots for one group.
pub struct GroupSnapshotBuilder {
    machine: GroupStateMachine,
}

impl RaftSnapshotBuilder<TenureRaft> for GroupSnapshotBuilder {
    type SnapshotData = File;

    async fn build_snapshot(&mut self) -> Result<SnapshotOf<TenureRaft, File>, io::Error> {
        let machine = self.machine.clone();
        let (pointer, file) =
            blocking(&self.machine.shared.inner, move || machine.build_blocking()).await?;
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
            let response = {
                let mut state = lock(&self.state);
                let log_id = entry.log_id();
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
                    EntryPayload::Normal(proposal) => Some(state.leases.apply(proposal)),
                    EntryPayload::Membership(membership) => {
                        state.membership =
                            StoredMembershipOf::<TenureRaft>::new(Some(log_id), membership.clone());
                        None
                    }
                };
                state.last_applied = Some(log_id);
                response
            };
            if let Some(responder) = responder {
                responder.send(response);
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        GroupSnapshotBuilder {
            machine: self.clone(),
        }
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
        let pointer = lock(&self.state).current.clone();
        let Some(pointer) = pointer else {
            return Ok(None);
        };
        let path = self.dir().join(&pointer.file);
        let file = File::open(&path).map_err(|err| StoreError::Snapshot {
            group: self.group,
            file: path.display().to_string(),
            detail: err.to_string(),
        })?;
        Ok(Some(SnapshotOf::<TenureRaft, File> {
            meta: pointer.meta,
            snapshot: file,
        }))
    }
}
