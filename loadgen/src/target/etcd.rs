//! The `etcd` target (cargo feature `etcd`): the etcd v3 API over gRPC with the `etcd-client`
//! crate, doing what a lease user of etcd does.
//!
//! - acquire: `LeaseGrant(ttl)`, then a Txn "if the key's create_revision is 0 then put(key,
//!   holder, lease)". When the key is held, the granted lease is revoked (so a
//!   refused acquire costs three round trips; a successful one two). The fencing token is the
//!   Txn's revision (the key's create revision).
//! - renew: one `LeaseKeepAlive` exchange on a fresh stream (etcd-client binds a keep-alive
//!   stream to one lease id, where etcd's Go client multiplexes one stream for all leases, so
//!   the client side of a renewal costs more here); a TTL of 0 in the answer means the lease is
//!   gone (`LEASE_EXPIRED`).
//! - release: a Txn "if the key is attached to our lease then delete(key)", then
//!   `LeaseRevoke`. A failed compare means the lease is gone (`LEASE_MISMATCH`).
//! - get: a Range read of the key (linearizable, etcd's default).
//!
//! etcd's TTLs are whole seconds: a ttl is rounded up to the next second.

use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, ConnectOptions, PutOptions, Txn, TxnOp};

use super::{HeldLease, LeaseRef, OP_TIMEOUT, OpError};

/// A connected etcd client (one balanced gRPC channel over the endpoints).
pub struct EtcdTarget {
    client: Client,
    prefix: String,
}

fn op_error(error: etcd_client::Error) -> OpError {
    match error {
        etcd_client::Error::GRpcStatus(status) => {
            // tonic's code names ("Unavailable", "DeadlineExceeded", ...), without naming tonic.
            let code = match format!("{:?}", status.code()).as_str() {
                "DeadlineExceeded" => "DEADLINE_EXCEEDED",
                "Unavailable" => "UNAVAILABLE",
                "NotFound" => "NOT_FOUND",
                "ResourceExhausted" => "OVERLOADED",
                "InvalidArgument" => "INVALID_ARGUMENT",
                "FailedPrecondition" => "FAILED_PRECONDITION",
                _ => "GRPC_ERROR",
            };
            OpError::new(code, status.message().to_owned())
        }
        etcd_client::Error::LeaseKeepAliveError(message) => OpError::new("LEASE_EXPIRED", message),
        other => OpError::new("UNREACHABLE", other.to_string()),
    }
}

/// Bounds the connection attempt (operations are bounded as a whole by `Target`).
async fn connect_bounded<T>(
    future: impl Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, OpError> {
    match tokio::time::timeout(OP_TIMEOUT, future).await {
        Ok(result) => result.map_err(op_error),
        Err(_) => Err(OpError::new("DEADLINE_EXCEEDED", "no answer from etcd")),
    }
}

fn ttl_seconds(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis().div_ceil(1000)).unwrap_or(i64::MAX)
}

impl EtcdTarget {
    /// Connects to `endpoints` (`host:port`); keys are `<prefix>/<resource>`.
    pub async fn connect(endpoints: &[String], prefix: String) -> Result<Self, OpError> {
        let options = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(5))
            // Above our own bound, so a timeout always shows as DEADLINE_EXCEEDED.
            .with_timeout(OP_TIMEOUT + Duration::from_secs(1));
        let client = connect_bounded(Client::connect(endpoints, Some(options))).await?;
        Ok(EtcdTarget { client, prefix })
    }

    fn key(&self, resource: &str) -> String {
        format!("{}/{resource}", self.prefix)
    }

    pub(super) async fn acquire(
        &self,
        resource: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<HeldLease, OpError> {
        let mut client = self.client.clone();
        let grant = client
            .lease_grant(ttl_seconds(ttl), None)
            .await
            .map_err(op_error)?;
        let lease_id = grant.id();
        let key = self.key(resource);
        let txn = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.as_str(),
                holder,
                Some(PutOptions::new().with_lease(lease_id)),
            )]);
        let answer = client.txn(txn).await.map_err(op_error)?;
        if answer.succeeded() {
            let revision = answer.header().map_or(0, |header| header.revision());
            Ok(HeldLease {
                resource: resource.to_owned(),
                holder: holder.to_owned(),
                lease: LeaseRef::Etcd(lease_id),
                fencing_token: u64::try_from(revision).unwrap_or(0),
            })
        } else {
            // Someone holds the key: give the unused lease back.
            let _ = client.lease_revoke(lease_id).await;
            Err(OpError::new("ALREADY_HELD", format!("{key} is held")))
        }
    }

    pub(super) async fn renew(&self, lease: &HeldLease) -> Result<(), OpError> {
        let LeaseRef::Etcd(lease_id) = lease.lease else {
            return Err(OpError::new("INVALID_REQUEST", "not an etcd lease"));
        };
        let mut client = self.client.clone();
        // `lease_keep_alive` opens the stream, sends one keep-alive and reads its answer; a TTL
        // of 0 in the answer comes back as `LeaseKeepAliveError` (mapped to LEASE_EXPIRED).
        // Dropping the keeper and the stream closes the stream.
        client
            .lease_keep_alive(lease_id)
            .await
            .map_err(op_error)
            .map(drop)
    }

    pub(super) async fn release(&self, lease: &HeldLease) -> Result<(), OpError> {
        let LeaseRef::Etcd(lease_id) = lease.lease else {
            return Err(OpError::new("INVALID_REQUEST", "not an etcd lease"));
        };
        let mut client = self.client.clone();
        let key = self.key(&lease.resource);
        let txn = Txn::new()
            .when([Compare::lease(key.as_str(), CompareOp::Equal, lease_id)])
            .and_then([TxnOp::delete(key.as_str(), None)]);
        let answer = client.txn(txn).await.map_err(op_error)?;
        let revoked = client.lease_revoke(lease_id).await.map_err(op_error);
        if !answer.succeeded() {
            return Err(OpError::new("LEASE_MISMATCH", format!("{key} is not ours")));
        }
        match revoked {
            // The key is deleted; a lease that expired meanwhile is not an error of release.
            Ok(_) => Ok(()),
            Err(error) if error.code == "NOT_FOUND" => Ok(()),
            Err(error) => Err(error),
        }
    }

    pub(super) async fn get(&self, resource: &str) -> Result<bool, OpError> {
        let mut client = self.client.clone();
        let answer = client
            .get(self.key(resource), None)
            .await
            .map_err(op_error)?;
        Ok(!answer.kvs().is_empty())
    }
}
