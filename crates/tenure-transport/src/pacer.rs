//! A byte-rate pacer for the snapshots this node sends: every transfer reserves its chunks'
//! time slots on one shared schedule, so all of them together send at most `bytes_per_s` (a
//! replica move's snapshot cannot take the link and the disk from foreground traffic). Slots
//! are handed out in the order transfers ask for them, so concurrent transfers share the rate.
//!
//! Must not depend on: the wall clock (tokio's monotonic clock only, which a simulation drives)
//! or the network.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Paces the bytes of every snapshot transfer of one node.
#[derive(Debug)]
pub(crate) struct Pacer {
    /// 0: unlimited.
    bytes_per_s: u64,
    /// When the next reservation may start; `None` before the first.
    next_free: Mutex<Option<Instant>>,
}

impl Pacer {
    /// A pacer for `bytes_per_s` (0: no limit).
    pub(crate) fn new(bytes_per_s: u64) -> Self {
        Pacer {
            bytes_per_s,
            next_free: Mutex::new(None),
        }
    }

    /// How long sending `bytes` takes at the rate.
    fn cost(&self, bytes: usize) -> Duration {
        if self.bytes_per_s == 0 {
            return Duration::ZERO;
        }
        let nanos = (bytes as u128).saturating_mul(1_000_000_000) / u128::from(self.bytes_per_s);
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    /// Reserves the slot for `bytes` and returns when it starts (now, or when the transfers
    /// before it have had theirs). An idle pacer starts at once: no credit is saved up.
    pub(crate) fn reserve(&self, bytes: usize, now: Instant) -> Instant {
        let cost = self.cost(bytes);
        if cost.is_zero() {
            return now;
        }
        let mut next_free = match self.next_free.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        let start = match *next_free {
            Some(free) if free > now => free,
            _ => now,
        };
        *next_free = Some(start + cost);
        start
    }

    /// Waits until `bytes` may be sent.
    pub(crate) async fn take(&self, bytes: usize) {
        let start = self.reserve(bytes, Instant::now());
        tokio::time::sleep_until(start).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_follow_one_another_at_the_rate() {
        let pacer = Pacer::new(1_000_000);
        let now = Instant::now();
        assert_eq!(pacer.reserve(500_000, now), now);
        // The second half-megabyte starts half a second later, whoever asks for it.
        assert_eq!(
            pacer.reserve(500_000, now),
            now + Duration::from_millis(500)
        );
        assert_eq!(pacer.reserve(1, now), now + Duration::from_secs(1));
        // After an idle gap nothing is saved up.
        let later = now + Duration::from_secs(10);
        assert_eq!(pacer.reserve(1_000_000, later), later);
        assert_eq!(pacer.reserve(1_000, later), later + Duration::from_secs(1));
    }

    #[test]
    fn no_rate_means_no_wait() {
        let pacer = Pacer::new(0);
        let now = Instant::now();
        for _ in 0..3 {
            assert_eq!(pacer.reserve(usize::MAX, now), now);
        }
    }
}
