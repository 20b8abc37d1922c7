//! The node's configuration file (TOML): every option, its default and its validation.
//!
//! [`load`] reads a file, [`parse`] reads text; both reject unknown fields, resolve nothing
//! implicitly from the environment, and return only configurations that passed
//! [`ServerConfig::validate`]. Every error names the file, the position (for syntax and type
//! errors) and the field. `ops/config/tenure.example.toml` lists every option with its default.
//!
//! Must not depend on: the running node (this module only parses and checks), the environment
//! or the command line.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tenure_core::NegativeControl;
use tenure_transport::GroupTiming;

pub use crate::auth::{AuthConfig, TokenConfig};

/// The `tenure serve` flag without which a configuration with test or insecure switches
/// ([`ServerConfig::insecure_switches`]) is refused; with it, such a configuration still runs only
/// on loopback addresses ([`ServerConfig::check_insecure_switches`]).
pub const ALLOW_INSECURE_FLAG: &str = "--allow-insecure-loopback-only";
/// Largest number of groups a cluster may have: the placement map's slot count
/// (`tenure_core::SLOT_COUNT_DEFAULT`), since every group needs at least one slot.
pub const GROUPS_MAX: u32 = tenure_core::SLOT_COUNT_DEFAULT;
/// Largest `limits.ops_per_entry_max`: the state machine refuses a longer entry
/// ([`tenure_core::BATCH_ITEMS_MAX_DEFAULT`], checked again against the groups' actual limit by
/// [`crate::limits::check_relations`] when a node starts).
pub const OPS_PER_ENTRY_CEILING: u32 = tenure_core::BATCH_ITEMS_MAX_DEFAULT;

/// Largest `limits.late_renewal_loaded_proposal_ms`: 10 s (beyond, a node is not short of
/// capacity but down).
pub const LATE_RENEWAL_LOADED_PROPOSAL_MS_MAX: u32 = 10_000;
/// Largest magnitude of `testing.clock_rate_ppm` (10%).
pub const CLOCK_RATE_PPM_BOUND: i64 = 100_000;
/// Largest magnitude of `testing.clock_offset_ms` (one year).
pub const CLOCK_OFFSET_MS_BOUND: i64 = 365 * 24 * 60 * 60 * 1_000;
/// Shortest `timing.heartbeat_ms`.
pub const HEARTBEAT_MS_MIN: u64 = 10;
/// Longest cluster name, in bytes (it goes into the CA certificate).
pub const CLUSTER_NAME_BYTES_MAX: usize = 64;

/// The whole configuration of one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// This node's id (>= 1); must be a key of `peers`. Required.
    pub node_id: u64,
    /// Cluster name; nodes of different clusters refuse each other, and a data directory
    /// remembers the cluster it belongs to. 1 to 64 bytes, no control characters. Default
    /// `tenure`.
    #[serde(default = "defaults::cluster_name")]
    pub cluster_name: String,
    /// Where this node keeps its data (RocksDB, node identity, snapshot spool). Required. A
    /// relative path is resolved against the configuration file's directory.
    pub data_dir: PathBuf,
    /// Every member of the cluster, this node included: id -> addresses. Required, non-empty,
    /// ids >= 1, every address distinct. In TOML: one `[peers.ID]` table per member.
    pub peers: BTreeMap<u64, PeerConfig>,
    /// Number of Raft groups (fixed when the cluster is created), 1 to 65,536. Default 64.
    #[serde(default = "defaults::groups")]
    pub groups: u32,
    /// Replicas per group, 1 to the number of peers. Default 3.
    ///
    /// A group stays available while a majority of its replicas is up, so 3 replicas tolerate one
    /// failure and 5 tolerate two; an even factor tolerates no more failures than the odd factor
    /// below it (4 tolerate one, like 3) while costing one more copy.
    #[serde(default = "defaults::replication_factor")]
    pub replication_factor: u32,
    /// TLS files. Required.
    pub tls: TlsConfig,
    /// Raft timing. Every field has a default.
    #[serde(default)]
    pub timing: TimingConfig,
    /// Lease and request limits. Every field has a default.
    #[serde(default)]
    pub limits: LimitsConfig,
    /// Authentication. Default: no tokens, insecure development mode off (every client request
    /// is refused until tokens are configured).
    #[serde(default)]
    pub auth: AuthConfig,
    /// Storage. Every field has a default.
    #[serde(default)]
    pub storage: StorageConfig,
    /// Membership: joining a running cluster, the placement controller. Every field has a
    /// default.
    #[serde(default)]
    pub cluster: ClusterConfig,
    /// Fault injection for tests (never set in production). Default: none.
    #[serde(default)]
    pub testing: TestingConfig,
}

/// Membership and the placement controller.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// This node joins a running cluster (announced first with `tenurectl node add`): it founds
    /// no group and hosts no replica until the placement controller moves some here; `peers`
    /// then lists this node and a few seed nodes of the cluster (it learns the rest), and
    /// `replication_factor` is not checked against their number. Default false.
    pub join_existing: bool,
    /// A member the placement controller cannot reach for this long is declared dead and its
    /// replicas are re-created on the other nodes, in milliseconds; at least 1,000. Default
    /// 300,000 (5 minutes).
    pub node_dead_after_ms: u64,
    /// How often the placement controller (on the metadata group's leader) looks, in
    /// milliseconds; 0 turns it off. Default 5,000.
    pub placement_interval_ms: u64,
    /// Replica moves the controller runs at once across the cluster, 1 to 16. Default 2.
    pub moves_inflight_max: u32,
    /// The pause after each move ends before the controller starts a move that only balances
    /// or empties a draining node, in milliseconds; at most 3,600,000. Moves that restore the
    /// replication factor (off a dead or removed node, an unfinished move) are never paused.
    /// Pausing trades a longer rebalance for less CPU taken from foreground requests at any
    /// moment (each move costs its group's snapshot build, transfer, install and catch-up).
    /// Default 10,000: on a 2-core test box rebalancing 64 groups holding 1M leases onto a new
    /// node took 701 s instead of 241 s, and the foreground p99 over the moves was 1.2x its
    /// value after them instead of 3.9x (`bench/rebalance.sh`, README "Rebalancing under
    /// load"). 0 starts the next move at the controller's next round.
    pub move_pause_ms: u64,
    /// Snapshot bytes this node sends per second, all transfers together (a new replica's
    /// first state, a follower too far behind the log), so that moves leave the network and
    /// the disk to foreground traffic; 0 = no limit, else at least 1 MiB/s (1,048,576). A
    /// transfer may take the 60 s transfer timeout plus its size over its share of this rate.
    /// Default 67,108,864 (64 MiB/s).
    pub snapshot_send_bytes_per_s: u64,
}

/// The default snapshot send rate (64 MiB/s).
pub const SNAPSHOT_SEND_BYTES_PER_S_DEFAULT: u64 = 64 << 20;
/// The default pause between paced moves (`cluster.move_pause_ms`): 10 s.
pub const MOVE_PAUSE_MS_DEFAULT: u64 = 10_000;
/// The longest pause between paced moves (`cluster.move_pause_ms`): one hour.
pub const MOVE_PAUSE_MS_MAX: u64 = 3_600_000;
/// The lowest snapshot send rate a configuration may ask for (1 MiB/s), other than no limit.
pub const SNAPSHOT_SEND_BYTES_PER_S_MIN: u64 = 1 << 20;

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            join_existing: false,
            node_dead_after_ms: 300_000,
            placement_interval_ms: 5_000,
            moves_inflight_max: 2,
            move_pause_ms: MOVE_PAUSE_MS_DEFAULT,
            snapshot_send_bytes_per_s: SNAPSHOT_SEND_BYTES_PER_S_DEFAULT,
        }
    }
}

/// One member's addresses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerConfig {
    /// The QUIC endpoint (UDP; peer and client protocol share it), e.g. `127.0.0.1:7401`.
    /// Required. This node binds its own entry's address.
    pub addr: SocketAddr,
    /// The HTTP gateway (TCP), e.g. `127.0.0.1:7501`. Required. This node binds its own entry's
    /// address.
    pub http_addr: SocketAddr,
}

/// TLS files (PEM), as written by `tenure certs`. Relative paths are resolved against the
/// configuration file's directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// The cluster CA certificate (`ca.pem`). Required.
    pub ca_cert: PathBuf,
    /// This node's certificate (`node-ID.pem`). Required.
    pub node_cert: PathBuf,
    /// This node's private key (`node-ID.key`). Required.
    pub node_key: PathBuf,
}

/// The largest `timing.expire_overdue_target_ms`: half the overdue at which the expiry backlog
/// alert fires, so a paced mass expiry never fires it.
pub const EXPIRE_OVERDUE_TARGET_MS_MAX: u64 = 30_000;

/// Raft timing (see `tenure_transport::GroupTiming`, built by [`ServerConfig::timing`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TimingConfig {
    /// Node-wide heartbeat period, in milliseconds; at least 10 and at most half of
    /// `election_timeout_min_ms`. Default 400.
    pub heartbeat_ms: u64,
    /// Election timeout lower bound, in milliseconds. Default 1000.
    pub election_timeout_min_ms: u64,
    /// Election timeout upper bound, in milliseconds; greater than the lower bound. Default 1500.
    pub election_timeout_max_ms: u64,
    /// How often leaders look for expired leases to reclaim, in milliseconds. Default 50.
    pub expire_interval_ms: u64,
    /// Leases one Expire command reclaims at most. Default 1024.
    pub expire_batch_max: u32,
    /// Expire commands a group proposes per second at most. Default 20.
    pub expire_commands_per_s_max: u32,
    /// Leases a group reclaims per second at most while its reclaim is on time (the oldest
    /// due lease less than `expire_overdue_target_ms` past its expiry): a paced Expire command
    /// reclaims at most this rate times the time since the group's budget was last spent (125
    /// leases a 50 ms tick; at most four command gaps' worth; only reclaimed leases spend it),
    /// so a mass expiry is spread out evenly instead of taking the machine's CPU from client
    /// commands. 0 = no pacing (only `expire_commands_per_s_max`). Default 2500.
    pub expire_paced_leases_per_s: u32,
    /// How far (log-time milliseconds) the oldest due lease may be past its expiry before its
    /// group stops pacing and reclaims at the full rate (`expire_batch_max` x
    /// `expire_commands_per_s_max` a second) until it is back under. 1 to 30000. Default 5000.
    pub expire_overdue_target_ms: u64,
    /// Snapshot a group after this many applied entries. Default 10000.
    pub snapshot_every_entries: u64,
    /// How often leadership balance is checked, in milliseconds (0 = never). Default 2000.
    pub rebalance_interval_ms: u64,
}

impl Default for TimingConfig {
    fn default() -> Self {
        TimingConfig {
            heartbeat_ms: 400,
            election_timeout_min_ms: 1_000,
            election_timeout_max_ms: 1_500,
            expire_interval_ms: 50,
            expire_batch_max: 1_024,
            expire_commands_per_s_max: 20,
            expire_paced_leases_per_s: 2_500,
            expire_overdue_target_ms: 5_000,
            snapshot_every_entries: 10_000,
            rebalance_interval_ms: 2_000,
        }
    }
}

/// Lease and request limits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Shortest ttl, in milliseconds; 0 = 3 x `timing.election_timeout_max_ms`, i.e. 1.5 x the
    /// longest election (the contract's default, so a holder can renew across a failover; see
    /// [`ServerConfig::effective_ttl_ms_min`]). Default 0.
    pub ttl_ms_min: u64,
    /// Longest ttl, in milliseconds; at most `tenure_core::TTL_MS_CEILING`. Default 3,600,000
    /// (1 hour).
    pub ttl_ms_max: u64,
    /// Requests in flight on this node at most (beyond: OVERLOADED). Default 65,536.
    pub inflight_requests_max: u32,
    /// Requests in flight per tenant at most (beyond: RATE_LIMITED). Default 16,384.
    pub tenant_inflight_requests_max: u32,
    /// Share of `inflight_requests_max` that new acquires may use, in percent (1 to 100);
    /// renewals, releases and reads may use all of it (renewals are admitted ahead of acquires).
    /// Default 75.
    pub acquire_inflight_percent: u32,
    /// A renewal is late when the lease it renews has less than this share of its ttl left as
    /// it reaches the leader, in percent (the client library sends renewals with two thirds
    /// left; one renewal is sampled per request, the first). When at least 4 of a tenant's
    /// renewals in a one-second window, and at least 5% of those seen, were late, and the node
    /// is short of capacity (`late_renewal_loaded_proposal_ms`), the node refuses that tenant's
    /// new acquires with OVERLOADED for 2 seconds after the window: the capacity goes to the
    /// leases already held (contract section 6). Keep it below the share
    /// clients renew at: clients configured to renew later (the library's `renew_after_ppm`
    /// above 500,000) look late. 0 turns off the sampling, its metrics and the refusals; at
    /// most 60. Default 50.
    pub late_renewal_remaining_percent: u32,
    /// Late renewals refuse acquires only while the node is short of capacity: while its lease
    /// proposals (from the request proposing to the answer: queueing, replication, commit,
    /// apply; each sample capped at ten times this) take at least this long on average over a
    /// one-second window, in milliseconds, or a group's proposal queue or the node's in-flight
    /// bound refused a request (half of it keeps a tenant refused). On a node with capacity to
    /// spare, late renewals are the clients' own doing and refusing their acquires would free
    /// nothing. 0: late renewals alone refuse. At most 10,000. Default 10: on this project's
    /// 2-core test machine an idle node answers in about 1 ms on average and a saturated one (a
    /// million leases with a 10 s ttl) in 21 ms to 2.5 s, median about 165 ms. A proposal waits
    /// for the group's entry in flight and then its own, so about two commits: where a commit
    /// alone takes 5 ms or more (a slow disk or network), every node counts as short of capacity
    /// and late renewals refuse as if this were 0 (the side that keeps held leases).
    pub late_renewal_loaded_proposal_ms: u32,
    /// Lease operations proposed in one log entry at most (1 to 4096). Default 256.
    pub ops_per_entry_max: u32,
    /// Proposals (log entries) in flight per group at most; operations arriving meanwhile queue
    /// and share the next entry. Default 1 (measured best with many groups: fewer, fuller
    /// entries; the groups themselves give the pipelining).
    pub proposals_inflight_per_group_max: u32,
    /// Pending operations queued per group at most (beyond: OVERLOADED). Default 16,384.
    pub group_queue_ops_max: u32,
    /// Default request timeout, in milliseconds. Default 5,000.
    pub request_timeout_ms: u64,
    /// Largest HTTP request body, in bytes. Default 65,536.
    pub http_body_bytes_max: usize,
    /// Active leases one tenant may hold across the whole cluster (beyond: QUOTA_EXCEEDED). Each
    /// group enforces its share, `tenure_core::tenant_group_share`: the even split over `groups`
    /// raised by `tenant_quota_slack_percent`, at least `tenant_group_share_floor`; a tenant may
    /// so hold up to `groups` x share (1,250,048 at the defaults). Default 1,000,000.
    pub tenant_active_leases_max: u64,
    /// Slack of a group's share of a tenant quota over the even split, in percent (0 to 1000);
    /// it absorbs the unevenness of hashing a tenant's resources over the groups. Default 25.
    pub tenant_quota_slack_percent: u32,
    /// Smallest share of a tenant quota a group enforces, in leases (capped at the quota). Default
    /// 512.
    pub tenant_group_share_floor: u64,
    /// Lease records (active plus retained inactive) per group; 0 = sized from
    /// `node_memory_budget_bytes` (see [`ServerConfig::state_memory_plan`]). Default 0.
    pub group_lease_records_max: u64,
    /// Request-id records per group; 0 = sized from `node_memory_budget_bytes`. Default 0.
    pub group_dedup_records_max: u64,
    /// Distinct tenants per group; 0 = sized from `node_memory_budget_bytes` (at most an eighth of
    /// a group's share, at most 16,384). Default 0.
    pub group_tenants_max: u32,
    /// Heap the lease state of the groups on one node may take at worst, in bytes: the node
    /// refuses to start with limits whose worst case (groups on the busiest node x per-group
    /// maxima x worst bytes per record) exceeds it. Default 12 GiB (12,884,901,888), half of the
    /// 24 GiB reference machine.
    pub node_memory_budget_bytes: u64,
    /// Concurrent HTTP connections at most; beyond it a new connection gets a `503` and is
    /// closed at once. Counted in the startup check of the descriptor limit. Default 4,096.
    pub http_connections_max: u32,
    /// Concurrent HTTP connections from one source IP address at most (at most
    /// `http_connections_max`). Default 1,024.
    pub http_connections_per_source_max: u32,
    /// Longest wait for a complete request header, in milliseconds, counted from the moment the
    /// connection waits for a request (so it is also the keep-alive idle timeout). Default
    /// 10,000.
    pub http_header_read_timeout_ms: u64,
    /// Longest time a request body may take to arrive, and a response write may stall, in
    /// milliseconds. Default 10,000.
    pub http_body_read_timeout_ms: u64,
    /// Bounds of native-protocol (QUIC) client connections. In TOML: `[limits.client]`.
    pub client: ClientLimitsConfig,
}

/// Bounds of native-protocol (QUIC) client connections: what one connection, authenticated or
/// not, may make the node hold. Connections of cluster nodes forwarding requests are exempt
/// (they get the peer limits). See `client_server` for the memory these bound.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClientLimitsConfig {
    /// Client connections open on this node at most; beyond, new ones are closed at once.
    /// Default 1,024.
    pub connections_max: u32,
    /// Client connections from one source IP address at most. Default 64.
    pub connections_per_source_max: u32,
    /// A connection that has not authenticated (`Authenticate`) within this is closed, in
    /// milliseconds (not in insecure development mode). Default 5,000.
    pub auth_timeout_ms: u64,
    /// Bidirectional QUIC streams a client connection may have open at once. Default 8.
    pub streams_max: u32,
    /// QUIC receive window of a client connection (all its streams together, and each stream),
    /// in bytes. Default 1 MiB (1,048,576).
    pub receive_window_bytes: u32,
    /// Requests of an authenticated connection in flight at once (from decoding until the
    /// reply is written); further frames wait (back-pressure). Default 4,096.
    pub inflight_requests_max: u32,
    /// Requests in flight at once on a connection that has not authenticated. Default 16.
    pub unauthenticated_inflight_requests_max: u32,
    /// Encoded reply bytes an authenticated connection may have computed and not yet written
    /// (a client that does not read stops its own requests, not the node). Default 4 MiB.
    pub reply_bytes_max: u32,
    /// The same for a connection that has not authenticated. Default 256 KiB (262,144).
    pub unauthenticated_reply_bytes_max: u32,
    /// `Routing` and `Status` requests per second per connection (bursts of twice this);
    /// beyond, `RATE_LIMITED` with a retry hint. Default 20.
    pub routing_status_per_s: u32,
    /// Requests a connection that has not authenticated may have refused (`UNAUTHORIZED`,
    /// `RATE_LIMITED`, any error) before the node stops reading it: its streams are stopped and
    /// new ones are not read until the authentication timeout closes it. Without this bound a
    /// client that ignores its refusals makes the node refuse requests as fast as it can write
    /// them. Default 64.
    pub unauthenticated_refusals_max: u32,
}

impl Default for ClientLimitsConfig {
    fn default() -> Self {
        ClientLimitsConfig {
            connections_max: 1_024,
            connections_per_source_max: 64,
            auth_timeout_ms: 5_000,
            streams_max: 8,
            receive_window_bytes: 1 << 20,
            inflight_requests_max: 4_096,
            unauthenticated_inflight_requests_max: 16,
            reply_bytes_max: 4 << 20,
            unauthenticated_reply_bytes_max: 256 << 10,
            routing_status_per_s: 20,
            unauthenticated_refusals_max: 64,
        }
    }
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            ttl_ms_min: 0,
            ttl_ms_max: 3_600_000,
            inflight_requests_max: 65_536,
            tenant_inflight_requests_max: 16_384,
            acquire_inflight_percent: 75,
            late_renewal_remaining_percent: 50,
            late_renewal_loaded_proposal_ms: crate::admission::LOADED_PROPOSAL_MS_DEFAULT,
            ops_per_entry_max: 256,
            proposals_inflight_per_group_max: 1,
            group_queue_ops_max: 16_384,
            request_timeout_ms: 5_000,
            http_body_bytes_max: 65_536,
            tenant_active_leases_max: tenure_core::TENANT_ACTIVE_LEASES_MAX_DEFAULT,
            tenant_quota_slack_percent: tenure_core::TENANT_QUOTA_SLACK_PERCENT_DEFAULT,
            tenant_group_share_floor: tenure_core::TENANT_GROUP_SHARE_FLOOR_DEFAULT,
            group_lease_records_max: 0,
            group_dedup_records_max: 0,
            group_tenants_max: 0,
            node_memory_budget_bytes: tenure_core::NODE_STATE_BYTES_DEFAULT,
            http_connections_max: 4_096,
            http_connections_per_source_max: 1_024,
            http_header_read_timeout_ms: 10_000,
            http_body_read_timeout_ms: 10_000,
            client: ClientLimitsConfig::default(),
        }
    }
}

/// Largest `limits.tenant_quota_slack_percent`.
pub const TENANT_QUOTA_SLACK_PERCENT_MAX: u32 = 1_000;

/// The lease-state sizing of a configuration: what each group enforces and what one node may
/// hold at worst (see [`ServerConfig::state_memory_plan`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateMemoryPlan {
    /// Groups hosted by the busiest member of the cluster.
    pub hosted_groups_max: u32,
    /// Lease records per group.
    pub group_lease_records_max: u64,
    /// Request-id records per group.
    pub group_dedup_records_max: u64,
    /// Distinct tenants per group.
    pub group_tenants_max: u32,
    /// A group's share of each tenant's cluster-wide active-lease quota.
    pub tenant_group_share: u64,
    /// Worst-case heap of one group's state at these limits, in bytes.
    pub group_state_bytes_max: u64,
    /// Worst-case heap of the busiest node's lease state, in bytes (at most the budget).
    pub node_state_bytes_max: u64,
}

impl StateMemoryPlan {
    /// The record and tenant maxima of the plan applied to `base`.
    pub fn apply_to(&self, base: tenure_core::GroupLimits) -> tenure_core::GroupLimits {
        tenure_core::GroupLimits {
            tenant_active_leases_max_default: self.tenant_group_share,
            tenants_max: self.group_tenants_max,
            lease_records_max: self.group_lease_records_max,
            inactive_records_max: self.group_lease_records_max,
            dedup_records_max: self.group_dedup_records_max,
            ..base
        }
    }
}

/// Storage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StorageConfig {
    /// Sync the WAL before acknowledging. Default true. Off is an insecure switch
    /// ([`ServerConfig::insecure_switches`]): `tenure serve` refuses it unless started with
    /// [`ALLOW_INSECURE_FLAG`] on loopback addresses.
    pub fsync: bool,
    /// RocksDB block cache, in bytes. Default 64 MiB (67,108,864).
    pub block_cache_bytes: usize,
    /// RocksDB write buffer, in bytes. Default 32 MiB (33,554,432).
    pub write_buffer_bytes: usize,
}

impl Default for StorageConfig {
    fn default() -> Self {
        StorageConfig {
            fsync: true,
            block_cache_bytes: 64 << 20,
            write_buffer_bytes: 32 << 20,
        }
    }
}

/// Fault injection used by tests.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TestingConfig {
    /// Monotonic clock rate error in parts per million (e.g. 5000 = runs 0.5% fast; negative =
    /// slow), within +-100,000. Default 0.
    pub clock_rate_ppm: i64,
    /// Offset added to this node's monotonic clock readings, in milliseconds, within +- one
    /// year. Default 0.
    pub clock_offset_ms: i64,
    /// Serve `GET`/`POST /testing/faults` on the HTTP gateway: the fault-injection suite changes
    /// this node's clock rate, adds a delay to every WAL sync (a slow disk) and drops its
    /// traffic to chosen peers (a partition) while the node runs. Default false; never in
    /// production (anyone who reaches the gateway could stall the node).
    pub fault_control: bool,
    /// A guarantee to break on purpose, so a checker can be seen failing: `none` (default),
    /// `skip-expiry-check`, `disable-deduplication`, `reset-tokens-on-new-leader`,
    /// `expire-by-wall-clock`, `ignore-founder-pins`. Only builds with the test-only `negative-controls` feature accept
    /// anything but `none`; every node of a cluster must name the same one.
    pub negative_control: NegativeControl,
}

mod defaults {
    pub fn cluster_name() -> String {
        "tenure".to_string()
    }
    pub fn groups() -> u32 {
        64
    }
    pub fn replication_factor() -> u32 {
        3
    }
}

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file cannot be read.
    #[error("cannot read the configuration file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The text is not TOML, or does not fit the configuration's shape (unknown or missing
    /// field, wrong type, unparsable address).
    #[error(
        "{origin}:{line}:{column}: {}{message}\n{line:>5} | {line_text}",
        field.as_ref().map(|f| format!("field `{f}`: ")).unwrap_or_default()
    )]
    Syntax {
        /// The file (or another description of where the text came from).
        origin: String,
        /// 1-based line of the problem.
        line: usize,
        /// 1-based column of the problem (in characters).
        column: usize,
        /// The field concerned, as a dotted path, when it can be told.
        field: Option<String>,
        /// toml's description of the problem.
        message: String,
        /// The text of the line.
        line_text: String,
    },
    /// A field has a value the node cannot run with.
    #[error("{origin}: invalid `{field}`: {reason}")]
    Invalid {
        /// The file, or `configuration` when the configuration did not come from a file.
        origin: String,
        /// The field, as a dotted path (e.g. `timing.heartbeat_ms`, `auth.tokens[2].sha256`).
        field: String,
        /// What is wrong and what is expected.
        reason: String,
    },
    /// The configuration cannot be written as TOML.
    #[error("cannot write the configuration as TOML: {0}")]
    Serialize(String),
}

impl ConfigError {
    fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigError::Invalid {
            origin: "configuration".to_owned(),
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// The same error, naming `new_origin` (usually the file) as where the configuration came
    /// from.
    pub fn with_origin(self, new_origin: &str) -> Self {
        match self {
            ConfigError::Invalid { field, reason, .. } => ConfigError::Invalid {
                origin: new_origin.to_owned(),
                field,
                reason,
            },
            other => other,
        }
    }

    /// The field concerned, when there is one.
    pub fn field(&self) -> Option<&str> {
        match self {
            ConfigError::Syntax { field, .. } => field.as_deref(),
            ConfigError::Invalid { field, .. } => Some(field),
            ConfigError::Read { .. } | ConfigError::Serialize(_) => None,
        }
    }
}

impl From<ConfigError> for crate::ServerError {
    fn from(error: ConfigError) -> Self {
        crate::ServerError::Config(error.to_string())
    }
}

/// Reads, checks and returns the configuration in `path`.
///
/// Relative paths in the file (`data_dir`, `tls.*`) are resolved against the file's directory,
/// so a configuration works from any working directory.
pub fn load(path: &Path) -> Result<ServerConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    let origin = path.display().to_string();
    let mut config = parse_unchecked(&text, &origin)?;
    let absolute = std::path::absolute(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    let base = absolute.parent().unwrap_or(Path::new("/"));
    config.resolve_paths(base);
    config.validate().map_err(|e| e.with_origin(&origin))?;
    Ok(config)
}

/// Parses and checks a configuration from TOML text. `origin` names the text in errors (usually
/// the file name). Relative paths stay relative (to the working directory); [`load`] resolves
/// them against the file's directory instead.
pub fn parse(text: &str, origin: &str) -> Result<ServerConfig, ConfigError> {
    let config = parse_unchecked(text, origin)?;
    config.validate().map_err(|e| e.with_origin(origin))?;
    Ok(config)
}

fn parse_unchecked(text: &str, origin: &str) -> Result<ServerConfig, ConfigError> {
    toml::from_str::<ServerConfig>(text).map_err(|error| syntax_error(text, origin, &error))
}

/// Turns toml's error into one naming the file, the line, the column and (when it can be told
/// from the text) the field.
fn syntax_error(text: &str, origin: &str, error: &toml::de::Error) -> ConfigError {
    let offset = error.span().map_or(0, |span| span.start).min(text.len());
    let offset = (0..=offset)
        .rev()
        .find(|i| text.is_char_boundary(*i))
        .unwrap_or(0);
    let line_start = text[..offset].rfind('\n').map_or(0, |i| i + 1);
    let line_index = text[..line_start].matches('\n').count();
    let column = text[line_start..offset].chars().count() + 1;
    let line_text = text[line_start..]
        .split('\n')
        .next()
        .unwrap_or("")
        .trim_end_matches('\r')
        .to_owned();
    let message = error.message().to_owned();
    // toml gives a missing field of the root table an empty span at 0, of another table the
    // span of its header (or of its inline value).
    let at_root = error
        .span()
        .is_none_or(|span| span.start == 0 && span.is_empty());
    let field = field_at(text, line_index, &message, at_root);
    ConfigError::Syntax {
        origin: origin.to_owned(),
        line: line_index + 1,
        column,
        field,
        message,
        line_text,
    }
}

/// The dotted path of the field on line `line_index` (0-based): the enclosing `[table]` header
/// plus the key of a `key = value` line. For "missing field" errors, the missing name under the
/// table the error points at (the root table when `at_root`).
fn field_at(text: &str, line_index: usize, message: &str, at_root: bool) -> Option<String> {
    let mut table: Option<String> = None;
    let mut here: Option<&str> = None;
    for (index, line) in text.split('\n').enumerate() {
        let trimmed = line.trim();
        if let Some(header) = table_header(trimmed) {
            table = Some(header);
        }
        if index == line_index {
            here = Some(trimmed);
            break;
        }
    }
    let here = here?;
    let join = |table: &Option<String>, key: &str| match table {
        Some(table) => format!("{table}.{key}"),
        None => key.to_owned(),
    };
    let missing = message
        .strip_prefix("missing field `")
        .and_then(|rest| rest.split('`').next());
    if let Some(missing) = missing {
        if at_root {
            return Some(missing.to_owned());
        }
        if let Some(header) = table_header(here) {
            return Some(format!("{header}.{missing}"));
        }
        // An inline table: `key = { ... }`.
        return Some(match line_key(here) {
            Some(key) => format!("{}.{missing}", join(&table, &key)),
            None => join(&table, missing),
        });
    }
    if let Some(header) = table_header(here) {
        return Some(header);
    }
    line_key(here).map(|key| join(&table, &key))
}

/// The (dotted) key of a `key = value` line.
fn line_key(line: &str) -> Option<String> {
    if line.starts_with('#') {
        return None;
    }
    let (key, _) = line.split_once('=')?;
    let key: String = key
        .split('.')
        .map(|part| part.trim().trim_matches('"').trim_matches('\''))
        .collect::<Vec<_>>()
        .join(".");
    if key.is_empty() { None } else { Some(key) }
}

/// `peers.1` for `[peers.1]`, `auth.tokens` for `[[auth.tokens]]`, nothing for other lines.
fn table_header(line: &str) -> Option<String> {
    let inner = line.strip_prefix('[')?;
    let inner = inner.strip_prefix('[').unwrap_or(inner);
    let end = inner.find(']')?;
    let name: Vec<&str> = inner[..end]
        .split('.')
        .map(|part| part.trim().trim_matches('"').trim_matches('\''))
        .collect();
    Some(name.join("."))
}

fn resolve(base: &Path, path: &mut PathBuf) {
    if path.is_relative() && !path.as_os_str().is_empty() {
        *path = base.join(&*path);
    }
}

impl ServerConfig {
    /// A configuration with every default, for node `node_id` of `peers`, keeping its data in
    /// `data_dir` and reading the TLS files `tenure certs` writes into `certs_dir`.
    pub fn with_defaults(
        node_id: u64,
        data_dir: PathBuf,
        peers: BTreeMap<u64, PeerConfig>,
        certs_dir: &Path,
    ) -> Self {
        let replication_factor = u32::try_from(peers.len())
            .unwrap_or(u32::MAX)
            .min(defaults::replication_factor());
        ServerConfig {
            node_id,
            cluster_name: defaults::cluster_name(),
            data_dir,
            peers,
            groups: defaults::groups(),
            replication_factor,
            tls: TlsConfig {
                ca_cert: certs_dir.join(tenure_transport::tls::CA_CERT_FILE),
                node_cert: certs_dir.join(tenure_transport::tls::node_cert_file_name(node_id)),
                node_key: certs_dir.join(tenure_transport::tls::node_key_file_name(node_id)),
            },
            timing: TimingConfig::default(),
            limits: LimitsConfig::default(),
            auth: AuthConfig::default(),
            storage: StorageConfig::default(),
            cluster: ClusterConfig::default(),
            testing: TestingConfig::default(),
        }
    }

    /// Resolves the relative paths of the configuration (`data_dir`, `tls.*`) against `base`.
    pub fn resolve_paths(&mut self, base: &Path) {
        resolve(base, &mut self.data_dir);
        resolve(base, &mut self.tls.ca_cert);
        resolve(base, &mut self.tls.node_cert);
        resolve(base, &mut self.tls.node_key);
    }

    /// This node's own entry of `peers` (present in a validated configuration).
    pub fn own_peer(&self) -> Option<&PeerConfig> {
        self.peers.get(&self.node_id)
    }

    /// The shortest ttl granted: `limits.ttl_ms_min`, or when that is 0, the contract's default
    /// of 1.5 x the longest time a group may need to elect a new leader. With openraft that time
    /// is `leader_lease + election_timeout_max_ms`, where the lease (during which followers refuse
    /// votes after hearing from a leader) equals `election_timeout_max_ms`: so the default is
    /// 1.5 x 2 x `election_timeout_max_ms` = 4,500 ms with the default timing (measured failovers:
    /// 2.8-3.2 s). A holder renewing at a third of its ttl can then renew across a failover.
    pub fn effective_ttl_ms_min(&self) -> u64 {
        if self.limits.ttl_ms_min == 0 {
            self.timing.election_timeout_max_ms.saturating_mul(3)
        } else {
            self.limits.ttl_ms_min
        }
    }

    /// The transport's group timing for this configuration.
    ///
    /// Heartbeat period and election timeouts come from `timing`; the other fields keep
    /// [`GroupTiming::default`]'s values. When the election timeouts are shorter than the
    /// defaults (test clusters with fast failover), the openraft tick and the heartbeat
    /// suppression interval are scaled down in proportion, so openraft's own timing check
    /// (`tick * 64 / 13 + heartbeat_min_interval + tick < election_timeout_min`) still holds.
    pub fn timing(&self) -> GroupTiming {
        let defaults = GroupTiming::default();
        let mut timing = GroupTiming {
            heartbeat_interval_ms: self.timing.heartbeat_ms,
            election_timeout_min_ms: self.timing.election_timeout_min_ms,
            election_timeout_max_ms: self.timing.election_timeout_max_ms,
            ..defaults
        };
        let min = self.timing.election_timeout_min_ms;
        if min < defaults.election_timeout_min_ms && timing.openraft_config().is_err() {
            let scale = |value: u64| {
                (u128::from(value) * u128::from(min)
                    / u128::from(defaults.election_timeout_min_ms.max(1)))
                .max(1)
            };
            timing.tick_interval_ms = u64::try_from(scale(defaults.tick_interval_ms)).unwrap_or(1);
            timing.heartbeat_min_interval_ms =
                u64::try_from(scale(defaults.heartbeat_min_interval_ms)).unwrap_or(1);
            while timing.tick_interval_ms > 1 && timing.openraft_config().is_err() {
                timing.tick_interval_ms -= 1;
            }
        }
        timing
    }

    /// The most groups any member hosts (replicas are placed as `placement::replicas_of` places
    /// them: group `g`'s replicas are the `replication_factor` members from index `g mod n` of
    /// the sorted member ids). Every member computes the same number from the same file, so
    /// every leader installs the same group limits.
    pub fn hosted_groups_max(&self) -> u32 {
        let members = self.peers.len();
        if members == 0 {
            return 0;
        }
        let factor = usize::try_from(self.replication_factor)
            .unwrap_or(members)
            .clamp(1, members);
        let mut hosted = vec![0u32; members];
        for group in 0..self.groups {
            let first = usize::try_from(group).unwrap_or(0) % members;
            for i in 0..factor {
                hosted[(first + i) % members] += 1;
            }
        }
        hosted.into_iter().max().unwrap_or(0)
    }

    /// The lease-state sizing of this configuration. The busiest node's groups share
    /// `node_memory_budget_bytes` evenly; in each group `group_tenants_max` left at 0 gets at
    /// most an eighth of the group's share (and at most 16,384 tenants), and a record maximum
    /// left at 0 gets the rest (as many request-id records as lease records, see
    /// `tenure_core::GroupLimits::records_for_bytes`). The result must fit the budget at the
    /// worst bytes per record (`tenure_core::LEASE_RECORD_BYTES_WORST` and its siblings), else the
    /// error names `limits.node_memory_budget_bytes` and the sizes. Apply enforces every one of
    /// these counts on every entry, replayed ones included, so the bound holds after a restart.
    pub fn state_memory_plan(&self) -> Result<StateMemoryPlan, ConfigError> {
        let l = &self.limits;
        let hosted = self.hosted_groups_max().max(1);
        let budget = l.node_memory_budget_bytes;
        let group_share_bytes = budget / u64::from(hosted);
        let tenants_max = if l.group_tenants_max != 0 {
            l.group_tenants_max
        } else {
            let fit = group_share_bytes / 8 / tenure_core::TENANT_BYTES_WORST;
            u32::try_from(fit.min(u64::from(tenure_core::GROUP_TENANTS_MAX_DEFAULT)))
                .unwrap_or(tenure_core::GROUP_TENANTS_MAX_DEFAULT)
                .max(1)
        };
        let even_split =
            tenure_core::GroupLimits::records_for_bytes(group_share_bytes, tenants_max);
        let auto = |explicit: u64| -> Result<u64, ConfigError> {
            if explicit != 0 {
                return Ok(explicit);
            }
            even_split.ok_or_else(|| {
                ConfigError::invalid(
                    "limits.node_memory_budget_bytes",
                    format!(
                        "{budget} bytes over {hosted} groups on the busiest node leave no room \
                         for lease records after {tenants_max} tenants per group; raise it or \
                         lower limits.group_tenants_max"
                    ),
                )
            })
        };
        let group = tenure_core::GroupLimits {
            lease_records_max: auto(l.group_lease_records_max)?,
            dedup_records_max: auto(l.group_dedup_records_max)?,
            tenants_max,
            ..tenure_core::GroupLimits::default()
        };
        let group_bytes = group.state_bytes_max();
        let node_bytes = group_bytes.saturating_mul(u64::from(hosted));
        if node_bytes > budget {
            return Err(ConfigError::invalid(
                "limits.node_memory_budget_bytes",
                format!(
                    "the lease limits need up to {node_bytes} bytes on the busiest node \
                     ({hosted} groups x {group_bytes}: {} lease records x {} + {} request-id \
                     records x {} + {} tenants x {} bytes per group), more than the budget of \
                     {budget}; lower limits.group_lease_records_max, \
                     limits.group_dedup_records_max or limits.group_tenants_max (0 sizes them \
                     from the budget), or raise the budget if the machine has the memory",
                    group.lease_records_max,
                    tenure_core::LEASE_RECORD_BYTES_WORST,
                    group.dedup_records_max,
                    tenure_core::DEDUP_RECORD_BYTES_WORST,
                    group.tenants_max,
                    tenure_core::TENANT_BYTES_WORST,
                ),
            ));
        }
        Ok(StateMemoryPlan {
            hosted_groups_max: hosted,
            group_lease_records_max: group.lease_records_max,
            group_dedup_records_max: group.dedup_records_max,
            group_tenants_max: group.tenants_max,
            tenant_group_share: tenure_core::tenant_group_share(
                l.tenant_active_leases_max,
                self.groups,
                l.tenant_quota_slack_percent,
                l.tenant_group_share_floor,
            ),
            group_state_bytes_max: group_bytes,
            node_state_bytes_max: node_bytes,
        })
    }

    /// Checks that the node can run with this configuration. The error names the first field
    /// found wrong.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_membership()?;
        self.validate_timing()?;
        self.validate_limits()?;
        self.validate_auth()?;
        self.validate_storage_and_testing()?;
        Ok(())
    }

    fn validate_membership(&self) -> Result<(), ConfigError> {
        let name = &self.cluster_name;
        if name.is_empty() || name.len() > CLUSTER_NAME_BYTES_MAX {
            return Err(ConfigError::invalid(
                "cluster_name",
                format!(
                    "must be 1 to {CLUSTER_NAME_BYTES_MAX} bytes, got {}",
                    name.len()
                ),
            ));
        }
        if name.chars().any(char::is_control) {
            return Err(ConfigError::invalid(
                "cluster_name",
                "must not contain control characters",
            ));
        }
        if self.data_dir.as_os_str().is_empty() {
            return Err(ConfigError::invalid("data_dir", "must not be empty"));
        }
        if self.peers.is_empty() {
            return Err(ConfigError::invalid(
                "peers",
                "must list every member of the cluster, this node included",
            ));
        }
        if self.peers.contains_key(&0) {
            return Err(ConfigError::invalid(
                "peers.0",
                "node ids start at 1 (0 is not a node id)",
            ));
        }
        if self.node_id == 0 {
            return Err(ConfigError::invalid(
                "node_id",
                "must be at least 1 (0 is not a node id)",
            ));
        }
        if !self.peers.contains_key(&self.node_id) {
            let ids: Vec<String> = self.peers.keys().map(u64::to_string).collect();
            return Err(ConfigError::invalid(
                "node_id",
                format!(
                    "node {} is not in peers (members: {}); add [peers.{}] or fix node_id",
                    self.node_id,
                    ids.join(", "),
                    self.node_id
                ),
            ));
        }
        let mut quic = BTreeMap::new();
        let mut http = BTreeMap::new();
        for (id, peer) in &self.peers {
            if let Some(other) = quic.insert(peer.addr, *id) {
                return Err(ConfigError::invalid(
                    format!("peers.{id}.addr"),
                    format!("{} is also the address of node {other}", peer.addr),
                ));
            }
            if let Some(other) = http.insert(peer.http_addr, *id) {
                return Err(ConfigError::invalid(
                    format!("peers.{id}.http_addr"),
                    format!(
                        "{} is also the HTTP address of node {other}",
                        peer.http_addr
                    ),
                ));
            }
            for (field, addr) in [("addr", peer.addr), ("http_addr", peer.http_addr)] {
                if addr.port() == 0 {
                    return Err(ConfigError::invalid(
                        format!("peers.{id}.{field}"),
                        format!("{addr} has port 0; every member needs a fixed port"),
                    ));
                }
            }
        }
        if self.groups == 0 || self.groups > GROUPS_MAX {
            return Err(ConfigError::invalid(
                "groups",
                format!("must be within 1..={GROUPS_MAX}, got {}", self.groups),
            ));
        }
        let members = if self.cluster.join_existing {
            usize::MAX
        } else {
            self.peers.len()
        };
        if self.cluster.node_dead_after_ms < 1_000 {
            return Err(ConfigError::invalid(
                "cluster.node_dead_after_ms",
                format!(
                    "must be at least 1,000, got {}",
                    self.cluster.node_dead_after_ms
                ),
            ));
        }
        let rate = self.cluster.snapshot_send_bytes_per_s;
        if rate != 0 && rate < SNAPSHOT_SEND_BYTES_PER_S_MIN {
            return Err(ConfigError::invalid(
                "cluster.snapshot_send_bytes_per_s",
                format!(
                    "must be 0 (no limit) or at least {SNAPSHOT_SEND_BYTES_PER_S_MIN}, got {rate}"
                ),
            ));
        }
        if !(1..=16).contains(&self.cluster.moves_inflight_max) {
            return Err(ConfigError::invalid(
                "cluster.moves_inflight_max",
                format!(
                    "must be within 1..=16, got {}",
                    self.cluster.moves_inflight_max
                ),
            ));
        }
        if self.cluster.move_pause_ms > MOVE_PAUSE_MS_MAX {
            return Err(ConfigError::invalid(
                "cluster.move_pause_ms",
                format!(
                    "must be at most {MOVE_PAUSE_MS_MAX}, got {}",
                    self.cluster.move_pause_ms
                ),
            ));
        }
        if self.replication_factor == 0
            || usize::try_from(self.replication_factor).map_or(true, |rf| rf > members)
        {
            return Err(ConfigError::invalid(
                "replication_factor",
                format!(
                    "must be within 1..={members} (the number of peers), got {}",
                    self.replication_factor
                ),
            ));
        }
        for (field, path) in [
            ("tls.ca_cert", &self.tls.ca_cert),
            ("tls.node_cert", &self.tls.node_cert),
            ("tls.node_key", &self.tls.node_key),
        ] {
            if path.as_os_str().is_empty() {
                return Err(ConfigError::invalid(field, "must not be empty"));
            }
        }
        Ok(())
    }

    fn validate_timing(&self) -> Result<(), ConfigError> {
        let t = &self.timing;
        if t.heartbeat_ms < HEARTBEAT_MS_MIN {
            return Err(ConfigError::invalid(
                "timing.heartbeat_ms",
                format!(
                    "must be at least {HEARTBEAT_MS_MIN}, got {}",
                    t.heartbeat_ms
                ),
            ));
        }
        if t.election_timeout_min_ms >= t.election_timeout_max_ms {
            return Err(ConfigError::invalid(
                "timing.election_timeout_min_ms",
                format!(
                    "must be less than timing.election_timeout_max_ms ({} >= {})",
                    t.election_timeout_min_ms, t.election_timeout_max_ms
                ),
            ));
        }
        if t.heartbeat_ms.saturating_mul(2) > t.election_timeout_min_ms {
            return Err(ConfigError::invalid(
                "timing.heartbeat_ms",
                format!(
                    "must be at most half of timing.election_timeout_min_ms ({}), so a follower \
                     hears at least two heartbeats before it may start an election; got {}",
                    t.election_timeout_min_ms, t.heartbeat_ms
                ),
            ));
        }
        if let Err(error) = self.timing().openraft_config() {
            return Err(ConfigError::invalid(
                "timing.election_timeout_min_ms",
                format!("rejected by openraft: {error}"),
            ));
        }
        positive_u64("timing.expire_interval_ms", t.expire_interval_ms)?;
        positive_u32("timing.expire_batch_max", t.expire_batch_max)?;
        positive_u32(
            "timing.expire_commands_per_s_max",
            t.expire_commands_per_s_max,
        )?;
        if t.expire_overdue_target_ms == 0
            || t.expire_overdue_target_ms > EXPIRE_OVERDUE_TARGET_MS_MAX
        {
            return Err(ConfigError::invalid(
                "timing.expire_overdue_target_ms",
                format!(
                    "must be 1 to {EXPIRE_OVERDUE_TARGET_MS_MAX} (the expiry backlog alert fires \
                     at 60 s overdue); got {}",
                    t.expire_overdue_target_ms
                ),
            ));
        }
        positive_u64("timing.snapshot_every_entries", t.snapshot_every_entries)?;
        Ok(())
    }

    fn validate_limits(&self) -> Result<(), ConfigError> {
        let l = &self.limits;
        if l.ttl_ms_max == 0 || l.ttl_ms_max > tenure_core::TTL_MS_CEILING {
            return Err(ConfigError::invalid(
                "limits.ttl_ms_max",
                format!(
                    "must be within 1..={}, got {}",
                    tenure_core::TTL_MS_CEILING,
                    l.ttl_ms_max
                ),
            ));
        }
        let ttl_min = self.effective_ttl_ms_min();
        if ttl_min > l.ttl_ms_max {
            let derived = if l.ttl_ms_min == 0 {
                " (derived: 1.5 x timing.election_timeout_max_ms)"
            } else {
                ""
            };
            return Err(ConfigError::invalid(
                "limits.ttl_ms_min",
                format!(
                    "{ttl_min}{derived} exceeds limits.ttl_ms_max ({})",
                    l.ttl_ms_max
                ),
            ));
        }
        positive_u32("limits.inflight_requests_max", l.inflight_requests_max)?;
        l.client.validate()?;
        positive_u32(
            "limits.tenant_inflight_requests_max",
            l.tenant_inflight_requests_max,
        )?;
        if l.acquire_inflight_percent == 0 || l.acquire_inflight_percent > 100 {
            return Err(ConfigError::invalid(
                "limits.acquire_inflight_percent",
                format!("must be within 1..=100, got {}", l.acquire_inflight_percent),
            ));
        }
        if l.late_renewal_remaining_percent > 60 {
            return Err(ConfigError::invalid(
                "limits.late_renewal_remaining_percent",
                format!(
                    "must be within 0..=60 (the client library renews with two thirds of the \
                     ttl left: a higher share would call every renewal late), got {}",
                    l.late_renewal_remaining_percent
                ),
            ));
        }
        at_most_u64(
            "limits.late_renewal_loaded_proposal_ms",
            l.late_renewal_loaded_proposal_ms.into(),
            LATE_RENEWAL_LOADED_PROPOSAL_MS_MAX.into(),
        )?;
        if l.ops_per_entry_max == 0 || l.ops_per_entry_max > OPS_PER_ENTRY_CEILING {
            return Err(ConfigError::invalid(
                "limits.ops_per_entry_max",
                format!(
                    "must be within 1..={OPS_PER_ENTRY_CEILING}, got {}",
                    l.ops_per_entry_max
                ),
            ));
        }
        positive_u32(
            "limits.proposals_inflight_per_group_max",
            l.proposals_inflight_per_group_max,
        )?;
        positive_u32("limits.group_queue_ops_max", l.group_queue_ops_max)?;
        positive_u64("limits.request_timeout_ms", l.request_timeout_ms)?;
        positive_u64(
            "limits.http_body_bytes_max",
            u64::try_from(l.http_body_bytes_max).unwrap_or(u64::MAX),
        )?;
        positive_u64(
            "limits.tenant_active_leases_max",
            l.tenant_active_leases_max,
        )?;
        at_most_u64(
            "limits.tenant_quota_slack_percent",
            l.tenant_quota_slack_percent.into(),
            TENANT_QUOTA_SLACK_PERCENT_MAX.into(),
        )?;
        if l.group_lease_records_max > u64::from(u32::MAX) {
            return Err(ConfigError::invalid(
                "limits.group_lease_records_max",
                format!("must be at most {}", u32::MAX),
            ));
        }
        positive_u64(
            "limits.node_memory_budget_bytes",
            l.node_memory_budget_bytes,
        )?;
        self.state_memory_plan()?;
        positive_u32("limits.http_connections_max", l.http_connections_max)?;
        positive_u32(
            "limits.http_connections_per_source_max",
            l.http_connections_per_source_max,
        )?;
        if l.http_connections_per_source_max > l.http_connections_max {
            return Err(ConfigError::invalid(
                "limits.http_connections_per_source_max",
                format!(
                    "must be at most limits.http_connections_max ({}), got {}",
                    l.http_connections_max, l.http_connections_per_source_max
                ),
            ));
        }
        positive_u64(
            "limits.http_header_read_timeout_ms",
            l.http_header_read_timeout_ms,
        )?;
        positive_u64(
            "limits.http_body_read_timeout_ms",
            l.http_body_read_timeout_ms,
        )?;
        Ok(())
    }

    fn validate_auth(&self) -> Result<(), ConfigError> {
        let mut seen = BTreeSet::new();
        for (index, token) in self.auth.tokens.iter().enumerate() {
            let field = |name: &str| format!("auth.tokens[{index}].{name}");
            let hash = token.sha256.trim();
            if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(ConfigError::invalid(
                    field("sha256"),
                    format!(
                        "expected 64 hex digits (the SHA-256 of the token, as `tenure hash-token \
                         TOKEN` prints), got {} characters",
                        hash.len()
                    ),
                ));
            }
            if !seen.insert(hash.to_ascii_lowercase()) {
                return Err(ConfigError::invalid(
                    field("sha256"),
                    "the same token hash appears twice",
                ));
            }
            if token.principal_id.trim().is_empty() {
                return Err(ConfigError::invalid(
                    field("principal_id"),
                    "must not be empty",
                ));
            }
            if token.tenant_id.trim().is_empty() {
                return Err(ConfigError::invalid(
                    field("tenant_id"),
                    "must not be empty",
                ));
            }
        }
        // The table the node builds; any check it makes beyond the ones above is reported too.
        crate::auth::Authenticator::new(&self.auth).map_err(|error| {
            ConfigError::invalid(format!("auth.tokens[{}]", error.index), error.reason)
        })?;
        Ok(())
    }

    fn validate_storage_and_testing(&self) -> Result<(), ConfigError> {
        positive_u64(
            "storage.block_cache_bytes",
            u64::try_from(self.storage.block_cache_bytes).unwrap_or(u64::MAX),
        )?;
        positive_u64(
            "storage.write_buffer_bytes",
            u64::try_from(self.storage.write_buffer_bytes).unwrap_or(u64::MAX),
        )?;
        if self.testing.clock_rate_ppm.abs() > CLOCK_RATE_PPM_BOUND {
            return Err(ConfigError::invalid(
                "testing.clock_rate_ppm",
                format!(
                    "must be within -{CLOCK_RATE_PPM_BOUND}..={CLOCK_RATE_PPM_BOUND}, got {}",
                    self.testing.clock_rate_ppm
                ),
            ));
        }
        if self.testing.negative_control != NegativeControl::None && !NegativeControl::AVAILABLE {
            return Err(ConfigError::invalid(
                "testing.negative_control",
                format!(
                    "{} needs a build with the test-only negative-controls feature; this one \
                     accepts only none",
                    self.testing.negative_control.name()
                ),
            ));
        }
        if self.testing.clock_offset_ms.abs() > CLOCK_OFFSET_MS_BOUND {
            return Err(ConfigError::invalid(
                "testing.clock_offset_ms",
                format!(
                    "must be within -{CLOCK_OFFSET_MS_BOUND}..={CLOCK_OFFSET_MS_BOUND}, got {}",
                    self.testing.clock_offset_ms
                ),
            ));
        }
        Ok(())
    }

    /// The switches of this configuration that weaken authentication, durability or the node's
    /// clock, or open fault injection: each as `(field, value)`, in a fixed order. Empty for a
    /// production configuration.
    ///
    /// `auth.insecure_dev_mode` trusts claimed principals (and forwards them); `storage.fsync =
    /// false` acknowledges writes a power loss can take back (a lost grant can be granted again
    /// to another holder); `testing.*` lets a node's clock run off true time (a leader whose
    /// clock runs fast ends leases early in real time), lets `/testing/faults` change it while
    /// the node runs, or breaks a guarantee on purpose (negative controls).
    pub fn insecure_switches(&self) -> Vec<(&'static str, String)> {
        let mut switches = Vec::new();
        if self.auth.insecure_dev_mode {
            switches.push(("auth.insecure_dev_mode", "true".to_owned()));
        }
        if !self.storage.fsync {
            switches.push(("storage.fsync", "false".to_owned()));
        }
        if self.testing.fault_control {
            switches.push(("testing.fault_control", "true".to_owned()));
        }
        if self.testing.clock_rate_ppm != 0 {
            switches.push((
                "testing.clock_rate_ppm",
                self.testing.clock_rate_ppm.to_string(),
            ));
        }
        if self.testing.clock_offset_ms != 0 {
            switches.push((
                "testing.clock_offset_ms",
                self.testing.clock_offset_ms.to_string(),
            ));
        }
        if self.testing.negative_control != NegativeControl::None {
            switches.push((
                "testing.negative_control",
                self.testing.negative_control.name().to_owned(),
            ));
        }
        switches
    }

    /// Whether `tenure serve` may run this configuration: a configuration with any of the
    /// [`ServerConfig::insecure_switches`] runs only when the operator passed
    /// [`ALLOW_INSECURE_FLAG`] (`allowed`) and every address this node binds (its QUIC endpoint,
    /// shared by peers and clients, and its HTTP gateway) is a loopback address, so nothing off
    /// the machine can reach a node that trusts claimed principals or lets its clock be set.
    ///
    /// The error names the switch, the address and the flag.
    pub fn check_insecure_switches(&self, allowed: bool) -> Result<(), ConfigError> {
        let switches = self.insecure_switches();
        let Some((field, value)) = switches.first() else {
            return Ok(());
        };
        let all = describe_switches(&switches);
        if let Some(own) = self.own_peer() {
            for (name, addr) in [("addr", own.addr), ("http_addr", own.http_addr)] {
                if !addr.ip().is_loopback() {
                    return Err(ConfigError::invalid(
                        *field,
                        format!(
                            "{value} is for tests and development only ({all}); it is refused \
                             on a node that binds a non-loopback address (peers.{}.{name} = \
                             {addr}), with or without {ALLOW_INSECURE_FLAG}: turn it off, or \
                             bind every address to 127.0.0.1",
                            self.node_id
                        ),
                    ));
                }
            }
        }
        if !allowed {
            return Err(ConfigError::invalid(
                *field,
                format!(
                    "{value} is for tests and development only ({all}): it weakens \
                     authentication, durability or the node's clock; `tenure serve` runs it \
                     only on loopback addresses and with the flag {ALLOW_INSECURE_FLAG}"
                ),
            ));
        }
        Ok(())
    }

    /// The configuration as TOML text that [`parse`] reads back to an equal configuration.
    ///
    /// Fails only for values TOML cannot hold (integers above `i64::MAX`, non-UTF-8 paths).
    pub fn to_toml(&self) -> Result<String, ConfigError> {
        toml::to_string(self).map_err(|error| ConfigError::Serialize(error.to_string()))
    }
}

/// Switches as `field = value, ...` (see [`ServerConfig::insecure_switches`]), for messages.
pub fn describe_switches(switches: &[(&'static str, String)]) -> String {
    let all: Vec<String> = switches
        .iter()
        .map(|(field, value)| format!("{field} = {value}"))
        .collect();
    all.join(", ")
}

impl ClientLimitsConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        positive_u32("limits.client.connections_max", self.connections_max)?;
        positive_u32(
            "limits.client.connections_per_source_max",
            self.connections_per_source_max,
        )?;
        positive_u64("limits.client.auth_timeout_ms", self.auth_timeout_ms)?;
        positive_u32("limits.client.streams_max", self.streams_max)?;
        if self.receive_window_bytes < 64 << 10 {
            return Err(ConfigError::invalid(
                "limits.client.receive_window_bytes",
                format!("must be at least 65,536, got {}", self.receive_window_bytes),
            ));
        }
        positive_u32(
            "limits.client.inflight_requests_max",
            self.inflight_requests_max,
        )?;
        positive_u32(
            "limits.client.unauthenticated_inflight_requests_max",
            self.unauthenticated_inflight_requests_max,
        )?;
        for (field, value) in [
            ("limits.client.reply_bytes_max", self.reply_bytes_max),
            (
                "limits.client.unauthenticated_reply_bytes_max",
                self.unauthenticated_reply_bytes_max,
            ),
        ] {
            if value < 64 << 10 {
                return Err(ConfigError::invalid(
                    field,
                    format!("must be at least 65,536, got {value}"),
                ));
            }
        }
        positive_u32(
            "limits.client.routing_status_per_s",
            self.routing_status_per_s,
        )?;
        positive_u32(
            "limits.client.unauthenticated_refusals_max",
            self.unauthenticated_refusals_max,
        )
    }
}

fn positive_u64(field: &str, value: u64) -> Result<(), ConfigError> {
    if value == 0 {
        Err(ConfigError::invalid(field, "must be greater than 0"))
    } else {
        Ok(())
    }
}

fn positive_u32(field: &str, value: u32) -> Result<(), ConfigError> {
    positive_u64(field, u64::from(value))
}

fn at_most_u64(field: &str, value: u64, max: u64) -> Result<(), ConfigError> {
    if value > max {
        Err(ConfigError::invalid(
            field,
            format!("must be within 0..={max}, got {value}"),
        ))
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    const MINIMAL: &str = r#"
node_id = 1
data_dir = "data"

[peers.1]
addr = "127.0.0.1:7401"
http_addr = "127.0.0.1:7501"

[peers.2]
addr = "127.0.0.1:7402"
http_addr = "127.0.0.1:7502"

[peers.3]
addr = "127.0.0.1:7403"
http_addr = "127.0.0.1:7503"

[tls]
ca_cert = "certs/ca.pem"
node_cert = "certs/node-1.pem"
node_key = "certs/node-1.key"
"#;

    fn minimal() -> ServerConfig {
        parse(MINIMAL, "minimal.toml").unwrap()
    }

    fn invalid_field(config: &ServerConfig) -> String {
        match config.validate() {
            Err(ConfigError::Invalid { field, .. }) => field,
            other => panic!("expected an invalid field, got {other:?}"),
        }
    }

    #[test]
    fn insecure_switch_check_covers_durability_and_every_bound_address() {
        let secure = minimal();
        assert!(secure.insecure_switches().is_empty());
        assert!(secure.check_insecure_switches(false).is_ok());

        let mut no_fsync = minimal();
        no_fsync.storage.fsync = false;
        assert_eq!(
            no_fsync.insecure_switches(),
            vec![("storage.fsync", "false".to_owned())]
        );
        let refused = no_fsync
            .check_insecure_switches(false)
            .unwrap_err()
            .to_string();
        assert!(
            refused.contains("storage.fsync") && refused.contains(ALLOW_INSECURE_FLAG),
            "{refused}"
        );
        assert!(no_fsync.check_insecure_switches(true).is_ok());

        // One loopback address is not enough: each bound address is checked, IPv6 loopback counts.
        let cases: [(&str, &str, Option<&str>); 4] = [
            (
                "127.0.0.1:7401",
                "0.0.0.0:7501",
                Some("http_addr = 0.0.0.0:7501"),
            ),
            (
                "10.0.0.1:7401",
                "127.0.0.1:7501",
                Some("addr = 10.0.0.1:7401"),
            ),
            ("[::1]:7401", "[::]:7501", Some("http_addr = [::]:7501")),
            ("[::1]:7401", "127.0.0.1:7501", None),
        ];
        for (addr, http_addr, refusal) in cases {
            let mut config = minimal();
            config.auth.insecure_dev_mode = true;
            let own = config.peers.get_mut(&1).unwrap();
            own.addr = addr.parse().unwrap();
            own.http_addr = http_addr.parse().unwrap();
            match (config.check_insecure_switches(true), refusal) {
                (Ok(()), None) => {}
                (Err(error), Some(names)) => {
                    let error = error.to_string();
                    assert!(
                        error.contains(names) && error.contains("non-loopback"),
                        "{addr} / {http_addr}: {error}"
                    );
                }
                (outcome, _) => panic!("{addr} / {http_addr}: unexpected {outcome:?}"),
            }
        }
    }

    #[test]
    fn minimal_config_gets_documented_defaults() {
        let config = minimal();
        assert_eq!(config.cluster_name, "tenure");
        assert_eq!(config.groups, 64);
        assert_eq!(config.replication_factor, 3);
        assert_eq!(config.timing, TimingConfig::default());
        assert_eq!(config.limits, LimitsConfig::default());
        assert_eq!(config.storage, StorageConfig::default());
        assert!(!config.auth.insecure_dev_mode);
        assert!(config.auth.tokens.is_empty());
        assert_eq!(config.effective_ttl_ms_min(), 4_500);
        assert_eq!(config.timing(), GroupTiming::default());
        assert_eq!(config.own_peer().unwrap().addr.port(), 7401);
    }

    #[test]
    #[allow(clippy::print_stdout)]
    fn quota_default_config_sizes_the_lease_state_to_the_node_budget() {
        // 64 groups, 3 nodes, 3 replicas: every node hosts every group.
        let config = minimal();
        let plan = config.state_memory_plan().unwrap();
        println!("default plan: {plan:?}");
        assert_eq!(plan.hosted_groups_max, 64);
        assert_eq!(
            plan.group_lease_records_max,
            tenure_core::GROUP_RECORDS_MAX_DEFAULT
        );
        assert_eq!(
            plan.group_dedup_records_max,
            tenure_core::GROUP_RECORDS_MAX_DEFAULT
        );
        assert!(plan.node_state_bytes_max <= config.limits.node_memory_budget_bytes);
        // The per-tenant quota holds cluster-wide, up to the documented slack.
        assert_eq!(plan.tenant_group_share, 19_532);
        let cluster_hold = u64::from(config.groups) * plan.tenant_group_share;
        let quota = config.limits.tenant_active_leases_max;
        assert!(
            cluster_hold <= quota + quota / 4 + u64::from(config.groups),
            "{cluster_hold}"
        );
        assert_eq!(
            plan.group_tenants_max,
            tenure_core::GROUP_TENANTS_MAX_DEFAULT
        );
        let limits = plan.apply_to(tenure_core::GroupLimits::default());
        assert_eq!(limits, tenure_core::GroupLimits::default());
        limits.validate().unwrap();
    }

    #[test]
    fn quota_record_maxima_follow_the_busiest_node_and_explicit_values_are_checked() {
        let mut config = minimal();
        for id in 4..=5 {
            config.peers.insert(
                id,
                PeerConfig {
                    addr: format!("127.0.0.1:74{id:02}").parse().unwrap(),
                    http_addr: format!("127.0.0.1:75{id:02}").parse().unwrap(),
                },
            );
        }
        config.groups = 128;
        let plan = config.state_memory_plan().unwrap();
        // 128 x 3 replicas over 5 nodes: 76 or 78 each (groups g mod 5 = 0, 1, 2 are one more).
        assert_eq!(plan.hosted_groups_max, 78);
        assert!(plan.group_lease_records_max < tenure_core::GROUP_RECORDS_MAX_DEFAULT);
        assert!(plan.node_state_bytes_max <= config.limits.node_memory_budget_bytes);
        assert_eq!(plan.tenant_group_share, 9_766);

        config.limits.group_dedup_records_max = 50_000;
        let plan = config.state_memory_plan().unwrap();
        assert_eq!(plan.group_dedup_records_max, 50_000);
        config.limits.group_lease_records_max = 1_000_000;
        assert_eq!(invalid_field(&config), "limits.node_memory_budget_bytes");
        config.limits.node_memory_budget_bytes = 200 << 30;
        config.validate().unwrap();

        // The most groups on 3 nodes: tenants and records shrink to fit rather than refuse.
        let mut config = minimal();
        config.groups = GROUPS_MAX;
        let plan = config.state_memory_plan().unwrap();
        assert_eq!(plan.hosted_groups_max, GROUPS_MAX);
        assert_eq!(plan.group_tenants_max, 983);
        assert_eq!(plan.group_lease_records_max, 1_755);
        assert!(plan.node_state_bytes_max <= config.limits.node_memory_budget_bytes);
    }

    #[test]
    fn hosted_groups_max_matches_replica_placement() {
        let mut config = minimal();
        for (members, factor, groups) in [(3, 3, 64), (5, 3, 128), (4, 2, 7), (3, 1, 10), (7, 5, 1)]
        {
            config.peers = (1..=members)
                .map(|id: u64| {
                    (
                        id,
                        PeerConfig {
                            addr: format!("127.0.0.1:{}", 7400 + id).parse().unwrap(),
                            http_addr: format!("127.0.0.1:{}", 7500 + id).parse().unwrap(),
                        },
                    )
                })
                .collect();
            config.replication_factor = factor;
            config.groups = groups;
            let ids: Vec<u64> = config.peers.keys().copied().collect();
            let busiest = ids
                .iter()
                .map(|id| {
                    (0..groups)
                        .filter(|&g| crate::placement::replicas_of(g, &ids, factor).contains(id))
                        .count()
                })
                .max()
                .unwrap();
            assert_eq!(
                config.hosted_groups_max() as usize,
                busiest,
                "{members} {factor} {groups}"
            );
        }
    }

    #[test]
    fn to_toml_round_trips() {
        let mut config = minimal();
        config.auth.tokens.push(TokenConfig {
            sha256: crate::auth::token_sha256_hex("secret"),
            principal_id: "svc".into(),
            tenant_id: "acme".into(),
            operator: false,
        });
        config.testing.clock_rate_ppm = -5_000;
        let text = config.to_toml().unwrap();
        assert_eq!(parse(&text, "round trip").unwrap(), config);
    }

    #[test]
    fn syntax_errors_name_line_column_and_field() {
        let text = MINIMAL.replace("data_dir = \"data\"", "data_dir = \"data");
        let error = parse(&text, "broken.toml").unwrap_err();
        let message = error.to_string();
        assert!(message.starts_with("broken.toml:3:"), "{message}");

        let text = format!("{MINIMAL}\n[timing]\nheartbeat_ms = \"fast\"\n");
        let error = parse(&text, "typed.toml").unwrap_err();
        assert_eq!(error.field(), Some("timing.heartbeat_ms"), "{error}");
        assert!(error.to_string().contains("typed.toml:23:16"), "{error}");

        let text = format!("{MINIMAL}\n[limits]\nttl_max = 5\n");
        let error = parse(&text, "unknown.toml").unwrap_err();
        assert_eq!(error.field(), Some("limits.ttl_max"), "{error}");
        assert!(error.to_string().contains("unknown field"), "{error}");

        let text = MINIMAL.replace("node_id = 1\n", "");
        let error = parse(&text, "missing.toml").unwrap_err();
        assert_eq!(error.field(), Some("node_id"), "{error}");

        let text = MINIMAL.replace("node_key = \"certs/node-1.key\"\n", "");
        let error = parse(&text, "missing.toml").unwrap_err();
        assert_eq!(error.field(), Some("tls.node_key"), "{error}");

        // A file of tables only, missing a root field.
        let peers = "[peers.1]\naddr = \"127.0.0.1:1\"\nhttp_addr = \"127.0.0.1:2\"\n";
        let tls = "[tls]\nca_cert = \"a\"\nnode_cert = \"b\"\nnode_key = \"c\"\n";
        let error = parse(&format!("{peers}{tls}"), "tables.toml").unwrap_err();
        assert_eq!(error.field(), Some("node_id"), "{error}");

        // An inline table missing a field.
        let text = format!(
            "node_id = 1\ndata_dir = \"d\"\ntls = {{ ca_cert = \"a\", node_cert = \"b\" }}\n{peers}"
        );
        let error = parse(&text, "inline.toml").unwrap_err();
        assert_eq!(error.field(), Some("tls.node_key"), "{error}");

        let text = MINIMAL.replace("127.0.0.1:7502", "127.0.0.1");
        let error = parse(&text, "addr.toml").unwrap_err();
        assert_eq!(error.field(), Some("peers.2.http_addr"), "{error}");
    }

    #[test]
    fn membership_is_checked() {
        let mut config = minimal();
        config.node_id = 4;
        assert_eq!(invalid_field(&config), "node_id");
        config.node_id = 0;
        assert_eq!(invalid_field(&config), "node_id");

        let mut config = minimal();
        config.replication_factor = 4;
        assert_eq!(invalid_field(&config), "replication_factor");
        config.replication_factor = 0;
        assert_eq!(invalid_field(&config), "replication_factor");
        config.replication_factor = 2;
        config.validate().unwrap();

        let mut config = minimal();
        let first = config.peers[&1].addr;
        config.peers.get_mut(&3).unwrap().addr = first;
        assert_eq!(invalid_field(&config), "peers.3.addr");

        let mut config = minimal();
        config.groups = 0;
        assert_eq!(invalid_field(&config), "groups");
        config.groups = GROUPS_MAX + 1;
        assert_eq!(invalid_field(&config), "groups");
        config.groups = GROUPS_MAX;
        config.validate().unwrap();

        let mut config = minimal();
        config.cluster_name = String::new();
        assert_eq!(invalid_field(&config), "cluster_name");

        let mut config = minimal();
        config.tls.node_key = PathBuf::new();
        assert_eq!(invalid_field(&config), "tls.node_key");
    }

    #[test]
    fn timing_is_checked_and_scaled() {
        let mut config = minimal();
        config.timing.election_timeout_max_ms = config.timing.election_timeout_min_ms;
        assert_eq!(invalid_field(&config), "timing.election_timeout_min_ms");

        let mut config = minimal();
        config.timing.heartbeat_ms = 600;
        assert_eq!(invalid_field(&config), "timing.heartbeat_ms");
        config.timing.heartbeat_ms = 5;
        assert_eq!(invalid_field(&config), "timing.heartbeat_ms");

        // Fast test timing still passes openraft's check.
        for (heartbeat, min, max) in [(100, 300, 600), (50, 150, 300), (20, 50, 100)] {
            let mut config = minimal();
            config.timing.heartbeat_ms = heartbeat;
            config.timing.election_timeout_min_ms = min;
            config.timing.election_timeout_max_ms = max;
            config.validate().unwrap();
            let timing = config.timing();
            assert_eq!(timing.heartbeat_interval_ms, heartbeat);
            assert_eq!(timing.election_timeout_min_ms, min);
            assert!(timing.tick_interval_ms < GroupTiming::default().tick_interval_ms);
            timing.openraft_config().unwrap();
            assert_eq!(config.effective_ttl_ms_min(), max * 3);
        }

        let mut config = minimal();
        config.timing.expire_batch_max = 0;
        assert_eq!(invalid_field(&config), "timing.expire_batch_max");
        config.timing.expire_batch_max = 1_024;
        config.timing.expire_overdue_target_ms = 0;
        assert_eq!(invalid_field(&config), "timing.expire_overdue_target_ms");
        config.timing.expire_overdue_target_ms = EXPIRE_OVERDUE_TARGET_MS_MAX + 1;
        assert_eq!(invalid_field(&config), "timing.expire_overdue_target_ms");
        config.timing.expire_overdue_target_ms = EXPIRE_OVERDUE_TARGET_MS_MAX;
        config.timing.expire_paced_leases_per_s = 0;
        config.validate().unwrap();
    }

    #[test]
    fn limits_are_checked() {
        let mut config = minimal();
        config.limits.ttl_ms_max = tenure_core::TTL_MS_CEILING + 1;
        assert_eq!(invalid_field(&config), "limits.ttl_ms_max");

        let mut config = minimal();
        config.limits.ttl_ms_max = 2_000; // below the derived minimum of 4500
        assert_eq!(invalid_field(&config), "limits.ttl_ms_min");
        config.limits.ttl_ms_min = 500;
        config.validate().unwrap();
        assert_eq!(config.effective_ttl_ms_min(), 500);

        let mut config = minimal();
        config.limits.acquire_inflight_percent = 101;
        assert_eq!(invalid_field(&config), "limits.acquire_inflight_percent");
        config.limits.acquire_inflight_percent = 0;
        assert_eq!(invalid_field(&config), "limits.acquire_inflight_percent");
        config.limits.acquire_inflight_percent = 75;
        config.limits.late_renewal_remaining_percent = 61;
        assert_eq!(
            invalid_field(&config),
            "limits.late_renewal_remaining_percent"
        );
        config.limits.late_renewal_remaining_percent = 50;
        config.limits.late_renewal_loaded_proposal_ms = LATE_RENEWAL_LOADED_PROPOSAL_MS_MAX + 1;
        assert_eq!(
            invalid_field(&config),
            "limits.late_renewal_loaded_proposal_ms"
        );

        let mut config = minimal();
        config.limits.ops_per_entry_max = OPS_PER_ENTRY_CEILING + 1;
        assert_eq!(invalid_field(&config), "limits.ops_per_entry_max");

        let mut config = minimal();
        config.limits.http_body_bytes_max = 0;
        assert_eq!(invalid_field(&config), "limits.http_body_bytes_max");

        let mut config = minimal();
        config.cluster.moves_inflight_max = 0;
        assert_eq!(invalid_field(&config), "cluster.moves_inflight_max");
        config.cluster.moves_inflight_max = 2;
        config.cluster.move_pause_ms = MOVE_PAUSE_MS_MAX + 1;
        assert_eq!(invalid_field(&config), "cluster.move_pause_ms");
        config.cluster.move_pause_ms = MOVE_PAUSE_MS_MAX;
        config.validate().unwrap();

        let mut config = minimal();
        config.testing.clock_rate_ppm = -100_001;
        assert_eq!(invalid_field(&config), "testing.clock_rate_ppm");
        config.testing.clock_rate_ppm = 5_000;
        config.validate().unwrap();
    }

    #[test]
    fn tokens_are_checked() {
        let mut config = minimal();
        config.auth.tokens.push(TokenConfig {
            sha256: "abc".into(),
            principal_id: "svc".into(),
            tenant_id: "acme".into(),
            operator: false,
        });
        assert_eq!(invalid_field(&config), "auth.tokens[0].sha256");
        config.auth.tokens[0].sha256 = crate::auth::token_sha256_hex("t");
        config.validate().unwrap();
        config.auth.tokens[0].tenant_id = " ".into();
        assert_eq!(invalid_field(&config), "auth.tokens[0].tenant_id");
        config.auth.tokens[0].tenant_id = "acme".into();
        config.auth.tokens.push(config.auth.tokens[0].clone());
        assert_eq!(invalid_field(&config), "auth.tokens[1].sha256");
    }

    #[test]
    fn load_resolves_relative_paths_against_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.toml");
        std::fs::write(&path, MINIMAL).unwrap();
        let config = load(&path).unwrap();
        let base = std::path::absolute(dir.path()).unwrap();
        assert_eq!(config.data_dir, base.join("data"));
        assert_eq!(config.tls.ca_cert, base.join("certs/ca.pem"));

        let error = load(&dir.path().join("absent.toml")).unwrap_err();
        assert!(matches!(error, ConfigError::Read { .. }), "{error}");

        let text = MINIMAL.replace("node_id = 1", "node_id = 9");
        std::fs::write(&path, text).unwrap();
        let message = load(&path).unwrap_err().to_string();
        assert!(
            message.contains("node.toml: invalid `node_id`"),
            "{message}"
        );
    }
}
