//! FIFO wait queues in one group: AcquireWait, WaitCancel, and the hand-off that grants a
//! released or expired resource to its first live waiter in the same apply.
//!
//! A waiter is an AcquireWait that found its resource held. It waits in the resource's queue in
//! the replicated state until one of:
//! - the resource's lease ends (release, its own expiry, its session's end, or an Acquire that
//!   finds it past its expiry): the first waiter still alive at that log time gets the resource
//!   in the same apply, with the next fencing token, and its request id records the grant, so a
//!   retry of it finds the grant. Waiters found dead on the way (wait passed, session ended)
//!   are dropped;
//! - its wait passes: an Expire entry drops it (WAIT_ENDED, timed out);
//! - its holder cancels it (WaitCancel).
//!
//! Every end of a wait is reported in the entry's [`ApplyOutput::waits_ended`], which is what
//! the server answers the waiting call with. A queued request id is not recorded in the
//! request-id table while it waits: the waiter is its record, and a retry finds its current
//! position (never a second place). Its end is recorded (the grant, or the error).
//!
//! Layout: `waiters` holds every waiter under a sequence number that only grows, so a
//! resource's queue order is its waiters' sequence order; `queues` indexes each resource's
//! sequence numbers; `by_deadline` orders every waiter by the end of its wait. Only `waiters`
//! and the next sequence number are in the snapshot; the rest is rebuilt.
//!
//! Invariant: a resource has a queue only while its lease record is in status Active (held, or
//! past its expiry and not yet reclaimed). Every path that ends a lease goes through
//! [`LeaseStateMachine::end_lease`], which hands off or drops the queue.
//!
//! Must not depend on: anything outside this crate's state machine (no clock, no I/O).
//!
//! [`ApplyOutput::waits_ended`]: crate::command::ApplyOutput::waits_ended

use std::collections::{BTreeMap, BTreeSet};

use compact_str::CompactString;
use hashbrown::HashMap;
use serde::{Deserialize, Serialize};

use super::dedup::{self, HashBuilder};
use super::{Binding, LeaseStateMachine, RecordStatus, check_ttl, grant};
use crate::command::{
    LeaseOp, LeaseReply, QueuedReceipt, ReclaimedLease, WaitAcquireRequest, WaitCancelReceipt,
    WaitCancelRequest, WaitEnded, WaitLease,
};
use crate::error::{LeaseError, QuotaKind, WaitEndReason};
use crate::ids::SessionId;
use crate::limits::TenantPolicy;
use crate::negative::NegativeControl;
use crate::validate::{validate_holder_id, validate_request_id};

/// Most waiters one resource's queue holds.
pub const RESOURCE_WAITERS_MAX: u32 = 4_096;

/// Most waiters one group holds, whatever its `lease_records_max` (the lower of the two
/// applies). A tenant has at most its active-lease quota of waiters in a group.
pub const GROUP_WAITERS_MAX: u64 = 65_536;

/// One queued AcquireWait.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Waiter {
    pub(crate) tenant: u32,
    pub(crate) resource_id: CompactString,
    pub(crate) holder_id: CompactString,
    pub(crate) request_id: CompactString,
    /// The request-id fingerprint of its AcquireWait (a retry must match it).
    pub(crate) fingerprint: u64,
    pub(crate) lease: WaitLease,
    pub(crate) queued_at_ms: u64,
    pub(crate) wait_until_ms: u64,
}

/// The wait queues of one group (see the module documentation).
#[derive(Debug, Clone)]
pub(crate) struct WaitQueues {
    pub(crate) waiters: BTreeMap<u64, Waiter>,
    pub(crate) queues: HashMap<(u32, CompactString), BTreeSet<u64>, HashBuilder>,
    pub(crate) by_deadline: BTreeSet<(u64, u64)>,
    /// Waiters per tenant index (derived).
    pub(crate) per_tenant: Vec<u64>,
    /// `(tenant, session, sequence)` of every waiter bound to a session (derived): they leave
    /// the queues when their session's record ends.
    pub(crate) by_session: BTreeSet<(u32, u128, u64)>,
    pub(crate) next_sequence: u64,
    /// Waits the entry being applied ended; `apply` moves them into its output. Not state.
    pub(crate) ended: Vec<WaitEnded>,
}

impl WaitQueues {
    pub(crate) fn new(hash_builder: HashBuilder) -> Self {
        WaitQueues {
            waiters: BTreeMap::new(),
            queues: HashMap::with_hasher(hash_builder),
            by_deadline: BTreeSet::new(),
            per_tenant: Vec::new(),
            by_session: BTreeSet::new(),
            next_sequence: 1,
            ended: Vec::new(),
        }
    }

    fn queue(&self, tenant: u32, resource_id: &str) -> Option<&BTreeSet<u64>> {
        if self.queues.is_empty() {
            return None;
        }
        self.queues.get(&(tenant, CompactString::from(resource_id)))
    }

    /// Files a waiter under `sequence` in every index (enqueue and restore).
    pub(crate) fn insert(&mut self, sequence: u64, waiter: Waiter) {
        self.queues
            .entry((waiter.tenant, waiter.resource_id.clone()))
            .or_default()
            .insert(sequence);
        self.by_deadline.insert((waiter.wait_until_ms, sequence));
        let tenant = waiter.tenant as usize;
        if self.per_tenant.len() <= tenant {
            self.per_tenant.resize(tenant + 1, 0);
        }
        self.per_tenant[tenant] += 1;
        if let WaitLease::Session { session_id } = waiter.lease {
            self.by_session
                .insert((waiter.tenant, session_id.0, sequence));
        }
        self.waiters.insert(sequence, waiter);
    }

    fn remove(&mut self, sequence: u64) -> Option<Waiter> {
        let waiter = self.waiters.remove(&sequence)?;
        let key = (waiter.tenant, waiter.resource_id.clone());
        if let Some(queue) = self.queues.get_mut(&key) {
            queue.remove(&sequence);
            if queue.is_empty() {
                self.queues.remove(&key);
            }
        }
        self.by_deadline.remove(&(waiter.wait_until_ms, sequence));
        if let WaitLease::Session { session_id } = waiter.lease {
            self.by_session
                .remove(&(waiter.tenant, session_id.0, sequence));
        }
        if let Some(count) = self.per_tenant.get_mut(waiter.tenant as usize) {
            *count = count.saturating_sub(1);
        }
        Some(waiter)
    }

    fn tenant_waiters(&self, tenant: u32) -> u64 {
        self.per_tenant.get(tenant as usize).copied().unwrap_or(0)
    }

    pub(crate) fn next_deadline_ms(&self) -> Option<u64> {
        self.by_deadline.first().map(|&(at, _)| at)
    }
}

/// How late the negative control [`NegativeControl::HandOffToDeadWaiters`] drops a waiter whose
/// wait has passed (so hand-offs in between reach it).
const DEAD_WAITER_KEPT_MS: u64 = 5_000;

impl LeaseStateMachine {
    /// Whether any AcquireWait is queued in this group (a reclaim may hand a resource to it).
    pub fn has_queued_waits(&self) -> bool {
        self.waits.next_deadline_ms().is_some()
    }

    /// When the next queued wait ends (an Expire entry then drops it).
    pub(crate) fn next_wait_end_ms(&self) -> Option<u64> {
        let end = self.waits.next_deadline_ms()?;
        if self
            .negative_control
            .breaks(NegativeControl::HandOffToDeadWaiters)
        {
            return Some(end.saturating_add(DEAD_WAITER_KEPT_MS));
        }
        Some(end)
    }

    /// An operation whose request id is a queued wait's: a retried AcquireWait gets its current
    /// position; anything else (another request) the request-id conflict. `None` when no wait
    /// with that request id is queued on the resource.
    pub(crate) fn queued_retry(
        &self,
        op: &LeaseOp,
        fingerprint: u64,
        now_ms: u64,
    ) -> Option<Result<LeaseReply, LeaseError>> {
        let key = op.key()?;
        let tenant = *self.tenant_index.get(key.tenant_id.as_str())?;
        let sequence = self.find_waiter(tenant, &key.resource_id, op.request_id())?;
        let waiter = self.waits.waiters.get(&sequence)?;
        // Another operation reusing a queued wait's request id is a conflict, as it would be
        // with the wait's own record: it must not be recorded beside the waiter (whose outcome
        // is recorded under that id when the wait ends).
        if !matches!(op, LeaseOp::AcquireWait(_)) || waiter.fingerprint != fingerprint {
            return Some(Err(dedup::conflict_error()));
        }
        Some(Ok(self.queued_receipt(sequence, now_ms)))
    }

    fn find_waiter(&self, tenant: u32, resource_id: &str, request_id: &str) -> Option<u64> {
        self.waits
            .queue(tenant, resource_id)?
            .iter()
            .copied()
            .find(|sequence| {
                self.waits
                    .waiters
                    .get(sequence)
                    .is_some_and(|w| w.request_id == request_id)
            })
    }

    fn queued_receipt(&self, sequence: u64, now_ms: u64) -> LeaseReply {
        let (position, waiters, queued_at_ms, wait_until_ms, holder_id) =
            match self.waits.waiters.get(&sequence) {
                Some(waiter) => {
                    let queue = self.waits.queue(waiter.tenant, &waiter.resource_id);
                    let holder = self
                        .find_slot(waiter.tenant, &waiter.resource_id)
                        .and_then(|slot| self.slab.get(slot))
                        .map(|record| record.holder_id.clone())
                        .unwrap_or_default();
                    (
                        queue.map_or(0, |q| q.range(..sequence).count()),
                        queue.map_or(0, BTreeSet::len),
                        waiter.queued_at_ms,
                        waiter.wait_until_ms,
                        holder,
                    )
                }
                None => (0, 0, now_ms, now_ms, CompactString::default()),
            };
        LeaseReply::Queued(QueuedReceipt {
            position: u32::try_from(position).unwrap_or(u32::MAX),
            waiters: u32::try_from(waiters).unwrap_or(u32::MAX),
            queued_at_ms,
            wait_until_ms,
            log_time_ms: now_ms,
            holder_id,
        })
    }

    /// AcquireWait, not replayed and not already queued: grant at once if the resource is free
    /// (after handing a lease past its expiry to the queue, if it has one), else queue.
    pub(crate) fn acquire_wait(
        &mut self,
        op: &LeaseOp,
        request: &WaitAcquireRequest,
        now_ms: u64,
        reclaimed: &mut Vec<ReclaimedLease>,
    ) -> Result<LeaseReply, LeaseError> {
        let known_tenant = self
            .tenant_index
            .get(request.key.tenant_id.as_str())
            .copied();
        let default_policy = TenantPolicy::default();
        let policy = known_tenant.map_or(&default_policy, |t| &self.tenants[t as usize].policy);
        let (_, wait_ms_max) = policy.ttl_bounds_ms(&self.limits);
        if request.wait_ms == 0 || request.wait_ms > wait_ms_max {
            return Err(LeaseError::invalid(
                "wait_ms",
                format!(
                    "{} is outside the allowed range [1, {wait_ms_max}] ms",
                    request.wait_ms
                ),
            ));
        }
        let (tenant, binding) = match request.lease {
            WaitLease::Ttl { ttl_ms } => {
                let tenant = self.tenant_or_create(&request.key.tenant_id)?;
                check_ttl(ttl_ms, &self.tenants[tenant as usize].policy, &self.limits)?;
                (tenant, Binding::Own { ttl_ms })
            }
            WaitLease::Session { session_id } => {
                let tenant = known_tenant.ok_or(LeaseError::SessionNotFound { session_id })?;
                let slot = self.live_session(
                    Some(tenant),
                    session_id,
                    ("holder_id", &request.holder_id),
                    now_ms,
                )?;
                (tenant, Binding::Session { slot })
            }
        };
        self.settle_due_lease(tenant, &request.key.resource_id, now_ms, reclaimed);
        let held = self
            .find_slot(tenant, &request.key.resource_id)
            .map(|slot| self.record(slot))
            .map(|record| (record, self.lease_state(record)))
            .filter(|(_, state)| state.is_active_at(now_ms));
        let Some((record, state)) = held else {
            return self.grant_resource(
                tenant,
                &request.key,
                &request.holder_id,
                binding,
                now_ms,
                reclaimed,
            );
        };
        if record.holder_id == request.holder_id {
            // Not re-entrant: a holder waiting for itself would wait forever.
            return Err(LeaseError::AlreadyHeld {
                holder_id: record.holder_id.clone(),
                remaining_ttl_ms: state.expires_at_ms - now_ms,
            });
        }
        let queue_len = self
            .waits
            .queue(tenant, &request.key.resource_id)
            .map_or(0, BTreeSet::len);
        if queue_len >= RESOURCE_WAITERS_MAX as usize {
            return Err(LeaseError::QuotaExceeded {
                kind: QuotaKind::ResourceWaiters,
                limit: u64::from(RESOURCE_WAITERS_MAX),
            });
        }
        let group_max = GROUP_WAITERS_MAX.min(self.limits.lease_records_max);
        if self.waits.waiters.len() as u64 >= group_max {
            return Err(LeaseError::QuotaExceeded {
                kind: QuotaKind::GroupWaiters,
                limit: group_max,
            });
        }
        let tenant_max = self.tenants[tenant as usize]
            .policy
            .active_leases_max(&self.limits);
        if self.waits.tenant_waiters(tenant) >= tenant_max {
            return Err(LeaseError::QuotaExceeded {
                kind: QuotaKind::TenantWaiters,
                limit: tenant_max,
            });
        }
        let mut scratch = Vec::new();
        let fingerprint = dedup::fingerprint(op, &mut scratch);
        let sequence = self.waits.next_sequence;
        self.waits.next_sequence += 1;
        self.waits.insert(
            sequence,
            Waiter {
                tenant,
                resource_id: CompactString::from(request.key.resource_id.as_str()),
                holder_id: CompactString::from(request.holder_id.as_str()),
                request_id: CompactString::from(request.request_id.as_str()),
                fingerprint,
                lease: request.lease,
                queued_at_ms: now_ms,
                wait_until_ms: now_ms.saturating_add(request.wait_ms),
            },
        );
        Ok(self.queued_receipt(sequence, now_ms))
    }

    /// WaitCancel: takes the wait out of its queue (recording WAIT_ENDED, cancelled, under its
    /// request id), or reports the grant it already got.
    pub(crate) fn cancel_wait(
        &mut self,
        request: &WaitCancelRequest,
        now_ms: u64,
    ) -> Result<LeaseReply, LeaseError> {
        request.key.validate()?;
        validate_request_id(&request.request_id)?;
        validate_holder_id(&request.holder_id)?;
        let tenant = self
            .tenant_index
            .get(request.key.tenant_id.as_str())
            .copied();
        let queued = tenant.and_then(|tenant| {
            self.find_waiter(tenant, &request.key.resource_id, &request.request_id)
        });
        if let Some(sequence) = queued {
            let owner = self
                .waits
                .waiters
                .get(&sequence)
                .is_some_and(|w| w.holder_id == request.holder_id);
            if !owner {
                return Err(LeaseError::invalid(
                    "holder_id",
                    "is not the holder of the wait this request id names",
                ));
            }
            if let Some(waiter) = self.waits.remove(sequence) {
                self.end_wait(
                    waiter,
                    Err(LeaseError::WaitEnded {
                        reason: WaitEndReason::Cancelled,
                    }),
                    None,
                );
            }
            return Ok(LeaseReply::WaitCancelled(WaitCancelReceipt {
                cancelled: true,
                granted: None,
            }));
        }
        let mut packed = Vec::new();
        dedup::pack_identity(
            &mut packed,
            &request.key.tenant_id,
            &request.key.resource_id,
            &request.request_id,
        );
        let record = self.dedup.lookup_identity(&packed, now_ms, &self.limits);
        let unknown = record.is_none();
        let granted = record.and_then(|record| match &record.outcome {
            Ok(LeaseReply::Acquired(grant)) => Some(grant.clone()),
            _ => None,
        });
        if unknown
            && self
                .dedup
                .reserve_one(&packed, now_ms, &self.limits)
                .is_ok()
        {
            // The group has never seen the wait (or forgot it): the cancel came first, its wait
            // may still be on its way (an attempt its client gave up on). A tombstone under the
            // wait's request id makes that wait, if it comes, a request-id conflict instead of
            // a place in the queue that nobody waits for (and a grant nobody would use, held
            // until its ttl or its session ends). Best effort: with the request-id table full,
            // no tombstone.
            let op = LeaseOp::WaitCancel(request.clone());
            let fingerprint = dedup::fingerprint(&op, &mut Vec::new());
            let cancelled = LeaseError::WaitEnded {
                reason: WaitEndReason::Cancelled,
            };
            self.dedup
                .record(&packed, fingerprint, now_ms, Err(cancelled));
        }
        Ok(LeaseReply::WaitCancelled(WaitCancelReceipt {
            cancelled: false,
            granted,
        }))
    }

    /// Records a wait's end under its request id and in the entry's output.
    fn end_wait(
        &mut self,
        waiter: Waiter,
        outcome: Result<LeaseReply, LeaseError>,
        previous_fencing_token: Option<u64>,
    ) {
        let now_ms = self.last_log_time_ms;
        let mut packed = Vec::new();
        let tenant_name = self.tenants[waiter.tenant as usize].name.clone();
        dedup::pack_identity(
            &mut packed,
            &tenant_name,
            &waiter.resource_id,
            &waiter.request_id,
        );
        // A full table cannot refuse an end that already happened: the record goes in anyway,
        // so the ring may pass its bound by at most the waiters ended in one entry (bounded by
        // GROUP_WAITERS_MAX); the next reserve brings it back.
        let _ = self.dedup.reserve_one(&packed, now_ms, &self.limits);
        self.dedup
            .record(&packed, waiter.fingerprint, now_ms, outcome.clone());
        self.waits.ended.push(WaitEnded {
            tenant_id: tenant_name,
            resource_id: waiter.resource_id,
            holder_id: waiter.holder_id,
            request_id: waiter.request_id,
            queued_at_ms: waiter.queued_at_ms,
            wait_until_ms: waiter.wait_until_ms,
            outcome,
            previous_fencing_token,
        });
    }

    /// The lease at `slot` has just ended (released, expired, or its session ended): its status
    /// is no longer Active and it is in no expiry index. Hands the resource to its first live
    /// waiter in this same apply, or else retires the record (inactive, for retention).
    pub(crate) fn end_lease(&mut self, slot: u32) {
        if !self.waits.queues.is_empty() && self.hand_off(slot) {
            return;
        }
        let record = self.record(slot);
        let (tenant, token) = (record.tenant, record.fencing_token);
        self.tenants[tenant as usize].active_leases -= 1;
        self.mark_inactive(slot, token);
    }

    /// Grants the ended lease's resource to the first waiter alive at the current log time,
    /// dropping dead ones on the way. True when it granted (the record is active again, for the
    /// waiter, with the next token; the tenant's active count is unchanged).
    fn hand_off(&mut self, slot: u32) -> bool {
        let now_ms = self.last_log_time_ms;
        let record = self.record(slot);
        let (tenant, old_token) = (record.tenant, record.fencing_token);
        let resource_id = record.resource_id.clone();
        loop {
            let lifo = self.negative_control.breaks(NegativeControl::WaitQueueLifo);
            let Some(sequence) = self
                .waits
                .queue(tenant, &resource_id)
                .and_then(|queue| if lifo { queue.last() } else { queue.first() })
                .copied()
            else {
                return false;
            };
            let Some(waiter) = self.waits.remove(sequence) else {
                return false;
            };
            let binding = match self.waiter_binding(&waiter, now_ms) {
                Ok(binding) => binding,
                Err(reason) => {
                    self.end_wait(waiter, Err(LeaseError::WaitEnded { reason }), None);
                    continue;
                }
            };
            let (ttl_ms, expires_at_ms) = match binding {
                Binding::Own { ttl_ms } => (ttl_ms, now_ms.saturating_add(ttl_ms)),
                Binding::Session { slot } => {
                    let session = self.session(slot);
                    (u64::from(session.ttl_ms), session.expires_at_ms)
                }
            };
            let Ok(ttl_ms) = u32::try_from(ttl_ms) else {
                let reason = WaitEndReason::TtlOutOfBounds;
                self.end_wait(waiter, Err(LeaseError::WaitEnded { reason }), None);
                continue;
            };
            let token = self.take_sequence_above(old_token);
            let parts = self.regrant(
                slot,
                (tenant, old_token),
                &waiter.holder_id,
                (token, ttl_ms),
                expires_at_ms,
                binding,
            );
            let outcome = Ok(LeaseReply::Acquired(grant(parts, now_ms, true)));
            self.end_wait(waiter, outcome, Some(old_token));
            return true;
        }
    }

    /// Whether a waiter is alive at `now_ms`, and the lease it would get.
    fn waiter_binding(&self, waiter: &Waiter, now_ms: u64) -> Result<Binding, WaitEndReason> {
        if now_ms >= waiter.wait_until_ms
            && !self
                .negative_control
                .breaks(NegativeControl::HandOffToDeadWaiters)
        {
            return Err(WaitEndReason::TimedOut);
        }
        match waiter.lease {
            WaitLease::Ttl { ttl_ms } => {
                check_ttl(
                    ttl_ms,
                    &self.tenants[waiter.tenant as usize].policy,
                    &self.limits,
                )
                .map_err(|_| WaitEndReason::TtlOutOfBounds)?;
                Ok(Binding::Own { ttl_ms })
            }
            WaitLease::Session { session_id } => {
                let slot = self
                    .find_session(waiter.tenant, session_id)
                    .filter(|&slot| {
                        let session = self.session(slot);
                        session.owner_id == waiter.holder_id && session.is_active_at(now_ms)
                    })
                    .ok_or(WaitEndReason::SessionEnded)?;
                Ok(Binding::Session { slot })
            }
        }
    }

    /// Before an Acquire or AcquireWait decides on a resource that has waiters: a lease past
    /// its expiry (or whose session ended) but not yet reclaimed ends now and goes to the queue,
    /// so nobody overtakes the waiters. Does nothing for a resource without a queue.
    pub(crate) fn settle_due_lease(
        &mut self,
        tenant: u32,
        resource_id: &str,
        now_ms: u64,
        reclaimed: &mut Vec<ReclaimedLease>,
    ) {
        if self.waits.queue(tenant, resource_id).is_none() {
            return;
        }
        let Some(slot) = self.find_slot(tenant, resource_id) else {
            return;
        };
        let record = self.record(slot);
        let state = self.lease_state(record);
        if record.status != RecordStatus::Active || state.is_active_at(now_ms) {
            return;
        }
        let session = record.session;
        let session_id = session.map(|s| self.session(s).session_id);
        self.unfile_active(slot);
        let record = self.record_mut(slot);
        record.status = RecordStatus::Expired;
        record.expires_at_ms = state.expires_at_ms;
        record.indexed_expiry_ms = state.expires_at_ms;
        let (token, lease_id) = (record.fencing_token, super::LeaseRecord::lease_id(record));
        let resource_id = record.resource_id.clone();
        reclaimed.push(ReclaimedLease {
            tenant_id: self.tenants[tenant as usize].name.clone(),
            resource_id,
            lease_id,
            fencing_token: token,
            expires_at_ms: state.expires_at_ms,
            session_id,
        });
        self.end_lease(slot);
    }

    /// The record of `session_id` ended (expired or closed): its waiters leave their queues now
    /// (WAIT_ENDED, session ended) instead of holding places until a hand-off skips them or
    /// their wait passes.
    pub(crate) fn end_session_waiters(&mut self, tenant: u32, session_id: SessionId) {
        if self.waits.by_session.is_empty() {
            return;
        }
        let bound: Vec<u64> = self
            .waits
            .by_session
            .range((tenant, session_id.0, 0)..=(tenant, session_id.0, u64::MAX))
            .map(|&(_, _, sequence)| sequence)
            .collect();
        for sequence in bound {
            if let Some(waiter) = self.waits.remove(sequence) {
                let reason = WaitEndReason::SessionEnded;
                self.end_wait(waiter, Err(LeaseError::WaitEnded { reason }), None);
            }
        }
    }

    /// Drops the waiter whose wait ends first (due): WAIT_ENDED, timed out.
    pub(crate) fn expire_front_waiter(&mut self) {
        let Some(&(_, sequence)) = self.waits.by_deadline.first() else {
            return;
        };
        if let Some(waiter) = self.waits.remove(sequence) {
            let reason = WaitEndReason::TimedOut;
            self.end_wait(waiter, Err(LeaseError::WaitEnded { reason }), None);
        } else {
            self.waits.by_deadline.pop_first();
        }
    }

    /// Cross-checks the queues against each other and the lease records.
    pub(crate) fn check_wait_invariants(&self) -> Result<(), String> {
        let waits = &self.waits;
        let mut per_tenant = vec![0u64; self.tenants.len()];
        let mut queued = 0usize;
        for ((tenant, resource_id), queue) in &waits.queues {
            if queue.is_empty() {
                return Err(format!("empty wait queue for {tenant}/{resource_id}"));
            }
            if queue.len() > RESOURCE_WAITERS_MAX as usize {
                return Err(format!(
                    "wait queue for {tenant}/{resource_id} is over its bound"
                ));
            }
            let active = self
                .find_slot(*tenant, resource_id)
                .and_then(|slot| self.slab.get(slot))
                .is_some_and(|r| r.status == RecordStatus::Active);
            if !active {
                return Err(format!(
                    "wait queue for {tenant}/{resource_id} without an active lease record"
                ));
            }
            for sequence in queue {
                let Some(waiter) = waits.waiters.get(sequence) else {
                    return Err(format!("wait queue names missing waiter {sequence}"));
                };
                if waiter.tenant != *tenant || waiter.resource_id != *resource_id {
                    return Err(format!("waiter {sequence} queued under another resource"));
                }
                if !waits
                    .by_deadline
                    .contains(&(waiter.wait_until_ms, *sequence))
                {
                    return Err(format!("waiter {sequence} missing from the deadline index"));
                }
                if let WaitLease::Session { session_id } = waiter.lease
                    && !waits
                        .by_session
                        .contains(&(waiter.tenant, session_id.0, *sequence))
                {
                    return Err(format!("waiter {sequence} missing from the session index"));
                }
                let Some(count) = per_tenant.get_mut(waiter.tenant as usize) else {
                    return Err(format!("waiter {sequence}: unknown tenant"));
                };
                *count += 1;
                queued += 1;
            }
        }
        let session_bound = waits
            .waiters
            .values()
            .filter(|w| matches!(w.lease, WaitLease::Session { .. }))
            .count();
        if waits.by_session.len() != session_bound {
            return Err(format!(
                "{session_bound} waiters bound to sessions, {} in the session index",
                waits.by_session.len()
            ));
        }
        if queued != waits.waiters.len() || waits.by_deadline.len() != waits.waiters.len() {
            return Err(format!(
                "{} waiters, {queued} queued, {} in the deadline index",
                waits.waiters.len(),
                waits.by_deadline.len()
            ));
        }
        if waits
            .waiters
            .last_key_value()
            .is_some_and(|(&sequence, _)| sequence >= waits.next_sequence)
        {
            return Err("a waiter's sequence is not below the next one".into());
        }
        for (tenant, &count) in per_tenant.iter().enumerate() {
            if waits.per_tenant.get(tenant).copied().unwrap_or(0) != count {
                return Err(format!("tenant {tenant}: waiter count disagrees"));
            }
        }
        Ok(())
    }
}
