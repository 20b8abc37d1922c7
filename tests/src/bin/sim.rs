//! The deterministic simulation's long mode: many seeds, one JSON summary.
//!
//! `cargo run --release -p tenure-tests --bin sim -- --seeds N --summary-json FILE` runs seeds
//! `first-seed .. first-seed + N` (each a whole cluster in simulated time, see
//! `tenure_tests::sim`) and writes `seeds`, `simulated_s`, `ops_checked` and `violations` (each
//! a seed and what broke; empty when clean), with faults by kind and speed. `--seed S --seeds 1`
//! replays one seed exactly. Exits 1 when any seed found a violation.

// A command-line report: standard output is its interface.
#![allow(clippy::print_stdout)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context as _;
use clap::Parser;
use serde::Serialize;
use tenure_core::NegativeControl;
use tenure_tests::faults::FaultKind;
use tenure_tests::sim::{SimOptions, SimReport, run};

#[derive(Debug, Parser)]
#[command(about = "Deterministic simulation of whole tenure clusters, many seeds")]
struct Args {
    /// Seeds to run.
    #[arg(long, default_value_t = 10)]
    seeds: u64,
    /// The first seed.
    #[arg(long = "seed", default_value_t = 1)]
    first_seed: u64,
    /// Simulated seconds of faults per seed.
    #[arg(long, default_value_t = 20)]
    fault_s: u64,
    /// Where the summary goes.
    #[arg(long)]
    summary_json: Option<PathBuf>,
    /// Scratch directory (certificates, data-directory identities).
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Print every seed's line (default: only seeds with violations, and progress).
    #[arg(long)]
    verbose: bool,
    /// Node hosts per seed (default: the seed's, 5 for one seed in four, else 3).
    #[arg(long)]
    nodes: Option<u64>,
    /// The nemeses every seed uses, a comma-separated list of the simulation's kinds, combined
    /// when more than one (default: the seed draws one alone, or all combined).
    #[arg(long, value_parser = parse_kinds)]
    nemesis: Option<Kinds>,
    /// Simulated milliseconds before the nemesis starts (default 3000). A short warm-up puts
    /// faults into a cluster's first seconds: `--nodes 5 --nemesis replace-node --warmup-ms
    /// 600` wipes founders before the node table has their incarnations (the founder pins'
    /// birth window).
    #[arg(long)]
    warmup_ms: Option<u64>,
    /// A guarantee every node breaks on purpose (test builds: the seeds must find violations),
    /// e.g. `ignore-founder-pins` with the birth-window options above.
    #[arg(long, value_parser = parse_control, default_value = "none")]
    negative_control: NegativeControl,
}

fn parse_control(name: &str) -> Result<NegativeControl, String> {
    NegativeControl::parse(name).ok_or_else(|| {
        format!(
            "unknown negative control {name:?} ({})",
            NegativeControl::ALL.map(NegativeControl::name).join(", ")
        )
    })
}

/// A parsed `--nemesis` list (its own type: clap takes a bare `Vec` for repeated flags).
#[derive(Debug, Clone)]
struct Kinds(Vec<FaultKind>);

fn parse_kinds(text: &str) -> Result<Kinds, String> {
    FaultKind::parse_list(text, &FaultKind::SIMULATION).map(Kinds)
}

#[derive(Debug, Serialize)]
struct SeedViolation {
    seed: u64,
    broke: Vec<String>,
    details: Vec<String>,
}

#[derive(Debug, Serialize)]
struct Summary {
    seeds: u64,
    first_seed: u64,
    simulated_s: f64,
    wall_s: f64,
    simulated_s_per_wall_s: f64,
    ops_checked: u64,
    /// Hand-offs to waiters whose queue place was known, judged for FIFO order and liveness.
    hand_offs_judged: u64,
    /// Watch events judged (order, gaps, agreement with the history).
    watch_events_judged: u64,
    elections: u64,
    states_compared: u64,
    lost_unsynced_batches: u64,
    moves_done: u64,
    moves_failed: u64,
    /// Nodes taken out for good by the membership nemeses, over all seeds.
    nodes_gone: u64,
    /// Seeds whose run ended with a voter still on a node taken out (the controller had not
    /// finished re-creating it; not a violation).
    seeds_ending_with_voters_on_gone_nodes: u64,
    /// Of the nodes crashed for good, those brought back at once with a wiped disk under their
    /// old id, and of those the ones that excluded themselves before the run ended (the others
    /// stayed closed: refused by every node once removed). None may be admitted (`amnesia`).
    nodes_wiped: u64,
    nodes_excluded: u64,
    /// Wipes done while the node table had no incarnation for the node yet (the founder pins
    /// must refuse those).
    wipes_in_birth_window: u64,
    /// Wipes of a node nobody had pinned or recorded (admitted as new: not amnesia).
    wipes_unpinned: u64,
    /// Nodes `add-node` announced and started, over all seeds.
    nodes_added: u64,
    late_writes: u64,
    late_writes_rejected: u64,
    nemeses: BTreeMap<String, u64>,
    inconclusive: u64,
    violations: Vec<SeedViolation>,
}

fn line(report: &SimReport, wall_s: f64) -> String {
    let faults: Vec<String> = report
        .faults
        .iter()
        .map(|(kind, count)| format!("{kind}x{count}"))
        .collect();
    format!(
        "sim seed {}: {} nodes, {}: faults [{}]; {:.1} simulated s in {:.1} s; {} ops checked; \
         {} hand-offs judged; {} watch events judged; {} elections; {} states compared; {} unsynced batches lost; {} moves ({} failed); nodes added \
         {:?}, gone {:?} (wiped and back {:?}, excluded {:?}), final voters {:?}; {} late writes ({} rejected); trace {:016x}; {} violation(s)",
        report.seed,
        report.nodes,
        report.profile,
        faults.join(" "),
        report.simulated_ms as f64 / 1_000.0,
        wall_s,
        report.ops_checked,
        report.hand_offs_judged,
        report.watch_events_judged,
        report.elections,
        report.states_compared,
        report.lost_unsynced_batches,
        report.moves_done,
        report.moves_failed,
        report.nodes_added,
        report.nodes_gone,
        report.nodes_wiped,
        report.nodes_excluded,
        report.final_voters,
        report.late_writes,
        report.late_writes_rejected,
        report.trace_hash,
        report.violations.len()
    )
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let work_dir = args.work_dir.clone().unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&work_dir).context("creating the work directory")?;
    let started = Instant::now();
    let mut summary = Summary {
        seeds: 0,
        first_seed: args.first_seed,
        simulated_s: 0.0,
        wall_s: 0.0,
        simulated_s_per_wall_s: 0.0,
        ops_checked: 0,
        hand_offs_judged: 0,
        watch_events_judged: 0,
        elections: 0,
        states_compared: 0,
        lost_unsynced_batches: 0,
        moves_done: 0,
        moves_failed: 0,
        nodes_gone: 0,
        seeds_ending_with_voters_on_gone_nodes: 0,
        nodes_wiped: 0,
        nodes_excluded: 0,
        wipes_in_birth_window: 0,
        wipes_unpinned: 0,
        nodes_added: 0,
        late_writes: 0,
        late_writes_rejected: 0,
        nemeses: BTreeMap::new(),
        inconclusive: 0,
        violations: Vec::new(),
    };
    let mut simulated_ms: u64 = 0;
    for seed in args.first_seed..args.first_seed.saturating_add(args.seeds) {
        let mut options = SimOptions::for_seed(seed);
        options.fault_ms = args.fault_s.saturating_mul(1_000);
        options.work_dir = work_dir.clone();
        if let Some(nodes) = args.nodes {
            options.nodes = nodes;
        }
        if let Some(Kinds(kinds)) = &args.nemesis {
            options.nemeses = Some(kinds.clone());
        }
        if let Some(warmup_ms) = args.warmup_ms {
            options.warmup_ms = warmup_ms;
        }
        options.negative_control = args.negative_control;
        let seed_started = Instant::now();
        let report = run(&options).with_context(|| format!("seed {seed}"))?;
        let wall_s = seed_started.elapsed().as_secs_f64();
        summary.seeds += 1;
        simulated_ms += report.simulated_ms;
        summary.ops_checked += report.ops_checked;
        summary.hand_offs_judged += report.hand_offs_judged;
        summary.watch_events_judged += report.watch_events_judged;
        summary.elections += report.elections;
        summary.states_compared += report.states_compared;
        summary.lost_unsynced_batches += report.lost_unsynced_batches;
        summary.moves_done += report.moves_done;
        summary.moves_failed += report.moves_failed;
        summary.nodes_gone += report.nodes_gone.len() as u64;
        summary.nodes_wiped += report.nodes_wiped.len() as u64;
        summary.wipes_in_birth_window += report.wipes_in_birth_window;
        summary.wipes_unpinned += report.wipes_unpinned;
        summary.nodes_added += report.nodes_added.len() as u64;
        summary.nodes_excluded += report
            .nodes_excluded
            .iter()
            .filter(|node| report.nodes_wiped.contains(node))
            .count() as u64;
        if report.voters_on_gone_nodes > 0 {
            summary.seeds_ending_with_voters_on_gone_nodes += 1;
        }
        summary.late_writes += report.late_writes;
        summary.late_writes_rejected += report.late_writes_rejected;
        summary.inconclusive += report.inconclusive.len() as u64;
        for what in &report.inconclusive {
            println!(
                "sim seed {}: inconclusive (not a pass): {what}",
                report.seed
            );
        }
        for (kind, count) in &report.faults {
            *summary.nemeses.entry(kind.clone()).or_default() += count;
        }
        if !report.violations.is_empty() {
            println!("{}", line(&report, wall_s));
            for violation in &report.violations {
                println!("  {violation}");
            }
            println!(
                "  replay: cargo run --release -p tenure-tests --bin sim -- --seed {seed} --seeds 1 --verbose"
            );
            summary.violations.push(SeedViolation {
                seed,
                broke: report.violated.clone(),
                details: report.violations.clone(),
            });
        } else if args.verbose {
            println!("{}", line(&report, wall_s));
        }
        if summary.seeds % 100 == 0 {
            let elapsed = started.elapsed().as_secs_f64();
            println!(
                "sim: {} seeds, {:.0} simulated s in {:.0} s, {} ops checked, {} seed(s) with violations",
                summary.seeds,
                simulated_ms as f64 / 1_000.0,
                elapsed,
                summary.ops_checked,
                summary.violations.len()
            );
        }
    }
    summary.simulated_s = simulated_ms as f64 / 1_000.0;
    summary.wall_s = started.elapsed().as_secs_f64();
    summary.simulated_s_per_wall_s = if summary.wall_s > 0.0 {
        summary.simulated_s / summary.wall_s
    } else {
        0.0
    };
    println!(
        "sim summary: {} seeds, {:.1} simulated h, {:.0} wall s ({:.1} simulated s per wall s), {} ops checked, {} hand-offs judged, {} watch events judged, {} elections, {} replica moves ({} failed), {} nodes added, {} nodes taken out for good ({} seeds ended with a voter still on one; {} came back wiped under their old id, {} of them in the birth window, {} of them excluded, 0 admitted or the seed fails; {} wipes of a node nobody had pinned), nemeses {:?}, {} seed(s) with violations",
        summary.seeds,
        summary.simulated_s / 3_600.0,
        summary.wall_s,
        summary.simulated_s_per_wall_s,
        summary.ops_checked,
        summary.hand_offs_judged,
        summary.watch_events_judged,
        summary.elections,
        summary.moves_done,
        summary.moves_failed,
        summary.nodes_added,
        summary.nodes_gone,
        summary.seeds_ending_with_voters_on_gone_nodes,
        summary.nodes_wiped,
        summary.wipes_in_birth_window,
        summary.nodes_excluded,
        summary.wipes_unpinned,
        summary.nemeses,
        summary.violations.len()
    );
    if let Some(path) = &args.summary_json {
        let text = serde_json::to_string_pretty(&summary).context("encoding the summary")?;
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    if !summary.violations.is_empty() {
        std::process::exit(1);
    }
    Ok(())
}
