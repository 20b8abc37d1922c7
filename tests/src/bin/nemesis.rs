//! `nemesis`: the fault-injection suite's long mode, and the processes of a run.
//!
//! - `nemesis --runs N --duration 60s --summary-json FILE [...]`: N seeded runs against real
//!   clusters of node processes; prints each run's summary and every violation with its slice
//!   of history; writes a JSON summary (`runs`, `nemeses`, `ops_checked`, `violations`, and per
//!   run details). Run `i` uses seed `--seed + i`; by default runs rotate through every nemesis
//!   alone and then all of them combined, alternating 3 and 5 nodes (5 for a membership fault
//!   alone). A failing run prints the
//!   command that replays its schedule. Exit status 1 when any run found a violation.
//! - `nemesis node --config FILE`: one node (what `tenure serve` runs).
//! - `nemesis client ...`: one client process of a run (see `tenure_tests::harness::workload`).
//! - `nemesis zombie ...`: the fencing demo's holder (see `tenure_tests::harness::zombie`).
//!
//! Must not depend on: anything but the `tenure_tests` and `tenure_server` libraries.

// A command-line report: standard output is its interface.
#![allow(clippy::print_stdout)]

use std::collections::BTreeMap;
use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand, ValueEnum};
use tenure_core::NegativeControl;
use tenure_tests::harness::locker::{LockArgs, lock_child_main};
use tenure_tests::harness::network::NetworkRequest;
use tenure_tests::harness::run::{KeepDir, RunConfig, RunReport, run_one};
use tenure_tests::harness::schedule::FaultKind;
use tenure_tests::harness::workload::{WorkerArgs, worker_main};
use tenure_tests::harness::zombie::{ZombieArgs, zombie_main};
use tracing_subscriber::EnvFilter;

/// The tenure fault-injection suite.
#[derive(Debug, Parser)]
#[command(name = "nemesis", about, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Cmd>,
    #[command(flatten)]
    runs: RunArgs,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run one node (the same function as `tenure serve`).
    #[command(hide = true)]
    Node {
        /// The node's configuration.
        #[arg(long)]
        config: PathBuf,
    },
    /// Run one client process of a fault run.
    #[command(hide = true)]
    Client(ClientArgs),
    /// Run the fencing demo's holder.
    #[command(hide = true)]
    Zombie(ZombieCliArgs),
    /// The command a fault run's `tenurectl lock` runs: writes signs of life, then exits.
    #[command(hide = true)]
    LockChild {
        /// Where the signs of life go.
        #[arg(long)]
        out: PathBuf,
        /// How long it works, in milliseconds.
        #[arg(long)]
        hold_ms: u64,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// Each nemesis alone, in turn, then all of them combined.
    Cycle,
    /// The chosen nemeses, one at a time.
    Alone,
    /// The chosen nemeses overlapping.
    Combined,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum NetworkArg {
    /// Namespaces and iptables when running as root, else loopback and the fault layer.
    Auto,
    /// Namespaces and iptables, or fail.
    Namespaces,
    /// Loopback and the nodes' fault layer.
    Loopback,
}

#[derive(Debug, Args)]
struct RunArgs {
    /// Number of runs.
    #[arg(long, default_value_t = 1)]
    runs: u64,
    /// How long each run's nemesis runs (e.g. 60s, 2m).
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Write the JSON summary here.
    #[arg(long, value_name = "FILE")]
    summary_json: Option<PathBuf>,
    /// Seed of the first run (run i uses seed + i) [default: from the operating system].
    #[arg(long)]
    seed: Option<u64>,
    /// Node processes per run [default: 3 and 5 alternately].
    #[arg(long, value_parser = clap::value_parser!(u64).range(3..=9))]
    nodes: Option<u64>,
    /// Nemeses to use: `all` or a comma-separated list of kill, pause-node, pause-client,
    /// partition-leader, partition-halves, partition-bridge, clock-rate, clock-jump, slow-disk,
    /// move-replica, add-node, drain-node, remove-node, replace-node (the last five on 5 or
    /// more nodes).
    #[arg(long, default_value = "all")]
    nemesis: String,
    /// How runs use the nemeses.
    #[arg(long, value_enum, default_value_t = Mode::Cycle)]
    mode: Mode,
    /// Where the nodes run.
    #[arg(long, value_enum, default_value_t = NetworkArg::Auto)]
    network: NetworkArg,
    /// Raft groups.
    #[arg(long, default_value_t = 8)]
    groups: u32,
    /// Client processes per run.
    #[arg(long, default_value_t = 3)]
    clients: u32,
    /// Tasks (holders) per client process.
    #[arg(long, default_value_t = 4)]
    tasks: u32,
    /// Resources in the contended keyspace.
    #[arg(long, default_value_t = 12)]
    resources: u32,
    /// Lease ttl in milliseconds (at least the cluster's minimum, 2,700 with the run's timing).
    #[arg(long, default_value_t = 3_000)]
    ttl_ms: u64,
    /// Where run directories go [default: the system's temporary directory].
    #[arg(long, value_name = "DIR")]
    work_dir: Option<PathBuf>,
    /// Keep every run's directory (failing runs keep theirs anyway).
    #[arg(long)]
    keep_dirs: bool,
    /// Break a guarantee on purpose, to see the checker fail: skip-expiry-check,
    /// disable-deduplication, reset-tokens-on-new-leader, expire-by-wall-clock,
    /// ignore-founder-pins (needs a wipe in the birth window: the simulation has one).
    #[arg(long, default_value = "none", value_parser = parse_negative_control)]
    negative_control: NegativeControl,
}

fn parse_negative_control(name: &str) -> Result<NegativeControl, String> {
    NegativeControl::parse(name).ok_or_else(|| format!("unknown negative control {name:?}"))
}

#[derive(Debug, Args)]
struct ClientArgs {
    #[arg(long)]
    cluster: PathBuf,
    #[arg(long)]
    process: u32,
    #[arg(long)]
    tasks: u32,
    #[arg(long)]
    seed: u64,
    #[arg(long)]
    tenant: String,
    #[arg(long, value_delimiter = ',')]
    resources: Vec<String>,
    #[arg(long)]
    ttl_ms: u64,
    #[arg(long)]
    store: PathBuf,
    #[arg(long)]
    resolve_timeout_ms: u64,
    #[arg(long)]
    run_tag: String,
    /// `tenurectl`, to run `tenurectl lock` beside the tasks (with --lock-name and --lock-dir).
    #[arg(long, requires_all = ["lock_name", "lock_dir"])]
    lock_tenurectl: Option<PathBuf>,
    #[arg(long)]
    lock_name: Option<String>,
    #[arg(long)]
    lock_dir: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct ZombieCliArgs {
    #[arg(long)]
    cluster: PathBuf,
    #[arg(long)]
    tenant: String,
    #[arg(long)]
    resource: String,
    #[arg(long)]
    holder: String,
    #[arg(long)]
    ttl_ms: u64,
    #[arg(long)]
    store: PathBuf,
    #[arg(long)]
    work_ms: u64,
}

fn init_tracing(default: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Some(Cmd::Node { config }) => run_node(&config),
        Some(Cmd::Client(args)) => {
            init_tracing("warn");
            worker_main(WorkerArgs {
                cluster_file: args.cluster,
                process: args.process,
                tasks: args.tasks,
                seed: args.seed,
                tenant: args.tenant,
                resources: args.resources,
                ttl_ms: args.ttl_ms,
                store: args.store,
                resolve_timeout_ms: args.resolve_timeout_ms,
                run_tag: args.run_tag,
                lock: match (args.lock_tenurectl, args.lock_name, args.lock_dir) {
                    (Some(tenurectl), Some(name), Some(dir)) => Some(LockArgs {
                        tenurectl,
                        name,
                        dir,
                    }),
                    _ => None,
                },
            })
            .map_err(anyhow::Error::new)
            .map(|()| true)
        }
        Some(Cmd::Zombie(args)) => {
            init_tracing("warn");
            zombie_main(ZombieArgs {
                cluster_file: args.cluster,
                tenant: args.tenant,
                resource: args.resource,
                holder: args.holder,
                ttl_ms: args.ttl_ms,
                store: args.store,
                work_ms: args.work_ms,
            })
            .map_err(anyhow::Error::new)
            .map(|()| true)
        }
        Some(Cmd::LockChild { out, hold_ms }) => lock_child_main(&out, hold_ms)
            .map_err(anyhow::Error::new)
            .map(|()| true),
        None => {
            init_tracing("warn");
            run_many(&cli.runs)
        }
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(error) => {
            eprintln!("nemesis: {error:#}");
            ExitCode::from(2)
        }
    }
}

fn run_node(config: &std::path::Path) -> anyhow::Result<bool> {
    init_tracing("info,openraft=warn");
    tenure_server::serve::abort_on_panic();
    let config = tenure_server::config::load(config).context("loading the configuration")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    runtime
        .block_on(tenure_server::serve::serve_until_signalled(config))
        .context("node")?;
    Ok(true)
}

fn parse_kinds(text: &str) -> anyhow::Result<Vec<FaultKind>> {
    if text.trim() == "all" {
        return Ok(FaultKind::FAULT_SUITE.to_vec());
    }
    FaultKind::parse_list(text, &FaultKind::FAULT_SUITE).map_err(anyhow::Error::msg)
}

/// Run `index`'s kinds and whether they overlap.
fn profile(mode: Mode, kinds: &[FaultKind], index: u64) -> (Vec<FaultKind>, bool) {
    match mode {
        Mode::Alone => (kinds.to_vec(), false),
        Mode::Combined => (kinds.to_vec(), true),
        Mode::Cycle => {
            let slots = kinds.len() as u64 + 1;
            let slot = usize::try_from(index % slots).unwrap_or(0);
            match kinds.get(slot) {
                Some(kind) => (vec![*kind], false),
                None => (kinds.to_vec(), true),
            }
        }
    }
}

fn run_many(args: &RunArgs) -> anyhow::Result<bool> {
    let exe = std::env::current_exe().context("finding the nemesis executable")?;
    let kinds = parse_kinds(&args.nemesis)?;
    let base_seed = args.seed.unwrap_or_else(rand::random);
    let network = match args.network {
        NetworkArg::Auto => NetworkRequest::Auto,
        NetworkArg::Namespaces => NetworkRequest::Namespaces,
        NetworkArg::Loopback => NetworkRequest::Loopback,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the runtime")?;
    println!(
        "nemesis: {} run(s) of {:?} from seed {base_seed}",
        args.runs, args.duration
    );
    let started = Instant::now();
    let mut reports: Vec<RunReport> = Vec::new();
    let mut failures: Vec<serde_json::Value> = Vec::new();
    let mut violations_json = Vec::new();
    for index in 0..args.runs {
        let seed = base_seed.wrapping_add(index);
        let (run_kinds, combined) = profile(args.mode, &kinds, index);
        // Membership faults need a node more than the replicas of a group: 5 nodes for them.
        let membership_only = run_kinds.iter().all(|kind| kind.is_membership());
        let nodes = args.nodes.unwrap_or(if index % 2 == 0 && !membership_only {
            3
        } else {
            5
        });
        let mut config = RunConfig::new(seed, exe.clone(), run_kinds.clone());
        config.nodes = nodes;
        config.groups = args.groups;
        config.duration = args.duration;
        config.combined = combined;
        config.network = network;
        config.client_processes = args.clients;
        config.tasks_per_process = args.tasks;
        config.resources = args.resources;
        config.ttl_ms = args.ttl_ms;
        config.work_dir = args.work_dir.clone();
        config.negative_control = args.negative_control;
        config.keep = if args.keep_dirs {
            KeepDir::Always
        } else {
            KeepDir::OnFailure
        };
        let replay = format!(
            "nemesis --seed {seed} --runs 1 --nodes {nodes} --nemesis {} --mode {} --duration {} \
             --network {} --groups {} --clients {} --tasks {} --resources {} --ttl-ms {} \
             --negative-control {}",
            run_kinds
                .iter()
                .map(|k| k.name())
                .collect::<Vec<_>>()
                .join(","),
            if combined { "combined" } else { "alone" },
            humantime::format_duration(args.duration),
            match args.network {
                NetworkArg::Auto => "auto",
                NetworkArg::Namespaces => "namespaces",
                NetworkArg::Loopback => "loopback",
            },
            args.groups,
            args.clients,
            args.tasks,
            args.resources,
            args.ttl_ms,
            args.negative_control.name()
        );
        match runtime.block_on(run_one(&config)) {
            Ok(report) => {
                println!("run {}/{}: {}", index + 1, args.runs, report.summary_line());
                if let Some(reason) = &report.network_fallback_reason {
                    if report.network != "namespaces+iptables" {
                        println!("  network: {} ({reason})", report.network);
                    }
                }
                for skipped in &report.skipped {
                    println!("  skipped: {skipped}");
                }
                if !report.passed() {
                    println!("  FAILED; replay with: {replay}");
                    if let Some(dir) = &report.dir {
                        println!("  run directory: {}", dir.display());
                    }
                    for violation in &report.violations {
                        println!("  {}", violation.describe(report.origin_ns));
                        violations_json.push(serde_json::json!({
                            "run": index + 1,
                            "seed": seed,
                            "nodes": nodes,
                            "property": violation.property.name(),
                            "resource": violation.resource,
                            "message": violation.message,
                            "slice": violation.describe(report.origin_ns),
                            "replay": replay,
                        }));
                    }
                }
                reports.push(report);
            }
            Err(error) => {
                println!(
                    "run {}/{} (seed {seed}) could not complete: {error}",
                    index + 1,
                    args.runs
                );
                println!("  replay with: {replay}");
                failures.push(serde_json::json!({
                    "run": index + 1,
                    "seed": seed,
                    "error": error.to_string(),
                    "replay": replay,
                }));
            }
        }
    }
    let mut nemeses: BTreeMap<String, u64> = BTreeMap::new();
    for report in &reports {
        for (kind, count) in &report.nemeses {
            *nemeses.entry(kind.clone()).or_insert(0) += count;
        }
    }
    let ops_checked: u64 = reports.iter().map(|r| r.check.ops_checked).sum();
    let violation_count: usize = reports.iter().map(|r| r.violations.len()).sum();
    println!(
        "nemesis: {} run(s) completed, {} could not run; {} faults applied; {} operations \
         checked; {} violation(s); {:.0}s",
        reports.len(),
        failures.len(),
        nemeses.values().sum::<u64>(),
        ops_checked,
        violation_count,
        started.elapsed().as_secs_f64()
    );
    if let Some(path) = &args.summary_json {
        let summary = serde_json::json!({
            "runs": reports.len(),
            "runs_requested": args.runs,
            "nemeses": nemeses,
            "ops_checked": ops_checked,
            "violations": violations_json,
            "runs_failed_to_complete": failures,
            "seed": base_seed,
            "duration_s": args.duration.as_secs_f64(),
            "elapsed_s": started.elapsed().as_secs_f64(),
            "late_fenced_writes": reports.iter().map(|r| r.check.late_writes).sum::<u64>(),
            "late_fenced_writes_rejected": reports.iter().map(|r| r.check.late_writes_rejected).sum::<u64>(),
            "replays_compared": reports.iter().map(|r| r.check.replays_compared).sum::<u64>(),
            "ops_unknown": reports.iter().map(|r| r.ops_unknown).sum::<u64>(),
            "elections_observed": reports.iter().map(|r| r.elections_observed).sum::<u64>(),
            "per_run": reports.iter().map(|r| serde_json::json!({
                "seed": r.seed,
                "nodes": r.nodes,
                "network": r.network,
                "profile": r.profile,
                "nemeses": r.nemeses,
                "ops_checked": r.check.ops_checked,
                "ops_unknown": r.ops_unknown,
                "violations": r.violations.len(),
                "recovered_after_s": r.recovered_after_s,
                "elections_observed": r.elections_observed,
                "elapsed_s": r.elapsed_s,
                "op_counts": r.op_counts,
            })).collect::<Vec<_>>(),
        });
        std::fs::write(path, serde_json::to_string_pretty(&summary)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("nemesis: summary written to {}", path.display());
    }
    Ok(violation_count == 0 && failures.is_empty())
}
