//! Commands (what a log entry asks for), their results, and the read-side views.
//!
//! A log [`Entry`] is a [`Command`] plus the log time the group leader stamped on it when it
//! proposed it. Everything apply needs is in the entry; nothing else is consulted.

use compact_str::CompactString;
use serde::{Deserialize, Serialize};

use crate::cluster::{ClusterChange, ClusterError, ClusterOp};
use crate::error::LeaseError;
use crate::ids::{GroupId, LeaseId, ResourceKey, SessionId};
use crate::limits::{GroupLimits, TenantPolicy};

/// One entry of a group's log, as the state machine sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Log time in milliseconds, stamped by the leader at proposal. Never decreases along a log;
    /// the state machine treats an earlier stamp as equal to the latest one it applied.
    pub log_time_ms: u64,
    /// What to do.
    pub command: Command,
}

impl std::fmt::Display for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "@{}ms ", self.log_time_ms)?;
        match &self.command {
            Command::Lease(op) => write!(f, "{}", op.kind_name()),
            Command::Batch(ops) => write!(f, "Batch[{}]", ops.len()),
            Command::Expire { leases_max } => write!(f, "Expire<={leases_max}"),
            Command::SetTenantPolicy { tenant_id, .. } => write!(f, "SetTenantPolicy({tenant_id})"),
            Command::SetGroupLimits(_) => f.write_str("SetGroupLimits"),
            Command::Cluster(_) => f.write_str("Cluster"),
        }
    }
}

/// Everything a group's log can carry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// One lease operation.
    Lease(LeaseOp),
    /// Many lease operations in one entry, applied in order at the same log time, one result each.
    Batch(Vec<LeaseOp>),
    /// Reclaim up to `leases_max` (capped by the group's `expire_batch_max`) leases whose expiry
    /// is at or before the entry's log time, oldest expiry first.
    Expire {
        /// How many to reclaim at most.
        leases_max: u32,
    },
    /// Set (replace) a tenant's policy.
    SetTenantPolicy {
        /// The tenant.
        tenant_id: String,
        /// Its new policy.
        policy: TenantPolicy,
    },
    /// Replace the group's limits (bootstrap and operator changes).
    SetGroupLimits(GroupLimits),
    /// Change the cluster metadata (the metadata group only; appended in entry format 4).
    Cluster(ClusterOp),
}

/// A client lease operation. Each carries a request id scoped to its resource.
///
/// This enum is the one definition of the operation set: the wire request carries it unchanged
/// (`tenure-proto`'s `RequestBody::Lease`), the server routes, sizes, admits and deduplicates it
/// through [`LeaseOp::parts`] and [`LeaseOp::kind`], and the state machine applies it. Adding an
/// operation means a variant here, its arm in [`LeaseOp::parts`] and in the state machine's
/// apply, and its [`LeaseReply`]; the compiler points at every other place that must decide
/// something about it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LeaseOp {
    /// Grant the resource to a holder if no lease on it is active.
    Acquire(AcquireRequest),
    /// Extend the current lease.
    Renew(RenewRequest),
    /// End the current lease now.
    Release(ReleaseRequest),
    /// End the current lease and grant the resource to a named new holder in the same step (no
    /// moment in between at which anyone else could acquire it), with a new fencing token.
    Transfer(TransferRequest),
    /// Open a session in one group: create the group's record of it (appended with sessions:
    /// value format 4, client protocol 7). Repeating it while the record is active extends it.
    SessionOpen(SessionOpenRequest),
    /// Extend a session's record in one group by its ttl, from the entry's log time.
    SessionKeepAlive(SessionRequest),
    /// End a session's record in one group now; the leases bound to it end with it.
    SessionClose(SessionRequest),
    /// Grant the resource to the owner of a session, bound to the session's record in the key's
    /// group: the lease has no ttl of its own and is active exactly while that record is.
    AcquireInSession(SessionAcquireRequest),
    /// Acquire, or, while the resource is held, wait for it in the resource's FIFO queue (in the
    /// replicated state): a later release or expiry hands the resource to the first waiter still
    /// alive, in the same apply (appended with wait queues: value format 5, client protocol 8).
    AcquireWait(WaitAcquireRequest),
    /// Leave a resource's wait queue. Idempotent and not deduplicated: it names the wait by the
    /// request id of its AcquireWait.
    WaitCancel(WaitCancelRequest),
}

/// The kind of a [`LeaseOp`], without its fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LeaseOpKind {
    /// [`LeaseOp::Acquire`].
    Acquire,
    /// [`LeaseOp::Renew`].
    Renew,
    /// [`LeaseOp::Release`].
    Release,
    /// [`LeaseOp::Transfer`].
    Transfer,
    /// [`LeaseOp::SessionOpen`].
    SessionOpen,
    /// [`LeaseOp::SessionKeepAlive`].
    SessionKeepAlive,
    /// [`LeaseOp::SessionClose`].
    SessionClose,
    /// [`LeaseOp::AcquireInSession`].
    AcquireInSession,
    /// [`LeaseOp::AcquireWait`].
    AcquireWait,
    /// [`LeaseOp::WaitCancel`].
    WaitCancel,
}

impl LeaseOpKind {
    /// `Acquire`, `Renew`, `Release` or `Transfer` (logs, entry display).
    pub fn name(self) -> &'static str {
        match self {
            LeaseOpKind::Acquire => "Acquire",
            LeaseOpKind::Renew => "Renew",
            LeaseOpKind::Release => "Release",
            LeaseOpKind::Transfer => "Transfer",
            LeaseOpKind::SessionOpen => "SessionOpen",
            LeaseOpKind::SessionKeepAlive => "SessionKeepAlive",
            LeaseOpKind::SessionClose => "SessionClose",
            LeaseOpKind::AcquireInSession => "AcquireInSession",
            LeaseOpKind::AcquireWait => "AcquireWait",
            LeaseOpKind::WaitCancel => "WaitCancel",
        }
    }

    /// The lower-case name used in metric labels and the HTTP routes (`acquire`, ...).
    pub fn label(self) -> &'static str {
        match self {
            LeaseOpKind::Acquire => "acquire",
            LeaseOpKind::Renew => "renew",
            LeaseOpKind::Release => "release",
            LeaseOpKind::Transfer => "transfer",
            LeaseOpKind::SessionOpen => "session_open",
            LeaseOpKind::SessionKeepAlive => "session_keepalive",
            LeaseOpKind::SessionClose => "session_close",
            LeaseOpKind::AcquireInSession => "acquire_in_session",
            LeaseOpKind::AcquireWait => "acquire_wait",
            LeaseOpKind::WaitCancel => "wait_cancel",
        }
    }

    /// True when the operation may add an active lease or session to its tenant (admission
    /// control treats such requests as new work; a transfer replaces one lease with another).
    pub fn adds_lease(self) -> bool {
        matches!(
            self,
            LeaseOpKind::Acquire
                | LeaseOpKind::AcquireInSession
                | LeaseOpKind::SessionOpen
                | LeaseOpKind::AcquireWait
        )
    }

    /// True for the operations that are idempotent by design and so neither looked up nor
    /// recorded under a request id: the operations on a session's record, and WaitCancel (whose
    /// request id names the wait it cancels, not itself).
    pub fn is_unrecorded(self) -> bool {
        self.is_session_record_op() || self == LeaseOpKind::WaitCancel
    }

    /// True for the operations on a session's record (open, keep-alive, close): addressed to a
    /// group rather than to a resource, and not deduplicated by request id (each is idempotent:
    /// see the contract's sessions section).
    pub fn is_session_record_op(self) -> bool {
        matches!(
            self,
            LeaseOpKind::SessionOpen | LeaseOpKind::SessionKeepAlive | LeaseOpKind::SessionClose
        )
    }

    /// Tag of the kind in the request-id fingerprint. Part of the snapshot format (request-id
    /// records store fingerprints): never renumber.
    pub(crate) fn fingerprint_tag(self) -> u8 {
        match self {
            LeaseOpKind::Acquire => 1,
            LeaseOpKind::Renew => 2,
            LeaseOpKind::Release => 3,
            LeaseOpKind::Transfer => 4,
            LeaseOpKind::SessionOpen => 5,
            LeaseOpKind::SessionKeepAlive => 6,
            LeaseOpKind::SessionClose => 7,
            LeaseOpKind::AcquireInSession => 8,
            LeaseOpKind::AcquireWait => 9,
            LeaseOpKind::WaitCancel => 10,
        }
    }
}

/// Every field of a [`LeaseOp`] that some layer treats alike across kinds, borrowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseOpParts<'a> {
    /// The kind.
    pub kind: LeaseOpKind,
    /// The tenant acting.
    pub tenant_id: &'a str,
    /// The resource (`None` for the operations on a session's record, which name a group).
    pub key: Option<&'a ResourceKey>,
    /// The group a session-record operation is addressed to (`None` for resource operations:
    /// their key decides the group).
    pub group_id: Option<GroupId>,
    /// The holder acting (for Transfer: the current holder; for session operations: the
    /// session's owner).
    pub holder_id: &'a str,
    /// The request id (empty for session-record operations, which are idempotent instead).
    pub request_id: &'a str,
    /// The lease the operation names (all but Acquire).
    pub lease_id: Option<LeaseId>,
    /// The ttl asked for (Acquire, Renew, Transfer).
    pub ttl_ms: Option<u64>,
    /// The holder the resource passes to (Transfer).
    pub new_holder_id: Option<&'a str>,
    /// The session the operation names (session operations and AcquireInSession).
    pub session_id: Option<SessionId>,
}

impl LeaseOp {
    /// The operation's fields, the one place that names each variant's fields.
    pub fn parts(&self) -> LeaseOpParts<'_> {
        match self {
            LeaseOp::Acquire(r) => LeaseOpParts {
                kind: LeaseOpKind::Acquire,
                tenant_id: &r.key.tenant_id,
                key: Some(&r.key),
                group_id: None,
                holder_id: &r.holder_id,
                request_id: &r.request_id,
                lease_id: None,
                ttl_ms: Some(r.ttl_ms),
                new_holder_id: None,
                session_id: None,
            },
            LeaseOp::Renew(r) => LeaseOpParts {
                kind: LeaseOpKind::Renew,
                tenant_id: &r.key.tenant_id,
                key: Some(&r.key),
                group_id: None,
                holder_id: &r.holder_id,
                request_id: &r.request_id,
                lease_id: Some(r.lease_id),
                ttl_ms: Some(r.ttl_ms),
                new_holder_id: None,
                session_id: None,
            },
            LeaseOp::Release(r) => LeaseOpParts {
                kind: LeaseOpKind::Release,
                tenant_id: &r.key.tenant_id,
                key: Some(&r.key),
                group_id: None,
                holder_id: &r.holder_id,
                request_id: &r.request_id,
                lease_id: Some(r.lease_id),
                ttl_ms: None,
                new_holder_id: None,
                session_id: None,
            },
            LeaseOp::Transfer(r) => LeaseOpParts {
                kind: LeaseOpKind::Transfer,
                tenant_id: &r.key.tenant_id,
                key: Some(&r.key),
                group_id: None,
                holder_id: &r.holder_id,
                request_id: &r.request_id,
                lease_id: Some(r.lease_id),
                ttl_ms: Some(r.ttl_ms),
                new_holder_id: Some(&r.new_holder_id),
                session_id: None,
            },
            LeaseOp::SessionOpen(r) => LeaseOpParts {
                kind: LeaseOpKind::SessionOpen,
                tenant_id: &r.tenant_id,
                key: None,
                group_id: Some(r.group_id),
                holder_id: &r.owner_id,
                request_id: "",
                lease_id: None,
                ttl_ms: Some(r.ttl_ms),
                new_holder_id: None,
                session_id: Some(r.session_id),
            },
            LeaseOp::SessionKeepAlive(r) | LeaseOp::SessionClose(r) => LeaseOpParts {
                kind: if matches!(self, LeaseOp::SessionClose(_)) {
                    LeaseOpKind::SessionClose
                } else {
                    LeaseOpKind::SessionKeepAlive
                },
                tenant_id: &r.tenant_id,
                key: None,
                group_id: Some(r.group_id),
                holder_id: &r.owner_id,
                request_id: "",
                lease_id: None,
                ttl_ms: None,
                new_holder_id: None,
                session_id: Some(r.session_id),
            },
            LeaseOp::AcquireInSession(r) => LeaseOpParts {
                kind: LeaseOpKind::AcquireInSession,
                tenant_id: &r.key.tenant_id,
                key: Some(&r.key),
                group_id: None,
                holder_id: &r.holder_id,
                request_id: &r.request_id,
                lease_id: None,
                ttl_ms: None,
                new_holder_id: None,
                session_id: Some(r.session_id),
            },
            LeaseOp::AcquireWait(r) => LeaseOpParts {
                kind: LeaseOpKind::AcquireWait,
                tenant_id: &r.key.tenant_id,
                key: Some(&r.key),
                group_id: None,
                holder_id: &r.holder_id,
                request_id: &r.request_id,
                lease_id: None,
                ttl_ms: match r.lease {
                    WaitLease::Ttl { ttl_ms } => Some(ttl_ms),
                    WaitLease::Session { .. } => None,
                },
                new_holder_id: None,
                session_id: match r.lease {
                    WaitLease::Ttl { .. } => None,
                    WaitLease::Session { session_id } => Some(session_id),
                },
            },
            LeaseOp::WaitCancel(r) => LeaseOpParts {
                kind: LeaseOpKind::WaitCancel,
                tenant_id: &r.key.tenant_id,
                key: Some(&r.key),
                group_id: None,
                holder_id: &r.holder_id,
                request_id: &r.request_id,
                lease_id: None,
                ttl_ms: None,
                new_holder_id: None,
                session_id: None,
            },
        }
    }

    /// The kind.
    pub fn kind(&self) -> LeaseOpKind {
        self.parts().kind
    }

    /// The resource the operation is about (`None` for the operations on a session's record).
    pub fn key(&self) -> Option<&ResourceKey> {
        self.parts().key
    }

    /// The tenant acting.
    pub fn tenant_id(&self) -> &str {
        self.parts().tenant_id
    }

    /// `Acquire`, `Renew`, `Release` or `Transfer`.
    pub fn kind_name(&self) -> &'static str {
        self.kind().name()
    }

    /// The request id the operation carries.
    pub fn request_id(&self) -> &str {
        self.parts().request_id
    }

    /// The holder acting.
    pub fn holder_id(&self) -> &str {
        self.parts().holder_id
    }

    /// Bytes of the operation's variable-length fields (ids and names): what its encoded size
    /// grows with.
    pub fn text_bytes(&self) -> usize {
        let parts = self.parts();
        parts.tenant_id.len()
            + parts.key.map_or(0, |key| key.resource_id.len())
            + parts.holder_id.len()
            + parts.request_id.len()
            + parts.new_holder_id.map_or(0, str::len)
    }
}

/// Input of Acquire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcquireRequest {
    /// The resource.
    pub key: ResourceKey,
    /// Who asks.
    pub holder_id: String,
    /// Requested ttl; must be within the tenant's bounds (never silently raised).
    pub ttl_ms: u64,
    /// Deduplication id, scoped to the resource.
    pub request_id: String,
}

/// Input of SessionOpen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionOpenRequest {
    /// The session's tenant.
    pub tenant_id: String,
    /// The group whose record of the session this opens.
    pub group_id: GroupId,
    /// The session, drawn at random by its client.
    pub session_id: SessionId,
    /// Who owns the session (and holds every lease acquired in it); a holder id.
    pub owner_id: String,
    /// The session's ttl, within the tenant's lease ttl bounds; every keep-alive extends the
    /// record by it.
    pub ttl_ms: u64,
}

/// Input of SessionKeepAlive and SessionClose.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionRequest {
    /// The session's tenant.
    pub tenant_id: String,
    /// The group whose record of the session this extends or ends.
    pub group_id: GroupId,
    /// The session.
    pub session_id: SessionId,
    /// Its owner, as it was opened.
    pub owner_id: String,
}

/// Input of AcquireInSession.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionAcquireRequest {
    /// The resource.
    pub key: ResourceKey,
    /// Who asks: the session's owner.
    pub holder_id: String,
    /// The session the lease is bound to; it must be open in the key's group.
    pub session_id: SessionId,
    /// Deduplication id, scoped to the resource.
    pub request_id: String,
}

/// What a waiter's lease will be once it is granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum WaitLease {
    /// A lease with its own ttl, counted from the log time of the grant (the hand-off's).
    Ttl {
        /// The ttl, within the tenant's bounds.
        ttl_ms: u64,
    },
    /// A lease bound to this session's record in the key's group. The waiter is alive only while
    /// that record is active: a waiter whose session ended is skipped and dropped.
    Session {
        /// The session; its owner must be the waiter's holder.
        session_id: SessionId,
    },
}

/// Input of AcquireWait.
///
/// The wait's `wait_ms` is not part of the request-id fingerprint: a client retrying after a
/// lost answer may send what is left of its wait, and the queue keeps the first one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitAcquireRequest {
    /// The resource.
    pub key: ResourceKey,
    /// Who asks (for a session lease: the session's owner).
    pub holder_id: String,
    /// The lease it gets.
    pub lease: WaitLease,
    /// How long it may wait, in log time from the entry that queued it (at least 1, at most the
    /// tenant's largest ttl). A waiter whose wait has passed is never granted; Expire entries drop
    /// it and answer its call with WAIT_ENDED (code ALREADY_HELD).
    pub wait_ms: u64,
    /// Deduplication id, scoped to the resource. A retry with the same id finds the grant, the
    /// end of the wait, or the queue position; never a second place.
    pub request_id: String,
}

/// Input of WaitCancel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitCancelRequest {
    /// The resource.
    pub key: ResourceKey,
    /// The waiter's holder id.
    pub holder_id: String,
    /// The request id of the AcquireWait to cancel.
    pub request_id: String,
}

/// Input of Renew.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenewRequest {
    /// The resource.
    pub key: ResourceKey,
    /// The lease being renewed.
    pub lease_id: LeaseId,
    /// Its holder.
    pub holder_id: String,
    /// New ttl, counted from the entry's log time.
    pub ttl_ms: u64,
    /// Deduplication id, scoped to the resource.
    pub request_id: String,
}

/// Input of Release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseRequest {
    /// The resource.
    pub key: ResourceKey,
    /// The lease being released.
    pub lease_id: LeaseId,
    /// Its holder.
    pub holder_id: String,
    /// Deduplication id, scoped to the resource.
    pub request_id: String,
}

/// Input of Transfer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransferRequest {
    /// The resource.
    pub key: ResourceKey,
    /// The lease being handed over (must be the resource's active lease).
    pub lease_id: LeaseId,
    /// Its current holder.
    pub holder_id: String,
    /// Who holds the resource afterwards.
    pub new_holder_id: String,
    /// The new lease's ttl, counted from the entry's log time (within the tenant's bounds).
    pub ttl_ms: u64,
    /// Deduplication id, scoped to the resource.
    pub request_id: String,
}

/// A successful lease operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LeaseReply {
    /// Acquire granted a new lease.
    Acquired(LeaseGrant),
    /// Renew extended the lease; id and token are unchanged.
    Renewed(LeaseGrant),
    /// Release ended the lease.
    Released(ReleaseReceipt),
    /// Transfer ended the lease and granted a new one to the new holder. Boxed: every stored
    /// request-id outcome is a `LeaseReply`, and an inline receipt would grow all of them by a
    /// third (postcard encodes the box as its content, so the bytes are the same).
    Transferred(Box<TransferReceipt>),
    /// SessionOpen or SessionKeepAlive: the group's record of the session is active until
    /// `expires_at_ms` (appended with sessions).
    SessionKept(SessionGrant),
    /// SessionClose ended the group's record of the session (and every lease bound to it).
    SessionClosed(SessionReceipt),
    /// AcquireWait: the resource is held, and the request waits in its queue (appended with
    /// wait queues). Never stored under a request id: a retry finds the current position.
    Queued(QueuedReceipt),
    /// WaitCancel: what became of the wait.
    WaitCancelled(WaitCancelReceipt),
}

impl LeaseReply {
    /// The lease the reply leaves active, if any (Acquired, Renewed, and the new lease of
    /// Transferred).
    pub fn grant(&self) -> Option<&LeaseGrant> {
        match self {
            LeaseReply::Acquired(grant) | LeaseReply::Renewed(grant) => Some(grant),
            LeaseReply::Transferred(receipt) => Some(&receipt.grant),
            LeaseReply::Released(_)
            | LeaseReply::SessionKept(_)
            | LeaseReply::SessionClosed(_)
            | LeaseReply::Queued(_)
            | LeaseReply::WaitCancelled(_) => None,
        }
    }

    /// The lease the reply ended, if any (Released, and the old lease of Transferred).
    pub fn ended(&self) -> Option<&ReleaseReceipt> {
        match self {
            LeaseReply::Released(receipt) => Some(receipt),
            LeaseReply::Transferred(receipt) => Some(&receipt.released),
            LeaseReply::Acquired(_)
            | LeaseReply::Renewed(_)
            | LeaseReply::SessionKept(_)
            | LeaseReply::SessionClosed(_)
            | LeaseReply::Queued(_)
            | LeaseReply::WaitCancelled(_) => None,
        }
    }
}

/// Where a waiting AcquireWait stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueuedReceipt {
    /// Waiters ahead of this one (0: it is next).
    pub position: u32,
    /// Waiters in the resource's queue, this one included.
    pub waiters: u32,
    /// Log time of the entry that queued it.
    pub queued_at_ms: u64,
    /// Log time at which the wait ends unless it is granted first.
    pub wait_until_ms: u64,
    /// Log time of the entry that answered.
    pub log_time_ms: u64,
    /// The resource's current holder.
    pub holder_id: CompactString,
}

/// What WaitCancel found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitCancelReceipt {
    /// True when the wait was in the queue and has left it now.
    pub cancelled: bool,
    /// The grant the wait got before the cancel arrived (a hand-off): the caller holds that lease
    /// and should release it if it no longer wants it. `None` when it was cancelled now, or the
    /// group has no record of the wait (never queued, ended, or its request-id record's
    /// retention ended).
    pub granted: Option<LeaseGrant>,
}

/// The result of Transfer: the lease that ended and the one that began, at the same log time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransferReceipt {
    /// The previous holder's lease, ended at the transfer's log time.
    pub released: ReleaseReceipt,
    /// The new holder's lease: a new lease id and a fencing token above every earlier one.
    pub grant: LeaseGrant,
}

/// The state of a lease after Acquire or Renew.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseGrant {
    /// The lease.
    pub lease_id: LeaseId,
    /// Its fencing token (equal to `lease_id.sequence`).
    pub fencing_token: u64,
    /// Log time of the entry that granted or renewed it.
    pub log_time_ms: u64,
    /// Log time at which it expires unless renewed: `log_time_ms + ttl_ms`.
    pub expires_at_ms: u64,
    /// The ttl granted (exactly the ttl requested).
    pub ttl_ms: u64,
    /// True when this request created the lease (always true for Acquire, false for Renew).
    pub created: bool,
}

/// A group's record of a session after SessionOpen or SessionKeepAlive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionGrant {
    /// The session.
    pub session_id: SessionId,
    /// The group whose record this is.
    pub group_id: GroupId,
    /// Log time of the entry that opened or extended it.
    pub log_time_ms: u64,
    /// Log time at which it (and every lease bound to it) expires unless kept alive:
    /// `log_time_ms + ttl_ms`.
    pub expires_at_ms: u64,
    /// The session's ttl.
    pub ttl_ms: u64,
    /// True when this request created the record.
    pub created: bool,
    /// Leases bound to the record in this group, active at this log time.
    pub bound_leases: u64,
}

/// A group's record of a session after SessionClose.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionReceipt {
    /// The session.
    pub session_id: SessionId,
    /// The group whose record this is.
    pub group_id: GroupId,
    /// Log time at which the record ended (the close's log time).
    pub closed_at_ms: u64,
    /// Leases that ended with it (bound to it when it was closed).
    pub leases_ended: u64,
}

/// The state of a lease after Release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseReceipt {
    /// The lease.
    pub lease_id: LeaseId,
    /// Its fencing token.
    pub fencing_token: u64,
    /// Log time at which it ended (the release's log time).
    pub released_at_ms: u64,
}

/// The result of one lease operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseOutcome {
    /// What the state machine decided (for a replay: what it decided the first time).
    pub result: Result<LeaseReply, LeaseError>,
    /// True when the request id had been seen and the stored outcome was returned unchanged.
    pub replayed: bool,
    /// For a replay (`replayed`, and only then): how the original answer stands at the log time
    /// of the retry. `result` is the original outcome unchanged; anyone turning a replayed grant
    /// into an expiry or a window must use this instead of the grant's own times (contract 3.4:
    /// a replay never reports a later expiry than the original grant had).
    pub replay: Option<ReplayState>,
}

/// How a replayed answer stands at the log time it was replayed at. Computed by apply from the
/// state at that log time (deterministic), never stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplayState {
    /// Log time of the entry that answered the retry.
    pub answered_at_ms: u64,
    /// Log time at which the original outcome was decided.
    pub decided_at_ms: u64,
    /// Where the lease the original answer names stands at `answered_at_ms`.
    pub status: ReplayStatus,
    /// For a replayed grant: the log time until which it holds, never after the original expiry:
    /// while `status` is [`ReplayStatus::Active`], the earlier of the original expiry and the
    /// lease's current one; otherwise when the lease ended as far as this group knows (at or
    /// before `answered_at_ms`). For a replayed release: the release's log time. For a replayed
    /// error: `answered_at_ms`.
    pub expires_at_ms: u64,
    /// `expires_at_ms - answered_at_ms` while `status` is [`ReplayStatus::Active`], else zero:
    /// what a client may count on from the answer on (never the full ttl of the original).
    pub remaining_ttl_ms: u64,
}

/// Where the lease a replayed answer names stands when the retry is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ReplayStatus {
    /// The granted lease is still the resource's active lease and the original grant's expiry
    /// has not passed: `remaining_ttl_ms > 0`.
    Active,
    /// The original grant's expiry has passed (the lease expired, or only a later renewal
    /// under another request id keeps it active): nothing remains of this grant.
    Expired,
    /// The lease has been released since (for a replayed release: it was released).
    Released,
    /// The resource has another lease now, or this group no longer has the lease's record
    /// (retention ended, or the resource moved): the lease ended, when is not known here.
    Superseded,
    /// The original answer was an error: it names no lease window.
    NotAGrant,
}

impl ReplayStatus {
    /// The wire spelling, e.g. `ACTIVE`.
    pub fn as_str(self) -> &'static str {
        match self {
            ReplayStatus::Active => "ACTIVE",
            ReplayStatus::Expired => "EXPIRED",
            ReplayStatus::Released => "RELEASED",
            ReplayStatus::Superseded => "SUPERSEDED",
            ReplayStatus::NotAGrant => "NOT_A_GRANT",
        }
    }
}

/// The result of applying one command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CommandResult {
    /// Result of [`Command::Lease`].
    Lease(LeaseOutcome),
    /// Results of [`Command::Batch`], one per item in order; an error when the batch itself is
    /// malformed (too many items), in which case no item was applied.
    Batch(Result<Vec<LeaseOutcome>, LeaseError>),
    /// Result of [`Command::Expire`]: whether leases remain due at this log time.
    Expire {
        /// True when more leases are due than this command reclaimed.
        more_due: bool,
    },
    /// Result of [`Command::SetTenantPolicy`] or [`Command::SetGroupLimits`].
    Config(Result<(), LeaseError>),
    /// Result of [`Command::Cluster`].
    Cluster(Result<ClusterChange, ClusterError>),
}

/// A lease reclaimed because its expiry passed: an ordered event in the log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReclaimedLease {
    /// The resource's tenant.
    pub tenant_id: CompactString,
    /// The resource.
    pub resource_id: CompactString,
    /// The lease.
    pub lease_id: LeaseId,
    /// Its fencing token.
    pub fencing_token: u64,
    /// The log time at which it expired.
    pub expires_at_ms: u64,
    /// The session whose end ended it (reason "session"); `None` when its own ttl ran out.
    pub session_id: Option<SessionId>,
}

/// A queued wait that ended while applying an entry: granted by a hand-off, or ended without a
/// grant (its wait passed, it was cancelled, or it was found dead at a hand-off).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitEnded {
    /// The resource's tenant.
    pub tenant_id: CompactString,
    /// The resource.
    pub resource_id: CompactString,
    /// The waiter.
    pub holder_id: CompactString,
    /// The request id of its AcquireWait.
    pub request_id: CompactString,
    /// Log time of the entry that queued it.
    pub queued_at_ms: u64,
    /// Its wait's end.
    pub wait_until_ms: u64,
    /// What its call is answered: `Ok(Acquired)` for a hand-off (the same outcome a retry of its
    /// request id replays), an error otherwise.
    pub outcome: Result<LeaseReply, LeaseError>,
    /// For a hand-off: the fencing token of the lease whose end handed the resource over.
    pub previous_fencing_token: Option<u64>,
}

/// Everything applying one entry produced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplyOutput {
    /// The log time the entry was applied at (its stamp, or the latest earlier stamp if larger).
    pub log_time_ms: u64,
    /// The command's result.
    pub result: CommandResult,
    /// Leases reclaimed while applying this entry, oldest expiry first.
    pub reclaimed: Vec<ReclaimedLease>,
    /// Leases past their expiry (never reclaimed) that an acquire in this entry took over, in
    /// the order it did: they ended by expiry too. Not counted as reclaimed (the expiry
    /// metrics and the apply's garbage collection budget count reclaims only).
    pub superseded: Vec<ReclaimedLease>,
    /// Waits that ended while applying this entry (hand-offs included), in the order they ended.
    pub waits_ended: Vec<WaitEnded>,
}

/// The status of a resource's lease at a log time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LeaseStatus {
    /// Held, and the log time is before its expiry.
    Active,
    /// Its expiry has passed (reclaimed or not yet).
    Expired,
    /// Its holder released it.
    Released,
    /// No record: never leased, or the record's retention ended.
    Absent,
}

impl LeaseStatus {
    /// The wire spelling, e.g. `ACTIVE`.
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseStatus::Active => "ACTIVE",
            LeaseStatus::Expired => "EXPIRED",
            LeaseStatus::Released => "RELEASED",
            LeaseStatus::Absent => "ABSENT",
        }
    }
}

/// What Get and List show of a lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseView {
    /// The resource.
    pub key: ResourceKey,
    /// The lease.
    pub lease_id: LeaseId,
    /// Its holder.
    pub holder_id: String,
    /// Status at the query's log time (never `Absent` in a view).
    pub status: LeaseStatus,
    /// Fencing token.
    pub fencing_token: u64,
    /// When it expires (active), expired, or was released, in log time.
    pub expires_at_ms: u64,
    /// Milliseconds of log time left; zero unless active.
    pub remaining_ttl_ms: u64,
    /// The ttl of the last grant or renewal.
    pub ttl_ms: u64,
    /// Number of changes to this lease: 1 at grant, +1 per renewal and for the release.
    pub version: u64,
    /// The session the lease is bound to, if it was acquired in one: it is active exactly while
    /// that session's record in its group is, and `expires_at_ms` is the record's (client
    /// protocol 7).
    pub session_id: Option<SessionId>,
}

/// Whether a fencing token is its resource's current active grant (Chubby's CheckSequencer):
/// what a downstream system that cannot store tokens asks before accepting a holder's write.
///
/// A token means something only with its resource: tokens grow per group, so resources of
/// different groups may have the same token. Part of the client protocol (its field order is
/// wire format): a change needs a protocol version bump.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FenceVerdict {
    /// True when the token is the fencing token of the resource's lease and that lease is active
    /// with time left: its holder may still act. False for an older token (superseded), a token
    /// the resource never had, an expired or released lease, a lease the leader's clock says is
    /// due (status still `Active` until its Expire entry is applied), and a resource without a
    /// lease. Final when `latest_fencing_token` is above the token, or the status is `Expired`
    /// or `Released`; a lease that was only due may read as current again after a failover (the
    /// new leader continues log time from the log, which can only lengthen leases), and no other
    /// holder can have been granted meanwhile.
    pub current: bool,
    /// The status of the resource's latest lease (`Absent` when it has none).
    pub status: LeaseStatus,
    /// The fencing token of the resource's latest lease, whatever its status (`None` when it has
    /// none, or its record's retention ended). A token below it is superseded for good: tokens
    /// only grow.
    pub latest_fencing_token: Option<u64>,
    /// Milliseconds the lease has left while `current`, else zero.
    pub remaining_ttl_ms: u64,
}

impl FenceVerdict {
    /// The verdict on `fencing_token` given the resource's lease as a linearizable Get sees it
    /// (`None`: no lease record). Pure: the caller reads `view` at the moment it answers for.
    pub fn of(view: Option<&LeaseView>, fencing_token: u64) -> Self {
        let Some(view) = view else {
            return FenceVerdict {
                current: false,
                status: LeaseStatus::Absent,
                latest_fencing_token: None,
                remaining_ttl_ms: 0,
            };
        };
        let current = view.fencing_token == fencing_token
            && view.status == LeaseStatus::Active
            && view.remaining_ttl_ms > 0;
        FenceVerdict {
            current,
            status: view.status,
            latest_fencing_token: Some(view.fencing_token),
            remaining_ttl_ms: if current { view.remaining_ttl_ms } else { 0 },
        }
    }
}

/// A List query.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListRequest {
    /// The tenant whose leases to list.
    pub tenant_id: String,
    /// Page size, at least 1 and at most the group's `list_page_size_max`.
    pub page_size: u32,
    /// Token from the previous page, or `None` for the first.
    pub page_token: Option<String>,
    /// Only leases with this status; `None` for every visible lease.
    pub status: Option<LeaseStatus>,
}

/// One page of a List.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListPage {
    /// Leases in grant order (ascending fencing token).
    pub leases: Vec<LeaseView>,
    /// Where the next page starts; `None` when the listing is complete.
    pub next_page_token: Option<String>,
}
