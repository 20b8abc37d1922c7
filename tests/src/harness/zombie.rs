//! The fencing demo's holder (`nemesis zombie`): a process that takes a lease, writes to the
//! fenced store with its token, checks that its safe deadline is still ahead, says so on
//! standard output, "works" for a moment and writes again.
//!
//! The demo stops it with SIGSTOP right after it said it checked, lets the lease expire, has
//! another holder take the resource and write with the newer token, then resumes it: its late
//! write carries the stale token and the store rejects it. A lease service cannot stop a paused
//! process from acting; the downstream token check can.
//!
//! Output, one JSON object per line: `{"granted": {"token", "deadline_ns"}}`, `{"wrote":
//! {"accepted", "highest_before"}}` (the first write), `{"checked": ns}`, then `{"late_write":
//! {"accepted", "highest_before", "arrived_after_deadline"}}`.
//!
//! Must not depend on: the cluster's processes.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tenure_client::{AcquireOptions, Client, ClientConfig, Credentials};

use super::HarnessError;
use crate::fencing::StoreClient;
use crate::history::FencedWrite;
use crate::history::{InstantAnchor, Nanos, mono_now_ns};

/// What the zombie is told.
#[derive(Debug, Clone)]
pub struct ZombieArgs {
    /// `cluster.json`.
    pub cluster_file: PathBuf,
    /// Tenant of the resource.
    pub tenant: String,
    /// The resource.
    pub resource: String,
    /// Its holder id.
    pub holder: String,
    /// Lease ttl.
    pub ttl_ms: u64,
    /// The fenced store's socket.
    pub store: PathBuf,
    /// How long it "works" between checking its deadline and writing.
    pub work_ms: u64,
}

/// One line of the zombie's output.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ZombieLine {
    /// The lease was granted.
    Granted {
        /// Its fencing token.
        token: u64,
        /// The client library's safe deadline.
        deadline_ns: Nanos,
    },
    /// The first write's judgement.
    Wrote {
        /// Applied?
        accepted: bool,
        /// The store's highest token before it.
        highest_before: u64,
    },
    /// The deadline was checked and still ahead; the write follows after `work_ms`.
    Checked(Nanos),
    /// The write after the pause.
    LateWrite {
        /// Applied?
        accepted: bool,
        /// The store's highest token before it.
        highest_before: u64,
        /// The write reached the store after the safe deadline had passed.
        arrived_after_deadline: bool,
    },
}

fn say(line: &ZombieLine) {
    if let Ok(text) = serde_json::to_string(line) {
        // The demo reads this line by line: one write per line, flushed.
        use std::io::Write as _;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{text}");
        let _ = out.flush();
    }
}

/// Runs the zombie holder (blocking; builds its own runtime).
pub fn zombie_main(args: ZombieArgs) -> Result<(), HarnessError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| HarnessError::io("starting the runtime", e))?;
    runtime.block_on(run(args))
}

async fn run(args: ZombieArgs) -> Result<(), HarnessError> {
    let config = ClientConfig::from_cluster_file(
        &args.cluster_file,
        Credentials::InsecureDev {
            principal_id: "zombie".into(),
        },
    )
    .map_err(|e| HarnessError::Client(e.to_string()))?;
    let client = Client::connect(config)
        .await
        .map_err(|e| HarnessError::Client(e.to_string()))?;
    let anchor = InstantAnchor::new();
    let options = AcquireOptions::new(
        args.tenant.clone(),
        args.resource.clone(),
        args.holder.clone(),
        Duration::from_millis(args.ttl_ms),
    )
    .without_auto_renew();
    let lease = client
        .acquire_with(options)
        .await
        .map_err(|e| HarnessError::Client(format!("acquiring: {e}")))?;
    let deadline_ns = anchor.to_nanos(lease.safe_deadline());
    say(&ZombieLine::Granted {
        token: lease.fencing_token(),
        deadline_ns,
    });
    let mut store = StoreClient::connect(&args.store).await?;
    let write = |checked_ns| FencedWrite {
        client: "zombie".into(),
        holder: args.holder.clone(),
        resource: args.resource.clone(),
        token: lease.fencing_token(),
        checked_ns,
        deadline_ns,
    };
    let first = store.write(&write(mono_now_ns())).await?;
    say(&ZombieLine::Wrote {
        accepted: first.accepted,
        highest_before: first.highest_before,
    });
    // The holder checks that it may act...
    let checked_ns = mono_now_ns();
    if !lease.is_valid() {
        return Err(HarnessError::Client(
            "the lease was no longer valid before the demo began".into(),
        ));
    }
    say(&ZombieLine::Checked(checked_ns));
    // ... works a moment (the demo stops the process here) ...
    tokio::time::sleep(Duration::from_millis(args.work_ms)).await;
    // ... and writes, with the token it had.
    let late = store.write(&write(checked_ns)).await?;
    say(&ZombieLine::LateWrite {
        accepted: late.accepted,
        highest_before: late.highest_before,
        arrived_after_deadline: mono_now_ns() >= deadline_ns,
    });
    let _ = lease.detach();
    client.close().await;
    Ok(())
}
