//! The lease state machine of one group: apply, queries, invariants.
//!
//! Layout (memory per active lease is measured by `tenure-bench`'s `lease_memory`):
//! - `slab`: every lease record in a chunked slab under a stable `u32` slot;
//! - `by_key`: a hash table of slots, keyed by `(tenant, resource_id)` of the record it points to;
//! - `by_expiry`: an ordered set of `(expires_at_ms, slot)` for every record in status Active, so
//!   reclaiming the oldest expiry and finding the next one cost O(log n), never a scan;
//! - `by_tenant`: an ordered set of `(tenant, fencing_token, slot)` for List;
//! - `inactive`: FIFO of released/expired records, for their bounded retention;
//! - `dedup`: request-id outcomes (see [`dedup`]).
//!
//! The indexes are functions of the slab and are rebuilt on restore; everything whose order
//! affects a later decision (slab slots and free list, the inactive and dedup queues, counters)
//! is in the snapshot, so a restored replica decides exactly what a replaying one does.

pub(crate) mod chunked_ring;
pub(crate) mod dedup;
pub(crate) mod queue;
pub(crate) mod session;
pub(crate) mod slab;
mod snapshot;
#[cfg(test)]
mod tests;

use std::collections::BTreeSet;
use std::hash::BuildHasher;
use std::ops::Bound;

use compact_str::CompactString;
use hashbrown::{HashMap, HashTable};
use serde::{Deserialize, Serialize};

pub use queue::{GROUP_WAITERS_MAX, RESOURCE_WAITERS_MAX};
pub use session::GROUP_SESSIONS_MAX;
pub use snapshot::{
    FrozenState, SNAPSHOT_FORMAT_VERSION, SNAPSHOT_FORMAT_VERSION_MIN, SnapshotError, SnapshotStats,
};

use crate::cluster::{ClusterError, ClusterMeta, METADATA_GROUP};
use crate::command::{
    AcquireRequest, ApplyOutput, Command, CommandResult, Entry, LeaseGrant, LeaseOp, LeaseOutcome,
    LeaseReply, LeaseStatus, LeaseView, ListPage, ListRequest, ReclaimedLease, ReleaseReceipt,
    ReleaseRequest, RenewRequest, ReplayState, ReplayStatus, SessionAcquireRequest,
    TransferReceipt, TransferRequest,
};
use crate::error::{LeaseError, QuotaKind};
use crate::ids::{GroupId, LeaseId, ResourceKey};
use crate::limits::{GroupLimits, TenantPolicy};
use crate::negative::NegativeControl;
use crate::validate::{validate_holder_id, validate_request_id, validate_tenant_id};
use chunked_ring::ChunkedRing;
use dedup::{DedupRecord, DedupTable, HashBuilder, Lookup};
use queue::WaitQueues;
use session::{SessionStatus, SessionTables};
use slab::Slab;

/// Work budget for lazy garbage collection per applied entry, beyond twice its item count.
const GC_BUDGET_BASE: usize = 64;

/// Options that affect only the in-memory layout, never a decision or the snapshot bytes (but
/// for a negative control, which takes effect only in test builds).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StateOptions {
    /// Seed for the in-memory hash tables. Give each process a random one so that crafted
    /// resource ids cannot degrade lookups; any seed yields identical results and snapshots.
    pub hash_seed: u64,
    /// A guarantee to break on purpose (feature `negative-controls` only; inert otherwise).
    pub negative_control: NegativeControl,
}

/// Stored status of a lease record. `Active` records may be past their expiry until reclaimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum RecordStatus {
    Active,
    Expired,
    Released,
}

/// One lease record: the latest lease of one resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LeaseRecord {
    pub(crate) tenant: u32,
    pub(crate) resource_id: CompactString,
    pub(crate) holder_id: CompactString,
    pub(crate) fencing_token: u64,
    /// Expiry while active; the moment it ended once expired or released.
    pub(crate) expires_at_ms: u64,
    /// While active: the expiry under which the record sits in `by_expiry`. Renewals that extend
    /// the lease leave the index alone (no random B-tree update on the hot path), so this may be
    /// earlier than `expires_at_ms`, never later; reclaim re-files such entries when it meets them.
    pub(crate) indexed_expiry_ms: u64,
    pub(crate) origin_group: u32,
    pub(crate) ttl_ms: u32,
    pub(crate) version: u32,
    pub(crate) status: RecordStatus,
    /// The session record (slot) the lease is bound to while it is active and was acquired in
    /// a session; `None` otherwise. Not in the record's own snapshot frame: snapshot format 5
    /// lists the bindings separately, so format-4 records read unchanged.
    #[serde(skip)]
    pub(crate) session: Option<u32>,
}

impl LeaseRecord {
    fn lease_id(&self) -> LeaseId {
        LeaseId {
            group_id: GroupId(self.origin_group),
            sequence: self.fencing_token,
        }
    }
}

/// A lease's status and end as every decision sees them: a bound lease's are its session
/// record's ([`LeaseStateMachine::lease_state`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct LeaseState {
    status: RecordStatus,
    /// Expiry while active; the moment it ended once expired or released.
    expires_at_ms: u64,
}

impl LeaseState {
    fn is_active_at(self, now_ms: u64) -> bool {
        self.status == RecordStatus::Active && now_ms < self.expires_at_ms
    }

    /// Whether the record still answers for its resource at `now_ms`. An inactive (or
    /// unreclaimed, expired) record stays visible for `inactive_retention_ms` after it ended.
    fn is_visible_at(self, now_ms: u64, limits: &GroupLimits) -> bool {
        now_ms
            < self
                .expires_at_ms
                .saturating_add(limits.inactive_retention_ms)
    }

    fn status_at(self, now_ms: u64) -> LeaseStatus {
        match self.status {
            RecordStatus::Active if now_ms < self.expires_at_ms => LeaseStatus::Active,
            RecordStatus::Active | RecordStatus::Expired => LeaseStatus::Expired,
            RecordStatus::Released => LeaseStatus::Released,
        }
    }
}

/// What a granted lease's time comes from.
#[derive(Debug, Clone, Copy)]
enum Binding {
    /// Its own ttl.
    Own { ttl_ms: u64 },
    /// The session record at this slot.
    Session { slot: u32 },
}

/// Per-tenant state in one group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct TenantState {
    pub(crate) name: CompactString,
    pub(crate) policy: TenantPolicy,
    /// Records in status Active (including expired ones not yet reclaimed).
    pub(crate) active_leases: u64,
}

/// Counters describing the state, cheap to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateStats {
    /// Records in status Active (some may be past expiry, awaiting reclaim).
    pub active_leases: u64,
    /// All lease records held (active and retained inactive).
    pub lease_records: u64,
    /// Released or expired records still retained.
    pub inactive_records: u64,
    /// Request-id records held.
    pub dedup_records: u64,
    /// Tenants known to this group.
    pub tenants: u64,
    /// Latest log time applied.
    pub last_log_time_ms: u64,
    /// The fencing token the next grant will get.
    pub next_fencing_token: u64,
}

/// The deterministic lease state machine of one group.
#[derive(Debug, Clone)]
pub struct LeaseStateMachine {
    group_id: GroupId,
    limits: GroupLimits,
    last_log_time_ms: u64,
    /// Next grant sequence (= fencing token). Starts at 1, only grows; a resource moving in
    /// raises it to at least the floor the move carries.
    next_sequence: u64,
    tenants: Vec<TenantState>,
    tenant_index: HashMap<CompactString, u32, HashBuilder>,
    slab: Slab<LeaseRecord>,
    by_key: HashTable<u32>,
    by_expiry: BTreeSet<(u64, u32)>,
    by_tenant: BTreeSet<(u32, u64, u32)>,
    /// Copy-on-write chunks, like the slab: a snapshot's freeze shares it instead of copying it.
    inactive: ChunkedRing<(u32, u64)>,
    inactive_count: u64,
    dedup: DedupTable,
    /// Session records and the leases bound to them (see [`session`]).
    sessions: SessionTables,
    /// FIFO wait queues (see [`queue`]).
    waits: WaitQueues,
    /// The cluster metadata (empty except in the metadata group).
    cluster: ClusterMeta,
    hash_builder: HashBuilder,
    /// Reusable buffer for hashing request keys; not state.
    scratch: Vec<u8>,
    /// Leases past their expiry that an acquire in the entry being applied took over (handed
    /// out in [`ApplyOutput::superseded`]); not state.
    superseded: Vec<ReclaimedLease>,
    /// The guarantee broken on purpose, if any (test builds only).
    negative_control: NegativeControl,
}

impl LeaseStateMachine {
    /// An empty state for `group_id` with [`GroupLimits::default`]. The server's bootstrap puts
    /// the cluster's limits in the log as the first entry ([`Command::SetGroupLimits`]).
    pub fn new(group_id: GroupId, options: StateOptions) -> Self {
        let hash_builder = HashBuilder::with_seed(options.hash_seed);
        LeaseStateMachine {
            group_id,
            limits: GroupLimits::default(),
            last_log_time_ms: 0,
            next_sequence: 1,
            tenants: Vec::new(),
            tenant_index: HashMap::with_hasher(hash_builder.clone()),
            slab: Slab::new(),
            by_key: HashTable::new(),
            by_expiry: BTreeSet::new(),
            by_tenant: BTreeSet::new(),
            inactive: ChunkedRing::new(),
            inactive_count: 0,
            dedup: DedupTable::new(hash_builder.clone()),
            sessions: SessionTables::new(),
            waits: WaitQueues::new(hash_builder.clone()),
            cluster: ClusterMeta::default(),
            hash_builder,
            scratch: Vec::with_capacity(256),
            superseded: Vec::new(),
            negative_control: options.negative_control,
        }
    }

    /// Test hook: makes every request identity collide in the request-id table's hashing.
    #[cfg(test)]
    pub(crate) fn force_dedup_collisions(&mut self) {
        self.dedup.force_collisions();
    }

    /// The group this state belongs to.
    pub fn group_id(&self) -> GroupId {
        self.group_id
    }

    /// The cluster metadata (empty except in the metadata group).
    pub fn cluster(&self) -> &ClusterMeta {
        &self.cluster
    }

    /// The group's limits.
    pub fn limits(&self) -> &GroupLimits {
        &self.limits
    }

    /// Latest log time applied (log time never decreases).
    pub fn last_log_time_ms(&self) -> u64 {
        self.last_log_time_ms
    }

    /// A lower bound on the earliest expiry among active records, if any: when the leader should
    /// next propose an Expire command. (A lease renewed since it was indexed may turn out to
    /// expire later; the Expire then re-files it.)
    /// Session records count too: one falling due, and an ended one whose leases still need
    /// reclaiming (due at once).
    pub fn next_expiry_ms(&self) -> Option<u64> {
        let lease = self
            .by_expiry
            .first()
            .map(|&(expires_at_ms, _)| expires_at_ms);
        [lease, self.next_session_work_ms(), self.next_wait_end_ms()]
            .into_iter()
            .flatten()
            .min()
    }

    /// Counters describing the state.
    pub fn stats(&self) -> StateStats {
        StateStats {
            active_leases: (self.by_expiry.len() + self.sessions.by_session.len()) as u64,
            lease_records: self.slab.occupied() as u64,
            inactive_records: self.inactive_count,
            dedup_records: self.dedup.len() as u64,
            tenants: self.tenants.len() as u64,
            last_log_time_ms: self.last_log_time_ms,
            next_fencing_token: self.next_sequence,
        }
    }

    /// Applies one log entry. Deterministic: the same entries applied to the same state give the
    /// same outputs and the same state on every replica. Never panics on any input.
    pub fn apply(&mut self, entry: &Entry) -> ApplyOutput {
        let now_ms = self.last_log_time_ms.max(entry.log_time_ms);
        self.last_log_time_ms = now_ms;
        let mut reclaimed = Vec::new();
        let (result, items) = match &entry.command {
            Command::Lease(op) => (
                CommandResult::Lease(self.apply_lease_op(op, now_ms, &mut reclaimed)),
                1,
            ),
            Command::Batch(ops) => {
                if ops.len() > self.limits.batch_items_max as usize {
                    let err = LeaseError::invalid(
                        "batch",
                        format!(
                            "has {} items, at most {} allowed",
                            ops.len(),
                            self.limits.batch_items_max
                        ),
                    );
                    (CommandResult::Batch(Err(err)), 1)
                } else {
                    let outcomes = ops
                        .iter()
                        .map(|op| self.apply_lease_op(op, now_ms, &mut reclaimed))
                        .collect();
                    (CommandResult::Batch(Ok(outcomes)), ops.len())
                }
            }
            Command::Expire { leases_max } => {
                let leases_max = (*leases_max).min(self.limits.expire_batch_max);
                self.reclaim_due(now_ms, leases_max, &mut reclaimed);
                let more_due = self.next_expiry_ms().is_some_and(|at| at <= now_ms);
                (CommandResult::Expire { more_due }, 1)
            }
            Command::SetTenantPolicy { tenant_id, policy } => (
                CommandResult::Config(self.set_tenant_policy(tenant_id, policy)),
                1,
            ),
            Command::SetGroupLimits(limits) => {
                let result = limits.validate().map(|()| self.limits = limits.clone());
                (CommandResult::Config(result), 1)
            }
            Command::Cluster(op) => {
                let result = if self.group_id == METADATA_GROUP {
                    self.cluster.apply(op, now_ms)
                } else {
                    Err(ClusterError::Invalid {
                        field: "group".into(),
                        reason: format!(
                            "cluster metadata lives in group {METADATA_GROUP}, not {}",
                            self.group_id
                        ),
                    })
                };
                (CommandResult::Cluster(result), 1)
            }
        };
        let budget = GC_BUDGET_BASE + 2 * (items + reclaimed.len() + self.waits.ended.len());
        self.collect_garbage(now_ms, budget);
        ApplyOutput {
            log_time_ms: now_ms,
            result,
            reclaimed,
            superseded: std::mem::take(&mut self.superseded),
            waits_ended: std::mem::take(&mut self.waits.ended),
        }
    }

    fn apply_lease_op(
        &mut self,
        op: &LeaseOp,
        now_ms: u64,
        reclaimed: &mut Vec<ReclaimedLease>,
    ) -> LeaseOutcome {
        let fresh = |result| LeaseOutcome {
            result,
            replayed: false,
            replay: None,
        };
        if op.kind().is_unrecorded() {
            // Idempotent by design (contract, sessions and wait queues): nothing recorded.
            return fresh(self.decide(op, now_ms, reclaimed));
        }
        let Some(key) = op.key() else {
            return fresh(Err(LeaseError::invalid("key", "missing")));
        };
        // Malformed identity: nothing to scope a request id to, so nothing is recorded.
        let checked = key
            .validate()
            .and_then(|()| validate_request_id(op.request_id()))
            .and_then(|()| validate_holder_id(op.holder_id()))
            .and_then(|()| op.parts().new_holder_id.map_or(Ok(()), validate_holder_id));
        if let Err(err) = checked {
            return fresh(Err(err));
        }
        if self
            .negative_control
            .breaks(NegativeControl::DisableDeduplication)
        {
            return fresh(self.decide(op, now_ms, reclaimed));
        }
        let fingerprint = dedup::fingerprint(op, &mut self.scratch);
        dedup::pack_op_identity(op, &mut self.scratch);
        match self
            .dedup
            .lookup(&self.scratch, fingerprint, now_ms, &self.limits)
        {
            Lookup::Replay(record) => {
                let replay = self.replay_state(key, record, now_ms);
                return LeaseOutcome {
                    result: record.outcome.clone(),
                    replayed: true,
                    replay: Some(replay),
                };
            }
            Lookup::Conflict => return fresh(Err(dedup::conflict_error())),
            Lookup::Miss => {}
        }
        if let Some(result) = self.queued_retry(op, fingerprint, now_ms) {
            // Still waiting: the waiter is the request's record; its position, never a
            // second place (another operation with its request id: a conflict).
            return fresh(result);
        }
        if let Err(err) = self.dedup.reserve_one(&self.scratch, now_ms, &self.limits) {
            return fresh(Err(err));
        }
        let result = self.decide(op, now_ms, reclaimed);
        // Retryable refusals had no effect and must not stick to the request id; a queued wait
        // is recorded when it ends (its waiter is its record meanwhile).
        if !result.as_ref().is_err_and(LeaseError::retryable)
            && !matches!(result, Ok(LeaseReply::Queued(_)))
        {
            // `scratch` still holds the packed identity: nothing above uses it.
            self.dedup
                .record(&self.scratch, fingerprint, now_ms, result.clone());
        }
        fresh(result)
    }

    /// What a (validated, not replayed) operation does to the state.
    fn decide(
        &mut self,
        op: &LeaseOp,
        now_ms: u64,
        reclaimed: &mut Vec<ReclaimedLease>,
    ) -> Result<LeaseReply, LeaseError> {
        match op {
            LeaseOp::Acquire(r) => self.acquire(r, now_ms, reclaimed),
            LeaseOp::Renew(r) => self.renew(r, now_ms),
            LeaseOp::Release(r) => self.release(r, now_ms),
            LeaseOp::Transfer(r) => self.transfer(r, now_ms),
            LeaseOp::SessionOpen(r) => self.open_session(r, now_ms, reclaimed),
            LeaseOp::SessionKeepAlive(r) => self.keep_session_alive(r, now_ms),
            LeaseOp::SessionClose(r) => self.close_session(r, now_ms),
            LeaseOp::AcquireInSession(r) => self.acquire_in_session(r, now_ms, reclaimed),
            LeaseOp::AcquireWait(r) => self.acquire_wait(op, r, now_ms, reclaimed),
            LeaseOp::WaitCancel(r) => self.cancel_wait(r, now_ms),
        }
    }

    /// How a stored outcome stands at `now_ms` (contract 3.4): a replayed grant never reports
    /// more than is left of the original grant, and nothing once its lease has ended.
    fn replay_state(&self, key: &ResourceKey, record: &DedupRecord, now_ms: u64) -> ReplayState {
        let ended = |status, expires_at_ms: u64| ReplayState {
            answered_at_ms: now_ms,
            decided_at_ms: record.recorded_at_ms,
            status,
            expires_at_ms: expires_at_ms.min(now_ms),
            remaining_ttl_ms: 0,
        };
        // A replayed transfer stands for the lease it granted (the new holder's), like a grant.
        let grant = match &record.outcome {
            Ok(reply) => match (reply.grant(), reply.ended()) {
                (Some(grant), _) => grant,
                (None, Some(receipt)) => {
                    return ended(ReplayStatus::Released, receipt.released_at_ms);
                }
                (None, None) => return ended(ReplayStatus::NotAGrant, now_ms),
            },
            Err(_) => return ended(ReplayStatus::NotAGrant, now_ms),
        };
        // The resource's record, if it is still the granted lease (an invisible record counts
        // as gone whether or not garbage collection has freed it yet).
        let current = self
            .tenant_index
            .get(key.tenant_id.as_str())
            .and_then(|&tenant| self.find_slot(tenant, &key.resource_id))
            .and_then(|slot| self.slab.get(slot))
            .map(|r| (r, self.lease_state(r)))
            .filter(|(r, state)| {
                state.is_visible_at(now_ms, &self.limits)
                    && r.lease_id() == grant.lease_id
                    && r.fencing_token == grant.fencing_token
            });
        let Some((current_record, current)) = current else {
            return ended(ReplayStatus::Superseded, grant.expires_at_ms);
        };
        // A lease bound to a session has no expiry of its own: it stands exactly as long as
        // the session's record, which keep-alives extend past the grant's expiry; a replay
        // reports that (else a retried AcquireInSession would call an active lease expired).
        let expires_at_ms = if current_record.session.is_some() {
            current.expires_at_ms
        } else {
            grant.expires_at_ms.min(current.expires_at_ms)
        };
        match current.status {
            RecordStatus::Released => ended(ReplayStatus::Released, expires_at_ms),
            RecordStatus::Active if now_ms < expires_at_ms => ReplayState {
                answered_at_ms: now_ms,
                decided_at_ms: record.recorded_at_ms,
                status: ReplayStatus::Active,
                expires_at_ms,
                remaining_ttl_ms: expires_at_ms - now_ms,
            },
            RecordStatus::Active | RecordStatus::Expired => {
                ended(ReplayStatus::Expired, expires_at_ms)
            }
        }
    }

    fn acquire(
        &mut self,
        request: &AcquireRequest,
        now_ms: u64,
        reclaimed: &mut Vec<ReclaimedLease>,
    ) -> Result<LeaseReply, LeaseError> {
        let tenant = self.tenant_or_create(&request.key.tenant_id)?;
        check_ttl(
            request.ttl_ms,
            &self.tenants[tenant as usize].policy,
            &self.limits,
        )?;
        let binding = Binding::Own {
            ttl_ms: request.ttl_ms,
        };
        self.grant_resource(
            tenant,
            &request.key,
            &request.holder_id,
            binding,
            now_ms,
            reclaimed,
        )
    }

    /// Acquire bound to a session: the session must be active in this group and owned by the
    /// requester; the lease then has the record's expiry, whatever keep-alives do to it.
    fn acquire_in_session(
        &mut self,
        request: &SessionAcquireRequest,
        now_ms: u64,
        reclaimed: &mut Vec<ReclaimedLease>,
    ) -> Result<LeaseReply, LeaseError> {
        // Only a tenant with a session here can have one: a refused request creates nothing.
        let tenant = self
            .tenant_index
            .get(request.key.tenant_id.as_str())
            .copied()
            .ok_or(LeaseError::SessionNotFound {
                session_id: request.session_id,
            })?;
        let slot = self.live_session(
            Some(tenant),
            request.session_id,
            ("holder_id", &request.holder_id),
            now_ms,
        )?;
        self.grant_resource(
            tenant,
            &request.key,
            &request.holder_id,
            Binding::Session { slot },
            now_ms,
            reclaimed,
        )
    }

    /// The part of Acquire after the tenant and the ttl (or session) checks: the quota, the
    /// resource's current record, and the grant.
    fn grant_resource(
        &mut self,
        tenant: u32,
        key: &ResourceKey,
        holder_id: &str,
        binding: Binding,
        now_ms: u64,
        reclaimed: &mut Vec<ReclaimedLease>,
    ) -> Result<LeaseReply, LeaseError> {
        // A lease past its expiry on a resource with waiters goes to them, not to this request.
        self.settle_due_lease(tenant, &key.resource_id, now_ms, reclaimed);
        let quota = self.tenants[tenant as usize]
            .policy
            .active_leases_max(&self.limits);
        if self.tenants[tenant as usize].active_leases >= quota {
            // Leases past expiry but not yet reclaimed must not count against the quota. (A
            // session active at `now_ms` is not due, so this never ends the one we bind to.)
            self.reclaim_due(now_ms, self.limits.expire_batch_max, reclaimed);
        }
        let (ttl_ms, expires_at_ms) = match binding {
            Binding::Own { ttl_ms } => (ttl_ms, now_ms.saturating_add(ttl_ms)),
            Binding::Session { slot } => {
                let session = self.session(slot);
                (u64::from(session.ttl_ms), session.expires_at_ms)
            }
        };
        let ttl_ms = u32::try_from(ttl_ms)
            .map_err(|_| LeaseError::invalid("ttl_ms", "does not fit the state's 32-bit ttl"))?;
        let existing = self.find_slot(tenant, &key.resource_id);
        let quota_exceeded = LeaseError::QuotaExceeded {
            kind: QuotaKind::TenantActiveLeases,
            limit: quota,
        };

        if let Some(slot) = existing {
            let record = self.record(slot);
            let state = self.lease_state(record);
            if state.is_active_at(now_ms)
                && !self
                    .negative_control
                    .breaks(NegativeControl::SkipExpiryCheck)
            {
                return Err(LeaseError::AlreadyHeld {
                    holder_id: record.holder_id.clone(),
                    remaining_ttl_ms: state.expires_at_ms - now_ms,
                });
            }
            let was_active = record.status == RecordStatus::Active;
            if !was_active && self.tenants[tenant as usize].active_leases >= quota {
                return Err(quota_exceeded);
            }
            let old_token = record.fencing_token;
            if was_active {
                // The previous lease ended by expiry without being reclaimed: reported as
                // ended, so that a watcher sees its end before the next grant.
                let ended = ReclaimedLease {
                    tenant_id: self.tenants[tenant as usize].name.clone(),
                    resource_id: record.resource_id.clone(),
                    lease_id: LeaseRecord::lease_id(record),
                    fencing_token: old_token,
                    expires_at_ms: state.expires_at_ms,
                    session_id: record.session.map(|s| self.session(s).session_id),
                };
                self.superseded.push(ended);
            }
            let token = self.take_sequence_above(old_token);
            if was_active {
                self.unfile_active(slot);
            } else {
                self.inactive_count -= 1;
                self.tenants[tenant as usize].active_leases += 1;
            }
            let parts = self.regrant(
                slot,
                (tenant, old_token),
                holder_id,
                (token, ttl_ms),
                expires_at_ms,
                binding,
            );
            return Ok(LeaseReply::Acquired(grant(parts, now_ms, true)));
        }

        if self.tenants[tenant as usize].active_leases >= quota {
            return Err(quota_exceeded);
        }
        if self.slab.occupied() as u64 >= self.limits.lease_records_max
            && !self.evict_oldest_inactive()
        {
            return Err(LeaseError::QuotaExceeded {
                kind: QuotaKind::GroupLeaseRecords,
                limit: self.limits.lease_records_max,
            });
        }
        let token = self.take_sequence();
        let record = LeaseRecord {
            tenant,
            resource_id: CompactString::from(key.resource_id.as_str()),
            holder_id: CompactString::from(holder_id),
            fencing_token: token,
            expires_at_ms,
            indexed_expiry_ms: expires_at_ms,
            origin_group: self.group_id.0,
            ttl_ms,
            version: 1,
            status: RecordStatus::Active,
            session: None,
        };
        let parts = record_view_parts(&record);
        let Some(slot) = self.slab.insert(record) else {
            return Err(LeaseError::QuotaExceeded {
                kind: QuotaKind::GroupLeaseRecords,
                limit: u64::from(u32::MAX),
            });
        };
        self.index_key(slot);
        self.by_tenant.insert((tenant, token, slot));
        self.file_active(slot, expires_at_ms, binding);
        self.tenants[tenant as usize].active_leases += 1;
        Ok(LeaseReply::Acquired(grant(parts, now_ms, true)))
    }

    /// Files an active lease where its expiry is kept: the expiry index for a lease with a ttl
    /// of its own, its session's bound leases otherwise.
    fn file_active(&mut self, slot: u32, expires_at_ms: u64, binding: Binding) {
        match binding {
            Binding::Own { .. } => {
                self.by_expiry.insert((expires_at_ms, slot));
            }
            Binding::Session { slot: session } => self.bind_lease(slot, session),
        }
    }

    /// Takes an active lease out of wherever its expiry is kept (it is ending, or being granted
    /// anew).
    fn unfile_active(&mut self, slot: u32) {
        let record = self.record(slot);
        match record.session {
            Some(session) => self.unbind_lease(slot, session),
            None => {
                let indexed = record.indexed_expiry_ms;
                self.by_expiry.remove(&(indexed, slot));
            }
        }
    }

    /// A lease record's status and end as every decision sees them: a lease bound to a session
    /// is active exactly while the session's record is, and ended when the record ended.
    fn lease_state(&self, record: &LeaseRecord) -> LeaseState {
        match record.session {
            Some(slot) if record.status == RecordStatus::Active => {
                let session = self.session(slot);
                LeaseState {
                    status: if session.status == SessionStatus::Active {
                        RecordStatus::Active
                    } else {
                        RecordStatus::Expired
                    },
                    expires_at_ms: session.expires_at_ms,
                }
            }
            _ => LeaseState {
                status: record.status,
                expires_at_ms: record.expires_at_ms,
            },
        }
    }

    fn renew(&mut self, request: &RenewRequest, now_ms: u64) -> Result<LeaseReply, LeaseError> {
        let (slot, ttl_ms) = self.extendable_lease(
            &request.key,
            request.lease_id,
            &request.holder_id,
            request.ttl_ms,
            now_ms,
        )?;
        if self.record(slot).session.is_some() {
            return Err(LeaseError::invalid(
                "lease_id",
                "is bound to a session: it lives as long as the session, so keep the session \
                 alive instead of renewing the lease",
            ));
        }
        let expires_at_ms = now_ms.saturating_add(request.ttl_ms);
        let record = self.record_mut(slot);
        record.expires_at_ms = expires_at_ms;
        record.ttl_ms = ttl_ms;
        record.version = record.version.saturating_add(1);
        let old_indexed = record.indexed_expiry_ms;
        if expires_at_ms < old_indexed {
            // A renewal that shortens the lease must move it earlier in the index at once.
            record.indexed_expiry_ms = expires_at_ms;
        }
        let parts = record_view_parts(record);
        if expires_at_ms < old_indexed {
            self.by_expiry.remove(&(old_indexed, slot));
            self.by_expiry.insert((expires_at_ms, slot));
        }
        Ok(LeaseReply::Renewed(grant(parts, now_ms, false)))
    }

    fn release(&mut self, request: &ReleaseRequest, now_ms: u64) -> Result<LeaseReply, LeaseError> {
        let tenant = self
            .tenant_index
            .get(request.key.tenant_id.as_str())
            .copied();
        let slot = self.current_lease_slot(
            tenant,
            &request.key.resource_id,
            request.lease_id,
            &request.holder_id,
            now_ms,
        )?;
        self.unfile_active(slot);
        let record = self.record_mut(slot);
        record.expires_at_ms = now_ms;
        record.status = RecordStatus::Released;
        record.version = record.version.saturating_add(1);
        let (lease_id, token) = (record.lease_id(), record.fencing_token);
        // Hands the resource to its first live waiter in this apply, if it has one.
        self.end_lease(slot);
        Ok(LeaseReply::Released(ReleaseReceipt {
            lease_id,
            fencing_token: token,
            released_at_ms: now_ms,
        }))
    }

    /// Ends the resource's active lease and grants the resource to `new_holder_id` at the same
    /// log time, with a new lease id and the next fencing token. The record is reused, so the
    /// tenant's active-lease count is unchanged and no other request can come between the end of
    /// one lease and the start of the next. The checks are Renew's (ttl bounds, then NOT_FOUND,
    /// LEASE_EXPIRED, LEASE_MISMATCH), so only the current holder of an active lease can hand it
    /// over.
    fn transfer(
        &mut self,
        request: &TransferRequest,
        now_ms: u64,
    ) -> Result<LeaseReply, LeaseError> {
        let (slot, ttl_ms) = self.extendable_lease(
            &request.key,
            request.lease_id,
            &request.holder_id,
            request.ttl_ms,
            now_ms,
        )?;
        let record = self.record(slot);
        let (old_lease_id, old_token, tenant) =
            (record.lease_id(), record.fencing_token, record.tenant);
        let token = self.take_sequence_above(old_token);
        let expires_at_ms = now_ms.saturating_add(request.ttl_ms);
        // A lease bound to a session passes on as a lease with the ttl the transfer names: the
        // new holder does not own the session.
        self.unfile_active(slot);
        let parts = self.regrant(
            slot,
            (tenant, old_token),
            &request.new_holder_id,
            (token, ttl_ms),
            expires_at_ms,
            Binding::Own {
                ttl_ms: request.ttl_ms,
            },
        );
        Ok(LeaseReply::Transferred(Box::new(TransferReceipt {
            released: ReleaseReceipt {
                lease_id: old_lease_id,
                fencing_token: old_token,
                released_at_ms: now_ms,
            },
            grant: grant(parts, now_ms, true),
        })))
    }

    /// Makes the existing record at `slot` (of `tenant`, last token `old_token`) a new active
    /// lease of `holder_id` with `token`, expiring at `expires_at_ms`: re-keys it in the tenant
    /// index and files it in the expiry index. The caller has removed its old expiry entry, if
    /// it had one (or unbound it from its session), and keeps the tenant's active count right.
    /// Acquire over an ended record and Transfer share it.
    fn regrant(
        &mut self,
        slot: u32,
        (tenant, old_token): (u32, u64),
        holder_id: &str,
        (token, ttl_ms): (u64, u32),
        expires_at_ms: u64,
        binding: Binding,
    ) -> ViewParts {
        self.by_tenant.remove(&(tenant, old_token, slot));
        self.by_tenant.insert((tenant, token, slot));
        self.file_active(slot, expires_at_ms, binding);
        let group = self.group_id.0;
        let record = self.record_mut(slot);
        record.holder_id = CompactString::from(holder_id);
        record.fencing_token = token;
        record.expires_at_ms = expires_at_ms;
        record.indexed_expiry_ms = expires_at_ms;
        record.origin_group = group;
        record.ttl_ms = ttl_ms;
        record.version = 1;
        record.status = RecordStatus::Active;
        record_view_parts(record)
    }

    /// The checks of Renew and Transfer: the new ttl within the tenant's bounds, then
    /// [`Self::current_lease_slot`]'s. The slot and the ttl as the record stores it.
    fn extendable_lease(
        &self,
        key: &ResourceKey,
        lease_id: LeaseId,
        holder_id: &str,
        ttl_ms: u64,
        now_ms: u64,
    ) -> Result<(u32, u32), LeaseError> {
        let tenant = self.tenant_index.get(key.tenant_id.as_str()).copied();
        let default_policy = TenantPolicy::default();
        let policy = tenant.map_or(&default_policy, |t| &self.tenants[t as usize].policy);
        check_ttl(ttl_ms, policy, &self.limits)?;
        let stored_ttl_ms = u32::try_from(ttl_ms)
            .map_err(|_| LeaseError::invalid("ttl_ms", "does not fit the state's 32-bit ttl"))?;
        let slot =
            self.current_lease_slot(tenant, &key.resource_id, lease_id, holder_id, now_ms)?;
        Ok((slot, stored_ttl_ms))
    }

    /// The checks of Renew, Release and Transfer, in the contract's order: NOT_FOUND, LEASE_EXPIRED (also
    /// for released), LEASE_MISMATCH.
    fn current_lease_slot(
        &self,
        tenant: Option<u32>,
        resource_id: &str,
        lease_id: LeaseId,
        holder_id: &str,
        now_ms: u64,
    ) -> Result<u32, LeaseError> {
        let slot = tenant
            .and_then(|t| self.find_slot(t, resource_id))
            .ok_or(LeaseError::NotFound)?;
        let record = self.record(slot);
        let state = self.lease_state(record);
        if !state.is_visible_at(now_ms, &self.limits) {
            return Err(LeaseError::NotFound);
        }
        if !state.is_active_at(now_ms) {
            return Err(LeaseError::LeaseExpired { lease_id });
        }
        if record.lease_id() != lease_id || record.holder_id != holder_id {
            return Err(LeaseError::LeaseMismatch { lease_id });
        }
        Ok(slot)
    }

    /// Negative control [`NegativeControl::ResetTokensOnNewLeader`]: the storage layer calls
    /// this when it applies the first entry of a new leader term. Does nothing unless that
    /// control is selected in a test build.
    pub fn negative_control_new_term(&mut self) {
        if self
            .negative_control
            .breaks(NegativeControl::ResetTokensOnNewLeader)
        {
            self.next_sequence = 1;
        }
    }

    /// The next grant's token, for a resource whose last token was `old_token`.
    fn take_sequence_above(&mut self, old_token: u64) -> u64 {
        let token = self.take_sequence();
        // Safety invariant (contract 3.2): a new grant's token exceeds every earlier one of its
        // resource. (The negative control that resets tokens skips it, so the checkers, not
        // this assertion, have to catch the reuse.)
        assert!(
            token > old_token
                || self
                    .negative_control
                    .breaks(NegativeControl::ResetTokensOnNewLeader),
            "fencing token would not increase"
        );
        token
    }

    fn take_sequence(&mut self) -> u64 {
        let token = self.next_sequence;
        // 2^64 grants cannot happen; saturating keeps apply panic-free, the assert on every
        // grant catches a token that fails to increase.
        self.next_sequence = self.next_sequence.saturating_add(1);
        token
    }

    fn tenant_or_create(&mut self, tenant_id: &str) -> Result<u32, LeaseError> {
        if let Some(&tenant) = self.tenant_index.get(tenant_id) {
            return Ok(tenant);
        }
        if self.tenants.len() >= self.limits.tenants_max as usize {
            return Err(LeaseError::QuotaExceeded {
                kind: QuotaKind::GroupTenants,
                limit: u64::from(self.limits.tenants_max),
            });
        }
        let tenant = u32::try_from(self.tenants.len()).map_err(|_| LeaseError::QuotaExceeded {
            kind: QuotaKind::GroupTenants,
            limit: u64::from(u32::MAX),
        })?;
        let name = CompactString::from(tenant_id);
        self.tenants.push(TenantState {
            name: name.clone(),
            policy: TenantPolicy::default(),
            active_leases: 0,
        });
        self.tenant_index.insert(name, tenant);
        Ok(tenant)
    }

    fn set_tenant_policy(
        &mut self,
        tenant_id: &str,
        policy: &TenantPolicy,
    ) -> Result<(), LeaseError> {
        validate_tenant_id(tenant_id)?;
        policy.validate()?;
        let tenant = self.tenant_or_create(tenant_id)?;
        self.tenants[tenant as usize].policy = policy.clone();
        Ok(())
    }

    /// Reclaims up to `leases_max` records whose expiry is at or before `now_ms`, in log-time
    /// order across the three kinds of due work: a lease's own expiry, a session record's expiry
    /// (which ends the record; it counts as one), and one lease of an ended session record.
    /// Entries of leases and sessions extended since they were indexed are re-filed under their
    /// real expiry (so the order stays exact); at most `2 * leases_max` entries are examined.
    fn reclaim_due(&mut self, now_ms: u64, leases_max: u32, reclaimed: &mut Vec<ReclaimedLease>) {
        let mut reclaimed_count = 0u32;
        let mut examined = 0u64;
        let examined_max = 2 * u64::from(leases_max);
        while reclaimed_count < leases_max && examined < examined_max {
            let due =
                |front: Option<&(u64, u32)>| front.map(|&(at, _)| at).filter(|&at| at <= now_ms);
            let lease_at = due(self.by_expiry.first());
            let session_at = due(self.sessions.by_expiry.first());
            let ending_at = due(self.sessions.ending.first());
            let waiter_at = self.next_wait_end_ms().filter(|&at| at <= now_ms);
            let Some(next_at) = [ending_at, session_at, lease_at, waiter_at]
                .into_iter()
                .flatten()
                .min()
            else {
                return;
            };
            examined += 1;
            if waiter_at == Some(next_at) {
                self.expire_front_waiter();
                reclaimed_count += 1;
            } else if ending_at == Some(next_at) {
                self.end_front_bound_lease(reclaimed);
                reclaimed_count += 1;
            } else if session_at == Some(next_at) {
                if self.expire_front_session() {
                    reclaimed_count += 1;
                }
            } else if self.reclaim_front_lease(reclaimed) {
                reclaimed_count += 1;
            }
        }
    }

    /// Processes the front of the lease expiry index (due): re-files it if renewed since it was
    /// indexed, else reclaims it. True when it was reclaimed.
    fn reclaim_front_lease(&mut self, reclaimed: &mut Vec<ReclaimedLease>) -> bool {
        let Some((indexed_at_ms, slot)) = self.by_expiry.pop_first() else {
            return false;
        };
        let record = self.record_mut(slot);
        assert_eq!(
            record.status,
            RecordStatus::Active,
            "expiry index names an inactive record"
        );
        assert!(
            record.session.is_none(),
            "expiry index names a lease bound to a session"
        );
        if record.expires_at_ms > indexed_at_ms {
            let expires_at_ms = record.expires_at_ms;
            record.indexed_expiry_ms = expires_at_ms;
            self.by_expiry.insert((expires_at_ms, slot));
            return false;
        }
        record.status = RecordStatus::Expired;
        let token = record.fencing_token;
        let tenant = record.tenant;
        let resource_id = record.resource_id.clone();
        let lease_id = record.lease_id();
        let expires_at_ms = record.expires_at_ms;
        reclaimed.push(ReclaimedLease {
            tenant_id: self.tenants[tenant as usize].name.clone(),
            resource_id,
            lease_id,
            fencing_token: token,
            expires_at_ms,
            session_id: None,
        });
        self.end_lease(slot);
        true
    }

    fn mark_inactive(&mut self, slot: u32, token: u64) {
        self.inactive.push_back((slot, token));
        self.inactive_count += 1;
        while self.inactive_count > self.limits.inactive_records_max {
            if !self.evict_oldest_inactive() {
                break;
            }
        }
    }

    fn inactive_entry_is_live(&self, slot: u32, token: u64) -> bool {
        self.slab
            .get(slot)
            .is_some_and(|r| r.fencing_token == token && r.status != RecordStatus::Active)
    }

    /// Drops the oldest retained inactive record. False when there is none.
    fn evict_oldest_inactive(&mut self) -> bool {
        while let Some(&(slot, token)) = self.inactive.front() {
            self.inactive.drop_front();
            if self.inactive_entry_is_live(slot, token) {
                self.free_inactive(slot);
                return true;
            }
        }
        false
    }

    fn free_inactive(&mut self, slot: u32) {
        let Some(record) = self.slab.remove(slot) else {
            return;
        };
        let hash = self
            .hash_builder
            .hash_one((record.tenant, record.resource_id.as_str()));
        if let Ok(entry) = self.by_key.find_entry(hash, |&s| s == slot) {
            entry.remove();
        }
        self.by_tenant
            .remove(&(record.tenant, record.fencing_token, slot));
        self.inactive_count -= 1;
    }

    fn collect_garbage(&mut self, now_ms: u64, budget: usize) {
        self.dedup.collect_garbage(now_ms, &self.limits, budget);
        self.collect_session_garbage(now_ms, budget);
        let mut budget = budget;
        while budget > 0 {
            let Some(&(slot, token)) = self.inactive.front() else {
                return;
            };
            if self.inactive_entry_is_live(slot, token) {
                let Some(record) = self.slab.get(slot) else {
                    return;
                };
                if self.lease_state(record).is_visible_at(now_ms, &self.limits) {
                    return;
                }
                self.free_inactive(slot);
            }
            self.inactive.drop_front();
            budget -= 1;
        }
    }

    fn record(&self, slot: u32) -> &LeaseRecord {
        self.slab
            .get(slot)
            .unwrap_or_else(|| index_invariant_broken(slot))
    }

    fn record_mut(&mut self, slot: u32) -> &mut LeaseRecord {
        self.slab
            .get_mut(slot)
            .unwrap_or_else(|| index_invariant_broken(slot))
    }

    fn find_slot(&self, tenant: u32, resource_id: &str) -> Option<u32> {
        let hash = self.hash_builder.hash_one((tenant, resource_id));
        self.by_key
            .find(hash, |&slot| {
                self.slab
                    .get(slot)
                    .is_some_and(|r| r.tenant == tenant && r.resource_id == resource_id)
            })
            .copied()
    }

    /// Indexes `slot`'s key unless another slot already holds it (a restore's duplicate
    /// check and insert with one hash and one probe); false when one does.
    fn index_new_key(&mut self, slot: u32) -> bool {
        let Self {
            by_key,
            slab,
            hash_builder,
            ..
        } = self;
        let Some(record) = slab.get(slot) else {
            return false;
        };
        let (tenant, resource_id) = (record.tenant, record.resource_id.as_str());
        let hash = hash_builder.hash_one((tenant, resource_id));
        let hash_of = |s: &u32| {
            slab.get(*s).map_or(0, |r| {
                hash_builder.hash_one((r.tenant, r.resource_id.as_str()))
            })
        };
        match by_key.entry(
            hash,
            |&s| {
                slab.get(s)
                    .is_some_and(|r| r.tenant == tenant && r.resource_id == resource_id)
            },
            hash_of,
        ) {
            hashbrown::hash_table::Entry::Occupied(_) => false,
            hashbrown::hash_table::Entry::Vacant(vacant) => {
                vacant.insert(slot);
                true
            }
        }
    }

    fn index_key(&mut self, slot: u32) {
        let Self {
            by_key,
            slab,
            hash_builder,
            ..
        } = self;
        let hash_of = |slot: u32| {
            slab.get(slot).map_or(0, |r| {
                hash_builder.hash_one((r.tenant, r.resource_id.as_str()))
            })
        };
        by_key.insert_unique(hash_of(slot), slot, |&s| hash_of(s));
    }

    // ---- queries ----

    fn view(&self, record: &LeaseRecord, now_ms: u64) -> LeaseView {
        let state = self.lease_state(record);
        let status = state.status_at(now_ms);
        LeaseView {
            key: ResourceKey::new(
                self.tenants[record.tenant as usize].name.as_str(),
                record.resource_id.as_str(),
            ),
            lease_id: record.lease_id(),
            holder_id: record.holder_id.to_string(),
            status,
            fencing_token: record.fencing_token,
            expires_at_ms: state.expires_at_ms,
            remaining_ttl_ms: if status == LeaseStatus::Active {
                state.expires_at_ms - now_ms
            } else {
                0
            },
            ttl_ms: u64::from(record.ttl_ms),
            version: u64::from(record.version),
            session_id: record.session.map(|slot| self.session(slot).session_id),
        }
    }

    /// The lease of a resource at log time `now_ms` (raised to the last applied log time if
    /// earlier). `Ok(None)` means ABSENT.
    pub fn get(&self, key: &ResourceKey, now_ms: u64) -> Result<Option<LeaseView>, LeaseError> {
        key.validate()?;
        let now_ms = now_ms.max(self.last_log_time_ms);
        let Some(&tenant) = self.tenant_index.get(key.tenant_id.as_str()) else {
            return Ok(None);
        };
        Ok(self
            .find_slot(tenant, &key.resource_id)
            .and_then(|slot| self.slab.get(slot))
            .filter(|record| self.lease_state(record).is_visible_at(now_ms, &self.limits))
            .map(|record| self.view(record, now_ms)))
    }

    /// One page of a tenant's leases in grant order, at log time `now_ms`.
    ///
    /// Page tokens are stable: a lease that exists for the whole listing appears exactly once;
    /// one granted during it may or may not. A page examines at most `list_scan_max` index
    /// entries, so a filtered page can be short while `next_page_token` is still set.
    pub fn list(&self, request: &ListRequest, now_ms: u64) -> Result<ListPage, LeaseError> {
        validate_tenant_id(&request.tenant_id)?;
        if request.page_size == 0 || request.page_size > self.limits.list_page_size_max {
            return Err(LeaseError::invalid(
                "page_size",
                format!("must be within [1, {}]", self.limits.list_page_size_max),
            ));
        }
        if request.status == Some(LeaseStatus::Absent) {
            return Err(LeaseError::invalid(
                "filter_status",
                "ABSENT leases cannot be listed",
            ));
        }
        let after = request
            .page_token
            .as_deref()
            .map(parse_page_token)
            .transpose()?;
        let now_ms = now_ms.max(self.last_log_time_ms);
        let Some(&tenant) = self.tenant_index.get(request.tenant_id.as_str()) else {
            return Ok(ListPage {
                leases: Vec::new(),
                next_page_token: None,
            });
        };
        let lower = match after {
            Some((token, slot)) => Bound::Excluded((tenant, token, slot)),
            None => Bound::Included((tenant, 0, 0)),
        };
        let mut range = self
            .by_tenant
            .range((lower, Bound::Included((tenant, u64::MAX, u32::MAX))))
            .peekable();
        let mut leases = Vec::new();
        let mut examined = 0u32;
        let mut last = None;
        for &(_, token, slot) in range.by_ref() {
            examined += 1;
            last = Some((token, slot));
            if let Some(record) = self.slab.get(slot)
                && self.lease_state(record).is_visible_at(now_ms, &self.limits)
            {
                let view = self.view(record, now_ms);
                if request.status.is_none_or(|status| status == view.status) {
                    leases.push(view);
                }
            }
            if leases.len() >= request.page_size as usize || examined >= self.limits.list_scan_max {
                break;
            }
        }
        let next_page_token = match (range.peek(), last) {
            (Some(_), Some((token, slot))) => Some(format_page_token(token, slot)),
            _ => None,
        };
        Ok(ListPage {
            leases,
            next_page_token,
        })
    }

    /// Checks every internal invariant with a full scan. For tests and debugging: O(n).
    pub fn check_invariants(&self) -> Result<(), String> {
        self.check_invariants_with(KeyIndexCheck::Lookup)
    }

    /// [`Self::check_invariants`], the key index's per-record lookup left out when `key_index`
    /// says the caller has just built that index from the records (a snapshot restore: each
    /// record's key was inserted under the hash computed from the record itself, duplicates
    /// refused, so a lookup would repeat the same computation; it was an eighth of a restore).
    /// The index's size is still checked against the records.
    pub(crate) fn check_invariants_with(&self, key_index: KeyIndexCheck) -> Result<(), String> {
        self.cluster
            .check()
            .map_err(|err| format!("cluster metadata: {err}"))?;
        if self.group_id != METADATA_GROUP && self.cluster != ClusterMeta::default() {
            return Err(format!(
                "cluster metadata in group {}, not the metadata group",
                self.group_id
            ));
        }
        let mut active_per_tenant = vec![0u64; self.tenants.len()];
        let mut active = 0usize;
        let mut inactive = 0u64;
        let mut occupied = 0usize;
        let mut active_unbound = 0usize;
        let queued_inactive: std::collections::HashSet<(u32, u64)> =
            self.inactive.iter().copied().collect();
        for (slot, record) in self.slab.iter_slots() {
            let Some(record) = record else { continue };
            occupied += 1;
            let tenant = record.tenant as usize;
            if tenant >= self.tenants.len() {
                return Err(format!("slot {slot}: unknown tenant {tenant}"));
            }
            if key_index == KeyIndexCheck::Lookup
                && self.find_slot(record.tenant, &record.resource_id) != Some(slot)
            {
                return Err(format!("slot {slot}: key index does not point here"));
            }
            if record.origin_group == self.group_id.0 && record.fencing_token >= self.next_sequence
            {
                return Err(format!(
                    "slot {slot}: token {} not below next sequence",
                    record.fencing_token
                ));
            }
            let bound = record.session.is_some();
            if bound && record.status != RecordStatus::Active {
                return Err(format!(
                    "slot {slot}: bound to a session with status {:?}",
                    record.status
                ));
            }
            if record.status == RecordStatus::Active && !bound {
                active_unbound += 1;
                if record.indexed_expiry_ms > record.expires_at_ms {
                    return Err(format!("slot {slot}: indexed after its expiry"));
                }
            }
            if record.status == RecordStatus::Active {
                active += 1;
                active_per_tenant[tenant] += 1;
            } else {
                inactive += 1;
                if !queued_inactive.contains(&(slot, record.fencing_token)) {
                    return Err(format!(
                        "slot {slot}: inactive record missing from its queue"
                    ));
                }
            }
        }
        if occupied != self.slab.occupied()
            || self.by_key.len() != occupied
            || self.by_tenant.len() != occupied
        {
            return Err(format!(
                "index sizes disagree: slab {occupied}/{}, key {}, tenant {}",
                self.slab.occupied(),
                self.by_key.len(),
                self.by_tenant.len()
            ));
        }
        // The ordered indexes, read in order (no lookup per record): every tenant-index entry
        // names an occupied slot whose record has its tenant and token, so (the entries being
        // distinct, and as many as the records) each record is in it exactly once; every
        // expiry-index entry names an active record bound to no session, filed at its indexed
        // expiry, so (as many as those records) each of them is in it exactly once, and no
        // other record is.
        for &(tenant, token, slot) in &self.by_tenant {
            if !self
                .slab
                .get(slot)
                .is_some_and(|record| record.tenant == tenant && record.fencing_token == token)
            {
                return Err(format!(
                    "tenant index entry ({tenant}, {token}, {slot}) names no such record"
                ));
            }
        }
        for &(indexed_expiry_ms, slot) in &self.by_expiry {
            if !self.slab.get(slot).is_some_and(|record| {
                record.status == RecordStatus::Active
                    && record.session.is_none()
                    && record.indexed_expiry_ms == indexed_expiry_ms
            }) {
                return Err(format!(
                    "expiry index entry ({indexed_expiry_ms}, {slot}) names no active unbound \
                     record filed there"
                ));
            }
        }
        if active_unbound != self.by_expiry.len() {
            return Err(format!(
                "expiry index has {} entries for {active_unbound} active records bound to no \
                 session",
                self.by_expiry.len()
            ));
        }
        if active != self.by_expiry.len() + self.sessions.by_session.len() {
            return Err(format!(
                "expiry index has {} entries and sessions bind {} for {active} active records",
                self.by_expiry.len(),
                self.sessions.by_session.len()
            ));
        }
        self.check_session_invariants()?;
        self.check_wait_invariants()?;
        self.dedup.check()?;
        if inactive != self.inactive_count {
            return Err(format!(
                "inactive count {} but {inactive} inactive records",
                self.inactive_count
            ));
        }
        for ((tenant, state), index) in self.tenants.iter().enumerate().zip(0u32..) {
            if state.active_leases != active_per_tenant[tenant] {
                return Err(format!(
                    "tenant {}: count {} but {} active records",
                    state.name, state.active_leases, active_per_tenant[tenant]
                ));
            }
            if self.tenant_index.get(&state.name) != Some(&index) {
                return Err(format!("tenant {}: name index disagrees", state.name));
            }
        }
        Ok(())
    }
}

/// How [`LeaseStateMachine::check_invariants_with`] checks the key index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyIndexCheck {
    /// Every record is looked up by its key and must be found at its own slot.
    Lookup,
    /// The index was just built from the records themselves (a restore): only its size.
    BuiltFromRecords,
}

/// The parts of a record a grant needs, copied out so the record's borrow can end.
struct ViewParts {
    lease_id: LeaseId,
    fencing_token: u64,
    expires_at_ms: u64,
    ttl_ms: u64,
}

fn grant(parts: ViewParts, now_ms: u64, created: bool) -> LeaseGrant {
    LeaseGrant {
        lease_id: parts.lease_id,
        fencing_token: parts.fencing_token,
        log_time_ms: now_ms,
        expires_at_ms: parts.expires_at_ms,
        ttl_ms: parts.ttl_ms,
        created,
    }
}

fn record_view_parts(record: &LeaseRecord) -> ViewParts {
    ViewParts {
        lease_id: record.lease_id(),
        fencing_token: record.fencing_token,
        expires_at_ms: record.expires_at_ms,
        ttl_ms: u64::from(record.ttl_ms),
    }
}

fn check_ttl(ttl_ms: u64, policy: &TenantPolicy, limits: &GroupLimits) -> Result<(), LeaseError> {
    let (min, max) = policy.ttl_bounds_ms(limits);
    if ttl_ms < min || ttl_ms > max {
        return Err(LeaseError::invalid(
            "ttl_ms",
            format!("{ttl_ms} is outside the allowed range [{min}, {max}] ms"),
        ));
    }
    Ok(())
}

/// The in-memory indexes contradict each other: a bug. Continuing could let replicas diverge
/// or grant twice, so the process stops (contract: crash on a broken safety invariant).
#[cold]
fn index_invariant_broken(slot: u32) -> ! {
    panic!("lease state invariant broken: an index names empty slot {slot}")
}

const PAGE_TOKEN_PREFIX: &str = "v1.";

fn format_page_token(token: u64, slot: u32) -> String {
    format!("{PAGE_TOKEN_PREFIX}{token:x}.{slot:x}")
}

fn parse_page_token(text: &str) -> Result<(u64, u32), LeaseError> {
    let invalid = || LeaseError::invalid("page_token", "not a token this service issued");
    let rest = text.strip_prefix(PAGE_TOKEN_PREFIX).ok_or_else(invalid)?;
    let (token, slot) = rest.split_once('.').ok_or_else(invalid)?;
    let token = u64::from_str_radix(token, 16).map_err(|_| invalid())?;
    let slot = u32::from_str_radix(slot, 16).map_err(|_| invalid())?;
    Ok((token, slot))
}
