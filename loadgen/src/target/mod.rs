//! The services under test, behind the same four lease operations: acquire, renew, release and
//! get. Each target maps them to its own API (see the submodules); every operation is bounded
//! by [`OP_TIMEOUT`] and failures come back as an [`OpError`] carrying a stable code (the
//! contract's code for tenure, the gRPC status for etcd, `DEADLINE_EXCEEDED` for a timeout).
//!
//! Must not depend on the server crates; it sees each service as its users do.

pub mod http;
pub mod tenure;

#[cfg(feature = "etcd")]
pub mod etcd;

use std::time::Duration;

/// Upper bound of one operation, every round trip and retry included.
pub const OP_TIMEOUT: Duration = Duration::from_secs(10);

/// A failed or refused operation.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{code}: {message}")]
pub struct OpError {
    /// Stable code: `ALREADY_HELD`, `LEASE_EXPIRED`, `UNAVAILABLE`, `DEADLINE_EXCEEDED`, ...
    pub code: String,
    /// Human-readable detail.
    pub message: String,
}

impl OpError {
    /// An error with a code and a message.
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        OpError {
            code: code.into(),
            message: message.into(),
        }
    }

    /// True when the lease is gone (expired, taken over, released): the holder should forget it.
    pub fn lease_gone(&self) -> bool {
        matches!(
            self.code.as_str(),
            "LEASE_EXPIRED" | "LEASE_MISMATCH" | "NOT_FOUND"
        )
    }
}

/// A target's own identity of a granted lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseRef {
    /// tenure's lease id (native client).
    Tenure(tenure_client::LeaseId),
    /// The lease id as the HTTP API spells it.
    Text(String),
    /// An etcd lease id.
    Etcd(i64),
}

/// A lease a worker holds.
#[derive(Debug, Clone)]
pub struct HeldLease {
    /// The resource.
    pub resource: String,
    /// The holder that acquired it.
    pub holder: String,
    /// The lease.
    pub lease: LeaseRef,
    /// Its fencing token (etcd: the key's create revision).
    pub fencing_token: u64,
}

/// Which service to drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TargetKind {
    /// tenure through `tenure-client` (QUIC, shard-aware).
    Tenure,
    /// tenure through the Tenure v1 HTTP routes (any node; it forwards to the leader).
    TenureHttp,
    /// etcd v3 over gRPC (cargo feature `etcd`).
    Etcd,
}

impl TargetKind {
    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            TargetKind::Tenure => "tenure",
            TargetKind::TenureHttp => "tenure-http",
            TargetKind::Etcd => "etcd",
        }
    }
}

/// A connected target.
pub enum Target {
    /// Native tenure client.
    Tenure(tenure::TenureTarget),
    /// Tenure v1 HTTP.
    Http(Box<http::HttpTarget>),
    /// etcd.
    #[cfg(feature = "etcd")]
    Etcd(Box<etcd::EtcdTarget>),
}

/// A lease kept alive for the `hold` scenario.
pub enum HoldHandle {
    /// A tenure lease handle: the client library renews it in coalesced batches.
    Tenure(tenure_client::Lease),
    /// A lease the load generator renews itself (every ttl/3).
    Manual(HeldLease),
}

/// Bounds a whole operation (all its round trips) by [`OP_TIMEOUT`].
async fn bounded<T>(operation: impl Future<Output = Result<T, OpError>>) -> Result<T, OpError> {
    tokio::time::timeout(OP_TIMEOUT, operation)
        .await
        .unwrap_or_else(|_| Err(OpError::new("DEADLINE_EXCEEDED", "operation timed out")))
}

impl Target {
    /// The kind of this target.
    pub fn kind(&self) -> TargetKind {
        match self {
            Target::Tenure(_) => TargetKind::Tenure,
            Target::Http(_) => TargetKind::TenureHttp,
            #[cfg(feature = "etcd")]
            Target::Etcd(_) => TargetKind::Etcd,
        }
    }

    /// Takes a lease on `resource` for `holder`.
    pub async fn acquire(
        &self,
        resource: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<HeldLease, OpError> {
        bounded(async {
            match self {
                Target::Tenure(target) => target.acquire(resource, holder, ttl).await,
                Target::Http(target) => target.acquire(resource, holder, ttl).await,
                #[cfg(feature = "etcd")]
                Target::Etcd(target) => target.acquire(resource, holder, ttl).await,
            }
        })
        .await
    }

    /// Extends a held lease by `ttl`.
    pub async fn renew(&self, lease: &HeldLease, ttl: Duration) -> Result<(), OpError> {
        bounded(async {
            match self {
                Target::Tenure(target) => target.renew(lease, ttl).await,
                Target::Http(target) => target.renew(lease, ttl).await,
                #[cfg(feature = "etcd")]
                Target::Etcd(target) => target.renew(lease).await,
            }
        })
        .await
    }

    /// Gives a lease back.
    pub async fn release(&self, lease: &HeldLease) -> Result<(), OpError> {
        bounded(async {
            match self {
                Target::Tenure(target) => target.release(lease).await,
                Target::Http(target) => target.release(lease).await,
                #[cfg(feature = "etcd")]
                Target::Etcd(target) => target.release(lease).await,
            }
        })
        .await
    }

    /// Reads a resource; `true` when a lease is active on it.
    pub async fn get(&self, resource: &str) -> Result<bool, OpError> {
        bounded(async {
            match self {
                Target::Tenure(target) => target.get(resource).await,
                Target::Http(target) => target.get(resource).await,
                #[cfg(feature = "etcd")]
                Target::Etcd(target) => target.get(resource).await,
            }
        })
        .await
    }

    /// Takes a lease to hold: tenure hands it to the client library's renewer; the others
    /// return it for the load generator's own renewal loop.
    pub async fn hold_acquire(
        &self,
        resource: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<HoldHandle, OpError> {
        match self {
            Target::Tenure(target) => bounded(target.hold_acquire(resource, holder, ttl))
                .await
                .map(HoldHandle::Tenure),
            _ => self
                .acquire(resource, holder, ttl)
                .await
                .map(HoldHandle::Manual),
        }
    }

    /// The native client library (the tenure target only).
    pub fn tenure_client(&self) -> Option<&tenure_client::Client> {
        match self {
            Target::Tenure(target) => Some(target.client()),
            _ => None,
        }
    }

    /// The tenant of every resource (the tenure target only).
    pub fn tenure_tenant(&self) -> Option<&str> {
        match self {
            Target::Tenure(target) => Some(target.tenant()),
            _ => None,
        }
    }

    /// The client library's counters (tenure over the client library only).
    pub fn library_stats(&self) -> Option<tenure_client::ClientStats> {
        match self {
            Target::Tenure(target) => Some(target.client().stats()),
            _ => None,
        }
    }

    /// `(renewal requests, renewals)` the client library sent by itself, when it renews.
    pub fn library_renewals(&self) -> Option<(u64, u64)> {
        self.library_stats()
            .map(|stats| (stats.renew_batches, stats.renewals))
    }

    /// Closes connections.
    pub async fn close(&self) {
        if let Target::Tenure(target) = self {
            target.client().close().await;
        }
    }
}
