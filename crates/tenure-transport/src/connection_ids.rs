//! The QUIC connection ids of a node's endpoint: 8 random bytes and an 8-byte HMAC-SHA256 tag
//! of them, under a key derived from the node's private key ([`NodeTls::connection_id_key`]).
//!
//! Why not quinn's default (`HashedConnectionIdGenerator` with a random key per endpoint): a
//! restarted node must recognise the ids of its previous incarnation as its own, or it drops the
//! packets its peers and clients still send on them as invalid and never answers them with a
//! stateless reset; their dead connections then live until the idle timeout. A stable key does
//! that. quinn's hashed ids with a stable key would not do: FxHash can be inverted from two ids,
//! and their 3-byte nonce leaves only 2^24 valid ids, whose reset tokens an off-path attacker
//! could harvest once and use against the node's connections for as long as its key lives. A
//! 64-bit random part and a 64-bit HMAC tag leave nothing to invert or enumerate.
//!
//! Must not depend on: the groups, the peer protocol (this module only names connections).
//!
//! [`NodeTls::connection_id_key`]: crate::tls::NodeTls::connection_id_key

use quinn_proto::{ConnectionId, ConnectionIdGenerator, InvalidCid};
use rand::RngCore as _;
use rand::rngs::StdRng;

/// Random bytes at the start of an id.
const RANDOM_BYTES: usize = 8;
/// HMAC tag bytes after them.
const TAG_BYTES: usize = 8;
/// Length of every id this generator makes (QUIC allows up to 20).
pub const CONNECTION_ID_BYTES: usize = RANDOM_BYTES + TAG_BYTES;

/// Makes and recognises a node's connection ids (see the module documentation).
pub struct SignedConnectionIds {
    key: ring::hmac::Key,
    /// The random part of each id (a cryptographic generator, seeded by the caller from the
    /// operating system).
    rng: StdRng,
}

impl SignedConnectionIds {
    /// Ids tagged under `key` (a node's [`crate::tls::NodeTls::connection_id_key`]), their
    /// random part from `rng`.
    pub fn new(key: ring::hmac::Key, rng: StdRng) -> Self {
        SignedConnectionIds { key, rng }
    }

    fn tag(&self, random: &[u8]) -> [u8; TAG_BYTES] {
        let full = ring::hmac::sign(&self.key, random);
        let mut tag = [0u8; TAG_BYTES];
        tag.copy_from_slice(&full.as_ref()[..TAG_BYTES]);
        tag
    }
}

impl ConnectionIdGenerator for SignedConnectionIds {
    fn generate_cid(&mut self) -> ConnectionId {
        let mut random = [0u8; RANDOM_BYTES];
        self.rng.fill_bytes(&mut random);
        let mut id = [0u8; CONNECTION_ID_BYTES];
        id[..RANDOM_BYTES].copy_from_slice(&random);
        id[RANDOM_BYTES..].copy_from_slice(&self.tag(&random));
        ConnectionId::new(&id)
    }

    fn validate(&self, cid: &ConnectionId) -> Result<(), InvalidCid> {
        if cid.len() != CONNECTION_ID_BYTES {
            return Err(InvalidCid);
        }
        let (random, tag) = cid.split_at(RANDOM_BYTES);
        if self.tag(random)[..] == tag[..] {
            Ok(())
        } else {
            Err(InvalidCid)
        }
    }

    fn cid_len(&self) -> usize {
        CONNECTION_ID_BYTES
    }

    fn cid_lifetime(&self) -> Option<std::time::Duration> {
        None
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng as _;

    use super::*;

    fn key(byte: u8) -> ring::hmac::Key {
        ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &[byte; 32])
    }

    fn ids(byte: u8) -> SignedConnectionIds {
        SignedConnectionIds::new(key(byte), StdRng::seed_from_u64(u64::from(byte)))
    }

    #[test]
    fn ids_are_recognised_under_the_same_key_only() {
        let mut first = ids(1);
        let restarted = SignedConnectionIds::new(key(1), StdRng::seed_from_u64(9));
        let other = ids(2);
        for _ in 0..100 {
            let id = first.generate_cid();
            assert_eq!(id.len(), CONNECTION_ID_BYTES);
            assert!(
                restarted.validate(&id).is_ok(),
                "the same key after a restart"
            );
            assert!(other.validate(&id).is_err(), "another node's key");
        }
    }

    #[test]
    fn altered_and_short_ids_are_refused() {
        let mut ids = ids(1);
        let id = ids.generate_cid();
        for index in 0..CONNECTION_ID_BYTES {
            let mut bytes = id.to_vec();
            bytes[index] ^= 1;
            assert!(
                ids.validate(&ConnectionId::new(&bytes)).is_err(),
                "byte {index}"
            );
        }
        assert!(ids.validate(&ConnectionId::new(&id[..8])).is_err());
        assert!(ids.validate(&ConnectionId::new(&[])).is_err());
    }

    #[test]
    fn ids_differ() {
        let mut ids = ids(1);
        let first = ids.generate_cid();
        let second = ids.generate_cid();
        assert_ne!(first, second);
    }
}
