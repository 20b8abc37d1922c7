//! Snapshots: byte-identical round trips, identical decisions after restore, and typed
//! rejection of every corruption (never a panic).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::{Harness, TENANT, acquire_op, renew_op};
use proptest::prelude::*;
use tenure_core::{
    Command, GroupLimits, LeaseStateMachine, SNAPSHOT_FORMAT_VERSION, SnapshotError, StateOptions,
    TenantPolicy,
};

/// A state with every kind of record: active, expired-unreclaimed, reclaimed, released,
/// request-id records (success and error), a tenant policy, freed slots.
fn busy_state() -> Harness {
    let mut h = Harness::with_limits(GroupLimits {
        ttl_ms_min: 100,
        inactive_retention_ms: 5_000,
        ..GroupLimits::default()
    });
    h.apply(Command::SetTenantPolicy {
        tenant_id: TENANT.to_owned(),
        policy: TenantPolicy {
            active_leases_max: Some(100),
            ttl_ms_min: None,
            ttl_ms_max: Some(60_000),
        },
    });
    for i in 0..20 {
        h.acquire(&format!("r{i}"), "holder", 1_000 + i * 100)
            .unwrap();
    }
    let kept = h.acquire("kept", "holder", 60_000).unwrap();
    h.acquire("r0", "other", 1_000).unwrap_err();
    h.advance(1_500);
    h.apply(Command::Expire { leases_max: 3 });
    let r15 = h.get("r15").unwrap();
    h.release("r15", r15.lease_id, "holder").unwrap();
    h.renew("kept", kept.lease_id, "holder", 30_000).unwrap();
    h.advance(6_000);
    h.apply(Command::Expire { leases_max: 1 });
    h.acquire("late", "holder", 2_000).unwrap();
    h
}

#[test]
fn a_restored_snapshot_is_byte_identical_whatever_the_hash_seed() {
    let h = busy_state();
    let bytes = h.state.snapshot_to_vec();
    for seed in [0, 1, u64::MAX] {
        let restored = LeaseStateMachine::read_snapshot(
            bytes.as_slice(),
            StateOptions {
                hash_seed: seed,
                ..StateOptions::default()
            },
        )
        .unwrap();
        assert_eq!(restored.snapshot_to_vec(), bytes);
        assert_eq!(restored.stats(), h.state.stats());
    }
}

#[test]
fn a_restored_state_decides_exactly_like_the_original() {
    let mut original = busy_state();
    let bytes = original.state.snapshot_to_vec();
    let mut restored = Harness {
        state: LeaseStateMachine::read_snapshot(
            bytes.as_slice(),
            StateOptions {
                hash_seed: 99,
                ..StateOptions::default()
            },
        )
        .unwrap(),
        ..Harness::new()
    };
    restored.now_ms = original.now_ms;
    let kept = original.get("kept").unwrap().lease_id;
    let script = vec![
        Command::Lease(acquire_op("r0", "x", 1_000, "a")),
        Command::Lease(acquire_op("fresh", "x", 1_000, "b")),
        Command::Lease(renew_op("kept", kept, "holder", 5_000, "c")),
        Command::Expire { leases_max: 100 },
        Command::Lease(acquire_op("fresh", "x", 1_000, "b")),
    ];
    for (step, command) in script.into_iter().enumerate() {
        original.advance(700);
        restored.advance(700);
        let a = original.apply(command.clone());
        let b = restored.apply(command);
        assert_eq!(a, b, "step {step}");
    }
    assert_eq!(
        original.state.snapshot_to_vec(),
        restored.state.snapshot_to_vec()
    );
}

#[test]
fn every_single_bit_flip_is_rejected_with_a_typed_error() {
    let h = busy_state();
    let bytes = h.state.snapshot_to_vec();
    for position in 0..bytes.len() {
        for bit in [0x01u8, 0x80] {
            let mut corrupted = bytes.clone();
            corrupted[position] ^= bit;
            let result =
                LeaseStateMachine::read_snapshot(corrupted.as_slice(), StateOptions::default());
            assert!(
                result.is_err(),
                "flip of bit {bit:#x} at byte {position} went unnoticed"
            );
        }
    }
}

#[test]
fn every_truncation_is_rejected() {
    let h = busy_state();
    let bytes = h.state.snapshot_to_vec();
    for len in 0..bytes.len() {
        let result = LeaseStateMachine::read_snapshot(&bytes[..len], StateOptions::default());
        assert!(result.is_err(), "truncated to {len} bytes");
    }
    assert!(matches!(
        LeaseStateMachine::read_snapshot(&bytes[..bytes.len() - 1], StateOptions::default()),
        Err(SnapshotError::Truncated)
    ));
}

#[test]
fn wrong_magic_version_checksum_and_trailing_data_have_their_own_errors() {
    let h = busy_state();
    let bytes = h.state.snapshot_to_vec();

    let mut bad_magic = bytes.clone();
    bad_magic[0] = b'X';
    assert!(matches!(
        LeaseStateMachine::read_snapshot(bad_magic.as_slice(), StateOptions::default()),
        Err(SnapshotError::BadMagic)
    ));

    let mut bad_version = bytes.clone();
    bad_version[8..12].copy_from_slice(&(SNAPSHOT_FORMAT_VERSION + 1).to_le_bytes());
    assert!(matches!(
        LeaseStateMachine::read_snapshot(bad_version.as_slice(), StateOptions::default()),
        Err(SnapshotError::UnsupportedVersion { found }) if found == SNAPSHOT_FORMAT_VERSION + 1
    ));

    let mut bad_checksum = bytes.clone();
    let last = bad_checksum.len() - 1;
    bad_checksum[last] ^= 0xff;
    assert!(matches!(
        LeaseStateMachine::read_snapshot(bad_checksum.as_slice(), StateOptions::default()),
        Err(SnapshotError::ChecksumMismatch { .. })
    ));

    let mut trailing = bytes.clone();
    trailing.push(0);
    assert!(matches!(
        LeaseStateMachine::read_snapshot(trailing.as_slice(), StateOptions::default()),
        Err(SnapshotError::Corrupt(_))
    ));
}

#[test]
fn an_empty_state_round_trips() {
    let state = LeaseStateMachine::new(tenure_core::GroupId(1), StateOptions::default());
    let bytes = state.snapshot_to_vec();
    let restored =
        LeaseStateMachine::read_snapshot(bytes.as_slice(), StateOptions::default()).unwrap();
    assert_eq!(restored.snapshot_to_vec(), bytes);
    assert_eq!(restored.group_id(), tenure_core::GroupId(1));
}

proptest! {
    #[test]
    fn arbitrary_bytes_after_a_valid_header_never_panic(tail in prop::collection::vec(any::<u8>(), 0..512)) {
        let mut bytes = b"TENURESN".to_vec();
        bytes.extend_from_slice(&SNAPSHOT_FORMAT_VERSION.to_le_bytes());
        bytes.extend_from_slice(&tail);
        prop_assert!(LeaseStateMachine::read_snapshot(bytes.as_slice(), StateOptions::default()).is_err());
    }
}

/// Issue 25: a snapshot is built from a frozen copy while apply goes on. Whatever is applied
/// after the freeze (acquires, renewals, releases, expiry, session binds and ends, request-id
/// records, enough of each to span several slab and ring chunks), the frozen copy writes exactly
/// the bytes the state had at the freeze, and the live state's own snapshot still restores to
/// itself.
#[test]
fn a_frozen_state_writes_the_moment_it_was_frozen_while_apply_goes_on() {
    const SESSION: u128 = 0x5ca1e;
    let mut h = Harness::with_limits(GroupLimits {
        ttl_ms_min: 100,
        inactive_retention_ms: 5_000,
        ..GroupLimits::default()
    });
    h.open_session(SESSION, "worker", 60_000).unwrap();
    let mut held = Vec::new();
    for i in 0..6_000 {
        if i % 3 == 0 {
            h.acquire_in_session(&format!("s{i}"), "worker", SESSION)
                .unwrap();
        } else {
            held.push((
                format!("r{i}"),
                h.acquire(&format!("r{i}"), "holder", 30_000).unwrap(),
            ));
        }
    }
    let before = h.state.snapshot_to_vec();
    let frozen = h.state.freeze();

    h.advance(1_000);
    for (i, (resource, grant)) in held.iter().enumerate() {
        match i % 4 {
            0 => h.release(resource, grant.lease_id, "holder").map(|_| ()),
            1 => h
                .renew(resource, grant.lease_id, "holder", 40_000)
                .map(|_| ()),
            _ => Ok(()),
        }
        .unwrap();
    }
    for i in 0..3_000 {
        h.acquire(&format!("new{i}"), "holder", 200).unwrap();
    }
    h.close_session(SESSION, "worker").unwrap();
    h.advance(1_000);
    for _ in 0..20 {
        h.apply(Command::Expire { leases_max: 1_000 });
    }

    let mut written = Vec::new();
    frozen.write_snapshot(&mut written).unwrap();
    assert_eq!(written, before, "the frozen copy changed after the freeze");
    let after = h.state.snapshot_to_vec();
    assert_ne!(after, before);
    let restored =
        LeaseStateMachine::read_snapshot(after.as_slice(), StateOptions::default()).unwrap();
    assert_eq!(restored.snapshot_to_vec(), after);
    assert_eq!(restored.stats(), h.state.stats());
}
