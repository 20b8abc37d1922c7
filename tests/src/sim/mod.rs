//! The deterministic simulation: whole clusters inside one thread, reproducible from a seed.
//!
//! A run ([`run`]) builds a turmoil simulation with N node hosts and C client hosts. Each node
//! host runs the real server ([`tenure_server::Node::start_with`]): real openraft, the real QUIC
//! transport on a turmoil socket ([`net`]), and the in-memory storage on a
//! [`tenure_storage::MemoryDisk`], which keeps only what was synced (and a random prefix of the
//! rest) when the host crashes. Client hosts run the fault suite's workload tasks on the real
//! `tenure-client`, recording into memory, fencing against an in-process store.
//!
//! What could make two runs of one seed differ goes through seeded or simulated sources:
//! turmoil's clock (every `tokio::time` reading; the node's monotonic clock rides on it, with a
//! per-node rate error drawn within half the contract's bound), turmoil's network randomness
//! (latency, loss), the nodes' and clients' seeds (transport jitter, state-machine hash seeds,
//! openraft's election timeouts through `TenureRuntime`, quinn's endpoint and connection ids),
//! ordered maps where iteration order reaches behaviour, and one thread. The trace hash (every
//! replica state change the probe sees, every fault, every recorded operation) shows it: the
//! suite runs a seed twice and compares.
//!
//! The seeded nemesis has three streams, so faults combine, over the fault kinds the fault suite
//! shares ([`crate::faults::FaultKind::SIMULATION`]): network faults (`partition-halves`,
//! `partition-leader`, `partition-one-way`, `partition-bridge`, `hold-messages`,
//! `lose-messages`), node faults (`kill` with lost unsynced writes and a restart,
//! `clock-rate`, `pause-client`: a client's links held longer than a ttl, a zombie holder whose
//! fenced writes still land, `clock-jump`) and, on 5 nodes, membership (`move-replica`,
//! `drain-node`, `remove-node`, `replace-node`: a mover on client host 1 moves replicas and
//! changes the node table as an operator would). A run draws one kind alone or all of
//! them combined. After every step the [`probe`] checks election safety, replica state equality
//! at equal applied indexes and monotone log time and tokens; at the end the fault suite's
//! checker judges the history (single holder, fencing, nothing acknowledged lost, exactly-once,
//! linearizability, liveness after heal).
//!
//! Must not depend on: real sockets, real processes or wall-clock time for decisions (files go
//! to a scratch directory: certificates, data-directory identity, snapshot files).

pub mod net;
pub mod probe;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng as _, SeedableRng as _};
use serde::{Deserialize, Serialize};
use tenure_client::{Client, ClientConfig, Credentials, Endpoint, ResourceKey};
use tenure_core::NegativeControl;
use tenure_server::clock::MonotonicClock;
use tenure_server::config::{
    AuthConfig, ClusterConfig, LimitsConfig, PeerConfig, StorageConfig, TestingConfig,
    TimingConfig, TlsConfig,
};
use tenure_server::fault_control::{FaultControls, FaultSettings};
use tenure_server::{Node, NodeEnv, ServerConfig};
use tenure_storage::{MemoryDisk, NodeStorage, StorageOptions};
use tenure_transport::certs::KeyAlgorithm;
use tokio::sync::watch;
use xxhash_rust::xxh3::Xxh3;

use crate::checker::{self, CheckConfig, Property, Violation};
use crate::fencing::SharedFence;
use crate::harness::workload::{Fence, Sink, TaskSet, TaskSpec, WorkClock, Workload, run_watcher};
use crate::history::{FaultEvent, History, Nanos, OpRecord, WatchRecord};
use probe::{Probe, Registry};

/// The port every node serves on (peers and clients).
pub const NODE_PORT: u16 = 7401;
/// The tenant of every resource.
pub const TENANT: &str = "sim";
/// One simulation step.
const TICK: Duration = Duration::from_millis(1);
/// Operations one run records at most.
const OPS_MAX: usize = 1_000_000;

pub use crate::faults::FaultKind;

/// What one run simulates.
#[derive(Debug, Clone)]
pub struct SimOptions {
    /// Everything follows from it.
    pub seed: u64,
    /// Node hosts (3 or 5).
    pub nodes: u64,
    /// Raft groups.
    pub groups: u32,
    /// Client hosts.
    pub client_hosts: u32,
    /// Holder tasks per client host.
    pub tasks_per_client: u32,
    /// Resources (the contended keyspace).
    pub resources: usize,
    /// Lease ttl.
    pub ttl_ms: u64,
    /// Simulated time before the nemesis starts (elections, connections).
    pub warmup_ms: u64,
    /// Simulated time the nemesis runs.
    pub fault_ms: u64,
    /// After the heal: every client must progress within it.
    pub liveness_bound_ms: u64,
    /// After the stop signal: how long unanswered operations keep being retried.
    pub resolve_ms: u64,
    /// The kinds to draw from (`None`: the seed picks one alone, or all combined).
    pub nemeses: Option<Vec<FaultKind>>,
    /// A guarantee broken on purpose (checks must catch it).
    pub negative_control: NegativeControl,
    /// A negative control outside the contract: every node's clock this many ppm fast (the
    /// contract bounds drift at 1%; 100,000 is 10%).
    pub out_of_bound_drift_ppm: Option<i64>,
    /// Where scratch files go (a fresh directory per run, removed after).
    pub work_dir: PathBuf,
}

impl SimOptions {
    /// The defaults for `seed`: 3 nodes (5 for one seed in four), 3 groups, 2 clients of 3
    /// tasks, 4 resources, ttl 3 s, 20 s of faults.
    pub fn for_seed(seed: u64) -> Self {
        SimOptions {
            seed,
            nodes: if seed % 4 == 3 { 5 } else { 3 },
            groups: 3,
            client_hosts: 2,
            tasks_per_client: 3,
            resources: 4,
            ttl_ms: 3_000,
            warmup_ms: 3_000,
            fault_ms: 20_000,
            liveness_bound_ms: 10_000,
            resolve_ms: 5_000,
            nemeses: None,
            negative_control: NegativeControl::None,
            out_of_bound_drift_ppm: None,
            work_dir: std::env::temp_dir(),
        }
    }
}

/// What a run found.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SimReport {
    /// The seed.
    pub seed: u64,
    /// Node hosts.
    pub nodes: u64,
    /// What the nemesis drew from.
    pub profile: String,
    /// Faults applied, by kind.
    pub faults: BTreeMap<String, u64>,
    /// Simulated milliseconds.
    pub simulated_ms: u64,
    /// Simulation steps.
    pub steps: u64,
    /// Operations the checker judged.
    pub ops_checked: u64,
    /// Hand-offs to waiters whose queue place was known (judged for FIFO order and liveness).
    #[serde(default)]
    pub hand_offs_judged: u64,
    /// Watch events the checker judged.
    #[serde(default)]
    pub watch_events_judged: u64,
    /// Leader changes the probe saw.
    pub elections: u64,
    /// Replica states compared at equal applied indexes.
    pub states_compared: u64,
    /// Fenced writes after their writer's deadline, and how many the store rejected.
    pub late_writes: u64,
    /// Of the late writes, the rejected ones.
    pub late_writes_rejected: u64,
    /// Unsynced disk batches lost in crashes.
    pub lost_unsynced_batches: u64,
    /// Replica moves the mover finished (the group's new voters answered).
    pub moves_done: u64,
    /// Replica moves that ended in an error (refused, leader lost, out of time).
    pub moves_failed: u64,
    /// Nodes the membership nemeses took out for good (crashed and removed, or drained empty
    /// and removed).
    pub nodes_gone: Vec<u64>,
    /// Nodes `add-node` announced and started during the run.
    #[serde(default)]
    pub nodes_added: Vec<u64>,
    /// Nodes brought back with a wiped disk under their old id (replace-node, half the time)
    /// that the node table or a founder pin knew (the ones that must be refused).
    #[serde(default)]
    pub nodes_wiped: Vec<u64>,
    /// Nodes that excluded themselves (the node table refused their data directory). A wiped
    /// node that is not here stayed closed until the end (its peers refused it once removed).
    #[serde(default)]
    pub nodes_excluded: Vec<u64>,
    /// Of the wipes in `nodes_wiped`, those done while no node table had the node's incarnation
    /// yet (the cluster's birth window: only the founder pins can refuse it then).
    #[serde(default)]
    pub wipes_in_birth_window: u64,
    /// Wipes of a node that neither the table nor another node's founder pins knew (it had
    /// served with nobody: admitting it as new is right, and it is not counted as amnesia).
    #[serde(default)]
    pub wipes_unpinned: u64,
    /// Each group's voters at the end, as its ready leader saw them (groups without a ready
    /// leader at that moment are missing).
    pub final_voters: BTreeMap<u32, Vec<u64>>,
    /// Voting replicas on `nodes_gone` at the end (the controller re-creates them elsewhere;
    /// nonzero means it had not finished when the run ended, not a violation).
    pub voters_on_gone_nodes: u64,
    /// Hash of the trace (two runs of one seed must agree).
    pub trace_hash: u64,
    /// Every violation, as text.
    pub violations: Vec<String>,
    /// The properties violated.
    pub violated: Vec<String>,
    /// Resources whose linearizability search ran out of steps.
    pub inconclusive: Vec<String>,
}

/// Why a run could not be carried out (not a violation: the harness failed).
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// Scratch files.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The error.
        source: std::io::Error,
    },
    /// Certificates.
    #[error("certificates: {0}")]
    Tls(String),
    /// The options.
    #[error("options: {0}")]
    Options(String),
}

fn io(context: &str) -> impl FnOnce(std::io::Error) -> SimError + '_ {
    move |source| SimError::Io {
        context: context.to_string(),
        source,
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Panics, with the thread they happened on (a simulation runs on one thread, so its panics
/// are the ones on its thread; a task's panic would otherwise vanish with the task).
static PANICS: Mutex<Vec<(std::thread::ThreadId, String)>> = Mutex::new(Vec::new());
/// Panics remembered at most.
const PANICS_MAX: usize = 10_000;

fn install_panic_hook() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let mut panics = lock(&PANICS);
            if panics.len() < PANICS_MAX {
                panics.push((std::thread::current().id(), info.to_string()));
            }
            drop(panics);
            previous(info);
        }));
    });
}

/// The wall clock of a node host: the simulation's epoch plus elapsed time, plus an offset the
/// nemesis may jump (only the negative control `expire-by-wall-clock` reads it).
#[derive(Debug, Default)]
struct SimWallClock {
    offset_ms: AtomicI64,
}

impl MonotonicClock for SimWallClock {
    fn now_ms(&self) -> u64 {
        let since = turmoil::since_epoch().unwrap_or_default();
        let ms = i128::try_from(since.as_millis()).unwrap_or(0)
            + i128::from(self.offset_ms.load(Ordering::Relaxed));
        u64::try_from(ms.max(0)).unwrap_or(u64::MAX)
    }
}

/// What node hosts share with the driver.
#[derive(Default)]
struct Shared {
    registry: Mutex<Registry>,
    incarnations: Mutex<BTreeMap<u64, u64>>,
    host_errors: Mutex<Vec<String>>,
    /// Nodes the nemesis brought back with a wiped disk under their old id (replace-node).
    wiped: Mutex<BTreeSet<u64>>,
    /// Of those, the ones whose replicas the node table admitted after the wipe: a member that
    /// lost its votes and acknowledged entries rejoined as if it had not (must stay empty).
    admitted_after_wipe: Mutex<BTreeSet<u64>>,
    /// Nodes that excluded themselves, with the reason.
    exclusions: Mutex<BTreeMap<u64, String>>,
}

/// Certificates for the run's nodes, generated once per process (Ed25519: fixed-size
/// signatures, so handshakes have the same sizes in every run).
fn certificates(work_dir: &Path, nodes: u64) -> Result<(PathBuf, String), SimError> {
    static MADE: Mutex<BTreeMap<u64, (PathBuf, String)>> = Mutex::new(BTreeMap::new());
    let mut made = lock(&MADE);
    if let Some(found) = made.get(&nodes) {
        if found.0.exists() {
            return Ok(found.clone());
        }
    }
    let dir = tempfile::Builder::new()
        .prefix("tenure-sim-certs-")
        .tempdir_in(work_dir)
        .map_err(io("creating the certificate directory"))?
        .keep();
    let ids: Vec<u64> = (1..=nodes).collect();
    let ips: Vec<IpAddr> = ids.iter().map(|&id| node_ip(id)).collect();
    tenure_transport::certs::write_cluster_certificates_with(
        &dir,
        CLUSTER_NAME,
        &ids,
        &ips,
        KeyAlgorithm::Ed25519,
    )
    .map_err(|e| SimError::Tls(e.to_string()))?;
    let ca_pem = std::fs::read_to_string(dir.join(tenure_transport::tls::CA_CERT_FILE))
        .map_err(io("reading the CA certificate"))?;
    made.insert(nodes, (dir.clone(), ca_pem.clone()));
    Ok((dir, ca_pem))
}

const CLUSTER_NAME: &str = "tenure-sim";

/// Node `id`'s address: turmoil hands out 192.168.0.1, .2, ... in the order names are first
/// looked up, and the run looks up `n1`, `n2`, ... first.
fn node_ip(id: u64) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(
        192,
        168,
        0,
        u8::try_from(id).unwrap_or(u8::MAX),
    ))
}

fn node_name(id: u64) -> String {
    format!("n{id}")
}

fn client_name(client: u32) -> String {
    format!("c{client}")
}

/// Node `id`'s configuration; its peers are nodes 1 to `peers_max` (the founders, or for the
/// spare node an `add-node` starts, the founders and itself).
fn node_config(
    options: &SimOptions,
    id: u64,
    peers_max: u64,
    data_dir: PathBuf,
    certs: &Path,
) -> ServerConfig {
    let peers: BTreeMap<u64, PeerConfig> = (1..=peers_max)
        .map(|peer| {
            (
                peer,
                PeerConfig {
                    addr: SocketAddr::new(node_ip(peer), NODE_PORT),
                    http_addr: SocketAddr::new(node_ip(peer), NODE_PORT + 1),
                },
            )
        })
        .collect();
    ServerConfig {
        node_id: id,
        cluster_name: CLUSTER_NAME.to_string(),
        data_dir,
        peers,
        groups: options.groups,
        replication_factor: u32::try_from(options.nodes).unwrap_or(3).min(3),
        tls: TlsConfig {
            ca_cert: certs.join(tenure_transport::tls::CA_CERT_FILE),
            node_cert: certs.join(tenure_transport::tls::node_cert_file_name(id)),
            node_key: certs.join(tenure_transport::tls::node_key_file_name(id)),
        },
        timing: TimingConfig {
            heartbeat_ms: 100,
            election_timeout_min_ms: 600,
            election_timeout_max_ms: 900,
            snapshot_every_entries: 300,
            ..TimingConfig::default()
        },
        limits: LimitsConfig::default(),
        auth: AuthConfig {
            insecure_dev_mode: true,
            tokens: Vec::new(),
        },
        storage: StorageConfig {
            fsync: true,
            ..StorageConfig::default()
        },
        // The placement controller looks every second, so the membership nemeses see it act
        // within a step; a node is dead 2 s after its connections are gone (QUIC's 10 s idle
        // timeout after its last packet: longer than any transient fault, 4 s at most).
        cluster: ClusterConfig {
            placement_interval_ms: 1_000,
            node_dead_after_ms: 2_000,
            // Unpaced (as before the pause existed): a drain's moves run within its step.
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

/// A fault in effect, and how to heal it.
#[derive(Debug, Clone)]
enum Active {
    Crash {
        node: u64,
    },
    Cut {
        pairs: Vec<(String, String)>,
    },
    /// Each pair's first node's traffic to the second is dropped.
    CutOneWay {
        pairs: Vec<(String, String)>,
    },
    Hold {
        pairs: Vec<(String, String)>,
    },
    Loss {
        pairs: Vec<(String, String)>,
    },
    Drift {
        node: u64,
    },
    WallJump {
        node: u64,
    },
    HoldClient {
        pairs: Vec<(String, String)>,
    },
    /// A replica move was handed to the mover (client host 1); nothing to heal.
    Move,
    /// The spare node was announced and started; announced again at the heal unless the table
    /// has its incarnation by then (it reported itself).
    Add {
        node: u64,
    },
    /// A node drained through the mover; undrained at the heal, or removed when `remove` and
    /// it holds no replica by then.
    Drain {
        node: u64,
        remove: bool,
    },
    /// A node crashed for good; drained and removed from the node table at the heal.
    Replace {
        node: u64,
    },
}

/// What the nemesis asks the mover (an operator on client host 1) to do.
#[derive(Debug, Clone)]
enum MoveOrder {
    /// Move group's replica from one node to another.
    Replica { group: u32, from: u64, to: u64 },
    /// These node-table changes, in order (a refused one is reported and the rest still sent).
    Table {
        kind: FaultKind,
        ops: Vec<tenure_core::ClusterOp>,
    },
}

/// What the mover reports of each order: its kind, whether it was done, and how it ended.
type MoveOutcomes = Arc<Mutex<Vec<(FaultKind, bool, String)>>>;

/// The channel from the nemesis to the mover task on client host 1, and the outcomes the mover
/// reports back (drained into the nemesis's events, so they reach the trace).
#[derive(Default, Clone)]
struct Mover {
    orders: Option<tokio::sync::mpsc::Sender<MoveOrder>>,
    outcomes: MoveOutcomes,
}

/// One stream of the nemesis: a fault at a time.
struct Stream {
    kinds: Vec<FaultKind>,
    next_at_ms: u64,
    active: Option<(u64, FaultKind, Active)>,
}

struct Nemesis {
    rng: SmallRng,
    streams: Vec<Stream>,
    nodes: u64,
    clients: u32,
    ttl_ms: u64,
    base_rate_ppm: BTreeMap<u64, i64>,
    counts: BTreeMap<String, u64>,
    events: Vec<FaultEvent>,
    disks: BTreeMap<u64, MemoryDisk>,
    data_dirs: BTreeMap<u64, PathBuf>,
    wall_clocks: BTreeMap<u64, Arc<SimWallClock>>,
    /// Each node's clock rate as the nemesis wants it (a task on the node's host applies it).
    clock_rates: BTreeMap<u64, Arc<watch::Sender<i64>>>,
    lost_batches: u64,
    mover: Mover,
    moves_done: u64,
    moves_failed: u64,
    /// Nodes drained, crashed for good or removed by the membership nemeses: no move targets
    /// them and no other node leaves while they are out (kills leave `gone` nodes alone; the
    /// network and clock faults may still pick one, to no effect).
    out: std::collections::BTreeSet<u64>,
    /// Nodes crashed for good (never bounced).
    gone: std::collections::BTreeSet<u64>,
    /// Wipes not done because the node table had no incarnation for the node yet.
    wipes_in_birth_window: u64,
    wipes_unpinned: u64,
    groups: u32,
    /// The spare node and the switch that starts it (`add-node`, once).
    spare: Option<(u64, Arc<watch::Sender<bool>>)>,
    /// Nodes `add-node` announced and started.
    added: Vec<u64>,
}

impl Nemesis {
    fn node_names(&self) -> Vec<String> {
        (1..=self.nodes).map(node_name).collect()
    }

    /// Node `node`'s links to every other node.
    fn links_of(&self, node: u64) -> Vec<(String, String)> {
        let me = node_name(node);
        (1..=self.nodes)
            .filter(|&other| other != node)
            .map(|other| (me.clone(), node_name(other)))
            .collect()
    }

    fn pairs_between(a: &[String], b: &[String]) -> Vec<(String, String)> {
        a.iter()
            .flat_map(|x| b.iter().map(move |y| (x.clone(), y.clone())))
            .collect()
    }

    fn record(&mut self, now_ms: u64, kind: FaultKind, start: bool, detail: String) {
        if start {
            *self.counts.entry(kind.name().to_string()).or_default() += 1;
        }
        self.events.push(FaultEvent {
            at_ns: now_ms.saturating_mul(1_000_000),
            nemesis: kind.name().to_string(),
            start,
            detail,
        });
    }

    /// Applies and heals what is due at `now_ms`.
    fn tick(
        &mut self,
        now_ms: u64,
        sim: &mut turmoil::Sim<'_>,
        shared: &Shared,
        probe: &mut Probe,
    ) {
        self.drain_move_outcomes(now_ms);
        for index in 0..self.streams.len() {
            let due_heal = self.streams[index]
                .active
                .as_ref()
                .is_some_and(|(until, _, _)| now_ms >= *until);
            if due_heal {
                if let Some((_, kind, active)) = self.streams[index].active.take() {
                    if let Some(again) = self.heal(now_ms, kind, active, sim, shared, probe) {
                        // The mover was busy: try again shortly.
                        self.streams[index].active = Some((now_ms + 200, kind, again));
                        continue;
                    }
                }
                let pause = self.rng.random_range(300..=2_000);
                self.streams[index].next_at_ms = now_ms + pause;
                continue;
            }
            if self.streams[index].active.is_none() && now_ms >= self.streams[index].next_at_ms {
                let kinds = &self.streams[index].kinds;
                let kind = kinds[self.rng.random_range(0..kinds.len())];
                let hold_ms = match kind {
                    FaultKind::PauseClient => self.rng.random_range(self.ttl_ms..=self.ttl_ms * 2),
                    FaultKind::HoldMessages => self.rng.random_range(200..=1_500),
                    // Long enough for the controller (a round a second) to move replicas.
                    FaultKind::DrainNode | FaultKind::RemoveNode | FaultKind::AddNode => {
                        self.rng.random_range(4_000..=12_000)
                    }
                    // At times long enough for a crashed node to be declared dead first (2 s
                    // after its connections are gone, which takes QUIC's 10 s idle timeout).
                    FaultKind::ReplaceNode => self.rng.random_range(8_000..=18_000),
                    _ => self.rng.random_range(500..=4_000),
                };
                if let Some(active) = self.apply(now_ms, kind, sim, shared, probe) {
                    self.streams[index].active = Some((now_ms + hold_ms, kind, active));
                } else {
                    self.streams[index].next_at_ms = now_ms + 200;
                }
            }
        }
    }

    fn leader_of_some_group(&mut self, shared: &Shared) -> Option<u64> {
        let registry = lock(&shared.registry);
        let mut leaders: Vec<u64> = Vec::new();
        for (&node, handles) in registry.iter() {
            for handle in handles.iter().filter_map(Weak::upgrade) {
                if handle.is_ready_leader() {
                    leaders.push(node);
                }
            }
        }
        if leaders.is_empty() {
            return None;
        }
        Some(leaders[self.rng.random_range(0..leaders.len())])
    }

    /// A move for some group whose ready leader sees one voter set: a random voter to a random
    /// node that holds no voting replica.
    fn pick_move(&mut self, shared: &Shared) -> Option<(u32, u64, u64)> {
        let candidates: Vec<(u32, Vec<u64>)> = {
            let registry = lock(&shared.registry);
            let mut found = BTreeMap::new();
            for handles in registry.values() {
                for handle in handles.iter().filter_map(Weak::upgrade) {
                    if handle.is_ready_leader() {
                        let members = handle.members();
                        if members.voter_sets.len() == 1 {
                            found.insert(handle.group_id(), members.voters);
                        }
                    }
                }
            }
            found.into_iter().collect()
        };
        if candidates.is_empty() {
            return None;
        }
        let (group, voters) = candidates[self.rng.random_range(0..candidates.len())].clone();
        let spare: Vec<u64> = (1..=self.nodes)
            .filter(|n| !voters.contains(n) && !self.out.contains(n))
            .collect();
        if spare.is_empty() || voters.is_empty() {
            return None;
        }
        let from = voters[self.rng.random_range(0..voters.len())];
        let to = spare[self.rng.random_range(0..spare.len())];
        Some((group, from, to))
    }

    /// Records the outcomes the mover reported since the last tick.
    fn drain_move_outcomes(&mut self, now_ms: u64) {
        let outcomes: Vec<(FaultKind, bool, String)> =
            std::mem::take(&mut *lock(&self.mover.outcomes));
        for (kind, done, outcome) in outcomes {
            if kind == FaultKind::MoveReplica {
                if done {
                    self.moves_done += 1;
                } else {
                    self.moves_failed += 1;
                }
                self.record(now_ms, kind, false, outcome);
            } else {
                self.events.push(FaultEvent {
                    at_ns: now_ms.saturating_mul(1_000_000),
                    nemesis: kind.name().to_string(),
                    start: false,
                    detail: format!("mover: {outcome}"),
                });
            }
        }
    }

    /// Stops node `node`'s host: its replicas leave the registry and the probe.
    fn stop_host(node: u64, sim: &mut turmoil::Sim<'_>, shared: &Shared, probe: &mut Probe) {
        sim.crash(node_name(node));
        lock(&shared.registry).remove(&node);
        probe.forget(node);
    }

    /// Crashes node `node`'s host and its disk (part of the unsynced writes lost); how many
    /// unsynced batches were lost.
    fn crash_host(
        &mut self,
        node: u64,
        sim: &mut turmoil::Sim<'_>,
        shared: &Shared,
        probe: &mut Probe,
    ) -> usize {
        Self::stop_host(node, sim, shared, probe);
        let lost = self
            .disks
            .get(&node)
            .map_or(0, |disk| disk.crash().lost_batches);
        self.lost_batches += lost as u64;
        lost
    }

    /// True when some replica of the metadata group has node `node`'s data-directory
    /// incarnation in its node table (recorded with the founders, or reported since).
    fn incarnation_recorded(node: u64, shared: &Shared) -> bool {
        let registry = lock(&shared.registry);
        registry.values().any(|handles| {
            handles.iter().filter_map(Weak::upgrade).any(|handle| {
                handle.group_id() == tenure_core::METADATA_GROUP.0
                    && handle
                        .cluster_meta()
                        .node(node)
                        .is_some_and(|record| record.incarnation != 0)
            })
        })
    }

    /// True when another node's founder pins (`FOUNDERS` in its data directory, durable)
    /// hold an incarnation of node `node` (any: conservative, as pins are never replaced; the
    /// directories of nodes gone for good count too).
    fn incarnation_pinned(&self, node: u64) -> bool {
        self.data_dirs.iter().any(|(&other, dir)| {
            other != node
                && tenure_server::founders::read_founder_pins(dir)
                    .is_ok_and(|pins| pins.contains_key(&node))
        })
    }

    /// True when some replica of the metadata group has a node table.
    fn table_exists(shared: &Shared) -> bool {
        let registry = lock(&shared.registry);
        registry.values().any(|handles| {
            handles.iter().filter_map(Weak::upgrade).any(|handle| {
                handle.group_id() == tenure_core::METADATA_GROUP.0
                    && handle.cluster_meta().version > 0
            })
        })
    }

    /// The operator's announcement of node `node` (`AddNode`).
    fn announce(node: u64) -> tenure_core::ClusterOp {
        tenure_core::ClusterOp::AddNode(tenure_core::NodeAddresses {
            node_id: node,
            addr: SocketAddr::new(node_ip(node), NODE_PORT).to_string(),
            http_addr: SocketAddr::new(node_ip(node), NODE_PORT + 1).to_string(),
        })
    }

    /// Replaces node `node`'s disk by an empty one and its data directory by a new one (another
    /// incarnation: its identity's creation time differs from the old one's). Call it only while
    /// the node's host is down. False when the directory could not be replaced.
    fn wipe(&mut self, node: u64) -> bool {
        let (Some(disk), Some(data_dir)) = (self.disks.get(&node), self.data_dirs.get(&node))
        else {
            return false;
        };
        let old = tenure_server::identity::read_identity(data_dir)
            .ok()
            .flatten()
            .map(|identity| identity.created_unix_ms);
        disk.wipe();
        for _ in 0..100 {
            if std::fs::remove_dir_all(data_dir).is_err()
                || tenure_server::identity::claim_data_dir(data_dir, node, CLUSTER_NAME).is_err()
            {
                return false;
            }
            let new = tenure_server::identity::read_identity(data_dir)
                .ok()
                .flatten()
                .map(|identity| identity.created_unix_ms);
            if new.is_some() && new != old {
                return true;
            }
            // Claimed within the same millisecond as the old directory: again, a moment later.
            std::thread::sleep(Duration::from_millis(1));
        }
        false
    }

    /// Hands `order` to the mover; false when it is busy (the step is skipped).
    fn order(&self, order: MoveOrder) -> bool {
        self.mover
            .orders
            .as_ref()
            .is_some_and(|orders| orders.try_send(order).is_ok())
    }

    /// A node that may leave (drained, crashed for good): one that is still in, when more than
    /// four would be left in (every group keeps three replicas and a move a spare node).
    fn pick_leaving(&mut self) -> Option<u64> {
        let inside: Vec<u64> = (1..=self.nodes).filter(|n| !self.out.contains(n)).collect();
        if inside.len() <= 4 {
            return None;
        }
        Some(inside[self.rng.random_range(0..inside.len())])
    }

    /// True when some ready leader of some group lists `node` among its voters or learners.
    fn hosts_replicas(node: u64, shared: &Shared) -> bool {
        let registry = lock(&shared.registry);
        registry.values().any(|handles| {
            handles.iter().filter_map(Weak::upgrade).any(|handle| {
                if !handle.is_ready_leader() {
                    return false;
                }
                let members = handle.members();
                members.voters.contains(&node) || members.learners.contains(&node)
            })
        })
    }

    fn apply(
        &mut self,
        now_ms: u64,
        kind: FaultKind,
        sim: &mut turmoil::Sim<'_>,
        shared: &Shared,
        probe: &mut Probe,
    ) -> Option<Active> {
        let names = self.node_names();
        let random_node = 1 + self.rng.random_range(0..self.nodes);
        let active = match kind {
            // Faults of node processes the fault suite applies; the simulation has none such.
            FaultKind::PauseNode | FaultKind::SlowDisk => return None,
            FaultKind::MoveReplica => {
                let (group, from, to) = self.pick_move(shared)?;
                if !self.order(MoveOrder::Replica { group, from, to }) {
                    return None;
                }
                self.record(
                    now_ms,
                    kind,
                    true,
                    format!("group {group} n{from} -> n{to}"),
                );
                Active::Move
            }
            FaultKind::DrainNode | FaultKind::RemoveNode => {
                let node = self.pick_leaving()?;
                let drain = tenure_core::ClusterOp::SetState {
                    node_id: node,
                    state: tenure_core::NodeState::Draining,
                };
                if !self.order(MoveOrder::Table {
                    kind,
                    ops: vec![drain],
                }) {
                    return None;
                }
                self.out.insert(node);
                self.record(now_ms, kind, true, format!("drain n{node}"));
                Active::Drain {
                    node,
                    remove: kind == FaultKind::RemoveNode,
                }
            }
            FaultKind::ReplaceNode => {
                // Not while a group still lacks a replica of an earlier loss (two of its three
                // replicas gone for good is beyond any fault model).
                let voters = final_voters(shared);
                let settled = voters.len() == self.groups as usize
                    && voters
                        .values()
                        .flatten()
                        .all(|node| !self.gone.contains(node));
                if !settled {
                    return None;
                }
                let node = self.pick_leaving()?;
                if !lock(&shared.registry).contains_key(&node) {
                    // Crashed by the other stream just now: not this time.
                    return None;
                }
                let lost = self.crash_host(node, sim, shared, probe);
                self.out.insert(node);
                self.gone.insert(node);
                // Half the time an operator's mistake follows: the node comes back at once with
                // a new, empty disk under its old id (its groups still count it as a voter). It
                // must exclude itself, never admitted: by the node table, or, in the cluster's
                // birth window before the table has its incarnation, by the founder pins
                // (`tenure_server::founders`; seed 960055 wiped one at 3 s, before they existed,
                // and openraft's leader saw the follower's log go back).
                let wipe = self.rng.random_bool(0.5);
                let recorded = Self::incarnation_recorded(node, shared);
                let known = recorded || self.incarnation_pinned(node);
                let wiped = wipe && self.wipe(node);
                if wiped {
                    if known && !recorded {
                        self.wipes_in_birth_window += 1;
                    }
                    if known {
                        lock(&shared.wiped).insert(node);
                    } else {
                        self.wipes_unpinned += 1;
                    }
                    sim.bounce(node_name(node));
                }
                self.record(
                    now_ms,
                    kind,
                    true,
                    format!(
                        "n{node} crashed for good, {lost} unsynced batches lost{}",
                        if wiped {
                            "; back at once with a wiped disk under its old id"
                        } else {
                            ""
                        }
                    ),
                );
                Active::Replace { node }
            }
            FaultKind::AddNode => {
                // Once, when the node table exists: announce the spare node (an operator's
                // `AddNode`) and start it, as a new machine joining the running cluster. The
                // controller then balances replicas and leaders onto it; from now on the other
                // nemeses pick it like any node.
                let (node, start) = self.spare.clone()?;
                if *start.borrow() || !Self::table_exists(shared) {
                    return None;
                }
                if !self.order(MoveOrder::Table {
                    kind,
                    ops: vec![Self::announce(node)],
                }) {
                    return None;
                }
                start.send_replace(true);
                self.nodes = self.nodes.max(node);
                self.added.push(node);
                self.record(now_ms, kind, true, format!("n{node} announced and started"));
                Active::Add { node }
            }
            FaultKind::Kill => {
                let node = random_node;
                if self.gone.contains(&node) {
                    return None;
                }
                let lost = self.crash_host(node, sim, shared, probe);
                self.record(
                    now_ms,
                    kind,
                    true,
                    format!("n{node}, {lost} unsynced batches lost"),
                );
                Active::Crash { node }
            }
            FaultKind::PartitionHalves | FaultKind::PartitionBridge => {
                let mut order = names.clone();
                shuffle(&mut self.rng, &mut order);
                let (left, right, detail) = if kind == FaultKind::PartitionBridge {
                    let bridge = order[0].clone();
                    let rest = &order[1..];
                    let half = rest.len() / 2;
                    (
                        rest[..half].to_vec(),
                        rest[half..].to_vec(),
                        format!("bridge {bridge}"),
                    )
                } else {
                    let half = order.len() / 2;
                    (
                        order[..half].to_vec(),
                        order[half..].to_vec(),
                        String::new(),
                    )
                };
                let pairs = Self::pairs_between(&left, &right);
                for (a, b) in &pairs {
                    sim.partition(a.as_str(), b.as_str());
                }
                self.record(now_ms, kind, true, format!("{left:?} | {right:?} {detail}"));
                Active::Cut { pairs }
            }
            FaultKind::PartitionLeader => {
                let node = self.leader_of_some_group(shared)?;
                let pairs = self.links_of(node);
                for (a, b) in &pairs {
                    sim.partition(a.as_str(), b.as_str());
                }
                self.record(now_ms, kind, true, format!("leader n{node}"));
                Active::Cut { pairs }
            }
            FaultKind::PartitionOneWay => {
                let node = self.leader_of_some_group(shared).unwrap_or(random_node);
                let pairs = self.links_of(node);
                for (from, to) in &pairs {
                    sim.partition_oneway(from.as_str(), to.as_str());
                }
                self.record(now_ms, kind, true, format!("n{node} -> others dropped"));
                Active::CutOneWay { pairs }
            }
            FaultKind::HoldMessages => {
                let pairs = self.links_of(random_node);
                for (a, b) in &pairs {
                    sim.hold(a.as_str(), b.as_str());
                }
                self.record(now_ms, kind, true, format!("n{random_node}'s links held"));
                Active::Hold { pairs }
            }
            FaultKind::LoseMessages => {
                let pairs = self.links_of(random_node);
                let rate = self.rng.random_range(0.05..0.4);
                for (a, b) in &pairs {
                    sim.set_link_fail_rate(a.as_str(), b.as_str(), rate);
                }
                self.record(
                    now_ms,
                    kind,
                    true,
                    format!("n{random_node}'s links lose {:.0}%", rate * 100.0),
                );
                Active::Loss { pairs }
            }
            FaultKind::ClockRate => {
                let node = random_node;
                if !lock(&shared.registry).contains_key(&node) {
                    return None;
                }
                let ppm = self.rng.random_range(-5_000..=5_000);
                // Applied on the node's host (its clock reads that host's time), next step.
                if let Some(rate) = self.clock_rates.get(&node) {
                    rate.send_replace(ppm);
                }
                self.record(now_ms, kind, true, format!("n{node} at {ppm} ppm"));
                Active::Drift { node }
            }
            FaultKind::ClockJump => {
                let node = random_node;
                let minutes: i64 = self.rng.random_range(1..=10);
                let jump_ms = if self.rng.random_bool(0.5) {
                    minutes
                } else {
                    -minutes
                } * 60_000;
                if let Some(clock) = self.wall_clocks.get(&node) {
                    clock.offset_ms.fetch_add(jump_ms, Ordering::Relaxed);
                }
                self.record(
                    now_ms,
                    kind,
                    true,
                    format!("n{node}'s wall clock {jump_ms:+} ms"),
                );
                Active::WallJump { node }
            }
            FaultKind::PauseClient => {
                let client = 1 + self.rng.random_range(0..self.clients);
                let me = vec![client_name(client)];
                let pairs = Self::pairs_between(&me, &names);
                for (a, b) in &pairs {
                    sim.hold(a.as_str(), b.as_str());
                }
                self.record(now_ms, kind, true, format!("c{client}'s links held"));
                Active::HoldClient { pairs }
            }
        };
        Some(active)
    }

    fn heal(
        &mut self,
        now_ms: u64,
        kind: FaultKind,
        active: Active,
        sim: &mut turmoil::Sim<'_>,
        shared: &Shared,
        probe: &mut Probe,
    ) -> Option<Active> {
        let detail = match active {
            Active::Crash { node } => {
                sim.bounce(node_name(node));
                format!("n{node} restarted")
            }
            Active::Cut { pairs } => {
                for (a, b) in &pairs {
                    sim.repair(a.as_str(), b.as_str());
                }
                String::new()
            }
            Active::CutOneWay { pairs } => {
                for (from, to) in &pairs {
                    sim.repair_oneway(from.as_str(), to.as_str());
                }
                String::new()
            }
            Active::Hold { pairs } | Active::HoldClient { pairs } => {
                for (a, b) in &pairs {
                    sim.release(a.as_str(), b.as_str());
                }
                String::new()
            }
            Active::Loss { pairs } => {
                for (a, b) in &pairs {
                    sim.set_link_fail_rate(a.as_str(), b.as_str(), 0.0);
                }
                String::new()
            }
            Active::Drift { node } => {
                let base = self.base_rate_ppm.get(&node).copied().unwrap_or(0);
                if let Some(rate) = self.clock_rates.get(&node) {
                    rate.send_replace(base);
                }
                format!("n{node} back at {base} ppm")
            }
            Active::WallJump { node } => {
                // Wall clocks are not set back after a jump (NTP would step them again).
                format!("n{node}'s wall clock left as it is")
            }
            Active::Move => String::new(),
            Active::Add { node } => {
                // An announcement the mover could not make (no metadata leader for its whole
                // retry) is made again: a node that is never announced never serves.
                if !Self::incarnation_recorded(node, shared)
                    && !self.order(MoveOrder::Table {
                        kind,
                        ops: vec![Self::announce(node)],
                    })
                {
                    return Some(Active::Add { node });
                }
                format!("n{node} joined")
            }
            Active::Drain { node, remove } => {
                // A node crashed by the other stream just now is undrained, not removed (its
                // restart must not bring back a removed node); so is one when some group has
                // no ready leader to say whether it still holds a replica there.
                let every_group_led = final_voters(shared).len() == self.groups as usize;
                let empty = remove
                    && every_group_led
                    && lock(&shared.registry).contains_key(&node)
                    && !Self::hosts_replicas(node, shared);
                let ops = if empty {
                    vec![tenure_core::ClusterOp::Remove { node_id: node }]
                } else {
                    vec![tenure_core::ClusterOp::SetState {
                        node_id: node,
                        state: tenure_core::NodeState::Active,
                    }]
                };
                let sent = self.order(MoveOrder::Table { kind, ops });
                if !sent {
                    return Some(Active::Drain { node, remove });
                }
                if empty {
                    // Removed: its process stops for good, as an operator's would.
                    Self::stop_host(node, sim, shared, probe);
                    self.gone.insert(node);
                    format!("n{node} empty: remove it and stop it")
                } else {
                    self.out.remove(&node);
                    format!("undrain n{node}")
                }
            }
            Active::Replace { node } => {
                let ops = vec![
                    tenure_core::ClusterOp::SetState {
                        node_id: node,
                        state: tenure_core::NodeState::Draining,
                    },
                    tenure_core::ClusterOp::Remove { node_id: node },
                ];
                if !self.order(MoveOrder::Table { kind, ops }) {
                    return Some(Active::Replace { node });
                }
                format!("drain and remove n{node}")
            }
        };
        self.record(now_ms, kind, false, detail);
        None
    }

    /// Heals everything still in effect.
    fn heal_all(
        &mut self,
        now_ms: u64,
        sim: &mut turmoil::Sim<'_>,
        shared: &Shared,
        probe: &mut Probe,
    ) {
        for index in 0..self.streams.len() {
            if let Some((_, kind, active)) = self.streams[index].active.take() {
                if let Some(unhealed) = self.heal(now_ms, kind, active, sim, shared, probe) {
                    // The mover's queue is full at the very end (64 orders): recorded, not
                    // retried.
                    self.record(now_ms, kind, false, format!("not healed: {unhealed:?}"));
                }
            }
            self.streams[index].next_at_ms = u64::MAX;
        }
    }
}

fn shuffle<T>(rng: &mut SmallRng, items: &mut [T]) {
    for i in (1..items.len()).rev() {
        let j = rng.random_range(0..=i);
        items.swap(i, j);
    }
}

/// The nemesis profile a seed draws: one kind alone, or every kind combined.
pub fn profile_for(seed: u64, nodes: u64) -> Vec<FaultKind> {
    let kinds: Vec<FaultKind> = FaultKind::SIMULATION
        .into_iter()
        .filter(|kind| nodes >= 3 || *kind != FaultKind::PartitionBridge)
        // A move needs a node without a replica (3 replicas per group).
        .filter(|kind| nodes > 3 || !kind.is_membership())
        .collect();
    // 5-node runs are the seeds 3 mod 4 (`SimOptions::for_seed`): they count their profiles in
    // steps of 4, so that consecutive 5-node seeds cover every slot too.
    let index = if nodes > 3 { seed / 4 } else { seed };
    let slot = usize::try_from(index % (kinds.len() as u64 + 1)).unwrap_or(0);
    if slot == kinds.len() {
        kinds
    } else {
        vec![kinds[slot]]
    }
}

/// Runs one simulation to the end and checks it.
///
/// The steps, in the order they draw from the seed's generator (changing the order changes
/// every seed's run): the simulation itself ([`build_simulation`]), the node hosts
/// ([`add_nodes`]), the client hosts ([`add_clients`]), the nemesis ([`Nemesis::new`]); then
/// the run ([`drive`]) and its judgement ([`judge`]).
pub fn run(options: &SimOptions) -> Result<SimReport, SimError> {
    check_options(options)?;
    install_panic_hook();
    let panics_before = lock(&PANICS).len();
    let kinds = options
        .nemeses
        .clone()
        .unwrap_or_else(|| profile_for(options.seed, options.nodes));
    // `add-node` starts a spare node, the one after the founders.
    let spare = kinds
        .contains(&FaultKind::AddNode)
        .then_some(options.nodes + 1);
    let (certs, ca_pem) = certificates(
        &options.work_dir,
        options.nodes + u64::from(spare.is_some()),
    )?;
    let scratch = tempfile::Builder::new()
        .prefix(&format!("tenure-sim-{}-", options.seed))
        .tempdir_in(&options.work_dir)
        .map_err(io("creating the run directory"))?;
    let profile = if kinds.len() == 1 {
        format!("alone {}", kinds[0].name())
    } else {
        format!(
            "combined {}",
            kinds.iter().map(|k| k.name()).collect::<Vec<_>>().join(",")
        )
    };

    let mut rng = SmallRng::seed_from_u64(options.seed);
    let mut sim = build_simulation(options, spare, &mut rng)?;
    let shared = Arc::new(Shared::default());
    let nodes = add_nodes(
        &mut sim,
        options,
        &mut rng,
        (scratch.path(), &certs),
        &shared,
        spare,
    );
    let (stop_tx, stop_rx) = watch::channel(None::<Nanos>);
    let mut mover = Mover::default();
    let mover_orders = if kinds.iter().any(|k| k.is_membership()) {
        let (orders, received) = tokio::sync::mpsc::channel(64);
        mover.orders = Some(orders);
        Some(received)
    } else {
        None
    };
    let clients = add_clients(
        &mut sim,
        options,
        &mut rng,
        &ca_pem,
        stop_rx,
        (mover_orders, mover.outcomes.clone()),
    );
    let mut nemesis = Nemesis::new(options, &kinds, &mut rng, nodes, mover);
    let mut probe = Probe::default();
    let driven = drive(
        &mut sim,
        options,
        &mut nemesis,
        &mut probe,
        &shared,
        &clients.ops,
        &stop_tx,
    );
    let simulated_ms = u64::try_from(sim.elapsed().as_millis()).unwrap_or(u64::MAX);
    let final_voters = final_voters(&shared);
    for event in &nemesis.events {
        probe.trace(
            event.at_ns,
            &format!("{} {} {}", event.nemesis, event.start, event.detail),
        );
    }
    drop(sim);
    tenure_storage::seed_raft_randomness(None);
    if let Some(path) = std::env::var_os("TENURE_SIM_TRACE_FILE") {
        let _ = std::fs::write(path, probe.trace_lines().join("\n"));
    }
    let ran = Ran {
        profile,
        final_voters,
        simulated_ms,
        steps: driven.steps,
        harness_failure: driven.harness_failure,
        panics_before,
    };
    Ok(judge(options, ran, &nemesis, &probe, &shared, &clients))
}

fn check_options(options: &SimOptions) -> Result<(), SimError> {
    if !(3..=9).contains(&options.nodes) || options.client_hosts == 0 || options.resources == 0 {
        return Err(SimError::Options(
            "3 to 9 nodes, at least one client host and one resource".into(),
        ));
    }
    if let Some(kind) = options
        .nemeses
        .iter()
        .flatten()
        .find(|kind| !kind.in_simulation())
    {
        return Err(SimError::Options(format!(
            "{} is a fault of node processes, which the simulation cannot apply",
            kind.name()
        )));
    }
    if !cfg!(tokio_unstable) {
        // Without it turmoil cannot seed the hosts' runtimes and every tokio::select! picks
        // its first branch at random: runs of one seed would differ. Cargo drops the cfg of
        // .cargo/config.toml when RUSTFLAGS is set in the environment.
        return Err(SimError::Options(
            "built without --cfg tokio_unstable (set by .cargo/config.toml; an environment \
             RUSTFLAGS replaces it): the simulation would not be reproducible"
                .into(),
        ));
    }
    Ok(())
}

/// The turmoil simulation (its seed from `rng`), with openraft's randomness on this thread
/// seeded from `rng` too, and the node names resolving to their fixed addresses.
fn build_simulation(
    options: &SimOptions,
    spare: Option<u64>,
    rng: &mut SmallRng,
) -> Result<turmoil::Sim<'static>, SimError> {
    // openraft's random numbers (election timeouts) on this thread: from the seed.
    tenure_storage::seed_raft_randomness(Some(rng.random()));
    let sim = turmoil::Builder::new()
        .rng_seed(rng.random())
        .tick_duration(TICK)
        .simulation_duration(Duration::from_secs(24 * 3600))
        .epoch(std::time::UNIX_EPOCH + Duration::from_secs(1_800_000_000))
        .min_message_latency(Duration::from_millis(1))
        .max_message_latency(Duration::from_millis(15))
        .udp_capacity(4_096)
        .build();
    // Names first: n1 = 192.168.0.1, ... (the spare node after the founders).
    for id in (1..=options.nodes).chain(spare) {
        let ip = sim.lookup(node_name(id));
        if ip != node_ip(id) {
            return Err(SimError::Options(format!(
                "turmoil gave node {id} the address {ip}, not {}",
                node_ip(id)
            )));
        }
    }
    Ok(sim)
}

/// What the nemesis controls of each node host.
struct NodeHandles {
    disks: BTreeMap<u64, MemoryDisk>,
    data_dirs: BTreeMap<u64, PathBuf>,
    wall_clocks: BTreeMap<u64, Arc<SimWallClock>>,
    clock_rates: BTreeMap<u64, Arc<watch::Sender<i64>>>,
    base_rate_ppm: BTreeMap<u64, i64>,
    /// The spare node and the switch that starts its node (`add-node`).
    spare: Option<(u64, Arc<watch::Sender<bool>>)>,
}

/// One host per node, running the real server on a memory disk; each restart of a host is a
/// new incarnation with its own seed. With `spare`, one more host whose node starts only when
/// `add-node` announces it (`NodeHandles::spare`).
fn add_nodes(
    sim: &mut turmoil::Sim<'static>,
    options: &SimOptions,
    rng: &mut SmallRng,
    (scratch, certs): (&Path, &Path),
    shared: &Arc<Shared>,
    spare: Option<u64>,
) -> NodeHandles {
    let mut handles = NodeHandles {
        disks: BTreeMap::new(),
        data_dirs: BTreeMap::new(),
        wall_clocks: BTreeMap::new(),
        clock_rates: BTreeMap::new(),
        base_rate_ppm: BTreeMap::new(),
        spare: None,
    };
    for id in (1..=options.nodes).chain(spare) {
        let disk = MemoryDisk::new(rng.random(), rng.random_range(100..=2_000));
        handles.disks.insert(id, disk.clone());
        let rate_ppm = match options.out_of_bound_drift_ppm {
            Some(ppm) => ppm,
            None => rng.random_range(-5_000..=5_000),
        };
        handles.base_rate_ppm.insert(id, rate_ppm);
        let data_dir = scratch.join(node_name(id));
        handles.data_dirs.insert(id, data_dir.clone());
        let mut config = node_config(options, id, id.max(options.nodes), data_dir.clone(), certs);
        config.testing.clock_rate_ppm = rate_ppm;
        // The spare node joins the running cluster once `add-node` announces and starts it.
        let start = (Some(id) == spare).then(|| Arc::new(watch::Sender::new(false)));
        if let Some(start) = &start {
            config.cluster.join_existing = true;
            handles.spare = Some((id, start.clone()));
        }
        let node_seed: u64 = rng.random();
        let wall_clock = Arc::new(SimWallClock::default());
        handles.wall_clocks.insert(id, wall_clock.clone());
        let clock_rate = Arc::new(watch::Sender::new(rate_ppm));
        handles.clock_rates.insert(id, clock_rate.clone());
        let shared = shared.clone();
        sim.host(node_name(id), move || {
            let disk = disk.clone();
            let config = config.clone();
            let shared = shared.clone();
            let data_dir = data_dir.clone();
            let wall_clock = wall_clock.clone();
            let clock_rate = clock_rate.clone();
            let start = start.clone();
            async move {
                if let Some(start) = start {
                    // A machine with no tenure running yet: until `add-node` starts it.
                    let _ = start.subscribe().wait_for(|started| *started).await;
                }
                let incarnation = {
                    let mut incarnations = lock(&shared.incarnations);
                    let entry = incarnations.entry(id).or_default();
                    *entry += 1;
                    *entry
                };
                let seed = node_seed ^ incarnation.wrapping_mul(0x9e37_79b9_7f4a_7c15);
                let result = start_node(config, data_dir, disk, seed, node_seed, wall_clock).await;
                let node = match result {
                    Ok(node) => node,
                    Err(error) => {
                        lock(&shared.host_errors).push(format!("n{id}: {error}"));
                        return Err(error);
                    }
                };
                lock(&shared.registry)
                    .insert(id, node.groups().iter().map(Arc::downgrade).collect());
                let mut excluded = node.excluded();
                let exclusions = shared.clone();
                tokio::spawn(async move {
                    let reason = match excluded.wait_for(Option::is_some).await {
                        Ok(reason) => reason.clone().unwrap_or_default(),
                        Err(_) => return,
                    };
                    lock(&exclusions.exclusions).insert(id, reason);
                });
                if let Some(controls) = node.fault_controls() {
                    tokio::spawn(follow_clock_rate(controls, clock_rate.subscribe()));
                }
                // Replicas come and go with membership changes: the probe follows them.
                let mut hosted: Vec<u32> = node.groups().iter().map(|g| g.group_id()).collect();
                loop {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    if node.replicas_ever_admitted() && lock(&shared.wiped).contains(&id) {
                        lock(&shared.admitted_after_wipe).insert(id);
                    }
                    let groups = node.groups();
                    let now: Vec<u32> = groups.iter().map(|g| g.group_id()).collect();
                    if now != hosted {
                        hosted = now;
                        lock(&shared.registry)
                            .insert(id, groups.iter().map(Arc::downgrade).collect());
                    }
                }
            }
        });
    }
    handles
}

/// Carries out the nemesis's replica moves, one at a time, as an operator would (through the
/// client library, which repeats the request while the move runs), and reports each outcome.
async fn run_mover(
    client: Client,
    mut orders: tokio::sync::mpsc::Receiver<MoveOrder>,
    outcomes: MoveOutcomes,
) {
    while let Some(order) = orders.recv().await {
        match order {
            MoveOrder::Replica { group, from, to } => {
                let outcome = match client
                    .move_replica(group, from, to, Duration::from_secs(20))
                    .await
                {
                    Ok(members) => (
                        FaultKind::MoveReplica,
                        true,
                        format!(
                            "group {group} n{from} -> n{to}: voters {:?}",
                            members.voters
                        ),
                    ),
                    Err(error) => (
                        FaultKind::MoveReplica,
                        false,
                        format!("group {group} n{from} -> n{to}: {error}"),
                    ),
                };
                lock(&outcomes).push(outcome);
            }
            MoveOrder::Table { kind, ops } => {
                for op in ops {
                    let text = format!("{op:?}");
                    let outcome = match client.cluster_change(op).await {
                        Ok(change) => (kind, true, format!("{text}: version {}", change.version)),
                        Err(error) => (kind, false, format!("{text}: {error}")),
                    };
                    lock(&outcomes).push(outcome);
                }
            }
        }
    }
}

/// What the client hosts record.
struct Clients {
    ops: Arc<Mutex<BTreeMap<u64, OpRecord>>>,
    watch: Arc<Mutex<Vec<WatchRecord>>>,
    fence: SharedFence,
    task_names: Vec<String>,
}

/// One host per client, running the fault suite's workload tasks on the real client library,
/// recording into memory, writing to an in-process fenced store; they stop when `stop` says.
fn add_clients(
    sim: &mut turmoil::Sim<'static>,
    options: &SimOptions,
    rng: &mut SmallRng,
    ca_pem: &str,
    stop: watch::Receiver<Option<Nanos>>,
    (mut mover_orders, move_outcomes): (
        Option<tokio::sync::mpsc::Receiver<MoveOrder>>,
        MoveOutcomes,
    ),
) -> Clients {
    let ops: Arc<Mutex<BTreeMap<u64, OpRecord>>> = Arc::default();
    let watch_records: Arc<Mutex<Vec<WatchRecord>>> = Arc::default();
    let fence = SharedFence::default();
    let endpoints: Vec<Endpoint> = (1..=options.nodes)
        .map(|id| Endpoint {
            node_id: Some(id),
            addr: SocketAddr::new(node_ip(id), NODE_PORT),
        })
        .collect();
    let resources: Vec<String> = (0..options.resources).map(|r| format!("r{r}")).collect();
    let mut task_names = Vec::new();
    for client in 1..=options.client_hosts {
        let mut config = ClientConfig::new(
            endpoints.clone(),
            ca_pem.to_owned(),
            Credentials::InsecureDev {
                principal_id: format!("sim-c{client}"),
            },
        );
        config.call_timeout = Duration::from_millis(2_500);
        config.attempt_timeout = Duration::from_millis(800);
        config.seed = Some(rng.random());
        config.client_id = Some(rng.random());
        let endpoint_seed: u64 = rng.random();
        let task_seed: u64 = rng.random();
        for task in 1..=options.tasks_per_client {
            task_names.push(format!("c{client}t{task}"));
        }
        let sink = Sink::Memory {
            ops: ops.clone(),
            watch: watch_records.clone(),
        };
        let fence = fence.clone();
        let stop = stop.clone();
        let resources = resources.clone();
        let tasks = options.tasks_per_client;
        let ttl_ms = options.ttl_ms;
        let seed = options.seed;
        let orders = if client == 1 {
            mover_orders.take()
        } else {
            None
        };
        let move_outcomes = move_outcomes.clone();
        sim.client(client_name(client), async move {
            let client_lib = connect(config, endpoint_seed).await?;
            if let Some(orders) = orders {
                tokio::spawn(run_mover(client_lib.clone(), orders, move_outcomes));
            }
            let mut groups = HashMap::new();
            for resource in &resources {
                let key = ResourceKey::new(TENANT.to_string(), resource.clone());
                let group = client_lib.group_of(&key).await?;
                groups.insert(resource.clone(), group);
            }
            let set = TaskSet {
                client: client_lib.clone(),
                clock: WorkClock::Simulated {
                    tick_ns: u64::try_from(TICK.as_nanos()).unwrap_or(1_000_000),
                },
                sink,
                stop,
                workload: Arc::new(Workload {
                    tenant: TENANT.to_string(),
                    resources,
                    groups: Arc::new(groups),
                    ttl_ms,
                }),
                next_id: Arc::new(AtomicU64::new(1)),
                rejected: Arc::new(AtomicU64::new(0)),
            };
            // One watcher per client host, reading from any replica on even hosts.
            let mut handles = vec![tokio::spawn(run_watcher(
                set.clone(),
                format!("c{client}w"),
                task_seed ^ 0x7761_7463_6800_0000,
                client % 2 == 0,
            ))];
            for task in 1..=tasks {
                let name = format!("c{client}t{task}");
                let spec = TaskSpec {
                    holder: format!("s{seed}-{name}"),
                    name,
                    seed: task_seed ^ (u64::from(task) << 32),
                    id_base: u64::from(client) << 40,
                };
                handles.push(tokio::spawn(
                    set.task(spec, Fence::Local(fence.clone())).run(),
                ));
            }
            for handle in handles {
                let _ = handle.await;
            }
            client_lib.close().await;
            Ok(())
        });
    }
    Clients {
        ops,
        watch: watch_records,
        fence,
        task_names,
    }
}

impl Nemesis {
    /// The nemesis of a run: `kinds` on three streams (network, node, membership), its own
    /// generator seeded from `rng`.
    fn new(
        options: &SimOptions,
        kinds: &[FaultKind],
        rng: &mut SmallRng,
        nodes: NodeHandles,
        mover: Mover,
    ) -> Self {
        Nemesis {
            rng: SmallRng::seed_from_u64(rng.random()),
            streams: {
                let network: Vec<FaultKind> =
                    kinds.iter().copied().filter(|k| k.is_network()).collect();
                let node: Vec<FaultKind> = kinds
                    .iter()
                    .copied()
                    .filter(|k| !k.is_network() && !k.is_membership())
                    .collect();
                let membership: Vec<FaultKind> = kinds
                    .iter()
                    .copied()
                    .filter(|k| k.is_membership())
                    .collect();
                [network, node, membership]
                    .into_iter()
                    .filter(|kinds| !kinds.is_empty())
                    .map(|kinds| Stream {
                        kinds,
                        next_at_ms: options.warmup_ms,
                        active: None,
                    })
                    .collect()
            },
            nodes: options.nodes,
            clients: options.client_hosts,
            ttl_ms: options.ttl_ms,
            base_rate_ppm: nodes.base_rate_ppm,
            counts: BTreeMap::new(),
            events: Vec::new(),
            disks: nodes.disks,
            data_dirs: nodes.data_dirs,
            wall_clocks: nodes.wall_clocks,
            clock_rates: nodes.clock_rates,
            lost_batches: 0,
            mover,
            moves_done: 0,
            moves_failed: 0,
            out: std::collections::BTreeSet::new(),
            gone: std::collections::BTreeSet::new(),
            wipes_in_birth_window: 0,
            wipes_unpinned: 0,
            spare: nodes.spare,
            added: Vec::new(),
            groups: options.groups,
        }
    }
}

/// How a run went, as [`drive`] saw it.
struct Driven {
    steps: u64,
    /// Why the run could not be driven to its end, if it could not.
    harness_failure: Option<String>,
}

/// Steps the simulation: faults until the heal, then the stop signal after the liveness bound,
/// then until every client finished (or a bound passed); the probe checks after every step.
fn drive(
    sim: &mut turmoil::Sim<'static>,
    options: &SimOptions,
    nemesis: &mut Nemesis,
    probe: &mut Probe,
    shared: &Shared,
    ops: &Mutex<BTreeMap<u64, OpRecord>>,
    stop: &watch::Sender<Option<Nanos>>,
) -> Driven {
    let heal_at_ms = options.warmup_ms + options.fault_ms;
    let stop_at_ms = heal_at_ms + options.liveness_bound_ms;
    let give_up_ms = stop_at_ms + options.resolve_ms + 30_000;
    let mut healed = false;
    let mut stopped = false;
    let mut step: u64 = 0;
    let mut harness_failure: Option<String> = None;
    loop {
        let now_ms = u64::try_from(sim.elapsed().as_millis()).unwrap_or(u64::MAX);
        if now_ms < heal_at_ms {
            nemesis.tick(now_ms, sim, shared, probe);
        } else if !healed {
            nemesis.heal_all(now_ms, sim, shared, probe);
            healed = true;
        }
        if now_ms >= stop_at_ms && !stopped {
            let deadline = (now_ms + options.resolve_ms).saturating_mul(1_000_000);
            let _ = stop.send(Some(deadline));
            stopped = true;
        }
        let finished = match sim.step() {
            Ok(finished) => finished,
            Err(error) => {
                harness_failure = Some(format!("step {step}: {error}"));
                break;
            }
        };
        step += 1;
        probe.check(step, &lock(&shared.registry));
        if lock(ops).len() > OPS_MAX {
            harness_failure = Some(format!("more than {OPS_MAX} operations recorded"));
            break;
        }
        if finished {
            break;
        }
        if now_ms >= give_up_ms {
            harness_failure = Some(format!(
                "the clients did not finish {} ms after the stop signal",
                now_ms.saturating_sub(stop_at_ms)
            ));
            break;
        }
    }
    Driven {
        steps: step,
        harness_failure,
    }
}

/// What [`judge`] needs to know of the run besides its records.
struct Ran {
    profile: String,
    final_voters: BTreeMap<u32, Vec<u64>>,
    simulated_ms: u64,
    steps: u64,
    harness_failure: Option<String>,
    /// Panics recorded before this run started (the hook is process-wide).
    panics_before: usize,
}

/// Each group's voters as its ready leader sees them now.
fn final_voters(shared: &Shared) -> BTreeMap<u32, Vec<u64>> {
    let registry = lock(&shared.registry);
    let mut voters = BTreeMap::new();
    for handles in registry.values() {
        for handle in handles.iter().filter_map(Weak::upgrade) {
            if handle.is_ready_leader() {
                voters.insert(handle.group_id(), handle.members().voters);
            }
        }
    }
    voters
}

/// The run's verdict: the probe's violations, this thread's panics, a harness failure, and the
/// fault suite's checker (safety and liveness) over the recorded history; the trace hash.
fn judge(
    options: &SimOptions,
    ran: Ran,
    nemesis: &Nemesis,
    probe: &Probe,
    shared: &Shared,
    clients: &Clients,
) -> SimReport {
    let mut violations: Vec<Violation> = probe.violations().to_vec();
    let this_thread = std::thread::current().id();
    let panics: Vec<String> = lock(&PANICS)
        .iter()
        .skip(ran.panics_before)
        .filter(|(thread, _)| *thread == this_thread)
        .map(|(_, message)| message.clone())
        .collect();
    for panic in panics {
        violations.push(Violation {
            property: Property::NodeCrash,
            resource: None,
            message: format!("a task panicked: {panic}"),
            ops: Vec::new(),
            writes: Vec::new(),
        });
    }
    if let Some(failure) = ran.harness_failure {
        let errors = lock(&shared.host_errors).join("; ");
        violations.push(Violation {
            property: Property::Liveness,
            resource: None,
            message: format!("the simulation failed: {failure} {errors}"),
            ops: Vec::new(),
            writes: Vec::new(),
        });
    }

    for &node in lock(&shared.admitted_after_wipe).iter() {
        violations.push(Violation {
            property: Property::Amnesia,
            resource: None,
            message: format!(
                "node {node} came back with a wiped disk under its old id and its replicas were \
                 admitted (they could vote again in terms they voted in, and forget \
                 acknowledged entries)"
            ),
            ops: Vec::new(),
            writes: Vec::new(),
        });
    }

    let history = History {
        ops: lock(&clients.ops).values().cloned().collect(),
        writes: clients.fence.records(),
        faults: nemesis.events.clone(),
        watch: lock(&clients.watch).clone(),
        lock_beats: Vec::new(),
    };
    let mut trace = Xxh3::new();
    trace.update(&probe.trace_hash().to_le_bytes());
    if let Ok(bytes) = serde_json::to_vec(&history.ops) {
        trace.update(&bytes);
    }
    if let Ok(bytes) = serde_json::to_vec(&history.watch) {
        trace.update(&bytes);
    }
    let heal_at_ms = options.warmup_ms + options.fault_ms;
    let check = checker::check(&history, &CheckConfig::default());
    violations.extend(check.violations.iter().cloned());
    violations.extend(checker::check_liveness(
        &history,
        &clients.task_names,
        heal_at_ms.saturating_mul(1_000_000),
        options.liveness_bound_ms.saturating_mul(1_000_000),
    ));
    let mut violated: Vec<String> = violations
        .iter()
        .map(|v| v.property.name().to_string())
        .collect();
    violated.sort();
    violated.dedup();
    SimReport {
        seed: options.seed,
        nodes: options.nodes,
        profile: ran.profile,
        faults: nemesis.counts.clone(),
        simulated_ms: ran.simulated_ms,
        steps: ran.steps,
        ops_checked: check.ops_checked,
        hand_offs_judged: check.hand_offs_judged,
        watch_events_judged: check.watch_events_judged,
        elections: probe.elections(),
        states_compared: probe.compared_states,
        late_writes: check.late_writes,
        late_writes_rejected: check.late_writes_rejected,
        lost_unsynced_batches: nemesis.lost_batches,
        moves_done: nemesis.moves_done,
        moves_failed: nemesis.moves_failed,
        nodes_gone: nemesis.gone.iter().copied().collect(),
        nodes_added: nemesis.added.clone(),
        nodes_wiped: lock(&shared.wiped).iter().copied().collect(),
        wipes_in_birth_window: nemesis.wipes_in_birth_window,
        wipes_unpinned: nemesis.wipes_unpinned,
        nodes_excluded: lock(&shared.exclusions).keys().copied().collect(),
        voters_on_gone_nodes: ran
            .final_voters
            .values()
            .flatten()
            .filter(|node| nemesis.gone.contains(node))
            .count() as u64,
        final_voters: ran.final_voters,
        trace_hash: trace.digest(),
        violations: violations.iter().map(|v| v.describe(0)).collect(),
        violated,
        inconclusive: check.inconclusive.clone(),
    }
}

async fn follow_clock_rate(controls: Arc<FaultControls>, mut rates: watch::Receiver<i64>) {
    while rates.changed().await.is_ok() {
        let ppm = *rates.borrow_and_update();
        let _ = controls.apply(&FaultSettings {
            clock_rate_ppm: Some(ppm),
            ..FaultSettings::default()
        });
    }
}

async fn start_node(
    config: ServerConfig,
    data_dir: PathBuf,
    disk: MemoryDisk,
    seed: u64,
    reset_key_seed: u64,
    wall_clock: Arc<SimWallClock>,
) -> Result<Node, Box<dyn std::error::Error>> {
    // Beside the node's data directory (which must hold only what the node puts there).
    let storage = NodeStorage::open_in_memory(
        &data_dir.with_extension("storage"),
        disk,
        StorageOptions {
            fsync: true,
            ..StorageOptions::default()
        },
    )?;
    // The reset key stays across incarnations, as a real node's (derived from its key) does.
    let endpoint = net::endpoint(
        seed,
        net::reset_key(reset_key_seed),
        SocketAddr::from(([0, 0, 0, 0], NODE_PORT)),
    )
    .await?;
    let env = NodeEnv {
        endpoint: Some(endpoint),
        storage: Some(storage),
        seed: Some(seed),
        serve_http: false,
        lane_linger_us: Some(0),
        wall_clock: Some(wall_clock),
    };
    Ok(Node::start_with(config, env).await?)
}

/// Connects (a failed attempt closes its endpoint: each gets a fresh one).
async fn connect(
    config: ClientConfig,
    endpoint_seed: u64,
) -> Result<Client, Box<dyn std::error::Error>> {
    let mut last = String::new();
    for attempt in 0..100u64 {
        let seed = endpoint_seed.wrapping_add(attempt);
        let endpoint = net::endpoint(
            seed,
            net::reset_key(seed),
            SocketAddr::from(([0, 0, 0, 0], 0)),
        )
        .await?;
        match tenure_client::Client::connect_on_endpoint(config.clone(), endpoint).await {
            Ok(client) => return Ok(client),
            Err(error) => last = error.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    Err(format!("cannot connect: {last}").into())
}
