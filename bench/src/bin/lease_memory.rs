//! `lease_memory`: heap bytes per active lease in the lease state machine, measured with a
//! counting global allocator, plus a renews-per-second sanity figure.
//!
//! It builds a state with 1 000 000 active leases (tenant `tenant-a`, resources
//! `resource-0000001`..., holders `holder-00042`..., ttl 1 h, one fresh request id each) and
//! reports:
//! - (a) bytes per lease including the request-id (idempotency) records, one per lease;
//! - (b) bytes per lease without them: a second state is built with `dedup_retention_ms = 1`, so
//!   request-id records are garbage-collected lazily while it is populated and then, by cheap
//!   `Expire { leases_max: 1 }` entries at a later log time, until none is left;
//! - the peak heap while building (a) (hash tables double as they grow);
//! - renews per second: 1 000 000 renews of random resident leases, one per entry, on state (a),
//!   timing only `apply`.
//!
//! Heap bytes are the sizes requested from the allocator (`Layout::size`), without the
//! allocator's own per-block overhead; the process's resident set size is printed alongside.
//! Hash tables grow by doubling, so bytes per lease depend on where the count falls between two
//! capacities (1 000 000 is just past hashbrown's 7/8 load of 2^20 buckets, so the key and
//! request-id tables sit at 2^21 buckets, about half empty). (b) keeps the empty capacity the
//! request-id table reached while populating (about a millisecond of records), which is
//! negligible at a million leases but not for a tiny `--leases`.
//!
//! Usage: `lease_memory [--json] [--leases N]`. With `--json` it prints one JSON line instead of
//! the table.

// A report tool: printing to stdout is its purpose.
#![allow(clippy::print_stdout)]
// The workspace denies unsafe code. Implementing `GlobalAlloc` requires it; the implementation
// below only forwards every call to `std::alloc::System` and counts bytes with atomics.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use tenure_bench::{
    Harness, LONG_TTL_MS, RESIDENT_LEASES, Resident, XorShift64, bench_limits, resource_id,
};
use tenure_core::{Command, GroupLimits};

/// Bytes currently allocated through the global allocator.
static ALLOCATED: AtomicUsize = AtomicUsize::new(0);
/// Largest value `ALLOCATED` reached since the last [`reset_peak`].
static PEAK: AtomicUsize = AtomicUsize::new(0);

/// `System`, counting the bytes it hands out.
struct CountingAllocator;

fn count_alloc(size: usize) {
    let now = ALLOCATED.fetch_add(size, Ordering::Relaxed) + size;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

fn count_dealloc(size: usize) {
    ALLOCATED.fetch_sub(size, Ordering::Relaxed);
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so `System`'s
// guarantees carry over; the counting touches only atomics and never allocates.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged; the caller upholds `GlobalAlloc::alloc`'s contract.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            count_alloc(layout.size());
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            count_alloc(layout.size());
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by this allocator, i.e. by `System`, with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        count_dealloc(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` was allocated by `System` with `layout`; the caller upholds the rest.
        let new_ptr = unsafe { System.realloc(ptr, layout, new_size) };
        if !new_ptr.is_null() {
            count_dealloc(layout.size());
            count_alloc(new_size);
        }
        new_ptr
    }
}

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

fn allocated() -> usize {
    ALLOCATED.load(Ordering::Relaxed)
}

fn reset_peak() {
    PEAK.store(allocated(), Ordering::Relaxed);
}

fn peak() -> usize {
    PEAK.load(Ordering::Relaxed)
}

/// Resident set size of this process in bytes, from `/proc/self/status` (Linux only).
fn resident_set_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

struct Options {
    json: bool,
    leases: usize,
}

fn parse_args() -> Result<Options> {
    let mut options = Options {
        json: false,
        leases: RESIDENT_LEASES,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--json" => options.json = true,
            "--leases" => {
                let value = args.next().context("--leases needs a value")?;
                options.leases = value
                    .parse()
                    .with_context(|| format!("--leases: not a count: {value}"))?;
                ensure!(options.leases > 0, "--leases must be at least 1");
            }
            "--help" | "-h" => {
                println!("usage: lease_memory [--json] [--leases N]");
                std::process::exit(0);
            }
            other => {
                bail!("unknown argument {other:?} (usage: lease_memory [--json] [--leases N])")
            }
        }
    }
    Ok(options)
}

/// Heap growth of one populated state.
struct Measured {
    /// Heap bytes the populated state holds beyond the empty state.
    bytes: usize,
    /// Highest heap, beyond the empty state, while populating (includes transient command
    /// buffers of one batch and hash-table resizes).
    peak_bytes: usize,
    /// Request-id records left when measured.
    dedup_records: u64,
}

/// Builds the state of (a): `leases` active leases with their request-id records.
fn measure_with_dedup(leases: usize) -> Result<(Measured, Resident)> {
    let before = allocated();
    reset_peak();
    // One request-id record per lease: the table must hold them all (default bound 1 M).
    let defaults = bench_limits(leases);
    let limits = GroupLimits {
        dedup_records_max: defaults.dedup_records_max.max(leases as u64),
        ..defaults
    };
    let resident = Resident::build(leases, limits)?;
    // `Resident` also keeps a lease-id table for the renew loop, and built a table of indices
    // while populating: neither is part of the state.
    let lease_ids_bytes = resident.lease_ids.capacity() * size_of::<tenure_core::LeaseId>();
    let indices_bytes = leases * size_of::<u64>();
    let stats = resident.harness.state().stats();
    ensure!(
        stats.dedup_records == leases as u64,
        "expected one request-id record per lease, found {}",
        stats.dedup_records
    );
    let measured = Measured {
        bytes: (allocated() - before).saturating_sub(lease_ids_bytes),
        peak_bytes: (peak() - before).saturating_sub(lease_ids_bytes + indices_bytes),
        dedup_records: stats.dedup_records,
    };
    Ok((measured, resident))
}

/// Items per batch while populating the state of (b).
const WITHOUT_DEDUP_BATCH_ITEMS: usize = 256;

/// Builds the state of (b): `leases` active leases, request-id records all collected.
fn measure_without_dedup(leases: usize) -> Result<Measured> {
    let limits = GroupLimits {
        dedup_retention_ms: 1,
        dedup_retention_ms_min: 0,
        ..bench_limits(leases)
    };
    let before = allocated();
    reset_peak();
    let mut harness = Harness::new(limits)?;
    let indices: Vec<u64> = (0..leases as u64).collect();
    let indices_bytes = indices.capacity() * size_of::<u64>();
    // Small batches: a request-id record lives until the first entry applied 1 ms after it, so
    // the table never holds more than about a millisecond of records (~1 000). Its hash table
    // keeps the capacity it reached (hashbrown does not shrink), which (b) therefore includes:
    // about 0.3 bytes per lease at 1 M leases, but all of the table for tiny `--leases`.
    for chunk in indices.chunks(WITHOUT_DEDUP_BATCH_ITEMS) {
        harness.acquire_indices(chunk, LONG_TTL_MS, resource_id, |_, _| {})?;
    }
    drop(indices);
    // Later log time: every record is past its retention. Garbage collection is lazy and bounded
    // per applied entry, so apply cheap entries (nothing is due) until the table is empty.
    harness.advance_ms(1_000);
    let mut entries_applied = 0u64;
    while harness.state().stats().dedup_records > 0 {
        ensure!(
            entries_applied < 10_000_000,
            "request-id records are not being collected: {:?}",
            harness.state().stats()
        );
        let entry = harness.entry(Command::Expire { leases_max: 1 }, 1);
        let output = harness.apply(&entry);
        ensure!(
            output.reclaimed.is_empty(),
            "a resident lease expired unexpectedly"
        );
        entries_applied += 1;
    }
    let stats = harness.state().stats();
    ensure!(
        stats.active_leases == leases as u64,
        "expected {leases} active leases, found {}",
        stats.active_leases
    );
    let measured = Measured {
        bytes: allocated() - before,
        peak_bytes: (peak() - before).saturating_sub(indices_bytes),
        dedup_records: stats.dedup_records,
    };
    drop(harness);
    Ok(measured)
}

/// Applies `count` renews of random resident leases, one per entry, timing only `apply`.
fn renews_per_second(resident: &mut Resident, count: usize) -> Result<f64> {
    const CHUNK: usize = 10_000;
    let mut rng = XorShift64::new(0x5eed_0003);
    let mut timed = Duration::ZERO;
    let mut done = 0usize;
    while done < count {
        let chunk = CHUNK.min(count - done);
        timed += resident.timed_random_renews(&mut rng, chunk)?;
        done += chunk;
    }
    Ok(count as f64 / timed.as_secs_f64())
}

fn per_lease(bytes: usize, leases: usize) -> f64 {
    bytes as f64 / leases as f64
}

fn main() -> Result<()> {
    let options = parse_args()?;
    let leases = options.leases;

    let (with_dedup, mut resident) = measure_with_dedup(leases)?;
    let rss_with_dedup = resident_set_bytes();
    let renews = renews_per_second(&mut resident, leases)?;
    drop(resident);
    let without_dedup = measure_without_dedup(leases)?;

    let total = per_lease(with_dedup.bytes, leases);
    let without = per_lease(without_dedup.bytes, leases);
    let dedup = per_lease(with_dedup.bytes.saturating_sub(without_dedup.bytes), leases);
    let peak_total = per_lease(with_dedup.peak_bytes, leases);
    let peak_without = per_lease(without_dedup.peak_bytes, leases);

    if options.json {
        println!(
            "{{\"leases\":{leases},\"bytes_per_lease_total\":{total:.1},\
             \"bytes_per_lease_without_dedup\":{without:.1},\"dedup_bytes_per_record\":{dedup:.1},\
             \"peak_bytes_per_lease_total\":{peak_total:.1},\
             \"peak_bytes_per_lease_without_dedup\":{peak_without:.1},\
             \"state_bytes_total\":{},\"state_bytes_without_dedup\":{},\
             \"rss_bytes_after_a\":{},\"renews_per_sec\":{renews:.0}}}",
            with_dedup.bytes,
            without_dedup.bytes,
            rss_with_dedup.map_or_else(|| "null".to_owned(), |rss| rss.to_string()),
        );
        return Ok(());
    }

    let mib = |bytes: usize| bytes as f64 / (1024.0 * 1024.0);
    println!("tenure lease state memory, {leases} active leases (heap bytes requested)");
    println!("{:<44} {:>12} {:>12}", "", "bytes/lease", "state MiB");
    println!(
        "{:<44} {:>12.1} {:>12.1}",
        "(a) with request-id records",
        total,
        mib(with_dedup.bytes)
    );
    println!(
        "{:<44} {:>12.1} {:>12.1}",
        "(b) without request-id records",
        without,
        mib(without_dedup.bytes)
    );
    println!(
        "{:<44} {:>12.1}",
        "    request-id record cost (a - b)", dedup
    );
    println!(
        "{:<44} {:>12.1} {:>12.1}",
        "peak while building (a)",
        peak_total,
        mib(with_dedup.peak_bytes)
    );
    println!(
        "{:<44} {:>12.1} {:>12.1}",
        "peak while building (b)",
        peak_without,
        mib(without_dedup.peak_bytes)
    );
    println!(
        "request-id records held: (a) {}, (b) {}",
        with_dedup.dedup_records, without_dedup.dedup_records
    );
    if let Some(rss) = rss_with_dedup {
        println!(
            "process RSS after building (a): {:.1} MiB",
            rss as f64 / (1024.0 * 1024.0)
        );
    }
    println!("renews/s (single-op entries, apply only, 1 thread): {renews:.0}");
    Ok(())
}
