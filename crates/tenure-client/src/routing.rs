//! The client's routing cache: the placement map (key -> group, computed locally with
//! `tenure-core`'s placement function), the leader of each group with the term it was seen in,
//! and the nodes' addresses.
//!
//! Must not depend on: connections or the runtime; callers feed it routing tables and hints.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use tenure_core::{GroupId, PlacementMap};
use tenure_proto::client::{NodeAddress, RoutingTable};

/// A node as the routing table names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    /// Node id.
    pub node_id: u64,
    /// QUIC address.
    pub addr: SocketAddr,
    /// HTTP gateway URL.
    pub http_url: String,
}

/// Leadership of one group as the client knows it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LeaderEntry {
    /// The leader, if known.
    pub leader: Option<u64>,
    /// The term it was seen in (0 when learnt from a hint without a term).
    pub term: u64,
}

/// The cache itself.
#[derive(Debug, Clone, Default)]
pub struct RoutingState {
    placement: Option<PlacementMap>,
    groups: u32,
    leaders: Vec<LeaderEntry>,
    nodes: BTreeMap<u64, NodeInfo>,
    /// Version of the node list last taken from a table (the cluster node table's).
    nodes_version: u64,
}

impl RoutingState {
    /// Merges a routing table: a newer placement map replaces the old one; a group's leader is
    /// taken when seen in a term at least as new as the one known.
    pub fn apply_table(&mut self, table: &RoutingTable) -> Result<(), String> {
        let newer = self
            .placement
            .as_ref()
            .is_none_or(|map| table.placement_version > map.version());
        if newer {
            let slots = table.slot_groups.iter().copied().map(GroupId).collect();
            let map = PlacementMap::from_slots(table.placement_version, slots)
                .map_err(|error| format!("the routing table's placement map: {error}"))?;
            if let Some(bad) = map.slot_groups().iter().find(|g| g.0 >= table.groups) {
                return Err(format!(
                    "the placement map names group {} of {}",
                    bad.0, table.groups
                ));
            }
            self.placement = Some(map);
            self.groups = table.groups;
            self.leaders = vec![LeaderEntry::default(); table.groups as usize];
        } else if self
            .placement
            .as_ref()
            .is_some_and(|map| table.placement_version < map.version())
        {
            // An older map's leaders may describe other groups; ignore the table.
            return Ok(());
        }
        if table.nodes_version > self.nodes_version {
            // A newer node list replaces ours: removed nodes go, new ones come.
            self.nodes.clear();
            self.nodes_version = table.nodes_version;
            for node in &table.nodes {
                self.learn_node(node);
            }
        } else if table.nodes_version == self.nodes_version {
            for node in &table.nodes {
                self.learn_node(node);
            }
        }
        for seen in &table.leaders {
            let Some(entry) = self.leaders.get_mut(seen.group_id as usize) else {
                continue;
            };
            if seen.leader.is_some() && seen.term >= entry.term {
                entry.leader = seen.leader;
                entry.term = seen.term;
            }
        }
        Ok(())
    }

    /// Records a node's addresses (from a table or a leader hint).
    pub fn learn_node(&mut self, node: &NodeAddress) {
        if let Ok(addr) = node.client_addr.parse::<SocketAddr>() {
            self.nodes.insert(
                node.node_id,
                NodeInfo {
                    node_id: node.node_id,
                    addr,
                    http_url: node.http_url.clone(),
                },
            );
        }
    }

    /// Records a `NOT_LEADER` hint: `leader` leads `group` (term unknown).
    pub fn note_leader(&mut self, group: u32, leader: Option<u64>) {
        if let Some(entry) = self.leaders.get_mut(group as usize) {
            entry.leader = leader;
        }
    }

    /// Forgets the leader of `group` (it did not answer). The term is kept, so a view from an
    /// older term cannot come back; a table naming the same leader in the same term can (it is
    /// still the best knowledge until an election ends).
    pub fn forget_leader(&mut self, group: u32) {
        self.note_leader(group, None);
    }

    /// Forgets every group led by `node`.
    pub fn forget_node_leadership(&mut self, node: u64) {
        for entry in &mut self.leaders {
            if entry.leader == Some(node) {
                entry.leader = None;
            }
        }
    }

    /// The group of a key, once a placement map is known.
    pub fn group_of(&self, tenant_id: &str, resource_id: &str) -> Option<u32> {
        self.placement
            .as_ref()
            .map(|map| map.group_of(tenant_id, resource_id).0)
    }

    /// The known leader of a group and its address.
    pub fn leader(&self, group: u32) -> Option<&NodeInfo> {
        let leader = self.leaders.get(group as usize)?.leader?;
        self.nodes.get(&leader)
    }

    /// Leadership of every group, indexed by group id.
    pub fn leaders(&self) -> &[LeaderEntry] {
        &self.leaders
    }

    /// Version of the node list (0 until a table carried one).
    pub fn nodes_version(&self) -> u64 {
        self.nodes_version
    }

    /// The known nodes, by id.
    pub fn nodes(&self) -> impl Iterator<Item = &NodeInfo> {
        self.nodes.values()
    }

    /// A node's addresses.
    pub fn node(&self, node_id: u64) -> Option<&NodeInfo> {
        self.nodes.get(&node_id)
    }

    /// Version of the placement map (0 before the first table).
    pub fn placement_version(&self) -> u64 {
        self.placement.as_ref().map_or(0, PlacementMap::version)
    }

    /// Number of groups (0 before the first table).
    pub fn groups(&self) -> u32 {
        self.groups
    }
}

#[cfg(test)]
#[allow(clippy::cast_possible_truncation, clippy::unwrap_used)]
mod tests {
    use super::*;
    use tenure_proto::client::GroupLeader;

    fn table(version: u64, leaders: &[(Option<u64>, u64)]) -> RoutingTable {
        let groups = leaders.len() as u32;
        RoutingTable {
            placement_version: version,
            slot_groups: (0..16).map(|slot| slot % groups).collect(),
            groups,
            nodes: (1..=3)
                .map(|id| NodeAddress {
                    node_id: id,
                    client_addr: format!("127.0.0.1:{}", 7400 + id),
                    http_url: format!("http://127.0.0.1:{}", 8400 + id),
                })
                .collect(),
            leaders: leaders
                .iter()
                .enumerate()
                .map(|(group, &(leader, term))| GroupLeader {
                    group_id: group as u32,
                    leader,
                    term,
                })
                .collect(),
            nodes_version: 0,
        }
    }

    #[test]
    fn a_newer_node_list_replaces_the_old_one() {
        let mut state = RoutingState::default();
        state.apply_table(&table(1, &[(Some(1), 3)])).unwrap();
        assert_eq!(state.nodes().count(), 3);
        // The node table grew to 4 and dropped node 2.
        let mut grown = table(1, &[(Some(1), 3)]);
        grown.nodes_version = 5;
        grown.nodes.retain(|node| node.node_id != 2);
        grown.nodes.push(NodeAddress {
            node_id: 4,
            client_addr: "127.0.0.1:7404".into(),
            http_url: "http://127.0.0.1:8404".into(),
        });
        state.apply_table(&grown).unwrap();
        let ids: Vec<u64> = state.nodes().map(|node| node.node_id).collect();
        assert_eq!(ids, vec![1, 3, 4]);
        assert_eq!(state.nodes_version(), 5);
        // A node that has not caught up with the table yet does not bring node 2 back.
        state.apply_table(&table(1, &[(Some(1), 3)])).unwrap();
        let ids: Vec<u64> = state.nodes().map(|node| node.node_id).collect();
        assert_eq!(ids, vec![1, 3, 4]);
    }

    #[test]
    fn newer_terms_win_and_older_views_are_ignored() {
        let mut state = RoutingState::default();
        state
            .apply_table(&table(1, &[(Some(1), 3), (Some(2), 4)]))
            .unwrap();
        assert_eq!(state.leader(0).unwrap().node_id, 1);
        // A node that has not heard of the new leader yet reports an older term.
        state
            .apply_table(&table(1, &[(Some(2), 2), (Some(3), 5)]))
            .unwrap();
        assert_eq!(state.leader(0).unwrap().node_id, 1);
        assert_eq!(state.leader(1).unwrap().node_id, 3);
        state.forget_node_leadership(3);
        assert!(state.leader(1).is_none());
        state.note_leader(1, Some(2));
        assert_eq!(state.leader(1).unwrap().addr.port(), 7402);
        // A table of an older placement version is ignored.
        state
            .apply_table(&table(0, &[(Some(3), 9), (Some(3), 9)]))
            .unwrap();
        assert_eq!(state.leader(0).unwrap().node_id, 1);
        assert_eq!(state.placement_version(), 1);
        assert!(state.group_of("t", "r").is_some_and(|g| g < 2));
    }

    #[test]
    fn a_bad_placement_map_is_refused() {
        let mut bad = table(1, &[(Some(1), 1)]);
        bad.slot_groups = vec![0, 0, 0];
        assert!(RoutingState::default().apply_table(&bad).is_err());
        let mut bad = table(1, &[(Some(1), 1)]);
        bad.slot_groups[3] = 7;
        assert!(RoutingState::default().apply_table(&bad).is_err());
    }
}
