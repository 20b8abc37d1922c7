//! One fault run, from an empty directory to a verdict.
//!
//! 1. The network (namespaces or loopback), the cluster (3 or 5 node processes), a client of its
//!    own for status and final reads; every group must have a leader before anything starts.
//! 2. The fenced store, then the client processes ([`super::workload`]).
//! 3. The nemesis: the seeded [`super::schedule::plan`], executed in real time; every fault and
//!    heal is logged in the history. Meanwhile a monitor polls every node's status (two leaders
//!    of one group in one term is a violation) and notices nodes that died on their own.
//! 4. Heal everything. Liveness: every group has a leader within the bound; the clients run on
//!    for a while, and each must complete an operation within the bound.
//! 5. Stop the clients (their unanswered operations are retried with the same request ids until
//!    definite, or left indeterminate), read every resource once more, and check the history.
//!
//! Every wait is bounded; the run stops by itself. A failing run keeps its directory (node logs,
//! `history.json`, `report.json`) and its seed replays the same schedule.
//!
//! Must not depend on: the command line (the `nemesis` binary and the tests build a
//! [`RunConfig`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{BufRead as _, BufReader, Write as _};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng as _, SeedableRng as _};
use serde::{Deserialize, Serialize};
use tenure_client::{Client, NodeStatus, ResourceKey};
use tenure_core::{ClusterOp, NegativeControl, NodeAddresses, NodeState as TableState};
use tenure_server::fault_control::FaultSettings;

use super::HarnessError;
use super::cluster::{Cluster, ClusterOptions, NodeState};
use super::locker::read_lock_beats;
use super::network::{Network, NetworkRequest};
use super::schedule::{Fault, FaultKind, NodeTarget, PlanShape, Step, plan};
use super::workload::{WorkerLine, read_outcome};
use crate::checker::{self, CheckConfig, CheckReport, Property, Violation};
use crate::fencing::StoreServer;
use crate::history::{
    FaultEvent, History, Nanos, OpKind, OpRecord, Outcome, WatchRecord, mono_now_ns,
};

/// The tenant every run's resources belong to.
pub const TENANT: &str = "fault";
/// Node ids a run keeps for the nemeses that start nodes.
const SPARE_NODES: u64 = 4;
/// Operations one run records at most (beyond it the run fails rather than check a history with
/// holes).
const RECORDED_OPS_MAX: usize = 2_000_000;
/// The lock every client process's `tenurectl lock` takes (outside the workload's keyspace).
const LOCK_NAME: &str = "nemesis-lock";
/// Where the lock commands' signs of life go, in the run directory.
const LOCK_DIR: &str = "locks";
/// Watch items kept from the clients at most.
const RECORDED_WATCH_MAX: usize = 4_000_000;

/// When a run keeps its directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeepDir {
    /// Always.
    Always,
    /// When it found a violation or failed.
    OnFailure,
    /// Never (negative controls, which must find violations).
    Never,
}

/// One run's shape.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// Seeds the schedule and the workload.
    pub seed: u64,
    /// Node processes.
    pub nodes: u64,
    /// Raft groups.
    pub groups: u32,
    /// How long the nemesis runs.
    pub duration: Duration,
    /// Kinds of fault to draw from.
    pub kinds: Vec<FaultKind>,
    /// Overlap faults.
    pub combined: bool,
    /// Namespaces or loopback.
    pub network: NetworkRequest,
    /// Client processes.
    pub client_processes: u32,
    /// Tasks (holders) per client process.
    pub tasks_per_process: u32,
    /// Resources in the keyspace (small: contended).
    pub resources: u32,
    /// Lease ttl.
    pub ttl_ms: u64,
    /// The `nemesis` executable (its `node` and `client` commands run the processes).
    pub exe: PathBuf,
    /// Where run directories are made (a temporary directory by default).
    pub work_dir: Option<PathBuf>,
    /// When to keep the run directory.
    pub keep: KeepDir,
    /// After the heal: every group must have a leader, and every client must complete an
    /// operation, within this.
    pub liveness_bound: Duration,
    /// How long the clients run on after the heal.
    pub recovery: Duration,
    /// A guarantee the nodes break on purpose: the run must then find violations.
    pub negative_control: NegativeControl,
    /// `tenurectl`: every client process runs `tenurectl lock` on one lock beside its tasks
    /// (`None`: no locks). [`RunConfig::new`] takes the one beside `exe`, if it is there.
    pub tenurectl: Option<PathBuf>,
}

impl RunConfig {
    /// A run with the defaults around `seed`, `exe` and the kinds.
    pub fn new(seed: u64, exe: PathBuf, kinds: Vec<FaultKind>) -> Self {
        RunConfig {
            seed,
            nodes: 3,
            groups: 8,
            duration: Duration::from_secs(60),
            kinds,
            combined: false,
            network: NetworkRequest::Auto,
            client_processes: 3,
            tasks_per_process: 4,
            resources: 12,
            ttl_ms: 3_000,
            work_dir: None,
            keep: KeepDir::OnFailure,
            liveness_bound: Duration::from_secs(30),
            recovery: Duration::from_secs(5),
            negative_control: NegativeControl::None,
            tenurectl: exe
                .parent()
                .map(|dir| dir.join("tenurectl"))
                .filter(|path| path.is_file()),
            exe,
        }
    }
}

/// What a run found.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunReport {
    /// The seed (replays the schedule).
    pub seed: u64,
    /// Node processes.
    pub nodes: u64,
    /// `namespaces+iptables` or `loopback+fault-layer`.
    pub network: String,
    /// Why namespaces were not used, when they were not.
    pub network_fallback_reason: Option<String>,
    /// Kinds drawn from, and whether they overlapped.
    pub profile: String,
    /// The guarantee broken on purpose (`none` normally).
    pub negative_control: String,
    /// The plan.
    pub schedule: Vec<Step>,
    /// Faults applied, by kind.
    pub nemeses: BTreeMap<String, u64>,
    /// Faults that could not be applied, and why.
    pub skipped: Vec<String>,
    /// The checker's verdict (violations of properties 1-5 and the store's evidence).
    pub check: CheckReport,
    /// Every violation: the checker's, liveness, two leaders in a term, nodes that died.
    pub violations: Vec<Violation>,
    /// Indeterminate operations (no definite answer even after the run).
    pub ops_unknown: u64,
    /// Operations by kind and outcome (`acquire:granted`, ...).
    pub op_counts: BTreeMap<String, u64>,
    /// Status polls of the nodes made by the monitor.
    pub status_polls: u64,
    /// Leader terms the monitor saw beyond each group's first: elections the faults caused
    /// (a lower bound; terms between two polls are missed).
    pub elections_observed: u64,
    /// Seconds from the heal until every group had a leader.
    pub recovered_after_s: Option<f64>,
    /// The run directory, when kept.
    pub dir: Option<PathBuf>,
    /// Wall-clock seconds the run took.
    pub elapsed_s: f64,
    /// CLOCK_MONOTONIC at the start of the nemesis (the history's times are relative to it).
    pub origin_ns: Nanos,
}

impl RunReport {
    /// True when nothing was violated.
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }

    /// One line for logs.
    pub fn summary_line(&self) -> String {
        let applied: Vec<String> = self
            .nemeses
            .iter()
            .map(|(kind, count)| format!("{kind}x{count}"))
            .collect();
        let control = if self.negative_control == "none" {
            String::new()
        } else {
            format!(" NEGATIVE CONTROL {},", self.negative_control)
        };
        format!(
            "nemesis seed {}:{control} {} nodes, {}, {}: faults [{}]; {} elections seen; {} ops \
             checked ({} definite, {} unknown, {} replays compared); {} hand-offs judged; {} watch \
             events judged; {} lock commands judged; {} fenced writes late, {} of them rejected; \
             {} violation(s); {:.1}s",
            self.seed,
            self.nodes,
            self.network,
            self.profile,
            applied.join(" "),
            self.elections_observed,
            self.check.ops_checked,
            self.check.ops_definite,
            self.ops_unknown,
            self.check.replays_compared,
            self.check.hand_offs_judged,
            self.check.watch_events_judged,
            self.check.lock_runs_judged,
            self.check.late_writes,
            self.check.late_writes_rejected,
            self.violations.len(),
            self.elapsed_s
        )
    }
}

/// A client process and what it has printed.
struct ClientProcess {
    number: u32,
    child: Child,
    stdin: Option<ChildStdin>,
    reader: Option<std::thread::JoinHandle<()>>,
    done: Arc<Mutex<bool>>,
}

/// What the client processes reported, by operation id.
#[derive(Default)]
struct Recorded {
    ops: HashMap<u64, OpRecord>,
    /// Watch items, in the order they arrived (per client process, the order they were
    /// delivered).
    watch: Vec<WatchRecord>,
    /// More than [`RECORDED_OPS_MAX`] operations (or [`RECORDED_WATCH_MAX`] watch items)
    /// arrived; some were not kept.
    overflowed: bool,
}

type Ops = Arc<Mutex<Recorded>>;

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn spawn_client(
    config: &RunConfig,
    cluster_file: &Path,
    store: &Path,
    dir: &Path,
    number: u32,
    ops: Ops,
) -> Result<ClientProcess, HarnessError> {
    let resources: Vec<String> = (0..config.resources).map(|i| format!("r{i}")).collect();
    let log = std::fs::File::create(dir.join(format!("client-{number}.log")))
        .map_err(|e| HarnessError::io("creating a client log", e))?;
    let mut child = Command::new(&config.exe)
        .arg("client")
        .arg("--cluster")
        .arg(cluster_file)
        .args(["--process", &number.to_string()])
        .args(["--tasks", &config.tasks_per_process.to_string()])
        .args([
            "--seed",
            &(config.seed ^ (u64::from(number) << 48)).to_string(),
        ])
        .args(["--tenant", TENANT])
        .args(["--resources", &resources.join(",")])
        .args(["--ttl-ms", &config.ttl_ms.to_string()])
        .arg("--store")
        .arg(store)
        .args(["--resolve-timeout-ms", "30000"])
        .args(["--run-tag", &format!("s{:x}", config.seed)])
        .args(match &config.tenurectl {
            Some(tenurectl) => vec![
                "--lock-tenurectl".into(),
                tenurectl.clone().into_os_string(),
                "--lock-name".into(),
                LOCK_NAME.into(),
                "--lock-dir".into(),
                dir.join(LOCK_DIR).into_os_string(),
            ],
            None => Vec::new(),
        })
        // Its own process group, which `pause-client` stops whole: the client process and the
        // `tenurectl lock` it runs (the holder itself; the lock's watchdog and command are in
        // groups of their own).
        .process_group(0)
        // The client library's debug lines are one per failed attempt (which node, forwarded or
        // not, why) and per connection: what a failed run's client log must show.
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "warn,tenure_client=debug".into()),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .map_err(|e| HarnessError::io("starting a client process", e))?;
    let stdin = child.stdin.take();
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| HarnessError::Client("no stdout".into()))?;
    let done = Arc::new(Mutex::new(false));
    let reader_done = done.clone();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            match serde_json::from_str::<WorkerLine>(&line) {
                Ok(WorkerLine::Invoke(record) | WorkerLine::Op(record)) => {
                    let mut recorded = lock(&ops);
                    if recorded.ops.len() < RECORDED_OPS_MAX
                        || recorded.ops.contains_key(&record.id)
                    {
                        // An answer replaces its invocation.
                        recorded.ops.insert(record.id, record);
                    } else {
                        recorded.overflowed = true;
                    }
                }
                Ok(WorkerLine::Watch(record)) => {
                    let mut recorded = lock(&ops);
                    if recorded.watch.len() < RECORDED_WATCH_MAX {
                        recorded.watch.push(record);
                    } else {
                        recorded.overflowed = true;
                    }
                }
                Ok(WorkerLine::Done { .. }) => *lock(&reader_done) = true,
                Err(error) => tracing::warn!("client {number}: unreadable line: {error}"),
            }
        }
    });
    Ok(ClientProcess {
        number,
        child,
        stdin,
        reader: Some(reader),
        done,
    })
}

impl ClientProcess {
    /// Signals the client process's group (the process and the `tenurectl lock` it runs).
    fn signal(&self, signal: rustix::process::Signal) {
        if let Some(pid) = i32::try_from(self.child.id())
            .ok()
            .and_then(rustix::process::Pid::from_raw)
        {
            let _ = rustix::process::kill_process_group(pid, signal);
        }
    }

    fn ask_to_stop(&mut self) {
        self.signal(rustix::process::Signal::CONT);
        if let Some(mut stdin) = self.stdin.take() {
            let _ = stdin.write_all(b"stop\n");
        }
    }

    /// Waits (bounded) for the process to finish; kills it past the deadline.
    fn finish(&mut self, deadline: Instant) -> bool {
        loop {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            if Instant::now() >= deadline {
                self.signal(rustix::process::Signal::KILL);
                let _ = self.child.kill();
                let _ = self.child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        *lock(&self.done)
    }
}

impl Drop for ClientProcess {
    fn drop(&mut self) {
        self.signal(rustix::process::Signal::CONT);
        // The whole group: the client process and the `tenurectl lock` it runs (whose watchdog
        // stops the lock's command when tenurectl goes).
        self.signal(rustix::process::Signal::KILL);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Leader claims seen by the monitor: (group, term) -> nodes that said they lead it.
type LeaderClaims = BTreeMap<(u32, u64), BTreeSet<u64>>;

fn record_claims(claims: &mut LeaderClaims, statuses: &BTreeMap<u64, NodeStatus>) {
    for (&node, status) in statuses {
        for group in &status.hosted {
            if group.is_leader {
                claims
                    .entry((group.group_id, group.term))
                    .or_default()
                    .insert(node);
            }
        }
    }
}

/// True when every group has a leader that says so.
fn all_groups_led(statuses: &BTreeMap<u64, NodeStatus>, groups: u32) -> bool {
    (0..groups).all(|group| {
        statuses.values().any(|status| {
            status
                .hosted
                .iter()
                .any(|g| g.group_id == group && g.is_leader)
        })
    })
}

/// The node leading the most groups (lowest id on ties).
fn busiest_leader(statuses: &BTreeMap<u64, NodeStatus>) -> Option<u64> {
    statuses
        .iter()
        .map(|(&node, status)| (status.hosted.iter().filter(|g| g.is_leader).count(), node))
        .filter(|&(count, _)| count > 0)
        .max_by_key(|&(count, node)| (count, std::cmp::Reverse(node)))
        .map(|(_, node)| node)
}

/// The run's shared state: the cluster, the fault log, leader claims.
struct Shared {
    cluster: tokio::sync::Mutex<Cluster>,
    faults: Mutex<Vec<FaultEvent>>,
    claims: Mutex<LeaderClaims>,
    polls: Mutex<u64>,
}

impl Shared {
    fn log(&self, nemesis: &str, start: bool, detail: String) {
        lock(&self.faults).push(FaultEvent {
            at_ns: mono_now_ns(),
            nemesis: nemesis.to_string(),
            start,
            detail,
        });
    }
}

/// A fault in effect, with what healing it needs.
#[derive(Debug, Clone)]
enum Active {
    Killed(u64),
    PausedNode(u64),
    PausedClient(u32),
    Partition,
    ClockRate(u64),
    ClockJump(u64),
    SlowDisk(u64),
    /// A replica move running in a task; its outcome arrives here.
    Move(tokio::sync::watch::Receiver<Option<String>>),
    /// A node added (nothing to heal; the heal reports what it holds).
    Added(u64),
    /// A node drained; undrained at the heal.
    Drained(u64),
    /// A node drained; removed at the heal when empty, else undrained.
    Removing(u64),
    /// A node killed for good; removed from the table and replaced at the heal.
    Replacing(u64),
}

/// Runs one seeded run.
pub async fn run_one(config: &RunConfig) -> Result<RunReport, HarnessError> {
    let started = Instant::now();
    let mut builder = tempfile::Builder::new();
    let prefix = format!("tenure-nemesis-{}-", config.seed);
    builder.prefix(&prefix);
    let temp = match &config.work_dir {
        Some(parent) => {
            std::fs::create_dir_all(parent)
                .map_err(|e| HarnessError::io("creating the work directory", e))?;
            builder.tempdir_in(parent)
        }
        None => builder.tempdir(),
    }
    .map_err(|e| HarnessError::io("creating the run directory", e))?;
    let dir = temp.path().to_path_buf();
    let result = run_in(config, &dir, started).await;
    let keep = match (&result, config.keep) {
        (_, KeepDir::Never) => false,
        (_, KeepDir::Always) | (Err(_), _) => true,
        (Ok(report), KeepDir::OnFailure) => !report.passed(),
    };
    let kept = keep.then(|| temp.keep());
    match result {
        Ok(mut report) => {
            report.dir = kept;
            if let Some(dir) = &report.dir {
                if let Ok(text) = serde_json::to_string_pretty(&report) {
                    let _ = std::fs::write(dir.join("report.json"), text);
                }
            }
            Ok(report)
        }
        Err(error) => Err(HarnessError::Cluster(format!(
            "{error} (run directory kept: {})",
            kept.map(|d| d.display().to_string()).unwrap_or_default()
        ))),
    }
}

async fn run_in(
    config: &RunConfig,
    dir: &Path,
    started: Instant,
) -> Result<RunReport, HarnessError> {
    // Spare ids for the nemeses that start nodes (each start takes a new id: ids are never
    // reused).
    let spare_nodes = if config
        .kinds
        .iter()
        .any(|k| matches!(k, FaultKind::AddNode | FaultKind::ReplaceNode))
        && config.nodes > 3
    {
        SPARE_NODES
    } else {
        0
    };
    let ids: Vec<u64> = (1..=config.nodes + spare_nodes).collect();
    let network = Network::setup(config.network, &ids)?;
    let options = ClusterOptions {
        nodes: config.nodes,
        groups: config.groups,
        negative_control: config.negative_control,
        spare_nodes,
        ..ClusterOptions::default()
    };
    let cluster = Cluster::start(dir, network, &config.exe, options)?;
    if config.ttl_ms < cluster.ttl_ms_min() {
        return Err(HarnessError::Cluster(format!(
            "ttl {} ms is below the cluster's minimum {} ms",
            config.ttl_ms,
            cluster.ttl_ms_min()
        )));
    }
    let network_name = cluster.network_mode().name().to_string();
    let fallback_reason = cluster.network_fallback_reason().map(str::to_string);
    let can_jump = cluster.can_jump_wall_clocks();
    let cluster_file = cluster.cluster_file().to_path_buf();
    let client = connect_with_retry(&cluster).await?;
    wait_for_leaders(&cluster, &client, config.groups, Duration::from_secs(60))
        .await
        .ok_or_else(|| HarnessError::Cluster("not every group elected a leader".into()))?;
    tracing::info!(
        seed = config.seed,
        "run: every group has a leader; starting clients"
    );

    let store = StoreServer::start(&dir.join("store.sock"))?;
    std::fs::create_dir_all(dir.join(LOCK_DIR))
        .map_err(|e| HarnessError::io("creating the lock directory", e))?;
    let ops: Ops = Arc::new(Mutex::new(Recorded::default()));
    let mut clients = Vec::new();
    for number in 1..=config.client_processes {
        clients.push(spawn_client(
            config,
            &cluster_file,
            store.path(),
            dir,
            number,
            ops.clone(),
        )?);
    }
    let shape = PlanShape {
        kinds: config.kinds.clone(),
        combined: config.combined,
        duration_ms: u64::try_from(config.duration.as_millis()).unwrap_or(u64::MAX),
        nodes: config.nodes,
        client_processes: config.client_processes,
        ttl_ms: config.ttl_ms,
    };
    let schedule = plan(config.seed, &shape);
    let shared = Arc::new(Shared {
        cluster: tokio::sync::Mutex::new(cluster),
        faults: Mutex::new(Vec::new()),
        claims: Mutex::new(BTreeMap::new()),
        polls: Mutex::new(0),
    });
    let (monitor_stop, monitor_stopped) = tokio::sync::watch::channel(false);
    let monitor = tokio::spawn(monitor(shared.clone(), client.clone(), monitor_stopped));

    // Let the clients get going before the first fault.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let origin_ns = mono_now_ns();
    let mut nemeses: BTreeMap<String, u64> = BTreeMap::new();
    let mut skipped = Vec::new();
    execute(
        &schedule,
        &shared,
        &client,
        &mut clients,
        config,
        can_jump,
        &mut nemeses,
        &mut skipped,
    )
    .await;
    let healed_ns = mono_now_ns();
    tracing::info!(seed = config.seed, "run: nemesis done, every fault healed");

    // Liveness: leaders everywhere, then clients progress.
    let recovered = {
        let cluster = shared.cluster.lock().await;
        wait_for_leaders(&cluster, &client, config.groups, config.liveness_bound).await
    };
    let mut violations = Vec::new();
    if recovered.is_none() {
        violations.push(Violation {
            property: Property::Liveness,
            resource: None,
            message: format!(
                "not every group had a leader within {:.0}s after the faults healed",
                config.liveness_bound.as_secs_f64()
            ),
            ops: Vec::new(),
            writes: Vec::new(),
        });
    }
    tokio::time::sleep(config.recovery).await;
    let _ = monitor_stop.send(true);
    let _ = monitor.await;
    tracing::info!(
        seed = config.seed,
        led = recovered.is_some(),
        "run: stopping clients"
    );

    // A client that had not progressed by now has little time left to: the liveness check's
    // message says how long after the heal this was.
    let stopping_ns = mono_now_ns();
    violations.extend(stop_clients(std::mem::take(&mut clients)).await?);
    tracing::info!(seed = config.seed, "run: clients stopped; final reads");

    // Read every resource once more.
    let (mut ops, watch): (Vec<OpRecord>, Vec<WatchRecord>) = {
        let mut recorded = lock(&ops);
        if recorded.overflowed {
            return Err(HarnessError::Client(format!(
                "the clients recorded more than {RECORDED_OPS_MAX} operations or \
                 {RECORDED_WATCH_MAX} watch items: shorten the run"
            )));
        }
        (
            recorded.ops.drain().map(|(_, op)| op).collect(),
            std::mem::take(&mut recorded.watch),
        )
    };
    ops.extend(final_reads(&client, config.resources).await);

    tracing::info!(seed = config.seed, "run: checking the history");
    let mut cluster = shared.cluster.lock().await;
    cluster.check_exits();
    violations.extend(cluster.unexpected_exits().iter().map(|(node, status)| Violation {
        property: Property::NodeCrash,
        resource: None,
        message: format!(
            "node {node} exited by itself ({status}); a broken invariant aborts a node: see \
             node-{node}.log"
        ),
        ops: Vec::new(),
        writes: Vec::new(),
    }));
    cluster.stop_all();
    client.close().await;

    ops.sort_by_key(|op| (op.invoke_ns, op.id));
    let history = History {
        ops,
        writes: store.records(),
        faults: lock(&shared.faults).clone(),
        watch,
        lock_beats: read_lock_beats(&dir.join(LOCK_DIR)),
    };
    let check = checker::check(&history, &CheckConfig::default());
    violations.extend(check.violations.iter().cloned());
    let client_names: Vec<String> = (1..=config.client_processes)
        .flat_map(|p| (1..=config.tasks_per_process).map(move |t| format!("p{p}t{t}")))
        .collect();
    let bound_ns = u64::try_from(config.liveness_bound.as_nanos()).unwrap_or(u64::MAX);
    let ran_after_heal_s = stopping_ns.saturating_sub(healed_ns) as f64 / 1e9;
    violations.extend(
        checker::check_liveness(&history, &client_names, healed_ns, bound_ns)
            .into_iter()
            .map(|mut violation| {
                violation.message.push_str(&format!(
                    " (the clients were asked to stop {ran_after_heal_s:.1}s after the heal, \
                     after the wait for a leader in every group and {:.0}s more)",
                    config.recovery.as_secs_f64()
                ));
                violation
            }),
    );
    violations.extend(two_leaders_in_a_term(&lock(&shared.claims)));
    if let Ok(text) = serde_json::to_string(&history) {
        let _ = std::fs::write(dir.join("history.json"), text);
    }
    let (op_counts, ops_unknown) = op_counts(&history);
    let profile = format!(
        "{} {}",
        if config.combined { "combined" } else { "alone" },
        config
            .kinds
            .iter()
            .map(|k| k.name())
            .collect::<Vec<_>>()
            .join(",")
    );
    let status_polls = *lock(&shared.polls);
    let elections_observed = {
        let claims = lock(&shared.claims);
        let groups: BTreeSet<u32> = claims.keys().map(|&(group, _)| group).collect();
        (claims.len() as u64).saturating_sub(groups.len() as u64)
    };
    Ok(RunReport {
        seed: config.seed,
        nodes: config.nodes,
        network: network_name,
        network_fallback_reason: fallback_reason,
        profile,
        negative_control: config.negative_control.name().to_string(),
        schedule,
        nemeses,
        skipped,
        check,
        violations,
        ops_unknown,
        op_counts,
        status_polls,
        elections_observed,
        recovered_after_s: recovered.map(|at| at.saturating_sub(healed_ns) as f64 / 1e9),
        dir: None,
        elapsed_s: started.elapsed().as_secs_f64(),
        origin_ns,
    })
}

/// Asks every client process to stop (each resolves what it has in flight) and waits up to 45 s:
/// a liveness violation for each that did not finish.
async fn stop_clients(mut clients: Vec<ClientProcess>) -> Result<Vec<Violation>, HarnessError> {
    for process in &mut clients {
        process.ask_to_stop();
    }
    let stop_deadline = Instant::now() + Duration::from_secs(45);
    let finished = tokio::task::spawn_blocking(move || {
        let mut unfinished = Vec::new();
        for process in &mut clients {
            if !process.finish(stop_deadline) {
                unfinished.push(process.number);
            }
        }
        unfinished
    })
    .await
    .map_err(|e| HarnessError::Client(format!("stopping clients: {e}")))?;
    Ok(finished
        .into_iter()
        .map(|number| Violation {
            property: Property::Liveness,
            resource: None,
            message: format!("client process {number} did not finish within 45s of being stopped"),
            ops: Vec::new(),
            writes: Vec::new(),
        })
        .collect())
}

/// Reads every resource of the run once more, all at once under one deadline (a cluster that
/// lost a group must not stall the run).
async fn final_reads(client: &Client, resources: u32) -> Vec<OpRecord> {
    let reads_deadline = Instant::now() + Duration::from_secs(20);
    let mut reads = tokio::task::JoinSet::new();
    for index in 0..resources {
        let client = client.clone();
        reads.spawn(async move {
            let resource = format!("r{index}");
            let group = client
                .group_of(&ResourceKey::new(TENANT, resource.as_str()))
                .await
                .unwrap_or(u32::MAX);
            let id = (1u64 << 60) + u64::from(index);
            final_read(&client, &resource, group, id, reads_deadline).await
        });
    }
    let mut ops = Vec::new();
    while let Some(read) = reads.join_next().await {
        if let Ok(read) = read {
            ops.push(read);
        }
    }
    ops
}

/// An election-safety violation for each (group, term) in which more than one node claimed
/// leadership (the claims the monitor collected).
fn two_leaders_in_a_term(claims: &LeaderClaims) -> Vec<Violation> {
    claims
        .iter()
        .filter(|(_, nodes)| nodes.len() > 1)
        .map(|((group, term), nodes)| Violation {
            property: Property::ElectionSafety,
            resource: None,
            message: format!(
                "group {group} had two leaders in term {term}: nodes {nodes:?} (Raft election \
                 safety)"
            ),
            ops: Vec::new(),
            writes: Vec::new(),
        })
        .collect()
}

/// Operations of a history by kind, replay and outcome (`acquire-replay:granted`, ...), and how
/// many ended unknown.
fn op_counts(history: &History) -> (BTreeMap<String, u64>, u64) {
    let mut op_counts = BTreeMap::new();
    let mut ops_unknown = 0;
    for op in &history.ops {
        let outcome = match &op.outcome {
            Outcome::Granted { .. } => "granted".to_string(),
            Outcome::Released { .. } => "released".to_string(),
            Outcome::Read { view: None, .. } => "absent".to_string(),
            Outcome::Read { view: Some(v), .. } => v.status.to_lowercase(),
            Outcome::Refused { code, .. } => code.to_lowercase(),
            Outcome::Unknown { .. } => {
                ops_unknown += 1;
                "unknown".to_string()
            }
        };
        let kind = format!("{:?}", op.kind).to_lowercase();
        let replay = if op.replay_of.is_some() {
            "-replay"
        } else {
            ""
        };
        *op_counts
            .entry(format!("{kind}{replay}:{outcome}"))
            .or_insert(0) += 1;
    }
    (op_counts, ops_unknown)
}

/// Starts a cluster in `dir` and waits until every group has a leader (for tests that drive a
/// cluster themselves, like the fencing demo).
pub async fn start_ready_cluster(
    dir: &Path,
    network: NetworkRequest,
    exe: &Path,
    options: ClusterOptions,
) -> Result<(Cluster, Client), HarnessError> {
    let ids: Vec<u64> = (1..=options.nodes).collect();
    let groups = options.groups;
    let network = Network::setup(network, &ids)?;
    let cluster = Cluster::start(dir, network, exe, options)?;
    let client = connect_with_retry(&cluster).await?;
    wait_for_leaders(&cluster, &client, groups, Duration::from_secs(60))
        .await
        .ok_or_else(|| HarnessError::Cluster("not every group elected a leader".into()))?;
    Ok((cluster, client))
}

async fn connect_with_retry(cluster: &Cluster) -> Result<Client, HarnessError> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match cluster.connect_client().await {
            Ok(client) => return Ok(client),
            Err(error) if Instant::now() >= deadline => return Err(error),
            Err(_) => tokio::time::sleep(Duration::from_millis(300)).await,
        }
    }
}

/// Waits (bounded) until every group has a leader; the time it saw that, or `None`.
async fn wait_for_leaders(
    cluster: &Cluster,
    client: &Client,
    groups: u32,
    bound: Duration,
) -> Option<Nanos> {
    let deadline = Instant::now() + bound;
    loop {
        let statuses = cluster.statuses(client, Duration::from_millis(800)).await;
        if all_groups_led(&statuses, groups) {
            return Some(mono_now_ns());
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn monitor(
    shared: Arc<Shared>,
    client: Client,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        let running: Vec<u64> = {
            let mut cluster = shared.cluster.lock().await;
            for (node, status) in cluster.check_exits() {
                shared.log("node-exit", true, format!("node {node} exited: {status}"));
            }
            cluster
                .ids()
                .into_iter()
                .filter(|&id| cluster.state(id) == Some(NodeState::Running))
                .collect()
        };
        let mut statuses = BTreeMap::new();
        for node in running {
            if let Ok(Ok(status)) =
                tokio::time::timeout(Duration::from_millis(800), client.node_status(node)).await
            {
                statuses.insert(node, status);
            }
        }
        record_claims(&mut lock(&shared.claims), &statuses);
        *lock(&shared.polls) += 1;
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            _ = stop.changed() => return,
        }
    }
}

/// Runs the plan in real time, then heals whatever is still in effect.
#[allow(clippy::too_many_arguments)]
async fn execute(
    schedule: &[Step],
    shared: &Arc<Shared>,
    client: &Client,
    clients: &mut [ClientProcess],
    config: &RunConfig,
    can_jump: bool,
    nemeses: &mut BTreeMap<String, u64>,
    skipped: &mut Vec<String>,
) {
    // (time, start?, step index) in time order; heals before starts at equal times.
    let mut events: Vec<(u64, bool, usize)> = Vec::new();
    for (index, step) in schedule.iter().enumerate() {
        events.push((step.at_ms, true, index));
        events.push((step.at_ms + step.hold_ms, false, index));
    }
    events.sort_by_key(|&(at, start, index)| (at, start, index));
    let begin = Instant::now();
    let mut active: HashMap<usize, Active> = HashMap::new();
    for (at_ms, start, index) in events {
        let due = begin + Duration::from_millis(at_ms);
        tokio::time::sleep_until(due.into()).await;
        let step = &schedule[index];
        if start {
            match apply(&step.fault, shared, client, clients, can_jump).await {
                Ok(effect) => {
                    *nemeses
                        .entry(step.fault.kind().name().to_string())
                        .or_insert(0) += 1;
                    active.insert(index, effect);
                }
                Err(reason) => {
                    shared.log(step.fault.kind().name(), true, format!("skipped: {reason}"));
                    skipped.push(format!("{:?}: {reason}", step.fault));
                }
            }
        } else if let Some(effect) = active.remove(&index) {
            heal(&effect, step.fault.kind().name(), shared, client, clients).await;
        }
    }
    let total =
        Duration::from_millis(u64::try_from(config.duration.as_millis()).unwrap_or(u64::MAX));
    tokio::time::sleep_until((begin + total).into()).await;
    let mut remaining: Vec<(usize, Active)> = active.into_iter().collect();
    remaining.sort_by_key(|(index, _)| *index);
    for (index, effect) in remaining {
        heal(
            &effect,
            schedule[index].fault.kind().name(),
            shared,
            client,
            clients,
        )
        .await;
    }
}

/// The node a target names. "The leader" while elections are under way (nobody leads yet) is
/// waited for briefly, then falls back to the lowest running node, so the fault still happens.
async fn resolve(target: NodeTarget, shared: &Shared, client: &Client) -> Result<u64, String> {
    match target {
        NodeTarget::Node(node) => Ok(node),
        NodeTarget::Leader => {
            let deadline = Instant::now() + Duration::from_secs(2);
            loop {
                let cluster = shared.cluster.lock().await;
                let statuses = cluster.statuses(client, Duration::from_millis(800)).await;
                if let Some(leader) = busiest_leader(&statuses) {
                    return Ok(leader);
                }
                if Instant::now() >= deadline {
                    return cluster
                        .ids()
                        .into_iter()
                        .find(|&id| cluster.state(id) == Some(NodeState::Running))
                        .ok_or_else(|| "no node is running".to_string());
                }
                drop(cluster);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

fn both_ways(a: &[u64], b: &[u64]) -> BTreeSet<(u64, u64)> {
    let mut cut = BTreeSet::new();
    for &x in a {
        for &y in b {
            cut.insert((x, y));
            cut.insert((y, x));
        }
    }
    cut
}

async fn apply(
    fault: &Fault,
    shared: &Shared,
    client: &Client,
    clients: &mut [ClientProcess],
    can_jump: bool,
) -> Result<Active, String> {
    let name = fault.kind().name();
    match fault {
        Fault::Kill(target) => {
            let node = resolve(*target, shared, client).await?;
            let mut cluster = shared.cluster.lock().await;
            if cluster.state(node) != Some(NodeState::Running) {
                return Err(format!("node {node} is not running"));
            }
            cluster.kill(node).map_err(|e| e.to_string())?;
            shared.log(name, true, format!("kill -9 node {node}"));
            Ok(Active::Killed(node))
        }
        Fault::PauseNode(target) => {
            let node = resolve(*target, shared, client).await?;
            let mut cluster = shared.cluster.lock().await;
            if cluster.state(node) != Some(NodeState::Running) {
                return Err(format!("node {node} is not running"));
            }
            cluster.pause(node).map_err(|e| e.to_string())?;
            shared.log(name, true, format!("SIGSTOP node {node}"));
            Ok(Active::PausedNode(node))
        }
        Fault::PauseClient(number) => {
            let process = clients
                .iter()
                .find(|p| p.number == *number)
                .ok_or_else(|| format!("no client process {number}"))?;
            process.signal(rustix::process::Signal::STOP);
            shared.log(name, true, format!("SIGSTOP client process {number}"));
            Ok(Active::PausedClient(*number))
        }
        Fault::Isolate(target) => {
            let node = resolve(*target, shared, client).await?;
            let mut cluster = shared.cluster.lock().await;
            let others: Vec<u64> = cluster.ids().into_iter().filter(|&n| n != node).collect();
            cluster
                .set_partition(&both_ways(&[node], &others))
                .await
                .map_err(|e| e.to_string())?;
            shared.log(name, true, format!("isolate node {node} from {others:?}"));
            Ok(Active::Partition)
        }
        Fault::Halves { minority } => {
            let mut cluster = shared.cluster.lock().await;
            let majority: Vec<u64> = cluster
                .ids()
                .into_iter()
                .filter(|n| !minority.contains(n))
                .collect();
            cluster
                .set_partition(&both_ways(minority, &majority))
                .await
                .map_err(|e| e.to_string())?;
            shared.log(name, true, format!("{minority:?} | {majority:?}"));
            Ok(Active::Partition)
        }
        Fault::Bridge {
            left,
            bridge,
            right,
        } => {
            let mut cluster = shared.cluster.lock().await;
            cluster
                .set_partition(&both_ways(left, right))
                .await
                .map_err(|e| e.to_string())?;
            shared.log(
                name,
                true,
                format!("{left:?} | {right:?}, node {bridge} sees both"),
            );
            Ok(Active::Partition)
        }
        Fault::ClockRate { node, ppm } => {
            set_knob(shared, *node, clock_rate(*ppm)).await?;
            shared.log(
                name,
                true,
                format!("node {node} monotonic clock {ppm:+} ppm"),
            );
            Ok(Active::ClockRate(*node))
        }
        Fault::ClockJump { node, offset_s } => {
            if !can_jump {
                return Err("libfaketime is not installed (Debian package faketime)".into());
            }
            let cluster = shared.cluster.lock().await;
            cluster
                .set_wall_clock_offset(*node, *offset_s)
                .map_err(|e| e.to_string())?;
            shared.log(name, true, format!("node {node} wall clock {offset_s:+} s"));
            Ok(Active::ClockJump(*node))
        }
        Fault::SlowDisk { node, delay_ms } => {
            set_knob(shared, *node, wal_sync_delay(*delay_ms)).await?;
            shared.log(name, true, format!("node {node} WAL syncs +{delay_ms} ms"));
            Ok(Active::SlowDisk(*node))
        }
        Fault::MoveReplica { pick } => {
            let (group, from, to) = choose_move(*pick, shared, client).await?;
            shared.log(
                name,
                true,
                format!("group {group}: node {from} -> node {to}"),
            );
            let (report, outcome) = tokio::sync::watch::channel(None);
            let client = client.clone();
            tokio::spawn(async move {
                let moved = client
                    .move_replica(group, from, to, MOVE_WAIT)
                    .await
                    .map_or_else(
                        |error| format!("group {group}: move failed: {error}"),
                        |members| format!("group {group}: voters {:?}", members.voters),
                    );
                report.send_replace(Some(moved));
            });
            Ok(Active::Move(outcome))
        }
        Fault::AddNode => {
            let node = add_spare_node(shared, client).await?;
            shared.log(name, true, format!("node {node} announced and started"));
            Ok(Active::Added(node))
        }
        Fault::DrainNode { pick } | Fault::RemoveNode { pick } => {
            let node = choose_drain(*pick, shared, client).await?;
            // An unanswered drain may still apply: the step goes on either way, so that its
            // end undrains or removes the node.
            let answer = change(
                client,
                ClusterOp::SetState {
                    node_id: node,
                    state: TableState::Draining,
                },
            )
            .await
            .err()
            .map(|error| format!(" (no clear answer: {error})"))
            .unwrap_or_default();
            shared.log(name, true, format!("drain node {node}{answer}"));
            Ok(if matches!(fault, Fault::DrainNode { .. }) {
                Active::Drained(node)
            } else {
                Active::Removing(node)
            })
        }
        Fault::ReplaceNode(target) => {
            let node = resolve(*target, shared, client).await?;
            let active = table_nodes(shared, client, TableState::Active).await?;
            if !active.contains(&node) || active.len() <= MEMBERS_ACTIVE_MIN {
                return Err(format!(
                    "node {node} is not one of {} or more active nodes ({active:?})",
                    MEMBERS_ACTIVE_MIN + 1
                ));
            }
            // Losing a node for good while a group still lacks a replica of an earlier loss
            // would take two of its three replicas away for good: beyond any fault model.
            fully_replicated(shared, client).await?;
            let mut cluster = shared.cluster.lock().await;
            if cluster.state(node) != Some(NodeState::Running) {
                return Err(format!("node {node} is not running"));
            }
            cluster.retire(node).map_err(|e| e.to_string())?;
            shared.log(name, true, format!("kill -9 node {node} for good"));
            Ok(Active::Replacing(node))
        }
    }
}

/// Active nodes the membership nemeses leave at least (every group keeps three replicas on
/// active nodes, and a move has a spare node).
const MEMBERS_ACTIVE_MIN: usize = 4;
/// Node processes a run grows to at most (two cores).
const NODES_RUNNING_MAX: usize = 7;

/// The nodes of the node table in `state` whose process runs (a node killed for good stays
/// `active` in the table until it is declared dead).
async fn table_nodes(
    shared: &Shared,
    client: &Client,
    state: TableState,
) -> Result<Vec<u64>, String> {
    let listed = client
        .cluster_nodes()
        .await
        .map(|meta| meta.nodes_in(state))
        .map_err(|error| format!("reading the node table: {error}"))?;
    let cluster = shared.cluster.lock().await;
    Ok(listed
        .into_iter()
        .filter(|&id| cluster.state(id) == Some(NodeState::Running))
        .collect())
}

/// A change of the node table, as an operator would make it.
async fn change(client: &Client, op: ClusterOp) -> Result<(), String> {
    let text = format!("{op:?}");
    client
        .cluster_change(op)
        .await
        .map(|_| ())
        .map_err(|error| format!("{text}: {error}"))
}

/// Announces the next spare node in the node table and starts it; its id.
async fn add_spare_node(shared: &Shared, client: &Client) -> Result<u64, String> {
    let (node, addr, http_addr) = {
        let cluster = shared.cluster.lock().await;
        let running = cluster
            .ids()
            .into_iter()
            .filter(|&id| cluster.state(id) != Some(NodeState::Killed))
            .count();
        if running >= NODES_RUNNING_MAX {
            return Err(format!("{running} nodes already"));
        }
        cluster
            .next_spare()
            .ok_or_else(|| "no spare node id left".to_string())?
    };
    change(
        client,
        ClusterOp::AddNode(NodeAddresses {
            node_id: node,
            addr: addr.to_string(),
            http_addr: http_addr.to_string(),
        }),
    )
    .await?;
    shared
        .cluster
        .lock()
        .await
        .add_node(node)
        .map_err(|e| e.to_string())?;
    // The nemesis's client learns the node now (status polls, leader claims).
    let _ = client.refresh_routing().await;
    Ok(node)
}

/// An active node `pick` chooses to drain, when more than [`MEMBERS_ACTIVE_MIN`] are active.
async fn choose_drain(pick: u64, shared: &Shared, client: &Client) -> Result<u64, String> {
    let active = table_nodes(shared, client, TableState::Active).await?;
    if active.len() <= MEMBERS_ACTIVE_MIN {
        return Err(format!(
            "only {} active running nodes ({active:?})",
            active.len()
        ));
    }
    let mut rng = SmallRng::seed_from_u64(pick);
    Ok(active[rng.random_range(0..active.len())])
}

/// Ok when every group has one voter set, no learner, and every voter on a node of the cluster
/// (not removed).
async fn fully_replicated(shared: &Shared, client: &Client) -> Result<(), String> {
    let (groups, members) = {
        let cluster = shared.cluster.lock().await;
        (cluster.groups(), cluster.ids())
    };
    for group in 0..groups {
        let replicas = client
            .group_members(group)
            .await
            .map_err(|error| format!("group {group}'s members: {error}"))?;
        let settled = replicas.voter_sets.len() == 1 && replicas.learners.is_empty();
        if !settled || replicas.voters.iter().any(|node| !members.contains(node)) {
            return Err(format!(
                "group {group} is not fully replicated yet (voters {:?}, learners {:?})",
                replicas.voter_sets, replicas.learners
            ));
        }
    }
    Ok(())
}

/// Replicas (voters and learners) per node, asked of every group's leader.
async fn replicas_per_node(client: &Client, groups: u32) -> Result<BTreeMap<u64, u64>, String> {
    let mut replicas = BTreeMap::new();
    for group in 0..groups {
        let members = client
            .group_members(group)
            .await
            .map_err(|error| format!("group {group}'s members: {error}"))?;
        for node in members.voters.iter().chain(&members.learners) {
            *replicas.entry(*node).or_insert(0) += 1;
        }
    }
    Ok(replicas)
}

/// The end of a drain: remove the node when it holds no replica (`remove`), else undrain it.
async fn end_drain(node: u64, remove: bool, shared: &Shared, client: &Client) -> String {
    let groups = shared.cluster.lock().await.groups();
    let held = replicas_per_node(client, groups)
        .await
        .map(|replicas| replicas.get(&node).copied().unwrap_or(0));
    let mut detail = match &held {
        Ok(held) => format!("node {node} held {held} replicas"),
        Err(error) => format!("node {node}'s replicas unknown ({error})"),
    };
    if remove && held == Ok(0) {
        match change(client, ClusterOp::Remove { node_id: node }).await {
            Ok(()) => {
                let stopped = shared.cluster.lock().await.retire(node);
                return match stopped {
                    Ok(()) => format!("{detail}; removed and stopped"),
                    Err(error) => format!("{detail}; removed; stopping it failed: {error}"),
                };
            }
            Err(error) => detail.push_str(&format!("; not removed ({error})")),
        }
    }
    // Not confirmed removed: the drain is taken back (a few tries: a fault may be under way).
    let undrain = ClusterOp::SetState {
        node_id: node,
        state: TableState::Active,
    };
    for attempt in 1..=UNDRAIN_ATTEMPTS {
        match change(client, undrain.clone()).await {
            Ok(()) => return format!("{detail}; undrained"),
            Err(error) if attempt == UNDRAIN_ATTEMPTS => {
                return format!("{detail}; undrain failed: {error}");
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
    detail
}

/// Tries to take a drain back before the step gives up (each try waits up to the client's
/// call timeout).
const UNDRAIN_ATTEMPTS: u32 = 4;

/// The end of a replacement: the killed node drained and removed (wherever the controller got
/// with it), and a spare node added in its place.
async fn end_replace(node: u64, shared: &Shared, client: &Client) -> String {
    let state = match client.cluster_nodes().await {
        Ok(meta) => meta.node(node).map(|record| record.state),
        Err(error) => return format!("node {node}: reading the node table: {error}"),
    };
    let mut detail = format!("node {node} was {state:?}");
    if state == Some(TableState::Active) {
        let drain = ClusterOp::SetState {
            node_id: node,
            state: TableState::Draining,
        };
        if let Err(error) = change(client, drain).await {
            return format!("{detail}; drain failed: {error}");
        }
    }
    if let Err(error) = change(client, ClusterOp::Remove { node_id: node }).await {
        return format!("{detail}; remove failed: {error}");
    }
    detail.push_str("; removed");
    match add_spare_node(shared, client).await {
        Ok(added) => detail.push_str(&format!("; node {added} added in its place")),
        Err(error) => detail.push_str(&format!("; no node added: {error}")),
    }
    detail
}

/// How long the nemesis waits for one replica move (the client repeats it while it runs).
const MOVE_WAIT: Duration = Duration::from_secs(30);

/// A move drawn from `pick`: a group (some group's current replica set, asked of its leader), one
/// of its voters, and a node without a replica of it.
async fn choose_move(
    pick: u64,
    shared: &Shared,
    client: &Client,
) -> Result<(u32, u64, u64), String> {
    let mut rng = SmallRng::seed_from_u64(pick);
    let groups = shared.cluster.lock().await.groups();
    // Only active nodes take replicas (the node table's view).
    let ids = table_nodes(shared, client, TableState::Active).await?;
    let group = rng.random_range(0..groups.max(1));
    let members = client
        .group_members(group)
        .await
        .map_err(|error| format!("group {group}'s members: {error}"))?;
    if members.voter_sets.len() > 1 {
        return Err(format!("group {group} is in a joint change"));
    }
    let spare: Vec<u64> = ids
        .iter()
        .copied()
        .filter(|id| !members.voters.contains(id))
        .collect();
    if members.voters.is_empty() || spare.is_empty() {
        return Err(format!(
            "group {group} has no spare node ({:?})",
            members.voters
        ));
    }
    let from = members.voters[rng.random_range(0..members.voters.len())];
    let to = spare[rng.random_range(0..spare.len())];
    Ok((group, from, to))
}

fn clock_rate(ppm: i64) -> FaultSettings {
    FaultSettings {
        clock_rate_ppm: Some(ppm),
        ..FaultSettings::default()
    }
}

fn wal_sync_delay(delay_ms: u64) -> FaultSettings {
    FaultSettings {
        wal_sync_delay_ms: Some(delay_ms),
        ..FaultSettings::default()
    }
}

/// Turns one of node `node`'s fault-control knobs.
async fn set_knob(shared: &Shared, node: u64, settings: FaultSettings) -> Result<(), String> {
    let cluster = shared.cluster.lock().await;
    cluster
        .set_faults(node, &settings)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

async fn heal(
    effect: &Active,
    name: &str,
    shared: &Shared,
    client: &Client,
    clients: &mut [ClientProcess],
) {
    let detail = match effect {
        Active::Killed(node) => {
            let mut cluster = shared.cluster.lock().await;
            match cluster.restart(*node).await {
                Ok(()) => format!("restart node {node}"),
                Err(error) => format!("restart node {node} failed: {error}"),
            }
        }
        Active::PausedNode(node) => {
            let mut cluster = shared.cluster.lock().await;
            match cluster.resume(*node).await {
                Ok(()) => format!("SIGCONT node {node}"),
                Err(error) => format!("SIGCONT node {node} failed: {error}"),
            }
        }
        Active::PausedClient(number) => {
            if let Some(process) = clients.iter().find(|p| p.number == *number) {
                process.signal(rustix::process::Signal::CONT);
            }
            format!("SIGCONT client process {number}")
        }
        Active::Partition => {
            let mut cluster = shared.cluster.lock().await;
            match cluster.set_partition(&BTreeSet::new()).await {
                Ok(()) => "heal every link".to_string(),
                Err(error) => format!("heal failed: {error}"),
            }
        }
        // A node restarted since has an accurate clock and disk already.
        Active::ClockRate(node) => match set_knob(shared, *node, clock_rate(0)).await {
            Ok(()) => format!("node {node} clock rate back to 0"),
            Err(error) => format!("node {node} clock rate not reset: {error}"),
        },
        Active::ClockJump(node) => {
            let cluster = shared.cluster.lock().await;
            match cluster.set_wall_clock_offset(*node, 0) {
                Ok(()) => format!("node {node} wall clock back"),
                Err(error) => format!("node {node} wall clock not reset: {error}"),
            }
        }
        Active::SlowDisk(node) => match set_knob(shared, *node, wal_sync_delay(0)).await {
            Ok(()) => format!("node {node} WAL syncs back to normal"),
            Err(error) => format!("node {node} WAL delay not reset: {error}"),
        },
        Active::Move(outcome) => {
            let mut outcome = outcome.clone();
            match tokio::time::timeout(
                MOVE_WAIT + Duration::from_secs(5),
                outcome.wait_for(Option::is_some),
            )
            .await
            {
                Ok(Ok(done)) => done.clone().unwrap_or_default(),
                Ok(Err(_)) => "the move's task ended without an outcome".to_owned(),
                Err(_) => "the move did not finish in time".to_owned(),
            }
        }
        Active::Added(node) => {
            let groups = shared.cluster.lock().await.groups();
            match replicas_per_node(client, groups).await {
                Ok(replicas) => format!(
                    "node {node} holds {} replicas; per node {replicas:?}",
                    replicas.get(node).copied().unwrap_or(0)
                ),
                Err(error) => format!("node {node}: {error}"),
            }
        }
        Active::Drained(node) => end_drain(*node, false, shared, client).await,
        Active::Removing(node) => end_drain(*node, true, shared, client).await,
        Active::Replacing(node) => end_replace(*node, shared, client).await,
    };
    shared.log(name, false, detail);
}

/// A linearizable read of `resource` by the nemesis after the run (retried until `deadline`).
async fn final_read(
    client: &Client,
    resource: &str,
    group: u32,
    id: u64,
    deadline: Instant,
) -> OpRecord {
    let key = ResourceKey::new(TENANT, resource);
    let invoke_ns = mono_now_ns();
    let mut attempts = 0;
    let (outcome, complete_ns) = loop {
        attempts += 1;
        match client.get(&key).await {
            Ok(result) => break (read_outcome(result), Some(mono_now_ns())),
            Err(error) if Instant::now() >= deadline => {
                break (
                    Outcome::Unknown {
                        error: error.to_string(),
                    },
                    None,
                );
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    };
    OpRecord {
        id,
        client: "final".into(),
        holder: "final".into(),
        resource: resource.to_string(),
        group,
        kind: OpKind::Get,
        request_id: None,
        lease: None,
        ttl_ms: 0,
        new_holder: None,
        replay_of: None,
        wait: None,
        invoke_ns,
        complete_ns,
        attempts,
        outcome,
    }
}
