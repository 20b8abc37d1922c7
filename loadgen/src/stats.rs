//! Latency and outcome recording: per-operation hdrhistograms (microseconds), error counts by
//! code, and a per-interval sample for the progress line and the timeline plot.
//!
//! Workers record into one of [`SHARDS`] mutex-guarded shards (worker index modulo the shard
//! count), so recording is an uncontended lock in practice and memory stays bounded whatever
//! the worker count. Every answered operation is recorded with its latency, refusals included
//! (an `ALREADY_HELD` is a complete answer); its code goes to the error counts. Must not depend
//! on any target or on the clock: callers pass latencies in.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Number of recording shards.
pub const SHARDS: usize = 16;
/// Largest latency a histogram holds exactly (larger values are clamped to it): 120 s.
pub const LATENCY_US_MAX: u64 = 120_000_000;
const SIGNIFICANT_DIGITS: u8 = 3;

/// The lease operations a workload issues.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OpKind {
    /// Take a lease on a resource.
    Acquire,
    /// Extend a held lease.
    Renew,
    /// Give a lease back.
    Release,
    /// Read a resource's lease.
    Get,
}

/// Every operation kind, in report order.
pub const OP_KINDS: [OpKind; 4] = [OpKind::Acquire, OpKind::Renew, OpKind::Release, OpKind::Get];

impl OpKind {
    /// Lower-case name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Acquire => "acquire",
            OpKind::Renew => "renew",
            OpKind::Release => "release",
            OpKind::Get => "get",
        }
    }

    fn index(self) -> usize {
        match self {
            OpKind::Acquire => 0,
            OpKind::Renew => 1,
            OpKind::Release => 2,
            OpKind::Get => 3,
        }
    }
}

/// An empty latency histogram: 1 µs to [`LATENCY_US_MAX`], 3 significant digits.
pub fn new_histogram() -> Histogram<u64> {
    // The bounds are constants within hdrhistogram's limits; creation cannot fail.
    #[allow(clippy::expect_used)]
    Histogram::new_with_bounds(1, LATENCY_US_MAX, SIGNIFICANT_DIGITS)
        .expect("constant histogram bounds are valid")
}

struct OpCounters {
    total: Histogram<u64>,
    interval: Histogram<u64>,
    ok: u64,
    errors: BTreeMap<String, u64>,
    interval_errors: BTreeMap<String, u64>,
}

impl OpCounters {
    fn new() -> Self {
        OpCounters {
            total: new_histogram(),
            interval: new_histogram(),
            ok: 0,
            errors: BTreeMap::new(),
            interval_errors: BTreeMap::new(),
        }
    }
}

struct Shard {
    ops: [OpCounters; 4],
}

impl Shard {
    fn new() -> Self {
        Shard {
            ops: [
                OpCounters::new(),
                OpCounters::new(),
                OpCounters::new(),
                OpCounters::new(),
            ],
        }
    }
}

/// Latency percentiles in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Percentiles {
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// Largest recorded.
    pub max: u64,
    /// Mean.
    pub mean: f64,
}

impl Percentiles {
    /// The percentiles of `histogram` (all zero when it is empty).
    pub fn of(histogram: &Histogram<u64>) -> Self {
        if histogram.is_empty() {
            return Percentiles::default();
        }
        Percentiles {
            p50: histogram.value_at_quantile(0.50),
            p90: histogram.value_at_quantile(0.90),
            p99: histogram.value_at_quantile(0.99),
            p999: histogram.value_at_quantile(0.999),
            max: histogram.max(),
            mean: histogram.mean(),
        }
    }
}

/// Totals of one operation kind over the measured window.
#[derive(Debug, Clone, Serialize)]
pub struct OpSummary {
    /// Answered operations (successes and refusals).
    pub count: u64,
    /// Successes.
    pub ok: u64,
    /// Refusals and failures by code.
    pub errors: BTreeMap<String, u64>,
    /// Latency of every answered operation.
    pub latency_us: Percentiles,
    /// The latency curve: `(percentile, latency_us)` points for the plot.
    #[serde(skip)]
    pub curve: Vec<(f64, u64)>,
}

/// One interval of the timeline.
#[derive(Debug, Clone, Serialize)]
pub struct IntervalSample {
    /// Seconds since the measured window began, at the interval's end.
    pub t_s: f64,
    /// Operations answered in the interval.
    pub ops: u64,
    /// Operations per second in the interval.
    pub ops_per_s: f64,
    /// Refusals and failures by code in the interval.
    pub errors: BTreeMap<String, u64>,
    /// Median latency of the interval's operations (µs).
    pub p50_us: u64,
    /// 99th percentile latency of the interval's operations (µs).
    pub p99_us: u64,
    /// Largest latency of the interval (µs).
    pub max_us: u64,
    /// The interval's latencies in logarithmic buckets: `[upper_bound_us, count]` for every
    /// non-empty bucket, bounds growing by [`LOG_BUCKET_RATIO`] from 1 µs. Summing the counts
    /// of several intervals gives a window's percentiles (to within one bucket, 5%), which the
    /// per-interval percentiles cannot.
    pub latency_us_buckets: Vec<[u64; 2]>,
}

/// The ratio between consecutive bounds of [`IntervalSample::latency_us_buckets`].
pub const LOG_BUCKET_RATIO: f64 = 1.05;

/// Non-empty logarithmic buckets of `histogram` (see [`IntervalSample::latency_us_buckets`]).
fn log_buckets(histogram: &Histogram<u64>) -> Vec<[u64; 2]> {
    if histogram.is_empty() {
        return Vec::new();
    }
    histogram
        .iter_log(1, LOG_BUCKET_RATIO)
        .filter(|bucket| bucket.count_since_last_iteration() > 0)
        .map(|bucket| {
            [
                bucket.value_iterated_to(),
                bucket.count_since_last_iteration(),
            ]
        })
        .collect()
}

/// The shared recorder of one run.
pub struct Recorder {
    shards: Vec<Mutex<Shard>>,
}

impl Default for Recorder {
    fn default() -> Self {
        Self::new()
    }
}

fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    // A worker that panicked mid-record leaves consistent counters; keep going.
    shard.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Adds one to `code`'s count, allocating its key only the first time.
fn count_code(counts: &mut BTreeMap<String, u64>, code: &str) {
    if let Some(count) = counts.get_mut(code) {
        *count += 1;
    } else {
        counts.insert(code.to_owned(), 1);
    }
}

/// Microseconds of a latency, clamped to the histogram's range.
pub fn latency_us(latency: Duration) -> u64 {
    u64::try_from(latency.as_micros())
        .unwrap_or(u64::MAX)
        .clamp(1, LATENCY_US_MAX)
}

impl Recorder {
    /// An empty recorder.
    pub fn new() -> Self {
        Recorder {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::new())).collect(),
        }
    }

    /// Records one answered operation of `worker`: `Ok(())` or the code of its refusal.
    pub fn record(&self, worker: usize, op: OpKind, latency: Duration, outcome: Result<(), &str>) {
        let value = latency_us(latency);
        let mut shard = lock(&self.shards[worker % SHARDS]);
        let counters = &mut shard.ops[op.index()];
        counters.total.saturating_record(value);
        counters.interval.saturating_record(value);
        match outcome {
            Ok(()) => counters.ok += 1,
            Err(code) => {
                count_code(&mut counters.errors, code);
                count_code(&mut counters.interval_errors, code);
            }
        }
    }

    /// Forgets everything recorded so far (the end of a warm-up).
    pub fn reset(&self) {
        for shard in &self.shards {
            *lock(shard) = Shard::new();
        }
    }

    /// Takes the interval counters (all operations together) and starts a new interval.
    pub fn take_interval(&self, t_s: f64, interval_s: f64) -> IntervalSample {
        let mut merged = new_histogram();
        let mut errors = BTreeMap::new();
        for shard in &self.shards {
            let mut shard = lock(shard);
            for counters in &mut shard.ops {
                // Same bounds on both sides: adding cannot fail.
                let _ = merged.add(&counters.interval);
                counters.interval.reset();
                for (code, count) in std::mem::take(&mut counters.interval_errors) {
                    *errors.entry(code).or_insert(0) += count;
                }
            }
        }
        let ops = merged.len();
        #[allow(clippy::cast_precision_loss)]
        let ops_per_s = if interval_s > 0.0 {
            ops as f64 / interval_s
        } else {
            0.0
        };
        let percentiles = Percentiles::of(&merged);
        IntervalSample {
            t_s,
            ops,
            ops_per_s,
            errors,
            p50_us: percentiles.p50,
            p99_us: percentiles.p99,
            max_us: percentiles.max,
            latency_us_buckets: log_buckets(&merged),
        }
    }

    /// Latency percentiles of every operation kind together.
    pub fn overall(&self) -> Percentiles {
        let mut merged = new_histogram();
        for shard in &self.shards {
            let shard = lock(shard);
            for counters in &shard.ops {
                let _ = merged.add(&counters.total);
            }
        }
        Percentiles::of(&merged)
    }

    /// Totals per operation kind that had any operation, in [`OP_KINDS`] order.
    pub fn summary(&self) -> Vec<(OpKind, OpSummary)> {
        let mut out = Vec::new();
        for op in OP_KINDS {
            let mut merged = new_histogram();
            let mut ok = 0;
            let mut errors = BTreeMap::new();
            for shard in &self.shards {
                let shard = lock(shard);
                let counters = &shard.ops[op.index()];
                let _ = merged.add(&counters.total);
                ok += counters.ok;
                for (code, count) in &counters.errors {
                    *errors.entry(code.clone()).or_insert(0) += count;
                }
            }
            if merged.is_empty() {
                continue;
            }
            let curve = latency_curve(&merged);
            out.push((
                op,
                OpSummary {
                    count: merged.len(),
                    ok,
                    errors,
                    latency_us: Percentiles::of(&merged),
                    curve,
                },
            ));
        }
        out
    }
}

/// Points of the latency percentile curve, denser toward the tail (90, 99, 99.9, ... %).
fn latency_curve(histogram: &Histogram<u64>) -> Vec<(f64, u64)> {
    let mut points = Vec::new();
    // Percentiles 1 - 10^(-x) for x in 0..5 by steps of 0.05, then the maximum.
    for step in 0..=100u32 {
        let nines = f64::from(step) * 0.05;
        let quantile = 1.0 - 10f64.powf(-nines);
        points.push((quantile * 100.0, histogram.value_at_quantile(quantile)));
    }
    points.push((100.0, histogram.max()));
    points
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_merge_across_shards_and_intervals_reset() {
        let recorder = Recorder::new();
        for worker in 0..100 {
            recorder.record(worker, OpKind::Acquire, Duration::from_micros(1000), Ok(()));
        }
        recorder.record(
            3,
            OpKind::Acquire,
            Duration::from_millis(50),
            Err("ALREADY_HELD"),
        );
        recorder.record(4, OpKind::Renew, Duration::from_micros(10), Ok(()));
        let interval = recorder.take_interval(1.0, 1.0);
        assert_eq!(interval.ops, 102);
        assert_eq!(interval.errors.get("ALREADY_HELD"), Some(&1));
        assert!(interval.max_us >= 49_000);
        assert_eq!(recorder.take_interval(2.0, 1.0).ops, 0);

        let summary = recorder.summary();
        assert_eq!(summary.len(), 2);
        let (op, acquire) = &summary[0];
        assert_eq!(*op, OpKind::Acquire);
        assert_eq!(acquire.count, 101);
        assert_eq!(acquire.ok, 100);
        assert_eq!(acquire.errors.get("ALREADY_HELD"), Some(&1));
        assert!((990..=1010).contains(&acquire.latency_us.p50));
        assert!(acquire.latency_us.max >= 49_000);
        assert!(acquire.curve.windows(2).all(|pair| pair[0].1 <= pair[1].1));

        recorder.reset();
        assert!(recorder.summary().is_empty());
    }

    #[test]
    fn interval_buckets_sum_to_its_operations_and_bound_them_within_a_bucket() {
        let recorder = Recorder::new();
        let latencies_us = [10u64, 10, 950, 1_000, 1_050, 48_000, 50_000];
        for (worker, &latency) in latencies_us.iter().enumerate() {
            recorder.record(
                worker,
                OpKind::Acquire,
                Duration::from_micros(latency),
                Ok(()),
            );
        }
        let interval = recorder.take_interval(1.0, 1.0);
        let buckets = &interval.latency_us_buckets;
        let counted: u64 = buckets.iter().map(|[_, count]| count).sum();
        assert_eq!(counted, interval.ops);
        assert!(buckets.windows(2).all(|pair| pair[0][0] < pair[1][0]));
        // Each latency falls in a bucket whose upper bound is at most one ratio above it.
        for latency in latencies_us {
            let bound = buckets
                .iter()
                .map(|[bound, _]| *bound)
                .find(|bound| *bound >= latency)
                .unwrap();
            #[allow(clippy::cast_precision_loss)]
            let ratio = bound as f64 / latency as f64;
            assert!(ratio <= LOG_BUCKET_RATIO + 0.01, "{latency} -> {bound}");
        }
        // An empty interval has no buckets.
        assert!(
            recorder
                .take_interval(2.0, 1.0)
                .latency_us_buckets
                .is_empty()
        );
    }

    #[test]
    fn latencies_are_clamped_into_range() {
        assert_eq!(latency_us(Duration::ZERO), 1);
        assert_eq!(latency_us(Duration::from_secs(1_000_000)), LATENCY_US_MAX);
    }
}
