//! The leader balancer: hands each group this node leads to its preferred leader once that node
//! has been connected for two rounds and is caught up, so each node leads about groups/nodes of
//! them after start and after a node returns. The preferred leader is the placement
//! controller's choice in the node table (`leader_preferences`), else the configured layout's
//! first replica; only an active node that holds a voting replica is handed leadership.
//!
//! Must not depend on: the request path.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tracing::info;

use crate::metrics as m;
use crate::placement::replicas_of;
use crate::shared::NodeShared;

/// Runs the leader balancer until the node stops (never, when `rebalance_interval_ms` is 0).
pub(crate) async fn run_balancer(shared: Arc<NodeShared>) {
    let interval_ms = shared.config.timing.rebalance_interval_ms;
    if interval_ms == 0 {
        return;
    }
    let node_id = shared.config.node_id;
    // A node must have been connected for two whole rounds before groups move to it, so a node
    // that is shutting down (or flapping) is not handed leadership back.
    let mut connected_rounds: HashMap<u64, u32> = HashMap::new();
    let mut rounds = super::Rounds::every(Duration::from_millis(interval_ms));
    while rounds.next(&shared).await {
        let view = shared.cluster_view();
        for peer in shared.member_nodes() {
            if peer == node_id {
                continue;
            }
            let rounds = connected_rounds.entry(peer).or_insert(0);
            *rounds = if shared.transport.is_connected(peer) {
                rounds.saturating_add(1)
            } else {
                0
            };
        }
        let mut moved = 0;
        for handle in shared.hosted() {
            if moved >= 16 || !handle.is_ready_leader() {
                continue;
            }
            let group = handle.group_id();
            let preferred = match view.leader_preferences.get(&group) {
                Some(&node) => node,
                None => {
                    let replicas =
                        replicas_of(group, &shared.node_ids, shared.config.replication_factor);
                    let Some(&first) = replicas.first() else {
                        continue;
                    };
                    first
                }
            };
            if !shared.hosts_replicas(preferred) {
                continue;
            }
            if preferred == node_id || connected_rounds.get(&preferred).copied().unwrap_or(0) < 2 {
                continue;
            }
            // A replica moved away from its configured node leaves no preference behind.
            if !handle.members().voters.contains(&preferred) {
                continue;
            }
            let Some((last, progress)) = handle.follower_progress() else {
                continue;
            };
            let caught_up = progress
                .iter()
                .any(|(node, matched)| *node == preferred && *matched >= last);
            if caught_up {
                info!(
                    group = handle.group_id(),
                    to = preferred,
                    "moving leadership to the preferred node"
                );
                ::metrics::counter!(m::LEADER_TRANSFERS_TOTAL).increment(1);
                handle.transfer_leadership(preferred).await;
                moved += 1;
            }
        }
    }
}
