//! Golden bytes of everything tenure keeps on disk or sends as a Raft payload (issue 19, item 10):
//! every log entry kind as stored (codec header included), the Raft metadata values, a snapshot
//! of a small state in `tenure-core`'s snapshot format, snapshot metadata, and the openraft RPC
//! payloads the peer protocol carries in its batch frames. Each value is encoded and compared
//! byte for byte with its committed file under `tests/golden/`; each committed file is decoded,
//! compared with the value, and re-encoded to the same bytes.
//!
//! Postcard encodes enums by declaration order, so reordering or inserting a variant of
//! `Command`, `LeaseOp`, `LeaseError`, ... (or an openraft upgrade that changes its serde
//! layout) changes these bytes and fails this test. Such a change makes every stored log and
//! every mixed-version cluster unreadable: bump the format version it belongs to
//! (`codec::VALUE_FORMAT_VERSION`, `SNAPSHOT_FORMAT_VERSION`, `PEER_PROTOCOL_VERSION`) and
//! re-bless deliberately:
//!
//! ```text
//! TENURE_BLESS=1 cargo test --workspace --all-features -- golden
//! ```
//!
//! Must not depend on: a running node or a database; this only encodes and decodes.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::path::Path;

use openraft::Membership;
use openraft::alias::{SnapshotMetaOf, StoredMembershipOf, VoteOf};
use openraft::entry::RaftEntry;
use openraft::impls::BasicNode;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, StreamAppendError,
    StreamAppendResult, TransferLeaderRequest, TransferLeaderResponse, VoteRequest, VoteResponse,
};
use openraft::testing::log_id;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tenure_core::{
    AcquireRequest, ClusterOp, Command, CommandResult, Entry, FounderNode, GroupId, GroupLimits,
    LeaseId, LeaseOp, LeaseStateMachine, NodeAddresses, NodeState, ReleaseRequest, RenewRequest,
    ResourceKey, SNAPSHOT_FORMAT_VERSION, SessionAcquireRequest, SessionId, SessionOpenRequest,
    SessionRequest, StateOptions, TenantPolicy, TransferRequest, WaitAcquireRequest,
    WaitCancelRequest, WaitLease,
};
use tenure_golden::Golden;
use tenure_storage::{LogEntry, TenureRaft, codec};

/// The golden files of `subdir` under this crate's `tests/golden/`.
fn golden(subdir: &str) -> Golden {
    Golden::new(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/golden")
            .join(subdir),
    )
}

/// Fails on any mismatch of a storage or Raft payload format.
fn finish(golden: Golden) {
    golden.finish(
        "a storage or Raft payload format",
        "bump its format version",
    );
}

/// The two kinds of value this file pins.
trait StorageGolden {
    /// A value stored through the codec (checksum and format version in front).
    fn stored<T: Serialize + DeserializeOwned + PartialEq + Debug>(
        &mut self,
        name: &str,
        value: &T,
    );
    /// A bare postcard value (a Raft RPC payload of the peer protocol; openraft's types are
    /// compared by their `Debug` text, not all of them are `PartialEq`).
    fn payload<T: Serialize + DeserializeOwned + Debug>(&mut self, name: &str, value: &T);
}

impl StorageGolden for Golden {
    fn stored<T: Serialize + DeserializeOwned + PartialEq + Debug>(
        &mut self,
        name: &str,
        value: &T,
    ) {
        let bytes = codec::encode(value).unwrap();
        let committed = self.bytes(name, &bytes);
        self.decodes_back(
            name,
            value,
            &committed,
            |bytes| codec::decode::<T>(bytes),
            |value| codec::encode(value).map_err(|error| error.to_string()),
            PartialEq::eq,
        );
    }

    fn payload<T: Serialize + DeserializeOwned + Debug>(&mut self, name: &str, value: &T) {
        self.postcard(name, value, |a, b| format!("{a:?}") == format!("{b:?}"));
    }
}

// ---------------------------------------------------------------------------------------------
// Fixtures

fn key(resource: &str) -> ResourceKey {
    ResourceKey::new("acme", resource)
}

fn lease_id(sequence: u64) -> LeaseId {
    LeaseId {
        group_id: GroupId(7),
        sequence,
    }
}

fn acquire(resource: &str, request: &str) -> LeaseOp {
    LeaseOp::Acquire(AcquireRequest {
        key: key(resource),
        holder_id: "worker-1".into(),
        ttl_ms: 30_000,
        request_id: request.into(),
    })
}

fn renew(resource: &str, sequence: u64, request: &str) -> LeaseOp {
    LeaseOp::Renew(RenewRequest {
        key: key(resource),
        lease_id: lease_id(sequence),
        holder_id: "worker-1".into(),
        ttl_ms: 60_000,
        request_id: request.into(),
    })
}

fn release(resource: &str, sequence: u64, request: &str) -> LeaseOp {
    LeaseOp::Release(ReleaseRequest {
        key: key(resource),
        lease_id: lease_id(sequence),
        holder_id: "worker-1".into(),
        request_id: request.into(),
    })
}

fn transfer(resource: &str, sequence: u64, request: &str) -> LeaseOp {
    LeaseOp::Transfer(TransferRequest {
        key: key(resource),
        lease_id: lease_id(sequence),
        holder_id: "worker-1".into(),
        new_holder_id: "worker-2".into(),
        ttl_ms: 45_000,
        request_id: request.into(),
    })
}

/// Every command kind, as the state machine sees it.
fn commands() -> Vec<(&'static str, Command)> {
    vec![
        ("lease_acquire", Command::Lease(acquire("db", "req-1"))),
        ("lease_renew", Command::Lease(renew("db", 1, "req-2"))),
        ("lease_release", Command::Lease(release("db", 1, "req-3"))),
        (
            "batch",
            Command::Batch(vec![
                acquire("a", "req-4"),
                renew("a", 2, "req-5"),
                release("a", 2, "req-6"),
            ]),
        ),
        ("expire", Command::Expire { leases_max: 1_024 }),
        (
            "set_tenant_policy",
            Command::SetTenantPolicy {
                tenant_id: "acme".into(),
                policy: TenantPolicy {
                    active_leases_max: Some(100),
                    ttl_ms_min: Some(5_000),
                    ttl_ms_max: None,
                },
            },
        ),
        (
            "set_group_limits",
            Command::SetGroupLimits(GroupLimits::default()),
        ),
        // Added with LeaseOp::Transfer (value format 2), last so that every earlier entry keeps
        // its log id and payload bytes.
        ("lease_transfer", Command::Lease(transfer("db", 1, "req-7"))),
        // Added with the cluster node table (snapshot format 4, client protocol 5), last again.
        (
            "cluster_node_up",
            Command::Cluster(ClusterOp::NodeUp {
                node: node_addresses(4),
                cert_sha256: [0xab; 32],
                incarnation: 1_764_000_000_000,
            }),
        ),
        // Added with the founders' pinned incarnations (value format 3, peer protocol 4), last.
        (
            "cluster_record_founders",
            Command::Cluster(ClusterOp::RecordFounders {
                nodes: (1..=3)
                    .map(|node_id| FounderNode {
                        node: node_addresses(node_id),
                        incarnation: if node_id == 2 {
                            0
                        } else {
                            1_764_000_000_000 + node_id
                        },
                    })
                    .collect(),
            }),
        ),
        // Added with sessions (value format 4, peer protocol 5, snapshot format 5), last again.
        (
            "lease_session_open",
            Command::Lease(LeaseOp::SessionOpen(SessionOpenRequest {
                tenant_id: "acme".into(),
                group_id: GroupId(7),
                session_id: SessionId(0x5e55),
                owner_id: "worker-1".into(),
                ttl_ms: 30_000,
            })),
        ),
        (
            "lease_session_keepalive",
            Command::Lease(LeaseOp::SessionKeepAlive(session_request())),
        ),
        (
            "lease_session_close",
            Command::Lease(LeaseOp::SessionClose(session_request())),
        ),
        (
            "lease_acquire_in_session",
            Command::Lease(acquire_in_session("job", "req-8")),
        ),
        // Added with wait queues (value format 5, peer protocol 6, snapshot format 6), last.
        (
            "lease_acquire_wait",
            Command::Lease(acquire_wait(
                "db",
                WaitLease::Ttl { ttl_ms: 30_000 },
                "req-9",
            )),
        ),
        (
            "lease_acquire_wait_in_session",
            Command::Lease(acquire_wait(
                "db",
                WaitLease::Session {
                    session_id: SessionId(0x5e55),
                },
                "req-10",
            )),
        ),
        (
            "lease_wait_cancel",
            Command::Lease(LeaseOp::WaitCancel(WaitCancelRequest {
                key: key("db"),
                holder_id: "worker-2".into(),
                request_id: "req-9".into(),
            })),
        ),
    ]
}

fn acquire_wait(resource: &str, lease: WaitLease, request: &str) -> LeaseOp {
    LeaseOp::AcquireWait(WaitAcquireRequest {
        key: key(resource),
        holder_id: "worker-2".into(),
        lease,
        wait_ms: 60_000,
        request_id: request.into(),
    })
}

fn session_request() -> SessionRequest {
    SessionRequest {
        tenant_id: "acme".into(),
        group_id: GroupId(7),
        session_id: SessionId(0x5e55),
        owner_id: "worker-1".into(),
    }
}

fn acquire_in_session(resource: &str, request: &str) -> LeaseOp {
    LeaseOp::AcquireInSession(SessionAcquireRequest {
        key: key(resource),
        holder_id: "worker-1".into(),
        session_id: SessionId(0x5e55),
        request_id: request.into(),
    })
}

fn node_addresses(node_id: u64) -> NodeAddresses {
    NodeAddresses {
        node_id,
        addr: format!("127.0.0.1:740{node_id}"),
        http_addr: format!("127.0.0.1:750{node_id}"),
    }
}

/// The metadata group's state: the table recorded with nodes 1-3, node 4 added and reported,
/// node 3 reported, drained and removed (its certificate revoked), preferred leaders set.
fn metadata_group_state() -> LeaseStateMachine {
    let mut machine = LeaseStateMachine::new(GroupId(0), StateOptions::default());
    let steps = [
        Command::SetGroupLimits(GroupLimits::default()),
        Command::Cluster(ClusterOp::Record {
            nodes: (1..=3).map(node_addresses).collect(),
        }),
        Command::Cluster(ClusterOp::AddNode(node_addresses(4))),
        Command::Cluster(ClusterOp::NodeUp {
            node: node_addresses(4),
            cert_sha256: [4; 32],
            incarnation: 1_764_000_000_004,
        }),
        Command::Cluster(ClusterOp::NodeUp {
            node: node_addresses(3),
            cert_sha256: [3; 32],
            incarnation: 1_764_000_000_003,
        }),
        Command::Cluster(ClusterOp::SetState {
            node_id: 3,
            state: NodeState::Draining,
        }),
        Command::Cluster(ClusterOp::Remove { node_id: 3 }),
        Command::Cluster(ClusterOp::SetLeaderPreferences {
            preferences: vec![(0, 1), (1, 4), (2, 2)],
        }),
        Command::Lease(acquire("db", "req-1")),
    ];
    for (step, command) in steps.into_iter().enumerate() {
        let log_time_ms = 1_764_000_000_000 + 1_000 * u64::try_from(step).unwrap();
        let output = machine.apply(&Entry {
            log_time_ms,
            command,
        });
        if let CommandResult::Cluster(result) = &output.result {
            assert!(result.is_ok(), "step {step}: {result:?}");
        }
    }
    assert_eq!(machine.cluster().version, 7);
    machine
}

fn membership() -> Membership<u64, BasicNode> {
    let voters: BTreeSet<u64> = [1, 2, 3].into();
    let nodes: BTreeMap<u64, BasicNode> = [1, 2, 3, 4]
        .into_iter()
        .map(|id| (id, BasicNode::new(format!("10.0.0.{id}:7401"))))
        .collect();
    Membership::new(vec![voters], nodes).unwrap()
}

/// Every log entry kind, with the stored log ids of a real log (term 3, leader 2).
fn log_entries() -> Vec<(String, LogEntry)> {
    let mut entries = vec![
        (
            "log_blank".to_owned(),
            LogEntry::new_blank(log_id::<TenureRaft>(3, 2, 1)),
        ),
        (
            "log_membership".to_owned(),
            LogEntry::new_membership(log_id::<TenureRaft>(3, 2, 2), membership()),
        ),
    ];
    for (index, (name, command)) in (3u64..).zip(commands()) {
        entries.push((
            format!("log_{name}"),
            LogEntry::new_normal(
                log_id::<TenureRaft>(3, 2, index),
                Entry {
                    log_time_ms: 1_700_000_000_000 + index,
                    command,
                },
            ),
        ));
    }
    entries
}

/// Snapshot metadata, as the snapshot pointer and the snapshot offer carry it.
fn snapshot_meta() -> SnapshotMetaOf<TenureRaft> {
    SnapshotMetaOf::<TenureRaft> {
        last_log_id: Some(log_id::<TenureRaft>(3, 2, 9)),
        last_membership: StoredMembershipOf::<TenureRaft>::new(
            Some(log_id::<TenureRaft>(3, 2, 2)),
            membership(),
        ),
    }
}

fn vote() -> VoteOf<TenureRaft> {
    openraft::Vote::new(3, 2)
}

#[test]
fn log_entries_and_raft_metadata_bytes_are_pinned() {
    let mut golden = golden("log");
    golden.bytes("value_format_version", &[codec::VALUE_FORMAT_VERSION]);
    for (name, entry) in log_entries() {
        golden.stored(&name, &entry);
    }
    // The meta column family: vote, committed and last purged log ids.
    golden.stored("meta_vote", &vote());
    let mut committed_vote = vote();
    #[allow(deprecated)] // `to_committed` makes another type; the store keeps this one.
    committed_vote.commit();
    golden.stored("meta_vote_committed", &committed_vote);
    golden.stored("meta_log_id", &Some(log_id::<TenureRaft>(3, 2, 9)));
    golden.stored(
        "meta_log_id_none",
        &None::<openraft::alias::LogIdOf<TenureRaft>>,
    );
    // The node's replica record (meta column family, node-wide key prefix).
    golden.stored(
        "meta_node_replicas",
        &tenure_storage::ReplicaRecord {
            groups: vec![0, 3, 4095],
        },
    );
    // Snapshot metadata, as the snapshot pointer and the snapshot offer carry it.
    golden.payload("snapshot_meta", &snapshot_meta());
    // A log entry written by value format 1 (before Transfer) is still read, to the same entry.
    let legacy = golden.legacy("legacy_v1_log_batch");
    assert_eq!(codec::value_format_version(&legacy), Ok(1));
    let batch = log_entries()
        .into_iter()
        .find(|(name, _)| name == "log_batch")
        .map(|(_, entry)| entry)
        .unwrap();
    assert_eq!(codec::decode::<LogEntry>(&legacy).unwrap(), batch);
    // And one written by value format 2 (before RecordFounders).
    let legacy = golden.legacy("legacy_v2_log_batch");
    assert_eq!(codec::value_format_version(&legacy), Ok(2));
    assert_eq!(codec::decode::<LogEntry>(&legacy).unwrap(), batch);
    // And one written by value format 3 (before sessions).
    let legacy = golden.legacy("legacy_v3_log_batch");
    assert_eq!(codec::value_format_version(&legacy), Ok(3));
    assert_eq!(codec::decode::<LogEntry>(&legacy).unwrap(), batch);
    // And one written by value format 4 (before wait queues).
    let legacy = golden.legacy("legacy_v4_log_batch");
    assert_eq!(codec::value_format_version(&legacy), Ok(4));
    assert_eq!(codec::decode::<LogEntry>(&legacy).unwrap(), batch);
    finish(golden);
}

#[test]
fn raft_rpc_payloads_are_pinned() {
    let mut golden = golden("rpc");
    let entries: Vec<LogEntry> = log_entries()
        .into_iter()
        .map(|(_, entry)| entry)
        .take(4)
        .collect();
    golden.payload(
        "rpc_append_entries_request",
        &AppendEntriesRequest::<TenureRaft> {
            vote: vote(),
            prev_log_id: Some(log_id::<TenureRaft>(3, 2, 0)),
            entries,
            leader_commit: Some(log_id::<TenureRaft>(3, 2, 1)),
        },
    );
    golden.payload(
        "rpc_append_entries_heartbeat",
        &AppendEntriesRequest::<TenureRaft> {
            vote: vote(),
            prev_log_id: None,
            entries: Vec::new(),
            leader_commit: None,
        },
    );
    let replies: Vec<(&str, Result<AppendEntriesResponse<TenureRaft>, String>)> = vec![
        (
            "rpc_append_entries_success",
            Ok(AppendEntriesResponse::Success),
        ),
        (
            "rpc_append_entries_partial",
            Ok(AppendEntriesResponse::PartialSuccess(Some(log_id::<
                TenureRaft,
            >(
                3, 2, 4
            )))),
        ),
        (
            "rpc_append_entries_conflict",
            Ok(AppendEntriesResponse::Conflict),
        ),
        (
            "rpc_append_entries_higher_vote",
            Ok(AppendEntriesResponse::HigherVote(openraft::Vote::new(4, 1))),
        ),
        (
            "rpc_append_entries_failure",
            Err("group stopped".to_owned()),
        ),
    ];
    for (name, reply) in replies {
        golden.payload(name, &reply);
    }
    golden.payload(
        "rpc_vote_request",
        &VoteRequest::<TenureRaft> {
            vote: vote(),
            last_log_id: Some(log_id::<TenureRaft>(3, 2, 9)),
            leadership_transfer: false,
        },
    );
    golden.payload(
        "rpc_vote_response",
        &Ok::<_, String>(VoteResponse::<TenureRaft> {
            vote: vote(),
            vote_granted: true,
            last_log_id: Some(log_id::<TenureRaft>(3, 2, 9)),
        }),
    );
    // Pipelined replication: `StreamAppendRequest` carries (stream id, request), its answer one
    // in-order result, `StreamClose` the stream id (the payload aliases of tenure-transport's
    // `inbound` module, whose unit test reads these files).
    golden.payload(
        "rpc_stream_append_request",
        &(
            11u64,
            AppendEntriesRequest::<TenureRaft> {
                vote: vote(),
                prev_log_id: Some(log_id::<TenureRaft>(3, 2, 4)),
                entries: log_entries()
                    .into_iter()
                    .map(|(_, entry)| entry)
                    .take(2)
                    .collect(),
                leader_commit: Some(log_id::<TenureRaft>(3, 2, 3)),
            },
        ),
    );
    let stream_replies: Vec<(&str, Result<StreamAppendResult<TenureRaft>, String>)> = vec![
        (
            "rpc_stream_append_matched",
            Ok(Ok(Some(log_id::<TenureRaft>(3, 2, 6)))),
        ),
        ("rpc_stream_append_matched_none", Ok(Ok(None))),
        (
            "rpc_stream_append_conflict",
            Ok(Err(StreamAppendError::Conflict(log_id::<TenureRaft>(
                3, 2, 4,
            )))),
        ),
        (
            "rpc_stream_append_higher_vote",
            Ok(Err(StreamAppendError::HigherVote(openraft::Vote::new(
                4, 1,
            )))),
        ),
        ("rpc_stream_append_failure", Err("group stopped".to_owned())),
    ];
    for (name, reply) in stream_replies {
        golden.payload(name, &reply);
    }
    golden.payload("rpc_stream_close", &11u64);
    // Leader transfer.
    golden.payload(
        "rpc_transfer_leader_request",
        &TransferLeaderRequest::<TenureRaft>::new(vote(), 3, Some(log_id::<TenureRaft>(3, 2, 9))),
    );
    let transfer_replies: Vec<(&str, Result<TransferLeaderResponse<TenureRaft>, String>)> = vec![
        ("rpc_transfer_leader_accepted", Ok(Ok(()))),
        (
            "rpc_transfer_leader_vote_changed",
            Ok(Err(openraft::raft::TransferLeaderError::VoteChanged {
                expected: vote(),
                actual: openraft::Vote::new(4, 1),
            })),
        ),
        (
            "rpc_transfer_leader_log_not_flushed",
            Ok(Err(openraft::raft::TransferLeaderError::LogNotFlushed {
                expected: Some(log_id::<TenureRaft>(3, 2, 9)),
                actual: Some(log_id::<TenureRaft>(3, 2, 7)),
            })),
        ),
    ];
    for (name, reply) in transfer_replies {
        golden.payload(name, &reply);
    }
    // Snapshot transfer: the offer header (group, the sender's vote, the snapshot's metadata,
    // the file's size in bytes; tenure-transport's `SnapshotOffer` struct has these fields in
    // this order and its unit test checks it reads this file), and the answer.
    golden.payload(
        "rpc_snapshot_offer",
        &(7u32, vote(), snapshot_meta(), 4_096u64),
    );
    golden.payload(
        "rpc_snapshot_reply",
        &Ok::<_, String>(SnapshotResponse::<TenureRaft>::new(vote())),
    );
    golden.payload(
        "rpc_snapshot_reply_refused",
        &Err::<SnapshotResponse<TenureRaft>, String>("snapshot of 9 MiB exceeds 8 MiB".to_owned()),
    );
    // A `Failure` message's payload: the reason.
    golden.payload("rpc_failure", &"unknown group 9".to_owned());
    finish(golden);
}

/// A small state: two tenants, an active, a renewed and a released lease, an expired one, and
/// their request ids in the deduplication ring.
fn small_state() -> LeaseStateMachine {
    let mut machine = LeaseStateMachine::new(GroupId(7), StateOptions::default());
    let steps = [
        Command::SetGroupLimits(GroupLimits::default()),
        Command::Lease(acquire("db", "req-1")),
        Command::Lease(acquire("cache", "req-2")),
        Command::Lease(LeaseOp::Acquire(AcquireRequest {
            key: ResourceKey::new("globex", "queue"),
            holder_id: "worker-9".into(),
            ttl_ms: 5_000,
            request_id: "req-3".into(),
        })),
        Command::Lease(renew("db", 1, "req-4")),
        Command::Lease(release("cache", 2, "req-5")),
    ];
    for (step, command) in steps.into_iter().enumerate() {
        let log_time_ms = 1_700_000_000_000 + 1_000 * u64::try_from(step).unwrap();
        machine.apply(&Entry {
            log_time_ms,
            command,
        });
    }
    // Past globex/queue's expiry: reclaimed.
    machine.apply(&Entry {
        log_time_ms: 1_700_000_020_000,
        command: Command::Expire { leases_max: 16 },
    });
    machine
}

/// [`small_state`] and then a transfer of `db` to `worker-2`: the snapshot holds the new
/// holder's record and the transfer's request-id record (its `Transferred` outcome).
fn state_after_transfer() -> LeaseStateMachine {
    let mut machine = small_state();
    machine.apply(&Entry {
        log_time_ms: 1_700_000_022_000,
        command: Command::Lease(transfer("db", 1, "req-7")),
    });
    machine
}

/// [`small_state`] and then sessions: one open with two bound leases, one closed with a bound
/// lease not yet reclaimed, and one closed and emptied (kept for retention).
fn state_with_sessions() -> LeaseStateMachine {
    let mut machine = small_state();
    let open = |session: u128| {
        Command::Lease(LeaseOp::SessionOpen(SessionOpenRequest {
            tenant_id: "acme".into(),
            group_id: GroupId(7),
            session_id: SessionId(session),
            owner_id: "worker-1".into(),
            ttl_ms: 30_000,
        }))
    };
    let close = |session: u128| {
        Command::Lease(LeaseOp::SessionClose(SessionRequest {
            session_id: SessionId(session),
            ..session_request()
        }))
    };
    let bound = |resource: &str, session: u128, request: &str| {
        Command::Lease(LeaseOp::AcquireInSession(SessionAcquireRequest {
            key: key(resource),
            holder_id: "worker-1".into(),
            session_id: SessionId(session),
            request_id: request.into(),
        }))
    };
    let steps = [
        open(0x5e55),
        open(0x5e56),
        open(0x5e57),
        bound("job-1", 0x5e55, "req-s1"),
        bound("job-2", 0x5e55, "req-s2"),
        bound("job-3", 0x5e56, "req-s3"),
        bound("job-4", 0x5e56, "req-s4"),
        close(0x5e56),
        Command::Expire { leases_max: 1 },
        close(0x5e57),
        Command::Lease(LeaseOp::SessionKeepAlive(session_request())),
    ];
    for (step, command) in steps.into_iter().enumerate() {
        let log_time_ms = 1_700_000_030_000 + 100 * u64::try_from(step).unwrap();
        machine.apply(&Entry {
            log_time_ms,
            command,
        });
    }
    machine
}

/// [`state_with_sessions`] and then waiters: two on a held resource (one with a ttl of its own,
/// one in a session), one whose wait ended (timed out: its end is a request-id record).
fn state_with_waiters() -> LeaseStateMachine {
    let mut machine = state_with_sessions();
    let wait = |holder: &str, lease: WaitLease, wait_ms: u64, request: &str| {
        Command::Lease(LeaseOp::AcquireWait(WaitAcquireRequest {
            key: key("job-1"),
            holder_id: holder.into(),
            lease,
            wait_ms,
            request_id: request.into(),
        }))
    };
    let open_other = Command::Lease(LeaseOp::SessionOpen(SessionOpenRequest {
        tenant_id: "acme".into(),
        group_id: GroupId(7),
        session_id: SessionId(0x5e58),
        owner_id: "worker-3".into(),
        ttl_ms: 30_000,
    }));
    let steps = [
        open_other,
        wait(
            "worker-2",
            WaitLease::Ttl { ttl_ms: 20_000 },
            60_000,
            "req-w1",
        ),
        wait(
            "worker-3",
            WaitLease::Session {
                session_id: SessionId(0x5e58),
            },
            60_000,
            "req-w2",
        ),
        wait("worker-4", WaitLease::Ttl { ttl_ms: 20_000 }, 50, "req-w3"),
        Command::Expire { leases_max: 8 },
    ];
    for (step, command) in steps.into_iter().enumerate() {
        let log_time_ms = 1_700_000_040_000 + 100 * u64::try_from(step).unwrap();
        let out = machine.apply(&Entry {
            log_time_ms,
            command,
        });
        if step == 4 {
            assert_eq!(out.waits_ended.len(), 1, "the short wait ended");
        }
    }
    machine
}

#[test]
fn snapshot_bytes_are_pinned() {
    let mut golden = golden("snapshot");
    golden.bytes(
        "snapshot_format_version",
        &SNAPSHOT_FORMAT_VERSION.to_le_bytes(),
    );
    let machine = small_state();
    let bytes = machine.snapshot_to_vec();
    let committed = golden.bytes("snapshot_small_state", &bytes);
    match LeaseStateMachine::read_snapshot(committed.as_slice(), StateOptions::default()) {
        Ok(restored) => {
            if restored.snapshot_to_vec() != committed {
                golden.failure(
                    "snapshot_small_state: restoring and snapshotting again changed the bytes"
                        .to_owned(),
                );
            }
        }
        Err(error) => golden.failure(format!(
            "snapshot_small_state: the committed snapshot no longer reads: {error}"
        )),
    }
    // A snapshot written by format 2 (before Transfer) is still read, to the same state.
    let legacy = golden.legacy("legacy_v2_snapshot_small_state");
    match LeaseStateMachine::read_snapshot(legacy.as_slice(), StateOptions::default()) {
        Ok(restored) => assert_eq!(
            restored.snapshot_to_vec(),
            machine.snapshot_to_vec(),
            "the format-2 snapshot restores the same state"
        ),
        Err(error) => golden.failure(format!(
            "legacy_v2_snapshot_small_state: a format-2 snapshot no longer reads: {error}"
        )),
    }
    // A snapshot written by format 3 (before the node table) is read with an empty table.
    let legacy = golden.legacy("legacy_v3_snapshot_small_state");
    match LeaseStateMachine::read_snapshot(legacy.as_slice(), StateOptions::default()) {
        Ok(restored) => assert_eq!(
            restored.snapshot_to_vec(),
            machine.snapshot_to_vec(),
            "the format-3 snapshot restores the same state"
        ),
        Err(error) => golden.failure(format!(
            "legacy_v3_snapshot_small_state: a format-3 snapshot no longer reads: {error}"
        )),
    }
    // A snapshot written by format 4 (before sessions) is read with no sessions.
    let legacy = golden.legacy("legacy_v4_snapshot_small_state");
    match LeaseStateMachine::read_snapshot(legacy.as_slice(), StateOptions::default()) {
        Ok(restored) => assert_eq!(
            restored.snapshot_to_vec(),
            machine.snapshot_to_vec(),
            "the format-4 snapshot restores the same state"
        ),
        Err(error) => golden.failure(format!(
            "legacy_v4_snapshot_small_state: a format-4 snapshot no longer reads: {error}"
        )),
    }
    // A snapshot written by format 5 (before wait queues) is read with no waiters.
    let legacy = golden.legacy("legacy_v5_snapshot_small_state");
    match LeaseStateMachine::read_snapshot(legacy.as_slice(), StateOptions::default()) {
        Ok(restored) => assert_eq!(
            restored.snapshot_to_vec(),
            machine.snapshot_to_vec(),
            "the format-5 snapshot restores the same state"
        ),
        Err(error) => golden.failure(format!(
            "legacy_v5_snapshot_small_state: a format-5 snapshot no longer reads: {error}"
        )),
    }
    let with_waiters = state_with_waiters();
    let committed = golden.bytes("snapshot_with_waiters", &with_waiters.snapshot_to_vec());
    match LeaseStateMachine::read_snapshot(committed.as_slice(), StateOptions::default()) {
        Ok(restored) if restored.snapshot_to_vec() == committed => {}
        Ok(_) => golden.failure(
            "snapshot_with_waiters: restoring and snapshotting again changed the bytes".to_owned(),
        ),
        Err(error) => golden.failure(format!(
            "snapshot_with_waiters: the committed snapshot no longer reads: {error}"
        )),
    }
    let with_sessions = state_with_sessions();
    assert_eq!(
        with_sessions.stats().active_leases,
        4,
        "the fixture's session-bound leases must have applied"
    );
    let committed = golden.bytes("snapshot_with_sessions", &with_sessions.snapshot_to_vec());
    match LeaseStateMachine::read_snapshot(committed.as_slice(), StateOptions::default()) {
        Ok(restored) if restored.snapshot_to_vec() == committed => {}
        Ok(_) => golden.failure(
            "snapshot_with_sessions: restoring and snapshotting again changed the bytes".to_owned(),
        ),
        Err(error) => golden.failure(format!(
            "snapshot_with_sessions: the committed snapshot no longer reads: {error}"
        )),
    }
    let metadata = metadata_group_state();
    let committed = golden.bytes("snapshot_metadata_group", &metadata.snapshot_to_vec());
    match LeaseStateMachine::read_snapshot(committed.as_slice(), StateOptions::default()) {
        Ok(restored) if restored.snapshot_to_vec() == committed => {
            assert_eq!(restored.cluster(), metadata.cluster());
        }
        Ok(_) => golden.failure(
            "snapshot_metadata_group: restoring and snapshotting again changed the bytes"
                .to_owned(),
        ),
        Err(error) => golden.failure(format!(
            "snapshot_metadata_group: the committed snapshot no longer reads: {error}"
        )),
    }
    let after_transfer = state_after_transfer();
    let stats = after_transfer.stats();
    assert_eq!(
        (stats.active_leases, stats.next_fencing_token),
        (1, 5),
        "the fixture's transfer must have applied (db's lease 1 handed over as token 4)"
    );
    let committed = golden.bytes("snapshot_after_transfer", &after_transfer.snapshot_to_vec());
    match LeaseStateMachine::read_snapshot(committed.as_slice(), StateOptions::default()) {
        Ok(restored) if restored.snapshot_to_vec() == committed => {}
        Ok(_) => golden.failure(
            "snapshot_after_transfer: restoring and snapshotting again changed the bytes"
                .to_owned(),
        ),
        Err(error) => golden.failure(format!(
            "snapshot_after_transfer: the committed snapshot no longer reads: {error}"
        )),
    }
    finish(golden);
}
