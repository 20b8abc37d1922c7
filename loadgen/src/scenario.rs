//! The workloads: who does what, when, and what is recorded.
//!
//! - `acquire`: every operation acquires a resource never used before.
//! - `mixed`: the operation mix (default 20% acquire, 70% renew, 10% release) over a keyspace
//!   (default one million keys, uniform). Each worker renews and releases leases it holds
//!   itself (at most [`LoadConfig::held_per_worker_max`]; beyond that the oldest is forgotten
//!   and left to expire). A renew or release with nothing held becomes an acquire.
//! - `contended`: the same mix on a small keyspace with Zipf-distributed keys, so most acquires
//!   meet a held resource.
//! - `hold`: acquire K leases, then keep them alive for the duration and report the steady-state
//!   cost. tenure's client library renews them by itself in coalesced batches; for the other
//!   targets the load generator renews each lease every ttl/3 (what etcd's own Go client does,
//!   one keep-alive per lease per period) and records those renewals' latency.
//!   With `sessions` S > 0 (tenure only), the K leases are acquired in S sessions instead
//!   (round robin), which keep them alive with one keep-alive per (session, group) per third of
//!   the ttl; the report counts keep-alive requests instead of renewals.
//! - `expiry`: K leases that all expire at once while background traffic (the mix) runs; it
//!   reports how long until every one is reclaimed by a new holder, and the background's
//!   throughput and p99 before and during the reclaim. With `sessions` S > 0 (tenure only), the
//!   K leases are acquired in S sessions whose records all end together (expire, or `close`);
//!   it reports how long the nodes took to end every bound lease (their own counter), and the
//!   background's p99 during that against before it (`session_expiry`).
//!
//! - `handoff` (tenure only): with 1, 10 and 1,000 waiters queued on a held resource, the
//!   latency from a release to the next waiter's grant being answered, and the requests per
//!   hand-off (`handoff`).
//! - `scale` (tenure only, with a node control): a cluster driven to N active leases, with its
//!   memory, snapshots, restart, failovers and an expiry storm measured while a foreground mix
//!   runs ([`scale`], run by [`scale::run_scale`], not by [`run`]).
//!
//! Closed loop: each worker waits for its answer before issuing the next operation. Open loop
//! (`rate` set; `acquire`, `mixed`, `contended`): each worker has a fixed schedule at
//! `rate / workers`, and latency runs from the intended start, so an operation delayed by a
//! stall is charged for the time it waited (no coordinated omission). Too few workers for the
//! rate shows as an achieved rate below the target.
//!
//! Every run is bounded: the workers stop at the end of the duration, the hold and expiry
//! phases have deadlines, and each operation is bounded by the target's timeout.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use serde_json::{Value, json};

use crate::keys::{KeyChooser, resource_name, unique_resource_name};
use crate::stats::{IntervalSample, OpKind, OpSummary, Percentiles, Recorder};
use crate::target::{HeldLease, HoldHandle, Target};

mod handoff;
pub mod scale;
mod session_expiry;
pub use handoff::HAND_OFFS_MIN;
pub use session_expiry::SessionEnd;

/// The workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ScenarioKind {
    /// Acquires of unique keys.
    Acquire,
    /// The operation mix over a large keyspace.
    Mixed,
    /// K leases kept alive; steady-state renewal cost.
    Hold,
    /// The mix on a small Zipf keyspace.
    Contended,
    /// K leases expiring at once; time to reclaim all, and the effect on other traffic.
    Expiry,
    /// Hand-offs from a release to the next queued waiter (tenure only).
    Handoff,
    /// N active leases: memory, snapshots, restart, failovers, an expiry storm (tenure only;
    /// [`scale::run_scale`]).
    Scale,
}

impl ScenarioKind {
    /// Name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            ScenarioKind::Acquire => "acquire",
            ScenarioKind::Mixed => "mixed",
            ScenarioKind::Hold => "hold",
            ScenarioKind::Contended => "contended",
            ScenarioKind::Expiry => "expiry",
            ScenarioKind::Handoff => "handoff",
            ScenarioKind::Scale => "scale",
        }
    }
}

/// Relative weights of the operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Mix {
    /// Weight of acquire.
    pub acquire: u32,
    /// Weight of renew.
    pub renew: u32,
    /// Weight of release.
    pub release: u32,
    /// Weight of get.
    pub get: u32,
}

impl Mix {
    /// 20% acquire, 70% renew, 10% release.
    pub const MIXED: Mix = Mix {
        acquire: 20,
        renew: 70,
        release: 10,
        get: 0,
    };

    /// Parses `acquire=20,renew=70,release=10[,get=0]`.
    pub fn parse(text: &str) -> Result<Mix, String> {
        let mut mix = Mix {
            acquire: 0,
            renew: 0,
            release: 0,
            get: 0,
        };
        for part in text.split(',').filter(|part| !part.trim().is_empty()) {
            let (name, weight) = part
                .split_once('=')
                .ok_or_else(|| format!("{part:?}: expected op=weight"))?;
            let weight: u32 = weight
                .trim()
                .parse()
                .map_err(|_| format!("{part:?}: weight must be a whole number"))?;
            if weight > 1_000_000 {
                return Err(format!("{part:?}: weight above 1000000"));
            }
            match name.trim() {
                "acquire" => mix.acquire = weight,
                "renew" => mix.renew = weight,
                "release" => mix.release = weight,
                "get" => mix.get = weight,
                other => return Err(format!("unknown operation {other:?}")),
            }
        }
        if mix.total() == 0 {
            return Err("the mix has no operation with a weight above 0".into());
        }
        Ok(mix)
    }

    fn total(&self) -> u32 {
        self.acquire + self.renew + self.release + self.get
    }

    fn pick(&self, rng: &mut impl Rng) -> OpKind {
        let mut roll = rng.random_range(0..self.total());
        for (op, weight) in [
            (OpKind::Acquire, self.acquire),
            (OpKind::Renew, self.renew),
            (OpKind::Release, self.release),
        ] {
            if roll < weight {
                return op;
            }
            roll -= weight;
        }
        OpKind::Get
    }
}

/// Everything a run needs besides the target.
#[derive(Debug, Clone)]
pub struct LoadConfig {
    /// The workload.
    pub scenario: ScenarioKind,
    /// Measured time (after the warm-up). For `hold`, the steady window; for `expiry`, the
    /// bound of the whole run.
    pub duration: Duration,
    /// Time before measuring (its operations are not recorded).
    pub warmup: Duration,
    /// Concurrent workers.
    pub workers: usize,
    /// Open-loop arrival rate in operations per second (all workers together), if any.
    pub rate_ops_per_s: Option<f64>,
    /// Keys drawn from.
    pub keys: KeyChooser,
    /// Operation weights.
    pub mix: Mix,
    /// Requested lease ttl.
    pub ttl: Duration,
    /// Leases of `hold` and `expiry`.
    pub leases: u64,
    /// Leases a `mixed` worker remembers for renew and release.
    pub held_per_worker_max: usize,
    /// Bound of the acquire phase of `hold` (a target that cannot renew what it already holds
    /// stops acquiring; the report then says how many it held).
    pub acquire_phase_max: Duration,
    /// `hold` and `expiry` on tenure: hold the leases under this many sessions (0: each lease
    /// on its own).
    pub sessions: u64,
    /// `expiry` with sessions: how the sessions end.
    pub session_end: SessionEnd,
    /// `handoff`: the waiter counts to measure, in order.
    pub waiters: Vec<u64>,
    /// The nodes' HTTP addresses (`http://host:port`), whose `/metrics` the session-expiry run
    /// reads; empty when unknown.
    pub node_metrics_urls: Vec<String>,
    /// Seed of the workers' random choices.
    pub seed: u64,
    /// Distinguishes this run's keys, holders and request ids from other runs'.
    pub run_tag: u32,
    /// Print one progress line per second to stderr.
    pub progress: bool,
}

/// What a run measured.
#[derive(Debug)]
pub struct RunOutcome {
    /// Seconds of the measured window.
    pub measured_s: f64,
    /// Per-operation totals of the measured window.
    pub summary: Vec<(OpKind, OpSummary)>,
    /// Latency of all operations of the measured window together.
    pub latency_us: Percentiles,
    /// One sample per second of the measured window.
    pub timeline: Vec<IntervalSample>,
    /// Operations the scenario counts as its throughput (for `hold`, renewals).
    pub ops_total: u64,
    /// Scenario-specific figures.
    pub details: Value,
}

impl RunOutcome {
    /// The outcome of a run whose throughput is every answered operation in `recorder`.
    fn of_operations(
        recorder: &Recorder,
        measured_s: f64,
        timeline: Vec<IntervalSample>,
        details: Value,
    ) -> Self {
        let summary = recorder.summary();
        RunOutcome {
            measured_s,
            latency_us: recorder.overall(),
            ops_total: summary.iter().map(|(_, op)| op.count).sum(),
            summary,
            timeline,
            details,
        }
    }
}

/// Errors that stop a run.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// The configuration cannot run.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A worker task failed (panicked).
    #[error("worker failed: {0}")]
    Worker(String),
}

/// Code of an open-loop operation that was due before the end but never issued.
pub const NOT_ISSUED: &str = "NOT_ISSUED";

fn worker_rng(seed: u64, worker: usize) -> SmallRng {
    let worker = u64::try_from(worker).unwrap_or(u64::MAX);
    SmallRng::seed_from_u64(seed ^ worker.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

fn holder_name(run_tag: u32, worker: usize) -> String {
    format!("lg{run_tag:08x}-w{worker}")
}

/// Runs the configured scenario against `target`.
pub async fn run(target: Arc<Target>, config: &LoadConfig) -> Result<RunOutcome, ScenarioError> {
    if config.workers == 0 || config.workers > 100_000 {
        return Err(ScenarioError::Config(format!(
            "workers must be within 1..=100000, not {}",
            config.workers
        )));
    }
    if config.ttl < Duration::from_millis(1) {
        return Err(ScenarioError::Config("ttl must be at least 1 ms".into()));
    }
    if let Some(rate) = config.rate_ops_per_s
        && !(rate.is_finite() && rate > 0.0)
    {
        return Err(ScenarioError::Config(format!(
            "rate must be a positive number, not {rate}"
        )));
    }
    match config.scenario {
        ScenarioKind::Acquire | ScenarioKind::Mixed | ScenarioKind::Contended => {
            run_mix(target, config).await
        }
        ScenarioKind::Hold => {
            if config.rate_ops_per_s.is_some() {
                return Err(ScenarioError::Config(
                    "hold has no open-loop mode (its renewal rate follows from leases/ttl)".into(),
                ));
            }
            run_hold(target, config).await
        }
        ScenarioKind::Handoff => handoff::run_handoff(target, config).await,
        ScenarioKind::Scale => Err(ScenarioError::Config(
            "scale needs a node control: it runs through scenario::scale::run_scale".into(),
        )),
        ScenarioKind::Expiry => {
            if config.rate_ops_per_s.is_some() {
                return Err(ScenarioError::Config("expiry has no open-loop mode".into()));
            }
            if config.sessions > 0 {
                session_expiry::run_session_expiry(target, config).await
            } else {
                run_expiry(target, config).await
            }
        }
    }
}

/// The per-second reporter: progress line, timeline, end of warm-up.
struct Reporter {
    stop: Arc<tokio::sync::Notify>,
    task: tokio::task::JoinHandle<(Vec<IntervalSample>, Instant)>,
}

type ExtraLine = Arc<dyn Fn() -> String + Send + Sync>;

impl Reporter {
    fn start(
        recorder: Arc<Recorder>,
        warmup: Duration,
        progress: bool,
        extra: Option<ExtraLine>,
    ) -> Reporter {
        let stop = Arc::new(tokio::sync::Notify::new());
        let task = {
            let stop = stop.clone();
            tokio::spawn(async move {
                let started = Instant::now();
                let mut measure_start = started;
                let mut warming = !warmup.is_zero();
                let mut timeline = Vec::new();
                let mut last_tick = started;
                let mut ticker = tokio::time::interval(Duration::from_secs(1));
                ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                ticker.tick().await;
                loop {
                    // `notify_one` keeps a permit, so a stop before this wait is not missed.
                    let stopping = tokio::select! {
                        _ = ticker.tick() => false,
                        () = stop.notified() => true,
                    };
                    let now = Instant::now();
                    let interval_s = now.duration_since(last_tick).as_secs_f64();
                    last_tick = now;
                    let sample = recorder
                        .take_interval(now.duration_since(measure_start).as_secs_f64(), interval_s);
                    if progress && !stopping {
                        let extra = extra.as_ref().map(|line| line()).unwrap_or_default();
                        eprintln!(
                            "[{:>5.1}s{}] {:>9.0} ops/s  p50 {:>7.2} ms  p99 {:>7.2} ms  errors {}{}",
                            now.duration_since(started).as_secs_f64(),
                            if warming { " warm-up" } else { "" },
                            sample.ops_per_s,
                            ms(sample.p50_us),
                            ms(sample.p99_us),
                            errors_text(&sample.errors),
                            extra
                        );
                    }
                    if warming {
                        if now.duration_since(started) >= warmup {
                            warming = false;
                            recorder.reset();
                            measure_start = now;
                        }
                    } else if !stopping || interval_s >= 0.2 {
                        // A final partial interval shorter than 0.2 s would show a false dip.
                        timeline.push(sample);
                    }
                    if stopping {
                        break;
                    }
                }
                (timeline, measure_start)
            })
        };
        Reporter { stop, task }
    }

    /// Stops the reporter; returns the timeline and the measured window, from the end of the
    /// warm-up to `window_end` (the scheduled end: operations still in flight then are
    /// counted, but their tail does not stretch the window).
    async fn finish(
        self,
        window_end: Instant,
    ) -> Result<(Vec<IntervalSample>, f64), ScenarioError> {
        self.stop.notify_one();
        let (timeline, measure_start) = self
            .task
            .await
            .map_err(|error| ScenarioError::Worker(error.to_string()))?;
        Ok((
            timeline,
            window_end
                .saturating_duration_since(measure_start)
                .as_secs_f64(),
        ))
    }
}

/// Milliseconds of a microsecond count, for printing.
pub fn ms(us: u64) -> f64 {
    #[allow(clippy::cast_precision_loss)]
    let value = us as f64 / 1000.0;
    value
}

/// `{CODE: n, ...}` or `-`.
pub fn errors_text(errors: &BTreeMap<String, u64>) -> String {
    if errors.is_empty() {
        return "-".into();
    }
    errors
        .iter()
        .map(|(code, count)| format!("{code}:{count}"))
        .collect::<Vec<_>>()
        .join(",")
}

struct MixWorker {
    target: Arc<Target>,
    recorder: Arc<Recorder>,
    scenario: ScenarioKind,
    keys: KeyChooser,
    mix: Mix,
    ttl: Duration,
    held_max: usize,
    run_tag: u32,
}

impl MixWorker {
    /// Runs worker `worker` until `end`; open loop when `schedule` is set (first operation at
    /// its instant, then one per period). Returns the operations issued and, in open loop, the
    /// scheduled ones never issued because the worker was still behind at `end` (reported, so a
    /// target that cannot keep up shows as missed operations instead of a long drain).
    async fn run(
        &self,
        worker: usize,
        mut rng: SmallRng,
        end: Instant,
        schedule: Option<(Instant, Duration)>,
    ) -> (u64, u64) {
        let holder = holder_name(self.run_tag, worker);
        let mut held: VecDeque<HeldLease> = VecDeque::new();
        let mut sequence = 0u64;
        let mut issued = 0u64;
        let mut next_intended = schedule.map(|(first, _)| first);
        loop {
            let intended = match (&mut next_intended, schedule) {
                (Some(next), Some((_, period))) => {
                    let at = *next;
                    if at >= end {
                        break;
                    }
                    if Instant::now() >= end {
                        // Still behind at the end: every operation scheduled before the end
                        // and never issued is charged its wait so far (no coordinated
                        // omission), under the code NOT_ISSUED.
                        let mut missed = 0u64;
                        let mut intended = at;
                        while intended < end {
                            let op = self.mix.pick(&mut rng);
                            self.recorder.record(
                                worker,
                                op,
                                end.duration_since(intended),
                                Err(NOT_ISSUED),
                            );
                            missed += 1;
                            intended += period;
                        }
                        return (issued, missed);
                    }
                    *next += period;
                    tokio::time::sleep_until(at.into()).await;
                    at
                }
                _ => {
                    let now = Instant::now();
                    if now >= end {
                        break;
                    }
                    now
                }
            };
            let mut op = match self.scenario {
                ScenarioKind::Acquire => OpKind::Acquire,
                _ => self.mix.pick(&mut rng),
            };
            if matches!(op, OpKind::Renew | OpKind::Release) && held.is_empty() {
                op = OpKind::Acquire;
            }
            let outcome = match op {
                OpKind::Acquire => {
                    let resource = if self.scenario == ScenarioKind::Acquire {
                        sequence += 1;
                        unique_resource_name(self.run_tag, worker, sequence)
                    } else {
                        keyed(self.run_tag, self.keys.pick(&mut rng))
                    };
                    match self.target.acquire(&resource, &holder, self.ttl).await {
                        Ok(lease) => {
                            if self.scenario != ScenarioKind::Acquire {
                                if held.len() >= self.held_max {
                                    held.pop_front();
                                }
                                held.push_back(lease);
                            }
                            Ok(())
                        }
                        Err(error) => Err(error),
                    }
                }
                OpKind::Renew => {
                    let index = rng.random_range(0..held.len());
                    let result = self.target.renew(&held[index], self.ttl).await;
                    if result.as_ref().is_err_and(|error| error.lease_gone()) {
                        held.swap_remove_back(index);
                    }
                    result
                }
                OpKind::Release => {
                    let index = rng.random_range(0..held.len());
                    match held.swap_remove_back(index) {
                        Some(lease) => self.target.release(&lease).await,
                        None => Ok(()),
                    }
                }
                OpKind::Get => {
                    let resource = keyed(self.run_tag, self.keys.pick(&mut rng));
                    self.target.get(&resource).await.map(drop)
                }
            };
            self.recorder.record(
                worker,
                op,
                intended.elapsed(),
                outcome
                    .as_ref()
                    .map(drop)
                    .map_err(|error| error.code.as_str()),
            );
            issued += 1;
        }
        (issued, 0)
    }
}

/// The resource of key index `index` in this run's keyspace.
fn keyed(run_tag: u32, index: u64) -> String {
    format!("k{run_tag:08x}-{}", resource_name(index))
}

async fn run_mix(target: Arc<Target>, config: &LoadConfig) -> Result<RunOutcome, ScenarioError> {
    let recorder = Arc::new(Recorder::new());
    let worker = Arc::new(MixWorker {
        target,
        recorder: recorder.clone(),
        scenario: config.scenario,
        keys: config.keys.clone(),
        mix: config.mix,
        ttl: config.ttl,
        held_max: config.held_per_worker_max.max(1),
        run_tag: config.run_tag,
    });
    let period = match config.rate_ops_per_s {
        #[allow(clippy::cast_precision_loss)]
        Some(rate) => Some(
            Duration::try_from_secs_f64(config.workers as f64 / rate)
                .ok()
                .filter(|period| *period <= Duration::from_secs(60))
                .ok_or_else(|| {
                    ScenarioError::Config(format!(
                        "rate {rate} is too low for {} workers (at least one operation per worker per minute)",
                        config.workers
                    ))
                })?,
        ),
        None => None,
    };
    let cpu_before = process_cpu_s();
    let start = Instant::now();
    let end = start + config.warmup + config.duration;
    let reporter = Reporter::start(recorder.clone(), config.warmup, config.progress, None);
    let mut tasks = tokio::task::JoinSet::new();
    for index in 0..config.workers {
        let schedule = period.map(|period| {
            #[allow(clippy::cast_precision_loss)]
            let offset = period.mul_f64(index as f64 / config.workers as f64);
            (start + offset, period)
        });
        let worker = worker.clone();
        let rng = worker_rng(config.seed, index);
        tasks.spawn(async move { worker.run(index, rng, end, schedule).await });
    }
    let mut issued = 0u64;
    let mut missed = 0u64;
    while let Some(result) = tasks.join_next().await {
        let (worker_issued, worker_missed) =
            result.map_err(|error| ScenarioError::Worker(error.to_string()))?;
        issued += worker_issued;
        missed += worker_missed;
    }
    let cpu_s = cpu_since(cpu_before, process_cpu_s());
    let (timeline, measured_s) = reporter.finish(end).await?;
    let ops_total: u64 = recorder.summary().iter().map(|(_, op)| op.count).sum();
    // The load generator's own CPU (workers, the client library, its connections) over the whole
    // run, warm-up included, like the operation count beside it.
    let mut details = json!({
        "operations_issued_including_warmup": issued,
        "loadgen_cpu_s": cpu_s,
    });
    if let Some(rate) = config.rate_ops_per_s {
        #[allow(clippy::cast_precision_loss)]
        let achieved = ops_total as f64 / measured_s.max(1e-9);
        details["open_loop"] = json!({
            "target_rate_ops_per_s": rate,
            "achieved_rate_ops_per_s": achieved,
            "scheduled_but_not_issued_by_the_end": missed,
        });
    }
    Ok(RunOutcome::of_operations(
        &recorder, measured_s, timeline, details,
    ))
}

/// The CPU seconds used between two readings of [`process_cpu_s`], when both could be read.
fn cpu_since(before: Option<f64>, after: Option<f64>) -> Option<f64> {
    Some(after? - before?)
}

/// CPU seconds (user + system) this process has used, from `/proc/self/stat`.
pub fn process_cpu_s() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let user: f64 = fields.get(11)?.parse().ok()?;
    let system: f64 = fields.get(12)?.parse().ok()?;
    // USER_HZ is 100 on Linux's user-space ABI.
    Some((user + system) / 100.0)
}

/// Resident memory of this process in bytes, from `/proc/self/status`.
pub fn process_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Acquires `count` leases named by `name(i)` with `workers` tasks; records into `recorder`.
/// Returns the handles (by index; `None` where the acquire failed) and the phase's seconds.
/// What an acquire phase takes.
struct PhaseSpec {
    /// Keep the leases alive (`hold_acquire`) or only take them (`acquire`).
    keep_alive: bool,
    workers: usize,
    count: u64,
    ttl: Duration,
    holder_tag: u32,
    deadline: Instant,
}

async fn acquire_phase<F>(
    target: &Arc<Target>,
    recorder: &Arc<Recorder>,
    spec: PhaseSpec,
    name: F,
) -> Result<(Vec<(HoldHandle, Instant, Instant)>, f64), ScenarioError>
where
    F: Fn(u64) -> String + Send + Sync + 'static,
{
    let PhaseSpec {
        keep_alive,
        workers,
        count,
        ttl,
        holder_tag,
        deadline,
    } = spec;
    let name = Arc::new(name);
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..workers {
        let target = target.clone();
        let recorder = recorder.clone();
        let name = name.clone();
        let next = next.clone();
        let holder = holder_name(holder_tag, worker);
        tasks.spawn(async move {
            let mut handles = Vec::new();
            loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                if index >= count || Instant::now() >= deadline {
                    break;
                }
                let resource = name(index);
                let sent = Instant::now();
                let result = if keep_alive {
                    target.hold_acquire(&resource, &holder, ttl).await
                } else {
                    target
                        .acquire(&resource, &holder, ttl)
                        .await
                        .map(HoldHandle::Manual)
                };
                let answered = Instant::now();
                recorder.record(
                    worker,
                    OpKind::Acquire,
                    answered - sent,
                    result
                        .as_ref()
                        .map(drop)
                        .map_err(|error| error.code.as_str()),
                );
                if let Ok(handle) = result {
                    handles.push((handle, sent, answered));
                }
            }
            handles
        });
    }
    let mut all = Vec::new();
    while let Some(result) = tasks.join_next().await {
        all.extend(result.map_err(|error| ScenarioError::Worker(error.to_string()))?);
    }
    Ok((all, started.elapsed().as_secs_f64()))
}

fn phase_figures(recorder: &Recorder, seconds: f64) -> Value {
    let summary = recorder.summary();
    let acquire = summary.iter().find(|(op, _)| *op == OpKind::Acquire);
    let (count, ok, errors, latency) = acquire.map_or(
        (0, 0, BTreeMap::new(), Percentiles::default()),
        |(_, op)| (op.count, op.ok, op.errors.clone(), op.latency_us),
    );
    #[allow(clippy::cast_precision_loss)]
    let rate = ok as f64 / seconds.max(1e-9);
    json!({
        "seconds": seconds,
        "acquires": count,
        "acquired": ok,
        "errors": errors,
        "acquired_per_s": rate,
        "latency_us": latency,
    })
}

/// Delay before a renewal that failed without losing its lease is tried again.
const RENEW_RETRY_DELAY: Duration = Duration::from_millis(50);

/// A lease the load generator renews itself (hold on `tenure-http` and `etcd`).
struct ManualLease {
    lease: HeldLease,
    /// When its renewal is due (latency counts from here, across retries).
    due: Instant,
    /// When the next attempt may be made (the due time, or later after a failed attempt).
    next_attempt: Instant,
    /// Send time of the last successful acquire or renewal.
    last_ok: Instant,
}

/// State shared by the workers of a manual hold: they acquire their share of the leases and,
/// from the moment each is acquired, renew it every ttl/3 (as tenure's library does).
struct ManualHold {
    target: Arc<Target>,
    ttl: Duration,
    renew_every: Duration,
    count: u64,
    deadline: Instant,
    tag: u32,
    next: AtomicU64,
    attempted: AtomicU64,
    all_attempted: tokio::sync::Notify,
    steady_from: std::sync::OnceLock<Instant>,
    stop: AtomicBool,
    phase_recorder: Arc<Recorder>,
    recorder: Arc<Recorder>,
    lost: AtomicU64,
    steady_renewals: AtomicU64,
}

impl ManualHold {
    /// One worker: renew whatever is due first, else acquire the next lease, else wait.
    /// Returns `(valid, expired)`: its leases whose last confirmed send is within the ttl at
    /// the end, and those that are not.
    async fn worker(self: Arc<Self>, worker: usize) -> (u64, u64) {
        let holder = holder_name(self.tag, worker);
        let mut queue: BTreeMap<(Instant, u64), ManualLease> = BTreeMap::new();
        let mut sequence = 0u64;
        while !self.stop.load(Ordering::Acquire) {
            let now = Instant::now();
            let head = queue.keys().next().map(|(at, _)| *at);
            if head.is_some_and(|at| at <= now) {
                let Some((_, mut entry)) = queue.pop_first() else {
                    continue;
                };
                let sent = Instant::now();
                let result = self.target.renew(&entry.lease, self.ttl).await;
                let steady_from = self.steady_from.get().copied();
                let (recorder, from) = match steady_from {
                    Some(from) if sent >= from => (&self.recorder, entry.due.max(from)),
                    _ => (&self.phase_recorder, entry.due),
                };
                recorder.record(
                    worker,
                    OpKind::Renew,
                    from.elapsed(),
                    result
                        .as_ref()
                        .map(drop)
                        .map_err(|error| error.code.as_str()),
                );
                match result {
                    Ok(()) => {
                        if steady_from.is_some_and(|from| sent >= from) {
                            self.steady_renewals.fetch_add(1, Ordering::Relaxed);
                        }
                        entry.last_ok = sent;
                        entry.due = sent + self.renew_every;
                        entry.next_attempt = entry.due;
                    }
                    Err(error) if error.lease_gone() => {
                        self.lost.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    Err(_) => entry.next_attempt = Instant::now() + RENEW_RETRY_DELAY,
                }
                sequence += 1;
                queue.insert((entry.next_attempt, sequence), entry);
                continue;
            }
            // Acquire only during the acquire phase (not after its deadline or once the steady
            // window has begun; an acquire in flight then still completes and is kept).
            if self.next.load(Ordering::Relaxed) < self.count
                && now < self.deadline
                && self.steady_from.get().is_none()
            {
                let index = self.next.fetch_add(1, Ordering::Relaxed);
                if index < self.count {
                    let resource = format!("h{:08x}-{index}", self.tag);
                    let sent = Instant::now();
                    let result = self.target.acquire(&resource, &holder, self.ttl).await;
                    self.phase_recorder.record(
                        worker,
                        OpKind::Acquire,
                        sent.elapsed(),
                        result
                            .as_ref()
                            .map(drop)
                            .map_err(|error| error.code.as_str()),
                    );
                    if let Ok(lease) = result {
                        let due = sent + self.renew_every;
                        sequence += 1;
                        queue.insert(
                            (due, sequence),
                            ManualLease {
                                lease,
                                due,
                                next_attempt: due,
                                last_ok: sent,
                            },
                        );
                    }
                    if self.attempted.fetch_add(1, Ordering::AcqRel) + 1 == self.count {
                        self.all_attempted.notify_one();
                    }
                    continue;
                }
            }
            // Nothing due and nothing left to acquire: wait for the next due renewal (at most
            // 100 ms, to notice the stop).
            let wake = head.map_or(now + Duration::from_millis(100), |at| {
                at.min(now + Duration::from_millis(100))
            });
            tokio::time::sleep_until(wake.into()).await;
        }
        let now = Instant::now();
        let valid = queue
            .values()
            .filter(|entry| entry.last_ok + self.ttl > now)
            .count();
        let valid = u64::try_from(valid).unwrap_or(u64::MAX);
        let total = u64::try_from(queue.len()).unwrap_or(u64::MAX);
        (valid, total - valid)
    }
}

/// A task aborted when this is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn run_hold(target: Arc<Target>, config: &LoadConfig) -> Result<RunOutcome, ScenarioError> {
    if config.sessions > 0 {
        return run_session_hold(target, config).await;
    }
    let tag = config.run_tag;
    let phase_recorder = Arc::new(Recorder::new());
    let recorder = Arc::new(Recorder::new());
    let rss_before = process_rss_bytes();
    let acquire_deadline = Instant::now() + config.acquire_phase_max;
    let library = target.library_renewals().is_some();
    let at_risk_sampler = AtRiskSampler::start(&target);
    // Progress of the acquire phase (acquires, and for manual targets their renewals).
    let phase_reporter = Reporter::start(
        phase_recorder.clone(),
        Duration::ZERO,
        config.progress,
        None,
    );
    if config.progress {
        eprintln!(
            "hold: acquiring {} leases with {} workers",
            config.leases, config.workers
        );
    }
    let phase_started = Instant::now();
    let mut tenure_leases = Vec::new();
    let mut manual_tasks = tokio::task::JoinSet::new();
    let mut manual = None;
    if library {
        let (handles, _) = acquire_phase(
            &target,
            &phase_recorder,
            PhaseSpec {
                keep_alive: true,
                workers: config.workers,
                count: config.leases,
                ttl: config.ttl,
                holder_tag: tag,
                deadline: acquire_deadline,
            },
            move |index| format!("h{tag:08x}-{index}"),
        )
        .await?;
        for (handle, _, _) in handles {
            if let HoldHandle::Tenure(lease) = handle {
                tenure_leases.push(lease);
            }
        }
    } else {
        manual = Some(
            ManualHold::acquire_all(
                &target,
                config,
                acquire_deadline,
                &phase_recorder,
                &recorder,
                &mut manual_tasks,
            )
            .await,
        );
    }
    let phase_s = phase_started.elapsed().as_secs_f64();
    let _ = phase_reporter.finish(Instant::now()).await?;
    let acquire_phase = phase_figures(&phase_recorder, phase_s);
    if config.progress {
        eprintln!("hold: acquire phase {acquire_phase}");
    }
    let held_at_start = acquire_phase["acquired"].as_u64().unwrap_or(0);

    // Steady window.
    let library_start = target.library_renewals();
    let extra: ExtraLine = {
        let target = target.clone();
        let manual = manual.clone();
        let last = Mutex::new(library_start.unwrap_or_default());
        Arc::new(move || match (target.library_renewals(), &manual) {
            (Some(now), _) => {
                let mut last = last.lock().unwrap_or_else(PoisonError::into_inner);
                let line = format!(
                    "  library: {} renewal requests carrying {} renewals",
                    now.0 - last.0,
                    now.1 - last.1
                );
                *last = now;
                line
            }
            (None, Some(manual)) => format!("  lost {}", manual.lost.load(Ordering::Relaxed)),
            (None, None) => String::new(),
        })
    };
    let cpu_before = process_cpu_s();
    let start = Instant::now();
    if let Some(manual) = &manual {
        let _ = manual.steady_from.set(start);
    }
    let end = start + config.duration;
    let reporter = Reporter::start(
        recorder.clone(),
        Duration::ZERO,
        config.progress,
        Some(extra),
    );
    tokio::time::sleep_until(end.into()).await;
    let library_end = target.library_renewals();
    let cpu_after = process_cpu_s();
    let rss_holding = process_rss_bytes();
    let tenure_valid = tenure_leases
        .iter()
        .filter(|lease| lease.is_valid())
        .count();
    if let Some(manual) = &manual {
        manual.stop.store(true, Ordering::Release);
    }
    let (mut manual_valid, mut manual_expired) = (0u64, 0u64);
    while let Some(result) = manual_tasks.join_next().await {
        let (valid, expired) = result.map_err(|error| ScenarioError::Worker(error.to_string()))?;
        manual_valid += valid;
        manual_expired += expired;
    }
    let (timeline, measured_s) = reporter.finish(end).await?;

    let (renew_requests, renewals, held_at_end, lost_total) =
        match (&manual, library_start, library_end) {
            (None, Some(start), Some(end)) => {
                let valid = u64::try_from(tenure_valid).unwrap_or(u64::MAX);
                let lost = u64::try_from(tenure_leases.len()).unwrap_or(u64::MAX) - valid;
                (end.0 - start.0, end.1 - start.1, valid, lost)
            }
            (Some(manual), _, _) => {
                let attempts = recorder
                    .summary()
                    .iter()
                    .find(|(op, _)| *op == OpKind::Renew)
                    .map_or(0, |(_, op)| op.count);
                let lost = manual.lost.load(Ordering::Relaxed) + manual_expired;
                (
                    attempts,
                    manual.steady_renewals.load(Ordering::Relaxed),
                    manual_valid,
                    lost,
                )
            }
            _ => (0, 0, 0, 0),
        };
    let at_risk = at_risk_sampler.finish(&target).await;
    // Stop renewing without a flood of releases: the leases end by expiry.
    for lease in tenure_leases {
        let _ = lease.detach();
    }
    let seconds = measured_s.max(1e-9);
    let cpu = cpu_since(cpu_before, cpu_after);
    #[allow(clippy::cast_precision_loss)]
    let details = json!({
        "leases": config.leases,
        "ttl_ms": u64::try_from(config.ttl.as_millis()).unwrap_or(u64::MAX),
        "acquire_phase": acquire_phase,
        "held_at_start": held_at_start,
        "held_at_end": held_at_end,
        "lost": lost_total,
        "leases_at_risk": at_risk,
        "renewed_by": if library { "client library (coalesced batches)" } else { "load generator (one call per lease every ttl/3)" },
        "steady": {
            "seconds": measured_s,
            "renew_requests": renew_requests,
            "renewals": renewals,
            "renew_requests_per_s": renew_requests as f64 / seconds,
            "renewals_per_s": renewals as f64 / seconds,
            "renewals_per_request": if renew_requests == 0 { 0.0 } else { renewals as f64 / renew_requests as f64 },
            "loadgen_cpu_s": cpu,
            "loadgen_cpu_percent_of_one_core": cpu.map(|cpu| cpu / seconds * 100.0),
        },
        "loadgen_rss_bytes_before": rss_before,
        "loadgen_rss_bytes_holding": rss_holding,
    });
    Ok(RunOutcome {
        measured_s,
        latency_us: recorder.overall(),
        summary: recorder.summary(),
        timeline,
        ops_total: renewals,
        details,
    })
}

/// Acquires `count` leases named by `key` in `sessions` (lease `i` in session `i mod S`) with
/// `workers` concurrent workers, until all were tried or `deadline`; the leases held, each with
/// its session's index.
async fn acquire_in_sessions(
    sessions: &Arc<Vec<tenure_client::Session>>,
    recorder: &Arc<Recorder>,
    workers: usize,
    count: u64,
    deadline: Instant,
    key: impl Fn(u64) -> String + Send + Sync + Clone + 'static,
) -> Result<Vec<(usize, tenure_client::SessionLease)>, ScenarioError> {
    if sessions.is_empty() {
        return Err(ScenarioError::Config("no sessions to acquire in".into()));
    }
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..workers {
        let (sessions, recorder, next, key) = (
            sessions.clone(),
            recorder.clone(),
            next.clone(),
            key.clone(),
        );
        tasks.spawn(async move {
            let mut held = Vec::new();
            loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                if index >= count || Instant::now() >= deadline {
                    break;
                }
                let session_index = usize::try_from(index % sessions.len() as u64).unwrap_or(0);
                let session = &sessions[session_index];
                let sent = Instant::now();
                let result = session.acquire(key(index)).await;
                recorder.record(
                    worker,
                    OpKind::Acquire,
                    sent.elapsed(),
                    result.as_ref().map(drop).map_err(|error| error.code_str()),
                );
                if let Ok(lease) = result {
                    held.push((session_index, lease));
                }
            }
            held
        });
    }
    let mut held = Vec::new();
    while let Some(result) = tasks.join_next().await {
        held.extend(result.map_err(|error| ScenarioError::Worker(error.to_string()))?);
    }
    Ok(held)
}

/// `hold` with sessions: the leases are acquired in `config.sessions` sessions (round robin) and
/// kept alive by the sessions' keep-alives alone; the steady window counts keep-alive requests
/// and checks at its end how many leases are still valid.
async fn run_session_hold(
    target: Arc<Target>,
    config: &LoadConfig,
) -> Result<RunOutcome, ScenarioError> {
    let Some(client) = target.tenure_client() else {
        return Err(ScenarioError::Config(
            "hold with sessions needs the tenure target (the native client library)".into(),
        ));
    };
    let tag = config.run_tag;
    let tenant = target.tenure_tenant().unwrap_or_default().to_string();
    let sessions: Vec<tenure_client::Session> = (0..config.sessions)
        .map(|index| client.session(tenant.clone(), format!("s{tag:08x}-{index}"), config.ttl))
        .collect::<Result<_, _>>()
        .map_err(|error| ScenarioError::Config(format!("session: {error}")))?;
    let sessions = Arc::new(sessions);
    let phase_recorder = Arc::new(Recorder::new());
    let recorder = Arc::new(Recorder::new());
    let rss_before = process_rss_bytes();
    let deadline = Instant::now() + config.acquire_phase_max;
    let phase_reporter = Reporter::start(
        phase_recorder.clone(),
        Duration::ZERO,
        config.progress,
        None,
    );
    if config.progress {
        eprintln!(
            "hold: acquiring {} leases in {} sessions with {} workers",
            config.leases, config.sessions, config.workers
        );
    }
    let phase_started = Instant::now();
    let held = acquire_in_sessions(
        &sessions,
        &phase_recorder,
        config.workers,
        config.leases,
        deadline,
        move |index| format!("h{tag:08x}-{index}"),
    )
    .await?;
    let phase_s = phase_started.elapsed().as_secs_f64();
    let _ = phase_reporter.finish(Instant::now()).await?;
    let acquire_phase = phase_figures(&phase_recorder, phase_s);
    if config.progress {
        eprintln!("hold: acquire phase {acquire_phase}");
    }
    let keepalives = |sessions: &[tenure_client::Session]| {
        sessions.iter().fold((0u64, 0u64), |(sent, ok), session| {
            let (s, o) = session.keepalive_counts();
            (sent + s, ok + o)
        })
    };
    let extra: ExtraLine = {
        let sessions = sessions.clone();
        let last = Mutex::new(keepalives(&sessions));
        Arc::new(move || {
            let now = keepalives(&sessions);
            let mut last = last.lock().unwrap_or_else(PoisonError::into_inner);
            let lost = sessions
                .iter()
                .map(|s| s.groups().iter().filter(|(_, lost)| *lost).count())
                .sum::<usize>();
            let line = format!(
                "  sessions: {} keep-alive requests ({} confirmed), {lost} (session, group) lost",
                now.0 - last.0,
                now.1 - last.1
            );
            *last = now;
            line
        })
    };
    let groups_open: usize = sessions.iter().map(|s| s.groups().len()).sum();
    let start_counts = keepalives(&sessions);
    let wire_start = client.stats();
    let cpu_before = process_cpu_s();
    let start = Instant::now();
    let end = start + config.duration;
    let reporter = Reporter::start(
        recorder.clone(),
        Duration::ZERO,
        config.progress,
        Some(extra),
    );
    tokio::time::sleep_until(end.into()).await;
    let end_counts = keepalives(&sessions);
    let wire_end = client.stats();
    let cpu_after = process_cpu_s();
    let rss_holding = process_rss_bytes();
    let valid = held
        .iter()
        .filter(|(index, lease)| sessions[*index].is_valid(lease))
        .count() as u64;
    let (timeline, measured_s) = reporter.finish(end).await?;
    let acquired = held.len() as u64;
    let groups_lost: usize = sessions
        .iter()
        .map(|s| s.groups().iter().filter(|(_, lost)| *lost).count())
        .sum();
    let seconds = measured_s.max(1e-9);
    let cpu = cpu_since(cpu_before, cpu_after);
    let requests = end_counts.0 - start_counts.0;
    let confirmed = end_counts.1 - start_counts.1;
    // The leases end by expiry with their sessions (dropping them stops the keep-alives).
    drop(held);
    drop(sessions);
    #[allow(clippy::cast_precision_loss)]
    let details = json!({
        "leases": config.leases,
        "sessions": config.sessions,
        "session_groups_open": groups_open,
        "session_groups_lost": groups_lost,
        "ttl_ms": u64::try_from(config.ttl.as_millis()).unwrap_or(u64::MAX),
        "acquire_phase": acquire_phase,
        "held_at_start": acquired,
        "held_at_end": valid,
        "lost": acquired - valid,
        "renewed_by": "sessions (one keep-alive per session and group every ttl/3)",
        "steady": {
            "seconds": measured_s,
            "keepalives_sent": requests,
            "keepalives_confirmed": confirmed,
            "keepalives_per_s": requests as f64 / seconds,
            "keepalive_requests": wire_end.keepalive_requests - wire_start.keepalive_requests,
            "keepalive_requests_per_s": (wire_end.keepalive_requests - wire_start.keepalive_requests) as f64 / seconds,
            "keepalives_per_request": if wire_end.keepalive_requests == wire_start.keepalive_requests { 0.0 } else { (wire_end.keepalives - wire_start.keepalives) as f64 / (wire_end.keepalive_requests - wire_start.keepalive_requests) as f64 },
            "leases_kept_per_keepalive": if confirmed == 0 { 0.0 } else { acquired as f64 * (seconds / (config.ttl.as_secs_f64() / 3.0)) / confirmed as f64 },
            "loadgen_cpu_s": cpu,
            "loadgen_cpu_percent_of_one_core": cpu.map(|cpu| cpu / seconds * 100.0),
        },
        "loadgen_rss_bytes_before": rss_before,
        "loadgen_rss_bytes_holding": rss_holding,
    });
    Ok(RunOutcome {
        measured_s,
        latency_us: recorder.overall(),
        summary: recorder.summary(),
        timeline,
        ops_total: confirmed,
        details,
    })
}

/// The client library's leases at risk (renewal overdue), sampled every 100 ms for a whole hold
/// run: the most at once, and when the first was seen. The task is aborted if the run returns
/// early with an error.
struct AtRiskSampler {
    total_before: u64,
    most_at_once: Arc<AtomicU64>,
    first_seen_s: Arc<Mutex<Option<f64>>>,
    stop: Arc<AtomicBool>,
    task: AbortOnDrop,
}

impl AtRiskSampler {
    fn start(target: &Arc<Target>) -> Self {
        let total_before = target
            .library_stats()
            .map_or(0, |stats| stats.leases_at_risk_total);
        let most_at_once = Arc::new(AtomicU64::new(0));
        let first_seen_s = Arc::new(Mutex::new(None::<f64>));
        let stop = Arc::new(AtomicBool::new(false));
        let task = AbortOnDrop(tokio::spawn({
            let target = target.clone();
            let most_at_once = most_at_once.clone();
            let first_seen_s = first_seen_s.clone();
            let stop = stop.clone();
            let started = Instant::now();
            async move {
                while !stop.load(Ordering::Acquire) {
                    if let Some(now) = target.library_stats().map(|stats| stats.leases_at_risk) {
                        most_at_once.fetch_max(now, Ordering::Relaxed);
                        if now > 0 {
                            let mut first =
                                first_seen_s.lock().unwrap_or_else(PoisonError::into_inner);
                            first.get_or_insert(started.elapsed().as_secs_f64());
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }));
        AtRiskSampler {
            total_before,
            most_at_once,
            first_seen_s,
            stop,
            task,
        }
    }

    /// Stops sampling; the figures as JSON (`None` when the target is not the client library).
    async fn finish(mut self, target: &Arc<Target>) -> Option<Value> {
        self.stop.store(true, Ordering::Release);
        let _ = (&mut self.task.0).await;
        let first_seen_s = *self
            .first_seen_s
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        target.library_stats().map(|stats| {
            let (now, total) = (stats.leases_at_risk, stats.leases_at_risk_total);
            json!({
                "at_end": now,
                "most_at_once": self.most_at_once.load(Ordering::Relaxed),
                "times_a_lease_became_at_risk": total.saturating_sub(self.total_before),
                "first_seen_s_into_run": first_seen_s,
            })
        })
    }
}

impl ManualHold {
    /// The acquire phase of a hold run whose target has no client library: `config.workers`
    /// workers acquire (and keep renewing) the leases until all were attempted or the deadline;
    /// acquires still in flight then finish (each bounded by the target's timeout).
    async fn acquire_all(
        target: &Arc<Target>,
        config: &LoadConfig,
        acquire_deadline: Instant,
        phase_recorder: &Arc<Recorder>,
        recorder: &Arc<Recorder>,
        tasks: &mut tokio::task::JoinSet<(u64, u64)>,
    ) -> Arc<ManualHold> {
        let shared = Arc::new(ManualHold {
            target: target.clone(),
            ttl: config.ttl,
            renew_every: config.ttl / 3,
            count: config.leases,
            deadline: acquire_deadline,
            tag: config.run_tag,
            next: AtomicU64::new(0),
            attempted: AtomicU64::new(0),
            all_attempted: tokio::sync::Notify::new(),
            steady_from: std::sync::OnceLock::new(),
            stop: AtomicBool::new(false),
            phase_recorder: phase_recorder.clone(),
            recorder: recorder.clone(),
            lost: AtomicU64::new(0),
            steady_renewals: AtomicU64::new(0),
        });
        for worker in 0..config.workers {
            tasks.spawn(shared.clone().worker(worker));
        }
        let all_attempted = async {
            while shared.attempted.load(Ordering::Acquire) < config.leases {
                shared.all_attempted.notified().await;
            }
        };
        let _ = tokio::time::timeout_at(acquire_deadline.into(), all_attempted).await;
        // Acquires still in flight at the deadline finish (each is bounded by the target's
        // timeout) before the phase is counted.
        let settle_by = Instant::now() + crate::target::OP_TIMEOUT + Duration::from_secs(2);
        while shared.attempted.load(Ordering::Acquire)
            < shared.next.load(Ordering::Acquire).min(config.leases)
            && Instant::now() < settle_by
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        shared
    }
}

/// The expiry scenarios' background traffic: the mix on the run's keyspace, closed loop, a
/// quarter of the workers (at least one), until `deadline`, recorded with a per-second reporter.
struct Background {
    recorder: Arc<Recorder>,
    reporter: Reporter,
    workers: usize,
    tasks: tokio::task::JoinSet<(u64, u64)>,
}

impl Background {
    fn start(target: &Arc<Target>, config: &LoadConfig, deadline: Instant) -> Background {
        let recorder = Arc::new(Recorder::new());
        let workers = (config.workers / 4).max(1);
        let background = Arc::new(MixWorker {
            target: target.clone(),
            recorder: recorder.clone(),
            scenario: ScenarioKind::Mixed,
            keys: config.keys.clone(),
            mix: config.mix,
            ttl: config.ttl.max(Duration::from_secs(10)),
            held_max: config.held_per_worker_max.max(1),
            run_tag: config.run_tag,
        });
        let reporter = Reporter::start(recorder.clone(), Duration::ZERO, config.progress, None);
        let mut tasks = tokio::task::JoinSet::new();
        for index in 0..workers {
            let worker = background.clone();
            let rng = worker_rng(config.seed, index);
            tasks.spawn(async move { worker.run(index, rng, deadline, None).await });
        }
        Background {
            recorder,
            reporter,
            workers,
            tasks,
        }
    }
}

async fn run_expiry(target: Arc<Target>, config: &LoadConfig) -> Result<RunOutcome, ScenarioError> {
    let tag = config.run_tag;
    let start = Instant::now();
    let deadline = start + config.duration;
    let Background {
        recorder,
        reporter,
        workers: background_workers,
        mut tasks,
    } = Background::start(&target, config, deadline);
    // Baseline: two seconds (at most a quarter of the bound) of background traffic alone.
    tokio::time::sleep(Duration::from_secs(2).min(config.duration / 4)).await;

    // Phase 1: K leases with the scenario's ttl, not renewed.
    let phase_recorder = Arc::new(Recorder::new());
    let acquire_workers = config.workers.saturating_sub(background_workers).max(1);
    let phase_started = Instant::now();
    let (handles, phase_s) = acquire_phase(
        &target,
        &phase_recorder,
        PhaseSpec {
            keep_alive: false,
            workers: acquire_workers,
            count: config.leases,
            ttl: config.ttl,
            holder_tag: tag,
            deadline,
        },
        move |index| format!("e{tag:08x}-{index}"),
    )
    .await?;
    let acquire_phase = phase_figures(&phase_recorder, phase_s);
    let expiring = ExpiringKeys::of(handles, config.ttl, phase_started);
    if config.progress {
        eprintln!(
            "expiry: {} leases acquired in {phase_s:.1} s; all expire within {:.1} s",
            expiring.keys.len(),
            expiring
                .latest
                .saturating_duration_since(Instant::now())
                .as_secs_f64()
        );
    }

    // Phase 2: new holders reclaim every key as soon as it is free.
    let earliest = expiring.earliest.unwrap_or(expiring.latest);
    tokio::time::sleep_until(earliest.min(deadline).into()).await;
    let reclaim_started = Instant::now();
    let expiring_count = expiring.keys.len();
    let latest_expiry = expiring.latest;
    let reclaim = Reclaim::new(expiring);
    let mut reclaim_tasks = tokio::task::JoinSet::new();
    for worker in 0..acquire_workers {
        let target = target.clone();
        let reclaim = reclaim.clone();
        let holder = format!("lg{tag:08x}-reclaimer{worker}");
        let ttl = config.ttl;
        reclaim_tasks
            .spawn(async move { reclaim.run_worker(&target, &holder, ttl, deadline).await });
    }
    while let Some(result) = reclaim_tasks.join_next().await {
        result.map_err(|error| ScenarioError::Worker(error.to_string()))?;
    }
    let reclaim_finished = Instant::now();
    // Two more seconds of background traffic after the reclaim, then stop it.
    let background_stop_at = (reclaim_finished + Duration::from_secs(2)).min(deadline);
    tokio::time::sleep_until(background_stop_at.into()).await;
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    let finished = Instant::now();
    let (timeline, measured_s) = reporter.finish(finished).await?;

    let unreclaimed = reclaim
        .queue
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .len();
    let last = *reclaim
        .last_reclaim
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let delays = reclaim
        .delays_us
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    // Background traffic before the leases expired versus while they were reclaimed, from the
    // timeline (t_s counts from the reporter's start, which is `start`).
    let since_start = |at: Instant| at.saturating_duration_since(start).as_secs_f64();
    let details = json!({
        "leases": config.leases,
        "ttl_ms": u64::try_from(config.ttl.as_millis()).unwrap_or(u64::MAX),
        "acquire_phase": acquire_phase,
        "expiring": expiring_count,
        "reclaimed": reclaim.reclaimed.load(Ordering::Relaxed),
        "unreclaimed": unreclaimed,
        "reclaim_refusals": reclaim.refusals.load(Ordering::Relaxed),
        "all_reclaimed_after_latest_expiry_ms": last
            .filter(|_| unreclaimed == 0)
            .map(|at| at.saturating_duration_since(latest_expiry).as_secs_f64() * 1000.0),
        "reclaim_window_s": reclaim_finished.duration_since(reclaim_started).as_secs_f64(),
        "reclaim_delay_after_earliest_expiry_us": {
            "p50": delays.value_at_quantile(0.5),
            "p99": delays.value_at_quantile(0.99),
            "max": delays.max(),
        },
        "background_workers": background_workers,
        "background_before_expiry": timeline_window(&timeline, 0.0, since_start(phase_started)),
        "background_during_reclaim": timeline_window(
            &timeline,
            since_start(reclaim_started),
            since_start(reclaim_finished),
        ),
    });
    Ok(RunOutcome::of_operations(
        &recorder, measured_s, timeline, details,
    ))
}

/// The keys of the expiry scenario's leases and when each may expire.
struct ExpiringKeys {
    /// (resource, earliest possible expiry, latest possible expiry), in acquire order.
    keys: Vec<(String, Instant, Instant)>,
    /// The earliest moment any of them may be free.
    earliest: Option<Instant>,
    /// The moment by which all of them have expired.
    latest: Instant,
}

impl ExpiringKeys {
    /// Stops renewing every handle (the leases then expire) and notes when each expires: at its
    /// grant's log time + ttl; the grant was made between sending and the answer, so in real
    /// time expiry falls in `[sent + ttl, answered + ttl]`.
    fn of(handles: Vec<(HoldHandle, Instant, Instant)>, ttl: Duration, floor: Instant) -> Self {
        let mut expiring = ExpiringKeys {
            keys: Vec::with_capacity(handles.len()),
            earliest: None,
            latest: floor,
        };
        for (handle, sent, answered) in handles {
            let resource = match handle {
                HoldHandle::Tenure(lease) => {
                    let resource = lease.key().resource_id.to_string();
                    let _ = lease.detach();
                    resource
                }
                HoldHandle::Manual(lease) => lease.resource,
            };
            let not_before = sent + ttl;
            let expires_by = answered + ttl;
            expiring.latest = expiring.latest.max(expires_by);
            expiring.earliest = Some(
                expiring
                    .earliest
                    .map_or(not_before, |at: Instant| at.min(not_before)),
            );
            expiring.keys.push((resource, not_before, expires_by));
        }
        expiring
    }
}

/// Keys to reclaim by (earliest moment each may be free, sequence), with the earliest expiry
/// its delay counts from.
type ReclaimQueue = BTreeMap<(Instant, u64), (String, Instant)>;

/// The reclaim phase's shared state: the keys in order of the earliest moment each may be free
/// (then of retry time), and what the workers measured.
#[derive(Clone)]
struct Reclaim {
    queue: Arc<Mutex<ReclaimQueue>>,
    next_sequence: Arc<AtomicU64>,
    /// Keys taken from the queue and not yet settled: a refused one comes back, so a worker
    /// finding the queue empty stops only when nothing is in flight.
    in_flight: Arc<AtomicU64>,
    /// Fixed bounds: a histogram without them would clamp every `saturating_record` to its
    /// initial range.
    delays_us: Arc<Mutex<Histogram<u64>>>,
    reclaimed: Arc<AtomicU64>,
    refusals: Arc<AtomicU64>,
    last_reclaim: Arc<Mutex<Option<Instant>>>,
}

impl Reclaim {
    /// Each key carries its earliest possible expiry (sent + ttl): the reclaim delay counts
    /// from there, so it includes up to one acquire round trip of uncertainty about the true
    /// expiry.
    fn new(expiring: ExpiringKeys) -> Self {
        let mut ordered = ReclaimQueue::new();
        for (sequence, (resource, not_before, _)) in (0u64..).zip(expiring.keys) {
            ordered.insert((not_before, sequence), (resource, not_before));
        }
        Reclaim {
            next_sequence: Arc::new(AtomicU64::new(u64::try_from(ordered.len()).unwrap_or(0))),
            queue: Arc::new(Mutex::new(ordered)),
            in_flight: Arc::new(AtomicU64::new(0)),
            delays_us: Arc::new(Mutex::new(crate::stats::new_histogram())),
            reclaimed: Arc::new(AtomicU64::new(0)),
            refusals: Arc::new(AtomicU64::new(0)),
            last_reclaim: Arc::new(Mutex::new(None)),
        }
    }

    /// Takes the earliest key if it is due (`Ok`), else says when to look again (`Err`: at
    /// most 25 ms, so a key put back by another worker is not missed); `None` when every key
    /// is settled.
    fn next_due(&self, now: Instant) -> Option<Result<Option<(String, Instant)>, Instant>> {
        let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        match queue.keys().next().copied() {
            None if self.in_flight.load(Ordering::Acquire) == 0 => None,
            None => Some(Err(now + Duration::from_millis(25))),
            Some((at, _)) if at <= now => {
                self.in_flight.fetch_add(1, Ordering::AcqRel);
                Some(Ok(queue.pop_first().map(|(_, item)| item)))
            }
            Some((at, _)) => Some(Err(at.min(now + Duration::from_millis(25)))),
        }
    }

    /// One reclaiming worker: acquires each due key as `holder`; a refused key is retried 25 ms
    /// later.
    async fn run_worker(&self, target: &Target, holder: &str, ttl: Duration, deadline: Instant) {
        loop {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            let (resource, earliest_expiry) = match self.next_due(now) {
                None => break,
                Some(Ok(Some(item))) => item,
                Some(Ok(None)) => {
                    self.in_flight.fetch_sub(1, Ordering::AcqRel);
                    continue;
                }
                Some(Err(wake)) => {
                    tokio::time::sleep_until(wake.into()).await;
                    continue;
                }
            };
            match target.acquire(&resource, holder, ttl).await {
                Ok(_) => {
                    let now = Instant::now();
                    self.reclaimed.fetch_add(1, Ordering::Relaxed);
                    let delay = now.saturating_duration_since(earliest_expiry);
                    self.delays_us
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .saturating_record(crate::stats::latency_us(delay));
                    let mut last = self
                        .last_reclaim
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner);
                    *last = Some(last.map_or(now, |at: Instant| at.max(now)));
                }
                Err(_) => {
                    self.refusals.fetch_add(1, Ordering::Relaxed);
                    let retry_at = Instant::now() + Duration::from_millis(25);
                    let sequence = self.next_sequence.fetch_add(1, Ordering::Relaxed);
                    self.queue
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .insert((retry_at, sequence), (resource, earliest_expiry));
                }
            }
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// The background traffic's worst second between `from_s` and `to_s` of the timeline: lowest
/// throughput, highest interval p99, highest latency.
fn timeline_window(timeline: &[IntervalSample], from_s: f64, to_s: f64) -> Value {
    let samples: Vec<&IntervalSample> = timeline
        .iter()
        .filter(|sample| sample.t_s > from_s && sample.t_s - 1.0 < to_s)
        .collect();
    let min_ops = samples
        .iter()
        .map(|sample| sample.ops_per_s)
        .fold(f64::INFINITY, f64::min);
    let max_p99 = samples
        .iter()
        .map(|sample| sample.p99_us)
        .max()
        .unwrap_or(0);
    let max_us = samples
        .iter()
        .map(|sample| sample.max_us)
        .max()
        .unwrap_or(0);
    json!({
        "seconds": samples.len(),
        "min_ops_per_s": if min_ops.is_finite() { json!(min_ops) } else { Value::Null },
        "max_interval_p99_us": max_p99,
        "max_latency_us": max_us,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mix_parses_and_picks_by_weight() {
        let mix = Mix::parse("acquire=20,renew=70,release=10").unwrap();
        assert_eq!(mix, Mix::MIXED);
        let mut rng = SmallRng::seed_from_u64(1);
        let mut counts = BTreeMap::new();
        for _ in 0..10_000 {
            *counts.entry(mix.pick(&mut rng)).or_insert(0) += 1;
        }
        assert!(
            (1700..2300).contains(&counts[&OpKind::Acquire]),
            "{counts:?}"
        );
        assert!((6600..7400).contains(&counts[&OpKind::Renew]), "{counts:?}");
        assert!(!counts.contains_key(&OpKind::Get));
        assert!(Mix::parse("acquire=0").is_err());
        assert!(Mix::parse("steal=5").is_err());
        assert!(Mix::parse("acquire").is_err());
        assert!(Mix::parse("acquire=-1").is_err());
    }

    #[test]
    fn cpu_and_memory_are_readable() {
        assert!(process_cpu_s().is_some());
        assert!(process_rss_bytes().is_some_and(|bytes| bytes > 0));
    }
}
