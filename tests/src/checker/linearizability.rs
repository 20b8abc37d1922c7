//! Linearizability of one resource's lease register: a Wing-Gong search with memoisation (the
//! algorithm of Lowe's "Testing for linearizability" and of Porcupine), over a sequential model
//! of the register in which expiry is judged conservatively from real time.
//!
//! **The model.** The register holds the resource's current lease record (holder, lease id,
//! token, version, released or not, and when and for how long it was last extended) and the
//! highest token granted so far. Expiry is decided by log time, which the checker cannot see, so
//! it is bounded by real time: between two log-time stamps, log time advances by at most
//! `(1 + max_drift)` times the real time between them (a leader's clock runs at most that fast,
//! and a failover only pauses log time). A stamp falls inside its operation's real-time window.
//! So a lease last extended by an operation invoked at `e` with ttl `d` *may* have expired at an
//! operation completing at `c` only if `(c - e) * (1 + max_drift) >= d`; before that it is surely
//! active. It may always still be active (log time may lag behind real time by any amount).
//! - Acquire granted: the record is absent, released or may have expired; the token exceeds
//!   every earlier one. Refused `ALREADY_HELD` naming holder `h`: an unreleased record of `h`.
//! - Renew granted: the record is this holder's lease, unreleased, and keeps its token.
//!   Release granted likewise; it marks the record released. Their refusals: `NOT_FOUND` (no
//!   record), `LEASE_EXPIRED` (the record is released or may have expired), `LEASE_MISMATCH`
//!   (an unreleased record of another lease or holder).
//! - Transfer granted: the record is this holder's lease, unreleased (like Renew); the record
//!   becomes the new holder's new lease, whose token exceeds every earlier one. Its refusals are
//!   Renew's.
//! - Get: ABSENT (no record), or the record itself: same lease, holder, token and version;
//!   `RELEASED` iff released; `EXPIRED` only if it may have expired.
//!
//! An operation without a definite answer may take effect anywhere after its invocation or not
//! at all: it is given an infinite completion time, and its step applies it when the model
//! allows (placing it last is the same as "never"). An Acquire that took effect unseen leaves a
//! record whose lease id is unknown until a read reveals it. Replays (the same request id sent
//! again on purpose) change nothing and are judged by the exactly-once check instead.
//!
//! Must not depend on: anything but the history's records.

use std::collections::HashSet;

use crate::history::{LeaseRef, Nanos, OpKind, OpRecord, Outcome};

use super::{CheckConfig, describe_op};

/// The search's answer for one resource.
#[derive(Debug)]
pub enum Verdict<'a> {
    /// A linearization exists.
    Linearizable,
    /// None exists; `slice` is the operations that show it.
    Violation {
        /// What could not be placed.
        message: String,
        /// The operations of the longest partial linearization's end, and the one that could not
        /// follow them.
        slice: Vec<&'a OpRecord>,
    },
    /// The search ran out of steps.
    Inconclusive {
        /// Steps spent.
        steps: u64,
    },
}

/// The register's current lease record.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Record {
    /// `None`: granted by an Acquire whose answer was lost, not seen by any read yet.
    lease: Option<LeaseRef>,
    holder: u32,
    token: Option<u64>,
    version: u64,
    released: bool,
    /// Invocation of the operation that last granted or renewed it (its stamp is no earlier).
    extended_ns: Nanos,
    ttl_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
struct State {
    record: Option<Record>,
    /// Highest token known granted for the resource.
    token_max: u64,
}

/// One operation as the model sees it.
struct ModelOp<'a> {
    op: &'a OpRecord,
    holder: u32,
    /// For a Transfer: the index of the new holder.
    new_holder: u32,
    call: Nanos,
    /// `Nanos::MAX` for operations without a definite answer.
    ret: Nanos,
}

struct Model {
    /// `1 + max_drift`, as parts per million.
    rate_ppm: u128,
    holders: Vec<String>,
}

impl Model {
    /// True when a record last extended at `extended_ns` for `ttl_ms` may have expired in log
    /// time by an operation that completes at `at_ns`.
    fn may_have_expired(&self, record: &Record, at_ns: Nanos) -> bool {
        if at_ns == Nanos::MAX {
            return true;
        }
        let real_ns = u128::from(at_ns.saturating_sub(record.extended_ns));
        real_ns * self.rate_ppm >= u128::from(record.ttl_ms) * 1_000_000 * 1_000_000
    }

    fn inactive_possible(&self, record: &Record, at_ns: Nanos) -> bool {
        record.released || self.may_have_expired(record, at_ns)
    }

    fn holder_index(&self, name: &str) -> Option<u32> {
        self.holders
            .iter()
            .position(|h| h == name)
            .and_then(|i| u32::try_from(i).ok())
    }

    /// The state after `m`, or `None` when the model forbids its answer here.
    fn step(&self, state: &State, m: &ModelOp<'_>) -> Option<State> {
        let op = m.op;
        let record = state.record.as_ref();
        match (&op.outcome, op.kind) {
            (Outcome::Unknown { .. }, kind) => Some(self.step_unknown(state, m, kind)),
            (Outcome::Granted { lease, token, .. }, OpKind::Acquire) => {
                if record.is_some_and(|r| !self.inactive_possible(r, m.ret))
                    || *token <= state.token_max
                    || record.is_some_and(|r| r.token.is_some_and(|t| *token <= t))
                {
                    return None;
                }
                Some(State {
                    record: Some(Record {
                        lease: Some(*lease),
                        holder: m.holder,
                        token: Some(*token),
                        version: 1,
                        released: false,
                        extended_ns: m.call,
                        ttl_ms: op.ttl_ms,
                    }),
                    token_max: *token,
                })
            }
            (Outcome::Refused { code, holder }, OpKind::Acquire) => match code.as_str() {
                "ALREADY_HELD" => {
                    let named = holder.as_deref().and_then(|h| self.holder_index(h));
                    let ok = record.is_some_and(|r| {
                        !r.released && holder.as_ref().is_none_or(|_| named == Some(r.holder))
                    });
                    ok.then(|| state.clone())
                }
                _ => Some(state.clone()),
            },
            (Outcome::Granted { lease, token, .. }, OpKind::Renew) => {
                if !record.is_some_and(|r| holds(r, m, *lease, *token)) {
                    return None;
                }
                let mut next = state.clone();
                if let Some(r) = next.record.as_mut() {
                    r.version += 1;
                    r.extended_ns = m.call;
                    r.ttl_ms = op.ttl_ms;
                }
                Some(next)
            }
            // A session's keep-alive extends every lease bound to it, the version unchanged.
            // (`check_resource` leaves keep-alives out of the search; kept for completeness.)
            (Outcome::Granted { lease, token, .. }, OpKind::KeepAlive) => {
                if !record.is_some_and(|r| holds(r, m, *lease, *token)) {
                    return None;
                }
                let mut next = state.clone();
                if let Some(r) = next.record.as_mut() {
                    r.extended_ns = r.extended_ns.max(m.call);
                    r.ttl_ms = op.ttl_ms;
                }
                Some(next)
            }
            // Closing the session ends the bound lease at once: expired, version unchanged.
            (Outcome::Released { lease, token, .. }, OpKind::SessionClose) => {
                if !record.is_some_and(|r| holds(r, m, *lease, *token)) {
                    return None;
                }
                let mut next = state.clone();
                if let Some(r) = next.record.as_mut() {
                    r.ttl_ms = 0;
                }
                Some(next)
            }
            (Outcome::Released { lease, token, .. }, OpKind::Release) => {
                if !record.is_some_and(|r| holds(r, m, *lease, *token)) {
                    return None;
                }
                let mut next = state.clone();
                if let Some(r) = next.record.as_mut() {
                    r.version += 1;
                    r.released = true;
                }
                Some(next)
            }
            (Outcome::Granted { lease, token, .. }, OpKind::Transfer) => {
                let named = record.is_some_and(|r| {
                    r.lease.is_some() && r.lease == op.lease && r.holder == m.holder && !r.released
                });
                if !named
                    || *token <= state.token_max
                    || record.is_some_and(|r| r.token.is_some_and(|t| *token <= t))
                {
                    return None;
                }
                Some(State {
                    record: Some(Record {
                        lease: Some(*lease),
                        holder: m.new_holder,
                        token: Some(*token),
                        version: 1,
                        released: false,
                        extended_ns: m.call,
                        ttl_ms: op.ttl_ms,
                    }),
                    token_max: *token,
                })
            }
            (
                Outcome::Refused { code, .. },
                OpKind::Renew | OpKind::Release | OpKind::Transfer | OpKind::SessionClose,
            ) => {
                let ok = match code.as_str() {
                    "NOT_FOUND" => record.is_none(),
                    "LEASE_EXPIRED" => record.is_some_and(|r| self.inactive_possible(r, m.ret)),
                    "LEASE_MISMATCH" => record.is_some_and(|r| {
                        !r.released && (r.lease != op.lease || r.holder != m.holder)
                    }),
                    _ => true,
                };
                ok.then(|| state.clone())
            }
            (Outcome::Read { view, .. }, OpKind::Get) => match (view, record) {
                (None, None) => Some(state.clone()),
                (None, Some(_)) | (Some(_), None) => None,
                (Some(v), Some(r)) => {
                    let status_ok = match v.status.as_str() {
                        "RELEASED" => r.released,
                        "ACTIVE" => !r.released,
                        "EXPIRED" => !r.released && self.may_have_expired(r, m.ret),
                        _ => false,
                    };
                    let same = self.holder_index(&v.holder) == Some(r.holder)
                        && v.version == r.version
                        && status_ok;
                    match (r.lease, r.token) {
                        (Some(lease), Some(token)) => {
                            (same && lease == v.lease && token == v.token).then(|| state.clone())
                        }
                        // The unseen grant is revealed: bind its lease id and token.
                        _ if same && v.token > state.token_max => {
                            let mut next = state.clone();
                            if let Some(r) = next.record.as_mut() {
                                r.lease = Some(v.lease);
                                r.token = Some(v.token);
                            }
                            next.token_max = v.token;
                            Some(next)
                        }
                        _ => None,
                    }
                }
            },
            // An answer of the wrong kind for the operation: never linearizable.
            _ => None,
        }
    }

    /// An operation without a definite answer, applied here when the model lets it have an
    /// effect (else it changes nothing, which is also what "never applied" means).
    fn step_unknown(&self, state: &State, m: &ModelOp<'_>, kind: OpKind) -> State {
        let op = m.op;
        let record = state.record.as_ref();
        let mut next = state.clone();
        match kind {
            OpKind::Acquire => {
                if record.is_none_or(|r| self.inactive_possible(r, m.ret)) {
                    next.record = Some(Record {
                        lease: None,
                        holder: m.holder,
                        token: None,
                        version: 1,
                        released: false,
                        extended_ns: m.call,
                        ttl_ms: op.ttl_ms,
                    });
                }
            }
            OpKind::Renew | OpKind::Release => {
                if let Some(r) = next.record.as_mut() {
                    if r.lease.is_some()
                        && r.lease == op.lease
                        && r.holder == m.holder
                        && !r.released
                    {
                        r.version += 1;
                        if kind == OpKind::Renew {
                            r.extended_ns = r.extended_ns.max(m.call);
                            r.ttl_ms = op.ttl_ms;
                        } else {
                            r.released = true;
                        }
                    }
                }
            }
            OpKind::Transfer => {
                if record.is_some_and(|r| {
                    r.lease.is_some() && r.lease == op.lease && r.holder == m.holder && !r.released
                }) {
                    // Its lease id and token stay unknown until a read reveals them.
                    next.record = Some(Record {
                        lease: None,
                        holder: m.new_holder,
                        token: None,
                        version: 1,
                        released: false,
                        extended_ns: m.call,
                        ttl_ms: op.ttl_ms,
                    });
                }
            }
            // Only confirmed keep-alives are recorded.
            OpKind::Get | OpKind::KeepAlive => {}
            OpKind::SessionClose => {
                if let Some(r) = next.record.as_mut() {
                    if r.lease.is_some() && r.lease == op.lease && r.holder == m.holder {
                        r.ttl_ms = 0;
                    }
                }
            }
        }
        next
    }
}

/// True when `record` is the unreleased lease `lease` (token `token`) of the holder of `m`, which
/// names it: what a successful Renew or Release needs.
fn holds(record: &Record, m: &ModelOp<'_>, lease: LeaseRef, token: u64) -> bool {
    record.lease == Some(lease)
        && m.op.lease == Some(lease)
        && record.holder == m.holder
        && !record.released
        && record.token == Some(token)
}

/// The linked list of call and return entries the search walks (Porcupine's representation):
/// linearizing an operation lifts its two entries out; backtracking puts them back.
struct Entries {
    /// For entry `i`: (is_call, op index).
    kind: Vec<(bool, usize)>,
    prev: Vec<usize>,
    next: Vec<usize>,
    /// For each op: its call entry and its return entry.
    entry_of: Vec<(usize, usize)>,
}

const HEAD: usize = 0;
const NONE: usize = usize::MAX;

impl Entries {
    fn new(ops: &[ModelOp<'_>]) -> Self {
        let mut events: Vec<(Nanos, u8, usize)> = Vec::with_capacity(ops.len() * 2);
        for (index, m) in ops.iter().enumerate() {
            events.push((m.call, 0, index));
            events.push((m.ret, 1, index));
        }
        // Calls before returns at equal times: such operations count as concurrent.
        events.sort_by_key(|&(time, order, index)| (time, order, index));
        let count = events.len() + 1;
        let mut kind = vec![(false, NONE); count];
        let mut entry_of = vec![(NONE, NONE); ops.len()];
        for (position, &(_, order, index)) in events.iter().enumerate() {
            let entry = position + 1;
            kind[entry] = (order == 0, index);
            if order == 0 {
                entry_of[index].0 = entry;
            } else {
                entry_of[index].1 = entry;
            }
        }
        let prev = (0..count).map(|i| i.wrapping_sub(1)).collect();
        let next = (0..count)
            .map(|i| if i + 1 < count { i + 1 } else { NONE })
            .collect();
        Entries {
            kind,
            prev,
            next,
            entry_of,
        }
    }

    fn unlink(&mut self, entry: usize) {
        let (p, n) = (self.prev[entry], self.next[entry]);
        self.next[p] = n;
        if n != NONE {
            self.prev[n] = p;
        }
    }

    fn relink(&mut self, entry: usize) {
        let (p, n) = (self.prev[entry], self.next[entry]);
        self.next[p] = entry;
        if n != NONE {
            self.prev[n] = entry;
        }
    }

    fn lift(&mut self, op: usize) {
        let (call, ret) = self.entry_of[op];
        self.unlink(call);
        self.unlink(ret);
    }

    fn unlift(&mut self, op: usize) {
        let (call, ret) = self.entry_of[op];
        self.relink(ret);
        self.relink(call);
    }
}

/// Checks one resource's operations.
pub fn check_resource<'a>(ops: &[&'a OpRecord], config: &CheckConfig) -> Verdict<'a> {
    let mut holders: Vec<String> = Vec::new();
    let mut model_ops: Vec<ModelOp<'a>> = Vec::new();
    for &op in ops {
        // Replays change nothing; unanswered reads say nothing. Keep-alives are left to the
        // other rules (windows, promised expiries): they only extend a lease, and leaving an
        // extension out only lets the model allow more (an earlier possible expiry), never
        // less, while each one would add an operation to search.
        if op.replay_of.is_some()
            || (op.kind == OpKind::Get && !op.outcome.is_definite())
            || op.kind == OpKind::KeepAlive
        {
            continue;
        }
        let mut index_of = |name: &str| match holders.iter().position(|h| h == name) {
            Some(index) => u32::try_from(index).unwrap_or(u32::MAX),
            None => {
                holders.push(name.to_owned());
                u32::try_from(holders.len() - 1).unwrap_or(u32::MAX)
            }
        };
        let holder = index_of(&op.holder);
        let new_holder = match (op.kind, op.new_holder.as_deref()) {
            (OpKind::Transfer, Some(name)) => index_of(name),
            _ => u32::MAX,
        };
        let ret = if op.outcome.is_definite() {
            op.complete_ns.unwrap_or(Nanos::MAX)
        } else {
            Nanos::MAX
        };
        model_ops.push(ModelOp {
            op,
            holder,
            new_holder,
            call: op.invoke_ns,
            ret: ret.max(op.invoke_ns),
        });
    }
    // Holders named only by ALREADY_HELD refusals or reads also get an index.
    for op in ops {
        let named = match &op.outcome {
            Outcome::Refused {
                holder: Some(h), ..
            } => Some(h),
            Outcome::Read { view: Some(v), .. } => Some(&v.holder),
            _ => None,
        };
        if let Some(name) = named {
            if !holders.contains(name) {
                holders.push(name.clone());
            }
        }
    }
    let model = Model {
        rate_ppm: 1_000_000 + u128::from(config.max_drift_ppm),
        holders,
    };
    search(&model, &model_ops, config.linearizability_steps_max)
}

fn search<'a>(model: &Model, ops: &[ModelOp<'a>], steps_max: u64) -> Verdict<'a> {
    if ops.is_empty() {
        return Verdict::Linearizable;
    }
    let words = ops.len().div_ceil(64);
    let mut entries = Entries::new(ops);
    let mut linearized = vec![0u64; words];
    let mut cache: HashSet<(Vec<u64>, State)> = HashSet::new();
    let mut stack: Vec<(usize, State)> = Vec::new();
    let mut state = State::default();
    let mut entry = entries.next[HEAD];
    let mut steps = 0u64;
    // The longest partial linearization seen, for the report.
    let mut longest: Vec<usize> = Vec::new();
    let mut stuck_at: Option<usize> = None;
    while entries.next[HEAD] != NONE {
        steps += 1;
        if steps > steps_max {
            return Verdict::Inconclusive { steps };
        }
        let (is_call, index) = entries.kind[entry];
        if is_call {
            if let Some(next_state) = model.step(&state, &ops[index]) {
                let mut bits = linearized.clone();
                bits[index / 64] |= 1 << (index % 64);
                if cache.insert((bits.clone(), next_state.clone())) {
                    stack.push((index, std::mem::replace(&mut state, next_state)));
                    linearized = bits;
                    entries.lift(index);
                    if stack.len() > longest.len() {
                        longest = stack.iter().map(|&(i, _)| i).collect();
                        stuck_at = None;
                    }
                    entry = entries.next[HEAD];
                    continue;
                }
            }
            entry = entries.next[entry];
        } else {
            // A return reached before its operation was placed: undo the last placement.
            if stack.len() == longest.len() && stuck_at.is_none() {
                stuck_at = Some(index);
            }
            let Some((placed, previous)) = stack.pop() else {
                return violation(ops, &longest, stuck_at.unwrap_or(index));
            };
            state = previous;
            linearized[placed / 64] &= !(1 << (placed % 64));
            entries.unlift(placed);
            entry = entries.next[entries.entry_of[placed].0];
        }
    }
    Verdict::Linearizable
}

/// The slice: the last operations of the longest partial linearization, then the operation that
/// could not follow them (and the ones concurrent with it that are not yet placed).
fn violation<'a>(ops: &[ModelOp<'a>], longest: &[usize], stuck: usize) -> Verdict<'a> {
    const TAIL: usize = 8;
    let mut slice: Vec<&'a OpRecord> = longest
        .iter()
        .skip(longest.len().saturating_sub(TAIL))
        .map(|&i| ops[i].op)
        .collect();
    let stuck_op = &ops[stuck];
    let placed: HashSet<usize> = longest.iter().copied().collect();
    for (index, m) in ops.iter().enumerate() {
        let concurrent = m.call <= stuck_op.ret && m.ret >= stuck_op.call;
        if index != stuck && !placed.contains(&index) && concurrent && slice.len() < TAIL * 2 {
            slice.push(m.op);
        }
    }
    slice.push(stuck_op.op);
    let origin = slice.iter().map(|op| op.invoke_ns).min().unwrap_or(0);
    Verdict::Violation {
        message: format!(
            "not linearizable: after {} operation(s) placed in order, no order admits {} (times \
             from {})",
            longest.len(),
            describe_op(stuck_op.op, origin),
            "the slice's first invocation"
        ),
        slice,
    }
}
