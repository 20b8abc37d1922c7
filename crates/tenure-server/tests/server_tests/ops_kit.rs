//! The operations kit (`ops/`) against a running cluster: every `tenure_*` metric the Prometheus
//! rules and the Grafana dashboard reference is exported by the nodes' `/metrics`, and every
//! metric the server declares is exported. (The rules' syntax and their unit tests are checked
//! by `promtool` in the test command.)
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    missing_docs
)]

use crate::common;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use common::{ClusterOptions, ProcessCluster, TENANT, http_request, wait_for};
use tenure_client::{Client, ClientConfig, Credentials, Endpoint, ResourceKey};

fn ops_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../ops")
}

/// Every `tenure_...` identifier in `text`, except recording-rule names (followed by `:`).
fn referenced_metrics(text: &str) -> BTreeSet<String> {
    let bytes = text.as_bytes();
    let mut names = BTreeSet::new();
    let mut i = 0;
    while let Some(offset) = text[i..].find("tenure_") {
        let start = i + offset;
        let boundary = start == 0 || {
            let before = bytes[start - 1];
            !(before.is_ascii_alphanumeric() || before == b'_' || before == b':')
        };
        let mut end = start;
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
            end += 1;
        }
        let recording_rule = end < bytes.len() && bytes[end] == b':';
        // A prefix in prose ("tenure_*") names no metric.
        let prefix_only = text[start..end].ends_with('_');
        if boundary && !recording_rule && !prefix_only {
            names.insert(text[start..end].to_string());
        }
        i = end.max(start + 1);
    }
    names
}

/// Metric families and sample names in a Prometheus text exposition.
fn exported(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            if let Some(name) = rest.split_whitespace().next() {
                names.insert(name.to_string());
            }
        } else if !line.starts_with('#') {
            if let Some(name) = line.split(['{', ' ']).next() {
                if !name.is_empty() {
                    names.insert(name.to_string());
                }
            }
        }
    }
    names
}

/// The value of an unlabelled sample.
fn value(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kit_references_only_exported_metrics() {
    let cluster = ProcessCluster::start_ready(ClusterOptions::default()).await;
    let ids = cluster.ids();
    // Exercise every histogram: requests, proposals (ops per entry, commit time), renewals.
    let endpoints = ids
        .iter()
        .map(|&id| Endpoint {
            node_id: Some(id),
            addr: cluster.node(id).quic_addr,
        })
        .collect();
    let client = Client::connect(ClientConfig::new(
        endpoints,
        cluster.ca_pem().to_string(),
        Credentials::InsecureDev {
            principal_id: "ops-kit".to_string(),
        },
    ))
    .await
    .unwrap();
    let lease = client
        .acquire(TENANT, "ops/kit", "holder", Duration::from_secs(6))
        .await
        .unwrap();
    wait_for(Duration::from_secs(10), "a renewal", || async {
        (lease.renewals() >= 1).then_some(())
    })
    .await
    .unwrap();
    client
        .get(&ResourceKey::new(TENANT, "ops/kit"))
        .await
        .unwrap();
    lease.release().await.unwrap();
    client.close().await;

    let mut names = BTreeSet::new();
    let now_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    for &id in &ids {
        let url = format!("{}/metrics", cluster.http_url(id));
        // The gauges are refreshed once a second; wait for a refresh after the work above.
        let text = wait_for(Duration::from_secs(10), "the node's gauges", || async {
            let (status, _, body) = http_request("GET", &url, &[], None).await.ok()?;
            let text = String::from_utf8_lossy(&body).into_owned();
            (status == 200 && value(&text, "tenure_fsync_seconds_total")? > 0.0).then_some(text)
        })
        .await
        .unwrap();
        // The operational gauges carry real values.
        assert_eq!(
            value(&text, "tenure_node_ready"),
            Some(1.0),
            "node {id} ready"
        );
        assert_eq!(value(&text, "tenure_groups_without_leader"), Some(0.0));
        let expiry = value(&text, "tenure_certificate_expiry_timestamp_seconds").unwrap();
        assert!(
            expiry > now_s,
            "the certificate expires in the future ({expiry})"
        );
        let total = value(&text, "tenure_data_dir_total_bytes").unwrap();
        let available = value(&text, "tenure_data_dir_available_bytes").unwrap();
        assert!(total > 0.0 && available <= total, "{available} of {total}");
        assert!(value(&text, "tenure_leader_changes_total").unwrap() >= 0.0);
        names.extend(exported(&text));
    }
    // Every metric the server declares is exported.
    let declared: Vec<&str> = tenure_server::metrics::COUNTERS
        .iter()
        .chain(tenure_server::metrics::GAUGES)
        .chain(tenure_server::metrics::HISTOGRAMS)
        .copied()
        .collect();
    let missing: Vec<&&str> = declared
        .iter()
        .filter(|name| !names.contains(**name))
        .collect();
    assert!(missing.is_empty(), "declared but not exported: {missing:?}");
    // Every metric the kit references is exported.
    let mut checked = 0;
    for file in [
        "prometheus/tenure-alerts.yml",
        "prometheus/tenure-alerts.test.yml",
        "grafana/tenure-dashboard.json",
    ] {
        let path = ops_dir().join(file);
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|error| panic!("reading {}: {error}", path.display()));
        let referenced = referenced_metrics(&text);
        assert!(!referenced.is_empty(), "{file} references no tenure metric");
        let unknown: Vec<&String> = referenced.iter().filter(|n| !names.contains(*n)).collect();
        assert!(
            unknown.is_empty(),
            "{file} references metrics the nodes do not export: {unknown:?}"
        );
        checked += referenced.len();
    }
    println!(
        "ops kit: {checked} metric references in the rules, their tests and the dashboard; all {} exported (the nodes export {} names)",
        declared.len(),
        names.len()
    );
}

#[test]
fn reference_scanning_finds_names_and_skips_recording_rules() {
    let found = referenced_metrics(
        "rate(tenure_requests_total{result=\"OVERLOADED\"}[5m]) + tenure:requests:rate5m \
         + tenure_op:x + (every tenure_* series) + histogram_quantile(0.99, tenure_request_duration_seconds_bucket)",
    );
    let expected: BTreeSet<String> = [
        "tenure_requests_total",
        "tenure_request_duration_seconds_bucket",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(found, expected);
}

#[test]
fn the_example_configurations_are_valid() {
    for name in ["dev-laptop.toml", "three-node.toml", "five-node.toml"] {
        let path = ops_dir().join("config").join(name);
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_tenure"))
            .arg("config-check")
            .arg("--config")
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{name}: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

#[test]
fn every_alert_and_every_error_code_has_a_runbook() {
    let rules = std::fs::read_to_string(ops_dir().join("prometheus/tenure-alerts.yml")).unwrap();
    let mut alerts = BTreeSet::new();
    for line in rules.lines() {
        if let Some(name) = line.trim().strip_prefix("- alert:") {
            alerts.insert(name.trim().to_string());
        }
        if let Some(url) = line.trim().strip_prefix("runbook_url:") {
            let url = url.trim().trim_matches(['"', '\'']);
            let file = url.strip_prefix("ops/").unwrap_or(url);
            assert!(
                ops_dir().join(file).is_file(),
                "runbook_url {url} names no file"
            );
        }
    }
    assert!(alerts.len() >= 8, "alerts found: {alerts:?}");
    for alert in &alerts {
        let page = ops_dir().join(format!("runbooks/{alert}.md"));
        assert!(page.is_file(), "no runbook for alert {alert}");
    }
    for code in tenure_core::ErrorCode::ALL {
        let page = ops_dir().join(format!("runbooks/errors/{}.md", code.as_str()));
        assert!(page.is_file(), "no runbook for error code {code}");
    }
}
