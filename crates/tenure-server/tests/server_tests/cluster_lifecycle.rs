//! Lifecycle of a cluster of real `tenure` node processes on loopback, over the native QUIC
//! client protocol: the whole lease lifecycle through any node (acquire, get, renew, conflicting
//! acquire, release, list, idempotent retry, TTL bounds); `NOT_LEADER` with the leader hint and
//! forwarding, stale reads from followers; a restarted node catching up (through a snapshot when
//! its group logs were purged past it); SIGTERM handing leadership away before a clean exit with
//! no acknowledged lease lost; and `tenure serve` refusing a data directory of another node.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    missing_docs
)]

use crate::common;

use std::time::{Duration, Instant};

use common::{
    ClusterOptions, ProcessCluster, TENANT, forward, no_forward, stale, status_of, view_of,
    wait_for,
};
use tenure_core::{
    AcquireRequest, ErrorCode, LeaseError, LeaseReply, LeaseStatus, ListRequest, ResourceKey,
};
use tenure_proto::client::{RequestBody, ResponseBody};

const LONG_TTL_MS: u64 = 60_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_lifecycle_through_any_node() {
    let cluster = ProcessCluster::start_ready(ClusterOptions::default()).await;
    let clients = [
        cluster.client(1).await,
        cluster.client(2).await,
        cluster.client(3).await,
    ];
    let resource = "lifecycle-resource";

    // Acquire through node 1.
    let acquired = clients[0]
        .acquire(TENANT, resource, "holder-a", 30_000, "req-acquire-1")
        .await
        .expect("acquire");
    assert!(!acquired.replayed);
    assert_eq!(acquired.group_id, cluster.group_of(TENANT, resource));
    let LeaseReply::Acquired(grant) = acquired.reply.clone() else {
        panic!("acquire answered {:?}", acquired.reply);
    };
    assert!(grant.created);
    assert_eq!(grant.ttl_ms, 30_000);
    assert_eq!(grant.expires_at_ms, grant.log_time_ms + 30_000);
    assert_eq!(grant.fencing_token, grant.lease_id.sequence);
    assert!(grant.fencing_token > 0);

    // Get through node 2: ACTIVE, holder, remaining ttl.
    let got = clients[1]
        .get(TENANT, resource, forward())
        .await
        .expect("get");
    assert!(!got.stale);
    let view = view_of(&got);
    assert_eq!(view.status, LeaseStatus::Active);
    assert_eq!(view.holder_id, "holder-a");
    assert_eq!(view.lease_id, grant.lease_id);
    assert_eq!(view.fencing_token, grant.fencing_token);
    assert!(
        view.remaining_ttl_ms > 0 && view.remaining_ttl_ms <= 30_000,
        "remaining ttl {}",
        view.remaining_ttl_ms
    );

    // Renew through node 3: same lease id and token, later expiry.
    let renewed = clients[2]
        .renew(
            TENANT,
            resource,
            grant.lease_id,
            "holder-a",
            40_000,
            "req-renew-1",
        )
        .await
        .expect("renew");
    let LeaseReply::Renewed(renewal) = renewed.reply else {
        panic!("renew answered {:?}", renewed.reply);
    };
    assert_eq!(renewal.lease_id, grant.lease_id);
    assert_eq!(renewal.fencing_token, grant.fencing_token);
    assert!(!renewal.created);
    assert!(renewal.expires_at_ms > grant.expires_at_ms);

    // A second holder: ALREADY_HELD with the holder and the remaining ttl.
    let error = clients[1]
        .acquire(TENANT, resource, "holder-b", 30_000, "req-acquire-b")
        .await
        .expect_err("a second holder must not get the lease");
    assert_eq!(error.code, ErrorCode::AlreadyHeld, "{error}");
    assert!(!error.retryable);
    match &error.lease_error {
        Some(LeaseError::AlreadyHeld {
            holder_id,
            remaining_ttl_ms,
        }) => {
            assert_eq!(holder_id.as_str(), "holder-a");
            assert!(*remaining_ttl_ms > 0 && *remaining_ttl_ms <= 40_000);
        }
        other => panic!("ALREADY_HELD without its details: {other:?}"),
    }
    // Not re-entrant: the holder itself gets ALREADY_HELD too.
    let error = clients[0]
        .acquire(TENANT, resource, "holder-a", 30_000, "req-acquire-again")
        .await
        .expect_err("acquire is not re-entrant");
    assert_eq!(error.code, ErrorCode::AlreadyHeld, "{error}");

    // List for the tenant (the resource's group) shows it.
    let group = cluster.group_of(TENANT, resource);
    let answer = clients[2]
        .call(
            RequestBody::List {
                group_id: group,
                request: ListRequest {
                    tenant_id: TENANT.to_string(),
                    page_size: 100,
                    page_token: None,
                    status: None,
                },
            },
            forward(),
        )
        .await
        .expect("list");
    let ResponseBody::List(page) = answer else {
        panic!("list answered {answer:?}");
    };
    assert!(
        page.leases
            .iter()
            .any(|lease| lease.key.resource_id == resource && lease.lease_id == grant.lease_id),
        "list of group {group}: {:?}",
        page.leases
    );

    // Release through node 2, then Get says RELEASED.
    let released = clients[1]
        .release(
            TENANT,
            resource,
            grant.lease_id,
            "holder-a",
            "req-release-1",
        )
        .await
        .expect("release");
    let LeaseReply::Released(receipt) = released.reply else {
        panic!("release answered {:?}", released.reply);
    };
    assert_eq!(receipt.lease_id, grant.lease_id);
    assert_eq!(receipt.fencing_token, grant.fencing_token);
    let got = clients[0]
        .get(TENANT, resource, forward())
        .await
        .expect("get");
    assert_eq!(status_of(&got), LeaseStatus::Released);

    // Retrying the original acquire (same request id) returns the original lease, replayed.
    let replay = clients[2]
        .acquire(TENANT, resource, "holder-a", 30_000, "req-acquire-1")
        .await
        .expect("replayed acquire");
    assert!(replay.replayed, "{replay:?}");
    assert_eq!(replay.reply, acquired.reply);

    // The same request id for another holder is refused and does not overwrite the original.
    let error = clients[0]
        .acquire(TENANT, resource, "holder-z", 30_000, "req-acquire-1")
        .await
        .expect_err("a request id reused for another holder");
    assert_eq!(error.code, ErrorCode::InvalidArgument, "{error}");
    let replay = clients[1]
        .acquire(TENANT, resource, "holder-a", 30_000, "req-acquire-1")
        .await
        .expect("replayed acquire");
    assert!(replay.replayed);
    assert_eq!(replay.reply, acquired.reply);

    // A new grant after release gets a larger fencing token.
    let next = clients[0]
        .acquire(TENANT, resource, "holder-b", 30_000, "req-acquire-b2")
        .await
        .expect("acquire after release");
    let LeaseReply::Acquired(next_grant) = next.reply else {
        panic!("{:?}", next.reply);
    };
    assert!(next_grant.fencing_token > grant.fencing_token);

    // TTL below the minimum: INVALID_ARGUMENT naming the bounds.
    let (ttl_min, ttl_max) = cluster.ttl_bounds_ms();
    let error = clients[1]
        .acquire(
            TENANT,
            "lifecycle-short",
            "holder-a",
            ttl_min - 1,
            "req-short",
        )
        .await
        .expect_err("ttl below the minimum");
    assert_eq!(error.code, ErrorCode::InvalidArgument, "{error}");
    assert!(
        error.message.contains(&ttl_min.to_string())
            && error.message.contains(&ttl_max.to_string()),
        "the message should name the bounds: {}",
        error.message
    );
    let error = clients[2]
        .acquire(
            TENANT,
            "lifecycle-long",
            "holder-a",
            ttl_max + 1,
            "req-long",
        )
        .await
        .expect_err("ttl above the maximum");
    assert_eq!(error.code, ErrorCode::InvalidArgument, "{error}");

    // call_many: many requests in one frame, answered each.
    let requests = (0..20)
        .map(|i| {
            (
                RequestBody::Lease(tenure_core::LeaseOp::Acquire(AcquireRequest {
                    key: ResourceKey::new(TENANT, format!("many-{i}")),
                    holder_id: "holder-m".to_string(),
                    ttl_ms: LONG_TTL_MS,
                    request_id: format!("many-req-{i}"),
                })),
                forward(),
            )
        })
        .collect();
    let answers = clients[0].call_many(requests).await.expect("call_many");
    assert_eq!(answers.len(), 20);
    for answer in answers {
        assert!(matches!(answer, Ok(ResponseBody::Lease(_))), "{answer:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_leader_hint_forwarding_and_stale_reads() {
    let cluster = ProcessCluster::start_ready(ClusterOptions::default()).await;
    // Every group at its preferred leader, so the balancer moves nothing during the test.
    let leaders = cluster
        .wait_balanced(&cluster.ids(), Duration::from_secs(30))
        .await;
    let group = 0;
    let leader = leaders[group as usize].leader.unwrap();
    let follower = cluster.ids().into_iter().find(|&id| id != leader).unwrap();
    let resource = cluster.resource_in_group(TENANT, group, "routing", 0);
    let client = cluster.client(follower).await;

    // forward = false on a follower: NOT_LEADER with the leader's addresses.
    let body = RequestBody::Lease(tenure_core::LeaseOp::Acquire(AcquireRequest {
        key: ResourceKey::new(TENANT, resource.clone()),
        holder_id: "holder-a".to_string(),
        ttl_ms: LONG_TTL_MS,
        request_id: "routing-acquire".to_string(),
    }));
    let error = client
        .call(body.clone(), no_forward())
        .await
        .expect_err("a follower must not accept a write");
    assert_eq!(error.code, ErrorCode::NotLeader, "{error}");
    assert!(error.retryable);
    assert_eq!(error.placement_version, 1);
    let hint = error.leader_hint.clone().expect("a leader hint");
    assert_eq!(hint.node_id, leader);
    assert_eq!(hint.client_addr, cluster.node(leader).quic_addr.to_string());
    assert_eq!(hint.http_url, cluster.http_url(leader));

    // Get with forward = false on the follower: NOT_LEADER too (no silent stale read).
    let error = client
        .get(TENANT, &resource, no_forward())
        .await
        .expect_err("linearizable get on a follower");
    assert_eq!(error.code, ErrorCode::NotLeader, "{error}");

    // forward = true: the follower forwards to the leader.
    let acquired = common::lease_result(client.call(body, forward()).await).expect("forwarded");
    assert_eq!(acquired.group_id, group);
    let LeaseReply::Acquired(grant) = acquired.reply else {
        panic!("{:?}", acquired.reply);
    };

    // The leader answers directly with forward = false.
    let leader_client = cluster.client(leader).await;
    let got = leader_client
        .get(TENANT, &resource, no_forward())
        .await
        .expect("get on the leader");
    assert!(!got.stale);
    assert_eq!(view_of(&got).lease_id, grant.lease_id);

    // A stale read on the follower is answered locally and says so (bounded wait for the
    // follower to apply the entry).
    let view = wait_for(
        Duration::from_secs(10),
        "the follower applies the grant",
        || async {
            let got = client.get(TENANT, &resource, stale()).await.ok()?;
            assert!(
                got.stale,
                "a follower's answer must be marked stale: {got:?}"
            );
            (got.view.as_ref()?.lease_id == grant.lease_id).then_some(got)
        },
    )
    .await
    .unwrap();
    assert_eq!(view_of(&view).status, LeaseStatus::Active);

    // The routing table: version 1, the placement map clients compute, every node's addresses.
    let table = cluster.routing(follower).await.unwrap();
    assert_eq!(table.placement_version, 1);
    assert_eq!(table.groups, cluster.options.groups);
    let expected: Vec<u32> = cluster
        .placement()
        .slot_groups()
        .iter()
        .map(|group| group.0)
        .collect();
    assert_eq!(table.slot_groups, expected);
    assert_eq!(table.nodes.len(), 3);
    for node in &table.nodes {
        assert_eq!(
            node.client_addr,
            cluster.node(node.node_id).quic_addr.to_string()
        );
        assert_eq!(node.http_url, cluster.http_url(node.node_id));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_node_catches_up_through_a_snapshot() {
    let mut cluster = ProcessCluster::start_ready(ClusterOptions {
        groups: 4,
        snapshot_every_entries: Some(20),
        fsync: false,
        log_filter: Some(
            "info,openraft=warn,openraft::engine::handler::following_handler=info,openraft::engine::handler::log_handler=info".to_string(),
        ),
        ..ClusterOptions::default()
    })
    .await;
    let victim = 3;
    let survivors = [1, 2];
    cluster.terminate(victim);
    let status = cluster.wait_exit(victim, Duration::from_secs(30));
    assert!(status.success(), "node {victim} exited with {status}");
    let leaders = wait_for(
        Duration::from_secs(20),
        "survivors lead every group",
        || async {
            let leaders = cluster.agreed_leaders(&survivors).await?;
            leaders
                .iter()
                .all(|leader| leader.leader != Some(victim))
                .then_some(leaders)
        },
    )
    .await
    .unwrap();

    // A few hundred acquires spread over the groups, through any survivor, in frames of 40.
    let client = cluster.client(1).await;
    let mut last_per_group = std::collections::BTreeMap::new();
    let mut written = Vec::new();
    for frame in 0..8 {
        let requests = (0..40)
            .map(|i| {
                let resource = format!("catch-up-{frame}-{i}");
                (
                    RequestBody::Lease(tenure_core::LeaseOp::Acquire(AcquireRequest {
                        key: ResourceKey::new(TENANT, resource),
                        holder_id: "holder-c".to_string(),
                        ttl_ms: 600_000,
                        request_id: format!("catch-up-req-{frame}-{i}"),
                    })),
                    forward(),
                )
            })
            .collect::<Vec<_>>();
        let answers = client.call_many(requests).await.expect("acquires");
        for (i, answer) in answers.into_iter().enumerate() {
            let resource = format!("catch-up-{frame}-{i}");
            let result = common::lease_result(answer).expect("acquire");
            let LeaseReply::Acquired(grant) = result.reply else {
                panic!("{:?}", result.reply);
            };
            last_per_group.insert(result.group_id, (resource.clone(), grant.lease_id));
            written.push((resource, grant.lease_id));
        }
    }
    // Then push one group's log far past the default 1000 entries kept after a snapshot, one
    // entry per acquire, so the stopped node is behind the purge point of that group.
    let deep_group = 0u32;
    let deep_leader = leaders[deep_group as usize].leader.unwrap();
    let leader_client = cluster.client(deep_leader).await;
    let started = Instant::now();
    let deep = cluster.resources_in_group(TENANT, deep_group, "deep", 1_100);
    for (i, resource) in deep.into_iter().enumerate() {
        let result = leader_client
            .acquire(
                TENANT,
                &resource,
                "holder-d",
                600_000,
                &format!("deep-req-{i}"),
            )
            .await
            .expect("deep acquire");
        let LeaseReply::Acquired(grant) = result.reply else {
            panic!("{:?}", result.reply);
        };
        if i % 100 == 99 {
            written.push((resource.clone(), grant.lease_id));
        }
        last_per_group.insert(deep_group, (resource, grant.lease_id));
    }
    println!(
        "wrote 320 acquires over {} groups, then 1100 one by one to group {deep_group} in {} ms",
        cluster.options.groups,
        started.elapsed().as_millis()
    );

    // The leader purges its log after a snapshot, once no replication still reads the purged
    // entries: on a fast machine the writes above end before that happens, and a node
    // restarted at once would catch up from the log. Wait for the purge (only group 0's log is
    // long enough to purge anything; openraft logs each purge at info).
    wait_for(
        Duration::from_secs(30),
        "group 0's leader purges its log",
        || async {
            let log = common::tail(&cluster.node(deep_leader).log_path, 1_000_000);
            log.lines()
                .any(|line| line.contains("purge log") && !line.ends_with("purge_upto: None"))
                .then_some(())
        },
    )
    .await
    .unwrap_or_else(|what| panic!("{what}"));

    // Restart the stopped node; wait until its routing view and stale reads show the writes.
    cluster.restart(victim);
    let restarted = Instant::now();
    let groups = cluster.options.groups;
    wait_for(
        Duration::from_secs(60),
        "the restarted node catches up",
        || async {
            let table = cluster.routing(victim).await.ok()?;
            if table.leaders.len() != groups as usize
                || table.leaders.iter().any(|leader| leader.leader.is_none())
            {
                return None;
            }
            let client = cluster.try_client(victim).await?;
            for (resource, lease_id) in last_per_group.values() {
                let got = client.get(TENANT, resource, stale()).await.ok()?;
                if got.view.as_ref().map(|view| view.lease_id) != Some(*lease_id) {
                    client.close().await;
                    return None;
                }
            }
            client.close().await;
            Some(())
        },
    )
    .await
    .unwrap_or_else(|what| panic!("{what}"));
    let catch_up = restarted.elapsed();
    println!("restart catch-up: {} ms", catch_up.as_millis());

    // Every acknowledged write is on the restarted node (stale reads of its own replica).
    let client = cluster.client(victim).await;
    let requests = written
        .iter()
        .map(|(resource, _)| {
            (
                RequestBody::Get {
                    key: ResourceKey::new(TENANT, resource.clone()),
                },
                stale(),
            )
        })
        .collect();
    let answers = client.call_many(requests).await.expect("stale gets");
    for ((resource, lease_id), answer) in written.iter().zip(answers) {
        let Ok(ResponseBody::Get(got)) = answer else {
            panic!("stale get of {resource}: {answer:?}");
        };
        let view = got
            .view
            .as_ref()
            .unwrap_or_else(|| panic!("{resource} missing"));
        assert_eq!(view.lease_id, *lease_id, "{resource}");
        assert_eq!(view.status, LeaseStatus::Active, "{resource}");
    }
    // openraft's own record that the restarted replica received a whole snapshot (the log
    // filter of this cluster keeps that line).
    let log = common::tail(&cluster.node(victim).log_path, 1_000_000);
    let installs = log
        .lines()
        .filter(|line| line.contains("install full snapshot"))
        .count();
    println!("restarted node installed {installs} snapshot(s) sent by leaders");
    assert!(
        installs >= 1,
        "node {victim} caught up without receiving a snapshot, though group {deep_group}'s log \
         was purged past it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_hands_leadership_away_then_exits_cleanly() {
    let mut cluster = ProcessCluster::start_ready(ClusterOptions::default()).await;
    let ids = cluster.ids();
    let leaders = cluster.wait_balanced(&ids, Duration::from_secs(30)).await;
    let victim = 1;
    let victim_groups: Vec<u32> = leaders
        .iter()
        .filter(|leader| leader.leader == Some(victim))
        .map(|leader| leader.group_id)
        .collect();
    assert!(!victim_groups.is_empty());

    // Leases in every group, acknowledged before the SIGTERM.
    let client = cluster.client(2).await;
    let mut acknowledged = Vec::new();
    for group in 0..cluster.options.groups {
        let resource = cluster.resource_in_group(TENANT, group, "sigterm", 0);
        let result = client
            .acquire(
                TENANT,
                &resource,
                "holder-t",
                LONG_TTL_MS,
                &format!("sigterm-{group}"),
            )
            .await
            .expect("acquire");
        let LeaseReply::Acquired(grant) = result.reply else {
            panic!("{:?}", result.reply);
        };
        acknowledged.push((resource, grant.lease_id));
    }

    let survivors = [2, 3];
    cluster.terminate(victim);
    let signalled = Instant::now();
    let mut moved_at = None;
    let mut exited = None;
    let deadline = signalled + Duration::from_secs(30);
    while (moved_at.is_none() || exited.is_none()) && Instant::now() < deadline {
        if moved_at.is_none() {
            if let Some(leaders) = cluster.agreed_leaders(&survivors).await {
                if leaders.iter().all(|leader| leader.leader != Some(victim)) {
                    moved_at = Some(signalled.elapsed());
                }
            }
        }
        if exited.is_none() {
            if let Some(status) = cluster.has_exited(victim) {
                exited = Some((signalled.elapsed(), status));
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let moved_at = moved_at.expect("leadership moved to the survivors");
    let (exited_at, status) = exited.expect("the node exited after SIGTERM");
    println!(
        "sigterm: node {victim} led {} groups; all led elsewhere after {} ms, process exited after {} ms ({status})",
        victim_groups.len(),
        moved_at.as_millis(),
        exited_at.as_millis()
    );
    assert!(status.success(), "exit status after SIGTERM: {status}");
    let log = common::tail(&cluster.node(victim).log_path, 100_000);
    assert!(
        !log.contains("still leading some groups"),
        "the node gave up handing leadership away:\n{}",
        common::tail(&cluster.node(victim).log_path, 40)
    );

    // Every acknowledged lease is still there, through either survivor. Leadership has just
    // moved: a survivor may still route by a leader view a moment old, so a retryable error is
    // retried (bounded); any other error fails.
    for (i, (resource, lease_id)) in acknowledged.iter().enumerate() {
        let client = cluster.client(survivors[i % 2]).await;
        let retry_until = Instant::now() + Duration::from_secs(10);
        let got = loop {
            match client.get(TENANT, resource, forward()).await {
                Ok(got) => break got,
                Err(error) if error.retryable && Instant::now() < retry_until => {
                    println!("sigterm: get of {resource} retried after {error}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(error) => panic!("get of {resource}: {error:?}"),
            }
        };
        let view = view_of(&got);
        assert_eq!(view.lease_id, *lease_id, "{resource}");
        assert_eq!(view.status, LeaseStatus::Active, "{resource}");
        client.close().await;
    }
}

/// `tenure serve` refuses a data directory that belongs to another node, with a clear message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_refuses_a_data_dir_of_another_node() {
    let dir = tempfile::tempdir().unwrap();
    let certs = common::write_certs(dir.path(), &[1, 2]);
    let data_dir = dir.path().join("shared-data");
    tenure_server::identity::claim_data_dir(&data_dir, 1, common::CLUSTER_NAME)
        .expect("claiming the directory for node 1");
    let peers = [(1u64, 17_401u16), (2, 17_402)]
        .into_iter()
        .map(|(id, port)| {
            (
                id,
                tenure_server::config::PeerConfig {
                    addr: format!("127.0.0.1:{port}").parse().unwrap(),
                    http_addr: format!("127.0.0.1:{}", port + 100).parse().unwrap(),
                },
            )
        })
        .collect();
    let config = common::node_config(
        2,
        &data_dir,
        &certs,
        &peers,
        &ClusterOptions {
            nodes: 2,
            ..ClusterOptions::default()
        },
    );
    let config_path = dir.path().join("node-2.toml");
    common::write_config(&config_path, &config);
    let log_path = dir.path().join("node-2.log");
    let mut child = common::spawn_serve(&config_path, &log_path);
    let status = common::wait_child_exit(&mut child, Duration::from_secs(20));
    let output = common::tail(&log_path, 50);
    let Some(status) = status else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("tenure serve kept running with another node's data directory:\n{output}");
    };
    assert!(!status.success(), "exit status {status}\n{output}");
    assert!(
        output.contains("belongs to node 1") && output.contains("this is node 2"),
        "the error should say whose directory it is:\n{output}"
    );
    // The identity file was not rewritten.
    let identity = tenure_server::identity::read_identity(&data_dir)
        .unwrap()
        .unwrap();
    assert_eq!(identity.node_id, 1);
}

/// More nodes than replicas (5 nodes, replication factor 3): each node hosts only some groups,
/// learns the leaders of the others from its peers, and still answers any key by forwarding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_nodes_three_replicas_route_every_key_through_every_node() {
    let cluster = ProcessCluster::start_ready(ClusterOptions {
        nodes: 5,
        groups: 10,
        ..ClusterOptions::default()
    })
    .await;
    // Readiness already needs a known leader for every group; check each node's table too.
    for id in 1..=5u64 {
        let leaders = cluster.leaders(id).await.expect("routing");
        assert_eq!(leaders.len(), 10);
        assert!(
            leaders.iter().all(|leader| leader.leader.is_some()),
            "node {id} lacks a leader: {leaders:?}"
        );
    }
    let mut clients = Vec::new();
    for id in 1..=5u64 {
        clients.push(cluster.client(id).await);
    }
    let mut groups_seen = std::collections::BTreeSet::new();
    for (index, client) in clients.iter().enumerate() {
        for k in 0..4 {
            let resource = format!("rf3-{index}-{k}");
            let acquired = client
                .acquire(TENANT, &resource, "holder", LONG_TTL_MS, &format!("rq-{k}"))
                .await
                .unwrap_or_else(|e| panic!("acquire {resource} via node {}: {e}", index + 1));
            groups_seen.insert(acquired.group_id);
            // Read it back through the next node (which may not host the group).
            let reader = &clients[(index + 1) % clients.len()];
            let got = reader
                .get(TENANT, &resource, forward())
                .await
                .unwrap_or_else(|e| panic!("get {resource} via node {}: {e}", index + 2));
            assert_eq!(view_of(&got).status, LeaseStatus::Active);
        }
    }
    println!(
        "five nodes, replication factor 3: 20 acquires and reads through every node over {} groups",
        groups_seen.len()
    );
}
