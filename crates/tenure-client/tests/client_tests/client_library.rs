//! The client library (`tenure-client`) against a cluster of real `tenure` node processes:
//! calls go straight to each group's leader and follow leader changes; an auto-renewed lease
//! survives the failover of its group's leader; the at-risk report, then the loss signal, fire
//! before the safe deadline when renewals cannot get through (every node paused), and the loss
//! signal when the cluster refuses a renewal;
//! an acquire whose answer is lost is retried with the same request id and returns the same
//! lease; and the renewals of 10,000 held leases are coalesced (the nodes' metrics show the
//! renewals per request).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    clippy::cast_possible_truncation,
    missing_docs
)]

use tenure_testkit as common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{ClusterOptions, ProcessCluster, TENANT, http_request, wait_for};
use futures_util::StreamExt as _;
use tenure_client::{
    AcquireOptions, Client, ClientConfig, Credentials, Endpoint, ErrorCode, LeaseState,
    LeaseStatus, LossReason, ResourceKey,
};

/// A client configuration for `cluster`: every node as an endpoint, insecure development
/// credentials, a fixed jitter seed.
pub(crate) fn client_config(cluster: &ProcessCluster) -> ClientConfig {
    let endpoints = cluster
        .ids()
        .into_iter()
        .map(|id| Endpoint {
            node_id: Some(id),
            addr: cluster.node(id).quic_addr,
        })
        .collect();
    let mut config = ClientConfig::new(
        endpoints,
        cluster.ca_pem().to_string(),
        Credentials::InsecureDev {
            principal_id: "client-tests".to_string(),
        },
    );
    config.seed = Some(7);
    config
}

/// A client of `cluster` (see [`client_config`]).
pub(crate) async fn connect(cluster: &ProcessCluster) -> Client {
    Client::connect(client_config(cluster))
        .await
        .unwrap_or_else(|error| panic!("client: {error}\n{}", cluster.log_tails()))
}

/// A 3-node cluster in insecure development mode, a connected client library, and a node that
/// does not lead group 0 (its requests about group 0's keys are forwarded).
pub(crate) async fn cluster_with_a_follower_of_group_0() -> (ProcessCluster, Client, u64) {
    let cluster = ProcessCluster::start_ready(ClusterOptions {
        insecure_dev_mode: true,
        ..ClusterOptions::default()
    })
    .await;
    let client = connect(&cluster).await;
    let leader = wait_for(Duration::from_secs(20), "a leader of group 0", || async {
        cluster.leader_of(1, 0).await
    })
    .await
    .unwrap();
    let follower = cluster.ids().into_iter().find(|&id| id != leader).unwrap();
    (cluster, client, follower)
}

/// Writes the cluster file `tenurectl --cluster` reads for `cluster`; returns its path.
pub(crate) fn tenurectl_cluster_file(cluster: &ProcessCluster) -> std::path::PathBuf {
    let cluster_file = cluster.dir_path().join("cluster-for-tenurectl.json");
    std::fs::write(
        &cluster_file,
        serde_json::json!({
            "nodes": cluster.ids().iter().map(|&id| serde_json::json!({
                "id": id,
                "client": cluster.node(id).quic_addr.to_string(),
                "http": cluster.http_url(id),
            })).collect::<Vec<_>>(),
            "groups": 16,
            "ca_cert": cluster.dir_path().join("certs/ca.pem"),
        })
        .to_string(),
    )
    .unwrap();
    cluster_file
}

/// Sums a metric's samples (every label set) over the nodes in `ids`.
pub(crate) async fn metric_sum(cluster: &ProcessCluster, ids: &[u64], name: &str) -> f64 {
    let mut total = 0.0;
    for &id in ids {
        let url = format!("{}/metrics", cluster.http_url(id));
        let Ok((200, _, body)) = http_request("GET", &url, &[], None).await else {
            continue;
        };
        let text = String::from_utf8_lossy(&body).into_owned();
        for line in text.lines() {
            let Some(rest) = line.strip_prefix(name) else {
                continue;
            };
            if !(rest.starts_with(' ') || rest.starts_with('{')) {
                continue;
            }
            if let Some(value) = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) {
                total += value;
            }
        }
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_go_to_leaders_and_follow_leader_changes() {
    let mut cluster = ProcessCluster::start_ready(ClusterOptions::default()).await;
    let ids = cluster.ids();
    cluster.wait_balanced(&ids, Duration::from_secs(40)).await;
    let client = connect(&cluster).await;
    let routing = client.routing();
    assert_eq!(routing.placement_version, 1);
    assert_eq!(routing.groups, 16);
    assert_eq!(routing.nodes.len(), 3);

    // Keys in every group: the client computes each key's group like the cluster does and
    // sends to its leader, so no node forwards anything.
    let forwarded_before = metric_sum(&cluster, &ids, "tenure_requests_forwarded_total").await;
    let mut leases = Vec::new();
    for group in 0..16 {
        let resource = cluster.resource_in_group(TENANT, group, "routed", 0);
        let key = ResourceKey::new(TENANT, resource.clone());
        assert_eq!(client.group_of(&key).await.unwrap(), group);
        let lease = client
            .acquire(TENANT, resource, "holder", Duration::from_secs(10))
            .await
            .unwrap();
        assert_eq!(lease.group_id(), group);
        assert!(lease.is_valid());
        leases.push(lease);
    }
    let forwarded_after = metric_sum(&cluster, &ids, "tenure_requests_forwarded_total").await;
    assert_eq!(
        forwarded_after, forwarded_before,
        "the client sent every request to its group's leader"
    );
    println!(
        "client routing: 16 acquires, one per group, none forwarded ({} retries)",
        client.stats().retries
    );

    // Every node's status: it hosts all 16 groups (3 nodes, replication factor 3), each group
    // has exactly one ready leader, and leaders report their followers' progress.
    let mut led = 0;
    for &id in &ids {
        let status = client.node_status(id).await.unwrap();
        assert_eq!(status.node_id, id);
        assert!(status.ready);
        assert_eq!(status.placement_version, 1);
        assert_eq!(status.hosted.len(), 16);
        for group in &status.hosted {
            assert!(group.applied_index <= group.committed_index);
            assert!(group.committed_index <= group.last_log_index);
            if group.is_leader {
                led += 1;
                assert_eq!(group.leader, Some(id));
                assert_eq!(group.followers.len(), 2, "{group:?}");
                for follower in &group.followers {
                    assert!(follower.matched_index <= group.last_log_index);
                }
            }
        }
    }
    assert_eq!(led, 16, "one ready leader per group");

    // Kill the node leading the most groups: calls for its groups find the new leaders.
    let leaders = cluster.agreed_leaders(&ids).await.unwrap();
    let counts = ProcessCluster::led_counts(&leaders);
    let (&victim, _) = counts.iter().max_by_key(|(_, count)| **count).unwrap();
    let victim_groups: Vec<u32> = leaders
        .iter()
        .filter(|l| l.leader == Some(victim))
        .map(|l| l.group_id)
        .collect();
    cluster.kill(victim);
    let started = Instant::now();
    for &group in &victim_groups {
        let resource = cluster.resource_in_group(TENANT, group, "after-kill", 0);
        let grant = client
            .acquire_grant(AcquireOptions::new(
                TENANT,
                resource.clone(),
                "holder",
                Duration::from_secs(10),
            ))
            .await
            .unwrap_or_else(|error| panic!("acquire in group {group}: {error}"));
        assert_eq!(grant.group_id, group);
        let read = client
            .get(&ResourceKey::new(TENANT, resource.clone()))
            .await
            .unwrap();
        assert_eq!(read.view.unwrap().lease_id, grant.lease_id);
        // The call may have succeeded through another node's forwarding while the client's
        // routing still named the killed node: a table fetched before the election ended names
        // the old leader in the same term, the best knowledge then (`RoutingState::forget_leader`).
        // The client's own calls mend it: one sent to the dead node refreshes the table. So the
        // routing must leave the killed node within a few more calls, not necessarily at once.
        let key = ResourceKey::new(TENANT, resource);
        let leader = wait_for(
            Duration::from_secs(10),
            "the client's routing to leave the killed node",
            || async {
                let (leader, _) = client.routing().leaders[group as usize];
                if leader.is_some_and(|l| l != victim) {
                    return leader;
                }
                client.get(&key).await.ok()?;
                None
            },
        )
        .await
        .unwrap_or_else(|error| panic!("group {group}: {error}"));
        assert_ne!(leader, victim, "group {group}");
    }
    println!(
        "client routing: {} groups of killed node {victim} served again after {} ms ({} retries, {} routing refreshes)",
        victim_groups.len(),
        started.elapsed().as_millis(),
        client.stats().retries,
        client.stats().routing_refreshes
    );
    for lease in leases {
        if !victim_groups.contains(&lease.group_id()) {
            assert!(lease.is_valid());
        }
        drop(lease);
    }
    client.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_renew_keeps_a_lease_across_a_leader_failover() {
    let mut cluster = ProcessCluster::start_ready(ClusterOptions::default()).await;
    let ids = cluster.ids();
    let leaders = cluster.wait_balanced(&ids, Duration::from_secs(40)).await;
    let client = connect(&cluster).await;
    let group = 3;
    let resource = cluster.resource_in_group(TENANT, group, "failover", 0);
    let ttl = Duration::from_secs(9);
    let lease = client
        .acquire(TENANT, resource.clone(), "survivor", ttl)
        .await
        .unwrap();
    let token = lease.fencing_token();
    // Let one renewal happen, then kill the group's leader.
    wait_for(Duration::from_secs(10), "a first renewal", || async {
        (lease.renewals() >= 1).then_some(())
    })
    .await
    .unwrap();
    let victim = leaders[group as usize].leader.unwrap();
    cluster.kill(victim);
    let killed_at = Instant::now();
    let renewals_at_kill = lease.renewals();
    // The handle stays valid the whole time and renews through the new leader.
    let mut samples = 0;
    while lease.renewals() < renewals_at_kill + 2 {
        assert!(
            lease.is_valid(),
            "lease lost during the failover: {:?}\n{}",
            lease.state(),
            cluster.log_tails()
        );
        assert!(
            killed_at.elapsed() < Duration::from_secs(30),
            "no renewal through the new leader within 30 s"
        );
        samples += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let survivors: Vec<u64> = ids.iter().copied().filter(|&id| id != victim).collect();
    let new_leader = cluster.leader_of(survivors[0], group).await;
    assert!(new_leader.is_some_and(|l| l != victim));
    let read = client
        .get(&ResourceKey::new(TENANT, resource))
        .await
        .unwrap();
    let view = read.view.unwrap();
    assert_eq!(view.status, LeaseStatus::Active);
    assert_eq!(view.lease_id, lease.lease_id());
    assert_eq!(view.fencing_token, token, "renewals never change the token");
    println!(
        "failover renewal: lease held across the kill of node {victim} (group {group} now led by {new_leader:?}); 2 renewals confirmed {} ms after the kill, {samples} validity samples, state {:?}",
        killed_at.elapsed().as_millis(),
        lease.state()
    );
    let receipt = lease.release().await.unwrap();
    assert_eq!(receipt.fencing_token, token);
    client.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_loss_signal_fires_before_the_safe_deadline() {
    let mut cluster = ProcessCluster::start_ready(ClusterOptions::default()).await;
    let client = connect(&cluster).await;
    let (ttl_min, _) = cluster.ttl_bounds_ms();
    let ttl = Duration::from_millis(ttl_min.max(5_000));

    // 1. Renewals cannot get through: every node is paused (SIGSTOP), as if this client were
    //    cut off from the cluster.
    let lease = client
        .acquire(TENANT, "loss/partitioned", "holder", ttl)
        .await
        .unwrap();
    wait_for(Duration::from_secs(10), "a first renewal", || async {
        (lease.renewals() >= 1).then_some(())
    })
    .await
    .unwrap();
    let ids = cluster.ids();
    for &id in &ids {
        cluster.pause(id);
    }
    let paused_at = Instant::now();
    let deadline_before = lease.safe_deadline();
    // First the lease is reported at risk (its renewal is overdue), while it is still held.
    assert!(!lease.at_risk());
    wait_for(ttl, "the lease reported at risk", || async {
        lease.at_risk().then_some(())
    })
    .await
    .unwrap();
    let at_risk_at = Instant::now();
    assert_eq!(lease.state(), LeaseState::Held, "at risk before it is lost");
    // Counted before the handle's flag is set.
    assert_eq!(client.stats().leases_at_risk, 1);
    assert_eq!(client.stats().leases_at_risk_total, 1);
    let state = tokio::time::timeout(ttl * 2, lease.lost())
        .await
        .expect("the loss signal fired within two ttls");
    let fired_at = Instant::now();
    assert!(!lease.at_risk(), "a lost lease is lost, not at risk");
    // The handle's own timer may see the deadline before the renewer drops the lease.
    wait_for(
        Duration::from_secs(2),
        "the lost lease uncounted",
        || async { (client.stats().leases_at_risk == 0).then_some(()) },
    )
    .await
    .unwrap();
    for &id in &ids {
        cluster.resume(id);
    }
    assert_eq!(state, LeaseState::Lost(LossReason::DeadlineWithoutRenewal));
    let deadline = lease.safe_deadline();
    assert!(
        fired_at <= deadline,
        "the signal fired {} ms after the safe deadline",
        fired_at.duration_since(deadline).as_millis()
    );
    assert!(!lease.is_valid());
    assert!(
        deadline >= deadline_before,
        "the deadline only moves forward"
    );
    println!(
        "loss signal: nodes paused {} ms after the last renewal; at risk {} ms and signal {} ms after the pause, {} ms before the safe deadline",
        paused_at
            .saturating_duration_since(
                deadline
                    .checked_sub(client.config().safety.safe_window(ttl.as_millis() as u64))
                    .unwrap()
            )
            .as_millis(),
        at_risk_at.duration_since(paused_at).as_millis(),
        fired_at.duration_since(paused_at).as_millis(),
        deadline.saturating_duration_since(fired_at).as_millis()
    );
    drop(lease);
    cluster.wait_ready(Duration::from_secs(45)).await;

    // 2. The cluster refuses a renewal: the lease was released behind the handle's back (by
    //    another client, which this client cannot know of).
    let lease = client
        .acquire(TENANT, "loss/rejected", "holder", ttl)
        .await
        .unwrap();
    let other = connect(&cluster).await;
    other
        .release(lease.key().clone(), lease.lease_id(), "holder", None)
        .await
        .unwrap();
    other.close().await;
    let state = tokio::time::timeout(ttl * 2, lease.lost()).await.unwrap();
    match state {
        LeaseState::Lost(LossReason::Rejected { code, .. }) => {
            assert_eq!(code, ErrorCode::LeaseExpired);
        }
        other => panic!("expected a refused renewal, got {other:?}"),
    }
    assert!(!lease.is_valid());

    // 3. Released through this same client by another path: the handle is released at once.
    let lease = client
        .acquire(TENANT, "loss/released-here", "holder", ttl)
        .await
        .unwrap();
    client
        .release(lease.key().clone(), lease.lease_id(), "holder", None)
        .await
        .unwrap();
    let state = tokio::time::timeout(Duration::from_secs(2), lease.lost())
        .await
        .expect("the handle learns of the release at once");
    assert_eq!(state, LeaseState::Released);
    assert!(!lease.is_valid());
    client.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_whose_answer_was_lost_returns_the_same_lease() {
    let cluster = ProcessCluster::start_ready(ClusterOptions::default()).await;
    let client = connect(&cluster).await;
    let other = connect(&cluster).await;
    client.faults().drop_next_lease_responses(1);
    let grant = client
        .acquire_grant(AcquireOptions::new(
            TENANT,
            "idempotent/acquire",
            "first",
            Duration::from_secs(10),
        ))
        .await
        .unwrap();
    assert!(
        grant.replayed,
        "the retry was answered from the stored outcome"
    );
    assert_eq!(grant.fencing_token, 1, "only one grant happened");
    assert!(
        grant.is_safe_now(),
        "a replay of this call's own retry keeps the window from the first send"
    );
    assert!(client.stats().retries >= 1);
    // The same request id once more (a caller retrying by itself): same lease again.
    let again = client
        .acquire_grant(
            AcquireOptions::new(
                TENANT,
                "idempotent/acquire",
                "first",
                Duration::from_secs(10),
            )
            .request_id(grant.request_id.clone()),
        )
        .await
        .unwrap();
    assert_eq!(again.lease_id, grant.lease_id);
    assert!(again.replayed);
    assert!(
        again.is_safe_now() && again.remaining_ttl_ms <= again.ttl_ms,
        "a replay of a caller-chosen request id keeps the window of what is left of the grant"
    );
    // As a handle, the same replay is renewed at once to learn a deadline.
    let handle = client
        .acquire_with(
            AcquireOptions::new(
                TENANT,
                "idempotent/acquire",
                "first",
                Duration::from_secs(10),
            )
            .request_id(grant.request_id.clone()),
        )
        .await
        .unwrap();
    assert!(handle.replayed() && handle.is_valid());
    assert_eq!(handle.lease_id(), grant.lease_id);
    let _ = handle.detach();
    // Another holder sees it held by the first.
    let refused = other
        .acquire_grant(AcquireOptions::new(
            TENANT,
            "idempotent/acquire",
            "second",
            Duration::from_secs(10),
        ))
        .await
        .unwrap_err();
    assert!(refused.is_already_held());
    assert_eq!(refused.current_holder().map(|(h, _)| h), Some("first"));
    let read = other
        .get(&ResourceKey::new(TENANT, "idempotent/acquire"))
        .await
        .unwrap();
    assert_eq!(read.view.unwrap().lease_id, grant.lease_id);
    println!(
        "lost answer: acquire retried with request id {} -> lease {} (replayed, token {})",
        grant.request_id, grant.lease_id, grant.fencing_token
    );
    client.close().await;
    other.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_of_ten_thousand_leases_are_coalesced() {
    const LEASES: usize = 10_000;
    let cluster = ProcessCluster::start_ready(ClusterOptions::default()).await;
    let ids = cluster.ids();
    let client = connect(&cluster).await;
    let ttl = Duration::from_secs(6);
    let started = Instant::now();
    let leases: Vec<tenure_client::Lease> = futures_util::stream::iter(0..LEASES)
        .map(|i| {
            let client = client.clone();
            async move {
                client
                    .acquire(TENANT, format!("held/{i}"), "holder", ttl)
                    .await
                    .unwrap_or_else(|error| panic!("acquire {i}: {error}"))
            }
        })
        .buffer_unordered(1_024)
        .collect()
        .await;
    let acquired_in = started.elapsed();
    let leases = Arc::new(leases);
    // A renewal period is a third of the ttl.
    let period = ttl / 3;
    let sum_before = metric_sum(&cluster, &ids, "tenure_renewals_per_request_sum").await;
    let count_before = metric_sum(&cluster, &ids, "tenure_renewals_per_request_count").await;
    let stats_before = client.stats();
    let held_from = Instant::now();
    // Hold until three renewals of every lease were confirmed (about three periods).
    let renewals_wanted = stats_before.renewals + 3 * LEASES as u64;
    wait_for(period * 10, "three rounds of renewals", || async {
        (client.stats().renewals >= renewals_wanted).then_some(())
    })
    .await
    .unwrap();
    let held_for = held_from.elapsed();
    let sum_after = metric_sum(&cluster, &ids, "tenure_renewals_per_request_sum").await;
    let count_after = metric_sum(&cluster, &ids, "tenure_renewals_per_request_count").await;
    let stats = client.stats();
    let renewals = sum_after - sum_before;
    let requests = count_after - count_before;
    let lost = leases.iter().filter(|lease| !lease.is_valid()).count();
    let periods = held_for.as_secs_f64() / period.as_secs_f64();
    let per_request = renewals / requests.max(1.0);
    let mut by_group: BTreeMap<u32, usize> = BTreeMap::new();
    for lease in leases.iter() {
        *by_group.entry(lease.group_id()).or_default() += 1;
    }
    println!(
        "coalescing: {LEASES} leases acquired in {} ms; held {:.1} s ({periods:.1} renewal periods of {} ms): \
         servers saw {renewals} renewals in {requests} requests ({per_request:.1} renewals/request, {:.1} renewal requests per period); \
         client sent {} batches carrying {} renewals; {lost} leases lost; {} groups",
        acquired_in.as_millis(),
        held_for.as_secs_f64(),
        period.as_millis(),
        requests / periods,
        stats.renew_batches - stats_before.renew_batches,
        stats.renewals - stats_before.renewals,
        by_group.len()
    );
    assert_eq!(lost, 0, "every lease stayed held");
    assert!(
        renewals >= LEASES as f64,
        "every lease was renewed at least once ({renewals})"
    );
    assert!(
        per_request >= 10.0,
        "at least 10 renewals per request ({per_request:.1})"
    );
    assert_eq!(stats.leases_held, LEASES as u64);
    client.close().await;
}

/// Twelve leases in group 0 of a 3-node cluster whose nodes use `limits`, renewed together by
/// one client: the setting of the renewal-pressure tests.
struct LateRenewals {
    cluster: ProcessCluster,
    ids: Vec<u64>,
    client: tenure_testkit::TestClient,
    ttl_ms: u64,
    group: u32,
    resources: Vec<String>,
    leases: Vec<(String, tenure_core::LeaseId)>,
}

impl LateRenewals {
    /// `fault_control`: the nodes accept `/testing/faults` (a slow disk on demand).
    async fn start(limits: common::NodeLimits, fault_control: bool) -> Self {
        fn with_fault_control(_: u64, config: &mut common::NodeConfig) {
            config.testing.fault_control = true;
        }
        // No leader rebalancing: the pressure is the leader's, and group 0 must keep its leader.
        let cluster = ProcessCluster::start_ready(ClusterOptions {
            rebalance_interval_ms: Some(0),
            limits: Some(limits),
            configure: fault_control.then_some(with_fault_control as fn(u64, &mut _)),
            ..ClusterOptions::default()
        })
        .await;
        let ids = cluster.ids();
        let (ttl_min, _) = cluster.ttl_bounds_ms();
        let ttl_ms = ttl_min.max(3_000);
        let group = 0;
        // Twelve leases: the leader samples a renewal only when the group's state is not busy
        // (being applied to), so a few of the twelve concurrent renewals may go unsampled; at
        // least four late ones are needed.
        let resources = cluster.resources_in_group(TENANT, group, "pressure", 14);
        let client = cluster.client(ids[0]).await;
        let mut leases = Vec::new();
        for (i, resource) in resources[..12].iter().enumerate() {
            let result = client
                .acquire(TENANT, resource, "holder", ttl_ms, &format!("acquire-{i}"))
                .await
                .unwrap();
            let tenure_core::LeaseReply::Acquired(grant) = result.reply else {
                panic!("expected a grant, got {:?}", result.reply);
            };
            leases.push((resource.clone(), grant.lease_id));
        }
        LateRenewals {
            cluster,
            ids,
            client,
            ttl_ms,
            group,
            resources,
            leases,
        }
    }

    /// The twelve renewals in one frame (they reach the leader within one window); returns
    /// when they were answered.
    async fn renew_all(&self, round: &str) -> Instant {
        use tenure_core::RenewRequest;
        use tenure_proto::client::RequestBody;
        let requests = self
            .leases
            .iter()
            .enumerate()
            .map(|(i, (resource, lease_id))| {
                let body = RequestBody::Lease(tenure_core::LeaseOp::Renew(RenewRequest {
                    key: ResourceKey::new(TENANT, resource.as_str()),
                    lease_id: *lease_id,
                    holder_id: "holder".to_string(),
                    ttl_ms: self.ttl_ms,
                    request_id: format!("{round}-{i}"),
                }));
                (body, common::forward())
            })
            .collect();
        let answers = self.client.call_many(requests).await.unwrap();
        for (i, answer) in answers.into_iter().enumerate() {
            let result = common::lease_result(answer)
                .unwrap_or_else(|error| panic!("{round} renewal {i}: {error:?}"));
            assert!(
                matches!(result.reply, tenure_core::LeaseReply::Renewed(_)),
                "{round} renewal {i}"
            );
        }
        Instant::now()
    }

    /// Renews on time (an acquire is served), then late (60% of the ttl passed, under half
    /// left), and returns once the late window has ended (a window is decided whole when it
    /// ends, one second after its first renewal).
    async fn on_time_then_late(&self) {
        let renewed_at = self.renew_all("on-time").await;
        self.client
            .acquire(
                TENANT,
                &self.resources[12],
                "holder",
                self.ttl_ms,
                "acquire-on-time",
            )
            .await
            .unwrap();
        let late_after = Duration::from_millis(self.ttl_ms * 3 / 5);
        wait_for(late_after * 2, "60% of the ttl to pass", || async {
            (renewed_at.elapsed() >= late_after).then_some(())
        })
        .await
        .unwrap();
        let late_at = self.renew_all("late").await;
        wait_for(Duration::from_secs(3), "the late window to end", || async {
            (late_at.elapsed() >= Duration::from_millis(1_100)).then_some(())
        })
        .await
        .unwrap();
    }

    async fn metric(&self, name: &str) -> f64 {
        metric_sum(&self.cluster, &self.ids, name).await
    }

    /// Adds `delay_ms` to every WAL sync of every node (a slow disk: every commit slower).
    async fn slow_disks(&self, delay_ms: u64) {
        for &id in &self.ids {
            let url = format!("{}/testing/faults", self.cluster.http_url(id));
            let body = format!("{{\"wal_sync_delay_ms\": {delay_ms}}}").into_bytes();
            let (status, _, reply) = http_request(
                "POST",
                &url,
                // `/testing/*` needs a caller; test clusters run in insecure development mode.
                &[
                    ("content-type", "application/json"),
                    ("x-tenure-principal-id", "tests"),
                    ("x-tenure-principal-tenant", TENANT),
                ],
                Some(body),
            )
            .await
            .unwrap();
            assert_eq!(status, 200, "{}", String::from_utf8_lossy(&reply));
        }
    }
}

/// Renewals that reach a busy leader late (under half their ttl left) make it refuse their
/// tenant's new acquires with OVERLOADED and a retry hint, while renewals are still served and
/// other tenants' acquires too; on-time renewals do not, and acquires are served again once the
/// pressure has passed. Busy: every WAL sync 40 ms slower, so the leader's lease proposals take
/// more than the default `late_renewal_loaded_proposal_ms` (10 ms), as its own measurement says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_renewals_make_a_busy_leader_refuse_new_acquires() {
    use tenure_proto::client::Principal;
    let setting = LateRenewals::start(common::NodeLimits::default(), true).await;
    let (client, ttl_ms) = (&setting.client, setting.ttl_ms);
    setting.slow_disks(40).await;
    setting.on_time_then_late().await;
    let proposal_mean_s = setting.metric("tenure_lease_proposal_mean_seconds").await;
    assert!(
        proposal_mean_s >= 0.010,
        "proposals took {proposal_mean_s} s on average (summed over the nodes)"
    );
    let acquire_late = || {
        client.acquire(
            TENANT,
            &setting.resources[13],
            "holder",
            ttl_ms,
            "acquire-late",
        )
    };
    let refused = acquire_late()
        .await
        .expect_err("a new acquire is refused while the tenant's renewals arrive late");
    let refused_at = Instant::now();
    assert_eq!(refused.code, ErrorCode::Overloaded, "{refused:?}");
    assert!(refused.retryable);
    let retry_after_ms = refused.retry_after_ms.unwrap();
    assert!(
        (100..=2_000).contains(&retry_after_ms),
        "retry after {retry_after_ms} ms"
    );
    // Renewals are still served meanwhile, and another tenant's acquires.
    setting.renew_all("under-pressure").await;
    let mut other = setting.cluster.client(setting.ids[0]).await;
    other.principal = Some(Principal {
        principal_id: "tests".to_string(),
        tenant_id: "other-tenant".to_string(),
    });
    let other_resource =
        setting
            .cluster
            .resource_in_group("other-tenant", setting.group, "pressure", 0);
    other
        .acquire("other-tenant", &other_resource, "holder", ttl_ms, "other")
        .await
        .unwrap();
    let late = setting.metric("tenure_renewals_late_total").await;
    let sampled = setting.metric("tenure_renewals_sampled_total").await;
    assert!(late >= 4.0, "{late} late renewals");
    assert!(sampled > late, "{sampled} sampled, {late} late");
    assert!(
        setting
            .metric("tenure_acquires_refused_renewal_pressure_total")
            .await
            >= 1.0
    );
    // The pressure passes (renewals on time again): the same acquire is served.
    wait_for(Duration::from_secs(10), "acquires served again", || async {
        acquire_late().await.ok()
    })
    .await
    .unwrap();
    println!(
        "renewal pressure: ttl {ttl_ms} ms; 12 renewals sent late ({late} sampled late of {sampled}), the tenant's next acquire refused with retry after {retry_after_ms} ms, another tenant's served, served again {} ms later",
        refused_at.elapsed().as_millis()
    );
    other.close().await;
    setting.client.close().await;
}

/// The same late renewals on a leader with capacity to spare refuse nothing: late renewals
/// there are the client's own doing, and refusing its acquires would free nothing. "Capacity to
/// spare" by setting, so that the test does not depend on this machine's disk: the threshold is
/// 1 s, far above what the leader measures (which must be measured: the gauge is above zero).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_renewals_on_an_idle_leader_refuse_nothing() {
    let setting = LateRenewals::start(
        common::NodeLimits {
            late_renewal_loaded_proposal_ms: 1_000,
            ..common::NodeLimits::default()
        },
        false,
    )
    .await;
    setting.on_time_then_late().await;
    setting
        .client
        .acquire(
            TENANT,
            &setting.resources[13],
            "holder",
            setting.ttl_ms,
            "acquire-late",
        )
        .await
        .expect("an idle leader serves the acquire despite the late renewals");
    let late = setting.metric("tenure_renewals_late_total").await;
    let refused = setting
        .metric("tenure_acquires_refused_renewal_pressure_total")
        .await;
    assert!(late >= 4.0, "{late} late renewals");
    assert_eq!(refused, 0.0);
    // The leader did measure its proposals (the gauge covers the last second or two: renew
    // again until a gauge tick has seen some).
    let round = std::sync::atomic::AtomicU32::new(0);
    let proposal_mean_s = wait_for(Duration::from_secs(10), "proposals measured", || async {
        let n = round.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        setting.renew_all(&format!("measured-{n}")).await;
        let mean = setting.metric("tenure_lease_proposal_mean_seconds").await;
        (mean > 0.0).then_some(mean)
    })
    .await
    .unwrap();
    assert!(proposal_mean_s < 1.0, "{proposal_mean_s} s");
    println!(
        "renewal pressure on an idle leader: {late} renewals sampled late, 0 acquires refused, proposals {:.1} ms on average (summed over the nodes)",
        proposal_mean_s * 1e3
    );
    setting.client.close().await;
}
