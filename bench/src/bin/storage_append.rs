//! `storage_append`: durable append throughput and latency of `tenure-storage` with many groups
//! sharing one WAL sync, and the time to reopen a store whose group holds a million leases.
//!
//! **Append** (`--duration-s`, default 10; 0 skips it): one store in a temporary directory with
//! the default options (fsync on). `--groups` groups (default 64) each keep up to `--pipeline`
//! appends in flight (default 8), each append carrying `--entries-per-append` entries (default 1,
//! so the figure is per-entry durability through the shared sync). Every entry's
//! `tenure_core::Entry` encodes to 64 bytes (a Renew whose request id is padded to fit). An append
//! counts once its `IOFlushed` callback reports success; latency is from the `append` call to
//! the moment the group's task sees that callback. Appends are issued until the duration ends,
//! and those in flight then are drained and counted. Reported: durable entries/s, WAL syncs/s
//! and entries per sync (from `NodeStorage::stats`), p50/p99/p99.9/max append-to-durable latency,
//! payload bytes and stored value bytes.
//!
//! **Reopen** (`--reopen-leases N`, default 1 000 000; 0 skips it): group 1 of a fresh store is
//! given N active leases through the real path, openraft's `RaftStateMachine::apply`, fed
//! `Command::Batch` entries of 4096 Acquires (about 245 entries for a million), after a
//! `SetGroupLimits` entry with `tenure_bench::bench_limits(N)`; then a snapshot is built through
//! `RaftSnapshotBuilder::build_snapshot` and the store is dropped. Timed: `NodeStorage::open` plus
//! `NodeStorage::state_machine` (which restores the group from its snapshot). The log entries
//! themselves are not written to the log store (a group's log is purged up to its snapshot anyway),
//! so this is the snapshot-restore cost, not a log replay.
//!
//! **Tail reads** (`--tail-reads N`, default 20 000; 0 skips it): the log reads a node makes
//! all the time (apply and replication read the newest entries of a group's log) beside groups
//! whose logs were purged the way a server purges them. A fresh store's `--groups` groups each get
//! [`TAIL_ROUNDS`] rounds of [`TAIL_ENTRIES_PER_ROUND`] entries (in appends of
//! [`TAIL_ENTRIES_PER_APPEND`]), and after each round the log is purged up to
//! [`TAIL_ENTRIES_KEPT`] entries behind its end (a snapshot every 200 entries, as in the scale
//! runs, and openraft's default of 1 000 entries kept behind a snapshot). Then `N` reads of one
//! group's last entry (`GroupLogStore::read_range(last, last + 1)`), groups in turn, are timed one
//! by one: mean, p50, p99 and max. The purged prefixes are range deletions still in the memtable,
//! which is where a server's recent purges are.
//!
//! Usage: `storage_append [--json] [--duration-s S] [--entries-per-append K] [--groups G]
//! [--pipeline P] [--reopen-leases N] [--tail-reads N]`. With `--json` it prints one JSON line
//! instead of the human-readable report.

#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

use std::collections::VecDeque;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use hdrhistogram::Histogram;
use openraft::entry::RaftEntry;
use openraft::storage::{
    EntryResponder, IOFlushed, RaftLogStorage, RaftSnapshotBuilder, RaftStateMachine,
};
use openraft::type_config::TypeConfigExt;
use tenure_bench::{
    Harness, LONG_TTL_MS, POPULATE_BATCH_ITEMS, bench_limits, holder_id, resource_id,
};
use tenure_core::{Command, GroupId, LeaseId, LeaseOp, RenewRequest, ResourceKey, StateOptions};
use tenure_storage::{GroupLogStore, LogEntry, NodeStorage, StorageOptions, TenureRaft};

/// Encoded size of every appended entry's `tenure_core::Entry`.
const PAYLOAD_BYTES: usize = 64;
/// The group the reopen measurement uses.
const REOPEN_GROUP: u32 = 1;
/// Entries handed to one `apply` call while populating.
const APPLY_CHUNK: usize = 16;
/// Tail reads: rounds of appends and purges per group before the reads.
const TAIL_ROUNDS: u64 = 30;
/// Tail reads: entries each group appends per round (then purges).
const TAIL_ENTRIES_PER_ROUND: u64 = 200;
/// Tail reads: entries per append.
const TAIL_ENTRIES_PER_APPEND: u64 = 50;
/// Tail reads: entries a purge keeps behind the log's end.
const TAIL_ENTRIES_KEPT: u64 = 1_000;

const USAGE: &str = "usage: storage_append [--json] [--duration-s S] [--entries-per-append K] \
                     [--groups G] [--pipeline P] [--reopen-leases N] [--tail-reads N]";

struct Options {
    json: bool,
    duration: Duration,
    entries_per_append: u64,
    groups: u32,
    pipeline: usize,
    reopen_leases: usize,
    tail_reads: u64,
}

fn parse_args() -> Result<Options> {
    let mut options = Options {
        json: false,
        duration: Duration::from_secs(10),
        entries_per_append: 1,
        groups: 64,
        pipeline: 8,
        reopen_leases: 1_000_000,
        tail_reads: 20_000,
    };
    let mut args = std::env::args().skip(1);
    fn value<T: std::str::FromStr>(
        args: &mut impl Iterator<Item = String>,
        flag: &str,
    ) -> Result<T> {
        let text = args
            .next()
            .with_context(|| format!("{flag} needs a value"))?;
        text.parse()
            .map_err(|_| anyhow::anyhow!("{flag}: not a number: {text}"))
    }
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--json" => options.json = true,
            "--duration-s" => {
                let seconds: f64 = value(&mut args, &arg)?;
                options.duration = Duration::try_from_secs_f64(seconds)
                    .with_context(|| format!("--duration-s: not a duration: {seconds}"))?;
            }
            "--entries-per-append" => {
                options.entries_per_append = value(&mut args, &arg)?;
                ensure!(
                    (1..=4096).contains(&options.entries_per_append),
                    "--entries-per-append must be 1..=4096"
                );
            }
            "--groups" => {
                options.groups = value(&mut args, &arg)?;
                ensure!(options.groups > 0, "--groups must be at least 1");
            }
            "--pipeline" => {
                options.pipeline = value(&mut args, &arg)?;
                ensure!(options.pipeline > 0, "--pipeline must be at least 1");
            }
            "--reopen-leases" => options.reopen_leases = value(&mut args, &arg)?,
            "--tail-reads" => options.tail_reads = value(&mut args, &arg)?,
            "--help" | "-h" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?} ({USAGE})"),
        }
    }
    Ok(options)
}

// ------------------------------------------------------------------------------------ append

/// A Renew entry whose postcard encoding is exactly [`PAYLOAD_BYTES`].
fn payload_template(group: u32) -> Result<tenure_core::Entry> {
    let make = |request_id: String| tenure_core::Entry {
        log_time_ms: 1_000,
        command: Command::Lease(LeaseOp::Renew(RenewRequest {
            key: ResourceKey::new("tenant-a", resource_id(u64::from(group))),
            lease_id: LeaseId {
                group_id: GroupId(group),
                sequence: 1,
            },
            holder_id: holder_id(u64::from(group)),
            ttl_ms: LONG_TTL_MS,
            request_id,
        })),
    };
    // The checksum in front is not payload.
    let size = |entry: &tenure_core::Entry| -> Result<usize> {
        Ok(tenure_storage::codec::encode(entry)
            .context("encode payload")?
            .len()
            - tenure_storage::codec::CHECKSUM_BYTES)
    };
    let base = size(&make(String::new()))?;
    ensure!(
        base <= PAYLOAD_BYTES,
        "the smallest Renew encodes to {base} bytes"
    );
    // A string shorter than 128 bytes has a one-byte length prefix, already counted in `base`.
    let entry = make("r".repeat(PAYLOAD_BYTES - base));
    ensure!(
        size(&entry)? == PAYLOAD_BYTES,
        "payload is {} bytes",
        size(&entry)?
    );
    Ok(entry)
}

/// `count` log entries from index `first` on, each carrying `template`.
fn log_entries(template: &tenure_core::Entry, first: u64, count: u64) -> Vec<LogEntry> {
    (first..first + count)
        .map(|index| {
            LogEntry::new_normal(
                openraft::testing::log_id::<TenureRaft>(1, 0, index),
                template.clone(),
            )
        })
        .collect()
}

struct GroupResult {
    entries: u64,
    appends: u64,
    value_bytes: u64,
    latency_us: Histogram<u64>,
}

async fn drive_group(
    mut store: GroupLogStore,
    template: tenure_core::Entry,
    entries_per_append: u64,
    pipeline: usize,
    stop: Arc<AtomicBool>,
) -> Result<GroupResult> {
    let group = store.group();
    let mut result = GroupResult {
        entries: 0,
        appends: 0,
        value_bytes: 0,
        latency_us: Histogram::new_with_bounds(1, 60_000_000, 3).context("histogram")?,
    };
    let mut next = 1u64;
    let mut in_flight = VecDeque::with_capacity(pipeline);
    loop {
        while in_flight.len() < pipeline && !stop.load(Ordering::Relaxed) {
            let entries = log_entries(&template, next, entries_per_append);
            if next == 1 {
                // Stored value size of one entry (log id, payload, checksum), for the byte count.
                let value = tenure_storage::codec::encode(&entries[0]).context("encode entry")?;
                result.value_bytes = value.len() as u64;
            }
            next += entries_per_append;
            let (tx, rx) = TenureRaft::oneshot();
            let issued = Instant::now();
            store
                .append(entries, IOFlushed::signal(tx))
                .await
                .with_context(|| format!("group {group}: append"))?;
            in_flight.push_back((issued, rx));
        }
        let Some((issued, rx)) = in_flight.pop_front() else {
            break;
        };
        rx.await
            .with_context(|| format!("group {group}: callback dropped"))?
            .with_context(|| format!("group {group}: sync failed"))?;
        let micros = u64::try_from(issued.elapsed().as_micros()).unwrap_or(u64::MAX);
        result.latency_us.saturating_record(micros.max(1));
        result.entries += entries_per_append;
        result.appends += 1;
    }
    result.value_bytes *= result.entries;
    Ok(result)
}

struct AppendReport {
    seconds: f64,
    entries: u64,
    appends: u64,
    fsyncs: u64,
    fsync_micros: u64,
    payload_bytes: u64,
    value_bytes: u64,
    p50_us: u64,
    p99_us: u64,
    p999_us: u64,
    max_us: u64,
}

fn run_append(runtime: &tokio::runtime::Runtime, options: &Options) -> Result<AppendReport> {
    let dir = tempfile::tempdir().context("temp dir")?;
    let storage = NodeStorage::open(dir.path(), StorageOptions::default()).context("open store")?;
    let stop = Arc::new(AtomicBool::new(false));
    let mut templates = Vec::new();
    for group in 0..options.groups {
        templates.push(payload_template(group)?);
    }
    let before = storage.stats();
    let started = Instant::now();
    let results = runtime.block_on(async {
        let mut tasks = Vec::new();
        for (group, template) in (0..options.groups).zip(templates) {
            tasks.push(tokio::spawn(drive_group(
                storage.log_store(group),
                template,
                options.entries_per_append,
                options.pipeline,
                Arc::clone(&stop),
            )));
        }
        tokio::time::sleep(options.duration).await;
        stop.store(true, Ordering::Relaxed);
        let mut results = Vec::new();
        for task in tasks {
            results.push(task.await.context("append task panicked")??);
        }
        Ok::<_, anyhow::Error>(results)
    })?;
    let seconds = started.elapsed().as_secs_f64();
    let after = storage.stats();
    let stopped = storage.stopped_groups();
    ensure!(stopped.is_empty(), "groups stopped: {stopped:?}");

    let mut latency = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).context("histogram")?;
    let (mut entries, mut appends, mut value_bytes) = (0u64, 0u64, 0u64);
    for result in &results {
        latency
            .add(&result.latency_us)
            .context("merge histograms")?;
        entries += result.entries;
        appends += result.appends;
        value_bytes += result.value_bytes;
    }
    ensure!(
        after.entries_appended - before.entries_appended == entries,
        "the store counted {} entries appended, the groups {entries}",
        after.entries_appended - before.entries_appended
    );
    Ok(AppendReport {
        seconds,
        entries,
        appends,
        fsyncs: after.fsyncs - before.fsyncs,
        fsync_micros: after.fsync_micros - before.fsync_micros,
        payload_bytes: entries * PAYLOAD_BYTES as u64,
        value_bytes,
        p50_us: latency.value_at_quantile(0.50),
        p99_us: latency.value_at_quantile(0.99),
        p999_us: latency.value_at_quantile(0.999),
        max_us: latency.max(),
    })
}

// ------------------------------------------------------------------------------------ reopen

struct ReopenReport {
    leases: usize,
    entries_applied: u64,
    populate_seconds: f64,
    snapshot_seconds: f64,
    snapshot_bytes: u64,
    open_seconds: f64,
    restore_seconds: f64,
}

async fn apply_chunk(
    machine: &mut tenure_storage::GroupStateMachine,
    entries: Vec<LogEntry>,
) -> Result<()> {
    let items: Vec<Result<EntryResponder<TenureRaft>, io::Error>> =
        entries.into_iter().map(|entry| Ok((entry, None))).collect();
    machine
        .apply(futures_util::stream::iter(items))
        .await
        .context("apply")?;
    Ok(())
}

fn run_reopen(runtime: &tokio::runtime::Runtime, leases: usize) -> Result<ReopenReport> {
    let dir = tempfile::tempdir().context("temp dir")?;
    let limits = bench_limits(leases);
    let (entries_applied, populate_seconds, snapshot_seconds, snapshot_bytes) = {
        let storage =
            NodeStorage::open(dir.path(), StorageOptions::default()).context("open store")?;
        let mut machine = storage
            .state_machine(REOPEN_GROUP, StateOptions::default())
            .context("open state machine")?;
        // The harness only builds entries here (request ids, log times); its own state is unused.
        let mut harness = Harness::new(limits.clone())?;
        let started = Instant::now();
        let mut index = 0u64;
        let mut next_entry = |payload: tenure_core::Entry| {
            index += 1;
            LogEntry::new_normal(
                openraft::testing::log_id::<TenureRaft>(1, 0, index),
                payload,
            )
        };
        let mut chunk = vec![next_entry(
            harness.entry(Command::SetGroupLimits(limits), 0),
        )];
        let mut lease = 0u64;
        let total = leases as u64;
        while lease < total {
            let end = (lease + POPULATE_BATCH_ITEMS as u64).min(total);
            let ops = (lease..end)
                .map(|i| harness.acquire_op(resource_id(i), holder_id(i), LONG_TTL_MS))
                .collect();
            chunk.push(next_entry(harness.batch(ops)));
            lease = end;
            if chunk.len() == APPLY_CHUNK {
                runtime.block_on(apply_chunk(&mut machine, std::mem::take(&mut chunk)))?;
            }
        }
        if !chunk.is_empty() {
            runtime.block_on(apply_chunk(&mut machine, chunk))?;
        }
        let populate_seconds = started.elapsed().as_secs_f64();
        let active = machine.with_leases(|state| state.stats().active_leases);
        ensure!(
            active == total,
            "{active} active leases after populating, expected {total}"
        );

        let started = Instant::now();
        let snapshot = runtime.block_on(async {
            let mut builder = machine.get_snapshot_builder().await;
            builder.build_snapshot().await
        })?;
        let snapshot_seconds = started.elapsed().as_secs_f64();
        let snapshot_bytes = snapshot
            .snapshot
            .metadata()
            .context("snapshot metadata")?
            .len();
        let applied = machine.last_applied().map_or(0, |id| id.index());
        ensure!(
            snapshot.meta.last_log_id.as_ref().map(|id| id.index()) == Some(applied),
            "snapshot is at {:?}, applied {applied}",
            snapshot.meta.last_log_id
        );
        (applied, populate_seconds, snapshot_seconds, snapshot_bytes)
        // `machine` and `storage` drop here: the store is closed.
    };

    let started = Instant::now();
    let storage =
        NodeStorage::open(dir.path(), StorageOptions::default()).context("reopen store")?;
    let open_seconds = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let machine = storage
        .state_machine(REOPEN_GROUP, StateOptions::default())
        .context("restore state machine")?;
    let restore_seconds = started.elapsed().as_secs_f64();
    let active = machine.with_leases(|state| state.stats().active_leases);
    ensure!(
        active == leases as u64,
        "{active} active leases after reopen, expected {leases}"
    );
    ensure!(
        machine.last_applied().map(|id| id.index()) == Some(entries_applied),
        "restored at {:?}, expected index {entries_applied}",
        machine.last_applied()
    );
    drop(machine);
    drop(storage);
    Ok(ReopenReport {
        leases,
        entries_applied,
        populate_seconds,
        snapshot_seconds,
        snapshot_bytes,
        open_seconds,
        restore_seconds,
    })
}

// ---------------------------------------------------------------------------------- tail reads

struct TailReadReport {
    purges: u64,
    entries_kept: u64,
    reads: u64,
    mean_us: f64,
    p50_us: u64,
    p99_us: u64,
    max_us: u64,
}

fn run_tail_reads(runtime: &tokio::runtime::Runtime, options: &Options) -> Result<TailReadReport> {
    let dir = tempfile::tempdir().context("temp dir")?;
    let storage = NodeStorage::open(dir.path(), StorageOptions::default()).context("open store")?;
    let mut stores: Vec<GroupLogStore> = (0..options.groups)
        .map(|group| storage.log_store(group))
        .collect();
    let mut purges = 0u64;
    let mut last = 0u64;
    runtime.block_on(async {
        for _ in 0..TAIL_ROUNDS {
            for (group, store) in (0u32..).zip(stores.iter_mut()) {
                let template = payload_template(group)?;
                for first in (last + 1..=last + TAIL_ENTRIES_PER_ROUND)
                    .step_by(usize::try_from(TAIL_ENTRIES_PER_APPEND)?)
                {
                    let entries = log_entries(&template, first, TAIL_ENTRIES_PER_APPEND);
                    let (tx, rx) = TenureRaft::oneshot();
                    store
                        .append(entries, IOFlushed::signal(tx))
                        .await
                        .with_context(|| format!("group {group}: append"))?;
                    rx.await
                        .with_context(|| format!("group {group}: callback dropped"))?
                        .with_context(|| format!("group {group}: sync failed"))?;
                }
                let end = last + TAIL_ENTRIES_PER_ROUND;
                if end > TAIL_ENTRIES_KEPT {
                    store
                        .purge(openraft::testing::log_id::<TenureRaft>(
                            1,
                            0,
                            end - TAIL_ENTRIES_KEPT,
                        ))
                        .await
                        .with_context(|| format!("group {group}: purge"))?;
                    purges += 1;
                }
            }
            last += TAIL_ENTRIES_PER_ROUND;
        }
        Ok::<_, anyhow::Error>(())
    })?;
    let mut latency = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).context("histogram")?;
    let mut total_nanos = 0u128;
    for read in 0..options.tail_reads {
        let store = &stores[usize::try_from(read % u64::from(options.groups))?];
        let started = Instant::now();
        let entries = store
            .read_range(last, last + 1)
            .with_context(|| format!("group {}: read", store.group()))?;
        let elapsed = started.elapsed();
        ensure!(
            entries.len() == 1 && entries[0].index() == last,
            "group {}: read {} entries for index {last}",
            store.group(),
            entries.len()
        );
        total_nanos += elapsed.as_nanos();
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        latency.saturating_record(micros.max(1));
    }
    let stopped = storage.stopped_groups();
    ensure!(stopped.is_empty(), "groups stopped: {stopped:?}");
    Ok(TailReadReport {
        purges,
        entries_kept: TAIL_ENTRIES_KEPT.min(last),
        reads: options.tail_reads,
        mean_us: total_nanos as f64 / 1_000.0 / options.tail_reads.max(1) as f64,
        p50_us: latency.value_at_quantile(0.50),
        p99_us: latency.value_at_quantile(0.99),
        max_us: latency.max(),
    })
}

// -------------------------------------------------------------------------------------- main

fn main() -> Result<()> {
    let options = parse_args()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;

    let append = if options.duration.is_zero() {
        None
    } else {
        Some(run_append(&runtime, &options)?)
    };
    let reopen = if options.reopen_leases == 0 {
        None
    } else {
        Some(run_reopen(&runtime, options.reopen_leases)?)
    };

    let tail = if options.tail_reads == 0 {
        None
    } else {
        Some(run_tail_reads(&runtime, &options)?)
    };

    if options.json {
        let mut fields = vec![
            format!("\"groups\":{}", options.groups),
            format!("\"pipeline\":{}", options.pipeline),
            format!("\"entries_per_append\":{}", options.entries_per_append),
            format!("\"payload_bytes_per_entry\":{PAYLOAD_BYTES}"),
        ];
        if let Some(a) = &append {
            fields.extend([
                format!("\"seconds\":{:.3}", a.seconds),
                format!("\"entries_durable\":{}", a.entries),
                format!("\"entries_per_sec\":{:.0}", a.entries as f64 / a.seconds),
                format!("\"appends_per_sec\":{:.0}", a.appends as f64 / a.seconds),
                format!("\"fsyncs\":{}", a.fsyncs),
                format!("\"fsyncs_per_sec\":{:.1}", a.fsyncs as f64 / a.seconds),
                format!("\"entries_per_fsync\":{:.1}", ratio(a.entries, a.fsyncs)),
                format!("\"fsync_mean_us\":{:.0}", ratio(a.fsync_micros, a.fsyncs)),
                format!("\"latency_p50_us\":{}", a.p50_us),
                format!("\"latency_p99_us\":{}", a.p99_us),
                format!("\"latency_p999_us\":{}", a.p999_us),
                format!("\"latency_max_us\":{}", a.max_us),
                format!("\"payload_bytes\":{}", a.payload_bytes),
                format!("\"value_bytes\":{}", a.value_bytes),
            ]);
        }
        if let Some(r) = &reopen {
            fields.extend([
                format!("\"reopen_leases\":{}", r.leases),
                format!("\"reopen_entries_applied\":{}", r.entries_applied),
                format!("\"populate_seconds\":{:.3}", r.populate_seconds),
                format!("\"snapshot_build_seconds\":{:.3}", r.snapshot_seconds),
                format!("\"snapshot_bytes\":{}", r.snapshot_bytes),
                format!("\"reopen_open_seconds\":{:.3}", r.open_seconds),
                format!("\"reopen_restore_seconds\":{:.3}", r.restore_seconds),
                format!(
                    "\"reopen_seconds\":{:.3}",
                    r.open_seconds + r.restore_seconds
                ),
            ]);
        }
        if let Some(t) = &tail {
            fields.extend([
                format!("\"tail_reads\":{}", t.reads),
                format!("\"tail_read_purges\":{}", t.purges),
                format!("\"tail_read_mean_us\":{:.2}", t.mean_us),
                format!("\"tail_read_p50_us\":{}", t.p50_us),
                format!("\"tail_read_p99_us\":{}", t.p99_us),
                format!("\"tail_read_max_us\":{}", t.max_us),
            ]);
        }
        println!("{{{}}}", fields.join(","));
        return Ok(());
    }

    if let Some(a) = &append {
        println!(
            "tenure-storage append: {} groups, up to {} appends in flight each, entries per append {}, \
             {PAYLOAD_BYTES}-byte payloads, fsync on, {:.2} s",
            options.groups, options.pipeline, options.entries_per_append, a.seconds
        );
        println!(
            "  durable entries/s     {:>12.0}   ({} entries, {} appends, {:.0} appends/s)",
            a.entries as f64 / a.seconds,
            a.entries,
            a.appends,
            a.appends as f64 / a.seconds
        );
        println!(
            "  WAL syncs/s           {:>12.1}   ({} syncs, mean {:.0} us each)",
            a.fsyncs as f64 / a.seconds,
            a.fsyncs,
            ratio(a.fsync_micros, a.fsyncs)
        );
        println!(
            "  entries per sync      {:>12.1}",
            ratio(a.entries, a.fsyncs)
        );
        println!(
            "  append->durable       p50 {} us, p99 {} us, p99.9 {} us, max {} us",
            a.p50_us, a.p99_us, a.p999_us, a.max_us
        );
        println!(
            "  bytes                 {} payload ({:.1} MiB), {} stored values ({:.1} MiB, {} B/entry)",
            a.payload_bytes,
            mib(a.payload_bytes),
            a.value_bytes,
            mib(a.value_bytes),
            a.value_bytes.checked_div(a.entries).unwrap_or(0)
        );
    }
    if let Some(r) = &reopen {
        println!(
            "tenure-storage reopen: group {REOPEN_GROUP} with {} active leases ({} entries applied through \
             RaftStateMachine::apply in {:.2} s)",
            r.leases, r.entries_applied, r.populate_seconds
        );
        println!(
            "  snapshot              {} bytes ({:.1} MiB), built in {:.2} s",
            r.snapshot_bytes,
            mib(r.snapshot_bytes),
            r.snapshot_seconds
        );
        println!(
            "  reopen                {:.3} s  (NodeStorage::open {:.3} s + state_machine restore {:.3} s)",
            r.open_seconds + r.restore_seconds,
            r.open_seconds,
            r.restore_seconds
        );
    }
    if let Some(t) = &tail {
        println!(
            "tenure-storage tail reads: {} groups, {TAIL_ROUNDS} rounds of {TAIL_ENTRIES_PER_ROUND} \
             entries each, {} purges (each keeping {} entries)",
            options.groups, t.purges, t.entries_kept
        );
        println!(
            "  read of the last entry  mean {:.2} us, p50 {} us, p99 {} us, max {} us ({} reads)",
            t.mean_us, t.p50_us, t.p99_us, t.max_us, t.reads
        );
    }
    Ok(())
}

fn ratio(numerator: u64, denominator: u64) -> f64 {
    if denominator == 0 {
        0.0
    } else {
        numerator as f64 / denominator as f64
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}
