//! Negative controls: deliberately broken guarantees, so the checkers that watch tenure (the
//! fault-injection suite, the simulation) can be seen failing. A checker never seen failing
//! proves nothing.
//!
//! A control takes effect only in builds with the test-only cargo feature `negative-controls`
//! ([`NegativeControl::AVAILABLE`]); in every other build each one is inert, and the server
//! refuses a configuration that names one. Selected per process and identical on every replica,
//! so apply stays deterministic.
//!
//! Must not depend on: anything (plain values).

use serde::{Deserialize, Serialize};

/// One deliberately broken guarantee (or none).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NegativeControl {
    /// Every guarantee holds (the only choice outside test builds).
    #[default]
    None,
    /// Acquire grants even while the resource's lease is active (breaks single holder).
    SkipExpiryCheck,
    /// Request ids are neither looked up nor recorded (breaks exactly-once).
    DisableDeduplication,
    /// The grant counter restarts at 1 whenever an entry of a new leader term is applied
    /// (breaks fencing order; a re-grant of an existing record trips the token assertion).
    ResetTokensOnNewLeader,
    /// Leaders measure the time since they took over with the wall clock instead of the
    /// monotonic one (a jump of the wall clock moves log time: early expiry).
    ExpireByWallClock,
    /// A founding node neither reads the other founders' pins nor refuses itself for them
    /// (`tenure-server`'s founder pins): a founder wiped in the cluster's first seconds is
    /// admitted under its old id (breaks the replica gate: amnesia).
    IgnoreFounderPins,
    /// SessionClose answers that the session's record ended but leaves it (and every lease
    /// bound to it) active until it expires: the leases outlive their session's close.
    SessionLeasesOutliveClose,
    /// A hand-off grants the resource to the newest waiter instead of the oldest (breaks FIFO
    /// order among live waiters).
    WaitQueueLifo,
    /// A hand-off ignores the end of a waiter's wait and grants it anyway, and a waiter whose
    /// wait passed is dropped only 5 s later (breaks "no grant to a dead waiter").
    HandOffToDeadWaiters,
    /// A node's watch hub leaves every seventh event out of what it retains and serves (breaks
    /// gap-free watch streams).
    WatchDropsEvents,
}

impl NegativeControl {
    /// True in builds with the `negative-controls` feature, where controls take effect.
    pub const AVAILABLE: bool = cfg!(feature = "negative-controls");

    /// Every control, [`NegativeControl::None`] first.
    pub const ALL: [NegativeControl; 10] = [
        NegativeControl::None,
        NegativeControl::SkipExpiryCheck,
        NegativeControl::DisableDeduplication,
        NegativeControl::ResetTokensOnNewLeader,
        NegativeControl::ExpireByWallClock,
        NegativeControl::IgnoreFounderPins,
        NegativeControl::SessionLeasesOutliveClose,
        NegativeControl::WaitQueueLifo,
        NegativeControl::HandOffToDeadWaiters,
        NegativeControl::WatchDropsEvents,
    ];

    /// Its name in configurations and reports (`skip-expiry-check`, ...).
    pub fn name(self) -> &'static str {
        match self {
            NegativeControl::None => "none",
            NegativeControl::SkipExpiryCheck => "skip-expiry-check",
            NegativeControl::DisableDeduplication => "disable-deduplication",
            NegativeControl::ResetTokensOnNewLeader => "reset-tokens-on-new-leader",
            NegativeControl::ExpireByWallClock => "expire-by-wall-clock",
            NegativeControl::IgnoreFounderPins => "ignore-founder-pins",
            NegativeControl::SessionLeasesOutliveClose => "session-leases-outlive-close",
            NegativeControl::WaitQueueLifo => "wait-queue-lifo",
            NegativeControl::HandOffToDeadWaiters => "hand-off-to-dead-waiters",
            NegativeControl::WatchDropsEvents => "watch-drops-events",
        }
    }

    /// The control named `name`.
    pub fn parse(name: &str) -> Option<NegativeControl> {
        NegativeControl::ALL.into_iter().find(|c| c.name() == name)
    }

    /// True when this control is selected and this build lets it take effect.
    pub fn breaks(self, control: NegativeControl) -> bool {
        Self::AVAILABLE && control != NegativeControl::None && self == control
    }
}
