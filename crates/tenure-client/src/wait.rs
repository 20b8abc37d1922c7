//! Waiting for a resource in its FIFO queue (AcquireWait): the calls, their retries, and the
//! cancel when the caller's wait runs out.
//!
//! One wait is one request id. Each attempt is parked on the key's group leader until the wait
//! ends there (a hand-off grants the resource, or the wait passes) or for at most
//! [`PARK_ATTEMPT_MAX`]; an attempt answered with the queue position is sent again with the same
//! request id, which finds the grant, the end of the wait or the position again: never a second
//! place in the queue. So a waiter sends about one request per [`PARK_ATTEMPT_MAX`] while it
//! waits, and nothing per hand-off of others: no herd.
//!
//! Must not depend on: the server (only the native protocol).

use std::time::Duration;

use std::time::Instant;
use tenure_core::{
    ErrorCode, LeaseOp, LeaseReply, QueuedReceipt, ResourceKey, WaitAcquireRequest,
    WaitCancelReceipt, WaitCancelRequest, WaitEndReason, WaitLease,
};
use tenure_proto::client::{LeaseResult, RequestBody, RequestFlags, ResponseBody};

use crate::client::{Client, Grant};
use crate::error::ClientError;
use crate::lease::Lease;

/// Longest time one attempt of a wait is parked on the server before it answers with the
/// position (the request's timeout; the server keeps a margin from it).
pub(crate) const PARK_ATTEMPT_MAX: Duration = Duration::from_secs(20);

/// Time past the wait's end given to the server to answer its end (its Expire entry).
const WAIT_END_SLACK: Duration = Duration::from_secs(2);

/// Options of [`Client::acquire_wait`].
#[derive(Debug, Clone)]
pub struct WaitOptions {
    /// The resource.
    pub key: ResourceKey,
    /// Who asks.
    pub holder_id: String,
    /// The lease's ttl once granted (within the cluster's bounds).
    pub ttl: Duration,
    /// How long to wait at most (at least 1 ms, at most the tenant's largest ttl).
    pub wait: Duration,
    /// The wait's request id; `None` generates one. A caller that retries a wait itself (after
    /// a crash, say) with the same id finds its place, or the grant, again. A wait whose call
    /// ended in an error has been cancelled (see [`Client::acquire_wait`]): its request id then
    /// answers the end of the wait, or a request-id conflict when the cancel reached the group
    /// before the wait did; wait again with a new request id.
    pub request_id: Option<String>,
    /// Renew a grant that came after a long park at once, so its safe window counts from a
    /// fresh send (default). Off: the grant is returned as answered (its window counts from
    /// the send of the attempt that got it), one request fewer per hand-off.
    pub renew_after_park: bool,
}

impl WaitOptions {
    /// Options with a generated request id.
    pub fn new(
        tenant_id: impl Into<String>,
        resource_id: impl Into<String>,
        holder_id: impl Into<String>,
        ttl: Duration,
        wait: Duration,
    ) -> Self {
        WaitOptions {
            key: ResourceKey::new(tenant_id, resource_id),
            holder_id: holder_id.into(),
            ttl,
            wait,
            request_id: None,
            renew_after_park: true,
        }
    }
}

/// The end of a wait that got no grant, as an error: code ALREADY_HELD, the state machine's
/// `WaitEnded`.
pub(crate) fn wait_ended(reason: WaitEndReason) -> ClientError {
    let error = tenure_core::LeaseError::WaitEnded { reason };
    ClientError::Server {
        code: error.code(),
        message: error.to_string(),
        retryable: false,
        lease_error: Some(error),
        retry_after_ms: None,
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

impl Client {
    /// Acquires `options.key`, waiting up to `options.wait` in the resource's FIFO queue while
    /// it is held. When the holder releases the lease or it expires, the first waiter still
    /// alive gets it at once, with a new fencing token, and its call returns the grant.
    ///
    /// A grant that arrives after a long park is renewed once at once, so its safe window
    /// counts from a fresh send (the window of the grant itself counts from the send of the
    /// attempt that got it, which may be up to [`PARK_ATTEMPT_MAX`] earlier). Nothing renews it
    /// afterwards: renew it, or use a [`crate::Session`] (`Session::acquire_wait`), whose
    /// keep-alives keep every lease of the session.
    ///
    /// Errors: `ALREADY_HELD` with [`WaitEndReason::TimedOut`] when the wait ran out (the wait
    /// is cancelled), `ALREADY_HELD` without one when the caller already holds the resource,
    /// `QUOTA_EXCEEDED` when the queue is full.
    pub async fn acquire_wait(&self, options: WaitOptions) -> Result<Grant, ClientError> {
        let request_id = options
            .request_id
            .clone()
            .unwrap_or_else(|| self.new_request_id());
        let ttl_ms = millis(options.ttl);
        let lease = WaitLease::Ttl { ttl_ms };
        let (result, sent_at) = self
            .wait_in_queue(
                &options.key,
                &options.holder_id,
                lease,
                options.wait,
                &request_id,
            )
            .await?;
        let Some(granted) = result.reply.grant() else {
            return Err(ClientError::Protocol(
                "AcquireWait answered with neither a grant nor a position".into(),
            ));
        };
        let grant = self.make_grant(
            options.key.clone(),
            options.holder_id.clone(),
            request_id,
            sent_at,
            granted,
            result.group_id,
            (result.replayed, result.replay),
        );
        let parked = crate::time::now().saturating_duration_since(sent_at);
        if parked < Duration::from_secs(1) || !options.renew_after_park {
            return Ok(grant);
        }
        // The window counts from the attempt's send, up to a park earlier: renew now to count
        // it from here. (A renew that fails leaves the caller the grant's own window.) A caller
        // that drops this future meanwhile leaves nothing held.
        let mut guard = LeaveOnDrop::grant(self, &grant);
        let renewed = self
            .renew(
                options.key,
                grant.lease_id,
                options.holder_id,
                options.ttl,
                None,
            )
            .await;
        guard.disarm();
        match renewed {
            Ok(renewed) => Ok(renewed),
            Err(_) => Ok(grant),
        }
    }

    /// [`Client::acquire_wait`], with the grant adopted as a [`Lease`] the client renews (see
    /// [`Client::adopt_grant`]). Dropping this future at any point leaves nothing held: before
    /// the grant the wait is cancelled, after it (before the handle exists) the grant is
    /// released in the background.
    pub async fn acquire_wait_lease(&self, options: WaitOptions) -> Result<Lease, ClientError> {
        let grant = self.acquire_wait(options).await?;
        let mut guard = LeaveOnDrop::grant(self, &grant);
        let lease = self.adopt_grant(grant).await;
        guard.disarm();
        Ok(lease)
    }

    /// Joins the resource's queue, or gets the resource at once, without parking: one
    /// AcquireWait with `request_id`, answered within about [`ENQUEUE_ATTEMPT_MAX`] per attempt
    /// (retried on another node within [`ENQUEUE_DEADLINE`]) with the grant or the wait's place
    /// ([`QueuedReceipt`]: position, the log time it was queued at and its wait's end). Go on
    /// with [`Client::acquire_wait`] with the same request id (and the same holder, ttl and
    /// wait) to park until the grant: it finds this place, never a second one. Useful to show
    /// a waiter its position, or to learn when it joined the queue.
    ///
    /// Nothing cancels a wait this call queued: the caller either waits for it or cancels it
    /// ([`Client::cancel_wait`]); otherwise it stays queued until its wait passes.
    ///
    /// Errors: as [`Client::acquire_wait`] (a wait that already ended answers its end).
    pub async fn wait_enqueue(
        &self,
        options: &WaitOptions,
        request_id: &str,
    ) -> Result<WaitStep, ClientError> {
        let key = &options.key;
        let group = self.group_of(key).await?;
        let body = RequestBody::Lease(LeaseOp::AcquireWait(WaitAcquireRequest {
            key: key.clone(),
            holder_id: options.holder_id.clone(),
            lease: WaitLease::Ttl {
                ttl_ms: millis(options.ttl),
            },
            wait_ms: millis(options.wait).max(1),
            request_id: request_id.to_owned(),
        }));
        let sent_at = crate::time::now();
        let answer = self
            .call_with_attempts(
                Some(group),
                body,
                RequestFlags::default(),
                Some(&key.tenant_id),
                sent_at + ENQUEUE_DEADLINE,
                ENQUEUE_ATTEMPT_MAX,
            )
            .await?;
        let ResponseBody::Lease(result) = answer else {
            return Err(ClientError::Protocol(
                "AcquireWait answered with another kind".into(),
            ));
        };
        match &result.reply {
            LeaseReply::Queued(receipt) => Ok(WaitStep::Queued(receipt.clone())),
            reply => {
                let Some(granted) = reply.grant() else {
                    return Err(ClientError::Protocol(
                        "AcquireWait answered with neither a grant nor a position".into(),
                    ));
                };
                // The attempt that got the answer was sent at most ENQUEUE_DEADLINE ago; the
                // window counts from the first send (conservative).
                Ok(WaitStep::Granted(self.make_grant(
                    key.clone(),
                    options.holder_id.clone(),
                    request_id.to_owned(),
                    sent_at,
                    granted,
                    result.group_id,
                    (result.replayed, result.replay),
                )))
            }
        }
    }

    /// Cancels a wait by its request id: it leaves the queue. If the wait was granted before
    /// the cancel arrived, the receipt carries the grant: the caller holds that lease.
    pub async fn cancel_wait(
        &self,
        key: &ResourceKey,
        holder_id: &str,
        request_id: &str,
    ) -> Result<WaitCancelReceipt, ClientError> {
        let group = self.group_of(key).await?;
        let body = RequestBody::Lease(LeaseOp::WaitCancel(WaitCancelRequest {
            key: key.clone(),
            holder_id: holder_id.to_owned(),
            request_id: request_id.to_owned(),
        }));
        match self
            .call(
                Some(group),
                body,
                RequestFlags::default(),
                Some(&key.tenant_id),
            )
            .await?
        {
            ResponseBody::Lease(LeaseResult {
                reply: LeaseReply::WaitCancelled(receipt),
                ..
            }) => Ok(receipt),
            _ => Err(ClientError::Protocol(
                "WaitCancel answered with another kind".into(),
            )),
        }
    }

    /// Sends the AcquireWait until it is answered with anything but a queue position, or the
    /// wait runs out (then cancels it: a grant the cancel reports is released, since the
    /// caller has stopped waiting for it). The answer, and when its attempt was sent.
    pub(crate) async fn wait_in_queue(
        &self,
        key: &ResourceKey,
        holder_id: &str,
        lease: WaitLease,
        wait: Duration,
        request_id: &str,
    ) -> Result<(LeaseResult, Instant), ClientError> {
        let group = self.group_of(key).await?;
        let wait_ms = millis(wait).max(1);
        let deadline = crate::time::now() + wait + WAIT_END_SLACK;
        // Whatever ends this call other than an answer (an error, the caller dropping the
        // future) leaves the queue: the guard cancels the wait (and releases a grant that beat
        // the cancel) in the background.
        let mut guard = LeaveOnDrop::wait(self, key, holder_id, request_id);
        let mut queued_pause = QUEUED_PAUSE_MIN;
        loop {
            let now = crate::time::now();
            if now >= deadline {
                break;
            }
            let attempt = deadline
                .saturating_duration_since(now)
                .min(PARK_ATTEMPT_MAX);
            let body = RequestBody::Lease(LeaseOp::AcquireWait(WaitAcquireRequest {
                key: key.clone(),
                holder_id: holder_id.to_owned(),
                lease,
                wait_ms,
                request_id: request_id.to_owned(),
            }));
            let answer = self
                .call_with_attempts(
                    Some(group),
                    body,
                    RequestFlags::default(),
                    Some(&key.tenant_id),
                    deadline,
                    attempt,
                )
                .await;
            match answer {
                Ok(ResponseBody::Lease(result)) => {
                    if matches!(result.reply, LeaseReply::Queued(_)) {
                        // A position is normally the answer of a call parked until its time
                        // was nearly up; one that came back at once (the node could not park
                        // it) is not re-sent in a tight loop.
                        if now.elapsed() < QUEUED_QUICK {
                            tokio::time::sleep(queued_pause).await;
                            queued_pause = (queued_pause * 2).min(QUEUED_PAUSE_MAX);
                        } else {
                            queued_pause = QUEUED_PAUSE_MIN;
                        }
                        continue;
                    }
                    // Answered: granted, or the wait ended (nothing left to cancel).
                    guard.disarm();
                    return Ok((result, now));
                }
                Ok(_) => {
                    return Err(ClientError::Protocol(
                        "AcquireWait answered with another kind".into(),
                    ));
                }
                Err(ClientError::DeadlineExceeded { .. }) => break,
                Err(error) => {
                    // A refusal the cluster decided (the wait ended, the queue is full) left
                    // nothing queued; anything else may have, and the guard cancels it.
                    if matches!(error, ClientError::Server { .. }) && !error.is_retryable() {
                        guard.disarm();
                    }
                    return Err(error);
                }
            }
        }
        guard.disarm();
        let receipt = self.cancel_wait(key, holder_id, request_id).await?;
        if let Some(grant) = receipt.granted {
            // Granted while the caller was giving up: it no longer wants it.
            let _ = self
                .release(key.clone(), grant.lease_id, holder_id, None)
                .await;
        }
        Err(wait_ended(WaitEndReason::TimedOut))
    }
}

/// What [`Client::wait_enqueue`] found.
#[derive(Debug, Clone)]
pub enum WaitStep {
    /// The resource was free (or the wait had already been granted): the caller holds it.
    Granted(Grant),
    /// The wait is in the resource's queue.
    Queued(QueuedReceipt),
}

/// Longest time one attempt of [`Client::wait_enqueue`] takes (the server parks a call at most
/// its timeout less a margin of 300 ms, so this keeps the park short).
const ENQUEUE_ATTEMPT_MAX: Duration = Duration::from_millis(500);
/// Longest time [`Client::wait_enqueue`] retries.
const ENQUEUE_DEADLINE: Duration = Duration::from_secs(5);

/// A position answered faster than this came back without being parked.
const QUEUED_QUICK: Duration = Duration::from_millis(200);
/// Pause before re-sending a wait whose position came back at once, doubling up to the max.
const QUEUED_PAUSE_MIN: Duration = Duration::from_millis(50);
const QUEUED_PAUSE_MAX: Duration = Duration::from_secs(2);

/// What a [`LeaveOnDrop`] undoes.
enum Leave {
    /// A wait that may be queued: cancel it (and release a grant that beat the cancel).
    Wait { request_id: String },
    /// A grant nobody owns yet: release it.
    Grant { lease_id: tenure_core::LeaseId },
}

/// Leaves nothing held when dropped armed: in the background it cancels a wait whose call ended
/// other than by an answer (see [`Client::wait_in_queue`]), or releases a grant between its
/// answer and the handle (or caller) that owns it.
struct LeaveOnDrop {
    client: Option<Client>,
    key: ResourceKey,
    holder_id: String,
    leave: Leave,
}

impl LeaveOnDrop {
    fn wait(client: &Client, key: &ResourceKey, holder_id: &str, request_id: &str) -> Self {
        LeaveOnDrop {
            client: Some(client.clone()),
            key: key.clone(),
            holder_id: holder_id.to_owned(),
            leave: Leave::Wait {
                request_id: request_id.to_owned(),
            },
        }
    }

    fn grant(client: &Client, grant: &Grant) -> Self {
        LeaveOnDrop {
            client: Some(client.clone()),
            key: grant.key.clone(),
            holder_id: grant.holder_id.clone(),
            leave: Leave::Grant {
                lease_id: grant.lease_id,
            },
        }
    }

    fn disarm(&mut self) {
        self.client = None;
    }
}

impl Drop for LeaveOnDrop {
    fn drop(&mut self) {
        let Some(client) = self.client.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let key = self.key.clone();
        let holder_id = std::mem::take(&mut self.holder_id);
        let leave = std::mem::replace(
            &mut self.leave,
            Leave::Wait {
                request_id: String::new(),
            },
        );
        runtime.spawn(async move {
            let lease_id = match leave {
                Leave::Grant { lease_id } => lease_id,
                Leave::Wait { request_id } => {
                    match client.cancel_wait(&key, &holder_id, &request_id).await {
                        Ok(receipt) => match receipt.granted {
                            Some(grant) => grant.lease_id,
                            None => return,
                        },
                        Err(_) => return,
                    }
                }
            };
            let _ = client.release(key, lease_id, holder_id, None).await;
        });
    }
}

/// True when `error` says a wait ended without a grant (timed out, cancelled, its session
/// ended).
pub fn is_wait_ended(error: &ClientError) -> bool {
    matches!(
        error,
        ClientError::Server {
            code: ErrorCode::AlreadyHeld,
            lease_error: Some(tenure_core::LeaseError::WaitEnded { .. }),
            ..
        }
    )
}
