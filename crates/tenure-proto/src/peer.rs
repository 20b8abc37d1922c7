//! The peer protocol: frames exchanged between tenure nodes over one QUIC connection per pair.
//!
//! Every peer stream carries frames. A frame is a little-endian `u32` body length followed by the
//! body; the first body byte is the [`FrameKind`]:
//!
//! ```text
//! frame        = body_len:u32 body
//! Hello        = 1 magic:"TNRP" version:u16 from_node:u64 to_node:u64 cluster_len:u16 cluster:utf8
//! HelloReply   = 2 accepted:u8 version:u16 reason_len:u16 reason:utf8
//! Batch        = 3 count:u32 message*count
//! message      = group_id:u32 kind:u8 correlation_id:u64 payload_len:u32 payload
//! SnapshotOffer= 4 payload (rest of the body)
//! SnapshotReply= 5 payload (rest of the body)
//! ```
//!
//! The connection's first (bidirectional) stream carries `Hello` from the dialer and `HelloReply`
//! from the acceptor. Unidirectional "lane" streams carry `Batch` frames: every Raft message queued
//! for one peer when a lane writer flushes goes into one frame. Snapshots travel on their own
//! bidirectional stream: `SnapshotOffer`, then the raw snapshot bytes, then `SnapshotReply`.
//!
//! The magic and version come first in `Hello` and that prefix will not change, so any later
//! version can still be read far enough to be refused with a reason.
//!
//! Limits: the caller passes `frame_bytes_max` to [`decode_frame_length`]; a body is never
//! trusted beyond its own length (every count and length inside is checked against the bytes
//! actually present), so garbage produces a [`ProtoError`], never a panic or a huge allocation.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use serde::{Serialize, de::DeserializeOwned};

/// The four bytes every `Hello` starts with.
pub const PEER_MAGIC: [u8; 4] = *b"TNRP";

/// The peer protocol version this build speaks.
///
/// - 1: the first version.
/// - 2: log entries may carry `tenure-core`'s `LeaseOp::Transfer` (and request-id records in
///   snapshots its reply), which a version-1 node cannot decode: the two refuse each other at
///   `Hello` instead of failing mid-replication.
/// - 3: log entries may carry `tenure-core`'s `Command::Cluster` (the node table, proposed in
///   group 0 as soon as a node of this build leads it) and snapshots are format 4, neither of
///   which a version-2 node can decode: the two refuse each other at `Hello` (an upgrade to
///   version 3 is a full-cluster restart).
/// - 4: log entries may carry `ClusterOp::RecordFounders` (the node table recorded with the
///   founders' pinned data directory incarnations), which a version-3 node cannot decode; and a
///   node without a table answers `ClusterNodes` with its founder pins. Version 3 and 4 refuse
///   each other at `Hello` (an upgrade is a full-cluster restart).
/// - 5: log entries may carry the session operations (`LeaseOp::SessionOpen`, ...) and
///   snapshots are format 5 (session records), neither of which a version-4 node can decode.
///   Versions 4 and 5 refuse each other at `Hello` (an upgrade is a full-cluster restart).
/// - 6: log entries may carry the wait-queue operations (`LeaseOp::AcquireWait`, `WaitCancel`)
///   and snapshots are format 6 (waiters), neither of which a version-5 node can decode.
///   Versions 5 and 6 refuse each other at `Hello` (an upgrade is a full-cluster restart).
pub const PEER_PROTOCOL_VERSION: u16 = 6;

/// Longest cluster name a `Hello` may carry, in bytes.
pub const CLUSTER_NAME_BYTES_MAX: usize = 64;

/// Longest refusal reason a `HelloReply` may carry, in bytes (longer reasons are cut).
pub const REASON_BYTES_MAX: usize = 512;

/// Bytes of the length prefix in front of every frame body.
pub const FRAME_LENGTH_BYTES: usize = 4;

/// Bytes of one message header inside a batch (group, kind, correlation id, payload length).
pub const MESSAGE_HEADER_BYTES: usize = 4 + 1 + 8 + 4;

/// What went wrong decoding peer bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    /// The length prefix announces a body larger than the receiver accepts.
    #[error("frame of {length} bytes exceeds the maximum of {max} bytes")]
    FrameTooLarge {
        /// Announced body length.
        length: usize,
        /// The receiver's maximum.
        max: usize,
    },
    /// A frame with an empty body.
    #[error("empty frame")]
    EmptyFrame,
    /// The frame kind byte is not one this version knows.
    #[error("unknown frame kind {0}")]
    UnknownFrameKind(u8),
    /// The body ended before a field it announced.
    #[error("frame truncated while reading {what}")]
    Truncated {
        /// The field being read.
        what: &'static str,
    },
    /// Bytes left over after the last field of a fixed-layout frame.
    #[error("{count} unexpected trailing bytes in a {kind} frame")]
    TrailingBytes {
        /// Number of extra bytes.
        count: usize,
        /// The frame kind.
        kind: &'static str,
    },
    /// A `Hello` that does not start with [`PEER_MAGIC`]: not a tenure peer.
    #[error("bad magic: not a tenure peer")]
    BadMagic,
    /// A message kind byte this version does not know.
    #[error("unknown message kind {0}")]
    UnknownMessageKind(u8),
    /// A text field that is not UTF-8.
    #[error("{field} is not valid UTF-8")]
    BadUtf8 {
        /// The field.
        field: &'static str,
    },
    /// A field longer than its limit.
    #[error("{field} of {length} bytes exceeds the maximum of {max}")]
    FieldTooLong {
        /// The field.
        field: &'static str,
        /// Its length.
        length: usize,
        /// The limit.
        max: usize,
    },
    /// A protocol version this build does not speak (a peer's `Hello`, a client's ALPN).
    #[error("{protocol} version {found} is not supported (this build speaks version {supported})")]
    UnsupportedVersion {
        /// Which protocol: `peer` or `client`.
        protocol: &'static str,
        /// The version found.
        found: u16,
        /// The version this build speaks.
        supported: u16,
    },
    /// A message payload that does not decode as the expected type.
    #[error("undecodable {what} payload: {reason}")]
    Payload {
        /// The expected payload.
        what: &'static str,
        /// The decoder's reason.
        reason: String,
    },
}

/// The kind of a frame (first body byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// Connection handshake from the dialer.
    Hello = 1,
    /// Handshake answer from the acceptor.
    HelloReply = 2,
    /// A batch of Raft messages.
    Batch = 3,
    /// Header of a snapshot transfer.
    SnapshotOffer = 4,
    /// Outcome of a snapshot transfer.
    SnapshotReply = 5,
}

/// The kind of one message inside a batch: which Raft RPC, request or response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum MessageKind {
    /// A unary AppendEntries (heartbeats and probes).
    AppendRequest = 1,
    /// The answer to an [`MessageKind::AppendRequest`].
    AppendResponse = 2,
    /// One AppendEntries of a pipelined replication stream.
    StreamAppendRequest = 3,
    /// One in-order result of a replication stream.
    StreamAppendResponse = 4,
    /// The sender has dropped a replication stream.
    StreamClose = 5,
    /// RequestVote.
    VoteRequest = 6,
    /// Pre-Vote (would you vote for me?).
    PreVoteRequest = 7,
    /// The answer to a vote or pre-vote.
    VoteResponse = 8,
    /// Leader transfer notification.
    TransferLeaderRequest = 9,
    /// The answer to a leader transfer.
    TransferLeaderResponse = 10,
    /// The receiver could not handle a request (unknown group, group stopped, malformed payload).
    Failure = 11,
}

impl MessageKind {
    /// Decodes a kind byte.
    pub fn from_u8(byte: u8) -> Result<Self, ProtoError> {
        Ok(match byte {
            1 => Self::AppendRequest,
            2 => Self::AppendResponse,
            3 => Self::StreamAppendRequest,
            4 => Self::StreamAppendResponse,
            5 => Self::StreamClose,
            6 => Self::VoteRequest,
            7 => Self::PreVoteRequest,
            8 => Self::VoteResponse,
            9 => Self::TransferLeaderRequest,
            10 => Self::TransferLeaderResponse,
            11 => Self::Failure,
            other => return Err(ProtoError::UnknownMessageKind(other)),
        })
    }

    /// True for answers, which complete a request waiting under the same correlation id.
    pub fn is_response(self) -> bool {
        matches!(
            self,
            Self::AppendResponse
                | Self::StreamAppendResponse
                | Self::VoteResponse
                | Self::TransferLeaderResponse
                | Self::Failure
        )
    }
}

/// One message of a batch frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchMessage {
    /// The Raft group the message belongs to.
    pub group_id: u32,
    /// What it is.
    pub kind: MessageKind,
    /// Pairs a response with its request (chosen by the requester, echoed by the responder).
    pub correlation_id: u64,
    /// The postcard-encoded Raft message.
    pub payload: Bytes,
}

impl BatchMessage {
    /// Bytes this message occupies inside a batch body.
    pub fn encoded_len(&self) -> usize {
        MESSAGE_HEADER_BYTES + self.payload.len()
    }
}

/// The dialer's first frame on a new peer connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// The protocol version the dialer speaks.
    pub version: u16,
    /// The dialer's node id (its certificate must be valid for it).
    pub from_node: u64,
    /// The node id the dialer believes it reached.
    pub to_node: u64,
    /// The cluster name the dialer belongs to.
    pub cluster: String,
}

/// The acceptor's answer to a [`Hello`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelloReply {
    /// Whether the connection is accepted.
    pub accepted: bool,
    /// The acceptor's protocol version.
    pub version: u16,
    /// Why not, when refused (empty when accepted).
    pub reason: String,
}

/// A decoded frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// Handshake from the dialer.
    Hello(Hello),
    /// Handshake answer.
    HelloReply(HelloReply),
    /// Raft messages.
    Batch(Vec<BatchMessage>),
    /// Snapshot transfer header (opaque payload).
    SnapshotOffer(Bytes),
    /// Snapshot transfer outcome (opaque payload).
    SnapshotReply(Bytes),
}

impl Hello {
    /// `Ok` when the dialer speaks this build's [`PEER_PROTOCOL_VERSION`], else the typed
    /// refusal ([`ProtoError::UnsupportedVersion`]).
    pub fn check_version(&self) -> Result<(), ProtoError> {
        if self.version == PEER_PROTOCOL_VERSION {
            Ok(())
        } else {
            Err(ProtoError::UnsupportedVersion {
                protocol: "peer",
                found: self.version,
                supported: PEER_PROTOCOL_VERSION,
            })
        }
    }
}

/// Appends one whole frame (length prefix included) to `out`.
pub fn encode_frame(frame: &Frame, out: &mut BytesMut) {
    let start = out.len();
    out.put_u32_le(0);
    match frame {
        Frame::Hello(hello) => {
            out.put_u8(FrameKind::Hello as u8);
            out.put_slice(&PEER_MAGIC);
            out.put_u16_le(hello.version);
            out.put_u64_le(hello.from_node);
            out.put_u64_le(hello.to_node);
            put_short_str(out, truncate_utf8(&hello.cluster, CLUSTER_NAME_BYTES_MAX));
        }
        Frame::HelloReply(reply) => {
            out.put_u8(FrameKind::HelloReply as u8);
            out.put_u8(u8::from(reply.accepted));
            out.put_u16_le(reply.version);
            put_short_str(out, truncate_utf8(&reply.reason, REASON_BYTES_MAX));
        }
        Frame::Batch(messages) => {
            let mut batch = BatchEncoder::begin_in_place(out, start);
            for message in messages {
                batch.push(
                    message.group_id,
                    message.kind,
                    message.correlation_id,
                    &message.payload,
                );
            }
            batch.finish();
            return;
        }
        Frame::SnapshotOffer(payload) => {
            out.put_u8(FrameKind::SnapshotOffer as u8);
            out.put_slice(payload);
        }
        Frame::SnapshotReply(payload) => {
            out.put_u8(FrameKind::SnapshotReply as u8);
            out.put_slice(payload);
        }
    }
    patch_length(out, start);
}

/// Builds one batch frame in place, message by message, without an intermediate vector.
///
/// The lane writer uses it to pack everything queued for a peer into one frame.
#[derive(Debug)]
pub struct BatchEncoder<'a> {
    out: &'a mut BytesMut,
    start: usize,
    count: u32,
}

impl<'a> BatchEncoder<'a> {
    /// Starts a batch frame at the end of `out`.
    pub fn begin(out: &'a mut BytesMut) -> Self {
        let start = out.len();
        out.put_u32_le(0);
        Self::begin_in_place(out, start)
    }

    fn begin_in_place(out: &'a mut BytesMut, start: usize) -> Self {
        out.put_u8(FrameKind::Batch as u8);
        out.put_u32_le(0);
        Self {
            out,
            start,
            count: 0,
        }
    }

    /// Appends one message.
    pub fn push(&mut self, group_id: u32, kind: MessageKind, correlation_id: u64, payload: &[u8]) {
        self.out.put_u32_le(group_id);
        self.out.put_u8(kind as u8);
        self.out.put_u64_le(correlation_id);
        self.out.put_u32_le(len_u32(payload.len()));
        self.out.put_slice(payload);
        self.count = self.count.saturating_add(1);
    }

    /// Messages pushed so far.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Bytes of the frame so far, length prefix included.
    pub fn frame_len(&self) -> usize {
        self.out.len() - self.start
    }

    /// Writes the length prefix and the message count.
    pub fn finish(self) {
        let count_at = self.start + FRAME_LENGTH_BYTES + 1;
        self.out[count_at..count_at + 4].copy_from_slice(&self.count.to_le_bytes());
        patch_length(self.out, self.start);
    }
}

fn patch_length(out: &mut BytesMut, start: usize) {
    let body_len = len_u32(out.len() - start - FRAME_LENGTH_BYTES);
    out[start..start + FRAME_LENGTH_BYTES].copy_from_slice(&body_len.to_le_bytes());
}

fn len_u32(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}

fn truncate_utf8(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

fn put_short_str(out: &mut BytesMut, text: &str) {
    out.put_u16_le(u16::try_from(text.len()).unwrap_or(u16::MAX));
    out.put_slice(text.as_bytes());
}

/// Reads a frame's length prefix and checks it against the receiver's maximum.
pub fn decode_frame_length(
    prefix: [u8; FRAME_LENGTH_BYTES],
    frame_bytes_max: usize,
) -> Result<usize, ProtoError> {
    let length = u32::from_le_bytes(prefix) as usize;
    if length == 0 {
        return Err(ProtoError::EmptyFrame);
    }
    if length > frame_bytes_max {
        return Err(ProtoError::FrameTooLarge {
            length,
            max: frame_bytes_max,
        });
    }
    Ok(length)
}

/// Decodes one frame body (the bytes after the length prefix). Payloads are zero-copy slices of
/// `body`.
pub fn decode_frame_body(mut body: Bytes) -> Result<Frame, ProtoError> {
    let kind = take_u8(&mut body, "frame kind").map_err(|_| ProtoError::EmptyFrame)?;
    match kind {
        1 => {
            let magic = take_bytes(&mut body, 4, "magic")?;
            if magic.as_ref() != PEER_MAGIC {
                return Err(ProtoError::BadMagic);
            }
            let version = take_u16(&mut body, "version")?;
            let from_node = take_u64(&mut body, "from_node")?;
            let to_node = take_u64(&mut body, "to_node")?;
            let cluster = take_short_str(&mut body, "cluster", CLUSTER_NAME_BYTES_MAX)?;
            expect_end(&body, "Hello")?;
            Ok(Frame::Hello(Hello {
                version,
                from_node,
                to_node,
                cluster,
            }))
        }
        2 => {
            let accepted = take_u8(&mut body, "accepted")? != 0;
            let version = take_u16(&mut body, "version")?;
            let reason = take_short_str(&mut body, "reason", REASON_BYTES_MAX)?;
            expect_end(&body, "HelloReply")?;
            Ok(Frame::HelloReply(HelloReply {
                accepted,
                version,
                reason,
            }))
        }
        3 => {
            let count = take_u32(&mut body, "message count")? as usize;
            // Every message needs at least a header: a count the body cannot hold is garbage.
            if count > body.len() / MESSAGE_HEADER_BYTES {
                return Err(ProtoError::Truncated {
                    what: "batch messages",
                });
            }
            let mut messages = Vec::with_capacity(count);
            for _ in 0..count {
                let group_id = take_u32(&mut body, "group id")?;
                let kind = MessageKind::from_u8(take_u8(&mut body, "message kind")?)?;
                let correlation_id = take_u64(&mut body, "correlation id")?;
                let payload_len = take_u32(&mut body, "payload length")? as usize;
                let payload = take_bytes(&mut body, payload_len, "payload")?;
                messages.push(BatchMessage {
                    group_id,
                    kind,
                    correlation_id,
                    payload,
                });
            }
            expect_end(&body, "Batch")?;
            Ok(Frame::Batch(messages))
        }
        4 => Ok(Frame::SnapshotOffer(body)),
        5 => Ok(Frame::SnapshotReply(body)),
        other => Err(ProtoError::UnknownFrameKind(other)),
    }
}

/// Encodes a message payload (postcard).
pub fn encode_payload<T: Serialize>(value: &T) -> Result<Bytes, ProtoError> {
    postcard::to_allocvec(value)
        .map(Bytes::from)
        .map_err(|error| ProtoError::Payload {
            what: std::any::type_name::<T>(),
            reason: error.to_string(),
        })
}

/// Decodes a message payload (postcard); trailing bytes are an error.
pub fn decode_payload<T: DeserializeOwned>(
    payload: &[u8],
    what: &'static str,
) -> Result<T, ProtoError> {
    let (value, rest) =
        postcard::take_from_bytes::<T>(payload).map_err(|error| ProtoError::Payload {
            what,
            reason: error.to_string(),
        })?;
    if !rest.is_empty() {
        return Err(ProtoError::Payload {
            what,
            reason: format!("{} trailing bytes", rest.len()),
        });
    }
    Ok(value)
}

fn need(body: &Bytes, count: usize, what: &'static str) -> Result<(), ProtoError> {
    if body.remaining() < count {
        Err(ProtoError::Truncated { what })
    } else {
        Ok(())
    }
}

fn take_u8(body: &mut Bytes, what: &'static str) -> Result<u8, ProtoError> {
    need(body, 1, what)?;
    Ok(body.get_u8())
}

fn take_u16(body: &mut Bytes, what: &'static str) -> Result<u16, ProtoError> {
    need(body, 2, what)?;
    Ok(body.get_u16_le())
}

fn take_u32(body: &mut Bytes, what: &'static str) -> Result<u32, ProtoError> {
    need(body, 4, what)?;
    Ok(body.get_u32_le())
}

fn take_u64(body: &mut Bytes, what: &'static str) -> Result<u64, ProtoError> {
    need(body, 8, what)?;
    Ok(body.get_u64_le())
}

fn take_bytes(body: &mut Bytes, count: usize, what: &'static str) -> Result<Bytes, ProtoError> {
    need(body, count, what)?;
    Ok(body.split_to(count))
}

fn take_short_str(body: &mut Bytes, field: &'static str, max: usize) -> Result<String, ProtoError> {
    let length = usize::from(take_u16(body, field)?);
    if length > max {
        return Err(ProtoError::FieldTooLong { field, length, max });
    }
    let bytes = take_bytes(body, length, field)?;
    String::from_utf8(bytes.to_vec()).map_err(|_| ProtoError::BadUtf8 { field })
}

fn expect_end(body: &Bytes, kind: &'static str) -> Result<(), ProtoError> {
    if body.is_empty() {
        Ok(())
    } else {
        Err(ProtoError::TrailingBytes {
            count: body.len(),
            kind,
        })
    }
}
