//! openraft's network traits over the peer transport.
//!
//! A [`GroupNetworkFactory`] belongs to one group on one node and hands openraft a
//! [`PeerRaftClient`] per target node. Every client of every group shares the node's single
//! connection to that target.
//!
//! - Replication clients pipeline `stream_append`: up to `stream_inflight_max` AppendEntries in
//!   flight, answers yielded in request order (the receiver feeds them to `Raft::stream_append`
//!   in order and answers in order); the stream ends after the first error answer.
//! - A commit that rides on the next entry: openraft sends an entry-less AppendEntries as soon as
//!   a commit has no next entry to carry it. Such a request, at the log id this stream sent last,
//!   is held back for `commit_linger_us`. If the next request (which carries the same or a newer
//!   commit index) starts at that same log id, the held one is never sent: its answer is the
//!   next request's own success, yielded in its place once that arrives (a success at a later
//!   send time and a longer log says everything the held one's would). Otherwise it is sent when
//!   the linger ends or before anything else.
//! - Heartbeat clients send unary AppendEntries (one per heartbeat), so the node-wide driver's
//!   heartbeats to one peer leave in one frame.
//! - Votes, pre-votes and leader transfers are unary requests.
//! - Snapshots stream on their own QUIC stream, never in front of appends.
//!
//! Transport failures map onto openraft's errors by what openraft should do next: `Unreachable`
//! (back off), `Timeout`, or `Network` (retry).
//!
//! Must not depend on: group placement, RocksDB details (it only moves the snapshot file).

use std::collections::VecDeque;
use std::future::Future;
use std::io::{Seek, SeekFrom};
use std::sync::Arc;
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use openraft::OptionalSend;
use openraft::RaftNetworkV2;
use openraft::alias::{SnapshotOf, VoteOf};
use openraft::base::{BoxFuture, BoxStream};
use openraft::errors::{
    NetworkError, RPCError, ReplicationClosed, StreamingError, Timeout, Unreachable,
};
use openraft::impls::BasicNode;
use openraft::network::{RPCOption, RPCTypes, RaftNetworkFactory, stream_append_sequential};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, StreamAppendResult,
    TransferLeaderRequest, TransferLeaderResponse, VoteRequest, VoteResponse,
};
use serde::de::DeserializeOwned;
use tenure_proto::{Frame, MessageKind, decode_payload, encode_payload};
use tenure_storage::TenureRaft;
use tokio::io::AsyncWriteExt;
use tokio::time::Instant;

use crate::error::TransportError;
use crate::inbound::{
    SnapshotOffer, SnapshotReplyPayload, StreamAppendPayload, StreamAppendReplyPayload,
};
use crate::link::{
    CONTROL_FRAME_BYTES_MAX, FrameReadError, Outbound, PendingReply, Reply, Shared, read_frame,
    write_frame,
};
use crate::stats::add;
use crate::transport::Transport;

/// Creates openraft network clients for one group on this node.
#[derive(Debug, Clone)]
pub struct GroupNetworkFactory {
    transport: Transport,
    group_id: u32,
}

impl GroupNetworkFactory {
    /// The factory for `group_id` over `transport`.
    pub fn new(transport: Transport, group_id: u32) -> Self {
        Self {
            transport,
            group_id,
        }
    }

    fn client(&self, target: u64, purpose: Purpose) -> PeerRaftClient {
        PeerRaftClient {
            shared: self.transport.shared.clone(),
            group_id: self.group_id,
            target,
            purpose,
        }
    }
}

/// What openraft uses a client for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Purpose {
    Replication,
    Heartbeat,
    Snapshot,
}

/// openraft's view of one target node for one group.
pub struct PeerRaftClient {
    shared: Arc<Shared>,
    group_id: u32,
    target: u64,
    purpose: Purpose,
}

impl std::fmt::Debug for PeerRaftClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerRaftClient")
            .field("group_id", &self.group_id)
            .field("target", &self.target)
            .field("purpose", &self.purpose)
            .finish()
    }
}

impl RaftNetworkFactory<TenureRaft> for GroupNetworkFactory {
    type Network = PeerRaftClient;

    async fn new_client(&mut self, target: u64, _node: &BasicNode) -> PeerRaftClient {
        self.client(target, Purpose::Replication)
    }

    async fn new_heartbeat_client(&mut self, target: u64, _node: &BasicNode) -> PeerRaftClient {
        self.client(target, Purpose::Heartbeat)
    }

    async fn new_snapshot_client(&mut self, target: u64, _node: &BasicNode) -> PeerRaftClient {
        self.client(target, Purpose::Snapshot)
    }
}

fn rpc_error(
    error: TransportError,
    node: u64,
    target: u64,
    action: RPCTypes,
    timeout: Duration,
) -> RPCError<TenureRaft> {
    match error {
        TransportError::Timeout { .. } => RPCError::Timeout(Timeout {
            action,
            id: node,
            target,
            timeout,
        }),
        TransportError::Unreachable { .. }
        | TransportError::UnknownPeer(_)
        | TransportError::Remote { .. }
        | TransportError::Shutdown => RPCError::Unreachable(Unreachable::new(&error)),
        other => RPCError::Network(NetworkError::new(&other)),
    }
}

fn decode_reply<T: DeserializeOwned>(
    peer: u64,
    reply: Reply,
    expected: MessageKind,
    what: &'static str,
) -> Result<Result<T, String>, TransportError> {
    if reply.kind != expected {
        return Err(TransportError::Remote {
            peer,
            reason: format!("expected {expected:?}, got {:?}", reply.kind),
        });
    }
    Ok(decode_payload::<Result<T, String>>(&reply.payload, what)?)
}

impl PeerRaftClient {
    async fn unary<Req: serde::Serialize, Resp: DeserializeOwned>(
        &self,
        kind: MessageKind,
        request: &Req,
        reply_kind: MessageKind,
        action: RPCTypes,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<TenureRaft>> {
        let timeout = option.soft_ttl();
        let node = self.shared.node_id();
        let to_rpc = |error| rpc_error(error, node, self.target, action, timeout);
        let payload = encode_payload(request).map_err(|e| to_rpc(e.into()))?;
        let reply = self
            .shared
            .request(self.target, self.group_id, kind, payload, timeout)
            .await
            .map_err(to_rpc)?;
        match decode_reply::<Resp>(self.target, reply, reply_kind, "reply").map_err(to_rpc)? {
            Ok(response) => Ok(response),
            Err(remote) => Err(RPCError::Unreachable(Unreachable::from_string(format!(
                "node {} group {}: {remote}",
                self.target, self.group_id
            )))),
        }
    }
}

impl RaftNetworkV2<TenureRaft> for PeerRaftClient {
    type SnapshotData = std::fs::File;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TenureRaft>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TenureRaft>, RPCError<TenureRaft>> {
        if rpc.entries.is_empty() {
            add(&self.shared.stats.heartbeats_sent, 1);
        }
        self.unary(
            MessageKind::AppendRequest,
            &rpc,
            MessageKind::AppendResponse,
            RPCTypes::AppendEntries,
            &option,
        )
        .await
    }

    fn stream_append<'s, S>(
        &'s mut self,
        input: S,
        option: RPCOption,
    ) -> BoxFuture<
        's,
        Result<
            BoxStream<'s, Result<StreamAppendResult<TenureRaft>, RPCError<TenureRaft>>>,
            RPCError<TenureRaft>,
        >,
    >
    where
        S: Stream<Item = AppendEntriesRequest<TenureRaft>> + OptionalSend + Unpin + 'static,
    {
        if self.purpose != Purpose::Replication {
            return stream_append_sequential(self, input, option);
        }
        let pipeline = Pipeline {
            shared: self.shared.clone(),
            group_id: self.group_id,
            target: self.target,
            stream_id: self.shared.next_stream_id(),
            input: Box::pin(input),
            input_done: false,
            inflight: VecDeque::new(),
            inflight_max: self.shared.config.stream_inflight_max.max(1),
            timeout: option.soft_ttl(),
            finished: false,
            opened: false,
            last_sent: None,
            held: None,
            commit_linger: Duration::from_micros(self.shared.config.commit_linger_us),
            ready: VecDeque::new(),
        };
        Box::pin(async move {
            let stream = futures_util::stream::unfold(pipeline, |mut pipeline| async move {
                pipeline
                    .next_result()
                    .await
                    .map(|result| (result, pipeline))
            });
            let stream: BoxStream<'s, _> = Box::pin(stream);
            Ok(stream)
        })
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TenureRaft>,
        option: RPCOption,
    ) -> Result<VoteResponse<TenureRaft>, RPCError<TenureRaft>> {
        self.unary(
            MessageKind::VoteRequest,
            &rpc,
            MessageKind::VoteResponse,
            RPCTypes::Vote,
            &option,
        )
        .await
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TenureRaft>,
        option: RPCOption,
    ) -> Result<VoteResponse<TenureRaft>, RPCError<TenureRaft>> {
        self.unary(
            MessageKind::PreVoteRequest,
            &rpc,
            MessageKind::VoteResponse,
            RPCTypes::Vote,
            &option,
        )
        .await
    }

    async fn transfer_leader(
        &mut self,
        req: TransferLeaderRequest<TenureRaft>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<TenureRaft>, RPCError<TenureRaft>> {
        self.unary(
            MessageKind::TransferLeaderRequest,
            &req,
            MessageKind::TransferLeaderResponse,
            RPCTypes::TransferLeader,
            &option,
        )
        .await
    }

    async fn full_snapshot(
        &mut self,
        vote: VoteOf<TenureRaft>,
        snapshot: SnapshotOf<TenureRaft, std::fs::File>,
        cancel: impl Future<Output = ReplicationClosed> + OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TenureRaft>, StreamingError<TenureRaft>> {
        // Raft's transfer timeout, plus the time the snapshot takes at this node's snapshot rate
        // shared with the other transfers under way (a paced transfer of a large snapshot
        // would otherwise time out, and start again from the first byte, for ever).
        let size_bytes = snapshot.snapshot.metadata().map_or(0, |meta| meta.len());
        let _counted = self.shared.snapshot_pacer.transfer();
        let timeout = option.soft_ttl() + self.shared.snapshot_pacer.transfer_time(size_bytes);
        let transfer = send_snapshot(&self.shared, self.target, self.group_id, vote, snapshot);
        tokio::select! {
            closed = cancel => Err(StreamingError::Closed(closed)),
            result = tokio::time::timeout(timeout, transfer) => match result {
                Ok(Ok(response)) => {
                    add(&self.shared.stats.snapshots_sent, 1);
                    Ok(response)
                }
                Ok(Err(error)) => Err(match error {
                    TransportError::Unreachable { .. } | TransportError::UnknownPeer(_) | TransportError::Shutdown =>
                        StreamingError::Unreachable(Unreachable::new(&error)),
                    other => StreamingError::Network(NetworkError::new(&other)),
                }),
                Err(_) => Err(StreamingError::Timeout(Timeout {
                    action: RPCTypes::InstallSnapshot,
                    id: self.shared.node_id(),
                    target: self.target,
                    timeout,
                })),
            },
        }
    }
}

/// Bytes of a snapshot file read, paced and sent at a time.
const SNAPSHOT_CHUNK_BYTES: usize = 64 * 1024;

async fn send_snapshot(
    shared: &Arc<Shared>,
    target: u64,
    group_id: u32,
    vote: VoteOf<TenureRaft>,
    snapshot: SnapshotOf<TenureRaft, std::fs::File>,
) -> Result<SnapshotResponse<TenureRaft>, TransportError> {
    let link = shared.link(target)?;
    let unreachable = |reason: &str| TransportError::Unreachable {
        peer: target,
        reason: reason.to_string(),
    };
    if !shared.stream_allowed(target) {
        return Err(unreachable("link cut by the fault layer"));
    }
    let connection = link
        .current_connection()
        .ok_or_else(|| unreachable("not connected"))?;
    let mut file = snapshot.snapshot;
    let rewind = move || {
        file.seek(SeekFrom::Start(0))?;
        let size = file.metadata()?.len();
        Ok::<_, std::io::Error>((file, size))
    };
    let size_bytes = if shared.config.inline_file_io {
        rewind()
    } else {
        tokio::task::spawn_blocking(rewind).await.map_err(|e| {
            TransportError::io("reading the snapshot file", std::io::Error::other(e))
        })?
    }
    .map_err(|e| TransportError::io("reading the snapshot file", e));
    let (file, size_bytes) = size_bytes?;
    let (mut send, mut recv) = connection
        .open_bi()
        .await
        .map_err(|e| unreachable(&e.to_string()))?;
    let offer = SnapshotOffer {
        group_id,
        vote,
        meta: snapshot.meta,
        size_bytes,
    };
    let lost = |e: &dyn std::fmt::Display| TransportError::Unreachable {
        peer: target,
        reason: format!("snapshot stream failed: {e}"),
    };
    write_frame(&mut send, &Frame::SnapshotOffer(encode_payload(&offer)?))
        .await
        .map_err(|e| lost(&e))?;
    // Chunk by chunk, each paced by the node's snapshot rate.
    let mut chunk = vec![0u8; SNAPSHOT_CHUNK_BYTES];
    if shared.config.inline_file_io {
        let mut file = file;
        loop {
            let read = std::io::Read::read(&mut file, &mut chunk).map_err(|e| lost(&e))?;
            if read == 0 {
                break;
            }
            shared.snapshot_pacer.take(read).await;
            send.write_all(&chunk[..read]).await.map_err(|e| lost(&e))?;
        }
    } else {
        let mut file = tokio::fs::File::from_std(file);
        loop {
            let read = tokio::io::AsyncReadExt::read(&mut file, &mut chunk)
                .await
                .map_err(|e| lost(&e))?;
            if read == 0 {
                break;
            }
            shared.snapshot_pacer.take(read).await;
            send.write_all(&chunk[..read]).await.map_err(|e| lost(&e))?;
        }
    }
    send.flush().await.map_err(|e| lost(&e))?;
    send.finish().map_err(|e| lost(&e))?;
    let reply = match read_frame(&mut recv, CONTROL_FRAME_BYTES_MAX).await {
        Ok(Some(Frame::SnapshotReply(payload))) => payload,
        Ok(_) => return Err(lost(&"no snapshot reply")),
        Err(FrameReadError::Protocol(reason) | FrameReadError::Stream(reason)) => {
            return Err(lost(&reason));
        }
    };
    match decode_payload::<SnapshotReplyPayload>(&reply, "SnapshotReply")? {
        Ok(response) => Ok(response),
        Err(reason) => Err(TransportError::Remote {
            peer: target,
            reason,
        }),
    }
}

type RequestStream =
    std::pin::Pin<Box<dyn Stream<Item = AppendEntriesRequest<TenureRaft>> + Send + 'static>>;

type LogIdOfRaft = openraft::alias::LogIdOf<TenureRaft>;
type StreamItem = Result<StreamAppendResult<TenureRaft>, RPCError<TenureRaft>>;

/// The sending side of one pipelined replication stream.
struct Pipeline {
    shared: Arc<Shared>,
    group_id: u32,
    target: u64,
    stream_id: u64,
    input: RequestStream,
    input_done: bool,
    inflight: VecDeque<Inflight>,
    inflight_max: usize,
    timeout: Duration,
    finished: bool,
    opened: bool,
    /// The log id the last request sent ends at: its last entry's, else its `prev_log_id`.
    /// `None` before the first request. (A held request ends where the last sent one did.)
    last_sent: Option<Option<LogIdOfRaft>>,
    /// An entry-less request held back to ride on the next one (see the module doc).
    held: Option<HeldCommit>,
    /// How long `held` waits for a request to ride on; zero sends it at once.
    commit_linger: Duration,
    /// Answers ready to yield, in request order, before any other.
    ready: VecDeque<StreamItem>,
}

/// One request sent and awaiting its answer.
struct Inflight {
    pending: PendingReply,
    deadline: Instant,
    /// Entry-less requests that were never sent because this one carried their commit; they
    /// came before it, at its `prev_log_id`, and are answered first, with its success.
    absorbed: Absorbed,
}

/// Entry-less requests answered by a later request's success.
#[derive(Default)]
struct Absorbed {
    count: usize,
    /// Their (shared) `prev_log_id`, the success each of them is answered with.
    at: Option<LogIdOfRaft>,
}

/// An entry-less request held back, and the earlier ones it replaced.
struct HeldCommit {
    request: AppendEntriesRequest<TenureRaft>,
    send_at: Instant,
    absorbed: Absorbed,
}

enum Step {
    Input(Option<AppendEntriesRequest<TenureRaft>>),
    Answer(
        Result<Result<Reply, tokio::sync::oneshot::error::RecvError>, tokio::time::error::Elapsed>,
    ),
    LingerOver,
}

impl Pipeline {
    fn error(&self, error: TransportError) -> RPCError<TenureRaft> {
        rpc_error(
            error,
            self.shared.node_id(),
            self.target,
            RPCTypes::AppendEntries,
            self.timeout,
        )
    }

    async fn next_result(&mut self) -> Option<StreamItem> {
        loop {
            if let Some(item) = self.ready.pop_front() {
                return Some(item);
            }
            if self.finished {
                return None;
            }
            if self.input_done
                && self.inflight.len() < self.inflight_max
                && let Some(held) = self.held.take()
            {
                // openraft sends nothing more on this stream: nothing can carry the held commit
                // (with no room it waits below for the oldest answer, like any request).
                if let Err(error) = self.send(held.request, held.absorbed).await {
                    self.finished = true;
                    return Some(Err(self.error(error)));
                }
                continue;
            }
            let has_room = self.inflight.len() < self.inflight_max;
            let can_send = !self.input_done && has_room;
            if self.inflight.is_empty() && !can_send {
                return None;
            }
            let linger_over_at = self.held.as_ref().map(|held| held.send_at);
            let step = {
                let input = &mut self.input;
                // The held request leaves when its linger is over, once there is room for it.
                let linger = async move {
                    match linger_over_at {
                        Some(at) if has_room => tokio::time::sleep_until(at).await,
                        _ => std::future::pending::<()>().await,
                    }
                };
                match self.inflight.front_mut() {
                    Some(front) => {
                        let answer =
                            tokio::time::timeout_at(front.deadline, front.pending.receiver());
                        tokio::select! {
                            biased;
                            request = input.next(), if can_send => Step::Input(request),
                            answer = answer => Step::Answer(answer),
                            () = linger => Step::LingerOver,
                        }
                    }
                    None => tokio::select! {
                        biased;
                        request = input.next(), if can_send => Step::Input(request),
                        () = linger => Step::LingerOver,
                    },
                }
            };
            match step {
                Step::Input(None) => self.input_done = true,
                Step::Input(Some(request)) => {
                    if let Err(error) = self.accept(request).await {
                        self.finished = true;
                        return Some(Err(self.error(error)));
                    }
                }
                Step::LingerOver => {
                    if let Some(held) = self.held.take()
                        && let Err(error) = self.send(held.request, held.absorbed).await
                    {
                        self.finished = true;
                        return Some(Err(self.error(error)));
                    }
                }
                Step::Answer(answer) => {
                    let Some(front) = self.inflight.pop_front() else {
                        continue;
                    };
                    let peer = front.pending.peer();
                    let result = match answer {
                        Ok(received) => crate::link::answer(peer, received)
                            .and_then(|reply| {
                                decode_reply::<StreamAppendResult<TenureRaft>>(
                                    peer,
                                    reply,
                                    MessageKind::StreamAppendResponse,
                                    "StreamAppendResponse",
                                )
                            })
                            .and_then(|inner: StreamAppendReplyPayload| {
                                inner.map_err(|reason| TransportError::Remote { peer, reason })
                            }),
                        Err(_) => Err(TransportError::Timeout {
                            peer,
                            timeout_ms: 0,
                        }),
                    };
                    match result {
                        Ok(Ok(matching)) => {
                            // The requests it carried the commit of come first; each is
                            // answered by this success: the follower matched their log id
                            // (this request's `prev_log_id`) when it received this request,
                            // after they would have been sent.
                            for _ in 0..front.absorbed.count {
                                self.ready.push_back(Ok(Ok(front.absorbed.at)));
                            }
                            self.ready.push_back(Ok(Ok(matching)));
                        }
                        // A refusal (conflict at, or a higher vote than, the `prev_log_id` they
                        // share) or a failure answers the first of them and ends the stream.
                        Ok(Err(refusal)) => {
                            self.finished = true;
                            self.ready.push_back(Ok(Err(refusal)));
                        }
                        Err(error) => {
                            self.finished = true;
                            let error = self.error(error);
                            self.ready.push_back(Err(error));
                        }
                    }
                }
            }
        }
    }

    /// Takes the next request from openraft: holds an entry-less one back, lets a held one ride
    /// on it when it starts at the same log id, or sends it.
    async fn accept(
        &mut self,
        request: AppendEntriesRequest<TenureRaft>,
    ) -> Result<(), TransportError> {
        let mut absorbed = Absorbed::default();
        let mut send_at = None;
        if let Some(held) = self.held.take() {
            if held.request.prev_log_id == request.prev_log_id {
                // This request carries the held one's commit index or a newer one (openraft's
                // commit index only grows within a leader's term, and a stream is one term's).
                absorbed = held.absorbed;
                absorbed.count += 1;
                absorbed.at = held.request.prev_log_id;
                send_at = Some(held.send_at);
            } else {
                self.send(held.request, held.absorbed).await?;
            }
        }
        let ends_where_the_last_one_did = self.last_sent.as_ref() == Some(&request.prev_log_id);
        if request.entries.is_empty()
            && ends_where_the_last_one_did
            && !self.commit_linger.is_zero()
        {
            // An entry-less request at the log id sent last only moves the follower's commit
            // index: hold it for the next one to carry (no longer than the first one held
            // would have waited).
            let send_at = send_at.unwrap_or_else(|| Instant::now() + self.commit_linger);
            self.held = Some(HeldCommit {
                request,
                send_at,
                absorbed,
            });
            return Ok(());
        }
        self.send(request, absorbed).await
    }

    async fn send(
        &mut self,
        request: AppendEntriesRequest<TenureRaft>,
        absorbed: Absorbed,
    ) -> Result<(), TransportError> {
        add(&self.shared.stats.append_requests_sent, 1);
        add(
            &self.shared.stats.append_requests_carried,
            absorbed.count as u64,
        );
        add(
            &self.shared.stats.append_entries_sent,
            request.entries.len() as u64,
        );
        if request.entries.is_empty() {
            add(&self.shared.stats.append_requests_without_entries_sent, 1);
        }
        let ends_at = match request.entries.last() {
            Some(entry) => Some(entry.log_id),
            None => request.prev_log_id,
        };
        let payload: StreamAppendPayload = (self.stream_id, request);
        let encoded = encode_payload(&payload)?;
        let deadline = Instant::now() + self.timeout;
        let pending = self
            .shared
            .start_request(
                self.target,
                self.group_id,
                MessageKind::StreamAppendRequest,
                encoded,
                deadline,
            )
            .await?;
        self.opened = true;
        self.last_sent = Some(ends_at);
        self.inflight.push_back(Inflight {
            pending,
            deadline,
            absorbed,
        });
        Ok(())
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        if !self.opened {
            return;
        }
        // Best effort: let the receiver drop its session now rather than with the connection.
        if let (Ok(link), Ok(payload)) = (
            self.shared.link(self.target),
            encode_payload(&self.stream_id),
        ) {
            let _ = link
                .lane_of(self.group_id, MessageKind::StreamClose)
                .try_send(Outbound {
                    group_id: self.group_id,
                    kind: MessageKind::StreamClose,
                    correlation_id: 0,
                    payload,
                });
        }
    }
}
