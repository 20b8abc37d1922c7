//! An elastic cluster of real node processes, with the placement controller on: it grows from 3
//! to 5 nodes (a node announced with `AddNode`, started with a certificate from `tenure certs
//! --ca-dir` and `join_existing`, reports itself and gets replicas until the replicas are
//! balanced; the second one starts before it is announced, and its early connections count as a
//! node's once it is), drains and removes a node (its replicas leave, then every node refuses it), and
//! re-creates the replicas of a node killed for good once it was unreachable longer than
//! `node_dead_after_ms` (the node comes back at once with its data wiped under its old id and is
//! excluded: its empty replicas never vote); the groups then survive a second kill. Every lease acquired at the start
//! is still there, with its token, at the end.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use tenure_core::{
    ClusterMeta, ClusterOp, ErrorCode, LeaseReply, LeaseStatus, NodeAddresses, NodeState,
};
use tenure_proto::client::{GroupMembers, RequestBody, ResponseBody};
use tenure_server::config::ClusterConfig;

use crate::common::{
    ClusterOptions, ProcessCluster, TestClient, forward, status_of, view_of, wait_for,
};

const TENANT: &str = "acme";
const GROUPS: u32 = 6;

async fn cluster_meta(client: &TestClient) -> Option<ClusterMeta> {
    match client.call(RequestBody::ClusterNodes, forward()).await {
        Ok(ResponseBody::Cluster(meta)) => Some(meta),
        _ => None,
    }
}

async fn change(client: &TestClient, op: ClusterOp) {
    let answer = client
        .call(RequestBody::ClusterChange(op.clone()), forward())
        .await;
    assert!(
        matches!(answer, Ok(ResponseBody::ClusterChanged(_))),
        "{op:?}: {answer:?}"
    );
}

/// The group's members (waiting out the per-connection rate limit of membership reads).
async fn members(client: &TestClient, group: u32) -> Result<GroupMembers, String> {
    for _ in 0..20 {
        match client
            .call(RequestBody::GroupMembers { group_id: group }, forward())
            .await
        {
            Ok(ResponseBody::Members(members)) => return Ok(members),
            Err(error) if error.code == ErrorCode::RateLimited => {
                let wait_ms = error.retry_after_ms.unwrap_or(100);
                tokio::time::sleep(Duration::from_millis(u64::from(wait_ms))).await;
            }
            other => return Err(format!("group {group}: {other:?}")),
        }
    }
    Err(format!("group {group}: rate limited 20 times"))
}

/// Replicas per node over every group, when every group answered with a settled replica set
/// (else why not).
async fn replicas_per_node(client: &TestClient) -> Result<BTreeMap<u64, usize>, String> {
    let mut counts = BTreeMap::new();
    for group in 0..GROUPS {
        let members = members(client, group).await?;
        if members.voter_sets.len() != 1 || !members.learners.is_empty() {
            return Err(format!("group {group} is changing: {members:?}"));
        }
        for node in &members.voters {
            *counts.entry(*node).or_insert(0) += 1;
        }
    }
    Ok(counts)
}

/// Groups led per node (from each group's leader), for the printed lines.
async fn leaders_per_node(client: &TestClient) -> BTreeMap<u64, usize> {
    let mut counts = BTreeMap::new();
    for group in 0..GROUPS {
        if let Some(leader) = members(client, group).await.ok().and_then(|m| m.leader) {
            *counts.entry(leader).or_insert(0) += 1;
        }
    }
    counts
}

async fn wait_replicas(
    client: &TestClient,
    what: &str,
    check: impl Fn(&BTreeMap<u64, usize>) -> bool,
) -> BTreeMap<u64, usize> {
    let check = &check;
    let last = std::sync::Mutex::new(String::new());
    let last = &last;
    let outcome = wait_for(Duration::from_secs(120), what, || async move {
        match replicas_per_node(client).await {
            Ok(counts) if check(&counts) => Some(counts),
            Ok(counts) => {
                *last.lock().unwrap() = format!("{counts:?}");
                None
            }
            Err(why) => {
                *last.lock().unwrap() = why;
                None
            }
        }
    })
    .await;
    match outcome {
        Ok(counts) => counts,
        Err(error) => panic!("{error}; last seen: {}", last.lock().unwrap()),
    }
}

async fn wait_state(client: &TestClient, node: u64, state: NodeState) -> ClusterMeta {
    wait_for(
        Duration::from_secs(60),
        &format!("node {node} {}", state.as_str()),
        || async move {
            cluster_meta(client)
                .await
                .filter(|meta| meta.node(node).is_some_and(|n| n.state == state))
        },
    )
    .await
    .unwrap()
}

fn addresses(cluster: &ProcessCluster, node: u64) -> NodeAddresses {
    NodeAddresses {
        node_id: node,
        addr: cluster.node(node).quic_addr.to_string(),
        http_addr: cluster.node(node).http_addr.to_string(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_grows_drains_removes_and_heals_with_every_lease() {
    let mut cluster = ProcessCluster::start_ready(ClusterOptions {
        nodes: 3,
        groups: GROUPS,
        fsync: false,
        cluster: Some(ClusterConfig {
            placement_interval_ms: 300,
            node_dead_after_ms: 3_000,
            // Paced, briefly (the default is 10 s): the drain and the balancing go through the
            // pause and still finish within the test's bounds.
            move_pause_ms: 300,
            ..ClusterConfig::default()
        }),
        ..ClusterOptions::default()
    })
    .await;
    let client = cluster.client(1).await;
    // The first start records the configured peers; each node reports itself.
    let meta = wait_for(
        Duration::from_secs(30),
        "the node table with 3 reported nodes",
        || {
            let client = &client;
            async move {
                cluster_meta(client).await.filter(|meta| {
                    meta.nodes.len() == 3
                        && meta
                            .nodes
                            .values()
                            .all(|n| n.state == NodeState::Active && n.cert_sha256.is_some())
                })
            }
        },
    )
    .await
    .unwrap();
    assert!(meta.version >= 4, "{meta:?}");
    // Before its replicas opened, each founder pinned every founder's data directory
    // (`tenure_server::founders`): the table's incarnations are those directories'.
    let incarnations: BTreeMap<u64, u64> = (1..=3)
        .map(|node| {
            let identity = tenure_server::identity::read_identity(&cluster.node(node).data_dir)
                .unwrap()
                .unwrap();
            (node, identity.created_unix_ms)
        })
        .collect();
    // (A founder that first heard of the table, not of the others' pins, pins nothing.)
    let mut pinned = 0;
    for node in 1..=3 {
        let pins =
            tenure_server::founders::read_founder_pins(&cluster.node(node).data_dir).unwrap();
        if !pins.is_empty() {
            assert_eq!(pins, incarnations, "node {node}'s founder pins");
            pinned += 1;
        }
        assert_eq!(meta.node(node).unwrap().incarnation, incarnations[&node]);
    }
    assert!(pinned >= 1, "no founder pinned the others");

    let mut leases = Vec::new();
    for i in 0..30 {
        let resource = format!("elastic-{i}");
        let granted = client
            .acquire(TENANT, &resource, "holder", 600_000, &format!("acq-{i}"))
            .await
            .unwrap();
        let LeaseReply::Acquired(grant) = granted.reply else {
            panic!("{granted:?}");
        };
        leases.push((resource, grant.lease_id, grant.fencing_token));
    }

    // Grow 3 -> 5.
    let before = replicas_per_node(&client).await.unwrap();
    println!(
        "before growing: replicas per node {before:?}, leaders per node {:?}",
        leaders_per_node(&client).await
    );
    // Node 4 is announced before it starts; node 5 starts first (it connects, learns the table,
    // finds itself missing and says so), and is announced then: its connections, made while it
    // was nobody, count as a node's once it is in the table.
    for node in [4, 5] {
        let (addr, http_addr) = cluster.add_node(node);
        if node == 5 {
            let log = cluster.node(5).log_path.clone();
            wait_for(
                Duration::from_secs(30),
                "node 5 to find itself missing from the node table",
                || {
                    let log = log.clone();
                    async move {
                        std::fs::read_to_string(&log)
                            .unwrap_or_default()
                            .contains("is not in the cluster's node table")
                            .then_some(())
                    }
                },
            )
            .await
            .unwrap();
        }
        change(
            &client,
            ClusterOp::AddNode(NodeAddresses {
                node_id: node,
                addr: addr.to_string(),
                http_addr: http_addr.to_string(),
            }),
        )
        .await;
    }
    wait_state(&client, 4, NodeState::Active).await;
    wait_state(&client, 5, NodeState::Active).await;
    let grown = wait_replicas(&client, "replicas balanced over 5 nodes", |counts| {
        (1..=5).all(|n| counts.get(&n).is_some_and(|&c| (3..=4).contains(&c)))
    })
    .await;
    // Every group has a leader again after the hand-overs to the preferred leaders.
    let leaders = wait_for(Duration::from_secs(60), "a leader for every group", || {
        let client = &client;
        async move {
            let leaders = leaders_per_node(client).await;
            (leaders.values().sum::<usize>() == GROUPS as usize).then_some(leaders)
        }
    })
    .await
    .unwrap();
    println!("after growing to 5: replicas per node {grown:?}, leaders per node {leaders:?}");
    // The routing table lists the new nodes, with the node table's version.
    let routing = cluster.routing(1).await.unwrap();
    assert_eq!(routing.nodes.len(), 5, "{routing:?}");
    assert!(routing.nodes_version > meta.version);

    // Drain node 2, then remove it: every node refuses it from then on.
    change(
        &client,
        ClusterOp::SetState {
            node_id: 2,
            state: NodeState::Draining,
        },
    )
    .await;
    let drained = wait_replicas(&client, "node 2 empty", |counts| {
        !counts.contains_key(&2) && counts.values().sum::<usize>() == GROUPS as usize * 3
    })
    .await;
    println!(
        "after draining node 2: replicas per node {drained:?}, leaders per node {:?}",
        leaders_per_node(&client).await
    );
    change(&client, ClusterOp::Remove { node_id: 2 }).await;
    let removed = wait_state(&client, 2, NodeState::Removed).await;
    assert_eq!(removed.revoked.len(), 1, "node 2's certificate is revoked");
    let refused = addresses(&cluster, 2);
    wait_for(Duration::from_secs(30), "a peer to refuse node 2", || {
        let cluster = &cluster;
        async move {
            (1..=5)
                .filter(|&n| n != 2)
                .any(|n| {
                    std::fs::read_to_string(&cluster.node(n).log_path)
                        .unwrap_or_default()
                        .contains("refused peer connection")
                })
                .then_some(())
        }
    })
    .await
    .unwrap();
    // Adding it back under the same id is refused.
    let again = client
        .call(
            RequestBody::ClusterChange(ClusterOp::AddNode(refused)),
            forward(),
        )
        .await;
    assert!(again.is_err(), "{again:?}");
    cluster.terminate(2);

    // Kill node 3 for good, and bring it back at once under its old id with its data lost (a
    // new, empty data directory: another incarnation). Its groups still count it as a voter,
    // so an empty replica answering votes and appends could lose acknowledged leases: the node
    // table refuses the new incarnation, and the node excludes itself (its replicas never open
    // to its peers) and exits. After node_dead_after_ms it is declared dead and its replicas are
    // re-created on nodes 1, 4 and 5.
    cluster.kill(3);
    let data_dir = cluster.node(3).data_dir.clone();
    std::fs::remove_dir_all(&data_dir).unwrap();
    cluster.restart(3);
    let status = cluster.wait_exit(3, Duration::from_secs(60));
    assert!(!status.success(), "the wiped node 3 must exit: {status}");
    let log = std::fs::read_to_string(&cluster.node(3).log_path).unwrap();
    let last_start = log.rfind("test harness: starting node 3").unwrap();
    let wiped_run = &log[last_start..];
    assert!(
        wiped_run.contains("EXCLUDED") && wiped_run.contains("another data directory"),
        "node 3's last run: {wiped_run}"
    );
    assert!(
        !wiped_run.contains("created a replica of the group on this node")
            && !wiped_run.contains("bootstrapped a fresh group"),
        "the wiped node created or founded a replica: {wiped_run}"
    );
    println!("wiped node 3 restarted under its old id: excluded and exited ({status})");
    wait_state(&client, 3, NodeState::Dead).await;
    let healed = wait_replicas(&client, "node 3's replicas re-created", |counts| {
        !counts.contains_key(&3) && counts.values().sum::<usize>() == GROUPS as usize * 3
    })
    .await;
    println!(
        "after node 3 died: replicas per node {healed:?}, leaders per node {:?}",
        leaders_per_node(&client).await
    );

    // A second kill: every group keeps a majority.
    cluster.kill(4);
    let client = cluster.client(5).await;
    for (i, (resource, lease_id, token)) in leases.iter().enumerate() {
        let got = wait_for(
            Duration::from_secs(30),
            &format!("lease {i} after the second kill"),
            || {
                let client = &client;
                async move { client.get(TENANT, resource, forward()).await.ok() }
            },
        )
        .await
        .unwrap();
        assert_eq!(status_of(&got), LeaseStatus::Active, "{resource}: {got:?}");
        let view = view_of(&got);
        assert_eq!(
            (view.lease_id, view.fencing_token),
            (*lease_id, *token),
            "{resource}"
        );
    }
    let fresh = wait_for(
        Duration::from_secs(30),
        "an acquire after the second kill",
        || {
            let client = &client;
            async move {
                client
                    .acquire(TENANT, "after-kills", "holder", 60_000, "acq-after")
                    .await
                    .ok()
            }
        },
    )
    .await
    .unwrap();
    assert!(matches!(fresh.reply, LeaseReply::Acquired(_)), "{fresh:?}");
}
