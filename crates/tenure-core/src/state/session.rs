//! Sessions in one group: the group's record of each session, the leases bound to it, and how a
//! session's end ends them.
//!
//! A session is kept per group (contract, sessions section): opening it in a group creates that
//! group's record, each keep-alive extends that record, and a lease acquired in the session is
//! bound to the record of its own group. So losing one group's quorum ends only that group's
//! record and its leases. Layout:
//! - `sessions`: every session record in a slab under a stable `u32` slot;
//! - `session_index`: a hash table of slots keyed by `(tenant, session_id)`;
//! - `session_by_expiry`: `(indexed expiry, slot)` of every active record (keep-alives leave the
//!   index alone, like renewals; reclaim re-files);
//! - `by_session`: `(session slot, lease slot)` of every active bound lease: a bound lease is in
//!   neither `by_expiry` nor anywhere else with a time of its own;
//! - `sessions_ending`: `(end, slot)` of ended records that still have bound leases: Expire
//!   entries end those leases a bounded number at a time, oldest end first;
//! - `ended_sessions`: ended records without bound leases, in the order they became so: kept
//!   for `inactive_retention_ms` (a late keep-alive gets SESSION_EXPIRED, not NOT_FOUND), then
//!   freed.
//!
//! Reads never wait for that reclaim: a bound lease's status and expiry are its record's
//! ([`LeaseStateMachine::lease_state`]), so once a session has ended no read reports its leases
//! active, and an Acquire may take their resources at once.
//!
//! Must not depend on: anything outside this crate's state machine (no clock, no I/O).

use std::collections::{BTreeSet, VecDeque};
use std::hash::BuildHasher;

use compact_str::CompactString;
use hashbrown::HashTable;
use serde::{Deserialize, Serialize};

use super::slab::Slab;
use super::{LeaseStateMachine, RecordStatus, check_ttl};
use crate::command::{
    LeaseReply, ReclaimedLease, SessionGrant, SessionOpenRequest, SessionReceipt, SessionRequest,
};
use crate::error::{LeaseError, QuotaKind};
use crate::ids::{GroupId, SessionId};
use crate::validate::{validate_holder_id, validate_tenant_id};

/// Most session records one group holds (active and retained ended ones), whatever its
/// `lease_records_max` (the lower of the two applies).
pub const GROUP_SESSIONS_MAX: u64 = 65_536;

/// Stored status of a session record. `Active` records may be past their expiry until reclaimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum SessionStatus {
    Active,
    Expired,
    Closed,
}

/// A group's record of one session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SessionRecord {
    pub(crate) tenant: u32,
    pub(crate) session_id: SessionId,
    pub(crate) owner_id: CompactString,
    pub(crate) ttl_ms: u32,
    /// Expiry while active; the moment it ended once expired or closed.
    pub(crate) expires_at_ms: u64,
    /// While active: the expiry under which the record sits in `session_by_expiry` (at most
    /// `expires_at_ms`; keep-alives do not move it).
    pub(crate) indexed_expiry_ms: u64,
    /// Leases bound to this record that are still in status Active.
    pub(crate) bound_leases: u64,
    pub(crate) status: SessionStatus,
}

impl SessionRecord {
    pub(crate) fn is_active_at(&self, now_ms: u64) -> bool {
        self.status == SessionStatus::Active && now_ms < self.expires_at_ms
    }
}

/// The session tables of one group (see the module documentation).
#[derive(Debug, Clone)]
pub(crate) struct SessionTables {
    pub(crate) records: Slab<SessionRecord>,
    pub(crate) index: HashTable<u32>,
    pub(crate) by_expiry: BTreeSet<(u64, u32)>,
    pub(crate) by_session: BTreeSet<(u32, u32)>,
    pub(crate) ending: BTreeSet<(u64, u32)>,
    pub(crate) ended: VecDeque<u32>,
    /// Records in status Active per tenant index (derived: rebuilt on restore).
    pub(crate) active_per_tenant: Vec<u64>,
}

impl SessionTables {
    pub(crate) fn new() -> Self {
        SessionTables {
            records: Slab::new(),
            index: HashTable::new(),
            by_expiry: BTreeSet::new(),
            by_session: BTreeSet::new(),
            ending: BTreeSet::new(),
            ended: VecDeque::new(),
            active_per_tenant: Vec::new(),
        }
    }
}

impl LeaseStateMachine {
    pub(crate) fn session(&self, slot: u32) -> &SessionRecord {
        self.sessions
            .records
            .get(slot)
            .unwrap_or_else(|| super::index_invariant_broken(slot))
    }

    fn session_mut(&mut self, slot: u32) -> &mut SessionRecord {
        self.sessions
            .records
            .get_mut(slot)
            .unwrap_or_else(|| super::index_invariant_broken(slot))
    }

    pub(crate) fn find_session(&self, tenant: u32, session_id: SessionId) -> Option<u32> {
        let hash = self.hash_builder.hash_one((tenant, session_id.0));
        self.sessions
            .index
            .find(hash, |&slot| {
                self.sessions
                    .records
                    .get(slot)
                    .is_some_and(|r| r.tenant == tenant && r.session_id == session_id)
            })
            .copied()
    }

    pub(crate) fn index_session(&mut self, slot: u32) {
        let hash_builder = &self.hash_builder;
        let records = &self.sessions.records;
        let hash_of = |slot: u32| {
            records
                .get(slot)
                .map_or(0, |r| hash_builder.hash_one((r.tenant, r.session_id.0)))
        };
        self.sessions
            .index
            .insert_unique(hash_of(slot), slot, |&s| hash_of(s));
    }

    fn tenant_sessions_add(&mut self, tenant: u32, delta: i64) {
        let counts = &mut self.sessions.active_per_tenant;
        if counts.len() <= tenant as usize {
            counts.resize(tenant as usize + 1, 0);
        }
        let count = &mut counts[tenant as usize];
        *count = count.saturating_add_signed(delta);
    }

    /// The checks every session-record operation starts with: well-formed ids, the right group.
    fn check_session_request(
        &self,
        tenant_id: &str,
        group_id: GroupId,
        owner_id: &str,
    ) -> Result<(), LeaseError> {
        validate_tenant_id(tenant_id)?;
        validate_holder_id(owner_id)?;
        if group_id != self.group_id {
            return Err(LeaseError::invalid(
                "group_id",
                format!(
                    "names group {group_id}, but this is group {}",
                    self.group_id
                ),
            ));
        }
        Ok(())
    }

    /// The session's record in this group if it is owned by `owner` (the request's field name
    /// and value) and active at `now_ms`: SESSION_NOT_FOUND, the owner check (so another owner
    /// learns nothing of the record's state), then SESSION_EXPIRED (also for closed).
    pub(crate) fn live_session(
        &self,
        tenant: Option<u32>,
        session_id: SessionId,
        (owner_field, owner_id): (&str, &str),
        now_ms: u64,
    ) -> Result<u32, LeaseError> {
        let slot = tenant
            .and_then(|t| self.find_session(t, session_id))
            .ok_or(LeaseError::SessionNotFound { session_id })?;
        let record = self.session(slot);
        if record.owner_id != owner_id {
            return Err(LeaseError::invalid(
                owner_field,
                "is not the owner the session was opened with",
            ));
        }
        if !record.is_active_at(now_ms) {
            return Err(LeaseError::SessionExpired { session_id });
        }
        Ok(slot)
    }

    fn session_grant(&self, slot: u32, now_ms: u64, created: bool) -> LeaseReply {
        let record = self.session(slot);
        LeaseReply::SessionKept(SessionGrant {
            session_id: record.session_id,
            group_id: self.group_id,
            log_time_ms: now_ms,
            expires_at_ms: record.expires_at_ms,
            ttl_ms: u64::from(record.ttl_ms),
            created,
            bound_leases: record.bound_leases,
        })
    }

    pub(crate) fn open_session(
        &mut self,
        request: &SessionOpenRequest,
        now_ms: u64,
        reclaimed: &mut Vec<ReclaimedLease>,
    ) -> Result<LeaseReply, LeaseError> {
        self.check_session_request(&request.tenant_id, request.group_id, &request.owner_id)?;
        let tenant = self.tenant_or_create(&request.tenant_id)?;
        let policy = &self.tenants[tenant as usize].policy;
        check_ttl(request.ttl_ms, policy, &self.limits)?;
        let quota = policy.active_leases_max(&self.limits);
        let ttl_ms = u32::try_from(request.ttl_ms)
            .map_err(|_| LeaseError::invalid("ttl_ms", "does not fit the state's 32-bit ttl"))?;
        if self.find_session(tenant, request.session_id).is_some() {
            // Opening again is a keep-alive of a live record (a retried open), and refused for
            // one that ended: a session never comes back.
            let slot = self.live_session(
                Some(tenant),
                request.session_id,
                ("owner_id", &request.owner_id),
                now_ms,
            )?;
            if u64::from(self.session(slot).ttl_ms) != request.ttl_ms {
                return Err(LeaseError::invalid(
                    "ttl_ms",
                    "differs from the ttl the session was opened with",
                ));
            }
            self.extend_session(slot, now_ms);
            return Ok(self.session_grant(slot, now_ms, false));
        }
        let active = |state: &Self| {
            state
                .sessions
                .active_per_tenant
                .get(tenant as usize)
                .copied()
                .unwrap_or(0)
        };
        if active(self) >= quota {
            // Records past expiry but not yet reclaimed must not count against the quota.
            self.reclaim_due(now_ms, self.limits.expire_batch_max, reclaimed);
        }
        if active(self) >= quota {
            return Err(LeaseError::QuotaExceeded {
                kind: QuotaKind::TenantSessions,
                limit: quota,
            });
        }
        let group_max = self.limits.lease_records_max.min(GROUP_SESSIONS_MAX);
        if self.sessions.records.occupied() as u64 >= group_max
            && !self.free_oldest_ended_session_past_retention(now_ms)
        {
            return Err(LeaseError::QuotaExceeded {
                kind: QuotaKind::GroupSessions,
                limit: group_max,
            });
        }
        let expires_at_ms = now_ms.saturating_add(request.ttl_ms);
        let record = SessionRecord {
            tenant,
            session_id: request.session_id,
            owner_id: CompactString::from(request.owner_id.as_str()),
            ttl_ms,
            expires_at_ms,
            indexed_expiry_ms: expires_at_ms,
            bound_leases: 0,
            status: SessionStatus::Active,
        };
        let Some(slot) = self.sessions.records.insert(record) else {
            return Err(LeaseError::QuotaExceeded {
                kind: QuotaKind::GroupSessions,
                limit: u64::from(u32::MAX),
            });
        };
        self.index_session(slot);
        self.sessions.by_expiry.insert((expires_at_ms, slot));
        self.tenant_sessions_add(tenant, 1);
        Ok(self.session_grant(slot, now_ms, true))
    }

    fn extend_session(&mut self, slot: u32, now_ms: u64) {
        let record = self.session_mut(slot);
        // The ttl is fixed and log time never decreases: the expiry only grows, so the index
        // entry (at most the expiry) stays valid; reclaim re-files it when it meets it.
        record.expires_at_ms = record
            .expires_at_ms
            .max(now_ms.saturating_add(u64::from(record.ttl_ms)));
    }

    pub(crate) fn keep_session_alive(
        &mut self,
        request: &SessionRequest,
        now_ms: u64,
    ) -> Result<LeaseReply, LeaseError> {
        self.check_session_request(&request.tenant_id, request.group_id, &request.owner_id)?;
        let tenant = self.tenant_index.get(request.tenant_id.as_str()).copied();
        let slot = self.live_session(
            tenant,
            request.session_id,
            ("owner_id", &request.owner_id),
            now_ms,
        )?;
        self.extend_session(slot, now_ms);
        Ok(self.session_grant(slot, now_ms, false))
    }

    pub(crate) fn close_session(
        &mut self,
        request: &SessionRequest,
        now_ms: u64,
    ) -> Result<LeaseReply, LeaseError> {
        self.check_session_request(&request.tenant_id, request.group_id, &request.owner_id)?;
        let session_id = request.session_id;
        let slot = self
            .tenant_index
            .get(request.tenant_id.as_str())
            .and_then(|&t| self.find_session(t, session_id))
            .ok_or(LeaseError::SessionNotFound { session_id })?;
        let record = self.session(slot);
        if record.owner_id != request.owner_id {
            return Err(LeaseError::invalid(
                "owner_id",
                "is not the owner the session was opened with",
            ));
        }
        match record.status {
            // Closing a closed record again answers the same (a retried close).
            SessionStatus::Closed => {
                return Ok(LeaseReply::SessionClosed(SessionReceipt {
                    session_id,
                    group_id: self.group_id,
                    closed_at_ms: record.expires_at_ms,
                    leases_ended: 0,
                }));
            }
            SessionStatus::Expired => return Err(LeaseError::SessionExpired { session_id }),
            SessionStatus::Active if !record.is_active_at(now_ms) => {
                return Err(LeaseError::SessionExpired { session_id });
            }
            SessionStatus::Active => {}
        }
        let leases_ended = record.bound_leases;
        if !self
            .negative_control
            .breaks(crate::negative::NegativeControl::SessionLeasesOutliveClose)
        {
            self.end_session(slot, SessionStatus::Closed, now_ms);
        }
        Ok(LeaseReply::SessionClosed(SessionReceipt {
            session_id,
            group_id: self.group_id,
            closed_at_ms: now_ms,
            leases_ended,
        }))
    }

    /// Ends an active record at `ended_at_ms` (its expiry, or the close's log time). Its bound
    /// leases end with it as far as every read is concerned; their records are reclaimed later,
    /// a bounded number per Expire entry, through `sessions_ending`.
    fn end_session(&mut self, slot: u32, status: SessionStatus, ended_at_ms: u64) {
        let record = self.session_mut(slot);
        assert_eq!(
            record.status,
            SessionStatus::Active,
            "ending a session record that already ended"
        );
        let indexed = record.indexed_expiry_ms;
        record.status = status;
        record.expires_at_ms = ended_at_ms;
        let (tenant, bound, session_id) = (record.tenant, record.bound_leases, record.session_id);
        self.sessions.by_expiry.remove(&(indexed, slot));
        self.tenant_sessions_add(tenant, -1);
        self.end_session_waiters(tenant, session_id);
        if bound > 0 {
            self.sessions.ending.insert((ended_at_ms, slot));
        } else {
            self.sessions.ended.push_back(slot);
        }
    }

    /// Binds the active lease at `lease_slot` to the session record at `session_slot`.
    pub(crate) fn bind_lease(&mut self, lease_slot: u32, session_slot: u32) {
        self.sessions.by_session.insert((session_slot, lease_slot));
        self.session_mut(session_slot).bound_leases += 1;
        self.record_mut(lease_slot).session = Some(session_slot);
    }

    /// Unbinds the lease at `lease_slot` from `session_slot` (the lease is ending or being
    /// re-granted). A record that ended and has no bound lease left moves to retention.
    pub(crate) fn unbind_lease(&mut self, lease_slot: u32, session_slot: u32) {
        let removed = self.sessions.by_session.remove(&(session_slot, lease_slot));
        assert!(removed, "a bound lease missing from the session index");
        self.record_mut(lease_slot).session = None;
        let record = self.session_mut(session_slot);
        record.bound_leases -= 1;
        if record.bound_leases == 0 && record.status != SessionStatus::Active {
            let ended_at_ms = record.expires_at_ms;
            self.sessions.ending.remove(&(ended_at_ms, session_slot));
            self.sessions.ended.push_back(session_slot);
        }
    }

    /// The earliest time at which session work falls due: an active record's (indexed) expiry,
    /// or an ended record's leases still to reclaim.
    pub(crate) fn next_session_work_ms(&self) -> Option<u64> {
        let expiry = self.sessions.by_expiry.first().map(|&(at, _)| at);
        let ending = self.sessions.ending.first().map(|&(at, _)| at);
        match (expiry, ending) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Processes the record at the front of the expiry index (due at `now_ms`): re-files it
    /// under its real expiry if keep-alives extended it, else ends it. True when it ended.
    pub(crate) fn expire_front_session(&mut self) -> bool {
        let Some((indexed_at_ms, slot)) = self.sessions.by_expiry.pop_first() else {
            return false;
        };
        let record = self.session_mut(slot);
        if record.expires_at_ms > indexed_at_ms {
            let expires_at_ms = record.expires_at_ms;
            record.indexed_expiry_ms = expires_at_ms;
            self.sessions.by_expiry.insert((expires_at_ms, slot));
            return false;
        }
        // `end_session` removes the (already popped) index entry; put it back for it.
        self.sessions.by_expiry.insert((indexed_at_ms, slot));
        let expired_at_ms = self.session(slot).expires_at_ms;
        self.end_session(slot, SessionStatus::Expired, expired_at_ms);
        true
    }

    /// Reclaims one lease of the ended record at the front of `sessions_ending`: it ends
    /// (EXPIRED, reason session) at the record's end.
    pub(crate) fn end_front_bound_lease(&mut self, reclaimed: &mut Vec<ReclaimedLease>) {
        let Some(&(ended_at_ms, session_slot)) = self.sessions.ending.first() else {
            return;
        };
        let lease_slot = self
            .sessions
            .by_session
            .range((session_slot, 0)..=(session_slot, u32::MAX))
            .next()
            .map(|&(_, lease)| lease);
        let Some(lease_slot) = lease_slot else {
            panic!("lease state invariant broken: an ending session has no bound lease");
        };
        let session_id = self.session(session_slot).session_id;
        self.unbind_lease(lease_slot, session_slot);
        let record = self.record_mut(lease_slot);
        assert_eq!(
            record.status,
            RecordStatus::Active,
            "a bound lease record is not active"
        );
        record.status = RecordStatus::Expired;
        record.expires_at_ms = ended_at_ms;
        record.indexed_expiry_ms = ended_at_ms;
        let (token, tenant, lease_id) = (record.fencing_token, record.tenant, record.lease_id());
        let resource_id = record.resource_id.clone();
        reclaimed.push(ReclaimedLease {
            tenant_id: self.tenants[tenant as usize].name.clone(),
            resource_id,
            lease_id,
            fencing_token: token,
            expires_at_ms: ended_at_ms,
            session_id: Some(session_id),
        });
        self.end_lease(lease_slot);
    }

    fn free_ended_session(&mut self, slot: u32) {
        let Some(record) = self.sessions.records.remove(slot) else {
            return;
        };
        let hash = self
            .hash_builder
            .hash_one((record.tenant, record.session_id.0));
        if let Ok(entry) = self.sessions.index.find_entry(hash, |&s| s == slot) {
            entry.remove();
        }
    }

    /// Frees the oldest ended record if its retention has passed (garbage collection's budget
    /// may not have reached it yet). False otherwise: an ended record is never dropped early,
    /// so a late open or keep-alive always learns that the session ended and never revives it.
    fn free_oldest_ended_session_past_retention(&mut self, now_ms: u64) -> bool {
        let Some(&slot) = self.sessions.ended.front() else {
            return false;
        };
        let ended_at_ms = self.session(slot).expires_at_ms;
        if now_ms < ended_at_ms.saturating_add(self.limits.inactive_retention_ms) {
            return false;
        }
        self.sessions.ended.pop_front();
        self.free_ended_session(slot);
        true
    }

    /// Frees ended records whose retention has passed, oldest first, at most `budget`.
    pub(crate) fn collect_session_garbage(&mut self, now_ms: u64, budget: usize) {
        for _ in 0..budget {
            let Some(&slot) = self.sessions.ended.front() else {
                return;
            };
            let ended_at_ms = self.session(slot).expires_at_ms;
            if now_ms < ended_at_ms.saturating_add(self.limits.inactive_retention_ms) {
                return;
            }
            self.sessions.ended.pop_front();
            self.free_ended_session(slot);
        }
    }

    /// Checks the session tables against each other and against the lease records.
    pub(crate) fn check_session_invariants(&self) -> Result<(), String> {
        let mut active_per_tenant = vec![0u64; self.tenants.len()];
        let ended: std::collections::HashSet<u32> = self.sessions.ended.iter().copied().collect();
        if ended.len() != self.sessions.ended.len() {
            return Err("a session is queued for retention twice".into());
        }
        let mut occupied = 0usize;
        for (slot, record) in self.sessions.records.iter_slots() {
            let Some(record) = record else { continue };
            occupied += 1;
            if record.tenant as usize >= self.tenants.len() {
                return Err(format!("session slot {slot}: unknown tenant"));
            }
            if self.find_session(record.tenant, record.session_id) != Some(slot) {
                return Err(format!("session slot {slot}: index does not point here"));
            }
            let bound = self
                .sessions
                .by_session
                .range((slot, 0)..=(slot, u32::MAX))
                .count() as u64;
            if bound != record.bound_leases {
                return Err(format!(
                    "session slot {slot}: count {} but {bound} bound leases",
                    record.bound_leases
                ));
            }
            let in_expiry = self
                .sessions
                .by_expiry
                .contains(&(record.indexed_expiry_ms, slot));
            let in_ending = self.sessions.ending.contains(&(record.expires_at_ms, slot));
            match record.status {
                SessionStatus::Active => {
                    active_per_tenant[record.tenant as usize] += 1;
                    if !in_expiry || record.indexed_expiry_ms > record.expires_at_ms {
                        return Err(format!("session slot {slot}: expiry index disagrees"));
                    }
                    if in_ending || ended.contains(&slot) {
                        return Err(format!("session slot {slot}: active but ending"));
                    }
                }
                SessionStatus::Expired | SessionStatus::Closed => {
                    if in_expiry {
                        return Err(format!(
                            "session slot {slot}: ended but in the expiry index"
                        ));
                    }
                    if (bound > 0) != in_ending || (bound == 0) != ended.contains(&slot) {
                        return Err(format!(
                            "session slot {slot}: ended with {bound} bound leases, ending \
                             {in_ending}, retained {}",
                            ended.contains(&slot)
                        ));
                    }
                }
            }
        }
        if occupied != self.sessions.records.occupied()
            || occupied != self.sessions.index.len()
            || self.sessions.by_expiry.len() + self.sessions.ending.len() + ended.len() != occupied
        {
            return Err(format!(
                "session index sizes disagree: {occupied} records, index {}, expiry {}, ending \
                 {}, retained {}",
                self.sessions.index.len(),
                self.sessions.by_expiry.len(),
                self.sessions.ending.len(),
                ended.len()
            ));
        }
        for (tenant, &count) in active_per_tenant.iter().enumerate() {
            let stored = self
                .sessions
                .active_per_tenant
                .get(tenant)
                .copied()
                .unwrap_or(0);
            if stored != count {
                return Err(format!(
                    "tenant {tenant}: {stored} active sessions counted, {count} found"
                ));
            }
        }
        for &(session_slot, lease_slot) in &self.sessions.by_session {
            let lease = self
                .slab
                .get(lease_slot)
                .ok_or_else(|| format!("bound lease slot {lease_slot} is empty"))?;
            if lease.session != Some(session_slot) || lease.status != RecordStatus::Active {
                return Err(format!(
                    "bound lease slot {lease_slot}: binding or status disagrees"
                ));
            }
            if self
                .sessions
                .records
                .get(session_slot)
                .is_none_or(|s| s.tenant != lease.tenant)
            {
                return Err(format!(
                    "bound lease slot {lease_slot}: session of another tenant"
                ));
            }
        }
        // Every record naming a session is in the index (with the check above, the two agree
        // exactly): a snapshot writes the bindings from the records' own fields.
        let bound_records = self
            .slab
            .iter_slots()
            .filter(|(_, record)| record.is_some_and(|record| record.session.is_some()))
            .count();
        if bound_records != self.sessions.by_session.len() {
            return Err(format!(
                "{bound_records} lease records name a session, {} bindings indexed",
                self.sessions.by_session.len()
            ));
        }
        Ok(())
    }
}
