//! The tenure client: a shard-aware async library for taking, keeping and giving back leases.
//!
//! A [`Client`] learns the cluster's placement map and group leaders from any node, computes
//! each key's group locally (`tenure_core::placement`) and sends each call straight to that
//! group's leader over one QUIC connection per node, where concurrent calls share frames. It
//! retries what may be retried (same request id, so nothing applies twice), within a deadline
//! and an attempt cap, and returns typed errors that say whether a retry may help.
//!
//! [`Client::transfer`] (or [`Lease::transfer`]) hands a lease to a named new holder in one
//! step, with a new fencing token; the new holder takes it over with [`Client::adopt`].
//! [`Client::check_fence`] answers whether a fencing token is its resource's current active
//! grant ([`FenceVerdict`]), for downstream systems that cannot store tokens.
//!
//! [`Client::session`] starts a [`Session`]: leases acquired through it have no ttl of their
//! own and live exactly as long as the session's record in their group, which one background
//! keep-alive per group extends, however many leases the session holds there
//! ([`Session::lost`] names a lost group and exactly its leases).
//!
//! [`Client::watch`] streams the ACQUIRED, RELEASED, EXPIRED and HANDED_OFF events of a
//! resource, a tenant or a prefix (see [`Watch`]), resumable from a cursor.
//!
//! Two recipes build on the wait queue and the watch: [`Election`] (campaign in the resource's
//! FIFO queue, a [`Leadership`] with a value that `proclaim` changes, the current [`Leader`] and
//! a [`LeaderWatch`] of its changes) and [`Mutex`] (a [`MutexGuard`] per lock, granted in queue
//! order with increasing fencing tokens).
//!
//! [`Client::acquire`] returns a [`Lease`]: fencing token, ttl, and the **safe deadline** of the
//! contract (section 5), computed from the local monotonic time the request was sent. The client
//! renews every lease by itself, coalescing renewals that fall due together into one Batch
//! request per group, and signals loss ([`Lease::lost`]) before the safe deadline passes without
//! a confirmed renewal.
//!
//! ```no_run
//! # async fn example() -> Result<(), tenure_client::ClientError> {
//! use std::time::Duration;
//! use tenure_client::{Client, Credentials};
//!
//! let client = Client::from_cluster_file(
//!     "tenure-dev/cluster.json".as_ref(),
//!     Credentials::InsecureDev { principal_id: "docs".into() },
//! )
//! .await?;
//! let lease = client.acquire("acme", "jobs/nightly", "worker-1", Duration::from_secs(10)).await?;
//! while lease.is_valid() {
//!     // ... do the work, passing lease.fencing_token() to every system written to ...
//!     # break;
//! }
//! lease.release().await?;
//! # Ok(())
//! # }
//! ```
//!
//! Must not depend on: any server crate (only `tenure-core` for the pure types and placement,
//! and `tenure-proto` for the wire).

mod client;
mod config;
mod connect;
mod election;
mod error;
mod handle;
mod keepalive;
mod lease;
mod link;
mod mutex;
mod renewer;
mod routing;
mod session;
mod time;
mod wait;
mod watch;

pub use client::{AcquireOptions, Client, ClientStats, Grant, RoutingSnapshot, Transferred};
pub use config::{
    ClientConfig, ClusterFile, Credentials, Endpoint, RenewPolicy, RetryPolicy, SafetyPolicy,
};
pub use election::{CampaignOptions, Election, Leader, LeaderWatch, Leadership};
pub use error::ClientError;
pub use handle::{LeaseState, LossReason};
pub use lease::{Lease, TransferFailed};
pub use link::FaultInjector;
pub use mutex::{Mutex, MutexGuard};
pub use routing::{LeaderEntry, NodeInfo, RoutingState};
pub use session::{KeepAliveConfirmed, Session, SessionLease, SessionLoss};
pub use tenure_core::{
    ClusterChange, ClusterMeta, ClusterOp, ErrorCode, ExpiryReason, FenceVerdict, LeaseGrant,
    LeaseId, LeaseStatus, LeaseView, NodeAddresses, NodeRecord, NodeState, QueuedReceipt,
    ReplayState, ReplayStatus, ResourceKey, SessionGrant, SessionId, SessionIdParseError,
    SessionReceipt, WaitCancelReceipt, WaitEndReason, WaitLease, WatchEvent, WatchEventKind,
    WatchSelector,
};
pub use tenure_proto::client::{
    FenceCheckResult, FollowerProgress, GetResult, GroupMembers, GroupStatus, LeaseResult,
    NodeStatus, WatchPage, WatchPoll,
};
pub use wait::{WaitOptions, WaitStep, is_wait_ended};
pub use watch::{Watch, WatchFrom, WatchItem, WatchOptions};
