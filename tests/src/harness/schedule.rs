//! The nemesis plan: which faults, when, for how long, on which targets. A pure function of the
//! seed and the run's shape, so a failing run's seed replays the same schedule.
//!
//! Targets are node numbers or client process numbers drawn from the seed, or "the leader"
//! (the node leading the most groups when the fault starts, which the run resolves and logs).
//!
//! Alone, faults follow one another with quiet gaps. Combined, they overlap: at most one fault
//! that takes nodes away (kill, pause, partition) at a time, with clock, disk and client faults
//! on top.
//!
//! Must not depend on: processes, time (only the seed).

use rand::rngs::SmallRng;
use rand::{Rng as _, SeedableRng as _};
use serde::{Deserialize, Serialize};

pub use crate::faults::FaultKind;

/// A node, as the plan names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeTarget {
    /// The node leading the most groups when the fault starts.
    Leader,
    /// This node.
    Node(u64),
}

/// One fault with its targets and amounts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Fault {
    /// kill -9, restart at the end.
    Kill(NodeTarget),
    /// SIGSTOP, SIGCONT at the end.
    PauseNode(NodeTarget),
    /// SIGSTOP a client process (1-based), SIGCONT at the end.
    PauseClient(u32),
    /// Cut this node from every other.
    Isolate(NodeTarget),
    /// Cut `minority` from the rest.
    Halves {
        /// The smaller side.
        minority: Vec<u64>,
    },
    /// `left` and `right` cannot talk; `bridge` talks to both.
    Bridge {
        /// One side.
        left: Vec<u64>,
        /// The node in the middle.
        bridge: u64,
        /// The other side.
        right: Vec<u64>,
    },
    /// The node's monotonic clock runs `ppm` parts per million fast (negative: slow).
    ClockRate {
        /// The node.
        node: u64,
        /// Rate error.
        ppm: i64,
    },
    /// The node's wall clock is moved by `offset_s` seconds, and back at the end.
    ClockJump {
        /// The node.
        node: u64,
        /// Offset.
        offset_s: i64,
    },
    /// The node's WAL syncs take `delay_ms` longer.
    SlowDisk {
        /// The node.
        node: u64,
        /// Added to every sync.
        delay_ms: u64,
    },
    /// Move a replica of some group from a voter to a node without one; `pick` chooses the
    /// group, the voter and the node when the step starts (the replica sets change as the run
    /// goes).
    MoveReplica {
        /// Seeds the choice.
        pick: u64,
    },
    /// Start a node with the next spare id and announce it; it stays.
    AddNode,
    /// Drain an active node `pick` chooses when the step starts; undrain at the end.
    DrainNode {
        /// Seeds the choice.
        pick: u64,
    },
    /// Drain an active node `pick` chooses; at the end remove it if it holds no replica (its
    /// process stops for good), else undrain it.
    RemoveNode {
        /// Seeds the choice.
        pick: u64,
    },
    /// kill -9 a node for good; at the end drain and remove it from the node table and start a
    /// node with the next spare id in its place.
    ReplaceNode(NodeTarget),
}

impl Fault {
    /// The kind of fault.
    pub fn kind(&self) -> FaultKind {
        match self {
            Fault::Kill(_) => FaultKind::Kill,
            Fault::PauseNode(_) => FaultKind::PauseNode,
            Fault::PauseClient(_) => FaultKind::PauseClient,
            Fault::Isolate(_) => FaultKind::PartitionLeader,
            Fault::Halves { .. } => FaultKind::PartitionHalves,
            Fault::Bridge { .. } => FaultKind::PartitionBridge,
            Fault::ClockRate { .. } => FaultKind::ClockRate,
            Fault::ClockJump { .. } => FaultKind::ClockJump,
            Fault::SlowDisk { .. } => FaultKind::SlowDisk,
            Fault::MoveReplica { .. } => FaultKind::MoveReplica,
            Fault::AddNode => FaultKind::AddNode,
            Fault::DrainNode { .. } => FaultKind::DrainNode,
            Fault::RemoveNode { .. } => FaultKind::RemoveNode,
            Fault::ReplaceNode(_) => FaultKind::ReplaceNode,
        }
    }
}

/// One step: `fault` starts `at_ms` after the nemesis starts and is healed `hold_ms` later.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    /// Start, from the nemesis's start.
    pub at_ms: u64,
    /// How long it lasts.
    pub hold_ms: u64,
    /// What.
    pub fault: Fault,
}

/// The shape of the run the plan is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanShape {
    /// Kinds to draw from.
    pub kinds: Vec<FaultKind>,
    /// Overlap faults (see the module docs).
    pub combined: bool,
    /// How long the nemesis runs.
    pub duration_ms: u64,
    /// Node ids `1..=nodes`.
    pub nodes: u64,
    /// Client processes `1..=client_processes`.
    pub client_processes: u32,
    /// The workload's lease ttl (pauses last longer).
    pub ttl_ms: u64,
}

/// The plan for `seed`.
pub fn plan(seed: u64, shape: &PlanShape) -> Vec<Step> {
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x006e_656d_6573_6973);
    let mut steps = Vec::new();
    // Only the kinds this suite can apply to processes (the simulation has others).
    let kinds: Vec<FaultKind> = shape
        .kinds
        .iter()
        .copied()
        .filter(|kind| kind.in_fault_suite())
        // A move needs a node without a replica (3 replicas per group).
        .filter(|kind| shape.nodes > 3 || !kind.is_membership())
        .collect();
    if kinds.is_empty() || shape.nodes == 0 {
        return steps;
    }
    let end_ms = shape.duration_ms.saturating_sub(500);
    let mut at_ms = 1_000u64;
    // When the current node-disrupting fault ends.
    let mut disrupted_until = 0u64;
    while at_ms + 500 < end_ms {
        let mut kind = kinds[rng.random_range(0..kinds.len())];
        if kind.disrupts_nodes() && at_ms < disrupted_until {
            let calm: Vec<FaultKind> = kinds
                .iter()
                .copied()
                .filter(|k| !k.disrupts_nodes())
                .collect();
            if calm.is_empty() {
                at_ms = disrupted_until + 200;
                continue;
            }
            kind = calm[rng.random_range(0..calm.len())];
        }
        let Some((fault, hold_ms)) = draw(&mut rng, kind, shape) else {
            // Not one of this suite's kinds (filtered out above, so never).
            at_ms += 500;
            continue;
        };
        let hold_ms = hold_ms.min(end_ms.saturating_sub(at_ms)).max(200);
        if kind.disrupts_nodes() {
            disrupted_until = at_ms + hold_ms;
        }
        steps.push(Step {
            at_ms,
            hold_ms,
            fault,
        });
        at_ms += if shape.combined {
            rng.random_range(400..2_000)
        } else {
            hold_ms + rng.random_range(500..2_500)
        };
    }
    steps
}

/// A magnitude from `range`, positive or negative with equal odds.
fn either_sign(rng: &mut SmallRng, range: std::ops::RangeInclusive<i64>) -> i64 {
    let magnitude = rng.random_range(range);
    if rng.random_bool(0.5) {
        magnitude
    } else {
        -magnitude
    }
}

/// The fault of `kind` with its targets and amounts, and how long it holds; `None` for a kind
/// only the simulation applies.
fn draw(rng: &mut SmallRng, kind: FaultKind, shape: &PlanShape) -> Option<(Fault, u64)> {
    let nodes = shape.nodes;
    let node = |rng: &mut SmallRng| rng.random_range(1..=nodes);
    let target = |rng: &mut SmallRng| {
        if rng.random_bool(0.5) {
            NodeTarget::Leader
        } else {
            NodeTarget::Node(rng.random_range(1..=nodes))
        }
    };
    let beyond_ttl = |rng: &mut SmallRng| shape.ttl_ms + rng.random_range(500..2_500);
    let mut shuffled: Vec<u64> = (1..=nodes).collect();
    for i in (1..shuffled.len()).rev() {
        let j = rng.random_range(0..=i);
        shuffled.swap(i, j);
    }
    let drawn = match kind {
        FaultKind::PartitionOneWay | FaultKind::HoldMessages | FaultKind::LoseMessages => {
            return None;
        }
        FaultKind::Kill => (Fault::Kill(target(rng)), rng.random_range(800..4_000)),
        FaultKind::PauseNode => (Fault::PauseNode(target(rng)), beyond_ttl(rng)),
        FaultKind::PauseClient => (
            Fault::PauseClient(rng.random_range(1..=shape.client_processes.max(1))),
            beyond_ttl(rng),
        ),
        FaultKind::PartitionLeader => (Fault::Isolate(target(rng)), rng.random_range(1_500..6_000)),
        FaultKind::PartitionHalves => {
            let minority_size = usize::try_from((nodes - 1) / 2).unwrap_or(1).max(1);
            let mut minority = shuffled[..minority_size].to_vec();
            minority.sort_unstable();
            (Fault::Halves { minority }, rng.random_range(1_500..6_000))
        }
        FaultKind::PartitionBridge => {
            let bridge = shuffled[0];
            let rest = &shuffled[1..];
            let half = rest.len() / 2;
            let mut left = rest[..half.max(1)].to_vec();
            let mut right = rest[half.max(1)..].to_vec();
            left.sort_unstable();
            right.sort_unstable();
            (
                Fault::Bridge {
                    left,
                    bridge,
                    right,
                },
                rng.random_range(1_500..6_000),
            )
        }
        FaultKind::ClockRate => (
            Fault::ClockRate {
                node: node(rng),
                ppm: either_sign(rng, 1_000..=5_000),
            },
            rng.random_range(3_000..10_000),
        ),
        FaultKind::ClockJump => (
            Fault::ClockJump {
                node: node(rng),
                offset_s: either_sign(rng, 60..=600),
            },
            rng.random_range(2_000..8_000),
        ),
        FaultKind::SlowDisk => (
            Fault::SlowDisk {
                node: node(rng),
                delay_ms: rng.random_range(20..=300),
            },
            rng.random_range(2_000..6_000),
        ),
        FaultKind::MoveReplica => (
            Fault::MoveReplica { pick: rng.random() },
            rng.random_range(3_000..8_000),
        ),
        // Long enough for the controller (a round every 1 s in fault runs) to move replicas.
        FaultKind::AddNode => (Fault::AddNode, rng.random_range(4_000..10_000)),
        FaultKind::DrainNode => (
            Fault::DrainNode { pick: rng.random() },
            rng.random_range(4_000..10_000),
        ),
        FaultKind::RemoveNode => (
            Fault::RemoveNode { pick: rng.random() },
            rng.random_range(6_000..12_000),
        ),
        // Long enough, at times, for the controller to declare the node dead first (a killed
        // peer's connection lingers until QUIC's 10 s idle timeout).
        FaultKind::ReplaceNode => (
            Fault::ReplaceNode(target(rng)),
            rng.random_range(8_000..16_000),
        ),
    };
    Some(drawn)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(combined: bool) -> PlanShape {
        PlanShape {
            kinds: FaultKind::FAULT_SUITE.to_vec(),
            combined,
            duration_ms: 60_000,
            nodes: 5,
            client_processes: 3,
            ttl_ms: 3_000,
        }
    }

    #[test]
    fn a_seed_gives_one_plan() {
        assert_eq!(plan(7, &shape(true)), plan(7, &shape(true)));
        assert_ne!(plan(7, &shape(true)), plan(8, &shape(true)));
    }

    #[test]
    fn disrupting_faults_never_overlap_and_steps_end_in_time() {
        for seed in 0..200 {
            for combined in [false, true] {
                let steps = plan(seed, &shape(combined));
                assert!(!steps.is_empty());
                let mut disrupting: Vec<(u64, u64)> = steps
                    .iter()
                    .filter(|s| s.fault.kind().disrupts_nodes())
                    .map(|s| (s.at_ms, s.at_ms + s.hold_ms))
                    .collect();
                disrupting.sort_unstable();
                for pair in disrupting.windows(2) {
                    assert!(pair[0].1 <= pair[1].0, "seed {seed}: {pair:?}");
                }
                assert!(steps.iter().all(|s| s.at_ms + s.hold_ms <= 60_000));
            }
        }
    }

    #[test]
    fn pauses_outlast_the_ttl() {
        for seed in 0..100 {
            for step in plan(seed, &shape(false)) {
                if matches!(step.fault, Fault::PauseNode(_) | Fault::PauseClient(_))
                    && step.at_ms + step.hold_ms < 59_000
                {
                    assert!(step.hold_ms > 3_000, "{step:?}");
                }
            }
        }
    }
}
