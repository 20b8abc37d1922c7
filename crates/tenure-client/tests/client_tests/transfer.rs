//! Transfer end to end against real `tenure` processes: through the native protocol (sent to a
//! node that does not lead the key's group, so it is forwarded), the HTTP route, the client
//! library (`Lease::transfer`, then `Client::adopt` by the new holder) and `tenurectl transfer`.
//! At every hand-over the resource is never free (another holder's acquire is refused at once),
//! the new holder's token is higher, and the old holder's lease is gone.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Duration;

use tenure_client::{ErrorCode, ResourceKey};

use crate::client_library::{cluster_with_a_follower_of_group_0, connect, tenurectl_cluster_file};
use tenure_core::{LeaseOp, LeaseReply, LeaseStatus, TransferRequest};
use tenure_proto::client::RequestBody;
use tenure_testkit::{TENANT, forward, http_request, lease_result};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfer_works_through_native_http_client_library_and_tenurectl() {
    let (cluster, client, follower) = cluster_with_a_follower_of_group_0().await;
    let resource = cluster.resource_in_group(TENANT, 0, "native", 0);
    let key = ResourceKey::new(TENANT, resource.clone());
    let raw = cluster.client(follower).await;
    let acquired = raw
        .acquire(TENANT, &resource, "alice", 30_000, "n-1")
        .await
        .unwrap();
    let LeaseReply::Acquired(old) = acquired.reply else {
        panic!("{acquired:?}")
    };
    let body = RequestBody::Lease(LeaseOp::Transfer(TransferRequest {
        key: key.clone(),
        lease_id: old.lease_id,
        holder_id: "alice".into(),
        new_holder_id: "bob".into(),
        ttl_ms: 20_000,
        request_id: "n-2".into(),
    }));
    let transferred = lease_result(raw.call(body.clone(), forward()).await).unwrap();
    let LeaseReply::Transferred(receipt) = &transferred.reply else {
        panic!("{transferred:?}")
    };
    assert_eq!(receipt.released.lease_id, old.lease_id);
    assert!(receipt.grant.fencing_token > old.fencing_token);
    assert_eq!(receipt.grant.ttl_ms, 20_000);
    // The same request again replays; nobody else can acquire; alice's lease is gone.
    let again = lease_result(raw.call(body, forward()).await).unwrap();
    assert!(again.replayed);
    assert_eq!(again.reply, transferred.reply);
    let refused = raw
        .acquire(TENANT, &resource, "carol", 10_000, "n-3")
        .await
        .unwrap_err();
    assert_eq!(refused.code, ErrorCode::AlreadyHeld);
    let renew_old = raw
        .renew(TENANT, &resource, old.lease_id, "alice", 10_000, "n-4")
        .await
        .unwrap_err();
    assert_eq!(renew_old.code, ErrorCode::LeaseMismatch);
    let view = client.get(&key).await.unwrap().view.unwrap();
    assert_eq!(view.holder_id, "bob");
    assert_eq!(view.fencing_token, receipt.grant.fencing_token);

    // --- HTTP: bob hands it to dave.
    let url = format!("{}/v1/leases/transfer", cluster.http_url(follower));
    let request = serde_json::json!({
        "tenant_id": TENANT, "resource_id": resource, "holder_id": "bob",
        "lease_id": receipt.grant.lease_id.to_string(), "new_holder_id": "dave",
        "ttl_seconds": 15, "request_id": "h-1"
    });
    let (status, _, reply) = http_request(
        "POST",
        &url,
        &[
            ("X-Tenure-Principal-Tenant", TENANT),
            ("X-Tenure-Principal-Id", "transfer-tests"),
        ],
        Some(serde_json::to_vec(&request).unwrap()),
    )
    .await
    .unwrap();
    let reply: serde_json::Value = serde_json::from_slice(&reply).unwrap();
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["holder_id"], "dave");
    assert_eq!(reply["ttl_ms"], 15_000);
    assert_eq!(
        reply["previous_lease_id"],
        receipt.grant.lease_id.to_string()
    );
    let http_token = reply["fencing_token"].as_u64().unwrap();
    assert!(http_token > receipt.grant.fencing_token);
    let view = client.get(&key).await.unwrap().view.unwrap();
    assert_eq!(
        (view.holder_id.as_str(), view.fencing_token),
        ("dave", http_token)
    );

    // --- client library: a renewing handle hands over; the new holder adopts it elsewhere.
    let resource = cluster.resource_in_group(TENANT, 1, "library", 0);
    let key = ResourceKey::new(TENANT, resource.clone());
    let lease = client
        .acquire(TENANT, resource.clone(), "erin", Duration::from_secs(10))
        .await
        .unwrap();
    let old_token = lease.fencing_token();
    // A transfer the cluster refuses before changing anything (the new ttl is below the
    // bounds) gives the handle back, still held.
    let refused = lease
        .transfer("frank", Duration::from_millis(10))
        .await
        .unwrap_err();
    assert_eq!(refused.error.code(), Some(ErrorCode::InvalidArgument));
    let lease = refused.lease.expect("the handle comes back");
    assert!(lease.is_valid());
    assert_eq!(lease.fencing_token(), old_token);
    let transferred = lease
        .transfer("frank", Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(transferred.grant.holder_id, "frank");
    assert!(transferred.grant.fencing_token > old_token);
    let other = connect(&cluster).await;
    let adopted = other
        .adopt(key.clone(), "frank", Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(adopted.lease_id(), transferred.grant.lease_id);
    assert_eq!(adopted.fencing_token(), transferred.grant.fencing_token);
    assert!(adopted.is_valid());
    let not_ours = other
        .adopt(key.clone(), "erin", Duration::from_secs(10))
        .await
        .unwrap_err();
    assert_eq!(not_ours.code(), Some(ErrorCode::LeaseMismatch));
    adopted.release().await.unwrap();
    let view = client.get(&key).await.unwrap().view.unwrap();
    assert_eq!(view.status, LeaseStatus::Released);

    // --- tenurectl: acquire as grace, transfer to heidi, read it back.
    let tenurectl = env!("CARGO_BIN_EXE_tenurectl");
    let cluster_file = tenurectl_cluster_file(&cluster);
    let resource = cluster.resource_in_group(TENANT, 2, "cli", 0);
    let run = |args: &[&str]| {
        let output = std::process::Command::new(tenurectl)
            .arg("--cluster")
            .arg(&cluster_file)
            .args(["-o", "json"])
            .args(args)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "tenurectl {args:?}: {stdout} {}",
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_str::<serde_json::Value>(&stdout).unwrap()
    };
    let acquired = run(&[
        "acquire",
        "--tenant",
        TENANT,
        "--resource",
        &resource,
        "--holder",
        "grace",
        "--ttl-ms",
        "20000",
    ]);
    let lease_id = acquired["lease_id"].as_str().unwrap().to_owned();
    let transferred = run(&[
        "transfer",
        "--tenant",
        TENANT,
        "--resource",
        &resource,
        "--lease-id",
        &lease_id,
        "--holder",
        "grace",
        "--to",
        "heidi",
        "--ttl-ms",
        "20000",
    ]);
    assert_eq!(transferred["holder_id"], "heidi");
    assert_eq!(transferred["previous_lease_id"], lease_id.as_str());
    assert!(
        transferred["fencing_token"].as_u64().unwrap()
            > acquired["fencing_token"].as_u64().unwrap()
    );
    let read = run(&["get", "--tenant", TENANT, "--resource", &resource]);
    assert_eq!(read["holder_id"], "heidi");
    assert_eq!(read["fencing_token"], transferred["fencing_token"]);
}
