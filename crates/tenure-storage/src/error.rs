//! Typed storage errors, and their passage through openraft's `io::Error` interface.
//!
//! openraft's storage traits return `std::io::Error`; every error this crate raises is a
//! [`StoreError`] wrapped inside one (`io::Error::get_ref` + `downcast_ref` recovers it), with
//! kind `InvalidData` for corruption so callers can tell it from an operating failure.

use std::io;
use std::path::PathBuf;

use crate::codec::DecodeError;

/// Everything that can go wrong in tenure-storage.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database could not be opened.
    #[error("cannot open the store at {path}: {detail}")]
    Open {
        /// Data directory.
        path: PathBuf,
        /// RocksDB's or the file system's message.
        detail: String,
    },
    /// A stored value failed its checksum or did not decode; the group stops serving.
    #[error("group {group}: {what} is corrupt: {source}")]
    Corrupt {
        /// The group whose data is corrupt.
        group: u32,
        /// Which value, e.g. `log entry 17` or `vote`.
        what: String,
        /// What is wrong with it.
        #[source]
        source: DecodeError,
    },
    /// A log entry is stored under one index but names another: corruption or a bug.
    #[error("group {group}: log entry stored at index {stored_at} says index {found}")]
    MisplacedEntry {
        /// The group.
        group: u32,
        /// Index in the key.
        stored_at: u64,
        /// Index in the entry.
        found: u64,
    },
    /// An index is missing inside a group's log.
    #[error("group {group}: log entry {missing} is missing inside the log")]
    Hole {
        /// The group.
        group: u32,
        /// The first missing index.
        missing: u64,
    },
    /// A read or write failed (disk full, I/O error); the group stops accepting writes.
    #[error("group {group}: storage I/O failed during {operation}: {detail}")]
    Io {
        /// The group (or `u32::MAX` for node-wide operations).
        group: u32,
        /// What was being done.
        operation: &'static str,
        /// The underlying message.
        detail: String,
    },
    /// The group hit an earlier failure and refuses further work until an operator acts.
    #[error("group {group} has stopped serving after an earlier failure: {reason}")]
    GroupStopped {
        /// The group.
        group: u32,
        /// The first failure.
        reason: String,
    },
    /// A WAL sync failed earlier on this node. After a failed fsync the kernel may have dropped
    /// the pages it could not write, so a later sync can succeed without them: nothing written
    /// since can be called durable. Every later sync, append and synced write fails with this
    /// until the node restarts (and the restart's recovery checks the WAL).
    #[error(
        "a WAL sync failed earlier on this node ({first_failure}); storage refuses every write until the node restarts"
    )]
    SyncFailed {
        /// The first failure.
        first_failure: String,
    },
    /// The store cannot be opened because its data is corrupt: RocksDB found a damaged record
    /// inside its write-ahead log (not merely an incomplete last record after a crash), a damaged
    /// manifest or a damaged table. Opening anyway would silently drop synced writes (log
    /// entries, votes), so the node refuses to start; see the runbook
    /// `ops/runbooks/StorageCorrupt.md`.
    #[error(
        "the store at {path} is corrupt and the node refuses to start rather than drop synced writes (runbook: ops/runbooks/StorageCorrupt.md): {detail}"
    )]
    CorruptStore {
        /// Data directory.
        path: PathBuf,
        /// RocksDB's message.
        detail: String,
    },
    /// A snapshot file is unusable.
    #[error("group {group}: snapshot {file}: {detail}")]
    Snapshot {
        /// The group.
        group: u32,
        /// The file.
        file: String,
        /// What is wrong.
        detail: String,
    },
}

impl StoreError {
    /// True for corruption: the data on disk is wrong, not merely unavailable.
    pub fn is_corruption(&self) -> bool {
        matches!(
            self,
            StoreError::Corrupt { .. }
                | StoreError::MisplacedEntry { .. }
                | StoreError::Snapshot { .. }
                | StoreError::CorruptStore { .. }
        )
    }

    /// Recovers a `StoreError` from the `io::Error` openraft passed along, if it is one.
    pub fn from_io(err: &io::Error) -> Option<&StoreError> {
        err.get_ref()?.downcast_ref::<StoreError>()
    }
}

impl From<StoreError> for io::Error {
    fn from(err: StoreError) -> Self {
        let kind = if err.is_corruption() {
            io::ErrorKind::InvalidData
        } else {
            io::ErrorKind::Other
        };
        io::Error::new(kind, err)
    }
}
