//! Every bound the state machine enforces, in one place, with units in the names.
//!
//! Fixed bounds (identifier sizes) are constants of the contract. Tunable bounds live in
//! [`GroupLimits`], which is *replicated state*: it is set by a command through the log
//! ([`crate::Command::SetGroupLimits`]) and travels in snapshots, so apply never reads
//! configuration and every replica enforces the same numbers. Per-tenant tightening lives in
//! [`TenantPolicy`], also set through the log.
//!
//! Two pure helpers let whoever *writes* the limits into the log (the server, from its
//! configuration) keep them honest across a cluster; apply never calls them:
//! - [`tenant_group_share`]: the per-group slice of a tenant's cluster-wide active-lease quota;
//! - [`GroupLimits::state_bytes_max`] and [`GroupLimits::sized_for_bytes`]: the worst-case heap of
//!   one group's state at given limits, from the `lease_memory` measurements, and limits that fit
//!   a byte budget.
//!
//! Must not depend on: configuration files, the server, anything but the limits themselves.

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
/// Operations one log entry may carry by default ([`GroupLimits::batch_items_max`]). The one
/// definition of this bound: the wire's `BATCH_OPS_MAX` (a client's `Batch` is proposed as one
/// entry) and the server's `OPS_PER_ENTRY_CEILING` (the proposer's entries) are this value, and
/// the server checks both against the groups' actual limit when a node starts.
pub const BATCH_ITEMS_MAX_DEFAULT: u32 = 4_096;

/// Heap bytes of one lease record with short ids, as `tenure-bench`'s `lease_memory` measured it
/// (175.7 bytes per active lease at 1M leases; the hash tables then sit at their emptiest load,
/// so this is the per-record figure's worst point between two table sizes).
pub const LEASE_RECORD_BYTES_MEASURED: u64 = 176;
/// Heap bytes of one request-id record, as `lease_memory` measured it (345.3 - 175.7).
pub const DEDUP_RECORD_BYTES_MEASURED: u64 = 170;
/// Heap bytes one lease record may take at worst: the measurement plus its resource and holder
/// ids at their longest on the heap (256 + 128) plus 80 for allocator headers, the inactive
/// queue's entry and B-tree node slack.
pub const LEASE_RECORD_BYTES_WORST: u64 =
    LEASE_RECORD_BYTES_MEASURED + RESOURCE_ID_BYTES_MAX as u64 + HOLDER_ID_BYTES_MAX as u64 + 80;
/// Heap bytes one request-id record may take at worst: the measurement, plus 112 for the ring
/// just after it doubled, plus a stored outcome's longest string (a holder id, 128 + 16), plus
/// room for a stored identity (tenant, resource and request id at their longest, 448 + 48) so
/// that comparing the full identity on a hit (contract 3.4) stays inside the bound.
pub const DEDUP_RECORD_BYTES_WORST: u64 = DEDUP_RECORD_BYTES_MEASURED
    + 112
    + HOLDER_ID_BYTES_MAX as u64
    + 16
    + (TENANT_ID_BYTES_MAX + RESOURCE_ID_BYTES_MAX + REQUEST_ID_BYTES_MAX) as u64
    + 48
    + 6;
/// Heap bytes one tenant's entry in a group may take at worst (its state in a vector that may
/// have just doubled, its name twice at 64 bytes on the heap, the name index's bucket).
pub const TENANT_BYTES_WORST: u64 = 400;

/// The node memory the defaults are sized for: half of the 24 GiB reference machine, the other
/// half left to RocksDB, the transport, snapshot transfer and restore, hash-table growth and the
/// page cache.
pub const NODE_STATE_BYTES_DEFAULT: u64 = 12 << 30;
/// Groups one node hosts in the default cluster (64 groups, 3 nodes, 3 replicas each).
pub const HOSTED_GROUPS_DEFAULT: u64 = 64;
/// A tenant's cluster-wide active-lease quota by default.
pub const TENANT_ACTIVE_LEASES_MAX_DEFAULT: u64 = 1_000_000;
/// Default slack of a group's share of a tenant quota over the even split, in percent.
pub const TENANT_QUOTA_SLACK_PERCENT_DEFAULT: u32 = 25;
/// Default floor of a group's share of a tenant quota, in leases.
pub const TENANT_GROUP_SHARE_FLOOR_DEFAULT: u64 = 512;
/// Distinct tenants one group keeps state for, by default.
pub const GROUP_TENANTS_MAX_DEFAULT: u32 = 16_384;
/// Lease records (and, as many, request-id records) per group by default: what
/// [`GroupLimits::sized_for_bytes`] gives for [`NODE_STATE_BYTES_DEFAULT`] over
/// [`HOSTED_GROUPS_DEFAULT`] groups (a test keeps the two equal).
pub const GROUP_RECORDS_MAX_DEFAULT: u64 = 124_000;

/// The active leases one group lets a tenant hold so that the tenant's leases over all `groups`
/// stay near `cluster_quota`: the even split raised by `slack_percent`, at least
/// `min(floor, cluster_quota)`, at most `cluster_quota`.
///
/// Placement hashes every `(tenant, resource)` to a slot, so a tenant's resources spread over the
/// groups like balls in bins: with `m = cluster_quota / groups`, a group's count at the full quota
/// has mean `m` and standard deviation below `sqrt(m)`. The share leaves `max(slack * m, floor -
/// m)` of headroom, which with the defaults (25%, 512) is at least 5 standard deviations for every
/// `m` (the worst is `m` near 410), so a tenant is refused before its quota only with
/// probability about 2e-7 per group (normal approximation). Resources a tenant chooses to pile into one group are refused
/// sooner, never later.
///
/// Worst-case overshoot (a hard bound, whatever the resource names): the tenant holds at most
/// `groups * share` leases, i.e. `max(cluster_quota * (1 + slack) + groups, groups *
/// min(floor, cluster_quota))`: 1,250,048 (64 x 19,532) for the default 1M quota over 64 groups, and for a
/// small quota at most `groups * floor` (32,768 at the defaults). The floor is safe because that
/// overshoot is a constant per tenant, and because memory never rests on tenant quotas: every
/// group's tables are bounded by its own record maxima, which the node budget checks.
pub fn tenant_group_share(cluster_quota: u64, groups: u32, slack_percent: u32, floor: u64) -> u64 {
    let groups = u128::from(groups.max(1));
    let raised = u128::from(cluster_quota) * (100 + u128::from(slack_percent));
    let even = u64::try_from(raised.div_ceil(100 * groups)).unwrap_or(u64::MAX);
    even.max(floor.min(cluster_quota)).min(cluster_quota)
}

/// The tunable bounds of one group. Replicated: changed only through the log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupLimits {
    /// Shortest ttl a lease may be granted. The default is 1.5 x a 1 s maximum election
    /// timeout, so a holder can renew across a failover; the server derives it from its timing.
    pub ttl_ms_min: u64,
    /// Longest ttl a lease may be granted (default 1 hour).
    pub ttl_ms_max: u64,
    /// Active leases a tenant may hold in this group unless its policy says otherwise. The server
    /// sets it to this group's share of the tenant's cluster-wide quota
    /// ([`tenant_group_share`]), so the quota holds across the cluster.
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
            tenant_active_leases_max_default: tenant_group_share(
                TENANT_ACTIVE_LEASES_MAX_DEFAULT,
                64,
                TENANT_QUOTA_SLACK_PERCENT_DEFAULT,
                TENANT_GROUP_SHARE_FLOOR_DEFAULT,
            ),
            tenants_max: GROUP_TENANTS_MAX_DEFAULT,
            lease_records_max: GROUP_RECORDS_MAX_DEFAULT,
            dedup_retention_ms: 600_000,
            dedup_retention_ms_min: 10_000,
            dedup_records_max: GROUP_RECORDS_MAX_DEFAULT,
            inactive_retention_ms: 600_000,
            inactive_records_max: GROUP_RECORDS_MAX_DEFAULT,
            batch_items_max: BATCH_ITEMS_MAX_DEFAULT,
            expire_batch_max: 4_096,
            list_page_size_max: 1_000,
            list_scan_max: 10_000,
        }
    }
}

impl GroupLimits {
    /// The most heap one group's state can take at these limits, in bytes: every lease record,
    /// request-id record and tenant at its worst size ([`LEASE_RECORD_BYTES_WORST`],
    /// [`DEDUP_RECORD_BYTES_WORST`], [`TENANT_BYTES_WORST`]). Apply enforces each count on every
    /// entry, replayed ones included, so this holds after any restart too.
    pub fn state_bytes_max(&self) -> u64 {
        self.lease_records_max
            .saturating_mul(LEASE_RECORD_BYTES_WORST)
            .saturating_add(
                self.dedup_records_max
                    .saturating_mul(DEDUP_RECORD_BYTES_WORST),
            )
            .saturating_add(u64::from(self.tenants_max).saturating_mul(TENANT_BYTES_WORST))
    }

    /// The number of lease records, and as many request-id records, that one group may keep
    /// within `group_bytes` of heap with `tenants_max` tenants: rounded down to a multiple of
    /// 1,000 when at least 10,000. `None` when not even one of each fits.
    pub fn records_for_bytes(group_bytes: u64, tenants_max: u32) -> Option<u64> {
        let for_records =
            group_bytes.checked_sub(u64::from(tenants_max).saturating_mul(TENANT_BYTES_WORST))?;
        let records = for_records / (LEASE_RECORD_BYTES_WORST + DEDUP_RECORD_BYTES_WORST);
        match records {
            0 => None,
            1..10_000 => Some(records),
            _ => Some(records / 1_000 * 1_000),
        }
    }

    /// These limits with lease, inactive and request-id record maxima sized to fit
    /// `group_bytes` (see [`GroupLimits::records_for_bytes`]); `None` when nothing fits.
    pub fn sized_for_bytes(&self, group_bytes: u64) -> Option<GroupLimits> {
        let records = Self::records_for_bytes(group_bytes, self.tenants_max)?;
        Some(GroupLimits {
            lease_records_max: records,
            inactive_records_max: records,
            dedup_records_max: records,
            ..self.clone()
        })
    }

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
    fn default_records_max_is_the_reference_node_budget_split_over_its_groups() {
        let defaults = GroupLimits::default();
        let sized = defaults
            .sized_for_bytes(NODE_STATE_BYTES_DEFAULT / HOSTED_GROUPS_DEFAULT)
            .unwrap();
        assert_eq!(sized, defaults);
        let node_bytes = HOSTED_GROUPS_DEFAULT * defaults.state_bytes_max();
        assert!(node_bytes <= NODE_STATE_BYTES_DEFAULT, "{node_bytes}");
    }

    #[test]
    fn records_for_bytes_rounds_down_and_refuses_what_cannot_fit() {
        let per_record = LEASE_RECORD_BYTES_WORST + DEDUP_RECORD_BYTES_WORST;
        assert_eq!(
            GroupLimits::records_for_bytes(per_record * 10 + 400, 1),
            Some(10)
        );
        assert_eq!(
            GroupLimits::records_for_bytes(per_record * 1_234 + 400, 1),
            Some(1_234)
        );
        assert_eq!(
            GroupLimits::records_for_bytes(per_record * 12_345 + 400, 1),
            Some(12_000)
        );
        assert_eq!(
            GroupLimits::records_for_bytes(per_record - 1 + 400, 1),
            None
        );
        assert_eq!(GroupLimits::records_for_bytes(100, 1), None);
    }

    #[test]
    fn tenant_group_share_splits_with_slack_and_floor() {
        // The default: 1M over 64 groups, 25% slack.
        assert_eq!(tenant_group_share(1_000_000, 64, 25, 512), 19_532);
        assert_eq!(64 * 19_532, 1_250_048);
        // Small quotas: the floor, never more than the quota itself.
        assert_eq!(tenant_group_share(1_000, 64, 25, 512), 512);
        assert_eq!(tenant_group_share(10, 64, 25, 512), 10);
        assert_eq!(tenant_group_share(0, 64, 25, 512), 0);
        // One group: the quota exactly, whatever the slack.
        assert_eq!(tenant_group_share(777, 1, 25, 512), 777);
        assert_eq!(tenant_group_share(u64::MAX, 1, 100, 0), u64::MAX);
        assert_eq!(tenant_group_share(5, 0, 25, 0), 5);
    }

    #[test]
    fn tenant_group_share_headroom_is_at_least_five_deviations() {
        // Every even split m from 1 to 100k leases per group, at the defaults: the headroom over
        // m, in standard deviations of a group's count (at most sqrt(m)).
        let mut worst = f64::MAX;
        for m in 1..100_000u64 {
            let quota = m * 64;
            let share = tenant_group_share(
                quota,
                64,
                TENANT_QUOTA_SLACK_PERCENT_DEFAULT,
                TENANT_GROUP_SHARE_FLOOR_DEFAULT,
            );
            #[allow(clippy::cast_precision_loss)]
            let sigmas = (share - m) as f64 / (m as f64).sqrt();
            worst = worst.min(sigmas);
        }
        assert!(worst >= 5.0, "worst headroom {worst} deviations");
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
