//! Failovers and restarts of the scale run, as a client sees them.
//!
//! A failover: the node leading the most groups (by the client's routing table, refreshed) is
//! killed through the [`NodeControl`]; from the moment the kill was asked, every group is probed
//! with an acquire and a release of a key of its own (16 keys per group, found by the client's
//! own placement, used in turn) until each group has answered both; the failover time is the
//! last group's. A group that has not served gets a new probe every 100 ms while the earlier
//! ones still wait (a probe sent to the dead leader waits for its timeout), and the client's
//! routing table is refreshed every 200 ms meanwhile, so the time is the cluster's (election,
//! and the new leader known to a live node) to within about 0.1 to 0.3 s, not the client's
//! timeouts. The node is then started again and watched until it is caught up.
//!
//! A restart: the node leading the fewest groups (a follower-heavy node) is killed, and started
//! again a moment later; from the start, its `/readyz` is polled every 100 ms, and once it answers 200 its
//! metrics, until one reading shows it ready (`tenure_node_ready` 1) with no apply lag
//! (`tenure_apply_lag_entries` 0, both set by the same once-a-second refresh, so the moment is
//! known to within about a second).
//!
//! Must not depend on: any server crate; the nodes are seen through the client library, their
//! HTTP endpoints and the node control.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tenure_client::{AcquireOptions, Client, ResourceKey};

use super::ScaleNode;
use super::sampler::{APPLY_LAG, NODE_READY};
use crate::node_control::NodeControl;
use crate::node_metrics::NodeMetrics;
use crate::scenario::ScenarioError;

/// Keys probed per group (used in turn, so a probe lease whose release went unanswered, or a
/// probe still waiting, does not stand in the way of the next).
pub(super) const KEYS_PER_GROUP: usize = 16;
/// Ttl of a probe lease (released at once; within every cluster's ttl bounds).
const PROBE_TTL: Duration = Duration::from_secs(10);
/// Bound of one probe call.
const PROBE_CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// A new probe of a group that has not served yet, this often.
const PROBE_EVERY: Duration = Duration::from_millis(100);
/// Probes of one group waiting at once at most.
const PROBES_INFLIGHT: usize = 16;
/// How often the routing table is refreshed while groups are probed (a connection may send 20
/// routing requests a second).
const ROUTING_REFRESH_EVERY: Duration = Duration::from_millis(200);
/// How often a restarted node is polled.
const POLL_EVERY: Duration = Duration::from_millis(100);
/// Time given to the routing refresh before the victim is chosen.
const ROUTING_REFRESH_TIMEOUT: Duration = Duration::from_secs(5);

/// The keys the probes use: for each group, keys of one tenant that the client's placement puts
/// in that group.
pub(super) struct ProbeKeys {
    tenant: String,
    holder: String,
    per_group: Vec<Vec<String>>,
}

impl ProbeKeys {
    /// Finds [`KEYS_PER_GROUP`] keys of `tenant` for each of `groups` groups.
    pub(super) async fn find(
        client: &Client,
        tenant: String,
        holder: String,
        groups: u32,
    ) -> Result<ProbeKeys, ScenarioError> {
        let groups_usize = usize::try_from(groups).unwrap_or(0);
        let mut per_group: Vec<Vec<String>> = vec![Vec::new(); groups_usize];
        let mut missing = groups_usize;
        // Placement spreads keys evenly: a few hundred per group is far more than enough.
        let tries = u64::from(groups) * (KEYS_PER_GROUP as u64) * 200;
        for index in 0..tries {
            if missing == 0 {
                break;
            }
            let resource = format!("p{index}");
            let key = ResourceKey::new(tenant.as_str(), resource.as_str());
            let group = client
                .group_of(&key)
                .await
                .map_err(|error| ScenarioError::Config(format!("placement: {error}")))?;
            if let Some(keys) = per_group.get_mut(usize::try_from(group).unwrap_or(usize::MAX))
                && keys.len() < KEYS_PER_GROUP
            {
                keys.push(resource);
                if keys.len() == KEYS_PER_GROUP {
                    missing -= 1;
                }
            }
        }
        if missing > 0 {
            return Err(ScenarioError::Config(format!(
                "no probe keys found for {missing} of {groups} groups"
            )));
        }
        Ok(ProbeKeys {
            tenant,
            holder,
            per_group,
        })
    }

    /// One probe of group `group` with its `attempt`-th key: an acquire and its release, each
    /// within [`PROBE_CALL_TIMEOUT`]; the moment the release was answered.
    async fn attempt(&self, client: &Client, group: usize, attempt: usize) -> Option<Instant> {
        let keys = self.per_group.get(group)?;
        let resource = keys.get(attempt % keys.len().max(1))?;
        let options = AcquireOptions::new(
            self.tenant.as_str(),
            resource.as_str(),
            self.holder.as_str(),
            PROBE_TTL,
        )
        .without_auto_renew();
        let grant = tokio::time::timeout(PROBE_CALL_TIMEOUT, client.acquire_grant(options))
            .await
            .ok()?
            .ok()?;
        tokio::time::timeout(
            PROBE_CALL_TIMEOUT,
            client.release(grant.key, grant.lease_id, grant.holder_id, None),
        )
        .await
        .ok()?
        .ok()?;
        Some(Instant::now())
    }

    /// Probes group `group` until one probe succeeds (or `deadline`): a new probe every
    /// [`PROBE_EVERY`] while earlier ones are still waiting (at most [`PROBES_INFLIGHT`] at
    /// once), each with the next key, so that the moment the group serves again is known to
    /// within that spacing whatever the client's timeouts. The first success's moment.
    async fn serve(
        self: Arc<Self>,
        client: Client,
        group: usize,
        deadline: Instant,
    ) -> Option<Instant> {
        let mut inflight = tokio::task::JoinSet::new();
        let mut ticks = tokio::time::interval(PROBE_EVERY);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut attempt = 0usize;
        loop {
            tokio::select! {
                _ = ticks.tick() => {
                    if Instant::now() >= deadline {
                        if inflight.is_empty() {
                            return None;
                        }
                    } else if inflight.len() < PROBES_INFLIGHT {
                        let (keys, client) = (self.clone(), client.clone());
                        let this = attempt;
                        inflight.spawn(async move { keys.attempt(&client, group, this).await });
                        attempt += 1;
                    }
                }
                Some(joined) = inflight.join_next() => {
                    if let Ok(Some(at)) = joined {
                        inflight.abort_all();
                        return Some(at);
                    }
                }
            }
        }
    }

    /// Probes every group at once; per group, when it served (`None`: not by `deadline`). While
    /// they run, the client's routing table is refreshed every [`ROUTING_REFRESH_EVERY`], so
    /// probes go to a group's new leader as soon as a live node knows it.
    async fn serve_all(
        self: &Arc<Self>,
        client: &Client,
        deadline: Instant,
    ) -> Vec<Option<Instant>> {
        let refresher = tokio::spawn({
            let client = client.clone();
            async move {
                loop {
                    let _ =
                        tokio::time::timeout(ROUTING_REFRESH_EVERY, client.refresh_routing()).await;
                    tokio::time::sleep(ROUTING_REFRESH_EVERY).await;
                }
            }
        });
        let mut probes = tokio::task::JoinSet::new();
        for group in 0..self.per_group.len() {
            let (keys, client) = (self.clone(), client.clone());
            probes.spawn(async move { (group, keys.serve(client, group, deadline).await) });
        }
        let mut served = vec![None; self.per_group.len()];
        while let Some(joined) = probes.join_next().await {
            if let Ok((group, at)) = joined
                && let Some(slot) = served.get_mut(group)
            {
                *slot = at;
            }
        }
        refresher.abort();
        served
    }
}

/// Which node to take down.
#[derive(Debug, Clone, Copy)]
pub(super) enum Victim {
    /// The node leading the most groups (ties: the lowest id).
    MostLeaders,
    /// The node leading the fewest groups (ties: the lowest id).
    FewestLeaders,
}

/// The node to take down, and how many groups it leads, from the client's refreshed routing.
async fn choose(client: &Client, nodes: &[ScaleNode], which: Victim) -> (u64, usize) {
    let _ = tokio::time::timeout(ROUTING_REFRESH_TIMEOUT, client.refresh_routing()).await;
    let routing = client.routing();
    let led = |id: u64| {
        routing
            .leaders
            .iter()
            .filter(|(leader, _)| *leader == Some(id))
            .count()
    };
    let mut counted: Vec<(u64, usize)> = nodes.iter().map(|node| (node.id, led(node.id))).collect();
    counted.sort_by_key(|&(id, count)| match which {
        Victim::MostLeaders => (usize::MAX - count, id),
        Victim::FewestLeaders => (count, id),
    });
    counted.first().copied().unwrap_or((1, 0))
}

/// A node started again: when it was ready and when it was caught up.
#[derive(Debug, Clone)]
pub(super) struct CatchUp {
    /// `/readyz` first answered 200, seconds after the start was asked.
    pub ready_s: Option<f64>,
    /// Ready with no apply lag in the same reading, seconds after the start was asked.
    pub caught_up_s: Option<f64>,
    /// The start command's own time, seconds.
    pub start_command_s: f64,
    /// The start command's error, if it failed.
    pub error: Option<String>,
}

impl CatchUp {
    fn figures(&self) -> Value {
        json!({
            "ready_s": self.ready_s,
            "caught_up_s": self.caught_up_s,
            "start_command_s": self.start_command_s,
            "start_error": self.error,
        })
    }
}

/// Starts node `id` and watches it until it is ready and caught up (or `bound`).
async fn start_and_watch(control: &dyn NodeControl, node: &ScaleNode, bound: Duration) -> CatchUp {
    let started = Instant::now();
    let deadline = started + bound;
    let metrics = NodeMetrics::new(std::slice::from_ref(&node.http_url));
    let start = async {
        let result = tokio::time::timeout(bound, control.start(node.id)).await;
        let took = started.elapsed().as_secs_f64();
        match result {
            Ok(Ok(())) => (took, None),
            Ok(Err(error)) => (took, Some(error.to_string())),
            Err(_) => (took, Some(format!("not started within {bound:?}"))),
        }
    };
    let watch = async {
        let mut ready_at = None;
        while Instant::now() < deadline {
            let ready = metrics.ready_per_node().await.first().copied() == Some(true);
            if ready {
                let now = Instant::now();
                ready_at.get_or_insert(now);
                let caught_up = metrics
                    .per_node()
                    .await
                    .into_iter()
                    .next()
                    .and_then(Result::ok)
                    .is_some_and(|exposition| {
                        exposition
                            .value(NODE_READY)
                            .is_none_or(|value| value >= 1.0)
                            && exposition.value(APPLY_LAG).is_none_or(|lag| lag <= 0.0)
                    });
                if caught_up {
                    return (ready_at, Some(Instant::now()));
                }
            }
            tokio::time::sleep(POLL_EVERY).await;
        }
        (ready_at, None)
    };
    let ((start_command_s, error), (ready_at, caught_up_at)) = tokio::join!(start, watch);
    let since = |at: Instant| at.duration_since(started).as_secs_f64();
    CatchUp {
        ready_s: ready_at.map(since),
        caught_up_s: caught_up_at.map(since),
        start_command_s,
        error,
    }
}

/// What a failover measured.
#[derive(Debug, Clone)]
pub(super) struct Failover {
    /// The node killed.
    pub node: u64,
    /// Groups it led (by the client's routing table) when it was killed.
    pub led_groups: usize,
    /// Seconds from asking for the kill until every group served a probe (`None`: some group
    /// did not within the bound).
    pub all_served_s: Option<f64>,
    /// Groups that served, of all.
    pub groups_served: usize,
    /// Groups probed.
    pub groups: usize,
    /// The kill command's time, seconds.
    pub kill_s: f64,
    /// The restart that followed.
    pub restart: CatchUp,
}

impl Failover {
    /// As JSON.
    pub(super) fn figures(&self) -> Value {
        json!({
            "node": self.node,
            "led_groups": self.led_groups,
            "all_served_s": self.all_served_s,
            "groups_served": self.groups_served,
            "groups": self.groups,
            "kill_command_s": self.kill_s,
            "restart": self.restart.figures(),
        })
    }
}

/// Kills the node leading the most groups, measures until every group serves again, starts it
/// again and waits until it is caught up.
pub(super) async fn failover(
    client: &Client,
    control: &dyn NodeControl,
    nodes: &[ScaleNode],
    keys: &Arc<ProbeKeys>,
    bound: Duration,
) -> Result<Failover, ScenarioError> {
    let (victim, led_groups) = choose(client, nodes, Victim::MostLeaders).await;
    let node = nodes
        .iter()
        .find(|node| node.id == victim)
        .ok_or_else(|| ScenarioError::Config(format!("node {victim} is not in the node list")))?;
    let asked = Instant::now();
    control
        .kill(victim)
        .await
        .map_err(|error| ScenarioError::Config(format!("killing node {victim}: {error}")))?;
    let kill_s = asked.elapsed().as_secs_f64();
    let served = keys.serve_all(client, asked + bound).await;
    let groups_served = served.iter().filter(|at| at.is_some()).count();
    let all_served_s = if groups_served == served.len() {
        served
            .iter()
            .flatten()
            .max()
            .map(|at| at.duration_since(asked).as_secs_f64())
    } else {
        None
    };
    let restart = start_and_watch(control, node, bound).await;
    Ok(Failover {
        node: victim,
        led_groups,
        all_served_s,
        groups_served,
        groups: served.len(),
        kill_s,
        restart,
    })
}

/// What a restart measured.
#[derive(Debug, Clone)]
pub(super) struct Restart {
    /// The node restarted.
    pub node: u64,
    /// Groups it led when it was killed.
    pub led_groups: usize,
    /// Its start.
    pub catch_up: CatchUp,
}

impl Restart {
    /// As JSON.
    pub(super) fn figures(&self) -> Value {
        json!({
            "node": self.node,
            "led_groups": self.led_groups,
            "catch_up": self.catch_up.figures(),
        })
    }
}

/// Kills the node leading the fewest groups, starts it again after `down_for` and measures
/// until it is ready and caught up.
pub(super) async fn restart(
    client: &Client,
    control: &dyn NodeControl,
    nodes: &[ScaleNode],
    down_for: Duration,
    bound: Duration,
) -> Result<Restart, ScenarioError> {
    let (victim, led_groups) = choose(client, nodes, Victim::FewestLeaders).await;
    let node = nodes
        .iter()
        .find(|node| node.id == victim)
        .ok_or_else(|| ScenarioError::Config(format!("node {victim} is not in the node list")))?;
    control
        .kill(victim)
        .await
        .map_err(|error| ScenarioError::Config(format!("killing node {victim}: {error}")))?;
    tokio::time::sleep(down_for).await;
    let catch_up = start_and_watch(control, node, bound).await;
    Ok(Restart {
        node: victim,
        led_groups,
        catch_up,
    })
}
