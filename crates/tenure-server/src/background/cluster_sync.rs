//! Following the cluster's node table, once a second: a node hosting a replica of the metadata
//! group reads the table from it (and, as its leader, records the configured peers when the
//! table was never recorded: a new cluster, or an existing cluster's first start with this
//! build); the others ask another node. Then the node reports itself (`NodeUp`: addresses,
//! certificate, data directory incarnation) whenever the table does not show it as it is, which
//! turns a `Joining` or `Dead` node `Active`.
//!
//! Must not depend on: the request path's lease routing, the other background loops.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tenure_core::{ClusterOp, FounderNode, METADATA_GROUP, NodeAddresses, NodeRecord, NodeState};
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

/// How long a founder excluded before any node table existed keeps answering once it learned
/// of one: a founder whose gate opened just before the table was recorded still asks every
/// node's `Status` before founding its groups (`crate::membership::bootstrap`).
pub(crate) const EXCLUDED_LINGER_AFTER_TABLE: Duration = Duration::from_secs(30);

/// How long one `ClusterNodes` question may take while the replica gate is pending.
const GATE_CALL_TIMEOUT: Duration = Duration::from_secs(3);

/// Settles a pending replica gate (`crate::replica_gate`) on a data directory's first start.
/// Returns true once the gate is open, false when this node was excluded.
///
/// While no other node knows a node table (every other node answered with version 0) the
/// cluster is new: unless one of them pinned this node with another data directory (then it is
/// excluded), the founders' incarnations are pinned durably (`crate::founders`) and the gate
/// opens. Once one does, the table
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
            // Two passes: first what each node says of itself, then what each has pinned (a
            // pin read after a self-report is as new as that report: a founder that served with
            // a node's old directory pinned it before it served, so before the node was wiped,
            // so before the first pass heard the new directory).
            let first = ask_versions_zero(shared, &others).await;
            let second = match &first {
                PassOutcome::Answers(_) => ask_versions_zero(shared, &others).await,
                _ => PassOutcome::Silent(Vec::new()),
            };
            let (first, second) = if shared
                .config
                .testing
                .negative_control
                .breaks(tenure_core::NegativeControl::IgnoreFounderPins)
            {
                (first.self_reports_only(), second.self_reports_only())
            } else {
                (first, second)
            };
            let silent = match read_passes(
                me,
                shared.incarnation,
                |node| shared.config.peers.contains_key(&node),
                first,
                second,
            ) {
                Founding::Table(meta) => {
                    shared.adopt_cluster_view(meta);
                    table_exists = true;
                    Vec::new()
                }
                Founding::PinnedOtherwise(reason) => return exclude(shared, reason),
                Founding::Wait(silent) => silent,
                Founding::New { reported } => {
                    if shared.config.cluster.join_existing {
                        // A node that joins an existing cluster never founds one: it is
                        // announced in a table (`AddNode`), so it waits for that table.
                        Vec::new()
                    } else {
                        match found(shared, reported) {
                            Ok(()) => return gate.open(),
                            Err(error) => {
                                error!(
                                    node = me,
                                    "cannot pin the founders' data directories ({error}); this \
                                     node's replicas stay closed (next second again)"
                                );
                                tokio::time::sleep(SYNC_INTERVAL).await;
                                continue;
                            }
                        }
                    }
                }
            };
            if !table_exists {
                if say {
                    last_said = Some(Instant::now());
                    warn!(
                        node = me,
                        waiting = ?silent,
                        joining = shared.config.cluster.join_existing,
                        "first start of this data directory: its replicas stay closed until \
                         every other node answers (a new cluster; never for a joining node) or \
                         the node table admits it"
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

/// A new cluster: pins every founder's incarnation durably before this node's replicas open
/// (`crate::founders`), so that none of them can come back with an empty directory under its old
/// id while no table exists. `reported` comes third parties' pins first (they win), then
/// self-reports; this node's own incarnation is added last.
fn found(shared: &NodeShared, reported: Vec<(u64, u64)>) -> Result<(), crate::ServerError> {
    let me = shared.config.node_id;
    let pinned = shared.founder_pins();
    let (pins, conflicts) = crate::founders::merge_pins(
        &pinned,
        reported.into_iter().chain([(me, shared.incarnation)]),
    );
    for conflict in &conflicts {
        warn!(
            node = me,
            founder = conflict.node_id,
            pinned = conflict.pinned,
            reported = conflict.reported,
            "a founder reports another data directory than the one pinned: it lost its data and \
             stays refused"
        );
    }
    if pins != pinned {
        shared.set_founder_pins(pins)?;
    }
    info!(
        node = me,
        founders = ?shared.founder_pins(),
        "no node knows a node table yet (a new cluster): founders pinned, this node's replicas \
         are open to its peers"
    );
    Ok(())
}

/// What the two passes of a first start decided (`read_passes`).
#[derive(Debug, PartialEq)]
enum Founding {
    /// Some node knows a node table: it decides (through this node's `NodeUp`).
    Table(tenure_core::ClusterMeta),
    /// Another node pinned this node with another data directory: exclude it.
    PinnedOtherwise(String),
    /// Ask again: these nodes did not answer, or said another incarnation in the second pass.
    Wait(Vec<u64>),
    /// Every other node answered without a table: a new cluster. The incarnations to pin,
    /// third parties' pins first (they win over self-reports), then each node's self-report.
    New { reported: Vec<(u64, u64)> },
}

/// Reads the two passes of a first start (`settle_replica_gate`): `me` with `incarnation`,
/// `configured` tells a configured peer (only those are pinned). Pure: the decision alone.
fn read_passes(
    me: u64,
    incarnation: u64,
    configured: impl Fn(u64) -> bool,
    first: PassOutcome,
    second: PassOutcome,
) -> Founding {
    let (reports, pins) = match (first, second) {
        (PassOutcome::Table(meta), _) | (_, PassOutcome::Table(meta)) => {
            return Founding::Table(meta);
        }
        (PassOutcome::Silent(peers), _) | (_, PassOutcome::Silent(peers)) => {
            return Founding::Wait(peers);
        }
        (PassOutcome::Answers(reports), PassOutcome::Answers(pins)) => (reports, pins),
    };
    let mut changed = Vec::new();
    let mut self_reports = Vec::new();
    for (peer, meta) in &reports {
        let said = meta.node(*peer).map_or(0, |record| record.incarnation);
        let says_now = pins
            .iter()
            .find(|(again, _)| again == peer)
            .and_then(|(_, meta)| meta.node(*peer))
            .map_or(0, |record| record.incarnation);
        if said != says_now {
            // Restarted with another directory between the passes: again.
            changed.push(*peer);
        }
        self_reports.push((*peer, said));
    }
    let mut pinned_elsewhere = Vec::new();
    for (peer, meta) in &pins {
        for record in meta.nodes.values() {
            if !configured(record.node_id) {
                continue;
            }
            if record.node_id == me {
                if record.incarnation != 0 && record.incarnation != incarnation {
                    return Founding::PinnedOtherwise(format!(
                        "node {peer} pinned node {me} as a founder with another data directory \
                         (incarnation {}, this one {incarnation})",
                        record.incarnation
                    ));
                }
            } else if record.node_id != *peer {
                pinned_elsewhere.push((record.node_id, record.incarnation));
            }
        }
    }
    if !changed.is_empty() {
        return Founding::Wait(changed);
    }
    Founding::New {
        reported: pinned_elsewhere.into_iter().chain(self_reports).collect(),
    }
}

/// What one pass of `ClusterNodes` questions to every other node found.
#[derive(Debug)]
enum PassOutcome {
    /// Some node knows a node table (the first one heard).
    Table(tenure_core::ClusterMeta),
    /// These nodes did not answer.
    Silent(Vec<u64>),
    /// Every node answered without a table: its pins and itself (`crate::founders`).
    Answers(Vec<(u64, tenure_core::ClusterMeta)>),
}

impl PassOutcome {
    /// The negative control `ignore-founder-pins`: every answer without the pins of other
    /// nodes (each node's record of itself alone).
    fn self_reports_only(self) -> PassOutcome {
        match self {
            PassOutcome::Answers(answers) => PassOutcome::Answers(
                answers
                    .into_iter()
                    .map(|(peer, mut meta)| {
                        meta.nodes.retain(|&node, _| node == peer);
                        (peer, meta)
                    })
                    .collect(),
            ),
            other => other,
        }
    }
}

async fn ask_versions_zero(shared: &NodeShared, others: &[u64]) -> PassOutcome {
    let mut silent = Vec::new();
    let mut answers = Vec::new();
    for &peer in others {
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
                    return PassOutcome::Table(meta);
                }
                answers.push((peer, meta));
            }
            _ => silent.push(peer),
        }
    }
    if silent.is_empty() {
        PassOutcome::Answers(answers)
    } else {
        PassOutcome::Silent(silent)
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
/// `node_dead_after_ms`), then retires it (`tenure serve` exits). Excluded before any node
/// table exists, it first lingers (`crate::replica_gate`): answering the questions about the
/// cluster until it learns of a table, and [`EXCLUDED_LINGER_AFTER_TABLE`] more. Returns false
/// (the gate did not open).
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
    // Decided now, not after the replicas stopped: a table adopted meanwhile must not cut the
    // linger short for founders that still ask.
    let before_any_table = shared.cluster_view().version == 0;
    let shared = shared.clone();
    tokio::spawn(async move {
        for handle in shared.hosted() {
            handle.stop().await;
        }
        // Excluded before any node table existed (a founder pinned it with another directory):
        // other founders still on their first start wait for this node's answers (their
        // replica gate asks `ClusterNodes`, their bootstrap `Status`: `crate::replica_gate`,
        // `crate::membership::bootstrap`), so it answers until it learns of a table, and a
        // while more for a founder that opened just before the table was recorded.
        if before_any_table {
            warn!(
                node = me,
                "excluded before any node table exists: answering the other nodes' questions \
                 about the cluster (and refusing everything else) until one does"
            );
            while shared.cluster_view().version == 0 {
                if shared.shutting_down.load(Ordering::SeqCst) {
                    return;
                }
                shared.fetch_cluster_view().await;
                tokio::time::sleep(SYNC_INTERVAL).await;
            }
            info!(
                node = me,
                version = shared.cluster_view().version,
                linger_s = EXCLUDED_LINGER_AFTER_TABLE.as_secs(),
                "a node table exists: still answering for a while, then stopping"
            );
            tokio::time::sleep(EXCLUDED_LINGER_AFTER_TABLE).await;
        }
        shared.transport.shutdown().await;
        shared.replica_gate.retire();
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
        if view.version == 0 || shared.replica_gate.is_excluded() {
            // An excluded node (lingering: see `exclude`) never reports itself.
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

/// Records the configured peers as the node table, with the founders' incarnations this node
/// pinned (`crate::founders`; 0 for a node it did not pin, as in a cluster founded by an older
/// build).
async fn record_configured_peers(shared: &NodeShared) {
    let pins = shared.founder_pins();
    let nodes = shared
        .config
        .peers
        .iter()
        .map(|(&node_id, peer)| FounderNode {
            node: NodeAddresses {
                node_id,
                addr: peer.addr.to_string(),
                http_addr: peer.http_addr.to_string(),
            },
            incarnation: pins.get(&node_id).copied().unwrap_or(0),
        })
        .collect();
    log_change(
        shared,
        shared
            .propose_cluster_change(ClusterOp::RecordFounders { nodes })
            .await,
        "recorded the configured peers as the cluster's node table",
        "recording the node table failed (next second again)",
    );
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use tenure_core::ClusterMeta;

    use super::*;

    const ME: u64 = 2;
    const MINE: u64 = 200;

    /// A version-0 `ClusterNodes` answer: `(node, incarnation)` pins, the answering node among them.
    fn answer(records: &[(u64, u64)]) -> ClusterMeta {
        crate::cluster::pins_as_table(
            records
                .iter()
                .map(|&(node, incarnation)| (node, incarnation, String::new(), String::new())),
        )
    }

    fn configured(node: u64) -> bool {
        (1..=3).contains(&node)
    }

    fn passes(first: Vec<(u64, ClusterMeta)>, second: Vec<(u64, ClusterMeta)>) -> Founding {
        read_passes(
            ME,
            MINE,
            configured,
            PassOutcome::Answers(first),
            PassOutcome::Answers(second),
        )
    }

    /// The case a lingering excluded founder exists for: node 3 was wiped in the cluster's
    /// first seconds and excluded (node 1 pinned its old directory, 300); it still answers with
    /// its new one (301). This node, still on its first start, founds with node 3 pinned at its
    /// old directory: node 1's pin comes before node 3's self-report, and the first one wins.
    #[test]
    fn a_third_partys_pin_wins_over_an_excluded_founders_self_report() {
        let first = vec![(1, answer(&[(1, 100)])), (3, answer(&[(3, 301)]))];
        let second = vec![
            (1, answer(&[(1, 100), (2, MINE), (3, 300)])),
            (3, answer(&[(3, 301)])),
        ];
        let Founding::New { reported } = passes(first, second) else {
            panic!("every node answered without a table: a new cluster");
        };
        assert_eq!(reported, vec![(3, 300), (1, 100), (3, 301)]);
        let (pins, conflicts) =
            crate::founders::merge_pins(&BTreeMap::new(), reported.into_iter().chain([(ME, MINE)]));
        assert_eq!(
            pins.get(&3),
            Some(&300),
            "node 3 stays pinned at its old directory"
        );
        assert_eq!(pins.get(&1), Some(&100));
        assert_eq!(pins.get(&ME), Some(&MINE));
        assert_eq!(conflicts.len(), 1);
        assert_eq!((conflicts[0].node_id, conflicts[0].reported), (3, 301));
    }

    #[test]
    fn a_pin_of_this_node_with_another_directory_excludes_it() {
        let first = vec![(1, answer(&[(1, 100)])), (3, answer(&[(3, 300)]))];
        let second = vec![
            (1, answer(&[(1, 100), (ME, MINE - 1), (3, 300)])),
            (3, answer(&[(3, 300)])),
        ];
        match passes(first, second) {
            Founding::PinnedOtherwise(reason) => {
                assert!(reason.contains("node 1 pinned node 2"), "{reason}");
            }
            other => panic!("must exclude: {other:?}"),
        }
    }

    #[test]
    fn a_node_that_changed_directory_between_the_passes_is_asked_again() {
        let first = vec![(1, answer(&[(1, 100)])), (3, answer(&[(3, 300)]))];
        let second = vec![(1, answer(&[(1, 100)])), (3, answer(&[(3, 301)]))];
        assert_eq!(passes(first, second), Founding::Wait(vec![3]));
    }

    #[test]
    fn silence_waits_and_a_table_decides() {
        let silent = read_passes(
            ME,
            MINE,
            configured,
            PassOutcome::Silent(vec![3]),
            PassOutcome::Silent(Vec::new()),
        );
        assert_eq!(silent, Founding::Wait(vec![3]));
        let silent_second = read_passes(
            ME,
            MINE,
            configured,
            PassOutcome::Answers(vec![(1, answer(&[(1, 100)]))]),
            PassOutcome::Silent(vec![1]),
        );
        assert_eq!(silent_second, Founding::Wait(vec![1]));
        let table = ClusterMeta {
            version: 4,
            ..ClusterMeta::default()
        };
        let decided = read_passes(
            ME,
            MINE,
            configured,
            PassOutcome::Answers(vec![(1, answer(&[(1, 100)]))]),
            PassOutcome::Table(table.clone()),
        );
        assert_eq!(decided, Founding::Table(table));
    }

    #[test]
    fn only_configured_peers_are_pinned() {
        let first = vec![(1, answer(&[(1, 100)])), (3, answer(&[(3, 300)]))];
        let second = vec![
            (1, answer(&[(1, 100), (9, 900), (ME, 0)])),
            (3, answer(&[(3, 300)])),
        ];
        let Founding::New { reported } = passes(first, second) else {
            panic!("a new cluster");
        };
        assert!(!reported.iter().any(|&(node, _)| node == 9), "{reported:?}");
    }
}
