//! # tenure-proto: the bytes on tenure's wires
//!
//! This crate is the only place that knows how tenure's messages look on the wire. Today that is
//! the peer protocol between nodes ([`peer`]): the handshake every peer connection starts with,
//! length-prefixed batch frames that carry Raft messages of many groups, and the snapshot offer
//! and reply that travel on their own streams; and the native client protocol ([`client`]):
//! batched, id-matched requests and responses between clients (or forwarding nodes) and a node.
//!
//! It is sans-IO: functions turn values into bytes and bytes into values (or a typed
//! [`ProtoError`]); reading sockets and deciding what to do with a message belong to
//! `tenure-transport`. Decoding never panics and never allocates more than the length limits the
//! caller passes in allow, whatever the input.
//!
//! Must not depend on: tokio, quinn, openraft, RocksDB, or any clock. Message payloads are opaque
//! here: callers encode them with [`encode_payload`] (postcard) and decode them with
//! [`decode_payload`].

pub mod client;
pub mod peer;

pub use peer::{
    BatchEncoder, BatchMessage, Frame, FrameKind, Hello, HelloReply, MessageKind, PEER_MAGIC,
    PEER_PROTOCOL_VERSION, ProtoError, decode_frame_body, decode_frame_length, decode_payload,
    encode_frame, encode_payload,
};
