//! Fault injection on directed links, controllable from tests.
//!
//! One [`FaultInjector`] can be shared by every node of an in-process cluster. Each node consults
//! it for every message (and snapshot transfer) it sends to a peer: the verdict for the directed
//! link `from -> to` drops, delays (fixed plus random jitter, which reorders), or duplicates the
//! message. A partition drops everything on the link. Randomness is seeded, so a test prints its
//! seed and a failing schedule of verdicts can be replayed (given the same order of sends).
//! The transport applies delays and duplicates to unary (control-lane) messages only: messages
//! of a replication stream are delivered in order and once, as their QUIC stream would, or
//! dropped.
//!
//! Must not depend on quinn or openraft: it judges messages, the transport applies the verdicts.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Faults on one directed link.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LinkFaults {
    /// Drop everything (one direction of a partition).
    pub partitioned: bool,
    /// Probability of dropping a message, 0.0..=1.0.
    pub drop_probability: f64,
    /// Probability of sending a message twice.
    pub duplicate_probability: f64,
    /// Fixed delay added to every message, in milliseconds.
    pub delay_ms: u64,
    /// Extra random delay 0..=jitter per message, in milliseconds; messages overtake each other.
    pub reorder_jitter_ms: u64,
}

/// What to do with one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Send it now, once.
    Deliver,
    /// Drop it.
    Drop,
    /// Send `copies` copies after `delay`.
    Perturb {
        /// 1 or 2.
        copies: u8,
        /// Delay before sending.
        delay: Duration,
    },
}

/// Shared, seeded fault plan for directed links.
#[derive(Debug)]
pub struct FaultInjector {
    links: Mutex<HashMap<(u64, u64), LinkFaults>>,
    active: AtomicBool,
    rng: Mutex<SmallRng>,
    seed: u64,
}

impl FaultInjector {
    /// An injector with no faults, its randomness seeded by `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            links: Mutex::new(HashMap::new()),
            active: AtomicBool::new(false),
            rng: Mutex::new(SmallRng::seed_from_u64(seed)),
            seed,
        }
    }

    /// The seed (print it in a failing test).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Sets the faults of the directed link `from -> to`.
    pub fn set(&self, from: u64, to: u64, faults: LinkFaults) {
        let mut links = self.lock_links();
        if faults == LinkFaults::default() {
            links.remove(&(from, to));
        } else {
            links.insert((from, to), faults);
        }
        self.active.store(!links.is_empty(), Ordering::Release);
    }

    /// Cuts every link between the two sides, both directions.
    pub fn partition(&self, side_a: &[u64], side_b: &[u64]) {
        for &a in side_a {
            for &b in side_b {
                for (from, to) in [(a, b), (b, a)] {
                    let mut faults = self.link(from, to);
                    faults.partitioned = true;
                    self.set(from, to, faults);
                }
            }
        }
    }

    /// Removes every fault on every link.
    pub fn heal(&self) {
        self.lock_links().clear();
        self.active.store(false, Ordering::Release);
    }

    /// The faults currently set on `from -> to`.
    pub fn link(&self, from: u64, to: u64) -> LinkFaults {
        self.lock_links()
            .get(&(from, to))
            .copied()
            .unwrap_or_default()
    }

    /// The verdict for one message on `from -> to`.
    pub fn judge(&self, from: u64, to: u64) -> Verdict {
        if !self.active.load(Ordering::Acquire) {
            return Verdict::Deliver;
        }
        let faults = self.link(from, to);
        if faults.partitioned {
            return Verdict::Drop;
        }
        if faults == LinkFaults::default() {
            return Verdict::Deliver;
        }
        let mut rng = match self.rng.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        if faults.drop_probability > 0.0 && rng.random_bool(faults.drop_probability.min(1.0)) {
            return Verdict::Drop;
        }
        let copies = if faults.duplicate_probability > 0.0
            && rng.random_bool(faults.duplicate_probability.min(1.0))
        {
            2
        } else {
            1
        };
        let jitter_ms = if faults.reorder_jitter_ms > 0 {
            rng.random_range(0..=faults.reorder_jitter_ms)
        } else {
            0
        };
        let delay = Duration::from_millis(faults.delay_ms.saturating_add(jitter_ms));
        if copies == 1 && delay.is_zero() {
            Verdict::Deliver
        } else {
            Verdict::Perturb { copies, delay }
        }
    }

    fn lock_links(&self) -> std::sync::MutexGuard<'_, HashMap<(u64, u64), LinkFaults>> {
        match self.links.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }
}
