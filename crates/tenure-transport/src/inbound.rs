//! The receiving side of a peer connection: lane readers, request dispatch to local groups,
//! replication stream sessions, and snapshot reception.
//!
//! Each lane the peer opens gets a reader task. A frame that does not decode, or a length over
//! the maximum, closes the connection as a protocol error (logged with the reason; every other
//! peer and group keeps working). A well-framed message that cannot be served (unknown group,
//! undecodable payload) is answered with a `Failure` message and the connection stays up.
//!
//! Replication streams: the first `StreamAppendRequest` of a stream id opens a session that feeds
//! the group's `Raft::stream_append` in order and answers each request, in order, under its
//! correlation id. A group's messages always travel on one lane, so one reader sees a session's
//! requests in the order they were sent.
//!
//! Must not depend on: how groups are created or placed (it asks the `GroupRegistry`).

use std::collections::BTreeMap;
use std::io::{Seek, SeekFrom};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use openraft::alias::{SnapshotMetaOf, SnapshotOf, VoteOf};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, StreamAppendResult,
    TransferLeaderRequest, TransferLeaderResponse, VoteRequest, VoteResponse,
};
use serde::{Deserialize, Serialize};
use tenure_proto::{BatchMessage, Frame, MessageKind, decode_payload, encode_payload};
use tenure_storage::TenureRaft;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::link::{
    CONTROL_FRAME_BYTES_MAX, FrameReadError, Outbound, PeerLink, Shared, read_frame, write_frame,
};
use crate::registry::GroupRaft;
use crate::stats::add;

/// Payload of a `StreamAppendRequest`: the stream id and one request.
pub(crate) type StreamAppendPayload = (u64, AppendEntriesRequest<TenureRaft>);
/// Payload of an `AppendResponse`.
pub(crate) type AppendReplyPayload = Result<AppendEntriesResponse<TenureRaft>, String>;
/// Payload of a `StreamAppendResponse`.
pub(crate) type StreamAppendReplyPayload = Result<StreamAppendResult<TenureRaft>, String>;
/// Payload of a `VoteResponse`.
pub(crate) type VoteReplyPayload = Result<VoteResponse<TenureRaft>, String>;
/// Payload of a `TransferLeaderResponse`.
pub(crate) type TransferLeaderReplyPayload = Result<TransferLeaderResponse<TenureRaft>, String>;
/// Payload of a `SnapshotReply`.
pub(crate) type SnapshotReplyPayload = Result<SnapshotResponse<TenureRaft>, String>;

/// Header of a snapshot transfer: the bytes of the snapshot file follow it on the stream.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct SnapshotOffer {
    pub(crate) group_id: u32,
    pub(crate) vote: VoteOf<TenureRaft>,
    pub(crate) meta: SnapshotMetaOf<TenureRaft>,
    pub(crate) size_bytes: u64,
}

/// How long a response may wait for lane space before it is dropped (the requester times out).
const RESPONSE_QUEUE_WAIT: Duration = Duration::from_secs(1);

pub(crate) async fn accept_streams(
    shared: Arc<Shared>,
    link: Arc<PeerLink>,
    connection: quinn::Connection,
) {
    loop {
        tokio::select! {
            lane = connection.accept_uni() => match lane {
                Ok(recv) => {
                    tokio::spawn(read_lane(shared.clone(), link.clone(), connection.clone(), recv));
                }
                Err(_) => return,
            },
            stream = connection.accept_bi() => match stream {
                Ok((send, recv)) => {
                    tokio::spawn(receive_snapshot(shared.clone(), link.clone(), connection.clone(), send, recv));
                }
                Err(_) => return,
            },
        }
    }
}

struct StreamSession {
    correlations: mpsc::Sender<u64>,
    requests: mpsc::Sender<AppendEntriesRequest<TenureRaft>>,
}

async fn read_lane(
    shared: Arc<Shared>,
    link: Arc<PeerLink>,
    connection: quinn::Connection,
    mut recv: quinn::RecvStream,
) {
    let mut sessions: BTreeMap<(u32, u64), StreamSession> = BTreeMap::new();
    loop {
        let frame = match read_frame(&mut recv, shared.config.frame_bytes_max).await {
            Ok(Some(frame)) => frame,
            Ok(None) => return,
            Err(FrameReadError::Protocol(reason)) => {
                shared.protocol_error(&connection, link.peer, &reason);
                return;
            }
            Err(FrameReadError::Stream(reason)) => {
                debug!(
                    node = shared.node_id(),
                    peer = link.peer,
                    "lane ended: {reason}"
                );
                return;
            }
        };
        let Frame::Batch(messages) = frame else {
            shared.protocol_error(&connection, link.peer, "a lane carried a non-batch frame");
            return;
        };
        add(&shared.stats.frames_received, 1);
        add(&shared.stats.messages_received, messages.len() as u64);
        for message in messages {
            dispatch(&shared, &link, &mut sessions, message);
        }
    }
}

fn dispatch(
    shared: &Arc<Shared>,
    link: &Arc<PeerLink>,
    sessions: &mut BTreeMap<(u32, u64), StreamSession>,
    message: BatchMessage,
) {
    if message.kind.is_response() {
        match link.pending.remove(&message.correlation_id) {
            Some((_, waiter)) => {
                let _ = waiter.send(crate::link::Reply {
                    kind: message.kind,
                    payload: message.payload,
                });
            }
            None => add(&shared.stats.orphan_responses, 1),
        }
        return;
    }
    match message.kind {
        MessageKind::StreamAppendRequest => stream_append(shared, link, sessions, message),
        MessageKind::StreamClose => {
            if let Ok(stream_id) = decode_payload::<u64>(&message.payload, "stream id") {
                sessions.remove(&(message.group_id, stream_id));
            }
        }
        _ => {
            let Some(raft) = find_group(shared, link, &message) else {
                return;
            };
            let shared = shared.clone();
            let link = link.clone();
            tokio::spawn(async move {
                let group_id = message.group_id;
                let correlation_id = message.correlation_id;
                let (kind, payload) = match serve_unary(&raft, message).await {
                    Ok(reply) => reply,
                    Err(reason) => {
                        warn!(
                            node = shared.node_id(),
                            peer = link.peer,
                            group_id,
                            "rejected a message: {reason}"
                        );
                        failure_payload(&reason)
                    }
                };
                respond(&shared, &link, group_id, kind, correlation_id, payload).await;
            });
        }
    }
}

fn find_group(
    shared: &Arc<Shared>,
    link: &Arc<PeerLink>,
    message: &BatchMessage,
) -> Option<GroupRaft> {
    let raft = shared.registry.group(message.group_id);
    if raft.is_none() {
        add(&shared.stats.unknown_group_requests, 1);
        debug!(
            node = shared.node_id(),
            peer = link.peer,
            group_id = message.group_id,
            "request for a group this node does not host"
        );
        answer_failure(
            shared,
            link,
            message,
            &format!(
                "group {} is not hosted on node {}",
                message.group_id,
                shared.node_id()
            ),
        );
    }
    raft
}

fn failure_payload(reason: &str) -> (MessageKind, Bytes) {
    (
        MessageKind::Failure,
        encode_payload(&reason.to_string()).unwrap_or_default(),
    )
}

fn answer_failure(
    shared: &Arc<Shared>,
    link: &Arc<PeerLink>,
    message: &BatchMessage,
    reason: &str,
) {
    let (kind, payload) = failure_payload(reason);
    let shared = shared.clone();
    let link = link.clone();
    let group_id = message.group_id;
    let correlation_id = message.correlation_id;
    tokio::spawn(async move {
        respond(&shared, &link, group_id, kind, correlation_id, payload).await;
    });
}

async fn respond(
    shared: &Shared,
    link: &Arc<PeerLink>,
    group_id: u32,
    kind: MessageKind,
    correlation_id: u64,
    payload: Bytes,
) {
    let message = Outbound {
        group_id,
        kind,
        correlation_id,
        payload,
    };
    if let Err(error) = shared
        .send(link, message, Instant::now() + RESPONSE_QUEUE_WAIT)
        .await
    {
        debug!(
            node = shared.node_id(),
            peer = link.peer,
            "response dropped: {error}"
        );
    }
}

fn encoded<T: Serialize>(kind: MessageKind, value: &T) -> Result<(MessageKind, Bytes), String> {
    encode_payload(value)
        .map(|payload| (kind, payload))
        .map_err(|error| error.to_string())
}

async fn serve_unary(
    raft: &GroupRaft,
    message: BatchMessage,
) -> Result<(MessageKind, Bytes), String> {
    let payload = &message.payload;
    match message.kind {
        MessageKind::AppendRequest => {
            let request: AppendEntriesRequest<TenureRaft> =
                decode_payload(payload, "AppendEntries").map_err(|e| e.to_string())?;
            let reply: AppendReplyPayload = raft
                .append_entries(request)
                .await
                .map_err(|e| e.to_string());
            encoded(MessageKind::AppendResponse, &reply)
        }
        MessageKind::VoteRequest | MessageKind::PreVoteRequest => {
            let request: VoteRequest<TenureRaft> =
                decode_payload(payload, "Vote").map_err(|e| e.to_string())?;
            let reply: VoteReplyPayload = if message.kind == MessageKind::VoteRequest {
                raft.vote(request).await
            } else {
                raft.pre_vote(request).await
            }
            .map_err(|e| e.to_string());
            encoded(MessageKind::VoteResponse, &reply)
        }
        MessageKind::TransferLeaderRequest => {
            let request: TransferLeaderRequest<TenureRaft> =
                decode_payload(payload, "TransferLeader").map_err(|e| e.to_string())?;
            let reply: TransferLeaderReplyPayload = raft
                .handle_transfer_leader(request)
                .await
                .map_err(|e| e.to_string());
            encoded(MessageKind::TransferLeaderResponse, &reply)
        }
        other => Err(format!("{other:?} is not a request this node serves")),
    }
}

fn stream_append(
    shared: &Arc<Shared>,
    link: &Arc<PeerLink>,
    sessions: &mut BTreeMap<(u32, u64), StreamSession>,
    message: BatchMessage,
) {
    let (stream_id, request) =
        match decode_payload::<StreamAppendPayload>(&message.payload, "StreamAppend") {
            Ok(decoded) => decoded,
            Err(error) => {
                warn!(
                    node = shared.node_id(),
                    peer = link.peer,
                    group_id = message.group_id,
                    "rejected a message: {error}"
                );
                answer_failure(shared, link, &message, &error.to_string());
                return;
            }
        };
    let key = (message.group_id, stream_id);
    if !sessions.contains_key(&key) {
        if sessions.len() >= shared.config.stream_sessions_max {
            answer_failure(
                shared,
                link,
                &message,
                "too many replication streams on this connection",
            );
            return;
        }
        let Some(raft) = find_group(shared, link, &message) else {
            return;
        };
        sessions.insert(key, open_session(shared, link, message.group_id, raft));
    }
    let accepted = sessions.get(&key).is_some_and(|session| {
        session
            .correlations
            .try_send(message.correlation_id)
            .is_ok()
            && session.requests.try_send(request).is_ok()
    });
    if !accepted {
        // The session ended (its group answered an error) or the sender exceeded its window.
        sessions.remove(&key);
        answer_failure(shared, link, &message, "replication stream closed");
    }
}

fn open_session(
    shared: &Arc<Shared>,
    link: &Arc<PeerLink>,
    group_id: u32,
    raft: GroupRaft,
) -> StreamSession {
    let depth = shared.config.stream_inflight_max.max(1) * 2;
    let (correlations, mut correlation_receiver) = mpsc::channel::<u64>(depth);
    let (requests, request_receiver) = mpsc::channel(depth);
    let shared = shared.clone();
    let link = link.clone();
    tokio::spawn(async move {
        let input = futures_util::stream::unfold(request_receiver, |mut receiver| async move {
            receiver.recv().await.map(|request| (request, receiver))
        });
        let output = raft.stream_append(input);
        futures_util::pin_mut!(output);
        while let Some(result) = output.next().await {
            let Some(correlation_id) = correlation_receiver.recv().await else {
                break;
            };
            let reply: StreamAppendReplyPayload = result.map_err(|fatal| fatal.to_string());
            let ended = !matches!(reply, Ok(Ok(_)));
            let (kind, payload) = encoded(MessageKind::StreamAppendResponse, &reply)
                .unwrap_or_else(|reason| failure_payload(&reason));
            respond(&shared, &link, group_id, kind, correlation_id, payload).await;
            if ended {
                break;
            }
        }
        // Requests the stream will never answer get a failure instead of a timeout.
        correlation_receiver.close();
        while let Some(correlation_id) = correlation_receiver.recv().await {
            let (kind, payload) = failure_payload("replication stream ended");
            respond(&shared, &link, group_id, kind, correlation_id, payload).await;
        }
    });
    StreamSession {
        correlations,
        requests,
    }
}

async fn receive_snapshot(
    shared: Arc<Shared>,
    link: Arc<PeerLink>,
    connection: quinn::Connection,
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
) {
    let Ok(_permit) = shared.snapshot_permits.acquire().await else {
        return;
    };
    let reply: SnapshotReplyPayload =
        match receive_and_install(&shared, &link, &connection, &mut recv).await {
            Ok(response) => {
                add(&shared.stats.snapshots_received, 1);
                Ok(response)
            }
            Err(reason) => {
                warn!(
                    node = shared.node_id(),
                    peer = link.peer,
                    "snapshot refused: {reason}"
                );
                Err(reason)
            }
        };
    if let Ok(payload) = encode_payload(&reply) {
        if write_frame(&mut send, &Frame::SnapshotReply(payload))
            .await
            .is_ok()
        {
            let _ = send.finish();
            let _ = tokio::time::timeout(Duration::from_secs(5), send.stopped()).await;
        }
    }
}

async fn receive_and_install(
    shared: &Arc<Shared>,
    link: &Arc<PeerLink>,
    connection: &quinn::Connection,
    recv: &mut quinn::RecvStream,
) -> Result<SnapshotResponse<TenureRaft>, String> {
    let offer = match read_frame(recv, CONTROL_FRAME_BYTES_MAX).await {
        Ok(Some(Frame::SnapshotOffer(payload))) => {
            decode_payload::<SnapshotOffer>(&payload, "SnapshotOffer").map_err(|e| e.to_string())?
        }
        Ok(_) => {
            shared.protocol_error(
                connection,
                link.peer,
                "a stream did not start with a snapshot offer",
            );
            return Err("not a snapshot offer".into());
        }
        Err(FrameReadError::Protocol(reason)) => {
            shared.protocol_error(connection, link.peer, &reason);
            return Err(reason);
        }
        Err(FrameReadError::Stream(reason)) => return Err(reason),
    };
    if offer.size_bytes > shared.config.snapshot_bytes_max {
        return Err(format!(
            "snapshot of {} bytes exceeds the maximum of {} bytes",
            offer.size_bytes, shared.config.snapshot_bytes_max
        ));
    }
    let Some(raft) = shared.registry.group(offer.group_id) else {
        add(&shared.stats.unknown_group_requests, 1);
        return Err(format!(
            "group {} is not hosted on node {}",
            offer.group_id,
            shared.node_id()
        ));
    };
    let spool_dir = shared.registry.snapshot_spool_dir().to_path_buf();
    let mut limited = tokio::io::AsyncReadExt::take(&mut *recv, offer.size_bytes);
    let (copied, mut file) = if shared.config.inline_file_io {
        // A simulation's: no blocking pool, the file is written as the bytes arrive.
        let mut file = tempfile::tempfile_in(spool_dir)
            .map_err(|e| format!("cannot create a snapshot spool file: {e}"))?;
        let mut chunk = vec![0u8; 64 * 1024];
        let mut copied = 0u64;
        loop {
            let read = tokio::io::AsyncReadExt::read(&mut limited, &mut chunk)
                .await
                .map_err(|e| format!("snapshot transfer failed: {e}"))?;
            if read == 0 {
                break;
            }
            std::io::Write::write_all(&mut file, &chunk[..read])
                .map_err(|e| format!("writing the snapshot spool file: {e}"))?;
            copied += read as u64;
        }
        (copied, file)
    } else {
        let spool = tokio::task::spawn_blocking(move || tempfile::tempfile_in(spool_dir))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("cannot create a snapshot spool file: {e}"))?;
        let mut file = tokio::fs::File::from_std(spool);
        let copied = tokio::io::copy(&mut limited, &mut file)
            .await
            .map_err(|e| format!("snapshot transfer failed: {e}"))?;
        file.flush().await.map_err(|e| e.to_string())?;
        (copied, file.into_std().await)
    };
    if copied != offer.size_bytes {
        return Err(format!(
            "snapshot truncated: {copied} of {} bytes",
            offer.size_bytes
        ));
    }
    file.seek(SeekFrom::Start(0))
        .map_err(|e| format!("cannot rewind the snapshot spool file: {e}"))?;
    let snapshot = SnapshotOf::<TenureRaft, std::fs::File> {
        meta: offer.meta,
        snapshot: file,
    };
    raft.install_full_snapshot(offer.vote, snapshot)
        .await
        .map_err(|fatal| fatal.to_string())
}

#[cfg(test)]
mod tests {
    //! The payload types of this module read the golden files that pin their bytes
    //! (`crates/tenure-storage/tests/golden/rpc/`, written from the same shapes by tenure-storage's
    //! golden test, where the Raft types live): a change of a type here that the goldens do not
    //! follow fails.
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn golden(name: &str) -> Vec<u8> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tenure-storage/tests/golden/rpc")
            .join(format!("{name}.hex"));
        tenure_golden::read_hex_file(&path).unwrap()
    }

    /// Decodes golden `name` as `T` and checks that encoding it again gives the same bytes.
    fn reads_back<T: Serialize + serde::de::DeserializeOwned + std::fmt::Debug>(name: &str) -> T {
        let bytes = golden(name);
        let value: T = decode_payload(&bytes, "golden").unwrap_or_else(|error| {
            panic!("golden {name} does not decode as this module's payload type: {error}")
        });
        assert_eq!(
            encode_payload(&value).unwrap().as_ref(),
            bytes.as_slice(),
            "golden {name}: re-encoding {value:?} changed the bytes"
        );
        value
    }

    #[test]
    fn payload_types_read_their_golden_files() {
        let offer: SnapshotOffer = reads_back("rpc_snapshot_offer");
        assert_eq!(offer.group_id, 7);
        assert_eq!(offer.size_bytes, 4_096);
        let (stream_id, request): StreamAppendPayload = reads_back("rpc_stream_append_request");
        assert_eq!(stream_id, 11);
        assert_eq!(request.entries.len(), 2);
        for name in [
            "rpc_stream_append_matched",
            "rpc_stream_append_matched_none",
            "rpc_stream_append_conflict",
            "rpc_stream_append_higher_vote",
            "rpc_stream_append_failure",
        ] {
            let _: StreamAppendReplyPayload = reads_back(name);
        }
        assert_eq!(reads_back::<u64>("rpc_stream_close"), 11);
        let transfer: TransferLeaderRequest<TenureRaft> = reads_back("rpc_transfer_leader_request");
        assert_eq!(*transfer.to_node_id(), 3);
        for name in [
            "rpc_transfer_leader_accepted",
            "rpc_transfer_leader_vote_changed",
            "rpc_transfer_leader_log_not_flushed",
        ] {
            let _: TransferLeaderReplyPayload = reads_back(name);
        }
        assert!(reads_back::<SnapshotReplyPayload>("rpc_snapshot_reply").is_ok());
        assert!(reads_back::<SnapshotReplyPayload>("rpc_snapshot_reply_refused").is_err());
        reads_back::<AppendEntriesRequest<TenureRaft>>("rpc_append_entries_request");
        reads_back::<AppendEntriesRequest<TenureRaft>>("rpc_append_entries_heartbeat");
        for name in [
            "rpc_append_entries_success",
            "rpc_append_entries_partial",
            "rpc_append_entries_conflict",
            "rpc_append_entries_higher_vote",
            "rpc_append_entries_failure",
        ] {
            let _: AppendReplyPayload = reads_back(name);
        }
        reads_back::<VoteRequest<TenureRaft>>("rpc_vote_request");
        let vote: VoteReplyPayload = reads_back("rpc_vote_response");
        assert!(vote.is_ok_and(|vote| vote.vote_granted));
        assert_eq!(reads_back::<String>("rpc_failure"), "unknown group 9");
    }
}
