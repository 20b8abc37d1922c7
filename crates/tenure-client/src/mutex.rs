//! The distributed-mutex recipe: [`Mutex`] (lock one resource, waiting in its FIFO queue) and
//! [`MutexGuard`] (the held lock: fencing token, auto-renewed lease, `unlock`).
//!
//! A lock is a lease of the resource. Lockers wait in the resource's queue
//! (`Client::acquire_wait`), parked on the server: no polling, no herd, and an unlock (or the
//! holder's lease expiring) grants the first waiter in the same apply, with a larger fencing
//! token.
//!
//! Must not depend on: the server (only the native protocol), nor the renewer's internals (it
//! uses `Lease` handles and the client's public calls).

use std::time::{Duration, Instant};

use tenure_core::{ReleaseReceipt, ResourceKey};

use crate::client::{AcquireOptions, Client};
use crate::error::ClientError;
use crate::handle::LeaseState;
use crate::lease::Lease;
use crate::wait::WaitOptions;

/// A distributed mutex: a resource of a tenant, locked by holding its lease.
///
/// ```no_run
/// # async fn example(client: tenure_client::Client) -> Result<(), tenure_client::ClientError> {
/// use std::time::Duration;
/// use tenure_client::Mutex;
///
/// let mutex = Mutex::new(&client, "acme", "locks/nightly-report");
/// let guard = mutex
///     .lock("worker-1", Duration::from_secs(10), Duration::from_secs(60))
///     .await?;
/// // ... work while guard.is_valid(), passing guard.fencing_token() to every system written to ...
/// guard.unlock().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Mutex {
    client: Client,
    key: ResourceKey,
}

impl Mutex {
    /// The mutex `name` (a resource id) of `tenant_id`, through `client` (cloned: clones share
    /// connections).
    ///
    /// ```no_run
    /// # fn example(client: &tenure_client::Client) {
    /// let mutex = tenure_client::Mutex::new(client, "acme", "locks/nightly-report");
    /// assert_eq!(mutex.key().tenant_id, "acme");
    /// # }
    /// ```
    pub fn new(client: &Client, tenant_id: impl Into<String>, name: impl Into<String>) -> Self {
        Mutex {
            client: client.clone(),
            key: ResourceKey::new(tenant_id, name),
        }
    }

    /// The mutex's resource.
    pub fn key(&self) -> &ResourceKey {
        &self.key
    }

    /// Locks as `holder_id`, waiting up to `wait` in the resource's FIFO queue; the lock's
    /// lease has `ttl` and is renewed by the client until unlocked, lost or dropped.
    ///
    /// Errors: when the wait runs out, the wait-ended error ([`crate::is_wait_ended`]: code
    /// `ALREADY_HELD`, the wait left the queue); `ALREADY_HELD` without a wait end when
    /// `holder_id` holds the lock already (it is not re-entrant); `QUOTA_EXCEEDED` when the
    /// queue is full. Dropping the future leaves the queue in the background (a grant that beat
    /// it is released).
    ///
    /// ```no_run
    /// # async fn example(mutex: tenure_client::Mutex) -> Result<(), tenure_client::ClientError> {
    /// use std::time::Duration;
    /// match mutex.lock("worker-1", Duration::from_secs(10), Duration::from_secs(5)).await {
    ///     Ok(guard) => guard.unlock().await.map(|_| ())?,
    ///     Err(error) if tenure_client::is_wait_ended(&error) => println!("busy, try later"),
    ///     Err(error) => return Err(error),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn lock(
        &self,
        holder_id: impl Into<String>,
        ttl: Duration,
        wait: Duration,
    ) -> Result<MutexGuard, ClientError> {
        let options = WaitOptions::new(
            self.key.tenant_id.clone(),
            self.key.resource_id.clone(),
            holder_id,
            ttl,
            wait,
        );
        Ok(MutexGuard {
            lease: self.client.acquire_wait_lease(options).await?,
        })
    }

    /// Locks as `holder_id` if the mutex is free now, without waiting: `ALREADY_HELD` naming the
    /// holder ([`ClientError::current_holder`]) otherwise.
    ///
    /// ```no_run
    /// # async fn example(mutex: tenure_client::Mutex) -> Result<(), tenure_client::ClientError> {
    /// use std::time::Duration;
    /// match mutex.try_lock("worker-1", Duration::from_secs(10)).await {
    ///     Ok(guard) => drop(guard), // released in the background
    ///     Err(error) => println!("held by {:?}", error.current_holder()),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn try_lock(
        &self,
        holder_id: impl Into<String>,
        ttl: Duration,
    ) -> Result<MutexGuard, ClientError> {
        let options = AcquireOptions {
            key: self.key.clone(),
            holder_id: holder_id.into(),
            ttl,
            request_id: None,
            auto_renew: true,
        };
        Ok(MutexGuard {
            lease: self.client.acquire_with(options).await?,
        })
    }
}

/// A held lock. Work only while [`MutexGuard::is_valid`], and pass
/// [`MutexGuard::fencing_token`] to every system written to.
///
/// Dropping it without [`MutexGuard::unlock`] is dropping its [`Lease`]: renewal stops and the
/// lease is released in the background (best effort, one attempt), so the next waiter is
/// granted at once; if that release does not get through, at the end of the ttl. Call
/// `unlock` to know the lock was given back.
///
/// ```no_run
/// # async fn example(guard: tenure_client::MutexGuard) -> Result<(), tenure_client::ClientError> {
/// tokio::select! {
///     state = guard.lost() => println!("lock lost: {state:?}: stop writing now"),
///     () = tokio::time::sleep(std::time::Duration::from_secs(1)) => {
///         guard.unlock().await?;
///     }
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct MutexGuard {
    lease: Lease,
}

impl MutexGuard {
    /// The lock's fencing token: larger than that of every earlier holder of the mutex.
    pub fn fencing_token(&self) -> u64 {
        self.lease.fencing_token()
    }

    /// The lock's lease.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Until when the holder may act (the lease's safe deadline, contract section 5).
    pub fn safe_deadline(&self) -> Instant {
        self.lease.safe_deadline()
    }

    /// True while the lock is held and its safe deadline has not passed.
    pub fn is_valid(&self) -> bool {
        self.lease.is_valid()
    }

    /// Resolves when the lock is lost (a renewal refused, or none confirmed before the safe
    /// deadline) or released, with the lease's final state.
    pub async fn lost(&self) -> LeaseState {
        self.lease.lost().await
    }

    /// Unlocks: releases the lease; the first waiter is granted the lock in the same apply.
    ///
    /// ```no_run
    /// # async fn example(guard: tenure_client::MutexGuard) -> Result<(), tenure_client::ClientError> {
    /// let receipt = guard.unlock().await?;
    /// println!("unlocked lease {}", receipt.lease_id);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn unlock(self) -> Result<ReleaseReceipt, ClientError> {
        self.lease.release().await
    }
}
