//! Placement: which group a resource belongs to. A pure, documented function that clients in
//! any language compute too.
//!
//! ```text
//! key_hash  = XXH3-64, seed 0, over  u32_le(len(tenant_id)) || tenant_id || resource_id
//! slot      = key_hash >> (64 - log2(slot_count))          (the hash's top bits)
//! group     = map.slot_groups[slot]
//! ```
//!
//! A [`PlacementMap`] has a version and a power-of-two number of hash slots (4096 by default),
//! each assigned to a group. Moving a resource means reassigning its slot in a new map version,
//! never changing the hash. The length prefix makes `("ab", "c")` and `("a", "bc")` hash apart.

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::Xxh3Default;

use crate::ids::GroupId;

/// Default number of hash slots in a map.
pub const SLOT_COUNT_DEFAULT: u32 = 4_096;
/// Largest number of hash slots a map may have.
pub const SLOT_COUNT_MAX: u32 = 1 << 20;

/// Why a placement map could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    /// The slot count is not a power of two in `[1, SLOT_COUNT_MAX]`.
    #[error("slot count {0} must be a power of two between 1 and {SLOT_COUNT_MAX}")]
    BadSlotCount(usize),
    /// There are no groups, or more groups than slots.
    #[error("group count {groups} must be between 1 and the slot count {slots}")]
    BadGroupCount {
        /// Groups asked for.
        groups: u32,
        /// Slots available.
        slots: u32,
    },
}

/// The 64-bit placement hash of a resource key (see the module docs for the exact bytes).
pub fn key_hash(tenant_id: &str, resource_id: &str) -> u64 {
    let mut hasher = Xxh3Default::new();
    let tenant_len = u32::try_from(tenant_id.len()).unwrap_or(u32::MAX);
    hasher.update(&tenant_len.to_le_bytes());
    hasher.update(tenant_id.as_bytes());
    hasher.update(resource_id.as_bytes());
    hasher.digest()
}

/// A versioned assignment of hash slots to groups.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlacementMap {
    version: u64,
    slot_groups: Vec<GroupId>,
}

impl PlacementMap {
    /// A map of `slot_count` slots spread round-robin over groups `0..group_count`.
    pub fn uniform(
        version: u64,
        group_count: u32,
        slot_count: u32,
    ) -> Result<Self, PlacementError> {
        if !slot_count.is_power_of_two() || slot_count > SLOT_COUNT_MAX {
            return Err(PlacementError::BadSlotCount(slot_count as usize));
        }
        if group_count == 0 || group_count > slot_count {
            return Err(PlacementError::BadGroupCount {
                groups: group_count,
                slots: slot_count,
            });
        }
        let slot_groups = (0..slot_count)
            .map(|slot| GroupId(slot % group_count))
            .collect();
        Ok(PlacementMap {
            version,
            slot_groups,
        })
    }

    /// A map from an explicit slot assignment (for example after moves).
    pub fn from_slots(version: u64, slot_groups: Vec<GroupId>) -> Result<Self, PlacementError> {
        let len = slot_groups.len();
        if !len.is_power_of_two() || len > SLOT_COUNT_MAX as usize {
            return Err(PlacementError::BadSlotCount(len));
        }
        Ok(PlacementMap {
            version,
            slot_groups,
        })
    }

    /// The map's version; a newer map has a larger version.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Number of hash slots.
    pub fn slot_count(&self) -> u32 {
        // Bounded by SLOT_COUNT_MAX at construction.
        u32::try_from(self.slot_groups.len()).unwrap_or(u32::MAX)
    }

    /// The group each slot is assigned to.
    pub fn slot_groups(&self) -> &[GroupId] {
        &self.slot_groups
    }

    /// The hash slot of a key.
    pub fn slot_of(&self, tenant_id: &str, resource_id: &str) -> u32 {
        let bits = self.slot_count().trailing_zeros();
        if bits == 0 {
            return 0;
        }
        let slot = key_hash(tenant_id, resource_id) >> (64 - bits);
        // `slot < 2^bits <= SLOT_COUNT_MAX`, so it fits.
        u32::try_from(slot).unwrap_or(0)
    }

    /// The group a key belongs to under this map.
    pub fn group_of(&self, tenant_id: &str, resource_id: &str) -> GroupId {
        let slot = self.slot_of(tenant_id, resource_id) as usize;
        self.slot_groups[slot]
    }
}

/// `placement(tenant_id, resource_id, map) -> group`, the contract's function.
pub fn placement(tenant_id: &str, resource_id: &str, map: &PlacementMap) -> GroupId {
    map.group_of(tenant_id, resource_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_hash_is_pinned_so_other_languages_can_check_their_port() {
        // Values computed independently with Python's `xxhash.xxh3_64_intdigest` over the
        // documented bytes. Changing them moves every resource: never change them.
        let pinned = [
            ("acme", "jobs/nightly", 0x8e0e_9e28_c0af_44b3_u64, 2272),
            ("t", "r", 0x31b0_ec9a_fe1e_97ad, 795),
            ("tenant-a", "resource-0000001", 0x7fb3_fe24_3d40_0790, 2043),
            ("ünï", "çødé/✓", 0x8c10_396d_47c5_e810, 2241),
        ];
        let map = PlacementMap::uniform(1, 64, SLOT_COUNT_DEFAULT).unwrap();
        for (tenant, resource, hash, slot) in pinned {
            assert_eq!(key_hash(tenant, resource), hash, "{tenant}/{resource}");
            assert_eq!(map.slot_of(tenant, resource), slot, "{tenant}/{resource}");
            assert_eq!(placement(tenant, resource, &map), GroupId(slot % 64));
        }
        assert_ne!(key_hash("ab", "c"), key_hash("a", "bc"));
    }

    #[test]
    fn uniform_map_spreads_keys_over_every_group() {
        let map = PlacementMap::uniform(1, 64, SLOT_COUNT_DEFAULT).unwrap();
        let mut counts = [0u32; 64];
        for i in 0..64_000 {
            counts[map.group_of("tenant", &format!("resource-{i}")).0 as usize] += 1;
        }
        let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
        assert!(
            *min > 800 && *max < 1_200,
            "uneven spread: min {min} max {max}"
        );
    }

    #[test]
    fn bad_maps_are_refused() {
        assert!(PlacementMap::uniform(1, 4, 1000).is_err());
        assert!(PlacementMap::uniform(1, 0, 1024).is_err());
        assert!(PlacementMap::uniform(1, 2048, 1024).is_err());
        assert!(PlacementMap::from_slots(1, vec![GroupId(0); 3]).is_err());
    }
}
