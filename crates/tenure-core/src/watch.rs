//! Watch events: what an applied log entry did to the leases, as ordered events a watcher can
//! follow (ACQUIRED, RELEASED, EXPIRED, HANDED_OFF), and the selectors that pick a watcher's
//! events (one resource, a tenant, or a tenant's resources under a prefix).
//!
//! The events are a pure function of an entry and what applying it produced
//! ([`events_of`]): every replica derives the same events for the same entry, so a watcher can
//! resume on another node from a group log index. Renewals and session keep-alives are not
//! events (they change no holder). A replayed outcome (a retried request id) is no event either:
//! nothing changed.
//!
//! Within one entry the events come in this order: the leases the entry ended by expiry (its
//! Expire command, an Acquire past the previous lease's expiry, a session's end), then each
//! operation's own event in the operation order, then the hand-offs the entry made, in the order
//! they were made. So for any one resource a lease's end comes before the next grant.
//!
//! Must not depend on: anything outside this crate (no clock, no I/O).

use serde::{Deserialize, Serialize};

use crate::command::{ApplyOutput, CommandResult, LeaseOp, LeaseOutcome, LeaseReply};
use crate::ids::{LeaseId, ResourceKey, SessionId};
use crate::{Command, Entry};

/// Why a lease ended without a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExpiryReason {
    /// Its own ttl ran out.
    Ttl,
    /// The session it was bound to ended (closed, or its record expired).
    Session(SessionId),
}

/// What happened to a resource's lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum WatchEventKind {
    /// A holder acquired the resource (Acquire, AcquireInSession, an AcquireWait granted at
    /// once, or the new holder of a Transfer).
    Acquired {
        /// The new holder.
        holder_id: String,
        /// The lease.
        lease_id: LeaseId,
        /// Its fencing token.
        fencing_token: u64,
        /// When it expires unless renewed (for a session-bound lease: when the session's record
        /// expires unless kept alive).
        expires_at_ms: u64,
        /// The session it is bound to, if any.
        session_id: Option<SessionId>,
    },
    /// Its holder released it (Release, or the old holder of a Transfer).
    Released {
        /// The holder that released it.
        holder_id: String,
        /// The lease.
        lease_id: LeaseId,
        /// Its fencing token.
        fencing_token: u64,
    },
    /// It ended without a release.
    Expired {
        /// The lease.
        lease_id: LeaseId,
        /// Its fencing token.
        fencing_token: u64,
        /// The log time at which it ended.
        expired_at_ms: u64,
        /// Why.
        reason: ExpiryReason,
    },
    /// The end of the previous lease handed the resource to the first live waiter of its queue.
    HandedOff {
        /// The waiter that now holds it.
        holder_id: String,
        /// The new lease.
        lease_id: LeaseId,
        /// Its fencing token.
        fencing_token: u64,
        /// When it expires unless renewed.
        expires_at_ms: u64,
        /// The fencing token of the lease whose end handed it over.
        previous_fencing_token: Option<u64>,
    },
}

impl WatchEventKind {
    /// The contract's name of the event, e.g. `ACQUIRED`.
    pub fn as_str(&self) -> &'static str {
        match self {
            WatchEventKind::Acquired { .. } => "ACQUIRED",
            WatchEventKind::Released { .. } => "RELEASED",
            WatchEventKind::Expired { .. } => "EXPIRED",
            WatchEventKind::HandedOff { .. } => "HANDED_OFF",
        }
    }

    /// The fencing token of the lease the event is about.
    pub fn fencing_token(&self) -> u64 {
        match self {
            WatchEventKind::Acquired { fencing_token, .. }
            | WatchEventKind::Released { fencing_token, .. }
            | WatchEventKind::Expired { fencing_token, .. }
            | WatchEventKind::HandedOff { fencing_token, .. } => *fencing_token,
        }
    }

    /// True for an event that grants the resource (ACQUIRED, HANDED_OFF).
    pub fn is_grant(&self) -> bool {
        matches!(
            self,
            WatchEventKind::Acquired { .. } | WatchEventKind::HandedOff { .. }
        )
    }
}

/// One event of a group's log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchEvent {
    /// The group.
    pub group_id: u32,
    /// The log index of the entry that made it.
    pub index: u64,
    /// That entry's log time.
    pub log_time_ms: u64,
    /// The resource.
    pub key: ResourceKey,
    /// What happened.
    pub kind: WatchEventKind,
}

/// Which events a watcher wants. Every selector names one tenant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum WatchSelector {
    /// One resource.
    Resource(ResourceKey),
    /// Every resource of a tenant.
    Tenant(String),
    /// A tenant's resources whose id starts with `prefix`.
    Prefix {
        /// The tenant.
        tenant_id: String,
        /// The resource id prefix.
        prefix: String,
    },
}

impl WatchSelector {
    /// The tenant the selector is confined to.
    pub fn tenant_id(&self) -> &str {
        match self {
            WatchSelector::Resource(key) => &key.tenant_id,
            WatchSelector::Tenant(tenant_id) | WatchSelector::Prefix { tenant_id, .. } => tenant_id,
        }
    }

    /// Checks the selector's names (a prefix may be empty: the whole tenant; else it is checked
    /// like a resource id).
    pub fn validate(&self) -> Result<(), crate::LeaseError> {
        match self {
            WatchSelector::Resource(key) => key.validate(),
            WatchSelector::Tenant(tenant_id) => crate::validate_tenant_id(tenant_id),
            WatchSelector::Prefix { tenant_id, prefix } => {
                crate::validate_tenant_id(tenant_id)?;
                if prefix.is_empty() {
                    Ok(())
                } else {
                    crate::validate_resource_id(prefix)
                }
            }
        }
    }

    /// Whether an event about `key` is selected.
    pub fn matches(&self, key: &ResourceKey) -> bool {
        match self {
            WatchSelector::Resource(wanted) => wanted == key,
            WatchSelector::Tenant(tenant_id) => key.tenant_id == *tenant_id,
            WatchSelector::Prefix { tenant_id, prefix } => {
                key.tenant_id == *tenant_id && key.resource_id.starts_with(prefix.as_str())
            }
        }
    }
}

/// Parses a watch cursor, `GROUP:INDEX,...` (empty: none), as `tenurectl watch --after` and
/// the HTTP watch route's `Last-Event-ID` carry it; the error names the bad part.
pub fn parse_watch_cursor(text: &str) -> Result<std::collections::BTreeMap<u32, u64>, String> {
    text.split(',')
        .filter(|part| !part.trim().is_empty())
        .map(|part| {
            let (group, index) = part.split_once(':').unwrap_or((part, ""));
            match (group.trim().parse(), index.trim().parse()) {
                (Ok(group), Ok(index)) => Ok((group, index)),
                _ => Err(format!("cursor part {part:?} is not GROUP:INDEX")),
            }
        })
        .collect()
}

/// Renders a watch cursor as [`parse_watch_cursor`] reads it.
pub fn render_watch_cursor(cursor: &std::collections::BTreeMap<u32, u64>) -> String {
    cursor
        .iter()
        .map(|(group, index)| format!("{group}:{index}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The events of the entry at `index` of `group`, given what applying it produced (see the
/// module documentation for their order).
pub fn events_of(
    group_id: u32,
    index: u64,
    entry: &Entry,
    output: &ApplyOutput,
) -> Vec<WatchEvent> {
    let log_time_ms = output.log_time_ms;
    let mut events = Vec::new();
    let mut push = |key: ResourceKey, kind: WatchEventKind| {
        events.push(WatchEvent {
            group_id,
            index,
            log_time_ms,
            key,
            kind,
        });
    };
    for reclaimed in output.reclaimed.iter().chain(&output.superseded) {
        push(
            ResourceKey::new(reclaimed.tenant_id.as_str(), reclaimed.resource_id.as_str()),
            WatchEventKind::Expired {
                lease_id: reclaimed.lease_id,
                fencing_token: reclaimed.fencing_token,
                expired_at_ms: reclaimed.expires_at_ms,
                reason: reclaimed
                    .session_id
                    .map_or(ExpiryReason::Ttl, ExpiryReason::Session),
            },
        );
    }
    match (&entry.command, &output.result) {
        (Command::Lease(op), CommandResult::Lease(outcome)) => op_events(op, outcome, &mut push),
        (Command::Batch(ops), CommandResult::Batch(Ok(outcomes))) => {
            for (op, outcome) in ops.iter().zip(outcomes) {
                op_events(op, outcome, &mut push);
            }
        }
        _ => {}
    }
    for ended in &output.waits_ended {
        let Ok(LeaseReply::Acquired(grant)) = &ended.outcome else {
            continue;
        };
        push(
            ResourceKey::new(ended.tenant_id.as_str(), ended.resource_id.as_str()),
            WatchEventKind::HandedOff {
                holder_id: ended.holder_id.to_string(),
                lease_id: grant.lease_id,
                fencing_token: grant.fencing_token,
                expires_at_ms: grant.expires_at_ms,
                previous_fencing_token: ended.previous_fencing_token,
            },
        );
    }
    events
}

fn op_events(
    op: &LeaseOp,
    outcome: &LeaseOutcome,
    push: &mut impl FnMut(ResourceKey, WatchEventKind),
) {
    if outcome.replayed {
        return;
    }
    let Ok(reply) = &outcome.result else {
        return;
    };
    let acquired =
        |holder_id: &str, grant: &crate::LeaseGrant, session_id| WatchEventKind::Acquired {
            holder_id: holder_id.to_owned(),
            lease_id: grant.lease_id,
            fencing_token: grant.fencing_token,
            expires_at_ms: grant.expires_at_ms,
            session_id,
        };
    let released = |holder_id: &str, lease_id, fencing_token| WatchEventKind::Released {
        holder_id: holder_id.to_owned(),
        lease_id,
        fencing_token,
    };
    match (op, reply) {
        (LeaseOp::Acquire(request), LeaseReply::Acquired(grant)) => push(
            request.key.clone(),
            acquired(&request.holder_id, grant, None),
        ),
        (LeaseOp::AcquireWait(request), LeaseReply::Acquired(grant)) => {
            let session_id = match request.lease {
                crate::WaitLease::Session { session_id } => Some(session_id),
                crate::WaitLease::Ttl { .. } => None,
            };
            push(
                request.key.clone(),
                acquired(&request.holder_id, grant, session_id),
            );
        }
        (LeaseOp::AcquireInSession(request), LeaseReply::Acquired(grant)) => push(
            request.key.clone(),
            acquired(&request.holder_id, grant, Some(request.session_id)),
        ),
        (LeaseOp::Release(request), LeaseReply::Released(receipt)) => push(
            request.key.clone(),
            released(&request.holder_id, receipt.lease_id, receipt.fencing_token),
        ),
        (LeaseOp::Transfer(request), LeaseReply::Transferred(receipt)) => {
            push(
                request.key.clone(),
                released(
                    &request.holder_id,
                    receipt.released.lease_id,
                    receipt.released.fencing_token,
                ),
            );
            push(
                request.key.clone(),
                acquired(&request.new_holder_id, &receipt.grant, None),
            );
        }
        _ => {}
    }
}
