//! `transport_cluster`: idle cost and replicated throughput of 3 in-process nodes over real QUIC
//! on loopback, with RocksDB storage and fsync on (`tenure_transport::testing::LocalCluster`).
//!
//! 1. Starts 3 nodes hosting `--groups` groups (default 256) each, waits until every group has a
//!    leader, then lets the cluster settle for `--settle-s` seconds (default 3).
//! 2. **Idle** (`--idle-s`, default 10; 0 skips): no writes. Measures the process's CPU time
//!    (user + system, from /proc/self/stat) over the window and reports it as cores and as % of
//!    one core per node (the 3 nodes share the process, so per node = total / 3), with the
//!    transport's frames, messages and heartbeats in the window.
//! 3. **Load** (`--load-s`, default 10; 0 skips): `--writers` concurrent writers per group (default
//!    4) each propose one entry after another through the group's leader (`Raft::client_write`),
//!    every entry a `Command::Batch` of `--ops-per-entry` Acquires (default 1, a one-op entry).
//!    An entry counts once committed and applied (client_write returned). Reports committed
//!    entries/s and lease operations/s, write latency percentiles, and the batching factor: Raft
//!    messages per QUIC frame (all nodes, load window only).
//!
//! Usage: `transport_cluster [--groups G] [--settle-s S] [--idle-s S] [--load-s S] [--writers W]
//! [--ops-per-entry K] [--linger-us U] [--heartbeat-ms H] [--heartbeat-min-ms M] [--tick-ms T]`.

#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use hdrhistogram::Histogram;
use tenure_core::{AcquireRequest, Command, LeaseOp, ResourceKey};
use tenure_transport::GroupTiming;
use tenure_transport::TransportStatsSnapshot;
use tenure_transport::testing::{ClusterOptions, LocalCluster};

struct Args {
    groups: u32,
    settle_s: u64,
    idle_s: u64,
    load_s: u64,
    writers: u32,
    ops_per_entry: u32,
    linger_us: u64,
    heartbeat_ms: u64,
    tick_ms: u64,
    heartbeat_min_ms: u64,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        groups: 256,
        settle_s: 3,
        idle_s: 10,
        load_s: 10,
        writers: 4,
        ops_per_entry: 1,
        linger_us: 100,
        heartbeat_ms: GroupTiming::default().heartbeat_interval_ms,
        tick_ms: GroupTiming::default().tick_interval_ms,
        heartbeat_min_ms: GroupTiming::default().heartbeat_min_interval_ms,
    };
    let mut iter = std::env::args().skip(1);
    while let Some(flag) = iter.next() {
        let mut value = || -> Result<u64> {
            iter.next()
                .with_context(|| format!("{flag} needs a value"))?
                .parse::<u64>()
                .with_context(|| format!("{flag} needs a number"))
        };
        match flag.as_str() {
            "--groups" => args.groups = u32::try_from(value()?)?,
            "--settle-s" => args.settle_s = value()?,
            "--idle-s" => args.idle_s = value()?,
            "--load-s" => args.load_s = value()?,
            "--writers" => args.writers = u32::try_from(value()?)?,
            "--ops-per-entry" => args.ops_per_entry = u32::try_from(value()?)?.max(1),
            "--linger-us" => args.linger_us = value()?,
            "--heartbeat-ms" => args.heartbeat_ms = value()?,
            "--tick-ms" => args.tick_ms = value()?,
            "--heartbeat-min-ms" => args.heartbeat_min_ms = value()?,
            other => bail!("unknown argument {other}"),
        }
    }
    Ok(args)
}

/// CPU time of this process (user + system) from /proc/self/stat, in seconds.
fn process_cpu_seconds() -> Result<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    let after_name = stat
        .rsplit_once(')')
        .context("malformed /proc/self/stat")?
        .1;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // Fields 14 and 15 of the file (utime, stime) are 12 and 13 after the command name.
    let ticks: u64 = fields[11].parse::<u64>()? + fields[12].parse::<u64>()?;
    // Linux reports these in USER_HZ, 100 per second.
    Ok(ticks as f64 / 100.0)
}

fn total(cluster: &LocalCluster) -> TransportStatsSnapshot {
    cluster
        .transport_stats()
        .values()
        .fold(TransportStatsSnapshot::default(), |sum, s| sum.plus(s))
}

fn entry(group: u32, writer: u32, n: u64, ops: u32) -> Command {
    let ops = (0..ops)
        .map(|i| {
            LeaseOp::Acquire(AcquireRequest {
                key: ResourceKey::new("bench", format!("g{group}-w{writer}-n{n}-{i}")),
                holder_id: format!("h{writer}"),
                ttl_ms: 600_000,
                request_id: format!("r{n}-{i}"),
            })
        })
        .collect();
    Command::Batch(ops)
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<()> {
    let args = parse_args()?;
    let timing = GroupTiming {
        heartbeat_interval_ms: args.heartbeat_ms,
        heartbeat_min_interval_ms: args.heartbeat_min_ms,
        tick_interval_ms: args.tick_ms,
        ..GroupTiming::default()
    };
    println!(
        "transport_cluster: 3 nodes x {} groups, fsync on, heartbeat {} ms, tick {} ms, election {}-{} ms, linger {} us",
        args.groups,
        timing.heartbeat_interval_ms,
        timing.tick_interval_ms,
        timing.election_timeout_min_ms,
        timing.election_timeout_max_ms,
        args.linger_us
    );
    let started = Instant::now();
    let cluster = Arc::new(
        LocalCluster::start(ClusterOptions {
            groups: args.groups,
            timing,
            fsync: true,
            seed: 42,
            linger_us: args.linger_us,
            ..ClusterOptions::default()
        })
        .await
        .map_err(|e| anyhow::anyhow!(e))?,
    );
    let all = cluster.live_nodes();
    cluster
        .wait_for_leaders(&all, Duration::from_secs(120))
        .await
        .map_err(|e| anyhow::anyhow!(e))?;
    println!(
        "all {} groups have leaders after {:.1} s",
        args.groups,
        started.elapsed().as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(args.settle_s)).await;

    if args.idle_s > 0 {
        let before_stats = total(&cluster);
        let cpu_before = process_cpu_seconds()?;
        let window = Instant::now();
        tokio::time::sleep(Duration::from_secs(args.idle_s)).await;
        let seconds = window.elapsed().as_secs_f64();
        let cores = (process_cpu_seconds()? - cpu_before) / seconds;
        let idle = total(&cluster).since(&before_stats);
        println!(
            "idle {:.1} s: process CPU {:.3} cores = {:.2}% of one core per node; {:.0} frames/s, {:.0} messages/s, {:.0} heartbeats/s ({:.1} messages/frame) across the cluster",
            seconds,
            cores,
            cores / 3.0 * 100.0,
            idle.frames_sent as f64 / seconds,
            idle.messages_sent as f64 / seconds,
            idle.heartbeats_sent as f64 / seconds,
            idle.messages_sent as f64 / idle.frames_sent.max(1) as f64,
        );
    }

    if args.load_s > 0 {
        let stop = Arc::new(AtomicBool::new(false));
        let committed = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(AtomicU64::new(0));
        let before_stats = total(&cluster);
        let cpu_before = process_cpu_seconds()?;
        let window = Instant::now();
        let mut tasks = Vec::new();
        for group in 0..args.groups {
            for writer in 0..args.writers {
                let cluster = cluster.clone();
                let stop = stop.clone();
                let committed = committed.clone();
                let failed = failed.clone();
                let ops = args.ops_per_entry;
                tasks.push(tokio::spawn(async move {
                    let mut latencies =
                        Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        n += 1;
                        let sent = Instant::now();
                        match cluster
                            .write(group, entry(group, writer, n, ops), Duration::from_secs(10))
                            .await
                        {
                            Ok(_) => {
                                committed.fetch_add(1, Ordering::Relaxed);
                                let micros =
                                    u64::try_from(sent.elapsed().as_micros()).unwrap_or(u64::MAX);
                                latencies.saturating_record(micros);
                            }
                            Err(_) => {
                                failed.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                    latencies
                }));
            }
        }
        tokio::time::sleep(Duration::from_secs(args.load_s)).await;
        stop.store(true, Ordering::Relaxed);
        let mut latencies = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
        for task in tasks {
            latencies.add(task.await?)?;
        }
        let seconds = window.elapsed().as_secs_f64();
        let cores = (process_cpu_seconds()? - cpu_before) / seconds;
        let load = total(&cluster).since(&before_stats);
        let entries = committed.load(Ordering::Relaxed);
        println!(
            "load {:.1} s, {} writers per group: {:.0} committed entries/s ({:.0} lease ops/s), {} failed writes",
            seconds,
            args.writers,
            entries as f64 / seconds,
            (entries * u64::from(args.ops_per_entry)) as f64 / seconds,
            failed.load(Ordering::Relaxed)
        );
        println!(
            "write latency: p50 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms, max {:.2} ms",
            latencies.value_at_quantile(0.50) as f64 / 1000.0,
            latencies.value_at_quantile(0.99) as f64 / 1000.0,
            latencies.value_at_quantile(0.999) as f64 / 1000.0,
            latencies.max() as f64 / 1000.0
        );
        println!(
            "batching: {} Raft messages in {} QUIC frames = {:.2} messages/frame; {:.1} MB/s sent; process CPU {:.2} cores",
            load.messages_sent,
            load.frames_sent,
            load.messages_sent as f64 / load.frames_sent.max(1) as f64,
            load.bytes_sent as f64 / seconds / 1e6,
            cores
        );
    }
    match Arc::try_unwrap(cluster) {
        Ok(cluster) => cluster.shutdown().await,
        Err(_) => bail!("cluster still shared at exit"),
    }
    Ok(())
}
