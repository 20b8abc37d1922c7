//! # tenure-testkit: clusters of real `tenure` node processes for tests
//!
//! The one harness that starts node processes for the tests of `tenure-server` and
//! `tenure-client` (the fault suite in `tests/` runs its nodes in network namespaces with fault
//! control on top; see its `harness`):
//!
//! - [`ProcessCluster`]: a temporary directory with the cluster's certificates, one TOML
//!   configuration per node, and one `tenure serve --config FILE` child process per node (its
//!   stdout and stderr go to `node-N.log`). Nodes can be killed (SIGKILL), terminated (SIGTERM),
//!   paused (SIGSTOP), resumed and restarted. Dropping the cluster kills every node; when the test
//!   is failing it prints the tail of every node's log and keeps the directory.
//! - [`TestClient`]: a minimal client of the native QUIC protocol (`tenure_proto::client`).
//! - [`http_request`] / [`http_json`]: a minimal HTTP/1.1 client.
//! - Routing helpers: leaders as each node sees them, placement, resources in a given group.
//!
//! The `tenure` binary is found next to the test executable's directory (`target/<profile>/`,
//! where the workspace's test build puts it) or at `TENURE_BIN`. Clusters of one test binary run
//! one at a time (a process-wide lock), so tests of a binary do not compete for the two cores of
//! a small machine; every wait is bounded. Nodes listen on loopback only.
//!
//! Must not depend on: `tenure-client` (the client's own tests use this crate; the native
//! client here is deliberately separate from the library under test). A dev-dependency only:
//! never a dependency of a shipped crate.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    clippy::print_stderr,
    clippy::result_large_err,
    clippy::missing_panics_doc,
    // Test support: the helpers are named for what they do; their docs are the module's.
    missing_docs
)]

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::future::Future;
use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject as _;
use tenure_core::{
    AcquireRequest, ErrorCode, LeaseId, LeaseStatus, LeaseView, PlacementMap, ReleaseRequest,
    RenewRequest, ResourceKey, SLOT_COUNT_DEFAULT,
};
use tenure_proto::client::{
    CLIENT_ALPN, CLIENT_FRAME_BYTES_MAX, GetResult, GroupLeader, LeaseResult, Principal, Request,
    RequestBody, RequestFlags, RequestFrame, ResponseBody, RoutingTable, WireError,
    decode_response_frame, encode_client_frame,
};
use tenure_server::config::{
    AuthConfig, ClusterConfig, LimitsConfig, PeerConfig, ServerConfig, StorageConfig,
    TestingConfig, TimingConfig, TlsConfig, TokenConfig,
};
use tenure_transport::certs::write_cluster_certificates;

/// The nodes' `[limits]`, for [`ClusterOptions::limits`].
pub use tenure_server::config::LimitsConfig as NodeLimits;
/// A node's whole configuration, for [`ClusterOptions::configure`].
pub use tenure_server::config::ServerConfig as NodeConfig;
use tenure_transport::tls::node_server_name;

/// The cluster name used by every test cluster (certificates and configuration).
pub const CLUSTER_NAME: &str = "tenure-test";
/// The tenant the insecure-mode helpers act for.
pub const TENANT: &str = "acme";
/// Lines of each node's log printed when a test fails.
const LOG_TAIL_LINES: usize = 60;
/// How long a single test-client call waits at most (beyond the request's own timeout).
const CALL_TIMEOUT: Duration = Duration::from_secs(15);

/// One cluster at a time per test binary (and one timing-sensitive test: see `forwarding_lanes`).
static CLUSTER_LOCK: Mutex<()> = Mutex::new(());

pub fn cluster_lock() -> MutexGuard<'static, ()> {
    CLUSTER_LOCK
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Runs `test` on a fresh two-thread runtime while holding [`cluster_lock`] (so no other cluster
/// of this test binary runs beside it).
pub fn run_alone<F: Future>(test: F) -> F::Output {
    let _alone = cluster_lock();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a test runtime")
        .block_on(test)
}

/// A bearer token of a token-authenticated cluster.
#[derive(Debug, Clone)]
pub struct TestToken {
    /// The token itself (the configuration stores its SHA-256).
    pub token: String,
    /// The principal it authenticates.
    pub principal_id: String,
    /// Its tenant.
    pub tenant_id: String,
}

/// How to build a cluster.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Number of nodes (ids 1..=nodes).
    pub nodes: u64,
    /// Number of groups.
    pub groups: u32,
    /// Sync the WAL before acknowledging.
    pub fsync: bool,
    /// Snapshot a group after this many entries (None: the server's default).
    pub snapshot_every_entries: Option<u64>,
    /// Leadership balance check interval (None: the server's default; 0 disables balancing).
    pub rebalance_interval_ms: Option<u64>,
    /// Per node: (clock_rate_ppm, clock_offset_ms).
    pub clock_skew: BTreeMap<u64, (i64, i64)>,
    /// Trust principal headers and request principals without authentication.
    pub insecure_dev_mode: bool,
    /// Bearer tokens.
    pub tokens: Vec<TestToken>,
    /// `RUST_LOG` of the nodes (None: the environment's, else `info,openraft=warn`).
    pub log_filter: Option<String>,
    /// Changes node `id`'s configuration after the options above made it (None: no change).
    pub configure: Option<fn(u64, &mut ServerConfig)>,
    /// The nodes' `[limits]` (None: the defaults).
    pub limits: Option<LimitsConfig>,
    /// Soft and hard `RLIMIT_NOFILE` of the node processes (None: inherited), set with
    /// `prlimit` before `tenure serve` starts.
    pub nofile_limit: Option<u64>,
    /// The nodes' `[cluster]` section (None: the placement controller off, so a test's
    /// replica sets change only when it changes them).
    pub cluster: Option<ClusterConfig>,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            nodes: 3,
            groups: 16,
            fsync: true,
            snapshot_every_entries: None,
            rebalance_interval_ms: None,
            clock_skew: BTreeMap::new(),
            insecure_dev_mode: true,
            tokens: Vec::new(),
            log_filter: None,
            configure: None,
            limits: None,
            nofile_limit: None,
            cluster: None,
        }
    }
}

/// One node process of a [`ProcessCluster`].
#[derive(Debug)]
pub struct NodeProcess {
    /// Node id.
    pub id: u64,
    /// QUIC endpoint (peer and client protocol).
    pub quic_addr: SocketAddr,
    /// HTTP gateway.
    pub http_addr: SocketAddr,
    /// Its configuration file.
    pub config_path: PathBuf,
    /// Its data directory.
    pub data_dir: PathBuf,
    /// Where its stdout and stderr go.
    pub log_path: PathBuf,
    child: Option<Child>,
}

/// A cluster of `tenure serve` processes on loopback.
pub struct ProcessCluster {
    dir: Option<tempfile::TempDir>,
    /// The options it was started with.
    pub options: ClusterOptions,
    nodes: BTreeMap<u64, NodeProcess>,
    configs: BTreeMap<u64, ServerConfig>,
    ca_pem: String,
    placement: PlacementMap,
    _lock: MutexGuard<'static, ()>,
}

impl std::fmt::Debug for ProcessCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessCluster")
            .field("dir", &self.dir_path())
            .field("nodes", &self.nodes)
            .finish_non_exhaustive()
    }
}

/// Ports that were free a moment ago: one UDP (QUIC) and one TCP (HTTP) per node. The sockets
/// are held until every port is chosen, so the nodes get distinct ports.
fn free_ports(count: usize) -> Vec<(SocketAddr, SocketAddr)> {
    let mut held = Vec::new();
    let mut ports = Vec::new();
    for _ in 0..count {
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").expect("binding a UDP port");
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").expect("binding a TCP port");
        ports.push((udp.local_addr().unwrap(), tcp.local_addr().unwrap()));
        held.push((udp, tcp));
    }
    drop(held);
    ports
}

/// The binary under test: `TENURE_BIN`, else `tenure` in the directory above the test
/// executable's (`target/<profile>/deps/x-hash` -> `target/<profile>/tenure`).
///
/// # Panics
/// When it does not exist: build with the workspace's test selection (`cargo test --workspace
/// --all-targets --all-features`), which builds the `tenure` binary too.
pub fn tenure_bin() -> &'static Path {
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        let path = std::env::var_os("TENURE_BIN")
            .map(PathBuf::from)
            .or_else(|| {
                let exe = std::env::current_exe().ok()?;
                Some(exe.parent()?.parent()?.join("tenure"))
            })
            .expect("locating the tenure binary");
        assert!(
            path.is_file(),
            "{} does not exist: build it with the workspace's test selection \
             (cargo test --workspace --all-targets --all-features) or set TENURE_BIN",
            path.display()
        );
        path
    })
}

/// Generates the cluster's certificates into `dir/certs`.
pub fn write_certs(dir: &Path, node_ids: &[u64]) -> PathBuf {
    let certs = dir.join("certs");
    write_cluster_certificates(
        &certs,
        CLUSTER_NAME,
        node_ids,
        &[IpAddr::V4(Ipv4Addr::LOCALHOST)],
    )
    .expect("writing cluster certificates");
    certs
}

/// A node configuration for tests (every field explicit).
pub fn node_config(
    id: u64,
    data_dir: &Path,
    certs: &Path,
    peers: &BTreeMap<u64, PeerConfig>,
    options: &ClusterOptions,
) -> ServerConfig {
    let mut timing = TimingConfig::default();
    if let Some(entries) = options.snapshot_every_entries {
        timing.snapshot_every_entries = entries;
    }
    if let Some(interval) = options.rebalance_interval_ms {
        timing.rebalance_interval_ms = interval;
    }
    let (clock_rate_ppm, clock_offset_ms) = options.clock_skew.get(&id).copied().unwrap_or((0, 0));
    let mut config = ServerConfig {
        node_id: id,
        cluster_name: CLUSTER_NAME.to_string(),
        data_dir: data_dir.to_path_buf(),
        peers: peers.clone(),
        groups: options.groups,
        replication_factor: 3.min(u32::try_from(options.nodes).unwrap()),
        tls: TlsConfig {
            ca_cert: certs.join("ca.pem"),
            node_cert: certs.join(format!("node-{id}.pem")),
            node_key: certs.join(format!("node-{id}.key")),
        },
        timing,
        limits: options.limits.clone().unwrap_or_default(),
        auth: AuthConfig {
            insecure_dev_mode: options.insecure_dev_mode,
            tokens: options
                .tokens
                .iter()
                .map(|token| TokenConfig {
                    sha256: tenure_server::auth::token_sha256_hex(&token.token),
                    principal_id: token.principal_id.clone(),
                    tenant_id: token.tenant_id.clone(),
                    operator: false,
                })
                .collect(),
        },
        storage: StorageConfig {
            fsync: options.fsync,
            ..StorageConfig::default()
        },
        cluster: options.cluster.clone().unwrap_or(ClusterConfig {
            placement_interval_ms: 0,
            ..ClusterConfig::default()
        }),
        testing: TestingConfig {
            clock_rate_ppm,
            clock_offset_ms,
            ..TestingConfig::default()
        },
    };
    if let Some(configure) = options.configure {
        configure(id, &mut config);
    }
    config
}

/// Writes `config` as TOML to `path`.
pub fn write_config(path: &Path, config: &ServerConfig) {
    let text = config.to_toml().expect("configuration as TOML");
    std::fs::write(path, text).expect("writing a node configuration");
}

/// Spawns `tenure serve --config FILE --allow-insecure-loopback-only` (test nodes run on loopback
/// and may use insecure development mode and clock skew), appending its output to `log_path`.
pub fn spawn_serve(config_path: &Path, log_path: &Path) -> Child {
    spawn_serve_with(config_path, log_path, None)
}

/// Like [`spawn_serve`], with a log filter that overrides the environment's `RUST_LOG`.
pub fn spawn_serve_with(config_path: &Path, log_path: &Path, log_filter: Option<&str>) -> Child {
    spawn_serve_limited(config_path, log_path, log_filter, None)
}

/// Like [`spawn_serve_with`], with the process's `RLIMIT_NOFILE` (soft and hard) set to
/// `nofile_limit` by `prlimit` (util-linux), which then executes `tenure serve` (same pid).
pub fn spawn_serve_limited(
    config_path: &Path,
    log_path: &Path,
    log_filter: Option<&str>,
    nofile_limit: Option<u64>,
) -> Child {
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(log_path)
        .expect("opening a node log");
    let mut command = match nofile_limit {
        Some(limit) => {
            let mut command = Command::new("prlimit");
            command
                .arg(format!("--nofile={limit}:{limit}"))
                .arg(tenure_bin());
            command
        }
        None => Command::new(tenure_bin()),
    };
    command
        .arg("serve")
        .arg("--config")
        .arg(config_path)
        .arg(tenure_server::config::ALLOW_INSECURE_FLAG)
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("cloning a log handle"))
        .stderr(log);
    if let Some(filter) = log_filter {
        command.env("RUST_LOG", filter);
    } else if std::env::var_os("RUST_LOG").is_none() {
        command.env("RUST_LOG", "info,openraft=warn");
    }
    command.spawn().expect("spawning tenure serve")
}

/// The last `lines` lines of a file.
pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read(path)
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
        .unwrap_or_else(|error| format!("<cannot read {}: {error}>", path.display()));
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// `kill -SIGNAL PID` (`signal` without the dash: `KILL`, `TERM`, `STOP`), which must succeed.
pub fn send_signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .expect("running kill");
    assert!(status.success(), "kill -{signal} {pid} failed: {status}");
}

/// Waits (bounded) for a child to exit.
pub fn wait_child_exit(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().expect("waiting for a child") {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl ProcessCluster {
    /// Creates the certificates and configurations and starts every node (does not wait for
    /// readiness: see [`ProcessCluster::wait_ready`]).
    pub async fn start(options: ClusterOptions) -> ProcessCluster {
        let lock = cluster_lock();
        let dir = tempfile::Builder::new()
            .prefix("tenure-cluster-")
            .tempdir()
            .expect("creating a temporary directory");
        let ids: Vec<u64> = (1..=options.nodes).collect();
        let certs = write_certs(dir.path(), &ids);
        let ca_pem = std::fs::read_to_string(certs.join("ca.pem")).expect("reading ca.pem");
        let ports = free_ports(ids.len());
        let peers: BTreeMap<u64, PeerConfig> = ids
            .iter()
            .zip(&ports)
            .map(|(&id, &(addr, http_addr))| (id, PeerConfig { addr, http_addr }))
            .collect();
        let mut nodes = BTreeMap::new();
        let mut configs = BTreeMap::new();
        for &id in &ids {
            let node_dir = dir.path().join(format!("node-{id}"));
            std::fs::create_dir_all(&node_dir).unwrap();
            let data_dir = node_dir.join("data");
            let config = node_config(id, &data_dir, &certs, &peers, &options);
            config.validate().expect("test configuration is valid");
            let config_path = node_dir.join("tenure.toml");
            write_config(&config_path, &config);
            configs.insert(id, config);
            let log_path = dir.path().join(format!("node-{id}.log"));
            nodes.insert(
                id,
                NodeProcess {
                    id,
                    quic_addr: peers[&id].addr,
                    http_addr: peers[&id].http_addr,
                    config_path,
                    data_dir,
                    log_path,
                    child: None,
                },
            );
        }
        let placement = PlacementMap::uniform(1, options.groups, SLOT_COUNT_DEFAULT)
            .expect("uniform placement");
        let mut cluster = ProcessCluster {
            dir: Some(dir),
            options,
            nodes,
            configs,
            ca_pem,
            placement,
            _lock: lock,
        };
        for id in ids {
            cluster.spawn(id);
        }
        cluster
    }

    /// Adds node `id` to the running cluster as a newcomer would: a certificate from the
    /// cluster CA (`tenure certs --ca-dir`), a configuration with `[cluster] join_existing =
    /// true` listing itself and the current nodes as seeds, and `tenure serve`. The node table
    /// must announce it (`ClusterChange(AddNode)`) before it can report itself.
    pub fn add_node(&mut self, id: u64) -> (SocketAddr, SocketAddr) {
        assert!(!self.nodes.contains_key(&id), "node {id} exists already");
        let certs = self.dir_path().join("certs");
        let issued = Command::new(tenure_bin())
            .args(["certs", "--ca-dir"])
            .arg(&certs)
            .args(["--nodes", &id.to_string(), "--ip", "127.0.0.1"])
            .output()
            .expect("running tenure certs");
        assert!(
            issued.status.success(),
            "tenure certs --ca-dir failed: {}",
            String::from_utf8_lossy(&issued.stderr)
        );
        let (addr, http_addr) = free_ports(1)[0];
        let mut peers: BTreeMap<u64, PeerConfig> = self
            .nodes
            .values()
            .map(|node| {
                (
                    node.id,
                    PeerConfig {
                        addr: node.quic_addr,
                        http_addr: node.http_addr,
                    },
                )
            })
            .collect();
        peers.insert(id, PeerConfig { addr, http_addr });
        let node_dir = self.dir_path().join(format!("node-{id}"));
        std::fs::create_dir_all(&node_dir).unwrap();
        let data_dir = node_dir.join("data");
        let mut config = node_config(id, &data_dir, &certs, &peers, &self.options);
        config.cluster.join_existing = true;
        config
            .validate()
            .expect("the joining node's configuration is valid");
        let config_path = node_dir.join("tenure.toml");
        write_config(&config_path, &config);
        self.configs.insert(id, config);
        let log_path = self.dir_path().join(format!("node-{id}.log"));
        self.nodes.insert(
            id,
            NodeProcess {
                id,
                quic_addr: addr,
                http_addr,
                config_path,
                data_dir,
                log_path,
                child: None,
            },
        );
        self.spawn(id);
        (addr, http_addr)
    }

    /// Starts a cluster and waits until every node is ready.
    pub async fn start_ready(options: ClusterOptions) -> ProcessCluster {
        let cluster = ProcessCluster::start(options).await;
        cluster.wait_ready(Duration::from_secs(45)).await;
        cluster
    }

    /// The cluster's directory.
    pub fn dir_path(&self) -> PathBuf {
        self.dir
            .as_ref()
            .map(|dir| dir.path().to_path_buf())
            .unwrap_or_default()
    }

    /// Node ids.
    pub fn ids(&self) -> Vec<u64> {
        self.nodes.keys().copied().collect()
    }

    /// Ids of nodes whose process runs (not killed, terminated or exited).
    pub fn live_ids(&mut self) -> Vec<u64> {
        let mut live = Vec::new();
        for (id, node) in &mut self.nodes {
            if let Some(child) = node.child.as_mut() {
                if child.try_wait().ok().flatten().is_none() {
                    live.push(*id);
                }
            }
        }
        live
    }

    /// A node.
    pub fn node(&self, id: u64) -> &NodeProcess {
        self.nodes
            .get(&id)
            .unwrap_or_else(|| panic!("no node {id}"))
    }

    /// The configuration node `id` runs with.
    pub fn config(&self, id: u64) -> &ServerConfig {
        self.configs
            .get(&id)
            .unwrap_or_else(|| panic!("no node {id}"))
    }

    /// The cluster's TTL bounds in milliseconds, `(min, max)`, as the nodes' configuration gives
    /// them.
    pub fn ttl_bounds_ms(&self) -> (u64, u64) {
        let config = self.config(self.ids()[0]);
        (config.effective_ttl_ms_min(), config.limits.ttl_ms_max)
    }

    /// The cluster CA certificate (PEM).
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// `http://127.0.0.1:PORT` of a node.
    pub fn http_url(&self, id: u64) -> String {
        format!("http://{}", self.node(id).http_addr)
    }

    /// The placement map every node uses (uniform, version 1).
    pub fn placement(&self) -> &PlacementMap {
        &self.placement
    }

    /// The group of a key.
    pub fn group_of(&self, tenant: &str, resource: &str) -> u32 {
        self.placement.group_of(tenant, resource).0
    }

    /// The preferred leader of a group (the node that bootstraps it and that balancing hands
    /// it back to): node ids sorted, `ids[g mod N]`.
    pub fn preferred_leader(&self, group: u32) -> u64 {
        let ids = self.ids();
        ids[group as usize % ids.len()]
    }

    /// A resource id `"{prefix}-{i}"` of `tenant` that maps to `group` (the `skip`-th such).
    pub fn resource_in_group(&self, tenant: &str, group: u32, prefix: &str, skip: usize) -> String {
        let mut found = 0;
        for i in 0..1_000_000u64 {
            let resource = format!("{prefix}-{i}");
            if self.group_of(tenant, &resource) == group {
                if found == skip {
                    return resource;
                }
                found += 1;
            }
        }
        panic!("no resource of group {group} found");
    }

    /// `count` resource ids `"{prefix}-{i}"` of `tenant` that map to `group`.
    pub fn resources_in_group(
        &self,
        tenant: &str,
        group: u32,
        prefix: &str,
        count: usize,
    ) -> Vec<String> {
        (0..u64::MAX)
            .map(|i| format!("{prefix}-{i}"))
            .filter(|resource| self.group_of(tenant, resource) == group)
            .take(count)
            .collect()
    }

    fn spawn(&mut self, id: u64) {
        let node = self.nodes.get_mut(&id).unwrap();
        assert!(
            node.child.is_none(),
            "node {id} is already running; kill or terminate it first"
        );
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log_path)
            .unwrap();
        let _ = writeln!(log, "===== test harness: starting node {id} =====");
        node.child = Some(spawn_serve_limited(
            &node.config_path,
            &node.log_path,
            self.options.log_filter.as_deref(),
            self.options.nofile_limit,
        ));
    }

    /// The process id of a running node.
    pub fn pid(&self, id: u64) -> u32 {
        self.node(id)
            .child
            .as_ref()
            .unwrap_or_else(|| panic!("node {id} is not running"))
            .id()
    }

    /// SIGKILL, then reap.
    pub fn kill(&mut self, id: u64) {
        let node = self.nodes.get_mut(&id).unwrap();
        if let Some(mut child) = node.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM (graceful shutdown); the process is reaped by [`ProcessCluster::wait_exit`].
    pub fn terminate(&mut self, id: u64) {
        let pid = self.pid(id);
        send_signal(pid, "TERM");
    }

    /// SIGSTOP.
    pub fn pause(&mut self, id: u64) {
        let pid = self.pid(id);
        send_signal(pid, "STOP");
    }

    /// SIGCONT.
    pub fn resume(&mut self, id: u64) {
        let pid = self.pid(id);
        send_signal(pid, "CONT");
    }

    /// Waits (bounded) for a node's process to exit and reaps it; panics on timeout.
    pub fn wait_exit(&mut self, id: u64, timeout: Duration) -> ExitStatus {
        let node = self.nodes.get_mut(&id).unwrap();
        let child = node
            .child
            .as_mut()
            .unwrap_or_else(|| panic!("node {id} is not running"));
        match wait_child_exit(child, timeout) {
            Some(status) => {
                node.child = None;
                status
            }
            None => panic!("node {id} did not exit within {timeout:?}"),
        }
    }

    /// Whether a node's process has exited (reaping it if so).
    pub fn has_exited(&mut self, id: u64) -> Option<ExitStatus> {
        let node = self.nodes.get_mut(&id).unwrap();
        let status = node.child.as_mut()?.try_wait().ok().flatten()?;
        node.child = None;
        Some(status)
    }

    /// Starts a node that was killed or terminated (same configuration and data).
    pub fn restart(&mut self, id: u64) {
        if let Some(status) = self.has_exited(id) {
            println!("node {id} had exited with {status}");
        }
        if self.node(id).child.is_some() {
            self.kill(id);
        }
        self.spawn(id);
    }

    /// Waits until `GET /readyz` answers 200 on every live node; panics with the log tails on
    /// timeout.
    pub async fn wait_ready(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let ids: Vec<u64> = self
            .nodes
            .values()
            .filter(|node| node.child.is_some())
            .map(|node| node.id)
            .collect();
        for id in ids {
            let url = format!("{}/readyz", self.http_url(id));
            loop {
                let last = match http_request("GET", &url, &[], None).await {
                    Ok((200, _, _)) => break,
                    Ok((status, _, body)) => format!("{status} {}", String::from_utf8_lossy(&body)),
                    Err(error) => error,
                };
                if Instant::now() >= deadline {
                    panic!(
                        "node {id} not ready within {timeout:?} (last answer: {last})\n{}",
                        self.log_tails()
                    );
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }

    /// The tail of every node's log.
    pub fn log_tails(&self) -> String {
        let mut out = String::new();
        for node in self.nodes.values() {
            out.push_str(&format!(
                "----- node {} log ({}) -----\n{}\n",
                node.id,
                node.log_path.display(),
                tail(&node.log_path, LOG_TAIL_LINES)
            ));
        }
        out
    }

    /// A native-protocol client of node `id` acting for [`TENANT`] (insecure development mode).
    pub async fn client(&self, id: u64) -> TestClient {
        let node = self.node(id);
        let mut client = TestClient::connect(node.quic_addr, id, &self.ca_pem)
            .await
            .unwrap_or_else(|error| panic!("connecting to node {id}: {error}"));
        client.principal = Some(Principal {
            principal_id: "tests".to_string(),
            tenant_id: TENANT.to_string(),
        });
        client
    }

    /// Like [`ProcessCluster::client`], `None` when the node cannot be reached.
    pub async fn try_client(&self, id: u64) -> Option<TestClient> {
        let mut client = self.bare_client(id).await.ok()?;
        client.principal = Some(Principal {
            principal_id: "tests".to_string(),
            tenant_id: TENANT.to_string(),
        });
        Some(client)
    }

    /// A native-protocol client of node `id` with no principal.
    pub async fn bare_client(&self, id: u64) -> Result<TestClient, String> {
        let node = self.node(id);
        TestClient::connect(node.quic_addr, id, &self.ca_pem).await
    }

    /// The routing table as node `id` sees it.
    pub async fn routing(&self, id: u64) -> Result<RoutingTable, String> {
        let client = self.bare_client(id).await?;
        let answer = client
            .call_with(RequestBody::Routing, RequestFlags::default(), None, 2_000)
            .await;
        client.close().await;
        match answer {
            Ok(ResponseBody::Routing(table)) => Ok(table),
            Ok(other) => Err(format!("unexpected answer {other:?}")),
            Err(error) => Err(error.to_string()),
        }
    }

    /// Group leaders as node `id` sees them, indexed by group.
    pub async fn leaders(&self, id: u64) -> Result<Vec<GroupLeader>, String> {
        Ok(self.routing(id).await?.leaders)
    }

    /// The leader of `group` as node `id` sees it.
    pub async fn leader_of(&self, id: u64, group: u32) -> Option<u64> {
        self.leaders(id)
            .await
            .ok()?
            .get(group as usize)
            .and_then(|leader| leader.leader)
    }

    /// Leaders that all of `observers` agree on, when every group has one; else None.
    pub async fn agreed_leaders(&self, observers: &[u64]) -> Option<Vec<GroupLeader>> {
        let mut agreed: Option<Vec<GroupLeader>> = None;
        for &id in observers {
            let leaders = self.leaders(id).await.ok()?;
            if leaders.iter().any(|leader| leader.leader.is_none()) {
                return None;
            }
            match &agreed {
                None => agreed = Some(leaders),
                Some(seen) => {
                    let same = seen.len() == leaders.len()
                        && seen.iter().zip(&leaders).all(|(a, b)| a.leader == b.leader);
                    if !same {
                        return None;
                    }
                }
            }
        }
        agreed
    }

    /// Waits until every one of `observers` sees every group led by its preferred leader.
    pub async fn wait_balanced(&self, observers: &[u64], timeout: Duration) -> Vec<GroupLeader> {
        let groups = self.options.groups;
        wait_for(
            timeout,
            "every group led by its preferred leader",
            || async {
                let leaders = self.agreed_leaders(observers).await?;
                (0..groups)
                    .all(|g| leaders[g as usize].leader == Some(self.preferred_leader(g)))
                    .then_some(leaders)
            },
        )
        .await
        .unwrap_or_else(|what| panic!("{what}\n{}", self.log_tails()))
    }

    /// Number of groups each node leads, in `leaders`.
    pub fn led_counts(leaders: &[GroupLeader]) -> BTreeMap<u64, usize> {
        let mut counts = BTreeMap::new();
        for leader in leaders {
            if let Some(node) = leader.leader {
                *counts.entry(node).or_insert(0) += 1;
            }
        }
        counts
    }
}

impl Drop for ProcessCluster {
    fn drop(&mut self) {
        let failing = std::thread::panicking();
        for node in self.nodes.values_mut() {
            if let Some(mut child) = node.child.take() {
                // SIGKILL also ends a paused (SIGSTOP) process.
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        if failing {
            println!(
                "===== test failed; cluster directory kept: {} =====",
                self.dir_path().display()
            );
            println!("{}", self.log_tails());
            if let Some(dir) = self.dir.as_mut() {
                dir.disable_cleanup(true);
            }
        }
    }
}

/// Polls `check` (every 20 ms) until it returns `Some`, at most `timeout`. `Err` names what was
/// awaited.
pub async fn wait_for<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return Ok(value);
        }
        if Instant::now() >= deadline {
            return Err(format!("timed out after {timeout:?} waiting for: {what}"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// The native QUIC client

/// A connection to one node's client endpoint.
pub struct TestClient {
    endpoint: quinn::Endpoint,
    connection: quinn::Connection,
    next_id: AtomicU64,
    /// The principal requests name (insecure development mode), if any.
    pub principal: Option<Principal>,
    /// The node dialled.
    pub node_id: u64,
}

impl std::fmt::Debug for TestClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestClient")
            .field("node_id", &self.node_id)
            .field("remote", &self.connection.remote_address())
            .finish_non_exhaustive()
    }
}

fn client_config(ca_pem: &str) -> Result<quinn::ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        let cert = cert.map_err(|e| format!("CA PEM: {e}"))?;
        roots
            .add(cert)
            .map_err(|e| format!("CA certificate: {e}"))?;
    }
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![CLIENT_ALPN.to_vec()];
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(tls).map_err(|e| e.to_string())?;
    let mut config = quinn::ClientConfig::new(Arc::new(quic));
    let mut transport = quinn::TransportConfig::default();
    transport.max_idle_timeout(Some(
        quinn::IdleTimeout::try_from(Duration::from_secs(10)).map_err(|e| e.to_string())?,
    ));
    transport.keep_alive_interval(Some(Duration::from_secs(2)));
    config.transport_config(Arc::new(transport));
    Ok(config)
}

/// A transport-level failure of the test client, as a wire error (code UNAVAILABLE, message
/// starting with `test client:`).
fn client_failure(message: impl std::fmt::Display) -> WireError {
    WireError::new(ErrorCode::Unavailable, format!("test client: {message}"))
}

async fn read_frame(recv: &mut quinn::RecvStream) -> Result<Option<Vec<u8>>, String> {
    let mut prefix = [0u8; 4];
    match recv.read_exact(&mut prefix).await {
        Ok(()) => {}
        Err(quinn::ReadExactError::FinishedEarly(0)) => return Ok(None),
        Err(error) => return Err(format!("reading a frame length: {error}")),
    }
    let length = u32::from_le_bytes(prefix) as usize;
    if length == 0 || length > CLIENT_FRAME_BYTES_MAX {
        return Err(format!("response frame of {length} bytes"));
    }
    let mut body = vec![0u8; length];
    recv.read_exact(&mut body)
        .await
        .map_err(|e| format!("reading a frame body: {e}"))?;
    Ok(Some(body))
}

impl TestClient {
    /// Connects to `addr`, verifying node `node_id`'s certificate against the cluster CA; no
    /// client certificate.
    pub async fn connect(addr: SocketAddr, node_id: u64, ca_pem: &str) -> Result<Self, String> {
        let config = client_config(ca_pem)?;
        let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap())
            .map_err(|e| format!("client endpoint: {e}"))?;
        endpoint.set_default_client_config(config);
        let connecting = endpoint
            .connect(addr, &node_server_name(node_id))
            .map_err(|e| format!("connect: {e}"))?;
        let connection = tokio::time::timeout(Duration::from_secs(5), connecting)
            .await
            .map_err(|_| format!("handshake with node {node_id} at {addr} timed out"))?
            .map_err(|e| format!("handshake with node {node_id} at {addr}: {e}"))?;
        Ok(TestClient {
            endpoint,
            connection,
            next_id: AtomicU64::new(1),
            principal: None,
            node_id,
        })
    }

    /// Closes the connection.
    pub async fn close(&self) {
        self.connection.close(0u32.into(), b"done");
        let _ = tokio::time::timeout(Duration::from_millis(200), self.endpoint.wait_idle()).await;
    }

    /// Sends `Authenticate` with a bearer token.
    pub async fn authenticate(&self, token: &str) -> Result<Principal, WireError> {
        match self
            .call_with(
                RequestBody::Authenticate {
                    token: token.to_string(),
                },
                RequestFlags::default(),
                None,
                0,
            )
            .await?
        {
            ResponseBody::Authenticated(principal) => Ok(principal),
            other => Err(client_failure(format!("unexpected answer {other:?}"))),
        }
    }

    /// One request with this client's principal and the node's default timeout.
    pub async fn call(
        &self,
        body: RequestBody,
        flags: RequestFlags,
    ) -> Result<ResponseBody, WireError> {
        self.call_with(body, flags, self.principal.clone(), 0).await
    }

    /// One request on its own stream.
    pub async fn call_with(
        &self,
        body: RequestBody,
        flags: RequestFlags,
        principal: Option<Principal>,
        timeout_ms: u32,
    ) -> Result<ResponseBody, WireError> {
        let mut answers = self
            .call_many_with(vec![(body, flags, principal)], timeout_ms)
            .await
            .map_err(client_failure)?;
        answers
            .pop()
            .unwrap_or_else(|| Err(client_failure("no answer")))
    }

    /// Many requests in one frame on one stream (this client's principal); answers in request
    /// order.
    pub async fn call_many(
        &self,
        requests: Vec<(RequestBody, RequestFlags)>,
    ) -> Result<Vec<Result<ResponseBody, WireError>>, String> {
        let requests = requests
            .into_iter()
            .map(|(body, flags)| (body, flags, self.principal.clone()))
            .collect();
        self.call_many_with(requests, 0).await
    }

    /// Many requests in one frame on one stream; answers in request order.
    pub async fn call_many_with(
        &self,
        requests: Vec<(RequestBody, RequestFlags, Option<Principal>)>,
        timeout_ms: u32,
    ) -> Result<Vec<Result<ResponseBody, WireError>>, String> {
        let first_id = self
            .next_id
            .fetch_add(requests.len() as u64, Ordering::Relaxed);
        let frame = RequestFrame {
            requests: requests
                .into_iter()
                .enumerate()
                .map(|(i, (body, flags, principal))| Request {
                    id: first_id + i as u64,
                    timeout_ms,
                    flags,
                    principal,
                    body,
                })
                .collect(),
        };
        let count = frame.requests.len();
        let bytes = encode_client_frame(&frame).map_err(|e| format!("encoding: {e}"))?;
        let exchange = async {
            let (mut send, mut recv) = self
                .connection
                .open_bi()
                .await
                .map_err(|e| format!("opening a stream: {e}"))?;
            send.write_all(&bytes)
                .await
                .map_err(|e| format!("writing a frame: {e}"))?;
            let _ = send.finish();
            let mut answers: HashMap<u64, Result<ResponseBody, WireError>> = HashMap::new();
            while answers.len() < count {
                let Some(body) = read_frame(&mut recv).await? else {
                    return Err(format!(
                        "stream ended after {} of {count} answers",
                        answers.len()
                    ));
                };
                let frame = decode_response_frame(&body).map_err(|e| format!("decoding: {e}"))?;
                for response in frame.responses {
                    answers.insert(response.id, response.result);
                }
            }
            Ok::<_, String>(answers)
        };
        let wait = CALL_TIMEOUT + Duration::from_millis(u64::from(timeout_ms));
        let mut answers = tokio::time::timeout(wait, exchange)
            .await
            .map_err(|_| format!("no answer from node {} within {wait:?}", self.node_id))??;
        (0..count)
            .map(|i| {
                answers
                    .remove(&(first_id + i as u64))
                    .ok_or_else(|| format!("no answer for request {}", first_id + i as u64))
            })
            .collect()
    }

    /// Acquire with `forward = true`.
    pub async fn acquire(
        &self,
        tenant: &str,
        resource: &str,
        holder: &str,
        ttl_ms: u64,
        request_id: &str,
    ) -> Result<LeaseResult, WireError> {
        let body = RequestBody::Lease(tenure_core::LeaseOp::Acquire(AcquireRequest {
            key: ResourceKey::new(tenant, resource),
            holder_id: holder.to_string(),
            ttl_ms,
            request_id: request_id.to_string(),
        }));
        lease_result(self.call(body, forward()).await)
    }

    /// Renew with `forward = true`.
    pub async fn renew(
        &self,
        tenant: &str,
        resource: &str,
        lease_id: LeaseId,
        holder: &str,
        ttl_ms: u64,
        request_id: &str,
    ) -> Result<LeaseResult, WireError> {
        let body = RequestBody::Lease(tenure_core::LeaseOp::Renew(RenewRequest {
            key: ResourceKey::new(tenant, resource),
            lease_id,
            holder_id: holder.to_string(),
            ttl_ms,
            request_id: request_id.to_string(),
        }));
        lease_result(self.call(body, forward()).await)
    }

    /// Release with `forward = true`.
    pub async fn release(
        &self,
        tenant: &str,
        resource: &str,
        lease_id: LeaseId,
        holder: &str,
        request_id: &str,
    ) -> Result<LeaseResult, WireError> {
        let body = RequestBody::Lease(tenure_core::LeaseOp::Release(ReleaseRequest {
            key: ResourceKey::new(tenant, resource),
            lease_id,
            holder_id: holder.to_string(),
            request_id: request_id.to_string(),
        }));
        lease_result(self.call(body, forward()).await)
    }

    /// Get with the given flags.
    pub async fn get(
        &self,
        tenant: &str,
        resource: &str,
        flags: RequestFlags,
    ) -> Result<GetResult, WireError> {
        let body = RequestBody::Get {
            key: ResourceKey::new(tenant, resource),
        };
        match self.call(body, flags).await? {
            ResponseBody::Get(result) => Ok(result),
            other => Err(client_failure(format!("Get answered {other:?}"))),
        }
    }
}

/// `forward = true`, linearizable reads.
pub fn forward() -> RequestFlags {
    RequestFlags {
        forward: true,
        ..RequestFlags::default()
    }
}

/// `forward = false`, linearizable reads.
pub fn no_forward() -> RequestFlags {
    RequestFlags::default()
}

/// `forward = false`, stale reads allowed.
pub fn stale() -> RequestFlags {
    RequestFlags {
        stale_read: true,
        ..RequestFlags::default()
    }
}

/// The lease result of an Acquire, Renew or Release answer. A single operation's error must come
/// back as the response's error; any other shape is reported as a client failure.
pub fn lease_result(answer: Result<ResponseBody, WireError>) -> Result<LeaseResult, WireError> {
    match answer? {
        ResponseBody::Lease(result) => Ok(result),
        other => Err(client_failure(format!(
            "a single lease operation was answered with {other:?} (expected Lease or an error)"
        ))),
    }
}

/// The status of a Get answer (ABSENT when there is no record).
pub fn status_of(result: &GetResult) -> LeaseStatus {
    result
        .view
        .as_ref()
        .map_or(LeaseStatus::Absent, |view| view.status)
}

/// The view of a Get answer, panicking when absent.
pub fn view_of(result: &GetResult) -> &LeaseView {
    result.view.as_ref().expect("a lease record")
}

// ---------------------------------------------------------------------------------------------
// HTTP

/// One HTTP/1.1 request; `(status, headers, body)`. Errors are transport failures.
pub async fn http_request(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<Vec<u8>>,
) -> Result<(u16, hyper::HeaderMap, Vec<u8>), String> {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let mut builder = hyper::Request::builder().method(method).uri(url);
    let has_content_type = headers
        .iter()
        .any(|(name, _)| name.eq_ignore_ascii_case("content-type"));
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    if body.is_some() && !has_content_type {
        builder = builder.header("content-type", "application/json");
    }
    let request = builder
        .body(Full::new(Bytes::from(body.unwrap_or_default())))
        .map_err(|e| format!("building the request: {e}"))?;
    let exchange = async {
        let response = client
            .request(request)
            .await
            .map_err(|e| format!("{method} {url}: {e}"))?;
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("{method} {url}: reading the body: {e}"))?
            .to_bytes()
            .to_vec();
        Ok::<_, String>((status, headers, body))
    };
    tokio::time::timeout(Duration::from_secs(15), exchange)
        .await
        .map_err(|_| format!("{method} {url}: no answer within 15 s"))?
}

/// One server-sent event: `(event, id, data)` (absent fields empty).
pub type SseEvent = (String, String, String);

/// Reads a server-sent-event stream (`GET url`) until `until` accepts the events read so far, or
/// `wait` passes (an error), then drops the connection.
pub async fn sse_read(
    url: &str,
    headers: &[(&str, &str)],
    wait: Duration,
    until: impl Fn(&[SseEvent]) -> bool,
) -> Result<Vec<SseEvent>, String> {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let mut builder = hyper::Request::builder().method("GET").uri(url);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let request = builder
        .body(Full::new(Bytes::new()))
        .map_err(|e| format!("building the request: {e}"))?;
    let read = async {
        let response = client
            .request(request)
            .await
            .map_err(|e| format!("GET {url}: {e}"))?;
        let status = response.status().as_u16();
        let mut body = response.into_body();
        if status != 200 {
            let bytes = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
            return Err(format!(
                "GET {url}: {status} {}",
                String::from_utf8_lossy(&bytes)
            ));
        }
        let (mut text, mut events) = (String::new(), Vec::new());
        loop {
            let frame = body
                .frame()
                .await
                .ok_or_else(|| format!("GET {url}: the stream ended"))?
                .map_err(|e| format!("GET {url}: {e}"))?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            text.push_str(&String::from_utf8_lossy(&data));
            while let Some(end) = text.find("\n\n") {
                let block: String = text.drain(..end + 2).collect();
                let mut event: SseEvent = Default::default();
                for line in block.lines() {
                    if let Some(value) = line.strip_prefix("event:") {
                        event.0 = value.trim().to_owned();
                    } else if let Some(value) = line.strip_prefix("id:") {
                        event.1 = value.trim().to_owned();
                    } else if let Some(value) = line.strip_prefix("data:") {
                        event.2.push_str(value.trim());
                    }
                }
                if !event.0.is_empty() || !event.2.is_empty() {
                    events.push(event);
                }
            }
            if until(&events) {
                return Ok::<_, String>(events);
            }
        }
    };
    tokio::time::timeout(wait, read)
        .await
        .map_err(|_| format!("GET {url}: the awaited events did not come within {wait:?}"))?
}

/// One HTTP request with a JSON answer: `(status, json)`. A body that is not JSON is a panic
/// naming the route (every answer of the gateway's API routes is JSON).
pub async fn http_json(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<&serde_json::Value>,
) -> (u16, serde_json::Value) {
    let bytes = body.map(|value| serde_json::to_vec(value).unwrap());
    let (status, _, body) = http_request(method, url, headers, bytes)
        .await
        .unwrap_or_else(|error| panic!("{error}"));
    let json = serde_json::from_slice(&body).unwrap_or_else(|error| {
        panic!(
            "{method} {url} answered {status} with a body that is not JSON ({error}): {:?}",
            String::from_utf8_lossy(&body)
        )
    });
    (status, json)
}

/// Percentile (0..=100) of sorted samples, nearest rank.
pub fn percentile(sorted: &[u128], pct: f64) -> u128 {
    if sorted.is_empty() {
        return 0;
    }
    // Nearest rank: the smallest sample with at least pct% of the samples at or below it.
    let len = sorted.len();
    let rank = (1..=len)
        .find(|&rank| rank as f64 >= pct / 100.0 * len as f64)
        .unwrap_or(len);
    sorted[rank - 1]
}

/// Opens (creating) a file for appending.
pub fn append_file(path: &Path) -> File {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap()
}
