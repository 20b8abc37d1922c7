//! Admission control: bounded requests in flight per node and per tenant.
//!
//! A request holds an [`Admitted`] guard while it runs. Beyond the node's bound a request gets
//! `OVERLOADED`, beyond its tenant's bound `RATE_LIMITED`, both retryable with a retry-after hint.
//! New acquires may use only `acquire_percent` of the node's bound, so when the node is busy
//! renewals, releases and reads are still admitted: holders are not starved out of leases they
//! already hold by someone else's acquire storm (contract section 6).
//!
//! Must not depend on: the groups or the wire (counters only).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use dashmap::DashMap;
use tenure_core::ErrorCode;
use tenure_proto::client::WireError;

/// Tenants with an in-flight counter kept at most; idle counters are dropped beyond it.
const TENANT_COUNTERS_MAX: usize = 65_536;

/// Retry hint given with a refusal, in milliseconds.
pub const RETRY_AFTER_MS: u32 = 100;

/// What kind of request asks to be admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestClass {
    /// A request that may create leases (an Acquire, or a Batch containing one).
    Acquire,
    /// Renewals, releases, reads: work for leases that already exist.
    Other,
}

/// The bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmissionLimits {
    /// Requests in flight on the node at most.
    pub node_max: u32,
    /// Requests in flight per tenant at most.
    pub tenant_max: u32,
    /// Share of `node_max` that acquires may use, in percent (1..=100).
    pub acquire_percent: u32,
}

/// The counters.
#[derive(Debug)]
pub struct Admission {
    limits: AdmissionLimits,
    inflight: Arc<AtomicU32>,
    tenants: DashMap<String, Arc<AtomicU32>>,
}

/// Holds one admission; releases it when dropped.
#[derive(Debug)]
pub struct Admitted {
    node: Arc<AtomicU32>,
    tenant: Arc<AtomicU32>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.tenant.fetch_sub(1, Ordering::AcqRel);
        self.node.fetch_sub(1, Ordering::AcqRel);
    }
}

fn refusal(code: ErrorCode, message: String) -> WireError {
    let mut error = WireError::new(code, message);
    error.retry_after_ms = Some(RETRY_AFTER_MS);
    error
}

impl Admission {
    /// Counters with these bounds.
    pub fn new(limits: AdmissionLimits) -> Self {
        Admission {
            limits,
            inflight: Arc::new(AtomicU32::new(0)),
            tenants: DashMap::new(),
        }
    }

    /// Requests in flight on the node now.
    pub fn inflight(&self) -> u32 {
        self.inflight.load(Ordering::Relaxed)
    }

    /// Admits one request of `tenant`, or refuses it.
    pub fn admit(&self, tenant: &str, class: RequestClass) -> Result<Admitted, WireError> {
        let node_max = match class {
            RequestClass::Acquire => {
                u64::from(self.limits.node_max) * u64::from(self.limits.acquire_percent.min(100))
                    / 100
            }
            RequestClass::Other => u64::from(self.limits.node_max),
        };
        let current = self.inflight.fetch_add(1, Ordering::AcqRel);
        if u64::from(current) >= node_max {
            self.inflight.fetch_sub(1, Ordering::AcqRel);
            return Err(refusal(
                ErrorCode::Overloaded,
                format!(
                    "node has {current} requests in flight (bound {node_max} for {})",
                    match class {
                        RequestClass::Acquire => "acquires",
                        RequestClass::Other => "this request",
                    }
                ),
            ));
        }
        if self.tenants.len() > TENANT_COUNTERS_MAX {
            self.tenants
                .retain(|_, counter| counter.load(Ordering::Acquire) > 0);
        }
        let counter = self
            .tenants
            .entry(tenant.to_string())
            .or_insert_with(|| Arc::new(AtomicU32::new(0)))
            .clone();
        let tenant_current = counter.fetch_add(1, Ordering::AcqRel);
        if tenant_current >= self.limits.tenant_max {
            counter.fetch_sub(1, Ordering::AcqRel);
            self.inflight.fetch_sub(1, Ordering::AcqRel);
            return Err(refusal(
                ErrorCode::RateLimited,
                format!(
                    "tenant {tenant:?} has {tenant_current} requests in flight (bound {})",
                    self.limits.tenant_max
                ),
            ));
        }
        Ok(Admitted {
            node: self.inflight.clone(),
            tenant: counter,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn admission(node_max: u32, tenant_max: u32, acquire_percent: u32) -> Admission {
        Admission::new(AdmissionLimits {
            node_max,
            tenant_max,
            acquire_percent,
        })
    }

    #[test]
    fn renewals_are_admitted_after_acquires_are_refused() {
        let admission = admission(8, 100, 75);
        let acquires: Vec<_> = (0..6)
            .map(|_| admission.admit("a", RequestClass::Acquire).unwrap())
            .collect();
        let refused = admission.admit("a", RequestClass::Acquire).unwrap_err();
        assert_eq!(refused.code, ErrorCode::Overloaded);
        assert!(refused.retryable);
        assert_eq!(refused.retry_after_ms, Some(RETRY_AFTER_MS));
        let renew_1 = admission.admit("a", RequestClass::Other).unwrap();
        let renew_2 = admission.admit("b", RequestClass::Other).unwrap();
        let overloaded = admission.admit("b", RequestClass::Other).unwrap_err();
        assert_eq!(overloaded.code, ErrorCode::Overloaded);
        assert_eq!(admission.inflight(), 8);
        drop((acquires, renew_1, renew_2));
        assert_eq!(admission.inflight(), 0);
        admission.admit("a", RequestClass::Acquire).unwrap();
    }

    #[test]
    fn one_tenant_cannot_take_the_whole_node() {
        let admission = admission(100, 3, 100);
        let held: Vec<_> = (0..3)
            .map(|_| admission.admit("noisy", RequestClass::Other).unwrap())
            .collect();
        let limited = admission.admit("noisy", RequestClass::Other).unwrap_err();
        assert_eq!(limited.code, ErrorCode::RateLimited);
        assert!(limited.retryable);
        assert!(limited.retry_after_ms.is_some());
        // The refusal released its node slot; other tenants are unaffected.
        assert_eq!(admission.inflight(), 3);
        admission.admit("quiet", RequestClass::Acquire).unwrap();
        drop(held);
        admission.admit("noisy", RequestClass::Other).unwrap();
    }
}
