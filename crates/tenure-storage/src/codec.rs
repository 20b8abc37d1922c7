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
//! Every value is `xxh3_64(payload) u64 LE | payload`, payload in postcard. A value whose checksum
//! does not match is reported as corruption naming the group and the key, never decoded.

use serde::Serialize;
use serde::de::DeserializeOwned;
use xxhash_rust::xxh3::xxh3_64;

/// Bytes of checksum in front of every value.
pub const CHECKSUM_BYTES: usize = 8;

/// Tag of the vote in the meta column family.
pub const META_VOTE: u8 = 1;
/// Tag of the committed log id in the meta column family.
pub const META_COMMITTED: u8 = 2;
/// Tag of the last purged log id in the meta column family.
pub const META_LAST_PURGED: u8 = 3;
/// Tag of the current snapshot pointer in the state column family.
pub const STATE_SNAPSHOT: u8 = 1;

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

/// Encodes a value with its checksum.
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, postcard::Error> {
    let mut bytes = vec![0u8; CHECKSUM_BYTES];
    let mut bytes = postcard::to_extend(value, std::mem::take(&mut bytes))?;
    let checksum = xxh3_64(&bytes[CHECKSUM_BYTES..]);
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
}

/// Verifies the checksum and decodes a value.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, DecodeError> {
    if bytes.len() < CHECKSUM_BYTES {
        return Err(DecodeError::Short(bytes.len()));
    }
    let (head, payload) = bytes.split_at(CHECKSUM_BYTES);
    let mut stored = [0u8; CHECKSUM_BYTES];
    stored.copy_from_slice(head);
    let stored = u64::from_le_bytes(stored);
    let computed = xxh3_64(payload);
    if stored != computed {
        return Err(DecodeError::Checksum { stored, computed });
    }
    postcard::from_bytes(payload).map_err(|err| DecodeError::Payload(err.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

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
