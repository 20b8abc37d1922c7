//! [`Session`]: one keep-alive per group for all of a client's leases in that group.
//!
//! A session is kept per Raft group (contract, sessions section): the first acquire in a group
//! opens the session's record there, and a background task per group keeps that record alive
//! with one `SessionKeepAlive` every third of the ttl (moved early onto the client's keep-alive
//! grid, `crate::keepalive::aligned_due`), however many leases the session holds in the group.
//! So renewal cost grows with (session, group) pairs, not with leases, and a group that loses
//! its quorum ends only that group's leases: [`Session::lost`] names the group and exactly the
//! leases that went with it, while the other groups carry on.
//!
//! Keep-alives of the same group that fall due together, from every session of one client, are
//! sent in one Batch request (a batcher per group collects them for
//! [`KEEPALIVE_COALESCE`] or until [`KEEPALIVE_BATCH_MAX`]), so a process holding many sessions
//! pays per group, not per session.
//!
//! The safe deadline is per group: `send time of the last confirmed keep-alive (or open) +
//! safe_window(ttl)`, the lease formula of the contract's section 5 with the session's ttl.
//! A group's loss is signalled `loss_signal_lead` before that deadline when no keep-alive was
//! confirmed, or at once when the group answers that the session ended there.
//!
//! Must not depend on: the renewer (sessions renew nothing lease by lease) or connections
//! (everything goes through [`Client`]'s calls).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::Rng as _;
use tenure_core::{
    ErrorCode, GroupId, LeaseId, LeaseOp, LeaseReply, ReleaseReceipt, ReleaseRequest, ResourceKey,
    SessionAcquireRequest, SessionGrant, SessionId, SessionOpenRequest, SessionReceipt,
    SessionRequest,
};
use tenure_proto::client::{LeaseResult, RequestBody, RequestFlags, ResponseBody};
use tokio::sync::{mpsc, watch};

use crate::client::Client;
use crate::error::ClientError;
use crate::keepalive::KeepAliveItem;

/// A lease held under a [`Session`]: it has no ttl of its own and is valid exactly while its
/// group's record of the session is ([`Session::is_valid`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionLease {
    /// The resource.
    pub key: ResourceKey,
    /// The lease.
    pub lease_id: LeaseId,
    /// Its fencing token: pass it to every system written to.
    pub fencing_token: u64,
    /// The group that holds it (and the session record it is bound to).
    pub group_id: u32,
    /// Log time of the entry that granted it.
    pub log_time_ms: u64,
    /// The session record's expiry at the grant (keep-alives extend it).
    pub expires_at_ms: u64,
    /// The answer was a replay of an earlier attempt with the same request id.
    pub replayed: bool,
}

/// The last confirmed keep-alive of a session's record in one group (for histories and
/// diagnostics: every lease the session held there when it was sent is extended with it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeepAliveConfirmed {
    /// Confirmed keep-alives of this group so far (this one included).
    pub count: u64,
    /// When it was sent (its first attempt).
    pub sent_at: Instant,
    /// When its answer arrived.
    pub confirmed_at: Instant,
    /// Log time of the entry that applied it.
    pub log_time_ms: u64,
    /// Log time the record (and every lease bound to it) now expires at.
    pub expires_at_ms: u64,
    /// The group's safe deadline it gave: `sent_at + safe_window(ttl)`.
    pub safe_deadline: Instant,
}

/// A group in which the session ended, and the leases that ended with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionLoss {
    /// The group.
    pub group_id: u32,
    /// Why: the group's answer, or that no keep-alive was confirmed before the safe deadline.
    pub reason: String,
    /// Every lease the session held in that group when it was lost.
    pub leases: Vec<SessionLease>,
}

#[derive(Debug)]
struct GroupRecord {
    /// Send time of the last confirmed open or keep-alive.
    confirmed_sent_at: Instant,
    /// `confirmed_sent_at + safe_window(ttl)`.
    safe_deadline: Instant,
    leases: BTreeMap<ResourceKey, SessionLease>,
    lost: bool,
    last_keepalive: Option<KeepAliveConfirmed>,
}

#[derive(Debug)]
struct SessionInner {
    client: Client,
    tenant_id: String,
    owner_id: String,
    session_id: SessionId,
    ttl_ms: u64,
    groups: Mutex<BTreeMap<u32, GroupRecord>>,
    /// Each group the session opened reports at most one loss, so the channel holds at most
    /// as many messages as the session has groups.
    losses_tx: mpsc::UnboundedSender<SessionLoss>,
    losses_rx: tokio::sync::Mutex<mpsc::UnboundedReceiver<SessionLoss>>,
    stop_tx: watch::Sender<bool>,
    closed: AtomicBool,
    /// One lock per group, serialising the opening of that group's record (two acquires must
    /// not open it twice; groups open independently).
    opening: Mutex<BTreeMap<u32, Arc<tokio::sync::Mutex<()>>>>,
    /// Keep-alive requests sent (attempts, retries included) and confirmed.
    keepalives_sent: AtomicU64,
    keepalives_confirmed: AtomicU64,
}

/// A session: one owner, one ttl, records in every group it holds leases in, each kept alive in
/// the background. Cheap to clone (clones share the session). Dropping every clone stops the
/// keep-alives; the records then expire after the ttl and their leases with them. Call
/// [`Session::close`] to end them at once.
#[derive(Debug, Clone)]
pub struct Session {
    inner: Arc<SessionInner>,
}

impl Drop for SessionInner {
    fn drop(&mut self) {
        let _ = self.stop_tx.send(true);
    }
}

impl Client {
    /// Starts a session of `owner_id` for `tenant_id` with a ttl within the tenant's lease ttl
    /// bounds. Nothing is sent yet: each group's record is opened by the first
    /// [`Session::acquire`] of a resource in that group.
    pub fn session(
        &self,
        tenant_id: impl Into<String>,
        owner_id: impl Into<String>,
        ttl: Duration,
    ) -> Result<Session, ClientError> {
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        if ttl_ms == 0 {
            return Err(ClientError::InvalidRequest(
                "a session needs a ttl above zero".into(),
            ));
        }
        if self.config().safety.safe_window(ttl_ms).is_zero() {
            return Err(ClientError::InvalidRequest(format!(
                "a session ttl of {ttl_ms} ms leaves no safe window after the drift bound and \
                 margins"
            )));
        }
        let (losses_tx, losses_rx) = mpsc::unbounded_channel();
        let (stop_tx, _) = watch::channel(false);
        Ok(Session {
            inner: Arc::new(SessionInner {
                client: self.clone(),
                tenant_id: tenant_id.into(),
                owner_id: owner_id.into(),
                session_id: self.new_session_id(),
                ttl_ms,
                groups: Mutex::new(BTreeMap::new()),
                losses_tx,
                losses_rx: tokio::sync::Mutex::new(losses_rx),
                stop_tx,
                closed: AtomicBool::new(false),
                opening: Mutex::new(BTreeMap::new()),
                keepalives_sent: AtomicU64::new(0),
                keepalives_confirmed: AtomicU64::new(0),
            }),
        })
    }
}

/// One-shot session calls without a [`Session`] handle (nothing keeps the record alive
/// afterwards): for tools such as `tenurectl`, and callers that keep sessions alive themselves.
impl Client {
    /// Opens (or, while it is active, extends) `session_id`'s record in `group_id`.
    pub async fn session_open(
        &self,
        tenant_id: &str,
        group_id: u32,
        session_id: SessionId,
        owner_id: &str,
        ttl: Duration,
    ) -> Result<SessionGrant, ClientError> {
        let body = RequestBody::Lease(LeaseOp::SessionOpen(SessionOpenRequest {
            tenant_id: tenant_id.to_owned(),
            group_id: GroupId(group_id),
            session_id,
            owner_id: owner_id.to_owned(),
            ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
        }));
        match self.session_reply(tenant_id, group_id, body).await? {
            LeaseReply::SessionKept(grant) => Ok(grant),
            _ => Err(protocol("SessionOpen")),
        }
    }

    /// Extends `session_id`'s record in `group_id` by its ttl.
    pub async fn session_keepalive(
        &self,
        tenant_id: &str,
        group_id: u32,
        session_id: SessionId,
        owner_id: &str,
    ) -> Result<SessionGrant, ClientError> {
        let body = RequestBody::Lease(LeaseOp::SessionKeepAlive(SessionRequest {
            tenant_id: tenant_id.to_owned(),
            group_id: GroupId(group_id),
            session_id,
            owner_id: owner_id.to_owned(),
        }));
        match self.session_reply(tenant_id, group_id, body).await? {
            LeaseReply::SessionKept(grant) => Ok(grant),
            _ => Err(protocol("SessionKeepAlive")),
        }
    }

    /// Closes `session_id`'s record in `group_id`: its leases there end at once.
    pub async fn session_close(
        &self,
        tenant_id: &str,
        group_id: u32,
        session_id: SessionId,
        owner_id: &str,
    ) -> Result<SessionReceipt, ClientError> {
        let body = RequestBody::Lease(LeaseOp::SessionClose(SessionRequest {
            tenant_id: tenant_id.to_owned(),
            group_id: GroupId(group_id),
            session_id,
            owner_id: owner_id.to_owned(),
        }));
        match self.session_reply(tenant_id, group_id, body).await? {
            LeaseReply::SessionClosed(receipt) => Ok(receipt),
            _ => Err(protocol("SessionClose")),
        }
    }

    /// Acquires `key` bound to `session_id` (open in the key's group); the grant's
    /// `expires_at_ms` is the session record's expiry at the grant.
    pub async fn acquire_in_session(
        &self,
        key: &ResourceKey,
        owner_id: &str,
        session_id: SessionId,
        request_id: Option<String>,
    ) -> Result<(u32, tenure_core::LeaseGrant), ClientError> {
        let group_id = self.group_of(key).await?;
        let body = RequestBody::Lease(LeaseOp::AcquireInSession(SessionAcquireRequest {
            key: key.clone(),
            holder_id: owner_id.to_owned(),
            session_id,
            request_id: request_id.unwrap_or_else(|| self.new_request_id()),
        }));
        match self.session_reply(&key.tenant_id, group_id, body).await? {
            LeaseReply::Acquired(grant) => Ok((group_id, grant)),
            _ => Err(protocol("AcquireInSession")),
        }
    }

    async fn session_reply(
        &self,
        tenant_id: &str,
        group_id: u32,
        body: RequestBody,
    ) -> Result<LeaseReply, ClientError> {
        match self
            .call(
                Some(group_id),
                body,
                RequestFlags::default(),
                Some(tenant_id),
            )
            .await?
        {
            ResponseBody::Lease(result) => Ok(result.reply),
            _ => Err(ClientError::Protocol(
                "a session operation answered with another kind".into(),
            )),
        }
    }
}

impl Client {
    /// A new session id: the client id in the high 64 bits (two clients never draw the same
    /// id, whatever their jitter seeds), 64 bits from the client's seeded generator in the low
    /// ones (so a seeded client, as in the simulation, draws the same ids on every run).
    fn new_session_id(&self) -> SessionId {
        let low = match self.inner.rng.lock() {
            Ok(mut rng) => rng.random::<u64>(),
            Err(poisoned) => poisoned.into_inner().random::<u64>(),
        };
        SessionId((u128::from(self.inner.client_id) << 64) | u128::from(low))
    }
}

impl Session {
    /// The session's id.
    pub fn id(&self) -> SessionId {
        self.inner.session_id
    }

    /// The session's ttl.
    pub fn ttl(&self) -> Duration {
        Duration::from_millis(self.inner.ttl_ms)
    }

    /// Keep-alive requests sent so far (every attempt, retries included) and confirmed.
    pub fn keepalive_counts(&self) -> (u64, u64) {
        (
            self.inner.keepalives_sent.load(Ordering::Relaxed),
            self.inner.keepalives_confirmed.load(Ordering::Relaxed),
        )
    }

    /// The groups the session is open in, and whether each is lost.
    pub fn groups(&self) -> Vec<(u32, bool)> {
        self.with_groups(|groups| groups.iter().map(|(&g, r)| (g, r.lost)).collect())
    }

    /// The safe deadline of the session's record in `group_id` (`None` if never opened there).
    /// Every lease of the session in that group is safe to act on until then.
    pub fn safe_deadline(&self, group_id: u32) -> Option<Instant> {
        self.with_groups(|groups| groups.get(&group_id).map(|r| r.safe_deadline))
    }

    /// The last confirmed keep-alive of the session's record in `group_id`, if any.
    pub fn last_keepalive(&self, group_id: u32) -> Option<KeepAliveConfirmed> {
        self.with_groups(|groups| groups.get(&group_id).and_then(|r| r.last_keepalive))
    }

    /// Whether `lease` may still be acted on: its group's record is not lost, the lease is still
    /// held through this session, and the group's safe deadline has not passed.
    pub fn is_valid(&self, lease: &SessionLease) -> bool {
        let now = crate::time::now();
        self.with_groups(|groups| {
            groups.get(&lease.group_id).is_some_and(|record| {
                !record.lost
                    && now < record.safe_deadline
                    && record
                        .leases
                        .get(&lease.key)
                        .is_some_and(|held| held.lease_id == lease.lease_id)
            })
        })
    }

    /// The next group lost: waits until one is. Each lost group is reported once.
    pub async fn lost(&self) -> SessionLoss {
        let mut receiver = self.inner.losses_rx.lock().await;
        match receiver.recv().await {
            Some(loss) => loss,
            // The sender lives in `inner`, which this handle keeps alive.
            None => std::future::pending().await,
        }
    }

    /// Acquires `resource_id` bound to this session: opens the session in the resource's group
    /// first if it is not open there yet. The lease lives as long as the group's record.
    pub async fn acquire(
        &self,
        resource_id: impl Into<String>,
    ) -> Result<SessionLease, ClientError> {
        self.acquire_with(resource_id, None).await
    }

    /// [`Session::acquire`] with the request id to send (a retry with the same id returns the
    /// original outcome while it still stands); a new one when `None`.
    pub async fn acquire_with(
        &self,
        resource_id: impl Into<String>,
        request_id: Option<String>,
    ) -> Result<SessionLease, ClientError> {
        let (key, group_id) = self.open_for(resource_id.into()).await?;
        let body = RequestBody::Lease(LeaseOp::AcquireInSession(SessionAcquireRequest {
            key: key.clone(),
            holder_id: self.inner.owner_id.clone(),
            session_id: self.inner.session_id,
            request_id: request_id.unwrap_or_else(|| self.inner.client.new_request_id()),
        }));
        let result = match self.call(group_id, body).await? {
            ResponseBody::Lease(result) => result,
            _ => return Err(protocol("AcquireInSession")),
        };
        self.register_grant(key, group_id, result)
    }

    /// Acquires `resource_id` bound to this session, waiting up to `wait` in the resource's
    /// FIFO queue while someone else holds it (see [`Client::acquire_wait`]). The waiter is
    /// alive exactly while the session's record in the key's group is: if the session is lost
    /// while it waits, a hand-off skips it. The lease, once granted, lives as long as the
    /// session, like [`Session::acquire`]'s; its safe deadline is the session's.
    ///
    /// Errors: `ALREADY_HELD` with `WaitEnded` when the wait ran out or the session ended,
    /// `ALREADY_HELD` when this session's owner holds the resource already.
    pub async fn acquire_wait(
        &self,
        resource_id: impl Into<String>,
        wait: std::time::Duration,
        request_id: Option<String>,
    ) -> Result<SessionLease, ClientError> {
        let (key, group_id) = self.open_for(resource_id.into()).await?;
        let request_id = request_id.unwrap_or_else(|| self.inner.client.new_request_id());
        let lease = tenure_core::WaitLease::Session {
            session_id: self.inner.session_id,
        };
        let (result, _) = self
            .inner
            .client
            .wait_in_queue(&key, &self.inner.owner_id, lease, wait, &request_id)
            .await?;
        self.register_grant(key, group_id, result)
    }

    /// The key of `resource_id` and its group, with the session open there (opened now if it
    /// was not yet).
    async fn open_for(&self, resource_id: String) -> Result<(ResourceKey, u32), ClientError> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(ClientError::InvalidRequest("the session is closed".into()));
        }
        let key = ResourceKey::new(self.inner.tenant_id.clone(), resource_id);
        let group_id = self.inner.client.group_of(&key).await?;
        self.ensure_open(group_id).await?;
        Ok((key, group_id))
    }

    /// Files a grant of this session's (AcquireInSession or AcquireWait in the session) with
    /// the group's record, so its loss is reported with the session's.
    fn register_grant(
        &self,
        key: ResourceKey,
        group_id: u32,
        result: LeaseResult,
    ) -> Result<SessionLease, ClientError> {
        if result.group_id != group_id {
            return Err(ClientError::Protocol(format!(
                "AcquireInSession answered by group {}, not the key's group {group_id}",
                result.group_id
            )));
        }
        // A replayed grant counts only while it still stands (a retry answered after the
        // session's record ended, or after the lease was taken, names a lease that is gone).
        if result.replayed
            && result
                .replay
                .is_none_or(|replay| replay.status != tenure_core::ReplayStatus::Active)
        {
            return Err(ClientError::Server {
                code: ErrorCode::LeaseExpired,
                message: "the retried acquire's lease no longer stands".into(),
                retryable: false,
                lease_error: None,
                retry_after_ms: None,
            });
        }
        let LeaseReply::Acquired(grant) = result.reply else {
            return Err(protocol("AcquireInSession"));
        };
        let lease = SessionLease {
            key: key.clone(),
            lease_id: grant.lease_id,
            fencing_token: grant.fencing_token,
            group_id,
            log_time_ms: grant.log_time_ms,
            expires_at_ms: grant.expires_at_ms,
            replayed: result.replayed,
        };
        let registered = self.with_groups(|groups| match groups.get_mut(&group_id) {
            Some(record) if !record.lost => {
                record.leases.insert(key, lease.clone());
                true
            }
            _ => false,
        });
        if !registered {
            return Err(ClientError::Server {
                code: ErrorCode::LeaseExpired,
                message: format!("the session was lost in group {group_id} during the acquire"),
                retryable: false,
                lease_error: None,
                retry_after_ms: None,
            });
        }
        Ok(lease)
    }

    /// Releases one lease of the session now (the session stays open).
    pub async fn release(&self, lease: &SessionLease) -> Result<ReleaseReceipt, ClientError> {
        self.release_with(lease, None).await
    }

    /// [`Session::release`] with the request id to send (a new one when `None`).
    pub async fn release_with(
        &self,
        lease: &SessionLease,
        request_id: Option<String>,
    ) -> Result<ReleaseReceipt, ClientError> {
        let body = RequestBody::Lease(LeaseOp::Release(ReleaseRequest {
            key: lease.key.clone(),
            lease_id: lease.lease_id,
            holder_id: self.inner.owner_id.clone(),
            request_id: request_id.unwrap_or_else(|| self.inner.client.new_request_id()),
        }));
        match self.call(lease.group_id, body).await? {
            ResponseBody::Lease(LeaseResult {
                reply: LeaseReply::Released(receipt),
                ..
            }) => {
                self.with_groups(|groups| {
                    if let Some(record) = groups.get_mut(&lease.group_id) {
                        record.leases.remove(&lease.key);
                    }
                });
                Ok(receipt)
            }
            _ => Err(protocol("Release")),
        }
    }

    /// Closes the session in every group it is open in: its leases end at once. Stops the
    /// keep-alives first. Returns the receipt of each group closed here; the first failure is
    /// returned after every group was tried.
    pub async fn close(&self) -> Result<Vec<SessionReceipt>, ClientError> {
        let _ = self.inner.stop_tx.send(true);
        let groups: Vec<u32> = self.with_groups(|groups| {
            // Set under the groups' lock: an open registering concurrently sees it (see
            // `ensure_open`) or is listed here.
            self.inner.closed.store(true, Ordering::Release);
            groups
                .iter_mut()
                .filter(|(_, r)| !r.lost)
                .map(|(&g, r)| {
                    r.lost = true;
                    g
                })
                .collect()
        });
        let mut first_error = None;
        let mut receipts = Vec::new();
        for group_id in groups {
            let body = RequestBody::Lease(LeaseOp::SessionClose(self.request(group_id)));
            match self.call(group_id, body).await {
                Ok(ResponseBody::Lease(LeaseResult {
                    reply: LeaseReply::SessionClosed(receipt),
                    ..
                })) => receipts.push(receipt),
                // Already ended there: nothing left to close.
                Err(ClientError::Server {
                    code: ErrorCode::LeaseExpired | ErrorCode::NotFound,
                    ..
                }) => {}
                Ok(_) => first_error = first_error.or(Some(protocol("SessionClose"))),
                Err(error) => first_error = first_error.or(Some(error)),
            }
        }
        first_error.map_or(Ok(receipts), Err)
    }

    fn request(&self, group_id: u32) -> SessionRequest {
        SessionRequest {
            tenant_id: self.inner.tenant_id.clone(),
            group_id: GroupId(group_id),
            session_id: self.inner.session_id,
            owner_id: self.inner.owner_id.clone(),
        }
    }

    async fn call(&self, group_id: u32, body: RequestBody) -> Result<ResponseBody, ClientError> {
        self.inner
            .client
            .call(
                Some(group_id),
                body,
                RequestFlags::default(),
                Some(&self.inner.tenant_id),
            )
            .await
    }

    fn with_groups<T>(&self, f: impl FnOnce(&mut BTreeMap<u32, GroupRecord>) -> T) -> T {
        with_groups(&self.inner, f)
    }

    /// Opens the session's record in `group_id` unless it is open, and starts its keep-alive.
    async fn ensure_open(&self, group_id: u32) -> Result<(), ClientError> {
        if self.with_groups(|groups| groups.get(&group_id).is_some_and(|r| !r.lost)) {
            return Ok(());
        }
        let lock = {
            let mut locks = match self.inner.opening.lock() {
                Ok(locks) => locks,
                Err(poisoned) => poisoned.into_inner(),
            };
            locks.entry(group_id).or_default().clone()
        };
        let _opening = lock.lock().await;
        let state = self.with_groups(|groups| groups.get(&group_id).map(|r| r.lost));
        match state {
            Some(false) => return Ok(()),
            Some(true) => {
                // A session never comes back in a group where it ended.
                return Err(ClientError::Server {
                    code: ErrorCode::LeaseExpired,
                    message: format!("the session was lost in group {group_id}"),
                    retryable: false,
                    lease_error: None,
                    retry_after_ms: None,
                });
            }
            None => {}
        }
        let sent_at = crate::time::now();
        let body = RequestBody::Lease(LeaseOp::SessionOpen(SessionOpenRequest {
            tenant_id: self.inner.tenant_id.clone(),
            group_id: GroupId(group_id),
            session_id: self.inner.session_id,
            owner_id: self.inner.owner_id.clone(),
            ttl_ms: self.inner.ttl_ms,
        }));
        match self.call(group_id, body).await? {
            ResponseBody::Lease(result) if matches!(result.reply, LeaseReply::SessionKept(_)) => {}
            _ => return Err(protocol("SessionOpen")),
        }
        let window = self
            .inner
            .client
            .config()
            .safety
            .safe_window(self.inner.ttl_ms);
        // Registered under the groups' lock together with the `closed` check, so a concurrent
        // `close` either sees this group (and closes it) or is seen here.
        let registered = self.with_groups(|groups| {
            if self.inner.closed.load(Ordering::Acquire) {
                return false;
            }
            groups.insert(
                group_id,
                GroupRecord {
                    confirmed_sent_at: sent_at,
                    safe_deadline: sent_at + window,
                    leases: BTreeMap::new(),
                    lost: false,
                    last_keepalive: None,
                },
            );
            true
        });
        if !registered {
            // Closed while the open was on its way: close what it opened.
            let close = RequestBody::Lease(LeaseOp::SessionClose(self.request(group_id)));
            let _ = self.call(group_id, close).await;
            return Err(ClientError::InvalidRequest("the session is closed".into()));
        }
        let inner = Arc::downgrade(&self.inner);
        let stop = self.inner.stop_tx.subscribe();
        tokio::spawn(keep_group_alive(inner, group_id, stop));
        Ok(())
    }
}

/// How long a group's keep-alive batcher waits for more keep-alives after the first of a batch.
pub const KEEPALIVE_COALESCE: Duration = Duration::from_millis(20);
/// Most keep-alives in one Batch request.
pub const KEEPALIVE_BATCH_MAX: usize = tenure_proto::client::BATCH_OPS_MAX;
/// Keep-alives waiting in one group's batcher at most (beyond: the loop waits for room).
const KEEPALIVE_QUEUE: usize = 4_096;
/// Batch requests of one group's batcher in flight at once.
const KEEPALIVE_BATCHES_INFLIGHT_MAX: usize = 8;

impl Client {
    /// Sends one session keep-alive through its group's batcher (started on first use); waits
    /// for room (until `give_up_at`) when the batcher's queue is full.
    async fn send_keepalive(
        &self,
        group_id: u32,
        tenant_id: &str,
        op: LeaseOp,
        give_up_at: Instant,
    ) -> Result<LeaseResult, ClientError> {
        let queue = {
            let mut batchers = match self.inner.keepalive_batchers.lock() {
                Ok(batchers) => batchers,
                Err(poisoned) => poisoned.into_inner(),
            };
            batchers
                .entry((group_id, tenant_id.to_owned()))
                .or_insert_with(|| {
                    let (queue, items) = mpsc::channel(KEEPALIVE_QUEUE);
                    tokio::spawn(run_keepalive_batcher(
                        Arc::downgrade(&self.inner),
                        group_id,
                        tenant_id.to_owned(),
                        items,
                    ));
                    queue
                })
                .clone()
        };
        let (reply, answer) = tokio::sync::oneshot::channel();
        let item = KeepAliveItem {
            op,
            give_up_at,
            reply,
        };
        // A full queue (keep-alives are aligned, so a client with thousands of sessions fills
        // it at once) makes the loop wait for room, within its deadline, rather than send a
        // request of its own: the batcher drains it in Batch requests.
        let queued = match tokio::time::timeout_at(give_up_at.into(), queue.send(item)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(mpsc::error::SendError(item))) => Err(item),
            Err(_) => {
                return Err(ClientError::DeadlineExceeded {
                    timeout_ms: 0,
                    attempts: 0,
                    last: "the group's keep-alive queue stayed full until the deadline".into(),
                });
            }
        };
        match queued {
            Ok(()) => answer.await.unwrap_or_else(|_| Err(ClientError::Closed)),
            // The batcher is gone (its client is closing): a request of its own.
            Err(item) => {
                let counters = &self.inner.counters;
                counters.keepalive_requests.fetch_add(1, Ordering::Relaxed);
                counters.keepalives.fetch_add(1, Ordering::Relaxed);
                match self
                    .call_until(
                        Some(group_id),
                        RequestBody::Lease(item.op),
                        RequestFlags::default(),
                        Some(tenant_id),
                        give_up_at,
                    )
                    .await?
                {
                    ResponseBody::Lease(result) => Ok(result),
                    _ => Err(protocol("SessionKeepAlive")),
                }
            }
        }
    }
}

/// Collects one group's keep-alives into Batch requests: a batch closes
/// [`KEEPALIVE_COALESCE`] after its first keep-alive or at [`KEEPALIVE_BATCH_MAX`], and is sent
/// with the earliest deadline of its members (each retried unchanged: keep-alives are
/// idempotent). Stops when the client is gone.
async fn run_keepalive_batcher(
    inner: std::sync::Weak<crate::client::ClientInner>,
    group_id: u32,
    tenant_id: String,
    mut items: mpsc::Receiver<KeepAliveItem>,
) {
    let inflight = Arc::new(tokio::sync::Semaphore::new(KEEPALIVE_BATCHES_INFLIGHT_MAX));
    while let Some(first) = items.recv().await {
        let mut batch = vec![first];
        let window_end = tokio::time::Instant::now() + KEEPALIVE_COALESCE;
        while batch.len() < KEEPALIVE_BATCH_MAX {
            match tokio::time::timeout_at(window_end, items.recv()).await {
                Ok(Some(item)) => batch.push(item),
                Ok(None) | Err(_) => break,
            }
        }
        let Ok(permit) = inflight.clone().acquire_owned().await else {
            return;
        };
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let client = Client { inner };
        let tenant_id = tenant_id.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let deadline = batch
                .iter()
                .map(|item| item.give_up_at)
                .min()
                .unwrap_or_else(crate::time::now);
            let ops: Vec<LeaseOp> = batch.iter().map(|item| item.op.clone()).collect();
            let counters = &client.inner.counters;
            counters.keepalive_requests.fetch_add(1, Ordering::Relaxed);
            counters
                .keepalives
                .fetch_add(ops.len() as u64, Ordering::Relaxed);
            let answer = client
                .call_until(
                    Some(group_id),
                    RequestBody::Batch { ops },
                    RequestFlags::default(),
                    Some(&tenant_id),
                    deadline,
                )
                .await;
            match answer {
                Ok(ResponseBody::Batch(results)) if results.len() == batch.len() => {
                    for (item, result) in batch.into_iter().zip(results) {
                        let _ = item.reply.send(result.map_err(ClientError::from_wire));
                    }
                }
                Ok(_) => {
                    for item in batch {
                        let _ = item.reply.send(Err(protocol("a keep-alive Batch")));
                    }
                }
                Err(error) => {
                    for item in batch {
                        let _ = item.reply.send(Err(error.clone()));
                    }
                }
            }
        });
    }
}

fn with_groups<T>(inner: &SessionInner, f: impl FnOnce(&mut BTreeMap<u32, GroupRecord>) -> T) -> T {
    match inner.groups.lock() {
        Ok(mut groups) => f(&mut groups),
        Err(poisoned) => f(&mut poisoned.into_inner()),
    }
}

fn protocol(what: &str) -> ClientError {
    ClientError::Protocol(format!("{what} answered with another kind"))
}

/// Marks the group lost (once) and reports it with the leases it held.
fn report_loss(inner: &SessionInner, group_id: u32, reason: String) {
    let leases = with_groups(inner, |groups| match groups.get_mut(&group_id) {
        Some(record) if !record.lost => {
            record.lost = true;
            Some(std::mem::take(&mut record.leases).into_values().collect())
        }
        _ => None,
    });
    if let Some(leases) = leases {
        let _ = inner.losses_tx.send(SessionLoss {
            group_id,
            reason,
            leases,
        });
    }
}

/// The keep-alive loop of one group: one `SessionKeepAlive` a third of the ttl after the send
/// time of the last confirmed one, moved early onto the client's grid; retries until `loss_signal_lead` before the safe deadline,
/// then reports the group lost. Holds only a weak reference, so dropping the session stops it.
async fn keep_group_alive(
    inner: std::sync::Weak<SessionInner>,
    group_id: u32,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let Some(session) = inner.upgrade() else {
            return;
        };
        if *stop.borrow() {
            return;
        }
        let ttl = Duration::from_millis(session.ttl_ms);
        let config = session.client.config().clone();
        let lead = config.renew.loss_signal_lead.min(ttl / 10);
        let Some((confirmed_sent_at, safe_deadline)) = with_groups(&session, |groups| {
            groups
                .get(&group_id)
                .filter(|r| !r.lost)
                .map(|r| (r.confirmed_sent_at, r.safe_deadline))
        }) else {
            return;
        };
        // A third of the ttl after the last confirmed send, moved early onto the client's
        // keep-alive grid so that its sessions' keep-alives in this group share requests.
        let due = crate::keepalive::aligned_due(
            session.client.inner.keepalive_epoch,
            confirmed_sent_at + ttl / 3,
            ttl / 6,
        );
        let give_up_at = safe_deadline.checked_sub(lead).unwrap_or(safe_deadline);
        let client = session.client.clone();
        let request = SessionRequest {
            tenant_id: session.tenant_id.clone(),
            group_id: GroupId(group_id),
            session_id: session.session_id,
            owner_id: session.owner_id.clone(),
        };
        let tenant_id = session.tenant_id.clone();
        drop(session);
        let wait = due.saturating_duration_since(crate::time::now());
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.changed() => return,
        }
        // Retry until confirmed or until the loss must be signalled.
        loop {
            let now = crate::time::now();
            if now >= give_up_at {
                if let Some(session) = inner.upgrade() {
                    report_loss(
                        &session,
                        group_id,
                        "no keep-alive confirmed before the safe deadline".into(),
                    );
                }
                return;
            }
            let sent_at = now;
            if let Some(session) = inner.upgrade() {
                session.keepalives_sent.fetch_add(1, Ordering::Relaxed);
            }
            let op = LeaseOp::SessionKeepAlive(request.clone());
            let answer = tokio::select! {
                answer = client.send_keepalive(group_id, &tenant_id, op, give_up_at) => answer,
                _ = stop.changed() => return,
            };
            let Some(session) = inner.upgrade() else {
                return;
            };
            match answer {
                Ok(LeaseResult {
                    reply: LeaseReply::SessionKept(kept),
                    ..
                }) => {
                    session.keepalives_confirmed.fetch_add(1, Ordering::Relaxed);
                    let window = config.safety.safe_window(session.ttl_ms);
                    let confirmed_at = crate::time::now();
                    with_groups(&session, |groups| {
                        if let Some(record) = groups.get_mut(&group_id) {
                            record.confirmed_sent_at = sent_at;
                            record.safe_deadline = sent_at + window;
                            let count = record.last_keepalive.map_or(0, |k| k.count) + 1;
                            record.last_keepalive = Some(KeepAliveConfirmed {
                                count,
                                sent_at,
                                confirmed_at,
                                log_time_ms: kept.log_time_ms,
                                expires_at_ms: kept.expires_at_ms,
                                safe_deadline: sent_at + window,
                            });
                        }
                    });
                    break;
                }
                Err(ClientError::Server {
                    code: code @ (ErrorCode::LeaseExpired | ErrorCode::NotFound),
                    message,
                    ..
                }) => {
                    report_loss(&session, group_id, format!("{code}: {message}"));
                    return;
                }
                Ok(_) | Err(_) => {
                    drop(session);
                    let backoff = (ttl / 20).max(Duration::from_millis(20));
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = stop.changed() => return,
                    }
                }
            }
        }
    }
}
