//! The leadership hand-off of a graceful shutdown: the node asks a connected, caught-up replica
//! to take over each group it leads, and stops trying when none is left, nothing moved for 3 s or
//! 10 s passed (the groups then re-elect).
//!
//! A target whose log is behind the leader's last entry when the request reaches it ignores the
//! request (openraft's rule), and the leader stops proposing once asked; so the node asks only a
//! replica that has matched the leader's last entry (waiting up to [`BEHIND_WAIT_MAX`] for one),
//! and asks again after [`REASK_AFTER`] when the group has not moved.
//!
//! Must not depend on: the request path.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{info, warn};

use crate::group::GroupHandle;
use crate::metrics as m;
use crate::shared::NodeShared;

/// How long a group that was asked to move may stay led here before it is asked again.
const REASK_AFTER: Duration = Duration::from_millis(700);
/// How long the node waits for a target to match its last entry before asking it anyway.
const BEHIND_WAIT_MAX: Duration = Duration::from_millis(300);

/// Hands leadership of every group this node leads to another replica, within the bounds above.
pub(crate) async fn hand_off_leadership(shared: &Arc<NodeShared>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut asked: HashMap<u32, Instant> = HashMap::new();
    let mut behind_since: HashMap<u32, Instant> = HashMap::new();
    let mut fewest_led = usize::MAX;
    let mut last_progress = Instant::now();
    loop {
        let led: Vec<Arc<GroupHandle>> = shared
            .hosted()
            .into_iter()
            .filter(|handle| handle.leader_view().leader == Some(shared.config.node_id))
            .collect();
        if led.is_empty() {
            info!(node = shared.config.node_id, "handed off every group");
            break;
        }
        if led.len() < fewest_led {
            fewest_led = led.len();
            last_progress = Instant::now();
        }
        // Stop trying when nothing moved for a while (e.g. the peers are shutting down too
        // and hand the groups back) or the overall bound passed; the groups re-elect.
        if Instant::now() >= deadline || last_progress.elapsed() > Duration::from_secs(3) {
            warn!(
                node = shared.config.node_id,
                groups = led.len(),
                "still leading some groups; stopping anyway (they re-elect)"
            );
            break;
        }
        let mut any_target = false;
        for handle in led {
            let group = handle.group_id();
            let Some((target, caught_up)) = handoff_target(shared, &handle) else {
                continue;
            };
            any_target = true;
            if !caught_up
                && behind_since
                    .entry(group)
                    .or_insert_with(Instant::now)
                    .elapsed()
                    < BEHIND_WAIT_MAX
            {
                // Asked now, it would ignore the request; the next poll looks again. Under a
                // steady stream of writes it may never match at a poll: then it is asked anyway
                // (the leader stops proposing, and the next ask finds it caught up).
                continue;
            }
            if asked
                .get(&group)
                .is_some_and(|at| at.elapsed() < REASK_AFTER)
            {
                continue;
            }
            asked.insert(group, Instant::now());
            ::metrics::counter!(m::LEADER_TRANSFERS_TOTAL).increment(1);
            handle.transfer_leadership(target).await;
        }
        if !any_target {
            warn!(
                node = shared.config.node_id,
                "no connected replica to hand leadership to; stopping"
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A replica to hand `handle`'s leadership to: a voter (never a learner), connected, most caught
/// up; with whether it has matched the leader's last entry.
fn handoff_target(shared: &NodeShared, handle: &GroupHandle) -> Option<(u64, bool)> {
    let (last_index, progress) = handle.follower_progress()?;
    let voters = handle.members().voters;
    progress
        .into_iter()
        .filter(|(node, _)| {
            *node != shared.config.node_id
                && voters.contains(node)
                && shared.transport.is_connected(*node)
        })
        .max_by_key(|(_, matched)| *matched)
        .map(|(node, matched)| (node, matched >= last_index))
}
