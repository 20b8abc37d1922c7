//! Following the cluster's node table, once a second: a node hosting a replica of the metadata
//! group reads the table from it (and, as its leader, records the configured peers when the
//! table was never recorded: a new cluster, or an existing cluster's first start with this
//! build); the others ask another node. Then the node reports itself (`NodeUp`: addresses,
//! certificate, data directory incarnation) whenever the table does not show it as it is, which
//! turns a `Joining` or `Dead` node `Active`.
//!
//! Must not depend on: the request path's lease routing, the other background loops.

use std::sync::Arc;
use std::time::Duration;

use tenure_core::{ClusterOp, METADATA_GROUP, NodeAddresses, NodeRecord, NodeState};
use tokio::time::Instant;
use tracing::{error, info, warn};

use crate::shared::NodeShared;

/// Every state, for the per-state gauge.
const NODE_STATES: [NodeState; 5] = [
    NodeState::Joining,
    NodeState::Active,
    NodeState::Draining,
    NodeState::Dead,
    NodeState::Removed,
];

/// How often the table is read or fetched.
const SYNC_INTERVAL: Duration = Duration::from_secs(1);
/// Shortest time between two reports of this node.
const REPORT_INTERVAL_MIN: Duration = Duration::from_secs(2);
/// Every this many rounds a node whose group 0 replica does not lead asks the others too.
const STALE_REPLICA_CHECK_ROUNDS: u64 = 10;
/// How often a standing problem (not in the table, removed) is logged again.
const COMPLAINT_INTERVAL: Duration = Duration::from_secs(30);

/// How long one `ClusterNodes` question may take while the replica gate is pending.
const GATE_CALL_TIMEOUT: Duration = Duration::from_secs(3);

/// Settles a pending replica gate (`crate::replica_gate`) on a data directory's first start.
/// Returns true once the gate is open, false when this node was excluded.
///
/// While no other node knows a node table (every other node answered with version 0) the
/// cluster is new and nobody has state to lose: the gate opens. Once one does, the table
/// decides through this node's `NodeUp`: accepted (this incarnation, or one the table never
/// recorded) opens the gate; refused (another incarnation of this id, a removed node) excludes
/// the node. Anything else (no answer, no metadata leader) is asked again every second, and
/// whom it waits for is said every 30 s.
pub(crate) async fn settle_replica_gate(shared: &Arc<NodeShared>) -> bool {
    let me = shared.config.node_id;
    let gate = &shared.replica_gate;
    let mut last_said: Option<Instant> = None;
    let mut table_exists = false;
    loop {
        if gate.is_open() {
            return true;
        }
        if gate.is_excluded() {
            return false;
        }
        let say = last_said.is_none_or(|at| at.elapsed() >= COMPLAINT_INTERVAL);
        if !table_exists {
            let others = shared.other_nodes();
            let mut silent = Vec::new();
            for &peer in &others {
                match shared
                    .ask_node(
                        peer,
                        tenure_proto::client::RequestBody::ClusterNodes,
                        GATE_CALL_TIMEOUT,
                    )
                    .await
                {
                    Ok(tenure_proto::client::ResponseBody::Cluster(meta)) => {
                        if meta.version > 0 {
                            shared.adopt_cluster_view(meta);
                            table_exists = true;
                            break;
                        }
                    }
                    _ => silent.push(peer),
                }
            }
            if !table_exists {
                if silent.is_empty() {
                    info!(
                        node = me,
                        "no node knows a node table yet (a new cluster): this node's replicas \
                         are open to its peers"
                    );
                    return gate.open();
                }
                if say {
                    last_said = Some(Instant::now());
                    warn!(
                        node = me,
                        waiting = ?silent,
                        "first start of this data directory: its replicas stay closed until \
                         every other node answers (a new cluster) or the node table admits it"
                    );
                }
                tokio::time::sleep(SYNC_INTERVAL).await;
                continue;
            }
        }
        let Some(op) = node_up(shared) else {
            return exclude(
                shared,
                "this node is not in its own configured peers".into(),
            );
        };
        match shared.cluster_change_anywhere(op).await {
            Ok(change) => {
                info!(
                    node = me,
                    version = change.version,
                    incarnation = shared.incarnation,
                    "the node table admitted this data directory: this node's replicas are open \
                     to its peers"
                );
                return gate.open();
            }
            Err(error) if error.code == tenure_core::ErrorCode::Forbidden => {
                // A node whose view does not list this one yet (announced a moment ago) refuses
                // too: only the table itself excludes.
                shared.fetch_cluster_view().await;
                if let Some(reason) = table_refusal(shared) {
                    return exclude(shared, reason);
                }
                if say {
                    last_said = Some(Instant::now());
                    warn!(
                        node = me,
                        "first start of this data directory: its report was refused ({error}); \
                         the node table does not refuse it (yet): asking again"
                    );
                }
                tokio::time::sleep(SYNC_INTERVAL).await;
            }
            Err(error) => {
                if say {
                    last_said = Some(Instant::now());
                    warn!(
                        node = me,
                        "first start of this data directory: its replicas stay closed until the \
                         node table admits it ({error})"
                    );
                }
                tokio::time::sleep(SYNC_INTERVAL).await;
            }
        }
    }
}

/// Why the node table, as this node's view has it, refuses this node's data directory: the
/// node was removed, its certificate revoked, or its id is known with another incarnation.
fn table_refusal(shared: &NodeShared) -> Option<String> {
    let me = shared.config.node_id;
    let view = shared.cluster_view();
    if view.revoked.contains_key(&shared.cert_sha256) {
        return Some(format!("node {me}'s certificate was revoked"));
    }
    let record = view.node(me)?;
    if record.state == NodeState::Removed {
        return Some(format!("node {me} was removed from the cluster"));
    }
    if record.incarnation != 0 && record.incarnation != shared.incarnation {
        return Some(format!(
            "node {me} is known with another data directory (incarnation {}, this one {})",
            record.incarnation, shared.incarnation
        ));
    }
    None
}

/// Excludes this node: closes the replica gate for good, stops its replicas and its transport
/// (peers then see it unreachable, and the placement controller re-creates its replicas after
/// `node_dead_after_ms`). Returns false (the gate did not open).
fn exclude(shared: &Arc<NodeShared>, reason: String) -> bool {
    let me = shared.config.node_id;
    if !shared.replica_gate.exclude(reason.clone()) {
        return false;
    }
    ::metrics::counter!(crate::metrics::NODE_EXCLUSIONS_TOTAL).increment(1);
    error!(
        node = me,
        "EXCLUDED: {reason}. This node stops serving: a member that lost its data must not vote \
         or acknowledge under its old id. Remove it (`tenurectl node remove {me}`) and start it \
         as a new node (a new node_id, `cluster.join_existing = true`)"
    );
    let shared = shared.clone();
    tokio::spawn(async move {
        for handle in shared.hosted() {
            handle.stop().await;
        }
        shared.transport.shutdown().await;
    });
    false
}

/// Runs until the node shuts down.
pub(crate) async fn run_cluster_sync(shared: Arc<NodeShared>) {
    let me = shared.config.node_id;
    let mut rounds = super::Rounds::every(SYNC_INTERVAL);
    let mut last_report: Option<Instant> = None;
    let mut report_every = REPORT_INTERVAL_MIN;
    let mut last_complaint: Option<Instant> = None;
    let mut round: u64 = 0;
    while rounds.next(&shared).await {
        round += 1;
        match shared.group(METADATA_GROUP.0) {
            Some(handle) => {
                let meta = handle.cluster_meta();
                let leads = handle.is_ready_leader();
                if meta.version == 0 && leads && !shared.config.cluster.join_existing {
                    record_configured_peers(&shared).await;
                } else {
                    shared.adopt_cluster_view(meta);
                }
                // A replica that stopped receiving group 0's log (removed from it while down,
                // not collected yet) must not freeze the view: ask the others now and then.
                if !leads && round % STALE_REPLICA_CHECK_ROUNDS == 0 {
                    shared.fetch_cluster_view().await;
                }
            }
            None => shared.fetch_cluster_view().await,
        }
        let view = shared.cluster_view();
        for state in NODE_STATES {
            let count = view.nodes.values().filter(|n| n.state == state).count();
            ::metrics::gauge!(crate::metrics::CLUSTER_NODES, "state" => state.as_str())
                .set(count as f64);
        }
        if view.version == 0 {
            continue;
        }
        let complain = last_complaint.is_none_or(|at| at.elapsed() >= COMPLAINT_INTERVAL);
        match view.node(me) {
            None => {
                if complain {
                    last_complaint = Some(Instant::now());
                    warn!(
                        node = me,
                        "this node is not in the cluster's node table (version {}): announce it \
                         with `tenurectl node add {me} --addr ... --http-addr ...`",
                        view.version
                    );
                }
            }
            Some(record) if record.state == NodeState::Removed => {
                if complain {
                    last_complaint = Some(Instant::now());
                    error!(
                        node = me,
                        "this node was removed from the cluster: every node refuses it; stop it \
                         (a replacement joins under a new id)"
                    );
                }
            }
            Some(record) if record.incarnation != 0 && record.incarnation != shared.incarnation => {
                // The table knows this id with another data directory: whatever this one holds
                // is not what the others count on.
                exclude(
                    &shared,
                    format!(
                        "the node table knows node {me} with another data directory \
                         (incarnation {}, this one {})",
                        record.incarnation, shared.incarnation
                    ),
                );
            }
            Some(record) => {
                if needs_report(&shared, record)
                    && last_report.is_none_or(|at| at.elapsed() >= report_every)
                {
                    last_report = Some(Instant::now());
                    // A refusal (another incarnation, a revoked certificate) will not change by
                    // asking again soon: back off to the complaint interval.
                    report_every = if report(&shared).await {
                        REPORT_INTERVAL_MIN
                    } else {
                        COMPLAINT_INTERVAL
                    };
                }
            }
        }
    }
}

/// This node's addresses as configured.
fn own_addresses(shared: &NodeShared) -> Option<NodeAddresses> {
    let me = shared.config.node_id;
    shared.config.peers.get(&me).map(|peer| NodeAddresses {
        node_id: me,
        addr: peer.addr.to_string(),
        http_addr: peer.http_addr.to_string(),
    })
}

fn needs_report(shared: &NodeShared, record: &NodeRecord) -> bool {
    let Some(own) = own_addresses(shared) else {
        return false;
    };
    matches!(record.state, NodeState::Joining | NodeState::Dead)
        || record.cert_sha256 != Some(shared.cert_sha256)
        || record.incarnation != shared.incarnation
        || record.addr != own.addr
        || record.http_addr != own.http_addr
}

/// Reports this node; false when the table refused it (not for a transient failure).
/// This node's report of itself (addresses, certificate, data directory incarnation); `None`
/// when it is not in its own configured peers.
fn node_up(shared: &NodeShared) -> Option<ClusterOp> {
    own_addresses(shared).map(|own| ClusterOp::NodeUp {
        node: own,
        cert_sha256: shared.cert_sha256,
        incarnation: shared.incarnation,
    })
}

async fn report(shared: &NodeShared) -> bool {
    let Some(op) = node_up(shared) else {
        return true;
    };
    let result = shared.cluster_change_from_here(op).await;
    let refused = matches!(&result, Err(error) if error.code == tenure_core::ErrorCode::Forbidden);
    log_change(
        shared,
        result,
        "reported this node to the cluster's node table",
        "reporting this node to the node table failed",
    );
    !refused
}

fn log_change(
    shared: &NodeShared,
    result: Result<tenure_core::ClusterChange, tenure_proto::client::WireError>,
    done: &str,
    failed: &str,
) {
    match result {
        Ok(change) => info!(
            node = shared.config.node_id,
            version = change.version,
            "{done}"
        ),
        Err(error) => warn!(node = shared.config.node_id, "{failed}: {error}"),
    }
}

async fn record_configured_peers(shared: &NodeShared) {
    let nodes = shared
        .config
        .peers
        .iter()
        .map(|(&node_id, peer)| NodeAddresses {
            node_id,
            addr: peer.addr.to_string(),
            http_addr: peer.http_addr.to_string(),
        })
        .collect();
    log_change(
        shared,
        shared
            .propose_cluster_change(ClusterOp::Record { nodes })
            .await,
        "recorded the configured peers as the cluster's node table",
        "recording the node table failed (next second again)",
    );
}
