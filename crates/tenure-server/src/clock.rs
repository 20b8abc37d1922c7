//! The node's monotonic clock, behind a trait so tests (and later the deterministic simulation)
//! can skew it: a rate error (e.g. 0.5% fast), an offset, and (fault injection) a rate that
//! changes while the node runs.
//!
//! Only leaders read it, to advance log time since they took over (contract section 4). Wall
//! clocks are never used for decisions.
//!
//! Must not depend on: the network, the groups. (It reads tokio's clock, which is the system's
//! monotonic clock unless a simulation pauses it.)

use std::sync::Mutex;

// The runtime's clock: the system's monotonic clock unless a runtime pauses it (a deterministic
// simulation, which then advances it; each simulated host has its own).
use tokio::time::Instant;

/// A monotonic millisecond clock.
pub trait MonotonicClock: Send + Sync + 'static {
    /// Milliseconds since an arbitrary fixed origin; never decreases.
    fn now_ms(&self) -> u64;
}

/// Largest magnitude of a rate error, in parts per million (the rate stays positive).
const RATE_PPM_BOUND: i64 = 999_999;

/// One straight piece of a skewed clock: from `origin` on, readings advance at `1 + rate_ppm /
/// 10^6` of real time, starting from `base_us`.
#[derive(Debug, Clone, Copy)]
struct Segment {
    origin: Instant,
    base_us: i128,
    rate_ppm: i64,
}

impl Segment {
    fn reading_us(&self, now: Instant) -> i128 {
        let elapsed_us =
            i128::try_from(now.saturating_duration_since(self.origin).as_micros()).unwrap_or(0);
        self.base_us + elapsed_us * (1_000_000 + i128::from(self.rate_ppm)) / 1_000_000
    }
}

/// The process's monotonic clock, optionally skewed (tests inject clock trouble through
/// `[testing]` in the configuration, and the fault-injection suite changes the rate of a running
/// node through [`SystemClock::set_rate_ppm`]).
#[derive(Debug)]
pub struct SystemClock {
    segment: Mutex<Segment>,
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
            segment: Mutex::new(Segment {
                origin: Instant::now(),
                base_us: 0,
                rate_ppm: rate_ppm.clamp(-RATE_PPM_BOUND, RATE_PPM_BOUND),
            }),
            offset_ms,
        }
    }

    /// Changes the rate error from now on. The reading at this instant is kept, so the clock
    /// neither jumps nor runs backwards: only its speed changes.
    pub fn set_rate_ppm(&self, rate_ppm: i64) {
        let mut segment = self.lock();
        let now = Instant::now();
        *segment = Segment {
            origin: now,
            base_us: segment.reading_us(now),
            rate_ppm: rate_ppm.clamp(-RATE_PPM_BOUND, RATE_PPM_BOUND),
        };
    }

    /// The current rate error, in parts per million.
    pub fn rate_ppm(&self) -> i64 {
        self.lock().rate_ppm
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Segment> {
        // The segment is plain data, always consistent: a panic elsewhere cannot corrupt it.
        self.segment
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The wall clock, posing as a monotonic one: only for the negative control
/// `expire-by-wall-clock` (tests prove a checker sees what such a design gets wrong). Its
/// readings jump with the system clock, backwards too.
#[derive(Debug, Default)]
pub struct WallClock;

impl MonotonicClock for WallClock {
    fn now_ms(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|since| u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0)
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl MonotonicClock for SystemClock {
    fn now_ms(&self) -> u64 {
        let reading_us = self.lock().reading_us(Instant::now());
        let ms = reading_us / 1_000 + i128::from(self.offset_ms);
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

    #[test]
    fn changing_the_rate_never_moves_the_clock_back() {
        let clock = SystemClock::skewed(900_000, 0);
        std::thread::sleep(std::time::Duration::from_millis(20));
        let before = clock.now_ms();
        clock.set_rate_ppm(-900_000);
        let after = clock.now_ms();
        assert!(after >= before, "{before} -> {after}");
        assert_eq!(clock.rate_ppm(), -900_000);
        let real = Instant::now();
        std::thread::sleep(std::time::Duration::from_millis(50));
        let later = clock.now_ms();
        let real_ms = u64::try_from(real.elapsed().as_millis()).unwrap_or(u64::MAX);
        // At 10% speed the clock advances a tenth of the real time (plus rounding).
        assert!(
            later >= after && later - after <= real_ms / 10 + 2,
            "{after} -> {later} in {real_ms} ms"
        );
    }
}
