//! `snapshot_pause`: how long a snapshot build stops a group's apply, before and after issue 25.
//!
//! It builds one group's state with N active leases (default 1,000,000; each with its request-id
//! record, as a fresh acquire leaves) and measures, on the same state:
//! - **before** (a build that holds the state lock for its whole write, as every build did until
//!   issue 25): the time to write the snapshot straight from the live state to a file and sync
//!   it. Apply of the group waited for all of it;
//! - **after** (`LeaseStateMachine::freeze`, then the write with the lock released): the time of
//!   the freeze alone, which is all apply waits for now (the lock is held for nothing else);
//! - what the freeze costs apply afterwards: random renewals applied while a frozen copy is
//!   alive (each first write to a chunk copies it) against the same renewals with none, and the
//!   worst case, the first Batch entry of 256 random renewals right after a freeze (it copies
//!   nearly every chunk it touches) against the same entry with none;
//! - the snapshot's size and the time to restore it (`read_snapshot`, which a restart and a
//!   snapshot install pay).
//!
//! Each timed step runs `--rounds` times (default 5); the table shows the median and the
//! longest. Usage: `snapshot_pause [--leases N] [--rounds R] [--dir DIR]`; DIR (default the
//! system's temporary directory) receives one snapshot file, deleted at the end.

// A report tool: printing to stdout is its purpose.
#![allow(clippy::print_stdout)]

use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use tenure_bench::{RESIDENT_LEASES, Resident, XorShift64, bench_limits};
use tenure_core::{Entry, GroupLimits, LeaseStateMachine, StateOptions};

/// Renewals applied to measure the copy-on-write cost after a freeze.
const RENEWALS: usize = 200_000;
/// Renewals in one Batch entry (the proposer's default entry size).
const BATCH_RENEWALS: usize = 256;

/// One Batch entry renewing `count` random resident leases.
fn batch_of_renewals(resident: &mut Resident, rng: &mut XorShift64, count: usize) -> Entry {
    let ops = (0..count)
        .map(|_| {
            let index = rng.below(resident.len());
            resident.renew_op(index)
        })
        .collect();
    resident.harness.batch(ops)
}

struct Options {
    leases: usize,
    rounds: usize,
    dir: PathBuf,
}

fn parse_args() -> Result<Options> {
    let usage = "usage: snapshot_pause [--leases N] [--rounds R] [--dir DIR]";
    let mut options = Options {
        leases: RESIDENT_LEASES,
        rounds: 5,
        dir: std::env::temp_dir(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().with_context(|| format!("{name} needs a value"));
        match arg.as_str() {
            "--leases" => {
                let text = value("--leases")?;
                options.leases = text
                    .parse()
                    .with_context(|| format!("--leases: not a count: {text}"))?;
                ensure!(options.leases > 0, "--leases must be at least 1");
            }
            "--rounds" => {
                let text = value("--rounds")?;
                options.rounds = text
                    .parse()
                    .with_context(|| format!("--rounds: not a count: {text}"))?;
                ensure!(
                    (1..=100).contains(&options.rounds),
                    "--rounds must be 1 to 100"
                );
            }
            "--dir" => options.dir = PathBuf::from(value("--dir")?),
            "--help" | "-h" => {
                println!("{usage}");
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?} ({usage})"),
        }
    }
    Ok(options)
}

/// Median and maximum of `samples` (not empty).
fn median_max(samples: &mut [Duration]) -> (Duration, Duration) {
    samples.sort_unstable();
    let median = samples[samples.len() / 2];
    let max = samples[samples.len() - 1];
    (median, max)
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1_000.0
}

/// Writes `write` into a new file at `path` through a 1 MiB buffer and syncs it, as the storage
/// does; returns the bytes written.
fn write_file(
    path: &PathBuf,
    write: impl FnOnce(&mut BufWriter<File>) -> Result<u64>,
) -> Result<u64> {
    let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut writer = BufWriter::with_capacity(1 << 20, file);
    let bytes = write(&mut writer)?;
    writer.flush().context("writing the snapshot")?;
    let file = writer
        .into_inner()
        .map_err(|err| err.into_error())
        .context("writing the snapshot")?;
    file.sync_all().context("syncing the snapshot")?;
    Ok(bytes)
}

fn main() -> Result<()> {
    let options = parse_args()?;
    let leases = options.leases;
    let path = options
        .dir
        .join(format!("tenure-snapshot-pause-{}.snap", std::process::id()));
    let defaults = bench_limits(leases);
    let limits = GroupLimits {
        dedup_records_max: defaults.dedup_records_max.max(leases as u64),
        ..defaults
    };
    let started = Instant::now();
    let mut resident = Resident::build(leases, limits)?;
    println!(
        "snapshot_pause: {leases} active leases, {} request-id records (built in {:.1} s, untimed)",
        resident.harness.state().stats().dedup_records,
        started.elapsed().as_secs_f64()
    );

    let mut before = Vec::new();
    let mut freeze = Vec::new();
    let mut frozen_write = Vec::new();
    let mut bytes = 0;
    for _ in 0..options.rounds {
        let start = Instant::now();
        bytes = write_file(&path, |writer| {
            Ok(resident.harness.state().write_snapshot(writer)?.bytes)
        })?;
        before.push(start.elapsed());

        let start = Instant::now();
        let frozen = resident.harness.state().freeze();
        freeze.push(start.elapsed());
        let start = Instant::now();
        write_file(&path, |writer| Ok(frozen.write_snapshot(writer)?.bytes))?;
        frozen_write.push(start.elapsed());
    }

    let mut restore = Vec::new();
    for _ in 0..options.rounds.min(3) {
        let start = Instant::now();
        let file = File::open(&path).context("opening the snapshot")?;
        let restored =
            LeaseStateMachine::read_snapshot(BufReader::new(file), StateOptions::default())?;
        restore.push(start.elapsed());
        ensure!(
            restored.stats() == resident.harness.state().stats(),
            "the restored state differs"
        );
    }
    let _ = std::fs::remove_file(&path);
    let mut rng_for_batches = XorShift64::new(11);

    // The worst single entry: Batch entries of 256 random renewals (the proposer's default
    // entry size), the first applied right after a freeze, which copies every slab and ring chunk
    // it touches; against the same entries with no frozen copy alive.
    let mut first_after_freeze = Vec::new();
    let mut without_freeze = Vec::new();
    for _ in 0..options.rounds {
        let entry = batch_of_renewals(&mut resident, &mut rng_for_batches, BATCH_RENEWALS);
        let frozen = resident.harness.state().freeze();
        let start = Instant::now();
        std::hint::black_box(resident.harness.apply(&entry));
        first_after_freeze.push(start.elapsed());
        drop(frozen);
        let entry = batch_of_renewals(&mut resident, &mut rng_for_batches, BATCH_RENEWALS);
        let start = Instant::now();
        std::hint::black_box(resident.harness.apply(&entry));
        without_freeze.push(start.elapsed());
    }

    // Renewals with no frozen copy alive, then the same number with one alive (taken just
    // before): the difference is the chunk copies.
    let mut rng = XorShift64::new(7);
    let plain = resident.timed_random_renews(&mut rng, RENEWALS)?;
    let frozen = resident.harness.state().freeze();
    let with_frozen = resident.timed_random_renews(&mut rng, RENEWALS)?;
    drop(frozen);

    let (before_median, before_max) = median_max(&mut before);
    let (freeze_median, freeze_max) = median_max(&mut freeze);
    let (write_median, write_max) = median_max(&mut frozen_write);
    let (restore_median, restore_max) = median_max(&mut restore);
    let per_renew_us = |d: Duration| d.as_secs_f64() * 1e6 / RENEWALS as f64;
    println!("{:<62} {:>10} {:>10}", "", "median ms", "max ms");
    println!(
        "{:<62} {:>10.2} {:>10.2}",
        "before: apply stopped for the whole write + sync",
        ms(before_median),
        ms(before_max)
    );
    println!(
        "{:<62} {:>10.3} {:>10.3}",
        "after: apply stopped for the freeze only",
        ms(freeze_median),
        ms(freeze_max)
    );
    println!(
        "{:<62} {:>10.2} {:>10.2}",
        "after: the write + sync of the frozen copy (apply goes on)",
        ms(write_median),
        ms(write_max)
    );
    println!(
        "{:<62} {:>10.2} {:>10.2}",
        "restore (read_snapshot: a restart, an install)",
        ms(restore_median),
        ms(restore_max)
    );
    let (first_median, first_max) = median_max(&mut first_after_freeze);
    let (plain_median, plain_max) = median_max(&mut without_freeze);
    println!(
        "{:<62} {:>10.2} {:>10.2}",
        format!("after: the first {BATCH_RENEWALS}-renewal entry after a freeze (chunk copies)"),
        ms(first_median),
        ms(first_max)
    );
    println!(
        "{:<62} {:>10.2} {:>10.2}",
        format!("the same entry with no frozen copy alive"),
        ms(plain_median),
        ms(plain_max)
    );
    println!(
        "snapshot {bytes} bytes ({:.1} per lease); {RENEWALS} random renewals: {:.3} us each \
         with no frozen copy, {:.3} us each with one alive (chunk copies included)",
        bytes as f64 / leases as f64,
        per_renew_us(plain),
        per_renew_us(with_frozen)
    );
    Ok(())
}
