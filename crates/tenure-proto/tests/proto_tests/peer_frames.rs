//! Peer frame codec: round trips, and every kind of bad input gives a typed error, never a panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;
use tenure_proto::peer::{BatchEncoder, FRAME_LENGTH_BYTES};
use tenure_proto::{
    BatchMessage, Frame, Hello, HelloReply, MessageKind, ProtoError, decode_frame_body,
    decode_frame_length, encode_frame,
};

const FRAME_BYTES_MAX: usize = 1 << 20;

fn roundtrip(frame: &Frame) -> Frame {
    let mut out = BytesMut::new();
    encode_frame(frame, &mut out);
    let prefix: [u8; 4] = out[..FRAME_LENGTH_BYTES].try_into().unwrap();
    let length = decode_frame_length(prefix, FRAME_BYTES_MAX).unwrap();
    assert_eq!(length, out.len() - FRAME_LENGTH_BYTES);
    decode_frame_body(out.freeze().slice(FRAME_LENGTH_BYTES..)).unwrap()
}

fn sample_batch() -> Frame {
    Frame::Batch(vec![
        BatchMessage {
            group_id: 7,
            kind: MessageKind::StreamAppendRequest,
            correlation_id: 1,
            payload: Bytes::from_static(b"entries"),
        },
        BatchMessage {
            group_id: 200,
            kind: MessageKind::VoteResponse,
            correlation_id: u64::MAX,
            payload: Bytes::new(),
        },
    ])
}

#[test]
fn every_frame_kind_round_trips() {
    let frames = [
        Frame::Hello(Hello {
            version: 1,
            from_node: 1,
            to_node: 2,
            cluster: "prod-eu".into(),
        }),
        Frame::HelloReply(HelloReply {
            accepted: false,
            version: 1,
            reason: "unknown node".into(),
        }),
        sample_batch(),
        Frame::Batch(Vec::new()),
        Frame::SnapshotOffer(Bytes::from_static(b"offer")),
        Frame::SnapshotReply(Bytes::from_static(b"reply")),
    ];
    for frame in &frames {
        assert_eq!(&roundtrip(frame), frame);
    }
}

#[test]
fn batch_encoder_matches_encode_frame() {
    let mut incremental = BytesMut::new();
    let mut encoder = BatchEncoder::begin(&mut incremental);
    encoder.push(7, MessageKind::StreamAppendRequest, 1, b"entries");
    encoder.push(200, MessageKind::VoteResponse, u64::MAX, b"");
    assert_eq!(encoder.count(), 2);
    encoder.finish();
    let mut whole = BytesMut::new();
    encode_frame(&sample_batch(), &mut whole);
    assert_eq!(incremental, whole);
}

#[test]
fn length_over_the_maximum_is_refused_before_reading_the_body() {
    let prefix = u32::try_from(FRAME_BYTES_MAX + 1).unwrap().to_le_bytes();
    assert_eq!(
        decode_frame_length(prefix, FRAME_BYTES_MAX),
        Err(ProtoError::FrameTooLarge {
            length: FRAME_BYTES_MAX + 1,
            max: FRAME_BYTES_MAX
        })
    );
    assert_eq!(
        decode_frame_length([0; 4], FRAME_BYTES_MAX),
        Err(ProtoError::EmptyFrame)
    );
}

#[test]
fn every_truncation_of_a_batch_is_a_typed_error() {
    let mut out = BytesMut::new();
    encode_frame(&sample_batch(), &mut out);
    let body = out.freeze().slice(FRAME_LENGTH_BYTES..);
    for cut in 0..body.len() {
        let result = decode_frame_body(body.slice(..cut));
        assert!(result.is_err(), "truncation at {cut} decoded: {result:?}");
    }
}

#[test]
fn bad_magic_unknown_kinds_and_trailing_bytes_are_refused() {
    let mut out = BytesMut::new();
    encode_frame(
        &Frame::Hello(Hello {
            version: 1,
            from_node: 1,
            to_node: 2,
            cluster: String::new(),
        }),
        &mut out,
    );
    let mut body = out[FRAME_LENGTH_BYTES..].to_vec();
    body[1] = b'X';
    assert_eq!(
        decode_frame_body(Bytes::from(body.clone())),
        Err(ProtoError::BadMagic)
    );
    body[1] = b'T';
    body.push(0);
    assert!(matches!(
        decode_frame_body(Bytes::from(body)),
        Err(ProtoError::TrailingBytes { .. })
    ));
    assert_eq!(
        decode_frame_body(Bytes::from_static(&[99])),
        Err(ProtoError::UnknownFrameKind(99))
    );
    // A batch whose one message has kind 200.
    let mut batch = vec![3u8, 1, 0, 0, 0];
    batch.extend_from_slice(&5u32.to_le_bytes());
    batch.push(200);
    batch.extend_from_slice(&[0; 12]);
    assert_eq!(
        decode_frame_body(Bytes::from(batch)),
        Err(ProtoError::UnknownMessageKind(200))
    );
}

#[test]
fn a_huge_message_count_does_not_allocate() {
    let mut batch = vec![3u8];
    batch.extend_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(
        decode_frame_body(Bytes::from(batch)),
        Err(ProtoError::Truncated { .. })
    ));
}

#[test]
fn payload_codec_rejects_trailing_bytes() {
    let encoded = tenure_proto::encode_payload(&(5u64, "x".to_string())).unwrap();
    let decoded: (u64, String) = tenure_proto::decode_payload(&encoded, "pair").unwrap();
    assert_eq!(decoded, (5, "x".into()));
    let mut longer = encoded.to_vec();
    longer.push(1);
    assert!(tenure_proto::decode_payload::<(u64, String)>(&longer, "pair").is_err());
}

proptest! {
    #[test]
    fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode_frame_body(Bytes::from(bytes));
    }

    #[test]
    fn batches_round_trip(messages in proptest::collection::vec(
        (any::<u32>(), 1u8..=11, any::<u64>(), proptest::collection::vec(any::<u8>(), 0..64)), 0..20)) {
        let frame = Frame::Batch(messages.into_iter().map(|(group_id, kind, correlation_id, payload)| BatchMessage {
            group_id,
            kind: MessageKind::from_u8(kind).unwrap(),
            correlation_id,
            payload: Bytes::from(payload),
        }).collect());
        prop_assert_eq!(roundtrip(&frame), frame);
    }
}
