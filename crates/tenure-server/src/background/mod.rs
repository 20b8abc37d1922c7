//! The node's background tasks, one module each: expiry (leaders propose Expire commands),
//! leader balancing, the leader-table exchange, the metrics gauges, the replica collector
//! (replicas of groups that no longer list this node), and the leadership hand-off of a
//! graceful shutdown. Each is a small loop over [`NodeShared`](crate::shared::NodeShared).
//!
//! Must not depend on: the request path (`request`) or the node's start-up (`node`).

pub(crate) mod balancer;
pub(crate) mod expiry;
pub(crate) mod gauges;
pub(crate) mod handoff;
pub(crate) mod leader_exchange;
pub(crate) mod replica_gc;
