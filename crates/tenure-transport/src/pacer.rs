//! A byte-rate pacer for the snapshots this node sends: every transfer reserves its chunks'
//! time slots on one shared schedule, so all of them together send at most `bytes_per_s` (a
//! replica move's snapshot cannot take the link and the disk from foreground traffic). Slots
//! are handed out in the order transfers ask for them, so concurrent transfers share the rate.
//! A schedule that fell behind may catch up by [`BURST`] (timer ticks are a millisecond, a
//! chunk at 64 MiB/s is about one), never more: an idle pacer saves no credit beyond it.
//!
//! It also says how long a transfer may take ([`Pacer::transfer_time`]): a paced snapshot takes
//! its size over the rate, shared with the other transfers under way.
//!
//! Must not depend on: the wall clock (tokio's monotonic clock only, which a simulation drives)
//! or the network.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// Paces the bytes of every snapshot transfer of one node.
#[derive(Debug)]
pub(crate) struct Pacer {
    /// 0: unlimited.
    bytes_per_s: u64,
    /// When the next reservation may start; `None` before the first.
    next_free: Mutex<Option<Instant>>,
    /// Transfers under way (each holds a [`TransferGuard`]).
    transfers: AtomicUsize,
}

/// How far behind the schedule may fall and still be caught up at once.
pub(crate) const BURST: Duration = Duration::from_millis(20);

/// One transfer under way, counted while it lives.
#[derive(Debug)]
pub(crate) struct TransferGuard<'a> {
    pacer: &'a Pacer,
}

impl Drop for TransferGuard<'_> {
    fn drop(&mut self) {
        self.pacer.transfers.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Pacer {
    /// A pacer for `bytes_per_s` (0: no limit).
    pub(crate) fn new(bytes_per_s: u64) -> Self {
        Pacer {
            bytes_per_s,
            next_free: Mutex::new(None),
            transfers: AtomicUsize::new(0),
        }
    }

    /// Counts a transfer until the guard drops.
    pub(crate) fn transfer(&self) -> TransferGuard<'_> {
        self.transfers.fetch_add(1, Ordering::Relaxed);
        TransferGuard { pacer: self }
    }

    /// How long sending `bytes` may take at the rate when it shares it with every transfer
    /// under way (this one included); zero without a limit.
    pub(crate) fn transfer_time(&self, bytes: u64) -> Duration {
        let sharing = self.transfers.load(Ordering::Relaxed).max(1);
        self.cost(usize::try_from(bytes).unwrap_or(usize::MAX))
            .saturating_mul(u32::try_from(sharing).unwrap_or(u32::MAX))
    }

    /// How long sending `bytes` takes at the rate.
    fn cost(&self, bytes: usize) -> Duration {
        if self.bytes_per_s == 0 {
            return Duration::ZERO;
        }
        let nanos = (bytes as u128).saturating_mul(1_000_000_000) / u128::from(self.bytes_per_s);
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    /// Reserves the slot for `bytes` and returns when it starts (at once while the schedule is
    /// less than [`BURST`] ahead of `now`, else when the transfers before it have had theirs).
    pub(crate) fn reserve(&self, bytes: usize, now: Instant) -> Instant {
        let cost = self.cost(bytes);
        if cost.is_zero() {
            return now;
        }
        let mut next_free = match self.next_free.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        let floor = now.checked_sub(BURST).unwrap_or(now);
        let start = match *next_free {
            Some(free) => free.max(floor),
            None => now,
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
        let now = Instant::now() + Duration::from_secs(1);
        assert_eq!(pacer.reserve(500_000, now), now);
        // The second half-megabyte starts half a second later, whoever asks for it.
        assert_eq!(
            pacer.reserve(500_000, now),
            now + Duration::from_millis(500)
        );
        assert_eq!(pacer.reserve(1, now), now + Duration::from_secs(1));
        // After an idle gap only BURST is caught up: 20 ms (20,000 bytes) of credit.
        let later = now + Duration::from_secs(10);
        assert_eq!(pacer.reserve(1_000_000, later), later - BURST);
        assert_eq!(
            pacer.reserve(1_000, later),
            later - BURST + Duration::from_secs(1)
        );
    }

    #[test]
    fn a_transfer_may_take_its_share_of_the_rate() {
        let pacer = Pacer::new(1_000_000);
        assert_eq!(pacer.transfer_time(3_000_000), Duration::from_secs(3));
        let first = pacer.transfer();
        let second = pacer.transfer();
        assert_eq!(pacer.transfer_time(3_000_000), Duration::from_secs(6));
        drop(first);
        drop(second);
        assert_eq!(pacer.transfer_time(3_000_000), Duration::from_secs(3));
        assert_eq!(Pacer::new(0).transfer_time(u64::MAX), Duration::ZERO);
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
