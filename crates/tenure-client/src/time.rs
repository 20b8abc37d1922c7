//! The client's clock: the runtime's monotonic clock.
//!
//! tokio's clock is the system's monotonic clock unless a runtime pauses it (tokio's test
//! utilities, or a deterministic simulation, which advances it by itself). Reading time through
//! it, instead of `std::time::Instant::now()`, keeps the client's deadlines, backoffs and safe
//! windows on the same clock as its timers. Values stay `std::time::Instant`s, so the public
//! types (`Grant::safe_deadline`, `Lease::safe_deadline`) are unchanged; outside a runtime this
//! is exactly `Instant::now()`.
//!
//! Must not depend on: anything but tokio's clock.

use std::time::{Duration, Instant};

/// Now.
pub(crate) fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// How long ago `since` was (zero if in the future).
pub(crate) fn elapsed(since: Instant) -> Duration {
    now().saturating_duration_since(since)
}
