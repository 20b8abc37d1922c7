//! The node-wide heartbeat driver.
//!
//! openraft's per-group heartbeat timers are switched off (see `GroupTiming`); this one task asks
//! every local group to heartbeat at the same instant, once per interval. Leaders then queue their
//! heartbeats for each follower within microseconds of each other, so a lane writer sends all the
//! heartbeats due to one peer in one frame and the peer's answers return the same way. openraft
//! still skips a heartbeat to a follower that acknowledged an append within
//! `heartbeat_min_interval_ms` (suppression under load); followers ignore the trigger.
//!
//! Must not depend on: the wall clock (tokio's interval is monotonic).

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;

use crate::registry::GroupRegistry;

/// Starts the driver; abort the handle to stop it.
pub fn spawn_heartbeat_driver(
    registry: Arc<dyn GroupRegistry>,
    heartbeat_interval: Duration,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(heartbeat_interval.max(Duration::from_millis(1)));
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            for raft in registry.groups() {
                // Only fails when the group has stopped; the registry owner deals with that.
                let _ = raft.trigger().heartbeat().await;
            }
        }
    })
}
