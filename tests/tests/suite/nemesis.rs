//! The fault-injection suite's short mode: a fixed corpus of seeded runs against real clusters
//! of node processes (every nemesis, alone and combined, 3 and 5 nodes, namespaces and the
//! loopback fallback), each checked for every safety property; and the fencing demo.
//!
//! The long mode is the `nemesis` binary (`cargo run --release -p tenure-tests --bin nemesis --
//! --runs N --duration 60s --summary-json FILE`).

use std::io::BufRead as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use tenure_client::AcquireOptions;
use tenure_core::NegativeControl;
use tenure_tests::checker::Property;
use tenure_tests::fencing::{StoreClient, StoreServer};
use tenure_tests::harness::cluster::ClusterOptions;
use tenure_tests::harness::network::NetworkRequest;
use tenure_tests::harness::run::{KeepDir, RunConfig, run_one, start_ready_cluster};
use tenure_tests::harness::schedule::{FaultKind, PlanShape, plan};
use tenure_tests::harness::zombie::ZombieLine;
use tenure_tests::history::{FencedWrite, mono_now_ns};

use crate::one_at_a_time;

fn exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_nemesis"))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// One seeded run of the short mode.
struct Case {
    seed: u64,
    nodes: u64,
    kinds: Vec<FaultKind>,
    combined: bool,
    network: NetworkRequest,
    seconds: u64,
}

/// The short mode's corpus: every nemesis alone (in runs of two to six), all of them combined
/// on 5 nodes, and a run on the loopback fallback (the nodes' fault layer instead of
/// iptables). Seeds were chosen so each run's plan has every nemesis it names (checked below).
fn corpus() -> Vec<Case> {
    use FaultKind::*;
    let case = |seed, nodes, kinds: &[FaultKind], combined, network, seconds| Case {
        seed,
        nodes,
        kinds: kinds.to_vec(),
        combined,
        network,
        seconds,
    };
    let auto = NetworkRequest::Auto;
    vec![
        case(11, 3, &[Kill, PauseNode, PartitionLeader], false, auto, 20),
        case(
            12,
            3,
            &[PartitionHalves, PartitionBridge, PauseClient],
            false,
            auto,
            20,
        ),
        case(14, 3, &[ClockRate, ClockJump, SlowDisk], false, auto, 20),
        case(17, 5, &FaultKind::FAULT_SUITE, true, auto, 25),
        // Membership: replica moves (5 nodes: a spare node per group) beside kills; nodes
        // added, drained, removed and replaced (killed for good) beside kills.
        case(18, 5, &[MoveReplica, Kill], false, auto, 20),
        case(
            2577,
            5,
            &[AddNode, DrainNode, RemoveNode, ReplaceNode, Kill],
            false,
            auto,
            30,
        ),
        case(
            15,
            3,
            &[PartitionHalves, Kill, PauseClient],
            true,
            NetworkRequest::Loopback,
            15,
        ),
    ]
}

#[test]
fn the_short_corpus_plans_every_nemesis() {
    let mut planned = std::collections::BTreeSet::new();
    for Case {
        seed,
        nodes,
        kinds,
        combined,
        seconds,
        ..
    } in corpus()
    {
        let shape = PlanShape {
            kinds: kinds.clone(),
            combined,
            duration_ms: seconds * 1_000,
            nodes,
            client_processes: 3,
            ttl_ms: 3_000,
        };
        let steps = plan(seed, &shape);
        for kind in &kinds {
            if !combined {
                assert!(
                    steps.iter().any(|s| s.fault.kind() == *kind),
                    "seed {seed} plans no {}: {steps:?}",
                    kind.name()
                );
            }
        }
        planned.extend(steps.iter().map(|s| s.fault.kind()));
    }
    assert_eq!(planned.len(), FaultKind::FAULT_SUITE.len(), "{planned:?}");
}

#[test]
fn short_fault_runs_find_no_violation() {
    let _one = one_at_a_time();
    let runtime = runtime();
    let mut failed = Vec::new();
    let mut hand_offs = 0;
    for Case {
        seed,
        nodes,
        kinds,
        combined,
        network,
        seconds,
    } in corpus()
    {
        let membership = kinds.contains(&FaultKind::AddNode) && !combined;
        let mut config = RunConfig::new(seed, exe(), kinds);
        config.nodes = nodes;
        config.combined = combined;
        config.network = network;
        config.duration = Duration::from_secs(seconds);
        let report = runtime
            .block_on(run_one(&config))
            .unwrap_or_else(|error| panic!("seed {seed}: the run could not complete: {error}"));
        println!("{}", report.summary_line());
        if let Some(reason) = &report.network_fallback_reason {
            println!("nemesis seed {seed}: network {} ({reason})", report.network);
        }
        for skipped in &report.skipped {
            println!("nemesis seed {seed}: skipped {skipped}");
        }
        for violation in &report.violations {
            println!("{}", violation.describe(report.origin_ns));
        }
        // A run that checked little proves little.
        assert!(
            report.check.ops_checked >= 300 && report.check.replays_compared >= 10,
            "seed {seed}: only {} operations and {} replays checked",
            report.check.ops_checked,
            report.check.replays_compared
        );
        assert!(
            !report.nemeses.is_empty(),
            "seed {seed}: no fault was applied"
        );
        // Watches and `tenurectl lock` ran under the faults too (the lock needs `tenurectl`
        // beside the nemesis binary: the workspace's test selection builds it).
        assert!(
            report.check.watch_events_judged > 0 && report.check.lock_runs_judged > 0,
            "seed {seed}: {} watch events and {} lock commands judged",
            report.check.watch_events_judged,
            report.check.lock_runs_judged
        );
        hand_offs += report.check.hand_offs_judged;
        if membership {
            // The membership run proves something only when the cluster did change: a node
            // added, one replaced, one drained or removed (their preconditions depend on the
            // cluster's state, so a step may be skipped; not all of them).
            let applied = |kind: FaultKind| report.nemeses.contains_key(kind.name());
            assert!(
                applied(FaultKind::AddNode)
                    && applied(FaultKind::ReplaceNode)
                    && (applied(FaultKind::DrainNode) || applied(FaultKind::RemoveNode)),
                "seed {seed}: membership faults applied: {:?}",
                report.nemeses
            );
        }
        if !report.passed() {
            failed.push((seed, report.violations.len(), report.dir.clone()));
        }
    }
    assert!(
        failed.is_empty(),
        "runs with violations (seed, count, kept directory): {failed:?}"
    );
    assert!(hand_offs > 0, "no hand-off to a waiter was judged");
}

#[test]
fn each_negative_control_is_caught_in_a_real_cluster() {
    use FaultKind::*;
    use Property::*;
    let _one = one_at_a_time();
    let runtime = runtime();
    // (control, seed, nemesis, seconds, properties of which at least one must be violated)
    let controls = [
        (
            NegativeControl::SkipExpiryCheck,
            21,
            ClockRate,
            10,
            vec![SingleHolder, Linearizable],
        ),
        (
            NegativeControl::DisableDeduplication,
            21,
            ClockRate,
            10,
            vec![ExactlyOnce],
        ),
        (
            NegativeControl::ResetTokensOnNewLeader,
            22,
            Kill,
            15,
            vec![Fencing],
        ),
        (
            NegativeControl::ExpireByWallClock,
            22,
            ClockJump,
            15,
            vec![SingleHolder, Linearizable],
        ),
    ];
    let mut missed = Vec::new();
    for (control, seed, kind, seconds, expected) in controls {
        let mut config = RunConfig::new(seed, exe(), vec![kind]);
        config.duration = Duration::from_secs(seconds);
        config.negative_control = control;
        config.keep = KeepDir::Never;
        let report = runtime.block_on(run_one(&config)).unwrap_or_else(|error| {
            panic!("{}: the run could not complete: {error}", control.name())
        });
        let mut found: Vec<&str> = report
            .violations
            .iter()
            .map(|v| v.property.name())
            .collect();
        found.sort_unstable();
        found.dedup();
        println!(
            "negative control {}: {} violation(s) of {found:?} in {} ops",
            control.name(),
            report.violations.len(),
            report.check.ops_checked
        );
        if !report
            .violations
            .iter()
            .any(|v| expected.contains(&v.property))
        {
            missed.push((control.name(), found.join(",")));
        }
    }
    assert!(
        missed.is_empty(),
        "negative controls the checker missed: {missed:?}"
    );
}

/// Reads the zombie's next line.
fn next_line(lines: &mut impl Iterator<Item = std::io::Result<String>>) -> ZombieLine {
    let line = lines
        .next()
        .expect("the zombie ended early")
        .expect("reading the zombie");
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("zombie said {line:?}: {e}"))
}

#[test]
fn a_paused_holders_late_write_is_rejected_by_the_fenced_store() {
    let _one = one_at_a_time();
    let runtime = runtime();
    let dir = tempfile::Builder::new()
        .prefix("tenure-fencing-demo-")
        .tempdir()
        .unwrap();
    runtime.block_on(async {
        let options = ClusterOptions {
            groups: 2,
            ..ClusterOptions::default()
        };
        let (cluster, client) =
            start_ready_cluster(dir.path(), NetworkRequest::Loopback, &exe(), options)
                .await
                .unwrap();
        let store = StoreServer::start(&dir.path().join("store.sock")).unwrap();
        let ttl_ms = 3_000;
        let mut zombie = Command::new(exe())
            .arg("zombie")
            .arg("--cluster")
            .arg(cluster.cluster_file())
            .args([
                "--tenant",
                "demo",
                "--resource",
                "db-primary",
                "--holder",
                "zombie",
            ])
            .args(["--ttl-ms", &ttl_ms.to_string(), "--work-ms", "400"])
            .arg("--store")
            .arg(store.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let pid = rustix::process::Pid::from_raw(i32::try_from(zombie.id()).unwrap()).unwrap();
        let stdout = zombie.stdout.take().unwrap();
        let mut lines = std::io::BufReader::new(stdout).lines();

        let ZombieLine::Granted {
            token: zombie_token,
            deadline_ns,
        } = next_line(&mut lines)
        else {
            panic!("expected the grant first");
        };
        let ZombieLine::Wrote { accepted, .. } = next_line(&mut lines) else {
            panic!("expected the first write");
        };
        assert!(accepted, "the holder's write inside its lease is accepted");
        let ZombieLine::Checked(_) = next_line(&mut lines) else {
            panic!("expected the deadline check");
        };
        // The holder checked its deadline and is about to write: stop it there.
        rustix::process::kill_process(pid, rustix::process::Signal::STOP).unwrap();

        // Another holder waits out the lease (retrying while it is held), then writes.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let lease = loop {
            let options = AcquireOptions::new(
                "demo",
                "db-primary",
                "successor",
                Duration::from_millis(ttl_ms),
            );
            match client.acquire_with(options).await {
                Ok(lease) => break lease,
                Err(error) if error.is_retryable() || error.is_already_held() => {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "never granted: {error}"
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(error) => panic!("acquire: {error}"),
            }
        };
        assert!(
            lease.fencing_token() > zombie_token,
            "the new grant has the newer token"
        );
        assert!(
            mono_now_ns() >= deadline_ns,
            "the zombie's safe deadline has passed"
        );
        let mut successor = StoreClient::connect(store.path()).await.unwrap();
        let reply = successor
            .write(&FencedWrite {
                client: "successor".into(),
                holder: "successor".into(),
                resource: "db-primary".into(),
                token: lease.fencing_token(),
                checked_ns: mono_now_ns(),
                deadline_ns: mono_now_ns() + 1_000_000_000,
            })
            .await
            .unwrap();
        assert!(reply.accepted);

        // The zombie wakes up and writes with its old token: fenced off.
        rustix::process::kill_process(pid, rustix::process::Signal::CONT).unwrap();
        let ZombieLine::LateWrite {
            accepted,
            highest_before,
            arrived_after_deadline,
        } = next_line(&mut lines)
        else {
            panic!("expected the late write");
        };
        assert!(
            arrived_after_deadline,
            "the zombie wrote after its deadline"
        );
        assert!(!accepted, "the zombie's stale write is rejected");
        assert_eq!(highest_before, lease.fencing_token());
        println!(
            "fencing demo: zombie (token {zombie_token}) paused past its lease; successor took \
             token {} and wrote; the zombie's late write was rejected by the store",
            lease.fencing_token()
        );
        let _ = zombie.wait();
        let _ = lease.release().await;
        client.close().await;
        drop(cluster);
    });
}
