//! [`Lease`]: the handle `Client::acquire` returns. It knows the lease's id, fencing token, ttl
//! and safe deadline, is renewed by the client's renewer, signals loss, and releases.
//!
//! Must not depend on: connections (it asks the client and the renewer).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tenure_core::{ErrorCode, LeaseId, ReleaseReceipt, ResourceKey};
use tokio::sync::watch;

use crate::client::{Client, Grant};
use crate::error::ClientError;
use crate::renewer::RenewerCommand;

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
    pub(crate) async fn start(client: Client, grant: Grant, auto_renew: bool) -> Lease {
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let shared = Arc::new(LeaseShared {
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            key: grant.key,
            holder_id: grant.holder_id,
            lease_id: grant.lease_id,
            fencing_token: grant.fencing_token,
            ttl_ms: grant.ttl_ms,
            group_id: grant.group_id,
            replayed: grant.replayed,
            timing: Mutex::new(LeaseTiming {
                safe_deadline: grant.safe_deadline,
                last_sent_at: grant.sent_at,
                renewals: 0,
            }),
            state: watch::Sender::new(LeaseState::Held),
            at_risk: AtomicBool::new(false),
        });
        let registered = client
            .inner
            .renewer
            .send(RenewerCommand::Register {
                lease: shared.clone(),
                auto_renew,
            })
            .await;
        if registered.is_err() {
            shared.mark(LeaseState::Lost(LossReason::ClientClosed));
        }
        Lease {
            shared,
            client,
            finished: false,
        }
    }

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

/// A held lease, renewed automatically until it is released, lost or dropped.
///
/// - **Acting safely.** Act as holder only while [`Lease::is_valid`] is true, and pass
///   [`Lease::fencing_token`] to every system you write to: a paused process cannot know it was
///   paused, so downstream systems must reject tokens older than the newest they have seen.
/// - **Renewal.** The client renews every handle when a third of its ttl has passed since the
///   last confirmed renewal was sent (configurable; no later than halfway through a safe window
///   shortened by a replayed answer), grouping renewals due together into one Batch request
///   per Raft group. Each confirmed renewal moves the safe deadline. A handle whose renewal is
///   overdue reports [`Lease::at_risk`] before its loss signal.
/// - **Loss.** [`Lease::lost`] resolves, and [`Lease::watch`] changes, when a renewal is refused
///   or when the safe deadline is about to pass (by `loss_signal_lead`) without a confirmed
///   renewal. A lost handle is not renewed again; acquire anew.
/// - **Dropping the handle** stops its renewal and releases the lease in the background (best
///   effort, one attempt deadline), so the resource becomes free at once instead of when the ttl
///   runs out. To stop renewing without releasing, call [`Lease::detach`]; to know the release
///   succeeded, call [`Lease::release`].
/// - A handle keeps its client's connections open (it holds a clone of the client).
/// - A release of the same lease through this client by any other path (`Client::release`, a
///   Batch) releases the handle at once.
/// - **Clock assumption.** The deadline is kept on `std::time::Instant` (CLOCK_MONOTONIC on
///   Linux), which does not advance while the machine is suspended. A process paused by a
///   signal or a debugger is handled (the deadline passes in real time meanwhile); a machine
///   suspended while holding a lease is not: treat a resume from suspend as a loss.
#[derive(Debug)]
pub struct Lease {
    shared: Arc<LeaseShared>,
    client: Client,
    finished: bool,
}

impl Lease {
    /// The resource.
    pub fn key(&self) -> &ResourceKey {
        &self.shared.key
    }

    /// The holder id.
    pub fn holder_id(&self) -> &str {
        &self.shared.holder_id
    }

    /// The lease id.
    pub fn lease_id(&self) -> LeaseId {
        self.shared.lease_id
    }

    /// The fencing token (unchanged by renewals).
    pub fn fencing_token(&self) -> u64 {
        self.shared.fencing_token
    }

    /// The ttl the server granted.
    pub fn ttl(&self) -> Duration {
        Duration::from_millis(self.shared.ttl_ms)
    }

    /// The group that holds the lease.
    pub fn group_id(&self) -> u32 {
        self.shared.group_id
    }

    /// True when the acquire's answer was the stored outcome of an earlier attempt.
    pub fn replayed(&self) -> bool {
        self.shared.replayed
    }

    /// Until when the holder may act (contract section 5), from the send time of the last
    /// confirmed acquire or renewal.
    pub fn safe_deadline(&self) -> Instant {
        self.shared.safe_deadline()
    }

    /// Time left before the safe deadline (zero once it passed).
    pub fn remaining(&self) -> Duration {
        self.safe_deadline()
            .saturating_duration_since(crate::time::now())
    }

    /// True while the lease is held and its safe deadline has not passed: the holder may act.
    pub fn is_valid(&self) -> bool {
        self.shared.is_held() && crate::time::now() < self.safe_deadline()
    }

    /// True while the lease is held but at risk: its renewal is overdue. No renewal was
    /// confirmed by halfway between the time it was due (a third of the ttl after the last
    /// confirmed one was sent, by default) and the loss signal. The holder may still act while
    /// [`Lease::is_valid`] is true, but should finish or checkpoint its work: renewals are not
    /// keeping up (an overloaded cluster or process, a failing network) and the loss signal
    /// may follow. Cleared by the next confirmed renewal. [`crate::ClientStats::leases_at_risk`]
    /// counts such handles.
    pub fn at_risk(&self) -> bool {
        self.shared.is_held() && self.shared.at_risk.load(Ordering::Acquire)
    }

    /// The current state.
    pub fn state(&self) -> LeaseState {
        self.shared.state.borrow().clone()
    }

    /// Renewals confirmed so far.
    pub fn renewals(&self) -> u64 {
        self.shared
            .timing
            .lock()
            .map_or_else(|poisoned| poisoned.into_inner().renewals, |t| t.renewals)
    }

    /// A receiver of state changes (for `tokio::select!` loops).
    pub fn watch(&self) -> watch::Receiver<LeaseState> {
        self.shared.state.subscribe()
    }

    /// Resolves when the lease is lost or released, with the final state. It keeps its own
    /// timer at the safe deadline less the loss-signal lead, so it resolves in time even when
    /// the renewer task has not run yet (after the process was paused, say).
    pub async fn lost(&self) -> LeaseState {
        let mut watch = self.shared.state.subscribe();
        let lead = self
            .client
            .config()
            .renew
            .loss_signal_lead
            .min(Duration::from_millis(self.shared.ttl_ms / 10));
        loop {
            if *watch.borrow_and_update() != LeaseState::Held {
                return watch.borrow().clone();
            }
            let loss_at = self
                .shared
                .safe_deadline()
                .checked_sub(lead)
                .unwrap_or_else(Instant::now);
            if crate::time::now() >= loss_at {
                self.shared
                    .mark(LeaseState::Lost(LossReason::DeadlineWithoutRenewal));
                continue;
            }
            tokio::select! {
                changed = watch.changed() => {
                    if changed.is_err() {
                        return LeaseState::Lost(LossReason::ClientClosed);
                    }
                }
                // The deadline may have moved meanwhile; the loop checks again.
                () = tokio::time::sleep_until(loss_at.into()) => {}
            }
        }
    }

    /// Stops renewing and releases the lease; returns the cluster's receipt.
    pub async fn release(mut self) -> Result<ReleaseReceipt, ClientError> {
        self.finished = true;
        self.unregister(false);
        let receipt = self
            .client
            .release(
                self.shared.key.clone(),
                self.shared.lease_id,
                self.shared.holder_id.clone(),
                None,
            )
            .await;
        self.shared.mark(LeaseState::Released);
        receipt
    }

    /// Stops renewing without releasing: the lease ends when its ttl runs out (unless someone
    /// renews it with its id and holder). Returns the lease id and fencing token.
    pub fn detach(mut self) -> (LeaseId, u64) {
        self.finished = true;
        self.unregister(false);
        (self.shared.lease_id, self.shared.fencing_token)
    }

    fn unregister(&self, release: bool) {
        let command = RenewerCommand::Unregister {
            id: self.shared.id,
            release,
        };
        if let Err(tokio::sync::mpsc::error::TrySendError::Full(command)) =
            self.client.inner.renewer.try_send(command)
        {
            let renewer = self.client.inner.renewer.clone();
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    let _ = renewer.send(command).await;
                });
            }
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if !self.finished {
            self.unregister(true);
        }
    }
}
