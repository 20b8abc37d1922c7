//! Fault injection while the node runs, for the fault-injection suite (`[testing] fault_control`).
//!
//! Three knobs, each reversible:
//! - the rate of the node's monotonic clock (log time on the groups it leads), changed without a
//!   jump ([`SystemClock::set_rate_ppm`]);
//! - a delay added to every WAL sync (a slow disk; `tenure-storage`'s injected sync delay);
//! - the peers this node's traffic to is dropped: Raft messages through the transport's fault
//!   layer and forwarded client requests. A partition is this set on both sides of the cut. It is
//!   the suite's fallback when it cannot cut links with network namespaces and iptables.
//!
//! The HTTP gateway maps `GET`/`POST /testing/faults` onto [`FaultControls`]; nothing else
//! reaches it. A node started without `fault_control` has none, and the route answers 404.
//!
//! Must not depend on: the groups or the HTTP framework.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tenure_transport::{FaultInjector, LinkFaults};

use crate::clock::SystemClock;
use crate::config::CLOCK_RATE_PPM_BOUND;

/// Longest WAL sync delay that may be injected, in milliseconds.
pub const WAL_SYNC_DELAY_MS_MAX: u64 = 10_000;

/// A change of faults: each field left out keeps its current value.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultSettings {
    /// The monotonic clock's rate error, in parts per million (5000 = 0.5% fast).
    pub clock_rate_ppm: Option<i64>,
    /// Milliseconds added to every WAL sync.
    pub wal_sync_delay_ms: Option<u64>,
    /// Every peer whose traffic from this node is dropped (replaces the current set; empty heals).
    pub drop_to_peers: Option<Vec<u64>>,
}

/// The faults in effect.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultState {
    /// This node.
    pub node_id: u64,
    /// The monotonic clock's rate error, in parts per million.
    pub clock_rate_ppm: i64,
    /// Milliseconds added to every WAL sync.
    pub wal_sync_delay_ms: u64,
    /// Peers whose traffic from this node is dropped.
    pub drop_to_peers: Vec<u64>,
}

/// The node's fault knobs (see the module docs).
#[derive(Debug)]
pub struct FaultControls {
    node_id: u64,
    members: BTreeSet<u64>,
    clock: Arc<SystemClock>,
    wal_sync_delay_us: Arc<AtomicU64>,
    links: Arc<FaultInjector>,
    dropped: Mutex<BTreeSet<u64>>,
}

impl FaultControls {
    /// Knobs over the node's clock, its storage's sync delay and its transport's fault layer.
    pub fn new(
        node_id: u64,
        members: impl IntoIterator<Item = u64>,
        clock: Arc<SystemClock>,
        wal_sync_delay_us: Arc<AtomicU64>,
        links: Arc<FaultInjector>,
    ) -> Self {
        FaultControls {
            node_id,
            members: members.into_iter().collect(),
            clock,
            wal_sync_delay_us,
            links,
            dropped: Mutex::new(BTreeSet::new()),
        }
    }

    /// Applies a change after checking all of it (nothing changes when any field is invalid).
    pub fn apply(&self, settings: &FaultSettings) -> Result<FaultState, String> {
        if let Some(rate) = settings.clock_rate_ppm {
            if rate.abs() > CLOCK_RATE_PPM_BOUND {
                return Err(format!(
                    "clock_rate_ppm must be within -{CLOCK_RATE_PPM_BOUND}..={CLOCK_RATE_PPM_BOUND}, got {rate}"
                ));
            }
        }
        if let Some(delay) = settings.wal_sync_delay_ms {
            if delay > WAL_SYNC_DELAY_MS_MAX {
                return Err(format!(
                    "wal_sync_delay_ms must be at most {WAL_SYNC_DELAY_MS_MAX}, got {delay}"
                ));
            }
        }
        if let Some(peers) = &settings.drop_to_peers {
            if let Some(bad) = peers
                .iter()
                .find(|&&peer| peer == self.node_id || !self.members.contains(&peer))
            {
                return Err(format!(
                    "drop_to_peers: {bad} is not another member of the cluster"
                ));
            }
        }
        if let Some(rate) = settings.clock_rate_ppm {
            self.clock.set_rate_ppm(rate);
        }
        if let Some(delay) = settings.wal_sync_delay_ms {
            self.wal_sync_delay_us
                .store(delay.saturating_mul(1_000), Ordering::Relaxed);
        }
        if let Some(peers) = &settings.drop_to_peers {
            let mut dropped = self.lock_dropped();
            *dropped = peers.iter().copied().collect();
            for &peer in &self.members {
                let faults = LinkFaults {
                    partitioned: dropped.contains(&peer),
                    ..self.links.link(self.node_id, peer)
                };
                self.links.set(self.node_id, peer, faults);
            }
        }
        Ok(self.state())
    }

    /// The faults in effect.
    pub fn state(&self) -> FaultState {
        FaultState {
            node_id: self.node_id,
            clock_rate_ppm: self.clock.rate_ppm(),
            wal_sync_delay_ms: self.wal_sync_delay_us.load(Ordering::Relaxed) / 1_000,
            drop_to_peers: self.lock_dropped().iter().copied().collect(),
        }
    }

    /// Whether traffic to `peer` is dropped (forwarding checks this before it dials).
    pub fn drops_to(&self, peer: u64) -> bool {
        self.lock_dropped().contains(&peer)
    }

    fn lock_dropped(&self) -> std::sync::MutexGuard<'_, BTreeSet<u64>> {
        self.dropped
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn controls() -> (FaultControls, Arc<FaultInjector>) {
        let links = Arc::new(FaultInjector::new(7));
        let controls = FaultControls::new(
            1,
            [1, 2, 3],
            Arc::new(SystemClock::new()),
            Arc::new(AtomicU64::new(0)),
            links.clone(),
        );
        (controls, links)
    }

    #[test]
    fn settings_change_only_what_they_name_and_heal() {
        let (controls, links) = controls();
        let state = controls
            .apply(&FaultSettings {
                clock_rate_ppm: Some(5_000),
                wal_sync_delay_ms: Some(40),
                drop_to_peers: Some(vec![3]),
            })
            .unwrap();
        assert_eq!(state.clock_rate_ppm, 5_000);
        assert_eq!(state.wal_sync_delay_ms, 40);
        assert_eq!(state.drop_to_peers, vec![3]);
        assert!(links.link(1, 3).partitioned && !links.link(1, 2).partitioned);
        assert!(controls.drops_to(3) && !controls.drops_to(2));

        let state = controls
            .apply(&FaultSettings {
                drop_to_peers: Some(Vec::new()),
                ..FaultSettings::default()
            })
            .unwrap();
        assert_eq!(state.clock_rate_ppm, 5_000, "left out: unchanged");
        assert!(state.drop_to_peers.is_empty());
        assert!(!links.link(1, 3).partitioned);
    }

    #[test]
    fn invalid_settings_change_nothing() {
        let (controls, _) = controls();
        for bad in [
            FaultSettings {
                clock_rate_ppm: Some(CLOCK_RATE_PPM_BOUND + 1),
                wal_sync_delay_ms: Some(5),
                ..FaultSettings::default()
            },
            FaultSettings {
                wal_sync_delay_ms: Some(WAL_SYNC_DELAY_MS_MAX + 1),
                ..FaultSettings::default()
            },
            FaultSettings {
                drop_to_peers: Some(vec![1]),
                wal_sync_delay_ms: Some(5),
                ..FaultSettings::default()
            },
            FaultSettings {
                drop_to_peers: Some(vec![9]),
                ..FaultSettings::default()
            },
        ] {
            assert!(controls.apply(&bad).is_err(), "{bad:?}");
        }
        assert_eq!(controls.state().wal_sync_delay_ms, 0);
        assert_eq!(controls.state().clock_rate_ppm, 0);
    }
}
