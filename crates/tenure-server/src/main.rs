//! `tenure`: the node binary and its tools.
//!
//! - `tenure serve --config FILE`: runs one node until SIGINT or SIGTERM, then hands off its
//!   groups' leadership and exits. A configuration with test or insecure switches
//!   (`ServerConfig::insecure_switches`) is refused unless `--allow-insecure-loopback-only` is
//!   given and every address the node binds is loopback.
//! - `tenure dev [...]`: a local cluster of node processes (see `tenure_server::dev`).
//! - `tenure certs`: the cluster CA and node certificates (see `tenure_server::certs`).
//! - `tenure config-check --config FILE`: validates a configuration and prints it in full.
//! - `tenure hash-token TOKEN`: the SHA-256 a configuration stores for a bearer token.
//!
//! Exit codes: 0 success, 2 unusable configuration or command line, 1 any other failure.
//!
//! Must not depend on: anything but the `tenure_server` library's public API (all behaviour lives
//! there; this file parses the command line and reports errors).

use std::io::{IsTerminal, Read, Write};
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use tenure_server::{ServerError, certs, config, dev};
use tracing_subscriber::EnvFilter;

/// mimalloc instead of glibc's malloc: allocation was about 15% of a node's CPU under load
/// (perf), much of it `_int_malloc` and `malloc_consolidate`.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The tenure lease service node.
#[derive(Debug, Parser)]
#[command(name = "tenure", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run a node.
    Serve {
        /// The node's configuration file (TOML; see ops/config/tenure.example.toml).
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
        /// Accept the configuration's test and insecure switches (auth.insecure_dev_mode,
        /// [testing] fault_control, clock_rate_ppm, clock_offset_ms, negative_control), which are
        /// refused without this flag. Even with it they are refused unless every address the
        /// node binds is a loopback address. `tenure dev` passes it.
        #[arg(long = "allow-insecure-loopback-only")]
        allow_insecure_loopback_only: bool,
        /// Worker threads of the node's async runtime [default: the cores available to the
        /// process]. Nodes sharing a machine should split its cores between them (`tenure dev`
        /// gives each node `cores / nodes`, at least one).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=1024))]
        worker_threads: Option<u16>,
    },
    /// Run a local development cluster of node processes on 127.0.0.1 (INSECURE: principal
    /// headers are trusted without authentication).
    Dev(DevArgs),
    /// Generate the cluster CA and node certificates (never overwrites).
    Certs(CertsArgs),
    /// Validate a configuration file and print the effective configuration, defaults included.
    ConfigCheck {
        /// The configuration file.
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
    },
    /// Print the SHA-256 of a bearer token, for `[[auth.tokens]] sha256 = ...`. Pass `-` to read
    /// the token from standard input (keeps it out of the shell history).
    HashToken {
        /// The token, or `-`.
        token: String,
    },
}

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
struct DevArgs {
    /// Act on the cluster a running `tenure dev` supervises (from another terminal).
    #[command(subcommand)]
    action: Option<DevAction>,
    /// The cluster's directory; running again on it restarts the same cluster.
    #[arg(long, value_name = "DIR", default_value = dev::DEFAULT_DIR)]
    data_dir: PathBuf,
    /// Number of nodes [default: 3, or the directory's recorded value].
    #[arg(long)]
    nodes: Option<u32>,
    /// Number of groups [default: 4 per core available, 8 to 64 (8 on 2 cores), or the
    /// directory's recorded value].
    #[arg(long)]
    groups: Option<u32>,
    /// Node N listens on BASE+N (QUIC) and BASE+100+N (HTTP); 0 picks free ports [default: 7400,
    /// or the directory's recorded value].
    #[arg(long, value_name = "BASE")]
    base_port: Option<u16>,
    /// Whether nodes fsync before acknowledging [default: true, or the recorded value].
    #[arg(long, value_name = "BOOL")]
    fsync: Option<bool>,
    /// Stop by itself this many seconds after the cluster is ready.
    #[arg(long, value_name = "SECONDS")]
    duration_s: Option<u64>,
    /// Give up if the cluster is not ready within this many seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 120)]
    ready_timeout_s: u64,
    /// Restart a node that died by itself after this many seconds (doubled while it keeps dying
    /// within a minute of its start, at most 60) [default: only on `tenure dev restart N`].
    #[arg(long, value_name = "SECONDS")]
    restart_after_s: Option<u64>,
    /// Each node's lease-state budget (`limits.node_memory_budget_bytes`), which sizes every
    /// group's lease-record and request-id-record maxima; written into the nodes'
    /// configurations, kept by later runs [default: 12 GiB split over the nodes, or the
    /// recorded value].
    #[arg(long, value_name = "BYTES")]
    node_memory_budget_bytes: Option<u64>,
    /// A tenant's cluster-wide active-lease quota (`limits.tenant_active_leases_max`); written
    /// into the nodes' configurations, kept by later runs [default: 1000000, or the recorded
    /// value].
    #[arg(long, value_name = "LEASES")]
    tenant_active_leases_max: Option<u64>,
    /// Log entries between a group's snapshots (`timing.snapshot_every_entries`); written into
    /// the nodes' configurations, kept by later runs [default: 10000, or the recorded value].
    #[arg(long, value_name = "ENTRIES")]
    snapshot_every_entries: Option<u64>,
    /// Leases a group reclaims per second while its reclaim is on time
    /// (`timing.expire_paced_leases_per_s`, 0 = no pacing); written into the nodes'
    /// configurations, kept by later runs [default: 2500, or the recorded value].
    #[arg(long, value_name = "LEASES")]
    expire_paced_leases_per_s: Option<u32>,
    /// Expire commands a group proposes per second at most (`timing.expire_commands_per_s_max`);
    /// written into the nodes' configurations, kept by later runs [default: 20, or the recorded
    /// value].
    #[arg(long, value_name = "COMMANDS")]
    expire_commands_per_s_max: Option<u32>,
}

#[derive(Debug, Subcommand)]
enum DevAction {
    /// Every node's state, process id and readiness.
    Status(DevTarget),
    /// Stop node N gracefully (SIGTERM: it hands its leaderships off) and wait until it exits.
    Stop(DevNodeTarget),
    /// Kill node N (SIGKILL, as a crash would) and wait until it is gone.
    Kill(DevNodeTarget),
    /// Start a stopped or dead node N from its data and wait until it is ready.
    Start(DevNodeTarget),
    /// Stop node N (SIGTERM), start it again from its data and wait until it is ready.
    Restart(DevNodeTarget),
    /// Grow the running cluster by one node (the next id, or --node): a certificate from the
    /// cluster CA, a configuration that joins, `AddNode` in the node table, then the process;
    /// waits until it is ready. The placement controller then moves replicas to it.
    Add(DevAddTarget),
    /// Replace node N for good (as after a lost disk): kill it, drain and remove it from the
    /// node table (every node refuses it from then on), and add a new node (the next id) in its
    /// place; waits until the new node is ready. Its replicas are re-created on the active nodes.
    Replace(DevNodeTarget),
}

#[derive(Debug, Args)]
struct DevAddTarget {
    /// The new node's id [default: one more than the highest].
    #[arg(long, value_name = "ID")]
    node: Option<u64>,
    #[command(flatten)]
    target: DevTarget,
    /// How long to wait for the node to be ready.
    #[arg(long, value_name = "SECONDS", default_value_t = 60)]
    wait_s: u64,
}

#[derive(Debug, Args)]
struct DevTarget {
    /// The directory of the running `tenure dev`.
    #[arg(long, value_name = "DIR", default_value = dev::DEFAULT_DIR)]
    data_dir: PathBuf,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct DevNodeTarget {
    /// The node's id.
    node: u64,
    #[command(flatten)]
    target: DevTarget,
    /// How long to wait for the node to get where it was sent.
    #[arg(long, value_name = "SECONDS", default_value_t = 60)]
    wait_s: u64,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["config", "nodes"])))]
struct CertsArgs {
    /// Issue certificates for every peer of this configuration (IP SANs from their addresses,
    /// the configuration's cluster name). Without --out, writes into the directory of its
    /// `tls.ca_cert`.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["cluster", "ip"])]
    config: Option<PathBuf>,
    /// Issue certificates for these node ids (comma-separated), without a configuration.
    #[arg(long, value_name = "IDS", value_delimiter = ',')]
    nodes: Option<Vec<u64>>,
    /// The output directory (created if missing).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Issue certificates for --nodes from the existing cluster CA in this directory (`ca.pem`,
    /// `ca.key`): for nodes added to a running cluster. Writes into --out (default: this
    /// directory).
    #[arg(long, value_name = "DIR", conflicts_with_all = ["config", "cluster"])]
    ca_dir: Option<PathBuf>,
    /// The cluster name (with --nodes).
    #[arg(long, value_name = "NAME", default_value = "tenure")]
    cluster: String,
    /// IP addresses every node certificate is valid for (with --nodes; repeat or comma-separate).
    #[arg(
        long,
        value_name = "IP",
        value_delimiter = ',',
        default_value = "127.0.0.1"
    )]
    ip: Vec<IpAddr>,
}

/// A failure and the exit code it deserves.
struct Failure {
    code: u8,
    error: anyhow::Error,
}

impl Failure {
    fn config(error: impl Into<anyhow::Error>) -> Self {
        Failure {
            code: 2,
            error: error.into(),
        }
    }
}

impl<E: Into<anyhow::Error>> From<E> for Failure {
    fn from(error: E) -> Self {
        Failure {
            code: 1,
            error: error.into(),
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing();
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Cmd::Serve {
        worker_threads: Some(threads),
        ..
    } = &cli.command
    {
        builder.worker_threads(usize::from(*threads));
    }
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("tenure: cannot start the async runtime: {error}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(run(cli.command)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("tenure: {}", describe(&failure.error));
            ExitCode::from(failure.code)
        }
    }
}

/// The error and its causes, each cause left out when the message so far already says it (the
/// library's errors include their source's text).
fn describe(error: &anyhow::Error) -> String {
    let mut message = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if message.contains(&text) {
            continue;
        }
        if !message.is_empty() {
            message.push_str(": ");
        }
        message.push_str(&text);
    }
    message
}

fn init_tracing() {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,openraft=warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

async fn run(command: Cmd) -> Result<(), Failure> {
    match command {
        Cmd::Serve {
            config,
            allow_insecure_loopback_only,
            worker_threads: _,
        } => serve(&config, allow_insecure_loopback_only).await,
        Cmd::Dev(args) => run_dev(args).await,
        Cmd::Certs(args) => run_certs(args),
        Cmd::ConfigCheck { config } => config_check(&config),
        Cmd::HashToken { token } => hash_token(&token),
    }
}

fn print(text: &str) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .context("writing to standard output")?;
    Ok(())
}

async fn serve(path: &Path, allow_insecure_loopback_only: bool) -> Result<(), Failure> {
    tenure_server::serve::abort_on_panic();
    let config = config::load(path).map_err(Failure::config)?;
    config
        .check_insecure_switches(allow_insecure_loopback_only)
        .map_err(|error| Failure::config(error.with_origin(&path.display().to_string())))?;
    for (field, value) in config.insecure_switches() {
        tracing::warn!(
            node = config.node_id,
            "{field} = {value}: a test/development switch, allowed by {} on loopback only",
            config::ALLOW_INSECURE_FLAG
        );
    }
    let node_id = config.node_id;
    match tenure_server::serve::serve_until_signalled(config).await {
        Ok(()) => Ok(()),
        Err(error @ ServerError::Config(_)) => Err(Failure::config(error)),
        Err(error) => Err(anyhow::Error::new(error)
            .context(format!("node {node_id}"))
            .into()),
    }
}

async fn run_dev(args: DevArgs) -> Result<(), Failure> {
    if let Some(action) = args.action {
        return run_dev_action(action).await;
    }
    let options = dev::DevOptions {
        data_dir: args.data_dir,
        nodes: args.nodes,
        groups: args.groups,
        base_port: args.base_port,
        fsync: args.fsync,
        duration: args.duration_s.map(Duration::from_secs),
        ready_timeout: Duration::from_secs(args.ready_timeout_s),
        executable: None,
        restart_after: args.restart_after_s.map(Duration::from_secs),
        node_memory_budget_bytes: args.node_memory_budget_bytes,
        tenant_active_leases_max: args.tenant_active_leases_max,
        snapshot_every_entries: args.snapshot_every_entries,
        expire_paced_leases_per_s: args.expire_paced_leases_per_s,
        expire_commands_per_s_max: args.expire_commands_per_s_max,
    };
    match dev::run(options).await {
        Ok(()) => Ok(()),
        Err(error @ (dev::DevError::Options(_) | dev::DevError::Config(_))) => {
            Err(Failure::config(error))
        }
        Err(error) => Err(error.into()),
    }
}

/// `tenure dev status | stop | kill | start | restart`: one request to the running supervisor.
/// Exit code 1 when it is not running, refuses, or the node does not get there in time.
async fn run_dev_action(action: DevAction) -> Result<(), Failure> {
    use dev::control::{self, ControlRequest};
    let (make, on): (fn(u64) -> ControlRequest, DevNodeTarget) = match action {
        DevAction::Status(target) => {
            return print_dev_reply(
                control::act_and_wait(&target.data_dir, ControlRequest::Status, Duration::ZERO)
                    .await?,
                target.json,
            );
        }
        DevAction::Stop(on) => (|node| ControlRequest::Stop { node }, on),
        DevAction::Kill(on) => (|node| ControlRequest::Kill { node }, on),
        DevAction::Start(on) => (|node| ControlRequest::Start { node }, on),
        DevAction::Restart(on) => (|node| ControlRequest::Restart { node }, on),
        DevAction::Replace(on) => {
            let by = next_dev_node(&on.target.data_dir).await?;
            let reply = control::act_and_wait(
                &on.target.data_dir,
                ControlRequest::Replace { node: on.node, by },
                secs(on.wait_s),
            )
            .await?;
            return print_dev_reply(reply, on.target.json);
        }
        DevAction::Add(add) => {
            let node = match add.node {
                Some(node) => node,
                None => next_dev_node(&add.target.data_dir).await?,
            };
            let reply = control::act_and_wait(
                &add.target.data_dir,
                ControlRequest::Add { node },
                secs(add.wait_s),
            )
            .await?;
            return print_dev_reply(reply, add.target.json);
        }
    };
    let (request, target, wait) = (make(on.node), on.target, secs(on.wait_s));
    let reply = control::act_and_wait(&target.data_dir, request, wait).await?;
    print_dev_reply(reply, target.json)
}

/// One more than the highest node id of the running development cluster.
async fn next_dev_node(dir: &Path) -> Result<u64, Failure> {
    let reply = dev::control::send(dir, dev::control::ControlRequest::Status).await?;
    Ok(reply
        .status
        .map(|s| s.nodes.iter().map(|n| n.id).max().unwrap_or(0))
        .unwrap_or(0)
        + 1)
}

fn print_dev_reply(reply: dev::control::ControlReply, json: bool) -> Result<(), Failure> {
    if json {
        let text = serde_json::to_string_pretty(&reply).context("encoding the answer")?;
        return print(&format!("{text}\n"));
    }
    let mut text = String::new();
    if !reply.message.is_empty() {
        text.push_str(&format!("{}\n", reply.message));
    }
    if let Some(status) = &reply.status {
        text.push_str(&dev::control::render_status(status));
    }
    print(&text)
}

fn secs(seconds: u64) -> Duration {
    Duration::from_secs(seconds)
}

fn run_certs(args: CertsArgs) -> Result<(), Failure> {
    if let Some(ca_dir) = &args.ca_dir {
        let nodes = args.nodes.clone().unwrap_or_default();
        let out = args.out.clone().unwrap_or_else(|| ca_dir.clone());
        let written = certs::issue_from_existing_ca(ca_dir, &nodes, &args.ip, &out)?;
        let mut text = String::new();
        for (_, cert, key) in &written {
            text.push_str(&format!("wrote {}\n", cert.display()));
            text.push_str(&format!("wrote {}\n", key.display()));
        }
        return print(&text);
    }
    let (paths, config) = if let Some(path) = &args.config {
        let config = config::load(path).map_err(Failure::config)?;
        let paths = certs::generate_for_config(&config, args.out.as_deref())?;
        (paths, Some(config))
    } else {
        let nodes = args.nodes.unwrap_or_default();
        let out = args
            .out
            .as_deref()
            .ok_or_else(|| Failure::config(anyhow::anyhow!("--nodes needs --out DIR")))?;
        let ips = if args.ip.is_empty() {
            vec![IpAddr::V4(Ipv4Addr::LOCALHOST)]
        } else {
            args.ip.clone()
        };
        (certs::generate(out, &args.cluster, &nodes, &ips)?, None)
    };
    let mut text = String::new();
    text.push_str(&format!("wrote {}\n", paths.ca_cert.display()));
    text.push_str(&format!(
        "wrote {} (the CA key: keep it offline; nodes do not need it)\n",
        paths.ca_key.display()
    ));
    for (_, cert, key) in &paths.nodes {
        text.push_str(&format!("wrote {}\n", cert.display()));
        text.push_str(&format!("wrote {}\n", key.display()));
    }
    print(&text)?;
    if let Some(config) = config {
        for (field, configured, written) in certs::mismatched_tls_paths(&config, &paths) {
            eprintln!(
                "tenure: note: the configuration's {field} is {}, the file written is {}",
                configured.display(),
                written.display()
            );
        }
    }
    Ok(())
}

fn config_check(path: &Path) -> Result<(), Failure> {
    let config = config::load(path).map_err(Failure::config)?;
    let text = config.to_toml().map_err(Failure::config)?;
    print(&format!(
        "# {}: valid. Effective configuration (defaults filled in, paths resolved):\n{text}",
        path.display()
    ))?;
    if config.auth.insecure_dev_mode {
        eprintln!(
            "tenure: warning: auth.insecure_dev_mode is on: principal headers are trusted without \
             authentication"
        );
    }
    if let Err(error) = config.check_insecure_switches(true) {
        eprintln!("tenure: warning: `tenure serve` will refuse this configuration: {error}");
    } else {
        let switches = config.insecure_switches();
        if !switches.is_empty() {
            eprintln!(
                "tenure: note: test/development switches ({}): `tenure serve` runs this \
                 configuration only with {}",
                config::describe_switches(&switches),
                config::ALLOW_INSECURE_FLAG
            );
        }
    }
    Ok(())
}

fn hash_token(token: &str) -> Result<(), Failure> {
    let token = if token == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("reading the token from standard input")?;
        text.trim_end_matches(['\r', '\n']).to_owned()
    } else {
        token.to_owned()
    };
    if token.is_empty() {
        return Err(Failure::config(anyhow::anyhow!("the token is empty")));
    }
    print(&format!(
        "{}\n",
        tenure_server::auth::token_sha256_hex(&token)
    ))
}
