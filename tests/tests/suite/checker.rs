//! The lease-safety checker against hand-made histories: valid ones pass, and each broken
//! guarantee is caught (a checker never seen failing proves nothing).

use tenure_tests::checker::{CheckConfig, CheckReport, Property, check, check_liveness};
use tenure_tests::history::{
    FencedWrite, History, LeaseRef, LockBeat, OpKind, OpRecord, Outcome, ViewRecord, WaitRecord,
    WatchItemRecord, WatchRecord, WriteRecord,
};

const MS: u64 = 1_000_000;
const TTL: u64 = 3_000;
/// The client library's window for a 3 s ttl: 3000 - 30 - 30 - 50 ms.
const WINDOW: u64 = 2_890 * MS;

struct Builder {
    ops: Vec<OpRecord>,
    writes: Vec<WriteRecord>,
    watch: Vec<WatchRecord>,
    lock_beats: Vec<LockBeat>,
    next: u64,
}

fn lease(sequence: u64) -> LeaseRef {
    LeaseRef { group: 3, sequence }
}

impl Builder {
    fn new() -> Self {
        Builder {
            ops: Vec::new(),
            writes: Vec::new(),
            watch: Vec::new(),
            lock_beats: Vec::new(),
            next: 1,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn push(
        &mut self,
        holder: &str,
        kind: OpKind,
        lease: Option<LeaseRef>,
        at_ms: u64,
        took_ms: Option<u64>,
        outcome: Outcome,
        replay_of: Option<u64>,
    ) -> u64 {
        let id = self.next;
        self.next += 1;
        let request_id = match (kind, replay_of) {
            (OpKind::Get | OpKind::KeepAlive | OpKind::SessionClose, _) => None,
            (_, Some(original)) => self
                .ops
                .iter()
                .find(|op| op.id == original)
                .and_then(|op| op.request_id.clone()),
            _ => Some(format!("req-{id}")),
        };
        self.ops.push(OpRecord {
            id,
            client: holder.to_string(),
            holder: holder.to_string(),
            resource: "r".into(),
            group: 3,
            kind,
            request_id,
            lease,
            new_holder: None,
            ttl_ms: if matches!(
                kind,
                OpKind::Acquire | OpKind::Renew | OpKind::Transfer | OpKind::KeepAlive
            ) {
                TTL
            } else {
                0
            },
            replay_of,
            wait: None,
            invoke_ns: at_ms * MS,
            complete_ns: took_ms.map(|took| (at_ms + took) * MS),
            attempts: 1,
            outcome,
        });
        id
    }

    /// A successful acquire by `holder` of lease `sequence` at log time `log_ms`.
    fn acquire(&mut self, holder: &str, sequence: u64, at_ms: u64, log_ms: u64) -> u64 {
        self.push(
            holder,
            OpKind::Acquire,
            None,
            at_ms,
            Some(10),
            granted(sequence, log_ms, at_ms),
            None,
        )
    }

    fn renew(&mut self, holder: &str, sequence: u64, at_ms: u64, log_ms: u64) -> u64 {
        self.push(
            holder,
            OpKind::Renew,
            Some(lease(sequence)),
            at_ms,
            Some(10),
            granted(sequence, log_ms, at_ms),
            None,
        )
    }

    /// A confirmed keep-alive of the session lease `sequence` is bound to, sent at `at_ms`.
    fn keepalive(&mut self, holder: &str, sequence: u64, at_ms: u64, log_ms: u64) -> u64 {
        self.push(
            holder,
            OpKind::KeepAlive,
            Some(lease(sequence)),
            at_ms,
            Some(10),
            granted(sequence, log_ms, at_ms),
            None,
        )
    }

    /// A close of the session lease `sequence` is bound to, at log time `log_ms`.
    fn close_session(&mut self, holder: &str, sequence: u64, at_ms: u64, log_ms: u64) -> u64 {
        self.push(
            holder,
            OpKind::SessionClose,
            Some(lease(sequence)),
            at_ms,
            Some(10),
            Outcome::Released {
                lease: lease(sequence),
                token: sequence,
                released_at_ms: log_ms,
            },
            None,
        )
    }

    fn release(&mut self, holder: &str, sequence: u64, at_ms: u64, log_ms: u64) -> u64 {
        self.push(
            holder,
            OpKind::Release,
            Some(lease(sequence)),
            at_ms,
            Some(10),
            Outcome::Released {
                lease: lease(sequence),
                token: sequence,
                released_at_ms: log_ms,
            },
            None,
        )
    }

    /// A successful transfer of lease `sequence` from `holder` to `to`, granting lease
    /// `new_sequence` at log time `log_ms`.
    fn transfer(
        &mut self,
        holder: &str,
        sequence: u64,
        to: &str,
        new_sequence: u64,
        at_ms: u64,
        log_ms: u64,
    ) -> u64 {
        let id = self.push(
            holder,
            OpKind::Transfer,
            Some(lease(sequence)),
            at_ms,
            Some(10),
            granted(new_sequence, log_ms, at_ms),
            None,
        );
        if let Some(op) = self.ops.last_mut() {
            op.new_holder = Some(to.to_string());
        }
        id
    }

    fn refused(
        &mut self,
        holder: &str,
        kind: OpKind,
        at_ms: u64,
        code: &str,
        by: Option<&str>,
    ) -> u64 {
        self.push(
            holder,
            kind,
            None,
            at_ms,
            Some(10),
            Outcome::Refused {
                code: code.into(),
                holder: by.map(str::to_string),
            },
            None,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn get(
        &mut self,
        at_ms: u64,
        sequence: u64,
        holder: &str,
        status: &str,
        version: u64,
        log_ms: u64,
    ) -> u64 {
        self.push(
            "reader",
            OpKind::Get,
            None,
            at_ms,
            Some(10),
            Outcome::Read {
                view: Some(ViewRecord {
                    lease: lease(sequence),
                    holder: holder.into(),
                    status: status.into(),
                    token: sequence,
                    version,
                    expires_at_ms: log_ms + TTL,
                }),
                log_time_ms: log_ms,
            },
            None,
        )
    }

    fn check(&self) -> CheckReport {
        check(
            &History {
                ops: self.ops.clone(),
                writes: self.writes.clone(),
                faults: Vec::new(),
                watch: self.watch.clone(),
                lock_beats: self.lock_beats.clone(),
            },
            &CheckConfig::default(),
        )
    }
}

fn granted(sequence: u64, log_ms: u64, sent_at_ms: u64) -> Outcome {
    Outcome::Granted {
        lease: lease(sequence),
        token: sequence,
        log_time_ms: log_ms,
        expires_at_ms: log_ms + TTL,
        replayed: false,
        safe_deadline_ns: sent_at_ms * MS + WINDOW,
    }
}

fn properties(report: &CheckReport) -> Vec<Property> {
    let mut found: Vec<Property> = report.violations.iter().map(|v| v.property).collect();
    found.sort();
    found.dedup();
    found
}

fn assert_clean(report: &CheckReport) {
    assert!(
        report.violations.is_empty() && report.inconclusive.is_empty(),
        "expected no violation: {:#?}",
        report.violations
    );
}

fn assert_caught(report: &CheckReport, property: Property) {
    assert!(
        properties(report).contains(&property),
        "expected a {} violation, found {:?}: {:#?}",
        property.name(),
        properties(report),
        report.violations
    );
    let violation = report
        .violations
        .iter()
        .find(|v| v.property == property)
        .unwrap();
    assert!(
        !violation.ops.is_empty() || !violation.writes.is_empty(),
        "a violation shows its slice of history"
    );
}

/// A whole life: grant, renewals, reads, release, a new holder after it.
fn valid_history() -> Builder {
    let mut h = Builder::new();
    h.acquire("alice", 1, 0, 1_000);
    h.get(100, 1, "alice", "ACTIVE", 1, 1_100);
    h.refused("bob", OpKind::Acquire, 200, "ALREADY_HELD", Some("alice"));
    h.renew("alice", 1, 1_000, 2_000);
    h.get(1_100, 1, "alice", "ACTIVE", 2, 2_100);
    h.release("alice", 1, 1_500, 2_500);
    h.get(1_600, 1, "alice", "RELEASED", 3, 2_600);
    h.acquire("bob", 2, 1_700, 2_700);
    h.get(1_800, 2, "bob", "ACTIVE", 1, 2_800);
    h
}

#[test]
fn a_valid_history_passes() {
    let report = valid_history().check();
    assert_clean(&report);
    assert_eq!(report.ops_checked, 9);
}

#[test]
fn concurrent_acquires_where_one_is_refused_pass_in_either_completion_order() {
    let mut h = Builder::new();
    // Both asked at 0; bob's refusal (naming alice) comes back before alice's grant.
    h.push(
        "alice",
        OpKind::Acquire,
        None,
        0,
        Some(50),
        granted(1, 1_000, 0),
        None,
    );
    h.refused("bob", OpKind::Acquire, 0, "ALREADY_HELD", Some("alice"));
    assert_clean(&h.check());
}

#[test]
fn expiry_then_a_new_holder_passes_and_an_early_grant_is_caught() {
    let mut h = Builder::new();
    h.acquire("alice", 1, 0, 1_000);
    // Bob asks after alice's ttl could have run out (3 s of real time): allowed.
    h.acquire("bob", 2, 3_100, 4_100);
    assert_clean(&h.check());

    let mut h = Builder::new();
    h.acquire("alice", 1, 0, 1_000);
    // Bob is granted 1 s later, well inside alice's lease.
    h.acquire("bob", 2, 1_000, 2_000);
    let report = h.check();
    assert_caught(&report, Property::SingleHolder);
    assert_caught(&report, Property::Linearizable);
    assert_caught(&report, Property::NoLostAck);
}

#[test]
fn a_token_going_backwards_is_caught() {
    let mut h = Builder::new();
    h.acquire("alice", 5, 0, 1_000);
    h.release("alice", 5, 100, 1_100);
    h.acquire("bob", 4, 200, 1_200);
    let report = h.check();
    assert_caught(&report, Property::Fencing);
    assert_caught(&report, Property::Linearizable);
}

#[test]
fn a_renewal_that_changes_the_token_is_caught() {
    let mut h = Builder::new();
    h.acquire("alice", 1, 0, 1_000);
    h.push(
        "alice",
        OpKind::Renew,
        Some(lease(1)),
        500,
        Some(10),
        Outcome::Granted {
            lease: lease(1),
            token: 7,
            log_time_ms: 1_500,
            expires_at_ms: 4_500,
            replayed: false,
            safe_deadline_ns: 500 * MS + WINDOW,
        },
        None,
    );
    assert_caught(&h.check(), Property::Fencing);
}

#[test]
fn a_read_of_a_released_lease_as_active_is_caught() {
    let mut h = Builder::new();
    h.acquire("alice", 1, 0, 1_000);
    h.release("alice", 1, 100, 1_100);
    h.get(200, 1, "alice", "ACTIVE", 1, 1_200);
    let report = h.check();
    assert_caught(&report, Property::NoLostAck);
    assert_caught(&report, Property::Linearizable);
}

#[test]
fn a_lost_renewal_is_caught() {
    let mut h = Builder::new();
    h.acquire("alice", 1, 0, 1_000);
    h.renew("alice", 1, 500, 1_500);
    // The read after the acknowledged renewal sees the lease as granted, never renewed.
    h.get(600, 1, "alice", "ACTIVE", 1, 1_600);
    let report = h.check();
    assert_caught(&report, Property::NoLostAck);
    assert_caught(&report, Property::Linearizable);
}

#[test]
fn a_renewal_after_an_acknowledged_release_is_caught() {
    let mut h = Builder::new();
    h.acquire("alice", 1, 0, 1_000);
    h.release("alice", 1, 100, 1_100);
    h.renew("alice", 1, 200, 1_200);
    let report = h.check();
    assert_caught(&report, Property::NoLostAck);
    assert_caught(&report, Property::Linearizable);
}

#[test]
fn a_grant_before_the_promised_expiry_in_log_time_is_caught() {
    let mut h = Builder::new();
    h.acquire("alice", 1, 0, 1_000);
    // Real time allows it (alice asked 3.5 s earlier) but log time says alice's lease, granted
    // at log 1000 for 3 s, was not over at log 2000.
    h.acquire("bob", 2, 3_500, 2_000);
    assert_caught(&h.check(), Property::NoLostAck);
}

#[test]
fn an_unanswered_release_frees_the_resource_early_without_a_violation() {
    let mut h = Builder::new();
    h.acquire("alice", 1, 0, 1_000);
    // Alice's release gets no answer; it took effect at log 1100, and bob was granted at 1200,
    // long before the 4000 the grant had promised.
    h.push(
        "alice",
        OpKind::Release,
        Some(lease(1)),
        100,
        None,
        Outcome::Unknown {
            error: "timeout".into(),
        },
        None,
    );
    h.acquire("bob", 2, 200, 1_200);
    assert_clean(&h.check());
}

#[test]
fn log_time_going_back_is_caught() {
    let mut h = Builder::new();
    h.acquire("alice", 1, 0, 5_000);
    h.release("alice", 1, 100, 4_000);
    assert_caught(&h.check(), Property::NoLostAck);
}

#[test]
fn an_absent_record_after_a_grant_is_caught() {
    let mut h = Builder::new();
    h.acquire("alice", 1, 0, 1_000);
    h.push(
        "reader",
        OpKind::Get,
        None,
        100,
        Some(10),
        Outcome::Read {
            view: None,
            log_time_ms: 1_100,
        },
        None,
    );
    let report = h.check();
    assert_caught(&report, Property::NoLostAck);
    assert_caught(&report, Property::Linearizable);
}

#[test]
fn a_replay_that_applies_again_is_caught() {
    let mut h = Builder::new();
    let original = h.acquire("alice", 1, 0, 1_000);
    h.release("alice", 1, 100, 1_100);
    // The same request id sent again comes back as a fresh grant of a new lease.
    h.push(
        "alice",
        OpKind::Acquire,
        None,
        200,
        Some(10),
        granted(2, 1_200, 200),
        Some(original),
    );
    assert_caught(&h.check(), Property::ExactlyOnce);
}

#[test]
fn a_replay_of_a_refusal_must_refuse_again() {
    let mut h = Builder::new();
    h.acquire("alice", 1, 0, 1_000);
    let refused = h.refused("bob", OpKind::Acquire, 100, "ALREADY_HELD", Some("alice"));
    h.release("alice", 1, 200, 1_200);
    let replayed = Outcome::Refused {
        code: "ALREADY_HELD".into(),
        holder: Some("alice".into()),
    };
    h.push(
        "bob",
        OpKind::Acquire,
        None,
        300,
        Some(10),
        replayed,
        Some(refused),
    );
    assert_clean(&h.check());
    // Had the replay been granted (the lease is free now), it would have applied twice.
    h.push(
        "bob",
        OpKind::Acquire,
        None,
        400,
        Some(10),
        granted(2, 1_400, 400),
        Some(refused),
    );
    assert_caught(&h.check(), Property::ExactlyOnce);
}

#[test]
fn a_faithful_replay_passes() {
    let mut h = Builder::new();
    let original = h.acquire("alice", 1, 0, 1_000);
    let Outcome::Granted {
        lease,
        token,
        log_time_ms,
        expires_at_ms,
        ..
    } = h.ops[0].outcome.clone()
    else {
        unreachable!()
    };
    h.push(
        "alice",
        OpKind::Acquire,
        None,
        100,
        Some(10),
        Outcome::Granted {
            lease,
            token,
            log_time_ms,
            expires_at_ms,
            replayed: true,
            safe_deadline_ns: 100 * MS,
        },
        Some(original),
    );
    let report = h.check();
    assert_clean(&report);
    assert_eq!(report.replays_compared, 1);
}

#[test]
fn an_expired_read_inside_a_surely_active_lease_is_caught() {
    let mut h = Builder::new();
    h.acquire("alice", 1, 0, 1_000);
    h.get(500, 1, "alice", "EXPIRED", 1, 1_500);
    assert_caught(&h.check(), Property::Linearizable);
}

#[test]
fn an_unanswered_acquire_revealed_by_a_read_passes() {
    let mut h = Builder::new();
    h.push(
        "alice",
        OpKind::Acquire,
        None,
        0,
        None,
        Outcome::Unknown {
            error: "timeout".into(),
        },
        None,
    );
    h.refused("bob", OpKind::Acquire, 200, "ALREADY_HELD", Some("alice"));
    h.get(300, 1, "alice", "ACTIVE", 1, 1_300);
    assert_clean(&h.check());
    // But nobody else may then be granted inside that lease.
    h.acquire("bob", 2, 400, 1_400);
    assert_caught(&h.check(), Property::Linearizable);
}

#[test]
fn an_unanswered_acquire_that_never_happened_passes() {
    let mut h = Builder::new();
    h.push(
        "alice",
        OpKind::Acquire,
        None,
        0,
        None,
        Outcome::Unknown {
            error: "timeout".into(),
        },
        None,
    );
    h.acquire("bob", 1, 100, 1_100);
    h.get(200, 1, "bob", "ACTIVE", 1, 1_200);
    assert_clean(&h.check());
}

#[test]
fn an_already_held_naming_the_wrong_holder_is_caught() {
    let mut h = Builder::new();
    h.acquire("alice", 1, 0, 1_000);
    h.refused("carol", OpKind::Acquire, 100, "ALREADY_HELD", Some("bob"));
    assert_caught(&h.check(), Property::Linearizable);
}

#[test]
fn a_fenced_write_rejected_inside_its_window_is_caught() {
    let mut h = valid_history();
    h.writes.push(WriteRecord {
        write: FencedWrite {
            client: "bob".into(),
            holder: "bob".into(),
            resource: "r".into(),
            token: 2,
            checked_ns: 1_720 * MS,
            deadline_ns: 1_700 * MS + WINDOW,
        },
        arrived_ns: 1_730 * MS,
        accepted: true,
        highest_before: 1,
    });
    // Alice, paused past her deadline, writes late: rejected, as fencing should.
    h.writes.push(WriteRecord {
        write: FencedWrite {
            client: "alice".into(),
            holder: "alice".into(),
            resource: "r".into(),
            token: 1,
            checked_ns: 1_000 * MS,
            deadline_ns: 1_000 * MS + WINDOW,
        },
        arrived_ns: 5_000 * MS,
        accepted: false,
        highest_before: 2,
    });
    let report = h.check();
    assert_clean(&report);
    assert_eq!((report.late_writes, report.late_writes_rejected), (1, 1));

    // A write rejected although it arrived inside its writer's window: a higher token wrote
    // first.
    h.writes.push(WriteRecord {
        write: FencedWrite {
            client: "alice".into(),
            holder: "alice".into(),
            resource: "r".into(),
            token: 1,
            checked_ns: 1_000 * MS,
            deadline_ns: 9_000 * MS,
        },
        arrived_ns: 5_100 * MS,
        accepted: false,
        highest_before: 2,
    });
    assert_caught(&h.check(), Property::Fencing);
}

#[test]
fn a_client_without_progress_after_the_heal_is_caught() {
    let h = valid_history();
    let history = History {
        ops: h.ops.clone(),
        writes: Vec::new(),
        faults: Vec::new(),
        watch: Vec::new(),
        lock_beats: Vec::new(),
    };
    let clients = vec!["alice".to_string(), "bob".to_string()];
    // Healed at 1.65 s: bob acquired after it; alice did nothing more.
    let violations = check_liveness(&history, &clients, 1_650 * MS, 5_000 * MS);
    assert_eq!(violations.len(), 1, "{violations:#?}");
    assert_eq!(violations[0].property, Property::Liveness);
    assert!(violations[0].message.contains("alice"));
}

#[test]
fn a_long_contended_history_is_checked_quickly_and_passes() {
    // 8 holders take turns on one resource for 2,000 grants, with reads and refusals in
    // between, all overlapping their neighbours: the search must not blow up.
    let mut h = Builder::new();
    let mut at = 0;
    let mut log = 1_000;
    for sequence in 1..=2_000u64 {
        let holder = format!("h{}", sequence % 8);
        h.acquire(&holder, sequence, at, log);
        let other = format!("h{}", (sequence + 1) % 8);
        h.refused(
            &other,
            OpKind::Acquire,
            at + 5,
            "ALREADY_HELD",
            Some(&holder),
        );
        h.get(at + 6, sequence, &holder, "ACTIVE", 1, log + 6);
        h.release(&holder, sequence, at + 20, log + 20);
        at += 30;
        log += 30;
    }
    let started = std::time::Instant::now();
    let report = h.check();
    assert_clean(&report);
    println!(
        "checker: {} operations of one resource checked in {:?}",
        report.ops_checked,
        started.elapsed()
    );
}

/// A hand-over: alice transfers to bob, who renews, reads and releases; carol's acquire at the
/// transfer is refused naming bob.
fn transfer_history() -> Builder {
    let mut h = Builder::new();
    h.acquire("alice", 1, 0, 1_000);
    h.transfer("alice", 1, "bob", 2, 500, 1_500);
    h.refused("carol", OpKind::Acquire, 600, "ALREADY_HELD", Some("bob"));
    h.get(700, 2, "bob", "ACTIVE", 1, 1_700);
    h.renew("bob", 2, 1_000, 2_000);
    h.release("bob", 2, 1_500, 2_500);
    h.acquire("carol", 3, 1_700, 2_700);
    h
}

#[test]
fn a_transfer_history_passes() {
    let report = transfer_history().check();
    assert_clean(&report);
    assert_eq!(report.ops_checked, 7);
}

#[test]
fn a_transfer_that_does_not_raise_the_token_is_caught() {
    let mut h = Builder::new();
    h.acquire("alice", 5, 0, 1_000);
    h.transfer("alice", 5, "bob", 4, 500, 1_500);
    let report = h.check();
    assert_caught(&report, Property::Linearizable);
    assert_caught(&report, Property::Fencing);
}

#[test]
fn the_old_holder_acting_after_a_transfer_is_caught() {
    let mut h = Builder::new();
    h.acquire("alice", 1, 0, 1_000);
    h.transfer("alice", 1, "bob", 2, 500, 1_500);
    // alice renews her old lease after the hand-over was acknowledged.
    h.renew("alice", 1, 700, 1_700);
    let report = h.check();
    assert_caught(&report, Property::Linearizable);
    assert_caught(&report, Property::NoLostAck);
}

#[test]
fn a_transfer_by_someone_other_than_the_holder_is_caught() {
    let mut h = Builder::new();
    h.acquire("alice", 1, 0, 1_000);
    h.transfer("mallory", 1, "mallory", 2, 500, 1_500);
    assert_caught(&h.check(), Property::Linearizable);
}

#[test]
fn a_read_showing_the_old_holder_after_a_transfer_is_caught() {
    let mut h = Builder::new();
    h.acquire("alice", 1, 0, 1_000);
    h.transfer("alice", 1, "bob", 2, 500, 1_500);
    h.get(700, 1, "alice", "ACTIVE", 1, 1_700);
    let report = h.check();
    assert_caught(&report, Property::Linearizable);
    assert_caught(&report, Property::NoLostAck);
}

#[test]
fn an_unanswered_transfer_revealed_by_a_read_passes() {
    let mut h = Builder::new();
    h.acquire("alice", 1, 0, 1_000);
    let id = h.push(
        "alice",
        OpKind::Transfer,
        Some(lease(1)),
        500,
        None,
        Outcome::Unknown {
            error: "timed out".into(),
        },
        None,
    );
    if let Some(op) = h.ops.iter_mut().find(|op| op.id == id) {
        op.new_holder = Some("bob".into());
    }
    h.get(1_000, 2, "bob", "ACTIVE", 1, 2_000);
    assert_clean(&h.check());
}

/// A session-bound lease: kept alive past its grant's expiry by keep-alives alone (version
/// unchanged), then ended by its session's close (EXPIRED, version unchanged), then granted to
/// another holder.
fn session_history() -> Builder {
    let mut h = Builder::new();
    h.acquire("alice", 1, 0, 1_000);
    h.keepalive("alice", 1, 1_000, 2_000);
    h.keepalive("alice", 1, 2_000, 3_000);
    h.keepalive("alice", 1, 3_000, 4_000);
    // Past the grant's own expiry (log 4000) and still ACTIVE at version 1.
    h.get(3_500, 1, "alice", "ACTIVE", 1, 4_500);
    h.refused("bob", OpKind::Acquire, 3_600, "ALREADY_HELD", Some("alice"));
    h.close_session("alice", 1, 4_000, 5_000);
    h.get(4_100, 1, "alice", "EXPIRED", 1, 5_100);
    h.acquire("bob", 2, 4_200, 5_200);
    h
}

#[test]
fn a_session_bound_lease_kept_alive_then_closed_passes() {
    assert_clean(&session_history().check());
}

#[test]
fn a_session_lease_read_active_after_its_sessions_close_is_caught() {
    let mut h = Builder::new();
    h.acquire("alice", 1, 0, 1_000);
    h.keepalive("alice", 1, 1_000, 2_000);
    h.close_session("alice", 1, 1_500, 2_500);
    // The negative control: the lease outlives its session's close.
    h.get(1_600, 1, "alice", "ACTIVE", 1, 2_600);
    assert_caught(&h.check(), Property::NoLostAck);
}

#[test]
fn another_holder_inside_a_keepalive_extended_window_is_caught() {
    let mut h = Builder::new();
    h.acquire("alice", 1, 0, 1_000);
    h.keepalive("alice", 1, 2_000, 3_000);
    // Bob is granted at 4000 ms real time: past alice's first window (2890 ms), inside the
    // one the keep-alive at 2000 ms gave (until 4890 ms), and before the keep-alive's promised
    // expiry in log time.
    h.acquire("bob", 2, 4_000, 5_000);
    let report = h.check();
    assert_caught(&report, Property::SingleHolder);
    assert_caught(&report, Property::NoLostAck);
}

/// A history of waits on "r": alice holds lease 1; bob queues at log 1100 and carol at log
/// 1200 (both waiting until log 6000); alice releases at log 1500 and the queue hands the
/// resource to `first` (lease 2), who releases at log 2500, handing it to the other (lease 3).
fn wait_history(first: &str, second: &str) -> Builder {
    let mut h = Builder::new();
    h.acquire("alice", 1, 0, 1_000);
    let queued_at = |name: &str| if name == "bob" { 1_100 } else { 1_200 };
    // The waiters: asked at 100 and 200 ms, answered at their grants.
    let first_id = h.push(
        first,
        OpKind::Acquire,
        None,
        if first == "bob" { 100 } else { 200 },
        Some(1_500 - if first == "bob" { 100 } else { 200 } + 10),
        granted(2, 1_500, 1_500),
        None,
    );
    let second_id = h.push(
        second,
        OpKind::Acquire,
        None,
        if second == "bob" { 100 } else { 200 },
        Some(2_500 - if second == "bob" { 100 } else { 200 } + 10),
        granted(3, 2_500, 2_500),
        None,
    );
    for (id, name) in [(first_id, first), (second_id, second)] {
        let op = h.ops.iter_mut().find(|op| op.id == id).unwrap();
        op.wait = Some(WaitRecord {
            wait_ms: 5_000,
            queued_at_ms: Some(queued_at(name)),
            wait_until_ms: Some(queued_at(name) + 4_800),
            position: Some(0),
        });
    }
    h.release("alice", 1, 1_490, 1_500);
    h.release(first, 2, 2_490, 2_500);
    h.release(second, 3, 3_490, 3_500);
    h
}

#[test]
fn waiters_granted_in_queue_order_pass() {
    let report = wait_history("bob", "carol").check();
    assert_clean(&report);
    assert_eq!(report.hand_offs_judged, 2);
}

#[test]
fn a_hand_off_past_a_live_earlier_waiter_is_caught() {
    assert_caught(&wait_history("carol", "bob").check(), Property::WaitQueue);
}

#[test]
fn a_hand_off_to_a_waiter_whose_wait_ended_is_caught() {
    let mut h = wait_history("bob", "carol");
    // Carol's wait ended at log 2000, before the hand-off at 2500.
    let carol = h
        .ops
        .iter_mut()
        .find(|op| op.holder == "carol" && op.wait.is_some())
        .unwrap();
    carol.wait.as_mut().unwrap().wait_until_ms = Some(2_000);
    assert_caught(&h.check(), Property::WaitQueue);
}

fn watch_item(watcher: &str, item: WatchItemRecord) -> WatchRecord {
    WatchRecord {
        watcher: watcher.into(),
        at_ns: 0,
        group: 3,
        item,
    }
}

fn event(index: u64, kind: &str, holder: Option<&str>, token: u64) -> WatchItemRecord {
    WatchItemRecord::Event {
        index,
        log_time_ms: index * 100,
        resource: "r".into(),
        kind: kind.into(),
        holder: holder.map(str::to_string),
        token,
    }
}

/// What a watcher of the [`valid_history`]-like life of "r" sees: grants 1..=3 with their
/// ends, resuming once from its cursor (the event after the cursor comes again).
fn watched() -> Builder {
    let mut h = Builder::new();
    h.acquire("alice", 1, 0, 1_000);
    h.release("alice", 1, 500, 1_500);
    h.acquire("bob", 2, 600, 1_600);
    h.release("bob", 2, 700, 1_700);
    h.acquire("carol", 3, 800, 1_800);
    let items = [
        WatchItemRecord::Started { index: 5 },
        event(6, "ACQUIRED", Some("alice"), 1),
        WatchItemRecord::Through { index: 6 },
        event(8, "RELEASED", Some("alice"), 1),
        event(9, "ACQUIRED", Some("bob"), 2),
        WatchItemRecord::Through { index: 9 },
        event(10, "RELEASED", Some("bob"), 2),
        // The stream is dropped here and a new one resumes after 9: event 10 comes again.
        WatchItemRecord::Resumed { after: 9 },
        event(10, "RELEASED", Some("bob"), 2),
        event(11, "ACQUIRED", Some("carol"), 3),
        WatchItemRecord::Through { index: 11 },
    ];
    h.watch = items
        .into_iter()
        .map(|item| watch_item("w1", item))
        .collect();
    h
}

#[test]
fn a_watch_stream_in_order_and_resumed_from_its_cursor_passes() {
    let report = watched().check();
    assert_clean(&report);
    assert_eq!(report.watch_events_judged, 6);
}

#[test]
fn a_watch_stream_with_a_missing_grant_is_caught() {
    let mut h = watched();
    // Bob's grant (token 2) and its release never arrive.
    h.watch
        .retain(|record| !matches!(record.item, WatchItemRecord::Event { token: 2, .. }));
    let report = h.check();
    assert!(
        report
            .violations
            .iter()
            .any(|v| v.property == Property::Watch && v.message.contains("missing")),
        "{:#?}",
        report.violations
    );
}

#[test]
fn a_grant_before_the_previous_leases_end_in_a_watch_stream_is_caught() {
    let mut h = watched();
    // Alice's release never arrives: bob's grant comes while her lease is still open.
    h.watch.retain(|record| {
        !matches!(&record.item, WatchItemRecord::Event { kind, token: 1, .. } if kind == "RELEASED")
    });
    let report = h.check();
    assert!(
        report
            .violations
            .iter()
            .any(|v| v.property == Property::Watch && v.message.contains("before the end")),
        "{:#?}",
        report.violations
    );
}

#[test]
fn a_watch_event_out_of_log_order_or_unlike_the_history_is_caught() {
    let mut h = watched();
    // Out of order: an event before the Through it follows.
    h.watch.push(watch_item("w1", event(7, "EXPIRED", None, 3)));
    // Unlike the history: a second watcher says token 2 went to dave.
    h.watch
        .push(watch_item("w2", WatchItemRecord::Started { index: 8 }));
    h.watch
        .push(watch_item("w2", event(9, "ACQUIRED", Some("dave"), 2)));
    let report = h.check();
    let messages: Vec<&str> = report
        .violations
        .iter()
        .filter(|v| v.property == Property::Watch)
        .map(|v| v.message.as_str())
        .collect();
    assert!(
        messages.iter().any(|m| m.contains("not after the Through")),
        "{messages:#?}"
    );
    assert!(messages.iter().any(|m| m.contains("dave")), "{messages:#?}");
}

fn beats(h: &mut Builder, token: u64, from_ms: u64, to_ms: u64) {
    for at_ms in (from_ms..=to_ms).step_by(10) {
        h.lock_beats.push(LockBeat {
            name: "lock".into(),
            token,
            at_ns: at_ms * MS,
        });
    }
}

#[test]
fn lock_commands_one_after_another_pass_and_overlapping_ones_are_caught() {
    let mut h = Builder::new();
    beats(&mut h, 4, 0, 500);
    beats(&mut h, 7, 600, 900);
    let report = h.check();
    assert_clean(&report);
    assert_eq!(report.lock_runs_judged, 2);
    // A third command, of a higher token, starts while the second still runs.
    beats(&mut h, 9, 850, 1_200);
    let report = h.check();
    assert!(
        report
            .violations
            .iter()
            .any(|v| v.property == Property::LockCommand && v.message.contains("token 9")),
        "{:#?}",
        report.violations
    );
}
