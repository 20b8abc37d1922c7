//! The lease-safety checker: reads a [`History`] and reports every violation of the contract's
//! safety properties, each with the smallest slice of history that shows it.
//!
//! 1. **Single holder** ([`Property::SingleHolder`]): for every resource, no two leases' safe
//!    windows overlap in real time. A lease's window is the union, over its successful Acquire
//!    and Renew answers, of `[answer received, safe deadline]`, cut at the first Release its
//!    holder sent.
//! 2. **Fencing** ([`Property::Fencing`]): a lease keeps one token (renew never changes it) equal
//!    to its sequence; tokens of one resource strictly increase in grant order, judged both by
//!    real time (a grant answered before another was asked has the smaller token) and by log
//!    time. Downstream too: the fenced store rejects a write that reached it inside its writer's
//!    safe window only if a higher token wrote first, which takes two holders at once or tokens
//!    out of grant order.
//! 3. **Nothing acknowledged lost** ([`Property::NoLostAck`]): every later read reflects every
//!    acknowledged grant (a token at least as new), renewal (a version at least as high) and
//!    release (never ACTIVE again); no renewal of a released lease succeeds; no later grant of
//!    the resource comes before, in log time, the expiry an acknowledged renewal promised; log
//!    time never goes back along a group.
//! 4. **Exactly once** ([`Property::ExactlyOnce`]): a request id sent again returns the original
//!    outcome, marked replayed, and changes nothing.
//! 5. **Linearizable** ([`Property::Linearizable`]): each resource's operations have a sequential
//!    order, within their real-time windows, that the lease register model accepts (see
//!    [`linearizability`]), with log-time expiry modelled conservatively.
//! 6. **Liveness after heal** ([`Property::Liveness`]): every client made progress within a
//!    bound after the last fault healed ([`check_liveness`]; the run adds "every group has a
//!    leader", which it observes itself).
//!
//! 7. **Wait queues** ([`Property::WaitQueue`]): no hand-off to a waiter whose wait had ended,
//!    and none past a live waiter queued earlier ([`queues`]).
//! 8. **Watch streams** ([`Property::Watch`]): each watcher's events per group in log order,
//!    without gaps (across resumes too), a lease's end before the resource's next grant, and
//!    grants that agree with the history ([`queues`]).
//! 9. **Lock commands** ([`Property::LockCommand`]): the commands `tenurectl lock` ran for one
//!    lock never ran at once, and ran in fencing-token order ([`queues`]).
//!
//! Operations without a definite answer ([`Outcome::Unknown`]) are indeterminate: they may have
//! taken effect at any time after they were invoked, or never. Only state-machine answers are
//! definite.
//!
//! Must not depend on: processes, the network, the client library. The deterministic simulation
//! runs the same checker on its histories.

pub mod linearizability;
mod queues;

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::history::{History, LeaseRef, Nanos, OpKind, OpRecord, Outcome, WriteRecord};

/// The properties the checker judges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Property {
    /// No two holders' safe windows overlap.
    SingleHolder,
    /// Tokens strictly increase in grant order; renew keeps the token.
    Fencing,
    /// Every acknowledged operation is reflected by later reads and decisions.
    NoLostAck,
    /// A retried request id returns its original outcome.
    ExactlyOnce,
    /// Each resource's history is linearizable.
    Linearizable,
    /// Progress after the faults healed.
    Liveness,
    /// At most one leader per group and term (Raft's election safety, from the nodes' status).
    ElectionSafety,
    /// A node process exited by itself (a broken invariant aborts it).
    NodeCrash,
    /// A node that lost its data rejoined its groups under its old id (the simulation's wiped
    /// replace-node: its replicas must never be admitted).
    Amnesia,
    /// A hand-off went to a dead waiter, or past a live waiter queued earlier.
    WaitQueue,
    /// A watch stream delivered events out of order, with a gap, or unlike the history.
    Watch,
    /// Two commands `tenurectl lock` ran for one lock ran at once, or out of token order.
    LockCommand,
}

impl Property {
    /// Its name in reports (`single-holder`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Property::SingleHolder => "single-holder",
            Property::Fencing => "fencing",
            Property::NoLostAck => "no-lost-ack",
            Property::ExactlyOnce => "exactly-once",
            Property::Linearizable => "linearizable",
            Property::Liveness => "liveness",
            Property::ElectionSafety => "election-safety",
            Property::NodeCrash => "node-crash",
            Property::Amnesia => "amnesia",
            Property::WaitQueue => "wait-queue",
            Property::Watch => "watch",
            Property::LockCommand => "lock-command",
        }
    }
}

/// One violation and the history that shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Violation {
    /// Which property.
    pub property: Property,
    /// The resource, when the violation concerns one.
    pub resource: Option<String>,
    /// What is wrong.
    pub message: String,
    /// The operations that show it (the minimal slice).
    pub ops: Vec<OpRecord>,
    /// The fenced-store writes that show it, if any.
    pub writes: Vec<WriteRecord>,
}

impl Violation {
    fn new(property: Property, resource: &str, message: String, ops: Vec<&OpRecord>) -> Self {
        Violation {
            property,
            resource: Some(resource.to_string()),
            message,
            ops: ops.into_iter().cloned().collect(),
            writes: Vec::new(),
        }
    }

    /// A readable multi-line description: the message, then one line per operation and write.
    pub fn describe(&self, origin_ns: Nanos) -> String {
        let mut text = format!(
            "[{}]{} {}",
            self.property.name(),
            self.resource
                .as_ref()
                .map(|r| format!(" {r}:"))
                .unwrap_or_default(),
            self.message
        );
        for op in &self.ops {
            text.push_str("\n    ");
            text.push_str(&describe_op(op, origin_ns));
        }
        for write in &self.writes {
            text.push_str(&format!(
                "\n    write by {} token {} checked {} deadline {} arrived {} -> {} (highest before {})",
                write.write.client,
                write.write.token,
                ms_since(write.write.checked_ns, origin_ns),
                ms_since(write.write.deadline_ns, origin_ns),
                ms_since(write.arrived_ns, origin_ns),
                if write.accepted {
                    "accepted"
                } else {
                    "rejected"
                },
                write.highest_before
            ));
        }
        text
    }
}

fn ms_since(at: Nanos, origin: Nanos) -> String {
    let delta = i128::from(at) - i128::from(origin);
    format!("{:.3}s", delta as f64 / 1e9)
}

/// One line for an operation: times relative to `origin_ns`.
pub fn describe_op(op: &OpRecord, origin_ns: Nanos) -> String {
    let complete = op
        .complete_ns
        .map_or_else(|| "?".to_string(), |c| ms_since(c, origin_ns));
    let mut lease = op.lease.map(|l| format!(" lease {l}")).unwrap_or_default();
    if let Some(new_holder) = &op.new_holder {
        lease.push_str(&format!(" to {new_holder}"));
    }
    let replay = op
        .replay_of
        .map(|id| format!(" replay of #{id}"))
        .unwrap_or_default();
    format!(
        "#{} {} {:?}{}{} ttl {} [{} .. {}] x{} -> {}",
        op.id,
        op.client,
        op.kind,
        lease,
        replay,
        op.ttl_ms,
        ms_since(op.invoke_ns, origin_ns),
        complete,
        op.attempts,
        describe_outcome(&op.outcome, origin_ns)
    )
}

fn describe_outcome(outcome: &Outcome, origin_ns: Nanos) -> String {
    match outcome {
        Outcome::Granted {
            lease,
            token,
            log_time_ms,
            expires_at_ms,
            replayed,
            safe_deadline_ns,
        } => format!(
            "granted {lease} token {token} at log {log_time_ms} until log {expires_at_ms}{} safe until {}",
            if *replayed { " (replayed)" } else { "" },
            ms_since(*safe_deadline_ns, origin_ns)
        ),
        Outcome::Released {
            lease,
            token,
            released_at_ms,
        } => format!("released {lease} token {token} at log {released_at_ms}"),
        Outcome::Read { view, log_time_ms } => match view {
            None => format!("ABSENT at log {log_time_ms}"),
            Some(v) => format!(
                "{} {} held by {} token {} version {} until log {} (read at log {log_time_ms})",
                v.status, v.lease, v.holder, v.token, v.version, v.expires_at_ms
            ),
        },
        Outcome::Refused { code, holder } => match holder {
            Some(holder) => format!("{code} (holder {holder})"),
            None => code.clone(),
        },
        Outcome::Unknown { error } => format!("UNKNOWN ({error})"),
    }
}

/// What the checker assumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckConfig {
    /// The contract's bound on monotonic clock rate differences, parts per million (1% = 10,000).
    pub max_drift_ppm: u64,
    /// How long the cluster keeps released and expired lease records, in milliseconds (a read
    /// may find a resource ABSENT again only after this).
    pub inactive_retention_ms: u64,
    /// Search steps the linearizability check may spend on one resource before it gives up
    /// (reported as inconclusive, never as a pass).
    pub linearizability_steps_max: u64,
}

impl Default for CheckConfig {
    fn default() -> Self {
        CheckConfig {
            max_drift_ppm: 10_000,
            inactive_retention_ms: 600_000,
            linearizability_steps_max: 20_000_000,
        }
    }
}

/// The checker's verdict on one history.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckReport {
    /// Operations judged (every recorded operation, replays included).
    pub ops_checked: u64,
    /// Operations with a definite answer.
    pub ops_definite: u64,
    /// Every violation found.
    pub violations: Vec<Violation>,
    /// Resources whose linearizability search ran out of steps (neither pass nor fail).
    pub inconclusive: Vec<String>,
    /// Fenced writes that reached the store after their writer's safe deadline.
    pub late_writes: u64,
    /// Of those, the ones the store rejected because a newer token had written first.
    pub late_writes_rejected: u64,
    /// Replays (exactly-once probes) with a definite answer, compared with their original.
    pub replays_compared: u64,
    /// Hand-offs to waiters whose place in the queue was known, judged for FIFO order and
    /// liveness.
    #[serde(default)]
    pub hand_offs_judged: u64,
    /// Watch events judged.
    #[serde(default)]
    pub watch_events_judged: u64,
    /// Runs of commands `tenurectl lock` ran, judged for mutual exclusion.
    #[serde(default)]
    pub lock_runs_judged: u64,
}

/// Checks properties 1 to 5 and 7 to 9 on a history.
pub fn check(history: &History, config: &CheckConfig) -> CheckReport {
    let mut report = CheckReport {
        ops_checked: history.ops.len() as u64,
        ops_definite: history
            .ops
            .iter()
            .filter(|op| op.outcome.is_definite())
            .count() as u64,
        ..CheckReport::default()
    };
    let by_resource = ops_by_resource(&history.ops);
    for (resource, ops) in &by_resource {
        check_single_holder(resource, ops, &mut report.violations);
        check_fencing(resource, ops, &mut report.violations);
        check_acknowledged(resource, ops, config, &mut report.violations);
        match linearizability::check_resource(ops, config) {
            linearizability::Verdict::Linearizable => {}
            linearizability::Verdict::Violation { message, slice } => {
                report.violations.push(Violation::new(
                    Property::Linearizable,
                    resource,
                    message,
                    slice,
                ));
            }
            linearizability::Verdict::Inconclusive { steps } => report.inconclusive.push(format!(
                "{resource}: no verdict within {steps} search steps"
            )),
        }
    }
    check_lease_identity(&history.ops, &mut report.violations);
    check_log_time(&history.ops, &mut report.violations);
    report.replays_compared = check_exactly_once(&history.ops, &mut report.violations);
    check_writes(history, &mut report);
    report.hand_offs_judged = queues::check_wait_queues(history, &mut report.violations);
    report.watch_events_judged = queues::check_watch(history, &mut report.violations);
    report.lock_runs_judged = queues::check_lock_commands(history, &mut report.violations);
    report
}

/// The operations of each resource, in invoke order.
fn ops_by_resource(ops: &[OpRecord]) -> BTreeMap<String, Vec<&OpRecord>> {
    let mut by_resource: BTreeMap<String, Vec<&OpRecord>> = BTreeMap::new();
    for op in ops {
        by_resource.entry(op.resource.clone()).or_default().push(op);
    }
    for ops in by_resource.values_mut() {
        ops.sort_by_key(|op| (op.invoke_ns, op.id));
    }
    by_resource
}

/// The lease a successful grant or renewal names, with its token and safe deadline.
fn granted(op: &OpRecord) -> Option<(LeaseRef, u64, Nanos)> {
    match op.outcome {
        Outcome::Granted {
            lease,
            token,
            safe_deadline_ns,
            ..
        } => Some((lease, token, safe_deadline_ns)),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------------
// 1. Single holder

struct Window<'a> {
    start: Nanos,
    end: Nanos,
    lease: LeaseRef,
    op: &'a OpRecord,
}

fn check_single_holder(resource: &str, ops: &[&OpRecord], violations: &mut Vec<Violation>) {
    // A holder stops acting when it asks to release (whatever the answer).
    let mut cut: HashMap<LeaseRef, Nanos> = HashMap::new();
    // (A transfer ends the holder's lease the same way.)
    for op in ops {
        if let (true, Some(lease), None) = (op.ends_named_lease(), op.lease, op.replay_of) {
            let at = cut.entry(lease).or_insert(op.invoke_ns);
            *at = (*at).min(op.invoke_ns);
        }
    }
    let mut windows: Vec<Window<'_>> = Vec::new();
    for op in ops {
        if op.replay_of.is_some() || op.kind == OpKind::Get {
            continue;
        }
        let (Some((lease, _, deadline)), Some(complete)) = (granted(op), op.complete_ns) else {
            continue;
        };
        let end = deadline.min(cut.get(&lease).copied().unwrap_or(Nanos::MAX));
        if end > complete {
            windows.push(Window {
                start: complete,
                end,
                lease,
                op,
            });
        }
    }
    windows.sort_by_key(|w| (w.start, w.end));
    // Sweep: the windows still open, by lease (the latest-ending window of each).
    let mut open: BTreeMap<LeaseRef, usize> = BTreeMap::new();
    let mut reported: HashSet<(LeaseRef, LeaseRef)> = HashSet::new();
    for (index, window) in windows.iter().enumerate() {
        open.retain(|_, &mut other| windows[other].end > window.start);
        for (&lease, &other) in &open {
            if lease != window.lease && reported.insert((lease, window.lease)) {
                let earlier = &windows[other];
                violations.push(Violation::new(
                    Property::SingleHolder,
                    resource,
                    format!(
                        "lease {} ({}) may still act for {:.3}s after lease {} ({}) began to: \
                         two holders inside their safe windows at once",
                        earlier.lease,
                        earlier.op.granted_holder(),
                        (earlier.end - window.start) as f64 / 1e9,
                        window.lease,
                        window.op.granted_holder(),
                    ),
                    vec![earlier.op, window.op],
                ));
            }
        }
        match open.get(&window.lease) {
            Some(&current) if windows[current].end >= window.end => {}
            _ => {
                open.insert(window.lease, index);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 2. Fencing

/// Every lease keeps one token, equal to its sequence, and names one resource and holder.
fn check_lease_identity(ops: &[OpRecord], violations: &mut Vec<Violation>) {
    let mut first: HashMap<LeaseRef, &OpRecord> = HashMap::new();
    for op in ops {
        let (lease, token) = match (&op.outcome, op.kind) {
            (Outcome::Granted { lease, token, .. }, _)
            | (Outcome::Released { lease, token, .. }, _) => (*lease, *token),
            (Outcome::Read { view: Some(v), .. }, _) => (v.lease, v.token),
            _ => continue,
        };
        if token != lease.sequence {
            violations.push(Violation::new(
                Property::Fencing,
                &op.resource,
                format!(
                    "lease {lease} carries token {token}, not its sequence {}",
                    lease.sequence
                ),
                vec![op],
            ));
        }
        let holder = match &op.outcome {
            Outcome::Read { view: Some(v), .. } => v.holder.as_str(),
            Outcome::Granted { .. } => op.granted_holder(),
            _ => op.holder.as_str(),
        };
        match first.get(&lease) {
            None => {
                first.insert(lease, op);
            }
            Some(seen) => {
                let seen_holder = match &seen.outcome {
                    Outcome::Read { view: Some(v), .. } => v.holder.as_str(),
                    Outcome::Granted { .. } => seen.granted_holder(),
                    _ => seen.holder.as_str(),
                };
                if seen.resource != op.resource || seen_holder != holder {
                    violations.push(Violation::new(
                        Property::Fencing,
                        &op.resource,
                        format!(
                            "lease {lease} names two grants: {} held by {seen_holder} and {} held \
                             by {holder}",
                            seen.resource, op.resource
                        ),
                        vec![*seen, op],
                    ));
                }
            }
        }
    }
}

/// Tokens of one resource increase with grant order.
fn check_fencing(resource: &str, ops: &[&OpRecord], violations: &mut Vec<Violation>) {
    // The first fresh answer of each lease's Acquire or Transfer: its grant.
    let mut grants: BTreeMap<LeaseRef, &OpRecord> = BTreeMap::new();
    for op in ops {
        if !matches!(op.kind, OpKind::Acquire | OpKind::Transfer) || op.replay_of.is_some() {
            continue;
        }
        if let Some((lease, _, _)) = granted(op) {
            grants
                .entry(lease)
                .and_modify(|seen| {
                    if op.complete_ns < seen.complete_ns {
                        *seen = op;
                    }
                })
                .or_insert(op);
        }
    }
    let grants: Vec<(&LeaseRef, &&OpRecord)> = grants.iter().collect();
    // Real time: a grant answered before another was asked has the smaller token.
    let mut by_complete: Vec<(Nanos, u64, &OpRecord)> = grants
        .iter()
        .filter_map(|(lease, op)| op.complete_ns.map(|c| (c, lease.sequence, **op)))
        .collect();
    by_complete.sort_by_key(|&(c, _, _)| c);
    let mut by_invoke: Vec<(Nanos, u64, &OpRecord)> = grants
        .iter()
        .map(|(lease, op)| (op.invoke_ns, lease.sequence, **op))
        .collect();
    by_invoke.sort_by_key(|&(i, _, _)| i);
    let mut highest: Option<(u64, &OpRecord)> = None;
    let mut next = 0;
    for &(invoke, token, op) in &by_invoke {
        while next < by_complete.len() && by_complete[next].0 < invoke {
            let (_, earlier_token, earlier) = by_complete[next];
            if highest.is_none_or(|(t, _)| earlier_token > t) {
                highest = Some((earlier_token, earlier));
            }
            next += 1;
        }
        if let Some((earlier_token, earlier)) = highest {
            if earlier_token >= token {
                violations.push(Violation::new(
                    Property::Fencing,
                    resource,
                    format!(
                        "token {token} was granted after token {earlier_token} had been \
                         acknowledged: fencing tokens went backwards"
                    ),
                    vec![earlier, op],
                ));
            }
        }
    }
    // Log time: a grant at an earlier log time has the smaller token.
    let mut by_token: Vec<(u64, u64, &OpRecord)> = grants
        .iter()
        .filter_map(|(lease, op)| match op.outcome {
            Outcome::Granted { log_time_ms, .. } => Some((lease.sequence, log_time_ms, **op)),
            _ => None,
        })
        .collect();
    by_token.sort_by_key(|&(token, _, _)| token);
    for pair in by_token.windows(2) {
        let ((t1, l1, a), (t2, l2, b)) = (pair[0], pair[1]);
        if l2 < l1 {
            violations.push(Violation::new(
                Property::Fencing,
                resource,
                format!(
                    "token {t2} was granted at log time {l2}, before token {t1} at log time {l1}"
                ),
                vec![a, b],
            ));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 3. Nothing acknowledged lost

/// What later reads and decisions must reflect about one lease.
#[derive(Default)]
struct Acknowledged<'a> {
    /// (completion, op) of every acknowledged grant or renewal (fresh answers only).
    extensions: Vec<(Nanos, &'a OpRecord)>,
    /// The first acknowledged release.
    release: Option<(Nanos, &'a OpRecord)>,
    /// A release of it got no definite answer: it may have ended at any log time since.
    release_unknown: bool,
}

fn check_acknowledged(
    resource: &str,
    ops: &[&OpRecord],
    config: &CheckConfig,
    violations: &mut Vec<Violation>,
) {
    let mut leases: BTreeMap<LeaseRef, Acknowledged<'_>> = BTreeMap::new();
    for op in ops {
        if op.replay_of.is_some() {
            continue;
        }
        if let (true, Some(lease), false) =
            (op.ends_named_lease(), op.lease, op.outcome.is_definite())
        {
            leases.entry(lease).or_default().release_unknown = true;
        }
        let Some(complete) = op.complete_ns else {
            continue;
        };
        match op.outcome {
            Outcome::Granted { lease, .. } => {
                leases
                    .entry(lease)
                    .or_default()
                    .extensions
                    .push((complete, op));
                // A transfer's grant is also the release of the lease it names.
                if let (OpKind::Transfer, Some(ended)) = (op.kind, op.lease) {
                    let entry = leases.entry(ended).or_default();
                    if entry.release.is_none_or(|(at, _)| complete < at) {
                        entry.release = Some((complete, op));
                    }
                }
            }
            Outcome::Released { lease, .. } => {
                let entry = leases.entry(lease).or_default();
                if entry.release.is_none_or(|(at, _)| complete < at) {
                    entry.release = Some((complete, op));
                }
            }
            _ => {}
        }
    }

    for op in ops {
        if op.complete_ns.is_none() {
            continue;
        }
        match (&op.outcome, op.kind) {
            (Outcome::Read { view, .. }, OpKind::Get) => {
                check_read(resource, op, view.as_ref(), &leases, config, violations);
            }
            (Outcome::Granted { lease, .. }, OpKind::Renew | OpKind::KeepAlive)
                if op.replay_of.is_none() =>
            {
                if let Some((released, release)) = leases.get(lease).and_then(|l| l.release) {
                    if released < op.invoke_ns {
                        violations.push(Violation::new(
                            Property::NoLostAck,
                            resource,
                            format!(
                                "lease {lease} was renewed after its release had been acknowledged"
                            ),
                            vec![release, op],
                        ));
                    }
                }
            }
            _ => {}
        }
    }

    // Later grants wait, in log time, for the expiry every acknowledged extension promised.
    let mut bound: Option<(u64, &OpRecord)> = None;
    for (lease, acknowledged) in &leases {
        // The lease's grant: its Acquire, or the Transfer that handed it over.
        let grant = acknowledged.extensions.iter().find_map(|(_, op)| match op {
            op if matches!(op.kind, OpKind::Acquire | OpKind::Transfer) => match op.outcome {
                Outcome::Granted {
                    log_time_ms,
                    replayed: false,
                    ..
                } => Some((log_time_ms, *op)),
                _ => None,
            },
            _ => None,
        });
        if let (Some((promised, promising)), Some((granted_at, grant))) = (bound, grant) {
            if granted_at < promised {
                violations.push(Violation::new(
                    Property::NoLostAck,
                    resource,
                    format!(
                        "lease {lease} was granted at log time {granted_at}, before log time \
                         {promised}, until which an acknowledged grant or renewal had promised the \
                         previous lease"
                    ),
                    vec![promising, grant],
                ));
            }
        }
        let promise = match acknowledged.release {
            Some((_, release)) => match release.outcome {
                Outcome::Released { released_at_ms, .. } => Some((released_at_ms, release)),
                // A transfer ended it at the new lease's grant time.
                Outcome::Granted {
                    log_time_ms,
                    replayed: false,
                    ..
                } if release.kind == OpKind::Transfer => Some((log_time_ms, release)),
                _ => None,
            },
            // An unanswered release may have ended it early: no promise to hold others to.
            None if acknowledged.release_unknown => None,
            None => acknowledged
                .extensions
                .iter()
                .filter_map(|(_, op)| match op.outcome {
                    Outcome::Granted {
                        log_time_ms,
                        expires_at_ms,
                        replayed: false,
                        ..
                    } => Some(((log_time_ms, expires_at_ms), *op)),
                    _ => None,
                })
                .max_by_key(|&(times, _)| times)
                .map(|((_, expires_at_ms), op)| (expires_at_ms, op)),
        };
        if let Some((promised, op)) = promise {
            if bound.is_none_or(|(b, _)| promised > b) {
                bound = Some((promised, op));
            }
        }
    }
}

fn check_read(
    resource: &str,
    read: &OpRecord,
    view: Option<&crate::history::ViewRecord>,
    leases: &BTreeMap<LeaseRef, Acknowledged<'_>>,
    config: &CheckConfig,
    violations: &mut Vec<Violation>,
) {
    let before = |at: Nanos| at < read.invoke_ns;
    // The newest lease acknowledged before the read began.
    let newest = leases
        .iter()
        .rfind(|(_, a)| a.extensions.iter().any(|&(c, _)| before(c)));
    if let Some((&newest_lease, acknowledged)) = newest {
        let (_, proof) = acknowledged
            .extensions
            .iter()
            .find(|&&(c, _)| before(c))
            .copied()
            .unwrap_or((0, read));
        match view {
            None => {
                // Records are dropped only after the retention (plus the ttl) has passed.
                let retained_ns = config
                    .inactive_retention_ms
                    .saturating_add(proof.ttl_ms)
                    .saturating_mul(1_000_000);
                if read.complete_ns.unwrap_or(Nanos::MAX) < proof.invoke_ns + retained_ns {
                    violations.push(Violation::new(
                        Property::NoLostAck,
                        resource,
                        format!(
                            "a read found no lease after lease {newest_lease} was acknowledged"
                        ),
                        vec![proof, read],
                    ));
                }
            }
            Some(v) if v.lease < newest_lease => violations.push(Violation::new(
                Property::NoLostAck,
                resource,
                format!(
                    "a read returned lease {} after the newer lease {newest_lease} had been \
                     acknowledged",
                    v.lease
                ),
                vec![proof, read],
            )),
            Some(_) => {}
        }
    }
    let Some(v) = view else {
        return;
    };
    let Some(acknowledged) = leases.get(&v.lease) else {
        return;
    };
    // Version: 1 at grant, +1 per renewal, +1 for the release.
    let renewals = acknowledged
        .extensions
        .iter()
        .filter(|(c, op)| before(*c) && op.kind == OpKind::Renew)
        .count() as u64;
    let released = acknowledged.release.filter(|&(c, _)| before(c));
    // A session's close ends the lease without a new version (it is not the lease's release).
    let released_itself = released.is_some_and(|(_, op)| op.kind == OpKind::Release);
    let version_min = 1 + renewals + u64::from(released_itself);
    if v.version < version_min {
        let mut slice: Vec<&OpRecord> = acknowledged
            .extensions
            .iter()
            .filter(|(c, _)| before(*c))
            .map(|&(_, op)| op)
            .collect();
        slice.extend(released.map(|(_, op)| op));
        slice.push(read);
        violations.push(Violation::new(
            Property::NoLostAck,
            resource,
            format!(
                "a read saw lease {} at version {} after {renewals} renewal(s){} had been \
                 acknowledged (version at least {version_min})",
                v.lease,
                v.version,
                if released_itself {
                    " and its release"
                } else {
                    ""
                }
            ),
            slice,
        ));
    }
    if let Some((_, release)) = released {
        if v.status == "ACTIVE" {
            violations.push(Violation::new(
                Property::NoLostAck,
                resource,
                format!(
                    "a read saw lease {} ACTIVE after its {} had been acknowledged",
                    v.lease,
                    if release.kind == OpKind::SessionClose {
                        "session's close"
                    } else {
                        "release"
                    }
                ),
                vec![release, read],
            ));
        }
    }
}

/// Log time never goes back along a group: an answer received before another operation of the
/// same group was asked carries a log time no later than that operation's.
fn check_log_time(ops: &[OpRecord], violations: &mut Vec<Violation>) {
    let mut by_group: BTreeMap<u32, Vec<(&OpRecord, u64)>> = BTreeMap::new();
    for op in ops {
        if op.replay_of.is_some() || op.complete_ns.is_none() {
            continue;
        }
        if let Some(log_time) = op.outcome.fresh_log_time_ms() {
            by_group.entry(op.group).or_default().push((op, log_time));
        }
    }
    for ops in by_group.values() {
        let mut by_complete: Vec<&(&OpRecord, u64)> = ops.iter().collect();
        by_complete.sort_by_key(|(op, _)| op.complete_ns);
        let mut by_invoke: Vec<&(&OpRecord, u64)> = ops.iter().collect();
        by_invoke.sort_by_key(|(op, _)| op.invoke_ns);
        let mut latest: Option<(u64, &OpRecord)> = None;
        let mut next = 0;
        let mut reported = 0;
        for &&(op, log_time) in &by_invoke {
            while next < by_complete.len()
                && by_complete[next].0.complete_ns.unwrap_or(Nanos::MAX) < op.invoke_ns
            {
                let (earlier, earlier_time) = *by_complete[next];
                if latest.is_none_or(|(t, _)| earlier_time > t) {
                    latest = Some((earlier_time, earlier));
                }
                next += 1;
            }
            if let Some((earlier_time, earlier)) = latest {
                if log_time < earlier_time && reported < 3 {
                    reported += 1;
                    violations.push(Violation::new(
                        Property::NoLostAck,
                        &op.resource,
                        format!(
                            "group {}'s log time went back from {earlier_time} to {log_time}",
                            op.group
                        ),
                        vec![earlier, op],
                    ));
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 4. Exactly once

/// Compares every replay with its original; returns how many were compared.
fn check_exactly_once(ops: &[OpRecord], violations: &mut Vec<Violation>) -> u64 {
    let by_id: HashMap<u64, &OpRecord> = ops.iter().map(|op| (op.id, op)).collect();
    let mut request_ids: HashMap<(&str, &str), &OpRecord> = HashMap::new();
    let mut compared = 0;
    for op in ops {
        let Some(request_id) = op.request_id.as_deref() else {
            continue;
        };
        match op.replay_of {
            None => {
                if let Some(other) = request_ids.insert((op.resource.as_str(), request_id), op) {
                    violations.push(Violation::new(
                        Property::ExactlyOnce,
                        &op.resource,
                        format!("two operations were sent with request id {request_id}"),
                        vec![other, op],
                    ));
                }
            }
            Some(original_id) => {
                let Some(original) = by_id.get(&original_id) else {
                    continue;
                };
                if !original.outcome.is_definite() || !op.outcome.is_definite() {
                    continue;
                }
                compared += 1;
                if let Some(problem) = replay_mismatch(&original.outcome, &op.outcome) {
                    violations.push(Violation::new(
                        Property::ExactlyOnce,
                        &op.resource,
                        format!("request id {request_id} sent again: {problem}"),
                        vec![original, op],
                    ));
                }
            }
        }
    }
    compared
}

fn replay_mismatch(original: &Outcome, replay: &Outcome) -> Option<String> {
    match (original, replay) {
        (
            Outcome::Granted {
                lease: l1,
                token: t1,
                log_time_ms: g1,
                expires_at_ms: e1,
                ..
            },
            Outcome::Granted {
                lease: l2,
                token: t2,
                log_time_ms: g2,
                expires_at_ms: e2,
                replayed,
                ..
            },
        ) => {
            if (l1, t1, g1, e1) != (l2, t2, g2, e2) {
                Some(format!(
                    "the original granted {l1} token {t1} at log {g1} until {e1}, the replay \
                     {l2} token {t2} at log {g2} until {e2}"
                ))
            } else if !replayed {
                Some("the same grant came back unmarked as a replay (applied again?)".into())
            } else {
                None
            }
        }
        (
            Outcome::Released {
                lease: l1,
                released_at_ms: r1,
                ..
            },
            Outcome::Released {
                lease: l2,
                released_at_ms: r2,
                ..
            },
        ) => ((l1, r1) != (l2, r2)).then(|| {
            format!("the original released {l1} at log {r1}, the replay {l2} at log {r2}")
        }),
        (
            Outcome::Refused {
                code: c1,
                holder: h1,
            },
            Outcome::Refused {
                code: c2,
                holder: h2,
            },
        ) => (c1 != c2 || h1 != h2).then(|| {
            format!("the original was refused with {c1} ({h1:?}), the replay with {c2} ({h2:?})")
        }),
        (original, replay) => Some(format!(
            "the original answered {}, the replay {}",
            outcome_kind(original),
            outcome_kind(replay)
        )),
    }
}

fn outcome_kind(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Granted { lease, .. } => format!("a grant of {lease}"),
        Outcome::Released { lease, .. } => format!("a release of {lease}"),
        Outcome::Read { .. } => "a read".into(),
        Outcome::Refused { code, .. } => code.clone(),
        Outcome::Unknown { .. } => "nothing definite".into(),
    }
}

// ---------------------------------------------------------------------------------------------
// The fenced store (downstream evidence for 1 and the demo's figures)

fn check_writes(history: &History, report: &mut CheckReport) {
    let mut by_resource: BTreeMap<&str, Vec<&WriteRecord>> = BTreeMap::new();
    for write in &history.writes {
        by_resource
            .entry(&write.write.resource)
            .or_default()
            .push(write);
    }
    for writes in by_resource.values_mut() {
        writes.sort_by_key(|w| w.arrived_ns);
        for (index, write) in writes.iter().enumerate() {
            let late = write.arrived_ns >= write.write.deadline_ns;
            if late {
                report.late_writes += 1;
                if !write.accepted {
                    report.late_writes_rejected += 1;
                }
                continue;
            }
            if !write.accepted {
                // Rejected inside its own window: a higher token wrote first. Either its
                // writer was inside its window at the same time, or it held an older lease
                // whose token was higher (tokens out of grant order).
                let higher = writes[..index]
                    .iter()
                    .rev()
                    .find(|w| w.accepted && w.write.token > write.write.token);
                let mut writes_shown = vec![(*write).clone()];
                writes_shown.extend(higher.map(|w| (*w).clone()));
                report.violations.push(Violation {
                    property: Property::Fencing,
                    resource: Some(write.write.resource.clone()),
                    message: format!(
                        "the fenced store rejected token {} although it arrived inside its \
                         writer's safe window: a higher token had written first (two holders \
                         at once, or tokens out of grant order)",
                        write.write.token
                    ),
                    ops: Vec::new(),
                    writes: writes_shown,
                });
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 6. Liveness after heal

/// Every client in `clients` completed an operation with a definite answer that it invoked after
/// `healed_ns` and that completed within `bound_ns` of it.
pub fn check_liveness(
    history: &History,
    clients: &[String],
    healed_ns: Nanos,
    bound_ns: Nanos,
) -> Vec<Violation> {
    let mut progressed: HashSet<&str> = HashSet::new();
    for op in &history.ops {
        if op.invoke_ns >= healed_ns
            && op.outcome.is_definite()
            && op
                .complete_ns
                .is_some_and(|c| c <= healed_ns.saturating_add(bound_ns))
        {
            progressed.insert(op.client.as_str());
        }
    }
    clients
        .iter()
        .filter(|client| !progressed.contains(client.as_str()))
        .map(|client| {
            let mut last: Vec<&OpRecord> = history
                .ops
                .iter()
                .filter(|op| &op.client == client)
                .collect();
            last.sort_by_key(|op| op.invoke_ns);
            let slice: Vec<OpRecord> = last
                .iter()
                .rev()
                .take(3)
                .rev()
                .map(|&op| op.clone())
                .collect();
            Violation {
                property: Property::Liveness,
                resource: None,
                message: format!(
                    "client {client} completed no operation within {:.1}s after the faults healed",
                    bound_ns as f64 / 1e9
                ),
                ops: slice,
                writes: Vec::new(),
            }
        })
        .collect()
}
