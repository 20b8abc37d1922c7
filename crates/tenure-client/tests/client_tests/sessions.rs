//! Sessions end to end against real `tenure` processes: a session's leases in two groups stay
//! active through several ttls on keep-alives alone (one per group, none per lease); another
//! holder is refused meanwhile; when the session's record in one group ends, `Session::lost`
//! names that group and exactly its leases while the other group's leases stay active; closing
//! the session frees its remaining resources at once; a session whose client stops (every
//! handle dropped) expires, with its leases, after its ttl; and `tenurectl session` opens,
//! acquires in, lists and closes a session.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Duration;

use tenure_client::{LeaseStatus, ResourceKey};
use tenure_core::{GroupId, LeaseOp, LeaseReply, SessionRequest};
use tenure_proto::client::{RequestBody, ResponseBody};
use tenure_testkit::{TENANT, forward, wait_for};

use crate::client_library::{cluster_with_a_follower_of_group_0, connect, tenurectl_cluster_file};

const TTL: Duration = Duration::from_millis(4_500);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_keeps_its_leases_per_group_and_reports_exactly_what_it_lost() {
    let (cluster, client, follower) = cluster_with_a_follower_of_group_0().await;
    let other = connect(&cluster).await;
    let session = client.session(TENANT, "alice", TTL).unwrap();
    let in_group = |group: u32, skip: usize| cluster.resource_in_group(TENANT, group, "s", skip);
    let mut leases = Vec::new();
    for (group, skip) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
        let lease = session.acquire(in_group(group, skip)).await.unwrap();
        assert_eq!(lease.group_id, group);
        leases.push(lease);
    }
    let mut groups = session.groups();
    groups.sort_unstable();
    assert_eq!(groups, [(0, false), (1, false)]);
    let view = client.get(&leases[0].key).await.unwrap().view.unwrap();
    assert_eq!(view.session_id, Some(session.id()));
    assert_eq!(view.status, LeaseStatus::Active);

    // Two ttls later, on keep-alives alone, every lease is still the resource's active lease
    // (the safe deadline of each group moved at least six times).
    let first_deadline = session.safe_deadline(0).unwrap();
    wait_for(
        Duration::from_secs(30),
        "two ttls of keep-alives",
        || async {
            let deadline = session.safe_deadline(0)?;
            (deadline > first_deadline + 2 * TTL
                && session.safe_deadline(1)? > first_deadline + 2 * TTL)
                .then_some(())
        },
    )
    .await
    .unwrap();
    for lease in &leases {
        let view = client.get(&lease.key).await.unwrap().view.unwrap();
        assert_eq!(view.status, LeaseStatus::Active, "{}", lease.key);
        assert_eq!(view.fencing_token, lease.fencing_token);
        assert!(session.is_valid(lease));
        let refused = other
            .acquire(TENANT, lease.key.resource_id.clone(), "bob", TTL)
            .await
            .unwrap_err();
        assert_eq!(refused.code_str(), "ALREADY_HELD");
    }

    // The session's record in group 1 ends (closed behind the client's back, through a node
    // that forwards it): the next keep-alive there is refused and `lost` names group 1 with
    // exactly its two leases; group 0 carries on.
    let raw = cluster.client(follower).await;
    let close = RequestBody::Lease(LeaseOp::SessionClose(SessionRequest {
        tenant_id: TENANT.into(),
        group_id: GroupId(1),
        session_id: session.id(),
        owner_id: "alice".into(),
    }));
    match raw.call(close, forward()).await.unwrap() {
        ResponseBody::Lease(result) => {
            assert!(
                matches!(result.reply, LeaseReply::SessionClosed(ref r) if r.leases_ended == 2)
            );
        }
        other => panic!("close answered {other:?}"),
    }
    let loss = tokio::time::timeout(2 * TTL, session.lost()).await.unwrap();
    assert_eq!(loss.group_id, 1);
    let mut lost_keys: Vec<ResourceKey> = loss.leases.iter().map(|l| l.key.clone()).collect();
    lost_keys.sort();
    let mut expected: Vec<ResourceKey> = leases[2..].iter().map(|l| l.key.clone()).collect();
    expected.sort();
    assert_eq!(lost_keys, expected, "{}", loss.reason);
    assert!(!session.is_valid(&leases[2]) && !session.is_valid(&leases[3]));
    for lease in &leases[2..] {
        let view = client.get(&lease.key).await.unwrap().view.unwrap();
        assert_eq!(view.status, LeaseStatus::Expired);
        let taken = other
            .acquire(TENANT, lease.key.resource_id.clone(), "bob", TTL)
            .await
            .unwrap();
        assert!(taken.fencing_token() > lease.fencing_token);
    }
    // A session never comes back in a group where it was lost.
    let again = session.acquire(in_group(1, 2)).await.unwrap_err();
    assert_eq!(again.code_str(), "LEASE_EXPIRED");
    for lease in &leases[..2] {
        assert!(session.is_valid(lease));
        let view = client.get(&lease.key).await.unwrap().view.unwrap();
        assert_eq!(view.status, LeaseStatus::Active);
    }

    // Close: group 0's leases end at once.
    session.close().await.unwrap();
    for lease in &leases[..2] {
        let view = client.get(&lease.key).await.unwrap().view.unwrap();
        assert_eq!(view.status, LeaseStatus::Expired);
        other
            .acquire(TENANT, lease.key.resource_id.clone(), "bob", TTL)
            .await
            .unwrap();
    }

    // A client that stops keeping its session alive: every handle dropped. Its lease expires
    // with the session, within the ttl (bounded wait on the resource becoming free).
    let quitter = client.session(TENANT, "carol", TTL).unwrap();
    let orphan = quitter.acquire(in_group(0, 5)).await.unwrap();
    drop(quitter);
    let free = wait_for(
        Duration::from_secs(20),
        "the orphaned lease to expire",
        || {
            let other = other.clone();
            let resource = orphan.key.resource_id.clone();
            async move { other.acquire(TENANT, resource, "bob", TTL).await.ok() }
        },
    )
    .await
    .unwrap();
    assert!(free.fencing_token() > orphan.fencing_token);

    // tenurectl: open in a resource's group, acquire in it, list its leases, close it.
    let cluster_file = tenurectl_cluster_file(&cluster);
    let resource = in_group(2, 0);
    let tenurectl = |args: &[&str]| {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_tenurectl"))
            .arg("--cluster")
            .arg(&cluster_file)
            .args(["-o", "json", "session"])
            .args(args)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "tenurectl session {args:?}: {stdout} {}",
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_str::<serde_json::Value>(&stdout).unwrap()
    };
    let opened = tenurectl(&[
        "open",
        "--tenant",
        TENANT,
        "--owner",
        "dave",
        "--ttl-ms",
        "30000",
        "--resource",
        &resource,
    ]);
    let session_id = opened["session_id"].as_str().unwrap().to_owned();
    assert_eq!(opened["groups"][0]["group_id"], 2, "{opened}");
    assert_eq!(opened["groups"][0]["created"], true, "{opened}");
    let session_args = [
        "--tenant",
        TENANT,
        "--owner",
        "dave",
        "--session",
        &session_id,
    ];
    let mut acquire = vec!["acquire", "--resource", &resource];
    acquire.extend(session_args);
    let acquired = tenurectl(&acquire);
    assert_eq!(acquired["session_id"], session_id.as_str(), "{acquired}");
    let listed = tenurectl(&["list", "--tenant", TENANT, "--session", &session_id]);
    assert_eq!(
        listed["leases"].as_array().map(Vec::len),
        Some(1),
        "{listed}"
    );
    let mut close = vec!["close", "--group", "2"];
    close.extend(session_args);
    let closed = tenurectl(&close);
    assert_eq!(closed["groups"][0]["leases_ended"], 1, "{closed}");
    let view = client
        .get(&ResourceKey::new(TENANT, resource))
        .await
        .unwrap()
        .view
        .unwrap();
    assert_eq!(view.status, LeaseStatus::Expired);
}
