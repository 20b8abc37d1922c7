//! Transfer: the current holder hands its lease to a named new holder in one step.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use tenure_core::{
    Command, CommandResult, ErrorCode, GroupLimits, LeaseError, LeaseReply, LeaseStatus,
    ReplayStatus, TenantPolicy,
};

use crate::common::{Harness, TENANT, transfer_op};

#[test]
fn a_transfer_hands_the_resource_over_with_no_gap_and_a_higher_token() {
    let mut h = Harness::new();
    let old = h.acquire("r", "alice", 5_000).unwrap();
    h.advance(1_000);
    let receipt = h
        .transfer("r", old.lease_id, "alice", "bob", 3_000)
        .unwrap();
    assert_eq!(receipt.released.lease_id, old.lease_id);
    assert_eq!(receipt.released.fencing_token, old.fencing_token);
    assert_eq!(receipt.released.released_at_ms, h.now_ms);
    let new = receipt.grant;
    assert!(new.fencing_token > old.fencing_token);
    assert_ne!(new.lease_id, old.lease_id);
    assert_eq!(new.log_time_ms, h.now_ms);
    assert_eq!(new.expires_at_ms, h.now_ms + 3_000);
    assert!(new.created);

    // At the transfer's own log time the resource is already bob's: nobody else can take it.
    let err = h.acquire("r", "carol", 1_000).unwrap_err();
    assert!(matches!(err, LeaseError::AlreadyHeld { ref holder_id, .. } if holder_id == "bob"));
    let view = h.get("r").unwrap();
    assert_eq!(
        (
            view.holder_id.as_str(),
            view.status,
            view.fencing_token,
            view.version
        ),
        ("bob", LeaseStatus::Active, new.fencing_token, 1)
    );

    // The old lease is gone for alice; bob renews and releases the new one.
    assert_eq!(
        h.renew("r", old.lease_id, "alice", 1_000)
            .unwrap_err()
            .code(),
        ErrorCode::LeaseMismatch
    );
    h.advance(2_000);
    let renewed = h.renew("r", new.lease_id, "bob", 3_000).unwrap();
    assert_eq!(renewed.fencing_token, new.fencing_token);
    h.release("r", new.lease_id, "bob").unwrap();
    assert!(h.acquire("r", "carol", 1_000).is_ok());
}

#[test]
fn the_new_lease_expires_by_its_own_ttl() {
    let mut h = Harness::new();
    let old = h.acquire("r", "alice", 60_000).unwrap();
    let new = h
        .transfer("r", old.lease_id, "alice", "bob", 500)
        .unwrap()
        .grant;
    h.advance(499);
    assert_eq!(h.get("r").unwrap().status, LeaseStatus::Active);
    h.advance(1);
    let out = h.apply(Command::Expire { leases_max: 10 });
    assert_eq!(out.reclaimed.len(), 1);
    assert_eq!(out.reclaimed[0].fencing_token, new.fencing_token);
    assert!(h.acquire("r", "carol", 1_000).is_ok());
}

#[test]
fn only_the_holder_of_the_active_lease_can_transfer_it() {
    let mut h = Harness::new();
    assert_eq!(
        h.transfer(
            "absent",
            tenure_core::LeaseId {
                group_id: crate::common::GROUP,
                sequence: 9
            },
            "a",
            "b",
            1_000
        )
        .unwrap_err()
        .code(),
        ErrorCode::NotFound
    );
    let lease = h.acquire("r", "alice", 1_000).unwrap();
    assert_eq!(
        h.transfer("r", lease.lease_id, "mallory", "mallory", 1_000)
            .unwrap_err()
            .code(),
        ErrorCode::LeaseMismatch
    );
    assert_eq!(
        h.transfer("r", lease.lease_id, "alice", "bob", 10)
            .unwrap_err()
            .code(),
        ErrorCode::InvalidArgument,
        "the new ttl is checked against the bounds like any ttl"
    );
    assert_eq!(
        h.transfer("r", lease.lease_id, "alice", "", 1_000)
            .unwrap_err()
            .code(),
        ErrorCode::InvalidArgument,
        "the new holder id is validated like any holder id"
    );
    h.advance(1_000);
    assert_eq!(
        h.transfer("r", lease.lease_id, "alice", "bob", 1_000)
            .unwrap_err()
            .code(),
        ErrorCode::LeaseExpired
    );
    // Refusals changed nothing.
    assert_eq!(h.get("r").unwrap().holder_id, "alice");
}

#[test]
fn a_retried_transfer_replays_and_a_reused_request_id_is_refused() {
    let mut h = Harness::new();
    let lease = h.acquire("r", "alice", 5_000).unwrap();
    let first = h.op(transfer_op(
        "r",
        lease.lease_id,
        "alice",
        "bob",
        2_000,
        "t-1",
    ));
    let Ok(LeaseReply::Transferred(receipt)) = &first.result else {
        panic!("{first:?}");
    };
    h.advance(500);
    let again = h.op(transfer_op(
        "r",
        lease.lease_id,
        "alice",
        "bob",
        2_000,
        "t-1",
    ));
    assert!(again.replayed);
    assert_eq!(again.result, first.result);
    let replay = again.replay.unwrap();
    assert_eq!(replay.status, ReplayStatus::Active);
    assert_eq!(
        replay.remaining_ttl_ms, 1_500,
        "what is left of the new lease"
    );
    assert_eq!(
        h.get("r").unwrap().fencing_token,
        receipt.grant.fencing_token
    );

    let other = h.op(transfer_op(
        "r",
        lease.lease_id,
        "alice",
        "carol",
        2_000,
        "t-1",
    ));
    assert!(!other.replayed);
    assert_eq!(
        other.result.unwrap_err().code(),
        ErrorCode::InvalidArgument,
        "the same request id with another new holder is a different request"
    );
    assert_eq!(h.get("r").unwrap().holder_id, "bob");
}

#[test]
fn a_transfer_works_for_a_tenant_at_its_active_lease_quota() {
    let mut h = Harness::with_limits(GroupLimits {
        ttl_ms_min: 100,
        ..GroupLimits::default()
    });
    let out = h.apply(Command::SetTenantPolicy {
        tenant_id: TENANT.to_owned(),
        policy: TenantPolicy {
            active_leases_max: Some(1),
            ..TenantPolicy::default()
        },
    });
    assert_eq!(out.result, CommandResult::Config(Ok(())));
    let lease = h.acquire("r", "alice", 5_000).unwrap();
    assert_eq!(
        h.acquire("s", "alice", 5_000).unwrap_err().code(),
        ErrorCode::QuotaExceeded
    );
    // One lease ends and one begins: the count stays at the quota.
    let new = h
        .transfer("r", lease.lease_id, "alice", "bob", 5_000)
        .unwrap();
    assert_eq!(h.state.stats().active_leases, 1);
    assert_eq!(
        h.acquire("s", "alice", 5_000).unwrap_err().code(),
        ErrorCode::QuotaExceeded
    );
    h.release("r", new.grant.lease_id, "bob").unwrap();
    assert!(h.acquire("s", "alice", 5_000).is_ok());
}
