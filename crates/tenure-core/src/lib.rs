//! # tenure-core: the lease state machine of one Raft group
//!
//! Every guarantee tenure gives (single holder, monotonic fencing, exactly-once retries, expiry by
//! log time) is decided here, by one deterministic state machine that every replica of a group
//! applies in log order. This crate implements sections 1-4 and 6 of the lease contract
//! (`shared/spec/lease-contract.md`) for one group.
//!
//! ## What it must never depend on
//!
//! tenure-core knows nothing of tokio, RocksDB, QUIC, openraft, files, sockets, clocks, random
//! sources, environment variables or configuration files. Time arrives as the log time stamped on
//! each [`Entry`]; limits arrive through the log ([`Command::SetGroupLimits`]); effects leave as
//! values ([`ApplyOutput`]). A test in `tenure-tests` enforces the dependency absences.
//!
//! ## Key types
//!
//! - [`LeaseStateMachine`]: `apply(&Entry) -> ApplyOutput`, `get`, `list`, snapshots.
//! - [`Command`], [`LeaseOp`], [`Entry`]: what the log carries.
//! - [`LeaseError`], [`ErrorCode`]: the contract's error codes, typed.
//! - [`GroupLimits`], [`TenantPolicy`]: every bound, replicated.
//! - [`PlacementMap`], [`placement`]: which group owns a key (clients compute it too).
//!
//! ## Invariants
//!
//! 1. **Determinism.** `apply` reads nothing but the state and the entry. Equal states applying
//!    equal entries produce equal outputs and equal states; "equal" is checkable as equal snapshot
//!    bytes ([`LeaseStateMachine::snapshot_to_vec`]). No iteration over a hash table ever reaches
//!    an output or a snapshot.
//! 2. **Log time never decreases.** An entry stamped earlier than the last one applied is applied at
//!    the last one's time; this can only lengthen leases, never shorten them.
//! 3. **Expiry is half-open.** A lease granted or renewed at log time `t` with ttl `d` is active
//!    at log time `u` iff `u < t + d`.
//! 4. **Single holder.** At most one lease per resource is active at any log time: Acquire grants
//!    only when the resource's record is not active at the entry's log time, and a resource has
//!    exactly one record.
//! 5. **Fencing order** (the argument). The group keeps one counter, `next_sequence`, starting at
//!    1 and only ever incremented; every grant takes the counter's value as its fencing token and
//!    increments it. So tokens issued by one group strictly increase in log order, whatever
//!    happens to lease records: garbage-collecting a record cannot lower the counter, and the
//!    counter is in every snapshot. Leader changes do not matter because the counter is replicated
//!    state, advanced only by applying committed entries. For a *move* of a resource from group A
//!    to group B (a later issue), the move carries a floor `F` = A's counter at the moment A stops
//!    granting the resource; B applies `next_sequence = max(next_sequence, F)` before it grants
//!    the resource. Every token A ever issued for it is below `F`, every token B issues after the
//!    move is at least `F`: strictly increasing across the move too. The lease id is
//!    `(granting group, token)`, unique for the cluster's lifetime because group ids are never
//!    reused and a group never issues a token twice. Apply asserts on every grant that the new
//!    token exceeds the record's previous one; a failure aborts the process.
//! 6. **Exactly-once.** A lease operation's outcome (errors included, except retryable refusals
//!    that had no effect) is stored under `(tenant, resource, request_id)` and replayed for a
//!    retry with the same fingerprint; a different request reusing the id gets
//!    `INVALID_ARGUMENT` and never overwrites the stored outcome. Retention is exact in log time
//!    and bounded in count (see `state::dedup`).
//! 7. **Bounded.** Every table has a limit in [`GroupLimits`]; every apply does bounded work
//!    (Expire and the quota reclaim are capped by `expire_batch_max`, garbage collection by a
//!    budget proportional to the entry's size, List by `list_scan_max`).

mod cluster;
mod command;
mod error;
mod ids;
mod limits;
mod negative;
mod placement;
mod state;
mod validate;
mod watch;

pub use cluster::{
    CLUSTER_NODES_MAX, ClusterChange, ClusterError, ClusterMeta, ClusterOp, FounderNode,
    LEADER_PREFERENCES_MAX, METADATA_GROUP, NODE_ADDRESS_BYTES_MAX, NodeAddresses, NodeRecord,
    NodeState,
};
pub use command::{
    AcquireRequest, ApplyOutput, Command, CommandResult, Entry, FenceVerdict, LeaseGrant, LeaseOp,
    LeaseOpKind, LeaseOpParts, LeaseOutcome, LeaseReply, LeaseStatus, LeaseView, ListPage,
    ListRequest, QueuedReceipt, ReclaimedLease, ReleaseReceipt, ReleaseRequest, RenewRequest,
    ReplayState, ReplayStatus, SessionAcquireRequest, SessionGrant, SessionOpenRequest,
    SessionReceipt, SessionRequest, TransferReceipt, TransferRequest, WaitAcquireRequest,
    WaitCancelReceipt, WaitCancelRequest, WaitEnded, WaitLease,
};
pub use error::{ErrorCode, LeaseError, OverloadReason, QuotaKind, WaitEndReason};
pub use ids::{GroupId, LeaseId, ResourceKey, SessionId, SessionIdParseError};
pub use limits::{
    BATCH_ITEMS_CEILING, BATCH_ITEMS_MAX_DEFAULT, DEDUP_RECORD_BYTES_MEASURED,
    DEDUP_RECORD_BYTES_WORST, GROUP_RECORDS_MAX_DEFAULT, GROUP_TENANTS_MAX_DEFAULT, GroupLimits,
    HOLDER_ID_BYTES_MAX, HOSTED_GROUPS_DEFAULT, LEASE_RECORD_BYTES_MEASURED,
    LEASE_RECORD_BYTES_WORST, NODE_STATE_BYTES_DEFAULT, REQUEST_ID_BYTES_MAX,
    RESOURCE_ID_BYTES_MAX, TENANT_ACTIVE_LEASES_MAX_DEFAULT, TENANT_BYTES_WORST,
    TENANT_GROUP_SHARE_FLOOR_DEFAULT, TENANT_ID_BYTES_MAX, TENANT_QUOTA_SLACK_PERCENT_DEFAULT,
    TTL_MS_CEILING, TenantPolicy, tenant_group_share,
};
pub use negative::NegativeControl;
pub use placement::{
    PlacementError, PlacementMap, SLOT_COUNT_DEFAULT, SLOT_COUNT_MAX, key_hash, placement,
};
pub use state::{
    FrozenState, GROUP_SESSIONS_MAX, GROUP_WAITERS_MAX, LeaseStateMachine, RESOURCE_WAITERS_MAX,
    SNAPSHOT_FORMAT_VERSION, SNAPSHOT_FORMAT_VERSION_MIN, SnapshotError, SnapshotStats,
    StateOptions, StateStats,
};
pub use validate::{
    validate_holder_id, validate_request_id, validate_resource_id, validate_tenant_id,
};
pub use watch::{
    ExpiryReason, WatchEvent, WatchEventKind, WatchSelector, events_of, parse_watch_cursor,
    render_watch_cursor,
};
