//! [`Client`]: routes each call to its group's leader and retries safely. The calls that make
//! auto-renewing [`crate::Lease`] handles are in `lease`; connecting (and starting the renewer)
//! is in `connect`.
//!
//! Every call has an overall deadline (`call_timeout`) and an attempt cap; retries reuse the
//! request's `request_id`, so a request whose answer was lost is answered by the group's stored
//! outcome instead of being applied twice. `NOT_LEADER` updates the routing cache from the error's
//! leader hint and is retried at once (later ones after a backoff); a newer placement version or
//! an unreachable leader refreshes the routing table from any node; while no leader is known the
//! request goes to any node with `forward` set.
//!
//! Must not depend on: the lease handle (`lease`), the renewal schedule (`renewer`) or
//! connecting (`connect`), nor any server crate. It talks to the renewer only through
//! `handle`'s commands.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use rand::Rng as _;
use rand::rngs::SmallRng;
use tenure_core::{
    AcquireRequest, ErrorCode, LeaseGrant, LeaseId, LeaseOp, LeaseReply, ListPage, ListRequest,
    ReleaseReceipt, ReleaseRequest, RenewRequest, ReplayState, ReplayStatus, ResourceKey,
    TransferRequest,
};
use tenure_proto::client::{
    FenceCheckResult, GetResult, GroupMembers, LeaseResult, NodeStatus, Principal, Request,
    RequestBody, RequestFlags, ResponseBody, RoutingTable, WireError,
};
use tokio::sync::mpsc;
use tracing::debug;

use crate::config::{ClientConfig, Credentials};
use crate::error::ClientError;
use crate::handle::RenewerCommand;
use crate::link::{FaultInjector, LinkError, LinkSettings, NodeLink};
use crate::routing::{NodeInfo, RoutingState};

/// A successful Acquire or Renew, with the client-side safe deadline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The resource.
    pub key: ResourceKey,
    /// The holder.
    pub holder_id: String,
    /// The lease.
    pub lease_id: LeaseId,
    /// Its fencing token: pass it to every system the holder writes to.
    pub fencing_token: u64,
    /// The ttl the server granted (exactly the one requested).
    pub ttl_ms: u64,
    /// Log time of the grant or renewal.
    pub log_time_ms: u64,
    /// Log time at which the lease expires unless renewed.
    pub expires_at_ms: u64,
    /// The group that decided.
    pub group_id: u32,
    /// True when the request id had been seen and this is the stored outcome of an earlier
    /// attempt (a retry after a lost answer).
    pub replayed: bool,
    /// The request id the operation was sent with.
    pub request_id: String,
    /// Local monotonic time at which the request was first sent.
    pub sent_at: Instant,
    /// The holder may act until this instant (contract section 5): `sent_at + ttl * (1 -
    /// max_drift) - margin`. Past it, another holder may already have the resource.
    ///
    /// A replayed answer (the stored outcome of an earlier attempt with the same request id, made
    /// any time before) counts from what was left of the original grant when the retry was
    /// answered, never from its full ttl: `sent_at + remaining * (1 - max_drift) - margin`,
    /// with `remaining` the server's [`Grant::remaining_ttl_ms`] (the retry was answered after
    /// `sent_at`). Once the lease has ended (released, expired, taken over) that is zero and the
    /// grant has no window (`safe_deadline == sent_at`).
    pub safe_deadline: Instant,
    /// What was left of the grant when the server answered: `ttl_ms` for a fresh grant; for a
    /// replay, the remaining ttl of the original grant at the retry's log time (zero once its
    /// lease ended; see [`Grant::replay`]).
    pub remaining_ttl_ms: u64,
    /// For a replay: how the original grant stood when the retry was answered.
    pub replay: Option<ReplayState>,
}

/// A successful transfer: the lease that ended and the new holder's grant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transferred {
    /// The previous holder's lease, ended at the transfer's log time.
    pub released: ReleaseReceipt,
    /// The new holder's lease (its `holder_id` is the new holder), with a safe deadline counted
    /// from the transfer's send time.
    pub grant: Grant,
}

/// The ttl a grant's safe window counts from: the full ttl of a fresh grant; for a replay, what
/// was left of the original grant when the retry was answered (contract 3.4), zero once its
/// lease ended, and zero for a replay that does not say (a server that predates replay states:
/// the original attempt may be arbitrarily old).
pub(crate) fn replayed_window_ttl_ms(
    grant: &LeaseGrant,
    replayed: bool,
    replay: Option<ReplayState>,
) -> u64 {
    match (replayed, replay) {
        (false, _) => grant.ttl_ms,
        (true, Some(replay)) if replay.status == ReplayStatus::Active => {
            replay.remaining_ttl_ms.min(grant.ttl_ms)
        }
        (true, _) => 0,
    }
}

impl Grant {
    /// True while the safe deadline has not passed.
    pub fn is_safe_now(&self) -> bool {
        crate::time::now() < self.safe_deadline
    }
}

/// Options of an acquire.
#[derive(Debug, Clone)]
pub struct AcquireOptions {
    /// The resource.
    pub key: ResourceKey,
    /// Who asks.
    pub holder_id: String,
    /// Requested ttl (within the cluster's bounds, never raised by the server).
    pub ttl: Duration,
    /// Request id for deduplication; `None` generates a unique one. Set it to make an acquire
    /// that the caller itself retries (after a crash, say) return the original outcome; such a
    /// replayed grant's safe window counts only what was left of the original grant (see
    /// [`Grant::safe_deadline`]).
    pub request_id: Option<String>,
    /// Renew automatically (default). Without it the handle only reports and releases.
    pub auto_renew: bool,
}

impl AcquireOptions {
    /// Options with defaults: generated request id, automatic renewal.
    pub fn new(
        tenant_id: impl Into<String>,
        resource_id: impl Into<String>,
        holder_id: impl Into<String>,
        ttl: Duration,
    ) -> Self {
        AcquireOptions {
            key: ResourceKey::new(tenant_id, resource_id),
            holder_id: holder_id.into(),
            ttl,
            request_id: None,
            auto_renew: true,
        }
    }

    /// Sets the request id.
    pub fn request_id(mut self, request_id: impl Into<String>) -> Self {
        self.request_id = Some(request_id.into());
        self
    }

    /// Turns automatic renewal off.
    pub fn without_auto_renew(mut self) -> Self {
        self.auto_renew = false;
        self
    }
}

/// A snapshot of the client's routing cache.
#[derive(Debug, Clone)]
pub struct RoutingSnapshot {
    /// Version of the placement map.
    pub placement_version: u64,
    /// Number of groups.
    pub groups: u32,
    /// Leader of each group (index = group id) and the term it was seen in.
    pub leaders: Vec<(Option<u64>, u64)>,
    /// The nodes.
    pub nodes: Vec<NodeInfo>,
}

/// Counters of what the client did (for tests, benchmarks and dashboards).
#[derive(Debug, Default)]
pub(crate) struct ClientCounters {
    pub requests_sent: AtomicU64,
    pub retries: AtomicU64,
    pub routing_refreshes: AtomicU64,
    pub renew_batches: AtomicU64,
    pub renewals: AtomicU64,
    pub leases_at_risk_total: AtomicU64,
    pub keepalive_requests: AtomicU64,
    pub keepalives: AtomicU64,
}

/// A copy of the client's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientStats {
    /// Request attempts sent (retries included; a Batch counts once).
    pub requests_sent: u64,
    /// Attempts that were retries.
    pub retries: u64,
    /// Routing tables fetched.
    pub routing_refreshes: u64,
    /// Batch requests sent by the renewer.
    pub renew_batches: u64,
    /// Renewals those batches carried.
    pub renewals: u64,
    /// Lease handles the renewer keeps alive now.
    pub leases_held: u64,
    /// Of those, the handles at risk now ([`crate::Lease::at_risk`]: renewal overdue, loss not
    /// yet signalled). Above zero, renewals are not keeping up: the cluster or this process is
    /// overloaded, or the network is failing; a loss signal may follow.
    pub leases_at_risk: u64,
    /// Times a handle became at risk, since the client started.
    pub leases_at_risk_total: u64,
    /// Requests that carried sessions' keep-alives (a Batch of coalesced keep-alives, or one
    /// sent on its own), first attempts only.
    pub keepalive_requests: u64,
    /// Keep-alives those requests carried.
    pub keepalives: u64,
}

pub(crate) struct ClientInner {
    pub(crate) config: ClientConfig,
    pub(crate) endpoint: quinn::Endpoint,
    pub(crate) strict_tls: quinn::ClientConfig,
    pub(crate) link_settings: LinkSettings,
    pub(crate) routing: RwLock<RoutingState>,
    pub(crate) links: Mutex<BTreeMap<u64, Arc<NodeLink>>>,
    pub(crate) bootstrap_links: Vec<Arc<NodeLink>>,
    pub(crate) refresh: tokio::sync::Mutex<Option<Instant>>,
    pub(crate) client_id: u64,
    pub(crate) next_request: AtomicU64,
    pub(crate) next_node: AtomicUsize,
    pub(crate) rng: Mutex<SmallRng>,
    pub(crate) renewer: mpsc::Sender<RenewerCommand>,
    pub(crate) counters: ClientCounters,
    pub(crate) leases_held: AtomicU64,
    pub(crate) leases_at_risk: AtomicU64,
    pub(crate) faults: Arc<FaultInjector>,
    pub(crate) closed: AtomicBool,
    /// One keep-alive batcher per (group, tenant): sessions' keep-alives of one group that fall
    /// due together go in one Batch request (`crate::session`).
    pub(crate) keepalive_batchers: Mutex<BTreeMap<(u32, String), crate::keepalive::KeepAliveQueue>>,
    /// The origin of the grid keep-alives are aligned to (`crate::keepalive::aligned_due`).
    pub(crate) keepalive_epoch: std::time::Instant,
}

/// The tenure client. Cheap to clone; clones share connections, routing and the renewer.
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<ClientInner>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("client_id", &format_args!("{:016x}", self.inner.client_id))
            .finish_non_exhaustive()
    }
}

/// Where an attempt goes.
struct Target {
    link: Arc<NodeLink>,
    forward: bool,
}

impl Client {
    /// The configuration in use.
    pub fn config(&self) -> &ClientConfig {
        &self.inner.config
    }

    /// Test hooks (feature `fault-injection`).
    #[cfg(feature = "fault-injection")]
    pub fn faults(&self) -> &FaultInjector {
        &self.inner.faults
    }

    /// What the client did so far.
    pub fn stats(&self) -> ClientStats {
        let c = &self.inner.counters;
        ClientStats {
            requests_sent: c.requests_sent.load(Ordering::Relaxed),
            retries: c.retries.load(Ordering::Relaxed),
            routing_refreshes: c.routing_refreshes.load(Ordering::Relaxed),
            renew_batches: c.renew_batches.load(Ordering::Relaxed),
            renewals: c.renewals.load(Ordering::Relaxed),
            leases_held: self.inner.leases_held.load(Ordering::Relaxed),
            leases_at_risk: self.inner.leases_at_risk.load(Ordering::Relaxed),
            leases_at_risk_total: c.leases_at_risk_total.load(Ordering::Relaxed),
            keepalive_requests: c.keepalive_requests.load(Ordering::Relaxed),
            keepalives: c.keepalives.load(Ordering::Relaxed),
        }
    }

    /// Acquires without a handle: nothing renews or releases the lease afterwards (for tools
    /// such as `tenurectl`, and for callers that manage renewal themselves).
    pub async fn acquire_grant(&self, options: AcquireOptions) -> Result<Grant, ClientError> {
        let ttl_ms = u64::try_from(options.ttl.as_millis()).unwrap_or(u64::MAX);
        let request_id = options.request_id.unwrap_or_else(|| self.new_request_id());
        let sent_at = crate::time::now();
        let body = RequestBody::Lease(LeaseOp::Acquire(AcquireRequest {
            key: options.key.clone(),
            holder_id: options.holder_id.clone(),
            ttl_ms,
            request_id: request_id.clone(),
        }));
        let result = self.lease_call(&options.key, body).await?;
        self.grant_from(options.key, options.holder_id, request_id, sent_at, result)
    }

    /// Renews a lease once (a handle does this by itself).
    pub async fn renew(
        &self,
        key: ResourceKey,
        lease_id: LeaseId,
        holder_id: impl Into<String>,
        ttl: Duration,
        request_id: Option<String>,
    ) -> Result<Grant, ClientError> {
        let holder_id = holder_id.into();
        let request_id = request_id.unwrap_or_else(|| self.new_request_id());
        let sent_at = crate::time::now();
        let body = RequestBody::Lease(LeaseOp::Renew(RenewRequest {
            key: key.clone(),
            lease_id,
            holder_id: holder_id.clone(),
            ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
            request_id: request_id.clone(),
        }));
        let result = self.lease_call(&key, body).await?;
        self.grant_from(key, holder_id, request_id, sent_at, result)
    }

    /// Releases a lease.
    pub async fn release(
        &self,
        key: ResourceKey,
        lease_id: LeaseId,
        holder_id: impl Into<String>,
        request_id: Option<String>,
    ) -> Result<ReleaseReceipt, ClientError> {
        let body = RequestBody::Lease(LeaseOp::Release(ReleaseRequest {
            key: key.clone(),
            lease_id,
            holder_id: holder_id.into(),
            request_id: request_id.unwrap_or_else(|| self.new_request_id()),
        }));
        match self.lease_call(&key, body).await?.reply {
            LeaseReply::Released(receipt) => {
                self.note_released(receipt.lease_id).await;
                Ok(receipt)
            }
            other => Err(ClientError::Protocol(format!(
                "Release answered with {other:?}"
            ))),
        }
    }

    /// Hands the lease `lease_id` of `holder_id` to `new_holder_id` in one step: the old lease
    /// ends and the new holder's begins in the same log entry, so nobody else can take the
    /// resource in between. The new lease has a new id and a fencing token above every earlier
    /// one, and `ttl` counted from the transfer. A handle of the old lease in this client stops
    /// renewing it.
    ///
    /// The returned [`Transferred::grant`] is the new holder's, with a safe deadline counted
    /// from this call's send time: a new holder in this process can keep it with
    /// [`Client::adopt_grant`]; one elsewhere takes it over with [`Client::adopt`].
    pub async fn transfer(
        &self,
        key: ResourceKey,
        lease_id: LeaseId,
        holder_id: impl Into<String>,
        new_holder_id: impl Into<String>,
        ttl: Duration,
        request_id: Option<String>,
    ) -> Result<Transferred, ClientError> {
        let new_holder_id = new_holder_id.into();
        let request_id = request_id.unwrap_or_else(|| self.new_request_id());
        let sent_at = crate::time::now();
        let body = RequestBody::Lease(LeaseOp::Transfer(TransferRequest {
            key: key.clone(),
            lease_id,
            holder_id: holder_id.into(),
            new_holder_id: new_holder_id.clone(),
            ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
            request_id: request_id.clone(),
        }));
        let result = self.lease_call(&key, body).await?;
        let LeaseReply::Transferred(receipt) = &result.reply else {
            return Err(ClientError::Protocol(format!(
                "Transfer answered with {:?}",
                result.reply
            )));
        };
        let released = receipt.released.clone();
        self.note_released(released.lease_id).await;
        let grant = self.grant_from(key, new_holder_id, request_id, sent_at, result)?;
        Ok(Transferred { released, grant })
    }

    /// Reads a resource's lease from its group's leader (linearizable).
    pub async fn get(&self, key: &ResourceKey) -> Result<GetResult, ClientError> {
        self.get_with(key, false).await
    }

    /// Reads a resource's lease; with `stale_read`, any replica may answer from its applied
    /// state ([`GetResult::stale`] says when it did).
    pub async fn get_with(
        &self,
        key: &ResourceKey,
        stale_read: bool,
    ) -> Result<GetResult, ClientError> {
        let group = self.group_of(key).await?;
        let flags = RequestFlags {
            stale_read,
            ..RequestFlags::default()
        };
        let body = RequestBody::Get { key: key.clone() };
        match self
            .call(Some(group), body, flags, Some(&key.tenant_id))
            .await?
        {
            ResponseBody::Get(result) => Ok(result),
            _ => Err(ClientError::Protocol(
                "Get answered with another kind".into(),
            )),
        }
    }

    /// Whether `fencing_token` is the resource's current active grant, answered linearizably by
    /// the group's leader (Chubby's CheckSequencer): for a downstream system that cannot store
    /// tokens, which asks before accepting a holder's write and refuses it unless
    /// [`FenceVerdict::current`](tenure_core::FenceVerdict::current). Never answered from a
    /// follower's state.
    pub async fn check_fence(
        &self,
        key: &ResourceKey,
        fencing_token: u64,
    ) -> Result<FenceCheckResult, ClientError> {
        let body = RequestBody::CheckFence {
            key: key.clone(),
            fencing_token,
        };
        match self.keyed_call(key, body).await? {
            ResponseBody::FenceChecked(result) => Ok(result),
            _ => Err(ClientError::Protocol(
                "CheckFence answered with another kind".into(),
            )),
        }
    }

    /// One page of a tenant's leases in one group (a tenant's leases spread over every group;
    /// [`Client::list_all`] walks them).
    pub async fn list(&self, group_id: u32, request: ListRequest) -> Result<ListPage, ClientError> {
        let tenant = request.tenant_id.clone();
        let body = RequestBody::List { group_id, request };
        match self
            .call(Some(group_id), body, RequestFlags::default(), Some(&tenant))
            .await?
        {
            ResponseBody::List(page) => Ok(page),
            _ => Err(ClientError::Protocol(
                "List answered with another kind".into(),
            )),
        }
    }

    /// Up to `limit` of a tenant's leases (optionally of one status), walking every group.
    pub async fn list_all(
        &self,
        tenant_id: &str,
        status: Option<tenure_core::LeaseStatus>,
        limit: usize,
    ) -> Result<Vec<tenure_core::LeaseView>, ClientError> {
        let groups = self.routing().groups;
        let mut leases = Vec::new();
        for group in 0..groups {
            let mut page_token = None;
            loop {
                if leases.len() >= limit {
                    return Ok(leases);
                }
                let page_size = u32::try_from((limit - leases.len()).min(1_000)).unwrap_or(1_000);
                let page = self
                    .list(
                        group,
                        ListRequest {
                            tenant_id: tenant_id.to_string(),
                            page_size,
                            page_token: page_token.take(),
                            status,
                        },
                    )
                    .await?;
                let empty = page.leases.is_empty();
                leases.extend(page.leases);
                match page.next_page_token {
                    // An empty page that still names a next one would never end the walk.
                    Some(token) if !empty => page_token = Some(token),
                    _ => break,
                }
            }
        }
        leases.truncate(limit);
        Ok(leases)
    }

    /// Several lease operations of one group in one request and one log entry; one result per
    /// operation, in order. All keys must map to the same group.
    pub async fn batch(
        &self,
        ops: Vec<LeaseOp>,
    ) -> Result<Vec<Result<LeaseResult, ClientError>>, ClientError> {
        let first = ops
            .first()
            .ok_or_else(|| ClientError::InvalidRequest("an empty batch".into()))?;
        let tenant = first.tenant_id().to_owned();
        let group = self.group_of_op(first).await?;
        for op in &ops {
            if self.group_of_op(op).await? != group {
                return Err(ClientError::InvalidRequest(format!(
                    "a batch must stay in one group: a {} is not in group {group}",
                    op.kind_name()
                )));
            }
        }
        self.batch_in_group(group, &tenant, ops).await
    }

    pub(crate) async fn batch_in_group(
        &self,
        group: u32,
        tenant: &str,
        ops: Vec<LeaseOp>,
    ) -> Result<Vec<Result<LeaseResult, ClientError>>, ClientError> {
        let count = ops.len();
        match self
            .call(
                Some(group),
                RequestBody::Batch { ops },
                RequestFlags::default(),
                Some(tenant),
            )
            .await?
        {
            ResponseBody::Batch(results) if results.len() == count => {
                for result in results.iter().flatten() {
                    if let Some(ended) = result.reply.ended() {
                        self.note_released(ended.lease_id).await;
                    }
                }
                Ok(results
                    .into_iter()
                    .map(|result| result.map_err(ClientError::from_wire))
                    .collect())
            }
            _ => Err(ClientError::Protocol(
                "Batch answered with another kind or count".into(),
            )),
        }
    }

    /// The status of one node (roles, terms, log indexes, replication lag of its groups).
    pub async fn node_status(&self, node_id: u64) -> Result<NodeStatus, ClientError> {
        let link = self
            .link_for(node_id)
            .ok_or_else(|| ClientError::InvalidRequest(format!("node {node_id} is unknown")))?;
        let deadline = crate::time::now() + self.inner.config.attempt_timeout;
        match self
            .send(
                &link,
                RequestBody::Status,
                RequestFlags::default(),
                None,
                deadline,
            )
            .await
        {
            Ok(Ok(ResponseBody::Status(status))) => Ok(status),
            Ok(Ok(_)) => Err(ClientError::Protocol(
                "Status answered with another kind".into(),
            )),
            Ok(Err(error)) => Err(ClientError::from_wire(error)),
            Err(error) => Err(ClientError::NoNodeReachable(error.to_string())),
        }
    }

    /// A group's replica set as its leader sees it: voters (both sets during a joint change),
    /// learners, leader, term, each follower's progress. Needs no authentication.
    pub async fn group_members(&self, group_id: u32) -> Result<GroupMembers, ClientError> {
        let body = RequestBody::GroupMembers { group_id };
        match self
            .call(Some(group_id), body, RequestFlags::default(), None)
            .await?
        {
            ResponseBody::Members(members) => Ok(members),
            _ => Err(ClientError::Protocol(
                "GroupMembers answered with another kind".into(),
            )),
        }
    }

    /// Cluster operators: moves the group's replica on node `from` to node `to` (the group's
    /// leader adds `to` as a learner, waits until it caught up, changes the voters by joint
    /// consensus and drops `from`'s replica) and waits until it is done, at most `wait`. The
    /// same request is repeated while the move runs (the leader joins it to the running one), so
    /// a leader change or a lost answer never starts a second move; a finished move answers the
    /// same replica set again.
    pub async fn move_replica(
        &self,
        group_id: u32,
        from: u64,
        to: u64,
        wait: Duration,
    ) -> Result<GroupMembers, ClientError> {
        let body = RequestBody::MoveReplica { group_id, from, to };
        let deadline = crate::time::now() + wait;
        loop {
            let attempt_deadline =
                deadline.min(crate::time::now() + self.inner.config.call_timeout);
            // An operator call names no tenant; in insecure development mode the claimed
            // principal carries an empty one.
            let answer = self
                .call_until(
                    Some(group_id),
                    body.clone(),
                    RequestFlags::default(),
                    Some(""),
                    attempt_deadline,
                )
                .await;
            match answer {
                Ok(ResponseBody::Members(members)) => return Ok(members),
                Ok(_) => {
                    return Err(ClientError::Protocol(
                        "MoveReplica answered with another kind".into(),
                    ));
                }
                Err(error) if error.is_retryable() && crate::time::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// The cluster's node table (ids, addresses, states, revoked certificates, preferred
    /// leaders) as the metadata group's leader knows it.
    pub async fn cluster_nodes(&self) -> Result<tenure_core::ClusterMeta, ClientError> {
        match self
            .call(
                Some(tenure_core::METADATA_GROUP.0),
                RequestBody::ClusterNodes,
                RequestFlags::default(),
                None,
            )
            .await?
        {
            // Without a table (version 0) a node answers with its founder pins, not a table.
            ResponseBody::Cluster(meta) if meta.version == 0 => {
                Ok(tenure_core::ClusterMeta::default())
            }
            ResponseBody::Cluster(meta) => Ok(meta),
            _ => Err(ClientError::Protocol(
                "ClusterNodes answered with another kind".into(),
            )),
        }
    }

    /// Cluster operators: changes the node table (`AddNode`, `SetState` to drain a node or take
    /// the drain back, `Remove`). Repeating a change that was applied is a no-op
    /// (`changed: false`), so a lost answer is retried safely.
    pub async fn cluster_change(
        &self,
        op: tenure_core::ClusterOp,
    ) -> Result<tenure_core::ClusterChange, ClientError> {
        let deadline = crate::time::now() + self.inner.config.call_timeout;
        match self
            .call_until(
                Some(tenure_core::METADATA_GROUP.0),
                RequestBody::ClusterChange(op),
                RequestFlags::default(),
                Some(""),
                deadline,
            )
            .await?
        {
            ResponseBody::ClusterChanged(change) => Ok(change),
            _ => Err(ClientError::Protocol(
                "ClusterChange answered with another kind".into(),
            )),
        }
    }

    /// The group a key belongs to (from the cached placement map).
    /// The group an operation goes to: its key's, or the group a session operation names.
    pub async fn group_of_op(&self, op: &LeaseOp) -> Result<u32, ClientError> {
        match (op.key(), op.parts().group_id) {
            (Some(key), _) => self.group_of(key).await,
            (None, Some(group)) => Ok(group.0),
            (None, None) => Err(ClientError::InvalidRequest(
                "an operation with neither a key nor a group".into(),
            )),
        }
    }

    /// The group a key belongs to (from the routing cache, refreshed when it has no map).
    pub async fn group_of(&self, key: &ResourceKey) -> Result<u32, ClientError> {
        if let Some(group) = self.read_routing(|r| r.group_of(&key.tenant_id, &key.resource_id)) {
            return Ok(group);
        }
        self.refresh_routing().await?;
        self.read_routing(|r| r.group_of(&key.tenant_id, &key.resource_id))
            .ok_or_else(|| ClientError::NoNodeReachable("no placement map".into()))
    }

    /// A snapshot of the routing cache.
    pub fn routing(&self) -> RoutingSnapshot {
        self.read_routing(|routing| RoutingSnapshot {
            placement_version: routing.placement_version(),
            groups: routing.groups(),
            leaders: routing
                .leaders()
                .iter()
                .map(|entry| (entry.leader, entry.term))
                .collect(),
            nodes: routing.nodes().cloned().collect(),
        })
    }

    /// Asks every node (suspected ones last) for its routing table at once, merges each answer
    /// as it arrives (a group's leader is taken only from a term at least as new as the known
    /// one), and returns when the first answer is merged; later answers are merged in the
    /// background.
    pub async fn refresh_routing(&self) -> Result<(), ClientError> {
        let mut links = self.all_links();
        links.sort_by_key(|link| link.is_suspect());
        let (answers, mut answered) = mpsc::channel::<Result<(), ClientError>>(links.len().max(1));
        for link in links {
            let client = self.clone();
            let answers = answers.clone();
            tokio::spawn(async move {
                let deadline = crate::time::now() + client.inner.config.attempt_timeout;
                let outcome = match client
                    .send(
                        &link,
                        RequestBody::Routing,
                        RequestFlags::default(),
                        None,
                        deadline,
                    )
                    .await
                {
                    Ok(Ok(ResponseBody::Routing(table))) => {
                        link.set_suspect(false);
                        client.apply_routing(&table)
                    }
                    Ok(Ok(other)) => Err(ClientError::Protocol(format!(
                        "Routing answered with {}",
                        other.kind_name()
                    ))),
                    Ok(Err(error)) => Err(ClientError::from_wire(error)),
                    Err(LinkError::Final(error)) => Err(error),
                    Err(error) => {
                        link.set_suspect(true);
                        Err(ClientError::NoNodeReachable(error.to_string()))
                    }
                };
                let _ = answers.send(outcome).await;
            });
        }
        drop(answers);
        let mut last = ClientError::NoNodeReachable("no endpoint".to_string());
        while let Some(outcome) = answered.recv().await {
            match outcome {
                Ok(()) => return Ok(()),
                // A refusal (a bad token, say) is worth more than "unreachable".
                Err(error) if !error.is_retryable() || last.is_retryable() => last = error,
                Err(_) => {}
            }
        }
        Err(last)
    }

    /// Releases every lease handle's lease (best effort, bounded by the attempt timeout), stops
    /// renewing, and closes the connections. Calls made afterwards fail with
    /// [`ClientError::Closed`].
    pub async fn close(&self) {
        let (done, finished) = tokio::sync::oneshot::channel();
        if self
            .inner
            .renewer
            .send(RenewerCommand::Shutdown { done })
            .await
            .is_ok()
        {
            let _ = tokio::time::timeout(self.inner.config.attempt_timeout, finished).await;
        }
        self.inner.closed.store(true, Ordering::SeqCst);
        for link in self.all_links() {
            link.close().await;
        }
        self.inner.endpoint.close(0u32.into(), b"client closed");
    }

    // ----- internals -----

    /// Tells the renewer a lease was released through this client, so no handle of it stays
    /// valid.
    async fn note_released(&self, lease_id: LeaseId) {
        let _ = self
            .inner
            .renewer
            .send(RenewerCommand::Released { lease_id })
            .await;
    }

    pub(crate) fn new_request_id(&self) -> String {
        format!(
            "c{:016x}-{}",
            self.inner.client_id,
            self.inner.next_request.fetch_add(1, Ordering::Relaxed)
        )
    }

    fn read_routing<T>(&self, read: impl FnOnce(&RoutingState) -> T) -> T {
        match self.inner.routing.read() {
            Ok(routing) => read(&routing),
            Err(poisoned) => read(&poisoned.into_inner()),
        }
    }

    fn write_routing<T>(&self, write: impl FnOnce(&mut RoutingState) -> T) -> T {
        match self.inner.routing.write() {
            Ok(mut routing) => write(&mut routing),
            Err(poisoned) => write(&mut poisoned.into_inner()),
        }
    }

    fn apply_routing(&self, table: &RoutingTable) -> Result<(), ClientError> {
        self.inner
            .counters
            .routing_refreshes
            .fetch_add(1, Ordering::Relaxed);
        self.write_routing(|routing| routing.apply_table(table))
            .map_err(ClientError::Protocol)
    }

    /// Refreshes routing unless another task did within the minimum interval.
    async fn refresh_routing_soon(&self) {
        // Another call is refreshing already: do not queue behind it.
        let Ok(mut last) = self.inner.refresh.try_lock() else {
            return;
        };
        if last.is_some_and(|at| {
            crate::time::elapsed(at) < self.inner.config.routing_refresh_min_interval
        }) {
            return;
        }
        if let Err(error) = self.refresh_routing().await {
            debug!("routing refresh failed: {error}");
        }
        *last = Some(crate::time::now());
    }

    fn link_for(&self, node_id: u64) -> Option<Arc<NodeLink>> {
        let addr = self.read_routing(|routing| routing.node(node_id).map(|node| node.addr));
        if let Ok(links) = self.inner.links.lock() {
            if let Some(link) = links.get(&node_id) {
                // A node that moved to another address gets a new link.
                if addr.is_none_or(|addr| addr == link.addr) {
                    return Some(link.clone());
                }
            }
        }
        let addr = addr?;
        let link = Arc::new(NodeLink::new(
            Some(node_id),
            addr,
            self.inner.endpoint.clone(),
            self.inner.strict_tls.clone(),
            self.inner.link_settings.clone(),
            self.inner.faults.clone(),
        ));
        let mut links = self.inner.links.lock().ok()?;
        let current = links.entry(node_id).or_insert_with(|| link.clone());
        if current.addr != addr {
            *current = link;
        }
        Some(current.clone())
    }

    /// Known nodes first (by id), then endpoints of unknown id.
    fn all_links(&self) -> Vec<Arc<NodeLink>> {
        let ids: Vec<u64> = self.read_routing(|r| r.nodes().map(|n| n.node_id).collect());
        let mut links: Vec<Arc<NodeLink>> =
            ids.iter().filter_map(|&id| self.link_for(id)).collect();
        // Once a node table version is known, a node it no longer lists is not asked.
        let table_known = self.read_routing(|r| r.nodes_version() > 0);
        if let Ok(known) = self.inner.links.lock() {
            for (id, link) in known.iter() {
                if !table_known && !ids.contains(id) {
                    links.push(link.clone());
                }
            }
        }
        links.extend(self.inner.bootstrap_links.iter().cloned());
        links
    }

    fn pick_target(&self, group: Option<u32>, avoid: Option<SocketAddr>) -> Option<Target> {
        if let Some(group) = group {
            if let Some((leader, addr)) =
                self.read_routing(|r| r.leader(group).map(|node| (node.node_id, node.addr)))
            {
                if let Some(link) = self.link_for(leader) {
                    if Some(addr) != avoid && !link.is_suspect() {
                        return Some(Target {
                            link,
                            forward: false,
                        });
                    }
                }
            }
        }
        // No usable leader: any node, forwarding; nodes that failed recently last.
        let links = self.all_links();
        if links.is_empty() {
            return None;
        }
        let start = self.inner.next_node.fetch_add(1, Ordering::Relaxed);
        let rotated = || (0..links.len()).map(|i| links[(start + i) % links.len()].clone());
        let link = rotated()
            .find(|link| Some(link.addr) != avoid && !link.is_suspect())
            .or_else(|| rotated().find(|link| Some(link.addr) != avoid))
            .unwrap_or_else(|| links[start % links.len()].clone());
        Some(Target {
            link,
            forward: group.is_some(),
        })
    }

    fn principal_for(&self, tenant: Option<&str>) -> Option<Principal> {
        match (&self.inner.config.credentials, tenant) {
            (Credentials::InsecureDev { principal_id }, Some(tenant)) => Some(Principal {
                principal_id: principal_id.clone(),
                tenant_id: tenant.to_string(),
            }),
            _ => None,
        }
    }

    async fn send(
        &self,
        link: &NodeLink,
        body: RequestBody,
        flags: RequestFlags,
        tenant: Option<&str>,
        deadline: Instant,
    ) -> Result<Result<ResponseBody, WireError>, LinkError> {
        self.inner
            .counters
            .requests_sent
            .fetch_add(1, Ordering::Relaxed);
        let request = Request {
            id: 0,
            timeout_ms: 0,
            flags,
            principal: self.principal_for(tenant),
            body,
        };
        link.call(request, deadline).await
    }

    /// A request about `key`, sent to its group's leader with the default flags.
    async fn keyed_call(
        &self,
        key: &ResourceKey,
        body: RequestBody,
    ) -> Result<ResponseBody, ClientError> {
        let group = self.group_of(key).await?;
        self.call(
            Some(group),
            body,
            RequestFlags::default(),
            Some(&key.tenant_id),
        )
        .await
    }

    async fn lease_call(
        &self,
        key: &ResourceKey,
        body: RequestBody,
    ) -> Result<LeaseResult, ClientError> {
        match self.keyed_call(key, body).await? {
            ResponseBody::Lease(result) => Ok(result),
            _ => Err(ClientError::Protocol(
                "a lease operation answered with another kind".into(),
            )),
        }
    }

    /// A grant from an answer sent at `sent_at`; a replayed answer's window counts only what was
    /// left of the original grant (the original attempt may be from any time before this call).
    fn grant_from(
        &self,
        key: ResourceKey,
        holder_id: String,
        request_id: String,
        sent_at: Instant,
        result: LeaseResult,
    ) -> Result<Grant, ClientError> {
        let Some(grant) = result.reply.grant() else {
            return Err(ClientError::Protocol(
                "a granting operation answered with a release".into(),
            ));
        };
        Ok(self.make_grant(
            key,
            holder_id,
            request_id,
            sent_at,
            grant,
            result.group_id,
            (result.replayed, result.replay),
        ))
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn make_grant(
        &self,
        key: ResourceKey,
        holder_id: String,
        request_id: String,
        sent_at: Instant,
        grant: &LeaseGrant,
        group_id: u32,
        replay: (bool, Option<ReplayState>),
    ) -> Grant {
        let (replayed, replay) = replay;
        let remaining_ttl_ms = replayed_window_ttl_ms(grant, replayed, replay);
        let window = self.inner.config.safety.safe_window(remaining_ttl_ms);
        Grant {
            key,
            holder_id,
            lease_id: grant.lease_id,
            fencing_token: grant.fencing_token,
            ttl_ms: grant.ttl_ms,
            log_time_ms: grant.log_time_ms,
            expires_at_ms: grant.expires_at_ms,
            group_id,
            replayed,
            request_id,
            sent_at,
            safe_deadline: sent_at + window,
            remaining_ttl_ms,
            replay,
        }
    }

    fn backoff(&self, attempt: u32) -> Duration {
        let policy = &self.inner.config.retry;
        let exponent = attempt.saturating_sub(1).min(16);
        let ceiling = policy
            .backoff_initial
            .saturating_mul(1u32 << exponent)
            .min(policy.backoff_max);
        let ceiling_us = u64::try_from(ceiling.as_micros())
            .unwrap_or(u64::MAX)
            .max(1);
        let jitter_us = match self.inner.rng.lock() {
            Ok(mut rng) => rng.random_range(ceiling_us / 2..=ceiling_us),
            Err(_) => ceiling_us,
        };
        Duration::from_micros(jitter_us)
    }

    /// Sends `body` for `group` until it gets an answer, a non-retryable error, the deadline or
    /// the attempt cap. The body (and so its request id) is the same on every attempt.
    pub(crate) async fn call(
        &self,
        group: Option<u32>,
        body: RequestBody,
        flags: RequestFlags,
        tenant: Option<&str>,
    ) -> Result<ResponseBody, ClientError> {
        self.call_until(
            group,
            body,
            flags,
            tenant,
            crate::time::now() + self.inner.config.call_timeout,
        )
        .await
    }

    pub(crate) async fn call_until(
        &self,
        group: Option<u32>,
        body: RequestBody,
        flags: RequestFlags,
        tenant: Option<&str>,
        deadline: Instant,
    ) -> Result<ResponseBody, ClientError> {
        let attempt_timeout = self.inner.config.attempt_timeout;
        self.call_with_attempts(group, body, flags, tenant, deadline, attempt_timeout)
            .await
    }

    /// [`Client::call_until`] with each attempt given `attempt_timeout` instead of the
    /// configured one (a queued wait's attempt is parked on the server for most of it).
    pub(crate) async fn call_with_attempts(
        &self,
        group: Option<u32>,
        body: RequestBody,
        flags: RequestFlags,
        tenant: Option<&str>,
        deadline: Instant,
        attempt_timeout: Duration,
    ) -> Result<ResponseBody, ClientError> {
        let config = &self.inner.config;
        let started = crate::time::now();
        let mut last = String::from("not sent");
        let mut avoid: Option<SocketAddr> = None;
        let mut redirects = 0u32;
        let mut attempts = 0u32;
        for attempt in 1..=config.retry.attempts_max {
            attempts = attempt;
            if self.inner.closed.load(Ordering::SeqCst) {
                return Err(ClientError::Closed);
            }
            if attempt > 1 {
                self.inner.counters.retries.fetch_add(1, Ordering::Relaxed);
            }
            let now = crate::time::now();
            if now >= deadline {
                break;
            }
            let Some(target) = self.pick_target(group, avoid) else {
                return Err(ClientError::NoNodeReachable("no node known".into()));
            };
            let attempt_deadline = deadline.min(now + attempt_timeout);
            let flags = RequestFlags {
                forward: flags.forward || target.forward,
                ..flags
            };
            let mut pause = Duration::ZERO;
            match self
                .send(&target.link, body.clone(), flags, tenant, attempt_deadline)
                .await
            {
                Ok(Ok(answer)) => {
                    target.link.set_suspect(false);
                    if target.forward && group.is_some() {
                        // Answered through another node's forwarding: the group has no usable
                        // leader in the routing cache (unknown, or a node that failed). A table
                        // fetched during an election may have named the old leader again (same
                        // term), and with that node suspect no later call would go there to learn
                        // otherwise; every call would pay the extra hop. Refresh in the background
                        // (at most once per `routing_refresh_min_interval`).
                        let client = self.clone();
                        tokio::spawn(async move { client.refresh_routing_soon().await });
                    }
                    return Ok(answer);
                }
                Ok(Err(error)) => {
                    target.link.set_suspect(false);
                    // Only answers that make the call try again (a business answer such as
                    // ALREADY_HELD ends it and is the caller's to log).
                    if error.code == ErrorCode::NotLeader || error.retryable {
                        debug!(
                            node = %target.link.addr,
                            forward = flags.forward,
                            group,
                            attempt,
                            "attempt refused: {error}"
                        );
                    }
                    last = error.to_string();
                    if error.placement_version > self.read_routing(|r| r.placement_version()) {
                        self.refresh_routing_soon().await;
                    }
                    if error.code == ErrorCode::NotLeader {
                        redirects += 1;
                        // A hint computed under another placement map may name another
                        // group's leader: use it only when the maps agree.
                        let same_map =
                            error.placement_version == self.read_routing(|r| r.placement_version());
                        let hint = error.leader_hint.clone().filter(|_| same_map);
                        if let (Some(group), Some(hint)) = (group, hint.as_ref()) {
                            self.write_routing(|routing| {
                                routing.learn_node(hint);
                                routing.note_leader(group, Some(hint.node_id));
                            });
                        } else {
                            if let Some(group) = group {
                                self.write_routing(|routing| routing.forget_leader(group));
                            }
                            self.refresh_routing_soon().await;
                        }
                        avoid = None;
                        // The first redirect is followed at once; repeated ones mean an
                        // election is under way.
                        if redirects > 1 {
                            pause = self.backoff(attempt);
                        }
                    } else if error.retryable {
                        let hint = error
                            .retry_after_ms
                            .map_or(Duration::ZERO, |ms| Duration::from_millis(u64::from(ms)));
                        pause = self.backoff(attempt).max(hint);
                        if error.code == ErrorCode::Unavailable {
                            if let Some(group) = group {
                                self.write_routing(|routing| routing.forget_leader(group));
                            }
                            self.refresh_routing_soon().await;
                        }
                    } else {
                        return Err(ClientError::from_wire(error));
                    }
                }
                Err(LinkError::Final(error)) => return Err(error),
                Err(error) => {
                    debug!(
                        node = %target.link.addr,
                        forward = flags.forward,
                        group,
                        attempt,
                        "attempt failed: {error}"
                    );
                    // The node may be down: try another node (forwarding) and learn where the
                    // leader went. The request id is unchanged, so a request that was applied
                    // is answered with its stored outcome.
                    last = error.to_string();
                    avoid = Some(target.link.addr);
                    // A timeout only cut short by this call's own deadline (shorter than an
                    // attempt) says nothing about the node.
                    let own_deadline = matches!(error, LinkError::Timeout { .. })
                        && attempt_deadline < now + attempt_timeout;
                    if !own_deadline {
                        target.link.set_suspect(true);
                        if let Some(node) = target.link.node_id {
                            self.write_routing(|routing| routing.forget_node_leadership(node));
                        }
                    }
                    if matches!(error, LinkError::Connect { .. }) {
                        target.link.close().await;
                    }
                    self.refresh_routing_soon().await;
                    pause = self.backoff(attempt);
                }
            }
            if crate::time::now() + pause >= deadline {
                break;
            }
            tokio::time::sleep(pause).await;
        }
        if attempts < config.retry.attempts_max || crate::time::now() >= deadline {
            Err(ClientError::DeadlineExceeded {
                timeout_ms: u64::try_from(deadline.saturating_duration_since(started).as_millis())
                    .unwrap_or(u64::MAX),
                attempts,
                last,
            })
        } else {
            Err(ClientError::RetriesExhausted { attempts, last })
        }
    }
}
