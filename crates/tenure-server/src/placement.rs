//! Which nodes host which groups: with node ids sorted `n_0 < n_1 < ...` and `N` nodes, group `g`
//! lives on `n_{(g+i) mod N}` for `i < replication_factor`; its preferred leader is `n_{g mod N}`,
//! which also bootstraps it on a fresh cluster. Keys map to groups with `tenure-core`'s placement
//! function over a uniform placement map of version [`PLACEMENT_VERSION`].
//!
//! Must not depend on: anything but the standard library (pure arithmetic).

/// Placement map version of a cluster created with a fixed group count.
pub const PLACEMENT_VERSION: u64 = 1;

/// The nodes hosting `group`, preferred leader first.
pub fn replicas_of(group: u32, node_ids: &[u64], replication_factor: u32) -> Vec<u64> {
    let count = node_ids.len();
    if count == 0 {
        return Vec::new();
    }
    let factor = usize::try_from(replication_factor)
        .unwrap_or(count)
        .clamp(1, count);
    let first = usize::try_from(group).unwrap_or(0) % count;
    (0..factor).map(|i| node_ids[(first + i) % count]).collect()
}
