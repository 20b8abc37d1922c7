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

/// How often the table is read or fetched.
const SYNC_INTERVAL: Duration = Duration::from_secs(1);
/// Shortest time between two reports of this node.
const REPORT_INTERVAL_MIN: Duration = Duration::from_secs(2);
/// How often a standing problem (not in the table, removed) is logged again.
const COMPLAINT_INTERVAL: Duration = Duration::from_secs(30);

/// Runs until the node shuts down.
pub(crate) async fn run_cluster_sync(shared: Arc<NodeShared>) {
    let me = shared.config.node_id;
    let mut rounds = super::Rounds::every(SYNC_INTERVAL);
    let mut last_report: Option<Instant> = None;
    let mut last_complaint: Option<Instant> = None;
    while rounds.next(&shared).await {
        match shared.group(METADATA_GROUP.0) {
            Some(handle) => {
                let meta = handle.cluster_meta();
                if meta.version == 0
                    && handle.is_ready_leader()
                    && !shared.config.cluster.join_existing
                {
                    record_configured_peers(&shared).await;
                } else {
                    shared.adopt_cluster_view(meta);
                }
            }
            None => shared.fetch_cluster_view().await,
        }
        let view = shared.cluster_view();
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
            Some(record) => {
                if needs_report(&shared, record)
                    && last_report.is_none_or(|at| at.elapsed() >= REPORT_INTERVAL_MIN)
                {
                    last_report = Some(Instant::now());
                    report(&shared).await;
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

async fn report(shared: &NodeShared) {
    let Some(own) = own_addresses(shared) else {
        return;
    };
    let op = ClusterOp::NodeUp {
        node: own,
        cert_sha256: shared.cert_sha256,
        incarnation: shared.incarnation,
    };
    log_change(
        shared,
        shared.cluster_change_from_here(op).await,
        "reported this node to the cluster's node table",
        "reporting this node to the node table failed",
    );
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
