//! What a lease handle, the client and the renewer share: the handle's state
//! ([`LeaseShared`], [`LeaseState`], [`LossReason`]) and the commands the renewer takes
//! ([`RenewerCommand`]). The lowest of the client's lease modules: `client`, `lease` and
//! `renewer` all use it, so none of them needs another to name these types.
//!
//! Must not depend on: the client, the lease handle or the renewer (no `Client`, no calls).

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use tenure_core::{ErrorCode, LeaseId, ResourceKey};
use tokio::sync::{oneshot, watch};

use crate::error::ClientError;

/// Where a lease handle stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseState {
    /// Held: renewals are confirmed in time (check [`Lease::is_valid`] before acting).
    Held,
    /// Lost: the holder must stop acting as holder now.
    Lost(LossReason),
    /// Released by this handle.
    Released,
}

/// Why a lease was lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LossReason {
    /// The safe deadline (less the loss-signal lead) came without a confirmed renewal: renewals
    /// failed or got no answer (a partition, a pause, an overloaded cluster). The lease may
    /// still be alive on the servers, but this holder can no longer be sure.
    DeadlineWithoutRenewal,
    /// The cluster refused a renewal: the lease expired, was released, or is not this holder's
    /// (`LEASE_EXPIRED`, `LEASE_MISMATCH`, `NOT_FOUND`).
    Rejected {
        /// The error code.
        code: ErrorCode,
        /// The server's message.
        message: String,
    },
    /// The client was closed.
    ClientClosed,
}

impl std::fmt::Display for LossReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LossReason::DeadlineWithoutRenewal => {
                f.write_str("no renewal was confirmed before the safe deadline")
            }
            LossReason::Rejected { code, message } => {
                write!(f, "renewal refused: {code}: {message}")
            }
            LossReason::ClientClosed => f.write_str("the client was closed"),
        }
    }
}

#[derive(Debug)]
pub(crate) struct LeaseTiming {
    pub safe_deadline: Instant,
    pub last_sent_at: Instant,
    pub renewals: u64,
}

/// What the handle and the renewer share.
#[derive(Debug)]
pub(crate) struct LeaseShared {
    pub id: u64,
    pub key: ResourceKey,
    pub holder_id: String,
    pub lease_id: LeaseId,
    pub fencing_token: u64,
    pub ttl_ms: u64,
    pub group_id: u32,
    pub replayed: bool,
    pub timing: Mutex<LeaseTiming>,
    pub state: watch::Sender<LeaseState>,
    /// Set by the renewer while a renewal is overdue (see [`Lease::at_risk`]).
    pub at_risk: AtomicBool,
}

impl LeaseShared {
    pub(crate) fn safe_deadline(&self) -> Instant {
        self.timing.lock().map_or_else(
            |poisoned| poisoned.into_inner().safe_deadline,
            |t| t.safe_deadline,
        )
    }

    /// Moves a held lease to `state`; a lease that is no longer held stays as it is.
    pub(crate) fn mark(&self, state: LeaseState) -> bool {
        self.state.send_if_modified(|current| {
            if *current == LeaseState::Held && state != LeaseState::Held {
                *current = state;
                true
            } else {
                false
            }
        })
    }

    pub(crate) fn is_held(&self) -> bool {
        *self.state.borrow() == LeaseState::Held
    }
}

/// What the renewer is told.
pub(crate) enum RenewerCommand {
    /// Start watching (and, with `auto_renew`, renewing) a lease.
    Register {
        lease: Arc<LeaseShared>,
        auto_renew: bool,
    },
    /// Stop; with `release`, release the lease if it is still held.
    Unregister { id: u64, release: bool },
    /// A renewal batch finished.
    Done(Vec<(u64, RenewOutcome)>),
    /// The lease was released through this client (by any path): every handle of it is
    /// released.
    Released { lease_id: LeaseId },
    /// Release every held lease, then stop.
    Shutdown { done: oneshot::Sender<()> },
}

/// The outcome of one renewal.
pub(crate) enum RenewOutcome {
    /// Renewed; the request was first sent at `sent_at`, and the answer leaves `window_ttl_ms`
    /// to count the safe window from (the ttl, or for a replayed answer what was left of it).
    Renewed {
        sent_at: Instant,
        window_ttl_ms: u64,
    },
    /// The cluster refused it for good.
    Gone(ClientError),
    /// No answer or a retryable error: try again soon.
    Retry,
}
