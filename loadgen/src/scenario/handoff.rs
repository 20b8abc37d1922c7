//! `handoff` (tenure only): how long a hand-off takes from a release to the next waiter's
//! grant being answered, with 1, 10 and 1,000 waiters (`--waiters`), and how many requests a
//! hand-off costs (no herd: they must not grow with the number of waiters).
//!
//! For each waiter count N, rounds of: a holder acquires a fresh resource; N waiters, each a
//! `Client::acquire_wait` of its own, queue on it (the run waits until the nodes' gauge
//! `tenure_waits_parked` shows every one parked); then a chain of N hand-offs: the current
//! holder's lease is released, the next waiter's call returns with the grant (the latency is
//! from the release's send to that answer), and its lease is released in turn. Rounds repeat
//! until at least [`HAND_OFFS_MIN`] hand-offs were measured for that N (or the run's duration
//! is up). Requests per hand-off: the client's own request count, and the nodes' request
//! counters, over the chains (the acquires and the waits' first sends included, so a waiter
//! costs its enqueue once, amortised over its hand-off).
//!
//! Must not depend on: any server crate; the nodes are seen through the client library and
//! their metrics endpoints only.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use tenure_client::{AcquireOptions, ResourceKey, WaitOptions};

use super::{LoadConfig, Recorder, RunOutcome, ScenarioError};
use crate::node_metrics::NodeMetrics;
use crate::stats::{OpKind, Percentiles, new_histogram};

/// Hand-offs measured per waiter count, at least.
pub const HAND_OFFS_MIN: u64 = 200;
/// The nodes' gauge of parked waits.
const WAITS_PARKED: &str = "tenure_waits_parked";
/// The nodes' request counter.
const REQUESTS_TOTAL: &str = "tenure_requests_total";
/// Longest a waiter may wait (every chain ends long before).
const WAIT_MAX: Duration = Duration::from_secs(600);
/// Bound on one hand-off (release to answer), and on queueing a round's waiters.
const STEP_TIMEOUT: Duration = Duration::from_secs(30);
/// How often the gauge is read while the waiters queue.
const POLL_EVERY: Duration = Duration::from_millis(20);

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

fn config_error(what: &str, error: impl std::fmt::Display) -> ScenarioError {
    ScenarioError::Config(format!("{what}: {error}"))
}

pub(super) async fn run_handoff(
    target: Arc<super::Target>,
    config: &LoadConfig,
) -> Result<RunOutcome, ScenarioError> {
    let (Some(client), Some(tenant)) = (target.tenure_client(), target.tenure_tenant()) else {
        return Err(ScenarioError::Config(
            "handoff needs the tenure target (the native client library)".into(),
        ));
    };
    if config.node_metrics_urls.is_empty() {
        return Err(ScenarioError::Config(
            "handoff reads the nodes' gauge of parked waits: give --cluster".into(),
        ));
    }
    if config.waiters.is_empty() || config.waiters.iter().any(|&n| n == 0 || n > 4_096) {
        return Err(ScenarioError::Config(
            "--waiters: each count within 1..=4096 (a resource's queue bound)".into(),
        ));
    }
    let metrics = NodeMetrics::new(&config.node_metrics_urls);
    let tag = config.run_tag;
    let started = Instant::now();
    let deadline = started + config.duration;
    let recorder = Recorder::new();
    let mut all = new_histogram();
    let mut rows = Vec::new();
    let mut total_hand_offs = 0u64;
    for &waiters in &config.waiters {
        let mut histogram = new_histogram();
        let client_before = client.stats().requests_sent;
        let nodes_before = metrics
            .counter_sum(REQUESTS_TOTAL)
            .await
            .map_err(|e| config_error("reading the nodes' metrics", e))?;
        let mut hand_offs = 0u64;
        let mut rounds = 0u64;
        while hand_offs < HAND_OFFS_MIN && Instant::now() < deadline {
            let resource = format!("ho{tag:08x}-{waiters}-{rounds}");
            let measured = chain(client, tenant, &resource, waiters, config, &metrics).await?;
            for latency in measured {
                let us = micros(latency).max(1);
                let _ = histogram.record(us);
                let _ = all.record(us);
                recorder.record(0, OpKind::Acquire, latency, Ok(()));
                hand_offs += 1;
            }
            rounds += 1;
        }
        let client_requests = client.stats().requests_sent - client_before;
        let nodes_requests = metrics
            .counter_sum(REQUESTS_TOTAL)
            .await
            .map_err(|e| config_error("reading the nodes' metrics", e))?
            - nodes_before;
        let per = |count: f64| count / (hand_offs.max(1) as f64);
        let latency = Percentiles::of(&histogram);
        if config.progress {
            eprintln!(
                "handoff: {waiters} waiter(s): {hand_offs} hand-offs in {rounds} round(s), \
                 p50 {} us, p99 {} us; requests per hand-off: client {:.2}, nodes {:.2}",
                latency.p50,
                latency.p99,
                per(client_requests as f64),
                per(nodes_requests),
            );
        }
        rows.push(json!({
            "waiters": waiters,
            "rounds": rounds,
            "hand_offs": hand_offs,
            "p50_us": latency.p50,
            "p99_us": latency.p99,
            "max_us": latency.max,
            "client_requests_per_hand_off": per(client_requests as f64),
            "node_requests_per_hand_off": per(nodes_requests),
        }));
        total_hand_offs += hand_offs;
    }
    let measured_s = started.elapsed().as_secs_f64();
    let details = json!({
        "hand_offs": rows,
        "note": "latency: release sent -> the next waiter's call answered with the grant; \
                 requests: every request of the chains (acquire, the waits' sends, releases), \
                 per hand-off",
    });
    let mut outcome = RunOutcome::of_operations(&recorder, measured_s, Vec::new(), details);
    outcome.ops_total = total_hand_offs;
    outcome.latency_us = Percentiles::of(&all);
    Ok(outcome)
}

/// One round: a holder, `waiters` queued waiters, the chain of hand-offs. The latency of each.
async fn chain(
    client: &tenure_client::Client,
    tenant: &str,
    resource: &str,
    waiters: u64,
    config: &LoadConfig,
    metrics: &NodeMetrics,
) -> Result<Vec<Duration>, ScenarioError> {
    let key = ResourceKey::new(tenant, resource);
    let first = client
        .acquire_grant(
            AcquireOptions::new(tenant, resource, "holder", config.ttl).without_auto_renew(),
        )
        .await
        .map_err(|e| config_error("the round's first acquire", e))?;
    let parked_before = metrics
        .gauge_sum(WAITS_PARKED)
        .await
        .map_err(|e| config_error("reading the nodes' metrics", e))?;
    let (answers_tx, mut answers) = tokio::sync::mpsc::unbounded_channel();
    for index in 0..waiters {
        let client = client.clone();
        let answers_tx = answers_tx.clone();
        let mut options = WaitOptions::new(
            tenant,
            resource,
            format!("waiter-{index}"),
            config.ttl,
            WAIT_MAX,
        );
        options.renew_after_park = false;
        tokio::spawn(async move {
            let answer = client.acquire_wait(options).await;
            let _ = answers_tx.send((answer, Instant::now()));
        });
    }
    drop(answers_tx);
    let queued_by = Instant::now() + STEP_TIMEOUT;
    loop {
        let parked = metrics
            .gauge_sum(WAITS_PARKED)
            .await
            .map_err(|e| config_error("reading the nodes' metrics", e))?;
        if parked - parked_before >= waiters as f64 {
            break;
        }
        if Instant::now() >= queued_by {
            return Err(ScenarioError::Config(format!(
                "only {} of {waiters} waiters parked within {STEP_TIMEOUT:?}",
                parked - parked_before
            )));
        }
        tokio::time::sleep(POLL_EVERY).await;
    }
    let mut latencies = Vec::with_capacity(usize::try_from(waiters).unwrap_or(0));
    let mut current = (first.holder_id.clone(), first.lease_id);
    for _ in 0..waiters {
        let released_at = Instant::now();
        client
            .release(key.clone(), current.1, current.0.clone(), None)
            .await
            .map_err(|e| config_error("a release", e))?;
        let Ok(Some((answer, answered_at))) =
            tokio::time::timeout(STEP_TIMEOUT, answers.recv()).await
        else {
            return Err(ScenarioError::Config(format!(
                "no waiter was answered within {STEP_TIMEOUT:?} of a release"
            )));
        };
        let grant = answer.map_err(|e| config_error("a waiter", e))?;
        latencies.push(answered_at.saturating_duration_since(released_at));
        current = (grant.holder_id.clone(), grant.lease_id);
    }
    client
        .release(key, current.1, current.0, None)
        .await
        .map_err(|e| config_error("the last release", e))?;
    Ok(latencies)
}
