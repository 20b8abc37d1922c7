//! Watch events derived from applied entries ([`tenure_core::events_of`]): which operations make
//! which events, their order within an entry (a lease's end before the next grant), that
//! replays and renewals make none, and the selectors.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;

use common::{Harness, TENANT, acquire_op, key, release_op, transfer_op};
use tenure_core::{
    Command, Entry, ExpiryReason, GroupLimits, LeaseOp, ResourceKey, WaitAcquireRequest, WaitLease,
    WatchEvent, WatchEventKind, WatchSelector, events_of,
};

/// Applies `command` at the harness's time as the entry at `index` and returns its events.
fn apply_events(h: &mut Harness, index: u64, command: Command) -> Vec<WatchEvent> {
    let entry = Entry {
        log_time_ms: h.now_ms,
        command: command.clone(),
    };
    let output = h.apply(command);
    let events = events_of(7, index, &entry, &output);
    for event in &events {
        assert_eq!((event.group_id, event.index), (7, index));
        assert_eq!(event.log_time_ms, entry.log_time_ms);
    }
    events
}

fn names(events: &[WatchEvent]) -> Vec<(&'static str, &str, u64)> {
    events
        .iter()
        .map(|e| {
            (
                e.kind.as_str(),
                e.key.resource_id.as_str(),
                e.kind.fencing_token(),
            )
        })
        .collect()
}

fn harness() -> Harness {
    Harness::with_limits(GroupLimits {
        ttl_ms_min: 100,
        expire_batch_max: 10,
        ..GroupLimits::default()
    })
}

#[test]
fn operations_make_events_in_log_order_with_an_end_before_the_next_grant() {
    let mut h = harness();
    let acquire = Command::Lease(acquire_op("job", "a", 1_000, "r1"));
    let events = apply_events(&mut h, 10, acquire.clone());
    assert_eq!(names(&events), [("ACQUIRED", "job", 1)]);
    let WatchEventKind::Acquired {
        holder_id,
        lease_id,
        session_id,
        expires_at_ms,
        ..
    } = &events[0].kind
    else {
        panic!("{events:?}")
    };
    assert_eq!((holder_id.as_str(), *session_id), ("a", None));
    assert_eq!(*expires_at_ms, h.now_ms + 1_000);
    let first_lease = *lease_id;
    // A retried request id changes nothing: no event. Nor does a renewal.
    assert!(apply_events(&mut h, 11, acquire).is_empty());
    let renew = h.renew("job", first_lease, "a", 1_000).unwrap();
    assert_eq!(renew.fencing_token, 1);
    // A waiter queues (no event); the release hands the resource to it in the same entry:
    // RELEASED, then HANDED_OFF with the next token.
    let wait = Command::Lease(LeaseOp::AcquireWait(WaitAcquireRequest {
        key: key("job"),
        holder_id: "b".into(),
        lease: WaitLease::Ttl { ttl_ms: 1_000 },
        wait_ms: 5_000,
        request_id: "w1".into(),
    }));
    assert!(apply_events(&mut h, 12, wait).is_empty());
    let events = apply_events(
        &mut h,
        13,
        Command::Lease(release_op("job", first_lease, "a", "r2")),
    );
    assert_eq!(
        names(&events),
        [("RELEASED", "job", 1), ("HANDED_OFF", "job", 2)]
    );
    let WatchEventKind::HandedOff {
        holder_id,
        previous_fencing_token,
        ..
    } = &events[1].kind
    else {
        panic!("{events:?}")
    };
    assert_eq!(
        (holder_id.as_str(), *previous_fencing_token),
        ("b", Some(1))
    );
    // b's lease runs out: EXPIRED (ttl) from the Expire entry.
    h.advance(1_500);
    let events = apply_events(&mut h, 14, Command::Expire { leases_max: 10 });
    assert_eq!(names(&events), [("EXPIRED", "job", 2)]);
    assert!(matches!(
        events[0].kind,
        WatchEventKind::Expired {
            reason: ExpiryReason::Ttl,
            ..
        }
    ));
    // A transfer: RELEASED by the old holder, then ACQUIRED by the new one.
    let grant = h.acquire("other", "c", 1_000).unwrap();
    let events = apply_events(
        &mut h,
        15,
        Command::Lease(transfer_op("other", grant.lease_id, "c", "d", 1_000, "t1")),
    );
    let token = grant.fencing_token;
    assert_eq!(
        names(&events),
        [
            ("RELEASED", "other", token),
            ("ACQUIRED", "other", token + 1)
        ]
    );
    // A batch: each operation's events in operation order; refused operations make none.
    let batch = Command::Batch(vec![
        acquire_op("x", "e", 1_000, "b1"),
        acquire_op("other", "e", 1_000, "b2"),
        acquire_op("y", "e", 1_000, "b3"),
    ]);
    let events = apply_events(&mut h, 16, batch);
    assert_eq!(
        names(&events),
        [("ACQUIRED", "x", token + 2), ("ACQUIRED", "y", token + 3)]
    );
}

#[test]
fn an_acquire_past_an_expiry_ends_the_old_lease_first() {
    let mut h = harness();
    h.acquire("job", "a", 1_000).unwrap();
    h.advance(1_001);
    // No Expire entry yet: the Acquire takes the expired lease over, and its end is reported
    // before the new grant.
    let events = apply_events(
        &mut h,
        5,
        Command::Lease(acquire_op("job", "b", 1_000, "r")),
    );
    assert_eq!(
        names(&events),
        [("EXPIRED", "job", 1), ("ACQUIRED", "job", 2)]
    );
}

#[test]
fn selectors_pick_a_resource_a_tenant_or_a_prefix() {
    let job = ResourceKey::new(TENANT, "jobs/a");
    let other_tenant = ResourceKey::new("other", "jobs/a");
    let shard = ResourceKey::new(TENANT, "shards/1");
    let resource = WatchSelector::Resource(job.clone());
    let tenant = WatchSelector::Tenant(TENANT.into());
    let prefix = WatchSelector::Prefix {
        tenant_id: TENANT.into(),
        prefix: "jobs/".into(),
    };
    let everything = WatchSelector::Prefix {
        tenant_id: TENANT.into(),
        prefix: String::new(),
    };
    for selector in [&resource, &tenant, &prefix, &everything] {
        selector.validate().unwrap();
        assert_eq!(selector.tenant_id(), TENANT);
        assert!(selector.matches(&job));
        assert!(!selector.matches(&other_tenant));
    }
    assert!(!resource.matches(&shard));
    assert!(tenant.matches(&shard));
    assert!(!prefix.matches(&shard));
    assert!(everything.matches(&shard));
    assert!(WatchSelector::Tenant(String::new()).validate().is_err());
    assert!(
        WatchSelector::Prefix {
            tenant_id: TENANT.into(),
            prefix: "x".repeat(100_000),
        }
        .validate()
        .is_err()
    );
}
