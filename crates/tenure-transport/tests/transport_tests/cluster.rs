//! In-process clusters over real QUIC on loopback with real RocksDB storage (fsync on): groups
//! elect leaders, replicate, survive the loss of a node, heal after a partition, tolerate a lossy
//! duplicating reordering network, ship snapshots on their own streams, and carry a commit on
//! the next entry without ever leaving the last one behind.
#![cfg(feature = "testing")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::collections::BTreeMap;
use std::time::Duration;

use openraft::type_config::async_runtime::WatchReceiver;
use tenure_core::{AcquireRequest, Command, LeaseOp, ResourceKey};
use tenure_transport::testing::{ClusterOptions, LocalCluster};
use tenure_transport::{GroupTiming, LinkFaults, TransportStatsSnapshot};

const WAIT: Duration = Duration::from_secs(60);

fn acquire(group: u32, n: u64) -> Command {
    Command::Lease(LeaseOp::Acquire(AcquireRequest {
        key: ResourceKey::new("tenant-a", format!("g{group}-r{n}")),
        holder_id: format!("holder-{n}"),
        ttl_ms: 60_000,
        request_id: format!("req-{group}-{n}"),
    }))
}

async fn write_all_groups(cluster: &LocalCluster, round: u64) {
    let mut writes = Vec::new();
    for group in 0..cluster.groups() {
        writes.push(async move {
            cluster
                .write(group, acquire(group, round), WAIT)
                .await
                .unwrap_or_else(|e| panic!("round {round}: {e}"))
        });
    }
    let outputs = futures_util::future::join_all(writes).await;
    assert!(outputs.iter().all(Option::is_some));
}

async fn assert_all_groups_agree(cluster: &LocalCluster) {
    for group in 0..cluster.groups() {
        cluster
            .wait_replicas_agree(group, WAIT)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

fn leaders_per_node(leaders: &BTreeMap<u32, u64>) -> BTreeMap<u64, usize> {
    let mut counts = BTreeMap::new();
    for leader in leaders.values() {
        *counts.entry(*leader).or_default() += 1;
    }
    counts
}

fn print_batching(cluster: &LocalCluster, label: &str) {
    for (id, stats) in cluster.transport_stats() {
        let per_frame = stats.messages_sent as f64 / stats.frames_sent.max(1) as f64;
        println!(
            "{label}: node {id}: {} frames, {} messages ({per_frame:.2}/frame), {} heartbeats, {} connections established, {} deduplicated, {} refused",
            stats.frames_sent,
            stats.messages_sent,
            stats.heartbeats_sent,
            stats.connections_established,
            stats.connections_deduplicated,
            stats.connections_refused
        );
    }
}

async fn elect_replicate_and_lose_a_node(groups: u32) {
    let cluster_options = ClusterOptions {
        groups,
        seed: u64::from(groups),
        ..ClusterOptions::default()
    };
    let mut cluster = LocalCluster::start(cluster_options).await.unwrap();
    let all = cluster.live_nodes();
    let leaders = cluster.wait_for_leaders(&all, WAIT).await.unwrap();
    println!(
        "{groups} groups: leaders per node {:?}",
        leaders_per_node(&leaders)
    );

    write_all_groups(&cluster, 1).await;
    write_all_groups(&cluster, 2).await;
    assert_all_groups_agree(&cluster).await;

    // Exactly one connection per pair, both directions sharing it.
    for id in &all {
        let node = cluster.node(*id).unwrap();
        for peer in all.iter().filter(|peer| *peer != id) {
            assert!(
                node.transport.is_connected(*peer),
                "node {id} not connected to {peer}"
            );
        }
    }
    print_batching(&cluster, &format!("{groups} groups"));

    // Lose the node leading the most groups: its groups re-elect among the other two.
    let victim = *leaders_per_node(&leaders)
        .iter()
        .max_by_key(|(_, count)| **count)
        .unwrap()
        .0;
    let led_by_victim = leaders.values().filter(|leader| **leader == victim).count();
    cluster.stop_node(victim).await;
    let survivors = cluster.live_nodes();
    let new_leaders = cluster.wait_for_leaders(&survivors, WAIT).await.unwrap();
    assert!(new_leaders.values().all(|leader| *leader != victim));
    println!("{groups} groups: node {victim} stopped, {led_by_victim} groups re-elected elsewhere");

    write_all_groups(&cluster, 3).await;
    assert_all_groups_agree(&cluster).await;

    // The node comes back from its data and catches up.
    cluster.start_node(victim).await.unwrap();
    write_all_groups(&cluster, 4).await;
    assert_all_groups_agree(&cluster).await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_64_groups_elect_replicate_and_survive_a_lost_node() {
    elect_replicate_and_lose_a_node(64).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_256_groups_elect_replicate_and_survive_a_lost_node() {
    elect_replicate_and_lose_a_node(256).await;
}

async fn partition_and_heal(groups: u32) {
    let cluster = LocalCluster::start(ClusterOptions {
        groups,
        seed: 7,
        ..ClusterOptions::default()
    })
    .await
    .unwrap();
    let all = cluster.live_nodes();
    cluster.wait_for_leaders(&all, WAIT).await.unwrap();
    write_all_groups(&cluster, 1).await;

    let isolated = 1;
    let majority: Vec<u64> = all.iter().copied().filter(|id| *id != isolated).collect();
    let terms_before: Vec<u64> = (0..cluster.groups())
        .map(|group| {
            cluster
                .node(isolated)
                .unwrap()
                .raft(group)
                .unwrap()
                .metrics()
                .borrow_watched()
                .current_term
        })
        .collect();
    cluster.faults().partition(&[isolated], &majority);
    let leaders = cluster.wait_for_leaders(&majority, WAIT).await.unwrap();
    assert!(leaders.values().all(|leader| *leader != isolated));
    // Writes on the majority side commit while node 1 is cut off.
    for group in 0..cluster.groups() {
        cluster.write(group, acquire(group, 2), WAIT).await.unwrap();
    }
    // Pre-vote: the cut-off node cannot win pre-votes, so it does not inflate its terms.
    let terms_during: Vec<u64> = (0..cluster.groups())
        .map(|group| {
            cluster
                .node(isolated)
                .unwrap()
                .raft(group)
                .unwrap()
                .metrics()
                .borrow_watched()
                .current_term
        })
        .collect();
    assert_eq!(
        terms_before, terms_during,
        "an isolated node bumped terms despite pre-vote"
    );

    cluster.faults().heal();
    write_all_groups(&cluster, 3).await;
    assert_all_groups_agree(&cluster).await;
    let dropped: u64 = cluster
        .transport_stats()
        .values()
        .map(|s| s.fault_dropped)
        .sum();
    println!(
        "partition: {groups} groups: node {isolated} cut off, {} groups led by the majority, {dropped} messages dropped by the fault layer; healed and converged",
        leaders.len()
    );
    assert!(dropped > 0);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_64_groups_heal_after_a_partition() {
    partition_and_heal(64).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_256_groups_heal_after_a_partition() {
    partition_and_heal(256).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_transfer_moves_leadership_to_the_chosen_node() {
    let cluster = LocalCluster::start(ClusterOptions {
        groups: 8,
        seed: 17,
        ..ClusterOptions::default()
    })
    .await
    .unwrap();
    let all = cluster.live_nodes();
    let leaders = cluster.wait_for_leaders(&all, WAIT).await.unwrap();
    for (&group, &leader) in &leaders {
        let target = all.iter().copied().find(|id| *id != leader).unwrap();
        let raft = cluster.node(leader).unwrap().raft(group).unwrap();
        raft.trigger().transfer_leader(target).await.unwrap();
        let target_raft = cluster.node(target).unwrap().raft(group).unwrap();
        target_raft
            .wait(Some(WAIT))
            .metrics(
                |m| m.state == openraft::ServerState::Leader,
                "the chosen node leads",
            )
            .await
            .unwrap();
        cluster.write(group, acquire(group, 1), WAIT).await.unwrap();
    }
    println!(
        "leader transfer: {} groups moved to the chosen node",
        leaders.len()
    );
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replication_survives_drops_duplicates_delays_and_reordering() {
    let cluster = LocalCluster::start(ClusterOptions {
        groups: 16,
        seed: 11,
        ..ClusterOptions::default()
    })
    .await
    .unwrap();
    let all = cluster.live_nodes();
    cluster.wait_for_leaders(&all, WAIT).await.unwrap();
    let faults = LinkFaults {
        partitioned: false,
        drop_probability: 0.05,
        duplicate_probability: 0.05,
        delay_ms: 2,
        reorder_jitter_ms: 20,
    };
    for from in &all {
        for to in &all {
            if from != to {
                cluster.faults().set(*from, *to, faults);
            }
        }
    }
    let perturbed = |cluster: &LocalCluster| {
        let totals = cluster
            .transport_stats()
            .values()
            .fold(TransportStatsSnapshot::default(), |sum, s| sum.plus(s));
        (
            totals.fault_dropped,
            totals.fault_duplicated,
            totals.fault_delayed,
        )
    };
    // At least five rounds under the faults, and more (bounded) until each kind of fault has
    // hit a message: only control messages (heartbeats, votes) are duplicated or delayed (a
    // replication stream is one QUIC stream), and a busy follower gets no heartbeat, so a few
    // fast rounds may see none.
    let mut round = 0;
    loop {
        round += 1;
        write_all_groups(&cluster, round).await;
        let (dropped, duplicated, delayed) = perturbed(&cluster);
        let every_kind = dropped > 0 && duplicated > 0 && delayed > 0;
        if round >= 5 && (every_kind || round >= 200) {
            break;
        }
        if round >= 5 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    cluster.faults().heal();
    write_all_groups(&cluster, round + 1).await;
    assert_all_groups_agree(&cluster).await;
    let totals = perturbed(&cluster);
    println!(
        "lossy network (seed {}, {round} rounds): {} dropped, {} duplicated, {} delayed; all replicas agree",
        cluster.faults().seed(),
        totals.0,
        totals.1,
        totals.2
    );
    assert!(totals.0 > 0 && totals.1 > 0 && totals.2 > 0);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_node_catches_up_from_a_streamed_snapshot() {
    let mut cluster = LocalCluster::start(ClusterOptions {
        groups: 4,
        seed: 13,
        snapshot_every_entries: Some(20),
        ..ClusterOptions::default()
    })
    .await
    .unwrap();
    let all = cluster.live_nodes();
    cluster.wait_for_leaders(&all, WAIT).await.unwrap();
    let lagging = 3;
    cluster.stop_node(lagging).await;
    let survivors = cluster.live_nodes();
    cluster.wait_for_leaders(&survivors, WAIT).await.unwrap();
    // Enough entries that the leaders snapshot and purge the log the lagging node needs.
    for round in 1..=60 {
        write_all_groups(&cluster, round).await;
    }
    for group in 0..cluster.groups() {
        for id in &survivors {
            let raft = cluster.node(*id).unwrap().raft(group).unwrap();
            raft.trigger().snapshot().await.unwrap();
        }
    }
    // Wait (bounded) until every surviving replica has snapshotted and purged its log.
    for group in 0..cluster.groups() {
        for id in &survivors {
            let raft = cluster.node(*id).unwrap().raft(group).unwrap();
            raft.wait(Some(WAIT))
                .metrics(|m| m.purged.is_some(), "log purged after a snapshot")
                .await
                .unwrap();
        }
    }
    cluster.start_node(lagging).await.unwrap();
    write_all_groups(&cluster, 61).await;
    assert_all_groups_agree(&cluster).await;
    let sent: u64 = cluster
        .transport_stats()
        .values()
        .map(|s| s.snapshots_sent)
        .sum();
    let received = cluster
        .node(lagging)
        .unwrap()
        .transport
        .stats()
        .snapshots_received;
    println!("snapshots: {sent} sent, {received} received by the restarted node");
    assert!(
        received > 0,
        "the restarted node caught up without a snapshot"
    );
    cluster.shutdown().await;
}

/// Sequential writes: the commit of each rides on the next entry's AppendEntries instead of an
/// entry-less one of its own, and the last commit, with no entry after it, still reaches the
/// followers when its linger ends. Heartbeats (which also carry the commit index) are an hour
/// apart here and the election is triggered by hand, so nothing else can deliver it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_rides_on_the_next_entry_and_the_last_one_still_reaches_the_followers() {
    let hour_ms = 3_600_000;
    let options = ClusterOptions {
        groups: 1,
        seed: 21,
        timing: GroupTiming {
            heartbeat_interval_ms: hour_ms,
            election_timeout_min_ms: 2 * hour_ms,
            election_timeout_max_ms: 3 * hour_ms,
            ..GroupTiming::default()
        },
        commit_linger_us: 200_000,
        ..ClusterOptions::default()
    };
    let cluster = LocalCluster::start(options).await.unwrap();
    let all = cluster.live_nodes();
    cluster
        .node(1)
        .and_then(|node| node.raft(0))
        .unwrap()
        .trigger()
        .elect(false)
        .await
        .unwrap();
    cluster.wait_for_leaders(&all, WAIT).await.unwrap();

    let writes = 20;
    for n in 0..writes {
        cluster.write(0, acquire(0, n), WAIT).await.unwrap();
    }
    let totals = |cluster: &LocalCluster| {
        cluster
            .transport_stats()
            .values()
            .fold(TransportStatsSnapshot::default(), |sum, stats| {
                sum.plus(stats)
            })
    };
    let after_writes = totals(&cluster);
    assert!(
        after_writes.append_requests_carried > 0,
        "no commit rode on a later entry: {after_writes:?}"
    );

    // The last write's commit: nothing follows it, so only the held request can bring it.
    let applied = cluster.wait_replicas_agree(0, WAIT).await.unwrap();
    let end = totals(&cluster);
    println!(
        "{writes} sequential writes: {} appends with entries sent, {} commits carried by the next \
         entry, {} entry-less appends sent; every replica applied index {applied}",
        end.append_requests_sent - end.append_requests_without_entries_sent,
        end.append_requests_carried,
        end.append_requests_without_entries_sent,
    );
    cluster.shutdown().await;
}
