//! The fence check end to end against real `tenure` processes: through the native protocol
//! (sent to a node that does not lead the key's group, so it is forwarded), the HTTP route on a
//! follower, the client library and `tenurectl check-fence` (exit code 0 when current, 4 when
//! not). Over a resource's life a token is current exactly while its lease is the resource's
//! active lease: released, superseded by a new grant, or never granted, it is not.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Duration;

use tenure_client::ResourceKey;

use crate::client_library::{cluster_with_a_follower_of_group_0, tenurectl_cluster_file};
use tenure_core::{LeaseReply, LeaseStatus};
use tenure_proto::client::{RequestBody, ResponseBody};
use tenure_testkit::{TENANT, forward, http_request};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_checks_follow_the_resources_current_grant_on_every_path() {
    let (cluster, client, follower) = cluster_with_a_follower_of_group_0().await;
    let resource = cluster.resource_in_group(TENANT, 0, "fenced", 0);
    let key = ResourceKey::new(TENANT, resource.clone());

    // Native, forwarded by a follower: no lease yet, then alice's.
    let raw = cluster.client(follower).await;
    let native = |token: u64| {
        let raw = &raw;
        let key = key.clone();
        async move {
            let body = RequestBody::CheckFence {
                key,
                fencing_token: token,
            };
            match raw.call(body, forward()).await.unwrap() {
                ResponseBody::FenceChecked(result) => result,
                other => panic!("CheckFence answered {other:?}"),
            }
        }
    };
    let absent = native(1).await;
    assert!(!absent.verdict.current);
    assert_eq!(absent.verdict.status, LeaseStatus::Absent);
    assert_eq!(absent.group_id, 0);
    let acquired = raw
        .acquire(TENANT, &resource, "alice", 30_000, "f-1")
        .await
        .unwrap();
    let LeaseReply::Acquired(alice) = acquired.reply else {
        panic!("{acquired:?}")
    };
    let current = native(alice.fencing_token).await;
    assert!(current.verdict.current, "{current:?}");
    assert_eq!(
        current.verdict.latest_fencing_token,
        Some(alice.fencing_token)
    );
    assert!(current.verdict.remaining_ttl_ms > 0 && current.verdict.remaining_ttl_ms <= 30_000);
    assert!(!native(alice.fencing_token + 1).await.verdict.current);

    // Released: alice's token is no longer current (client library).
    let released = raw
        .release(TENANT, &resource, alice.lease_id, "alice", "f-2")
        .await
        .unwrap();
    assert!(matches!(released.reply, LeaseReply::Released(_)));
    let after_release = client.check_fence(&key, alice.fencing_token).await.unwrap();
    assert!(!after_release.verdict.current);
    assert_eq!(after_release.verdict.status, LeaseStatus::Released);

    // Bob's grant supersedes alice's token for good (HTTP on the follower).
    let bob = client
        .acquire(TENANT, resource.clone(), "bob", Duration::from_secs(30))
        .await
        .unwrap();
    assert!(bob.fencing_token() > alice.fencing_token);
    let http = |token: u64| {
        let url = format!("{}/v1/leases/check-fence", cluster.http_url(follower));
        let body = serde_json::json!({
            "tenant_id": TENANT, "resource_id": resource, "fencing_token": token,
        });
        async move {
            let (status, _, reply) = http_request(
                "POST",
                &url,
                &[
                    ("X-Tenure-Principal-Tenant", TENANT),
                    ("X-Tenure-Principal-Id", "fence-tests"),
                ],
                Some(serde_json::to_vec(&body).unwrap()),
            )
            .await
            .unwrap();
            let reply: serde_json::Value = serde_json::from_slice(&reply).unwrap();
            assert_eq!(status, 200, "{reply}");
            reply
        }
    };
    let zombie = http(alice.fencing_token).await;
    assert_eq!(zombie["current"], false);
    assert_eq!(zombie["status"], "ACTIVE");
    assert_eq!(zombie["latest_fencing_token"], bob.fencing_token());
    assert_eq!(http(bob.fencing_token()).await["current"], true);

    // tenurectl: exit code 0 for bob's token, 4 for alice's, the report printed in both cases.
    let cluster_file = tenurectl_cluster_file(&cluster);
    let check = |token: u64| {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_tenurectl"))
            .arg("--cluster")
            .arg(&cluster_file)
            .args(["-o", "json", "check-fence", "--tenant", TENANT])
            .args(["--resource", &resource])
            .args(["--fencing-token", &token.to_string()])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        let report: serde_json::Value = serde_json::from_str(&stdout).unwrap_or_else(|error| {
            panic!(
                "tenurectl check-fence: {error}: {stdout} {}",
                String::from_utf8_lossy(&output.stderr)
            )
        });
        (output.status.code(), report)
    };
    let (code, report) = check(bob.fencing_token());
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(report["current"], true);
    let (code, report) = check(alice.fencing_token);
    assert_eq!(code, Some(4), "{report}");
    assert_eq!(report["current"], false);
    assert_eq!(report["latest_fencing_token"], bob.fencing_token());

    // Never a follower's state: without forwarding a follower refuses, stale read or not.
    for stale_read in [false, true] {
        let flags = tenure_proto::client::RequestFlags {
            forward: false,
            stale_read,
            ..tenure_proto::client::RequestFlags::default()
        };
        let body = RequestBody::CheckFence {
            key: key.clone(),
            fencing_token: bob.fencing_token(),
        };
        match raw.call(body, flags).await {
            Err(error) => assert_eq!(error.code, tenure_client::ErrorCode::NotLeader),
            Ok(answer) => {
                // Leader balancing may have moved group 0's leadership onto this node.
                assert!(
                    cluster.leader_of(follower, 0).await == Some(follower),
                    "a follower answered {answer:?}"
                );
            }
        }
    }
    // Another tenant's resource is refused; a malformed key is refused before any read.
    let foreign = RequestBody::CheckFence {
        key: ResourceKey::new("another-tenant", resource.clone()),
        fencing_token: 1,
    };
    let refused = raw.call(foreign, forward()).await.unwrap_err();
    assert_eq!(refused.code, tenure_client::ErrorCode::Forbidden);
    let malformed = client
        .check_fence(&ResourceKey::new(TENANT, ""), 1)
        .await
        .unwrap_err();
    assert_eq!(
        malformed.code(),
        Some(tenure_client::ErrorCode::InvalidArgument)
    );
    bob.release().await.unwrap();
    client.close().await;
}
