//! Metric names (all prefixed `tenure_`) and the process-wide Prometheus exporter.
//!
//! Counters and histograms are recorded where things happen through the `metrics` crate's
//! macros; gauges that summarise state (groups led, active leases, apply lag, storage and
//! transport counters) are refreshed once a second by the node. `GET /metrics` renders the text
//! exposition from the handle installed here.
//!
//! Must not depend on: the groups or the wire; this module only names and exports.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Client requests by `op` and `result` (`ok` or an error code).
pub const REQUESTS_TOTAL: &str = "tenure_requests_total";
/// Request latency in seconds by `op`.
pub const REQUEST_DURATION_SECONDS: &str = "tenure_request_duration_seconds";
/// Requests forwarded to another node, by `op`.
pub const REQUESTS_FORWARDED_TOTAL: &str = "tenure_requests_forwarded_total";
/// HTTP connections open on this node's gateway.
pub const HTTP_CONNECTIONS_OPEN: &str = "tenure_http_connections_open";
/// HTTP connections refused at once because a connection cap was reached.
pub const HTTP_CONNECTIONS_REFUSED_TOTAL: &str = "tenure_http_connections_refused_total";
/// Requests in flight on this node.
pub const REQUESTS_INFLIGHT: &str = "tenure_requests_inflight";
/// Log entries proposed carrying lease operations.
pub const RAFT_PROPOSALS_TOTAL: &str = "tenure_raft_proposals_total";
/// Lease operations proposed (many per entry).
pub const RAFT_PROPOSED_OPS_TOTAL: &str = "tenure_raft_proposed_ops_total";
/// Lease operations per proposed entry.
pub const RAFT_OPS_PER_ENTRY: &str = "tenure_raft_ops_per_entry";
/// Lease entries committed and applied.
pub const RAFT_COMMITS_TOTAL: &str = "tenure_raft_commits_total";
/// Entries committed but not yet applied, summed over hosted groups.
pub const APPLY_LAG_ENTRIES: &str = "tenure_apply_lag_entries";
/// Groups this node leads.
pub const GROUPS_LED: &str = "tenure_groups_led";
/// Groups this node hosts.
pub const GROUPS_HOSTED: &str = "tenure_groups_hosted";
/// Active leases in the groups this node leads.
pub const ACTIVE_LEASES: &str = "tenure_active_leases";
/// Leases reclaimed by Expire commands (and by acquires that reclaimed first) this node proposed.
pub const EXPIRATIONS_TOTAL: &str = "tenure_expirations_total";
/// Of those, leases bound to a session that ended (expired or closed), reclaimed a bounded
/// number per entry. Counted, like `EXPIRATIONS_TOTAL`, by the node that proposed the entry when
/// its proposal is answered: sum it over the nodes; an entry that commits only after its
/// proposer lost the leadership is not counted.
pub const SESSION_LEASES_ENDED_TOTAL: &str = "tenure_session_leases_ended_total";
/// Queued waits granted by a hand-off (a release or expiry that passed the resource to its first
/// live waiter in the same apply). Counted by every replica that applies the entry, leader or
/// follower: divide the cluster's sum by the replication factor.
pub const WAIT_HAND_OFFS_TOTAL: &str = "tenure_wait_hand_offs_total";
/// AcquireWait calls parked on this node until their wait ends (bounded per node).
pub const WAITS_PARKED: &str = "tenure_waits_parked";
/// Watch events recorded in this node's rings (every replica records the events of the entries
/// it applies: divide the cluster's sum by the replication factor).
pub const WATCH_EVENTS_TOTAL: &str = "tenure_watch_events_total";
/// Watch rings emptied because the replica's applied index jumped (a snapshot install): polls
/// from before are answered `resync`.
pub const WATCH_RING_RESETS_TOTAL: &str = "tenure_watch_ring_resets_total";
/// Watch polls answered `resync` (the watcher asked for events no longer retained).
pub const WATCH_RESYNCS_TOTAL: &str = "tenure_watch_resyncs_total";
/// Watch polls held open on this node (bounded per node).
pub const WATCH_POLLS_PARKED: &str = "tenure_watch_polls_parked";
/// WAL syncs of this node's storage.
pub const FSYNCS_TOTAL: &str = "tenure_fsyncs_total";
/// Log entries made durable per WAL sync (since start).
pub const ENTRIES_PER_FSYNC: &str = "tenure_entries_per_fsync";
/// Peer transport frames sent.
pub const TRANSPORT_FRAMES_TOTAL: &str = "tenure_transport_frames_total";
/// Raft messages sent over the peer transport.
pub const TRANSPORT_MESSAGES_TOTAL: &str = "tenure_transport_messages_total";
/// AppendEntries requests of replication streams this node sent (one per follower per message).
pub const TRANSPORT_APPEND_REQUESTS_TOTAL: &str = "tenure_transport_append_requests_total";
/// Log entries those AppendEntries requests carried.
pub const TRANSPORT_APPEND_ENTRIES_TOTAL: &str = "tenure_transport_append_entries_total";
/// Replication-stream AppendEntries requests without entries (commit index or probe only).
pub const TRANSPORT_APPEND_REQUESTS_WITHOUT_ENTRIES_TOTAL: &str =
    "tenure_transport_append_requests_without_entries_total";
/// Entry-less AppendEntries requests (a commit index only) never sent because the replication
/// stream's next request (usually the group's next entry) carried their commit index within the
/// commit linger.
pub const TRANSPORT_APPEND_COMMITS_CARRIED_TOTAL: &str =
    "tenure_transport_append_commits_carried_total";
/// WAL sync durations, in seconds (recorded by the storage's RocksDB flusher, an injected
/// slow-disk delay included).
pub const FSYNC_DURATION_SECONDS: &str = tenure_storage::FSYNC_DURATION_SECONDS_METRIC;
/// Raft messages per transport frame (since start).
pub const TRANSPORT_MESSAGES_PER_FRAME: &str = "tenure_transport_messages_per_frame";
/// Leadership transfers this node started to balance leaders or to shut down.
pub const LEADER_TRANSFERS_TOTAL: &str = "tenure_leader_transfers_total";
/// Renewals carried by one client request (Batch requests count each item).
pub const RENEWALS_PER_REQUEST: &str = "tenure_renewals_per_request";
/// Seconds spent in WAL syncs since start. Exported as a gauge holding a cumulative value (the
/// `metrics` crate's counters are integers); `rate()` of it over `rate(tenure_fsyncs_total)` is
/// the average sync latency.
pub const FSYNC_SECONDS_TOTAL: &str = "tenure_fsync_seconds_total";
/// Renewals that reached this node, as leader, with less than `late_renewal_remaining_percent`
/// of their ttl left (one sampled per request: its first renewal, the most urgent of a client
/// library's batch).
pub const RENEWALS_LATE_TOTAL: &str = "tenure_renewals_late_total";
/// Renewals sampled for lateness (the denominator of `RENEWALS_LATE_TOTAL`).
pub const RENEWALS_SAMPLED_TOTAL: &str = "tenure_renewals_sampled_total";
/// New acquires refused with OVERLOADED because their tenant's renewals were arriving late
/// while the node was short of capacity.
pub const ACQUIRES_REFUSED_RENEWAL_PRESSURE_TOTAL: &str =
    "tenure_acquires_refused_renewal_pressure_total";
/// Tenants whose new acquires this node refuses now because their renewals arrive late (while it
/// is short of capacity).
pub const RENEWAL_PRESSURE_TENANTS: &str = "tenure_renewal_pressure_tenants";
/// Mean time this node's lease proposals took to be answered (each sample capped at ten times
/// `late_renewal_loaded_proposal_ms`), the higher of the last one-second window's and the current
/// one's so far: the load signal that lets late renewals refuse acquires, in seconds. 0 with the
/// renewal pressure off.
pub const LEASE_PROPOSAL_MEAN_SECONDS: &str = "tenure_lease_proposal_mean_seconds";
/// Groups whose leader this node does not know.
pub const GROUPS_WITHOUT_LEADER: &str = "tenure_groups_without_leader";
/// Leader changes of hosted groups seen by this node (a new leader, or none).
pub const LEADER_CHANGES_TOTAL: &str = "tenure_leader_changes_total";
/// Seconds from proposing a lease entry to its being applied (committed on a quorum), per entry.
pub const COMMIT_DURATION_SECONDS: &str = "tenure_commit_duration_seconds";
/// Over the groups this node leads: how far, in log-time seconds, the oldest expired lease not
/// yet reclaimed is past its expiry (0 when none is).
pub const EXPIRY_OVERDUE_SECONDS: &str = "tenure_expiry_overdue_seconds";
/// The node certificate's notAfter, as Unix seconds.
pub const CERTIFICATE_EXPIRY_TIMESTAMP_SECONDS: &str =
    "tenure_certificate_expiry_timestamp_seconds";
/// Bytes available to this process on the data directory's filesystem.
pub const DATA_DIR_AVAILABLE_BYTES: &str = "tenure_data_dir_available_bytes";
/// Size of the data directory's filesystem, in bytes.
pub const DATA_DIR_TOTAL_BYTES: &str = "tenure_data_dir_total_bytes";
/// 1 when the node is ready (as `GET /readyz`), else 0.
pub const NODE_READY: &str = "tenure_node_ready";
/// Times this node was excluded from the cluster: its data directory is not the one the node
/// table knows for its id (a member that lost its data; `crate::replica_gate`). Never 0 -> 1 in
/// a healthy cluster.
pub const NODE_EXCLUSIONS_TOTAL: &str = "tenure_node_exclusions_total";
/// Replicas this node created at run time (a membership change added it to a group).
pub const REPLICAS_CREATED_TOTAL: &str = "tenure_replicas_created_total";
/// Replicas this node dropped at run time (it left a group).
pub const REPLICAS_DROPPED_TOTAL: &str = "tenure_replicas_dropped_total";
/// Replica moves this node ran as a group's leader, by `result` (`ok` or an error code).
pub const REPLICA_MOVES_TOTAL: &str = "tenure_replica_moves_total";
/// Replica moves running on this node now.
pub const REPLICA_MOVES_INFLIGHT: &str = "tenure_replica_moves_inflight";
/// Groups this node leads with fewer voters than the configured replication factor, or in the
/// middle of a joint membership change.
pub const GROUPS_UNDER_REPLICATED: &str = "tenure_groups_under_replicated";
/// Nodes in the cluster's node table, by `state` (`joining`, `active`, `draining`, `dead`,
/// `removed`), as this node's view has them (every node exports the same numbers).
pub const CLUSTER_NODES: &str = "tenure_cluster_nodes";
/// The placement controller's decisions, by `kind` (`dead`, `evacuate`, `rebalance`,
/// `leaders`).
pub const PLACEMENT_DECISIONS_TOTAL: &str = "tenure_placement_decisions_total";
/// Replicas (voters and learners) per node, by `node`, as the placement controller last counted
/// them (exported by the controller's node only).
pub const NODE_REPLICAS: &str = "tenure_node_replicas";
/// Groups led per node, by `node`, as the placement controller last counted them (exported by
/// the controller's node only).
pub const NODE_LEADERS: &str = "tenure_node_leaders";
/// The node process's resident set size, in bytes (Linux `/proc/self/statm`; 0 where that file
/// does not exist).
pub const PROCESS_RESIDENT_MEMORY_BYTES: &str = "tenure_process_resident_memory_bytes";
/// Lease records (active and retained inactive) in every group this node hosts, leader or not.
pub const STATE_LEASE_RECORDS: &str = "tenure_state_lease_records";
/// Request-id records in every group this node hosts, leader or not.
pub const STATE_DEDUP_RECORDS: &str = "tenure_state_dedup_records";
/// Snapshots this node built (a build with nothing new to write is not counted).
pub const SNAPSHOT_BUILDS_TOTAL: &str = "tenure_snapshot_builds_total";
/// Seconds those builds took, from taking the group's snapshot exclusion (after the freeze) to
/// the durable pointer (a gauge holding a cumulative value, like `FSYNC_SECONDS_TOTAL`).
pub const SNAPSHOT_BUILD_SECONDS_TOTAL: &str = "tenure_snapshot_build_seconds_total";
/// The longest build since the node started, in seconds.
pub const SNAPSHOT_BUILD_SECONDS_MAX: &str = "tenure_snapshot_build_seconds_max";
/// The largest snapshot built since the node started, in bytes.
pub const SNAPSHOT_BYTES_MAX: &str = "tenure_snapshot_bytes_max";
/// Bytes of every snapshot built since start.
pub const SNAPSHOT_WRITTEN_BYTES_TOTAL: &str = "tenure_snapshot_written_bytes_total";
/// The longest time one build's freeze stopped a group's apply since the node started, in seconds,
/// wall time from asking for the state lock to releasing it (the freeze runs on the apply task
/// between two entries). Issue 25's bound is 10 ms.
/// The chunk copies the first entries after a freeze make inside their own apply are in
/// `SNAPSHOT_SHARED_APPLY_SECONDS_MAX`.
pub const SNAPSHOT_APPLY_PAUSE_SECONDS_MAX: &str = "tenure_snapshot_apply_pause_seconds_max";
/// Builds whose freeze stopped a group's apply for more than 10 ms.
pub const SNAPSHOT_APPLY_PAUSES_OVER_10MS_TOTAL: &str =
    "tenure_snapshot_apply_pauses_over_10ms_total";
/// The longest apply of one entry while a snapshot build's frozen copy of its group was alive
/// (the copy-on-write chunk copies land in that apply) since the node started, in seconds.
pub const SNAPSHOT_SHARED_APPLY_SECONDS_MAX: &str = "tenure_snapshot_shared_apply_seconds_max";
/// The most CPU time the applying thread spent in one build's freeze since the node started, in
/// seconds: beside the wall time of `SNAPSHOT_APPLY_PAUSE_SECONDS_MAX`, the difference is the
/// thread waiting for a core (or for the state lock, held by a reader).
pub const SNAPSHOT_APPLY_PAUSE_CPU_SECONDS_MAX: &str =
    "tenure_snapshot_apply_pause_cpu_seconds_max";
/// The most CPU time one entry's apply took while a frozen copy was alive, in seconds.
pub const SNAPSHOT_SHARED_APPLY_CPU_SECONDS_MAX: &str =
    "tenure_snapshot_shared_apply_cpu_seconds_max";
/// Entries applied while a frozen copy was alive that took more than 10 ms.
pub const SNAPSHOT_SHARED_APPLIES_OVER_10MS_TOTAL: &str =
    "tenure_snapshot_shared_applies_over_10ms_total";
/// The longest freeze pause less the applying thread's wait for a core in it (Linux's
/// `/proc/thread-self/schedstat`; stays 0 where the kernel does not say), in seconds: the
/// freeze's own work and any wait for the state lock, without the machine's scheduling.
pub const SNAPSHOT_APPLY_PAUSE_LESS_CORE_WAIT_SECONDS_MAX: &str =
    "tenure_snapshot_apply_pause_less_core_wait_seconds_max";
/// Freezes whose pause less the applying thread's wait for a core was over 10 ms.
pub const SNAPSHOT_APPLY_PAUSES_LESS_CORE_WAIT_OVER_10MS_TOTAL: &str =
    "tenure_snapshot_apply_pauses_less_core_wait_over_10ms_total";
/// The longest apply of one entry beside a frozen copy less the thread's wait for a core in it,
/// in seconds.
pub const SNAPSHOT_SHARED_APPLY_LESS_CORE_WAIT_SECONDS_MAX: &str =
    "tenure_snapshot_shared_apply_less_core_wait_seconds_max";
/// Entries applied beside a frozen copy whose apply less the wait for a core was over 10 ms.
pub const SNAPSHOT_SHARED_APPLIES_LESS_CORE_WAIT_OVER_10MS_TOTAL: &str =
    "tenure_snapshot_shared_applies_less_core_wait_over_10ms_total";

/// Every counter the node exports (registered at zero at start, so dashboards and alerts see
/// them before the first event).
pub const COUNTERS: &[&str] = &[
    REQUESTS_TOTAL,
    REQUESTS_FORWARDED_TOTAL,
    RAFT_PROPOSALS_TOTAL,
    RAFT_PROPOSED_OPS_TOTAL,
    RAFT_COMMITS_TOTAL,
    EXPIRATIONS_TOTAL,
    SESSION_LEASES_ENDED_TOTAL,
    WAIT_HAND_OFFS_TOTAL,
    WATCH_EVENTS_TOTAL,
    WATCH_RING_RESETS_TOTAL,
    WATCH_RESYNCS_TOTAL,
    FSYNCS_TOTAL,
    TRANSPORT_FRAMES_TOTAL,
    TRANSPORT_MESSAGES_TOTAL,
    TRANSPORT_APPEND_REQUESTS_TOTAL,
    TRANSPORT_APPEND_ENTRIES_TOTAL,
    TRANSPORT_APPEND_REQUESTS_WITHOUT_ENTRIES_TOTAL,
    TRANSPORT_APPEND_COMMITS_CARRIED_TOTAL,
    LEADER_TRANSFERS_TOTAL,
    LEADER_CHANGES_TOTAL,
    HTTP_CONNECTIONS_REFUSED_TOTAL,
    RENEWALS_SAMPLED_TOTAL,
    RENEWALS_LATE_TOTAL,
    ACQUIRES_REFUSED_RENEWAL_PRESSURE_TOTAL,
    REPLICAS_CREATED_TOTAL,
    REPLICAS_DROPPED_TOTAL,
    REPLICA_MOVES_TOTAL,
    PLACEMENT_DECISIONS_TOTAL,
    NODE_EXCLUSIONS_TOTAL,
    SNAPSHOT_BUILDS_TOTAL,
    SNAPSHOT_WRITTEN_BYTES_TOTAL,
    SNAPSHOT_APPLY_PAUSES_OVER_10MS_TOTAL,
    SNAPSHOT_SHARED_APPLIES_OVER_10MS_TOTAL,
    SNAPSHOT_APPLY_PAUSES_LESS_CORE_WAIT_OVER_10MS_TOTAL,
    SNAPSHOT_SHARED_APPLIES_LESS_CORE_WAIT_OVER_10MS_TOTAL,
];

/// Every gauge the node exports (registered at zero at start).
pub const GAUGES: &[&str] = &[
    REQUESTS_INFLIGHT,
    WAITS_PARKED,
    WATCH_POLLS_PARKED,
    HTTP_CONNECTIONS_OPEN,
    APPLY_LAG_ENTRIES,
    GROUPS_LED,
    GROUPS_HOSTED,
    ACTIVE_LEASES,
    ENTRIES_PER_FSYNC,
    TRANSPORT_MESSAGES_PER_FRAME,
    FSYNC_SECONDS_TOTAL,
    GROUPS_WITHOUT_LEADER,
    EXPIRY_OVERDUE_SECONDS,
    CERTIFICATE_EXPIRY_TIMESTAMP_SECONDS,
    DATA_DIR_AVAILABLE_BYTES,
    DATA_DIR_TOTAL_BYTES,
    NODE_READY,
    RENEWAL_PRESSURE_TENANTS,
    LEASE_PROPOSAL_MEAN_SECONDS,
    REPLICA_MOVES_INFLIGHT,
    GROUPS_UNDER_REPLICATED,
    PROCESS_RESIDENT_MEMORY_BYTES,
    STATE_LEASE_RECORDS,
    STATE_DEDUP_RECORDS,
    SNAPSHOT_BUILD_SECONDS_TOTAL,
    SNAPSHOT_BUILD_SECONDS_MAX,
    SNAPSHOT_BYTES_MAX,
    SNAPSHOT_APPLY_PAUSE_SECONDS_MAX,
    SNAPSHOT_SHARED_APPLY_SECONDS_MAX,
    SNAPSHOT_APPLY_PAUSE_CPU_SECONDS_MAX,
    SNAPSHOT_SHARED_APPLY_CPU_SECONDS_MAX,
    SNAPSHOT_APPLY_PAUSE_LESS_CORE_WAIT_SECONDS_MAX,
    SNAPSHOT_SHARED_APPLY_LESS_CORE_WAIT_SECONDS_MAX,
];

/// Every histogram the node exports (they appear after their first observation).
pub const HISTOGRAMS: &[&str] = &[
    REQUEST_DURATION_SECONDS,
    RAFT_OPS_PER_ENTRY,
    RENEWALS_PER_REQUEST,
    COMMIT_DURATION_SECONDS,
    FSYNC_DURATION_SECONDS,
];

/// Registers every counter and gauge at zero.
pub fn register_all() {
    for &name in COUNTERS {
        match name {
            // Labelled: register one labelled series rather than an unlabelled one.
            REQUESTS_TOTAL => {
                ::metrics::counter!(name, "op" => "acquire", "result" => "ok").increment(0);
            }
            REQUESTS_FORWARDED_TOTAL => {
                ::metrics::counter!(name, "op" => "acquire").increment(0);
            }
            REPLICA_MOVES_TOTAL => {
                ::metrics::counter!(name, "result" => "ok").increment(0);
            }
            _ => ::metrics::counter!(name).increment(0),
        }
    }
    for &name in GAUGES {
        ::metrics::gauge!(name).increment(0.0);
    }
}

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Installs the process-wide Prometheus recorder once and returns its handle (`None` when
/// another recorder was installed first).
pub fn install() -> Option<PrometheusHandle> {
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets(&[
                    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
                ])
                .ok()?
                .set_buckets_for_metric(
                    Matcher::Full(RENEWALS_PER_REQUEST.to_string()),
                    &[
                        1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 4096.0,
                    ],
                )
                .ok()?
                .build_recorder();
            let handle = recorder.handle();
            ::metrics::set_global_recorder(recorder).ok()?;
            Some(handle)
        })
        .clone()
}
