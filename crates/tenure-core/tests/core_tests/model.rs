//! Property test: random command sequences with random, non-decreasing log times, run against a
//! small reference model and two replicas of the real state machine.
//!
//! After every step it checks that
//! - the real outcome equals the model's (so every contract rule the model states holds);
//! - at most one holder is active per resource, and the next grant only comes after the previous
//!   lease ended (an independent checker that reads only real outputs);
//! - fencing tokens strictly increase per resource and renew never changes one;
//! - a replayed request id returns exactly the first outcome;
//! - replica A (snapshotted and restored at random points, with another hash seed) and replica B
//!   (never snapshotted) produce identical outputs and byte-identical snapshots;
//! - the state's internal invariants hold.
//!
//! `PROPTEST_CASES` sets the number of cases (default 4000); the count run is printed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::collections::{BTreeMap, HashMap};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use tenure_core::{
    AcquireRequest, ApplyOutput, Command, CommandResult, Entry, GroupId, GroupLimits, LeaseError,
    LeaseGrant, LeaseId, LeaseOp, LeaseOutcome, LeaseReply, LeaseStateMachine, LeaseStatus,
    QuotaKind, ReleaseReceipt, ReleaseRequest, RenewRequest, ReplayState, ReplayStatus,
    ResourceKey, StateOptions, TenantPolicy, TransferReceipt, TransferRequest,
};

const GROUP: GroupId = GroupId(3);
const TENANTS: [&str; 2] = ["t1", "t2"];
const RESOURCES: [&str; 4] = ["r0", "r1", "r2", "r3"];
const HOLDERS: [&str; 3] = ["h0", "h1", "h2"];
const TTLS: [u64; 5] = [50, 100, 250, 1_000, 5_000];
const REQUEST_IDS: usize = 24;

fn limits() -> GroupLimits {
    GroupLimits {
        ttl_ms_min: 100,
        ttl_ms_max: 10_000,
        dedup_retention_ms: 20_000,
        dedup_retention_ms_min: 0,
        inactive_retention_ms: 8_000,
        ..GroupLimits::default()
    }
}

// ---------------------------------------------------------------- actions

#[derive(Debug, Clone)]
struct OpSpec {
    kind: u8,
    tenant: usize,
    resource: usize,
    holder: usize,
    lease_pick: usize,
    use_owner: bool,
    ttl: usize,
    request: usize,
}

#[derive(Debug, Clone)]
enum Action {
    Op(OpSpec),
    Retry(usize),
    Batch(Vec<OpSpec>),
    Expire(u32),
    Policy {
        tenant: usize,
        active_max: Option<u64>,
        ttl_min: Option<u64>,
        ttl_max: Option<u64>,
    },
    Advance(u64),
    /// Advance to exactly the next expiry, or one millisecond before it: the boundary cases.
    AdvanceToExpiry(bool),
    Snapshot(u64),
}

fn op_spec() -> impl Strategy<Value = OpSpec> {
    (
        0u8..4,
        0..TENANTS.len(),
        0..RESOURCES.len(),
        0..HOLDERS.len(),
        any::<usize>(),
        prop::bool::weighted(0.85),
        0..TTLS.len(),
        0..REQUEST_IDS,
    )
        .prop_map(
            |(kind, tenant, resource, holder, lease_pick, use_owner, ttl, request)| OpSpec {
                kind,
                tenant,
                resource,
                holder,
                lease_pick,
                use_owner,
                ttl,
                request,
            },
        )
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        10 => op_spec().prop_map(Action::Op),
        3 => any::<usize>().prop_map(Action::Retry),
        2 => prop::collection::vec(op_spec(), 1..6).prop_map(Action::Batch),
        2 => prop_oneof![Just(0u32), Just(1), Just(2), Just(64)].prop_map(Action::Expire),
        1 => (
            0..TENANTS.len(),
            prop::option::of(1u64..4),
            prop::option::of(100u64..600),
            prop::option::of(600u64..20_000)
        )
            .prop_map(|(tenant, active_max, ttl_min, ttl_max)| Action::Policy {
                tenant,
                active_max,
                ttl_min,
                ttl_max,
            }),
        6 => prop_oneof![Just(0u64), 1u64..300, 300u64..3_000, Just(8_000u64)].prop_map(Action::Advance),
        2 => any::<bool>().prop_map(Action::AdvanceToExpiry),
        1 => any::<u64>().prop_map(Action::Snapshot),
    ]
}

// ---------------------------------------------------------------- the reference model

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MStatus {
    Active,
    Expired,
    Released,
}

#[derive(Debug, Clone)]
struct MRecord {
    holder: String,
    token: u64,
    expires_at: u64,
    ttl: u64,
    status: MStatus,
    version: u64,
}

type Fingerprint = (u8, String, Option<LeaseId>, Option<u64>, Option<String>);
type Outcome = Result<LeaseReply, LeaseError>;

/// The contract, stated as plainly as possible: maps, no indexes, no laziness.
struct Model {
    limits: GroupLimits,
    next_token: u64,
    records: BTreeMap<(String, String), MRecord>,
    policies: HashMap<String, TenantPolicy>,
    dedup: HashMap<(String, String, String), (u64, Fingerprint, Outcome)>,
}

fn lease_id(token: u64) -> LeaseId {
    LeaseId {
        group_id: GROUP,
        sequence: token,
    }
}

impl Model {
    fn new() -> Self {
        Model {
            limits: limits(),
            next_token: 1,
            records: BTreeMap::new(),
            policies: HashMap::new(),
            dedup: HashMap::new(),
        }
    }

    fn policy(&self, tenant: &str) -> TenantPolicy {
        self.policies.get(tenant).cloned().unwrap_or_default()
    }

    fn check_ttl(&self, tenant: &str, ttl: u64) -> Result<(), LeaseError> {
        let (min, max) = self.policy(tenant).ttl_bounds_ms(&self.limits);
        if ttl < min || ttl > max {
            return Err(LeaseError::invalid("ttl_ms", "out of bounds"));
        }
        Ok(())
    }

    fn active_count(&self, tenant: &str) -> u64 {
        self.records
            .iter()
            .filter(|((t, _), r)| t == tenant && r.status == MStatus::Active)
            .count() as u64
    }

    fn visible(&self, record: &MRecord, now: u64) -> bool {
        now < record.expires_at + self.limits.inactive_retention_ms
    }

    fn due(&self, now: u64) -> Vec<((String, String), u64)> {
        let mut due: Vec<_> = self
            .records
            .iter()
            .filter(|(_, r)| r.status == MStatus::Active && r.expires_at <= now)
            .map(|(k, r)| (k.clone(), r.expires_at))
            .collect();
        due.sort_by_key(|(_, at)| *at);
        due
    }

    fn reclaim(&mut self, key: &(String, String)) {
        let record = self.records.get_mut(key).unwrap();
        record.status = MStatus::Expired;
    }

    fn op(
        &mut self,
        op: &LeaseOp,
        now: u64,
        reclaimed: &mut Vec<(String, String)>,
    ) -> LeaseOutcome {
        let key = op
            .key()
            .expect("the model generates resource operations only");
        let dedup_key = (
            key.tenant_id.clone(),
            key.resource_id.clone(),
            op.request_id().to_owned(),
        );
        let fingerprint: Fingerprint = match op {
            LeaseOp::Acquire(r) => (1, r.holder_id.clone(), None, Some(r.ttl_ms), None),
            LeaseOp::Renew(r) => (
                2,
                r.holder_id.clone(),
                Some(r.lease_id),
                Some(r.ttl_ms),
                None,
            ),
            LeaseOp::Release(r) => (3, r.holder_id.clone(), Some(r.lease_id), None, None),
            LeaseOp::Transfer(r) => (
                4,
                r.holder_id.clone(),
                Some(r.lease_id),
                Some(r.ttl_ms),
                Some(r.new_holder_id.clone()),
            ),
            LeaseOp::SessionOpen(_)
            | LeaseOp::SessionKeepAlive(_)
            | LeaseOp::SessionClose(_)
            | LeaseOp::AcquireInSession(_)
            | LeaseOp::AcquireWait(_)
            | LeaseOp::WaitCancel(_) => {
                unreachable!(
                    "the model generates no session or wait operations (tests/sessions.rs, \
                     tests/waits.rs)"
                )
            }
        };
        if let Some((at, fp, outcome)) = self.dedup.get(&dedup_key)
            && at + self.limits.dedup_retention_ms > now
        {
            if *fp == fingerprint {
                let record_key = (key.tenant_id.clone(), key.resource_id.clone());
                return LeaseOutcome {
                    result: outcome.clone(),
                    replayed: true,
                    replay: Some(self.replay_state(&record_key, *at, outcome, now)),
                };
            }
            return LeaseOutcome {
                result: Err(LeaseError::invalid("request_id", "reused")),
                replayed: false,
                replay: None,
            };
        }
        let result = match op {
            LeaseOp::Acquire(r) => self.acquire(r, now, reclaimed),
            LeaseOp::Renew(r) => self.renew(r, now),
            LeaseOp::Release(r) => self.release(r, now),
            LeaseOp::Transfer(r) => self.transfer(r, now),
            LeaseOp::SessionOpen(_)
            | LeaseOp::SessionKeepAlive(_)
            | LeaseOp::SessionClose(_)
            | LeaseOp::AcquireInSession(_)
            | LeaseOp::AcquireWait(_)
            | LeaseOp::WaitCancel(_) => unreachable!("no session or wait operations in the model"),
        };
        self.dedup
            .insert(dedup_key, (now, fingerprint, result.clone()));
        LeaseOutcome {
            result,
            replayed: false,
            replay: None,
        }
    }

    /// Contract 3.4: a replay reports what is left of the original grant at the retry's log
    /// time (the original expiry or earlier), and nothing once its lease has ended.
    fn replay_state(
        &self,
        key: &(String, String),
        decided_at: u64,
        outcome: &Outcome,
        now: u64,
    ) -> ReplayState {
        let ended = |status, at: u64| ReplayState {
            answered_at_ms: now,
            decided_at_ms: decided_at,
            status,
            expires_at_ms: at.min(now),
            remaining_ttl_ms: 0,
        };
        let grant = match outcome {
            Ok(LeaseReply::Acquired(grant) | LeaseReply::Renewed(grant)) => grant,
            Ok(LeaseReply::Transferred(receipt)) => &receipt.grant,
            Ok(LeaseReply::Released(receipt)) => {
                return ended(ReplayStatus::Released, receipt.released_at_ms);
            }
            Ok(
                LeaseReply::SessionKept(_)
                | LeaseReply::SessionClosed(_)
                | LeaseReply::Queued(_)
                | LeaseReply::WaitCancelled(_),
            )
            | Err(_) => {
                return ended(ReplayStatus::NotAGrant, now);
            }
        };
        let Some(record) = self
            .records
            .get(key)
            .filter(|r| self.visible(r, now) && r.token == grant.fencing_token)
        else {
            return ended(ReplayStatus::Superseded, grant.expires_at_ms);
        };
        let end = grant.expires_at_ms.min(record.expires_at);
        match record.status {
            MStatus::Released => ended(ReplayStatus::Released, end),
            MStatus::Active if now < end => ReplayState {
                answered_at_ms: now,
                decided_at_ms: decided_at,
                status: ReplayStatus::Active,
                expires_at_ms: end,
                remaining_ttl_ms: end - now,
            },
            _ => ended(ReplayStatus::Expired, end),
        }
    }

    fn acquire(
        &mut self,
        r: &AcquireRequest,
        now: u64,
        reclaimed: &mut Vec<(String, String)>,
    ) -> Outcome {
        let tenant = r.key.tenant_id.as_str();
        self.check_ttl(tenant, r.ttl_ms)?;
        let quota = self.policy(tenant).active_leases_max(&self.limits);
        if self.active_count(tenant) >= quota {
            for (key, _) in self.due(now) {
                self.reclaim(&key);
                reclaimed.push(key);
            }
        }
        let key = (r.key.tenant_id.clone(), r.key.resource_id.clone());
        let mut was_active = false;
        if let Some(record) = self.records.get(&key) {
            if record.status == MStatus::Active && now < record.expires_at {
                return Err(LeaseError::AlreadyHeld {
                    holder_id: record.holder.as_str().into(),
                    remaining_ttl_ms: record.expires_at - now,
                });
            }
            was_active = record.status == MStatus::Active;
        }
        if !was_active && self.active_count(tenant) >= quota {
            return Err(LeaseError::QuotaExceeded {
                kind: QuotaKind::TenantActiveLeases,
                limit: quota,
            });
        }
        let token = self.next_token;
        self.next_token += 1;
        self.records.insert(
            key,
            MRecord {
                holder: r.holder_id.clone(),
                token,
                expires_at: now + r.ttl_ms,
                ttl: r.ttl_ms,
                status: MStatus::Active,
                version: 1,
            },
        );
        Ok(LeaseReply::Acquired(LeaseGrant {
            lease_id: lease_id(token),
            fencing_token: token,
            log_time_ms: now,
            expires_at_ms: now + r.ttl_ms,
            ttl_ms: r.ttl_ms,
            created: true,
        }))
    }

    fn current(
        &mut self,
        key: &ResourceKey,
        id: LeaseId,
        holder: &str,
        now: u64,
    ) -> Result<&mut MRecord, LeaseError> {
        let retention = self.limits.inactive_retention_ms;
        let record = self
            .records
            .get_mut(&(key.tenant_id.clone(), key.resource_id.clone()))
            .filter(|r| now < r.expires_at + retention)
            .ok_or(LeaseError::NotFound)?;
        if !(record.status == MStatus::Active && now < record.expires_at) {
            return Err(LeaseError::LeaseExpired { lease_id: id });
        }
        if lease_id(record.token) != id || record.holder != holder {
            return Err(LeaseError::LeaseMismatch { lease_id: id });
        }
        Ok(record)
    }

    fn renew(&mut self, r: &RenewRequest, now: u64) -> Outcome {
        self.check_ttl(&r.key.tenant_id, r.ttl_ms)?;
        let record = self.current(&r.key, r.lease_id, &r.holder_id, now)?;
        record.expires_at = now + r.ttl_ms;
        record.ttl = r.ttl_ms;
        record.version += 1;
        Ok(LeaseReply::Renewed(LeaseGrant {
            lease_id: r.lease_id,
            fencing_token: record.token,
            log_time_ms: now,
            expires_at_ms: now + r.ttl_ms,
            ttl_ms: r.ttl_ms,
            created: false,
        }))
    }

    fn release(&mut self, r: &ReleaseRequest, now: u64) -> Outcome {
        let record = self.current(&r.key, r.lease_id, &r.holder_id, now)?;
        record.status = MStatus::Released;
        record.expires_at = now;
        record.version += 1;
        Ok(LeaseReply::Released(ReleaseReceipt {
            lease_id: r.lease_id,
            fencing_token: record.token,
            released_at_ms: now,
        }))
    }

    fn transfer(&mut self, r: &TransferRequest, now: u64) -> Outcome {
        self.check_ttl(&r.key.tenant_id, r.ttl_ms)?;
        let token = self.next_token;
        let record = self.current(&r.key, r.lease_id, &r.holder_id, now)?;
        let released = ReleaseReceipt {
            lease_id: r.lease_id,
            fencing_token: record.token,
            released_at_ms: now,
        };
        *record = MRecord {
            holder: r.new_holder_id.clone(),
            token,
            expires_at: now + r.ttl_ms,
            ttl: r.ttl_ms,
            status: MStatus::Active,
            version: 1,
        };
        self.next_token += 1;
        Ok(LeaseReply::Transferred(Box::new(TransferReceipt {
            released,
            grant: LeaseGrant {
                lease_id: lease_id(token),
                fencing_token: token,
                log_time_ms: now,
                expires_at_ms: now + r.ttl_ms,
                ttl_ms: r.ttl_ms,
                created: true,
            },
        })))
    }

    fn expected_status(
        &self,
        key: &ResourceKey,
        now: u64,
    ) -> Option<(LeaseStatus, String, u64, u64, u64, u64)> {
        let record = self
            .records
            .get(&(key.tenant_id.clone(), key.resource_id.clone()))?;
        if !self.visible(record, now) {
            return None;
        }
        let status = match record.status {
            MStatus::Active if now < record.expires_at => LeaseStatus::Active,
            MStatus::Active | MStatus::Expired => LeaseStatus::Expired,
            MStatus::Released => LeaseStatus::Released,
        };
        let remaining = if status == LeaseStatus::Active {
            record.expires_at - now
        } else {
            0
        };
        Some((
            status,
            record.holder.clone(),
            record.token,
            record.expires_at,
            remaining,
            record.version,
        ))
    }
}

// ---------------------------------------------------------------- independent safety checker

#[derive(Default)]
struct SafetyChecker {
    /// Per resource: (token, holder, end of the current lease in log time).
    current: HashMap<(String, String), (u64, String, u64)>,
    last_token: HashMap<(String, String), u64>,
    /// Every first outcome by (key, request id, fingerprint-relevant op), for replay checks.
    first_outcomes: HashMap<(String, String, String), Outcome>,
}

impl SafetyChecker {
    fn observe(
        &mut self,
        op: &LeaseOp,
        outcome: &LeaseOutcome,
        now: u64,
    ) -> Result<(), TestCaseError> {
        let op_key = op
            .key()
            .expect("the model generates resource operations only");
        let key = (op_key.tenant_id.clone(), op_key.resource_id.clone());
        let request = (key.0.clone(), key.1.clone(), op.request_id().to_owned());
        if outcome.replayed {
            let first = self.first_outcomes.get(&request);
            prop_assert_eq!(
                Some(&outcome.result),
                first,
                "a replay differs from the first outcome"
            );
            return Ok(());
        }
        let reuse_conflict = matches!(
            &outcome.result,
            Err(LeaseError::InvalidArgument { field, .. }) if field == "request_id"
        );
        if reuse_conflict {
            return Ok(());
        }
        self.first_outcomes.insert(request, outcome.result.clone());
        match &outcome.result {
            Ok(LeaseReply::Acquired(grant)) => {
                if let Some((token, holder, end)) = self.current.get(&key) {
                    prop_assert!(
                        *end <= now,
                        "two holders: {holder} (token {token}) holds until {end}, granted again at {now}"
                    );
                }
                if let Some(last) = self.last_token.get(&key) {
                    prop_assert!(
                        grant.fencing_token > *last,
                        "token went from {last} to {}",
                        grant.fencing_token
                    );
                }
                self.last_token.insert(key.clone(), grant.fencing_token);
                let LeaseOp::Acquire(r) = op else {
                    unreachable!()
                };
                self.current.insert(
                    key,
                    (
                        grant.fencing_token,
                        r.holder_id.clone(),
                        grant.expires_at_ms,
                    ),
                );
            }
            Ok(LeaseReply::Renewed(grant)) => {
                let current = self.current.get_mut(&key);
                prop_assert!(current.is_some(), "renewed a lease never granted");
                let current = current.unwrap();
                prop_assert_eq!(current.0, grant.fencing_token, "renew changed the token");
                prop_assert!(current.2 > now, "renewed a lease that had ended");
                current.2 = grant.expires_at_ms;
            }
            Ok(LeaseReply::Released(receipt)) => {
                let current = self.current.get_mut(&key);
                prop_assert!(current.is_some(), "released a lease never granted");
                let current = current.unwrap();
                prop_assert_eq!(current.0, receipt.fencing_token);
                current.2 = now;
            }
            Ok(
                LeaseReply::SessionKept(_)
                | LeaseReply::SessionClosed(_)
                | LeaseReply::Queued(_)
                | LeaseReply::WaitCancelled(_),
            ) => {
                prop_assert!(false, "a session or wait reply to {:?}", op);
            }
            Ok(LeaseReply::Transferred(receipt)) => {
                // The old lease ends and the new one starts at the same log time: the holder
                // changes with no gap and no overlap, and the token grows.
                let LeaseOp::Transfer(r) = op else {
                    unreachable!()
                };
                let current = self.current.get_mut(&key);
                prop_assert!(current.is_some(), "transferred a lease never granted");
                let current = current.unwrap();
                prop_assert_eq!(current.0, receipt.released.fencing_token);
                prop_assert_eq!(&current.1, &r.holder_id, "transferred by a non-holder");
                prop_assert!(current.2 > now, "transferred a lease that had ended");
                prop_assert!(
                    receipt.grant.fencing_token > current.0,
                    "transfer did not raise the token"
                );
                *current = (
                    receipt.grant.fencing_token,
                    r.new_holder_id.clone(),
                    receipt.grant.expires_at_ms,
                );
                self.last_token
                    .insert(key.clone(), receipt.grant.fencing_token);
            }
            Err(_) => {}
        }
        Ok(())
    }
}

// ---------------------------------------------------------------- the runner

/// How often each outcome occurred over the whole run: evidence the generator reaches every path.
/// Leases an Expire could have reclaimed but left for a later one (re-filing renewed entries).
static EXPIRE_SHORTFALL: std::sync::Mutex<u64> = std::sync::Mutex::new(0);

static OUTCOME_COUNTS: std::sync::Mutex<BTreeMap<&'static str, u64>> =
    std::sync::Mutex::new(BTreeMap::new());

fn normalise(result: &Outcome) -> Outcome {
    // The model does not spell out INVALID_ARGUMENT messages; compare code and field.
    match result {
        Err(LeaseError::InvalidArgument { field, .. }) => Err(LeaseError::InvalidArgument {
            field: field.clone(),
            reason: String::new(),
        }),
        other => other.clone(),
    }
}

struct Run {
    /// False for runs under limits too tight for the model to follow (the count bounds make
    /// lazy garbage collection observable); the replicas and the safety checker still judge.
    model_enabled: bool,
    model: Model,
    replica_a: LeaseStateMachine,
    replica_b: LeaseStateMachine,
    checker: SafetyChecker,
    now: u64,
    sent: Vec<LeaseOp>,
    leases: Vec<(LeaseId, String, ResourceKey)>,
}

impl Run {
    fn new(model_enabled: bool, limits: GroupLimits) -> Self {
        let mut run = Run {
            model_enabled,
            model: Model::new(),
            replica_a: LeaseStateMachine::new(
                GROUP,
                StateOptions {
                    hash_seed: 1,
                    ..StateOptions::default()
                },
            ),
            replica_b: LeaseStateMachine::new(
                GROUP,
                StateOptions {
                    hash_seed: 2,
                    ..StateOptions::default()
                },
            ),
            checker: SafetyChecker::default(),
            now: 10_000,
            sent: Vec::new(),
            leases: Vec::new(),
        };
        let out = run.apply_both(Command::SetGroupLimits(limits)).unwrap();
        assert_eq!(out.result, CommandResult::Config(Ok(())));
        run
    }

    fn apply_both(&mut self, command: Command) -> Result<ApplyOutput, TestCaseError> {
        let entry = Entry {
            log_time_ms: self.now,
            command,
        };
        let a = self.replica_a.apply(&entry);
        let b = self.replica_b.apply(&entry);
        prop_assert_eq!(&a, &b, "replicas disagree");
        self.replica_a
            .check_invariants()
            .map_err(TestCaseError::fail)?;
        prop_assert_eq!(
            self.replica_a.snapshot_to_vec(),
            self.replica_b.snapshot_to_vec(),
            "replica snapshots differ"
        );
        Ok(a)
    }

    fn resolve(&self, spec: &OpSpec) -> LeaseOp {
        let mut key = ResourceKey::new(TENANTS[spec.tenant], RESOURCES[spec.resource]);
        let request_id = format!("q{}", spec.request);
        let (lease, owner, owned_key) = if self.leases.is_empty() {
            (
                lease_id(spec.lease_pick as u64 % 50 + 1),
                HOLDERS[spec.holder].to_owned(),
                key.clone(),
            )
        } else {
            self.leases[spec.lease_pick % self.leases.len()].clone()
        };
        // Usually renew/release a real lease as its holder; sometimes anything at all.
        let holder = if spec.use_owner && spec.kind != 0 {
            key = owned_key;
            owner
        } else {
            HOLDERS[spec.holder].to_owned()
        };
        match spec.kind {
            0 => LeaseOp::Acquire(AcquireRequest {
                key,
                holder_id: holder,
                ttl_ms: TTLS[spec.ttl],
                request_id,
            }),
            1 => LeaseOp::Renew(RenewRequest {
                key,
                lease_id: lease,
                holder_id: holder,
                ttl_ms: TTLS[spec.ttl],
                request_id,
            }),
            2 => LeaseOp::Release(ReleaseRequest {
                key,
                lease_id: lease,
                holder_id: holder,
                request_id,
            }),
            _ => LeaseOp::Transfer(TransferRequest {
                key,
                lease_id: lease,
                holder_id: holder,
                new_holder_id: HOLDERS[(spec.holder + 1) % HOLDERS.len()].to_owned(),
                ttl_ms: TTLS[spec.ttl],
                request_id,
            }),
        }
    }

    fn check_outcome(
        &mut self,
        op: &LeaseOp,
        real: &LeaseOutcome,
        expected: &LeaseOutcome,
    ) -> Result<(), TestCaseError> {
        let label = match (&real.result, real.replayed) {
            (_, true) => "replayed",
            (Ok(LeaseReply::Acquired(_)), _) => "acquired",
            (Ok(LeaseReply::Renewed(_)), _) => "renewed",
            (Ok(LeaseReply::Released(_)), _) => "released",
            (Ok(LeaseReply::Transferred(_)), _) => "transferred",
            (Ok(LeaseReply::SessionKept(_) | LeaseReply::SessionClosed(_)), _) => "session",
            (Ok(LeaseReply::Queued(_) | LeaseReply::WaitCancelled(_)), _) => "wait",
            (Err(e), _) => e.code().as_str(),
        };
        if !self.model_enabled {
            return self.checker.observe(op, real, self.now);
        }
        *OUTCOME_COUNTS.lock().unwrap().entry(label).or_default() += 1;
        prop_assert_eq!(real.replayed, expected.replayed, "replay flag for {:?}", op);
        prop_assert_eq!(real.replay, expected.replay, "replay state of {:?}", op);
        prop_assert_eq!(
            normalise(&real.result),
            normalise(&expected.result),
            "outcome of {:?}",
            op
        );
        self.checker.observe(op, real, self.now)?;
        if let (Ok(LeaseReply::Acquired(grant)), LeaseOp::Acquire(r)) = (&real.result, op) {
            self.leases
                .push((grant.lease_id, r.holder_id.clone(), r.key.clone()));
        }
        if let (Ok(LeaseReply::Transferred(receipt)), LeaseOp::Transfer(r)) = (&real.result, op) {
            self.leases.push((
                receipt.grant.lease_id,
                r.new_holder_id.clone(),
                r.key.clone(),
            ));
        }
        Ok(())
    }

    fn check_reclaimed(
        &mut self,
        out: &ApplyOutput,
        expected: &[(String, String)],
    ) -> Result<(), TestCaseError> {
        if !self.model_enabled {
            return Ok(());
        }
        let mut real: Vec<_> = out
            .reclaimed
            .iter()
            .map(|r| (r.tenant_id.to_string(), r.resource_id.to_string()))
            .collect();
        real.sort();
        let mut expected = expected.to_vec();
        expected.sort();
        prop_assert_eq!(real, expected, "reclaimed leases");
        Ok(())
    }

    fn lease_ops(&mut self, ops: Vec<LeaseOp>, batch: bool) -> Result<(), TestCaseError> {
        let mut reclaimed = Vec::new();
        let expected: Vec<_> = ops
            .iter()
            .map(|op| self.model.op(op, self.now, &mut reclaimed))
            .collect();
        let out = if batch {
            self.apply_both(Command::Batch(ops.clone()))?
        } else {
            self.apply_both(Command::Lease(ops[0].clone()))?
        };
        let real = match &out.result {
            CommandResult::Lease(outcome) if !batch => vec![outcome.clone()],
            CommandResult::Batch(Ok(outcomes)) if batch => outcomes.clone(),
            CommandResult::Batch(Err(err)) if batch && !self.model_enabled => {
                prop_assert_eq!(err.code(), tenure_core::ErrorCode::InvalidArgument);
                return Ok(());
            }
            other => return Err(TestCaseError::fail(format!("unexpected result {other:?}"))),
        };
        for ((op, real), expected) in ops.iter().zip(&real).zip(&expected) {
            self.check_outcome(op, real, expected)?;
        }
        self.check_reclaimed(&out, &reclaimed)?;
        self.sent.extend(ops);
        Ok(())
    }

    fn step(&mut self, action: &Action) -> Result<(), TestCaseError> {
        match action {
            Action::Op(spec) => {
                let op = self.resolve(spec);
                self.lease_ops(vec![op], false)?;
            }
            Action::Retry(pick) => {
                if !self.sent.is_empty() {
                    let op = self.sent[pick % self.sent.len()].clone();
                    self.lease_ops(vec![op], false)?;
                }
            }
            Action::Batch(specs) => {
                let ops = specs.iter().map(|s| self.resolve(s)).collect();
                self.lease_ops(ops, true)?;
            }
            Action::Expire(leases_max) if !self.model_enabled => {
                let out = self.apply_both(Command::Expire {
                    leases_max: *leases_max,
                })?;
                let ordered = out
                    .reclaimed
                    .windows(2)
                    .all(|w| w[0].expires_at_ms <= w[1].expires_at_ms);
                prop_assert!(ordered, "reclaim out of expiry order");
                prop_assert!(
                    out.reclaimed.iter().all(|r| r.expires_at_ms <= self.now),
                    "reclaimed early"
                );
            }
            Action::Expire(leases_max) => {
                let due = self.model.due(self.now);
                let out = self.apply_both(Command::Expire {
                    leases_max: *leases_max,
                })?;
                // Which of several leases with equal expiry goes first is the state's choice;
                // check it is a prefix of the due list in expiry order, then mirror it.
                // Index entries of renewed leases are re-filed as they are met, within a bound of
                // examined entries, so an Expire may reclaim fewer than it could; it then says so.
                let take = (*leases_max as usize).min(due.len());
                prop_assert!(out.reclaimed.len() <= take);
                if out.reclaimed.len() < due.len() {
                    prop_assert_eq!(out.result.clone(), CommandResult::Expire { more_due: true });
                }
                *EXPIRE_SHORTFALL.lock().unwrap() += (take - out.reclaimed.len()) as u64;
                let mut previous = 0;
                for lease in &out.reclaimed {
                    prop_assert!(
                        lease.expires_at_ms >= previous,
                        "reclaim out of expiry order"
                    );
                    previous = lease.expires_at_ms;
                    let key = (lease.tenant_id.to_string(), lease.resource_id.to_string());
                    let listed = due.iter().find(|(k, _)| *k == key);
                    prop_assert!(listed.is_some(), "reclaimed a lease that was not due");
                    self.model.reclaim(&key);
                }
                if let Some(cut) = out.reclaimed.last() {
                    let left_earlier = self
                        .model
                        .due(self.now)
                        .iter()
                        .any(|(_, at)| *at < cut.expires_at_ms);
                    prop_assert!(!left_earlier, "skipped an older due lease");
                }
            }
            Action::Policy {
                tenant,
                active_max,
                ttl_min,
                ttl_max,
            } => {
                let policy = TenantPolicy {
                    active_leases_max: *active_max,
                    ttl_ms_min: *ttl_min,
                    ttl_ms_max: *ttl_max,
                };
                let out = self.apply_both(Command::SetTenantPolicy {
                    tenant_id: TENANTS[*tenant].to_owned(),
                    policy: policy.clone(),
                })?;
                prop_assert_eq!(out.result, CommandResult::Config(Ok(())));
                self.model
                    .policies
                    .insert(TENANTS[*tenant].to_owned(), policy);
            }
            Action::Advance(ms) => self.now += ms,
            Action::AdvanceToExpiry(exact) => {
                if let Some(at) = self.replica_a.next_expiry_ms() {
                    let target = if *exact { at } else { at.saturating_sub(1) };
                    self.now = self.now.max(target);
                }
            }
            Action::Snapshot(seed) => {
                let bytes = self.replica_a.snapshot_to_vec();
                let restored = LeaseStateMachine::read_snapshot(
                    bytes.as_slice(),
                    StateOptions {
                        hash_seed: *seed,
                        ..StateOptions::default()
                    },
                )
                .map_err(|e| TestCaseError::fail(format!("restore failed: {e}")))?;
                prop_assert_eq!(
                    restored.snapshot_to_vec(),
                    bytes,
                    "restore is not byte-identical"
                );
                self.replica_a = restored;
            }
        }
        if !self.model_enabled {
            return Ok(());
        }
        // Reads agree with the model for every resource.
        for tenant in TENANTS {
            for resource in RESOURCES {
                let key = ResourceKey::new(tenant, resource);
                let real = self.replica_a.get(&key, self.now).unwrap().map(|v| {
                    (
                        v.status,
                        v.holder_id,
                        v.fencing_token,
                        v.expires_at_ms,
                        v.remaining_ttl_ms,
                        v.version,
                    )
                });
                prop_assert_eq!(
                    real,
                    self.model.expected_status(&key, self.now),
                    "get {}",
                    key
                );
            }
        }
        Ok(())
    }
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4_000)
}

#[test]
fn random_histories_match_the_model_and_keep_every_safety_property() {
    let cases = cases();
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = prop::collection::vec(action(), 1..80);
    let steps = std::sync::atomic::AtomicU64::new(0);
    let result = runner.run(&strategy, |actions| {
        let mut run = Run::new(true, limits());
        for action in &actions {
            run.step(action)?;
        }
        steps.fetch_add(actions.len() as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    });
    eprintln!(
        "model property test: {cases} cases, {} steps; outcomes {:?}; expire shortfall {}",
        steps.load(std::sync::atomic::Ordering::Relaxed),
        OUTCOME_COUNTS.lock().unwrap(),
        EXPIRE_SHORTFALL.lock().unwrap()
    );
    if let Err(err) = result {
        panic!("{err}");
    }
    let counts = OUTCOME_COUNTS.lock().unwrap();
    for needed in [
        "acquired",
        "renewed",
        "released",
        "transferred",
        "replayed",
        "ALREADY_HELD",
        "LEASE_EXPIRED",
        "LEASE_MISMATCH",
        "NOT_FOUND",
        "QUOTA_EXCEEDED",
        "INVALID_ARGUMENT",
    ] {
        assert!(
            counts.get(needed).copied().unwrap_or(0) > 0,
            "the generator never produced {needed}"
        );
    }
}

#[test]
fn replicas_stay_byte_identical_under_tight_bounds_with_snapshots_at_random_points() {
    let tight = GroupLimits {
        ttl_ms_min: 100,
        ttl_ms_max: 10_000,
        tenants_max: 2,
        lease_records_max: 6,
        dedup_retention_ms: 4_000,
        dedup_retention_ms_min: 500,
        dedup_records_max: 6,
        inactive_retention_ms: 3_000,
        inactive_records_max: 3,
        batch_items_max: 4,
        expire_batch_max: 2,
        ..GroupLimits::default()
    };
    let cases = cases();
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&prop::collection::vec(action(), 1..120), |actions| {
        let mut run = Run::new(false, tight.clone());
        for action in &actions {
            run.step(action)?;
        }
        Ok(())
    });
    eprintln!("tight-bounds replica test: {cases} cases");
    if let Err(err) = result {
        panic!("{err}");
    }
}
