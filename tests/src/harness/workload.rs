//! A client process of a fault run (`nemesis client`): tasks that use `tenure-client` on a small
//! contended keyspace and record every operation as one JSON line on standard output.
//!
//! Each task acts as its own holder. Without a lease it acquires a random resource (sometimes it
//! reads one first); holding one, it writes to the fenced store while its safe deadline is
//! ahead (checking the deadline, then "working" a few milliseconds before the write lands, so a
//! SIGSTOP in between makes it a zombie), renews a third of a ttl after each confirmed
//! extension, and now and then releases, reads, or re-sends an earlier request id on purpose (an
//! exactly-once probe).
//!
//! An operation that fails retryably (no leader, timeout, node unreachable) is called again with
//! the same request id until it gets a definite answer, as a careful user would: its recorded
//! window runs from the first call to the definite answer. Only when the run is over and the
//! resolve deadline passes does it stay [`Outcome::Unknown`].
//!
//! A task that holds nothing sometimes waits for a resource in its FIFO queue instead
//! (AcquireWait): it first joins the queue without parking (`Client::wait_enqueue`, which
//! answers the wait's place: when it was queued and when its wait ends), then parks until the
//! grant with the same request id. The history records both, so the checker can judge FIFO
//! order among live waiters and that no dead waiter is granted. One task per client process or
//! host also watches the tenant ([`run_watcher`]), resuming from its cursor now and then, and
//! records every item it is given.
//!
//! A line `stop` on standard input (or its end) stops the tasks after their current operation;
//! the process prints `{"done": ...}` and exits.
//!
//! Must not depend on: the cluster's processes or the checker.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng as _, SeedableRng as _};
use serde::{Deserialize, Serialize};
use tenure_client::{
    AcquireOptions, Client, ClientConfig, ClientError, Credentials, GetResult, Grant, LeaseId,
    ResourceKey, Session, WaitOptions, WaitStep, WatchEventKind, WatchFrom, WatchItem,
    WatchOptions, WatchSelector,
};
use tenure_core::GroupId;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};
use tokio::sync::{mpsc, watch};

use super::HarnessError;
use crate::fencing::{SharedFence, StoreClient, StoreError, WriteReply};
use crate::history::FencedWrite;
use crate::history::{
    InstantAnchor, LeaseRef, Nanos, OpKind, OpRecord, Outcome, ViewRecord, WaitRecord,
    WatchItemRecord, WatchRecord, mono_now_ns,
};

/// Past operations a task keeps for exactly-once probes.
const REPLAYABLE_MAX: usize = 64;
/// How much longer than its queue's wait the library waits for a parked wait's answer.
const PARKED_WAIT_EXTRA_MS: u64 = 10_000;
const PARKED_WAIT_EXTRA: Duration = Duration::from_millis(PARKED_WAIT_EXTRA_MS);
/// Records queued for standard output at most (tasks wait beyond it).
const RECORD_QUEUE: usize = 4_096;

/// What a client process is told.
#[derive(Debug, Clone)]
pub struct WorkerArgs {
    /// `cluster.json`.
    pub cluster_file: PathBuf,
    /// This process's number (1-based); task names are `p{process}t{task}`.
    pub process: u32,
    /// Tasks (holders) in this process.
    pub tasks: u32,
    /// Seeds every task's choices.
    pub seed: u64,
    /// The tenant of every resource.
    pub tenant: String,
    /// The keyspace.
    pub resources: Vec<String>,
    /// Lease ttl.
    pub ttl_ms: u64,
    /// The fenced store's socket.
    pub store: PathBuf,
    /// After `stop`, how long an unanswered operation keeps being retried.
    pub resolve_timeout_ms: u64,
    /// Prefix of request ids (unique per run).
    pub run_tag: String,
    /// Run `tenurectl lock` again and again beside the tasks.
    pub lock: Option<super::locker::LockArgs>,
}

/// One line of a client process's output.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerLine {
    /// An operation is about to be sent (its outcome says `Unknown` until its [`WorkerLine::Op`]
    /// line arrives; a process that dies in between leaves it indeterminate, never unrecorded).
    Invoke(OpRecord),
    /// An operation, answered (or given up on).
    Op(OpRecord),
    /// An item a watch stream delivered.
    Watch(WatchRecord),
    /// The process is done.
    Done {
        /// Operations recorded.
        ops: u64,
        /// Fenced writes the store rejected.
        writes_rejected: u64,
    },
}

/// Runs a client process until `stop` (blocking; builds its own runtime).
pub fn worker_main(args: WorkerArgs) -> Result<(), HarnessError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| HarnessError::io("starting the client runtime", e))?;
    runtime.block_on(run_worker(args))
}

async fn connect(args: &WorkerArgs) -> Result<Client, HarnessError> {
    let mut config = ClientConfig::from_cluster_file(
        &args.cluster_file,
        Credentials::InsecureDev {
            principal_id: format!("nemesis-p{}", args.process),
        },
    )
    .map_err(|e| HarnessError::Client(e.to_string()))?;
    config.call_timeout = Duration::from_millis(2_500);
    config.attempt_timeout = Duration::from_millis(800);
    config.seed = Some(args.seed);
    let mut last = String::new();
    for _ in 0..60 {
        match Client::connect(config.clone()).await {
            Ok(client) => return Ok(client),
            Err(error) => last = error.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Err(HarnessError::Client(format!("cannot connect: {last}")))
}

async fn run_worker(args: WorkerArgs) -> Result<(), HarnessError> {
    let client = connect(&args).await?;
    let mut groups = HashMap::new();
    for resource in &args.resources {
        let key = ResourceKey::new(args.tenant.clone(), resource.clone());
        let group = client
            .group_of(&key)
            .await
            .map_err(|e| HarnessError::Client(e.to_string()))?;
        groups.insert(resource.clone(), group);
    }
    let groups = Arc::new(groups);
    let (stop_tx, stop) = watch::channel(None::<Nanos>);
    // `stop` on standard input, or its end.
    let resolve_timeout_ns = args.resolve_timeout_ms.saturating_mul(1_000_000);
    tokio::spawn(async move {
        let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if line.trim() == "stop" {
                break;
            }
        }
        let _ = stop_tx.send(Some(mono_now_ns().saturating_add(resolve_timeout_ns)));
    });
    let (records, mut queue) = mpsc::channel::<WorkerLine>(RECORD_QUEUE);
    let writer = tokio::spawn(async move {
        let mut out = tokio::io::BufWriter::new(tokio::io::stdout());
        let mut count = 0u64;
        while let Some(record) = queue.recv().await {
            count += u64::from(matches!(record, WorkerLine::Op(_)));
            if let Ok(mut line) = serde_json::to_string(&record) {
                line.push('\n');
                if out.write_all(line.as_bytes()).await.is_err() {
                    break;
                }
            }
            if queue.is_empty() && out.flush().await.is_err() {
                break;
            }
        }
        let _ = out.flush().await;
        (out, count)
    });
    let rejected = Arc::new(AtomicU64::new(0));
    // Every task's, and the watcher's (which takes it last: when they end, the record writer's
    // senders are gone with it).
    let set = TaskSet {
        client: client.clone(),
        clock: WorkClock::Machine(InstantAnchor::new()),
        sink: Sink::Lines(records.clone()),
        stop,
        workload: Arc::new(Workload {
            tenant: args.tenant.clone(),
            resources: args.resources.clone(),
            groups: groups.clone(),
            ttl_ms: args.ttl_ms,
        }),
        next_id: Arc::new(AtomicU64::new(1)),
        rejected: rejected.clone(),
    };
    let mut handles = Vec::new();
    for task in 1..=args.tasks {
        let name = format!("p{}t{task}", args.process);
        let fence = Fence::Socket(StoreClient::connect(&args.store).await?);
        let spec = TaskSpec {
            holder: format!("{}-{name}", args.run_tag),
            name,
            seed: args.seed ^ (u64::from(task) << 32),
            id_base: u64::from(args.process) << 40,
        };
        handles.push(tokio::spawn(set.task(spec, fence).run()));
    }
    if let Some(lock) = args.lock.clone() {
        handles.push(tokio::spawn(super::locker::run_locker(
            lock,
            args.cluster_file.clone(),
            args.tenant.clone(),
            format!("{}-p{}-locker", args.run_tag, args.process),
            args.ttl_ms,
            args.seed ^ 0x6c6f_636b_0000_0000,
            set.stop.clone(),
        )));
    }
    // One watcher per process, reading from any replica in every other process.
    handles.push(tokio::spawn(run_watcher(
        set,
        format!("p{}w", args.process),
        args.seed ^ 0x7761_7463_6800_0000,
        args.process % 2 == 0,
    )));
    drop(records);
    for handle in handles {
        let _ = handle.await;
    }
    let (mut out, ops) = writer
        .await
        .map_err(|e| HarnessError::Client(format!("record writer: {e}")))?;
    let done = WorkerLine::Done {
        ops,
        writes_rejected: rejected.load(Ordering::Relaxed),
    };
    if let Ok(mut line) = serde_json::to_string(&done) {
        line.push('\n');
        let _ = out.write_all(line.as_bytes()).await;
        let _ = out.flush().await;
    }
    client.close().await;
    Ok(())
}

/// Where a task's time comes from.
#[derive(Debug, Clone)]
pub enum WorkClock {
    /// The machine's `CLOCK_MONOTONIC` (the client processes of a fault run).
    Machine(InstantAnchor),
    /// A simulation's: its elapsed time, which moves in steps of `tick_ns`. Invocations are
    /// read at the start of their step and completions at its end, so every recorded window
    /// contains the true one.
    Simulated {
        /// The simulation's step.
        tick_ns: Nanos,
    },
}

impl WorkClock {
    /// Now, as an invocation time (never later than the truth).
    pub fn now_ns(&self) -> Nanos {
        match self {
            WorkClock::Machine(_) => mono_now_ns(),
            WorkClock::Simulated { .. } => turmoil::sim_elapsed().map_or(0, |elapsed| {
                u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX)
            }),
        }
    }

    /// Now, as a completion time (never earlier than the truth).
    pub fn completed_ns(&self) -> Nanos {
        match self {
            WorkClock::Machine(_) => mono_now_ns(),
            WorkClock::Simulated { tick_ns } => self.now_ns().saturating_add(*tick_ns),
        }
    }

    /// When something the client library observed at `instant` completed, as a completion time
    /// (never earlier than the truth).
    pub fn to_completion_ns(&self, instant: std::time::Instant) -> Nanos {
        match self {
            WorkClock::Machine(_) => self.to_ns(instant),
            WorkClock::Simulated { tick_ns } => self.to_ns(instant).saturating_add(*tick_ns),
        }
    }

    /// A deadline the client library gave as an `Instant` (never later than the truth).
    pub fn to_ns(&self, instant: std::time::Instant) -> Nanos {
        match self {
            WorkClock::Machine(anchor) => anchor.to_nanos(instant),
            WorkClock::Simulated { .. } => {
                // The library's instants are on this host's (simulated) tokio clock.
                let now = tokio::time::Instant::now().into_std();
                let base = self.now_ns();
                if instant >= now {
                    base.saturating_add(
                        u64::try_from((instant - now).as_nanos()).unwrap_or(u64::MAX),
                    )
                } else {
                    base.saturating_sub(u64::try_from((now - instant).as_nanos()).unwrap_or(0))
                }
            }
        }
    }
}

/// Where a task's records go.
#[derive(Debug, Clone)]
pub enum Sink {
    /// JSON lines on standard output (a client process).
    Lines(mpsc::Sender<WorkerLine>),
    /// A shared map by operation id, and the watch items in arrival order (a simulation).
    Memory {
        /// Operations by id.
        ops: Arc<std::sync::Mutex<BTreeMap<u64, OpRecord>>>,
        /// Watch items.
        watch: Arc<std::sync::Mutex<Vec<WatchRecord>>>,
    },
}

impl Sink {
    async fn send(&self, line: WorkerLine) {
        match self {
            Sink::Lines(sender) => {
                let _ = sender.send(line).await;
            }
            Sink::Memory { ops, watch } => {
                let record = match line {
                    WorkerLine::Invoke(record) | WorkerLine::Op(record) => record,
                    WorkerLine::Watch(record) => {
                        watch
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .push(record);
                        return;
                    }
                    WorkerLine::Done { .. } => return,
                };
                ops.lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .insert(record.id, record);
            }
        }
    }
}

/// Where a task's fenced writes go.
#[derive(Debug)]
pub enum Fence {
    /// The run's store over its Unix socket.
    Socket(StoreClient),
    /// A store in this process (a simulation).
    Local(SharedFence),
}

impl Fence {
    async fn write(
        &mut self,
        write: &FencedWrite,
        clock: &WorkClock,
    ) -> Result<WriteReply, StoreError> {
        match self {
            Fence::Socket(client) => client.write(write).await,
            Fence::Local(store) => Ok(store.write(write.clone(), clock.now_ns())),
        }
    }
}

/// What every task of a set shares.
#[derive(Debug)]
pub struct Workload {
    /// The tenant of every resource.
    pub tenant: String,
    /// The keyspace.
    pub resources: Vec<String>,
    /// Each resource's group.
    pub groups: Arc<HashMap<String, u32>>,
    /// Lease ttl.
    pub ttl_ms: u64,
}

/// One task's identity.
#[derive(Debug, Clone)]
pub struct TaskSpec {
    /// Its name in the history (`p1t2`).
    pub name: String,
    /// The holder id it acts as.
    pub holder: String,
    /// Seeds its choices.
    pub seed: u64,
    /// Added to its operation ids (unique per process or client host).
    pub id_base: u64,
}

/// The tasks of one client process or simulated client: they share a client, a clock, a sink
/// and the stop signal (the resolve deadline, on the clock).
#[derive(Clone)]
pub struct TaskSet {
    /// The client library.
    pub client: Client,
    /// Time.
    pub clock: WorkClock,
    /// Records.
    pub sink: Sink,
    /// `Some(resolve deadline)` once the tasks must stop.
    pub stop: watch::Receiver<Option<Nanos>>,
    /// The keyspace and ttl.
    pub workload: Arc<Workload>,
    /// Operation counter.
    pub next_id: Arc<AtomicU64>,
    /// Fenced writes the store rejected.
    pub rejected: Arc<AtomicU64>,
}

impl TaskSet {
    /// A task of this set; `.run()` it.
    pub fn task(&self, spec: TaskSpec, fence: Fence) -> Task {
        // One task in three, by name (the same tasks in every run of a seed).
        let uses_sessions = spec.name.bytes().fold(0u64, |hash, byte| {
            hash.wrapping_mul(31).wrapping_add(u64::from(byte))
        }) % 3
            == 0;
        Task {
            set: self.clone(),
            rng: SmallRng::seed_from_u64(spec.seed),
            spec,
            fence,
            replayable: Vec::new(),
            held: None,
            request_seq: 0,
            uses_sessions,
            session: None,
        }
    }
}

/// A call, as it is repeated until a definite answer.
#[derive(Debug, Clone)]
enum Call {
    Acquire {
        resource: String,
    },
    Renew {
        resource: String,
        lease: LeaseRef,
        holder: String,
    },
    Release {
        resource: String,
        lease: LeaseRef,
        holder: String,
    },
    /// Hand the lease to `to` (the task's other identity: it goes on holding as `to`).
    Transfer {
        resource: String,
        lease: LeaseRef,
        holder: String,
        to: String,
    },
    Get {
        resource: String,
    },
    /// Acquire bound to the task's session (opening it in the resource's group first).
    SessionAcquire {
        resource: String,
    },
    /// Acquire, waiting in the resource's FIFO queue while it is held (as a probe of an earlier
    /// wait's request id: one AcquireWait without parking).
    AcquireWait {
        resource: String,
        wait_ms: u64,
    },
    /// Close the task's session: the held lease (bound to it) ends with it.
    SessionClose {
        resource: String,
        lease: LeaseRef,
        holder: String,
    },
}

impl Call {
    fn kind(&self) -> OpKind {
        match self {
            Call::Acquire { .. } => OpKind::Acquire,
            Call::Renew { .. } => OpKind::Renew,
            Call::Release { .. } => OpKind::Release,
            Call::Transfer { .. } => OpKind::Transfer,
            Call::Get { .. } => OpKind::Get,
            Call::SessionAcquire { .. } | Call::AcquireWait { .. } => OpKind::Acquire,
            Call::SessionClose { .. } => OpKind::SessionClose,
        }
    }

    fn resource(&self) -> &str {
        match self {
            Call::Acquire { resource }
            | Call::Renew { resource, .. }
            | Call::Release { resource, .. }
            | Call::Transfer { resource, .. }
            | Call::Get { resource }
            | Call::SessionAcquire { resource }
            | Call::AcquireWait { resource, .. }
            | Call::SessionClose { resource, .. } => resource,
        }
    }

    fn lease(&self) -> Option<LeaseRef> {
        match self {
            Call::Renew { lease, .. }
            | Call::Release { lease, .. }
            | Call::Transfer { lease, .. }
            | Call::SessionClose { lease, .. } => Some(*lease),
            Call::Acquire { .. }
            | Call::Get { .. }
            | Call::SessionAcquire { .. }
            | Call::AcquireWait { .. } => None,
        }
    }

    /// The holder acting, when the call names one (else the task's own holder id).
    fn holder(&self) -> Option<&str> {
        match self {
            Call::Renew { holder, .. }
            | Call::Release { holder, .. }
            | Call::Transfer { holder, .. }
            | Call::SessionClose { holder, .. } => Some(holder),
            Call::Acquire { .. }
            | Call::Get { .. }
            | Call::SessionAcquire { .. }
            | Call::AcquireWait { .. } => None,
        }
    }
}

/// The lease a task holds.
#[derive(Debug, Clone)]
struct Held {
    resource: String,
    lease: LeaseRef,
    /// The identity the lease is held under: the task's holder id, or its other identity
    /// (`<holder>~`) after a transfer.
    holder: String,
    token: u64,
    /// The latest safe deadline the client library gave.
    deadline_ns: Nanos,
    /// When to renew next: a third of a ttl after the last confirmed extension was asked.
    renew_at_ns: Nanos,
    /// For a lease bound to the task's session: its group, the count of the session's
    /// confirmed keep-alives there already recorded (or sent before the grant was answered),
    /// and when the grant was answered (only keep-alives sent after it extend this lease).
    session: Option<(u32, u64, std::time::Instant)>,
}

/// What one attempt gave.
enum Attempt {
    Definite(Outcome),
    Retry(String),
    Final(String),
}

/// One holder's loop (see the module docs).
pub struct Task {
    set: TaskSet,
    spec: TaskSpec,
    rng: SmallRng,
    fence: Fence,
    replayable: Vec<(u64, Call, String)>,
    held: Option<Held>,
    request_seq: u64,
    /// Session tasks (one task in three, by name) hold their leases in a session instead of
    /// renewing them; `session` is the current one (a new one after a close or a loss).
    uses_sessions: bool,
    session: Option<Session>,
}

/// How long one stream of a watcher lasts before it is dropped and a new one resumes from its
/// cursor (drawn per stream).
const WATCH_STREAM_MS: std::ops::RangeInclusive<u64> = 1_000..=6_000;

/// Watches the workload's tenant until the stop signal, recording every item as `name`'s; now
/// and then drops the stream and resumes a new one from the cursor (recording
/// [`WatchItemRecord::Resumed`] for each group in it), so the checker judges resumed streams.
pub async fn run_watcher(set: TaskSet, name: String, seed: u64, stale_read: bool) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut cursor: BTreeMap<u32, u64> = BTreeMap::new();
    let selector = WatchSelector::Tenant(set.workload.tenant.clone());
    let options = WatchOptions {
        stale_read,
        poll_wait: Duration::from_secs(2),
        ..WatchOptions::default()
    };
    let record = |group: u32, item: WatchItemRecord| WatchRecord {
        watcher: name.clone(),
        at_ns: set.clock.now_ns(),
        group,
        item,
    };
    while set.stop.borrow().is_none() {
        let from = if cursor.is_empty() {
            WatchFrom::Now
        } else {
            for (&group, &after) in &cursor {
                set.sink
                    .send(WorkerLine::Watch(record(
                        group,
                        WatchItemRecord::Resumed { after },
                    )))
                    .await;
            }
            WatchFrom::Cursor(cursor.clone())
        };
        let mut watch = match set
            .client
            .watch(selector.clone(), from, options.clone())
            .await
        {
            Ok(watch) => watch,
            Err(error) => {
                tracing::warn!(watcher = %name, "watch: {error}");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let stream_ends =
            tokio::time::Instant::now() + Duration::from_millis(rng.random_range(WATCH_STREAM_MS));
        loop {
            if set.stop.borrow().is_some() {
                break;
            }
            let now = tokio::time::Instant::now();
            if now >= stream_ends {
                break;
            }
            let slice = (stream_ends - now).min(Duration::from_millis(250));
            let item = match tokio::time::timeout(slice, watch.next_item()).await {
                Err(_) => continue,
                Ok(None) => break,
                Ok(Some(Err(error))) => {
                    tracing::warn!(watcher = %name, "watch: {error}");
                    continue;
                }
                Ok(Some(Ok(item))) => item,
            };
            let (group, item) = match item {
                WatchItem::Started {
                    group_id,
                    through_index,
                    ..
                } => (
                    group_id,
                    WatchItemRecord::Started {
                        index: through_index,
                    },
                ),
                WatchItem::Through { group_id, index } => {
                    (group_id, WatchItemRecord::Through { index })
                }
                WatchItem::Resync {
                    group_id,
                    through_index,
                    ..
                } => (
                    group_id,
                    WatchItemRecord::Resync {
                        index: through_index,
                    },
                ),
                WatchItem::Event(event) => {
                    let holder = match &event.kind {
                        WatchEventKind::Acquired { holder_id, .. }
                        | WatchEventKind::HandedOff { holder_id, .. }
                        | WatchEventKind::Released { holder_id, .. } => Some(holder_id.clone()),
                        WatchEventKind::Expired { .. } => None,
                    };
                    (
                        event.group_id,
                        WatchItemRecord::Event {
                            index: event.index,
                            log_time_ms: event.log_time_ms,
                            resource: event.key.resource_id.clone(),
                            kind: event.kind.as_str().to_string(),
                            holder,
                            token: event.kind.fencing_token(),
                        },
                    )
                }
            };
            set.sink.send(WorkerLine::Watch(record(group, item))).await;
        }
        cursor = watch.cursor().clone();
    }
}

/// A grant as the history records it.
fn granted_outcome(grant: &Grant, clock: &WorkClock) -> Outcome {
    Outcome::Granted {
        lease: lease_ref(grant.lease_id),
        token: grant.fencing_token,
        log_time_ms: grant.log_time_ms,
        expires_at_ms: grant.expires_at_ms,
        replayed: grant.replayed,
        safe_deadline_ns: clock.to_ns(grant.safe_deadline),
    }
}

/// A Get's answer as the history records it.
pub(crate) fn read_outcome(result: GetResult) -> Outcome {
    Outcome::Read {
        view: result.view.map(|view| ViewRecord {
            lease: lease_ref(view.lease_id),
            holder: view.holder_id,
            status: view.status.as_str().to_string(),
            token: view.fencing_token,
            version: view.version,
            expires_at_ms: view.expires_at_ms,
        }),
        log_time_ms: result.log_time_ms,
    }
}

fn lease_ref(id: LeaseId) -> LeaseRef {
    LeaseRef {
        group: id.group_id.0,
        sequence: id.sequence,
    }
}

fn lease_id(lease: LeaseRef) -> LeaseId {
    LeaseId {
        group_id: GroupId(lease.group),
        sequence: lease.sequence,
    }
}

/// State-machine refusals: definite answers with no effect.
const DEFINITE_CODES: [&str; 6] = [
    "ALREADY_HELD",
    "LEASE_EXPIRED",
    "LEASE_MISMATCH",
    "NOT_FOUND",
    "QUOTA_EXCEEDED",
    "INVALID_ARGUMENT",
];

fn classify_error(error: &ClientError) -> Attempt {
    let code = error.code_str();
    if DEFINITE_CODES.contains(&code) {
        let holder = error.current_holder().map(|(holder, _)| holder.to_string());
        return Attempt::Definite(Outcome::Refused {
            code: code.to_string(),
            holder,
        });
    }
    match error {
        ClientError::Protocol(_)
        | ClientError::Closed
        | ClientError::Config(_)
        | ClientError::InvalidRequest(_) => Attempt::Final(error.to_string()),
        _ => Attempt::Retry(error.to_string()),
    }
}

impl Task {
    fn stopping(&self) -> bool {
        self.set.stop.borrow().is_some()
    }

    fn past_resolve_deadline(&self) -> bool {
        self.set
            .stop
            .borrow()
            .is_some_and(|deadline| self.set.clock.now_ns() >= deadline)
    }

    fn key(&self, resource: &str) -> ResourceKey {
        ResourceKey::new(self.set.workload.tenant.clone(), resource.to_string())
    }

    fn ttl(&self) -> Duration {
        Duration::from_millis(self.set.workload.ttl_ms)
    }

    fn new_request_id(&mut self) -> String {
        self.request_seq += 1;
        format!("{}-{}", self.spec.holder, self.request_seq)
    }

    /// Runs until the stop signal, then hands back its lease.
    pub async fn run(mut self) {
        while !self.stopping() {
            match self.held.clone() {
                Some(held) => self.while_holding(held).await,
                None => self.while_free().await,
            }
        }
        // Stopping: hand the lease back, as a well-behaved holder does.
        if let Some(held) = self.held.take() {
            let call = Call::Release {
                resource: held.resource,
                lease: held.lease,
                holder: held.holder,
            };
            let request_id = self.new_request_id();
            self.perform(call, Some(request_id), None).await;
        }
        // Nothing is held any more: the session can go (unrecorded).
        if let Some(session) = self.session.take() {
            let _ = session.close().await;
        }
    }

    async fn pause(&mut self, low_ms: u64, high_ms: u64) {
        let ms = self.rng.random_range(low_ms..=high_ms);
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }

    async fn while_free(&mut self) {
        let roll: f64 = self.rng.random();
        if roll < 0.05 && !self.replayable.is_empty() {
            self.replay().await;
            return;
        }
        let resources = &self.set.workload.resources;
        let resource = resources[self.rng.random_range(0..resources.len())].clone();
        if roll < 0.20 {
            self.perform(Call::Get { resource }, None, None).await;
            return;
        }
        if self.uses_sessions {
            self.acquire_in_session(resource).await;
            return;
        }
        if roll < 0.35 {
            self.acquire_waiting(resource).await;
            return;
        }
        let request_id = self.new_request_id();
        let record = self
            .perform(
                Call::Acquire {
                    resource: resource.clone(),
                },
                Some(request_id),
                None,
            )
            .await;
        // A replayed grant (no window) is renewed at once to learn a deadline.
        let renew_at_ns = match record.outcome {
            Outcome::Granted {
                safe_deadline_ns, ..
            } if safe_deadline_ns > record.complete_ns.unwrap_or(0) => {
                record.invoke_ns + self.set.workload.ttl_ms * 1_000_000 / 3
            }
            _ => 0,
        };
        self.hold_granted(resource, &record, renew_at_ns).await;
    }

    /// Holds the lease `record` was granted (renewing it first at `renew_at_ns`), or pauses
    /// when it got none.
    async fn hold_granted(&mut self, resource: String, record: &OpRecord, renew_at_ns: Nanos) {
        match record.outcome {
            Outcome::Granted {
                lease,
                token,
                safe_deadline_ns,
                ..
            } => {
                self.held = Some(Held {
                    resource,
                    lease,
                    holder: self.spec.holder.clone(),
                    token,
                    deadline_ns: safe_deadline_ns,
                    renew_at_ns,
                    session: None,
                });
            }
            _ => self.pause(30, 150).await,
        }
    }

    async fn while_holding(&mut self, held: Held) {
        if held.session.is_some() {
            self.while_holding_in_session(held).await;
            return;
        }
        let now = self.set.clock.now_ns();
        if now >= held.renew_at_ns {
            let request_id = self.new_request_id();
            let record = self
                .perform(
                    Call::Renew {
                        resource: held.resource.clone(),
                        lease: held.lease,
                        holder: held.holder.clone(),
                    },
                    Some(request_id),
                    None,
                )
                .await;
            self.held = match record.outcome {
                Outcome::Granted {
                    safe_deadline_ns, ..
                } => Some(Held {
                    deadline_ns: held.deadline_ns.max(safe_deadline_ns),
                    renew_at_ns: if safe_deadline_ns > record.complete_ns.unwrap_or(0) {
                        record.invoke_ns + self.set.workload.ttl_ms * 1_000_000 / 3
                    } else {
                        0
                    },
                    ..held
                }),
                // Refused (expired, released, taken) or unanswered: the lease is gone.
                _ => None,
            };
            return;
        }
        let roll: f64 = self.rng.random();
        if roll < 0.45 {
            self.fenced_write(&held).await;
            self.pause(5, 30).await;
        } else if roll < 0.52 {
            self.release_held(&held).await;
        } else if roll < 0.55 {
            self.transfer(&held).await;
        } else if roll < 0.62 {
            self.read_held(&held).await;
        } else if roll < 0.66 && !self.replayable.is_empty() {
            self.replay().await;
        } else {
            self.pause(20, 80).await;
        }
    }

    /// Releases the held lease (whatever the answer, the task stops holding it).
    async fn release_held(&mut self, held: &Held) {
        let request_id = self.new_request_id();
        self.perform(
            Call::Release {
                resource: held.resource.clone(),
                lease: held.lease,
                holder: held.holder.clone(),
            },
            Some(request_id),
            None,
        )
        .await;
        self.held = None;
    }

    /// Options of a wait for `resource` as this task.
    fn wait_options(&self, resource: &str, wait_ms: u64) -> WaitOptions {
        let mut options = WaitOptions::new(
            self.set.workload.tenant.clone(),
            resource.to_string(),
            self.spec.holder.clone(),
            self.ttl(),
            Duration::from_millis(wait_ms),
        );
        // The grant is recorded as the hand-off answered it; the task renews it at once itself.
        options.renew_after_park = false;
        options
    }

    /// Waits for `resource` in its FIFO queue: joins it without parking (learning its place),
    /// then parks until the grant or the end of the wait, with the same request id. Recorded as
    /// one Acquire with its [`WaitRecord`].
    async fn acquire_waiting(&mut self, resource: String) {
        let ttl_ms = self.set.workload.ttl_ms;
        let wait_ms = self.rng.random_range(ttl_ms / 2..=ttl_ms * 2);
        let request_id = self.new_request_id();
        let call = Call::AcquireWait {
            resource: resource.clone(),
            wait_ms,
        };
        let mut record = self.open_record(&call, Some(request_id.clone()), None);
        self.set.sink.send(WorkerLine::Invoke(record.clone())).await;
        let options = self.wait_options(&resource, wait_ms);
        // Join the queue (or get the resource at once), retrying the same request id.
        let queued = loop {
            record.attempts += 1;
            match self.set.client.wait_enqueue(&options, &request_id).await {
                Ok(WaitStep::Granted(grant)) => {
                    record.outcome = granted_outcome(&grant, &self.set.clock);
                    record.complete_ns = Some(self.set.clock.completed_ns());
                    break None;
                }
                Ok(WaitStep::Queued(receipt)) => break Some(receipt),
                Err(error) => match classify_error(&error) {
                    Attempt::Definite(outcome) => {
                        record.outcome = outcome;
                        record.complete_ns = Some(self.set.clock.completed_ns());
                        break None;
                    }
                    Attempt::Final(error) => {
                        record.outcome = Outcome::Unknown { error };
                        break None;
                    }
                    Attempt::Retry(error) => {
                        if self.past_resolve_deadline() {
                            record.outcome = Outcome::Unknown { error };
                            break None;
                        }
                        self.pause(50, 200).await;
                    }
                },
            }
        };
        if let Some(receipt) = queued {
            record.wait = Some(WaitRecord {
                wait_ms,
                queued_at_ms: Some(receipt.queued_at_ms),
                wait_until_ms: Some(receipt.wait_until_ms),
                position: Some(receipt.position),
            });
            // Park until the wait ends there. The library's own deadline is set well past the
            // queue's (a retry's `wait_ms` does not change the wait), so the queue, not the
            // library giving up and cancelling, ends the wait: a call that ends any other way
            // (an error; the library then cancels the wait, and releases a grant that beat the
            // cancel) is recorded without an answer.
            let mut parked = options.clone();
            parked.wait = Duration::from_millis(wait_ms) + PARKED_WAIT_EXTRA;
            parked.request_id = Some(request_id.clone());
            let parked_at = self.set.clock.now_ns();
            record.attempts += 1;
            match self.set.client.acquire_wait(parked).await {
                Ok(grant) => {
                    record.outcome = granted_outcome(&grant, &self.set.clock);
                    record.complete_ns = Some(self.set.clock.completed_ns());
                }
                Err(error) => {
                    let gave_up = self.set.clock.now_ns().saturating_sub(parked_at)
                        >= (wait_ms + PARKED_WAIT_EXTRA_MS) * 1_000_000;
                    match classify_error(&error) {
                        Attempt::Definite(outcome) if !gave_up => {
                            record.outcome = outcome;
                            record.complete_ns = Some(self.set.clock.completed_ns());
                        }
                        _ => {
                            record.outcome = Outcome::Unknown {
                                error: error.to_string(),
                            }
                        }
                    }
                }
            }
        }
        if record.outcome.is_definite() {
            if self.replayable.len() >= REPLAYABLE_MAX {
                self.replayable.remove(0);
            }
            self.replayable.push((record.id, call, request_id));
        }
        self.set.sink.send(WorkerLine::Op(record.clone())).await;
        // The grant's window counts from the first send, up to a park ago: renew at once for a
        // window of its own.
        self.hold_granted(resource, &record, 0).await;
    }

    /// Reads the held lease's resource.
    async fn read_held(&mut self, held: &Held) {
        self.perform(
            Call::Get {
                resource: held.resource.clone(),
            },
            None,
            None,
        )
        .await;
    }

    /// The task's session, a new one if it has none.
    fn session(&mut self) -> Result<Session, String> {
        if let Some(session) = &self.session {
            return Ok(session.clone());
        }
        let session = self
            .set
            .client
            .session(
                self.set.workload.tenant.clone(),
                self.spec.holder.clone(),
                self.ttl(),
            )
            .map_err(|error| error.to_string())?;
        self.session = Some(session.clone());
        Ok(session)
    }

    async fn acquire_in_session(&mut self, resource: String) {
        if let Err(error) = self.session() {
            tracing::warn!(task = %self.spec.name, "session: {error}");
            self.pause(30, 150).await;
            return;
        }
        let request_id = self.new_request_id();
        let record = self
            .perform(
                Call::SessionAcquire {
                    resource: resource.clone(),
                },
                Some(request_id),
                None,
            )
            .await;
        match record.outcome {
            Outcome::Granted {
                lease,
                token,
                safe_deadline_ns,
                ..
            } => {
                let group = self
                    .set
                    .workload
                    .groups
                    .get(&resource)
                    .copied()
                    .unwrap_or(0);
                // Keep-alives sent before the grant was answered are not recorded for it.
                let seen = self
                    .session
                    .as_ref()
                    .and_then(|s| s.last_keepalive(group))
                    .map_or(0, |k| k.count);
                self.held = Some(Held {
                    resource,
                    lease,
                    holder: self.spec.holder.clone(),
                    token,
                    deadline_ns: safe_deadline_ns,
                    renew_at_ns: Nanos::MAX,
                    session: Some((group, seen, tokio::time::Instant::now().into_std())),
                });
            }
            Outcome::Refused { ref code, .. } if code == "LEASE_EXPIRED" || code == "NOT_FOUND" => {
                // The session ended in that group: a new session for the next acquires.
                self.session = None;
                self.pause(30, 150).await;
            }
            _ => self.pause(30, 150).await,
        }
    }

    /// Records the session's confirmed keep-alives in the held lease's group since the last
    /// one recorded (each extends the lease: an [`OpKind::KeepAlive`] record), and moves the
    /// lease's safe deadline with them.
    async fn record_keepalives(&mut self, held: &mut Held) {
        let (Some(session), Some((group, seen, granted_at))) = (&self.session, held.session) else {
            return;
        };
        let Some(kept) = session.last_keepalive(group) else {
            return;
        };
        if kept.count <= seen {
            return;
        }
        held.session = Some((group, kept.count, granted_at));
        if kept.sent_at < granted_at {
            return;
        }
        let clock = &self.set.clock;
        let record = OpRecord {
            id: self.spec.id_base | self.set.next_id.fetch_add(1, Ordering::Relaxed),
            client: self.spec.name.clone(),
            holder: held.holder.clone(),
            resource: held.resource.clone(),
            group,
            kind: OpKind::KeepAlive,
            request_id: None,
            lease: Some(held.lease),
            ttl_ms: self.set.workload.ttl_ms,
            new_holder: None,
            replay_of: None,
            wait: None,
            invoke_ns: clock.to_ns(kept.sent_at),
            complete_ns: Some(clock.to_completion_ns(kept.confirmed_at)),
            attempts: 1,
            outcome: Outcome::Granted {
                lease: held.lease,
                token: held.token,
                log_time_ms: kept.log_time_ms,
                expires_at_ms: kept.expires_at_ms,
                replayed: false,
                safe_deadline_ns: clock.to_ns(kept.safe_deadline),
            },
        };
        held.deadline_ns = held.deadline_ns.max(clock.to_ns(kept.safe_deadline));
        self.set.sink.send(WorkerLine::Invoke(record.clone())).await;
        self.set.sink.send(WorkerLine::Op(record)).await;
    }

    /// Holding a lease bound to the task's session: no renewals (the session's keep-alives
    /// extend it); writes, releases, session closes and reads.
    async fn while_holding_in_session(&mut self, mut held: Held) {
        self.record_keepalives(&mut held).await;
        self.held = Some(held.clone());
        if self.set.clock.now_ns() >= held.deadline_ns {
            // No keep-alive confirmed in time: the lease is lost (and so is the session there).
            self.held = None;
            self.session = None;
            return;
        }
        let roll: f64 = self.rng.random();
        if roll < 0.45 {
            self.fenced_write(&held).await;
            self.pause(5, 30).await;
        } else if roll < 0.52 {
            self.release_held(&held).await;
        } else if roll < 0.55 {
            self.perform(
                Call::SessionClose {
                    resource: held.resource.clone(),
                    lease: held.lease,
                    holder: held.holder.clone(),
                },
                None,
                None,
            )
            .await;
            self.held = None;
            self.session = None;
        } else if roll < 0.62 {
            self.read_held(&held).await;
        } else {
            self.pause(20, 80).await;
        }
    }

    /// Hands the lease to the task's other identity and goes on holding the new lease as it:
    /// the old identity stops acting when it asks (its window is cut at the transfer), the new
    /// one acts within the new grant's safe window.
    async fn transfer(&mut self, held: &Held) {
        let to = if held.holder == self.spec.holder {
            format!("{}~", self.spec.holder)
        } else {
            self.spec.holder.clone()
        };
        let request_id = self.new_request_id();
        let record = self
            .perform(
                Call::Transfer {
                    resource: held.resource.clone(),
                    lease: held.lease,
                    holder: held.holder.clone(),
                    to: to.clone(),
                },
                Some(request_id),
                None,
            )
            .await;
        self.held = match record.outcome {
            Outcome::Granted {
                lease,
                token,
                safe_deadline_ns,
                ..
            } => Some(Held {
                resource: held.resource.clone(),
                lease,
                holder: to,
                token,
                deadline_ns: safe_deadline_ns,
                renew_at_ns: if safe_deadline_ns > record.complete_ns.unwrap_or(0) {
                    record.invoke_ns + self.set.workload.ttl_ms * 1_000_000 / 3
                } else {
                    0
                },
                session: None,
            }),
            // Refused or unanswered: the old lease is gone either way (or going).
            _ => None,
        };
    }

    /// Checks the deadline, "works", then writes: a pause in between makes a late write.
    async fn fenced_write(&mut self, held: &Held) {
        let checked_ns = self.set.clock.now_ns();
        if checked_ns >= held.deadline_ns {
            return;
        }
        self.pause(10, 60).await;
        let request = FencedWrite {
            client: self.spec.name.clone(),
            holder: held.holder.clone(),
            resource: held.resource.clone(),
            token: held.token,
            checked_ns,
            deadline_ns: held.deadline_ns,
        };
        match self.fence.write(&request, &self.set.clock).await {
            Ok(reply) if !reply.accepted => {
                // Fenced off: a newer holder wrote. Stop acting as the holder.
                self.set.rejected.fetch_add(1, Ordering::Relaxed);
                self.held = None;
            }
            Ok(_) => {}
            Err(error) => tracing::warn!(task = %self.spec.name, "fenced store: {error}"),
        }
    }

    /// Sends an earlier operation's request id again, with the same arguments.
    async fn replay(&mut self) {
        let index = self.rng.random_range(0..self.replayable.len());
        let (original, call, request_id) = self.replayable[index].clone();
        self.perform(call, Some(request_id), Some(original)).await;
    }

    /// The record of `call`, before it is sent (its outcome `Unknown`).
    fn open_record(
        &self,
        call: &Call,
        request_id: Option<String>,
        replay_of: Option<u64>,
    ) -> OpRecord {
        let resource = call.resource().to_string();
        OpRecord {
            id: self.spec.id_base | self.set.next_id.fetch_add(1, Ordering::Relaxed),
            client: self.spec.name.clone(),
            holder: call
                .holder()
                .map_or_else(|| self.spec.holder.clone(), str::to_string),
            group: self
                .set
                .workload
                .groups
                .get(&resource)
                .copied()
                .unwrap_or(u32::MAX),
            resource,
            kind: call.kind(),
            request_id: request_id.clone(),
            lease: call.lease(),
            ttl_ms: match call.kind() {
                OpKind::Acquire | OpKind::Renew | OpKind::Transfer | OpKind::KeepAlive => {
                    self.set.workload.ttl_ms
                }
                OpKind::Release | OpKind::Get | OpKind::SessionClose => 0,
            },
            new_holder: match call {
                Call::Transfer { to, .. } => Some(to.clone()),
                _ => None,
            },
            replay_of,
            wait: match call {
                Call::AcquireWait { wait_ms, .. } => Some(WaitRecord {
                    wait_ms: *wait_ms,
                    queued_at_ms: None,
                    wait_until_ms: None,
                    position: None,
                }),
                _ => None,
            },
            invoke_ns: self.set.clock.now_ns(),
            complete_ns: None,
            attempts: 0,
            outcome: Outcome::Unknown {
                error: "no answer recorded".into(),
            },
        }
    }

    /// Calls until a definite answer (or, once stopping, the resolve deadline); records it.
    async fn perform(
        &mut self,
        call: Call,
        request_id: Option<String>,
        replay_of: Option<u64>,
    ) -> OpRecord {
        let mut record = self.open_record(&call, request_id.clone(), replay_of);
        self.set.sink.send(WorkerLine::Invoke(record.clone())).await;
        let (outcome, complete_ns) = loop {
            record.attempts += 1;
            match self.attempt(&call, request_id.as_deref()).await {
                Attempt::Definite(outcome) => break (outcome, Some(self.set.clock.completed_ns())),
                Attempt::Final(error) => break (Outcome::Unknown { error }, None),
                Attempt::Retry(error) => {
                    // A read that failed says nothing; do not insist.
                    if (call.kind() == OpKind::Get && record.attempts >= 2)
                        || self.past_resolve_deadline()
                    {
                        break (Outcome::Unknown { error }, None);
                    }
                    self.pause(50, 200).await;
                }
            }
        };
        record.outcome = outcome;
        record.complete_ns = complete_ns;
        if matches!(call, Call::SessionAcquire { .. }) {
            // A lease bound to a session lasts until the session's record expires, which may be
            // sooner than a ttl after the grant: what the grant says is left (and, without an
            // answer, nothing is sure: zero).
            record.ttl_ms = match record.outcome {
                Outcome::Granted {
                    log_time_ms,
                    expires_at_ms,
                    ..
                } => expires_at_ms.saturating_sub(log_time_ms),
                _ => 0,
            };
        }
        // A session acquire is not probed again: the task's session may have changed since,
        // and the same request id with another session is another request (refused).
        let replayable = call.kind() != OpKind::Get && !matches!(call, Call::SessionAcquire { .. });
        if replay_of.is_none() && record.outcome.is_definite() && replayable {
            if let Some(request_id) = request_id {
                if self.replayable.len() >= REPLAYABLE_MAX {
                    self.replayable.remove(0);
                }
                self.replayable.push((record.id, call, request_id));
            }
        }
        self.set.sink.send(WorkerLine::Op(record.clone())).await;
        record
    }

    async fn attempt(&self, call: &Call, request_id: Option<&str>) -> Attempt {
        let ttl = self.ttl();
        match call {
            Call::Acquire { resource } => {
                let mut options = AcquireOptions::new(
                    self.set.workload.tenant.clone(),
                    resource.clone(),
                    self.spec.holder.clone(),
                    ttl,
                );
                if let Some(id) = request_id {
                    options = options.request_id(id);
                }
                match self.set.client.acquire_grant(options).await {
                    Ok(grant) => Attempt::Definite(granted_outcome(&grant, &self.set.clock)),
                    Err(error) => classify_error(&error),
                }
            }
            Call::Renew {
                resource,
                lease,
                holder,
            } => {
                match self
                    .set
                    .client
                    .renew(
                        self.key(resource),
                        lease_id(*lease),
                        holder.clone(),
                        ttl,
                        request_id.map(str::to_string),
                    )
                    .await
                {
                    Ok(grant) => Attempt::Definite(granted_outcome(&grant, &self.set.clock)),
                    Err(error) => classify_error(&error),
                }
            }
            Call::Transfer {
                resource,
                lease,
                holder,
                to,
            } => {
                match self
                    .set
                    .client
                    .transfer(
                        self.key(resource),
                        lease_id(*lease),
                        holder.clone(),
                        to.clone(),
                        ttl,
                        request_id.map(str::to_string),
                    )
                    .await
                {
                    Ok(transferred) => {
                        Attempt::Definite(granted_outcome(&transferred.grant, &self.set.clock))
                    }
                    Err(error) => classify_error(&error),
                }
            }
            Call::Release {
                resource,
                lease,
                holder,
            } => {
                match self
                    .set
                    .client
                    .release(
                        self.key(resource),
                        lease_id(*lease),
                        holder.clone(),
                        request_id.map(str::to_string),
                    )
                    .await
                {
                    Ok(receipt) => Attempt::Definite(Outcome::Released {
                        lease: lease_ref(receipt.lease_id),
                        token: receipt.fencing_token,
                        released_at_ms: receipt.released_at_ms,
                    }),
                    Err(error) => classify_error(&error),
                }
            }
            Call::Get { resource } => match self.set.client.get(&self.key(resource)).await {
                Ok(result) => Attempt::Definite(read_outcome(result)),
                Err(error) => classify_error(&error),
            },
            Call::SessionAcquire { resource } => {
                let Some(session) = self.session.clone() else {
                    return Attempt::Final("no session".into());
                };
                match session
                    .acquire_with(resource.clone(), request_id.map(str::to_string))
                    .await
                {
                    Ok(lease) => {
                        let deadline = session
                            .safe_deadline(lease.group_id)
                            .map_or(0, |d| self.set.clock.to_ns(d));
                        Attempt::Definite(Outcome::Granted {
                            lease: lease_ref(lease.lease_id),
                            token: lease.fencing_token,
                            log_time_ms: lease.log_time_ms,
                            expires_at_ms: lease.expires_at_ms,
                            replayed: lease.replayed,
                            safe_deadline_ns: deadline,
                        })
                    }
                    // Decided by the client library, not the state machine (the session was
                    // lost meanwhile, or a replay no longer stands): the request may have been
                    // granted. Ask the group again with the same request id for its definite
                    // answer, recorded without a window (the lease is not held).
                    Err(ClientError::Server {
                        lease_error: None,
                        code,
                        ..
                    }) if !code.retryable() => {
                        let key = self.key(resource);
                        let Some(request_id) = request_id else {
                            return Attempt::Final("no request id".into());
                        };
                        match self
                            .set
                            .client
                            .acquire_in_session(
                                &key,
                                &self.spec.holder,
                                session.id(),
                                Some(request_id.to_string()),
                            )
                            .await
                        {
                            Ok((_, grant)) => Attempt::Definite(Outcome::Granted {
                                lease: lease_ref(grant.lease_id),
                                token: grant.fencing_token,
                                log_time_ms: grant.log_time_ms,
                                expires_at_ms: grant.expires_at_ms,
                                replayed: true,
                                safe_deadline_ns: self.set.clock.now_ns(),
                            }),
                            Err(error) => classify_error(&error),
                        }
                    }
                    Err(error) => classify_error(&error),
                }
            }
            Call::AcquireWait { resource, wait_ms } => {
                let Some(request_id) = request_id else {
                    return Attempt::Final("no request id".into());
                };
                match self
                    .set
                    .client
                    .wait_enqueue(&self.wait_options(resource, *wait_ms), request_id)
                    .await
                {
                    Ok(WaitStep::Granted(grant)) => {
                        Attempt::Definite(granted_outcome(&grant, &self.set.clock))
                    }
                    // A probe of a wait that ended must find its end, never a new place: record
                    // the place as the answer (the checker compares it with the original).
                    Ok(WaitStep::Queued(_)) => Attempt::Definite(Outcome::Refused {
                        code: "QUEUED".into(),
                        holder: None,
                    }),
                    Err(error) => classify_error(&error),
                }
            }
            Call::SessionClose { lease, .. } => {
                let Some(session) = self.session.clone() else {
                    return Attempt::Final("no session".into());
                };
                let group = lease.group;
                match session.close().await {
                    Ok(receipts) => match receipts.iter().find(|r| r.group_id.0 == group) {
                        Some(receipt) => Attempt::Definite(Outcome::Released {
                            lease: *lease,
                            token: lease.sequence,
                            released_at_ms: receipt.closed_at_ms,
                        }),
                        // The session had already ended in that group.
                        None => Attempt::Final("the session was not open in the group".into()),
                    },
                    // A close is not repeated (the handle is closed either way).
                    Err(error) => Attempt::Final(error.to_string()),
                }
            }
        }
    }
}
