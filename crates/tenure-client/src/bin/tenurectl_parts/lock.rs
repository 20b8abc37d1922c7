//! `tenurectl lock NAME -- COMMAND ...`: waits for a lock (a lease bound to a session, from
//! the resource's FIFO wait queue), runs the command while it holds it, and stops the command
//! before the lease's safe deadline if the lock is lost.
//!
//! The command never runs outside the safe window, even when `tenurectl` itself is paused
//! (SIGSTOP), killed, or starved: the command is started and stopped by a watchdog process (this
//! same binary, re-executed with [`WATCHDOG_ARG`]) that `tenurectl` only feeds with deadlines.
//! The watchdog knows the latest safe deadline it was sent, in the system-wide monotonic clock
//! (`CLOCK_MONOTONIC`), and stops the command's process group by itself: SIGTERM at the deadline
//! minus the grace minus a margin, SIGKILL at the deadline minus the margin, whether or not it
//! hears from `tenurectl` again. A paused `tenurectl` sends no newer deadline (its session's
//! keep-alives stop too), so the command is stopped by the last one. If `tenurectl` exits or
//! dies, the watchdog's input closes and the command is stopped at once (SIGTERM, SIGKILL after
//! the grace or at the deadline's margin, whichever is first).
//!
//! Must not depend on: anything but `tenure-client`'s public API, std and rustix.

use std::io::{BufRead as _, BufReader, Write as _};
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal};
use serde_json::json;
use tenure_client::{Client, ClientError, SessionLease};

/// The hidden first argument that makes `tenurectl` the lock's watchdog.
pub(crate) const WATCHDOG_ARG: &str = "__lock-watchdog";

/// Time before the safe deadline by which the command must be gone: SIGKILL goes out at the
/// deadline minus this, and the kernel ends the process group well within it.
pub(crate) const KILL_MARGIN: Duration = Duration::from_millis(200);

/// How often `tenurectl` sends the current deadline (and notices the command's end).
const FEED_INTERVAL: Duration = Duration::from_millis(50);

/// The system-wide monotonic clock, in nanoseconds (shared by `tenurectl` and its watchdog).
fn monotonic_ns() -> u64 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    let seconds = u64::try_from(now.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(now.tv_nsec).unwrap_or(0);
    seconds.saturating_mul(1_000_000_000).saturating_add(nanos)
}

/// `deadline` (a std monotonic instant) in the shared clock.
fn deadline_ns(deadline: Instant) -> u64 {
    let now_ns = monotonic_ns();
    let left = deadline.saturating_duration_since(Instant::now());
    now_ns.saturating_add(u64::try_from(left.as_nanos()).unwrap_or(u64::MAX))
}

/// Sends `signal` to the process group of `pid` (the command runs in a group of its own).
fn signal_group(pid: u32, signal: Signal) {
    let Some(pid) = i32::try_from(pid).ok().and_then(Pid::from_raw) else {
        return;
    };
    // The group may be gone already: nothing left to stop.
    let _ = rustix::process::kill_process_group(pid, signal);
}

/// What the watchdog reports when the command has ended (one line on its stdout).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stopped {
    /// The command ended by itself.
    No,
    /// The watchdog sent SIGTERM (the lock was lost, or its deadline came near).
    Term,
    /// The watchdog sent SIGKILL too.
    Kill,
}

/// The watchdog process: `tenurectl __lock-watchdog GRACE_MS -- COMMAND ...`. Reads
/// `deadline NS` and `stop` lines on stdin; starts the command only after the first deadline;
/// prints `exited CODE SIGNAL STOPPED` when it has ended. Exits 0, or 1 if the command could not
/// start.
pub(crate) fn watchdog_main(args: &[String]) -> u8 {
    let (grace, command) = match args {
        [grace_ms, separator, command @ ..] if separator == "--" && !command.is_empty() => {
            match grace_ms.parse::<u64>() {
                Ok(ms) => (Duration::from_millis(ms), command),
                Err(_) => return 1,
            }
        }
        _ => return 1,
    };
    let (lines_tx, lines) = mpsc::channel::<Option<String>>();
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        for line in stdin.lock().lines() {
            match line {
                Ok(line) => {
                    if lines_tx.send(Some(line)).is_err() {
                        return;
                    }
                }
                Err(_) => break,
            }
        }
        let _ = lines_tx.send(None);
    });
    // Nothing runs before the first deadline.
    let mut deadline_ns = match lines.recv() {
        Ok(Some(line)) => match parse_deadline(&line) {
            Some(ns) => ns,
            None => return 1,
        },
        _ => return 1,
    };
    let mut child = match Command::new(&command[0])
        .args(&command[1..])
        .process_group(0)
        .spawn()
    {
        Ok(child) => child,
        Err(error) => {
            println!("failed {error}");
            return 1;
        }
    };
    let grace_ns = u64::try_from(grace.as_nanos()).unwrap_or(u64::MAX);
    let margin_ns = u64::try_from(KILL_MARGIN.as_nanos()).unwrap_or(u64::MAX);
    let mut stopped = Stopped::No;
    // When SIGKILL goes out whatever happens (the deadline's margin, or the grace after an
    // early SIGTERM).
    let mut kill_at_ns = deadline_ns.saturating_sub(margin_ns);
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            report_exit(status, stopped);
            return 0;
        }
        let now_ns = monotonic_ns();
        let term_at_ns = deadline_ns.saturating_sub(margin_ns.saturating_add(grace_ns));
        if stopped == Stopped::No && now_ns >= term_at_ns {
            signal_group(child.id(), Signal::TERM);
            stopped = Stopped::Term;
        }
        if stopped != Stopped::Kill && now_ns >= kill_at_ns {
            signal_group(child.id(), Signal::KILL);
            stopped = Stopped::Kill;
        }
        let next_ns = if stopped == Stopped::No {
            term_at_ns
        } else {
            kill_at_ns
        };
        // Wake at the next signal's time, and at least every 10 ms to notice the command's end.
        let wait = Duration::from_nanos(next_ns.saturating_sub(now_ns))
            .min(Duration::from_millis(10))
            .max(Duration::from_millis(1));
        match lines.recv_timeout(wait) {
            Ok(Some(line)) if line == "stop" => {
                stop_now(&mut child, &mut stopped, &mut kill_at_ns, grace_ns);
            }
            Ok(Some(line)) => {
                if let Some(ns) = parse_deadline(&line) {
                    // A deadline only moves later (a keep-alive), never past a stop.
                    if stopped == Stopped::No && ns > deadline_ns {
                        deadline_ns = ns;
                        kill_at_ns = deadline_ns.saturating_sub(margin_ns);
                    }
                }
            }
            // tenurectl is gone: nobody holds the lock any more.
            Ok(None) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                stop_now(&mut child, &mut stopped, &mut kill_at_ns, grace_ns);
                wait_until_gone(&mut child, stopped, kill_at_ns);
                return 0;
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
    }
}

fn parse_deadline(line: &str) -> Option<u64> {
    line.strip_prefix("deadline ")?.trim().parse().ok()
}

/// SIGTERM now (once); SIGKILL after the grace, or at the deadline's margin if that is sooner.
fn stop_now(child: &mut Child, stopped: &mut Stopped, kill_at_ns: &mut u64, grace_ns: u64) {
    if *stopped == Stopped::No {
        signal_group(child.id(), Signal::TERM);
        *stopped = Stopped::Term;
        *kill_at_ns = (*kill_at_ns).min(monotonic_ns().saturating_add(grace_ns));
    }
}

/// After tenurectl went away: enforce the kill time, then report.
fn wait_until_gone(child: &mut Child, mut stopped: Stopped, kill_at_ns: u64) {
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            report_exit(status, stopped);
            return;
        }
        if stopped != Stopped::Kill && monotonic_ns() >= kill_at_ns {
            signal_group(child.id(), Signal::KILL);
            stopped = Stopped::Kill;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn report_exit(status: ExitStatus, stopped: Stopped) {
    let code = status.code().map_or(-1, i64::from);
    let signal = status.signal().map_or(0, i64::from);
    let stopped = match stopped {
        Stopped::No => "none",
        Stopped::Term => "term",
        Stopped::Kill => "kill",
    };
    println!("exited {code} {signal} {stopped}");
    let _ = std::io::stdout().flush();
}

/// How a `tenurectl lock` run ended.
#[derive(Debug)]
pub(crate) struct LockOutcome {
    /// The lock's grant.
    pub(crate) lease: SessionLease,
    /// The command's exit code (`None` when a signal ended it).
    pub(crate) code: Option<i64>,
    /// The signal that ended it, if one did.
    pub(crate) signal: Option<i64>,
    /// What the watchdog sent it: `none`, `term` or `kill`.
    pub(crate) stopped: String,
    /// Why the lock was lost, if it was.
    pub(crate) lost: Option<String>,
    /// Whether the lock was released after the command ended by itself.
    pub(crate) released: bool,
    /// How long the command ran, in milliseconds.
    pub(crate) ran_ms: u64,
}

impl LockOutcome {
    /// The exit code tenurectl ends with: the command's own when it ended by itself (128 +
    /// signal when a signal it did not get from us ended it), [`LOCK_LOST_EXIT`] when the lock
    /// was lost and the command was stopped.
    pub(crate) fn exit_code(&self) -> u8 {
        if self.lost.is_some() || self.stopped != "none" {
            return LOCK_LOST_EXIT;
        }
        match (self.code, self.signal) {
            (Some(code), _) => u8::try_from(code).unwrap_or(1),
            (None, Some(signal)) => u8::try_from(128 + signal).unwrap_or(1),
            (None, None) => 1,
        }
    }

    pub(crate) fn json(&self) -> serde_json::Value {
        json!({
            "outcome": if self.exit_code() == LOCK_LOST_EXIT && self.lost.is_some() {
                "lock_lost"
            } else if self.stopped != "none" {
                "command_stopped"
            } else {
                "command_exited"
            },
            "resource_id": self.lease.key.resource_id,
            "lease_id": self.lease.lease_id.to_string(),
            "fencing_token": self.lease.fencing_token,
            "command_exit_code": self.code,
            "command_signal": self.signal,
            "stopped_with": self.stopped,
            "lost": self.lost,
            "released": self.released,
            "ran_ms": self.ran_ms,
        })
    }
}

/// Exit code of a lock run whose lock was lost (the command was stopped).
pub(crate) const LOCK_LOST_EXIT: u8 = 6;

/// Options of one lock run.
pub(crate) struct LockRun {
    pub(crate) tenant: String,
    pub(crate) name: String,
    pub(crate) holder: String,
    pub(crate) ttl: Duration,
    pub(crate) wait: Duration,
    pub(crate) grace: Duration,
    pub(crate) command: Vec<String>,
}

/// Waits for the lock, runs the command under the watchdog, stops it on loss, releases on exit.
pub(crate) async fn run_lock(client: &Client, run: LockRun) -> Result<LockOutcome, ClientError> {
    let session = client.session(run.tenant.clone(), run.holder.clone(), run.ttl)?;
    let lease = session
        .acquire_wait(run.name.clone(), run.wait, None)
        .await?;
    let group = lease.group_id;
    let Some(first_deadline) = session.safe_deadline(group).filter(|d| *d > Instant::now()) else {
        let _ = session.close().await;
        return Err(ClientError::InvalidRequest(
            "the lock was granted past its safe deadline (the session is not keeping up)".into(),
        ));
    };
    eprintln!(
        "tenurectl: lock {} acquired by {}: lease {} fencing token {}",
        run.name, run.holder, lease.lease_id, lease.fencing_token
    );
    let exe = std::env::current_exe()
        .map_err(|error| ClientError::Config(format!("finding tenurectl's own path: {error}")))?;
    let mut watchdog = Command::new(exe)
        .arg(WATCHDOG_ARG)
        .arg(run.grace.as_millis().to_string())
        .arg("--")
        .args(&run.command)
        .env("TENURE_LOCK_NAME", &run.name)
        .env("TENURE_LOCK_HOLDER", &run.holder)
        .env("TENURE_TENANT", &run.tenant)
        .env("TENURE_LEASE_ID", lease.lease_id.to_string())
        .env("TENURE_FENCING_TOKEN", lease.fencing_token.to_string())
        // A process group of its own: a Ctrl-C in the terminal reaches tenurectl, which stops
        // the command through the watchdog; the watchdog must outlive it until the command is
        // gone.
        .process_group(0)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|error| ClientError::Config(format!("starting the lock's watchdog: {error}")))?;
    let started = Instant::now();
    let (Some(mut feed), Some(report)) = (watchdog.stdin.take(), watchdog.stdout.take()) else {
        let _ = watchdog.kill();
        return Err(ClientError::Config("the watchdog has no pipes".into()));
    };
    let (report_tx, mut report_rx) = tokio::sync::mpsc::channel::<String>(4);
    std::thread::spawn(move || {
        for line in BufReader::new(report).lines() {
            let Ok(line) = line else { break };
            if report_tx.blocking_send(line).is_err() {
                break;
            }
        }
    });
    let mut sent_ns = deadline_ns(first_deadline);
    send_line(&mut feed, &format!("deadline {sent_ns}"));
    let mut lost: Option<String> = None;
    let mut ticker = tokio::time::interval(FEED_INTERVAL);
    let exited = loop {
        tokio::select! {
            line = report_rx.recv() => break line,
            loss = session.lost(), if lost.is_none() => {
                if loss.group_id == group {
                    eprintln!("tenurectl: lock {} lost in group {group}: {}; stopping the command", run.name, loss.reason);
                    lost = Some(loss.reason);
                    send_line(&mut feed, "stop");
                }
            }
            _ = ticker.tick() => {
                if lost.is_none() {
                    match session.safe_deadline(group) {
                        Some(deadline) => {
                            let ns = deadline_ns(deadline);
                            // Only a later deadline is news (a keep-alive confirmed).
                            if ns > sent_ns + 1_000_000 {
                                sent_ns = ns;
                                send_line(&mut feed, &format!("deadline {ns}"));
                            }
                        }
                        None => {
                            lost = Some("the session has no record in the lock's group".into());
                            send_line(&mut feed, "stop");
                        }
                    }
                }
            }
        }
    };
    drop(feed);
    let _ = watchdog.wait();
    let ran_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let mut fields = exited.as_deref().unwrap_or("").split_whitespace().skip(1);
    let code = fields
        .next()
        .and_then(|c| c.parse::<i64>().ok())
        .filter(|c| *c >= 0);
    let signal = fields
        .next()
        .and_then(|s| s.parse::<i64>().ok())
        .filter(|s| *s > 0);
    let stopped = fields.next().unwrap_or("none").to_owned();
    if exited.is_none() || exited.as_deref().is_some_and(|l| l.starts_with("failed")) {
        let _ = session.close().await;
        return Err(ClientError::Config(format!(
            "the command could not be started: {}",
            exited.unwrap_or_default()
        )));
    }
    // The command has ended; the lock goes back (or to the next waiter) at once.
    let released = lost.is_none() && session.release(&lease).await.is_ok();
    let _ = session.close().await;
    Ok(LockOutcome {
        lease,
        code,
        signal,
        stopped,
        lost,
        released,
        ran_ms,
    })
}

fn send_line(feed: &mut ChildStdin, line: &str) {
    let _ = writeln!(feed, "{line}");
    let _ = feed.flush();
}
