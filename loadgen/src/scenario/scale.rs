//! `scale` (tenure only, the nodes' metrics and a [`NodeControl`] needed): drives a cluster to N
//! active leases and measures, while a foreground mixed workload runs at a fixed open-loop rate
//! the whole time (so its p99 before and during each phase can be compared), in this order:
//!
//! 1. the mixed throughput (closed loop, saturated, on the empty cluster): the reference of the
//!    acquire target (acquiring N must take no longer than N divided by it);
//! 2. a failover on the empty cluster: the node leading the most groups is killed, and every
//!    group is probed until it serves again ([`probe`]); the node is started again;
//! 3. N leases acquired, the session share bound to sessions (acquired in Batch requests of up
//!    to 256 per tenant and group, as a fleet taking many leases at once would; kept alive by the
//!    load generator itself with batched keep-alives, [`sessions`], so its memory does not grow
//!    with them) and the rest held on their own with a long ttl (one acquire request each,
//!    renewed by the client library); see [`plan`];
//! 4. a steady window holding them, against the same window before acquiring (taken on the
//!    undisturbed empty cluster, before the first failover);
//! 5. each node's resident memory before and after, bytes per active lease per replica, and the
//!    nodes' lease and request-id record counts ([`sampler`]);
//! 6. the nodes' snapshot figures over the run;
//! 7. a restart of a follower-heavy node with N leases: time until it is ready and caught up;
//! 8. a failover with N leases, against the empty one;
//! 9. an expiry storm: the storm's sessions (E of the session leases) end together (one last
//!    keep-alive to every record at the same moment, then none), and the nodes' counter of bound
//!    leases ended shows when all E were reclaimed; the foreground's p99 then against before;
//! 10. a new replica: the cluster grows by one node (through the [`NodeControl`]) and one
//!     group's replica moves to it from a voter that is not its leader; the move's wall time,
//!     and when the new replica had applied its state, against 60 s per group share
//!     ([`new_replica`]). Last, so that the placement controller's own rebalancing onto the new
//!     node, which may follow, disturbs no earlier figure.
//!
//! Every phase is bounded; the figures come back with their targets and whether each was met
//! (`details.figures`, printed as a table by the report).
//!
//! Must not depend on: any server crate; the cluster is seen through the client library, the
//! nodes' HTTP endpoints and the [`NodeControl`].

mod new_replica;
mod plan;
mod probe;
mod sampler;
mod sessions;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tenure_client::{AcquireOptions, Client, Lease, ResourceKey};
use tenure_core::{LeaseOp, SessionAcquireRequest};

use self::plan::{Part, Plan};
use self::sampler::{NodeReader, NodeReading, Sampler};
use self::sessions::SessionSet;
use super::session_expiry::{signed_s, watch_ended, window};
use super::{
    ExtraLine, LoadConfig, MixWorker, Recorder, Reporter, RunOutcome, ScenarioError, ScenarioKind,
    SessionEnd, phase_figures, process_rss_bytes, worker_rng,
};
use crate::keys::KeyChooser;
use crate::node_control::NodeControl;
use crate::node_metrics::NodeMetrics;
use crate::stats::{IntervalSample, OpKind};
use crate::target::{OP_TIMEOUT, Target};

/// One node of the cluster: its id (as the node control names it) and HTTP address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScaleNode {
    /// Node id.
    pub id: u64,
    /// `http://host:port`.
    pub http_url: String,
}

/// What a scale run does.
#[derive(Debug, Clone)]
pub struct ScaleConfig {
    /// Active leases to reach.
    pub leases: u64,
    /// Percent of them bound to sessions (the rest held on their own).
    pub session_share_percent: u32,
    /// Sessions of the session part (`None`: one per 10,000 leases, 1 to 1,000).
    pub sessions: Option<u64>,
    /// Ttl of every session.
    pub session_ttl: Duration,
    /// Ttl of the individually held leases (renewed by the client library every third of it).
    pub individual_ttl: Duration,
    /// Leases of the expiry storm, taken from the session part (`None`: N/10, at most
    /// 1,000,000).
    pub storm_leases: Option<u64>,
    /// Most leases of one tenant (a tenant's quota is cluster-wide).
    pub leases_per_tenant: u64,
    /// The foreground's open-loop rate, operations per second.
    pub foreground_rate_ops_per_s: f64,
    /// The saturated mixed phase's length.
    pub saturation: Duration,
    /// The steady windows' length (before acquiring, and holding).
    pub window: Duration,
    /// Workers of the saturated phase.
    pub workers: usize,
    /// Workers of the acquire phase, each with one Batch (or a few individual acquires) in
    /// flight. Bounded so the bulk leaves the groups room for the foreground: with 256 (the
    /// saturated phase's count) at 10M leases every group's queue held seconds of Batches, the
    /// open-loop foreground fell 120 s behind, and its backlog spoiled the later windows.
    pub acquire_workers: usize,
    /// Bound of the acquire phase.
    pub acquire_phase_max: Duration,
    /// Bound of a failover's probes, of a node's catch-up, and (each) of the new node's join and
    /// of the move of a replica to it.
    pub node_bound: Duration,
    /// Pause after a phase, so that its load drains before the next one measures (also how
    /// long a node stays down before its restart, and how long the storm's "during" window runs
    /// on after the last lease ended).
    pub settle: Duration,
    /// The nodes.
    pub nodes: Vec<ScaleNode>,
    /// The foreground's (and the saturated phase's) keys.
    pub keys: KeyChooser,
    /// The foreground's operation mix.
    pub mix: super::Mix,
    /// Seed of the workers' choices.
    pub seed: u64,
    /// Distinguishes this run's tenants, keys and request ids.
    pub run_tag: u32,
    /// Progress lines on stderr.
    pub progress: bool,
}

/// Targets of issue 25.
const RESTART_TARGET_S: f64 = 30.0;
const STORM_RECLAIM_TARGET_S: f64 = 10.0;
const STORM_P99_RATIO_TARGET: f64 = 2.0;
const LEASE_BYTES_TARGET: f64 = 200.0;
const APPLY_PAUSE_TARGET_S: f64 = 0.010;
const NEW_REPLICA_TARGET_S: f64 = 60.0;
/// A failover with N leases "takes the same time" as one without when it takes at most this
/// factor of it, or this much longer (run-to-run noise of an election).
const FAILOVER_SAME_FACTOR: f64 = 1.5;
const FAILOVER_SAME_SLACK_S: f64 = 1.0;

/// A foreground p99 above this (1 s, five times a foreground worker's period) means the open-loop
/// workers were behind their schedule: the window measures a backlog, not the service.
const FOREGROUND_BEHIND_P99_US: u64 = 1_000_000;
/// The storm's "before" window at most (the steady window when shorter).
const STORM_BEFORE_MAX: Duration = Duration::from_secs(5);
/// The foreground's leases' ttl and how many each worker keeps (few, so its renewals are on
/// time: see `bench/sessions-expiry.sh`).
const FOREGROUND_TTL: Duration = Duration::from_secs(15);
const FOREGROUND_HELD_PER_WORKER: usize = 10;
/// Attempts of one acquire (the same request id each time) before it counts as failed.
const ACQUIRE_ATTEMPTS: u32 = 3;
/// Lease indexes an acquire worker takes at a time, at least and at most (its session leases
/// are batched per tenant and group within the block; see `Acquirer::block`).
const ACQUIRE_BLOCK_MIN: u64 = 1_024;
const ACQUIRE_BLOCK_MAX: u64 = 131_072;
/// Session acquires per (tenant, group) a block aims at.
const ACQUIRE_BATCH_AIM: u64 = 64;
/// Individual acquires one worker has in flight at once (a block holds thousands of them).
const INDIVIDUAL_INFLIGHT_PER_WORKER: usize = 32;
/// Session acquires in one Batch request at most (the proposer's default entry size).
const ACQUIRE_BATCH_OPS: usize = 256;

/// The default storm size for N leases: N/10, at most 1,000,000.
pub fn default_storm_leases(leases: u64) -> u64 {
    (leases / 10).min(1_000_000)
}

/// The phases of the run, with their times since its start, and the one running now (for the
/// progress line).
struct Phases {
    start: Instant,
    done: Mutex<Vec<Value>>,
    current: Arc<Mutex<String>>,
}

impl Phases {
    fn new(start: Instant) -> Self {
        Phases {
            start,
            done: Mutex::new(Vec::new()),
            current: Arc::new(Mutex::new("start".into())),
        }
    }

    fn s(&self, at: Instant) -> f64 {
        at.saturating_duration_since(self.start).as_secs_f64()
    }

    fn begin(&self, name: &str, progress: bool) -> Instant {
        name.clone_into(&mut self.current.lock().unwrap_or_else(PoisonError::into_inner));
        if progress {
            eprintln!(
                "scale: [{:>6.1}s] {name}",
                self.start.elapsed().as_secs_f64()
            );
        }
        Instant::now()
    }

    /// Ends the phase begun at `from`; its window in run seconds.
    fn end(&self, name: &str, from: Instant) -> (f64, f64) {
        let window = (self.s(from), self.start.elapsed().as_secs_f64());
        self.done
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(json!({ "name": name, "from_s": window.0, "to_s": window.1 }));
        window
    }

    fn list(&self) -> Vec<Value> {
        self.done
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// The foreground: the mix, open loop at a fixed rate, recorded with a per-second timeline.
struct Foreground {
    recorder: Arc<Recorder>,
    reporter: Reporter,
    tasks: tokio::task::JoinSet<(u64, u64)>,
    started: Instant,
    workers: usize,
}

impl Foreground {
    fn start(
        target: &Arc<Target>,
        config: &ScaleConfig,
        until: Instant,
        phase: Arc<Mutex<String>>,
    ) -> Result<Foreground, ScenarioError> {
        let rate = config.foreground_rate_ops_per_s;
        // A fifth of a second per operation and worker: room for slow answers in open loop.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let workers = ((rate / 5.0).ceil() as usize).clamp(8, 1024);
        #[allow(clippy::cast_precision_loss)]
        let period = Duration::try_from_secs_f64(workers as f64 / rate)
            .ok()
            .filter(|period| *period <= Duration::from_secs(60))
            .ok_or_else(|| ScenarioError::Config(format!("foreground rate {rate} is too low")))?;
        let recorder = Arc::new(Recorder::new());
        let worker = Arc::new(MixWorker {
            target: target.clone(),
            recorder: recorder.clone(),
            scenario: ScenarioKind::Mixed,
            keys: config.keys.clone(),
            mix: config.mix,
            ttl: FOREGROUND_TTL,
            held_max: FOREGROUND_HELD_PER_WORKER,
            run_tag: config.run_tag,
        });
        let extra: ExtraLine = Arc::new(move || {
            format!(
                "  [{}]",
                phase.lock().unwrap_or_else(PoisonError::into_inner)
            )
        });
        let reporter = Reporter::start(
            recorder.clone(),
            Duration::ZERO,
            config.progress,
            Some(extra),
        );
        let started = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for index in 0..workers {
            #[allow(clippy::cast_precision_loss)]
            let offset = period.mul_f64(index as f64 / workers as f64);
            let worker = worker.clone();
            let rng = worker_rng(config.seed ^ 0x5ca1e, index);
            tasks.spawn(async move {
                worker
                    .run(index, rng, until, Some((started + offset, period)))
                    .await
            });
        }
        Ok(Foreground {
            recorder,
            reporter,
            tasks,
            started,
            workers,
        })
    }

    /// Stops it; its timeline (times shifted to seconds since `run_start`) and measured seconds.
    async fn finish(
        mut self,
        run_start: Instant,
    ) -> Result<(Arc<Recorder>, Vec<IntervalSample>, f64, usize), ScenarioError> {
        self.tasks.abort_all();
        while self.tasks.join_next().await.is_some() {}
        let (mut timeline, measured_s) = self.reporter.finish(Instant::now()).await?;
        let offset = self
            .started
            .saturating_duration_since(run_start)
            .as_secs_f64();
        for sample in &mut timeline {
            sample.t_s += offset;
        }
        Ok((self.recorder, timeline, measured_s, self.workers))
    }
}

/// Leases acquired so far, by part.
#[derive(Default)]
struct Held {
    main: AtomicU64,
    storm: AtomicU64,
    individual: AtomicU64,
}

impl Held {
    fn total(&self) -> u64 {
        self.main.load(Ordering::Relaxed)
            + self.storm.load(Ordering::Relaxed)
            + self.individual.load(Ordering::Relaxed)
    }
}

/// Names of the run's tenants: `<tenant>-<tag>-<part code><index>`.
#[derive(Clone)]
struct Names {
    prefix: String,
}

impl Names {
    fn tenant(&self, part: Part, index: u64) -> String {
        format!("{}{}{index}", self.prefix, char::from(part.code()))
    }

    fn tenants(&self, part: Part, count: u64) -> Vec<String> {
        (0..count).map(|index| self.tenant(part, index)).collect()
    }
}

/// What the acquire phase shares between its workers.
struct Acquirer {
    client: Client,
    plan: Plan,
    names: Names,
    main: Arc<SessionSet>,
    storm: Arc<SessionSet>,
    individual_ttl: Duration,
    holder: String,
    tag: u32,
    next: AtomicU64,
    held: Held,
    recorder: Arc<Recorder>,
}

impl Acquirer {
    /// One worker: takes the next block of lease indexes until all are taken or `deadline`.
    /// Session leases go out in Batch requests (one per tenant and group, at most
    /// [`ACQUIRE_BATCH_OPS`] each), as a fleet acquiring many leases at once would send them;
    /// an item a Batch could not grant is retried alone. Individual leases are acquired one
    /// request each, several at once, and their handles kept (the client library renews them).
    async fn worker(self: Arc<Self>, worker: usize, deadline: Instant) -> Vec<Lease> {
        let mut leases = Vec::new();
        loop {
            let block = self.block();
            let first = self.next.fetch_add(block, Ordering::Relaxed);
            if first >= self.plan.leases || Instant::now() >= deadline {
                return leases;
            }
            let last = (first + block).min(self.plan.leases);
            let mut batches: BTreeMap<(String, u32), Vec<(u64, LeaseOp)>> = BTreeMap::new();
            let mut individual = Vec::new();
            for index in first..last {
                let Some(op) = self.session_op(index) else {
                    individual.push(index);
                    continue;
                };
                let LeaseOp::AcquireInSession(request) = &op else {
                    continue;
                };
                match self.client.group_of(&request.key).await {
                    Ok(group) => batches
                        .entry((request.key.tenant_id.clone(), group))
                        .or_default()
                        .push((index, op)),
                    Err(_) => self.acquire_one(worker, index, &mut leases, deadline).await,
                }
            }
            for items in batches.into_values() {
                for chunk in items.chunks(ACQUIRE_BATCH_OPS) {
                    self.acquire_batch(worker, chunk, &mut leases, deadline)
                        .await;
                }
            }
            // The block's individual leases, one request each, at most
            // [`INDIVIDUAL_INFLIGHT_PER_WORKER`] at once.
            let mut tasks = tokio::task::JoinSet::new();
            for index in individual {
                while tasks.len() >= INDIVIDUAL_INFLIGHT_PER_WORKER {
                    if let Some(Ok(Some(lease))) = tasks.join_next().await {
                        leases.push(lease);
                    }
                }
                let acquirer = Arc::clone(&self);
                tasks.spawn(async move {
                    let mut got = Vec::new();
                    acquirer
                        .acquire_one(worker, index, &mut got, deadline)
                        .await;
                    got.pop()
                });
            }
            while let Some(joined) = tasks.join_next().await {
                if let Ok(Some(lease)) = joined {
                    leases.push(lease);
                }
            }
        }
    }

    /// Lease indexes a worker takes at a time: consecutive indexes go round the sessions, and
    /// so round every tenant, so a block is split over (tenant, group) pairs; the block is sized
    /// for about [`ACQUIRE_BATCH_AIM`] acquires per pair (64 groups assumed), within
    /// [`ACQUIRE_BLOCK_MIN`] and [`ACQUIRE_BLOCK_MAX`]. (At 10M leases over 20 tenants, fixed
    /// blocks of 1,024 sent Batches of about one acquire, at a fifth of the rate.)
    fn block(&self) -> u64 {
        let tenants = self.plan.main.tenants + self.plan.storm.tenants;
        (tenants.max(1) * 64 * ACQUIRE_BATCH_AIM).clamp(ACQUIRE_BLOCK_MIN, ACQUIRE_BLOCK_MAX)
    }

    /// The AcquireInSession of lease `index`, `None` for an individual lease.
    fn session_op(&self, index: u64) -> Option<LeaseOp> {
        let slot = self.plan.slot(index);
        let set = match slot.part {
            Part::Main => &self.main,
            Part::Storm => &self.storm,
            Part::Individual => return None,
        };
        let (session_id, tenant) = set.session(slot.session)?;
        let code = char::from(slot.part.code());
        Some(LeaseOp::AcquireInSession(SessionAcquireRequest {
            key: ResourceKey::new(tenant, format!("{code}{}", slot.index).as_str()),
            holder_id: set.owner().to_owned(),
            session_id,
            request_id: format!("{:08x}{code}{}", self.tag, slot.index),
        }))
    }

    /// Sends one Batch of session acquires (one tenant, one group); items it did not grant
    /// (or all of them, when the Batch itself failed) are retried one by one.
    async fn acquire_batch(
        &self,
        worker: usize,
        chunk: &[(u64, LeaseOp)],
        leases: &mut Vec<Lease>,
        deadline: Instant,
    ) {
        let ops: Vec<LeaseOp> = chunk.iter().map(|(_, op)| op.clone()).collect();
        let sent = Instant::now();
        let answer = tokio::time::timeout(OP_TIMEOUT, self.client.batch(ops)).await;
        let took = sent.elapsed();
        let results = match answer {
            Ok(Ok(results)) if results.len() == chunk.len() => results,
            _ => {
                for &(index, _) in chunk {
                    self.acquire_one(worker, index, leases, deadline).await;
                }
                return;
            }
        };
        for (&(index, _), result) in chunk.iter().zip(results) {
            match result {
                Ok(_) => {
                    self.recorder.record(worker, OpKind::Acquire, took, Ok(()));
                    self.count_held(self.plan.slot(index).part);
                }
                Err(_) => self.acquire_one(worker, index, leases, deadline).await,
            }
        }
    }

    fn count_held(&self, part: Part) {
        let counter = match part {
            Part::Main => &self.held.main,
            Part::Storm => &self.held.storm,
            Part::Individual => &self.held.individual,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Acquires lease `index` alone, retrying a retryable refusal up to [`ACQUIRE_ATTEMPTS`]
    /// times; an individual lease's handle goes to `leases`.
    async fn acquire_one(
        &self,
        worker: usize,
        index: u64,
        leases: &mut Vec<Lease>,
        deadline: Instant,
    ) {
        let slot = self.plan.slot(index);
        let code = char::from(slot.part.code());
        let resource = format!("{code}{}", slot.index);
        let request_id = format!("{:08x}{code}{}", self.tag, slot.index);
        for attempt in 1..=ACQUIRE_ATTEMPTS {
            let sent = Instant::now();
            let outcome = match slot.part {
                Part::Main | Part::Storm => {
                    let set = if slot.part == Part::Main {
                        &self.main
                    } else {
                        &self.storm
                    };
                    let Some((session_id, tenant)) = set.session(slot.session) else {
                        return;
                    };
                    let key = ResourceKey::new(tenant, resource.as_str());
                    tokio::time::timeout(
                        OP_TIMEOUT,
                        self.client.acquire_in_session(
                            &key,
                            set.owner(),
                            session_id,
                            Some(request_id.clone()),
                        ),
                    )
                    .await
                    .map(|answer| answer.map(drop))
                }
                Part::Individual => {
                    let options = AcquireOptions::new(
                        self.names.tenant(Part::Individual, slot.tenant),
                        resource.as_str(),
                        self.holder.as_str(),
                        self.individual_ttl,
                    )
                    .request_id(request_id.clone());
                    tokio::time::timeout(OP_TIMEOUT, self.client.acquire_with(options))
                        .await
                        .map(|answer| answer.map(|lease| leases.push(lease)))
                }
            };
            let (code, retry) = match &outcome {
                Ok(Ok(())) => (None, false),
                Ok(Err(error)) => (Some(error.code_str()), error.is_retryable()),
                Err(_) => (Some("DEADLINE_EXCEEDED"), true),
            };
            self.recorder.record(
                worker,
                OpKind::Acquire,
                sent.elapsed(),
                code.map_or(Ok(()), Err),
            );
            if code.is_none() {
                self.count_held(slot.part);
                return;
            }
            if !retry || attempt == ACQUIRE_ATTEMPTS || Instant::now() >= deadline {
                return;
            }
        }
    }
}

/// The new replica's row: the move's time, and when the new replica had applied its state,
/// against [`NEW_REPLICA_TARGET_S`] (met when both are within it; the move's alone when the
/// applied time is unknown); `-` when it was not measured (the node could not be added, did not
/// become active, no group to move), `missed` when the move was taken and did not finish.
fn new_replica_figure(measured: &new_replica::NewReplica, leases_per_group: f64) -> Value {
    let target = format!("<= {NEW_REPLICA_TARGET_S:.0} s per group share");
    let (Some(group), Some(from), Some(node)) = (measured.group, measured.from, measured.node)
    else {
        let why = measured.error.as_deref().unwrap_or("unknown");
        return figure(
            "10",
            &format!("new replica: not measured ({})", shorten(why)),
            "-".to_owned(),
            &target,
            None,
        );
    };
    let share = measured.lease_records.map_or_else(
        || format!("about {leases_per_group:.0} leases: held / groups"),
        |records| format!("{records:.0} lease records"),
    );
    let name =
        format!("new replica: group {group} ({share}) moved from node {from} to new node {node}");
    match (measured.move_s, &measured.error) {
        (Some(took), None) => figure(
            "10",
            &name,
            format!("{took:.2} s (applied {})", secs(measured.applied_s)),
            &target,
            Some(
                took <= NEW_REPLICA_TARGET_S
                    && measured
                        .applied_s
                        .is_none_or(|applied| applied <= NEW_REPLICA_TARGET_S),
            ),
        ),
        (_, error) => figure(
            "10",
            &format!("{name}: {}", shorten(error.as_deref().unwrap_or("no time"))),
            "-".to_owned(),
            &target,
            measured.move_started.then_some(false),
        ),
    }
}

/// At most 160 characters of `text` (a reason in a table row).
fn shorten(text: &str) -> String {
    const MAX_CHARS: usize = 160;
    if text.chars().count() <= MAX_CHARS {
        return text.to_owned();
    }
    let mut short: String = text.chars().take(MAX_CHARS).collect();
    short.push_str("...");
    short
}

/// A figure with its target: one row of the table.
fn figure(item: &str, name: &str, value: String, target: &str, met: Option<bool>) -> Value {
    json!({
        "item": item,
        "figure": name,
        "value": value,
        "target": target,
        "verdict": match met {
            Some(true) => "met",
            Some(false) => "missed",
            None => "-",
        },
    })
}

fn secs(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |s| format!("{s:.2} s"))
}

fn millis(us: Option<u64>) -> String {
    #[allow(clippy::cast_precision_loss)]
    us.map_or_else(
        || "-".to_owned(),
        |us| format!("{:.1} ms", us as f64 / 1000.0),
    )
}

fn count(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| format!("{v:.0}"))
}

fn mib(bytes: Option<u64>) -> String {
    #[allow(clippy::cast_precision_loss)]
    bytes.map_or_else(
        || "-".to_owned(),
        |b| format!("{:.0}", b as f64 / 1048576.0),
    )
}

/// `a / b / c` of a value per node.
fn per_node(readings: &[NodeReading], value: impl Fn(&NodeReading) -> String) -> String {
    readings.iter().map(value).collect::<Vec<_>>().join(" / ")
}

/// A metric summed over the nodes and divided by their count (`None` when no node exports it).
fn per_replica(readings: &[NodeReading], name: &str) -> Option<f64> {
    let values: Vec<f64> = readings.iter().filter_map(|r| r.value(name)).collect();
    if values.is_empty() {
        return None;
    }
    #[allow(clippy::cast_precision_loss)]
    let replicas = readings.len().max(1) as f64;
    Some(values.iter().sum::<f64>() / replicas)
}

/// Runs the scale scenario against `target` (the native client) on the cluster of
/// `config.nodes`, stopping and starting nodes through `control`.
#[allow(clippy::too_many_lines)]
pub async fn run_scale(
    target: Arc<Target>,
    config: &ScaleConfig,
    control: Arc<dyn NodeControl>,
) -> Result<RunOutcome, ScenarioError> {
    let Some(client) = target.tenure_client().cloned() else {
        return Err(ScenarioError::Config(
            "scale needs the tenure target (the native client library)".into(),
        ));
    };
    if config.nodes.is_empty() {
        return Err(ScenarioError::Config(
            "scale reads the nodes' metrics: give --cluster (its nodes' ids and HTTP addresses)"
                .into(),
        ));
    }
    if config.leases == 0 || config.session_share_percent > 100 {
        return Err(ScenarioError::Config(
            "scale needs --leases above 0 and --session-share-percent within 0..=100".into(),
        ));
    }
    if !(config.foreground_rate_ops_per_s.is_finite() && config.foreground_rate_ops_per_s > 0.0) {
        return Err(ScenarioError::Config(
            "--foreground-rate must be a positive number".into(),
        ));
    }
    if config.workers == 0
        || config.workers > 100_000
        || config.acquire_workers == 0
        || config.acquire_workers > 100_000
    {
        return Err(ScenarioError::Config(
            "workers and acquire workers must be within 1..=100000".into(),
        ));
    }
    let progress = config.progress;
    let tag = config.run_tag;
    let run_start = Instant::now();
    let phases = Phases::new(run_start);
    let tenant = target.tenure_tenant().unwrap_or("loadgen").to_owned();
    if client.routing().groups == 0 {
        client
            .refresh_routing()
            .await
            .map_err(|error| ScenarioError::Config(format!("routing: {error}")))?;
    }
    let groups = client.routing().groups;
    let storm_wanted = config
        .storm_leases
        .unwrap_or_else(|| default_storm_leases(config.leases));
    let plan = Plan::new(
        config.leases,
        u64::from(config.session_share_percent),
        config.sessions,
        storm_wanted,
        None,
        config.leases_per_tenant,
    );
    let names = Names {
        prefix: format!("{tenant}-{tag:08x}-"),
    };
    let main_set = Arc::new(SessionSet::new(
        "main",
        tag,
        Part::Main.code(),
        names.tenants(Part::Main, plan.main.tenants),
        plan.main.sessions,
        groups,
        config.session_ttl,
    ));
    let storm_set = Arc::new(SessionSet::new(
        "storm",
        tag,
        Part::Storm.code(),
        names.tenants(Part::Storm, plan.storm.tenants),
        plan.storm.sessions,
        groups,
        config.session_ttl,
    ));
    if progress {
        eprintln!(
            "scale: {} leases over {groups} groups: {} in {} sessions ({} tenants), {} storm \
             leases in {} sessions ({} tenants), {} held on their own ({} tenants, ttl {:?}); \
             session ttl {:?}; foreground {} ops/s",
            plan.leases,
            plan.main.leases,
            plan.main.sessions,
            plan.main.tenants,
            plan.storm.leases,
            plan.storm.sessions,
            plan.storm.tenants,
            plan.individual.leases,
            plan.individual.tenants,
            config.individual_ttl,
            config.session_ttl,
            config.foreground_rate_ops_per_s,
        );
    }
    let reader = Arc::new(NodeReader::new(&config.nodes, control.clone()));
    let sampler = Sampler::start(reader.clone(), run_start);
    let probe_keys = Arc::new(
        probe::ProbeKeys::find(
            &client,
            format!("{}probe", names.prefix),
            format!("lg{tag:08x}-probe"),
            groups,
        )
        .await?,
    );

    // 1. The mixed throughput, saturated, closed loop, on the empty cluster.
    let from = phases.begin("mixed throughput (saturated)", progress);
    let saturated = LoadConfig {
        scenario: ScenarioKind::Mixed,
        duration: config.saturation,
        warmup: Duration::ZERO,
        workers: config.workers,
        rate_ops_per_s: None,
        keys: config.keys.clone(),
        mix: config.mix,
        ttl: FOREGROUND_TTL,
        leases: 0,
        held_per_worker_max: FOREGROUND_HELD_PER_WORKER,
        acquire_phase_max: config.acquire_phase_max,
        sessions: 0,
        session_end: SessionEnd::Expire,
        waiters: Vec::new(),
        node_metrics_urls: Vec::new(),
        seed: config.seed,
        run_tag: tag,
        progress: false,
    };
    let saturated = super::run_mix(target.clone(), &saturated).await?;
    phases.end("mixed throughput (saturated)", from);
    #[allow(clippy::cast_precision_loss)]
    let mixed_ops_per_s = saturated.ops_total as f64 / saturated.measured_s.max(1e-9);
    if progress {
        eprintln!(
            "scale: mixed throughput {mixed_ops_per_s:.0} ops/s ({} workers, p99 {:.1} ms)",
            config.workers,
            super::ms(saturated.latency_us.p99)
        );
    }

    // The foreground, from here to the end (bounded by the sum of the phases' bounds); its
    // first seconds, while the saturated phase's last operations drain, are measured by no
    // window.
    let run_bound = config.acquire_phase_max
        + config.node_bound * 7
        + config.window * 2
        + config.session_ttl * 3
        + Duration::from_secs(600);
    let foreground = Foreground::start(
        &target,
        config,
        Instant::now() + run_bound,
        phases.current.clone(),
    )?;
    tokio::time::sleep(config.settle).await;

    // The foreground's "before" window, on the undisturbed empty cluster.
    let from = phases.begin("before", progress);
    tokio::time::sleep(config.window).await;
    let before_window = phases.end("before", from);

    // 2. A failover on the empty cluster.
    let from = phases.begin("failover (empty)", progress);
    let failover_empty = probe::failover(
        &client,
        control.as_ref(),
        &config.nodes,
        &probe_keys,
        config.node_bound,
    )
    .await?;
    reader.forget_pids().await;
    phases.end("failover (empty)", from);
    if progress {
        eprintln!("scale: failover (empty): {}", failover_empty.figures());
    }
    tokio::time::sleep(config.settle).await;

    // The nodes before (every one running since the failover's restart at the latest).
    let nodes_before = reader.read().await;
    let loadgen_rss_before = process_rss_bytes();

    // 3. N leases.
    let from = phases.begin("acquire", progress);
    let acquire_deadline = Instant::now() + config.acquire_phase_max;
    let (main_opened, main_open_refused) = main_set.open(&client, acquire_deadline).await;
    let (storm_opened, storm_open_refused) = storm_set.open(&client, acquire_deadline).await;
    let main_keeper = main_set.keep_alive(&client);
    let storm_keeper = storm_set.keep_alive(&client);
    let acquire_recorder = Arc::new(Recorder::new());
    let acquirer = Arc::new(Acquirer {
        client: client.clone(),
        plan: plan.clone(),
        names: names.clone(),
        main: main_set.clone(),
        storm: storm_set.clone(),
        individual_ttl: config.individual_ttl,
        holder: format!("lg{tag:08x}"),
        tag,
        next: AtomicU64::new(0),
        held: Held::default(),
        recorder: acquire_recorder.clone(),
    });
    let extra: ExtraLine = {
        let acquirer = acquirer.clone();
        Arc::new(move || {
            format!(
                "  held {} of {}, loadgen RSS {} MiB",
                acquirer.held.total(),
                acquirer.plan.leases,
                mib(process_rss_bytes())
            )
        })
    };
    let acquire_reporter = Reporter::start(
        acquire_recorder.clone(),
        Duration::ZERO,
        progress,
        Some(extra),
    );
    let acquire_started = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for worker in 0..config.acquire_workers {
        workers.spawn(acquirer.clone().worker(worker, acquire_deadline));
    }
    let mut individual: Vec<Lease> = Vec::new();
    while let Some(joined) = workers.join_next().await {
        individual.extend(joined.map_err(|error| ScenarioError::Worker(error.to_string()))?);
    }
    let acquire_s = acquire_started.elapsed().as_secs_f64();
    let _ = acquire_reporter.finish(Instant::now()).await?;
    phases.end("acquire", from);
    let acquire_figures = phase_figures(&acquire_recorder, acquire_s);
    let held_after_acquire = acquirer.held.total();
    #[allow(clippy::cast_precision_loss)]
    let acquire_rate = held_after_acquire as f64 / acquire_s.max(1e-9);
    if progress {
        eprintln!(
            "scale: acquired {held_after_acquire} of {} leases in {acquire_s:.1} s \
             ({acquire_rate:.0}/s); errors {}",
            plan.leases, acquire_figures["errors"]
        );
    }

    // 4. Holding them: a steady window.
    tokio::time::sleep(config.settle).await;
    let from = phases.begin("hold", progress);
    tokio::time::sleep(config.window).await;
    let hold_window = phases.end("hold", from);
    // 5. The nodes after, and what is held.
    let nodes_after = reader.read().await;
    let loadgen_rss_holding = process_rss_bytes();
    let individual_valid = individual.iter().filter(|lease| lease.is_valid()).count() as u64;
    let main_stats = main_set.stats();
    let storm_stats = storm_set.stats();
    let session_bound = main_stats.last_round_bound_leases + storm_stats.last_round_bound_leases;
    let held_now = individual_valid + session_bound;
    let cluster_active = reader
        .metrics()
        .gauge_sum(sampler::ACTIVE_LEASES)
        .await
        .ok();
    if progress {
        eprintln!(
            "scale: holding {held_now} ({individual_valid} on their own valid, {session_bound} \
             bound to live session records); the nodes count {} active leases",
            count(cluster_active)
        );
    }

    // 7. A restart of a follower-heavy node with N leases.
    let from = phases.begin("restart (N held)", progress);
    let restart = probe::restart(
        &client,
        control.as_ref(),
        &config.nodes,
        config.settle,
        config.node_bound,
    )
    .await?;
    reader.forget_pids().await;
    phases.end("restart (N held)", from);
    if progress {
        eprintln!("scale: restart: {}", restart.figures());
    }
    tokio::time::sleep(config.settle).await;

    // 8. A failover with N leases.
    let from = phases.begin("failover (N held)", progress);
    let failover_held = probe::failover(
        &client,
        control.as_ref(),
        &config.nodes,
        &probe_keys,
        config.node_bound,
    )
    .await?;
    reader.forget_pids().await;
    phases.end("failover (N held)", from);
    if progress {
        eprintln!("scale: failover (N held): {}", failover_held.figures());
    }
    tokio::time::sleep(config.settle).await;

    // 9. The expiry storm.
    let from = phases.begin("storm: before", progress);
    tokio::time::sleep(config.window.min(STORM_BEFORE_MAX)).await;
    let storm_before = phases.end("storm: before", from);
    let from = phases.begin("storm", progress);
    storm_keeper.stop().await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let metrics = NodeMetrics::new(
        &config
            .nodes
            .iter()
            .map(|node| node.http_url.clone())
            .collect::<Vec<_>>(),
    );
    let ended_at_start = metrics
        .counter_sum(sampler::SESSION_LEASES_ENDED)
        .await
        .ok();
    let end = storm_set
        .last_keepalive(&client, Instant::now() + config.node_bound)
        .await;
    let storm_held = end.bound_leases;
    let (end_earliest, end_latest) = (
        end.earliest + config.session_ttl,
        end.latest + config.session_ttl,
    );
    if progress {
        eprintln!(
            "scale: storm: {storm_held} leases in {} records kept alive one last time ({} \
             refused); they end within {:.1} s",
            storm_set.records(),
            end.refused,
            end_latest
                .saturating_duration_since(Instant::now())
                .as_secs_f64()
        );
    }
    let watched = match ended_at_start {
        Some(at_start) if storm_held > 0 => Some(
            watch_ended(
                metrics.clone(),
                at_start,
                storm_held,
                end_earliest
                    .checked_sub(Duration::from_millis(200))
                    .unwrap_or(end_earliest),
                end_latest + config.node_bound,
            )
            .await,
        ),
        _ => None,
    };
    let all_ended = watched.as_ref().and_then(|w| w.all_ended);
    let during_to = all_ended.unwrap_or_else(Instant::now) + config.settle;
    tokio::time::sleep_until(during_to.into()).await;
    phases.end("storm", from);
    let storm_during = (phases.s(end_earliest.min(during_to)), phases.s(during_to));
    let reclaim_s = all_ended.map(|at| signed_s(at, end_latest));
    if progress {
        eprintln!(
            "scale: storm: {} of {storm_held} ended; all {} after the latest possible expiry",
            watched.as_ref().map_or(0, |w| w.ended),
            secs(reclaim_s)
        );
    }

    // 10. A new replica: a node joins and one group's replica moves to it. Last: the placement
    // controller may go on balancing onto the new node afterwards.
    let from = phases.begin("new replica", progress);
    let new_replica = new_replica::new_replica(
        &client,
        control.as_ref(),
        &config.nodes,
        groups,
        config.node_bound,
    )
    .await;
    phases.end("new replica", from);
    if progress {
        eprintln!("scale: new replica: {}", new_replica.figures());
    }

    // The end: stop keeping anything alive (the leases end by expiry), the foreground, the
    // sampler.
    main_keeper.stop().await;
    for lease in individual {
        let _ = lease.detach();
    }
    let (recorder, timeline, measured_s, foreground_workers) = foreground.finish(run_start).await?;
    let sampled = sampler.finish().await;

    // The foreground's windows.
    let before = window(&timeline, before_window.0, before_window.1);
    let hold = window(&timeline, hold_window.0, hold_window.1);
    let storm_fg_before = window(&timeline, storm_before.0, storm_before.1);
    let storm_fg_during = window(&timeline, storm_during.0, storm_during.1);
    let move_fg = new_replica.window.map_or(Value::Null, |(from, to)| {
        window(&timeline, phases.s(from), phases.s(to))
    });
    let ratio = |before: &Value, during: &Value| match (
        before["p99_us"].as_u64(),
        during["p99_us"].as_u64(),
    ) {
        #[allow(clippy::cast_precision_loss)]
        (Some(before), Some(during)) if before > 0 => Some(during as f64 / before as f64),
        _ => None,
    };
    let hold_ratio = ratio(&before, &hold);
    let storm_ratio = ratio(&storm_fg_before, &storm_fg_during);
    // A "before" p99 past a second means the open-loop foreground was still behind its schedule
    // (a backlog from an earlier phase): no reference to compare the storm with.
    let storm_before_behind = storm_fg_before["p99_us"]
        .as_u64()
        .is_some_and(|p99_us| p99_us > FOREGROUND_BEHIND_P99_US);

    // Memory per lease.
    let deltas: Vec<i128> = nodes_before
        .iter()
        .zip(&nodes_after)
        .filter_map(|(before, after)| {
            Some(i128::from(after.rss_bytes?) - i128::from(before.rss_bytes?))
        })
        .collect();
    #[allow(clippy::cast_precision_loss)]
    let bytes_per_lease = (!deltas.is_empty() && held_now > 0)
        .then(|| deltas.iter().sum::<i128>() as f64 / deltas.len() as f64 / held_now as f64);
    #[allow(clippy::cast_precision_loss)]
    let loadgen_bytes_per_lease = match (loadgen_rss_before, loadgen_rss_holding) {
        (Some(before), Some(after)) if held_now > 0 => {
            Some((i128::from(after) - i128::from(before)) as f64 / held_now as f64)
        }
        _ => None,
    };
    let snapshots = sampled.snapshot_figures();

    // The table.
    #[allow(clippy::cast_precision_loss)]
    let acquire_target_s = plan.leases as f64 / mixed_ops_per_s.max(1e-9);
    let empty_s = failover_empty.all_served_s;
    let held_s = failover_held.all_served_s;
    let failover_same = match (empty_s, held_s) {
        (Some(empty), Some(held)) => {
            Some(held <= (empty * FAILOVER_SAME_FACTOR).max(empty + FAILOVER_SAME_SLACK_S))
        }
        _ => Some(false).filter(|_| held_s.is_none()),
    };
    let pause_max = snapshots["apply_pause_seconds_max"].as_f64();
    let pauses_over = snapshots["apply_pauses_over_10ms"].as_f64();
    let shared_apply_max = snapshots["shared_apply_seconds_max"].as_f64();
    let shared_applies_over = snapshots["shared_applies_over_10ms"].as_f64();
    let pause_cpu_max = snapshots["apply_pause_cpu_seconds_max"].as_f64();
    let shared_apply_cpu_max = snapshots["shared_apply_cpu_seconds_max"].as_f64();
    let pause_less_wait_max = snapshots["apply_pause_less_core_wait_seconds_max"].as_f64();
    let pauses_less_wait_over = snapshots["apply_pauses_less_core_wait_over_10ms"].as_f64();
    let shared_less_wait_max = snapshots["shared_apply_less_core_wait_seconds_max"].as_f64();
    let shared_less_wait_over = snapshots["shared_applies_less_core_wait_over_10ms"].as_f64();
    // A longest time and a count over 10 ms, or "-" when the nodes do not export them.
    let longest_and_over = |max_s: Option<f64>, over: Option<f64>| match max_s {
        Some(max_s) => format!("{:.1} ms; {}", max_s * 1000.0, count(over)),
        None => "-".to_owned(),
    };
    // Wall time, with the thread's CPU time beside it when the nodes export it.
    let wall_and_cpu = |wall_s: Option<f64>, cpu_s: Option<f64>| {
        let ms = |s: f64| format!("{:.1} ms", s * 1000.0);
        match (wall_s, cpu_s) {
            (Some(wall_s), Some(cpu_s)) => format!("{} (CPU {})", ms(wall_s), ms(cpu_s)),
            (Some(wall_s), None) => ms(wall_s),
            _ => "-".to_owned(),
        }
    };
    let restart_s = restart.catch_up.caught_up_s;
    let lease_records = per_replica(&nodes_after, sampler::LEASE_RECORDS);
    let dedup_records = per_replica(&nodes_after, sampler::DEDUP_RECORDS);
    let storm_ended = watched.as_ref().map(|w| w.ended);
    #[allow(clippy::cast_precision_loss)]
    let leases_per_group = held_now as f64 / f64::from(groups.max(1));
    let figures = vec![
        figure(
            "1",
            &format!(
                "mixed throughput, saturated ({} workers, {:.0} s)",
                config.workers,
                config.saturation.as_secs_f64()
            ),
            format!("{mixed_ops_per_s:.0} ops/s"),
            "reference",
            None,
        ),
        figure(
            "2",
            &format!(
                "failover, empty: kill node {} (led {} groups) -> every group serves",
                failover_empty.node, failover_empty.led_groups
            ),
            secs(empty_s),
            "reference",
            None,
        ),
        figure(
            "3",
            "leases held after acquiring",
            format!("{held_after_acquire} of {}", plan.leases),
            "all",
            Some(held_after_acquire == plan.leases),
        ),
        figure(
            "3",
            "acquire time",
            format!("{acquire_s:.1} s"),
            &format!("<= N / mixed = {acquire_target_s:.1} s"),
            Some(acquire_s <= acquire_target_s),
        ),
        figure(
            "3",
            "acquire rate",
            format!("{acquire_rate:.0} leases/s"),
            &format!(">= {mixed_ops_per_s:.0}/s"),
            Some(acquire_rate >= mixed_ops_per_s),
        ),
        figure(
            "3",
            "load generator RSS before / holding (MiB); bytes per lease",
            format!(
                "{} / {}; {}",
                mib(loadgen_rss_before),
                mib(loadgen_rss_holding),
                loadgen_bytes_per_lease.map_or_else(|| "-".to_owned(), |b| format!("{b:.0}"))
            ),
            "-",
            None,
        ),
        figure(
            "4",
            "leases held at the end of the hold window",
            format!("{held_now} of {}", plan.leases),
            "all",
            Some(held_now == plan.leases),
        ),
        figure(
            "4",
            "foreground ops/s before / holding",
            format!(
                "{} / {}",
                count(before["ops_per_s"].as_f64()),
                count(hold["ops_per_s"].as_f64())
            ),
            &format!("{:.0}", config.foreground_rate_ops_per_s),
            None,
        ),
        figure(
            "4",
            "foreground p99 before / holding",
            format!(
                "{} / {} ({})",
                millis(before["p99_us"].as_u64()),
                millis(hold["p99_us"].as_u64()),
                hold_ratio.map_or_else(|| "-".to_owned(), |r| format!("{r:.2}x"))
            ),
            "-",
            None,
        ),
        figure(
            "5",
            "node RSS before (MiB, per node)",
            per_node(&nodes_before, |r| mib(r.rss_bytes)),
            "-",
            None,
        ),
        figure(
            "5",
            "node RSS holding (MiB, per node)",
            per_node(&nodes_after, |r| mib(r.rss_bytes)),
            "-",
            None,
        ),
        figure(
            "5",
            "bytes per active lease per replica (RSS growth / leases held)",
            bytes_per_lease.map_or_else(|| "-".to_owned(), |b| format!("{b:.0}")),
            &format!("<= {LEASE_BYTES_TARGET:.0} (lease state)"),
            bytes_per_lease.map(|b| b <= LEASE_BYTES_TARGET),
        ),
        figure(
            "5",
            "lease records per replica / request-id records per replica",
            format!("{} / {}", count(lease_records), count(dedup_records)),
            "-",
            None,
        ),
        figure(
            "6",
            "snapshots built; total / longest build",
            format!(
                "{}; {} / {}",
                count(snapshots["builds"].as_f64()),
                secs(snapshots["build_seconds_total"].as_f64()),
                secs(snapshots["build_seconds_max"].as_f64())
            ),
            "-",
            None,
        ),
        figure(
            "6",
            "largest snapshot (MiB)",
            snapshots["bytes_max"]
                .as_f64()
                .map_or_else(|| "-".to_owned(), |b| format!("{:.1}", b / 1048576.0)),
            "-",
            None,
        ),
        figure(
            "6",
            "longest apply pause of a build's freeze (wall; the applying thread's CPU)",
            wall_and_cpu(pause_max, pause_cpu_max),
            "<= 10 ms",
            pause_max.map(|s| s <= APPLY_PAUSE_TARGET_S),
        ),
        figure(
            "6",
            "apply pauses over 10 ms",
            count(pauses_over),
            "0",
            pauses_over.map(|n| n < 0.5),
        ),
        figure(
            "6",
            "longest entry apply beside a frozen copy (chunk copies); over 10 ms",
            format!(
                "{}; {}",
                wall_and_cpu(shared_apply_max, shared_apply_cpu_max),
                count(shared_applies_over)
            ),
            "<= 10 ms; 0",
            shared_apply_max
                .zip(shared_applies_over)
                .map(|(max_s, over)| max_s <= APPLY_PAUSE_TARGET_S && over < 0.5),
        ),
        // Not judged (the bound is on wall time): the two above less the applying thread's
        // wait for a core, which tells the snapshot's own cost from the machine's scheduling.
        figure(
            "6",
            "  the freeze's pause less the thread's wait for a core: longest; over 10 ms",
            longest_and_over(pause_less_wait_max, pauses_less_wait_over),
            "-",
            None,
        ),
        figure(
            "6",
            "  an apply beside a frozen copy less the wait for a core: longest; over 10 ms",
            longest_and_over(shared_less_wait_max, shared_less_wait_over),
            "-",
            None,
        ),
        figure(
            "7",
            &format!(
                "restart with N: node {} (led {} groups) started -> ready and caught up",
                restart.node, restart.led_groups
            ),
            format!(
                "{} (ready {})",
                secs(restart_s),
                secs(restart.catch_up.ready_s)
            ),
            &format!("<= {RESTART_TARGET_S:.0} s"),
            Some(restart_s.is_some_and(|s| s <= RESTART_TARGET_S)),
        ),
        figure(
            "8",
            &format!(
                "failover with N: kill node {} (led {} groups) -> every group serves",
                failover_held.node, failover_held.led_groups
            ),
            format!("{} (empty: {})", secs(held_s), secs(empty_s)),
            "same as empty",
            failover_same,
        ),
        figure(
            "9",
            "storm: leases ended / held in the storm's sessions",
            format!(
                "{} / {storm_held}",
                storm_ended.map_or_else(|| "-".to_owned(), |n| n.to_string())
            ),
            "all",
            Some(storm_held > 0 && storm_ended.is_some_and(|n| n >= storm_held)),
        ),
        figure(
            "9",
            "storm: all reclaimed, after the latest possible expiry",
            secs(reclaim_s),
            &format!("<= {STORM_RECLAIM_TARGET_S:.0} s"),
            Some(reclaim_s.is_some_and(|s| s <= STORM_RECLAIM_TARGET_S)),
        ),
        figure(
            "9",
            "storm: foreground p99 before / during",
            format!(
                "{} / {} ({})",
                millis(storm_fg_before["p99_us"].as_u64()),
                millis(storm_fg_during["p99_us"].as_u64()),
                match storm_ratio {
                    Some(r) if storm_before_behind => format!("{r:.2}x, before: behind schedule"),
                    Some(r) => format!("{r:.2}x"),
                    None => "-".to_owned(),
                }
            ),
            &format!("<= {STORM_P99_RATIO_TARGET:.0}x"),
            storm_ratio
                .filter(|_| !storm_before_behind)
                .map(|r| r <= STORM_P99_RATIO_TARGET),
        ),
        new_replica_figure(&new_replica, leases_per_group),
    ];

    let details = json!({
        "figures": figures,
        "plan": {
            "leases": plan.leases,
            "groups": groups,
            "session_share_percent": plan.session_share_percent,
            "main": { "leases": plan.main.leases, "sessions": plan.main.sessions, "tenants": plan.main.tenants },
            "storm": { "leases": plan.storm.leases, "sessions": plan.storm.sessions, "tenants": plan.storm.tenants },
            "individual": { "leases": plan.individual.leases, "tenants": plan.individual.tenants,
                            "ttl_ms": u64::try_from(config.individual_ttl.as_millis()).unwrap_or(u64::MAX) },
            "session_ttl_ms": u64::try_from(config.session_ttl.as_millis()).unwrap_or(u64::MAX),
            "tenant_prefix": names.prefix,
        },
        "mixed_throughput": {
            "ops_per_s": mixed_ops_per_s,
            "workers": config.workers,
            "seconds": saturated.measured_s,
            "latency_us": saturated.latency_us,
        },
        "failover_empty": failover_empty.figures(),
        "failover_held": failover_held.figures(),
        "acquire": {
            "workers": config.acquire_workers,
            "phase": acquire_figures,
            "seconds": acquire_s,
            "held": held_after_acquire,
            "held_in_sessions": acquirer.held.main.load(Ordering::Relaxed),
            "held_in_storm_sessions": acquirer.held.storm.load(Ordering::Relaxed),
            "held_on_their_own": acquirer.held.individual.load(Ordering::Relaxed),
            "leases_per_s": acquire_rate,
            "target_seconds": acquire_target_s,
            "session_records_opened": main_opened + storm_opened,
            "session_records": main_set.records() + storm_set.records(),
            "session_open_refused": { "main": main_open_refused, "storm": storm_open_refused },
        },
        "hold": {
            "held": held_now,
            "held_on_their_own_valid": individual_valid,
            "bound_to_session_records": session_bound,
            "cluster_active_leases": cluster_active,
            "foreground_before": before,
            "foreground_holding": hold,
            "p99_holding_over_before": hold_ratio,
        },
        "memory": {
            "nodes_before": nodes_before.iter().map(NodeReading::figures).collect::<Vec<_>>(),
            "nodes_holding": nodes_after.iter().map(NodeReading::figures).collect::<Vec<_>>(),
            "bytes_per_active_lease_per_replica": bytes_per_lease,
            "lease_records_per_replica": lease_records,
            "dedup_records_per_replica": dedup_records,
            "loadgen_rss_bytes_before": loadgen_rss_before,
            "loadgen_rss_bytes_holding": loadgen_rss_holding,
            "loadgen_bytes_per_lease": loadgen_bytes_per_lease,
            "note": "RSS growth over the acquire phase and the hold window, per node, divided by \
                     the leases held: it includes the request-id records of the acquires (and \
                     renewals) and allocator slack, not only lease state",
        },
        "snapshots": snapshots,
        "restart": restart.figures(),
        "storm": {
            "leases": storm_held,
            "records": storm_set.records(),
            "records_refused": end.refused,
            "record_errors": end.errors,
            "end_window_ms": end_latest.saturating_duration_since(end_earliest).as_secs_f64() * 1000.0,
            "ended": storm_ended,
            "counter_readable": ended_at_start.is_some(),
            "all_ended_after_latest_end_s": reclaim_s,
            "first_ended_after_latest_end_s": watched.as_ref().and_then(|w| w.first_ended).map(|at| signed_s(at, end_latest)),
            "counter_scrape_errors": watched.as_ref().map(|w| w.scrape_errors),
            "foreground_before": storm_fg_before,
            "foreground_during": storm_fg_during,
            "p99_during_over_before": storm_ratio,
        },
        "new_replica": {
            "figures": new_replica.figures(),
            "leases_held_per_group": leases_per_group,
            "foreground_during_move": move_fg,
            "target_s": NEW_REPLICA_TARGET_S,
            "note": "move_s: the wall time of Client::move_replica (the new replica created, its \
                     snapshot or log sent, its catch-up as a learner, the joint-consensus voter \
                     change, the old replica dropped); applied_s: until the new node's replica \
                     had applied the leader's last log index of the move's answer (its Status, \
                     every 100 ms); lease_records_on_new_node: the new node's \
                     tenure_state_lease_records (active and retained inactive records) read \
                     1.25 s after that, when the node hosts only the moved group, else null and \
                     the group share is leases_held_per_group (leases held / groups); no node \
                     exports the size of one snapshot transfer (leader_snapshot_bytes_max is \
                     the leader's largest build of any group)",
        },
        "sessions": [main_set.figures(), storm_set.figures()],
        "foreground": {
            "rate_ops_per_s": config.foreground_rate_ops_per_s,
            "workers": foreground_workers,
            "ttl_ms": u64::try_from(FOREGROUND_TTL.as_millis()).unwrap_or(u64::MAX),
        },
        "phases": phases.list(),
        "node_rss_series": sampled.rss_series(),
        "node_scrape_failures": sampled.scrape_failures,
        "run_s": run_start.elapsed().as_secs_f64(),
    });
    Ok(RunOutcome::of_operations(
        &recorder, measured_s, timeline, details,
    ))
}
