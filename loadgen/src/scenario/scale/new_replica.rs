//! The scale run's last phase: a new replica of one group built on a node that has just joined
//! the cluster (issue 25: "a new replica, via the membership move, is built within 60 s per group
//! share").
//!
//! The cluster grows by one node through the [`NodeControl`] (`tenure dev add`), which is then
//! watched in the node table (`ClusterNodes`, every 250 ms) until it is active: a node takes
//! replicas only then. One group's replica moves to it from one of the group's voters that is not
//! its leader (so the leader, which runs the move and sends the snapshot, stays where it is):
//! [`Client::move_replica`], which the group's leader carries out as the new replica's creation,
//! its snapshot and catch-up as a learner, the joint-consensus voter change and the old replica's
//! drop, and which answers once all of that is done. The figure is that call's wall time. The
//! learner counts as caught up once its log matches the leader's, which may be before it has
//! applied it (a small group's log is replayed rather than sent as a snapshot; in a 20,000-lease
//! test run the new node's gauges showed 6 of about 1,400 lease records, and no apply lag, 1.25 s
//! after the move's answer): so the new node's own status (`Status`, every 100 ms) is then asked
//! until its replica's applied index reaches the leader's last log index in the move's answer,
//! the time at which the new replica has applied everything the leader held when the move ended.
//!
//! The group: the highest-numbered one whose replica set is settled and does not hold the new
//! node. The placement controller (on the metadata group's leader, when `[cluster]
//! placement_interval_ms` is not 0, as in `tenure dev`) balances onto a new node by scanning the
//! groups from 0 upwards, and starts no balancing move while a group is half-way through a move,
//! so the measured move is the last one its balancing would reach; a controller move started
//! before the measured one (in the moment between the node becoming active and the move's
//! start) can still run beside it, which the figures show (`replica_moves_ended_during` above 1,
//! `new_node_replicas_created` or `new_node_groups` above 1).
//!
//! The group's size: the new node's `tenure_state_lease_records` (lease records, active and
//! retained inactive, of every group the node hosts) in a reading made at least 1.25 s after the
//! replica had applied (the gauges are refreshed once a second, so the reading postdates it): the
//! group's own when the same reading's `tenure_groups_hosted` is 1; else the caller's share,
//! leases held / groups.
//!
//! Must not depend on: any server crate; the cluster is seen through the client library, the
//! nodes' HTTP endpoints and the node control.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tenure_client::{Client, ErrorCode, NodeState};

use super::ScaleNode;
use super::sampler::LEASE_RECORDS;
use crate::node_control::NodeControl;
use crate::node_metrics::NodeMetrics;

/// Replica moves a node ran as a group's leader (by result), summed over the nodes.
const REPLICA_MOVES: &str = "tenure_replica_moves_total";
/// Replicas a node created at run time (a move made it a member of a group).
const REPLICAS_CREATED: &str = "tenure_replicas_created_total";
/// Groups a node hosts (refreshed with its lease records).
const GROUPS_HOSTED: &str = "tenure_groups_hosted";
/// The largest snapshot a node built since it started.
const SNAPSHOT_BYTES_MAX: &str = "tenure_snapshot_bytes_max";
/// How often the node table (and a group's members, when they did not answer) is asked.
const POLL_EVERY: Duration = Duration::from_millis(250);
/// How long a move refused as invalid is asked again: the group's leader takes a node's replicas
/// only once its own view of the node table shows the node active, which may follow the
/// metadata leader's by a moment.
const REFUSED_RETRY_FOR: Duration = Duration::from_secs(10);
/// How often the new node's status is asked while its replica applies (its connection may ask
/// 20 a second).
const STATUS_EVERY: Duration = Duration::from_millis(100);
/// A reading of the new node's gauges counts only this long after its replica had applied: they
/// are refreshed once a second, so an earlier reading may show the replica before that.
const GAUGES_FRESH_AFTER: Duration = Duration::from_millis(1_250);
/// Attempts at reading the new node's gauges.
const GAUGES_ATTEMPTS: u32 = 8;
/// Attempts at one group's members before the next group is tried.
const MEMBERS_ATTEMPTS: u32 = 3;

/// What the phase measured.
#[derive(Debug, Clone, Default)]
pub(super) struct NewReplica {
    /// The node added.
    pub node: Option<u64>,
    /// The `tenure dev add` (or the test cluster's add) command's time, seconds.
    pub add_command_s: Option<f64>,
    /// From asking for the node until the node table showed it active, seconds.
    pub active_s: Option<f64>,
    /// The group moved.
    pub group: Option<u32>,
    /// The voter whose replica moved to the new node.
    pub from: Option<u64>,
    /// The group's leader before the move.
    pub leader: Option<u64>,
    /// Whether the move was taken by the group's leader (the attempt that was not refused).
    pub move_started: bool,
    /// The move's wall time, from the attempt the leader took to its answer, seconds.
    pub move_s: Option<f64>,
    /// The same from the first attempt (refusals included), seconds.
    pub move_since_first_attempt_s: Option<f64>,
    /// Attempts refused as invalid before one was taken (the leader did not yet see the node
    /// active).
    pub refused_attempts: u32,
    /// The group's voters as the move's answer gave them.
    pub voters_after: Vec<u64>,
    /// The leader's last log index in the move's answer: what the new replica must apply.
    pub applied_index_target: Option<u64>,
    /// From the attempt the leader took until the new node's status showed its replica's
    /// applied index at [`NewReplica::applied_index_target`], seconds (`None`: not within the
    /// move's bound).
    pub applied_s: Option<f64>,
    /// The new node's lease records, read after its replica had applied (`None`: not read, or
    /// the node hosted other groups too, so they are not the group's alone).
    pub lease_records: Option<f64>,
    /// Groups the new node hosted in that reading.
    pub new_node_groups: Option<f64>,
    /// Replicas the new node created (1: only the measured one).
    pub new_node_replicas_created: Option<f64>,
    /// Replica moves that ended while the measured one ran, over every node, the measured one
    /// included.
    pub replica_moves_ended_during: Option<f64>,
    /// The leader's largest snapshot since it started, bytes (no node exports the size of one
    /// transfer: this bounds it only when the move's snapshot was built after the last larger
    /// one, and it is any group's).
    pub leader_snapshot_bytes_max: Option<f64>,
    /// The move's window, for the foreground's figures.
    pub window: Option<(Instant, Instant)>,
    /// Why the figure is missing.
    pub error: Option<String>,
}

impl NewReplica {
    /// As JSON.
    pub(super) fn figures(&self) -> Value {
        json!({
            "node": self.node,
            "add_command_s": self.add_command_s,
            "active_s": self.active_s,
            "group": self.group,
            "from": self.from,
            "leader": self.leader,
            "move_started": self.move_started,
            "move_s": self.move_s,
            "move_since_first_attempt_s": self.move_since_first_attempt_s,
            "applied_index_target": self.applied_index_target,
            "applied_s": self.applied_s,
            "refused_attempts": self.refused_attempts,
            "voters_after": self.voters_after,
            "lease_records_on_new_node": self.lease_records,
            "new_node_replicas_created": self.new_node_replicas_created,
            "new_node_groups": self.new_node_groups,
            "replica_moves_ended_during": self.replica_moves_ended_during,
            "leader_snapshot_bytes_max": self.leader_snapshot_bytes_max,
            "error": self.error,
        })
    }
}

/// Adds a node through `control`, waits until the node table shows it active, and moves one
/// group's replica to it (see the module documentation). The node's join (the add and the wait
/// for it to be active) and the move are bounded by `bound` each. Never fails: what went wrong
/// is in [`NewReplica::error`].
pub(super) async fn new_replica(
    client: &Client,
    control: &dyn NodeControl,
    nodes: &[ScaleNode],
    groups: u32,
    bound: Duration,
) -> NewReplica {
    let mut out = NewReplica::default();
    if let Err(why) = run(&mut out, client, control, nodes, groups, bound).await {
        out.error = Some(why);
    }
    out
}

async fn run(
    out: &mut NewReplica,
    client: &Client,
    control: &dyn NodeControl,
    nodes: &[ScaleNode],
    groups: u32,
    bound: Duration,
) -> Result<(), String> {
    // The node joins.
    let asked = Instant::now();
    let join_deadline = asked + bound;
    let node = match tokio::time::timeout(bound, control.add()).await {
        Ok(Ok(node)) => node,
        Ok(Err(error)) => return Err(format!("adding a node: {error}")),
        Err(_) => return Err(format!("adding a node: not done within {bound:?}")),
    };
    out.node = Some(node);
    out.add_command_s = Some(asked.elapsed().as_secs_f64());
    let http_url = active_node(client, node, join_deadline).await?;
    out.active_s = Some(asked.elapsed().as_secs_f64());

    // The group, and the voter whose replica moves.
    let (group, from, leader) = choose_group(client, node, groups, join_deadline).await?;
    out.group = Some(group);
    out.from = Some(from);
    out.leader = Some(leader);
    let mut urls: Vec<String> = nodes.iter().map(|n| n.http_url.clone()).collect();
    urls.push(http_url.clone());
    let cluster = NodeMetrics::new(&urls);
    let moves_before = cluster.counter_sum(REPLICA_MOVES).await.ok();

    // The move.
    let first = Instant::now();
    let move_deadline = first + bound;
    let refused_until = first + REFUSED_RETRY_FOR;
    let (members, started, ended) = loop {
        let attempt = Instant::now();
        let left = move_deadline.saturating_duration_since(attempt);
        match tokio::time::timeout(left, client.move_replica(group, from, node, left)).await {
            Ok(Ok(members)) => {
                out.move_started = true;
                break (members, attempt, Instant::now());
            }
            Ok(Err(error))
                if error.code() == Some(ErrorCode::InvalidArgument)
                    && Instant::now() + POLL_EVERY < refused_until =>
            {
                out.refused_attempts += 1;
                tokio::time::sleep(POLL_EVERY).await;
            }
            Ok(Err(error)) => {
                // Refused as invalid: never taken; anything else: taken (or maybe taken) and
                // failed.
                out.move_started = error.code() != Some(ErrorCode::InvalidArgument);
                return Err(format!(
                    "moving group {group}'s replica from node {from} to node {node}: {error}"
                ));
            }
            Err(_) => {
                out.move_started = true;
                return Err(format!(
                    "moving group {group}'s replica from node {from} to node {node}: not done \
                     within {bound:?}"
                ));
            }
        }
    };
    out.window = Some((started, ended));
    out.move_s = Some(ended.duration_since(started).as_secs_f64());
    out.move_since_first_attempt_s = Some(ended.duration_since(first).as_secs_f64());
    out.voters_after.clone_from(&members.voters);
    if members.voter_sets.len() != 1 || !members.voters.contains(&node) {
        return Err(format!(
            "the move of group {group} answered the voter sets {:?}, without node {node}",
            members.voter_sets
        ));
    }

    // What else moved meanwhile (the counter is counted when a move ends), when the new
    // replica had applied, and the group's size.
    let moves_after = cluster.counter_sum(REPLICA_MOVES).await.ok();
    out.replica_moves_ended_during = moves_before
        .zip(moves_after)
        .map(|(before, after)| after - before);
    out.applied_index_target = Some(members.last_log_index);
    if let Some(at) = applied(client, node, group, members.last_log_index, move_deadline).await {
        out.applied_s = Some(at.duration_since(started).as_secs_f64());
        let gauges = new_node_gauges(&http_url, at + GAUGES_FRESH_AFTER).await;
        out.new_node_replicas_created = gauges.replicas_created;
        out.new_node_groups = gauges.groups;
        out.lease_records = gauges.lease_records.filter(|_| {
            gauges
                .groups
                .is_some_and(|groups| (groups - 1.0).abs() < 0.5)
        });
    }
    if let Some(url) = leader_url(client, leader, nodes).await {
        out.leader_snapshot_bytes_max = NodeMetrics::new(&[url])
            .max_over_nodes(SNAPSHOT_BYTES_MAX)
            .await;
    }
    Ok(())
}

/// Watches the node table until `node` is active in it (or `deadline`); its HTTP address.
async fn active_node(client: &Client, node: u64, deadline: Instant) -> Result<String, String> {
    loop {
        let last = match client.cluster_nodes().await {
            Ok(meta) => match meta.node(node) {
                Some(record) if record.state == NodeState::Active => {
                    return Ok(format!("http://{}", record.http_addr));
                }
                Some(record) => format!(
                    "{} in node table version {}",
                    record.state.as_str(),
                    meta.version
                ),
                None => format!("not in node table version {}", meta.version),
            },
            Err(error) => format!("the node table: {error}"),
        };
        if Instant::now() + POLL_EVERY >= deadline {
            return Err(format!(
                "node {node} is not active in the node table within the bound (last: {last})"
            ));
        }
        tokio::time::sleep(POLL_EVERY).await;
    }
}

/// The highest-numbered group whose replica set is settled (one voter set, no learner), has a
/// leader and does not hold `node`: the group, the lowest-numbered voter that is not its leader,
/// and its leader.
async fn choose_group(
    client: &Client,
    node: u64,
    groups: u32,
    deadline: Instant,
) -> Result<(u32, u64, u64), String> {
    let mut last = String::from("no group");
    for group in (0..groups).rev() {
        for _ in 0..MEMBERS_ATTEMPTS {
            if Instant::now() >= deadline {
                return Err(format!("no group to move within the bound (last: {last})"));
            }
            let members = match client.group_members(group).await {
                Ok(members) => members,
                Err(error) => {
                    last = format!("group {group}: {error}");
                    tokio::time::sleep(POLL_EVERY).await;
                    continue;
                }
            };
            let settled = members.voter_sets.len() == 1 && members.learners.is_empty();
            let from = members
                .voters
                .iter()
                .copied()
                .filter(|&voter| Some(voter) != members.leader && voter != node)
                .min();
            match (settled, members.leader, from) {
                (true, Some(leader), Some(from)) if !members.voters.contains(&node) => {
                    return Ok((group, from, leader));
                }
                _ => {
                    last = format!(
                        "group {group}: voters {:?}, learners {:?}, leader {:?}",
                        members.voter_sets, members.learners, members.leader
                    );
                    break;
                }
            }
        }
    }
    Err(format!("no group to move (last: {last})"))
}

/// Asks node `node` for its status every [`STATUS_EVERY`] until its replica of `group` has
/// applied `index` (or `deadline`); when it first showed that. The client learns a new node's
/// address from the routing table, refreshed while the node is unknown to it.
async fn applied(
    client: &Client,
    node: u64,
    group: u32,
    index: u64,
    deadline: Instant,
) -> Option<Instant> {
    loop {
        match client.node_status(node).await {
            Ok(status) => {
                let applied = status
                    .hosted
                    .iter()
                    .find(|hosted| hosted.group_id == group)
                    .map(|hosted| hosted.applied_index);
                if applied.is_some_and(|applied| applied >= index) {
                    return Some(Instant::now());
                }
            }
            Err(tenure_client::ClientError::InvalidRequest(_)) => {
                let _ = tokio::time::timeout(POLL_EVERY, client.refresh_routing()).await;
            }
            Err(_) => {}
        }
        if Instant::now() + STATUS_EVERY >= deadline {
            return None;
        }
        tokio::time::sleep(STATUS_EVERY).await;
    }
}

/// What the new node's gauges showed.
#[derive(Debug, Default)]
struct Gauges {
    lease_records: Option<f64>,
    groups: Option<f64>,
    replicas_created: Option<f64>,
}

/// One reading of the new node's gauges made at `from` or later (asked again on a failed scrape,
/// at most [`GAUGES_ATTEMPTS`] times).
async fn new_node_gauges(http_url: &str, from: Instant) -> Gauges {
    let metrics = NodeMetrics::new(&[http_url.to_owned()]);
    tokio::time::sleep_until(from.into()).await;
    for _ in 0..GAUGES_ATTEMPTS {
        if let Some(Ok(exposition)) = metrics.per_node().await.into_iter().next() {
            return Gauges {
                lease_records: exposition.value(LEASE_RECORDS),
                groups: exposition.value(GROUPS_HOSTED),
                replicas_created: exposition.value(REPLICAS_CREATED),
            };
        }
        tokio::time::sleep(POLL_EVERY).await;
    }
    Gauges::default()
}

/// The HTTP address of node `leader`: from the run's node list, else the node table.
async fn leader_url(client: &Client, leader: u64, nodes: &[ScaleNode]) -> Option<String> {
    if let Some(node) = nodes.iter().find(|node| node.id == leader) {
        return Some(node.http_url.clone());
    }
    let meta = client.cluster_nodes().await.ok()?;
    meta.node(leader)
        .map(|record| format!("http://{}", record.http_addr))
}
