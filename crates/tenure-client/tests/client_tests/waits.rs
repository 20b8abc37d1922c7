//! Wait queues end to end against real `tenure` processes: waiters get a held resource in the
//! order they queued, each in the same apply as the previous holder's release (the parked call
//! is answered by the hand-off, no polling); a waiter in a session keeps its place across a
//! kill -9 of the group's leader; a wait that runs out ends with WAIT_ENDED and leaves the
//! queue; and `tenurectl lock` stops its command before the safe deadline when the holder
//! itself is paused (SIGSTOP), while a second `tenurectl lock` of the same name runs its
//! command only after the first one's is gone.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    missing_docs
)]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tenure_client::{AcquireOptions, ResourceKey, WaitOptions, is_wait_ended};
use tenure_testkit::{TENANT, wait_for};

use crate::client_library::{
    cluster_with_a_follower_of_group_0, connect, metric_sum, tenurectl_cluster_file,
};

const TTL: Duration = Duration::from_millis(4_500);
/// The sessions that live through a kill -9 of their group's leader: a failover (detection,
/// election, the clients finding the new leader) takes a few seconds here, so a session's
/// keep-alives need a ttl well above the cluster's minimum to be confirmed in time.
const SESSION_TTL: Duration = Duration::from_secs(15);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_get_a_released_resource_in_queue_order_without_polling() {
    let (cluster, client, _follower) = cluster_with_a_follower_of_group_0().await;
    let resource = cluster.resource_in_group(TENANT, 0, "queue", 0);
    let holder = client
        .acquire_grant(
            AcquireOptions::new(TENANT, resource.clone(), "first", TTL).without_auto_renew(),
        )
        .await
        .unwrap();
    let ids = cluster.ids();
    // Three waiters, each queued before the next starts (the leader's parked-calls gauge says
    // so), each on a client of its own.
    let mut waiters = Vec::new();
    for (index, name) in ["w1", "w2", "w3"].into_iter().enumerate() {
        let waiter_client = connect(&cluster).await;
        let options =
            WaitOptions::new(TENANT, resource.clone(), name, TTL, Duration::from_secs(60));
        waiters.push(tokio::spawn(async move {
            let grant = waiter_client.acquire_wait(options).await;
            (grant, Instant::now(), waiter_client)
        }));
        wait_for(Duration::from_secs(20), "the waiter parked", || async {
            (metric_sum(&cluster, &ids, "tenure_waits_parked").await >= (index + 1) as f64)
                .then_some(())
        })
        .await
        .unwrap();
    }
    let requests_before = metric_sum(&cluster, &ids, "tenure_requests_total").await;

    // Each release hands the resource to the next waiter, in queue order, with a larger token.
    let mut previous = holder.clone();
    let mut previous_holder = "first".to_string();
    for (index, waiter) in waiters.into_iter().enumerate() {
        let released_at = Instant::now();
        client
            .release(
                ResourceKey::new(TENANT, resource.clone()),
                previous.lease_id,
                previous_holder.clone(),
                None,
            )
            .await
            .unwrap();
        let (grant, granted_at, waiter_client) =
            tokio::time::timeout(Duration::from_secs(10), waiter)
                .await
                .unwrap()
                .unwrap();
        let grant = grant.unwrap();
        let name = format!("w{}", index + 1);
        assert_eq!(grant.holder_id, name);
        assert!(grant.fencing_token > previous.fencing_token);
        let view = client.get(&grant.key).await.unwrap().view.unwrap();
        assert_eq!(view.holder_id, name);
        assert_eq!(view.fencing_token, grant.fencing_token);
        println!(
            "hand-off {} -> {name}: answered {} ms after the release was sent",
            previous_holder,
            granted_at
                .saturating_duration_since(released_at)
                .as_millis()
        );
        waiter_client.close().await;
        previous = grant;
        previous_holder = name;
    }
    // No herd: each hand-off cost the release, the waiter's answer and its renewal, not a
    // round of polls (the waiters parked; nothing was sent while they waited).
    let requests = metric_sum(&cluster, &ids, "tenure_requests_total").await - requests_before;
    println!("requests during three hand-offs: {requests}");
    assert!(
        requests <= 3.0 * 8.0,
        "{requests} requests for three hand-offs"
    );
    client.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_waiter_keeps_its_place_across_a_leader_kill_and_a_wait_can_run_out() {
    let (mut cluster, client, _follower) = cluster_with_a_follower_of_group_0().await;
    let resource = cluster.resource_in_group(TENANT, 0, "failover", 0);
    let holder = client.session(TENANT, "holder", SESSION_TTL).unwrap();
    let held = holder.acquire(resource.clone()).await.unwrap();

    // A waiter whose wait runs out gets WAIT_ENDED (code ALREADY_HELD) and leaves the queue.
    let impatient = connect(&cluster).await;
    let error = impatient
        .acquire_wait(WaitOptions::new(
            TENANT,
            resource.clone(),
            "impatient",
            TTL,
            Duration::from_millis(300),
        ))
        .await
        .unwrap_err();
    assert!(is_wait_ended(&error), "{error}");
    assert_eq!(error.code_str(), "ALREADY_HELD");

    let waiter_client = connect(&cluster).await;
    let waiter = waiter_client
        .session(TENANT, "waiter", SESSION_TTL)
        .unwrap();
    let waiting = {
        let waiter = waiter.clone();
        let resource = resource.clone();
        tokio::spawn(async move {
            waiter
                .acquire_wait(resource, Duration::from_secs(60), None)
                .await
        })
    };
    let ids = cluster.ids();
    wait_for(Duration::from_secs(20), "the waiter parked", || async {
        (metric_sum(&cluster, &ids, "tenure_waits_parked").await >= 1.0).then_some(())
    })
    .await
    .unwrap();

    // kill -9 the group's leader: the waiter's place is in the replicated state; its client
    // retries the same request id at the new leader.
    let leader = cluster.leader_of(ids[0], 0).await.unwrap();
    cluster.kill(leader);
    let survivors: Vec<u64> = ids.iter().copied().filter(|&id| id != leader).collect();
    wait_for(
        Duration::from_secs(30),
        "a new leader of group 0",
        || async {
            cluster
                .leader_of(survivors[0], 0)
                .await
                .filter(|&new| new != leader)
        },
    )
    .await
    .unwrap();
    assert!(
        !waiting.is_finished(),
        "the waiter must not be granted while the lease is held"
    );
    holder.release(&held).await.unwrap();
    let granted = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .unwrap()
        .unwrap();
    let view = client.get(&held.key).await.unwrap().view;
    let granted = granted.unwrap_or_else(|error| {
        panic!(
            "the waiter got {error}; the resource: {view:?}; the waiter's groups {:?}",
            waiter.groups()
        )
    });
    assert!(granted.fencing_token > held.fencing_token);
    assert!(waiter.is_valid(&granted));
    let view = client.get(&granted.key).await.unwrap().view.unwrap();
    assert_eq!(view.holder_id, "waiter");
    assert_eq!(view.session_id, Some(waiter.id()));
    waiter.close().await.unwrap();
    holder.close().await.unwrap();
}

fn tenurectl() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_BIN_EXE_tenurectl"))
}

/// A `tenurectl lock` whose command runs `before` (shell), appends `start PID TOKEN` to `log`
/// and then sleeps; tenurectl's stdin and stdout are `stdin` and `stdout` (the command's too).
fn spawn_lock(
    cluster_file: &Path,
    holder: &str,
    log: &Path,
    ttl_ms: u64,
    before: &str,
    (stdin, stdout): (Stdio, Stdio),
) -> std::process::Child {
    let script = format!(
        "{before} echo start $$ $TENURE_FENCING_TOKEN >> {}; exec sleep 600",
        log.display()
    );
    Command::new(tenurectl())
        .arg("--cluster")
        .arg(cluster_file)
        .args([
            "-o", "json", "lock", "job-lock", "--tenant", TENANT, "--holder", holder,
        ])
        .args([
            "--ttl-ms",
            &ttl_ms.to_string(),
            "--grace-ms",
            "300",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .stdin(stdin)
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn started(log: &Path) -> Vec<(u32, u64)> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace().skip(1);
            Some((fields.next()?.parse().ok()?, fields.next()?.parse().ok()?))
        })
        .collect()
}

/// The pid of the process the second command left behind (`child PID` in `log`).
fn left_behind(log: &Path) -> u32 {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix("child ")?.trim().parse().ok())
        .unwrap()
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenurectl_lock_stops_a_paused_holders_command_before_the_next_one_starts() {
    let (cluster, client, _follower) = cluster_with_a_follower_of_group_0().await;
    let cluster_file = tenurectl_cluster_file(&cluster);
    let log = cluster.dir_path().join("lock.log");
    let ttl_ms = 4_500;
    let mut first = spawn_lock(
        &cluster_file,
        "first",
        &log,
        ttl_ms,
        "",
        (Stdio::null(), Stdio::piped()),
    );
    let (first_pid, first_token) =
        wait_for(Duration::from_secs(30), "the first command", || async {
            started(&log).first().copied()
        })
        .await
        .unwrap();
    // The second command reads tenurectl's stdin, prints more than a pipe holds to its stdout,
    // and leaves a process behind in its group: none of it may reach the watchdog's channel,
    // and the process left behind must not outlive the lock.
    let stdin_path = cluster.dir_path().join("second.in");
    let stdout_path = cluster.dir_path().join("second.out");
    std::fs::write(&stdin_path, "from-stdin\n").unwrap();
    let second_stdio = (
        Stdio::from(std::fs::File::open(&stdin_path).unwrap()),
        Stdio::from(std::fs::File::create(&stdout_path).unwrap()),
    );
    let before = format!(
        "read line; echo got $line; head -c 100000 /dev/zero | tr '\\0' x; echo; \
         sleep 600 & echo child $! >> {};",
        log.display()
    );
    let mut second = spawn_lock(&cluster_file, "second", &log, ttl_ms, &before, second_stdio);
    let ids = cluster.ids();
    wait_for(
        Duration::from_secs(20),
        "the second lock waiting",
        || async { (metric_sum(&cluster, &ids, "tenure_waits_parked").await >= 1.0).then_some(()) },
    )
    .await
    .unwrap();
    assert_eq!(started(&log).len(), 1, "the second command must wait");

    // Pause the first tenurectl itself: its keep-alives stop, and its watchdog must stop the
    // command by the last safe deadline it was given, before the session's record expires
    // and the second waiter is granted.
    let paused_at = Instant::now();
    Command::new("kill")
        .args(["-STOP", &first.id().to_string()])
        .status()
        .unwrap();
    let (second_pid, second_token) =
        wait_for(Duration::from_secs(30), "the second command", || async {
            started(&log).get(1).copied()
        })
        .await
        .unwrap();
    let handed_after = paused_at.elapsed();
    assert!(second_token > first_token);
    assert!(
        !alive(first_pid),
        "the first command (pid {first_pid}) still runs while the second (pid {second_pid}) started"
    );
    println!(
        "paused holder: second command started {} ms after the pause, first command gone",
        handed_after.as_millis()
    );
    Command::new("kill")
        .args(["-CONT", &first.id().to_string()])
        .status()
        .unwrap();
    let status = first.wait().unwrap();
    let output = std::io::read_to_string(first.stdout.take().unwrap()).unwrap();
    println!("first lock: exit {status}, {output}");
    assert_eq!(status.code(), Some(6), "the lock was lost: {output}");
    let report: serde_json::Value = serde_json::from_str(output.trim()).unwrap();
    assert_ne!(report["stopped_with"], "none", "{report}");

    // The second command ends by itself (killed here, outside tenurectl): the lock is released
    // and tenurectl exits with 128 + SIGTERM.
    Command::new("kill")
        .arg(second_pid.to_string())
        .status()
        .unwrap();
    let status = second.wait().unwrap();
    let output = std::fs::read_to_string(&stdout_path).unwrap();
    let mut lines = output.lines();
    assert_eq!(
        lines.next(),
        Some("got from-stdin"),
        "the command reads tenurectl's stdin"
    );
    assert_eq!(lines.next().map(str::len), Some(100_000));
    let report = lines.next().unwrap_or_default();
    assert_eq!(status.code(), Some(128 + 15), "{report}");
    let report: serde_json::Value = serde_json::from_str(report).unwrap();
    assert_eq!(report["released"], true, "{report}");
    let left_behind = left_behind(&log);
    assert!(
        !alive(left_behind),
        "the process the command left behind (pid {left_behind}) outlived the lock"
    );
    let view = client
        .get(&ResourceKey::new(TENANT, "job-lock"))
        .await
        .unwrap()
        .view
        .unwrap();
    assert_eq!(view.status, tenure_client::LeaseStatus::Released);
}

/// A waiter whose call is dropped (the caller gave up: a timeout of its own, a cancelled task)
/// leaves the queue: the client cancels the wait in the background, so a release does not hand
/// the resource to a waiter nobody listens to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_wait_leaves_the_queue() {
    let (cluster, client, _follower) = cluster_with_a_follower_of_group_0().await;
    let resource = cluster.resource_in_group(TENANT, 0, "dropped", 0);
    let holder = client
        .acquire_grant(
            // Long enough to outlast the cancel on a slow machine: the release must find it.
            AcquireOptions::new(TENANT, resource.clone(), "holder", SESSION_TTL)
                .without_auto_renew(),
        )
        .await
        .unwrap();
    let waiter_client = connect(&cluster).await;
    let options = WaitOptions::new(
        TENANT,
        resource.clone(),
        "gone",
        TTL,
        Duration::from_secs(60),
    );
    let waiter = tokio::spawn(async move { waiter_client.acquire_wait(options).await });
    let ids = cluster.ids();
    let parked = || async { metric_sum(&cluster, &ids, "tenure_waits_parked").await };
    wait_for(Duration::from_secs(20), "the waiter parked", || async {
        (parked().await >= 1.0).then_some(())
    })
    .await
    .unwrap();
    waiter.abort();
    // The cancel ends the wait: its parked call is answered and the gauge falls.
    wait_for(
        Duration::from_secs(20),
        "the dropped wait cancelled",
        || async { (parked().await < 1.0).then_some(()) },
    )
    .await
    .unwrap();
    let key = ResourceKey::new(TENANT, resource);
    client
        .release(key.clone(), holder.lease_id, "holder", None)
        .await
        .unwrap();
    let view = client.get(&key).await.unwrap().view.unwrap();
    assert_eq!(
        view.status,
        tenure_client::LeaseStatus::Released,
        "the release handed the resource to a dropped waiter: {view:?}"
    );
}
