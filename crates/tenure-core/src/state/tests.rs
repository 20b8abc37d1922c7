//! Unit tests of the state machine that need crate-private hooks (forced hash collisions in the
//! request-id table). Everything else is tested through the public API in `tests/`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;
use crate::command::{AcquireRequest, Command, CommandResult, Entry, LeaseOp, LeaseReply};

fn state() -> LeaseStateMachine {
    let mut state = LeaseStateMachine::new(GroupId(3), StateOptions::default());
    let limits = GroupLimits {
        ttl_ms_min: 100,
        ..GroupLimits::default()
    };
    state.apply(&Entry {
        log_time_ms: 1,
        command: Command::SetGroupLimits(limits),
    });
    state
}

fn acquire(tenant: &str, resource: &str, holder: &str, request_id: &str) -> LeaseOp {
    LeaseOp::Acquire(AcquireRequest {
        key: ResourceKey::new(tenant, resource),
        holder_id: holder.to_owned(),
        ttl_ms: 10_000,
        request_id: request_id.to_owned(),
    })
}

fn apply_op(state: &mut LeaseStateMachine, at_ms: u64, op: LeaseOp) -> LeaseOutcome {
    let output = state.apply(&Entry {
        log_time_ms: at_ms,
        command: Command::Lease(op),
    });
    state.check_invariants().unwrap();
    match output.result {
        CommandResult::Lease(outcome) => outcome,
        other => panic!("unexpected result {other:?}"),
    }
}

fn granted(outcome: &LeaseOutcome) -> &LeaseGrant {
    match &outcome.result {
        Ok(LeaseReply::Acquired(grant)) => grant,
        other => panic!("expected a grant, got {other:?}"),
    }
}

/// Issue 19 item 6: the request-id table trusted a 128-bit XXH3 digest of (tenant, resource,
/// request id) computed with XXH3's public secret. Two identities whose digests collide (a
/// tenant can search for a collision with another tenant's predictable request id) must still be
/// two records: a hash match that is not an identity match is a miss, never a replay.
#[test]
fn dedup_unkeyed_hash_collision_never_replays_another_tenants_outcome() {
    let mut state = state();
    state.force_dedup_collisions();

    let victim = apply_op(
        &mut state,
        1_000,
        acquire("victim", "db", "worker-1", "req-1"),
    );
    assert!(!victim.replayed);
    let victim_grant = granted(&victim).clone();

    // Same holder and ttl (same fingerprint), other tenant: with a colliding hash it must be a
    // fresh grant of the attacker's own resource, not the victim's outcome.
    let attacker = apply_op(
        &mut state,
        1_100,
        acquire("attacker", "db", "worker-1", "crafted"),
    );
    assert!(
        !attacker.replayed,
        "a colliding identity replayed another tenant's outcome: {attacker:?}"
    );
    let attacker_grant = granted(&attacker).clone();
    assert_ne!(attacker_grant.fencing_token, victim_grant.fencing_token);

    // Another fingerprint with a colliding hash is not a reuse of the request id either.
    let other = apply_op(&mut state, 1_200, acquire("third", "db", "someone", "x"));
    assert!(
        other.result.is_ok(),
        "a colliding identity was refused as a request-id reuse: {other:?}"
    );

    // Both records are kept: each tenant's retry still replays its own outcome.
    let victim_retry = apply_op(
        &mut state,
        1_300,
        acquire("victim", "db", "worker-1", "req-1"),
    );
    assert!(victim_retry.replayed);
    assert_eq!(
        granted(&victim_retry).fencing_token,
        victim_grant.fencing_token
    );
    let attacker_retry = apply_op(
        &mut state,
        1_400,
        acquire("attacker", "db", "worker-1", "crafted"),
    );
    assert!(attacker_retry.replayed);
    assert_eq!(
        granted(&attacker_retry).fencing_token,
        attacker_grant.fencing_token
    );

    // A snapshot round trip keeps both identities (the snapshot names them in full).
    let bytes = state.snapshot_to_vec();
    let mut restored =
        LeaseStateMachine::read_snapshot(&bytes[..], StateOptions::default()).unwrap();
    let again = apply_op(
        &mut restored,
        1_500,
        acquire("victim", "db", "worker-1", "req-1"),
    );
    assert_eq!(granted(&again).fencing_token, victim_grant.fencing_token);
    let fresh = apply_op(
        &mut restored,
        1_600,
        acquire("fourth", "db", "worker-1", "req-1"),
    );
    assert!(!fresh.replayed, "{fresh:?}");
}

fn limited_state(dedup_records_max: u64) -> LeaseStateMachine {
    let mut state = LeaseStateMachine::new(GroupId(3), StateOptions::default());
    let limits = GroupLimits {
        ttl_ms_min: 100,
        dedup_records_max,
        dedup_retention_ms_min: 10_000,
        ..GroupLimits::default()
    };
    state.apply(&Entry {
        log_time_ms: 1,
        command: Command::SetGroupLimits(limits),
    });
    state
}

fn is_dedup_full(outcome: &LeaseOutcome) -> bool {
    matches!(
        outcome.result,
        Err(LeaseError::Overloaded {
            reason: crate::error::OverloadReason::DedupTableFull
        })
    )
}

/// Issue 19 item 7 (its request-id part): the request-id table is shared by every tenant of a
/// group, so one tenant that fills it with young records made every other tenant's requests
/// `OVERLOADED` until the flood aged. A tenant below its fair share must get room (by dropping
/// the flooding tenant's oldest record); the flooding tenant, above its share, is the one
/// refused.
#[test]
fn dedup_table_filled_by_one_tenant_overloads_every_other_tenant() {
    let mut state = limited_state(10);
    for i in 0..10u64 {
        let outcome = apply_op(
            &mut state,
            1_000 + i,
            acquire("flood", &format!("r{i}"), "h", &format!("f{i}")),
        );
        assert!(outcome.result.is_ok(), "{outcome:?}");
    }
    assert_eq!(state.dedup.ring().len(), 10);
    // The table is full of records younger than dedup_retention_ms_min.
    let victim = apply_op(&mut state, 2_000, acquire("victim", "db", "w", "v1"));
    assert!(
        !is_dedup_full(&victim),
        "one tenant's flood of young records refused another tenant: {victim:?}"
    );
    assert!(victim.result.is_ok(), "{victim:?}");
    // The flooding tenant is above its share (9 of 10 with 2 tenants): it is refused.
    let flood = apply_op(&mut state, 2_001, acquire("flood", "more", "h", "f-more"));
    assert!(is_dedup_full(&flood), "{flood:?}");
    // The victim may go on up to its share (5), taking the flood's oldest records.
    for i in 2..=5u64 {
        let outcome = apply_op(
            &mut state,
            2_000 + i,
            acquire("victim", &format!("db{i}"), "w", &format!("v{i}")),
        );
        assert!(outcome.result.is_ok(), "victim record {i}: {outcome:?}");
    }
    let over = apply_op(
        &mut state,
        2_010,
        acquire("victim", "db-over", "w", "v-over"),
    );
    assert!(
        is_dedup_full(&over),
        "at its share the victim waits too: {over:?}"
    );
    // The victim's records replay; the flood's dropped oldest ones are gone, its newest stay.
    let retry = apply_op(&mut state, 2_020, acquire("victim", "db", "w", "v1"));
    assert!(retry.replayed, "{retry:?}");
    let kept = apply_op(&mut state, 2_021, acquire("flood", "r9", "h", "f9"));
    assert!(kept.replayed, "{kept:?}");
    // A snapshot round trip keeps the counts (restore checks them against the ring).
    let bytes = state.snapshot_to_vec();
    LeaseStateMachine::read_snapshot(&bytes[..], StateOptions::default()).unwrap();
}

/// The invariant check reads the ordered indexes in order instead of looking every record up in
/// them: each way they can disagree with the records must still be caught (a missing entry, an
/// entry naming another record's token or an expiry the record is not filed at, an entry for an
/// inactive record), and the key index too, unless the caller built it from the records.
#[test]
fn the_invariant_check_catches_every_index_disagreeing_with_the_records() {
    let mut base = state();
    let mut lease_ids = Vec::new();
    for index in 0..20 {
        let op = acquire("acme", &format!("r{index}"), "h", &format!("q{index}"));
        lease_ids.push(granted(&apply_op(&mut base, 10 + index, op)).lease_id);
    }
    let released = apply_op(
        &mut base,
        100,
        LeaseOp::Release(crate::command::ReleaseRequest {
            key: ResourceKey::new("acme", "r3"),
            lease_id: lease_ids[3],
            holder_id: "h".to_owned(),
            request_id: "rel3".to_owned(),
        }),
    );
    assert!(released.result.is_ok(), "{released:?}");
    base.check_invariants().unwrap();
    base.check_invariants_with(KeyIndexCheck::BuiltFromRecords)
        .unwrap();
    let inactive_slot = base.find_slot(0, "r3").unwrap();
    let slot = base.find_slot(0, "r5").unwrap();
    let record = base.slab.get(slot).unwrap().clone();

    let broken = |change: &dyn Fn(&mut LeaseStateMachine)| {
        let mut state = base.clone();
        change(&mut state);
        state.check_invariants()
    };
    // The tenant index: an entry missing, or naming the slot with another token.
    let missing_tenant = broken(&|state| {
        state
            .by_tenant
            .remove(&(record.tenant, record.fencing_token, slot));
    });
    assert!(missing_tenant.is_err(), "{missing_tenant:?}");
    let wrong_token = broken(&|state| {
        state
            .by_tenant
            .remove(&(record.tenant, record.fencing_token, slot));
        state
            .by_tenant
            .insert((record.tenant, record.fencing_token + 1_000, slot));
    });
    assert!(wrong_token.is_err(), "{wrong_token:?}");
    // The expiry index: an entry missing, filed at another time, or naming an inactive record.
    let missing_expiry = broken(&|state| {
        state.by_expiry.remove(&(record.indexed_expiry_ms, slot));
    });
    assert!(missing_expiry.is_err(), "{missing_expiry:?}");
    let moved_expiry = broken(&|state| {
        state.by_expiry.remove(&(record.indexed_expiry_ms, slot));
        state.by_expiry.insert((record.indexed_expiry_ms + 1, slot));
    });
    assert!(moved_expiry.is_err(), "{moved_expiry:?}");
    let inactive_in_expiry = broken(&|state| {
        state.by_expiry.remove(&(record.indexed_expiry_ms, slot));
        state.by_expiry.insert((1, inactive_slot));
    });
    assert!(inactive_in_expiry.is_err(), "{inactive_in_expiry:?}");
    // The key index: a key found at no slot is caught by the lookup; its size always.
    let mut unfindable = base.clone();
    let hash = unfindable
        .hash_builder
        .hash_one((record.tenant, record.resource_id.as_str()));
    if let Ok(entry) = unfindable.by_key.find_entry(hash, |&s| s == slot) {
        entry.remove();
    }
    unfindable.by_key.insert_unique(0x5eed, slot, |_| 0x5eed);
    assert!(unfindable.check_invariants().is_err());
    let mut shrunk = base.clone();
    if let Ok(entry) = shrunk.by_key.find_entry(hash, |&s| s == slot) {
        entry.remove();
    }
    assert!(
        shrunk
            .check_invariants_with(KeyIndexCheck::BuiltFromRecords)
            .is_err()
    );
}
