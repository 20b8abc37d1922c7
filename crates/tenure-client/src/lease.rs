//! [`Lease`]: the handle `Client::acquire` returns. It knows the lease's id, fencing token, ttl
//! and safe deadline, is renewed by the client's renewer, signals loss, releases and transfers.
//! The calls that produce handles (`Client::acquire`, `acquire_with`, `adopt`, `adopt_grant`)
//! live here too, so that `client` never needs this module.
//!
//! Must not depend on: connections or the renewer's internals (it asks the client, and talks
//! to the renewer through `handle`'s commands).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tenure_core::{ErrorCode, LeaseId, LeaseStatus, ReleaseReceipt, ResourceKey};
use tokio::sync::watch;

use crate::client::{AcquireOptions, Client, Grant, Transferred};
use crate::error::ClientError;
use crate::handle::{LeaseShared, LeaseState, LeaseTiming, LossReason, RenewerCommand};

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

    /// Hands the lease to `new_holder_id` in one step (see [`Client::transfer`]); the answer
    /// carries the new holder's grant (new lease id, higher fencing token, `ttl` from the
    /// transfer). Stop acting as holder before calling it: the new holder may act as soon as
    /// the transfer is applied, before this call returns. The handle is consumed:
    /// - on success it ends as [`LeaseState::Released`];
    /// - when the cluster refused the transfer before changing anything (an invalid new holder
    ///   or ttl), [`TransferFailed::lease`] gives the handle back, still held and renewed;
    /// - otherwise (the lease is gone: `LEASE_EXPIRED`, `LEASE_MISMATCH`, `NOT_FOUND`; or no
    ///   definite answer, so the transfer may have taken effect) the handle ends, released; the
    ///   client's retries use one request id, so a transfer never applies twice.
    pub async fn transfer(
        mut self,
        new_holder_id: impl Into<String>,
        ttl: Duration,
    ) -> Result<Transferred, TransferFailed> {
        let result = self
            .client
            .transfer(
                self.shared.key.clone(),
                self.shared.lease_id,
                self.shared.holder_id.clone(),
                new_holder_id,
                ttl,
                None,
            )
            .await;
        match result {
            Err(error) if refused_without_effect(&error) => Err(TransferFailed {
                error,
                lease: Some(self),
            }),
            result => {
                self.finished = true;
                self.unregister(false);
                self.shared.mark(LeaseState::Released);
                result.map_err(|error| TransferFailed { error, lease: None })
            }
        }
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

/// A [`Lease::transfer`] that did not succeed.
#[derive(Debug)]
pub struct TransferFailed {
    /// Why.
    pub error: ClientError,
    /// The handle, still held and renewed, when the cluster refused the transfer before changing
    /// anything; `None` when the lease is gone or may be (the handle then ended).
    pub lease: Option<Lease>,
}

impl std::fmt::Display for TransferFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "transfer failed: {}", self.error)?;
        if self.lease.is_some() {
            f.write_str(" (the lease is still held)")?;
        }
        Ok(())
    }
}

impl std::error::Error for TransferFailed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// True for a definite refusal that changed nothing and leaves the lease with its holder: the
/// request was invalid (for the client or the cluster) or not allowed, not one that says the
/// lease is gone.
pub(crate) fn refused_without_effect(error: &ClientError) -> bool {
    match error {
        ClientError::InvalidRequest(_) => true,
        ClientError::Server {
            code, retryable, ..
        } => {
            !retryable
                && !matches!(
                    code,
                    ErrorCode::LeaseExpired | ErrorCode::LeaseMismatch | ErrorCode::NotFound
                )
        }
        _ => false,
    }
}

impl Client {
    /// Acquires a lease and returns a handle that renews it automatically (see [`Lease`]).
    /// `ALREADY_HELD` comes back as an error whose [`ClientError::current_holder`] names the
    /// holder.
    ///
    /// The client retries within the call with one generated request id. A caller that wants to
    /// retry after the call failed (deadline passed, say) should use [`Client::acquire_with`]
    /// with its own [`AcquireOptions::request_id`]: a new id could find its own earlier,
    /// applied attempt holding the resource (`ALREADY_HELD` naming itself).
    pub async fn acquire(
        &self,
        tenant_id: impl Into<String>,
        resource_id: impl Into<String>,
        holder_id: impl Into<String>,
        ttl: Duration,
    ) -> Result<Lease, ClientError> {
        self.acquire_with(AcquireOptions::new(tenant_id, resource_id, holder_id, ttl))
            .await
    }

    /// Acquires with explicit options.
    ///
    /// When the answer replays an earlier attempt whose grant has nothing left (see
    /// [`Grant::safe_deadline`]), the lease is renewed once right away to learn a deadline; if it
    /// ended meanwhile, that renewal's error is returned.
    pub async fn acquire_with(&self, options: AcquireOptions) -> Result<Lease, ClientError> {
        let auto_renew = options.auto_renew;
        let mut grant = self.acquire_grant(options).await?;
        if grant.replayed && grant.safe_deadline <= grant.sent_at {
            let renewed = self
                .renew(
                    grant.key.clone(),
                    grant.lease_id,
                    grant.holder_id.clone(),
                    Duration::from_millis(grant.ttl_ms),
                    None,
                )
                .await?;
            grant = Grant {
                replayed: true,
                ..renewed
            };
        }
        Ok(start_handle(self.clone(), grant, auto_renew).await)
    }

    /// A renewing handle for a grant this client obtained (the new holder's grant of a
    /// [`Client::transfer`] made in this process, or an [`Client::acquire_grant`]).
    pub async fn adopt_grant(&self, grant: Grant) -> Lease {
        start_handle(self.clone(), grant, true).await
    }

    /// Takes over the resource's active lease held under `holder_id`: the receiving side of a
    /// transfer made elsewhere. Reads the lease (linearizably), renews it with `ttl` so that the
    /// safe deadline counts from a request this client sent, and returns a renewing handle.
    /// `NOT_FOUND` when the resource has no lease, `LEASE_MISMATCH` when its active lease is not
    /// `holder_id`'s (or none is active).
    pub async fn adopt(
        &self,
        key: ResourceKey,
        holder_id: impl Into<String>,
        ttl: Duration,
    ) -> Result<Lease, ClientError> {
        let holder_id = holder_id.into();
        let refused = |code: ErrorCode, message: String| ClientError::Server {
            code,
            message,
            retryable: false,
            lease_error: None,
            retry_after_ms: None,
        };
        let Some(view) = self.get(&key).await?.view else {
            return Err(refused(
                ErrorCode::NotFound,
                format!("{}/{} has no lease", key.tenant_id, key.resource_id),
            ));
        };
        if view.status != LeaseStatus::Active || view.holder_id != holder_id {
            return Err(refused(
                ErrorCode::LeaseMismatch,
                format!(
                    "{}/{}: the lease is {} and {}'s, not an active lease of {holder_id}",
                    key.tenant_id,
                    key.resource_id,
                    view.status.as_str(),
                    view.holder_id
                ),
            ));
        }
        let grant = self.renew(key, view.lease_id, holder_id, ttl, None).await?;
        Ok(self.adopt_grant(grant).await)
    }
}

/// Starts a handle for `grant`: registers it with the client's renewer.
pub(crate) async fn start_handle(client: Client, grant: Grant, auto_renew: bool) -> Lease {
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

impl Drop for Lease {
    fn drop(&mut self) {
        if !self.finished {
            self.unregister(true);
        }
    }
}
