//! Key layout and the checksummed value encoding of everything tenure-storage writes.
//!
//! Keys start with the group id (big-endian, so a group's keys are contiguous and ordered):
//!
//! ```text
//! log   CF:  group u32 BE | index u64 BE            -> entry
//! meta  CF:  group u32 BE | tag u8 (vote=1, committed=2, last_purged=3)
//! state CF:  group u32 BE | tag u8 (snapshot=1)     -> pointer to the current snapshot file
//! ```
//!
//! Every value is
//!
//! ```text
//! checksum u64 LE | format_version u8 | payload (postcard)
//! checksum = xxh3_64_with_seed(format_version | payload, CHECKSUM_SEED)
//! ```
//!
//! A value whose checksum does not match is reported as corruption naming the group and the key,
//! never decoded. A value of a format version this build does not read is refused with
//! [`DecodeError::UnsupportedVersion`] (a data directory written by a newer build). Values
//! written before the format version existed (`xxh3_64(payload) u64 LE | payload`, read as
//! version 0) are still read: the seeded checksum tells the two layouts apart.
//!
//! The payloads' postcard encoding depends on the declaration order of every enum in them (log
//! entries, votes, snapshot pointers); `tests/storage_tests/golden.rs` pins their bytes.

use serde::Serialize;
use serde::de::DeserializeOwned;
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

/// Bytes of checksum in front of every value.
pub const CHECKSUM_BYTES: usize = 8;

/// The value format version this build writes (and the newest it reads).
///
/// - 0: `xxh3_64(payload) | payload`, before versions existed (still read).
/// - 1: `xxh3_64_with_seed(1 | payload, CHECKSUM_SEED) | 1 | payload`.
/// - 2: the same layout; a log entry may carry `LeaseOp::Transfer` (an appended variant a
///   version-1 reader cannot decode), so older builds refuse the value by version instead of
///   misreading it. Version-1 values are read unchanged.
/// - 3: the same layout; a log entry may carry `ClusterOp::RecordFounders` (an appended variant
///   of the node table's changes, with the founders' pinned incarnations) that a version-2
///   reader cannot decode. Versions 1 and 2 are read unchanged.
/// - 4: the same layout; a log entry may carry the session operations (`LeaseOp::SessionOpen`,
///   `SessionKeepAlive`, `SessionClose`, `AcquireInSession`), appended variants a version-3
///   reader cannot decode. Versions 1 to 3 are read unchanged.
/// - 5: the same layout; a log entry may carry the wait-queue operations (`LeaseOp::AcquireWait`,
///   `WaitCancel`), appended variants a version-4 reader cannot decode. Versions 1 to 4 are
///   read unchanged.
pub const VALUE_FORMAT_VERSION: u8 = 5;

/// Seed of the checksum of versioned values (`"TNRSTOR1"`), so that no versioned value passes
/// as an unversioned one.
pub const CHECKSUM_SEED: u64 = u64::from_le_bytes(*b"TNRSTOR1");

/// Tag of the vote in the meta column family.
pub const META_VOTE: u8 = 1;
/// Tag of the committed log id in the meta column family.
pub const META_COMMITTED: u8 = 2;
/// Tag of the last purged log id in the meta column family.
pub const META_LAST_PURGED: u8 = 3;
/// Tag of the current snapshot pointer in the state column family.
pub const STATE_SNAPSHOT: u8 = 1;
/// The key prefix of node-wide records (no group has this id; the configuration's group bound
/// is far below it).
pub const NODE_RECORDS_GROUP: u32 = u32::MAX;
/// Tag of the node's replica record (`meta` column family, group [`NODE_RECORDS_GROUP`]): the
/// groups this node hosts (`replicas::ReplicaRecord`).
pub const NODE_REPLICAS: u8 = 1;

/// Key of log entry `index` of `group`.
pub fn log_key(group: u32, index: u64) -> [u8; 12] {
    let mut key = [0u8; 12];
    key[..4].copy_from_slice(&group.to_be_bytes());
    key[4..].copy_from_slice(&index.to_be_bytes());
    key
}

/// The group and index of a log key, if it is one.
pub fn parse_log_key(key: &[u8]) -> Option<(u32, u64)> {
    let group = u32::from_be_bytes(key.get(..4)?.try_into().ok()?);
    let index = u64::from_be_bytes(key.get(4..12)?.try_into().ok()?);
    (key.len() == 12).then_some((group, index))
}

/// Key of a per-group record in the meta or state column family.
pub fn tagged_key(group: u32, tag: u8) -> [u8; 5] {
    let mut key = [0u8; 5];
    key[..4].copy_from_slice(&group.to_be_bytes());
    key[4] = tag;
    key
}

/// Encodes a value with its checksum and format version ([`VALUE_FORMAT_VERSION`]).
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, postcard::Error> {
    let mut bytes = vec![0u8; CHECKSUM_BYTES + 1];
    bytes[CHECKSUM_BYTES] = VALUE_FORMAT_VERSION;
    let mut bytes = postcard::to_extend(value, bytes)?;
    let checksum = xxh3_64_with_seed(&bytes[CHECKSUM_BYTES..], CHECKSUM_SEED);
    bytes[..CHECKSUM_BYTES].copy_from_slice(&checksum.to_le_bytes());
    Ok(bytes)
}

/// Why a stored value could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Shorter than its checksum.
    #[error("value of {0} bytes is shorter than its checksum")]
    Short(usize),
    /// The checksum does not match the payload.
    #[error("checksum mismatch: stored {stored:016x}, computed {computed:016x}")]
    Checksum {
        /// Stored checksum.
        stored: u64,
        /// Checksum of the payload read.
        computed: u64,
    },
    /// The payload is not a valid encoding.
    #[error("undecodable payload: {0}")]
    Payload(String),
    /// The value's format version is newer than this build reads (the data directory was
    /// written by a newer tenure).
    #[error(
        "value format version {found} is not supported (this build reads versions 0 to \
         {VALUE_FORMAT_VERSION}); was the data directory written by a newer tenure?"
    )]
    UnsupportedVersion {
        /// The version found.
        found: u8,
    },
}

/// Verifies the checksum and decodes a value.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, DecodeError> {
    if bytes.len() < CHECKSUM_BYTES {
        return Err(DecodeError::Short(bytes.len()));
    }
    let (head, rest) = bytes.split_at(CHECKSUM_BYTES);
    let mut stored = [0u8; CHECKSUM_BYTES];
    stored.copy_from_slice(head);
    let stored = u64::from_le_bytes(stored);
    let computed = xxh3_64_with_seed(rest, CHECKSUM_SEED);
    let payload = if stored == computed {
        let Some((&version, payload)) = rest.split_first() else {
            return Err(DecodeError::Short(bytes.len()));
        };
        // Versions 1 to 3 share their layout; 2 and 3 only add payload kinds.
        if !(1..=VALUE_FORMAT_VERSION).contains(&version) {
            return Err(DecodeError::UnsupportedVersion { found: version });
        }
        payload
    } else if stored == xxh3_64(rest) {
        // Version 0: written before values carried a version.
        rest
    } else {
        return Err(DecodeError::Checksum { stored, computed });
    };
    postcard::from_bytes(payload).map_err(|err| DecodeError::Payload(err.to_string()))
}

/// The format version of a stored value whose checksum matches (0 for the unversioned layout).
pub fn value_format_version(bytes: &[u8]) -> Result<u8, DecodeError> {
    if bytes.len() < CHECKSUM_BYTES {
        return Err(DecodeError::Short(bytes.len()));
    }
    let (head, rest) = bytes.split_at(CHECKSUM_BYTES);
    let mut stored = [0u8; CHECKSUM_BYTES];
    stored.copy_from_slice(head);
    let stored = u64::from_le_bytes(stored);
    let computed = xxh3_64_with_seed(rest, CHECKSUM_SEED);
    if stored == computed {
        rest.first().copied().ok_or(DecodeError::Short(bytes.len()))
    } else if stored == xxh3_64(rest) {
        Ok(0)
    } else {
        Err(DecodeError::Checksum { stored, computed })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_1_values_are_still_read() {
        let value = (42u64, "lease".to_owned());
        let mut bytes = vec![0u8; CHECKSUM_BYTES + 1];
        bytes[CHECKSUM_BYTES] = 1;
        let mut bytes = postcard::to_extend(&value, bytes).unwrap();
        let checksum = xxh3_64_with_seed(&bytes[CHECKSUM_BYTES..], CHECKSUM_SEED);
        bytes[..CHECKSUM_BYTES].copy_from_slice(&checksum.to_le_bytes());
        assert_eq!(value_format_version(&bytes), Ok(1));
        assert_eq!(decode::<(u64, String)>(&bytes).unwrap(), value);
    }

    #[test]
    fn values_round_trip_and_any_flipped_bit_is_caught() {
        let value = (42u64, "lease".to_owned());
        let bytes = encode(&value).unwrap();
        assert_eq!(decode::<(u64, String)>(&bytes).unwrap(), value);
        for position in 0..bytes.len() {
            let mut corrupted = bytes.clone();
            corrupted[position] ^= 0x10;
            assert!(
                decode::<(u64, String)>(&corrupted).is_err(),
                "byte {position}"
            );
        }
        assert_eq!(decode::<u64>(&bytes[..3]), Err(DecodeError::Short(3)));
        assert_eq!(value_format_version(&bytes), Ok(VALUE_FORMAT_VERSION));
    }

    #[test]
    fn unversioned_values_are_read_and_newer_versions_refused() {
        let value = (42u64, "lease".to_owned());
        // Version 0: checksum of the bare payload, no version byte.
        let payload = postcard::to_allocvec(&value).unwrap();
        let mut legacy = xxh3_64(&payload).to_le_bytes().to_vec();
        legacy.extend_from_slice(&payload);
        assert_eq!(decode::<(u64, String)>(&legacy).unwrap(), value);
        assert_eq!(value_format_version(&legacy), Ok(0));

        // A version this build does not know, with a valid checksum.
        let mut newer = encode(&value).unwrap();
        newer[CHECKSUM_BYTES] = VALUE_FORMAT_VERSION + 1;
        let checksum = xxh3_64_with_seed(&newer[CHECKSUM_BYTES..], CHECKSUM_SEED);
        newer[..CHECKSUM_BYTES].copy_from_slice(&checksum.to_le_bytes());
        assert_eq!(
            decode::<(u64, String)>(&newer),
            Err(DecodeError::UnsupportedVersion {
                found: VALUE_FORMAT_VERSION + 1
            })
        );
    }

    #[test]
    fn log_keys_sort_by_group_then_index() {
        let mut keys = [
            log_key(2, 1),
            log_key(1, 300),
            log_key(1, 2),
            log_key(1, u64::MAX),
        ];
        keys.sort();
        let parsed: Vec<_> = keys.iter().map(|k| parse_log_key(k).unwrap()).collect();
        assert_eq!(parsed, [(1, 2), (1, 300), (1, u64::MAX), (2, 1)]);
        assert_eq!(parse_log_key(&[0; 5]), None);
    }
}
