//! Crash safety: an append acknowledged by its `IOFlushed` callback survives a SIGKILL, and the
//! store reopens without any repair step with every group's log whole.
//!
//! The test binary re-executes itself as a child process (environment variable
//! `TENURE_CRASH_CHILD=<data dir>`). The child opens the store, and for each of 64 groups
//! continues the group's log from its last entry, appending batches of 1-8 entries with
//! consecutive indices, up to 4 appends in flight per group. When an append's callback reports
//! success, the child prints `ACK <group> <last index>` and flushes stdout: from then on the
//! append is acknowledged. The parent reads those lines, kills the child with SIGKILL at a
//! pseudo-random moment 50-400 ms after the first acknowledgement, reopens the store in-process
//! and checks, for every group:
//!
//! - the log is gap-free from its first entry (index 1, nothing is purged here) to its last one;
//! - every stored entry decodes intact (checksums are verified on read), is stored under its own
//!   index, and carries exactly the payload the child wrote for that group and index;
//! - the highest acknowledged index is present (so, gap-free, every acknowledged index is);
//! - no group was stopped by a storage failure.
//!
//! Then the next cycle starts a new child on the same data directory. 5 cycles by default;
//! `TENURE_CRASH_CYCLES=N` runs N (e.g. 50 for the long run). `TENURE_CRASH_SEED=S` replays a
//! seed; the seed is printed either way. Entries appended in earlier cycles are re-verified in
//! full on the last cycle only (intermediate cycles verify each group's log from the highest
//! index the previous cycle verified), which keeps long runs linear in the data written.
//!
//! What a SIGKILL can and cannot show: the process dies but the operating system keeps its page
//! cache, so this proves that acknowledgement never precedes the write, that RocksDB's recovery
//! yields a prefix of each group's appends with no holes, and that no repair is needed. It cannot
//! show that the WAL sync itself reached the disk; that needs a power cut, not a kill.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command as Process, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use openraft::entry::RaftEntry;
use openraft::storage::{IOFlushed, RaftLogStorage};
use openraft::type_config::TypeConfigExt;
use openraft::{EntryPayload, LogId};
use tenure_storage::{LogEntry, NodeStorage, StorageOptions, TenureRaft};

/// Set (to the data directory) in the child process.
const CHILD_ENV: &str = "TENURE_CRASH_CHILD";
/// The child's pseudo-random seed (batch sizes).
const CHILD_SEED_ENV: &str = "TENURE_CRASH_CHILD_SEED";
/// Number of kill cycles.
const CYCLES_ENV: &str = "TENURE_CRASH_CYCLES";
/// Seed of the whole run.
const SEED_ENV: &str = "TENURE_CRASH_SEED";
/// This test's name, so the child runs only it.
const TEST_NAME: &str = "crash::acknowledged_appends_survive_sigkill";

const GROUPS: u32 = 64;
const DEFAULT_CYCLES: u32 = 5;
/// Appends in flight per group in the child.
const PIPELINE_DEPTH: usize = 4;
/// Largest batch the child appends.
const MAX_BATCH: u64 = 8;
/// Kill window after the first acknowledgement, in milliseconds.
const KILL_AFTER_MS: std::ops::Range<u64> = 50..400;
/// Longest wait for a child's first acknowledgement (process start, store open, first sync).
const FIRST_ACK_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest wait for the ack reader to see end of file after the kill.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// A child kills itself after this long, in case its parent died without killing it.
const CHILD_LIFETIME: Duration = Duration::from_secs(120);

/// SplitMix64: small, seedable, good enough to pick batch sizes and kill times.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn in_range(&mut self, range: std::ops::Range<u64>) -> u64 {
        range.start + self.next_u64() % (range.end - range.start)
    }
}

/// The payload the child writes at `index` of `group`; the parent checks it verbatim.
fn payload(group: u32, index: u64) -> tenure_core::Entry {
    tenure_core::Entry {
        log_time_ms: index.wrapping_mul(7).wrapping_add(u64::from(group)),
        command: tenure_core::Command::Expire { leases_max: group },
    }
}

fn entry(group: u32, index: u64) -> LogEntry {
    LogEntry::new_normal(
        openraft::testing::log_id::<TenureRaft>(1, 0, index),
        payload(group, index),
    )
}

#[test]
fn acknowledged_appends_survive_sigkill() {
    if let Some(dir) = std::env::var_os(CHILD_ENV) {
        child_main(Path::new(&dir));
    }
    parent_main();
}

// ------------------------------------------------------------------------------------- child

/// Appends forever (until killed), printing an `ACK` line per durable append. Never returns.
fn child_main(dir: &Path) -> ! {
    let seed: u64 = std::env::var(CHILD_SEED_ENV)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    // Whatever happens, never outlive the parent's interest by much.
    std::thread::spawn(|| {
        let started = Instant::now();
        while started.elapsed() < CHILD_LIFETIME {
            std::thread::park_timeout(CHILD_LIFETIME.saturating_sub(started.elapsed()));
        }
        eprintln!("crash child: lived {CHILD_LIFETIME:?} without being killed, exiting");
        std::process::exit(3);
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async move {
        let storage = NodeStorage::open(dir, StorageOptions::default()).expect("child: open store");
        let mut tasks = Vec::new();
        for group in 0..GROUPS {
            let store = storage.log_store(group);
            let rng = SplitMix64(seed ^ u64::from(group).wrapping_mul(0x2545_f491_4f6c_dd1d));
            tasks.push(tokio::spawn(append_forever(store, group, rng)));
        }
        for task in tasks {
            task.await.expect("append task panicked");
        }
    });
    unreachable!("append tasks never finish");
}

async fn append_forever(mut store: tenure_storage::GroupLogStore, group: u32, mut rng: SplitMix64) {
    let last = store.last_entry().expect("child: read last entry");
    let mut next = last.map_or(1, |entry| entry.index() + 1);
    let mut in_flight = VecDeque::with_capacity(PIPELINE_DEPTH);
    loop {
        while in_flight.len() < PIPELINE_DEPTH {
            let count = rng.in_range(1..MAX_BATCH + 1);
            let entries: Vec<LogEntry> = (next..next + count)
                .map(|index| entry(group, index))
                .collect();
            next += count;
            let (tx, rx) = TenureRaft::oneshot();
            store
                .append(entries, IOFlushed::signal(tx))
                .await
                .unwrap_or_else(|err| panic!("child: group {group}: append failed: {err}"));
            in_flight.push_back((next - 1, rx));
        }
        let (last_index, rx) = in_flight.pop_front().expect("in flight");
        match rx.await {
            Ok(Ok(())) => {
                let mut out = std::io::stdout().lock();
                writeln!(out, "ACK {group} {last_index}").expect("child: write ack");
                out.flush().expect("child: flush ack");
            }
            Ok(Err(err)) => {
                panic!("child: group {group}: append up to {last_index} failed to sync: {err}")
            }
            Err(err) => panic!("child: group {group}: callback dropped: {err}"),
        }
    }
}

// ------------------------------------------------------------------------------------ parent

/// Kills the child if the parent unwinds before it did.
struct ChildGuard(Option<Child>);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(child) = self.0.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[derive(Default)]
struct Totals {
    kills: u32,
    ack_lines: u64,
    acked_entries_checked: u64,
    entries_verified: u64,
    lost: u64,
}

fn parent_main() {
    let cycles: u32 = std::env::var(CYCLES_ENV)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_CYCLES);
    let seed: u64 = std::env::var(SEED_ENV)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(42, |d| d.as_secs() ^ u64::from(d.subsec_nanos()))
        });
    println!("crash test: seed {seed} ({SEED_ENV}={seed} replays the kill times), {cycles} cycles");
    let mut rng = SplitMix64(seed);
    let dir = tempfile::tempdir().expect("temp dir");
    let started = Instant::now();
    let mut totals = Totals::default();
    // Highest acknowledged index per group, over all cycles.
    let mut acked = vec![0u64; GROUPS as usize];
    // Highest index verified per group by the previous cycle.
    let mut verified = vec![0u64; GROUPS as usize];
    for cycle in 0..cycles {
        let cycle_started = Instant::now();
        let kill_after = Duration::from_millis(rng.in_range(KILL_AFTER_MS));
        let child_seed = rng.next_u64();
        let (acks, lines) = run_child_and_kill(dir.path(), child_seed, kill_after, cycle);
        totals.kills += 1;
        totals.ack_lines += lines;
        for (group, index) in acks.iter().enumerate() {
            acked[group] = acked[group].max(*index);
        }
        let last_cycle = cycle + 1 == cycles;
        let from = if last_cycle {
            vec![0; GROUPS as usize]
        } else {
            verified.clone()
        };
        let report = verify(dir.path(), &acked, &from);
        totals.entries_verified += report.entries_verified;
        totals.lost += report.lost;
        if last_cycle {
            totals.acked_entries_checked = acked.iter().sum();
        }
        verified = report.last;
        println!(
            "cycle {cycle}: killed {kill_after:?} after the first ack, {lines} acks read, {} entries verified, \
             {} lost, {:?}",
            report.entries_verified,
            report.lost,
            cycle_started.elapsed()
        );
        assert_eq!(
            report.lost, 0,
            "cycle {cycle} (seed {seed}): acknowledged entries were lost"
        );
    }
    println!(
        "crash test: {} kills, {} acknowledged appends verified ({} acknowledged entries), 0 lost, {GROUPS} groups, \
         {} entry reads, seed {seed}, {:.1?}",
        totals.kills,
        totals.ack_lines,
        totals.acked_entries_checked,
        totals.entries_verified,
        started.elapsed()
    );
    assert_eq!(totals.lost, 0);
}

/// Runs one child until it has acknowledged something, kills it `kill_after` later, and returns
/// the highest acknowledged index per group plus the number of ACK lines read.
fn run_child_and_kill(
    dir: &Path,
    child_seed: u64,
    kill_after: Duration,
    cycle: u32,
) -> (Vec<u64>, u64) {
    let exe = std::env::current_exe().expect("current exe");
    let child = Process::new(exe)
        .args([TEST_NAME, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, dir)
        .env(CHILD_SEED_ENV, child_seed.to_string())
        .env_remove(CYCLES_ENV)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn child");
    let mut guard = ChildGuard(Some(child));
    let stdout = guard
        .0
        .as_mut()
        .and_then(|c| c.stdout.take())
        .expect("child stdout");
    let (tx, rx) = mpsc::channel::<(u32, u64)>();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let Some(rest) = line.strip_prefix("ACK ") else {
                continue;
            };
            let mut parts = rest.split(' ');
            let group: u32 = parts
                .next()
                .and_then(|s| s.parse().ok())
                .expect("ack group");
            let index: u64 = parts
                .next()
                .and_then(|s| s.parse().ok())
                .expect("ack index");
            if tx.send((group, index)).is_err() {
                break;
            }
        }
    });

    let mut acks = vec![0u64; GROUPS as usize];
    let mut lines = 0u64;
    let mut record = |(group, index): (u32, u64), acks: &mut [u64]| {
        let slot = &mut acks[group as usize];
        assert!(index > *slot, "group {group}: ack {index} after ack {slot}");
        *slot = index;
        lines += 1;
    };

    // Wait (bounded) for the first acknowledgement.
    match rx.recv_timeout(FIRST_ACK_TIMEOUT) {
        Ok(ack) => record(ack, &mut acks),
        Err(err) => {
            let status = guard.0.as_mut().and_then(|c| c.try_wait().ok().flatten());
            panic!(
                "cycle {cycle}: no acknowledgement within {FIRST_ACK_TIMEOUT:?} ({err}); child status {status:?}"
            );
        }
    }
    // Keep reading until the kill moment.
    let kill_at = Instant::now() + kill_after;
    loop {
        let now = Instant::now();
        if now >= kill_at {
            break;
        }
        match rx.recv_timeout(kill_at - now) {
            Ok(ack) => record(ack, &mut acks),
            Err(mpsc::RecvTimeoutError::Timeout) => break,
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = guard.0.as_mut().and_then(|c| c.try_wait().ok().flatten());
                panic!(
                    "cycle {cycle}: the child stopped acknowledging before the kill; status {status:?}"
                );
            }
        }
    }
    let mut child = guard.0.take().expect("child");
    if let Some(status) = child.try_wait().expect("try_wait") {
        panic!("cycle {cycle}: the child exited on its own before the kill: {status}");
    }
    child.kill().expect("SIGKILL the child");
    let status = child.wait().expect("wait for the child");
    assert!(
        !status.success(),
        "cycle {cycle}: a killed child cannot succeed: {status}"
    );

    // Every line the child printed before it died is an acknowledgement: read to end of file.
    let drain_until = Instant::now() + DRAIN_TIMEOUT;
    loop {
        let now = Instant::now();
        assert!(
            now < drain_until,
            "cycle {cycle}: child stdout not closed {DRAIN_TIMEOUT:?} after the kill"
        );
        match rx.recv_timeout(drain_until - now) {
            Ok(ack) => record(ack, &mut acks),
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
        }
    }
    reader.join().expect("ack reader");
    (acks, lines)
}

struct VerifyReport {
    /// Last index of each group's log.
    last: Vec<u64>,
    entries_verified: u64,
    lost: u64,
}

/// Reopens the store and checks every group's log (from index `from[group]` on).
fn verify(dir: &Path, acked: &[u64], from: &[u64]) -> VerifyReport {
    let storage =
        NodeStorage::open(dir, StorageOptions::default()).expect("reopen the store after the kill");
    let mut report = VerifyReport {
        last: vec![0; GROUPS as usize],
        entries_verified: 0,
        lost: 0,
    };
    for group in 0..GROUPS {
        let slot = group as usize;
        let store = storage.log_store(group);
        let first = store
            .first_entry()
            .unwrap_or_else(|err| panic!("group {group}: first entry: {err}"));
        let last = store
            .last_entry()
            .unwrap_or_else(|err| panic!("group {group}: last entry: {err}"));
        let (first, last) = match (first, last) {
            (Some(first), Some(last)) => (first, last),
            (None, None) => {
                if acked[slot] > 0 {
                    println!(
                        "group {group}: log is empty but index {} was acknowledged",
                        acked[slot]
                    );
                    report.lost += acked[slot];
                }
                continue;
            }
            other => panic!("group {group}: first/last disagree: {other:?}"),
        };
        assert_eq!(
            first.index(),
            1,
            "group {group}: log starts at {}",
            first.index()
        );
        check_entry(group, first.index(), &first);
        check_entry(group, last.index(), &last);
        let last_index = last.index();
        report.last[slot] = last_index;
        if last_index < acked[slot] {
            println!(
                "group {group}: last entry {last_index} but {} was acknowledged: {} acknowledged entries lost",
                acked[slot],
                acked[slot] - last_index
            );
            report.lost += acked[slot] - last_index;
        }
        // Gap-free and intact from `from` (or 1) to the last entry, read in chunks.
        let mut next = from[slot].max(1);
        while next <= last_index {
            let end = (next + 65_536).min(last_index + 1);
            let entries = store
                .read_range(next, end)
                .unwrap_or_else(|err| panic!("group {group}: read [{next}, {end}): {err}"));
            assert_eq!(
                entries.len() as u64,
                end - next,
                "group {group}: hole in the log: [{next}, {end}) holds only {} entries (first {first_index}, last {last_index})",
                entries.len(),
                first_index = first.index(),
            );
            for (offset, entry) in entries.iter().enumerate() {
                check_entry(group, next + offset as u64, entry);
            }
            report.entries_verified += entries.len() as u64;
            next = end;
        }
    }
    let stopped = storage.stopped_groups();
    assert!(
        stopped.is_empty(),
        "groups stopped after reopen: {stopped:?}"
    );
    report
}

fn check_entry(group: u32, index: u64, entry: &LogEntry) {
    let expected_id: LogId<_> = openraft::testing::log_id::<TenureRaft>(1, 0, index);
    assert_eq!(
        entry.log_id, expected_id,
        "group {group}: entry at {index} has log id {}",
        entry.log_id
    );
    match &entry.payload {
        EntryPayload::Normal(data) => {
            assert_eq!(
                data,
                &payload(group, index),
                "group {group}: payload of entry {index}"
            );
        }
        _ => panic!("group {group}: entry {index} is not a normal entry: {entry:?}"),
    }
}
