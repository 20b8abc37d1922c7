//! The JSON request and response bodies of the Tenure v1 routes, and their conversion from the
//! native types.
//!
//! Must not depend on: the node's internals (only the request path's `Service`).

use super::*;

#[derive(Deserialize)]
pub(super) struct AcquireJson {
    pub(super) tenant_id: String,
    pub(super) resource_id: String,
    pub(super) holder_id: String,
    #[serde(default)]
    pub(super) ttl_seconds: Option<serde_json::Number>,
    #[serde(default)]
    pub(super) ttl_ms: Option<u64>,
    pub(super) request_id: String,
}

#[derive(Deserialize)]
pub(super) struct RenewJson {
    pub(super) tenant_id: String,
    pub(super) resource_id: String,
    pub(super) lease_id: String,
    pub(super) holder_id: String,
    #[serde(default)]
    pub(super) ttl_seconds: Option<serde_json::Number>,
    #[serde(default)]
    pub(super) ttl_ms: Option<u64>,
    pub(super) request_id: String,
}

#[derive(Deserialize)]
pub(super) struct ReleaseJson {
    pub(super) tenant_id: String,
    pub(super) resource_id: String,
    pub(super) lease_id: String,
    pub(super) holder_id: String,
    pub(super) request_id: String,
}

/// A fence check: whether `fencing_token` is the resource's current active grant.
#[derive(Deserialize)]
pub(super) struct CheckFenceJson {
    pub(super) tenant_id: String,
    pub(super) resource_id: String,
    pub(super) fencing_token: u64,
}

/// A fence check's answer: the verdict ([`tenure_core::FenceVerdict`]) and the log time it was
/// computed at.
#[derive(Serialize)]
pub(super) struct FenceCheckJson {
    /// True when the token's lease is the resource's active lease with time left.
    pub(super) current: bool,
    /// The token asked about.
    pub(super) fencing_token: u64,
    /// The status of the resource's latest lease (`ABSENT` when it has none).
    pub(super) status: &'static str,
    /// The fencing token of the resource's latest lease (`null` when it has none).
    pub(super) latest_fencing_token: Option<u64>,
    /// Milliseconds the lease has left while `current`, else 0.
    pub(super) remaining_ttl_ms: u64,
    pub(super) group_id: u32,
    pub(super) log_time_ms: u64,
}

#[derive(Deserialize)]
pub(super) struct TransferJson {
    pub(super) tenant_id: String,
    pub(super) resource_id: String,
    pub(super) lease_id: String,
    pub(super) holder_id: String,
    pub(super) new_holder_id: String,
    #[serde(default)]
    pub(super) ttl_seconds: Option<serde_json::Number>,
    #[serde(default)]
    pub(super) ttl_ms: Option<u64>,
    pub(super) request_id: String,
}

#[derive(Deserialize)]
pub(super) struct GetQuery {
    #[serde(default)]
    pub(super) stale: Option<bool>,
}

#[derive(Deserialize)]
pub(super) struct ListQuery {
    #[serde(default)]
    pub(super) page_size: Option<u32>,
    #[serde(default)]
    pub(super) page_token: Option<String>,
    #[serde(default)]
    pub(super) filter_status: Option<String>,
    #[serde(default)]
    pub(super) stale: Option<bool>,
}

#[derive(Serialize)]
pub(super) struct GrantJson {
    pub(super) lease_id: String,
    pub(super) expiry_time: String,
    pub(super) fencing_token: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) created: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) renewed: Option<bool>,
    pub(super) ttl_ms: u64,
    /// What is left of the grant as of the answer: `ttl_ms` for a fresh one, the remaining ttl
    /// of the original grant for a replay (zero once its lease ended).
    pub(super) remaining_ttl_ms: u64,
    /// For a replay: where the original grant's lease stands (`ACTIVE`, `EXPIRED`, `RELEASED`,
    /// `SUPERSEDED`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) replay_status: Option<&'static str>,
    pub(super) log_time_ms: u64,
    pub(super) expires_at_log_ms: u64,
    pub(super) replayed: bool,
    pub(super) group_id: u32,
    /// The session the lease is bound to (`/v1/sessions/acquire` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) session_id: Option<String>,
}

#[derive(Deserialize)]
pub(super) struct SessionOpenJson {
    pub(super) tenant_id: String,
    /// 32 hex digits, drawn at random by the client.
    pub(super) session_id: String,
    pub(super) owner_id: String,
    pub(super) group_id: u32,
    #[serde(default)]
    pub(super) ttl_seconds: Option<serde_json::Number>,
    #[serde(default)]
    pub(super) ttl_ms: Option<u64>,
}

#[derive(Deserialize)]
pub(super) struct SessionRefJson {
    pub(super) tenant_id: String,
    pub(super) session_id: String,
    pub(super) owner_id: String,
    pub(super) group_id: u32,
}

#[derive(Deserialize)]
pub(super) struct SessionAcquireJson {
    pub(super) tenant_id: String,
    pub(super) resource_id: String,
    pub(super) session_id: String,
    /// The session's owner.
    pub(super) holder_id: String,
    pub(super) request_id: String,
}

/// A session's record in one group after an open or a keep-alive.
#[derive(Serialize)]
pub(super) struct SessionJson {
    pub(super) session_id: String,
    pub(super) group_id: u32,
    pub(super) created: bool,
    pub(super) ttl_ms: u64,
    pub(super) remaining_ttl_ms: u64,
    /// Estimated like a grant's (this node's wall clock at arrival plus the remaining log time).
    pub(super) expiry_time: String,
    pub(super) log_time_ms: u64,
    pub(super) expires_at_log_ms: u64,
    /// Leases bound to the record, active at this log time.
    pub(super) bound_leases: u64,
}

/// A session's record in one group after a close.
#[derive(Serialize)]
pub(super) struct SessionClosedJson {
    pub(super) session_id: String,
    pub(super) group_id: u32,
    pub(super) closed: bool,
    pub(super) closed_at_log_ms: u64,
    /// Leases that ended with the record.
    pub(super) leases_ended: u64,
}

/// A transfer's answer: the new holder's grant (the [`GrantJson`] fields, `created: true`), who
/// holds it, and the lease that ended.
#[derive(Serialize)]
pub(super) struct TransferredJson {
    #[serde(flatten)]
    pub(super) grant: GrantJson,
    pub(super) holder_id: String,
    pub(super) previous_lease_id: String,
    pub(super) previous_fencing_token: u64,
}

#[derive(Serialize)]
pub(super) struct ReleasedJson {
    pub(super) lease_id: String,
    pub(super) released: bool,
    pub(super) expiry_time: String,
    pub(super) fencing_token: u64,
    pub(super) released_at_log_ms: u64,
    pub(super) replayed: bool,
    pub(super) group_id: u32,
}

#[derive(Serialize)]
pub(super) struct LeaseJson {
    pub(super) tenant_id: String,
    pub(super) resource_id: String,
    pub(super) lease_id: String,
    pub(super) holder_id: String,
    pub(super) status: &'static str,
    pub(super) expiry_time: String,
    pub(super) fencing_token: u64,
    pub(super) version: u64,
    pub(super) ttl_ms: u64,
    pub(super) remaining_ttl_ms: u64,
    pub(super) expires_at_log_ms: u64,
    /// The session the lease is bound to (absent for a lease with a ttl of its own, so Tenure
    /// v1 answers are unchanged).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) session_id: Option<String>,
}

#[derive(Serialize)]
pub(super) struct GetJson {
    pub(super) found: bool,
    /// For a resource without a lease record: Tenure's absent view (status `ABSENT`).
    pub(super) lease: LeaseJson,
    pub(super) stale: bool,
    pub(super) group_id: u32,
    pub(super) log_time_ms: u64,
}

#[derive(Serialize)]
pub(super) struct ListJson {
    pub(super) leases: Vec<LeaseJson>,
    /// `""` when the listing is complete (as Tenure).
    pub(super) next_page_token: String,
}

pub(super) fn grant_json(
    grant: LeaseGrant,
    arrived: SystemTime,
    replay: (bool, Option<ReplayState>),
    group_id: u32,
    renewed: bool,
) -> GrantJson {
    let (replayed, replay) = replay;
    // A replay reports what is left of the original grant as of the retry's log time (contract
    // 3.4), so an exact retry shows the original expiry (up to the wall-clock mapping), or an
    // earlier one once the lease ended; never a full ttl counted from now.
    let (expiry, remaining_ttl_ms) = match replay {
        Some(replay) => (
            wall_clock_of(arrived, replay.expires_at_ms, replay.answered_at_ms),
            replay.remaining_ttl_ms,
        ),
        None => {
            let remaining = grant.expires_at_ms.saturating_sub(grant.log_time_ms);
            (add_ms(arrived, remaining), remaining)
        }
    };
    GrantJson {
        lease_id: grant.lease_id.to_string(),
        expiry_time: rfc3339_millis(expiry),
        remaining_ttl_ms,
        replay_status: replay.map(|replay| replay.status.as_str()),
        fencing_token: grant.fencing_token,
        created: (!renewed).then_some(grant.created),
        renewed: renewed.then_some(true),
        ttl_ms: grant.ttl_ms,
        log_time_ms: grant.log_time_ms,
        expires_at_log_ms: grant.expires_at_ms,
        replayed,
        group_id,
        session_id: None,
    }
}

/// A view as JSON. `log_time_ms` is the log time the view was computed at, when known.
pub(super) fn lease_json(
    view: LeaseView,
    arrived: SystemTime,
    log_time_ms: Option<u64>,
) -> LeaseJson {
    let expiry = if view.status == LeaseStatus::Active {
        add_ms(arrived, view.remaining_ttl_ms)
    } else {
        let since_expiry = log_time_ms.map_or(0, |now| now.saturating_sub(view.expires_at_ms));
        arrived
            .checked_sub(Duration::from_millis(since_expiry))
            .unwrap_or(arrived)
    };
    LeaseJson {
        tenant_id: view.key.tenant_id,
        resource_id: view.key.resource_id,
        lease_id: view.lease_id.to_string(),
        holder_id: view.holder_id,
        status: view.status.as_str(),
        expiry_time: rfc3339_millis(expiry),
        fencing_token: view.fencing_token,
        version: record_version(view.fencing_token, view.version),
        ttl_ms: view.ttl_ms,
        remaining_ttl_ms: view.remaining_ttl_ms,
        expires_at_log_ms: view.expires_at_ms,
        session_id: view.session_id.map(|id| id.to_string()),
    }
}

/// Tenure's view of a resource that has no lease record: its key, status `ABSENT`, empty lease id,
/// holder and expiry time, zero fencing token and version.
pub(super) fn absent_lease_json(key: &ResourceKey) -> LeaseJson {
    LeaseJson {
        tenant_id: key.tenant_id.clone(),
        resource_id: key.resource_id.clone(),
        lease_id: String::new(),
        holder_id: String::new(),
        status: LeaseStatus::Absent.as_str(),
        expiry_time: String::new(),
        fencing_token: 0,
        version: 0,
        ttl_ms: 0,
        remaining_ttl_ms: 0,
        expires_at_log_ms: 0,
        session_id: None,
    }
}

/// The record version Tenure clients see: it only increases along a resource's life, across
/// grants (Tenure's "monotonic state-machine version for the record"). The native view counts
/// the changes of one lease (1 at grant, +1 per renewal and for the release), and a new grant
/// has a larger fencing token than every earlier grant of the resource, even after its old
/// record was garbage-collected or moved; so the token in the high 32 bits and the per-lease
/// count in the low 32 bits order every change of the resource. (Exact while tokens stay below
/// 2^32; beyond that the value saturates.)
pub(super) fn record_version(fencing_token: u64, lease_version: u64) -> u64 {
    let changes = lease_version.min(u64::from(u32::MAX));
    fencing_token
        .checked_mul(1 << 32)
        .and_then(|high| high.checked_add(changes))
        .unwrap_or(u64::MAX)
}

pub(super) fn add_ms(time: SystemTime, ms: u64) -> SystemTime {
    time.checked_add(Duration::from_millis(ms)).unwrap_or(time)
}

/// The wall-clock time of log time `at_ms`, given that log time `now_ms` is `arrived`.
pub(super) fn wall_clock_of(arrived: SystemTime, at_ms: u64, now_ms: u64) -> SystemTime {
    if at_ms >= now_ms {
        add_ms(arrived, at_ms - now_ms)
    } else {
        arrived
            .checked_sub(Duration::from_millis(now_ms - at_ms))
            .unwrap_or(arrived)
    }
}

/// `time` as RFC 3339 UTC with millisecond precision, e.g. `2024-02-29T23:59:59.123Z`
/// (humantime's formatting). Times before 1970 are shown as the epoch, times after 9999 as the
/// last millisecond of 9999 (humantime formats neither).
pub(super) fn rfc3339_millis(time: SystemTime) -> String {
    let latest = UNIX_EPOCH + Duration::from_millis(253_402_300_799_999);
    humantime::format_rfc3339_millis(time.clamp(UNIX_EPOCH, latest)).to_string()
}
