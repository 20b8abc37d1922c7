//! Transport settings and the Raft group timing that goes with them.
//!
//! Every queue, frame and timer of the peer transport has its bound here, with units in the
//! names. Must not depend on: files, environment variables or command lines (the server reads
//! configuration and fills these structs).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

/// Default largest peer frame body, in bytes (32 MiB): one AppendEntries message, whose
/// entries a node sizes to fit it (`tenure_server::limits::check_relations`).
pub const FRAME_BYTES_MAX_DEFAULT: usize = 32 * 1024 * 1024;

/// Settings of one node's peer transport.
#[derive(Debug, Clone)]
pub struct TransportConfig {
    /// This node's id (its certificate must be valid for `node_server_name(node_id)`).
    pub node_id: u64,
    /// The cluster name; a peer from another cluster is refused at the handshake.
    pub cluster_name: String,
    /// UDP address the QUIC endpoint binds.
    pub listen_addr: SocketAddr,
    /// Every other member of the cluster and its address, at start (`Transport::add_peer` and
    /// `Transport::remove_peer` change the members later; `Transport::peers` lists them now).
    /// Connections from nodes not members are refused; messages for them fail as unknown peers.
    pub peers: BTreeMap<u64, SocketAddr>,
    /// Long-lived unidirectional streams per peer and direction (at least 2). Lane 0 carries
    /// heartbeats, votes and leader transfers; a group's replication stream always uses lane
    /// `1 + group_id % (lanes_per_peer - 1)`, which keeps it in order while a backlog on one lane
    /// does not block the groups of the others.
    pub lanes_per_peer: usize,
    /// A lane writer stops gathering queued messages into a frame at this many bytes.
    pub batch_bytes_max: usize,
    /// How a data lane's writer waits for more messages after the queue ran dry, before writing
    /// a frame that is not full, in microseconds. 0 writes at once. A value under 1,000 lets the
    /// tasks that are ready run once (one `yield_now`: the other groups' replication streams
    /// woken by the same event add their messages) and then writes: never a spin, which kept a
    /// worker busy for the whole linger of every frame. 1,000 or more sleeps that many
    /// microseconds (the timer's resolution is a millisecond).
    pub linger_us: u64,
    /// Linger of the control lane (heartbeats, votes and their answers), in microseconds: long
    /// enough to gather every heartbeat the node-wide driver releases at one tick into one frame.
    pub control_linger_us: u64,
    /// Messages queued per lane; a full lane makes senders wait (backpressure), bounded by the
    /// RPC's timeout.
    pub lane_queue_messages_max: usize,
    /// Largest frame body accepted or sent, in bytes. A longer length prefix closes the
    /// connection as a protocol error.
    pub frame_bytes_max: usize,
    /// AppendEntries requests a replication stream keeps in flight before waiting for the oldest
    /// response.
    pub stream_inflight_max: usize,
    /// How long a replication stream holds back an AppendEntries that only moves a follower's
    /// commit index, waiting for the group's next entry to carry it, in microseconds. 0 sends
    /// it at once. The leader's commits never wait for it; a follower learns of a commit (and
    /// applies it) this much later when no entry follows (later still if the stream already
    /// has `stream_inflight_max` requests in flight: the held one then waits for room). A held
    /// request that must leave before a newer one that starts elsewhere may take the stream
    /// one over `stream_inflight_max`.
    pub commit_linger_us: u64,
    /// Replication stream sessions one connection may hold open on the receiving side.
    pub stream_sessions_max: usize,
    /// Largest snapshot accepted from a peer, in bytes.
    pub snapshot_bytes_max: u64,
    /// Snapshot transfers received at once; more wait.
    pub snapshot_receives_max: usize,
    /// Snapshot bytes this node sends per second, all transfers together (replica moves,
    /// lagging followers); 0 = no limit. A transfer must still finish within the Raft
    /// timing's `snapshot_transfer_timeout_ms`. Default 0 (the server sets its own).
    pub snapshot_send_bytes_per_s: u64,
    /// Dial plus TLS handshake plus `Hello` exchange must finish within this, in milliseconds.
    pub connect_timeout_ms: u64,
    /// First reconnect delay after a failed dial, in milliseconds (doubles up to the max, with
    /// jitter).
    pub reconnect_backoff_min_ms: u64,
    /// Longest reconnect delay, in milliseconds.
    pub reconnect_backoff_max_ms: u64,
    /// The higher node id of a pair waits this long for the lower one to dial before dialling
    /// itself, in milliseconds (the pair then keeps the lower node's connection).
    pub higher_id_dial_grace_ms: u64,
    /// QUIC keep-alive interval, in milliseconds.
    pub keep_alive_ms: u64,
    /// A connection silent this long is closed, in milliseconds.
    pub idle_timeout_ms: u64,
    /// Seed of the transport's jitter source (reconnect backoff).
    pub seed: u64,
    /// Read and write snapshot files inline on the task instead of on tokio's blocking pool
    /// (a deterministic simulation: no thread of its own). Default false.
    pub inline_file_io: bool,
    /// QUIC limits every accepted connection starts with, before it proved to be a peer: a
    /// client's for good (see [`ClientQuicLimits`]).
    pub client_quic: ClientQuicLimits,
    /// Incoming handshakes (TLS, and the peer `Hello` or the hand-over to the client protocol)
    /// in progress at once at most; beyond, new connection attempts are refused. Default 256.
    pub handshakes_inflight_max: usize,
}

/// The QUIC limits of an accepted connection until it proved to be a cluster node (the peer
/// handshake, or a node certificate on a client-protocol connection): a client gets few
/// streams and small windows, so what it can make the node buffer stays small. A proven peer's
/// limits are raised to the peer grade ([`grant_peer_limits`](crate::grant_peer_limits)); the
/// per-stream window, fixed at the handshake, stays `stream_receive_window_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientQuicLimits {
    /// Bidirectional streams the remote may have open at once. Default 8.
    pub bidi_streams_max: u32,
    /// Unidirectional streams the remote may have open at once (the client protocol uses
    /// none). Default 0.
    pub uni_streams_max: u32,
    /// Bytes the remote may send on one stream ahead of the node's reading. Default 1 MiB.
    pub stream_receive_window_bytes: u32,
    /// Bytes the remote may send on all streams together ahead of the node's reading.
    /// Default 1 MiB.
    pub receive_window_bytes: u32,
    /// Bytes the node buffers unacknowledged towards the remote. Default 2 MiB.
    pub send_window_bytes: u64,
}

impl Default for ClientQuicLimits {
    fn default() -> Self {
        ClientQuicLimits {
            bidi_streams_max: 8,
            uni_streams_max: 0,
            stream_receive_window_bytes: 1 << 20,
            receive_window_bytes: 1 << 20,
            send_window_bytes: 2 << 20,
        }
    }
}

impl TransportConfig {
    /// Defaults for a node: 4 lanes, 256 KiB batches, a one-pass linger on data lanes (100), 32
    /// MiB frames.
    pub fn new(node_id: u64, listen_addr: SocketAddr, peers: BTreeMap<u64, SocketAddr>) -> Self {
        Self {
            node_id,
            cluster_name: "tenure".to_string(),
            listen_addr,
            peers,
            lanes_per_peer: 4,
            batch_bytes_max: 256 * 1024,
            linger_us: 100,
            control_linger_us: 2000,
            lane_queue_messages_max: 8192,
            frame_bytes_max: FRAME_BYTES_MAX_DEFAULT,
            stream_inflight_max: 8,
            commit_linger_us: 5_000,
            stream_sessions_max: 8192,
            snapshot_bytes_max: 8 * 1024 * 1024 * 1024,
            snapshot_receives_max: 4,
            snapshot_send_bytes_per_s: 0,
            connect_timeout_ms: 3000,
            reconnect_backoff_min_ms: 50,
            reconnect_backoff_max_ms: 2000,
            higher_id_dial_grace_ms: 300,
            keep_alive_ms: 1000,
            idle_timeout_ms: 10_000,
            seed: node_id,
            inline_file_io: false,
            client_quic: ClientQuicLimits::default(),
            handshakes_inflight_max: 256,
        }
    }

    pub(crate) fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }
}

/// Raft timing of every group on a node, fit for hundreds of groups.
///
/// Heartbeats are sent by one node-wide driver (see `HeartbeatDriver`) rather than by each
/// group's own timer, so every heartbeat due to one peer is queued at the same moment and leaves
/// in one frame. A follower that acknowledged an append within `heartbeat_min_interval_ms` gets no
/// heartbeat (openraft's suppression). Pre-vote is on, so a node that was cut off does not bump
/// terms when it comes back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupTiming {
    /// How often the node-wide driver asks every leader to heartbeat, in milliseconds.
    pub heartbeat_interval_ms: u64,
    /// No heartbeat to a follower that acknowledged an RPC sent this recently, in milliseconds.
    pub heartbeat_min_interval_ms: u64,
    /// Period of each group's openraft tick, which checks election timeouts and the leader lease,
    /// in milliseconds. Every group on the node pays one wake-up per tick, so with hundreds of
    /// groups this is the main idle cost; it also bounds how late an election starts.
    pub tick_interval_ms: u64,
    /// Lower bound of the randomized election timeout, in milliseconds.
    pub election_timeout_min_ms: u64,
    /// Upper bound of the randomized election timeout, in milliseconds.
    pub election_timeout_max_ms: u64,
    /// Entries per AppendEntries message at most.
    pub append_entries_max: u64,
    /// A snapshot must be sent and installed within this, in milliseconds.
    pub snapshot_transfer_timeout_ms: u64,
}

/// Defaults measured on a 2-core machine with 3 nodes x 256 groups (`transport_cluster`): a
/// heartbeat every 400 ms (at least 2.5 per minimum election timeout), a 150 ms tick (openraft's
/// own check requires `tick * 64 / 13 + heartbeat_min_interval + tick < election_timeout_min`),
/// elections after 1.0-1.5 s. Because openraft's followers refuse votes for `election_timeout_max`
/// after hearing from a leader (its leader lease), a failover can take up to about twice the
/// maximum election timeout; the server derives the lease contract's `ttl_ms_min` from that
/// (1.5 x 2 x 1500 ms = 4500 ms).
impl Default for GroupTiming {
    fn default() -> Self {
        Self {
            heartbeat_interval_ms: 400,
            heartbeat_min_interval_ms: 100,
            tick_interval_ms: 150,
            election_timeout_min_ms: 1000,
            election_timeout_max_ms: 1500,
            append_entries_max: 256,
            snapshot_transfer_timeout_ms: 60_000,
        }
    }
}

impl GroupTiming {
    /// The openraft configuration for one group with this timing.
    ///
    /// openraft's own heartbeat timer is off (the node-wide driver sends them). openraft derives
    /// its tick from its `heartbeat_interval` (tick = interval * 13 / 64), so that setting is
    /// chosen to give `tick_interval_ms`; it also serves as openraft's replication RPC timeout.
    ///
    /// Leader restore is off: a leader that restarts must win a new election. With it on
    /// (openraft's default) a leader that crashed before its own unsynced appends reached the
    /// disk came back leading the same term, without those entries, and appended different
    /// entries at the same (term, index) that followers already held: replicas diverged (found
    /// by the deterministic simulation, seed 11: a 5-node cluster, crashes alone).
    pub fn openraft_config(&self) -> Result<openraft::Config, openraft::ConfigError> {
        let openraft_heartbeat_ms = (self.tick_interval_ms.max(1) * 64).div_ceil(13);
        let config = openraft::Config {
            cluster_name: "tenure".to_string(),
            heartbeat_interval: openraft_heartbeat_ms,
            heartbeat_min_interval: Some(self.heartbeat_min_interval_ms),
            election_timeout_min: self.election_timeout_min_ms,
            election_timeout_max: self.election_timeout_max_ms,
            enable_heartbeat: false,
            enable_pre_vote: Some(true),
            max_payload_entries: self.append_entries_max,
            install_snapshot_timeout: self.snapshot_transfer_timeout_ms,
            enable_leader_restore: Some(false),
            ..Default::default()
        };
        config.validate()
    }
}
