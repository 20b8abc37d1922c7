//! The load generator's scenarios (`tenure-loadgen`, in-process through its library) against a
//! cluster of real `tenure` node processes, through both tenure targets: the native client and
//! the Tenure v1 HTTP routes. Each scenario must run to its end, answer every operation with a
//! success or an expected refusal, and report consistent figures: `hold` keeps every lease (none
//! lost) with coalesced renewals, `expiry` reclaims every expired lease, the open loop issues
//! about the requested number of operations. Figures are printed, never asserted as speeds.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    clippy::cast_possible_truncation,
    clippy::cast_precision_loss,
    missing_docs
)]

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{ClusterOptions, ProcessCluster};
use tenure_client::{Client, ClientConfig, Credentials, Endpoint};
use tenure_loadgen::keys::{KeyChooser, KeyDistribution};
use tenure_loadgen::report::Report;
use tenure_loadgen::scenario::{self, LoadConfig, Mix, RunOutcome, ScenarioKind, SessionEnd};
use tenure_loadgen::target::Target;
use tenure_loadgen::target::http::{HttpCredentials, HttpTarget};
use tenure_loadgen::target::tenure::TenureTarget;

async fn native_target(cluster: &ProcessCluster) -> Arc<Target> {
    let endpoints = cluster
        .ids()
        .into_iter()
        .map(|id| Endpoint {
            node_id: Some(id),
            addr: cluster.node(id).quic_addr,
        })
        .collect();
    let config = ClientConfig::new(
        endpoints,
        cluster.ca_pem().to_string(),
        Credentials::InsecureDev {
            principal_id: "loadgen-tests".into(),
        },
    );
    let client = Client::connect(config).await.unwrap();
    Arc::new(Target::Tenure(TenureTarget::new(client, "loadgen".into())))
}

fn http_target(cluster: &ProcessCluster) -> Arc<Target> {
    let urls = cluster
        .ids()
        .into_iter()
        .map(|id| cluster.http_url(id))
        .collect();
    let target = HttpTarget::new(
        urls,
        "loadgen".into(),
        HttpCredentials::InsecureDev {
            principal_id: "loadgen-tests".into(),
        },
        7,
    )
    .unwrap();
    Arc::new(Target::Http(Box::new(target)))
}

fn config(scenario: ScenarioKind, keyspace: u64, distribution: KeyDistribution) -> LoadConfig {
    LoadConfig {
        scenario,
        duration: Duration::from_secs(3),
        warmup: Duration::from_secs(1),
        workers: 16,
        rate_ops_per_s: None,
        keys: KeyChooser::new(keyspace, distribution).unwrap(),
        mix: Mix::MIXED,
        ttl: Duration::from_secs(10),
        leases: 0,
        held_per_worker_max: 100,
        acquire_phase_max: Duration::from_secs(60),
        sessions: 0,
        session_end: SessionEnd::Expire,
        node_metrics_urls: Vec::new(),
        waiters: vec![1],
        seed: 3,
        run_tag: rand_tag(),
        progress: true,
    }
}

/// Codes of transient failures (the operation may be retried).
const RETRYABLE: [&str; 3] = ["DEADLINE_EXCEEDED", "UNAVAILABLE", "NOT_LEADER"];

fn rand_tag() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(1);
    std::process::id().wrapping_mul(100) + NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Runs and reports; asserts the JSON keys scripts rely on and that only `allowed` codes
/// appeared.
async fn run_checked(
    name: &str,
    target: &Arc<Target>,
    config: &LoadConfig,
    allowed: &[&str],
) -> (Report, serde_json::Value) {
    let outcome: RunOutcome = scenario::run(target.clone(), config).await.unwrap();
    let report = Report::new(
        target.kind().name(),
        config.scenario.name(),
        config.workers,
        config.rate_ops_per_s,
        outcome,
        serde_json::json!({}),
    );
    print!("{name}: {}", report.table());
    let json = serde_json::to_value(&report).unwrap();
    for key in tenure_loadgen::report::REPORT_KEYS {
        assert!(json.get(key).is_some(), "{name}: {key} missing");
    }
    // A busy 2-core machine may time out an operation now and then: retryable codes are
    // tolerated up to 1% of the operations; any other code not in `allowed` fails the run.
    let mut retryable = 0;
    for (code, count) in &report.errors {
        if RETRYABLE.contains(&code.as_str()) {
            retryable += count;
            continue;
        }
        assert!(
            allowed.contains(&code.as_str()),
            "{name}: {count} unexpected {code} errors: {}",
            report.table()
        );
    }
    assert!(
        retryable * 100 <= report.ops_total.max(100),
        "{name}: {retryable} retryable errors: {}",
        report.table()
    );
    (report, json)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loadgen_scenarios_against_a_real_cluster() {
    let cluster = ProcessCluster::start_ready(ClusterOptions::default()).await;
    let native = native_target(&cluster).await;
    let http = http_target(&cluster);

    // acquire: unique keys, never refused.
    let (report, json) = run_checked(
        "loadgen acquire",
        &native,
        &config(ScenarioKind::Acquire, 1, KeyDistribution::Uniform),
        &[],
    )
    .await;
    assert!(report.ops_total > 0);
    assert_eq!(report.ops_ok, report.ops_total);
    assert!(
        json["ops"]["acquire"]["latency_us"]["p99"]
            .as_u64()
            .unwrap()
            > 0
    );

    // mixed on both targets: acquires may meet keys this run already holds; renewals and
    // releases of the workers' own leases succeed.
    for (name, target) in [
        ("loadgen mixed native", &native),
        ("loadgen mixed http", &http),
    ] {
        let (report, _) = run_checked(
            name,
            target,
            &config(ScenarioKind::Mixed, 100_000, KeyDistribution::Uniform),
            &["ALREADY_HELD"],
        )
        .await;
        for op in ["acquire", "renew", "release"] {
            assert!(report.ops[op].ok > 0, "{name}: no successful {op}");
        }
    }

    // contended, open loop: Zipf on 50 keys at 400 ops/s for 3 s. Acquires are refused often;
    // renewals and releases touch only the worker's own leases (ttl 10 s), so they succeed.
    let mut contended = config(
        ScenarioKind::Contended,
        50,
        KeyDistribution::Zipf { exponent: 1.1 },
    );
    contended.rate_ops_per_s = Some(400.0);
    // 64 workers: each has 160 ms per operation, far above its latency even on a busy machine.
    contended.workers = 64;
    let (report, json) = run_checked(
        "loadgen contended open loop",
        &native,
        &contended,
        &["ALREADY_HELD"],
    )
    .await;
    assert!(report.errors.get("ALREADY_HELD").copied().unwrap_or(0) > 0);
    // Open loop issues on schedule: about rate x measured time (operations answered after the
    // end still count; any never issued would count as NOT_ISSUED and fail the run above).
    let expected = 400.0 * report.duration_s;
    assert!(
        (report.ops_total as f64) > expected * 0.75 && (report.ops_total as f64) < expected * 1.25,
        "open loop answered {} operations in {:.1} s at 400/s",
        report.ops_total,
        report.duration_s
    );
    assert_eq!(json["mode"], "open");

    // hold: 2,000 leases with a 6 s ttl kept for 5 s (two renewal periods), renewed by the
    // client library in batches; none may be lost.
    let mut hold = config(ScenarioKind::Hold, 1, KeyDistribution::Uniform);
    hold.leases = 2000;
    hold.workers = 64;
    hold.ttl = Duration::from_secs(6);
    hold.duration = Duration::from_secs(5);
    let (report, json) = run_checked("loadgen hold", &native, &hold, &[]).await;
    let details = &json["details"];
    assert_eq!(details["held_at_start"], 2000, "{details}");
    assert_eq!(details["held_at_end"], 2000, "{details}");
    assert_eq!(details["lost"], 0, "{details}");
    assert!(report.ops_total >= 2000, "{details}");
    assert!(
        details["steady"]["renewals_per_request"].as_f64().unwrap() > 10.0,
        "{details}"
    );

    // hold in sessions: the same 2,000 leases under 20 sessions, kept alive by one keep-alive
    // per (session, group) per third of the ttl, coalesced per group; none may be lost.
    let mut in_sessions = hold.clone();
    in_sessions.sessions = 20;
    in_sessions.run_tag = rand_tag();
    let (_, json) = run_checked("loadgen hold sessions", &native, &in_sessions, &[]).await;
    let details = &json["details"];
    assert_eq!(details["held_at_start"], 2000, "{details}");
    assert_eq!(details["held_at_end"], 2000, "{details}");
    assert_eq!(details["lost"], 0, "{details}");
    assert!(
        details["steady"]["keepalives_confirmed"].as_u64().unwrap() > 0,
        "{details}"
    );
    // The 20 sessions' keep-alives are aligned to the client's grid (at most two phases per
    // group), so each request carries several.
    assert!(
        details["steady"]["keepalives_per_request"]
            .as_f64()
            .unwrap()
            >= 2.0,
        "{details}"
    );

    // hold through HTTP: the load generator renews each lease itself.
    let mut hold_http = hold.clone();
    hold_http.leases = 300;
    hold_http.run_tag = rand_tag();
    let (_, json) = run_checked("loadgen hold http", &http, &hold_http, &[]).await;
    assert_eq!(json["details"]["held_at_end"], 300, "{}", json["details"]);
    assert_eq!(json["details"]["lost"], 0, "{}", json["details"]);

    // expiry: 500 leases with the shortest allowed ttl expire together and are all reclaimed.
    let mut expiry = config(ScenarioKind::Expiry, 10_000, KeyDistribution::Uniform);
    expiry.leases = 500;
    expiry.ttl = Duration::from_millis(cluster.ttl_bounds_ms().0.max(4500));
    expiry.duration = Duration::from_secs(60);
    let (_, json) = run_checked("loadgen expiry", &native, &expiry, &["ALREADY_HELD"]).await;
    let details = &json["details"];
    assert_eq!(details["expiring"], 500, "{details}");
    assert_eq!(details["reclaimed"], 500, "{details}");
    assert_eq!(details["unreclaimed"], 0, "{details}");
    println!("loadgen expiry: {details}");

    // expiry in sessions: 2,000 leases in 2 sessions whose records all expire together; the
    // nodes' own counter must show every bound lease ended, and a sample must be free after.
    let mut session_expiry = expiry.clone();
    session_expiry.leases = 2000;
    session_expiry.sessions = 2;
    session_expiry.workers = 32;
    session_expiry.run_tag = rand_tag();
    session_expiry.node_metrics_urls = cluster
        .ids()
        .into_iter()
        .map(|id| cluster.http_url(id))
        .collect();
    let (_, json) = run_checked(
        "loadgen expiry sessions",
        &native,
        &session_expiry,
        &["ALREADY_HELD"],
    )
    .await;
    let details = &json["details"];
    assert_eq!(details["held"], 2000, "{details}");
    assert_eq!(details["records_refused"], 0, "{details}");
    assert!(details["ended"].as_u64().unwrap() >= 2000, "{details}");
    assert!(
        details["all_ended_after_earliest_end_ms"]
            .as_f64()
            .is_some(),
        "{details}"
    );
    assert!(
        details["free_after_sampled"].as_u64().unwrap() > 0,
        "{details}"
    );
    assert_eq!(details["not_free_after_sampled"], 0, "{details}");
    println!("loadgen expiry sessions: {details}");

    // handoff: chains of hand-offs through 1 and 10 queued waiters (at least 200 each, or the
    // 20 s bound); every waiter is answered with its grant, and the requests per hand-off stay
    // O(1): at most the acquire, the wait and the releases of a round, never a poll per waiter.
    let mut handoff = config(ScenarioKind::Handoff, 1, KeyDistribution::Uniform);
    handoff.duration = Duration::from_secs(20);
    handoff.waiters = vec![1, 10];
    handoff.node_metrics_urls = session_expiry.node_metrics_urls.clone();
    handoff.run_tag = rand_tag();
    let (_, json) = run_checked("loadgen handoff", &native, &handoff, &[]).await;
    let rows = json["details"]["hand_offs"].as_array().unwrap().clone();
    assert_eq!(rows.len(), 2, "{json}");
    for row in &rows {
        assert!(row["hand_offs"].as_u64().unwrap() > 0, "{row}");
        let per = row["client_requests_per_hand_off"].as_f64().unwrap();
        assert!(per <= 4.5, "requests per hand-off grew: {row}");
    }
    println!("loadgen handoff: {}", json["details"]);

    native.close().await;
}
