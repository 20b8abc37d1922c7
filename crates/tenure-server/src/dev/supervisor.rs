//! The running development cluster: one child process per node, watched until the cluster is
//! stopped.
//!
//! Until every node is ready, a node that exits fails the run (its configuration or its
//! directory is unusable). From then on the cluster is a cluster: a node that dies (a crash, a
//! `kill -9` from another terminal) is reported on standard error with the end of its log, the
//! other nodes keep serving on their majority, and the node is started again from its data on
//! request (`tenure dev restart N`, served through [`super::control`]) or, with
//! `--restart-after-s`, by itself after that delay (doubled for each death within a minute of a
//! start, at most [`RESTART_DELAY_MAX`]). Nodes are stopped (SIGTERM, graceful), killed (SIGKILL),
//! started and restarted by id.
//!
//! Must not depend on: the node's internals (processes, files and HTTP only).

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::net::UnixListener;
use tokio::process::{Child, Command};
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::time::Instant;
use tracing::warn;

use super::control::{self, ControlReply, ControlRequest, NodeReport, StatusReport};
use super::{
    DevCluster, DevError, DevNode, LOG_TAIL_LINES, STOP_TIMEOUT, http_get_status, io_error,
    log_tail, now_unix_ms,
};

/// The longest automatic restart delay (a node that keeps dying soon after its start waits this
/// long between attempts).
pub const RESTART_DELAY_MAX: Duration = Duration::from_secs(60);
/// A node that dies within this long of its start counts as a quick death: its next automatic
/// restart waits twice as long as the last.
const QUICK_DEATH: Duration = Duration::from_secs(60);
/// How often the supervisor checks its nodes.
const TICK: Duration = Duration::from_millis(250);
/// How long one `/readyz` probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// SIGINT and SIGTERM.
pub(super) struct StopSignals {
    interrupt: Signal,
    terminate: Signal,
}

impl StopSignals {
    pub(super) fn new() -> Result<Self, DevError> {
        Ok(StopSignals {
            interrupt: signal(SignalKind::interrupt()).map_err(io_error("listening for SIGINT"))?,
            terminate: signal(SignalKind::terminate())
                .map_err(io_error("listening for SIGTERM"))?,
        })
    }

    async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.interrupt.recv() => "SIGINT",
            _ = self.terminate.recv() => "SIGTERM",
        }
    }
}

/// What one node process is doing.
#[derive(Debug, Clone)]
enum NodeState {
    /// Started; has not answered `/readyz` with 200 since.
    Starting,
    /// Answered `/readyz` with 200 since its start.
    Running,
    /// SIGTERM (or SIGKILL) sent on request; started again once it exits when `then_start`.
    Stopping { then_start: bool },
    /// Stopped on request.
    Stopped { exit: String },
    /// Exited without being asked to (a crash, or a signal from outside).
    Died {
        exit: String,
        restart_at: Option<Instant>,
    },
}

impl NodeState {
    fn name(&self) -> &'static str {
        match self {
            NodeState::Starting => "starting",
            NodeState::Running => "running",
            NodeState::Stopping { .. } => "stopping",
            NodeState::Stopped { .. } => "stopped",
            NodeState::Died { .. } => "died",
        }
    }

    fn is_up(&self) -> bool {
        matches!(self, NodeState::Starting | NodeState::Running)
    }
}

/// One node and its process.
struct NodeProcess {
    node: DevNode,
    http_addr: SocketAddr,
    client_addr: SocketAddr,
    child: Option<Child>,
    state: NodeState,
    /// Times this run started it.
    starts: u32,
    started_at: Instant,
    /// The delay of the next automatic restart after a quick death.
    restart_delay: Option<Duration>,
}

impl NodeProcess {
    fn not_started(node: DevNode) -> Result<Self, DevError> {
        let own = node.own()?.clone();
        Ok(NodeProcess {
            http_addr: own.http_addr,
            client_addr: own.addr,
            node,
            child: None,
            state: NodeState::Stopped {
                exit: "not started".to_owned(),
            },
            starts: 0,
            started_at: Instant::now(),
            restart_delay: None,
        })
    }
}

/// The cluster's node processes and what may be done to them.
pub(super) struct Supervisor {
    cluster: DevCluster,
    executable: PathBuf,
    worker_threads: u16,
    restart_after: Option<Duration>,
    nodes: Vec<NodeProcess>,
}

impl Supervisor {
    pub(super) fn new(
        cluster: DevCluster,
        executable: PathBuf,
        worker_threads: u16,
        restart_after: Option<Duration>,
    ) -> Result<Self, DevError> {
        let mut nodes = Vec::new();
        for node in &cluster.nodes {
            nodes.push(NodeProcess::not_started(node.clone())?);
        }
        Ok(Supervisor {
            cluster,
            executable,
            worker_threads,
            restart_after,
            nodes,
        })
    }

    /// Starts every node.
    pub(super) fn start_all(&mut self) -> Result<(), DevError> {
        for index in 0..self.nodes.len() {
            self.start(index)?;
        }
        Ok(())
    }

    fn start(&mut self, index: usize) -> Result<(), DevError> {
        let executable = self.executable.clone();
        let worker_threads = self.worker_threads;
        let Some(process) = self.nodes.get_mut(index) else {
            return Ok(());
        };
        let child = spawn_node(&executable, &process.node, worker_threads)?;
        process.child = Some(child);
        process.state = NodeState::Starting;
        process.starts += 1;
        process.started_at = Instant::now();
        Ok(())
    }

    fn index_of(&self, id: u64) -> Option<usize> {
        self.nodes.iter().position(|p| p.node.id == id)
    }

    /// Waits until every node answers `/readyz` with 200. `Ok(Some(signal))` when a stop signal
    /// came first; any node's exit before then fails the run.
    pub(super) async fn wait_all_ready(
        &mut self,
        signals: &mut StopSignals,
        timeout: Duration,
    ) -> Result<Option<&'static str>, DevError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(error) = self.first_exit_as_error() {
                return Err(error);
            }
            self.probe_starting(false).await;
            if self
                .nodes
                .iter()
                .all(|p| matches!(p.state, NodeState::Running))
            {
                return Ok(None);
            }
            if Instant::now() >= deadline {
                let waiting: Vec<&NodeProcess> = self
                    .nodes
                    .iter()
                    .filter(|p| !matches!(p.state, NodeState::Running))
                    .collect();
                let tails = waiting
                    .iter()
                    .map(|p| {
                        format!(
                            "  node {} ({}):\n{}",
                            p.node.id,
                            p.node.log_path.display(),
                            log_tail(&p.node.log_path, LOG_TAIL_LINES / 2)
                        )
                    })
                    .collect();
                return Err(DevError::NotReady {
                    nodes: waiting.iter().map(|p| p.node.id).collect(),
                    waited: timeout,
                    tails,
                });
            }
            tokio::select! {
                signal = signals.recv() => return Ok(Some(signal)),
                () = tokio::time::sleep(TICK) => {}
            }
        }
    }

    /// The first node found to have exited, as an error (before the cluster was ready).
    fn first_exit_as_error(&mut self) -> Option<DevError> {
        for process in &mut self.nodes {
            let Some(child) = process.child.as_mut() else {
                continue;
            };
            match child.try_wait() {
                Ok(Some(status)) => {
                    process.child = None;
                    return Some(DevError::NodeExited {
                        node: process.node.id,
                        status,
                        log: process.node.log_path.clone(),
                        tail: log_tail(&process.node.log_path, LOG_TAIL_LINES),
                    });
                }
                Ok(None) => {}
                Err(error) => warn!(
                    node = process.node.id,
                    "cannot check the node process: {error}"
                ),
            }
        }
        None
    }

    /// Polls `/readyz` of the nodes still starting; a 200 makes them running (announced when
    /// `announce`).
    async fn probe_starting(&mut self, announce: bool) {
        for process in &mut self.nodes {
            if !matches!(process.state, NodeState::Starting) {
                continue;
            }
            if let Ok(200) = http_get_status(process.http_addr, "/readyz", PROBE_TIMEOUT).await {
                process.state = NodeState::Running;
                if announce {
                    eprintln!(
                        "tenure dev: node {} is ready (start {} of this run)",
                        process.node.id, process.starts
                    );
                }
            }
        }
    }

    /// Notices nodes that exited: requested stops become stopped (or start again for a
    /// restart), the others died and are reported.
    fn reap(&mut self) {
        let mut died = Vec::new();
        let mut restart = Vec::new();
        for (index, process) in self.nodes.iter_mut().enumerate() {
            let Some(child) = process.child.as_mut() else {
                continue;
            };
            let status = match child.try_wait() {
                Ok(Some(status)) => status,
                Ok(None) => continue,
                Err(error) => {
                    warn!(
                        node = process.node.id,
                        "cannot check the node process: {error}"
                    );
                    continue;
                }
            };
            process.child = None;
            // In words: `exit status: 1`, `signal: 9 (SIGKILL)`.
            let exit = status.to_string();
            match process.state {
                NodeState::Stopping { then_start } => {
                    eprintln!("tenure dev: node {} stopped ({exit})", process.node.id);
                    process.state = NodeState::Stopped { exit };
                    if then_start {
                        restart.push(index);
                    }
                }
                _ => {
                    let quick = process.started_at.elapsed() < QUICK_DEATH;
                    let restart_at = self.restart_after.map(|base| {
                        let delay = match (quick, process.restart_delay) {
                            (true, Some(last)) => (last * 2).min(RESTART_DELAY_MAX),
                            _ => base,
                        };
                        process.restart_delay = Some(delay);
                        Instant::now() + delay
                    });
                    process.state = NodeState::Died { exit, restart_at };
                    died.push(index);
                }
            }
        }
        for index in died {
            self.report_death(index);
        }
        for index in restart {
            self.start_or_report(index);
        }
    }

    fn start_or_report(&mut self, index: usize) {
        if let Err(error) = self.start(index) {
            eprintln!("tenure dev: {error}");
        }
    }

    fn up_ids(&self) -> Vec<u64> {
        self.nodes
            .iter()
            .filter(|p| p.state.is_up())
            .map(|p| p.node.id)
            .collect()
    }

    fn report_death(&self, index: usize) {
        let Some(process) = self.nodes.get(index) else {
            return;
        };
        let NodeState::Died { exit, restart_at } = &process.state else {
            return;
        };
        let id = process.node.id;
        let up = self.up_ids();
        let total = self.nodes.len();
        let majority = total / 2 + 1;
        let serving = if up.len() >= majority {
            format!(
                "nodes {} keep serving ({} of {total} up, a majority)",
                join_ids(&up),
                up.len()
            )
        } else {
            format!(
                "only {} of {total} nodes are up ({}): groups without a majority of their \
                 replicas stop serving until enough nodes are back",
                up.len(),
                if up.is_empty() {
                    "none".to_owned()
                } else {
                    join_ids(&up)
                }
            )
        };
        let next = match restart_at {
            Some(at) => format!(
                "restarting it in {:.0} s (--restart-after-s)",
                at.saturating_duration_since(Instant::now()).as_secs_f64()
            ),
            None => format!(
                "`tenure dev restart {id} --data-dir {}` starts it again from its data",
                self.cluster.dir.display()
            ),
        };
        eprintln!(
            "tenure dev: node {id} died ({exit}); {serving}; {next}. The end of {}:\n{}",
            process.node.log_path.display(),
            log_tail(&process.node.log_path, LOG_TAIL_LINES / 4)
        );
    }

    fn start_due_restarts(&mut self) {
        let now = Instant::now();
        let due: Vec<usize> = self
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, p)| {
                matches!(p.state, NodeState::Died { restart_at: Some(at), .. } if at <= now)
            })
            .map(|(index, _)| index)
            .collect();
        for index in due {
            if let Some(process) = self.nodes.get(index) {
                eprintln!("tenure dev: restarting node {}", process.node.id);
            }
            self.start_or_report(index);
        }
    }

    /// Watches the running cluster until a stop signal or the end of `duration`, serving
    /// control requests on `control`.
    pub(super) async fn supervise(
        &mut self,
        signals: &mut StopSignals,
        control: &UnixListener,
        duration: Option<Duration>,
    ) {
        let until = duration.map(|d| Instant::now() + d);
        loop {
            self.reap();
            self.start_due_restarts();
            self.probe_starting(true).await;
            let stop_at = until.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
            tokio::select! {
                signal = signals.recv() => {
                    eprintln!("tenure dev: {signal}; stopping the nodes");
                    return;
                }
                () = tokio::time::sleep_until(stop_at), if until.is_some() => {
                    eprintln!("tenure dev: --duration-s elapsed; stopping the nodes");
                    return;
                }
                accepted = control.accept() => match accepted {
                    Ok((stream, _)) => self.serve_control(stream).await,
                    Err(error) => warn!("control socket: {error}"),
                },
                () = tokio::time::sleep(TICK) => {}
            }
        }
    }

    async fn serve_control(&mut self, mut stream: tokio::net::UnixStream) {
        let reply = match control::read_request(&mut stream).await {
            Ok(request) => self.handle(request).await,
            Err(error) => ControlReply::failed(error),
        };
        control::write_reply(&mut stream, &reply).await;
    }

    async fn handle(&mut self, request: ControlRequest) -> ControlReply {
        self.reap();
        let outcome = match request {
            ControlRequest::Status => Ok(String::new()),
            ControlRequest::Stop { node } => self.request_stop(node, false, false).await,
            ControlRequest::Kill { node } => self.request_stop(node, true, false).await,
            ControlRequest::Start { node } => self.request_start(node),
            ControlRequest::Restart { node } => self.request_stop(node, false, true).await,
            ControlRequest::Add { node } => self.request_add(node).await,
            ControlRequest::Replace { node, by } => self.request_replace(node, by).await,
        };
        match outcome {
            Ok(message) => ControlReply {
                ok: true,
                message,
                error: None,
                status: Some(self.status().await),
            },
            Err(error) => ControlReply {
                ok: false,
                message: String::new(),
                error: Some(error),
                status: Some(self.status().await),
            },
        }
    }

    fn find(&self, id: u64) -> Result<usize, String> {
        self.index_of(id).ok_or_else(|| {
            format!(
                "no node {id} in this cluster (nodes {})",
                join_ids(&self.nodes.iter().map(|p| p.node.id).collect::<Vec<_>>())
            )
        })
    }

    /// Stop (SIGTERM), kill (SIGKILL) or restart a node. A node that is not running is only
    /// started by a restart.
    async fn request_stop(
        &mut self,
        id: u64,
        kill: bool,
        then_start: bool,
    ) -> Result<String, String> {
        let index = self.find(id)?;
        let Some(process) = self.nodes.get_mut(index) else {
            return Err(format!("no node {id}"));
        };
        if process.child.is_none() {
            if then_start {
                self.start(index).map_err(|e| e.to_string())?;
                return Ok(format!("node {id} was not running; started it"));
            }
            return Err(format!(
                "node {id} is not running ({})",
                process.state.name()
            ));
        }
        process.state = NodeState::Stopping { then_start };
        if let Some(child) = process.child.as_mut() {
            if kill {
                let _ = child.start_kill();
            } else {
                send_sigterm(id, child).await;
            }
        }
        Ok(match (kill, then_start) {
            (true, _) => format!("sent SIGKILL to node {id}"),
            (false, true) => format!("sent SIGTERM to node {id}; it starts again once stopped"),
            (false, false) => format!("sent SIGTERM to node {id}"),
        })
    }

    /// Grows the running cluster by node `id`: its certificate and configuration, `AddNode` in
    /// the node table, then its process (it joins, reports itself, and the placement controller
    /// moves replicas to it).
    async fn request_add(&mut self, id: u64) -> Result<String, String> {
        if self.index_of(id).is_some() {
            return Err(format!("node {id} exists already"));
        }
        let node = super::prepare_added_node(&self.cluster, id).map_err(|e| e.to_string())?;
        super::announce_node(&self.cluster, &node)
            .await
            .map_err(|e| e.to_string())?;
        let process = NodeProcess::not_started(node.clone()).map_err(|e| e.to_string())?;
        self.cluster.nodes.push(node);
        super::record_growth(&mut self.cluster).map_err(|e| e.to_string())?;
        self.nodes.push(process);
        let index = self.nodes.len() - 1;
        self.start(index).map_err(|e| e.to_string())?;
        Ok(format!(
            "node {id} announced in the node table and started; it joins and the placement \
             controller moves replicas to it (`tenurectl node list`)"
        ))
    }

    /// Replaces node `id` for good, as an operator would a node whose disk died: kills it,
    /// drains and removes it from the node table (every node refuses it and its certificate
    /// from then on), and adds node `by` in its place. The placement controller re-creates its
    /// replicas on the active nodes.
    async fn request_replace(&mut self, id: u64, by: u64) -> Result<String, String> {
        let index = self.find(id)?;
        if self.nodes.get(index).is_some_and(|p| p.child.is_some()) {
            self.request_stop(id, true, false).await?;
        }
        for op in [
            tenure_core::ClusterOp::SetState {
                node_id: id,
                state: tenure_core::NodeState::Draining,
            },
            tenure_core::ClusterOp::Remove { node_id: id },
        ] {
            super::node_table_change(&self.cluster, op)
                .await
                .map_err(|e| e.to_string())?;
        }
        super::mark_removed(&self.cluster.dir, id).map_err(|e| e.to_string())?;
        self.cluster.nodes.retain(|node| node.id != id);
        let added = self.request_add(by).await?;
        Ok(format!(
            "node {id} killed and removed from the node table (refused by every node from now on); {added}"
        ))
    }

    fn request_start(&mut self, id: u64) -> Result<String, String> {
        let index = self.find(id)?;
        if self.nodes.get(index).is_some_and(|p| p.child.is_some()) {
            return Err(format!("node {id} is already running"));
        }
        self.start(index).map_err(|e| e.to_string())?;
        Ok(format!("started node {id} from its data"))
    }

    /// Every node's state (running nodes are probed for readiness).
    pub(super) async fn status(&self) -> StatusReport {
        let mut nodes = Vec::new();
        for process in &self.nodes {
            let ready = if process.child.is_some() {
                Some(matches!(
                    http_get_status(process.http_addr, "/readyz", PROBE_TIMEOUT).await,
                    Ok(200)
                ))
            } else {
                None
            };
            let (exit, restart_in_ms) = match &process.state {
                NodeState::Stopped { exit } => (Some(exit.clone()), None),
                NodeState::Died { exit, restart_at } => (
                    Some(exit.clone()),
                    restart_at.map(|at| {
                        u64::try_from(at.saturating_duration_since(Instant::now()).as_millis())
                            .unwrap_or(u64::MAX)
                    }),
                ),
                _ => (None, None),
            };
            nodes.push(NodeReport {
                id: process.node.id,
                state: process.state.name().to_owned(),
                pid: process.child.as_ref().and_then(Child::id),
                ready,
                client: process.client_addr.to_string(),
                http: format!("http://{}", process.http_addr),
                log: process.node.log_path.display().to_string(),
                starts: process.starts,
                exit,
                restart_in_ms,
            });
        }
        StatusReport {
            dir: self.cluster.dir.display().to_string(),
            groups: self.cluster.shape.groups,
            at_unix_ms: now_unix_ms(),
            nodes,
        }
    }

    /// SIGTERM to every running node, then waits for all of them until [`STOP_TIMEOUT`] has
    /// passed, then kills what is left.
    pub(super) async fn stop_all(&mut self) {
        for process in &mut self.nodes {
            if let Some(child) = process.child.as_mut() {
                send_sigterm(process.node.id, child).await;
            }
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        for process in &mut self.nodes {
            let id = process.node.id;
            let Some(child) = process.child.as_mut() else {
                continue;
            };
            match tokio::time::timeout_at(deadline, child.wait()).await {
                Ok(Ok(status)) if status.success() => tracing::info!(node = id, "node stopped"),
                Ok(Ok(status)) => {
                    eprintln!("tenure dev: node {id} stopped with {status}");
                }
                Ok(Err(error)) => warn!(node = id, "cannot wait for the node: {error}"),
                Err(_) => {
                    eprintln!(
                        "tenure dev: node {id} did not stop within {STOP_TIMEOUT:?}; killing it"
                    );
                    let _ = child.kill().await;
                }
            }
            process.child = None;
        }
    }
}

fn join_ids(ids: &[u64]) -> String {
    ids.iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

fn spawn_node(executable: &Path, node: &DevNode, worker_threads: u16) -> Result<Child, DevError> {
    let spawn_error = |source| DevError::Spawn {
        node: node.id,
        executable: executable.to_owned(),
        source,
    };
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&node.log_path)
        .map_err(spawn_error)?;
    writeln!(
        log,
        "==== tenure dev: starting node {} at unix ms {} ====",
        node.id,
        now_unix_ms()
    )
    .map_err(spawn_error)?;
    let stderr = log.try_clone().map_err(spawn_error)?;
    Command::new(executable)
        .arg("serve")
        .arg("--config")
        .arg(&node.config_path)
        // Development nodes trust claimed principals (auth.insecure_dev_mode); `tenure serve`
        // runs that only with this flag and only on loopback, which is all `tenure dev` binds.
        .arg(crate::config::ALLOW_INSECURE_FLAG)
        .arg("--worker-threads")
        .arg(worker_threads.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::from(log))
        .stderr(Stdio::from(stderr))
        // Its own process group: a Ctrl-C in the terminal reaches only this process, which then
        // stops the nodes in order.
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(spawn_error)
}

async fn send_sigterm(id: u64, child: &mut Child) {
    let Some(pid) = child.id() else {
        return; // already reaped
    };
    let sent = Command::new("kill")
        .arg("-TERM")
        .arg(pid.to_string())
        .stdin(Stdio::null())
        .status()
        .await;
    match sent {
        Ok(status) if status.success() => {}
        other => {
            warn!(node = id, "kill -TERM {pid} failed ({other:?}); killing it");
            let _ = child.start_kill();
        }
    }
}
