//! The node's monotonic clock, behind a trait so tests (and later the deterministic simulation)
//! can skew it: a rate error (e.g. 0.5% fast) and an offset.
//!
//! Only leaders read it, to advance log time since they took over (contract section 4). Wall
//! clocks are never used for decisions.
//!
//! Must not depend on: tokio, the network, the groups.

use std::time::Instant;

/// A monotonic millisecond clock.
pub trait MonotonicClock: Send + Sync + 'static {
    /// Milliseconds since an arbitrary fixed origin; never decreases.
    fn now_ms(&self) -> u64;
}

/// The process's monotonic clock, optionally skewed (tests inject clock trouble through
/// `[testing]` in the configuration).
#[derive(Debug)]
pub struct SystemClock {
    origin: Instant,
    rate_ppm: i64,
    offset_ms: i64,
}

impl SystemClock {
    /// An accurate clock.
    pub fn new() -> Self {
        Self::skewed(0, 0)
    }

    /// A clock running `rate_ppm` parts per million fast (negative: slow), shifted by
    /// `offset_ms`. Readings are clamped at zero and stay monotonic.
    pub fn skewed(rate_ppm: i64, offset_ms: i64) -> Self {
        SystemClock {
            origin: Instant::now(),
            rate_ppm: rate_ppm.clamp(-999_999, 1_000_000),
            offset_ms,
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl MonotonicClock for SystemClock {
    fn now_ms(&self) -> u64 {
        let elapsed_us = i128::try_from(self.origin.elapsed().as_micros()).unwrap_or(i128::MAX);
        let scaled_us =
            elapsed_us.saturating_mul(1_000_000 + i128::from(self.rate_ppm)) / 1_000_000;
        let ms = scaled_us / 1_000 + i128::from(self.offset_ms);
        u64::try_from(ms.max(0)).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_clock_runs_ahead_and_stays_monotonic() {
        let fast = SystemClock::skewed(500_000, 0);
        let first = fast.now_ms();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let second = fast.now_ms();
        assert!(second >= first + 25, "{first} -> {second}");
    }
}
