//! Golden bytes of every wire format this crate defines (issue 19, item 10): every request and
//! response kind of the native client protocol, every peer frame kind and message kind, every
//! error code and lease status. Each value below is encoded and compared byte for byte with its
//! committed file under `tests/golden/`, and each committed file is decoded, compared with the
//! value and re-encoded to the same bytes. Postcard encodes enums by declaration order, so
//! reordering a variant, inserting one in the middle, or adding a field changes these bytes and
//! fails this test: that is a wire-format change, which needs a version bump
//! (`CLIENT_PROTOCOL_VERSION`, `PEER_PROTOCOL_VERSION`) and a deliberate re-blessing:
//!
//! ```text
//! TENURE_BLESS=1 cargo test --workspace --all-features -- golden
//! ```
//!
//! Must not depend on: anything but the crate's public API and `tenure-core`'s types.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::Path;

use bytes::{Bytes, BytesMut};
use tenure_core::{
    AcquireRequest, ClusterChange, ClusterMeta, ClusterOp, ErrorCode, ExpiryReason, FenceVerdict,
    GroupId, LeaseError, LeaseGrant, LeaseId, LeaseOp, LeaseReply, LeaseStatus, LeaseView,
    ListPage, ListRequest, NodeAddresses, NodeRecord, NodeState, OverloadReason, QueuedReceipt,
    QuotaKind, ReleaseReceipt, ReleaseRequest, RenewRequest, ReplayState, ReplayStatus,
    ResourceKey, SessionAcquireRequest, SessionGrant, SessionId, SessionOpenRequest,
    SessionReceipt, SessionRequest, TransferReceipt, TransferRequest, WaitAcquireRequest,
    WaitCancelReceipt, WaitCancelRequest, WaitEndReason, WaitLease, WatchEvent, WatchEventKind,
    WatchSelector,
};
use tenure_golden::Golden;
use tenure_proto::client::{
    CLIENT_ALPN, CLIENT_PROTOCOL_VERSION, FenceCheckResult, FollowerProgress, GetResult,
    GroupLeader, GroupMembers, GroupStatus, LeaseResult, NodeAddress, NodeStatus, Principal,
    ReplicaChange, Request, RequestBody, RequestFlags, RequestFrame, Response, ResponseBody,
    ResponseFrame, RoutingTable, WatchPage, WatchPoll, WireError, check_client_alpn,
    decode_request_frame, decode_response_frame, encode_client_frame,
};
use tenure_proto::peer::FRAME_LENGTH_BYTES;
use tenure_proto::{
    BatchMessage, Frame, Hello, HelloReply, MessageKind, PEER_PROTOCOL_VERSION, ProtoError,
    decode_frame_body, encode_frame, encode_payload,
};

/// The golden files of `subdir` under this crate's `tests/golden/`.
fn golden(subdir: &str) -> Golden {
    Golden::new(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/golden")
            .join(subdir),
    )
}

/// Fails on any mismatch of a wire format.
fn finish(golden: Golden) {
    golden.finish("a wire format", "bump the protocol version");
}

// ---------------------------------------------------------------------------------------------
// Fixtures: one value of every kind, with distinct, recognisable field values.

fn key() -> ResourceKey {
    ResourceKey::new("acme", "db-primary")
}

fn lease_id() -> LeaseId {
    LeaseId {
        group_id: GroupId(7),
        sequence: 0x0102_0304,
    }
}

fn grant(created: bool) -> LeaseGrant {
    LeaseGrant {
        lease_id: lease_id(),
        fencing_token: 0x0102_0304,
        log_time_ms: 1_700_000_000_000,
        expires_at_ms: 1_700_000_030_000,
        ttl_ms: 30_000,
        created,
    }
}

fn view() -> LeaseView {
    LeaseView {
        key: key(),
        lease_id: lease_id(),
        holder_id: "worker-1".into(),
        status: LeaseStatus::Active,
        fencing_token: 0x0102_0304,
        expires_at_ms: 1_700_000_030_000,
        remaining_ttl_ms: 12_345,
        ttl_ms: 30_000,
        version: 3,
        session_id: None,
    }
}

fn acquire() -> AcquireRequest {
    AcquireRequest {
        key: key(),
        holder_id: "worker-1".into(),
        ttl_ms: 30_000,
        request_id: "req-1".into(),
    }
}

fn renew() -> RenewRequest {
    RenewRequest {
        key: key(),
        lease_id: lease_id(),
        holder_id: "worker-1".into(),
        ttl_ms: 60_000,
        request_id: "req-2".into(),
    }
}

fn release() -> ReleaseRequest {
    ReleaseRequest {
        key: key(),
        lease_id: lease_id(),
        holder_id: "worker-1".into(),
        request_id: "req-3".into(),
    }
}

fn transfer() -> TransferRequest {
    TransferRequest {
        key: key(),
        lease_id: lease_id(),
        holder_id: "worker-1".into(),
        new_holder_id: "worker-2".into(),
        ttl_ms: 45_000,
        request_id: "req-4".into(),
    }
}

fn node_address(node_id: u64) -> NodeAddress {
    NodeAddress {
        node_id,
        client_addr: format!("10.0.0.{node_id}:7401"),
        http_url: format!("http://10.0.0.{node_id}:7501"),
    }
}

fn every_lease_error() -> Vec<(&'static str, LeaseError)> {
    vec![
        (
            "invalid_argument",
            LeaseError::invalid("ttl_ms", "must be at least 4500"),
        ),
        ("not_found", LeaseError::NotFound),
        (
            "already_held",
            LeaseError::AlreadyHeld {
                holder_id: "worker-2".into(),
                remaining_ttl_ms: 999,
            },
        ),
        (
            "lease_expired",
            LeaseError::LeaseExpired {
                lease_id: lease_id(),
            },
        ),
        (
            "lease_mismatch",
            LeaseError::LeaseMismatch {
                lease_id: lease_id(),
            },
        ),
        (
            "quota_tenant_active_leases",
            LeaseError::QuotaExceeded {
                kind: QuotaKind::TenantActiveLeases,
                limit: 1_000,
            },
        ),
        (
            "quota_group_lease_records",
            LeaseError::QuotaExceeded {
                kind: QuotaKind::GroupLeaseRecords,
                limit: 2_000,
            },
        ),
        (
            "quota_group_tenants",
            LeaseError::QuotaExceeded {
                kind: QuotaKind::GroupTenants,
                limit: 3_000,
            },
        ),
        (
            "overloaded_dedup_table_full",
            LeaseError::Overloaded {
                reason: OverloadReason::DedupTableFull,
            },
        ),
        (
            "quota_group_sessions",
            LeaseError::QuotaExceeded {
                kind: QuotaKind::GroupSessions,
                limit: 65_536,
            },
        ),
        (
            "quota_tenant_sessions",
            LeaseError::QuotaExceeded {
                kind: QuotaKind::TenantSessions,
                limit: 4_000,
            },
        ),
        (
            "session_not_found",
            LeaseError::SessionNotFound {
                session_id: session_id(),
            },
        ),
        (
            "session_expired",
            LeaseError::SessionExpired {
                session_id: session_id(),
            },
        ),
        // Appended with wait queues (client protocol 8).
        (
            "wait_ended_timed_out",
            LeaseError::WaitEnded {
                reason: WaitEndReason::TimedOut,
            },
        ),
        (
            "wait_ended_cancelled",
            LeaseError::WaitEnded {
                reason: WaitEndReason::Cancelled,
            },
        ),
        (
            "wait_ended_session_ended",
            LeaseError::WaitEnded {
                reason: WaitEndReason::SessionEnded,
            },
        ),
        (
            "wait_ended_ttl_out_of_bounds",
            LeaseError::WaitEnded {
                reason: WaitEndReason::TtlOutOfBounds,
            },
        ),
        (
            "quota_resource_waiters",
            LeaseError::QuotaExceeded {
                kind: QuotaKind::ResourceWaiters,
                limit: 4_096,
            },
        ),
        (
            "quota_group_waiters",
            LeaseError::QuotaExceeded {
                kind: QuotaKind::GroupWaiters,
                limit: 65_536,
            },
        ),
        (
            "quota_tenant_waiters",
            LeaseError::QuotaExceeded {
                kind: QuotaKind::TenantWaiters,
                limit: 1_000,
            },
        ),
    ]
}

fn session_id() -> SessionId {
    SessionId(0x0011_2233_4455_6677_8899_aabb_ccdd_eeff)
}

fn session_request() -> SessionRequest {
    SessionRequest {
        tenant_id: "acme".into(),
        group_id: GroupId(7),
        session_id: session_id(),
        owner_id: "worker-1".into(),
    }
}

/// Every request kind (and the shapes of principal and flags).
/// One event of each kind (and both expiry reasons), as a watch page carries them.
fn watch_events() -> Vec<WatchEvent> {
    let event = |index: u64, kind: WatchEventKind| WatchEvent {
        group_id: 7,
        index,
        log_time_ms: 1_700_000_000_000 + index,
        key: key(),
        kind,
    };
    vec![
        event(
            1_235,
            WatchEventKind::Acquired {
                holder_id: "worker-1".into(),
                lease_id: lease_id(),
                fencing_token: 42,
                expires_at_ms: 1_700_000_030_000,
                session_id: Some(session_id()),
            },
        ),
        event(
            1_236,
            WatchEventKind::Released {
                holder_id: "worker-1".into(),
                lease_id: lease_id(),
                fencing_token: 42,
            },
        ),
        event(
            1_236,
            WatchEventKind::HandedOff {
                holder_id: "worker-2".into(),
                lease_id: lease_id(),
                fencing_token: 43,
                expires_at_ms: 1_700_000_060_000,
                previous_fencing_token: Some(42),
            },
        ),
        event(
            1_238,
            WatchEventKind::Expired {
                lease_id: lease_id(),
                fencing_token: 43,
                expired_at_ms: 1_700_000_060_000,
                reason: ExpiryReason::Ttl,
            },
        ),
        event(
            1_239,
            WatchEventKind::Expired {
                lease_id: lease_id(),
                fencing_token: 44,
                expired_at_ms: 1_700_000_061_000,
                reason: ExpiryReason::Session(session_id()),
            },
        ),
    ]
}

fn requests() -> Vec<(&'static str, Request)> {
    let request = |id: u64, body: RequestBody| Request {
        id,
        timeout_ms: 5_000,
        flags: RequestFlags::default(),
        principal: None,
        body,
    };
    let mut forwarded = request(10, RequestBody::Lease(LeaseOp::Acquire(acquire())));
    forwarded.flags = RequestFlags {
        forward: false,
        stale_read: false,
        principal_claimed: true,
    };
    forwarded.principal = Some(Principal {
        principal_id: "svc-acme".into(),
        tenant_id: "acme".into(),
    });
    let mut stale_get = request(11, RequestBody::Get { key: key() });
    stale_get.flags = RequestFlags {
        forward: true,
        stale_read: true,
        principal_claimed: false,
    };
    vec![
        (
            "authenticate",
            request(
                1,
                RequestBody::Authenticate {
                    token: "secret-token".into(),
                },
            ),
        ),
        ("routing", request(2, RequestBody::Routing)),
        (
            "acquire",
            request(3, RequestBody::Lease(LeaseOp::Acquire(acquire()))),
        ),
        (
            "renew",
            request(4, RequestBody::Lease(LeaseOp::Renew(renew()))),
        ),
        (
            "release",
            request(5, RequestBody::Lease(LeaseOp::Release(release()))),
        ),
        (
            "transfer",
            request(12, RequestBody::Lease(LeaseOp::Transfer(transfer()))),
        ),
        ("get", request(6, RequestBody::Get { key: key() })),
        (
            "session_open",
            request(
                20,
                RequestBody::Lease(LeaseOp::SessionOpen(SessionOpenRequest {
                    tenant_id: "acme".into(),
                    group_id: GroupId(7),
                    session_id: session_id(),
                    owner_id: "worker-1".into(),
                    ttl_ms: 30_000,
                })),
            ),
        ),
        (
            "session_keepalive",
            request(
                21,
                RequestBody::Lease(LeaseOp::SessionKeepAlive(session_request())),
            ),
        ),
        (
            "session_close",
            request(
                22,
                RequestBody::Lease(LeaseOp::SessionClose(session_request())),
            ),
        ),
        (
            "acquire_in_session",
            request(
                23,
                RequestBody::Lease(LeaseOp::AcquireInSession(SessionAcquireRequest {
                    key: key(),
                    holder_id: "worker-1".into(),
                    session_id: session_id(),
                    request_id: "req-9".into(),
                })),
            ),
        ),
        (
            "acquire_wait",
            request(
                24,
                RequestBody::Lease(LeaseOp::AcquireWait(WaitAcquireRequest {
                    key: key(),
                    holder_id: "worker-2".into(),
                    lease: WaitLease::Ttl { ttl_ms: 30_000 },
                    wait_ms: 60_000,
                    request_id: "req-10".into(),
                })),
            ),
        ),
        (
            "acquire_wait_in_session",
            request(
                25,
                RequestBody::Lease(LeaseOp::AcquireWait(WaitAcquireRequest {
                    key: key(),
                    holder_id: "worker-1".into(),
                    lease: WaitLease::Session {
                        session_id: session_id(),
                    },
                    wait_ms: 60_000,
                    request_id: "req-11".into(),
                })),
            ),
        ),
        (
            "wait_cancel",
            request(
                26,
                RequestBody::Lease(LeaseOp::WaitCancel(WaitCancelRequest {
                    key: key(),
                    holder_id: "worker-2".into(),
                    request_id: "req-10".into(),
                })),
            ),
        ),
        // Appended with watches (client protocol 8).
        (
            "watch_poll_prefix",
            request(
                27,
                RequestBody::Watch(WatchPoll {
                    group_id: 7,
                    selector: WatchSelector::Prefix {
                        tenant_id: "acme".into(),
                        prefix: "jobs/".into(),
                    },
                    after_index: Some(1_234),
                    wait_ms: 20_000,
                    events_max: 256,
                }),
            ),
        ),
        (
            "watch_poll_resource_start",
            request(
                28,
                RequestBody::Watch(WatchPoll {
                    group_id: 7,
                    selector: WatchSelector::Resource(key()),
                    after_index: None,
                    wait_ms: 0,
                    events_max: 16,
                }),
            ),
        ),
        (
            "watch_poll_tenant",
            request(
                29,
                RequestBody::Watch(WatchPoll {
                    group_id: 3,
                    selector: WatchSelector::Tenant("acme".into()),
                    after_index: Some(0),
                    wait_ms: 30_000,
                    events_max: 1,
                }),
            ),
        ),
        (
            "check_fence",
            request(
                13,
                RequestBody::CheckFence {
                    key: key(),
                    fencing_token: 42,
                },
            ),
        ),
        (
            "list",
            request(
                7,
                RequestBody::List {
                    group_id: 7,
                    request: ListRequest {
                        tenant_id: "acme".into(),
                        page_size: 100,
                        page_token: Some("token".into()),
                        status: Some(LeaseStatus::Expired),
                    },
                },
            ),
        ),
        (
            "batch",
            request(
                8,
                RequestBody::Batch {
                    ops: vec![
                        LeaseOp::Acquire(acquire()),
                        LeaseOp::Renew(renew()),
                        LeaseOp::Release(release()),
                    ],
                },
            ),
        ),
        ("status", request(9, RequestBody::Status)),
        (
            "group_members",
            request(13, RequestBody::GroupMembers { group_id: 7 }),
        ),
        (
            "move_replica",
            request(
                14,
                RequestBody::MoveReplica {
                    group_id: 7,
                    from: 2,
                    to: 4,
                },
            ),
        ),
        (
            "create_replica",
            request(15, RequestBody::CreateReplica { group_id: 7 }),
        ),
        (
            "drop_replica",
            request(
                16,
                RequestBody::DropReplica {
                    group_id: 7,
                    membership_log_index: 120,
                },
            ),
        ),
        ("cluster_nodes", request(17, RequestBody::ClusterNodes)),
        (
            "cluster_add_node",
            request(
                18,
                RequestBody::ClusterChange(ClusterOp::AddNode(NodeAddresses {
                    node_id: 4,
                    addr: "127.0.0.1:7404".into(),
                    http_addr: "127.0.0.1:7504".into(),
                })),
            ),
        ),
        (
            "cluster_node_up",
            request(
                19,
                RequestBody::ClusterChange(ClusterOp::NodeUp {
                    node: NodeAddresses {
                        node_id: 4,
                        addr: "127.0.0.1:7404".into(),
                        http_addr: "127.0.0.1:7504".into(),
                    },
                    cert_sha256: [0xab; 32],
                    incarnation: 1_764_000_000_000,
                }),
            ),
        ),
        (
            "cluster_drain",
            request(
                20,
                RequestBody::ClusterChange(ClusterOp::SetState {
                    node_id: 2,
                    state: NodeState::Draining,
                }),
            ),
        ),
        (
            "cluster_remove",
            request(
                21,
                RequestBody::ClusterChange(ClusterOp::Remove { node_id: 2 }),
            ),
        ),
        ("acquire_forwarded_claimed", forwarded),
        ("get_forward_stale", stale_get),
    ]
}

/// A node table with a node in every state, a revoked certificate and a preferred leader.
fn cluster_meta() -> ClusterMeta {
    let mut meta = ClusterMeta {
        version: 6,
        ..ClusterMeta::default()
    };
    let states = [
        NodeState::Active,
        NodeState::Joining,
        NodeState::Draining,
        NodeState::Dead,
        NodeState::Removed,
    ];
    for (index, state) in (1u8..).zip(states) {
        let node_id = u64::from(index);
        meta.nodes.insert(
            node_id,
            NodeRecord {
                node_id,
                addr: format!("127.0.0.1:740{node_id}"),
                http_addr: format!("127.0.0.1:750{node_id}"),
                state,
                cert_sha256: (state != NodeState::Joining).then_some([index; 32]),
                incarnation: if state == NodeState::Joining {
                    0
                } else {
                    1_764_000_000_000 + node_id
                },
                changed_at_ms: 1_000 * node_id,
            },
        );
    }
    meta.revoked.insert([5; 32], 5);
    meta.leader_preferences.insert(7, 1);
    meta
}

/// Every response kind, and an error response with every optional field set.
fn responses() -> Vec<(&'static str, Response)> {
    let ok = |id: u64, body: ResponseBody| Response {
        id,
        result: Ok(body),
    };
    let lease = |reply: LeaseReply, replayed: bool| LeaseResult {
        reply,
        replayed,
        group_id: 7,
        replay: replayed.then_some(ReplayState {
            answered_at_ms: 1_700_000_005_000,
            decided_at_ms: 1_700_000_000_000,
            status: ReplayStatus::Active,
            expires_at_ms: 1_700_000_030_000,
            remaining_ttl_ms: 25_000,
        }),
    };
    let mut full_error = WireError::from_lease_error(LeaseError::AlreadyHeld {
        holder_id: "worker-2".into(),
        remaining_ttl_ms: 999,
    });
    full_error.leader_hint = Some(node_address(2));
    full_error.placement_version = 4;
    full_error.retry_after_ms = Some(250);
    vec![
        (
            "authenticated",
            ok(
                1,
                ResponseBody::Authenticated(Principal {
                    principal_id: "svc-acme".into(),
                    tenant_id: "acme".into(),
                }),
            ),
        ),
        (
            "routing",
            ok(
                2,
                ResponseBody::Routing(RoutingTable {
                    placement_version: 1,
                    slot_groups: vec![0, 1, 2, 0],
                    groups: 3,
                    nodes: vec![node_address(1), node_address(2)],
                    leaders: vec![
                        GroupLeader {
                            group_id: 0,
                            leader: Some(1),
                            term: 5,
                        },
                        GroupLeader {
                            group_id: 1,
                            leader: None,
                            term: 0,
                        },
                    ],
                    nodes_version: 9,
                }),
            ),
        ),
        (
            "lease_acquired",
            ok(
                3,
                ResponseBody::Lease(lease(LeaseReply::Acquired(grant(true)), false)),
            ),
        ),
        (
            "lease_renewed_replayed",
            ok(
                4,
                ResponseBody::Lease(lease(LeaseReply::Renewed(grant(false)), true)),
            ),
        ),
        (
            "lease_transferred",
            ok(
                12,
                ResponseBody::Lease(lease(
                    LeaseReply::Transferred(Box::new(TransferReceipt {
                        released: ReleaseReceipt {
                            lease_id: lease_id(),
                            fencing_token: 0x0102_0304,
                            released_at_ms: 1_700_000_000_000,
                        },
                        grant: grant(true),
                    })),
                    false,
                )),
            ),
        ),
        (
            "lease_released",
            ok(
                5,
                ResponseBody::Lease(lease(
                    LeaseReply::Released(ReleaseReceipt {
                        lease_id: lease_id(),
                        fencing_token: 0x0102_0304,
                        released_at_ms: 1_700_000_010_000,
                    }),
                    false,
                )),
            ),
        ),
        (
            "get",
            ok(
                6,
                ResponseBody::Get(GetResult {
                    view: Some(view()),
                    log_time_ms: 1_700_000_017_655,
                    stale: true,
                    group_id: 7,
                }),
            ),
        ),
        (
            "get_bound_to_session",
            ok(
                24,
                ResponseBody::Get(GetResult {
                    view: Some(LeaseView {
                        session_id: Some(session_id()),
                        ..view()
                    }),
                    log_time_ms: 1_700_000_017_655,
                    stale: false,
                    group_id: 7,
                }),
            ),
        ),
        (
            "session_kept",
            ok(
                20,
                ResponseBody::Lease(lease(
                    LeaseReply::SessionKept(SessionGrant {
                        session_id: session_id(),
                        group_id: GroupId(7),
                        log_time_ms: 1_700_000_000_000,
                        expires_at_ms: 1_700_000_030_000,
                        ttl_ms: 30_000,
                        created: true,
                        bound_leases: 12,
                    }),
                    false,
                )),
            ),
        ),
        (
            "session_closed",
            ok(
                22,
                ResponseBody::Lease(lease(
                    LeaseReply::SessionClosed(SessionReceipt {
                        session_id: session_id(),
                        group_id: GroupId(7),
                        closed_at_ms: 1_700_000_040_000,
                        leases_ended: 12,
                    }),
                    false,
                )),
            ),
        ),
        (
            "queued",
            ok(
                24,
                ResponseBody::Lease(lease(
                    LeaseReply::Queued(QueuedReceipt {
                        position: 2,
                        waiters: 5,
                        queued_at_ms: 1_700_000_000_000,
                        wait_until_ms: 1_700_000_060_000,
                        log_time_ms: 1_700_000_001_000,
                        holder_id: "worker-1".into(),
                    }),
                    false,
                )),
            ),
        ),
        (
            "wait_cancelled",
            ok(
                26,
                ResponseBody::Lease(lease(
                    LeaseReply::WaitCancelled(WaitCancelReceipt {
                        cancelled: false,
                        granted: Some(LeaseGrant {
                            lease_id: lease_id(),
                            fencing_token: 43,
                            log_time_ms: 1_700_000_002_000,
                            expires_at_ms: 1_700_000_032_000,
                            ttl_ms: 30_000,
                            created: true,
                        }),
                    }),
                    false,
                )),
            ),
        ),
        // Appended with watches (client protocol 8).
        (
            "watch_page",
            ok(
                27,
                ResponseBody::Watch(WatchPage {
                    group_id: 7,
                    events: watch_events(),
                    through_index: 1_240,
                    resync: false,
                    current: None,
                }),
            ),
        ),
        (
            "watch_page_resync",
            ok(
                28,
                ResponseBody::Watch(WatchPage {
                    group_id: 7,
                    events: Vec::new(),
                    through_index: 9_000,
                    resync: true,
                    current: Some(view()),
                }),
            ),
        ),
        (
            "get_absent",
            ok(
                7,
                ResponseBody::Get(GetResult {
                    view: None,
                    log_time_ms: 1,
                    stale: false,
                    group_id: 0,
                }),
            ),
        ),
        (
            "fence_checked_current",
            ok(
                13,
                ResponseBody::FenceChecked(FenceCheckResult {
                    verdict: FenceVerdict {
                        current: true,
                        status: LeaseStatus::Active,
                        latest_fencing_token: Some(42),
                        remaining_ttl_ms: 1_500,
                    },
                    log_time_ms: 1_700_000_017_655,
                    group_id: 7,
                }),
            ),
        ),
        (
            "fence_checked_absent",
            ok(
                14,
                ResponseBody::FenceChecked(FenceCheckResult {
                    verdict: FenceVerdict {
                        current: false,
                        status: LeaseStatus::Absent,
                        latest_fencing_token: None,
                        remaining_ttl_ms: 0,
                    },
                    log_time_ms: 1,
                    group_id: 0,
                }),
            ),
        ),
        (
            "list",
            ok(
                8,
                ResponseBody::List(ListPage {
                    leases: vec![view()],
                    next_page_token: Some("next".into()),
                }),
            ),
        ),
        (
            "batch",
            ok(
                9,
                ResponseBody::Batch(vec![
                    Ok(lease(LeaseReply::Acquired(grant(true)), false)),
                    Err(WireError::from_lease_error(LeaseError::NotFound)),
                ]),
            ),
        ),
        (
            "status",
            ok(
                10,
                ResponseBody::Status(NodeStatus {
                    node_id: 1,
                    ready: true,
                    shutting_down: false,
                    placement_version: 1,
                    groups: 3,
                    hosted: vec![GroupStatus {
                        group_id: 0,
                        leader: Some(1),
                        term: 5,
                        is_leader: true,
                        last_log_index: 100,
                        committed_index: 99,
                        applied_index: 98,
                        followers: vec![FollowerProgress {
                            node_id: 2,
                            matched_index: 97,
                        }],
                    }],
                }),
            ),
        ),
        (
            "members_joint",
            ok(
                13,
                ResponseBody::Members(GroupMembers {
                    group_id: 7,
                    seen_by: 1,
                    leader: Some(1),
                    term: 6,
                    voters: vec![1, 2, 3, 4],
                    voter_sets: vec![vec![1, 2, 3], vec![1, 3, 4]],
                    learners: vec![5],
                    membership_log_index: 120,
                    membership_committed: false,
                    last_log_index: 121,
                    followers: vec![FollowerProgress {
                        node_id: 4,
                        matched_index: 121,
                    }],
                }),
            ),
        ),
        (
            "replica_change",
            ok(
                15,
                ResponseBody::Replica(ReplicaChange {
                    group_id: 7,
                    node_id: 4,
                    changed: true,
                }),
            ),
        ),
        ("cluster", ok(16, ResponseBody::Cluster(cluster_meta()))),
        (
            "cluster_changed",
            ok(
                17,
                ResponseBody::ClusterChanged(ClusterChange {
                    version: 5,
                    changed: true,
                }),
            ),
        ),
        (
            "error_unauthorized",
            Response {
                id: 11,
                result: Err(WireError::new(ErrorCode::Unauthorized, "no token")),
            },
        ),
        (
            "error_every_field",
            Response {
                id: 12,
                result: Err(full_error),
            },
        ),
    ]
}

#[test]
fn client_protocol_bytes_are_pinned() {
    let mut golden = golden("client");
    let version = format!("tenure-client/{CLIENT_PROTOCOL_VERSION}");
    golden.bytes("alpn", version.as_bytes());
    if CLIENT_ALPN != version.as_bytes() {
        golden.failure(format!(
            "CLIENT_ALPN {:?} does not name CLIENT_PROTOCOL_VERSION {CLIENT_PROTOCOL_VERSION}",
            String::from_utf8_lossy(CLIENT_ALPN)
        ));
    }
    for (name, request) in requests() {
        let frame = RequestFrame {
            requests: vec![request],
        };
        let bytes = encode_client_frame(&frame).unwrap();
        let committed = golden.bytes(&format!("request_{name}"), &bytes);
        match decode_request_frame(&committed[FRAME_LENGTH_BYTES..]) {
            Ok(decoded) if decoded == frame => {
                if encode_client_frame(&decoded).unwrap() != committed {
                    golden.failure(format!("request_{name}: re-encoding changed the bytes"));
                }
            }
            Ok(decoded) => golden.failure(format!(
                "request_{name}: the committed frame decodes to {decoded:?}"
            )),
            Err(error) => golden.failure(format!("request_{name}: no longer decodes: {error}")),
        }
    }
    for (name, response) in responses() {
        let frame = ResponseFrame {
            responses: vec![response],
        };
        let bytes = encode_client_frame(&frame).unwrap();
        let committed = golden.bytes(&format!("response_{name}"), &bytes);
        match decode_response_frame(&committed[FRAME_LENGTH_BYTES..]) {
            Ok(decoded) if decoded == frame => {
                if encode_client_frame(&decoded).unwrap() != committed {
                    golden.failure(format!("response_{name}: re-encoding changed the bytes"));
                }
            }
            Ok(decoded) => golden.failure(format!(
                "response_{name}: the committed frame decodes to {decoded:?}"
            )),
            Err(error) => golden.failure(format!("response_{name}: no longer decodes: {error}")),
        }
    }
    for (name, error) in every_lease_error() {
        golden.value(&format!("lease_error_{name}"), &error);
    }
    golden.value("error_codes_all", &ErrorCode::ALL.to_vec());
    golden.value(
        "lease_statuses_all",
        &vec![
            LeaseStatus::Active,
            LeaseStatus::Expired,
            LeaseStatus::Released,
            LeaseStatus::Absent,
        ],
    );
    golden.value(
        "replay_statuses_all",
        &vec![
            ReplayStatus::Active,
            ReplayStatus::Expired,
            ReplayStatus::Released,
            ReplayStatus::Superseded,
            ReplayStatus::NotAGrant,
        ],
    );
    finish(golden);
}

#[test]
fn client_alpn_of_another_version_is_refused_with_a_typed_error() {
    assert_eq!(check_client_alpn(CLIENT_ALPN), Ok(CLIENT_PROTOCOL_VERSION));
    let next = format!("tenure-client/{}", CLIENT_PROTOCOL_VERSION + 1);
    assert_eq!(
        check_client_alpn(next.as_bytes()),
        Err(ProtoError::UnsupportedVersion {
            protocol: "client",
            found: CLIENT_PROTOCOL_VERSION + 1,
            supported: CLIENT_PROTOCOL_VERSION,
        })
    );
    assert!(matches!(
        check_client_alpn(b"tenure-peer/1"),
        Err(ProtoError::Payload { .. })
    ));
}

/// Every peer frame kind, and a batch holding one message of every message kind.
fn peer_frames() -> Vec<(&'static str, Frame)> {
    let kinds = [
        MessageKind::AppendRequest,
        MessageKind::AppendResponse,
        MessageKind::StreamAppendRequest,
        MessageKind::StreamAppendResponse,
        MessageKind::StreamClose,
        MessageKind::VoteRequest,
        MessageKind::PreVoteRequest,
        MessageKind::VoteResponse,
        MessageKind::TransferLeaderRequest,
        MessageKind::TransferLeaderResponse,
        MessageKind::Failure,
    ];
    let messages = kinds
        .iter()
        .zip(1u64..)
        .map(|(&kind, n)| BatchMessage {
            group_id: u32::try_from(n).unwrap() * 3,
            kind,
            correlation_id: n * 1_000,
            payload: Bytes::from(format!("payload-{n}")),
        })
        .collect();
    vec![
        (
            "hello",
            Frame::Hello(Hello {
                version: PEER_PROTOCOL_VERSION,
                from_node: 1,
                to_node: 2,
                cluster: "prod-eu".into(),
            }),
        ),
        (
            "hello_reply_accepted",
            Frame::HelloReply(HelloReply {
                accepted: true,
                version: PEER_PROTOCOL_VERSION,
                reason: String::new(),
            }),
        ),
        (
            "hello_reply_refused",
            Frame::HelloReply(HelloReply {
                accepted: false,
                version: PEER_PROTOCOL_VERSION,
                reason: "cluster \"staging\" is not \"prod-eu\"".into(),
            }),
        ),
        ("batch_every_message_kind", Frame::Batch(messages)),
        ("batch_empty", Frame::Batch(Vec::new())),
        (
            "snapshot_offer",
            Frame::SnapshotOffer(encode_payload(&(7u32, "offer".to_string())).unwrap()),
        ),
        (
            "snapshot_reply",
            Frame::SnapshotReply(encode_payload(&Ok::<u64, String>(42)).unwrap()),
        ),
    ]
}

#[test]
fn peer_protocol_bytes_are_pinned() {
    let mut golden = golden("peer");
    golden.bytes("version", &PEER_PROTOCOL_VERSION.to_le_bytes());
    for (name, frame) in peer_frames() {
        let mut out = BytesMut::new();
        encode_frame(&frame, &mut out);
        let committed = golden.bytes(name, &out);
        match decode_frame_body(Bytes::from(committed[FRAME_LENGTH_BYTES..].to_vec())) {
            Ok(decoded) if decoded == frame => {
                let mut again = BytesMut::new();
                encode_frame(&decoded, &mut again);
                if again.as_ref() != committed.as_slice() {
                    golden.failure(format!("{name}: re-encoding changed the bytes"));
                }
            }
            Ok(decoded) => golden.failure(format!(
                "{name}: the committed frame decodes to {decoded:?}"
            )),
            Err(error) => golden.failure(format!("{name}: no longer decodes: {error}")),
        }
    }
    finish(golden);
}

#[test]
fn hello_of_another_version_is_refused_with_a_typed_error() {
    let hello = Hello {
        version: PEER_PROTOCOL_VERSION,
        from_node: 1,
        to_node: 2,
        cluster: "c".into(),
    };
    assert_eq!(hello.check_version(), Ok(()));
    let next = Hello {
        version: PEER_PROTOCOL_VERSION + 1,
        ..hello
    };
    assert_eq!(
        next.check_version(),
        Err(ProtoError::UnsupportedVersion {
            protocol: "peer",
            found: PEER_PROTOCOL_VERSION + 1,
            supported: PEER_PROTOCOL_VERSION,
        })
    );
    // A Hello of a later version still decodes far enough to be refused with a reason.
    let mut out = BytesMut::new();
    encode_frame(&Frame::Hello(next.clone()), &mut out);
    assert_eq!(
        decode_frame_body(out.freeze().slice(FRAME_LENGTH_BYTES..)),
        Ok(Frame::Hello(next))
    );
}
