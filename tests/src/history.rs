//! What a fault run records: every client operation with its invoke and completion times, its
//! outcome, lease ids, fencing tokens and the client's safe deadline; every write the fenced
//! store saw; every fault the nemesis applied.
//!
//! Times are nanoseconds of `CLOCK_MONOTONIC`, one clock for every process on the machine, so
//! the histories of several client processes, the store and the nemesis line up in real time.
//! (A process stopped with SIGSTOP does not stop this clock.)
//!
//! Must not depend on: the cluster, the network, the client library (records are plain values,
//! written as JSON lines by client processes and read back by the checker).

use serde::{Deserialize, Serialize};

/// Nanoseconds of `CLOCK_MONOTONIC`.
pub type Nanos = u64;

/// Now, in [`Nanos`].
pub fn mono_now_ns() -> Nanos {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    let seconds = u64::try_from(now.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(now.tv_nsec).unwrap_or(0);
    seconds.saturating_mul(1_000_000_000).saturating_add(nanos)
}

/// Converts `std::time::Instant`s (the client library's deadlines) to [`Nanos`]: on Linux both
/// read `CLOCK_MONOTONIC`, so one pair of readings taken together anchors the conversion.
#[derive(Debug, Clone, Copy)]
pub struct InstantAnchor {
    instant: std::time::Instant,
    nanos: Nanos,
}

impl InstantAnchor {
    /// Anchors the conversion now.
    pub fn new() -> Self {
        InstantAnchor {
            instant: std::time::Instant::now(),
            nanos: mono_now_ns(),
        }
    }

    /// `instant` in [`Nanos`].
    pub fn to_nanos(&self, instant: std::time::Instant) -> Nanos {
        if instant >= self.instant {
            let after = u64::try_from((instant - self.instant).as_nanos()).unwrap_or(u64::MAX);
            self.nanos.saturating_add(after)
        } else {
            let before = u64::try_from((self.instant - instant).as_nanos()).unwrap_or(u64::MAX);
            self.nanos.saturating_sub(before)
        }
    }
}

impl Default for InstantAnchor {
    fn default() -> Self {
        Self::new()
    }
}

/// A lease id: the group that granted it and its sequence, which is its fencing token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct LeaseRef {
    /// The granting group.
    pub group: u32,
    /// The group's grant sequence number (the fencing token).
    pub sequence: u64,
}

impl std::fmt::Display for LeaseRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:08x}-{:016x}", self.group, self.sequence)
    }
}

/// The operations of the lease register.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum OpKind {
    /// Acquire.
    Acquire,
    /// Renew.
    Renew,
    /// Release.
    Release,
    /// Get (linearizable read).
    Get,
    /// Transfer: end the named lease and grant the resource to [`OpRecord::new_holder`] at once.
    Transfer,
    /// A confirmed keep-alive of the session a held lease is bound to, recorded per lease:
    /// it extends the lease (like a Renew) without changing its version. Recorded only for a
    /// keep-alive sent after the lease's grant was answered (so it was applied after it).
    KeepAlive,
    /// A close of the session a held lease is bound to, recorded per lease: it ends the lease
    /// (EXPIRED, its version unchanged) at the close's log time, answered as
    /// [`Outcome::Released`] with that time.
    SessionClose,
}

/// A lease as a read saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ViewRecord {
    /// The lease.
    pub lease: LeaseRef,
    /// Its holder.
    pub holder: String,
    /// `ACTIVE`, `EXPIRED` or `RELEASED`.
    pub status: String,
    /// Its fencing token.
    pub token: u64,
    /// Changes to it: 1 at grant, +1 per renewal and for the release.
    pub version: u64,
    /// Log time it expires (or expired, or was released) at.
    pub expires_at_ms: u64,
}

/// What an operation returned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// Acquire or Renew succeeded, or Transfer did (then the lease is the new holder's).
    Granted {
        /// The lease.
        lease: LeaseRef,
        /// Its fencing token.
        token: u64,
        /// Log time of the entry that decided.
        log_time_ms: u64,
        /// Log time it expires unless renewed.
        expires_at_ms: u64,
        /// The answer was the stored outcome of an earlier attempt with the same request id.
        replayed: bool,
        /// The client library's safe deadline (`sent_at + safe window`; equal to the send time
        /// when the library gave no window).
        safe_deadline_ns: Nanos,
    },
    /// Release succeeded.
    Released {
        /// The lease.
        lease: LeaseRef,
        /// Its fencing token.
        token: u64,
        /// Log time of the release. (`Client::release` does not say whether the answer was a
        /// replay; a replay carries the original log time.)
        released_at_ms: u64,
    },
    /// Get answered.
    Read {
        /// The resource's lease record, `None` for ABSENT.
        view: Option<ViewRecord>,
        /// The group's log time the answer was computed at.
        log_time_ms: u64,
    },
    /// The state machine refused (a definite answer with no effect).
    Refused {
        /// The contract's code (`ALREADY_HELD`, `LEASE_EXPIRED`, ...).
        code: String,
        /// For `ALREADY_HELD`: the current holder.
        holder: Option<String>,
    },
    /// No definite answer: the operation may or may not have taken effect, at any time after it
    /// was invoked.
    Unknown {
        /// The last failure seen.
        error: String,
    },
}

impl Outcome {
    /// True unless [`Outcome::Unknown`].
    pub fn is_definite(&self) -> bool {
        !matches!(self, Outcome::Unknown { .. })
    }

    /// The log time this outcome was decided at, when it carries one and is not a replayed
    /// (older) outcome.
    pub fn fresh_log_time_ms(&self) -> Option<u64> {
        match self {
            Outcome::Granted {
                log_time_ms,
                replayed: false,
                ..
            }
            | Outcome::Read { log_time_ms, .. } => Some(*log_time_ms),
            Outcome::Released { released_at_ms, .. } => Some(*released_at_ms),
            _ => None,
        }
    }
}

/// One client operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpRecord {
    /// Unique in the run.
    pub id: u64,
    /// The client task (`p2t3`: process 2, task 3; `final` for the reads after the run).
    pub client: String,
    /// The holder id the task acts as.
    pub holder: String,
    /// The resource (one tenant per run).
    pub resource: String,
    /// The resource's group.
    pub group: u32,
    /// What was asked.
    pub kind: OpKind,
    /// The request id (every attempt of the operation sent the same one).
    pub request_id: Option<String>,
    /// The lease a Renew, Release or Transfer names.
    pub lease: Option<LeaseRef>,
    /// Requested ttl (Acquire, Renew, Transfer).
    pub ttl_ms: u64,
    /// For Transfer: who holds the resource afterwards (the granted lease is theirs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_holder: Option<String>,
    /// When this re-sends an earlier operation's request id on purpose (an exactly-once probe):
    /// that operation's id. A replay must return the original outcome and change nothing.
    pub replay_of: Option<u64>,
    /// For an Acquire that waited in the resource's FIFO queue (AcquireWait): the wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait: Option<WaitRecord>,
    /// When the first attempt was sent.
    pub invoke_ns: Nanos,
    /// When the definite answer arrived; `None` for [`Outcome::Unknown`].
    pub complete_ns: Option<Nanos>,
    /// Calls made (a call that failed retryably was repeated with the same request id).
    pub attempts: u32,
    /// The answer.
    pub outcome: Outcome,
}

/// An Acquire that waited in the resource's FIFO queue: its wait, and its place when the
/// queue answered with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitRecord {
    /// How long it asked to wait.
    pub wait_ms: u64,
    /// Log time of the entry that queued it, when a position was answered (a wait granted at
    /// once, or before a position came back, has none).
    pub queued_at_ms: Option<u64>,
    /// Log time its wait ends at (the queue's answer).
    pub wait_until_ms: Option<u64>,
    /// Waiters ahead of it when queued.
    pub position: Option<u32>,
}

/// One item a watch stream delivered, in the order it did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchRecord {
    /// The watching task (one stream each; a new stream gets a new name).
    pub watcher: String,
    /// When it arrived.
    pub at_ns: Nanos,
    /// The group.
    pub group: u32,
    /// What arrived.
    pub item: WatchItemRecord,
}

/// A watch stream's item.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum WatchItemRecord {
    /// The stream starts after `index` (nothing before it is delivered).
    Started {
        /// Its start.
        index: u64,
    },
    /// An event of the group's log.
    Event {
        /// The entry's index.
        index: u64,
        /// The entry's log time.
        log_time_ms: u64,
        /// The resource.
        resource: String,
        /// `ACQUIRED`, `RELEASED`, `EXPIRED` or `HANDED_OFF`.
        kind: String,
        /// The holder (for ACQUIRED, HANDED_OFF and RELEASED).
        holder: Option<String>,
        /// The lease's fencing token.
        token: u64,
    },
    /// Everything up to `index` was delivered.
    Through {
        /// The index.
        index: u64,
    },
    /// A new stream of the same watcher resumed after `after` (its cursor): what it delivers
    /// continues what the earlier stream delivered through `after` (items of the earlier
    /// stream after it, not yet covered by a Through, may come again).
    Resumed {
        /// The cursor's index for the group.
        after: u64,
    },
    /// The stream fell behind the retention: events up to `index` are lost to it, and it
    /// goes on after it.
    Resync {
        /// The state's index.
        index: u64,
    },
}

/// A write to the fenced store, as its writer sends it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FencedWrite {
    /// The writing task.
    pub client: String,
    /// Its holder id.
    pub holder: String,
    /// The resource whose lease fences the write.
    pub resource: String,
    /// The lease's fencing token.
    pub token: u64,
    /// When the writer last saw its safe deadline ahead.
    pub checked_ns: Nanos,
    /// The writer's safe deadline.
    pub deadline_ns: Nanos,
}

/// One write the fenced store judged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteRecord {
    /// The write.
    #[serde(flatten)]
    pub write: FencedWrite,
    /// When the store received it.
    pub arrived_ns: Nanos,
    /// Accepted (token at least the highest seen for the resource) or rejected as stale.
    pub accepted: bool,
    /// The highest token the store had seen for the resource before this write.
    pub highest_before: u64,
}

/// One fault applied or healed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultEvent {
    /// When.
    pub at_ns: Nanos,
    /// The nemesis (`kill`, `pause-node`, `partition-halves`, ...).
    pub nemesis: String,
    /// True when the fault starts, false when it is healed.
    pub start: bool,
    /// What exactly (targets, amounts).
    pub detail: String,
}

impl OpRecord {
    /// The holder of the lease a successful answer grants: the new holder for a Transfer, else
    /// the holder that asked.
    pub fn granted_holder(&self) -> &str {
        match (self.kind, self.new_holder.as_deref()) {
            (OpKind::Transfer, Some(new_holder)) => new_holder,
            _ => &self.holder,
        }
    }

    /// True for operations that end the lease they name when they take effect (Release,
    /// Transfer, and the close of its session).
    pub fn ends_named_lease(&self) -> bool {
        matches!(
            self.kind,
            OpKind::Release | OpKind::Transfer | OpKind::SessionClose
        )
    }
}

/// Everything one run recorded.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct History {
    /// Client operations.
    pub ops: Vec<OpRecord>,
    /// Fenced-store writes.
    pub writes: Vec<WriteRecord>,
    /// Faults.
    pub faults: Vec<FaultEvent>,
    /// What watch streams delivered.
    #[serde(default)]
    pub watch: Vec<WatchRecord>,
    /// What the commands `tenurectl lock` ran reported while they ran.
    #[serde(default)]
    pub lock_beats: Vec<LockBeat>,
}

/// One sign of life of a command `tenurectl lock` ran (it writes one every few milliseconds
/// while it runs, from its start until it ends or is killed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockBeat {
    /// The lock's name.
    pub name: String,
    /// The fencing token `tenurectl` gave the command (`TENURE_FENCING_TOKEN`).
    pub token: u64,
    /// When.
    pub at_ns: Nanos,
}
