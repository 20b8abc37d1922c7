//! FIFO wait queues in one group: AcquireWait queues while the resource is held; a release,
//! an expiry or a session's end hands the resource to the first live waiter in the same apply;
//! timeouts and cancels; retries that find the grant or the position; bounds; snapshots; and a
//! property test with independent checks (single holder, FIFO among live waiters, no grant to
//! a dead waiter, replicas and restored snapshots decide identically).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::common;

use common::{GROUP, Harness, TENANT, key, session_open_op};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use tenure_core::{
    ApplyOutput, Command, CommandResult, Entry, ErrorCode, GroupLimits, LeaseError, LeaseGrant,
    LeaseOp, LeaseOutcome, LeaseReply, LeaseStateMachine, LeaseStatus, NegativeControl,
    QueuedReceipt, QuotaKind, RESOURCE_WAITERS_MAX, ReleaseRequest, SessionId, SessionRequest,
    StateOptions, TenantPolicy, WaitAcquireRequest, WaitCancelReceipt, WaitCancelRequest,
    WaitEndReason, WaitLease,
};

fn limits() -> GroupLimits {
    GroupLimits {
        ttl_ms_min: 100,
        inactive_retention_ms: 5_000,
        expire_batch_max: 10,
        ..GroupLimits::default()
    }
}

fn harness() -> Harness {
    Harness::with_limits(limits())
}

fn wait_op(resource: &str, holder: &str, lease: WaitLease, wait_ms: u64, request: &str) -> LeaseOp {
    LeaseOp::AcquireWait(WaitAcquireRequest {
        key: key(resource),
        holder_id: holder.to_owned(),
        lease,
        wait_ms,
        request_id: request.to_owned(),
    })
}

fn ttl(ttl_ms: u64) -> WaitLease {
    WaitLease::Ttl { ttl_ms }
}

fn cancel_op(resource: &str, holder: &str, request: &str) -> LeaseOp {
    LeaseOp::WaitCancel(WaitCancelRequest {
        key: key(resource),
        holder_id: holder.to_owned(),
        request_id: request.to_owned(),
    })
}

fn release_op(resource: &str, grant: &LeaseGrant, holder: &str, request: &str) -> LeaseOp {
    LeaseOp::Release(ReleaseRequest {
        key: key(resource),
        lease_id: grant.lease_id,
        holder_id: holder.to_owned(),
        request_id: request.to_owned(),
    })
}

fn lease_op(h: &mut Harness, op: LeaseOp) -> (LeaseOutcome, ApplyOutput) {
    let out = h.apply(Command::Lease(op));
    match &out.result {
        CommandResult::Lease(outcome) => (outcome.clone(), out),
        other => panic!("unexpected result {other:?}"),
    }
}

fn queued(outcome: &LeaseOutcome) -> &QueuedReceipt {
    match &outcome.result {
        Ok(LeaseReply::Queued(receipt)) => receipt,
        other => panic!("expected a queue position, got {other:?}"),
    }
}

fn granted(outcome: &LeaseOutcome) -> &LeaseGrant {
    match &outcome.result {
        Ok(LeaseReply::Acquired(grant)) => grant,
        other => panic!("expected a grant, got {other:?}"),
    }
}

fn expire(h: &mut Harness) -> ApplyOutput {
    h.apply(Command::Expire { leases_max: 100 })
}

#[test]
fn a_release_hands_the_resource_to_the_first_waiter_in_the_same_apply() {
    let mut h = harness();
    let (first, _) = lease_op(&mut h, wait_op("job", "a", ttl(1_000), 5_000, "a-1"));
    let held = granted(&first).clone();
    // A free resource is granted at once, like Acquire.
    assert!(held.created);

    h.advance(10);
    let (b, _) = lease_op(&mut h, wait_op("job", "b", ttl(2_000), 5_000, "b-1"));
    let b = queued(&b).clone();
    assert_eq!((b.position, b.waiters), (0, 1));
    assert_eq!(b.holder_id, "a");
    assert_eq!(b.wait_until_ms, h.now_ms + 5_000);
    h.advance(10);
    let (c, _) = lease_op(&mut h, wait_op("job", "c", ttl(2_000), 5_000, "c-1"));
    assert_eq!((queued(&c).position, queued(&c).waiters), (1, 2));

    h.advance(100);
    let (released, out) = lease_op(&mut h, release_op("job", &held, "a", "a-rel"));
    assert!(matches!(released.result, Ok(LeaseReply::Released(_))));
    assert_eq!(out.waits_ended.len(), 1, "{:?}", out.waits_ended);
    let handed = &out.waits_ended[0];
    assert_eq!(
        (handed.holder_id.as_str(), handed.request_id.as_str()),
        ("b", "b-1")
    );
    assert_eq!(handed.previous_fencing_token, Some(held.fencing_token));
    let Ok(LeaseReply::Acquired(grant)) = &handed.outcome else {
        panic!("hand-off answered {:?}", handed.outcome);
    };
    assert!(grant.fencing_token > held.fencing_token);
    assert_eq!(grant.log_time_ms, h.now_ms);
    assert_eq!(grant.expires_at_ms, h.now_ms + 2_000);
    let view = h.get("job").unwrap();
    assert_eq!(
        (view.holder_id.as_str(), view.status),
        ("b", LeaseStatus::Active)
    );
    assert_eq!(view.fencing_token, grant.fencing_token);

    // A retry of b's request id finds the grant (a replay), never a second place.
    h.advance(5);
    let (retry, _) = lease_op(&mut h, wait_op("job", "b", ttl(2_000), 4_000, "b-1"));
    assert!(retry.replayed);
    assert_eq!(granted(&retry), grant);
    // c moved up.
    let (c_retry, _) = lease_op(&mut h, wait_op("job", "c", ttl(2_000), 5_000, "c-1"));
    assert!(!c_retry.replayed);
    assert_eq!(
        (queued(&c_retry).position, queued(&c_retry).waiters),
        (0, 1)
    );
    assert_eq!(queued(&c_retry).holder_id, "b");
}

#[test]
fn an_expiry_hands_off_and_an_acquire_never_overtakes_the_queue() {
    let mut h = harness();
    let (first, _) = lease_op(&mut h, wait_op("job", "a", ttl(500), 5_000, "a-1"));
    let held = granted(&first).clone();
    lease_op(&mut h, wait_op("job", "b", ttl(700), 5_000, "b-1"));

    // Past a's expiry, before any Expire entry: a plain Acquire must not take the resource
    // from the waiter; the lease goes to b in this apply and the Acquire finds it held.
    h.advance(600);
    let acquire = h.acquire_op("job", "intruder", 1_000);
    let (outcome, out) = lease_op(&mut h, acquire);
    match &outcome.result {
        Err(LeaseError::AlreadyHeld { holder_id, .. }) => assert_eq!(holder_id, "b"),
        other => panic!("the acquire answered {other:?}"),
    }
    assert_eq!(out.reclaimed.len(), 1);
    assert_eq!(out.reclaimed[0].fencing_token, held.fencing_token);
    assert_eq!(out.waits_ended.len(), 1);
    assert_eq!(out.waits_ended[0].holder_id, "b");

    // b's lease expires in turn; with nobody waiting, the Expire entry just reclaims it.
    h.advance(700);
    let out = expire(&mut h);
    assert_eq!(out.reclaimed.len(), 1);
    assert!(out.waits_ended.is_empty());
    assert_eq!(h.get("job").unwrap().status, LeaseStatus::Expired);

    // An Expire entry hands off too.
    let (c, _) = lease_op(&mut h, wait_op("job", "c", ttl(500), 5_000, "c-1"));
    let c_grant = granted(&c).clone();
    lease_op(&mut h, wait_op("job", "d", ttl(500), 5_000, "d-1"));
    h.advance(500);
    let out = expire(&mut h);
    assert_eq!(out.reclaimed.len(), 1);
    assert_eq!(out.reclaimed[0].fencing_token, c_grant.fencing_token);
    assert_eq!(out.waits_ended.len(), 1);
    assert_eq!(out.waits_ended[0].holder_id, "d");
    assert_eq!(h.get("job").unwrap().holder_id, "d");
}

#[test]
fn dead_waiters_are_skipped_and_timeouts_end_waits() {
    let mut h = harness();
    let (first, _) = lease_op(&mut h, wait_op("job", "a", ttl(5_000), 5_000, "a-1"));
    let held = granted(&first).clone();
    // b waits in a session that will end; c and e wait only briefly; d waits long.
    h.op(session_open_op(0xb, "b", 1_000)).result.unwrap();
    let session = WaitLease::Session {
        session_id: SessionId(0xb),
    };
    queued(&lease_op(&mut h, wait_op("job", "b", session, 9_000, "b-1")).0);
    queued(&lease_op(&mut h, wait_op("job", "c", ttl(1_000), 1_500, "c-1")).0);
    queued(&lease_op(&mut h, wait_op("job", "e", ttl(1_000), 2_000, "e-1")).0);
    queued(&lease_op(&mut h, wait_op("job", "d", ttl(1_000), 9_000, "d-1")).0);

    // The session ends (closed): b's wait ends with it, in the same apply.
    let (_, out) = lease_op(
        &mut h,
        LeaseOp::SessionClose(SessionRequest {
            tenant_id: TENANT.to_owned(),
            group_id: GROUP,
            session_id: SessionId(0xb),
            owner_id: "b".to_owned(),
        }),
    );
    assert_eq!(out.waits_ended.len(), 1);
    assert_eq!(out.waits_ended[0].holder_id, "b");
    assert_eq!(
        out.waits_ended[0].outcome,
        Err(LeaseError::WaitEnded {
            reason: WaitEndReason::SessionEnded
        })
    );
    // c's wait passes; an Expire entry drops c (timed out).
    h.advance(1_500);
    let out = expire(&mut h);
    assert_eq!(out.waits_ended.len(), 1);
    assert_eq!(out.waits_ended[0].holder_id, "c");
    assert_eq!(
        out.waits_ended[0].outcome,
        Err(LeaseError::WaitEnded {
            reason: WaitEndReason::TimedOut
        })
    );
    // A retry of c's request id replays the end of its wait (code ALREADY_HELD).
    let (retry, _) = lease_op(&mut h, wait_op("job", "c", ttl(1_000), 1_500, "c-1"));
    assert!(retry.replayed);
    assert_eq!(retry.result.unwrap_err().code(), ErrorCode::AlreadyHeld);

    // e's wait passes too, with no Expire entry yet: the release skips e (dead) and hands the
    // resource to d.
    h.advance(600);
    let (_, out) = lease_op(&mut h, release_op("job", &held, "a", "a-rel"));
    let ended: Vec<_> = out
        .waits_ended
        .iter()
        .map(|w| (w.holder_id.as_str(), w.outcome.is_ok()))
        .collect();
    assert_eq!(ended, [("e", false), ("d", true)]);
    assert_eq!(
        out.waits_ended[0].outcome,
        Err(LeaseError::WaitEnded {
            reason: WaitEndReason::TimedOut
        })
    );
    assert_eq!(h.get("job").unwrap().holder_id, "d");
}

#[test]
fn a_session_waiter_gets_a_lease_bound_to_its_session() {
    let mut h = harness();
    let (first, _) = lease_op(&mut h, wait_op("job", "a", ttl(5_000), 5_000, "a-1"));
    let held = granted(&first).clone();
    h.op(session_open_op(0xb, "b", 1_000)).result.unwrap();
    let session = WaitLease::Session {
        session_id: SessionId(0xb),
    };
    queued(&lease_op(&mut h, wait_op("job", "b", session, 9_000, "b-1")).0);
    // Another owner cannot wait in b's session.
    let (other, _) = lease_op(&mut h, wait_op("job", "x", session, 9_000, "x-1"));
    assert_eq!(other.result.unwrap_err().code(), ErrorCode::InvalidArgument);

    h.advance(100);
    let (_, out) = lease_op(&mut h, release_op("job", &held, "a", "a-rel"));
    let Ok(LeaseReply::Acquired(grant)) = &out.waits_ended[0].outcome else {
        panic!("{:?}", out.waits_ended);
    };
    let view = h.get("job").unwrap();
    assert_eq!(view.session_id, Some(SessionId(0xb)));
    assert_eq!(grant.expires_at_ms, view.expires_at_ms);
    // The lease lives as long as the session: it ends when the session is closed.
    h.op(LeaseOp::SessionClose(SessionRequest {
        tenant_id: TENANT.to_owned(),
        group_id: GROUP,
        session_id: SessionId(0xb),
        owner_id: "b".to_owned(),
    }))
    .result
    .unwrap();
    assert_eq!(h.get("job").unwrap().status, LeaseStatus::Expired);
}

#[test]
fn a_session_waiter_leaves_the_queue_when_its_session_ends() {
    let mut h = harness();
    let (first, _) = lease_op(&mut h, wait_op("job", "a", ttl(5_000), 5_000, "a-1"));
    granted(&first);
    h.op(session_open_op(0xb, "b", 1_000)).result.unwrap();
    let session = WaitLease::Session {
        session_id: SessionId(0xb),
    };
    queued(&lease_op(&mut h, wait_op("job", "b", session, 9_000, "b-1")).0);
    queued(&lease_op(&mut h, wait_op("job", "c", ttl(1_000), 9_000, "c-1")).0);
    // b's session closes: its wait ends in the same apply, and c moves up.
    let (_, out) = lease_op(
        &mut h,
        LeaseOp::SessionClose(SessionRequest {
            tenant_id: TENANT.to_owned(),
            group_id: GROUP,
            session_id: SessionId(0xb),
            owner_id: "b".to_owned(),
        }),
    );
    assert_eq!(out.waits_ended.len(), 1, "{:?}", out.waits_ended);
    assert_eq!(out.waits_ended[0].request_id, "b-1");
    assert_eq!(
        out.waits_ended[0].outcome,
        Err(LeaseError::WaitEnded {
            reason: WaitEndReason::SessionEnded
        })
    );
    let (c, _) = lease_op(&mut h, wait_op("job", "c", ttl(1_000), 9_000, "c-1"));
    assert_eq!(queued(&c).position, 0);
    h.state.check_invariants().unwrap();
}

#[test]
fn cancel_leaves_the_queue_and_reports_a_grant_that_came_first() {
    let mut h = harness();
    let (first, _) = lease_op(&mut h, wait_op("job", "a", ttl(5_000), 5_000, "a-1"));
    let held = granted(&first).clone();
    queued(&lease_op(&mut h, wait_op("job", "b", ttl(1_000), 9_000, "b-1")).0);
    queued(&lease_op(&mut h, wait_op("job", "c", ttl(1_000), 9_000, "c-1")).0);

    // Only the waiter's holder may cancel it.
    let (wrong, _) = lease_op(&mut h, cancel_op("job", "c", "b-1"));
    assert_eq!(wrong.result.unwrap_err().code(), ErrorCode::InvalidArgument);
    let (cancel, out) = lease_op(&mut h, cancel_op("job", "b", "b-1"));
    assert_eq!(
        cancel.result,
        Ok(LeaseReply::WaitCancelled(WaitCancelReceipt {
            cancelled: true,
            granted: None
        }))
    );
    assert_eq!(out.waits_ended.len(), 1);
    // Idempotent: a second cancel finds nothing; a retry of the wait replays its end.
    let (again, _) = lease_op(&mut h, cancel_op("job", "b", "b-1"));
    assert_eq!(
        again.result,
        Ok(LeaseReply::WaitCancelled(WaitCancelReceipt {
            cancelled: false,
            granted: None
        }))
    );
    let (retry, _) = lease_op(&mut h, wait_op("job", "b", ttl(1_000), 9_000, "b-1"));
    assert!(retry.replayed);
    assert_eq!(
        retry.result,
        Err(LeaseError::WaitEnded {
            reason: WaitEndReason::Cancelled
        })
    );

    // c is next; a cancel that arrives after its hand-off reports the grant.
    let (_, out) = lease_op(&mut h, release_op("job", &held, "a", "a-rel"));
    let Ok(LeaseReply::Acquired(grant)) = out.waits_ended[0].outcome.clone() else {
        panic!("{:?}", out.waits_ended);
    };
    let (late, _) = lease_op(&mut h, cancel_op("job", "c", "c-1"));
    assert_eq!(
        late.result,
        Ok(LeaseReply::WaitCancelled(WaitCancelReceipt {
            cancelled: false,
            granted: Some(grant)
        }))
    );
}

#[test]
fn a_cancel_that_comes_before_its_wait_keeps_the_late_wait_out_of_the_queue() {
    let mut h = harness();
    let (first, _) = lease_op(&mut h, wait_op("job", "a", ttl(5_000), 5_000, "a-1"));
    granted(&first);
    // d gave up on an attempt still on its way: its cancel is applied first.
    let (cancel, out) = lease_op(&mut h, cancel_op("job", "d", "d-1"));
    assert_eq!(
        cancel.result,
        Ok(LeaseReply::WaitCancelled(WaitCancelReceipt {
            cancelled: false,
            granted: None
        }))
    );
    assert!(out.waits_ended.is_empty());
    // The wait arrives late: refused, not queued (nobody waits for it any more).
    let (late, out) = lease_op(&mut h, wait_op("job", "d", ttl(1_000), 9_000, "d-1"));
    assert_eq!(
        late.result.unwrap_err().code(),
        ErrorCode::InvalidArgument,
        "the late wait is a request-id conflict"
    );
    assert!(out.waits_ended.is_empty());
    // The queue stays empty: another waiter is first in line.
    let (next, _) = lease_op(&mut h, wait_op("job", "e", ttl(1_000), 9_000, "e-1"));
    assert_eq!(queued(&next).position, 0);
}

#[test]
fn retries_never_take_a_second_place_and_reuse_is_refused() {
    let mut h = harness();
    lease_op(&mut h, wait_op("job", "a", ttl(5_000), 5_000, "a-1"));
    queued(&lease_op(&mut h, wait_op("job", "b", ttl(1_000), 9_000, "b-1")).0);
    for _ in 0..3 {
        h.advance(10);
        let (retry, _) = lease_op(&mut h, wait_op("job", "b", ttl(1_000), 8_000, "b-1"));
        assert_eq!((queued(&retry).position, queued(&retry).waiters), (0, 1));
    }
    // The same request id for another holder or ttl is a conflict, never a second waiter.
    let (reuse, _) = lease_op(&mut h, wait_op("job", "b", ttl(2_000), 9_000, "b-1"));
    assert_eq!(reuse.result.unwrap_err().code(), ErrorCode::InvalidArgument);
    // So is another operation with a queued wait's request id (it would be recorded beside the
    // waiter, whose outcome is recorded under that id when the wait ends).
    let acquire = common::acquire_op("job", "b", 1_000, "b-1");
    let (reuse, _) = lease_op(&mut h, acquire);
    assert_eq!(reuse.result.unwrap_err().code(), ErrorCode::InvalidArgument);
    let (still, _) = lease_op(&mut h, wait_op("job", "b", ttl(1_000), 8_000, "b-1"));
    assert_eq!(queued(&still).position, 0);
    // Not re-entrant: the holder cannot wait for its own resource.
    let (own, _) = lease_op(&mut h, wait_op("job", "a", ttl(1_000), 9_000, "a-2"));
    assert_eq!(own.result.unwrap_err().code(), ErrorCode::AlreadyHeld);
    // Bad waits are refused with the bound named.
    for wait_ms in [0, 3_600_001] {
        let (bad, _) = lease_op(&mut h, wait_op("job", "z", ttl(1_000), wait_ms, "z-1"));
        assert_eq!(bad.result.unwrap_err().code(), ErrorCode::InvalidArgument);
    }
}

#[test]
fn queues_are_bounded_per_resource_and_per_tenant() {
    let mut h = harness();
    lease_op(&mut h, wait_op("job", "a", ttl(5_000), 5_000, "a-1"));
    for i in 0..RESOURCE_WAITERS_MAX {
        let (outcome, _) = lease_op(
            &mut h,
            wait_op("job", &format!("w{i}"), ttl(1_000), 9_000, &format!("w{i}")),
        );
        queued(&outcome);
    }
    let (full, _) = lease_op(&mut h, wait_op("job", "late", ttl(1_000), 9_000, "late"));
    assert!(matches!(
        full.result,
        Err(LeaseError::QuotaExceeded {
            kind: QuotaKind::ResourceWaiters,
            ..
        })
    ));

    let mut h = harness();
    h.apply(Command::SetTenantPolicy {
        tenant_id: TENANT.to_owned(),
        policy: TenantPolicy {
            active_leases_max: Some(3),
            ..TenantPolicy::default()
        },
    });
    lease_op(&mut h, wait_op("job", "a", ttl(5_000), 5_000, "a-1"));
    for i in 0..3 {
        queued(
            &lease_op(
                &mut h,
                wait_op("job", &format!("w{i}"), ttl(1_000), 9_000, &format!("w{i}")),
            )
            .0,
        );
    }
    let (full, _) = lease_op(&mut h, wait_op("job", "late", ttl(1_000), 9_000, "late"));
    assert!(matches!(
        full.result,
        Err(LeaseError::QuotaExceeded {
            kind: QuotaKind::TenantWaiters,
            limit: 3
        })
    ));
}

#[test]
fn snapshots_carry_the_queues_and_restored_replicas_hand_off_identically() {
    let mut h = harness();
    let (first, _) = lease_op(&mut h, wait_op("job", "a", ttl(5_000), 5_000, "a-1"));
    let held = granted(&first).clone();
    h.op(session_open_op(0xb, "b", 3_000)).result.unwrap();
    let session = WaitLease::Session {
        session_id: SessionId(0xb),
    };
    queued(&lease_op(&mut h, wait_op("job", "b", session, 9_000, "b-1")).0);
    queued(&lease_op(&mut h, wait_op("job", "c", ttl(1_000), 9_000, "c-1")).0);
    lease_op(&mut h, wait_op("other", "c", ttl(1_000), 9_000, "c-2"));
    queued(&lease_op(&mut h, wait_op("other", "d", ttl(1_000), 700, "d-1")).0);

    let bytes = h.state.snapshot_to_vec();
    let mut restored = LeaseStateMachine::read_snapshot(
        bytes.as_slice(),
        StateOptions {
            hash_seed: 99,
            ..StateOptions::default()
        },
    )
    .unwrap();
    assert_eq!(restored.snapshot_to_vec(), bytes);
    let mut entries = Vec::new();
    h.advance(800);
    entries.push(Entry {
        log_time_ms: h.now_ms,
        command: Command::Expire { leases_max: 10 },
    });
    entries.push(Entry {
        log_time_ms: h.now_ms,
        command: Command::Lease(release_op("job", &held, "a", "a-rel")),
    });
    for entry in &entries {
        let original = h.state.apply(entry);
        let copy = restored.apply(entry);
        assert_eq!(original, copy);
        assert_eq!(h.state.snapshot_to_vec(), restored.snapshot_to_vec());
    }
    assert_eq!(h.get("job").unwrap().holder_id, "b");
}

#[test]
fn a_corrupt_waiter_frame_is_refused() {
    let mut h = harness();
    lease_op(&mut h, wait_op("job", "a", ttl(5_000), 5_000, "a-1"));
    queued(&lease_op(&mut h, wait_op("job", "b", ttl(1_000), 9_000, "b-1")).0);
    let bytes = h.state.snapshot_to_vec();
    // Flip each byte of the tail (the waiter frames and the checksum): always a typed error.
    for at in bytes.len().saturating_sub(80)..bytes.len() {
        let mut bad = bytes.clone();
        bad[at] ^= 0x41;
        assert!(LeaseStateMachine::read_snapshot(bad.as_slice(), StateOptions::default()).is_err());
    }
}

// ---------------------------------------------------------------- property test

#[derive(Debug, Clone)]
enum Step {
    Wait {
        resource: usize,
        holder: usize,
        session: bool,
        ttl_ms: u64,
        wait_ms: u64,
        request: usize,
    },
    Acquire {
        resource: usize,
        holder: usize,
        ttl_ms: u64,
    },
    Release {
        resource: usize,
    },
    Cancel {
        resource: usize,
        holder: usize,
        request: usize,
    },
    Open {
        holder: usize,
        ttl_ms: u64,
    },
    KeepAlive {
        holder: usize,
    },
    Close {
        holder: usize,
    },
    Expire(u32),
    Advance(u64),
    Snapshot,
}

const RESOURCES: usize = 2;
const HOLDERS: usize = 5;
const REQUESTS: usize = 6;

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        8 => (0..RESOURCES, 0..HOLDERS, any::<bool>(), prop_oneof![Just(100u64), Just(300), Just(1_000)],
              prop_oneof![Just(50u64), Just(400), Just(3_000)], 0..REQUESTS)
            .prop_map(|(resource, holder, session, ttl_ms, wait_ms, request)| Step::Wait {
                resource, holder, session, ttl_ms, wait_ms, request
            }),
        2 => (0..RESOURCES, 0..HOLDERS, prop_oneof![Just(100u64), Just(500)])
            .prop_map(|(resource, holder, ttl_ms)| Step::Acquire { resource, holder, ttl_ms }),
        4 => (0..RESOURCES).prop_map(|resource| Step::Release { resource }),
        2 => (0..RESOURCES, 0..HOLDERS, 0..REQUESTS)
            .prop_map(|(resource, holder, request)| Step::Cancel { resource, holder, request }),
        2 => (0..HOLDERS, prop_oneof![Just(200u64), Just(1_000)])
            .prop_map(|(holder, ttl_ms)| Step::Open { holder, ttl_ms }),
        2 => (0..HOLDERS).prop_map(|holder| Step::KeepAlive { holder }),
        1 => (0..HOLDERS).prop_map(|holder| Step::Close { holder }),
        3 => prop_oneof![Just(1u32), Just(3), Just(50)].prop_map(Step::Expire),
        4 => prop_oneof![Just(1u64), Just(60), Just(250), Just(900)].prop_map(Step::Advance),
        1 => Just(Step::Snapshot),
    ]
}

/// What the checker knows of one queued waiter (from real outputs only).
#[derive(Debug, Clone)]
struct Queued {
    sequence: u64,
    holder: String,
    wait_until_ms: u64,
    session: Option<u128>,
}

/// An independent checker of waits, fed only with real outputs.
#[derive(Default)]
struct WaitChecker {
    /// Per resource: the lease believed current (token, holder, end: `None` while a session
    /// decides it) and the waiters queued, by request id.
    current: BTreeMap<String, (u64, String)>,
    queued: BTreeMap<String, BTreeMap<String, Queued>>,
    next_sequence: u64,
    /// Each session's end as the outputs say (the expiry of its last keep-alive, or its
    /// close); a session without an entry never opened.
    session_end_ms: BTreeMap<u128, u64>,
    hand_offs: u64,
}

impl WaitChecker {
    fn session_alive(&self, session: u128, now_ms: u64) -> bool {
        self.session_end_ms
            .get(&session)
            .is_some_and(|&end| now_ms < end)
    }

    fn observe(
        &mut self,
        now_ms: u64,
        state: &LeaseStateMachine,
        out: &ApplyOutput,
    ) -> Result<(), String> {
        for ended in &out.waits_ended {
            let resource = ended.resource_id.to_string();
            let mut queue = self.queued.remove(&resource).unwrap_or_default();
            let Some(waiter) = queue.remove(ended.request_id.as_str()) else {
                return Err(format!(
                    "wait {} ended but was never queued",
                    ended.request_id
                ));
            };
            let queue_view = queue.clone();
            if !queue.is_empty() {
                self.queued.insert(resource.clone(), queue);
            }
            let queue = queue_view;
            if let Ok(LeaseReply::Acquired(grant)) = &ended.outcome {
                self.hand_offs += 1;
                // No grant to a dead waiter.
                if now_ms >= waiter.wait_until_ms {
                    return Err(format!("granted {} after its wait ended", waiter.holder));
                }
                if let Some(session) = waiter.session
                    && !self.session_alive(session, now_ms)
                {
                    return Err(format!("granted {} whose session had ended", waiter.holder));
                }
                // FIFO among live waiters: everyone queued earlier has left the queue already.
                let earlier: Vec<_> = queue
                    .values()
                    .filter(|w| w.sequence < waiter.sequence)
                    .filter(|w| {
                        now_ms < w.wait_until_ms
                            && w.session.is_none_or(|s| self.session_alive(s, now_ms))
                    })
                    .map(|w| w.holder.clone())
                    .collect();
                if !earlier.is_empty() {
                    return Err(format!(
                        "{} overtook live waiters {earlier:?}",
                        waiter.holder
                    ));
                }
                // Hand-off only after the previous lease ended, with a larger token.
                if let Some((token, _)) = self.current.get(&resource)
                    && grant.fencing_token <= *token
                {
                    return Err("a hand-off did not raise the token".into());
                }
                self.current.insert(
                    resource.clone(),
                    (grant.fencing_token, waiter.holder.clone()),
                );
            }
        }
        // The state agrees that whoever the checker believes current is the holder.
        for (resource, (token, holder)) in &self.current {
            if let Some(view) = state.get(&key(resource), now_ms).unwrap()
                && view.fencing_token == *token
                && view.holder_id != *holder
            {
                return Err(format!(
                    "{resource}: holder {} but {holder} was granted",
                    view.holder_id
                ));
            }
        }
        Ok(())
    }
}

fn holder_name(holder: usize) -> String {
    format!("h{holder}")
}

fn resource_name(resource: usize) -> String {
    format!("r{resource}")
}

fn run_steps(steps: &[Step], control: NegativeControl) -> Result<(), TestCaseError> {
    let options = StateOptions {
        negative_control: control,
        ..StateOptions::default()
    };
    let mut a = Harness::with_options(limits(), options);
    let mut b = Harness::with_options(limits(), options);
    let mut checker = WaitChecker::default();
    let mut grants: BTreeMap<usize, (LeaseGrant, String)> = BTreeMap::new();
    let mut request_counter = 0u64;
    for step in steps {
        let command = match step {
            Step::Advance(ms) => {
                a.advance(*ms);
                b.advance(*ms);
                continue;
            }
            Step::Snapshot => {
                let bytes = a.state.snapshot_to_vec();
                let restored = LeaseStateMachine::read_snapshot(
                    bytes.as_slice(),
                    StateOptions {
                        hash_seed: request_counter,
                        ..options
                    },
                )
                .map_err(|err| TestCaseError::fail(err.to_string()))?;
                prop_assert_eq!(restored.snapshot_to_vec(), b.state.snapshot_to_vec());
                HAND_OFFS.fetch_add(checker.hand_offs, Ordering::Relaxed);
                checker.hand_offs = 0;
                a.state = restored;
                continue;
            }
            Step::Expire(n) => Command::Expire { leases_max: *n },
            Step::Wait {
                resource,
                holder,
                session,
                ttl_ms,
                wait_ms,
                request,
            } => {
                let lease = if *session {
                    WaitLease::Session {
                        session_id: SessionId(*holder as u128 + 1),
                    }
                } else {
                    WaitLease::Ttl { ttl_ms: *ttl_ms }
                };
                // The request id names the holder, so reuse conflicts stay rare but possible.
                Command::Lease(wait_op(
                    &resource_name(*resource),
                    &holder_name(*holder),
                    lease,
                    *wait_ms,
                    &format!("w{request}-{holder}"),
                ))
            }
            Step::Acquire {
                resource,
                holder,
                ttl_ms,
            } => {
                request_counter += 1;
                Command::Lease(common::acquire_op(
                    &resource_name(*resource),
                    &holder_name(*holder),
                    *ttl_ms,
                    &format!("acq-{request_counter}"),
                ))
            }
            Step::Release { resource } => {
                let Some((grant, holder)) = grants.get(resource) else {
                    continue;
                };
                request_counter += 1;
                Command::Lease(release_op(
                    &resource_name(*resource),
                    grant,
                    holder,
                    &format!("rel-{request_counter}"),
                ))
            }
            Step::Cancel {
                resource,
                holder,
                request,
            } => Command::Lease(cancel_op(
                &resource_name(*resource),
                &holder_name(*holder),
                &format!("w{request}-{holder}"),
            )),
            Step::Open { holder, ttl_ms } => {
                Command::Lease(LeaseOp::SessionOpen(tenure_core::SessionOpenRequest {
                    tenant_id: TENANT.to_owned(),
                    group_id: GROUP,
                    session_id: SessionId(*holder as u128 + 1),
                    owner_id: holder_name(*holder),
                    ttl_ms: *ttl_ms,
                }))
            }
            Step::KeepAlive { holder } | Step::Close { holder } => {
                let request = SessionRequest {
                    tenant_id: TENANT.to_owned(),
                    group_id: GROUP,
                    session_id: SessionId(*holder as u128 + 1),
                    owner_id: holder_name(*holder),
                };
                if matches!(step, Step::Close { .. }) {
                    Command::Lease(LeaseOp::SessionClose(request))
                } else {
                    Command::Lease(LeaseOp::SessionKeepAlive(request))
                }
            }
        };
        let now_ms = a.now_ms;
        let out_a = a.apply(command.clone());
        let out_b = b.apply(command.clone());
        prop_assert_eq!(&out_a, &out_b, "replicas disagree on {:?}", step);
        checker
            .observe(now_ms, &a.state, &out_a)
            .map_err(TestCaseError::fail)?;

        // Feed the checker: queued waits, ended sessions, grants.
        if let CommandResult::Lease(outcome) = &out_a.result {
            match (&command, &outcome.result) {
                (Command::Lease(LeaseOp::AcquireWait(r)), Ok(LeaseReply::Queued(receipt))) => {
                    let queue = checker.queued.entry(r.key.resource_id.clone()).or_default();
                    if !queue.contains_key(&r.request_id) {
                        checker.next_sequence += 1;
                        queue.insert(
                            r.request_id.clone(),
                            Queued {
                                sequence: checker.next_sequence,
                                holder: r.holder_id.clone(),
                                wait_until_ms: receipt.wait_until_ms,
                                session: match r.lease {
                                    WaitLease::Session { session_id } => Some(session_id.0),
                                    WaitLease::Ttl { .. } => None,
                                },
                            },
                        );
                    }
                    prop_assert_eq!(receipt.waiters as usize, queue.len());
                }
                (Command::Lease(op), Ok(LeaseReply::Acquired(grant))) if !outcome.replayed => {
                    let resource = op.key().unwrap().resource_id.clone();
                    if let Some((token, _)) = checker.current.get(&resource) {
                        prop_assert!(grant.fencing_token > *token);
                    }
                    checker
                        .current
                        .insert(resource, (grant.fencing_token, op.holder_id().to_owned()));
                }
                (Command::Lease(LeaseOp::SessionClose(r)), Ok(_)) => {
                    checker.session_end_ms.insert(r.session_id.0, now_ms);
                }
                (Command::Lease(_), Ok(LeaseReply::SessionKept(kept))) => {
                    checker
                        .session_end_ms
                        .insert(kept.session_id.0, kept.expires_at_ms);
                }
                _ => {}
            }
        }
        // Track the current grant per resource for releases, from the state.
        for resource in 0..RESOURCES {
            match a.state.get(&key(&resource_name(resource)), now_ms).unwrap() {
                Some(view) if view.status == LeaseStatus::Active => {
                    let grant = LeaseGrant {
                        lease_id: view.lease_id,
                        fencing_token: view.fencing_token,
                        log_time_ms: now_ms,
                        expires_at_ms: view.expires_at_ms,
                        ttl_ms: view.ttl_ms,
                        created: true,
                    };
                    grants.insert(resource, (grant, view.holder_id.clone()));
                }
                _ => {
                    grants.remove(&resource);
                }
            }
        }
    }
    HAND_OFFS.fetch_add(checker.hand_offs, Ordering::Relaxed);
    Ok(())
}

static HAND_OFFS: AtomicU64 = AtomicU64::new(0);

#[test]
fn property_waits_hand_off_fifo_to_live_waiters_and_replicas_agree() {
    let cases: u32 = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&prop::collection::vec(step(), 1..120), |steps| {
            run_steps(&steps, NegativeControl::None)
        })
        .unwrap();
    let hand_offs = HAND_OFFS.load(Ordering::Relaxed);
    eprintln!("waits property: {cases} cases, {hand_offs} hand-offs checked");
    assert!(
        hand_offs > u64::from(cases),
        "the cases hand off too rarely to test anything"
    );
}

/// Negative controls: the checker above must catch a queue served out of order and a grant to
/// a waiter whose wait had ended.
#[test]
fn property_checker_catches_the_wait_negative_controls() {
    if !NegativeControl::AVAILABLE {
        eprintln!("skipped: build without the negative-controls feature");
        return;
    }
    for (control, expected) in [
        (NegativeControl::WaitQueueLifo, "overtook"),
        (
            NegativeControl::HandOffToDeadWaiters,
            "after its wait ended",
        ),
    ] {
        let mut runner = TestRunner::new(Config {
            cases: 400,
            failure_persistence: None,
            ..Config::default()
        });
        let result = runner.run(&prop::collection::vec(step(), 1..120), |steps| {
            run_steps(&steps, control)
        });
        let Err(failure) = result else {
            panic!("{} went unnoticed", control.name());
        };
        let message = failure.to_string();
        eprintln!("{}: caught: {message:.200}", control.name());
        assert!(message.contains(expected), "{}: {message}", control.name());
    }
}
