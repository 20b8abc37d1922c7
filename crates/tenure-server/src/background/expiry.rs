//! The expiry driver: every `timing.expire_interval_ms`, each group this node leads proposes an
//! Expire command when a lease is due (at most `expire_commands_per_s_max` per group, up to
//! `expire_batch_max` leases each, in expiry order).
//!
//! Must not depend on: the request path.

use std::sync::Arc;
use std::time::Duration;

use crate::shared::NodeShared;

/// Runs the expiry driver until the node stops.
pub(crate) async fn run_expiry(shared: Arc<NodeShared>) {
    let interval = Duration::from_millis(shared.config.timing.expire_interval_ms.max(1));
    let min_gap_ms = 1_000 / u64::from(shared.config.timing.expire_commands_per_s_max.max(1));
    let leases_max = shared.config.timing.expire_batch_max;
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        for handle in shared.hosted() {
            handle.maybe_expire(leases_max, min_gap_ms);
        }
    }
}
