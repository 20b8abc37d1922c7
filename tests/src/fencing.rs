//! A downstream system that checks fencing tokens: the toy store every lease holder of a fault
//! run writes to while it believes it holds its lease.
//!
//! [`FencedStore`] keeps, per resource, the highest token it has accepted a write with, and
//! rejects any write carrying a lower one. A holder paused past its lease (a zombie: its process
//! was stopped between checking its deadline and writing) comes back with a stale token; if the
//! next holder wrote first, the store rejects the zombie's write. That is the point of fencing:
//! the lease service cannot stop a paused process from acting, the downstream check can.
//!
//! [`StoreServer`] serves a store to client processes over a Unix socket (JSON lines: one
//! [`FencedWrite`] in, one [`WriteReply`] out) and records every write it judged.
//!
//! Must not depend on: the lease service (the store sees only tokens).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

use crate::history::{FencedWrite, WriteRecord, mono_now_ns};

/// Longest request line the server reads, in bytes.
const REQUEST_LINE_BYTES_MAX: usize = 4_096;
/// Writes the server records at most (later ones are judged but not recorded).
pub const RECORDED_WRITES_MAX: usize = 1_000_000;

/// The store's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteReply {
    /// True when the write was applied.
    pub accepted: bool,
    /// The highest token the store had accepted for the resource before this write.
    pub highest_before: u64,
}

/// The fencing rule, without I/O.
#[derive(Debug, Default)]
pub struct FencedStore {
    highest: HashMap<String, u64>,
}

impl FencedStore {
    /// Applies a write with `token` to `resource` unless a higher token already wrote.
    pub fn write(&mut self, resource: &str, token: u64) -> WriteReply {
        let highest = self.highest.entry(resource.to_string()).or_insert(0);
        let before = *highest;
        let accepted = token >= before;
        if accepted {
            *highest = token;
        }
        WriteReply {
            accepted,
            highest_before: before,
        }
    }
}

/// A [`FencedStore`] shared by the tasks of one process (a simulation's), recording every
/// judgement as the socket server does.
#[derive(Debug, Clone, Default)]
pub struct SharedFence {
    inner: Arc<Mutex<(FencedStore, Vec<WriteRecord>)>>,
}

impl SharedFence {
    /// Judges `write`, which arrived at `arrived_ns`, and records it.
    pub fn write(&self, write: FencedWrite, arrived_ns: crate::history::Nanos) -> WriteReply {
        let mut inner = lock(&self.inner);
        let reply = inner.0.write(&write.resource, write.token);
        if inner.1.len() < RECORDED_WRITES_MAX {
            inner.1.push(WriteRecord {
                write,
                arrived_ns,
                accepted: reply.accepted,
                highest_before: reply.highest_before,
            });
        }
        reply
    }

    /// Every write judged so far.
    pub fn records(&self) -> Vec<WriteRecord> {
        lock(&self.inner).1.clone()
    }
}

/// Errors of the store's socket.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The socket could not be bound, connected, read or written.
    #[error("fenced store socket {path}: {source}")]
    Io {
        /// The socket's path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The other side sent something that is not a request or reply.
    #[error("fenced store: bad message: {0}")]
    Protocol(String),
}

struct Shared {
    store: Mutex<FencedStore>,
    records: Mutex<Vec<WriteRecord>>,
}

/// A [`FencedStore`] served on a Unix socket; stops when dropped.
pub struct StoreServer {
    path: PathBuf,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl StoreServer {
    /// Binds `path` and serves (must run inside a tokio runtime).
    pub fn start(path: &Path) -> Result<StoreServer, StoreError> {
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path).map_err(|source| StoreError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let shared = Arc::new(Shared {
            store: Mutex::new(FencedStore::default()),
            records: Mutex::new(Vec::new()),
        });
        let serving = shared.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve_connection(stream, serving.clone()));
            }
        });
        Ok(StoreServer {
            path: path.to_path_buf(),
            shared,
            task,
        })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every write judged so far.
    pub fn records(&self) -> Vec<WriteRecord> {
        lock(&self.shared.records).clone()
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

async fn serve_connection(stream: UnixStream, shared: Arc<Shared>) {
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read);
    let mut line = String::new();
    loop {
        line.clear();
        match lines.read_line(&mut line).await {
            Ok(0) | Err(_) => return,
            Ok(_) if line.len() > REQUEST_LINE_BYTES_MAX => return,
            Ok(_) => {}
        }
        let arrived_ns = mono_now_ns();
        let Ok(request) = serde_json::from_str::<FencedWrite>(line.trim_end()) else {
            return;
        };
        let reply = lock(&shared.store).write(&request.resource, request.token);
        {
            let mut records = lock(&shared.records);
            if records.len() < RECORDED_WRITES_MAX {
                records.push(WriteRecord {
                    write: request,
                    arrived_ns,
                    accepted: reply.accepted,
                    highest_before: reply.highest_before,
                });
            }
        }
        let Ok(mut text) = serde_json::to_string(&reply) else {
            return;
        };
        text.push('\n');
        if write.write_all(text.as_bytes()).await.is_err() {
            return;
        }
    }
}

/// One connection to a [`StoreServer`].
#[derive(Debug)]
pub struct StoreClient {
    path: PathBuf,
    lines: BufReader<tokio::net::unix::OwnedReadHalf>,
    write: tokio::net::unix::OwnedWriteHalf,
}

impl StoreClient {
    /// Connects to the store at `path`.
    pub async fn connect(path: &Path) -> Result<StoreClient, StoreError> {
        let stream = UnixStream::connect(path)
            .await
            .map_err(|source| StoreError::Io {
                path: path.to_path_buf(),
                source,
            })?;
        let (read, write) = stream.into_split();
        Ok(StoreClient {
            path: path.to_path_buf(),
            lines: BufReader::new(read),
            write,
        })
    }

    /// Sends one write and waits for the store's judgement.
    pub async fn write(&mut self, request: &FencedWrite) -> Result<WriteReply, StoreError> {
        let io = |source| StoreError::Io {
            path: self.path.clone(),
            source,
        };
        let mut text =
            serde_json::to_string(request).map_err(|e| StoreError::Protocol(e.to_string()))?;
        text.push('\n');
        self.write.write_all(text.as_bytes()).await.map_err(io)?;
        let mut line = String::new();
        let read = self
            .lines
            .read_line(&mut line)
            .await
            .map_err(|source| StoreError::Io {
                path: self.path.clone(),
                source,
            })?;
        if read == 0 {
            return Err(StoreError::Protocol(
                "the store closed the connection".into(),
            ));
        }
        serde_json::from_str(line.trim_end()).map_err(|e| StoreError::Protocol(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stale_token_is_rejected_and_the_same_token_accepted() {
        let mut store = FencedStore::default();
        assert!(store.write("r", 5).accepted);
        assert!(store.write("r", 5).accepted, "the holder writes again");
        let stale = store.write("r", 4);
        assert!(!stale.accepted);
        assert_eq!(stale.highest_before, 5);
        assert!(
            store.write("other", 1).accepted,
            "resources are fenced apart"
        );
        assert!(store.write("r", 9).accepted);
    }
}
