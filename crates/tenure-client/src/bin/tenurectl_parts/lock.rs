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
//! dies, the watchdog's socket closes and the command is stopped at once (SIGTERM, SIGKILL after
//! the grace or at the deadline's margin, whichever is first). If the watchdog dies, the kernel
//! kills the command (its parent-death signal) and `tenurectl` kills the rest of its group.
//! When the command ends by itself, whatever it left running in its process group is killed
//! before the lock is released: a lock's work never outlives the lock (a process that left the
//! group, with `setsid`, is beyond reach).
//!
//! `tenurectl` and the watchdog talk over a Unix socket in a fresh directory only this user can
//! enter, so that the command gets `tenurectl`'s own stdin, stdout and stderr.
//!
//! Must not depend on: anything but `tenure-client`'s public API, std and rustix.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::process::{Child, Command, ExitStatus};
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

/// What the watchdog reports when the command has ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stopped {
    /// The command ended by itself.
    No,
    /// The watchdog sent SIGTERM (the lock was lost, or its deadline came near).
    Term,
    /// The watchdog sent SIGKILL too.
    Kill,
}

/// The watchdog process: `tenurectl __lock-watchdog GRACE_MS SOCKET -- COMMAND ...`. Talks to
/// `tenurectl` over the Unix socket at SOCKET (in a directory only this user can enter): reads
/// `deadline NS` and `stop` lines; starts the command only after the first deadline, and only
/// if the time to stop it has not come yet; reports `started PID`, then `exited CODE SIGNAL
/// STOPPED` when it has ended (or `failed REASON`). The command gets `tenurectl`'s own stdin,
/// stdout and stderr (the socket is close-on-exec). Exits 0, or 1 if the command could not start.
pub(crate) fn watchdog_main(args: &[String]) -> u8 {
    let (grace, socket, command) = match args {
        [grace_ms, socket, separator, command @ ..] if separator == "--" && !command.is_empty() => {
            match grace_ms.parse::<u64>() {
                Ok(ms) => (Duration::from_millis(ms), socket, command),
                Err(_) => return 1,
            }
        }
        _ => return 1,
    };
    let Ok(stream) = UnixStream::connect(socket) else {
        return 1;
    };
    let Ok(reader) = stream.try_clone() else {
        return 1;
    };
    let mut report = Reporter(stream);
    let (lines_tx, lines) = mpsc::channel::<Option<String>>();
    std::thread::spawn(move || {
        for line in BufReader::new(reader).lines() {
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
    let grace_ns = u64::try_from(grace.as_nanos()).unwrap_or(u64::MAX);
    let margin_ns = u64::try_from(KILL_MARGIN.as_nanos()).unwrap_or(u64::MAX);
    if monotonic_ns() >= deadline_ns.saturating_sub(margin_ns.saturating_add(grace_ns)) {
        report.line("failed the lock's safe deadline came before the command could start");
        return 1;
    }
    // Descendants the command leaves behind become this process's children, so that they are
    // reaped (and counted) once the command's group is killed. Best effort: without it, init
    // reaps them.
    let _ = rustix::process::set_child_subreaper(Some(rustix::process::getpid()));
    let mut child = match spawn_command(command) {
        Ok(child) => child,
        Err(error) => {
            report.line(&format!("failed {error}"));
            return 1;
        }
    };
    report.line(&format!("started {}", child.id()));
    let mut stopped = Stopped::No;
    // When SIGKILL goes out whatever happens (the deadline's margin, or the grace after an
    // early SIGTERM).
    let mut kill_at_ns = deadline_ns.saturating_sub(margin_ns);
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            end_group(child.id(), kill_at_ns);
            report.exit(status, stopped);
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
                wait_until_gone(&mut child, stopped, kill_at_ns, &mut report);
                return 0;
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
    }
}

/// Starts the command in a process group of its own, with the watchdog's stdio. It is killed
/// if the watchdog dies (the parent-death signal), so that it never runs unwatched.
fn spawn_command(command: &[String]) -> std::io::Result<Child> {
    let watchdog = rustix::process::getpid();
    let mut builder = Command::new(&command[0]);
    builder.args(&command[1..]).process_group(0);
    set_parent_death_kill(&mut builder, watchdog);
    builder.spawn()
}

/// Asks the kernel to SIGKILL the command when the watchdog dies, and refuses to start it if
/// the watchdog is already gone.
// The one unsafe block of the crate: `pre_exec` runs between fork and exec, where only
// async-signal-safe calls are allowed. `prctl(PR_SET_PDEATHSIG)` and `getppid` are plain system
// calls (rustix makes them directly, no allocation, no locks).
#[allow(unsafe_code)]
fn set_parent_death_kill(builder: &mut Command, watchdog: Pid) {
    // SAFETY: the closure only makes two system calls; it allocates nothing and takes no lock.
    unsafe {
        builder.pre_exec(move || {
            rustix::process::set_parent_process_death_signal(Some(Signal::KILL))?;
            if rustix::process::getppid() != Some(watchdog) {
                return Err(std::io::Error::other("the lock's watchdog is gone"));
            }
            Ok(())
        });
    }
}

/// After the command (its group's leader) has ended: kills whatever it left behind in its
/// group (a lock's work must not outlive the lock), and waits for the group to be empty,
/// reaping what became this process's children, until the kill time at the latest (and at
/// least 1 s).
fn end_group(pid: u32, kill_at_ns: u64) {
    let Some(group) = i32::try_from(pid).ok().and_then(Pid::from_raw) else {
        return;
    };
    if rustix::process::test_kill_process_group(group).is_err() {
        return;
    }
    signal_group(pid, Signal::KILL);
    let give_up_ns = kill_at_ns.max(monotonic_ns().saturating_add(1_000_000_000));
    while monotonic_ns() < give_up_ns {
        // Reap every child that has ended (left-behind processes, as the subreaper).
        while let Ok(Some(_)) = rustix::process::wait(rustix::process::WaitOptions::NOHANG) {}
        if rustix::process::test_kill_process_group(group).is_err() {
            return;
        }
        std::thread::sleep(Duration::from_millis(2));
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
fn wait_until_gone(
    child: &mut Child,
    mut stopped: Stopped,
    kill_at_ns: u64,
    report: &mut Reporter,
) {
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            end_group(child.id(), kill_at_ns);
            report.exit(status, stopped);
            return;
        }
        if stopped != Stopped::Kill && monotonic_ns() >= kill_at_ns {
            signal_group(child.id(), Signal::KILL);
            stopped = Stopped::Kill;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The watchdog's reports to `tenurectl`, one line each on the socket.
struct Reporter(UnixStream);

impl Reporter {
    fn line(&mut self, line: &str) {
        // tenurectl may be gone; the watchdog goes on stopping the command regardless.
        let _ = writeln!(self.0, "{line}");
        let _ = self.0.flush();
    }

    fn exit(&mut self, status: ExitStatus, stopped: Stopped) {
        let code = status.code().map_or(-1, i64::from);
        let signal = status.signal().map_or(0, i64::from);
        let stopped = match stopped {
            Stopped::No => "none",
            Stopped::Term => "term",
            Stopped::Kill => "kill",
        };
        self.line(&format!("exited {code} {signal} {stopped}"));
    }
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
    let channel = WatchdogSocket::bind()?;
    let mut watchdog = Command::new(exe)
        .arg(WATCHDOG_ARG)
        .arg(run.grace.as_millis().to_string())
        .arg(&channel.path)
        .arg("--")
        .args(&run.command)
        .env("TENURE_LOCK_NAME", &run.name)
        .env("TENURE_LOCK_HOLDER", &run.holder)
        .env("TENURE_TENANT", &run.tenant)
        .env("TENURE_LEASE_ID", lease.lease_id.to_string())
        .env("TENURE_FENCING_TOKEN", lease.fencing_token.to_string())
        // A process group of its own: a Ctrl-C in the terminal reaches tenurectl, which stops
        // the command through the watchdog; the watchdog must outlive it until the command is
        // gone. Its stdio (and so the command's) is tenurectl's own.
        .process_group(0)
        .spawn()
        .map_err(|error| ClientError::Config(format!("starting the lock's watchdog: {error}")))?;
    let stream = match channel.accept(&mut watchdog).await {
        Ok(stream) => stream,
        Err(error) => {
            let _ = watchdog.kill();
            let _ = watchdog.wait();
            let _ = session.close().await;
            return Err(error);
        }
    };
    let started = Instant::now();
    let (mut feed, report) = match stream.try_clone() {
        Ok(report) => (stream, report),
        Err(error) => {
            let _ = watchdog.kill();
            let _ = watchdog.wait();
            let _ = session.close().await;
            return Err(ClientError::Config(format!(
                "the watchdog's socket: {error}"
            )));
        }
    };
    let (report_tx, mut report_rx) = tokio::sync::mpsc::channel::<String>(4);
    std::thread::spawn(move || {
        // Bounded: the watchdog sends two lines; a longer one is not ours.
        for line in BufReader::new(report.take(REPORT_BYTES_MAX)).lines() {
            let Ok(line) = line else { break };
            if report_tx.blocking_send(line).is_err() {
                break;
            }
        }
    });
    let mut sent_ns = deadline_ns(first_deadline);
    send_line(&mut feed, &format!("deadline {sent_ns}"));
    let mut lost: Option<String> = None;
    let mut command_pid: Option<u32> = None;
    let mut ticker = tokio::time::interval(FEED_INTERVAL);
    let exited = loop {
        tokio::select! {
            line = report_rx.recv() => match line {
                Some(line) if line.starts_with("started ") => {
                    command_pid = line["started ".len()..].trim().parse().ok();
                }
                other => break other,
            },
            loss = session.lost(), if lost.is_none() => {
                if loss.group_id == group {
                    eprintln!("tenurectl: lock {} lost in group {group}: {}; stopping the command", run.name, loss.reason);
                    lost = Some(loss.reason);
                    send_line(&mut feed, "stop");
                }
            }
            _ = ticker.tick() => {
                // A watchdog that died (killed from outside) stops nothing: its command got the
                // parent-death SIGKILL; its group's other processes get it from here.
                if let Ok(Some(status)) = watchdog.try_wait() {
                    if let Some(pid) = command_pid {
                        signal_group(pid, Signal::KILL);
                    }
                    lost.get_or_insert_with(|| format!("the lock's watchdog ended ({status}); the command was killed"));
                    break Some(format!("exited -1 {} kill", Signal::KILL.as_raw()));
                }
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
    if command_pid.is_none() || !exited.as_deref().is_some_and(|l| l.starts_with("exited ")) {
        let _ = session.close().await;
        return Err(ClientError::Config(format!(
            "the command could not be started: {}",
            exited.unwrap_or_else(|| "the watchdog ended without a report".into())
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

/// Longest report the watchdog sends, in bytes (two short lines).
const REPORT_BYTES_MAX: u64 = 4_096;

/// How long the watchdog has to connect to `tenurectl`.
const WATCHDOG_CONNECT_MAX: Duration = Duration::from_secs(10);

/// The Unix socket `tenurectl` and its watchdog talk over, in a fresh directory only this user
/// can enter; both are removed once the watchdog has connected (or on failure).
struct WatchdogSocket {
    dir: std::path::PathBuf,
    path: std::path::PathBuf,
    listener: UnixListener,
}

impl WatchdogSocket {
    fn bind() -> Result<Self, ClientError> {
        use std::os::unix::fs::DirBuilderExt as _;
        let dir = std::env::temp_dir().join(format!(
            "tenurectl-lock-{}-{}",
            std::process::id(),
            monotonic_ns()
        ));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|error| ClientError::Config(format!("creating {}: {error}", dir.display())))?;
        let path = dir.join("watchdog.sock");
        let listener = UnixListener::bind(&path).and_then(|listener| {
            listener.set_nonblocking(true)?;
            Ok(listener)
        });
        match listener {
            Ok(listener) => Ok(WatchdogSocket {
                dir,
                path,
                listener,
            }),
            Err(error) => {
                let _ = std::fs::remove_dir_all(&dir);
                Err(ClientError::Config(format!(
                    "listening on {}: {error}",
                    path.display()
                )))
            }
        }
    }

    /// The watchdog's connection (blocking from here on), within [`WATCHDOG_CONNECT_MAX`].
    async fn accept(self, watchdog: &mut Child) -> Result<UnixStream, ClientError> {
        let give_up = Instant::now() + WATCHDOG_CONNECT_MAX;
        let accepted = loop {
            match self.listener.accept() {
                Ok((stream, _)) => break stream.set_nonblocking(false).map(|()| stream),
                Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(error) => break Err(error),
            }
            if let Ok(Some(status)) = watchdog.try_wait() {
                break Err(std::io::Error::other(format!(
                    "the watchdog ended before connecting ({status})"
                )));
            }
            if Instant::now() >= give_up {
                break Err(std::io::Error::other(
                    "the watchdog did not connect in time",
                ));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let _ = std::fs::remove_dir_all(&self.dir);
        accepted.map_err(|error| ClientError::Config(format!("the lock's watchdog: {error}")))
    }
}

impl Drop for WatchdogSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn send_line(feed: &mut UnixStream, line: &str) {
    let _ = writeln!(feed, "{line}");
    let _ = feed.flush();
}
