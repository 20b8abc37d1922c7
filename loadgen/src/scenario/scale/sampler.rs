//! The nodes' own figures during a scale run, read from their `/metrics` once a second: each
//! node's resident memory (the gauge `tenure_process_resident_memory_bytes`, or `VmRSS` of
//! `/proc/<pid>/status` with the pid from the [`NodeControl`] when the node does not export it),
//! its state record counts, and its snapshot figures, whose counters are summed over the run
//! across node restarts (a counter that went down restarted from zero).
//!
//! Must not depend on: any server crate; the nodes are read like any scraper reads them.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::ScaleNode;
use crate::node_control::{NodeControl, rss_of_pid};
use crate::node_metrics::{Exposition, NodeMetrics};

/// The node process's resident memory.
pub(super) const RSS_BYTES: &str = "tenure_process_resident_memory_bytes";
/// Lease records in every group the node hosts.
pub(super) const LEASE_RECORDS: &str = "tenure_state_lease_records";
/// Request-id records in every group the node hosts.
pub(super) const DEDUP_RECORDS: &str = "tenure_state_dedup_records";
/// Active leases of the groups the node leads (summed over the nodes: the cluster's).
pub(super) const ACTIVE_LEASES: &str = "tenure_active_leases";
/// Entries committed and not yet applied, over the node's groups.
pub(super) const APPLY_LAG: &str = "tenure_apply_lag_entries";
/// 1 when the node is ready.
pub(super) const NODE_READY: &str = "tenure_node_ready";
/// Bound leases ended with their session (counted by the proposing leader).
pub(super) const SESSION_LEASES_ENDED: &str = "tenure_session_leases_ended_total";

/// Snapshot counters summed over the run.
const SNAPSHOT_COUNTERS: [&str; 6] = [
    "tenure_snapshot_builds_total",
    "tenure_snapshot_build_seconds_total",
    "tenure_snapshot_apply_pauses_over_10ms_total",
    "tenure_snapshot_shared_applies_over_10ms_total",
    "tenure_snapshot_apply_pauses_less_core_wait_over_10ms_total",
    "tenure_snapshot_shared_applies_less_core_wait_over_10ms_total",
];
/// Snapshot gauges (maxima since each node's start) whose largest value is reported.
const SNAPSHOT_MAXIMA: [&str; 8] = [
    "tenure_snapshot_build_seconds_max",
    "tenure_snapshot_bytes_max",
    "tenure_snapshot_apply_pause_seconds_max",
    "tenure_snapshot_shared_apply_seconds_max",
    "tenure_snapshot_apply_pause_cpu_seconds_max",
    "tenure_snapshot_shared_apply_cpu_seconds_max",
    "tenure_snapshot_apply_pause_less_core_wait_seconds_max",
    "tenure_snapshot_shared_apply_less_core_wait_seconds_max",
];
/// How long a pid list from the control is trusted.
const PIDS_FRESH: Duration = Duration::from_secs(5);
/// How often the sampler reads the nodes.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// One node at one moment.
#[derive(Debug, Clone)]
pub(super) struct NodeReading {
    /// Node id.
    pub id: u64,
    /// Resident memory, bytes.
    pub rss_bytes: Option<u64>,
    /// Where it came from: `metrics`, `proc` or `-`.
    pub rss_source: &'static str,
    /// The node's exposition, when it answered.
    pub exposition: Option<Exposition>,
}

impl NodeReading {
    /// Metric `name` of this node, when it answered and exports it.
    pub fn value(&self, name: &str) -> Option<f64> {
        self.exposition.as_ref()?.value(name)
    }

    /// As JSON, with the state figures.
    pub fn figures(&self) -> Value {
        json!({
            "node": self.id,
            "rss_bytes": self.rss_bytes,
            "rss_source": self.rss_source,
            "lease_records": self.value(LEASE_RECORDS),
            "dedup_records": self.value(DEDUP_RECORDS),
            "active_leases_led": self.value(ACTIVE_LEASES),
        })
    }
}

/// Reads every node's figures.
pub(super) struct NodeReader {
    nodes: Vec<ScaleNode>,
    metrics: NodeMetrics,
    control: Arc<dyn NodeControl>,
    pids: tokio::sync::Mutex<(Option<Instant>, BTreeMap<u64, u32>)>,
}

impl NodeReader {
    pub(super) fn new(nodes: &[ScaleNode], control: Arc<dyn NodeControl>) -> Self {
        let urls: Vec<String> = nodes.iter().map(|node| node.http_url.clone()).collect();
        NodeReader {
            nodes: nodes.to_vec(),
            metrics: NodeMetrics::new(&urls),
            control,
            pids: tokio::sync::Mutex::new((None, BTreeMap::new())),
        }
    }

    /// Every node's reading now (in the order of the nodes given).
    pub(super) async fn read(&self) -> Vec<NodeReading> {
        let answers = self.metrics.per_node().await;
        let mut readings = Vec::with_capacity(self.nodes.len());
        for (node, answer) in self.nodes.iter().zip(answers) {
            let exposition = answer.ok();
            let from_metrics = exposition
                .as_ref()
                .and_then(|text| text.value(RSS_BYTES))
                .filter(|bytes| bytes.is_finite() && *bytes > 0.0);
            let (rss_bytes, rss_source) = match from_metrics {
                // A byte count far below 2^53, exact in an f64.
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                Some(bytes) => (Some(bytes as u64), "metrics"),
                None => match self.pid(node.id).await.and_then(rss_of_pid) {
                    Some(bytes) => (Some(bytes), "proc"),
                    None => (None, "-"),
                },
            };
            readings.push(NodeReading {
                id: node.id,
                rss_bytes,
                rss_source,
                exposition,
            });
        }
        readings
    }

    /// Node `id`'s process id from the control (refreshed when older than [`PIDS_FRESH`]).
    async fn pid(&self, id: u64) -> Option<u32> {
        let mut cached = self.pids.lock().await;
        let stale = cached.0.is_none_or(|at| at.elapsed() >= PIDS_FRESH);
        if stale {
            if let Ok(pids) = self.control.pids().await {
                cached.1 = pids;
            }
            cached.0 = Some(Instant::now());
        }
        cached.1.get(&id).copied()
    }

    /// Forget the cached process ids (a node was restarted).
    pub(super) async fn forget_pids(&self) {
        self.pids.lock().await.0 = None;
    }

    /// The nodes' metrics endpoints (in node order).
    pub(super) fn metrics(&self) -> &NodeMetrics {
        &self.metrics
    }
}

/// What the sampler gathered over the run.
#[derive(Debug, Default)]
pub(super) struct Sampled {
    /// Per node: `(seconds since the run's start, resident bytes)`.
    pub rss: BTreeMap<u64, Vec<(f64, u64)>>,
    /// Per snapshot counter: its increase over the run, summed over the nodes (`None` when no
    /// node exports it).
    pub counters: BTreeMap<&'static str, Option<f64>>,
    /// Per snapshot gauge: its largest value seen on any node (`None` when absent).
    pub maxima: BTreeMap<&'static str, Option<f64>>,
    /// Readings that came back without an exposition.
    pub scrape_failures: u64,
}

#[derive(Default)]
struct Accumulated {
    sampled: Sampled,
    last: BTreeMap<(u64, &'static str), f64>,
}

impl Accumulated {
    fn add(&mut self, t_s: f64, readings: &[NodeReading]) {
        for reading in readings {
            if let Some(bytes) = reading.rss_bytes {
                self.sampled
                    .rss
                    .entry(reading.id)
                    .or_default()
                    .push((t_s, bytes));
            }
            if reading.exposition.is_none() {
                self.sampled.scrape_failures += 1;
                continue;
            }
            for name in SNAPSHOT_COUNTERS {
                let entry = self.sampled.counters.entry(name).or_insert(None);
                let Some(value) = reading.value(name) else {
                    continue;
                };
                let increase = match self.last.insert((reading.id, name), value) {
                    // The first reading is the baseline.
                    None => 0.0,
                    Some(last) if value >= last => value - last,
                    // The node restarted: its counter began again from zero.
                    Some(_) => value,
                };
                *entry = Some(entry.unwrap_or(0.0) + increase);
            }
            for name in SNAPSHOT_MAXIMA {
                let entry = self.sampled.maxima.entry(name).or_insert(None);
                if let Some(value) = reading.value(name) {
                    *entry = Some(entry.map_or(value, |max: f64| max.max(value)));
                }
            }
        }
    }
}

/// Reads every node once a second until stopped.
pub(super) struct Sampler {
    stop: Arc<tokio::sync::Notify>,
    task: tokio::task::JoinHandle<Sampled>,
}

impl Sampler {
    /// Starts sampling; times are counted from `run_start`.
    pub(super) fn start(reader: Arc<NodeReader>, run_start: Instant) -> Sampler {
        let stop = Arc::new(tokio::sync::Notify::new());
        let task = tokio::spawn({
            let stop = stop.clone();
            async move {
                let mut accumulated = Accumulated::default();
                let mut ticks = tokio::time::interval(SAMPLE_EVERY);
                ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    let stopping = tokio::select! {
                        _ = ticks.tick() => false,
                        () = stop.notified() => true,
                    };
                    let readings = reader.read().await;
                    accumulated.add(run_start.elapsed().as_secs_f64(), &readings);
                    if stopping {
                        return accumulated.sampled;
                    }
                }
            }
        });
        Sampler { stop, task }
    }

    /// Takes one last reading and returns everything gathered.
    pub(super) async fn finish(self) -> Sampled {
        self.stop.notify_one();
        self.task.await.unwrap_or_default()
    }
}

impl Sampled {
    /// The resident-memory series as JSON (`[{node, points: [[t_s, bytes], ...]}]`), the shape
    /// the plot reads.
    pub(super) fn rss_series(&self) -> Value {
        Value::Array(
            self.rss
                .iter()
                .map(|(node, points)| json!({ "node": node, "points": points }))
                .collect(),
        )
    }

    /// The snapshot figures as JSON.
    pub(super) fn snapshot_figures(&self) -> Value {
        let get = |map: &BTreeMap<&'static str, Option<f64>>, name: &str| {
            map.get(name).copied().flatten()
        };
        json!({
            "builds": get(&self.counters, "tenure_snapshot_builds_total"),
            "build_seconds_total": get(&self.counters, "tenure_snapshot_build_seconds_total"),
            "build_seconds_max": get(&self.maxima, "tenure_snapshot_build_seconds_max"),
            "bytes_max": get(&self.maxima, "tenure_snapshot_bytes_max"),
            "apply_pause_seconds_max": get(&self.maxima, "tenure_snapshot_apply_pause_seconds_max"),
            "apply_pauses_over_10ms": get(&self.counters, "tenure_snapshot_apply_pauses_over_10ms_total"),
            "shared_apply_seconds_max": get(&self.maxima, "tenure_snapshot_shared_apply_seconds_max"),
            "shared_applies_over_10ms": get(&self.counters, "tenure_snapshot_shared_applies_over_10ms_total"),
            "apply_pause_cpu_seconds_max": get(&self.maxima, "tenure_snapshot_apply_pause_cpu_seconds_max"),
            "shared_apply_cpu_seconds_max": get(&self.maxima, "tenure_snapshot_shared_apply_cpu_seconds_max"),
            "apply_pause_less_core_wait_seconds_max": get(&self.maxima, "tenure_snapshot_apply_pause_less_core_wait_seconds_max"),
            "apply_pauses_less_core_wait_over_10ms": get(&self.counters, "tenure_snapshot_apply_pauses_less_core_wait_over_10ms_total"),
            "shared_apply_less_core_wait_seconds_max": get(&self.maxima, "tenure_snapshot_shared_apply_less_core_wait_seconds_max"),
            "shared_applies_less_core_wait_over_10ms": get(&self.counters, "tenure_snapshot_shared_applies_less_core_wait_over_10ms_total"),
            "note": "counters: their increase over the run, summed over the nodes (a restart's \
                     reset counted from zero); maxima: the largest since-start value any node \
                     showed during the run; null: no node exports the metric",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(id: u64, text: &str) -> NodeReading {
        NodeReading {
            id,
            rss_bytes: Some(100 * id),
            rss_source: "proc",
            exposition: Some(Exposition::new(text.to_owned())),
        }
    }

    #[test]
    fn counters_sum_increases_across_restarts_and_maxima_keep_the_largest() {
        let mut accumulated = Accumulated::default();
        accumulated.add(
            0.0,
            &[
                reading(
                    1,
                    "tenure_snapshot_builds_total 5\ntenure_snapshot_bytes_max 10\n",
                ),
                reading(2, "tenure_snapshot_builds_total 1\n"),
            ],
        );
        accumulated.add(
            1.0,
            &[
                reading(
                    1,
                    "tenure_snapshot_builds_total 7\ntenure_snapshot_bytes_max 30\n",
                ),
                reading(2, "tenure_snapshot_builds_total 4\n"),
            ],
        );
        // Node 1 restarted: 2 builds since.
        accumulated.add(
            2.0,
            &[
                reading(
                    1,
                    "tenure_snapshot_builds_total 2\ntenure_snapshot_bytes_max 5\n",
                ),
                reading(2, "tenure_snapshot_builds_total 4\n"),
            ],
        );
        let sampled = accumulated.sampled;
        assert_eq!(sampled.counters["tenure_snapshot_builds_total"], Some(7.0));
        assert_eq!(sampled.maxima["tenure_snapshot_bytes_max"], Some(30.0));
        assert_eq!(
            sampled.counters["tenure_snapshot_apply_pauses_over_10ms_total"],
            None
        );
        assert_eq!(sampled.rss[&2], vec![(0.0, 200), (1.0, 200), (2.0, 200)]);
        let figures = sampled.snapshot_figures();
        assert_eq!(figures["builds"], 7.0);
        assert!(figures["apply_pause_seconds_max"].is_null());
    }
}
