//! The control socket of a running `tenure dev`: `DIR/control.sock`, a Unix socket only the
//! directory's owner can reach. One connection carries one request and one answer, each a line
//! of JSON (at most [`LINE_BYTES_MAX`] bytes, read within [`READ_TIMEOUT`]). The supervisor
//! serves it; `tenure dev status | stop N | kill N | start N | restart N` are its clients.
//!
//! Must not depend on: the node's internals.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::time::Instant;

use super::{DevError, io_error};

/// The socket's file name inside the cluster's directory.
pub const CONTROL_SOCKET: &str = "control.sock";
/// The longest request or answer line.
pub const LINE_BYTES_MAX: u64 = 1 << 20;
/// How long the supervisor waits for a request line (it serves one connection at a time).
pub const READ_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a client waits for the answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// One request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case", deny_unknown_fields)]
pub enum ControlRequest {
    /// Every node's state.
    Status,
    /// SIGTERM to a node (graceful: it hands its leaderships off).
    Stop {
        /// The node.
        node: u64,
    },
    /// SIGKILL to a node (a crash; it is not restarted by `--restart-after-s`).
    Kill {
        /// The node.
        node: u64,
    },
    /// Start a stopped or dead node from its data.
    Start {
        /// The node.
        node: u64,
    },
    /// Stop a node (SIGTERM) and start it again from its data; starts it if it is down.
    Restart {
        /// The node.
        node: u64,
    },
    /// Grow the cluster by a new node: certificate, configuration, `AddNode`, start.
    Add {
        /// The new node's id (never used in this cluster).
        node: u64,
    },
    /// Replace a node for good: kill it, drain and remove it from the node table, add `by`.
    Replace {
        /// The node replaced.
        node: u64,
        /// The new node's id (never used in this cluster).
        by: u64,
    },
}

/// One node as the supervisor sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeReport {
    /// Node id.
    pub id: u64,
    /// `starting`, `running`, `stopping`, `stopped` or `died`.
    pub state: String,
    /// Its process id while it has a process.
    pub pid: Option<u32>,
    /// Whether it answered `/readyz` with 200 just now (`None` without a process).
    pub ready: Option<bool>,
    /// Its QUIC (client protocol) address.
    pub client: String,
    /// Its HTTP gateway.
    pub http: String,
    /// Its log file.
    pub log: String,
    /// Times this run of `tenure dev` started it.
    pub starts: u32,
    /// How its last process ended (stopped and died nodes).
    pub exit: Option<String>,
    /// A dead node's automatic restart, in milliseconds from now (`--restart-after-s`).
    pub restart_in_ms: Option<u64>,
}

/// The cluster as the supervisor sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusReport {
    /// The cluster's directory.
    pub dir: String,
    /// Groups in the cluster.
    pub groups: u32,
    /// When the report was made, in milliseconds since the Unix epoch.
    pub at_unix_ms: u64,
    /// The nodes, by id.
    pub nodes: Vec<NodeReport>,
}

impl StatusReport {
    /// The node `id`.
    pub fn node(&self, id: u64) -> Option<&NodeReport> {
        self.nodes.iter().find(|n| n.id == id)
    }
}

/// The answer to one request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControlReply {
    /// True when the request was carried out (or, for a stop, begun).
    pub ok: bool,
    /// What was done.
    pub message: String,
    /// Why it was refused.
    pub error: Option<String>,
    /// The cluster after it.
    pub status: Option<StatusReport>,
}

impl ControlReply {
    pub(super) fn failed(error: String) -> Self {
        ControlReply {
            ok: false,
            message: String::new(),
            error: Some(error),
            status: None,
        }
    }
}

/// The socket's path for the cluster in `dir`.
pub fn socket_path(dir: &Path) -> PathBuf {
    dir.join(CONTROL_SOCKET)
}

/// Binds the control socket of the cluster in `dir`. Refuses when another `tenure dev` answers
/// on it; removes a stale socket file left by one that was killed.
pub(super) async fn bind(dir: &Path) -> Result<UnixListener, DevError> {
    let path = socket_path(dir);
    if path.exists() {
        if UnixStream::connect(&path).await.is_ok() {
            return Err(DevError::Options(format!(
                "a tenure dev is already running on {} (its control socket {} answers); use \
                 `tenure dev status --data-dir {}`, or stop it first",
                dir.display(),
                path.display(),
                dir.display()
            )));
        }
        std::fs::remove_file(&path)
            .map_err(io_error(format!("removing the stale {}", path.display())))?;
    }
    let listener =
        UnixListener::bind(&path).map_err(io_error(format!("binding {}", path.display())))?;
    // Only the directory's owner may drive its nodes.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
        .map_err(io_error(format!("restricting {}", path.display())))?;
    Ok(listener)
}

/// Removes the control socket (at the end of a run).
pub(super) fn unbind(dir: &Path) {
    let _ = std::fs::remove_file(socket_path(dir));
}

/// Reads one bounded request line within [`READ_TIMEOUT`].
pub(super) async fn read_request(stream: &mut UnixStream) -> Result<ControlRequest, String> {
    let line = tokio::time::timeout(READ_TIMEOUT, read_line(stream))
        .await
        .map_err(|_| format!("no request within {READ_TIMEOUT:?}"))??;
    serde_json::from_str(&line).map_err(|e| format!("not a control request: {e}"))
}

async fn read_line(stream: &mut UnixStream) -> Result<String, String> {
    use tokio::io::AsyncReadExt;
    let mut reader = BufReader::new(stream).take(LINE_BYTES_MAX);
    let mut line = String::new();
    reader
        .read_line(&mut line)
        .await
        .map_err(|e| format!("reading: {e}"))?;
    if !line.ends_with('\n') {
        return Err(format!(
            "the line is longer than {LINE_BYTES_MAX} bytes or not terminated"
        ));
    }
    Ok(line)
}

/// Writes one answer line (a client that went away is not an error).
pub(super) async fn write_reply(stream: &mut UnixStream, reply: &ControlReply) {
    let Ok(mut text) = serde_json::to_string(reply) else {
        return;
    };
    text.push('\n');
    let _ = tokio::time::timeout(READ_TIMEOUT, stream.write_all(text.as_bytes())).await;
}

/// Sends one request to the `tenure dev` running on `dir` and returns its answer.
pub async fn send(dir: &Path, request: ControlRequest) -> Result<ControlReply, DevError> {
    let path = socket_path(dir);
    let exchange = async {
        let mut stream = UnixStream::connect(&path).await.map_err(|e| {
            DevError::Control(format!(
                "no tenure dev is running on {} (cannot connect to {}: {e})",
                dir.display(),
                path.display()
            ))
        })?;
        let mut text = serde_json::to_string(&request)
            .map_err(|e| DevError::Control(format!("encoding the request: {e}")))?;
        text.push('\n');
        stream
            .write_all(text.as_bytes())
            .await
            .map_err(|e| DevError::Control(format!("sending to {}: {e}", path.display())))?;
        let line = read_line(&mut stream).await.map_err(DevError::Control)?;
        serde_json::from_str::<ControlReply>(&line)
            .map_err(|e| DevError::Control(format!("a garbled answer from tenure dev: {e}")))
    };
    tokio::time::timeout(ANSWER_TIMEOUT, exchange)
        .await
        .map_err(|_| {
            DevError::Control(format!(
                "no answer from tenure dev within {ANSWER_TIMEOUT:?}"
            ))
        })?
}

/// Sends `request`, then (unless it was refused) waits up to `wait` until the node reaches the
/// state the request leads to: stopped or died after a stop or kill, running (ready) after a
/// start or restart. Returns the last answer; `Err` when refused or not reached in time.
pub async fn act_and_wait(
    dir: &Path,
    request: ControlRequest,
    wait: Duration,
) -> Result<ControlReply, DevError> {
    let reply = send(dir, request).await?;
    if !reply.ok {
        return Err(DevError::Control(
            reply.error.unwrap_or_else(|| "refused".to_owned()),
        ));
    }
    let (node, wanted): (u64, &[&str]) = match request {
        ControlRequest::Status => return Ok(reply),
        ControlRequest::Stop { node } | ControlRequest::Kill { node } => {
            (node, &["stopped", "died"])
        }
        ControlRequest::Start { node }
        | ControlRequest::Restart { node }
        | ControlRequest::Add { node }
        | ControlRequest::Replace { by: node, .. } => (node, &["running"]),
    };
    let deadline = Instant::now() + wait;
    let message = reply.message.clone();
    let mut last = reply;
    loop {
        let state = last
            .status
            .as_ref()
            .and_then(|s| s.node(node))
            .map(|n| n.state.clone())
            .unwrap_or_default();
        if wanted.contains(&state.as_str()) {
            last.message = message;
            return Ok(last);
        }
        if matches!(
            request,
            ControlRequest::Start { .. }
                | ControlRequest::Restart { .. }
                | ControlRequest::Add { .. }
                | ControlRequest::Replace { .. }
        ) && state == "died"
        {
            return Err(DevError::Control(format!(
                "node {node} died while starting; see its log"
            )));
        }
        if Instant::now() >= deadline {
            return Err(DevError::Control(format!(
                "node {node} is {state} after {wait:?}, not {}",
                wanted.join(" or ")
            )));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        last = send(dir, ControlRequest::Status).await?;
    }
}

/// The status as a table.
pub fn render_status(report: &StatusReport) -> String {
    let mut out = format!("cluster {} ({} groups)\n", report.dir, report.groups);
    out.push_str(&format!(
        "{:<5} {:<9} {:<8} {:<6} {:<22} {:<28} {:<7} {}\n",
        "NODE", "STATE", "PID", "READY", "CLIENT", "HTTP", "STARTS", "LAST EXIT"
    ));
    for node in &report.nodes {
        let exit = match (&node.exit, node.restart_in_ms) {
            (Some(exit), Some(ms)) => format!("{exit}; restarts in {:.1} s", ms as f64 / 1000.0),
            (Some(exit), None) => exit.clone(),
            (None, _) => "-".to_owned(),
        };
        out.push_str(&format!(
            "{:<5} {:<9} {:<8} {:<6} {:<22} {:<28} {:<7} {}\n",
            node.id,
            node.state,
            node.pid.map_or("-".to_owned(), |p| p.to_string()),
            match node.ready {
                Some(true) => "yes",
                Some(false) => "no",
                None => "-",
            },
            node.client,
            node.http,
            node.starts,
            exit
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn requests_are_json_lines_with_an_op() {
        let text = serde_json::to_string(&ControlRequest::Restart { node: 2 }).unwrap();
        assert_eq!(text, r#"{"op":"restart","node":2}"#);
        let parsed: ControlRequest = serde_json::from_str(r#"{"op":"kill","node":3}"#).unwrap();
        assert_eq!(parsed, ControlRequest::Kill { node: 3 });
        assert!(serde_json::from_str::<ControlRequest>(r#"{"op":"format-disk"}"#).is_err());
        assert!(serde_json::from_str::<ControlRequest>(r#"{"op":"stop"}"#).is_err());
    }

    #[tokio::test]
    async fn a_second_supervisor_is_refused_and_a_stale_socket_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let listener = bind(dir.path()).await.unwrap();
        let message = bind(dir.path()).await.unwrap_err().to_string();
        assert!(message.contains("already running"), "{message}");
        drop(listener);
        // The file is left behind, nobody answers: a new supervisor takes it over.
        assert!(socket_path(dir.path()).exists());
        let _again = bind(dir.path()).await.unwrap();
    }

    #[tokio::test]
    async fn oversized_or_silent_requests_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let listener = bind(dir.path()).await.unwrap();
        let path = socket_path(dir.path());
        let client = tokio::spawn(async move {
            let mut stream = UnixStream::connect(&path).await.unwrap();
            let big = vec![b'x'; usize::try_from(LINE_BYTES_MAX).unwrap() + 10];
            let _ = stream.write_all(&big).await;
        });
        let (mut stream, _) = listener.accept().await.unwrap();
        let error = read_request(&mut stream).await.unwrap_err();
        assert!(error.contains("longer than"), "{error}");
        client.await.unwrap();

        let path = socket_path(dir.path());
        let _silent = UnixStream::connect(&path).await.unwrap();
        let (mut stream, _) = listener.accept().await.unwrap();
        let started = std::time::Instant::now();
        let error = read_request(&mut stream).await.unwrap_err();
        assert!(error.contains("no request within"), "{error}");
        assert!(started.elapsed() < READ_TIMEOUT * 3);
    }

    #[tokio::test]
    async fn no_supervisor_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let message = send(dir.path(), ControlRequest::Status)
            .await
            .unwrap_err()
            .to_string();
        assert!(message.contains("no tenure dev is running"), "{message}");
    }
}
