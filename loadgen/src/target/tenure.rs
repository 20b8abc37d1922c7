//! The `tenure` target: the native client library over QUIC. It routes each key to its group's
//! leader, retries with the same request id, and (for `hold`) renews handles in coalesced
//! batches. Operations map one to one: acquire, renew, release, get (a linearizable read).

use std::time::Duration;

use tenure_client::{AcquireOptions, Client, ClientError, Lease, ResourceKey};

use super::{HeldLease, LeaseRef, OpError};

/// A connected native client.
pub struct TenureTarget {
    client: Client,
    tenant: String,
}

fn op_error(error: ClientError) -> OpError {
    OpError::new(error.code_str(), error.to_string())
}

impl TenureTarget {
    /// Wraps a connected client; every resource lives under `tenant`.
    pub fn new(client: Client, tenant: String) -> Self {
        TenureTarget { client, tenant }
    }

    /// The client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The tenant of every resource.
    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    fn key(&self, resource: &str) -> ResourceKey {
        ResourceKey::new(self.tenant.as_str(), resource)
    }

    pub(super) async fn acquire(
        &self,
        resource: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<HeldLease, OpError> {
        let options = AcquireOptions::new(self.tenant.as_str(), resource, holder, ttl);
        let grant = self.client.acquire_grant(options).await.map_err(op_error)?;
        Ok(HeldLease {
            resource: resource.to_owned(),
            holder: holder.to_owned(),
            lease: LeaseRef::Tenure(grant.lease_id),
            fencing_token: grant.fencing_token,
        })
    }

    pub(super) async fn renew(&self, lease: &HeldLease, ttl: Duration) -> Result<(), OpError> {
        let LeaseRef::Tenure(lease_id) = lease.lease else {
            return Err(OpError::new("INVALID_REQUEST", "not a tenure lease"));
        };
        self.client
            .renew(
                self.key(&lease.resource),
                lease_id,
                lease.holder.as_str(),
                ttl,
                None,
            )
            .await
            .map(drop)
            .map_err(op_error)
    }

    pub(super) async fn release(&self, lease: &HeldLease) -> Result<(), OpError> {
        let LeaseRef::Tenure(lease_id) = lease.lease else {
            return Err(OpError::new("INVALID_REQUEST", "not a tenure lease"));
        };
        self.client
            .release(
                self.key(&lease.resource),
                lease_id,
                lease.holder.as_str(),
                None,
            )
            .await
            .map(drop)
            .map_err(op_error)
    }

    pub(super) async fn get(&self, resource: &str) -> Result<bool, OpError> {
        let result = self
            .client
            .get(&self.key(resource))
            .await
            .map_err(op_error)?;
        Ok(result
            .view
            .is_some_and(|view| matches!(view.status, tenure_client::LeaseStatus::Active)))
    }

    pub(super) async fn hold_acquire(
        &self,
        resource: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<Lease, OpError> {
        self.client
            .acquire(self.tenant.as_str(), resource, holder, ttl)
            .await
            .map_err(op_error)
    }
}
