//! Moving a group's replica between nodes of a running cluster of real node processes: the new
//! replica catches up as a learner, the voters change by joint consensus, the old replica is dropped; every acknowledged lease is
//! still there, served by the new replica set with one of the old voters killed; the hosted
//! replicas survive restarts; bad moves and replica requests from clients are refused.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::time::Duration;

use tenure_core::{ErrorCode, LeaseReply};
use tenure_proto::client::{GroupMembers, RequestBody, ResponseBody};

use crate::common::{ClusterOptions, ProcessCluster, TestClient, forward, wait_for};

const TENANT: &str = "acme";

async fn members(client: &TestClient, group: u32) -> GroupMembers {
    match client
        .call(RequestBody::GroupMembers { group_id: group }, forward())
        .await
        .unwrap()
    {
        ResponseBody::Members(members) => members,
        other => panic!("GroupMembers answered {other:?}"),
    }
}

fn move_request(group: u32, from: u64, to: u64) -> RequestBody {
    RequestBody::MoveReplica {
        group_id: group,
        from,
        to,
    }
}

async fn hosted(cluster: &ProcessCluster, node: u64) -> BTreeSet<u32> {
    let client = cluster.client(node).await;
    match client
        .call(RequestBody::Status, Default::default())
        .await
        .unwrap()
    {
        ResponseBody::Status(status) => status.hosted.iter().map(|g| g.group_id).collect(),
        other => panic!("Status answered {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_moves_to_another_node_with_every_lease_and_stays_there() {
    let cluster = ProcessCluster::start_ready(ClusterOptions {
        nodes: 4,
        groups: 4,
        fsync: false,
        snapshot_every_entries: Some(20),
        ..ClusterOptions::default()
    })
    .await;
    let group = 0;
    let client = cluster.client(4).await;
    let before = members(&client, group).await;
    assert_eq!(before.voters, vec![1, 2, 3], "{before:?}");
    assert!(!hosted(&cluster, 4).await.contains(&group));

    // 60 leases in the group (and snapshots: the group snapshots every 20 entries).
    let resources = cluster.resources_in_group(TENANT, group, "moved", 60);
    let mut tokens = Vec::new();
    for (i, resource) in resources.iter().enumerate() {
        let granted = client
            .acquire(TENANT, resource, "holder", 600_000, &format!("acq-{i}"))
            .await
            .unwrap();
        let LeaseReply::Acquired(grant) = granted.reply else {
            panic!("{granted:?}");
        };
        tokens.push((grant.lease_id, grant.fencing_token));
    }

    // Move the leader's replica away (the hardest case: the leader removes itself).
    let from = before.leader.unwrap();
    let moved = match client
        .call(move_request(group, from, 4), forward())
        .await
        .unwrap()
    {
        ResponseBody::Members(members) => members,
        other => panic!("MoveReplica answered {other:?}"),
    };
    let expected: Vec<u64> = {
        let mut voters: Vec<u64> = before
            .voters
            .iter()
            .copied()
            .filter(|&v| v != from)
            .collect();
        voters.push(4);
        voters.sort_unstable();
        voters
    };
    assert_eq!(moved.voters, expected, "{moved:?}");
    assert_eq!(moved.voter_sets.len(), 1, "not left in a joint change");
    assert!(moved.learners.is_empty(), "{moved:?}");
    assert!(hosted(&cluster, 4).await.contains(&group));
    wait_for(
        Duration::from_secs(10),
        "the old node to drop its replica",
        || {
            let cluster = &cluster;
            async move { (!hosted(cluster, from).await.contains(&group)).then_some(()) }
        },
    )
    .await
    .unwrap();
    // The same move again answers the same replica set; impossible moves are refused.
    // (Retried while the group elects its new leader, as a client would.)
    let again = wait_for(
        Duration::from_secs(20),
        "the repeated move's answer",
        || {
            let client = &client;
            async move {
                client
                    .call(move_request(group, from, 4), forward())
                    .await
                    .ok()
            }
        },
    )
    .await
    .unwrap();
    assert!(
        matches!(&again, ResponseBody::Members(m) if m.voters == expected),
        "{again:?}"
    );
    // A move onto a node that already holds a voting replica is refused.
    let not_voter = client
        .call(move_request(group, expected[0], expected[1]), forward())
        .await
        .unwrap_err();
    assert_eq!(not_voter.code, ErrorCode::InvalidArgument, "{not_voter:?}");
    let unknown = client
        .call(move_request(group, expected[0], 9), forward())
        .await
        .unwrap_err();
    assert_eq!(unknown.code, ErrorCode::InvalidArgument, "{unknown:?}");
    let from_client = client
        .call(RequestBody::CreateReplica { group_id: group }, forward())
        .await
        .unwrap_err();
    assert_eq!(from_client.code, ErrorCode::Forbidden, "{from_client:?}");

    // Node 4 and one old voter now hold the group's quorum: kill the other old voter.
    let mut cluster = cluster;
    let victim = *expected.iter().find(|&&v| v != 4).unwrap();
    cluster.kill(victim);
    let reader = cluster.client(4).await;
    for (resource, (lease_id, token)) in resources.iter().zip(&tokens) {
        let view = wait_for(Duration::from_secs(20), "a read of a moved lease", || {
            let reader = &reader;
            async move { reader.get(TENANT, resource, forward()).await.ok() }
        })
        .await
        .unwrap();
        let view = view.view.expect("the lease is still there");
        assert_eq!((view.lease_id, view.fencing_token), (*lease_id, *token));
    }
    let renewed = reader
        .renew(
            TENANT,
            &resources[0],
            tokens[0].0,
            "holder",
            600_000,
            "renew-0",
        )
        .await
        .unwrap();
    assert!(
        matches!(renewed.reply, LeaseReply::Renewed(_)),
        "{renewed:?}"
    );

    // Restarts keep the replica layout: node 4 hosts the group, the old node does not.
    cluster.restart(victim);
    cluster.terminate(4);
    cluster.wait_exit(4, Duration::from_secs(30));
    cluster.restart(4);
    cluster.terminate(from);
    cluster.wait_exit(from, Duration::from_secs(30));
    cluster.restart(from);
    cluster.wait_ready(Duration::from_secs(60)).await;
    assert!(hosted(&cluster, 4).await.contains(&group));
    assert!(!hosted(&cluster, from).await.contains(&group));
    let after = members(&cluster.client(1).await, group).await;
    assert_eq!(after.voters, expected, "{after:?}");
}
