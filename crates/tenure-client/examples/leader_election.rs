//! A fenced leader-election loop a service can copy: candidates compete for one lease (the
//! election), the holder works only while its lease is valid, tags every unit of work with the
//! lease's fencing token, and stops the moment the lease is lost.
//!
//! Run it against `tenure dev` (`./scripts/run.sh` writes `tenure-dev/cluster.json`), two copies
//! in two terminals:
//!
//! ```sh
//! cargo run --release -p tenure-client --example leader_election -- \
//!     --cluster tenure-dev/cluster.json --tenant acme --resource election/reports \
//!     --candidate a --ttl-ms 5000 --run-s 30
//! cargo run --release -p tenure-client --example leader_election -- \
//!     --cluster tenure-dev/cluster.json --tenant acme --resource election/reports \
//!     --candidate b --ttl-ms 5000 --run-s 30
//! ```
//!
//! Two copies started together elect exactly one leader; the other reports who leads and
//! retries. Ctrl-C on the leader (or the end of its `--run-s`) releases the lease, so the other
//! takes over at once; `kill -9` of the leader leaves its lease to expire, so the other takes
//! over after the ttl (here 5 s), with a larger fencing token. Every run stops by itself after
//! `--run-s` seconds.
//!
//! Real output (`tenure dev`: 3 node processes, 64 groups; `a` and `b` started together with
//! `--ttl-ms 5000 --run-s 15`, the leader `a` killed with `kill -9` 4.5 s later; `b` is elected
//! when `a`'s last renewal runs out, with a larger fencing token):
//!
//! ```text
//!   0.01s [a] elected: lease 0000002b-0000000000000001 fencing token 1 (safe for 4844 ms)
//!   1.01s [a] work unit 1 done with fencing token 1 (safe for 3843 ms, 0 renewals)
//!   4.01s [a] work unit 4 done with fencing token 1 (safe for 4175 ms, 2 renewals)
//!   0.01s [b] a leads (4997 ms left on its lease); retrying in 881 ms
//!   4.93s [b] a leads (3412 ms left on its lease); retrying in 1367 ms
//!   8.32s [b] a leads (18 ms left on its lease); retrying in 38 ms
//!   8.36s [b] elected: lease 0000002b-0000000000000002 fencing token 2 (safe for 4847 ms)
//!   9.36s [b] work unit 1 done with fencing token 2 (safe for 3845 ms, 0 renewals)
//!  15.01s [b] run time over: released lease 0000002b-0000000000000002 (token 2) at log time 29043 ms
//! ```
//!
//! Why the fencing token matters, also real: the leader `a` frozen with `kill -STOP` for 8 s
//! (`b` takes over at 6.2 s), then resumed. The unit of work that was under way completes after
//! `a`'s safe deadline, before the loss signal got a chance to run; its writes carry token 9
//! while `b` already writes with token 10, so only the downstream check keeps them out:
//!
//! ```text
//!   2.01s [a] work unit 2 done with fencing token 9 (safe for 4512 ms, 1 renewals)
//!   6.17s [b] elected: lease 0000002b-000000000000000a fencing token 10 (safe for 4847 ms)
//!  10.51s [a] work unit 3 with fencing token 9 finished after the safe deadline: downstream must refuse it if a newer token was seen
//!  10.51s [a] lost leadership: no renewal was confirmed before the safe deadline
//!  10.51s [a] b leads (4504 ms left on its lease); retrying in 1151 ms
//! ```
//!
//! Must not depend on: anything but the public `tenure-client` API (it is what a service sees).

#![allow(clippy::print_stdout)]

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use rand::rngs::SmallRng;
use rand::{Rng as _, SeedableRng as _};
use tenure_client::{Client, Credentials, Lease, LeaseState};
use tokio::sync::watch;
use tokio::time::{Instant, sleep};

/// A fenced leader-election loop.
#[derive(Debug, Parser)]
struct Args {
    /// The cluster file `tenure dev` writes.
    #[arg(long, value_name = "FILE", default_value = "tenure-dev/cluster.json")]
    cluster: PathBuf,
    /// The tenant the election belongs to.
    #[arg(long, default_value = "acme")]
    tenant: String,
    /// The election's name: the resource every candidate competes for.
    #[arg(long, default_value = "election/reports")]
    resource: String,
    /// This candidate's id (the lease's holder id).
    #[arg(long)]
    candidate: String,
    /// Lease ttl in milliseconds: how long a crashed leader blocks the others.
    #[arg(long, default_value_t = 10_000)]
    ttl_ms: u64,
    /// Stop after this many seconds (releasing the lease if held).
    #[arg(long, default_value_t = 30)]
    run_s: u64,
    /// Duration of one unit of work, in milliseconds.
    #[arg(long, default_value_t = 1_000)]
    work_ms: u64,
}

/// Why a term of leadership ended.
enum TermEnd {
    /// The lease was lost (renewal refused, or not confirmed before the safe deadline).
    Lost(String),
    /// Shutdown (run time over, or Ctrl-C): give the lease back.
    Stop(&'static str),
}

/// The shutdown signal: `None` while running, then why the program stops.
type Shutdown = watch::Receiver<Option<&'static str>>;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    STARTED.get_or_init(Instant::now);
    let client = Client::from_cluster_file(
        &args.cluster,
        // `tenure dev` runs in insecure development mode; a real deployment passes
        // `Credentials::Token(...)`.
        Credentials::InsecureDev {
            principal_id: args.candidate.clone(),
        },
    )
    .await
    .with_context(|| format!("connecting with {}", args.cluster.display()))?;
    // Shut down at the end of the run time or on Ctrl-C, whichever comes first.
    let (stop, shutdown) = watch::channel(None);
    let run_time = Duration::from_secs(args.run_s);
    tokio::spawn(async move {
        let why = tokio::select! {
            () = sleep(run_time) => "run time over",
            _ = tokio::signal::ctrl_c() => "interrupted",
        };
        stop.send_replace(Some(why));
    });
    let result = campaign(&client, &args, shutdown).await;
    // Releases whatever a handle still holds and closes the connections.
    client.close().await;
    result
}

/// When the program started (for the log's timestamps).
static STARTED: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

fn log(args: &Args, message: impl std::fmt::Display) {
    let elapsed = STARTED.get_or_init(Instant::now).elapsed();
    println!(
        "{:6.2}s [{}] {message}",
        elapsed.as_secs_f64(),
        args.candidate
    );
}

/// Resolves when the program should stop, with the reason.
async fn stopped(shutdown: &mut Shutdown) -> &'static str {
    loop {
        if let Some(why) = *shutdown.borrow_and_update() {
            return why;
        }
        if shutdown.changed().await.is_err() {
            return "shutdown signal gone";
        }
    }
}

/// Tries to become leader until shutdown; leads whenever elected.
async fn campaign(client: &Client, args: &Args, mut shutdown: Shutdown) -> anyhow::Result<()> {
    let ttl = Duration::from_millis(args.ttl_ms);
    let mut failures = 0u32;
    let mut rng = SmallRng::from_os_rng();
    loop {
        if let Some(why) = *shutdown.borrow() {
            log(args, format_args!("{why} (not leader)"));
            return Ok(());
        }
        let delay = match client
            .acquire(&args.tenant, &args.resource, &args.candidate, ttl)
            .await
        {
            Ok(lease) => {
                failures = 0;
                log(
                    args,
                    format_args!(
                        "elected: lease {} fencing token {} (safe for {} ms)",
                        lease.lease_id(),
                        lease.fencing_token(),
                        lease.remaining().as_millis()
                    ),
                );
                match lead(&lease, args, &mut shutdown).await {
                    TermEnd::Lost(state) => {
                        // The handle is not renewed any more. Stop acting as leader at once
                        // (done: `lead` returned) and compete again; dropping the handle
                        // releases the lease in the background if it is still ours.
                        log(args, format_args!("lost leadership: {state}"));
                        drop(lease);
                        Duration::ZERO
                    }
                    TermEnd::Stop(why) => {
                        let token = lease.fencing_token();
                        match lease.release().await {
                            Ok(receipt) => log(
                                args,
                                format_args!(
                                    "{why}: released lease {} (token {token}) at log time {} ms",
                                    receipt.lease_id, receipt.released_at_ms
                                ),
                            ),
                            Err(error) => log(args, format_args!("{why}: release failed: {error}")),
                        }
                        return Ok(());
                    }
                }
            }
            Err(error) if error.is_already_held() => {
                failures = 0;
                let (holder, remaining_ms) = error.current_holder().unwrap_or(("?", args.ttl_ms));
                // Retry within a third of the ttl (so a freed election is noticed quickly), or
                // as soon as the leader's lease would expire if that comes first; jittered so
                // candidates do not retry in lockstep.
                let cap = (args.ttl_ms / 3).min(remaining_ms).max(50);
                let delay = Duration::from_millis(rng.random_range(cap / 2..=cap));
                log(
                    args,
                    format_args!(
                        "{holder} leads ({remaining_ms} ms left on its lease); retrying in {} ms",
                        delay.as_millis()
                    ),
                );
                delay
            }
            Err(error) if error.is_retryable() => {
                // The cluster is unreachable or electing: back off and try again (the client
                // already retried within its call deadline).
                failures += 1;
                let delay = Duration::from_millis((100u64 << failures.min(5)).min(args.ttl_ms / 3));
                log(
                    args,
                    format_args!("cluster unavailable ({error}); retrying in {delay:?}"),
                );
                delay
            }
            Err(error) => return Err(error).context("acquiring the election lease"),
        };
        tokio::select! {
            () = sleep(delay) => {}
            why = stopped(&mut shutdown) => {
                log(args, format_args!("{why} (not leader)"));
                return Ok(());
            }
        }
    }
}

/// Does the leader's work while the lease is valid; returns as soon as it is lost or on
/// shutdown.
async fn lead(lease: &Lease, args: &Args, shutdown: &mut Shutdown) -> TermEnd {
    // Resolves the moment the client learns the lease is gone: a renewal was refused, or the
    // safe deadline is about to pass without a confirmed renewal (partition, overload, pause).
    let lost = lease.lost();
    tokio::pin!(lost);
    let mut unit = 0u64;
    loop {
        // `is_valid` is the contract's safe window (section 5): held, and the local monotonic
        // clock is before `sent_at + ttl * (1 - drift) - margin` of the last confirmed renewal.
        if !lease.is_valid() {
            return TermEnd::Lost(loss_reason(lease.state()));
        }
        unit += 1;
        // Every unit of work carries the fencing token. `is_valid` was true a moment ago, but
        // the process can still be paused (GC, swap, SIGSTOP, a VM migration) between that check
        // and the write landing downstream; by then the lease may have expired and another
        // candidate may lead with a larger token. Only the downstream system can tell: it
        // remembers the largest token it has accepted and refuses smaller ones, e.g.
        //   UPDATE jobs SET ..., fence = $token WHERE id = $id AND fence <= $token
        // The token never changes across renewals and strictly grows with each new leader.
        let token = lease.fencing_token();
        tokio::select! {
            biased;
            state = &mut lost => return TermEnd::Lost(loss_reason(state)),
            why = stopped(shutdown) => return TermEnd::Stop(why),
            () = do_work(args, unit, token) => {
                if lease.is_valid() {
                    log(args, format_args!(
                        "work unit {unit} done with fencing token {token} (safe for {} ms, {} renewals)",
                        lease.remaining().as_millis(),
                        lease.renewals()
                    ));
                } else {
                    // The process was paused (or starved) past its safe deadline while the work
                    // was under way: the loss signal had no chance to run first. This is the
                    // case only the downstream token check catches.
                    log(args, format_args!(
                        "work unit {unit} with fencing token {token} finished after the safe \
                         deadline: downstream must refuse it if a newer token was seen"
                    ));
                }
            }
        }
    }
}

/// Words for why a lease handle stopped being valid.
fn loss_reason(state: LeaseState) -> String {
    match state {
        LeaseState::Lost(reason) => reason.to_string(),
        LeaseState::Released => "released".to_string(),
        // Not marked lost yet, but the safe deadline passed (a pause, or a starved renewer).
        LeaseState::Held => "the safe deadline passed without a confirmed renewal".to_string(),
    }
}

/// One unit of the leader's work: here a pause; in a service, writes that carry `token`.
async fn do_work(args: &Args, _unit: u64, _token: u64) {
    sleep(Duration::from_millis(args.work_ms)).await;
}
