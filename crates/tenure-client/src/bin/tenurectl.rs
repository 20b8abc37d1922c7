//! `tenurectl`: the command-line tool of tenure, for people and scripts. It acquires, renews,
//! releases, transfers, reads and lists leases, checks fencing tokens, runs a command under a
//! lock (`lock`, see its module), campaigns in or observes an election (`elect`, see its
//! module), watches lease events (`watch`), and reports the cluster's status (nodes, leaders,
//! lag), all through the `tenure-client` library over the native QUIC protocol.
//!
//! Output is aligned text (`-o table`, the default) or exactly one JSON object on stdout
//! (`-o json`), also for errors (`{"error": {"code", "message", "retryable", ...}}`, with a
//! one-line message on stderr as well). `watch` first prints one JSON line per event as it
//! happens (in either mode), then its summary; `elect` prints only its JSON event lines.
//!
//! Exit codes (scripts rely on them):
//!
//! | code | meaning |
//! |---|---|
//! | 0 | success (`get` of a resource without a lease is a success: status `ABSENT`) |
//! | 1 | any other error (invalid argument, forbidden, configuration, protocol) |
//! | 2 | usage error (bad or missing options; clap's own code) |
//! | 3 | `ALREADY_HELD`: the resource is held by someone else (the error names the holder); `lock` and `elect`: the wait ran out |
//! | 4 | the lease is not held: `LEASE_EXPIRED`, `LEASE_MISMATCH`, `NOT_FOUND`; `check-fence`: the token is not current (the report is printed in full) |
//! | 5 | retryable: deadline passed, cluster unreachable, `NOT_LEADER`, `UNAVAILABLE`, `OVERLOADED`, `RATE_LIMITED` |
//! | 6 | `lock`: the lock was lost and the command was stopped (otherwise `lock` exits with the command's own status) |
//! | 7 | `elect`: the leadership was lost (a renewal refused, or none confirmed before the safe deadline) |
//!
//! `acquire` takes a lease without a handle: nothing renews it after the command exits, so the
//! caller renews it (`renew`) before its ttl runs out, or lets it expire. `safe_for_ms` is how
//! long the holder may act (the contract's safe deadline, section 5); it is 0 when the answer
//! replays an outcome of a caller-chosen `--request-id` (that outcome may be old).
//!
//! Must not depend on: any server crate (`tenure-server`, `tenure-storage`, `tenure-transport`)
//! or RocksDB, nor on the library's internals. It uses only `tenure-client`'s public API and the
//! types it re-exports, as any other program would.

#![allow(clippy::print_stdout)]

#[path = "tenurectl_parts/elect.rs"]
mod elect;
#[path = "tenurectl_parts/lock.rs"]
mod lock;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::{CommandFactory as _, Parser, Subcommand, ValueEnum};
use serde_json::{Value, json};
use tenure_client::{
    AcquireOptions, Client, ClientConfig, ClientError, ClusterChange, ClusterOp, Credentials,
    Endpoint, ErrorCode, Grant, GroupMembers, GroupStatus, LeaseId, LeaseStatus, LeaseView,
    NodeAddresses, NodeState, NodeStatus, ResourceKey, SessionId, WatchFrom, WatchItem,
    WatchOptions, WatchSelector,
};

/// Help heading of the options every subcommand accepts.
const GLOBAL: &str = "Global options";

const LONG_ABOUT: &str = "\
tenurectl: acquire, renew, release, transfer, read and list tenure leases, and show the
cluster's status.

Point it at a cluster with --cluster FILE (the cluster.json `tenure dev` writes, e.g.
tenure-dev/cluster.json) or with --endpoints LIST --ca-cert FILE. Without --token (or
TENURE_TOKEN) it uses the insecure development principal (--principal), which only a
development cluster accepts.

`acquire` takes a lease without renewing it afterwards: renew it with `renew` before its ttl
runs out, or let it expire.

Output: aligned text (-o table, default) or one JSON object on stdout (-o json), also for
errors: {\"error\": {\"code\", \"message\", \"retryable\", ...}}.

Exit codes:
  0  success (`get` of a resource without a lease is a success: status ABSENT)
  1  other errors (INVALID_ARGUMENT, FORBIDDEN, configuration, protocol, ...)
  2  usage error (bad or missing options)
  3  ALREADY_HELD: the resource is held by someone else (the error names the holder and its
     remaining ttl); lock, elect: the wait ran out
  4  the lease is not held: LEASE_EXPIRED, LEASE_MISMATCH, NOT_FOUND
  5  retryable: deadline exceeded, cluster unreachable, NOT_LEADER, UNAVAILABLE, OVERLOADED,
     RATE_LIMITED (retry later; reuse --request-id so a retried write applies once)
  6  lock: the lock was lost and the command was stopped (otherwise `lock` exits with the
     command's own status; -o json says which)
  7  elect: the leadership was lost (a renewal refused, or none confirmed in time)";

/// Command line.
#[derive(Debug, Parser)]
#[command(name = "tenurectl", version, about = "Acquire, renew, release, transfer, read and list tenure leases; show the cluster's status.", long_about = LONG_ABOUT)]
struct Cli {
    /// The cluster file `tenure dev` writes (nodes, groups, CA certificate).
    #[arg(long, value_name = "FILE", global = true, help_heading = GLOBAL)]
    cluster: Option<PathBuf>,
    /// Nodes to contact first, comma-separated: host:port or id@host:port (QUIC client port).
    #[arg(long, value_name = "LIST", global = true, help_heading = GLOBAL)]
    endpoints: Option<String>,
    /// PEM of the cluster CA (required with --endpoints).
    #[arg(long, value_name = "FILE", global = true, help_heading = GLOBAL)]
    ca_cert: Option<PathBuf>,
    /// Bearer token of a principal in the cluster's [auth] table [env: TENURE_TOKEN].
    #[arg(long, value_name = "TOKEN", global = true, help_heading = GLOBAL)]
    token: Option<String>,
    /// Principal named in insecure development mode (used when no token is given).
    #[arg(long, value_name = "ID", default_value = "tenurectl", global = true, help_heading = GLOBAL)]
    principal: String,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table, global = true, help_heading = GLOBAL)]
    output: Output,
    /// Deadline of each call, retries included, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 10_000, global = true, help_heading = GLOBAL,
          value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    timeout_ms: u64,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Output {
    /// Aligned text for people.
    Table,
    /// One JSON object on stdout.
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum StatusFilter {
    Active,
    Expired,
    Released,
}

impl StatusFilter {
    fn status(self) -> LeaseStatus {
        match self {
            StatusFilter::Active => LeaseStatus::Active,
            StatusFilter::Expired => LeaseStatus::Expired,
            StatusFilter::Released => LeaseStatus::Released,
        }
    }
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Acquire a lease (not renewed afterwards: use `renew` before the ttl runs out).
    Acquire {
        #[command(flatten)]
        resource: ResourceArgs,
        /// Who holds the lease.
        #[arg(long, value_name = "HOLDER")]
        holder: String,
        /// Requested ttl in milliseconds (within the cluster's bounds).
        #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
        ttl_ms: u64,
        /// Request id for deduplication: a retry with the same id returns the original outcome
        /// (`replayed`, with `safe_for_ms` counted from what was left of the original grant).
        #[arg(long, value_name = "ID")]
        request_id: Option<String>,
    },
    /// Renew a lease (same lease id and fencing token, new expiry).
    Renew {
        #[command(flatten)]
        resource: ResourceArgs,
        /// The lease id (gggggggg-ssssssssssssssss).
        #[arg(long, value_name = "LEASE_ID", value_parser = parse_lease_id)]
        lease_id: LeaseId,
        /// The holder the lease was granted to.
        #[arg(long, value_name = "HOLDER")]
        holder: String,
        /// New ttl in milliseconds, counted from the renewal.
        #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
        ttl_ms: u64,
        /// Request id for deduplication.
        #[arg(long, value_name = "ID")]
        request_id: Option<String>,
    },
    /// Release a lease (the resource is free at once).
    Release {
        #[command(flatten)]
        resource: ResourceArgs,
        /// The lease id (gggggggg-ssssssssssssssss).
        #[arg(long, value_name = "LEASE_ID", value_parser = parse_lease_id)]
        lease_id: LeaseId,
        /// The holder the lease was granted to.
        #[arg(long, value_name = "HOLDER")]
        holder: String,
        /// Request id for deduplication.
        #[arg(long, value_name = "ID")]
        request_id: Option<String>,
    },
    /// Hand a lease to a new holder in one step: the old lease ends and the new holder's
    /// begins at once (nobody else can take the resource in between), with a new lease id and a
    /// higher fencing token. Prints the new holder's grant.
    Transfer {
        #[command(flatten)]
        resource: ResourceArgs,
        /// The lease id being handed over (gggggggg-ssssssssssssssss).
        #[arg(long, value_name = "LEASE_ID", value_parser = parse_lease_id)]
        lease_id: LeaseId,
        /// Its current holder.
        #[arg(long, value_name = "HOLDER")]
        holder: String,
        /// Who holds the resource afterwards.
        #[arg(long = "to", value_name = "NEW_HOLDER")]
        new_holder: String,
        /// The new lease's ttl in milliseconds, counted from the transfer.
        #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
        ttl_ms: u64,
        /// Request id for deduplication.
        #[arg(long, value_name = "ID")]
        request_id: Option<String>,
    },
    /// Whether a fencing token is the resource's current active grant (a linearizable read by
    /// the group's leader): exit code 0 when it is, 4 when it is not (superseded, expired,
    /// released, or a resource without a lease). For a downstream system's scripts that check a
    /// writer's token before accepting its write.
    CheckFence {
        #[command(flatten)]
        resource: ResourceArgs,
        /// The token to check.
        #[arg(long, value_name = "TOKEN")]
        fencing_token: u64,
    },
    /// Watch a resource's, a tenant's or a prefix's lease events (ACQUIRED, RELEASED, EXPIRED,
    /// HANDED_OFF), one JSON line each on stdout as they happen, in each group's log order;
    /// then a summary with the cursor to resume from (--after).
    Watch {
        /// The tenant.
        #[arg(long, value_name = "TENANT")]
        tenant: String,
        /// Only this resource.
        #[arg(long, value_name = "RESOURCE", conflicts_with = "prefix")]
        resource: Option<String>,
        /// Only resources whose id starts with this.
        #[arg(long, value_name = "PREFIX")]
        prefix: Option<String>,
        /// Resume after these log indexes: GROUP:INDEX,... (a summary's cursor).
        #[arg(long, value_name = "CURSOR")]
        after: Option<String>,
        /// Stop after this many events.
        #[arg(long, value_name = "N")]
        count: Option<u64>,
        /// Stop after this long, in milliseconds (default: 60,000).
        #[arg(long, value_name = "MS", default_value_t = 60_000)]
        duration_ms: u64,
        /// Let any replica answer from its applied state.
        #[arg(long)]
        stale: bool,
    },
    /// Read a resource's lease (ACTIVE, EXPIRED, RELEASED or ABSENT).
    Get {
        #[command(flatten)]
        resource: ResourceArgs,
        /// Let any replica answer from its applied state (may be behind the leader).
        #[arg(long)]
        stale: bool,
    },
    /// List a tenant's leases across every group.
    List {
        /// The tenant.
        #[arg(long, value_name = "TENANT")]
        tenant: String,
        /// Only leases with this status.
        #[arg(long, value_enum)]
        status: Option<StatusFilter>,
        /// Most leases shown.
        #[arg(long, value_name = "N", default_value_t = 100,
              value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
        limit: u64,
    },
    /// Show every node (reachable, ready, groups hosted and led, lag) and each group's leader.
    Status,
    /// A group's replicas: show them, or move one to another node.
    #[command(subcommand)]
    Group(GroupCommand),
    /// The cluster's nodes: list them, announce a new one, drain, or remove one.
    #[command(subcommand)]
    Node(NodeCommand),
    /// Sessions: one keep-alive per group for all the leases a session holds there (nothing
    /// here keeps a session alive between calls: `keepalive` before its ttl runs out).
    #[command(subcommand)]
    Session(SessionCommand),
    /// Wait for a lock (FIFO, in the resource's wait queue), run COMMAND while holding it, and
    /// release it when the command exits. The lock is a lease bound to a session this command
    /// keeps alive. If the lock is lost (the session cannot be kept alive, or this process is
    /// paused), the command's process group gets SIGTERM and then SIGKILL, both before the
    /// lease's safe deadline, from a watchdog process that does not depend on this one running.
    /// The command sees TENURE_FENCING_TOKEN, TENURE_LEASE_ID, TENURE_LOCK_NAME,
    /// TENURE_LOCK_HOLDER and TENURE_TENANT. Exit status: the command's own when it ended by
    /// itself (128 + signal if a signal ended it), 6 when the lock was lost and the command was
    /// stopped, 3 when the wait ran out (-o json says which).
    Lock {
        /// The lock's name (a resource of --tenant).
        name: String,
        /// The tenant.
        #[arg(long, value_name = "TENANT")]
        tenant: String,
        /// Who holds the lock (default: tenurectl-PID).
        #[arg(long, value_name = "HOLDER")]
        holder: Option<String>,
        /// The session's ttl in milliseconds: how long the lock outlives this process if it dies
        /// or is cut off.
        #[arg(long, value_name = "MS", default_value_t = 10_000,
              value_parser = clap::value_parser!(u64).range(1..))]
        ttl_ms: u64,
        /// Longest wait for the lock in milliseconds (at most the tenant's largest ttl).
        #[arg(long, value_name = "MS", default_value_t = 3_600_000,
              value_parser = clap::value_parser!(u64).range(1..))]
        wait_ms: u64,
        /// Time between SIGTERM and SIGKILL; both go out before the lease's safe deadline.
        #[arg(long, value_name = "MS", default_value_t = 1_000)]
        grace_ms: u64,
        /// The command and its arguments (after `--`).
        #[arg(last = true, required = true, value_name = "COMMAND")]
        command: Vec<String>,
    },
    /// Campaign in an election (with VALUE) or observe its leader (without). The leader is the
    /// holder of the lease of NAME; its holder id is CANDIDATE#VALUE. Candidates wait in the
    /// resource's FIFO queue. Every event is one JSON line on stdout as it happens (no summary).
    /// Campaign: prints `elected` (name, candidate, value, fencing_token, lease_id), then holds
    /// leadership (the lease is renewed) until SIGINT/SIGTERM or --duration-ms (resigns, prints
    /// `resigned`, exit 0) or until it is lost (prints `lost`, exit 7); stopped while still
    /// waiting, it leaves the queue and prints `withdrawn` (exit 0); exit 3 when --wait-ms ran
    /// out. Observe: prints the current leader (`leader` or `no_leader`), then each change,
    /// until --count lines, --duration-ms, or SIGINT/SIGTERM (exit 0).
    Elect {
        /// The election's name (a resource of --tenant).
        name: String,
        /// The value to announce as leader (an address, say; may be empty). Without it, observe.
        value: Option<String>,
        /// The tenant.
        #[arg(long, value_name = "TENANT")]
        tenant: String,
        /// Campaign: the candidate id, without '#' (default: HOSTNAME-PID).
        #[arg(long, value_name = "ID", requires = "value")]
        candidate: Option<String>,
        /// Campaign: the lease's ttl in milliseconds (how long a leader that dies without
        /// resigning keeps the others waiting).
        #[arg(long, value_name = "MS", default_value_t = 10_000,
              value_parser = clap::value_parser!(u64).range(1..))]
        ttl_ms: u64,
        /// Campaign: the longest wait to be elected, in milliseconds (at most the tenant's
        /// largest ttl).
        #[arg(long, value_name = "MS", default_value_t = 3_600_000,
              value_parser = clap::value_parser!(u64).range(1..))]
        wait_ms: u64,
        /// Stop after this long, in milliseconds from the start: a leader resigns, a waiting
        /// candidate withdraws, an observer stops (default: run until SIGINT/SIGTERM).
        #[arg(long, value_name = "MS")]
        duration_ms: Option<u64>,
        /// Observe: stop after this many lines.
        #[arg(long, value_name = "N", conflicts_with = "value")]
        count: Option<u64>,
    },
}

#[derive(Debug, Subcommand)]
enum SessionCommand {
    /// Open a session's record in groups (the group of each --resource, and each --group);
    /// prints the session id (drawn at random unless --session names one).
    Open {
        /// The tenant.
        #[arg(long, value_name = "TENANT")]
        tenant: String,
        /// Who owns the session (and holds every lease acquired in it).
        #[arg(long, value_name = "OWNER")]
        owner: String,
        /// The session's ttl in milliseconds (within the tenant's lease ttl bounds).
        #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
        ttl_ms: u64,
        /// The session id (32 hex digits); a new random one by default.
        #[arg(long, value_name = "ID", value_parser = parse_session_id)]
        session: Option<SessionId>,
        /// Open it in this group (repeatable).
        #[arg(long, value_name = "GROUP")]
        group: Vec<u32>,
        /// Open it in this resource's group (repeatable).
        #[arg(long, value_name = "RESOURCE")]
        resource: Vec<String>,
    },
    /// Extend a session's record in each --group by its ttl.
    Keepalive {
        #[command(flatten)]
        session: SessionArgs,
        /// The group (repeatable).
        #[arg(long, value_name = "GROUP", required = true)]
        group: Vec<u32>,
    },
    /// Close a session's record in each --group (every group when none is named): its leases
    /// there end at once. Groups without a record of it are skipped.
    Close {
        #[command(flatten)]
        session: SessionArgs,
        /// The group (repeatable; default: every group).
        #[arg(long, value_name = "GROUP")]
        group: Vec<u32>,
    },
    /// Acquire a resource bound to a session open in the resource's group.
    Acquire {
        #[command(flatten)]
        session: SessionArgs,
        /// The resource.
        #[arg(long, value_name = "RESOURCE")]
        resource: String,
        /// Request id for deduplication.
        #[arg(long, value_name = "ID")]
        request_id: Option<String>,
    },
    /// The leases bound to a session, across every group.
    List {
        /// The tenant.
        #[arg(long, value_name = "TENANT")]
        tenant: String,
        /// The session id.
        #[arg(long, value_name = "ID", value_parser = parse_session_id)]
        session: SessionId,
        /// Only leases with this status.
        #[arg(long, value_enum)]
        status: Option<StatusFilter>,
        /// Most leases examined (the tenant's leases, before the session filter).
        #[arg(long, value_name = "N", default_value_t = 100_000,
              value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
        limit: u64,
    },
}

#[derive(Debug, clap::Args)]
struct SessionArgs {
    /// The tenant.
    #[arg(long, value_name = "TENANT")]
    tenant: String,
    /// The session's owner.
    #[arg(long, value_name = "OWNER")]
    owner: String,
    /// The session id (32 hex digits).
    #[arg(long, value_name = "ID", value_parser = parse_session_id)]
    session: SessionId,
}

fn parse_session_id(text: &str) -> Result<SessionId, String> {
    text.trim()
        .parse()
        .map_err(|error: tenure_client::SessionIdParseError| error.to_string())
}

#[derive(Debug, Subcommand)]
enum NodeCommand {
    /// Every node in the cluster's node table: state, addresses, replicas and groups led.
    List,
    /// Announce a new node (cluster operators). It joins when it starts (with
    /// `[cluster] join_existing = true`) and reports itself; the placement controller then moves
    /// replicas to it.
    Add {
        /// The new node's id (never used before in this cluster).
        node: u64,
        /// Its QUIC endpoint, `ip:port`.
        #[arg(long, value_name = "ADDR")]
        addr: std::net::SocketAddr,
        /// Its HTTP gateway, `ip:port`.
        #[arg(long, value_name = "ADDR")]
        http_addr: std::net::SocketAddr,
    },
    /// Drain a node (cluster operators): the placement controller moves its replicas to the
    /// active nodes. With --wait-ms, waits until it holds none (exit 1 if it still does then).
    Drain {
        /// The node.
        node: u64,
        /// How long to wait for the node to be empty (0: do not wait).
        #[arg(long, value_name = "MS", default_value_t = 0)]
        wait_ms: u64,
    },
    /// Take a drain back: the node is active again (cluster operators).
    Undrain {
        /// The node.
        node: u64,
    },
    /// Remove a node for good (cluster operators): every node refuses it and its certificate
    /// from then on, its id is never reused. Refused while it still holds replicas (drain it
    /// first), unless --force (a node that is gone for good: its replicas are then re-created
    /// elsewhere).
    Remove {
        /// The node.
        node: u64,
        /// Remove it even though it still holds replicas.
        #[arg(long)]
        force: bool,
    },
}

#[derive(Debug, Subcommand)]
enum GroupCommand {
    /// The group's voters (both sets during a joint change), learners, leader, term and each
    /// replica's progress, as its leader sees them.
    Show {
        /// The group.
        group: u32,
    },
    /// Move the group's replica from one node to another (cluster operators): the new replica
    /// catches up as a learner first, the voters change by joint consensus, the old replica is
    /// dropped. Waits until done (exit 0) or --wait-ms passes (exit 1; the move goes on).
    Move {
        /// The group.
        group: u32,
        /// The node whose replica leaves.
        #[arg(long, value_name = "NODE")]
        from: u64,
        /// The node that gets the new replica.
        #[arg(long, value_name = "NODE")]
        to: u64,
        /// How long to wait for the move to finish.
        #[arg(long, value_name = "MS", default_value_t = 120_000)]
        wait_ms: u64,
    },
}

/// A watch cursor: `GROUP:INDEX,...`.
fn parse_cursor(text: &str) -> Result<BTreeMap<u32, u64>, ClientError> {
    tenure_core::parse_watch_cursor(text)
        .map_err(|error| ClientError::InvalidRequest(format!("--after: {error}")))
}

#[derive(Debug, clap::Args)]
struct ResourceArgs {
    /// The tenant.
    #[arg(long, value_name = "TENANT")]
    tenant: String,
    /// The resource.
    #[arg(long, value_name = "RESOURCE")]
    resource: String,
}

impl ResourceArgs {
    fn key(&self) -> ResourceKey {
        ResourceKey::new(self.tenant.clone(), self.resource.clone())
    }
}

fn parse_lease_id(text: &str) -> Result<LeaseId, String> {
    text.trim()
        .parse::<LeaseId>()
        .map_err(|error| error.to_string())
}

/// A command's result: an ordered list of fields (one JSON object, or aligned `name value`
/// lines), or a text rendering of its own for tables.
struct Report {
    json: Value,
    table: String,
    /// The exit code of a report printed in full: 0, or 4 for a `check-fence` whose token is
    /// not current.
    exit_code: u8,
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(lock::WATCHDOG_ARG) {
        return ExitCode::from(lock::watchdog_main(&args[2..]));
    }
    let cli = Cli::parse();
    if let Err(message) = check_usage(&cli) {
        // Usage errors exit with clap's code (2) and its formatting.
        Cli::command()
            .error(clap::error::ErrorKind::ArgumentConflict, message)
            .exit();
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("tenurectl: cannot start the async runtime: {error}");
            return ExitCode::from(1);
        }
    };
    let output = cli.output;
    match runtime.block_on(run(cli)) {
        Ok(report) => {
            // A report printed as it went (`elect`) has nothing left to print.
            match output {
                Output::Json if !report.json.is_null() => println!("{}", report.json),
                Output::Json => {}
                Output::Table => print!("{}", report.table),
            }
            ExitCode::from(report.exit_code)
        }
        Err(error) => report_error(&error, output),
    }
}

fn check_usage(cli: &Cli) -> Result<(), String> {
    match (&cli.cluster, &cli.endpoints, &cli.ca_cert) {
        (Some(_), Some(_), _) => Err("use either --cluster or --endpoints, not both".into()),
        (Some(_), None, Some(_)) => {
            Err("--ca-cert goes with --endpoints (the cluster file names its CA)".into())
        }
        (None, Some(_), None) => Err("--endpoints needs --ca-cert FILE (the cluster CA)".into()),
        (None, None, _) => Err(
            "say where the cluster is: --cluster FILE (e.g. tenure-dev/cluster.json) or \
             --endpoints LIST --ca-cert FILE"
                .into(),
        ),
        _ => Ok(()),
    }
}

async fn run(cli: Cli) -> anyhow::Result<Report> {
    let timeout = Duration::from_millis(cli.timeout_ms);
    let config = client_config(&cli, timeout)?;
    // Connecting tries the endpoints one after another; the whole attempt gets the call deadline.
    let client = match tokio::time::timeout(timeout, Client::connect(config)).await {
        Ok(connected) => connected.context("connecting to the cluster")?,
        Err(_) => {
            return Err(anyhow::Error::new(ClientError::DeadlineExceeded {
                timeout_ms: cli.timeout_ms,
                attempts: 1,
                last: "no node answered the routing request".into(),
            })
            .context("connecting to the cluster"));
        }
    };
    let result = execute(&client, cli.command).await;
    client.close().await;
    result
}

fn client_config(cli: &Cli, timeout: Duration) -> anyhow::Result<ClientConfig> {
    let token = cli.token.clone().or_else(|| {
        std::env::var("TENURE_TOKEN")
            .ok()
            .filter(|token| !token.trim().is_empty())
    });
    let credentials = match token {
        Some(token) => Credentials::Token(token.trim().to_string()),
        None => Credentials::InsecureDev {
            principal_id: cli.principal.clone(),
        },
    };
    let mut config = match (&cli.cluster, &cli.endpoints, &cli.ca_cert) {
        (Some(path), _, _) => ClientConfig::from_cluster_file(path, credentials)?,
        (None, Some(list), Some(ca_cert)) => {
            let endpoints = Endpoint::parse_list(list)?;
            let ca_cert_pem = std::fs::read_to_string(ca_cert).map_err(|error| {
                ClientError::Config(format!(
                    "reading the CA certificate {}: {error}",
                    ca_cert.display()
                ))
            })?;
            ClientConfig::new(endpoints, ca_cert_pem, credentials)
        }
        _ => {
            return Err(ClientError::Config(
                "no cluster: --cluster FILE or --endpoints LIST --ca-cert FILE".into(),
            )
            .into());
        }
    };
    config.call_timeout = timeout;
    config.attempt_timeout = config.attempt_timeout.min(timeout);
    Ok(config)
}

async fn execute(client: &Client, command: Command) -> anyhow::Result<Report> {
    match command {
        Command::Elect {
            name,
            value,
            tenant,
            candidate,
            ttl_ms,
            wait_ms,
            duration_ms,
            count,
        } => {
            let exit_code = elect::run_elect(
                client,
                elect::ElectRun {
                    tenant,
                    name,
                    value,
                    candidate: candidate.unwrap_or_else(elect::default_candidate),
                    ttl: Duration::from_millis(ttl_ms),
                    wait: Duration::from_millis(wait_ms),
                    duration: duration_ms.map(Duration::from_millis),
                    count,
                },
            )
            .await?;
            Ok(Report {
                json: Value::Null,
                table: String::new(),
                exit_code,
            })
        }
        Command::Lock {
            name,
            tenant,
            holder,
            ttl_ms,
            wait_ms,
            grace_ms,
            command,
        } => {
            // The command must be gone before the safe deadline: SIGTERM goes out the grace and
            // the kill margin before it, so both must fit well inside the session's window.
            let stop_ms = grace_ms.saturating_add(millis(lock::KILL_MARGIN));
            if stop_ms.saturating_mul(3) > ttl_ms {
                return Err(ClientError::InvalidRequest(format!(
                    "--grace-ms {grace_ms} plus the {} ms kill margin must be under a third of \
                     --ttl-ms {ttl_ms}",
                    millis(lock::KILL_MARGIN)
                ))
                .into());
            }
            let outcome = lock::run_lock(
                client,
                lock::LockRun {
                    holder: holder.unwrap_or_else(|| format!("tenurectl-{}", std::process::id())),
                    tenant,
                    name,
                    ttl: Duration::from_millis(ttl_ms),
                    wait: Duration::from_millis(wait_ms),
                    grace: Duration::from_millis(grace_ms),
                    command,
                },
            )
            .await?;
            let json = outcome.json();
            let table = render_table(
                &["FIELD", "VALUE"],
                &json
                    .as_object()
                    .map(|fields| {
                        fields
                            .iter()
                            .map(|(k, v)| vec![k.clone(), cell(v)])
                            .collect::<Vec<_>>()
                    })
                    .unwrap_or_default(),
            );
            Ok(Report {
                json,
                table,
                exit_code: outcome.exit_code(),
            })
        }
        Command::Acquire {
            resource,
            holder,
            ttl_ms,
            request_id,
        } => {
            let mut options = AcquireOptions::new(
                resource.tenant,
                resource.resource,
                holder,
                Duration::from_millis(ttl_ms),
            )
            .without_auto_renew();
            options.request_id = request_id;
            let grant = client.acquire_grant(options).await?;
            Ok(fields_report(grant_fields(&grant)))
        }
        Command::Renew {
            resource,
            lease_id,
            holder,
            ttl_ms,
            request_id,
        } => {
            let grant = client
                .renew(
                    resource.key(),
                    lease_id,
                    holder,
                    Duration::from_millis(ttl_ms),
                    request_id,
                )
                .await?;
            Ok(fields_report(grant_fields(&grant)))
        }
        Command::Release {
            resource,
            lease_id,
            holder,
            request_id,
        } => {
            let receipt = client
                .release(resource.key(), lease_id, holder, request_id)
                .await?;
            Ok(fields_report(vec![
                ("tenant_id", json!(resource.tenant)),
                ("resource_id", json!(resource.resource)),
                ("lease_id", json!(receipt.lease_id.to_string())),
                ("fencing_token", json!(receipt.fencing_token)),
                ("released_at_ms", json!(receipt.released_at_ms)),
                ("released", json!(true)),
            ]))
        }
        Command::Transfer {
            resource,
            lease_id,
            holder,
            new_holder,
            ttl_ms,
            request_id,
        } => {
            let transferred = client
                .transfer(
                    resource.key(),
                    lease_id,
                    holder,
                    new_holder,
                    Duration::from_millis(ttl_ms),
                    request_id,
                )
                .await?;
            let mut fields = grant_fields(&transferred.grant);
            fields.push((
                "previous_lease_id",
                json!(transferred.released.lease_id.to_string()),
            ));
            fields.push((
                "previous_fencing_token",
                json!(transferred.released.fencing_token),
            ));
            Ok(fields_report(fields))
        }
        Command::CheckFence {
            resource,
            fencing_token,
        } => {
            let key = resource.key();
            let result = client.check_fence(&key, fencing_token).await?;
            let verdict = result.verdict;
            let report = fields_report(vec![
                ("tenant_id", json!(key.tenant_id)),
                ("resource_id", json!(key.resource_id)),
                ("fencing_token", json!(fencing_token)),
                ("current", json!(verdict.current)),
                ("status", json!(verdict.status.as_str())),
                ("latest_fencing_token", json!(verdict.latest_fencing_token)),
                ("remaining_ttl_ms", json!(verdict.remaining_ttl_ms)),
                ("log_time_ms", json!(result.log_time_ms)),
                ("group_id", json!(result.group_id)),
            ]);
            Ok(Report {
                exit_code: if verdict.current { 0 } else { 4 },
                ..report
            })
        }
        Command::Watch {
            tenant,
            resource,
            prefix,
            after,
            count,
            duration_ms,
            stale,
        } => {
            let selector = match (resource, prefix) {
                (Some(resource), _) => WatchSelector::Resource(ResourceKey::new(tenant, resource)),
                (None, Some(prefix)) => WatchSelector::Prefix {
                    tenant_id: tenant,
                    prefix,
                },
                (None, None) => WatchSelector::Tenant(tenant),
            };
            let from = match after {
                Some(cursor) => WatchFrom::Cursor(parse_cursor(&cursor)?),
                None => WatchFrom::Now,
            };
            let options = WatchOptions {
                stale_read: stale,
                ..WatchOptions::default()
            };
            let mut watch = client.watch(selector, from, options).await?;
            let stop_at = tokio::time::Instant::now() + Duration::from_millis(duration_ms);
            let (mut events, mut resyncs) = (0u64, 0u64);
            while count.is_none_or(|count| events < count) {
                let item = match tokio::time::timeout_at(stop_at, watch.next_item()).await {
                    Ok(Some(item)) => item?,
                    Ok(None) | Err(_) => break,
                };
                let line = match item {
                    WatchItem::Event(event) => {
                        events += 1;
                        json!({ "event": event.kind.as_str(), "group_id": event.group_id,
                            "index": event.index, "log_time_ms": event.log_time_ms,
                            "tenant_id": event.key.tenant_id, "resource_id": event.key.resource_id,
                            "fencing_token": event.kind.fencing_token(), "detail": event.kind })
                    }
                    WatchItem::Resync {
                        group_id,
                        through_index,
                        current,
                    } => {
                        resyncs += 1;
                        json!({ "resync": group_id, "through_index": through_index, "current": current })
                    }
                    WatchItem::Started { .. } | WatchItem::Through { .. } => continue,
                };
                println!("{line}");
            }
            let cursor = tenure_core::render_watch_cursor(watch.cursor());
            Ok(fields_report(vec![
                ("events", json!(events)),
                ("resyncs", json!(resyncs)),
                ("cursor", json!(cursor)),
            ]))
        }
        Command::Get { resource, stale } => {
            let key = resource.key();
            let result = client.get_with(&key, stale).await?;
            let mut fields = view_fields(&key, result.view.as_ref(), result.group_id);
            fields.push(("log_time_ms", json!(result.log_time_ms)));
            fields.push(("stale", json!(result.stale)));
            Ok(fields_report(fields))
        }
        Command::List {
            tenant,
            status,
            limit,
        } => {
            let limit = usize::try_from(limit).unwrap_or(usize::MAX);
            let leases = client
                .list_all(&tenant, status.map(StatusFilter::status), limit)
                .await?;
            list_report(client, &leases).await
        }
        Command::Status => status_report(client).await,
        Command::Group(GroupCommand::Show { group }) => {
            Ok(members_report(&client.group_members(group).await?))
        }
        Command::Node(command) => Ok(node_command(client, command).await?),
        Command::Session(command) => session_command(client, command).await,
        Command::Group(GroupCommand::Move {
            group,
            from,
            to,
            wait_ms,
        }) => Ok(members_report(
            &client
                .move_replica(group, from, to, Duration::from_millis(wait_ms))
                .await?,
        )),
    }
}

// ----- sessions -----

fn session_grant_fields(grant: &tenure_client::SessionGrant) -> Value {
    json!({
        "group_id": grant.group_id.0,
        "created": grant.created,
        "ttl_ms": grant.ttl_ms,
        "remaining_ttl_ms": grant.expires_at_ms.saturating_sub(grant.log_time_ms),
        "expires_at_log_ms": grant.expires_at_ms,
        "bound_leases": grant.bound_leases,
    })
}

/// One row per group of a session command, as a report.
fn session_rows_report(session_id: SessionId, rows: Vec<Value>) -> Report {
    let mut table = format!("session  {session_id}\n");
    for row in &rows {
        table.push_str(&format!("{row}\n"));
    }
    Report {
        json: json!({ "session_id": session_id.to_string(), "groups": rows }),
        table,
        exit_code: 0,
    }
}

async fn session_command(client: &Client, command: SessionCommand) -> anyhow::Result<Report> {
    match command {
        SessionCommand::Open {
            tenant,
            owner,
            ttl_ms,
            session,
            group,
            resource,
        } => {
            let session_id = session.unwrap_or_else(|| {
                use rand::{Rng as _, SeedableRng as _};
                SessionId(rand::rngs::SmallRng::from_os_rng().random::<u128>())
            });
            let mut groups: BTreeSet<u32> = group.into_iter().collect();
            for resource in resource {
                groups.insert(
                    client
                        .group_of(&ResourceKey::new(tenant.clone(), resource))
                        .await?,
                );
            }
            if groups.is_empty() {
                anyhow::bail!("name at least one --group or --resource to open the session in");
            }
            let mut rows = Vec::new();
            for group in groups {
                let grant = client
                    .session_open(
                        &tenant,
                        group,
                        session_id,
                        &owner,
                        Duration::from_millis(ttl_ms),
                    )
                    .await?;
                rows.push(session_grant_fields(&grant));
            }
            Ok(session_rows_report(session_id, rows))
        }
        SessionCommand::Keepalive { session, group } => {
            let mut rows = Vec::new();
            for group in group {
                let grant = client
                    .session_keepalive(&session.tenant, group, session.session, &session.owner)
                    .await?;
                rows.push(session_grant_fields(&grant));
            }
            Ok(session_rows_report(session.session, rows))
        }
        SessionCommand::Close { session, group } => {
            let groups: Vec<u32> = if group.is_empty() {
                (0..client.routing().groups).collect()
            } else {
                group
            };
            let mut rows = Vec::new();
            for group in groups {
                match client
                    .session_close(&session.tenant, group, session.session, &session.owner)
                    .await
                {
                    Ok(receipt) => rows.push(json!({
                        "group_id": group,
                        "closed_at_log_ms": receipt.closed_at_ms,
                        "leases_ended": receipt.leases_ended,
                    })),
                    // No record of the session there: nothing to close.
                    Err(ClientError::Server {
                        code: ErrorCode::NotFound,
                        ..
                    }) => {}
                    Err(error) => return Err(error.into()),
                }
            }
            Ok(session_rows_report(session.session, rows))
        }
        SessionCommand::Acquire {
            session,
            resource,
            request_id,
        } => {
            let key = ResourceKey::new(session.tenant.clone(), resource);
            let (group_id, grant) = client
                .acquire_in_session(&key, &session.owner, session.session, request_id)
                .await?;
            Ok(fields_report(vec![
                ("tenant_id", json!(key.tenant_id)),
                ("resource_id", json!(key.resource_id)),
                ("session_id", json!(session.session.to_string())),
                ("lease_id", json!(grant.lease_id.to_string())),
                ("fencing_token", json!(grant.fencing_token)),
                ("expires_at_log_ms", json!(grant.expires_at_ms)),
                ("group_id", json!(group_id)),
            ]))
        }
        SessionCommand::List {
            tenant,
            session,
            status,
            limit,
        } => {
            let limit = usize::try_from(limit).unwrap_or(usize::MAX);
            let leases: Vec<LeaseView> = client
                .list_all(&tenant, status.map(StatusFilter::status), limit)
                .await?
                .into_iter()
                .filter(|lease| lease.session_id == Some(session))
                .collect();
            list_report(client, &leases).await
        }
    }
}

// ----- nodes -----

/// Replicas (voters and learners) and groups led per node, from every group's leader.
async fn replicas_per_node(
    client: &Client,
) -> Result<(BTreeMap<u64, u64>, BTreeMap<u64, u64>), ClientError> {
    let groups = client.routing().groups;
    let mut replicas: BTreeMap<u64, u64> = BTreeMap::new();
    let mut leaders: BTreeMap<u64, u64> = BTreeMap::new();
    for group in 0..groups {
        let members = client.group_members(group).await?;
        for node in members.voters.iter().chain(&members.learners) {
            *replicas.entry(*node).or_insert(0) += 1;
        }
        if let Some(leader) = members.leader {
            *leaders.entry(leader).or_insert(0) += 1;
        }
    }
    Ok((replicas, leaders))
}

async fn node_command(client: &Client, command: NodeCommand) -> Result<Report, ClientError> {
    match command {
        NodeCommand::List => {
            let meta = client.cluster_nodes().await?;
            let (replicas, leaders) = replicas_per_node(client).await?;
            let nodes: Vec<Value> = meta
                .nodes
                .values()
                .map(|node| {
                    json!({
                        "node_id": node.node_id,
                        "state": node.state.as_str(),
                        "addr": node.addr,
                        "http_addr": node.http_addr,
                        "replicas": replicas.get(&node.node_id).copied().unwrap_or(0),
                        "leads": leaders.get(&node.node_id).copied().unwrap_or(0),
                        "reported": node.cert_sha256.is_some(),
                        "incarnation": node.incarnation,
                    })
                })
                .collect();
            let mut table = format!(
                "node table version {} ({} revoked certificates)\n",
                meta.version,
                meta.revoked.len()
            );
            let rows: Vec<Vec<String>> = meta
                .nodes
                .values()
                .map(|node| {
                    vec![
                        node.node_id.to_string(),
                        node.state.as_str().to_owned(),
                        node.addr.clone(),
                        node.http_addr.clone(),
                        replicas
                            .get(&node.node_id)
                            .copied()
                            .unwrap_or(0)
                            .to_string(),
                        leaders.get(&node.node_id).copied().unwrap_or(0).to_string(),
                    ]
                })
                .collect();
            table.push_str(&render_table(
                &["NODE", "STATE", "ADDR", "HTTP", "REPLICAS", "LEADS"],
                &rows,
            ));
            Ok(Report {
                json: json!({ "version": meta.version, "nodes": nodes }),
                table,
                exit_code: 0,
            })
        }
        NodeCommand::Add {
            node,
            addr,
            http_addr,
        } => {
            let change = client
                .cluster_change(ClusterOp::AddNode(NodeAddresses {
                    node_id: node,
                    addr: addr.to_string(),
                    http_addr: http_addr.to_string(),
                }))
                .await?;
            Ok(change_report(node, "joining", change))
        }
        NodeCommand::Drain { node, wait_ms } => {
            let change = client
                .cluster_change(ClusterOp::SetState {
                    node_id: node,
                    state: NodeState::Draining,
                })
                .await?;
            if wait_ms > 0 {
                let deadline = std::time::Instant::now() + Duration::from_millis(wait_ms);
                loop {
                    let (replicas, _) = replicas_per_node(client).await?;
                    let left = replicas.get(&node).copied().unwrap_or(0);
                    if left == 0 {
                        break;
                    }
                    if std::time::Instant::now() >= deadline {
                        return Err(ClientError::DeadlineExceeded {
                            timeout_ms: wait_ms,
                            attempts: 1,
                            last: format!(
                                "node {node} still holds {left} replicas (the drain goes on)"
                            ),
                        });
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
            Ok(change_report(node, "draining", change))
        }
        NodeCommand::Undrain { node } => {
            let change = client
                .cluster_change(ClusterOp::SetState {
                    node_id: node,
                    state: NodeState::Active,
                })
                .await?;
            Ok(change_report(node, "active", change))
        }
        NodeCommand::Remove { node, force } => {
            if !force {
                let (replicas, _) = replicas_per_node(client).await?;
                let held = replicas.get(&node).copied().unwrap_or(0);
                if held > 0 {
                    return Err(ClientError::InvalidRequest(format!(
                        "node {node} still holds {held} replicas: drain it first (`tenurectl \
                         node drain {node} --wait-ms 600000`), or --force for a node that is \
                         gone for good"
                    )));
                }
            }
            let change = client
                .cluster_change(ClusterOp::Remove { node_id: node })
                .await?;
            Ok(change_report(node, "removed", change))
        }
    }
}

fn change_report(node: u64, state: &str, change: ClusterChange) -> Report {
    fields_report(vec![
        ("node_id", json!(node)),
        ("state", json!(state)),
        ("changed", json!(change.changed)),
        ("version", json!(change.version)),
    ])
}

// ----- groups -----

/// A group's replica set: one JSON object, or a line per replica.
fn members_report(members: &GroupMembers) -> Report {
    let progress: BTreeMap<u64, u64> = members
        .followers
        .iter()
        .map(|f| (f.node_id, f.matched_index))
        .collect();
    let json = json!({
        "group_id": members.group_id,
        "seen_by": members.seen_by,
        "leader": members.leader,
        "term": members.term,
        "voters": members.voters,
        "voter_sets": members.voter_sets,
        "learners": members.learners,
        "joint": members.voter_sets.len() > 1,
        "membership_log_index": members.membership_log_index,
        "membership_committed": members.membership_committed,
        "last_log_index": members.last_log_index,
        "matched_index": progress
            .iter()
            .map(|(node, matched)| (node.to_string(), json!(matched)))
            .collect::<serde_json::Map<String, Value>>(),
    });
    let mut table = format!(
        "group {}: leader {}, term {}, voters {:?}{}, learners {:?} (seen by node {})\n",
        members.group_id,
        members
            .leader
            .map_or_else(|| "none".to_owned(), |l| l.to_string()),
        members.term,
        members.voters,
        if members.voter_sets.len() > 1 {
            format!(" (joint change: {:?})", members.voter_sets)
        } else {
            String::new()
        },
        members.learners,
        members.seen_by,
    );
    let rows: Vec<Vec<String>> = members
        .voters
        .iter()
        .map(|node| (node, "voter"))
        .chain(members.learners.iter().map(|node| (node, "learner")))
        .map(|(node, role)| {
            // Progress is the leader's to know: another replica's view shows none.
            let matched = if Some(*node) == members.leader && members.seen_by == *node {
                Some(members.last_log_index)
            } else {
                progress.get(node).copied()
            };
            vec![
                node.to_string(),
                role.to_owned(),
                if Some(*node) == members.leader {
                    "yes".to_owned()
                } else {
                    "-".to_owned()
                },
                matched.map_or_else(|| "?".to_owned(), |m| m.to_string()),
                matched.map_or_else(
                    || "?".to_owned(),
                    |m| members.last_log_index.saturating_sub(m).to_string(),
                ),
            ]
        })
        .collect();
    table.push_str(&render_table(
        &["NODE", "ROLE", "LEADER", "MATCHED", "LAG"],
        &rows,
    ));
    Report {
        json,
        table,
        exit_code: 0,
    }
}

// ----- leases -----

/// The fields of a grant. `safe_for_ms` is the time left before the grant's safe deadline (for
/// a replay, counted from what was left of the original grant when the retry was answered: 0
/// once that lease ended; `replay_status` says where it stands).
fn grant_fields(grant: &Grant) -> Vec<(&'static str, Value)> {
    let safe_for = grant
        .safe_deadline
        .saturating_duration_since(Instant::now());
    vec![
        ("tenant_id", json!(grant.key.tenant_id)),
        ("resource_id", json!(grant.key.resource_id)),
        ("holder_id", json!(grant.holder_id)),
        ("lease_id", json!(grant.lease_id.to_string())),
        ("fencing_token", json!(grant.fencing_token)),
        ("ttl_ms", json!(grant.ttl_ms)),
        ("group_id", json!(grant.group_id)),
        ("log_time_ms", json!(grant.log_time_ms)),
        ("expires_at_ms", json!(grant.expires_at_ms)),
        ("safe_for_ms", json!(millis(safe_for))),
        ("remaining_ttl_ms", json!(grant.remaining_ttl_ms)),
        ("replayed", json!(grant.replayed)),
        (
            "replay_status",
            json!(grant.replay.map(|replay| replay.status.as_str())),
        ),
        ("request_id", json!(grant.request_id)),
    ]
}

/// The fields of a lease view; `view == None` is status `ABSENT` with null fields.
fn view_fields(
    key: &ResourceKey,
    view: Option<&LeaseView>,
    group_id: u32,
) -> Vec<(&'static str, Value)> {
    let field = |get: fn(&LeaseView) -> Value| view.map_or(Value::Null, get);
    vec![
        ("tenant_id", json!(key.tenant_id)),
        ("resource_id", json!(key.resource_id)),
        (
            "status",
            json!(view.map_or(LeaseStatus::Absent, |v| v.status).as_str()),
        ),
        ("holder_id", field(|v| json!(v.holder_id))),
        ("lease_id", field(|v| json!(v.lease_id.to_string()))),
        ("fencing_token", field(|v| json!(v.fencing_token))),
        ("remaining_ttl_ms", field(|v| json!(v.remaining_ttl_ms))),
        ("ttl_ms", field(|v| json!(v.ttl_ms))),
        ("expires_at_ms", field(|v| json!(v.expires_at_ms))),
        ("version", field(|v| json!(v.version))),
        ("group_id", json!(group_id)),
    ]
}

async fn list_report(client: &Client, leases: &[LeaseView]) -> anyhow::Result<Report> {
    let mut objects = Vec::with_capacity(leases.len());
    let mut rows = Vec::with_capacity(leases.len());
    for lease in leases {
        // The group the key maps to now (computed locally from the cached placement map).
        let group_id = client.group_of(&lease.key).await?;
        let fields = view_fields(&lease.key, Some(lease), group_id);
        rows.push(vec![
            lease.key.resource_id.clone(),
            lease.status.as_str().to_string(),
            lease.holder_id.clone(),
            lease.lease_id.to_string(),
            lease.fencing_token.to_string(),
            lease.remaining_ttl_ms.to_string(),
            lease.ttl_ms.to_string(),
            lease.version.to_string(),
            group_id.to_string(),
        ]);
        objects.push(object(fields));
    }
    let mut table = render_table(
        &[
            "RESOURCE",
            "STATUS",
            "HOLDER",
            "LEASE_ID",
            "TOKEN",
            "REMAINING_MS",
            "TTL_MS",
            "VERSION",
            "GROUP",
        ],
        &rows,
    );
    table.push_str(&format!("{} lease(s)\n", leases.len()));
    Ok(Report {
        json: json!({ "leases": objects, "count": leases.len() }),
        table,
        exit_code: 0,
    })
}

// ----- status -----

/// One node's line of the status report.
struct NodeReport {
    node_id: u64,
    client_addr: String,
    http_url: String,
    status: Result<NodeStatus, ClientError>,
}

async fn status_report(client: &Client) -> anyhow::Result<Report> {
    client
        .refresh_routing()
        .await
        .context("fetching the routing table")?;
    let routing = client.routing();
    // Ask every node at once: an unreachable node costs one attempt timeout, not one per node.
    let mut asks = tokio::task::JoinSet::new();
    for node in &routing.nodes {
        let client = client.clone();
        let node = node.clone();
        asks.spawn(async move {
            NodeReport {
                node_id: node.node_id,
                client_addr: node.addr.to_string(),
                http_url: node.http_url.clone(),
                status: client.node_status(node.node_id).await,
            }
        });
    }
    let mut nodes = Vec::new();
    while let Some(joined) = asks.join_next().await {
        nodes.push(joined.context("a status request task failed")?);
    }
    nodes.sort_by_key(|node| node.node_id);

    let mut leaders_per_node: BTreeMap<u64, Vec<u32>> = nodes
        .iter()
        .map(|node| (node.node_id, Vec::new()))
        .collect();
    let mut leaders = Vec::new();
    let mut without_leader = Vec::new();
    for (group_id, &(leader, term)) in (0u32..).zip(routing.leaders.iter()) {
        leaders.push(json!({ "group_id": group_id, "leader": leader, "term": term }));
        match leader {
            Some(node) => leaders_per_node.entry(node).or_default().push(group_id),
            None => without_leader.push(group_id),
        }
    }

    // The routing table is one node's view: a leader that just became unreachable is still
    // named until an election replaces it. Those groups are reported apart.
    let unreachable: Vec<u64> = nodes
        .iter()
        .filter(|node| node.status.is_err())
        .map(|node| node.node_id)
        .collect();
    let unreachable_leader: Vec<u32> = leaders_per_node
        .iter()
        .filter(|(node, _)| unreachable.contains(node))
        .flat_map(|(_, groups)| groups.iter().copied())
        .collect();

    let node_objects: Vec<Value> = nodes.iter().map(node_json).collect();
    let json = json!({
        "placement_version": routing.placement_version,
        "groups": routing.groups,
        "nodes": node_objects,
        "leaders": leaders,
        "groups_without_leader": without_leader,
        "groups_with_unreachable_leader": unreachable_leader,
        "leaders_per_node": leaders_per_node
            .iter()
            .map(|(node, groups)| (node.to_string(), json!(groups.len())))
            .collect::<serde_json::Map<String, Value>>(),
    });

    let mut table = format!(
        "placement version {}, {} groups, {} nodes\n\n",
        routing.placement_version,
        routing.groups,
        nodes.len()
    );
    let rows: Vec<Vec<String>> = nodes.iter().map(node_row).collect();
    table.push_str(&render_table(
        &[
            "NODE",
            "CLIENT",
            "HTTP",
            "REACHABLE",
            "READY",
            "HOSTED",
            "LED",
            "APPLY_LAG",
            "REPL_LAG",
            "ERROR",
        ],
        &rows,
    ));
    table.push('\n');
    for (node, groups) in &leaders_per_node {
        let note = if unreachable.contains(node) && !groups.is_empty() {
            " (unreachable: an election may be under way)"
        } else {
            ""
        };
        table.push_str(&format!(
            "node {node} leads {} group(s){note}: {}\n",
            groups.len(),
            ranges(groups)
        ));
    }
    table.push_str(&format!(
        "groups without a leader: {}\n",
        if without_leader.is_empty() {
            "none".to_string()
        } else {
            ranges(&without_leader)
        }
    ));
    Ok(Report {
        json,
        table,
        exit_code: 0,
    })
}

/// Largest `committed - applied` over the hosted groups, and largest `last_log_index - matched`
/// over the followers of the groups the node leads.
fn lags(hosted: &[GroupStatus]) -> (u64, u64) {
    let apply = hosted
        .iter()
        .map(|g| g.committed_index.saturating_sub(g.applied_index))
        .max()
        .unwrap_or(0);
    let replication = hosted
        .iter()
        .filter(|g| g.is_leader)
        .flat_map(|g| {
            g.followers
                .iter()
                .map(|f| g.last_log_index.saturating_sub(f.matched_index))
        })
        .max()
        .unwrap_or(0);
    (apply, replication)
}

fn node_json(node: &NodeReport) -> Value {
    match &node.status {
        Ok(status) => {
            let (apply_lag, replication_lag) = lags(&status.hosted);
            json!({
                "node_id": node.node_id,
                "client_addr": node.client_addr,
                "http_url": node.http_url,
                "reachable": true,
                "ready": status.ready,
                "shutting_down": status.shutting_down,
                "error": Value::Null,
                "placement_version": status.placement_version,
                "groups_hosted": status.hosted.len(),
                "groups_led": status.hosted.iter().filter(|g| g.is_leader).count(),
                "apply_lag_max": apply_lag,
                "replication_lag_max": replication_lag,
            })
        }
        Err(error) => json!({
            "node_id": node.node_id,
            "client_addr": node.client_addr,
            "http_url": node.http_url,
            "reachable": false,
            "ready": false,
            "shutting_down": Value::Null,
            "error": error.to_string(),
            "placement_version": Value::Null,
            "groups_hosted": Value::Null,
            "groups_led": Value::Null,
            "apply_lag_max": Value::Null,
            "replication_lag_max": Value::Null,
        }),
    }
}

fn node_row(node: &NodeReport) -> Vec<String> {
    let mut row = vec![
        node.node_id.to_string(),
        node.client_addr.clone(),
        node.http_url.clone(),
    ];
    match &node.status {
        Ok(status) => {
            let (apply_lag, replication_lag) = lags(&status.hosted);
            let ready = if status.shutting_down {
                "stopping"
            } else if status.ready {
                "yes"
            } else {
                "no"
            };
            row.extend([
                "yes".to_string(),
                ready.to_string(),
                status.hosted.len().to_string(),
                status
                    .hosted
                    .iter()
                    .filter(|g| g.is_leader)
                    .count()
                    .to_string(),
                apply_lag.to_string(),
                replication_lag.to_string(),
                "-".to_string(),
            ]);
        }
        Err(error) => {
            row.extend(["no", "-", "-", "-", "-", "-"].map(String::from));
            row.push(error.to_string());
        }
    }
    row
}

/// `[0, 1, 2, 5, 7, 8]` -> `0-2,5,7-8`.
fn ranges(ids: &[u32]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut iter = ids.iter().copied().peekable();
    while let Some(start) = iter.next() {
        let mut end = start;
        while iter.peek() == Some(&(end + 1)) {
            end += 1;
            iter.next();
        }
        parts.push(if end == start {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
    }
    if parts.is_empty() {
        "-".to_string()
    } else {
        parts.join(",")
    }
}

// ----- output -----

fn object(fields: Vec<(&'static str, Value)>) -> Value {
    Value::Object(
        fields
            .into_iter()
            .map(|(name, value)| (name.to_string(), value))
            .collect(),
    )
}

/// A report of named fields: one JSON object, or `name  value` lines.
fn fields_report(fields: Vec<(&'static str, Value)>) -> Report {
    let width = fields.iter().map(|(name, _)| name.len()).max().unwrap_or(0);
    let mut table = String::new();
    for (name, value) in &fields {
        table.push_str(&format!("{name:<width$}  {}\n", cell(value)));
    }
    Report {
        json: object(fields),
        table,
        exit_code: 0,
    }
}

fn cell(value: &Value) -> String {
    match value {
        Value::Null => "-".to_string(),
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// Columns padded to their widest cell (the last column is not padded).
fn render_table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut text = String::new();
        for (i, (cell, width)) in cells.zip(&widths).enumerate() {
            if i > 0 {
                text.push_str("  ");
            }
            if i + 1 == headers.len() {
                text.push_str(cell);
            } else {
                text.push_str(&format!("{cell:<width$}"));
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(&mut headers.iter().copied());
    for row in rows {
        line(&mut row.iter().map(String::as_str));
    }
    out
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

// ----- errors -----

/// Exit code of a client error (see the table in the crate docs).
fn exit_code(error: &ClientError) -> u8 {
    if error.is_already_held() {
        3
    } else if error.is_lease_gone() {
        4
    } else if error.is_retryable() {
        5
    } else {
        1
    }
}

fn report_error(error: &anyhow::Error, output: Output) -> ExitCode {
    let client_error = error
        .chain()
        .find_map(|cause| cause.downcast_ref::<ClientError>());
    // The server's message alone (its code is reported beside it); otherwise the whole chain.
    let message = match client_error {
        Some(ClientError::Server { message, .. }) => message.clone(),
        _ => format!("{error:#}"),
    };
    let (code, retryable, exit) = match client_error {
        Some(client_error) => (
            client_error.code_str(),
            client_error.is_retryable(),
            exit_code(client_error),
        ),
        None => ("ERROR", false, 1),
    };
    eprintln!("tenurectl: {code}: {message}");
    if output == Output::Json {
        let mut fields = serde_json::Map::new();
        fields.insert("code".into(), json!(code));
        fields.insert("message".into(), json!(message));
        fields.insert("retryable".into(), json!(retryable));
        fields.insert("exit_code".into(), json!(exit));
        if let Some(client_error) = client_error {
            if let Some((holder_id, remaining_ttl_ms)) = client_error.current_holder() {
                fields.insert("holder_id".into(), json!(holder_id));
                fields.insert("remaining_ttl_ms".into(), json!(remaining_ttl_ms));
            }
            if let Some(after) = client_error.retry_after() {
                fields.insert("retry_after_ms".into(), json!(millis(after)));
            }
        }
        println!("{}", json!({ "error": fields }));
    }
    ExitCode::from(exit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_compress_runs() {
        assert_eq!(ranges(&[0, 1, 2, 5, 7, 8]), "0-2,5,7-8");
        assert_eq!(ranges(&[]), "-");
        assert_eq!(ranges(&[3]), "3");
    }

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn watch_cursors_parse() {
        assert_eq!(
            parse_cursor("0:12,3:7").unwrap(),
            BTreeMap::from([(0, 12), (3, 7)])
        );
        assert!(parse_cursor("").unwrap().is_empty());
        assert!(parse_cursor("0:x").is_err());
        assert!(parse_cursor("5").is_err());
    }

    #[test]
    fn tables_align() {
        let text = render_table(&["A", "LONGER"], &[vec!["xyz".into(), "1".into()]]);
        assert_eq!(text, "A    LONGER\nxyz  1\n");
    }
}
