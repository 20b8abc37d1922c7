//! Every bound the state machine enforces, in one place, with units in the names.
//!
//! Fixed bounds (identifier sizes) are constants of the contract. Tunable bounds live in
//! [`GroupLimits`], which is *replicated state*: it is set by a command through the log
//! ([`crate::Command::SetGroupLimits`]) and travels in snapshots, so apply never reads
//! configuration and every replica enforces the same numbers. Per-tenant tightening lives in
//! [`TenantPolicy`], also set through the log.

use serde::{Deserialize, Serialize};

use crate::error::LeaseError;

/// Longest tenant id, in UTF-8 bytes (contract section 1).
pub const TENANT_ID_BYTES_MAX: usize = 64;
/// Longest resource id, in UTF-8 bytes (contract section 1).
pub const RESOURCE_ID_BYTES_MAX: usize = 256;
/// Longest holder id, in UTF-8 bytes (contract section 1).
pub const HOLDER_ID_BYTES_MAX: usize = 128;
/// Longest request id, in UTF-8 bytes.
pub const REQUEST_ID_BYTES_MAX: usize = 128;
/// Largest ttl any configuration may allow: the state keeps ttls in 32 bits (about 49 days).
pub const TTL_MS_CEILING: u64 = u32::MAX as u64;
/// Largest batch any configuration may allow.
pub const BATCH_ITEMS_CEILING: u32 = 65_536;

/// The tunable bounds of one group. Replicated: changed only through the log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupLimits {
    /// Shortest ttl a lease may be granted. The default is 1.5 x a 1 s maximum election
    /// timeout, so a holder can renew across a failover; the server derives it from its timing.
    pub ttl_ms_min: u64,
    /// Longest ttl a lease may be granted (default 1 hour).
    pub ttl_ms_max: u64,
    /// Active leases a tenant may hold in this group unless its policy says otherwise.
    pub tenant_active_leases_max_default: u64,
    /// Distinct tenants this group keeps state for.
    pub tenants_max: u32,
    /// Lease records (active plus retained inactive ones) this group keeps.
    pub lease_records_max: u64,
    /// How long a request id's outcome is kept for deduplication (default 10 minutes).
    pub dedup_retention_ms: u64,
    /// Retention always guaranteed: when the table is full, a record younger than this is never
    /// dropped early; the new request is refused with `OVERLOADED` instead.
    pub dedup_retention_ms_min: u64,
    /// Request-id records kept at most; bounds the table's memory.
    pub dedup_records_max: u64,
    /// How long a released or expired lease's record stays visible (answers `LEASE_EXPIRED`
    /// rather than `NOT_FOUND`, and shows in Get and List).
    pub inactive_retention_ms: u64,
    /// Inactive lease records kept at most; the oldest is dropped first beyond this.
    pub inactive_records_max: u64,
    /// Items in one Batch command.
    pub batch_items_max: u32,
    /// Leases one Expire command reclaims at most, and the bound on the reclaim an Acquire may
    /// perform before answering `QUOTA_EXCEEDED`.
    pub expire_batch_max: u32,
    /// Largest List page.
    pub list_page_size_max: u32,
    /// Index entries one List page may examine (bounds the cost of a filtered listing).
    pub list_scan_max: u32,
}

impl Default for GroupLimits {
    fn default() -> Self {
        GroupLimits {
            ttl_ms_min: 1_500,
            ttl_ms_max: 3_600_000,
            tenant_active_leases_max_default: 1_000_000,
            tenants_max: 65_536,
            lease_records_max: 10_000_000,
            dedup_retention_ms: 600_000,
            dedup_retention_ms_min: 10_000,
            dedup_records_max: 1_000_000,
            inactive_retention_ms: 600_000,
            inactive_records_max: 1_000_000,
            batch_items_max: 4_096,
            expire_batch_max: 4_096,
            list_page_size_max: 1_000,
            list_scan_max: 10_000,
        }
    }
}

impl GroupLimits {
    /// Checks that the limits are coherent; the error names the first incoherent field.
    pub fn validate(&self) -> Result<(), LeaseError> {
        if self.ttl_ms_min == 0 {
            return Err(LeaseError::invalid("ttl_ms_min", "must be at least 1"));
        }
        if self.ttl_ms_min > self.ttl_ms_max {
            return Err(LeaseError::invalid(
                "ttl_ms_min",
                "must not exceed ttl_ms_max",
            ));
        }
        if self.ttl_ms_max > TTL_MS_CEILING {
            return Err(LeaseError::invalid(
                "ttl_ms_max",
                format!("must be at most {TTL_MS_CEILING}"),
            ));
        }
        if self.dedup_records_max == 0 {
            return Err(LeaseError::invalid(
                "dedup_records_max",
                "must be at least 1",
            ));
        }
        if self.dedup_retention_ms_min > self.dedup_retention_ms {
            return Err(LeaseError::invalid(
                "dedup_retention_ms_min",
                "must not exceed dedup_retention_ms",
            ));
        }
        if self.batch_items_max == 0 || self.batch_items_max > BATCH_ITEMS_CEILING {
            return Err(LeaseError::invalid(
                "batch_items_max",
                format!("must be within [1, {BATCH_ITEMS_CEILING}]"),
            ));
        }
        if self.expire_batch_max == 0 {
            return Err(LeaseError::invalid(
                "expire_batch_max",
                "must be at least 1",
            ));
        }
        if self.list_page_size_max == 0 {
            return Err(LeaseError::invalid(
                "list_page_size_max",
                "must be at least 1",
            ));
        }
        if self.list_scan_max < self.list_page_size_max {
            return Err(LeaseError::invalid(
                "list_scan_max",
                "must be at least list_page_size_max",
            ));
        }
        if self.lease_records_max > u64::from(u32::MAX) {
            return Err(LeaseError::invalid(
                "lease_records_max",
                format!("must be at most {}", u32::MAX),
            ));
        }
        Ok(())
    }
}

/// Per-tenant tightening of the group's limits. `None` means "the group's value".
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantPolicy {
    /// Active leases the tenant may hold in this group.
    pub active_leases_max: Option<u64>,
    /// Shortest ttl for this tenant; only tightens the group's `ttl_ms_min`.
    pub ttl_ms_min: Option<u64>,
    /// Longest ttl for this tenant; only tightens the group's `ttl_ms_max`.
    pub ttl_ms_max: Option<u64>,
}

impl TenantPolicy {
    /// Checks the policy on its own (the group's limits are applied on top at use).
    pub fn validate(&self) -> Result<(), LeaseError> {
        if let (Some(min), Some(max)) = (self.ttl_ms_min, self.ttl_ms_max)
            && min > max
        {
            return Err(LeaseError::invalid(
                "ttl_ms_min",
                "must not exceed ttl_ms_max",
            ));
        }
        if self.ttl_ms_max == Some(0) {
            return Err(LeaseError::invalid("ttl_ms_max", "must be at least 1"));
        }
        Ok(())
    }

    /// The ttl range in force: the group's range, tightened by the policy.
    pub fn ttl_bounds_ms(&self, limits: &GroupLimits) -> (u64, u64) {
        let min = self
            .ttl_ms_min
            .map_or(limits.ttl_ms_min, |m| m.max(limits.ttl_ms_min));
        let max = self
            .ttl_ms_max
            .map_or(limits.ttl_ms_max, |m| m.min(limits.ttl_ms_max));
        (min, max)
    }

    /// The active-lease quota in force.
    pub fn active_leases_max(&self, limits: &GroupLimits) -> u64 {
        self.active_leases_max
            .unwrap_or(limits.tenant_active_leases_max_default)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_limits_are_valid() {
        GroupLimits::default().validate().unwrap();
    }

    #[test]
    fn tenant_policy_only_tightens_ttl_bounds() {
        let limits = GroupLimits::default();
        let loose = TenantPolicy {
            ttl_ms_min: Some(1),
            ttl_ms_max: Some(u64::MAX),
            active_leases_max: None,
        };
        assert_eq!(
            loose.ttl_bounds_ms(&limits),
            (limits.ttl_ms_min, limits.ttl_ms_max)
        );
        let tight = TenantPolicy {
            ttl_ms_min: Some(5_000),
            ttl_ms_max: Some(60_000),
            active_leases_max: Some(3),
        };
        assert_eq!(tight.ttl_bounds_ms(&limits), (5_000, 60_000));
        assert_eq!(tight.active_leases_max(&limits), 3);
    }

    #[test]
    fn incoherent_limits_are_rejected_naming_the_field() {
        let limits = GroupLimits {
            ttl_ms_min: 10,
            ttl_ms_max: 5,
            ..GroupLimits::default()
        };
        let err = limits.validate().unwrap_err();
        assert!(err.to_string().contains("ttl_ms_min"), "{err}");
    }
}
