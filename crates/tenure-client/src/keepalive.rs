//! The queue between sessions' keep-alive loops and a group's keep-alive batcher: what one
//! queued keep-alive carries. The batcher itself lives in `session`; the client holds one
//! queue per (group, tenant).
//!
//! Must not depend on: `client` or `session` (both use these types; plain values and a
//! channel only).

use std::time::Instant;

use tenure_core::LeaseOp;
use tenure_proto::client::LeaseResult;
use tokio::sync::{mpsc, oneshot};

use crate::error::ClientError;

/// One keep-alive waiting for its group's next Batch.
#[derive(Debug)]
pub(crate) struct KeepAliveItem {
    /// The `SessionKeepAlive` operation.
    pub(crate) op: LeaseOp,
    /// Its loop's deadline: the batch carrying it is sent with the earliest of its members'.
    pub(crate) give_up_at: Instant,
    /// Where its own result goes.
    pub(crate) reply: oneshot::Sender<Result<LeaseResult, ClientError>>,
}

/// The queue of one (group, tenant)'s keep-alive batcher.
pub(crate) type KeepAliveQueue = mpsc::Sender<KeepAliveItem>;
