//! The one list of fault kinds, shared by the fault suite (`harness`, real processes) and the
//! deterministic simulation (`sim`): one name per fault, whichever of the two applies it. Each
//! kind says which of them can (a simulation cannot SIGSTOP a process; a process cluster has no
//! message-holding switch), and the two lists below are the orders in which each draws kinds from
//! a seed (changing an order changes which faults a seed replays).
//!
//! Adding a fault: a variant here with its name and description, then its effect in the harness
//! that can apply it (`harness::run`'s fault application and `harness::schedule`'s plan, or
//! `sim`'s nemesis), and the kind appended to that harness's list; see ARCHITECTURE.md, "Adding a
//! fault".
//!
//! Must not depend on: processes, the network, time or the harnesses (names and plain facts).

use serde::{Deserialize, Serialize};

/// A kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// Kill a node (kill -9; in the simulation a crash that loses part of its unsynced writes),
    /// restart it later on its data.
    Kill,
    /// Stop a node (SIGSTOP) for longer than the ttl, then let it go on.
    PauseNode,
    /// Stop a client (SIGSTOP of a client process; in the simulation its links held) for one to
    /// two ttls: its holders go on, and write, until their safe deadlines (zombies).
    PauseClient,
    /// Cut one node (often a group leader) from the others.
    PartitionLeader,
    /// Split the nodes into a majority and a minority.
    PartitionHalves,
    /// Two sides that cannot talk, and one node that talks to both.
    PartitionBridge,
    /// Drop one node's traffic to the others, not theirs to it.
    PartitionOneWay,
    /// Hold every message between a node and the others, then deliver them all.
    HoldMessages,
    /// Lose a share of the messages on one node's links.
    LoseMessages,
    /// One node's monotonic clock runs fast or slow (within the contract's drift bound).
    ClockRate,
    /// One node's wall clock jumps by minutes, forward or back (no decision may read it).
    ClockJump,
    /// One node's WAL syncs take longer (a slow disk).
    SlowDisk,
    /// Move one group's replica from a voter to a node that holds none (learner, catch-up,
    /// joint consensus, drop), through the client library as an operator would; needs more
    /// nodes than replicas.
    MoveReplica,
    /// Start a new node (a spare id, certificate from the cluster CA, `join_existing`) and
    /// announce it in the node table; the placement controller moves replicas to it. Nothing
    /// to heal: it stays.
    AddNode,
    /// Drain an active node (the controller moves its replicas away), then take the drain back
    /// (the controller may move replicas back).
    DrainNode,
    /// Drain an active node and remove it for good once it holds no replica (every node then
    /// refuses it and its certificate); a node not yet empty when the step ends is undrained.
    RemoveNode,
    /// kill -9 a node for good, as when its disk dies: the controller declares it dead (once its
    /// connections time out) and re-creates its replicas on the others; at the end of the step it
    /// is drained and removed from the node table, and a new node (a spare id) takes its place
    /// where the harness can start one.
    ReplaceNode,
}

impl FaultKind {
    /// Every kind.
    pub const ALL: [FaultKind; 17] = [
        FaultKind::Kill,
        FaultKind::PauseNode,
        FaultKind::PauseClient,
        FaultKind::PartitionLeader,
        FaultKind::PartitionHalves,
        FaultKind::PartitionBridge,
        FaultKind::PartitionOneWay,
        FaultKind::HoldMessages,
        FaultKind::LoseMessages,
        FaultKind::ClockRate,
        FaultKind::ClockJump,
        FaultKind::SlowDisk,
        FaultKind::MoveReplica,
        FaultKind::AddNode,
        FaultKind::DrainNode,
        FaultKind::RemoveNode,
        FaultKind::ReplaceNode,
    ];

    /// The kinds the fault suite applies to node processes, in the order its plans draw them.
    pub const FAULT_SUITE: [FaultKind; 14] = [
        FaultKind::Kill,
        FaultKind::PauseNode,
        FaultKind::PauseClient,
        FaultKind::PartitionLeader,
        FaultKind::PartitionHalves,
        FaultKind::PartitionBridge,
        FaultKind::ClockRate,
        FaultKind::ClockJump,
        FaultKind::SlowDisk,
        FaultKind::MoveReplica,
        FaultKind::AddNode,
        FaultKind::DrainNode,
        FaultKind::RemoveNode,
        FaultKind::ReplaceNode,
    ];

    /// The kinds the simulation applies, in the order its seeds draw them.
    pub const SIMULATION: [FaultKind; 15] = [
        FaultKind::Kill,
        FaultKind::PartitionHalves,
        FaultKind::PartitionLeader,
        FaultKind::PartitionOneWay,
        FaultKind::PartitionBridge,
        FaultKind::HoldMessages,
        FaultKind::LoseMessages,
        FaultKind::ClockRate,
        FaultKind::PauseClient,
        FaultKind::ClockJump,
        FaultKind::MoveReplica,
        FaultKind::DrainNode,
        FaultKind::RemoveNode,
        FaultKind::ReplaceNode,
        FaultKind::AddNode,
    ];

    /// Its one name, in reports, histories and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Kill => "kill",
            FaultKind::PauseNode => "pause-node",
            FaultKind::PauseClient => "pause-client",
            FaultKind::PartitionLeader => "partition-leader",
            FaultKind::PartitionHalves => "partition-halves",
            FaultKind::PartitionBridge => "partition-bridge",
            FaultKind::PartitionOneWay => "partition-one-way",
            FaultKind::HoldMessages => "hold-messages",
            FaultKind::LoseMessages => "lose-messages",
            FaultKind::ClockRate => "clock-rate",
            FaultKind::ClockJump => "clock-jump",
            FaultKind::SlowDisk => "slow-disk",
            FaultKind::MoveReplica => "move-replica",
            FaultKind::AddNode => "add-node",
            FaultKind::DrainNode => "drain-node",
            FaultKind::RemoveNode => "remove-node",
            FaultKind::ReplaceNode => "replace-node",
        }
    }

    /// The kind named `name`.
    pub fn parse(name: &str) -> Option<FaultKind> {
        FaultKind::ALL.into_iter().find(|kind| kind.name() == name)
    }

    /// True when the fault suite can apply it to node processes.
    pub fn in_fault_suite(self) -> bool {
        FaultKind::FAULT_SUITE.contains(&self)
    }

    /// True when the simulation can apply it.
    pub fn in_simulation(self) -> bool {
        FaultKind::SIMULATION.contains(&self)
    }

    /// A comma-separated list of names, each one of `applicable` (the fault suite's or the
    /// simulation's kinds): what the `--nemesis` options of the `nemesis` and `sim` binaries
    /// take. The error names the unknown one and the choices.
    pub fn parse_list(text: &str, applicable: &[FaultKind]) -> Result<Vec<FaultKind>, String> {
        text.split(',')
            .map(|name| {
                FaultKind::parse(name.trim())
                    .filter(|kind| applicable.contains(kind))
                    .ok_or_else(|| {
                        let choices: Vec<&str> = applicable.iter().map(|k| k.name()).collect();
                        format!(
                            "unknown nemesis {name:?} (this one applies: {})",
                            choices.join(", ")
                        )
                    })
            })
            .collect()
    }

    /// True for faults that take nodes away from the majority (the fault suite's plans run at
    /// most one at a time).
    pub fn disrupts_nodes(self) -> bool {
        matches!(
            self,
            FaultKind::Kill
                | FaultKind::PauseNode
                | FaultKind::PartitionLeader
                | FaultKind::PartitionHalves
                | FaultKind::PartitionBridge
                | FaultKind::ReplaceNode
        )
    }

    /// True for changes of a group's or the cluster's membership (the simulation draws them on
    /// a stream of their own; they need more nodes than replicas per group).
    pub fn is_membership(self) -> bool {
        matches!(
            self,
            FaultKind::MoveReplica
                | FaultKind::AddNode
                | FaultKind::DrainNode
                | FaultKind::RemoveNode
                | FaultKind::ReplaceNode
        )
    }

    /// True for faults of the network between nodes (the simulation draws them on their own
    /// stream, beside node faults).
    pub fn is_network(self) -> bool {
        matches!(
            self,
            FaultKind::PartitionLeader
                | FaultKind::PartitionHalves
                | FaultKind::PartitionBridge
                | FaultKind::PartitionOneWay
                | FaultKind::HoldMessages
                | FaultKind::LoseMessages
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_one_name_and_a_harness() {
        let mut names: Vec<&str> = FaultKind::ALL.iter().map(|k| k.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), FaultKind::ALL.len(), "names are unique");
        for kind in FaultKind::ALL {
            assert_eq!(FaultKind::parse(kind.name()), Some(kind));
            assert!(
                kind.in_fault_suite() || kind.in_simulation(),
                "{} is applied by nothing",
                kind.name()
            );
        }
    }
}
