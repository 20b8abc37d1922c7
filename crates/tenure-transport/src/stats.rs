//! Counters of the peer transport: frames, messages, bytes, connections, faults, protocol errors.
//!
//! Plain atomics, read with [`TransportStats::snapshot`]; the server exports them as metrics.
//! Must not depend on any exporter.

use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// Live counters of one node's transport (monotonic since start).
        #[derive(Debug, Default)]
        pub struct TransportStats {
            $($(#[$doc])* pub(crate) $name: AtomicU64,)*
        }

        /// A copy of the counters at one moment.
        #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
        pub struct TransportStatsSnapshot {
            $($(#[$doc])* pub $name: u64,)*
        }

        impl TransportStats {
            /// Reads every counter.
            pub fn snapshot(&self) -> TransportStatsSnapshot {
                TransportStatsSnapshot {
                    $($name: self.$name.load(Ordering::Relaxed),)*
                }
            }
        }

        impl TransportStatsSnapshot {
            /// Counter sums `self + other` (totals over nodes).
            pub fn plus(&self, other: &Self) -> Self {
                Self {
                    $($name: self.$name.saturating_add(other.$name),)*
                }
            }

            /// Counter differences `self - earlier`.
            pub fn since(&self, earlier: &Self) -> Self {
                Self {
                    $($name: self.$name.saturating_sub(earlier.$name),)*
                }
            }
        }
    };
}

counters! {
    /// Batch frames written to peers.
    frames_sent,
    /// Raft messages written to peers (inside those frames).
    messages_sent,
    /// Frame bytes written to peers.
    bytes_sent,
    /// Batch frames read from peers.
    frames_received,
    /// Raft messages read from peers.
    messages_received,
    /// Heartbeats (AppendEntries without entries) sent.
    heartbeats_sent,
    /// AppendEntries requests of replication streams sent (one per follower per message).
    append_requests_sent,
    /// Log entries carried by those requests.
    append_entries_sent,
    /// Replication-stream AppendEntries without entries (they only move a follower's commit
    /// index or probe it).
    append_requests_without_entries_sent,
    /// Entry-less replication-stream AppendEntries never sent because the next request carried
    /// their commit index (answered by its success).
    append_requests_carried,
    /// Connections that completed the handshake (either direction).
    connections_established,
    /// Incoming connections refused at the handshake (bad certificate, unknown node, version).
    connections_refused,
    /// Incoming connections whose dialer gave up during the handshake (it got the pair's
    /// connection another way, or went away).
    handshakes_abandoned,
    /// Connections closed because the pair already had the preferred one.
    connections_deduplicated,
    /// Dial attempts that failed.
    dial_failures,
    /// Connections closed for a protocol error (garbage, oversize frame, unknown kind).
    protocol_errors,
    /// Requests for a group this node does not host.
    unknown_group_requests,
    /// Responses that arrived after their request gave up (or duplicates).
    orphan_responses,
    /// Messages dropped by the fault layer.
    fault_dropped,
    /// Messages duplicated by the fault layer.
    fault_duplicated,
    /// Messages delayed by the fault layer.
    fault_delayed,
    /// Snapshots sent.
    snapshots_sent,
    /// Snapshots received and handed to their group.
    snapshots_received,
}

pub(crate) fn add(counter: &AtomicU64, amount: u64) {
    counter.fetch_add(amount, Ordering::Relaxed);
}
