//! The load generator's `scale` scenario (issue 25), small, against a cluster of real `tenure`
//! node processes: 20,000 leases (90% in sessions, a storm of 2,000 of them), failovers and a
//! restart through the cluster's own kill and start, a fourth node added (the cluster's own
//! `add_node` and `AddNode` in the node table; the placement controller is off, as in every
//! `ProcessCluster` by default), the nodes' metrics read over HTTP. It must run to its end with
//! every figure present and sane: every lease acquired and still held after the hold window,
//! every group serving again after each failover, the restarted node ready and caught up, every
//! storm lease reclaimed, the last group's replica moved to the new node. Speeds are printed,
//! never asserted.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    missing_docs
)]

use crate::common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use common::{ClusterOptions, ProcessCluster, forward};
use tenure_client::{Client, ClientConfig, Credentials, Endpoint};
use tenure_core::{ClusterOp, NodeAddresses};
use tenure_loadgen::keys::{KeyChooser, KeyDistribution};
use tenure_loadgen::node_control::{BoxFuture, ControlError, NodeControl};
use tenure_loadgen::report::Report;
use tenure_loadgen::scenario::Mix;
use tenure_loadgen::scenario::scale::{ScaleConfig, ScaleNode, run_scale};
use tenure_loadgen::target::Target;
use tenure_loadgen::target::tenure::TenureTarget;
use tenure_proto::client::{RequestBody, ResponseBody};

/// A request to the test cluster, and where its answer goes.
enum Command {
    Kill(u64),
    Start(u64),
    Pids,
    Add,
}

/// The test task's answer: the live nodes' process ids (after a kill, start or pids), the new
/// node's id (after an add), or why the add failed.
enum Answer {
    Pids(BTreeMap<u64, u32>),
    Added(u64),
    Failed(String),
}

type Request = (Command, oneshot::Sender<Answer>);

/// The scenario's node control: requests go to the test's task, which owns the cluster (a
/// `ProcessCluster` holds the binary's cluster lock and stays on the task that started it).
struct ClusterControl(mpsc::UnboundedSender<Request>);

impl ClusterControl {
    fn ask(&self, command: Command) -> BoxFuture<'_, Result<Answer, ControlError>> {
        let (reply, answer) = oneshot::channel();
        let sent = self.0.send((command, reply));
        Box::pin(async move {
            sent.map_err(|_| ControlError::Answer("the test cluster is gone".into()))?;
            answer
                .await
                .map_err(|_| ControlError::Answer("the test cluster did not answer".into()))
        })
    }
}

impl NodeControl for ClusterControl {
    fn kill(&self, id: u64) -> BoxFuture<'_, Result<(), ControlError>> {
        let answer = self.ask(Command::Kill(id));
        Box::pin(async move { answer.await.map(drop) })
    }

    fn start(&self, id: u64) -> BoxFuture<'_, Result<(), ControlError>> {
        let answer = self.ask(Command::Start(id));
        Box::pin(async move { answer.await.map(drop) })
    }

    fn pids(&self) -> BoxFuture<'_, Result<BTreeMap<u64, u32>, ControlError>> {
        let answer = self.ask(Command::Pids);
        Box::pin(async move {
            match answer.await? {
                Answer::Pids(pids) => Ok(pids),
                _ => Err(ControlError::Answer("not a list of pids".into())),
            }
        })
    }

    fn add(&self) -> BoxFuture<'_, Result<u64, ControlError>> {
        let answer = self.ask(Command::Add);
        Box::pin(async move {
            match answer.await? {
                Answer::Added(node) => Ok(node),
                Answer::Failed(why) => Err(ControlError::Answer(why)),
                Answer::Pids(_) => Err(ControlError::Answer("not a node id".into())),
            }
        })
    }
}

/// Adds the next node id to `cluster` as an operator would: `add_node` (a certificate from the
/// cluster CA, `join_existing`, the process) and `AddNode` in the node table through a live
/// node (forwarded to the metadata group's leader; asked again for up to 5 s).
async fn add_node(cluster: &mut ProcessCluster) -> Result<u64, String> {
    let node = cluster.ids().into_iter().max().unwrap_or(0) + 1;
    let asker = cluster
        .live_ids()
        .into_iter()
        .next()
        .ok_or("no live node to announce the new one")?;
    let (addr, http_addr) = cluster.add_node(node);
    let client = cluster.client(asker).await;
    let op = ClusterOp::AddNode(NodeAddresses {
        node_id: node,
        addr: addr.to_string(),
        http_addr: http_addr.to_string(),
    });
    let mut last = String::new();
    for _ in 0..20 {
        match client
            .call(RequestBody::ClusterChange(op.clone()), forward())
            .await
        {
            Ok(ResponseBody::ClusterChanged(_)) => {
                client.close().await;
                return Ok(node);
            }
            other => last = format!("{other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    client.close().await;
    Err(format!("AddNode of node {node}: {last}"))
}

/// Serves the control's requests on `cluster` until the control is dropped.
async fn serve_control(
    cluster: &mut ProcessCluster,
    mut requests: mpsc::UnboundedReceiver<Request>,
) {
    while let Some((command, reply)) = requests.recv().await {
        match command {
            Command::Kill(id) => cluster.kill(id),
            Command::Start(id) => cluster.restart(id),
            Command::Pids => {}
            Command::Add => {
                let answer = match add_node(cluster).await {
                    Ok(node) => Answer::Added(node),
                    Err(why) => Answer::Failed(why),
                };
                let _ = reply.send(answer);
                continue;
            }
        }
        let pids = cluster
            .live_ids()
            .into_iter()
            .map(|id| (id, cluster.pid(id)))
            .collect();
        let _ = reply.send(Answer::Pids(pids));
    }
}

const LEASES: u64 = 20_000;
const STORM: u64 = 2_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_scenario_small_runs_to_its_end_with_every_figure() {
    // Snapshots every 100 entries, so that the run builds some (and the restarted node may
    // catch up from one).
    let mut cluster = ProcessCluster::start_ready(ClusterOptions {
        snapshot_every_entries: Some(100),
        ..ClusterOptions::default()
    })
    .await;
    let endpoints = cluster
        .ids()
        .into_iter()
        .map(|id| Endpoint {
            node_id: Some(id),
            addr: cluster.node(id).quic_addr,
        })
        .collect();
    let nodes: Vec<ScaleNode> = cluster
        .ids()
        .into_iter()
        .map(|id| ScaleNode {
            id,
            http_url: cluster.http_url(id),
        })
        .collect();
    let session_ttl = Duration::from_millis(cluster.ttl_bounds_ms().0.max(4_500));
    let groups = cluster.options.groups;
    let client = Client::connect(ClientConfig::new(
        endpoints,
        cluster.ca_pem().to_string(),
        Credentials::InsecureDev {
            principal_id: "loadgen-scale-test".into(),
        },
    ))
    .await
    .unwrap();
    let target = Arc::new(Target::Tenure(TenureTarget::new(client, "scale".into())));
    let (requests, served) = mpsc::unbounded_channel();
    let control = Arc::new(ClusterControl(requests));
    let config = ScaleConfig {
        leases: LEASES,
        session_share_percent: 90,
        sessions: None,
        session_ttl,
        individual_ttl: Duration::from_secs(60),
        storm_leases: Some(STORM),
        // Several tenants per part (a tenant's quota is cluster-wide).
        leases_per_tenant: 10_000,
        foreground_rate_ops_per_s: 200.0,
        saturation: Duration::from_secs(2),
        window: Duration::from_secs(2),
        workers: 64,
        acquire_workers: 16,
        acquire_phase_max: Duration::from_secs(120),
        node_bound: Duration::from_secs(60),
        settle: Duration::from_secs(1),
        nodes,
        keys: KeyChooser::new(100_000, KeyDistribution::Uniform).unwrap(),
        mix: Mix::MIXED,
        seed: 5,
        run_tag: std::process::id(),
        progress: true,
    };
    let started = Instant::now();
    let outcome = tokio::select! {
        outcome = run_scale(target.clone(), &config, control) => outcome,
        () = serve_control(&mut cluster, served) => unreachable!("the control lives as long as the run"),
    };
    let outcome = outcome.unwrap_or_else(|error| panic!("scale: {error}\n{}", cluster.log_tails()));
    let took = started.elapsed();
    target.close().await;
    let report = Report::new(
        "tenure",
        "scale",
        config.workers,
        Some(config.foreground_rate_ops_per_s),
        outcome,
        serde_json::json!({}),
    );
    // The figures with their targets (the foreground's per-operation rows left out).
    let table = report.table();
    for line in table.lines().skip_while(|line| !line.starts_with("item ")) {
        println!("scale: {line}");
    }
    println!("scale: the run took {:.1} s", took.as_secs_f64());
    let json = serde_json::to_value(&report).unwrap();
    let d = &json["details"];

    // Every figure is there, with a value, a target and a verdict.
    let figures = d["figures"].as_array().unwrap();
    assert!(figures.len() >= 20, "{figures:?}");
    for figure in figures {
        for key in ["item", "figure", "value", "target", "verdict"] {
            assert!(figure[key].as_str().is_some(), "{key} of {figure}");
        }
    }
    // The plan and the acquire phase: every lease held, in the parts planned.
    assert_eq!(d["plan"]["leases"], LEASES, "{}", d["plan"]);
    assert_eq!(d["plan"]["storm"]["leases"], STORM, "{}", d["plan"]);
    assert_eq!(d["plan"]["groups"], groups, "{}", d["plan"]);
    assert!(
        d["plan"]["main"]["tenants"].as_u64().unwrap() >= 2,
        "{}",
        d["plan"]
    );
    let acquire = &d["acquire"];
    assert_eq!(acquire["held"], LEASES, "{acquire}");
    assert_eq!(
        acquire["session_records_opened"], acquire["session_records"],
        "{acquire}"
    );
    assert!(acquire["leases_per_s"].as_f64().unwrap() > 0.0, "{acquire}");
    assert!(d["mixed_throughput"]["ops_per_s"].as_f64().unwrap() > 0.0);
    // Holding: still every lease, individually valid or bound to a live session record, and
    // the nodes count at least as many active leases.
    let hold = &d["hold"];
    assert_eq!(hold["held"], LEASES, "{hold}");
    assert!(
        hold["cluster_active_leases"].as_f64().unwrap() >= LEASES as f64,
        "{hold}"
    );
    assert!(
        hold["foreground_holding"]["ops"].as_u64().unwrap() > 0,
        "{hold}"
    );
    // Failovers: every group served again; the node came back caught up.
    for key in ["failover_empty", "failover_held"] {
        let failover = &d[key];
        assert_eq!(failover["groups_served"], groups, "{key}: {failover}");
        assert!(
            failover["all_served_s"].as_f64().is_some(),
            "{key}: {failover}"
        );
        assert!(
            failover["restart"]["caught_up_s"].as_f64().is_some(),
            "{key}: {failover}"
        );
        assert!(
            failover["restart"]["start_error"].is_null(),
            "{key}: {failover}"
        );
    }
    // The restart: ready and caught up.
    let restart = &d["restart"]["catch_up"];
    assert!(restart["ready_s"].as_f64().is_some(), "{restart}");
    assert!(restart["caught_up_s"].as_f64().is_some(), "{restart}");
    // Memory: every node's RSS before and after (from the metrics or /proc).
    let memory = &d["memory"];
    for side in ["nodes_before", "nodes_holding"] {
        let nodes = memory[side].as_array().unwrap();
        assert_eq!(nodes.len(), 3, "{memory}");
        assert!(
            nodes
                .iter()
                .all(|node| node["rss_bytes"].as_u64().unwrap() > 0),
            "{memory}"
        );
    }
    assert!(memory["loadgen_rss_bytes_holding"].as_u64().unwrap() > 0);
    // The storm: every one of its leases ended, and when is known.
    let storm = &d["storm"];
    assert_eq!(storm["leases"], STORM, "{storm}");
    assert_eq!(storm["records_refused"], 0, "{storm}");
    assert!(storm["ended"].as_u64().unwrap() >= STORM, "{storm}");
    assert!(
        storm["all_ended_after_latest_end_s"].as_f64().is_some(),
        "{storm}"
    );
    // The new replica: node 4 joined, and the last group's replica moved to it from a voter that
    // is not its leader (the controller is off: nothing else moved, and node 4's lease records
    // are the group's alone).
    let grown = &d["new_replica"]["figures"];
    assert!(grown["error"].is_null(), "{grown}");
    assert_eq!(grown["node"], 4, "{grown}");
    assert_eq!(grown["group"], groups - 1, "{grown}");
    let from = grown["from"].as_u64().unwrap();
    assert_ne!(grown["leader"].as_u64(), Some(from), "{grown}");
    assert!(grown["move_s"].as_f64().unwrap() > 0.0, "{grown}");
    let voters: Vec<u64> = grown["voters_after"]
        .as_array()
        .unwrap()
        .iter()
        .map(|voter| voter.as_u64().unwrap())
        .collect();
    assert!(voters.contains(&4) && !voters.contains(&from), "{grown}");
    assert_eq!(voters.len(), 3, "{grown}");
    assert_eq!(grown["new_node_replicas_created"], 1.0, "{grown}");
    assert_eq!(grown["new_node_groups"], 1.0, "{grown}");
    assert!(
        grown["applied_index_target"].as_u64().unwrap() > 0,
        "{grown}"
    );
    assert!(
        grown["applied_s"].as_f64().unwrap() >= grown["move_s"].as_f64().unwrap(),
        "{grown}"
    );
    // The new replica holds the group's state: about its share of the leases (hashing is even
    // to within a few percent at this size), more than half of it at least.
    let share = LEASES as f64 / f64::from(groups);
    assert!(
        grown["lease_records_on_new_node"].as_f64().unwrap() > share / 2.0,
        "{grown}"
    );
    if let Some(moves) = grown["replica_moves_ended_during"].as_f64() {
        assert!((moves - 1.0).abs() < 0.5, "{grown}");
    }
    let row = figures
        .iter()
        .find(|figure| figure["item"] == "10")
        .unwrap();
    assert!(
        row["value"].as_str().unwrap().contains(" s (applied ")
            && ["met", "missed"].contains(&row["verdict"].as_str().unwrap()),
        "{row}"
    );
    // Snapshots were built (the nodes export their figures since issue 25; a node without them
    // gives nulls, which the table prints as `-`).
    let snapshots = &d["snapshots"];
    if let Some(builds) = snapshots["builds"].as_f64() {
        assert!(builds > 0.0, "{snapshots}");
        assert!(
            snapshots["bytes_max"].as_f64().unwrap() > 0.0,
            "{snapshots}"
        );
    }
    // The foreground ran the whole time; the plot has the nodes' memory.
    assert!(report.ops_total > 0);
    assert!(!d["node_rss_series"].as_array().unwrap().is_empty());
    let dir = tempfile::tempdir().unwrap();
    report.write_json(&dir.path().join("scale.json")).unwrap();
    report.write_plot(&dir.path().join("scale.svg")).unwrap();
    let svg = std::fs::read_to_string(dir.path().join("scale.svg")).unwrap();
    assert!(svg.contains("node resident memory"));
}
