//! `tenure dev`: a local cluster of separate node processes on 127.0.0.1, in one command.
//!
//! The first run on a directory creates it: certificates (`DIR/certs`), one configuration per
//! node (`DIR/node-N/tenure.toml`, data in `DIR/node-N/data`, insecure development mode on) and
//! `DIR/dev.toml`, which records the cluster's shape. Later runs on the same directory reuse all
//! of it, so the same cluster restarts with its data; flags that disagree with the recorded shape
//! are refused. A few settings may change between runs: `--fsync`, and the state limits
//! `--node-memory-budget-bytes` and `--tenant-active-leases-max` (recorded in the nodes'
//! configurations, `[limits]`, which every start of a node reads; a run that gives one rewrites
//! every node's configuration with it, and later runs without it keep it).
//!
//! Each node is this executable (`tenure serve --config ... --allow-insecure-loopback-only`:
//! development nodes trust claimed principals, which `tenure serve` runs only with that flag and
//! on loopback) in its own process and process group, with stdout and stderr appended to
//! `DIR/node-N/node.log`.
//!
//! Once every node answers `GET /readyz` with 200 (every group has a leader), `DIR/cluster.json`
//! is written; it exists exactly while the cluster is up (it is removed at start and at stop).
//! From then on a node that dies is reported and the others keep serving ([`supervisor`]);
//! `tenure dev status | stop N | kill N | start N | restart N` drive the running cluster through
//! its control socket `DIR/control.sock` ([`control`]). SIGINT or SIGTERM (or `--duration-s`)
//! stops the nodes with SIGTERM (graceful: leadership is handed off), waits up to 20 s, then
//! kills what is left.
//!
//! Must not depend on: the node's internals; it talks to nodes only as a user would (processes,
//! files, HTTP).

pub mod control;
mod supervisor;

use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tracing::{info, warn};

use self::supervisor::{StopSignals, Supervisor};

use crate::ServerError;
use crate::config::{self, PeerConfig, ServerConfig};

/// Default directory of `tenure dev`.
pub const DEFAULT_DIR: &str = "tenure-dev";
/// Default number of nodes.
pub const DEFAULT_NODES: u32 = 3;
/// The cores this process may run on (1 when the system cannot tell).
fn cores_available() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

/// Groups per core of the machine in a new development cluster (see [`default_groups`]).
pub const GROUPS_PER_CORE: u32 = 4;
/// Fewest groups a new development cluster gets by default.
pub const DEFAULT_GROUPS_MIN: u32 = 8;
/// Most groups a new development cluster gets by default.
pub const DEFAULT_GROUPS_MAX: u32 = 64;

/// The number of groups of a new development cluster when `--groups` is not given: four per
/// core available to this process, at least 8 and at most 64 (8 on a 2-core machine, 64 from 16
/// cores on).
///
/// Why it follows the cores: every node of a development cluster shares this machine, and a
/// Raft entry costs about the same CPU whatever it carries, so the fewer groups share the load,
/// the more operations each entry carries. On a 2-core machine with three nodes
/// (`bench/perf-smoke.sh`, mixed 20/70/10, 1,024 callers; `bench/results/2026-12-02/`) 8 groups
/// served about 33.4k ops/s at 53 operations per entry, 64 groups 16.8k at 8, 256 groups 4.5k at
/// 2. At least 8 keeps the leaders spread over the nodes; placement slots do not depend on the
/// group count.
pub fn default_groups() -> u32 {
    let cores = u32::try_from(cores_available()).unwrap_or(u32::MAX);
    cores
        .saturating_mul(GROUPS_PER_CORE)
        .clamp(DEFAULT_GROUPS_MIN, DEFAULT_GROUPS_MAX)
}
/// Default base port: node N listens on `base + N` (QUIC, UDP) and `base + 100 + N` (HTTP).
pub const DEFAULT_BASE_PORT: u16 = 7400;
/// Largest number of nodes (HTTP ports start 100 above the QUIC ports).
pub const NODES_MAX: u32 = 99;
/// Cluster name of development clusters.
pub const DEV_CLUSTER_NAME: &str = "tenure-dev";
/// How long a node may take to stop after SIGTERM before it is killed.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(20);
/// The shape file inside the directory.
pub const SHAPE_FILE: &str = "dev.toml";
/// The cluster file inside the directory.
pub const CLUSTER_FILE: &str = "cluster.json";
/// Lines of a node's log shown when it fails.
const LOG_TAIL_LINES: usize = 40;

/// What `tenure dev` was asked to do. `None` means "the recorded value, or the default for a new
/// directory".
#[derive(Debug, Clone)]
pub struct DevOptions {
    /// The cluster's directory (default `./tenure-dev`).
    pub data_dir: PathBuf,
    /// Number of nodes (default 3).
    pub nodes: Option<u32>,
    /// Number of groups (default: [`default_groups`], four per core, 8 to 64).
    pub groups: Option<u32>,
    /// Base port (default 7400); 0 picks free ports.
    pub base_port: Option<u16>,
    /// Whether nodes fsync before acknowledging (default true). May change between runs.
    pub fsync: Option<bool>,
    /// Stop by itself after this long once ready (for scripts and tests).
    pub duration: Option<Duration>,
    /// How long every node may take to become ready.
    pub ready_timeout: Duration,
    /// The node executable (default: this executable). It is run as
    /// `EXE serve --config FILE --allow-insecure-loopback-only --worker-threads N`.
    pub executable: Option<PathBuf>,
    /// Restart a node that died by itself after this long (doubled for each death within a
    /// minute of its start, at most a minute); `None` waits for `tenure dev restart N`.
    pub restart_after: Option<Duration>,
    /// Each node's lease-state budget, `limits.node_memory_budget_bytes`, which sizes every
    /// group's record maxima (default: [`tenure_core::NODE_STATE_BYTES_DEFAULT`] split over the
    /// nodes, or the value recorded in the nodes' configurations). May change between runs.
    pub node_memory_budget_bytes: Option<u64>,
    /// A tenant's cluster-wide active-lease quota, `limits.tenant_active_leases_max` (default
    /// [`tenure_core::TENANT_ACTIVE_LEASES_MAX_DEFAULT`], or the recorded value). May change
    /// between runs.
    pub tenant_active_leases_max: Option<u64>,
    /// Log entries between a group's snapshots, `timing.snapshot_every_entries` (default 10,000,
    /// or the recorded value). May change between runs.
    pub snapshot_every_entries: Option<u64>,
    /// Leases a group reclaims per second while its reclaim is on time,
    /// `timing.expire_paced_leases_per_s` (default 2,500, or the recorded value; 0 = no
    /// pacing). May change between runs.
    pub expire_paced_leases_per_s: Option<u32>,
    /// Expire commands a group proposes per second at most, `timing.expire_commands_per_s_max`
    /// (default 20, or the recorded value). May change between runs.
    pub expire_commands_per_s_max: Option<u32>,
}

impl Default for DevOptions {
    fn default() -> Self {
        DevOptions {
            data_dir: PathBuf::from(DEFAULT_DIR),
            nodes: None,
            groups: None,
            base_port: None,
            fsync: None,
            duration: None,
            ready_timeout: Duration::from_secs(120),
            executable: None,
            restart_after: None,
            node_memory_budget_bytes: None,
            tenant_active_leases_max: None,
            snapshot_every_entries: None,
            expire_paced_leases_per_s: None,
            expire_commands_per_s_max: None,
        }
    }
}

/// The shape of a development cluster, recorded in `DIR/dev.toml` by its first run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DevShape {
    /// Number of nodes (ids 1..=nodes).
    pub nodes: u32,
    /// Number of groups.
    pub groups: u32,
    /// The base port asked for (0: ports were picked; see the node configurations).
    pub base_port: u16,
    /// Whether nodes fsync.
    pub fsync: bool,
    /// Replicas per group.
    pub replication_factor: u32,
    /// The cluster name.
    pub cluster_name: String,
    /// When the cluster was created, in milliseconds since the Unix epoch.
    pub created_unix_ms: u64,
}

/// Why `tenure dev` failed.
#[derive(Debug, thiserror::Error)]
pub enum DevError {
    /// The flags cannot be used (or disagree with the directory's recorded shape).
    #[error("{0}")]
    Options(String),
    /// Setting up or reading the directory failed.
    #[error(transparent)]
    Setup(Box<ServerError>),
    /// A node's configuration is unusable.
    #[error(transparent)]
    Config(Box<config::ConfigError>),
    /// A node process could not be started.
    #[error("cannot start node {node} ({}): {source}", executable.display())]
    Spawn {
        /// The node.
        node: u64,
        /// The executable.
        executable: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A node process exited while the cluster was supposed to run.
    #[error("node {node} exited ({status}); the last lines of {}:\n{tail}", log.display())]
    NodeExited {
        /// The node.
        node: u64,
        /// How it exited.
        status: ExitStatus,
        /// Its log file.
        log: PathBuf,
        /// The end of its log.
        tail: String,
    },
    /// The control socket of a running `tenure dev` refused a request or did not answer.
    #[error("{0}")]
    Control(String),
    /// Not every node became ready in time.
    #[error("nodes {nodes:?} were not ready after {waited:?}; the end of their logs:\n{tails}")]
    NotReady {
        /// The nodes that were not ready.
        nodes: Vec<u64>,
        /// How long it waited.
        waited: Duration,
        /// The end of their logs.
        tails: String,
    },
}

impl From<ServerError> for DevError {
    fn from(error: ServerError) -> Self {
        DevError::Setup(Box::new(error))
    }
}

impl From<config::ConfigError> for DevError {
    fn from(error: config::ConfigError) -> Self {
        DevError::Config(Box::new(error))
    }
}

/// One node of a prepared cluster.
#[derive(Debug, Clone)]
pub struct DevNode {
    /// Its id.
    pub id: u64,
    /// Its configuration file.
    pub config_path: PathBuf,
    /// Its configuration (as loaded from the file).
    pub config: ServerConfig,
    /// Its log file.
    pub log_path: PathBuf,
}

impl DevNode {
    fn own(&self) -> Result<&PeerConfig, DevError> {
        self.config.own_peer().ok_or_else(|| {
            DevError::Options(format!(
                "{}: node {} is not in its own peers",
                self.config_path.display(),
                self.id
            ))
        })
    }
}

/// A development cluster's directory, ready to start.
#[derive(Debug, Clone)]
pub struct DevCluster {
    /// The directory (absolute).
    pub dir: PathBuf,
    /// The recorded shape.
    pub shape: DevShape,
    /// The nodes, by id.
    pub nodes: Vec<DevNode>,
    /// The cluster CA certificate.
    pub ca_cert: PathBuf,
    /// True when this run created the directory.
    pub created: bool,
}

impl DevCluster {
    /// Where `cluster.json` goes.
    pub fn cluster_file(&self) -> PathBuf {
        self.dir.join(CLUSTER_FILE)
    }

    /// The contents of `cluster.json`: every node's client (QUIC) and HTTP address, the group
    /// count and the CA certificate clients verify nodes with.
    pub fn cluster_json(&self) -> Result<String, DevError> {
        #[derive(Serialize)]
        struct ClusterNode {
            id: u64,
            client: String,
            http: String,
        }
        #[derive(Serialize)]
        struct ClusterFile {
            nodes: Vec<ClusterNode>,
            groups: u32,
            ca_cert: String,
        }
        let mut nodes = Vec::new();
        for node in &self.nodes {
            let own = node.own()?;
            nodes.push(ClusterNode {
                id: node.id,
                client: own.addr.to_string(),
                http: format!("http://{}", own.http_addr),
            });
        }
        let file = ClusterFile {
            nodes,
            groups: self.shape.groups,
            ca_cert: self.ca_cert.to_string_lossy().into_owned(),
        };
        let mut text = serde_json::to_string(&file)
            .map_err(|e| DevError::Options(format!("cannot encode {CLUSTER_FILE}: {e}")))?;
        text.push('\n');
        Ok(text)
    }
}

fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn io_error(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> DevError {
    let context = context.into();
    move |source| DevError::from(ServerError::io(context, source))
}

/// Writes `contents` to `path` atomically (temporary file, fsync, rename, fsync of the directory).
fn write_atomically(path: &Path, contents: &str) -> Result<(), DevError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut temp_name = path.file_name().unwrap_or_default().to_os_string();
    temp_name.push(".tmp");
    let temp = dir.join(temp_name);
    let mut file =
        fs::File::create(&temp).map_err(io_error(format!("creating {}", temp.display())))?;
    file.write_all(contents.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(io_error(format!("writing {}", temp.display())))?;
    drop(file);
    fs::rename(&temp, path).map_err(io_error(format!("renaming to {}", path.display())))?;
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_error(format!("syncing {}", dir.display())))?;
    Ok(())
}

/// Creates the cluster's directory on the first run, or checks and reuses it on later runs.
/// Starts nothing.
pub fn prepare(options: &DevOptions) -> Result<DevCluster, DevError> {
    let dir = std::path::absolute(&options.data_dir).map_err(io_error(format!(
        "resolving {}",
        options.data_dir.display()
    )))?;
    let shape_path = dir.join(SHAPE_FILE);
    if shape_path.exists() {
        reuse(options, dir)
    } else {
        create(options, dir)
    }
}

/// A file in a node's directory saying it was removed from the cluster for good.
const REMOVED_MARKER: &str = "REMOVED";

/// Marks node `id` of the cluster in `dir` removed: later runs do not start it.
pub(super) fn mark_removed(dir: &Path, id: u64) -> Result<(), DevError> {
    write_atomically(
        &node_dir(dir, id).join(REMOVED_MARKER),
        "removed from the cluster's node table by `tenure dev replace`\n",
    )
}

fn node_dir(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("node-{id}"))
}

fn reuse(options: &DevOptions, dir: PathBuf) -> Result<DevCluster, DevError> {
    let shape_path = dir.join(SHAPE_FILE);
    let text = fs::read_to_string(&shape_path)
        .map_err(io_error(format!("reading {}", shape_path.display())))?;
    let mut shape: DevShape = toml::from_str(&text).map_err(|e| {
        DevError::Options(format!(
            "{} is garbled: {}",
            shape_path.display(),
            e.message()
        ))
    })?;
    let disagree = |flag: &str, given: String, recorded: String| {
        DevError::Options(format!(
            "{} holds a cluster created with --{flag} {recorded}, not {given}; drop --{flag} to \
             restart that cluster, or pass another --data-dir for a new one",
            dir.display()
        ))
    };
    if let Some(nodes) = options.nodes.filter(|n| *n != shape.nodes) {
        return Err(disagree(
            "nodes",
            nodes.to_string(),
            shape.nodes.to_string(),
        ));
    }
    if let Some(groups) = options.groups.filter(|g| *g != shape.groups) {
        return Err(disagree(
            "groups",
            groups.to_string(),
            shape.groups.to_string(),
        ));
    }
    if let Some(port) = options.base_port.filter(|p| *p != shape.base_port) {
        return Err(disagree(
            "base-port",
            port.to_string(),
            shape.base_port.to_string(),
        ));
    }
    let change_fsync = options.fsync.filter(|f| *f != shape.fsync);
    let mut limits_changed = false;
    let mut nodes = Vec::new();
    for id in 1..=u64::from(shape.nodes) {
        let node_dir = node_dir(&dir, id);
        if node_dir.join(REMOVED_MARKER).exists() {
            // Replaced (`tenure dev replace`): removed from the node table for good.
            continue;
        }
        let config_path = node_dir.join("tenure.toml");
        let mut config = config::load(&config_path)?;
        if config.node_id != id {
            return Err(DevError::Options(format!(
                "{} is the configuration of node {}, expected node {id}",
                config_path.display(),
                config.node_id
            )));
        }
        let mut changed = false;
        if let Some(fsync) = change_fsync {
            config.storage.fsync = fsync;
            changed = true;
        }
        if apply_state_limits(&mut config, options) {
            config.validate()?;
            changed = true;
            limits_changed = true;
        }
        if changed {
            write_node_config(&config_path, &config)?;
        }
        nodes.push(DevNode {
            id,
            config_path,
            config,
            log_path: node_dir.join("node.log"),
        });
    }
    if let Some(fsync) = change_fsync {
        shape.fsync = fsync;
        write_shape(&dir, &shape)?;
        info!(fsync, "changed the nodes' storage.fsync");
    }
    if limits_changed {
        info!(
            node_memory_budget_bytes = ?options.node_memory_budget_bytes,
            tenant_active_leases_max = ?options.tenant_active_leases_max,
            snapshot_every_entries = ?options.snapshot_every_entries,
            expire_paced_leases_per_s = ?options.expire_paced_leases_per_s,
            expire_commands_per_s_max = ?options.expire_commands_per_s_max,
            "changed the nodes' state limits"
        );
    }
    let ca_cert = nodes
        .first()
        .map(|node| node.config.tls.ca_cert.clone())
        .unwrap_or_else(|| dir.join("certs").join(tenure_transport::tls::CA_CERT_FILE));
    Ok(DevCluster {
        dir,
        shape,
        nodes,
        ca_cert,
        created: false,
    })
}

fn create(options: &DevOptions, dir: PathBuf) -> Result<DevCluster, DevError> {
    let nodes = options.nodes.unwrap_or(DEFAULT_NODES);
    let groups = options.groups.unwrap_or_else(default_groups);
    let base_port = options.base_port.unwrap_or(DEFAULT_BASE_PORT);
    let fsync = options.fsync.unwrap_or(true);
    if nodes == 0 || nodes > NODES_MAX {
        return Err(DevError::Options(format!(
            "--nodes must be within 1..={NODES_MAX}, got {nodes}"
        )));
    }
    if base_port != 0 && u32::from(base_port) + 100 + nodes > u32::from(u16::MAX) {
        return Err(DevError::Options(format!(
            "--base-port {base_port} leaves no room for {nodes} nodes (ports base+1..base+{nodes} \
             and base+101..base+{}); use a lower one, or 0 to pick free ports",
            100 + nodes
        )));
    }
    let not_empty = fs::read_dir(&dir).is_ok_and(|mut entries| entries.next().is_some());
    if not_empty {
        return Err(DevError::Options(format!(
            "{} exists, is not empty and has no {SHAPE_FILE}, so it is not a tenure dev \
             directory (or its first run was interrupted); remove it or pass another --data-dir",
            dir.display()
        )));
    }

    let ids: Vec<u64> = (1..=u64::from(nodes)).collect();
    let ports = pick_ports(base_port, &ids)?;
    let certs_dir = dir.join("certs");
    let peers: BTreeMap<u64, PeerConfig> = ids
        .iter()
        .zip(&ports)
        .map(|(id, (quic, http))| {
            (
                *id,
                PeerConfig {
                    addr: SocketAddr::from((Ipv4Addr::LOCALHOST, *quic)),
                    http_addr: SocketAddr::from((Ipv4Addr::LOCALHOST, *http)),
                },
            )
        })
        .collect();
    let replication_factor = nodes.min(3);
    let mut dev_nodes = Vec::new();
    for id in &ids {
        let node_dir = node_dir(&dir, *id);
        let mut config =
            ServerConfig::with_defaults(*id, node_dir.join("data"), peers.clone(), &certs_dir);
        config.cluster_name = DEV_CLUSTER_NAME.to_owned();
        config.groups = groups;
        config.replication_factor = replication_factor;
        config.auth.insecure_dev_mode = true;
        config.storage.fsync = fsync;
        // Every development node runs on this one machine: together they keep to one node's
        // default budget (half the reference machine's memory), not one budget each.
        config.limits.node_memory_budget_bytes =
            tenure_core::NODE_STATE_BYTES_DEFAULT / u64::from(nodes.max(1));
        apply_state_limits(&mut config, options);
        config.validate()?;
        dev_nodes.push(DevNode {
            id: *id,
            config_path: node_dir.join("tenure.toml"),
            config,
            log_path: node_dir.join("node.log"),
        });
    }

    fs::create_dir_all(&dir).map_err(io_error(format!("creating {}", dir.display())))?;
    let paths = crate::certs::generate(
        &certs_dir,
        DEV_CLUSTER_NAME,
        &ids,
        &[Ipv4Addr::LOCALHOST.into()],
    )?;
    for node in &dev_nodes {
        let node_dir = node_dir(&dir, node.id);
        fs::create_dir_all(&node_dir)
            .map_err(io_error(format!("creating {}", node_dir.display())))?;
        write_node_config(&node.config_path, &node.config)?;
    }
    let shape = DevShape {
        nodes,
        groups,
        base_port,
        fsync,
        replication_factor,
        cluster_name: DEV_CLUSTER_NAME.to_owned(),
        created_unix_ms: now_unix_ms(),
    };
    // Last: its presence marks a complete directory.
    write_shape(&dir, &shape)?;
    Ok(DevCluster {
        dir,
        shape,
        nodes: dev_nodes,
        ca_cert: paths.ca_cert,
        created: true,
    })
}

/// Sets the state limits `options` gives (budget, tenant quota), the snapshot interval, the
/// expiry pacing and the Expire command rate in `config`; true when that changed it.
fn apply_state_limits(config: &mut ServerConfig, options: &DevOptions) -> bool {
    let timing_before = (
        config.timing.snapshot_every_entries,
        config.timing.expire_paced_leases_per_s,
        config.timing.expire_commands_per_s_max,
    );
    if let Some(entries) = options.snapshot_every_entries {
        config.timing.snapshot_every_entries = entries;
    }
    if let Some(leases_per_s) = options.expire_paced_leases_per_s {
        config.timing.expire_paced_leases_per_s = leases_per_s;
    }
    if let Some(commands_per_s) = options.expire_commands_per_s_max {
        config.timing.expire_commands_per_s_max = commands_per_s;
    }
    let timing_changed = (
        config.timing.snapshot_every_entries,
        config.timing.expire_paced_leases_per_s,
        config.timing.expire_commands_per_s_max,
    ) != timing_before;
    let limits = &mut config.limits;
    let before = (
        limits.node_memory_budget_bytes,
        limits.tenant_active_leases_max,
    );
    if let Some(bytes) = options.node_memory_budget_bytes {
        limits.node_memory_budget_bytes = bytes;
    }
    if let Some(leases) = options.tenant_active_leases_max {
        limits.tenant_active_leases_max = leases;
    }
    timing_changed
        || (
            limits.node_memory_budget_bytes,
            limits.tenant_active_leases_max,
        ) != before
}

/// Prepares node `id` for a running development cluster: free ports (or `base + id`), a
/// certificate from the cluster's CA, and a configuration that joins the running cluster
/// (`[cluster] join_existing = true`, the existing nodes as seeds). Writes its files; does not
/// start it.
pub(super) fn prepare_added_node(cluster: &DevCluster, id: u64) -> Result<DevNode, DevError> {
    let Some(first) = cluster.nodes.first() else {
        return Err(DevError::Options("the cluster has no node to copy".into()));
    };
    if id == 0 || cluster.nodes.iter().any(|node| node.id == id) {
        return Err(DevError::Options(format!("node {id} exists already")));
    }
    let ports = pick_ports(cluster.shape.base_port, &[id])?;
    let Some(&(quic, http)) = ports.first() else {
        return Err(DevError::Options(format!("no ports for node {id}")));
    };
    let certs_dir = cluster.dir.join("certs");
    let node_dir = node_dir(&cluster.dir, id);
    let mut config = first.config.clone();
    config.node_id = id;
    config.data_dir = node_dir.join("data");
    config.tls.node_cert = certs_dir.join(tenure_transport::tls::node_cert_file_name(id));
    config.tls.node_key = certs_dir.join(tenure_transport::tls::node_key_file_name(id));
    config.peers = cluster
        .nodes
        .iter()
        .filter_map(|node| node.own().ok().map(|own| (node.id, own.clone())))
        .collect();
    config.peers.insert(
        id,
        PeerConfig {
            addr: SocketAddr::from((Ipv4Addr::LOCALHOST, quic)),
            http_addr: SocketAddr::from((Ipv4Addr::LOCALHOST, http)),
        },
    );
    config.cluster.join_existing = true;
    config.validate()?;
    crate::certs::issue_from_existing_ca(
        &certs_dir,
        &[id],
        &[Ipv4Addr::LOCALHOST.into()],
        &certs_dir,
    )?;
    fs::create_dir_all(&node_dir).map_err(io_error(format!("creating {}", node_dir.display())))?;
    let config_path = node_dir.join("tenure.toml");
    write_node_config(&config_path, &config)?;
    Ok(DevNode {
        id,
        config_path,
        config,
        log_path: node_dir.join("node.log"),
    })
}

/// Announces `node` in the running cluster's node table (`AddNode`).
pub(super) async fn announce_node(cluster: &DevCluster, node: &DevNode) -> Result<(), DevError> {
    let own = node.own()?;
    let op = tenure_core::ClusterOp::AddNode(tenure_core::NodeAddresses {
        node_id: node.id,
        addr: own.addr.to_string(),
        http_addr: own.http_addr.to_string(),
    });
    node_table_change(cluster, op).await
}

/// Applies `op` to the running cluster's node table, as node 1 (the development cluster is
/// insecure: every caller is an operator), asking each node until the metadata group's leader
/// takes it.
pub(super) async fn node_table_change(
    cluster: &DevCluster,
    op: tenure_core::ClusterOp,
) -> Result<(), DevError> {
    use tenure_proto::client::{RequestBody, RequestFlags, ResponseBody};
    let Some(first) = cluster.nodes.first() else {
        return Err(DevError::Options("the cluster has no node to ask".into()));
    };
    let tls = tenure_transport::tls::NodeTls::load(
        first.id,
        &first.config.tls.ca_cert,
        &first.config.tls.node_cert,
        &first.config.tls.node_key,
    )
    .map_err(ServerError::from)?;
    let client_config = tls
        .quinn_client_config_for(
            std::sync::Arc::new(quinn::TransportConfig::default()),
            tenure_proto::client::CLIENT_ALPN,
        )
        .map_err(ServerError::from)?;
    let endpoint = quinn::Endpoint::client(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
        .map_err(io_error("binding a QUIC endpoint"))?;
    let targets: BTreeMap<u64, SocketAddr> = cluster
        .nodes
        .iter()
        .filter_map(|n| n.own().ok().map(|own| (n.id, own.addr)))
        .collect();
    let forwarder = crate::forward::Forwarder::new(endpoint, client_config, targets.clone(), None);
    let principal = crate::membership::node_principal(first.id);
    let mut last = String::from("no node answered");
    for _ in 0..10 {
        for &target in targets.keys() {
            let answer = forwarder
                .forward(
                    target,
                    &principal,
                    RequestFlags::default(),
                    RequestBody::ClusterChange(op.clone()),
                    Duration::from_secs(3),
                )
                .await;
            match answer {
                Ok(ResponseBody::ClusterChanged(_)) => return Ok(()),
                Ok(other) => last = format!("node {target} answered {}", other.kind_name()),
                Err(error) => last = format!("node {target}: {error}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Err(DevError::Control(format!("{op:?} failed: {last}")))
}

/// Records a grown cluster: its shape (node count) and `cluster.json`.
pub(super) fn record_growth(cluster: &mut DevCluster) -> Result<(), DevError> {
    let highest = cluster.nodes.iter().map(|node| node.id).max().unwrap_or(0);
    cluster.shape.nodes = u32::try_from(highest).unwrap_or(u32::MAX);
    write_shape(&cluster.dir, &cluster.shape)?;
    let text = cluster.cluster_json()?;
    write_atomically(&cluster.cluster_file(), &text)
}

fn write_node_config(path: &Path, config: &ServerConfig) -> Result<(), DevError> {
    let text = format!(
        "# Written by `tenure dev` for node {} of a local development cluster.\n# INSECURE: \
         auth.insecure_dev_mode trusts principal headers without authentication.\n\n{}",
        config.node_id,
        config.to_toml()?
    );
    write_atomically(path, &text)
}

fn write_shape(dir: &Path, shape: &DevShape) -> Result<(), DevError> {
    let body = toml::to_string(shape)
        .map_err(|e| DevError::Options(format!("cannot encode {SHAPE_FILE}: {e}")))?;
    let text = format!(
        "# The shape of this `tenure dev` cluster, recorded by its first run. Later runs reuse \
         it.\n{body}"
    );
    write_atomically(&dir.join(SHAPE_FILE), &text)
}

/// `(quic, http)` ports per node: `base + id` and `base + 100 + id`, or free ports (UDP for QUIC,
/// TCP for HTTP) picked by binding port 0 when `base` is 0.
fn pick_ports(base: u16, ids: &[u64]) -> Result<Vec<(u16, u16)>, DevError> {
    if base != 0 {
        return ids
            .iter()
            .map(|id| {
                let quic = u16::try_from(u64::from(base) + id);
                let http = u16::try_from(u64::from(base) + 100 + id);
                match (quic, http) {
                    (Ok(quic), Ok(http)) => Ok((quic, http)),
                    _ => Err(DevError::Options(format!(
                        "--base-port {base} leaves no port for node {id}"
                    ))),
                }
            })
            .collect();
    }
    // Hold every socket until all ports are chosen, so no port is picked twice.
    let mut held_udp = Vec::new();
    let mut held_tcp = Vec::new();
    let mut ports = Vec::new();
    for _ in ids {
        let udp = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))
            .map_err(io_error("binding a free UDP port"))?;
        let tcp = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .map_err(io_error("binding a free TCP port"))?;
        let quic = udp
            .local_addr()
            .map_err(io_error("reading a UDP port"))?
            .port();
        let http = tcp
            .local_addr()
            .map_err(io_error("reading a TCP port"))?
            .port();
        ports.push((quic, http));
        held_udp.push(udp);
        held_tcp.push(tcp);
    }
    Ok(ports)
}

/// The last `lines` lines of a log file (at most its last 64 KiB).
pub fn log_tail(path: &Path, lines: usize) -> String {
    let read = || -> std::io::Result<String> {
        let mut file = fs::File::open(path)?;
        let len = file.metadata()?.len();
        let start = len.saturating_sub(64 * 1024);
        file.seek(SeekFrom::Start(start))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    };
    match read() {
        Ok(text) => {
            let all: Vec<&str> = text.lines().collect();
            let from = all.len().saturating_sub(lines);
            all[from..]
                .iter()
                .map(|line| format!("    {line}\n"))
                .collect()
        }
        Err(error) => format!("    (cannot read {}: {error})\n", path.display()),
    }
}

/// The HTTP status of `GET path` on `addr` (plain HTTP/1.1), within `timeout`.
pub async fn http_get_status(
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
) -> std::io::Result<u16> {
    let request = async {
        let mut stream = TcpStream::connect(addr).await?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut head = Vec::with_capacity(256);
        let mut chunk = [0u8; 256];
        while !head.windows(2).any(|w| w == b"\r\n") && head.len() < 4096 {
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                break;
            }
            head.extend_from_slice(&chunk[..n]);
        }
        let text = String::from_utf8_lossy(&head);
        let status_line = text.lines().next().unwrap_or("");
        let mut parts = status_line.split_whitespace();
        match (parts.next(), parts.next().map(str::parse::<u16>)) {
            (Some(version), Some(Ok(code))) if version.starts_with("HTTP/") => Ok(code),
            _ => Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("not an HTTP response: {status_line:?}"),
            )),
        }
    };
    tokio::time::timeout(timeout, request)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer in time"))?
}

/// Worker threads of each node's runtime when `nodes` node processes share this machine: the
/// cores available to this process divided among them, at least one each. (With a runtime per
/// node sized for the whole machine, three nodes on two cores run six worker threads that take
/// time slices from each other whenever they look for work.)
pub fn node_worker_threads(nodes: u32) -> u16 {
    let per_node = cores_available() / usize::try_from(nodes.max(1)).unwrap_or(usize::MAX);
    // `tenure serve --worker-threads` takes 1 to 1024.
    u16::try_from(per_node.clamp(1, 1024)).unwrap_or(1024)
}

fn remove_cluster_file(cluster: &DevCluster) {
    let path = cluster.cluster_file();
    match fs::remove_file(&path) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => warn!("cannot remove {}: {error}", path.display()),
    }
}

fn warn_insecure() {
    warn!(
        "INSECURE DEVELOPMENT MODE: every node trusts the X-Tenure-Principal-Id and \
         X-Tenure-Principal-Tenant headers (and QUIC request principals) without authentication"
    );
    let lines = [
        "tenure dev: INSECURE DEVELOPMENT MODE",
        "Principal headers are trusted WITHOUT authentication: any local process",
        "can act as any tenant. Never expose these ports or keep real data here.",
    ];
    let width = lines.iter().map(|line| line.len()).max().unwrap_or(0);
    let border = "*".repeat(width + 4);
    let mut banner = format!("\n{border}\n");
    for line in lines {
        banner.push_str(&format!("* {line:<width$} *\n"));
    }
    banner.push_str(&border);
    eprintln!("{banner}\n");
}

fn print_ready(cluster: &DevCluster, took: Duration) {
    let mut out = String::new();
    let first_http = cluster
        .nodes
        .first()
        .and_then(|n| n.config.own_peer())
        .map(|p| p.http_addr.to_string())
        .unwrap_or_default();
    let last_http = cluster
        .nodes
        .last()
        .and_then(|n| n.config.own_peer())
        .map(|p| p.http_addr.to_string())
        .unwrap_or_default();
    out.push_str(&format!(
        "tenure dev: {} nodes, {} groups, ready in {:.1} s ({} cluster in {})\n",
        cluster.shape.nodes,
        cluster.shape.groups,
        took.as_secs_f64(),
        if cluster.created { "new" } else { "restarted" },
        cluster.dir.display()
    ));
    out.push_str(&format!(
        "cluster file: {}\n",
        cluster.cluster_file().display()
    ));
    if let Some(node) = cluster.nodes.first()
        && let Ok(plan) = node.config.state_memory_plan()
    {
        out.push_str(&format!(
            "state limits per node: budget {} bytes; per group {} lease records, {} request-id \
             records, {} tenants; a tenant may hold {} active leases ({} per group)\n",
            node.config.limits.node_memory_budget_bytes,
            plan.group_lease_records_max,
            plan.group_dedup_records_max,
            plan.group_tenants_max,
            node.config.limits.tenant_active_leases_max,
            plan.tenant_group_share,
        ));
    }
    for node in &cluster.nodes {
        if let Some(own) = node.config.own_peer() {
            out.push_str(&format!(
                "  node {}: client (QUIC) {}  http http://{}  log {}\n",
                node.id,
                own.addr,
                own.http_addr,
                node.log_path.display()
            ));
        }
    }
    out.push_str(&format!(
        "\nTry (any node answers; insecure dev mode takes the principal from the headers):\n\
         \x20 curl -s -X POST http://{first_http}/v1/leases/acquire \\\n\
         \x20   -H 'Content-Type: application/json' \\\n\
         \x20   -H 'X-Tenure-Principal-Id: dev' -H 'X-Tenure-Principal-Tenant: acme' \\\n\
         \x20   -d '{{\"tenant_id\":\"acme\",\"resource_id\":\"db-primary\",\"holder_id\":\"worker-1\",\"ttl_seconds\":30,\"request_id\":\"req-1\"}}'\n\
         \x20 curl -s http://{last_http}/v1/leases/acme/db-primary \\\n\
         \x20   -H 'X-Tenure-Principal-Id: dev' -H 'X-Tenure-Principal-Tenant: acme'\n\
         \x20 tenurectl --cluster {} -o json acquire --tenant acme --resource db-primary --holder worker-1 --ttl-ms 30000\n\
         \nA node that dies is reported and the others keep serving. From another terminal:\n\
         \x20 tenure dev status --data-dir {dir}       (nodes, pids, readiness)\n\
         \x20 tenure dev kill 2 --data-dir {dir}       (SIGKILL node 2: watch the failover)\n\
         \x20 tenure dev restart 2 --data-dir {dir}    (start it again from its data)\n\
         Ctrl-C stops the cluster; the same command restarts it with its data.\n",
        cluster.cluster_file().display(),
        dir = cluster.dir.display()
    ));
    let _ = std::io::stdout().lock().write_all(out.as_bytes());
    let _ = std::io::stdout().lock().flush();
}

/// Runs a development cluster until SIGINT, SIGTERM or `options.duration`.
///
/// Returns an error (after stopping every node) when the directory cannot be used, a node exits
/// early or not every node becomes ready in time.
/// Runs a development cluster until SIGINT, SIGTERM or `options.duration`.
///
/// Returns an error (after stopping every node) when the directory cannot be used (or another
/// `tenure dev` runs on it), a node exits before the cluster was ready, or not every node
/// becomes ready in time. Once it was ready, nodes that die are reported, not fatal.
pub async fn run(options: DevOptions) -> Result<(), DevError> {
    let mut signals = StopSignals::new()?;
    let cluster = prepare(&options)?;
    let control = control::bind(&cluster.dir).await?;
    remove_cluster_file(&cluster);
    warn_insecure();
    let executable = match &options.executable {
        Some(path) => path.clone(),
        None => std::env::current_exe().map_err(io_error("finding this executable"))?,
    };
    info!(
        dir = %cluster.dir.display(),
        nodes = cluster.shape.nodes,
        groups = cluster.shape.groups,
        created = cluster.created,
        "starting the development cluster"
    );

    let worker_threads = node_worker_threads(cluster.shape.nodes);
    let mut supervisor = Supervisor::new(
        cluster.clone(),
        executable,
        worker_threads,
        options.restart_after,
    )?;
    let started = Instant::now();
    let result = match supervisor.start_all() {
        Ok(()) => match supervisor
            .wait_all_ready(&mut signals, options.ready_timeout)
            .await
        {
            Ok(Some(signal)) => {
                eprintln!("tenure dev: {signal} before the cluster was ready; stopping");
                Ok(())
            }
            Ok(None) => {
                match cluster
                    .cluster_json()
                    .and_then(|text| write_atomically(&cluster.cluster_file(), &text))
                {
                    Ok(()) => {
                        print_ready(&cluster, started.elapsed());
                        supervisor
                            .supervise(&mut signals, &control, options.duration)
                            .await;
                        Ok(())
                    }
                    Err(error) => Err(error),
                }
            }
            Err(error) => Err(error),
        },
        Err(error) => Err(error),
    };
    remove_cluster_file(&cluster);
    supervisor.stop_all().await;
    control::unbind(&cluster.dir);
    result
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn options(dir: &Path) -> DevOptions {
        DevOptions {
            data_dir: dir.to_owned(),
            ..DevOptions::default()
        }
    }

    #[test]
    fn defaults_follow_the_cores_available() {
        let cores = cores_available();
        let groups = default_groups();
        assert!((DEFAULT_GROUPS_MIN..=DEFAULT_GROUPS_MAX).contains(&groups));
        let expected = (cores * 4).clamp(8, 64);
        assert_eq!(usize::try_from(groups).unwrap(), expected, "{cores} cores");
        // The nodes of one machine share its cores, at least one worker thread each.
        assert_eq!(
            usize::from(node_worker_threads(1)),
            cores,
            "a lone node gets every core"
        );
        assert_eq!(node_worker_threads(u32::MAX), 1);
        assert_eq!(node_worker_threads(0), node_worker_threads(1));
    }

    #[test]
    fn first_run_writes_configs_certs_and_shape() {
        let temp = tempfile::tempdir().unwrap();
        let dir = temp.path().join("dev");
        let cluster = prepare(&options(&dir)).unwrap();
        assert!(cluster.created);
        assert_eq!(cluster.shape.nodes, 3);
        assert_eq!(cluster.shape.groups, default_groups());
        assert_eq!(cluster.shape.replication_factor, 3);
        assert_eq!(cluster.ca_cert, dir.join("certs/ca.pem"));
        for node in &cluster.nodes {
            let loaded = config::load(&node.config_path).unwrap();
            assert_eq!(loaded, node.config);
            assert!(loaded.auth.insecure_dev_mode);
            assert!(loaded.storage.fsync);
            assert_eq!(loaded.data_dir, dir.join(format!("node-{}/data", node.id)));
            let own = loaded.own_peer().unwrap();
            assert_eq!(u64::from(own.addr.port()), 7400 + node.id);
            assert_eq!(u64::from(own.http_addr.port()), 7500 + node.id);
            assert!(loaded.tls.node_key.exists());
        }
        let json: serde_json::Value =
            serde_json::from_str(&cluster.cluster_json().unwrap()).unwrap();
        assert_eq!(json["groups"], default_groups());
        assert_eq!(json["nodes"][0]["id"], 1);
        assert_eq!(json["nodes"][0]["client"], "127.0.0.1:7401");
        assert_eq!(json["nodes"][2]["http"], "http://127.0.0.1:7503");
        assert_eq!(json["ca_cert"], dir.join("certs/ca.pem").to_str().unwrap());
        let text = cluster.cluster_json().unwrap();
        assert!(text.starts_with("{\"nodes\":[{\"id\":1,\"client\":\"127.0.0.1:7401\",\"http\":\"http://127.0.0.1:7501\"}"), "{text}");
    }

    #[test]
    fn later_runs_reuse_the_directory_and_refuse_other_shapes() {
        let temp = tempfile::tempdir().unwrap();
        let dir = temp.path().join("dev");
        let mut first = options(&dir);
        first.nodes = Some(1);
        first.groups = Some(4);
        let created = prepare(&first).unwrap();
        assert_eq!(created.shape.replication_factor, 1);

        let again = prepare(&options(&dir)).unwrap();
        assert!(!again.created);
        assert_eq!(again.shape, created.shape);
        assert_eq!(again.nodes[0].config, created.nodes[0].config);

        let mut other = options(&dir);
        other.nodes = Some(3);
        let message = prepare(&other).unwrap_err().to_string();
        assert!(message.contains("--nodes 1, not 3"), "{message}");
        let mut other = options(&dir);
        other.groups = Some(64);
        assert!(
            prepare(&other)
                .unwrap_err()
                .to_string()
                .contains("--groups 4")
        );
        let mut other = options(&dir);
        other.base_port = Some(9000);
        assert!(prepare(&other).is_err());

        // fsync may change between runs.
        let mut no_fsync = options(&dir);
        no_fsync.fsync = Some(false);
        let changed = prepare(&no_fsync).unwrap();
        assert!(!changed.shape.fsync);
        assert!(
            !config::load(&changed.nodes[0].config_path)
                .unwrap()
                .storage
                .fsync
        );
        assert!(!prepare(&options(&dir)).unwrap().shape.fsync);
    }

    #[test]
    fn state_limits_are_set_at_creation_changed_later_and_kept_otherwise() {
        let temp = tempfile::tempdir().unwrap();
        let dir = temp.path().join("dev");
        // Default: the 12 GiB default budget split over the three nodes.
        let created = prepare(&options(&dir)).unwrap();
        let limits = &created.nodes[0].config.limits;
        assert_eq!(
            limits.node_memory_budget_bytes,
            tenure_core::NODE_STATE_BYTES_DEFAULT / 3
        );
        assert_eq!(
            limits.tenant_active_leases_max,
            tenure_core::TENANT_ACTIVE_LEASES_MAX_DEFAULT
        );
        let default_records = created.nodes[0]
            .config
            .state_memory_plan()
            .unwrap()
            .group_lease_records_max;

        // A later run with the flags rewrites every node's configuration.
        let mut bigger = options(&dir);
        bigger.node_memory_budget_bytes = Some(17_500_000_000);
        bigger.tenant_active_leases_max = Some(20_000_000);
        bigger.snapshot_every_entries = Some(40);
        bigger.expire_commands_per_s_max = Some(5);
        let changed = prepare(&bigger).unwrap();
        for node in &changed.nodes {
            let loaded = config::load(&node.config_path).unwrap();
            assert_eq!(loaded.timing.snapshot_every_entries, 40);
            assert_eq!(loaded.timing.expire_commands_per_s_max, 5);
            assert_eq!(loaded.limits.node_memory_budget_bytes, 17_500_000_000);
            assert_eq!(loaded.limits.tenant_active_leases_max, 20_000_000);
            let plan = loaded.state_memory_plan().unwrap();
            assert!(plan.group_lease_records_max > default_records, "{plan:?}");
        }
        // Without the flags, the recorded values stay.
        let again = prepare(&options(&dir)).unwrap();
        assert_eq!(
            again.nodes[2].config.limits.node_memory_budget_bytes,
            17_500_000_000
        );
        assert_eq!(
            again.nodes[2].config.limits.tenant_active_leases_max,
            20_000_000
        );
        assert_eq!(again.nodes[2].config.timing.snapshot_every_entries, 40);
        assert_eq!(again.nodes[2].config.timing.expire_commands_per_s_max, 5);
        // The command rate alone is a change too.
        let mut rate_only = options(&dir);
        rate_only.expire_commands_per_s_max = Some(7);
        let changed = prepare(&rate_only).unwrap();
        for node in &changed.nodes {
            let loaded = config::load(&node.config_path).unwrap();
            assert_eq!(loaded.timing.expire_commands_per_s_max, 7);
            assert_eq!(loaded.timing.snapshot_every_entries, 40);
        }

        // Given at creation, they are written from the start.
        let mut at_creation = options(&temp.path().join("other"));
        at_creation.tenant_active_leases_max = Some(3_000_000);
        let created = prepare(&at_creation).unwrap();
        let loaded = config::load(&created.nodes[1].config_path).unwrap();
        assert_eq!(loaded.limits.tenant_active_leases_max, 3_000_000);

        // A budget too small for the groups, or a zero quota, is refused and nothing is written.
        let mut tiny = options(&dir);
        tiny.node_memory_budget_bytes = Some(1_000);
        let message = prepare(&tiny).unwrap_err().to_string();
        assert!(message.contains("node_memory_budget_bytes"), "{message}");
        let mut zero = options(&dir);
        zero.tenant_active_leases_max = Some(0);
        let message = prepare(&zero).unwrap_err().to_string();
        assert!(message.contains("tenant_active_leases_max"), "{message}");
        let mut no_commands = options(&dir);
        no_commands.expire_commands_per_s_max = Some(0);
        let message = prepare(&no_commands).unwrap_err().to_string();
        assert!(message.contains("expire_commands_per_s_max"), "{message}");
        assert_eq!(
            config::load(&again.nodes[0].config_path)
                .unwrap()
                .limits
                .node_memory_budget_bytes,
            17_500_000_000
        );
    }

    /// The arithmetic of the loadgen README's scale section: 64 groups on every node of three,
    /// and the per-group maxima a budget gives.
    #[test]
    fn scale_budget_gives_the_documented_per_group_maxima() {
        let temp = tempfile::tempdir().unwrap();
        let mut opts = options(&temp.path().join("dev"));
        opts.groups = Some(64);
        opts.node_memory_budget_bytes = Some(17_500_000_000);
        let cluster = prepare(&opts).unwrap();
        let plan = cluster.nodes[0].config.state_memory_plan().unwrap();
        assert_eq!(plan.hosted_groups_max, 64);
        assert_eq!(plan.group_tenants_max, 16_384);
        assert_eq!(plan.group_lease_records_max, 170_000);
        assert_eq!(plan.group_dedup_records_max, 170_000);
        // The default budget of a dev node (12 GiB / 3) at 64 groups.
        let mut default = options(&temp.path().join("default"));
        default.groups = Some(64);
        let cluster = prepare(&default).unwrap();
        let plan = cluster.nodes[0].config.state_memory_plan().unwrap();
        assert_eq!(plan.group_lease_records_max, 38_000);
        assert_eq!(plan.tenant_group_share, 19_532);
    }

    #[test]
    fn base_port_zero_picks_distinct_free_ports() {
        let temp = tempfile::tempdir().unwrap();
        let mut opts = options(&temp.path().join("dev"));
        opts.base_port = Some(0);
        opts.nodes = Some(5);
        let cluster = prepare(&opts).unwrap();
        let mut quic: Vec<u16> = cluster
            .nodes
            .iter()
            .map(|n| n.config.own_peer().unwrap().addr.port())
            .collect();
        quic.sort_unstable();
        quic.dedup();
        assert_eq!(quic.len(), 5);
        assert!(quic.iter().all(|p| *p != 0));
    }

    #[test]
    fn foreign_or_bad_options_are_refused() {
        let temp = tempfile::tempdir().unwrap();
        fs::write(temp.path().join("notes.txt"), "mine").unwrap();
        let message = prepare(&options(temp.path())).unwrap_err().to_string();
        assert!(message.contains("not a tenure dev directory"), "{message}");

        let mut opts = options(&temp.path().join("a"));
        opts.nodes = Some(0);
        assert!(prepare(&opts).is_err());
        let mut opts = options(&temp.path().join("b"));
        opts.base_port = Some(65_500);
        assert!(
            prepare(&opts)
                .unwrap_err()
                .to_string()
                .contains("--base-port")
        );
        let mut opts = options(&temp.path().join("c"));
        opts.groups = Some(0);
        assert!(prepare(&opts).unwrap_err().to_string().contains("groups"));
    }

    #[tokio::test]
    async fn a_node_that_exits_early_fails_the_run_with_its_log() {
        let temp = tempfile::tempdir().unwrap();
        let script = temp.path().join("fake-node.sh");
        fs::write(&script, "#!/bin/sh\necho \"fake node: $*\"\nexit 3\n").unwrap();
        make_executable(&script);
        let mut opts = options(&temp.path().join("dev"));
        opts.base_port = Some(0);
        opts.executable = Some(script);
        let error = run(opts).await.unwrap_err();
        let message = error.to_string();
        assert!(matches!(error, DevError::NodeExited { .. }), "{message}");
        assert!(message.contains("fake node: serve --config"), "{message}");
        assert!(!temp.path().join("dev").join(CLUSTER_FILE).exists());
    }

    #[tokio::test]
    async fn nodes_that_never_get_ready_are_stopped() {
        let temp = tempfile::tempdir().unwrap();
        let script = temp.path().join("slow-node.sh");
        fs::write(&script, "#!/bin/sh\necho waiting\nexec sleep 600\n").unwrap();
        make_executable(&script);
        let mut opts = options(&temp.path().join("dev"));
        opts.base_port = Some(0);
        opts.nodes = Some(2);
        opts.executable = Some(script);
        opts.ready_timeout = Duration::from_millis(700);
        let started = std::time::Instant::now();
        let error = run(opts).await.unwrap_err();
        assert!(
            matches!(error, DevError::NotReady { ref nodes, .. } if nodes == &[1, 2]),
            "{error}"
        );
        assert!(error.to_string().contains("waiting"), "{error}");
        // SIGTERM ended them; nobody waited for the kill timeout.
        assert!(started.elapsed() < Duration::from_secs(15));
    }

    #[tokio::test]
    async fn http_status_of_a_tiny_server() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 1024];
            let _ = socket.read(&mut buf).await.unwrap();
            socket
                .write_all(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n")
                .await
                .unwrap();
        });
        assert_eq!(
            http_get_status(addr, "/readyz", Duration::from_secs(5))
                .await
                .unwrap(),
            503
        );
    }

    fn make_executable(path: &Path) {
        use std::os::unix::fs::PermissionsExt;
        let mut permissions = fs::metadata(path).unwrap().permissions();
        permissions.set_mode(0o755);
        fs::set_permissions(path, permissions).unwrap();
    }
}
