//! Sessions in one group: open, keep-alive, close, leases bound to a session, their end when
//! the session ends (reads at once, reclaim a bounded number per Expire entry, in log-time
//! order), retention, quotas, and snapshots that carry all of it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;

use common::{
    Harness, TENANT, acquire_op, key, release_op, session_acquire_op, session_open_op, transfer_op,
};
use proptest::prelude::*;
use tenure_core::{
    Command, CommandResult, ErrorCode, GroupLimits, LeaseError, LeaseOp, LeaseStateMachine,
    LeaseStatus, SessionId, StateOptions, TenantPolicy,
};

const SESSION: u128 = 0x5e55_1011;

fn harness() -> Harness {
    Harness::with_limits(GroupLimits {
        ttl_ms_min: 100,
        inactive_retention_ms: 5_000,
        expire_batch_max: 10,
        ..GroupLimits::default()
    })
}

fn expire(h: &mut Harness, leases_max: u32) -> (usize, bool) {
    let out = h.apply(Command::Expire { leases_max });
    let CommandResult::Expire { more_due } = out.result else {
        panic!("expire answered {:?}", out.result);
    };
    for lease in &out.reclaimed {
        assert_eq!(lease.session_id, Some(SessionId(SESSION)));
    }
    (out.reclaimed.len(), more_due)
}

#[test]
fn a_bound_lease_lives_exactly_as_long_as_its_session() {
    let mut h = harness();
    let opened = h.open_session(SESSION, "worker", 1_000).unwrap();
    assert!(opened.created);
    assert_eq!(opened.expires_at_ms, h.now_ms + 1_000);
    let grant = h.acquire_in_session("job", "worker", SESSION).unwrap();
    assert_eq!(grant.expires_at_ms, opened.expires_at_ms);
    let view = h.get("job").unwrap();
    assert_eq!(view.session_id, Some(SessionId(SESSION)));
    assert_eq!(view.status, LeaseStatus::Active);

    // Keep-alives extend every bound lease at once, without touching them.
    for _ in 0..5 {
        h.advance(600);
        let kept = h.keep_alive(SESSION, "worker").unwrap();
        assert_eq!(kept.expires_at_ms, h.now_ms + 1_000);
        assert_eq!(kept.bound_leases, 1);
        assert_eq!(h.get("job").unwrap().expires_at_ms, kept.expires_at_ms);
        assert_eq!(h.get("job").unwrap().status, LeaseStatus::Active);
    }
    // A bound lease is not renewed on its own.
    let renew = h.renew("job", grant.lease_id, "worker", 1_000).unwrap_err();
    assert_eq!(renew.code(), ErrorCode::InvalidArgument);

    // No keep-alive: at the session's expiry the lease is EXPIRED for every read, before any
    // reclaim, and another holder may take the resource.
    let expires_at_ms = h.get("job").unwrap().expires_at_ms;
    h.now_ms = expires_at_ms;
    let view = h.get("job").unwrap();
    assert_eq!(view.status, LeaseStatus::Expired);
    assert_eq!(view.remaining_ttl_ms, 0);
    assert_eq!(
        h.keep_alive(SESSION, "worker").unwrap_err(),
        LeaseError::SessionExpired {
            session_id: SessionId(SESSION)
        }
    );
    let other = h.acquire("job", "other", 1_000).unwrap();
    assert!(other.fencing_token > grant.fencing_token);
    assert_eq!(h.get("job").unwrap().session_id, None);
}

#[test]
fn closing_a_session_ends_its_leases_at_once_and_reclaims_them_in_bounded_steps() {
    let mut h = harness();
    h.open_session(SESSION, "worker", 60_000).unwrap();
    for i in 0..25 {
        h.acquire_in_session(&format!("r{i}"), "worker", SESSION)
            .unwrap();
    }
    h.acquire("own", "worker", 60_000).unwrap();
    assert_eq!(h.state.stats().active_leases, 26);
    h.advance(10);
    let closed = h.close_session(SESSION, "worker").unwrap();
    assert_eq!(closed.leases_ended, 25);
    assert_eq!(closed.closed_at_ms, h.now_ms);
    // Retried close: the same answer.
    assert_eq!(
        h.close_session(SESSION, "worker").unwrap().closed_at_ms,
        closed.closed_at_ms
    );
    for i in 0..25 {
        let view = h.get(&format!("r{i}")).unwrap();
        assert_eq!(view.status, LeaseStatus::Expired, "r{i}");
        assert_eq!(view.expires_at_ms, closed.closed_at_ms);
    }
    assert_eq!(h.get("own").unwrap().status, LeaseStatus::Active);
    assert_eq!(h.state.next_expiry_ms(), Some(closed.closed_at_ms));
    // Reclaimed at most `expire_batch_max` (10) per entry.
    assert_eq!(expire(&mut h, 100), (10, true));
    assert_eq!(expire(&mut h, 4), (4, true));
    assert_eq!(expire(&mut h, 100), (10, true));
    assert_eq!(expire(&mut h, 100), (1, false));
    assert_eq!(h.state.stats().active_leases, 1);
    // The session's record is kept for the retention (a late keep-alive learns it ended), then
    // freed (NOT_FOUND).
    assert!(matches!(
        h.keep_alive(SESSION, "worker"),
        Err(LeaseError::SessionExpired { .. })
    ));
    h.advance(5_000);
    h.acquire("tick", "worker", 60_000).unwrap();
    assert!(matches!(
        h.keep_alive(SESSION, "worker"),
        Err(LeaseError::SessionNotFound { .. })
    ));
}

#[test]
fn expired_sessions_and_leases_are_reclaimed_in_log_time_order() {
    let mut h = harness();
    h.acquire("early", "x", 500).unwrap();
    h.open_session(SESSION, "worker", 1_000).unwrap();
    h.acquire_in_session("bound", "worker", SESSION).unwrap();
    h.acquire("late", "x", 2_000).unwrap();
    h.advance(3_000);
    let out = h.apply(Command::Expire { leases_max: 100 });
    let order: Vec<&str> = out
        .reclaimed
        .iter()
        .map(|l| l.resource_id.as_str())
        .collect();
    assert_eq!(order, ["early", "bound", "late"]);
    let sessions: Vec<_> = out.reclaimed.iter().map(|l| l.session_id).collect();
    assert_eq!(sessions, [None, Some(SessionId(SESSION)), None]);
    assert_eq!(h.state.stats().active_leases, 0);
}

#[test]
fn session_errors_are_typed_and_deterministic() {
    let mut h = harness();
    let missing = h.acquire_in_session("job", "worker", SESSION).unwrap_err();
    assert_eq!(missing.code(), ErrorCode::NotFound);
    assert_eq!(
        h.keep_alive(SESSION, "worker").unwrap_err().code(),
        ErrorCode::NotFound
    );
    h.open_session(SESSION, "worker", 1_000).unwrap();
    // Another owner may not use, keep alive or close it.
    assert_eq!(
        h.acquire_in_session("job", "intruder", SESSION)
            .unwrap_err()
            .code(),
        ErrorCode::InvalidArgument
    );
    assert_eq!(
        h.keep_alive(SESSION, "intruder").unwrap_err().code(),
        ErrorCode::InvalidArgument
    );
    assert_eq!(
        h.close_session(SESSION, "intruder").unwrap_err().code(),
        ErrorCode::InvalidArgument
    );
    // A retried open extends; another ttl is refused.
    h.advance(100);
    let again = h.open_session(SESSION, "worker", 1_000).unwrap();
    assert!(!again.created);
    assert_eq!(again.expires_at_ms, h.now_ms + 1_000);
    assert_eq!(
        h.open_session(SESSION, "worker", 2_000).unwrap_err().code(),
        ErrorCode::InvalidArgument
    );
    // Out-of-bounds ttl, wrong group.
    assert_eq!(
        h.open_session(7, "worker", 10).unwrap_err().code(),
        ErrorCode::InvalidArgument
    );
    let mut wrong_group = common::session_request(SESSION, "worker");
    wrong_group.group_id = tenure_core::GroupId(99);
    let answer = h.op(LeaseOp::SessionKeepAlive(wrong_group)).result;
    assert_eq!(answer.unwrap_err().code(), ErrorCode::InvalidArgument);
    // Once ended, never reopened while its record is retained.
    h.close_session(SESSION, "worker").unwrap();
    assert_eq!(
        h.open_session(SESSION, "worker", 1_000).unwrap_err().code(),
        ErrorCode::LeaseExpired
    );
    assert_eq!(
        h.acquire_in_session("job", "worker", SESSION)
            .unwrap_err()
            .code(),
        ErrorCode::LeaseExpired
    );
}

#[test]
fn bound_leases_are_exactly_once_release_and_transfer_unbind_them() {
    let mut h = harness();
    h.open_session(SESSION, "worker", 10_000).unwrap();
    let op = session_acquire_op("job", "worker", SESSION, "acq-1");
    let first = h.op(op.clone());
    let grant = match &first.result {
        Ok(tenure_core::LeaseReply::Acquired(grant)) => grant.clone(),
        other => panic!("{other:?}"),
    };
    let retry = h.op(op);
    assert!(retry.replayed);
    assert_eq!(retry.result, first.result);
    // The same request id in another session is another request: refused, not replayed.
    h.open_session(SESSION + 1, "worker", 10_000).unwrap();
    let reused = h.op(session_acquire_op("job", "worker", SESSION + 1, "acq-1"));
    assert_eq!(
        reused.result.unwrap_err().code(),
        ErrorCode::InvalidArgument
    );

    // Transfer hands the resource over as a lease of its own; the session no longer binds it.
    let receipt = h
        .op(transfer_op(
            "job",
            grant.lease_id,
            "worker",
            "heir",
            5_000,
            "t-1",
        ))
        .result
        .unwrap();
    assert!(matches!(receipt, tenure_core::LeaseReply::Transferred(_)));
    assert_eq!(h.get("job").unwrap().session_id, None);
    assert_eq!(h.keep_alive(SESSION, "worker").unwrap().bound_leases, 0);

    // Release of a bound lease ends it and unbinds it.
    let second = h.acquire_in_session("other", "worker", SESSION).unwrap();
    assert_eq!(h.keep_alive(SESSION, "worker").unwrap().bound_leases, 1);
    h.op(release_op("other", second.lease_id, "worker", "rel-1"))
        .result
        .unwrap();
    assert_eq!(h.keep_alive(SESSION, "worker").unwrap().bound_leases, 0);
    // Closing the session now ends nothing else.
    assert_eq!(h.close_session(SESSION, "worker").unwrap().leases_ended, 0);
    assert_eq!(h.get("job").unwrap().status, LeaseStatus::Active);
}

#[test]
fn session_quotas_hold() {
    let mut h = harness();
    h.apply(Command::SetTenantPolicy {
        tenant_id: TENANT.to_owned(),
        policy: TenantPolicy {
            active_leases_max: Some(3),
            ttl_ms_min: None,
            ttl_ms_max: None,
        },
    });
    for session in 0..3 {
        h.open_session(session, "worker", 1_000).unwrap();
    }
    let refused = h.open_session(3, "worker", 1_000).unwrap_err();
    assert_eq!(refused.code(), ErrorCode::QuotaExceeded);
    // Bound leases count against the tenant's lease quota like any other.
    for i in 0..3 {
        h.acquire_in_session(&format!("r{i}"), "worker", 0).unwrap();
    }
    assert_eq!(
        h.acquire_in_session("r3", "worker", 0).unwrap_err().code(),
        ErrorCode::QuotaExceeded
    );
    // A closed session frees its place at once.
    h.close_session(1, "worker").unwrap();
    h.open_session(3, "worker", 1_000).unwrap();
}

#[test]
fn snapshots_carry_sessions_and_restored_replicas_decide_identically() {
    let mut h = harness();
    h.open_session(SESSION, "worker", 2_000).unwrap();
    h.open_session(SESSION + 1, "worker", 2_000).unwrap();
    h.open_session(SESSION + 2, "worker", 2_000).unwrap();
    for i in 0..30 {
        let session = SESSION + (i % 3);
        h.acquire_in_session(&format!("r{i}"), "worker", session)
            .unwrap();
    }
    h.acquire("own", "x", 1_500).unwrap();
    h.advance(100);
    h.close_session(SESSION + 1, "worker").unwrap();
    h.apply(Command::Expire { leases_max: 3 });
    h.advance(50);
    h.keep_alive(SESSION, "worker").unwrap();
    let bytes = h.state.snapshot_to_vec();
    let mut restored = LeaseStateMachine::read_snapshot(
        bytes.as_slice(),
        StateOptions {
            hash_seed: 42,
            ..StateOptions::default()
        },
    )
    .unwrap();
    assert_eq!(restored.snapshot_to_vec(), bytes);
    assert_eq!(restored.stats(), h.state.stats());
    // The same entries on both give the same outputs and the same bytes.
    let script: Vec<(u64, Command)> = vec![
        (2_000, Command::Expire { leases_max: 100 }),
        (
            2_000,
            Command::Lease(session_acquire_op("r1", "worker", SESSION, "x1")),
        ),
        (2_100, Command::Lease(acquire_op("r2", "y", 500, "x2"))),
        (2_300, Command::Expire { leases_max: 100 }),
        (
            9_000,
            Command::Lease(session_open_op(SESSION + 5, "worker", 1_000)),
        ),
    ];
    for (advance_ms, command) in script {
        h.advance(advance_ms);
        let entry = tenure_core::Entry {
            log_time_ms: h.now_ms,
            command,
        };
        let a = h.state.apply(&entry);
        let b = restored.apply(&entry);
        assert_eq!(a, b);
        restored.check_invariants().unwrap();
        assert_eq!(h.state.snapshot_to_vec(), restored.snapshot_to_vec());
    }
    // Past the retention, the ended leases' records are gone on both.
    assert_eq!(h.get("r0"), None);
}

#[derive(Debug, Clone)]
enum Step {
    Open(u8),
    KeepAlive(u8),
    Close(u8),
    AcquireIn(u8, u8),
    Acquire(u8),
    Release(u8),
    Expire(u8),
    Advance(u16),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0u8..4).prop_map(Step::Open),
        (0u8..4).prop_map(Step::KeepAlive),
        (0u8..4).prop_map(Step::Close),
        (0u8..4, 0u8..12).prop_map(|(s, r)| Step::AcquireIn(s, r)),
        (0u8..12).prop_map(Step::Acquire),
        (0u8..12).prop_map(Step::Release),
        (1u8..8).prop_map(Step::Expire),
        (1u16..800).prop_map(Step::Advance),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Random interleavings: the invariants hold after every entry (the harness checks them),
    /// no read ever shows a bound lease active after its session ended, at most one lease per
    /// resource is active, and a snapshot taken anywhere restores to the same bytes.
    #[test]
    fn sessions_under_random_interleavings(steps in proptest::collection::vec(step(), 1..80)) {
        let mut h = harness();
        let mut request = 0u64;
        for step in steps {
            request += 1;
            let request_id = format!("q{request}");
            match step {
                Step::Open(s) => {
                    let _ = h.op(session_open_op(u128::from(s), "worker", 1_000));
                }
                Step::KeepAlive(s) => {
                    let _ = h.keep_alive(u128::from(s), "worker");
                }
                Step::Close(s) => {
                    let _ = h.close_session(u128::from(s), "worker");
                }
                Step::AcquireIn(s, r) => {
                    let _ = h.op(session_acquire_op(&format!("r{r}"), "worker", u128::from(s), &request_id));
                }
                Step::Acquire(r) => {
                    let _ = h.op(acquire_op(&format!("r{r}"), "other", 700, &request_id));
                }
                Step::Release(r) => {
                    if let Some(view) = h.get(&format!("r{r}")) {
                        let _ = h.op(release_op(&format!("r{r}"), view.lease_id, &view.holder_id, &request_id));
                    }
                }
                Step::Expire(n) => {
                    h.apply(Command::Expire { leases_max: u32::from(n) });
                }
                Step::Advance(ms) => h.advance(u64::from(ms)),
            }
            for r in 0..12 {
                let Some(view) = h.state.get(&key(&format!("r{r}")), h.now_ms).unwrap() else {
                    continue;
                };
                if let (LeaseStatus::Active, Some(session)) = (view.status, view.session_id) {
                    // Its session must be alive now: a keep-alive by its owner would succeed
                    // (checked on a copy, so the run itself is not changed).
                    let mut probe = h.state.clone();
                    let out = probe.apply(&tenure_core::Entry {
                        log_time_ms: h.now_ms,
                        command: Command::Lease(LeaseOp::SessionKeepAlive(
                            common::session_request(session.0, "worker"),
                        )),
                    });
                    let CommandResult::Lease(outcome) = out.result else { panic!() };
                    prop_assert!(outcome.result.is_ok(), "active lease of a dead session: {view:?}");
                    prop_assert!(view.expires_at_ms > h.now_ms);
                }
            }
        }
        let bytes = h.state.snapshot_to_vec();
        let restored = LeaseStateMachine::read_snapshot(bytes.as_slice(), StateOptions::default()).unwrap();
        prop_assert_eq!(restored.snapshot_to_vec(), bytes);
    }
}

#[test]
fn a_retried_acquire_in_session_reports_the_sessions_current_expiry() {
    let mut h = harness();
    h.open_session(SESSION, "worker", 1_000).unwrap();
    let op = session_acquire_op("job", "worker", SESSION, "acq-r");
    let first = h.op(op.clone());
    assert!(first.result.is_ok());
    // Kept alive well past the grant's own expiry: the retry still stands, until the
    // session's current expiry.
    for _ in 0..4 {
        h.advance(600);
        h.keep_alive(SESSION, "worker").unwrap();
    }
    let retry = h.op(op);
    assert!(retry.replayed);
    let replay = retry.replay.unwrap();
    assert_eq!(replay.status, tenure_core::ReplayStatus::Active);
    assert_eq!(replay.expires_at_ms, h.now_ms + 1_000);
    assert_eq!(replay.remaining_ttl_ms, 1_000);
}

#[test]
fn expired_sessions_do_not_hold_the_tenants_quota_and_ended_records_are_kept_for_retention() {
    let mut h = Harness::with_limits(GroupLimits {
        ttl_ms_min: 100,
        inactive_retention_ms: 5_000,
        lease_records_max: 3,
        ..GroupLimits::default()
    });
    h.apply(Command::SetTenantPolicy {
        tenant_id: TENANT.to_owned(),
        policy: TenantPolicy {
            active_leases_max: Some(2),
            ttl_ms_min: None,
            ttl_ms_max: None,
        },
    });
    h.open_session(1, "worker", 1_000).unwrap();
    h.open_session(2, "worker", 1_000).unwrap();
    // Both past expiry, neither reclaimed: the quota does not count them.
    h.advance(1_000);
    h.open_session(3, "worker", 1_000).unwrap();
    h.open_session(4, "worker", 1_000).unwrap_err();
    // The group holds 3 records (two ended, kept for retention, and one active): an open must
    // not drop an ended record early, so a late open of session 1 still learns it ended.
    h.close_session(3, "worker").unwrap();
    let full = h.open_session(5, "worker", 1_000).unwrap_err();
    assert!(matches!(
        full,
        LeaseError::QuotaExceeded {
            kind: tenure_core::QuotaKind::GroupSessions,
            ..
        }
    ));
    assert_eq!(
        h.open_session(1, "worker", 1_000).unwrap_err().code(),
        ErrorCode::LeaseExpired
    );
    // Past the retention, their places are free again.
    h.advance(5_000);
    h.open_session(5, "worker", 1_000).unwrap();
}
