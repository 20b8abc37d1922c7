//! The leader-table exchange: a node that does not host every group learns the leaders of the
//! others by asking the other nodes for their routing tables once a second.
//!
//! Must not depend on: the request path.

use std::sync::Arc;
use std::time::Duration;

use tenure_proto::client::{RequestBody, RequestFlags, ResponseBody};

use crate::group::LeaderView;
use crate::shared::NodeShared;

/// Learns the leaders of groups this node does not host by asking the other nodes (in the
/// rounds when it does not host every group: replicas move at run time).
pub(crate) async fn run_leader_exchange(shared: Arc<NodeShared>) {
    let principal = crate::membership::node_principal(shared.config.node_id);
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    loop {
        ticker.tick().await;
        if shared.hosts_every_group() {
            continue;
        }
        for peer in shared.member_nodes() {
            if peer == shared.config.node_id {
                continue;
            }
            let answer = shared
                .forwarder
                .forward(
                    peer,
                    &principal,
                    RequestFlags::default(),
                    RequestBody::Routing,
                    Duration::from_secs(2),
                )
                .await;
            let Ok(ResponseBody::Routing(table)) = answer else {
                continue;
            };
            if let Ok(mut views) = shared.remote_leaders.lock() {
                for leader in table.leaders {
                    if let Some(view) = views.get_mut(leader.group_id as usize) {
                        if leader.term >= view.term && leader.leader.is_some() {
                            *view = LeaderView {
                                leader: leader.leader,
                                term: leader.term,
                            };
                        }
                    }
                }
            }
        }
    }
}
