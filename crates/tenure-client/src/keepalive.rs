//! The queue between sessions' keep-alive loops and a group's keep-alive batcher: what one
//! queued keep-alive carries, and when it is sent (aligned to a grid shared by the client's
//! sessions, so those of one group fall due together and share requests). The batcher itself
//! lives in `session`; the client holds one queue per (group, tenant).
//!
//! Must not depend on: `client` or `session` (both use these types; plain values and a
//! channel only).

use std::time::{Duration, Instant};

use tenure_core::LeaseOp;
use tenure_proto::client::LeaseResult;
use tokio::sync::{mpsc, oneshot};

use crate::error::ClientError;

/// One keep-alive waiting for its group's next Batch.
#[derive(Debug)]
pub(crate) struct KeepAliveItem {
    /// The `SessionKeepAlive` operation.
    pub(crate) op: LeaseOp,
    /// Its loop's deadline: the batch carrying it is sent with the earliest of its members'.
    pub(crate) give_up_at: Instant,
    /// Where its own result goes.
    pub(crate) reply: oneshot::Sender<Result<LeaseResult, ClientError>>,
}

/// The queue of one (group, tenant)'s keep-alive batcher.
pub(crate) type KeepAliveQueue = mpsc::Sender<KeepAliveItem>;

/// When a keep-alive nominally due at `due` is sent: the latest point of the grid
/// `epoch + k * quantum` at or before `due` (`due` itself before the epoch or with a zero
/// quantum). Sending early is always safe (the safe deadline counts from the send), and costs at
/// most one quantum. With the quantum a sixth of the ttl and keep-alives nominally a third of the
/// ttl apart, a loop's keep-alives land on the grid from its first one on and stay there: every
/// session of the client with that ttl keeps its record in a group alive at the same grid points,
/// so their keep-alives go in the same Batch requests (at most two phases per group and ttl).
pub(crate) fn aligned_due(epoch: Instant, due: Instant, quantum: Duration) -> Instant {
    if quantum.is_zero() || due <= epoch {
        return due;
    }
    let since = due.duration_since(epoch);
    let quantum_ns = quantum.as_nanos();
    let steps = since.as_nanos() / quantum_ns;
    let offset_ns = steps.saturating_mul(quantum_ns);
    match u64::try_from(offset_ns) {
        Ok(offset_ns) => epoch + Duration::from_nanos(offset_ns),
        Err(_) => due,
    }
}

#[cfg(test)]
mod tests {
    use super::aligned_due;
    use std::time::{Duration, Instant};

    #[test]
    fn keepalives_land_on_the_grid_and_stay_there() {
        let epoch = Instant::now();
        let ttl = Duration::from_millis(30_000);
        let quantum = ttl / 6;
        // Sessions opened at scattered moments: each one's keep-alives move onto the grid at
        // the first one (never later than nominal, never more than a quantum early), and then
        // stay a third of the ttl apart, on the grid, whatever the small delay of each send.
        let mut phases = std::collections::BTreeSet::new();
        for open_ms in [0u64, 1, 777, 4_999, 5_000, 12_345, 29_999] {
            let mut sent = epoch + Duration::from_millis(open_ms);
            for round in 0..5 {
                let nominal = sent + ttl / 3;
                let due = aligned_due(epoch, nominal, quantum);
                assert!(due <= nominal);
                assert!(nominal.duration_since(due) < quantum);
                let on_grid = due.duration_since(epoch).as_nanos() % quantum.as_nanos();
                assert_eq!(on_grid, 0, "open {open_ms} round {round}");
                if round > 0 {
                    assert_eq!(due.duration_since(sent), ttl / 3 - Duration::from_millis(3));
                }
                phases.insert(due.duration_since(epoch).as_nanos() / quantum.as_nanos() % 2);
                // The send happens a little after the due moment.
                sent = due + Duration::from_millis(3);
            }
        }
        assert!(phases.len() <= 2);
        // Degenerate inputs are left alone.
        assert_eq!(aligned_due(epoch, epoch, quantum), epoch);
        let later = epoch + Duration::from_millis(5);
        assert_eq!(aligned_due(later, epoch, quantum), epoch);
        assert_eq!(aligned_due(epoch, later, Duration::ZERO), later);
    }
}
