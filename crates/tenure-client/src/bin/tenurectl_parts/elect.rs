//! `tenurectl elect NAME [VALUE]`: with VALUE, campaign in the election NAME (the library's
//! `Election` recipe: a FIFO wait, then an auto-renewed lease whose holder id carries the
//! value) and hold leadership until SIGINT/SIGTERM or `--duration-ms` (then resign) or until
//! it is lost; without VALUE, observe the leader and print every change.
//!
//! Every event is one JSON line on stdout as it happens, in either output mode: `elected`,
//! `resigned`, `withdrawn` (stopped while still waiting), `lost`; or `leader` / `no_leader`
//! when observing. No summary follows.
//!
//! Must not depend on: anything but `tenure-client`'s public API, std, tokio and serde_json.

use std::time::Duration;

use serde_json::{Value, json};
use tenure_client::{CampaignOptions, Client, ClientError, Election, Leader, LeaseState};
use tokio::signal::unix::{Signal, SignalKind, signal};

/// Exit code of an `elect` campaign whose leadership was lost (its lease's renewal was refused,
/// or none was confirmed before the safe deadline).
pub(crate) const LEADERSHIP_LOST_EXIT: u8 = 7;

/// Options of one `elect` run.
pub(crate) struct ElectRun {
    pub(crate) tenant: String,
    pub(crate) name: String,
    /// `Some`: campaign with this value; `None`: observe.
    pub(crate) value: Option<String>,
    pub(crate) candidate: String,
    pub(crate) ttl: Duration,
    pub(crate) wait: Duration,
    /// Stop after this long, counted from the start.
    pub(crate) duration: Option<Duration>,
    /// Observe: stop after this many lines.
    pub(crate) count: Option<u64>,
}

/// The default candidate id: `HOSTNAME-PID`.
pub(crate) fn default_candidate() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "tenurectl".to_owned());
    format!("{host}-{}", std::process::id())
}

/// What ends a run other than its own events: SIGINT, SIGTERM, or the end of `--duration-ms`.
struct Stop {
    interrupt: Signal,
    terminate: Signal,
    at: Option<tokio::time::Instant>,
}

impl Stop {
    fn new(duration: Option<Duration>) -> Result<Self, ClientError> {
        let install = |kind: SignalKind| {
            signal(kind).map_err(|error| {
                ClientError::Config(format!("installing a signal handler: {error}"))
            })
        };
        Ok(Stop {
            interrupt: install(SignalKind::interrupt())?,
            terminate: install(SignalKind::terminate())?,
            at: duration.map(|duration| tokio::time::Instant::now() + duration),
        })
    }

    /// Resolves with why the run stops.
    async fn stopped(&mut self) -> &'static str {
        let at = self.at;
        let duration_over = async move {
            match at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = self.interrupt.recv() => "SIGINT",
            _ = self.terminate.recv() => "SIGTERM",
            () = duration_over => "duration",
        }
    }
}

fn print_line(line: &Value) {
    // stdout is line-buffered: each event reaches a pipe as it happens.
    println!("{line}");
}

fn leader_line(name: &str, leader: Option<&Leader>) -> Value {
    match leader {
        Some(leader) => json!({
            "event": "leader",
            "name": name,
            "candidate": leader.candidate_id,
            "value": leader.value,
            "fencing_token": leader.fencing_token,
            "lease_id": leader.lease_id.to_string(),
        }),
        None => json!({ "event": "no_leader", "name": name }),
    }
}

/// Runs `elect`; returns the exit code (0, or [`LEADERSHIP_LOST_EXIT`]). Errors (the wait ran
/// out: ALREADY_HELD, exit 3) are the caller's to report.
pub(crate) async fn run_elect(client: &Client, run: ElectRun) -> Result<u8, ClientError> {
    let election = Election::new(client, run.tenant.clone(), run.name.clone());
    let mut stop = Stop::new(run.duration)?;
    match run.value.clone() {
        Some(value) => campaign(&election, &run, value, &mut stop).await,
        None => observe(&election, &run, &mut stop).await,
    }
}

async fn observe(election: &Election, run: &ElectRun, stop: &mut Stop) -> Result<u8, ClientError> {
    let mut leaders = election.observe().await?;
    let mut lines = 0u64;
    while run.count.is_none_or(|count| lines < count) {
        tokio::select! {
            change = leaders.changed() => {
                print_line(&leader_line(&run.name, change?.as_ref()));
                lines += 1;
            }
            _ = stop.stopped() => break,
        }
    }
    Ok(0)
}

async fn campaign(
    election: &Election,
    run: &ElectRun,
    value: String,
    stop: &mut Stop,
) -> Result<u8, ClientError> {
    let mut options = CampaignOptions::new(run.candidate.clone(), value, run.ttl, run.wait);
    options.request_id = Some(format!(
        "tenurectl-elect-{}-{:x}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_nanos())
    ));
    let leadership = tokio::select! {
        elected = election.campaign_with(options.clone()) => elected?,
        why = stop.stopped() => {
            // Leave the queue now (and give back a grant that beat the withdrawal), before the
            // client closes.
            if let Err(error) = election.withdraw(&options).await {
                eprintln!("tenurectl: withdrawing the candidacy: {error} (it ends with its wait)");
            }
            print_line(&json!({
                "event": "withdrawn",
                "name": run.name,
                "candidate": run.candidate,
                "reason": why,
            }));
            return Ok(0);
        }
    };
    let elected = |event: &str| {
        json!({
            "event": event,
            "name": run.name,
            "candidate": leadership.candidate_id(),
            "value": leadership.value(),
            "fencing_token": leadership.fencing_token(),
            "lease_id": leadership.lease().lease_id().to_string(),
        })
    };
    print_line(&elected("elected"));
    let mut resigned = elected("resigned");
    tokio::select! {
        state = leadership.lost() => {
            let mut line = elected("lost");
            line["reason"] = json!(match state {
                LeaseState::Lost(reason) => reason.to_string(),
                other => format!("{other:?}"),
            });
            print_line(&line);
            Ok(LEADERSHIP_LOST_EXIT)
        }
        why = stop.stopped() => {
            resigned["reason"] = json!(why);
            leadership.resign().await?;
            print_line(&resigned);
            Ok(0)
        }
    }
}
