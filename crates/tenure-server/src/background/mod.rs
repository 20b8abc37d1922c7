//! The node's background tasks, one module each: expiry (leaders propose Expire commands),
//! leader balancing, the leader-table exchange, the metrics gauges, the replica collector
//! (replicas of groups that no longer list this node), the leadership hand-off of a graceful
//! shutdown, following the cluster's node table (`cluster_sync`) and the placement controller
//! (`placement`). Each is a small loop over [`NodeShared`](crate::shared::NodeShared).
//!
//! Must not depend on: the request path (`request`) or the node's start-up (`node`).

pub(crate) mod balancer;
pub(crate) mod cluster_sync;
pub(crate) mod expiry;
pub(crate) mod gauges;
pub(crate) mod handoff;
pub(crate) mod leader_exchange;
pub(crate) mod placement;
pub(crate) mod replica_gc;

/// A loop's rounds: one every `interval` (a late round delays the next ones, never bunches them),
/// until the node begins shutting down.
pub(crate) struct Rounds {
    ticker: tokio::time::Interval,
}

impl Rounds {
    pub(crate) fn every(interval: std::time::Duration) -> Self {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Rounds { ticker }
    }

    /// Waits for the next round; `false` once the node is shutting down.
    pub(crate) async fn next(&mut self, shared: &crate::shared::NodeShared) -> bool {
        self.ticker.tick().await;
        !shared
            .shutting_down
            .load(std::sync::atomic::Ordering::SeqCst)
    }
}
