//! One client request end to end: admission, tenant checks, routing to the key's group, local
//! proposal or read, forwarding to the leader, metrics. Shared by the QUIC client protocol and
//! the HTTP gateway, so both behave identically.
//!
//! Must not depend on: the wire (QUIC streams, HTTP); callers decode and encode.

use std::sync::Arc;
use std::time::Duration;

use tenure_core::ErrorCode;
use tenure_proto::client::{Principal, RequestBody, RequestFlags, ResponseBody, WireError};

use crate::auth::Authenticator;

/// Who asks, and how.
#[derive(Debug, Clone)]
pub struct RequestContext {
    /// The authenticated principal (or, in insecure development mode, the claimed one).
    pub principal: Principal,
    /// Forwarding and stale-read options.
    pub flags: RequestFlags,
    /// How long the caller waits.
    pub timeout: Duration,
}

/// Readiness as `GET /readyz` reports it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Readiness {
    /// True when this node sees a leader for every group, is not shutting down and its storage
    /// has not failed.
    pub ready: bool,
    /// Groups in the cluster.
    pub groups: u32,
    /// Groups whose leader this node knows.
    pub groups_with_leader: u32,
    /// Groups this node leads.
    pub groups_led: u32,
    /// True once a graceful shutdown began.
    pub shutting_down: bool,
    /// The failure that stopped this node's storage (a failed WAL sync: every group on the node
    /// stops until it restarts, runbook `ops/runbooks/StorageCorrupt.md`), else `None` (JSON
    /// `null`). A node with a storage failure is not ready.
    pub storage_failure: Option<String>,
}

/// The request handler of one node. Cheap to clone.
#[derive(Clone)]
pub struct Service {
    pub(crate) inner: Arc<crate::node::NodeShared>,
}

impl Service {
    /// Handles one request.
    pub async fn handle(
        &self,
        ctx: RequestContext,
        body: RequestBody,
    ) -> Result<ResponseBody, WireError> {
        self.inner.handle(ctx, body).await
    }

    /// The token table and the insecure-mode switch.
    pub fn authenticator(&self) -> &Authenticator {
        &self.inner.auth
    }

    /// Readiness.
    pub fn readiness(&self) -> Readiness {
        self.inner.readiness()
    }

    /// The Prometheus text exposition of this process's metrics.
    pub fn render_metrics(&self) -> String {
        self.inner.render_metrics()
    }

    /// The default request timeout.
    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.inner.config.limits.request_timeout_ms)
    }

    /// The largest HTTP body accepted.
    pub fn http_body_bytes_max(&self) -> usize {
        self.inner.config.limits.http_body_bytes_max
    }

    /// This node's id.
    pub fn node_id(&self) -> u64 {
        self.inner.config.node_id
    }

    /// The node's fault knobs, when `[testing] fault_control` is on.
    pub fn fault_controls(&self) -> Option<Arc<crate::fault_control::FaultControls>> {
        self.inner.fault_controls()
    }
}

/// `INVALID_ARGUMENT` with a message.
pub fn invalid(message: impl Into<String>) -> WireError {
    WireError::new(ErrorCode::InvalidArgument, message)
}
