//! The client recipes end to end against real `tenure` processes, on one cluster: an
//! `Election` elects the first candidate with its value while a second one waits parked in the
//! queue; an observer sees the leader, the new value of a proclaim (one change, with a larger
//! fencing token; the old token is no longer current) and the hand-off to the waiting
//! candidate when the leader resigns; `tenurectl elect` observes the leader and campaigns by
//! itself; and a `Mutex` is locked by two lockers in queue order with increasing tokens.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    missing_docs
)]

use std::process::Command;
use std::time::Duration;

use tenure_client::{
    ClientError, Election, Leader, LeaderWatch, LeaseStatus, Mutex, ResourceKey, is_wait_ended,
};
use tenure_testkit::{TENANT, wait_for};

use crate::client_library::{
    cluster_with_a_follower_of_group_0, connect, metric_sum, tenurectl_cluster_file,
};

const TTL: Duration = Duration::from_millis(4_500);
const WAIT: Duration = Duration::from_secs(60);

async fn next_change(leaders: &mut LeaderWatch) -> Option<Leader> {
    tokio::time::timeout(Duration::from_secs(20), leaders.changed())
        .await
        .expect("a leader change within 20 s")
        .expect("the observer goes on")
}

/// `tenurectl ARGS...` against the cluster file; its exit code and stdout lines as JSON.
async fn tenurectl(args: Vec<String>) -> (Option<i32>, Vec<serde_json::Value>) {
    tokio::task::spawn_blocking(move || {
        let output = Command::new(env!("CARGO_BIN_EXE_tenurectl"))
            .args(&args)
            .output()
            .unwrap();
        let stdout = String::from_utf8(output.stdout).unwrap();
        println!(
            "tenurectl {}: {}\n{stdout}{}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        let lines = stdout
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect();
        (output.status.code(), lines)
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elections_and_mutexes_hand_over_in_queue_order_and_observers_follow() {
    let (cluster, client, _follower) = cluster_with_a_follower_of_group_0().await;
    let ids = cluster.ids();
    let parked = || async { metric_sum(&cluster, &ids, "tenure_waits_parked").await };
    let name = cluster.resource_in_group(TENANT, 0, "election", 0);
    let election = Election::new(&client, TENANT, name.clone());

    // Bad candidate ids are refused before anything is sent.
    let error = election
        .campaign("a#b", "v", TTL, WAIT)
        .await
        .expect_err("a candidate id with '#'");
    assert!(matches!(error, ClientError::InvalidRequest(_)), "{error}");

    let mut leaders = election.observe().await.unwrap();
    assert_eq!(next_change(&mut leaders).await, None, "nobody leads yet");
    assert_eq!(election.leader().await.unwrap(), None);

    // A is elected at once, with its value.
    let mut a = election.campaign("a", "v1", TTL, WAIT).await.unwrap();
    assert_eq!((a.candidate_id(), a.value()), ("a", "v1"));
    assert!(a.is_valid());
    let elected_a = next_change(&mut leaders).await.expect("A leads");
    assert_eq!(
        (elected_a.candidate_id.as_str(), elected_a.value.as_str()),
        ("a", "v1")
    );
    assert_eq!(elected_a.fencing_token, a.fencing_token());
    assert_eq!(elected_a.lease_id, a.lease().lease_id());
    assert_eq!(election.leader().await.unwrap(), Some(elected_a.clone()));

    // B campaigns on a client of its own and waits, parked in the queue.
    let b_client = connect(&cluster).await;
    let b_election = Election::new(&b_client, TENANT, name.clone());
    let b_campaign = tokio::spawn(async move { b_election.campaign("b", "vb", TTL, WAIT).await });
    wait_for(Duration::from_secs(20), "B parked in the queue", || async {
        (parked().await >= 1.0).then_some(())
    })
    .await
    .unwrap();
    assert!(!b_campaign.is_finished(), "B must wait while A leads");

    // A proclaims a new value: one change for the observer (no gap in leadership), a larger
    // token, and the old one is no longer current. B still waits.
    let token_v1 = a.fencing_token();
    a.proclaim("v2").await.unwrap();
    assert_eq!(a.value(), "v2");
    assert!(a.fencing_token() > token_v1);
    assert!(a.is_valid());
    let proclaimed = next_change(&mut leaders).await.expect("A still leads");
    assert_eq!(
        (
            proclaimed.candidate_id.as_str(),
            proclaimed.value.as_str(),
            proclaimed.fencing_token,
            proclaimed.lease_id
        ),
        ("a", "v2", a.fencing_token(), a.lease().lease_id())
    );
    let key = ResourceKey::new(TENANT, name.clone());
    assert!(
        !client
            .check_fence(&key, token_v1)
            .await
            .unwrap()
            .verdict
            .current
    );
    assert!(
        client
            .check_fence(&key, a.fencing_token())
            .await
            .unwrap()
            .verdict
            .current
    );
    assert!(
        !b_campaign.is_finished(),
        "a proclaim must not elect a waiter"
    );

    // `tenurectl elect NAME` observes the leader.
    let cluster_file = tenurectl_cluster_file(&cluster);
    let global = |more: &[&str]| {
        let mut args = vec![
            "--cluster".to_string(),
            cluster_file.display().to_string(),
            "-o".into(),
            "json".into(),
            "elect".into(),
        ];
        args.extend(more.iter().map(|arg| (*arg).to_string()));
        args
    };
    let (code, lines) = tenurectl(global(&[&name, "--tenant", TENANT, "--count", "1"])).await;
    assert_eq!(code, Some(0));
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["event"], "leader");
    assert_eq!(lines[0]["candidate"], "a");
    assert_eq!(lines[0]["value"], "v2");
    assert_eq!(lines[0]["fencing_token"], a.fencing_token());

    // A resigns: B is elected in the same apply, with a larger token; the observer sees B next.
    let token_a = a.fencing_token();
    a.resign().await.unwrap();
    let b = tokio::time::timeout(Duration::from_secs(10), b_campaign)
        .await
        .expect("B elected within 10 s of A's resignation")
        .unwrap()
        .unwrap();
    assert_eq!((b.candidate_id(), b.value()), ("b", "vb"));
    assert!(b.fencing_token() > token_a);
    let elected_b = next_change(&mut leaders).await.expect("B leads");
    assert_eq!(
        (
            elected_b.candidate_id.as_str(),
            elected_b.value.as_str(),
            elected_b.fencing_token
        ),
        ("b", "vb", b.fencing_token())
    );

    // A campaign through tenurectl while B leads: its wait runs out (exit 3); then, on a free
    // election, it is elected and resigns by itself at the end of --duration-ms.
    let (code, lines) = tenurectl(global(&[
        &name,
        "c-value",
        "--tenant",
        TENANT,
        "--candidate",
        "c",
        "--ttl-ms",
        "4500",
        "--wait-ms",
        "200",
    ]))
    .await;
    assert_eq!(code, Some(3), "the wait ran out: {lines:?}");
    let free = cluster.resource_in_group(TENANT, 0, "election", 1);
    let (code, lines) = tenurectl(global(&[
        &free,
        "c-value",
        "--tenant",
        TENANT,
        "--candidate",
        "c",
        "--ttl-ms",
        "4500",
        "--duration-ms",
        "300",
    ]))
    .await;
    assert_eq!(code, Some(0), "{lines:?}");
    let events: Vec<&str> = lines.iter().filter_map(|l| l["event"].as_str()).collect();
    assert_eq!(events, ["elected", "resigned"]);
    assert_eq!(lines[0]["candidate"], "c");
    assert_eq!(lines[0]["value"], "c-value");
    let free_view = client
        .get(&ResourceKey::new(TENANT, free.clone()))
        .await
        .unwrap()
        .view
        .unwrap();
    assert_eq!(free_view.holder_id, "c#c-value");
    assert_eq!(free_view.status, LeaseStatus::Released);

    // B resigns with nobody waiting: the observer sees nobody lead.
    b.resign().await.unwrap();
    assert_eq!(next_change(&mut leaders).await, None);
    assert_eq!(election.leader().await.unwrap(), None);
    drop(leaders);
    b_client.close().await;

    // A mutex: the second locker waits, parked, and gets the lock when the first unlocks, with
    // a larger token; meanwhile a try_lock is refused, naming the holder.
    let lock_name = cluster.resource_in_group(TENANT, 0, "mutex", 0);
    let mutex = Mutex::new(&client, TENANT, lock_name.clone());
    let first = mutex.lock("m1", TTL, WAIT).await.unwrap();
    assert!(first.is_valid());
    let error = mutex
        .try_lock("m3", TTL)
        .await
        .expect_err("the mutex is held");
    assert_eq!(error.current_holder().map(|(holder, _)| holder), Some("m1"));
    assert!(!is_wait_ended(&error));
    // Nothing parked from before, so that the gauge below counts the second locker.
    wait_for(Duration::from_secs(20), "no parked waits", || async {
        (parked().await < 1.0).then_some(())
    })
    .await
    .unwrap();
    let second_client = connect(&cluster).await;
    let second_mutex = Mutex::new(&second_client, TENANT, lock_name.clone());
    let second = tokio::spawn(async move { second_mutex.lock("m2", TTL, WAIT).await });
    wait_for(
        Duration::from_secs(20),
        "the second locker parked",
        || async { (parked().await >= 1.0).then_some(()) },
    )
    .await
    .unwrap();
    assert!(!second.is_finished(), "the second locker must wait");
    let first_token = first.fencing_token();
    first.unlock().await.unwrap();
    let second = tokio::time::timeout(Duration::from_secs(10), second)
        .await
        .expect("the second locker granted within 10 s of the unlock")
        .unwrap()
        .unwrap();
    assert!(second.fencing_token() > first_token);
    let view = client.get(mutex.key()).await.unwrap().view.unwrap();
    assert_eq!(
        (view.holder_id.as_str(), view.fencing_token, view.status),
        ("m2", second.fencing_token(), LeaseStatus::Active)
    );
    second.unlock().await.unwrap();
    let view = client.get(mutex.key()).await.unwrap().view.unwrap();
    assert_eq!(view.status, LeaseStatus::Released);
    second_client.close().await;
    client.close().await;
}
