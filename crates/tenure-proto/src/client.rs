//! The native client protocol: how clients (and nodes forwarding for them) talk to a node.
//!
//! Connections use QUIC with ALPN [`CLIENT_ALPN`] on the node's single endpoint (the same UDP
//! port as the peer protocol). The server presents its node certificate (name
//! `node-N.tenure.internal`, signed by the cluster CA); clients verify it against the cluster CA.
//! A client certificate is optional: a node certificate of the cluster marks a forwarding node,
//! which may act for the principal it names in [`Request::principal`].
//!
//! A client opens any number of bidirectional streams. On each it writes request frames and reads
//! response frames; responses come back in completion order, matched to requests by
//! [`Request::id`] (unique per stream while outstanding). Each frame is:
//!
//! ```text
//! frame = body_len:u32 (little endian, 1..=CLIENT_FRAME_BYTES_MAX) body
//! body  = postcard(RequestFrame)   client -> node
//!       | postcard(ResponseFrame)  node -> client
//! ```
//!
//! Bodies are [postcard](https://postcard.jamesmunns.com/wire-format) encodings of the types
//! below (and of the `tenure-core` types they embed), field by field in declaration order:
//! integers are varints (zigzag for signed), strings and vectors are a varint length followed by
//! the bytes or items, `Option` is a 0/1 byte then the value, an enum is a varint variant index
//! (declaration order, from 0) then the variant's fields. A client in another language needs
//! only those rules and the type definitions here and in `tenure-core::command`.
//!
//! A connection starts unauthenticated. When the node requires authentication, the first request
//! on it must be [`RequestBody::Authenticate`] with a bearer token; the token binds the connection
//! to a tenant. Every request then acts for that tenant only (`FORBIDDEN` otherwise).
//!
//! Bad input: a frame longer than the maximum, or a body that does not decode, closes the stream
//! with the reason (the connection stays usable); a request that decodes but is invalid gets an
//! error response with code `INVALID_ARGUMENT`.
//!
//! Must not depend on: tokio, quinn or any I/O; this module only turns values into bytes and back.

use serde::{Deserialize, Serialize};
use tenure_core::{
    ClusterChange, ClusterError, ClusterMeta, ClusterOp, ErrorCode, FenceVerdict, LeaseError,
    LeaseOp, LeaseReply, LeaseView, ListPage, ListRequest, ReplayState, ResourceKey, WatchEvent,
    WatchSelector,
};

use crate::peer::ProtoError;

/// ALPN protocol identifier of the native client protocol: `tenure-client/` and
/// [`CLIENT_PROTOCOL_VERSION`] (the version is negotiated by the TLS handshake, so a client and a
/// node of different versions fail to connect instead of misreading each other's frames).
pub const CLIENT_ALPN: &[u8] = b"tenure-client/8";

/// ALPN prefix every version of the client protocol shares.
pub const CLIENT_ALPN_PREFIX: &[u8] = b"tenure-client/";

/// Version of this protocol; bumped on any incompatible change of the types below (and of the
/// `tenure-core` types they embed). The golden files in `tests/golden/client/` pin its bytes.
///
/// - 1: the first version.
/// - 2: [`RequestFlags::principal_claimed`] (a forwarded principal that was not authenticated).
/// - 3: one [`RequestBody::Lease`] carrying any [`LeaseOp`] replaces the `Acquire`, `Renew` and
///   `Release` variants (the operation set is defined once, in `tenure-core`); `Transfer` and
///   its reply `Transferred` are new.
/// - 4: membership requests appended: [`RequestBody::GroupMembers`], [`RequestBody::MoveReplica`]
///   (operators), [`RequestBody::CreateReplica`] and [`RequestBody::DropReplica`] (nodes only),
///   with the answers [`ResponseBody::Members`] and [`ResponseBody::Replica`].
/// - 5: the cluster's node table: [`RequestBody::ClusterNodes`] and [`RequestBody::ClusterChange`]
///   appended, answered by [`ResponseBody::Cluster`] and [`ResponseBody::ClusterChanged`];
///   [`RoutingTable::nodes_version`] (the node list's version) appended.
/// - 6: the fence check: [`RequestBody::CheckFence`] appended, answered by
///   [`ResponseBody::FenceChecked`].
/// - 7: sessions: [`LeaseOp`] gains `SessionOpen`, `SessionKeepAlive`, `SessionClose` and
///   `AcquireInSession` (the first three name a group instead of a key), `LeaseReply` gains
///   `SessionKept` and `SessionClosed`, the state machine's errors `SessionNotFound` and
///   `SessionExpired`, and `LeaseView` ends with the lease's `session_id`.
/// - 8: wait queues: [`LeaseOp`] gains `AcquireWait` and `WaitCancel`, `LeaseReply` gains
///   `Queued` and `WaitCancelled`, the state machine's error `WaitEnded`, and `QuotaKind` the
///   waiter quotas; watches: [`RequestBody::Watch`] appended, answered by
///   [`ResponseBody::Watch`].
pub const CLIENT_PROTOCOL_VERSION: u16 = 8;

/// The client protocol version an ALPN identifier names: `Ok` only for this build's
/// [`CLIENT_PROTOCOL_VERSION`]; another version is [`ProtoError::UnsupportedVersion`], an
/// identifier of another protocol [`ProtoError::Payload`].
pub fn check_client_alpn(alpn: &[u8]) -> Result<u16, ProtoError> {
    let unknown = || ProtoError::Payload {
        what: "client ALPN",
        reason: format!(
            "{:?} is not a tenure client protocol",
            String::from_utf8_lossy(alpn)
        ),
    };
    let version = alpn
        .strip_prefix(CLIENT_ALPN_PREFIX)
        .and_then(|rest| std::str::from_utf8(rest).ok())
        .and_then(|rest| rest.parse::<u16>().ok())
        .ok_or_else(unknown)?;
    if version == CLIENT_PROTOCOL_VERSION {
        Ok(version)
    } else {
        Err(ProtoError::UnsupportedVersion {
            protocol: "client",
            found: version,
            supported: CLIENT_PROTOCOL_VERSION,
        })
    }
}

/// Most events in one answer to [`RequestBody::Watch`] (an answer ends at an entry's end, so
/// one entry's events are never split: a larger entry, such as an Expire that reclaimed many
/// leases, is answered alone and whole).
pub const WATCH_EVENTS_PER_ANSWER_MAX: u32 = 256;

/// Longest a node holds a [`RequestBody::Watch`] open while no selected event arrives, in
/// milliseconds (the request's own timeout bounds it further).
pub const WATCH_WAIT_MS_MAX: u32 = 30_000;

/// Largest frame body accepted in either direction (4 MiB).
pub const CLIENT_FRAME_BYTES_MAX: usize = 4 << 20;

/// Most requests one [`RequestFrame`] may carry.
pub const REQUESTS_PER_FRAME_MAX: usize = 4_096;

/// Most operations one [`RequestBody::Batch`] may carry: a batch is proposed as one log entry, so
/// this is the state machine's default entry bound ([`tenure_core::BATCH_ITEMS_MAX_DEFAULT`]; a
/// node checks it against its groups' actual `batch_items_max` when it starts).
pub const BATCH_OPS_MAX: usize = tenure_core::BATCH_ITEMS_MAX_DEFAULT as usize;

/// Longest bearer token accepted, in bytes.
pub const TOKEN_BYTES_MAX: usize = 4_096;

/// Requests sent together.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestFrame {
    /// The requests, each answered separately.
    pub requests: Vec<Request>,
}

/// Responses sent together.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResponseFrame {
    /// The responses, in completion order.
    pub responses: Vec<Response>,
}

/// One request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// Chosen by the client; echoed in the response.
    pub id: u64,
    /// How long the client will wait, in milliseconds; 0 means the node's default.
    pub timeout_ms: u32,
    /// Routing and read options.
    pub flags: RequestFlags,
    /// The principal a forwarding node acts for. Ignored (refused with `FORBIDDEN`) unless the
    /// connection is a forwarding node's or the node runs in insecure development mode.
    pub principal: Option<Principal>,
    /// What to do.
    pub body: RequestBody,
}

/// Routing and read options of a request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestFlags {
    /// When this node does not lead the key's group, forward the request to the leader instead of
    /// answering `NOT_LEADER`.
    pub forward: bool,
    /// For Get and List: answer from this node's replica even if it is not the leader (the
    /// answer may be stale; [`GetResult::stale`] says so).
    pub stale_read: bool,
    /// Set by a forwarding node when the principal it names ([`Request::principal`]) was claimed
    /// by its client without authentication (insecure development mode). A node that is not in
    /// insecure development mode refuses such a request with `UNAUTHORIZED`, so one insecure
    /// node cannot open the tenants of a secure cluster. Nodes ignore it from clients (they
    /// decide themselves how a client's principal was established).
    pub principal_claimed: bool,
}

/// Who a request acts for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Principal {
    /// The principal's name (for logs and metrics).
    pub principal_id: String,
    /// The only tenant it may touch.
    pub tenant_id: String,
}

/// What a request asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RequestBody {
    /// Bind this connection to the tenant of a bearer token.
    Authenticate {
        /// The bearer token.
        token: String,
    },
    /// The placement map, the group leaders and the node addresses.
    Routing,
    /// One lease operation (Acquire, Renew, Release, Transfer: `tenure-core`'s [`LeaseOp`]).
    Lease(LeaseOp),
    /// Read a resource's lease.
    Get {
        /// The resource.
        key: ResourceKey,
    },
    /// List a tenant's leases in one group.
    List {
        /// The group to list (a tenant's leases are spread over all groups).
        group_id: u32,
        /// The query.
        request: ListRequest,
    },
    /// Several lease operations on resources of one group, applied in order in one log entry.
    Batch {
        /// The operations; all keys must map to the same group.
        ops: Vec<LeaseOp>,
    },
    /// This node's view of its groups: roles, terms, log indexes and replication lag. Needs no
    /// authentication (it shows no tenant data).
    Status,
    /// A group's replica set (voters, learners, leader, progress) as its leader sees it
    /// (forwarded there when asked and possible, else this node's replica's view). Needs no
    /// authentication (it shows no tenant data).
    GroupMembers {
        /// The group.
        group_id: u32,
    },
    /// Operators only: move the group's replica on node `from` to node `to` (add `to` as a
    /// learner, let it catch up, change the voters through joint consensus, drop `from`'s
    /// replica). Runs on the group's leader; answered with the new replica set once done, or
    /// `UNAVAILABLE` when the request's time ran out first (the move goes on: see
    /// `GroupMembers`). Repeating a finished move answers the same replica set.
    MoveReplica {
        /// The group.
        group_id: u32,
        /// The node whose replica leaves.
        from: u64,
        /// The node that gets the new replica.
        to: u64,
    },
    /// Cluster nodes only (a node certificate): create an empty replica of the group on this
    /// node, which its leader then adds as a learner. Creating one that exists is a no-op.
    CreateReplica {
        /// The group.
        group_id: u32,
    },
    /// Cluster nodes only: stop this node's replica of the group, which no longer counts it
    /// among its members (its data stays on disk, so a later `CreateReplica` reopens it).
    /// Refused when this replica's own membership lists this node at a later log index than
    /// `membership_log_index` (it was added again since). Dropping none is a no-op.
    DropReplica {
        /// The group.
        group_id: u32,
        /// Log index of the group's membership entry that no longer lists this node.
        membership_log_index: u64,
    },
    /// The cluster's node table as the answering node knows it (any node; it follows the
    /// metadata group). While no table exists (`version` 0) the answer is not a table: it lists
    /// the answering node's founder pins and itself, each as a `Joining` record whose
    /// `incarnation` is the pinned (or its own) data directory incarnation, which a founding
    /// node checks and pins before its replicas open. A client reads such an answer as "no
    /// table yet".
    ClusterNodes,
    /// A change to the cluster's node table, applied by the metadata group's leader (forwarded
    /// there when asked). `AddNode`, `SetState` and `Remove`: operators. `NodeUp`: only the node
    /// itself, sent straight to the leader over its own node certificate (whose SHA-256 must be
    /// the one it reports). `Record` and `SetLeaderPreferences`: never over the wire.
    ClusterChange(ClusterOp),
    /// Whether `fencing_token` is the resource's current active grant (Chubby's
    /// CheckSequencer), answered linearizably by the group's leader like Get (never from a
    /// follower's state: [`RequestFlags::stale_read`] is ignored). For a downstream system that
    /// cannot store tokens: it asks before accepting a holder's write and refuses a zombie.
    CheckFence {
        /// The resource.
        key: ResourceKey,
        /// The token the writer presents.
        fencing_token: u64,
    },
    /// One poll of a watch: the selected events of one group's log after an index, held open up
    /// to `wait_ms` while there are none (appended with watches, protocol 8). A watch is a
    /// sequence of polls, each continuing from the previous answer's `through_index`; the
    /// client library turns it into a stream. Served by the group's leader (forwarded there
    /// when asked), or any replica with [`RequestFlags::stale_read`].
    Watch(WatchPoll),
}

/// One poll of a watch ([`RequestBody::Watch`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchPoll {
    /// The group whose log is read (a resource's group, or each group in turn for a tenant or a
    /// prefix).
    pub group_id: u32,
    /// Which events.
    pub selector: WatchSelector,
    /// Events of entries after this log index; `None` starts now: answered at once with no
    /// events, the current index as `through_index` (and, for one resource, its lease then).
    pub after_index: Option<u64>,
    /// How long the node may hold the poll while no selected event arrives, in milliseconds
    /// (at most [`WATCH_WAIT_MS_MAX`]; 0 answers at once).
    pub wait_ms: u32,
    /// Most events in the answer (at most [`WATCH_EVENTS_PER_ANSWER_MAX`]).
    pub events_max: u32,
}

/// The answer to one [`WatchPoll`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchPage {
    /// The group.
    pub group_id: u32,
    /// The selected events after the poll's index, in log order, whole entries only.
    pub events: Vec<WatchEvent>,
    /// The answer covers every entry up to this index: the next poll continues after it.
    pub through_index: u64,
    /// True when the events the poll asked for are no longer retained on the node (the watcher
    /// fell too far behind, or the node restarted or installed a snapshot since): the events
    /// between the poll's index and `through_index` are lost, and the watcher re-reads the
    /// state (`current` for one resource, Get or List otherwise) before it goes on.
    pub resync: bool,
    /// For a one-resource selector, on a start (`after_index` `None`) or a resync: the
    /// resource's lease as of `through_index` (`None` when it has no record).
    pub current: Option<LeaseView>,
}

impl RequestBody {
    /// Short name for metrics and logs.
    pub fn op_name(&self) -> &'static str {
        match self {
            RequestBody::Authenticate { .. } => "authenticate",
            RequestBody::Routing => "routing",
            RequestBody::Lease(op) => op.kind().label(),
            RequestBody::Get { .. } => "get",
            RequestBody::List { .. } => "list",
            RequestBody::Batch { .. } => "batch",
            RequestBody::Status => "status",
            RequestBody::GroupMembers { .. } => "group_members",
            RequestBody::MoveReplica { .. } => "move_replica",
            RequestBody::CreateReplica { .. } => "create_replica",
            RequestBody::DropReplica { .. } => "drop_replica",
            RequestBody::ClusterNodes => "cluster_nodes",
            RequestBody::ClusterChange(_) => "cluster_change",
            RequestBody::CheckFence { .. } => "check_fence",
            RequestBody::Watch(_) => "watch",
        }
    }
}

/// One response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Response {
    /// The request's id.
    pub id: u64,
    /// The outcome.
    pub result: Result<ResponseBody, WireError>,
}

/// A successful response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ResponseBody {
    /// The connection now acts for this principal.
    Authenticated(Principal),
    /// Routing information.
    Routing(RoutingTable),
    /// A lease operation succeeded.
    Lease(LeaseResult),
    /// Get's answer.
    Get(GetResult),
    /// List's answer.
    List(ListPage),
    /// One result per batch item, in order.
    Batch(Vec<Result<LeaseResult, WireError>>),
    /// Status's answer.
    Status(NodeStatus),
    /// A group's replica set (the answer to `GroupMembers` and `MoveReplica`).
    Members(GroupMembers),
    /// `CreateReplica`'s and `DropReplica`'s answer.
    Replica(ReplicaChange),
    /// `ClusterNodes`' answer.
    Cluster(ClusterMeta),
    /// `ClusterChange`'s answer.
    ClusterChanged(ClusterChange),
    /// `CheckFence`'s answer.
    FenceChecked(FenceCheckResult),
    /// `Watch`'s answer (appended with watches, protocol 8).
    Watch(WatchPage),
}

/// A group's replica set as one replica (the leader, when it is known) sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupMembers {
    /// The group.
    pub group_id: u32,
    /// The node whose replica answered.
    pub seen_by: u64,
    /// The leader that replica knows, if any.
    pub leader: Option<u64>,
    /// Its current term.
    pub term: u64,
    /// The voters, ascending (during a joint change: the union of both voter sets).
    pub voters: Vec<u64>,
    /// Each voter set: one outside a change, two (old, new) while a joint change runs.
    pub voter_sets: Vec<Vec<u64>>,
    /// Learners (replicas that receive the log but do not vote), ascending.
    pub learners: Vec<u64>,
    /// Log index of the membership entry in effect (0 before the first).
    pub membership_log_index: u64,
    /// Whether that membership entry is committed.
    pub membership_committed: bool,
    /// Index of the last entry in the answering replica's log.
    pub last_log_index: u64,
    /// On the leader: each other replica's matched log index.
    pub followers: Vec<FollowerProgress>,
}

/// The outcome of `CreateReplica` or `DropReplica` on one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaChange {
    /// The group.
    pub group_id: u32,
    /// The node that created or dropped its replica.
    pub node_id: u64,
    /// False when there was nothing to do (it already had, or no longer had, the replica).
    pub changed: bool,
}

/// One node's view of itself and of the groups it hosts (the answer to [`RequestBody::Status`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// The node.
    pub node_id: u64,
    /// True when the node sees a leader for every group, is not shutting down and its storage
    /// has not failed (as `/readyz`).
    pub ready: bool,
    /// True once a graceful shutdown began.
    pub shutting_down: bool,
    /// Version of the node's placement map.
    pub placement_version: u64,
    /// Groups in the cluster.
    pub groups: u32,
    /// The groups this node hosts a replica of, by group id.
    pub hosted: Vec<GroupStatus>,
}

/// One hosted group replica's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupStatus {
    /// The group.
    pub group_id: u32,
    /// The leader this replica knows, if any.
    pub leader: Option<u64>,
    /// The replica's current Raft term.
    pub term: u64,
    /// True when this replica leads the group and accepts proposals.
    pub is_leader: bool,
    /// Index of the last entry in this replica's log.
    pub last_log_index: u64,
    /// Index of the last entry this replica knows committed.
    pub committed_index: u64,
    /// Index of the last entry applied to this replica's state machine.
    pub applied_index: u64,
    /// On the leader: each follower's matched log index (lag = `last_log_index - matched`).
    pub followers: Vec<FollowerProgress>,
}

/// Replication progress of one follower, as its leader sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FollowerProgress {
    /// The follower.
    pub node_id: u64,
    /// The last log index known replicated to it.
    pub matched_index: u64,
}

impl ResponseBody {
    /// Short name of the answer's kind, for errors and logs.
    pub fn kind_name(&self) -> &'static str {
        match self {
            ResponseBody::Authenticated(_) => "Authenticated",
            ResponseBody::Routing(_) => "Routing",
            ResponseBody::Lease(_) => "Lease",
            ResponseBody::Get(_) => "Get",
            ResponseBody::List(_) => "List",
            ResponseBody::Batch(_) => "Batch",
            ResponseBody::Status(_) => "Status",
            ResponseBody::Members(_) => "Members",
            ResponseBody::Replica(_) => "Replica",
            ResponseBody::Cluster(_) => "Cluster",
            ResponseBody::ClusterChanged(_) => "ClusterChanged",
            ResponseBody::FenceChecked(_) => "FenceChecked",
            ResponseBody::Watch(_) => "Watch",
        }
    }
}

/// A successful lease operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseResult {
    /// What the group decided.
    pub reply: LeaseReply,
    /// True when the request id had been seen and this is the original outcome.
    pub replayed: bool,
    /// The group that decided it.
    pub group_id: u32,
    /// For a replay: how the original answer stands now (the log time the retry was answered
    /// at, the remaining ttl of the original grant, zero once its lease ended). A client computes
    /// its safe window of a replayed grant from this, never from the grant's full ttl.
    pub replay: Option<ReplayState>,
}

/// CheckFence's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FenceCheckResult {
    /// The verdict (`current`: the token's lease is the resource's active lease with time left).
    pub verdict: FenceVerdict,
    /// The log time of the linearizable read the answer comes from (the state's). `current` and
    /// `remaining_ttl_ms` are then judged on the leader's clock, which may be later (a lease
    /// that clock says is due is not current even before its Expire entry is applied).
    pub log_time_ms: u64,
    /// The group.
    pub group_id: u32,
}

/// Get's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GetResult {
    /// The lease record, or `None` when the resource has none (status ABSENT).
    pub view: Option<LeaseView>,
    /// The group's log time the answer was computed at.
    pub log_time_ms: u64,
    /// True when answered from a replica that was not the leader ([`RequestFlags::stale_read`]).
    pub stale: bool,
    /// The group.
    pub group_id: u32,
}

/// Where everything is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoutingTable {
    /// Version of the placement map.
    pub placement_version: u64,
    /// Group of each placement slot. `slots.len()` is a power of two `2^b`; a key's slot is the
    /// top `b` bits of `tenure_core::key_hash(tenant_id, resource_id)` (XXH3-64 of the tenant id's
    /// length as u32 LE, the tenant id and the resource id).
    pub slot_groups: Vec<u32>,
    /// Number of groups.
    pub groups: u32,
    /// The cluster's nodes.
    pub nodes: Vec<NodeAddress>,
    /// The leader of each group as this node sees it, indexed by group id.
    pub leaders: Vec<GroupLeader>,
    /// Version of the node list (the cluster node table's; 0 before it was recorded): a client
    /// replaces its node list with a newer one and keeps it over an older one.
    pub nodes_version: u64,
}

/// Addresses of one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeAddress {
    /// Node id.
    pub node_id: u64,
    /// Its QUIC endpoint (`host:port`).
    pub client_addr: String,
    /// Its HTTP gateway (`http://host:port`).
    pub http_url: String,
}

/// Leadership of one group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupLeader {
    /// The group.
    pub group_id: u32,
    /// Its leader, if known.
    pub leader: Option<u64>,
    /// The Raft term that leader was seen in.
    pub term: u64,
}

/// An error answer: the contract's error shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireError {
    /// The contract's code.
    pub code: ErrorCode,
    /// A message for humans.
    pub message: String,
    /// Whether retrying (the same request id) may succeed.
    pub retryable: bool,
    /// For routing errors: the node believed to lead the group.
    pub leader_hint: Option<NodeAddress>,
    /// The placement version the node used.
    pub placement_version: u64,
    /// For `RATE_LIMITED` and `OVERLOADED`: when to retry, in milliseconds.
    pub retry_after_ms: Option<u32>,
    /// The state machine's error, when it decided (carries e.g. the current holder for
    /// `ALREADY_HELD`).
    pub lease_error: Option<LeaseError>,
}

impl WireError {
    /// An error with a code and message, nothing else.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        WireError {
            code,
            message: message.into(),
            retryable: code.retryable(),
            leader_hint: None,
            placement_version: 0,
            retry_after_ms: None,
            lease_error: None,
        }
    }

    /// The state machine's decision as a wire error.
    pub fn from_lease_error(error: LeaseError) -> Self {
        let mut wire = WireError::new(error.code(), error.to_string());
        wire.lease_error = Some(error);
        wire
    }

    /// The metadata group's refusal of a node-table change as a wire error.
    pub fn from_cluster_error(error: ClusterError) -> Self {
        let code = match &error {
            ClusterError::Invalid { .. } => ErrorCode::InvalidArgument,
            ClusterError::UnknownNode { .. } => ErrorCode::NotFound,
            ClusterError::Refused { .. } => ErrorCode::Forbidden,
        };
        WireError::new(code, error.to_string())
    }
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for WireError {}

/// Encodes a frame (length prefix included).
pub fn encode_client_frame<T: Serialize>(value: &T) -> Result<Vec<u8>, ProtoError> {
    let mut out = vec![0u8; 4];
    let body = postcard::to_extend(value, Vec::new()).map_err(|error| ProtoError::Payload {
        what: std::any::type_name::<T>(),
        reason: error.to_string(),
    })?;
    if body.is_empty() || body.len() > CLIENT_FRAME_BYTES_MAX {
        return Err(ProtoError::FrameTooLarge {
            length: body.len(),
            max: CLIENT_FRAME_BYTES_MAX,
        });
    }
    let length = u32::try_from(body.len()).map_err(|_| ProtoError::FrameTooLarge {
        length: body.len(),
        max: CLIENT_FRAME_BYTES_MAX,
    })?;
    out[..4].copy_from_slice(&length.to_le_bytes());
    out.extend_from_slice(&body);
    Ok(out)
}

/// Encodes a run of requests or responses into as few frames as fit in
/// [`CLIENT_FRAME_BYTES_MAX`], in order: a run that does not fit is halved. Returns the frames
/// (length prefix included) and the indexes of the items that do not fit even alone, which the
/// caller must answer some other way.
///
/// `items` is encoded as the frame itself: a [`RequestFrame`] or [`ResponseFrame`] is a struct
/// whose only field is the vector, and postcard writes a struct as its fields, so the bytes of a
/// slice of requests are the bytes of a `RequestFrame` holding them.
pub fn encode_frames_split<T: Serialize>(items: &[T]) -> (Vec<Vec<u8>>, Vec<usize>) {
    let mut frames = Vec::new();
    let mut too_large = Vec::new();
    // Ranges still to encode, the next one last.
    let mut work = vec![(0, items.len())];
    while let Some((start, end)) = work.pop() {
        if start == end {
            continue;
        }
        match encode_client_frame(&&items[start..end]) {
            Ok(bytes) => frames.push(bytes),
            Err(_) if end - start > 1 => {
                let middle = start + (end - start) / 2;
                work.push((middle, end));
                work.push((start, middle));
            }
            Err(_) => too_large.push(start),
        }
    }
    (frames, too_large)
}

/// The number of items a frame body announces: postcard writes a frame's vector length as a
/// varint (LEB128) at the body's start.
pub fn frame_item_count(body: &[u8]) -> Result<u64, ProtoError> {
    let mut count: u64 = 0;
    for (index, byte) in body.iter().take(10).enumerate() {
        count |= u64::from(byte & 0x7f) << (7 * index);
        if byte & 0x80 == 0 {
            return Ok(count);
        }
    }
    Err(ProtoError::Payload {
        what: "RequestFrame",
        reason: "the frame's item count is not a varint".into(),
    })
}

/// Decodes a request frame body (after its length prefix), checking the frame's bounds: the
/// request count is checked before any request is decoded.
pub fn decode_request_frame(body: &[u8]) -> Result<RequestFrame, ProtoError> {
    let count = frame_item_count(body)?;
    if count > REQUESTS_PER_FRAME_MAX as u64 {
        return Err(ProtoError::Payload {
            what: "RequestFrame",
            reason: format!("{count} requests exceed the maximum of {REQUESTS_PER_FRAME_MAX}"),
        });
    }
    let frame: RequestFrame = crate::peer::decode_payload(body, "RequestFrame")?;
    if frame.requests.len() > REQUESTS_PER_FRAME_MAX {
        return Err(ProtoError::Payload {
            what: "RequestFrame",
            reason: format!(
                "{} requests exceed the maximum of {REQUESTS_PER_FRAME_MAX}",
                frame.requests.len()
            ),
        });
    }
    Ok(frame)
}

/// Decodes a response frame body (after its length prefix).
pub fn decode_response_frame(body: &[u8]) -> Result<ResponseFrame, ProtoError> {
    crate::peer::decode_payload(body, "ResponseFrame")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn response(id: u64, message_bytes: usize) -> Response {
        Response {
            id,
            result: Err(WireError::new(
                ErrorCode::Internal,
                "x".repeat(message_bytes),
            )),
        }
    }

    #[test]
    fn a_slice_encodes_as_its_frame_and_oversized_runs_are_split_in_order() {
        let small: Vec<Response> = (0..3).map(|id| response(id, 10)).collect();
        let (frames, too_large) = encode_frames_split(&small);
        assert!(too_large.is_empty());
        assert_eq!(
            frames,
            vec![
                encode_client_frame(&ResponseFrame {
                    responses: small.clone()
                })
                .unwrap()
            ]
        );
        // Three answers of 2 MiB do not fit in one 4 MiB frame; one of 5 MiB fits in none.
        let big = vec![
            response(1, 2 << 20),
            response(2, 2 << 20),
            response(3, 5 << 20),
            response(4, 2 << 20),
        ];
        let (frames, too_large) = encode_frames_split(&big);
        assert_eq!(too_large, vec![2]);
        let ids: Vec<u64> = frames
            .iter()
            .flat_map(|frame| decode_response_frame(&frame[4..]).unwrap().responses)
            .map(|r| r.id)
            .collect();
        assert_eq!(ids, vec![1, 2, 4]);
        assert!(frames.iter().all(|f| f.len() <= CLIENT_FRAME_BYTES_MAX + 4));
    }

    /// Hole: a frame's request count was checked only after every request was decoded, so a
    /// 4 MiB frame of ~600,000 tiny requests was decoded in full (and allocated) before it was
    /// refused. The count must be refused from the frame's first bytes.
    #[test]
    fn request_count_is_checked_only_after_decoding() {
        // A varint count of 4,097 followed by bytes that are no request at all.
        let mut body = vec![0x81, 0x20];
        body.extend_from_slice(&[0xff; 64]);
        let error = decode_request_frame(&body).unwrap_err().to_string();
        assert!(
            error.contains("exceed the maximum"),
            "the count was not checked before decoding: {error}"
        );
    }
}
