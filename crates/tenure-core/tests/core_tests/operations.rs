//! Behaviour of every operation and every error of contract section 2, with boundaries.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::{Harness, TENANT, acquire_op, key, release_op, renew_op};
use tenure_core::{
    Command, CommandResult, ErrorCode, GroupId, GroupLimits, LeaseError, LeaseId, LeaseOp,
    LeaseReply, LeaseStatus, ListRequest, OverloadReason, QuotaKind, ResourceKey, TenantPolicy,
};

fn code<T: std::fmt::Debug>(result: Result<T, LeaseError>) -> ErrorCode {
    result.expect_err("expected an error").code()
}

// ---------------------------------------------------------------- acquire

#[test]
fn acquire_on_a_free_resource_grants_a_lease_expiring_at_log_time_plus_ttl() {
    let mut h = Harness::new();
    let grant = h.acquire("db", "alice", 5_000).unwrap();
    assert_eq!(grant.expires_at_ms, h.now_ms + 5_000);
    assert_eq!(grant.log_time_ms, h.now_ms);
    assert_eq!(grant.ttl_ms, 5_000);
    assert!(grant.created);
    assert_eq!(grant.lease_id.group_id, common::GROUP);
    assert_eq!(grant.lease_id.sequence, grant.fencing_token);
    let view = h.get("db").unwrap();
    assert_eq!(view.status, LeaseStatus::Active);
    assert_eq!(view.holder_id, "alice");
    assert_eq!(view.remaining_ttl_ms, 5_000);
    assert_eq!(view.version, 1);
}

#[test]
fn acquire_while_held_is_already_held_with_holder_and_remaining_ttl() {
    let mut h = Harness::new();
    h.acquire("db", "alice", 5_000).unwrap();
    h.advance(1_200);
    let err = h.acquire("db", "bob", 5_000).unwrap_err();
    assert_eq!(
        err,
        LeaseError::AlreadyHeld {
            holder_id: "alice".into(),
            remaining_ttl_ms: 3_800
        }
    );
    assert!(!err.retryable());
}

#[test]
fn acquire_by_the_current_holder_is_not_reentrant() {
    let mut h = Harness::new();
    h.acquire("db", "alice", 5_000).unwrap();
    assert_eq!(
        code(h.acquire("db", "alice", 5_000)),
        ErrorCode::AlreadyHeld
    );
}

#[test]
fn expiry_is_half_open_acquire_succeeds_exactly_at_expiry_and_not_a_millisecond_before() {
    let mut h = Harness::new();
    let first = h.acquire("db", "alice", 1_000).unwrap();
    h.advance(999);
    assert_eq!(code(h.acquire("db", "bob", 1_000)), ErrorCode::AlreadyHeld);
    assert_eq!(h.get("db").unwrap().remaining_ttl_ms, 1);
    h.advance(1);
    assert_eq!(h.now_ms, first.expires_at_ms);
    assert_eq!(h.get("db").unwrap().status, LeaseStatus::Expired);
    let second = h.acquire("db", "bob", 1_000).unwrap();
    assert!(second.fencing_token > first.fencing_token);
    assert_ne!(second.lease_id, first.lease_id);
}

#[test]
fn acquire_after_release_grants_a_new_lease_with_a_larger_token() {
    let mut h = Harness::new();
    let first = h.acquire("db", "alice", 5_000).unwrap();
    h.release("db", first.lease_id, "alice").unwrap();
    let second = h.acquire("db", "alice", 5_000).unwrap();
    assert!(second.fencing_token > first.fencing_token);
}

#[test]
fn ttl_outside_the_bounds_is_invalid_argument_naming_the_bounds_and_never_raised() {
    let mut h = Harness::with_limits(GroupLimits {
        ttl_ms_min: 1_500,
        ttl_ms_max: 60_000,
        ..GroupLimits::default()
    });
    for ttl in [0, 1_499, 60_001, u64::MAX] {
        let err = h.acquire("db", "alice", ttl).unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidArgument);
        let text = err.to_string();
        assert!(text.contains("1500") && text.contains("60000"), "{text}");
    }
    assert_eq!(h.acquire("db", "alice", 1_500).unwrap().ttl_ms, 1_500);
    assert_eq!(h.acquire("db2", "alice", 60_000).unwrap().ttl_ms, 60_000);
}

#[test]
fn tenant_policy_tightens_ttl_bounds_and_active_lease_quota() {
    let mut h = Harness::new();
    let out = h.apply(Command::SetTenantPolicy {
        tenant_id: TENANT.to_owned(),
        policy: TenantPolicy {
            active_leases_max: Some(2),
            ttl_ms_min: Some(2_000),
            ttl_ms_max: Some(10_000),
        },
    });
    assert_eq!(out.result, CommandResult::Config(Ok(())));
    assert_eq!(code(h.acquire("a", "x", 1_999)), ErrorCode::InvalidArgument);
    assert_eq!(
        code(h.acquire("a", "x", 10_001)),
        ErrorCode::InvalidArgument
    );
    h.acquire("a", "x", 2_000).unwrap();
    h.acquire("b", "x", 10_000).unwrap();
    assert_eq!(
        h.acquire("c", "x", 5_000).unwrap_err(),
        LeaseError::QuotaExceeded {
            kind: QuotaKind::TenantActiveLeases,
            limit: 2
        }
    );
}

#[test]
fn expired_but_unreclaimed_leases_do_not_count_against_the_quota() {
    let mut h = Harness::new();
    h.apply(Command::SetTenantPolicy {
        tenant_id: TENANT.to_owned(),
        policy: TenantPolicy {
            active_leases_max: Some(1),
            ..TenantPolicy::default()
        },
    });
    h.acquire("a", "x", 1_000).unwrap();
    h.advance(1_000);
    let op = h.acquire_op("b", "y", 1_000);
    let out = h.apply(Command::Lease(op));
    let CommandResult::Lease(outcome) = out.result else {
        panic!()
    };
    assert!(outcome.result.is_ok(), "{outcome:?}");
    assert_eq!(out.reclaimed.len(), 1);
    assert_eq!(out.reclaimed[0].resource_id, "a");
}

#[test]
fn malformed_identifiers_are_invalid_arguments() {
    let mut h = Harness::new();
    let too_long_tenant = "t".repeat(65);
    let cases: Vec<LeaseOp> = vec![
        acquire_op("", "alice", 1_000, "r1"),
        acquire_op(" db", "alice", 1_000, "r2"),
        acquire_op(&"r".repeat(257), "alice", 1_000, "r3"),
        acquire_op("db", "", 1_000, "r4"),
        acquire_op("db", &"h".repeat(129), 1_000, "r5"),
        acquire_op("db", "alice", 1_000, ""),
        LeaseOp::Acquire(tenure_core::AcquireRequest {
            key: ResourceKey::new(too_long_tenant, "db"),
            holder_id: "alice".to_owned(),
            ttl_ms: 1_000,
            request_id: "r6".to_owned(),
        }),
    ];
    for op in cases {
        let outcome = h.op(op.clone());
        assert_eq!(code(outcome.result), ErrorCode::InvalidArgument, "{op:?}");
    }
    assert!(h.get("db").is_none());
    assert_eq!(
        h.state.stats().dedup_records,
        0,
        "malformed requests are not recorded"
    );
}

#[test]
fn a_new_tenant_beyond_the_group_tenant_limit_is_quota_exceeded() {
    let mut h = Harness::with_limits(GroupLimits {
        ttl_ms_min: 100,
        tenants_max: 1,
        ..GroupLimits::default()
    });
    h.acquire("db", "alice", 1_000).unwrap();
    let other = LeaseOp::Acquire(tenure_core::AcquireRequest {
        key: ResourceKey::new("other", "db"),
        holder_id: "bob".to_owned(),
        ttl_ms: 1_000,
        request_id: "r".to_owned(),
    });
    assert_eq!(
        h.op(other).result.unwrap_err(),
        LeaseError::QuotaExceeded {
            kind: QuotaKind::GroupTenants,
            limit: 1
        }
    );
}

#[test]
fn the_group_record_limit_drops_the_oldest_inactive_record_before_refusing() {
    let mut h = Harness::with_limits(GroupLimits {
        ttl_ms_min: 100,
        lease_records_max: 2,
        ..GroupLimits::default()
    });
    let a = h.acquire("a", "x", 1_000).unwrap();
    h.acquire("b", "x", 1_000).unwrap();
    assert_eq!(
        h.acquire("c", "x", 1_000).unwrap_err(),
        LeaseError::QuotaExceeded {
            kind: QuotaKind::GroupLeaseRecords,
            limit: 2
        }
    );
    h.release("a", a.lease_id, "x").unwrap();
    h.acquire("c", "x", 1_000).unwrap();
    assert!(h.get("a").is_none(), "the released record made room");
    assert_eq!(h.state.stats().lease_records, 2);
}

// ---------------------------------------------------------------- renew

#[test]
fn renew_extends_expiry_from_the_log_time_and_keeps_id_and_token() {
    let mut h = Harness::new();
    let grant = h.acquire("db", "alice", 1_000).unwrap();
    h.advance(600);
    let renewed = h.renew("db", grant.lease_id, "alice", 2_000).unwrap();
    assert_eq!(renewed.lease_id, grant.lease_id);
    assert_eq!(renewed.fencing_token, grant.fencing_token);
    assert_eq!(renewed.expires_at_ms, h.now_ms + 2_000);
    assert!(!renewed.created);
    let view = h.get("db").unwrap();
    assert_eq!(view.version, 2);
    assert_eq!(view.ttl_ms, 2_000);
    let next = h.state.next_expiry_ms().unwrap();
    assert!(next <= h.now_ms + 2_000, "next_expiry_ms is a lower bound");
}

#[test]
fn a_renewed_lease_is_not_reclaimed_at_its_old_expiry_and_is_reclaimed_at_its_new_one() {
    let mut h = Harness::new();
    let grant = h.acquire("db", "alice", 1_000).unwrap();
    h.advance(500);
    let renewed = h.renew("db", grant.lease_id, "alice", 1_000).unwrap();
    h.advance(500);
    let out = h.apply(Command::Expire { leases_max: 10 });
    assert!(out.reclaimed.is_empty());
    assert_eq!(
        h.state.next_expiry_ms(),
        Some(renewed.expires_at_ms),
        "re-filed at its real expiry"
    );
    h.now_ms = renewed.expires_at_ms;
    let out = h.apply(Command::Expire { leases_max: 10 });
    assert_eq!(out.reclaimed.len(), 1);
    assert_eq!(out.reclaimed[0].expires_at_ms, renewed.expires_at_ms);
}

#[test]
fn an_expire_that_meets_renewed_entries_makes_bounded_progress_and_says_more_is_due() {
    let mut h = Harness::new();
    let mut grants = Vec::new();
    for name in ["a", "b", "c"] {
        grants.push(h.acquire(name, "x", 1_000).unwrap());
    }
    h.acquire("due", "x", 1_100).unwrap();
    h.advance(900);
    for (name, grant) in ["a", "b", "c"].iter().zip(&grants) {
        h.renew(name, grant.lease_id, "x", 5_000).unwrap();
    }
    h.advance(300);
    // Three stale entries sit before the one due lease; one Expire examines at most two.
    let first = h.apply(Command::Expire { leases_max: 1 });
    assert!(first.reclaimed.is_empty());
    assert_eq!(first.result, CommandResult::Expire { more_due: true });
    let second = h.apply(Command::Expire { leases_max: 1 });
    assert_eq!(second.reclaimed.len(), 1);
    assert_eq!(second.reclaimed[0].resource_id, "due");
    assert_eq!(second.result, CommandResult::Expire { more_due: false });
}

#[test]
fn a_renewal_that_shortens_a_lease_moves_its_expiry_earlier() {
    let mut h = Harness::new();
    let grant = h.acquire("db", "alice", 5_000).unwrap();
    let renewed = h.renew("db", grant.lease_id, "alice", 100).unwrap();
    assert_eq!(h.state.next_expiry_ms(), Some(renewed.expires_at_ms));
    h.now_ms = renewed.expires_at_ms;
    let out = h.apply(Command::Expire { leases_max: 10 });
    assert_eq!(out.reclaimed.len(), 1);
}

#[test]
fn renew_exactly_at_expiry_is_lease_expired() {
    let mut h = Harness::new();
    let grant = h.acquire("db", "alice", 1_000).unwrap();
    h.advance(999);
    h.renew("db", grant.lease_id, "alice", 1_000).unwrap();
    h.advance(1_000);
    assert_eq!(
        h.renew("db", grant.lease_id, "alice", 1_000).unwrap_err(),
        LeaseError::LeaseExpired {
            lease_id: grant.lease_id
        }
    );
}

#[test]
fn renew_or_release_of_an_unknown_resource_is_not_found() {
    let mut h = Harness::new();
    let id = LeaseId {
        group_id: common::GROUP,
        sequence: 1,
    };
    assert_eq!(
        h.renew("nothing", id, "alice", 1_000).unwrap_err(),
        LeaseError::NotFound
    );
    assert_eq!(
        h.release("nothing", id, "alice").unwrap_err(),
        LeaseError::NotFound
    );
    // Unknown tenant too.
    let op = LeaseOp::Renew(tenure_core::RenewRequest {
        key: ResourceKey::new("ghost", "x"),
        lease_id: id,
        holder_id: "alice".to_owned(),
        ttl_ms: 1_000,
        request_id: "r".to_owned(),
    });
    assert_eq!(h.op(op).result.unwrap_err(), LeaseError::NotFound);
}

#[test]
fn renew_of_a_released_lease_is_lease_expired() {
    let mut h = Harness::new();
    let grant = h.acquire("db", "alice", 5_000).unwrap();
    h.release("db", grant.lease_id, "alice").unwrap();
    assert_eq!(
        code(h.renew("db", grant.lease_id, "alice", 5_000)),
        ErrorCode::LeaseExpired
    );
}

#[test]
fn renew_with_another_lease_id_or_holder_is_lease_mismatch() {
    let mut h = Harness::new();
    let grant = h.acquire("db", "alice", 5_000).unwrap();
    let wrong_id = LeaseId {
        group_id: grant.lease_id.group_id,
        sequence: grant.lease_id.sequence + 100,
    };
    assert_eq!(
        code(h.renew("db", wrong_id, "alice", 5_000)),
        ErrorCode::LeaseMismatch
    );
    let other_group = LeaseId {
        group_id: GroupId(grant.lease_id.group_id.0 + 1),
        sequence: grant.lease_id.sequence,
    };
    assert_eq!(
        code(h.renew("db", other_group, "alice", 5_000)),
        ErrorCode::LeaseMismatch
    );
    assert_eq!(
        code(h.renew("db", grant.lease_id, "mallory", 5_000)),
        ErrorCode::LeaseMismatch
    );
    assert_eq!(
        code(h.release("db", grant.lease_id, "mallory")),
        ErrorCode::LeaseMismatch
    );
    assert_eq!(h.get("db").unwrap().status, LeaseStatus::Active);
}

#[test]
fn checks_run_in_contract_order_expired_before_mismatch() {
    let mut h = Harness::new();
    let old = h.acquire("db", "alice", 1_000).unwrap();
    h.advance(1_000);
    let new = h.acquire("db", "bob", 1_000).unwrap();
    h.advance(1_000);
    // The current lease (bob's) has expired and the request names alice's older lease:
    // LEASE_EXPIRED wins over LEASE_MISMATCH.
    assert_eq!(
        code(h.renew("db", old.lease_id, "alice", 1_000)),
        ErrorCode::LeaseExpired
    );
    assert_eq!(
        code(h.release("db", new.lease_id, "mallory")),
        ErrorCode::LeaseExpired
    );
}

#[test]
fn renew_of_an_old_lease_while_another_is_active_is_mismatch() {
    let mut h = Harness::new();
    let old = h.acquire("db", "alice", 1_000).unwrap();
    h.advance(1_000);
    h.acquire("db", "bob", 1_000).unwrap();
    assert_eq!(
        code(h.renew("db", old.lease_id, "alice", 1_000)),
        ErrorCode::LeaseMismatch
    );
}

#[test]
fn renew_with_a_ttl_out_of_bounds_is_invalid_argument() {
    let mut h = Harness::new();
    let grant = h.acquire("db", "alice", 1_000).unwrap();
    assert_eq!(
        code(h.renew("db", grant.lease_id, "alice", 99)),
        ErrorCode::InvalidArgument
    );
    assert_eq!(
        code(h.renew("db", grant.lease_id, "alice", 3_600_001)),
        ErrorCode::InvalidArgument
    );
}

// ---------------------------------------------------------------- release

#[test]
fn release_ends_the_lease_at_once_and_frees_the_resource() {
    let mut h = Harness::new();
    let grant = h.acquire("db", "alice", 5_000).unwrap();
    h.advance(10);
    let receipt = h.release("db", grant.lease_id, "alice").unwrap();
    assert_eq!(receipt.lease_id, grant.lease_id);
    assert_eq!(receipt.fencing_token, grant.fencing_token);
    assert_eq!(receipt.released_at_ms, h.now_ms);
    let view = h.get("db").unwrap();
    assert_eq!(view.status, LeaseStatus::Released);
    assert_eq!(view.remaining_ttl_ms, 0);
    assert_eq!(view.version, 2);
    assert_eq!(h.state.stats().active_leases, 0);
    assert_eq!(h.state.next_expiry_ms(), None);
    h.acquire("db", "bob", 5_000).unwrap();
}

#[test]
fn releasing_twice_is_lease_expired() {
    let mut h = Harness::new();
    let grant = h.acquire("db", "alice", 5_000).unwrap();
    h.release("db", grant.lease_id, "alice").unwrap();
    assert_eq!(
        h.release("db", grant.lease_id, "alice").unwrap_err(),
        LeaseError::LeaseExpired {
            lease_id: grant.lease_id
        }
    );
}

// ---------------------------------------------------------------- get

#[test]
fn get_reports_every_status() {
    let mut h = Harness::new();
    assert!(h.get("db").is_none(), "ABSENT");
    let grant = h.acquire("db", "alice", 1_000).unwrap();
    assert_eq!(h.get("db").unwrap().status, LeaseStatus::Active);
    h.advance(1_000);
    assert_eq!(
        h.get("db").unwrap().status,
        LeaseStatus::Expired,
        "expired, not yet reclaimed"
    );
    h.apply(Command::Expire { leases_max: 10 });
    assert_eq!(
        h.get("db").unwrap().status,
        LeaseStatus::Expired,
        "reclaimed"
    );
    let second = h.acquire("db", "bob", 1_000).unwrap();
    h.release("db", second.lease_id, "bob").unwrap();
    let view = h.get("db").unwrap();
    assert_eq!(view.status, LeaseStatus::Released);
    assert!(view.fencing_token > grant.fencing_token);
    assert!(h.state.get(&ResourceKey::new("", "db"), h.now_ms).is_err());
}

#[test]
fn get_never_answers_for_a_log_time_before_the_last_applied_one() {
    let mut h = Harness::new();
    h.acquire("db", "alice", 1_000).unwrap();
    h.advance(1_000);
    h.apply(Command::Expire { leases_max: 0 });
    let view = h.state.get(&key("db"), 0).unwrap().unwrap();
    assert_eq!(view.status, LeaseStatus::Expired);
}

// ---------------------------------------------------------------- expire

#[test]
fn expire_reclaims_due_leases_oldest_first_up_to_its_bound() {
    let mut h = Harness::new();
    h.acquire("c", "x", 3_000).unwrap();
    h.acquire("a", "x", 1_000).unwrap();
    h.acquire("b", "x", 2_000).unwrap();
    h.acquire("d", "x", 9_000).unwrap();
    assert_eq!(h.state.next_expiry_ms(), Some(h.now_ms + 1_000));
    h.advance(3_000);
    let out = h.apply(Command::Expire { leases_max: 2 });
    assert_eq!(out.result, CommandResult::Expire { more_due: true });
    let names: Vec<_> = out
        .reclaimed
        .iter()
        .map(|r| r.resource_id.as_str())
        .collect();
    assert_eq!(names, ["a", "b"]);
    let out = h.apply(Command::Expire { leases_max: 10 });
    assert_eq!(out.result, CommandResult::Expire { more_due: false });
    let names: Vec<_> = out
        .reclaimed
        .iter()
        .map(|r| r.resource_id.as_str())
        .collect();
    assert_eq!(names, ["c"], "reclaims at exactly its expiry, never d");
    assert_eq!(h.get("d").unwrap().status, LeaseStatus::Active);
    assert_eq!(h.state.stats().active_leases, 1);
}

#[test]
fn expire_is_capped_by_the_group_expire_batch_max() {
    let mut h = Harness::with_limits(GroupLimits {
        ttl_ms_min: 100,
        expire_batch_max: 3,
        ..GroupLimits::default()
    });
    for i in 0..5 {
        h.acquire(&format!("r{i}"), "x", 100).unwrap();
    }
    h.advance(100);
    let out = h.apply(Command::Expire { leases_max: 1_000 });
    assert_eq!(out.reclaimed.len(), 3);
    assert_eq!(out.result, CommandResult::Expire { more_due: true });
}

#[test]
fn inactive_records_are_kept_for_their_retention_then_become_absent() {
    let mut h = Harness::with_limits(GroupLimits {
        ttl_ms_min: 100,
        inactive_retention_ms: 10_000,
        ..GroupLimits::default()
    });
    let grant = h.acquire("db", "alice", 1_000).unwrap();
    h.advance(1_000);
    h.apply(Command::Expire { leases_max: 1 });
    h.advance(9_999);
    assert_eq!(
        code(h.renew("db", grant.lease_id, "alice", 1_000)),
        ErrorCode::LeaseExpired
    );
    h.advance(1);
    assert_eq!(
        code(h.renew("db", grant.lease_id, "alice", 1_000)),
        ErrorCode::NotFound
    );
    assert!(h.get("db").is_none());
    assert_eq!(h.state.stats().lease_records, 0, "garbage collected");
}

#[test]
fn fencing_tokens_keep_increasing_after_old_records_are_garbage_collected() {
    let mut h = Harness::with_limits(GroupLimits {
        ttl_ms_min: 100,
        inactive_retention_ms: 1_000,
        ..GroupLimits::default()
    });
    let mut last_token = 0;
    for round in 0..5 {
        let grant = h.acquire("db", "alice", 100).unwrap();
        assert!(grant.fencing_token > last_token, "round {round}");
        last_token = grant.fencing_token;
        h.release("db", grant.lease_id, "alice").unwrap();
        h.advance(5_000);
        h.apply(Command::Expire { leases_max: 1 });
        assert_eq!(h.state.stats().lease_records, 0);
    }
}

#[test]
fn the_inactive_record_bound_drops_the_oldest_first() {
    let mut h = Harness::with_limits(GroupLimits {
        ttl_ms_min: 100,
        inactive_records_max: 2,
        ..GroupLimits::default()
    });
    for name in ["a", "b", "c"] {
        let grant = h.acquire(name, "x", 1_000).unwrap();
        h.release(name, grant.lease_id, "x").unwrap();
    }
    assert!(h.get("a").is_none());
    assert_eq!(h.get("b").unwrap().status, LeaseStatus::Released);
    assert_eq!(h.state.stats().inactive_records, 2);
}

// ---------------------------------------------------------------- request ids

#[test]
fn a_retried_request_returns_the_original_outcome_and_applies_once() {
    let mut h = Harness::new();
    let op = acquire_op("db", "alice", 5_000, "req-1");
    let first = h.op(op.clone());
    assert!(!first.replayed);
    let tokens_before = h.state.stats().next_fencing_token;
    h.advance(100);
    let retry = h.op(op);
    assert!(retry.replayed);
    assert_eq!(retry.result, first.result);
    assert_eq!(
        h.state.stats().next_fencing_token,
        tokens_before,
        "applied once"
    );
}

#[test]
fn a_retried_request_replays_its_original_error_too() {
    let mut h = Harness::new();
    let held = h.acquire("db", "alice", 1_000).unwrap();
    let op = acquire_op("db", "bob", 1_000, "bob-1");
    let first = h.op(op.clone());
    assert_eq!(code(first.result.clone()), ErrorCode::AlreadyHeld);
    h.release("db", held.lease_id, "alice").unwrap();
    let retry = h.op(op);
    assert!(retry.replayed);
    assert_eq!(
        retry.result, first.result,
        "the original ALREADY_HELD, not a new grant"
    );
    assert_eq!(h.get("db").unwrap().status, LeaseStatus::Released);
}

#[test]
fn reusing_a_request_id_for_a_different_request_is_invalid_and_keeps_the_original() {
    let mut h = Harness::new();
    let original = h.op(acquire_op("db", "alice", 5_000, "same"));
    let grant = match &original.result {
        Ok(LeaseReply::Acquired(grant)) => grant.clone(),
        other => panic!("{other:?}"),
    };
    for reuse in [
        acquire_op("db", "bob", 5_000, "same"),
        acquire_op("db", "alice", 6_000, "same"),
        renew_op("db", grant.lease_id, "alice", 5_000, "same"),
        release_op("db", grant.lease_id, "alice", "same"),
    ] {
        let outcome = h.op(reuse);
        assert!(!outcome.replayed);
        let err = outcome.result.unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidArgument);
        assert!(err.to_string().contains("request_id"), "{err}");
    }
    let retry = h.op(acquire_op("db", "alice", 5_000, "same"));
    assert!(retry.replayed);
    assert_eq!(retry.result, original.result);
    assert_eq!(h.get("db").unwrap().status, LeaseStatus::Active);
}

#[test]
fn request_ids_are_scoped_to_one_resource() {
    let mut h = Harness::new();
    let a = h.op(acquire_op("a", "alice", 5_000, "same"));
    let b = h.op(acquire_op("b", "alice", 5_000, "same"));
    assert!(!a.replayed && !b.replayed);
    assert!(a.result.is_ok() && b.result.is_ok());
}

#[test]
fn request_id_retention_is_exact_in_log_time() {
    let mut h = Harness::with_limits(GroupLimits {
        ttl_ms_min: 100,
        dedup_retention_ms: 10_000,
        dedup_retention_ms_min: 1_000,
        ..GroupLimits::default()
    });
    let op = acquire_op("db", "alice", 100, "req");
    let first = h.op(op.clone());
    h.advance(9_999);
    assert!(
        h.op(op.clone()).replayed,
        "one millisecond before the window ends"
    );
    h.advance(1);
    let fresh = h.op(op);
    assert!(!fresh.replayed, "the window is half-open");
    assert!(
        fresh.result.is_ok(),
        "the lease had expired, so it is a new grant"
    );
    assert_ne!(fresh.result, first.result);
}

#[test]
fn a_full_request_id_table_refuses_with_overloaded_rather_than_forgetting_young_records() {
    let mut h = Harness::with_limits(GroupLimits {
        ttl_ms_min: 100,
        dedup_records_max: 2,
        dedup_retention_ms_min: 1_000,
        ..GroupLimits::default()
    });
    let first = h.op(acquire_op("a", "x", 5_000, "r1"));
    h.op(acquire_op("b", "x", 5_000, "r2"));
    let refused = h.op(acquire_op("c", "x", 5_000, "r3"));
    assert_eq!(
        refused.result,
        Err(LeaseError::Overloaded {
            reason: OverloadReason::DedupTableFull
        })
    );
    assert!(refused.result.as_ref().unwrap_err().retryable());
    assert!(h.get("c").is_none(), "a refused request has no effect");
    assert!(h.op(acquire_op("a", "x", 5_000, "r1")).replayed);
    // Once the oldest record is past the guaranteed minimum it gives way.
    h.advance(1_000);
    let retried = h.op(acquire_op("c", "x", 5_000, "r3"));
    assert!(!retried.replayed);
    assert!(retried.result.is_ok());
    let again = h.op(acquire_op("a", "x", 5_000, "r1"));
    assert!(!again.replayed, "r1 was the oldest and was dropped");
    assert_ne!(again.result, first.result);
    assert!(h.state.stats().dedup_records <= 2);
}

// ---------------------------------------------------------------- batch

#[test]
fn a_batch_applies_items_in_order_with_one_result_each() {
    let mut h = Harness::new();
    let ops = vec![
        acquire_op("a", "alice", 1_000, "b1"),
        acquire_op("a", "bob", 1_000, "b2"),
        acquire_op("b", "bob", 1_000, "b3"),
        acquire_op("", "bob", 1_000, "b4"),
    ];
    let out = h.apply(Command::Batch(ops));
    let CommandResult::Batch(Ok(outcomes)) = out.result else {
        panic!("{:?}", out.result)
    };
    let codes: Vec<_> = outcomes
        .iter()
        .map(|o| o.result.as_ref().err().map(LeaseError::code))
        .collect();
    assert_eq!(
        codes,
        [
            None,
            Some(ErrorCode::AlreadyHeld),
            None,
            Some(ErrorCode::InvalidArgument)
        ]
    );
    let tokens: Vec<_> = outcomes
        .iter()
        .filter_map(|o| match &o.result {
            Ok(LeaseReply::Acquired(g)) => Some(g.fencing_token),
            _ => None,
        })
        .collect();
    assert!(tokens[0] < tokens[1]);
}

#[test]
fn an_oversized_batch_is_refused_whole() {
    let mut h = Harness::with_limits(GroupLimits {
        ttl_ms_min: 100,
        batch_items_max: 2,
        ..GroupLimits::default()
    });
    let ops = (0..3)
        .map(|i| acquire_op(&format!("r{i}"), "x", 1_000, &format!("q{i}")))
        .collect();
    let out = h.apply(Command::Batch(ops));
    let CommandResult::Batch(Err(err)) = out.result else {
        panic!("{:?}", out.result)
    };
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert_eq!(h.state.stats().lease_records, 0);
}

// ---------------------------------------------------------------- time and config

#[test]
fn an_entry_stamped_earlier_is_applied_at_the_latest_log_time_so_leases_never_shorten() {
    let mut h = Harness::new();
    h.advance(10_000);
    h.apply(Command::Expire { leases_max: 0 });
    h.now_ms -= 5_000;
    let grant = h.acquire("db", "alice", 1_000).unwrap();
    assert_eq!(grant.log_time_ms, 11_000);
    assert_eq!(grant.expires_at_ms, 12_000);
    assert_eq!(h.state.last_log_time_ms(), 11_000);
}

#[test]
fn incoherent_limits_and_policies_are_refused_and_change_nothing() {
    let mut h = Harness::new();
    let before = h.state.limits().clone();
    let out = h.apply(Command::SetGroupLimits(GroupLimits {
        ttl_ms_min: 10,
        ttl_ms_max: 5,
        ..GroupLimits::default()
    }));
    assert!(matches!(
        out.result,
        CommandResult::Config(Err(LeaseError::InvalidArgument { .. }))
    ));
    assert_eq!(h.state.limits(), &before);
    let out = h.apply(Command::SetTenantPolicy {
        tenant_id: TENANT.to_owned(),
        policy: TenantPolicy {
            ttl_ms_min: Some(10),
            ttl_ms_max: Some(5),
            active_leases_max: None,
        },
    });
    assert!(matches!(
        out.result,
        CommandResult::Config(Err(LeaseError::InvalidArgument { .. }))
    ));
}

// ---------------------------------------------------------------- list

fn list(
    h: &Harness,
    page_size: u32,
    token: Option<String>,
    status: Option<LeaseStatus>,
) -> tenure_core::ListPage {
    h.state
        .list(
            &ListRequest {
                tenant_id: TENANT.to_owned(),
                page_size,
                page_token: token,
                status,
            },
            h.now_ms,
        )
        .unwrap()
}

#[test]
fn list_pages_in_grant_order_with_stable_tokens() {
    let mut h = Harness::new();
    for i in 0..5 {
        h.acquire(&format!("r{i}"), "x", 5_000).unwrap();
    }
    let page1 = list(&h, 2, None, None);
    let names: Vec<_> = page1
        .leases
        .iter()
        .map(|l| l.key.resource_id.clone())
        .collect();
    assert_eq!(names, ["r0", "r1"]);
    // Changes between pages: r0 (already seen) is released, r9 is new.
    let r0 = page1.leases[0].lease_id;
    h.release("r0", r0, "x").unwrap();
    h.acquire("r9", "x", 5_000).unwrap();
    let page2 = list(&h, 2, page1.next_page_token.clone(), None);
    let names: Vec<_> = page2
        .leases
        .iter()
        .map(|l| l.key.resource_id.clone())
        .collect();
    assert_eq!(names, ["r2", "r3"]);
    let page3 = list(&h, 2, page2.next_page_token.clone(), None);
    let names: Vec<_> = page3
        .leases
        .iter()
        .map(|l| l.key.resource_id.clone())
        .collect();
    assert_eq!(names, ["r4", "r9"]);
    assert_eq!(page3.next_page_token, None);
}

#[test]
fn list_filters_by_status_and_isolates_tenants() {
    let mut h = Harness::new();
    let a = h.acquire("a", "x", 5_000).unwrap();
    h.acquire("b", "x", 5_000).unwrap();
    h.release("a", a.lease_id, "x").unwrap();
    let released = list(&h, 10, None, Some(LeaseStatus::Released));
    assert_eq!(released.leases.len(), 1);
    assert_eq!(released.leases[0].key.resource_id, "a");
    let active = list(&h, 10, None, Some(LeaseStatus::Active));
    assert_eq!(active.leases.len(), 1);
    assert_eq!(active.leases[0].key.resource_id, "b");
    let other = h
        .state
        .list(
            &ListRequest {
                tenant_id: "other".to_owned(),
                page_size: 10,
                page_token: None,
                status: None,
            },
            h.now_ms,
        )
        .unwrap();
    assert!(other.leases.is_empty());
}

#[test]
fn list_rejects_bad_page_sizes_tokens_and_filters() {
    let mut h = Harness::new();
    h.acquire("a", "x", 5_000).unwrap();
    let request = |page_size, token: Option<&str>, status| ListRequest {
        tenant_id: TENANT.to_owned(),
        page_size,
        page_token: token.map(str::to_owned),
        status,
    };
    for bad in [
        request(0, None, None),
        request(1_001, None, None),
        request(10, Some("garbage"), None),
        request(10, Some("v1.zz.1"), None),
        request(10, None, Some(LeaseStatus::Absent)),
    ] {
        assert_eq!(
            code(h.state.list(&bad, h.now_ms)),
            ErrorCode::InvalidArgument,
            "{bad:?}"
        );
    }
}

#[test]
fn a_filtered_list_page_stops_at_the_scan_bound_and_continues_from_its_token() {
    let mut h = Harness::with_limits(GroupLimits {
        ttl_ms_min: 100,
        list_page_size_max: 10,
        list_scan_max: 10,
        ..GroupLimits::default()
    });
    for i in 0..25 {
        let grant = h.acquire(&format!("r{i:02}"), "x", 5_000).unwrap();
        if i != 24 {
            h.release(&format!("r{i:02}"), grant.lease_id, "x").unwrap();
        }
    }
    let mut token = None;
    let mut pages = 0;
    let mut found = Vec::new();
    loop {
        let page = list(&h, 10, token, Some(LeaseStatus::Active));
        pages += 1;
        found.extend(page.leases.into_iter().map(|l| l.key.resource_id));
        token = page.next_page_token;
        if token.is_none() {
            break;
        }
    }
    assert_eq!(found, ["r24"]);
    assert_eq!(pages, 3, "each page examined at most 10 entries");
}

#[test]
fn lease_ids_name_their_group_and_are_unique() {
    let mut h = Harness::new();
    let mut ids = std::collections::HashSet::new();
    for i in 0..100 {
        let grant = h
            .acquire(&format!("r{}", i % 10), "x", 100)
            .unwrap_or_else(|_| {
                h.advance(100);
                h.acquire(&format!("r{}", i % 10), "x", 100).unwrap()
            });
        assert!(ids.insert(grant.lease_id));
        assert_eq!(
            grant.lease_id.to_string().parse::<LeaseId>().unwrap(),
            grant.lease_id
        );
    }
}

// ---------------------------------------------------------------- fence check

/// The fence check's verdict over a resource's life: a token is current exactly while its
/// lease is the resource's active lease; an expired, released or superseded token never is, and
/// a resource without a lease has no current token.
#[test]
fn a_fence_check_answers_current_only_for_the_active_leases_token() {
    use tenure_core::FenceVerdict;
    let mut h = Harness::new();
    let absent = FenceVerdict::of(h.get("db").as_ref(), 1);
    assert!(!absent.current);
    assert_eq!(absent.status, LeaseStatus::Absent);
    assert_eq!(absent.latest_fencing_token, None);

    let first = h.acquire("db", "alice", 5_000).unwrap();
    let verdict = FenceVerdict::of(h.get("db").as_ref(), first.fencing_token);
    assert!(verdict.current);
    assert_eq!(verdict.status, LeaseStatus::Active);
    assert_eq!(verdict.latest_fencing_token, Some(first.fencing_token));
    assert_eq!(verdict.remaining_ttl_ms, 5_000);
    // A token the resource never had (above its latest): not current.
    let unknown = FenceVerdict::of(h.get("db").as_ref(), first.fencing_token + 1);
    assert!(!unknown.current);
    assert_eq!(unknown.remaining_ttl_ms, 0);

    // One millisecond before expiry: current; at expiry (half-open): not.
    h.advance(4_999);
    let verdict = FenceVerdict::of(h.get("db").as_ref(), first.fencing_token);
    assert!(verdict.current);
    assert_eq!(verdict.remaining_ttl_ms, 1);
    h.advance(1);
    let verdict = FenceVerdict::of(h.get("db").as_ref(), first.fencing_token);
    assert!(!verdict.current);
    assert_eq!(verdict.status, LeaseStatus::Expired);
    assert_eq!(verdict.latest_fencing_token, Some(first.fencing_token));

    // A new grant supersedes the old token for good; the new one is current until released.
    let second = h.acquire("db", "bob", 5_000).unwrap();
    assert!(second.fencing_token > first.fencing_token);
    let old = FenceVerdict::of(h.get("db").as_ref(), first.fencing_token);
    assert!(!old.current);
    assert_eq!(old.status, LeaseStatus::Active);
    assert_eq!(old.latest_fencing_token, Some(second.fencing_token));
    assert!(FenceVerdict::of(h.get("db").as_ref(), second.fencing_token).current);
    h.release("db", second.lease_id, "bob").unwrap();
    let released = FenceVerdict::of(h.get("db").as_ref(), second.fencing_token);
    assert!(!released.current);
    assert_eq!(released.status, LeaseStatus::Released);
}

/// A lease still ACTIVE in the state but with no time left on the leader's clock (its Expire
/// entry not applied yet: the server clips `remaining_ttl_ms` by the clock) is not current.
#[test]
fn a_fence_check_of_a_lease_due_on_the_leaders_clock_is_not_current() {
    use tenure_core::FenceVerdict;
    let mut h = Harness::new();
    let grant = h.acquire("db", "alice", 5_000).unwrap();
    let mut view = h.get("db").unwrap();
    view.remaining_ttl_ms = 0;
    let verdict = FenceVerdict::of(Some(&view), grant.fencing_token);
    assert!(!verdict.current);
    assert_eq!(verdict.status, LeaseStatus::Active);
    assert_eq!(verdict.latest_fencing_token, Some(grant.fencing_token));
    assert_eq!(verdict.remaining_ttl_ms, 0);
}
