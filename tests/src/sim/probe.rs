//! What the simulation checks after every step, and the trace it hashes.
//!
//! After each step the [`Probe`] reads every live replica of every group (through weak handles
//! the node hosts register, so nothing outlives a crashed host):
//! - at most one ready leader per group and term (Raft's election safety);
//! - replicas that applied the same log index hold byte-identical lease state (the snapshot
//!   encoding of their state machines; the determinism of apply);
//! - along one replica's incarnation, log time and the group's next fencing token never go
//!   back as its applied index grows.
//!
//! Every change it sees (a term, a leader, an applied index) and every fault goes into the
//! trace, whose hash two runs of one seed must share.
//!
//! Must not depend on: turmoil (the simulation loop calls it between steps).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Weak};

use tenure_server::group::GroupHandle;
use xxhash_rust::xxh3::{Xxh3, xxh3_64};

use crate::checker::{Property, Violation};

/// Replicas a node host registered (weak: the host owns them).
pub type Registry = BTreeMap<u64, Vec<Weak<GroupHandle>>>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    term: u64,
    leader: Option<u64>,
    applied: u64,
    log_time_ms: u64,
    next_token: u64,
}

/// A lease state first seen at a (group, applied index): its hash, the node, its bytes (to
/// describe a difference).
type SeenState = (u64, u64, Arc<Vec<u8>>);

/// The per-step checks and the trace.
pub struct Probe {
    trace: Xxh3,
    seen: BTreeMap<(u64, u32), Seen>,
    /// (group, term) -> nodes that led it, ready.
    leaders: BTreeMap<(u32, u64), BTreeSet<u64>>,
    /// (group, applied index) -> (state hash, node that first had it, its snapshot bytes).
    states: BTreeMap<(u32, u64), SeenState>,
    violations: Vec<Violation>,
    /// State comparisons made.
    pub compared_states: u64,
    lines: Option<Vec<String>>,
}

impl Default for Probe {
    fn default() -> Self {
        Probe {
            trace: Xxh3::new(),
            seen: BTreeMap::new(),
            leaders: BTreeMap::new(),
            states: BTreeMap::new(),
            violations: Vec::new(),
            compared_states: 0,
            lines: std::env::var_os("TENURE_SIM_TRACE_FILE").map(|_| Vec::new()),
        }
    }
}

/// Trace events kept for a divergence hunt at most.
const TRACE_LINES_MAX: usize = 1_000_000;

/// States remembered per group for the comparison (older ones are dropped).
const STATES_PER_GROUP_MAX: usize = 4_096;

impl Probe {
    /// Adds an event to the trace.
    pub fn trace(&mut self, step: u64, event: &str) {
        self.trace.update(&step.to_le_bytes());
        self.trace.update(event.as_bytes());
        if let Some(lines) = &mut self.lines {
            if lines.len() < TRACE_LINES_MAX {
                lines.push(format!("{step} {event}"));
            }
        }
    }

    /// The trace's events, when kept (`TENURE_SIM_TRACE_FILE` set: a divergence hunt).
    pub fn trace_lines(&self) -> &[String] {
        self.lines.as_deref().unwrap_or(&[])
    }

    /// The trace's hash so far.
    pub fn trace_hash(&self) -> u64 {
        self.trace.digest()
    }

    /// Forgets what node `node` showed (it crashed: its next incarnation starts over).
    pub fn forget(&mut self, node: u64) {
        self.seen.retain(|&(n, _), _| n != node);
    }

    /// Reads every live replica once, after step `step`.
    pub fn check(&mut self, step: u64, registry: &Registry) {
        for (&node, handles) in registry {
            for handle in handles.iter().filter_map(Weak::upgrade) {
                self.check_replica(step, node, &handle);
            }
        }
    }

    fn check_replica(&mut self, step: u64, node: u64, handle: &Arc<GroupHandle>) {
        let group = handle.group_id();
        let status = handle.status();
        let (log_time_ms, next_token) = handle.state_machine().with_leases(|leases| {
            let stats = leases.stats();
            (stats.last_log_time_ms, stats.next_fencing_token)
        });
        let now = Seen {
            term: status.term,
            leader: status.leader,
            applied: status.applied_index,
            log_time_ms,
            next_token,
        };
        if status.is_leader {
            let claims = self.leaders.entry((group, status.term)).or_default();
            if claims.insert(node) && claims.len() > 1 {
                let nodes = claims.clone();
                self.violations.push(Violation {
                    property: Property::ElectionSafety,
                    resource: None,
                    message: format!(
                        "step {step}: group {group} has two leaders in term {}: nodes {nodes:?}",
                        status.term
                    ),
                    ops: Vec::new(),
                    writes: Vec::new(),
                });
            }
        }
        let previous = self.seen.insert((node, group), now);
        if previous == Some(now) {
            return;
        }
        self.trace(
            step,
            &format!(
                "n{node} g{group} t{} l{:?} a{} lt{} nt{}",
                now.term, now.leader, now.applied, now.log_time_ms, now.next_token
            ),
        );
        if let Some(before) = previous {
            if now.applied > before.applied
                && (now.log_time_ms < before.log_time_ms || now.next_token < before.next_token)
            {
                self.violations.push(Violation {
                    property: Property::NoLostAck,
                    resource: None,
                    message: format!(
                        "step {step}: node {node}, group {group}: applying from index {} to {} \
                         moved log time {} -> {} and the next token {} -> {}",
                        before.applied,
                        now.applied,
                        before.log_time_ms,
                        now.log_time_ms,
                        before.next_token,
                        now.next_token
                    ),
                    ops: Vec::new(),
                    writes: Vec::new(),
                });
            }
        }
        if previous.is_none_or(|before| before.applied != now.applied) && now.applied > 0 {
            self.compare_state(step, node, group, now.applied, handle);
        }
    }

    fn compare_state(
        &mut self,
        step: u64,
        node: u64,
        group: u32,
        applied: u64,
        handle: &GroupHandle,
    ) {
        // The applied index and the state are read under the state's lock, together.
        let (index, bytes) = handle
            .state_machine()
            .with_applied_leases(|last_applied, leases| {
                (
                    last_applied.map_or(0, |id| id.index),
                    leases.snapshot_to_vec(),
                )
            });
        let hash = xxh3_64(&bytes);
        if index != applied {
            return;
        }
        self.compared_states += 1;
        match self.states.get(&(group, index)) {
            Some((expected, first, first_bytes)) if *expected != hash && *first != node => {
                let first = *first;
                let difference = describe_difference(first_bytes, &bytes);
                self.violations.push(Violation {
                    property: Property::Linearizable,
                    resource: None,
                    message: format!(
                        "step {step}: group {group}: nodes {first} and {node} applied the log up \
                         to index {index} and hold different lease states: {difference}"
                    ),
                    ops: Vec::new(),
                    writes: Vec::new(),
                });
            }
            Some(_) => {}
            None => {
                self.states
                    .insert((group, index), (hash, node, Arc::new(bytes)));
                let in_group = self.states.range((group, 0)..(group, u64::MAX)).count();
                if in_group > STATES_PER_GROUP_MAX {
                    if let Some((&oldest, _)) =
                        self.states.range((group, 0)..(group, u64::MAX)).next()
                    {
                        self.states.remove(&oldest);
                    }
                }
            }
        }
    }

    /// Leader changes: terms in which a group had a ready leader, beyond each group's first.
    pub fn elections(&self) -> u64 {
        let groups: BTreeSet<u32> = self.leaders.keys().map(|&(group, _)| group).collect();
        (self.leaders.len() as u64).saturating_sub(groups.len() as u64)
    }

    /// The violations seen so far.
    pub fn violations(&self) -> &[Violation] {
        &self.violations
    }
}

/// What differs between two encoded lease states (their counters, decoded).
fn describe_difference(first: &[u8], second: &[u8]) -> String {
    let decode = |bytes: &[u8]| {
        tenure_core::LeaseStateMachine::read_snapshot(bytes, tenure_core::StateOptions::default())
            .map(|state| format!("{:?}", state.stats()))
            .unwrap_or_else(|error| format!("undecodable ({error})"))
    };
    let offset = first
        .iter()
        .zip(second)
        .position(|(a, b)| a != b)
        .unwrap_or(first.len().min(second.len()));
    format!(
        "{} bytes and {} bytes, first difference at byte {offset}; {} vs {}",
        first.len(),
        second.len(),
        decode(first),
        decode(second)
    )
}
