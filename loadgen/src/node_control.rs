//! Stopping, starting and adding the nodes of the cluster under test, for scenarios that measure
//! failovers, restarts and a new replica (`scale`). [`NodeControl`] is the seam: [`DevControl`]
//! drives a running `tenure dev` through the `tenure` executable (`tenure dev
//! kill|start|status|add ... --data-dir D`), exactly as an operator would from another terminal;
//! the in-process tests implement it with their own cluster of node processes.
//!
//! Must not depend on: any server crate (the `tenure` executable is run, never linked), nor on the
//! scenarios.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::time::Duration;

/// A boxed future, so that [`NodeControl`] can be used as a trait object.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Why a node could not be stopped, started, listed or added.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The control command could not be run at all.
    #[error("running {command}: {source}")]
    Spawn {
        /// The command line.
        command: String,
        /// Why.
        source: std::io::Error,
    },
    /// The control command ran and failed.
    #[error("{command} failed ({status}): {output}")]
    Failed {
        /// The command line.
        command: String,
        /// Its exit status.
        status: String,
        /// What it printed.
        output: String,
    },
    /// The control command did not finish in time.
    #[error("{command} did not finish within {waited:?}")]
    TimedOut {
        /// The command line.
        command: String,
        /// How long it ran.
        waited: Duration,
    },
    /// The answer could not be read.
    #[error("{0}")]
    Answer(String),
}

/// Stops, starts and adds the nodes of the cluster under test, by node id.
pub trait NodeControl: Send + Sync {
    /// Kills node `id` (SIGKILL, as a crash would); returns once its process is gone.
    fn kill(&self, id: u64) -> BoxFuture<'_, Result<(), ControlError>>;
    /// Starts node `id` again from its data. It may return as soon as the process runs or only
    /// once the node is ready: callers that measure readiness watch the node themselves.
    fn start(&self, id: u64) -> BoxFuture<'_, Result<(), ControlError>>;
    /// The process id of every running node (for reading a node's memory from `/proc` when its
    /// metrics do not export it).
    fn pids(&self) -> BoxFuture<'_, Result<BTreeMap<u64, u32>, ControlError>>;
    /// Grows the cluster by one new node (a certificate from the cluster CA, a configuration
    /// that joins the running cluster, `AddNode` in the node table, its process started); the
    /// new node's id. It may return before the node is active in the node table (before it has
    /// reported itself): callers that need it active watch the table themselves.
    fn add(&self) -> BoxFuture<'_, Result<u64, ControlError>>;
}

/// Longest a `tenure dev kill` or `status` may take.
const QUICK_COMMAND_TIMEOUT: Duration = Duration::from_secs(90);
/// How long `tenure dev start` and `tenure dev add` wait for the node to be ready (their
/// `--wait-s`).
const START_WAIT: Duration = Duration::from_secs(300);

/// A running `tenure dev`, driven through its control socket by the `tenure` executable.
#[derive(Debug, Clone)]
pub struct DevControl {
    tenure_bin: PathBuf,
    dev_dir: PathBuf,
}

impl DevControl {
    /// `tenure_bin` is the `tenure` executable, `dev_dir` the cluster's `--data-dir`.
    pub fn new(tenure_bin: PathBuf, dev_dir: PathBuf) -> Self {
        DevControl {
            tenure_bin,
            dev_dir,
        }
    }

    /// Runs `tenure dev ARGS --data-dir DIR` within `timeout`; its standard output.
    async fn run(&self, args: &[String], timeout: Duration) -> Result<String, ControlError> {
        let mut command = tokio::process::Command::new(&self.tenure_bin);
        command
            .arg("dev")
            .args(args)
            .arg("--data-dir")
            .arg(&self.dev_dir)
            .env("RUST_LOG", "warn")
            .kill_on_drop(true)
            .stdin(std::process::Stdio::null());
        let line = format!(
            "{} dev {} --data-dir {}",
            self.tenure_bin.display(),
            args.join(" "),
            self.dev_dir.display()
        );
        let output = match tokio::time::timeout(timeout, command.output()).await {
            Err(_) => {
                return Err(ControlError::TimedOut {
                    command: line,
                    waited: timeout,
                });
            }
            Ok(Err(source)) => {
                return Err(ControlError::Spawn {
                    command: line,
                    source,
                });
            }
            Ok(Ok(output)) => output,
        };
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        if !output.status.success() {
            return Err(ControlError::Failed {
                command: line,
                status: output.status.to_string(),
                output: format!("{stdout}{}", String::from_utf8_lossy(&output.stderr))
                    .trim()
                    .to_owned(),
            });
        }
        Ok(stdout)
    }
}

impl NodeControl for DevControl {
    fn kill(&self, id: u64) -> BoxFuture<'_, Result<(), ControlError>> {
        Box::pin(async move {
            self.run(&["kill".into(), id.to_string()], QUICK_COMMAND_TIMEOUT)
                .await
                .map(drop)
        })
    }

    fn start(&self, id: u64) -> BoxFuture<'_, Result<(), ControlError>> {
        Box::pin(async move {
            self.run(
                &[
                    "start".into(),
                    id.to_string(),
                    "--wait-s".into(),
                    START_WAIT.as_secs().to_string(),
                ],
                START_WAIT + Duration::from_secs(30),
            )
            .await
            .map(drop)
        })
    }

    fn pids(&self) -> BoxFuture<'_, Result<BTreeMap<u64, u32>, ControlError>> {
        Box::pin(async move {
            let text = self
                .run(&["status".into(), "--json".into()], QUICK_COMMAND_TIMEOUT)
                .await?;
            pids_of_status(&text)
        })
    }

    /// `tenure dev add --node N --wait-s S --json`, with N one more than the highest node id
    /// `tenure dev status --json` lists (as `tenure dev add` without `--node` picks it), so the
    /// new node's id is known without reading it back from the answer's message.
    fn add(&self) -> BoxFuture<'_, Result<u64, ControlError>> {
        Box::pin(async move {
            let status = self
                .run(&["status".into(), "--json".into()], QUICK_COMMAND_TIMEOUT)
                .await?;
            let node = node_ids_of_status(&status)?
                .into_iter()
                .max()
                .unwrap_or(0)
                .checked_add(1)
                .ok_or_else(|| ControlError::Answer("no node id is left to add".into()))?;
            self.run(
                &[
                    "add".into(),
                    "--node".into(),
                    node.to_string(),
                    "--wait-s".into(),
                    START_WAIT.as_secs().to_string(),
                    "--json".into(),
                ],
                START_WAIT + Duration::from_secs(30),
            )
            .await?;
            Ok(node)
        })
    }
}

/// Every node id in the JSON answer of `tenure dev status --json`, with a process or without.
pub fn node_ids_of_status(text: &str) -> Result<Vec<u64>, ControlError> {
    Ok(status_nodes(text)?
        .iter()
        .filter_map(|node| node["id"].as_u64())
        .collect())
}

/// The `status.nodes` array of a `tenure dev status --json` answer.
fn status_nodes(text: &str) -> Result<Vec<serde_json::Value>, ControlError> {
    let mut value: serde_json::Value = serde_json::from_str(text)
        .map_err(|error| ControlError::Answer(format!("tenure dev status --json: {error}")))?;
    match value
        .pointer_mut("/status/nodes")
        .map(serde_json::Value::take)
    {
        Some(serde_json::Value::Array(nodes)) => Ok(nodes),
        _ => Err(ControlError::Answer(
            "tenure dev status --json: no status.nodes in the answer".into(),
        )),
    }
}

/// The running nodes' process ids in the JSON answer of `tenure dev status --json`
/// (`{"status":{"nodes":[{"id":1,"pid":1234,...},...]}}`; a node without a process has no pid).
pub fn pids_of_status(text: &str) -> Result<BTreeMap<u64, u32>, ControlError> {
    Ok(status_nodes(text)?
        .iter()
        .filter_map(|node| {
            let id = node["id"].as_u64()?;
            let pid = u32::try_from(node["pid"].as_u64()?).ok()?;
            Some((id, pid))
        })
        .collect())
}

/// The resident memory of process `pid` in bytes (`VmRSS` of `/proc/<pid>/status`).
pub fn rss_of_pid(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pids_come_from_the_status_answer() {
        let text = r#"{"ok":true,"message":"","error":null,"status":{"dir":"/d","groups":8,
            "at_unix_ms":1,"nodes":[{"id":1,"state":"running","pid":41},
            {"id":2,"state":"died","pid":null},{"id":3,"state":"running","pid":43}]}}"#;
        let pids = pids_of_status(text).unwrap();
        assert_eq!(pids, BTreeMap::from([(1, 41), (3, 43)]));
        assert!(pids_of_status("{}").is_err());
        assert!(pids_of_status("not json").is_err());
        assert_eq!(node_ids_of_status(text).unwrap(), vec![1, 2, 3]);
        assert!(node_ids_of_status(r#"{"status":{"nodes":7}}"#).is_err());
        assert!(node_ids_of_status("7").is_err());
    }

    #[test]
    fn own_memory_is_readable() {
        assert!(rss_of_pid(std::process::id()).is_some_and(|bytes| bytes > 0));
        assert_eq!(rss_of_pid(u32::MAX), None);
    }
}
