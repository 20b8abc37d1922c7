//! Membership of the transport at runtime: a Raft group grows onto a node its peers learnt of
//! without a restart; a removed node's connections close, requests to it fail as an unknown
//! peer, its redials are refused, and adding it again restores replication; an admission policy
//! refuses a revoked certificate on both sides of a connection while the other peers keep
//! working, and the same node with a re-issued certificate (at a new address) is admitted.
#![cfg(feature = "testing")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::impls::BasicNode;
use openraft::network::{RPCOption, RaftNetworkFactory};
use openraft::raft::VoteRequest;
use openraft::{ChangeMembers, RaftNetworkV2};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use tenure_core::{AcquireRequest, Command, LeaseOp, ResourceKey};
use tenure_storage::TenureRaft;
use tenure_transport::certs::{ClusterCa, generate_cluster_ca, issue_node_certificate};
use tenure_transport::testing::{ClusterOptions, LocalCluster};
use tenure_transport::tls::NodeTls;
use tenure_transport::{
    GroupNetworkFactory, GroupRegistry, GroupTable, PeerAdmission, Transport, TransportConfig,
    TransportStatsSnapshot, certificate_sha256,
};

use crate::bad_input::{free_port, wait_until};

/// Bound on every wait for a Raft outcome (elections take a second or two).
const WAIT: Duration = Duration::from_secs(30);

fn acquire(n: u64) -> Command {
    Command::Lease(LeaseOp::Acquire(AcquireRequest {
        key: ResourceKey::new("tenant-a", format!("runtime-peers-{n}")),
        holder_id: format!("holder-{n}"),
        ttl_ms: 60_000,
        request_id: format!("req-{n}"),
    }))
}

/// Nodes 1 and 2 with one group between them; then node 3 starts (knowing both) and nodes 1
/// and 2 add it at runtime. Returns the cluster once every pair is connected.
async fn two_nodes_then_a_third_added_at_runtime() -> LocalCluster {
    let mut cluster = LocalCluster::start(ClusterOptions {
        nodes: 2,
        groups: 1,
        fsync: false,
        seed: 31,
        ..ClusterOptions::default()
    })
    .await
    .unwrap();
    cluster.wait_for_leaders(&[1, 2], WAIT).await.unwrap();
    cluster.write(0, acquire(1), WAIT).await.unwrap();

    let new = cluster.add_node().await.unwrap();
    assert_eq!(new, 3);
    let addrs: BTreeMap<u64, SocketAddr> = [1, 2, 3]
        .into_iter()
        .map(|id| (id, cluster.addr(id).unwrap()))
        .collect();
    for id in [1, 2] {
        let transport = &cluster.node(id).unwrap().transport;
        let other = 3 - id;
        assert_eq!(transport.peers(), [(other, addrs[&other])]);
        assert!(!transport.is_connected(3));
        transport.add_peer(3, addrs[&3]);
        // Idempotent; and a node never becomes its own peer.
        transport.add_peer(3, addrs[&3]);
        transport.add_peer(id, addrs[&id]);
        let expected: Vec<(u64, SocketAddr)> = [(other, addrs[&other]), (3, addrs[&3])]
            .into_iter()
            .collect::<BTreeMap<_, _>>()
            .into_iter()
            .collect();
        assert_eq!(transport.peers(), expected);
    }
    wait_until(|| all_connected(&cluster, &[1, 2, 3])).await;
    cluster
}

fn all_connected(cluster: &LocalCluster, ids: &[u64]) -> bool {
    ids.iter().all(|id| {
        let transport = &cluster.node(*id).unwrap().transport;
        ids.iter()
            .filter(|peer| *peer != id)
            .all(|peer| transport.is_connected(*peer))
    })
}

/// Adds `node` to `group` as a voter through the group's leader (retried, bounded, while
/// leadership moves).
async fn add_voter(cluster: &LocalCluster, group: u32, node: u64) {
    let addr = cluster.addr(node).unwrap().to_string();
    let deadline = Instant::now() + WAIT;
    let mut last_error = String::from("no leader");
    while Instant::now() < deadline {
        let leader = cluster
            .leader_among(group, &cluster.live_nodes())
            .and_then(|id| cluster.node(id))
            .and_then(|leader| leader.raft(group));
        if let Some(raft) = leader {
            let added = async {
                raft.add_learner(node, BasicNode::new(addr.clone()), true)
                    .await?;
                raft.change_membership(ChangeMembers::AddVoterIds([node].into()), false)
                    .await
            };
            match tokio::time::timeout(WAIT, added).await {
                Ok(Ok(_)) => return,
                Ok(Err(error)) => last_error = error.to_string(),
                Err(_) => last_error = "timed out".into(),
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("node {node} did not join group {group}: {last_error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_added_at_runtime_joins_a_raft_group() {
    let cluster = two_nodes_then_a_third_added_at_runtime().await;
    add_voter(&cluster, 0, 3).await;
    cluster.write(0, acquire(2), WAIT).await.unwrap();
    let applied = cluster.wait_replicas_agree(0, WAIT).await.unwrap();
    println!("runtime peer: node 3 joined group 0 and applied index {applied} with nodes 1 and 2");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_peer_is_cut_off_and_can_be_added_again() {
    let cluster = two_nodes_then_a_third_added_at_runtime().await;
    add_voter(&cluster, 0, 3).await;
    cluster.wait_replicas_agree(0, WAIT).await.unwrap();
    let addr3 = cluster.addr(3).unwrap();
    let transport = |id: u64| cluster.node(id).unwrap().transport.clone();
    let refused_before = [transport(1).stats(), transport(2).stats()];

    for id in [1, 2] {
        transport(id).remove_peer(3);
        transport(id).remove_peer(3);
        assert!(!transport(id).is_connected(3));
        assert!(transport(id).peers().iter().all(|(peer, _)| *peer != 3));
    }
    // Node 3 sees its connections close.
    wait_until(|| !transport(3).is_connected(1) && !transport(3).is_connected(2)).await;

    // Requests to the removed node fail at once as an unknown peer.
    let mut factory = GroupNetworkFactory::new(transport(1), 0);
    let mut client = factory.new_client(3, &BasicNode::default()).await;
    let request = VoteRequest::<TenureRaft>::new(openraft::Vote::new(1, 1), None);
    let error = client
        .pre_vote(request, RPCOption::new(Duration::from_secs(5)))
        .await
        .expect_err("a request to a removed peer was answered");
    println!("request to the removed node: {error}");
    assert!(
        error
            .to_string()
            .contains("node 3 is not a member of this cluster's transport"),
        "{error}"
    );

    // Node 3 keeps redialling (it still knows both) and is refused as not a member.
    wait_until(|| {
        transport(1).stats().connections_refused > refused_before[0].connections_refused
            && transport(2).stats().connections_refused > refused_before[1].connections_refused
    })
    .await;
    assert!(!transport(3).is_connected(1) && !transport(3).is_connected(2));
    // The group goes on without it (two of three voters).
    cluster.write(0, acquire(3), WAIT).await.unwrap();

    // Added again, it reconnects and catches up.
    for id in [1, 2] {
        transport(id).add_peer(3, addr3);
    }
    wait_until(|| all_connected(&cluster, &[1, 2, 3])).await;
    cluster.write(0, acquire(4), WAIT).await.unwrap();
    let applied = cluster.wait_replicas_agree(0, WAIT).await.unwrap();
    println!(
        "removed peer: node 3 cut off ({} and {} redials refused), added again, applied index {applied}",
        transport(1).stats().connections_refused - refused_before[0].connections_refused,
        transport(2).stats().connections_refused - refused_before[1].connections_refused,
    );
    cluster.shutdown().await;
}

/// Refuses one certificate, by its SHA-256.
struct Revoked([u8; 32]);

impl PeerAdmission for Revoked {
    fn admit(&self, node_id: u64, cert_sha256: &[u8; 32]) -> Result<(), String> {
        if *cert_sha256 == self.0 {
            Err(format!("the certificate of node {node_id} is revoked"))
        } else {
            Ok(())
        }
    }
}

/// A new certificate for node `id` and its SHA-256.
fn issue(ca: &ClusterCa, id: u64) -> (NodeTls, [u8; 32]) {
    let certificate = issue_node_certificate(ca, id, &[]).unwrap();
    let der = CertificateDer::from_pem_slice(certificate.cert_pem.as_bytes()).unwrap();
    let tls = NodeTls::from_pem(
        id,
        &ca.cert_pem,
        &certificate.cert_pem,
        &certificate.key_pem,
    )
    .unwrap();
    (tls, certificate_sha256(der.as_ref()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_certificate_is_refused_on_both_sides() {
    let dir = tempfile::tempdir().unwrap();
    let ca = generate_cluster_ca("tenure-test").unwrap();
    let mut peers: BTreeMap<u64, SocketAddr> = (1..=3).map(|id| (id, free_port())).collect();
    let start = |id: u64, peers: &BTreeMap<u64, SocketAddr>, tls: &NodeTls| {
        let registry: Arc<dyn GroupRegistry> = Arc::new(GroupTable::new(dir.path().to_path_buf()));
        let mut config = TransportConfig::new(id, peers[&id], peers.clone());
        config.reconnect_backoff_max_ms = 200;
        Transport::start(config, tls, registry, None).unwrap()
    };
    let mut nodes: BTreeMap<u64, Transport> = BTreeMap::new();
    let mut revoked = [0u8; 32];
    for id in 1..=3 {
        let (tls, sha256) = issue(&ca, id);
        if id == 3 {
            revoked = sha256;
        }
        nodes.insert(id, start(id, &peers, &tls));
    }
    let all_connected = |nodes: &BTreeMap<u64, Transport>| {
        nodes.iter().all(|(id, node)| {
            nodes
                .keys()
                .all(|peer| peer == id || node.is_connected(*peer))
        })
    };
    wait_until(|| all_connected(&nodes)).await;

    // Nodes 1 and 2 revoke node 3's certificate and drop their connections to it.
    let before: Vec<_> = [1, 2].iter().map(|id| nodes[id].stats()).collect();
    for id in [1, 2] {
        nodes[&id].set_peer_admission(Arc::new(Revoked(revoked)));
        nodes[&id].close_peer_connection(3, "certificate revoked");
    }
    // Both sides refuse: node 3's Hello is refused (accepting side), and the connection each of
    // nodes 1 and 2 dials (as the lower id it redials first) is dropped right after the TLS
    // handshake (dialling side).
    let refusals = |id: u64, before: &TransportStatsSnapshot| {
        let now = nodes[&id].stats().since(before);
        (now.connections_refused, now.dial_failures)
    };
    wait_until(|| {
        [1, 2]
            .into_iter()
            .zip(&before)
            .all(|(id, before)| matches!(refusals(id, before), (1.., 1..)))
    })
    .await;
    let counts: Vec<(u64, u64)> = [1, 2]
        .into_iter()
        .zip(&before)
        .map(|(id, before)| refusals(id, before))
        .collect();
    for (id, before) in [1, 2].into_iter().zip(&before) {
        assert!(
            !nodes[&id].is_connected(3),
            "node {id} kept a connection to a revoked peer"
        );
        assert_eq!(
            nodes[&id].stats().since(before).connections_established,
            0,
            "node {id} put a connection to the revoked peer to use"
        );
    }
    assert!(!nodes[&3].is_connected(1) && !nodes[&3].is_connected(2));
    // The others are unaffected.
    assert!(nodes[&1].is_connected(2) && nodes[&2].is_connected(1));

    // Node 3 with a re-issued certificate, at a new address: admitted. (The revoked one goes
    // away only after nodes 1 and 2 dial the new address, so no dial of theirs waits on a dead
    // one.)
    peers.insert(3, free_port());
    let (tls, reissued) = issue(&ca, 3);
    assert_ne!(reissued, revoked);
    let revoked_node = nodes.insert(3, start(3, &peers, &tls)).unwrap();
    for id in [1, 2] {
        nodes[&id].add_peer(3, peers[&3]);
        assert!(nodes[&id].peers().contains(&(3, peers[&3])));
    }
    revoked_node.shutdown().await;
    wait_until(|| all_connected(&nodes)).await;
    println!(
        "revoked certificate: (accepted-side refusals, dialled-side refusals) on nodes 1 and 2: \
         {counts:?}; the re-issued certificate connected at a new address"
    );
    futures_util::future::join_all(nodes.values().map(Transport::shutdown)).await;
}
