//! Shared helpers for tenure-core's integration tests: a state plus a log clock.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use tenure_core::{
    AcquireRequest, ApplyOutput, Command, CommandResult, Entry, GroupId, GroupLimits, LeaseError,
    LeaseGrant, LeaseId, LeaseOp, LeaseOutcome, LeaseReply, LeaseStateMachine, LeaseView,
    ReleaseReceipt, ReleaseRequest, RenewRequest, ResourceKey, SessionAcquireRequest, SessionGrant,
    SessionId, SessionOpenRequest, SessionReceipt, SessionRequest, StateOptions, TransferReceipt,
    TransferRequest,
};

pub const GROUP: GroupId = GroupId(7);
pub const TENANT: &str = "acme";

pub struct Harness {
    pub state: LeaseStateMachine,
    pub now_ms: u64,
    pub next_request: u64,
}

impl Harness {
    pub fn new() -> Self {
        Self::with_limits(GroupLimits {
            ttl_ms_min: 100,
            ..GroupLimits::default()
        })
    }

    pub fn with_limits(limits: GroupLimits) -> Self {
        Self::with_options(limits, StateOptions::default())
    }

    pub fn with_options(limits: GroupLimits, options: StateOptions) -> Self {
        let mut harness = Harness {
            state: LeaseStateMachine::new(GROUP, options),
            now_ms: 1_000,
            next_request: 0,
        };
        let out = harness.apply(Command::SetGroupLimits(limits));
        assert_eq!(out.result, CommandResult::Config(Ok(())));
        harness
    }

    pub fn advance(&mut self, ms: u64) {
        self.now_ms += ms;
    }

    pub fn apply(&mut self, command: Command) -> ApplyOutput {
        let out = self.state.apply(&Entry {
            log_time_ms: self.now_ms,
            command,
        });
        self.state.check_invariants().unwrap();
        out
    }

    pub fn fresh_request_id(&mut self) -> String {
        self.next_request += 1;
        format!("req-{}", self.next_request)
    }

    pub fn op(&mut self, op: LeaseOp) -> LeaseOutcome {
        match self.apply(Command::Lease(op)).result {
            CommandResult::Lease(outcome) => outcome,
            other => panic!("unexpected result {other:?}"),
        }
    }

    pub fn acquire_op(&mut self, resource: &str, holder: &str, ttl_ms: u64) -> LeaseOp {
        let request_id = self.fresh_request_id();
        acquire_op(resource, holder, ttl_ms, &request_id)
    }

    pub fn acquire(
        &mut self,
        resource: &str,
        holder: &str,
        ttl_ms: u64,
    ) -> Result<LeaseGrant, LeaseError> {
        let op = self.acquire_op(resource, holder, ttl_ms);
        self.op(op).result.map(|reply| match reply {
            LeaseReply::Acquired(grant) => grant,
            other => panic!("acquire answered {other:?}"),
        })
    }

    pub fn renew(
        &mut self,
        resource: &str,
        lease_id: LeaseId,
        holder: &str,
        ttl_ms: u64,
    ) -> Result<LeaseGrant, LeaseError> {
        let request_id = self.fresh_request_id();
        self.op(renew_op(resource, lease_id, holder, ttl_ms, &request_id))
            .result
            .map(|reply| match reply {
                LeaseReply::Renewed(grant) => grant,
                other => panic!("renew answered {other:?}"),
            })
    }

    pub fn release(
        &mut self,
        resource: &str,
        lease_id: LeaseId,
        holder: &str,
    ) -> Result<ReleaseReceipt, LeaseError> {
        let request_id = self.fresh_request_id();
        self.op(release_op(resource, lease_id, holder, &request_id))
            .result
            .map(|reply| match reply {
                LeaseReply::Released(receipt) => receipt,
                other => panic!("release answered {other:?}"),
            })
    }

    pub fn transfer(
        &mut self,
        resource: &str,
        lease_id: LeaseId,
        holder: &str,
        new_holder: &str,
        ttl_ms: u64,
    ) -> Result<TransferReceipt, LeaseError> {
        let request_id = self.fresh_request_id();
        self.op(transfer_op(
            resource,
            lease_id,
            holder,
            new_holder,
            ttl_ms,
            &request_id,
        ))
        .result
        .map(|reply| match reply {
            LeaseReply::Transferred(receipt) => *receipt,
            other => panic!("transfer answered {other:?}"),
        })
    }

    pub fn open_session(
        &mut self,
        session: u128,
        owner: &str,
        ttl_ms: u64,
    ) -> Result<SessionGrant, LeaseError> {
        self.op(session_open_op(session, owner, ttl_ms))
            .result
            .map(|reply| match reply {
                LeaseReply::SessionKept(grant) => grant,
                other => panic!("open answered {other:?}"),
            })
    }

    pub fn keep_alive(&mut self, session: u128, owner: &str) -> Result<SessionGrant, LeaseError> {
        self.op(LeaseOp::SessionKeepAlive(session_request(session, owner)))
            .result
            .map(|reply| match reply {
                LeaseReply::SessionKept(grant) => grant,
                other => panic!("keep-alive answered {other:?}"),
            })
    }

    pub fn close_session(
        &mut self,
        session: u128,
        owner: &str,
    ) -> Result<SessionReceipt, LeaseError> {
        self.op(LeaseOp::SessionClose(session_request(session, owner)))
            .result
            .map(|reply| match reply {
                LeaseReply::SessionClosed(receipt) => receipt,
                other => panic!("close answered {other:?}"),
            })
    }

    pub fn acquire_in_session(
        &mut self,
        resource: &str,
        owner: &str,
        session: u128,
    ) -> Result<LeaseGrant, LeaseError> {
        let request_id = self.fresh_request_id();
        self.op(session_acquire_op(resource, owner, session, &request_id))
            .result
            .map(|reply| match reply {
                LeaseReply::Acquired(grant) => grant,
                other => panic!("acquire in session answered {other:?}"),
            })
    }

    pub fn get(&self, resource: &str) -> Option<LeaseView> {
        self.state.get(&key(resource), self.now_ms).unwrap()
    }
}

pub fn key(resource: &str) -> ResourceKey {
    ResourceKey::new(TENANT, resource)
}

pub fn acquire_op(resource: &str, holder: &str, ttl_ms: u64, request_id: &str) -> LeaseOp {
    LeaseOp::Acquire(AcquireRequest {
        key: key(resource),
        holder_id: holder.to_owned(),
        ttl_ms,
        request_id: request_id.to_owned(),
    })
}

pub fn renew_op(
    resource: &str,
    lease_id: LeaseId,
    holder: &str,
    ttl_ms: u64,
    request_id: &str,
) -> LeaseOp {
    LeaseOp::Renew(RenewRequest {
        key: key(resource),
        lease_id,
        holder_id: holder.to_owned(),
        ttl_ms,
        request_id: request_id.to_owned(),
    })
}

pub fn release_op(resource: &str, lease_id: LeaseId, holder: &str, request_id: &str) -> LeaseOp {
    LeaseOp::Release(ReleaseRequest {
        key: key(resource),
        lease_id,
        holder_id: holder.to_owned(),
        request_id: request_id.to_owned(),
    })
}

pub fn transfer_op(
    resource: &str,
    lease_id: LeaseId,
    holder: &str,
    new_holder: &str,
    ttl_ms: u64,
    request_id: &str,
) -> LeaseOp {
    LeaseOp::Transfer(TransferRequest {
        key: key(resource),
        lease_id,
        holder_id: holder.to_owned(),
        new_holder_id: new_holder.to_owned(),
        ttl_ms,
        request_id: request_id.to_owned(),
    })
}

pub fn session_open_op(session: u128, owner: &str, ttl_ms: u64) -> LeaseOp {
    LeaseOp::SessionOpen(SessionOpenRequest {
        tenant_id: TENANT.to_owned(),
        group_id: GROUP,
        session_id: SessionId(session),
        owner_id: owner.to_owned(),
        ttl_ms,
    })
}

pub fn session_request(session: u128, owner: &str) -> SessionRequest {
    SessionRequest {
        tenant_id: TENANT.to_owned(),
        group_id: GROUP,
        session_id: SessionId(session),
        owner_id: owner.to_owned(),
    }
}

pub fn session_acquire_op(resource: &str, owner: &str, session: u128, request_id: &str) -> LeaseOp {
    LeaseOp::AcquireInSession(SessionAcquireRequest {
        key: key(resource),
        holder_id: owner.to_owned(),
        session_id: SessionId(session),
        request_id: request_id.to_owned(),
    })
}
