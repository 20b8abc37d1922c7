//! The expiry driver: every `timing.expire_interval_ms`, each group this node leads proposes an
//! Expire command when a lease is due (at most `expire_commands_per_s_max` per group, up to
//! `expire_batch_max` leases each, in expiry order), paced by [`ExpiryPace`]: while the group's
//! reclaim is on time it reclaims at most `expire_paced_leases_per_s` a second, so a mass expiry (a
//! million leases ending in the same second) is spread over seconds instead of taking every
//! core from client commands; once its oldest due lease is `expire_overdue_target_ms` late, or
//! while an AcquireWait is queued in it, it reclaims at the full rate.
//!
//! Must not depend on: the request path.

use std::sync::Arc;
use std::time::Duration;

use crate::expiry_pace::ExpiryPace;
use crate::shared::NodeShared;

/// Runs the expiry driver until the node stops.
pub(crate) async fn run_expiry(shared: Arc<NodeShared>) {
    let interval = Duration::from_millis(shared.config.timing.expire_interval_ms.max(1));
    let pace = ExpiryPace::from_timing(&shared.config.timing);
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        for handle in shared.hosted() {
            handle.maybe_expire(pace);
        }
    }
}
