//! Criterion benchmarks of `LeaseStateMachine::apply` with one million resident active leases.
//!
//! Each benchmark owns a state with [`RESIDENT_LEASES`] active leases (one tenant, ttl 1 h) and
//! uses `iter_custom`, so only `apply` is timed: the commands of an iteration are built before its
//! timed section and the state is restored after it (both untimed). An iteration applies
//! [`OPS_PER_ITER`] single-operation `Command::Lease` entries (per-operation cost), except
//! `renew_batched` (`Command::Batch` of 256 renews) and `expire` (`Command::Expire` entries of
//! 4096). Throughput is reported in operations (leases for expire) per second.
//!
//! Every timed loop counts the operations that succeeded freshly and the iteration asserts they
//! all did, so a benchmark cannot silently measure an error path.
//!
//! Run as `cargo bench -p tenure-bench --bench state_machine`. Without `--bench` (as under
//! `cargo test`) criterion runs each benchmark once; the states then hold
//! [`RESIDENT_LEASES_SMOKE`] leases so the smoke run takes seconds.

// The inputs are all built by the benchmark itself: a failed unwrap or assertion is a bug in the
// benchmark (or a regression in tenure-core) and must stop the run loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput, criterion_group, criterion_main};
use tenure_bench::{
    LONG_TTL_MS, RESIDENT_LEASES, RESIDENT_LEASES_SMOKE, Resident, SHORT_TTL_MS, Walk, XorShift64,
    batch_outcomes, bench_limits, expiring_resource_id, fresh_ok, holder_id, resource_id,
    single_reply,
};
use tenure_core::{Command, CommandResult, Entry, LeaseId, LeaseOp, LeaseReply};

/// Single-operation entries applied per measured iteration.
const OPS_PER_ITER: usize = 10_000;
/// Renews per `Command::Batch` entry in `renew_batched`.
const RENEW_BATCH_ITEMS: usize = 256;
/// Batch entries per measured iteration of `renew_batched` (40 x 256 = 10 240 renews).
const RENEW_BATCHES_PER_ITER: usize = 40;
/// `leases_max` of each Expire entry (the default `expire_batch_max`).
const EXPIRE_LEASES_MAX: u32 = 4_096;
/// Expire entries per measured iteration; the iteration reclaims this many times
/// [`EXPIRE_LEASES_MAX`] leases.
const EXPIRE_ENTRIES_PER_ITER: usize = 4;

/// True under `cargo bench` (criterion gets `--bench`), false in `cargo test`'s single pass.
fn bench_mode() -> bool {
    std::env::args().any(|arg| arg == "--bench")
}

fn resident_count() -> usize {
    if bench_mode() {
        RESIDENT_LEASES
    } else {
        RESIDENT_LEASES_SMOKE
    }
}

fn build_resident(count: usize) -> Resident {
    let started = Instant::now();
    let resident = Resident::build(count, bench_limits(count)).expect("populating the state");
    if bench_mode() {
        eprintln!(
            "  (populated {count} resident leases in {:.2?}, untimed)",
            started.elapsed()
        );
    }
    resident
}

/// Acquires of new resources while the resident leases stay; untimed, the new leases are
/// released again so the active population stays at its size (their records go to the bounded
/// inactive set, as in a steady state with churn).
fn acquire(group: &mut BenchmarkGroup<'_, WallTime>, resident_count: usize) {
    let mut resident = build_resident(resident_count);
    let mut next_new = resident_count as u64;
    group.throughput(Throughput::Elements(OPS_PER_ITER as u64));
    group.bench_function("acquire_1M_resident", |b| {
        b.iter_custom(|iters| {
            let mut timed = Duration::ZERO;
            let mut granted: Vec<LeaseId> = Vec::with_capacity(OPS_PER_ITER);
            for _ in 0..iters {
                let first = next_new;
                next_new += OPS_PER_ITER as u64;
                let entries: Vec<Entry> = (first..next_new)
                    .map(|index| {
                        let harness = &mut resident.harness;
                        let op =
                            harness.acquire_op(resource_id(index), holder_id(index), LONG_TTL_MS);
                        harness.single(op)
                    })
                    .collect();
                granted.clear();
                let mut failed = 0usize;

                let start = Instant::now();
                for entry in &entries {
                    let output = resident.harness.apply(entry);
                    match single_reply(&output) {
                        Some(LeaseReply::Acquired(grant)) => granted.push(grant.lease_id),
                        _ => failed += 1,
                    }
                    black_box(output);
                }
                timed += start.elapsed();

                assert_eq!(failed, 0, "{failed} of {OPS_PER_ITER} acquires failed");
                let releases: Vec<LeaseOp> = granted
                    .iter()
                    .zip(first..next_new)
                    .map(|(&lease_id, index)| {
                        resident
                            .harness
                            .release_op(resource_id(index), lease_id, holder_id(index))
                    })
                    .collect();
                resident
                    .harness
                    .apply_batched(releases, |_, reply| {
                        assert!(matches!(reply, LeaseReply::Released(_)), "{reply:?}");
                    })
                    .expect("releasing the new leases");
            }
            timed
        });
    });
    check_population(&resident, resident_count);
}

/// Renews of resident leases picked pseudo-randomly, one per entry.
fn renew(group: &mut BenchmarkGroup<'_, WallTime>, resident_count: usize) {
    let mut resident = build_resident(resident_count);
    let mut rng = XorShift64::new(0x5eed_0001);
    group.throughput(Throughput::Elements(OPS_PER_ITER as u64));
    group.bench_function("renew_1M_resident", |b| {
        b.iter_custom(|iters| {
            let mut timed = Duration::ZERO;
            for _ in 0..iters {
                timed += resident
                    .timed_random_renews(&mut rng, OPS_PER_ITER)
                    .expect("every renewal succeeds");
            }
            timed
        });
    });
    check_population(&resident, resident_count);
}

/// Renews of resident leases picked pseudo-randomly, 256 per `Command::Batch` entry.
fn renew_batched(group: &mut BenchmarkGroup<'_, WallTime>, resident_count: usize) {
    let mut resident = build_resident(resident_count);
    let mut rng = XorShift64::new(0x5eed_0002);
    let per_iter = RENEW_BATCH_ITEMS * RENEW_BATCHES_PER_ITER;
    group.throughput(Throughput::Elements(per_iter as u64));
    group.bench_function("renew_batched_1M_resident", |b| {
        b.iter_custom(|iters| {
            let mut timed = Duration::ZERO;
            for _ in 0..iters {
                let entries: Vec<Entry> = (0..RENEW_BATCHES_PER_ITER)
                    .map(|_| {
                        let ops = (0..RENEW_BATCH_ITEMS)
                            .map(|_| resident.renew_op(rng.below(resident_count)))
                            .collect();
                        resident.harness.batch(ops)
                    })
                    .collect();
                let mut renewed = 0usize;

                let start = Instant::now();
                for entry in &entries {
                    let output = resident.harness.apply(entry);
                    if let CommandResult::Batch(Ok(outcomes)) = &output.result {
                        renewed += outcomes
                            .iter()
                            .filter(|outcome| {
                                matches!(fresh_ok(outcome), Ok(LeaseReply::Renewed(_)))
                            })
                            .count();
                    }
                    black_box(output);
                }
                timed += start.elapsed();

                assert_eq!(renewed, per_iter, "some batched renews failed");
            }
            timed
        });
    });
    check_population(&resident, resident_count);
}

/// Releases of distinct resident leases, one per entry; untimed, they are re-acquired (new lease
/// ids) so the population is whole again for the next iteration.
fn release(group: &mut BenchmarkGroup<'_, WallTime>, resident_count: usize) {
    let mut resident = build_resident(resident_count);
    let per_iter = OPS_PER_ITER.min(resident_count);
    let mut walk = Walk::new(resident_count, 614_657);
    group.throughput(Throughput::Elements(per_iter as u64));
    group.bench_function("release_1M_resident", |b| {
        b.iter_custom(|iters| {
            let mut timed = Duration::ZERO;
            for _ in 0..iters {
                // Distinct within the iteration: releasing a lease twice would fail.
                let indices = walk.take(per_iter);
                let entries: Vec<Entry> = indices
                    .iter()
                    .map(|&index| {
                        let op = resident.release_op(usize::try_from(index).unwrap());
                        resident.harness.single(op)
                    })
                    .collect();
                let mut released = 0usize;

                let start = Instant::now();
                for entry in &entries {
                    let output = resident.harness.apply(entry);
                    released += usize::from(matches!(
                        single_reply(&output),
                        Some(LeaseReply::Released(_))
                    ));
                    black_box(output);
                }
                timed += start.elapsed();

                assert_eq!(released, per_iter, "some releases failed");
                resident
                    .reacquire(&indices)
                    .expect("re-acquiring released leases");
            }
            timed
        });
    });
    check_population(&resident, resident_count);
}

/// Expire entries reclaiming leases whose ttl passed, next to the resident leases (which are not
/// due). Untimed, each iteration first acquires the short-lived leases with the minimum ttl and
/// lets log time pass their expiry; the timed part applies the Expire entries that reclaim them.
fn expire(group: &mut BenchmarkGroup<'_, WallTime>, resident_count: usize) {
    let mut resident = build_resident(resident_count);
    let per_iter = EXPIRE_ENTRIES_PER_ITER * EXPIRE_LEASES_MAX as usize;
    let expiring: Vec<u64> = (0..per_iter as u64).collect();
    group.throughput(Throughput::Elements(per_iter as u64));
    group.bench_function("expire_1M_resident", |b| {
        b.iter_custom(|iters| {
            let mut timed = Duration::ZERO;
            for _ in 0..iters {
                resident
                    .harness
                    .acquire_indices(&expiring, SHORT_TTL_MS, expiring_resource_id, |_, _| {})
                    .expect("acquiring the short-lived leases");
                resident.harness.advance_ms(SHORT_TTL_MS);
                let entries: Vec<Entry> = (0..EXPIRE_ENTRIES_PER_ITER)
                    .map(|_| {
                        let command = Command::Expire {
                            leases_max: EXPIRE_LEASES_MAX,
                        };
                        resident.harness.entry(command, 1)
                    })
                    .collect();
                let mut reclaimed = 0usize;
                let mut more_due = true;

                let start = Instant::now();
                for entry in &entries {
                    let output = resident.harness.apply(entry);
                    reclaimed += output.reclaimed.len();
                    more_due = matches!(output.result, CommandResult::Expire { more_due: true });
                    black_box(output);
                }
                timed += start.elapsed();

                assert_eq!(
                    reclaimed, per_iter,
                    "Expire reclaimed the wrong number of leases"
                );
                assert!(
                    !more_due,
                    "leases still due after the iteration's Expire entries"
                );
            }
            timed
        });
    });
    check_population(&resident, resident_count);
}

/// After a benchmark: the resident population is whole (nothing expired or leaked).
fn check_population(resident: &Resident, resident_count: usize) {
    let stats = resident.harness.state().stats();
    assert_eq!(
        stats.active_leases, resident_count as u64,
        "active population changed: {stats:?}"
    );
}

/// A single-entry sanity check that the batch helpers agree with the state (cheap, untimed).
fn smoke_batch_outcomes() {
    let mut resident = Resident::build(4, bench_limits(4)).expect("tiny state");
    let ops = (0..4).map(|index| resident.renew_op(index)).collect();
    let entry = resident.harness.batch(ops);
    let output = resident.harness.apply(&entry);
    let outcomes = batch_outcomes(&output).expect("batch applied");
    assert!(
        outcomes
            .iter()
            .all(|outcome| matches!(fresh_ok(outcome), Ok(LeaseReply::Renewed(_)))),
        "{outcomes:?}"
    );
}

fn state_machine(c: &mut Criterion) {
    smoke_batch_outcomes();
    let resident_count = resident_count();
    let mut group = c.benchmark_group("apply");
    acquire(&mut group, resident_count);
    renew(&mut group, resident_count);
    renew_batched(&mut group, resident_count);
    release(&mut group, resident_count);
    expire(&mut group, resident_count);
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));
    targets = state_machine
}
criterion_main!(benches);
