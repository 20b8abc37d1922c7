//! `loadgen`: runs one lease workload against one target and reports it.
//!
//! ```text
//! loadgen --target tenure --cluster tenure-dev/cluster.json --scenario mixed --duration 20s \
//!     --report-json mixed.json --plot mixed.svg
//! loadgen --target etcd --endpoints 127.0.0.1:2379,127.0.0.1:22379 --scenario mixed --duration 20s
//! loadgen --target tenure --cluster DIR/cluster.json --scenario scale --leases 1000000 \
//!     --tenure-bin target/release/tenure --dev-dir DIR --report-json scale.json --plot scale.svg
//! ```
//!
//! While running it prints one progress line per second to stderr (ops/s, p50, p99, errors by
//! code); at the end a table per operation to stdout, and the JSON report and SVG plot when
//! asked. See the crate documentation and `loadgen/README.md`.

#![allow(clippy::print_stdout)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use clap::{Parser, ValueEnum};
use serde_json::json;
use tenure_client::{Client, ClientConfig, Credentials, Endpoint};
use tenure_loadgen::keys::{KeyChooser, KeyDistribution};
use tenure_loadgen::node_control::DevControl;
use tenure_loadgen::report::Report;
use tenure_loadgen::scenario::scale::{ScaleConfig, ScaleNode};
use tenure_loadgen::scenario::{self, LoadConfig, Mix, ScenarioKind, SessionEnd};

/// mimalloc instead of glibc's malloc: allocation was about 15% of a node's CPU under load
/// (perf), much of it `_int_malloc` and `malloc_consolidate`.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
use tenure_loadgen::target::http::{HttpCredentials, HttpTarget};
use tenure_loadgen::target::tenure::TenureTarget;
use tenure_loadgen::target::{Target, TargetKind};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Distribution {
    Uniform,
    Zipf,
}

/// Lease workloads against tenure (native or HTTP) and etcd.
#[derive(Debug, Parser)]
#[command(name = "loadgen", version)]
struct Args {
    /// The service to drive.
    #[arg(long, value_enum)]
    target: TargetKind,
    /// tenure's cluster.json (from `tenure dev`): nodes, their HTTP addresses and the CA.
    #[arg(long)]
    cluster: Option<PathBuf>,
    /// Comma-separated endpoints instead of --cluster: `[id@]host:port` (tenure),
    /// `http://host:port` (tenure-http), `host:port` (etcd).
    #[arg(long)]
    endpoints: Option<String>,
    /// The cluster CA certificate (tenure with --endpoints).
    #[arg(long)]
    ca_cert: Option<PathBuf>,
    /// Bearer token (tenure, tenure-http); without it, insecure development mode.
    #[arg(long, env = "TENURE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Principal named in insecure development mode.
    #[arg(long, default_value = "loadgen")]
    principal: String,
    /// Tenant of every resource (tenure) or key prefix (etcd).
    #[arg(long, default_value = "loadgen")]
    tenant: String,
    /// The workload.
    #[arg(long, value_enum, default_value = "mixed")]
    scenario: ScenarioKind,
    /// Measured time (hold: the steady window; expiry: the bound of the whole run).
    #[arg(long, default_value = "20s", value_parser = tenure_loadgen::parse_duration)]
    duration: Duration,
    /// Unmeasured time first (acquire, mixed, contended).
    #[arg(long, default_value = "0s", value_parser = tenure_loadgen::parse_duration)]
    warmup: Duration,
    /// Concurrent workers (closed loop: operations in flight).
    #[arg(long, default_value_t = 256)]
    workers: usize,
    /// Open loop: operations per second, all workers together (latency from intended start).
    #[arg(long)]
    rate: Option<f64>,
    /// Keys in the keyspace (default: mixed 1000000, contended 1000, expiry background 100000).
    #[arg(long)]
    keyspace: Option<u64>,
    /// Key distribution (default: zipf for contended, uniform otherwise).
    #[arg(long, value_enum)]
    distribution: Option<Distribution>,
    /// Zipf exponent.
    #[arg(long, default_value_t = 1.1)]
    zipf_s: f64,
    /// Operation weights, e.g. `acquire=20,renew=70,release=10,get=0`.
    #[arg(long, value_parser = Mix::parse)]
    mix: Option<Mix>,
    /// Lease ttl (default: hold 30s, expiry 5s, scale 300s (its individually held leases),
    /// otherwise 15s).
    #[arg(long, value_parser = tenure_loadgen::parse_duration)]
    ttl: Option<Duration>,
    /// Leases of hold (default 100000), expiry (default 10000) and scale (default 1000000).
    #[arg(long)]
    leases: Option<u64>,
    /// hold and expiry, tenure only: hold the leases under this many sessions (one keep-alive
    /// per session and group instead of a renewal per lease); 0 gives each lease its own ttl
    /// (the default). expiry with sessions needs --cluster: it reads the nodes' /metrics.
    /// scale: the sessions of its session share (0: one per 10000 leases, 1 to 1000).
    #[arg(long, default_value_t = 0)]
    sessions: u64,
    /// scale: percent of the leases bound to sessions (the rest are held on their own, renewed
    /// by the client library).
    #[arg(long, default_value_t = 90)]
    session_share_percent: u32,
    /// scale: ttl of its sessions.
    #[arg(long, default_value = "30s", value_parser = tenure_loadgen::parse_duration)]
    session_ttl: Duration,
    /// scale: leases of the expiry storm, taken from the session share [default: leases/10, at
    /// most 1000000].
    #[arg(long)]
    storm_leases: Option<u64>,
    /// scale: most leases of one tenant (a tenant's quota is cluster-wide; default half of
    /// tenure's default quota).
    #[arg(long, default_value_t = 500_000)]
    leases_per_tenant: u64,
    /// scale: the foreground mix's open-loop rate, operations per second.
    #[arg(long, default_value_t = 500.0)]
    foreground_rate: f64,
    /// scale: workers of the acquire phase, each with one Batch of session acquires (or a few
    /// individual acquires) in flight; few enough that the foreground keeps its rate.
    #[arg(long, default_value_t = 16)]
    acquire_workers: usize,
    /// scale: length of the saturated mixed phase (the throughput reference).
    #[arg(long, default_value = "10s", value_parser = tenure_loadgen::parse_duration)]
    saturation: Duration,
    /// scale: bound of a failover's probes, of a restarted node's catch-up, and (each) of the
    /// new node's join and of the move of a replica to it.
    #[arg(long, default_value = "120s", value_parser = tenure_loadgen::parse_duration)]
    node_bound: Duration,
    /// scale: the `tenure` executable that runs `tenure dev kill|start|status|add` [default:
    /// `tenure` beside this executable, else on the PATH].
    #[arg(long)]
    tenure_bin: Option<PathBuf>,
    /// scale: the running `tenure dev`'s directory [default: the directory of --cluster].
    #[arg(long)]
    dev_dir: Option<PathBuf>,
    /// expiry with sessions: let the sessions expire (one last keep-alive to every record, then
    /// none) or close them.
    #[arg(long, value_enum, default_value = "expire")]
    session_end: SessionEnd,
    /// handoff: the waiter counts to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,10,1000")]
    waiters: Vec<u64>,
    /// Bound of the acquire phase of hold (a target too slow to renew what it holds stops
    /// there) and scale [default: hold 120s, scale 120s + 1 s per 2000 leases].
    #[arg(long, value_parser = tenure_loadgen::parse_duration)]
    acquire_phase_max: Option<Duration>,
    /// Leases a mixed/contended worker keeps for renew and release.
    #[arg(long, default_value_t = 1000)]
    held_per_worker: usize,
    /// Seed of the workload's random choices.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Write the JSON report here.
    #[arg(long)]
    report_json: Option<PathBuf>,
    /// Write the SVG plot here.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// No progress lines.
    #[arg(long)]
    quiet: bool,
}

#[derive(serde::Deserialize)]
struct ClusterJson {
    nodes: Vec<ClusterNode>,
}

#[derive(serde::Deserialize)]
struct ClusterNode {
    id: Option<u64>,
    http: Option<String>,
}

/// The nodes of a `cluster.json` with both an id and an HTTP address.
fn cluster_nodes(cluster: &std::path::Path) -> anyhow::Result<Vec<ScaleNode>> {
    let text = std::fs::read_to_string(cluster)
        .with_context(|| format!("reading {}", cluster.display()))?;
    let parsed: ClusterJson = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a cluster file", cluster.display()))?;
    Ok(parsed
        .nodes
        .into_iter()
        .filter_map(|node| {
            Some(ScaleNode {
                id: node.id?,
                http_url: node.http?,
            })
        })
        .collect())
}

/// The `tenure` executable: beside this one when it is there, else on the PATH.
fn default_tenure_bin() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join("tenure")))
        .filter(|path| path.is_file())
        .unwrap_or_else(|| PathBuf::from("tenure"))
}

/// The nodes' HTTP addresses in a `cluster.json`.
fn cluster_http_urls(cluster: &std::path::Path) -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string(cluster)
        .with_context(|| format!("reading {}", cluster.display()))?;
    let parsed: ClusterJson = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a cluster file", cluster.display()))?;
    Ok(parsed
        .nodes
        .into_iter()
        .filter_map(|node| node.http)
        .collect())
}

fn split_list(text: &str) -> Vec<String> {
    text.split(',')
        .map(str::trim)
        .filter(|part| !part.is_empty())
        .map(str::to_owned)
        .collect()
}

async fn connect(args: &Args, run_tag: u32) -> anyhow::Result<Target> {
    match args.target {
        TargetKind::Tenure => {
            let credentials = match &args.token {
                Some(token) => Credentials::Token(token.clone()),
                None => Credentials::InsecureDev {
                    principal_id: args.principal.clone(),
                },
            };
            let config = match (&args.cluster, &args.endpoints) {
                (Some(cluster), _) => ClientConfig::from_cluster_file(cluster, credentials)?,
                (None, Some(endpoints)) => {
                    let ca = args
                        .ca_cert
                        .as_ref()
                        .context("--endpoints for tenure needs --ca-cert")?;
                    let ca_pem = std::fs::read_to_string(ca)
                        .with_context(|| format!("reading {}", ca.display()))?;
                    ClientConfig::new(Endpoint::parse_list(endpoints)?, ca_pem, credentials)
                }
                (None, None) => bail!("tenure needs --cluster FILE or --endpoints"),
            };
            let client = Client::connect(config).await?;
            Ok(Target::Tenure(TenureTarget::new(
                client,
                args.tenant.clone(),
            )))
        }
        TargetKind::TenureHttp => {
            let urls = match (&args.cluster, &args.endpoints) {
                (_, Some(endpoints)) => split_list(endpoints),
                (Some(cluster), None) => cluster_http_urls(cluster)?,
                (None, None) => bail!("tenure-http needs --cluster FILE or --endpoints"),
            };
            let credentials = match &args.token {
                Some(token) => HttpCredentials::Token(token.clone()),
                None => HttpCredentials::InsecureDev {
                    principal_id: args.principal.clone(),
                },
            };
            Ok(Target::Http(Box::new(HttpTarget::new(
                urls,
                args.tenant.clone(),
                credentials,
                run_tag,
            )?)))
        }
        TargetKind::Etcd => connect_etcd(args).await,
    }
}

#[cfg(feature = "etcd")]
async fn connect_etcd(args: &Args) -> anyhow::Result<Target> {
    let endpoints: Vec<String> = split_list(
        args.endpoints
            .as_deref()
            .context("etcd needs --endpoints HOST:PORT,...")?,
    )
    .into_iter()
    .map(|endpoint| {
        if endpoint.contains("://") {
            endpoint
        } else {
            format!("http://{endpoint}")
        }
    })
    .collect();
    let target =
        tenure_loadgen::target::etcd::EtcdTarget::connect(&endpoints, format!("/{}", args.tenant))
            .await?;
    Ok(Target::Etcd(Box::new(target)))
}

#[cfg(not(feature = "etcd"))]
async fn connect_etcd(_args: &Args) -> anyhow::Result<Target> {
    bail!(
        "this loadgen was built without the `etcd` feature: cargo build --release -p tenure-loadgen --features etcd"
    )
}

/// The scale scenario: a `tenure dev` cluster (its nodes from --cluster), driven through the
/// `tenure` executable.
async fn run_scale(
    args: &Args,
    config: &LoadConfig,
    target: Arc<tenure_loadgen::target::Target>,
) -> anyhow::Result<scenario::RunOutcome> {
    if args.target != TargetKind::Tenure {
        bail!("scale runs against --target tenure (the native client)");
    }
    let Some(cluster) = &args.cluster else {
        bail!("scale needs --cluster (the tenure dev cluster's cluster.json)");
    };
    if args.rate.is_some() {
        bail!("scale's foreground rate is --foreground-rate, not --rate");
    }
    let dev_dir = match &args.dev_dir {
        Some(dir) => dir.clone(),
        None => cluster
            .parent()
            .map(std::path::Path::to_path_buf)
            .context("--dev-dir: the directory of --cluster is unknown")?,
    };
    let tenure_bin = args.tenure_bin.clone().unwrap_or_else(default_tenure_bin);
    let control = Arc::new(DevControl::new(tenure_bin, dev_dir));
    let scale = ScaleConfig {
        leases: config.leases,
        session_share_percent: args.session_share_percent,
        sessions: (args.sessions > 0).then_some(args.sessions),
        session_ttl: args.session_ttl,
        individual_ttl: config.ttl,
        storm_leases: args.storm_leases,
        leases_per_tenant: args.leases_per_tenant,
        foreground_rate_ops_per_s: args.foreground_rate,
        saturation: args.saturation,
        window: args.duration,
        workers: args.workers,
        acquire_workers: args.acquire_workers,
        acquire_phase_max: config.acquire_phase_max,
        node_bound: args.node_bound,
        settle: Duration::from_secs(3),
        nodes: cluster_nodes(cluster)?,
        keys: config.keys.clone(),
        mix: config.mix,
        seed: config.seed,
        run_tag: config.run_tag,
        progress: config.progress,
    };
    Ok(scenario::scale::run_scale(target, &scale, control).await?)
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    runtime.block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let scenario = args.scenario;
    let keyspace = args.keyspace.unwrap_or(match scenario {
        ScenarioKind::Contended => 1000,
        ScenarioKind::Expiry => 100_000,
        _ => 1_000_000,
    });
    let distribution = match args
        .distribution
        .unwrap_or(if scenario == ScenarioKind::Contended {
            Distribution::Zipf
        } else {
            Distribution::Uniform
        }) {
        Distribution::Uniform => KeyDistribution::Uniform,
        Distribution::Zipf => KeyDistribution::Zipf {
            exponent: args.zipf_s,
        },
    };
    let keys = KeyChooser::new(keyspace, distribution)?;
    let ttl = args.ttl.unwrap_or(match scenario {
        ScenarioKind::Hold => Duration::from_secs(30),
        ScenarioKind::Expiry => Duration::from_secs(5),
        ScenarioKind::Scale => Duration::from_secs(300),
        _ => Duration::from_secs(15),
    });
    // etcd grants whole seconds: round up so every target holds leases of the same length.
    let ttl = if args.target == TargetKind::Etcd {
        Duration::from_secs(
            ttl.as_millis()
                .div_ceil(1000)
                .try_into()
                .unwrap_or(u64::MAX),
        )
    } else {
        ttl
    };
    let leases = args.leases.unwrap_or(match scenario {
        ScenarioKind::Expiry => 10_000,
        ScenarioKind::Scale => 1_000_000,
        _ => 100_000,
    });
    let acquire_phase_max = args.acquire_phase_max.unwrap_or(match scenario {
        ScenarioKind::Scale => Duration::from_secs(120 + leases / 2_000),
        _ => Duration::from_secs(120),
    });
    let run_tag = u32::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_micros()
            % u128::from(u32::MAX),
    )
    .unwrap_or(0);
    let config = LoadConfig {
        scenario,
        duration: args.duration,
        warmup: args.warmup,
        workers: args.workers,
        rate_ops_per_s: args.rate,
        keys,
        mix: args.mix.unwrap_or(Mix::MIXED),
        ttl,
        leases,
        held_per_worker_max: args.held_per_worker,
        acquire_phase_max,
        sessions: args.sessions,
        session_end: args.session_end,
        waiters: args.waiters.clone(),
        node_metrics_urls: match (&args.cluster, args.target) {
            (Some(cluster), TargetKind::Tenure | TargetKind::TenureHttp) => {
                cluster_http_urls(cluster)?
            }
            _ => Vec::new(),
        },
        seed: args.seed,
        run_tag,
        progress: !args.quiet,
    };
    let config_json = json!({
        "keyspace": keyspace,
        "distribution": format!("{distribution:?}"),
        "mix": config.mix,
        "ttl_ms": u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
        "leases": leases,
        "warmup_s": args.warmup.as_secs_f64(),
        "seed": args.seed,
        "run_tag": format!("{run_tag:08x}"),
        "held_per_worker": args.held_per_worker,
        "sessions": args.sessions,
    });
    let mut config_json = config_json;
    if scenario == ScenarioKind::Scale {
        config_json["scale"] = json!({
            "session_share_percent": args.session_share_percent,
            "session_ttl_ms": u64::try_from(args.session_ttl.as_millis()).unwrap_or(u64::MAX),
            "storm_leases": args.storm_leases,
            "leases_per_tenant": args.leases_per_tenant,
            "foreground_rate_ops_per_s": args.foreground_rate,
            "saturation_s": args.saturation.as_secs_f64(),
            "window_s": args.duration.as_secs_f64(),
            "acquire_phase_max_s": acquire_phase_max.as_secs_f64(),
            "node_bound_s": args.node_bound.as_secs_f64(),
        });
    }
    let target = Arc::new(connect(&args, run_tag).await?);
    if !args.quiet {
        eprintln!(
            "loadgen: target {} scenario {} ({}), run tag {run_tag:08x}",
            args.target.name(),
            scenario.name(),
            match args.rate {
                Some(rate) => format!("open loop at {rate} ops/s, {} workers", args.workers),
                None => format!("closed loop, {} workers", args.workers),
            }
        );
    }
    let outcome = if scenario == ScenarioKind::Scale {
        run_scale(&args, &config, target.clone()).await?
    } else {
        scenario::run(target.clone(), &config).await?
    };
    target.close().await;
    let rate = if scenario == ScenarioKind::Scale {
        Some(args.foreground_rate)
    } else {
        args.rate
    };
    let report = Report::new(
        args.target.name(),
        scenario.name(),
        args.workers,
        rate,
        outcome,
        config_json,
    );
    print!("{}", report.table());
    if let Some(path) = &args.report_json {
        report.write_json(path)?;
    }
    if let Some(path) = &args.plot {
        report.write_plot(path)?;
    }
    Ok(())
}
