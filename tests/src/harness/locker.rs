//! `tenurectl lock` under faults: a client process of a fault run runs `tenurectl lock` again
//! and again on one lock name ([`run_locker`]); the command it runs is `nemesis lock-child`
//! ([`lock_child_main`]), which writes a sign of life (its fencing token and the time) every few
//! milliseconds until it ends or is stopped. After the run, [`read_lock_beats`] gathers them for
//! the checker, which judges that two commands of one lock never ran at once.
//!
//! `tenurectl` runs in the client process's process group, so the `pause-client` nemesis
//! (SIGSTOP to that group) pauses the lock's holder itself: its watchdog and command, in
//! groups of their own, keep running, and the watchdog must stop the command before the lock's
//! safe deadline.
//!
//! Must not depend on: the cluster's processes or the checker.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng as _, SeedableRng as _};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::HarnessError;
use crate::history::{LockBeat, Nanos, mono_now_ns};

/// Time between two signs of life of a lock's command.
const BEAT_INTERVAL: Duration = Duration::from_millis(5);

/// What a client process needs to run `tenurectl lock`.
#[derive(Debug, Clone)]
pub struct LockArgs {
    /// The `tenurectl` binary.
    pub tenurectl: PathBuf,
    /// The lock's name (a resource of the run's tenant, outside the workload's keyspace).
    pub name: String,
    /// Where the commands write their signs of life (one file per command).
    pub dir: PathBuf,
}

/// One sign of life, as a command writes it.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct BeatLine {
    name: String,
    token: u64,
    at_ns: Nanos,
}

/// Runs `tenurectl lock` until `stop` says so (then lets the current one finish): each run waits
/// for the lock, holds it while its command works for a random time, and releases it.
#[allow(clippy::too_many_arguments)]
pub async fn run_locker(
    lock: LockArgs,
    cluster_file: PathBuf,
    tenant: String,
    holder: String,
    ttl_ms: u64,
    seed: u64,
    stop: watch::Receiver<Option<Nanos>>,
) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let Ok(exe) = std::env::current_exe() else {
        tracing::warn!("locker: no executable path");
        return;
    };
    let log = lock.dir.join(format!("{holder}.log"));
    let mut run = 0u64;
    while stop.borrow().is_none() {
        run += 1;
        let hold_ms: u64 = rng.random_range(100..=1_500);
        let out = lock.dir.join(format!("{holder}-{run}.jsonl"));
        let Ok(log_file) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
        else {
            tracing::warn!("locker: cannot open {}", log.display());
            return;
        };
        let Ok(err_file) = log_file.try_clone() else {
            return;
        };
        let mut command = Command::new(&lock.tenurectl);
        command
            .arg("--cluster")
            .arg(&cluster_file)
            .args(["lock", &lock.name, "--tenant", &tenant, "--holder", &holder])
            .args(["--ttl-ms", &ttl_ms.to_string()])
            .args(["--wait-ms", "8000", "--grace-ms", "300", "--"])
            .arg(&exe)
            .arg("lock-child")
            .arg("--out")
            .arg(&out)
            .args(["--hold-ms", &hold_ms.to_string()])
            .stdin(Stdio::null())
            .stdout(log_file)
            .stderr(err_file);
        let waited = tokio::task::spawn_blocking(move || {
            let mut child = command.spawn()?;
            child.wait()
        })
        .await;
        match waited {
            Ok(Ok(status)) => tracing::debug!(holder, run, %status, "locker: tenurectl ended"),
            Ok(Err(error)) => {
                tracing::warn!(holder, "locker: tenurectl: {error}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(error) => tracing::warn!(holder, "locker: {error}"),
        }
        let pause_ms: u64 = rng.random_range(0..=200);
        tokio::time::sleep(Duration::from_millis(pause_ms)).await;
    }
}

/// `nemesis lock-child`: the command a lock runs. Writes a sign of life to `out` every
/// [`BEAT_INTERVAL`] for `hold_ms`, then exits; its token and lock name come from the
/// environment `tenurectl lock` gives it.
pub fn lock_child_main(out: &Path, hold_ms: u64) -> Result<(), HarnessError> {
    let token: u64 = std::env::var("TENURE_FENCING_TOKEN")
        .ok()
        .and_then(|token| token.parse().ok())
        .ok_or_else(|| HarnessError::Client("no TENURE_FENCING_TOKEN".into()))?;
    let name = std::env::var("TENURE_LOCK_NAME")
        .map_err(|_| HarnessError::Client("no TENURE_LOCK_NAME".into()))?;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(out)
        .map_err(|e| HarnessError::io("opening the beat file", e))?;
    let end_ns = mono_now_ns().saturating_add(hold_ms.saturating_mul(1_000_000));
    loop {
        let at_ns = mono_now_ns();
        let beat = BeatLine {
            name: name.clone(),
            token,
            at_ns,
        };
        let mut line = serde_json::to_string(&beat)
            .map_err(|e| HarnessError::Client(format!("encoding a beat: {e}")))?;
        line.push('\n');
        // One write per beat: what reached the file was written while the command ran.
        file.write_all(line.as_bytes())
            .map_err(|e| HarnessError::io("writing a beat", e))?;
        if at_ns >= end_ns {
            return Ok(());
        }
        std::thread::sleep(BEAT_INTERVAL);
    }
}

/// Every sign of life the commands wrote under `dir`.
pub fn read_lock_beats(dir: &Path) -> Vec<LockBeat> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut beats = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|ext| ext != "jsonl") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        // A command killed mid-write leaves at most its last line cut: skip what does not parse.
        beats.extend(
            text.lines()
                .filter_map(|line| serde_json::from_str::<BeatLine>(line).ok())
                .map(|beat| LockBeat {
                    name: beat.name,
                    token: beat.token,
                    at_ns: beat.at_ns,
                }),
        );
    }
    beats
}
