//! The replica collector: drops replicas of groups that no longer count this node among their
//! members, for when the move that removed it could not tell it (the node was down, or its data
//! was lost and it came back with the configured layout).
//!
//! Every [`ROUND`], for each replica this node hosts that does not lead its group, it asks one
//! other node (in turn) for the group's members without forwarding; an answer counts only when it
//! comes from the group's ready leader itself, with its membership committed. When that
//! membership lists this node neither as voter nor as learner, and is not older than this
//! replica's own, the replica is dropped (`drop_left_replica`: stopped, data kept). Empty
//! replicas (no membership yet) are left alone: one may be a learner being added.
//!
//! Must not depend on: the request path.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tenure_proto::client::{RequestBody, ResponseBody};
use tracing::info;

use crate::shared::NodeShared;

/// How often hosted replicas are checked.
pub const ROUND: Duration = Duration::from_secs(10);
/// How long one question may take.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);

/// Runs the collector until the node stops.
pub(crate) async fn run_replica_gc(shared: Arc<NodeShared>) {
    let me = shared.config.node_id;
    let mut turn: BTreeMap<u32, usize> = BTreeMap::new();
    let mut ticker = tokio::time::interval(ROUND);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        // The members now (the node table changes at run time).
        let others = shared.other_nodes();
        if others.is_empty() {
            continue;
        }
        for handle in shared.hosted() {
            // A leader is a member; an empty replica (never contacted: a learner being added
            // right now, or a layout replica of a node that lost its data) costs nothing and
            // could be the start of a move.
            if handle.is_ready_leader() || handle.members().voters.is_empty() {
                continue;
            }
            let group = handle.group_id();
            let next = turn.entry(group).or_insert(0);
            let peer = others[*next % others.len()];
            *next = next.wrapping_add(1);
            let answer = shared
                .ask_node(
                    peer,
                    RequestBody::GroupMembers { group_id: group },
                    ASK_TIMEOUT,
                )
                .await;
            let Ok(ResponseBody::Members(members)) = answer else {
                continue;
            };
            let from_leader = members.leader == Some(members.seen_by) && members.seen_by == peer;
            if !from_leader
                || !members.membership_committed
                || members.voters.contains(&me)
                || members.learners.contains(&me)
            {
                continue;
            }
            let mine = handle.members();
            if members.term < mine.term || members.membership_log_index < mine.membership_log_index
            {
                continue;
            }
            info!(
                group,
                leader = peer,
                term = members.term,
                "the group's leader no longer lists this node: dropping the replica"
            );
            let _ = shared
                .drop_left_replica(group, members.membership_log_index)
                .await;
        }
    }
}
