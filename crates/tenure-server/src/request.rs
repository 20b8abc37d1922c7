//! The request path: one client request end to end, shared by the QUIC client protocol and the
//! HTTP gateway so both behave identically. The caller has authenticated the connection (QUIC)
//! or the request (HTTP) and decoded it; here, in order: the tenant check (a principal touches
//! only its own tenant), validation, admission (in-flight bounds per node and tenant), routing to
//! the key's group, then either, when this node is the group's ready leader, renewal pressure
//! (late renewals sampled; new acquires refused while they arrive late and the node is short of
//! capacity; each proposal timed for that) and the local proposal or
//! read, or forwarding to the leader (or `NOT_LEADER` with the leader's address); and the answer
//! with its metrics.
//!
//! Must not depend on: the wire (QUIC streams, HTTP); callers decode and encode. Nor on the
//! node's start-up or background tasks (`node`, `background`).

use std::sync::Arc;
use std::time::Duration;

use tenure_core::{
    ErrorCode, FenceVerdict, LeaseOp, LeaseOpKind, LeaseOutcome, LeaseReply, LeaseStatus,
    LeaseView, ResourceKey, WatchSelector,
};
use tenure_proto::client::{
    FenceCheckResult, GetResult, GroupLeader, LeaseResult, NodeAddress, NodeStatus, Principal,
    RequestBody, RequestFlags, ResponseBody, RoutingTable, WATCH_WAIT_MS_MAX, WatchPage, WatchPoll,
    WireError,
};
use tokio::time::Instant;

use crate::admission::{Admitted, RenewalTiming, RequestClass};
use crate::auth::{Authenticator, check_tenant};
use crate::group::GroupHandle;
use crate::metrics as m;
use crate::shared::{NodeShared, Readiness};
use crate::waits::{Registration, WaitKey};
use crate::watch::Found;

/// Who asks, and how.
#[derive(Debug, Clone)]
pub struct RequestContext {
    /// The authenticated principal (or, in insecure development mode, the claimed one).
    pub principal: Principal,
    /// Forwarding and stale-read options.
    pub flags: RequestFlags,
    /// How long the caller waits.
    pub timeout: Duration,
    /// The cluster node whose connection carries the request (its node certificate proved it),
    /// `None` for clients. Only nodes may create or drop this node's replicas.
    pub peer_node: Option<u64>,
    /// SHA-256 of the certificate the connection presented (QUIC), `None` over HTTP.
    pub peer_cert_sha256: Option<[u8; 32]>,
}

/// The request handler of one node. Cheap to clone.
#[derive(Clone)]
pub struct Service {
    pub(crate) inner: Arc<NodeShared>,
}

impl Service {
    /// Handles one request.
    pub async fn handle(
        &self,
        ctx: RequestContext,
        body: RequestBody,
    ) -> Result<ResponseBody, WireError> {
        self.inner.handle(ctx, body).await
    }

    /// The token table and the insecure-mode switch.
    pub fn authenticator(&self) -> &Authenticator {
        &self.inner.auth
    }

    /// Readiness.
    pub fn readiness(&self) -> Readiness {
        self.inner.readiness()
    }

    /// The Prometheus text exposition of this process's metrics.
    pub fn render_metrics(&self) -> String {
        self.inner.render_metrics()
    }

    /// The default request timeout.
    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.inner.config.limits.request_timeout_ms)
    }

    /// The largest HTTP body accepted.
    pub fn http_body_bytes_max(&self) -> usize {
        self.inner.config.limits.http_body_bytes_max
    }

    /// This node's id.
    pub fn node_id(&self) -> u64 {
        self.inner.config.node_id
    }

    /// The node's fault knobs, when `[testing] fault_control` is on.
    pub fn fault_controls(&self) -> Option<Arc<crate::fault_control::FaultControls>> {
        self.inner.fault_controls()
    }
}

/// `INVALID_ARGUMENT` with a message.
pub fn invalid(message: impl Into<String>) -> WireError {
    WireError::new(ErrorCode::InvalidArgument, message)
}

/// A read's status comes from the log (see [`GroupHandle::linearizable_read_time`]); its
/// remaining ttl from the leader's clock, which is fresher between entries: never more than the
/// log's, zero for a lease the clock says is due but no Expire entry has reclaimed yet.
fn clock_remaining_ttl(view: &mut LeaseView, clock_ms: u64) {
    view.remaining_ttl_ms = view
        .remaining_ttl_ms
        .min(view.expires_at_ms.saturating_sub(clock_ms));
}

/// As the group's ready leader: the resource's lease at a linearizable read's log time (its
/// remaining ttl counted on the leader's clock, never more than the log time's) and that log
/// time. Get and CheckFence answer from it.
///
/// The leader's clock is read after the state, so it is at least the stamp of any entry this
/// leader proposed before: a lease that clock says is due reads as having no time left, even
/// while the Expire entry (or a new grant stamped past its expiry) is not applied yet. When the
/// node stopped leading in between, there is no such clock: the answer fails (UNAVAILABLE,
/// retryable) rather than report a remaining ttl computed from a log time that may be old.
async fn linearizable_view(
    handle: &GroupHandle,
    key: &ResourceKey,
    ctx: &RequestContext,
) -> Result<(Option<LeaseView>, u64), WireError> {
    let now = handle.linearizable_read_time(ctx.timeout).await?;
    let mut view = handle.get_at(key, now)?;
    if let Some(view) = view.as_mut() {
        let Some(clock_ms) = handle.log_now_ms() else {
            return Err(WireError::new(
                ErrorCode::Unavailable,
                "leadership of the group changed during the read; retry",
            ));
        };
        clock_remaining_ttl(view, clock_ms);
    }
    Ok((view, now))
}

/// How long a request waits for this node's just-elected leader of its group to become ready
/// (it learns the log's time first: a commit round), rather than answering `NOT_LEADER` that
/// names this node.
const LEADER_READY_WAIT: Duration = Duration::from_secs(2);

fn ready_wait(ctx: &RequestContext) -> Duration {
    LEADER_READY_WAIT.min(ctx.timeout)
}

fn error_code_label(error: &WireError) -> &'static str {
    error.code.as_str()
}

impl NodeShared {
    fn node_address(&self, node_id: u64) -> Option<NodeAddress> {
        self.node_addresses(node_id)
            .map(|(addr, http_addr)| NodeAddress {
                node_id,
                client_addr: addr.to_string(),
                http_url: format!("http://{http_addr}"),
            })
    }

    fn routing_table(&self) -> RoutingTable {
        RoutingTable {
            placement_version: self.placement.version(),
            slot_groups: self.placement.slot_groups().iter().map(|g| g.0).collect(),
            groups: self.config.groups,
            nodes: self
                .member_nodes()
                .into_iter()
                .filter_map(|id| self.node_address(id))
                .collect(),
            leaders: (0..self.config.groups)
                .map(|group| {
                    let view = self.leader_of(group);
                    GroupLeader {
                        group_id: group,
                        leader: view.leader,
                        term: view.term,
                    }
                })
                .collect(),
            nodes_version: self.cluster_view().version,
        }
    }

    fn node_status(&self) -> NodeStatus {
        let readiness = self.readiness();
        NodeStatus {
            node_id: self.config.node_id,
            ready: readiness.ready,
            shutting_down: readiness.shutting_down,
            placement_version: self.placement.version(),
            groups: self.config.groups,
            hosted: (0..self.config.groups)
                .filter_map(|group| self.group(group).map(|handle| handle.status()))
                .collect(),
        }
    }

    /// Fills routing errors with the leader's addresses and the placement version.
    fn decorate(&self, mut error: WireError) -> WireError {
        error.placement_version = self.placement.version();
        if let Some(hint) = error.leader_hint.take() {
            error.leader_hint = self.node_address(hint.node_id);
        }
        error
    }

    pub(crate) fn not_leader(&self, group: u32) -> WireError {
        let view = self.leader_of(group);
        let mut error = WireError::new(
            ErrorCode::NotLeader,
            match view.leader {
                Some(leader) => format!("group {group} is led by node {leader}"),
                None => format!("group {group} has no known leader"),
            },
        );
        error.leader_hint = view.leader.and_then(|leader| self.node_address(leader));
        error
    }

    pub(crate) async fn handle(
        self: &Arc<Self>,
        ctx: RequestContext,
        body: RequestBody,
    ) -> Result<ResponseBody, WireError> {
        let op = body.op_name();
        let started = Instant::now();
        let result = self.handle_inner(ctx, body).await;
        let label = match &result {
            Ok(_) => "ok",
            Err(error) => error_code_label(error),
        };
        ::metrics::counter!(m::REQUESTS_TOTAL, "op" => op, "result" => label).increment(1);
        ::metrics::histogram!(m::REQUEST_DURATION_SECONDS, "op" => op)
            .record(started.elapsed().as_secs_f64());
        result.map_err(|error| self.decorate(error))
    }

    async fn handle_inner(
        self: &Arc<Self>,
        ctx: RequestContext,
        body: RequestBody,
    ) -> Result<ResponseBody, WireError> {
        if self.replica_gate.is_excluded()
            && !matches!(
                body,
                RequestBody::ClusterNodes | RequestBody::Routing | RequestBody::Status
            )
        {
            // An excluded node still answering (`crate::replica_gate`: excluded before any node
            // table existed) serves nothing but the questions about the cluster.
            return Err(WireError::new(
                ErrorCode::Unavailable,
                "this node was excluded from the cluster (its data directory is not the one the \
                 other nodes know for its id): it serves nothing; ask another node",
            ));
        }
        match body {
            RequestBody::Authenticate { .. } => Err(WireError::new(
                ErrorCode::InvalidArgument,
                "Authenticate is a connection-level request of the QUIC protocol",
            )),
            RequestBody::Routing => Ok(ResponseBody::Routing(self.routing_table())),
            RequestBody::Status => Ok(ResponseBody::Status(self.node_status())),
            RequestBody::GroupMembers { group_id } => self.group_members(group_id, &ctx).await,
            RequestBody::MoveReplica { group_id, from, to } => {
                self.move_replica(group_id, from, to, &ctx).await
            }
            body @ (RequestBody::CreateReplica { .. } | RequestBody::DropReplica { .. }) => {
                self.replica_request(body, &ctx).await
            }
            RequestBody::ClusterNodes => Ok(ResponseBody::Cluster(self.newest_cluster_meta())),
            RequestBody::ClusterChange(op) => self.cluster_change_request(op, &ctx).await,
            RequestBody::Lease(op) => {
                if op.kind() == LeaseOpKind::Renew {
                    ::metrics::histogram!(m::RENEWALS_PER_REQUEST).record(1.0);
                }
                self.lease_ops(ctx, vec![op], false).await
            }
            RequestBody::Batch { ops } => {
                if ops.is_empty() {
                    return Err(invalid("a batch needs at least one operation"));
                }
                if ops.len() > tenure_proto::client::BATCH_OPS_MAX {
                    return Err(invalid(format!(
                        "a batch may carry at most {} operations",
                        tenure_proto::client::BATCH_OPS_MAX
                    )));
                }
                let renewals = ops
                    .iter()
                    .filter(|op| op.kind() == LeaseOpKind::Renew)
                    .count();
                if renewals > 0 {
                    ::metrics::histogram!(m::RENEWALS_PER_REQUEST).record(renewals as f64);
                }
                self.lease_ops(ctx, ops, true).await
            }
            RequestBody::Get { key } => {
                let (group, _admitted) = self.admit_read(&ctx, &key)?;
                if let Some(handle) = self.group(group) {
                    if handle.await_ready_leader(ready_wait(&ctx)).await {
                        let (view, now) = linearizable_view(&handle, &key, &ctx).await?;
                        return Ok(ResponseBody::Get(GetResult {
                            view,
                            log_time_ms: now,
                            stale: false,
                            group_id: group,
                        }));
                    }
                    if ctx.flags.stale_read {
                        let now = handle.applied_log_time_ms();
                        return Ok(ResponseBody::Get(GetResult {
                            view: handle.get_at(&key, now)?,
                            log_time_ms: now,
                            stale: true,
                            group_id: group,
                        }));
                    }
                }
                self.forward_or_refuse(group, &ctx, RequestBody::Get { key })
                    .await
            }
            RequestBody::CheckFence { key, fencing_token } => {
                let (group, _admitted) = self.admit_read(&ctx, &key)?;
                // Never from a follower's state (a stale "current" would let a zombie write).
                if let Some(handle) = self.group(group) {
                    if handle.await_ready_leader(ready_wait(&ctx)).await {
                        let (view, now) = linearizable_view(&handle, &key, &ctx).await?;
                        return Ok(ResponseBody::FenceChecked(FenceCheckResult {
                            verdict: FenceVerdict::of(view.as_ref(), fencing_token),
                            log_time_ms: now,
                            group_id: group,
                        }));
                    }
                }
                let body = RequestBody::CheckFence { key, fencing_token };
                self.forward_or_refuse(group, &ctx, body).await
            }
            RequestBody::List { group_id, request } => {
                check_tenant(&ctx.principal, &request.tenant_id)?;
                self.check_group_id(group_id)?;
                let _admitted = self
                    .admission
                    .admit(&request.tenant_id, RequestClass::Other)?;
                if let Some(handle) = self.group(group_id) {
                    if handle.await_ready_leader(ready_wait(&ctx)).await {
                        let now = handle.linearizable_read_time(ctx.timeout).await?;
                        let mut page = handle.list_at(&request, now)?;
                        if let Some(clock_ms) = handle.log_now_ms() {
                            for view in &mut page.leases {
                                clock_remaining_ttl(view, clock_ms);
                            }
                        }
                        return Ok(ResponseBody::List(page));
                    }
                    if ctx.flags.stale_read {
                        let now = handle.applied_log_time_ms();
                        return Ok(ResponseBody::List(handle.list_at(&request, now)?));
                    }
                }
                self.forward_or_refuse(group_id, &ctx, RequestBody::List { group_id, request })
                    .await
            }
            RequestBody::Watch(poll) => self.watch_poll(poll, &ctx).await,
        }
    }

    /// One poll of a watch (`crate::watch`): served by the group's ready leader (or, with a
    /// stale read, any replica) from its ring; otherwise forwarded or refused like a read.
    /// Admission is taken to check the tenant's bounds and let go before the poll is held open.
    async fn watch_poll(
        self: &Arc<Self>,
        poll: WatchPoll,
        ctx: &RequestContext,
    ) -> Result<ResponseBody, WireError> {
        let tenant_id = poll.selector.tenant_id().to_owned();
        check_tenant(&ctx.principal, &tenant_id)?;
        poll.selector
            .validate()
            .map_err(WireError::from_lease_error)?;
        self.check_group_id(poll.group_id)?;
        let resource = match &poll.selector {
            WatchSelector::Resource(key) => {
                let group = self.placement.group_of(&key.tenant_id, &key.resource_id).0;
                if group != poll.group_id {
                    return Err(invalid(format!(
                        "the resource is in group {group}, not {}",
                        poll.group_id
                    )));
                }
                Some(key.clone())
            }
            WatchSelector::Tenant(_) | WatchSelector::Prefix { .. } => None,
        };
        drop(self.admission.admit(&tenant_id, RequestClass::Other)?);
        let group = poll.group_id;
        let Some(handle) = self.group(group) else {
            return self
                .forward_or_refuse(group, ctx, RequestBody::Watch(poll))
                .await;
        };
        if !handle.await_ready_leader(ready_wait(ctx)).await && !ctx.flags.stale_read {
            return self
                .forward_or_refuse(group, ctx, RequestBody::Watch(poll))
                .await;
        }
        // The resource's lease with the exact index it was read at: the start of a watch, or
        // where it goes on after a resync.
        let current_at_index = || -> Result<(Option<LeaseView>, u64), WireError> {
            handle
                .state_machine()
                .with_leases_at_index(|leases, index| {
                    let view = match &resource {
                        Some(key) => leases.get(key, leases.last_log_time_ms())?,
                        None => None,
                    };
                    Ok((view, index))
                })
                .map_err(WireError::from_lease_error)
        };
        let page = |events, through_index, resync, current| {
            Ok(ResponseBody::Watch(WatchPage {
                group_id: group,
                events,
                through_index,
                resync,
                current,
            }))
        };
        let Some(after_index) = poll.after_index else {
            let (current, index) = current_at_index()?;
            return page(Vec::new(), index, false, current);
        };
        let wait = Duration::from_millis(u64::from(poll.wait_ms.min(WATCH_WAIT_MS_MAX)))
            .min(ctx.timeout.saturating_sub(PARK_ANSWER_MARGIN));
        let found = self
            .watches
            .poll(group, &poll.selector, after_index, poll.events_max, wait)
            .await?;
        match found {
            Found::Events {
                events,
                through_index,
            } => page(events, through_index, false, None),
            Found::Resync { .. } => {
                ::metrics::counter!(m::WATCH_RESYNCS_TOTAL).increment(1);
                let (current, index) = current_at_index()?;
                page(Vec::new(), index, true, current)
            }
        }
    }

    async fn forward_or_refuse(
        &self,
        group: u32,
        ctx: &RequestContext,
        body: RequestBody,
    ) -> Result<ResponseBody, WireError> {
        let view = self.leader_of(group);
        match view.leader {
            Some(leader) if ctx.flags.forward && leader != self.config.node_id => {
                ::metrics::counter!(m::REQUESTS_FORWARDED_TOTAL, "op" => body.op_name())
                    .increment(1);
                self.forwarder
                    .forward(leader, &ctx.principal, ctx.flags, body, ctx.timeout)
                    .await
            }
            Some(_) | None => Err(self.not_leader(group)),
        }
    }

    async fn lease_ops(
        self: &Arc<Self>,
        ctx: RequestContext,
        ops: Vec<LeaseOp>,
        batch: bool,
    ) -> Result<ResponseBody, WireError> {
        // A parked wait answers within the caller's timeout counted from here, not from after
        // the proposal (which may itself take much of it).
        let started = Instant::now();
        let mut group: Option<u32> = None;
        let mut acquire = false;
        for op in &ops {
            check_tenant(&ctx.principal, op.tenant_id())?;
            acquire |= op.kind().adds_lease();
            // A resource operation goes to its key's group; a session-record operation names
            // its group (one record per group: contract, sessions).
            let op_group = match (op.key(), op.parts().group_id) {
                (Some(key), _) => {
                    key.validate().map_err(WireError::from_lease_error)?;
                    self.placement.group_of(&key.tenant_id, &key.resource_id).0
                }
                (None, Some(group)) => {
                    self.check_group_id(group.0)?;
                    group.0
                }
                (None, None) => return Err(invalid("an operation names neither key nor group")),
            };
            match group {
                None => group = Some(op_group),
                Some(g) if g == op_group => {}
                Some(g) => {
                    return Err(invalid(format!(
                        "a batch must stay in one group: a {} goes to group {op_group}, earlier \
                         items to group {g}",
                        op.kind_name()
                    )));
                }
            }
        }
        let Some(group) = group else {
            return Err(invalid("no operation"));
        };
        let tenant = ctx.principal.tenant_id.clone();
        let class = if acquire {
            RequestClass::Acquire
        } else {
            RequestClass::Other
        };
        let admitted = self
            .admission
            .admit(&tenant, class)
            .inspect_err(|refused| {
                if refused.code == ErrorCode::Overloaded {
                    // The node's in-flight bound is full: short of capacity.
                    self.renewal_pressure.record_saturated(self.clock.now_ms());
                }
            })?;
        let mut ops = ops;
        if let Some(handle) = self.group(group) {
            if handle.await_ready_leader(ready_wait(&ctx)).await {
                self.weigh_renewal_pressure(&handle, &tenant, &ops, class)?;
                // The proposal consumes the operations; keep a copy only when a lost leadership
                // may still be answered by forwarding them.
                let fallback = ctx.flags.forward.then(|| ops.clone());
                // Registered before proposing: a hand-off may be applied before the proposal's
                // answer (`Queued`) even reaches this task.
                let registration = if batch {
                    None
                } else {
                    self.register_wait(group, &ops)
                };
                let proposed = Instant::now();
                let proposal = handle.propose(ops, ctx.timeout).await;
                self.weigh_proposal(&proposal, proposed);
                match proposal {
                    Ok(outcomes) => {
                        // A parked wait holds no admission slot: it costs only its registration.
                        drop(admitted);
                        let time_left = ctx.timeout.saturating_sub(started.elapsed());
                        let outcomes = park_queued(outcomes, registration, time_left).await;
                        return lease_body(group, outcomes, batch);
                    }
                    Err(error) if error.code == ErrorCode::NotLeader => match fallback {
                        Some(copy) => ops = copy,
                        None => return Err(error),
                    },
                    Err(error) => return Err(error),
                }
            }
        }
        let body = if batch {
            RequestBody::Batch { ops }
        } else {
            match ops.into_iter().next() {
                Some(op) => RequestBody::Lease(op),
                None => return Err(invalid("no operation")),
            }
        };
        // The leader gets what is left of the caller's time (the ready-leader wait and a
        // proposal that ended NOT_LEADER may have used much of it): a wait parked there must
        // answer before the caller stops listening.
        let ctx = RequestContext {
            timeout: ctx.timeout.saturating_sub(started.elapsed()),
            ..ctx
        };
        self.forward_or_refuse(group, &ctx, body).await
    }

    /// A registration for the single AcquireWait in `ops`, if that is what they are (see
    /// `crate::waits`).
    fn register_wait(&self, group: u32, ops: &[LeaseOp]) -> Option<Registration> {
        let [LeaseOp::AcquireWait(request)] = ops else {
            return None;
        };
        self.waits.register(WaitKey {
            group,
            tenant_id: request.key.tenant_id.clone(),
            resource_id: request.key.resource_id.clone(),
            request_id: request.request_id.clone(),
        })
    }

    /// What a read of one resource (Get, CheckFence) starts with: the tenant check, the key's
    /// validation and admission. Returns the key's group and the admission, held while the read
    /// runs.
    fn admit_read(
        &self,
        ctx: &RequestContext,
        key: &ResourceKey,
    ) -> Result<(u32, Admitted), WireError> {
        check_tenant(&ctx.principal, &key.tenant_id)?;
        key.validate().map_err(WireError::from_lease_error)?;
        let admitted = self.admission.admit(&key.tenant_id, RequestClass::Other)?;
        let group = self.placement.group_of(&key.tenant_id, &key.resource_id).0;
        Ok((group, admitted))
    }

    /// Feeds the renewal pressure's load signal with one proposal's outcome: how long an
    /// answered (or timed-out) proposal took, or that the group's proposal queue was full.
    /// Refusals that proposed nothing (`NOT_LEADER`, a batch too large) say nothing about load.
    fn weigh_proposal(&self, proposal: &Result<Vec<LeaseOutcome>, WireError>, proposed: Instant) {
        if !self.renewal_pressure.enabled() {
            return;
        }
        let now_ms = self.clock.now_ms();
        match proposal {
            Ok(_) => {}
            Err(error) if error.code == ErrorCode::Overloaded => {
                self.renewal_pressure.record_saturated(now_ms);
                return;
            }
            Err(error) if error.code == ErrorCode::Unavailable => {}
            Err(_) => return,
        }
        let duration_us = u64::try_from(proposed.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.renewal_pressure.record_proposal(now_ms, duration_us);
    }

    /// As the group's leader: refuses a new acquire of a tenant whose renewals arrive late (and
    /// the node is short of capacity), and
    /// samples how late the request's first renewal arrives (a client library's batch starts
    /// with its most urgent lease). See [`RenewalPressure`].
    fn weigh_renewal_pressure(
        &self,
        handle: &GroupHandle,
        tenant: &str,
        ops: &[LeaseOp],
        class: RequestClass,
    ) -> Result<(), WireError> {
        let pressure = &self.renewal_pressure;
        if !pressure.enabled() {
            return Ok(());
        }
        let now_ms = self.clock.now_ms();
        if class == RequestClass::Acquire {
            if let Err(refused) = pressure.admit_acquire(tenant, now_ms) {
                ::metrics::counter!(m::ACQUIRES_REFUSED_RENEWAL_PRESSURE_TOTAL).increment(1);
                return Err(refused);
            }
        }
        let first_renewal = ops.iter().find_map(|op| match op {
            LeaseOp::Renew(renew) => Some(renew),
            _ => None,
        });
        let (Some(renew), Some(log_now_ms)) = (first_renewal, handle.log_now_ms()) else {
            return Ok(());
        };
        // Never waits for the state: while apply or a snapshot holds it, no sample.
        let Some(Ok(Some(view))) = handle.try_get_at(&renew.key, log_now_ms) else {
            return Ok(());
        };
        // Only a renewal of the active lease by its holder counts: one of an ended lease, or of
        // someone else's, is refused by the state machine and says nothing about timeliness.
        if view.lease_id != renew.lease_id
            || view.holder_id != renew.holder_id
            || view.status != LeaseStatus::Active
        {
            return Ok(());
        }
        let timing = pressure.timing(view.remaining_ttl_ms, view.ttl_ms);
        ::metrics::counter!(m::RENEWALS_SAMPLED_TOTAL).increment(1);
        if timing == RenewalTiming::Late {
            ::metrics::counter!(m::RENEWALS_LATE_TOTAL).increment(1);
        }
        pressure.record(&renew.key.tenant_id, now_ms, timing);
        Ok(())
    }
}

/// Slack past a wait's end for the Expire entry that ends it to be applied, before a parked call
/// stops waiting for its answer.
const WAIT_END_SLACK: Duration = Duration::from_secs(1);
/// Time kept from a request's timeout for answering a parked call that gets no answer.
const PARK_ANSWER_MARGIN: Duration = Duration::from_millis(300);

/// An AcquireWait answered `Queued`: parks the call until its wait ends (answered with the grant
/// a hand-off made, or why the wait ended), or until its request's time is nearly up (answered
/// with the position: the client retries the same request id). `time_left`: what is left of
/// the caller's timeout.
async fn park_queued(
    outcomes: Vec<LeaseOutcome>,
    registration: Option<Registration>,
    time_left: Duration,
) -> Vec<LeaseOutcome> {
    let Some(mut registration) = registration else {
        return outcomes;
    };
    let [
        LeaseOutcome {
            result: Ok(LeaseReply::Queued(receipt)),
            ..
        },
    ] = outcomes.as_slice()
    else {
        return outcomes;
    };
    let wait_left =
        Duration::from_millis(receipt.wait_until_ms.saturating_sub(receipt.log_time_ms));
    let park = (wait_left + WAIT_END_SLACK).min(time_left.saturating_sub(PARK_ANSWER_MARGIN));
    match registration.wait(park).await {
        Some(answer) => vec![LeaseOutcome {
            result: answer,
            replayed: false,
            replay: None,
        }],
        None => outcomes,
    }
}

fn lease_body(
    group: u32,
    outcomes: Vec<LeaseOutcome>,
    batch: bool,
) -> Result<ResponseBody, WireError> {
    let mut results: Vec<Result<LeaseResult, WireError>> = outcomes
        .into_iter()
        .map(|outcome| match outcome.result {
            Ok(reply) => Ok(LeaseResult {
                reply,
                replayed: outcome.replayed,
                group_id: group,
                replay: outcome.replay,
            }),
            Err(error) => Err(WireError::from_lease_error(error)),
        })
        .collect();
    if batch {
        return Ok(ResponseBody::Batch(results));
    }
    match (results.pop(), results.is_empty()) {
        (Some(result), true) => result.map(ResponseBody::Lease),
        _ => Err(WireError::new(
            ErrorCode::Internal,
            "one operation produced a number of outcomes other than one",
        )),
    }
}
