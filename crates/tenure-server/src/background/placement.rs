//! The placement controller: one active instance, on the metadata group's ready leader. Every
//! `cluster.placement_interval_ms` it compares each group's replica set (its own Raft
//! membership, asked of its leader) with the node table and acts:
//!
//! 1. **Dead nodes.** An active node it could not reach (no QUIC connection, which outlives a
//!    dead process by up to the idle timeout) for `node_dead_after_ms` is declared `Dead` in the
//!    table (it becomes `Active` again when it reports itself); a draining node is emptied
//!    whether it answers or not.
//! 2. **Repair and evacuation.** A group left half-way by a move whose leader changed (a joint
//!    configuration, a leftover learner) gets that move finished. A voting replica on a node that
//!    is not active (dead first, then removed, then draining) is moved to the active node with
//!    the fewest replicas that does not hold the group.
//! 3. **Balance.** With nothing to evacuate, no move running and `move_pause_ms` passed since
//!    the last paced move ended: while the most loaded active node holds at least two replicas
//!    more than the least loaded, one replica moves from the first to the second (a group the
//!    second does not hold).
//! 4. **Leaders.** Each group's preferred leader (the node table's `leader_preferences`, which
//!    the groups' leaders follow, `background::balancer`) is one of its active voters, spread so
//!    every active node prefers-leads about the same number of groups; a valid preference is kept
//!    while its node is not over its share.
//!
//! Moves go through the groups' leaders (`MoveReplica`, the per-group mechanism of
//! `crate::membership`), at most `cluster.moves_inflight_max` at once. Moves that only balance
//! or empty a draining node wait `cluster.move_pause_ms` after the last move ended (pacing: a
//! longer rebalance for less CPU taken from foreground requests at once); moves that restore
//! the replication factor never wait. Every decision is logged
//! and counted (`tenure_placement_decisions_total{kind}`); replicas and leaders per node are
//! gauges.
//!
//! Must not depend on: the request path's lease routing; it acts only through the node table and
//! the membership requests.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tenure_core::{ClusterOp, METADATA_GROUP, NodeState};
use tenure_proto::client::{GroupMembers, RequestBody, ResponseBody};
use tokio::time::Instant;
use tracing::{info, warn};

use crate::metrics as m;
use crate::placement::replicas_of;
use crate::shared::NodeShared;

/// How long the controller waits for one group's membership.
const MEMBERS_TIMEOUT: Duration = Duration::from_secs(2);
/// How long one move request waits: longer than a move can take (its learner's catch-up is
/// bounded by `CATCH_UP_TIMEOUT`), so the controller's count of running moves stays true.
const MOVE_REQUEST_TIMEOUT: Duration =
    Duration::from_secs(crate::membership::CATCH_UP_TIMEOUT.as_secs() + 60);

fn decided(kind: &'static str) {
    ::metrics::counter!(m::PLACEMENT_DECISIONS_TOTAL, "kind" => kind).increment(1);
}

/// Runs until the node shuts down (never, when `placement_interval_ms` is 0).
pub(crate) async fn run_placement_controller(shared: Arc<NodeShared>) {
    let interval_ms = shared.config.cluster.placement_interval_ms;
    if interval_ms == 0 {
        return;
    }
    let mut controller = Controller {
        shared: shared.clone(),
        unreachable_since: BTreeMap::new(),
        moves_running: Arc::new(AtomicUsize::new(0)),
        groups_moving: Arc::new(std::sync::Mutex::new(BTreeSet::new())),
        last_move_ended: Arc::new(std::sync::Mutex::new(None)),
        active: false,
    };
    let mut rounds = super::Rounds::every(Duration::from_millis(interval_ms));
    while rounds.next(&shared).await {
        controller.round().await;
    }
}

struct Controller {
    shared: Arc<NodeShared>,
    /// Members this controller could not reach, since when.
    unreachable_since: BTreeMap<u64, Instant>,
    moves_running: Arc<AtomicUsize>,
    groups_moving: Arc<std::sync::Mutex<BTreeSet<u32>>>,
    /// When this controller's last move ended (`cluster.move_pause_ms` counts from it).
    last_move_ended: Arc<std::sync::Mutex<Option<Instant>>>,
    /// Whether this node was the active controller last round.
    active: bool,
}

impl Controller {
    async fn round(&mut self) {
        let shared = self.shared.clone();
        let me = shared.config.node_id;
        let Some(meta_handle) = shared
            .group(METADATA_GROUP.0)
            .filter(|handle| handle.is_ready_leader())
        else {
            if self.active {
                info!(
                    node = me,
                    "placement controller: no longer the metadata leader"
                );
            }
            self.active = false;
            self.unreachable_since.clear();
            return;
        };
        let view = meta_handle.cluster_meta();
        if view.version == 0 {
            return;
        }
        if !self.active {
            info!(node = me, "placement controller: active on this node");
            self.active = true;
        }
        shared.adopt_cluster_view(view.clone());

        // 1. Dead nodes.
        let dead_after = Duration::from_millis(shared.config.cluster.node_dead_after_ms);
        let now = Instant::now();
        for record in view.nodes.values() {
            // A draining node is emptied whether it answers or not.
            let watched = record.state == NodeState::Active;
            if record.node_id == me || !watched {
                self.unreachable_since.remove(&record.node_id);
                continue;
            }
            if shared.transport.is_connected(record.node_id) {
                self.unreachable_since.remove(&record.node_id);
                continue;
            }
            let since = *self.unreachable_since.entry(record.node_id).or_insert(now);
            if now.duration_since(since) >= dead_after {
                warn!(
                    node = record.node_id,
                    unreachable_ms =
                        u64::try_from(now.duration_since(since).as_millis()).unwrap_or(u64::MAX),
                    "placement: declaring node {} dead (unreachable longer than \
                     node_dead_after_ms); its replicas will be re-created elsewhere",
                    record.node_id
                );
                decided("dead");
                let op = ClusterOp::SetState {
                    node_id: record.node_id,
                    state: NodeState::Dead,
                };
                if let Err(error) = shared.propose_cluster_change(op).await {
                    warn!(
                        "placement: declaring node {} dead failed: {error}",
                        record.node_id
                    );
                }
                self.unreachable_since.remove(&record.node_id);
            }
        }
        let view = shared.cluster_view();
        let active: BTreeSet<u64> = view.nodes_in(NodeState::Active).into_iter().collect();
        if active.is_empty() {
            return;
        }

        // The groups' replica sets.
        let mut groups: Vec<GroupMembers> = Vec::new();
        for group in 0..shared.config.groups {
            if let Some(members) = self.members_of(group).await {
                groups.push(members);
            }
        }
        let complete = groups.len() == shared.config.groups as usize;
        let mut replicas: BTreeMap<u64, usize> = active.iter().map(|&n| (n, 0)).collect();
        let mut leaders: BTreeMap<u64, usize> = active.iter().map(|&n| (n, 0)).collect();
        for members in &groups {
            for node in members.voters.iter().chain(&members.learners) {
                *replicas.entry(*node).or_insert(0) += 1;
            }
            if let Some(leader) = members.leader {
                *leaders.entry(leader).or_insert(0) += 1;
            }
        }
        for (node, count) in &replicas {
            ::metrics::gauge!(m::NODE_REPLICAS, "node" => node.to_string()).set(*count as f64);
        }
        for (node, count) in &leaders {
            ::metrics::gauge!(m::NODE_LEADERS, "node" => node.to_string()).set(*count as f64);
        }

        // 2. Repair, then evacuation.
        let mut planned = replicas.clone();
        let mut evacuating = false;
        for members in &groups {
            let settled = members.voter_sets.len() == 1 && members.learners.is_empty();
            if !settled {
                // A move that stopped half-way (its leader changed): finish it, unless a move
                // of this controller still runs for the group (the leader joins an identical
                // move to the running one and refuses another).
                evacuating = true;
                if let Some((from, to)) = repair_move(members, &active, &replicas) {
                    self.start_move(
                        members.group_id,
                        from,
                        to,
                        "repair",
                        "unfinished move",
                        false,
                    );
                }
                continue;
            }
            // Dead voters first, then removed, then draining.
            let from = members
                .voters
                .iter()
                .filter(|node| !active.contains(node))
                .min_by_key(|node| {
                    let rank = match view.node(**node).map(|record| record.state) {
                        Some(NodeState::Dead) => 0,
                        Some(NodeState::Removed) | None => 1,
                        Some(_) => 2,
                    };
                    (rank, **node)
                })
                .copied();
            let Some(from) = from else {
                continue;
            };
            evacuating = true;
            // Only emptying a draining node that still answers is paced: a replica on a dead,
            // removed or unreachable node is one the group lacks.
            let paced = matches!(
                view.node(from).map(|record| record.state),
                Some(NodeState::Draining)
            ) && (from == me || shared.transport.is_connected(from));
            if paced && !self.pause_over() {
                continue;
            }
            let holders: BTreeSet<u64> = members
                .voters
                .iter()
                .chain(&members.learners)
                .copied()
                .collect();
            let target = active
                .iter()
                .filter(|node| !holders.contains(node))
                .min_by_key(|node| (planned.get(node).copied().unwrap_or(0), **node))
                .copied();
            let Some(to) = target else {
                continue;
            };
            let state = view
                .node(from)
                .map_or("unknown", |record| record.state.as_str());
            if self.start_move(members.group_id, from, to, "evacuate", state, paced) {
                *planned.entry(to).or_insert(0) += 1;
            }
        }

        // 3. Balance.
        if !evacuating
            && complete
            && self.moves_running.load(Ordering::SeqCst) == 0
            && self.pause_over()
        {
            let most = active
                .iter()
                .max_by_key(|node| (replicas.get(node).copied().unwrap_or(0), **node))
                .copied();
            let least = active
                .iter()
                .min_by_key(|node| (replicas.get(node).copied().unwrap_or(0), **node))
                .copied();
            if let (Some(most), Some(least)) = (most, least) {
                let gap = replicas.get(&most).copied().unwrap_or(0)
                    - replicas
                        .get(&least)
                        .copied()
                        .unwrap_or(0)
                        .min(replicas.get(&most).copied().unwrap_or(0));
                if gap >= 2 {
                    let candidate = groups.iter().find(|members| {
                        members.voter_sets.len() == 1
                            && members.learners.is_empty()
                            && members.voters.contains(&most)
                            && !members.voters.contains(&least)
                            && members.leader != Some(most)
                    });
                    let candidate = candidate.or_else(|| {
                        groups.iter().find(|members| {
                            members.voter_sets.len() == 1
                                && members.learners.is_empty()
                                && members.voters.contains(&most)
                                && !members.voters.contains(&least)
                        })
                    });
                    if let Some(members) = candidate {
                        self.start_move(members.group_id, most, least, "rebalance", "active", true);
                    }
                }
            }
        }

        // 4. Leader preferences.
        if complete {
            self.set_leader_preferences(&groups, &active).await;
        }
    }

    /// Whether `cluster.move_pause_ms` has passed since this controller's last move ended (or
    /// no move ended yet): a move that only balances or drains may start.
    fn pause_over(&self) -> bool {
        let pause = Duration::from_millis(self.shared.config.cluster.move_pause_ms);
        let last = *self
            .last_move_ended
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        pause_over(last, pause, Instant::now())
    }

    /// The group's membership as its leader sees it.
    async fn members_of(&self, group: u32) -> Option<GroupMembers> {
        let shared = &self.shared;
        if let Some(handle) = shared.group(group) {
            if handle.is_ready_leader() {
                return Some(handle.members());
            }
        }
        let leader = shared.leader_of(group).leader?;
        if leader == shared.config.node_id {
            return shared.group(group).map(|handle| handle.members());
        }
        match shared
            .ask_node(
                leader,
                RequestBody::GroupMembers { group_id: group },
                MEMBERS_TIMEOUT,
            )
            .await
        {
            Ok(ResponseBody::Members(members)) if members.leader == Some(leader) => Some(members),
            _ => None,
        }
    }

    /// Starts one move in the background unless the bound is reached or the group is already
    /// moving. Returns whether it started. The end of a `paced` move (balancing, draining)
    /// starts `move_pause_ms` again; other moves (repairs, moves off nodes that are gone) leave
    /// it alone, so one failing again and again cannot hold back the paced ones for ever.
    fn start_move(
        &self,
        group: u32,
        from: u64,
        to: u64,
        kind: &'static str,
        from_state: &str,
        paced: bool,
    ) -> bool {
        let shared = self.shared.clone();
        let limit = shared.config.cluster.moves_inflight_max as usize;
        if self.moves_running.load(Ordering::SeqCst) >= limit {
            return false;
        }
        {
            let Ok(mut moving) = self.groups_moving.lock() else {
                return false;
            };
            if !moving.insert(group) {
                return false;
            }
        }
        self.moves_running.fetch_add(1, Ordering::SeqCst);
        decided(kind);
        info!(
            group,
            from,
            to,
            reason = kind,
            "placement: moving group {group}'s replica from node {from} ({from_state}) to node {to}"
        );
        let running = self.moves_running.clone();
        let moving = self.groups_moving.clone();
        let last_ended = self.last_move_ended.clone();
        tokio::spawn(async move {
            let outcome = request_move(&shared, group, from, to).await;
            match outcome {
                Ok(()) => info!(group, from, to, "placement: move done"),
                Err(message) => warn!(group, from, to, "placement: move failed: {message}"),
            }
            if paced {
                let mut last = last_ended
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                *last = Some(Instant::now());
            }
            running.fetch_sub(1, Ordering::SeqCst);
            if let Ok(mut moving) = moving.lock() {
                moving.remove(&group);
            }
        });
        true
    }

    async fn set_leader_preferences(&self, groups: &[GroupMembers], active: &BTreeSet<u64>) {
        let shared = &self.shared;
        let view = shared.cluster_view();
        // Every active node should prefer-lead at least `floor` groups (and about as many as
        // the others); a node keeps its current preferences up to that, the rest go to the
        // least assigned active voter, the current one on a tie (so a settled spread stays).
        let floor = groups.len() / active.len().max(1);
        let mut assigned: BTreeMap<u64, usize> = active.iter().map(|&n| (n, 0)).collect();
        let mut choice: BTreeMap<u32, u64> = BTreeMap::new();
        // A group without a preference starts from the configured layout's preferred node (a
        // cluster that never changed keeps its leaders where they are).
        let current = |members: &GroupMembers| -> Option<u64> {
            let node = match view.leader_preferences.get(&members.group_id) {
                Some(&node) => node,
                None => *replicas_of(
                    members.group_id,
                    &shared.node_ids,
                    shared.config.replication_factor,
                )
                .first()?,
            };
            (members.voters.contains(&node) && active.contains(&node)).then_some(node)
        };
        for members in groups {
            let Some(node) = current(members) else {
                continue;
            };
            if assigned.get(&node).copied().unwrap_or(0) < floor {
                choice.insert(members.group_id, node);
                *assigned.entry(node).or_insert(0) += 1;
            }
        }
        for members in groups {
            if choice.contains_key(&members.group_id) {
                continue;
            }
            let now = current(members);
            let best = members
                .voters
                .iter()
                .filter(|node| active.contains(node))
                .min_by_key(|node| {
                    let count = assigned.get(node).copied().unwrap_or(0);
                    (count, Some(**node) != now, **node)
                })
                .copied();
            if let Some(node) = best {
                choice.insert(members.group_id, node);
                *assigned.entry(node).or_insert(0) += 1;
            }
        }
        // Then hand single groups from nodes above `floor` to voters below it, while any such
        // pair exists (bounded: each step lowers the distance to the floor spread).
        for _ in 0..groups.len() {
            let below: Vec<u64> = active
                .iter()
                .copied()
                .filter(|node| assigned.get(node).copied().unwrap_or(0) < floor)
                .collect();
            let step = groups.iter().find_map(|members| {
                let holder = *choice.get(&members.group_id)?;
                if assigned.get(&holder).copied().unwrap_or(0) <= floor {
                    return None;
                }
                let to = below.iter().find(|node| members.voters.contains(node))?;
                Some((members.group_id, holder, *to))
            });
            let Some((group, holder, to)) = step else {
                break;
            };
            choice.insert(group, to);
            *assigned.entry(holder).or_insert(1) -= 1;
            *assigned.entry(to).or_insert(0) += 1;
        }
        let mut changes: Vec<(u32, u64)> = choice
            .iter()
            .filter(|(group, node)| view.leader_preferences.get(group) != Some(node))
            .map(|(&group, &node)| (group, node))
            .collect();
        for group in view.leader_preferences.keys() {
            if !choice.contains_key(group) && groups.iter().any(|m| m.group_id == *group) {
                changes.push((*group, 0));
            }
        }
        if changes.is_empty() {
            return;
        }
        decided("leaders");
        info!(
            changed = changes.len(),
            "placement: new preferred leaders for {} groups",
            changes.len()
        );
        if let Err(error) = shared
            .propose_cluster_change(ClusterOp::SetLeaderPreferences {
                preferences: changes,
            })
            .await
        {
            warn!("placement: setting leader preferences failed: {error}");
        }
    }
}

/// Whether a paced move may start at `now`: no pause, no move ended yet, or `pause` passed since
/// the last one ended.
fn pause_over(last_move_ended: Option<Instant>, pause: Duration, now: Instant) -> bool {
    pause.is_zero()
        || last_move_ended.is_none_or(|ended| now.saturating_duration_since(ended) >= pause)
}

/// The move that finishes a group's unfinished change: a joint configuration's old voter to its
/// new one; a leftover learner (on an active node) takes the place of a voter that is not active,
/// else of the busiest voter.
fn repair_move(
    members: &GroupMembers,
    active: &BTreeSet<u64>,
    replicas: &BTreeMap<u64, usize>,
) -> Option<(u64, u64)> {
    if let [old, new] = members.voter_sets.as_slice() {
        let from = old.iter().find(|node| !new.contains(node))?;
        let to = new.iter().find(|node| !old.contains(node))?;
        return Some((*from, *to));
    }
    let to = *members.learners.iter().find(|node| active.contains(node))?;
    let from = members
        .voters
        .iter()
        .find(|node| !active.contains(node))
        .or_else(|| {
            members
                .voters
                .iter()
                .max_by_key(|node| (replicas.get(node).copied().unwrap_or(0), **node))
        })?;
    Some((*from, to))
}

/// Asks the group's leader (or this node, when it leads) to move a replica; waits for the end.
async fn request_move(
    shared: &Arc<NodeShared>,
    group: u32,
    from: u64,
    to: u64,
) -> Result<(), String> {
    let leader = shared
        .leader_of(group)
        .leader
        .ok_or_else(|| format!("group {group} has no known leader"))?;
    let body = RequestBody::MoveReplica {
        group_id: group,
        from,
        to,
    };
    let answer = if leader == shared.config.node_id {
        let ctx = crate::request::RequestContext {
            principal: crate::membership::node_principal(shared.config.node_id),
            flags: tenure_proto::client::RequestFlags::default(),
            timeout: MOVE_REQUEST_TIMEOUT,
            peer_node: Some(shared.config.node_id),
            peer_cert_sha256: None,
        };
        shared.move_replica(group, from, to, &ctx).await
    } else {
        shared.ask_node(leader, body, MOVE_REQUEST_TIMEOUT).await
    };
    match answer {
        Ok(_) => Ok(()),
        Err(error) => Err(error.to_string()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn members(voter_sets: Vec<Vec<u64>>, learners: Vec<u64>) -> GroupMembers {
        let mut voters: Vec<u64> = voter_sets.iter().flatten().copied().collect();
        voters.sort_unstable();
        voters.dedup();
        GroupMembers {
            group_id: 7,
            seen_by: 1,
            leader: Some(1),
            term: 3,
            voters,
            voter_sets,
            learners,
            membership_log_index: 10,
            membership_committed: true,
            last_log_index: 12,
            followers: Vec::new(),
        }
    }

    #[test]
    fn paced_moves_wait_the_pause_after_the_last_move_ended() {
        let ended = Instant::now();
        let pause = Duration::from_secs(10);
        assert!(pause_over(None, pause, ended));
        assert!(pause_over(Some(ended), Duration::ZERO, ended));
        assert!(!pause_over(Some(ended), pause, ended));
        assert!(!pause_over(
            Some(ended),
            pause,
            ended + Duration::from_millis(9_999)
        ));
        assert!(pause_over(Some(ended), pause, ended + pause));
    }

    #[test]
    fn a_joint_configuration_is_finished_by_its_own_move() {
        let active: BTreeSet<u64> = [1, 2, 3, 4].into();
        let joint = members(vec![vec![1, 2, 3], vec![1, 2, 4]], Vec::new());
        assert_eq!(repair_move(&joint, &active, &BTreeMap::new()), Some((3, 4)));
    }

    #[test]
    fn a_leftover_learner_replaces_an_inactive_voter_else_the_busiest() {
        let replicas: BTreeMap<u64, usize> = [(1, 5), (2, 9), (3, 4), (4, 1)].into();
        // Node 3 is not active (draining, dead or removed): the learner takes its place.
        let active: BTreeSet<u64> = [1, 2, 4].into();
        let learner = members(vec![vec![1, 2, 3]], vec![4]);
        assert_eq!(repair_move(&learner, &active, &replicas), Some((3, 4)));
        // Every voter active: the learner relieves the busiest voter.
        let active: BTreeSet<u64> = [1, 2, 3, 4].into();
        assert_eq!(repair_move(&learner, &active, &replicas), Some((2, 4)));
        // A learner on a node that is not active is not promoted.
        let active: BTreeSet<u64> = [1, 2, 3].into();
        assert_eq!(repair_move(&learner, &active, &replicas), None);
    }
}
