//! A cluster of real node processes for fault runs: certificates, one configuration per node,
//! and one process per node (`<exe> node --config FILE`, which runs
//! [`tenure_server::serve::serve_until_signalled`], the function `tenure serve` runs), each in
//! its network namespace when the run has them.
//!
//! Faults it applies: SIGKILL and restart (same data directory), SIGSTOP and SIGCONT, the
//! nodes' fault control (`/testing/faults`: clock rate, WAL sync delay, dropped peers), wall
//! clock jumps through libfaketime (each node starts with it preloaded, reading its offset from
//! a file the cluster rewrites; the monotonic clock is left alone), and partitions (iptables in
//! the namespaces, or the nodes' fault control on loopback).
//!
//! Must not depend on: the workload or the checker.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::OpenOptions;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use tenure_client::{Client, ClientConfig, ClientError, Credentials, Endpoint, NodeStatus};
use tenure_core::NegativeControl;
use tenure_server::config::{
    AuthConfig, ClusterConfig, LimitsConfig, PeerConfig, ServerConfig, StorageConfig,
    TestingConfig, TimingConfig, TlsConfig,
};
use tenure_server::fault_control::{FaultSettings, FaultState};

use super::HarnessError;
use super::network::{Network, NetworkMode};

/// The cluster name of every fault-run cluster.
pub const CLUSTER_NAME: &str = "tenure-nemesis";
/// Where Debian's libfaketime lives (package `faketime`).
const FAKETIME_LIBRARIES: [&str; 2] = [
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
];
/// How long a fault-control request may take (a stopped node never answers).
const FAULT_CONTROL_TIMEOUT: Duration = Duration::from_secs(2);

/// How the cluster is built.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Node ids `1..=nodes`.
    pub nodes: u64,
    /// Raft groups.
    pub groups: u32,
    /// Node-wide heartbeat period.
    pub heartbeat_ms: u64,
    /// Election timeout range.
    pub election_timeout_min_ms: u64,
    /// Election timeout range.
    pub election_timeout_max_ms: u64,
    /// Snapshot a group after this many entries (small, so restarts install snapshots).
    pub snapshot_every_entries: u64,
    /// `RUST_LOG` of the nodes.
    pub log_filter: String,
    /// A guarantee the nodes break on purpose (negative controls of the checker).
    pub negative_control: NegativeControl,
    /// Ids `nodes + 1..=nodes + spare_nodes` get certificates and addresses (and namespaces)
    /// but no process: [`Cluster::add_node`] starts them later, joining the running cluster.
    pub spare_nodes: u64,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            nodes: 3,
            groups: 8,
            heartbeat_ms: 100,
            election_timeout_min_ms: 600,
            election_timeout_max_ms: 900,
            snapshot_every_entries: 500,
            log_filter: "info,openraft=warn".into(),
            negative_control: NegativeControl::None,
            spare_nodes: 0,
        }
    }
}

/// What a node process is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeState {
    /// Running.
    Running,
    /// Stopped by SIGSTOP.
    Paused,
    /// Killed by the nemesis (not restarted yet).
    Killed,
    /// Removed from the cluster for good (its process stopped; never started again).
    Removed,
}

#[derive(Debug)]
struct NodeProcess {
    config_path: PathBuf,
    log_path: PathBuf,
    faketime_file: PathBuf,
    quic_addr: SocketAddr,
    http_addr: SocketAddr,
    child: Option<Child>,
    state: NodeState,
    /// Peers whose traffic this node drops (loopback partitions), re-applied after a restart.
    dropped: BTreeSet<u64>,
}

impl NodeProcess {
    /// Checks `config` and writes node `id`'s configuration and faketime files into `node_dir`;
    /// the process, not started yet.
    fn write(
        dir: &Path,
        node_dir: &Path,
        config: &ServerConfig,
        addrs: &PeerConfig,
    ) -> Result<NodeProcess, HarnessError> {
        let id = config.node_id;
        config
            .validate()
            .map_err(|e| HarnessError::Cluster(format!("node {id} configuration: {e}")))?;
        let config_path = node_dir.join("tenure.toml");
        let text = config
            .to_toml()
            .map_err(|e| HarnessError::Cluster(format!("node {id} configuration: {e}")))?;
        std::fs::write(&config_path, text)
            .map_err(|e| HarnessError::io("writing a node configuration", e))?;
        let faketime_file = node_dir.join("faketime");
        std::fs::write(&faketime_file, "+0s\n")
            .map_err(|e| HarnessError::io("writing a faketime file", e))?;
        Ok(NodeProcess {
            config_path,
            log_path: dir.join(format!("node-{id}.log")),
            faketime_file,
            quic_addr: addrs.addr,
            http_addr: addrs.http_addr,
            child: None,
            state: NodeState::Killed,
            dropped: BTreeSet::new(),
        })
    }
}

type HttpClient = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    Full<Bytes>,
>;

/// The node processes of one run.
pub struct Cluster {
    dir: PathBuf,
    network: Network,
    exe: PathBuf,
    faketime_library: Option<PathBuf>,
    nodes: BTreeMap<u64, NodeProcess>,
    options: ClusterOptions,
    ttl_ms_min: u64,
    cluster_file: PathBuf,
    ca_pem: String,
    http: HttpClient,
    /// Nodes that exited without the nemesis killing them: (node, status).
    unexpected_exits: Vec<(u64, String)>,
    /// Ids with certificates and addresses that no process has used yet (lowest first).
    spares: BTreeMap<u64, (SocketAddr, SocketAddr)>,
    certs: PathBuf,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("dir", &self.dir)
            .field("network", &self.network.mode())
            .finish_non_exhaustive()
    }
}

/// The libfaketime library, when installed.
pub fn faketime_library() -> Option<PathBuf> {
    FAKETIME_LIBRARIES
        .iter()
        .map(PathBuf::from)
        .find(|path| path.exists())
}

impl Cluster {
    /// Writes certificates and configurations into `dir` and starts every node with `exe`.
    pub fn start(
        dir: &Path,
        network: Network,
        exe: &Path,
        options: ClusterOptions,
    ) -> Result<Cluster, HarnessError> {
        let ids: Vec<u64> = (1..=options.nodes).collect();
        let all_ids: Vec<u64> = (1..=options.nodes + options.spare_nodes).collect();
        let certs = dir.join("certs");
        tenure_transport::certs::write_cluster_certificates(
            &certs,
            CLUSTER_NAME,
            &all_ids,
            &network.certificate_ips(),
        )
        .map_err(|e| HarnessError::Cluster(format!("writing certificates: {e}")))?;
        let ca_pem = std::fs::read_to_string(certs.join("ca.pem"))
            .map_err(|e| HarnessError::io("reading ca.pem", e))?;
        let peers: BTreeMap<u64, PeerConfig> = ids
            .iter()
            .map(|&id| {
                let (addr, http_addr) = network.node_addrs(id);
                (id, PeerConfig { addr, http_addr })
            })
            .collect();
        let mut nodes = BTreeMap::new();
        let mut ttl_ms_min = 0;
        for &id in &ids {
            let node_dir = dir.join(format!("node-{id}"));
            std::fs::create_dir_all(&node_dir)
                .map_err(|e| HarnessError::io("creating a node directory", e))?;
            let config = node_config(id, &node_dir.join("data"), &certs, &peers, &options);
            ttl_ms_min = config.effective_ttl_ms_min();
            nodes.insert(
                id,
                NodeProcess::write(dir, &node_dir, &config, &peers[&id])?,
            );
        }
        let cluster_file = dir.join("cluster.json");
        let json = serde_json::json!({
            "nodes": ids.iter().map(|id| serde_json::json!({
                "id": id,
                "client": nodes[id].quic_addr.to_string(),
                "http": format!("http://{}", nodes[id].http_addr),
            })).collect::<Vec<_>>(),
            "groups": options.groups,
            "ca_cert": certs.join("ca.pem"),
        });
        std::fs::write(&cluster_file, json.to_string())
            .map_err(|e| HarnessError::io("writing cluster.json", e))?;
        let http =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http();
        let spares = (options.nodes + 1..=options.nodes + options.spare_nodes)
            .map(|id| (id, network.node_addrs(id)))
            .collect();
        let mut cluster = Cluster {
            dir: dir.to_path_buf(),
            network,
            exe: exe.to_path_buf(),
            faketime_library: faketime_library(),
            nodes,
            options,
            ttl_ms_min,
            cluster_file,
            ca_pem,
            http,
            unexpected_exits: Vec::new(),
            spares,
            certs,
        };
        for id in ids {
            cluster.spawn(id)?;
        }
        Ok(cluster)
    }

    /// The run directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Ids of the nodes that are part of the cluster (started at least once, not removed).
    pub fn ids(&self) -> Vec<u64> {
        self.nodes
            .iter()
            .filter(|(_, node)| node.state != NodeState::Removed)
            .map(|(&id, _)| id)
            .collect()
    }

    /// The next spare id and its QUIC and HTTP addresses, if any is left.
    pub fn next_spare(&self) -> Option<(u64, SocketAddr, SocketAddr)> {
        self.spares
            .iter()
            .next()
            .map(|(&id, &(addr, http_addr))| (id, addr, http_addr))
    }

    /// Starts spare node `id` as a node joining the running cluster (`join_existing`, the
    /// current members as its seeds); the caller announces it in the node table.
    pub fn add_node(&mut self, id: u64) -> Result<(), HarnessError> {
        let (addr, http_addr) = self
            .spares
            .remove(&id)
            .ok_or_else(|| HarnessError::Cluster(format!("node {id} is not a spare")))?;
        let mut peers: BTreeMap<u64, PeerConfig> = self
            .nodes
            .iter()
            .filter(|(_, node)| node.state != NodeState::Removed)
            .map(|(&peer, node)| {
                (
                    peer,
                    PeerConfig {
                        addr: node.quic_addr,
                        http_addr: node.http_addr,
                    },
                )
            })
            .collect();
        peers.insert(id, PeerConfig { addr, http_addr });
        let node_dir = self.dir.join(format!("node-{id}"));
        std::fs::create_dir_all(&node_dir)
            .map_err(|e| HarnessError::io("creating a node directory", e))?;
        let mut config = node_config(
            id,
            &node_dir.join("data"),
            &self.certs,
            &peers,
            &self.options,
        );
        config.cluster.join_existing = true;
        let process = NodeProcess::write(&self.dir, &node_dir, &config, &peers[&id])?;
        self.nodes.insert(id, process);
        self.spawn(id)
    }

    /// Stops node `id` for good (SIGKILL; a paused node too): it leaves [`Cluster::ids`] and
    /// is never restarted.
    pub fn retire(&mut self, id: u64) -> Result<(), HarnessError> {
        if self.state(id) == Some(NodeState::Paused) {
            let _ = self.signal(id, rustix::process::Signal::CONT);
        }
        self.kill(id)?;
        self.node(id)?.state = NodeState::Removed;
        Ok(())
    }

    /// The number of Raft groups.
    pub fn groups(&self) -> u32 {
        self.options.groups
    }

    /// The network's kind.
    pub fn network_mode(&self) -> NetworkMode {
        self.network.mode()
    }

    /// Why the run has no namespaces, when it has none.
    pub fn network_fallback_reason(&self) -> Option<&str> {
        self.network.fallback_reason.as_deref()
    }

    /// True when wall clock jumps can be injected (libfaketime is installed).
    pub fn can_jump_wall_clocks(&self) -> bool {
        self.faketime_library.is_some()
    }

    /// The shortest ttl the nodes grant.
    pub fn ttl_ms_min(&self) -> u64 {
        self.ttl_ms_min
    }

    /// `cluster.json` for clients.
    pub fn cluster_file(&self) -> &Path {
        &self.cluster_file
    }

    /// The options the cluster was built with.
    pub fn options(&self) -> &ClusterOptions {
        &self.options
    }

    /// Node `id`'s state.
    pub fn state(&self, id: u64) -> Option<NodeState> {
        self.nodes.get(&id).map(|node| node.state)
    }

    /// A node's log file.
    pub fn log_path(&self, id: u64) -> Option<&Path> {
        self.nodes.get(&id).map(|node| node.log_path.as_path())
    }

    fn node(&mut self, id: u64) -> Result<&mut NodeProcess, HarnessError> {
        self.nodes
            .get_mut(&id)
            .ok_or_else(|| HarnessError::Cluster(format!("no node {id}")))
    }

    fn spawn(&mut self, id: u64) -> Result<(), HarnessError> {
        let prefix = self.network.command_prefix(id);
        let exe = self.exe.clone();
        let faketime = self.faketime_library.clone();
        let filter = self.options.log_filter.clone();
        let node = self.node(id)?;
        if node.child.is_some() {
            return Err(HarnessError::Cluster(format!(
                "node {id} is already running"
            )));
        }
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log_path)
            .map_err(|e| HarnessError::io("opening a node log", e))?;
        let _ = writeln!(log, "===== nemesis: starting node {id} =====");
        let mut command = match prefix.split_first() {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(&exe);
                command
            }
            None => Command::new(&exe),
        };
        command
            .arg("node")
            .arg("--config")
            .arg(&node.config_path)
            .env("RUST_LOG", filter)
            .stdin(Stdio::null())
            .stdout(
                log.try_clone()
                    .map_err(|e| HarnessError::io("cloning a log handle", e))?,
            )
            .stderr(log);
        if let Some(library) = faketime {
            command
                .env("LD_PRELOAD", library)
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
                .env("FAKETIME_TIMESTAMP_FILE", &node.faketime_file)
                .env("FAKETIME_CACHE_DURATION", "1");
        }
        let child = command
            .spawn()
            .map_err(|e| HarnessError::io(format!("starting node {id}"), e))?;
        node.child = Some(child);
        node.state = NodeState::Running;
        Ok(())
    }

    fn signal(&mut self, id: u64, signal: rustix::process::Signal) -> Result<(), HarnessError> {
        let node = self.node(id)?;
        let pid = node
            .child
            .as_ref()
            .and_then(|child| i32::try_from(child.id()).ok())
            .and_then(rustix::process::Pid::from_raw)
            .ok_or_else(|| HarnessError::Cluster(format!("node {id} is not running")))?;
        rustix::process::kill_process(pid, signal)
            .map_err(|e| HarnessError::io(format!("signalling node {id}"), e.into()))
    }

    /// SIGKILL, then reap.
    pub fn kill(&mut self, id: u64) -> Result<(), HarnessError> {
        let node = self.node(id)?;
        if let Some(mut child) = node.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if node.state != NodeState::Removed {
            node.state = NodeState::Killed;
        }
        Ok(())
    }

    /// Starts a killed node again on its data directory.
    pub async fn restart(&mut self, id: u64) -> Result<(), HarnessError> {
        if self.state(id) != Some(NodeState::Killed) {
            return Ok(());
        }
        self.spawn(id)?;
        self.reapply_dropped(id).await;
        Ok(())
    }

    /// SIGSTOP.
    pub fn pause(&mut self, id: u64) -> Result<(), HarnessError> {
        if self.state(id) != Some(NodeState::Running) {
            return Ok(());
        }
        self.signal(id, rustix::process::Signal::STOP)?;
        self.node(id)?.state = NodeState::Paused;
        Ok(())
    }

    /// SIGCONT.
    pub async fn resume(&mut self, id: u64) -> Result<(), HarnessError> {
        if self.state(id) != Some(NodeState::Paused) {
            return Ok(());
        }
        self.signal(id, rustix::process::Signal::CONT)?;
        self.node(id)?.state = NodeState::Running;
        self.reapply_dropped(id).await;
        Ok(())
    }

    /// Nodes that exited although nobody killed them (a crash: a broken invariant aborts).
    pub fn check_exits(&mut self) -> Vec<(u64, String)> {
        let mut exited = Vec::new();
        for (&id, node) in &mut self.nodes {
            let status: Option<ExitStatus> = node
                .child
                .as_mut()
                .and_then(|child| child.try_wait().ok().flatten());
            if let Some(status) = status {
                node.child = None;
                node.state = NodeState::Killed;
                exited.push((id, status.to_string()));
            }
        }
        self.unexpected_exits.extend(exited.iter().cloned());
        exited
    }

    /// Every unexpected exit seen so far.
    pub fn unexpected_exits(&self) -> &[(u64, String)] {
        &self.unexpected_exits
    }

    /// Changes node `id`'s faults through its fault control.
    pub async fn set_faults(
        &self,
        id: u64,
        settings: &FaultSettings,
    ) -> Result<FaultState, HarnessError> {
        let node = self
            .nodes
            .get(&id)
            .ok_or_else(|| HarnessError::Cluster(format!("no node {id}")))?;
        if node.state != NodeState::Running {
            return Err(HarnessError::Cluster(format!(
                "node {id} is {:?}: its faults cannot be changed",
                node.state
            )));
        }
        let body = serde_json::to_vec(settings)
            .map_err(|e| HarnessError::Cluster(format!("fault settings: {e}")))?;
        let request = hyper::Request::post(format!(
            "http://{}{}",
            node.http_addr,
            tenure_server::http::TESTING_FAULTS_PATH
        ))
        .header("content-type", "application/json")
        // `/testing/*` needs a caller; the suite's nodes run in insecure development mode.
        .header(tenure_server::http::PRINCIPAL_TENANT_HEADER, "nemesis")
        .header(tenure_server::http::PRINCIPAL_ID_HEADER, "nemesis")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| HarnessError::Cluster(format!("fault request: {e}")))?;
        let exchange = async {
            let response = self
                .http
                .request(request)
                .await
                .map_err(|e| format!("fault control of node {id}: {e}"))?;
            let status = response.status();
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|e| format!("fault control of node {id}: {e}"))?
                .to_bytes();
            if !status.is_success() {
                return Err(format!(
                    "fault control of node {id} answered {status}: {}",
                    String::from_utf8_lossy(&body)
                ));
            }
            serde_json::from_slice::<FaultState>(&body)
                .map_err(|e| format!("fault control of node {id}: {e}"))
        };
        match tokio::time::timeout(FAULT_CONTROL_TIMEOUT, exchange).await {
            Ok(result) => result.map_err(HarnessError::Cluster),
            Err(_) => Err(HarnessError::Cluster(format!(
                "fault control of node {id} did not answer"
            ))),
        }
    }

    /// Moves node `id`'s wall clock `offset_s` seconds away from the real one (libfaketime
    /// rereads the file within a second). Its monotonic clock is untouched.
    pub fn set_wall_clock_offset(&self, id: u64, offset_s: i64) -> Result<(), HarnessError> {
        if self.faketime_library.is_none() {
            return Err(HarnessError::Cluster(
                "libfaketime is not installed (Debian package faketime)".into(),
            ));
        }
        let node = self
            .nodes
            .get(&id)
            .ok_or_else(|| HarnessError::Cluster(format!("no node {id}")))?;
        let text = if offset_s >= 0 {
            format!("+{offset_s}s\n")
        } else {
            format!("{offset_s}s\n")
        };
        std::fs::write(&node.faketime_file, text)
            .map_err(|e| HarnessError::io("writing a faketime file", e))
    }

    /// Cuts exactly the directed links in `blocked` (`(a, b)`: `a` neither sends to nor hears
    /// from `b`; a symmetric partition names both directions) and heals every other.
    pub async fn set_partition(
        &mut self,
        blocked: &BTreeSet<(u64, u64)>,
    ) -> Result<(), HarnessError> {
        if self.network.mode() == NetworkMode::Namespaces {
            return self
                .network
                .write_rules(blocked)
                .map_err(HarnessError::Network);
        }
        let ids = self.ids();
        for id in ids {
            let dropped: BTreeSet<u64> = blocked
                .iter()
                .filter(|&&(from, _)| from == id)
                .map(|&(_, to)| to)
                .collect();
            self.node(id)?.dropped = dropped;
            self.reapply_dropped(id).await;
        }
        Ok(())
    }

    /// Loopback partitions live in the node process: a restarted or resumed node gets its set
    /// again (a stopped node is skipped and caught up on resume).
    async fn reapply_dropped(&self, id: u64) {
        if self.network.mode() == NetworkMode::Namespaces {
            return;
        }
        let Some(node) = self.nodes.get(&id) else {
            return;
        };
        if node.state != NodeState::Running {
            return;
        }
        let settings = FaultSettings {
            drop_to_peers: Some(node.dropped.iter().copied().collect()),
            ..FaultSettings::default()
        };
        // A node that just started may not serve HTTP yet: retry briefly.
        for _ in 0..50 {
            if self.set_faults(id, &settings).await.is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tracing::warn!(node = id, "could not re-apply its partition");
    }

    /// A client of the cluster for the nemesis itself (status, final reads).
    pub async fn connect_client(&self) -> Result<Client, HarnessError> {
        let endpoints = self
            .nodes
            .iter()
            .map(|(&id, node)| Endpoint {
                node_id: Some(id),
                addr: node.quic_addr,
            })
            .collect();
        let mut config = ClientConfig::new(
            endpoints,
            self.ca_pem.clone(),
            Credentials::InsecureDev {
                principal_id: "nemesis".into(),
            },
        );
        config.call_timeout = Duration::from_secs(3);
        config.attempt_timeout = Duration::from_millis(800);
        Client::connect(config)
            .await
            .map_err(|e| HarnessError::Cluster(format!("connecting the nemesis client: {e}")))
    }

    /// The status of every running node that answers within `timeout`.
    pub async fn statuses(&self, client: &Client, timeout: Duration) -> BTreeMap<u64, NodeStatus> {
        let mut statuses = BTreeMap::new();
        let mut refreshed = false;
        for (&id, node) in &self.nodes {
            if node.state != NodeState::Running {
                continue;
            }
            let mut asked = tokio::time::timeout(timeout, client.node_status(id)).await;
            if matches!(asked, Ok(Err(ClientError::InvalidRequest(_)))) && !refreshed {
                // A node added during the run: the client learns it from a fresh routing
                // table (its node list).
                refreshed = true;
                let _ = tokio::time::timeout(timeout, client.refresh_routing()).await;
                asked = tokio::time::timeout(timeout, client.node_status(id)).await;
            }
            if let Ok(Ok(status)) = asked {
                statuses.insert(id, status);
            }
        }
        statuses
    }

    /// Stops every node (SIGCONT first for paused ones, then SIGKILL).
    pub fn stop_all(&mut self) {
        let ids: Vec<u64> = self.nodes.keys().copied().collect();
        for id in ids {
            if self.state(id) == Some(NodeState::Paused) {
                let _ = self.signal(id, rustix::process::Signal::CONT);
            }
            let _ = self.kill(id);
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop_all();
    }
}

/// One node's configuration: fast timing (a small ttl floor, quick failover), small snapshots
/// (restarts install them), fault control on, fsync on.
fn node_config(
    id: u64,
    data_dir: &Path,
    certs: &Path,
    peers: &BTreeMap<u64, PeerConfig>,
    options: &ClusterOptions,
) -> ServerConfig {
    let timing = TimingConfig {
        heartbeat_ms: options.heartbeat_ms,
        election_timeout_min_ms: options.election_timeout_min_ms,
        election_timeout_max_ms: options.election_timeout_max_ms,
        snapshot_every_entries: options.snapshot_every_entries,
        ..TimingConfig::default()
    };
    ServerConfig {
        node_id: id,
        cluster_name: CLUSTER_NAME.to_string(),
        data_dir: data_dir.to_path_buf(),
        peers: peers.clone(),
        groups: options.groups,
        replication_factor: u32::try_from(options.nodes).unwrap_or(3).min(3),
        tls: TlsConfig {
            ca_cert: certs.join("ca.pem"),
            node_cert: certs.join(format!("node-{id}.pem")),
            node_key: certs.join(format!("node-{id}.key")),
        },
        timing,
        limits: LimitsConfig::default(),
        auth: AuthConfig {
            insecure_dev_mode: true,
            tokens: Vec::new(),
        },
        storage: StorageConfig {
            fsync: true,
            block_cache_bytes: 8 << 20,
            write_buffer_bytes: 8 << 20,
        },
        // The placement controller looks every second, so the membership nemeses see it act
        // within a step. A node is dead 2 s after its connection is gone, and a connection goes
        // after QUIC's 10 s idle timeout: longer than any transient fault (6 s at most).
        cluster: ClusterConfig {
            placement_interval_ms: 1_000,
            node_dead_after_ms: 2_000,
            // Unpaced: a drain nemesis's moves run within its step.
            move_pause_ms: 0,
            ..ClusterConfig::default()
        },
        testing: TestingConfig {
            fault_control: true,
            negative_control: options.negative_control,
            ..TestingConfig::default()
        },
    }
}
