//! The leader balancer: hands each group this node leads to its preferred leader once that node
//! has been connected for two rounds and is caught up, so each node leads about groups/nodes of
//! them after start and after a node returns.
//!
//! Must not depend on: the request path.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
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
    let mut ticker = tokio::time::interval(Duration::from_millis(interval_ms));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        if shared.shutting_down.load(Ordering::SeqCst) {
            return;
        }
        for &peer in &shared.node_ids {
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
            let replicas = replicas_of(
                handle.group_id(),
                &shared.node_ids,
                shared.config.replication_factor,
            );
            let Some(&preferred) = replicas.first() else {
                continue;
            };
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
